//! Small files beside the log that must be all-or-nothing: written to a temporary name,
//! synced, renamed over the real one, and the directory synced (the clean-close mark; the
//! replicated log's vote and committed index). A crash at any point leaves the old file or
//! the new one, never a mix; readers check a CRC anyway, so a damaged file is refused
//! rather than believed.

use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::fs::FileSystem;
use crate::log::sync_dir;

/// Suffix of a file being written.
const TMP_SUFFIX: &str = ".tmp";

/// Replaces `dir/name` with `body` followed by its CRC-32, durably.
///
/// # Errors
/// I/O failures; the old file, if any, is then still in place.
pub(crate) fn write(fs: &dyn FileSystem, dir: &Path, name: &str, body: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let path = dir.join(name);
    match fs.remove(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("removing {}", tmp.display()))(e)),
    }
    let bytes = framed(body);
    let file = fs
        .create_new(&tmp)
        .map_err(Error::io(format!("creating {}", tmp.display())))?;
    file.write_all_at(&bytes, 0)
        .and_then(|()| file.sync_data())
        .map_err(Error::io(format!("writing {}", tmp.display())))?;
    drop(file);
    fs.rename(&tmp, &path).map_err(Error::io(format!(
        "renaming {} to {}",
        tmp.display(),
        path.display()
    )))?;
    sync_dir(fs, dir)
}

/// `body` followed by its CRC-32: the bytes [`write`] puts in a file and [`read`] checks,
/// for a caller that rewrites a fixed-size file in place (a torn rewrite reads as damaged).
pub(crate) fn framed(body: &[u8]) -> Vec<u8> {
    let mut bytes = body.to_vec();
    bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    bytes
}

/// What `dir/name` holds, if it exists.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// There is no such file.
    Missing,
    /// Its body (the CRC checked and removed).
    Body(Vec<u8>),
    /// It exists but its CRC does not match (or it is too short to hold one).
    Damaged,
}

/// Reads `dir/name` as [`write`] wrote it.
///
/// # Errors
/// I/O failures other than the file not existing.
pub(crate) fn read(fs: &dyn FileSystem, dir: &Path, name: &str) -> Result<Read> {
    let path = dir.join(name);
    let bytes = match fs.read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Read::Missing),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()))(e)),
    };
    let Some(split) = bytes.len().checked_sub(4) else {
        return Ok(Read::Damaged);
    };
    let (body, crc) = bytes.split_at(split);
    let stored = u32::from_le_bytes(crc.try_into().unwrap_or_default());
    if crc32fast::hash(body) == stored {
        Ok(Read::Body(body.to_vec()))
    } else {
        Ok(Read::Damaged)
    }
}

/// Removes `dir/name` durably (nothing to do if it does not exist).
///
/// # Errors
/// I/O failures.
pub(crate) fn remove(fs: &dyn FileSystem, dir: &Path, name: &str) -> Result<()> {
    let path = dir.join(name);
    match fs.remove(&path) {
        Ok(()) => sync_dir(fs, dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", path.display()))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::StdFs;

    #[test]
    fn round_trips_replaces_and_refuses_damage() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fs = StdFs;
        assert_eq!(read(&fs, dir.path(), "X").expect("read"), Read::Missing);
        write(&fs, dir.path(), "X", b"one").expect("write");
        write(&fs, dir.path(), "X", b"second").expect("write again");
        assert_eq!(
            read(&fs, dir.path(), "X").expect("read"),
            Read::Body(b"second".to_vec())
        );
        let path = dir.path().join("X");
        let mut bytes = std::fs::read(&path).expect("raw read");
        bytes[0] ^= 1;
        std::fs::write(&path, &bytes).expect("raw write");
        assert_eq!(read(&fs, dir.path(), "X").expect("read"), Read::Damaged);
        std::fs::write(&path, b"ab").expect("raw write");
        assert_eq!(read(&fs, dir.path(), "X").expect("read"), Read::Damaged);
        remove(&fs, dir.path(), "X").expect("remove");
        remove(&fs, dir.path(), "X").expect("remove twice");
        assert_eq!(read(&fs, dir.path(), "X").expect("read"), Read::Missing);
    }
}
