//! Snapshots of a replicated log (issue 19 item 4): a snapshot *is* the log's segment files
//! up to an applied entry, never a copy of the state they hold.
//!
//! - **Taking one** ([`EntryLog::snapshot`]) lists the segments that hold entries up to
//!   `through` (the last one cut at the end of `through`: committed bytes never change) and
//!   opens a read-only descriptor on each, so the files stay readable while they are sent
//!   even if the log later drops them. Nothing is read or copied here.
//! - **Installing one** on a member that lacks the entries: the receiver writes the files
//!   beside the log as `<segment name>.staged` ([`SnapshotStaging`], each fsynced, then the
//!   directory), and [`EntryLog::install_snapshot`] makes them the log atomically: writing
//!   the `SNAPSHOT` file (the manifest; temp file, fsync, rename, directory fsync) is the
//!   commit point; after it the old segments are unlinked, the staged ones renamed in,
//!   `PURGED`, `COMMITTED` and `BASE` written, `SNAPSHOT` removed, and the log goes on after the
//!   snapshot's last entry **at the LSN the snapshot carries**, so every replica gives every
//!   record the same LSN. An open that finds `SNAPSHOT` finishes the install; one that finds
//!   staged files without it drops them (the old log stands). FORMAT.md, "Snapshots".
//!
//! Every file operation goes through the log's [`FileSystem`], so the fault-injecting one
//! can cut the power at each step (`tests/snapshots.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cut::Purged;
use super::read::frame_header;
use super::retire::{decode_tail, encode_tail, Fields, LogBase, BASE_FILE};
use super::{
    encode_entry_id, EntryId, EntryLog, Inner, SegmentEntries, COMMITTED_FILE, PURGED_FILE,
};
use crate::error::{Error, Result};
use crate::format::{parse_segment_name, segment_name, SEGMENT_HEADER_BYTES};
use crate::fs::{FileSystem, SegmentFile};
use crate::log::durable_file::{self, Read};
use crate::log::frames::ReadAhead;
use crate::log::{list_segments, sync_dir, LogPoint, Segment};

/// The install's manifest: its presence is the commit point.
pub(crate) const INSTALL_FILE: &str = "SNAPSHOT";
/// A received file's suffix until the install renames it.
pub(crate) const STAGED_SUFFIX: &str = ".staged";
/// The manifest's first bytes.
const MANIFEST_MAGIC: &[u8; 8] = b"CLSNAPM2";
/// The first version's (no refusals: its files always start at entry 1).
const MANIFEST_MAGIC_V1: &[u8; 8] = b"CLSNAPM1";

/// What a snapshot is: the segment files holding entries up to `last`, and the LSN the
/// record after `last` gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotManifest {
    /// The last entry the snapshot holds (the state it rebuilds is the log through it).
    pub last: EntryId,
    /// The LSN of the first record after `last`: where the installed log goes on.
    pub next_lsn: u64,
    /// The segment files, oldest first: name (`<base LSN>.seg`) and length in bytes.
    pub files: Vec<(String, u64)>,
    /// The entries among the files' that the sender's apply refused (`retire.rs`): the
    /// receiver skips them when it rebuilds its index. `None` from a sender of the first
    /// manifest version, whose snapshots always start at entry 1 (the receiver then checks
    /// every entry as it replays).
    pub refused: Option<Vec<EntryId>>,
    /// The last membership entry applied through `last`, with its configuration: the
    /// snapshot's files may no longer hold it (`None` from a first-version sender).
    pub membership: Option<(EntryId, Vec<u8>)>,
}

impl SnapshotManifest {
    /// Total bytes of the files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, len)| len).sum()
    }

    /// The manifest's bytes: magic, last term, last index, next LSN, file count, then per
    /// file its length, name length (u32) and name, then (version 2) the refused entries and
    /// the membership as `BASE` lays them out; integers little-endian. Without refusals
    /// (`None`) it is the first version's manifest (`CLSNAPM1`, neither).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = match self.refused {
            Some(_) => MANIFEST_MAGIC.to_vec(),
            None => MANIFEST_MAGIC_V1.to_vec(),
        };
        b.extend_from_slice(&encode_entry_id(self.last));
        b.extend_from_slice(&self.next_lsn.to_le_bytes());
        b.extend_from_slice(&(self.files.len() as u64).to_le_bytes());
        for (name, len) in &self.files {
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&(name.len() as u32).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        if let Some(refused) = &self.refused {
            encode_tail(refused, self.membership.as_ref(), &mut b);
        }
        b
    }

    /// Decodes [`SnapshotManifest::encode`]'s bytes; `None` if they are not a manifest or
    /// name a file that is not a segment (a name is never a path).
    pub fn decode(b: &[u8]) -> Option<Self> {
        let mut r = Reader(b);
        let magic = r.take(8)?;
        let v1 = magic == MANIFEST_MAGIC_V1;
        (v1 || magic == MANIFEST_MAGIC).then_some(())?;
        let last = EntryId {
            term: r.u64()?,
            index: r.u64()?,
        };
        let next_lsn = r.u64()?;
        let count = r.u64()?;
        let mut files = Vec::new();
        for _ in 0..count {
            let len = r.u64()?;
            let n = usize::try_from(u32::from_le_bytes(r.take(4)?.try_into().ok()?)).ok()?;
            let name = std::str::from_utf8(r.take(n)?).ok()?.to_owned();
            parse_segment_name(&name)?;
            files.push((name, len));
        }
        let (refused, membership) = if v1 {
            (None, None)
        } else {
            let mut tail = Fields(r.0);
            let (refused, membership) = decode_tail(&mut tail)?;
            r.0 = tail.0;
            (Some(refused), membership)
        };
        r.0.is_empty().then_some(Self {
            last,
            next_lsn,
            files,
            refused,
            membership,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }
}

/// A snapshot taken: its manifest and a read-only descriptor on each of its files, in the
/// manifest's order.
#[derive(Debug)]
pub struct LogSnapshot {
    /// What it holds.
    pub manifest: SnapshotManifest,
    /// The files, open, each reading its first `len` bytes.
    pub files: Vec<SnapshotFile>,
}

/// One file of a snapshot taken: reads the file's first `len` bytes (blocking positional
/// reads through a descriptor opened when the snapshot was taken).
#[derive(Debug)]
pub struct SnapshotFile {
    file: Arc<dyn SegmentFile>,
    at: u64,
    len: u64,
}

impl std::io::Read for SnapshotFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len - self.at;
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        self.file.read_exact_at(&mut buf[..n], self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// A snapshot being received: each file is created beside the log as
/// `<name>.staged`, then [`SnapshotStaging::finish`] syncs them.
#[derive(Debug)]
pub struct SnapshotStaging {
    dir: PathBuf,
    fs: Arc<dyn FileSystem>,
    manifest: SnapshotManifest,
}

/// A staged file being written (sequentially, from its start).
#[derive(Debug)]
pub struct StagedFile {
    file: Arc<dyn SegmentFile>,
    at: u64,
}

impl std::io::Write for StagedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write_all_at(buf, self.at)?;
        self.at += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn staged_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{STAGED_SUFFIX}"))
}

impl SnapshotStaging {
    /// What is being received.
    pub fn manifest(&self) -> &SnapshotManifest {
        &self.manifest
    }

    /// Creates file `i` of the manifest (to be written with exactly its length).
    ///
    /// # Errors
    /// `i` is not a file of the manifest; I/O failures.
    pub fn create(&self, i: usize) -> Result<StagedFile> {
        let (name, _) =
            self.manifest.files.get(i).ok_or_else(|| {
                Error::invalid("snapshot", format!("no file {i} in the manifest"))
            })?;
        let path = staged_path(&self.dir, name);
        let file = self
            .fs
            .create_new(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        Ok(StagedFile { file, at: 0 })
    }

    /// Checks every file has its manifest length, fsyncs each, then the directory: the
    /// staged files are complete on disk.
    ///
    /// # Errors
    /// A missing file, or one of another length than the manifest says; I/O failures.
    pub fn finish(&self) -> Result<()> {
        check_staged(self.fs.as_ref(), &self.dir, &self.manifest)?;
        for (name, _) in &self.manifest.files {
            let path = staged_path(&self.dir, name);
            self.fs
                .open(&path)
                .and_then(|f| f.sync_data())
                .map_err(Error::io(format!("syncing {}", path.display())))?;
        }
        sync_dir(self.fs.as_ref(), &self.dir)
    }
}

/// Removes staged files (a transfer that did not finish, or one superseded).
fn remove_staged(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
    let mut removed = false;
    for (name, path) in fs
        .list(dir)
        .map_err(Error::io(format!("listing {}", dir.display())))?
    {
        if name.ends_with(STAGED_SUFFIX) {
            fs.remove(&path)
                .map_err(Error::io(format!("removing {}", path.display())))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(fs, dir)?;
    }
    Ok(())
}

/// The step an install stops after (tests: a crash between steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum InstallStep {
    /// `SNAPSHOT` written (the commit point).
    Committed,
    /// The old segments unlinked.
    OldRemoved,
    /// Some of the new files renamed in (the first one).
    OneMoved,
    /// Every file renamed in, `PURGED` and `COMMITTED` written.
    Moved,
    /// Everything, the live log switched over.
    Done,
}

impl EntryLog {
    /// True when the log holds entry `id` (same index, same term), purged or not: a
    /// member that does already holds everything a snapshot through `id` would bring
    /// (Raft's log matching), and must not replace its log (entries after `id` would go).
    ///
    /// # Errors
    /// Corruption of the stored frame; I/O failures.
    pub fn holds(&self, id: EntryId) -> Result<bool> {
        let mut inner = self.lock();
        match inner.locate(id.index)? {
            Some((seg, offset)) => {
                Ok(frame_header(&seg, &mut ReadAhead::default(), offset)?.term == id.term)
            }
            None => Ok(false),
        }
    }

    /// Takes a snapshot of the log through entry `through` (which must be committed and
    /// held): the segments holding entries up to it, the last cut after it, each opened
    /// read-only. No data is read or copied.
    ///
    /// # Errors
    /// `through` is not held ([`Error::InvalidArgument`]); I/O failures opening the files.
    pub fn snapshot(&self, through: EntryId) -> Result<LogSnapshot> {
        self.lock().snapshot(through)
    }

    /// Starts receiving `manifest` (staged files of an earlier, unfinished transfer are
    /// removed).
    ///
    /// # Errors
    /// I/O failures.
    pub fn begin_install(&self, manifest: SnapshotManifest) -> Result<SnapshotStaging> {
        let inner = self.lock();
        remove_staged(inner.fs.as_ref(), &inner.dir)?;
        Ok(SnapshotStaging {
            dir: inner.dir.clone(),
            fs: Arc::clone(&inner.fs),
            manifest,
        })
    }

    /// Makes a finished staged snapshot the log: from here on the log holds exactly the
    /// snapshot's files, entry `last` is its last (and purged) entry, and the next record
    /// gets the snapshot's `next_lsn`. Atomic across a crash: the next open finds the old
    /// log or the new one.
    ///
    /// # Errors
    /// The staged files are not a log that ends at the manifest's `last` and `next_lsn`
    /// (nothing changed); I/O failures (the log then refuses writes until reopened, and the
    /// reopen finishes the install).
    pub fn install_snapshot(&self, staging: SnapshotStaging) -> Result<()> {
        self.install_until(staging, InstallStep::Done)
    }

    pub(crate) fn install_until(&self, staging: SnapshotStaging, stop: InstallStep) -> Result<()> {
        let mut inner = self.lock();
        inner.check_usable()?;
        let r = inner.install(&staging, stop);
        inner.poison_on_io(&r);
        if r.is_err() {
            inner
                .poisoned
                .get_or_insert_with(|| "a snapshot install failed".into());
        }
        r
    }
}

impl Inner {
    fn snapshot(&mut self, through: EntryId) -> Result<LogSnapshot> {
        let next = self.writer.next();
        if through.index == 0 || through.index >= next.entry {
            return Err(Error::invalid(
                "snapshot",
                format!("entry {} is not in the log", through.index),
            ));
        }
        let after = self.locate(through.index + 1)?;
        let next_lsn = match &after {
            Some((seg, offset)) => frame_header(seg, &mut ReadAhead::default(), *offset)?.lsn,
            None => next.lsn,
        };
        let mut manifest = SnapshotManifest {
            last: through,
            next_lsn,
            files: Vec::new(),
            refused: None,
            membership: None,
        };
        let mut files = Vec::new();
        for (&base, entries) in &self.offsets {
            if base > through.index {
                break;
            }
            let seg = &entries.segment;
            let len = match &after {
                Some((holder, offset)) if Arc::ptr_eq(holder, seg) => *offset,
                _ => seg.len(),
            };
            if len <= SEGMENT_HEADER_BYTES as u64 {
                continue;
            }
            let file = self
                .fs
                .open_read_only(seg.path())
                .map_err(Error::io(format!("opening {}", seg.path().display())))?;
            manifest.files.push((segment_name(seg.base_lsn()), len));
            files.push(SnapshotFile { file, at: 0, len });
        }
        Ok(LogSnapshot { manifest, files })
    }

    fn install(&mut self, staging: &SnapshotStaging, stop: InstallStep) -> Result<()> {
        // The log is being replaced: nothing of the old one is answered from memory.
        self.tail.clear();
        let manifest = &staging.manifest;
        check_staged(self.fs.as_ref(), &self.dir, manifest)?;
        durable_file::write(
            self.fs.as_ref(),
            &self.dir,
            INSTALL_FILE,
            &manifest.encode(),
        )?;
        if stop == InstallStep::Committed {
            return Ok(());
        }
        // The old log goes: its descriptors first, then its files (newest first).
        self.writer.active().seal()?;
        let bases: Vec<u64> = self.log.all().iter().map(|s| s.base_lsn()).collect();
        self.log.remove_suffix(&bases)?;
        self.offsets.clear();
        self.committed_file = None;
        finish_install(self.fs.as_ref(), &self.dir, stop)?;
        if stop < InstallStep::Done {
            return Ok(());
        }
        for (name, len) in &manifest.files {
            let base_lsn = parse_segment_name(name)
                .ok_or_else(|| Error::Internal(format!("{name} is not a segment name")))?;
            let seg = Arc::new(Segment::open_sealed(
                Arc::clone(&self.fs),
                self.dir.join(name),
                base_lsn,
                *len,
            )?);
            let header = seg.header()?;
            self.log.insert(Arc::clone(&seg));
            self.offsets.insert(
                header.base_entry,
                SegmentEntries {
                    segment: seg,
                    offsets: None,
                },
            );
        }
        self.writer.restart_at(LogPoint {
            lsn: manifest.next_lsn,
            entry: manifest.last.index + 1,
            prev_term: manifest.last.term,
        })?;
        self.track_active();
        self.purged = Some(Purged {
            id: manifest.last,
            lsn_after: manifest.next_lsn,
        });
        if self.committed_index() < manifest.last.index {
            self.committed = Some(manifest.last);
        }
        Ok(())
    }
}

/// Checks a staged snapshot before it is committed: at least one file, every file present
/// with its manifest length. Frames are checked when the engine replays them.
fn check_staged(fs: &dyn FileSystem, dir: &Path, m: &SnapshotManifest) -> Result<()> {
    if m.files.is_empty() {
        return Err(Error::invalid("snapshot", "the snapshot holds no segment"));
    }
    for (name, len) in &m.files {
        let path = staged_path(dir, name);
        let got = fs
            .len(&path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        if got != *len {
            return Err(Error::invalid(
                "snapshot",
                format!("{name} holds {got} bytes, the manifest says {len}"),
            ));
        }
    }
    Ok(())
}

/// Finishes an install whose commit point passed (`SNAPSHOT` exists): unlinks every old
/// segment, renames the staged ones in, writes `PURGED` (the snapshot's last entry and next
/// LSN) and `COMMITTED`, and removes `SNAPSHOT`. Idempotent: an open after a crash anywhere
/// in it calls it again. A segment file is new exactly when the manifest names it and its
/// staged file is gone (renamed in).
pub(crate) fn finish_install(fs: &dyn FileSystem, dir: &Path, stop: InstallStep) -> Result<()> {
    let manifest = match durable_file::read(fs, dir, INSTALL_FILE)? {
        Read::Body(b) => SnapshotManifest::decode(&b),
        Read::Missing | Read::Damaged => None,
    }
    .ok_or_else(|| Error::Corruption {
        segment: dir.join(INSTALL_FILE),
        offset: 0,
        kind: crate::error::CorruptionKind::BadBody(
            "the snapshot install's manifest does not decode".into(),
        ),
    })?;
    let staged = |name: &str| fs.len(&staged_path(dir, name)).is_ok();
    let new = |name: &str| manifest.files.iter().any(|(n, _)| n == name) && !staged(name);
    let mut removed = false;
    for (_, path) in list_segments(fs, dir)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !new(&name) {
            fs.remove(&path)
                .map_err(Error::io(format!("deleting {}", path.display())))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(fs, dir)?;
    }
    if stop == InstallStep::OldRemoved {
        return Ok(());
    }
    for (name, _) in &manifest.files {
        if staged(name) {
            fs.rename(&staged_path(dir, name), &dir.join(name))
                .map_err(Error::io(format!("moving {name} into the log")))?;
            sync_dir(fs, dir)?;
            if stop == InstallStep::OneMoved {
                return Ok(());
            }
        }
    }
    let purged = Purged {
        id: manifest.last,
        lsn_after: manifest.next_lsn,
    };
    durable_file::write(fs, dir, PURGED_FILE, &purged.encode())?;
    durable_file::write(fs, dir, COMMITTED_FILE, &encode_entry_id(manifest.last))?;
    // The old log's base goes with it; the snapshot's is the new log's (`retire.rs`).
    match &manifest.refused {
        Some(refused) => {
            let base = LogBase {
                through: manifest.last.index,
                refused: refused.clone(),
                membership: manifest.membership.clone(),
            };
            durable_file::write(fs, dir, BASE_FILE, &base.encode())?;
        }
        None => {
            if fs.len(&dir.join(BASE_FILE)).is_ok() {
                fs.remove(&dir.join(BASE_FILE))
                    .map_err(Error::io("removing the BASE file"))?;
                sync_dir(fs, dir)?;
            }
        }
    }
    if stop == InstallStep::Moved {
        return Ok(());
    }
    fs.remove(&dir.join(INSTALL_FILE))
        .map_err(Error::io("removing the SNAPSHOT file"))?;
    sync_dir(fs, dir)?;
    tracing::info!(
        last = manifest.last.index,
        term = manifest.last.term,
        next_lsn = manifest.next_lsn,
        files = manifest.files.len(),
        bytes = manifest.bytes(),
        "installed a snapshot as the log"
    );
    Ok(())
}

/// At open, before the log is read: finishes a committed install, drops the files of an
/// unfinished transfer.
pub(super) fn recover(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
    if fs.len(&dir.join(INSTALL_FILE)).is_ok() {
        tracing::warn!(dir = %dir.display(), "finishing a snapshot install a crash interrupted");
        finish_install(fs, dir, InstallStep::Done)?;
    }
    remove_staged(fs, dir)
}
