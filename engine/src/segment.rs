//! One segment file: create, append, sync, seal, read, truncate.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::{encode_segment_header, segment_name, SEGMENT_HEADER_BYTES};
use crate::fs::{FileSystem, SegmentFile};

/// A segment file named by the LSN of its first record.
///
/// # Invariants
/// Bytes below `len` are written frames; only the writer appends, and only to the active
/// (unsealed) segment. Once sealed the file never changes and reads go through a map.
#[derive(Debug)]
pub(crate) struct Segment {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    base_lsn: u64,
    file: Arc<dyn SegmentFile>,
    /// Set when sealed on a file system without maps: reads use positional reads.
    sealed_unmapped: AtomicBool,
    len: AtomicU64,
    /// The sealed file's map, shared with the events read from it (see [`crate::SegmentMap`]).
    map: OnceLock<Bytes>,
    delete_on_drop: AtomicBool,
}

/// Fsyncs a directory so that creations, renames and deletions in it are durable.
pub(crate) fn sync_dir(fs: &dyn FileSystem, dir: &Path) -> Result<()> {
    fs.sync_dir(dir)
        .map_err(Error::io(format!("syncing directory {}", dir.display())))
}

impl Segment {
    /// Creates a new, empty segment with its header, durably (file and directory synced).
    pub(crate) fn create(fs: Arc<dyn FileSystem>, dir: &Path, base_lsn: u64) -> Result<Self> {
        let path = dir.join(segment_name(base_lsn));
        let file = fs
            .create_new(&path)
            .map_err(Error::io(format!("creating segment {}", path.display())))?;
        file.write_all_at(&encode_segment_header(base_lsn), 0)
            .and_then(|()| file.sync_data())
            .map_err(Error::io(format!("writing header of {}", path.display())))?;
        sync_dir(fs.as_ref(), dir)?;
        Ok(Self::from_file(
            fs,
            path,
            base_lsn,
            file,
            SEGMENT_HEADER_BYTES as u64,
        ))
    }

    /// Opens an existing segment whose valid bytes end at `len`.
    pub(crate) fn open(
        fs: Arc<dyn FileSystem>,
        path: PathBuf,
        base_lsn: u64,
        len: u64,
    ) -> Result<Self> {
        let file = fs
            .open(&path)
            .map_err(Error::io(format!("opening segment {}", path.display())))?;
        Ok(Self::from_file(fs, path, base_lsn, file, len))
    }

    fn from_file(
        fs: Arc<dyn FileSystem>,
        path: PathBuf,
        base_lsn: u64,
        file: Arc<dyn SegmentFile>,
        len: u64,
    ) -> Self {
        Self {
            fs,
            sealed_unmapped: AtomicBool::new(false),
            path,
            base_lsn,
            file,
            len: AtomicU64::new(len),
            map: OnceLock::new(),
            delete_on_drop: AtomicBool::new(false),
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

    /// True once sealed (read through a map from then on).
    pub(crate) fn is_sealed(&self) -> bool {
        self.map.get().is_some() || self.sealed_unmapped.load(Ordering::Acquire)
    }

    /// Appends `bytes` at the end. Only the writer calls this, on the active segment.
    pub(crate) fn append(&self, bytes: &[u8]) -> Result<()> {
        debug_assert!(!self.is_sealed(), "appending to a sealed segment");
        let at = self.len();
        self.file
            .write_all_at(bytes, at)
            .map_err(Error::io(format!("appending to {}", self.path.display())))?;
        self.len.store(at + bytes.len() as u64, Ordering::Release);
        Ok(())
    }

    /// `fdatasync`: makes appended bytes durable.
    pub(crate) fn sync_data(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(Error::io(format!("syncing {}", self.path.display())))
    }

    /// Syncs, then maps the file read-only; the segment is never written again.
    pub(crate) fn seal(&self) -> Result<()> {
        self.sync_data()?;
        match self
            .file
            .map()
            .map_err(Error::io(format!("mapping {}", self.path.display())))?
        {
            Some(map) => {
                let _ = self.map.set(Bytes::from_owner(map));
            }
            None => self.sealed_unmapped.store(true, Ordering::Release),
        }
        Ok(())
    }

    /// Cuts the file to `len` bytes and syncs (recovery of a torn tail only).
    pub(crate) fn truncate(&self, len: u64) -> Result<()> {
        assert!(
            !self.is_sealed(),
            "a sealed (mapped) segment must never be truncated"
        );
        self.file
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
            return Err(Error::Corruption {
                segment: self.path.clone(),
                offset,
                kind: crate::CorruptionKind::BadLength(len),
            });
        };
        if let Some(map) = self.map.get() {
            let bytes = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(end).ok())
                .and_then(|(a, b)| map.get(a..b));
            return match bytes {
                Some(b) => Ok(f(b)),
                None => Err(Error::Corruption {
                    segment: self.path.clone(),
                    offset,
                    kind: crate::CorruptionKind::BadLength(len),
                }),
            };
        }
        let buf = self.read_unmapped(offset, len)?;
        Ok(f(&buf))
    }

    /// Bytes `offset..offset + len` read with positional reads, never through the map: for a
    /// one-off scan of a whole sealed segment that should not stay resident (mapped pages
    /// count in the process's RSS for as long as the mapping lives).
    pub(crate) fn read_unmapped(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX).min(1 << 30)];
        self.file
            .read_exact_at(&mut buf, offset)
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

    /// Unlink the file once the last handle (and its map) is dropped.
    pub(crate) fn delete_when_unused(&self) {
        self.delete_on_drop.store(true, Ordering::Release);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.delete_on_drop.load(Ordering::Acquire) {
            let removed = self
                .fs
                .remove(&self.path)
                .map_err(Error::io("deleting a retired segment"))
                .and_then(|()| {
                    self.path
                        .parent()
                        .map_or(Ok(()), |d| sync_dir(self.fs.as_ref(), d))
                });
            match removed {
                Ok(()) => tracing::debug!(path = %self.path.display(), "deleted retired segment"),
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not delete segment")
                }
            }
        }
    }
}
