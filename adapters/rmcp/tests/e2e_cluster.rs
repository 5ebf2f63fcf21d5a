//! End to end on a replicated cursorlog (issue 19 item 6): three real `cursorlog serve
//! --node-id … --peers …` processes, demo replicas given all three addresses, rmcp's own
//! client. The cursorlog leader is SIGKILLed in the middle of a streaming tool call; the MCP
//! client still gets every progress notification exactly once, in order, and the result.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cursorlog_tests::{free_addr, Start};
use harness::{
    call_countdown, connect, countdown_stream, executions, expected_progress, pb, Proxy, Replica,
    Server,
};
use tonic::Code;

/// The bound of one wait (elections on a loaded 2-core machine included).
const WAIT: Duration = Duration::from_secs(60);

/// Three cursorlog members with short election timings, and an execution log for replicas.
struct Members {
    addrs: Vec<String>,
    nodes: Vec<Option<Server>>,
    dirs: Vec<tempfile::TempDir>,
    log: PathBuf,
    _log_dir: tempfile::TempDir,
}

impl Members {
    fn start() -> Self {
        let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let nodes = (0..3)
            .map(|i| Some(Self::spawn(&addrs, &dirs, i)))
            .collect();
        let log_dir = tempfile::tempdir().unwrap();
        Self {
            addrs,
            nodes,
            dirs,
            log: log_dir.path().join("exec.log"),
            _log_dir: log_dir,
        }
    }

    /// Member `i` on its address and data directory.
    fn spawn(addrs: &[String], dirs: &[tempfile::TempDir], i: usize) -> Server {
        let peers = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let id = (i + 1).to_string();
        Server::start_with(Start {
            data_dir: Some(dirs[i].path()),
            listen: Some(&addrs[i]),
            args: &[
                "--node-id",
                &id,
                "--peers",
                &peers,
                "--election-timeout-ms",
                "300",
                "--heartbeat-ms",
                "50",
            ],
            ..Start::default()
        })
    }

    /// Starts member `i` again (after [`Members::kill`]) on its data directory.
    fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "member {i} is running");
        self.nodes[i] = Some(Self::spawn(&self.addrs, &self.dirs, i));
    }

    /// What a replica is given: every member, comma-separated.
    fn endpoints(&self) -> String {
        self.addrs
            .iter()
            .map(|a| format!("http://{a}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The member that leads now: the live one that accepts an idempotent write. Polls the
    /// members until one does (an election may be under way), within [`WAIT`].
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            for (i, node) in self.nodes.iter().enumerate() {
                let Some(node) = node else { continue };
                let opened = node
                    .client()
                    .await
                    .open_session(pb::OpenSessionRequest {
                        session: "leader-probe".into(),
                        state: None,
                    })
                    .await;
                match opened {
                    Ok(_) => return i,
                    Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
                }
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL member `i`.
    fn kill(&mut self, i: usize) {
        let mut node = self.nodes[i].take().expect("a live member");
        node.kill();
    }

    fn replica(&self) -> Replica {
        Replica::start_on(&self.endpoints(), &self.log, 10_000, None, &[])
    }
}

/// The countdown's stream as the cluster's (new) leader holds it.
async fn outcome_on_leader(members: &Members) -> pb::Outcome {
    let leader = members.leader().await;
    let node = members.nodes[leader].as_ref().unwrap();
    countdown_stream(node, &members.log).await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_call_the_client_gets_every_event_once_and_the_result() {
    const STEPS: u64 = 12;
    let mut members = Members::start();
    members.leader().await;
    let replica = members.replica();
    let proxy = Proxy::start(replica.addr).await;
    let (progress, client) = connect(&proxy.url()).await;

    let call = call_countdown(&client, STEPS, 150);
    progress.wait_for(3).await;
    let leader = members.leader().await;
    members.kill(leader);
    let before = progress.seen().len();
    assert!(
        before < STEPS as usize,
        "the leader died mid-call ({before} seen)"
    );

    let result = tokio::time::timeout(WAIT, call)
        .await
        .expect("the call finishes on the new leader")
        .unwrap();
    assert_eq!(result.as_deref(), Ok("countdown of 12 done"));
    progress.wait_for(STEPS as usize).await;
    assert_eq!(
        progress.seen_by_step(),
        expected_progress(STEPS),
        "every progress notification exactly once"
    );
    proxy.assert_steps_in_order();
    assert_eq!(executions(&members.log).len(), 1, "the tool ran once");
    // The new leader holds the call once: 12 notifications and the response, no resend twice.
    let outcome = outcome_on_leader(&members).await;
    assert_eq!(outcome.state(), pb::StreamState::Completed);
    assert_eq!(outcome.terminal_seq, Some(STEPS + 1));
    client.cancel().await.unwrap();
}

/// The client resumes on replica B, whose `Read(follow)` on the leader delivers the live
/// events; the leader dies; B reads on from the new leader after the last event it
/// delivered, so the client sees no duplicate and no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_a_resumed_call_follows_it_reads_on_without_duplicate_or_gap() {
    const STEPS: u64 = 14;
    let mut members = Members::start();
    members.leader().await;
    let a = members.replica();
    let b = members.replica();
    let proxy = Proxy::start(a.addr).await;
    let (progress, client) = connect(&proxy.url()).await;

    let call = call_countdown(&client, STEPS, 150);
    progress.wait_for(3).await;
    // The load balancer moves the client to B; A keeps running the tool.
    proxy.release_to(b.addr);
    proxy.cut();
    let at_cut = progress.seen().len();
    // Events arrive again: through B's Read(follow) on the leader.
    progress.wait_for(at_cut + 2).await;
    assert!(!proxy.resumes().is_empty(), "the client resumed through B");
    let leader = members.leader().await;
    members.kill(leader);
    let before = progress.seen().len();
    assert!(
        before < STEPS as usize,
        "the leader died mid-call ({before} seen)"
    );

    let result = tokio::time::timeout(WAIT, call)
        .await
        .expect("the call finishes")
        .unwrap();
    assert_eq!(result.as_deref(), Ok("countdown of 14 done"));
    progress.wait_for(STEPS as usize).await;
    assert_eq!(
        progress.seen_by_step(),
        expected_progress(STEPS),
        "every progress notification exactly once"
    );
    proxy.assert_steps_in_order();
    // The call's own stream (ids `….n<request>`; the standalone GET stream resumes too).
    let call_resumes: Vec<String> = proxy
        .resumes()
        .into_iter()
        .filter(|id| id.contains(".n"))
        .collect();
    assert_eq!(
        call_resumes.len(),
        1,
        "B read on from the new leader by itself: the client did not resume the call again: {:?}",
        proxy.resumes()
    );
    assert_eq!(executions(&members.log).len(), 1, "the tool ran once");
    let outcome = outcome_on_leader(&members).await;
    assert_eq!(outcome.terminal_seq, Some(STEPS + 1));
    client.cancel().await.unwrap();
}

/// Issue 30 item 2. The replica lists the leader L, then a member F that cannot win the next
/// election (it misses a write: killed before it, restarted after L is killed). A tool call's
/// stream has a 1.5 s lease; L is SIGKILLed, the replica's next lease renewal lands on F, a
/// follower, which answers `KeepAlive` UNAVAILABLE naming the new leader: the renewal is
/// followed there, and after more than two leases with no write under the new leader the tool's
/// step and result are stored on the same stream. (When a follower answered OK and renewed
/// nothing, the new leader aborted the stream: "producer lease expired".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_that_lands_on_a_follower_after_a_failover_keeps_the_call_alive() {
    const LEASE: Duration = Duration::from_millis(1_500);
    const DELAY: Duration = Duration::from_millis(9_000);
    let mut members = Members::start();
    let leader = members.leader().await;
    let (follower, heir) = match leader {
        0 => (1, 2),
        1 => (2, 0),
        _ => (0, 1),
    };
    let endpoints = [leader, follower]
        .map(|i| format!("http://{}", members.addrs[i]))
        .join(",");
    let log_dir = tempfile::tempdir().unwrap();
    let replica_log = log_dir.path().join("replica.log");
    let lease_ms = u64::try_from(LEASE.as_millis()).unwrap();
    let replica = Replica::start_logged(
        &endpoints,
        &members.log,
        lease_ms,
        None,
        &[],
        Some(&replica_log),
    );
    let (progress, client) = connect(&format!("http://{}/mcp", replica.addr)).await;

    // One step after DELAY: until then only lease renewals keep the stream open.
    let started = Instant::now();
    let call = call_countdown(&client, 1, u64::try_from(DELAY.as_millis()).unwrap());
    let opened = stream_on(&members, leader).await;
    assert_eq!(opened.state(), pb::StreamState::Open);
    // F misses a write (committed by L and the heir), so only the heir can win after L.
    members.kill(follower);
    members.nodes[leader]
        .as_ref()
        .unwrap()
        .client()
        .await
        .open_session(pb::OpenSessionRequest {
            session: "missed-by-the-follower".into(),
            state: None,
        })
        .await
        .unwrap();
    members.kill(leader);
    members.restart(follower);
    assert_eq!(members.leader().await, heir);
    let elected = started.elapsed();
    assert!(
        progress.seen().is_empty(),
        "the step came after the failover"
    );
    assert!(
        elected + 2 * LEASE < DELAY,
        "more than two leases of renewals only under the new leader (elected after {elected:?})"
    );

    let result = tokio::time::timeout(WAIT, call)
        .await
        .expect("the call finishes")
        .unwrap();
    assert_eq!(result.as_deref(), Ok("countdown of 1 done"));
    let outcome = outcome_on_leader(&members).await;
    assert_eq!(
        (outcome.state(), outcome.stream, outcome.terminal_seq),
        (pb::StreamState::Completed, opened.stream, Some(2)),
        "the stream L opened, completed with the step and the result: {outcome:?}"
    );
    // A call (only lease renewals ran between the kill and the step) was refused by the
    // follower naming the new leader, and followed there.
    let (follower_addr, heir_addr) = (&members.addrs[follower], &members.addrs[heir]);
    let text = std::fs::read_to_string(&replica_log).unwrap();
    assert!(
        text.lines().any(|l| l.contains("following the leader")
            && l.contains(&format!("member=\"{follower_addr}\""))
            && l.contains(&format!("Redirect(\"{heir_addr}\")"))),
        "a renewal refused by the follower {follower_addr} naming {heir_addr}:\n{text}"
    );
    client.cancel().await.unwrap();
}

/// The countdown's stream on member `i`, once the replica has opened it (polled within [`WAIT`]).
async fn stream_on(members: &Members, i: usize) -> pb::Outcome {
    let node = members.nodes[i].as_ref().unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(line) = executions(&members.log).into_iter().next() {
            let session = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("session="))
                .unwrap()
                .to_owned();
            let request = line.rsplit("id=").next().unwrap().to_owned();
            let found = node
                .client()
                .await
                .get_outcome(pb::GetOutcomeRequest {
                    session,
                    correlation: request,
                    stream: None,
                })
                .await
                .unwrap()
                .into_inner();
            if let Some(outcome) = found.outcome {
                return outcome;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no stream for the call within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
