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

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use cursorlog_proto::raft_v1::raft_server::{Raft as RaftRpc, RaftServer};
use cursorlog_proto::raft_v1::{RaftReply, RaftRequest, SnapshotChunk};
use futures_util::{Stream, StreamExt as _};
use openraft::async_runtime::WatchReceiver as _;
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
use crate::types::{LogId, Raft, TypeConfig};

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

/// How long the member a leader hands its lead to lets openraft wait for the leader's last
/// entry before it campaigns by itself (see `transfer_leader`).
const TRANSFER_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// How long a follower that heard its leader hand the lead to another member leaves that
/// member to win before it campaigns itself (see `campaign_unless_elected`): long enough
/// for a loaded machine's transfer election (a vote round trip and a log sync), so that a
/// transfer the chosen member takes is not contested.
const OTHER_FOLLOWER_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

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
    /// Turns true when the server shuts down: open `StreamAppend` calls then end.
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
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
            shutdown: None,
        }
    }

    /// Refuses every request that does not carry `identity` (a member without one adopts
    /// the first presented): see [`crate::identity`].
    pub fn with_identity(mut self, identity: ClusterIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Whether `rpc` hands the lead to this member from the leader it follows now.
    fn handed_to_me(&self, rpc: &TransferLeaderRequest<TypeConfig>) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        rpc.to_node_id() == self.raft.node_id() && &m.vote == rpc.from_leader()
    }

    /// Whether `rpc` comes from the leader this member follows now.
    fn follows(&self, rpc: &TransferLeaderRequest<TypeConfig>) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        &m.vote == rpc.from_leader()
    }

    /// A follower that heard its leader hand the lead to another member campaigns itself
    /// if, [`OTHER_FOLLOWER_WAIT`] later, no new term began: the chosen member may not
    /// have heard the transfer (its link is cut too), or hold a shorter log than this one,
    /// so that no pre-vote of its can succeed. Waiting first leaves the chosen member the
    /// first try, so the two do not split the vote.
    fn campaign_unless_elected(&self, rpc: TransferLeaderRequest<TypeConfig>) {
        let raft = self.raft.clone();
        tokio::spawn(async move {
            tokio::time::sleep(OTHER_FOLLOWER_WAIT).await;
            let unchanged = {
                let metrics = raft.metrics();
                let m = metrics.borrow_watched();
                &m.vote == rpc.from_leader()
            };
            if unchanged {
                tracing::info!(
                    to = rpc.to_node_id(),
                    "the member the leader handed its lead to was not elected: campaigning"
                );
                let _ = raft.trigger().elect(true).await;
            }
        });
    }

    /// Campaigns (pre-vote first) for the lead `rpc` handed to this member, unless this
    /// member moved on since (it voted in a newer term, or leads).
    ///
    /// First this member lets go of the old leader's lease as every other follower did on
    /// the same transfer (openraft drops it only once the successor's log holds the leader's
    /// last entry): the same transfer, addressed to the old leader itself, does that and
    /// nothing else. Without it openraft skips this member's own pre-vote ("leader lease has
    /// not yet expired") and refuses the other follower's.
    async fn campaign(&self, rpc: &TransferLeaderRequest<TypeConfig>) -> Result<(), Status> {
        if !self.handed_to_me(rpc) {
            return Ok(());
        }
        let old_leader = self.raft.metrics().borrow_watched().current_leader;
        if let Some(old) = old_leader.filter(|id| id != self.raft.node_id()) {
            let release =
                TransferLeaderRequest::new(*rpc.from_leader(), old, rpc.last_log_id().cloned());
            // Refused only if the vote moved on meanwhile; then there is nothing to release.
            let _ = self
                .raft
                .handle_transfer_leader(release)
                .await
                .map_err(stopped)?;
        }
        tracing::info!("the leader handed its lead to this member: campaigning now");
        self.raft.trigger().elect(true).await.map_err(stopped)
    }

    /// Admits a request of this member's cluster (always, without an identity to check).
    fn admit(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        self.identity
            .as_ref()
            .map_or(Ok(()), |identity| identity.admit(metadata))
    }

    /// Ends every open `StreamAppend` call once `shutdown` turns true (or its sender is
    /// gone). A leader holds such a call open for as long as it replicates to this member,
    /// so a server that drains its calls before it stops must end them first; without this
    /// they end only when the leader ends them.
    pub fn with_shutdown(mut self, shutdown: tokio::sync::watch::Receiver<bool>) -> Self {
        self.shutdown = Some(shutdown);
        self
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

/// The follower's answers on a `StreamAppend` call.
type AppendAnswers = Pin<Box<dyn Stream<Item = Result<RaftReply, Status>> + Send + 'static>>;

/// Why a `StreamAppend` call's requests stopped before the leader ended them: the answers
/// end with it once every request before it is answered.
type InboundFailure = Arc<Mutex<Option<Status>>>;

impl<SM, K> RaftService<SM, K>
where
    SM: RaftStateMachine<TypeConfig>,
    K: SnapshotSink<SM::SnapshotData>,
{
    /// The follower's side of a pipelined AppendEntries (`crate::append_pipeline`): the
    /// requests go, in order, through openraft's `Raft::stream_append`, and each answer
    /// goes back as it comes, after the vote guard saw what it acknowledges (as for a unary
    /// AppendEntries). A request that does not decode ends the answers with
    /// `INVALID_ARGUMENT` after those of the requests before it.
    fn append_answers(&self, inbound: Streaming<RaftRequest>) -> AppendAnswers {
        let failure: InboundFailure = Arc::default();
        // Each request's leader commit, oldest first, for the guard when its answer comes.
        let commits: Arc<Mutex<VecDeque<Option<LogId>>>> = Arc::default();
        let state = (
            inbound,
            Arc::clone(&failure),
            Arc::clone(&commits),
            self.shutdown.clone(),
        );
        let requests = futures_util::stream::unfold(
            state,
            |(mut inbound, fail, pending, mut down)| async move {
                let next = tokio::select! {
                    next = inbound.message() => next,
                    () = shutting_down(down.as_mut()) => return None,
                };
                let message = match next {
                    Ok(Some(message)) => message,
                    Ok(None) => return None,
                    Err(status) => {
                        *fail.lock().unwrap_or_else(PoisonError::into_inner) = Some(status);
                        return None;
                    }
                };
                match codec::decode::<AppendEntriesRequest<TypeConfig>>(
                    "AppendEntries",
                    &message.data,
                ) {
                    Ok(rpc) => {
                        pending
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push_back(rpc.leader_commit);
                        Some((rpc, (inbound, fail, pending, down)))
                    }
                    Err(err) => {
                        *fail.lock().unwrap_or_else(PoisonError::into_inner) =
                            Some(bad_request(err));
                        None
                    }
                }
            },
        );
        let guard = self.guard.clone();
        let answers = self.raft.stream_append(requests).map(move |answer| {
            let result = answer.map_err(stopped)?;
            let leader_commit = commits
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_front()
                .flatten();
            if let Ok(holds) = &result {
                guard.accepted_append(holds.map(|h| h.index), leader_commit);
            }
            reply("StreamAppendResult", &result)
        });
        let tail = futures_util::stream::once(async move {
            failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        })
        .filter_map(|failure| async move { failure.map(Err) });
        Box::pin(answers.chain(tail))
    }
}

/// Resolves once `shutdown` turns true or its sender is gone; never without one.
async fn shutting_down(shutdown: Option<&mut tokio::sync::watch::Receiver<bool>>) {
    match shutdown {
        Some(rx) => {
            let _ = rx.wait_for(|down| *down).await;
        }
        None => std::future::pending().await,
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

    type StreamAppendStream = AppendAnswers;

    async fn stream_append(
        &self,
        request: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<AppendAnswers>, Status> {
        self.admit(request.metadata())?;
        Ok(Response::new(self.append_answers(request.into_inner())))
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
        tracing::info!(
            to = rpc.to_node_id(),
            from = %rpc.from_leader(),
            "the leader asks to hand its lead over"
        );
        if !self.handed_to_me(&rpc) {
            let other_follower = self.follows(&rpc);
            let response = self
                .raft
                .handle_transfer_leader(rpc.clone())
                .await
                .map_err(stopped)?;
            if other_follower {
                self.campaign_unless_elected(rpc);
            }
            return reply("TransferLeaderResponse", &response).map(Response::new);
        }
        // openraft's chosen successor first waits, up to an election timeout, until its log
        // holds the leader's last entry; a leader that lost its quorum (a one-way cut, most
        // often) may never send that entry, and the successor then ignores the transfer
        // altogether: its lease stays, and a new leader comes only after the followers'
        // leases and an election timeout (issue 30: 2.0-2.3 s instead of 0.7 s). Give
        // openraft a moment, then campaign: a pre-vote that the others refuse (one holds a
        // longer log) changes nothing, and a granted one elects the member the others find
        // up to date, as any election does.
        let handled = tokio::time::timeout(
            TRANSFER_FLUSH_WAIT,
            self.raft.handle_transfer_leader(rpc.clone()),
        )
        .await;
        let response = match handled {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Err(fatal)) => return Err(stopped(fatal)),
            Ok(Ok(Err(refused))) => {
                self.campaign(&rpc).await?;
                Err(refused)
            }
            Err(_waited) => {
                self.campaign(&rpc).await?;
                Ok(())
            }
        };
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
