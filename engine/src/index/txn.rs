//! [`Txn`]: the writer's overlay over the index while it plans a group commit.

use super::*;

/// Decoded streams by id (`None`: known not to exist).
pub(crate) type StreamCache = HashMap<u64, Option<StoredStream>>;

/// Pending index writes over a read view of the index.
///
/// Streams are kept decoded while a group commit is planned (an append touches its stream
/// once per event) and encoded once, when the writes are taken.
#[derive(Debug)]
pub(crate) struct Txn<'a> {
    base: &'a Index,
    writes: Overlay,
    streams: RefCell<StreamCache>,
    dirty_streams: BTreeSet<u64>,
}

impl<'a> Txn<'a> {
    pub(crate) fn new(base: &'a Index) -> Self {
        Self::with_streams(base, StreamCache::new())
    }

    /// A transaction that starts from already decoded streams. They must equal what `base`
    /// holds for them: the writer passes the cache the previous [`Index::commit`] returned
    /// (it is the only one changing the index), so a stream is decoded once, not per commit.
    pub(crate) fn with_streams(base: &'a Index, streams: StreamCache) -> Self {
        Self {
            base,
            writes: Overlay::new(),
            streams: RefCell::new(streams),
            dirty_streams: BTreeSet::new(),
        }
    }

    /// The decoded streams, when the transaction is dropped without committing anything.
    /// Only valid if nothing was changed ([`Txn::is_empty`]).
    pub(crate) fn into_streams(self) -> StreamCache {
        debug_assert!(
            self.is_empty(),
            "a changed transaction's cache is not the index"
        );
        self.streams.into_inner()
    }

    /// Calls `f` with the stream (as this transaction sees it) without copying it.
    pub(crate) fn with_stream<R>(
        &self,
        id: u64,
        f: impl FnOnce(Option<&StoredStream>) -> R,
    ) -> Result<R> {
        if !self.streams.borrow().contains_key(&id) {
            self.stored_stream(id)?;
        }
        let streams = self.streams.borrow();
        Ok(f(streams.get(&id).and_then(Option::as_ref)))
    }

    pub(crate) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.forget_cached(&key);
        self.writes.insert(key, Some(value));
    }

    pub(crate) fn remove_raw(&mut self, key: Vec<u8>) {
        self.forget_cached(&key);
        self.writes.insert(key, None);
    }

    /// A raw write to a stream key replaces any decoded copy.
    fn forget_cached(&mut self, key: &[u8]) {
        if key.first() == Some(&prefix::STREAM) {
            if let Some(id) = key
                .get(1..9)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
            {
                self.streams.get_mut().remove(&id);
                self.dirty_streams.remove(&id);
            }
        }
    }

    pub(crate) fn put_session(&mut self, s: &StoredSession) {
        self.put_raw(session_key(&s.meta.id), encode_value(s));
    }

    pub(crate) fn put_stream(&mut self, s: &StoredStream) {
        self.streams.get_mut().insert(s.meta.id, Some(s.clone()));
        self.dirty_streams.insert(s.meta.id);
    }

    /// Changes a stream in place (if it exists) without copying it: the per-event path.
    pub(crate) fn update_stream(
        &mut self,
        id: u64,
        f: impl FnOnce(&mut StoredStream),
    ) -> Result<()> {
        if !self.streams.get_mut().contains_key(&id) {
            self.stored_stream(id)?;
        }
        if let Some(Some(s)) = self.streams.get_mut().get_mut(&id) {
            f(s);
            self.dirty_streams.insert(id);
        }
        Ok(())
    }

    pub(crate) fn put_terminal_frame(&mut self, e: &EventBody) {
        self.put_raw(terminal_frame_key(e.stream).to_vec(), encode_value(e));
    }

    pub(crate) fn put_position(&mut self, stream: u64, seq: u64, pos: Position) {
        self.writes
            .insert(event_key(stream, seq).to_vec(), Some(pos.encode().to_vec()));
    }

    /// True when nothing is pending.
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.dirty_streams.is_empty()
    }

    /// The pending writes, with changed streams encoded, and the decoded streams.
    pub(super) fn into_writes(mut self) -> (Overlay, StreamCache) {
        let streams = self.streams.into_inner();
        for id in std::mem::take(&mut self.dirty_streams) {
            if let Some(Some(s)) = streams.get(&id) {
                self.writes
                    .insert(stream_key(id).to_vec(), Some(encode_value(s)));
            }
        }
        (self.writes, streams)
    }
}

impl KvRead for Txn<'_> {
    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if key.first() == Some(&prefix::STREAM) {
            if let Some(id) = key
                .get(1..9)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
            {
                if let Some(cached) = self.streams.borrow().get(&id) {
                    return Ok(cached.as_ref().map(encode_value));
                }
            }
        }
        match self.writes.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.base.raw_get(key),
        }
    }

    fn stored_stream(&self, id: u64) -> Result<Option<StoredStream>> {
        if let Some(cached) = self.streams.borrow().get(&id) {
            return Ok(cached.clone());
        }
        let k = stream_key(id);
        let found = match self.writes.get(k.as_slice()) {
            Some(v) => v.clone(),
            None => self.base.raw_get(&k)?,
        };
        let decoded: Option<StoredStream> = found.map(|v| decode_value(&k, &v)).transpose()?;
        self.streams.borrow_mut().insert(id, decoded.clone());
        Ok(decoded)
    }

    fn raw_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> =
            self.base.raw_scan(prefix)?.into_iter().collect();
        for (k, v) in self
            .writes
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            match v {
                Some(v) => merged.insert(k.clone(), v.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged.into_iter().collect())
    }

    fn raw_range_keys(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut merged: std::collections::BTreeSet<Vec<u8>> =
            self.base.raw_range_keys(start, end)?.into_iter().collect();
        for (k, v) in self.writes.range(start.to_vec()..end.to_vec()) {
            if v.is_some() {
                merged.insert(k.clone());
            } else {
                merged.remove(k);
            }
        }
        Ok(merged.into_iter().collect())
    }
}
