//! Read-only maps of sealed segments: the only `unsafe` code in the workspace.

use std::fs::File;

/// A read-only memory map of a sealed, fsynced segment file. Only the real file system
/// ([`crate::StdFs`]) can make one; other [`crate::FileSystem`]s return `None` from `map`.
///
/// # Invariants
/// Only sealed segments are mapped. A sealed segment is never written, truncated or
/// overwritten while cursorlog holds its directory lock; it is unlinked only after the last
/// `Arc<Segment>` is dropped, and a map outliving that (events read from it share it as
/// `Bytes`) keeps the unlinked file's pages valid until the last of them goes. Every read
/// through the map checks the frame CRC, so bytes changed behind our back are reported as
/// corruption, not served.
#[derive(Debug)]
pub struct SegmentMap(memmap2::Mmap);

impl SegmentMap {
    /// Maps `file` read-only.
    pub(crate) fn map(file: &File) -> std::io::Result<Self> {
        #[expect(unsafe_code, reason = "memmap2 cannot prove the file is not modified")]
        // SAFETY: the file is a sealed segment (see the type's invariants): this process
        // never writes or truncates it again, the directory lock keeps other cursorlog
        // processes away, and readers verify CRCs so external tampering cannot be served.
        let map = unsafe { memmap2::Mmap::map(file)? };
        Ok(Self(map))
    }
}

/// Lets a map own a `bytes::Bytes`, so events read from a sealed segment carry slices of
/// the map instead of copies of their payloads.
impl AsRef<[u8]> for SegmentMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}
