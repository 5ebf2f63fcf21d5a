//! Durability tests: torn tails at every byte of the last record (and of multi-record
//! groups), garbage tails, bit flips in sealed and active segments (one test per
//! `CorruptionKind`), index rebuild and catch-up, the directory lock, and id monotonicity
//! across reopens.
//!
//! Damage is done to real files between runs; a "crash" is a copy of the data directory
//! (the on-disk state at that instant) opened by a fresh engine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;
use cursorlog_engine::{
    verify_dir, Append, CorruptionKind, Engine, Error, Event, NewEvent, OpenStream, Resolution,
    StreamState, SyncPolicy, Verdict,
};
use tempfile::TempDir;

const SESSION: &str = "sess-1";

fn tmp() -> TempDir {
    tempfile::tempdir().unwrap()
}

fn open_always(dir: &Path) -> Engine {
    open(dir, SyncPolicy::Always, 64 * 1024 * 1024)
}

fn read_all(e: &Engine, session: &str, stream: u64) -> Vec<Event> {
    e.read(session, stream, 0, 10_000).unwrap().events
}

fn resolve(e: &Engine, session: &str, epoch: u64, stream: u64, seq: u64) -> Resolution {
    e.resolve(session, &format!("{epoch}-{stream}-{seq}"), Some(stream))
        .unwrap()
}

fn dump_of(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let e = open_always(dir);
    let d = e.index_dump().unwrap();
    e.close().unwrap();
    d
}

fn stream_meta(e: &Engine, id: u64) -> cursorlog_engine::StreamMeta {
    e.streams()
        .unwrap()
        .into_iter()
        .find(|s| s.id == id)
        .expect("stream is remembered")
}

/// Asserts `r` is a corruption error naming `file` at `offset`, and returns its kind.
#[track_caller]
fn corruption(r: Result<impl std::fmt::Debug, Error>, file: &Path, offset: u64) -> CorruptionKind {
    match r {
        Err(Error::Corruption {
            segment,
            offset: at,
            kind,
        }) => {
            assert_eq!(segment, file, "the error names the damaged file");
            assert_eq!(at, offset, "the error names the damaged offset ({kind:?})");
            kind
        }
        other => panic!(
            "expected Corruption in {} at {offset}, got {other:?}",
            file.display()
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Torn tails
// ---------------------------------------------------------------------------------------------

/// A data directory whose last group is the record(s) under test, and a copy of the same
/// directory taken just before that group was written.
struct TornCase {
    _full: TempDir,
    _reference: TempDir,
    full: PathBuf,
    reference: PathBuf,
}

/// Runs `setup`, closes, snapshots the directory as the reference, reopens, runs `last` (the
/// operation whose group will be torn) and stops as a crash would (no shutdown marker after
/// the group).
fn torn_case(setup: impl FnOnce(&Engine), last: impl FnOnce(&Engine)) -> TornCase {
    let full = tmp();
    let reference = tmp();
    let e = open_always(full.path());
    setup(&e);
    e.close().unwrap();
    drop(e);
    copy_dir(full.path(), reference.path());
    let e = open_always(full.path());
    last(&e);
    e.simulate_crash();
    drop(e);
    TornCase {
        full: full.path().to_path_buf(),
        reference: reference.path().to_path_buf(),
        _full: full,
        _reference: reference,
    }
}

/// For every cut point from the start of the last group to one byte before its end: copy
/// the directory (alternately with and without its index), cut the last segment there, and
/// check that verify sees a torn tail, that open truncates exactly back to the group start,
/// that the index equals the reference's, that `check` holds, and that writing (`write`)
/// afterwards works and survives another reopen (`check_after`). Cuts exactly at a frame
/// boundary inside the group are included (regression:
/// `a_tear_at_a_frame_boundary_inside_a_group_is_a_torn_tail`).
fn check_every_cut(
    case: &TornCase,
    expected_group_records: usize,
    check: impl Fn(&Engine) + Sync,
    write: impl Fn(&Engine) + Sync,
    check_after: impl Fn(&Engine) + Sync,
) {
    let seg = last_segment(&case.full);
    let ref_seg = last_segment(&case.reference);
    assert_eq!(
        seg.file_name(),
        ref_seg.file_name(),
        "test setup: the torn group must be in the reference's last segment"
    );
    let group_start = file_len(&ref_seg);
    let group_end = file_len(&seg);
    let group: Vec<RawFrame> = frames(&seg)
        .into_iter()
        .filter(|f| f.offset >= group_start)
        .collect();
    assert_eq!(group.len(), expected_group_records, "test setup: {group:?}");
    for (i, f) in group.iter().enumerate() {
        assert_eq!(
            f.group_left as usize,
            group.len() - 1 - i,
            "frames of one request form one atomic group"
        );
    }
    let ref_dump = dump_of(&case.reference);
    let cuts: Vec<u64> = (group_start..group_end).collect();
    par_for_each(&cuts, 8, |&cut| {
        let dir = tmp();
        let with_index = cut % 2 == 0;
        if with_index {
            copy_dir(&case.full, dir.path());
        } else {
            copy_segments(&case.full, dir.path());
        }
        let torn = dir.path().join(seg.file_name().unwrap());
        truncate(&torn, cut);

        let v = verify_dir(dir.path()).unwrap();
        assert!(v.ok(), "cut {cut}: a torn tail is not corruption: {v}");
        assert_eq!(
            v.segments.last().unwrap().torn_tail_bytes,
            cut - group_start,
            "cut {cut}"
        );

        let e = open_always(dir.path());
        let rep = e.recovery_report().clone();
        assert_eq!(rep.bytes_truncated, cut - group_start, "cut {cut}: {rep}");
        assert_eq!(
            file_len(&torn),
            group_start,
            "cut {cut}: truncated to the group start"
        );
        assert_eq!(
            e.index_dump().unwrap(),
            ref_dump,
            "cut {cut} (index copied: {with_index}): the recovered index is the index before \
             the torn group"
        );
        check(&e);
        write(&e);
        e.close().unwrap();
        drop(e);

        let e = open_always(dir.path());
        assert_eq!(e.recovery_report().bytes_truncated, 0, "cut {cut}");
        check_after(&e);
        e.close().unwrap();
    });
}

#[test]
fn torn_tail_at_every_offset_of_the_last_event() {
    const N: u64 = 5;
    let stream = std::cell::Cell::new(0);
    let expected = std::cell::RefCell::new(Vec::new());
    let case = torn_case(
        |e| {
            let (_, s) = new_stream(e, SESSION, None);
            stream.set(s);
            for q in 1..N {
                append_range(e, SESSION, s, q, q);
            }
            *expected.borrow_mut() = read_all(e, SESSION, s);
        },
        |e| {
            append_range(e, SESSION, stream.get(), N, N);
        },
    );
    let s = stream.get();
    let expected = expected.into_inner();
    assert_eq!(expected.len() as u64, N - 1);
    let replacement = NewEvent::new("after-recovery", b"new bytes".to_vec());
    check_every_cut(
        &case,
        1,
        |e| {
            assert_eq!(
                read_all(e, SESSION, s),
                expected,
                "earlier events byte-identical"
            );
            let ahead = resolve(e, SESSION, 1, s, N);
            assert_eq!(ahead.verdict, Verdict::CursorAhead, "{ahead:?}");
            assert_eq!(ahead.facts.head, Some(N - 1));
            assert_eq!(resolve(e, SESSION, 1, s, N - 1).verdict, Verdict::Resumable);
            let after = e.read(SESSION, s, N - 1, 100).unwrap();
            assert!(after.events.is_empty(), "the torn event is never served");
            assert_eq!(after.head, N - 1);
        },
        |e| {
            let a = e
                .append(Append {
                    session: SESSION.into(),
                    stream: s,
                    expected_next_seq: Some(N),
                    events: vec![replacement.clone()],
                })
                .unwrap();
            assert_eq!((a.first_seq, a.duplicate), (N, false));
        },
        |e| {
            let all = read_all(e, SESSION, s);
            assert_eq!(&all[..expected.len()], &expected[..]);
            assert_eq!(all.len() as u64, N);
            assert_eq!(all[N as usize - 1].payload, replacement.payload);
            assert_eq!(*all[N as usize - 1].kind, *replacement.kind);
        },
    );
}

#[test]
fn torn_tail_inside_an_epoch_advance_group_drops_the_whole_group() {
    let ids = std::cell::Cell::new((0, 0));
    let case = torn_case(
        |e| {
            let (_, a) = new_stream(e, SESSION, Some("req-a"));
            let (_, b) = new_stream(e, SESSION, Some("req-b"));
            append_range(e, SESSION, a, 1, 3);
            append_range(e, SESSION, b, 1, 2);
            ids.set((a, b));
        },
        |e| {
            let adv = e.advance_epoch(SESSION).unwrap();
            assert_eq!(adv.epoch, 2);
            assert_eq!(adv.superseded.len(), 2);
        },
    );
    let (a, b) = ids.get();
    check_every_cut(
        &case,
        3,
        |e| {
            let s = e.open_session(SESSION).unwrap();
            assert_eq!(
                (s.epoch, s.created),
                (1, false),
                "the epoch advance is undone"
            );
            for (id, head) in [(a, 3), (b, 2)] {
                assert_eq!(stream_meta(e, id).state, StreamState::Open);
                let r = resolve(e, SESSION, 1, id, head);
                assert_eq!(r.verdict, Verdict::Resumable, "{r:?}");
            }
        },
        |e| {
            let adv = e.advance_epoch(SESSION).unwrap();
            assert_eq!(adv.epoch, 2);
            let got: BTreeSet<u64> = adv.superseded.into_iter().collect();
            assert_eq!(got, BTreeSet::from([a, b]));
        },
        |e| {
            assert_eq!(e.open_session(SESSION).unwrap().epoch, 2);
            for id in [a, b] {
                assert_eq!(stream_meta(e, id).state, StreamState::Superseded);
                let r = resolve(e, SESSION, 1, id, 1);
                assert_eq!(r.verdict, Verdict::EpochMismatch);
                assert_eq!(r.facts.current_epoch, Some(2));
            }
        },
    );
}

#[test]
fn torn_tail_inside_a_session_expiry_group_drops_the_whole_group() {
    let ids = std::cell::Cell::new((0, 0));
    let case = torn_case(
        |e| {
            let (_, a) = new_stream(e, SESSION, None);
            let (_, b) = new_stream(e, SESSION, None);
            append_range(e, SESSION, a, 1, 1);
            ids.set((a, b));
        },
        |e| {
            assert_eq!(e.expire_session(SESSION).unwrap().aborted.len(), 2);
        },
    );
    let (a, b) = ids.get();
    check_every_cut(
        &case,
        3,
        |e| {
            assert_eq!(e.open_session(SESSION).unwrap().epoch, 1);
            assert_eq!(resolve(e, SESSION, 1, a, 1).verdict, Verdict::Resumable);
            assert_eq!(resolve(e, SESSION, 1, b, 0).verdict, Verdict::Resumable);
        },
        |e| {
            let got: BTreeSet<u64> = e
                .expire_session(SESSION)
                .unwrap()
                .aborted
                .into_iter()
                .collect();
            assert_eq!(got, BTreeSet::from([a, b]));
        },
        |e| {
            let r = resolve(e, SESSION, 1, a, 1);
            assert_eq!(r.verdict, Verdict::UnknownSession);
            assert!(r.facts.session_expired);
            assert!(matches!(
                e.open_session(SESSION),
                Err(Error::SessionExpired)
            ));
        },
    );
}

#[test]
fn torn_tail_inside_a_completion_with_terminal_frame() {
    let ids = std::cell::Cell::new(0);
    let case = torn_case(
        |e| {
            let (_, s) = new_stream(e, SESSION, Some("req-9"));
            append_range(e, SESSION, s, 1, 2);
            ids.set(s);
        },
        |e| {
            let t = e
                .complete(
                    SESSION,
                    ids.get(),
                    Some(3),
                    NewEvent::new("result", b"done".to_vec()),
                )
                .unwrap();
            assert_eq!(t.terminal_seq, 3);
        },
    );
    let s = ids.get();
    check_every_cut(
        &case,
        1,
        |e| {
            let m = stream_meta(e, s);
            assert_eq!((m.state, m.head), (StreamState::Open, 2));
            assert_eq!(resolve(e, SESSION, 1, s, 3).verdict, Verdict::CursorAhead);
            assert_eq!(resolve(e, SESSION, 1, s, 2).verdict, Verdict::Resumable);
            assert!(e.read(SESSION, s, 2, 10).unwrap().events.is_empty());
            let o = e.outcome(SESSION, "req-9").unwrap().unwrap();
            assert_eq!((o.state, o.frame), (StreamState::Open, None));
        },
        |e| {
            let t = e
                .complete(
                    SESSION,
                    s,
                    Some(3),
                    NewEvent::new("result", b"again".to_vec()),
                )
                .unwrap();
            assert_eq!(t.terminal_seq, 3);
        },
        |e| {
            let r = resolve(e, SESSION, 1, s, 3);
            assert_eq!(r.verdict, Verdict::StreamTerminated);
            assert_eq!(r.facts.terminal_seq, Some(3));
            let o = e.outcome(SESSION, "req-9").unwrap().unwrap();
            assert_eq!(o.frame.unwrap().payload, &b"again"[..]);
        },
    );
}

#[test]
fn garbage_after_valid_data_is_truncated() {
    let base = tmp();
    let e = open_always(base.path());
    let (_, s) = new_stream(&e, SESSION, None);
    append_range(&e, SESSION, s, 1, 4);
    let expected = read_all(&e, SESSION, s);
    e.close().unwrap();
    drop(e);
    let seg = last_segment(base.path());
    let valid_len = file_len(&seg);
    let last_frame = *frames(&seg).last().unwrap();
    let last_frame_bytes = std::fs::read(&seg).unwrap()[last_frame.offset as usize..].to_vec();

    let mut rng = SplitMix(0x5eed);
    let mut tails: Vec<(&str, Vec<u8>)> = vec![
        ("one zero", vec![0]),
        ("zeros, a frame header's worth", vec![0; 24]),
        ("zeros, a page", vec![0; 4096]),
        ("ones", vec![0xff; 100]),
        ("a repeat of the last frame", last_frame_bytes.clone()),
        (
            "a repeat of the last frame, twice",
            [&last_frame_bytes[..], &last_frame_bytes[..]].concat(),
        ),
    ];
    for n in [1, 7, 23, 24, 25, 100, 1000, 5000] {
        tails.push(("random", rng.bytes(n)));
    }
    for (what, tail) in tails {
        let dir = tmp();
        copy_dir(base.path(), dir.path());
        let seg = last_segment(dir.path());
        append_bytes(&seg, &tail);
        let v = verify_dir(dir.path()).unwrap();
        assert!(v.ok(), "{what} ({} bytes): {v}", tail.len());
        let e = open_always(dir.path());
        assert_eq!(
            e.recovery_report().bytes_truncated,
            tail.len() as u64,
            "{what} ({} bytes)",
            tail.len()
        );
        assert_eq!(file_len(&seg), valid_len, "{what}");
        assert_eq!(read_all(&e, SESSION, s), expected, "{what}");
        append_range(&e, SESSION, s, 5, 5);
        e.close().unwrap();
        drop(e);
        let e = open_always(dir.path());
        assert_eq!(read_all(&e, SESSION, s).len(), 5, "{what}");
        e.close().unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Damage in sealed segments and one test per CorruptionKind
// ---------------------------------------------------------------------------------------------

/// A closed data directory with at least `segments` segment files, written by one stream.
/// Returns (dir, stream id, its events).
fn multi_segment_dir(segments: usize) -> (TempDir, u64, Vec<Event>) {
    let dir = tmp();
    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    let (_, s) = new_stream(&e, SESSION, None);
    let mut q = 0;
    while segment_files(dir.path()).len() < segments {
        q += 1;
        append_range(&e, SESSION, s, q, q);
    }
    // A few more so the last segment holds several frames.
    for _ in 0..5 {
        q += 1;
        append_range(&e, SESSION, s, q, q);
    }
    let events = read_all(&e, SESSION, s);
    e.close().unwrap();
    (dir, s, events)
}

/// An event frame in the middle of segment `index` (not the last), and the seq it holds.
fn event_frame_in(dir: &Path, index: usize, events: &[Event]) -> (PathBuf, RawFrame, u64) {
    let segs = segment_files(dir);
    assert!(
        index + 1 < segs.len(),
        "test setup: segment {index} is sealed"
    );
    let path = segs[index].clone();
    let fs: Vec<RawFrame> = frames(&path)
        .into_iter()
        .filter(|f| f.record_type == tag::EVENT)
        .collect();
    let f = fs[fs.len() / 2];
    // The seq is found by position: events were appended one per frame, in order.
    let all: Vec<RawFrame> = all_frames(dir)
        .into_iter()
        .map(|(_, f)| f)
        .filter(|f| f.record_type == tag::EVENT)
        .collect();
    let nth = all.iter().position(|g| g.lsn == f.lsn).unwrap();
    let seq = events[nth].seq;
    (path, f, seq)
}

fn remove_index(dir: &Path) {
    std::fs::remove_dir_all(dir.join("index")).unwrap();
}

#[test]
fn bit_flip_in_a_sealed_segment_is_never_served() {
    let (base, s, events) = multi_segment_dir(3);
    let (seg_name, frame, seq) = {
        let (p, f, q) = event_frame_in(base.path(), 0, &events);
        (p.file_name().unwrap().to_owned(), f, q)
    };
    // Flip one bit of the payload (the last byte of the body).
    let at = frame.end() - 1;

    // With the index intact, sealed segments below its applied LSN are not re-scanned at
    // open: open succeeds, and the damage is found when the event is read.
    let dir = tmp();
    copy_dir(base.path(), dir.path());
    let path = dir.path().join(&seg_name);
    xor_byte(&path, at, 0x10);
    let e = open_always(dir.path());
    let kind = corruption(e.read(SESSION, s, seq - 1, 10), &path, frame.offset);
    assert!(matches!(kind, CorruptionKind::Crc { .. }), "{kind:?}");
    let kind = corruption(e.read(SESSION, s, 0, 10_000), &path, frame.offset);
    assert!(matches!(kind, CorruptionKind::Crc { .. }), "{kind:?}");
    // Events after the damaged one are still served.
    let rest = e.read(SESSION, s, seq, 10_000).unwrap();
    assert_eq!(rest.events, events[seq as usize..].to_vec());
    // A retry of the damaged batch must not be matched against damaged bytes.
    let retry = e.append(Append {
        session: SESSION.into(),
        stream: s,
        expected_next_seq: Some(seq),
        events: vec![event(s, seq)],
    });
    assert!(matches!(retry, Err(Error::Corruption { .. })), "{retry:?}");
    e.close().unwrap();
    drop(e);

    let v = verify_dir(dir.path()).unwrap();
    assert!(!v.ok(), "{v}");
    let bad = v.segments.iter().find(|r| r.path == path).unwrap();
    let msg = bad.error.clone().expect("the damaged segment is reported");
    assert!(
        msg.contains(&seg_name.to_string_lossy().to_string()),
        "{msg}"
    );
    assert!(msg.contains(&format!("offset {}", frame.offset)), "{msg}");

    // Without the index, open replays the sealed segment and refuses, naming file and frame.
    remove_index(dir.path());
    let kind = corruption(
        Engine::open(config(dir.path(), SyncPolicy::Always, SMALL_SEGMENT)),
        &path,
        frame.offset,
    );
    assert!(matches!(kind, CorruptionKind::Crc { .. }), "{kind:?}");
}

#[test]
fn bit_flip_in_a_sealed_segment_above_a_stale_index_refuses_open() {
    // An index from before the damaged segment was written: open must replay that segment
    // and meet the damage.
    let dir = tmp();
    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    let (_, s) = new_stream(&e, SESSION, None);
    append_range(&e, SESSION, s, 1, 1);
    e.close().unwrap();
    drop(e);
    let old_index = tmp();
    copy_dir(&dir.path().join("index"), old_index.path());
    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    let mut q = 1;
    while segment_files(dir.path()).len() < 3 {
        q += 1;
        append_range(&e, SESSION, s, q, q);
    }
    e.close().unwrap();
    drop(e);
    let path = segment_files(dir.path())[1].clone();
    let f = frames(&path)[2];
    xor_byte(&path, f.offset + FRAME_HEADER_BYTES, 0x01);
    remove_index(dir.path());
    copy_dir(old_index.path(), &dir.path().join("index"));
    let kind = corruption(
        Engine::open(config(dir.path(), SyncPolicy::Always, SMALL_SEGMENT)),
        &path,
        f.offset,
    );
    assert!(matches!(kind, CorruptionKind::Crc { .. }), "{kind:?}");
}

/// Damage a sealed segment of a fresh copy of `base`, open without an index (so every
/// segment is scanned), and return what open said.
fn open_damaged(
    base: &Path,
    remove_idx: bool,
    damage: impl FnOnce(&Path),
) -> (TempDir, Result<Engine, Error>) {
    let dir = tmp();
    copy_dir(base, dir.path());
    damage(dir.path());
    if remove_idx {
        remove_index(dir.path());
    }
    let r = Engine::open(config(dir.path(), SyncPolicy::Always, SMALL_SEGMENT));
    (dir, r)
}

#[test]
fn corruption_kind_crc() {
    let (base, _, _) = multi_segment_dir(3);
    let mut offset = 0;
    let mut path = PathBuf::new();
    let (_dir, r) = open_damaged(base.path(), true, |d| {
        path = segment_files(d)[1].clone();
        let f = frames(&path)[1];
        offset = f.offset;
        xor_byte(&path, f.offset + 8, 0x04); // the LSN field (covered by the CRC)
    });
    let kind = corruption(r, &path, offset);
    assert!(
        matches!(kind, CorruptionKind::Crc { got, expected } if got != expected),
        "{kind:?}"
    );
}

#[test]
fn corruption_kind_bad_length() {
    let (base, _, _) = multi_segment_dir(3);
    let mut offset = 0;
    let mut path = PathBuf::new();
    let (_dir, r) = open_damaged(base.path(), true, |d| {
        path = segment_files(d)[0].clone();
        let f = frames(&path)[3];
        offset = f.offset;
        write_at(&path, f.offset, &u32::MAX.to_le_bytes());
    });
    assert_eq!(
        corruption(r, &path, offset),
        CorruptionKind::BadLength(u64::from(u32::MAX))
    );
}

#[test]
fn corruption_kind_bad_magic_in_sealed_and_active_segments() {
    let (base, _, _) = multi_segment_dir(3);
    for which in [0, 1, 2] {
        for keep_index in [true, false] {
            let mut path = PathBuf::new();
            let (_dir, r) = open_damaged(base.path(), !keep_index, |d| {
                path = segment_files(d)[which].clone();
                xor_byte(&path, 0, 0x80);
            });
            assert_eq!(
                corruption(r, &path, 0),
                CorruptionKind::BadMagic,
                "segment {which}, index kept: {keep_index}"
            );
        }
    }
    let dir = tmp();
    copy_dir(base.path(), dir.path());
    let path = segment_files(dir.path())[1].clone();
    xor_byte(&path, 3, 0x01);
    let v = verify_dir(dir.path()).unwrap();
    assert!(!v.ok());
    let bad = v.segments.iter().find(|s| s.path == path).unwrap();
    assert!(bad.error.as_deref().unwrap().contains("bad magic"), "{v}");
}

#[test]
fn corruption_kind_unknown_version() {
    let (base, _, _) = multi_segment_dir(3);
    for which in [0, 2] {
        let mut path = PathBuf::new();
        let (_dir, r) = open_damaged(base.path(), false, |d| {
            path = segment_files(d)[which].clone();
            write_at(&path, 8, &9u32.to_le_bytes());
        });
        assert_eq!(
            corruption(r, &path, 0),
            CorruptionKind::UnknownVersion(9),
            "segment {which}"
        );
    }
}

#[test]
fn corruption_kind_lsn_gap_from_a_frame_cut_out_of_a_sealed_segment() {
    let (base, _, _) = multi_segment_dir(3);
    let mut path = PathBuf::new();
    let mut removed = RawFrame {
        offset: 0,
        len: 0,
        lsn: 0,
        synced_through: 0,
        entry: 0,
        term: 0,
        group_left: 0,
        record_type: 0,
    };
    let (_dir, r) = open_damaged(base.path(), true, |d| {
        path = segment_files(d)[1].clone();
        let fs = frames(&path);
        removed = fs[2];
        assert_eq!(removed.group_left, 0, "test setup: one-record groups");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.drain(removed.offset as usize..removed.end() as usize);
        std::fs::write(&path, bytes).unwrap();
    });
    assert_eq!(
        corruption(r, &path, removed.offset),
        CorruptionKind::LsnGap {
            expected: removed.lsn,
            got: removed.lsn + 1
        }
    );
}

#[test]
fn corruption_kind_lsn_gap_from_a_renamed_last_segment() {
    let (base, _, _) = multi_segment_dir(3);
    let dir = tmp();
    copy_dir(base.path(), dir.path());
    let last = last_segment(dir.path());
    let name = last.file_name().unwrap().to_str().unwrap();
    let base_lsn: u64 = name.trim_end_matches(".seg").parse().unwrap();
    let renamed = dir.path().join(format!("{:020}.seg", base_lsn + 1));
    std::fs::rename(&last, &renamed).unwrap();
    let r = Engine::open(config(dir.path(), SyncPolicy::Always, SMALL_SEGMENT));
    assert_eq!(
        corruption(r, &renamed, 0),
        CorruptionKind::LsnGap {
            expected: base_lsn + 1,
            got: base_lsn
        }
    );
}

#[test]
fn corruption_kind_lsn_gap_from_a_missing_middle_segment() {
    let (base, _, _) = multi_segment_dir(4);
    let segs = segment_files(base.path());
    let missing_name = segs[1].file_name().unwrap().to_owned();
    let prev = segs[0].clone();
    let prev_frames = frames(&prev);
    let prev_end = prev_frames.last().unwrap().end();
    let next_base: u64 = segs[2]
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .trim_end_matches(".seg")
        .parse()
        .unwrap();

    // Without an index, replay meets the gap at the end of segment 0 and names it.
    let (copy, r) = open_damaged(base.path(), true, |d| {
        std::fs::remove_file(d.join(&missing_name)).unwrap();
    });
    let prev_in_copy = copy.path().join(prev.file_name().unwrap());
    assert_eq!(
        corruption(r, &prev_in_copy, prev_end),
        CorruptionKind::LsnGap {
            expected: prev_frames.last().unwrap().lsn + 1,
            got: next_base
        }
    );
    let v = verify_dir(copy.path()).unwrap();
    assert!(!v.ok(), "{v}");
}

/// Regression (found by this file, fixed in dc9f996): with the index intact, a sealed segment
/// file that disappeared (operator error, bad restore) was not noticed at open, and reading
/// its events answered `Error::Evicted` ("retention removed it"), which is false: nothing
/// trimmed the stream, its watermark is 1. Lost acknowledged data must be reported as such.
#[test]
fn a_missing_middle_segment_is_never_reported_as_evicted() {
    let (base, s, events) = multi_segment_dir(4);
    let segs = segment_files(base.path());
    let count_events = |p: &Path| {
        frames(p)
            .iter()
            .filter(|f| f.record_type == tag::EVENT)
            .count() as u64
    };
    // One event per frame, in seq order: segment 1 holds seqs first..=last.
    let first = count_events(&segs[0]) + 1;
    let last = first + count_events(&segs[1]) - 1;
    let dir = tmp();
    copy_dir(base.path(), dir.path());
    let missing = dir.path().join(segs[1].file_name().unwrap());
    std::fs::remove_file(&missing).unwrap();
    // The index is current, so open does not scan sealed segments: it opens, and the loss
    // shows when the events are read.
    let e = Engine::open(config(dir.path(), SyncPolicy::Always, SMALL_SEGMENT)).unwrap();
    assert_eq!(stream_meta(&e, s).watermark, 1, "nothing was trimmed");
    assert_eq!(
        e.read(SESSION, s, 0, (first - 1) as u32).unwrap().events,
        events[..(first - 1) as usize].to_vec()
    );
    for seq in first..=last {
        assert_eq!(
            corruption(e.read(SESSION, s, seq - 1, 10), &missing, 0),
            CorruptionKind::MissingSegment,
            "seq {seq}"
        );
    }
    assert_eq!(
        e.read(SESSION, s, last, 10_000).unwrap().events,
        events[last as usize..].to_vec(),
        "events after the lost segment are still served"
    );
    e.close().unwrap();
}

/// Re-tags frame `index` of the first (sealed) segment as `record_type`, with a valid CRC,
/// and opens: the corruption's kind, after checking it names that file and frame.
fn open_with_retagged_frame(record_type: u8) -> CorruptionKind {
    let (base, _, _) = multi_segment_dir(3);
    let mut path = PathBuf::new();
    let mut offset = 0;
    let (_dir, r) = open_damaged(base.path(), true, |d| {
        path = segment_files(d)[0].clone();
        let f = frames(&path)[2];
        offset = f.offset;
        let mut bytes = std::fs::read(&path).unwrap();
        let at = f.offset as usize;
        bytes[at + 44] = record_type;
        let mut h = crc32fast::Hasher::new();
        h.update(&bytes[at + 8..f.end() as usize]);
        bytes[at + 4..at + 8].copy_from_slice(&h.finalize().to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
    });
    corruption(r, &path, offset)
}

#[test]
fn corruption_kind_bad_body_with_a_valid_crc() {
    // Blank (14): a known type, whose body must be empty.
    let kind = open_with_retagged_frame(14);
    assert!(matches!(kind, CorruptionKind::BadBody(_)), "{kind:?}");
}

/// A type no build knows yet (a newer build's record, to this one): see also
/// `unknown_record.rs`.
#[test]
fn corruption_kind_unknown_record_type_with_a_valid_crc() {
    assert_eq!(
        open_with_retagged_frame(200),
        CorruptionKind::UnknownRecordType(200)
    );
}

#[test]
fn damage_in_the_middle_of_the_active_segment_refuses_open() {
    let dir = tmp();
    let e = open_always(dir.path());
    let (_, s) = new_stream(&e, SESSION, None);
    for q in 1..=6 {
        append_range(&e, SESSION, s, q, q);
    }
    e.close().unwrap();
    drop(e);
    let seg = last_segment(dir.path());
    let fs = frames(&seg);
    let len = file_len(&seg);
    // Every frame but the last: a flip in the header's CRC-covered part, in the body, and
    // in the length field.
    for (i, f) in fs[..fs.len() - 1].iter().enumerate() {
        for (at, mask) in [(f.offset + 10, 0x01), (f.end() - 1, 0x80), (f.offset, 0x02)] {
            for keep_index in [true, false] {
                let d = tmp();
                copy_dir(dir.path(), d.path());
                let p = last_segment(d.path());
                xor_byte(&p, at, mask);
                if !keep_index {
                    remove_index(d.path());
                }
                let r = Engine::open(config(d.path(), SyncPolicy::Always, SMALL_SEGMENT));
                assert_eq!(
                    corruption(r, &p, f.offset),
                    CorruptionKind::DamageBeforeValidRecords,
                    "frame {i}, byte {at}"
                );
                assert_eq!(file_len(&p), len, "nothing truncated on refusal");
                let v = verify_dir(d.path()).unwrap();
                assert!(!v.ok(), "{v}");
            }
        }
    }
}

/// Regression (found by this file, fixed in dc9f996): `verify_dir` blamed the healthy segment
/// after a damaged one. After a CRC failure it took the damaged segment's partial end as the
/// next expected base, and after a bad header it kept the base from before; either way the
/// next, intact segment was reported CORRUPT with an "lsn gap", pointing at the wrong file.
#[test]
fn verify_names_only_the_damaged_segment() {
    let (base, _, _) = multi_segment_dir(4);
    type Damage = (&'static str, fn(&Path));
    let damages: [Damage; 3] = [
        ("crc in segment 0", |d| {
            let p = segment_files(d)[0].clone();
            let f = frames(&p)[3];
            xor_byte(&p, f.end() - 1, 0x01);
        }),
        ("bad magic in segment 1", |d| {
            xor_byte(&segment_files(d)[1], 0, 0x80)
        }),
        ("unknown version in segment 2", |d| {
            write_at(&segment_files(d)[2], 8, &7u32.to_le_bytes())
        }),
    ];
    for (what, damage) in damages {
        let dir = tmp();
        copy_dir(base.path(), dir.path());
        damage(dir.path());
        let v = verify_dir(dir.path()).unwrap();
        let bad: Vec<_> = v.segments.iter().filter(|s| s.error.is_some()).collect();
        assert_eq!(bad.len(), 1, "{what}: exactly one segment is damaged:\n{v}");
    }
}

/// Regression (found by this file, fixed in dc9f996): a crash can tear a multi-record group
/// exactly at a frame boundary inside it (the group's one write may be split at any byte).
/// The complete leading frames of the torn group were then CRC-valid frames *after* the
/// damage offset (the group start), so recovery called the tail `DamageBeforeValidRecords`
/// and refused to open an ordinary torn tail.
#[test]
fn a_tear_at_a_frame_boundary_inside_a_group_is_a_torn_tail() {
    for expire in [false, true] {
        let case = torn_case(
            |e| {
                new_stream(e, SESSION, None);
                new_stream(e, SESSION, None);
            },
            |e| {
                if expire {
                    e.expire_session(SESSION).unwrap();
                } else {
                    e.advance_epoch(SESSION).unwrap();
                }
            },
        );
        let seg = last_segment(&case.full);
        let group_start = file_len(&last_segment(&case.reference));
        let group: Vec<RawFrame> = frames(&seg)
            .into_iter()
            .filter(|f| f.offset >= group_start)
            .collect();
        assert_eq!(group.len(), 3, "test setup");
        for f in &group[..2] {
            let cut = f.end();
            let dir = tmp();
            copy_dir(&case.full, dir.path());
            let torn = last_segment(dir.path());
            truncate(&torn, cut);
            let v = verify_dir(dir.path()).unwrap();
            let e = Engine::open(config(dir.path(), SyncPolicy::Always, SMALL_SEGMENT));
            let e = match e {
                Ok(e) => e,
                Err(err) => panic!(
                    "expire: {expire}, cut at {cut} (end of frame lsn {}, group {group_start}..): \
                     open refused a torn tail: {err}\nverify: {v}",
                    f.lsn
                ),
            };
            assert!(v.ok(), "{v}");
            assert_eq!(e.recovery_report().bytes_truncated, cut - group_start);
            assert_eq!(e.open_session(SESSION).unwrap().epoch, 1);
            e.close().unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Index rebuild
// ---------------------------------------------------------------------------------------------

/// What a reader can observe, for comparing engines over different index histories.
fn observe(e: &Engine) -> Vec<String> {
    let mut out = Vec::new();
    let sessions: Vec<String> = e.sessions().unwrap().into_iter().map(|s| s.id).collect();
    for st in e.streams().unwrap() {
        for session in sessions.iter().chain([&"never-opened".to_string()]) {
            for epoch in [st.epoch.saturating_sub(1), st.epoch, st.epoch + 1] {
                for seq in [
                    0,
                    st.watermark.saturating_sub(1),
                    st.watermark,
                    st.head,
                    st.head + 1,
                ] {
                    for declared in [None, Some(st.id), Some(st.id + 1)] {
                        let c = format!("{epoch}-{}-{seq}", st.id);
                        out.push(format!(
                            "{session} {c} {declared:?} {:?}",
                            e.resolve(session, &c, declared)
                        ));
                    }
                }
            }
        }
        out.push(format!("{st:?}"));
        out.push(format!("{:?}", e.read(&st.session, st.id, 0, 10_000)));
        out.push(format!(
            "{:?}",
            e.read(&st.session, st.id, st.watermark.saturating_sub(1), 10_000)
        ));
        if let Some(c) = &st.correlation {
            out.push(format!("{:?}", e.outcome(&st.session, c)));
        }
    }
    out.push(format!("{:?}", e.sessions()));
    out
}

/// A varied workload in phases, on small segments so it spans several; phase 2 retires
/// fully trimmed segments.
fn workload(e: &Engine, phase: u32) {
    let ev = |tag: &str| NewEvent {
        kind: tag.into(),
        correlation: Some(format!("c-{tag}")),
        payload: tag.as_bytes().repeat(7),
    };
    match phase {
        0 => {
            // A bulky stream that will be trimmed away entirely, filling the first segments.
            let (_, bulk) = new_stream(e, "bulk", Some("bulk-req"));
            for q in 1..=60 {
                append_range(e, "bulk", bulk, q, q);
            }
            e.complete("bulk", bulk, None, ev("bulk-done")).unwrap();
            e.trim("bulk", bulk, 61).unwrap();
            let (_, a) = new_stream(e, "alpha", Some("a-1"));
            append_range(e, "alpha", a, 1, 5);
            // A retry of the last batch: same events, nothing written.
            let d = append_range(e, "alpha", a, 5, 5);
            assert!(d.duplicate);
            let (_, b) = new_stream(e, "alpha", None);
            append_range(e, "alpha", b, 1, 2);
            e.complete("alpha", a, Some(6), ev("result-a")).unwrap();
            let adv = e.advance_epoch("alpha").unwrap();
            assert_eq!(adv.superseded, vec![b]);
        }
        1 => {
            assert!(
                e.run_retention().unwrap() >= 1,
                "the trimmed prefix is retired"
            );
            let info = e.open_session("alpha").unwrap();
            let c = e
                .open_stream(OpenStream {
                    session: "alpha".into(),
                    epoch: info.epoch,
                    correlation: Some("a-2".into()),
                    lease_ms: None,
                })
                .unwrap()
                .stream;
            append_range(e, "alpha", c, 1, 10);
            e.trim("alpha", c, 4).unwrap();
            e.abort("alpha", c, "tool crashed", Some(ev("error-c")))
                .unwrap();
            let (_, d) = new_stream(e, "beta", Some("b-1"));
            append_range(e, "beta", d, 1, 3);
            e.abort("beta", d, "gave up", None).unwrap();
            let (_, f) = new_stream(e, "beta", None);
            append_range(e, "beta", f, 1, 2);
            e.expire_session("beta").unwrap();
        }
        _ => {
            let (_, g) = new_stream(e, "gamma", Some("g-1"));
            for q in 1..=30 {
                append_range(e, "gamma", g, q, q);
            }
            e.trim("gamma", g, 12).unwrap();
            let (_, h) = new_stream(e, "gamma", None);
            append_range(e, "gamma", h, 1, 1);
            e.advance_epoch("gamma").unwrap();
            e.advance_epoch("gamma").unwrap();
        }
    }
}

/// An index's entries as `Engine::index_dump` lists them.
type IndexDump = Vec<(Vec<u8>, Vec<u8>)>;

/// Runs every workload phase on a fresh engine in `dir` and closes it; returns the live
/// index's dump and what a client observed.
fn run_workload_and_close(dir: &Path) -> (IndexDump, Vec<String>) {
    let e = open(dir, SyncPolicy::Never, SMALL_SEGMENT);
    for phase in 0..3 {
        workload(&e, phase);
    }
    let dump = e.index_dump().unwrap();
    let view = observe(&e);
    e.close().unwrap();
    (dump, view)
}

#[test]
fn deleting_the_index_rebuilds_an_identical_one() {
    let dir = tmp();
    let (live_dump, live_view) = run_workload_and_close(dir.path());
    assert!(segment_files(dir.path()).len() >= 3);
    assert_ne!(
        segment_files(dir.path())[0].file_name().unwrap(),
        "00000000000000000001.seg",
        "test setup: retention retired the first segments"
    );

    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    assert!(!e.recovery_report().index_rebuilt);
    assert_eq!(
        e.index_dump().unwrap(),
        live_dump,
        "reopen with the index kept"
    );
    e.close().unwrap();
    drop(e);

    remove_index(dir.path());
    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    assert!(e.recovery_report().index_rebuilt);
    assert!(e.recovery_report().records_replayed > 0);
    let rebuilt = e.index_dump().unwrap();
    assert_eq!(
        rebuilt.len(),
        live_dump.len(),
        "same number of index entries"
    );
    for (a, b) in rebuilt.iter().zip(&live_dump) {
        assert_eq!(a, b, "first differing index entry");
    }
    assert_eq!(
        observe(&e),
        live_view,
        "verdicts, reads and outcomes are the same"
    );
    e.close().unwrap();
}

/// Opens the index's sled database directly, once a closed engine's sled has let go of its
/// lock. Nothing signals that moment: sled's I/O pool threads outlive the dropped database
/// for a while, and a child process forked meanwhile by another test holds a copy of the
/// locked file until it execs. So this polls the one observable condition, "the lock can be
/// taken" (only lock errors are retried), up to a deadline.
fn open_index_db(dir: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::open(dir.join("index")) {
            Ok(db) => return db,
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10)); // poll interval
            }
            Err(e) => panic!("opening the index: {e}"),
        }
    }
}

/// Every key and value of the index tree as sled holds it (the run-start chunks included).
fn raw_index(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let db = open_index_db(dir);
    let tree = db.open_tree("cursorlog").unwrap();
    tree.iter()
        .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
        .filter(|(k, _)| k.as_slice() != b"Mapplied_lsn")
        .collect()
}

/// An index written by key schema 1 (one `E` key per run start, `Mindex_version` 1) is
/// detected at open and rebuilt from the log into the current schema, byte for byte the
/// index the live engine kept.
#[test]
fn an_index_of_an_older_schema_version_is_rebuilt_from_the_log() {
    let dir = tmp();
    let (live_dump, live_view) = run_workload_and_close(dir.path());
    let live_raw = raw_index(dir.path());

    // Rewrite it the way version 1 stored it: run starts as their own keys (the layout
    // `index_dump` shows them in), version 1.
    {
        let db = open_index_db(dir.path());
        let tree = db.open_tree("cursorlog").unwrap();
        let chunks: Vec<_> = tree.scan_prefix(b"E").keys().map(Result::unwrap).collect();
        assert!(
            !chunks.is_empty(),
            "test setup: the workload has run starts"
        );
        for k in chunks {
            tree.remove(k).unwrap();
        }
        let runs: Vec<_> = live_dump.iter().filter(|(k, _)| k[0] == b'E').collect();
        assert!(runs.len() > 1);
        for (k, v) in runs {
            tree.insert(k.as_slice(), v.as_slice()).unwrap();
        }
        tree.insert(b"Mindex_version", &1u32.to_le_bytes()).unwrap();
        db.flush().unwrap();
    }

    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    let report = e.recovery_report().clone();
    assert!(report.index_rebuilt, "{report}");
    assert!(report.records_replayed > 0, "{report}");
    assert_eq!(e.index_dump().unwrap(), live_dump);
    assert_eq!(observe(&e), live_view);
    e.close().unwrap();
    drop(e);
    assert_eq!(raw_index(dir.path()), live_raw, "the rebuilt sled tree");

    // The rebuilt index is kept by the next open.
    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    assert!(!e.recovery_report().index_rebuilt);
    assert_eq!(e.index_dump().unwrap(), live_dump);
    e.close().unwrap();
}

#[test]
fn an_index_older_than_the_log_catches_up_to_a_full_rebuild() {
    let dir = tmp();
    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    workload(&e, 0);
    workload(&e, 1);
    e.close().unwrap();
    drop(e);
    let old_index = tmp();
    copy_dir(&dir.path().join("index"), old_index.path());
    let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    workload(&e, 2);
    let live_dump = e.index_dump().unwrap();
    let live_view = observe(&e);
    e.close().unwrap();
    drop(e);

    let stale = tmp();
    copy_segments(dir.path(), stale.path());
    copy_dir(old_index.path(), &stale.path().join("index"));
    let full = tmp();
    copy_segments(dir.path(), full.path());

    let a = open(stale.path(), SyncPolicy::Never, SMALL_SEGMENT);
    let b = open(full.path(), SyncPolicy::Never, SMALL_SEGMENT);
    let (ra, rb) = (a.recovery_report().clone(), b.recovery_report().clone());
    assert!(
        !ra.index_rebuilt,
        "a stale index is caught up, not rebuilt: {ra}"
    );
    assert!(rb.index_rebuilt, "{rb}");
    assert!(
        ra.records_replayed > 0 && ra.records_replayed < rb.records_replayed,
        "{ra} / {rb}"
    );
    assert_eq!(a.index_dump().unwrap(), b.index_dump().unwrap());
    assert_eq!(a.index_dump().unwrap(), live_dump);
    assert_eq!(observe(&a), live_view);
    assert_eq!(observe(&b), live_view);
}

/// State forgotten past the metadata horizon when its segments are retired leaves no
/// record in the log; records of that stream still in retained segments (here its terminal
/// frame and trim, in the active segment) must not bring index entries back on a rebuild.
#[test]
fn a_rebuild_after_retention_forgot_a_stream_is_identical() {
    let dir = tmp();
    let mut cfg = config(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
    cfg.retention.metadata_horizon = std::time::Duration::from_millis(1);
    let clock = std::sync::Arc::new(cursorlog_engine::ManualClock::new(1_800_000_000_000));
    cfg.clock = std::sync::Arc::clone(&clock) as _;
    let e = Engine::open(cfg.clone()).unwrap();
    let (_, a) = new_stream(&e, SESSION, Some("req-a"));
    append_range(&e, SESSION, a, 1, 3);
    let (_, b) = new_stream(&e, SESSION, None);
    let mut q = 0;
    while segment_files(dir.path()).len() < 3 {
        q += 1;
        append_range(&e, SESSION, b, q, q);
    }
    e.complete(SESSION, a, Some(4), NewEvent::new("result", b"ok".to_vec()))
        .unwrap();
    e.trim(SESSION, a, 4).unwrap();
    e.trim(SESSION, b, q).unwrap();
    clock.advance(std::time::Duration::from_millis(2)); // past the horizon
    assert!(
        e.run_retention().unwrap() >= 2,
        "the trimmed segments are retired"
    );
    assert!(
        e.streams().unwrap().iter().all(|s| s.id != a),
        "test setup: stream {a} is forgotten (past the horizon)"
    );
    let live = e.index_dump().unwrap();
    e.close().unwrap();
    drop(e);

    remove_index(dir.path());
    let e = Engine::open(cfg).unwrap();
    assert!(e.recovery_report().index_rebuilt);
    let rebuilt = e.index_dump().unwrap();
    let extra: Vec<String> = rebuilt
        .iter()
        .filter(|kv| !live.contains(kv))
        .map(|(k, _)| format!("{:?}", String::from_utf8_lossy(k)))
        .collect();
    let missing: Vec<String> = live
        .iter()
        .filter(|kv| !rebuilt.contains(kv))
        .map(|(k, _)| format!("{:?}", String::from_utf8_lossy(k)))
        .collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "rebuilt index differs: extra keys {extra:?}, missing keys {missing:?}"
    );
    e.close().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Lock and identity across reopens
// ---------------------------------------------------------------------------------------------

#[test]
fn a_second_open_of_the_same_directory_is_locked() {
    let dir = tmp();
    let first = open_always(dir.path());
    match Engine::open(config(dir.path(), SyncPolicy::Always, SMALL_SEGMENT)) {
        Err(Error::Locked { dir: d }) => assert_eq!(d, dir.path()),
        other => panic!("expected Locked, got {other:?}"),
    }
    // The refused open changed nothing: the first engine still works.
    new_stream(&first, SESSION, None);
    first.close().unwrap();
    drop(first);
    // Released on close+drop, and on a plain drop.
    let second = open_always(dir.path());
    drop(second);
    let third = open_always(dir.path());
    third.close().unwrap();
}

#[test]
fn reopening_many_times_keeps_lsns_and_stream_ids_monotone_and_unique() {
    let dir = tmp();
    let mut ids: Vec<(String, u64, u64)> = Vec::new();
    let mut last_lsn = 0;
    for round in 0..12u64 {
        let e = open(dir.path(), SyncPolicy::Never, SMALL_SEGMENT);
        assert_eq!(e.recovery_report().last_lsn, last_lsn, "round {round}");
        // Everything from earlier rounds is still there.
        for (session, stream, head) in &ids {
            assert_eq!(
                e.read(session, *stream, 0, 1000).unwrap().events.len() as u64,
                *head
            );
        }
        for k in 0..3 {
            let session = format!("s{}", (round + k) % 4);
            let (_, s) = new_stream(&e, &session, None);
            let head = 1 + (round + k) % 5;
            append_range(&e, &session, s, 1, head);
            if let Some((_, prev, _)) = ids.last() {
                assert!(s > *prev, "round {round}: stream id {s} after {prev}");
            }
            ids.push((session, s, head));
        }
        let stats = e.stats().unwrap();
        assert!(stats.last_lsn > last_lsn, "round {round}");
        // Closing (or dropping the last handle) writes no record: the clean-close mark is a
        // file beside the log and takes no LSN.
        last_lsn = stats.last_lsn;
        match round % 3 {
            0 => e.close().unwrap(),
            1 => drop(e),
            _ => {
                // Torn garbage at the tail, as a crash mid-write would leave it.
                drop(e);
                append_bytes(&last_segment(dir.path()), &[0xAB; 37]);
            }
        }
    }
    let unique: BTreeSet<u64> = ids.iter().map(|(_, s, _)| *s).collect();
    assert_eq!(unique.len(), ids.len(), "stream ids are never reused");
}

/// Replaces `image` with the current segment files of `dir` when the engine has synced since
/// the last call: `image` is then the state a power cut would leave.
fn track_durable(e: &Engine, dir: &Path, fsyncs_seen: &mut u64, image: &mut TempDir) {
    let fsyncs = e.stats().unwrap().fsyncs;
    if fsyncs != *fsyncs_seen {
        *fsyncs_seen = fsyncs;
        *image = tmp();
        copy_segments(dir, image.path());
    }
}

/// DESIGN.md: stream ids are "globally unique and never reused", and a cursor the log lost
/// with non-durable sync gets an explicit verdict, never a replay of another stream. A power
/// cut under `SyncPolicy::Never` is modelled by reopening the segments as they were at the
/// engine's last fdatasync (tracked through `stats().fsyncs`).
///
/// Regression (found by this file, fixed in dc9f996): stream ids are LSNs, and an unsynced
/// `OpenStream`/`AdvanceEpoch` lost to a power cut let the next stream reuse the id (and the
/// next advance reuse the epoch), so the lost stream's cursor resolved RESUMABLE into a
/// different stream: seed 000's failure. Identity allocations are now synced under every
/// policy.
#[test]
fn ids_and_epochs_are_not_reissued_after_losing_unsynced_records() {
    let dir = tmp();
    let e = open(dir.path(), SyncPolicy::Never, 64 * 1024 * 1024);
    let mut seen = 0;
    let mut image = tmp();
    e.open_session(SESSION).unwrap();
    e.sync().unwrap();
    track_durable(&e, dir.path(), &mut seen, &mut image);
    let (epoch, lost) = new_stream(&e, SESSION, None);
    track_durable(&e, dir.path(), &mut seen, &mut image);
    append_range(&e, SESSION, lost, 1, 3);
    track_durable(&e, dir.path(), &mut seen, &mut image);
    let lost_cursor = format!("{epoch}-{lost}-2");
    let lost_epoch = e.advance_epoch(SESSION).unwrap().epoch;
    track_durable(&e, dir.path(), &mut seen, &mut image);
    let (_, lost_too) = new_stream(&e, SESSION, None);
    track_durable(&e, dir.path(), &mut seen, &mut image);
    append_range(&e, SESSION, lost_too, 1, 2);
    drop(e);

    // Power cut: only what was synced survives.
    let e = open(image.path(), SyncPolicy::Never, 64 * 1024 * 1024);
    let r = e.resolve(SESSION, &lost_cursor, None).unwrap();
    assert_ne!(r.verdict, Verdict::Resumable, "{r:?}");
    let epoch_now = e.advance_epoch(SESSION).unwrap().epoch;
    assert!(
        epoch_now > lost_epoch,
        "epoch {epoch_now} reissued (it was already given out before the power cut)"
    );
    let (_, fresh) = new_stream(&e, SESSION, None);
    append_range(&e, SESSION, fresh, 1, 3);
    assert!(
        fresh != lost && fresh != lost_too,
        "stream id {fresh} reused after losing unsynced records"
    );
    for (id, seq) in [(lost, 2), (lost_too, 1)] {
        for ep in [epoch, lost_epoch, epoch_now] {
            let c = format!("{ep}-{id}-{seq}");
            let r = e.resolve(SESSION, &c, None).unwrap();
            assert_ne!(
                r.verdict,
                Verdict::Resumable,
                "a cursor {c} of a stream given out before the power cut must not resume \
                 the new stream {fresh}: {r:?}"
            );
        }
    }
}
