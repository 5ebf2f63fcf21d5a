//! Catch-up time of a wiped member, per GiB (issue 19 item 8; benches/HISTORY.md "Catch-up of
//! a wiped member"): by entries (the leader's log whole, AppendEntries batches) and by
//! snapshot (the leader purged: the segment files streamed). Ignored: run in release,
//! `CURSORLOG_CATCHUP_MB` sets the volume (default 256):
//!
//! ```text
//! CURSORLOG_CATCHUP_MB=1024 cargo test --release -p cursorlog-replication \
//!     --test snapshot_bench -- --ignored --nocapture
//! ```

#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
mod common;

use std::time::{Duration, Instant};

use common::{batch, blocking, Cluster};
use cursorlog_engine::OpenStream;
use cursorlog_replication::{snapshot, ReplicatedNode};

/// 8 MiB segments (the default 64 MiB would make a small run one segment).
const SEGMENT_BYTES: u64 = 8 * 1024 * 1024;

/// Waits until `node` applied what `target` says, returning how long it took.
async fn caught_up(node: &ReplicatedNode, target: Option<u64>, started: Instant) -> Duration {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
    while node.status().last_applied < target {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no catch-up in an hour"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement: run in release with --ignored --nocapture"]
async fn catch_up_of_a_wiped_member_per_gib() {
    let mb: u64 = std::env::var("CURSORLOG_CATCHUP_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let mut cluster = Cluster::start(SEGMENT_BYTES).await;
    let leader = cluster.leader(None).await;
    let engine = cluster.nodes[&leader].node.engine().clone();
    // 1 KiB events, 64 per append (64 KiB a request and an entry: openraft's batch of 300
    // entries stays under the transport's 64 MiB message limit; 256 KiB entries exceed it
    // and catch-up by entries stalls, see benches/HISTORY.md).
    let appends = mb * 16;
    let wrote = Instant::now();
    blocking(&engine, move |e| {
        let s = e.open_session("s").unwrap();
        let st = e
            .open_stream(OpenStream {
                session: "s".into(),
                epoch: s.epoch,
                correlation: None,
                lease_ms: None,
            })
            .unwrap();
        for i in 0..appends {
            let mut b = batch(st.stream, i * 64 + 1, 64);
            for ev in &mut b.events {
                ev.payload = vec![b'x'; 1024];
            }
            e.append(b).unwrap();
        }
    })
    .await;
    let write_time = wrote.elapsed();
    let target = cluster.nodes[&leader].node.status().last_applied;
    let log_bytes: u64 = std::fs::read_dir(cluster.dirs[&leader].path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let gib = log_bytes as f64 / (1u64 << 30) as f64;
    let wiped = cluster.highest_follower(leader);

    // 1. By entries: the leader's log is whole.
    cluster.wipe(wiped).await;
    let started = Instant::now();
    cluster.restart(wiped).await;
    let by_entries = caught_up(&cluster.nodes[&wiped].node, target, started).await;

    // 2. By snapshot: the leader snapshots and purges its log, the member is wiped again.
    cluster.wipe(wiped).await;
    cluster.snapshot_and_purge(leader).await;
    let received = snapshot::bytes_received();
    let started = Instant::now();
    cluster.restart(wiped).await;
    let by_snapshot = caught_up(&cluster.nodes[&wiped].node, target, started).await;
    let sent = snapshot::bytes_received() - received;
    assert!(
        sent >= log_bytes / 2,
        "the snapshot path was taken ({sent} bytes)"
    );

    let per_gib = |d: Duration| d.as_secs_f64() / gib;
    println!(
        "log {:.3} GiB ({} appends of 64 KiB written in {:.1} s): catch-up by entries {:.1} s \
         ({:.1} s/GiB), by snapshot {:.1} s ({:.1} s/GiB, {} bytes of segment files)",
        gib,
        appends,
        write_time.as_secs_f64(),
        by_entries.as_secs_f64(),
        per_gib(by_entries),
        by_snapshot.as_secs_f64(),
        per_gib(by_snapshot),
        sent
    );
    cluster.stop().await;
}
