//! End to end with the real pieces: one `cursorlog` server, two rmcp replicas
//! (`cursorlog-rmcp-demo`) behind a proxy without affinity, and rmcp's own client, which
//! resumes a broken SSE stream with `Last-Event-ID` by itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::{Duration, Instant};

use cursorlog_rmcp::{PRODUCER_ABORTED, RESUME_DISCONTINUITY};
use harness::{
    call_countdown, connect, countdown_stream, executions, expected_progress, head, pb, Cluster,
    Proxy, Replica, Server,
};

const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_mid_call_resumes_on_the_other_replica_with_every_event_once() {
    let c = Cluster::start(10_000);
    let (cl, log) = (&c.cursorlog, &c.log);
    let proxy = Proxy::start(c.a.addr).await;
    let (progress, client) = connect(&proxy.url()).await;

    let call = call_countdown(&client, 8, 150);
    progress.wait_for(2).await;
    // The load balancer loses A's connections; A keeps running the tool. New connections,
    // including the client's resumption, go to B, which never saw this session.
    proxy.release_to(c.b.addr);
    proxy.cut();

    let result = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .expect("the resumed call finishes")
        .unwrap();
    assert_eq!(result.as_deref(), Ok("countdown of 8 done"));
    // The result can overtake the last notifications' handler tasks: wait for them.
    progress.wait_for(8).await;
    assert_eq!(
        progress.seen_by_step(),
        expected_progress(8),
        "every progress notification exactly once"
    );
    proxy.assert_steps_in_order();
    assert_eq!(executions(log).len(), 1, "the tool ran once");
    let resumes = proxy.resumes();
    assert!(
        !resumes.is_empty(),
        "the client resumed with Last-Event-ID (through B)"
    );

    // A cursor at the terminal frame (the client has everything): a clean end, nothing sent.
    let (session, outcome) = countdown_stream(cl, log).await;
    assert_eq!(outcome.state(), pb::StreamState::Completed);
    let terminal_id = format!("{}.n1", outcome.terminal_event_id.unwrap());
    let body = reqwest::Client::new()
        .get(format!("http://{}/mcp", c.b.addr))
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", &session)
        .header("Mcp-Protocol-Version", "2025-11-25")
        .header("Last-Event-ID", terminal_id)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !body.contains("data: {"),
        "nothing replayed at the terminal seq: {body:?}"
    );
    client.cancel().await.unwrap();
}

/// The call finishes on A while the client is away; the client resumes its own stream on B
/// and gets every progress notification it missed, once, then the result (DESIGN.md:
/// `STREAM_TERMINATED` before the terminal seq, resuming the same stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_while_away_delivers_every_missed_event_then_the_result() {
    let c = Cluster::start(10_000);
    let (cl, log) = (&c.cursorlog, &c.log);
    let proxy = Proxy::start(c.a.addr).await;
    let (progress, client) = connect(&proxy.url()).await;

    let call = call_countdown(&client, 6, 100);
    progress.wait_for(2).await;
    proxy.hold();
    proxy.cut();
    // A finishes the call while the client is away.
    let deadline = Instant::now() + CALL_TIMEOUT;
    loop {
        let (_, outcome) = countdown_stream(cl, log).await;
        if outcome.state() == pb::StreamState::Completed {
            break;
        }
        assert!(Instant::now() < deadline, "the call never completed on A");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        proxy.steps_on_the_wire().len() < 6,
        "the client missed part of the call"
    );
    proxy.release_to(c.b.addr);

    let result = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        result.as_deref(),
        Ok("countdown of 6 done"),
        "the stored result arrives"
    );
    progress.wait_for(6).await;
    assert_eq!(
        progress.seen_by_step(),
        expected_progress(6),
        "every missed progress notification, exactly once"
    );
    proxy.assert_steps_in_order();
    assert_eq!(executions(log).len(), 1, "the tool ran once");
    client.cancel().await.unwrap();
}

/// With `--on-evicted error`, an evicted cursor ends the call with the explicit -32011 error
/// (the deployment's choice), and nothing after the gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_cursor_ends_the_call_with_an_explicit_error_when_configured() {
    let c = Cluster::start_with(10_000, &[], &["--on-evicted", "error"]);
    let (cl, log) = (&c.cursorlog, &c.log);
    let proxy = Proxy::start(c.a.addr).await;
    let (progress, client) = connect(&proxy.url()).await;

    let call = call_countdown(&client, 40, 100);
    progress.wait_for(2).await;
    proxy.hold();
    proxy.cut();
    let seen = progress.seen().len() as u64;
    let (session, outcome) = countdown_stream(cl, log).await;
    // Wait until A wrote well past what the client saw, then release it all.
    let deadline = Instant::now() + CALL_TIMEOUT;
    let mut h = head(cl, &session, &outcome).await;
    while h < seen + 3 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
        h = head(cl, &session, &outcome).await;
    }
    cl.client()
        .await
        .trim(pb::TrimRequest {
            session: session.clone(),
            stream: outcome.stream,
            up_to_seq: h,
        })
        .await
        .unwrap();
    proxy.release_to(c.b.addr);

    let error = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .expect("the call ends instead of hanging")
        .unwrap()
        .expect_err("an evicted cursor cannot be resumed");
    assert_eq!(error.code.0, RESUME_DISCONTINUITY);
    assert!(
        error.message.contains("CURSOR_EVICTED") && error.message.contains("re-issue"),
        "{}",
        error.message
    );
    let data = error.data.expect("the verdict's facts");
    assert_eq!(data["verdict"], "CURSOR_EVICTED");
    assert_eq!(data["reason"], "cursor_evicted");
    assert_eq!(data["watermark"], h + 1);
    assert_eq!(progress.seen().len() as u64, seen, "nothing after the gap");
    assert_eq!(
        executions(log).len(),
        1,
        "not re-run behind the client's back"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_cursor_ends_the_call_and_reveals_nothing() {
    let c = Cluster::start(10_000);
    let (cl, log) = (&c.cursorlog, &c.log);

    // Session X runs a call on A.
    let px = Proxy::start(c.a.addr).await;
    let (x_progress, x) = connect(&px.url()).await;
    let x_call = call_countdown(&x, 7, 150);
    x_progress.wait_for(2).await;
    let (_, x_stream) = countdown_stream(cl, log).await;
    // The id X's client holds for its 2nd progress event (stream ids collide across sessions
    // in rmcp's request ids; cursorlog's never do).
    let x_cursor = format!("{}-{}-2.n1", x_stream.epoch, x_stream.stream);

    // Session Y runs its own call, loses its connection, and "resumes" with X's cursor.
    let py = Proxy::start(c.a.addr).await;
    let (y_progress, y) = connect(&py.url()).await;
    let y_call = call_countdown(&y, 5, 150);
    y_progress.wait_for(1).await;
    py.hold();
    py.cut();
    py.rewrite_last_event_id(&x_cursor);
    py.release_to(c.b.addr);

    let error = tokio::time::timeout(CALL_TIMEOUT, y_call)
        .await
        .expect("Y's call ends instead of hanging")
        .unwrap()
        .expect_err("a foreign cursor is not resumable");
    assert_eq!(error.code.0, RESUME_DISCONTINUITY);
    let data = error.data.expect("facts");
    assert_eq!(data["verdict"], "UNKNOWN_CURSOR");
    assert_eq!(data["reason"], "unknown_cursor");
    assert_eq!(
        data["head"],
        serde_json::Value::Null,
        "nothing about X's stream"
    );
    assert!(py.resumes().contains(&x_cursor));

    // Both calls had JSON-RPC id 1; in cursorlog they are different streams, each in its own
    // session, and Y's session cannot even name X's.
    let sessions = harness::execution_sessions(log);
    assert_eq!(sessions.len(), 2);
    assert_ne!(sessions[0], sessions[1]);
    let mut grpc = cl.client().await;
    let y_stream = grpc
        .get_outcome(pb::GetOutcomeRequest {
            session: sessions[1].clone(),
            correlation: "1".into(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner()
        .outcome
        .expect("Y's call has its own stream");
    assert_ne!(y_stream.stream, x_stream.stream);
    let foreign = grpc
        .get_outcome(pb::GetOutcomeRequest {
            session: sessions[1].clone(),
            correlation: String::new(),
            stream: Some(x_stream.stream),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!foreign.found, "X's stream does not exist for Y");
    assert!(
        y_progress.seen().iter().all(|m| m.ends_with("of 5")),
        "none of X's events reached Y: {:?}",
        y_progress.seen()
    );

    // X is unaffected.
    let x_result = tokio::time::timeout(CALL_TIMEOUT, x_call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(x_result.as_deref(), Ok("countdown of 7 done"));
    x_progress.wait_for(7).await;
    assert_eq!(x_progress.seen_by_step(), expected_progress(7));
    px.assert_steps_in_order();
    x.cancel().await.unwrap();
    y.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_producer_ends_the_resumed_call_with_the_aborted_error_within_the_lease() {
    const LEASE_MS: u64 = 1_500;
    let mut c = Cluster::start(LEASE_MS);
    let log = &c.log;
    let proxy = Proxy::start(c.a.addr).await;
    let (progress, client) = connect(&proxy.url()).await;

    let call = call_countdown(&client, 100, 100);
    progress.wait_for(2).await;
    proxy.hold();
    c.a.kill();
    let killed = Instant::now();
    proxy.cut();
    proxy.release_to(c.b.addr);

    let error = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .expect("the call ends instead of hanging")
        .unwrap()
        .expect_err("the producer died");
    let waited = killed.elapsed();
    assert_eq!(error.code.0, PRODUCER_ABORTED, "{}", error.message);
    assert!(error.message.contains("lease"), "{}", error.message);
    let data = error.data.expect("facts");
    assert_eq!(data["state"], "ABORTED");
    assert_eq!(data["reason"], "producer_aborted");
    assert_eq!(data["detail"], "producer lease expired");
    assert!(
        waited < Duration::from_millis(LEASE_MS + 3_000),
        "ended {waited:?} after the kill; lease is {LEASE_MS} ms"
    );
    assert!(progress.seen().len() < 100);
    assert_eq!(executions(log).len(), 1, "B did not re-run the tool");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_protected_cursorlog_works_with_the_token_and_refuses_without() {
    let cl = Server::start(&["--auth-token", "s3cret"]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("exec.log");
    let a = Replica::start_with_token(&cl, &log, 10_000, Some("s3cret"));
    let (progress, client) = connect(&format!("http://{}/mcp", a.addr)).await;
    let result = tokio::time::timeout(CALL_TIMEOUT, call_countdown(&client, 2, 10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.as_deref(), Ok("countdown of 2 done"));
    progress.wait_for(2).await;
    assert_eq!(progress.seen_by_step(), expected_progress(2));
    client.cancel().await.unwrap();

    // Without the token the replica cannot open the session, and the client is told so.
    let b = Replica::start(&cl, &log, 10_000);
    let refused = rmcp::ServiceExt::serve(
        harness::Recorder::default(),
        rmcp::transport::StreamableHttpClientTransport::from_uri(format!("http://{}/mcp", b.addr)),
    )
    .await;
    assert!(refused.is_err(), "initialize must fail without cursorlog");
}
