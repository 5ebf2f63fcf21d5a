//! Restart time: how long `Engine::open` takes on a populated data directory.
//!
//! * `recovery/reopen/<size>`: the index is current (a clean restart, or a crash whose index
//!   was flushed): open reads segment headers, scans the tail segment and replays nothing.
//! * `recovery/rebuild/<size>`: the index directory is gone (the worst crash case): open
//!   replays every record of the log into a new index.
//!
//! A SIGKILL lies between the two: sled's files are at most about a second behind, and only
//! that tail is replayed (the kill test in `tests/tests/kill.rs` measures restarts end to end).
//! The default log is 100 MiB; `CURSORLOG_BENCH_LARGE=1` adds 1 GiB.

#![allow(clippy::unwrap_used, reason = "benchmark setup")]

use std::path::Path;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use cursorlog_benches::{criterion_config, fill, open_stream, temp_dir};
use cursorlog_engine::{Config, Engine, SyncPolicy};

const MIB: u64 = 1024 * 1024;

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.sync = SyncPolicy::Never;
    c
}

/// Fills a log of about `bytes` over 64 streams in batches of 256, then closes it.
fn populate(dir: &Path, bytes: u64) {
    let engine = Engine::open(config(dir)).unwrap();
    let streams: Vec<u64> = (0..64)
        .map(|i| open_stream(&engine, &format!("s{i}")))
        .collect();
    let mut i = 0;
    while engine.stats().unwrap().log_bytes < bytes {
        let s = streams[i % streams.len()];
        fill(&engine, &format!("s{}", i % streams.len()), s, 4096, 256);
        i += 1;
    }
    engine.close().unwrap();
}

fn bench_size(c: &mut Criterion, label: &str, bytes: u64) {
    let dir = temp_dir();
    populate(dir.path(), bytes);
    let mut group = c.benchmark_group("recovery");
    group.bench_function(format!("reopen/{label}"), |b| {
        b.iter(|| {
            let e = Engine::open(config(dir.path())).unwrap();
            e.close().unwrap();
        });
    });
    group.bench_function(format!("rebuild/{label}"), |b| {
        b.iter_batched(
            || std::fs::remove_dir_all(dir.path().join("index")).unwrap(),
            |()| {
                let e = Engine::open(config(dir.path())).unwrap();
                assert!(e.recovery_report().index_rebuilt);
                e.close().unwrap();
            },
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

fn recovery(c: &mut Criterion) {
    bench_size(c, "100MiB", 100 * MIB);
    if std::env::var_os("CURSORLOG_BENCH_LARGE").is_some() {
        bench_size(c, "1GiB", 1024 * MIB);
    }
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = recovery
}
criterion_main!(benches);
