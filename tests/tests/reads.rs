//! The cap on concurrent Read calls (`--read-calls-max`): one call over it is refused with
//! RESOURCE_EXHAUSTED at once (never queued), the count shows in Stats and the metrics, a
//! freed slot is reused, and the default admits 10,000 idle followers.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{append, http_get, metric, open_stream, pb, read_request, Server};
use pb::cursor_log_client::CursorLogClient;
use tonic::transport::Channel;
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(20);

/// Starts a following Read and waits for its first message (the resolution): the call is
/// admitted and holds a slot from then on.
async fn follow(
    client: &mut CursorLogClient<Channel>,
    cursor: &str,
) -> tonic::Streaming<pb::ReadResponse> {
    let mut stream = client
        .read(read_request("s", cursor, true))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        first.item,
        Some(pb::read_response::Item::Resolution(_))
    ));
    stream
}

async fn stats(client: &mut CursorLogClient<Channel>) -> pb::StatsResponse {
    client
        .stats(pb::StatsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Waits (up to [`TIMEOUT`]) until `active_reads` is `n`.
async fn wait_active_reads(client: &mut CursorLogClient<Channel>, n: u64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let active = stats(client).await.active_reads;
        if active == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "active_reads stays {active}, not {n}"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_over_the_cap_is_refused_at_once_and_a_freed_slot_is_reused() {
    let server = Server::start(&["--read-calls-max", "3", "--metrics-listen", "127.0.0.1:0"]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let cursor = format!("{epoch}-{stream}-0");
    let mut followers = Vec::new();
    for _ in 0..3 {
        followers.push(follow(&mut c, &cursor).await);
    }
    assert_eq!(stats(&mut c).await.active_reads, 3);

    // The fourth: refused, at once (a queued call would run into the timeout).
    for _ in 0..2 {
        let refused = tokio::time::timeout(TIMEOUT, c.read(read_request("s", &cursor, true)))
            .await
            .expect("a Read over the cap must be answered at once, not queued");
        let status = refused.expect_err("a Read over the cap must be refused");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("--read-calls-max"), "{status:?}");
    }
    // Not a follow either: the cap is on Read calls.
    let status = c.read(read_request("s", &cursor, false)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);

    // Everything else goes on, and the admitted followers still deliver.
    append(&mut c, "s", stream, "progress", &[b"live"]).await;
    for f in &mut followers {
        let m = tokio::time::timeout(TIMEOUT, f.message()).await.unwrap();
        let Some(pb::read_response::Item::Events(batch)) = m.unwrap().unwrap().item else {
            panic!("expected the live event");
        };
        assert_eq!(&batch.events[0].payload[..], b"live");
    }
    let addr = server.metrics_addr.unwrap();
    let page = tokio::task::spawn_blocking(move || http_get(addr, &[]))
        .await
        .unwrap();
    assert_eq!(metric(&page, "cursorlog_active_reads"), Some(3), "{page}");
    assert_eq!(metric(&page, "cursorlog_read_calls_refused_total"), Some(3));
    assert_eq!(metric(&page, "cursorlog_read_calls_max"), Some(3));

    // A follower that goes away frees its slot; the next Read is admitted.
    drop(followers.pop());
    wait_active_reads(&mut c, 2).await;
    let _again = follow(&mut c, &cursor).await;
    assert_eq!(stats(&mut c).await.active_reads, 3);
}

/// The default cap (16384) admits 10,000 idle followers spread over 100 streams and 10
/// connections, and each still delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_followers_fit_under_the_default_cap() {
    const FOLLOWERS: usize = 10_000;
    const STREAMS: usize = 100;
    const CONNECTIONS: usize = 10;
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let mut cursors = Vec::new();
    for _ in 0..STREAMS {
        let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
        cursors.push((stream, format!("{epoch}-{stream}-0")));
    }
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(server.client().await);
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..FOLLOWERS {
        let mut client = clients[i % CONNECTIONS].clone();
        let cursor = cursors[i % STREAMS].1.clone();
        tasks.spawn(async move { (i, follow(&mut client, &cursor).await) });
    }
    let mut followers = Vec::with_capacity(FOLLOWERS);
    while let Some(joined) = tasks.join_next().await {
        followers.push(joined.unwrap());
    }
    let admitted = started.elapsed();
    let s = stats(&mut c).await;
    assert_eq!(s.active_reads, FOLLOWERS as u64);
    assert!(s.active_followers <= FOLLOWERS as u64);

    // One event on one stream reaches exactly its 100 followers.
    let (stream, _) = &cursors[7];
    append(&mut c, "s", *stream, "progress", &[b"wake"]).await;
    let mut woken = 0;
    for (i, f) in &mut followers {
        if *i % STREAMS == 7 {
            let m = tokio::time::timeout(TIMEOUT, f.message()).await.unwrap();
            assert!(matches!(
                m.unwrap().unwrap().item,
                Some(pb::read_response::Item::Events(_))
            ));
            woken += 1;
        }
    }
    assert_eq!(woken, FOLLOWERS / STREAMS);
    drop(followers);
    wait_active_reads(&mut c, 0).await;
    eprintln!("{FOLLOWERS} followers admitted in {admitted:?}");
}
