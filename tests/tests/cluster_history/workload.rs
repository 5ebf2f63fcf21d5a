//! The clients' side of the history run: what they learn of a session from its answers, the
//! call each picks next, and how each call is sent and its reply turned into an [`Answer`].

use std::time::Duration;

use cursorlog_tests::cluster::{Client, Cluster};
use cursorlog_tests::history::{
    Answer, Call, Claim, Delivered, FollowEnd, Phase, Recorder, Via, QUEUE_LEN,
};
use cursorlog_tests::{event, pb};
use tonic::Status;

/// How long a client waits for an answer before it records the call as outcome-unknown.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(2500);

/// splitmix64.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What the clients have learned of one stream (from answers; a hint, never trusted).
#[derive(Debug, Clone)]
pub(crate) struct StreamView {
    pub(crate) id: u64,
    pub(crate) epoch: u64,
    pub(crate) head: u64,
    pub(crate) open: bool,
}

/// What the clients have learned of one session.
#[derive(Debug, Clone)]
pub(crate) struct SessionView {
    pub(crate) name: String,
    pub(crate) epoch: u64,
    pub(crate) streams: Vec<StreamView>,
    /// The session's task, once an answer showed it: its version and whether it runs.
    task: Option<(u64, bool)>,
    pub(crate) calls: usize,
}

impl SessionView {
    pub(crate) fn new(name: String) -> Self {
        Self {
            name,
            epoch: 0,
            streams: Vec::new(),
            task: None,
            calls: 0,
        }
    }

    /// Learns from an answer.
    pub(crate) fn learn(&mut self, call: &Call, answer: &Answer) {
        let stream = match call {
            Call::Append { stream, .. }
            | Call::Complete { stream, .. }
            | Call::Abort { stream, .. }
            | Call::KeepAlive { stream }
            | Call::Resolve { stream, .. } => Some(*stream),
            _ => None,
        };
        let s = stream.and_then(|id| self.streams.iter_mut().find(|s| s.id == id));
        match answer {
            Answer::Session { epoch, .. } => self.epoch = self.epoch.max(*epoch),
            Answer::Advanced { epoch, .. } => {
                self.epoch = self.epoch.max(*epoch);
                for s in &mut self.streams {
                    if s.epoch < *epoch {
                        s.open = false;
                    }
                }
            }
            Answer::Opened { stream, epoch } => self.streams.push(StreamView {
                id: *stream,
                epoch: *epoch,
                head: 0,
                open: true,
            }),
            Answer::Appended { last, .. } => {
                if let Some(s) = s {
                    s.head = s.head.max(*last);
                }
            }
            Answer::Completed { terminal_seq, .. } => {
                if let Some(s) = s {
                    s.head = s.head.max(*terminal_seq);
                    s.open = false;
                }
            }
            Answer::Resolved { head, phase, .. } => {
                if let Some(s) = s {
                    s.head = s.head.max(head.unwrap_or(0));
                    s.open &= phase.is_none_or(|p| p == Phase::Open);
                }
            }
            Answer::Task {
                version, status, ..
            } => self.task = Some((*version, *status == 1 || *status == 2)),
            Answer::TaskRead {
                found: Some((version, status)),
            } => self.task = Some((*version, *status == 1 || *status == 2)),
            Answer::Refused { claim, .. } => match (claim, s) {
                (Claim::StaleEpoch { current }, _) => self.epoch = self.epoch.max(*current),
                (Claim::TaskVersion(v), _) => {
                    if let Some(t) = &mut self.task {
                        t.0 = *v;
                    }
                }
                (Claim::TaskEnded { .. }, _) => {
                    if let Some(t) = &mut self.task {
                        t.1 = false;
                    }
                }
                (Claim::Head(h), Some(s)) => s.head = s.head.max(*h),
                (Claim::Terminated { .. }, Some(s)) => s.open = false,
                _ => {}
            },
            _ => {}
        }
    }
}

/// The next call a client makes on `view`.
/// `tag` names the call (a write's payloads carry it).
pub(crate) fn choose(view: &SessionView, rng: &mut Rng, tag: u64) -> Call {
    if view.epoch == 0 {
        return Call::OpenSession;
    }
    let open: Vec<&StreamView> = view.streams.iter().filter(|s| s.open).collect();
    let any_stream = |rng: &mut Rng| -> Option<&StreamView> {
        // Mostly open streams; sometimes an ended one (its answers are claims too).
        if !open.is_empty() && rng.below(5) > 0 {
            Some(open[rng.below(open.len())])
        } else if view.streams.is_empty() {
            None
        } else {
            Some(&view.streams[rng.below(view.streams.len())])
        }
    };
    if rng.below(100) < 20 {
        return choose_task(view, rng, tag);
    }
    let r = rng.below(100);
    let stream = any_stream(rng);
    match (r, stream) {
        (0..=4, _) => Call::OpenSession,
        (5..=9, _) => Call::GetSession,
        (10..=12, _) => Call::AdvanceEpoch,
        (13..=24, _) | (_, None) => Call::OpenStream {
            // Now and then an epoch that may be stale.
            epoch: if rng.below(10) == 0 {
                view.epoch.saturating_sub(1).max(1)
            } else {
                view.epoch
            },
        },
        (25..=58, Some(s)) => Call::Append {
            stream: s.id,
            expected: s.head + 1,
            events: 1 + rng.below(2) as u64,
            tag,
            via: match rng.below(20) {
                0..=11 => Via::Unary,
                12..=16 => Via::Stream,
                _ => Via::Batch,
            },
        },
        (59..=63, Some(s)) => Call::Complete {
            stream: s.id,
            expected: s.head + 1,
            tag,
            via: if rng.below(4) == 0 {
                Via::Batch
            } else {
                Via::Unary
            },
        },
        (64..=65, Some(s)) => Call::Abort {
            stream: s.id,
            tag,
            frame: rng.below(2) == 0,
        },
        (66..=79, Some(s)) => Call::KeepAlive { stream: s.id },
        (80..=82, Some(s)) => Call::Follow {
            stream: s.id,
            epoch: s.epoch,
        },
        (_, Some(s)) => Call::Resolve {
            stream: s.id,
            epoch: s.epoch,
        },
    }
}

/// A call on the session's task: created first (and now and then again, a retry by its
/// request key), then status changes (some restating, some compare-and-set on the version
/// last seen), an end (finished or cancelled), messages through its queue (which outlives
/// the task's end), reads.
fn choose_task(view: &SessionView, rng: &mut Rng, tag: u64) -> Call {
    let Some((version, _)) = view.task else {
        return Call::CreateTask;
    };
    let expected = (rng.below(2) == 0).then_some(version);
    match rng.below(100) {
        0..=4 => Call::CreateTask,
        5..=44 => Call::UpdateTask {
            input: rng.below(2) == 0,
            message: 1 + rng.below(2) as u64,
            expected,
        },
        45..=52 => Call::FinishTask { expected },
        53..=55 => Call::CancelTask,
        56..=70 => Call::Enqueue { tag },
        71..=82 => Call::Dequeue {
            max: 1 + rng.below(2) as u32,
            tag,
        },
        _ => Call::GetTask,
    }
}

/// The answer of a task write: the task as it is now.
fn task_answer(task: Option<pb::Task>, duplicate: bool, created: Option<bool>) -> Answer {
    let t = task.unwrap_or_default();
    Answer::Task {
        version: t.version,
        status: t.status,
        duplicate,
        created,
    }
}

/// Sends `call` to member `member` and turns the reply into an [`Answer`].
pub(crate) async fn send(
    cluster: &Cluster,
    member: usize,
    session: &str,
    call: &Call,
    clock: &Recorder,
) -> Sent {
    let mut c = cluster.client(member);
    let mut tasks = cluster.tasks(member);
    let session = session.to_owned();
    let payload = |tag: u64, k: u64| format!("{session}/{tag}/{k}").into_bytes();
    let mut resolution = None;
    let fut = async {
        let answer: Result<Answer, Status> = match call {
            Call::OpenSession => c
                .open_session(pb::OpenSessionRequest {
                    session: session.clone(),
                    state: None,
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    Answer::Session {
                        epoch: r.epoch,
                        created: Some(r.created),
                    }
                }),
            Call::GetSession => c
                .get_session(pb::GetSessionRequest {
                    session: session.clone(),
                })
                .await
                .map(|r| Answer::Session {
                    epoch: r.into_inner().epoch,
                    created: None,
                }),
            Call::AdvanceEpoch => c
                .advance_epoch(pb::AdvanceEpochRequest {
                    session: session.clone(),
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    Answer::Advanced {
                        epoch: r.epoch,
                        superseded: r.superseded_streams,
                    }
                }),
            Call::OpenStream { epoch } => c
                .open_stream(pb::OpenStreamRequest {
                    session: session.clone(),
                    epoch: *epoch,
                    correlation: None,
                    lease_ms: None,
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    Answer::Opened {
                        stream: r.stream,
                        epoch: r.epoch,
                    }
                }),
            Call::Append {
                stream,
                expected,
                events,
                tag,
                via,
            } => {
                let req = pb::AppendRequest {
                    session: session.clone(),
                    stream: *stream,
                    expected_next_seq: Some(*expected),
                    events: (0..*events)
                        .map(|k| event("h", &payload(*tag, k)))
                        .collect(),
                };
                match via {
                    Via::Unary => c.append(req).await.map(|r| appended(&r.into_inner())),
                    Via::Stream => append_streamed(&mut c, req).await,
                    Via::Batch => batched(&mut c, pb::batch_item::Item::Append(req)).await,
                }
            }
            Call::Complete {
                stream,
                expected,
                tag,
                via,
            } => {
                let req = pb::CompleteRequest {
                    session: session.clone(),
                    stream: *stream,
                    expected_next_seq: Some(*expected),
                    terminal: Some(event("result", &payload(*tag, 0))),
                };
                match via {
                    Via::Batch => batched(&mut c, pb::batch_item::Item::Complete(req)).await,
                    _ => c.complete(req).await.map(|r| terminated(&r.into_inner())),
                }
            }
            Call::Abort { stream, tag, frame } => c
                .abort(pb::AbortRequest {
                    session: session.clone(),
                    stream: *stream,
                    reason: "history".into(),
                    terminal: frame.then(|| event("error", &payload(*tag, 0))),
                })
                .await
                .map(|r| terminated(&r.into_inner())),
            Call::Follow { stream, epoch } => {
                follow(&mut c, &session, *stream, *epoch, clock, &mut resolution).await
            }
            Call::KeepAlive { stream } => c
                .keep_alive(pb::KeepAliveRequest {
                    session: session.clone(),
                    stream: *stream,
                })
                .await
                .map(|_| Answer::Alive),
            Call::Resolve { stream, epoch } => c
                .resolve(pb::ResolveRequest {
                    session: session.clone(),
                    last_event_id: format!("{epoch}-{stream}-0"),
                    declared_stream: None,
                })
                .await
                .map(|r| resolved(&r.into_inner())),
            Call::CreateTask => tasks
                .create_task(pb::CreateTaskRequest {
                    owner: session.clone(),
                    task_id: "t".into(),
                    request_key: "k".into(),
                    ..Default::default()
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    task_answer(r.task, false, Some(r.created))
                }),
            Call::UpdateTask {
                input,
                message,
                expected,
            } => tasks
                .update_task(pb::UpdateTaskRequest {
                    owner: session.clone(),
                    task_id: "t".into(),
                    expected_version: *expected,
                    status: if *input {
                        pb::TaskStatus::InputRequired
                    } else {
                        pb::TaskStatus::Working
                    }
                    .into(),
                    status_message: Some(format!("m{message}")),
                    ..Default::default()
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    task_answer(r.task, r.duplicate, None)
                }),
            Call::FinishTask { expected } => tasks
                .finish_task(pb::FinishTaskRequest {
                    owner: session.clone(),
                    task_id: "t".into(),
                    expected_version: *expected,
                    status: pb::TaskStatus::Completed.into(),
                    ..Default::default()
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    task_answer(r.task, r.duplicate, None)
                }),
            Call::CancelTask => tasks
                .cancel_task(pb::CancelTaskRequest {
                    owner: session.clone(),
                    task_id: "t".into(),
                    mode: pb::cancel_task_request::Mode::Terminal.into(),
                    status_message: None,
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    task_answer(r.task, r.already_terminal, None)
                }),
            Call::Enqueue { tag } => tasks
                .enqueue_task_message(pb::EnqueueTaskMessageRequest {
                    owner: session.clone(),
                    task_id: "t".into(),
                    channel: 0,
                    message: tag.to_string().into_bytes(),
                    max_len: QUEUE_LEN,
                    dedupe_key: None,
                    correlation: None,
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    Answer::Enqueued {
                        qseq: r.qseq,
                        duplicate: r.duplicate,
                    }
                }),
            Call::Dequeue { max, tag } => tasks
                .dequeue_task_messages(pb::DequeueTaskMessagesRequest {
                    owner: session.clone(),
                    task_id: "t".into(),
                    channel: 0,
                    max_messages: *max,
                    // Unique per call: no dequeue is a retry of another.
                    token: format!("d{tag}"),
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    let messages = r
                        .messages
                        .iter()
                        .map(|m| {
                            let tag = std::str::from_utf8(&m.message)
                                .ok()
                                .and_then(|t| t.parse().ok())
                                .unwrap_or(u64::MAX);
                            (m.qseq, tag)
                        })
                        .collect();
                    Answer::Dequeued {
                        messages,
                        duplicate: r.duplicate,
                    }
                }),
            Call::GetTask => tasks
                .get_task(pb::GetTaskRequest {
                    owner: session.clone(),
                    task_id: "t".into(),
                    include_outcome: false,
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    const FOUND: i32 = 1;
                    const UNKNOWN: i32 = 4;
                    match r.verdict {
                        FOUND => {
                            let t = r.view.and_then(|v| v.task).unwrap_or_default();
                            Answer::TaskRead {
                                found: Some((t.version, t.status)),
                            }
                        }
                        UNKNOWN => Answer::TaskRead { found: None },
                        v => Answer::Refused {
                            code: tonic::Code::Ok,
                            message: format!("GetTask verdict {v} (the model never expires tasks)"),
                            claim: Claim::Other,
                        },
                    }
                }),
        };
        answer
    };
    let answer = match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(a)) => a,
        Ok(Err(status)) => Answer::from_status(&status),
        Err(_) => Answer::timed_out(CALL_TIMEOUT),
    };
    Sent { answer, resolution }
}

/// What a call got: its answer and, for a follow, its resolution with when it came.
pub(crate) struct Sent {
    pub(crate) answer: Answer,
    /// A `Read`'s first message, recorded as a `Resolve` that ended when it came.
    pub(crate) resolution: Option<(Answer, u64)>,
}

fn appended(r: &pb::AppendResponse) -> Answer {
    Answer::Appended {
        first: r.first_seq,
        last: r.last_seq,
        duplicate: r.duplicate,
    }
}

fn terminated(r: &pb::TerminateResponse) -> Answer {
    Answer::Completed {
        terminal_seq: r.terminal_seq,
        duplicate: r.duplicate,
    }
}

/// A failure reported inside a streamed or batched answer, read as its unary call's status
/// would be (it carries no `cursorlog-retry`, so an `UNAVAILABLE` claims nothing).
fn failure(f: &pb::Failure) -> Answer {
    Answer::from_status(&Status::new(tonic::Code::from(f.code), f.message.clone()))
}

/// The append as the one request of an `AppendStream` call.
async fn append_streamed(c: &mut Client, req: pb::AppendRequest) -> Result<Answer, Status> {
    let mut results = c
        .append_stream(tokio_stream::iter([req]))
        .await?
        .into_inner();
    let Some(result) = results.message().await? else {
        return Ok(Answer::Unknown {
            what: "AppendStream ended without a result".into(),
        });
    };
    Ok(match result.result {
        Some(pb::append_result::Result::Appended(r)) => appended(&r),
        Some(pb::append_result::Result::Failure(f)) => failure(&f),
        None => Answer::Refused {
            code: tonic::Code::Ok,
            message: "an empty AppendResult".into(),
            claim: Claim::Other,
        },
    })
}

/// The write as the one item of an `AppendBatch` call.
async fn batched(c: &mut Client, item: pb::batch_item::Item) -> Result<Answer, Status> {
    let r = c
        .append_batch(pb::AppendBatchRequest {
            items: vec![pb::BatchItem { item: Some(item) }],
        })
        .await?
        .into_inner();
    let odd = |message: String| Answer::Refused {
        code: tonic::Code::Ok,
        message,
        claim: Claim::Other,
    };
    Ok(match r.results.as_slice() {
        [one] => match &one.result {
            Some(pb::batch_result::Result::Appended(a)) => appended(a),
            Some(pb::batch_result::Result::Completed(t)) => terminated(t),
            Some(pb::batch_result::Result::Failure(f)) => failure(f),
            other => odd(format!("an AppendBatch result of another kind: {other:?}")),
        },
        many => odd(format!("{} AppendBatch results for one item", many.len())),
    })
}

/// How long a follow is held at most before the client stops reading.
pub(crate) const FOLLOW_FOR: Duration = Duration::from_millis(400);

/// A `Read` with `follow` from the stream's start: its resolution goes to `resolution`
/// (with when it came), its events and its end make the answer.
async fn follow(
    c: &mut Client,
    session: &str,
    stream: u64,
    epoch: u64,
    clock: &Recorder,
    resolution: &mut Option<(Answer, u64)>,
) -> Result<Answer, Status> {
    let mut reads = c
        .read(pb::ReadRequest {
            session: session.to_owned(),
            last_event_id: format!("{epoch}-{stream}-0"),
            declared_stream: None,
            follow: true,
            batch_events_max: 0,
            resume_own_stream: false,
        })
        .await?
        .into_inner();
    let until = tokio::time::Instant::now() + FOLLOW_FOR;
    let mut events = Vec::new();
    let end = 'read: loop {
        let message = match tokio::time::timeout_at(until, reads.message()).await {
            Err(_) | Ok(Ok(None)) => break FollowEnd::Open,
            Ok(Err(status)) => match Answer::from_status(&status) {
                Answer::Unknown { .. } | Answer::NotDone { .. } => break FollowEnd::Open,
                refused => break FollowEnd::Odd(format!("the follow failed: {refused}")),
            },
            Ok(Ok(Some(m))) => m,
        };
        match message.item {
            Some(pb::read_response::Item::Resolution(r)) => {
                *resolution = Some((resolved(&r), clock.now()));
            }
            Some(pb::read_response::Item::Events(batch)) => {
                for e in batch.events {
                    match Delivered::parse(e.seq, &e.payload) {
                        Some(d) if e.stream == stream => events.push(d),
                        _ => break 'read FollowEnd::Odd(format!("an event never written: {e:?}")),
                    }
                }
            }
            Some(pb::read_response::Item::End(e)) => {
                break FollowEnd::Ended {
                    phase: Phase::from_proto(e.state),
                    terminal_seq: e.terminal_seq,
                };
            }
            other => break FollowEnd::Odd(format!("an unexpected message: {other:?}")),
        }
    };
    Ok(Answer::Followed { events, end })
}

fn resolved(r: &pb::Resolution) -> Answer {
    Answer::Resolved {
        verdict: r.verdict,
        current_epoch: r.current_epoch,
        phase: r.stream_state.and_then(Phase::from_proto),
        head: r.head,
    }
}
