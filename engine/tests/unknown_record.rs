//! Downgrades: a frame whose CRC checks but whose record type this build does not know was
//! written by a newer build (FORMAT.md, "Downgrades and unknown record types"). It is never a
//! torn write, so opening, verifying or repairing the directory refuses it with
//! `UnknownRecordType` naming the file and offset, and never cuts it, wherever it is: the
//! very end of the tail, the start of a group cut short, before valid records, and in the
//! replicated log's own files.
//!
//! Frames are forged from FORMAT.md (48-byte header, CRC-32 of bytes 8.. and the body), by
//! hand, so the engine's own framing code cannot hide a bug here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use cursorlog_engine::{
    repair_dir, verify_dir, CorruptionKind, Engine, EntryId, EntryLog, EntryLogConfig,
    EntryPayload, Error, LogEntry, SyncPolicy,
};
use tempfile::TempDir;

const SESSION: &str = "sess-1";
/// A record type no build knows yet: what a newer build's record looks like to this one.
const NEWER: u8 = 200;

/// Recomputes the CRC of a whole frame (header and body) in place.
fn seal(frame: &mut [u8]) {
    let mut h = crc32fast::Hasher::new();
    h.update(&frame[8..]);
    frame[4..8].copy_from_slice(&h.finalize().to_le_bytes());
}

/// A directory whose only segment holds a stream's events 1..=6, one group each, left as a
/// crash leaves it (no clean-close mark).
fn crashed_dir() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), SyncPolicy::Always, 64 * 1024 * 1024);
    let (_, s) = new_stream(&e, SESSION, None);
    for q in 1..=6 {
        append_range(&e, SESSION, s, q, q);
    }
    e.simulate_crash();
    drop(e);
    dir
}

/// The frame a newer build would write next after the last frame of `path`, with record type
/// [`NEWER`]: the next LSN and entry, the same term, `group_left`, and `synced_through` at
/// its own offset (where the write began: what a torn, unsynced write carries). Its body is
/// the last frame's. Returns its offset and bytes.
fn newer_frame_after(path: &Path, group_left: u32) -> (u64, Vec<u8>) {
    let last = *frames(path).last().unwrap();
    let bytes = std::fs::read(path).unwrap();
    let mut f = bytes[last.offset as usize..last.end() as usize].to_vec();
    let offset = bytes.len() as u64;
    f[8..16].copy_from_slice(&(last.lsn + 1).to_le_bytes());
    f[16..24].copy_from_slice(&offset.to_le_bytes());
    f[24..32].copy_from_slice(&(last.entry + 1).to_le_bytes());
    f[32..40].copy_from_slice(&last.term.to_le_bytes());
    f[40..44].copy_from_slice(&group_left.to_le_bytes());
    f[44] = NEWER;
    seal(&mut f);
    (offset, f)
}

/// Asserts `r` is `UnknownRecordType(NEWER)` in `file` at `offset`.
#[track_caller]
fn assert_refused<T>(r: Result<T, Error>, file: &Path, offset: u64) {
    match r {
        Err(
            ref e @ Error::Corruption {
                ref segment,
                offset: at,
                ref kind,
            },
        ) => {
            assert_eq!(
                (segment.as_path(), at, kind),
                (file, offset, &CorruptionKind::UnknownRecordType(NEWER)),
                "{e}"
            );
            let text = e.to_string();
            assert!(
                text.contains("record type 200") && text.contains("newer"),
                "the message names the type and the cause: {text}"
            );
        }
        Err(other) => panic!("expected UnknownRecordType in {file:?} at {offset}, got {other:?}"),
        Ok(_) => panic!("expected UnknownRecordType in {file:?} at {offset}, but it succeeded"),
    }
}

/// Opens `dir` twice (a refusal must not change what the next open finds), checks both
/// refuse the frame at `offset` of `seg`, and that `seg` still holds exactly `bytes`.
#[track_caller]
fn assert_open_refuses(dir: &Path, seg: &Path, offset: u64, bytes: &[u8]) {
    for _ in 0..2 {
        let r = Engine::open(config(dir, SyncPolicy::Always, 64 * 1024 * 1024));
        assert_refused(r, seg, offset);
        assert!(std::fs::read(seg).unwrap() == bytes, "nothing was cut");
        assert_eq!(
            segment_files(dir),
            vec![seg.to_path_buf()],
            "no segment added"
        );
    }
}

#[test]
fn a_newer_record_at_the_very_end_of_the_tail_is_refused_not_cut() {
    let dir = crashed_dir();
    let seg = last_segment(dir.path());
    let (offset, frame) = newer_frame_after(&seg, 0);
    append_bytes(&seg, &frame);
    let bytes = std::fs::read(&seg).unwrap();
    assert_open_refuses(dir.path(), &seg, offset, &bytes);
}

#[test]
fn a_newer_record_opening_a_group_cut_short_is_refused_not_cut() {
    let dir = crashed_dir();
    let seg = last_segment(dir.path());
    let (offset, frame) = newer_frame_after(&seg, 1);
    append_bytes(&seg, &frame);
    let bytes = std::fs::read(&seg).unwrap();
    assert_open_refuses(dir.path(), &seg, offset, &bytes);
}

#[test]
fn a_newer_record_before_valid_records_is_refused() {
    let dir = crashed_dir();
    let seg = last_segment(dir.path());
    let fs = frames(&seg);
    // An event in the middle of the tail, a group of its own, followed by more events.
    let f = fs[fs.len() - 3];
    assert_eq!((f.record_type, f.group_left), (tag::EVENT, 0), "test setup");
    let mut bytes = std::fs::read(&seg).unwrap();
    let frame = &mut bytes[f.offset as usize..f.end() as usize];
    frame[44] = NEWER;
    seal(frame);
    std::fs::write(&seg, &bytes).unwrap();
    assert_open_refuses(dir.path(), &seg, f.offset, &bytes);
}

/// Every file under `dir` but the lock, with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n != "LOCK") {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// A refused open leaves the directory as the newer build left it, down to the clean-close
/// mark (which the open reads and removes before it finds the record).
#[test]
fn a_refused_open_leaves_the_directory_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), SyncPolicy::Always, 64 * 1024 * 1024);
    let (_, s) = new_stream(&e, SESSION, None);
    append_range(&e, SESSION, s, 1, 3);
    e.close().unwrap();
    drop(e);
    let seg = last_segment(dir.path());
    let (offset, frame) = newer_frame_after(&seg, 0);
    append_bytes(&seg, &frame);
    let before = files(dir.path());
    assert!(
        before.iter().any(|(p, _)| p.ends_with("CLEAN")),
        "test setup: a clean close leaves its mark"
    );
    let r = Engine::open(config(dir.path(), SyncPolicy::Always, 64 * 1024 * 1024));
    assert_refused(r, &seg, offset);
    assert!(files(dir.path()) == before, "the directory is unchanged");
}

/// A directory whose tail ends in a newer build's record: its segment, the record's offset,
/// and the segment's bytes.
fn dir_ending_in_a_newer_record() -> (TempDir, PathBuf, u64, Vec<u8>) {
    let dir = crashed_dir();
    let seg = last_segment(dir.path());
    let (offset, frame) = newer_frame_after(&seg, 0);
    append_bytes(&seg, &frame);
    let bytes = std::fs::read(&seg).unwrap();
    (dir, seg, offset, bytes)
}

/// `verify` reports the frame as corrupt, not as a torn tail that the next open cuts.
#[test]
fn verify_reports_a_newer_record_as_refused_not_as_a_torn_tail() {
    let (dir, _seg, offset, _) = dir_ending_in_a_newer_record();
    let report = verify_dir(dir.path()).unwrap();
    assert!(!report.ok(), "{report}");
    let s = &report.segments[0];
    assert_eq!(s.torn_tail_bytes, 0, "{report}");
    let error = s.error.clone().unwrap_or_default();
    assert!(
        error.contains("record type 200") && error.contains(&format!("offset {offset}")),
        "{report}"
    );
}

/// `repair` refuses to cut it, even when told to accept loss: the fix is the newer build.
#[test]
fn repair_never_cuts_a_newer_record() {
    let (dir, seg, offset, bytes) = dir_ending_in_a_newer_record();
    for accept_loss in [false, true] {
        assert_refused(repair_dir(dir.path(), accept_loss), &seg, offset);
        assert!(std::fs::read(&seg).unwrap() == bytes, "nothing was cut");
    }
}

/// The replicated log's files go through the same open: a newer record at the tail of a
/// member's log is refused, not cut. (Its own writer never writes one: an append decodes
/// every record and refuses a type it does not know.)
#[test]
fn the_replicated_log_refuses_a_newer_record_at_its_tail() {
    let dir = tempfile::tempdir().unwrap();
    let blank = |index: u64| LogEntry {
        id: EntryId { term: 1, index },
        payload: EntryPayload::Blank,
    };
    let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
    log.append(&[blank(1), blank(2)]).unwrap();
    drop(log);
    let seg = last_segment(dir.path());
    let (offset, frame) = newer_frame_after(&seg, 0);
    append_bytes(&seg, &frame);
    let bytes = std::fs::read(&seg).unwrap();
    for _ in 0..2 {
        assert_refused(
            EntryLog::open(EntryLogConfig::new(dir.path())),
            &seg,
            offset,
        );
        assert!(std::fs::read(&seg).unwrap() == bytes, "nothing was cut");
    }
}
