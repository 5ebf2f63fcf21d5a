//! Benchmark nodes: openraft over the segment log, each serving `cursorlog.raft.v1.Raft` on
//! loopback and dialling its peers through the real gRPC transport ([`NetworkFactory`]),
//! started, stopped and restarted from their own directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use cursorlog_engine::{EntryLog, EntryLogConfig};
use cursorlog_replication::{
    ClientOptions, ClusterTiming, InMemorySnapshots, NetworkFactory, NodeId, Raft, RaftNode,
    RaftService, SegmentLogStore,
};
use openraft::async_runtime::WatchReceiver as _;
use openraft::ServerState;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt as _;

use super::store::{AppendCounts, CountingSm, CountingStore};

/// The bound of any one wait on a cluster (an election on a loaded machine included).
pub const WAIT: Duration = Duration::from_secs(60);

/// Why a benchmark run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The segment log failed.
    #[error("entry log: {0}")]
    Engine(#[from] cursorlog_engine::Error),
    /// A socket or file failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// openraft refused or failed (its errors are generic over the call; kept as text).
    #[error("raft: {0}")]
    Raft(String),
    /// The gRPC server failed.
    #[error("server: {0}")]
    Server(String),
}

/// Shorthand for openraft's many error types.
pub fn raft_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Raft(e.to_string())
}

/// One running node.
pub struct Node {
    /// Its id.
    pub id: NodeId,
    /// Its gRPC address (kept across restarts: the membership names it).
    pub addr: String,
    /// Its log's directory.
    pub dir: PathBuf,
    /// Its Raft handle.
    pub raft: Raft<CountingSm>,
    /// Appends through its log store.
    pub counts: Arc<AppendCounts>,
    /// Ends the Raft service's open `StreamAppend` calls (the server drains calls first).
    shutdown: tokio::sync::watch::Sender<bool>,
    stop_server: oneshot::Sender<()>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Node {
    /// Starts node `id` over the log in `dir` (created or reopened), serving on `addr`
    /// (`127.0.0.1:0` for a fresh port).
    ///
    /// # Errors
    /// The log does not open, the port cannot be bound, openraft refuses the config.
    pub async fn start(
        id: NodeId,
        dir: &Path,
        addr: &str,
        timing: &ClusterTiming,
    ) -> Result<Self, BenchError> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?.to_string();
        let log = EntryLog::open(EntryLogConfig::new(dir))?;
        let counts = Arc::new(AppendCounts::default());
        let store = CountingStore::new(SegmentLogStore::new(log), counts.clone());
        let config = timing.config("raft-append").map_err(raft_err)?;
        let raft = Raft::new(
            id,
            Arc::new(config),
            NetworkFactory::new(id, ClientOptions::new()),
            store,
            CountingSm::default(),
        )
        .await
        .map_err(raft_err)?;
        let (shutdown, down) = tokio::sync::watch::channel(false);
        let service = RaftService::new(raft.clone(), InMemorySnapshots)
            .with_shutdown(down)
            .into_server();
        let (stop_server, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming(listener), async {
                    let _ = stopped.await;
                }),
        );
        Ok(Self {
            id,
            addr,
            dir: dir.to_path_buf(),
            raft,
            counts,
            shutdown,
            stop_server,
            server,
        })
    }

    /// Stops the gRPC server (peers now get refused connections), then the Raft node.
    ///
    /// # Errors
    /// The server or Raft failed while stopping.
    pub async fn stop(self) -> Result<(), BenchError> {
        let _ = self.shutdown.send(true);
        let _ = self.stop_server.send(());
        self.server
            .await
            .map_err(|e| BenchError::Server(e.to_string()))?
            .map_err(|e| BenchError::Server(e.to_string()))?;
        self.raft.shutdown().await.map_err(raft_err)
    }

    /// The term this node is in.
    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow_watched().current_term
    }
}

/// Whether accepted connections get `TCP_NODELAY`, as the server crate's accept loop sets it
/// (`server/src/connections.rs`). Off, a reply waits on Nagle's algorithm for the peer's
/// delayed ACK (~40 ms on Linux): `--server-nagle` measures that.
pub static SERVER_NODELAY: AtomicBool = AtomicBool::new(true);

/// The listener's connections, with [`SERVER_NODELAY`] applied.
fn incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    let nodelay = SERVER_NODELAY.load(Ordering::Relaxed);
    TcpListenerStream::new(listener).map(move |conn| {
        conn.inspect(|s| {
            // Best effort, as the server does: a socket that refuses it still works.
            let _ = s.set_nodelay(nodelay);
        })
    })
}

/// The live nodes' Raft handles, for clients to find the leader while nodes come and go.
#[derive(Default)]
pub struct Router(RwLock<Vec<(NodeId, Raft<CountingSm>)>>);

impl Router {
    /// The node that believes it leads, if any.
    pub fn leader(&self) -> Option<(NodeId, Raft<CountingSm>)> {
        let nodes = self.0.read().unwrap_or_else(|e| e.into_inner());
        nodes
            .iter()
            .find(|(_, r)| r.metrics().borrow_watched().state == ServerState::Leader)
            .cloned()
    }

    fn set(&self, nodes: &[Node]) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) =
            nodes.iter().map(|n| (n.id, n.raft.clone())).collect();
    }
}

/// A cluster of benchmark nodes, each over its own directory under one temporary directory.
pub struct Cluster {
    /// The live nodes.
    pub nodes: Vec<Node>,
    /// Where clients find the leader.
    pub router: Arc<Router>,
    timing: ClusterTiming,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `voters` nodes (ids 1..=voters) under a fresh directory in `root`,
    /// initializes them as one cluster and waits for an agreed leader.
    ///
    /// # Errors
    /// A node does not start, or no leader is agreed within [`WAIT`].
    pub async fn start(
        root: &Path,
        voters: u64,
        timing: ClusterTiming,
    ) -> Result<Self, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("raft-append")
            .tempdir_in(root)?;
        let mut nodes = Vec::new();
        for id in 1..=voters {
            let node_dir = dir.path().join(format!("node-{id}"));
            nodes.push(Node::start(id, &node_dir, "127.0.0.1:0", &timing).await?);
        }
        let members: BTreeMap<NodeId, RaftNode> = nodes
            .iter()
            .map(|n| (n.id, RaftNode::new(&n.addr)))
            .collect();
        nodes[0].raft.initialize(members).await.map_err(raft_err)?;
        let cluster = Self {
            router: Arc::new(Router::default()),
            nodes,
            timing,
            _dir: dir,
        };
        cluster.router.set(&cluster.nodes);
        cluster.agreed_leader(None).await?;
        Ok(cluster)
    }

    /// The node with id `id`, if it is live.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Waits until every live node names the same leader (not `not`) and that leader has
    /// heard from a quorum; returns its id.
    ///
    /// # Errors
    /// No such leader within [`WAIT`].
    pub async fn agreed_leader(&self, not: Option<NodeId>) -> Result<NodeId, BenchError> {
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        let metrics = self.nodes[0]
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
            .map_err(raft_err)?;
        let leader = metrics
            .current_leader
            .ok_or_else(|| BenchError::Raft("the wait returned no leader".into()))?;
        for node in &self.nodes {
            node.raft
                .wait(Some(WAIT))
                .current_leader(leader, "follows the leader")
                .await
                .map_err(raft_err)?;
        }
        if let Some(node) = self.node(leader) {
            node.raft
                .wait(Some(WAIT))
                .leader_with_quorum_acked(None, "the leader's lease")
                .await
                .map_err(raft_err)?;
        }
        Ok(leader)
    }

    /// Kills node `id`: takes it out of the router, stops its server, shuts its Raft down.
    /// Returns where it lived, to restart it.
    ///
    /// # Errors
    /// No such node, or it failed while stopping.
    pub async fn kill(&mut self, id: NodeId) -> Result<(String, PathBuf), BenchError> {
        let at = self
            .nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or_else(|| BenchError::Raft(format!("node {id} is not live")))?;
        let node = self.nodes.remove(at);
        self.router.set(&self.nodes);
        let place = (node.addr.clone(), node.dir.clone());
        node.stop().await?;
        Ok(place)
    }

    /// Restarts node `id` from its directory, on its old address.
    ///
    /// # Errors
    /// It does not start.
    pub async fn restart(&mut self, id: NodeId, addr: &str, dir: &Path) -> Result<(), BenchError> {
        let node = Node::start(id, dir, addr, &self.timing).await?;
        self.nodes.push(node);
        self.router.set(&self.nodes);
        Ok(())
    }

    /// Stops every node.
    ///
    /// # Errors
    /// A node failed while stopping.
    pub async fn stop(self) -> Result<(), BenchError> {
        for node in self.nodes {
            node.stop().await?;
        }
        Ok(())
    }
}
