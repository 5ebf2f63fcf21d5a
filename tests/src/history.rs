//! A history checker in the spirit of Jepsen's Knossos and Porcupine (issue 30 item 6).
//!
//! Clients record every call they make — which client, which member, the call, when it
//! started and when its answer came back, and the answer itself, successes *and* errors —
//! into a [`Recorder`]. [`check`] then splits the history by session (the key: nothing ever
//! crosses sessions, and a session's epoch supersedes its streams, so its streams share its
//! key) and searches, per session, for a total order of the calls that respects real time
//! (a call that ended before another started comes first) and in which every answer is what
//! a sequential model of the session and its streams would have answered
//! (Wing & Gong / Lowe's linearizability search, memoised on the set of calls placed and the
//! model state). No such order: a violation, printed as the shortest time-prefix of the
//! session's history that no order explains, stripped of the read-only calls it does not
//! need. The search is capped; a key it could not decide is reported as undecided.
//!
//! The model ([`Model`]): a session has an epoch (0 = absent; `OpenSession` creates it at 1,
//! `AdvanceEpoch` moves it up by one and supersedes the open streams of older epochs); a
//! stream has its epoch, its head and its phase (open, completed, aborted, superseded).
//! Every answer is a claim about that state at some instant of its call:
//! "stale epoch E: the session's current epoch is C" claims the epoch was C; "stream head
//! is H" claims the head was H; NOT_FOUND claims the stream (or the session) did not exist;
//! "terminated" claims the stream was no longer open; an OK `KeepAlive` claims it was open.
//! An answer that claims nothing (UNAVAILABLE, a deadline, a broken call, "outcome unknown")
//! leaves a write open-ended — it may take effect at any instant after it started, or never —
//! and makes a read say nothing. `UNAVAILABLE` with `cursorlog-retry: safe` claims the call
//! was never proposed: it is checked as having had no effect.

use std::collections::{BTreeMap, HashSet};
use std::fmt::{self, Write as _};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tonic::{Code, Status};

/// A stream's phase in the model (`OPEN` or one of the terminal states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Accepting events.
    Open,
    /// `Complete` wrote its terminal frame.
    Completed,
    /// `Abort` (or a lease) ended it.
    Aborted,
    /// The session's epoch moved past it.
    Superseded,
}

impl Phase {
    /// The phase of a `StreamState` number (`None` for UNSPECIFIED or unknown).
    pub fn from_proto(state: i32) -> Option<Self> {
        match state {
            1 => Some(Self::Open),
            2 => Some(Self::Completed),
            3 => Some(Self::Aborted),
            4 => Some(Self::Superseded),
            _ => None,
        }
    }

    /// The phase named in a "terminated (...)" message, as the engine prints it.
    fn from_text(text: &str) -> Option<Self> {
        let t = text.to_ascii_lowercase();
        if t.contains("complete") {
            Some(Self::Completed)
        } else if t.contains("abort") {
            Some(Self::Aborted)
        } else if t.contains("supersede") {
            Some(Self::Superseded)
        } else {
            None
        }
    }
}

/// A call a client made (the session is the key, on [`Op`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `OpenSession`.
    OpenSession,
    /// `GetSession` (a read of the epoch).
    GetSession,
    /// `AdvanceEpoch` (the fencing write).
    AdvanceEpoch,
    /// `OpenStream` at `epoch`.
    OpenStream {
        /// The epoch the client believes is current.
        epoch: u64,
    },
    /// `Append` of `events` events with `expected_next_seq`.
    Append {
        /// The stream.
        stream: u64,
        /// `expected_next_seq`.
        expected: u64,
        /// How many events.
        events: u64,
    },
    /// `Complete` with `expected_next_seq`.
    Complete {
        /// The stream.
        stream: u64,
        /// `expected_next_seq` (the terminal frame's seq).
        expected: u64,
    },
    /// `KeepAlive` of a stream (a read of its phase).
    KeepAlive {
        /// The stream.
        stream: u64,
    },
    /// `Resolve` of the stream's start cursor (a read of epoch, phase and head).
    Resolve {
        /// The stream.
        stream: u64,
        /// The cursor's epoch.
        epoch: u64,
    },
}

impl Call {
    /// True for the calls that can change the model (when they succeed).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Self::OpenSession
                | Self::AdvanceEpoch
                | Self::OpenStream { .. }
                | Self::Append { .. }
                | Self::Complete { .. }
        )
    }

    /// The RPC's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::OpenSession => "OpenSession",
            Self::GetSession => "GetSession",
            Self::AdvanceEpoch => "AdvanceEpoch",
            Self::OpenStream { .. } => "OpenStream",
            Self::Append { .. } => "Append",
            Self::Complete { .. } => "Complete",
            Self::KeepAlive { .. } => "KeepAlive",
            Self::Resolve { .. } => "Resolve",
        }
    }

    fn stream(&self) -> Option<u64> {
        match self {
            Self::Append { stream, .. }
            | Self::Complete { stream, .. }
            | Self::KeepAlive { stream }
            | Self::Resolve { stream, .. } => Some(*stream),
            _ => None,
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OpenSession => write!(f, "OpenSession"),
            Self::GetSession => write!(f, "GetSession"),
            Self::AdvanceEpoch => write!(f, "AdvanceEpoch"),
            Self::OpenStream { epoch } => write!(f, "OpenStream(epoch {epoch})"),
            Self::Append {
                stream,
                expected,
                events,
            } => write!(
                f,
                "Append(stream {stream}, expected_next_seq {expected}, {events} events)"
            ),
            Self::Complete { stream, expected } => {
                write!(f, "Complete(stream {stream}, expected_next_seq {expected})")
            }
            Self::KeepAlive { stream } => write!(f, "KeepAlive(stream {stream})"),
            Self::Resolve { stream, epoch } => write!(f, "Resolve({epoch}-{stream}-0)"),
        }
    }
}

/// What a definite refusal claims about the state at some instant of its call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// "stale epoch E: the session's current epoch is C".
    StaleEpoch {
        /// C.
        current: u64,
    },
    /// "... stream head is H ..." (ABORTED).
    Head(u64),
    /// "stream S is terminated (state) at seq T".
    Terminated {
        /// The state named, when it parses.
        phase: Option<Phase>,
    },
    /// "stream S not found": the stream did not exist.
    NoStream,
    /// "session not found": the session did not exist.
    NoSession,
    /// Any other definite refusal (the model has no state that explains it: expiry,
    /// INVALID_ARGUMENT, ...).
    Other,
}

/// The answer a call got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `OpenSession` (created set) or `GetSession` (created `None`).
    Session {
        /// The epoch answered.
        epoch: u64,
        /// `OpenSession`'s `created`.
        created: Option<bool>,
    },
    /// `AdvanceEpoch`.
    Advanced {
        /// The new epoch.
        epoch: u64,
        /// The streams it reported superseded.
        superseded: Vec<u64>,
    },
    /// `OpenStream`.
    Opened {
        /// The new stream.
        stream: u64,
        /// Its epoch.
        epoch: u64,
    },
    /// `Append`.
    Appended {
        /// First seq.
        first: u64,
        /// Last seq.
        last: u64,
        /// A retry recognised.
        duplicate: bool,
    },
    /// `Complete`.
    Completed {
        /// The terminal seq.
        terminal_seq: u64,
        /// A retry recognised.
        duplicate: bool,
    },
    /// `KeepAlive` OK.
    Alive,
    /// `Resolve`'s verdict and facts.
    Resolved {
        /// The verdict number.
        verdict: i32,
        /// `current_epoch`.
        current_epoch: Option<u64>,
        /// `stream_state`.
        phase: Option<Phase>,
        /// `head`.
        head: Option<u64>,
    },
    /// A definite refusal.
    Refused {
        /// The status code.
        code: Code,
        /// Its message.
        message: String,
        /// What it claims.
        claim: Claim,
    },
    /// No claim: the call may or may not have taken effect.
    Unknown {
        /// What happened (code and message, or the timeout).
        what: String,
    },
    /// `UNAVAILABLE` with `cursorlog-retry: safe`: the call was not proposed.
    NotDone {
        /// The message.
        what: String,
    },
}

impl Answer {
    /// The answer a failed call's status makes (see the module doc for what claims what).
    pub fn from_status(status: &Status) -> Self {
        let message = status.message().to_owned();
        let code = status.code();
        let safe = status
            .metadata()
            .get("cursorlog-retry")
            .and_then(|v| v.to_str().ok())
            == Some("safe");
        let what = format!("{code:?}: {message}");
        match code {
            Code::Unavailable if safe => return Self::NotDone { what },
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
            | Code::Internal
            | Code::ResourceExhausted => return Self::Unknown { what },
            _ => {}
        }
        if message.starts_with("h2 protocol error") || message.contains("transport error") {
            return Self::Unknown { what };
        }
        let claim = parse_claim(code, &message);
        Self::Refused {
            code,
            message,
            claim,
        }
    }

    /// The answer of a call the client gave up on after `after`.
    pub fn timed_out(after: Duration) -> Self {
        Self::Unknown {
            what: format!("no answer within {after:?}"),
        }
    }

    /// A short name of the answer's kind, for counts.
    pub fn kind(&self) -> String {
        match self {
            Self::Refused { code, claim, .. } => format!("{code:?} {claim:?}"),
            Self::Unknown { what } => {
                format!("unknown ({})", what.split(':').next().unwrap_or(what))
            }
            Self::NotDone { .. } => "not done (retry safe)".into(),
            _ => "ok".into(),
        }
    }
}

/// The number after `marker` in `text`.
fn number_after(text: &str, marker: &str) -> Option<u64> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn parse_claim(code: Code, message: &str) -> Claim {
    match code {
        Code::FailedPrecondition => {
            if let Some(current) = number_after(message, "current epoch is ") {
                Claim::StaleEpoch { current }
            } else if let Some(at) = message.find("is terminated") {
                Claim::Terminated {
                    phase: Phase::from_text(&message[at..]),
                }
            } else {
                Claim::Other
            }
        }
        Code::Aborted => number_after(message, "stream head is ").map_or(Claim::Other, Claim::Head),
        Code::NotFound if message.starts_with("session not found") => Claim::NoSession,
        Code::NotFound if message.starts_with("stream ") => Claim::NoStream,
        _ => Claim::Other,
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Session { epoch, created } => match created {
                Some(c) => write!(f, "OK epoch {epoch} created {c}"),
                None => write!(f, "OK epoch {epoch}"),
            },
            Self::Advanced { epoch, superseded } => {
                write!(f, "OK epoch {epoch} superseded {superseded:?}")
            }
            Self::Opened { stream, epoch } => write!(f, "OK stream {stream} epoch {epoch}"),
            Self::Appended {
                first,
                last,
                duplicate,
            } => write!(f, "OK seqs {first}..={last} duplicate {duplicate}"),
            Self::Completed {
                terminal_seq,
                duplicate,
            } => write!(f, "OK terminal seq {terminal_seq} duplicate {duplicate}"),
            Self::Alive => write!(f, "OK"),
            Self::Resolved {
                verdict,
                current_epoch,
                phase,
                head,
            } => write!(
                f,
                "OK verdict {verdict} current_epoch {current_epoch:?} state {phase:?} head {head:?}"
            ),
            Self::Refused { code, message, .. } => write!(f, "{code:?} \"{message}\""),
            Self::Unknown { what } => write!(f, "(no claim) {what}"),
            Self::NotDone { what } => write!(f, "(not done: retry safe) {what}"),
        }
    }
}

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Op {
    /// The client that made it.
    pub client: usize,
    /// The member it was sent to (0-based).
    pub member: usize,
    /// The session (the key).
    pub session: String,
    /// The call.
    pub call: Call,
    /// When it was sent, ns since the recorder started.
    pub start: u64,
    /// When its answer came back (or the client gave up), ns since the recorder started.
    pub end: u64,
    /// The answer.
    pub answer: Answer,
    /// What the nemesis was doing when it started (for the counts per fault kind).
    pub phase: String,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ns: u64| ns as f64 / 1e6;
        write!(
            f,
            "[{:>10.1} .. {:>10.1} ms] client {} → member {} ({}): {} → {}",
            ms(self.start),
            ms(self.end),
            self.client,
            self.member + 1,
            self.phase,
            self.call,
            self.answer
        )
    }
}

/// Records the calls of a run (shared by every client).
#[derive(Debug)]
pub struct Recorder {
    t0: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            t0: Instant::now(),
            ops: Mutex::default(),
        }
    }
}

impl Recorder {
    /// Now, in ns since the recorder started (a call's start or end).
    pub fn now(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records a call that ended now.
    pub fn record(&self, mut op: Op) {
        op.end = self.now().max(op.start + 1);
        self.ops.lock().expect("recorder lock").push(op);
    }

    /// Every call recorded so far.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().expect("recorder lock").clone()
    }
}

/// One stream in the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StreamModel {
    id: u64,
    epoch: u64,
    head: u64,
    phase: Phase,
}

/// The sequential model of one session and its streams.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Model {
    /// The current epoch; 0 while the session does not exist.
    epoch: u64,
    /// Its streams, by id.
    streams: Vec<StreamModel>,
}

impl Model {
    fn stream(&self, id: u64) -> Option<&StreamModel> {
        self.streams.iter().find(|s| s.id == id)
    }

    fn stream_mut(&mut self, id: u64) -> Option<&mut StreamModel> {
        self.streams.iter_mut().find(|s| s.id == id)
    }

    fn advance(&mut self) {
        self.epoch += 1;
        let epoch = self.epoch;
        for s in &mut self.streams {
            if s.phase == Phase::Open && s.epoch < epoch {
                s.phase = Phase::Superseded;
            }
        }
    }

    /// The state after `call` took effect as a success whose answer is unknown; `None` when
    /// it cannot succeed here or changes nothing (an unknown call that changes nothing need
    /// never be placed).
    fn effect(&self, call: &Call) -> Option<Self> {
        let mut next = self.clone();
        match call {
            Call::OpenSession if self.epoch == 0 => next.epoch = 1,
            Call::AdvanceEpoch if self.epoch > 0 => next.advance(),
            Call::Append {
                stream,
                expected,
                events,
            } => {
                let s = next.stream_mut(*stream)?;
                if s.phase != Phase::Open || s.head + 1 != *expected {
                    return None;
                }
                s.head += events;
            }
            Call::Complete { stream, expected } => {
                let s = next.stream_mut(*stream)?;
                if s.phase != Phase::Open || s.head + 1 != *expected {
                    return None;
                }
                s.head = *expected;
                s.phase = Phase::Completed;
            }
            _ => return None,
        }
        Some(next)
    }

    /// The state after `call` answered `answer`; `None` when the model cannot give that
    /// answer in this state.
    fn apply(&self, call: &Call, answer: &Answer) -> Option<Self> {
        let mut next = self.clone();
        let ok = match (call, answer) {
            (Call::OpenSession, Answer::Session { epoch, created }) => {
                if self.epoch == 0 {
                    next.epoch = 1;
                    *created == Some(true) && *epoch == 1
                } else {
                    *created != Some(true) && *epoch == self.epoch
                }
            }
            (Call::GetSession, Answer::Session { epoch, .. }) => {
                self.epoch > 0 && *epoch == self.epoch
            }
            (Call::AdvanceEpoch, Answer::Advanced { epoch, superseded }) => {
                let due: Vec<u64> = self
                    .streams
                    .iter()
                    .filter(|s| s.phase == Phase::Open)
                    .map(|s| s.id)
                    .collect();
                next.advance();
                self.epoch > 0
                    && *epoch == self.epoch + 1
                    && due.iter().all(|d| superseded.contains(d))
                    && superseded
                        .iter()
                        .all(|s| self.stream(*s).is_none() || due.contains(s))
            }
            (Call::OpenStream { epoch }, Answer::Opened { stream, epoch: e }) => {
                next.streams.push(StreamModel {
                    id: *stream,
                    epoch: *e,
                    head: 0,
                    phase: Phase::Open,
                });
                self.epoch > 0
                    && self.epoch == *epoch
                    && e == epoch
                    && self.stream(*stream).is_none()
            }
            (
                Call::Append {
                    stream,
                    expected,
                    events,
                },
                Answer::Appended {
                    first,
                    last,
                    duplicate,
                },
            ) => {
                let last_due = expected + events - 1;
                let s = next.stream_mut(*stream)?;
                let fits = first == expected && *last == last_due;
                if *duplicate {
                    fits && s.head >= last_due
                } else {
                    let was = s.head;
                    s.head = last_due;
                    fits && s.phase == Phase::Open && was + 1 == *expected
                }
            }
            (
                Call::Complete { stream, expected },
                Answer::Completed {
                    terminal_seq,
                    duplicate,
                },
            ) => {
                let s = next.stream_mut(*stream)?;
                if *duplicate {
                    s.phase == Phase::Completed && s.head == *expected && terminal_seq == expected
                } else {
                    let ok = s.phase == Phase::Open && s.head + 1 == *expected;
                    s.head = *expected;
                    s.phase = Phase::Completed;
                    ok && terminal_seq == expected
                }
            }
            (Call::KeepAlive { stream }, Answer::Alive) => {
                self.epoch > 0 && self.stream(*stream).is_some_and(|s| s.phase == Phase::Open)
            }
            (
                Call::Resolve { stream, .. },
                Answer::Resolved {
                    verdict,
                    current_epoch,
                    phase,
                    head,
                },
            ) => self.resolved(*stream, *verdict, *current_epoch, *phase, *head),
            (_, Answer::Refused { claim, .. }) => self.claims(call, claim),
            _ => false,
        };
        ok.then_some(next)
    }

    /// Whether a `Resolve` of the stream's start cursor may answer this.
    fn resolved(
        &self,
        stream: u64,
        verdict: i32,
        current_epoch: Option<u64>,
        phase: Option<Phase>,
        head: Option<u64>,
    ) -> bool {
        const UNKNOWN_SESSION: i32 = 3;
        const UNKNOWN_CURSOR: i32 = 5;
        let s = self.stream(stream);
        if verdict == UNKNOWN_SESSION {
            return self.epoch == 0;
        }
        if verdict == UNKNOWN_CURSOR {
            return s.is_none();
        }
        self.epoch > 0
            && current_epoch.is_none_or(|c| c == self.epoch)
            && phase.is_none_or(|p| s.is_some_and(|s| s.phase == p))
            && head.is_none_or(|h| s.is_some_and(|s| s.head == h))
    }

    /// Whether a refusal of `call` claiming `claim` is true in this state.
    fn claims(&self, call: &Call, claim: &Claim) -> bool {
        let s = call.stream().and_then(|id| self.stream(id));
        match claim {
            Claim::StaleEpoch { current } => {
                self.epoch > 0
                    && *current == self.epoch
                    && !matches!(call, Call::OpenStream { epoch } if epoch == current)
            }
            Claim::Head(h) => s.is_some_and(|s| {
                s.head == *h
                    && !matches!(call, Call::Append { expected, .. } | Call::Complete { expected, .. }
                        if *expected == h + 1 && s.phase == Phase::Open)
            }),
            Claim::Terminated { phase } => s.is_some_and(|s| {
                s.phase != Phase::Open && phase.is_none_or(|p| p == s.phase)
            }),
            Claim::NoStream => self.epoch > 0 && s.is_none(),
            Claim::NoSession => self.epoch == 0,
            Claim::Other => false,
        }
    }
}

/// The verdict on one key's history.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Some order of the calls that respects real time explains every answer.
    Ok,
    /// None does: the shortest time-prefix no order explains (read-only calls it does not
    /// need removed), and the calls whose answers end it.
    Violation {
        /// The sub-history, in start order.
        witness: Vec<Op>,
        /// How the longest order found ended (what could not be placed).
        stuck: String,
    },
    /// The search hit its cap.
    Undecided,
}

impl Verdict {
    /// A violation's unexplained answer: the last of its witness's answers to end (answers
    /// that claim something; an outcome-unknown call is never the culprit).
    pub fn culprit(&self) -> Option<&Op> {
        match self {
            Self::Violation { witness, .. } => witness
                .iter()
                .filter(|o| !matches!(o.answer, Answer::Unknown { .. } | Answer::NotDone { .. }))
                .max_by_key(|o| o.end),
            _ => None,
        }
    }
}

/// How an op enters the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Its answer must be explained.
    Definite,
    /// A write that may take effect at any instant after its start, or never.
    Maybe,
}

struct Search<'a> {
    ops: Vec<(&'a Op, Role)>,
    memo: HashSet<(Vec<u64>, Model)>,
    budget: usize,
    visited: usize,
    best: usize,
    best_stuck: String,
}

fn bit(set: &[u64], i: usize) -> bool {
    set[i / 64] & (1 << (i % 64)) != 0
}

impl<'a> Search<'a> {
    fn new(history: &[&'a Op], budget: usize) -> Self {
        let mut ops: Vec<(&Op, Role)> = history
            .iter()
            .filter_map(|op| {
                let role = match &op.answer {
                    Answer::NotDone { .. } => return None,
                    // An unknown OpenStream can only have made a stream nobody learned of.
                    Answer::Unknown { .. }
                        if op.call.is_write() && !matches!(op.call, Call::OpenStream { .. }) =>
                    {
                        Role::Maybe
                    }
                    Answer::Unknown { .. } => return None,
                    _ => Role::Definite,
                };
                Some((*op, role))
            })
            .collect();
        ops.sort_by_key(|(op, _)| op.start);
        Self {
            ops,
            memo: HashSet::new(),
            budget,
            visited: 0,
            best: 0,
            best_stuck: String::new(),
        }
    }

    fn end(&self, i: usize) -> u64 {
        match self.ops[i].1 {
            Role::Definite => self.ops[i].0.end,
            Role::Maybe => u64::MAX,
        }
    }

    /// `Some(true)`: an order exists; `Some(false)`: none; `None`: out of budget.
    fn run(&mut self) -> Option<bool> {
        let words = self.ops.len().div_ceil(64).max(1);
        let definite = self
            .ops
            .iter()
            .filter(|(_, r)| *r == Role::Definite)
            .count();
        let mut set = vec![0_u64; words];
        self.dfs(&mut set, Model::default(), 0, definite)
    }

    fn dfs(
        &mut self,
        set: &mut Vec<u64>,
        state: Model,
        placed: usize,
        definite: usize,
    ) -> Option<bool> {
        if placed == definite {
            return Some(true);
        }
        self.visited += 1;
        if self.visited > self.budget {
            return None;
        }
        if !self.memo.insert((set.clone(), state.clone())) {
            return Some(false);
        }
        // A call may come next unless an unplaced call ended before it started.
        let min_end = (0..self.ops.len())
            .filter(|i| !bit(set, *i))
            .map(|i| self.end(i))
            .min()
            .unwrap_or(u64::MAX);
        let mut tried_definite = Vec::new();
        for i in 0..self.ops.len() {
            let (op, role) = self.ops[i];
            if op.start > min_end {
                break;
            }
            if bit(set, i) {
                continue;
            }
            let next = match role {
                Role::Definite => state.apply(&op.call, &op.answer),
                Role::Maybe => state.effect(&op.call),
            };
            if role == Role::Definite {
                tried_definite.push(i);
            }
            let Some(next) = next else { continue };
            set[i / 64] |= 1 << (i % 64);
            let placed_now = placed + usize::from(role == Role::Definite);
            let found = self.dfs(set, next, placed_now, definite);
            set[i / 64] &= !(1 << (i % 64));
            match found {
                Some(false) => {}
                other => return other,
            }
        }
        if placed >= self.best {
            self.best = placed;
            let mut why = format!(
                "after {placed} of {definite} answers placed, the model is {state:?}; none of \
                 these answers fits it next:"
            );
            for i in tried_definite {
                let _ = write!(why, "\n      {}", self.ops[i].0);
            }
            self.best_stuck = why;
        }
        Some(false)
    }
}

/// Whether `history` (one key's calls) is linearizable: `Some(Ok(()))` yes, `Some(Err(stuck))`
/// no, `None` undecided within `budget` search steps.
fn linearizable(history: &[&Op], budget: usize) -> Option<Result<(), String>> {
    let mut search = Search::new(history, budget);
    match search.run()? {
        true => Some(Ok(())),
        false => Some(Err(search.best_stuck)),
    }
}

/// The history up to `t`: calls that ended by `t` keep their answers, writes still running
/// at `t` become unknown (but those that say they were never proposed stay without effect),
/// reads still running are dropped, later calls are dropped. When it
/// has no explanation, neither has the whole history (every later call is ordered after the
/// calls that ended by `t`).
fn prefix(history: &[&Op], t: u64) -> Vec<Op> {
    history
        .iter()
        .filter(|op| op.start <= t)
        .filter_map(|op| {
            if op.end <= t {
                Some((*op).clone())
            } else if matches!(op.answer, Answer::NotDone { .. }) {
                // It had no effect either way.
                None
            } else if op.call.is_write() {
                let mut o = (*op).clone();
                o.answer = Answer::Unknown {
                    what: format!("(cut: still running, was {})", op.answer),
                };
                Some(o)
            } else {
                None
            }
        })
        .collect()
}

/// True when removing `op` from a history keeps every other answer as it was: a call that
/// changes no state whatever order it takes.
fn read_only(op: &Op) -> bool {
    match &op.answer {
        Answer::Refused { .. } | Answer::NotDone { .. } => true,
        Answer::Unknown { .. } => !op.call.is_write(),
        Answer::Appended { duplicate, .. } | Answer::Completed { duplicate, .. } => *duplicate,
        Answer::Session { created, .. } => *created != Some(true),
        Answer::Advanced { .. } | Answer::Opened { .. } => false,
        Answer::Alive | Answer::Resolved { .. } => true,
    }
}

/// Checks one key's history.
pub fn check_key(history: &[Op], budget: usize) -> Verdict {
    let all: Vec<&Op> = history.iter().collect();
    match linearizable(&all, budget) {
        None => return Verdict::Undecided,
        Some(Ok(())) => return Verdict::Ok,
        Some(Err(_)) => {}
    }
    // The shortest time-prefix without an explanation.
    let mut ends: Vec<u64> = history.iter().map(|o| o.end).collect();
    ends.sort_unstable();
    ends.dedup();
    let fails = |t: u64| {
        let p = prefix(&all, t);
        let refs: Vec<&Op> = p.iter().collect();
        matches!(linearizable(&refs, budget), Some(Err(_)))
    };
    let (mut lo, mut hi) = (0, ends.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fails(ends[mid]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let mut witness = if fails(ends[hi]) {
        prefix(&all, ends[hi])
    } else {
        history.to_vec()
    };
    // Without the read-only calls it does not need (removing one never invents a violation).
    let mut i = 0;
    while i < witness.len() {
        if read_only(&witness[i]) {
            let mut less = witness.clone();
            less.remove(i);
            let refs: Vec<&Op> = less.iter().collect();
            if matches!(linearizable(&refs, budget), Some(Err(_))) {
                witness = less;
                continue;
            }
        }
        i += 1;
    }
    witness.sort_by_key(|o| o.start);
    let refs: Vec<&Op> = witness.iter().collect();
    let stuck = match linearizable(&refs, budget) {
        Some(Err(stuck)) => stuck,
        _ => String::from("(the witness's search ran out of budget)"),
    };
    Verdict::Violation { witness, stuck }
}

/// The verdicts of a whole history.
#[derive(Debug, Default)]
pub struct Report {
    /// Sessions whose every answer is explained.
    pub ok: usize,
    /// Sessions with at least one violation.
    pub sessions_with_violations: usize,
    /// Every violation found, with its session (several per session: see [`check`]).
    pub violations: Vec<(String, Verdict)>,
    /// Sessions the search could not decide.
    pub undecided: Vec<String>,
    /// Calls by (nemesis phase, "member N: answer kind").
    pub answers: BTreeMap<(String, String), usize>,
}

impl Report {
    /// A readable summary, with every violation's witness.
    pub fn render(&self) -> String {
        let mut out = format!(
            "history check: {} sessions ok, {} with violations ({} violations), {} undecided\n",
            self.ok,
            self.sessions_with_violations,
            self.violations.len(),
            self.undecided.len()
        );
        let mut by_phase: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
        for ((phase, kind), n) in &self.answers {
            *by_phase
                .entry(phase)
                .or_default()
                .entry(kind.as_str())
                .or_default() += n;
        }
        for (phase, kinds) in by_phase {
            let _ = writeln!(out, "  answers during {phase}: {kinds:?}");
        }
        if !self.undecided.is_empty() {
            let _ = writeln!(out, "  undecided sessions: {:?}", self.undecided);
        }
        let mut shown = std::collections::HashSet::new();
        for (key, verdict) in &self.violations {
            if !shown.insert(key) {
                // A session's later lies: the answer only (its first has the whole witness).
                if let Some(op) = verdict.culprit() {
                    let _ = writeln!(out, "VIOLATION in session {key:?} too: {op}");
                }
                continue;
            }
            if let Verdict::Violation { witness, stuck } = verdict {
                let _ = writeln!(
                    out,
                    "VIOLATION in session {key:?}: no order of these {} calls that respects \
                     real time explains every answer:",
                    witness.len()
                );
                for op in witness {
                    let _ = writeln!(out, "    {op}");
                }
                let _ = writeln!(out, "  {stuck}");
            }
        }
        out
    }
}

/// Checks every session of `ops` (each with at most `budget` search steps).
pub fn check(ops: &[Op], budget: usize) -> Report {
    let mut by_key: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
    let mut report = Report::default();
    for op in ops {
        by_key.entry(&op.session).or_default().push(op.clone());
        *report
            .answers
            .entry((
                op.phase.clone(),
                format!("member {}: {}", op.member + 1, op.answer.kind()),
            ))
            .or_default() += 1;
    }
    for (key, mut history) in by_key {
        // After a violation, the answer that proved it is set aside and the rest checked
        // again, so a session reports each lie (up to `VIOLATIONS_PER_SESSION`), not only
        // its first.
        let mut found = 0;
        loop {
            match check_key(&history, budget) {
                Verdict::Ok => {
                    if found == 0 {
                        report.ok += 1;
                    }
                    break;
                }
                Verdict::Undecided => {
                    report.undecided.push(key.to_owned());
                    break;
                }
                v @ Verdict::Violation { .. } => {
                    // Only an answer that changes nothing is set aside: without a write
                    // whose acknowledgement has no explanation, what follows would be
                    // judged against a state the cluster never had.
                    let next = v
                        .culprit()
                        .filter(|o| read_only(o))
                        .map(|o| (o.client, o.start));
                    report.violations.push((key.to_owned(), v));
                    report.sessions_with_violations += usize::from(found == 0);
                    found += 1;
                    let Some((client, start)) = next else {
                        break;
                    };
                    let before = history.len();
                    history.retain(|o| (o.client, o.start) != (client, start));
                    if found >= VIOLATIONS_PER_SESSION || history.len() == before {
                        break;
                    }
                }
            }
        }
    }
    report
}

/// The most violations reported per session.
pub const VIOLATIONS_PER_SESSION: usize = 10;

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
