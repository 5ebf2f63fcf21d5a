//! `TaskStream`: the unary task calls over one long-lived call (issue 31 item 3). A client
//! that makes task calls one after another pays one HTTP/2 message per call instead of a
//! whole HTTP/2 stream (headers, trailers, a task per stream), which was 50–60% of the
//! server's instructions per unary task call.
//!
//! Each request is dispatched to the unary handler of its call ([`TasksService`]'s `Tasks`
//! methods), so validation, durability and errors are the unary RPC's. Calls are pipelined
//! (many run at once; their writes share group commits) and answered as each completes, by
//! id. Calls naming the same (owner, task_id) run one after another in request order: a
//! call starts once the stream's earlier call on that task was answered. The answer stream
//! is driven by the call's own response task: no task or channel of its own.
//!
//! The stream ends with UNAVAILABLE at once on shutdown; on a cluster member that does not
//! lead (or stops leading) it stops reading, answers every call it read, and ends with
//! UNAVAILABLE naming the leader, `cursorlog-retry: safe` (what it did not answer it never
//! read). A request that cannot be read ends the stream with that status after the calls
//! read before it are answered.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;

use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::tasks_server::Tasks;
use cursorlog_replication::ReplicatedNode;
use futures_util::stream::{FuturesUnordered, StreamExt};
use pb::task_stream_request::Call as Q;
use pb::task_stream_response::Result as A;
use tokio::sync::watch;
use tonic::{Request, Status, Streaming};

use crate::cluster::{LEADER_HEADER, RETRY_HEADER};
use crate::service::shutting_down;
use crate::tasks::TasksService;

/// The response stream of a `TaskStream` call.
pub type Answers =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::TaskStreamResponse, Status>> + Send>>;

/// Most calls of one stream read and not yet answered (running or waiting for an earlier
/// call on their task): beyond it the stream stops reading until one is answered.
const IN_FLIGHT_MAX: usize = 256;

/// The task a call names: calls with the same key run in request order.
type Key = (String, String);

/// A running call: its task key (if any) and its answer.
type Running = Pin<Box<dyn Future<Output = (Option<Key>, pb::TaskStreamResponse)> + Send>>;

/// What the answer stream holds between answers.
struct Stream {
    service: TasksService,
    requests: Streaming<pb::TaskStreamRequest>,
    shutdown: watch::Receiver<bool>,
    /// Resolves when this member does not lead (never on a single node).
    deposed: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The calls running now.
    running: FuturesUnordered<Running>,
    /// For each task with a call running: the calls on it read since, oldest first.
    waiting: HashMap<Key, VecDeque<(u64, Q)>>,
    /// Calls read and not yet answered (running and waiting).
    unanswered: usize,
    /// No more requests are read: answer what was read, then end.
    input_done: bool,
    /// The status the stream ends with once every call read is answered (`None`: OK).
    end: Option<Status>,
}

/// Serves one `TaskStream` call of `service`.
pub fn serve(
    service: TasksService,
    cluster: Option<ReplicatedNode>,
    requests: Streaming<pb::TaskStreamRequest>,
    shutdown: watch::Receiver<bool>,
) -> Answers {
    let stream = Stream {
        service,
        requests,
        shutdown,
        deposed: Box::pin(async move { crate::reader::deposed(cluster.as_ref()).await }),
        running: FuturesUnordered::new(),
        waiting: HashMap::new(),
        unanswered: 0,
        input_done: false,
        end: None,
    };
    Box::pin(futures_util::stream::unfold(Some(stream), next_answer))
}

/// The (owner, task_id) a call names, if it names one.
fn key_of(call: &Q) -> Option<Key> {
    let (owner, task_id) = match call {
        Q::CreateTask(r) => (&r.owner, &r.task_id),
        Q::GetTask(r) => (&r.owner, &r.task_id),
        Q::UpdateTask(r) => (&r.owner, &r.task_id),
        Q::RequestInput(r) => (&r.owner, &r.task_id),
        Q::AnswerInput(r) => (&r.owner, &r.task_id),
        Q::CancelTask(r) => (&r.owner, &r.task_id),
        Q::FinishTask(r) => (&r.owner, &r.task_id),
        Q::DeleteTask(r) => (&r.owner, &r.task_id),
        Q::KeepAliveTask(r) => (&r.owner, &r.task_id),
        Q::EnqueueTaskMessage(r) => (&r.owner, &r.task_id),
        Q::DequeueTaskMessages(r) => (&r.owner, &r.task_id),
        Q::ListTasks(_) | Q::RouteTaskMessage(_) => return None,
    };
    Some((owner.clone(), task_id.clone()))
}

/// A failed call's answer: its status with the headers a client routes by.
pub fn failure(status: &Status) -> pb::TaskCallFailure {
    let header = |name: &str| {
        status
            .metadata()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    pb::TaskCallFailure {
        code: status.code() as i32,
        message: status.message().to_owned(),
        leader: header(LEADER_HEADER),
        retry: header(RETRY_HEADER),
    }
}

/// Runs one call through its unary handler.
async fn run(service: TasksService, call: Q) -> Result<A, Status> {
    /// `handler(request)` of the unary RPC, its response as the answer `variant`.
    macro_rules! unary {
        ($handler:ident, $request:expr, $variant:ident) => {
            service
                .$handler(Request::new($request))
                .await
                .map(|r| A::$variant(r.into_inner()))
        };
    }
    match call {
        Q::CreateTask(r) => unary!(create_task, r, CreateTask),
        Q::GetTask(r) => unary!(get_task, r, GetTask),
        Q::ListTasks(r) => unary!(list_tasks, r, ListTasks),
        Q::UpdateTask(r) => unary!(update_task, r, UpdateTask),
        Q::RequestInput(r) => unary!(request_input, r, RequestInput),
        Q::AnswerInput(r) => unary!(answer_input, r, AnswerInput),
        Q::CancelTask(r) => unary!(cancel_task, r, CancelTask),
        Q::FinishTask(r) => unary!(finish_task, r, FinishTask),
        Q::DeleteTask(r) => unary!(delete_task, r, DeleteTask),
        Q::KeepAliveTask(r) => unary!(keep_alive_task, r, KeepAliveTask),
        Q::EnqueueTaskMessage(r) => unary!(enqueue_task_message, r, EnqueueTaskMessage),
        Q::DequeueTaskMessages(r) => unary!(dequeue_task_messages, r, DequeueTaskMessages),
        Q::RouteTaskMessage(r) => unary!(route_task_message, r, RouteTaskMessage),
    }
}

/// A call's answer as a future that also yields its task key.
fn start(service: &TasksService, key: Option<Key>, id: u64, call: Q) -> Running {
    let service = service.clone();
    Box::pin(async move {
        let result = match run(service, call).await {
            Ok(answer) => answer,
            Err(status) => A::Failure(failure(&status)),
        };
        let answer = pb::TaskStreamResponse {
            id,
            result: Some(result),
        };
        (key, answer)
    })
}

impl Stream {
    /// Takes one request: starts its call, or queues it behind the running call on its task.
    fn accept(&mut self, request: pb::TaskStreamRequest) {
        self.unanswered += 1;
        let id = request.id;
        let Some(call) = request.call else {
            let answer = pb::TaskStreamResponse {
                id,
                result: Some(A::Failure(failure(&Status::invalid_argument(
                    "call is required: a TaskStreamRequest names one task call",
                )))),
            };
            self.running
                .push(Box::pin(std::future::ready((None, answer))));
            return;
        };
        let key = key_of(&call);
        if let Some(key) = key {
            if let Some(queue) = self.waiting.get_mut(&key) {
                queue.push_back((id, call));
                return;
            }
            self.waiting.insert(key.clone(), VecDeque::new());
            let running = start(&self.service, Some(key), id, call);
            self.running.push(running);
        } else {
            let running = start(&self.service, None, id, call);
            self.running.push(running);
        }
    }

    /// The call on `key` was answered: starts the next one on that task, if any.
    fn answered(&mut self, key: Option<Key>) {
        self.unanswered -= 1;
        let Some(key) = key else { return };
        let next = match self.waiting.get_mut(&key) {
            Some(queue) => queue.pop_front(),
            None => None,
        };
        match next {
            Some((id, call)) => {
                let running = start(&self.service, Some(key), id, call);
                self.running.push(running);
            }
            None => {
                self.waiting.remove(&key);
            }
        }
    }
}

/// The status a stream ends with when its member does not lead.
fn deposed_status(cluster_leader: Option<String>) -> Status {
    let message = match &cluster_leader {
        Some(l) => format!(
            "this member does not lead: send the calls that were not answered to the leader at {l}"
        ),
        None => {
            "this member does not lead: send the calls that were not answered to the new leader"
                .into()
        }
    };
    crate::cluster::retry_is(
        crate::cluster::with_leader(Status::unavailable(message), cluster_leader.as_deref()),
        crate::cluster::Retry::Safe,
    )
}

/// The next answer of the stream; `None` ends it.
async fn next_answer(
    stream: Option<Stream>,
) -> Option<(Result<pb::TaskStreamResponse, Status>, Option<Stream>)> {
    let mut s = stream?;
    loop {
        if s.input_done && s.unanswered == 0 {
            return s.end.take().map(|status| (Err(status), None));
        }
        let can_read = !s.input_done && s.unanswered < IN_FLIGHT_MAX;
        tokio::select! {
            biased;
            () = shutting_down(&mut s.shutdown) => {
                let status = Status::unavailable(
                    "server is shutting down; calls not answered have an unknown outcome",
                );
                return Some((Err(status), None));
            }
            Some((key, answer)) = s.running.next(), if !s.running.is_empty() => {
                s.answered(key);
                return Some((Ok(answer), Some(s)));
            }
            () = s.deposed.as_mut(), if !s.input_done => {
                s.input_done = true;
                s.end = Some(deposed_status(s.service.leader_addr()));
            }
            next = s.requests.message(), if can_read => match next {
                Ok(Some(request)) => s.accept(request),
                Ok(None) => s.input_done = true,
                Err(status) => {
                    tracing::debug!(error = %status, "TaskStream: request stream failed");
                    s.input_done = true;
                    s.end = Some(status);
                }
            },
        }
    }
}
