//! [`SegmentMap`]: what [`crate::SegmentFile::map`] returns, kept so the file-system seam
//! keeps its shape. The engine no longer calls it: no segment is memory-mapped, because a
//! fault under a map (a file cut short, a media error) is a `SIGBUS` that kills the process
//! on every read of that range; every read is a positional read that fails with an error
//! instead (see docs/DESIGN-NOTES.md, "Sealed segments are read with pread, not mapped").
//! There is no `unsafe` code left in the workspace.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// A copy of a whole segment's bytes, read with positional reads.
#[derive(Debug)]
pub struct SegmentMap(Vec<u8>);

impl SegmentMap {
    /// Reads all of `file` (no map: see the module documentation).
    pub(crate) fn map(file: &File) -> std::io::Result<Self> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::FileTooLarge))?;
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, 0)?;
        Ok(Self(bytes))
    }

    /// A copy of `bytes`, for a simulated file system.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn in_memory(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
}

impl AsRef<[u8]> for SegmentMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}
