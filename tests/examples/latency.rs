//! Loopback latency of Append and Resolve against the real binary, one request at a time:
//! `cargo build --release -p cursorlog-server && cargo run --release -p cursorlog-tests
//! --example latency -- [requests] [--sync always|never|interval:<ms>]`.
//!
//! Set `CURSORLOG_BENCH_DIR` to put the data directory on the disk under test (a tmpfs says
//! nothing about fsync); the default is a temporary directory.

#![allow(clippy::unwrap_used, reason = "measurement tool")]

use std::time::{Duration, Instant};

use cursorlog_tests::{event, open_stream, pb, Server};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name:<8} n={:<6} p50={:>8.1?} p99={:>8.1?} max={:>8.1?}",
        samples.len(),
        percentile(&samples, 0.50),
        percentile(&samples, 0.99),
        samples.last().copied().unwrap_or_default()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let requests: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let sync = args
        .iter()
        .position(|a| a == "--sync")
        .and_then(|i| args.get(i + 1))
        .map_or("always", String::as_str);
    let bench_dir = std::env::var_os("CURSORLOG_BENCH_DIR");
    let temp = match &bench_dir {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let server = Server::start_in(temp.path(), &["--sync", sync]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "bench", None, None).await;
    let payload = vec![b'x'; 256];

    let mut appends = Vec::with_capacity(requests);
    for _ in 0..requests {
        let started = Instant::now();
        c.append(pb::AppendRequest {
            session: "bench".into(),
            stream,
            expected_next_seq: None,
            events: vec![event("progress", &payload)],
        })
        .await
        .unwrap();
        appends.push(started.elapsed());
    }
    let mut resolves = Vec::with_capacity(requests);
    for i in 0..requests {
        let cursor = format!("{epoch}-{stream}-{}", i + 1);
        let started = Instant::now();
        let r = c
            .resolve(pb::ResolveRequest {
                session: "bench".into(),
                last_event_id: cursor,
                declared_stream: Some(stream),
            })
            .await
            .unwrap()
            .into_inner();
        resolves.push(started.elapsed());
        assert_eq!(r.verdict(), pb::Verdict::Resumable);
    }
    println!(
        "sync={sync}, 256-byte payload, one request in flight, data dir {}",
        temp.path().display()
    );
    report("append", appends);
    report("resolve", resolves);
}
