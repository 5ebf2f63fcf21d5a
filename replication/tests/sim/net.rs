//! The in-process network: a node's RPC to a peer calls the peer's [`Raft`] handle directly.
//!
//! A partition is a set of cut *directed* links: `(a, b)` cut means the calls `a` starts
//! towards `b` fail with `Unreachable` (a call whose link is cut while it is in flight loses
//! its reply too); calls `b` starts towards `a` still go through, replies included. So
//! cutting `leader → others` silences the leader's heartbeats while the others' votes still
//! reach it (it learns the new term and steps down), and cutting both ways isolates it
//! (it stays leader of its own term, its writes never commit, until the cut heals).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cursorlog_replication::{NodeId, Raft, RaftNode, TypeConfig, Vote};
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::SnapshotOf;

use crate::support::MemStateMachine;

/// A node's Raft handle.
pub type SimRaft = Raft<MemStateMachine>;

#[derive(Default)]
struct Inner {
    /// The running nodes.
    nodes: BTreeMap<NodeId, SimRaft>,
    /// Cut directed links `(from, to)`.
    cut: BTreeSet<(NodeId, NodeId)>,
}

/// The network shared by all nodes of one simulated cluster.
#[derive(Clone, Default)]
pub struct Net(Arc<Mutex<Inner>>);

impl Net {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Node `id` is up: calls to it reach `raft`.
    pub fn register(&self, id: NodeId, raft: SimRaft) {
        self.lock().nodes.insert(id, raft);
    }

    /// Node `id` is down: calls to it are `Unreachable`.
    pub fn unregister(&self, id: NodeId) {
        self.lock().nodes.remove(&id);
    }

    /// The handle of node `id` if it is up.
    pub fn raft(&self, id: NodeId) -> Option<SimRaft> {
        self.lock().nodes.get(&id).cloned()
    }

    /// The running nodes' ids.
    pub fn up(&self) -> Vec<NodeId> {
        self.lock().nodes.keys().copied().collect()
    }

    /// Cuts the directed link `from → to`.
    pub fn cut(&self, from: NodeId, to: NodeId) {
        self.lock().cut.insert((from, to));
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.lock().cut.clear();
    }

    /// The factory of node `id`'s links.
    pub fn factory(&self, id: NodeId) -> NetFactory {
        NetFactory {
            from: id,
            net: self.clone(),
        }
    }

    /// The target's handle, unless the link is cut or the target is down.
    fn route(&self, from: NodeId, to: NodeId) -> Result<SimRaft, Unreachable<TypeConfig>> {
        let inner = self.lock();
        if inner.cut.contains(&(from, to)) {
            return Err(Unreachable::from_string(format!(
                "link {from} -> {to} is cut"
            )));
        }
        inner
            .nodes
            .get(&to)
            .cloned()
            .ok_or_else(|| Unreachable::from_string(format!("node {to} is down")))
    }

    /// Whether a reply of `to` to a call `from` started still arrives (the link was not cut
    /// while the call was in flight).
    fn delivered(&self, from: NodeId, to: NodeId) -> Result<(), Unreachable<TypeConfig>> {
        if self.lock().cut.contains(&(from, to)) {
            return Err(Unreachable::from_string(format!(
                "link {from} -> {to} was cut in flight"
            )));
        }
        Ok(())
    }
}

/// Makes node `from`'s link to each peer.
pub struct NetFactory {
    from: NodeId,
    net: Net,
}

impl RaftNetworkFactory<TypeConfig> for NetFactory {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &RaftNode) -> Self::Network {
        Link {
            from: self.from,
            to: target,
            net: self.net.clone(),
        }
    }
}

/// Node `from`'s link to node `to`.
pub struct Link {
    from: NodeId,
    to: NodeId,
    net: Net,
}

impl Link {
    /// Runs `call` on the target's handle, bounded by the call's hard deadline; any failure
    /// of the target (stopped, fatal) reads as `Unreachable`, as a dead process would.
    async fn call<T, E, F, Fut>(
        &self,
        option: &RPCOption,
        call: F,
    ) -> Result<T, Unreachable<TypeConfig>>
    where
        F: FnOnce(SimRaft) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::error::Error + 'static,
    {
        let raft = self.net.route(self.from, self.to)?;
        let reply = tokio::time::timeout(option.hard_ttl(), call(raft))
            .await
            .map_err(|_| {
                Unreachable::from_string(format!("{} -> {} timed out", self.from, self.to))
            })?
            .map_err(|e| Unreachable::new(&e))?;
        self.net.delivered(self.from, self.to)?;
        Ok(reply)
    }
}

impl RaftNetworkV2<TypeConfig> for Link {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(
            &option,
            |raft| async move { raft.append_entries(rpc).await },
        )
        .await
        .map_err(RPCError::Unreachable)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(&option, |raft| async move { raft.vote(rpc).await })
            .await
            .map_err(RPCError::Unreachable)
    }

    /// Forwarded (the trait's default grants without asking, turning pre-vote off).
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(&option, |raft| async move { raft.pre_vote(rpc).await })
            .await
            .map_err(RPCError::Unreachable)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: SnapshotOf<TypeConfig, Cursor<Vec<u8>>>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let install = self.call(&option, |raft| async move {
            raft.install_full_snapshot(vote, snapshot).await
        });
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            reply = install => reply.map_err(StreamingError::Unreachable),
        }
    }
}
