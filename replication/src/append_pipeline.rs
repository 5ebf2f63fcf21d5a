//! AppendEntries as a pipeline: the leader side of the `StreamAppend` call.
//!
//! openraft's default `stream_append` sends one AppendEntries, waits for its answer and only
//! then sends the next, so a follower is never working on more than one request and every
//! entry proposed meanwhile waits a whole round trip (the follower's decode, write and
//! `fdatasync`, and the answer's way back) before it even leaves the leader. Here the leader
//! keeps up to [`PIPELINE_DEPTH`] requests on one bidirectional gRPC stream: each is sent as
//! soon as openraft produces it (everything submitted to the leader's log since the last one),
//! and the follower, which handles the requests of one stream strictly in order
//! (`Raft::stream_append`), answers each in turn. The answers come back in the order sent,
//! which is what openraft requires of a pipelined transport.
//!
//! What each request is bound by, as for a unary AppendEntries (`crate::network`):
//! - **bytes**: the peer's [`AppendBudget`]; a request larger than it is cut to a prefix, and
//!   then nothing more is sent on this stream (openraft starts the next stream from what the
//!   follower acknowledged);
//! - **time**: each answer is due [`append_deadline`] after its request was sent; a late one
//!   ends the stream with a [`RPCError::Timeout`];
//! - **errors**: a failed status ends the stream with the same openraft error a unary call
//!   would get; a follower that ends the stream with requests unanswered is a network error.

use std::collections::VecDeque;
use std::time::Duration;

use cursorlog_proto::raft_v1::{RaftReply, RaftRequest};
use futures_util::{Stream, StreamExt as _};
use openraft::error::{NetworkError, RPCError, Unreachable};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use openraft::RPCTypes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use crate::append_limit::{append_deadline, prefix_to_send, request_bytes, AppendBudget};
use crate::codec;
use crate::types::{NodeId, TypeConfig};

/// Most AppendEntries requests on one stream that are sent and not yet answered. The
/// follower writes them one after another, so more than a few only queue there; a few let
/// the leader's next entries travel and be decoded while the follower syncs the last ones.
pub const PIPELINE_DEPTH: usize = 8;

/// What an answer of the stream is to openraft.
pub type Answer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// One request on the wire, waiting for its answer.
#[derive(Debug)]
struct Sent {
    /// Its entries' bytes (the budget's measure).
    bytes: usize,
    /// When its answer is late.
    due: Instant,
}

/// How a failed call becomes an openraft error (`crate::network`'s table).
pub(crate) trait ErrorMap: Send + 'static {
    /// The error for a call whose answer did not come within `deadline`.
    fn timeout(&self, action: RPCTypes, deadline: Duration) -> RPCError<TypeConfig>;
    /// The error for a call that failed with `status`.
    fn status(&self, status: &Status, action: RPCTypes, deadline: Duration)
        -> RPCError<TypeConfig>;
}

/// The leader's end of one `StreamAppend` call (see the module docs).
pub(crate) struct Pipeline<S, E> {
    /// openraft's requests.
    input: S,
    /// Where requests go on the wire; `None` once nothing more is to be sent (openraft's
    /// requests ended, or a request was cut to a prefix).
    outbound: Option<mpsc::Sender<RaftRequest>>,
    /// The follower's answers.
    replies: Streaming<RaftReply>,
    /// The requests sent and not answered, oldest first.
    sent: VecDeque<Sent>,
    budget: AppendBudget,
    max_message_bytes: usize,
    /// The deadline of a request without entries (openraft's TTL, at least a second).
    base_deadline: Duration,
    target: NodeId,
    errors: E,
    /// An error or a refusal was yielded: the stream is over.
    ended: bool,
}

/// The outbound half of a `StreamAppend` call, and the sender that feeds it.
pub(crate) fn outbound() -> (
    mpsc::Sender<RaftRequest>,
    impl Stream<Item = RaftRequest> + Send + 'static,
) {
    let (tx, rx) = mpsc::channel::<RaftRequest>(PIPELINE_DEPTH);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|request| (request, rx))
    });
    (tx, stream)
}

impl<S, E> Pipeline<S, E>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin + Send + 'static,
    E: ErrorMap,
{
    /// The pipeline of an opened call: `input` goes out through `outbound`, answers come from
    /// `replies`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        input: S,
        outbound: mpsc::Sender<RaftRequest>,
        replies: Streaming<RaftReply>,
        budget: AppendBudget,
        max_message_bytes: usize,
        base_deadline: Duration,
        target: NodeId,
        errors: E,
    ) -> Self {
        Self {
            input,
            outbound: Some(outbound),
            replies,
            sent: VecDeque::with_capacity(PIPELINE_DEPTH),
            budget,
            max_message_bytes,
            base_deadline,
            target,
            errors,
            ended: false,
        }
    }

    /// The answers, in the order of openraft's requests; the stream ends after the first
    /// error or refusal, or once openraft's requests ended and every one was answered.
    pub(crate) fn answers(self) -> impl Stream<Item = Answer> + Send + 'static {
        futures_util::stream::unfold(self, |mut pipeline| async move {
            if pipeline.ended {
                return None;
            }
            let answer = pipeline.next_answer().await?;
            pipeline.ended = !matches!(answer, Ok(Ok(_)));
            Some((answer, pipeline))
        })
    }

    /// Sends what openraft produces while there is room, until the oldest request's answer
    /// comes (or is late). `None`: nothing is left to send or to wait for.
    async fn next_answer(&mut self) -> Option<Answer> {
        loop {
            let room = self.outbound.is_some() && self.sent.len() < PIPELINE_DEPTH;
            let due = self.sent.front().map(|s| s.due);
            if !room && due.is_none() {
                return None;
            }
            tokio::select! {
                biased;
                reply = self.replies.message(), if due.is_some() => {
                    return Some(self.answer(reply));
                }
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    return Some(Err(self.late()));
                }
                next = self.input.next(), if room => match next {
                    // openraft has nothing more for this stream: the follower's side of the
                    // call ends once it answered what was sent.
                    None => self.outbound = None,
                    Some(rpc) => {
                        if let Err(err) = self.send(&rpc) {
                            return Some(Err(err));
                        }
                    }
                },
            }
        }
    }

    /// Puts `rpc` (or the prefix of it the budget allows) on the wire.
    fn send(&mut self, rpc: &AppendEntriesRequest<TypeConfig>) -> Result<(), RPCError<TypeConfig>> {
        let limit = self.budget.limit().min(self.max_message_bytes / 2);
        let prefix = prefix_to_send(rpc, limit);
        let sending = prefix.as_ref().unwrap_or(rpc);
        let bytes = request_bytes(sending);
        let data = codec::encode("AppendEntries", sending)
            .map_err(|err| RPCError::Network(NetworkError::new(&err)))?;
        let Some(outbound) = &self.outbound else {
            return Err(self.closed());
        };
        // The channel holds at most what is unanswered, which is below its capacity here.
        if outbound
            .try_send(RaftRequest { data: data.into() })
            .is_err()
        {
            return Err(self.closed());
        }
        self.sent.push_back(Sent {
            bytes,
            due: Instant::now() + append_deadline(self.base_deadline, bytes),
        });
        if prefix.is_some() {
            // The rest of openraft's entries are not sent: their requests would not follow
            // on from what the follower holds. openraft's next stream starts from the
            // prefix's answer.
            self.outbound = None;
        }
        Ok(())
    }

    /// The oldest request's answer.
    fn answer(&mut self, reply: Result<Option<RaftReply>, Status>) -> Answer {
        let Some(sent) = self.sent.pop_front() else {
            return Err(RPCError::Network(NetworkError::from_string(format!(
                "node {} answered an append nobody sent",
                self.target
            ))));
        };
        match reply {
            Ok(Some(reply)) => {
                self.budget.answered(sent.bytes);
                // An answer that does not decode is a version or codec mismatch: back off.
                codec::decode("StreamAppendResult", &reply.data)
                    .map_err(|err| RPCError::Unreachable(Unreachable::new(&err)))
            }
            Ok(None) => Err(RPCError::Network(NetworkError::from_string(format!(
                "node {} ended the append stream with {} request(s) unanswered",
                self.target,
                self.sent.len() + 1
            )))),
            Err(status) => {
                self.failed(sent.bytes, &status);
                let deadline = append_deadline(self.base_deadline, sent.bytes);
                Err(self
                    .errors
                    .status(&status, RPCTypes::AppendEntries, deadline))
            }
        }
    }

    /// The oldest request's answer is late.
    fn late(&mut self) -> RPCError<TypeConfig> {
        let bytes = self.sent.front().map_or(0, |s| s.bytes);
        self.failed(bytes, &"no answer in time");
        self.errors.timeout(
            RPCTypes::AppendEntries,
            append_deadline(self.base_deadline, bytes),
        )
    }

    /// The call's outbound half is gone (the call ended under us).
    fn closed(&self) -> RPCError<TypeConfig> {
        RPCError::Network(NetworkError::from_string(format!(
            "the append stream to node {} closed",
            self.target
        )))
    }

    /// A request of `bytes` failed: the next ones carry fewer bytes.
    fn failed(&self, bytes: usize, why: &dyn std::fmt::Display) {
        self.budget.failed_to(self.target, bytes, why);
    }
}

#[cfg(test)]
mod tests;
