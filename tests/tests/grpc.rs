//! Every RPC of `cursorlog.v1.CursorLog` over a real connection to the real binary, including
//! every error status the service maps engine errors to.

#![allow(clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::time::Duration;

use cursorlog_tests::{
    append, assert_contiguous, event, open_stream, pb, read_all, read_all_watched, read_request,
    resolve, run_tool, ReadProgress, Server,
};
use pb::{StreamState, Verdict};
use tonic::Code;

const READ_TIMEOUT: Duration = Duration::from_secs(20);

fn assert_status<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, names: &str) {
    let status = result.expect_err("expected an error status");
    assert_eq!(status.code(), code, "unexpected status: {status:?}");
    assert!(
        status.message().contains(names),
        "status message {:?} does not name {names:?}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_open_advance_and_expire() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let first = c
        .open_session(pb::OpenSessionRequest {
            session: "s1".into(),
            state: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (first.session.as_str(), first.epoch, first.created),
        ("s1", 1, true)
    );
    let again = c
        .open_session(pb::OpenSessionRequest {
            session: "s1".into(),
            state: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (again.epoch, again.created),
        (1, false),
        "open_session must be idempotent"
    );

    let (_, old_stream) = open_stream(&mut c, "s1", None, None).await;
    let advanced = c
        .advance_epoch(pb::AdvanceEpochRequest {
            session: "s1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(advanced.epoch, 2);
    assert_eq!(advanced.superseded_streams, vec![old_stream]);
    let r = resolve(&mut c, "s1", &format!("1-{old_stream}-0"), None).await;
    assert_eq!(r.verdict(), Verdict::EpochMismatch);
    assert_eq!(r.current_epoch, Some(2));

    // A producer that still believes in epoch 1 is refused.
    let stale = c
        .open_stream(pb::OpenStreamRequest {
            session: "s1".into(),
            epoch: 1,
            correlation: None,
            lease_ms: None,
        })
        .await;
    assert_status(stale, Code::FailedPrecondition, "epoch");
    // Appending to the superseded stream is refused.
    let superseded = c
        .append(pb::AppendRequest {
            session: "s1".into(),
            stream: old_stream,
            expected_next_seq: None,
            events: vec![event("progress", b"late")],
        })
        .await;
    assert_status(superseded, Code::FailedPrecondition, "superseded");

    let (epoch, open) = open_stream(&mut c, "s1", None, None).await;
    assert_eq!(epoch, 2);
    let expired = c
        .expire_session(pb::ExpireSessionRequest {
            session: "s1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(expired.aborted_streams, vec![open]);
    let r = resolve(&mut c, "s1", &format!("2-{open}-0"), None).await;
    assert_eq!(r.verdict(), Verdict::UnknownSession);
    assert!(r.session_expired);
    let after_expiry = c
        .open_stream(pb::OpenStreamRequest {
            session: "s1".into(),
            epoch: 2,
            correlation: None,
            lease_ms: None,
        })
        .await;
    assert_status(after_expiry, Code::FailedPrecondition, "expired");

    let unknown = c
        .advance_epoch(pb::AdvanceEpochRequest {
            session: "nobody".into(),
        })
        .await;
    assert_status(unknown, Code::NotFound, "session");
    let unknown = c
        .expire_session(pb::ExpireSessionRequest {
            session: "nobody".into(),
        })
        .await;
    assert_status(unknown, Code::NotFound, "session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_is_idempotent_and_complete_is_terminal() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", Some("req-1"), None).await;
    let batch = pb::AppendRequest {
        session: "s".into(),
        stream,
        expected_next_seq: Some(1),
        events: vec![
            event("progress", b"10%"),
            event("progress", b"20%"),
            event("progress", b"30%"),
        ],
    };
    let first = c.append(batch.clone()).await.unwrap().into_inner();
    assert_eq!(
        (first.epoch, first.stream, first.first_seq, first.last_seq),
        (epoch, stream, 1, 3)
    );
    assert!(!first.duplicate);
    let ids: Vec<String> = (1..=3).map(|q| format!("{epoch}-{stream}-{q}")).collect();
    assert_eq!(first.event_ids, ids);

    // The retry of the same batch writes nothing and returns the same ids.
    let retry = c.append(batch.clone()).await.unwrap().into_inner();
    assert!(retry.duplicate);
    assert_eq!(
        (retry.first_seq, retry.last_seq, retry.event_ids),
        (1, 3, ids)
    );

    // An expected seq that does not fit the head is a conflict.
    let conflict = c
        .append(pb::AppendRequest {
            expected_next_seq: Some(9),
            ..batch.clone()
        })
        .await;
    assert_status(conflict, Code::Aborted, "seq");

    let done = c
        .complete(pb::CompleteRequest {
            session: "s".into(),
            stream,
            expected_next_seq: Some(4),
            terminal: Some(event("result", b"{\"ok\":true}")),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.state(), StreamState::Completed);
    assert_eq!(done.terminal_seq, 4);
    assert_eq!(done.terminal_event_id, format!("{epoch}-{stream}-4"));

    let after = c
        .append(pb::AppendRequest {
            expected_next_seq: None,
            ..batch.clone()
        })
        .await;
    assert_status(after, Code::FailedPrecondition, "terminated");
    let again = c
        .complete(pb::CompleteRequest {
            session: "s".into(),
            stream,
            expected_next_seq: None,
            terminal: Some(event("result", b"second")),
        })
        .await;
    assert_status(again, Code::FailedPrecondition, "terminated");

    let outcome = c
        .get_outcome(pb::GetOutcomeRequest {
            session: "s".into(),
            correlation: "req-1".into(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(outcome.found);
    let outcome = outcome.outcome.unwrap();
    assert_eq!((outcome.stream, outcome.epoch), (stream, epoch));
    assert_eq!(outcome.state(), StreamState::Completed);
    assert_eq!(outcome.terminal_seq, Some(4));
    assert_eq!(
        outcome.terminal_event_id,
        Some(format!("{epoch}-{stream}-4"))
    );
    let frame = outcome.frame.unwrap();
    assert_eq!((frame.seq, frame.kind.as_str()), (4, "result"));
    assert_eq!(frame.payload, &b"{\"ok\":true}"[..]);

    let missing = c
        .get_outcome(pb::GetOutcomeRequest {
            session: "s".into(),
            correlation: "req-404".into(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!missing.found && missing.outcome.is_none());

    // The same outcome addressed by stream id; another session's stream is never revealed.
    let by_stream = c
        .get_outcome(pb::GetOutcomeRequest {
            session: "s".into(),
            correlation: String::new(),
            stream: Some(stream),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_stream.outcome.unwrap().frame.unwrap().seq, 4);
    c.open_session(pb::OpenSessionRequest {
        session: "other".into(),
        state: None,
    })
    .await
    .unwrap();
    let foreign = c
        .get_outcome(pb::GetOutcomeRequest {
            session: "other".into(),
            correlation: String::new(),
            stream: Some(stream),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!foreign.found && foreign.outcome.is_none());

    // Once finished, the stream's frames are never replayed, not even from its start: the
    // client reconciles from the outcome instead.
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{stream}-0"), true),
        READ_TIMEOUT,
    )
    .await;
    assert!(all.error.is_none(), "{:?}", all.error);
    let resolution = all.resolution.unwrap();
    assert_eq!(resolution.verdict(), Verdict::StreamTerminated);
    assert!(resolution.missed_terminal_frame);
    assert!(all.events.is_empty() && all.end.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_replays_from_the_start_and_ends_at_the_terminal_frame() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    append(&mut c, "s", stream, "progress", &[b"10%", b"20%", b"30%"]).await;
    let start = format!("{epoch}-{stream}-0");
    let all = read_all(&mut c, read_request("s", &start, false), READ_TIMEOUT).await;
    assert!(all.error.is_none(), "{:?}", all.error);
    assert_eq!(all.resolution.unwrap().verdict(), Verdict::Resumable);
    assert_contiguous(&all.events, 1, 3);
    assert_eq!(all.events[1].payload, &b"20%"[..]);
    assert_eq!(all.events[2].id, format!("{epoch}-{stream}-3"));
    assert!(
        all.end.is_none(),
        "without follow, an open stream's read ends at the head"
    );

    // A follower started before the terminal frame gets it and then the end message.
    let mut follower = server.client().await;
    let (progress, mut watched) = tokio::sync::watch::channel(ReadProgress::default());
    let follow = tokio::spawn(async move {
        let request = read_request("s", &start, true);
        read_all_watched(&mut follower, request, READ_TIMEOUT, Some(progress)).await
    });
    // It has replayed seqs 1..=3, the head: it follows the live stream now.
    watched.wait_for(|p| p.events >= 3).await.unwrap();
    c.complete(pb::CompleteRequest {
        session: "s".into(),
        stream,
        expected_next_seq: Some(4),
        terminal: Some(event("result", b"done")),
    })
    .await
    .unwrap();
    let all = follow.await.unwrap();
    assert!(all.error.is_none(), "{:?}", all.error);
    assert_contiguous(&all.events, 1, 4);
    assert_eq!(all.events[3].kind, "result");
    let end = all.end.expect("end message after the terminal frame");
    assert_eq!((end.state(), end.terminal_seq), (StreamState::Completed, 4));
    assert_eq!(end.terminal_event_id, format!("{epoch}-{stream}-4"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_keep_alive_and_unknown_streams() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", Some("req-2"), Some(60_000)).await;
    append(&mut c, "s", stream, "progress", &[b"a"]).await;
    c.keep_alive(pb::KeepAliveRequest {
        session: "s".into(),
        stream,
    })
    .await
    .unwrap();

    let aborted = c
        .abort(pb::AbortRequest {
            session: "s".into(),
            stream,
            reason: "client cancelled".into(),
            terminal: Some(event("error", b"{\"code\":-32800}")),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(aborted.state(), StreamState::Aborted);
    assert_eq!(aborted.terminal_seq, 2);
    let outcome = c
        .get_outcome(pb::GetOutcomeRequest {
            session: "s".into(),
            correlation: "req-2".into(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner()
        .outcome
        .unwrap();
    assert_eq!(outcome.state(), StreamState::Aborted);
    assert_eq!(outcome.reason.as_deref(), Some("client cancelled"));
    assert_eq!(outcome.frame.unwrap().payload, &b"{\"code\":-32800}"[..]);
    let r = resolve(&mut c, "s", &format!("{epoch}-{stream}-1"), None).await;
    assert_eq!(r.verdict(), Verdict::StreamTerminated);
    assert_eq!(r.stream_state(), StreamState::Aborted);
    assert_eq!(r.detail.as_deref(), Some("client cancelled"));

    let after = c
        .keep_alive(pb::KeepAliveRequest {
            session: "s".into(),
            stream,
        })
        .await;
    assert_status(after, Code::FailedPrecondition, "terminated");

    let missing = 987_654_321;
    let r = c
        .keep_alive(pb::KeepAliveRequest {
            session: "s".into(),
            stream: missing,
        })
        .await;
    assert_status(r, Code::NotFound, &missing.to_string());
    let r = c
        .abort(pb::AbortRequest {
            session: "s".into(),
            stream: missing,
            reason: "x".into(),
            terminal: None,
        })
        .await;
    assert_status(r, Code::NotFound, "stream");
    // Another session's stream is not found either, and not revealed.
    c.open_session(pb::OpenSessionRequest {
        session: "other".into(),
        state: None,
    })
    .await
    .unwrap();
    let r = c
        .append(pb::AppendRequest {
            session: "other".into(),
            stream,
            expected_next_seq: None,
            events: vec![event("progress", b"x")],
        })
        .await;
    assert_status(r, Code::NotFound, "stream");
    let r = c
        .append(pb::AppendRequest {
            session: "never-opened".into(),
            stream,
            expected_next_seq: None,
            events: vec![event("progress", b"x")],
        })
        .await;
    assert_eq!(r.unwrap_err().code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_answers_every_verdict_with_its_facts() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (e, s) = open_stream(&mut c, "s", None, None).await;
    append(&mut c, "s", s, "progress", &[b"1", b"2", b"3", b"4", b"5"]).await;
    let (_, other_stream) = open_stream(&mut c, "s", None, None).await;
    let (_, foreign) = open_stream(&mut c, "t", None, None).await;

    let r = resolve(&mut c, "s", "evt-4471", None).await;
    assert_eq!(r.verdict(), Verdict::MalformedCursor);
    assert!(r.cursor.is_none());
    assert!(r.detail.is_some());
    let r = resolve(&mut c, "s", "", None).await;
    assert_eq!(r.verdict(), Verdict::MalformedCursor);

    let r = resolve(&mut c, "no-such-session", &format!("{e}-{s}-1"), None).await;
    assert_eq!(r.verdict(), Verdict::UnknownSession);
    assert!(!r.session_expired);

    let r = resolve(&mut c, "s", &format!("{}-{s}-1", e + 1), None).await;
    assert_eq!(r.verdict(), Verdict::EpochMismatch);
    assert_eq!(r.current_epoch, Some(e));

    let r = resolve(&mut c, "s", &format!("{e}-999999-1"), None).await;
    assert_eq!(r.verdict(), Verdict::UnknownCursor);
    // Another session's stream looks exactly like a stream that does not exist.
    let r_foreign = resolve(&mut c, "s", &format!("{e}-{foreign}-0"), None).await;
    assert_eq!(r_foreign.verdict(), Verdict::UnknownCursor);
    assert_eq!((r_foreign.head, r_foreign.stream_state), (None, None));

    let r = resolve(&mut c, "s", &format!("{e}-{s}-2"), Some(other_stream)).await;
    assert_eq!(r.verdict(), Verdict::StreamMismatch);

    let r = resolve(&mut c, "s", &format!("{e}-{s}-9"), None).await;
    assert_eq!(r.verdict(), Verdict::CursorAhead);
    assert_eq!(r.head, Some(5));

    let r = resolve(&mut c, "s", &format!("{e}-{s}-2"), Some(s)).await;
    assert_eq!(r.verdict(), Verdict::Resumable);
    let cursor = r.cursor.unwrap();
    assert_eq!((cursor.epoch, cursor.stream, cursor.seq), (e, s, 2));
    assert_eq!(
        (r.head, r.watermark, r.terminal_seq),
        (Some(5), Some(1), None)
    );
    assert_eq!(r.stream_state(), StreamState::Open);

    let trimmed = c
        .trim(pb::TrimRequest {
            session: "s".into(),
            stream: s,
            up_to_seq: 3,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(trimmed.watermark, 4);
    let r = resolve(&mut c, "s", &format!("{e}-{s}-1"), None).await;
    assert_eq!(r.verdict(), Verdict::CursorEvicted);
    assert_eq!(r.watermark, Some(4));
    // Every event after seq 3 is retained, so seq 3 is still a continuation point.
    let r = resolve(&mut c, "s", &format!("{e}-{s}-3"), None).await;
    assert_eq!(r.verdict(), Verdict::Resumable);

    c.complete(pb::CompleteRequest {
        session: "s".into(),
        stream: s,
        expected_next_seq: None,
        terminal: Some(event("result", b"done")),
    })
    .await
    .unwrap();
    let at_terminal = resolve(&mut c, "s", &format!("{e}-{s}-6"), None).await;
    assert_eq!(at_terminal.verdict(), Verdict::StreamTerminated);
    assert!(!at_terminal.missed_terminal_frame);
    assert_eq!(at_terminal.terminal_seq, Some(6));
    assert_eq!(at_terminal.stream_state(), StreamState::Completed);
    let before = resolve(&mut c, "s", &format!("{e}-{s}-4"), None).await;
    assert_eq!(before.verdict(), Verdict::StreamTerminated);
    assert!(before.missed_terminal_frame);

    // Read of a non-resumable cursor delivers the verdict and nothing else.
    let all = read_all(
        &mut c,
        read_request("s", &format!("{e}-{s}-1"), true),
        READ_TIMEOUT,
    )
    .await;
    assert!(all.error.is_none());
    assert_eq!(all.resolution.unwrap().verdict(), Verdict::StreamTerminated);
    assert!(all.events.is_empty() && all.end.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_name_the_field() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;

    let r = c
        .open_session(pb::OpenSessionRequest {
            session: String::new(),
            state: None,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "session");
    let r = c
        .advance_epoch(pb::AdvanceEpochRequest {
            session: String::new(),
        })
        .await;
    assert_status(r, Code::InvalidArgument, "session");
    let r = c
        .expire_session(pb::ExpireSessionRequest {
            session: String::new(),
        })
        .await;
    assert_status(r, Code::InvalidArgument, "session");
    let open = pb::OpenStreamRequest {
        session: "s".into(),
        epoch,
        correlation: None,
        lease_ms: None,
    };
    let r = c
        .open_stream(pb::OpenStreamRequest {
            epoch: 0,
            ..open.clone()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "epoch");
    let r = c
        .open_stream(pb::OpenStreamRequest {
            lease_ms: Some(0),
            ..open.clone()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "lease_ms");
    let r = c
        .open_stream(pb::OpenStreamRequest {
            session: String::new(),
            ..open
        })
        .await;
    assert_status(r, Code::InvalidArgument, "session");

    let batch = pb::AppendRequest {
        session: "s".into(),
        stream,
        expected_next_seq: None,
        events: vec![event("progress", b"x")],
    };
    let r = c
        .append(pb::AppendRequest {
            stream: 0,
            ..batch.clone()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "stream");
    let r = c
        .append(pb::AppendRequest {
            events: Vec::new(),
            ..batch.clone()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "events");
    let r = c
        .append(pb::AppendRequest {
            session: String::new(),
            ..batch.clone()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "session");
    // Engine-side validation: an oversized kind is refused, naming the field.
    let long_kind = pb::NewEvent {
        kind: "k".repeat(10_000),
        correlation: None,
        payload: Vec::new(),
    };
    let r = c
        .append(pb::AppendRequest {
            events: vec![long_kind],
            ..batch.clone()
        })
        .await;
    assert_eq!(r.unwrap_err().code(), Code::InvalidArgument);

    let r = c
        .complete(pb::CompleteRequest {
            session: "s".into(),
            stream,
            expected_next_seq: None,
            terminal: None,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "terminal");
    let r = c
        .abort(pb::AbortRequest {
            session: "s".into(),
            stream,
            reason: String::new(),
            terminal: None,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "reason");
    // Stream 0 renews only the session: fine for a live one, NOT_FOUND for an unknown one.
    c.keep_alive(pb::KeepAliveRequest {
        session: "s".into(),
        stream: 0,
    })
    .await
    .unwrap();
    let r = c
        .keep_alive(pb::KeepAliveRequest {
            session: "never-opened".into(),
            stream: 0,
        })
        .await;
    assert_status(r, Code::NotFound, "session");
    let r = c
        .resolve(pb::ResolveRequest {
            session: String::new(),
            last_event_id: "1-1-1".into(),
            declared_stream: None,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "session");
    let r = c.read(read_request("", "1-1-1", false)).await;
    assert_status(r.map(|_| ()), Code::InvalidArgument, "session");
    let r = c
        .get_outcome(pb::GetOutcomeRequest {
            session: "s".into(),
            correlation: String::new(),
            stream: None,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "correlation");
    let r = c
        .trim(pb::TrimRequest {
            session: "s".into(),
            stream,
            up_to_seq: 0,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "up_to_seq");

    // Nothing half-written: the stream is still empty and open.
    let r = resolve(&mut c, "s", &format!("{epoch}-{stream}-0"), None).await;
    assert_eq!((r.verdict(), r.head), (Verdict::Resumable, Some(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_requests_are_resource_exhausted() {
    let server = Server::start(&["--payload-bytes-max", "1024", "--batch-events-max", "4"]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let big = c
        .append(pb::AppendRequest {
            session: "s".into(),
            stream,
            expected_next_seq: None,
            events: vec![event("progress", &[7_u8; 1025])],
        })
        .await;
    assert_status(big, Code::ResourceExhausted, "1024");
    let many = c
        .append(pb::AppendRequest {
            session: "s".into(),
            stream,
            expected_next_seq: None,
            events: (0..5).map(|_| event("progress", b"x")).collect(),
        })
        .await;
    assert_status(many, Code::ResourceExhausted, "4");
    let r = resolve(&mut c, "s", &format!("{epoch}-{stream}-0"), None).await;
    assert_eq!(r.head, Some(0), "a refused batch must leave nothing behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_splits_large_replays_below_the_client_message_limit() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let payload = vec![0xAB_u8; 512 * 1024];
    for _ in 0..4 {
        append(
            &mut c,
            "s",
            stream,
            "chunk",
            &[&payload, &payload, &payload],
        )
        .await;
    }
    // 12 events of 512 KiB: one message would exceed the client's default 4 MiB limit.
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{stream}-0"), false),
        READ_TIMEOUT,
    )
    .await;
    assert!(all.error.is_none(), "{:?}", all.error);
    assert_contiguous(&all.events, 1, 12);
    assert!(
        all.batches >= 2,
        "expected several batches, got {}",
        all.batches
    );
    assert!(all.events.iter().all(|e| e.payload == payload));
    assert!(all.end.is_none(), "an open stream has no end message");

    // Small batches are honoured too.
    let mut req = read_request("s", &format!("{epoch}-{stream}-8"), false);
    req.batch_events_max = 1;
    let all = read_all(&mut c, req, READ_TIMEOUT).await;
    assert_contiguous(&all.events, 9, 12);
    assert_eq!(all.batches, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_appends_and_fsyncs() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (_, stream) = open_stream(&mut c, "s", None, None).await;
    append(&mut c, "s", stream, "progress", &[b"abc", b"de"]).await;
    let stats = c.stats(pb::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.events_appended, 2);
    assert_eq!(stats.payload_bytes_appended, 5);
    assert!(stats.fsyncs >= 1, "sync=always must fsync: {stats:?}");
    assert!(stats.commit_batches >= 1 && stats.records_written >= stats.commit_batches);
    assert!(stats.segments >= 1 && stats.log_bytes > 0);
    assert_eq!((stats.sessions, stats.streams), (1, 1));
    assert_eq!(stats.active_followers, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_token_is_required_when_configured() {
    let server = Server::start(&["--auth-token", "s3cret"]);
    let channel = server.channel().await;
    let mut anonymous = pb::cursor_log_client::CursorLogClient::new(channel.clone());
    let r = anonymous
        .open_session(pb::OpenSessionRequest {
            session: "s".into(),
            state: None,
        })
        .await;
    assert_eq!(r.unwrap_err().code(), Code::Unauthenticated);

    let with_token = |token: &'static str| {
        pb::cursor_log_client::CursorLogClient::with_interceptor(
            channel.clone(),
            move |mut req: tonic::Request<()>| {
                req.metadata_mut()
                    .insert("authorization", format!("Bearer {token}").parse().unwrap());
                Ok(req)
            },
        )
    };
    let r = with_token("guess")
        .open_session(pb::OpenSessionRequest {
            session: "s".into(),
            state: None,
        })
        .await;
    assert_eq!(r.unwrap_err().code(), Code::Unauthenticated);

    let r = with_token("s3cret")
        .open_session(pb::OpenSessionRequest {
            session: "s".into(),
            state: None,
        })
        .await
        .unwrap();
    assert!(r.into_inner().created);

    // Health stays reachable for probes.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "cursorlog.v1.CursorLog".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        r.into_inner().status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
}

#[test]
fn refuses_non_loopback_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let (status, _, stderr) = run_tool(&["serve", "--listen", "0.0.0.0:0", "--data-dir", data]);
    assert!(!status.success());
    assert!(stderr.contains("--auth-token"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = Server::start(&[]);
    let channel = server.channel().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "cursorlog.v1.CursorLog"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap();
        assert_eq!(
            r.into_inner().status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "health of {service:?}"
        );
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"cursorlog.v1.CursorLog".to_owned()),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_prometheus_text() {
    let server = Server::start(&["--metrics-listen", "127.0.0.1:0"]);
    let mut c = server.client().await;
    let (e, stream) = open_stream(&mut c, "s", None, None).await;
    append(&mut c, "s", stream, "progress", &[b"x", b"y", b"z"]).await;
    resolve(&mut c, "s", &format!("{e}-{stream}-1"), None).await;
    resolve(&mut c, "s", "garbage", None).await;

    let addr = server
        .metrics_addr
        .expect("metrics address printed on stdout");
    let body = tokio::task::spawn_blocking(move || {
        let mut socket = std::net::TcpStream::connect(addr).unwrap();
        socket
            .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        socket.read_to_string(&mut response).unwrap();
        response
    })
    .await
    .unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.contains("cursorlog_events_appended_total 3\n"),
        "{body}"
    );
    assert!(
        body.contains("cursorlog_verdicts_total{verdict=\"RESUMABLE\"} 1\n"),
        "{body}"
    );
    assert!(
        body.contains("cursorlog_verdicts_total{verdict=\"MALFORMED_CURSOR\"} 1\n"),
        "{body}"
    );
    assert!(body.contains("cursorlog_fsyncs_total "), "{body}");
    assert!(body.contains("cursorlog_recovery_microseconds "), "{body}");
}

/// A replay that falls below the retention watermark while it is running ends with
/// OUT_OF_RANGE: it never skips silently over the evicted events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_overtaken_by_trim_ends_out_of_range_without_a_gap() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let payload = vec![b'p'; 64 * 1024];
    for _ in 0..20 {
        let batch: Vec<&[u8]> = (0..10).map(|_| payload.as_slice()).collect();
        append(&mut c, "s", stream, "progress", &batch).await;
    }
    let mut req = read_request("s", &format!("{epoch}-{stream}-0"), false);
    req.batch_events_max = 1;
    let mut reader = server.client().await;
    let mut read = reader.read(req).await.unwrap().into_inner();
    let mut got = cursorlog_tests::ReadAll::default();
    cursorlog_tests::absorb(&mut got, read.message().await.unwrap().unwrap());
    // 12.5 MiB do not fit the channel and the connection's flow-control window, and this
    // reader takes nothing more until the trim is answered: the server's replay cannot end
    // before the trim, however the two are scheduled (blocked already or still reading, it
    // is part-way). Trim everything behind its back.
    let trimmed = c
        .trim(pb::TrimRequest {
            session: "s".into(),
            stream,
            up_to_seq: 200,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(trimmed.watermark, 201);
    let status = loop {
        match read.message().await {
            Ok(Some(msg)) => cursorlog_tests::absorb(&mut got, msg),
            Ok(None) => panic!(
                "replay ended without an error after {} events",
                got.events.len()
            ),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("evicted"), "{status:?}");
    let delivered = u64::try_from(got.events.len()).unwrap();
    assert!((1..200).contains(&delivered), "delivered {delivered}");
    assert_contiguous(&got.events, 1, delivered);
}

/// A damaged frame in a sealed segment is reported as DATA_LOSS, never served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_stored_event_is_data_loss() {
    let server = Server::start(&["--segment-bytes", "4096"]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let marker = [b'Q'; 200];
    append(&mut c, "s", stream, "progress", &[&marker]).await;
    for _ in 0..40 {
        append(&mut c, "s", stream, "progress", &[&[b'f'; 200]]).await;
    }
    let mut segments: Vec<_> = std::fs::read_dir(&server.data_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    assert!(
        segments.len() >= 2,
        "expected the log to roll: {segments:?}"
    );
    let first = &segments[0];
    let mut bytes = std::fs::read(first).unwrap();
    let at = bytes
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("marker event in segment 0");
    bytes[at + 10] = b'X';
    // Rewrite in place (same inode), as a bit flip on disk would.
    let mut file = std::fs::OpenOptions::new().write(true).open(first).unwrap();
    file.write_all(&bytes).unwrap();
    file.sync_all().unwrap();
    drop(file);

    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{stream}-0"), false),
        READ_TIMEOUT,
    )
    .await;
    assert_eq!(all.resolution.unwrap().verdict(), Verdict::Resumable);
    assert!(
        all.events.is_empty(),
        "the damaged event must not be delivered"
    );
    let status = all.error.expect("DATA_LOSS");
    assert_eq!(status.code(), Code::DataLoss, "{status:?}");
    assert!(
        !status.message().contains(server.data_dir.to_str().unwrap()),
        "leaks the path: {status:?}"
    );
}

/// With --tls-cert/--tls-key the server speaks only TLS; a client trusting the CA gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_the_certificate() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls");
    let cert = fixtures.join("server.pem");
    let key = fixtures.join("server.key");
    let server = Server::start(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    let ca = Certificate::from_pem(std::fs::read(fixtures.join("ca.pem")).unwrap());
    let tls = ClientTlsConfig::new()
        .ca_certificate(ca)
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://localhost:{}", server.addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("TLS connection");
    let mut client = pb::cursor_log_client::CursorLogClient::new(channel);
    let opened = client
        .open_session(pb::OpenSessionRequest {
            session: "tls".into(),
            state: None,
        })
        .await
        .unwrap();
    assert!(opened.into_inner().created);

    // Plaintext HTTP/2 is refused.
    let mut plain = server.client().await;
    let r = plain
        .open_session(pb::OpenSessionRequest {
            session: "tls".into(),
            state: None,
        })
        .await;
    assert!(r.is_err(), "plaintext call succeeded on a TLS port");
}

async fn next(answers: &mut tonic::Streaming<pb::AppendResult>) -> pb::append_result::Result {
    tokio::time::timeout(READ_TIMEOUT, answers.message())
        .await
        .expect("an answer per request")
        .unwrap()
        .expect("the call stays open")
        .result
        .expect("a result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_stream_answers_each_request_in_order_and_survives_a_failure() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let request = |expected: Option<u64>, stream: u64| pb::AppendRequest {
        session: "s".into(),
        stream,
        expected_next_seq: expected,
        events: vec![event("progress", b"x")],
    };
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut answers = c
        .append_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    use pb::append_result::Result as R;

    tx.send(request(Some(1), stream)).await.unwrap();
    let R::Appended(first) = next(&mut answers).await else {
        panic!("first append failed")
    };
    assert_eq!(first.event_ids, vec![format!("{epoch}-{stream}-1")]);

    // A conflict answers that request only; the call goes on.
    tx.send(request(Some(9), stream)).await.unwrap();
    let R::Failure(conflict) = next(&mut answers).await else {
        panic!("a seq conflict must fail")
    };
    assert_eq!(conflict.code, Code::Aborted as i32);
    assert!(conflict.message.contains("seq"), "{}", conflict.message);
    tx.send(request(None, 999_999)).await.unwrap();
    let R::Failure(unknown) = next(&mut answers).await else {
        panic!("an unknown stream must fail")
    };
    assert_eq!(unknown.code, Code::NotFound as i32);

    // Pipelined requests are answered in order; a retry is recognised as a duplicate.
    tx.send(request(Some(2), stream)).await.unwrap();
    tx.send(request(Some(3), stream)).await.unwrap();
    tx.send(request(Some(2), stream)).await.unwrap();
    let (R::Appended(a), R::Appended(b), R::Appended(retry)) = (
        next(&mut answers).await,
        next(&mut answers).await,
        next(&mut answers).await,
    ) else {
        panic!("pipelined appends failed")
    };
    assert_eq!((a.first_seq, b.first_seq), (2, 3));
    assert!(retry.duplicate && retry.first_seq == 2);

    // Closing the request side ends the call cleanly; everything acknowledged is readable.
    drop(tx);
    let end = tokio::time::timeout(READ_TIMEOUT, answers.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{stream}-0"), false),
        READ_TIMEOUT,
    )
    .await;
    assert_contiguous(&all.events, 1, 3);
}

/// DESIGN.md's STREAM_TERMINATED and CURSOR_EVICTED rows: a client resuming its *own* stream
/// gets what it missed of a finished stream, exactly once, and the retained rest of an
/// evicted one after an explicit gap (a terminal frame below the watermark still comes, from
/// the outcome); a client that does not say it resumes its own stream gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_ones_own_stream_delivers_the_missed_tail_and_marks_evicted_gaps() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let own = |cursor: &str, follow| pb::ReadRequest {
        resume_own_stream: true,
        ..read_request("s", cursor, follow)
    };
    let complete = |stream, seq| pb::CompleteRequest {
        session: "s".into(),
        stream,
        expected_next_seq: Some(seq),
        terminal: Some(event("result", b"{\"done\":1}")),
    };

    // A finished stream: cursor 2 of 6 (6 is the terminal frame).
    let (epoch, done) = open_stream(&mut c, "s", Some("1"), None).await;
    append(
        &mut c,
        "s",
        done,
        "progress",
        &[b"1", b"2", b"3", b"4", b"5"],
    )
    .await;
    c.complete(complete(done, 6)).await.unwrap();
    let cursor = format!("{epoch}-{done}-2");
    let all = read_all(&mut c, own(&cursor, true), READ_TIMEOUT).await;
    assert_eq!(all.resolution.unwrap().verdict(), Verdict::StreamTerminated);
    assert_contiguous(&all.events, 3, 6);
    assert_eq!(all.events.last().unwrap().kind, "result");
    assert!(all.gaps.is_empty() && all.error.is_none());
    assert_eq!(all.end.unwrap().terminal_seq, 6);
    // Into another stream (no resume_own_stream): nothing of it.
    let all = read_all(&mut c, read_request("s", &cursor, true), READ_TIMEOUT).await;
    assert_eq!(all.resolution.unwrap().verdict(), Verdict::StreamTerminated);
    assert!(all.events.is_empty() && all.end.is_none());
    // At the terminal seq there is nothing missed.
    let all = read_all(
        &mut c,
        own(&format!("{epoch}-{done}-6"), true),
        READ_TIMEOUT,
    )
    .await;
    assert!(all.events.is_empty() && all.end.is_none());

    // An open stream whose cursor was evicted: a gap, then the retained rest.
    let (_, open) = open_stream(&mut c, "s", Some("2"), None).await;
    append(
        &mut c,
        "s",
        open,
        "progress",
        &[b"1", b"2", b"3", b"4", b"5", b"6"],
    )
    .await;
    let trimmed = c
        .trim(pb::TrimRequest {
            session: "s".into(),
            stream: open,
            up_to_seq: 3,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(trimmed.watermark, 4);
    let all = read_all(
        &mut c,
        own(&format!("{epoch}-{open}-1"), false),
        READ_TIMEOUT,
    )
    .await;
    assert_eq!(all.resolution.unwrap().verdict(), Verdict::CursorEvicted);
    assert_eq!(all.gaps, [(2, 3)]);
    assert_contiguous(&all.events, 4, 6);
    assert!(all.end.is_none() && all.error.is_none());
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{open}-1"), false),
        READ_TIMEOUT,
    )
    .await;
    assert!(all.events.is_empty() && all.gaps.is_empty());

    // A finished stream evicted through its terminal frame: the gap, then the frame.
    let (_, gone) = open_stream(&mut c, "s", Some("3"), None).await;
    append(&mut c, "s", gone, "progress", &[b"1", b"2", b"3", b"4"]).await;
    c.complete(complete(gone, 5)).await.unwrap();
    c.trim(pb::TrimRequest {
        session: "s".into(),
        stream: gone,
        up_to_seq: 5,
    })
    .await
    .unwrap();
    let all = read_all(
        &mut c,
        own(&format!("{epoch}-{gone}-2"), true),
        READ_TIMEOUT,
    )
    .await;
    assert_eq!(all.resolution.unwrap().verdict(), Verdict::StreamTerminated);
    assert_eq!(all.gaps, [(3, 4)]);
    assert_contiguous(&all.events, 5, 5);
    assert_eq!(all.events[0].payload.as_ref(), b"{\"done\":1}");
    assert_eq!(all.end.unwrap().state(), StreamState::Completed);
}

/// `AppendBatch` answers every item on its own, across sessions; `GetSession` and
/// `SetSessionState` give a restoring replica the session's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_across_sessions_and_session_state() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let opened = c
        .open_session(pb::OpenSessionRequest {
            session: "a".into(),
            state: Some(b"init".to_vec()),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(opened.created);
    assert_eq!(opened.state, b"init");
    let got = c
        .get_session(pb::GetSessionRequest {
            session: "a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (got.epoch, got.expired, got.state.as_slice()),
        (1, false, &b"init"[..])
    );
    assert!(got.idle_ttl_ms > 0);
    c.set_session_state(pb::SetSessionStateRequest {
        session: "a".into(),
        state: b"v2".to_vec(),
    })
    .await
    .unwrap();
    let r = c
        .get_session(pb::GetSessionRequest {
            session: "nobody".into(),
        })
        .await;
    assert_status(r, Code::NotFound, "session");

    let (_, a) = open_stream(&mut c, "a", Some("1"), None).await;
    let (_, b) = open_stream(&mut c, "b", Some("1"), None).await;
    let item = |session: &str, stream, seq| pb::BatchItem {
        item: Some(pb::batch_item::Item::Append(pb::AppendRequest {
            session: session.into(),
            stream,
            expected_next_seq: Some(seq),
            events: vec![event("progress", session.as_bytes())],
        })),
    };
    let done = pb::BatchItem {
        item: Some(pb::batch_item::Item::Complete(pb::CompleteRequest {
            session: "a".into(),
            stream: a,
            expected_next_seq: Some(2),
            terminal: Some(event("result", b"r")),
        })),
    };
    let results = c
        .append_batch(pb::AppendBatchRequest {
            items: vec![
                item("a", a, 1),
                item("b", b, 1),
                item("b", a, 1),
                pb::BatchItem { item: None },
                done.clone(),
                done,
                pb::BatchItem {
                    item: Some(pb::batch_item::Item::Open(pb::OpenStreamRequest {
                        session: "b".into(),
                        epoch: 1,
                        correlation: Some("2".into()),
                        lease_ms: Some(10_000),
                    })),
                },
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    use pb::batch_result::Result as R;
    let shape: Vec<String> = results
        .into_iter()
        .map(|r| match r.result.unwrap() {
            R::Appended(x) => format!("appended {:?}", x.event_ids),
            R::Completed(t) => format!("completed {} dup={}", t.terminal_seq, t.duplicate),
            R::Opened(o) => format!("opened {}", o.start_event_id == format!("1-{}-0", o.stream)),
            R::Failure(f) => format!("failure {}", Code::from_i32(f.code).description()),
        })
        .collect();
    assert_eq!(
        shape,
        [
            format!("appended [\"1-{a}-1\"]"),
            format!("appended [\"1-{b}-1\"]"),
            format!("failure {}", Code::NotFound.description()),
            format!("failure {}", Code::InvalidArgument.description()),
            "completed 2 dup=false".to_owned(),
            "completed 2 dup=true".to_owned(),
            "opened true".to_owned(),
        ]
    );
    let r = c
        .append_batch(pb::AppendBatchRequest {
            items: vec![item("a", a, 9); 4097],
        })
        .await;
    assert_status(r, Code::ResourceExhausted, "batch");
}

/// `declared_stream = 0` means absent (the proto's convention for ids): it must not turn a
/// resumable cursor into STREAM_MISMATCH, in Resolve or in Read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_stream_of_zero_is_no_declaration() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    append(&mut c, "s", stream, "progress", &[b"a", b"b"]).await;
    let cursor = format!("{epoch}-{stream}-1");
    let r = c
        .resolve(pb::ResolveRequest {
            session: "s".into(),
            last_event_id: cursor.clone(),
            declared_stream: Some(0),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.verdict(), Verdict::Resumable);
    let all = read_all(
        &mut c,
        pb::ReadRequest {
            declared_stream: Some(0),
            ..read_request("s", &cursor, false)
        },
        READ_TIMEOUT,
    )
    .await;
    assert_eq!(all.resolution.unwrap().verdict(), Verdict::Resumable);
    assert_contiguous(&all.events, 2, 2);
    // A real other stream is still a mismatch.
    let r = c
        .resolve(pb::ResolveRequest {
            session: "s".into(),
            last_event_id: cursor,
            declared_stream: Some(stream + 1),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.verdict(), Verdict::StreamMismatch);
}
