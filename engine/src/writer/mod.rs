//! The single writer: validates requests against current state, frames their records,
//! writes each group commit once, syncs per the policy, applies the index, then acknowledges.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::apply::apply;
use crate::config::SyncPolicy;
use crate::error::{Error, Result};
use crate::index::{StreamCache, Txn};
use crate::log::{Position, WriteError};
use crate::mailbox::{Command, Inbox, Reply, ReplyTo, Request};
use crate::record::{encode_frame, Record};
use crate::shared::Shared;

mod carry;
mod gather;
mod pipeline;
mod plan;
mod propose;
mod sink;

pub(crate) use sink::{Proposals, Sink};

use gather::{Gather, Producers};

/// Most answers of one group the writer delivers itself instead of handing them to the
/// acknowledging thread (see [`Writer::acknowledge`]).
const ACK_INLINE_MAX: usize = 2;

/// A group commit's answers, all successful, handed to the acknowledging thread.
type Acks = Vec<(ReplyTo, Reply)>;

/// Most requests in one group commit.
const GROUP_REQUESTS_MAX: usize = 4096;

impl Writer {
    /// Waits, yielding, while the producers the last group commit answered are expected back
    /// (`expected` of them; see `gather`), adding what arrives to `batch`, and records how the
    /// wait went.
    fn gather(&mut self, rx: &Inbox, batch: &mut Vec<Request>, expected: usize) {
        let mut gather = Gather::new(Instant::now(), expected);
        loop {
            let queued = batch.len();
            drain(rx, batch);
            let grew = batch.len() > queued;
            let acks_pending = self.acks_in_flight.load(Ordering::Acquire) > 0;
            if !gather.keep_waiting(Instant::now(), batch.len(), grew, acks_pending) {
                break;
            }
            std::thread::yield_now();
        }
        drain(rx, batch);
        self.producers.record(batch, gather.futile());
    }
}

/// Takes every queued request, up to [`GROUP_REQUESTS_MAX`] in `batch`.
fn drain(rx: &Inbox, batch: &mut Vec<Request>) {
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

/// What a committed group changes outside the index: applied only once it is durable.
#[derive(Debug)]
enum Effect {
    /// A session was created: its idle TTL starts.
    SessionLive(String),
    /// A session was expired or forgotten: its TTL ends.
    SessionGone(String),
    /// A stream reached a terminal state: its lease ends.
    StreamEnded(u64),
    /// A session was expired by its idle TTL (counted once it is durable).
    ExpiredIdle,
}

/// The writer thread's own state.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    log: Sink,
    last_sync: Instant,
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
    /// Streams and tasks this group touched (their followers are woken after the commit).
    touched: Vec<u64>,
    /// This group's effects outside the index.
    effects: Vec<Effect>,
    /// Segments the group retires, once it is durable: (bases, streams with run starts).
    retiring: Option<Vec<u64>>,
    /// A request's records failed to apply part way: the group's overlay is not to be
    /// trusted and the group must not commit.
    overlay_broken: bool,
    /// Streams whose producer lease this group armed (while planning, so the lease cap
    /// counts them): disarmed again if the group is not written.
    leased: Vec<u64>,
}

/// The largest group buffer kept for the next group; a larger one is freed after its group.
const KEPT_BUFFER_BYTES_MAX: usize = 4 << 20;

impl Writer {
    pub(crate) fn new(shared: Arc<Shared>, log: Sink) -> Self {
        Self {
            shared,
            log,
            last_sync: Instant::now(),
            streams: StreamCache::default(),
            acker: None,
            acks_in_flight: Arc::default(),
            producers: Producers::default(),
            buf: Vec::new(),
            group_runs: Vec::new(),
            touched: Vec::new(),
            effects: Vec::new(),
            retiring: None,
            overlay_broken: false,
            leased: Vec::new(),
        }
    }

    /// Starts the thread that delivers committed answers (groups of more than
    /// [`ACK_INLINE_MAX`]). Waking a waiting caller is a
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
            // One or two answers cost the writer no more to deliver than to hand over (each
            // is one wake-up), and skip the acknowledging thread's own wake-up: a caller
            // alone in its group (a task call, a lone producer) is answered sooner.
            Some(_) if acks.len() <= ACK_INLINE_MAX => acks,
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

    /// Runs until every sender is gone, then writes the shutdown marker and syncs.
    pub(crate) fn run(mut self, rx: &Inbox) {
        let acker = Self::spawn_acker(Arc::clone(&self.acks_in_flight)).map(|(tx, handle)| {
            self.acker = Some(tx);
            handle
        });
        if matches!(self.log, Sink::Proposals(_)) {
            self.run_pipelined(rx);
        } else {
            self.run_loop(rx);
        }
        // Every answer is delivered before the writer is joined.
        self.acker = None;
        if let Some(handle) = acker {
            let _ = handle.join();
        }
    }

    fn run_loop(&mut self, rx: &Inbox) {
        let tick = match self.shared.config.sync {
            SyncPolicy::Interval(ms) => Duration::from_millis(ms.max(1)),
            _ => Duration::from_secs(3600),
        };
        loop {
            let first = match rx.recv_timeout(tick) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) => {
                    self.sync_if_due();
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
            self.gather(rx, &mut batch, expected);
            let bytes: u64 = batch.iter().map(|r| r.bytes).sum();
            self.commit(batch);
            self.shared.admission.give_back(bytes);
        }
        if !self.shared.poisoned.load(Ordering::Acquire)
            && !self.shared.crashed.load(Ordering::Acquire)
        {
            if let Err(e) = self.shut_down() {
                tracing::error!(error = %e, "final sync on close failed");
                self.shared.poison(&e);
            }
        }
    }

    /// A clean close: the log synced, the index flushed, then the clean-close mark beside
    /// the log (it takes no LSN: see `log/clean.rs`). The mark goes last, so a crash part
    /// way leaves no mark: the next open is then "not clean", the safe answer.
    fn shut_down(&mut self) -> Result<()> {
        self.log.sync()?;
        self.shared.index.flush()?;
        self.log.close_cleanly()
    }

    fn poison(&self, e: &Error) {
        self.shared.poison(e);
    }

    /// Under `interval`, syncs once the interval since the last sync has passed.
    fn sync_if_due(&mut self) {
        if !self.log.has_unsynced() || self.shared.poisoned.load(Ordering::Acquire) {
            return;
        }
        if let SyncPolicy::Interval(ms) = self.shared.config.sync {
            if self.last_sync.elapsed() >= Duration::from_millis(ms) {
                if let Err(e) = self.sync_now() {
                    self.poison(&e);
                }
            }
        }
    }

    fn sync_now(&mut self) -> Result<()> {
        self.log.sync()?;
        self.shared.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.last_sync = Instant::now();
        Ok(())
    }

    fn fail_all(&self, batch: Vec<Request>, err: impl Fn() -> Error) {
        for r in batch {
            r.reply.send(Err(err()));
        }
    }

    fn commit(&mut self, batch: Vec<Request>) {
        if self.shared.poisoned.load(Ordering::Acquire) {
            return self.fail_all(batch, || Error::Poisoned);
        }
        if matches!(self.log, Sink::Proposals(_)) {
            return self.fail_all(batch, || {
                Error::Internal("a replicated node's writer plans in its pipeline".into())
            });
        }
        match self
            .log
            .rotate_if_full(self.shared.config.segment_bytes_max)
        {
            Ok(()) => {}
            Err(WriteError::NoSpace(e)) => {
                let replies = batch.into_iter().map(|r| r.reply).collect();
                return self.refuse_for_full_disk(&e, replies);
            }
            Err(WriteError::Fatal(e)) => {
                self.poison(&e);
                return self.fail_all(batch, || Error::Poisoned);
            }
        }
        let index = self.shared.index.clone();
        let mut streams = std::mem::take(&mut self.streams);
        if streams.len() > STREAM_CACHE_MAX {
            streams.clear();
        }
        let mut txn = Txn::with_streams(&index, streams);
        let mut buf = self.start_group();
        let mut acks: Acks = Vec::with_capacity(batch.len());
        // Refusals planned after a group of this batch: claims about state that stands only
        // if the group is written (a full disk refuses it), so they wait for the write.
        let mut held: Vec<(ReplyTo, Error)> = Vec::new();
        let mut force_sync = false;
        let first = self.log.next();
        let first_lsn = first.lsn;
        for Request { cmd, reply, .. } in batch {
            // Identity allocations are synced under every policy, so a session, stream id or
            // epoch is never issued twice even if a later unsynced tail is lost; state that
            // lets segments go is synced before they go.
            force_sync |= matches!(
                cmd,
                Command::Sync
                    | Command::Retire { .. }
                    | Command::CarryForward { .. }
                    | Command::Forget { .. }
                    | Command::OpenSession { .. }
                    | Command::OpenStream(_)
                    | Command::AdvanceEpoch(_)
                    | Command::Task(crate::mailbox::TaskCommand::Create(_))
            );
            let planned = self.plan(cmd, &mut txn, &mut buf);
            if self.overlay_broken || matches!(planned, Err(Error::Index(_))) {
                // The overlay may be half-applied: fail the whole batch, write nothing.
                self.overlay_broken = false;
                self.log.rewind(first);
                self.disarm_group_leases();
                let e = match planned {
                    Err(e) => e,
                    Ok(_) => Error::Internal("a request half-applied to the index".into()),
                };
                self.poison(&e);
                reply.send(Err(e));
                for tx in acks
                    .into_iter()
                    .map(|(tx, _)| tx)
                    .chain(held.into_iter().map(|(tx, _)| tx))
                {
                    tx.send(Err(Error::Poisoned));
                }
                return;
            }
            match planned {
                Ok(r) => acks.push((reply, r)),
                Err(e) if buf.is_empty() => reply.send(Err(e)),
                Err(e) => held.push((reply, e)),
            }
        }
        let written = self.write_and_sync(&buf, force_sync);
        if buf.capacity() <= KEPT_BUFFER_BYTES_MAX {
            self.buf = buf;
        }
        match written {
            Ok(()) => {}
            Err(WriteError::NoSpace(e)) => {
                // Nothing of the group is in the log: refuse it, keep serving.
                self.log.rewind(first);
                self.streams.clear();
                self.disarm_group_leases();
                let replies = acks
                    .into_iter()
                    .map(|(tx, _)| tx)
                    .chain(held.into_iter().map(|(tx, _)| tx))
                    .collect();
                return self.refuse_for_full_disk(&e, replies);
            }
            Err(WriteError::Fatal(e)) => {
                self.poison(&e);
                self.disarm_group_leases();
                for tx in acks
                    .into_iter()
                    .map(|(tx, _)| tx)
                    .chain(held.into_iter().map(|(tx, _)| tx))
                {
                    tx.send(Err(Error::Poisoned));
                }
                return;
            }
        }
        for (tx, e) in held {
            tx.send(Err(e));
        }
        let last_lsn = self.log.next_lsn() - 1;
        self.streams = if txn.is_empty() && first_lsn == self.log.next_lsn() {
            txn.into_streams()
        } else {
            index.commit(txn, last_lsn)
        };
        self.after_commit();
        if index.memtable_len() >= 4 * crate::index::MEMTABLE_ENTRIES_MAX {
            // The background flush fell behind: pay for it here rather than grow unbounded.
            // The group is durable in the log and applied in memory, so a failed flush loses
            // nothing: writes are refused as on a full disk until a flush succeeds.
            if let Err(e) = index.flush_memtable() {
                self.index_flush_failed(&e);
            }
        }
        if let Err(e) = self.retire() {
            // The index (with the state carried out of the segments) is not durable, so the
            // segments stay; the next retention round retires them again.
            tracing::warn!(error = %e, "retiring segments failed; they stay until the next retention round");
            if e.is_no_space() || matches!(e, Error::Index(_)) {
                self.index_flush_failed(&e);
            } else {
                self.poison(&e);
                self.streams.clear();
                for (tx, _) in acks {
                    tx.send(Err(Error::Poisoned));
                }
                return;
            }
        }
        let c = &self.shared.counters;
        c.commit_batches.fetch_add(1, Ordering::Relaxed);
        c.records_written
            .fetch_add(self.log.next_lsn() - first_lsn, Ordering::Relaxed);
        c.last_lsn.store(last_lsn, Ordering::Release);
        self.acknowledge(acks);
    }

    /// Clears what the previous group left and returns the (emptied) group buffer.
    fn start_group(&mut self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        self.group_runs.clear();
        self.touched.clear();
        self.effects.clear();
        self.retiring = None;
        self.leased.clear();
        buf
    }

    /// Ends the leases this group armed: its streams were never opened (their ids, LSNs of
    /// an unwritten group, go to the next records).
    fn disarm_group_leases(&mut self) {
        for stream in self.leased.drain(..) {
            self.shared.leases.remove(stream);
        }
    }

    /// Refuses a group that the disk has no room for: nothing of it is in the log. Appends
    /// are refused (`DiskFull`) until the background check sees space again.
    fn refuse_for_full_disk(&mut self, e: &Error, replies: Vec<ReplyTo>) {
        let free = self
            .shared
            .log
            .fs()
            .available_bytes(self.shared.log.dir())
            .unwrap_or(0);
        self.shared
            .counters
            .disk_free_bytes
            .store(free, Ordering::Release);
        self.shared.low_disk.store(true, Ordering::Release);
        tracing::warn!(error = %e, free, "the disk is full: refusing appends until space returns");
        let reserve = self.shared.config.disk_reserve_bytes;
        self.shared
            .counters
            .appends_refused_low_disk
            .fetch_add(replies.len() as u64, Ordering::Relaxed);
        for tx in replies {
            tx.send(Err(Error::DiskFull {
                free_bytes: free,
                reserve_bytes: reserve,
            }));
        }
    }

    /// The index could not be made durable (its store shares the disk): everything is in
    /// the log and in memory, so nothing is lost, but the in-memory part must not grow
    /// without bound. Appends are refused as on a full disk until the background check sees
    /// space again and a later flush succeeds.
    fn index_flush_failed(&self, e: &Error) {
        tracing::warn!(error = %e, "the index could not be flushed: refusing appends until it can");
        self.shared.low_disk.store(true, Ordering::Release);
        self.shared
            .counters
            .index_flush_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Publishes what the committed group changed outside the index: wakes the followers
    /// of the streams it touched, starts and ends session TTLs and leases.
    fn after_commit(&mut self) {
        self.touched.sort_unstable();
        self.touched.dedup();
        self.shared.followers.ring(&self.touched);
        let now = self.shared.now_ms();
        for effect in self.effects.drain(..) {
            match effect {
                Effect::SessionLive(s) => self.shared.activity.insert(&s, now),
                Effect::SessionGone(s) => self.shared.activity.remove(&s),
                Effect::StreamEnded(id) => self.shared.leases.remove(id),
                Effect::ExpiredIdle => {
                    self.shared
                        .counters
                        .sessions_expired_idle
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Retires the segments this group's `Retire` validated: the index (with the state
    /// carried out of them) is made durable in sled first, so a restart never needs a
    /// record that is gone; then the files go, oldest first.
    fn retire(&mut self) -> Result<()> {
        let Some(bases) = self.retiring.take() else {
            return Ok(());
        };
        self.shared.index.flush()?;
        let paths = self.shared.log.purge_prefix(&bases)?;
        self.shared
            .counters
            .segments_deleted
            .fetch_add(paths.len() as u64, Ordering::Relaxed);
        tracing::info!(
            segments = paths.len(),
            "retired segments below the retention watermarks"
        );
        Ok(())
    }

    fn write_and_sync(&mut self, buf: &[u8], force: bool) -> std::result::Result<(), WriteError> {
        self.log.write(buf)?;
        let sync = match self.shared.config.sync {
            SyncPolicy::Always => self.log.has_unsynced(),
            _ => force && self.log.has_unsynced(),
        };
        if sync {
            self.sync_now().map_err(WriteError::Fatal)?;
        } else {
            self.sync_if_due();
        }
        Ok(())
    }

    /// Frames `records` as one atomic group and applies them to the overlay.
    fn emit(&mut self, records: Vec<Record>, txn: &mut Txn<'_>, buf: &mut Vec<u8>) -> Result<()> {
        // Frames go straight into the group's buffer; on an encoding failure (a bug guard:
        // limits are checked before planning) the request's partial frames are cut off again.
        let start = buf.len();
        let (segment, origin) = self.log.frame_origin();
        let base_offset = origin + start as u64;
        let first_lsn = self.log.next_lsn();
        let count = records.len();
        let mut positions = Vec::with_capacity(count);
        for (i, record) in records.iter().enumerate() {
            let offset = base_offset + (buf.len() - start) as u64;
            match encode_frame(record, self.log.stamp(i, count), buf) {
                Ok(len) => positions.push(Position {
                    segment,
                    offset,
                    len,
                }),
                Err(e) => {
                    buf.truncate(start);
                    return Err(Error::invalid("event", e));
                }
            }
        }
        let (touched, effects) = (self.touched.len(), self.effects.len());
        for (i, (record, pos)) in records.iter().zip(positions).enumerate() {
            let prev = i.checked_sub(1).and_then(|p| records.get(p));
            let continues = record.continues_run(prev);
            let lsn = first_lsn + i as u64;
            let checked = cross_check(txn, lsn, record);
            #[cfg(feature = "testing")]
            let applied = checked
                .and_then(|()| self.shared.index.injected_apply_failure(i))
                .and_then(|()| apply(txn, lsn, pos, record, continues));
            #[cfg(not(feature = "testing"))]
            let applied = checked.and_then(|()| apply(txn, lsn, pos, record, continues));
            if let Err(e) = applied {
                // None of the request's frames stay in the group and its LSNs are not taken.
                // The overlay may hold part of it: the group must not commit (see `commit`).
                buf.truncate(start);
                self.touched.truncate(touched);
                self.effects.truncate(effects);
                self.overlay_broken = true;
                return Err(e);
            }
            if let Some(id) = record.bell_id() {
                self.touched.push(id);
            }
            match record {
                Record::SessionOpened { session, .. } => {
                    self.effects.push(Effect::SessionLive(session.clone()));
                }
                Record::SessionExpired { session, .. }
                | Record::SessionForgotten { session, .. } => {
                    self.effects.push(Effect::SessionGone(session.clone()));
                }
                Record::Terminal(t) => self.effects.push(Effect::StreamEnded(t.stream)),
                _ => {}
            }
        }
        if let Err(e) = self.log.advance(count, &buf[start..]) {
            buf.truncate(start);
            self.overlay_broken = true;
            return Err(e);
        }
        Ok(())
    }
}

/// In debug and test builds, checks each planned record against the rules a replicated
/// apply enforces (`validate.rs`): the planner and the rules must agree, so a disagreement
/// is a bug in one of them and fails the request loudly. Release builds skip it (the planner
/// already decided on the same state).
fn cross_check(txn: &Txn<'_>, lsn: u64, record: &Record) -> Result<()> {
    if cfg!(debug_assertions) {
        if let Err(why) = crate::validate::validate(txn, lsn, record)? {
            return Err(Error::Internal(format!(
                "the writer planned a record the apply rules refuse: {why} ({record:?})"
            )));
        }
    }
    Ok(())
}
