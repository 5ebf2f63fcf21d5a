//! The storage half of a replicated log: the segment log driven entry by entry, as a Raft
//! log store needs it (issue 19; the openraft glue is in the `cursorlog-replication`
//! crate, which maps this API onto `RaftLogStorage`).
//!
//! Entries are the log's atomic groups (FORMAT.md, "Entries and terms"): appended whole with
//! the term their leader gave them, synced (`fdatasync`) before [`EntryLog::append`]
//! returns, read back by index through an entry→offset table, and cut back only above the
//! committed index. Three rules keep the on-disk invariants of a single node:
//!
//! * **A segment is sealed only when every entry in it is committed** (the writer rolls to a
//!   new segment only at or below the committed index), so an uncommitted suffix is cut by
//!   unlinking whole later segments and cutting the active one: a sealed segment is never
//!   modified. A cut that would reach into a sealed segment is refused.
//! * **The vote is durable before it is acknowledged** (`VOTE`: temp file, fsync, rename,
//!   directory fsync); the committed index is saved without an fsync (`COMMITTED`: losing
//!   it only costs re-applying entries); the last purged entry too (`PURGED`).
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
use crate::format::{FrameHeader, FRAME_HEADER_BYTES};
use crate::fs::{FileSystem, StdFs};
use crate::log::durable_file::{self, Read};
use crate::log::frames::{walk, ReadAhead, Step, Windowed};
use crate::log::{Log, LogPoint, LogWriter, Segment, WriteError};
use crate::record::{check_frame, encode_frame, Record};

mod proposal;

pub use proposal::{Proposal, ProposalError, ProposedRecord};

/// The vote's file in the data directory.
const VOTE_FILE: &str = "VOTE";
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
    purged: Option<EntryId>,
    /// Set after an I/O failure left the log's state on disk unknown.
    poisoned: Option<String>,
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
        // log may also start after entry 1 without a purge (its first entry was there).
        let purged_by_file = match durable_file::read(fs.as_ref(), &config.dir, PURGED_FILE)? {
            Read::Body(b) => decode_entry_id(&b),
            Read::Missing | Read::Damaged => None,
        };
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                log: opened.log,
                writer: opened.writer,
                fs,
                dir: config.dir,
                segment_bytes_max: config.segment_bytes_max,
                offsets,
                committed,
                purged: purged_by_file,
                poisoned: None,
                _lock: lock,
            })),
        })
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
            .filter(|l| inner.purged.is_none_or(|p| l.index > p.index))
            .or(inner.purged);
        EntryLogState {
            last_purged: inner.purged,
            last,
        }
    }

    /// Appends `entries`, which must follow the last entry (consecutive indexes, terms never
    /// below the last), and syncs them: on return they are durable and readable.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for entries that do not follow (nothing written);
    /// An I/O error for which [`Error::is_no_space`] holds when the disk is full (nothing
    /// written; writing may go on once space returns); any other I/O failure (the log then
    /// refuses further writes: its state on disk is unknown).
    pub fn append(&self, entries: &[LogEntry]) -> Result<()> {
        let mut inner = self.lock();
        inner.check_usable()?;
        inner.append(entries)
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
        if let Err(e) = &r {
            if matches!(e, Error::Io { .. }) {
                inner.poisoned = Some(e.to_string());
            }
        }
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
        inner.purge_through(through)
    }

    /// Records the last committed entry: segments may now be sealed up to it. Saved without
    /// an fsync (a lost value only costs re-applying entries after a restart). A value below
    /// the one known is ignored (the committed index never goes back).
    ///
    /// # Errors
    /// I/O failures writing the file.
    pub fn save_committed(&self, committed: EntryId) -> Result<()> {
        let mut inner = self.lock();
        if inner.committed.is_some_and(|c| c.index >= committed.index) {
            return Ok(());
        }
        inner.committed = Some(committed);
        durable_file::write_relaxed(
            inner.fs.as_ref(),
            &inner.dir,
            COMMITTED_FILE,
            &encode_entry_id(committed),
        )
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
        let inner = self.lock();
        match durable_file::read(inner.fs.as_ref(), &inner.dir, VOTE_FILE)? {
            Read::Missing => Ok(None),
            Read::Body(b) => Ok(Some(b)),
            Read::Damaged => Err(Error::Corruption {
                segment: inner.dir.join(VOTE_FILE),
                offset: 0,
                kind: CorruptionKind::BadBody("the vote file's checksum does not match".into()),
            }),
        }
    }
}

impl Inner {
    fn committed_index(&self) -> u64 {
        self.committed.map_or(0, |c| c.index)
    }

    fn check_usable(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(Error::Internal(format!(
                "the entry log stopped writing after a failure: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn append(&mut self, entries: &[LogEntry]) -> Result<()> {
        if let Some(first) = entries.first() {
            if self.is_empty() && first.id.index > self.writer.next().entry {
                // A log that never held an entry starts wherever its first entry is (Raft
                // allows it): the empty active segment is replaced by one that starts there.
                let next = self.writer.next();
                self.restart_active(LogPoint {
                    lsn: next.lsn,
                    entry: first.id.index,
                    prev_term: 0,
                })?;
            }
        }
        let mut expected = self.writer.next();
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
        let decoded = entries
            .iter()
            .map(|e| e.payload.records())
            .collect::<Result<Vec<_>>>()?;
        // A batch goes whole into one segment: the active one rolls only before it, and only
        // once every entry in it is committed (it may overrun its size by a batch).
        if self.rotate_due() {
            self.writer
                .rotate_if_full(self.segment_bytes_max)
                .map_err(|w| self.write_failed(w))?;
            self.track_active();
        }
        let start = self.writer.next();
        let mut buf = Vec::new();
        let mut placed = Vec::with_capacity(entries.len());
        for (e, records) in entries.iter().zip(&decoded) {
            let offset = self.writer.active().len() + buf.len() as u64;
            for (i, r) in records.iter().enumerate() {
                let stamp = self.writer.stamp_in_term(e.id.term, i, records.len());
                if let Err(why) = encode_frame(r, stamp, &mut buf) {
                    self.writer.rewind(start);
                    return Err(Error::invalid("entry", why));
                }
            }
            self.writer.advance_in_term(records.len(), e.id.term);
            placed.push(offset);
        }
        self.flush(&buf, start)?;
        if let Some(active) = self.offsets.values_mut().next_back() {
            if let Some(o) = active.offsets.as_mut() {
                o.extend(placed);
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

    /// Replaces the active segment (whose entries, if any, are purged or were never
    /// written) with an empty one starting at `to`.
    fn restart_active(&mut self, to: LogPoint) -> Result<()> {
        let active = Arc::clone(self.writer.active());
        let key = self
            .offsets
            .iter()
            .find(|(_, s)| Arc::ptr_eq(&s.segment, &active))
            .map(|(k, _)| *k);
        active.seal()?;
        self.log.remove_suffix(&[active.base_lsn()])?;
        if let Some(k) = key {
            self.offsets.remove(&k);
        }
        self.writer.restart_at(to)?;
        self.track_active();
        Ok(())
    }

    /// True when the active segment is full and every entry in it is committed.
    fn rotate_due(&self) -> bool {
        self.writer.active().len() >= self.segment_bytes_max
            && self.writer.next().entry.saturating_sub(1) <= self.committed_index()
    }

    /// Writes and syncs `buf` (frames from `start` on); on failure rewinds to `start`.
    fn flush(&mut self, buf: &[u8], start: LogPoint) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if let Err(w) = self.writer.write(buf) {
            let e = self.write_failed(w);
            self.writer.rewind(start);
            return Err(e);
        }
        self.writer
            .sync()
            .inspect_err(|e| self.poisoned = Some(e.to_string()))
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

    /// The segment holding entry `index` (by base entry) with its offsets built.
    fn locate(&mut self, index: u64) -> Result<Option<(Arc<Segment>, u64)>> {
        let next = self.writer.next().entry;
        if index == 0 || index >= next {
            return Ok(None);
        }
        let Some((&base, entries)) = self.offsets.range_mut(..=index).next_back() else {
            return Ok(None);
        };
        if entries.offsets.is_none() {
            entries.offsets = Some(entry_offsets(&entries.segment)?);
        }
        let offsets = entries.offsets.as_deref().unwrap_or_default();
        let at = usize::try_from(index - base).unwrap_or(usize::MAX);
        Ok(offsets.get(at).map(|&o| (Arc::clone(&entries.segment), o)))
    }

    fn read(&mut self, from: u64, to: u64) -> Result<Vec<LogEntry>> {
        let first = self
            .purged
            .map_or(1, |p| p.index + 1)
            .max(self.offsets.keys().next().copied().unwrap_or(1));
        let mut out = Vec::new();
        let mut ahead = ReadAhead::default();
        let mut current: Option<u64> = None;
        for index in from.max(first)..to.min(self.writer.next().entry) {
            let Some((segment, offset)) = self.locate(index)? else {
                break;
            };
            if current != Some(segment.base_lsn()) {
                ahead = ReadAhead::default();
                current = Some(segment.base_lsn());
            }
            out.push(read_entry(&segment, &mut ahead, offset, index)?);
        }
        Ok(out)
    }

    fn truncate_after(&mut self, keep: Option<u64>) -> Result<()> {
        let next = self.writer.next();
        let cut = keep.map_or(1, |k| k + 1);
        if cut >= next.entry {
            return Ok(());
        }
        if cut <= self.committed_index() {
            return Err(Error::Internal(format!(
                "truncating after entry {} would remove committed entries (committed {})",
                cut - 1,
                self.committed_index()
            )));
        }
        let later: Vec<u64> = self.offsets.range(cut..).map(|(b, _)| *b).collect();
        let holder = self
            .offsets
            .range(..cut)
            .next_back()
            .map(|(b, s)| (*b, Arc::clone(&s.segment)));
        match holder {
            Some((base, seg)) if Arc::ptr_eq(&seg, self.writer.active()) => {
                // The cut is inside the active segment: cut it there.
                let (_, offset) = self.locate(cut)?.ok_or_else(|| {
                    Error::Internal(format!("entry {cut} is not in the active segment"))
                })?;
                let to = self.point_of(&seg, base, offset, cut)?;
                self.writer.cut_active(offset, to)?;
                if let Some(o) = self.offsets.get_mut(&base).and_then(|s| s.offsets.as_mut()) {
                    o.truncate(usize::try_from(cut - base).unwrap_or(usize::MAX));
                }
                Ok(())
            }
            Some((base, seg)) => {
                // The cut falls after a sealed segment: only whole later segments may go.
                let first_later = later.first().copied().unwrap_or(u64::MAX);
                if first_later != cut {
                    return Err(Error::Internal(format!(
                        "truncating after entry {} would cut the sealed segment {} (entries from {base})",
                        cut - 1,
                        seg.path().display()
                    )));
                }
                self.drop_segments_from(cut)
            }
            None => self.drop_segments_from(cut),
        }
    }

    /// Unlinks every segment whose entries start at or after `cut` (newest first), then
    /// starts a new active segment where the first of them began.
    fn drop_segments_from(&mut self, cut: u64) -> Result<()> {
        let doomed: Vec<(u64, Arc<Segment>)> = self
            .offsets
            .range(cut..)
            .map(|(b, s)| (*b, Arc::clone(&s.segment)))
            .collect();
        let Some((_, first)) = doomed.first() else {
            return Ok(());
        };
        let header = first.header()?;
        let to = LogPoint {
            lsn: header.base_lsn,
            entry: header.base_entry,
            prev_term: header.prev_term,
        };
        let bases: Vec<u64> = doomed.iter().map(|(_, s)| s.base_lsn()).collect();
        // The active segment goes too: release its descriptor before unlinking.
        self.writer.active().seal()?;
        self.log.remove_suffix(&bases)?;
        for (b, _) in &doomed {
            self.offsets.remove(b);
        }
        self.writer.restart_at(to)?;
        self.track_active();
        Ok(())
    }

    /// The log point of entry `index`, whose first frame is at `offset` of `seg` (whose
    /// first entry is `base`).
    fn point_of(&mut self, seg: &Segment, base: u64, offset: u64, index: u64) -> Result<LogPoint> {
        let mut ahead = ReadAhead::default();
        let head = frame_header(seg, &mut ahead, offset)?;
        let prev_term = if index > base {
            let (_, prev_offset) = self
                .locate(index - 1)?
                .ok_or_else(|| Error::Internal(format!("entry {} is not stored", index - 1)))?;
            frame_header(seg, &mut ahead, prev_offset)?.term
        } else {
            seg.header()?.prev_term
        };
        Ok(LogPoint {
            lsn: head.lsn,
            entry: index,
            prev_term,
        })
    }

    fn purge_through(&mut self, through: EntryId) -> Result<()> {
        if self.purged.is_some_and(|p| p.index >= through.index) {
            return Ok(());
        }
        durable_file::write(
            self.fs.as_ref(),
            &self.dir,
            PURGED_FILE,
            &encode_entry_id(through),
        )?;
        self.purged = Some(through);
        let next = self.writer.next();
        if through.index + 1 >= next.entry {
            // Purged past the last entry (a snapshot installed ahead of the log): every
            // entry goes, and the log goes on after `through`.
            let sealed: Vec<u64> = self
                .offsets
                .values()
                .filter(|s| !Arc::ptr_eq(&s.segment, self.writer.active()))
                .map(|s| s.segment.base_lsn())
                .collect();
            if !sealed.is_empty() {
                self.log.purge_prefix(&sealed)?;
            }
            let active = Arc::clone(self.writer.active());
            self.offsets.retain(|_, s| Arc::ptr_eq(&s.segment, &active));
            return self.restart_active(LogPoint {
                lsn: next.lsn,
                entry: through.index + 1,
                prev_term: through.term,
            });
        }
        // Whole sealed segments whose entries all are at or below `through`.
        let bases: Vec<(u64, u64)> = self
            .offsets
            .keys()
            .copied()
            .zip(self.offsets.keys().copied().skip(1))
            .collect();
        let mut doomed = Vec::new();
        for (base, next_base) in bases {
            if next_base <= through.index + 1 {
                doomed.push(base);
            } else {
                break;
            }
        }
        let segments: Vec<u64> = doomed
            .iter()
            .filter_map(|b| self.offsets.get(b).map(|s| s.segment.base_lsn()))
            .collect();
        if segments.is_empty() {
            return Ok(());
        }
        self.log.purge_prefix(&segments)?;
        for b in doomed {
            self.offsets.remove(&b);
        }
        Ok(())
    }
}

impl EntryPayload {
    /// The records the entry is written as (at least one).
    fn records(&self) -> Result<Vec<Record>> {
        match self {
            Self::Blank => Ok(vec![Record::Blank]),
            Self::Membership(config) => Ok(vec![Record::Membership {
                config: config.clone(),
            }]),
            Self::Records(p) => {
                let records = p
                    .decode()
                    .map_err(|e| Error::invalid("entry", e.to_string()))?;
                // The log's own kinds are not the engine's to propose (a lone Blank or
                // Membership record would read back as that kind of entry).
                match records.iter().position(|r| {
                    matches!(
                        r,
                        Record::Blank | Record::Membership { .. } | Record::Shutdown { .. }
                    )
                }) {
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

/// The offsets of the first frame of every complete entry in `seg`.
fn entry_offsets(seg: &Segment) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut group_start = None;
    let end = walk(&mut Windowed::new(seg), seg.base_lsn(), |step| {
        match step {
            Step::Frame(f) => {
                group_start.get_or_insert(f.offset);
            }
            Step::GroupEnd => out.extend(group_start.take()),
        }
        Ok(Ok(()))
    })?;
    if let Some((offset, kind)) = end.damage {
        if offset < seg.len() && seg.is_sealed() {
            return Err(seg.corruption(offset, kind));
        }
    }
    Ok(out)
}

/// The header of the frame at `offset`, checked with its body.
fn frame_header(seg: &Segment, ahead: &mut ReadAhead, offset: u64) -> Result<FrameHeader> {
    let head = ahead.at(seg, offset, FRAME_HEADER_BYTES as u64)?;
    let len = crate::log::frames::frame_len_in(head)
        .ok_or_else(|| seg.corruption(offset, CorruptionKind::BadLength(0)))?;
    let bytes = ahead.at(seg, offset, len)?;
    check_frame(bytes).map_err(|e| seg.corruption(offset, crate::log::frames::frame_corruption(e)))
}

/// Reads the entry whose first frame is at `offset`.
fn read_entry(
    seg: &Segment,
    ahead: &mut ReadAhead,
    mut offset: u64,
    index: u64,
) -> Result<LogEntry> {
    let mut records = Vec::new();
    let mut term = None;
    loop {
        let header = frame_header(seg, ahead, offset)?;
        if header.entry != index || term.is_some_and(|t| t != header.term) {
            return Err(seg.corruption(
                offset,
                CorruptionKind::EntryGap {
                    expected: index,
                    got: header.entry,
                },
            ));
        }
        term = Some(header.term);
        let bytes = ahead.at(seg, offset, header.frame_len())?;
        let body = bytes
            .get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + header.body_len as usize)
            .unwrap_or_default();
        records.push((header.record_type, body.to_vec()));
        offset += header.frame_len();
        if header.group_left == 0 {
            break;
        }
    }
    let id = EntryId {
        term: term.unwrap_or(0),
        index,
    };
    let payload = match records.as_slice() {
        [(crate::record::tag::BLANK, _)] => EntryPayload::Blank,
        [(crate::record::tag::MEMBERSHIP, config)] => EntryPayload::Membership(config.clone()),
        _ => EntryPayload::Records(Proposal::from_raw(records)),
    };
    Ok(LogEntry { id, payload })
}

fn decode_u64(b: &[u8]) -> Option<u64> {
    b.try_into().ok().map(u64::from_le_bytes)
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
