//! Following the leader of a replicated cursorlog (issue 19): the adapter's connection to a
//! *list* of cursorlog members.
//!
//! A member that is not the leader answers a write or a verdict-giving read with `UNAVAILABLE`,
//! the leader's address in the `cursorlog-leader` header (inside an `AppendBatch` answer, in
//! the item's message: "the leader is at HOST:PORT"), and `cursorlog-retry: safe` (nothing was
//! proposed) or `outcome-unknown` (it may have taken effect). `Conn` sends every call to the
//! member it last found leading; on such an answer it reconnects to the named leader (one
//! channel per address, cached), or, with no name (an election, a dead member), waits a
//! bounded exponential backoff and tries the next address, until `Failover::deadline`.
//!
//! What is resent (`Op`): everything answered `safe`; reads (`Resolve`, `Read`,
//! `GetOutcome`, `GetSession`) always; idempotent writes (`OpenSession`, `KeepAlive`,
//! `SetSessionState`, `ExpireSession`) always; appends and completions only with
//! `expected_next_seq`; an `OpenStream` whose outcome is unknown never (the caller reconciles
//! it by its correlation, see `store.rs`).
//!
//! The decisions are pure functions (`refusal`, `Op::may_retry`, `Attempts::next`) so
//! they are tested without a network.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::cursor_log_client::CursorLogClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Response, Status};

use crate::store::locked;
use crate::{BearerToken, RawClient, CONNECT_TIMEOUT};

/// The response header naming the leader.
pub const LEADER_HEADER: &str = "cursorlog-leader";
/// The response header saying whether a refused write may be resent as is.
pub const RETRY_HEADER: &str = "cursorlog-retry";
/// How a leader is named inside a message (`AppendBatch` item failures carry no headers).
const LEADER_IN_MESSAGE: &str = "the leader is at ";
/// How a batch item refused by a member that is not the leader starts (nothing proposed).
const NOT_LEADER_MESSAGE: &str = "this node is not the leader";

/// How the adapter rides out a leader change. [`crate::Cursorlog::connect_cluster`] uses
/// [`Failover::default`]; [`crate::Cursorlog::connect`] keeps its old behaviour (no waiting:
/// `deadline` zero), and [`crate::Cursorlog::with_failover`] sets either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failover {
    /// The first wait after an `UNAVAILABLE` that names no leader; doubled per attempt.
    pub backoff_min: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
    /// How long one call keeps trying (leader hints, backoff, other addresses) before it
    /// fails with the last error. Cover an election: about 3× cursorlog's
    /// `--election-timeout-ms`, plus a loaded machine's pauses.
    pub deadline: Duration,
    /// Leader hints followed in a row without a wait (a stale hint can point back).
    pub max_redirects: u32,
}

impl Default for Failover {
    fn default() -> Self {
        Self {
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            deadline: Duration::from_secs(10),
            max_redirects: 3,
        }
    }
}

impl Failover {
    /// A single node's behaviour before clusters: follow a hint, never wait.
    pub(crate) fn no_wait() -> Self {
        Self {
            deadline: Duration::ZERO,
            ..Self::default()
        }
    }
}

/// What a refusing member said about resending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryHint {
    /// `cursorlog-retry: safe`: nothing was proposed.
    Safe,
    /// `outcome-unknown`, or a transport failure: it may have taken effect.
    Unknown,
}

/// A call refused in a way another attempt may get past.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The leader's `HOST:PORT`, when named.
    pub(crate) leader: Option<String>,
    pub(crate) retry: RetryHint,
}

/// Whether `status` is a refusal worth another attempt (`UNAVAILABLE`, or `UNKNOWN` and
/// `CANCELLED` as a connection that broke under a call surfaces: the adapter never cancels a
/// call it still awaits), and what it says; `None` for a real answer.
pub(crate) fn refusal(status: &Status) -> Option<Refusal> {
    if !matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    ) {
        return None;
    }
    let header = |name| {
        status
            .metadata()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let retry = match header(RETRY_HEADER).as_deref() {
        Some("safe") => RetryHint::Safe,
        _ => RetryHint::Unknown,
    };
    let leader = header(LEADER_HEADER).or_else(|| leader_in(status.message()));
    Some(Refusal { leader, retry })
}

/// The refusal in a failed `AppendBatch` item (code and message only).
pub(crate) fn item_refusal(failure: &pb::Failure) -> Option<Refusal> {
    if Code::from_i32(failure.code) != Code::Unavailable {
        return None;
    }
    let retry = if failure.message.starts_with(NOT_LEADER_MESSAGE) {
        RetryHint::Safe
    } else {
        RetryHint::Unknown
    };
    Some(Refusal {
        leader: leader_in(&failure.message),
        retry,
    })
}

/// `HOST:PORT` out of "… (the leader is at HOST:PORT) …".
fn leader_in(message: &str) -> Option<String> {
    let at = message.find(LEADER_IN_MESSAGE)? + LEADER_IN_MESSAGE.len();
    let addr: String = message[at..]
        .chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, ')' | ',' | ';'))
        .collect();
    (!addr.is_empty()).then_some(addr)
}

/// What kind of call failed, for [`Op::may_retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Resolve, Read, GetOutcome, GetSession: no effect, always resent.
    Read,
    /// OpenSession, KeepAlive, SetSessionState, ExpireSession: the same effect twice.
    Idempotent,
    /// An append or completion; `true` when it carries `expected_next_seq` (a resend is
    /// answered `duplicate` if the first one took).
    Keyed(bool),
    /// OpenStream: a resend of one that took opens a second stream.
    Open,
}

impl Op {
    /// Whether a call refused with `hint` may be sent again.
    pub(crate) fn may_retry(self, hint: RetryHint) -> bool {
        match (hint, self) {
            (RetryHint::Safe, _) | (_, Self::Read | Self::Idempotent) => true,
            (RetryHint::Unknown, Self::Keyed(keyed)) => keyed,
            (RetryHint::Unknown, Self::Open) => false,
        }
    }
}

/// What to do after a refused attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send again at once, to this leader.
    Redirect(String),
    /// Wait this long, then try the next address.
    Wait(Duration),
    /// Stop: fail with the last error.
    GiveUp,
}

/// The attempts of one call so far: the redirect and backoff bookkeeping.
#[derive(Debug, Clone)]
pub(crate) struct Attempts {
    started: Instant,
    waits: u32,
    redirects: u32,
}

impl Attempts {
    pub(crate) fn new(started: Instant) -> Self {
        Self {
            started,
            waits: 0,
            redirects: 0,
        }
    }

    /// The next step after an attempt on `current` was refused naming `leader`, at `now`.
    /// `extra` allows one more wait past the deadline (the appender's fixed retry count).
    pub(crate) fn next(
        &mut self,
        policy: &Failover,
        leader: Option<&str>,
        current: &str,
        now: Instant,
        extra: bool,
    ) -> Next {
        if let Some(leader) = leader {
            if leader != current && self.redirects < policy.max_redirects {
                self.redirects += 1;
                return Next::Redirect(leader.to_owned());
            }
        }
        let wait = policy
            .backoff_min
            .saturating_mul(1 << self.waits.min(16))
            .min(policy.backoff_max);
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed + wait > policy.deadline && !extra {
            return Next::GiveUp;
        }
        self.waits += 1;
        self.redirects = 0;
        Next::Wait(wait)
    }
}

/// `HOST:PORT` of an endpoint URI (`http://HOST:PORT` or already `HOST:PORT`).
fn authority(endpoint: &str) -> String {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.trim_end_matches('/').to_owned()
}

/// The members and the channel to each; shared by every clone of a `Conn`.
#[derive(Debug)]
struct Router {
    /// Configured members, as `HOST:PORT`, in the order given.
    members: Vec<String>,
    /// `http` or `https`, for dialling a hinted leader.
    scheme: String,
    /// A channel the caller built (`from_channel`): the only one; hints are not dialled.
    fixed: Option<Channel>,
    channels: Mutex<HashMap<String, Channel>>,
    /// The member calls go to now.
    current: Mutex<String>,
    token: BearerToken,
    policy: Failover,
}

/// The adapter's connection to cursorlog: the gRPC calls it makes, each sent to the member
/// believed to lead and resent as described in the module docs. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    router: Arc<Router>,
}

macro_rules! unary {
    ($(#[$doc:meta])* $name:ident, $req:ty, $resp:ty, $op:expr) => {
        $(#[$doc])*
        pub(crate) async fn $name(&self, request: $req) -> Result<Response<$resp>, Status> {
            let op: fn(&$req) -> Op = $op;
            self.call(op(&request), |mut c| {
                let request = request.clone();
                async move { c.$name(request).await }
            })
            .await
        }
    };
}

impl Conn {
    /// A connection over one channel the caller built (TLS, custom settings).
    pub(crate) fn from_channel(channel: Channel, token: BearerToken, policy: Failover) -> Self {
        let router = Router {
            members: vec![String::new()],
            scheme: "http".into(),
            fixed: Some(channel),
            channels: Mutex::default(),
            current: Mutex::new(String::new()),
            token,
            policy,
        };
        Self {
            router: Arc::new(router),
        }
    }

    /// A connection to `endpoints` (`http://HOST:PORT`, at least one), dialled lazily; the
    /// first `connected` one, if given, is used as is.
    pub(crate) fn to_members(
        endpoints: &[String],
        connected: Option<Channel>,
        token: BearerToken,
        policy: Failover,
    ) -> Self {
        let members: Vec<String> = endpoints.iter().map(|e| authority(e)).collect();
        let scheme = endpoints
            .first()
            .and_then(|e| e.split_once("://"))
            .map_or("http", |(s, _)| s)
            .to_owned();
        let mut channels = HashMap::new();
        if let (Some(channel), Some(first)) = (connected, members.first()) {
            channels.insert(first.clone(), channel);
        }
        let router = Router {
            current: Mutex::new(members.first().cloned().unwrap_or_default()),
            members,
            scheme,
            fixed: None,
            channels: Mutex::new(channels),
            token,
            policy,
        };
        Self {
            router: Arc::new(router),
        }
    }

    /// The failover policy.
    pub(crate) fn policy(&self) -> &Failover {
        &self.router.policy
    }

    /// The member calls go to now, and a client for it.
    pub(crate) fn current(&self) -> (String, RawClient) {
        self.current_with(raw)
    }

    /// The member calls go to now, and a client of another service (`make`) on its channel.
    pub(crate) fn current_with<C>(&self, make: fn(Channel, &BearerToken) -> C) -> (String, C) {
        let r = &self.router;
        if let Some(channel) = &r.fixed {
            return (String::new(), make(channel.clone(), &r.token));
        }
        let member = locked(&r.current).clone();
        let channel = {
            let mut channels = locked(&r.channels);
            channels
                .entry(member.clone())
                .or_insert_with(|| lazy_channel(&r.scheme, &member))
                .clone()
        };
        (member, make(channel, &r.token))
    }

    /// Moves on after `next` for an attempt on `tried`: to the named leader, or (after the
    /// wait) to the member after `tried` unless another caller already moved on.
    pub(crate) async fn step(&self, tried: &str, next: &Next) {
        let r = &self.router;
        if r.fixed.is_some() {
            if let Next::Wait(d) = next {
                tokio::time::sleep(*d).await;
            }
            return;
        }
        match next {
            Next::Redirect(leader) => *locked(&r.current) = leader.clone(),
            Next::Wait(d) => {
                {
                    let mut current = locked(&r.current);
                    if *current == tried {
                        *current = following(&r.members, tried);
                    }
                }
                tokio::time::sleep(*d).await;
            }
            Next::GiveUp => {}
        }
    }

    /// Sends `f` to the leader, resending as `op` allows until the deadline.
    pub(crate) async fn call<T, F, Fut>(&self, op: Op, f: F) -> Result<T, Status>
    where
        F: FnMut(RawClient) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.call_with(op, raw, f).await
    }

    /// [`Conn::call`] for another service of the member (`make` builds its client, e.g. the
    /// `Tasks` client), with the same leader following and resending.
    pub(crate) async fn call_with<C, T, F, Fut>(
        &self,
        op: Op,
        make: fn(Channel, &BearerToken) -> C,
        mut f: F,
    ) -> Result<T, Status>
    where
        F: FnMut(C) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut attempts = Attempts::new(Instant::now());
        loop {
            let (member, client) = self.current_with(make);
            let status = match f(client).await {
                Ok(answer) => return Ok(answer),
                Err(status) => status,
            };
            let Some(refused) = refusal(&status).filter(|r| op.may_retry(r.retry)) else {
                return Err(status);
            };
            let next = attempts.next(
                self.policy(),
                refused.leader.as_deref(),
                &member,
                Instant::now(),
                false,
            );
            if next == Next::GiveUp {
                return Err(status);
            }
            tracing::debug!(member, ?next, error = %status, "cursorlog: call refused; following the leader");
            self.step(&member, &next).await;
        }
    }

    unary!(
        /// `OpenSession` (idempotent).
        open_session, pb::OpenSessionRequest, pb::OpenSessionResponse, |_| Op::Idempotent
    );
    unary!(
        /// `GetSession` (a read).
        get_session, pb::GetSessionRequest, pb::GetSessionResponse, |_| Op::Read
    );
    unary!(
        /// `SetSessionState` (the same state twice is one state).
        set_session_state, pb::SetSessionStateRequest, pb::SetSessionStateResponse, |_| Op::Idempotent
    );
    unary!(
        /// `ExpireSession` (expiring twice: the second answers "already expired").
        expire_session, pb::ExpireSessionRequest, pb::ExpireSessionResponse, |_| Op::Idempotent
    );
    unary!(
        /// `OpenStream` (resent only when nothing was proposed).
        open_stream, pb::OpenStreamRequest, pb::OpenStreamResponse, |_| Op::Open
    );
    unary!(
        /// `KeepAlive` (renewing twice is renewing).
        keep_alive, pb::KeepAliveRequest, pb::KeepAliveResponse, |_| Op::Idempotent
    );
    unary!(
        /// `Resolve` (a read).
        resolve, pb::ResolveRequest, pb::Resolution, |_| Op::Read
    );
    unary!(
        /// `GetOutcome` (a read).
        get_outcome, pb::GetOutcomeRequest, pb::GetOutcomeResponse, |_| Op::Read
    );

    /// `Read`, routed to the leader up to and including its first message (the resolution,
    /// which a member that cannot prove it leads refuses).
    pub(crate) async fn read_resolved(
        &self,
        request: pb::ReadRequest,
    ) -> Result<(tonic::Streaming<pb::ReadResponse>, Option<pb::ReadResponse>), Status> {
        self.call(Op::Read, |mut c| {
            let request = request.clone();
            async move {
                let mut reader = c.read(request).await?.into_inner();
                let first = reader.message().await?;
                Ok((reader, first))
            }
        })
        .await
    }
}

/// The member after `tried` in the configured order (the first if `tried` is not one).
fn following(members: &[String], tried: &str) -> String {
    let at = members.iter().position(|m| m == tried);
    let next = at.map_or(0, |i| (i + 1) % members.len().max(1));
    members.get(next).cloned().unwrap_or_default()
}

fn raw(channel: Channel, token: &BearerToken) -> RawClient {
    CursorLogClient::with_interceptor(channel, token.clone())
}

fn lazy_channel(scheme: &str, member: &str) -> Channel {
    match Endpoint::from_shared(format!("{scheme}://{member}")) {
        Ok(e) => e.connect_timeout(CONNECT_TIMEOUT).connect_lazy(),
        // A hint that is not an address: a channel that fails every call (as UNAVAILABLE),
        // so the caller backs off and moves to a configured member.
        Err(_) => Endpoint::from_static("http://invalid.invalid:1")
            .connect_timeout(Duration::from_millis(1))
            .connect_lazy(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn unavailable(leader: Option<&str>, retry: Option<&str>) -> Status {
        let mut s = Status::unavailable("this node is not the leader: send writes to the leader");
        if let Some(l) = leader {
            s.metadata_mut().insert(LEADER_HEADER, l.parse().unwrap());
        }
        if let Some(r) = retry {
            s.metadata_mut().insert(RETRY_HEADER, r.parse().unwrap());
        }
        s
    }

    #[test]
    fn a_refusal_names_the_leader_and_says_whether_a_resend_is_safe() {
        assert_eq!(
            refusal(&unavailable(Some("10.0.0.2:7002"), Some("safe"))),
            Some(Refusal {
                leader: Some("10.0.0.2:7002".into()),
                retry: RetryHint::Safe
            })
        );
        assert_eq!(
            refusal(&unavailable(None, Some("outcome-unknown"))),
            Some(Refusal {
                leader: None,
                retry: RetryHint::Unknown
            })
        );
        // A dead connection says nothing: the outcome is unknown.
        assert_eq!(
            refusal(&Status::unknown("connection reset")).unwrap().retry,
            RetryHint::Unknown
        );
        assert_eq!(
            refusal(&Status::cancelled(
                "operation was canceled: connection closed"
            ))
            .unwrap()
            .retry,
            RetryHint::Unknown
        );
        assert_eq!(refusal(&Status::failed_precondition("terminated")), None);
        assert_eq!(refusal(&Status::not_found("no session")), None);
    }

    #[test]
    fn a_batch_item_refusal_is_read_from_its_message() {
        let not_leader = pb::Failure {
            code: Code::Unavailable as i32,
            message: "this node is not the leader (the leader is at 127.0.0.1:7003): send writes to the leader".into(),
        };
        assert_eq!(
            item_refusal(&not_leader),
            Some(Refusal {
                leader: Some("127.0.0.1:7003".into()),
                retry: RetryHint::Safe
            })
        );
        let unconfirmed = pb::Failure {
            code: Code::Unavailable as i32,
            message: "the cluster did not confirm this write (leadership lost); retry it".into(),
        };
        assert_eq!(
            item_refusal(&unconfirmed).unwrap().retry,
            RetryHint::Unknown
        );
        assert_eq!(item_refusal(&unconfirmed).unwrap().leader, None);
        let refused = pb::Failure {
            code: Code::Aborted as i32,
            message: "seq conflict".into(),
        };
        assert_eq!(item_refusal(&refused), None);
    }

    #[test]
    fn only_idempotent_calls_are_resent_when_the_outcome_is_unknown() {
        use Op::*;
        use RetryHint::*;
        for op in [Read, Idempotent, Keyed(true), Keyed(false), Open] {
            assert!(op.may_retry(Safe), "{op:?}: nothing was proposed");
        }
        assert!(Read.may_retry(Unknown));
        assert!(Idempotent.may_retry(Unknown));
        assert!(Keyed(true).may_retry(Unknown), "expected_next_seq dedups");
        assert!(!Keyed(false).may_retry(Unknown), "could append twice");
        assert!(!Open.may_retry(Unknown), "could open a second stream");
    }

    #[test]
    fn hints_are_followed_then_backoff_doubles_to_its_cap_until_the_deadline() {
        let policy = Failover::default();
        let t0 = Instant::now();
        let mut a = Attempts::new(t0);
        // A hint is followed at once; a hint naming the member just tried is not.
        assert_eq!(
            a.next(&policy, Some("b:2"), "a:1", t0, false),
            Next::Redirect("b:2".into())
        );
        assert_eq!(
            a.next(&policy, Some("b:2"), "b:2", t0, false),
            Next::Wait(Duration::from_millis(50))
        );
        // Stale hints bouncing between members: at most max_redirects in a row.
        for _ in 0..3 {
            assert!(matches!(
                a.next(&policy, Some("c:3"), "a:1", t0, false),
                Next::Redirect(_)
            ));
        }
        assert_eq!(
            a.next(&policy, Some("c:3"), "a:1", t0, false),
            Next::Wait(Duration::from_millis(100))
        );
        let waits: Vec<_> = (0..4)
            .map(|_| a.next(&policy, None, "a:1", t0, false))
            .collect();
        let ms = |m| Next::Wait(Duration::from_millis(m));
        assert_eq!(waits, [ms(200), ms(400), ms(400), ms(400)]);
        // Past the deadline: give up, unless a fixed retry count still allows one more.
        let late = t0 + policy.deadline;
        assert_eq!(a.next(&policy, None, "a:1", late, false), Next::GiveUp);
        assert_eq!(a.next(&policy, None, "a:1", late, true), ms(400));
        // Even a hint is not followed forever: redirects reset only after a wait.
        let mut b = Attempts::new(t0);
        assert_eq!(
            b.next(&Failover::no_wait(), None, "a:1", t0, false),
            Next::GiveUp,
            "a single node (deadline zero) never waits"
        );
    }

    #[test]
    fn the_next_member_is_the_one_after_the_tried_one() {
        let members = ["a:1".to_owned(), "b:2".into(), "c:3".into()];
        assert_eq!(following(&members, "a:1"), "b:2");
        assert_eq!(following(&members, "c:3"), "a:1");
        assert_eq!(following(&members, "elsewhere:9"), "a:1");
        assert_eq!(authority("http://127.0.0.1:7001/"), "127.0.0.1:7001");
        assert_eq!(authority("127.0.0.1:7001"), "127.0.0.1:7001");
        assert_eq!(
            leader_in("x (the leader is at h:1): y"),
            Some("h:1".to_owned())
        );
    }
}
