//! The task half of the model test (`model.rs`): durable MCP task operations run against
//! the engine and against a small model of docs/TASKS-DESIGN.md (§1.3 the state machine and
//! its compare-and-set, §1.4 inputs, §1.6 queues, §1.7 deletion). After every step each
//! task's view (status, version, message, cancel request, end cause, outcome, input slots,
//! queue lengths) and every owner's listing must equal the model's; a crash or a reopen
//! keeps all of it (everything acknowledged survives), and no version goes backwards.

use std::collections::{BTreeMap, VecDeque};

use cursorlog_engine::{
    CancelMode, EndCause, Engine, Error, NewTask, OutcomeKind, SlotState, TaskCancel, TaskChange,
    TaskDequeue, TaskEnqueue, TaskFinish, TaskInputAnswer, TaskInputRequest, TaskOutcome, TaskRef,
    TaskStatus, TaskVerdict,
};
use proptest::prelude::*;

/// Owners collide on purpose: the empty owner is a shared namespace.
const OWNERS: [&str; 3] = ["o0", "o1", ""];
/// A queue holds at most this many messages (the enqueuer's `max_len`).
const QUEUE_LEN: u32 = 3;

/// One task operation; indexes pick owners, task ids, request keys and input keys from small
/// pools so that operations collide.
#[derive(Debug, Clone)]
pub enum TaskOp {
    Create {
        owner: u8,
        task: u8,
        key: u8,
    },
    Change {
        owner: u8,
        task: u8,
        input_required: bool,
        expected: Option<i8>,
        message: Option<u8>,
    },
    RequestInput {
        owner: u8,
        task: u8,
        keys: Vec<u8>,
    },
    Answer {
        owner: u8,
        task: u8,
        keys: Vec<u8>,
    },
    Cancel {
        owner: u8,
        task: u8,
        terminal: bool,
    },
    Finish {
        owner: u8,
        task: u8,
        status: u8,
        expected: Option<i8>,
        outcome: u8,
    },
    Delete {
        owner: u8,
        task: u8,
    },
    Enqueue {
        owner: u8,
        task: u8,
        inbound: bool,
        dedupe: Option<u8>,
        len: u8,
    },
    Dequeue {
        owner: u8,
        task: u8,
        inbound: bool,
        max: u8,
        token: u8,
    },
}

/// Task operations, weighted so tasks get created early and then mostly change.
pub fn task_op() -> impl Strategy<Value = TaskOp> {
    let ot = || (0u8..3, 0u8..5);
    let keys = || prop::collection::vec(0u8..5, 1..3);
    prop_oneof![
        3 => (ot(), 0u8..6).prop_map(|((owner, task), key)| TaskOp::Create { owner, task, key }),
        3 => (ot(), any::<bool>(), prop::option::weighted(0.3, -1i8..2), prop::option::of(0u8..3))
            .prop_map(|((owner, task), input_required, expected, message)| TaskOp::Change { owner, task, input_required, expected, message }),
        2 => (ot(), keys()).prop_map(|((owner, task), keys)| TaskOp::RequestInput { owner, task, keys }),
        2 => (ot(), keys()).prop_map(|((owner, task), keys)| TaskOp::Answer { owner, task, keys }),
        1 => (ot(), any::<bool>()).prop_map(|((owner, task), terminal)| TaskOp::Cancel { owner, task, terminal }),
        2 => (ot(), 0u8..3, prop::option::weighted(0.3, -1i8..2), 0u8..4)
            .prop_map(|((owner, task), status, expected, outcome)| TaskOp::Finish { owner, task, status, expected, outcome }),
        1 => ot().prop_map(|(owner, task)| TaskOp::Delete { owner, task }),
        3 => (ot(), any::<bool>(), prop::option::weighted(0.4, 0u8..3), 0u8..20)
            .prop_map(|((owner, task), inbound, dedupe, len)| TaskOp::Enqueue { owner, task, inbound, dedupe, len }),
        2 => (ot(), any::<bool>(), 0u8..3, 0u8..3)
            .prop_map(|((owner, task), inbound, max, token)| TaskOp::Dequeue { owner, task, inbound, max, token }),
    ]
}

/// One queue of a model task.
#[derive(Debug, Default, Clone)]
struct MQueue {
    tail: u64,
    /// Queued: (qseq, dedupe key, message).
    queued: VecDeque<(u64, Option<String>, Vec<u8>)>,
    last_token: Option<String>,
    /// The last dequeue's messages, for a retry with its token: (qseq, message).
    last_batch: Vec<(u64, Vec<u8>)>,
}

/// A task as the model remembers it.
#[derive(Debug, Clone)]
struct MTask {
    id: u64,
    request_key: String,
    status: TaskStatus,
    version: u64,
    message: Option<String>,
    cancel_requested: bool,
    end_cause: Option<EndCause>,
    outcome: TaskOutcome,
    deleted: bool,
    /// key → (state, response).
    slots: BTreeMap<String, (SlotState, Option<Vec<u8>>)>,
    queues: [MQueue; 2],
}

impl MTask {
    fn end(&mut self, status: TaskStatus, message: Option<String>, outcome: TaskOutcome) {
        self.status = status;
        self.end_cause = Some(EndCause::Client);
        if message.is_some() {
            self.message = message;
        }
        self.outcome = outcome;
        self.drop_outstanding();
        self.version += 1;
    }

    fn drop_outstanding(&mut self) {
        for (state, _) in self.slots.values_mut() {
            if *state == SlotState::Outstanding {
                *state = SlotState::Dropped;
            }
        }
    }
}

/// Errors reduced to what the model predicts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TErr {
    Unknown,
    Exists,
    Terminated(TaskStatus),
    Conflict { expected: u64, version: u64 },
    QueueFull,
    Invalid(&'static str),
    Other(String),
}

fn terr(e: Error) -> TErr {
    match e {
        Error::UnknownTask { .. } => TErr::Unknown,
        Error::TaskExists { .. } => TErr::Exists,
        Error::TaskTerminated { status, .. } => TErr::Terminated(status),
        Error::TaskConflict {
            expected_version,
            version,
            ..
        } => TErr::Conflict {
            expected: expected_version,
            version,
        },
        Error::TaskQueueFull { .. } => TErr::QueueFull,
        Error::InvalidArgument { field, .. } => TErr::Invalid(field),
        other => TErr::Other(format!("{other:?}")),
    }
}

/// The model of every owner's tasks.
#[derive(Debug, Default)]
pub struct TaskModel {
    /// (owner, task id) → task, tombstones included.
    tasks: BTreeMap<(String, String), MTask>,
    /// (owner, request key) → task id, while the task is not deleted.
    keys: BTreeMap<(String, String), String>,
    /// The highest engine id given so far: ids only grow.
    last_id: u64,
    /// (owner, task id) → the highest version seen, to catch one going backwards.
    seen: BTreeMap<(String, String), u64>,
}

fn names(owner: u8, task: u8) -> (String, String) {
    (
        OWNERS[usize::from(owner) % OWNERS.len()].to_owned(),
        format!("t{task}"),
    )
}

fn input_key(k: u8) -> String {
    format!("in{k}")
}

impl TaskModel {
    /// The owner's task, not deleted.
    fn live(&mut self, at: &(String, String)) -> Result<&mut MTask, TErr> {
        self.tasks
            .get_mut(at)
            .filter(|t| !t.deleted)
            .ok_or(TErr::Unknown)
    }

    fn running(
        &mut self,
        at: &(String, String),
        expected: Option<u64>,
    ) -> Result<&mut MTask, TErr> {
        let t = self.live(at)?;
        if t.status.is_terminal() {
            return Err(TErr::Terminated(t.status));
        }
        match expected {
            Some(v) if v != t.version => Err(TErr::Conflict {
                expected: v,
                version: t.version,
            }),
            _ => Ok(t),
        }
    }

    /// The version an op's compare-and-set names: the current one shifted by `offset`.
    fn expected(&self, at: &(String, String), offset: Option<i8>) -> Option<u64> {
        let v = self.tasks.get(at).map_or(1, |t| t.version);
        offset.map(|o| v.saturating_add_signed(i64::from(o)))
    }

    /// Runs `op` on `e` and on the model; panics on any difference.
    pub fn run(&mut self, e: &Engine, op: &TaskOp, ctx: &str) {
        match op {
            TaskOp::Create { owner, task, key } => {
                let at = names(*owner, *task);
                let request_key = format!("k{key}");
                let got = e
                    .create_task(NewTask {
                        owner: at.0.clone(),
                        task_id: at.1.clone(),
                        request_key: request_key.clone(),
                        ttl_ms: Some(3_600_000),
                        poll_interval_ms: None,
                        worker_lease_ms: None,
                        status_message: None,
                        context: Vec::new(),
                    })
                    .map_err(terr);
                let by_key = self.keys.get(&(at.0.clone(), request_key.clone())).cloned();
                match (got, by_key) {
                    (Ok(c), Some(first)) => {
                        assert!(!c.created, "{ctx}: a retry created a task");
                        assert_eq!(c.task.task_id, first, "{ctx}: the retry's task");
                    }
                    (Ok(c), None) => {
                        assert!(
                            !self.tasks.contains_key(&at),
                            "{ctx}: task id {} created twice",
                            at.1
                        );
                        assert!(c.created, "{ctx}");
                        assert!(
                            c.task.id > self.last_id,
                            "{ctx}: id {} not past {}",
                            c.task.id,
                            self.last_id
                        );
                        assert_eq!(
                            (c.task.status, c.task.version),
                            (TaskStatus::Working, 1),
                            "{ctx}"
                        );
                        self.last_id = c.task.id;
                        self.keys
                            .insert((at.0.clone(), request_key.clone()), at.1.clone());
                        self.tasks.insert(
                            at,
                            MTask {
                                id: c.task.id,
                                request_key,
                                status: TaskStatus::Working,
                                version: 1,
                                message: None,
                                cancel_requested: false,
                                end_cause: None,
                                outcome: TaskOutcome::none(),
                                deleted: false,
                                slots: BTreeMap::new(),
                                queues: [MQueue::default(), MQueue::default()],
                            },
                        );
                    }
                    (Err(err), by_key) => {
                        assert_eq!(by_key, None, "{ctx}: a retry failed: {err:?}");
                        assert!(self.tasks.contains_key(&at), "{ctx}: {err:?}");
                        assert_eq!(err, TErr::Exists, "{ctx}");
                    }
                }
            }
            TaskOp::Change {
                owner,
                task,
                input_required,
                expected,
                message,
            } => {
                let at = names(*owner, *task);
                let expected = self.expected(&at, *expected);
                let status = if *input_required {
                    TaskStatus::InputRequired
                } else {
                    TaskStatus::Working
                };
                let message = message.map(|m| format!("step {m}"));
                let got = e
                    .change_task(TaskChange {
                        task: TaskRef::new(at.0.clone(), at.1.clone()),
                        expected_version: expected,
                        status,
                        status_message: message.clone(),
                        ttl_ms: None,
                        poll_interval_ms: None,
                    })
                    .map(|w| w.task.version)
                    .map_err(terr);
                let want = self.running(&at, expected).map(|t| {
                    // Restating the status and message writes nothing (issue 30 item 7).
                    let restates = t.status == status
                        && message
                            .as_ref()
                            .is_none_or(|m| t.message.as_ref() == Some(m));
                    if !restates {
                        t.status = status;
                        if message.is_some() {
                            t.message = message;
                        }
                        t.version += 1;
                    }
                    t.version
                });
                assert_eq!(got, want, "{ctx}");
            }
            TaskOp::RequestInput { owner, task, keys } => {
                let at = names(*owner, *task);
                let requests: Vec<(String, Vec<u8>)> = keys
                    .iter()
                    .map(|k| (input_key(*k), format!("{{\"ask\":{k}}}").into_bytes()))
                    .collect();
                let got = e
                    .request_task_input(TaskInputRequest {
                        task: TaskRef::new(at.0.clone(), at.1.clone()),
                        requests: requests.clone(),
                        status_message: None,
                    })
                    .map(|w| w.task.version)
                    .map_err(terr);
                let want = self.running(&at, None).and_then(|t| {
                    for (i, (k, _)) in requests.iter().enumerate() {
                        if t.slots.contains_key(k) || requests[..i].iter().any(|(o, _)| o == k) {
                            return Err(TErr::Invalid("requests"));
                        }
                    }
                    for (k, _) in &requests {
                        t.slots.insert(k.clone(), (SlotState::Outstanding, None));
                    }
                    t.status = TaskStatus::InputRequired;
                    t.version += 1;
                    Ok(t.version)
                });
                assert_eq!(got, want, "{ctx}");
            }
            TaskOp::Answer { owner, task, keys } => {
                let at = names(*owner, *task);
                let responses: Vec<(String, Vec<u8>)> = keys
                    .iter()
                    .map(|k| (input_key(*k), format!("{{\"answer\":{k}}}").into_bytes()))
                    .collect();
                let got = e
                    .answer_task_input(TaskInputAnswer {
                        task: TaskRef::new(at.0.clone(), at.1.clone()),
                        responses: responses.clone(),
                    })
                    .map(|a| (a.task.version, a.accepted, a.ignored))
                    .map_err(terr);
                let want = self.live(&at).map(|t| {
                    let (mut accepted, mut ignored) = (Vec::new(), Vec::new());
                    for (k, response) in &responses {
                        let open = !t.status.is_terminal()
                            && !accepted.contains(k)
                            && t.slots
                                .get(k)
                                .is_some_and(|s| s.0 == SlotState::Outstanding);
                        if open {
                            t.slots
                                .insert(k.clone(), (SlotState::Answered, Some(response.clone())));
                            accepted.push(k.clone());
                        } else {
                            ignored.push(k.clone());
                        }
                    }
                    if !accepted.is_empty() {
                        t.version += 1;
                        let waiting = t.slots.values().any(|s| s.0 == SlotState::Outstanding);
                        if !waiting && t.status == TaskStatus::InputRequired {
                            t.status = TaskStatus::Working;
                        }
                    }
                    (t.version, accepted, ignored)
                });
                assert_eq!(got, want, "{ctx}");
            }
            TaskOp::Cancel {
                owner,
                task,
                terminal,
            } => {
                let at = names(*owner, *task);
                let got = e
                    .cancel_task(TaskCancel {
                        task: TaskRef::new(at.0.clone(), at.1.clone()),
                        mode: if *terminal {
                            CancelMode::Terminal
                        } else {
                            CancelMode::Request
                        },
                        status_message: None,
                    })
                    .map(|c| (c.task.version, c.already_terminal))
                    .map_err(terr);
                let want = self.live(&at).map(|t| {
                    if t.status.is_terminal() {
                        return (t.version, true);
                    }
                    if *terminal {
                        t.end(TaskStatus::Cancelled, None, TaskOutcome::none());
                    } else if !t.cancel_requested {
                        t.cancel_requested = true;
                        if t.status == TaskStatus::InputRequired {
                            t.status = TaskStatus::Working;
                        }
                        t.drop_outstanding();
                        t.version += 1;
                    }
                    (t.version, false)
                });
                assert_eq!(got, want, "{ctx}");
            }
            TaskOp::Finish {
                owner,
                task,
                status,
                expected,
                outcome,
            } => {
                let at = names(*owner, *task);
                let expected = self.expected(&at, *expected);
                let status = [
                    TaskStatus::Completed,
                    TaskStatus::Failed,
                    TaskStatus::Cancelled,
                ][usize::from(*status)];
                let outcome = match outcome {
                    0 => TaskOutcome::none(),
                    1 | 2 => TaskOutcome {
                        kind: OutcomeKind::Result,
                        json: format!("{{\"content\":{outcome}}}").into_bytes(),
                    },
                    _ => TaskOutcome {
                        kind: OutcomeKind::Error,
                        json: b"{\"code\":-1}".to_vec(),
                    },
                };
                let got = e
                    .finish_task(TaskFinish {
                        task: TaskRef::new(at.0.clone(), at.1.clone()),
                        expected_version: expected,
                        status,
                        status_message: Some("done".into()),
                        outcome: outcome.clone(),
                    })
                    .map(|w| (w.task.version, w.duplicate))
                    .map_err(terr);
                let want = self.live(&at).and_then(|t| {
                    if t.status.is_terminal() {
                        let same = outcome.kind == OutcomeKind::None || outcome == t.outcome;
                        return if t.status == status && same {
                            Ok((t.version, true))
                        } else {
                            Err(TErr::Terminated(t.status))
                        };
                    }
                    match expected {
                        Some(v) if v != t.version => Err(TErr::Conflict {
                            expected: v,
                            version: t.version,
                        }),
                        _ => {
                            t.end(status, Some("done".into()), outcome);
                            Ok((t.version, false))
                        }
                    }
                });
                assert_eq!(got, want, "{ctx}");
            }
            TaskOp::Delete { owner, task } => {
                let at = names(*owner, *task);
                let got = e
                    .delete_task(TaskRef::new(at.0.clone(), at.1.clone()))
                    .map(|w| w.task.version)
                    .map_err(terr);
                let want = self.live(&at).map(|t| {
                    t.deleted = true;
                    t.slots.clear();
                    t.queues = [MQueue::default(), MQueue::default()];
                    (t.request_key.clone(), t.version)
                });
                let want = want.map(|(key, version)| {
                    self.keys.remove(&(at.0.clone(), key));
                    version
                });
                assert_eq!(got, want, "{ctx}");
            }
            TaskOp::Enqueue {
                owner,
                task,
                inbound,
                dedupe,
                len,
            } => {
                let at = names(*owner, *task);
                let channel = usize::from(*inbound);
                let dedupe = dedupe.map(|d| format!("d{d}"));
                let message: Vec<u8> = (0..*len).map(|i| b'a' + i % 26).collect();
                let got = e
                    .enqueue_task_message(TaskEnqueue {
                        task: TaskRef::new(at.0.clone(), at.1.clone()),
                        channel: *inbound as u8,
                        message: message.clone(),
                        max_len: QUEUE_LEN,
                        dedupe_key: dedupe.clone(),
                        correlation: None,
                    })
                    .map(|q| (q.qseq, q.duplicate))
                    .map_err(terr);
                let want = self.live(&at).and_then(|t| {
                    let q = &mut t.queues[channel];
                    if let Some(d) = &dedupe {
                        if let Some((qseq, ..)) = q.queued.iter().find(|m| m.1.as_ref() == Some(d))
                        {
                            return Ok((*qseq, true));
                        }
                    }
                    if q.queued.len() >= QUEUE_LEN as usize {
                        return Err(TErr::QueueFull);
                    }
                    q.tail += 1;
                    q.queued.push_back((q.tail, dedupe, message));
                    Ok((q.tail, false))
                });
                assert_eq!(got, want, "{ctx}");
            }
            TaskOp::Dequeue {
                owner,
                task,
                inbound,
                max,
                token,
            } => {
                let at = names(*owner, *task);
                let channel = usize::from(*inbound);
                let token = format!("tok{token}");
                let got = e
                    .dequeue_task_messages(TaskDequeue {
                        task: TaskRef::new(at.0.clone(), at.1.clone()),
                        channel: *inbound as u8,
                        max_messages: u32::from(*max),
                        token: token.clone(),
                    })
                    .map(|d| {
                        let batch: Vec<(u64, Vec<u8>)> = d
                            .messages
                            .into_iter()
                            .map(|m| (m.qseq, m.message))
                            .collect();
                        (batch, d.duplicate)
                    })
                    .map_err(terr);
                let want = self.live(&at).map(|t| {
                    let q = &mut t.queues[channel];
                    if q.last_token.as_deref() == Some(token.as_str()) {
                        return (q.last_batch.clone(), true);
                    }
                    if q.queued.is_empty() {
                        return (Vec::new(), false);
                    }
                    let take = match max {
                        0 => q.queued.len(),
                        n => q.queued.len().min(usize::from(*n)),
                    };
                    let batch: Vec<(u64, Vec<u8>)> = q
                        .queued
                        .drain(..take)
                        .map(|(qseq, _, m)| (qseq, m))
                        .collect();
                    q.last_token = Some(token.clone());
                    q.last_batch = batch.clone();
                    (batch, false)
                });
                assert_eq!(got, want, "{ctx}");
            }
        }
    }

    /// The engine's view of every task and every owner's listing equal the model's, and no
    /// task's version went backwards.
    pub fn check(&mut self, e: &Engine, ctx: &str) {
        for ((owner, task_id), t) in &self.tasks {
            let view = e
                .task(&TaskRef::new(owner.clone(), task_id.clone()), true)
                .unwrap();
            let want_verdict = if t.deleted {
                TaskVerdict::Deleted
            } else {
                TaskVerdict::Found
            };
            assert_eq!(view.verdict, want_verdict, "{ctx}: {owner}/{task_id}");
            let m = view.task.as_ref().unwrap();
            let got = (
                m.id,
                m.status,
                m.version,
                m.status_message.clone(),
                m.cancel_requested,
                m.end_cause,
                m.is_deleted(),
            );
            let want = (
                t.id,
                t.status,
                t.version,
                t.message.clone(),
                t.cancel_requested,
                t.end_cause,
                t.deleted,
            );
            assert_eq!(got, want, "{ctx}: task {owner}/{task_id}");
            let seen = self
                .seen
                .entry((owner.clone(), task_id.clone()))
                .or_insert(0);
            assert!(m.version >= *seen, "{ctx}: version went backwards");
            *seen = m.version;
            if t.deleted {
                continue;
            }
            if t.status.is_terminal() {
                let outcome = view.outcome.clone().unwrap_or_else(TaskOutcome::none);
                assert_eq!(outcome, t.outcome, "{ctx}: outcome of {owner}/{task_id}");
            }
            let slots = |state: SlotState| -> Vec<(String, Option<Vec<u8>>)> {
                t.slots
                    .iter()
                    .filter(|(_, s)| s.0 == state)
                    .map(|(k, s)| (k.clone(), s.1.clone()))
                    .collect()
            };
            let mut outstanding: Vec<_> = view
                .outstanding
                .iter()
                .map(|s| (s.key.clone(), s.response.clone()))
                .collect();
            outstanding.sort();
            let mut answered: Vec<_> = view
                .answered
                .iter()
                .map(|s| (s.key.clone(), s.response.clone()))
                .collect();
            answered.sort();
            assert_eq!(
                outstanding,
                slots(SlotState::Outstanding),
                "{ctx}: outstanding"
            );
            assert_eq!(answered, slots(SlotState::Answered), "{ctx}: answered");
            assert_eq!(
                (view.outbound_queued, view.inbound_queued),
                (
                    t.queues[0].queued.len() as u64,
                    t.queues[1].queued.len() as u64
                ),
                "{ctx}: queued messages of {owner}/{task_id}"
            );
        }
        for owner in OWNERS {
            let page = e.list_tasks(owner, None, 1000).unwrap();
            let got: Vec<u64> = page.tasks.iter().map(|t| t.id).collect();
            let mut want: Vec<u64> = self
                .tasks
                .iter()
                .filter(|((o, _), t)| o == owner && !t.deleted)
                .map(|(_, t)| t.id)
                .collect();
            want.sort_unstable();
            assert_eq!(got, want, "{ctx}: the listing of owner {owner:?}");
        }
    }
}
