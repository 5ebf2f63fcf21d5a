//! The read descriptors of sealed segments: a small cache, shared by the process, of
//! read-only descriptors opened on demand and closed least recently used first.
//!
//! A sealed segment holds no descriptor of its own: a log may keep thousands of sealed
//! segments (retention by age bounds their number only by the write rate), and each would
//! otherwise hold one for as long as it lives. The cache bounds what reads keep open to
//! [`DESCRIPTORS_MAX`] at rest, plus one per read in flight whose entry was evicted under it
//! (it holds its own `Arc` until it is done). A segment's entry leaves with the segment
//! ([`forget`], from its `Drop`), so a retired segment's descriptor is closed once the last
//! read of it ends.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::fs::SegmentFile;

/// Sealed-segment descriptors kept open at rest, across every engine in the process.
pub(super) const DESCRIPTORS_MAX: usize = 32;

/// (segment id, descriptor), least recently used first. At most [`DESCRIPTORS_MAX`]
/// entries: a linear scan of them costs less than any read it serves.
static CACHE: Mutex<Vec<(u64, Arc<dyn SegmentFile>)>> = Mutex::new(Vec::new());

fn lock() -> MutexGuard<'static, Vec<(u64, Arc<dyn SegmentFile>)>> {
    CACHE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The cached descriptor of segment `id`, now the most recently used.
pub(super) fn get(id: u64) -> Option<Arc<dyn SegmentFile>> {
    let mut cache = lock();
    let at = cache.iter().position(|(i, _)| *i == id)?;
    let entry = cache.remove(at);
    let file = Arc::clone(&entry.1);
    cache.push(entry);
    Some(file)
}

/// Caches `file` for segment `id` (evicting the least recently used entry when full) and
/// returns the descriptor to use: `file`, or the one another reader cached meanwhile.
pub(super) fn put(id: u64, file: Arc<dyn SegmentFile>) -> Arc<dyn SegmentFile> {
    let mut cache = lock();
    if let Some((_, cached)) = cache.iter().find(|(i, _)| *i == id) {
        return Arc::clone(cached);
    }
    if cache.len() >= DESCRIPTORS_MAX {
        cache.remove(0);
    }
    cache.push((id, Arc::clone(&file)));
    file
}

/// True while segment `id` has a cached descriptor.
pub(super) fn contains(id: u64) -> bool {
    lock().iter().any(|(i, _)| *i == id)
}

/// Closes segment `id`'s cached descriptor, if any (the segment is gone).
pub(super) fn forget(id: u64) {
    lock().retain(|(i, _)| *i != id);
}
