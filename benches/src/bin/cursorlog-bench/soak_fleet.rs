//! The MCP front-end fleet the soak plays against the server.
//!
//! Sessions are opened at a steady rate and never deleted (no `ExpireSession`: MCP clients
//! almost never send `DELETE`). Each one is a client that stays connected for
//! `client_lifetime`:
//! - it opens the session and a lease-less standalone stream (the GET stream) and holds an idle
//!   `Read(follow)` on it for its whole lifetime, which must deliver the one notification
//!   appended to it;
//! - it makes `requests` tool calls spread over its lifetime, each a request stream with a
//!   correlation id, `progress` progress events and a `Complete` with the result;
//! - `resume_pct` % of the calls are resumed after they completed, as a client that lost its
//!   connection after the first progress event would (`Read` with `resume_own_stream` of that
//!   earlier cursor), and the replay is checked: the missed events through the terminal frame,
//!   exactly once, then the end;
//! - when its lifetime is over the client goes away: its follow call is dropped and the session
//!   is left to the server's idle TTL.
//!
//! Every append's latency goes into a histogram the sampler takes every interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::task::JoinSet;

use crate::report::{histogram, record};
use crate::{pb, status_text, Client, Rng};

/// What the fleet does; fixed for a run.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Session ids are `{prefix}-{n}`.
    pub prefix: String,
    /// New sessions per second.
    pub sessions_per_sec: f64,
    /// How long each client stays connected (its follow call open).
    pub client_lifetime: Duration,
    /// Tool calls (request streams) per session.
    pub requests: usize,
    /// Progress events per tool call.
    pub progress: usize,
    /// Payload of every event.
    pub payload: Arc<Vec<u8>>,
    /// Percentage of tool calls resumed from an earlier cursor after they completed.
    pub resume_pct: u32,
}

/// Running totals since the fleet started.
#[derive(Debug, Default)]
pub struct Counters {
    /// Sessions opened.
    pub sessions_opened: AtomicU64,
    /// Tool calls completed (`Complete` acknowledged).
    pub requests_completed: AtomicU64,
    /// `Append` calls acknowledged.
    pub appends: AtomicU64,
    /// Resumes whose replay checked out.
    pub resumes: AtomicU64,
    /// Resumes answered `CURSOR_EVICTED` (retention was faster than the resume).
    pub resumes_evicted: AtomicU64,
    /// Follow calls open now (their `Resolution` received, not yet dropped or ended).
    pub followers_open: AtomicU64,
    /// Follow calls the server ended (an `end` message) while their client was connected.
    pub followers_ended_by_server: AtomicU64,
    /// Failed RPCs and failed checks.
    pub errors: AtomicU64,
}

/// The fleet's configuration, connections and what it measured.
#[derive(Debug)]
pub struct Fleet {
    cfg: FleetConfig,
    clients: Vec<Client>,
    /// Running totals.
    pub counters: Counters,
    appends: Mutex<Histogram<u64>>,
    first_errors: Mutex<Vec<String>>,
}

/// Counts one open follow call while it lives.
struct OpenFollower<'a>(&'a Counters);

impl<'a> OpenFollower<'a> {
    fn new(c: &'a Counters) -> Self {
        c.followers_open.fetch_add(1, Ordering::Relaxed);
        Self(c)
    }
}

impl Drop for OpenFollower<'_> {
    fn drop(&mut self) {
        self.0.followers_open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Fleet {
    /// A fleet that spreads its sessions over `clients` (one per gRPC connection).
    pub fn new(cfg: FleetConfig, clients: Vec<Client>) -> Self {
        Self {
            cfg,
            clients,
            counters: Counters::default(),
            appends: Mutex::new(histogram()),
            first_errors: Mutex::new(Vec::new()),
        }
    }

    /// The append latencies since the last call (and starts a new interval).
    pub fn take_appends(&self) -> Histogram<u64> {
        let mut h = self
            .appends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::replace(&mut *h, histogram())
    }

    /// The first few error messages.
    pub fn first_errors(&self) -> Vec<String> {
        self.first_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn fail(&self, what: String) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self
            .first_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if first.len() < 10 {
            first.push(what);
        }
    }

    fn record_append(&self, took: Duration) {
        self.counters.appends.fetch_add(1, Ordering::Relaxed);
        let mut h = self
            .appends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        record(&mut h, took);
    }

    /// Opens sessions at the configured rate until `stop` fires (or its sender is dropped),
    /// then drops every client still connected (their sessions are left to the server, as
    /// everywhere else).
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::oneshot::Receiver<()>) {
        let period = Duration::from_secs_f64(1.0 / self.cfg.sessions_per_sec.max(1e-3));
        let mut tick = tokio::time::interval(period);
        // Open loop: a slow server does not slow the arrival of new sessions down.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut sessions = JoinSet::new();
        let mut n = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = &mut stop => break,
            }
            let Some(client) = self.clients.get(n as usize % self.clients.len().max(1)) else {
                self.fail("no connection".into());
                break;
            };
            sessions.spawn(Arc::clone(&self).session(client.clone(), n));
            n += 1;
            while let Some(done) = sessions.try_join_next() {
                if let Err(e) = done {
                    self.fail(format!("session task failed: {e}"));
                }
            }
        }
        sessions.abort_all();
        while sessions.join_next().await.is_some() {}
    }

    /// Opens `n` sessions that stay connected for the whole run, each with a lease-less
    /// stream and an idle `Read(follow)` on it that pins the session against the idle TTL
    /// (clients that keep their standalone GET open for hours). Returns once every follow
    /// call has its `Resolution`; the calls live in the returned set until it is dropped.
    pub async fn hold_pinned(self: &Arc<Self>, n: usize) -> Result<JoinSet<()>, String> {
        const IN_FLIGHT: usize = 64;
        let before = self.counters.followers_open.load(Ordering::Relaxed);
        let mut opening = JoinSet::new();
        let mut held = JoinSet::new();
        for i in 0..n {
            let fleet = Arc::clone(self);
            let mut client = self.clients[i % self.clients.len().max(1)].clone();
            opening.spawn(async move {
                let session = format!("{}-pinned-{i}", fleet.cfg.prefix);
                let epoch = client
                    .open_session(pb::OpenSessionRequest {
                        session: session.clone(),
                        state: None,
                    })
                    .await
                    .map_err(|s| format!("OpenSession (pinned): {}", status_text(&s)))?
                    .into_inner()
                    .epoch;
                let stream = fleet
                    .open_stream(&mut client, &session, epoch, None)
                    .await
                    .ok_or("OpenStream (pinned) failed")?;
                Ok::<_, String>((fleet, client, session, epoch, stream))
            });
            while opening.len() >= IN_FLIGHT || (i + 1 == n && !opening.is_empty()) {
                let Some(done) = opening.join_next().await else {
                    break;
                };
                let (fleet, client, session, epoch, stream) =
                    done.map_err(|e| format!("pinned session task: {e}"))??;
                held.spawn(async move {
                    let seen = AtomicU64::new(0);
                    fleet.follow(client, &session, epoch, stream, &seen).await;
                });
            }
        }
        let want = before + n as u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.counters.followers_open.load(Ordering::Relaxed) < want {
            if Instant::now() > deadline || self.counters.errors.load(Ordering::Relaxed) > 0 {
                return Err(format!(
                    "only {} of {n} pinned follow calls started: {:?}",
                    self.counters.followers_open.load(Ordering::Relaxed) - before,
                    self.first_errors()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(held)
    }

    /// One client's whole life.
    async fn session(self: Arc<Self>, mut client: Client, n: u64) {
        let started = Instant::now();
        let session = format!("{}-{n}", self.cfg.prefix);
        let epoch = match client
            .open_session(pb::OpenSessionRequest {
                session: session.clone(),
                state: None,
            })
            .await
        {
            Ok(r) => r.into_inner().epoch,
            Err(s) => return self.fail(format!("OpenSession: {}", status_text(&s))),
        };
        self.counters
            .sessions_opened
            .fetch_add(1, Ordering::Relaxed);
        let standalone = match self.open_stream(&mut client, &session, epoch, None).await {
            Some(s) => s,
            None => return,
        };
        let seen = AtomicU64::new(0);
        let follower = self.follow(client.clone(), &session, epoch, standalone, &seen);
        let activity = async {
            self.append(&mut client, &session, standalone, "notification", None)
                .await;
            let gap = self.cfg.client_lifetime / (self.cfg.requests as u32 + 1);
            let mut rng = Rng::new(n + 1);
            for k in 0..self.cfg.requests {
                tokio::time::sleep_until((started + gap * (k as u32 + 1)).into()).await;
                let resume = rng.below(100) < u64::from(self.cfg.resume_pct);
                self.request(&mut client, &session, epoch, k, resume).await;
            }
            tokio::time::sleep_until((started + self.cfg.client_lifetime).into()).await;
        };
        tokio::pin!(follower);
        tokio::pin!(activity);
        let mut follower_done = false;
        loop {
            tokio::select! {
                () = &mut follower, if !follower_done => follower_done = true,
                () = &mut activity => break,
            }
        }
        // The client goes away: its follow call is dropped here (with the future), and the
        // session is never expired by the fleet.
        if seen.load(Ordering::Relaxed) == 0 {
            self.fail(format!(
                "the follower of {session}/{standalone} never delivered its notification"
            ));
        }
    }

    async fn open_stream(
        &self,
        client: &mut Client,
        session: &str,
        epoch: u64,
        correlation: Option<String>,
    ) -> Option<u64> {
        let request = pb::OpenStreamRequest {
            session: session.to_owned(),
            epoch,
            correlation,
            lease_ms: None,
        };
        match client.open_stream(request).await {
            Ok(r) => Some(r.into_inner().stream),
            Err(s) => {
                self.fail(format!("OpenStream: {}", status_text(&s)));
                None
            }
        }
    }

    /// One unary `Append` of one event, timed; returns its seq.
    async fn append(
        &self,
        client: &mut Client,
        session: &str,
        stream: u64,
        kind: &str,
        correlation: Option<&str>,
    ) -> Option<u64> {
        let request = pb::AppendRequest {
            session: session.to_owned(),
            stream,
            expected_next_seq: None,
            events: vec![pb::NewEvent {
                kind: kind.to_owned(),
                correlation: correlation.map(str::to_owned),
                payload: self.cfg.payload.to_vec(),
            }],
        };
        let t = Instant::now();
        match client.append(request).await {
            Ok(r) => {
                self.record_append(t.elapsed());
                Some(r.into_inner().first_seq)
            }
            Err(s) => {
                self.fail(format!("Append ({kind}): {}", status_text(&s)));
                None
            }
        }
    }

    /// Holds a follow call on the standalone stream until the server ends it or the future
    /// is dropped (the client went away), counting the events it delivers into `seen`.
    async fn follow(
        &self,
        mut client: Client,
        session: &str,
        epoch: u64,
        stream: u64,
        seen: &AtomicU64,
    ) {
        let request = pb::ReadRequest {
            session: session.to_owned(),
            last_event_id: format!("{epoch}-{stream}-0"),
            declared_stream: Some(stream),
            follow: true,
            batch_events_max: 0,
            resume_own_stream: false,
        };
        let mut call = match client.read(request).await {
            Ok(r) => r.into_inner(),
            Err(s) => return self.fail(format!("Read(follow): {}", status_text(&s))),
        };
        let mut open = None;
        loop {
            let item = match call.message().await {
                Ok(Some(m)) => m.item,
                Ok(None) => return self.fail("Read(follow) ended without an end message".into()),
                Err(s) => return self.fail(format!("Read(follow): {}", status_text(&s))),
            };
            match item {
                Some(pb::read_response::Item::Resolution(r)) => {
                    if r.verdict() != pb::Verdict::Resumable {
                        return self.fail(format!("Read(follow): verdict {:?}", r.verdict()));
                    }
                    open = Some(OpenFollower::new(&self.counters));
                }
                Some(pb::read_response::Item::Events(b)) => {
                    seen.fetch_add(b.events.len() as u64, Ordering::Relaxed);
                }
                Some(pb::read_response::Item::End(_)) => {
                    self.counters
                        .followers_ended_by_server
                        .fetch_add(1, Ordering::Relaxed);
                    drop(open);
                    return;
                }
                other => return self.fail(format!("Read(follow): unexpected {other:?}")),
            }
        }
    }

    /// One tool call: a request stream, its progress events, its result; maybe a resume.
    async fn request(
        &self,
        client: &mut Client,
        session: &str,
        epoch: u64,
        k: usize,
        resume: bool,
    ) {
        let correlation = format!("call-{k}");
        let Some(stream) = self
            .open_stream(client, session, epoch, Some(correlation.clone()))
            .await
        else {
            return;
        };
        for _ in 0..self.cfg.progress {
            if self
                .append(client, session, stream, "progress", Some(&correlation))
                .await
                .is_none()
            {
                return;
            }
        }
        let complete = pb::CompleteRequest {
            session: session.to_owned(),
            stream,
            expected_next_seq: None,
            terminal: Some(pb::NewEvent {
                kind: "result".to_owned(),
                correlation: Some(correlation),
                payload: self.cfg.payload.to_vec(),
            }),
        };
        let terminal_seq = match client.complete(complete).await {
            Ok(r) => r.into_inner().terminal_seq,
            Err(s) => return self.fail(format!("Complete: {}", status_text(&s))),
        };
        self.counters
            .requests_completed
            .fetch_add(1, Ordering::Relaxed);
        if resume {
            // The client saw the first progress event (or nothing) and lost its connection.
            let cursor_seq = u64::from(self.cfg.progress > 0);
            match resume_after(client, session, epoch, stream, cursor_seq, terminal_seq).await {
                Ok(Resumed::Replayed) => {
                    self.counters.resumes.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Resumed::Evicted) => {
                    self.counters
                        .resumes_evicted
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => self.fail(e),
            }
        }
    }
}

/// How a resume went.
enum Resumed {
    /// Everything after the cursor through the terminal frame, in order, then the end.
    Replayed,
    /// `CURSOR_EVICTED`: retention already released the events.
    Evicted,
}

/// `Read` with `resume_own_stream` from `{epoch}-{stream}-{cursor_seq}` of a completed stream,
/// checked: `STREAM_TERMINATED` with `missed_terminal_frame`, then exactly the seqs
/// `cursor_seq + 1 ..= terminal_seq`, then `end`.
async fn resume_after(
    client: &mut Client,
    session: &str,
    epoch: u64,
    stream: u64,
    cursor_seq: u64,
    terminal_seq: u64,
) -> Result<Resumed, String> {
    let request = pb::ReadRequest {
        session: session.to_owned(),
        last_event_id: format!("{epoch}-{stream}-{cursor_seq}"),
        declared_stream: Some(stream),
        follow: false,
        batch_events_max: 0,
        resume_own_stream: true,
    };
    let mut call = client
        .read(request)
        .await
        .map_err(|s| format!("Read(resume): {}", status_text(&s)))?
        .into_inner();
    let mut next = cursor_seq + 1;
    let mut ended = false;
    while let Some(m) = call
        .message()
        .await
        .map_err(|s| format!("Read(resume): {}", status_text(&s)))?
    {
        match m.item {
            Some(pb::read_response::Item::Resolution(r)) => match r.verdict() {
                pb::Verdict::StreamTerminated if r.missed_terminal_frame => {}
                pb::Verdict::CursorEvicted => return Ok(Resumed::Evicted),
                v => return Err(format!("Read(resume) of a completed call: verdict {v:?}")),
            },
            Some(pb::read_response::Item::Events(b)) => {
                for e in &b.events {
                    if e.seq != next {
                        return Err(format!("Read(resume): seq {} where {next} was due", e.seq));
                    }
                    next += 1;
                }
            }
            Some(pb::read_response::Item::End(_)) => ended = true,
            other => return Err(format!("Read(resume): unexpected {other:?}")),
        }
    }
    if !ended || next != terminal_seq + 1 {
        return Err(format!(
            "Read(resume) delivered seqs {}..{next} (end: {ended}), expected through {terminal_seq}",
            cursor_seq + 1
        ));
    }
    Ok(Resumed::Replayed)
}
