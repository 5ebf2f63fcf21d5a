//! The server side of the Raft transport: [`RaftService`] implements the generated
//! `cursorlog.raft.v1.Raft` service by decoding each request and handing it to the local
//! [`openraft::Raft`] handle.
//!
//! It is a plain tonic service: the server adds [`RaftService::into_server`] to its `Router`
//! next to the client API, behind the same bearer-token interceptor
//! (`RaftServer::with_interceptor`, or `InterceptedService`) and the same TLS; peers send
//! the token through [`ClientOptions::with_token`](crate::ClientOptions::with_token).
//!
//! Statuses: a request that does not decode is `INVALID_ARGUMENT`; a local node that has
//! stopped (openraft's `Fatal`) is `UNAVAILABLE`; a snapshot stream that ends before its
//! done chunk, or has no head, is `INVALID_ARGUMENT` and installs nothing.

use std::future::Future;
use std::io;
use std::sync::Arc;

use cursorlog_proto::raft_v1::raft_server::{Raft as RaftRpc, RaftServer};
use cursorlog_proto::raft_v1::{RaftReply, RaftRequest, SnapshotChunk};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, TransferLeaderRequest, VoteRequest,
};
use openraft::storage::RaftStateMachine;
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tonic::{Request, Response, Status, Streaming};

use crate::amnesia::VoteGuard;
use crate::codec::{self, CodecError, SnapshotHead};
use crate::identity::ClusterIdentity;
use crate::network::DEFAULT_MAX_MESSAGE_BYTES;
use crate::types::{Raft, TypeConfig};

/// Where a received snapshot's bytes go, and how they become the state machine's snapshot
/// data `SD`. The transport streams bytes; the store decides whether they land in memory or in
/// files.
pub trait SnapshotSink<SD>: Send + Sync + 'static {
    /// What the bytes are written to while they arrive.
    type Writer: AsyncWrite + Unpin + Send;

    /// Starts receiving the snapshot described by `meta`.
    fn begin(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
    ) -> impl Future<Output = io::Result<Self::Writer>> + Send;

    /// All bytes were written (and the writer flushed): the snapshot data to install.
    fn finish(&self, writer: Self::Writer) -> impl Future<Output = io::Result<SD>> + Send;
}

/// Snapshots received into memory, as `std::io::Cursor<Vec<u8>>` (openraft's in-memory
/// stores use this type).
#[derive(Debug, Clone, Copy, Default)]
pub struct InMemorySnapshots;

impl SnapshotSink<io::Cursor<Vec<u8>>> for InMemorySnapshots {
    type Writer = Vec<u8>;

    async fn begin(&self, _meta: &SnapshotMetaOf<TypeConfig>) -> io::Result<Vec<u8>> {
        Ok(Vec::new())
    }

    async fn finish(&self, writer: Vec<u8>) -> io::Result<io::Cursor<Vec<u8>>> {
        Ok(io::Cursor::new(writer))
    }
}

/// The Raft service of one node: decodes requests for its [`Raft`] handle.
pub struct RaftService<SM, K>
where
    SM: RaftStateMachine<TypeConfig>,
{
    raft: Raft<SM>,
    sink: Arc<K>,
    guard: VoteGuard,
    /// This member's cluster identity: requests of another cluster are refused.
    identity: Option<ClusterIdentity>,
}

impl<SM, K> std::fmt::Debug for RaftService<SM, K>
where
    SM: RaftStateMachine<TypeConfig>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftService")
            .field("node", self.raft.node_id())
            .finish()
    }
}

impl<SM, K> RaftService<SM, K>
where
    SM: RaftStateMachine<TypeConfig>,
    K: SnapshotSink<SM::SnapshotData>,
{
    /// The service of `raft`, receiving snapshots through `sink`.
    pub fn new(raft: Raft<SM>, sink: K) -> Self {
        Self {
            raft,
            sink: Arc::new(sink),
            guard: VoteGuard::default(),
            identity: None,
        }
    }

    /// Refuses every request that does not carry `identity` (a member without one adopts
    /// the first presented): see [`crate::identity`].
    pub fn with_identity(mut self, identity: ClusterIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Admits a request of this member's cluster (always, without an identity to check).
    fn admit(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        self.identity
            .as_ref()
            .map_or(Ok(()), |identity| identity.admit(metadata))
    }

    /// Refuses votes and pre-votes as `guard` says (a member that may have lost its vote).
    pub fn with_vote_guard(mut self, guard: VoteGuard) -> Self {
        self.guard = guard;
        self
    }

    /// The tonic server, accepting and sending messages up to
    /// [`DEFAULT_MAX_MESSAGE_BYTES`] (as the client does).
    pub fn into_server(self) -> RaftServer<Self> {
        RaftServer::new(self)
            .max_decoding_message_size(DEFAULT_MAX_MESSAGE_BYTES)
            .max_encoding_message_size(DEFAULT_MAX_MESSAGE_BYTES)
    }

    async fn receive_snapshot(
        &self,
        mut chunks: Streaming<SnapshotChunk>,
    ) -> Result<RaftReply, Status> {
        let first = chunks
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the snapshot stream is empty"))?;
        if first.head.is_empty() {
            return Err(Status::invalid_argument(
                "the snapshot stream does not start with its head",
            ));
        }
        let head: SnapshotHead = codec::decode("SnapshotHead", &first.head).map_err(bad_request)?;
        let mut writer = self.sink.begin(&head.meta).await.map_err(sink_error)?;
        let mut done = first.done;
        if !first.data.is_empty() {
            writer.write_all(&first.data).await.map_err(sink_error)?;
        }
        while !done {
            let chunk = chunks.message().await?.ok_or_else(|| {
                Status::invalid_argument("the snapshot stream ended before its last chunk")
            })?;
            writer.write_all(&chunk.data).await.map_err(sink_error)?;
            done = chunk.done;
        }
        writer.flush().await.map_err(sink_error)?;
        let data = self.sink.finish(writer).await.map_err(sink_error)?;
        let snapshot = SnapshotOf::<TypeConfig, SM::SnapshotData> {
            meta: head.meta,
            snapshot: data,
        };
        let response = self
            .raft
            .install_full_snapshot(head.vote, snapshot)
            .await
            .map_err(stopped)?;
        reply("SnapshotResponse", &response)
    }
}

/// A request that does not decode.
fn bad_request(err: CodecError) -> Status {
    Status::invalid_argument(err.to_string())
}

/// The local node has stopped (openraft's `Fatal`): the peer should back off.
fn stopped(err: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("the raft node cannot serve: {err}"))
}

/// The snapshot store failed to take the bytes.
fn sink_error(err: io::Error) -> Status {
    Status::internal(format!("cannot store the received snapshot: {err}"))
}

/// An encoded reply.
fn reply<T: serde::Serialize>(what: &'static str, value: &T) -> Result<RaftReply, Status> {
    let data = codec::encode(what, value).map_err(|err| Status::internal(err.to_string()))?;
    Ok(RaftReply { data: data.into() })
}

#[tonic::async_trait]
impl<SM, K> RaftRpc for RaftService<SM, K>
where
    SM: RaftStateMachine<TypeConfig>,
    K: SnapshotSink<SM::SnapshotData>,
{
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.admit(request.metadata())?;
        let rpc: AppendEntriesRequest<TypeConfig> =
            codec::decode("AppendEntries", &request.get_ref().data).map_err(bad_request)?;
        let leader_commit = rpc.leader_commit;
        let sent = rpc.entries.last().map(|e| e.log_id.index);
        let sent = sent.or(rpc.prev_log_id.map(|p| p.index));
        let response = self.raft.append_entries(rpc).await.map_err(stopped)?;
        let holds = match &response {
            AppendEntriesResponse::Success => Some(sent),
            AppendEntriesResponse::PartialSuccess(matched) => Some(matched.map(|m| m.index)),
            _ => None,
        };
        if let Some(holds) = holds {
            self.guard.accepted_append(holds, leader_commit);
        }
        reply("AppendEntriesResponse", &response).map(Response::new)
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.admit(request.metadata())?;
        let rpc: VoteRequest<TypeConfig> =
            codec::decode("Vote", &request.get_ref().data).map_err(bad_request)?;
        if let Some(why) = self.guard.refusal(rpc.last_log_id.as_ref()) {
            return Err(Status::unavailable(why));
        }
        let response = self.raft.vote(rpc).await.map_err(stopped)?;
        reply("VoteResponse", &response).map(Response::new)
    }

    async fn pre_vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.admit(request.metadata())?;
        let rpc: VoteRequest<TypeConfig> =
            codec::decode("PreVote", &request.get_ref().data).map_err(bad_request)?;
        if let Some(why) = self.guard.refusal(rpc.last_log_id.as_ref()) {
            return Err(Status::unavailable(why));
        }
        let response = self.raft.pre_vote(rpc).await.map_err(stopped)?;
        reply("VoteResponse", &response).map(Response::new)
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.admit(request.metadata())?;
        let rpc: TransferLeaderRequest<TypeConfig> =
            codec::decode("TransferLeader", &request.get_ref().data).map_err(bad_request)?;
        let response = self
            .raft
            .handle_transfer_leader(rpc)
            .await
            .map_err(stopped)?;
        reply("TransferLeaderResponse", &response).map(Response::new)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        self.admit(request.metadata())?;
        self.receive_snapshot(request.into_inner())
            .await
            .map(Response::new)
    }
}
