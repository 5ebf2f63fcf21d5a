//! Snapshots of a replicated log (issue 19 item 4): a snapshot *is* the log's segment files
//! up to an applied entry, never a copy of the state they hold.
//!
//! - **Taking one** ([`EntryLog::snapshot`]) lists the segments that hold entries up to
//!   `through` (the last one cut at the end of `through`: committed bytes never change) and
//!   opens a read-only descriptor on each, so the files stay readable while they are sent
//!   even if the log later drops them. Nothing is read or copied here.
//! - **Installing one** on a member that lacks the entries: the receiver writes the files
//!   into a staging directory ([`SnapshotStaging`], fsynced file by file, then the
//!   directory, with the manifest last), and [`EntryLog::install_snapshot`] makes them the
//!   log atomically: renaming `snapshot.staging` to `snapshot.install` is the commit point;
//!   after it the old segments are unlinked, the new ones renamed in, `PURGED` and
//!   `COMMITTED` written, and the log goes on after the snapshot's last entry **at the LSN
//!   the snapshot carries**, so every replica gives every record the same LSN. An open
//!   that finds `snapshot.install` finishes the install; one that finds `snapshot.staging`
//!   drops it (the old log stands). FORMAT.md, "Snapshots".

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cut::Purged;
use super::read::frame_header;
use super::{
    encode_entry_id, EntryId, EntryLog, Inner, SegmentEntries, COMMITTED_FILE, PURGED_FILE,
};
use crate::error::{Error, Result};
use crate::format::{parse_segment_name, segment_name, SEGMENT_HEADER_BYTES};
use crate::fs::FileSystem;
use crate::log::durable_file;
use crate::log::frames::ReadAhead;
use crate::log::{list_segments, sync_dir, LogPoint, Segment};

/// Where a snapshot being received is written.
pub const STAGING_DIR: &str = "snapshot.staging";
/// A received snapshot whose install was decided (the commit point is the rename to it).
pub const INSTALL_DIR: &str = "snapshot.install";
/// The manifest file inside either directory.
const MANIFEST_FILE: &str = "MANIFEST";
/// The manifest's first bytes.
const MANIFEST_MAGIC: &[u8; 8] = b"CLSNAPM1";

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
}

impl SnapshotManifest {
    /// Total bytes of the files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, len)| len).sum()
    }

    /// The manifest's bytes: magic, last term, last index, next LSN, file count, then per
    /// file its length, name length (u32) and name; integers little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = MANIFEST_MAGIC.to_vec();
        b.extend_from_slice(&encode_entry_id(self.last));
        b.extend_from_slice(&self.next_lsn.to_le_bytes());
        b.extend_from_slice(&(self.files.len() as u64).to_le_bytes());
        for (name, len) in &self.files {
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&(name.len() as u32).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        b
    }

    /// Decodes [`SnapshotManifest::encode`]'s bytes; `None` if they are not a manifest or
    /// name a file that is not a segment (a name is never a path).
    pub fn decode(b: &[u8]) -> Option<Self> {
        let mut r = Reader(b);
        (r.take(8)? == MANIFEST_MAGIC).then_some(())?;
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
        r.0.is_empty().then_some(Self {
            last,
            next_lsn,
            files,
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
/// manifest's order (read the first `len` bytes of each).
#[derive(Debug)]
pub struct LogSnapshot {
    /// What it holds.
    pub manifest: SnapshotManifest,
    /// The files, open.
    pub files: Vec<std::fs::File>,
}

/// A snapshot being received: files are created in `snapshot.staging` under the data
/// directory, then [`SnapshotStaging::finish`] syncs them and writes the manifest.
#[derive(Debug)]
pub struct SnapshotStaging {
    dir: PathBuf,
    manifest: SnapshotManifest,
}

impl SnapshotStaging {
    /// The staging directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What is being received.
    pub fn manifest(&self) -> &SnapshotManifest {
        &self.manifest
    }

    /// Creates file `i` of the manifest (to be written with exactly its length).
    ///
    /// # Errors
    /// `i` is not a file of the manifest; I/O failures.
    pub fn create(&self, i: usize) -> Result<std::fs::File> {
        let (name, _) =
            self.manifest.files.get(i).ok_or_else(|| {
                Error::invalid("snapshot", format!("no file {i} in the manifest"))
            })?;
        let path = self.dir.join(name);
        std::fs::File::create(&path).map_err(Error::io(format!("creating {}", path.display())))
    }

    /// Checks every file has its manifest length, fsyncs each, writes the manifest
    /// (fsynced) and fsyncs the directory: the staged snapshot is complete on disk.
    ///
    /// # Errors
    /// A file of another length than the manifest says; I/O failures.
    pub fn finish(&self) -> Result<()> {
        for (name, len) in &self.manifest.files {
            let path = self.dir.join(name);
            let f = std::fs::File::open(&path)
                .map_err(Error::io(format!("opening {}", path.display())))?;
            let got = f
                .metadata()
                .map_err(Error::io(format!("reading {}", path.display())))?
                .len();
            if got != *len {
                return Err(Error::invalid(
                    "snapshot",
                    format!("{name} holds {got} bytes, the manifest says {len}"),
                ));
            }
            f.sync_all()
                .map_err(Error::io(format!("syncing {}", path.display())))?;
        }
        let path = self.dir.join(MANIFEST_FILE);
        let mut f = std::fs::File::create(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        f.write_all(&self.manifest.encode())
            .and_then(|()| f.sync_all())
            .map_err(Error::io(format!("writing {}", path.display())))?;
        sync_std_dir(&self.dir)
    }
}

fn sync_std_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io(format!("syncing directory {}", dir.display())))
}

/// The step an install stops after (tests: a crash between steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum InstallStep {
    /// `snapshot.staging` renamed to `snapshot.install` (the commit point).
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

    /// Starts receiving `manifest`: a fresh `snapshot.staging` directory (an earlier,
    /// unfinished one is removed).
    ///
    /// # Errors
    /// I/O failures.
    pub fn begin_install(&self, manifest: SnapshotManifest) -> Result<SnapshotStaging> {
        let dir = self.lock().dir.join(STAGING_DIR);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(Error::io(format!("removing {}", dir.display())))?;
        }
        std::fs::create_dir(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        Ok(SnapshotStaging { dir, manifest })
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
            let file = std::fs::File::open(seg.path())
                .map_err(Error::io(format!("opening {}", seg.path().display())))?;
            manifest.files.push((segment_name(seg.base_lsn()), len));
            files.push(file);
        }
        Ok(LogSnapshot { manifest, files })
    }

    fn install(&mut self, staging: &SnapshotStaging, stop: InstallStep) -> Result<()> {
        let manifest = &staging.manifest;
        check_staged(self.fs.as_ref(), staging)?;
        let install = self.dir.join(INSTALL_DIR);
        std::fs::rename(&staging.dir, &install).map_err(Error::io(format!(
            "renaming {} to {}",
            staging.dir.display(),
            install.display()
        )))?;
        sync_std_dir(&self.dir)?;
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

/// Checks a staged snapshot before it is committed: every file present with its length,
/// the first frame-free check of each header (its base LSN is its name's), and the files
/// continuing one another. Frames are checked when the engine replays them.
fn check_staged(fs: &dyn FileSystem, staging: &SnapshotStaging) -> Result<()> {
    let _ = fs;
    let m = &staging.manifest;
    if m.files.is_empty() {
        return Err(Error::invalid("snapshot", "the snapshot holds no segment"));
    }
    for (name, len) in &m.files {
        let path = staging.dir.join(name);
        let got = std::fs::metadata(&path)
            .map_err(Error::io(format!("reading {}", path.display())))?
            .len();
        if got != *len {
            return Err(Error::invalid(
                "snapshot",
                format!("{name} holds {got} bytes, the manifest says {len}"),
            ));
        }
    }
    Ok(())
}

/// Finishes an install whose commit point passed (`snapshot.install` exists): unlinks every
/// old segment, renames the new ones in, writes `PURGED` (the snapshot's last entry and
/// next LSN) and `COMMITTED`, and removes `snapshot.install`. Idempotent: an open after a
/// crash anywhere in it calls it again. A segment file in the data directory is new exactly
/// when the manifest names it and `snapshot.install` no longer holds it.
pub(crate) fn finish_install(fs: &dyn FileSystem, dir: &Path, stop: InstallStep) -> Result<()> {
    let install = dir.join(INSTALL_DIR);
    let bytes = std::fs::read(install.join(MANIFEST_FILE))
        .map_err(Error::io(format!("reading {}", install.display())))?;
    let manifest = SnapshotManifest::decode(&bytes).ok_or_else(|| Error::Corruption {
        segment: install.join(MANIFEST_FILE),
        offset: 0,
        kind: crate::error::CorruptionKind::BadBody("the snapshot manifest does not decode".into()),
    })?;
    let staged = |name: &str| install.join(name).exists();
    let new = |name: &str| manifest.files.iter().any(|(n, _)| n == name) && !staged(name);
    for (_, path) in list_segments(fs, dir)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !new(&name) {
            fs.remove(&path)
                .map_err(Error::io(format!("deleting {}", path.display())))?;
        }
    }
    sync_dir(fs, dir)?;
    if stop == InstallStep::OldRemoved {
        return Ok(());
    }
    for (name, _) in &manifest.files {
        if staged(name) {
            std::fs::rename(install.join(name), dir.join(name))
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
    if stop == InstallStep::Moved {
        return Ok(());
    }
    std::fs::remove_dir_all(&install)
        .map_err(Error::io(format!("removing {}", install.display())))?;
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

/// At open, before the log is read: finishes a committed install, drops an unfinished
/// receive.
pub(super) fn recover(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
    if dir.join(INSTALL_DIR).exists() {
        tracing::warn!(dir = %dir.display(), "finishing a snapshot install a crash interrupted");
        finish_install(fs, dir, InstallStep::Done)?;
    }
    let staging = dir.join(STAGING_DIR);
    if staging.exists() {
        tracing::warn!(dir = %dir.display(), "dropping a snapshot whose transfer did not finish");
        std::fs::remove_dir_all(&staging)
            .map_err(Error::io(format!("removing {}", staging.display())))?;
        sync_dir(fs, dir)?;
    }
    Ok(())
}
