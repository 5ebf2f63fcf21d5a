//! Catch-up by snapshot (issue 19 item 4): the leader snapshots and purges its log, a
//! follower's directory is wiped, and the restarted follower can only catch up from the
//! snapshot (the segment files, streamed): it then holds byte-identical events, continues
//! the log at the same LSNs (stream ids), and serves as leader.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cursorlog_engine::{Append, Config, Engine, NewEvent, OpenStream, StreamMeta, SyncPolicy};
use cursorlog_replication::{
    snapshot, ClientOptions, ClusterTiming, NodeId, NodeOptions, RaftNode, RaftService,
    ReplicatedNode, SnapshotSpool,
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

/// [`converged`], until every member serves the same (a follower's status may report an
/// entry applied a moment before its reads see it).
async fn agreed(nodes: &BTreeMap<NodeId, Running>, leader: NodeId) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let views = converged(nodes, leader).await;
        if views.iter().all(|v| v == &views[0]) || tokio::time::Instant::now() > deadline {
            return views;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    // About 300 KiB: several sealed 64 KiB segments.
    let first = blocking(&engine, |e| workload(e, "before", 300)).await;
    let views = agreed(&nodes, leader).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");

    // The follower with the highest id (never the cluster's initializer) goes away and is
    // wiped; meanwhile the leader writes more, snapshots and purges its log.
    let wiped = *nodes.keys().rev().find(|id| **id != leader).unwrap();
    nodes.remove(&wiped).unwrap().stop().await;
    std::fs::remove_dir_all(dirs[&wiped].path()).unwrap();
    std::fs::create_dir_all(dirs[&wiped].path()).unwrap();
    blocking(&engine, move |e| {
        e.append(batch(first, 301, 5)).unwrap();
    })
    .await;
    let raft = nodes[&leader].node.raft().clone();
    raft.trigger().snapshot().await.unwrap();
    let snap = raft
        .wait(Some(WAIT))
        .metrics(|m| m.snapshot.is_some(), "a snapshot is built")
        .await
        .expect("the leader builds a snapshot");
    let upto = snap.snapshot.unwrap().index();
    raft.trigger().purge_log(upto).await.unwrap();
    raft.wait(Some(WAIT))
        .metrics(
            |m| m.purged.is_some_and(|p| p.index() >= upto),
            "the log is purged",
        )
        .await
        .expect("the leader purges its log");
    let received_before = snapshot::bytes_received();

    // The wiped follower restarts: entries below the purge are no longer sent as entries,
    // so it is sent the snapshot, then the log after it.
    let l = TcpListener::bind(&members[&wiped].addr).await.unwrap();
    nodes.insert(wiped, start(wiped, dirs[&wiped].path(), l, &members).await);
    let second = blocking(&engine, |e| workload(e, "after", 20)).await;
    let views = agreed(&nodes, leader).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");
    assert!(views[0].contains("head: 305"), "{}", views[0]);
    assert!(
        snapshot::bytes_received() > received_before + 300 * 1024,
        "the follower was sent the segment files ({} bytes received)",
        snapshot::bytes_received() - received_before
    );
    assert!(snapshot::bytes_sent() >= snapshot::bytes_received());
    let wiped_log = nodes[&wiped].node.engine().entry_log().unwrap().clone();
    let leader_log = nodes[&leader].node.engine().entry_log().unwrap().clone();
    assert_eq!(wiped_log.next_lsn(), leader_log.next_lsn(), "same LSNs");

    // The caught-up member leads: its writes (stream ids predicted from its own log's
    // LSNs, checked by every member's apply) succeed and every member agrees.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let current = leader_of(&nodes, None).await;
        if current == wiped {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{wiped} never led");
        let raft = nodes[&current].node.raft().clone();
        raft.trigger().transfer_leader(wiped).await.unwrap();
        let _ = raft
            .wait(Some(Duration::from_secs(5)))
            .metrics(|m| m.current_leader != Some(current), "leadership moves")
            .await;
    }
    let engine = nodes[&wiped].node.engine().clone();
    let third = blocking(&engine, move |e| {
        e.append(batch(second, 21, 3)).unwrap();
        workload(e, "on the caught-up leader", 5)
    })
    .await;
    assert!(third > second);
    let views = agreed(&nodes, wiped).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");
    // Verdicts: every member's outcome for each correlation is the same stream.
    for (correlation, stream) in [("before", first), ("after", second)] {
        for r in nodes.values() {
            let got = blocking(r.node.engine(), move |e| {
                e.outcome("s", correlation).unwrap().map(|o| o.stream)
            })
            .await;
            assert_eq!(got, Some(stream), "{correlation}");
        }
    }
    for (_, r) in nodes {
        r.stop().await;
    }
}
