//! The sequential model of one session, its streams and its one task: the state every
//! answer is checked against.

use super::*;

/// One stream in the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct StreamModel {
    id: u64,
    epoch: u64,
    head: u64,
    phase: Phase,
    /// Who wrote its events: `(first seq, tag)` of every call that wrote some, in seq
    /// order (an event's writer is the last entry at or below its seq).
    writes: Vec<(u64, u64)>,
}

impl StreamModel {
    /// Whether event `seq` exists and was written as event `k` of the call tagged `tag`.
    fn wrote(&self, seq: u64, tag: u64, k: u64) -> bool {
        seq >= 1
            && seq <= self.head
            && self
                .writes
                .iter()
                .rev()
                .find(|(first, _)| *first <= seq)
                .is_some_and(|(first, t)| *t == tag && seq - first == k)
    }

    /// Writes `events` events of the call tagged `tag` after the head.
    fn write(&mut self, tag: u64, events: u64) {
        self.writes.push((self.head + 1, tag));
        self.head += events;
    }
}

/// The session's task in the model (`TaskStatus` numbers: 1 working, 2 input_required,
/// 3 completed, 5 cancelled).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct TaskModel {
    version: u64,
    status: i32,
    /// The status message's number (0: none).
    message: u64,
    /// Its queue (channel 0): the messages waiting, `(qseq, tag)`, oldest first.
    queue: Vec<(u64, u64)>,
    /// The last qseq given (the next enqueue gets `tail + 1`).
    tail: u64,
}

const WORKING: i32 = 1;
const INPUT_REQUIRED: i32 = 2;
const COMPLETED: i32 = 3;
const CANCELLED: i32 = 5;

impl TaskModel {
    fn new() -> Self {
        Self {
            version: 1,
            status: WORKING,
            message: 0,
            queue: Vec::new(),
            tail: 0,
        }
    }

    fn running(&self) -> bool {
        self.status == WORKING || self.status == INPUT_REQUIRED
    }

    /// Whether an enqueue finds room (the workload's `max_len` is [`QUEUE_LEN`]).
    fn room(&self) -> bool {
        self.queue.len() < QUEUE_LEN as usize
    }

    fn enqueue(&mut self, tag: u64) -> u64 {
        self.tail += 1;
        self.queue.push((self.tail, tag));
        self.tail
    }

    /// Takes the oldest `max` messages (all of them when fewer wait).
    fn dequeue(&mut self, max: u32) -> Vec<(u64, u64)> {
        let take = self.queue.len().min(max as usize);
        self.queue.drain(..take).collect()
    }
}

/// The status an `UpdateTask` asks for.
fn update_status(input: bool) -> i32 {
    if input {
        INPUT_REQUIRED
    } else {
        WORKING
    }
}

/// The sequential model of one session, its streams and its task.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Model {
    /// The current epoch; 0 while the session does not exist.
    epoch: u64,
    /// Its streams, by id.
    streams: Vec<StreamModel>,
    /// Its task, once created.
    task: Option<TaskModel>,
}

impl Model {
    pub(super) fn stream(&self, id: u64) -> Option<&StreamModel> {
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
    pub(super) fn effect(&self, call: &Call) -> Option<Self> {
        let mut next = self.clone();
        match call {
            Call::OpenSession if self.epoch == 0 => next.epoch = 1,
            Call::AdvanceEpoch if self.epoch > 0 => next.advance(),
            Call::Append {
                stream,
                expected,
                events,
                tag,
                ..
            } => {
                let s = next.stream_mut(*stream)?;
                if s.phase != Phase::Open || s.head + 1 != *expected {
                    return None;
                }
                s.write(*tag, *events);
            }
            Call::Complete {
                stream,
                expected,
                tag,
                ..
            } => {
                let s = next.stream_mut(*stream)?;
                if s.phase != Phase::Open || s.head + 1 != *expected {
                    return None;
                }
                s.write(*tag, 1);
                s.phase = Phase::Completed;
            }
            Call::Abort { stream, tag, frame } => {
                let s = next.stream_mut(*stream)?;
                if s.phase != Phase::Open {
                    return None;
                }
                if *frame {
                    s.write(*tag, 1);
                }
                s.phase = Phase::Aborted;
            }
            Call::CreateTask if self.task.is_none() => next.task = Some(TaskModel::new()),
            Call::CancelTask => {
                let t = next.task.as_mut()?;
                if !t.running() {
                    return None;
                }
                t.version += 1;
                t.status = CANCELLED;
            }
            Call::Enqueue { tag } => {
                let t = next.task.as_mut()?;
                if !t.room() {
                    return None;
                }
                t.enqueue(*tag);
            }
            Call::Dequeue { max, .. } => {
                let t = next.task.as_mut()?;
                if t.queue.is_empty() {
                    return None;
                }
                t.dequeue(*max);
            }
            Call::UpdateTask {
                input,
                message,
                expected,
            } => {
                let t = next.task.as_mut()?;
                let status = update_status(*input);
                let restates = t.status == status && t.message == *message;
                if !t.running() || expected.is_some_and(|v| v != t.version) || restates {
                    return None;
                }
                t.version += 1;
                t.status = status;
                t.message = *message;
            }
            Call::FinishTask { expected } => {
                let t = next.task.as_mut()?;
                if !t.running() || expected.is_some_and(|v| v != t.version) {
                    return None;
                }
                t.version += 1;
                t.status = COMPLETED;
            }
            _ => return None,
        }
        Some(next)
    }

    /// The state after `call` answered `answer`; `None` when the model cannot give that
    /// answer in this state.
    pub(super) fn apply(&self, call: &Call, answer: &Answer) -> Option<Self> {
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
                    writes: Vec::new(),
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
                    tag,
                    ..
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
                    let ok = fits && s.phase == Phase::Open && s.head + 1 == *expected;
                    s.write(*tag, *events);
                    ok
                }
            }
            (
                Call::Complete {
                    stream,
                    expected,
                    tag,
                    ..
                },
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
                    s.write(*tag, 1);
                    s.phase = Phase::Completed;
                    ok && terminal_seq == expected
                }
            }
            (
                Call::Abort { stream, tag, frame },
                Answer::Completed {
                    terminal_seq,
                    duplicate,
                },
            ) => {
                // An abort names no expected seq, so it is never recognised as a retry.
                let s = next.stream_mut(*stream)?;
                let ok = s.phase == Phase::Open && !*duplicate;
                if *frame {
                    s.write(*tag, 1);
                }
                s.phase = Phase::Aborted;
                ok && *terminal_seq == s.head
            }
            (Call::Follow { stream, .. }, Answer::Followed { events, end }) => {
                self.followed(*stream, events, end)
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
            (
                Call::CreateTask,
                Answer::Task {
                    version,
                    status,
                    created,
                    ..
                },
            ) => match &self.task {
                None => {
                    next.task = Some(TaskModel::new());
                    *created == Some(true) && *version == 1 && *status == WORKING
                }
                Some(t) => *created == Some(false) && *version == t.version && *status == t.status,
            },
            (
                Call::CancelTask,
                Answer::Task {
                    version,
                    status,
                    duplicate: already_terminal,
                    ..
                },
            ) => {
                let t = next.task.as_mut()?;
                if t.running() {
                    t.version += 1;
                    t.status = CANCELLED;
                    !*already_terminal && *version == t.version && *status == CANCELLED
                } else {
                    *already_terminal && *version == t.version && *status == t.status
                }
            }
            (Call::Enqueue { tag }, Answer::Enqueued { qseq, duplicate }) => {
                let t = next.task.as_mut()?;
                let ok = t.room() && !*duplicate;
                ok && t.enqueue(*tag) == *qseq
            }
            (
                Call::Dequeue { max, .. },
                Answer::Dequeued {
                    messages,
                    duplicate,
                },
            ) => {
                let t = next.task.as_mut()?;
                !*duplicate && t.dequeue(*max) == *messages
            }
            (
                Call::UpdateTask {
                    input,
                    message,
                    expected,
                },
                Answer::Task {
                    version,
                    status,
                    duplicate,
                    ..
                },
            ) => {
                let t = next.task.as_mut()?;
                let want = update_status(*input);
                if !t.running() || expected.is_some_and(|v| v != t.version) || *status != want {
                    return None;
                }
                if t.status == want && t.message == *message {
                    *duplicate && *version == t.version
                } else {
                    t.version += 1;
                    t.status = want;
                    t.message = *message;
                    !*duplicate && *version == t.version
                }
            }
            (
                Call::FinishTask { expected },
                Answer::Task {
                    version,
                    status,
                    duplicate,
                    ..
                },
            ) => {
                let t = next.task.as_mut()?;
                if *status != COMPLETED {
                    return None;
                }
                if t.running() {
                    let ok = expected.is_none_or(|v| v == t.version) && !*duplicate;
                    t.version += 1;
                    t.status = COMPLETED;
                    ok && *version == t.version
                } else {
                    // Restating the end it already has writes nothing.
                    t.status == COMPLETED && *duplicate && *version == t.version
                }
            }
            (Call::GetTask, Answer::TaskRead { found }) => match (&self.task, found) {
                (None, None) => true,
                (Some(t), Some((version, status))) => t.version == *version && t.status == *status,
                _ => false,
            },
            (_, Answer::Refused { claim, .. }) => self.claims(call, claim),
            _ => false,
        };
        ok.then_some(next)
    }

    /// Whether a follow of the stream from its start may have delivered `events` and ended
    /// so: the events are the stream's first ones, each written by the call its payload
    /// names, and an end names the stream's terminal state and seq.
    fn followed(&self, stream: u64, events: &[Delivered], end: &FollowEnd) -> bool {
        let Some(s) = self.stream(stream) else {
            return events.is_empty() && *end == FollowEnd::Open;
        };
        let in_order = events.iter().zip(1..).all(|(e, seq)| e.seq == seq);
        in_order
            && events.iter().all(|e| s.wrote(e.seq, e.tag, e.k))
            && match end {
                FollowEnd::Open => true,
                FollowEnd::Ended {
                    phase,
                    terminal_seq,
                } => {
                    s.phase != Phase::Open
                        && phase.is_none_or(|p| p == s.phase)
                        && *terminal_seq == s.head
                        && events.last().map_or(0, |e| e.seq) == s.head
                }
                FollowEnd::Odd(_) => false,
            }
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
            // Only a call with an expected seq can conflict with the head.
            Claim::Head(h) => s.is_some_and(|s| {
                let expected = match call {
                    Call::Append { expected, .. } | Call::Complete { expected, .. } => *expected,
                    _ => return false,
                };
                s.head == *h && !(expected == h + 1 && s.phase == Phase::Open)
            }),
            Claim::Terminated { phase } => {
                s.is_some_and(|s| s.phase != Phase::Open && phase.is_none_or(|p| p == s.phase))
            }
            Claim::NoStream => self.epoch > 0 && s.is_none(),
            Claim::NoSession => self.epoch == 0,
            Claim::NoTask => self.task.is_none(),
            Claim::QueueFull => {
                matches!(call, Call::Enqueue { .. })
                    && self.task.as_ref().is_some_and(|t| !t.room())
            }
            Claim::TaskEnded { status } => self.task.as_ref().is_some_and(|t| {
                matches!(call, Call::UpdateTask { .. } | Call::FinishTask { .. })
                    && !t.running()
                    && status.is_none_or(|s| s == t.status)
                    // A restated end is a duplicate, not a refusal.
                    && !(matches!(call, Call::FinishTask { .. }) && t.status == COMPLETED)
            }),
            Claim::TaskVersion(v) => self.task.as_ref().is_some_and(|t| {
                t.running()
                    && t.version == *v
                    && matches!(call, Call::UpdateTask { expected: Some(e), .. }
                        | Call::FinishTask { expected: Some(e) } if *e != t.version)
            }),
            Claim::Other => false,
        }
    }
}
