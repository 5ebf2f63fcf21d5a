//! `WatchTask`: one task's changes as a server stream (docs/TASKS-DESIGN.md §1.9). The
//! engine's [`TaskWatch`] wakes on the commits that touch the task; each change is sent as
//! GetTask answers it, until the task's end was sent. On a cluster the leader serves it and
//! ends it `UNAVAILABLE` (naming the new leader) when it stops leading; the client watches
//! again from the last version it received, so nothing is lost.

use std::pin::Pin;

use cursorlog_engine::{self as engine, TaskWatch};
use cursorlog_proto::v1 as pb;
use cursorlog_replication::ReplicatedNode;
use tokio::sync::mpsc;
use tonic::Status;

use crate::convert::task as convert;
use crate::read_slots::ReadSlot;
use crate::status;

/// The stream a WatchTask call answers with.
pub type WatchStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::GetTaskResponse, Status>> + Send>>;

/// Changes a watch holds for a client that is slow to read (it reads the latest state
/// anyway: a full channel just waits).
const WATCH_BUFFER: usize = 4;

/// Streams `watch`'s changes until the task's end, the client leaving, the engine closing
/// or (on a cluster) this member no longer leading. `slot` (the call's place under
/// `--read-calls-max`) is held until then.
pub fn stream(watch: TaskWatch, cluster: Option<ReplicatedNode>, slot: ReadSlot) -> WatchStream {
    let (tx, rx) = mpsc::channel(WATCH_BUFFER);
    tokio::spawn(async move {
        run(watch, cluster, &tx).await;
        // The slot is free before the client can see the stream end.
        drop(slot);
        drop(tx);
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

async fn run(
    mut watch: TaskWatch,
    cluster: Option<ReplicatedNode>,
    tx: &mpsc::Sender<Result<pb::GetTaskResponse, Status>>,
) {
    loop {
        // The poll reads the index: off the async workers.
        let polled = tokio::task::spawn_blocking(move || {
            let change = watch.poll();
            (watch, change)
        })
        .await;
        let (w, change) = match polled {
            Ok(v) => v,
            Err(join) => {
                tracing::error!(error = %join, "task watch poll panicked");
                let _ = tx
                    .send(Err(Status::internal(
                        "task watch panicked; the server log has the details",
                    )))
                    .await;
                return;
            }
        };
        watch = w;
        match change {
            Ok(Some(view)) => {
                if tx.send(Ok(convert::view(view))).await.is_err() {
                    return;
                }
                if watch.is_done() {
                    return;
                }
                continue;
            }
            Ok(None) if watch.is_done() => return,
            Ok(None) => {}
            Err(engine::Error::Closed) => {
                let _ = tx
                    .send(Err(Status::unavailable("server is shutting down")))
                    .await;
                return;
            }
            Err(e) => {
                let _ = tx.send(Err(status::from_engine(&e))).await;
                return;
            }
        }
        tokio::select! {
            () = tx.closed() => return,
            () = crate::reader::deposed(cluster.as_ref()) => {
                let leader = cluster.as_ref().and_then(ReplicatedNode::leader_addr);
                let status = crate::cluster::retry_is(
                    crate::cluster::with_leader(
                        Status::unavailable("this member stopped leading: watch the task again on the leader, from the last version you received"),
                        leader.as_deref(),
                    ),
                    crate::cluster::Retry::Safe,
                );
                let _ = tx.send(Err(status)).await;
                return;
            }
            changed = watch.changed() => {
                if changed.is_err() {
                    let _ = tx.send(Err(Status::unavailable("server is shutting down"))).await;
                    return;
                }
            }
        }
    }
}
