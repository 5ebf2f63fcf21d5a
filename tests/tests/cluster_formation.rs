//! Issue 30 item 4: formation never silently makes a second cluster, and a lost quorum has a
//! way out that says what it cannot vouch for.
//!
//! - Members 1 and 2 (the founder among them) lose their disks while all three are down and
//!   only they restart with their usual flags: they must not form a new, empty cluster (no
//!   write acknowledged), and say what they wait for. Member 3, which holds every
//!   acknowledged event, comes back: nothing is elected without the operator (two lost disks
//!   are a lost quorum), `cluster force-new` on member 3 makes it the cluster, members 1 and 2
//!   are added back, and every acknowledged event is served.
//! - Members 2 and 3 lose their disks: member 1 holds everything; they refuse to vote for
//!   it and say in one line what to run; `cluster force-new` on member 1 and adding 2 and 3
//!   back brings every acknowledged event back on a three-member cluster.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test")]

#[path = "cluster_faults/oracle.rs"]
#[allow(
    dead_code,
    reason = "the fault suite's oracle; these tests use part of it"
)]
mod oracle;

use std::sync::Arc;
use std::time::Duration;

use cursorlog_tests::cluster::{Cluster, DumpOnPanic, MEMBERS, RPC_TIMEOUT};
use cursorlog_tests::pb;
use oracle::Oracle;
use tokio::time::Instant;

/// As the fault suite: 600 ms elections, 100 ms heartbeats.
const ELECTION: Duration = Duration::from_millis(600);
const TIMING: [&str; 4] = ["--election-timeout-ms", "600", "--heartbeat-ms", "100"];

/// Three longest election timeouts (the longest is twice `--election-timeout-ms`).
const THREE_ELECTIONS: Duration = Duration::from_millis(3 * 2 * 600);

/// For `window`: no member of `members` acknowledges a write (opening a new session).
async fn no_write_acknowledged(cluster: &Cluster, members: &[usize], window: Duration) {
    let until = Instant::now() + window;
    let mut n = 0;
    while Instant::now() < until {
        for &i in members {
            n += 1;
            let mut client = cluster.client(i);
            let open = client.open_session(pb::OpenSessionRequest {
                session: format!("never-{n}"),
                state: None,
            });
            if let Ok(Ok(r)) = tokio::time::timeout(RPC_TIMEOUT, open).await {
                panic!(
                    "member {} acknowledged a write ({:?}) although the members holding the \
                     acknowledged events are not part of its quorum: a second cluster",
                    i + 1,
                    r.get_ref()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Member `survivor` holds every acknowledged event and the others were wiped: force-new on
/// it, start it, add the others back as learners and promote them; then every acknowledged
/// event is served and the three-member cluster takes writes.
async fn recover_on(cluster: &Cluster, oracle: &Oracle, survivor: usize, stream: u64) {
    cluster.stop(survivor);
    let report = cluster.force_new(survivor);
    eprintln!("force-new report:\n{report}");
    assert!(
        report.contains(&format!("member {} (", survivor + 1))
            && report.contains("only voter")
            && report.contains("last committed Raft index"),
        "{report}"
    );
    assert!(
        report.contains("cannot be vouched for"),
        "the report must say what it cannot vouch for: {report}"
    );
    cluster.restart(survivor);
    let leader = cluster.leader(None).await;
    assert_eq!(leader, survivor, "the one voter leads");
    for i in (0..MEMBERS).filter(|i| *i != survivor) {
        cluster.add_back(survivor, i);
    }
    oracle
        .probe_append(cluster, "formation", stream, 21, b"after recovery")
        .await;
    oracle.check_served_by_leader(cluster).await;
    oracle.assert_no_violations();
}

/// Starts a cluster, acknowledges 20 events on a stream every member holds; the stream id.
async fn written(cluster: &Cluster, oracle: &Oracle) -> u64 {
    let (_, stream) = oracle.probe_stream(cluster, "formation").await;
    for seq in 1..=20 {
        oracle
            .probe_append(cluster, "formation", stream, seq, b"acknowledged")
            .await;
    }
    let leader = cluster.leader(None).await;
    cluster.wait_caught_up(leader).await;
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_wiped_members_with_the_founder_never_form_a_second_cluster() {
    let cluster = Arc::new(Cluster::start(&TIMING).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let oracle = Oracle::default();
    let stream = written(&cluster, &oracle).await;
    for i in 0..MEMBERS {
        cluster.kill(i);
    }
    cluster.wipe(0);
    cluster.wipe(1);
    cluster.restart(0);
    cluster.restart(1);
    no_write_acknowledged(&cluster, &[0, 1], THREE_ELECTIONS).await;
    cluster.wait_for_log(0, "waiting for member(s) 3").await;

    // Member 3 comes back with every acknowledged event: the wiped founder sees its log and
    // forms nothing; with two disks lost nothing is elected without the operator.
    cluster.restart(2);
    cluster
        .wait_for_log(0, "this member forms no cluster")
        .await;
    no_write_acknowledged(&cluster, &[0, 1, 2], ELECTION * 4).await;
    recover_on(&cluster, &oracle, 2, stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_wiped_members_without_the_founder_are_recovered_by_force_new() {
    let cluster = Arc::new(Cluster::start(&TIMING).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let oracle = Oracle::default();
    let stream = written(&cluster, &oracle).await;
    for i in 0..MEMBERS {
        cluster.kill(i);
    }
    cluster.wipe(1);
    cluster.wipe(2);
    for i in 0..MEMBERS {
        cluster.restart(i);
    }
    // The wiped members say in one line what to run.
    cluster.wait_for_log(1, "cluster force-new").await;
    cluster.wait_for_log(2, "cluster force-new").await;
    no_write_acknowledged(&cluster, &[0, 1, 2], THREE_ELECTIONS).await;
    recover_on(&cluster, &oracle, 0, stream).await;
}
