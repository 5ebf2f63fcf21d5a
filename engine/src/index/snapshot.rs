//! [`IndexSnapshot`]: reads of the index as of one moment. An answer built from several
//! reads (a verdict: the session's epoch and the stream's state; a task with its outcome,
//! input and queues) must not straddle a commit, or it describes a state that never
//! existed: an epoch advance supersedes the open streams and raises the epoch in one
//! commit, and a `Resolve` that read the session before it and the stream after it said
//! "superseded" under the old epoch.

use std::sync::RwLockReadGuard;

use super::{
    keys, layers_range, memtable_get, prefix_end, raise_head, split_stream_key, stream_in_memory,
    stream_key, Index, KvRead, Memtable, Overlay,
};
use crate::error::Result;
use crate::state::{SessionMeta, StateView, StreamMeta};

/// Reads of the index as of one moment (see [`Index::snapshot`]).
pub(crate) struct IndexSnapshot<'a> {
    pub(super) index: &'a Index,
    pub(super) mem: RwLockReadGuard<'a, Memtable>,
}

impl IndexSnapshot<'_> {
    /// The memtable's writes in `start..end`, raised heads patched in, as the snapshot
    /// holds them.
    fn overlay_range(&self, start: &[u8], end: Option<&[u8]>) -> Result<Overlay> {
        let mut out = Overlay::new();
        for id in layers_range(&self.mem, start, end, &mut out) {
            out.insert(stream_key(id).to_vec(), self.stream_value(id)?);
        }
        Ok(out)
    }

    fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let overlay = self.overlay_range(start, end)?;
        self.index.merge_range(overlay, start, end, limit)
    }

    fn stream_parts(&self, id: u64) -> Result<(Option<Vec<u8>>, Option<u64>)> {
        self.index
            .stream_parts_from(stream_in_memory(&self.mem, id), id)
    }

    fn stream_value(&self, id: u64) -> Result<Option<Vec<u8>>> {
        let (value, head) = self.stream_parts(id)?;
        match (value, head) {
            (Some(v), Some(head)) => Ok(Some(raise_head(&stream_key(id), &v, head)?)),
            (value, _) => Ok(value),
        }
    }
}

/// The same reads as [`Index`]'s, with the memtable held as it was when the snapshot was
/// taken. sled changes meanwhile only by the flush of a layer the snapshot still shows
/// (and reads first), so what it adds is what the snapshot already sees.
impl KvRead for IndexSnapshot<'_> {
    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(id) = split_stream_key(key) {
            return self.stream_value(id);
        }
        match memtable_get(&self.mem, key) {
            Some(v) => Ok(v),
            None => self
                .index
                .stored_get(key, |start, end| self.range(start, Some(end), 1)),
        }
    }

    fn raw_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.range(prefix, prefix_end(prefix).as_deref(), usize::MAX)
    }

    fn raw_range_keys(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(keys(self.range(start, Some(end), usize::MAX)?))
    }
}

impl StateView for IndexSnapshot<'_> {
    fn session(&self, id: &str) -> Result<Option<SessionMeta>> {
        Ok(self.stored_session(id)?.map(|s| s.meta))
    }

    fn stream(&self, id: u64) -> Result<Option<StreamMeta>> {
        Ok(self.stored_stream(id)?.map(|s| s.meta))
    }
}
