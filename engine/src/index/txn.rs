//! [`Txn`]: the writer's overlay over the index while it plans a group commit.

use std::collections::HashSet;

use super::idhash::IdHashing;
use super::*;

/// Decoded streams by id (`None`: known not to exist).
pub(crate) type StreamCache = HashMap<u64, Option<StoredStream>, IdHashing>;

/// Pending index writes over a read view of the index.
///
/// Streams are kept decoded while a group commit is planned (an append touches its stream
/// once per event) and encoded once, when the writes are taken.
#[derive(Debug)]
pub(crate) struct Txn<'a> {
    base: &'a Index,
    writes: Layer<FlatRuns>,
    streams: RefCell<StreamCache>,
    /// Streams written whole (encoded into `writes` when taken).
    dirty_streams: HashSet<u64, IdHashing>,
    /// Streams whose head was raised (repeats allowed): those not in `dirty_streams` are
    /// taken as raised heads, without encoding the stream (see [`Layer::heads`]).
    raised_heads: Vec<u64>,
    /// How the pending writes change the counts.
    counts: Counts,
}

impl<'a> Txn<'a> {
    pub(crate) fn new(base: &'a Index) -> Self {
        Self::with_streams(base, StreamCache::default())
    }

    /// A transaction that starts from already decoded streams. They must equal what `base`
    /// holds for them: the writer passes the cache the previous [`Index::commit`] returned
    /// (it is the only one changing the index), so a stream is decoded once, not per commit.
    pub(crate) fn with_streams(base: &'a Index, streams: StreamCache) -> Self {
        Self {
            base,
            writes: Layer::default(),
            streams: RefCell::new(streams),
            dirty_streams: HashSet::default(),
            raised_heads: Vec::new(),
            counts: Counts::default(),
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

    /// Writes a key other than a run start's (those go through [`Txn::put_position`]).
    pub(crate) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.forget_cached(&key);
        self.writes.put(key, Some(value));
    }

    pub(crate) fn remove_raw(&mut self, key: Vec<u8>) {
        self.forget_cached(&key);
        self.writes.put(key, None);
    }

    /// A raw write to a stream key replaces any decoded copy.
    fn forget_cached(&mut self, key: &[u8]) {
        if let Some(id) = split_stream_key(key) {
            self.streams.get_mut().remove(&id);
            self.dirty_streams.remove(&id);
        }
    }

    /// Records a change of the session and stream counts.
    pub(crate) fn count(&mut self, d: Counts) {
        self.counts.add(d);
    }

    /// How the pending writes change the counts so far.
    pub(crate) fn pending_counts(&self) -> Counts {
        self.counts
    }

    pub(crate) fn put_session(&mut self, s: &StoredSession) {
        self.put_raw(session_key(&s.meta.id), encode_value(s));
    }

    pub(crate) fn put_stream(&mut self, s: &StoredStream) {
        self.streams.get_mut().insert(s.meta.id, Some(s.clone()));
        self.dirty_streams.insert(s.meta.id);
    }

    /// Raises a stream's head to at least `seq` (if the stream exists) without copying or
    /// re-encoding it: the per-event path.
    pub(crate) fn raise_head(&mut self, id: u64, seq: u64) -> Result<()> {
        if !self.streams.get_mut().contains_key(&id) {
            self.stored_stream(id)?;
        }
        if let Some(Some(s)) = self.streams.get_mut().get_mut(&id) {
            s.meta.head = s.meta.head.max(seq);
            self.raised_heads.push(id);
        }
        Ok(())
    }

    pub(crate) fn put_terminal_frame(&mut self, e: &EventBody) {
        self.put_raw(terminal_frame_key(e.stream).to_vec(), encode_value(e));
    }

    pub(crate) fn put_position(&mut self, stream: u64, seq: u64, pos: Position) {
        self.writes.put_run(stream, seq, Some(pos.encode()));
    }

    /// True when nothing is pending.
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.dirty_streams.is_empty() && self.raised_heads.is_empty()
    }

    /// The pending writes, with streams written whole encoded and raised heads as such,
    /// and the decoded streams.
    pub(super) fn into_writes(mut self) -> (Layer<FlatRuns>, StreamCache) {
        let streams = self.streams.into_inner();
        for &id in &self.dirty_streams {
            if let Some(Some(s)) = streams.get(&id) {
                self.writes
                    .put(stream_key(id).to_vec(), Some(encode_value(s)));
            }
        }
        // A stream written whole carries its head. Any other raised one is cached (or was
        // forgotten by a raw write, and is then skipped or re-read from that write), and its
        // cached head is its head now.
        let raised = std::mem::take(&mut self.raised_heads);
        self.writes.heads.reserve(raised.len());
        for id in raised {
            if self.dirty_streams.contains(&id) {
                continue;
            }
            if let Some(Some(s)) = streams.get(&id) {
                self.writes.heads.insert(id, s.meta.head);
            }
        }
        self.writes.counts = self.counts;
        (self.writes, streams)
    }
}

impl KvRead for Txn<'_> {
    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(id) = split_stream_key(key) {
            if let Some(cached) = self.streams.borrow().get(&id) {
                return Ok(cached.as_ref().map(encode_value));
            }
        }
        match self.writes.get(key) {
            Some(v) => Ok(v),
            None => self.base.raw_get(key),
        }
    }

    fn stored_stream(&self, id: u64) -> Result<Option<StoredStream>> {
        if let Some(cached) = self.streams.borrow().get(&id) {
            return Ok(cached.clone());
        }
        let k = stream_key(id);
        let decoded = match self.writes.kv.get(k.as_slice()) {
            Some(v) => v.as_ref().map(|v| decode_value(&k, v)).transpose()?,
            None => self.base.stored_stream(id)?,
        };
        self.streams.borrow_mut().insert(id, decoded.clone());
        Ok(decoded)
    }

    fn raw_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> =
            self.base.raw_scan(prefix)?.into_iter().collect();
        let mut writes = Overlay::new();
        self.writes
            .range_into(prefix, prefix_end(prefix).as_deref(), &mut writes);
        for (k, v) in writes {
            match v {
                Some(v) => merged.insert(k, v),
                None => merged.remove(&k),
            };
        }
        Ok(merged.into_iter().collect())
    }

    fn raw_range_keys(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut merged: std::collections::BTreeSet<Vec<u8>> =
            self.base.raw_range_keys(start, end)?.into_iter().collect();
        let mut writes = Overlay::new();
        self.writes.range_into(start, Some(end), &mut writes);
        for (k, v) in writes {
            if v.is_some() {
                merged.insert(k);
            } else {
                merged.remove(&k);
            }
        }
        Ok(merged.into_iter().collect())
    }
}
