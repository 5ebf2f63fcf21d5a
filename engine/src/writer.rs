//! The single writer: validates requests against current state, frames their records,
//! writes each group commit once, syncs per the policy, applies the index, then acknowledges.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::{
    Append, Appended, EpochAdvanced, NewEvent, OpenStream, SessionExpired, SessionInfo, StreamInfo,
    Terminated,
};
use crate::apply::apply;
use crate::config::{Config, SyncPolicy};
use crate::error::{Error, Result};
use crate::index::{Index, StreamCache, Txn};
use crate::log::{Position, SegmentSet};
use crate::record::{encode_frame, Record};
use crate::segment::Segment;
use crate::state::StreamState;

mod gather;
mod plan;

use gather::{Gather, Producers};

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A request to the writer.
#[derive(Debug)]
pub(crate) enum Command {
    OpenSession {
        session: String,
        /// Stored with a session this creates (ignored for an existing one).
        state: Option<Vec<u8>>,
    },
    SetSessionState {
        session: String,
        state: Vec<u8>,
    },
    AdvanceEpoch(String),
    ExpireSession(String),
    OpenStream(OpenStream),
    Append(Append),
    Terminate {
        session: Option<String>,
        stream: u64,
        state: StreamState,
        expected_next_seq: Option<u64>,
        reason: Option<String>,
        frame: Option<NewEvent>,
    },
    Trim {
        session: Option<String>,
        stream: u64,
        watermark: u64,
    },
    /// Carry forward (or forget, past the horizon) state born below `below_lsn`, then retire
    /// every segment whose records all lie below it.
    Retire {
        below_lsn: u64,
        bases: Vec<u64>,
        /// Streams with events in the retired segments (their stale run starts go).
        streams: Vec<u64>,
    },
    Sync,
}

/// The writer's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Session(SessionInfo),
    Epoch(EpochAdvanced),
    Expired(SessionExpired),
    Stream(StreamInfo),
    Appended(Appended),
    Terminated(Terminated),
    Watermark(u64),
    Done,
}

/// Where the writer sends a request's answer: a blocked thread, or an awaiting task.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    Blocking(SyncSender<Result<Reply>>),
    Async(tokio::sync::oneshot::Sender<Result<Reply>>),
}

impl ReplyTo {
    /// Delivers the answer; a caller that has gone away is no error (the request was
    /// carried out either way).
    pub(crate) fn send(self, reply: Result<Reply>) {
        match self {
            Self::Blocking(tx) => {
                let _ = tx.send(reply);
            }
            Self::Async(tx) => {
                let _ = tx.send(reply);
            }
        }
    }
}

pub(crate) type Request = (Command, ReplyTo);

/// Sends `cmd` to the writer and waits for its answer.
pub(crate) fn submit(tx: &SyncSender<Request>, shared: &Shared, cmd: Command) -> Result<Reply> {
    wait(&send(tx, shared, cmd)?)
}

/// Queues `cmd` for the writer; [`wait`] for the answer. Split from [`submit`] so a caller
/// can stop holding the sender while it waits.
pub(crate) fn send(
    tx: &SyncSender<Request>,
    shared: &Shared,
    cmd: Command,
) -> Result<Receiver<Result<Reply>>> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
    tx.send((cmd, ReplyTo::Blocking(reply_tx)))
        .map_err(|_| Error::Closed)?;
    Ok(reply_rx)
}

/// Waits for the answer to a request queued with [`send`].
pub(crate) fn wait(reply: &Receiver<Result<Reply>>) -> Result<Reply> {
    reply.recv().map_err(|_| Error::Closed)?
}

/// [`submit`] for async callers: the answer is awaited, no thread blocks on it. Queuing the
/// request blocks the caller only while the writer's queue is full.
pub(crate) async fn submit_async(
    tx: &SyncSender<Request>,
    shared: &Shared,
    cmd: Command,
) -> Result<Reply> {
    let reply = send_async(tx, shared, cmd)?;
    reply.await.map_err(|_| Error::Closed)?
}

/// Queues `cmd` for the writer; the answer arrives on the returned receiver. Split from
/// [`submit_async`] so a caller can queue many requests before awaiting any (they then
/// share group commits).
pub(crate) fn send_async(
    tx: &SyncSender<Request>,
    shared: &Shared,
    cmd: Command,
) -> Result<tokio::sync::oneshot::Receiver<Result<Reply>>> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
    tx.send((cmd, ReplyTo::Async(reply_tx)))
        .map_err(|_| Error::Closed)?;
    Ok(reply_rx)
}

/// Counters the writer keeps for stats.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub events_appended: AtomicU64,
    pub payload_bytes_appended: AtomicU64,
    pub fsyncs: AtomicU64,
    pub commit_batches: AtomicU64,
    pub records_written: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub last_lsn: AtomicU64,
}

/// State shared between the writer thread and the engine handle.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: Config,
    pub fs: Arc<dyn crate::fs::FileSystem>,
    pub index: Index,
    pub segments: SegmentSet,
    pub poisoned: AtomicBool,
    pub counters: Counters,
    pub commits: tokio::sync::watch::Sender<u64>,
    /// Retention's per-segment summaries (sealed segments never change).
    pub summaries: crate::retention::Summaries,
    /// Turns true (once, for good) when the engine is poisoned, for whoever must react at
    /// once: the server's health status, a supervisor.
    pub poison_signal: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    /// Refuses every later write until the engine is reopened (recovery repairs what a
    /// failed write or fsync left), and says so: the log, the poison signal.
    pub(crate) fn poison(&self, e: &Error) {
        tracing::error!(
            error = %e,
            "write path failed; the engine refuses every write until it is reopened \
             (restart the server: recovery repairs the log)"
        );
        self.poisoned.store(true, Ordering::Release);
        self.poison_signal.send_replace(true);
    }
}

/// A group commit's answers, all successful, handed to the acknowledging thread.
type Acks = Vec<(ReplyTo, Reply)>;

/// Most requests in one group commit.
const GROUP_REQUESTS_MAX: usize = 4096;

/// Takes every queued request, up to [`GROUP_REQUESTS_MAX`] in `batch`.
fn drain(rx: &Receiver<Request>, batch: &mut Vec<Request>) {
    while batch.len() < GROUP_REQUESTS_MAX {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
}

/// Decoded streams the writer keeps between group commits; past this many it starts over
/// (bounds memory with many streams).
const STREAM_CACHE_MAX: usize = 16 * 1024;

/// The writer thread's own state.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    active: Arc<Segment>,
    next_lsn: u64,
    last_sync: Instant,
    unsynced: bool,
    /// The streams as the committed index holds them, decoded (see `Txn::with_streams`).
    streams: StreamCache,
    /// Where committed answers go to be delivered (off the writer thread); `None` delivers
    /// them inline.
    acker: Option<Sender<Acks>>,
    /// Answers handed to the acknowledging thread and not delivered yet.
    acks_in_flight: Arc<AtomicUsize>,
    /// Who appended recently, for how long a group waits for them (see [`gather`]).
    producers: Producers,
    /// The group commit buffer, kept (emptied) between groups so a group's frames are
    /// written into memory already grown to a group's size, not regrown from empty.
    buf: Vec<u8>,
    /// The event runs this group appended so far (one per request), so a retry planned in
    /// the same group checks its events against the group's own frames, which are not in
    /// the log yet.
    group_runs: Vec<plan::PendingRun>,
}

/// The largest group buffer kept for the next group; a larger one is freed after its group.
const KEPT_BUFFER_BYTES_MAX: usize = 4 << 20;

impl Writer {
    pub(crate) fn new(shared: Arc<Shared>, active: Arc<Segment>, next_lsn: u64) -> Self {
        Self {
            shared,
            active,
            next_lsn,
            last_sync: Instant::now(),
            unsynced: false,
            streams: StreamCache::default(),
            acker: None,
            acks_in_flight: Arc::default(),
            producers: Producers::default(),
            buf: Vec::new(),
            group_runs: Vec::new(),
        }
    }

    /// Starts the thread that delivers committed answers. Waking a waiting caller is a
    /// system call (and a cross-CPU wake-up) per request: done here, it would sit between
    /// one group commit's `fdatasync` and the next one's. The writer hands over each
    /// commit's answers in one message instead and goes straight on to the next group.
    fn spawn_acker(
        in_flight: Arc<AtomicUsize>,
    ) -> Option<(Sender<Acks>, std::thread::JoinHandle<()>)> {
        let (tx, rx) = std::sync::mpsc::channel::<Acks>();
        let handle = std::thread::Builder::new()
            .name("cursorlog-acker".into())
            .spawn(move || {
                while let Ok(acks) = rx.recv() {
                    for (to, reply) in acks {
                        to.send(Ok(reply));
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            });
        match handle {
            Ok(h) => Some((tx, h)),
            Err(e) => {
                tracing::warn!(error = %e, "no acknowledging thread; the writer acknowledges");
                None
            }
        }
    }

    /// Delivers a committed group's answers (their changes are durable per the policy and
    /// published in the index).
    fn acknowledge(&self, acks: Acks) {
        let acks = match &self.acker {
            Some(acker) => {
                let n = acks.len();
                self.acks_in_flight.fetch_add(n, Ordering::AcqRel);
                match acker.send(acks) {
                    Ok(()) => return,
                    Err(std::sync::mpsc::SendError(acks)) => {
                        self.acks_in_flight.fetch_sub(n, Ordering::AcqRel);
                        acks
                    }
                }
            }
            None => acks,
        };
        for (to, reply) in acks {
            to.send(Ok(reply));
        }
    }

    /// Runs until every sender is gone, then syncs.
    pub(crate) fn run(mut self, rx: &Receiver<Request>) {
        let acker = Self::spawn_acker(Arc::clone(&self.acks_in_flight)).map(|(tx, handle)| {
            self.acker = Some(tx);
            handle
        });
        self.run_loop(rx);
        // Every answer is delivered before the writer is joined.
        self.acker = None;
        if let Some(handle) = acker {
            let _ = handle.join();
        }
    }

    fn run_loop(&mut self, rx: &Receiver<Request>) {
        let tick = match self.shared.config.sync {
            SyncPolicy::Interval(ms) => Duration::from_millis(ms.max(1)),
            _ => Duration::from_secs(3600),
        };
        loop {
            let first = match rx.recv_timeout(tick) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) => {
                    self.sync_if_due(false);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut batch = vec![first];
            drain(rx, &mut batch);
            // The callers the previous group commit answered are being woken right now, and
            // most will be back with their next request within microseconds: gather them
            // into this group (one `fdatasync` for all) rather than sync a fraction of them
            // and leave the rest to the next one (see `gather`). Yielding gives them the CPU.
            // Stragglers are worth waiting for only when the group ends in an fdatasync.
            let expected = match self.shared.config.sync {
                SyncPolicy::Always => self.producers.expected(),
                _ => 0,
            };
            let mut gather = Gather::new(Instant::now(), expected);
            loop {
                let queued = batch.len();
                drain(rx, &mut batch);
                let grew = batch.len() > queued;
                let acks_pending = self.acks_in_flight.load(Ordering::Acquire) > 0;
                if !gather.keep_waiting(Instant::now(), batch.len(), grew, acks_pending) {
                    break;
                }
                std::thread::yield_now();
            }
            drain(rx, &mut batch);
            self.producers.record(&batch, gather.futile());
            self.commit(batch);
        }
        if !self.shared.poisoned.load(Ordering::Acquire) {
            if let Err(e) = self
                .active
                .sync_data()
                .and_then(|()| self.shared.index.flush())
            {
                tracing::error!(error = %e, "final sync on close failed");
            }
        }
    }

    fn poison(&self, e: &Error) {
        self.shared.poison(e);
    }

    fn sync_if_due(&mut self, force_interval: bool) {
        if !self.unsynced || self.shared.poisoned.load(Ordering::Acquire) {
            return;
        }
        let due = match self.shared.config.sync {
            SyncPolicy::Interval(ms) => {
                force_interval || self.last_sync.elapsed() >= Duration::from_millis(ms)
            }
            _ => false,
        };
        if due {
            if let Err(e) = self.sync_now() {
                self.poison(&e);
            }
        }
    }

    fn sync_now(&mut self) -> Result<()> {
        self.active.sync_data()?;
        self.shared.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.last_sync = Instant::now();
        self.unsynced = false;
        Ok(())
    }

    fn rotate_if_full(&mut self) -> Result<()> {
        if self.active.len() < self.shared.config.segment_bytes_max {
            return Ok(());
        }
        self.active.seal()?;
        let next = Arc::new(Segment::create(
            Arc::clone(&self.shared.fs),
            &self.shared.config.dir,
            self.next_lsn,
        )?);
        self.shared.segments.insert(Arc::clone(&next));
        self.active = next;
        self.unsynced = false;
        tracing::debug!(base_lsn = self.next_lsn, "rolled to a new segment");
        Ok(())
    }

    fn commit(&mut self, batch: Vec<Request>) {
        if self.shared.poisoned.load(Ordering::Acquire) {
            for (_, tx) in batch {
                tx.send(Err(Error::Poisoned));
            }
            return;
        }
        if let Err(e) = self.rotate_if_full() {
            self.poison(&e);
            for (_, tx) in batch {
                tx.send(Err(Error::Poisoned));
            }
            return;
        }
        let index = self.shared.index.clone();
        let mut streams = std::mem::take(&mut self.streams);
        if streams.len() > STREAM_CACHE_MAX {
            streams.clear();
        }
        let mut txn = Txn::with_streams(&index, streams);
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        self.group_runs.clear();
        let mut acks = Vec::with_capacity(batch.len());
        let mut retire = Vec::new();
        let mut force_sync = false;
        let first_lsn = self.next_lsn;
        for (cmd, tx) in batch {
            if let Command::Retire { bases, .. } = &cmd {
                retire.extend_from_slice(bases);
            }
            // Identity allocations are synced under every policy, so a session, stream id or
            // epoch is never issued twice even if a later unsynced tail is lost.
            force_sync |= matches!(
                cmd,
                Command::Sync
                    | Command::Retire { .. }
                    | Command::OpenSession { .. }
                    | Command::OpenStream(_)
                    | Command::AdvanceEpoch(_)
            );
            match self.plan(cmd, &mut txn, &mut buf) {
                Ok(reply) => acks.push((tx, reply)),
                Err(e @ Error::Index(_)) => {
                    // The overlay may be half-applied: fail the whole batch.
                    self.poison(&e);
                    tx.send(Err(e));
                    for (tx, _) in acks {
                        tx.send(Err(Error::Poisoned));
                    }
                    return;
                }
                Err(e) => {
                    tx.send(Err(e));
                }
            }
        }
        let written = self.write_and_sync(&buf, force_sync);
        if buf.capacity() <= KEPT_BUFFER_BYTES_MAX {
            self.buf = buf;
        }
        if let Err(e) = written {
            self.poison(&e);
            for (tx, _) in acks {
                tx.send(Err(Error::Poisoned));
            }
            return;
        }
        let last_lsn = self.next_lsn - 1;
        self.streams = if txn.is_empty() && first_lsn == self.next_lsn {
            txn.into_streams()
        } else {
            index.commit(txn, last_lsn)
        };
        let applied = if index.memtable_len() >= 4 * crate::index::MEMTABLE_ENTRIES_MAX {
            // The background flush fell behind: pay for it here rather than grow unbounded.
            index.flush_memtable()
        } else {
            Ok(())
        };
        let retired = applied.and_then(|()| {
            if retire.is_empty() {
                return Ok(());
            }
            // The carried-forward state must be durable in sled before the files go: then a
            // restart never needs a record that is gone.
            index.flush()?;
            let paths = self.shared.segments.retire(&retire);
            self.shared
                .counters
                .segments_deleted
                .fetch_add(paths.len() as u64, Ordering::Relaxed);
            tracing::info!(
                segments = paths.len(),
                "retired segments below the retention watermarks"
            );
            Ok(())
        });
        if let Err(e) = retired {
            self.poison(&e);
            self.streams.clear();
            for (tx, _) in acks {
                tx.send(Err(Error::Poisoned));
            }
            return;
        }
        let c = &self.shared.counters;
        c.commit_batches.fetch_add(1, Ordering::Relaxed);
        c.records_written
            .fetch_add(self.next_lsn - first_lsn, Ordering::Relaxed);
        c.last_lsn.store(last_lsn, Ordering::Release);
        self.shared.commits.send_replace(last_lsn);
        self.acknowledge(acks);
    }

    fn write_and_sync(&mut self, buf: &[u8], force: bool) -> Result<()> {
        if !buf.is_empty() {
            self.active.append(buf)?;
            self.unsynced = true;
        }
        match self.shared.config.sync {
            SyncPolicy::Always if self.unsynced => self.sync_now(),
            _ if force && self.unsynced => self.sync_now(),
            _ => {
                self.sync_if_due(false);
                Ok(())
            }
        }
    }

    /// Frames `records` as one atomic group and applies them to the overlay.
    fn emit(&mut self, records: Vec<Record>, txn: &mut Txn<'_>, buf: &mut Vec<u8>) -> Result<()> {
        // Frames go straight into the group's buffer; on an encoding failure (a bug guard:
        // limits are checked before planning) the request's partial frames are cut off again.
        let start = buf.len();
        let base_offset = self.active.len() + start as u64;
        let count = records.len();
        let mut positions = Vec::with_capacity(count);
        for (i, record) in records.iter().enumerate() {
            let lsn = self.next_lsn + i as u64;
            let group_left = u32::try_from(count - 1 - i).unwrap_or(u32::MAX);
            let offset = base_offset + (buf.len() - start) as u64;
            match encode_frame(record, lsn, group_left, buf) {
                Ok(len) => positions.push(Position {
                    segment: self.active.base_lsn(),
                    offset,
                    len,
                }),
                Err(e) => {
                    buf.truncate(start);
                    return Err(Error::invalid("event", e));
                }
            }
        }
        for (i, (record, pos)) in records.iter().zip(positions).enumerate() {
            let prev = i.checked_sub(1).and_then(|p| records.get(p));
            let continues = record.continues_run(prev);
            apply(txn, self.next_lsn + i as u64, pos, record, continues)?;
        }
        self.next_lsn += count as u64;
        Ok(())
    }
}

pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
