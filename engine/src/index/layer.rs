//! [`Layer`]: pending index writes (a transaction's, or the memtable's) held by kind, so the
//! per-event writes of an append (a run start, a stream's new head) cost no heap-allocated
//! keys and no byte-string comparisons.
//!
//! Readers still see the byte key space of FORMAT.md: [`Layer::range_into`] expands the typed
//! entries into their keys and values. A stream's head raised in a layer (see
//! [`Layer::heads`]) is not a byte value of its own: the [`Index`](super::Index) patches it
//! into the stream's value where readers look the stream up, and the flush writes it into
//! sled's stream value.

use std::collections::{BTreeMap, HashMap};

use super::chunk::split_event_key;
use super::idhash::IdHashing;
use super::{event_key, prefix, stream_key, Counts};
use crate::log::Position;

/// Pending writes over an ordered byte key space; `None` is a deletion.
pub(super) type Overlay = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// An encoded run-start position (a [`Position::encode`]).
pub(super) type RunValue = [u8; Position::BYTES];

/// Run starts by (stream, seq): where a [`Layer`] keeps its `E` keys.
pub(super) trait Runs: Default {
    /// Writes (`Some`) or deletes (`None`) the run start of `stream` at `seq`.
    fn put(&mut self, stream: u64, seq: u64, value: Option<RunValue>);
    /// The pending write of a run start (`Some(None)`: deleted).
    fn get(&self, stream: u64, seq: u64) -> Option<Option<RunValue>>;
    /// Drops a pending write.
    fn forget(&mut self, stream: u64, seq: u64);
    /// Pending writes.
    fn len(&self) -> usize;
    /// Calls `f` with every pending write of a (stream, seq) in `lo..=hi` (in no set order).
    fn each_in(
        &self,
        lo: (u64, u64),
        hi: (u64, u64),
        f: &mut dyn FnMut(u64, u64, Option<RunValue>),
    );
    /// Calls `f` with every pending write, consuming them.
    fn drain(self, f: &mut dyn FnMut(u64, u64, Option<RunValue>));
}

/// Run starts in one ordered map: a transaction's few.
#[derive(Debug, Default, Clone)]
pub(super) struct FlatRuns(BTreeMap<(u64, u64), Option<RunValue>>);

impl Runs for FlatRuns {
    fn put(&mut self, stream: u64, seq: u64, value: Option<RunValue>) {
        self.0.insert((stream, seq), value);
    }

    fn get(&self, stream: u64, seq: u64) -> Option<Option<RunValue>> {
        self.0.get(&(stream, seq)).copied()
    }

    fn forget(&mut self, stream: u64, seq: u64) {
        self.0.remove(&(stream, seq));
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn each_in(
        &self,
        lo: (u64, u64),
        hi: (u64, u64),
        f: &mut dyn FnMut(u64, u64, Option<RunValue>),
    ) {
        for (&(stream, seq), v) in self.0.range(lo..=hi) {
            f(stream, seq, *v);
        }
    }

    fn drain(self, f: &mut dyn FnMut(u64, u64, Option<RunValue>)) {
        for ((stream, seq), v) in self.0 {
            f(stream, seq, v);
        }
    }
}

/// One stream's pending run starts, ascending by seq. A stream's run starts arrive in
/// ascending order, so a write is nearly always a push at the end; and a stream with one
/// pending run start (most streams of an MCP deployment, each holding a few events) costs a
/// 32-byte allocation, where an ordered map's first node costs ~330 bytes.
#[derive(Debug, Default, Clone)]
pub(super) struct SeqRuns(Vec<(u64, Option<RunValue>)>);

impl SeqRuns {
    fn find(&self, seq: u64) -> Result<usize, usize> {
        self.0.binary_search_by_key(&seq, |&(q, _)| q)
    }

    /// Writes the run start at `seq`; true when none was pending there.
    fn put(&mut self, seq: u64, value: Option<RunValue>) -> bool {
        match self.0.last() {
            None => {
                self.0.reserve_exact(1);
                self.0.push((seq, value));
                true
            }
            Some(&(last, _)) if last < seq => {
                self.0.push((seq, value));
                true
            }
            _ => match self.find(seq) {
                Ok(i) => {
                    self.0[i].1 = value;
                    false
                }
                Err(i) => {
                    self.0.insert(i, (seq, value));
                    true
                }
            },
        }
    }

    fn get(&self, seq: u64) -> Option<Option<RunValue>> {
        self.find(seq).ok().map(|i| self.0[i].1)
    }

    /// Drops the pending write at `seq`; true when there was one.
    fn remove(&mut self, seq: u64) -> bool {
        self.find(seq).map(|i| self.0.remove(i)).is_ok()
    }

    /// The pending writes with a seq in `from..=to`, ascending.
    fn range(&self, from: u64, to: u64) -> &[(u64, Option<RunValue>)] {
        let lo = self.0.partition_point(|&(q, _)| q < from);
        let hi = self.0.partition_point(|&(q, _)| q <= to).max(lo);
        &self.0[lo..hi]
    }

    /// Every pending write, ascending by seq.
    pub(super) fn as_slice(&self) -> &[(u64, Option<RunValue>)] {
        &self.0
    }
}

/// Run starts by stream, then seq: the memtable's many. Each stream's land at the end of
/// that stream's own [`SeqRuns`], not amid every stream's.
#[derive(Debug, Default, Clone)]
pub(super) struct StreamRuns {
    streams: HashMap<u64, SeqRuns, IdHashing>,
    /// Entries across `streams`.
    len: usize,
}

impl StreamRuns {
    /// Each stream's pending writes, ascending by seq (streams in no set order).
    pub(super) fn streams(&self) -> impl Iterator<Item = (u64, &SeqRuns)> {
        self.streams.iter().map(|(s, seqs)| (*s, seqs))
    }
}

impl Runs for StreamRuns {
    fn put(&mut self, stream: u64, seq: u64, value: Option<RunValue>) {
        if self.streams.entry(stream).or_default().put(seq, value) {
            self.len += 1;
        }
    }

    fn get(&self, stream: u64, seq: u64) -> Option<Option<RunValue>> {
        self.streams.get(&stream)?.get(seq)
    }

    fn forget(&mut self, stream: u64, seq: u64) {
        if let Some(seqs) = self.streams.get_mut(&stream) {
            if seqs.remove(seq) {
                self.len -= 1;
                if seqs.0.is_empty() {
                    self.streams.remove(&stream);
                }
            }
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn each_in(
        &self,
        lo: (u64, u64),
        hi: (u64, u64),
        f: &mut dyn FnMut(u64, u64, Option<RunValue>),
    ) {
        let mut add = |stream: u64, seqs: &SeqRuns| {
            let from = if stream == lo.0 { lo.1 } else { 0 };
            let to = if stream == hi.0 { hi.1 } else { u64::MAX };
            if from <= to {
                for &(seq, v) in seqs.range(from, to) {
                    f(stream, seq, v);
                }
            }
        };
        if lo.0 == hi.0 {
            if let Some(seqs) = self.streams.get(&lo.0) {
                add(lo.0, seqs);
            }
        } else {
            for (&stream, seqs) in &self.streams {
                if (lo.0..=hi.0).contains(&stream) {
                    add(stream, seqs);
                }
            }
        }
    }

    fn drain(self, f: &mut dyn FnMut(u64, u64, Option<RunValue>)) {
        for (stream, seqs) in self.streams {
            for (seq, v) in seqs.0 {
                f(stream, seq, v);
            }
        }
    }
}

/// Pending index writes, by kind. Newer writes replace older ones key by key.
#[derive(Debug, Default, Clone)]
pub(super) struct Layer<R = StreamRuns> {
    /// Every key but run starts (`E` keys), as bytes.
    pub(super) kv: Overlay,
    /// Run starts (the `E` keys), typed.
    pub(super) runs: R,
    /// Streams whose head was raised after their value in `kv` (or in an older layer, or
    /// sled) was written: stream id → its head now. Appends change nothing else of a
    /// stream, so its metadata is not re-encoded per group commit. A write of the stream's
    /// `S` key into `kv` drops its entry here (the value carries the head).
    pub(super) heads: HashMap<u64, u64, IdHashing>,
    /// Some `E` key went into `kv` with a value that is not a position (see [`Layer::put`]):
    /// run starts written later must replace it there too.
    malformed_runs: bool,
    /// How the layer changes the counts of sessions and streams.
    pub(super) counts: Counts,
}

/// The stream id of an `S` key.
pub(super) fn split_stream_key(k: &[u8]) -> Option<u64> {
    match k {
        [prefix::STREAM, id @ ..] => <[u8; 8]>::try_from(id).ok().map(u64::from_be_bytes),
        _ => None,
    }
}

impl<R: Runs> Layer<R> {
    /// Entries in all three maps.
    pub(super) fn len(&self) -> usize {
        self.kv.len() + self.runs.len() + self.heads.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes (`Some`) or deletes (`None`) the run start of `stream` at `seq`.
    pub(super) fn put_run(&mut self, stream: u64, seq: u64, value: Option<RunValue>) {
        if self.malformed_runs {
            self.kv.remove(event_key(stream, seq).as_slice());
        }
        self.runs.put(stream, seq, value);
    }

    /// Writes (`Some`) or deletes (`None`) a byte key. An `E` key whose value is not a
    /// position stays a byte entry, which the flush refuses (as it always did).
    pub(super) fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        if let Some((stream, seq)) = split_event_key(&key) {
            match value.as_deref().map(RunValue::try_from) {
                None => {
                    self.put_run(stream, seq, None);
                    self.kv.remove(&key);
                    return;
                }
                Some(Ok(pos)) => {
                    self.put_run(stream, seq, Some(pos));
                    self.kv.remove(&key);
                    return;
                }
                Some(Err(_)) => {
                    self.runs.forget(stream, seq);
                    self.malformed_runs = true;
                }
            }
        }
        if let Some(id) = split_stream_key(&key) {
            self.heads.remove(&id);
        }
        self.kv.insert(key, value);
    }

    /// The pending write of a byte key (`Some(None)`: deleted), heads not applied.
    pub(super) fn get(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if let Some((stream, seq)) = split_event_key(key) {
            if let Some(v) = self.runs.get(stream, seq) {
                return Some(v.map(|p| p.to_vec()));
            }
        }
        self.kv.get(key).cloned()
    }

    /// Moves `newer`'s writes over this layer's.
    pub(super) fn absorb<N: Runs>(&mut self, newer: Layer<N>) {
        for (k, v) in newer.kv {
            self.put(k, v);
        }
        newer
            .runs
            .drain(&mut |stream, seq, v| self.put_run(stream, seq, v));
        self.heads.extend(newer.heads);
        self.counts.add(newer.counts);
    }

    /// Adds the byte entries in `start..end` (all of `kv` and `runs`; heads not applied) to
    /// `out`, replacing what `out` holds for them.
    pub(super) fn range_into(&self, start: &[u8], end: Option<&[u8]>, out: &mut Overlay) {
        let in_range = |k: &[u8]| k >= start && end.is_none_or(|e| k < e);
        let kv = match end {
            Some(end) => self.kv.range::<[u8], _>((
                std::ops::Bound::Included(start),
                std::ops::Bound::Excluded(end),
            )),
            None => self
                .kv
                .range::<[u8], _>((std::ops::Bound::Included(start), std::ops::Bound::Unbounded)),
        };
        for (k, v) in kv {
            out.insert(k.clone(), v.clone());
        }
        if let Some((lo, hi)) = tail_bounds::<16>(prefix::EVENT, start, end) {
            self.runs
                .each_in(split_pair(lo), split_pair(hi), &mut |stream, seq, v| {
                    let k = event_key(stream, seq);
                    if in_range(&k) {
                        out.insert(k.to_vec(), v.map(|p| p.to_vec()));
                    }
                });
        }
    }

    /// The streams with a raised head whose `S` key lies in `start..end`.
    pub(super) fn heads_in(&self, start: &[u8], end: Option<&[u8]>) -> Vec<u64> {
        let Some((lo, hi)) = tail_bounds::<8>(prefix::STREAM, start, end) else {
            return Vec::new();
        };
        let in_range = |k: &[u8]| k >= start && end.is_none_or(|e| k < e);
        let ids = u64::from_be_bytes(lo)..=u64::from_be_bytes(hi);
        self.heads
            .keys()
            .copied()
            .filter(|id| ids.contains(id) && in_range(&stream_key(*id)))
            .collect()
    }
}

fn split_pair(t: [u8; 16]) -> (u64, u64) {
    let mut a = [0; 8];
    let mut b = [0; 8];
    a.copy_from_slice(&t[..8]);
    b.copy_from_slice(&t[8..]);
    (u64::from_be_bytes(a), u64::from_be_bytes(b))
}

/// Inclusive bounds `lo..=hi` on the `N`-byte tails `t` of keys `prefix ++ t` that covers
/// every such key in `start..end` (maybe more: callers filter exactly), or `None` when no
/// such key can be in the range.
fn tail_bounds<const N: usize>(
    key_prefix: u8,
    start: &[u8],
    end: Option<&[u8]>,
) -> Option<([u8; N], [u8; N])> {
    // Lower: a longer start is cut (the cut key is at most start); a shorter one padded
    // with zeroes (the smallest tail not below it).
    let lo = match start.split_first() {
        None => [0; N],
        Some((&p, _)) if p < key_prefix => [0; N],
        Some((&p, _)) if p > key_prefix => return None,
        Some((_, rest)) => {
            let mut t = [0; N];
            let n = rest.len().min(N);
            t[..n].copy_from_slice(&rest[..n]);
            t
        }
    };
    // Upper: every tail below `end`'s is at most its first N bytes, padded with 0xff.
    let hi = match end.map(<[u8]>::split_first) {
        None => [u8::MAX; N],
        Some(None) => return None,
        Some(Some((&p, _))) if p > key_prefix => [u8::MAX; N],
        Some(Some((&p, _))) if p < key_prefix => return None,
        Some(Some((_, rest))) => {
            if rest.is_empty() {
                return None;
            }
            let mut t = [u8::MAX; N];
            let n = rest.len().min(N);
            t[..n].copy_from_slice(&rest[..n]);
            t
        }
    };
    (lo <= hi).then_some((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..20),
            (any::<u64>(), any::<u64>()).prop_map(|(s, q)| event_key(s, q).to_vec()),
            (0u64..4, 0u64..4).prop_map(|(s, q)| event_key(s, q)[..(9 + q as usize)].to_vec()),
            any::<u64>().prop_map(|s| stream_key(s).to_vec()),
            Just(vec![prefix::EVENT]),
            Just(vec![prefix::STREAM]),
        ]
    }

    proptest! {
        /// One stream's run starts behave as an ordered map under writes in any order,
        /// removals and range reads.
        #[test]
        fn seq_runs_behave_as_an_ordered_map(
            ops in proptest::collection::vec((0u64..12, any::<bool>(), any::<u8>()), 0..64),
            ranges in proptest::collection::vec((0u64..14, 0u64..14), 1..8),
        ) {
            let mut runs = SeqRuns::default();
            let mut model = BTreeMap::new();
            for (seq, remove, byte) in ops {
                if remove {
                    prop_assert_eq!(runs.remove(seq), model.remove(&seq).is_some());
                } else {
                    let value = (byte % 4 != 0).then_some([byte; Position::BYTES]);
                    prop_assert_eq!(runs.put(seq, value), model.insert(seq, value).is_none());
                }
                prop_assert_eq!(runs.get(seq), model.get(&seq).copied());
            }
            let all: Vec<_> = model.iter().map(|(q, v)| (*q, *v)).collect();
            prop_assert_eq!(runs.as_slice(), all.as_slice());
            for (from, to) in ranges {
                let want: Vec<_> = all.iter().copied().filter(|(q, _)| (from..=to).contains(q)).collect();
                prop_assert_eq!(runs.range(from, to), want.as_slice());
            }
        }
    }

    proptest! {
        /// A layer's ranges hold exactly the keys a byte-keyed map holds in the range.
        #[test]
        fn ranges_match_a_byte_map(
            runs in proptest::collection::vec((0u64..4, prop_oneof![0u64..4, Just(u64::MAX)], any::<bool>()), 0..24),
            heads in proptest::collection::vec(prop_oneof![0u64..4, Just(u64::MAX)], 0..6),
            start in key_bytes(),
            end in proptest::option::of(key_bytes()),
        ) {
            let mut layer = Layer::<StreamRuns>::default();
            let mut flat = Layer::<FlatRuns>::default();
            let mut bytes = Overlay::new();
            for (s, q, del) in runs {
                let v = (!del).then(|| [q as u8; Position::BYTES].to_vec());
                layer.put(event_key(s, q).to_vec(), v.clone());
                flat.put(event_key(s, q).to_vec(), v.clone());
                bytes.insert(event_key(s, q).to_vec(), v);
            }
            for id in &heads {
                layer.heads.insert(*id, 1);
            }
            let mut got = Overlay::new();
            layer.range_into(&start, end.as_deref(), &mut got);
            let want: Overlay = bytes
                .into_iter()
                .filter(|(k, _)| k.as_slice() >= start.as_slice() && end.as_ref().is_none_or(|e| k < e))
                .collect();
            prop_assert_eq!(&got, &want);
            let mut got_flat = Overlay::new();
            flat.range_into(&start, end.as_deref(), &mut got_flat);
            prop_assert_eq!(got_flat, want);
            let mut got_heads = layer.heads_in(&start, end.as_deref());
            got_heads.sort_unstable();
            let mut want_heads: Vec<u64> = layer
                .heads
                .keys()
                .copied()
                .filter(|id| {
                    let k = stream_key(*id);
                    k.as_slice() >= start.as_slice() && end.as_ref().is_none_or(|e| k.as_slice() < e.as_slice())
                })
                .collect();
            want_heads.sort_unstable();
            prop_assert_eq!(got_heads, want_heads);
        }
    }
}
