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
    assert_eq!(
        stats(&mut c).await.read_calls_refused,
        3,
        "Stats counts them too"
    );
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

/// The server's resident memory, in KiB (`VmRSS` in /proc/<pid>/status).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Followers that stop reading while their stream grows cost the server a bounded amount
/// each, not what is appended: 200 of them, 4 MiB of 4 KiB events appended to their stream,
/// grow its memory by less than 1 MiB each (measured: 30 to 115 MiB in all, most of it the
/// allocator keeping what the burst of reads used; before the fix: 2.5 to 2.7 GiB), and 1 MiB
/// more adds nothing (paused, they read nothing from the log); they show as paused; and when
/// they read again each gets every event exactly once, in order, from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_that_stop_reading_cost_a_small_buffer_and_resume_from_the_log() {
    const FOLLOWERS: usize = 200;
    const PER_CONNECTION: usize = 20;
    const EVENT_BYTES: usize = 4096;
    // Two blocking threads: each thread of the pool keeps an allocator cache of what its
    // reads used (a cost per thread, up to some 10 MiB after this burst, not per follower).
    let server = Server::start(&[
        "--metrics-listen",
        "127.0.0.1:0",
        "--sync",
        "never",
        "--blocking-threads",
        "2",
    ]);
    let metrics = server.metrics_addr.unwrap();
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let cursor = format!("{epoch}-{stream}-0");
    let mut followers = Vec::with_capacity(FOLLOWERS);
    for _ in 0..FOLLOWERS / PER_CONNECTION {
        let mut client = server.client().await;
        for _ in 0..PER_CONNECTION {
            followers.push(follow(&mut client, &cursor).await);
        }
    }
    // One append, read by every follower, so the baseline includes what any read costs.
    append(&mut c, "s", stream, "progress", &[&[0_u8; 8]]).await;
    for f in &mut followers {
        let m = tokio::time::timeout(TIMEOUT, f.message()).await.unwrap();
        assert!(matches!(
            m.unwrap().unwrap().item,
            Some(pb::read_response::Item::Events(_))
        ));
    }
    let before = rss_kib(server.pid());

    // Nobody reads while 4 MiB are appended.
    let payload = |seq: u64| {
        let mut p = vec![(seq % 251) as u8; EVENT_BYTES];
        p[..8].copy_from_slice(&seq.to_le_bytes());
        p
    };
    let mut next_seq = 2;
    let mut append_round = |c: &mut CursorLogClient<Channel>, events: u64| {
        let first = next_seq;
        next_seq += events;
        let mut c = c.clone();
        async move {
            for from in (first..first + events).step_by(16) {
                let batch: Vec<Vec<u8>> = (from..from + 16).map(payload).collect();
                let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
                append(&mut c, "s", stream, "progress", &refs).await;
            }
        }
    };
    append_round(&mut c, 1024).await;
    // Every follower is paused once the server has pushed what its client's windows take.
    let deadline = Instant::now() + TIMEOUT;
    let mut paused = None;
    while Instant::now() < deadline {
        let page = tokio::task::spawn_blocking(move || http_get(metrics, &[]))
            .await
            .unwrap();
        paused = metric(&page, "cursorlog_reads_paused");
        if paused == Some(FOLLOWERS as u64) {
            break;
        }
        tokio::task::yield_now().await;
    }
    let first_mib = rss_kib(server.pid()).saturating_sub(before) / 1024;
    eprintln!("{FOLLOWERS} paused followers: RSS grew {first_mib} MiB after 4 MiB appended");
    assert!(
        first_mib < FOLLOWERS as u64,
        "{FOLLOWERS} followers that stopped reading grew the server by {first_mib} MiB"
    );
    assert_eq!(paused, Some(FOLLOWERS as u64), "paused followers");
    // Paused, they read nothing more: 1 MiB more costs nothing.
    append_round(&mut c, 256).await;
    let second_mib = rss_kib(server.pid()).saturating_sub(before) / 1024;
    eprintln!("after 1 MiB more: RSS grew {second_mib} MiB in all");
    assert!(
        second_mib < first_mib + 16,
        "paused followers grew the server from {first_mib} to {second_mib} MiB"
    );
    let last = next_seq - 1;

    // They read again, all at once (one that read alone would wait for the others: they share
    // their connections' flow-control windows): each gets seq 2..=last exactly once, in order.
    let readers = followers.into_iter().map(|mut f| {
        tokio::spawn(async move {
            let mut next = 2;
            while next <= last {
                let m = tokio::time::timeout(TIMEOUT, f.message())
                    .await
                    .expect("a resumed follower delivers")
                    .unwrap()
                    .unwrap();
                let Some(pb::read_response::Item::Events(batch)) = m.item else {
                    panic!("unexpected message {m:?}");
                };
                for e in batch.events {
                    assert_eq!(e.seq, next, "events out of order or repeated");
                    assert_eq!(e.payload, payload(next));
                    next += 1;
                }
            }
        })
    });
    for reader in readers.collect::<Vec<_>>() {
        reader.await.unwrap();
    }
    let page = tokio::task::spawn_blocking(move || http_get(metrics, &[]))
        .await
        .unwrap();
    assert_eq!(metric(&page, "cursorlog_reads_paused"), Some(0), "{page}");
}
