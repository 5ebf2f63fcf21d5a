//! Append throughput: durable (`SyncPolicy::Always`) and `Never`, batches of 1, 16 and 256
//! events of 512 bytes, from 1 and from 64 concurrent appenders each on its own stream.
//!
//! One iteration is one `Engine::append` call, so criterion's throughput is in events/s.
//! The `disk_ceiling` group measures what the disk itself allows: raw 512-byte `write`s to a
//! growing file with one `sync_data` per `appenders × batch` writes (1, 16, 256, 64, 1024,
//! 16384), which is the most a perfect group commit could put behind one `fdatasync`. Each
//! ceiling runs right before its durable configuration, because a shared disk's `fdatasync`
//! latency drifts by an order of magnitude within minutes; durable throughput divided by the
//! adjacent ceiling says how close group commit gets to the disk.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cursorlog_benches::{
    append_request, criterion_config, payload, print_write_stats, temp_dir, Fixture,
};
use cursorlog_engine::{Engine, SyncPolicy};

/// The engine's default segment size, so rotation costs are amortized as in production.
const SEGMENT_BYTES_MAX: u64 = 64 * 1024 * 1024;
const APPENDERS: [usize; 2] = [1, 64];
const BATCH_EVENTS: [usize; 3] = [1, 16, 256];

/// Runs `iters` append calls of `batch` events spread evenly over the appenders (one thread
/// per stream) and returns the wall time from the common start until the last one returned.
fn run_appenders(
    engine: &Engine,
    streams: &[(String, u64)],
    batch: usize,
    body: &[u8],
    iters: u64,
) -> Duration {
    if let [(session, stream)] = streams {
        let start = Instant::now();
        for _ in 0..iters {
            engine
                .append(append_request(session, *stream, batch, body))
                .expect("append");
        }
        return start.elapsed();
    }
    let barrier = Barrier::new(streams.len() + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(i, (session, stream))| {
                let calls = share_of(iters, i, streams.len());
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    for _ in 0..calls {
                        engine
                            .append(append_request(session, *stream, batch, body))
                            .expect("append");
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for h in handles {
            h.join().expect("appender thread panicked");
        }
        start.elapsed()
    })
}

/// Appender `i`'s share of `iters` calls spread evenly over `appenders` (the first
/// `iters % appenders` take one more).
fn share_of(iters: u64, i: usize, appenders: usize) -> u64 {
    let n = appenders as u64;
    iters / n + u64::from((i as u64) < iters % n)
}

/// One stream in its own session per appender.
fn own_streams(fixture: &Fixture, appenders: usize) -> Vec<(String, u64)> {
    (0..appenders)
        .map(|i| {
            let session = format!("bench-session-{i}");
            let stream = fixture.stream(&session);
            (session, stream)
        })
        .collect()
}

/// [`run_appenders`] with the appenders as tasks on a multi-threaded tokio runtime calling
/// [`Engine::append_async`], as the gRPC server's handlers do: a waiting appender is a parked
/// task, not a blocked thread, so a group commit's answers wake a runtime worker or two
/// rather than 64 threads.
fn run_appender_tasks(
    runtime: &tokio::runtime::Runtime,
    engine: &Engine,
    streams: &[(String, u64)],
    batch: usize,
    body: &[u8],
    iters: u64,
) -> Duration {
    runtime.block_on(async {
        let start = Instant::now();
        let handles: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(i, (session, stream))| {
                let calls = share_of(iters, i, streams.len());
                let engine = engine.clone();
                let session = session.clone();
                let stream = *stream;
                let body = body.to_vec();
                tokio::spawn(async move {
                    for _ in 0..calls {
                        engine
                            .append_async(append_request(&session, stream, batch, &body))
                            .await
                            .expect("append");
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("appender task panicked");
        }
        start.elapsed()
    })
}

/// 64 appenders as tokio tasks, one event per append (see [`run_appender_tasks`]).
fn bench_tasks(c: &mut Criterion, policy: SyncPolicy) {
    const TASKS: usize = 64;
    let body = payload();
    if policy == SyncPolicy::Always {
        disk_ceiling(c, TASKS);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the appenders' tokio runtime");
    let mut group = c.benchmark_group(format!("append/{policy}"));
    let fixture = Fixture::open(policy, SEGMENT_BYTES_MAX);
    let streams = own_streams(&fixture, TASKS);
    let before = fixture.engine.stats().expect("reading engine stats");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new(format!("tasks_{TASKS}"), "batch_1"), |b| {
        b.iter_custom(|iters| {
            run_appender_tasks(&runtime, &fixture.engine, &streams, 1, &body, iters)
        });
    });
    let label = format!("append/{policy}/tasks_{TASKS}/batch_1");
    print_write_stats(&label, &fixture.engine, &before);
    group.finish();
}

fn bench_policy(c: &mut Criterion, policy: SyncPolicy) {
    let body = payload();
    for appenders in APPENDERS {
        for batch in BATCH_EVENTS {
            if policy == SyncPolicy::Always {
                disk_ceiling(c, appenders * batch);
            }
            let mut group = c.benchmark_group(format!("append/{policy}"));
            let fixture = Fixture::open(policy, SEGMENT_BYTES_MAX);
            let streams = own_streams(&fixture, appenders);
            let id = BenchmarkId::new(format!("appenders_{appenders}"), format!("batch_{batch}"));
            let before = fixture.engine.stats().expect("reading engine stats");
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    run_appenders(&fixture.engine, &streams, batch, &body, iters)
                });
            });
            let label = format!("append/{policy}/appenders_{appenders}/batch_{batch}");
            print_write_stats(&label, &fixture.engine, &before);
            group.finish();
        }
    }
}

fn append_always(c: &mut Criterion) {
    bench_policy(c, SyncPolicy::Always);
    bench_tasks(c, SyncPolicy::Always);
}

fn append_never(c: &mut Criterion) {
    bench_policy(c, SyncPolicy::Never);
    bench_tasks(c, SyncPolicy::Never);
}

/// An append-only file that starts over in a new file at the engine's segment size, so the
/// disk sees what a segment sees: 512-byte appends that extend the file.
struct RawLog {
    dir: tempfile::TempDir,
    file: File,
    len: u64,
    files: u64,
}

impl RawLog {
    fn new() -> Self {
        let dir = temp_dir();
        let file = Self::create(dir.path(), 0);
        Self {
            dir,
            file,
            len: 0,
            files: 0,
        }
    }

    fn create(dir: &Path, n: u64) -> File {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(format!("raw-{n:06}.log")))
            .expect("creating the raw log file")
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.len >= SEGMENT_BYTES_MAX {
            let old = self.dir.path().join(format!("raw-{:06}.log", self.files));
            self.files += 1;
            self.file = Self::create(self.dir.path(), self.files);
            std::fs::remove_file(old).expect("removing a full raw log file");
            self.len = 0;
        }
        self.file.write_all(bytes).expect("raw write");
        self.len += bytes.len() as u64;
    }

    fn sync(&self) {
        self.file.sync_data().expect("raw sync_data");
    }
}

/// The disk's ceiling for `writes` appends of 512 bytes per `sync_data`, in events/s.
fn disk_ceiling(c: &mut Criterion, writes: usize) {
    let mut group = c.benchmark_group("disk_ceiling");
    let body = payload();
    let mut log = RawLog::new();
    group.throughput(Throughput::Elements(writes as u64));
    group.bench_function(BenchmarkId::new("writes_per_sync", writes), |b| {
        b.iter(|| {
            for _ in 0..writes {
                log.append(&body);
            }
            log.sync();
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = append_always, append_never
}
criterion_main!(benches);
