//! `AppendStream`: `Append` over one long-lived call. A producer that appends event by event
//! pays for one HTTP/2 message per event instead of a whole unary call (stream, headers,
//! trailers, task); measured in `benches/README.md`.
//!
//! The answers are a stream that reads the next request and appends it when polled, so the
//! call's own response task drives it: no task or channel of its own, one task wake-up less
//! per event (measured in `benches/README.md`).

use std::pin::Pin;

use cursorlog_engine::Engine;
use cursorlog_proto::v1 as pb;
use tokio::sync::watch;
use tonic::{Status, Streaming};

use crate::service::{append_one, shutting_down};

/// The response stream of an `AppendStream` call.
pub type Answers =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::AppendResult, Status>> + Send>>;

/// What the answer stream holds between answers.
struct Call {
    engine: Engine,
    requests: Streaming<pb::AppendRequest>,
    shutdown: watch::Receiver<bool>,
}

/// Handles the requests of one call in order, one at a time, each exactly like `Append`.
///
/// An append whose request was read is queued to the engine before the answer is awaited;
/// if the client goes away meanwhile it still completes (as for unary `Append`), and a
/// retry with `expected_next_seq` recognises it.
pub fn serve(
    engine: Engine,
    requests: Streaming<pb::AppendRequest>,
    shutdown: watch::Receiver<bool>,
) -> Answers {
    let call = Call {
        engine,
        requests,
        shutdown,
    };
    Box::pin(futures_util::stream::unfold(Some(call), next_answer))
}

/// The answer to the call's next request; `None` ends the call.
async fn next_answer(
    call: Option<Call>,
) -> Option<(Result<pb::AppendResult, Status>, Option<Call>)> {
    let mut call = call?;
    let next = tokio::select! {
        () = shutting_down(&mut call.shutdown) => {
            let status = Status::unavailable(
                "server is shutting down; reconnect and resend unacknowledged appends \
                 with expected_next_seq",
            );
            return Some((Err(status), None));
        }
        next = call.requests.message() => next,
    };
    let request = match next {
        Ok(Some(r)) => r,
        Ok(None) => return None, // the client finished sending
        Err(status) => {
            tracing::debug!(error = %status, "AppendStream: client stream failed");
            return None;
        }
    };
    let result = match append_one(&call.engine, request).await {
        Ok(appended) => pb::append_result::Result::Appended(appended),
        Err(status) => pb::append_result::Result::Failure(pb::Failure {
            code: status.code() as i32,
            message: status.message().to_owned(),
        }),
    };
    let answer = pb::AppendResult {
        result: Some(result),
    };
    Some((Ok(answer), Some(call)))
}
