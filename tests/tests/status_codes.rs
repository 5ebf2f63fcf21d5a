//! The status codes the API documents for requests tonic itself rejects, sent as raw frames
//! over a real connection: a message over `--grpc-message-bytes-max` is RESOURCE_EXHAUSTED
//! (tonic says OUT_OF_RANGE, which the API reserves for eviction), and a message that does
//! not decode is INVALID_ARGUMENT (tonic says INTERNAL, reserved for server bugs) — for
//! unary, server-streaming and bidirectional calls.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::{Buf as _, BufMut as _};
use cursorlog_tests::{open_stream, pb, Server};
use prost::Message as _;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

const TIMEOUT: Duration = Duration::from_secs(20);
/// The server's message limit in these tests (the smallest the payload limit allows).
const LIMIT: usize = 1024 + 64 * 1024;

/// Sends and receives message bodies as given: any bytes, valid protobuf or not.
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

fn server() -> Server {
    Server::start(&[
        "--payload-bytes-max",
        "1024",
        "--grpc-message-bytes-max",
        &LIMIT.to_string(),
    ])
}

async fn raw_client(server: &Server) -> tonic::client::Grpc<Channel> {
    tonic::client::Grpc::new(server.channel().await)
}

fn path(method: &str) -> PathAndQuery {
    format!("/cursorlog.v1.CursorLog/{method}").parse().unwrap()
}

async fn unary(grpc: &mut tonic::client::Grpc<Channel>, method: &str, body: Vec<u8>) -> Status {
    grpc.ready().await.unwrap();
    let call = grpc.unary(tonic::Request::new(body), path(method), Raw);
    match tokio::time::timeout(TIMEOUT, call).await.unwrap() {
        Ok(response) => panic!("{method} succeeded: {:?}", response.into_inner()),
        Err(status) => status,
    }
}

/// An `OpenSessionRequest` whose `session` (field 1) is these bytes, valid UTF-8 or not.
fn open_session_with(session: &[u8]) -> Vec<u8> {
    let mut body = vec![0x0a];
    prost::encoding::encode_varint(session.len() as u64, &mut body);
    body.extend_from_slice(session);
    body
}

/// An encoded message of exactly `len` bytes: an `OpenSessionRequest` with a long session id.
fn message_of(len: usize) -> Vec<u8> {
    let mut id = len - 4;
    while open_session_with(&vec![b'a'; id]).len() < len {
        id += 1;
    }
    let body = open_session_with(&vec![b'a'; id]);
    assert_eq!(body.len(), len);
    body
}

fn assert_code(status: &Status, code: Code, names: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(names),
        "{:?} does not name {names:?}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_requests_that_do_not_decode_are_invalid_argument() {
    let server = server();
    let mut grpc = raw_client(&server).await;
    // A string field that is not UTF-8.
    let status = unary(&mut grpc, "OpenSession", open_session_with(&[0xff, 0xfe])).await;
    assert_code(&status, Code::InvalidArgument, "OpenSessionRequest.session");
    // A length running past the end of the message.
    let status = unary(&mut grpc, "Resolve", vec![0x0a, 0x7f, b'x']).await;
    assert_code(&status, Code::InvalidArgument, "does not decode");
    // A wire type that does not exist.
    let status = unary(&mut grpc, "Append", vec![0x0f]).await;
    assert_code(&status, Code::InvalidArgument, "does not decode");
    // The connection is still good for valid calls.
    let mut c = server.client().await;
    let (_, stream) = open_stream(&mut c, "fine", None, None).await;
    assert!(stream > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_requests_over_the_message_limit_are_resource_exhausted() {
    let server = server();
    let mut grpc = raw_client(&server).await;
    let status = unary(&mut grpc, "OpenSession", message_of(LIMIT + 1)).await;
    assert_code(&status, Code::ResourceExhausted, &LIMIT.to_string());
    let status = unary(&mut grpc, "AppendBatch", vec![0; 4 * LIMIT]).await;
    assert_code(&status, Code::ResourceExhausted, "--grpc-message-bytes-max");
    // A message of exactly the limit passes the size check and reaches the handler, which
    // refuses the 69 KiB session id by name.
    let status = unary(&mut grpc, "OpenSession", message_of(LIMIT)).await;
    assert_code(&status, Code::InvalidArgument, "session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_requests_get_the_same_codes() {
    let server = server();
    let mut grpc = raw_client(&server).await;
    for (body, code) in [
        (open_session_with(&[0xc3]), Code::InvalidArgument),
        (message_of(LIMIT + 1), Code::ResourceExhausted),
    ] {
        grpc.ready().await.unwrap();
        let call = grpc.server_streaming(tonic::Request::new(body), path("Read"), Raw);
        let status = match tokio::time::timeout(TIMEOUT, call).await.unwrap() {
            Ok(response) => {
                let mut stream = response.into_inner();
                stream.message().await.expect_err("Read must fail")
            }
            Err(status) => status,
        };
        assert_eq!(status.code(), code, "{status:?}");
    }
}

/// In `AppendStream` the requests before the bad one are answered; then the call ends with
/// the bad request's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_stream_answers_what_came_before_a_bad_request_then_ends_with_its_code() {
    let server = server();
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let good = |seq: u64| {
        pb::AppendRequest {
            session: "s".into(),
            stream,
            expected_next_seq: Some(seq),
            events: vec![cursorlog_tests::event("progress", b"ok")],
        }
        .encode_to_vec()
    };
    let bad_utf8 = {
        let mut r = good(9);
        // Field 1 (`session`) again, not UTF-8: a later field occurrence replaces the first.
        r.extend_from_slice(&[0x0a, 0x01, 0xff]);
        r
    };
    let mut next_seq = 1;
    for (bad, code, names) in [
        (bad_utf8, Code::InvalidArgument, "AppendRequest.session"),
        (
            message_of(LIMIT + 1),
            Code::ResourceExhausted,
            "--grpc-message-bytes-max",
        ),
    ] {
        let requests = vec![good(next_seq), good(next_seq + 1), bad, good(next_seq + 2)];
        let mut grpc = raw_client(&server).await;
        grpc.ready().await.unwrap();
        let call = grpc.streaming(
            tonic::Request::new(tokio_stream::iter(requests)),
            path("AppendStream"),
            Raw,
        );
        let mut answers = tokio::time::timeout(TIMEOUT, call)
            .await
            .unwrap()
            .unwrap()
            .into_inner();
        for seq in [next_seq, next_seq + 1] {
            let answer = tokio::time::timeout(TIMEOUT, answers.message())
                .await
                .unwrap()
                .unwrap()
                .expect("an answer per request before the bad one");
            let answer = pb::AppendResult::decode(answer.as_slice()).unwrap();
            let Some(pb::append_result::Result::Appended(a)) = answer.result else {
                panic!("append {seq} failed: {answer:?}");
            };
            assert_eq!(a.event_ids, [format!("{epoch}-{stream}-{seq}")]);
        }
        let end = tokio::time::timeout(TIMEOUT, answers.message())
            .await
            .unwrap();
        let status = end.expect_err("the call ends with the bad request's status");
        assert_code(&status, code, names);
        next_seq += 2;
    }
    // Nothing after the bad request was appended.
    let r = cursorlog_tests::resolve(&mut c, "s", &format!("{epoch}-{stream}-0"), None).await;
    assert_eq!(r.head, Some(4));
}
