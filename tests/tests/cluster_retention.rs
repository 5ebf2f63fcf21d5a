//! Retention on a cluster of three real `cursorlog` processes (issue 19 item 4): with a
//! size bound, every member's log stays bounded while the leader and a follower are killed
//! (SIGKILL) part way through, and after all three are killed and restarted; the live
//! stream written last reads back byte-identical throughout.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cursorlog_tests::cluster::{Cluster, DumpOnPanic, MEMBERS, WAIT};
use cursorlog_tests::{event, pb, read_all, read_request};

/// The members' retention bound.
const BOUND: u64 = 256 << 10;
/// Segment size.
const SEGMENT: u64 = 64 << 10;
/// What a member may hold: the bound, the segment being written and the one the carried
/// state went to, plus the entries kept around the last snapshot (15 entries of at most
/// 20 KiB, `--snapshot-every-entries 10 --snapshot-keep-entries 5`).
const LIMIT: u64 = BOUND + 2 * SEGMENT + 15 * (20 << 10);

const FLAGS: [&str; 14] = [
    "--election-timeout-ms",
    "600",
    "--heartbeat-ms",
    "100",
    "--segment-bytes",
    "65536",
    "--retention-max-bytes",
    "262144",
    "--retention-check-interval-ms",
    "100",
    "--snapshot-every-entries",
    "10",
    "--snapshot-keep-entries",
    "5",
];

/// Opens `session` and a stream in it (a retry may open a second one: the answered one is
/// used); returns (epoch, stream).
async fn open(cluster: &Cluster, session: &str) -> (u64, u64) {
    let request = pb::OpenSessionRequest {
        session: session.into(),
        state: None,
    };
    let (opened, _) = cluster
        .call("open session", |mut c| {
            let request = request.clone();
            async move { c.open_session(request).await }
        })
        .await
        .unwrap();
    let request = pb::OpenStreamRequest {
        session: session.into(),
        epoch: opened.epoch,
        correlation: None,
        lease_ms: None,
    };
    let (stream, _) = cluster
        .call("open stream", |mut c| {
            let request = request.clone();
            async move { c.open_stream(request).await }
        })
        .await
        .unwrap();
    (stream.epoch, stream.stream)
}

/// Appends `payloads` at seq `first` (idempotent by `expected_next_seq`).
async fn append(cluster: &Cluster, session: &str, stream: u64, first: u64, payloads: &[Vec<u8>]) {
    let request = pb::AppendRequest {
        session: session.into(),
        stream,
        expected_next_seq: Some(first),
        events: payloads.iter().map(|p| event("progress", p)).collect(),
    };
    let (r, _) = cluster
        .call("append", |mut c| {
            let request = request.clone();
            async move { c.append(request).await }
        })
        .await
        .unwrap();
    assert_eq!(r.first_seq, first, "{r:?}");
}

/// Completes the stream at seq `next` (idempotent by `expected_next_seq`).
async fn complete(cluster: &Cluster, session: &str, stream: u64, next: u64) {
    let request = pb::CompleteRequest {
        session: session.into(),
        stream,
        expected_next_seq: Some(next),
        terminal: Some(event("result", b"done")),
    };
    cluster
        .call("complete", |mut c| {
            let request = request.clone();
            async move { c.complete(request).await }
        })
        .await
        .unwrap();
}

/// Member `i`'s segment bytes.
fn log_bytes(cluster: &Cluster, i: usize) -> u64 {
    cluster
        .segments(i)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Waits until every running member's log is within [`LIMIT`] (retention runs every
/// 100 ms; a snapshot comes every 10 entries).
async fn wait_bounded(cluster: &Cluster) {
    let deadline = Instant::now() + WAIT;
    loop {
        let sizes: Vec<u64> = (0..MEMBERS)
            .filter(|i| cluster.is_up(*i))
            .map(|i| log_bytes(cluster, i))
            .collect();
        if sizes.iter().all(|b| *b <= LIMIT) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "members' logs {sizes:?} did not get within {LIMIT} bytes in {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads the live stream from its start on the leader and checks every payload.
/// A member that hands its lead over while the read starts answers UNAVAILABLE (a loaded
/// machine delays a quorum's acknowledgements past the lease): the read is asked again of
/// whoever leads then.
async fn check_live(cluster: &Cluster, epoch: u64, stream: u64, payloads: &[Vec<u8>]) {
    let cursor = format!("{epoch}-{stream}-0");
    let deadline = std::time::Instant::now() + WAIT;
    let all = loop {
        let leader = cluster.leader(None).await;
        let all = read_all(
            &mut cluster.client(leader),
            read_request("live", &cursor, false),
            WAIT,
        )
        .await;
        match &all.error {
            Some(status)
                if status.code() == tonic::Code::Unavailable
                    && std::time::Instant::now() < deadline => {}
            _ => break all,
        }
    };
    assert!(all.error.is_none(), "{:?}", all.error);
    let got: Vec<&[u8]> = all.events.iter().map(|e| &e.payload[..]).collect();
    let want: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    assert_eq!(got, want, "the live stream reads back byte-identical");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_stay_within_the_retention_bound_through_kills_and_keep_the_live_stream() {
    let cluster = Arc::new(Cluster::start(&FLAGS).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let mut follower = None;
    let mut killed_leader = None;
    // 40 finished streams of 80 KiB (3.2 MiB, over 12 times the bound); a follower is
    // killed a third of the way and restarted, then the leader.
    for k in 0..40 {
        let session = format!("old-{k}");
        let (_, stream) = open(&cluster, &session).await;
        for batch in 0..4_u64 {
            let payloads: Vec<Vec<u8>> = (0..10).map(|i| vec![(k + i) as u8; 2 << 10]).collect();
            append(&cluster, &session, stream, batch * 10 + 1, &payloads).await;
        }
        complete(&cluster, &session, stream, 41).await;
        match k {
            13 => {
                let leader = cluster.leader(None).await;
                let f = (leader + 1) % MEMBERS;
                cluster.kill(f);
                follower = Some(f);
            }
            20 => cluster.restart(follower.take().unwrap()),
            27 => {
                let leader = cluster.leader(None).await;
                cluster.kill(leader);
                killed_leader = Some(leader);
            }
            33 => cluster.restart(killed_leader.take().unwrap()),
            _ => {}
        }
    }
    let (epoch, live) = open(&cluster, "live").await;
    let payloads: Vec<Vec<u8>> = (0..20_u8).map(|i| vec![i; 1 << 10]).collect();
    for (i, chunk) in payloads.chunks(5).enumerate() {
        append(&cluster, "live", live, i as u64 * 5 + 1, chunk).await;
    }
    let leader = cluster.leader(None).await;
    cluster.wait_caught_up(leader).await;
    wait_bounded(&cluster).await;
    check_live(&cluster, epoch, live, &payloads).await;

    // All three die at once and come back over their shortened logs.
    for i in 0..MEMBERS {
        cluster.kill(i);
    }
    for i in 0..MEMBERS {
        cluster.restart(i);
    }
    let leader = cluster.leader(None).await;
    cluster.wait_caught_up(leader).await;
    check_live(&cluster, epoch, live, &payloads).await;
    append(&cluster, "live", live, 21, &[b"after".to_vec()]).await;
    wait_bounded(&cluster).await;
}
