//! The derived index in sled: one tree, keys prefixed by kind (schema in FORMAT.md).
//!
//! Everything here can be rebuilt from the log. Writes go through a [`Txn`] overlay that the
//! writer fills while planning a group commit and applies atomically (with the applied LSN)
//! after the log write is durable, so sled never needs an fsync of its own per append.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::error::{Error, IndexError, Result};
use crate::log::Position;
use crate::record::EventBody;
use crate::state::{SessionMeta, StateView, StreamMeta};

mod chunk;
mod flush;
mod idhash;
mod keys;
mod layer;
mod snapshot;
mod stored;
mod task;
mod txn;

pub(crate) use idhash::IdHashing;
pub(crate) use keys::*;
pub(crate) use snapshot::IndexSnapshot;
use stored::{decode_value, encode_value};
pub(crate) use stored::{StoreResult, StoredSession, StoredStream};
pub(crate) use task::*;
pub(crate) use txn::{StreamCache, Txn};

use chunk::{
    chunk_key, decode_chunk, encode_chunk, merge_run_start, sled_lower_bound, sled_upper_bound,
    split_event_key, ChunkEntries, Stored, CHUNK_BITS,
};
use flush::raise_head;
use layer::{split_stream_key, FlatRuns, Layer, Overlay};

const APPLIED_LSN: &[u8] = b"Mapplied_lsn";
const COUNTS: &[u8] = b"Mcounts";
const INDEX_VERSION: &[u8] = b"Mindex_version";
/// Version of the key schema; a mismatch rebuilds the index from the log.
/// 1: one `E` key per run start. 2: run starts grouped in `E` chunks (see FORMAT.md).
/// 3: format 2's frame offsets; `G` session states; `T` ended keys; `M` counts.
/// 4: task keys (`K I Y P C D Z X`, markers of kind `K`); task counts in `M counts`.
/// 5: inbound routes (`W` owner, correlation; `V` id, correlation).
const INDEX_VERSION_VALUE: u32 = 5;

/// Typed reads shared by the index and the writer's overlay.
pub(crate) trait KvRead {
    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Keys with `prefix` (ascending), with their values.
    fn raw_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Keys in `start..end`, ascending.
    fn raw_range_keys(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>>;

    fn stored_session(&self, id: &str) -> Result<Option<StoredSession>> {
        let k = session_key(id);
        self.raw_get(&k)?.map(|v| decode_value(&k, &v)).transpose()
    }

    fn stored_stream(&self, id: u64) -> Result<Option<StoredStream>> {
        let k = stream_key(id);
        self.raw_get(&k)?.map(|v| decode_value(&k, &v)).transpose()
    }

    /// The session's opaque state, if it has one.
    fn session_state(&self, id: &str) -> Result<Option<Vec<u8>>> {
        self.raw_get(&session_state_key(id))
    }

    fn terminal_frame(&self, stream: u64) -> Result<Option<EventBody>> {
        let k = terminal_frame_key(stream);
        self.raw_get(&k)?.map(|v| decode_value(&k, &v)).transpose()
    }

    fn outcome_stream(&self, session: &str, correlation: &str) -> Result<Option<u64>> {
        Ok(self
            .raw_get(&outcome_key(session, correlation))?
            .and_then(|v| v.try_into().ok().map(u64::from_le_bytes)))
    }

    /// Open streams of a session.
    fn open_streams(&self, session: &str) -> Result<Vec<u64>> {
        let p = open_stream_prefix(session);
        Ok(self
            .raw_scan(&p)?
            .into_iter()
            .filter_map(|(k, _)| k.get(p.len()..).and_then(|b| b.try_into().ok()))
            .map(u64::from_be_bytes)
            .collect())
    }
}

/// Counts of remembered and live sessions and streams (or changes of them), kept
/// incrementally by [`crate::apply::apply`] so stats never scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub sessions: i64,
    pub live_sessions: i64,
    pub streams: i64,
    pub open_streams: i64,
    /// Tasks remembered (tombstones included).
    pub tasks: i64,
    /// Tasks not deleted.
    pub live_tasks: i64,
}

impl Counts {
    pub(crate) fn add(&mut self, d: Counts) {
        self.sessions += d.sessions;
        self.live_sessions += d.live_sessions;
        self.streams += d.streams;
        self.open_streams += d.open_streams;
        self.tasks += d.tasks;
        self.live_tasks += d.live_tasks;
    }

    fn encode(self) -> [u8; 48] {
        let mut b = [0u8; 48];
        for (i, v) in [
            self.sessions,
            self.live_sessions,
            self.streams,
            self.open_streams,
            self.tasks,
            self.live_tasks,
        ]
        .into_iter()
        .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let v = |i: usize| -> Option<i64> {
            Some(i64::from_le_bytes(
                b.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        (b.len() == 48).then_some(())?;
        Some(Self {
            sessions: v(0)?,
            live_sessions: v(1)?,
            streams: v(2)?,
            open_streams: v(3)?,
            tasks: v(4)?,
            live_tasks: v(5)?,
        })
    }
}

/// Memtable size at which the writer stops and moves it into sled itself (back-pressure
/// when the background flush falls behind), and recovery flushes between chunks.
pub(crate) const MEMTABLE_ENTRIES_MAX: usize = 64 * 1024;

/// Committed index changes not yet in sled. Readers see `active` over `flushing` over sled;
/// a stream's raised head ([`Layer::heads`]) applies over its value from the same or an
/// older layer (or sled).
#[derive(Debug, Default)]
struct Memtable {
    active: Layer,
    /// The LSN of the last record in `active`.
    active_lsn: u64,
    /// A memtable being written into sled right now (readable until it is there).
    flushing: Option<Arc<Layer>>,
}

/// The derived index: sled, fronted by an in-memory memtable of committed changes.
///
/// # Invariants
/// Everything in the memtable is durable in the log. sled's `applied_lsn` only ever names
/// an LSN whose changes are all in sled, so a crash loses at most the memtable, which
/// recovery replays from the log.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    db: sled::Db,
    tree: sled::Tree,
    mem: Arc<RwLock<Memtable>>,
    flushing_lock: Arc<Mutex<()>>,
    /// The counts as sled holds them (the memtable's layers hold changes of them).
    stored_counts: Arc<Mutex<Counts>>,
    /// Flushes still to fail, for tests of what a failed flush does (see
    /// `Engine::fail_index_flushes`).
    #[cfg(feature = "testing")]
    failing_flushes: Arc<std::sync::atomic::AtomicU64>,
    /// A request's record (by its place in the request, 1-based; 0: none) whose apply is to
    /// fail once (see `Engine::fail_apply_at`).
    #[cfg(feature = "testing")]
    failing_apply: Arc<std::sync::atomic::AtomicU64>,
}

/// The smallest key greater than every key starting with `prefix` (`None`: no bound).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl Index {
    /// Opens (creating) the index in `dir`. The caller holds the data directory's lock, so
    /// a busy sled lock can only be this process's previous instance whose sled I/O threads
    /// are still winding down after close: wait for them (briefly) rather than fail.
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<Self> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let db = loop {
            match sled::Config::new()
                .path(dir)
                .cache_capacity(cache_bytes)
                .flush_every_ms(Some(1000))
                .open()
            {
                Ok(db) => break db,
                Err(sled::Error::Io(e))
                    if e.kind() != std::io::ErrorKind::NotFound
                        && e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(Error::Index(IndexError::wrap(e))),
            }
        };
        let tree = db.open_tree("cursorlog").store()?;
        let counts = tree
            .get(COUNTS)
            .store()?
            .and_then(|v| Counts::decode(&v))
            .unwrap_or_default();
        Ok(Self {
            db,
            tree,
            mem: Arc::default(),
            flushing_lock: Arc::default(),
            stored_counts: Arc::new(Mutex::new(counts)),
            #[cfg(feature = "testing")]
            failing_flushes: Arc::default(),
            #[cfg(feature = "testing")]
            failing_apply: Arc::default(),
        })
    }

    /// The counts of remembered and live sessions and streams, now.
    pub(crate) fn counts(&self) -> Counts {
        let mut c = *self
            .stored_counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mem = self.mem();
        if let Some(f) = &mem.flushing {
            c.add(f.counts);
        }
        c.add(mem.active.counts);
        c
    }

    /// Keys in `start..end` (sled merged with the memtable), at most `limit`.
    pub(crate) fn keys_in(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .range(start, Some(end), limit)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Calls `f` with every live entry whose key starts with `prefix`, in key order, without
    /// collecting them (a scan of many keys at open costs no memory of its own). Stops at
    /// the first error `f` returns.
    pub(crate) fn for_each_with_prefix(
        &self,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        const PAGE: usize = 1024;
        let end = prefix_end(prefix);
        let mut start = prefix.to_vec();
        loop {
            let page = self.range(&start, end.as_deref(), PAGE)?;
            let full = page.len() == PAGE;
            for (k, v) in &page {
                f(k, v)?;
            }
            match page.last() {
                Some((k, _)) if full => {
                    start.clone_from(k);
                    start.push(0);
                }
                _ => return Ok(()),
            }
        }
    }

    fn mem(&self) -> std::sync::RwLockReadGuard<'_, Memtable> {
        self.mem.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn mem_mut(&self) -> std::sync::RwLockWriteGuard<'_, Memtable> {
        self.mem.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The LSN of the last record applied to sled, 0 when empty.
    pub(crate) fn applied_lsn(&self) -> Result<u64> {
        Ok(self
            .tree
            .get(APPLIED_LSN)
            .store()?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_le_bytes))
    }

    /// True when the index was written by this key schema (or is empty).
    pub(crate) fn version_ok(&self) -> Result<bool> {
        Ok(match self.tree.get(INDEX_VERSION).store()? {
            None => self.tree.is_empty(),
            Some(v) => v.as_ref() == INDEX_VERSION_VALUE.to_le_bytes(),
        })
    }

    /// Drops everything (before a rebuild from the log).
    pub(crate) fn clear(&self) -> Result<()> {
        // Not between a flush's freeze and its batch (a replica's snapshot install clears
        // the index while the flusher runs): the batch would land after the clear.
        let _one = self
            .flushing_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *self.mem_mut() = Memtable::default();
        *self
            .stored_counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Counts::default();
        self.tree.clear().store()?;
        self.tree
            .insert(INDEX_VERSION, &INDEX_VERSION_VALUE.to_le_bytes())
            .store()?;
        Ok(())
    }

    /// Publishes a group commit's changes: readers see them at once. A background thread
    /// (or the caller, when the memtable is full) moves them into sled. Returns the
    /// transaction's decoded streams, which now match the committed index (see
    /// [`Txn::with_streams`]).
    pub(crate) fn commit(&self, txn: Txn<'_>, applied_lsn: u64) -> StreamCache {
        let (writes, streams) = txn.into_writes();
        let mut mem = self.mem_mut();
        mem.active.absorb(writes);
        mem.active_lsn = applied_lsn;
        streams
    }

    /// Sessions and streams as of one moment: while the snapshot lives no commit lands in
    /// the memtable and no flush retires a layer, so two reads through it never straddle a
    /// write (an epoch advance changes a session and its streams in one commit). Hold it
    /// only for a few point reads: commits wait for it.
    pub(crate) fn snapshot(&self) -> IndexSnapshot<'_> {
        IndexSnapshot {
            index: self,
            mem: self.mem(),
        }
    }

    /// Entries waiting in the memtable.
    pub(crate) fn memtable_len(&self) -> usize {
        self.mem().active.len()
    }

    /// sled's entries in `start..end` as readers see them (run starts expanded from their
    /// chunks), ascending or, with `rev`, descending.
    fn stored(&self, start: &[u8], end: Option<&[u8]>, rev: bool) -> Stored {
        let lower = sled_lower_bound(start);
        let iter = match end.and_then(sled_upper_bound) {
            Some(upper) => self.tree.range(lower..upper),
            None => self.tree.range(lower..),
        };
        Stored {
            iter,
            rev,
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
            chunk_stream: 0,
            pending: ChunkEntries::new(),
        }
    }

    /// Makes the next `n` memtable flushes fail as a store error would (nothing changes).
    #[cfg(feature = "testing")]
    pub(crate) fn fail_flushes(&self, n: u64) {
        self.failing_flushes
            .store(n, std::sync::atomic::Ordering::Release);
    }

    /// Consumes one injected flush failure, if any is left.
    #[cfg(feature = "testing")]
    pub(crate) fn injected_flush_failure(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        let left = self.failing_flushes.load(Ordering::Acquire);
        if left > 0
            && self
                .failing_flushes
                .compare_exchange(left, left - 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            return Err(Error::Index(IndexError::msg(
                "injected index flush failure",
            )));
        }
        Ok(())
    }

    /// Makes the apply of the `nth` record (1-based) of the next request with that many
    /// records fail once, with an error that is not an index error.
    #[cfg(feature = "testing")]
    pub(crate) fn fail_apply_at(&self, nth: u64) {
        self.failing_apply
            .store(nth, std::sync::atomic::Ordering::Release);
    }

    /// Consumes the injected apply failure if `record` (0-based in its request) is the one.
    #[cfg(feature = "testing")]
    pub(crate) fn injected_apply_failure(&self, record: usize) -> Result<()> {
        use std::sync::atomic::Ordering;
        let nth = record as u64 + 1;
        if self
            .failing_apply
            .compare_exchange(nth, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Err(Error::Internal("injected apply failure".into()));
        }
        Ok(())
    }

    /// Moves the memtable into sled and makes sled durable.
    pub(crate) fn flush(&self) -> Result<()> {
        self.flush_memtable()?;
        self.db.flush().store()?;
        Ok(())
    }

    /// The memtable's entries in `start..end` (active over flushing), streams with their
    /// raised heads applied.
    fn overlay_range(&self, start: &[u8], end: Option<&[u8]>) -> Result<Overlay> {
        let mut out = Overlay::new();
        let raised = layers_range(&self.mem(), start, end, &mut out);
        for id in raised {
            out.insert(stream_key(id).to_vec(), self.stream_value(id)?);
        }
        Ok(out)
    }

    /// A stream's value as readers see it: the newest value written (memtable, then sled)
    /// with the newest head raised over it applied.
    fn stream_value(&self, id: u64) -> Result<Option<Vec<u8>>> {
        let key = stream_key(id);
        let (value, head) = self.stream_parts(id)?;
        match (value, head) {
            (Some(v), Some(head)) => Ok(Some(raise_head(&key, &v, head)?)),
            (value, _) => Ok(value),
        }
    }

    /// The newest value written for stream `id` and the newest head raised over it, apart.
    fn stream_parts(&self, id: u64) -> Result<(Option<Vec<u8>>, Option<u64>)> {
        // The memtable's lock is let go before sled is read.
        let in_memory = stream_in_memory(&self.mem(), id);
        self.stream_parts_from(in_memory, id)
    }

    /// [`Index::stream_parts`], completed from sled where the memtable had no value.
    fn stream_parts_from(
        &self,
        (value, head): (Option<Option<Vec<u8>>>, Option<u64>),
        id: u64,
    ) -> Result<(Option<Vec<u8>>, Option<u64>)> {
        let value = match value {
            Some(v) => v,
            None => self.tree.get(stream_key(id)).store()?.map(|v| v.to_vec()),
        };
        Ok((value, head))
    }

    /// Live entries in `start..end` in key order, at most `limit`: sled merged with the
    /// memtable.
    fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let overlay = self.overlay_range(start, end)?;
        self.merge_range(overlay, start, end, limit)
    }

    /// `overlay` (the memtable's writes in `start..end`) merged over sled's entries there,
    /// at most `limit`.
    fn merge_range(
        &self,
        overlay: Overlay,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut stored = self.stored(start, end, false);
        let mut overlay = overlay.into_iter().peekable();
        let mut next_stored = stored.next()?;
        let mut out = Vec::new();
        while out.len() < limit {
            let take_overlay = match (&next_stored, overlay.peek()) {
                (None, None) => break,
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some((sk, _)), Some((ok, _))) => ok <= sk,
            };
            if take_overlay {
                let Some((k, v)) = overlay.next() else { break };
                if next_stored.as_ref().is_some_and(|(sk, _)| *sk == k) {
                    next_stored = stored.next()?;
                }
                if let Some(v) = v {
                    out.push((k, v));
                }
            } else if let Some(kv) = next_stored.take() {
                out.push(kv);
                next_stored = stored.next()?;
            }
        }
        Ok(out)
    }

    /// The index entries (run starts) that cover `stream`'s events `from_seq..until_seq`:
    /// the last run start at or below `from_seq`, then the following ones below `until_seq`;
    /// at most `max` (an event is at most one run start).
    pub(crate) fn runs_from(
        &self,
        stream: u64,
        from_seq: u64,
        until_seq: u64,
        max: usize,
    ) -> Result<Vec<(u64, Position)>> {
        let first = event_key(stream, 0);
        let after = event_key(stream, from_seq.saturating_add(1));
        let end = event_key(stream, until_seq.max(from_seq.saturating_add(1)));
        let mut out = Vec::with_capacity(max.min(64));
        if let Some(kv) = self.last_live(&first, &after)? {
            out.push(kv);
        }
        let rest = max.saturating_sub(out.len());
        out.extend(self.range(&after, Some(&end), rest)?);
        Ok(out
            .into_iter()
            .filter_map(|(k, v)| {
                let seq = k
                    .get(9..17)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes)?;
                Some((seq, Position::decode(&v)?))
            })
            .collect())
    }

    /// The greatest live entry in `start..end`: sled and the memtable, newest layer winning.
    fn last_live(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let overlay = self.overlay_range(start, Some(end))?;
        let mut overlay = overlay.into_iter().rev().peekable();
        let mut stored = self.stored(start, Some(end), true);
        let mut next_stored = stored.next()?;
        loop {
            let take_overlay = match (&next_stored, overlay.peek()) {
                (None, None) => return Ok(None),
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some((sk, _)), Some((ok, _))) => ok >= sk,
            };
            if take_overlay {
                let Some((k, v)) = overlay.next() else {
                    return Ok(None);
                };
                if next_stored.as_ref().is_some_and(|(sk, _)| *sk == k) {
                    next_stored = stored.next()?;
                }
                if let Some(v) = v {
                    return Ok(Some((k, v)));
                }
            } else if let Some(kv) = next_stored.take() {
                return Ok(Some(kv));
            }
        }
    }

    /// Every remembered session.
    pub(crate) fn sessions(&self) -> Result<Vec<StoredSession>> {
        self.raw_scan(&[prefix::SESSION])?
            .iter()
            .map(|(k, v)| decode_value(k, v))
            .collect()
    }

    /// Every remembered stream.
    pub(crate) fn streams(&self) -> Result<Vec<StoredStream>> {
        self.raw_scan(&[prefix::STREAM])?
            .iter()
            .map(|(k, v)| decode_value(k, v))
            .collect()
    }

    /// Every key and value except the applied-LSN marker (tests compare rebuilt indexes).
    /// The counts are shown as they are now (sled's own value lags the memtable).
    pub(crate) fn dump(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let counts = self.counts();
        Ok(self
            .range(&[], None, usize::MAX)?
            .into_iter()
            .filter(|(k, _)| k.as_slice() != APPLIED_LSN)
            .map(|(k, v)| {
                if k.as_slice() == COUNTS {
                    (k, counts.encode().to_vec())
                } else {
                    (k, v)
                }
            })
            .collect())
    }
}

impl KvRead for Index {
    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(id) = split_stream_key(key) {
            return self.stream_value(id);
        }
        // The memtable's lock is let go before sled is read.
        let in_memory = memtable_get(&self.mem(), key);
        match in_memory {
            Some(v) => Ok(v),
            None => self.stored_get(key, |start, end| self.range(start, Some(end), 1)),
        }
    }

    fn raw_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.range(prefix, prefix_end(prefix).as_deref(), usize::MAX)
    }

    fn stored_stream(&self, id: u64) -> Result<Option<StoredStream>> {
        let k = stream_key(id);
        let (value, head) = self.stream_parts(id)?;
        let Some(v) = value else { return Ok(None) };
        let mut s: StoredStream = decode_value(&k, &v)?;
        if let Some(head) = head {
            s.meta.head = s.meta.head.max(head);
        }
        Ok(Some(s))
    }

    fn raw_range_keys(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(keys(self.range(start, Some(end), usize::MAX)?))
    }
}

impl Index {
    /// A key the memtable does not hold, from sled: a run start from its chunk (through
    /// `range`, the caller's merged range of `key..end`), anything else as sled has it.
    fn stored_get(
        &self,
        key: &[u8],
        range: impl FnOnce(&[u8], &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>,
    ) -> Result<Option<Vec<u8>>> {
        if split_event_key(key).is_some() {
            // A run start lives in its chunk.
            let mut after = key.to_vec();
            after.push(0);
            return Ok(range(key, &after)?
                .pop()
                .filter(|(k, _)| k == key)
                .map(|(_, v)| v));
        }
        Ok(self.tree.get(key).store()?.map(|v| v.to_vec()))
    }
}

/// What the memtable holds for `key` (`Some(None)`: deleted; `None`: not there), newest
/// layer first.
fn memtable_get(mem: &Memtable, key: &[u8]) -> Option<Option<Vec<u8>>> {
    mem.active
        .get(key)
        .or_else(|| mem.flushing.as_ref().and_then(|f| f.get(key)))
}

/// The keys of `entries`.
fn keys(entries: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<Vec<u8>> {
    entries.into_iter().map(|(k, _)| k).collect()
}

/// The memtable's writes in `start..end` into `out` (newer layers over older), and the
/// streams whose head a layer raised there.
fn layers_range(mem: &Memtable, start: &[u8], end: Option<&[u8]>, out: &mut Overlay) -> Vec<u64> {
    let layers = mem
        .flushing
        .as_deref()
        .into_iter()
        .chain(std::iter::once(&mem.active));
    let mut raised = Vec::new();
    for layer in layers {
        layer.range_into(start, end, out);
        raised.extend(layer.heads_in(start, end));
    }
    raised
}

/// What the memtable holds for stream `id`: its newest value (`Some(None)`: deleted; `None`:
/// not in the memtable) and the newest head raised over it.
fn stream_in_memory(mem: &Memtable, id: u64) -> (Option<Option<Vec<u8>>>, Option<u64>) {
    let key = stream_key(id);
    let mut head = None;
    for layer in std::iter::once(&mem.active).chain(mem.flushing.as_deref()) {
        head = head.or_else(|| layer.heads.get(&id).copied());
        if let Some(v) = layer.kv.get(key.as_slice()) {
            return (Some(v.clone()), head);
        }
    }
    (None, head)
}

impl StateView for Index {
    fn session(&self, id: &str) -> Result<Option<SessionMeta>> {
        Ok(self.stored_session(id)?.map(|s| s.meta))
    }

    fn stream(&self, id: u64) -> Result<Option<StreamMeta>> {
        Ok(self.stored_stream(id)?.map(|s| s.meta))
    }
}

#[cfg(test)]
mod tests;
