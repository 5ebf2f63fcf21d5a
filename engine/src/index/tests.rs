//! Unit tests of the index: run starts, chunks, memtable, flush.
use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Put(u64, u64, u32),
    Remove(u64, u64),
    /// Removes a stream's run starts below a seq but the last (as a trim does).
    Trim(u64, u64),
    Commit,
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    // Seqs around chunk boundaries, including the very last chunk.
    let seq = prop_oneof![
        0u64..300,
        (u64::MAX - 130)..=u64::MAX,
        Just(1 << CHUNK_BITS),
        Just((1 << CHUNK_BITS) - 1)
    ];
    prop_oneof![
        6 => (0u64..3, seq.clone(), any::<u32>()).prop_map(|(s, q, l)| Op::Put(s, q, l)),
        2 => (0u64..3, seq.clone()).prop_map(|(s, q)| Op::Remove(s, q)),
        1 => (0u64..3, seq).prop_map(|(s, q)| Op::Trim(s, q)),
        2 => Just(Op::Commit),
        1 => Just(Op::Flush),
    ]
}

type Model = BTreeMap<(u64, u64), Position>;

fn pos(seq: u64, len: u32) -> Position {
    Position {
        segment: seq / 7,
        offset: seq.wrapping_mul(31),
        len,
    }
}

/// What `runs_from` must answer, from the model.
fn expected_runs(
    m: &Model,
    stream: u64,
    from: u64,
    until: u64,
    max: usize,
) -> Vec<(u64, Position)> {
    let mut out: Vec<(u64, Position)> = m
        // As the index looks it up: below `from + 1`, saturating.
        .range((stream, 0)..(stream, from.saturating_add(1)))
        .next_back()
        .map(|((_, q), p)| (*q, *p))
        .into_iter()
        .collect();
    let rest = max.saturating_sub(out.len());
    let end = until.max(from.saturating_add(1));
    if let Some(after) = from.checked_add(1) {
        out.extend(
            m.range((stream, after)..(stream, end))
                .take(rest)
                .map(|((_, q), p)| (*q, *p)),
        );
    }
    out
}

fn check(index: &Index, m: &Model, queries: &[(u64, u64, u64, usize)]) {
    let dumped: Vec<(u64, u64, Position)> = index
        .dump()
        .unwrap()
        .into_iter()
        .filter_map(|(k, v)| {
            let (s, q) = split_event_key(&k)?;
            Some((s, q, Position::decode(&v).unwrap()))
        })
        .collect();
    let model: Vec<(u64, u64, Position)> = m.iter().map(|((s, q), p)| (*s, *q, *p)).collect();
    assert_eq!(dumped, model, "dump");
    for &(stream, from, until, max) in queries {
        assert_eq!(
            index.runs_from(stream, from, until, max).unwrap(),
            expected_runs(m, stream, from, until, max),
            "runs_from({stream}, {from}, {until}, {max})"
        );
        let got = index.raw_get(&event_key(stream, from)).unwrap();
        assert_eq!(
            got.and_then(|v| Position::decode(&v)),
            m.get(&(stream, from)).copied(),
            "raw_get({stream}, {from})"
        );
    }
    // Every stored chunk is canonical.
    for kv in index.tree.scan_prefix([prefix::EVENT]) {
        let (k, v) = kv.unwrap();
        let entries = decode_chunk(&k, &v).unwrap();
        assert!(!entries.is_empty());
        assert_eq!(encode_chunk(&entries), v.to_vec());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Run starts written, removed and trimmed through transactions, with commits and
    /// flushes in any order, read back exactly as a plain ordered map holds them.
    #[test]
    fn chunked_run_starts_read_like_a_map(
        ops in proptest::collection::vec(op(), 1..160),
        queries in proptest::collection::vec(
            (0u64..3, prop_oneof![0u64..320, (u64::MAX - 140)..=u64::MAX], prop_oneof![0u64..320, Just(u64::MAX)], 1usize..80),
            1..24,
        ),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(dir.path(), 8 << 20).unwrap();
        let mut committed = Model::new();
        let mut pending = committed.clone();
        let mut txn = Txn::new(&index);
        let mut lsn = 0;
        for op in ops {
            match op {
                Op::Put(s, q, l) => {
                    txn.put_position(s, q, pos(q, l));
                    pending.insert((s, q), pos(q, l));
                }
                Op::Remove(s, q) => {
                    txn.remove_raw(event_key(s, q).to_vec());
                    pending.remove(&(s, q));
                }
                Op::Trim(s, q) => {
                    let mut below = txn.raw_range_keys(&event_key(s, 0), &event_key(s, q)).unwrap();
                    below.pop();
                    for k in below {
                        let (_, seq) = split_event_key(&k).unwrap();
                        pending.remove(&(s, seq));
                        txn.remove_raw(k);
                    }
                }
                Op::Commit => {
                    lsn += 1;
                    let full = std::mem::replace(&mut txn, Txn::new(&index));
                    index.commit(full, lsn);
                    committed = pending.clone();
                    check(&index, &committed, &queries);
                }
                Op::Flush => {
                    index.flush_memtable().unwrap();
                    check(&index, &committed, &queries);
                }
            }
        }
        drop(txn);
        index.flush_memtable().unwrap();
        check(&index, &committed, &queries);
        prop_assert_eq!(index.memtable_len(), 0);
    }
}

/// A run start written over a malformed `E` value (in one transaction, or a newer layer)
/// replaces it, as a byte-keyed memtable did: the flush does not see the stale value.
#[test]
fn a_run_start_replaces_a_malformed_one_before_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let index = Index::open(dir.path(), 8 << 20).unwrap();
    let mut txn = Txn::new(&index);
    txn.put_raw(event_key(1, 5).to_vec(), vec![1, 2, 3]);
    txn.put_position(1, 5, pos(5, 9));
    assert_eq!(
        txn.raw_get(&event_key(1, 5)).unwrap(),
        Some(pos(5, 9).encode().to_vec())
    );
    index.commit(txn, 1);
    let mut txn = Txn::new(&index);
    txn.put_raw(event_key(2, 5).to_vec(), vec![4]);
    index.commit(txn, 2);
    let mut txn = Txn::new(&index);
    txn.put_position(2, 5, pos(5, 3));
    index.commit(txn, 3);
    index.flush_memtable().unwrap();
    assert_eq!(
        index.raw_get(&event_key(1, 5)).unwrap(),
        Some(pos(5, 9).encode().to_vec())
    );
    assert_eq!(
        index.raw_get(&event_key(2, 5)).unwrap(),
        Some(pos(5, 3).encode().to_vec())
    );
}
