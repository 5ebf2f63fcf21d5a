//! The storage half of a replicated log: the segment log driven entry by entry, as a Raft
//! log store needs it (issue 19; the openraft glue is in the `cursorlog-replication`
//! crate, which maps this API onto `RaftLogStorage`).
//!
//! Entries are the log's atomic groups (FORMAT.md, "Entries and terms"): appended whole with
//! the term their leader gave them, synced (`fdatasync`) before [`EntryLog::append`]
//! returns (or written by [`EntryLog::write`] and made durable by a later
//! [`EntryLog::sync`], one `fdatasync` for many writes, outside the lock), read back by index
//! through an entry→offset table, and cut back only above the committed index. Three rules
//! keep the on-disk invariants of a single node:
//!
//! * **A segment is sealed only when every entry in it is committed** (the writer rolls to a
//!   new segment only at or below the committed index), so an uncommitted suffix is cut by
//!   unlinking whole later segments and cutting the active one: a sealed segment is never
//!   modified. A cut that would reach into a sealed segment is refused.
//! * **The vote is durable before it is acknowledged** (`VOTE`: temp file, fsync, rename,
//!   directory fsync); the committed index is saved without an fsync (`COMMITTED`: losing
//!   it only costs re-applying entries), and never beyond the entries durable here; the
//!   last purged entry too (`PURGED`).
//! * **Bad input loses nothing**: an entry that is not the next one, a term below the last,
//!   an empty or undecodable proposal is refused with a typed error before anything is
//!   written; a full disk leaves the log as it was.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::{Clock, SystemClock};
use crate::config::SyncPolicy;
use crate::error::{CorruptionKind, Error, Result};
use crate::fs::{FileSystem, StdFs};
use crate::log::durable_file::{self, Read};
use crate::log::{Log, LogPoint, LogWriter, Segment, WriteError};
use bytes::Bytes;

use crate::format::{FrameHeader, BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use crate::record::{decode_event_view, tag, FrameStamp, Record};

mod cut;
mod proposal;
pub(crate) mod read;
mod retire;
mod snapshot;
mod tail;

use cut::Purged;
pub(crate) use retire::{HeldSegment, LogBase};

pub use proposal::{Proposal, ProposalError, ProposedRecord};
pub(crate) use proposal::{ProposalBuilder, RECORD_HEAD_BYTES};
pub use snapshot::{LogSnapshot, SnapshotFile, SnapshotManifest, SnapshotStaging, StagedFile};

use crate::format::{AMNESIAC_FILE, CLUSTER_FILE, VOTE_FILE};
/// The committed index's file.
const COMMITTED_FILE: &str = "COMMITTED";
/// The last purged entry's file.
const PURGED_FILE: &str = "PURGED";

/// An entry's log id: its index and the term it was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId {
    /// The term (compared first: a log id of a later term is greater).
    pub term: u64,
    /// The index, consecutive from 1 along the log.
    pub index: u64,
}

/// What an entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryPayload {
    /// Nothing (a new leader's first entry).
    Blank,
    /// A cluster configuration, opaque to the engine.
    Membership(Vec<u8>),
    /// The records of one atomic group, as the engine's planner encoded them.
    Records(Proposal),
}

/// One log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Its log id.
    pub id: EntryId,
    /// What it holds.
    pub payload: EntryPayload,
}

/// Where the log stands: the last purged entry and the last entry (the purged one when no
/// entry is left after it; `None` for a log that never held one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryLogState {
    /// The last entry purged (the log holds none at or below it).
    pub last_purged: Option<EntryId>,
    /// The last entry.
    pub last: Option<EntryId>,
}

/// Options for [`EntryLog::open`].
#[derive(Debug, Clone)]
pub struct EntryLogConfig {
    /// The data directory (created if missing).
    pub dir: PathBuf,
    /// A segment rolls once it holds this many bytes *and* every entry in it is committed.
    pub segment_bytes_max: u64,
}

impl EntryLogConfig {
    /// Defaults for `dir`: 64 MiB segments.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            segment_bytes_max: 64 * 1024 * 1024,
        }
    }
}

/// The segment log driven entry by entry. Cloning gives another handle on the same log
/// (a reader while a writer appends); calls are serialized.
#[derive(Debug, Clone)]
pub struct EntryLog {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    log: Arc<Log>,
    writer: LogWriter,
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    segment_bytes_max: u64,
    /// Per segment (by base entry): the offset of each entry's first frame, built on first use.
    offsets: BTreeMap<u64, SegmentEntries>,
    committed: Option<EntryId>,
    purged: Option<Purged>,
    /// Set after an I/O failure left the log's state on disk unknown.
    poisoned: Option<String>,
    /// `COMMITTED`, kept open: it is rewritten in place on every commit.
    committed_file: Option<Arc<dyn crate::fs::SegmentFile>>,
    /// The last entry known durable: entries after it were [`EntryLog::write`]n and await
    /// an [`EntryLog::sync`].
    durable: u64,
    /// The committed index the `COMMITTED` file was last given (never above `durable`).
    committed_saved: u64,
    /// The entries written last, answered without reading the segment (`tail.rs`).
    tail: tail::Tail,
    _lock: File,
}

/// A segment's entries (keyed in [`Inner::offsets`] by the segment's first entry).
#[derive(Debug)]
struct SegmentEntries {
    segment: Arc<Segment>,
    /// Offsets of the first frame of entries `base_entry ..`; `None` until first needed.
    offsets: Option<Vec<u64>>,
}

impl EntryLog {
    /// Opens (creating) the entry log in `config.dir`: takes the directory lock, upgrades an
    /// older format, cuts a torn unsynced tail, and reads the vote, committed and purged
    /// files. Every write is synced before it returns (`SyncPolicy::Always`).
    ///
    /// # Errors
    /// The directory is locked by another process ([`Error::Locked`]); corruption of synced
    /// data; I/O failures.
    pub fn open(config: EntryLogConfig) -> Result<Self> {
        Self::open_with_fs(config, Arc::new(StdFs))
    }

    /// [`EntryLog::open`] on another file system (the fault-injecting one in tests).
    ///
    /// # Errors
    /// As [`EntryLog::open`].
    pub fn open_with_fs(config: EntryLogConfig, fs: Arc<dyn FileSystem>) -> Result<Self> {
        std::fs::create_dir_all(&config.dir)
            .map_err(Error::io(format!("creating {}", config.dir.display())))?;
        let lock = crate::recovery::lock_dir(&config.dir)?;
        // A snapshot install a crash interrupted is finished (or an unfinished transfer
        // dropped) before the log is read.
        snapshot::recover(fs.as_ref(), &config.dir)?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let opened = crate::log::open(&fs, &config.dir, SyncPolicy::Always, &clock)?;
        let mut offsets = BTreeMap::new();
        for segment in opened.log.all() {
            let header = segment.header()?;
            offsets.insert(
                header.base_entry,
                SegmentEntries {
                    segment,
                    offsets: None,
                },
            );
        }
        let committed = match durable_file::read(fs.as_ref(), &config.dir, COMMITTED_FILE)? {
            Read::Body(b) => decode_entry_id(&b),
            Read::Missing | Read::Damaged => None,
        };
        // What was purged is what the PURGED file says (written before any segment goes): a
        // log may also start after entry 1 without a purge (its first entry was there). A
        // damaged file is replaced by what the first segment's header says precedes it.
        let purged = match durable_file::read(fs.as_ref(), &config.dir, PURGED_FILE)? {
            Read::Missing => None,
            Read::Body(b) => match Purged::decode(&b) {
                Some(p) => Some(p),
                None => purged_by_first_segment(&opened.log, &config.dir)?,
            },
            Read::Damaged => purged_by_first_segment(&opened.log, &config.dir)?,
        };
        // A purged entry was applied, so committed: `COMMITTED` is never below `PURGED`, even
        // if a power loss took an older build's unsynced `COMMITTED` (review R7).
        let committed = match (committed, purged.map(|p| p.id)) {
            (Some(c), Some(p)) if p.index > c.index => Some(p),
            (None, Some(p)) => Some(p),
            (c, _) => c,
        };
        let mut inner = Inner {
            log: Arc::clone(&opened.log),
            writer: opened.writer,
            fs,
            dir: config.dir,
            segment_bytes_max: config.segment_bytes_max,
            offsets,
            committed,
            purged,
            poisoned: None,
            committed_file: None,
            durable: 0,
            committed_saved: committed.map_or(0, |c| c.index),
            tail: tail::Tail::default(),
            _lock: lock,
        };
        // Open synced the tail: everything the log holds is durable.
        inner.note_durable();
        // A crash part way through a purge (or a truncation after one) is finished now.
        inner.finish_purge()?;
        let log = Self {
            inner: Arc::new(Mutex::new(inner)),
        };
        log.check_committed()?;
        Ok(log)
    }

    /// Refuses a log that ends before its committed entry: it lost synced writes (a torn or
    /// damaged disk, a restored backup). Raft assumes a member keeps what it acknowledged; a
    /// member that did not could vote for a leader lacking acknowledged entries, so it does
    /// not start (the error says how to bring it back).
    fn check_committed(&self) -> Result<()> {
        let last = self.state().last;
        let inner = self.lock();
        match inner.committed {
            Some(committed) if last.is_none_or(|l| l.index < committed.index) => {
                Err(Error::Corruption {
                    segment: inner.dir.join(COMMITTED_FILE),
                    offset: 0,
                    kind: crate::error::CorruptionKind::LostCommitted {
                        committed: committed.index,
                        last: last.map(|l| l.index),
                    },
                })
            }
            _ => Ok(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The last purged entry and the last entry.
    pub fn state(&self) -> EntryLogState {
        let inner = self.lock();
        let next = inner.writer.next();
        let last = (next.entry > 1)
            .then(|| EntryId {
                term: next.prev_term,
                index: next.entry - 1,
            })
            .filter(|l| inner.purged.is_none_or(|p| l.index > p.id.index))
            .or(inner.purged.map(|p| p.id));
        EntryLogState {
            last_purged: inner.purged.map(|p| p.id),
            last,
        }
    }

    /// The committed entries in `from..to`, frame by frame with LSNs and positions: what a
    /// replica's engine applies (`replica.rs`).
    pub(crate) fn read_placed(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<(EntryId, Vec<read::PlacedFrame>)>> {
        self.lock().read_placed(from, to)
    }

    /// The segments, shared with a replica's engine so its reads see what this log writes.
    pub(crate) fn segments(&self) -> Arc<Log> {
        Arc::clone(&self.lock().log)
    }

    /// The data directory.
    pub(crate) fn dir(&self) -> PathBuf {
        self.lock().dir.clone()
    }

    /// The LSN the next record gets: a function of the entries the log holds and of where it
    /// was started or restarted (a snapshot must carry it; see `docs/REPLICATION.md`).
    pub fn next_lsn(&self) -> u64 {
        self.lock().writer.next().lsn
    }

    /// Appends `entries`, which must follow the last entry (consecutive indexes, terms never
    /// below the last), and syncs them: on return they are durable and readable.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for entries that do not follow (nothing written);
    /// An I/O error of kind "storage full" when the disk is full (nothing
    /// written; writing may go on once space returns); any other I/O failure (the log then
    /// refuses further writes: its state on disk is unknown).
    pub fn append(&self, entries: &[LogEntry]) -> Result<()> {
        let mut inner = self.lock();
        inner.check_usable()?;
        let r = inner.append(entries, true);
        inner.poison_on_io(&r);
        r?;
        inner.save_committed_if_durable()
    }

    /// Appends `entries` as [`EntryLog::append`] does, without syncing them: on return they
    /// are readable (a leader may send them to its followers) but durable only after an
    /// [`EntryLog::sync`]. This lets a Raft log store report its flush later, from a sync
    /// shared by many appends, instead of holding its caller through every `fdatasync`.
    ///
    /// # Errors
    /// As [`EntryLog::append`].
    pub fn write(&self, entries: &[LogEntry]) -> Result<()> {
        let mut inner = self.lock();
        inner.check_usable()?;
        let r = inner.append(entries, false);
        inner.poison_on_io(&r);
        r
    }

    /// [`EntryLog::write`] unless the log is busy (its lock held by another call): `None`
    /// then, and nothing was written. It does not wait for the lock, so an async caller may
    /// call it on its own thread and fall back to a blocking thread only when it is busy:
    /// the write itself is a `pwrite` into the page cache, without a sync.
    pub fn try_write(&self, entries: &[LogEntry]) -> Option<Result<()>> {
        let mut inner = self.try_lock()?;
        if let Err(e) = inner.check_usable() {
            return Some(Err(e));
        }
        let r = inner.append(entries, false);
        inner.poison_on_io(&r);
        Some(r)
    }

    /// [`EntryLog::save_committed`] unless the log is busy: `None` then, and nothing was
    /// saved (see [`EntryLog::try_write`]).
    pub fn try_save_committed(&self, committed: EntryId) -> Option<Result<()>> {
        let mut inner = self.try_lock()?;
        if inner.committed.is_none_or(|c| c.index < committed.index) {
            inner.committed = Some(committed);
        }
        Some(inner.save_committed_if_durable())
    }

    /// The log's lock, unless another call holds it.
    fn try_lock(&self) -> Option<MutexGuard<'_, Inner>> {
        match self.inner.try_lock() {
            Ok(inner) => Some(inner),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Makes every entry written so far durable, and returns the last durable entry's
    /// index. The `fdatasync` runs outside the log's lock: reads and writes go on meanwhile
    /// (what they write waits for the next sync).
    ///
    /// # Errors
    /// I/O failures: the log then refuses further writes (the page cache's state is
    /// unknown), as after a failed append.
    pub fn sync(&self) -> Result<u64> {
        let (point, through) = {
            let mut inner = self.lock();
            inner.check_usable()?;
            match inner.writer.sync_point() {
                Some(point) => (point, inner.writer.next().entry.saturating_sub(1)),
                None => {
                    inner.note_durable();
                    return Ok(inner.durable);
                }
            }
        };
        let r = point.sync();
        let mut inner = self.lock();
        if let Err(e) = r {
            inner.poisoned = Some(e.to_string());
            return Err(e);
        }
        if inner.writer.synced_outside(&point) {
            inner.durable = inner.durable.max(through);
        }
        inner.note_durable();
        inner.save_committed_if_durable()?;
        Ok(inner.durable)
    }

    /// The last entry known durable (entries after it were written and await a sync).
    pub fn durable(&self) -> u64 {
        self.lock().durable
    }

    /// Syncs unless entry `index` is durable already (a replica applies only durable
    /// entries: its index must never be ahead of what a power loss leaves in its log).
    ///
    /// # Errors
    /// As [`EntryLog::sync`].
    pub fn sync_through(&self, index: u64) -> Result<()> {
        if self.lock().durable >= index {
            return Ok(());
        }
        self.sync().map(drop)
    }

    /// The entries with indexes in `from..to` that the log holds (fewer at either end if it
    /// holds fewer).
    ///
    /// # Errors
    /// Corruption of a stored frame (naming file and offset); I/O failures.
    pub fn read(&self, from: u64, to: u64) -> Result<Vec<LogEntry>> {
        let mut inner = self.lock();
        inner.read(from, to)
    }

    /// [`EntryLog::read`]'s answer when the entries written last, kept in memory, hold
    /// `from`, and the log is not busy; `None` otherwise (then [`EntryLog::read`] answers).
    /// It never waits for the log's lock nor does I/O, so an async caller may call it on
    /// its own thread: replication sends new entries without a hop to a blocking thread.
    pub fn read_cached(&self, from: u64, to: u64) -> Option<Vec<LogEntry>> {
        let inner = self.try_lock()?;
        let first = inner.purged.map_or(1, |p| p.id.index + 1);
        let (from, to) = (from.max(first), to.min(inner.writer.next().entry));
        inner.tail.entries(from, to)
    }

    /// Removes every entry after `keep` (all of them for `None`): a deposed leader's
    /// uncommitted suffix. Whole later segments are unlinked and the active one is cut.
    ///
    /// # Errors
    /// The cut would remove a committed entry or reach into a sealed segment (nothing is
    /// cut: [`Error::Internal`], a bug in the caller); I/O failures.
    pub fn truncate_after(&self, keep: Option<u64>) -> Result<()> {
        let mut inner = self.lock();
        inner.check_usable()?;
        let r = inner.truncate_after(keep);
        match &r {
            Ok(()) => inner.tail.truncate_after(keep.unwrap_or(0)),
            Err(_) => inner.tail.clear(),
        }
        inner.poison_on_io(&r);
        // A cut syncs what it keeps; entries it removed are durable no more.
        inner.durable = inner.durable.min(keep.unwrap_or(0));
        inner.note_durable();
        r
    }

    /// Marks every entry up to `through` purged, and deletes the sealed segments that hold
    /// only such entries. Entries a segment still holds beside later ones stay readable.
    ///
    /// # Errors
    /// I/O failures.
    pub fn purge_through(&self, through: EntryId) -> Result<()> {
        let mut inner = self.lock();
        inner.check_usable()?;
        // What is purged was applied, so committed and durable: `COMMITTED` must say so,
        // durably, before `PURGED` does (recovery replays the log up to it; a power loss
        // that kept `PURGED` and lost an unsynced `COMMITTED` left a member that would not
        // start: issue 30 item 5, review R7). One synced write per purge.
        inner.save_committed_durably()?;
        let r = inner.purge_through(through);
        match &r {
            Ok(()) => inner.tail.drop_through(through.index),
            Err(_) => inner.tail.clear(),
        }
        inner.poison_on_io(&r);
        inner.note_durable();
        r
    }

    /// Records the last committed entry: segments may now be sealed up to it. Saved without
    /// an fsync (a lost value only costs re-applying entries after a restart), and only
    /// once this log's own copy of the entry is durable. A value below the one known is
    /// ignored (the committed index never goes back).
    ///
    /// # Errors
    /// I/O failures writing the file.
    pub fn save_committed(&self, committed: EntryId) -> Result<()> {
        let mut inner = self.lock();
        if inner.committed.is_none_or(|c| c.index < committed.index) {
            inner.committed = Some(committed);
        }
        inner.save_committed_if_durable()
    }

    /// The last committed entry saved, if any.
    pub fn committed(&self) -> Option<EntryId> {
        self.lock().committed
    }

    /// Saves the vote durably (it is on disk when this returns).
    ///
    /// # Errors
    /// I/O failures; the previous vote is then still in place.
    pub fn save_vote(&self, vote: &[u8]) -> Result<()> {
        let inner = self.lock();
        durable_file::write(inner.fs.as_ref(), &inner.dir, VOTE_FILE, vote)
    }

    /// The vote saved last, if any.
    ///
    /// # Errors
    /// A damaged vote file (refused, never guessed: a node that forgot its vote could vote
    /// twice in a term); I/O failures.
    pub fn read_vote(&self) -> Result<Option<Vec<u8>>> {
        self.read_small(VOTE_FILE, "vote")
    }

    /// Saves the identity of the cluster this member belongs to, durably.
    ///
    /// # Errors
    /// I/O failures; no identity is then saved.
    pub fn save_cluster(&self, id: &[u8]) -> Result<()> {
        let inner = self.lock();
        durable_file::write(inner.fs.as_ref(), &inner.dir, CLUSTER_FILE, id)
    }

    /// The cluster identity saved, if any.
    ///
    /// # Errors
    /// A damaged file (refused, never guessed: a member that forgot its cluster could take
    /// another cluster's entries); I/O failures.
    pub fn read_cluster(&self) -> Result<Option<Vec<u8>>> {
        self.read_small(CLUSTER_FILE, "cluster identity")
    }

    /// Marks this member as one that may have lost its vote and log (`on`: it started on a
    /// new or wiped directory), or clears the mark (it caught up with a leader), durably.
    ///
    /// # Errors
    /// I/O failures; the mark is then as it was.
    pub fn mark_amnesiac(&self, on: bool) -> Result<()> {
        let inner = self.lock();
        if on {
            durable_file::write(inner.fs.as_ref(), &inner.dir, AMNESIAC_FILE, b"amnesiac")
        } else {
            durable_file::remove(inner.fs.as_ref(), &inner.dir, AMNESIAC_FILE)
        }
    }

    /// Whether the amnesiac mark is present. A damaged mark counts as present (the guard
    /// it keeps only delays this member's vote).
    ///
    /// # Errors
    /// I/O failures.
    pub fn amnesiac(&self) -> Result<bool> {
        let inner = self.lock();
        Ok(!matches!(
            durable_file::read(inner.fs.as_ref(), &inner.dir, AMNESIAC_FILE)?,
            Read::Missing
        ))
    }

    /// A small checksummed file of this log's directory: missing, or its body.
    fn read_small(&self, name: &str, what: &str) -> Result<Option<Vec<u8>>> {
        let inner = self.lock();
        match durable_file::read(inner.fs.as_ref(), &inner.dir, name)? {
            Read::Missing => Ok(None),
            Read::Body(b) => Ok(Some(b)),
            Read::Damaged => Err(Error::Corruption {
                segment: inner.dir.join(name),
                offset: 0,
                kind: CorruptionKind::BadBody(format!("the {what} file's checksum does not match")),
            }),
        }
    }
}

impl Inner {
    /// Writes `COMMITTED` when the committed entry known is durable here and not saved yet.
    ///
    /// A member may learn that entries are committed before its own copy of them is synced:
    /// saving that at once could leave a log that, after a power loss, ends before its
    /// committed entry (and refuses to open). The sync that makes it durable saves it, so
    /// the file never lags the durable entries either: a purge (which follows a snapshot of
    /// applied entries) never runs ahead of it, and recovery replays what was applied.
    ///
    /// Rewritten in place, with no rename and no fsync: openraft saves the committed entry
    /// on every commit, and a lost, stale or torn value (the CRC tells) only costs
    /// re-applying entries. Replacing the file each time (unlink, create, rename) cost
    /// replicated appends up to half their throughput (benches/HISTORY.md, "Replication
    /// cost"); a write in place of a few bytes under the lock keeps the saves in order.
    fn save_committed_if_durable(&mut self) -> Result<()> {
        let Some(committed) = self.committed else {
            return Ok(());
        };
        if committed.index > self.durable || self.committed_saved >= committed.index {
            return Ok(());
        }
        let file = self.committed_file()?;
        file.write_all_at(&durable_file::framed(&encode_entry_id(committed)), 0)
            .map_err(Error::io("writing the COMMITTED file"))?;
        self.committed_saved = committed.index;
        Ok(())
    }

    /// Saves the committed entry (if this log's copy of it is durable) as a durable file:
    /// written aside, synced, renamed, the directory synced. The in-place handle is dropped,
    /// since it names the replaced file; the next commit opens the new one.
    fn save_committed_durably(&mut self) -> Result<()> {
        let Some(committed) = self.committed else {
            return Ok(());
        };
        if committed.index > self.durable {
            return Ok(());
        }
        self.committed_file = None;
        durable_file::write(
            self.fs.as_ref(),
            &self.dir,
            COMMITTED_FILE,
            &encode_entry_id(committed),
        )?;
        self.committed_saved = committed.index;
        Ok(())
    }

    fn committed_index(&self) -> u64 {
        self.committed.map_or(0, |c| c.index)
    }

    /// The open `COMMITTED` file (created on first use).
    fn committed_file(&mut self) -> Result<Arc<dyn crate::fs::SegmentFile>> {
        if let Some(f) = &self.committed_file {
            return Ok(Arc::clone(f));
        }
        let path = self.dir.join(COMMITTED_FILE);
        let file = match self.fs.open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self
                .fs
                .create_new(&path)
                .map_err(Error::io(format!("creating {}", path.display())))?,
            Err(e) => return Err(Error::io(format!("opening {}", path.display()))(e)),
        };
        self.committed_file = Some(Arc::clone(&file));
        Ok(file)
    }

    /// After an I/O failure other than a full disk (whose writes leave nothing behind), the
    /// state on disk is unknown: the log refuses further writes until it is opened again.
    fn poison_on_io<T>(&mut self, r: &Result<T>) {
        if let Err(e) = r {
            if matches!(e, Error::Io { .. }) && !e.is_no_space() {
                self.poisoned = Some(e.to_string());
            }
        }
    }

    fn check_usable(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(Error::Internal(format!(
                "the entry log stopped writing after a failure: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn append(&mut self, entries: &[LogEntry], sync: bool) -> Result<()> {
        // A log that never held an entry starts wherever its first entry is (Raft allows
        // it): once the batch is checked, the empty active segment is replaced by one that
        // starts there.
        let start_at = entries
            .first()
            .filter(|first| self.is_empty() && first.id.index > self.writer.next().entry)
            .map(|first| LogPoint {
                lsn: self.writer.next().lsn,
                entry: first.id.index,
                prev_term: 0,
            });
        let mut expected = start_at.unwrap_or_else(|| self.writer.next());
        for e in entries {
            if e.id.index != expected.entry || e.id.term < expected.prev_term {
                return Err(Error::invalid(
                    "entry",
                    format!(
                        "entry {:?} does not follow entry {} of term {}",
                        e.id,
                        expected.entry - 1,
                        expected.prev_term
                    ),
                ));
            }
            expected.entry += 1;
            expected.prev_term = e.id.term;
        }
        let records = entries
            .iter()
            .map(|e| e.payload.records())
            .collect::<Result<Vec<_>>>()?;
        if let Some(at) = start_at {
            self.restart_active(at)?;
            self.note_durable();
        }
        // A batch goes whole into one segment: the active one rolls only before it, and only
        // once every entry in it is committed (it may overrun its size by a batch).
        if self.rotate_due() {
            self.writer
                .rotate_if_full(self.segment_bytes_max)
                .map_err(|w| self.write_failed(w))?;
            self.track_active();
            // Sealing synced the segment that was active.
            self.note_durable();
        }
        let start = self.writer.next();
        let frame_bytes: usize = records
            .iter()
            .flatten()
            .map(|(_, body)| FRAME_HEADER_BYTES + body.len())
            .sum();
        let mut buf = Vec::with_capacity(frame_bytes);
        let mut placed = Vec::with_capacity(entries.len());
        for (e, records) in entries.iter().zip(&records) {
            let offset = self.writer.active().len() + buf.len() as u64;
            for (i, (tag, body)) in records.iter().enumerate() {
                let stamp = self.writer.stamp_in_term(e.id.term, i, records.len());
                if let Err(why) = encode_raw_frame(*tag, body, stamp, &mut buf) {
                    self.writer.rewind(start);
                    return Err(Error::invalid("entry", why));
                }
            }
            placed.push((offset, self.writer.next().lsn));
            self.writer.advance_in_term(records.len(), e.id.term);
        }
        self.flush(&buf, start, sync)?;
        let segment = self.writer.active().base_lsn();
        for ((e, records), &(offset, lsn)) in entries.iter().zip(records).zip(&placed) {
            self.tail.push(e, records, segment, offset, lsn);
        }
        if let Some(active) = self.offsets.values_mut().next_back() {
            if let Some(o) = active.offsets.as_mut() {
                o.extend(placed.iter().map(|&(offset, _)| offset));
            }
        }
        Ok(())
    }

    /// True when the log holds no entry and never purged one.
    fn is_empty(&self) -> bool {
        self.purged.is_none()
            && self.offsets.len() == 1
            && self.writer.active().len() == crate::format::SEGMENT_HEADER_BYTES as u64
    }

    /// True when the active segment is full and every entry in it is committed.
    fn rotate_due(&self) -> bool {
        self.writer.active().len() >= self.segment_bytes_max
            && self.writer.next().entry.saturating_sub(1) <= self.committed_index()
    }

    /// Writes `buf` (frames from `start` on) and, when `sync`, syncs it; on failure rewinds
    /// to `start`.
    fn flush(&mut self, buf: &[u8], start: LogPoint, sync: bool) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if let Err(w) = self.writer.write(buf) {
            let e = self.write_failed(w);
            self.writer.rewind(start);
            return Err(e);
        }
        if sync {
            self.writer
                .sync()
                .inspect_err(|e| self.poisoned = Some(e.to_string()))?;
            self.note_durable();
        }
        Ok(())
    }

    /// When nothing written awaits a sync, every entry the log holds is durable.
    fn note_durable(&mut self) {
        if !self.writer.has_unsynced() {
            self.durable = self.writer.next().entry.saturating_sub(1);
        }
    }

    fn write_failed(&mut self, w: WriteError) -> Error {
        match w {
            // Nothing of the write stayed in the file: the log is as it was.
            WriteError::NoSpace(e) => e,
            WriteError::Fatal(e) => {
                self.poisoned = Some(e.to_string());
                e
            }
        }
    }

    /// Registers the writer's active segment after a roll or a restart: it starts at the
    /// writer's next entry and holds none yet.
    fn track_active(&mut self) {
        let active = Arc::clone(self.writer.active());
        let base = self.writer.next().entry;
        self.offsets.insert(
            base,
            SegmentEntries {
                segment: active,
                offsets: Some(Vec::new()),
            },
        );
    }
}

impl EntryPayload {
    /// The records the entry is written as (at least one), as tag and body: each checked to
    /// be a record of its type, as a full decode would check it (an event's body, nearly
    /// every record, is checked in place, without building the record).
    fn records(&self) -> Result<Vec<(u8, Bytes)>> {
        match self {
            Self::Blank => Ok(vec![(tag::BLANK, Bytes::new())]),
            Self::Membership(config) => Ok(vec![(tag::MEMBERSHIP, Bytes::copy_from_slice(config))]),
            Self::Records(p) => {
                let records = p
                    .raw()
                    .map_err(|e| Error::invalid("entry", e.to_string()))?;
                for (index, (tag, body)) in records.iter().enumerate() {
                    check_record(*tag, body).map_err(|why| {
                        Error::invalid("entry", ProposalError::BadRecord { index, why }.to_string())
                    })?;
                }
                // The log's own kinds are not the engine's to propose (a lone Blank or
                // Membership record would read back as that kind of entry).
                match records
                    .iter()
                    .position(|(t, _)| matches!(*t, tag::BLANK | tag::MEMBERSHIP | tag::SHUTDOWN))
                {
                    Some(i) => Err(Error::invalid(
                        "entry",
                        format!("record {i} of the proposal is not an engine record"),
                    )),
                    None => Ok(records),
                }
            }
        }
    }
}

/// Checks that `body` is a record of type `tag` (what [`Record::decode`] accepts).
fn check_record(tag: u8, body: &[u8]) -> std::result::Result<(), String> {
    if tag == tag::EVENT {
        decode_event_view(body).map(drop)
    } else {
        Record::decode(tag, body).map(drop)
    }
}

/// Appends one frame of a record of type `tag` with body `body` (encoded already) to `out`.
fn encode_raw_frame(
    tag: u8,
    body: &[u8],
    stamp: FrameStamp,
    out: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let body_len = u32::try_from(body.len())
        .ok()
        .filter(|n| *n <= BODY_BYTES_MAX)
        .ok_or_else(|| {
            format!(
                "record body of {} bytes exceeds {BODY_BYTES_MAX}",
                body.len()
            )
        })?;
    let header = FrameHeader {
        body_len,
        crc: 0,
        lsn: stamp.lsn,
        synced_through: stamp.synced_through,
        entry: stamp.entry,
        term: stamp.term,
        group_left: stamp.group_left,
        record_type: tag,
    };
    out.extend_from_slice(&header.write(body));
    out.extend_from_slice(body);
    Ok(())
}

fn decode_u64(b: &[u8]) -> Option<u64> {
    b.try_into().ok().map(u64::from_le_bytes)
}

/// What precedes the first segment, as its header says (a damaged `PURGED` file's
/// stand-in): nothing if it starts at entry 1.
fn purged_by_first_segment(log: &Log, dir: &std::path::Path) -> Result<Option<Purged>> {
    tracing::warn!(dir = %dir.display(), "the PURGED file is damaged: taking what was purged from the first segment");
    let Some(first) = log.all().into_iter().next() else {
        return Ok(None);
    };
    let h = first.header()?;
    Ok((h.base_entry > 1).then_some(Purged {
        id: EntryId {
            term: h.prev_term,
            index: h.base_entry - 1,
        },
        lsn_after: h.base_lsn,
    }))
}

fn encode_entry_id(id: EntryId) -> Vec<u8> {
    let mut b = id.term.to_le_bytes().to_vec();
    b.extend_from_slice(&id.index.to_le_bytes());
    b
}

fn decode_entry_id(b: &[u8]) -> Option<EntryId> {
    Some(EntryId {
        term: decode_u64(b.get(..8)?)?,
        index: decode_u64(b.get(8..16)?)?,
    })
}

#[cfg(test)]
mod tests;
