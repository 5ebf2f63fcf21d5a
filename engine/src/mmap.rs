//! Read-only maps of sealed segments: the only `unsafe` code in the workspace.

use std::fs::File;

/// A read-only view of a whole sealed, fsynced segment: a memory map made by the real file
/// system ([`crate::StdFs`]), or an in-memory copy made by a simulated one, so tests walk
/// the same read path as production.
///
/// # Invariants
/// Only sealed segments are mapped. A sealed segment is never written, truncated or
/// overwritten while cursorlog holds its directory lock. Retention unlinks a retired
/// segment's file while maps of it may still be alive (events read from it share it as
/// `Bytes`): on Linux an unlinked file's pages stay valid until the last map goes. Every
/// read through the map checks the frame CRC, so bytes changed behind our back are reported
/// as corruption, not served.
#[derive(Debug)]
pub struct SegmentMap(Inner);

#[derive(Debug)]
enum Inner {
    Mapped(memmap2::Mmap),
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    InMemory(Vec<u8>),
}

impl SegmentMap {
    /// Maps `file` read-only.
    pub(crate) fn map(file: &File) -> std::io::Result<Self> {
        #[expect(unsafe_code, reason = "memmap2 cannot prove the file is not modified")]
        // SAFETY: the file is a sealed segment (see the type's invariants): this process
        // never writes or truncates it again, the directory lock keeps other cursorlog
        // processes away, and readers verify CRCs so external tampering cannot be served.
        let map = unsafe { memmap2::Mmap::map(file)? };
        Ok(Self(Inner::Mapped(map)))
    }

    /// A "map" holding a copy of the bytes, for a simulated file system.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn in_memory(bytes: Vec<u8>) -> Self {
        Self(Inner::InMemory(bytes))
    }
}

/// Lets a map own a `bytes::Bytes`, so events read from a sealed segment carry slices of
/// the map instead of copies of their payloads.
impl AsRef<[u8]> for SegmentMap {
    fn as_ref(&self) -> &[u8] {
        match &self.0 {
            Inner::Mapped(m) => m,
            Inner::InMemory(v) => v,
        }
    }
}
