//! Retention on a cluster (issue 19 item 4, "retention purges only what a snapshot
//! covers"): the leader evicts by total size and carries state forward through entries,
//! every member unlinks the dead segments its snapshot covers, and the shortened logs
//! still rebuild the same state: after a member's restart, and on a wiped member that
//! catches up from a snapshot of a log that no longer starts at entry 1.

#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{blocking, Cluster, SEGMENT_BYTES, WAIT};
use cursorlog_engine::{Engine, NewEvent, OpenStream};

/// The members' log size bound.
const MAX_BYTES: u64 = 4 * SEGMENT_BYTES;

/// Opens session `session`, a stream in it, appends `n` events of 1 KiB in batches of 10,
/// and completes it if `complete`. Returns the stream.
fn workload(e: &Engine, session: &str, n: u64, complete: bool) -> u64 {
    let s = e.open_session(session).unwrap();
    let st = e
        .open_stream(OpenStream {
            session: session.into(),
            epoch: s.epoch,
            correlation: Some(format!("{session}-req")),
            lease_ms: None,
        })
        .unwrap();
    let mut first = 1;
    while first <= n {
        let mut b = common::batch(st.stream, first, 10.min(n - first + 1));
        b.session = session.into();
        for ev in &mut b.events {
            ev.payload = vec![b'x'; 1024];
        }
        e.append(b).unwrap();
        first += 10;
    }
    if complete {
        e.complete(
            session,
            st.stream,
            Some(n + 1),
            NewEvent::new("result", b"done".to_vec()),
        )
        .unwrap();
    }
    st.stream
}

/// Each member's segment bytes.
fn sizes(cluster: &Cluster) -> Vec<u64> {
    cluster.dirs.values().map(|d| log_bytes(d.path())).collect()
}

/// The bytes of a member's segment files. A segment retired while the directory is listed
/// (retention runs meanwhile) counts as gone.
fn log_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .map(|p| match std::fs::metadata(&p) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => panic!("{}: {e}", p.display()),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_retire_what_their_snapshots_cover_and_still_agree_after_restart_and_catch_up() {
    let mut cluster = Cluster::start_with(SEGMENT_BYTES, |c| {
        c.retention.max_total_bytes = Some(MAX_BYTES);
    })
    .await;
    let leader = cluster.leader(None).await;
    let engine = cluster.nodes[&leader].node.engine().clone();
    // About 1.2 MiB of finished streams, then a live one: far over the bound.
    blocking(&engine, |e| {
        for i in 0..6 {
            workload(e, &format!("old-{i}"), 200, true);
        }
        workload(e, "live", 50, false);
    })
    .await;
    let grown = sizes(&cluster);
    assert!(grown.iter().all(|b| *b > 3 * MAX_BYTES), "{grown:?}");

    // The leader's pass raises watermarks and carries state forward, as entries.
    blocking(&engine, |e| e.run_retention().unwrap()).await;
    let agreed = cluster.agreed(leader).await;
    assert!(agreed.iter().all(|v| v == &agreed[0]), "{agreed:#?}");
    // Each member snapshots and purges its log, then retires its dead segments.
    for id in cluster.nodes.keys().copied().collect::<Vec<_>>() {
        cluster.snapshot_and_purge(id).await;
        let member = cluster.nodes[&id].node.engine().clone();
        let retired = blocking(&member, |e| e.run_retention().unwrap()).await;
        assert!(retired > 0, "member {id} retired no segment");
    }
    let bounded = sizes(&cluster);
    // The bound, plus the segment being written and the one the carried state went to.
    assert!(
        bounded.iter().all(|b| *b <= MAX_BYTES + 2 * SEGMENT_BYTES),
        "before {grown:?}, after {bounded:?}"
    );
    let served = cluster.agreed(leader).await;
    assert!(served.iter().all(|v| v == &served[0]), "{served:#?}");
    assert!(served[0].contains("session: \"live\""), "{}", served[0]);

    // A follower restarts over its shortened log, and one is wiped: it can only catch up
    // from a snapshot whose files start after entry 1.
    let restarted = cluster.highest_follower(leader);
    cluster.nodes.remove(&restarted).unwrap().stop().await;
    cluster.restart(restarted).await;
    let wiped = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader && **id != restarted)
        .unwrap();
    cluster.wipe(wiped).await;
    cluster.restart(wiped).await;
    blocking(&engine, |e| workload(e, "after", 20, true)).await;
    let views = cluster.agreed(leader).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");
    assert!(views[0].contains("session: \"after\""), "{}", views[0]);
    let first_entry = cluster.nodes[&wiped]
        .node
        .engine()
        .entry_log()
        .unwrap()
        .first_entry()
        .unwrap();
    assert!(first_entry > 1, "the wiped member got the shortened log");
    cluster.stop().await;
}

/// The members' disk reserve, read at each start ([`Cluster::start_with`] takes a plain fn).
static RESERVE: AtomicU64 = AtomicU64::new(0);

/// Short of disk space, appends stop, so no snapshot would come by entry count: the member
/// snapshots and purges at once, and retention (every tick while space is short) deletes
/// the dead segments. Without it the logs stayed over the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_short_of_disk_snapshot_and_purge_so_retention_frees_space() {
    let mut cluster = Cluster::start_with(SEGMENT_BYTES, |c| {
        c.retention.max_total_bytes = Some(MAX_BYTES);
        c.disk_reserve_bytes = RESERVE.load(Ordering::Acquire);
    })
    .await;
    let leader = cluster.leader(None).await;
    let engine = cluster.nodes[&leader].node.engine().clone();
    blocking(&engine, |e| {
        for i in 0..6 {
            workload(e, &format!("old-{i}"), 200, true);
        }
    })
    .await;
    cluster.agreed(leader).await;
    drop(engine);
    // Every member comes back with a reserve no disk has: short of space from the start.
    RESERVE.store(u64::MAX, Ordering::Release);
    for id in cluster.nodes.keys().copied().collect::<Vec<_>>() {
        cluster.nodes.remove(&id).unwrap().stop().await;
        cluster.restart(id).await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let sizes = sizes(&cluster);
        if sizes.iter().all(|b| *b <= MAX_BYTES + 2 * SEGMENT_BYTES) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the logs stayed at {sizes:?} bytes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = cluster.leader(None).await;
    let refused = blocking(cluster.nodes[&leader].node.engine(), |e| {
        e.open_session("late").map(|_| ())
    })
    .await;
    assert!(refused.is_err(), "still short of space: writes are refused");
    cluster.stop().await;
}
