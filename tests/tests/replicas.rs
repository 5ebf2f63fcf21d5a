//! The scenarios cursorlog exists for, against the real binary: two front-end replicas sharing
//! a session (seeds/002), the stale cursor of a finished stream (seeds/000), producer lease
//! expiry, and restarts between append and resolve.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{
    absorb, append, assert_contiguous, event, open_stream, pb, read_all, read_all_watched,
    read_request, resolve, run_tool, ReadAll, ReadProgress, Server,
};
use pb::{StreamState, Verdict};

const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// seeds/002: replica A produces; the client reconnects through replica B with a mid-stream
/// cursor. B must deliver every missed event and the terminal result exactly once, in order,
/// without a gap, then end the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_on_another_replica_gets_every_missed_event_then_the_result() {
    let server = Server::start(&[]);
    let mut replica_a = server.client().await;
    let mut replica_b = server.client().await;
    let session = "mcp-session-002";
    let (epoch, stream) = open_stream(&mut replica_a, session, Some("call-7"), None).await;
    let mut sent = Vec::new();
    for i in 1..=5 {
        let payload = format!("{{\"progress\":{i}}}");
        let r = append(
            &mut replica_a,
            session,
            stream,
            "progress",
            &[payload.as_bytes()],
        )
        .await;
        sent.push((r.event_ids[0].clone(), payload));
    }
    // The client saw events up to seq 2 through A before A's connection dropped.
    let cursor = sent[1].0.clone();
    assert_eq!(cursor, format!("{epoch}-{stream}-2"));

    let mut read = replica_b
        .read(read_request(session, &cursor, true))
        .await
        .unwrap()
        .into_inner();
    let mut got = ReadAll::default();
    // Drain the replay (seqs 3..=5) before A continues, so the rest must arrive live.
    while got.events.len() < 3 {
        let msg = tokio::time::timeout(READ_TIMEOUT, read.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        absorb(&mut got, msg);
    }
    assert_eq!(
        got.resolution.as_ref().unwrap().verdict(),
        Verdict::Resumable
    );

    // The highest seq the follower has received, so the producer can pause until it has
    // caught up (and the next events must be delivered live, to a waiting follower).
    let (seen_tx, mut seen) = tokio::sync::watch::channel(5_u64);
    let producer = tokio::spawn(async move {
        let mut more = Vec::new();
        for i in 6..=30 {
            let payload = format!("{{\"progress\":{i}}}");
            let r = append(
                &mut replica_a,
                session,
                stream,
                "progress",
                &[payload.as_bytes()],
            )
            .await;
            more.push((r.event_ids[0].clone(), payload));
            if i % 5 == 0 {
                seen.wait_for(|&seq| seq >= i)
                    .await
                    .expect("the follower stopped before it caught up");
            }
        }
        let done = replica_a
            .complete(pb::CompleteRequest {
                session: session.into(),
                stream,
                expected_next_seq: Some(31),
                terminal: Some(event("result", b"{\"result\":\"done\"}")),
            })
            .await
            .unwrap()
            .into_inner();
        (more, done)
    });

    let rest = async {
        while let Some(msg) = read.message().await.unwrap() {
            absorb(&mut got, msg);
            if let Some(last) = got.events.last() {
                seen_tx.send_replace(last.seq);
            }
        }
    };
    tokio::time::timeout(READ_TIMEOUT, rest)
        .await
        .expect("the follow call must end after the result");
    let (more, done) = producer.await.unwrap();
    sent.extend(more);

    assert_contiguous(&got.events, 3, 31);
    for (event, (id, payload)) in got.events.iter().zip(sent.iter().skip(2)) {
        assert_eq!(&event.id, id);
        assert_eq!(event.payload, payload.as_bytes());
    }
    let result = got.events.last().unwrap();
    assert_eq!(
        (result.kind.as_str(), &result.payload[..]),
        ("result", &b"{\"result\":\"done\"}"[..])
    );
    assert_eq!(result.id, done.terminal_event_id);
    let end = got.end.expect("end message after the terminal result");
    assert_eq!(
        (end.state(), end.terminal_seq),
        (StreamState::Completed, 31)
    );
}

/// seeds/000: after the terminal frame, the terminal event's id is not a resumption point for a
/// new stream; nothing is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_cursor_of_a_finished_stream_replays_nothing() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let session = "mcp-session-000";
    let (epoch, stream) = open_stream(&mut c, session, Some("tools/call-1"), None).await;
    append(&mut c, session, stream, "progress", &[b"working"]).await;
    let done = c
        .complete(pb::CompleteRequest {
            session: session.into(),
            stream,
            expected_next_seq: None,
            terminal: Some(event("result", b"{\"content\":\"charged card\"}")),
        })
        .await
        .unwrap()
        .into_inner();
    let terminal_id = done.terminal_event_id.clone();
    assert_eq!(terminal_id, format!("{epoch}-{stream}-2"));

    // The client opens a new POST stream and sends the old terminal id as Last-Event-ID.
    let (_, fresh) = open_stream(&mut c, session, Some("tools/call-2"), None).await;
    let r = resolve(&mut c, session, &terminal_id, Some(fresh)).await;
    assert_eq!(
        r.verdict(),
        Verdict::StreamMismatch,
        "declared stream is checked first"
    );
    let r = resolve(&mut c, session, &terminal_id, None).await;
    assert_eq!(r.verdict(), Verdict::StreamTerminated);
    assert!(
        !r.missed_terminal_frame,
        "the client already has the terminal frame"
    );
    assert_eq!(
        (r.terminal_seq, r.stream_state()),
        (Some(2), StreamState::Completed)
    );

    for follow in [false, true] {
        let all = read_all(
            &mut c,
            read_request(session, &terminal_id, follow),
            READ_TIMEOUT,
        )
        .await;
        assert!(all.error.is_none());
        assert_eq!(all.resolution.unwrap().verdict(), Verdict::StreamTerminated);
        assert!(
            all.events.is_empty(),
            "a finished stream's frames must not be replayed"
        );
        assert!(all.end.is_none());
    }

    // A client that missed the terminal frame reconciles from the outcome instead.
    let r = resolve(&mut c, session, &format!("{epoch}-{stream}-1"), None).await;
    assert_eq!(r.verdict(), Verdict::StreamTerminated);
    assert!(r.missed_terminal_frame);
    let outcome = c
        .get_outcome(pb::GetOutcomeRequest {
            session: session.into(),
            correlation: "tools/call-1".into(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner()
        .outcome
        .unwrap();
    assert_eq!(
        outcome.frame.unwrap().payload,
        &b"{\"content\":\"charged card\"}"[..]
    );
}

/// A producer that dies without completing: its lease expires, cursorlog writes the ABORTED
/// tombstone and a follower gets the terminal answer instead of waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_aborts_the_stream_for_followers() {
    const LEASE_MS: u64 = 600;
    let server = Server::start(&[]);
    let mut producer = server.client().await;
    let mut follower = server.client().await;
    let session = "s";
    let (epoch, stream) =
        open_stream(&mut producer, session, Some("slow-call"), Some(LEASE_MS)).await;
    append(&mut producer, session, stream, "progress", &[b"1"]).await;
    let last_renewal = Instant::now();

    let all = read_all(
        &mut follower,
        read_request(session, &format!("{epoch}-{stream}-0"), true),
        READ_TIMEOUT,
    )
    .await;
    let ended_after = last_renewal.elapsed();
    assert!(all.error.is_none(), "{:?}", all.error);
    assert_contiguous(&all.events, 1, 1);
    let end = all.end.expect("the follower must get the terminal state");
    assert_eq!(end.state(), StreamState::Aborted);
    assert!(
        end.reason.as_deref().unwrap_or_default().contains("lease"),
        "{end:?}"
    );
    assert!(
        ended_after < Duration::from_millis(LEASE_MS) + Duration::from_secs(3),
        "abort arrived {ended_after:?} after the last renewal (lease {LEASE_MS} ms)"
    );
    assert!(
        ended_after >= Duration::from_millis(LEASE_MS / 2),
        "aborted too early: {ended_after:?}"
    );

    let r = resolve(&mut follower, session, &format!("{epoch}-{stream}-1"), None).await;
    assert_eq!(
        (r.verdict(), r.stream_state()),
        (Verdict::StreamTerminated, StreamState::Aborted)
    );
    let outcome = follower
        .get_outcome(pb::GetOutcomeRequest {
            session: session.into(),
            correlation: "slow-call".into(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner()
        .outcome
        .unwrap();
    assert_eq!(outcome.state(), StreamState::Aborted);
}

/// Keep-alives and appends renew the lease: a live producer is never aborted.
///
/// The lease runs on the server's real clock, so a machine that stalls the server (or this
/// client) for a whole lease may let it run out legitimately. Each renewal happens between
/// sending a call and its answer, so no two renewals are further apart than the window from
/// sending the one to the answer of the next. A round whose windows all stay below the
/// lease (from opening the stream to the final resolve) must end with the stream open; a
/// round with a longer window proves nothing and is run again on a new stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_renews_the_lease() {
    const LEASE: Duration = Duration::from_millis(600);
    /// Room for the server's millisecond clock and its expiry tick.
    const MARGIN: Duration = Duration::from_millis(50);
    const ROUNDS: usize = 5;
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let mut longest = Vec::new();
    for _ in 0..ROUNDS {
        let mut sent = Instant::now();
        let lease_ms = u64::try_from(LEASE.as_millis()).unwrap();
        let (epoch, stream) = open_stream(&mut c, "s", None, Some(lease_ms)).await;
        let opened = Instant::now();
        let mut window = Duration::ZERO;
        // Keep-alives back to back (each answered before the next is sent) until two leases
        // have passed: without renewal the lease would have run out by then.
        let mut aborted = false;
        while opened.elapsed() < LEASE * 2 {
            let previous = sent;
            sent = Instant::now();
            let answer = c
                .keep_alive(pb::KeepAliveRequest {
                    session: "s".into(),
                    stream,
                })
                .await;
            window = window.max(previous.elapsed());
            match answer {
                Ok(_) => {}
                Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                    aborted = true;
                    break;
                }
                Err(status) => panic!("keep-alive failed: {status:?}"),
            }
        }
        let r = resolve(&mut c, "s", &format!("{epoch}-{stream}-0"), None).await;
        window = window.max(sent.elapsed());
        if window + MARGIN >= LEASE {
            longest.push(window);
            continue; // stalled for a lease: this round decides nothing
        }
        assert!(!aborted, "aborted although renewed every {window:?}");
        assert_eq!(
            (r.verdict(), r.stream_state()),
            (Verdict::Resumable, StreamState::Open),
            "renewed at least every {window:?}"
        );
        return;
    }
    panic!("every round stalled for a lease (longest windows {longest:?}): too busy to tell");
}

/// Advancing the epoch supersedes the stream a follower is on; the follower ends with that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_advance_ends_followers_as_superseded() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let mut b = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    append(&mut c, "s", stream, "progress", &[b"1", b"2"]).await;
    let (progress, mut watched) = tokio::sync::watch::channel(ReadProgress::default());
    let follow = tokio::spawn(async move {
        read_all_watched(
            &mut b,
            read_request("s", &format!("{epoch}-{stream}-1"), true),
            READ_TIMEOUT,
            Some(progress),
        )
        .await
    });
    // The follower has replayed seq 2, the head: it follows the live stream now.
    watched.wait_for(|p| p.events >= 1).await.unwrap();
    c.advance_epoch(pb::AdvanceEpochRequest {
        session: "s".into(),
    })
    .await
    .unwrap();
    let all = follow.await.unwrap();
    assert!(all.error.is_none(), "{:?}", all.error);
    assert_contiguous(&all.events, 2, 2);
    let end = all.end.expect("end message");
    assert_eq!(
        (end.state(), end.terminal_seq),
        (StreamState::Superseded, 2)
    );
    assert!(end.reason.unwrap_or_default().contains("epoch"));
}

/// Expiring the session aborts the stream a follower is on; the follower ends with that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_ends_followers_as_aborted() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let mut b = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let (progress, mut watched) = tokio::sync::watch::channel(ReadProgress::default());
    let follow = tokio::spawn(async move {
        read_all_watched(
            &mut b,
            read_request("s", &format!("{epoch}-{stream}-0"), true),
            READ_TIMEOUT,
            Some(progress),
        )
        .await
    });
    // The follower has its resolution (the stream is empty): it follows the live stream now.
    watched.wait_for(|p| p.resolved).await.unwrap();
    append(&mut c, "s", stream, "progress", &[b"1"]).await;
    c.expire_session(pb::ExpireSessionRequest {
        session: "s".into(),
    })
    .await
    .unwrap();
    let all = follow.await.unwrap();
    assert!(all.error.is_none(), "{:?}", all.error);
    assert_contiguous(&all.events, 1, 1);
    let end = all.end.expect("end message");
    assert_eq!((end.state(), end.terminal_seq), (StreamState::Aborted, 1));
}

/// Verdicts and events survive a restart of the binary; SIGTERM exits 0; verify and inspect
/// read the directory afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_between_append_and_resolve_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let session = "mcp-restart";
    let (epoch, stream, done_stream) = {
        let mut server = Server::start_in(dir.path(), &[]);
        let mut c = server.client().await;
        let (epoch, stream) = open_stream(&mut c, session, Some("req-a"), None).await;
        append(
            &mut c,
            session,
            stream,
            "progress",
            &[b"one", b"two", b"three"],
        )
        .await;
        let (_, done_stream) = open_stream(&mut c, session, Some("req-b"), None).await;
        c.complete(pb::CompleteRequest {
            session: session.into(),
            stream: done_stream,
            expected_next_seq: None,
            terminal: Some(event("result", b"ok")),
        })
        .await
        .unwrap();
        drop(c);
        let status = server.terminate();
        assert!(
            status.success(),
            "SIGTERM must exit 0: {status:?}\n{}",
            server.logs()
        );
        assert!(server.wait_for_log("closed cleanly"), "{}", server.logs());
        (epoch, stream, done_stream)
    };

    let (status, report, stderr) = run_tool(&["verify", dir.path().to_str().unwrap()]);
    assert!(status.success(), "verify failed: {report}\n{stderr}");
    let (status, inventory, stderr) = run_tool(&["inspect", dir.path().to_str().unwrap()]);
    assert!(status.success(), "inspect failed: {stderr}");
    assert!(inventory.contains(session), "{inventory}");
    assert!(inventory.contains("completed"), "{inventory}");

    let mut server = Server::start_in(dir.path(), &[]);
    assert!(
        server.wait_for_log("recovery"),
        "startup line must report recovery: {}",
        server.logs()
    );
    let mut c = server.client().await;
    let r = resolve(
        &mut c,
        session,
        &format!("{epoch}-{stream}-1"),
        Some(stream),
    )
    .await;
    assert_eq!((r.verdict(), r.head), (Verdict::Resumable, Some(3)));
    let all = read_all(
        &mut c,
        read_request(session, &format!("{epoch}-{stream}-1"), false),
        READ_TIMEOUT,
    )
    .await;
    assert_contiguous(&all.events, 2, 3);
    assert_eq!(all.events[1].payload, &b"three"[..]);
    let r = resolve(&mut c, session, &format!("{epoch}-{done_stream}-1"), None).await;
    assert_eq!(
        (r.verdict(), r.missed_terminal_frame),
        (Verdict::StreamTerminated, false)
    );

    // Appends continue where they left off, and stream ids are never reused.
    let more = append(&mut c, session, stream, "progress", &[b"four"]).await;
    assert_eq!(more.first_seq, 4);
    let (_, newer) = open_stream(&mut c, session, None, None).await;
    assert!(newer > done_stream && newer > stream);
    drop(c);
    assert!(server.terminate().success());
}

/// A live follower does not hold the server hostage: SIGTERM ends it with UNAVAILABLE and the
/// process still exits 0 after closing the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_followers_and_exits_cleanly() {
    let mut server = Server::start(&[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    append(&mut c, "s", stream, "progress", &[b"1"]).await;
    let mut read = c
        .read(read_request("s", &format!("{epoch}-{stream}-0"), true))
        .await
        .unwrap()
        .into_inner();
    let mut got = ReadAll::default();
    while got.events.is_empty() {
        absorb(&mut got, read.message().await.unwrap().unwrap());
    }
    let waiter = tokio::task::spawn_blocking(move || {
        let status = server.terminate();
        (status, server.logs())
    });
    let ended = tokio::time::timeout(READ_TIMEOUT, async {
        loop {
            match read.message().await {
                Ok(Some(msg)) => absorb(&mut got, msg),
                Ok(None) => break None,
                Err(status) => break Some(status),
            }
        }
    })
    .await
    .unwrap();
    let status = ended.expect("the follow call must end with an error on shutdown");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let (exit, logs) = waiter.await.unwrap();
    assert!(exit.success(), "exit {exit:?}\n{logs}");
}

/// An open `AppendStream` call does not hold the server either: SIGTERM ends it with
/// UNAVAILABLE (saying to resend with `expected_next_seq`), the process exits 0, and what was
/// acknowledged before is there after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_append_streams_and_keeps_what_they_acknowledged() {
    use pb::append_result::Result as Answer;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(dir.path(), &[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = c
        .append_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for seq in 1..=2 {
        tx.send(pb::AppendRequest {
            session: "s".into(),
            stream,
            expected_next_seq: Some(seq),
            events: vec![event("progress", format!("{seq}").as_bytes())],
        })
        .await
        .unwrap();
        let answer = tokio::time::timeout(READ_TIMEOUT, answers.message())
            .await
            .unwrap()
            .unwrap()
            .and_then(|a| a.result);
        assert!(matches!(answer, Some(Answer::Appended(_))), "{answer:?}");
    }
    let waiter = tokio::task::spawn_blocking(move || {
        let status = server.terminate();
        (status, server.logs())
    });
    let ended = tokio::time::timeout(READ_TIMEOUT, answers.message())
        .await
        .unwrap();
    let status = ended.expect_err("the call must end with an error on shutdown");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("expected_next_seq"), "{status:?}");
    let (exit, logs) = waiter.await.unwrap();
    assert!(exit.success(), "exit {exit:?}\n{logs}");
    drop(tx);

    let server = Server::start_in(dir.path(), &[]);
    let mut c = server.client().await;
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{stream}-0"), false),
        READ_TIMEOUT,
    )
    .await;
    assert_contiguous(&all.events, 1, 2);
}
