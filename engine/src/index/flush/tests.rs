//! Heads raised per append (kept apart from the stream's value in the memtable) read back,
//! and flush into sled, as if the stream had been rewritten each time: across commits, raw
//! writes and flushes in stages (readers while a layer is being flushed, after a failed flush
//! is restored), and with readers racing commits and flushes.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// One step of the staged-flush model test.
#[derive(Debug, Clone)]
enum ROp {
    Raise(u64, u64),
    Put(u64),
    RawPut(u64),
    Create(u64),
    Remove(u64),
    /// A read through the transaction (caches the stream).
    TxnRead(u64),
    Commit,
    BeginFlush,
    FinishFlush,
    FailFlush,
}

fn r_op() -> impl Strategy<Value = ROp> {
    prop_oneof![
        6 => (0u64..4, 1u64..4).prop_map(|(s, n)| ROp::Raise(s, n)),
        2 => (0u64..4).prop_map(ROp::Put),
        1 => (0u64..4).prop_map(ROp::RawPut),
        1 => (0u64..4).prop_map(ROp::Create),
        1 => (0u64..4).prop_map(ROp::Remove),
        1 => (0u64..4).prop_map(ROp::TxnRead),
        3 => Just(ROp::Commit),
        2 => Just(ROp::BeginFlush),
        2 => Just(ROp::FinishFlush),
        1 => Just(ROp::FailFlush),
    ]
}

fn new_stream(id: u64) -> StoredStream {
    StoredStream {
        meta: StreamMeta {
            id,
            session: format!("session-{id}"),
            epoch: 1,
            state: crate::state::StreamState::Open,
            head: 0,
            watermark: 1,
            correlation: None,
            opened_at_ms: 7,
            ended_at_ms: None,
            end_reason: None,
            has_terminal_frame: false,
            lease_ms: None,
        },
        origin_lsn: id + 1,
    }
}

/// The streams sled holds (flushed), by id.
fn streams_in_sled(index: &Index) -> Vec<StoredStream> {
    index
        .tree
        .scan_prefix([prefix::STREAM])
        .map(|kv| {
            let (k, v) = kv.unwrap();
            decode_value(&k, &v).unwrap()
        })
        .collect()
}

/// Every way readers see streams agrees with `m`.
fn check_streams(index: &Index, m: &BTreeMap<u64, StoredStream>) {
    for id in 0..4 {
        assert_eq!(
            index.stored_stream(id).unwrap().as_ref(),
            m.get(&id),
            "stream {id}"
        );
        let raw = index.raw_get(&stream_key(id)).unwrap();
        assert_eq!(raw, m.get(&id).map(encode_value), "raw stream {id}");
    }
    let listed: Vec<StoredStream> = index.streams().unwrap();
    assert_eq!(listed, m.values().cloned().collect::<Vec<_>>(), "streams()");
}

/// [`check_streams`], and the raw dump and count of stream keys agree too.
fn check_streams_all(index: &Index, m: &BTreeMap<u64, StoredStream>) {
    check_streams(index, m);
    let dumped: Vec<(Vec<u8>, Vec<u8>)> = index
        .dump()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.first() == Some(&prefix::STREAM))
        .collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = m
        .iter()
        .map(|(id, s)| (stream_key(*id).to_vec(), encode_value(s)))
        .collect();
    assert_eq!(dumped, want, "dump");
}

/// The second half of a flush started with `Index::freeze`: the layer goes into sled.
fn finish_flush(index: &Index, frozen: &Layer, lsn: u64) {
    let batch = index.batch_of(frozen, lsn, Counts::default()).unwrap();
    index.tree.apply_batch(batch).unwrap();
    index.mem_mut().flushing = None;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn raised_heads_survive_staged_and_failed_flushes(ops in proptest::collection::vec(r_op(), 1..150)) {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(dir.path(), 8 << 20).unwrap();
        let mut txn = Txn::new(&index);
        for id in 0..4 {
            txn.put_stream(&new_stream(id));
        }
        index.commit(std::mem::replace(&mut txn, Txn::new(&index)), 1);
        let mut pending: BTreeMap<u64, StoredStream> = (0..4).map(|id| (id, new_stream(id))).collect();
        let mut committed = pending.clone();
        let mut cache = true;
        let mut lsn = 1;
        let mut inflight: Option<(Arc<Layer>, u64)> = None;
        for op in ops {
            match op {
                ROp::Raise(s, n) => {
                    if let Some(p) = pending.get_mut(&s) {
                        p.meta.head += n;
                        txn.raise_head(s, p.meta.head).unwrap();
                    } else {
                        txn.raise_head(s, 99).unwrap();
                    }
                }
                ROp::Put(s) => {
                    if let Some(p) = pending.get_mut(&s) {
                        p.meta.watermark = p.meta.head + 1;
                        txn.put_stream(p);
                    }
                }
                ROp::RawPut(s) => {
                    if let Some(p) = pending.get_mut(&s) {
                        p.meta.watermark = p.meta.head + 2;
                        txn.put_raw(stream_key(s).to_vec(), encode_value(p));
                    }
                }
                ROp::Create(s) => {
                    if let std::collections::btree_map::Entry::Vacant(slot) = pending.entry(s) {
                        let mut n = new_stream(s);
                        n.origin_lsn = 1000 + lsn;
                        txn.put_stream(&n);
                        slot.insert(n);
                    }
                }
                ROp::Remove(s) => {
                    pending.remove(&s);
                    txn.remove_raw(stream_key(s).to_vec());
                }
                ROp::TxnRead(s) => {
                    assert_eq!(txn.stored_stream(s).unwrap().as_ref(), pending.get(&s), "txn read {s}");
                    let raw = txn.raw_get(&stream_key(s)).unwrap();
                    assert_eq!(raw, pending.get(&s).map(encode_value), "txn raw {s}");
                }
                ROp::Commit => {
                    lsn += 1;
                    let full = std::mem::replace(&mut txn, Txn::new(&index));
                    let streams = index.commit(full, lsn);
                    if cache {
                        txn = Txn::with_streams(&index, streams);
                    }
                    cache = !cache;
                    committed.clone_from(&pending);
                    check_streams_all(&index, &committed);
                }
                ROp::BeginFlush => {
                    if inflight.is_none() {
                        inflight = index.freeze();
                        check_streams_all(&index, &committed);
                    }
                }
                ROp::FinishFlush => {
                    if let Some((frozen, l)) = inflight.take() {
                        finish_flush(&index, &frozen, l);
                        check_streams_all(&index, &committed);
                    }
                }
                ROp::FailFlush => {
                    if let Some((frozen, _)) = inflight.take() {
                        index.restore(&frozen);
                        check_streams_all(&index, &committed);
                    }
                }
            }
        }
        drop(txn);
        if let Some((frozen, l)) = inflight.take() {
            finish_flush(&index, &frozen, l);
        }
        index.flush_memtable().unwrap();
        prop_assert_eq!(index.memtable_len(), 0);
        check_streams_all(&index, &committed);
        prop_assert_eq!(streams_in_sled(&index), committed.values().cloned().collect::<Vec<_>>());
    }
}

/// Readers racing commits and flushes never see a stream vanish or its head go back.
#[test]
fn readers_racing_commits_and_flushes_never_see_a_head_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let index = Index::open(dir.path(), 8 << 20).unwrap();
    let mut txn = Txn::new(&index);
    for id in 0..4 {
        txn.put_stream(&new_stream(id));
    }
    let mut cache = index.commit(txn, 1);
    index.flush_memtable().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let index = index.clone();
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut last = [0u64; 4];
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for id in 0..4u64 {
                        let s = if r == 0 {
                            index.stored_stream(id).unwrap()
                        } else {
                            index
                                .streams()
                                .unwrap()
                                .into_iter()
                                .find(|s| s.meta.id == id)
                        };
                        let s = s.expect("stream vanished");
                        assert!(s.meta.head >= last[id as usize], "head went back");
                        last[id as usize] = s.meta.head;
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let mut head = [0u64; 4];
    for i in 0..3000u64 {
        let mut txn = Txn::with_streams(&index, std::mem::take(&mut cache));
        let id = i % 4;
        head[id as usize] += 1;
        txn.raise_head(id, head[id as usize]).unwrap();
        if i % 7 == 0 {
            let mut s = txn.stored_stream(id).unwrap().unwrap();
            s.meta.watermark = s.meta.head;
            txn.put_stream(&s);
        }
        cache = index.commit(txn, i + 2);
        if i % 5 == 0 {
            index.flush_memtable().unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
}
