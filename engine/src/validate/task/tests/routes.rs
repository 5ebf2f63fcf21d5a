//! The inbound route rules (docs/TASKS-DESIGN.md §1.6): a routed answer (an inbound message
//! with a correlation) needs its task's route open, so it routes once, whatever entries a
//! deposed leader or a retry left; carried-forward routes restate the routes exactly.

use super::{created, delete, refusal, task1, with_state};
use crate::index::{Index, TaskRead, Txn};
use crate::log::Position;
use crate::record::{Record, RouteEntry, TaskQueued, TaskRoutes, TaskSnapshot};
use crate::task::{TaskRemoval, INBOUND, OUTBOUND};
use crate::validate::Rejection;

/// A message on task `id`'s `channel` at `qseq`, with `correlation`.
fn message(id: u64, channel: u8, qseq: u64, correlation: &str) -> Record {
    Record::TaskQueued(TaskQueued {
        id,
        channel,
        qseq,
        max_len: 8,
        dedupe_key: None,
        correlation: Some(correlation.into()),
        message: b"{}".to_vec(),
        at_ms: 1_100,
    })
}

fn no_route(at: usize, id: u64, correlation: &str) -> Option<(usize, Rejection)> {
    Some((
        at,
        Rejection::TaskQueue {
            id,
            channel: INBOUND,
            why: format!("no open route for correlation {correlation:?}"),
        },
    ))
}

#[test]
fn a_routed_answer_needs_its_route_open() {
    let asked = [task1(), message(1, OUTBOUND, 1, "7")];
    let mut once = asked.to_vec();
    once.push(message(1, INBOUND, 1, "7"));
    assert_eq!(refusal(&once), None);
    // The same answer again (a duplicated entry, or a deposed leader's routing of it).
    let mut twice = once.clone();
    twice.push(message(1, INBOUND, 2, "7"));
    assert_eq!(refusal(&twice), no_route(3, 1, "7"));
    // Never asked.
    let mut unasked = asked.to_vec();
    unasked.push(message(1, INBOUND, 1, "8"));
    assert_eq!(refusal(&unasked), no_route(2, 1, "8"));
    // Another task of the owner cannot take the route, nor can another owner's task,
    // whose same correlation is a route of its own.
    let mut other = asked.to_vec();
    other.push(created(3, "s:a", "t2", "r2"));
    other.push(message(3, INBOUND, 1, "7"));
    assert_eq!(refusal(&other), no_route(3, 3, "7"));
    let mut owners = asked.to_vec();
    owners.push(created(3, "s:b", "t1", "r1"));
    owners.push(message(3, OUTBOUND, 1, "7"));
    owners.push(message(3, INBOUND, 1, "7"));
    owners.push(message(1, INBOUND, 1, "7"));
    assert_eq!(refusal(&owners), None);
    // An inbound message without a correlation is a plain enqueue: no route needed.
    let mut plain = vec![task1()];
    plain.push(Record::TaskQueued(TaskQueued {
        correlation: None,
        ..match message(1, INBOUND, 1, "x") {
            Record::TaskQueued(q) => q,
            _ => unreachable!("a queued record"),
        }
    }));
    assert_eq!(refusal(&plain), None);
}

#[test]
fn apply_opens_closes_and_deletion_drops_routes() {
    let history = [
        task1(),
        message(1, OUTBOUND, 1, "7"),
        message(1, OUTBOUND, 2, "8"),
        message(1, INBOUND, 1, "7"),
    ];
    with_state(&history, |refused, txn| {
        assert_eq!(refused, None);
        let routes = txn.task_routes(1, "s:a").expect("read");
        assert_eq!(
            routes,
            [
                RouteEntry {
                    correlation: "7".into(),
                    inbound_qseq: Some(1)
                },
                RouteEntry {
                    correlation: "8".into(),
                    inbound_qseq: None
                }
            ]
        );
        assert_eq!(txn.task_route("s:b", "8").expect("read"), None);
    });
    let mut deleted = history.to_vec();
    deleted.push(delete(TaskRemoval::Deleted, 1_500));
    with_state(&deleted, |refused, txn| {
        assert_eq!(refused, None);
        assert!(txn.task_routes(1, "s:a").expect("read").is_empty());
        assert_eq!(txn.task_route("s:a", "8").expect("read"), None);
    });
}

#[test]
fn carried_routes_must_restate_them() {
    let history = [
        task1(),
        message(1, OUTBOUND, 1, "7"),
        message(1, OUTBOUND, 2, "8"),
        message(1, INBOUND, 1, "7"),
    ];
    let (snapshot, routes) = with_state(&history, |_, txn| {
        let meta = txn.stored_task(1).expect("read").expect("task").meta;
        (
            Record::TaskSnapshot(TaskSnapshot {
                meta,
                outcome: txn.task_outcome(1).expect("read"),
                slots: txn.task_slots(1).expect("read"),
                queues: txn.task_queues(1).expect("read"),
            }),
            txn.task_routes(1, "s:a").expect("read"),
        )
    });
    let carried = |routes: Vec<RouteEntry>| Record::TaskRoutes(TaskRoutes { id: 1, routes });
    let mut ok = history.to_vec();
    ok.extend([snapshot.clone(), carried(routes.clone())]);
    assert_eq!(refusal(&ok), None);
    // A stale one would reopen the answered route "7".
    let mut reopened = routes.clone();
    reopened[0].inbound_qseq = None;
    let mut stale = history.to_vec();
    stale.extend([snapshot.clone(), carried(reopened)]);
    assert_eq!(
        refusal(&stale),
        Some((5, Rejection::StaleSnapshot("routes of task 1".into())))
    );
    // A rebuild from the snapshot on (the task's first records retired) applies without the
    // rules: the routes come back after the snapshot.
    let dir = tempfile::tempdir().expect("temp dir");
    let index = Index::open(&dir.path().join("index"), 1 << 20).expect("index");
    let mut txn = Txn::new(&index);
    for (lsn, r) in [(10, snapshot), (11, carried(routes.clone()))] {
        let pos = Position {
            segment: 2,
            offset: lsn * 100,
            len: 100,
        };
        crate::apply::apply(&mut txn, lsn, pos, &r, false).expect("apply");
    }
    assert_eq!(txn.task_routes(1, "s:a").expect("read"), routes);
}
