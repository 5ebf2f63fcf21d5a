//! The session manager under concurrency, against a real cursorlog and rmcp's own session
//! workers and server runtime (no HTTP): stream creation never waits on another session,
//! every stream is bound to its own session and request, writes of all sessions share
//! batched appends, and a write cursorlog did not take is an error, never an id-less event.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::atomic::Ordering;

use futures::{FutureExt, StreamExt};
use rmcp::transport::streamable_http_server::session::SessionManager;
use support::{drain, emit, emit_held, outcome, pb, result_text, Emitter, Fixture, WAIT};

/// rmcp's default per-stream channel capacity: a response stream nobody reads holds the
/// priming event and 15 more before the session's worker blocks.
const CHANNEL: usize = 16;

/// Session `stuck` runs a call whose client does not read its response stream, so its worker
/// blocks; then a second stream is created in it (and waits on that worker). Meanwhile ten
/// other sessions create streams and finish their calls. With one lock per replica around
/// stream creation (the adapter before this fix) they all wait for the stuck client.
///
/// A current-thread runtime makes the interleaving exact: after `yield_now`, the spawned
/// creation has taken whatever it takes and queued its request at the stuck worker.
#[tokio::test(flavor = "current_thread")]
async fn stream_creation_never_waits_on_another_sessions_slow_client() {
    let fx = Fixture::start(|_| {});
    let slow = Emitter::default();
    let stuck = fx.session(slow.clone()).await;
    let others: Vec<_> = {
        let mut ids = Vec::new();
        for _ in 0..10 {
            ids.push(fx.session(Emitter::default()).await);
        }
        ids
    };

    // The stuck session's first call: nobody reads its stream.
    let unread = fx
        .manager
        .create_stream(&stuck, emit(1, 100, "slow"))
        .await
        .unwrap();
    slow.wait_sent(CHANNEL - 1).await;
    // A second stream in the stuck session waits on its worker.
    let second = tokio::spawn({
        let (manager, stuck) = (fx.manager.clone(), stuck.clone());
        async move {
            let stream = manager.create_stream(&stuck, emit(2, 1, "second")).await?;
            Ok::<_, cursorlog_rmcp::Error>(drain(Box::pin(stream)).await)
        }
    });
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;

    // Other sessions create their streams and finish their calls meanwhile.
    let calls = others.iter().map(|id| {
        let manager = fx.manager.clone();
        let id = id.clone();
        async move {
            let stream = manager
                .create_stream(&id, emit(7, 2, "other"))
                .await
                .unwrap();
            drain(Box::pin(stream)).await
        }
    });
    let finished = tokio::time::timeout(WAIT, futures::future::join_all(calls))
        .await
        .expect("the other sessions' calls waited on the stuck session's client");
    for events in &finished {
        assert_eq!(result_text(events).as_deref(), Some("done other"));
    }
    assert!(
        !second.is_finished(),
        "the stuck session's own new stream waits on its worker"
    );

    // The client reads again: the stuck session catches up, both of its calls finish.
    let first = drain(Box::pin(unread)).await;
    assert_eq!(result_text(&first).as_deref(), Some("done slow"));
    let second = tokio::time::timeout(WAIT, second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(result_text(&second).as_deref(), Some("done second"));
    for id in others.iter().chain([&stuck]) {
        assert!(outcome(&fx, id, if id == &stuck { 2 } else { 7 })
            .await
            .is_some());
    }
}

/// A caller that goes away while its new stream waits on a stuck worker (the HTTP client hung
/// up) must not leave anything behind that another session's stream creation could take. The
/// adapter before this fix left its one replica-wide "next stream" declaration set, and the
/// stuck worker, once free, bound its new stream to whichever session declared next: session
/// B's stream landed in B's cursorlog session under A's worker, and B's own call failed.
#[tokio::test(flavor = "current_thread")]
async fn a_creation_whose_caller_went_away_never_takes_another_sessions_stream() {
    let fx = Fixture::start(|_| {});
    let (slow_a, slow_b) = (Emitter::default(), Emitter::default());
    let a = fx.session(slow_a.clone()).await;
    let b = fx.session(slow_b.clone()).await;
    let unread_a = fx
        .manager
        .create_stream(&a, emit(1, 100, "a1"))
        .await
        .unwrap();
    let unread_b = fx
        .manager
        .create_stream(&b, emit(1, 100, "b1"))
        .await
        .unwrap();
    slow_a.wait_sent(CHANNEL - 1).await;
    slow_b.wait_sent(CHANNEL - 1).await;

    // A's second stream waits on A's stuck worker; its caller goes away.
    let gone = tokio::spawn({
        let (manager, a) = (fx.manager.clone(), a.clone());
        async move {
            manager
                .create_stream(&a, emit(2, 1, "a2"))
                .await
                .map(|_| ())
        }
    });
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    gone.abort();
    // B's second stream waits on B's stuck worker.
    let b2 = tokio::spawn({
        let (manager, b) = (fx.manager.clone(), b.clone());
        async move {
            let stream = manager.create_stream(&b, emit(2, 1, "b2")).await?;
            Ok::<_, cursorlog_rmcp::Error>(drain(Box::pin(stream)).await)
        }
    });
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;

    // A's worker gets free first, then B's.
    assert_eq!(
        result_text(&drain(Box::pin(unread_a)).await).as_deref(),
        Some("done a1")
    );
    assert_eq!(
        result_text(&drain(Box::pin(unread_b)).await).as_deref(),
        Some("done b1")
    );
    let b2 = tokio::time::timeout(WAIT, b2)
        .await
        .unwrap()
        .unwrap()
        .expect("B's stream was created for B's request");
    assert_eq!(result_text(&b2).as_deref(), Some("done b2"));

    // In cursorlog, B's request 2 is answered by B's own result, and A's by A's.
    let b_outcome = outcome(&fx, &b, 2)
        .await
        .expect("B's request 2 has a stream in B");
    let frame: serde_json::Value =
        serde_json::from_slice(&b_outcome.frame.expect("B's result is stored").payload).unwrap();
    assert_eq!(frame["result"]["content"][0]["text"], "done b2");
    let a_outcome = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(o) = outcome(&fx, &a, 2).await.filter(|o| o.frame.is_some()) {
                return o;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("A's abandoned call still ran and its result is stored in A");
    let frame: serde_json::Value =
        serde_json::from_slice(&a_outcome.frame.unwrap().payload).unwrap();
    assert_eq!(frame["result"]["content"][0]["text"], "done a2");
    assert_ne!(a_outcome.stream, b_outcome.stream);
}

/// Many streams created at once in one session each answer their own request: cursorlog's
/// stream for request k holds the progress and result of request k.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_of_one_session_each_answer_their_own_request() {
    let fx = Fixture::start(|_| {});
    let id = fx.session(Emitter::default()).await;
    let calls = (1..=20).map(|k| {
        let (manager, id) = (fx.manager.clone(), id.clone());
        async move {
            let stream = manager
                .create_stream(&id, emit(k, 3, &format!("r{k}")))
                .await
                .unwrap();
            (k, drain(Box::pin(stream)).await)
        }
    });
    for (k, events) in futures::future::join_all(calls).await {
        assert_eq!(result_text(&events), Some(format!("done r{k}")));
        let o = outcome(&fx, &id, k).await.expect("a stream per request");
        let frame: serde_json::Value = serde_json::from_slice(&o.frame.unwrap().payload).unwrap();
        assert_eq!(
            frame["id"], k,
            "request {k}'s stream ends with request {k}'s result"
        );
        // Every event id the client got names that same stream, in order.
        let ids: Vec<String> = events.iter().filter_map(|(id, _)| id.clone()).collect();
        let expected: Vec<String> = (0..=4)
            .map(|seq| format!("{}-{}-{seq}.n{k}", o.epoch, o.stream))
            .collect();
        assert_eq!(ids, expected);
    }
}

/// Concurrent writes of 50 sessions go out in shared `AppendBatch` calls (fewer calls than
/// writes), and every caller gets the id of its own event: reading each id back from
/// cursorlog gives exactly the message that was sent under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_many_sessions_share_batched_appends_and_each_gets_its_own_id() {
    let fx = Fixture::start(|c| c.batch.max_in_flight = 1);
    let mut sessions = Vec::new();
    for _ in 0..50 {
        sessions.push(fx.session(Emitter::default()).await);
    }
    let before = fx.manager.append_stats();
    let calls = sessions.iter().enumerate().map(|(i, id)| {
        let (manager, id) = (fx.manager.clone(), id.clone());
        async move {
            let stream = manager
                .create_stream(&id, emit(1, 4, &format!("s{i}")))
                .await
                .unwrap();
            (id, drain(Box::pin(stream)).await)
        }
    });
    let done = futures::future::join_all(calls).await;
    let stats = fx.manager.append_stats();
    let (calls, items) = (stats.calls - before.calls, stats.items - before.items);
    assert_eq!(
        items,
        50 * 6,
        "the stream's open, 4 progress notifications and a result per session, all batched"
    );
    assert!(
        calls < items,
        "{calls} AppendBatch calls for {items} writes: nothing was shared"
    );

    let mut client = fx.client().await;
    for (session, events) in done {
        for (id, message) in events.iter().filter(|(_, m)| m.is_some()) {
            let cursor = id.as_deref().unwrap().split('.').next().unwrap();
            let (stream, seq) = {
                let mut parts = cursor.split('-').skip(1).map(|p| p.parse::<u64>().unwrap());
                (parts.next().unwrap(), parts.next().unwrap())
            };
            let mut read = client
                .read(pb::ReadRequest {
                    session: session.to_string(),
                    last_event_id: format!("1-{stream}-{}", seq - 1),
                    declared_stream: None,
                    follow: false,
                    batch_events_max: 1,
                    resume_own_stream: true,
                })
                .await
                .unwrap()
                .into_inner();
            let mut stored = None;
            while let Some(msg) = read.next().await {
                if let Some(pb::read_response::Item::Events(batch)) = msg.unwrap().item {
                    stored = batch.events.into_iter().find(|e| e.seq == seq);
                    break;
                }
            }
            let stored: serde_json::Value =
                serde_json::from_slice(&stored.expect("the id names a stored event").payload)
                    .unwrap();
            assert_eq!(
                &stored,
                message.as_ref().unwrap(),
                "{cursor} holds what was sent under it"
            );
        }
    }
}

/// The control of the lever above: with `open_in_batch` off every stream opens with its own
/// unary `OpenStream`, so the shared batches carry the writes only, and the calls still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_open_in_batch_off_streams_open_outside_the_batches() {
    let fx = Fixture::start(|c| c.batch.open_in_batch = false);
    let mut sessions = Vec::new();
    for _ in 0..5 {
        sessions.push(fx.session(Emitter::default()).await);
    }
    let before = fx.manager.append_stats();
    let calls = sessions.iter().enumerate().map(|(i, id)| {
        let (manager, id) = (fx.manager.clone(), id.clone());
        async move {
            let stream = manager
                .create_stream(&id, emit(1, 2, &format!("s{i}")))
                .await
                .unwrap();
            drain(Box::pin(stream)).await
        }
    });
    for (i, events) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(result_text(&events), Some(format!("done s{i}")));
    }
    let items = fx.manager.append_stats().items - before.items;
    assert_eq!(
        items,
        5 * 3,
        "2 progress notifications and a result per session"
    );
}

/// When cursorlog cannot store, the tool's send fails and the client gets nothing more: no
/// event without an id (which a later resume would silently skip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_store_fails_the_send_and_sends_nothing_without_an_id() {
    let mut fx = Fixture::start(|c| c.batch.retries = 0);
    let handler = Emitter::default();
    let id = fx.session(handler.clone()).await;
    let mut stream = Box::pin(
        fx.manager
            .create_stream(&id, emit(1, 1_000, "x"))
            .await
            .unwrap(),
    );
    // The priming event and the first notifications, each with its cursorlog id.
    for _ in 0..4 {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap();
        assert!(event.event_id.is_some());
    }
    fx.server.kill();
    // The handler's next notification fails: the store refused it, so rmcp did not send it.
    handler.wait_failed(1).await;
    // What is in the channel now was stored before cursorlog went away: every event has its
    // id, and the failed one is not among them.
    let sent = handler.sent.load(Ordering::SeqCst);
    let mut buffered = 0;
    while let Some(Some(event)) = stream.next().now_or_never() {
        assert!(
            event.event_id.is_some(),
            "an event without an id reached the client: {event:?}"
        );
        buffered += 1;
    }
    assert!(
        buffered <= sent - 3,
        "{buffered} events after the 3 read, {sent} stored in all"
    );
}

/// rmcp's `close_sse_stream` (SEP-1699 polling) on a request stream also closes the
/// connections resumed from cursorlog on this replica: each ends with a priming event that
/// carries its own position and the retry hint, so the client resumes from exactly there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_stream_closes_its_resumed_connections_at_their_own_position() {
    let fx = Fixture::start(|_| {});
    let handler = Emitter::default();
    let id = fx.session(handler.clone()).await;
    let mut first = Box::pin(
        fx.manager
            .create_stream(&id, emit_held(1, 2, "c"))
            .await
            .unwrap(),
    );
    let mut ids = Vec::new();
    for _ in 0..3 {
        let event = tokio::time::timeout(WAIT, first.next())
            .await
            .unwrap()
            .unwrap();
        ids.push(event.event_id.unwrap());
    }
    // The client resumes from the first progress notification on a new connection.
    let mut resumed = Box::pin(fx.manager.resume(&id, ids[1].clone()).await.unwrap());
    let priming = tokio::time::timeout(WAIT, resumed.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(priming.event_id.as_deref(), Some(ids[1].as_str()));
    assert!(priming.message.is_none() && priming.retry.is_some());
    let second = tokio::time::timeout(WAIT, resumed.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.event_id.as_deref(), Some(ids[2].as_str()));

    // The server closes the call's stream (its first request stream: rmcp's id 0).
    let handle = fx.manager.session_handle(&id).await.unwrap();
    handle
        .close_sse_stream(0, Some(std::time::Duration::from_secs(7)))
        .await
        .unwrap();
    let close = tokio::time::timeout(WAIT, resumed.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        close.event_id.as_deref(),
        Some(ids[2].as_str()),
        "its own position"
    );
    assert_eq!(close.retry, Some(std::time::Duration::from_secs(7)));
    assert!(close.message.is_none());
    assert!(
        tokio::time::timeout(WAIT, resumed.next())
            .await
            .unwrap()
            .is_none(),
        "the resumed connection ended"
    );

    // The call itself goes on and finishes.
    handler.release.notify_one();
    tokio::time::timeout(WAIT, async {
        while outcome(&fx, &id, 1).await.and_then(|o| o.frame).is_none() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the call's result is stored");
}
