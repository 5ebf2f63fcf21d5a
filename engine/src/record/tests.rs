//! Unit tests of record frames and the hand-written event body codec.
use super::*;
use crate::task::{
    EndCause, InputSlot, OutcomeKind, QueueState, QueuedMessage, SlotState, TaskMeta, TaskOutcome,
    TaskRemoval, TaskStatus,
};
use proptest::prelude::*;

fn sample_records() -> Vec<Record> {
    let ev = EventBody {
        stream: 7,
        seq: 3,
        at_ms: 99,
        kind: "progress".into(),
        correlation: Some("req-1".into()),
        payload: b"hello".to_vec(),
    };
    let meta = StreamMeta {
        id: 7,
        session: "s".into(),
        epoch: 2,
        state: StreamState::Completed,
        head: 4,
        watermark: 2,
        correlation: None,
        opened_at_ms: 1,
        ended_at_ms: Some(5),
        end_reason: None,
        has_terminal_frame: true,
        lease_ms: Some(100),
    };
    vec![
        Record::SessionOpened {
            session: "s".into(),
            epoch: 1,
            at_ms: 5,
        },
        Record::EpochAdvanced {
            session: "s".into(),
            epoch: 2,
            at_ms: 6,
        },
        Record::SessionExpired {
            session: "s".into(),
            at_ms: 7,
        },
        Record::StreamOpened(StreamOpened {
            stream: 7,
            session: "s".into(),
            epoch: 2,
            correlation: Some("r".into()),
            lease_ms: None,
            at_ms: 8,
        }),
        Record::Event(ev.clone()),
        Record::Terminal(Terminal {
            stream: 7,
            state: StreamState::Completed,
            terminal_seq: 4,
            at_ms: 9,
            reason: None,
            frame: Some(ev.clone()),
        }),
        Record::Trim {
            stream: 7,
            watermark: 3,
            at_ms: 10,
        },
        Record::SessionSnapshot(SessionMeta {
            id: "s".into(),
            epoch: 2,
            opened_at_ms: 1,
            expired_at_ms: None,
        }),
        Record::StreamSnapshot(StreamSnapshot {
            meta,
            terminal_frame: Some(ev),
        }),
        Record::StreamForgotten {
            stream: 7,
            at_ms: 11,
        },
        Record::SessionForgotten {
            session: "s".into(),
            at_ms: 12,
        },
        Record::SessionState(SessionStateBody {
            session: "s".into(),
            state: b"{\"protocolVersion\":\"2025-11-25\"}".to_vec(),
            at_ms: 13,
        }),
        Record::Shutdown { at_ms: 14 },
    ]
    .into_iter()
    .chain(sample_task_records())
    .collect()
}

/// One record of every task type (tags 16–21, 24–26).
fn sample_task_records() -> Vec<Record> {
    let meta = TaskMeta {
        id: 16,
        owner: "s:a".into(),
        task_id: "t1".into(),
        request_key: "7".into(),
        status: TaskStatus::Failed,
        status_message: Some("m".into()),
        version: 3,
        created_at_ms: 20,
        updated_at_ms: 21,
        ttl_ms: Some(60_000),
        poll_interval_ms: 1_000,
        worker_lease_ms: None,
        cancel_requested: true,
        ended_at_ms: Some(21),
        end_cause: Some(EndCause::LeaseExpired),
        deleted_at_ms: None,
        removal: None,
        outcome_kind: OutcomeKind::Error,
        context: b"{}".to_vec(),
    };
    vec![
        Record::TaskCreated(TaskCreated {
            id: 16,
            owner: "s:a".into(),
            task_id: "t1".into(),
            request_key: "7".into(),
            ttl_ms: Some(60_000),
            poll_interval_ms: 1_000,
            worker_lease_ms: Some(10_000),
            status_message: None,
            context: b"{}".to_vec(),
            at_ms: 20,
        }),
        Record::TaskUpdated(TaskUpdated {
            id: 16,
            version: 2,
            status: TaskStatus::Working,
            status_message: Some("half".into()),
            ttl_ms: None,
            poll_interval_ms: Some(500),
            at_ms: 21,
        }),
        Record::TaskInputRequested(TaskInputRequested {
            id: 16,
            version: 3,
            requests: vec![("k".into(), b"{}".to_vec())],
            status_message: None,
            at_ms: 22,
        }),
        Record::TaskInputAnswered(TaskInputAnswered {
            id: 16,
            version: 4,
            responses: vec![("k".into(), b"1".to_vec())],
            at_ms: 23,
        }),
        Record::TaskCancelRequested(TaskCancelRequested {
            id: 16,
            version: 5,
            at_ms: 24,
        }),
        Record::TaskEnded(TaskEnded {
            id: 16,
            version: 6,
            status: TaskStatus::Completed,
            cause: EndCause::Client,
            status_message: None,
            outcome: TaskOutcome {
                kind: OutcomeKind::Result,
                json: b"{}".to_vec(),
            },
            at_ms: 25,
        }),
        Record::TaskQueued(TaskQueued {
            id: 16,
            channel: 0,
            qseq: 1,
            max_len: 8,
            dedupe_key: Some("d".into()),
            correlation: None,
            message: b"{}".to_vec(),
            at_ms: 25,
        }),
        Record::TaskDequeued(TaskDequeued {
            id: 16,
            channel: 0,
            through_qseq: 1,
            token: "t".into(),
            at_ms: 25,
        }),
        Record::TaskDeleted(TaskDeleted {
            id: 16,
            removal: TaskRemoval::Expired,
            at_ms: 26,
        }),
        Record::TaskSnapshot(TaskSnapshot {
            meta,
            outcome: b"{}".to_vec(),
            slots: vec![InputSlot {
                key: "k".into(),
                request: b"{}".to_vec(),
                response: None,
                state: SlotState::Dropped,
            }],
            queues: vec![QueueSnapshot {
                channel: 1,
                state: QueueState {
                    head: 1,
                    tail: 2,
                    bytes: 2,
                    last_token: Some("t".into()),
                },
                messages: vec![QueuedMessage {
                    qseq: 2,
                    at_ms: 24,
                    dedupe_key: None,
                    correlation: Some("7".into()),
                    message: b"{}".to_vec(),
                }],
                last_batch: Vec::new(),
            }],
        }),
        Record::TaskForgotten(TaskForgotten { id: 16, at_ms: 27 }),
        Record::TaskRoutes(TaskRoutes {
            id: 16,
            routes: vec![
                RouteEntry {
                    correlation: "7".into(),
                    inbound_qseq: None,
                },
                RouteEntry {
                    correlation: "8".into(),
                    inbound_qseq: Some(2),
                },
            ],
        }),
    ]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every record type's body, byte for byte (FORMAT.md "Record bodies"): a change here is a
/// format change, which bumps the version and keeps the old decoders.
#[test]
fn record_bodies_golden_bytes() {
    let got: Vec<(u8, String)> = sample_records()
        .iter()
        .map(|r| {
            let mut body = Vec::new();
            r.encode_body(&mut body).unwrap();
            (r.tag(), hex(&body))
        })
        .collect();
    if std::env::var_os("CURSORLOG_PRINT_GOLDEN").is_some() {
        for (tag, h) in &got {
            println!("({tag}, \"{h}\"),");
        }
    }
    let want: &[(u8, &str)] = GOLDEN_BODIES;
    let want: Vec<(u8, String)> = want.iter().map(|(t, h)| (*t, (*h).to_owned())).collect();
    assert_eq!(got, want);
}

const GOLDEN_BODIES: &[(u8, &str)] = &[
    (1, "01000000000000007301000000000000000500000000000000"),
    (2, "01000000000000007302000000000000000600000000000000"),
    (3, "0100000000000000730700000000000000"),
    (4, "0700000000000000010000000000000073020000000000000001010000000000000072000800000000000000"),
    (5, "070000000000000003000000000000006300000000000000080000000000000070726f67726573730105000000000000007265712d31050000000000000068656c6c6f"),
    (6, "070000000000000001000000040000000000000009000000000000000001070000000000000003000000000000006300000000000000080000000000000070726f67726573730105000000000000007265712d31050000000000000068656c6c6f"),
    (7, "070000000000000003000000000000000a00000000000000"),
    (8, "0100000000000000730200000000000000010000000000000000"),
    (9, "070000000000000001000000000000007302000000000000000100000004000000000000000200000000000000000100000000000000010500000000000000000101640000000000000001070000000000000003000000000000006300000000000000080000000000000070726f67726573730105000000000000007265712d31050000000000000068656c6c6f"),
    (10, "070000000000000000000000000000000b00000000000000"),
    (11, "0100000000000000730c00000000000000"),
    (12, "01000000000000007320000000000000007b2270726f746f636f6c56657273696f6e223a22323032352d31312d3235227d0d00000000000000"),
    (13, "0e00000000000000"),
    (16, "10000000000000000300000000000000733a61020000000000000074310100000000000000370160ea000000000000e8030000000000000110270000000000000002000000000000007b7d1400000000000000"),
    (17, "100000000000000002000000000000000001040000000000000068616c660001f4010000000000001500000000000000"),
    (18, "10000000000000000300000000000000010000000000000001000000000000006b02000000000000007b7d001600000000000000"),
    (19, "10000000000000000400000000000000010000000000000001000000000000006b0100000000000000311700000000000000"),
    (20, "100000000000000005000000000000001800000000000000"),
    (21, "100000000000000006000000000000000200000102000000000000007b7d1900000000000000"),
    (22, "100000000000000000010000000000000008000000010100000000000000640002000000000000007b7d1900000000000000"),
    (23, "10000000000000000001000000000000000100000000000000741900000000000000"),
    (24, "1000000000000000001a00000000000000"),
    (25, "10000000000000000300000000000000733a6102000000000000007431010000000000000037030101000000000000006d0300000000000000140000000000000015000000000000000160ea000000000000e8030000000000000001011500000000000000010200000202000000000000007b7d02000000000000007b7d010000000000000001000000000000006b02000000000000007b7d000201000000000000000101000000000000000200000000000000020000000000000001010000000000000074010000000000000002000000000000001800000000000000000101000000000000003702000000000000007b7d0000000000000000"),
    (26, "10000000000000001b00000000000000"),
    // id 16; 2 routes: "7" open; "8" answered by inbound qseq 2.
    (27, "1000000000000000020000000000000001000000000000003700010000000000000038010200000000000000"),
];

/// A whole frame, header included (FORMAT.md "Record frame").
/// The stamp of a record at `lsn` with `group_left` more in its group: entry 7, term 2,
/// everything before offset 64 synced.
fn stamp(lsn: u64, group_left: u32) -> FrameStamp {
    FrameStamp {
        lsn,
        entry: 7,
        term: 2,
        group_left,
        synced_through: 64,
    }
}

#[test]
fn frame_golden_bytes() {
    let mut buf = Vec::new();
    let stamp = FrameStamp {
        lsn: 0x0102,
        entry: 0x0a,
        term: 0x05,
        group_left: 3,
        synced_through: 0x40,
    };
    encode_frame(&Record::Shutdown { at_ms: 14 }, stamp, &mut buf).unwrap();
    // body_len 8, crc, lsn 0x0102, synced_through 0x40, entry 0x0a, term 5, group_left 3,
    // type 13, reserved, body.
    assert_eq!(
        hex(&buf),
        "080000002507f314020100000000000040000000000000000a000000000000000500000000000000030000000d0000000e00000000000000"
    );
}

#[test]
fn the_known_tags_are_exactly_the_decodable_ones() {
    let sampled: Vec<u8> = sample_records().iter().map(Record::tag).collect();
    for t in 0..=u8::MAX {
        // Blank (14) and Membership (15) are entry-log records with their own samples.
        let known = sampled.contains(&t) || t == tag::BLANK || t == tag::MEMBERSHIP;
        assert_eq!(tag::is_known(t), known, "tag {t}");
    }
}

#[test]
fn every_record_type_round_trips() {
    for (i, r) in sample_records().into_iter().enumerate() {
        let mut buf = Vec::new();
        let n = encode_frame(&r, stamp(100 + i as u64, 1), &mut buf).unwrap();
        assert_eq!(n as usize, buf.len());
        let f = decode_frame(&buf).unwrap();
        assert_eq!(f.record, r);
        assert_eq!(f.header.lsn, 100 + i as u64);
        assert_eq!(f.header.group_left, 1);
    }
}

#[test]
fn every_bit_flip_is_detected() {
    let mut buf = Vec::new();
    encode_frame(&sample_records()[4], stamp(1, 0), &mut buf).unwrap();
    for byte in 0..buf.len() {
        for bit in 0..8 {
            let mut bad = buf.clone();
            bad[byte] ^= 1 << bit;
            assert!(
                decode_frame(&bad).is_err(),
                "flip at {byte}.{bit} went unnoticed"
            );
        }
    }
}

#[test]
fn every_truncation_is_truncated() {
    let mut buf = Vec::new();
    encode_frame(&sample_records()[5], stamp(1, 0), &mut buf).unwrap();
    for len in 0..buf.len() {
        assert_eq!(
            decode_frame(&buf[..len]),
            Err(FrameError::Truncated),
            "len {len}"
        );
    }
}

#[test]
fn contiguous_crc_is_the_frame_crc() {
    for r in sample_records() {
        let mut buf = Vec::new();
        encode_frame(&r, stamp(9, 0), &mut buf).unwrap();
        let raw: &[u8; FRAME_HEADER_BYTES] = buf[..FRAME_HEADER_BYTES].try_into().unwrap();
        assert_eq!(
            crate::format::frame_crc_contiguous(&buf),
            crate::format::frame_crc(raw, &buf[FRAME_HEADER_BYTES..])
        );
        assert_eq!(
            crate::format::frame_crc_contiguous(&buf),
            FrameHeader::read(raw).crc
        );
    }
}

#[test]
fn zeroes_are_not_a_frame() {
    assert!(matches!(
        decode_frame(&[0u8; 64]),
        Err(FrameError::Crc { .. })
    ));
}

#[test]
fn unknown_type_with_good_crc_is_bad_body() {
    let mut buf = Vec::new();
    encode_frame(&sample_records()[0], stamp(1, 0), &mut buf).unwrap();
    let body = buf[FRAME_HEADER_BYTES..].to_vec();
    let h = FrameHeader {
        body_len: body.len() as u32,
        crc: 0,
        lsn: 1,
        synced_through: 64,
        entry: 1,
        term: 1,
        group_left: 0,
        record_type: 200,
    };
    let mut forged = h.write(&body).to_vec();
    forged.extend_from_slice(&body);
    assert!(matches!(decode_frame(&forged), Err(FrameError::BadBody(_))));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_frame(&bytes);
    }

    #[test]
    fn arbitrary_bodies_with_valid_crc_never_panic(
        tag in 0u8..30,
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let h = FrameHeader { body_len: body.len() as u32, crc: 0, lsn: 1, synced_through: 64, entry: 1, term: 1, group_left: 0, record_type: tag };
        let mut buf = h.write(&body).to_vec();
        buf.extend_from_slice(&body);
        let _ = decode_frame(&buf);
    }

    #[test]
    fn fast_event_decode_agrees_with_bincode(
        bytes in proptest::collection::vec(any::<u8>(), 0..96),
    ) {
        let fast = decode_event_body(&bytes).ok();
        let slow: Option<EventBody> = codec::decode(&bytes).ok();
        prop_assert_eq!(fast, slow);
    }

    #[test]
    fn fast_event_decode_agrees_on_mutated_bodies(
        stream: u64, seq: u64, at_ms: u64,
        kind in ".{0,8}",
        correlation in proptest::option::of(".{0,8}"),
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        at in any::<proptest::sample::Index>(),
        mask in any::<u8>(),
        cut in any::<proptest::sample::Index>(),
        extend in any::<bool>(),
    ) {
        let e = EventBody { stream, seq, at_ms, kind, correlation, payload };
        let mut body = Vec::new();
        codec::encode_into(&e, &mut body).unwrap();
        prop_assert_eq!(decode_event_body(&body).unwrap(), e);
        let i = at.index(body.len());
        body[i] ^= mask;
        if extend {
            body.push(mask);
        } else {
            body.truncate(cut.index(body.len() + 1));
        }
        let fast = decode_event_body(&body).ok();
        let slow: Option<EventBody> = codec::decode(&body).ok();
        prop_assert_eq!(fast, slow);
    }

    #[test]
    fn fast_event_encode_agrees_with_bincode(
        stream: u64, seq: u64, at_ms: u64,
        kind in ".{0,16}",
        correlation in proptest::option::of(".{0,16}"),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        prefix in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let e = EventBody { stream, seq, at_ms, kind, correlation, payload };
        let mut fast = prefix.clone();
        encode_event_body(&e, &mut fast);
        let mut slow = prefix;
        codec::encode_into(&e, &mut slow).unwrap();
        prop_assert_eq!(fast, slow);
    }

    #[test]
    fn events_round_trip(
        stream: u64, seq: u64, at_ms: u64,
        kind in ".{0,16}",
        correlation in proptest::option::of(".{0,16}"),
        payload in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let r = Record::Event(EventBody { stream, seq, at_ms, kind, correlation, payload });
        let mut buf = Vec::new();
        encode_frame(&r, stamp(5, 0), &mut buf).unwrap();
        prop_assert_eq!(decode_frame(&buf).unwrap().record, r);
    }
}
