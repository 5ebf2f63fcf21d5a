//! The tonic implementation of `cursorlog.v1.CursorLog`: validate, call the engine on the
//! blocking pool, map the error.
//!
//! Engine calls block (they may wait for a group commit and its fsync), so every one runs in
//! `spawn_blocking`. Dropping a handler's future (the client went away) does not cancel the
//! blocking call: an append that started is completed and made durable even if nobody is left
//! to receive the acknowledgement, and is recognised as a duplicate on retry.

use std::pin::Pin;
use std::sync::Arc;

use cursorlog_engine::{self as engine, Cursor, Engine};
use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::cursor_log_server::CursorLog;
use cursorlog_replication::ReplicatedNode;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::append_stream;
use crate::convert;
use crate::metrics::Metrics;
use crate::reader::Reader;
use crate::status;

/// Events per batch when the client leaves `batch_events_max` at 0.
const READ_BATCH_EVENTS_DEFAULT: u32 = 256;
/// Target size of one Read batch message, in bytes: below the 4 MiB default decoding limit
/// of gRPC clients, so a client with default settings can read any stream.
const READ_BATCH_BYTES_TARGET: usize = 3 * 1024 * 1024;
/// Most items in one `AppendBatch` call.
const BATCH_ITEMS_MAX: usize = 4096;

/// The service state shared by all calls.
#[derive(Debug, Clone)]
pub struct CursorLogService {
    engine: Engine,
    metrics: Arc<Metrics>,
    /// Becomes true when the server starts shutting down; live followers end then.
    shutdown: watch::Receiver<bool>,
    /// Upper bound on one encoded response message, in bytes.
    message_bytes_max: usize,
    /// The replicated node this service belongs to, if any: reads that give a verdict are
    /// served only once it proves it leads (see [`CursorLogService::linearizable`]).
    cluster: Option<ReplicatedNode>,
}

impl CursorLogService {
    /// A service over `engine`. `message_bytes_max` is the gRPC encoding limit the server was
    /// configured with; Read splits event batches to stay below it.
    pub fn new(
        engine: Engine,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
        message_bytes_max: usize,
    ) -> Self {
        Self {
            engine,
            metrics,
            shutdown,
            message_bytes_max,
            cluster: None,
        }
    }

    /// The service of a member of a replicated cluster (`None`: a single node).
    #[must_use]
    pub fn in_cluster(mut self, node: Option<ReplicatedNode>) -> Self {
        self.cluster = node;
        self
    }

    /// On a cluster member: waits until a read here is linearizable (this node leads, a
    /// quorum confirmed it, and it applied everything committed before the read began), or
    /// answers `UNAVAILABLE` with the leader's address. A single node answers at once.
    async fn linearizable(&self) -> Result<(), Status> {
        match &self.cluster {
            Some(node) => node
                .linearizable()
                .await
                .map_err(|outcome| crate::cluster::unavailable(&outcome)),
            None => Ok(()),
        }
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, Status>
    where
        F: FnOnce(&Engine) -> engine::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        run_blocking(&self.engine, f).await
    }
}

/// Runs a point read of the index (a few keys: the memtable, and sled's cache or a page of
/// its file) on the calling task. For reads this small the blocking pool's hop costs more
/// than the read: two thread wake-ups per call, which on a busy 2-core machine were a
/// measurable share of a `GetTask` (issue 31 item 3). Reads of the log's segments, which
/// can be long, stay on the pool ([`run_blocking`]).
pub(crate) fn point_read<T>(
    engine: &Engine,
    f: impl FnOnce(&Engine) -> engine::Result<T>,
) -> Result<T, Status> {
    f(engine).map_err(|err| status::from_engine(&err))
}

pub(crate) async fn run_blocking<T, F>(engine: &Engine, f: F) -> Result<T, Status>
where
    F: FnOnce(&Engine) -> engine::Result<T> + Send + 'static,
    T: Send + 'static,
{
    run_engine(engine, f)
        .await?
        .map_err(|err| status::from_engine(&err))
}

/// Runs an engine call on the blocking pool; the engine's own error is kept for the caller
/// to inspect (the outer error is a panic).
pub(crate) async fn run_engine<T, F>(engine: &Engine, f: F) -> Result<engine::Result<T>, Status>
where
    F: FnOnce(&Engine) -> engine::Result<T> + Send + 'static,
    T: Send + 'static,
{
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || f(&engine))
        .await
        .map_err(|join| {
            tracing::error!(error = %join, "engine call panicked");
            Status::internal("engine call panicked; the server log has the details")
        })
}

/// One `Append`: validate, await the group commit (not on a blocking thread: one hand-off
/// less per append on the hot path), answer.
pub(crate) async fn append_one(
    engine: &Engine,
    r: pb::AppendRequest,
) -> Result<pb::AppendResponse, Status> {
    let req = engine::Append {
        session: convert::required_str("session", r.session)?,
        stream: convert::required_id("stream", r.stream)?,
        expected_next_seq: r.expected_next_seq,
        events: convert::new_events(r.events)?,
    };
    let appended = engine
        .append_async(req)
        .await
        .map_err(|err| status::from_engine(&err))?;
    Ok(convert::appended(&appended))
}

type ReadStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ReadResponse, Status>> + Send>>;

#[tonic::async_trait]
impl CursorLog for CursorLogService {
    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        let state = r.state;
        let info = self
            .engine
            .open_session_with_state_async(&session, state)
            .await
            .map_err(|err| status::from_engine(&err))?;
        Ok(Response::new(pb::OpenSessionResponse {
            session: info.session,
            epoch: info.epoch,
            created: info.created,
            state: info.state,
        }))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::GetSessionResponse>, Status> {
        let session = convert::required_str("session", request.into_inner().session)?;
        self.linearizable().await?;
        let view = point_read(&self.engine, |e| e.session(&session))?.ok_or_else(|| {
            Status::not_found(
                "session not found: it was never opened or is past its metadata horizon",
            )
        })?;
        let idle_ttl_ms = self
            .engine
            .config()
            .session_idle_ttl
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Ok(Response::new(pb::GetSessionResponse {
            session: view.session,
            epoch: view.epoch,
            state: view.state,
            expired: view.expired,
            opened_at_ms: view.opened_at_ms,
            idle_ttl_ms,
        }))
    }

    async fn set_session_state(
        &self,
        request: Request<pb::SetSessionStateRequest>,
    ) -> Result<Response<pb::SetSessionStateResponse>, Status> {
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        let state = r.state;
        self.engine
            .set_session_state_async(&session, state)
            .await
            .map_err(|err| status::from_engine(&err))?;
        Ok(Response::new(pb::SetSessionStateResponse {}))
    }

    async fn advance_epoch(
        &self,
        request: Request<pb::AdvanceEpochRequest>,
    ) -> Result<Response<pb::AdvanceEpochResponse>, Status> {
        let session = convert::required_str("session", request.into_inner().session)?;
        let advanced = self
            .engine
            .advance_epoch_async(&session)
            .await
            .map_err(|err| status::from_engine(&err))?;
        Ok(Response::new(pb::AdvanceEpochResponse {
            epoch: advanced.epoch,
            superseded_streams: advanced.superseded,
        }))
    }

    async fn expire_session(
        &self,
        request: Request<pb::ExpireSessionRequest>,
    ) -> Result<Response<pb::ExpireSessionResponse>, Status> {
        let session = convert::required_str("session", request.into_inner().session)?;
        let expired = self
            .engine
            .expire_session_async(&session)
            .await
            .map_err(|err| status::from_engine(&err))?;
        Ok(Response::new(pb::ExpireSessionResponse {
            aborted_streams: expired.aborted,
        }))
    }

    async fn open_stream(
        &self,
        request: Request<pb::OpenStreamRequest>,
    ) -> Result<Response<pb::OpenStreamResponse>, Status> {
        let r = request.into_inner();
        if r.lease_ms == Some(0) {
            return Err(Status::invalid_argument(
                "lease_ms must be >= 1 when present",
            ));
        }
        let req = engine::OpenStream {
            session: convert::required_str("session", r.session)?,
            epoch: convert::required_id("epoch", r.epoch)?,
            correlation: r.correlation,
            lease_ms: r.lease_ms,
        };
        let info = self
            .engine
            .open_stream_async(req)
            .await
            .map_err(|err| status::from_engine(&err))?;
        Ok(Response::new(pb::OpenStreamResponse {
            stream: info.stream,
            epoch: info.epoch,
            start_event_id: Cursor::new(info.epoch, info.stream, 0).to_string(),
        }))
    }

    async fn append(
        &self,
        request: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        let appended = append_one(&self.engine, request.into_inner()).await?;
        Ok(Response::new(appended))
    }

    async fn append_batch(
        &self,
        request: Request<pb::AppendBatchRequest>,
    ) -> Result<Response<pb::AppendBatchResponse>, Status> {
        let items = request.into_inner().items;
        if items.is_empty() {
            return Err(Status::invalid_argument(
                "items is required: a batch needs at least one item",
            ));
        }
        if items.len() > BATCH_ITEMS_MAX {
            return Err(Status::resource_exhausted(format!(
                "batch (items) is {}; the limit is {BATCH_ITEMS_MAX}",
                items.len()
            )));
        }
        // Structural errors fail their own item only; the rest go to the engine together.
        let mut writes = Vec::with_capacity(items.len());
        let mut results: Vec<Option<pb::BatchResult>> = Vec::with_capacity(items.len());
        for item in items {
            match convert::batch_write(item) {
                Ok(w) => {
                    writes.push(w);
                    results.push(None);
                }
                Err(status) => results.push(Some(convert::batch_failure(&status))),
            }
        }
        let mut written = self.engine.write_batch_async(writes).await.into_iter();
        let results = results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| match written.next() {
                    Some(Ok(w)) => convert::batch_written(&w),
                    Some(Err(err)) => convert::batch_failure(&status::from_engine(&err)),
                    None => convert::batch_failure(&Status::internal(
                        "internal: the engine answered fewer batch items than it was given",
                    )),
                })
            })
            .collect();
        Ok(Response::new(pb::AppendBatchResponse { results }))
    }

    type AppendStreamStream = append_stream::Answers;

    async fn append_stream(
        &self,
        request: Request<tonic::Streaming<pb::AppendRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        Ok(Response::new(append_stream::serve(
            self.engine.clone(),
            request.into_inner(),
            self.shutdown.clone(),
        )))
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::TerminateResponse>, Status> {
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        let stream = convert::required_id("stream", r.stream)?;
        let terminal = r
            .terminal
            .map(convert::new_event)
            .ok_or_else(|| Status::invalid_argument("terminal is required: the terminal frame"))?;
        let t = self
            .engine
            .complete_async(&session, stream, r.expected_next_seq, terminal)
            .await
            .map_err(|err| status::from_engine(&err))?;
        Ok(Response::new(convert::terminated(&t)))
    }

    async fn abort(
        &self,
        request: Request<pb::AbortRequest>,
    ) -> Result<Response<pb::TerminateResponse>, Status> {
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        let stream = convert::required_id("stream", r.stream)?;
        let reason = convert::required_str("reason", r.reason)?;
        let terminal = r.terminal.map(convert::new_event);
        let t = self
            .engine
            .abort_async(&session, stream, &reason, terminal)
            .await
            .map_err(|err| status::from_engine(&err))?;
        Ok(Response::new(convert::terminated(&t)))
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        let stream = r.stream;
        // Leases and idle clocks are the leader's memory: a follower would renew nothing, and
        // a cut-off leader would vouch for a stream another leader already ended (issue 30
        // item 2, review R5). After this, the index holds everything committed.
        self.linearizable().await?;
        self.blocking(move |e| match stream {
            0 => e.touch_session(&session),
            stream => e.keep_alive(&session, stream),
        })
        .await?;
        Ok(Response::new(pb::KeepAliveResponse {}))
    }

    async fn resolve(
        &self,
        request: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::Resolution>, Status> {
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        let cursor = r.last_event_id;
        let declared = convert::optional_id(r.declared_stream);
        self.linearizable().await?;
        // A verdict is a few index lookups (microseconds, memory or page cache): answered
        // inline rather than paying a blocking-pool hand-off.
        let resolution = self
            .engine
            .resolve(&session, &cursor, declared)
            .map_err(|err| status::from_engine(&err))?;
        self.metrics.record_verdict(resolution.verdict);
        Ok(Response::new(convert::resolution(&resolution)))
    }

    type ReadStream = ReadStream;

    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        // Admitted or refused before any work: a call over the cap never waits.
        let slot = self.metrics.reads.acquire()?;
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        let batch_events_max = match r.batch_events_max {
            0 => READ_BATCH_EVENTS_DEFAULT,
            n => n,
        }
        .min(self.engine.config().read_events_max.max(1));
        let cursor = r.last_event_id;
        let declared = convert::optional_id(r.declared_stream);
        self.linearizable().await?;
        let resolution = {
            let session = session.clone();
            self.blocking(move |e| e.resolve(&session, &cursor, declared))
                .await?
        };
        self.metrics.record_verdict(resolution.verdict);
        let (tx, rx) = crate::read_pipe::pipe(self.metrics.reads.buffers());
        let reader = Reader {
            _slot: slot,
            engine: self.engine.clone(),
            metrics: Arc::clone(&self.metrics),
            shutdown: self.shutdown.clone(),
            tx,
            session,
            batch_events_max,
            batch_bytes_max: (self.message_bytes_max / 2).min(READ_BATCH_BYTES_TARGET),
            largest_event: std::sync::atomic::AtomicUsize::new(0),
            cluster: self.cluster.clone(),
        };
        tokio::spawn(reader.run(resolution, r.follow, r.resume_own_stream));
        Ok(Response::new(Box::pin(rx)))
    }

    async fn get_outcome(
        &self,
        request: Request<pb::GetOutcomeRequest>,
    ) -> Result<Response<pb::GetOutcomeResponse>, Status> {
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        self.linearizable().await?;
        let outcome = match r.stream {
            Some(stream) => {
                let stream = convert::required_id("stream", stream)?;
                self.blocking(move |e| e.stream_outcome(&session, stream))
                    .await?
            }
            None => {
                let correlation = convert::required_str("correlation", r.correlation)?;
                self.blocking(move |e| e.outcome(&session, &correlation))
                    .await?
            }
        };
        Ok(Response::new(convert::outcome(outcome)))
    }

    async fn trim(
        &self,
        request: Request<pb::TrimRequest>,
    ) -> Result<Response<pb::TrimResponse>, Status> {
        let r = request.into_inner();
        let session = convert::required_str("session", r.session)?;
        let stream = convert::required_id("stream", r.stream)?;
        let up_to_seq = convert::required_id("up_to_seq", r.up_to_seq)?;
        let watermark = self
            .blocking(move |e| e.trim(&session, stream, up_to_seq))
            .await?;
        Ok(Response::new(pb::TrimResponse { watermark }))
    }

    async fn stats(
        &self,
        _request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let stats = self.blocking(Engine::stats).await?;
        Ok(Response::new(convert::stats(
            &stats,
            self.metrics.active_followers(),
            &self.metrics.reads,
        )))
    }
}

/// Resolves once the server starts shutting down (or the shutdown signal is gone).
pub(crate) async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|down| *down).await;
}
