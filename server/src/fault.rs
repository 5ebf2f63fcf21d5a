//! TEST ONLY: the file system behind the hidden `--fault-fail-fsync-after N` flag. The real
//! file system, except that the N-th `fdatasync` of a segment file (counted over all files
//! since start) fails with EIO, as a failing disk would. The engine then poisons itself,
//! which is what the flag exists to exercise through the real binary: health, metrics, logs
//! and the exit status of a poisoned server.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cursorlog_engine::{FileSystem, SegmentFile, StdFs};

/// `EIO` ("Input/output error") on Linux and the BSDs.
const EIO: i32 = 5;

/// [`StdFs`] whose `fail_at`-th `sync_data` fails with EIO.
#[derive(Debug)]
pub struct FailFsyncAfter {
    inner: StdFs,
    syncs: Arc<AtomicU64>,
    fail_at: u64,
}

impl FailFsyncAfter {
    /// The real file system; the `fail_at`-th sync (1-based) fails.
    pub fn new(fail_at: u64) -> Self {
        Self {
            inner: StdFs,
            syncs: Arc::new(AtomicU64::new(0)),
            fail_at,
        }
    }

    fn wrap(&self, file: Arc<dyn SegmentFile>) -> Arc<dyn SegmentFile> {
        Arc::new(FaultFile {
            inner: file,
            syncs: Arc::clone(&self.syncs),
            fail_at: self.fail_at,
        })
    }
}

#[derive(Debug)]
struct FaultFile {
    inner: Arc<dyn SegmentFile>,
    syncs: Arc<AtomicU64>,
    fail_at: u64,
}

impl SegmentFile for FaultFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        let n = self.syncs.fetch_add(1, Ordering::AcqRel) + 1;
        if n == self.fail_at {
            tracing::warn!(
                sync = n,
                "--fault-fail-fsync-after: failing this fdatasync with EIO"
            );
            return Err(io::Error::from_raw_os_error(EIO));
        }
        self.inner.sync_data()
    }

    fn set_len_and_sync(&self, len: u64) -> io::Result<()> {
        self.inner.set_len_and_sync(len)
    }
}

impl FileSystem for FailFsyncAfter {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.inner.create_new(path).map(|f| self.wrap(f))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.inner.open(path).map(|f| self.wrap(f))
    }

    fn open_read_only(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.inner.open_read_only(path).map(|f| self.wrap(f))
    }

    /// The real boot id (16 bytes: the engine's `BOOT_ID_BYTES`, which it does not export).
    fn boot_id(&self) -> Option<[u8; 16]> {
        self.inner.boot_id()
    }

    fn available_bytes(&self, dir: &Path) -> io::Result<u64> {
        self.inner.available_bytes(dir)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.inner.read(path)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        self.inner.len(path)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
        self.inner.list(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_the_nth_sync_fails_with_eio() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FailFsyncAfter::new(3);
        let a = fs.create_new(&dir.path().join("a")).unwrap();
        let b = fs.create_new(&dir.path().join("b")).unwrap();
        a.write_all_at(b"x", 0).unwrap();
        assert!(a.sync_data().is_ok());
        assert!(b.sync_data().is_ok());
        let err = a.sync_data().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(EIO));
        assert!(b.sync_data().is_ok(), "only the N-th sync fails");
        let reopened = fs.open(&dir.path().join("a")).unwrap();
        let mut buf = [0_u8; 1];
        reopened.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"x");
    }
}
