//! Retention: watermarks are monotone and durable, whole segments go only when nothing in
//! them is retained, and metadata outlives the data so late cursors get precise verdicts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::new_stream as open_stream;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{Append, Config, Cursor, Engine, ManualClock, NewEvent, Verdict};

/// A fixed start time for tests on an injected clock (ms since the epoch).
const T0: u64 = 1_800_000_000_000;

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.retention.check_interval = Duration::from_secs(3600);
    c
}

fn fill(e: &Engine, session: &str, stream: u64, n: usize) {
    for i in 0..n {
        let ev = NewEvent::new("progress", vec![u8::try_from(i % 251).unwrap(); 200]);
        e.append(Append {
            session: session.into(),
            stream,
            expected_next_seq: None,
            events: vec![ev],
        })
        .unwrap();
    }
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".seg")
        })
        .count()
}

/// Runs `check` on `e`, again after a reopen, and again after rebuilding the index from the
/// log alone; returns the rebuilt engine.
fn check_live_reopened_and_rebuilt(e: Engine, dir: &Path, check: impl Fn(&Engine)) -> Engine {
    check(&e);
    e.close().unwrap();
    drop(e);
    let e = Engine::open(config(dir)).unwrap();
    check(&e);
    e.close().unwrap();
    drop(e);
    std::fs::remove_dir_all(dir.join("index")).unwrap();
    let e = Engine::open(config(dir)).unwrap();
    assert!(e.recovery_report().index_rebuilt);
    check(&e);
    e
}

fn verdict(e: &Engine, session: &str, c: Cursor) -> Verdict {
    e.resolve(session, &c.to_string(), None).unwrap().verdict
}

#[test]
fn trimmed_segments_are_deleted_and_cursors_below_are_evicted_across_reopen_and_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let (epoch, s) = open_stream(&e, "s", None);
    let (_, done) = open_stream(&e, "s", Some("req"));
    fill(&e, "s", done, 3);
    e.complete("s", done, None, NewEvent::new("result", b"ok".to_vec()))
        .unwrap();
    e.trim("s", done, 4).unwrap();
    fill(&e, "s", s, 200);
    let before = segment_files(dir.path());
    assert!(before >= 8, "small segments roll: {before}");
    // Nothing is trimmed yet: nothing may be retired.
    assert_eq!(e.run_retention().unwrap(), 0);
    assert_eq!(segment_files(dir.path()), before);

    assert_eq!(e.trim("s", s, 150).unwrap(), 151);
    let retired = e.run_retention().unwrap();
    assert!(
        retired >= 4,
        "segments wholly below the watermarks go: {retired}"
    );
    assert_eq!(segment_files(dir.path()), before - retired);
    let check = |e: &Engine| {
        assert_eq!(
            verdict(e, "s", Cursor::new(epoch, s, 10)),
            Verdict::CursorEvicted
        );
        assert_eq!(
            verdict(e, "s", Cursor::new(epoch, s, 150)),
            Verdict::Resumable
        );
        assert_eq!(e.read("s", s, 150, 100).unwrap().events.len(), 50);
        // The completed stream's data is gone, its tombstone and outcome are not.
        assert_eq!(
            verdict(e, "s", Cursor::new(epoch, done, 1)),
            Verdict::StreamTerminated
        );
        let o = e
            .outcome("s", "req")
            .unwrap()
            .expect("outcome outlives the data");
        assert_eq!(o.frame.unwrap().payload, &b"ok"[..]);
    };
    let live = e.index_dump().unwrap();
    // The log alone (segments + carried-forward snapshots) rebuilds the same state.
    let e = check_live_reopened_and_rebuilt(e, dir.path(), check);
    assert_eq!(
        e.index_dump().unwrap(),
        live,
        "rebuilt index equals the live one"
    );
}

#[test]
fn total_bytes_retention_raises_watermarks_and_keeps_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.retention.max_total_bytes = Some(16 * 1024);
    let e = Engine::open(cfg).unwrap();
    let (epoch, s) = open_stream(&e, "s", None);
    fill(&e, "s", s, 400);
    let retired = e.run_retention().unwrap();
    assert!(retired > 0);
    let stats = e.stats().unwrap();
    assert!(
        stats.log_bytes <= 16 * 1024 + 4096 + 512,
        "log kept near the bound: {}",
        stats.log_bytes
    );
    let r = e
        .resolve("s", &Cursor::new(epoch, s, 1).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::CursorEvicted, "evicted, never unknown");
    let wm = r.facts.watermark.unwrap();
    assert!(wm > 1);
    assert_eq!(
        e.read("s", s, wm - 1, 10).unwrap().events[0].seq,
        wm,
        "gap-free above the watermark"
    );
    // A second pass with nothing new to do keeps the watermark where it is.
    e.run_retention().unwrap();
    let again = e
        .resolve("s", &Cursor::new(epoch, s, 1).to_string(), None)
        .unwrap();
    assert!(
        again.facts.watermark.unwrap() >= wm,
        "watermarks never go backwards"
    );
}

#[test]
fn age_retention_evicts_old_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    // Ages are read from the injected clock: however long the disk takes, the first fill is
    // young until the clock is moved past `max_age`, and the second fill is young after.
    let clock = Arc::new(ManualClock::new(T0));
    cfg.clock = Arc::clone(&clock) as _;
    let max_age = Duration::from_millis(200);
    cfg.retention.max_age = Some(max_age);
    let e = Engine::open(cfg).unwrap();
    let (epoch, s) = open_stream(&e, "s", None);
    fill(&e, "s", s, 100);
    assert_eq!(e.run_retention().unwrap(), 0, "nothing is old yet");
    clock.advance(max_age + Duration::from_millis(1));
    fill(&e, "s", s, 30);
    assert!(e.run_retention().unwrap() > 0);
    assert_eq!(
        verdict(&e, "s", Cursor::new(epoch, s, 1)),
        Verdict::CursorEvicted
    );
    assert_eq!(
        verdict(&e, "s", Cursor::new(epoch, s, 129)),
        Verdict::Resumable
    );
}

#[test]
fn per_stream_event_limit_moves_the_watermark_on_append() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.retention.max_events_per_stream = Some(10);
    let e = Engine::open(cfg).unwrap();
    let (epoch, s) = open_stream(&e, "s", None);
    fill(&e, "s", s, 25);
    let r = e
        .resolve("s", &Cursor::new(epoch, s, 14).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::CursorEvicted);
    assert_eq!(r.facts.watermark, Some(16));
    assert_eq!(
        verdict(&e, "s", Cursor::new(epoch, s, 15)),
        Verdict::Resumable
    );
    assert_eq!(e.read("s", s, 15, 100).unwrap().events.len(), 10);
}

#[test]
fn metadata_past_the_horizon_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    let clock = Arc::new(ManualClock::new(T0));
    cfg.clock = Arc::clone(&clock) as _;
    cfg.retention.metadata_horizon = Duration::from_millis(100);
    let e = Engine::open(cfg).unwrap();
    let (epoch, done) = open_stream(&e, "s", Some("r"));
    fill(&e, "s", done, 2);
    e.complete("s", done, None, NewEvent::new("result", b"x".to_vec()))
        .unwrap();
    assert_eq!(
        verdict(&e, "s", Cursor::new(epoch, done, 1)),
        Verdict::StreamTerminated
    );
    clock.advance(Duration::from_millis(101));
    assert_eq!(
        verdict(&e, "s", Cursor::new(epoch, done, 1)),
        Verdict::UnknownCursor
    );
    assert_eq!(e.outcome("s", "r").unwrap(), None);
}

/// A retried request opens a second stream with the same correlation id; the newest one is
/// the outcome. Retiring the segment that held the first stream carries its snapshot
/// forward, and that must not make the first stream the outcome again — live, after a
/// reopen, or after rebuilding the index from the log. (Found by the model test.)
#[test]
fn carried_forward_snapshot_of_an_older_stream_does_not_take_back_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let (_, first) = open_stream(&e, "s", Some("req"));
    e.complete("s", first, None, NewEvent::new("result", b"first".to_vec()))
        .unwrap();
    let (_, s) = open_stream(&e, "s", None);
    fill(&e, "s", s, 50);
    let (_, retry) = open_stream(&e, "s", Some("req"));
    assert!(retry > first);
    fill(&e, "s", s, 50);
    assert_eq!(e.outcome("s", "req").unwrap().unwrap().stream, retry);

    e.trim("s", first, 1).unwrap();
    e.trim("s", s, 20).unwrap();
    assert!(
        e.run_retention().unwrap() >= 1,
        "the first stream's segment retires"
    );
    let check = |e: &Engine| {
        let o = e.outcome("s", "req").unwrap().expect("an outcome");
        assert_eq!(o.stream, retry, "the newest stream answers the request");
        assert!(o.frame.is_none(), "the retry has not finished");
    };
    check_live_reopened_and_rebuilt(e, dir.path(), check);
}

/// Events read from a sealed segment share its map instead of copying their payloads;
/// retiring (unlinking) the segment while a caller still holds them must leave them intact.
#[test]
fn events_read_from_a_sealed_segment_outlive_its_retirement() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let (_, s) = open_stream(&e, "s", None);
    fill(&e, "s", s, 100);
    let held = e.read("s", s, 0, 10).unwrap().events;
    assert_eq!(held.len(), 10);
    let before = segment_files(dir.path());
    e.trim("s", s, 60).unwrap();
    assert!(e.run_retention().unwrap() >= 1, "the first segments retire");
    assert!(segment_files(dir.path()) < before, "their files are gone");
    assert!(
        matches!(
            e.read("s", s, 0, 10),
            Err(cursorlog_engine::Error::Evicted { .. })
        ),
        "the engine no longer serves them"
    );
    for (i, ev) in held.iter().enumerate() {
        assert_eq!(ev.seq, i as u64 + 1);
        assert_eq!(&*ev.kind, "progress");
        assert_eq!(ev.payload.len(), 200);
        assert!(ev.payload.iter().all(|b| usize::from(*b) == i % 251));
    }
    e.close().unwrap();
    drop(e);
    // Still readable with the engine gone too.
    assert!(held[9].payload.iter().all(|b| *b == 9));
}

/// A damaged frame in a sealed segment stops retention with a corruption error naming the
/// file; it never truncates the segment's summary, which would make the live events after
/// the damage look dead and get their segment deleted.
#[test]
fn a_damaged_sealed_segment_is_reported_not_retired() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let (_, dead) = open_stream(&e, "s", None);
    let (_, live) = open_stream(&e, "s", None);
    fill(&e, "s", dead, 5);
    e.append(Append {
        session: "s".into(),
        stream: live,
        expected_next_seq: None,
        events: vec![NewEvent::new("progress", vec![0xEE; 200])],
    })
    .unwrap();
    fill(&e, "s", dead, 60);
    e.trim("s", dead, 65).unwrap();
    let first = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .min()
        .unwrap();
    let mut bytes = std::fs::read(&first).unwrap();
    let at = bytes
        .windows(200)
        .position(|w| w.iter().all(|b| *b == 0xEE))
        .expect("the live event is in the first segment");
    bytes[at + 100] ^= 0x01;
    std::fs::write(&first, &bytes).unwrap();
    let before = segment_files(dir.path());

    match e.run_retention() {
        Err(cursorlog_engine::Error::Corruption { segment, .. }) => assert_eq!(segment, first),
        other => panic!("expected a corruption error naming {first:?}, got {other:?}"),
    }
    assert_eq!(segment_files(dir.path()), before, "nothing was retired");
    assert!(first.exists());
}

/// Retiring several segments in one pass, with power lost at each file-system step of it in
/// turn (carry-forward writes and syncs, each unlink, each directory sync), and unsynced
/// directory updates reaching the disk in any order: every crash leaves a log that opens and
/// serves everything retained. (Unlinking out of order, or syncing the directory once after
/// several unlinks, can leave a hole in the LSNs that no recovery can close.)
#[test]
fn a_crash_at_any_step_of_a_retirement_leaves_a_log_that_opens() {
    use cursorlog_engine::{Fault, FaultyFs};
    use std::sync::Arc;

    let mut completed = false;
    let mut crashes = 0;
    for step in 1..200u64 {
        for seed in 0..4u64 {
            let fs = FaultyFs::new(step * 16 + seed);
            let dir = tempfile::tempdir().unwrap();
            let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone())).unwrap();
            let (epoch, s) = open_stream(&e, "s", None);
            fill(&e, "s", s, 120);
            e.trim("s", s, 90).unwrap();
            let ops = fs.ops();
            fs.inject(step, Fault::CrashDuringOp);
            let result = e.run_retention();
            if fs.ops() < ops + step {
                // The pass finished before the planned crash: every step was covered.
                let retired = result.unwrap();
                assert!(retired >= 3, "the pass retires several segments: {retired}");
                completed = true;
                break;
            }
            crashes += 1;
            e.simulate_crash();
            drop(e);
            fs.revive();
            let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone()))
                .unwrap_or_else(|err| panic!("crash at step {step} (seed {seed}): {err}"));
            // The log alone must still be whole: an index rebuilt from it walks every
            // segment left, so a hole among them cannot hide behind an up-to-date index.
            e.close().unwrap();
            drop(e);
            std::fs::remove_dir_all(dir.path().join("index")).unwrap();
            let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone())).unwrap_or_else(
                |err| panic!("crash at step {step} (seed {seed}), rebuilding the index: {err}"),
            );
            assert!(e.recovery_report().index_rebuilt);
            let events = e.read("s", s, 90, 1000).unwrap().events;
            assert_eq!(events.len(), 30, "step {step} seed {seed}: 91..=120 served");
            assert_eq!(
                verdict(&e, "s", Cursor::new(epoch, s, 120)),
                Verdict::Resumable,
                "step {step} seed {seed}"
            );
            // Retention finishes the job after the restart.
            e.run_retention().unwrap();
            assert_eq!(e.read("s", s, 90, 1000).unwrap().events.len(), 30);
        }
        if completed {
            break;
        }
    }
    assert!(completed, "the retirement finished within the steps tried");
    assert!(crashes >= 12, "crashed at each of several steps: {crashes}");
}
