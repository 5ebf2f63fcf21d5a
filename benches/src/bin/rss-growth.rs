//! Memory while the log grows: appends `--events` (default 10 M) 512-byte events in batches
//! of 256 over 64 streams to an in-process engine and prints the process's resident set size
//! every million events. The engine keeps per-event state only in the log and in sled (whose
//! page cache is bounded), so RSS should stay flat as the log grows.
//!
//! Besides the total it splits the resident set (from `/proc/self/status` and
//! `/proc/self/smaps`) into anonymous memory (`RssAnon`), file-backed memory (`RssFile`: sled's
//! mapped files; segments are not mapped) and the main heap (`[heap]`, brk; other
//! threads' glibc malloc arenas are anonymous mappings), and at the end lists the mappings
//! with the most resident memory, so a step in RSS can be attributed.
//!
//! `cargo run --release -p cursorlog-benches --bin rss-growth -- [--events N] [--sync never|always]`
//! (`MALLOC_ARENA_MAX=N` in the environment caps glibc's arenas, for comparison;
//! `--retention-check-ms MS` sets how often the background retention pass runs, default the
//! engine's 10 s.)

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

/// The resident set split by kind, in MiB.
#[derive(Debug, Default)]
struct RssSplit {
    anon: f64,
    file: f64,
    heap: f64,
}

/// `RssAnon`/`RssFile` from `/proc/self/status`; the resident part of `[heap]` from
/// `/proc/self/smaps`.
fn rss_split() -> RssSplit {
    let kib = |v: &str| {
        v.trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<f64>()
            .unwrap_or(0.0)
            / 1024.0
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut split = RssSplit::default();
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("RssAnon:") {
            split.anon = kib(v);
        } else if let Some(v) = line.strip_prefix("RssFile:") {
            split.file = kib(v);
        }
    }
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut in_heap = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range perms offset dev inode [name].
            in_heap = fields.nth(4) == Some("[heap]");
        } else if first == "Rss:" && in_heap {
            split.heap += kib(fields.next().unwrap_or("0"));
        }
    }
    split
}

/// The `n` mappings with the most resident memory: (resident MiB, mapped MiB, name).
fn largest_mappings(n: usize) -> Vec<(f64, f64, String)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut out: Vec<(f64, f64, String)> = Vec::new();
    let mut current: Option<(f64, String)> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            let size = first
                .split_once('-')
                .and_then(|(a, b)| {
                    Some(u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?)
                })
                .unwrap_or(0) as f64
                / (1024.0 * 1024.0);
            let name = fields.nth(4).unwrap_or("[anonymous]").to_owned();
            current = Some((size, name));
        } else if first == "Rss:" {
            if let Some((size, name)) = current.take() {
                let kib: f64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
                out.push((kib / 1024.0, size, name));
            }
        }
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0));
    out.truncate(n);
    out
}

fn main() {
    let mut events: u64 = 10_000_000;
    let mut sync = SyncPolicy::Never;
    let mut retention_check_ms: Option<u64> = None;
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
            "--retention-check-ms" => {
                retention_check_ms = Some(
                    args.next()
                        .and_then(|v| v.parse().ok())
                        .expect("--retention-check-ms MS"),
                );
            }
            other => panic!(
                "unknown argument {other:?}: expected --events N, --sync POLICY or \
                 --retention-check-ms MS"
            ),
        }
    }
    let dir = temp_dir();
    let mut config = Config::new(dir.path());
    config.sync = sync;
    if let Some(ms) = retention_check_ms {
        config.retention.check_interval = std::time::Duration::from_millis(ms.max(1));
    }
    let engine = Engine::open(config).expect("opening the engine");
    let streams: Vec<u64> = (0..64)
        .map(|i| open_stream(&engine, &format!("s{i}")))
        .collect();
    println!("events      log MiB    RSS MiB   elapsed s |  anon MiB  file MiB  [heap] MiB");
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
            let split = rss_split();
            println!(
                "{written:>9} {log:>10.0} {:>10.1} {:>11.1} | {:>9.1} {:>9.1} {:>11.1}",
                rss_mib(),
                started.elapsed().as_secs_f64(),
                split.anon,
                split.file,
                split.heap,
            );
            next_report += 1_000_000;
        }
    }
    println!("largest resident mappings at the end (MiB resident / MiB mapped, name):");
    for (rss, size, name) in largest_mappings(8) {
        println!("  {rss:>8.1} / {size:>8.1}  {name}");
    }
    engine.close().expect("closing the engine");
}
