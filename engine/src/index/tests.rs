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

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every index key and value, byte for byte (FORMAT.md "Index key schema"): a change here
/// is an index schema change, which bumps `INDEX_VERSION_VALUE` (the index is rebuilt).
#[test]
fn index_keys_and_values_golden_bytes() {
    let session = StoredSession {
        meta: SessionMeta {
            id: "s".into(),
            epoch: 2,
            opened_at_ms: 1,
            expired_at_ms: Some(9),
        },
        origin_lsn: 5,
    };
    let stream = StoredStream {
        meta: StreamMeta {
            id: 7,
            session: "s".into(),
            epoch: 2,
            state: crate::StreamState::Aborted,
            head: 4,
            watermark: 2,
            correlation: Some("r".into()),
            opened_at_ms: 1,
            ended_at_ms: Some(5),
            end_reason: Some("x".into()),
            has_terminal_frame: false,
            lease_ms: None,
        },
        origin_lsn: 6,
    };
    let pos = Position {
        segment: 1,
        offset: 64,
        len: 40,
    };
    let counts = Counts {
        sessions: 3,
        live_sessions: 2,
        streams: 5,
        open_streams: 1,
        tasks: 4,
        live_tasks: 3,
    };
    let task = StoredTask {
        meta: crate::task::TaskMeta {
            id: 8,
            owner: "s:a".into(),
            task_id: "t".into(),
            request_key: "1".into(),
            status: crate::task::TaskStatus::InputRequired,
            status_message: Some("m".into()),
            version: 2,
            created_at_ms: 10,
            updated_at_ms: 11,
            ttl_ms: Some(100),
            poll_interval_ms: 5,
            worker_lease_ms: Some(50),
            cancel_requested: false,
            ended_at_ms: None,
            end_cause: None,
            deleted_at_ms: None,
            removal: None,
            outcome_kind: crate::task::OutcomeKind::None,
            context: b"c".to_vec(),
        },
        origin_lsn: 8,
    };
    let slot = crate::task::InputSlot {
        key: "k".into(),
        request: b"q".to_vec(),
        response: Some(b"a".to_vec()),
        state: crate::task::SlotState::Answered,
    };
    let message = crate::task::QueuedMessage {
        qseq: 3,
        at_ms: 12,
        dedupe_key: Some("d".into()),
        correlation: None,
        message: b"{}".to_vec(),
    };
    let dir = tempfile::tempdir().unwrap();
    let index = Index::open(dir.path(), 8 << 20).unwrap();
    let mut txn = Txn::new(&index);
    txn.put_queued_message(8, 0, &message);
    txn.put_queue_state(
        8,
        0,
        &crate::task::QueueState {
            head: 2,
            tail: 3,
            bytes: 2,
            last_token: Some("t".into()),
        },
    );
    txn.put_last_batch(8, 0, vec![message.clone()]);
    let queue_values: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = [
        queue_message_key(8, 0, 3).to_vec(),
        queue_state_key(8, 0).to_vec(),
        queue_batch_key(8, 0).to_vec(),
        queue_dedupe_key(8, 0, "d"),
    ]
    .into_iter()
    .map(|k| {
        let v = txn.raw_get(&k).expect("read").expect("written");
        (k, v)
    })
    .collect();
    let queue_value = |k: &[u8]| hex(&queue_values[k]);
    let mut slot_value = Vec::new();
    crate::codec::encode_into(&TaskSlotValue(&slot), &mut slot_value).expect("encodes");
    let frame = crate::record::EventBody {
        stream: 7,
        seq: 4,
        at_ms: 5,
        kind: "result".into(),
        correlation: Some("r".into()),
        payload: b"ok".to_vec(),
    };
    let got = [
        ("N", hex(&session_key("s")), hex(&encode_value(&session))),
        ("S", hex(&stream_key(7)), hex(&encode_value(&stream))),
        (
            "E",
            hex(&chunk_key(7, 1)),
            hex(&encode_chunk(&vec![(65, pos.encode())])),
        ),
        // The session state is stored as given: the value is the caller's bytes.
        ("G", hex(&session_state_key("s")), hex(b"st")),
        ("O", hex(&outcome_key("s", "r")), hex(&7u64.to_le_bytes())),
        ("L", hex(&open_stream_key("s", 7)), String::new()),
        (
            "R",
            hex(&origin_key(6, ORIGIN_STREAM, &7u64.to_be_bytes())),
            String::new(),
        ),
        (
            "T",
            hex(&ended_key(5, ORIGIN_STREAM, &7u64.to_be_bytes())),
            String::new(),
        ),
        ("F", hex(&terminal_frame_key(7)), hex(&encode_value(&frame))),
        ("K", hex(&task_key(8)), hex(&encode_value(&task))),
        ("I", hex(&task_id_key("s:a", "t")), hex(&8u64.to_le_bytes())),
        (
            "Y",
            hex(&task_request_key("s:a", "1")),
            hex(&8u64.to_le_bytes()),
        ),
        ("P", hex(&owner_task_key("s:a", 8)), String::new()),
        ("C", hex(&owner_count_key("s:a")), hex(&1u64.to_le_bytes())),
        ("D", hex(&task_deadline_key(110, 8)), String::new()),
        ("Z", hex(&task_outcome_key(8)), hex(b"{}")),
        ("X", hex(&task_slot_key(8, "k")), hex(&slot_value)),
        (
            "R",
            hex(&origin_key(8, ORIGIN_TASK, &8u64.to_be_bytes())),
            String::new(),
        ),
        (
            "J",
            hex(&queue_message_key(8, 0, 3)),
            queue_value(&queue_message_key(8, 0, 3)),
        ),
        (
            "Q",
            hex(&queue_state_key(8, 0)),
            queue_value(&queue_state_key(8, 0)),
        ),
        (
            "B",
            hex(&queue_batch_key(8, 0)),
            queue_value(&queue_batch_key(8, 0)),
        ),
        (
            "U",
            hex(&queue_dedupe_key(8, 0, "d")),
            queue_value(&queue_dedupe_key(8, 0, "d")),
        ),
        (
            "W",
            hex(&task_route_key("s:a", "c")),
            hex(&encode_value(&TaskRoute {
                id: 8,
                inbound_qseq: Some(4),
            })),
        ),
        ("V", hex(&task_routes_key(8, "c")), String::new()),
        ("V", hex(&task_routes_prefix(8)), hex(&1u64.to_le_bytes())),
        ("M", hex(COUNTS), hex(&counts.encode())),
        ("M", hex(APPLIED_LSN), hex(&42u64.to_le_bytes())),
        (
            "M",
            hex(INDEX_VERSION),
            hex(&INDEX_VERSION_VALUE.to_le_bytes()),
        ),
    ];
    if std::env::var_os("CURSORLOG_PRINT_GOLDEN").is_some() {
        for (p, k, v) in &got {
            println!("(\"{p}\", \"{k}\", \"{v}\"),");
        }
    }
    let want: Vec<(&str, String, String)> = GOLDEN_INDEX
        .iter()
        .map(|(p, k, v)| (*p, (*k).to_owned(), (*v).to_owned()))
        .collect();
    assert_eq!(got.to_vec(), want);
}

const GOLDEN_INDEX: &[(&str, &str, &str)] = &[
    ("N", "4e73", "010000000000000073020000000000000001000000000000000109000000000000000500000000000000"),
    ("S", "530000000000000007", "0700000000000000010000000000000073020000000000000002000000040000000000000002000000000000000101000000000000007201000000000000000105000000000000000101000000000000007800000600000000000000"),
    ("E", "4500000000000000070000000000000001", "010100000000000000400000000000000028000000"),
    ("G", "4773", "7374"),
    ("O", "4f00017372", "0700000000000000"),
    ("L", "4c0001730000000000000007", ""),
    ("R", "520000000000000006530000000000000007", ""),
    ("T", "540000000000000005530000000000000007", ""),
    ("F", "460000000000000007", "0700000000000000040000000000000005000000000000000600000000000000726573756c740101000000000000007202000000000000006f6b"),
    ("K", "4b0000000000000008", "08000000000000000300000000000000733a61010000000000000074010000000000000031010101000000000000006d02000000000000000a000000000000000b0000000000000001640000000000000005000000000000000132000000000000000000000000000100000000000000630800000000000000"),
    ("I", "490003733a6174", "0800000000000000"),
    ("Y", "590003733a6131", "0800000000000000"),
    ("P", "500003733a610000000000000008", ""),
    ("C", "430003733a61", "0100000000000000"),
    ("D", "44000000000000006e0000000000000008", ""),
    ("Z", "5a0000000000000008", "7b7d"),
    ("X", "5800000000000000086b", "01000000000000006b0100000000000000710101000000000000006101"),
    ("R", "5200000000000000084b0000000000000008", ""),
    ("J", "4a0000000000000008000000000000000003", "03000000000000000c00000000000000010100000000000000640002000000000000007b7d"),
    ("Q", "51000000000000000800", "02000000000000000300000000000000020000000000000001010000000000000074"),
    ("B", "42000000000000000800", "010000000000000003000000000000000c00000000000000010100000000000000640002000000000000007b7d"),
    ("U", "5500000000000000080064", "0300000000000000"),
    ("W", "570003733a6163", "0800000000000000010400000000000000"),
    ("V", "56000000000000000863", ""),
    ("V", "560000000000000008", "0100000000000000"),
    ("M", "4d636f756e7473", "030000000000000002000000000000000500000000000000010000000000000004000000000000000300000000000000"),
    ("M", "4d6170706c6965645f6c736e", "2a00000000000000"),
    ("M", "4d696e6465785f76657273696f6e", "05000000"),
];

#[test]
fn marker_keys_name_what_they_were_built_for_and_nothing_else() {
    let stream = 7u64.to_be_bytes();
    for key in [
        origin_key(6, ORIGIN_STREAM, &stream),
        ended_key(5, ORIGIN_STREAM, &stream),
    ] {
        assert_eq!(parse_marker_key(&key), Some(Marked::Stream(7)));
    }
    for key in [
        origin_key(6, ORIGIN_SESSION, b"s-1"),
        ended_key(5, ORIGIN_SESSION, b"s-1"),
    ] {
        assert_eq!(parse_marker_key(&key), Some(Marked::Session("s-1")));
    }
    // Skipped, never acted on: an unknown kind, a short stream id, a non-UTF-8 session id,
    // a key cut before its kind.
    assert_eq!(parse_marker_key(&origin_key(6, b'X', &stream)), None);
    assert_eq!(
        parse_marker_key(&origin_key(6, ORIGIN_STREAM, &[1, 2])),
        None
    );
    assert_eq!(
        parse_marker_key(&ended_key(5, ORIGIN_SESSION, &[0xff])),
        None
    );
    assert_eq!(
        parse_marker_key(&origin_key(6, ORIGIN_STREAM, &stream)[..9]),
        None
    );
}
