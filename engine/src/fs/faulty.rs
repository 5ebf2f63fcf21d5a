//! `FaultyFs`: an in-memory file system that keeps, per file, the bytes *written* and the
//! bytes made *durable* by fsync, and injects crashes, torn writes, I/O errors, ENOSPC and
//! bit flips. Deterministic from a seed.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{FileSystem, SegmentFile};
use crate::mmap::SegmentMap;

/// A fault to inject at a chosen write/sync operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Power is lost during the operation: a random strict prefix of everything not yet
    /// durable (this write included) reaches the disk, then the file system is dead until
    /// [`FaultyFs::revive`]. The operation fails.
    CrashDuringOp,
    /// The operation fails with EIO (nothing changes).
    Eio,
    /// This and every later write fails with ENOSPC until [`FaultyFs::clear_faults`].
    NoSpace,
}

#[derive(Debug, Clone, Default)]
struct Image {
    written: Vec<u8>,
    durable: Vec<u8>,
    linked: bool,
    durable_linked: bool,
}

#[derive(Debug)]
struct State {
    files: BTreeMap<PathBuf, Image>,
    rng: u64,
    ops: u64,
    faults: BTreeMap<u64, Fault>,
    no_space: bool,
    dead: bool,
}

impl State {
    fn next_random(&mut self) -> u64 {
        // splitmix64: tiny, deterministic, good enough for fault placement.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_random() % n
        }
    }

    /// Counts an operation and returns the fault planned for it.
    fn tick(&mut self) -> io::Result<Option<Fault>> {
        if self.dead {
            return Err(dead());
        }
        self.ops += 1;
        let fault = self.faults.remove(&self.ops);
        if fault == Some(Fault::NoSpace) {
            self.no_space = true;
        }
        Ok(fault)
    }

    /// Power loss: each file keeps its durable bytes plus, when `torn`, a random strict
    /// prefix of its unsynced bytes; files whose creation was never made durable vanish.
    fn power_loss(&mut self, torn: bool) {
        let paths: Vec<PathBuf> = self.files.keys().cloned().collect();
        for path in paths {
            let keep = {
                let Some(img) = self.files.get(&path) else {
                    continue;
                };
                let durable = img.durable.len() as u64;
                let unsynced = (img.written.len() as u64).saturating_sub(durable);
                (durable, unsynced, img.durable_linked)
            };
            let (durable, unsynced, linked) = keep;
            if !linked {
                self.files.remove(&path);
                continue;
            }
            let extra = if torn { self.below(unsynced) } else { 0 };
            if let Some(img) = self.files.get_mut(&path) {
                let mut bytes = img.durable.clone();
                let end = usize::try_from(durable + extra)
                    .unwrap_or(usize::MAX)
                    .min(img.written.len());
                if let Some(tail) = img.written.get(bytes.len()..end) {
                    bytes.extend_from_slice(tail);
                }
                img.written = bytes.clone();
                img.durable = bytes;
                img.linked = true;
            }
        }
        self.dead = true;
    }
}

fn dead() -> io::Error {
    io::Error::other("simulated power loss: the file system is gone until revived")
}

fn eio() -> io::Error {
    io::Error::other("injected I/O error (EIO)")
}

fn no_space() -> io::Error {
    io::Error::new(io::ErrorKind::StorageFull, "injected ENOSPC")
}

/// In-memory fault-injecting file system. Cheap to clone; clones share the same disk.
#[derive(Debug, Clone)]
pub struct FaultyFs {
    state: Arc<Mutex<State>>,
}

impl FaultyFs {
    /// A new, empty disk whose random choices follow `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                files: BTreeMap::new(),
                rng: seed,
                ops: 0,
                faults: BTreeMap::new(),
                no_space: false,
                dead: false,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Write/sync operations performed so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Injects `fault` at the operation `after` operations from now (1 = the next one).
    pub fn inject(&self, after: u64, fault: Fault) {
        let mut s = self.lock();
        let at = s.ops + after.max(1);
        s.faults.insert(at, fault);
    }

    /// Removes planned faults and ends ENOSPC.
    pub fn clear_faults(&self) {
        let mut s = self.lock();
        s.faults.clear();
        s.no_space = false;
    }

    /// Power loss now. With `torn`, each file keeps a random prefix of its unsynced bytes.
    /// The file system is dead (every operation fails) until [`FaultyFs::revive`].
    pub fn crash(&self, torn: bool) {
        self.lock().power_loss(torn);
    }

    /// Power is back: the disk holds what survived the crash.
    pub fn revive(&self) {
        let mut s = self.lock();
        s.dead = false;
        s.faults.clear();
        s.no_space = false;
    }

    /// Flips one bit of a file, in the written and the durable image (bit rot).
    pub fn flip_bit(&self, path: &Path, offset: u64, bit: u8) {
        let mut s = self.lock();
        if let Some(img) = s.files.get_mut(path) {
            let at = usize::try_from(offset).unwrap_or(usize::MAX);
            for bytes in [&mut img.written, &mut img.durable] {
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= 1 << (bit % 8);
                }
            }
        }
    }

    /// Durable length of a file, if it exists durably.
    pub fn durable_len(&self, path: &Path) -> Option<u64> {
        let s = self.lock();
        s.files
            .get(path)
            .filter(|i| i.durable_linked)
            .map(|i| i.durable.len() as u64)
    }

    /// Paths of the files that currently exist.
    pub fn files(&self) -> Vec<PathBuf> {
        self.lock()
            .files
            .iter()
            .filter(|(_, i)| i.linked)
            .map(|(p, _)| p.clone())
            .collect()
    }
}

#[derive(Debug)]
struct FaultyFile {
    fs: FaultyFs,
    path: PathBuf,
}

impl SegmentFile for FaultyFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut s = self.fs.lock();
        let fault = s.tick()?;
        if s.no_space {
            return Err(no_space());
        }
        match fault {
            Some(Fault::Eio) => return Err(eio()),
            Some(Fault::NoSpace) => return Err(no_space()),
            _ => {}
        }
        let img = s
            .files
            .get_mut(&self.path)
            .filter(|i| i.linked)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let start =
            usize::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if img.written.len() < start + buf.len() {
            img.written.resize(start + buf.len(), 0);
        }
        img.written[start..start + buf.len()].copy_from_slice(buf);
        if fault == Some(Fault::CrashDuringOp) {
            s.power_loss(true);
            return Err(dead());
        }
        Ok(())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let s = self.fs.lock();
        if s.dead {
            return Err(dead());
        }
        let img = s
            .files
            .get(&self.path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let start =
            usize::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let src = img
            .written
            .get(start..start + buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut s = self.fs.lock();
        match s.tick()? {
            Some(Fault::Eio) => return Err(eio()),
            Some(Fault::CrashDuringOp) => {
                s.power_loss(true);
                return Err(dead());
            }
            _ => {}
        }
        if let Some(img) = s.files.get_mut(&self.path) {
            img.durable = img.written.clone();
        }
        Ok(())
    }

    fn set_len_and_sync(&self, len: u64) -> io::Result<()> {
        let mut s = self.fs.lock();
        if s.tick()? == Some(Fault::Eio) {
            return Err(eio());
        }
        if let Some(img) = s.files.get_mut(&self.path) {
            img.written
                .resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
            img.durable = img.written.clone();
        }
        Ok(())
    }

    fn map(&self) -> io::Result<Option<SegmentMap>> {
        Ok(None)
    }
}

impl FileSystem for FaultyFs {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        let mut s = self.lock();
        if s.dead {
            return Err(dead());
        }
        if s.files.get(path).is_some_and(|i| i.linked) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        let img = s.files.entry(path.to_path_buf()).or_default();
        img.written.clear();
        img.linked = true;
        Ok(Arc::new(FaultyFile {
            fs: self.clone(),
            path: path.to_path_buf(),
        }))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        let s = self.lock();
        if s.dead {
            return Err(dead());
        }
        if !s.files.get(path).is_some_and(|i| i.linked) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(Arc::new(FaultyFile {
            fs: self.clone(),
            path: path.to_path_buf(),
        }))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let s = self.lock();
        if s.dead {
            return Err(dead());
        }
        s.files
            .get(path)
            .filter(|i| i.linked)
            .map(|i| i.written.clone())
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(self.read(path)?.len() as u64)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if s.dead {
            return Err(dead());
        }
        match s.files.get_mut(path).filter(|i| i.linked) {
            Some(img) => {
                img.linked = false;
                Ok(())
            }
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
        let s = self.lock();
        if s.dead {
            return Err(dead());
        }
        Ok(s.files
            .iter()
            .filter(|(p, i)| i.linked && p.parent() == Some(dir))
            .filter_map(|(p, _)| Some((p.file_name()?.to_str()?.to_owned(), p.clone())))
            .collect())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if s.dead {
            return Err(dead());
        }
        s.files.retain(|p, i| i.linked || p.parent() != Some(dir));
        for (p, i) in &mut s.files {
            if p.parent() == Some(dir) {
                i.durable_linked = i.linked;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_only_synced_bytes_and_synced_creations() {
        let fs = FaultyFs::new(1);
        let dir = Path::new("/d");
        let a = fs.create_new(&dir.join("a")).unwrap();
        a.write_all_at(b"hello", 0).unwrap();
        a.sync_data().unwrap();
        fs.sync_dir(dir).unwrap();
        a.write_all_at(b" world", 5).unwrap();
        let b = fs.create_new(&dir.join("b")).unwrap();
        b.write_all_at(b"x", 0).unwrap();
        b.sync_data().unwrap();
        fs.crash(false);
        assert!(fs.read(&dir.join("a")).is_err(), "dead until revived");
        fs.revive();
        assert_eq!(fs.read(&dir.join("a")).unwrap(), b"hello");
        assert!(
            fs.read(&dir.join("b")).is_err(),
            "creation never made durable"
        );
    }

    #[test]
    fn torn_crash_keeps_a_strict_prefix_of_the_unsynced_bytes() {
        for seed in 0..50 {
            let fs = FaultyFs::new(seed);
            let dir = Path::new("/d");
            let a = fs.create_new(&dir.join("a")).unwrap();
            fs.sync_dir(dir).unwrap();
            a.write_all_at(b"0123456789", 0).unwrap();
            fs.crash(true);
            fs.revive();
            let got = fs.read(&dir.join("a")).unwrap();
            assert!(
                got.len() < 10 && b"0123456789".starts_with(&got),
                "seed {seed}: {got:?}"
            );
        }
    }

    #[test]
    fn injected_faults_fire_at_their_operation() {
        let fs = FaultyFs::new(3);
        let dir = Path::new("/d");
        let a = fs.create_new(&dir.join("a")).unwrap();
        fs.inject(2, Fault::Eio);
        a.write_all_at(b"a", 0).unwrap();
        assert!(a.sync_data().is_err());
        fs.inject(1, Fault::NoSpace);
        assert_eq!(
            a.write_all_at(b"b", 1).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        assert_eq!(
            a.write_all_at(b"b", 1).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        fs.clear_faults();
        a.write_all_at(b"b", 1).unwrap();
    }
}
