//! The task clocks on an injected clock (docs/TASKS-DESIGN.md §1.7): a running task fails
//! at its TTL deadline and not a millisecond before; an ended task's content goes a TTL
//! after its end and a late lookup hears "expired", then "unknown" past the horizon; a task
//! whose worker stops renewing its lease fails instead of staying `working` forever, also
//! across a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{
    Config, EndCause, Engine, Error, ManualClock, NewTask, OutcomeKind, TaskChange, TaskFinish,
    TaskOutcome, TaskRef, TaskStatus, TaskVerdict,
};

const T0: u64 = 1_800_000_000_000;

fn config(dir: &Path, clock: &Arc<ManualClock>) -> Config {
    let mut c = Config::new(dir);
    c.retention.check_interval = Duration::from_secs(3600);
    c.retention.metadata_horizon = Duration::from_secs(3600);
    c.background_expiry = false;
    c.clock = Arc::clone(clock) as _;
    c
}

fn task(task_id: &str, ttl_ms: u64, worker_lease_ms: Option<u64>) -> NewTask {
    NewTask {
        owner: "s:a".into(),
        task_id: task_id.into(),
        request_key: format!("req-{task_id}"),
        ttl_ms: Some(ttl_ms),
        poll_interval_ms: Some(100),
        worker_lease_ms,
        status_message: None,
        context: Vec::new(),
    }
}

fn view(e: &Engine, task_id: &str) -> cursorlog_engine::TaskView {
    e.task(&TaskRef::new("s:a", task_id), true).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_running_task_fails_at_its_ttl_deadline_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    e.create_task(task("t", 1_000, None)).unwrap();
    clock.advance(ms(999));
    assert_eq!(e.run_task_expiry().unwrap(), 0, "one millisecond early");
    assert_eq!(view(&e, "t").task.unwrap().status, TaskStatus::Working);
    clock.advance(ms(1));
    assert_eq!(e.run_task_expiry().unwrap(), 1);
    let v = view(&e, "t");
    let t = v.task.unwrap();
    assert_eq!(t.status, TaskStatus::Failed);
    assert_eq!(t.end_cause, Some(EndCause::TtlExpired));
    assert_eq!(t.ended_at_ms, Some(T0 + 1_000));
    let outcome = v.outcome.unwrap();
    assert_eq!(outcome.kind, OutcomeKind::Error);
    assert!(String::from_utf8(outcome.json).unwrap().contains("-32603"));
    assert_eq!(e.run_task_expiry().unwrap(), 0, "once");
}

#[test]
fn an_ended_task_expires_a_ttl_after_its_end_then_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    e.create_task(task("t", 1_000, None)).unwrap();
    clock.advance(ms(600));
    e.finish_task(TaskFinish {
        task: TaskRef::new("s:a", "t"),
        expected_version: None,
        status: TaskStatus::Completed,
        status_message: None,
        outcome: TaskOutcome {
            kind: OutcomeKind::Result,
            json: b"{}".to_vec(),
        },
    })
    .unwrap();
    clock.advance(ms(999));
    assert_eq!(
        e.run_task_expiry().unwrap(),
        0,
        "the TTL restarted at the end"
    );
    assert_eq!(view(&e, "t").verdict, TaskVerdict::Found);
    clock.advance(ms(1));
    assert_eq!(e.run_task_expiry().unwrap(), 1);
    let v = view(&e, "t");
    assert_eq!(v.verdict, TaskVerdict::Expired, "a late get hears why");
    assert_eq!(v.task.unwrap().status, TaskStatus::Completed);
    assert_eq!(v.outcome, None, "the content is gone");
    // Past the metadata horizon after the deletion the tombstone goes too.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(view(&e, "t").verdict, TaskVerdict::Unknown);
    e.run_retention().unwrap();
    let index_keys = e.index_dump().unwrap();
    assert!(
        !index_keys.iter().any(|(k, _)| k[0] == b'K'),
        "the forget pass removed the tombstone"
    );
    // The id is free again.
    e.create_task(task("t", 1_000, None)).unwrap();
}

#[test]
fn a_task_whose_worker_stops_renewing_fails_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    e.create_task(task("t", 60_000, Some(100))).unwrap();
    let t = TaskRef::new("s:a", "t");
    clock.advance(ms(80));
    e.keep_task_alive(&t).unwrap();
    clock.advance(ms(80));
    e.change_task(TaskChange {
        task: t.clone(),
        expected_version: None,
        status: TaskStatus::Working,
        status_message: Some("still here".into()),
        ttl_ms: None,
        poll_interval_ms: None,
    })
    .unwrap();
    clock.advance(ms(99));
    assert_eq!(
        e.run_task_expiry().unwrap(),
        0,
        "each renewal gave a full lease"
    );
    clock.advance(ms(1));
    assert_eq!(e.run_task_expiry().unwrap(), 1);
    let failed = view(&e, "t").task.unwrap();
    assert_eq!(failed.status, TaskStatus::Failed);
    assert_eq!(failed.end_cause, Some(EndCause::LeaseExpired));
    assert!(matches!(
        e.keep_task_alive(&t),
        Err(Error::TaskTerminated {
            status: TaskStatus::Failed,
            ..
        })
    ));
}

#[test]
fn after_a_restart_a_running_task_gets_a_whole_lease_then_fails() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    e.create_task(task("t", 60_000, Some(100))).unwrap();
    e.create_task(task("done", 60_000, Some(100))).unwrap();
    e.finish_task(TaskFinish {
        task: TaskRef::new("s:a", "done"),
        expected_version: None,
        status: TaskStatus::Cancelled,
        status_message: None,
        outcome: TaskOutcome::none(),
    })
    .unwrap();
    e.simulate_crash();
    drop(e);
    clock.advance(ms(500));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    assert_eq!(e.run_task_expiry().unwrap(), 0, "a worker may reconnect");
    clock.advance(ms(100));
    assert_eq!(
        e.run_task_expiry().unwrap(),
        1,
        "only the running task fails"
    );
    assert_eq!(
        view(&e, "t").task.unwrap().end_cause,
        Some(EndCause::LeaseExpired)
    );
    assert_eq!(view(&e, "done").task.unwrap().status, TaskStatus::Cancelled);
}
