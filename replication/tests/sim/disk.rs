//! A disk with latency: [`FaultyFs`] whose syncs take a random 0–2 ms, as a real `fdatasync`
//! does. On an in-memory disk a write is durable microseconds after it starts, so a store
//! that reported an append flushed *before* writing it would almost never be caught; with a
//! sync that takes time, a power loss regularly lands between the report and the sync.
//! Everything else is delegated unchanged (the boot id included: it is how recovery knows a
//! power loss happened).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{FaultyFs, FileSystem, SegmentFile, BOOT_ID_BYTES};

/// The longest simulated sync, in microseconds.
const SYNC_MICROS_MAX: u64 = 2000;

/// [`FaultyFs`] with slow syncs.
#[derive(Debug, Clone)]
pub struct SlowFs {
    fs: FaultyFs,
    rng: Arc<AtomicU64>,
}

impl SlowFs {
    /// `fs` with sync latencies drawn from `seed`.
    pub fn new(fs: FaultyFs, seed: u64) -> Self {
        Self {
            fs,
            rng: Arc::new(AtomicU64::new(seed)),
        }
    }

    /// Sleeps for a sync's latency (on the store's blocking thread: the engine's I/O is
    /// synchronous).
    fn sync_latency(&self) {
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        std::thread::sleep(Duration::from_micros(z % (SYNC_MICROS_MAX + 1)));
    }

    fn wrap(&self, file: Arc<dyn SegmentFile>) -> Arc<dyn SegmentFile> {
        Arc::new(SlowFile {
            fs: self.clone(),
            file,
        })
    }
}

/// A file of a [`SlowFs`].
#[derive(Debug)]
struct SlowFile {
    fs: SlowFs,
    file: Arc<dyn SegmentFile>,
}

impl SegmentFile for SlowFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.fs.sync_latency();
        self.file.sync_data()
    }

    fn set_len_and_sync(&self, len: u64) -> io::Result<()> {
        self.fs.sync_latency();
        self.file.set_len_and_sync(len)
    }
}

impl FileSystem for SlowFs {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        Ok(self.wrap(self.fs.create_new(path)?))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        Ok(self.wrap(self.fs.open(path)?))
    }

    fn open_read_only(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        Ok(self.wrap(self.fs.open_read_only(path)?))
    }

    fn boot_id(&self) -> Option<[u8; BOOT_ID_BYTES]> {
        self.fs.boot_id()
    }

    fn available_bytes(&self, dir: &Path) -> io::Result<u64> {
        self.fs.available_bytes(dir)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.fs.read(path)
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        self.fs.len(path)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.fs.remove(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.fs.rename(from, to)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
        self.fs.list(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.sync_latency();
        self.fs.sync_dir(dir)
    }
}
