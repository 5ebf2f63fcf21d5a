//! One test per task rule (docs/TASKS-DESIGN.md §5.1): each builds the state, hands the
//! breaking record to `validate` and asserts the exact rejection; each fails if its rule is
//! removed. Apply's derived moves are checked on the state the records leave.

use crate::index::{Index, TaskRead, Txn};
use crate::log::Position;
use crate::record::{
    Record, TaskCancelRequested, TaskCreated, TaskDeleted, TaskDequeued, TaskEnded, TaskForgotten,
    TaskInputAnswered, TaskInputRequested, TaskQueued, TaskSnapshot, TaskUpdated,
};
use crate::task::{EndCause, OutcomeKind, SlotState, TaskOutcome, TaskRemoval, TaskStatus};
use crate::validate::{validate, Rejection};

mod routes;

/// Applies `records` from LSN 1 on, each validated first, and hands the first rejection
/// (its index and why) and the state the records before it left to `check`.
fn with_state<R>(
    records: &[Record],
    check: impl FnOnce(Option<(usize, Rejection)>, &Txn<'_>) -> R,
) -> R {
    let dir = tempfile::tempdir().expect("temp dir");
    let index = Index::open(&dir.path().join("index"), 1 << 20).expect("index");
    let mut txn = Txn::new(&index);
    let mut refused = None;
    for (i, r) in records.iter().enumerate() {
        let lsn = i as u64 + 1;
        if let Err(why) = validate(&txn, lsn, r).expect("index read") {
            refused = Some((i, why));
            break;
        }
        let pos = Position {
            segment: 1,
            offset: 80 + lsn * 100,
            len: 100,
        };
        crate::apply::apply(&mut txn, lsn, pos, r, false).expect("apply");
    }
    check(refused, &txn)
}

fn refusal(records: &[Record]) -> Option<(usize, Rejection)> {
    with_state(records, |r, _| r)
}

/// Task `t` of owner `o`, created at LSN `id` with request key `rk` and a 1 s TTL at 1000.
fn created(id: u64, owner: &str, task_id: &str, rk: &str) -> Record {
    Record::TaskCreated(TaskCreated {
        id,
        owner: owner.into(),
        task_id: task_id.into(),
        request_key: rk.into(),
        ttl_ms: Some(1_000),
        poll_interval_ms: 500,
        worker_lease_ms: Some(100),
        status_message: None,
        context: Vec::new(),
        at_ms: 1_000,
    })
}

fn task1() -> Record {
    created(1, "s:a", "t1", "r1")
}

fn update(version: u64, status: TaskStatus) -> Record {
    Record::TaskUpdated(TaskUpdated {
        id: 1,
        version,
        status,
        status_message: Some(format!("v{version}")),
        ttl_ms: None,
        poll_interval_ms: None,
        at_ms: 1_100,
    })
}

fn ask(version: u64, keys: &[&str]) -> Record {
    Record::TaskInputRequested(TaskInputRequested {
        id: 1,
        version,
        requests: keys.iter().map(|k| ((*k).into(), b"{}".to_vec())).collect(),
        status_message: None,
        at_ms: 1_100,
    })
}

fn answer(version: u64, keys: &[&str]) -> Record {
    Record::TaskInputAnswered(TaskInputAnswered {
        id: 1,
        version,
        responses: keys.iter().map(|k| ((*k).into(), b"1".to_vec())).collect(),
        at_ms: 1_200,
    })
}

fn cancel(version: u64) -> Record {
    Record::TaskCancelRequested(TaskCancelRequested {
        id: 1,
        version,
        at_ms: 1_200,
    })
}

fn end(version: u64, status: TaskStatus, cause: EndCause, at_ms: u64) -> Record {
    Record::TaskEnded(TaskEnded {
        id: 1,
        version,
        status,
        cause,
        status_message: None,
        outcome: TaskOutcome {
            kind: OutcomeKind::Result,
            json: b"{\"content\":[]}".to_vec(),
        },
        at_ms,
    })
}

fn delete(removal: TaskRemoval, at_ms: u64) -> Record {
    Record::TaskDeleted(TaskDeleted {
        id: 1,
        removal,
        at_ms,
    })
}

#[test]
fn a_well_formed_task_history_passes() {
    let history = [
        task1(),
        update(2, TaskStatus::Working),
        ask(3, &["a", "b"]),
        answer(4, &["a"]),
        answer(5, &["b"]),
        cancel(6),
        end(7, TaskStatus::Cancelled, EndCause::Client, 1_300),
        delete(TaskRemoval::Expired, 2_300),
        Record::TaskForgotten(TaskForgotten {
            id: 1,
            at_ms: 9_000,
        }),
    ];
    with_state(&history, |refused, txn| {
        assert_eq!(refused, None);
        assert_eq!(txn.stored_task(1).expect("read"), None);
        assert_eq!(txn.task_by_task_id("s:a", "t1").expect("read"), None);
    });
}

#[test]
fn created_id_must_be_lsn() {
    assert_eq!(
        refusal(&[created(5, "s:a", "t1", "r1")]),
        Some((0, Rejection::TaskIdNotLsn { id: 5, lsn: 1 }))
    );
}

#[test]
fn created_task_id_taken_by_owner() {
    assert_eq!(
        refusal(&[task1(), created(2, "s:a", "t1", "r2")]),
        Some((
            1,
            Rejection::TaskIdTaken {
                owner: "s:a".into(),
                task_id: "t1".into()
            }
        ))
    );
    // Another owner's task id is another task.
    assert_eq!(refusal(&[task1(), created(2, "s:b", "t1", "r1")]), None);
}

#[test]
fn created_request_key_taken() {
    assert_eq!(
        refusal(&[task1(), created(2, "s:a", "t2", "r1")]),
        Some((
            1,
            Rejection::TaskRequestTaken {
                owner: "s:a".into(),
                request_key: "r1".into()
            }
        ))
    );
}

#[test]
fn update_version_must_follow() {
    for version in [1, 3] {
        assert_eq!(
            refusal(&[task1(), update(version, TaskStatus::Working)]),
            Some((
                1,
                Rejection::TaskVersion {
                    id: 1,
                    version,
                    current: 1
                }
            )),
            "version {version}"
        );
    }
}

#[test]
fn update_after_terminal_refused() {
    assert_eq!(
        refusal(&[
            task1(),
            end(2, TaskStatus::Completed, EndCause::Client, 1_100),
            update(3, TaskStatus::Working),
        ]),
        Some((
            2,
            Rejection::TaskEnded {
                id: 1,
                status: TaskStatus::Completed
            }
        ))
    );
}

#[test]
fn update_illegal_move_refused() {
    // A terminal status only comes with its outcome, in `TaskEnded`.
    assert_eq!(
        refusal(&[task1(), update(2, TaskStatus::Failed)]),
        Some((
            1,
            Rejection::TaskMove {
                id: 1,
                from: TaskStatus::Working,
                to: TaskStatus::Failed
            }
        ))
    );
    // And `TaskEnded` only with a terminal one.
    assert_eq!(
        refusal(&[
            task1(),
            end(2, TaskStatus::Working, EndCause::Client, 1_100)
        ]),
        Some((
            1,
            Rejection::TaskMove {
                id: 1,
                from: TaskStatus::Working,
                to: TaskStatus::Working
            }
        ))
    );
}

/// The cancel-vs-complete race at the rule level: both planned against version 1, the one
/// applied second is refused, and the first one's status stays.
#[test]
fn ended_twice_refused() {
    let records = [
        task1(),
        end(2, TaskStatus::Completed, EndCause::Client, 1_100),
        end(2, TaskStatus::Cancelled, EndCause::Client, 1_100),
    ];
    with_state(&records, |refused, txn| {
        assert_eq!(
            refused,
            Some((
                2,
                Rejection::TaskEnded {
                    id: 1,
                    status: TaskStatus::Completed
                }
            ))
        );
        let t = txn.stored_task(1).expect("read").expect("task");
        assert_eq!(t.meta.status, TaskStatus::Completed);
        assert_eq!(t.meta.version, 2);
        assert_eq!(
            txn.task_outcome(1).expect("read"),
            b"{\"content\":[]}".to_vec()
        );
    });
}

#[test]
fn ttl_end_before_deadline_refused() {
    // Created at 1000 with a 1000 ms TTL: the deadline is 2000.
    assert_eq!(
        refusal(&[
            task1(),
            end(2, TaskStatus::Failed, EndCause::TtlExpired, 1_999)
        ]),
        Some((
            1,
            Rejection::TaskTimeNotUp {
                id: 1,
                at_ms: 1_999,
                deadline: Some(2_000)
            }
        ))
    );
}

#[test]
fn ttl_end_at_the_deadline_accepted() {
    assert_eq!(
        refusal(&[
            task1(),
            end(2, TaskStatus::Failed, EndCause::TtlExpired, 2_000)
        ]),
        None
    );
    // A TTL expiry is a failure, never a completion.
    assert!(matches!(
        refusal(&[
            task1(),
            end(2, TaskStatus::Completed, EndCause::TtlExpired, 2_000)
        ]),
        Some((1, Rejection::TaskTimeNotUp { .. }))
    ));
}

#[test]
fn lease_expiry_is_a_failure() {
    assert_eq!(
        refusal(&[
            task1(),
            end(2, TaskStatus::Completed, EndCause::LeaseExpired, 1_100)
        ]),
        Some((
            1,
            Rejection::TaskMove {
                id: 1,
                from: TaskStatus::Working,
                to: TaskStatus::Completed
            }
        ))
    );
}

#[test]
fn input_key_reuse_refused() {
    assert_eq!(
        refusal(&[task1(), ask(2, &["a"]), answer(3, &["a"]), ask(4, &["a"])]),
        Some((
            3,
            Rejection::TaskInputKeyUsed {
                id: 1,
                key: "a".into()
            }
        ))
    );
    assert_eq!(
        refusal(&[task1(), ask(2, &["a", "a"])]),
        Some((
            1,
            Rejection::TaskInputKeyUsed {
                id: 1,
                key: "a".into()
            }
        ))
    );
}

#[test]
fn answer_unknown_or_answered_key_refused() {
    for (records, key) in [
        (vec![task1(), ask(2, &["a"]), answer(3, &["z"])], "z"),
        (
            vec![
                task1(),
                ask(2, &["a", "b"]),
                answer(3, &["a"]),
                answer(4, &["a"]),
            ],
            "a",
        ),
    ] {
        let at = records.len() - 1;
        assert_eq!(
            refusal(&records),
            Some((
                at,
                Rejection::TaskInputNotOutstanding {
                    id: 1,
                    key: key.into()
                }
            ))
        );
    }
}

#[test]
fn last_answer_moves_to_working() {
    with_state(
        &[task1(), ask(2, &["a", "b"]), answer(3, &["a"])],
        |r, txn| {
            assert_eq!(r, None);
            let t = txn.stored_task(1).expect("read").expect("task");
            assert_eq!(t.meta.status, TaskStatus::InputRequired, "b is outstanding");
        },
    );
    with_state(
        &[
            task1(),
            ask(2, &["a", "b"]),
            answer(3, &["a"]),
            answer(4, &["b"]),
        ],
        |r, txn| {
            assert_eq!(r, None);
            let t = txn.stored_task(1).expect("read").expect("task");
            assert_eq!(t.meta.status, TaskStatus::Working);
            assert_eq!(t.meta.version, 4);
            let b = txn.task_slot(1, "b").expect("read").expect("slot");
            assert_eq!(b.state, SlotState::Answered);
            assert_eq!(b.response, Some(b"1".to_vec()));
        },
    );
}

#[test]
fn cancel_request_clears_slots() {
    with_state(&[task1(), ask(2, &["a"]), cancel(3)], |r, txn| {
        assert_eq!(r, None);
        let t = txn.stored_task(1).expect("read").expect("task");
        assert!(t.meta.cancel_requested);
        assert_eq!(t.meta.status, TaskStatus::Working);
        let a = txn.task_slot(1, "a").expect("read").expect("slot");
        assert_eq!(a.state, SlotState::Dropped);
    });
}

#[test]
fn cancel_request_twice_refused() {
    assert_eq!(
        refusal(&[task1(), cancel(2), cancel(3)]),
        Some((2, Rejection::TaskCancelRequested(1)))
    );
}

#[test]
fn delete_expired_before_ended_plus_ttl_refused() {
    // Ended at 1500: it may be deleted as expired from 2500 on, and never while running.
    let ended = end(2, TaskStatus::Completed, EndCause::Client, 1_500);
    assert_eq!(
        refusal(&[task1(), ended.clone(), delete(TaskRemoval::Expired, 2_499)]),
        Some((
            2,
            Rejection::TaskTimeNotUp {
                id: 1,
                at_ms: 2_499,
                deadline: Some(2_500)
            }
        ))
    );
    assert_eq!(
        refusal(&[task1(), ended, delete(TaskRemoval::Expired, 2_500)]),
        None
    );
    assert_eq!(
        refusal(&[task1(), delete(TaskRemoval::Expired, 9_999)]),
        Some((
            1,
            Rejection::TaskTimeNotUp {
                id: 1,
                at_ms: 9_999,
                deadline: None
            }
        ))
    );
}

#[test]
fn forget_before_delete_refused() {
    assert_eq!(
        refusal(&[
            task1(),
            Record::TaskForgotten(TaskForgotten { id: 1, at_ms: 5 })
        ]),
        Some((1, Rejection::TaskNotDeleted(1)))
    );
}

#[test]
fn records_on_deleted_task_refused() {
    let gone = [task1(), delete(TaskRemoval::Deleted, 1_100)];
    for (late, why) in [
        (update(2, TaskStatus::Working), Rejection::TaskDeleted(1)),
        (cancel(2), Rejection::TaskDeleted(1)),
        (
            end(2, TaskStatus::Failed, EndCause::Client, 1_200),
            Rejection::TaskDeleted(1),
        ),
        (
            delete(TaskRemoval::Deleted, 1_300),
            Rejection::TaskDeleted(1),
        ),
    ] {
        let mut records = gone.to_vec();
        records.push(late);
        assert_eq!(refusal(&records), Some((2, why)));
    }
    // The tombstone keeps the task id taken; the request key is free again.
    with_state(&gone, |_, txn| {
        let t = txn.stored_task(1).expect("read").expect("tombstone");
        assert_eq!(t.meta.removal, Some(TaskRemoval::Deleted));
        assert_eq!(txn.task_by_task_id("s:a", "t1").expect("read"), Some(1));
        assert_eq!(txn.task_by_request_key("s:a", "r1").expect("read"), None);
        assert_eq!(txn.owner_task_count("s:a").expect("read"), 0);
    });
}

#[test]
fn task_snapshot_must_restate() {
    let history = [task1(), ask(2, &["a"])];
    let snapshot = |status| {
        with_state(&history, |_, txn| {
            let mut meta = txn.stored_task(1).expect("read").expect("task").meta;
            meta.status = status;
            Record::TaskSnapshot(TaskSnapshot {
                meta,
                outcome: txn.task_outcome(1).expect("read"),
                slots: txn.task_slots(1).expect("read"),
                queues: txn.task_queues(1).expect("read"),
            })
        })
    };
    let mut ok = history.to_vec();
    ok.push(snapshot(TaskStatus::InputRequired));
    assert_eq!(refusal(&ok), None);
    let mut stale = history.to_vec();
    stale.push(snapshot(TaskStatus::Working));
    assert_eq!(
        refusal(&stale),
        Some((2, Rejection::StaleSnapshot("task 1".into())))
    );
}

fn queued(qseq: u64, max_len: u32, dedupe: Option<&str>) -> Record {
    Record::TaskQueued(TaskQueued {
        id: 1,
        channel: 0,
        qseq,
        max_len,
        dedupe_key: dedupe.map(Into::into),
        correlation: None,
        message: vec![b'm'; 10],
        at_ms: 1_100,
    })
}

fn dequeued(through_qseq: u64, token: &str) -> Record {
    Record::TaskDequeued(TaskDequeued {
        id: 1,
        channel: 0,
        through_qseq,
        token: token.into(),
        at_ms: 1_100,
    })
}

fn queue_refusal(records: &[Record]) -> Option<(usize, String)> {
    refusal(records).map(|(i, why)| match why {
        Rejection::TaskQueue { why, .. } => (i, why),
        other => panic!("not a queue refusal: {other}"),
    })
}

#[test]
fn queue_seq_must_follow() {
    let (at, why) = queue_refusal(&[task1(), queued(1, 8, None), queued(3, 8, None)]).unwrap();
    assert_eq!(at, 2);
    assert!(why.contains("qseq 3 does not follow 1"), "{why}");
    assert_eq!(
        refusal(&[task1(), queued(1, 8, None), queued(2, 8, None)]),
        None
    );
}

#[test]
fn queue_over_max_len_refused() {
    let (at, why) = queue_refusal(&[task1(), queued(1, 1, None), queued(2, 1, None)]).unwrap();
    assert_eq!(at, 2);
    assert!(why.contains("full"), "{why}");
    // A dequeue makes room.
    assert_eq!(
        refusal(&[
            task1(),
            queued(1, 1, None),
            dequeued(1, "a"),
            queued(2, 1, None)
        ]),
        None
    );
}

#[test]
fn queue_dedupe_key_in_use_refused() {
    let (at, why) =
        queue_refusal(&[task1(), queued(1, 8, Some("k")), queued(2, 8, Some("k"))]).unwrap();
    assert_eq!(at, 2);
    assert!(why.contains("dedupe"), "{why}");
    // Once dequeued, the key is free.
    assert_eq!(
        refusal(&[
            task1(),
            queued(1, 8, Some("k")),
            dequeued(1, "a"),
            queued(2, 8, Some("k"))
        ]),
        None
    );
}

#[test]
fn dequeue_past_tail_refused() {
    let (at, why) = queue_refusal(&[task1(), queued(1, 8, None), dequeued(2, "a")]).unwrap();
    assert_eq!(at, 2);
    assert!(why.contains("outside"), "{why}");
}

#[test]
fn dequeue_twice_refused() {
    let (at, why) = queue_refusal(&[
        task1(),
        queued(1, 8, None),
        dequeued(1, "a"),
        dequeued(1, "b"),
    ])
    .unwrap();
    assert_eq!(at, 3);
    assert!(why.contains("outside"), "{why}");
}

#[test]
fn a_dequeue_keeps_its_batch_and_moves_the_head() {
    let history = [
        task1(),
        queued(1, 8, Some("k1")),
        queued(2, 8, None),
        queued(3, 8, None),
        dequeued(2, "tok"),
    ];
    with_state(&history, |r, txn| {
        assert_eq!(r, None);
        let q = txn.queue_state(1, 0).expect("read");
        assert_eq!((q.head, q.tail, q.bytes), (2, 3, 10));
        assert_eq!(q.last_token.as_deref(), Some("tok"));
        let batch: Vec<u64> = txn
            .last_batch(1, 0)
            .expect("read")
            .iter()
            .map(|m| m.qseq)
            .collect();
        assert_eq!(batch, [1, 2]);
        let left: Vec<u64> = txn
            .queued_messages(1, 0)
            .expect("read")
            .iter()
            .map(|m| m.qseq)
            .collect();
        assert_eq!(left, [3]);
        assert_eq!(txn.deduped(1, 0, "k1").expect("read"), None);
    });
}

#[test]
fn queue_records_on_deleted_task_refused() {
    assert_eq!(
        refusal(&[
            task1(),
            delete(TaskRemoval::Deleted, 1_100),
            queued(1, 8, None)
        ]),
        Some((2, Rejection::TaskDeleted(1)))
    );
}
