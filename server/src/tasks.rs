//! The tonic implementation of `cursorlog.v1.Tasks` (durable MCP tasks, issue 20,
//! docs/TASKS-DESIGN.md §3): validate, call the engine, map the error.
//!
//! Writes await the engine's `_async` forms (durable, on a cluster committed and applied,
//! before they answer; a follower answers NOT_LEADER as UNAVAILABLE with the leader hint,
//! through [`status::from_engine`], exactly as the event log's writes do). Reads (GetTask,
//! ListTasks) first await [`TasksService::linearizable`], as `Resolve` and `Read` do, so a
//! read right after a write through any replica sees it; they then read the index on the
//! blocking pool.
//!
//! `TaskStream` (`crate::task_stream`) runs the same calls, through these very methods, as
//! messages of one long-lived call.

use std::sync::Arc;

use cursorlog_engine::Engine;
use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::tasks_server::Tasks;
use cursorlog_replication::ReplicatedNode;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

use crate::convert::task as convert;
use crate::read_slots::ReadSlots;
use crate::service::{point_read, run_blocking};
use crate::status;

/// The tasks service state shared by all calls.
#[derive(Debug, Clone)]
pub struct TasksService {
    engine: Engine,
    /// The replicated node this service belongs to, if any: reads are served only once it
    /// proves it leads (see [`TasksService::linearizable`]).
    cluster: Option<ReplicatedNode>,
    /// The cap on long-lived reads (`--read-calls-max`): a WatchTask holds a slot for its
    /// life, as a following Read does, so watches cannot grow without bound.
    reads: Arc<ReadSlots>,
    /// Becomes `true` when the server shuts down: a `TaskStream` then ends UNAVAILABLE.
    shutdown: watch::Receiver<bool>,
}

impl TasksService {
    /// The service over `engine` of a single node (`cluster` `None`) or of a member of a
    /// replicated cluster; watches take their slots from `reads`, shared with `Read`;
    /// `TaskStream` calls end when `shutdown` becomes `true`.
    pub fn new(
        engine: Engine,
        cluster: Option<ReplicatedNode>,
        reads: Arc<ReadSlots>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            engine,
            cluster,
            reads,
            shutdown,
        }
    }

    /// The leader's address as this member knows it (`None` on a single node, or when it
    /// knows of none).
    pub fn leader_addr(&self) -> Option<String> {
        self.cluster.as_ref().and_then(ReplicatedNode::leader_addr)
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
}

#[tonic::async_trait]
impl Tasks for TasksService {
    async fn create_task(
        &self,
        request: Request<pb::CreateTaskRequest>,
    ) -> Result<Response<pb::CreateTaskResponse>, Status> {
        let req = convert::new_task(request.into_inner())?;
        let created = self
            .engine
            .create_task_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(pb::CreateTaskResponse {
            task: Some(convert::task(created.task)),
            created: created.created,
        }))
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::GetTaskResponse>, Status> {
        let r = request.into_inner();
        let task = convert::task_ref(r.owner, r.task_id)?;
        let include_outcome = r.include_outcome;
        self.linearizable().await?;
        let view = point_read(&self.engine, |e| e.task(&task, include_outcome))?;
        Ok(Response::new(convert::view(view)))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let r = request.into_inner();
        let after = convert::decode_cursor(&r.cursor)?;
        let (owner, page_size) = (r.owner, r.page_size);
        self.linearizable().await?;
        let page = run_blocking(&self.engine, move |e| {
            e.list_tasks(&owner, after, page_size)
        })
        .await?;
        Ok(Response::new(convert::page(page)))
    }

    async fn update_task(
        &self,
        request: Request<pb::UpdateTaskRequest>,
    ) -> Result<Response<pb::TaskResponse>, Status> {
        let req = convert::change(request.into_inner())?;
        let written = self
            .engine
            .change_task_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(pb::TaskResponse {
            task: Some(convert::task(written.task)),
            duplicate: written.duplicate,
        }))
    }

    async fn request_input(
        &self,
        request: Request<pb::RequestInputRequest>,
    ) -> Result<Response<pb::TaskResponse>, Status> {
        let req = convert::input_request(request.into_inner())?;
        let written = self
            .engine
            .request_task_input_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(pb::TaskResponse {
            task: Some(convert::task(written.task)),
            duplicate: written.duplicate,
        }))
    }

    async fn answer_input(
        &self,
        request: Request<pb::AnswerInputRequest>,
    ) -> Result<Response<pb::AnswerInputResponse>, Status> {
        let req = convert::input_answer(request.into_inner())?;
        let answered = self
            .engine
            .answer_task_input_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(pb::AnswerInputResponse {
            task: Some(convert::task(answered.task)),
            accepted: answered.accepted,
            ignored: answered.ignored,
        }))
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::CancelTaskResponse>, Status> {
        let req = convert::cancel(request.into_inner())?;
        let cancelled = self
            .engine
            .cancel_task_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(pb::CancelTaskResponse {
            task: Some(convert::task(cancelled.task)),
            already_terminal: cancelled.already_terminal,
        }))
    }

    async fn finish_task(
        &self,
        request: Request<pb::FinishTaskRequest>,
    ) -> Result<Response<pb::FinishTaskResponse>, Status> {
        let req = convert::finish(request.into_inner())?;
        let written = self
            .engine
            .finish_task_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(pb::FinishTaskResponse {
            task: Some(convert::task(written.task)),
            duplicate: written.duplicate,
        }))
    }

    async fn delete_task(
        &self,
        request: Request<pb::DeleteTaskRequest>,
    ) -> Result<Response<pb::DeleteTaskResponse>, Status> {
        let r = request.into_inner();
        let task = convert::task_ref(r.owner, r.task_id)?;
        let written = self
            .engine
            .delete_task_async(task)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(pb::DeleteTaskResponse {
            task: Some(convert::task(written.task)),
        }))
    }

    type WatchTaskStream = crate::task_watch::WatchStream;

    async fn watch_task(
        &self,
        request: Request<pb::WatchTaskRequest>,
    ) -> Result<Response<Self::WatchTaskStream>, Status> {
        let r = request.into_inner();
        let task = convert::task_ref(r.owner, r.task_id)?;
        let after = r.after_version;
        // Admitted (or refused RESOURCE_EXHAUSTED) before any work, as a Read is.
        let slot = self.reads.acquire()?;
        self.linearizable().await?;
        let watch = run_blocking(&self.engine, move |e| e.watch_task(&task, after)).await?;
        Ok(Response::new(crate::task_watch::stream(
            watch,
            self.cluster.clone(),
            slot,
        )))
    }

    async fn keep_alive_task(
        &self,
        request: Request<pb::KeepAliveTaskRequest>,
    ) -> Result<Response<pb::KeepAliveTaskResponse>, Status> {
        let r = request.into_inner();
        let task = convert::task_ref(r.owner, r.task_id)?;
        // Leases are the leader's memory: only the leader takes a renewal.
        self.linearizable().await?;
        run_blocking(&self.engine, move |e| e.keep_task_alive(&task)).await?;
        Ok(Response::new(pb::KeepAliveTaskResponse {}))
    }

    async fn enqueue_task_message(
        &self,
        request: Request<pb::EnqueueTaskMessageRequest>,
    ) -> Result<Response<pb::EnqueueTaskMessageResponse>, Status> {
        let req = convert::enqueue(request.into_inner())?;
        let q = self
            .engine
            .enqueue_task_message_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(pb::EnqueueTaskMessageResponse {
            qseq: q.qseq,
            duplicate: q.duplicate,
        }))
    }

    async fn dequeue_task_messages(
        &self,
        request: Request<pb::DequeueTaskMessagesRequest>,
    ) -> Result<Response<pb::DequeueTaskMessagesResponse>, Status> {
        let req = convert::dequeue(request.into_inner())?;
        let d = self
            .engine
            .dequeue_task_messages_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(convert::dequeued(d)))
    }

    async fn route_task_message(
        &self,
        request: Request<pb::RouteTaskMessageRequest>,
    ) -> Result<Response<pb::RouteTaskMessageResponse>, Status> {
        let req = convert::route(request.into_inner())?;
        let r = self
            .engine
            .route_task_message_async(req)
            .await
            .map_err(|e| status::from_engine(&e))?;
        Ok(Response::new(convert::routed(r)))
    }

    type TaskStreamStream = crate::task_stream::Answers;

    async fn task_stream(
        &self,
        request: Request<Streaming<pb::TaskStreamRequest>>,
    ) -> Result<Response<Self::TaskStreamStream>, Status> {
        Ok(Response::new(crate::task_stream::serve(
            self.clone(),
            self.cluster.clone(),
            request.into_inner(),
            self.shutdown.clone(),
        )))
    }
}
