//! The client side of the Raft transport: openraft's [`RaftNetworkFactory`] and
//! [`RaftNetworkV2`] over the `cursorlog.raft.v1.Raft` gRPC service (see
//! [`crate::service`] for the server side).
//!
//! Two HTTP/2 [`Channel`]s per peer address are shared by every client openraft asks for;
//! each connects lazily and reconnects by itself. One carries replication, heartbeats and
//! snapshots; the other, the *control* channel, only votes, pre-votes and leadership
//! transfers. A control message must not wait behind bulk data: a peer whose replies stop
//! (a one-way cut, or a peer too slow to read) leaves the replication connection's HTTP/2
//! flow-control window full, and a leader that lost its quorum then could not hand its
//! lead over on it (issue 30: that wait put 1.5–2.3 s instead of 0.7 s on a failover).
//!
//! **Deadlines.** Each call is bounded by [`RPCOption::soft_ttl`] (¾ of openraft's hard TTL:
//! the heartbeat interval for AppendEntries — but at least 1 s, since it includes the
//! follower's fdatasync —, the election timeout for votes,
//! `install_snapshot_timeout` for a whole snapshot), both on the client (the call is dropped)
//! and on the server (`grpc-timeout`).
//!
//! **Errors**, so that openraft backs off from a dead peer but retries a slow one at once:
//!
//! | what happened | openraft error |
//! |---|---|
//! | the call's deadline passed | [`RPCError::Timeout`] (retry soon; repeated ones add up to a backoff) |
//! | connection refused, reset, not connected, connect timeout (`UNAVAILABLE`, or an I/O error of those kinds under any code) | [`RPCError::Unreachable`] (back off) |
//! | the peer refused us or cannot serve us: `UNAUTHENTICATED`, `PERMISSION_DENIED`, `UNIMPLEMENTED` (no Raft service there), `INVALID_ARGUMENT`/`INTERNAL` (a codec mismatch), a bad address | [`RPCError::Unreachable`]: retrying at once cannot help |
//! | anything else (`UNKNOWN`, `CANCELLED`, `RESOURCE_EXHAUSTED`, …) | [`RPCError::Network`] (retry at once) |
//!
//! The remote node's own fatal errors (it is shutting down) arrive as `UNAVAILABLE`, so they
//! are `Unreachable` too.
//!
//! **Auth and TLS.** [`ClientOptions`] takes the cluster's bearer token (sent as
//! `authorization: Bearer …` on every call, as the server's interceptor expects from clients)
//! and a [`ClientTlsConfig`](tonic::transport::ClientTlsConfig) (then the peers are dialled
//! as `https://addr`); it lives in `client_options.rs`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cursorlog_proto::raft_v1::raft_client::RaftClient;
use cursorlog_proto::raft_v1::RaftRequest;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{stream_append_sequential, RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::SnapshotOf;
use openraft::OptionalSend;
use openraft::{ErrorSubject, ErrorVerb, RPCTypes, StorageError};
use tokio::io::AsyncRead;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::append_limit::{
    answer_for_prefix, append_deadline, prefix_to_send, request_bytes, AppendBudget,
    APPEND_BYTES_MAX,
};
use crate::append_pipeline::{self, ErrorMap, Pipeline};
pub use crate::client_options::{ClientOptions, OptionsError, DEFAULT_MAX_MESSAGE_BYTES};
use crate::codec::{self, SnapshotHead};
use crate::identity::{ClusterIdentity, CLUSTER_HEADER};
use crate::transfer::{snapshot_chunks, unless_stalled, Ended, Progress};
use crate::types::{NodeId, RaftNode, TypeConfig, Vote};

/// The outer cap of one snapshot transfer's gRPC call; the real bound is a stall of
/// openraft's `install_snapshot_timeout` (`crate::transfer`).
const TRANSFER_MAX: Duration = Duration::from_secs(6 * 3600);

/// The snapshot chunk size when openraft does not give one.
pub const DEFAULT_SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// Bytes reserved in a snapshot chunk message for its framing.
const CHUNK_FRAMING_BYTES: usize = 64;

/// The shortest deadline of an AppendEntries call (see [`NetworkClient::unary`]).
const APPEND_DEADLINE_MIN: Duration = Duration::from_secs(1);

/// openraft's network factory: hands out a [`NetworkClient`] per peer, sharing one channel per
/// address. `SD` is the state machine's snapshot data, which must be readable as bytes (see
/// [`RaftNetworkV2::full_snapshot`] below).
pub struct NetworkFactory<SD> {
    id: NodeId,
    options: ClientOptions,
    /// This node's cluster identity, sent on every request once known.
    identity: Option<ClusterIdentity>,
    channels: HashMap<String, Channel>,
    /// The control channels (votes and transfers), one per peer address.
    control: HashMap<String, Channel>,
    /// Each peer's AppendEntries budget, kept across the clients openraft asks for.
    budgets: HashMap<NodeId, AppendBudget>,
    /// Whether each peer serves `StreamAppend` (cleared when one answers `UNIMPLEMENTED`).
    pipelines: HashMap<NodeId, Arc<AtomicBool>>,
    _snapshot: PhantomData<fn() -> SD>,
}

impl<SD> fmt::Debug for NetworkFactory<SD> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetworkFactory")
            .field("id", &self.id)
            .field("options", &self.options)
            .field("peers", &self.channels.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl<SD> NetworkFactory<SD> {
    /// The factory of node `id` (its own id names it in timeout errors).
    pub fn new(id: NodeId, options: ClientOptions) -> Self {
        Self {
            id,
            options,
            identity: None,
            channels: HashMap::new(),
            control: HashMap::new(),
            budgets: HashMap::new(),
            pipelines: HashMap::new(),
            _snapshot: PhantomData,
        }
    }

    /// Sends `identity` (once this node has one) in the [`CLUSTER_HEADER`] of every request,
    /// so a member of another cluster refuses them.
    pub fn with_identity(mut self, identity: ClusterIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// A client to `target` at `node.addr` (what openraft's `new_client` returns).
    pub fn client(&mut self, target: NodeId, node: &RaftNode) -> NetworkClient<SD> {
        let addr = self
            .options
            .routes
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.addr.clone());
        let channel = channel_to(&mut self.channels, &self.options, &addr);
        let control = channel_to(&mut self.control, &self.options, &addr);
        let max = self.options.max_message_bytes;
        let stub = |channel: Result<Channel, _>| {
            channel
                .map(|channel| {
                    RaftClient::new(channel)
                        .max_decoding_message_size(max)
                        .max_encoding_message_size(max)
                })
                .map_err(|err| format!("bad address {addr:?} of node {target}: {err}"))
        };
        let budget = self
            .budgets
            .entry(target)
            .or_insert_with(|| AppendBudget::new(APPEND_BYTES_MAX))
            .clone();
        let pipelined = Arc::clone(
            self.pipelines
                .entry(target)
                .or_insert_with(|| Arc::new(AtomicBool::new(true))),
        );
        NetworkClient {
            id: self.id,
            target,
            client: stub(channel),
            control: stub(control),
            authorization: self.options.authorization.clone(),
            identity: self.identity.clone(),
            max_message_bytes: max,
            budget,
            pipelined,
            _snapshot: PhantomData,
        }
    }
}

/// The channel to `addr` in `channels`, dialled (lazily) on first use.
fn channel_to(
    channels: &mut HashMap<String, Channel>,
    options: &ClientOptions,
    addr: &str,
) -> Result<Channel, tonic::transport::Error> {
    if let Some(channel) = channels.get(addr) {
        return Ok(channel.clone());
    }
    let channel = options.channel(addr)?;
    channels.insert(addr.to_owned(), channel.clone());
    Ok(channel)
}

impl<SD> RaftNetworkFactory<TypeConfig> for NetworkFactory<SD>
where
    SD: AsyncRead + Unpin + Send + 'static,
{
    type Network = NetworkClient<SD>;

    async fn new_client(&mut self, target: NodeId, node: &RaftNode) -> Self::Network {
        self.client(target, node)
    }
}

/// The connection from this node to one peer.
pub struct NetworkClient<SD> {
    id: NodeId,
    target: NodeId,
    /// The stub, or why the peer's address is unusable (every call is then `Unreachable`).
    client: Result<RaftClient<Channel>, String>,
    /// The same on the control channel (votes, pre-votes, transfers).
    control: Result<RaftClient<Channel>, String>,
    authorization: Option<AsciiMetadataValue>,
    identity: Option<ClusterIdentity>,
    max_message_bytes: usize,
    /// How many entry bytes the next AppendEntries may carry (shared with this peer's other
    /// clients).
    budget: AppendBudget,
    /// Whether the peer serves `StreamAppend` (see [`crate::append_pipeline`]); shared with
    /// this peer's other clients.
    pipelined: Arc<AtomicBool>,
    _snapshot: PhantomData<fn() -> SD>,
}

impl<SD> fmt::Debug for NetworkClient<SD> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetworkClient")
            .field("id", &self.id)
            .field("target", &self.target)
            .field("usable", &self.client.is_ok())
            .finish()
    }
}

/// The unary Raft calls.
#[derive(Debug, Clone, Copy)]
enum Unary {
    AppendEntries,
    Vote,
    PreVote,
    TransferLeader,
}

impl Unary {
    fn kind(self) -> RPCTypes {
        match self {
            Self::AppendEntries => RPCTypes::AppendEntries,
            Self::Vote | Self::PreVote => RPCTypes::Vote,
            Self::TransferLeader => RPCTypes::TransferLeader,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::AppendEntries => "AppendEntries",
            Self::Vote => "Vote",
            Self::PreVote => "PreVote",
            Self::TransferLeader => "TransferLeader",
        }
    }
}

/// A request with the deadline (none for a stream that lives as long as its use), the token
/// and the sender's cluster identity.
fn request<T>(
    message: T,
    deadline: Option<Duration>,
    authorization: Option<&AsciiMetadataValue>,
    identity: Option<&ClusterIdentity>,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.clone());
    }
    let cluster = identity.and_then(ClusterIdentity::current);
    if let Some(value) = cluster.and_then(|id| AsciiMetadataValue::try_from(id.to_string()).ok()) {
        request.metadata_mut().insert(CLUSTER_HEADER, value);
    }
    request
}

/// Which of a peer's two connections a call goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Replication, heartbeats and snapshots.
    Replication,
    /// Votes, pre-votes and transfers.
    Control,
}

impl<SD> NetworkClient<SD> {
    /// One unary call on `rpc`'s own lane (see [`NetworkClient::unary_on`]).
    async fn unary<Req, Resp>(
        &self,
        rpc: Unary,
        value: &Req,
        deadline: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned,
    {
        let lane = match rpc {
            Unary::AppendEntries => Lane::Replication,
            Unary::Vote | Unary::PreVote | Unary::TransferLeader => Lane::Control,
        };
        self.unary_on(lane, rpc, value, deadline).await
    }

    /// One unary call on `lane`: `value` encoded in, the reply decoded out, within
    /// `deadline`.
    async fn unary_on<Req, Resp>(
        &self,
        lane: Lane,
        rpc: Unary,
        value: &Req,
        deadline: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: serde::Serialize,
        Resp: serde::de::DeserializeOwned,
    {
        let client = match lane {
            Lane::Replication => &self.client,
            Lane::Control => &self.control,
        };
        // A stub is a handle on the shared channel: cloning it is cheap, and lets two calls
        // to this peer run at once.
        let mut client = client
            .clone()
            .map_err(|reason| RPCError::Unreachable(Unreachable::from_string(reason.as_str())))?;
        let data = codec::encode(rpc.name(), value)
            .map_err(|err| RPCError::Network(NetworkError::new(&err)))?;
        let req = request(
            RaftRequest { data: data.into() },
            Some(deadline),
            self.authorization.as_ref(),
            self.identity.as_ref(),
        );
        let call = async {
            match rpc {
                Unary::AppendEntries => client.append_entries(req).await,
                Unary::Vote => client.vote(req).await,
                Unary::PreVote => client.pre_vote(req).await,
                Unary::TransferLeader => client.transfer_leader(req).await,
            }
        };
        let reply = match tokio::time::timeout(deadline, call).await {
            Err(_elapsed) => return Err(self.timeout(rpc.kind(), deadline)),
            Ok(Err(status)) => return Err(self.status_error(&status, rpc.kind(), deadline)),
            Ok(Ok(reply)) => reply.into_inner(),
        };
        // A reply that does not decode is a version or codec mismatch: back off.
        codec::decode(rpc.name(), &reply.data)
            .map_err(|err| RPCError::Unreachable(Unreachable::new(&err)))
    }

    fn timeout(&self, action: RPCTypes, timeout: Duration) -> RPCError<TypeConfig> {
        self.errors().timeout(action, timeout)
    }

    /// The openraft error for a failed call (see the table in the module docs).
    fn status_error(
        &self,
        status: &Status,
        action: RPCTypes,
        deadline: Duration,
    ) -> RPCError<TypeConfig> {
        self.errors().status(status, action, deadline)
    }

    fn errors(&self) -> CallErrors {
        CallErrors {
            id: self.id,
            target: self.target,
        }
    }

    /// Opens a `StreamAppend` call and pipelines `input` on it (see
    /// [`crate::append_pipeline`]). A peer that does not serve the call (an older build)
    /// is marked so, and the next stream to it goes one AppendEntries at a time.
    async fn open_pipeline<S>(
        &self,
        input: S,
        option: &RPCOption,
    ) -> Result<Pipeline<S, CallErrors>, RPCError<TypeConfig>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin + Send + 'static,
    {
        let base = option.soft_ttl().max(APPEND_DEADLINE_MIN);
        let mut client = self
            .client
            .clone()
            .map_err(|reason| RPCError::Unreachable(Unreachable::from_string(reason.as_str())))?;
        let (tx, outbound) = append_pipeline::outbound();
        // No deadline on the call: it lasts as long as openraft's stream; each request's
        // answer has its own.
        let req = request(
            outbound,
            None,
            self.authorization.as_ref(),
            self.identity.as_ref(),
        );
        let replies = match tokio::time::timeout(base, client.stream_append(req)).await {
            Err(_elapsed) => return Err(self.timeout(RPCTypes::AppendEntries, base)),
            Ok(Err(status)) if status.code() == Code::Unimplemented => {
                self.pipelined.store(false, Ordering::Relaxed);
                tracing::info!(
                    peer = self.target,
                    "the peer does not serve StreamAppend (an older build): AppendEntries go \
                     to it one at a time"
                );
                // Retried at once, without the pipeline.
                return Err(RPCError::Network(NetworkError::new(&status)));
            }
            Ok(Err(status)) => {
                return Err(self.status_error(&status, RPCTypes::AppendEntries, base))
            }
            Ok(Ok(replies)) => replies.into_inner(),
        };
        Ok(Pipeline::new(
            input,
            tx,
            replies,
            self.budget.clone(),
            self.max_message_bytes,
            base,
            self.target,
            self.errors(),
        ))
    }
}

/// How a failed call of this node to `target` becomes an openraft error.
#[derive(Debug, Clone, Copy)]
struct CallErrors {
    id: NodeId,
    target: NodeId,
}

impl ErrorMap for CallErrors {
    fn timeout(&self, action: RPCTypes, timeout: Duration) -> RPCError<TypeConfig> {
        RPCError::Timeout(Timeout {
            action,
            id: self.id,
            target: self.target,
            timeout,
        })
    }

    fn status(
        &self,
        status: &Status,
        action: RPCTypes,
        deadline: Duration,
    ) -> RPCError<TypeConfig> {
        match classify(status) {
            Failure::Timeout => self.timeout(action, deadline),
            Failure::Unreachable => RPCError::Unreachable(Unreachable::new(status)),
            Failure::Network => RPCError::Network(NetworkError::new(status)),
        }
    }
}

/// How openraft should treat a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Timeout,
    Unreachable,
    Network,
}

/// Classifies a call's status (the table in the module docs).
fn classify(status: &Status) -> Failure {
    match status.code() {
        Code::DeadlineExceeded => Failure::Timeout,
        Code::Unavailable
        | Code::Unauthenticated
        | Code::PermissionDenied
        // A member of another cluster (`crate::identity`): back off, as from a dead peer.
        | Code::FailedPrecondition
        | Code::Unimplemented
        | Code::InvalidArgument
        | Code::Internal => Failure::Unreachable,
        _ if connection_lost(status) => Failure::Unreachable,
        _ => Failure::Network,
    }
}

/// Whether an I/O error saying the connection failed is somewhere under `status`.
fn connection_lost(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::NotConnected
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::TimedOut
            ) {
                return true;
            }
        }
        source = err.source();
    }
    false
}

impl<SD> RaftNetworkV2<TypeConfig> for NetworkClient<SD>
where
    SD: AsyncRead + Unpin + Send + 'static,
{
    type SnapshotData = SD;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let limit = self.budget.limit().min(self.max_message_bytes / 2);
        let prefix = prefix_to_send(&rpc, limit);
        let sent = prefix.as_ref().unwrap_or(&rpc);
        let bytes = request_bytes(sent);
        // openraft gives AppendEntries the heartbeat interval as its TTL; the call includes
        // the follower's fdatasync, which on a loaded machine takes longer than ¾ of a
        // 50–100 ms heartbeat: every append then timed out and the leader could not commit
        // (the fault harness saw clusters without progress for 90 s). A call also gets time
        // for its bytes (`append_limit`).
        let deadline = append_deadline(option.soft_ttl().max(APPEND_DEADLINE_MIN), bytes);
        let answer = self.unary(Unary::AppendEntries, sent, deadline).await;
        match &answer {
            Ok(_) => self.budget.answered(bytes),
            Err(err) => self.budget.failed_to(self.target, bytes, err),
        }
        let response = answer?;
        Ok(match prefix {
            None => response,
            Some(prefix) => answer_for_prefix(response, prefix.entries.last().map(|e| e.log_id)),
        })
    }

    /// Pipelined on a `StreamAppend` call (see [`crate::append_pipeline`]), or one
    /// AppendEntries at a time to a peer that does not serve it.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        if !self.pipelined.load(Ordering::Relaxed) {
            return stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            let pipeline = self.open_pipeline(input, &option).await?;
            let answers: BoxStream<'s, _> = Box::pin(pipeline.answers());
            Ok(answers)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(Unary::Vote, &rpc, option.soft_ttl()).await
    }

    /// Forwarded to the peer: the trait's default answers `Unreachable`, and the cluster
    /// then waits out the old leader's lease and elects whoever campaigns first (a test
    /// that moved the lead to a given member failed 1 run in 10 under load).
    ///
    /// Sent on both connections at once, the first answer winning: a handover comes when
    /// this leader hears no quorum, often because its inbound links are cut, and then it
    /// can use only a connection that is already open (a new one needs the peer's answer
    /// to its handshake). The control connection is opened lazily and used only for
    /// elections, so after a peer restarted it is not open; the replication connection is
    /// (heartbeats keep it so), unless its flow-control window is full, which is what the
    /// control connection is for. With the control lane alone, a restarted follower missed
    /// the handover, kept the old leader's lease and refused the other follower's
    /// pre-votes: failover took 1.4-2.6 s instead of 0.7 s (issue 30's history runs).
    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let deadline = option.soft_ttl();
        let control = self.unary_on(Lane::Control, Unary::TransferLeader, &req, deadline);
        let replication = self.unary_on(Lane::Replication, Unary::TransferLeader, &req, deadline);
        futures_util::future::select_ok([Box::pin(control), Box::pin(replication)])
            .await
            .map(|(answer, _slower)| answer)
    }

    /// Forwarded to the peer: the trait's default answers "granted" without asking, which
    /// silently turns `enable_pre_vote` off.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(Unary::PreVote, &rpc, option.soft_ttl()).await
    }

    /// Streams the snapshot: a head chunk (vote and meta), then the data read from `SD` from
    /// its current position to its end in chunks of openraft's `snapshot_max_chunk_size`, the
    /// last one marked done. The whole transfer is bounded by the soft TTL
    /// (`install_snapshot_timeout`), and stops when openraft cancels it.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: SnapshotOf<TypeConfig, SD>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let deadline = option.soft_ttl();
        let signature = snapshot.meta.signature();
        let storage_error = |err: io::Error| {
            StreamingError::StorageError(StorageError::from_io_error(
                ErrorSubject::Snapshot(Some(signature.clone())),
                ErrorVerb::Read,
                err,
            ))
        };
        let head = SnapshotHead {
            vote,
            meta: snapshot.meta,
        };
        let head =
            codec::encode("SnapshotHead", &head).map_err(|e| storage_error(io::Error::other(e)))?;
        let chunk_bytes = option
            .snapshot_chunk_size()
            .unwrap_or(DEFAULT_SNAPSHOT_CHUNK_BYTES)
            .clamp(
                1,
                self.max_message_bytes
                    .saturating_sub(CHUNK_FRAMING_BYTES)
                    .max(1),
            );
        let read_error = Arc::new(Mutex::new(None));
        let progress = Progress::default();
        let chunks = snapshot_chunks(
            head,
            snapshot.snapshot,
            chunk_bytes,
            read_error.clone(),
            progress.clone(),
        );

        let client = self.client.as_mut().map_err(|reason| {
            StreamingError::Unreachable(Unreachable::from_string(reason.as_str()))
        })?;
        // openraft's deadline bounds a stall, not the whole transfer (`crate::transfer`); the
        // call's own gRPC deadline is only an outer cap.
        let req = request(
            chunks,
            Some(TRANSFER_MAX),
            self.authorization.as_ref(),
            self.identity.as_ref(),
        );
        let result =
            match unless_stalled(client.install_snapshot(req), cancel, &progress, deadline).await {
                Ended::Cancelled(closed) => return Err(StreamingError::Closed(closed)),
                Ended::Answered(result) => Ok(result),
                Ended::Stalled => Err(()),
            };
        // A local read error ended the stream early (the peer refused the unfinished
        // snapshot): report the cause, not the peer's refusal.
        if let Some(err) = read_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            return Err(storage_error(err));
        }
        let reply = match result {
            Err(()) => {
                return Err(StreamingError::Timeout(Timeout {
                    action: RPCTypes::InstallSnapshot,
                    id: self.id,
                    target: self.target,
                    timeout: deadline,
                }))
            }
            Ok(Err(status)) => {
                return Err(match classify(&status) {
                    Failure::Timeout => StreamingError::Timeout(Timeout {
                        action: RPCTypes::InstallSnapshot,
                        id: self.id,
                        target: self.target,
                        timeout: deadline,
                    }),
                    Failure::Unreachable => StreamingError::Unreachable(Unreachable::new(&status)),
                    Failure::Network => StreamingError::Network(NetworkError::new(&status)),
                })
            }
            Ok(Ok(reply)) => reply.into_inner(),
        };
        codec::decode("SnapshotResponse", &reply.data)
            .map_err(|err| StreamingError::Unreachable(Unreachable::new(&err)))
    }
}

#[cfg(test)]
mod tests {
    use cursorlog_proto::raft_v1::SnapshotChunk;
    use futures_util::StreamExt as _;

    use super::*;

    #[test]
    fn deadlines_are_timeouts_dead_peers_unreachable_and_the_rest_network_errors() {
        assert_eq!(classify(&Status::deadline_exceeded("x")), Failure::Timeout);
        for code in [
            Code::Unavailable,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::FailedPrecondition,
            Code::Unimplemented,
        ] {
            assert_eq!(
                classify(&Status::new(code, "x")),
                Failure::Unreachable,
                "{code:?}"
            );
        }
        assert_eq!(classify(&Status::unknown("x")), Failure::Network);
        let mut reset = Status::unknown("transport error");
        reset.set_source(Arc::new(io::Error::from(io::ErrorKind::ConnectionReset)));
        assert_eq!(classify(&reset), Failure::Unreachable);
    }

    #[tokio::test]
    async fn a_snapshot_streams_as_head_then_chunks_with_the_last_marked_done() {
        let data: Vec<u8> = (0..10u8).collect();
        let err = Arc::new(Mutex::new(None));
        let chunks: Vec<SnapshotChunk> = snapshot_chunks(
            vec![7],
            io::Cursor::new(data),
            4,
            err.clone(),
            Progress::default(),
        )
        .collect()
        .await;
        let shape: Vec<(usize, usize, bool)> = chunks
            .iter()
            .map(|c| (c.head.len(), c.data.len(), c.done))
            .collect();
        assert_eq!(
            shape,
            [(1, 0, false), (0, 4, false), (0, 4, false), (0, 2, true)]
        );
        assert!(err.lock().unwrap_or_else(PoisonError::into_inner).is_none());
    }

    /// A reader that fails after its first bytes.
    struct Failing(bool);

    impl AsyncRead for Failing {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            if self.0 {
                return std::task::Poll::Ready(Err(io::Error::other("disk gone")));
            }
            self.0 = true;
            buf.put_slice(&[1, 2]);
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_read_error_ends_the_stream_without_a_done_chunk() {
        let err = Arc::new(Mutex::new(None));
        let chunks: Vec<SnapshotChunk> =
            snapshot_chunks(vec![7], Failing(false), 4, err.clone(), Progress::default())
                .collect()
                .await;
        assert!(chunks.iter().all(|c| !c.done));
        assert!(err.lock().unwrap_or_else(PoisonError::into_inner).is_some());
    }
}
