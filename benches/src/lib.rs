//! Shared helpers for the cursorlog criterion benchmarks (`benches/benches/*.rs`).
//!
//! Every benchmark opens its engine in a fresh temporary directory under [`bench_root`]:
//! `$CURSORLOG_BENCH_DIR` when set, else `target/bench-data` inside the repository, so that
//! durable numbers are measured on the repository's disk. A tmpfs directory says nothing
//! about `fdatasync`, so [`bench_root`] warns on stderr when the chosen directory is on one.

/// The allocator the `cursorlog` server runs with, so in-process figures compare with it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::Criterion;
use cursorlog_engine::{Append, Config, Engine, NewEvent, OpenStream, Stats, SyncPolicy};
use tempfile::TempDir;

/// Environment variable naming the directory benchmarks put their data in.
pub const BENCH_DIR_ENV: &str = "CURSORLOG_BENCH_DIR";

/// Payload size of every benchmark event, in bytes.
pub const PAYLOAD_BYTES: usize = 512;

/// Event kind of every benchmark event.
pub const EVENT_KIND: &str = "progress";

/// The directory benchmark data goes under (created if missing).
///
/// # Panics
/// If the directory cannot be created.
pub fn bench_root() -> PathBuf {
    let root = std::env::var_os(BENCH_DIR_ENV).map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&root).expect("creating the benchmark data directory");
    let root = root
        .canonicalize()
        .expect("canonicalizing the benchmark data directory");
    if let Some(fs) = fs_type(&root) {
        if fs == "tmpfs" || fs == "ramfs" {
            eprintln!(
                "warning: benchmark data in {} is on {fs}: durable (fsync) numbers are \
                 meaningless; set {BENCH_DIR_ENV} to a directory on a real disk",
                root.display()
            );
        }
    }
    root
}

/// The file system type of the mount holding `path` (Linux `/proc/self/mounts`), if known.
pub fn fs_type(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _device = fields.next()?;
            let mount_point = fields.next()?;
            let fs = fields.next()?;
            path.starts_with(mount_point)
                .then(|| (mount_point.len(), fs.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, fs)| fs)
}

/// A fresh temporary directory under [`bench_root`], removed when dropped.
///
/// # Panics
/// If the directory cannot be created.
pub fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("cursorlog-bench-")
        .tempdir_in(bench_root())
        .expect("creating a temporary benchmark directory")
}

/// An engine in its own temporary directory. Fields drop in order: the engine closes before
/// its directory is removed.
#[derive(Debug)]
pub struct Fixture {
    /// The open engine.
    pub engine: Engine,
    /// Its data directory.
    pub dir: TempDir,
}

impl Fixture {
    /// Opens an engine with `sync` and `segment_bytes_max` (other settings are defaults) in a
    /// fresh directory under [`bench_root`].
    ///
    /// # Panics
    /// If the engine cannot be opened.
    pub fn open(sync: SyncPolicy, segment_bytes_max: u64) -> Self {
        let dir = temp_dir();
        let mut config = Config::new(dir.path());
        config.sync = sync;
        config.segment_bytes_max = segment_bytes_max;
        let engine = Engine::open(config).expect("opening the benchmark engine");
        Self { engine, dir }
    }

    /// Opens `session` and one stream in it; returns the stream id.
    ///
    /// # Panics
    /// If the engine refuses.
    pub fn stream(&self, session: &str) -> u64 {
        open_stream(&self.engine, session)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Err(e) = self.engine.close() {
            eprintln!("warning: closing the benchmark engine failed: {e}");
        }
    }
}

/// Opens (or reuses) `session` and opens a new stream in it; returns the stream id.
///
/// # Panics
/// If the engine refuses.
pub fn open_stream(engine: &Engine, session: &str) -> u64 {
    let info = engine.open_session(session).expect("opening a session");
    engine
        .open_stream(OpenStream {
            session: session.to_owned(),
            epoch: info.epoch,
            correlation: None,
            lease_ms: None,
        })
        .expect("opening a stream")
        .stream
}

/// The payload every benchmark event carries: [`PAYLOAD_BYTES`] bytes.
pub fn payload() -> Vec<u8> {
    (0..PAYLOAD_BYTES)
        .map(|i| u8::try_from(i % 251).unwrap_or(0))
        .collect()
}

/// An append request of `batch_events` events carrying `body` to `stream`, without an
/// expected seq (always appended).
pub fn append_request(session: &str, stream: u64, batch_events: usize, body: &[u8]) -> Append {
    Append {
        session: session.to_owned(),
        stream,
        expected_next_seq: None,
        events: (0..batch_events)
            .map(|_| NewEvent::new(EVENT_KIND, body.to_vec()))
            .collect(),
    }
}

/// Appends `events` events to `stream` in batches of at most `batch_events`.
///
/// # Panics
/// If an append fails.
pub fn fill(engine: &Engine, session: &str, stream: u64, events: usize, batch_events: usize) {
    let body = payload();
    let mut left = events;
    while left > 0 {
        let n = left.min(batch_events);
        engine
            .append(append_request(session, stream, n, &body))
            .expect("appending fill events");
        left -= n;
    }
}

/// Criterion settings for the suite: short enough that the whole suite runs in a few minutes
/// on two cores. Criterion's command-line flags (e.g. `--measurement-time 10`) override them.
pub fn criterion_config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// Prints the engine's write counters since `before` (warm-up included) on stderr, so a run
/// shows how well group commit batched: events per group commit and per `fdatasync`.
///
/// # Panics
/// If the engine cannot report its stats.
pub fn print_write_stats(label: &str, engine: &Engine, before: &Stats) {
    let s = engine.stats().expect("reading engine stats");
    let events = s.events_appended - before.events_appended;
    let commits = s.commit_batches - before.commit_batches;
    let fsyncs = s.fsyncs - before.fsyncs;
    if events == 0 {
        // The bench was filtered out on the command line.
        return;
    }
    let per = |n: u64| {
        if n == 0 {
            f64::NAN
        } else {
            events as f64 / n as f64
        }
    };
    eprintln!(
        "{label}: {events} events, {commits} group commits, {fsyncs} fdatasyncs: \
         {:.1} events/commit, {:.1} events/fdatasync",
        per(commits),
        per(fsyncs),
    );
}
