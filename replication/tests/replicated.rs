//! Three replicated cursorlog nodes in one process, over loopback gRPC, each on its own data
//! directory: the engine's writes go through openraft on the leader, every node applies the
//! committed entries, and all serve the same sessions, streams and events — through a leader
//! change and a restart of the old leader (issue 19 items 2 and 3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cursorlog_engine::{
    Append, Config, Engine, Error, NewEvent, OpenStream, Proposed, StreamMeta, SyncPolicy,
};
use cursorlog_replication::{
    ClientOptions, ClusterTiming, NodeId, NodeOptions, RaftNode, RaftService, ReplicatedNode,
    SnapshotSpool,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

/// The bound of any one wait on a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(60);

struct Running {
    node: ReplicatedNode,
    stop_server: oneshot::Sender<()>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop_server.send(());
        let _ = tokio::time::timeout(WAIT, self.server).await;
        self.node.shutdown().await.expect("the engine closes");
    }
}

fn timing() -> ClusterTiming {
    // Short timeouts keep the test fast; still well above a loaded machine's hiccups.
    ClusterTiming {
        heartbeat: Duration::from_millis(100),
        election_min: Duration::from_millis(600),
        election_max: Duration::from_millis(1200),
        ..ClusterTiming::default()
    }
}

fn engine_config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.sync = SyncPolicy::Always;
    c.segment_bytes_max = 64 * 1024;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c
}

async fn start(
    id: NodeId,
    dir: &Path,
    listener: TcpListener,
    members: &BTreeMap<NodeId, RaftNode>,
) -> Running {
    let node = ReplicatedNode::start(NodeOptions {
        id,
        engine: engine_config(dir),
        members: members.clone(),
        timing: timing(),
        client: ClientOptions::new(),
        request_timeout: Duration::from_secs(10),
    })
    .await
    .expect("the node starts");
    let service = RaftService::new(node.raft().clone(), SnapshotSpool::default()).into_server();
    let (stop_server, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    Running {
        node,
        stop_server,
        server,
    }
}

/// Waits until `node` knows a leader that a quorum acknowledged, other than `not`.
async fn leader_of(nodes: &BTreeMap<NodeId, Running>, not: Option<NodeId>) -> NodeId {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        for (id, r) in nodes {
            let s = r.node.status();
            if s.role == "leader" && Some(*id) != not && r.node.linearizable().await.is_ok() {
                return *id;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a blocking engine call off the runtime's workers.
async fn blocking<T: Send + 'static>(
    engine: &Engine,
    f: impl FnOnce(&Engine) -> T + Send + 'static,
) -> T {
    let e = engine.clone();
    tokio::task::spawn_blocking(move || f(&e)).await.unwrap()
}

/// Waits until every node applied at least what `leader` applied, then returns each node's
/// streams and the events of each stream.
async fn converged(nodes: &BTreeMap<NodeId, Running>, leader: NodeId) -> Vec<String> {
    let target = nodes[&leader].node.status().last_applied;
    let deadline = tokio::time::Instant::now() + WAIT;
    for r in nodes.values() {
        while r.node.status().last_applied < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a node did not catch up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut out = Vec::new();
    for r in nodes.values() {
        out.push(
            blocking(r.node.engine(), |e| {
                let mut text = String::new();
                let mut streams: Vec<StreamMeta> = e.streams().unwrap();
                streams.sort_by_key(|s| s.id);
                for s in streams {
                    let events = e.read(&s.session, s.id, 0, 1000).unwrap();
                    text.push_str(&format!("{s:?} {events:?}\n"));
                }
                text
            })
            .await,
        );
    }
    out
}

fn batch(stream: u64, first: u64, n: u64) -> Append {
    Append {
        session: "s".into(),
        stream,
        expected_next_seq: Some(first),
        events: (first..first + n)
            .map(|i| NewEvent::new("progress", format!("event {i}").into_bytes()))
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_serve_the_same_log_through_a_leader_change_and_a_restart() {
    let dirs: BTreeMap<NodeId, tempfile::TempDir> = (1..=3)
        .map(|id| (id, tempfile::tempdir().unwrap()))
        .collect();
    let mut listeners = BTreeMap::new();
    let mut members = BTreeMap::new();
    for id in 1..=3 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        members.insert(id, RaftNode::new(l.local_addr().unwrap().to_string()));
        listeners.insert(id, l);
    }
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        nodes.insert(id, start(id, dirs[&id].path(), l, &members).await);
    }
    let leader = leader_of(&nodes, None).await;
    let engine = nodes[&leader].node.engine().clone();
    let stream = blocking(&engine, |e| {
        let s = e.open_session("s").unwrap();
        let st = e
            .open_stream(OpenStream {
                session: "s".into(),
                epoch: s.epoch,
                correlation: Some("req-1".into()),
                lease_ms: None,
            })
            .unwrap();
        e.append(batch(st.stream, 1, 4)).unwrap();
        e.append(batch(st.stream, 5, 4)).unwrap();
        // A retry of an acknowledged batch is answered with the same seqs, not appended.
        e.append(batch(st.stream, 5, 4)).unwrap();
        st.stream
    })
    .await;

    // A follower refuses writes and names the leader.
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    let refused = blocking(nodes[&follower].node.engine(), |e| e.open_session("t")).await;
    match refused {
        Err(Error::NotLeader { leader: Some(addr) }) => {
            assert_eq!(addr, members[&leader].addr);
        }
        other => panic!("a follower must answer NotLeader with the leader: {other:?}"),
    }
    assert!(matches!(
        nodes[&follower].node.linearizable().await,
        Err(Proposed::NotLeader { .. })
    ));

    let views = converged(&nodes, leader).await;
    assert!(views[0].contains("head: 8"), "{}", views[0]);
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");

    // The leader goes away: another is elected and continues the same stream.
    drop(engine);
    let old = nodes.remove(&leader).unwrap();
    old.stop().await;
    let new_leader = leader_of(&nodes, Some(leader)).await;
    let engine = nodes[&new_leader].node.engine().clone();
    blocking(&engine, move |e| {
        e.append(batch(stream, 9, 4)).unwrap();
        e.complete(
            "s",
            stream,
            Some(13),
            NewEvent::new("result", b"done".to_vec()),
        )
        .unwrap();
    })
    .await;

    // The old leader restarts on its directory and catches up.
    let l = TcpListener::bind(&members[&leader].addr).await.unwrap();
    nodes.insert(
        leader,
        start(leader, dirs[&leader].path(), l, &members).await,
    );
    let views = converged(&nodes, new_leader).await;
    assert!(
        views[0].contains("head: 13") && views[0].contains("Completed"),
        "{}",
        views[0]
    );
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");

    // A follower's directory is wiped: restarted empty, it is sent the whole log again.
    let wiped = *nodes.keys().find(|id| **id != new_leader).unwrap();
    nodes.remove(&wiped).unwrap().stop().await;
    std::fs::remove_dir_all(dirs[&wiped].path()).unwrap();
    std::fs::create_dir_all(dirs[&wiped].path()).unwrap();
    let l = TcpListener::bind(&members[&wiped].addr).await.unwrap();
    nodes.insert(wiped, start(wiped, dirs[&wiped].path(), l, &members).await);
    let engine = nodes[&new_leader].node.engine().clone();
    blocking(&engine, |e| {
        e.open_session("after-wipe").unwrap();
    })
    .await;
    let views = converged(&nodes, new_leader).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");
    for (_, r) in nodes {
        r.stop().await;
    }
}
