//! Memory while the log grows: appends `--events` (default 10 M) 512-byte events in batches
//! of 256 over 64 streams to an in-process engine and prints the process's resident set size
//! every million events. The engine keeps per-event state only in the log and in sled (whose
//! page cache is bounded), so RSS should stay flat as the log grows.
//!
//! `cargo run --release -p cursorlog-benches --bin rss-growth -- [--events N] [--sync never|always]`

use std::time::Instant;

use cursorlog_benches::{fill, open_stream, temp_dir};
use cursorlog_engine::{Config, Engine, SyncPolicy};

/// Resident set size of this process in MiB, from `/proc/self/status`.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

fn main() {
    let mut events: u64 = 10_000_000;
    let mut sync = SyncPolicy::Never;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--events" => {
                events = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--events N")
            }
            "--sync" => {
                sync = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--sync POLICY")
            }
            other => panic!("unknown argument {other:?}: expected --events N or --sync POLICY"),
        }
    }
    let dir = temp_dir();
    let mut config = Config::new(dir.path());
    config.sync = sync;
    let engine = Engine::open(config).expect("opening the engine");
    let streams: Vec<u64> = (0..64)
        .map(|i| open_stream(&engine, &format!("s{i}")))
        .collect();
    println!("events      log MiB    RSS MiB   elapsed s");
    let started = Instant::now();
    let (mut written, mut next_report, mut i) = (0u64, 1_000_000u64, 0usize);
    while written < events {
        let n = 4096.min(events - written);
        let k = i % streams.len();
        fill(
            &engine,
            &format!("s{k}"),
            streams[k],
            usize::try_from(n).expect("batch fits"),
            256,
        );
        written += n;
        i += 1;
        if written >= next_report {
            let log = engine.stats().expect("stats").log_bytes as f64 / (1024.0 * 1024.0);
            println!(
                "{written:>9} {log:>10.0} {:>10.1} {:>11.1}",
                rss_mib(),
                started.elapsed().as_secs_f64()
            );
            next_report += 1_000_000;
        }
    }
    engine.close().expect("closing the engine");
}
