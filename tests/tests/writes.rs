//! `AppendBatch` limits and per-item failures, and `AppendStream` pipelining (many requests
//! in flight, answered in order; a failure in the middle stops nothing; one stream's appends
//! keep their order) — through the real binary.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use cursorlog_tests::{assert_contiguous, event, open_stream, pb, read_all, read_request, Server};
use pb::append_result::Result as Answer;
use pb::batch_result::Result as Item;
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(60);

fn append_item(
    session: &str,
    stream: u64,
    seq: Option<u64>,
    events: Vec<pb::NewEvent>,
) -> pb::BatchItem {
    pb::BatchItem {
        item: Some(pb::batch_item::Item::Append(pb::AppendRequest {
            session: session.into(),
            stream,
            expected_next_seq: seq,
            events,
        })),
    }
}

/// A batch result as `Ok(first seq)` or `Err(code)`.
fn outcome(result: &pb::BatchResult) -> Result<u64, Code> {
    match result.result.as_ref().unwrap() {
        Item::Appended(a) => Ok(a.first_seq),
        Item::Completed(t) => Ok(t.terminal_seq),
        Item::Opened(o) => Ok(o.stream),
        Item::Failure(f) => Err(Code::from_i32(f.code)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_batch_limits_and_per_item_failures() {
    let server = Server::start(&["--payload-bytes-max", "1024", "--batch-events-max", "4"]);
    let mut c = server.client().await;
    let r = c
        .append_batch(pb::AppendBatchRequest { items: vec![] })
        .await;
    let status = r.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("items"), "{status:?}");

    // Exactly the item limit, all on one stream: applied in item order.
    let (epoch, a) = open_stream(&mut c, "s", None, None).await;
    let items = (0..4096)
        .map(|i: u32| append_item("s", a, None, vec![event("progress", &i.to_be_bytes())]))
        .collect();
    let results = c
        .append_batch(pb::AppendBatchRequest { items })
        .await
        .unwrap()
        .into_inner()
        .results;
    let seqs: Vec<_> = results.iter().map(outcome).collect();
    assert_eq!(seqs, (1..=4096).map(Ok).collect::<Vec<_>>());
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{a}-4090"), false),
        TIMEOUT,
    )
    .await;
    assert_contiguous(&all.events, 4091, 4096);
    assert_eq!(&all.events[0].payload[..], &4090_u32.to_be_bytes());

    // Every kind of failure fails its own item only, and consumes no seq.
    let (_, done) = open_stream(&mut c, "s", None, None).await;
    c.complete(pb::CompleteRequest {
        session: "s".into(),
        stream: done,
        expected_next_seq: None,
        terminal: Some(event("result", b"r")),
    })
    .await
    .unwrap();
    let (_, expired_stream) = open_stream(&mut c, "old", None, None).await;
    c.expire_session(pb::ExpireSessionRequest {
        session: "old".into(),
    })
    .await
    .unwrap();
    let ok = |seq| append_item("s", a, Some(seq), vec![event("progress", b"ok")]);
    let items = vec![
        ok(4097),
        append_item("s", a, None, vec![event("progress", &[0; 1025])]),
        append_item("s", a, None, (0..5).map(|_| event("p", b"x")).collect()),
        append_item(
            "s",
            a,
            Some(1),
            vec![event("progress", b"not the original")],
        ),
        append_item("s", done, None, vec![event("progress", b"late")]),
        append_item("old", expired_stream, None, vec![event("progress", b"x")]),
        append_item("s", a, None, vec![]),
        append_item("", a, None, vec![event("progress", b"x")]),
        pb::BatchItem {
            item: Some(pb::batch_item::Item::Complete(pb::CompleteRequest {
                session: "s".into(),
                stream: a,
                expected_next_seq: None,
                terminal: None,
            })),
        },
        ok(4097), // a retry of the first item: the same seq, a duplicate
        ok(4098),
    ];
    let results = c
        .append_batch(pb::AppendBatchRequest { items })
        .await
        .unwrap()
        .into_inner()
        .results;
    let got: Vec<_> = results.iter().map(outcome).collect();
    assert_eq!(
        got,
        [
            Ok(4097),
            Err(Code::ResourceExhausted),
            Err(Code::ResourceExhausted),
            Err(Code::Aborted),
            Err(Code::FailedPrecondition),
            Err(Code::FailedPrecondition),
            Err(Code::InvalidArgument),
            Err(Code::InvalidArgument),
            Err(Code::InvalidArgument),
            Ok(4097),
            Ok(4098),
        ]
    );
    let Some(Item::Appended(retry)) = &results[9].result else {
        unreachable!()
    };
    assert!(retry.duplicate);
    let messages: Vec<String> = results
        .iter()
        .filter_map(|r| match &r.result {
            Some(Item::Failure(f)) => Some(f.message.clone()),
            _ => None,
        })
        .collect();
    for (message, names) in messages.iter().zip([
        "1024",
        "4",
        "seq",
        "completed",
        // Its stream was aborted when the session expired.
        "aborted",
        "events",
        "session",
        "terminal",
    ]) {
        assert!(
            message.contains(names),
            "{message:?} does not name {names:?}"
        );
    }
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{a}-4096"), false),
        TIMEOUT,
    )
    .await;
    assert_contiguous(&all.events, 4097, 4098);
}

/// 1,000 requests on one call, sent without waiting for answers (more than the server keeps
/// in flight per call), over two streams, with two failing requests in the middle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_stream_pipelines_many_requests_in_order() {
    const REQUESTS: usize = 1000;
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, a) = open_stream(&mut c, "s", None, None).await;
    let (_, b) = open_stream(&mut c, "s", None, None).await;
    let before = c.stats(pb::StatsRequest {}).await.unwrap().into_inner();

    let request = |i: usize| {
        let (stream, expected) = match i {
            500 => (999_999, None), // unknown stream: NOT_FOUND
            700 => (a, Some(1)),    // seq 1 holds other events: ABORTED
            i if i % 2 == 0 => (a, None),
            _ => (b, None),
        };
        pb::AppendRequest {
            session: "s".into(),
            stream,
            expected_next_seq: expected,
            events: vec![event("progress", format!("request {i}").as_bytes())],
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel(REQUESTS);
    for i in 0..REQUESTS {
        tx.send(request(i)).await.unwrap();
    }
    drop(tx);
    let mut answers = c
        .append_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::with_capacity(REQUESTS);
    while let Some(answer) = tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .expect("answers keep coming")
        .unwrap()
    {
        got.push(answer.result.unwrap());
    }
    assert_eq!(got.len(), REQUESTS, "one answer per request");

    let (mut next_a, mut next_b) = (1, 1);
    for (i, answer) in got.iter().enumerate() {
        match (i, answer) {
            (500, Answer::Failure(f)) => assert_eq!(Code::from_i32(f.code), Code::NotFound),
            (700, Answer::Failure(f)) => assert_eq!(Code::from_i32(f.code), Code::Aborted),
            (_, Answer::Appended(x)) => {
                // In request order: each stream's seqs follow the order requests were sent.
                let next = if x.stream == a {
                    &mut next_a
                } else {
                    &mut next_b
                };
                assert_eq!(x.first_seq, *next, "request {i}");
                *next += 1;
            }
            (i, other) => panic!("request {i}: {other:?}"),
        }
    }
    // Each stream holds its requests' events in the order they were sent.
    for (stream, parity, count) in [(a, 0, next_a - 1), (b, 1, next_b - 1)] {
        let all = read_all(
            &mut c,
            read_request("s", &format!("{epoch}-{stream}-0"), false),
            TIMEOUT,
        )
        .await;
        assert_contiguous(&all.events, 1, count);
        let sent: Vec<String> = (0..REQUESTS)
            .filter(|i| i % 2 == parity && *i != 500 && *i != 700)
            .map(|i| format!("request {i}"))
            .collect();
        let stored: Vec<String> = all
            .events
            .iter()
            .map(|e| String::from_utf8(e.payload.to_vec()).unwrap())
            .collect();
        assert_eq!(stored, sent);
    }
    // Requests in flight together shared group commits: fewer commits than appends.
    let after = c.stats(pb::StatsRequest {}).await.unwrap().into_inner();
    let commits = after.commit_batches - before.commit_batches;
    assert!(
        commits < (REQUESTS - 2) as u64,
        "{commits} group commits for {} appends: the requests were not pipelined",
        REQUESTS - 2
    );
}
