//! The single writer: validates requests against current state, frames their records,
//! writes each group commit once, syncs per the policy, applies the index, then acknowledges.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::{
    Append, Appended, EpochAdvanced, NewEvent, OpenStream, SessionExpired, SessionInfo, StreamInfo,
    Terminated,
};
use crate::apply::apply;
use crate::config::{Config, SyncPolicy};
use crate::error::{Error, Result};
use crate::index::{Index, Txn};
use crate::log::{Position, SegmentSet};
use crate::record::{encode_frame, Record};
use crate::segment::Segment;
use crate::state::StreamState;

mod plan;

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A request to the writer.
#[derive(Debug)]
pub(crate) enum Command {
    OpenSession(String),
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
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
    tx.send((cmd, ReplyTo::Blocking(reply_tx)))
        .map_err(|_| Error::Closed)?;
    reply_rx.recv().map_err(|_| Error::Closed)?
}

/// [`submit`] for async callers: the answer is awaited, no thread blocks on it. Queuing the
/// request blocks the caller only while the writer's queue is full.
pub(crate) async fn submit_async(
    tx: &SyncSender<Request>,
    shared: &Shared,
    cmd: Command,
) -> Result<Reply> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
    tx.send((cmd, ReplyTo::Async(reply_tx)))
        .map_err(|_| Error::Closed)?;
    reply_rx.await.map_err(|_| Error::Closed)?
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
}

/// The writer thread's own state.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    active: Arc<Segment>,
    next_lsn: u64,
    last_sync: Instant,
    unsynced: bool,
}

impl Writer {
    pub(crate) fn new(shared: Arc<Shared>, active: Arc<Segment>, next_lsn: u64) -> Self {
        Self {
            shared,
            active,
            next_lsn,
            last_sync: Instant::now(),
            unsynced: false,
        }
    }

    /// Runs until every sender is gone, then syncs.
    pub(crate) fn run(mut self, rx: &Receiver<Request>) {
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
            while batch.len() < 4096 {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
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
        tracing::error!(error = %e, "write path failed; engine poisoned until reopened");
        self.shared.poisoned.store(true, Ordering::Release);
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
        let mut txn = Txn::new(&index);
        let mut buf = Vec::new();
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
                    | Command::OpenSession(_)
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
        if let Err(e) = self.write_and_sync(&buf, force_sync) {
            self.poison(&e);
            for (tx, _) in acks {
                tx.send(Err(Error::Poisoned));
            }
            return;
        }
        let last_lsn = self.next_lsn - 1;
        if !(txn.is_empty() && first_lsn == self.next_lsn) {
            index.commit(txn, last_lsn);
        }
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
        for (tx, reply) in acks {
            tx.send(Ok(reply));
        }
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
