//! Durable MCP tasks through the engine's API (docs/TASKS-DESIGN.md §5.1): idempotent and
//! durable creation, owners that never see each other's tasks, the compare-and-set that
//! lets exactly one writer end a task, inputs answered exactly once, caps, verdicts after
//! deletion, listing, and task state that survives a crash, an index rebuild and the
//! retirement of the segment it was written in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{
    CancelMode, Config, Engine, Error, LiveLimit, ManualClock, NewTask, OutcomeKind, SlotState,
    TaskCancel, TaskChange, TaskFinish, TaskInputAnswer, TaskInputRequest, TaskOutcome, TaskRef,
    TaskStatus, TaskVerdict,
};

/// A fixed start time on an injected clock (ms since the epoch).
const T0: u64 = 1_800_000_000_000;

fn config(dir: &Path, clock: &Arc<ManualClock>) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.retention.check_interval = Duration::from_secs(3600);
    c.background_expiry = false;
    c.clock = Arc::clone(clock) as _;
    c
}

fn open(dir: &Path) -> (Engine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    (Engine::open(config(dir, &clock)).unwrap(), clock)
}

fn new_task(owner: &str, task_id: &str, request_key: &str) -> NewTask {
    NewTask {
        owner: owner.into(),
        task_id: task_id.into(),
        request_key: request_key.into(),
        ttl_ms: Some(60_000),
        poll_interval_ms: None,
        worker_lease_ms: None,
        status_message: None,
        context: b"{\"name\":\"slow_compute\"}".to_vec(),
    }
}

fn result(json: &str) -> TaskOutcome {
    TaskOutcome {
        kind: OutcomeKind::Result,
        json: json.as_bytes().to_vec(),
    }
}

fn finish(owner: &str, task_id: &str, status: TaskStatus, outcome: TaskOutcome) -> TaskFinish {
    TaskFinish {
        task: TaskRef::new(owner, task_id),
        expected_version: None,
        status,
        status_message: None,
        outcome,
    }
}

fn change(owner: &str, task_id: &str, version: Option<u64>, message: &str) -> TaskChange {
    TaskChange {
        task: TaskRef::new(owner, task_id),
        expected_version: version,
        status: TaskStatus::Working,
        status_message: Some(message.into()),
        ttl_ms: None,
        poll_interval_ms: None,
    }
}

fn status_of(e: &Engine, owner: &str, task_id: &str) -> TaskStatus {
    e.task(&TaskRef::new(owner, task_id), false)
        .unwrap()
        .task
        .expect("the task is found")
        .status
}

#[test]
fn create_is_idempotent_by_request_key_and_task_ids_are_unique_per_owner() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    let first = e.create_task(new_task("s:a", "t1", "req-1")).unwrap();
    assert!(first.created);
    assert_eq!(first.task.status, TaskStatus::Working);
    assert_eq!(first.task.version, 1);
    assert_eq!(first.task.created_at_ms, T0);
    assert_eq!(first.task.poll_interval_ms, 1_000, "the default");
    // A retry of the request, even naming a new task id, gets the first task back.
    let again = e.create_task(new_task("s:a", "t2", "req-1")).unwrap();
    assert!(!again.created);
    assert_eq!(again.task, first.task);
    assert_eq!(
        e.task(&TaskRef::new("s:a", "t2"), false).unwrap().verdict,
        TaskVerdict::Unknown,
        "the retry created nothing"
    );
    // The task id of another request of the same owner is taken.
    assert!(matches!(
        e.create_task(new_task("s:a", "t1", "req-2")),
        Err(Error::TaskExists { task_id }) if task_id == "t1"
    ));
    // Another owner's ids and request keys are another namespace.
    assert!(
        e.create_task(new_task("s:b", "t1", "req-1"))
            .unwrap()
            .created
    );
}

#[test]
fn a_created_task_survives_a_crash_right_after_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (e, clock) = open(dir.path());
    let created = e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    e.simulate_crash();
    drop(e);
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let view = e.task(&TaskRef::new("s:a", "t1"), false).unwrap();
    assert_eq!(view.verdict, TaskVerdict::Found);
    assert_eq!(view.task, Some(created.task));
}

#[test]
fn another_owners_task_is_not_found_by_any_call() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    let theirs = TaskRef::new("s:b", "t1");
    let unknown = |r: Result<_, Error>| matches!(r, Err(Error::UnknownTask { .. }));
    assert_eq!(e.task(&theirs, true).unwrap().verdict, TaskVerdict::Unknown);
    assert!(unknown(
        e.change_task(change("s:b", "t1", None, "x")).map(|_| ())
    ));
    assert!(unknown(
        e.finish_task(finish("s:b", "t1", TaskStatus::Completed, result("{}")))
            .map(|_| ())
    ));
    assert!(unknown(
        e.cancel_task(TaskCancel {
            task: theirs.clone(),
            mode: CancelMode::Terminal,
            status_message: None,
        })
        .map(|_| ())
    ));
    assert!(unknown(
        e.answer_task_input(TaskInputAnswer {
            task: theirs.clone(),
            responses: vec![("k".into(), b"1".to_vec())],
        })
        .map(|_| ())
    ));
    assert!(unknown(e.delete_task(theirs).map(|_| ())));
    assert!(e.list_tasks("s:b", None, 0).unwrap().tasks.is_empty());
    // The empty owner is an owner like any other: it sees nothing of `s:a` either.
    assert!(e.list_tasks("", None, 0).unwrap().tasks.is_empty());
    assert_eq!(status_of(&e, "s:a", "t1"), TaskStatus::Working);
}

#[test]
fn exactly_one_of_two_racing_ends_wins_and_a_retry_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    let racers: Vec<_> = [TaskStatus::Completed, TaskStatus::Cancelled]
        .into_iter()
        .map(|status| {
            let e = e.clone();
            std::thread::spawn(move || {
                let outcome = if status == TaskStatus::Completed {
                    result("{\"content\":[]}")
                } else {
                    TaskOutcome::none()
                };
                (status, e.finish_task(finish("s:a", "t1", status, outcome)))
            })
        })
        .collect();
    let results: Vec<_> = racers.into_iter().map(|h| h.join().unwrap()).collect();
    let winners: Vec<TaskStatus> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = winners[0];
    for (_, r) in &results {
        if let Err(err) = r {
            assert!(
                matches!(err, Error::TaskTerminated { status, .. } if *status == winner),
                "the loser hears the winner's status: {err}"
            );
        }
    }
    assert_eq!(status_of(&e, "s:a", "t1"), winner);
    // The winner's retry changes nothing and says so.
    let outcome = if winner == TaskStatus::Completed {
        result("{\"content\":[]}")
    } else {
        TaskOutcome::none()
    };
    let retry = e.finish_task(finish("s:a", "t1", winner, outcome)).unwrap();
    assert!(retry.duplicate);
    assert_eq!(retry.task.version, 2);
    // A terminal task never changes.
    assert!(matches!(
        e.change_task(change("s:a", "t1", None, "late")),
        Err(Error::TaskTerminated { .. })
    ));
}

#[test]
fn the_result_is_stored_with_the_terminal_status_in_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let (e, clock) = open(dir.path());
    e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    clock.advance(Duration::from_millis(5));
    let done = e
        .finish_task(finish(
            "s:a",
            "t1",
            TaskStatus::Completed,
            result("{\"content\":[{\"type\":\"text\",\"text\":\"42\"}]}"),
        ))
        .unwrap();
    assert_eq!(done.task.ended_at_ms, Some(T0 + 5));
    let view = e.task(&TaskRef::new("s:a", "t1"), true).unwrap();
    let outcome = view.outcome.expect("a terminal task's outcome");
    assert_eq!(outcome.kind, OutcomeKind::Result);
    assert_eq!(
        outcome.json,
        b"{\"content\":[{\"type\":\"text\",\"text\":\"42\"}]}".to_vec()
    );
    // Without asking, no outcome travels.
    assert_eq!(
        e.task(&TaskRef::new("s:a", "t1"), false).unwrap().outcome,
        None
    );
    // The TTL restarts at the end.
    assert_eq!(view.task.unwrap().deadline_ms(), Some(T0 + 5 + 60_000));
}

#[test]
fn a_stale_expected_version_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    let v2 = e.change_task(change("s:a", "t1", Some(1), "half")).unwrap();
    assert_eq!(v2.task.version, 2);
    assert_eq!(v2.task.status_message.as_deref(), Some("half"));
    assert!(matches!(
        e.change_task(change("s:a", "t1", Some(1), "again")),
        Err(Error::TaskConflict {
            expected_version: 1,
            version: 2,
            ..
        })
    ));
    let mut end = finish("s:a", "t1", TaskStatus::Failed, TaskOutcome::none());
    end.expected_version = Some(1);
    assert!(matches!(
        e.finish_task(end),
        Err(Error::TaskConflict { .. })
    ));
    assert_eq!(status_of(&e, "s:a", "t1"), TaskStatus::Working);
}

#[test]
fn inputs_are_answered_exactly_once_and_the_last_answer_resumes_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    let t = TaskRef::new("s:a", "t1");
    let asked = e
        .request_task_input(TaskInputRequest {
            task: t.clone(),
            requests: vec![
                (
                    "confirm".into(),
                    b"{\"method\":\"elicitation/create\"}".to_vec(),
                ),
                ("pick".into(), b"{}".to_vec()),
            ],
            status_message: Some("waiting for you".into()),
        })
        .unwrap();
    assert_eq!(asked.task.status, TaskStatus::InputRequired);
    let view = e.task(&t, false).unwrap();
    let keys: Vec<_> = view.outstanding.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["confirm", "pick"]);
    let first = e
        .answer_task_input(TaskInputAnswer {
            task: t.clone(),
            responses: vec![
                ("confirm".into(), b"{\"action\":\"accept\"}".to_vec()),
                ("nope".into(), b"{}".to_vec()),
            ],
        })
        .unwrap();
    assert_eq!(first.accepted, ["confirm"]);
    assert_eq!(first.ignored, ["nope"]);
    assert_eq!(first.task.status, TaskStatus::InputRequired, "pick is left");
    let applied = e.stats().unwrap().last_lsn;
    let retry = e
        .answer_task_input(TaskInputAnswer {
            task: t.clone(),
            responses: vec![("confirm".into(), b"{\"action\":\"decline\"}".to_vec())],
        })
        .unwrap();
    assert!(retry.accepted.is_empty());
    assert_eq!(retry.ignored, ["confirm"]);
    assert_eq!(
        e.stats().unwrap().last_lsn,
        applied,
        "an ignored answer writes nothing"
    );
    let last = e
        .answer_task_input(TaskInputAnswer {
            task: t.clone(),
            responses: vec![("pick".into(), b"2".to_vec())],
        })
        .unwrap();
    assert_eq!(last.task.status, TaskStatus::Working);
    let view = e.task(&t, false).unwrap();
    assert!(view.outstanding.is_empty());
    // The running replica reads the answers, each the first one given.
    let answers: Vec<_> = view
        .answered
        .iter()
        .map(|s| (s.key.as_str(), s.response.clone().unwrap()))
        .collect();
    assert_eq!(
        answers,
        [
            ("confirm", b"{\"action\":\"accept\"}".to_vec()),
            ("pick", b"2".to_vec())
        ]
    );
    // A key is never reused in the task's life.
    assert!(matches!(
        e.request_task_input(TaskInputRequest {
            task: t,
            requests: vec![("confirm".into(), b"{}".to_vec())],
            status_message: None,
        }),
        Err(Error::InvalidArgument {
            field: "requests",
            ..
        })
    ));
}

#[test]
fn a_cancel_request_is_recorded_once_and_a_terminal_cancel_ends_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    e.create_task(new_task("s:a", "t2", "r2")).unwrap();
    let t1 = TaskRef::new("s:a", "t1");
    e.request_task_input(TaskInputRequest {
        task: t1.clone(),
        requests: vec![("k".into(), b"{}".to_vec())],
        status_message: None,
    })
    .unwrap();
    let cancel = |task: &TaskRef, mode| {
        e.cancel_task(TaskCancel {
            task: task.clone(),
            mode,
            status_message: None,
        })
        .unwrap()
    };
    let requested = cancel(&t1, CancelMode::Request);
    assert!(requested.task.cancel_requested);
    assert_eq!(requested.task.status, TaskStatus::Working, "the wait ends");
    assert_eq!(requested.task.version, 3);
    assert_eq!(cancel(&t1, CancelMode::Request).task.version, 3, "once");
    assert!(e.task(&t1, false).unwrap().outstanding.is_empty());
    let t2 = TaskRef::new("s:a", "t2");
    let ended = cancel(&t2, CancelMode::Terminal);
    assert_eq!(ended.task.status, TaskStatus::Cancelled);
    assert!(!ended.already_terminal);
    let again = cancel(&t2, CancelMode::Terminal);
    assert!(
        again.already_terminal,
        "a cancel of an ended task is acknowledged"
    );
    assert_eq!(again.task.status, TaskStatus::Cancelled);
}

#[test]
fn the_per_owner_cap_refuses_with_a_clear_error_and_frees_on_delete() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let mut cfg = config(dir.path(), &clock);
    cfg.tasks.per_owner_max = 3;
    let e = Engine::open(cfg).unwrap();
    for i in 0..3 {
        e.create_task(new_task("s:a", &format!("t{i}"), &format!("r{i}")))
            .unwrap();
    }
    let refused = e.create_task(new_task("s:a", "t3", "r3")).unwrap_err();
    assert!(
        matches!(
            refused,
            Error::AtCapacity {
                limit: LiveLimit::TasksPerOwner,
                max: 3
            }
        ),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("tasks.per_owner_max"),
        "{refused}"
    );
    // Another owner is not held back by this one.
    e.create_task(new_task("s:b", "t0", "r0")).unwrap();
    // An ended task still counts until it is deleted.
    e.finish_task(finish("s:a", "t0", TaskStatus::Failed, TaskOutcome::none()))
        .unwrap();
    assert!(e.create_task(new_task("s:a", "t3", "r3")).is_err());
    e.delete_task(TaskRef::new("s:a", "t0")).unwrap();
    e.create_task(new_task("s:a", "t3", "r3")).unwrap();
}

#[test]
fn a_deleted_task_says_deleted_until_the_horizon_then_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let mut cfg = config(dir.path(), &clock);
    cfg.retention.metadata_horizon = Duration::from_millis(1_000);
    let e = Engine::open(cfg).unwrap();
    e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    let t = TaskRef::new("s:a", "t1");
    e.delete_task(t.clone()).unwrap();
    let view = e.task(&t, true).unwrap();
    assert_eq!(view.verdict, TaskVerdict::Deleted);
    assert_eq!(view.task.unwrap().deleted_at_ms, Some(T0));
    assert!(matches!(
        e.delete_task(t.clone()),
        Err(Error::UnknownTask { .. })
    ));
    // The tombstone keeps the id taken; the request key is free.
    assert!(matches!(
        e.create_task(new_task("s:a", "t1", "r9")),
        Err(Error::TaskExists { .. })
    ));
    clock.advance(Duration::from_millis(1_000));
    assert_eq!(e.task(&t, false).unwrap().verdict, TaskVerdict::Unknown);
}

#[test]
fn listing_pages_through_an_owners_tasks_in_creation_order() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    for i in 0..25 {
        e.create_task(new_task("s:a", &format!("t{i:02}"), &format!("r{i}")))
            .unwrap();
        e.create_task(new_task("s:ab", &format!("x{i:02}"), &format!("r{i}")))
            .unwrap();
    }
    e.delete_task(TaskRef::new("s:a", "t12")).unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = e.list_tasks("s:a", after, 10).unwrap();
        pages += 1;
        assert!(page.tasks.len() <= 10);
        seen.extend(page.tasks.iter().map(|t| t.task_id.clone()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let want: Vec<String> = (0..25)
        .filter(|i| *i != 12)
        .map(|i| format!("t{i:02}"))
        .collect();
    assert_eq!(seen, want, "in order, each once, none of `s:ab`'s");
    assert_eq!(pages, 3);
    assert!(matches!(
        e.list_tasks("s:a", None, cursorlog_engine::TASK_PAGE_MAX + 1),
        Err(Error::InvalidArgument {
            field: "page_size",
            ..
        })
    ));
}

#[test]
fn bad_input_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    let before = e.stats().unwrap().last_lsn;
    let mut no_id = new_task("s:a", "", "r1");
    assert!(matches!(
        e.create_task(no_id.clone()),
        Err(Error::InvalidArgument {
            field: "task_id",
            ..
        })
    ));
    no_id.task_id = "t".into();
    no_id.ttl_ms = Some(0);
    assert!(matches!(
        e.create_task(no_id.clone()),
        Err(Error::InvalidArgument {
            field: "ttl_ms",
            ..
        })
    ));
    no_id.ttl_ms = None;
    no_id.context = vec![0; 64 * 1024 + 1];
    assert!(matches!(e.create_task(no_id), Err(Error::TooLarge { .. })));
    assert!(matches!(
        e.finish_task(finish(
            "s:a",
            "t",
            TaskStatus::Completed,
            TaskOutcome {
                kind: OutcomeKind::Result,
                json: Vec::new()
            }
        )),
        Err(Error::InvalidArgument {
            field: "outcome",
            ..
        })
    ));
    assert!(matches!(
        e.finish_task(finish("s:a", "t", TaskStatus::Working, TaskOutcome::none())),
        Err(Error::UnknownTask { .. }) | Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(e.stats().unwrap().last_lsn, before);
}

/// The engine's whole task state, as the index holds it.
fn task_keys(e: &Engine) -> Vec<(Vec<u8>, Vec<u8>)> {
    e.index_dump()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| b"KIYPCDZX".contains(&k[0]) || (k[0] == b'R' && k.get(9) == Some(&b'K')))
        .collect()
}

/// A history touching every task record, then: the index rebuilt from the log equals the
/// live one, and so does the one after the segments the tasks were born in are retired.
#[test]
fn task_state_is_rebuilt_from_the_log_and_carried_past_retention() {
    let dir = tempfile::tempdir().unwrap();
    let (e, clock) = open(dir.path());
    for i in 0..6 {
        let t = format!("t{i}");
        e.create_task(new_task("s:a", &t, &format!("r{i}")))
            .unwrap();
        let r = TaskRef::new("s:a", t.clone());
        e.request_task_input(TaskInputRequest {
            task: r.clone(),
            requests: vec![("k".into(), vec![b'q'; 300])],
            status_message: None,
        })
        .unwrap();
        match i % 3 {
            0 => {
                e.answer_task_input(TaskInputAnswer {
                    task: r.clone(),
                    responses: vec![("k".into(), vec![b'a'; 300])],
                })
                .unwrap();
                e.finish_task(finish(
                    "s:a",
                    &t,
                    TaskStatus::Completed,
                    result("{\"ok\":1}"),
                ))
                .unwrap();
            }
            1 => {
                e.cancel_task(TaskCancel {
                    task: r,
                    mode: CancelMode::Request,
                    status_message: None,
                })
                .unwrap();
            }
            _ => {
                e.delete_task(r).unwrap();
            }
        }
    }
    let live = task_keys(&e);
    assert!(live.len() > 20, "{} task keys", live.len());
    e.close().unwrap();
    drop(e);
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    assert!(e.recovery_report().index_rebuilt);
    assert_eq!(task_keys(&e), live, "rebuilt from the log alone");
    // Retire the segments the tasks were born in: their state is carried forward.
    let session = e.open_session("filler").unwrap();
    let stream = e
        .open_stream(cursorlog_engine::OpenStream {
            session: "filler".into(),
            epoch: session.epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream;
    for _ in 0..60 {
        e.append(cursorlog_engine::Append {
            session: "filler".into(),
            stream,
            expected_next_seq: None,
            events: vec![cursorlog_engine::NewEvent::new("p", vec![7u8; 200])],
        })
        .unwrap();
    }
    e.trim("filler", stream, u64::MAX).unwrap();
    let retired = e.run_retention().unwrap();
    assert!(retired >= 3, "the tasks' segments retire: {retired}");
    let carried: Vec<_> = task_keys(&e)
        .into_iter()
        .filter(|(k, _)| k[0] != b'R' && k[0] != b'K')
        .collect();
    let before: Vec<_> = live
        .iter()
        .filter(|(k, _)| k[0] != b'R' && k[0] != b'K')
        .cloned()
        .collect();
    assert_eq!(
        carried, before,
        "content keys are unchanged by carry-forward"
    );
    for i in 0..6 {
        let want = e.task(&TaskRef::new("s:a", format!("t{i}")), true).unwrap();
        assert_ne!(want.verdict, TaskVerdict::Unknown, "t{i}");
    }
    let kept = task_keys(&e);
    e.close().unwrap();
    drop(e);
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    assert_eq!(task_keys(&e), kept, "rebuilt from the retained log alone");
    let t0 = e.task(&TaskRef::new("s:a", "t0"), true).unwrap();
    assert_eq!(t0.task.unwrap().status, TaskStatus::Completed);
    assert_eq!(t0.outcome.unwrap().json, b"{\"ok\":1}".to_vec());
    let t1 = e.task(&TaskRef::new("s:a", "t1"), false).unwrap();
    assert!(t1.task.unwrap().cancel_requested);
    assert_eq!(
        e.task(&TaskRef::new("s:a", "t2"), false).unwrap().verdict,
        TaskVerdict::Deleted
    );
    let slots = e.task(&TaskRef::new("s:a", "t3"), false).unwrap();
    assert!(
        slots.outstanding.is_empty(),
        "t3's answered input is not outstanding"
    );
    let t4 = e.task(&TaskRef::new("s:a", "t4"), false).unwrap();
    assert!(
        t4.outstanding.is_empty(),
        "a cancel request dropped t4's input"
    );
    let t1_input = e.task(&TaskRef::new("s:a", "t1"), false).unwrap();
    assert!(t1_input
        .outstanding
        .iter()
        .all(|s| s.state == SlotState::Outstanding));
}

/// Issue 30 item 7: an update that restates the task's status and message (a retry, a
/// worker repeating itself) writes nothing: `duplicate`, the same version, so its watchers
/// are not woken; anything new is written at the next version.
#[test]
fn an_update_restating_the_task_writes_nothing_and_says_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let (e, _) = open(dir.path());
    e.create_task(new_task("s:a", "t1", "r1")).unwrap();
    let first = e.change_task(change("s:a", "t1", None, "half")).unwrap();
    assert_eq!((first.task.version, first.duplicate), (2, false));
    let lsn = e.stats().unwrap().last_lsn;
    for _ in 0..3 {
        let again = e.change_task(change("s:a", "t1", None, "half")).unwrap();
        assert_eq!((again.task.version, again.duplicate), (2, true));
    }
    let mut keep_message = change("s:a", "t1", None, "");
    keep_message.status_message = None;
    keep_message.ttl_ms = Some(60_000);
    let same = e.change_task(keep_message).unwrap();
    assert_eq!((same.task.version, same.duplicate), (2, true), "same TTL");
    assert_eq!(e.stats().unwrap().last_lsn, lsn, "nothing was written");
    let moved = e.change_task(change("s:a", "t1", None, "most")).unwrap();
    assert_eq!((moved.task.version, moved.duplicate), (3, false));
    let mut input = change("s:a", "t1", None, "most");
    input.status = TaskStatus::InputRequired;
    let input = e.change_task(input).unwrap();
    assert_eq!((input.task.version, input.duplicate), (4, false));
}
