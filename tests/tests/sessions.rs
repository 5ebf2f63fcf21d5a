//! Session lifetime through the real binary: `GetSession` on an expired session, `KeepAlive`
//! with stream 0, the idle TTL flag, and when an expired session id can be used again.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{
    append, event, http_get, metric, open_stream, pb, read_all, read_request, resolve, Server,
};
use pb::cursor_log_client::CursorLogClient;
use pb::{StreamState, Verdict};
use tonic::transport::Channel;
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(20);

async fn get_session(
    c: &mut CursorLogClient<Channel>,
    session: &str,
) -> Result<pb::GetSessionResponse, tonic::Status> {
    c.get_session(pb::GetSessionRequest {
        session: session.into(),
    })
    .await
    .map(tonic::Response::into_inner)
}

async fn keep_alive(c: &mut CursorLogClient<Channel>, session: &str, stream: u64) -> Code {
    let r = c
        .keep_alive(pb::KeepAliveRequest {
            session: session.into(),
            stream,
        })
        .await;
    r.map_or_else(|s| s.code(), |_| Code::Ok)
}

fn open_session_request(session: &str) -> pb::OpenSessionRequest {
    pb::OpenSessionRequest {
        session: session.into(),
        state: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_reported_and_refuses_every_write() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let opened = c
        .open_session(pb::OpenSessionRequest {
            session: "gone".into(),
            state: Some(b"init-params".to_vec()),
        })
        .await
        .unwrap()
        .into_inner();
    let stream = c
        .open_stream(pb::OpenStreamRequest {
            session: "gone".into(),
            epoch: opened.epoch,
            correlation: Some("req-1".into()),
            lease_ms: None,
        })
        .await
        .unwrap()
        .into_inner()
        .stream;
    append(&mut c, "gone", stream, "progress", &[b"1", b"2"]).await;
    let expired = c
        .expire_session(pb::ExpireSessionRequest {
            session: "gone".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(expired.aborted_streams, [stream]);

    // GetSession still answers, with what a restoring replica needs to say 404.
    let view = get_session(&mut c, "gone").await.unwrap();
    assert!(view.expired);
    assert_eq!(
        (view.epoch, view.state.as_slice()),
        (1, &b"init-params"[..])
    );
    assert!(view.opened_at_ms > 0);
    assert_eq!(view.idle_ttl_ms, 3_600_000);

    // Nothing renews or reuses it while it is remembered.
    let r = c.open_session(open_session_request("gone")).await;
    assert_eq!(r.unwrap_err().code(), Code::FailedPrecondition);
    assert_eq!(
        keep_alive(&mut c, "gone", 0).await,
        Code::FailedPrecondition
    );
    assert_eq!(
        keep_alive(&mut c, "gone", stream).await,
        Code::FailedPrecondition
    );
    let r = c
        .set_session_state(pb::SetSessionStateRequest {
            session: "gone".into(),
            state: b"x".to_vec(),
        })
        .await;
    assert_eq!(r.unwrap_err().code(), Code::FailedPrecondition);
    let r = c
        .open_stream(pb::OpenStreamRequest {
            session: "gone".into(),
            epoch: 1,
            correlation: None,
            lease_ms: None,
        })
        .await;
    assert_eq!(r.unwrap_err().code(), Code::FailedPrecondition);

    // Its cursors say so, and its outcomes stay readable.
    let r = resolve(&mut c, "gone", &format!("1-{stream}-1"), None).await;
    assert_eq!(r.verdict(), Verdict::UnknownSession);
    assert!(r.session_expired);
    let outcome = c
        .get_outcome(pb::GetOutcomeRequest {
            session: "gone".into(),
            correlation: "req-1".into(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(outcome.found);
    assert_eq!(outcome.outcome.unwrap().state(), StreamState::Aborted);
    // GetSession of a session that never was is NOT_FOUND, not "expired".
    assert_eq!(
        get_session(&mut c, "never").await.unwrap_err().code(),
        Code::NotFound
    );
}

/// `KeepAlive` with stream 0 renews the session only: a leased stream whose producer sends
/// nothing else is still aborted when its lease runs out, and its followers are told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_with_stream_zero_renews_only_the_session() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    assert_eq!(keep_alive(&mut c, "nobody", 0).await, Code::NotFound);
    assert_eq!(keep_alive(&mut c, "", 0).await, Code::InvalidArgument);
    let (epoch, stream) = open_stream(&mut c, "s", None, Some(300)).await;
    assert_eq!(keep_alive(&mut c, "s", 0).await, Code::Ok);

    let mut follower = c.clone();
    let cursor = format!("{epoch}-{stream}-0");
    let read = tokio::spawn(async move {
        read_all(&mut follower, read_request("s", &cursor, true), TIMEOUT).await
    });
    // The producer only ever renews the session, every 50 ms, until the follower ends.
    let mut ticks = tokio::time::interval(Duration::from_millis(50));
    while !read.is_finished() {
        ticks.tick().await;
        let code = keep_alive(&mut c, "s", 0).await;
        assert_eq!(code, Code::Ok, "the session stays alive");
    }
    let all = read.await.unwrap();
    let end = all.end.expect("the follower is told the stream ended");
    assert_eq!(end.state(), StreamState::Aborted);
    assert!(
        end.reason.as_deref().unwrap_or("").contains("lease"),
        "{end:?}"
    );
    assert_eq!(keep_alive(&mut c, "s", 0).await, Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_idle_ttl_flag_is_reported_by_get_session() {
    for (args, ttl_ms) in [
        (&[][..], 3_600_000),
        (&["--session-idle-ttl-secs", "0"][..], 0),
        (&["--session-idle-ttl-secs", "7"][..], 7_000),
    ] {
        let server = Server::start(args);
        let mut c = server.client().await;
        c.open_session(open_session_request("s")).await.unwrap();
        let view = get_session(&mut c, "s").await.unwrap();
        assert_eq!(view.idle_ttl_ms, ttl_ms, "{args:?}");
    }
}

/// Waits (with a deadline) until the server has expired `n` idle sessions. `Stats` names no
/// session, so asking does not renew any.
async fn wait_expired_idle(c: &mut CursorLogClient<Channel>, n: u64) {
    let deadline = Instant::now() + TIMEOUT;
    let mut ticks = tokio::time::interval(Duration::from_millis(20));
    loop {
        let stats = c.stats(pb::StatsRequest {}).await.unwrap().into_inner();
        if stats.sessions_expired_idle >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{n} idle sessions never expired");
        ticks.tick().await;
    }
}

/// `--session-idle-ttl-secs` reaches the engine: a session nobody names expires (its open
/// stream is aborted), while one with an open follower outlives several TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_expire_and_a_follower_keeps_its_session_alive() {
    let server = Server::start(&["--session-idle-ttl-secs", "1"]);
    let mut c = server.client().await;
    let (epoch, followed) = open_stream(&mut c, "followed", None, None).await;
    let mut follower = c
        .read(read_request(
            "followed",
            &format!("{epoch}-{followed}-0"),
            true,
        ))
        .await
        .unwrap()
        .into_inner();
    follower.message().await.unwrap().unwrap(); // the resolution: following now
    let (_, idle) = open_stream(&mut c, "idle", None, None).await;
    wait_expired_idle(&mut c, 1).await;
    // A second idle session, opened after the first expired: once it has expired too, the
    // followed session has been idle for more than two TTLs.
    c.open_session(open_session_request("idle-2"))
        .await
        .unwrap();
    wait_expired_idle(&mut c, 2).await;

    // The engine counts an expiry when it plans it, before it is applied: an append queued
    // after it is acknowledged only once the expiries before it are applied.
    append(&mut c, "followed", followed, "progress", &[b"still here"]).await;
    for session in ["idle", "idle-2"] {
        let view = get_session(&mut c, session).await.unwrap();
        assert!(view.expired, "{session}: {view:?}");
    }
    let r = resolve(&mut c, "idle", &format!("1-{idle}-0"), None).await;
    assert_eq!(r.verdict(), Verdict::UnknownSession);
    assert!(r.session_expired);
    let view = get_session(&mut c, "followed").await.unwrap();
    assert!(!view.expired, "a followed session must not expire");
    let m = tokio::time::timeout(TIMEOUT, follower.message())
        .await
        .unwrap();
    let Some(pb::read_response::Item::Events(batch)) = m.unwrap().unwrap().item else {
        panic!("the follower gets the event");
    };
    assert_eq!(&batch.events[0].payload[..], b"still here");
}

/// An expired session id is refused while the expiry is remembered; once retention has
/// carried its records past the metadata horizon it is forgotten, and `OpenSession` with
/// that id creates a new session in which the old cursors are UNKNOWN_CURSOR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_id_is_new_again_once_forgotten() {
    let server = Server::start(&[
        "--segment-bytes",
        "4096",
        "--metadata-horizon-secs",
        "1",
        "--retention-max-age-secs",
        "1",
        "--retention-check-interval-ms",
        "50",
    ]);
    let mut c = server.client().await;
    let (epoch, old) = open_stream(&mut c, "gone", Some("req-1"), None).await;
    append(&mut c, "gone", old, "progress", &[b"1", b"2", b"3"]).await;
    c.expire_session(pb::ExpireSessionRequest {
        session: "gone".into(),
    })
    .await
    .unwrap();
    let r = c.open_session(open_session_request("gone")).await;
    assert_eq!(r.unwrap_err().code(), Code::FailedPrecondition);

    // Other traffic rolls segments so retention retires the ones holding the expiry; wait
    // (with a deadline) until the session is forgotten.
    let (_, filler) = open_stream(&mut c, "filler", None, None).await;
    let payload = vec![0x5a_u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ticks = tokio::time::interval(Duration::from_millis(20));
    loop {
        match get_session(&mut c, "gone").await {
            Err(status) if status.code() == Code::NotFound => break,
            Ok(view) => assert!(view.expired),
            Err(status) => panic!("{status:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the expired session was never forgotten"
        );
        ticks.tick().await;
        c.append(pb::AppendRequest {
            session: "filler".into(),
            stream: filler,
            expected_next_seq: None,
            events: vec![event("filler", &payload), event("filler", &payload)],
        })
        .await
        .unwrap();
    }

    let opened = c
        .open_session(open_session_request("gone"))
        .await
        .unwrap()
        .into_inner();
    assert!(opened.created, "a forgotten id opens a new session");
    assert_eq!(opened.epoch, 1);
    let old_cursor = format!("{epoch}-{old}-2");
    let r = resolve(&mut c, "gone", &old_cursor, None).await;
    assert_eq!(r.verdict(), Verdict::UnknownCursor, "{r:?}");
    let all = read_all(&mut c, read_request("gone", &old_cursor, false), TIMEOUT).await;
    assert!(all.events.is_empty() && all.error.is_none());
    let (_, new) = open_stream(&mut c, "gone", Some("req-1"), None).await;
    assert!(new > old, "stream ids are never reused");
    let outcome = c
        .get_outcome(pb::GetOutcomeRequest {
            session: "gone".into(),
            correlation: "req-1".into(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner();
    let outcome = outcome.outcome.unwrap();
    assert_eq!(
        (outcome.stream, outcome.state()),
        (new, StreamState::Open),
        "the request id names the new session's stream, not the forgotten one"
    );
}

/// At `--max-live-sessions` a new session is RESOURCE_EXHAUSTED with a message naming the
/// limit and the flag that raises it (an existing session still opens); at
/// `--max-leased-streams` a leased stream is refused the same way (a lease-less one is not).
/// The metrics count the refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caps_on_live_sessions_and_leased_streams_answer_resource_exhausted() {
    let server = Server::start(&[
        "--max-live-sessions",
        "2",
        "--max-leased-streams",
        "1",
        "--metrics-listen",
        "0",
    ]);
    let mut c = server.client().await;
    open_stream(&mut c, "a", None, Some(60_000)).await;
    open_stream(&mut c, "b", None, None).await;
    let refused = c.open_session(open_session_request("c")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let m = refused.message();
    assert!(
        m.contains("live sessions")
            && m.contains("limit of 2")
            && m.contains("--max-live-sessions")
            && m.contains("CURSORLOG_MAX_LIVE_SESSIONS"),
        "{m}"
    );
    c.open_session(open_session_request("a"))
        .await
        .expect("an existing session still opens");

    let epoch = get_session(&mut c, "b").await.unwrap().epoch;
    let leased = |lease_ms| pb::OpenStreamRequest {
        session: "b".into(),
        epoch,
        correlation: None,
        lease_ms,
    };
    let refused = c.open_stream(leased(Some(60_000))).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let m = refused.message();
    assert!(
        m.contains("leased") && m.contains("limit of 1") && m.contains("--max-leased-streams"),
        "{m}"
    );
    c.open_stream(leased(None))
        .await
        .expect("a lease-less stream does not count");

    // Expiring a session makes room for a new one.
    c.expire_session(pb::ExpireSessionRequest {
        session: "b".into(),
    })
    .await
    .unwrap();
    c.open_session(open_session_request("c")).await.unwrap();

    let addr = server.metrics_addr.unwrap();
    let page = tokio::task::spawn_blocking(move || http_get(addr, &[]))
        .await
        .unwrap();
    for (name, value) in [
        ("cursorlog_live_sessions", 2),
        ("cursorlog_live_sessions_max", 2),
        ("cursorlog_sessions_refused_at_capacity_total", 1),
        ("cursorlog_leased_streams", 1),
        ("cursorlog_leased_streams_max", 1),
        ("cursorlog_leases_refused_at_capacity_total", 1),
    ] {
        assert_eq!(metric(&page, name), Some(value), "{name}: {page}");
    }
}
