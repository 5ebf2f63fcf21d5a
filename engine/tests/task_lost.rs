//! Tasks after the log lost acknowledged writes (FORMAT.md invariant 5; `lost.rs`): the
//! index remembers changes the rebuilt log no longer holds. A task that lost a change never
//! goes back to an earlier version or status a client already saw past: it fails (cause
//! `fenced`) at a version past every one the lost index knew, so a watch of the last version
//! seen hears the end; a task that had ended never comes back running, nor ends again with a
//! result; and the id of a task whose creation was lost (its creation's LSN) is never given
//! to a new task. After a power loss that followed a non-durable run, every running task
//! fails, since nobody knows which of its acknowledged changes survived.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{
    Config, EndCause, Engine, ManualClock, NewTask, OutcomeKind, SyncPolicy, TaskChange,
    TaskFinish, TaskMeta, TaskOutcome, TaskRef, TaskStatus, TaskVerdict,
};

const T0: u64 = 1_800_000_000_000;
const OWNER: &str = "s:alice";

fn config(dir: &Path, clock: &Arc<ManualClock>) -> Config {
    let mut c = Config::new(dir);
    c.sync = SyncPolicy::Always;
    c.segment_bytes_max = 1 << 20;
    c.retention.max_age = None;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c.background_expiry = false;
    c.disk_reserve_bytes = 0;
    c.clock = Arc::clone(clock) as _;
    c
}

fn create(e: &Engine, task_id: &str) -> TaskMeta {
    e.create_task(NewTask {
        owner: OWNER.into(),
        task_id: task_id.into(),
        request_key: format!("rk-{task_id}"),
        ttl_ms: Some(3_600_000),
        poll_interval_ms: None,
        worker_lease_ms: None,
        status_message: None,
        context: Vec::new(),
    })
    .unwrap()
    .task
}

fn change(e: &Engine, task_id: &str, message: &str) -> u64 {
    e.change_task(TaskChange {
        task: TaskRef::new(OWNER, task_id),
        expected_version: None,
        status: TaskStatus::Working,
        status_message: Some(message.into()),
        ttl_ms: None,
        poll_interval_ms: None,
    })
    .unwrap()
    .task
    .version
}

fn complete(e: &Engine, task_id: &str) -> u64 {
    e.finish_task(TaskFinish {
        task: TaskRef::new(OWNER, task_id),
        expected_version: None,
        status: TaskStatus::Completed,
        status_message: None,
        outcome: TaskOutcome {
            kind: OutcomeKind::Result,
            json: b"{\"content\":[]}".to_vec(),
        },
    })
    .unwrap()
    .task
    .version
}

fn task(e: &Engine, task_id: &str) -> Option<TaskMeta> {
    e.task(&TaskRef::new(OWNER, task_id), false).unwrap().task
}

fn the_segment(dir: &Path) -> PathBuf {
    let segs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    assert_eq!(segs.len(), 1, "the test writes one segment: {segs:?}");
    segs.into_iter().next().unwrap()
}

#[test]
fn tasks_that_lost_acknowledged_changes_fail_past_every_version_seen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    // Kept by the disk: "a" at version 2, "b" at 1, "c" completed.
    create(&e, "a");
    assert_eq!(change(&e, "a", "step 1"), 2);
    create(&e, "b");
    create(&e, "c");
    assert_eq!(complete(&e, "c"), 2);
    let seg = the_segment(dir.path());
    let keep = std::fs::metadata(&seg).unwrap().len();
    // Acknowledged (fsynced) after the point the disk will lose:
    for step in 2..=4 {
        change(&e, "a", &format!("step {step}"));
    }
    let a_seen = task(&e, "a").unwrap().version;
    assert_eq!(a_seen, 5);
    assert_eq!(complete(&e, "b"), 2);
    // Tasks born and ended in the lost records: their ids (LSNs) go with them, and the
    // fencing's own records do not reach past them.
    for i in 0..4 {
        create(&e, &format!("e{i}"));
        complete(&e, &format!("e{i}"));
    }
    let d = create(&e, "d");
    change(&e, "d", "d runs");
    e.close().unwrap(); // the index is flushed: it has applied all of the above
    drop(e);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(keep)
        .unwrap();

    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let report = e.recovery_report().clone();
    assert!(report.lost_records >= 14, "{report}");
    assert_eq!(report.tasks_fenced, 2, "{report}");

    // "a" lost versions 3..=5: it fails at 6, never serves 3, 4 or 5 again, and a watch of
    // the last version a client saw (5) hears the end.
    let a = task(&e, "a").unwrap();
    assert_eq!(
        (a.status, a.end_cause, a.version),
        (TaskStatus::Failed, Some(EndCause::Fenced), a_seen + 1),
        "{a:?}"
    );
    let mut watch = e.watch_task(&TaskRef::new(OWNER, "a"), a_seen).unwrap();
    let seen = watch
        .poll()
        .unwrap()
        .expect("the end is news past version 5");
    assert_eq!(seen.task.unwrap().status, TaskStatus::Failed);
    drop(watch); // it holds the engine's state (and its index) open
    let outcome = e
        .task(&TaskRef::new(OWNER, "a"), true)
        .unwrap()
        .outcome
        .unwrap();
    assert_eq!(outcome.kind, OutcomeKind::Error);

    // "b" had completed (version 2) in the lost records: it never runs again, and it never
    // completes again with a result nobody kept; it fails past version 2.
    let b = task(&e, "b").unwrap();
    assert_eq!(
        (b.status, b.end_cause, b.version),
        (TaskStatus::Failed, Some(EndCause::Fenced), 3),
        "{b:?}"
    );

    // "c" ended before the loss: untouched.
    let c = task(&e, "c").unwrap();
    assert_eq!(
        (c.status, c.end_cause, c.version),
        (TaskStatus::Completed, Some(EndCause::Client), 2)
    );

    // "d" (and "e0".."e3") were created in the lost records: unknown now, and their ids
    // (their creations' LSNs) are never given to another task.
    assert_eq!(
        e.task(&TaskRef::new(OWNER, "d"), false).unwrap().verdict,
        TaskVerdict::Unknown
    );
    for i in 0..4 {
        let fresh = create(&e, &format!("new-{i}"));
        assert!(
            fresh.id > d.id,
            "task id {} issued again (task d had it before the loss)",
            fresh.id
        );
    }
    let again = create(&e, "d");
    assert!(again.id > d.id, "{again:?}");
    e.close().unwrap();
    drop(e);

    // The fencing is durable and a plain restart fences nothing more.
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    assert_eq!(e.recovery_report().tasks_fenced, 0);
    assert!(!e.recovery_report().index_rebuilt);
    assert_eq!(task(&e, "a").unwrap().version, a_seen + 1);
    assert_eq!(task(&e, "b").unwrap().status, TaskStatus::Failed);
}

/// FORMAT.md invariant 8 for tasks: after a power loss that followed an unclean run under
/// a non-durable sync policy (`interval`, `never`), changes acknowledged before their sync
/// may be gone, and nobody knows which: every running task fails (cause `fenced`), as every
/// open stream ends. A task whose completion was lost does not run on; one that ended
/// durably is untouched; creations are synced under every policy, so every task is still
/// there. A restart on the same boot (the page cache kept everything) fences nothing.
#[test]
fn a_power_loss_after_a_non_durable_run_fails_every_running_task() {
    for sync in [SyncPolicy::Interval(3_600_000), SyncPolicy::Never] {
        for power_loss in [true, false] {
            let fs = cursorlog_engine::FaultyFs::new(11);
            let dir = tempfile::tempdir().unwrap();
            let clock = Arc::new(ManualClock::new(T0));
            let open = || {
                let mut c = config(dir.path(), &clock);
                c.sync = sync;
                Engine::open_with_fs(c, Arc::new(fs.clone())).unwrap()
            };
            let e = open();
            create(&e, "done");
            complete(&e, "done");
            create(&e, "a");
            create(&e, "b");
            e.sync().unwrap();
            // Acknowledged, not synced: lost at the power cut.
            assert_eq!(change(&e, "a", "step 1"), 2);
            assert_eq!(complete(&e, "b"), 2);
            e.simulate_crash();
            drop(e);
            if power_loss {
                fs.crash(false);
                fs.revive();
            }
            let e = open();
            let report = e.recovery_report().clone();
            let meta = |id: &str| {
                let t = task(&e, id).unwrap();
                (t.status, t.end_cause)
            };
            let fenced = (TaskStatus::Failed, Some(EndCause::Fenced));
            let done = (TaskStatus::Completed, Some(EndCause::Client));
            if power_loss {
                assert_eq!(report.tasks_fenced, 2, "{sync:?}: {report}");
                assert_eq!(meta("a"), fenced, "{sync:?}");
                assert_eq!(meta("b"), fenced, "{sync:?}: its completion was lost");
                assert_eq!(task(&e, "a").unwrap().version, 2, "{sync:?}");
            } else {
                assert_eq!(report.tasks_fenced, 0, "{sync:?}: {report}");
                assert_eq!(meta("a"), (TaskStatus::Working, None), "{sync:?}");
                assert_eq!(meta("b"), done, "{sync:?}");
            }
            assert_eq!(meta("done"), done, "{sync:?}");
            e.close().unwrap();
        }
    }
}
