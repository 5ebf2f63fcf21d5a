//! Format version 3's log entries (FORMAT.md, "Entries and terms"): every atomic group is
//! one entry, numbered consecutively across segments and restarts, each frame carrying its
//! entry and term; the clean-close mark is a file and takes no LSN; a frame or a segment
//! header that breaks the numbering is corruption naming the file and offset.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use cursorlog_engine::{Append, CorruptionKind, Engine, Error, SyncPolicy};

const SESSION: &str = "s";

/// A log of several segments written over several runs (closed cleanly, dropped, closed
/// under another sync policy), with multi-record groups among single-record ones.
fn written_over_runs(dir: &Path) -> u64 {
    let mut last_lsn = 0;
    for (run, sync) in [
        SyncPolicy::Always,
        SyncPolicy::Always,
        SyncPolicy::Never,
        SyncPolicy::Always,
    ]
    .into_iter()
    .enumerate()
    {
        let e = open(dir, sync, SMALL_SEGMENT);
        assert_eq!(
            e.recovery_report().last_lsn,
            last_lsn,
            "run {run}: a close adds no record"
        );
        let (_, s) = new_stream(&e, SESSION, None);
        for q in 0..12u64 {
            // Batches of 1..=4 events: groups of as many records.
            let n = 1 + q % 4;
            let head = e.read(SESSION, s, u64::MAX - 1, 1).map_or(0, |b| b.head);
            e.append(Append {
                session: SESSION.into(),
                stream: s,
                expected_next_seq: Some(head + 1),
                events: (head + 1..=head + n).map(|seq| event(s, seq)).collect(),
            })
            .unwrap();
        }
        last_lsn = e.stats().unwrap().last_lsn;
        if run % 2 == 0 {
            e.close().unwrap();
        } else {
            drop(e);
        }
    }
    last_lsn
}

fn header_u64(path: &Path, at: usize) -> u64 {
    let b = std::fs::read(path).unwrap();
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn every_group_is_one_entry_numbered_across_segments_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    written_over_runs(dir.path());
    let segments = segment_files(dir.path());
    assert!(segments.len() >= 4, "test setup: several segments");
    let mut last_entry = 0u64;
    let mut last_term = 0u64;
    let mut groups = 0;
    for path in &segments {
        // base_entry (56..64) and prev_term (64..72) name where the segment's entries start.
        assert_eq!(header_u64(path, 56), last_entry + 1, "{}", path.display());
        assert_eq!(header_u64(path, 64), last_term, "{}", path.display());
        let mut group: Option<(u64, u64)> = None;
        for f in frames(path) {
            match group {
                None => {
                    assert_eq!(f.entry, last_entry + 1, "entries are consecutive");
                    assert!(f.term >= last_term, "terms never go down");
                    group = Some((f.entry, f.term));
                }
                Some(g) => assert_eq!((f.entry, f.term), g, "one entry and term per group"),
            }
            if f.group_left == 0 {
                (last_entry, last_term) = group.take().unwrap();
                groups += 1;
            }
        }
    }
    assert!(groups > 40, "{groups} groups");
    // The runs under another sync policy or after a reboot start a new term.
    assert!(last_term > 1, "term {last_term}");
}

#[test]
fn a_clean_close_leaves_a_mark_the_next_open_removes() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), SyncPolicy::Always, SMALL_SEGMENT);
    new_stream(&e, SESSION, None);
    let last = e.stats().unwrap().last_lsn;
    e.close().unwrap();
    drop(e);
    assert!(dir.path().join("CLEAN").is_file(), "the mark is a file");
    let e = open(dir.path(), SyncPolicy::Always, SMALL_SEGMENT);
    assert_eq!(e.recovery_report().previous_clean, Some(true));
    assert_eq!(e.recovery_report().last_lsn, last, "the mark took no LSN");
    assert!(
        !dir.path().join("CLEAN").exists(),
        "removed before any write"
    );
    drop(e);
    // Dropping the last handle closes cleanly too; a crash leaves no mark.
    let e = open(dir.path(), SyncPolicy::Always, SMALL_SEGMENT);
    assert_eq!(e.recovery_report().previous_clean, Some(true));
    e.simulate_crash();
    drop(e);
    let e = open(dir.path(), SyncPolicy::Always, SMALL_SEGMENT);
    assert_eq!(e.recovery_report().previous_clean, Some(false));
}

/// A mark that does not describe the log (it ends elsewhere) is not believed.
#[test]
fn a_mark_naming_another_end_is_not_clean() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), SyncPolicy::Always, SMALL_SEGMENT);
    new_stream(&e, SESSION, None);
    e.close().unwrap();
    drop(e);
    let mark = std::fs::read(dir.path().join("CLEAN")).unwrap();
    // Events written after the mark, as by a run whose mark was restored from a backup.
    let e = open(dir.path(), SyncPolicy::Always, SMALL_SEGMENT);
    new_stream(&e, SESSION, None);
    e.simulate_crash();
    drop(e);
    std::fs::write(dir.path().join("CLEAN"), mark).unwrap();
    let e = open(dir.path(), SyncPolicy::Always, SMALL_SEGMENT);
    assert_eq!(e.recovery_report().previous_clean, Some(false));
}

fn open_rebuilding(dir: &Path) -> Result<Engine, Error> {
    std::fs::remove_dir_all(dir.join("index")).unwrap();
    Engine::open(config(dir, SyncPolicy::Always, SMALL_SEGMENT))
}

fn corruption_at(r: Result<Engine, Error>, file: &Path, offset: u64) -> CorruptionKind {
    match r {
        Err(Error::Corruption {
            segment,
            offset: at,
            kind,
        }) => {
            assert_eq!((segment.as_path(), at), (file, offset), "{kind:?}");
            kind
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

/// A CRC-valid frame in a sealed segment that names another entry than its place.
#[test]
fn a_frame_naming_another_entry_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    written_over_runs(dir.path());
    let path = segment_files(dir.path())[1].clone();
    let f = frames(&path)[1];
    let mut bytes = std::fs::read(&path).unwrap();
    let at = f.offset as usize;
    bytes[at + 24..at + 32].copy_from_slice(&(f.entry + 5).to_le_bytes());
    let crc = crc32fast::hash(&bytes[at + 8..f.end() as usize]);
    bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let kind = corruption_at(open_rebuilding(dir.path()), &path, f.offset);
    assert!(matches!(kind, CorruptionKind::EntryGap { .. }), "{kind:?}");
}

/// A CRC-valid frame whose term is below the entry before it.
#[test]
fn a_frame_whose_term_goes_backwards_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    written_over_runs(dir.path());
    let segments = segment_files(dir.path());
    // The last segment of a later term: its frames' term is above 1.
    let path = segments.last().unwrap().clone();
    let fr = frames(&path);
    let f = fr.iter().find(|f| f.group_left == 0).copied().unwrap();
    let next = fr.iter().find(|g| g.offset == f.end()).copied().unwrap();
    assert!(next.term > 1, "test setup: a later term");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = next.offset as usize;
    bytes[at + 32..at + 40].copy_from_slice(&0u64.to_le_bytes());
    let crc = crc32fast::hash(&bytes[at + 8..next.end() as usize]);
    bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    // The tail's damage is refused, not cut: later frames claim it was synced.
    let r = open_rebuilding(dir.path());
    assert!(matches!(r, Err(Error::Corruption { .. })), "{r:?}");
}

/// A segment header (CRC-valid) whose first entry does not follow the segment before.
#[test]
fn a_segment_header_naming_another_first_entry_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    written_over_runs(dir.path());
    let segments = segment_files(dir.path());
    let (first, second) = (&segments[0], &segments[1]);
    let mut bytes = std::fs::read(second).unwrap();
    let base_entry = u64::from_le_bytes(bytes[56..64].try_into().unwrap());
    bytes[56..64].copy_from_slice(&(base_entry + 1).to_le_bytes());
    let crc = crc32fast::hash(&bytes[..76]);
    bytes[76..80].copy_from_slice(&crc.to_le_bytes());
    // Its frames must still check against the header: renumber them as the header says.
    let mut at = SEGMENT_HEADER_BYTES as usize;
    for f in frames(second) {
        let e = u64::from_le_bytes(bytes[at + 24..at + 32].try_into().unwrap());
        bytes[at + 24..at + 32].copy_from_slice(&(e + 1).to_le_bytes());
        let crc = crc32fast::hash(&bytes[at + 8..f.end() as usize]);
        bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at = f.end() as usize;
    }
    std::fs::write(second, bytes).unwrap();
    let end_of_first = file_len(first);
    let kind = corruption_at(open_rebuilding(dir.path()), first, end_of_first);
    assert_eq!(
        kind,
        CorruptionKind::EntryGap {
            expected: base_entry,
            got: base_entry + 1
        }
    );
}
