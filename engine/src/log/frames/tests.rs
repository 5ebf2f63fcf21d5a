use super::*;
use crate::format::{SegmentHeader, SyncPolicyTag};
use crate::record::{encode_frame, EventBody, FrameStamp};
use proptest::prelude::*;

fn header() -> Vec<u8> {
    SegmentHeader {
        base_lsn: 1,
        term: 1,
        sync: SyncPolicyTag::Always,
        boot_id: [0; 16],
        created_at_ms: 0,
        base_entry: 1,
        prev_term: 0,
    }
    .encode()
    .to_vec()
}

/// The stamp of record `lsn` written as a group of its own (entry = LSN from 1), term 1.
fn single(lsn: u64, synced_through: u64) -> FrameStamp {
    FrameStamp {
        lsn,
        entry: lsn,
        term: 1,
        group_left: 0,
        synced_through,
    }
}

fn event(seq: u64, len: usize) -> Record {
    Record::Event(EventBody {
        stream: 1,
        seq,
        at_ms: 0,
        kind: "k".into(),
        correlation: None,
        payload: vec![7; len],
    })
}

/// A segment of `events` single-record groups, written in writes of `per_write` groups,
/// each write synced before the next (as under `sync=always`): every frame claims the
/// offset where its write began as synced.
fn segment(events: usize, per_write: usize) -> Vec<u8> {
    let mut bytes = header();
    let mut synced = bytes.len() as u64;
    for i in 0..events {
        if i % per_write.max(1) == 0 {
            synced = bytes.len() as u64;
        }
        encode_frame(
            &event(i as u64 + 1, i % 40),
            single(i as u64 + 1, synced),
            &mut bytes,
        )
        .unwrap();
    }
    bytes
}

fn walk_all(bytes: &[u8]) -> WalkEnd {
    walk(&mut &bytes[..], 1, |_| Ok(Ok(()))).unwrap()
}

#[test]
fn a_clean_segment_walks_to_its_end() {
    let bytes = segment(20, 1);
    let end = walk_all(&bytes);
    assert_eq!(
        (end.records, end.last_lsn, end.damage.clone()),
        (20, 20, None)
    );
    assert_eq!(end.valid_end, bytes.len() as u64);
    assert_eq!(classify_tail(&bytes, &end), TailDamage::None);
}

#[test]
fn groups_are_kept_whole_or_not_at_all() {
    let mut bytes = header();
    for (i, (entry, left)) in [(1, 2u32), (1, 1), (1, 0), (2, 1), (2, 0)]
        .into_iter()
        .enumerate()
    {
        let stamp = FrameStamp {
            entry,
            group_left: left,
            ..single(i as u64 + 1, 64)
        };
        encode_frame(&event(i as u64 + 1, 3), stamp, &mut bytes).unwrap();
    }
    let mut groups = Vec::new();
    let end = walk_groups(&mut &bytes[..], 1, |g| {
        groups.push(g.len());
        Ok(())
    })
    .unwrap();
    assert_eq!(groups, [3, 2]);
    // Cut inside the second group: only the first is complete.
    let cut = &bytes[..bytes.len() - 5];
    let mut groups = Vec::new();
    let end2 = walk_groups(&mut &cut[..], 1, |g| {
        groups.push(g.len());
        Ok(())
    })
    .unwrap();
    assert_eq!(groups, [3]);
    assert_eq!(end2.last_lsn, 3);
    assert!(end2.damage.is_some() && end.damage.is_none());
}

/// The last frame of a segment of single-record groups, re-tagged `record_type` with a valid
/// CRC (how a newer build's record looks to this one), and its offset.
fn with_last_retagged(record_type: u8) -> (Vec<u8>, u64) {
    let mut bytes = segment(5, 1);
    let end = walk_all(&segment(4, 1));
    let at = end.valid_end as usize;
    bytes[at + 44] = record_type;
    let crc = crate::format::frame_crc_contiguous(&bytes[at..]);
    bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
    (bytes, at as u64)
}

/// A frame whose CRC checks but whose type this build does not know is a newer build's
/// record: never a torn tail, even as the last frame of the segment claiming nothing beyond
/// its own offset (what an unsynced write looks like).
#[test]
fn an_unknown_record_type_is_never_a_torn_tail() {
    let (bytes, at) = with_last_retagged(200);
    let end = walk_known(&mut &bytes[..], 1, |_| Ok(Ok(()))).unwrap();
    assert_eq!(
        end.damage,
        Some((at, CorruptionKind::UnknownRecordType(200)))
    );
    assert_eq!(
        classify_tail(&bytes, &end),
        TailDamage::UnknownRecordType(200)
    );
    let end = walk_groups(&mut &bytes[..], 1, |_| Ok(())).unwrap();
    assert_eq!(
        end.damage,
        Some((at, CorruptionKind::UnknownRecordType(200)))
    );
    // A known type whose body does not decode stays `BadBody`, and stays a torn tail.
    let (bytes, at) = with_last_retagged(tag::BLANK);
    let end = walk_groups(&mut &bytes[..], 1, |_| Ok(())).unwrap();
    assert!(matches!(end.damage, Some((a, CorruptionKind::BadBody(_))) if a == at));
    assert!(matches!(
        classify_tail(&bytes, &end),
        TailDamage::Unsynced { .. }
    ));
    // The bare walk reads frames, not record types (the replicated log's offset tables).
    assert_eq!(walk_all(&bytes).damage, None);
}

/// The last write lost some of its sectors (not a prefix): valid frames of the same
/// unsynced write follow the damage, yet it is a torn write, not corruption.
#[test]
fn a_torn_last_write_with_later_sectors_kept_is_unsynced_damage() {
    let bytes = segment(200, 100); // two writes of 100 frames, the second unsynced
    let second_write = {
        let end = walk_all(&segment(100, 100));
        end.valid_end as usize
    };
    let mut torn = bytes.clone();
    // Lose the first 4 KiB sector of the second write's region (zeros), keep the rest.
    let sector = (second_write / 4096 + 1) * 4096;
    for b in &mut torn[sector..sector + 4096] {
        *b = 0;
    }
    let end = walk_all(&torn);
    assert!(end.damage.is_some());
    match classify_tail(&torn, &end) {
        TailDamage::Unsynced { valid_frames_after } => assert!(valid_frames_after > 0),
        other => panic!("expected unsynced damage, got {other:?}"),
    }
}

/// Damage in a write that was synced before a later write: the later write's frames say so.
#[test]
fn damage_in_synced_data_followed_by_a_later_write_is_corruption() {
    let bytes = segment(200, 100);
    let mut bad = bytes.clone();
    bad[200] ^= 0xff; // inside the first (synced) write
    let end = walk_all(&bad);
    assert!(matches!(
        classify_tail(&bad, &end),
        TailDamage::Synced { .. }
    ));
}

/// A client embeds a forged frame (valid CRC, a plausible LSN, a claim that everything is
/// synced) in an event's payload; a power loss then tears the enclosing frame's header
/// sector. The forged claim must not turn the torn, unsynced write into "damage to synced
/// data" (a refused start).
#[test]
fn a_forged_frame_in_a_payload_cannot_claim_a_torn_write_was_synced() {
    let mut bytes = segment(10, 10); // one synced write
    let synced = bytes.len() as u64;
    // The forged frame: LSN 12 (the next but one), claiming the whole file was synced.
    let mut forged = Vec::new();
    encode_frame(&event(99, 8), single(12, u64::MAX), &mut forged).unwrap();
    let mut payload = vec![0u8; 5000];
    payload[4200..4200 + forged.len()].copy_from_slice(&forged);
    let enclosing = Record::Event(EventBody {
        stream: 1,
        seq: 11,
        at_ms: 0,
        kind: "k".into(),
        correlation: None,
        payload,
    });
    // The enclosing frame is an unsynced write.
    encode_frame(&enclosing, single(11, synced), &mut bytes).unwrap();
    // The enclosing frame's header and first bytes are lost (zeros), the rest survived.
    for b in &mut bytes[synced as usize..synced as usize + 64] {
        *b = 0;
    }
    let end = walk_all(&bytes);
    assert_eq!(end.valid_end, synced);
    match classify_tail(&bytes, &end) {
        TailDamage::Unsynced { .. } => {}
        other => panic!("a forged claim made a torn write look synced: {other:?}"),
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_after_a_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut bytes = header();
        bytes.extend_from_slice(&tail);
        let end = walk_all(&bytes);
        prop_assert!(end.valid_end <= bytes.len() as u64);
        let _ = classify_tail(&bytes, &end);
    }

    #[test]
    fn mutated_segments_yield_a_valid_prefix_or_named_damage(
        at in 80usize..2000, value: u8, cut in 0usize..2100,
    ) {
        let clean = segment(30, 1);
        let mut bytes = clean.clone();
        if let Some(b) = bytes.get_mut(at) { *b = value; }
        bytes.truncate(cut.max(80));
        let end = walk_all(&bytes);
        // Whatever was kept is byte-identical to the clean segment's prefix.
        let kept = usize::try_from(end.valid_end).unwrap();
        prop_assert_eq!(&bytes[..kept], &clean[..kept]);
        prop_assert!(end.damage.is_some() || kept == bytes.len());
    }

    /// Any subset of the sectors of the last, unsynced write: recovery keeps exactly the
    /// synced prefix (or more complete groups of the torn write), never refuses.
    #[test]
    fn any_sector_subset_of_the_unsynced_write_is_a_torn_tail(mask: u64, synced_frames in 1usize..120) {
        let total = 160;
        let mut bytes = header();
        let mut synced = bytes.len() as u64;
        for i in 0..total {
            if i == synced_frames {
                synced = bytes.len() as u64;
            }
            encode_frame(&event(i as u64 + 1, 90), single(i as u64 + 1, synced), &mut bytes).unwrap();
        }
        let boundary = synced as usize;
        let mut torn = bytes[..boundary].to_vec();
        torn.resize(bytes.len(), 0);
        let mut sector = boundary / 4096 * 4096;
        let mut bit = 0;
        while sector < bytes.len() {
            let end = (sector + 4096).min(bytes.len());
            let from = sector.max(boundary);
            if mask >> (bit % 64) & 1 == 1 {
                torn[from..end].copy_from_slice(&bytes[from..end]);
            }
            sector += 4096;
            bit += 1;
        }
        let end = walk_all(&torn);
        prop_assert!(end.valid_end >= synced, "kept {} < synced {}", end.valid_end, synced);
        let synced_damage = matches!(classify_tail(&torn, &end), TailDamage::Synced { .. });
        prop_assert!(!synced_damage);
    }
}
