//! `AppendStream`: `Append` over one long-lived call. A producer that appends event by event
//! pays for one HTTP/2 message per event instead of a whole unary call (stream, headers,
//! trailers, task); measured in `benches/README.md`.

use std::pin::Pin;

use cursorlog_engine::Engine;
use cursorlog_proto::v1 as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::service::{append_one, shutting_down};

/// Answers buffered before the handler waits for the client to read them.
const ANSWERS_DEPTH: usize = 16;

/// The response stream of an `AppendStream` call.
pub type Answers =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::AppendResult, Status>> + Send>>;

/// Handles the requests of one call in order, one at a time, each exactly like `Append`.
pub fn serve(
    engine: Engine,
    mut requests: Streaming<pb::AppendRequest>,
    mut shutdown: watch::Receiver<bool>,
) -> Answers {
    let (tx, rx) = mpsc::channel(ANSWERS_DEPTH);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                () = shutting_down(&mut shutdown) => {
                    let _ = tx.try_send(Err(Status::unavailable(
                        "server is shutting down; reconnect and resend unacknowledged appends \
                         with expected_next_seq",
                    )));
                    return;
                }
                next = requests.message() => next,
            };
            let request = match next {
                Ok(Some(r)) => r,
                Ok(None) => return, // the client finished sending
                Err(status) => {
                    tracing::debug!(error = %status, "AppendStream: client stream failed");
                    return;
                }
            };
            // Once queued, an append completes even if the client goes away meanwhile (as for
            // unary Append); a retry with expected_next_seq recognises it.
            let result = match append_one(&engine, request).await {
                Ok(appended) => pb::append_result::Result::Appended(appended),
                Err(status) => pb::append_result::Result::Failure(pb::Failure {
                    code: status.code() as i32,
                    message: status.message().to_owned(),
                }),
            };
            let answer = pb::AppendResult {
                result: Some(result),
            };
            if tx.send(Ok(answer)).await.is_err() {
                return; // the client is gone
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}
