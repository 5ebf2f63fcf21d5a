//! One segment file: create, append, sync, seal, read, truncate.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::error::{CorruptionKind, Error, Result};
use crate::format::{segment_name, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::fs::{FileSystem, SegmentFile};

/// A segment file named by the LSN of its first record.
///
/// # Invariants
/// Bytes below `len` are written frames; only the writer appends, and only to the active
/// (unsealed) segment. Once sealed the file never changes: reads go through its map and the
/// segment holds no file descriptor (a simulated file system without maps keeps a
/// read-only one).
#[derive(Debug)]
pub(crate) struct Segment {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    base_lsn: u64,
    /// The open file: read-write while active; dropped once sealed and mapped.
    file: std::sync::RwLock<Option<Arc<dyn SegmentFile>>>,
    len: AtomicU64,
    /// The sealed file's map, shared with the events read from it (see [`crate::SegmentMap`]).
    map: OnceLock<Bytes>,
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

    /// Opens a sealed segment read-only and maps it; the descriptor is closed once mapped.
    pub(crate) fn open_sealed(
        fs: Arc<dyn FileSystem>,
        path: PathBuf,
        base_lsn: u64,
        len: u64,
    ) -> Result<Self> {
        let file = fs
            .open_read_only(&path)
            .map_err(Error::io(format!("opening segment {}", path.display())))?;
        let seg = Self::from_file(fs, path, base_lsn, Some(file), len);
        seg.map_and_close()?;
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
            file: std::sync::RwLock::new(file),
            len: AtomicU64::new(len),
            map: OnceLock::new(),
        }
    }

    fn file(&self) -> Result<Arc<dyn SegmentFile>> {
        self.file
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| Error::Internal(format!("{} has no open file", self.path.display())))
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

    /// True once sealed (read through a map from then on).
    pub(crate) fn is_sealed(&self) -> bool {
        self.map.get().is_some()
    }

    /// True while the segment holds an open file descriptor.
    pub(crate) fn holds_descriptor(&self) -> bool {
        self.file
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
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

    /// Syncs, then maps the file read-only and closes its descriptor; the segment is never
    /// written again.
    pub(crate) fn seal(&self) -> Result<()> {
        self.sync_data()?;
        self.map_and_close()
    }

    fn map_and_close(&self) -> Result<()> {
        let map = self
            .file()?
            .map()
            .map_err(Error::io(format!("mapping {}", self.path.display())))?;
        let mut file = self
            .file
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match map {
            Some(map) => {
                let _ = self.map.set(Bytes::from_owner(map));
                *file = None;
            }
            None => {
                // A file system without maps: keep the file, read-only from now on.
                let reopened = self
                    .fs
                    .open_read_only(&self.path)
                    .map_err(Error::io(format!("reopening {}", self.path.display())))?;
                let all = self.len();
                let mut bytes = vec![0u8; usize::try_from(all).unwrap_or(0)];
                reopened
                    .read_exact_at(&mut bytes, 0)
                    .map_err(Error::io(format!("reading {}", self.path.display())))?;
                let _ = self.map.set(Bytes::from(bytes));
                *file = None;
            }
        }
        Ok(())
    }

    /// Cuts the file to `len` bytes and syncs (a torn tail at recovery, or a failed write).
    pub(crate) fn truncate(&self, len: u64) -> Result<()> {
        assert!(
            !self.is_sealed(),
            "a sealed (mapped) segment must never be truncated"
        );
        self.file()?
            .set_len_and_sync(len)
            .map_err(Error::io(format!("truncating {}", self.path.display())))?;
        self.len.store(len, Ordering::Release);
        Ok(())
    }

    /// Calls `f` with bytes `offset .. offset + len`: from the map when sealed, else by
    /// positional read (the active segment is written concurrently and never mapped).
    pub(crate) fn with_bytes<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let end = offset.checked_add(len).filter(|e| *e <= self.len());
        let Some(end) = end else {
            return Err(self.corruption(offset, CorruptionKind::BadLength(len)));
        };
        if let Some(map) = self.map.get() {
            let bytes = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(end).ok())
                .and_then(|(a, b)| map.get(a..b));
            return match bytes {
                Some(b) => Ok(f(b)),
                None => Err(self.corruption(offset, CorruptionKind::BadLength(len))),
            };
        }
        let buf = self.read_unmapped(offset, len)?;
        Ok(f(&buf))
    }

    /// Corruption at `offset` of this segment.
    pub(crate) fn corruption(&self, offset: u64, kind: CorruptionKind) -> Error {
        Error::Corruption {
            segment: self.path.clone(),
            offset,
            kind,
        }
    }

    /// Bytes `offset..offset + len` read with positional reads, never through the map: for a
    /// one-off scan of a whole sealed segment that should not stay resident (mapped pages
    /// count in the process's RSS for as long as the mapping lives). A sealed segment holds
    /// no descriptor: a read-only one is opened for the read and closed after it.
    pub(crate) fn read_unmapped(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX).min(1 << 30)];
        let file = match self.file() {
            Ok(f) => f,
            Err(_) => self
                .fs
                .open_read_only(&self.path)
                .map_err(Error::io(format!("opening {}", self.path.display())))?,
        };
        file.read_exact_at(&mut buf, offset)
            // The context is formatted only on failure: this is on every active-segment read.
            .map_err(|e| Error::io(format!("reading {}", self.path.display()))(e))?;
        Ok(buf)
    }

    /// The mapped bytes from `offset` to the end of the written data, when the segment is
    /// sealed (mapped); `None` for the active segment or an offset past the end.
    pub(crate) fn mapped_from(&self, offset: u64) -> Option<&[u8]> {
        let map = self.map.get()?;
        let start = usize::try_from(offset).ok()?;
        let end = usize::try_from(self.len()).ok()?;
        map.get(start..end)
    }

    /// The whole map of a sealed segment, to share slices of it (`None` while active).
    pub(crate) fn map(&self) -> Option<&Bytes> {
        self.map.get()
    }
}
