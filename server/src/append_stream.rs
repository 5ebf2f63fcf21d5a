//! `AppendStream`: `Append` over one long-lived call. A producer that appends event by event
//! pays for one HTTP/2 message per event instead of a whole unary call (stream, headers,
//! trailers, task); measured in `benches/HISTORY.md`.
//!
//! Requests are pipelined: each is validated and queued to the engine as soon as it is read
//! (so requests of one call share group commits and keep their order), and the answers are
//! yielded in request order as they become durable. The answer stream is driven by the
//! call's own response task: no task or channel of its own.
//!
//! A request that cannot be read (over the message size limit: RESOURCE_EXHAUSTED; not a
//! valid message: INVALID_ARGUMENT) ends the call with that status, after the requests read
//! before it are answered.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use cursorlog_engine::{self as engine, Engine};
use cursorlog_proto::v1 as pb;
use tokio::sync::watch;
use tonic::{Status, Streaming};

use crate::convert;
use crate::service::shutting_down;
use crate::status;

/// The response stream of an `AppendStream` call.
pub type Answers =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::AppendResult, Status>> + Send>>;

/// Most requests of one call queued and not yet answered: beyond it the call stops reading
/// until the oldest is answered (bounds the memory one call holds).
const IN_FLIGHT_MAX: usize = 256;

type Pending = Pin<Box<dyn Future<Output = pb::AppendResult> + Send>>;

/// What the answer stream holds between answers.
struct Call {
    engine: Engine,
    requests: Streaming<pb::AppendRequest>,
    shutdown: watch::Receiver<bool>,
    /// Queued requests, oldest first, each resolving to its answer.
    in_flight: VecDeque<Pending>,
    /// The client finished sending (or its stream failed): answer what is queued, then end.
    input_done: bool,
    /// Why the request stream failed, if it did (a message over the size limit, one that
    /// does not decode, ...): the call ends with this status once the queued requests are
    /// answered.
    input_error: Option<Status>,
}

/// Handles the requests of one call in order, each exactly like `Append`, pipelined.
///
/// A request that was read is queued to the engine at once; if the client goes away it
/// still completes (as for unary `Append`), and a retry with `expected_next_seq`
/// recognises it.
pub fn serve(
    engine: Engine,
    requests: Streaming<pb::AppendRequest>,
    shutdown: watch::Receiver<bool>,
) -> Answers {
    let call = Call {
        engine,
        requests,
        shutdown,
        in_flight: VecDeque::new(),
        input_done: false,
        input_error: None,
    };
    Box::pin(futures_util::stream::unfold(Some(call), next_answer))
}

/// Queues one request (awaiting room in the writer's queue, never blocking); its answer
/// (success or failure) is the returned future's output.
async fn queue(engine: &Engine, r: pb::AppendRequest) -> Pending {
    let req = (|| {
        Ok::<_, Status>(engine::Append {
            session: convert::required_str("session", r.session)?,
            stream: convert::required_id("stream", r.stream)?,
            expected_next_seq: r.expected_next_seq,
            events: convert::new_events(r.events)?,
        })
    })();
    let queued = match req {
        Ok(req) => engine
            .queue_append(req)
            .await
            .map_err(|err| status::from_engine(&err)),
        Err(status) => Err(status),
    };
    let result = |r| pb::AppendResult { result: Some(r) };
    match queued {
        Err(status) => {
            let answer = result(pb::append_result::Result::Failure(convert::failure(
                &status,
            )));
            Box::pin(std::future::ready(answer))
        }
        Ok(durable) => Box::pin(async move {
            result(match durable.await {
                Ok(a) => pb::append_result::Result::Appended(convert::appended(&a)),
                Err(err) => {
                    pb::append_result::Result::Failure(convert::failure(&status::from_engine(&err)))
                }
            })
        }),
    }
}

/// The answer to the call's oldest queued request; `None` ends the call.
async fn next_answer(
    call: Option<Call>,
) -> Option<(Result<pb::AppendResult, Status>, Option<Call>)> {
    let mut call = call?;
    loop {
        if call.input_done && call.in_flight.is_empty() {
            return call.input_error.take().map(|status| (Err(status), None));
        }
        let can_read = !call.input_done && call.in_flight.len() < IN_FLIGHT_MAX;
        tokio::select! {
            biased;
            () = shutting_down(&mut call.shutdown) => {
                let status = Status::unavailable(
                    "server is shutting down; reconnect and resend unacknowledged appends \
                     with expected_next_seq",
                );
                return Some((Err(status), None));
            }
            answer = async { call.in_flight.front_mut()?.as_mut().await.into() },
                if !call.in_flight.is_empty() =>
            {
                let answer: Option<pb::AppendResult> = answer;
                call.in_flight.pop_front();
                if let Some(answer) = answer {
                    return Some((Ok(answer), Some(call)));
                }
            }
            next = call.requests.message(), if can_read => match next {
                Ok(Some(r)) => {
                    let pending = queue(&call.engine, r).await;
                    call.in_flight.push_back(pending);
                }
                Ok(None) => call.input_done = true,
                Err(status) => {
                    tracing::debug!(error = %status, "AppendStream: request stream failed");
                    call.input_done = true;
                    call.input_error = Some(status);
                }
            },
        }
    }
}
