//! The file-system seam: every byte the log writes or reads goes through [`FileSystem`], so
//! tests can swap in a fault-injecting twin (`FaultyFs` in `fs/faulty.rs`, feature `testing`).
//!
//! Only this module touches OS file APIs for segments (no segment is memory-mapped). The sled
//! index and the directory lock use the real file system always.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One open segment file.
pub trait SegmentFile: Send + Sync + Debug {
    /// Writes all of `buf` at `offset`.
    ///
    /// # Errors
    /// OS errors (ENOSPC, EIO, ...).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Fills `buf` from `offset`.
    ///
    /// # Errors
    /// OS errors; `UnexpectedEof` past the end.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`.
    ///
    /// # Errors
    /// OS errors: the caller must not retry (the page cache state is unknown).
    fn sync_data(&self) -> io::Result<()>;
    /// Truncates or extends to `len` and syncs the metadata.
    ///
    /// # Errors
    /// OS errors.
    fn set_len_and_sync(&self, len: u64) -> io::Result<()>;
}

/// Directory-level operations and file opening.
pub trait FileSystem: Send + Sync + Debug {
    /// Creates a new file; fails if it exists.
    ///
    /// # Errors
    /// OS errors.
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>>;
    /// Opens an existing file for reading and writing.
    ///
    /// # Errors
    /// OS errors.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>>;
    /// Opens an existing file for reading only (sealed segments: never written again).
    ///
    /// # Errors
    /// OS errors.
    fn open_read_only(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.open(path)
    }
    /// The identity of the running boot of the machine (Linux: the kernel's random boot
    /// id), `None` when unknown. Recovery compares it with the one recorded when the last
    /// segment was created: a different boot means unsynced writes may have been lost.
    fn boot_id(&self) -> Option<[u8; crate::format::BOOT_ID_BYTES]> {
        None
    }
    /// Bytes available to this process on the file system holding `dir`.
    ///
    /// # Errors
    /// OS errors.
    fn available_bytes(&self, dir: &Path) -> io::Result<u64>;
    /// Reads a whole file.
    ///
    /// # Errors
    /// OS errors.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The file's length in bytes.
    ///
    /// # Errors
    /// OS errors.
    fn len(&self, path: &Path) -> io::Result<u64>;
    /// Unlinks a file (durable after [`FileSystem::sync_dir`]).
    ///
    /// # Errors
    /// OS errors.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to` atomically (durable after
    /// [`FileSystem::sync_dir`]).
    ///
    /// # Errors
    /// OS errors.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// The file names in a directory.
    ///
    /// # Errors
    /// OS errors.
    fn list(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>>;
    /// Makes creations and deletions in `dir` durable.
    ///
    /// # Errors
    /// OS errors.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdFs;

#[derive(Debug)]
struct StdFile(File);

impl SegmentFile for StdFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len_and_sync(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)?;
        self.0.sync_all()
    }
}

impl FileSystem for StdFs {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Arc::new(StdFile(f)))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(StdFile(f)))
    }

    fn open_read_only(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        Ok(Arc::new(StdFile(File::open(path)?)))
    }

    fn boot_id(&self) -> Option<[u8; crate::format::BOOT_ID_BYTES]> {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let hex: Vec<u8> = text.trim().bytes().filter(|b| *b != b'-').collect();
        let mut id = [0u8; crate::format::BOOT_ID_BYTES];
        for (i, pair) in hex.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).ok()?;
            *id.get_mut(i)? = u8::from_str_radix(s, 16).ok()?;
        }
        (hex.len() == 2 * crate::format::BOOT_ID_BYTES).then_some(id)
    }

    fn available_bytes(&self, dir: &Path) -> io::Result<u64> {
        let st = rustix::fs::statvfs(dir).map_err(io::Error::from)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(std::fs::metadata(path)?.len())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                out.push((name.to_owned(), entry.path()));
            }
        }
        Ok(out)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

#[cfg(feature = "testing")]
pub use faulty::{Fault, FaultyFs, Tear, SECTOR_BYTES};

#[cfg(feature = "testing")]
mod faulty;
