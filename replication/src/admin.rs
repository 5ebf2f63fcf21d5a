//! `cursorlog.raft.v1.ClusterAdmin`: a member's status and membership changes, for the
//! `cursorlog cluster …` commands. Served by every member beside the Raft service; changes
//! are carried out by the leader (a follower answers `UNAVAILABLE` naming it).

use std::collections::{BTreeMap, BTreeSet};

use cursorlog_proto::raft_v1::cluster_admin_server::{ClusterAdmin, ClusterAdminServer};
use cursorlog_proto::raft_v1::{
    AddLearnerRequest, InitRequest, MemberStatus, MembersRequest, StatusRequest,
};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::ChangeMembers;
use tonic::{Request, Response, Status};

use crate::node::{NodeStatus, ReplicatedNode};
use crate::types::{NodeId, RaftNode};

/// The admin service of one member.
#[derive(Debug, Clone)]
pub struct AdminService {
    node: ReplicatedNode,
    founders: BTreeMap<NodeId, RaftNode>,
}

impl AdminService {
    /// The admin service of `node`; `Init` forms a cluster of `founders` (the member's
    /// `--peers`).
    pub fn new(node: ReplicatedNode, founders: BTreeMap<NodeId, RaftNode>) -> Self {
        Self { node, founders }
    }

    /// The tonic server.
    pub fn into_server(self) -> ClusterAdminServer<Self> {
        ClusterAdminServer::new(self)
    }

    fn status(&self) -> MemberStatus {
        MemberStatus {
            cluster_id: self
                .node
                .identity()
                .current()
                .map(|c| c.to_string())
                .unwrap_or_default(),
            ..member_status(&self.node.status())
        }
    }
}

/// The wire form of a member's status.
pub fn member_status(s: &NodeStatus) -> MemberStatus {
    MemberStatus {
        node_id: s.id,
        role: s.role.to_owned(),
        term: s.term,
        leader_id: s.leader.as_ref().map_or(0, |(id, _)| *id),
        leader_addr: s
            .leader
            .as_ref()
            .map(|(_, a)| a.clone())
            .unwrap_or_default(),
        last_log_index: s.last_log_index,
        committed_index: s.committed,
        applied_index: s.last_applied,
        voters: s.voters.clone().into_iter().collect(),
        learners: s.learners.clone().into_iter().collect(),
        lag: s.lag.clone().into_iter().collect(),
        cluster_id: String::new(),
    }
}

/// The status for a membership change openraft refused.
fn refused(
    err: &RaftError<crate::types::TypeConfig, ClientWriteError<crate::types::TypeConfig>>,
) -> Status {
    match err {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            let mut status = Status::unavailable(match &f.leader_node {
                Some(n) => format!("this member is not the leader: send membership changes to {n}"),
                None => "this member is not the leader and knows of none: retry shortly".into(),
            });
            if let Some(value) = f.leader_node.as_ref().and_then(|n| n.addr.parse().ok()) {
                status.metadata_mut().insert("cursorlog-leader", value);
            }
            status
        }
        RaftError::APIError(e) => Status::failed_precondition(e.to_string()),
        RaftError::Fatal(e) => Status::unavailable(format!("the raft node stopped: {e}")),
    }
}

fn ids(request: MembersRequest) -> Result<BTreeSet<NodeId>, Status> {
    let ids: BTreeSet<NodeId> = request.node_ids.into_iter().collect();
    if ids.is_empty() || ids.contains(&0) {
        return Err(Status::invalid_argument(
            "node_ids must name at least one member, each a whole number from 1",
        ));
    }
    Ok(ids)
}

#[tonic::async_trait]
impl ClusterAdmin for AdminService {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<MemberStatus>, Status> {
        Ok(Response::new(self.status()))
    }

    async fn add_learner(
        &self,
        request: Request<AddLearnerRequest>,
    ) -> Result<Response<MemberStatus>, Status> {
        let r = request.into_inner();
        if r.node_id == 0 || r.addr.rsplit_once(':').is_none() {
            return Err(Status::invalid_argument(
                "node_id must be a whole number from 1 and addr HOST:PORT",
            ));
        }
        tracing::info!(node = r.node_id, addr = %r.addr, "adding a learner");
        self.node
            .raft()
            .add_learner(r.node_id, RaftNode::new(r.addr), true)
            .await
            .map_err(|e| refused(&e))?;
        Ok(Response::new(self.status()))
    }

    async fn promote(
        &self,
        request: Request<MembersRequest>,
    ) -> Result<Response<MemberStatus>, Status> {
        let ids = ids(request.into_inner())?;
        tracing::info!(?ids, "promoting learners to voters");
        self.node
            .raft()
            .change_membership(ChangeMembers::AddVoterIds(ids), false)
            .await
            .map_err(|e| refused(&e))?;
        Ok(Response::new(self.status()))
    }

    async fn remove(
        &self,
        request: Request<MembersRequest>,
    ) -> Result<Response<MemberStatus>, Status> {
        let ids = ids(request.into_inner())?;
        tracing::info!(?ids, "removing members");
        let status = self.node.status();
        let voters: BTreeSet<NodeId> = ids
            .iter()
            .copied()
            .filter(|id| status.voters.contains_key(id))
            .collect();
        let raft = self.node.raft();
        if !voters.is_empty() {
            raft.change_membership(ChangeMembers::RemoveVoters(voters), false)
                .await
                .map_err(|e| refused(&e))?;
        }
        let learners: BTreeSet<NodeId> = ids
            .iter()
            .copied()
            .filter(|id| status.learners.contains_key(id))
            .collect();
        if !learners.is_empty() {
            raft.change_membership(ChangeMembers::RemoveNodes(learners), false)
                .await
                .map_err(|e| refused(&e))?;
        }
        Ok(Response::new(self.status()))
    }

    async fn init(&self, _: Request<InitRequest>) -> Result<Response<MemberStatus>, Status> {
        if self.founders.is_empty() {
            return Err(Status::failed_precondition(
                "this member was started without --peers: it has no members to form a cluster with",
            ));
        }
        // Whatever is unreachable, a peer that answers with a formed log may hold the
        // cluster's only copy: forming beside it would make a second cluster (review R1).
        // (A member holding a log is answered "already formed" by `initialize` below.)
        let empty = self.node.status().last_log_index.is_none();
        let answers = if empty {
            crate::formation::probe(self.node.id(), &self.founders, self.node.client()).await
        } else {
            Vec::new()
        };
        if let crate::formation::Verdict::Joins(peer, addr, last, cluster, _) =
            crate::formation::verdict(&answers)
        {
            return Err(Status::failed_precondition(format!(
                "member {peer} ({addr}) holds a formed log (cluster {cluster}, up to index \
                 {last}): not forming a second cluster beside it; if that cluster lost its \
                 quorum, see `cursorlog cluster force-new` (README, \"Recovery\")"
            )));
        }
        tracing::info!(members = ?self.founders, "forming the cluster (cluster init)");
        // A new cluster gets a new random identity; a member that already has one keeps it,
        // and `initialize` below refuses a second formation anyway.
        let identity = self.node.identity();
        if identity.current().is_none() {
            identity
                .establish(crate::identity::ClusterId::random())
                .map_err(|e| {
                    Status::unavailable(format!("cannot save the cluster identity: {e}"))
                })?;
        }
        match self.node.raft().initialize(self.founders.clone()).await {
            Ok(()) => Ok(Response::new(self.status())),
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                Err(Status::failed_precondition(format!(
                    "the cluster is already formed (this member's log or vote says so: {e}); \
                     nothing to do"
                )))
            }
            Err(RaftError::APIError(e)) => Err(Status::invalid_argument(e.to_string())),
            Err(RaftError::Fatal(e)) => {
                Err(Status::unavailable(format!("the raft node stopped: {e}")))
            }
        }
    }
}
