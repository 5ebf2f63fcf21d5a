//! The `Engine` handle, the one facade: opens the directory, runs the writer and the
//! background threads, and answers every request (writes in `engine/write.rs`, reads and
//! verdicts in `engine/query.rs`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use crate::api::Stats;
use crate::background::{
    arm_live_state, check_disk, expire_idle_sessions, expire_leases, run_retention,
    spawn_index_flusher, spawn_maintenance,
};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::format::{BODY_BYTES_MAX, PAYLOAD_BYTES_LIMIT, SEGMENT_BYTES_MIN};
use crate::fs::{FileSystem, StdFs};
use crate::mailbox::{send, wait, Command, Mailbox, Reply};
use crate::recovery::{recover, RecoveryReport};
use crate::shared::Shared;
use crate::state::{SessionMeta, StreamMeta};
use crate::writer::Writer;

mod fence;
mod query;
mod replica;
mod tasks;

pub use crate::member::Progress;
pub use replica::Applied;
pub use tasks::{TASK_PAGE_DEFAULT, TASK_PAGE_MAX};
mod write;
mod write_async;

/// A handle to an open data directory. Cheap to clone; every clone talks to one writer.
///
/// # Invariants
/// Exactly one writer thread appends to the log; reads never take its lock. A write or
/// fsync failure poisons the engine: every later write fails with [`Error::Poisoned`].
#[derive(Debug, Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

/// A handle that does not keep the engine open: for a watcher that must not outlive the
/// node it watches (the engine's directory lock goes with its last [`Engine`]).
#[derive(Debug, Clone)]
pub struct WeakEngine(std::sync::Weak<Inner>);

impl WeakEngine {
    /// The engine, while some [`Engine`] handle still holds it.
    pub fn upgrade(&self) -> Option<Engine> {
        self.0.upgrade().map(|inner| Engine { inner })
    }
}

impl Engine {
    /// A [`WeakEngine`] of this engine.
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.inner))
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) shared: Arc<Shared>,
    /// The writer's mailbox; `None` once closed. Callers hold the read lock only while they
    /// queue a request (never while they wait for its answer).
    tx: RwLock<Option<Mailbox>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    background: Mutex<Vec<JoinHandle<()>>>,
    shutdown: Arc<AtomicBool>,
    report: RecoveryReport,
    _lock: std::fs::File,
    /// Set for a replicated node's engine (`replica.rs`): what it applies from.
    pub(crate) replica: Option<Arc<crate::member::Replica>>,
}

impl Inner {
    /// An engine's parts, put together (the single-node open and the replica's).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble(
        shared: Arc<Shared>,
        tx: Mailbox,
        writer: JoinHandle<()>,
        background: Vec<JoinHandle<()>>,
        shutdown: Arc<AtomicBool>,
        report: RecoveryReport,
        lock: std::fs::File,
        replica: Option<Arc<crate::member::Replica>>,
    ) -> Self {
        Self {
            shared,
            tx: RwLock::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            background: Mutex::new(background),
            shutdown,
            report,
            _lock: lock,
            replica,
        }
    }

    /// Stops the background threads, wakes every follower (they end with `Closed`), then
    /// stops the writer (which drains its queue, syncs, and writes the clean-close mark), and
    /// joins them all. Idempotent.
    fn stop_threads(&self) {
        self.shutdown.store(true, Ordering::Release);
        self.shared.followers.close();
        let me = std::thread::current().id();
        let background: Vec<_> = self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        for t in background {
            t.thread().unpark();
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        self.tx
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(w) = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = w.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_threads();
        // The directory lock is a `flock`, owned by the open file description: a child
        // process forked elsewhere in this process (and not yet exec'd) holds a copy of the
        // descriptor, and would keep the lock past this drop. Release it explicitly, so a
        // reopen right after a close is never refused as `Locked`.
        let _ = self._lock.unlock();
    }
}

pub(crate) fn validate_config(c: &Config) -> Result<()> {
    if c.segment_bytes_max < SEGMENT_BYTES_MIN {
        return Err(Error::invalid(
            "segment_bytes_max",
            format!("must be at least {SEGMENT_BYTES_MIN} bytes"),
        ));
    }
    if c.payload_bytes_max == 0 || c.payload_bytes_max > PAYLOAD_BYTES_LIMIT {
        return Err(Error::invalid(
            "payload_bytes_max",
            format!("must be 1..={PAYLOAD_BYTES_LIMIT} bytes"),
        ));
    }
    if c.batch_events_max == 0
        || c.read_events_max == 0
        || c.id_bytes_max == 0
        || c.open_streams_per_session_max == 0
    {
        return Err(Error::invalid(
            "limits",
            "batch, read, id and open-stream limits must be at least 1",
        ));
    }
    if c.session_idle_ttl.is_some_and(|t| t.is_zero()) {
        return Err(Error::invalid(
            "session_idle_ttl",
            "must be at least 1 ms when given (None keeps idle sessions)",
        ));
    }
    validate_task_limits(c)
}

/// A task's whole state must fit one snapshot record: its context, message, ids, every
/// input it ever held, its outcome and both its queues under [`BODY_BYTES_MAX`].
fn validate_task_limits(c: &Config) -> Result<()> {
    let t = &c.tasks;
    if t.ttl_max.is_zero() || t.ttl_default.is_zero() || t.ttl_default > t.ttl_max {
        return Err(Error::invalid(
            "tasks.ttl_default",
            "must be at least 1 ms and at most tasks.ttl_max",
        ));
    }
    if t.per_owner_max == 0 || t.tasks_max == 0 || t.queue_len_max == 0 {
        return Err(Error::invalid(
            "tasks.per_owner_max",
            "task caps and the queue length must be at least 1",
        ));
    }
    // Each queued message carries up to three ids and its fields beside its bytes; the last
    // dequeued batch is kept too (a queue's worth at most).
    let per_message = 3 * u64::from(c.id_bytes_max) + 64;
    let queue = 2 * u64::from(t.queue_bytes_max) + 2 * u64::from(t.queue_len_max) * per_message;
    let whole = u64::from(t.context_bytes_max)
        + u64::from(t.status_message_bytes_max)
        + u64::from(t.input_bytes_max)
        + u64::from(t.outcome_bytes_max)
        + 2 * queue
        + 3 * u64::from(c.id_bytes_max)
        + 1024;
    if whole > u64::from(BODY_BYTES_MAX) {
        return Err(Error::invalid(
            "tasks.input_bytes_max",
            format!(
                "a task's context, message, inputs, outcome and queues (with their last \
                 batches) add up to {whole} bytes, above one record's {BODY_BYTES_MAX}: lower \
                 one of them"
            ),
        ));
    }
    Ok(())
}

impl Engine {
    /// Opens (creating) the data directory, recovers it and starts the writer.
    ///
    /// # Errors
    /// [`Error::Locked`] if another process has it open; [`Error::Corruption`] naming the
    /// file and offset if a sealed segment is damaged; I/O and index failures.
    pub fn open(config: Config) -> Result<Self> {
        Self::open_with_fs(config, Arc::new(StdFs))
    }

    /// [`Engine::open`] with segment I/O through `fs` (a fault-injecting twin in tests).
    ///
    /// # Errors
    /// As [`Engine::open`].
    pub fn open_with_fs(config: Config, fs: Arc<dyn FileSystem>) -> Result<Self> {
        validate_config(&config)?;
        let rec = recover(&fs, &config)?;
        let last_lsn = rec.report.last_lsn;
        let shared = Arc::new(Shared::new(config, rec.index, rec.log));
        shared.counters.last_lsn.store(last_lsn, Ordering::Release);
        shared
            .counters
            .disk_free_bytes
            .store(u64::MAX, Ordering::Release);
        check_disk(&shared);
        arm_live_state(&shared)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = Writer::new(
            Arc::clone(&shared),
            crate::writer::Sink::Segments(rec.writer),
        );
        let writer = std::thread::Builder::new()
            .name("cursorlog-writer".into())
            .spawn(move || writer.run(&rx))
            .map_err(Error::io("starting the writer thread"))?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let mut report = rec.report;
        if let Some(lost) = &rec.lost {
            let fenced = fence::fence_lost(&shared, &tx, lost)?;
            report.streams_fenced += fenced.streams;
            report.sessions_fenced = fenced.sessions;
            report.tasks_fenced = fenced.tasks;
        }
        if rec.previous.is_some_and(|p| p.may_have_lost_acknowledged()) {
            report.streams_fenced += fence::fence_open_streams(&shared, &tx)?;
            report.tasks_fenced += fence::fence_running_tasks(&shared, &tx)?;
        }
        tracing::info!(dir = %shared.config.dir.display(), report = %report, "recovered data directory");
        let background = vec![
            spawn_maintenance(Arc::clone(&shared), tx.clone(), Arc::clone(&shutdown), None)?,
            spawn_index_flusher(Arc::clone(&shared), Arc::clone(&shutdown))?,
        ];
        Ok(Self {
            inner: Arc::new(Inner::assemble(
                shared, tx, writer, background, shutdown, report, rec.lock, None,
            )),
        })
    }

    pub(crate) fn sender(&self) -> Result<Mailbox> {
        self.inner
            .tx
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Error::Closed)
    }

    fn submit(&self, cmd: Command) -> Result<Reply> {
        // Queue under the read lock (no clone of the mailbox per call), wait without it.
        let reply = {
            let tx = self.inner.tx.read().unwrap_or_else(PoisonError::into_inner);
            send(tx.as_ref().ok_or(Error::Closed)?, &self.inner.shared, cmd)?
        };
        wait(&reply)
    }

    /// Renews the session's idle TTL (every call naming a live session does).
    fn touch(&self, session: &str) {
        let shared = &self.inner.shared;
        shared.activity.touch(session, shared.now_ms());
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &Config {
        &self.inner.shared.config
    }

    /// What recovery did when this engine opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.report
    }

    /// Runs one retention pass now (it also runs every `retention.check_interval`): forgets
    /// what is past the metadata horizon, raises watermarks, retires dead segments. Returns
    /// the number of segments retired. On a cluster member, the leader decides and proposes
    /// the evictions and carry-forwards, and each member retires its dead segments once a
    /// snapshot covers them (`member.rs`).
    ///
    /// # Errors
    /// Write or index failures.
    pub fn run_retention(&self) -> Result<usize> {
        let tx = self.sender()?;
        match &self.inner.replica {
            None => run_retention(&self.inner.shared, &tx),
            Some(replica) => {
                let leads = replica.proposer.as_ref().is_some_and(|p| p.leads());
                crate::background::run_member_retention(&self.inner.shared, &tx, replica, leads)
            }
        }
    }

    /// Whether free disk space is below `disk_reserve_bytes` (appends are refused until
    /// retention or an operator frees space). A cluster member then snapshots and purges its
    /// log at once, so retention may delete segments without waiting for the next snapshot.
    pub fn low_on_disk(&self) -> bool {
        self.inner.shared.low_disk.load(Ordering::Acquire)
    }

    /// Runs one round of the time-driven work now, as the background thread does on its
    /// own: checks free space, aborts streams whose producer lease ran out, expires idle
    /// sessions. For tests with a [`crate::ManualClock`] (and operators' tools): it returns
    /// (leases expired, sessions expired).
    ///
    /// # Errors
    /// [`Error::Closed`].
    pub fn run_maintenance(&self) -> Result<(usize, usize)> {
        let tx = self.sender()?;
        let shared = &self.inner.shared;
        check_disk(shared);
        Ok((
            expire_leases(shared, &tx),
            expire_idle_sessions(shared, &tx),
        ))
    }

    /// Counters and sizes. O(1): nothing is scanned.
    ///
    /// # Errors
    /// None in practice; kept fallible for future index-backed counts.
    pub fn stats(&self) -> Result<Stats> {
        let s = &self.inner.shared;
        let c = &s.counters;
        let counts = s.index.counts();
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        let free = c.disk_free_bytes.load(Ordering::Acquire);
        Ok(Stats {
            sessions: n(counts.sessions),
            streams: n(counts.streams),
            segments: s.log.count() as u64,
            log_bytes: s.log.total_bytes(),
            last_lsn: c.last_lsn.load(Ordering::Acquire),
            events_appended: c.events_appended.load(Ordering::Relaxed),
            payload_bytes_appended: c.payload_bytes_appended.load(Ordering::Relaxed),
            fsyncs: c.fsyncs.load(Ordering::Relaxed),
            commit_batches: c.commit_batches.load(Ordering::Relaxed),
            records_written: c.records_written.load(Ordering::Relaxed),
            segments_deleted: c.segments_deleted.load(Ordering::Relaxed),
            recovery_micros: u64::try_from(self.inner.report.elapsed.as_micros())
                .unwrap_or(u64::MAX),
            recovery_lost_records: self.inner.report.lost_records,
            recovery_streams_fenced: self.inner.report.streams_fenced,
            recovery_sessions_fenced: self.inner.report.sessions_fenced,
            index_flush_failures: c.index_flush_failures.load(Ordering::Relaxed),
            live_sessions: n(counts.live_sessions),
            open_streams: n(counts.open_streams),
            poisoned: self.is_poisoned(),
            disk_free_bytes: (free != u64::MAX).then_some(free),
            appends_refused_low_disk: c.appends_refused_low_disk.load(Ordering::Relaxed),
            sessions_expired_idle: c.sessions_expired_idle.load(Ordering::Relaxed),
            segment_descriptors: s.log.descriptors() as u64,
            followed_streams: s.followers.followed() as u64,
            writer_queue_bytes: s.admission.queued(),
            live_sessions_max: s.config.live_sessions_max,
            sessions_refused_at_capacity: c.sessions_refused_at_capacity.load(Ordering::Relaxed),
            leased_streams: s.leases.len() as u64,
            leased_streams_max: s.config.leased_streams_max,
            leases_refused_at_capacity: c.leases_refused_at_capacity.load(Ordering::Relaxed),
        })
    }

    /// Every remembered session (for `cursorlog inspect`).
    ///
    /// # Errors
    /// Index failures.
    pub fn sessions(&self) -> Result<Vec<SessionMeta>> {
        Ok(self
            .inner
            .shared
            .index
            .sessions()?
            .into_iter()
            .map(|s| s.meta)
            .collect())
    }

    /// Every remembered stream (for `cursorlog inspect`).
    ///
    /// # Errors
    /// Index failures.
    pub fn streams(&self) -> Result<Vec<StreamMeta>> {
        Ok(self
            .inner
            .shared
            .index
            .streams()?
            .into_iter()
            .map(|s| s.meta)
            .collect())
    }

    /// Segment files: path, base LSN, bytes.
    pub fn segments(&self) -> Vec<(PathBuf, u64, u64)> {
        self.inner
            .shared
            .log
            .all()
            .iter()
            .map(|s| (s.path().to_path_buf(), s.base_lsn(), s.len()))
            .collect()
    }

    /// Syncs the log and the index now, whatever the sync policy.
    ///
    /// # Errors
    /// Write failures (which poison the engine).
    pub fn sync(&self) -> Result<()> {
        self.submit(Command::Sync)?;
        self.inner.shared.index.flush()
    }

    /// Drains the writer, syncs, writes the clean-close mark, and stops; later calls on any
    /// clone fail with `Closed`, and every follower ends with `Closed`.
    ///
    /// # Errors
    /// The final sync failed, or the engine was poisoned ([`Error::Poisoned`]): writes were
    /// refused, and the next open must recover the directory. A supervisor should treat
    /// that as a failure (the server exits non-zero).
    pub fn close(&self) -> Result<()> {
        let result = if self.is_poisoned() {
            Err(Error::Poisoned)
        } else {
            self.sync().map(|_| ())
        };
        self.inner.stop_threads();
        match result {
            Ok(()) if self.is_poisoned() => Err(Error::Poisoned),
            other => other,
        }
    }

    /// Stops the engine as a killed process would, for crash tests: no clean-close mark, no
    /// final sync, no index flush (what was written stays in the file system's cache, as it
    /// would in the page cache). Later calls fail with `Closed`.
    #[cfg(feature = "testing")]
    pub fn simulate_crash(&self) {
        self.inner.shared.crashed.store(true, Ordering::Release);
        self.inner.stop_threads();
    }

    /// Makes the next `n` index flushes fail as a failing store would, for tests of what a
    /// failed flush does (0 ends it).
    #[cfg(feature = "testing")]
    pub fn fail_index_flushes(&self, n: u64) {
        self.inner.shared.index.fail_flushes(n);
    }

    /// Makes the apply of the `nth` record (1-based) of the next request that has one fail
    /// once, as a bug or a store failure part way through a request would.
    #[cfg(feature = "testing")]
    pub fn fail_apply_at(&self, nth: u64) {
        self.inner.shared.index.fail_apply_at(nth);
    }

    /// True once a failed write or fsync made the engine refuse every write.
    pub fn is_poisoned(&self) -> bool {
        self.inner.shared.poisoned.load(Ordering::Acquire)
    }

    /// A receiver that turns true the moment the engine is poisoned (see
    /// [`Engine::is_poisoned`]): the server flips its health status on it.
    pub fn poison_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.shared.poison_signal.subscribe()
    }

    /// The whole index, for tests that compare a rebuilt index with the live one.
    ///
    /// # Errors
    /// Index failures.
    #[doc(hidden)]
    pub fn index_dump(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.shared.index.dump()
    }
}

fn unexpected(reply: &Reply) -> Error {
    Error::Internal(format!("unexpected writer reply {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer reply of the wrong kind is the engine's own bug: `Internal` (the server's
    /// `INTERNAL`), never an error that blames the caller's input.
    #[test]
    fn an_unexpected_writer_reply_is_an_internal_error() {
        for reply in [Reply::Done, Reply::Count(3)] {
            match unexpected(&reply) {
                Error::Internal(why) => assert!(why.contains("unexpected writer reply"), "{why}"),
                other => panic!("{reply:?} became {other:?}"),
            }
        }
    }
}
