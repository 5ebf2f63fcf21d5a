//! The leader's pipeline against a scripted follower: a `Raft` service on a loopback port
//! whose `StreamAppend` answers only as each test says, reached through the real
//! [`NetworkFactory`] client (real HTTP/2, real encoding).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Cursor;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cursorlog_proto::raft_v1::raft_server::{Raft as RaftRpc, RaftServer};
use cursorlog_proto::raft_v1::{RaftReply, RaftRequest, SnapshotChunk};
use futures_util::{Stream, StreamExt as _};
use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetworkV2 as _};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use crate::client_options::ClientOptions;
use crate::codec;
use crate::network::NetworkFactory;
use crate::types::{Entry, LogId, Proposal, RaftNode, TypeConfig, Vote};

/// How the scripted follower answers a `StreamAppend` call.
#[derive(Debug, Clone, Copy)]
enum Script {
    /// Holds every answer until this many requests arrived (or the leader ended its side),
    /// then answers them all, in order, with the last log id each carried.
    AnswerOnceReceived(usize),
    /// Takes the requests and never answers.
    Silent,
    /// Does not serve `StreamAppend` (an older build); unary AppendEntries succeed.
    OlderBuild,
}

/// What a request carried: its entries and its last index.
type Received = (usize, Option<u64>);

/// The scripted follower: what it received, per request.
#[derive(Clone)]
struct Follower {
    script: Script,
    received: Arc<Mutex<Vec<Received>>>,
    unary_calls: Arc<Mutex<usize>>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<RaftReply, Status>> + Send>>;

fn last_of(rpc: &AppendEntriesRequest<TypeConfig>) -> Option<LogId> {
    rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id)
}

#[tonic::async_trait]
impl RaftRpc for Follower {
    async fn append_entries(
        &self,
        _request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        *self.unary_calls.lock().unwrap() += 1;
        let data = codec::encode("r", &AppendEntriesResponse::<TypeConfig>::Success).unwrap();
        Ok(Response::new(RaftReply { data: data.into() }))
    }

    type StreamAppendStream = Answers;

    async fn stream_append(
        &self,
        request: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let hold = match self.script {
            Script::OlderBuild => return Err(Status::unimplemented("no StreamAppend here")),
            Script::Silent => usize::MAX,
            Script::AnswerOnceReceived(n) => n,
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let received = Arc::clone(&self.received);
        tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let next = inbound.message().await;
                let ended = !matches!(next, Ok(Some(_)));
                if let Ok(Some(message)) = next {
                    let rpc: AppendEntriesRequest<TypeConfig> =
                        codec::decode("AppendEntries", &message.data).unwrap();
                    let last = last_of(&rpc);
                    received
                        .lock()
                        .unwrap()
                        .push((rpc.entries.len(), last.map(|l| l.index)));
                    held.push(last);
                }
                if (ended && hold != usize::MAX) || held.len() >= hold {
                    for last in held.drain(..) {
                        let result: StreamAppendResult<TypeConfig> = Ok(last);
                        let data = codec::encode("r", &result).unwrap();
                        if tx.send(Ok(RaftReply { data: data.into() })).await.is_err() {
                            return;
                        }
                    }
                }
                if ended {
                    // A silent follower keeps the call open until the leader drops it.
                    if hold == usize::MAX {
                        tx.closed().await;
                    }
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn vote(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn pre_vote(&self, _: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn install_snapshot(
        &self,
        _: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn transfer_leader(
        &self,
        _: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

/// Serves a follower following `script`; its address and what it receives.
async fn follower(script: Script) -> (String, Follower) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let follower = Follower {
        script,
        received: Arc::default(),
        unary_calls: Arc::default(),
    };
    let service = RaftServer::new(follower.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (addr, follower)
}

/// Requests carrying `sizes.len()` runs of entries of `sizes[i]` bytes each, one run per
/// request, continuing from index 10.
fn requests(runs: &[&[usize]]) -> Vec<AppendEntriesRequest<TypeConfig>> {
    let mut next = 10u64;
    runs.iter()
        .map(|sizes| {
            let prev = LogId::new_term_index(3, next - 1);
            let entries = sizes
                .iter()
                .map(|n| {
                    let e = Entry {
                        log_id: LogId::new_term_index(3, next),
                        payload: openraft::EntryPayload::Normal(Proposal::new(vec![7; *n])),
                    };
                    next += 1;
                    e
                })
                .collect();
            AppendEntriesRequest {
                vote: Vote::new_committed(3, 1),
                prev_log_id: Some(prev),
                leader_commit: Some(prev),
                entries,
            }
        })
        .collect()
}

/// What a pipeline of `rpcs` to the follower at `addr` answered (the factory is kept, so a
/// second call to it sees what the first learned of the peer).
async fn send(
    factory: &mut NetworkFactory<Cursor<Vec<u8>>>,
    addr: &str,
    rpcs: Vec<AppendEntriesRequest<TypeConfig>>,
) -> Vec<Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>> {
    let mut client = factory.client(2, &RaftNode::new(addr));
    let option = RPCOption::new(Duration::from_millis(100));
    let answers = match client
        .stream_append(futures_util::stream::iter(rpcs), option)
        .await
    {
        Ok(answers) => answers,
        Err(err) => return vec![Err(err)],
    };
    tokio::time::timeout(Duration::from_secs(60), answers.collect::<Vec<_>>())
        .await
        .expect("the answers end")
}

#[tokio::test]
async fn requests_go_out_before_the_ones_ahead_of_them_are_answered() {
    // The follower answers nothing until it holds all three: sent one at a time, the first
    // would wait for its answer and the call would end late.
    let (addr, follower) = follower(Script::AnswerOnceReceived(3)).await;
    let mut factory = NetworkFactory::new(1, ClientOptions::new());
    let answers = send(
        &mut factory,
        &addr,
        requests(&[&[100, 100], &[100], &[100, 100, 100]]),
    )
    .await;
    let acked: Vec<Option<u64>> = answers
        .into_iter()
        .map(|a| match a {
            Ok(Ok(last)) => last.map(|l| l.index),
            other => panic!("an answer failed: {other:?}"),
        })
        .collect();
    assert_eq!(acked, [Some(11), Some(12), Some(15)], "in the order sent");
    assert_eq!(
        *follower.received.lock().unwrap(),
        [(2, Some(11)), (1, Some(12)), (3, Some(15))]
    );
}

#[tokio::test]
async fn an_answer_that_does_not_come_ends_the_stream_as_a_timeout() {
    let (addr, follower) = follower(Script::Silent).await;
    let mut factory = NetworkFactory::new(1, ClientOptions::new());
    let answers = send(&mut factory, &addr, requests(&[&[10], &[10]])).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        matches!(answers[0], Err(RPCError::Timeout(_))),
        "{answers:?}"
    );
    assert_eq!(follower.received.lock().unwrap().len(), 2, "both were sent");
}

#[tokio::test]
async fn a_request_over_the_byte_budget_goes_as_a_prefix_and_nothing_after_it() {
    let (addr, follower) = follower(Script::AnswerOnceReceived(1)).await;
    // A message limit of 1 MiB caps a request's entries at 512 KiB.
    let options = ClientOptions::new().with_max_message_bytes(1 << 20);
    let mut factory = NetworkFactory::new(1, options);
    let answers = send(
        &mut factory,
        &addr,
        requests(&[&[200 << 10, 200 << 10, 200 << 10], &[10]]),
    )
    .await;
    let acked: Vec<_> = answers
        .iter()
        .map(|a| match a {
            Ok(Ok(last)) => last.map(|l| l.index),
            other => panic!("an answer failed: {other:?}"),
        })
        .collect();
    assert_eq!(acked, [Some(11)], "the prefix's last entry, then the end");
    assert_eq!(*follower.received.lock().unwrap(), [(2, Some(11))]);
}

#[tokio::test]
async fn a_peer_without_the_call_gets_appends_one_at_a_time() {
    let (addr, follower) = follower(Script::OlderBuild).await;
    let mut factory = NetworkFactory::new(1, ClientOptions::new());
    let first = send(&mut factory, &addr, requests(&[&[10]])).await;
    assert!(
        matches!(first[..], [Err(RPCError::Network(_))]),
        "retried at once, not backed off: {first:?}"
    );
    let second = send(&mut factory, &addr, requests(&[&[10], &[10]])).await;
    assert!(
        second.iter().all(|a| matches!(a, Ok(Ok(Some(_))))),
        "{second:?}"
    );
    assert_eq!(*follower.unary_calls.lock().unwrap(), 2);
}
