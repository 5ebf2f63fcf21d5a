//! Catch-up by snapshot (issue 19 item 4): the leader snapshots and purges its log, a
//! follower's directory is wiped, and the restarted follower can only catch up from the
//! snapshot (the segment files, streamed): it then holds byte-identical events, continues
//! the log at the same LSNs (stream ids), and serves as leader.

#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use std::time::Duration;

use common::{batch, blocking, Cluster, SEGMENT_BYTES, WAIT};
use cursorlog_engine::{Engine, OpenStream};
use cursorlog_replication::snapshot;

/// Opens a stream in session "s" and appends `n` events of 1 KiB in batches of 10.
fn workload(e: &Engine, correlation: &str, n: u64) -> u64 {
    let s = e.open_session("s").unwrap();
    let st = e
        .open_stream(OpenStream {
            session: "s".into(),
            epoch: s.epoch,
            correlation: Some(correlation.into()),
            lease_ms: None,
        })
        .unwrap();
    let mut first = 1;
    while first <= n {
        let mut b = batch(st.stream, first, 10.min(n - first + 1));
        for ev in &mut b.events {
            ev.payload = vec![b'x'; 1024];
        }
        e.append(b).unwrap();
        first += 10;
    }
    st.stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_follower_catches_up_from_a_purged_leader_by_snapshot_and_then_leads() {
    let mut cluster = Cluster::start(SEGMENT_BYTES).await;
    let leader = cluster.leader(None).await;
    let engine = cluster.nodes[&leader].node.engine().clone();
    // About 300 KiB: several sealed 64 KiB segments.
    let first = blocking(&engine, |e| workload(e, "before", 300)).await;
    let views = cluster.agreed(leader).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");

    // The follower with the highest id (never the cluster's initializer) goes away and is
    // wiped; meanwhile the leader writes more, snapshots and purges its log.
    let wiped = cluster.highest_follower(leader);
    cluster.wipe(wiped).await;
    blocking(&engine, move |e| {
        e.append(batch(first, 301, 5)).unwrap();
    })
    .await;
    cluster.snapshot_and_purge(leader).await;
    let received_before = snapshot::bytes_received();

    // The wiped follower restarts: entries below the purge are no longer sent as entries,
    // so it is sent the snapshot, then the log after it.
    cluster.restart(wiped).await;
    let second = blocking(&engine, |e| workload(e, "after", 20)).await;
    let views = cluster.agreed(leader).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");
    assert!(views[0].contains("head: 305"), "{}", views[0]);
    assert!(
        snapshot::bytes_received() > received_before + 300 * 1024,
        "the follower was sent the segment files ({} bytes received)",
        snapshot::bytes_received() - received_before
    );
    assert!(snapshot::bytes_sent() >= snapshot::bytes_received());
    let wiped_log = cluster.nodes[&wiped]
        .node
        .engine()
        .entry_log()
        .unwrap()
        .clone();
    let leader_log = cluster.nodes[&leader]
        .node
        .engine()
        .entry_log()
        .unwrap()
        .clone();
    assert_eq!(wiped_log.next_lsn(), leader_log.next_lsn(), "same LSNs");

    // The caught-up member leads: its writes (stream ids predicted from its own log's
    // LSNs, checked by every member's apply) succeed and every member agrees.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let current = cluster.leader(None).await;
        if current == wiped {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{wiped} never led");
        let raft = cluster.nodes[&current].node.raft().clone();
        raft.trigger().transfer_leader(wiped).await.unwrap();
        let _ = raft
            .wait(Some(Duration::from_secs(5)))
            .metrics(|m| m.current_leader != Some(current), "leadership moves")
            .await;
    }
    let engine = cluster.nodes[&wiped].node.engine().clone();
    let third = blocking(&engine, move |e| {
        e.append(batch(second, 21, 3)).unwrap();
        workload(e, "on the caught-up leader", 5)
    })
    .await;
    assert!(third > second);
    let views = cluster.agreed(wiped).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");
    // Verdicts: every member's outcome for each correlation is the same stream.
    for (correlation, stream) in [("before", first), ("after", second)] {
        for r in cluster.nodes.values() {
            let got = blocking(r.node.engine(), move |e| {
                e.outcome("s", correlation).unwrap().map(|o| o.stream)
            })
            .await;
            assert_eq!(got, Some(stream), "{correlation}");
        }
    }
    cluster.stop().await;
}
