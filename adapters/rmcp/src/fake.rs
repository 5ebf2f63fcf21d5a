//! An in-process stand-in for cursorlog in unit tests: a tonic server that answers what the
//! tests need (sessions, batched appends, keep-alives), can fail appends in transit, and
//! counts what it was asked. Everything else is `UNIMPLEMENTED`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cursorlog_proto::v1 as pb;
use pb::cursor_log_server::{CursorLog, CursorLogServer};
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use crate::{BearerToken, Client};

/// What the fake does and what it saw.
#[derive(Debug, Default)]
pub(crate) struct Fake {
    /// The next this many `AppendBatch` calls fail with UNAVAILABLE.
    pub(crate) batch_failures: AtomicU32,
    /// `AppendBatch` calls received (failed ones included).
    pub(crate) batch_calls: AtomicU32,
    /// `open` items carried out (streams opened, numbered from 100).
    pub(crate) opens: AtomicU64,
    /// Streams whose appends each fail with FAILED_PRECONDITION.
    pub(crate) refused_stream: Mutex<Option<u64>>,
    /// `(session, stream)` of every KeepAlive.
    pub(crate) keepalives: Mutex<Vec<(String, u64)>>,
    /// When set, this fake is a follower: every batch item fails UNAVAILABLE "this node is
    /// not the leader (the leader is at ADDR)", as a replicated cursorlog's follower answers.
    pub(crate) leader_is: Mutex<Option<String>>,
    /// `GetSessionResponse.idle_ttl_ms`.
    pub(crate) idle_ttl_ms: u64,
    pub(crate) changed: Notify,
}

#[derive(Debug, Clone)]
struct Service(Arc<Fake>);

fn unimplemented<T>() -> Result<T, Status> {
    Err(Status::unimplemented("not in the fake"))
}

/// Starts the fake on a free port and returns a client for it.
pub(crate) async fn start(fake: Arc<Fake>) -> Client {
    let addr = serve(fake).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_lazy();
    Client::from_channel(
        channel,
        BearerToken::default(),
        crate::failover::Failover::no_wait(),
    )
}

/// Starts the fake on a free port and returns its address.
pub(crate) async fn serve(fake: Arc<Fake>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CursorLogServer::new(Service(fake)))
            .serve_with_incoming(incoming),
    );
    addr
}

type Stream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl CursorLog for Service {
    async fn open_session(
        &self,
        r: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        Ok(Response::new(pb::OpenSessionResponse {
            session: r.into_inner().session,
            epoch: 1,
            created: true,
            state: Vec::new(),
        }))
    }
    async fn get_session(
        &self,
        r: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::GetSessionResponse>, Status> {
        Ok(Response::new(pb::GetSessionResponse {
            session: r.into_inner().session,
            epoch: 1,
            idle_ttl_ms: self.0.idle_ttl_ms,
            ..Default::default()
        }))
    }
    async fn set_session_state(
        &self,
        _: Request<pb::SetSessionStateRequest>,
    ) -> Result<Response<pb::SetSessionStateResponse>, Status> {
        unimplemented()
    }
    async fn advance_epoch(
        &self,
        _: Request<pb::AdvanceEpochRequest>,
    ) -> Result<Response<pb::AdvanceEpochResponse>, Status> {
        unimplemented()
    }
    async fn expire_session(
        &self,
        _: Request<pb::ExpireSessionRequest>,
    ) -> Result<Response<pb::ExpireSessionResponse>, Status> {
        unimplemented()
    }
    async fn open_stream(
        &self,
        _: Request<pb::OpenStreamRequest>,
    ) -> Result<Response<pb::OpenStreamResponse>, Status> {
        unimplemented()
    }
    async fn append(
        &self,
        _: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        unimplemented()
    }
    type AppendStreamStream = Stream<pb::AppendResult>;
    async fn append_stream(
        &self,
        _: Request<tonic::Streaming<pb::AppendRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        unimplemented()
    }
    async fn append_batch(
        &self,
        r: Request<pb::AppendBatchRequest>,
    ) -> Result<Response<pb::AppendBatchResponse>, Status> {
        self.0.batch_calls.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .0
            .batch_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(Status::unavailable("the fake drops this call in transit"));
        }
        let refused = *self.0.refused_stream.lock().expect("lock");
        let leader = self.0.leader_is.lock().expect("lock").clone();
        let results = r
            .into_inner()
            .items
            .into_iter()
            .map(|item| {
                use pb::batch_result::Result as R;
                let result = match item.item {
                    _ if leader.is_some() => R::Failure(pb::Failure {
                        code: tonic::Code::Unavailable as i32,
                        message: format!(
                            "this node is not the leader (the leader is at {}): send writes to \
                             the leader",
                            leader.as_deref().unwrap_or_default()
                        ),
                    }),
                    Some(pb::batch_item::Item::Append(a)) if Some(a.stream) == refused => {
                        R::Failure(pb::Failure {
                            code: tonic::Code::FailedPrecondition as i32,
                            message: format!("stream {} is terminated", a.stream),
                        })
                    }
                    Some(pb::batch_item::Item::Append(a)) => {
                        let seq = a.expected_next_seq.unwrap_or(1);
                        R::Appended(pb::AppendResponse {
                            epoch: 1,
                            stream: a.stream,
                            first_seq: seq,
                            last_seq: seq,
                            duplicate: false,
                            event_ids: vec![format!("1-{}-{seq}", a.stream)],
                        })
                    }
                    Some(pb::batch_item::Item::Complete(c)) => {
                        let seq = c.expected_next_seq.unwrap_or(1);
                        R::Completed(pb::TerminateResponse {
                            stream: c.stream,
                            state: pb::StreamState::Completed as i32,
                            terminal_seq: seq,
                            terminal_event_id: format!("1-{}-{seq}", c.stream),
                            duplicate: false,
                        })
                    }
                    Some(pb::batch_item::Item::Open(o)) => {
                        let stream = 100 + self.0.opens.fetch_add(1, Ordering::SeqCst);
                        R::Opened(pb::OpenStreamResponse {
                            stream,
                            epoch: o.epoch,
                            start_event_id: format!("{}-{stream}-0", o.epoch),
                        })
                    }
                    None => R::Failure(pb::Failure {
                        code: tonic::Code::InvalidArgument as i32,
                        message: "empty item".into(),
                    }),
                };
                pb::BatchResult {
                    result: Some(result),
                }
            })
            .collect();
        Ok(Response::new(pb::AppendBatchResponse { results }))
    }
    async fn complete(
        &self,
        _: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::TerminateResponse>, Status> {
        unimplemented()
    }
    async fn abort(
        &self,
        _: Request<pb::AbortRequest>,
    ) -> Result<Response<pb::TerminateResponse>, Status> {
        unimplemented()
    }
    async fn keep_alive(
        &self,
        r: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let r = r.into_inner();
        self.0
            .keepalives
            .lock()
            .expect("lock")
            .push((r.session, r.stream));
        self.0.changed.notify_waiters();
        Ok(Response::new(pb::KeepAliveResponse {}))
    }
    async fn resolve(
        &self,
        _: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::Resolution>, Status> {
        unimplemented()
    }
    type ReadStream = Stream<pb::ReadResponse>;
    async fn read(
        &self,
        _: Request<pb::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        unimplemented()
    }
    async fn get_outcome(
        &self,
        _: Request<pb::GetOutcomeRequest>,
    ) -> Result<Response<pb::GetOutcomeResponse>, Status> {
        unimplemented()
    }
    async fn trim(
        &self,
        _: Request<pb::TrimRequest>,
    ) -> Result<Response<pb::TrimResponse>, Status> {
        unimplemented()
    }
    async fn stats(
        &self,
        _: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        unimplemented()
    }
}
