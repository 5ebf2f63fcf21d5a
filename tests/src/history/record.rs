//! What a history is made of: calls, their answers (and the claim each answer makes about
//! the state), and the recorder the clients write them into.

use std::fmt;
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

/// How a write reached the server: its unary call, one request of an `AppendStream`, or one
/// item of an `AppendBatch`. Each path plans and answers on its own code; the model treats
/// them alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Via {
    /// The unary call (`Append`, `Complete`).
    #[default]
    Unary,
    /// One request of an `AppendStream` call.
    Stream,
    /// The one item of an `AppendBatch` call.
    Batch,
}

impl Via {
    fn suffix(self) -> &'static str {
        match self {
            Self::Unary => "",
            Self::Stream => " via AppendStream",
            Self::Batch => " via AppendBatch",
        }
    }
}

/// One event a follow delivered: its seq and, from its payload (`session/tag/k`), the call
/// that wrote it (`tag`) and its place in that call (`k`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// The event's seq.
    pub seq: u64,
    /// The tag of the call that wrote it.
    pub tag: u64,
    /// Its index in that call's events.
    pub k: u64,
}

impl Delivered {
    /// The event a follow received, `None` when its payload is not `session/tag/k`.
    pub fn parse(seq: u64, payload: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(payload).ok()?;
        let mut parts = text.rsplit('/');
        let k = parts.next()?.parse().ok()?;
        let tag = parts.next()?.parse().ok()?;
        Some(Self { seq, tag, k })
    }
}

/// How a follow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowEnd {
    /// The client stopped following (its time or event budget ran out), or the call failed
    /// with an answer that claims nothing: only the events delivered are claims.
    Open,
    /// `StreamEnd`: the stream ended in this phase at this seq.
    Ended {
        /// The terminal state.
        phase: Option<Phase>,
        /// The terminal seq.
        terminal_seq: u64,
    },
    /// Something the model never explains (a gap, events out of order, a payload this
    /// workload never wrote, a refusal of a stream the resolution found).
    Odd(String),
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
        /// The call's tag: event `k` carries the payload `session/tag/k`.
        tag: u64,
        /// How it was sent.
        via: Via,
    },
    /// `Complete` with `expected_next_seq`.
    Complete {
        /// The stream.
        stream: u64,
        /// `expected_next_seq` (the terminal frame's seq).
        expected: u64,
        /// The call's tag (the terminal frame's payload is `session/tag/0`).
        tag: u64,
        /// How it was sent (unary or as a batch item).
        via: Via,
    },
    /// `Abort` (no `expected_next_seq`: it ends the stream at whatever its head is), with
    /// a terminal (error) frame or without.
    Abort {
        /// The stream.
        stream: u64,
        /// The call's tag (the frame's payload is `session/tag/0`).
        tag: u64,
        /// Whether it carries a terminal frame (written at head + 1).
        frame: bool,
    },
    /// `Read` with `follow` from the stream's start cursor: a read of its events as they
    /// come and, when it ends, of its end. (The read's first answer, its resolution, is
    /// recorded as a `Resolve` of its own.)
    Follow {
        /// The stream.
        stream: u64,
        /// The cursor's epoch.
        epoch: u64,
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
    /// `CreateTask` of the session's one task (owner: the session; one request key).
    CreateTask,
    /// `UpdateTask` of the session's task to `input_required` or back to `working`, with
    /// status message `message`.
    UpdateTask {
        /// `input_required` (else `working`).
        input: bool,
        /// The status message's number.
        message: u64,
        /// `expected_version`, when the call is a compare-and-set.
        expected: Option<u64>,
    },
    /// `FinishTask` of the session's task as `completed`.
    FinishTask {
        /// `expected_version`, when the call is a compare-and-set.
        expected: Option<u64>,
    },
    /// `GetTask` of the session's task (a read of its version and status).
    GetTask,
    /// `CancelTask` of the session's task, mode `TERMINAL` (it ends `cancelled` now).
    CancelTask,
    /// `EnqueueTaskMessage` on the task's queue (channel 0, `max_len` [`QUEUE_LEN`]); the
    /// message is the call's tag.
    Enqueue {
        /// The call's tag, the message's bytes.
        tag: u64,
    },
    /// `DequeueTaskMessages` of at most `max` messages from the task's queue (channel 0),
    /// with a token of its own.
    Dequeue {
        /// `max_messages`.
        max: u32,
        /// The call's tag (its token is made of it).
        tag: u64,
    },
}

/// The `max_len` of every enqueue in the workload: small, so full queues are answered too.
pub const QUEUE_LEN: u32 = 3;

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
                | Self::Abort { .. }
                | Self::CreateTask
                | Self::UpdateTask { .. }
                | Self::FinishTask { .. }
                | Self::CancelTask
                | Self::Enqueue { .. }
                | Self::Dequeue { .. }
        )
    }

    /// The RPC's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::OpenSession => "OpenSession",
            Self::GetSession => "GetSession",
            Self::AdvanceEpoch => "AdvanceEpoch",
            Self::OpenStream { .. } => "OpenStream",
            Self::Append {
                via: Via::Stream, ..
            } => "AppendStream",
            Self::Append {
                via: Via::Batch, ..
            } => "AppendBatch",
            Self::Append { .. } => "Append",
            Self::Complete {
                via: Via::Batch, ..
            } => "AppendBatch",
            Self::Complete { .. } => "Complete",
            Self::Abort { .. } => "Abort",
            Self::Follow { .. } => "Read(follow)",
            Self::KeepAlive { .. } => "KeepAlive",
            Self::Resolve { .. } => "Resolve",
            Self::CreateTask => "CreateTask",
            Self::UpdateTask { .. } => "UpdateTask",
            Self::FinishTask { .. } => "FinishTask",
            Self::GetTask => "GetTask",
            Self::CancelTask => "CancelTask",
            Self::Enqueue { .. } => "EnqueueTaskMessage",
            Self::Dequeue { .. } => "DequeueTaskMessages",
        }
    }

    pub(super) fn stream(&self) -> Option<u64> {
        match self {
            Self::Append { stream, .. }
            | Self::Complete { stream, .. }
            | Self::Abort { stream, .. }
            | Self::Follow { stream, .. }
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
                tag,
                via,
            } => write!(
                f,
                "Append(stream {stream}, expected_next_seq {expected}, {events} events, tag {tag}){}",
                via.suffix()
            ),
            Self::Complete {
                stream,
                expected,
                tag,
                via,
            } => write!(
                f,
                "Complete(stream {stream}, expected_next_seq {expected}, tag {tag}){}",
                via.suffix()
            ),
            Self::Abort { stream, tag, frame } => write!(
                f,
                "Abort(stream {stream}, {}tag {tag})",
                if *frame { "with a frame, " } else { "" }
            ),
            Self::Follow { stream, epoch } => write!(f, "Read({epoch}-{stream}-0, follow)"),
            Self::KeepAlive { stream } => write!(f, "KeepAlive(stream {stream})"),
            Self::Resolve { stream, epoch } => write!(f, "Resolve({epoch}-{stream}-0)"),
            Self::CreateTask => write!(f, "CreateTask"),
            Self::UpdateTask {
                input,
                message,
                expected,
            } => write!(
                f,
                "UpdateTask({}, message {message}, expected_version {expected:?})",
                if *input { "input_required" } else { "working" }
            ),
            Self::FinishTask { expected } => {
                write!(f, "FinishTask(completed, expected_version {expected:?})")
            }
            Self::GetTask => write!(f, "GetTask"),
            Self::CancelTask => write!(f, "CancelTask(terminal)"),
            Self::Enqueue { tag } => write!(f, "EnqueueTaskMessage(message {tag})"),
            Self::Dequeue { max, tag } => write!(f, "DequeueTaskMessages(max {max}, tag {tag})"),
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
    /// "task ... not found": the task did not exist.
    NoTask,
    /// "task ... is STATUS: a task that ended never changes".
    TaskEnded {
        /// The status named (a `TaskStatus` number), when it parses.
        status: Option<i32>,
    },
    /// "task ... is at version V, not E" (ABORTED).
    TaskVersion(u64),
    /// "the queue of task ... is full: N messages (max M)" (RESOURCE_EXHAUSTED): it held M.
    QueueFull,
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
    /// `Complete` or `Abort` (a `TerminateResponse`).
    Completed {
        /// The terminal seq.
        terminal_seq: u64,
        /// A retry recognised.
        duplicate: bool,
    },
    /// `KeepAlive` OK.
    Alive,
    /// A task write's answer: the task as it is now.
    Task {
        /// Its version.
        version: u64,
        /// Its status (a `TaskStatus` number).
        status: i32,
        /// `duplicate` (nothing written), for `UpdateTask` and `FinishTask`.
        duplicate: bool,
        /// `created`, for `CreateTask`.
        created: Option<bool>,
    },
    /// `EnqueueTaskMessage`.
    Enqueued {
        /// The message's place in the queue.
        qseq: u64,
        /// A retry recognised by its dedupe key.
        duplicate: bool,
    },
    /// `DequeueTaskMessages`: the messages taken, as `(qseq, tag)`.
    Dequeued {
        /// The messages, oldest first.
        messages: Vec<(u64, u64)>,
        /// A retry recognised by its token.
        duplicate: bool,
    },
    /// `GetTask`: found with this version and status, or (`None`) unknown.
    TaskRead {
        /// `(version, status)` when found.
        found: Option<(u64, i32)>,
    },
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
    /// What a follow delivered, and how it ended.
    Followed {
        /// The events, in the order they came.
        events: Vec<Delivered>,
        /// How it ended.
        end: FollowEnd,
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
            Code::ResourceExhausted if message.starts_with("the queue of task") => {
                return Self::Refused {
                    code,
                    message,
                    claim: Claim::QueueFull,
                }
            }
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

/// A task's "it ended" refusal (the server says "task is S: task T ended and never changes
/// again"; the engine's own text is "task T is S: a task that ended never changes").
fn is_task_ended(message: &str) -> bool {
    message.starts_with("task ") && message.contains("never changes")
}

/// The `TaskStatus` number of the status a task-ended message names.
fn task_status_named(message: &str) -> Option<i32> {
    let t = message.to_ascii_lowercase();
    [("completed", 3), ("failed", 4), ("cancelled", 5)]
        .into_iter()
        .find(|(name, _)| t.contains(&format!("is {name}")))
        .map(|(_, n)| n)
}

fn parse_claim(code: Code, message: &str) -> Claim {
    match code {
        Code::FailedPrecondition if !is_task_ended(message) => {
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
        Code::FailedPrecondition if is_task_ended(message) => Claim::TaskEnded {
            status: task_status_named(message),
        },
        Code::Aborted if message.starts_with("task ") => {
            number_after(message, "is at version ").map_or(Claim::Other, Claim::TaskVersion)
        }
        Code::Aborted => number_after(message, "stream head is ").map_or(Claim::Other, Claim::Head),
        Code::NotFound if message.starts_with("session not found") => Claim::NoSession,
        Code::NotFound if message.starts_with("task ") => Claim::NoTask,
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
            Self::Followed { events, end } => {
                let seqs = match (events.first(), events.last()) {
                    (Some(a), Some(b)) => format!("seqs {}..={}", a.seq, b.seq),
                    _ => "no events".into(),
                };
                let tags: Vec<String> = events
                    .iter()
                    .map(|e| format!("{}:{}/{}", e.seq, e.tag, e.k))
                    .collect();
                write!(f, "{seqs} [{}], {end:?}", tags.join(" "))
            }
            Self::Task {
                version,
                status,
                duplicate,
                created,
            } => write!(
                f,
                "OK task version {version} status {status} duplicate {duplicate} created {created:?}"
            ),
            Self::Enqueued { qseq, duplicate } => {
                write!(f, "OK qseq {qseq} duplicate {duplicate}")
            }
            Self::Dequeued {
                messages,
                duplicate,
            } => write!(f, "OK messages {messages:?} duplicate {duplicate}"),
            Self::TaskRead { found } => match found {
                Some((version, status)) => write!(f, "OK found version {version} status {status}"),
                None => write!(f, "OK unknown"),
            },
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

    /// Records a call whose end was taken already (`op.end`, from [`Recorder::now`]).
    pub fn record_ended(&self, mut op: Op) {
        op.end = op.end.max(op.start + 1);
        self.ops.lock().expect("recorder lock").push(op);
    }

    /// Every call recorded so far.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().expect("recorder lock").clone()
    }
}
