//! Issue 19 item 7: three real `cursorlog` members under a concurrent workload, with a fault
//! per iteration chosen by a seeded RNG (leader SIGKILL, leader SIGSTOP past the election
//! timeout, leader isolated both ways and one way, all three killed, a follower wiped, its
//! tail torn, a byte of its sealed segment flipped), and an oracle of every acknowledgement
//! checked after healing on each member in turn as leader.
//!
//! `CURSORLOG_CLUSTER_FAULTS=N` (default 12) and `CURSORLOG_CLUSTER_SEED=S` scale it up;
//! `CURSORLOG_CLUSTER_KINDS=a,b` runs only those fault kinds.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test")]

#[path = "cluster_faults/oracle.rs"]
mod oracle;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cursorlog_tests::cluster::{Cluster, DumpOnPanic, MEMBERS, RPC_TIMEOUT, WAIT};
use cursorlog_tests::{event, pb};
use oracle::{Oracle, Rng, Workload};

/// 600 ms elections and 100 ms heartbeats: with 300/50 on this loaded 2-core machine the
/// heartbeats' own 50 ms timeout kept expiring and the final check's forced leaders kept
/// losing the lead.
const TIMING: [&str; 6] = [
    "--election-timeout-ms",
    "600",
    "--heartbeat-ms",
    "100",
    "--segment-bytes",
    "16384",
];

/// The fault kinds, in the order their counts are printed.
const KINDS: [&str; 9] = [
    "kill-leader",
    "pause-leader",
    "isolate-both",
    "isolate-out",
    "isolate-in",
    "kill-all",
    "wipe-follower",
    "tear-tail",
    "flip-sealed",
];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The kinds that damage a follower's log or cut only the leader's inbound links, kept out of
/// the CI run (the ignored all-kinds test and the focused tests below cover them).
const LOG_DAMAGE: [&str; 4] = ["wipe-follower", "tear-tail", "flip-sealed", "isolate-in"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the long run with log damage (tear-tail drops synced writes, outside Raft's \
            model: REPLICATION.md 'Not yet' 5 and 6); clean in seeds 2-5 and a 240-fault run \
            (seed 1001, 121 failovers). Run with --ignored, CURSORLOG_CLUSTER_FAULTS=N"]
async fn acknowledged_writes_survive_every_fault_kind() {
    run(&KINDS).await;
}

/// The fault kinds that leave every member's log intact (meant for CI by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_leader_faults() {
    let kinds: Vec<&str> = KINDS
        .into_iter()
        .filter(|k| !LOG_DAMAGE.contains(k))
        .collect();
    run(&kinds).await;
}

/// `CURSORLOG_CLUSTER_FAULTS` faults drawn from `default_kinds` (or `CURSORLOG_CLUSTER_KINDS`)
/// under the workload, then the oracle's checks on each member as leader.
async fn run(default_kinds: &[&'static str]) {
    let faults = env_u64("CURSORLOG_CLUSTER_FAULTS", 12);
    let seed = env_u64(
        "CURSORLOG_CLUSTER_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    eprintln!("cluster_faults: seed {seed}, {faults} faults");
    let kinds: Vec<&'static str> = match std::env::var("CURSORLOG_CLUSTER_KINDS") {
        Ok(only) => KINDS
            .into_iter()
            .filter(|k| only.split(',').any(|o| o == *k))
            .collect(),
        Err(_) => default_kinds.to_vec(),
    };
    let mut rng = Rng(seed);
    let cluster = Arc::new(Cluster::start(&TIMING).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let oracle = Arc::new(Oracle::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for k in 0..3 {
        let w = Workload {
            id: k,
            cluster: Arc::clone(&cluster),
            oracle: Arc::clone(&oracle),
            stop: Arc::clone(&stop),
            rng: Rng(seed ^ (0x9e37_79b9 * (k + 1))),
        };
        clients.push(tokio::spawn(w.run()));
    }
    oracle.wait_acks(5).await;

    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    // What a damaged follower did at restart (flip-sealed, tear-tail).
    let mut flip_outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut leader = cluster.leader(None).await;
    let mut failovers = 0_u64;
    for n in 0..faults {
        let kind = kinds[(rng.next() % kinds.len() as u64) as usize];
        eprintln!("fault {n}: {kind} (leader {})", leader + 1);
        let follower = (leader + 1 + (rng.next() % 2) as usize) % MEMBERS;
        match kind {
            "kill-leader" => {
                cluster.kill(leader);
                cluster.leader(Some(leader)).await;
                cluster.restart(leader);
            }
            "pause-leader" => pause_leader(&cluster, &oracle, leader).await,
            "isolate-both" | "isolate-out" | "isolate-in" => {
                isolate_leader(&cluster, &oracle, leader, kind).await;
            }
            "kill-all" => {
                for i in 0..MEMBERS {
                    cluster.kill(i);
                }
                for i in 0..MEMBERS {
                    cluster.restart(i);
                }
            }
            "wipe-follower" => {
                cluster.kill(follower);
                cluster.wipe(follower);
                cluster.restart(follower);
            }
            "tear-tail" => {
                cluster.kill(follower);
                tear_tail(&cluster, follower, &mut rng);
                let what = restart_or_wipe(&cluster, follower);
                *flip_outcomes
                    .entry(format!("tear-tail: {what}"))
                    .or_default() += 1;
            }
            "flip-sealed" => {
                let what = flip_sealed(&cluster, follower, &mut rng).await;
                *flip_outcomes.entry(what).or_default() += 1;
            }
            _ => unreachable!("unknown fault kind {kind}"),
        }
        cluster.heal();
        let now = cluster.leader(None).await;
        if now != leader {
            failovers += 1;
        }
        leader = now;
        // Every member holds the whole log again before the next fault (one fault at a time:
        // two at once can take every copy of an entry), and the workload makes progress.
        cluster.wait_caught_up(leader).await;
        oracle.wait_acks(3).await;
        *counts.entry(kind).or_default() += 1;
        eprintln!(
            "after fault {n}: {counts:?}; failovers {failovers}; {}",
            oracle.report()
        );
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    let max_gap = oracle.stop_clock();
    cluster.heal();
    let leader = cluster.leader(None).await;
    cluster.wait_caught_up(leader).await;

    // Each member in turn leads and serves every stream: all must serve the same bytes.
    let mut served = Vec::new();
    for t in 0..MEMBERS {
        // Resumed where it stopped when the lead moves: a loaded machine serving a long
        // history can miss heartbeats, and a check restarted from the first stream each time
        // may never finish (a 240-fault run lost the lead 5 times in 1,205 streams).
        let mut by_t = oracle::Served::new();
        let mut tries = 0;
        loop {
            cluster.force_leader(t).await;
            if oracle.check_served_into(&cluster, t, &mut by_t).await {
                break;
            }
            tries += 1;
            assert!(
                tries < 20,
                "member {} lost the lead 20 times during the check",
                t + 1
            );
        }
        served.push(by_t);
    }
    for t in 1..MEMBERS {
        assert!(
            served[t] == served[0],
            "member {} serves other streams than member 1",
            t + 1
        );
    }
    let resolved = oracle.check_cursors(&cluster).await;
    let report = oracle.report();
    eprintln!(
        "cluster_faults totals: seed {seed}; faults {faults} {counts:?}; damaged followers \
         {flip_outcomes:?}; failovers {failovers}; {report}; cursors resolved {resolved}; \
         max time without an ack {max_gap:?}; lost 0"
    );
    oracle.assert_no_violations();
}

/// SIGSTOPs the leader past the election timeout, lets the others elect and commit over a
/// write it has in flight, then SIGCONTs it: its in-flight and later answers must never
/// acknowledge the stale write or give a verdict from before the pause.
async fn pause_leader(cluster: &Cluster, oracle: &Oracle, leader: usize) {
    let (epoch, stream) = oracle.probe_stream(cluster, "probe-pause").await;
    oracle
        .probe_append(cluster, "probe-pause", stream, 1, b"before")
        .await;
    cluster.pause(leader);
    let mut old = cluster.client(leader);
    let stale = pb::AppendRequest {
        session: "probe-pause".into(),
        stream,
        expected_next_seq: Some(2),
        events: vec![event("probe", b"stale while paused")],
    };
    let in_flight = tokio::spawn({
        let stale = stale.clone();
        async move { tokio::time::timeout(WAIT, old.append(stale)).await }
    });
    cluster.leader(Some(leader)).await;
    oracle
        .probe_append(cluster, "probe-pause", stream, 2, b"fresh")
        .await;
    cluster.resume(leader);
    let cursor = format!("{epoch}-{stream}-2");
    let verdict = tokio::time::timeout(
        RPC_TIMEOUT,
        cluster.client(leader).resolve(pb::ResolveRequest {
            session: "probe-pause".into(),
            last_event_id: cursor.clone(),
            declared_stream: None,
        }),
    )
    .await;
    if let Ok(Ok(r)) = verdict {
        let r = r.into_inner();
        if r.verdict() != pb::Verdict::Resumable || r.head.unwrap_or(0) < 2 {
            oracle.violation(format!(
                "resumed old leader {} answered {cursor} from stale state: {r:?}",
                leader + 1
            ));
        }
    }
    let again = tokio::time::timeout(RPC_TIMEOUT, cluster.client(leader).append(stale)).await;
    for (what, answer) in [
        ("after resume", again.ok()),
        ("in flight", in_flight.await.unwrap().ok()),
    ] {
        // Any refusal or broken call is not an acknowledgement.
        if let Some(Ok(r)) = answer {
            oracle.violation(format!(
                "old leader {} acknowledged a stale write {what}: {:?}",
                leader + 1,
                r.into_inner()
            ));
        }
    }
}

/// Cuts the leader off (both ways, only its outgoing bytes, or only its incoming bytes); while
/// it is cut off it must not acknowledge a write.
async fn isolate_leader(cluster: &Cluster, oracle: &Oracle, leader: usize, kind: &str) {
    let (_, stream) = oracle.probe_stream(cluster, "probe-isolate").await;
    let (out, inbound) = match kind {
        "isolate-both" => (true, true),
        "isolate-out" => (true, false),
        _ => (false, true),
    };
    cluster.isolate(leader, out, inbound);
    let probe = pb::AppendRequest {
        session: "probe-isolate".into(),
        stream,
        expected_next_seq: Some(1),
        events: vec![event("probe", b"cut off")],
    };
    let answer = tokio::time::timeout(RPC_TIMEOUT, cluster.client(leader).append(probe)).await;
    if let Ok(Ok(r)) = answer {
        oracle.violation(format!(
            "leader {} cut off ({kind}) acknowledged a write: {:?}",
            leader + 1,
            r.into_inner()
        ));
    }
    if out {
        // The others stop hearing it and elect another leader.
        cluster.leader(Some(leader)).await;
    }
}

/// Cuts 1..=300 bytes off the end of the follower's last segment (it is down).
fn tear_tail(cluster: &Cluster, follower: usize, rng: &mut Rng) {
    let segs = cluster.segments(follower);
    let last = segs.last().expect("a segment");
    let len = std::fs::metadata(last).unwrap().len();
    // Past the segment header (about 100 bytes), into the last records.
    let cut = (1 + rng.next() % 300).min(len.saturating_sub(128));
    let file = std::fs::OpenOptions::new().write(true).open(last).unwrap();
    file.set_len(len - cut).unwrap();
}

/// Flips a byte in a sealed segment of the follower while it is down and restarts it;
/// returns what the member did. A member that refuses to start is wiped and recovers from
/// its peers; one that starts must never serve the damaged bytes (checked at the end, when
/// it leads).
async fn flip_sealed(cluster: &Cluster, follower: usize, rng: &mut Rng) -> String {
    cluster.kill(follower);
    let segs = cluster.segments(follower);
    if segs.len() < 2 {
        cluster.restart(follower);
        return "no sealed segment yet".into();
    }
    let sealed = &segs[(rng.next() % (segs.len() as u64 - 1)) as usize];
    let mut bytes = std::fs::read(sealed).unwrap();
    let at = (rng.next() % bytes.len() as u64) as usize;
    bytes[at] ^= 0x5a;
    std::fs::write(sealed, &bytes).unwrap();
    format!("flip-sealed: {}", restart_or_wipe(cluster, follower))
}

/// Restarts a damaged follower; when it refuses to start, wipes it and restarts it (it
/// recovers from its peers). Says which happened.
fn restart_or_wipe(cluster: &Cluster, follower: usize) -> String {
    match cluster.try_restart(follower) {
        Ok(()) => {
            let corrupt = cluster.logs(follower).to_lowercase().contains("corrupt");
            format!("started (corruption logged at start: {corrupt})")
        }
        Err(why) => {
            let line = why
                .lines()
                .find(|l| l.contains("ERROR"))
                .unwrap_or("(no error line)")
                .to_owned();
            eprintln!("member {} refused to start: {line}", follower + 1);
            cluster.wipe(follower);
            cluster.restart(follower);
            "refused to start; wiped and recovered from peers".into()
        }
    }
}

/// A follower that lost its log (data directory wiped) or its tail (torn while down) rejoins
/// and catches up from the leader, and the leader keeps serving writes.
async fn follower_rejoins_after(damage: fn(&Cluster, usize, &mut Rng)) {
    let cluster = Arc::new(Cluster::start(&TIMING).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let oracle = Oracle::default();
    let leader = cluster.leader(None).await;
    let (_, stream) = oracle.probe_stream(&cluster, "probe-rejoin").await;
    for seq in 1..=20 {
        oracle
            .probe_append(&cluster, "probe-rejoin", stream, seq, b"before")
            .await;
    }
    cluster.wait_caught_up(leader).await;
    let follower = (leader + 1) % MEMBERS;
    cluster.kill(follower);
    damage(&cluster, follower, &mut Rng(7));
    // A member whose log lost entries it had acknowledged may refuse to start (it must not
    // vote with them missing); then it is wiped and recovers from its peers.
    let what = restart_or_wipe(&cluster, follower);
    eprintln!("damaged follower: {what}");
    for seq in 21..=30 {
        oracle
            .probe_append(&cluster, "probe-rejoin", stream, seq, b"after")
            .await;
    }
    oracle.check_served_by_leader(&cluster).await;
    assert!(
        !cluster.logs(leader).contains("RaftCore exited"),
        "the leader's Raft core died when the follower rejoined:\n{}",
        cluster
            .logs(leader)
            .lines()
            .filter(|l| l.contains("RaftCore exited") || l.contains("panicked at"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    oracle.assert_no_violations();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_follower_rejoins_and_the_leader_keeps_leading() {
    follower_rejoins_after(|c, i, _| c.wipe(i)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_with_a_torn_tail_rejoins_and_the_leader_keeps_leading() {
    follower_rejoins_after(tear_tail).await;
}

/// A leader cut off from both peers cannot commit: neither an append nor its retry (same
/// `expected_next_seq`, recognised as a duplicate of the entry it proposed but never
/// committed) may be acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_is_never_acknowledged_from_uncommitted_state() {
    let cluster = Arc::new(Cluster::start(&TIMING).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let oracle = Oracle::default();
    let (_, stream) = oracle.probe_stream(&cluster, "probe-retry").await;
    oracle
        .probe_append(&cluster, "probe-retry", stream, 1, b"committed")
        .await;
    let leader = cluster.leader(None).await;
    cluster.isolate(leader, true, true);
    let request = pb::AppendRequest {
        session: "probe-retry".into(),
        stream,
        expected_next_seq: Some(2),
        events: vec![event("probe", b"never committed")],
    };
    let mut answers = Vec::new();
    for _ in 0..2 {
        // Long enough for the member to give up on the entry and answer (outcome unknown).
        let answer = tokio::time::timeout(
            Duration::from_secs(30),
            cluster.client(leader).append(request.clone()),
        )
        .await;
        answers.push(format!("{answer:?}"));
        assert!(
            !matches!(answer, Ok(Ok(_))),
            "a leader cut off from every peer acknowledged an append (attempts: {answers:#?})"
        );
    }
    cluster.heal();
}

/// An old leader whose uncommitted append was cut from its log by the next leader, and
/// which leads again later, must not answer a retry of that append as a duplicate: the
/// event is not in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_truncated_append_is_not_acknowledged_as_a_duplicate_later() {
    let cluster = Arc::new(Cluster::start(&TIMING).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let oracle = Oracle::default();
    let (epoch, stream) = oracle.probe_stream(&cluster, "probe-dup").await;
    oracle
        .probe_append(&cluster, "probe-dup", stream, 1, b"committed")
        .await;
    let old = cluster.leader(None).await;
    // Its bytes stop reaching the others; theirs still reach it (it learns the new term).
    cluster.isolate(old, true, false);
    let request = pb::AppendRequest {
        session: "probe-dup".into(),
        stream,
        expected_next_seq: Some(2),
        events: vec![event("probe", b"proposed, never committed")],
    };
    let first =
        tokio::time::timeout(RPC_TIMEOUT, cluster.client(old).append(request.clone())).await;
    assert!(
        !matches!(first, Ok(Ok(_))),
        "acknowledged while cut off: {first:?}"
    );
    // Another member leads and commits entries of its own over the old leader's.
    cluster.leader(Some(old)).await;
    cluster.heal();
    // Healed, the old leader learns the new term and takes the new leader's entries.
    let new = cluster.leader(None).await;
    cluster.wait_caught_up(new).await;
    cluster.force_leader(old).await;
    let retry =
        tokio::time::timeout(RPC_TIMEOUT, cluster.client(old).append(request.clone())).await;
    let all = oracle::read_stream(&cluster, "probe-dup", epoch, stream).await;
    let there = all.events.iter().any(|e| e.seq == 2);
    if let Ok(Ok(r)) = &retry {
        assert!(
            there,
            "the retry was acknowledged ({:?}) but seq 2 is not in the log: {:?}",
            r.get_ref(),
            all.events
        );
    }
}

/// Two faults at once that Raft alone does not survive: while the leader is down, the one
/// follower that also holds the acknowledged events loses its disk, and the member that
/// missed them comes back. A member restarted without its vote must not vote that stale
/// member in (it would lead without the events): it votes only once a leader reached it, so
/// the cluster waits for the old leader, and every acknowledged event is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_member_does_not_vote_in_a_leader_that_lacks_acknowledged_events() {
    wiped_holder_with_leader_down(0).await;
}

/// As above, with member 1 wiped: the member that formed the cluster, which forms one
/// again when it starts on an empty directory; its vote must be withheld all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_founding_member_does_not_vote_in_a_stale_leader_either() {
    wiped_holder_with_leader_down(1).await;
}

/// Member `leader` leads and member `leader + 2` holds the acknowledged events with it while
/// member `leader + 1` is down; then the leader is down and the holder wiped.
async fn wiped_holder_with_leader_down(leader: usize) {
    let cluster = Arc::new(Cluster::start(&TIMING).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let oracle = Oracle::default();
    let (_, stream) = oracle.probe_stream(&cluster, "probe-amnesia").await;
    oracle
        .probe_append(&cluster, "probe-amnesia", stream, 1, b"on all three")
        .await;
    cluster.force_leader(leader).await;
    cluster.wait_caught_up(leader).await;
    let (stale, holder) = ((leader + 1) % MEMBERS, (leader + 2) % MEMBERS);
    cluster.kill(stale);
    for seq in 2..=10 {
        oracle
            .probe_append(&cluster, "probe-amnesia", stream, seq, b"leader and holder")
            .await;
    }
    cluster.kill(leader);
    cluster.kill(holder);
    cluster.wipe(holder);
    cluster.restart(holder);
    cluster.restart(stale);
    // The stale member campaigns: the wiped one must refuse it (the refusal shows in the
    // candidate's log), never elect it.
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cluster
        .logs(stale)
        .contains("votes once a leader has reached it")
    {
        let mut client = cluster.client(stale);
        let open = client.open_session(pb::OpenSessionRequest {
            session: "harness".into(),
            state: None,
        });
        if let Ok(Ok(_)) = tokio::time::timeout(RPC_TIMEOUT, open).await {
            panic!(
                "member {} was elected with the wiped member's vote: it lacks the \
                 acknowledged seqs 2..=10",
                stale + 1
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "member {} never campaigned",
            stale + 1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.restart(leader);
    oracle.check_served_by_leader(&cluster).await;
    oracle.assert_no_violations();
}

/// A wiped follower catches up a log of large entries: openraft sends up to 300 entries in
/// one AppendEntries, here about 75 MB, over the peers' 64 MiB message limit; refused for its
/// size and retried unchanged, the follower never caught up. The transport now sends the
/// longest prefix under 8 MiB and the rest next (`replication/src/append_limit.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_follower_catches_up_a_log_of_large_entries() {
    let cluster = Arc::new(Cluster::start(&TIMING).await);
    let _dump = DumpOnPanic(Arc::clone(&cluster));
    let oracle = Oracle::default();
    let (_, stream) = oracle.probe_stream(&cluster, "probe-large").await;
    let payload = vec![0x6c_u8; 300 << 10];
    for seq in 1..=250 {
        oracle
            .probe_append(&cluster, "probe-large", stream, seq, &payload)
            .await;
    }
    let leader = cluster.leader(None).await;
    cluster.wait_caught_up(leader).await;
    let follower = (leader + 1) % MEMBERS;
    cluster.kill(follower);
    cluster.wipe(follower);
    cluster.restart(follower);
    oracle.check_served_by_leader(&cluster).await;
    oracle.assert_no_violations();
}
