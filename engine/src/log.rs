//! The ordered set of segments: lookup by base LSN, rotation, retirement.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::segment::Segment;

/// Where a record lives: its segment (by base LSN), byte offset and frame length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

impl Position {
    /// Encoded size in the index.
    pub(crate) const BYTES: usize = 20;

    pub(crate) fn encode(self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..8].copy_from_slice(&self.segment.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let segment = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let offset = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        let len = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?);
        (b.len() == Self::BYTES).then_some(Self {
            segment,
            offset,
            len,
        })
    }
}

/// The live segments, ordered by base LSN; the last one is the active segment.
#[derive(Debug, Default)]
pub(crate) struct SegmentSet {
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
}

impl SegmentSet {
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<u64, Arc<Segment>>> {
        self.segments
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, Arc<Segment>>> {
        self.segments
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a segment (recovery, rotation).
    pub(crate) fn insert(&self, segment: Arc<Segment>) {
        self.write().insert(segment.base_lsn(), segment);
    }

    /// The segment with this base LSN.
    pub(crate) fn get(&self, base_lsn: u64) -> Option<Arc<Segment>> {
        self.read().get(&base_lsn).cloned()
    }

    /// All segments in LSN order.
    pub(crate) fn all(&self) -> Vec<Arc<Segment>> {
        self.read().values().cloned().collect()
    }

    /// Number of segments.
    pub(crate) fn count(&self) -> usize {
        self.read().len()
    }

    /// Bytes across all segments.
    pub(crate) fn total_bytes(&self) -> u64 {
        self.read().values().map(|s| s.len()).sum()
    }

    /// Removes segments from the set and marks their files for deletion once the last reader
    /// lets go.
    pub(crate) fn retire(&self, bases: &[u64]) -> Vec<PathBuf> {
        let mut map = self.write();
        let mut paths = Vec::new();
        for base in bases {
            if let Some(seg) = map.remove(base) {
                seg.delete_when_unused();
                paths.push(seg.path().to_path_buf());
            }
        }
        paths
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_round_trips() {
        let p = Position {
            segment: 7,
            offset: 1 << 40,
            len: 99,
        };
        assert_eq!(Position::decode(&p.encode()), Some(p));
        assert_eq!(Position::decode(&[0u8; 3]), None);
    }
}
