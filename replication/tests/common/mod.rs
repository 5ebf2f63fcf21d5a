//! The in-process cluster harness of the replicated-node tests: three [`ReplicatedNode`]
//! members, each on its own temp directory and 127.0.0.1 listener, serving the Raft service
//! over loopback gRPC; and [`serve`], the server task every test node runs (also the
//! transport tests' openraft nodes).
//!
//! Not to be confused with `tests/support/`, the in-memory Raft storage fixture.
//!
//! Each test crate uses part of this module: include it with `#[allow(dead_code)] mod common;`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cursorlog_engine::{Append, Config, Engine, NewEvent, StreamMeta, SyncPolicy};
use cursorlog_replication::{
    ClientOptions, ClusterTiming, NodeId, NodeOptions, RaftNode, RaftService, ReplicatedNode,
    SnapshotSpool, StartError,
};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

/// The bound of any one wait on a loaded 2-core machine.
pub const WAIT: Duration = Duration::from_secs(60);

/// The engine's segment size the tests use unless they measure (several segments from a few
/// hundred KiB).
pub const SEGMENT_BYTES: u64 = 64 * 1024;

/// A gRPC server task, stopped by sending on (or dropping) its sender.
pub type Server = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), tonic::transport::Error>>,
);

/// Serves `routes` on `listener` until the returned sender is sent to or dropped.
pub fn serve(routes: tonic::service::Routes, listener: TcpListener) -> Server {
    let (stop_server, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    (stop_server, server)
}

/// A running member: its node and the server of its Raft service.
pub struct Running {
    pub node: ReplicatedNode,
    /// Ends the Raft service's open `StreamAppend` calls (the server drains calls first).
    shutdown: tokio::sync::watch::Sender<bool>,
    stop_server: oneshot::Sender<()>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    /// Stops the server, then the node.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
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

/// Changes a member's engine config beyond the harness's (e.g. retention limits).
pub type Configure = fn(&mut Config);

fn engine_config(dir: &Path, segment_bytes: u64, configure: Configure) -> Config {
    let mut c = Config::new(dir);
    c.sync = SyncPolicy::Always;
    c.segment_bytes_max = segment_bytes;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    configure(&mut c);
    c
}

async fn start(
    id: NodeId,
    dir: &Path,
    segment_bytes: u64,
    configure: Configure,
    listener: TcpListener,
    members: &BTreeMap<NodeId, RaftNode>,
) -> Running {
    // A member restarted in the same process may find its directory still locked for a
    // moment: the stopped server's connection tasks drop their handles to the old node (and
    // so its log) only as they wind down. The lock's release is the event waited for.
    let deadline = tokio::time::Instant::now() + WAIT;
    let node = loop {
        let started = ReplicatedNode::start(NodeOptions {
            id,
            engine: engine_config(dir, segment_bytes, configure),
            members: members.clone(),
            timing: timing(),
            client: ClientOptions::new(),
            request_timeout: Duration::from_secs(10),
            snapshots: cursorlog_replication::SnapshotPolicy::default(),
            file_system: std::sync::Arc::new(cursorlog_engine::StdFs),
        })
        .await;
        match started {
            Err(StartError::Engine(cursorlog_engine::Error::Locked { .. }))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other.expect("the node starts"),
        }
    };
    let (shutdown, down) = tokio::sync::watch::channel(false);
    let service = RaftService::new(node.raft().clone(), SnapshotSpool::default())
        .with_shutdown(down)
        .into_server();
    // The admin service too: a member with an empty log asks its peers' status before it
    // forms the cluster (`formation.rs`).
    let admin = cursorlog_replication::AdminService::new(node.clone(), members.clone());
    let routes = tonic::service::Routes::new(service).add_service(admin.into_server());
    let (stop_server, server) = serve(routes, listener);
    Running {
        node,
        shutdown,
        stop_server,
        server,
    }
}

/// Three members (ids 1 to 3): their directories, addresses and running nodes.
pub struct Cluster {
    pub dirs: BTreeMap<NodeId, TempDir>,
    pub members: BTreeMap<NodeId, RaftNode>,
    pub nodes: BTreeMap<NodeId, Running>,
    segment_bytes: u64,
    configure: Configure,
}

impl Cluster {
    /// Starts three members whose engines write segments of `segment_bytes`.
    pub async fn start(segment_bytes: u64) -> Self {
        Self::start_with(segment_bytes, |_| {}).await
    }

    /// [`Cluster::start`], each member's engine config changed by `configure` (at every
    /// start of it).
    pub async fn start_with(segment_bytes: u64, configure: Configure) -> Self {
        let dirs: BTreeMap<NodeId, TempDir> = (1..=3)
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
            nodes.insert(
                id,
                start(id, dirs[&id].path(), segment_bytes, configure, l, &members).await,
            );
        }
        Self {
            dirs,
            members,
            nodes,
            segment_bytes,
            configure,
        }
    }

    /// The running member with the highest id other than `leader` (never the cluster's
    /// initializer, member 1).
    pub fn highest_follower(&self, leader: NodeId) -> NodeId {
        *self.nodes.keys().rev().find(|id| **id != leader).unwrap()
    }

    /// Starts member `id` again, on its address and its directory as it is now.
    pub async fn restart(&mut self, id: NodeId) {
        let l = TcpListener::bind(&self.members[&id].addr).await.unwrap();
        let dir = self.dirs[&id].path();
        let running = start(
            id,
            dir,
            self.segment_bytes,
            self.configure,
            l,
            &self.members,
        )
        .await;
        self.nodes.insert(id, running);
    }

    /// Stops member `id` and empties its directory (start it again with [`Cluster::restart`]).
    pub async fn wipe(&mut self, id: NodeId) {
        self.nodes.remove(&id).unwrap().stop().await;
        std::fs::remove_dir_all(self.dirs[&id].path()).unwrap();
        std::fs::create_dir_all(self.dirs[&id].path()).unwrap();
    }

    /// Waits until a member other than `not` leads with a quorum's acknowledgement.
    pub async fn leader(&self, not: Option<NodeId>) -> NodeId {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            for (id, r) in &self.nodes {
                let s = r.node.status();
                if s.role == "leader" && Some(*id) != not && r.node.linearizable().await.is_ok() {
                    return *id;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader elected");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every running member applied at least what `leader` applied, then
    /// returns each member's streams and the events of each stream.
    pub async fn converged(&self, leader: NodeId) -> Vec<String> {
        let target = self.nodes[&leader].node.status().last_applied;
        let deadline = tokio::time::Instant::now() + WAIT;
        for r in self.nodes.values() {
            while r.node.status().last_applied < target {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "a node did not catch up"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let mut out = Vec::new();
        for r in self.nodes.values() {
            out.push(
                blocking(r.node.engine(), |e| {
                    let mut text = String::new();
                    let mut streams: Vec<StreamMeta> = e.streams().unwrap();
                    streams.sort_by_key(|s| s.id);
                    for s in streams {
                        // From the watermark: retention may have evicted the events before.
                        let events = e.read(&s.session, s.id, s.watermark - 1, 1000).unwrap();
                        let seen = (
                            &events.events,
                            events.head,
                            events.state,
                            events.end_of_stream,
                        );
                        text.push_str(&format!("{s:?} {seen:?}\n"));
                    }
                    text
                })
                .await,
            );
        }
        out
    }

    /// [`Cluster::converged`], until every member serves the same (a follower's status may
    /// report an entry applied a moment before its reads see it).
    pub async fn agreed(&self, leader: NodeId) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let views = self.converged(leader).await;
            if views.iter().all(|v| v == &views[0]) || tokio::time::Instant::now() > deadline {
                return views;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Has member `id` build a snapshot and purge its log up to it, waiting for both.
    pub async fn snapshot_and_purge(&self, id: NodeId) {
        let raft = self.nodes[&id].node.raft().clone();
        raft.trigger().snapshot().await.unwrap();
        let snap = raft
            .wait(Some(WAIT))
            .metrics(|m| m.snapshot.is_some(), "a snapshot is built")
            .await
            .expect("the member builds a snapshot");
        let upto = snap.snapshot.unwrap().index();
        raft.trigger().purge_log(upto).await.unwrap();
        raft.wait(Some(WAIT))
            .metrics(
                |m| m.purged.is_some_and(|p| p.index() >= upto),
                "the log is purged",
            )
            .await
            .expect("the member purges its log");
    }

    /// Stops every running member.
    pub async fn stop(self) {
        for (_, r) in self.nodes {
            r.stop().await;
        }
    }
}

/// Runs a blocking engine call off the runtime's workers.
pub async fn blocking<T: Send + 'static>(
    engine: &Engine,
    f: impl FnOnce(&Engine) -> T + Send + 'static,
) -> T {
    let e = engine.clone();
    tokio::task::spawn_blocking(move || f(&e)).await.unwrap()
}

/// An append to `stream` of session "s": `n` "progress" events from seq `first`.
pub fn batch(stream: u64, first: u64, n: u64) -> Append {
    Append {
        session: "s".into(),
        stream,
        expected_next_seq: Some(first),
        events: (first..first + n)
            .map(|i| NewEvent::new("progress", format!("event {i}").into_bytes()))
            .collect(),
    }
}
