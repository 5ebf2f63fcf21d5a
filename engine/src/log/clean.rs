//! The clean-close mark. A clean close syncs the log and then writes `CLEAN` beside it
//! naming exactly where the log ends; the next open reads it and removes it (durably)
//! before anything is written. The mark takes no LSN and no entry: it is this node's
//! fact, not part of the log, so the LSNs (and with them stream ids) of a replicated log
//! stay identical on every replica. (Format versions 1 and 2 wrote a `Shutdown` record
//! instead; a tail ending in one still reads as clean.)

use std::path::Path;

use crate::error::Result;
use crate::fs::FileSystem;
use crate::log::durable_file::{self, Read};

/// The mark's file name in the data directory.
pub(crate) const CLEAN_FILE: &str = "CLEAN";
/// The first bytes of the mark (its version is the last byte).
const MAGIC: [u8; 8] = *b"CLCLEAN1";

/// Where a cleanly closed log ended: every byte before it was synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CleanMark {
    /// Base LSN of the tail segment.
    pub segment: u64,
    /// The tail segment's length in bytes.
    pub len: u64,
    /// The last record's LSN (0 for none).
    pub last_lsn: u64,
    /// The last entry's index (0 for none).
    pub last_entry: u64,
}

impl CleanMark {
    fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        for v in [self.segment, self.len, self.last_lsn, self.last_entry] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let rest = b.strip_prefix(&MAGIC[..])?;
        if rest.len() != 32 {
            return None;
        }
        let field = |i: usize| {
            rest.get(i * 8..i * 8 + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_le_bytes)
        };
        Some(Self {
            segment: field(0)?,
            len: field(1)?,
            last_lsn: field(2)?,
            last_entry: field(3)?,
        })
    }

    /// Writes the mark durably (the caller synced the log first).
    ///
    /// # Errors
    /// I/O failures.
    pub(crate) fn write(&self, fs: &dyn FileSystem, dir: &Path) -> Result<()> {
        durable_file::write(fs, dir, CLEAN_FILE, &self.encode())
    }

    /// Reads the mark a clean close left, and removes it durably: from here on the log may
    /// change, and a crash must not find a mark that no longer describes it. A damaged mark
    /// reads as none (the close is then not known to be clean: the safe answer).
    ///
    /// # Errors
    /// I/O failures.
    pub(crate) fn take(fs: &dyn FileSystem, dir: &Path) -> Result<Option<Self>> {
        let mark = match durable_file::read(fs, dir, CLEAN_FILE)? {
            Read::Missing => return Ok(None),
            Read::Body(b) => Self::decode(&b),
            Read::Damaged => None,
        };
        if mark.is_none() {
            tracing::warn!(
                dir = %dir.display(),
                "the clean-close mark is damaged: treating the previous close as not clean"
            );
        }
        durable_file::remove(fs, dir, CLEAN_FILE)?;
        Ok(mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::StdFs;

    #[test]
    fn a_mark_is_read_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mark = CleanMark {
            segment: 1,
            len: 4096,
            last_lsn: 17,
            last_entry: 9,
        };
        mark.write(&StdFs, dir.path()).expect("write");
        assert_eq!(
            CleanMark::take(&StdFs, dir.path()).expect("take"),
            Some(mark)
        );
        assert_eq!(CleanMark::take(&StdFs, dir.path()).expect("take"), None);
        assert!(!dir.path().join(CLEAN_FILE).exists());
    }

    #[test]
    fn a_damaged_mark_is_not_clean_and_is_removed() {
        let dir = tempfile::tempdir().expect("temp dir");
        durable_file::write(&StdFs, dir.path(), CLEAN_FILE, b"CLCLEAN1short").expect("write");
        assert_eq!(CleanMark::take(&StdFs, dir.path()).expect("take"), None);
        assert!(!dir.path().join(CLEAN_FILE).exists());
    }
}
