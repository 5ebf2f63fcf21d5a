//! The derived index in sled: one tree, keys prefixed by kind (schema in FORMAT.md).
//!
//! Everything here can be rebuilt from the log. Writes go through a [`Txn`] overlay that the
//! writer fills while planning a group commit and applies atomically (with the applied LSN)
//! after the log write is durable, so sled never needs an fsync of its own per append.

use std::collections::BTreeMap;
use std::path::Path;

use bincode::{Decode, Encode};

use crate::codec;
use crate::error::{Error, Result};
use crate::log::Position;
use crate::record::EventBody;
use crate::state::{SessionMeta, StateView, StreamMeta};

/// Key prefixes. One byte each; see FORMAT.md "Index key schema".
pub(crate) mod prefix {
    pub const SESSION: u8 = b'N';
    pub const STREAM: u8 = b'S';
    pub const EVENT: u8 = b'E';
    pub const TERMINAL_FRAME: u8 = b'F';
    pub const OUTCOME: u8 = b'O';
    pub const OPEN_STREAM: u8 = b'L';
    pub const ORIGIN: u8 = b'R';
}

const APPLIED_LSN: &[u8] = b"Mapplied_lsn";
const INDEX_VERSION: &[u8] = b"Mindex_version";
/// Version of the key schema; a mismatch rebuilds the index from the log.
const INDEX_VERSION_VALUE: u32 = 1;

/// A session with the LSN of the record its state was last carried from.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct StoredSession {
    pub meta: SessionMeta,
    pub origin_lsn: u64,
}

/// A stream with the LSN of the record its state was last carried from.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct StoredStream {
    pub meta: StreamMeta,
    pub origin_lsn: u64,
}

pub(crate) fn session_key(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + id.len());
    k.push(prefix::SESSION);
    k.extend_from_slice(id.as_bytes());
    k
}

pub(crate) fn stream_key(id: u64) -> [u8; 9] {
    let mut k = [prefix::STREAM; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn event_key(stream: u64, seq: u64) -> [u8; 17] {
    let mut k = [prefix::EVENT; 17];
    k[1..9].copy_from_slice(&stream.to_be_bytes());
    k[9..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub(crate) fn terminal_frame_key(stream: u64) -> [u8; 9] {
    let mut k = [prefix::TERMINAL_FRAME; 9];
    k[1..].copy_from_slice(&stream.to_be_bytes());
    k
}

/// Prefix + u16 BE length + session: unambiguous for any session id.
fn session_scoped(prefix: u8, session: &str) -> Vec<u8> {
    let len = u16::try_from(session.len()).unwrap_or(u16::MAX);
    let mut k = Vec::with_capacity(3 + session.len() + 16);
    k.push(prefix);
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(session.as_bytes());
    k
}

pub(crate) fn outcome_key(session: &str, correlation: &str) -> Vec<u8> {
    let mut k = session_scoped(prefix::OUTCOME, session);
    k.extend_from_slice(correlation.as_bytes());
    k
}

pub(crate) fn open_stream_prefix(session: &str) -> Vec<u8> {
    session_scoped(prefix::OPEN_STREAM, session)
}

pub(crate) fn open_stream_key(session: &str, stream: u64) -> Vec<u8> {
    let mut k = open_stream_prefix(session);
    k.extend_from_slice(&stream.to_be_bytes());
    k
}

/// Origin marker kinds.
pub(crate) const ORIGIN_SESSION: u8 = b'N';
pub(crate) const ORIGIN_STREAM: u8 = b'S';

pub(crate) fn origin_key(lsn: u64, kind: u8, id: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + id.len());
    k.push(prefix::ORIGIN);
    k.extend_from_slice(&lsn.to_be_bytes());
    k.push(kind);
    k.extend_from_slice(id);
    k
}

/// Splits an origin key into (lsn, kind, id).
pub(crate) fn parse_origin_key(k: &[u8]) -> Option<(u64, u8, &[u8])> {
    let lsn = u64::from_be_bytes(k.get(1..9)?.try_into().ok()?);
    Some((lsn, *k.get(9)?, k.get(10..)?))
}

fn decode_value<T: bincode::Decode<()>>(key: &[u8], v: &[u8]) -> Result<T> {
    codec::decode(v).map_err(|e| {
        Error::Index(sled::Error::Unsupported(format!(
            "undecodable index value under key prefix {:?}: {e}; delete the index directory to rebuild it",
            key.first().map(|b| char::from(*b))
        )))
    })
}

fn encode_value<T: bincode::Encode>(v: &T) -> Vec<u8> {
    let mut out = Vec::new();
    // Encoding index values into a Vec cannot fail: they are bounded, plain structs.
    let _ = codec::encode_into(v, &mut out);
    out
}

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

    fn position(&self, stream: u64, seq: u64) -> Result<Option<Position>> {
        Ok(self
            .raw_get(&event_key(stream, seq))?
            .and_then(|v| Position::decode(&v)))
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

/// The sled-backed index.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    db: sled::Db,
    tree: sled::Tree,
}

impl Index {
    /// Opens (creating) the index in `dir`.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .flush_every_ms(Some(1000))
            .open()?;
        let tree = db.open_tree("cursorlog")?;
        Ok(Self { db, tree })
    }

    /// The LSN of the last record applied, 0 when empty.
    pub(crate) fn applied_lsn(&self) -> Result<u64> {
        Ok(self
            .tree
            .get(APPLIED_LSN)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_le_bytes))
    }

    /// True when the index was written by this key schema (or is empty).
    pub(crate) fn version_ok(&self) -> Result<bool> {
        Ok(match self.tree.get(INDEX_VERSION)? {
            None => self.tree.is_empty(),
            Some(v) => v.as_ref() == INDEX_VERSION_VALUE.to_le_bytes(),
        })
    }

    /// Drops everything (before a rebuild from the log).
    pub(crate) fn clear(&self) -> Result<()> {
        self.tree.clear()?;
        self.tree
            .insert(INDEX_VERSION, &INDEX_VERSION_VALUE.to_le_bytes())?;
        Ok(())
    }

    /// Applies an overlay atomically, recording `applied_lsn`.
    pub(crate) fn commit(&self, txn: Txn<'_>, applied_lsn: u64) -> Result<()> {
        let mut batch = sled::Batch::default();
        for (k, v) in txn.writes {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        batch.insert(APPLIED_LSN, &applied_lsn.to_le_bytes());
        batch.insert(INDEX_VERSION, &INDEX_VERSION_VALUE.to_le_bytes());
        self.tree.apply_batch(batch)?;
        Ok(())
    }

    /// Makes everything applied so far durable in sled.
    pub(crate) fn flush(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    /// Events of `stream` from `from_seq` on, ascending, at most `max`.
    pub(crate) fn positions_from(
        &self,
        stream: u64,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<(u64, Position)>> {
        let start = event_key(stream, from_seq);
        let end = event_key(stream, u64::MAX);
        let mut out = Vec::with_capacity(max.min(1024));
        for kv in self.tree.range(start..=end).take(max) {
            let (k, v) = kv?;
            let seq = k
                .get(9..17)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes);
            if let (Some(seq), Some(pos)) = (seq, Position::decode(&v)) {
                out.push((seq, pos));
            }
        }
        Ok(out)
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

    /// Counts keys with a prefix.
    pub(crate) fn count(&self, p: u8) -> u64 {
        self.tree.scan_prefix([p]).count() as u64
    }

    /// Origin markers below `lsn`: state that must be carried forward (or dropped) before
    /// segments ending below `lsn` are deleted.
    pub(crate) fn origins_below(&self, lsn: u64) -> Result<Vec<Vec<u8>>> {
        let start = origin_key(0, 0, &[]);
        let end = origin_key(lsn, 0, &[]);
        self.tree
            .range(start..end)
            .map(|kv| Ok(kv?.0.to_vec()))
            .collect()
    }

    /// Every key and value except the applied-LSN marker (tests compare rebuilt indexes).
    #[doc(hidden)]
    pub(crate) fn dump(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for kv in &self.tree {
            let (k, v) = kv?;
            if k.as_ref() != APPLIED_LSN {
                out.push((k.to_vec(), v.to_vec()));
            }
        }
        Ok(out)
    }
}

impl KvRead for Index {
    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.tree.get(key)?.map(|v| v.to_vec()))
    }

    fn raw_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.tree
            .scan_prefix(prefix)
            .map(|kv| Ok(kv.map(|(k, v)| (k.to_vec(), v.to_vec()))?))
            .collect()
    }

    fn raw_range_keys(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.tree
            .range(start..end)
            .map(|kv| Ok(kv?.0.to_vec()))
            .collect()
    }
}

impl StateView for Index {
    fn session(&self, id: &str) -> Result<Option<SessionMeta>> {
        Ok(self.stored_session(id)?.map(|s| s.meta))
    }

    fn stream(&self, id: u64) -> Result<Option<StreamMeta>> {
        Ok(self.stored_stream(id)?.map(|s| s.meta))
    }
}

/// Pending index writes over a read view of the index.
#[derive(Debug)]
pub(crate) struct Txn<'a> {
    base: &'a Index,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl<'a> Txn<'a> {
    pub(crate) fn new(base: &'a Index) -> Self {
        Self {
            base,
            writes: BTreeMap::new(),
        }
    }

    pub(crate) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Some(value));
    }

    pub(crate) fn remove_raw(&mut self, key: Vec<u8>) {
        self.writes.insert(key, None);
    }

    pub(crate) fn put_session(&mut self, s: &StoredSession) {
        self.put_raw(session_key(&s.meta.id), encode_value(s));
    }

    pub(crate) fn put_stream(&mut self, s: &StoredStream) {
        self.put_raw(stream_key(s.meta.id).to_vec(), encode_value(s));
    }

    pub(crate) fn put_terminal_frame(&mut self, e: &EventBody) {
        self.put_raw(terminal_frame_key(e.stream).to_vec(), encode_value(e));
    }

    pub(crate) fn put_position(&mut self, stream: u64, seq: u64, pos: Position) {
        self.put_raw(event_key(stream, seq).to_vec(), pos.encode().to_vec());
    }

    /// True when nothing is pending.
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

impl KvRead for Txn<'_> {
    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.writes.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.base.raw_get(key),
        }
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
