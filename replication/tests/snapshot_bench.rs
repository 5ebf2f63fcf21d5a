//! Catch-up time of a wiped member, per GiB (issue 19 item 8; benches/README.md "Catch-up of
//! a wiped member"): by entries (the leader's log whole, AppendEntries batches) and by
//! snapshot (the leader purged: the segment files streamed). Ignored: run in release,
//! `CURSORLOG_CATCHUP_MB` sets the volume (default 256):
//!
//! ```text
//! CURSORLOG_CATCHUP_MB=1024 cargo test --release -p cursorlog-replication \
//!     --test snapshot_bench -- --ignored --nocapture
//! ```

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use cursorlog_engine::{Append, Config, Engine, NewEvent, OpenStream, SyncPolicy};
use cursorlog_replication::{
    snapshot, ClientOptions, ClusterTiming, NodeId, NodeOptions, RaftNode, RaftService,
    ReplicatedNode, SnapshotSpool,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

/// 8 MiB segments (the default 64 MiB would make a small run one segment).
fn segment_bytes() -> u64 {
    8 * 1024 * 1024
}

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
    c.segment_bytes_max = segment_bytes();
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
    // 1 KiB events, 64 per append (64 KiB a request and an entry: openraft's batch of 300
    // entries stays under the transport's 64 MiB message limit; 256 KiB entries exceed it
    // and catch-up by entries stalls, see benches/README.md).
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
    let target = nodes[&leader].node.status().last_applied;
    let log_bytes: u64 = std::fs::read_dir(dirs[&leader].path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let gib = log_bytes as f64 / (1u64 << 30) as f64;
    let wiped = *nodes.keys().rev().find(|id| **id != leader).unwrap();

    // 1. By entries: the leader's log is whole.
    nodes.remove(&wiped).unwrap().stop().await;
    std::fs::remove_dir_all(dirs[&wiped].path()).unwrap();
    std::fs::create_dir_all(dirs[&wiped].path()).unwrap();
    let started = Instant::now();
    let l = TcpListener::bind(&members[&wiped].addr).await.unwrap();
    nodes.insert(wiped, start(wiped, dirs[&wiped].path(), l, &members).await);
    let by_entries = caught_up(&nodes[&wiped].node, target, started).await;

    // 2. By snapshot: the leader snapshots and purges its log, the member is wiped again.
    nodes.remove(&wiped).unwrap().stop().await;
    std::fs::remove_dir_all(dirs[&wiped].path()).unwrap();
    std::fs::create_dir_all(dirs[&wiped].path()).unwrap();
    let raft = nodes[&leader].node.raft().clone();
    raft.trigger().snapshot().await.unwrap();
    let snap = raft
        .wait(Some(WAIT))
        .metrics(|m| m.snapshot.is_some(), "a snapshot")
        .await
        .unwrap();
    let upto = snap.snapshot.unwrap().index();
    raft.trigger().purge_log(upto).await.unwrap();
    raft.wait(Some(WAIT))
        .metrics(|m| m.purged.is_some_and(|p| p.index() >= upto), "purged")
        .await
        .unwrap();
    let received = snapshot::bytes_received();
    let started = Instant::now();
    let l = TcpListener::bind(&members[&wiped].addr).await.unwrap();
    nodes.insert(wiped, start(wiped, dirs[&wiped].path(), l, &members).await);
    let by_snapshot = caught_up(&nodes[&wiped].node, target, started).await;
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
    for (_, r) in nodes {
        r.stop().await;
    }
}
