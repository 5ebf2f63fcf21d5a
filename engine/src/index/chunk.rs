//! Run-start chunks (index version 2): the run starts of 64 consecutive seqs of a stream in
//! one sled value, so a flush of many single-event runs writes each touched chunk once
//! instead of one sled key per run. Readers see the chunks expanded into one entry per run
//! start (the version 1 form) through [`Stored`]. Layout in FORMAT.md, "Run-start chunks".

use super::StoreResult;
use super::{event_key, prefix, prefix_end};
use crate::error::{Error, Result};
use crate::log::Position;

/// Run starts are stored in chunks of `1 << CHUNK_BITS` consecutive seqs of one stream: one
/// sled value per chunk, so a flush of many single-event runs writes each touched chunk once
/// instead of one sled key per run. In-chunk indexes are one byte, so at most 8.
pub(super) const CHUNK_BITS: u32 = 6;
pub(super) const CHUNK_MASK: u64 = (1 << CHUNK_BITS) - 1;
/// One chunk entry: the seq's index within its chunk (u8), then the run start's position.
pub(super) const CHUNK_ENTRY_BYTES: usize = 1 + Position::BYTES;

/// The (stream, seq) of an `E` key, as the memtable and readers see run starts.
pub(super) fn split_event_key(k: &[u8]) -> Option<(u64, u64)> {
    if k.len() != 17 || k.first() != Some(&prefix::EVENT) {
        return None;
    }
    let stream = u64::from_be_bytes(k.get(1..9)?.try_into().ok()?);
    let seq = u64::from_be_bytes(k.get(9..17)?.try_into().ok()?);
    Some((stream, seq))
}

/// The sled key of the chunk holding `stream`'s run starts `chunk << CHUNK_BITS ..`. It has
/// the layout of an event key whose seq is the chunk number, so it sorts at or before every
/// event key it holds and after every chunk of lower seqs.
pub(super) fn chunk_key(stream: u64, chunk: u64) -> [u8; 17] {
    event_key(stream, chunk)
}

/// One chunk's run starts: (seq, encoded position), ascending.
pub(super) type ChunkEntries = Vec<(u64, [u8; Position::BYTES])>;

pub(super) fn chunk_error(key: &[u8], why: &str) -> Error {
    Error::Index(crate::error::IndexError::msg(format!(
        "malformed run-start chunk {key:?}: {why}; delete the index directory to rebuild it"
    )))
}

/// Decodes the chunk stored under sled key `key` (a [`chunk_key`]).
pub(super) fn decode_chunk(key: &[u8], v: &[u8]) -> Result<ChunkEntries> {
    let (_, chunk) = split_event_key(key).ok_or_else(|| chunk_error(key, "bad key"))?;
    if v.is_empty() || !v.len().is_multiple_of(CHUNK_ENTRY_BYTES) {
        return Err(chunk_error(key, "bad length"));
    }
    let base = chunk
        .checked_mul(1 << CHUNK_BITS)
        .ok_or_else(|| chunk_error(key, "chunk number out of range"))?;
    let mut out = ChunkEntries::with_capacity(v.len() / CHUNK_ENTRY_BYTES);
    for e in v.chunks_exact(CHUNK_ENTRY_BYTES) {
        let (idx, pos) = e
            .split_first()
            .ok_or_else(|| chunk_error(key, "empty entry"))?;
        let idx = u64::from(*idx);
        if idx > CHUNK_MASK || out.last().is_some_and(|(q, _)| *q >= base + idx) {
            return Err(chunk_error(key, "entries out of order"));
        }
        let pos = pos.try_into().map_err(|_| chunk_error(key, "bad entry"))?;
        out.push((base + idx, pos));
    }
    Ok(out)
}

pub(super) fn encode_chunk(entries: &ChunkEntries) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * CHUNK_ENTRY_BYTES);
    for (seq, pos) in entries {
        // In-chunk index: fits a byte (CHUNK_BITS <= 8).
        out.push((seq & CHUNK_MASK) as u8);
        out.extend_from_slice(pos);
    }
    out
}

/// Applies one memtable change of a run start (`None`: removed) to its chunk's entries.
pub(super) fn merge_run_start(
    entries: &mut ChunkEntries,
    seq: u64,
    value: Option<[u8; Position::BYTES]>,
) {
    let at = entries.binary_search_by_key(&seq, |(q, _)| *q);
    match (value, at) {
        (Some(pos), Ok(i)) => {
            if let Some(e) = entries.get_mut(i) {
                e.1 = pos;
            }
        }
        (Some(pos), Err(i)) => entries.insert(i, (seq, pos)),
        (None, Ok(i)) => {
            entries.remove(i);
        }
        (None, Err(_)) => {}
    }
}

/// Where a sled scan must start to see every chunk holding a run start at or after the
/// (reader's) key `start`: the start's own chunk. Other keys are their own bound.
pub(super) fn sled_lower_bound(start: &[u8]) -> Vec<u8> {
    match split_event_key(start) {
        Some((stream, seq)) => chunk_key(stream, seq >> CHUNK_BITS).to_vec(),
        None if start.first() == Some(&prefix::EVENT) && start.len() > 9 => start[..9].to_vec(),
        None => start.to_vec(),
    }
}

/// Where a sled scan may end (exclusive) and still see every chunk holding a run start below
/// the (reader's) key `end`: after the chunk of `end - 1`. A chunk key sorts at or before
/// the run starts it holds, so `end` itself would be a correct bound too, but one that lets
/// a scan of a long stream walk (and decode) every later chunk whose *number* is below the
/// seq. Other keys are their own bound.
pub(super) fn sled_upper_bound(end: &[u8]) -> Option<Vec<u8>> {
    match split_event_key(end) {
        Some((stream, seq)) => {
            let chunks = (seq >> CHUNK_BITS) + u64::from(seq & CHUNK_MASK != 0);
            Some(chunk_key(stream, chunks).to_vec())
        }
        None if end.first() == Some(&prefix::EVENT) && end.len() > 9 => prefix_end(&end[..9]),
        None => Some(end.to_vec()),
    }
}

/// sled's entries in a key range as readers see them: chunks expanded into one `E` entry
/// per run start (the version 1 layout), limited to `start..end`.
pub(super) struct Stored {
    pub(super) iter: sled::Iter,
    pub(super) rev: bool,
    pub(super) start: Vec<u8>,
    pub(super) end: Option<Vec<u8>>,
    /// The current chunk's stream and its run starts not yet returned, the next one last.
    pub(super) chunk_stream: u64,
    pub(super) pending: ChunkEntries,
}

impl Stored {
    pub(super) fn in_range(&self, k: &[u8]) -> bool {
        k >= self.start.as_slice() && self.end.as_deref().is_none_or(|e| k < e)
    }

    pub(super) fn next(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        loop {
            while let Some((seq, pos)) = self.pending.pop() {
                let k = event_key(self.chunk_stream, seq);
                if self.in_range(&k) {
                    return Ok(Some((k.to_vec(), pos.to_vec())));
                }
            }
            let item = if self.rev {
                self.iter.next_back()
            } else {
                self.iter.next()
            };
            let Some((k, v)) = item.transpose().store()? else {
                return Ok(None);
            };
            match split_event_key(&k) {
                Some((stream, _)) => {
                    self.chunk_stream = stream;
                    self.pending = decode_chunk(&k, &v)?;
                    if !self.rev {
                        self.pending.reverse();
                    }
                }
                None if self.in_range(&k) => return Ok(Some((k.to_vec(), v.to_vec()))),
                None => {}
            }
        }
    }
}
