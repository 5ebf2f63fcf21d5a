//! TEST ONLY: the file system behind the hidden `--fault-power-cut-boot N` flag. Writes stay
//! in this process's memory until the file's `fdatasync`, the way a disk's volatile cache
//! and the page cache hold them, so a `SIGKILL` loses exactly the bytes a power cut may
//! lose: every write since the file's last sync. (Jepsen's LazyFS does this below a real
//! process with FUSE; this does it inside one, which needs no privileges.)
//!
//! A file that is closed (its last handle dropped, as at a clean exit) writes its unsynced
//! bytes to the real file without syncing them, as the kernel keeps a closed file's page
//! cache: only a kill loses them.
//!
//! What it models, and what it does not:
//! - unsynced writes to the log's files (segments, `COMMITTED`, the vote and its temporary
//!   files) are lost, all of them: the worst case of a power cut, not a random subset;
//! - directory operations (create, rename, unlink) reach the directory at once, as if each
//!   were followed by a directory fsync: a power cut that loses an unsynced rename is not
//!   modelled (the engine fsyncs the directory after each one it relies on);
//! - a torn write inside one sync is not modelled (`engine/tests/power_loss.rs` tears them
//!   in process).
//!
//! The boot id is derived from `N`: the harness passes a new `N` after each simulated power
//! cut, so recovery sees a new boot, as it would after a real one.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cursorlog_engine::{FileSystem, SegmentFile, StdFs};

/// The real file system, with every file's writes held in memory until its next sync.
#[derive(Debug)]
pub struct PowerCutFs {
    inner: StdFs,
    boot: u64,
    /// The open files by path, so a second open, `read` and `len` see unsynced writes.
    open: Arc<Mutex<HashMap<PathBuf, Weak<Volatile>>>>,
}

/// What a file holds beyond its synced bytes.
#[derive(Debug)]
struct Volatile {
    file: Arc<dyn SegmentFile>,
    state: Mutex<Unsynced>,
}

#[derive(Debug)]
struct Unsynced {
    /// Writes since the last sync, oldest first (a later write wins where they overlap).
    writes: Vec<(u64, Vec<u8>)>,
    /// The length the process sees: the synced file's, extended by the writes.
    len: u64,
    /// The real file's length (what a power cut leaves).
    real_len: u64,
}

impl PowerCutFs {
    /// The real file system, in the boot numbered `boot`.
    pub fn new(boot: u64) -> Self {
        Self {
            inner: StdFs,
            boot,
            open: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn registry(&self) -> MutexGuard<'_, HashMap<PathBuf, Weak<Volatile>>> {
        // A panic while holding this lock is a bug in this test-only module; the map stays
        // consistent (each operation is one insert or remove), so go on with it.
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn volatile(&self, path: &Path) -> Option<Arc<Volatile>> {
        self.registry().get(path).and_then(Weak::upgrade)
    }

    /// The file at `path`, sharing the unsynced writes of any open handle to it.
    fn wrap(
        &self,
        path: &Path,
        open: impl FnOnce() -> io::Result<Arc<dyn SegmentFile>>,
    ) -> io::Result<Arc<dyn SegmentFile>> {
        let mut registry = self.registry();
        if let Some(existing) = registry.get(path).and_then(Weak::upgrade) {
            return Ok(Arc::new(Handle(existing)));
        }
        let file = open()?;
        let len = std::fs::metadata(path)?.len();
        let volatile = Arc::new(Volatile {
            file,
            state: Mutex::new(Unsynced {
                writes: Vec::new(),
                len,
                real_len: len,
            }),
        });
        registry.insert(path.to_path_buf(), Arc::downgrade(&volatile));
        Ok(Arc::new(Handle(volatile)))
    }
}

/// One open handle (several share a [`Volatile`]).
#[derive(Debug)]
struct Handle(Arc<Volatile>);

impl Volatile {
    fn state(&self) -> MutexGuard<'_, Unsynced> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `buf.len()` bytes from `offset` as the process sees them.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let state = self.state();
        let end = offset.saturating_add(buf.len() as u64);
        if end > state.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the file",
            ));
        }
        buf.fill(0);
        // The real file's bytes first (it may end before `end`: the rest is unsynced).
        let real_end = end.min(state.real_len);
        if real_end > offset {
            let n = usize::try_from(real_end - offset).map_err(io::Error::other)?;
            self.file.read_exact_at(&mut buf[..n], offset)?;
        }
        for (at, bytes) in &state.writes {
            overlay(buf, offset, bytes, *at);
        }
        Ok(())
    }

    /// Writes every unsynced write to the real file, in order, then syncs it.
    fn flush(&self, state: &mut Unsynced) -> io::Result<()> {
        for (at, bytes) in &state.writes {
            self.file.write_all_at(bytes, *at)?;
            state.real_len = state.real_len.max(*at + bytes.len() as u64);
        }
        state.writes.clear();
        self.file.sync_data()
    }
}

impl Drop for Volatile {
    /// A file closed by a running process keeps its writes (the kernel holds them in its
    /// page cache), so a clean exit loses nothing; only a kill skips this.
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (at, bytes) in &state.writes {
            if let Err(e) = self.file.write_all_at(bytes, *at) {
                tracing::warn!("--fault-power-cut-boot: writing back a closed file: {e}");
                return;
            }
        }
    }
}

/// Copies the part of `src` (which starts at file offset `src_at`) that falls inside `dst`
/// (which starts at `dst_at`).
fn overlay(dst: &mut [u8], dst_at: u64, src: &[u8], src_at: u64) {
    let start = dst_at.max(src_at);
    let end = (dst_at + dst.len() as u64).min(src_at + src.len() as u64);
    if start >= end {
        return;
    }
    let (d, s) = ((start - dst_at) as usize, (start - src_at) as usize);
    let n = (end - start) as usize;
    dst[d..d + n].copy_from_slice(&src[s..s + n]);
}

impl SegmentFile for Handle {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.0.state();
        let end = offset.saturating_add(buf.len() as u64);
        // A write that covers an earlier unsynced one replaces it (`COMMITTED` is rewritten
        // in place on every commit and never synced: keep one copy, not one per commit).
        state
            .writes
            .retain(|(at, bytes)| !(offset <= *at && *at + bytes.len() as u64 <= end));
        state.writes.push((offset, buf.to_vec()));
        state.len = state.len.max(end);
        Ok(())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.0.state();
        self.0.flush(&mut state)
    }

    fn set_len_and_sync(&self, len: u64) -> io::Result<()> {
        let mut state = self.0.state();
        self.0.flush(&mut state)?;
        self.0.file.set_len_and_sync(len)?;
        state.len = len;
        state.real_len = len;
        Ok(())
    }
}

impl FileSystem for PowerCutFs {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.wrap(path, || self.inner.create_new(path))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.wrap(path, || self.inner.open(path))
    }

    fn open_read_only(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        // Read-write underneath: a sync through a read-only open of a file that another
        // handle wrote must be able to write those bytes.
        self.wrap(path, || self.inner.open(path))
    }

    /// 16 bytes (the engine's `BOOT_ID_BYTES`) that differ for every boot number.
    fn boot_id(&self) -> Option<[u8; 16]> {
        let mut id = [0_u8; 16];
        id[..8].copy_from_slice(b"powercut");
        id[8..].copy_from_slice(&self.boot.to_le_bytes());
        Some(id)
    }

    fn available_bytes(&self, dir: &Path) -> io::Result<u64> {
        self.inner.available_bytes(dir)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        match self.volatile(path) {
            Some(v) => {
                let len = v.state().len;
                let mut buf = vec![0_u8; usize::try_from(len).map_err(io::Error::other)?];
                v.read_at(&mut buf, 0)?;
                Ok(buf)
            }
            None => self.inner.read(path),
        }
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        match self.volatile(path) {
            Some(v) => Ok(v.state().len),
            None => self.inner.len(path),
        }
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)?;
        self.registry().remove(path);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut registry = self.registry();
        self.inner.rename(from, to)?;
        registry.remove(to);
        if let Some(moved) = registry.remove(from) {
            registry.insert(to.to_path_buf(), moved);
        }
        Ok(())
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

    fn read(file: &Arc<dyn SegmentFile>, at: u64, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        file.read_exact_at(&mut buf, at).unwrap();
        buf
    }

    #[test]
    fn unsynced_writes_are_seen_by_the_process_and_lost_by_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let fs = PowerCutFs::new(1);
        let file = fs.create_new(&path).unwrap();
        file.write_all_at(b"hello", 0).unwrap();
        file.sync_data().unwrap();
        file.write_all_at(b" world", 5).unwrap();
        file.write_all_at(b"W", 6).unwrap();
        assert_eq!(read(&file, 0, 11), b"hello World");
        assert_eq!(fs.len(&path).unwrap(), 11);
        assert_eq!(fs.read(&path).unwrap(), b"hello World");
        let again = fs.open_read_only(&path).unwrap();
        assert_eq!(
            read(&again, 3, 8),
            b"lo World",
            "a second handle sees them too"
        );
        let mut past = [0_u8; 2];
        assert_eq!(
            file.read_exact_at(&mut past, 10).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        // The disk holds only what was synced: this is what a SIGKILL leaves.
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        again.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"hello World");
    }

    #[test]
    fn an_overwritten_unsynced_write_is_kept_once_and_truncation_flushes_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("COMMITTED");
        let fs = PowerCutFs::new(1);
        let file = fs.create_new(&path).unwrap();
        for i in 0..1000_u32 {
            file.write_all_at(&i.to_le_bytes(), 0).unwrap();
        }
        let Some(v) = fs.volatile(&path) else {
            panic!("open file not registered")
        };
        assert_eq!(v.state().writes.len(), 1);
        assert_eq!(read(&file, 0, 4), 999_u32.to_le_bytes());
        file.write_all_at(b"tail", 4).unwrap();
        file.set_len_and_sync(6).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            [&999_u32.to_le_bytes()[..], b"ta"].concat()
        );
        assert_eq!(fs.len(&path).unwrap(), 6);
    }

    #[test]
    fn a_closed_file_keeps_its_unsynced_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("COMMITTED");
        let fs = PowerCutFs::new(1);
        let file = fs.create_new(&path).unwrap();
        file.write_all_at(b"42", 0).unwrap();
        assert!(std::fs::read(&path).unwrap().is_empty());
        drop(file);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"42",
            "a clean exit keeps them"
        );
    }

    #[test]
    fn a_renamed_file_keeps_its_unsynced_writes_and_each_boot_has_its_own_id() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, fin) = (dir.path().join("VOTE.tmp"), dir.path().join("VOTE"));
        let fs = PowerCutFs::new(7);
        let file = fs.create_new(&tmp).unwrap();
        file.write_all_at(b"v", 0).unwrap();
        fs.rename(&tmp, &fin).unwrap();
        assert_eq!(fs.read(&fin).unwrap(), b"v");
        assert!(std::fs::read(&fin).unwrap().is_empty(), "never synced");
        assert_ne!(PowerCutFs::new(7).boot_id(), PowerCutFs::new(8).boot_id());
    }
}
