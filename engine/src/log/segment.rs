//! One segment file: create, append, sync, seal, read, truncate.
//!
//! Every read is a positional read (`pread`), the active segment's and the sealed ones'
//! alike: no segment is memory-mapped, so a file cut short or a media error under a running
//! engine is an error for the range read ([`CorruptionKind::Truncated`],
//! [`CorruptionKind::Unreadable`]), never a `SIGBUS` that kills the process (see
//! docs/DESIGN-NOTES.md, "Sealed segments are read with pread, not mapped").

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{CorruptionKind, Error, Result};
use crate::format::{segment_name, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::fs::{FileSystem, SegmentFile};

mod cache;

/// Source of [`Segment::id`]s: unique in the process, never reused.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A segment file named by the LSN of its first record.
///
/// # Invariants
/// Bytes below `len` are written frames; only the writer appends, and only to the active
/// (unsealed) segment. Once sealed the file never changes and the segment holds no
/// descriptor of its own: reads use one from a small shared cache ([`cache::DESCRIPTORS_MAX`]),
/// opened read-only on demand.
#[derive(Debug)]
pub(crate) struct Segment {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    base_lsn: u64,
    /// This segment's key in the descriptor cache.
    id: u64,
    /// The open file: read-write while active; dropped once sealed.
    file: std::sync::RwLock<Option<Arc<dyn SegmentFile>>>,
    len: AtomicU64,
    sealed: AtomicBool,
}

/// Fsyncs a directory so that creations, renames and deletions in it are durable.
pub(crate) fn sync_dir(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
    fs.sync_dir(dir)
        .map_err(Error::io(format!("syncing directory {}", dir.display())))
}

impl Segment {
    /// Creates a new, empty segment with `header`, durably (file and directory synced).
    pub(crate) fn create(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        header: &SegmentHeader,
    ) -> Result<Self> {
        let path = dir.join(segment_name(header.base_lsn));
        let file = fs
            .create_new(&path)
            .map_err(Error::io(format!("creating segment {}", path.display())))?;
        file.write_all_at(&header.encode(), 0)
            .and_then(|()| file.sync_data())
            .map_err(Error::io(format!("writing header of {}", path.display())))?;
        sync_dir(fs.as_ref(), dir)?;
        Ok(Self::from_file(
            fs,
            path,
            header.base_lsn,
            Some(file),
            SEGMENT_HEADER_BYTES as u64,
        ))
    }

    /// Opens the active segment (read-write) whose valid bytes end at `len`.
    pub(crate) fn open_active(
        fs: Arc<dyn FileSystem>,
        path: PathBuf,
        base_lsn: u64,
        len: u64,
    ) -> Result<Self> {
        let file = fs
            .open(&path)
            .map_err(Error::io(format!("opening segment {}", path.display())))?;
        Ok(Self::from_file(fs, path, base_lsn, Some(file), len))
    }

    /// Opens a sealed segment: checks it can be opened read-only, and keeps no descriptor
    /// (reads open one on demand, see [`cache::DESCRIPTORS_MAX`]).
    pub(crate) fn open_sealed(
        fs: Arc<dyn FileSystem>,
        path: PathBuf,
        base_lsn: u64,
        len: u64,
    ) -> Result<Self> {
        drop(
            fs.open_read_only(&path)
                .map_err(Error::io(format!("opening segment {}", path.display())))?,
        );
        let seg = Self::from_file(fs, path, base_lsn, None, len);
        seg.sealed.store(true, Ordering::Release);
        Ok(seg)
    }

    fn from_file(
        fs: Arc<dyn FileSystem>,
        path: PathBuf,
        base_lsn: u64,
        file: Option<Arc<dyn SegmentFile>>,
        len: u64,
    ) -> Self {
        Self {
            fs,
            path,
            base_lsn,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            file: std::sync::RwLock::new(file),
            len: AtomicU64::new(len),
            sealed: AtomicBool::new(false),
        }
    }

    /// The segment's own descriptor: the active segment's read-write one.
    fn own_file(&self) -> Option<Arc<dyn SegmentFile>> {
        self.file
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn file(&self) -> Result<Arc<dyn SegmentFile>> {
        self.own_file()
            .ok_or_else(|| Error::Internal(format!("{} has no open file", self.path.display())))
    }

    /// A descriptor to read with: the segment's own while active, else a cached read-only
    /// one (opened now if none is cached). A file that is gone is
    /// [`CorruptionKind::MissingSegment`] (a reader racing retention turns that into
    /// "evicted"); any other failure to open is an I/O error, not data loss (out of
    /// descriptors, say).
    fn reader(&self) -> Result<Arc<dyn SegmentFile>> {
        if let Some(file) = self.own_file() {
            return Ok(file);
        }
        if let Some(file) = cache::get(self.id) {
            return Ok(file);
        }
        match self.fs.open_read_only(&self.path) {
            Ok(file) => Ok(cache::put(self.id, file)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(self.corruption(0, CorruptionKind::MissingSegment))
            }
            Err(e) => Err(Error::io(format!("opening {}", self.path.display()))(e)),
        }
    }

    /// The file path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// LSN of the first record.
    pub(crate) fn base_lsn(&self) -> u64 {
        self.base_lsn
    }

    /// Bytes written (header included).
    pub(crate) fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// True once sealed (never written again).
    pub(crate) fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    /// True while the segment holds an open file descriptor: its own (active), or a cached
    /// read-only one (sealed).
    pub(crate) fn holds_descriptor(&self) -> bool {
        self.own_file().is_some() || cache::contains(self.id)
    }

    /// Appends `bytes` at the end. Only the writer calls this, on the active segment.
    ///
    /// # Errors
    /// The OS error; on failure the segment's length is unchanged (the caller may cut the
    /// file back to it, see [`Segment::truncate`]).
    pub(crate) fn append(&self, bytes: &[u8]) -> std::result::Result<(), std::io::Error> {
        debug_assert!(!self.is_sealed(), "appending to a sealed segment");
        let at = self.len();
        let file = self
            .file()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        file.write_all_at(bytes, at)?;
        self.len.store(at + bytes.len() as u64, Ordering::Release);
        Ok(())
    }

    /// `fdatasync`: makes appended bytes durable.
    pub(crate) fn sync_data(&self) -> Result<()> {
        self.file()?
            .sync_data()
            .map_err(Error::io(format!("syncing {}", self.path.display())))
    }

    /// Syncs, then closes the read-write descriptor; the segment is never written again.
    pub(crate) fn seal(&self) -> Result<()> {
        self.sync_data()?;
        self.sealed.store(true, Ordering::Release);
        *self
            .file
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        Ok(())
    }

    /// Cuts the file to `len` bytes and syncs (a torn tail at recovery, or a failed write).
    pub(crate) fn truncate(&self, len: u64) -> Result<()> {
        assert!(
            !self.is_sealed(),
            "a sealed segment must never be truncated"
        );
        self.file()?
            .set_len_and_sync(len)
            .map_err(Error::io(format!("truncating {}", self.path.display())))?;
        self.len.store(len, Ordering::Release);
        Ok(())
    }

    /// Calls `f` with bytes `offset .. offset + len`, read with a positional read.
    pub(crate) fn with_bytes<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        if offset
            .checked_add(len)
            .filter(|e| *e <= self.len())
            .is_none()
        {
            return Err(self.corruption(offset, CorruptionKind::BadLength(len)));
        }
        let buf = self.read_at(offset, len)?;
        Ok(f(&buf))
    }

    /// The segment's header, read and checked (a bad one is corruption at offset 0).
    ///
    /// # Errors
    /// A header that does not check; read failures as [`Segment::read_at`].
    pub(crate) fn header(&self) -> Result<crate::format::SegmentHeader> {
        let len = crate::format::SEGMENT_HEADER_BYTES as u64;
        self.with_bytes(0, len, crate::format::decode_segment_header)?
            .map_err(|e| crate::log::header_error(&self.path, e))
    }

    /// Corruption at `offset` of this segment.
    pub(crate) fn corruption(&self, offset: u64, kind: CorruptionKind) -> Error {
        Error::Corruption {
            segment: self.path.clone(),
            offset,
            kind,
        }
    }

    /// Bytes `offset..offset + len`, read with one positional read.
    ///
    /// # Errors
    /// Bytes the log wrote that the file no longer has (cut short by something outside
    /// cursorlog) are [`CorruptionKind::Truncated`] at the first missing byte; a media error
    /// is [`CorruptionKind::Unreadable`]: both are data loss for this range only, and the
    /// rest of the log is still served. A file that is gone is
    /// [`CorruptionKind::MissingSegment`]; other failures are I/O errors.
    pub(crate) fn read_at(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX).min(1 << 30)];
        self.reader()?
            .read_exact_at(&mut buf, offset)
            .map_err(|e| self.read_error(offset, e))?;
        Ok(buf)
    }

    /// [`Segment::read_at`], under the name its callers knew when sealed segments were
    /// mapped: every read is positional now.
    pub(crate) fn read_unmapped(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.read_at(offset, len)
    }

    /// What a failed read of bytes from `offset` (all below the written length) means.
    fn read_error(&self, offset: u64, e: std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            let file_len = self.fs.len(&self.path).ok();
            return self.corruption(
                file_len.map_or(offset, |l| l.max(offset)),
                CorruptionKind::Truncated {
                    file_len,
                    written: self.len(),
                },
            );
        }
        if is_media_error(&e) {
            return self.corruption(offset, CorruptionKind::Unreadable(e.to_string()));
        }
        Error::io(format!("reading {}", self.path.display()))(e)
    }
}

/// True for the errors a read returns when the stored bytes cannot be read back: `EIO`
/// (a media error), `ENXIO`, and a file system's own checksum failures (`EBADMSG`,
/// `EUCLEAN`).
fn is_media_error(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    Errno::from_io_error(e)
        .is_some_and(|n| [Errno::IO, Errno::NXIO, Errno::BADMSG, Errno::UCLEAN].contains(&n))
}

impl Drop for Segment {
    fn drop(&mut self) {
        // The last holder is gone (the segment was retired, or the engine closed): its
        // cached descriptor, if any, closes now.
        cache::forget(self.id);
    }
}

#[cfg(test)]
mod tests;
