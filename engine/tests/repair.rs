//! `verify` and `repair`: a torn tail is repaired without loss; damage that would drop
//! acknowledged records is refused unless the operator accepts the loss, and then reported.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use cursorlog_engine::{
    repair_dir, verify_dir, Append, Config, CorruptionKind, Cursor, Engine, Error, NewEvent,
    OpenStream, Verdict,
};

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c
}

/// Writes `n` single-event appends; returns (epoch, stream).
fn populate(dir: &Path, n: usize) -> (u64, u64) {
    let e = Engine::open(config(dir)).unwrap();
    let s = e.open_session("s").unwrap();
    let st = e
        .open_stream(OpenStream {
            session: "s".into(),
            epoch: s.epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap();
    for i in 0..n {
        let ev = NewEvent::new("k", vec![u8::try_from(i % 200).unwrap(); 100]);
        e.append(Append {
            session: "s".into(),
            stream: st.stream,
            expected_next_seq: None,
            events: vec![ev],
        })
        .unwrap();
    }
    e.close().unwrap();
    (st.epoch, st.stream)
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

fn flip(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[usize::try_from(offset).unwrap()] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn torn_tail_is_reported_by_verify_and_repaired_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (epoch, stream) = populate(dir.path(), 10);
    let last = segments(dir.path()).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    // The log ends with the clean shutdown's marker (a 40-byte frame: header and an 8-byte
    // time); tear it off and 7 bytes of the last event before it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 40 - 7)
        .unwrap();
    let v = verify_dir(dir.path()).unwrap();
    assert!(v.ok(), "a torn tail is not corruption: {v}");
    assert!(v.segments.last().unwrap().torn_tail_bytes > 0);
    let r = repair_dir(dir.path(), false).unwrap();
    assert_eq!(r.records_dropped, 0);
    assert_eq!(r.truncated.len(), 1);
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(
        e.recovery_report().bytes_truncated,
        0,
        "repair already cut the tail"
    );
    // Event 10 had been synced and acknowledged, and the index (flushed at the clean close)
    // remembers it: cutting it by hand is lost acknowledged data, not a torn write. The
    // stream is ended at the head that survived, so seq 10 is never given to another event.
    assert_eq!(e.recovery_report().lost_records, 1);
    assert_eq!(e.recovery_report().streams_fenced, 1);
    assert_eq!(
        e.resolve("s", &Cursor::new(epoch, stream, 9).to_string(), None)
            .unwrap()
            .verdict,
        Verdict::StreamTerminated
    );
    assert_eq!(
        e.resolve("s", &Cursor::new(epoch, stream, 10).to_string(), None)
            .unwrap()
            .verdict,
        Verdict::CursorAhead
    );
}

#[test]
fn damage_before_valid_records_in_the_tail_needs_accepted_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (epoch, stream) = populate(dir.path(), 8);
    let last = segments(dir.path()).pop().unwrap();
    assert_eq!(segments(dir.path()).len(), 1);
    // Damage the third frame's body: valid frames follow it.
    let frame = 24 + 8 * 8 + 8 + 1 + 8 + 8 + 1 + 100; // rough size of one event frame
    flip(&last, 32 + 2 * frame + 30);
    match Engine::open(config(dir.path())) {
        Err(Error::Corruption {
            segment,
            kind: CorruptionKind::DamageBeforeValidRecords,
            ..
        }) => assert_eq!(segment, last),
        other => panic!("open must refuse, got {other:?}"),
    }
    assert!(!verify_dir(dir.path()).unwrap().ok());
    assert!(
        matches!(repair_dir(dir.path(), false), Err(Error::Corruption { .. })),
        "no silent loss"
    );
    let r = repair_dir(dir.path(), true).unwrap();
    assert!(r.records_dropped >= 4, "{r}");
    let e = Engine::open(config(dir.path())).unwrap();
    let read = e.read("s", stream, 0, 100).unwrap();
    assert!(
        !read.events.is_empty() && read.events.len() < 8,
        "the prefix before the damage survives"
    );
    let lost = Cursor::new(epoch, stream, 8).to_string();
    assert_eq!(
        e.resolve("s", &lost, None).unwrap().verdict,
        Verdict::CursorAhead,
        "lost events are never served"
    );
}

#[test]
fn sealed_segment_damage_is_refused_then_cut_with_later_segments() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 120);
    let segs = segments(dir.path());
    assert!(segs.len() >= 3);
    flip(&segs[1], 200);
    let v = verify_dir(dir.path()).unwrap();
    assert!(!v.ok());
    assert!(
        v.to_string()
            .contains(&segs[1].file_name().unwrap().to_string_lossy().into_owned()),
        "{v}"
    );
    assert!(
        matches!(repair_dir(dir.path(), false), Err(Error::Corruption { ref segment, .. }) if *segment == segs[1])
    );
    let r = repair_dir(dir.path(), true).unwrap();
    assert_eq!(r.deleted.len(), segs.len() - 2, "{r}");
    assert!(r.index_removed);
    assert!(verify_dir(dir.path()).unwrap().ok());
    Engine::open(config(dir.path())).unwrap();
}

/// Repair is offline: with an engine holding the directory, it refuses and changes nothing.
#[test]
fn repair_refuses_a_directory_in_use() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 10);
    let e = Engine::open(config(dir.path())).unwrap();
    let before: Vec<_> = segments(dir.path())
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    match repair_dir(dir.path(), true) {
        Err(Error::Locked { dir: locked }) => assert_eq!(locked, dir.path()),
        other => panic!("expected Locked, got {other:?}"),
    }
    let after: Vec<_> = segments(dir.path())
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(before, after, "no segment was touched");
    e.close().unwrap();
    drop(e);
    assert!(
        repair_dir(dir.path(), false).is_ok(),
        "free again once closed"
    );
}

/// A segment file missing from the middle of the log (found by the fuzzer): verify calls it
/// corrupt and open refuses it (an LSN gap). Repair must not say "nothing to repair": it
/// refuses without `--accept-loss`, and with it cuts the log at the gap so the directory
/// opens again.
#[test]
fn a_missing_segment_is_refused_then_cut_at_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let (epoch, stream) = populate(dir.path(), 120);
    let segs = segments(dir.path());
    assert!(segs.len() >= 3, "{segs:?}");
    std::fs::remove_file(&segs[1]).unwrap();
    // Without an index, open replays every segment and finds the gap.
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    assert!(!verify_dir(dir.path()).unwrap().ok());
    assert!(Engine::open(config(dir.path())).is_err());
    match repair_dir(dir.path(), false) {
        Err(Error::Corruption {
            kind: CorruptionKind::LsnGap { .. },
            ..
        }) => {}
        other => panic!("expected a refused LSN gap, got {other:?}"),
    }
    let r = repair_dir(dir.path(), true).unwrap();
    assert!(r.records_dropped > 0, "{r}");
    assert_eq!(r.deleted.len(), segs.len() - 2, "{r}");
    assert!(verify_dir(dir.path()).unwrap().ok());
    let e = Engine::open(config(dir.path())).unwrap();
    // The first segment's events are still served, and the lost ones are not resumable.
    let r = e
        .resolve("s", &Cursor::new(epoch, stream, 1).to_string(), None)
        .unwrap();
    assert_ne!(r.verdict, Verdict::UnknownSession);
}

/// A segment header that names another LSN than its file name: the same.
#[test]
fn a_header_naming_another_lsn_is_refused_then_cut() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 120);
    let segs = segments(dir.path());
    let last = segs.last().unwrap();
    let mut bytes = std::fs::read(last).unwrap();
    // base_lsn is bytes 16..24 of the header; the header CRC (bytes 76..80) covers 0..76.
    bytes[16] ^= 0x01;
    let crc = crc32fast::hash(&bytes[..76]);
    bytes[76..80].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(last, bytes).unwrap();
    assert!(Engine::open(config(dir.path())).is_err());
    assert!(repair_dir(dir.path(), false).is_err());
    let r = repair_dir(dir.path(), true).unwrap();
    assert_eq!(r.deleted, vec![last.clone()], "{r}");
    Engine::open(config(dir.path())).unwrap();
}
