//! Connections are bounded: a connection that sends no HTTP/2 preface is closed after the
//! handshake timeout, one over the cap is closed at once while a reserved slot still answers
//! health, a peer that stops answering keepalive PINGs is dropped, running out of descriptors
//! neither spins the accept loop nor keeps clients out once the flood ends, and the soft
//! descriptor limit is raised to the hard one at start.
//!
//! The new settings are given as environment variables, so a binary without them still
//! starts and the test fails on the behaviour, not on the command line.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cursorlog_tests::{health, http_get, metric, pb, Server, Start};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

/// The longest any step may take before the test fails.
const BOUND: Duration = Duration::from_secs(20);

/// The HTTP/2 connection preface a client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads from `socket` until the server closes it (EOF or reset); panics after [`BOUND`].
async fn wait_closed(socket: &mut TcpStream) {
    let mut buf = [0_u8; 4096];
    let closed = tokio::time::timeout(BOUND, async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server kept the connection open");
}

/// The metrics page's `name`, read until it satisfies `ok` (panics after [`BOUND`]).
async fn wait_metric(addr: SocketAddr, name: &str, ok: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + BOUND;
    loop {
        let page = tokio::task::spawn_blocking(move || http_get(addr, &[]))
            .await
            .unwrap();
        if let Some(v) = metric(&page, name).filter(|v| ok(*v)) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never as expected:\n{page}"
        );
        tokio::task::yield_now().await;
    }
}

async fn channel_to(addr: SocketAddr) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_preface_is_closed_after_the_handshake_timeout() {
    let server = Server::start_with(Start {
        env: &[("CURSORLOG_HANDSHAKE_TIMEOUT_SECS", "1")],
        ..Start::default()
    });
    // A real client connected before: it completed its handshake, so it stays.
    let mut c = server.client().await;
    let (_, stream) = cursorlog_tests::open_stream(&mut c, "s", None, None).await;
    let mut follower = c
        .read(cursorlog_tests::read_request(
            "s",
            &format!("1-{stream}-0"),
            true,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(follower.message().await.unwrap().is_some());

    let started = Instant::now();
    let mut silent = TcpStream::connect(server.connect_addr()).await.unwrap();
    wait_closed(&mut silent).await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before the timeout: {:?}",
        started.elapsed()
    );

    // The real client's connection outlived the silent one: its follower still delivers.
    cursorlog_tests::append(&mut c, "s", stream, "progress", &[b"after"]).await;
    let next = tokio::time::timeout(BOUND, follower.message())
        .await
        .expect("follower delivers")
        .unwrap()
        .unwrap();
    assert!(matches!(
        next.item,
        Some(pb::read_response::Item::Events(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_a_reserved_slot_answers_health_only_and_the_next_is_closed() {
    let server = Server::start_with(Start {
        args: &["--metrics-listen", "127.0.0.1:0"],
        env: &[
            ("CURSORLOG_CONNECTIONS_MAX", "3"),
            ("CURSORLOG_CONNECTIONS_RESERVED", "1"),
            ("CURSORLOG_HANDSHAKE_TIMEOUT_SECS", "60"),
        ],
        ..Start::default()
    });
    let metrics = server.metrics_addr.unwrap();
    let mut a = server.client().await;
    a.stats(pb::StatsRequest {}).await.unwrap();
    let silent: Vec<TcpStream> = {
        let mut v = Vec::new();
        for _ in 0..2 {
            v.push(TcpStream::connect(server.connect_addr()).await.unwrap());
        }
        v
    };
    wait_metric(metrics, "cursorlog_connections", |n| n == 3).await;

    // The fourth connection gets the reserved slot: health answers, nothing else does.
    let reserved = channel_to(server.connect_addr()).await.unwrap();
    assert_eq!(health(&reserved, "").await, ServingStatus::Serving);
    let refused = pb::cursor_log_client::CursorLogClient::new(reserved.clone())
        .stats(pb::StatsRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--connections-max"),
        "{refused:?}"
    );

    // The fifth is closed at once (long before the 60 s handshake timeout).
    let started = Instant::now();
    let mut over = TcpStream::connect(server.connect_addr()).await.unwrap();
    wait_closed(&mut over).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(wait_metric(metrics, "cursorlog_connections_refused_total", |n| n >= 1).await >= 1);

    // The silent ones leave: their slots are free again, and a new client is served.
    drop(silent);
    wait_metric(metrics, "cursorlog_connections", |n| n <= 2).await;
    let mut b = pb::cursor_log_client::CursorLogClient::new(
        channel_to(server.connect_addr()).await.unwrap(),
    );
    b.stats(pb::StatsRequest {}).await.unwrap();
    drop(reserved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_does_not_answer_keepalive_pings_is_dropped() {
    let server = Server::start_with(Start {
        env: &[
            ("CURSORLOG_HTTP2_KEEPALIVE_INTERVAL_SECS", "1"),
            ("CURSORLOG_HTTP2_KEEPALIVE_TIMEOUT_SECS", "1"),
        ],
        ..Start::default()
    });
    // A peer that completes the handshake (preface and SETTINGS), then never answers.
    let mut peer = TcpStream::connect(server.connect_addr()).await.unwrap();
    peer.write_all(PREFACE).await.unwrap();
    peer.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut received = Vec::new();
    let mut buf = [0_u8; 4096];
    let closed = tokio::time::timeout(BOUND, async {
        loop {
            match peer.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a peer that ignores PINGs was kept");
    // Walk the frames the server sent: one of them is a PING (type 6) that was not acked.
    let mut at = 0;
    let mut pinged = false;
    while at + 9 <= received.len() {
        let len = usize::from(received[at]) << 16
            | usize::from(received[at + 1]) << 8
            | usize::from(received[at + 2]);
        pinged |= received[at + 3] == 6 && received[at + 4] & 1 == 0;
        at += 9 + len;
    }
    assert!(pinged, "no PING frame before the close: {received:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_accept_loop_backs_off_and_clients_get_in_after_the_flood() {
    let server = Server::start_with(Start {
        env: &[("CURSORLOG_HANDSHAKE_TIMEOUT_SECS", "60")],
        ..Start::default()
    });
    let pid = server.pid();
    let limited = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=64:64"])
        .status()
        .unwrap();
    assert!(limited.success(), "prlimit failed");

    // The flood: more silent connections than the server has descriptors. Those beyond its
    // limit wait in the listen backlog, so the listener stays readable while accept fails.
    let mut flood = Vec::new();
    for _ in 0..150 {
        let connect = TcpStream::connect(server.connect_addr());
        flood.push(tokio::time::timeout(BOUND, connect).await.unwrap().unwrap());
    }
    // The flood holds for a window. A measuring window, not a synchronisation: nothing is
    // waited for.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The flood ends: a normal client gets in.
    drop(flood);
    let deadline = Instant::now() + BOUND;
    loop {
        if let Ok(channel) = channel_to(server.connect_addr()).await {
            let mut c = pb::cursor_log_client::CursorLogClient::new(channel);
            if c.stats(pb::StatsRequest {}).await.is_ok() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no client got in after the flood; logs:\n{}",
            server.logs()
        );
    }
    assert!(
        server.logs().contains("pausing between attempts"),
        "{}",
        server.logs()
    );
    // How often accept failed while the flood held, as the server counted and logged it
    // when a connection got in again. Backing off (5 ms doubling to 1 s) makes that about a
    // dozen plus one a second; a loop that spins on accept fails thousands of times a second
    // even when it gets a sliver of a core. Counting attempts, unlike timing the server,
    // does not depend on how busy the machine is.
    assert!(
        server.wait_for_log("accepting connections again"),
        "{}",
        server.logs()
    );
    let failures: u64 = server
        .logs()
        .lines()
        .filter(|l| l.contains("accepting connections again"))
        .map(|l| {
            let n = l.split("failures=").nth(1).unwrap_or_else(|| panic!("{l}"));
            n.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    eprintln!("accept failed {failures} times while out of descriptors");
    assert!(
        (1..=200).contains(&failures),
        "accept failed {failures} times while out of descriptors: the accept loop spins \
         instead of backing off"
    );
}

#[test]
fn the_soft_descriptor_limit_is_raised_to_the_hard_one_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("prlimit")
        .arg("--nofile=100:4000")
        .arg(cursorlog_tests::binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let listening = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.starts_with("listening on"));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(listening, "the server did not start");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers, ["4000", "4000"], "{line}");
}
