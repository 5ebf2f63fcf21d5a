//! A task's message queues (the 2025 `TaskMessageQueue`, docs/TASKS-DESIGN.md §1.6): FIFO,
//! bounded by the enqueuer's `max_len` with a clear error, a dequeue that never waits, a
//! retried dequeue that gets the same batch, a retried enqueue that is a no-op, and queues
//! that survive a crash and the retirement of the segments they were written in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use cursorlog_engine::{
    Append, Config, Engine, Error, NewEvent, NewTask, OpenStream, TaskDequeue, TaskEnqueue,
    TaskRef, TaskVerdict, OUTBOUND,
};

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.retention.check_interval = Duration::from_secs(3600);
    c.background_expiry = false;
    c
}

fn create(e: &Engine, task_id: &str) -> TaskRef {
    e.create_task(NewTask {
        owner: "s:a".into(),
        task_id: task_id.into(),
        request_key: format!("r-{task_id}"),
        ttl_ms: None,
        poll_interval_ms: None,
        worker_lease_ms: None,
        status_message: None,
        context: Vec::new(),
    })
    .unwrap();
    TaskRef::new("s:a", task_id)
}

fn enqueue(task: &TaskRef, text: &str, max_len: u32, dedupe: Option<&str>) -> TaskEnqueue {
    TaskEnqueue {
        task: task.clone(),
        channel: OUTBOUND,
        message: text.as_bytes().to_vec(),
        max_len,
        dedupe_key: dedupe.map(Into::into),
        correlation: None,
    }
}

fn dequeue(task: &TaskRef, max_messages: u32, token: &str) -> TaskDequeue {
    TaskDequeue {
        task: task.clone(),
        channel: OUTBOUND,
        max_messages,
        token: token.into(),
    }
}

fn texts(d: &cursorlog_engine::TaskDequeued) -> Vec<String> {
    d.messages
        .iter()
        .map(|m| String::from_utf8(m.message.clone()).unwrap())
        .collect()
}

#[test]
fn messages_come_out_in_order_and_a_full_queue_refuses_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let t = create(&e, "t");
    for (i, text) in ["a", "b", "c"].into_iter().enumerate() {
        let q = e.enqueue_task_message(enqueue(&t, text, 3, None)).unwrap();
        assert_eq!(q.qseq, i as u64 + 1);
    }
    let full = e
        .enqueue_task_message(enqueue(&t, "d", 3, None))
        .unwrap_err();
    assert!(
        matches!(
            full,
            Error::TaskQueueFull {
                queued: 4,
                max: 3,
                ..
            }
        ),
        "{full}"
    );
    assert!(full.to_string().contains("dequeue first"), "{full}");
    let view = e.task(&t, false).unwrap();
    assert_eq!(view.outbound_queued, 3);
    assert_eq!(
        texts(&e.dequeue_task_messages(dequeue(&t, 1, "x1")).unwrap()),
        ["a"]
    );
    assert_eq!(
        texts(&e.dequeue_task_messages(dequeue(&t, 0, "x2")).unwrap()),
        ["b", "c"]
    );
    // Empty: answered at once, nothing written.
    let before = e.stats().unwrap().last_lsn;
    let empty = e.dequeue_task_messages(dequeue(&t, 0, "x3")).unwrap();
    assert!(empty.messages.is_empty());
    assert_eq!(e.stats().unwrap().last_lsn, before);
    // Another owner has no such queue.
    let theirs = TaskRef::new("s:b", "t");
    assert!(matches!(
        e.enqueue_task_message(enqueue(&theirs, "z", 3, None)),
        Err(Error::UnknownTask { .. })
    ));
    assert!(matches!(
        e.dequeue_task_messages(dequeue(&theirs, 0, "z")),
        Err(Error::UnknownTask { .. })
    ));
}

#[test]
fn retries_neither_lose_nor_repeat_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let t = create(&e, "t");
    let first = e
        .enqueue_task_message(enqueue(&t, "a", 0, Some("k1")))
        .unwrap();
    let retry = e
        .enqueue_task_message(enqueue(&t, "a", 0, Some("k1")))
        .unwrap();
    assert!(retry.duplicate);
    assert_eq!(retry.qseq, first.qseq);
    e.enqueue_task_message(enqueue(&t, "b", 0, Some("k2")))
        .unwrap();
    let taken = e.dequeue_task_messages(dequeue(&t, 1, "tok")).unwrap();
    assert_eq!(texts(&taken), ["a"]);
    // The caller did not hear the answer and asks again with the same token.
    let again = e.dequeue_task_messages(dequeue(&t, 1, "tok")).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.messages, taken.messages);
    assert_eq!(
        texts(&e.dequeue_task_messages(dequeue(&t, 1, "tok2")).unwrap()),
        ["b"]
    );
}

#[test]
fn queues_survive_a_crash_retention_and_a_rebuild_and_go_with_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let kept = create(&e, "kept");
    let gone = create(&e, "gone");
    for i in 0..5 {
        e.enqueue_task_message(enqueue(&kept, &format!("m{i}"), 0, Some(&format!("d{i}"))))
            .unwrap();
        e.enqueue_task_message(enqueue(&gone, "x", 0, None))
            .unwrap();
    }
    e.dequeue_task_messages(dequeue(&kept, 2, "tok")).unwrap();
    e.delete_task(gone.clone()).unwrap();
    assert_eq!(e.task(&gone, false).unwrap().verdict, TaskVerdict::Deleted);
    // Retire the segments the queues were written in.
    let s = e.open_session("filler").unwrap();
    let stream = e
        .open_stream(OpenStream {
            session: "filler".into(),
            epoch: s.epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream;
    for _ in 0..40 {
        e.append(Append {
            session: "filler".into(),
            stream,
            expected_next_seq: None,
            events: vec![NewEvent::new("p", vec![7u8; 200])],
        })
        .unwrap();
    }
    e.trim("filler", stream, u64::MAX).unwrap();
    assert!(e.run_retention().unwrap() >= 2);
    e.simulate_crash();
    drop(e);
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(e.recovery_report().index_rebuilt);
    // The retry of the last dequeue still gets its batch; the rest come in order.
    let again = e.dequeue_task_messages(dequeue(&kept, 2, "tok")).unwrap();
    assert!(again.duplicate);
    assert_eq!(texts(&again), ["m0", "m1"]);
    assert_eq!(
        texts(&e.dequeue_task_messages(dequeue(&kept, 0, "tok2")).unwrap()),
        ["m2", "m3", "m4"]
    );
    // The deleted task's queue went with its content, through all of it.
    let gone_id = e.task(&gone, false).unwrap().task.unwrap().id;
    assert!(e.dump_has_no_queue_of(gone_id));
}

/// Test-only view of the index: no queue key of the engine id `id` is left.
trait QueueKeys {
    fn dump_has_no_queue_of(&self, id: u64) -> bool;
}

impl QueueKeys for Engine {
    fn dump_has_no_queue_of(&self, id: u64) -> bool {
        !self
            .index_dump()
            .unwrap()
            .iter()
            .any(|(k, _)| b"JQBU".contains(&k[0]) && k.get(1..9) == Some(&id.to_be_bytes()[..]))
    }
}
