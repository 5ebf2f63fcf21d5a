//! The Raft transport end to end: openraft nodes in one process, each serving
//! `cursorlog.raft.v1.Raft` on its own 127.0.0.1:0 listener and dialling the others through
//! [`NetworkFactory`] (real TCP, real HTTP/2, real encoding). The log store and state machine
//! are the in-memory fixture of `tests/support/` (scaffolding until the segment log is the
//! Raft log).
//!
//! Every wait is on openraft's metrics (`Raft::wait`), bounded by [`WAIT`]; nothing sleeps.

#[allow(dead_code)]
mod common;
mod support;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_replication::{
    ClientOptions, ClusterTiming, InMemorySnapshots, NetworkFactory, NodeId, Proposal, Raft,
    RaftNode, RaftService, Vote,
};
use openraft::error::{ClientWriteError, LinearizableReadError, RPCError, RaftError};
use openraft::network::{RPCOption, RaftNetworkV2 as _};
use openraft::raft::VoteRequest;
use openraft::{Instant as _, ReadPolicy};
use support::{MemLog, MemStateMachine};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The bound of any one wait. Failover alone takes `election_max + rand(min, max)` ≈ 3–4 s;
/// the rest is room for a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(60);

/// One node: its Raft handle, its state machine and its gRPC server.
struct Node {
    id: NodeId,
    addr: String,
    raft: Raft<MemStateMachine>,
    sm: MemStateMachine,
    /// Ends the Raft service's open `StreamAppend` calls (the server drains calls first).
    shutdown: tokio::sync::watch::Sender<bool>,
    stop_server: oneshot::Sender<()>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Node {
    fn member(&self) -> RaftNode {
        RaftNode::new(&self.addr)
    }

    /// Stops the gRPC server (peers now get connection refused), then the Raft node.
    async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.stop_server.send(());
        tokio::time::timeout(WAIT, self.server)
            .await
            .expect("the server stops")
            .expect("the server task ends")
            .expect("the server ran");
        self.raft.shutdown().await.expect("raft shuts down");
    }
}

/// Starts node `id` serving on a fresh loopback port. With `token`, the server refuses calls
/// without `authorization: Bearer <token>` (as the server crate's interceptor does) and the
/// node's client sends it.
async fn start(id: NodeId, token: Option<&str>) -> Node {
    start_timed(id, token, ClusterTiming::default()).await
}

/// [`start`] with the given timing.
async fn start_timed(id: NodeId, token: Option<&str>, timing: ClusterTiming) -> Node {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr").to_string();
    let config = timing.config("transport-test").expect("valid timing");
    let mut options = ClientOptions::new();
    if let Some(token) = token {
        options = options.with_token(token).expect("ascii token");
    }
    let sm = MemStateMachine::default();
    let raft = Raft::new(
        id,
        Arc::new(config),
        NetworkFactory::new(id, options),
        MemLog::default(),
        sm.clone(),
    )
    .await
    .expect("raft starts");
    let (shutdown, down) = tokio::sync::watch::channel(false);
    let service = RaftService::new(raft.clone(), InMemorySnapshots)
        .with_shutdown(down)
        .into_server();
    let expected = token.map(|t| format!("Bearer {t}"));
    let check = move |req: tonic::Request<()>| match &expected {
        None => Ok(req),
        Some(want)
            if req
                .metadata()
                .get("authorization")
                .is_some_and(|v| v == want) =>
        {
            Ok(req)
        }
        Some(_) => Err(tonic::Status::unauthenticated("bad token")),
    };
    let service = tonic::service::interceptor::InterceptedService::new(service, check);
    let (stop_server, server) = common::serve(tonic::service::Routes::new(service), listener);
    Node {
        id,
        addr,
        raft,
        sm,
        shutdown,
        stop_server,
        server,
    }
}

/// Starts nodes `ids` and initializes them as one cluster.
async fn cluster(ids: impl IntoIterator<Item = NodeId>) -> Vec<Node> {
    cluster_timed(ids, ClusterTiming::default()).await
}

/// [`cluster`] with the given timing.
async fn cluster_timed(ids: impl IntoIterator<Item = NodeId>, timing: ClusterTiming) -> Vec<Node> {
    let mut nodes = Vec::new();
    for id in ids {
        nodes.push(start_timed(id, None, timing.clone()).await);
    }
    let members: BTreeMap<NodeId, RaftNode> = nodes.iter().map(|n| (n.id, n.member())).collect();
    nodes[0].raft.initialize(members).await.expect("initialize");
    nodes
}

/// Waits until every node in `nodes` names the same leader (not `not`), and that leader has
/// heard from a quorum (before that it refuses writes with `ForwardToLeader { None }`).
async fn agreed_leader(nodes: &[Node], not: Option<NodeId>) -> NodeId {
    let ids: Vec<NodeId> = nodes.iter().map(|n| n.id).collect();
    let metrics = nodes[0]
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| {
                m.current_leader
                    .is_some_and(|l| Some(l) != not && ids.contains(&l))
            },
            "a leader among the live nodes",
        )
        .await
        .expect("a leader is elected");
    let leader = metrics.current_leader.expect("checked by the wait");
    for node in nodes {
        node.raft
            .wait(Some(WAIT))
            .current_leader(leader, format!("node {} follows {leader}", node.id))
            .await
            .expect("every node follows the leader");
    }
    node(nodes, leader)
        .raft
        .wait(Some(WAIT))
        .leader_with_quorum_acked(None, "the leader's lease")
        .await
        .expect("a quorum acknowledges the leader");
    leader
}

fn node(nodes: &[Node], id: NodeId) -> &Node {
    nodes.iter().find(|n| n.id == id).expect("a live node")
}

fn records(i: u32) -> Vec<u8> {
    format!("proposal-{i:04}").into_bytes()
}

/// Writes proposals `range` through `leader` one by one; returns the last one's log index.
async fn write(leader: &Node, range: std::ops::Range<u32>) -> u64 {
    let mut last = 0;
    for i in range {
        loop {
            match leader
                .raft
                .client_write(Proposal {
                    records: records(i).into(),
                })
                .await
            {
                Ok(resp) => {
                    assert_eq!(resp.data.refused, None, "the apply result of {i}");
                    last = resp.log_id.index;
                    break;
                }
                // The lease lapsed (a loaded machine delayed heartbeats): nothing was
                // appended; wait until a quorum acknowledges the leader again.
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
                    if f.leader_id.is_none() =>
                {
                    leader
                        .raft
                        .wait(Some(WAIT))
                        .leader_with_quorum_acked(
                            Some(openraft::TokioInstant::now()),
                            "the lease again",
                        )
                        .await
                        .expect("the lease is renewed");
                }
                Err(err) => panic!("write {i} on node {}: {err}", leader.id),
            }
        }
    }
    last
}

/// Waits until every node applied up to `index`, then checks each applied `expected`, in order.
async fn all_applied(nodes: &[Node], index: u64, expected: &[Vec<u8>]) {
    for node in nodes {
        node.raft
            .wait(Some(WAIT))
            .applied_index_at_least(Some(index), format!("node {} applies", node.id))
            .await
            .expect("every node applies everything");
        assert!(
            node.sm.proposals() == expected,
            "node {} applied {} proposals, not the {} written, in order",
            node.id,
            node.sm.proposals().len(),
            expected.len()
        );
    }
}

/// A client to `target` from a node id that is not in the cluster.
fn client_to(
    target: &Node,
    options: ClientOptions,
) -> cursorlog_replication::NetworkClient<Cursor<Vec<u8>>> {
    NetworkFactory::new(99, options).client(target.id, &target.member())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_over_grpc_fail_over_and_answer_read_index() {
    let started = std::time::Instant::now();
    let phase = |what: &str| eprintln!("{:>8.3} s  {what}", started.elapsed().as_secs_f64());
    let mut nodes = cluster(1..=3).await;
    let leader = agreed_leader(&nodes, None).await;
    phase("first leader agreed");
    let last = write(node(&nodes, leader), 0..200).await;
    phase("200 writes acknowledged");
    let mut expected: Vec<Vec<u8>> = (0..200).map(records).collect();
    all_applied(&nodes, last, &expected).await;
    phase("200 applied on every node");

    // pre_vote is forwarded: a follower with a live leader refuses a candidate with an empty
    // log (the trait's default would have answered "granted" without asking).
    let follower = nodes.iter().find(|n| n.id != leader).expect("a follower");
    let term = follower
        .raft
        .wait(Some(WAIT))
        .metrics(|_| true, "metrics")
        .await
        .expect("metrics")
        .current_term;
    let resp = client_to(follower, ClientOptions::new())
        .pre_vote(
            VoteRequest::new(Vote::new(term + 1, 99), None),
            RPCOption::new(WAIT),
        )
        .await
        .expect("the follower answers");
    assert!(!resp.vote_granted, "pre-vote reached the follower: {resp}");

    // The leader goes away: server first (peers get refused connections), then Raft.
    let dead = nodes.remove(nodes.iter().position(|n| n.id == leader).expect("leader"));
    dead.stop().await;
    phase("leader stopped");
    let new_leader = agreed_leader(&nodes, Some(leader)).await;
    phase("new leader agreed");
    assert_ne!(new_leader, leader);
    let last = write(node(&nodes, new_leader), 200..300).await;
    phase("100 more writes acknowledged");
    expected.extend((200..300).map(records));
    all_applied(&nodes, last, &expected).await;
    phase("300 applied on both survivors");

    // ReadIndex: the leader confirms its leadership with a quorum; a follower refuses and
    // names the leader.
    node(&nodes, new_leader)
        .raft
        .ensure_linearizable(ReadPolicy::ReadIndex)
        .await
        .expect("the leader serves a linearizable read");
    let follower = nodes
        .iter()
        .find(|n| n.id != new_leader)
        .expect("a follower");
    match follower
        .raft
        .ensure_linearizable(ReadPolicy::ReadIndex)
        .await
    {
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
            assert_eq!(f.leader_id, Some(new_leader));
        }
        other => panic!("a follower must forward a linearizable read: {other:?}"),
    }

    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_behind_a_purged_log_catches_up_by_a_streamed_snapshot() {
    let mut nodes = cluster(1..=3).await;
    let leader = agreed_leader(&nodes, None).await;
    let last = write(node(&nodes, leader), 0..50).await;
    let expected: Vec<Vec<u8>> = (0..50).map(records).collect();
    all_applied(&nodes, last, &expected).await;

    // Snapshot and purge the leader's log, so a new node can only start from the snapshot.
    let lead = node(&nodes, leader);
    lead.raft.trigger().snapshot().await.expect("snapshot");
    let metrics = lead
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= last),
            "the snapshot",
        )
        .await
        .expect("a snapshot is built");
    let snapshot = metrics.snapshot.expect("checked by the wait");
    lead.raft
        .trigger()
        .purge_log(snapshot.index)
        .await
        .expect("purge");
    lead.raft
        .wait(Some(WAIT))
        .purged(Some(snapshot), "the purge")
        .await
        .expect("the log is purged");

    let learner = start(4, None).await;
    lead.raft
        .add_learner(learner.id, learner.member(), true)
        .await
        .expect("the learner is added and catches up");
    learner
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= snapshot.index),
            "installed",
        )
        .await
        .expect("the learner installed the snapshot");
    learner
        .raft
        .wait(Some(WAIT))
        .applied_index_at_least(Some(last), "the learner applies")
        .await
        .expect("the learner applies");
    assert!(
        learner.sm.proposals() == expected,
        "the learner's state is the snapshot's"
    );

    nodes.push(learner);
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_travels_with_every_call_and_a_refusal_is_unreachable() {
    let node = start(1, Some("s3cret")).await;
    let ask = || VoteRequest::new(Vote::new(1, 99), None);

    let with_token = ClientOptions::new().with_token("s3cret").expect("ascii");
    client_to(&node, with_token)
        .pre_vote(ask(), RPCOption::new(WAIT))
        .await
        .expect("the right token passes");

    for options in [
        ClientOptions::new(),
        ClientOptions::new().with_token("wrong").expect("ascii"),
    ] {
        match client_to(&node, options)
            .pre_vote(ask(), RPCOption::new(WAIT))
            .await
        {
            Err(RPCError::Unreachable(_)) => {}
            other => panic!("a refused call must be Unreachable: {other:?}"),
        }
    }
    node.stop().await;
}

#[tokio::test]
async fn a_refused_connection_is_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    let mut client: cursorlog_replication::NetworkClient<Cursor<Vec<u8>>> =
        NetworkFactory::new(1, ClientOptions::new()).client(2, &RaftNode::new(addr));
    match client
        .vote(
            VoteRequest::new(Vote::new(1, 1), None),
            RPCOption::new(WAIT),
        )
        .await
    {
        Err(RPCError::Unreachable(_)) => {}
        other => panic!("a refused connection must be Unreachable: {other:?}"),
    }
}

/// A bare client of `node`'s Raft service (no token, no identity), for sending it by hand.
async fn raw_client(
    node: &Node,
) -> cursorlog_proto::raft_v1::raft_client::RaftClient<tonic::transport::Channel> {
    cursorlog_proto::raft_v1::raft_client::RaftClient::connect(format!("http://{}", node.addr))
        .await
        .expect("connect")
}

/// A pipelined AppendEntries that does not decode ends the follower's answers with
/// `INVALID_ARGUMENT` (the leader backs off, as from a codec mismatch); nothing is appended.
#[tokio::test]
async fn a_streamed_append_that_does_not_decode_is_refused_as_invalid() {
    let nodes = cluster([1]).await;
    let mut raw = raw_client(&nodes[0]).await;
    let garbage = cursorlog_proto::raft_v1::RaftRequest {
        data: vec![0xff; 7].into(),
    };
    let mut answers = raw
        .stream_append(futures_util::stream::iter([garbage]))
        .await
        .expect("the call opens")
        .into_inner();
    match tokio::time::timeout(WAIT, answers.message()).await {
        Ok(Err(status)) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}"),
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
    for node in nodes {
        node.stop().await;
    }
}

/// A leader holds its `StreamAppend` calls open for as long as it replicates; a member whose
/// server shuts down ends them (its server drains calls before it stops, and would wait for
/// them for its whole grace period: a restarted member in CI found its directory still
/// locked by the old node).
#[tokio::test]
async fn an_open_streamed_append_ends_when_the_server_shuts_down() {
    let nodes = cluster([1]).await;
    let mut raw = raw_client(&nodes[0]).await;
    let (requests, outbound) = tokio::sync::mpsc::channel(1);
    let mut answers = raw
        .stream_append(tokio_stream::wrappers::ReceiverStream::new(outbound))
        .await
        .expect("the call opens")
        .into_inner();
    nodes[0].shutdown.send(true).expect("the service listens");
    match tokio::time::timeout(WAIT, answers.message()).await {
        Ok(Ok(None)) => {}
        other => panic!("expected the answers to end, got {other:?}"),
    }
    drop(requests);
    for node in nodes {
        node.stop().await;
    }
}

/// A leader that lost its quorum hands its lead over to a follower whose log does not yet
/// hold the leader's last entry (the leader could not send it). openraft's successor then
/// ignores the transfer and keeps the old leader's lease; while the old leader still reaches
/// the followers (cut off inbound only) nothing would ever elect anyone. The successor
/// releases the lease and campaigns instead (`RaftService::transfer_leader`), and the other
/// follower, which dropped its lease on the same transfer, elects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_whose_log_misses_the_leaders_last_entry_still_takes_the_lead() {
    // Election timeouts far beyond the wait below: no follower campaigns on its own, so
    // only the transfer can move the lead.
    let timing = ClusterTiming {
        election_min: Duration::from_secs(60),
        election_max: Duration::from_secs(90),
        ..ClusterTiming::default()
    };
    let nodes = cluster_timed(1..=3, timing).await;
    let leader = agreed_leader(&nodes, None).await;
    let last = write(node(&nodes, leader), 0..20).await;
    all_applied(&nodes, last, &(0..20).map(records).collect::<Vec<_>>()).await;
    let m = node(&nodes, leader)
        .raft
        .wait(Some(WAIT))
        .metrics(|_| true, "metrics")
        .await
        .expect("metrics");
    let mut beyond = m.last_applied.expect("20 writes applied");
    beyond.index += 10;
    let successor = nodes.iter().find(|n| n.id != leader).expect("a follower");
    let transfer = openraft::raft::TransferLeaderRequest::new(m.vote, successor.id, Some(beyond));
    // A leader that hands over stops heartbeating (openraft's transfer mark, and the
    // check-quorum watch's switch): so does this one, or its next heartbeat would renew the
    // lease the transfer just dropped on the other follower, before the successor's
    // pre-vote reaches it (a race a loaded machine lost: the successor stayed a follower).
    node(&nodes, leader).raft.runtime_config().heartbeat(false);
    // Sent to both followers at once, as openraft's broadcast does.
    let sends = nodes.iter().filter(|n| n.id != leader).map(|follower| {
        let mut client = client_to(follower, ClientOptions::new());
        let transfer = transfer.clone();
        async move {
            let _ = client.transfer_leader(transfer, RPCOption::new(WAIT)).await;
        }
    });
    futures_util::future::join_all(sends).await;
    let now = successor
        .raft
        .wait(Some(Duration::from_secs(20)))
        .metrics(
            |m| m.current_leader.is_some_and(|l| l != leader),
            "a follower of the old leader leads",
        )
        .await
        .expect("a follower campaigned and won though the successor's log missed the leader's last entry")
        .current_leader;
    eprintln!("leader {leader} handed over; {now:?} leads");
    for node in nodes {
        node.stop().await;
    }
}
