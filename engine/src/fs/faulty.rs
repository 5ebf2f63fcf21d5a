//! `FaultyFs`: an in-memory file system that keeps, per file, the bytes *written* and the
//! bytes made *durable* by fsync, and injects crashes, torn writes, I/O errors, ENOSPC and
//! bit flips. Deterministic from a seed.
//!
//! A power loss keeps each file's durable bytes and, of the bytes written since its last
//! sync, either a random strict prefix ([`Tear::Prefix`]) or a random subset of its 4 KiB
//! sectors ([`Tear::Sectors`]: a multi-page write whose later sectors reached the disk and
//! earlier ones did not, as XFS or NVMe out-of-order completion can leave it). Sealed
//! segments are "mapped" as in-memory copies, so reads take the same path as production.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{FileSystem, SegmentFile};

/// A fault to inject at a chosen operation (a write, a sync, a truncation, an unlink, a
/// rename, a directory sync).
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

/// How a power loss tears the bytes written since a file's last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tear {
    /// A random strict prefix survives.
    #[default]
    Prefix,
    /// Each 4 KiB sector survives or not, independently; lost ones read as zeros, and the
    /// file's length is either its synced or its written length.
    Sectors,
}

/// The sector size [`Tear::Sectors`] tears at.
pub const SECTOR_BYTES: usize = 4096;

#[derive(Debug, Clone, Default)]
struct Image {
    written: Vec<u8>,
    durable: Vec<u8>,
    linked: bool,
    durable_linked: bool,
    /// After a rename over this name and before the directory is synced: the durable
    /// content of the file the name pointed to before, which a crash brings back.
    shadow: Option<Vec<u8>>,
    /// Unlinked by `remove` since the directory was last synced. Directory updates that no
    /// sync ordered reach the disk in any order: a torn power loss keeps each such unlink
    /// or not, independently (a rename stays atomic).
    unlinked: bool,
}

#[derive(Debug)]
struct State {
    files: BTreeMap<PathBuf, Image>,
    rng: u64,
    ops: u64,
    faults: BTreeMap<u64, Fault>,
    no_space: bool,
    dead: bool,
    tear: Tear,
    /// Incremented by every power loss: the simulated machine's boot id.
    boot: u64,
    /// Bytes the simulated disk holds (`None`: unlimited); writes beyond fail with ENOSPC.
    capacity: Option<u64>,
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

    /// Bytes held by linked files.
    fn used(&self) -> u64 {
        self.files
            .values()
            .filter(|i| i.linked)
            .map(|i| i.written.len() as u64)
            .sum()
    }

    /// Power loss: each file keeps its durable bytes plus, when `torn`, part of its unsynced
    /// bytes (per the [`Tear`] mode); files whose creation was never made durable vanish.
    fn power_loss(&mut self, torn: bool) {
        let paths: Vec<PathBuf> = self.files.keys().cloned().collect();
        for path in paths {
            let Some(img) = self.files.get(&path).cloned() else {
                continue;
            };
            if !img.durable_linked {
                self.files.remove(&path);
                continue;
            }
            if img.unlinked && torn && self.below(2) == 1 {
                self.files.remove(&path); // this unlink reached the disk
                continue;
            }
            let bytes = if let Some(old) = img.shadow.clone() {
                old
            } else if torn {
                match self.tear {
                    Tear::Prefix => self.prefix_tear(&img),
                    Tear::Sectors => self.sector_tear(&img),
                }
            } else {
                img.durable.clone()
            };
            if let Some(img) = self.files.get_mut(&path) {
                img.written = bytes.clone();
                img.durable = bytes;
                img.linked = true;
                img.shadow = None;
                img.unlinked = false;
            }
        }
        self.boot += 1;
        self.dead = true;
    }

    /// The durable bytes and a random strict prefix of the unsynced ones.
    fn prefix_tear(&mut self, img: &Image) -> Vec<u8> {
        let durable = img.durable.len();
        let unsynced = img.written.len().saturating_sub(durable) as u64;
        let extra = usize::try_from(self.below(unsynced)).unwrap_or(0);
        let mut bytes = img.durable.clone();
        if let Some(tail) = img.written.get(durable..durable + extra) {
            bytes.extend_from_slice(tail);
        }
        bytes
    }

    /// The durable bytes, and each unsynced 4 KiB sector or zeros, at the synced or the
    /// written length; at least one unsynced sector is lost (like the prefix mode's strict
    /// prefix: a crash in the middle of a write never completes it).
    fn sector_tear(&mut self, img: &Image) -> Vec<u8> {
        let durable = img.durable.len();
        let written = img.written.len();
        let len = if self.below(2) == 0 { durable } else { written };
        let mut bytes = img.durable.clone();
        bytes.resize(len.max(durable), 0);
        let first = durable - durable % SECTOR_BYTES;
        let sectors: Vec<usize> = (first..len).step_by(SECTOR_BYTES).collect();
        let mut kept: Vec<bool> = sectors.iter().map(|_| self.below(2) == 1).collect();
        if !kept.is_empty() && kept.iter().all(|k| *k) {
            let lose = usize::try_from(self.below(kept.len() as u64)).unwrap_or(0);
            if let Some(k) = kept.get_mut(lose) {
                *k = false;
            }
        }
        for (start, keep) in sectors.into_iter().zip(kept) {
            let end = (start + SECTOR_BYTES).min(len);
            let from = start.max(durable);
            if keep {
                if let (Some(dst), Some(src)) =
                    (bytes.get_mut(from..end), img.written.get(from..end))
                {
                    dst.copy_from_slice(src);
                }
            }
        }
        bytes
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
                tear: Tear::default(),
                boot: 0,
                capacity: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Operations that can fail performed so far (writes, syncs, truncations, unlinks,
    /// renames, directory syncs).
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

    /// How later power losses tear unsynced bytes.
    pub fn set_tear(&self, tear: Tear) {
        self.lock().tear = tear;
    }

    /// Limits the disk to `bytes` (`None`: unlimited): writes that would grow the files
    /// beyond it fail with ENOSPC, and [`FileSystem::available_bytes`] reports the rest.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.lock().capacity = bytes;
    }

    /// Power loss now. With `torn`, each file keeps part of its unsynced bytes (see
    /// [`FaultyFs::set_tear`]). The machine "reboots": its boot id changes. The file system
    /// is dead (every operation fails) until [`FaultyFs::revive`].
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
        if let Some(capacity) = s.capacity {
            let current = s
                .files
                .get(&self.path)
                .map_or(0, |i| i.written.len() as u64);
            let growth = (offset + buf.len() as u64).saturating_sub(current);
            if s.used() + growth > capacity {
                return Err(no_space());
            }
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
        match s.tick()? {
            Some(Fault::Eio) => return Err(eio()),
            Some(Fault::CrashDuringOp) => {
                s.power_loss(true);
                return Err(dead());
            }
            _ => {}
        }
        if let Some(img) = s.files.get_mut(&self.path) {
            img.written
                .resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
            img.durable = img.written.clone();
        }
        Ok(())
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

    fn boot_id(&self) -> Option<[u8; crate::format::BOOT_ID_BYTES]> {
        let mut id = [0xb0u8; crate::format::BOOT_ID_BYTES];
        id[..8].copy_from_slice(&self.lock().boot.to_le_bytes());
        Some(id)
    }

    fn available_bytes(&self, _dir: &Path) -> io::Result<u64> {
        let s = self.lock();
        if s.dead {
            return Err(dead());
        }
        Ok(s.capacity
            .map_or(u64::MAX / 2, |c| c.saturating_sub(s.used())))
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
        let fault = s.tick()?;
        if fault == Some(Fault::Eio) {
            return Err(eio());
        }
        let result = match s.files.get_mut(path).filter(|i| i.linked) {
            Some(img) => {
                img.linked = false;
                img.unlinked = true;
                Ok(())
            }
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        };
        if fault == Some(Fault::CrashDuringOp) {
            s.power_loss(true);
            return Err(dead());
        }
        result
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        match s.tick()? {
            Some(Fault::Eio) => return Err(eio()),
            Some(Fault::CrashDuringOp) => {
                s.power_loss(true);
                return Err(dead());
            }
            _ => {}
        }
        let Some(src) = s.files.get_mut(from).filter(|i| i.linked) else {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        };
        // Both names keep their durable state until the directory is synced: a crash before
        // that finds the directory as it was.
        src.linked = false;
        let (written, durable) = (src.written.clone(), src.durable.clone());
        let target = s.files.entry(to.to_path_buf()).or_default();
        let shadow = target.durable_linked.then(|| target.durable.clone());
        *target = Image {
            written,
            durable,
            linked: true,
            durable_linked: shadow.is_some(),
            shadow,
            unlinked: false,
        };
        Ok(())
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
        match s.tick()? {
            Some(Fault::Eio) => return Err(eio()),
            Some(Fault::CrashDuringOp) => {
                s.power_loss(true);
                return Err(dead());
            }
            _ => {}
        }
        s.files.retain(|p, i| i.linked || p.parent() != Some(dir));
        for (p, i) in &mut s.files {
            if p.parent() == Some(dir) {
                i.durable_linked = i.linked;
                i.shadow = None;
                i.unlinked = false;
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
