//! The log: the ordered set of segment files and everything that touches them.
//!
//! It owns segment creation and rotation, the group write and its sync, the one frame
//! walker ([`frames`]), positioned reads (through [`Segment`]), ordered deletion of a
//! retired prefix, and the descriptor policy (the active segment holds one read-write
//! descriptor; sealed segments are mapped and hold none). Recovery, verify, retention,
//! reads and the writer all reach segment files through it.
//!
//! It is shaped to become the log of a replicated group later (see `engine/FORMAT.md`,
//! "Terms"): entries carry a term (per segment, from its header), an unsynced suffix
//! is cut only in the active segment ([`open`]), a committed prefix is purged in order
//! ([`Log::purge_prefix`]), and the index applies records only after they are written and
//! synced (the writer's commit is the seam where "apply after commit" would go).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::clock::Clock;
use crate::config::SyncPolicy;
use crate::error::{Error, Result};
use crate::format::{segment_name, SegmentHeader, SyncPolicyTag, BOOT_ID_BYTES};
use crate::fs::FileSystem;

mod clean;
pub(crate) mod durable_file;
pub(crate) mod events;
pub(crate) mod frames;
mod open;
mod segment;
mod summary;
mod upgrade;

pub(crate) use clean::CleanMark;
pub(crate) use open::{header_error, list_segments, open, PreviousRun};
pub(crate) use segment::{sync_dir, Segment};
pub(crate) use summary::Summaries;

/// Where a record lives: its segment (by base LSN), byte offset and frame length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

impl Position {
    /// Encoded size in the index.
    pub(crate) const BYTES: usize = 20;

    pub(crate) fn encode(self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..8].copy_from_slice(&self.segment.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let segment = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let offset = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        let len = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?);
        (b.len() == Self::BYTES).then_some(Self {
            segment,
            offset,
            len,
        })
    }
}

/// The live segments, ordered by base LSN; the last one is the active segment.
#[derive(Debug)]
pub(crate) struct Log {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
}

impl Log {
    pub(crate) fn new(fs: Arc<dyn FileSystem>, dir: PathBuf) -> Self {
        Self {
            fs,
            dir,
            segments: RwLock::default(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<u64, Arc<Segment>>> {
        self.segments
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, Arc<Segment>>> {
        self.segments
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The file system segments live on.
    pub(crate) fn fs(&self) -> &Arc<dyn FileSystem> {
        &self.fs
    }

    /// The data directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adds a segment (open, rotation).
    pub(crate) fn insert(&self, segment: Arc<Segment>) {
        self.write().insert(segment.base_lsn(), segment);
    }

    /// The segment with this base LSN.
    pub(crate) fn get(&self, base_lsn: u64) -> Option<Arc<Segment>> {
        self.read().get(&base_lsn).cloned()
    }

    /// All segments in LSN order.
    pub(crate) fn all(&self) -> Vec<Arc<Segment>> {
        self.read().values().cloned().collect()
    }

    /// Number of segments.
    pub(crate) fn count(&self) -> usize {
        self.read().len()
    }

    /// Bytes across all segments.
    pub(crate) fn total_bytes(&self) -> u64 {
        self.read().values().map(|s| s.len()).sum()
    }

    /// Segment files holding an open descriptor (the active one; sealed ones hold none).
    pub(crate) fn descriptors(&self) -> usize {
        self.read()
            .values()
            .filter(|s| s.holds_descriptor())
            .count()
    }

    /// Deletes the newest segments, `bases` (which must be the set's newest, in ascending
    /// order), newest first, the directory synced after each unlink: a crash part way leaves
    /// a contiguous prefix of the log. A replicated log's uncommitted suffix; the caller then
    /// starts a new active segment.
    ///
    /// # Errors
    /// The set's suffix is not `bases` (a bug: nothing is deleted); an unlink or directory
    /// sync failed.
    pub(crate) fn remove_suffix(&self, bases: &[u64]) -> Result<()> {
        let removed: Vec<Arc<Segment>> = {
            let mut map = self.write();
            let suffix: Vec<u64> = map.keys().rev().take(bases.len()).rev().copied().collect();
            if suffix != bases {
                return Err(Error::Internal(format!(
                    "removing segments {bases:?}, but the newest are {suffix:?}"
                )));
            }
            bases.iter().filter_map(|b| map.remove(b)).collect()
        };
        for seg in removed.iter().rev() {
            self.fs
                .remove(seg.path())
                .map_err(Error::io(format!("deleting {}", seg.path().display())))?;
            sync_dir(self.fs.as_ref(), &self.dir)?;
        }
        Ok(())
    }

    /// Deletes the oldest segments, `bases` (which must be the set's oldest, in order, and
    /// never the active one): they leave the set at once, then their files are unlinked
    /// oldest first, the directory synced after each unlink, outside the set's lock. A crash part
    /// way leaves a contiguous suffix of them, never a hole in the log. Readers holding
    /// their maps keep reading (an unlinked file's pages live until the last map goes).
    ///
    /// # Errors
    /// The set's prefix is not `bases` (a bug: nothing is deleted); an unlink or the
    /// directory sync failed (the files from the failed one on stay; they are dead and
    /// retired again after a restart).
    pub(crate) fn purge_prefix(&self, bases: &[u64]) -> Result<Vec<PathBuf>> {
        let removed: Vec<Arc<Segment>> = {
            let mut map = self.write();
            let prefix: Vec<u64> = map.keys().take(bases.len()).copied().collect();
            if prefix != bases || map.len() <= bases.len() {
                return Err(Error::Internal(format!(
                    "retiring segments {bases:?}, but the oldest are {prefix:?} of {}",
                    map.len()
                )));
            }
            bases.iter().filter_map(|b| map.remove(b)).collect()
        };
        // Oldest first, each unlink made durable before the next: unsynced directory updates
        // reach the disk in any order, and a crash that kept a later unlink but not an
        // earlier one would leave a hole in the LSNs that no recovery can close. With this
        // order a crash leaves a contiguous suffix, which is a valid log.
        let mut paths = Vec::with_capacity(removed.len());
        for seg in &removed {
            self.fs
                .remove(seg.path())
                .map_err(Error::io(format!("deleting {}", seg.path().display())))?;
            sync_dir(self.fs.as_ref(), &self.dir)?;
            paths.push(seg.path().to_path_buf());
        }
        Ok(paths)
    }
}

/// Why a group write failed.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// The file system is full. The partial write was cut off again: the log is exactly as
    /// before the write, and writing may go on once space returns.
    NoSpace(Error),
    /// Anything else: the log's state on disk is unknown; the engine must stop writing.
    Fatal(Error),
}

/// A place in the log: the LSN the next record gets and the entry (atomic group) it
/// belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogPoint {
    /// The next record's LSN.
    pub lsn: u64,
    /// The next group's entry index.
    pub entry: u64,
    /// The term of entry `entry - 1` (0 when there is none).
    pub prev_term: u64,
}

/// A prefix of the active segment to make durable outside the writer's lock (see
/// [`LogWriter::sync_point`]).
#[derive(Debug)]
pub(crate) struct SyncPoint {
    segment: Arc<Segment>,
    len: u64,
    cuts: u64,
}

impl SyncPoint {
    /// `fdatasync` of the segment. A segment sealed meanwhile was synced by sealing.
    ///
    /// # Errors
    /// I/O failures.
    pub(crate) fn sync(&self) -> Result<()> {
        match self.segment.sync_data() {
            Err(_) if self.segment.is_sealed() => Ok(()),
            r => r,
        }
    }
}

/// The writer's end of the log: the active segment, the next LSN and entry, and the sync
/// state. Only the writer thread holds it.
#[derive(Debug)]
pub(crate) struct LogWriter {
    log: Arc<Log>,
    active: Arc<Segment>,
    /// Where the next group goes. The writer advances it as it frames each group
    /// ([`LogWriter::advance`]) and puts it back ([`LogWriter::rewind`]) if a planned
    /// group is not written.
    next: LogPoint,
    /// Offset in the active segment below which everything is durable.
    synced_through: u64,
    /// Bumped whenever the active segment is cut or replaced in place, so a sync done
    /// outside the writer ([`LogWriter::sync_point`]) never vouches for bytes written after
    /// a cut.
    cuts: u64,
    /// The term of every entry this writer frames, and of the segments it creates.
    term: u64,
    sync: SyncPolicyTag,
    boot_id: [u8; BOOT_ID_BYTES],
    clock: Arc<dyn Clock>,
}

impl LogWriter {
    pub(crate) fn new(
        log: Arc<Log>,
        active: Arc<Segment>,
        next: LogPoint,
        term: u64,
        policy: SyncPolicy,
        boot_id: [u8; BOOT_ID_BYTES],
        clock: Arc<dyn Clock>,
    ) -> Self {
        // The caller synced `active` (a new segment is created synced; a continued tail is
        // synced at open): every frame this writer writes claims its bytes are durable.
        let synced_through = active.len();
        Self {
            log,
            active,
            next,
            synced_through,
            cuts: 0,
            term,
            sync: SyncPolicyTag::of(policy),
            boot_id,
            clock,
        }
    }

    /// The active segment.
    pub(crate) fn active(&self) -> &Arc<Segment> {
        &self.active
    }

    /// True when bytes were written since the last sync.
    pub(crate) fn has_unsynced(&self) -> bool {
        self.active.len() > self.synced_through
    }

    /// The LSN the next record gets.
    pub(crate) fn next_lsn(&self) -> u64 {
        self.next.lsn
    }

    /// Where the next group goes (to [`LogWriter::rewind`] to).
    pub(crate) fn next(&self) -> LogPoint {
        self.next
    }

    /// The frame header fields of record `i` of a group of `count` framed next.
    pub(crate) fn stamp(&self, i: usize, count: usize) -> crate::record::FrameStamp {
        crate::record::FrameStamp {
            lsn: self.next.lsn + i as u64,
            entry: self.next.entry,
            term: self.term,
            group_left: u32::try_from(count.saturating_sub(i + 1)).unwrap_or(u32::MAX),
            synced_through: self.synced_through,
        }
    }

    /// Moves past a framed group of `count` records (one entry; none for an empty group).
    pub(crate) fn advance(&mut self, count: usize) {
        if count > 0 {
            self.next = LogPoint {
                lsn: self.next.lsn + count as u64,
                entry: self.next.entry + 1,
                prev_term: self.term,
            };
        }
    }

    /// The frame header fields of record `i` of a group of `count` framed next as an entry
    /// of `term` (a replicated log's entry carries its leader's term, not this writer's).
    pub(crate) fn stamp_in_term(
        &self,
        term: u64,
        i: usize,
        count: usize,
    ) -> crate::record::FrameStamp {
        crate::record::FrameStamp {
            term,
            ..self.stamp(i, count)
        }
    }

    /// Moves past a framed group of `count` records framed as an entry of `term`; segments
    /// created from now on carry that term in their header.
    pub(crate) fn advance_in_term(&mut self, count: usize, term: u64) {
        self.term = term;
        self.advance(count);
    }

    /// Cuts the active segment back to `len` bytes (synced) and puts the next LSN and entry
    /// back to `to`: a replicated log's uncommitted suffix, never a sealed segment's bytes.
    ///
    /// # Errors
    /// The active segment is sealed (a bug: nothing is cut); I/O failures.
    pub(crate) fn cut_active(&mut self, len: u64, to: LogPoint) -> Result<()> {
        if self.active.is_sealed() || len < crate::format::SEGMENT_HEADER_BYTES as u64 {
            return Err(Error::Internal(format!(
                "cutting {} to {len} bytes",
                self.active.path().display()
            )));
        }
        self.active.truncate(len)?;
        self.synced_through = len;
        self.cuts += 1;
        self.next = to;
        Ok(())
    }

    /// Starts a new active segment at `to` after the active one was unlinked (a replicated
    /// log's uncommitted suffix went whole): the segment before it stays sealed.
    ///
    /// # Errors
    /// I/O failures creating the segment.
    pub(crate) fn restart_at(&mut self, to: LogPoint) -> Result<()> {
        let header = SegmentHeader {
            base_lsn: to.lsn,
            term: self.term.max(to.prev_term),
            sync: self.sync,
            boot_id: self.boot_id,
            created_at_ms: self.clock.now_ms(),
            base_entry: to.entry,
            prev_term: to.prev_term,
        };
        let next = Arc::new(Segment::create(
            Arc::clone(self.log.fs()),
            self.log.dir(),
            &header,
        )?);
        self.log.insert(Arc::clone(&next));
        self.synced_through = next.len();
        self.cuts += 1;
        self.active = next;
        self.next = to;
        Ok(())
    }

    /// Puts the next LSN and entry back to `to` after a planned group was not written.
    pub(crate) fn rewind(&mut self, to: LogPoint) {
        self.next = to;
    }

    /// What a clean close leaves beside the log: where it ends (everything synced).
    ///
    /// # Errors
    /// I/O failures (syncing the tail).
    pub(crate) fn close_cleanly(&mut self) -> Result<()> {
        self.sync()?;
        let mark = CleanMark {
            segment: self.active.base_lsn(),
            len: self.active.len(),
            last_lsn: self.next.lsn - 1,
            last_entry: self.next.entry - 1,
        };
        mark.write(self.log.fs().as_ref(), self.log.dir())
    }

    /// Seals the active segment and starts a new one once it holds `max_bytes`. The new
    /// segment is created first: if the disk is too full to create it, the active segment
    /// stays active (a little past its size) and the caller refuses the group as it refuses
    /// any write on a full disk.
    ///
    /// # Errors
    /// [`WriteError::NoSpace`] when the new segment cannot be created for lack of space
    /// (nothing changed: a partly created file is removed); [`WriteError::Fatal`] otherwise.
    pub(crate) fn rotate_if_full(&mut self, max_bytes: u64) -> std::result::Result<(), WriteError> {
        if self.active.len() < max_bytes {
            return Ok(());
        }
        let header = SegmentHeader {
            base_lsn: self.next.lsn,
            term: self.term,
            sync: self.sync,
            boot_id: self.boot_id,
            created_at_ms: self.clock.now_ms(),
            base_entry: self.next.entry,
            prev_term: self.next.prev_term,
        };
        let next = match Segment::create(Arc::clone(self.log.fs()), self.log.dir(), &header) {
            Ok(next) => Arc::new(next),
            Err(e) if e.is_no_space() => {
                // A creation cut short leaves a file without a complete header under the
                // name the next try needs: remove it (open would, too).
                let path = self.log.dir().join(segment_name(header.base_lsn));
                return match self.log.fs().remove(&path) {
                    Ok(()) => sync_dir(self.log.fs().as_ref(), self.log.dir()).map_or_else(
                        |e| Err(WriteError::Fatal(e)),
                        |()| Err(WriteError::NoSpace(e)),
                    ),
                    Err(gone) if gone.kind() == std::io::ErrorKind::NotFound => {
                        Err(WriteError::NoSpace(e))
                    }
                    Err(other) => Err(WriteError::Fatal(Error::io(format!(
                        "removing the partly created segment {}",
                        path.display()
                    ))(other))),
                };
            }
            Err(e) => return Err(WriteError::Fatal(e)),
        };
        self.active.seal().map_err(WriteError::Fatal)?;
        self.log.insert(Arc::clone(&next));
        self.synced_through = next.len();
        self.active = next;
        tracing::debug!(base_lsn = self.next.lsn, "rolled to a new segment");
        Ok(())
    }

    /// Writes one group commit's frames at the end of the active segment.
    ///
    /// # Errors
    /// [`WriteError::NoSpace`] when the disk is full (the log is left as it was);
    /// [`WriteError::Fatal`] otherwise.
    pub(crate) fn write(&mut self, frames: &[u8]) -> std::result::Result<(), WriteError> {
        if frames.is_empty() {
            return Ok(());
        }
        let before = self.active.len();
        match self.active.append(frames) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                let err = Error::io(format!("appending to {}", self.active.path().display()))(e);
                // Cut off whatever part of the write reached the file, so the log ends
                // where it did; if even that fails, nothing is certain any more.
                match self.active.truncate(before) {
                    Ok(()) => Err(WriteError::NoSpace(err)),
                    Err(cut) => Err(WriteError::Fatal(cut)),
                }
            }
            Err(e) => Err(WriteError::Fatal(Error::io(format!(
                "appending to {}",
                self.active.path().display()
            ))(e))),
        }
    }

    /// What a sync started now would make durable, when anything written is not yet: the
    /// caller syncs the segment outside its lock and reports back with
    /// [`LogWriter::synced_outside`].
    pub(crate) fn sync_point(&self) -> Option<SyncPoint> {
        self.has_unsynced().then(|| SyncPoint {
            segment: Arc::clone(&self.active),
            len: self.active.len(),
            cuts: self.cuts,
        })
    }

    /// Records a sync of `point` done outside the writer, and says whether it counted.
    /// It does not when the segment was sealed or replaced since (sealing synced it), or
    /// cut (the bytes past the cut may be new ones the sync did not cover).
    pub(crate) fn synced_outside(&mut self, point: &SyncPoint) -> bool {
        let counts = Arc::ptr_eq(&point.segment, &self.active) && point.cuts == self.cuts;
        if counts {
            self.synced_through = self.synced_through.max(point.len);
        }
        counts
    }

    /// `fdatasync` of the active segment.
    ///
    /// # Errors
    /// I/O failures: never retried (the page cache state is unknown); fatal for the writer.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.active.sync_data()?;
        self.synced_through = self.active.len();
        Ok(())
    }
}
