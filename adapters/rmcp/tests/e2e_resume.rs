//! End to end, the corrected verdict table as rmcp's own client meets it: a visible gap for
//! evicted events followed by the truth, priming and retry on resumed connections so a call
//! survives repeated disconnects, and sessions that any replica restores for as long as they
//! live (not the metadata horizon).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::{Duration, Instant};

use harness::{
    call_countdown, connect, countdown_stream, execution_sessions, executions, expected_progress,
    head, pb, Cluster, Proxy,
};

const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The client is away while retention evicts events it never got. Resuming, it sees a
/// `notifications/message` warning naming the evicted seqs, then the retained rest of the
/// call and its real result: the call is not failed (which would invite re-running it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_cursor_marks_the_gap_then_delivers_the_rest_and_the_result() {
    let c = Cluster::start(10_000);
    let (cl, log) = (&c.cursorlog, &c.log);
    let proxy = Proxy::start(c.a.addr).await;
    let (progress, client) = connect(&proxy.url()).await;

    let call = call_countdown(&client, 30, 100);
    progress.wait_for(2).await;
    proxy.hold();
    proxy.cut();
    let seen = progress.seen().len() as u64;
    let (session, outcome) = countdown_stream(cl, log).await;
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

    let result = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .expect("the call ends instead of hanging")
        .unwrap();
    assert_eq!(
        result.as_deref(),
        Ok("countdown of 30 done"),
        "the real result"
    );

    let logs = progress.logs.lock().unwrap().clone();
    assert_eq!(logs.len(), 1, "one gap marker: {logs:?}");
    let (level, logger, data) = &logs[0];
    assert_eq!(level, "warning");
    assert_eq!(logger.as_deref(), Some(cursorlog_rmcp::GAP_LOGGER));
    assert_eq!(data["reason"], "events_evicted");
    assert_eq!(data["verdict"], "CURSOR_EVICTED");
    assert_eq!(data["watermark"], h + 1);
    let first = data["first_evicted_seq"].as_u64().unwrap();
    assert_eq!(data["last_evicted_seq"], h);
    // What the client got: steps up to its cursor, then everything retained after the gap.
    let mut expected: Vec<String> = expected_progress(30);
    expected.drain(first as usize - 1..h as usize);
    progress.wait_for(expected.len()).await;
    let got = progress.seen_by_step();
    assert_eq!(got, expected, "the retained rest, once");
    proxy.assert_steps_in_order();
    assert!(
        first > seen,
        "the gap starts after what the client had ({seen})"
    );
    assert_eq!(executions(log).len(), 1, "not re-run");
    client.cancel().await.unwrap();
}

/// One call loses its connection twice (to A, then to B while resumed there); each time the
/// client resumes from its last event, and gets every progress notification exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_disconnects_of_one_call_resume_each_time() {
    let c = Cluster::start(10_000);
    let proxy = Proxy::start(c.a.addr).await;
    let (progress, client) = connect(&proxy.url()).await;

    let call = call_countdown(&client, 12, 150);
    progress.wait_for(2).await;
    proxy.release_to(c.b.addr);
    proxy.cut();
    progress.wait_for(5).await;
    proxy.release_to(c.a.addr);
    proxy.cut();

    let result = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .expect("the call finishes")
        .unwrap();
    assert_eq!(result.as_deref(), Ok("countdown of 12 done"));
    progress.wait_for(12).await;
    assert_eq!(
        progress.seen_by_step(),
        expected_progress(12),
        "every event once"
    );
    proxy.assert_steps_in_order();
    assert!(
        proxy.resumes().len() >= 2,
        "resumed after each cut: {:?}",
        proxy.resumes()
    );
    assert_eq!(executions(&c.log).len(), 1);
    client.cancel().await.unwrap();
}

/// A GET with `Last-Event-ID` for a finished call, on the other replica: the connection opens
/// with a priming event (the presented id and the retry hint), then the missed events under
/// their original ids, then the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_connection_starts_with_a_priming_event_and_the_retry_hint() {
    let c = Cluster::start(10_000);
    let (progress, client) = connect(&format!("http://{}/mcp", c.a.addr)).await;
    let result = tokio::time::timeout(CALL_TIMEOUT, call_countdown(&client, 4, 10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.as_deref(), Ok("countdown of 4 done"));
    progress.wait_for(4).await;
    assert_eq!(progress.seen().len(), 4);
    let (session, outcome) = countdown_stream(&c.cursorlog, &c.log).await;
    let cursor = |seq: u64| format!("{}-{}-{seq}.n1", outcome.epoch, outcome.stream);

    let body = reqwest::Client::new()
        .get(format!("http://{}/mcp", c.b.addr))
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", &session)
        .header("Mcp-Protocol-Version", "2025-11-25")
        .header("Last-Event-ID", cursor(2))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<&str> = body
        .split("\n\n")
        .filter(|e| e.contains("id:") || e.contains("data:"))
        .collect();
    assert!(events.len() >= 4, "{body:?}");
    assert!(
        events[0].contains(&format!("id: {}", cursor(2))),
        "{body:?}"
    );
    assert!(events[0].contains("retry: 200"), "{body:?}");
    assert!(
        !events[0].contains("data: {"),
        "priming carries no message: {body:?}"
    );
    assert!(events[1].contains(&format!("id: {}", cursor(3))) && events[1].contains("step 3 of 4"));
    assert!(events[2].contains(&format!("id: {}", cursor(4))) && events[2].contains("step 4 of 4"));
    assert!(
        events[3].contains(&format!("id: {}", cursor(5)))
            && events[3].contains("countdown of 4 done")
    );
    assert_eq!(events.len(), 4, "nothing else: {body:?}");
    client.cancel().await.unwrap();
}

/// Sessions are restorable on any replica for as long as they live in cursorlog. With a
/// 1-second metadata horizon, a finished call is forgotten after a second; the session (still
/// alive) is restored on replica B under its own id, not re-created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_session_is_restored_past_the_metadata_horizon() {
    let c = Cluster::start_with(
        10_000,
        &[
            "--metadata-horizon-secs",
            "1",
            "--retention-check-interval-ms",
            "100",
        ],
        &[],
    );
    let proxy = Proxy::start(c.a.addr).await;
    let (_, client) = connect(&proxy.url()).await;
    let first = tokio::time::timeout(CALL_TIMEOUT, call_countdown(&client, 1, 0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Ok("countdown of 1 done"));
    let (session, outcome) = countdown_stream(&c.cursorlog, &c.log).await;

    // Wait until cursorlog has forgotten the finished call (past the horizon).
    let mut grpc = c.cursorlog.client().await;
    let deadline = Instant::now() + CALL_TIMEOUT;
    loop {
        let r = grpc
            .resolve(pb::ResolveRequest {
                session: session.clone(),
                last_event_id: format!("{}-{}-0", outcome.epoch, outcome.stream),
                declared_stream: None,
            })
            .await
            .unwrap()
            .into_inner();
        if r.verdict() == pb::Verdict::UnknownCursor {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the finished call was never forgotten"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The next request lands on B, which never saw the session.
    proxy.release_to(c.b.addr);
    proxy.cut();
    let second = tokio::time::timeout(CALL_TIMEOUT, call_countdown(&client, 1, 0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.as_deref(), Ok("countdown of 1 done"));
    let sessions = execution_sessions(&c.log);
    assert_eq!(sessions.len(), 2);
    assert_eq!(
        sessions[0], sessions[1],
        "B restored the same session, not a new one"
    );
    client.cancel().await.unwrap();
}
