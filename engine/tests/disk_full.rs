//! A disk that fills up at the moment the log needs a new segment is a full disk like any
//! other: the group is refused (`DiskFull`), nothing is half-created, the engine is not
//! poisoned, and appends go on once space returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cursorlog_engine::{Append, Config, Engine, Error, FaultyFs, NewEvent, OpenStream, SyncPolicy};

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.sync = SyncPolicy::Always;
    c.segment_bytes_max = 8192;
    c.retention.max_age = None;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c.disk_reserve_bytes = 0;
    c
}

fn append(e: &Engine, stream: u64, payload: &[u8]) -> Result<u64, Error> {
    e.append(Append {
        session: "s".into(),
        stream,
        expected_next_seq: None,
        events: vec![NewEvent::new("p", payload.to_vec())],
    })
    .map(|a| a.last_seq)
}

/// A fresh engine on a simulated disk (seeded), with session "s" and one stream in it.
fn engine_with_a_stream(seed: u64) -> (FaultyFs, tempfile::TempDir, Engine, u64) {
    let fs = FaultyFs::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone())).unwrap();
    let epoch = e.open_session("s").unwrap().epoch;
    let s = e
        .open_stream(OpenStream {
            session: "s".into(),
            epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream;
    (fs, dir, e, s)
}

fn used(fs: &FaultyFs) -> u64 {
    fs.files().iter().filter_map(|p| fs.durable_len(p)).sum()
}

#[test]
fn no_space_for_the_next_segment_refuses_the_group_and_does_not_poison() {
    let (fs, dir, e, s) = engine_with_a_stream(21);
    // Fill the active segment past its size: the next group starts by rolling.
    let mut head = 0;
    while e.stats().unwrap().log_bytes < 8192 {
        head = append(&e, s, &[1; 1000]).unwrap();
    }
    let segments = e.stats().unwrap().segments;
    // Not a byte more fits: creating the next segment fails with ENOSPC.
    fs.set_capacity(Some(used(&fs)));
    match append(&e, s, b"refused") {
        Err(Error::DiskFull { .. }) => {}
        other => panic!("expected DiskFull, got {other:?}"),
    }
    assert!(
        !e.is_poisoned(),
        "a full disk at rotation poisoned the engine"
    );
    assert_eq!(e.stats().unwrap().segments, segments);
    assert!(
        !fs.files().iter().any(|p| fs.durable_len(p) == Some(0)),
        "a half-created segment was left behind: {:?}",
        fs.files()
    );
    // Reads go on.
    assert_eq!(e.read("s", s, 0, 1000).unwrap().head, head);
    // Space returns: appends resume at the next seq (the refused one took none).
    fs.set_capacity(None);
    let deadline = Instant::now() + Duration::from_secs(60);
    let seq = loop {
        match append(&e, s, b"accepted") {
            Ok(seq) => break seq,
            Err(Error::DiskFull { .. }) if Instant::now() < deadline => {
                // The background disk check clears the refusal: wait for it.
                std::thread::yield_now();
            }
            Err(other) => panic!("appends did not resume: {other}"),
        }
    };
    assert_eq!(seq, head + 1);
    assert_eq!(e.stats().unwrap().segments, segments + 1);
    drop(e);
    // And the directory opens with everything in it.
    let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone())).unwrap();
    assert_eq!(e.read("s", s, 0, 1000).unwrap().head, head + 1);
}

/// The index's store failing to flush (it shares the disk) loses nothing: every event is in
/// the log and in the memtable. The engine refuses writes as on a full disk for a moment,
/// is never poisoned, and once flushes work again everything acknowledged is kept.
#[test]
fn a_failed_index_flush_refuses_writes_for_a_while_and_does_not_poison() {
    let (fs, dir, e, s) = engine_with_a_stream(22);
    e.fail_index_flushes(u64::MAX);
    let mut acked = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Append until the background flusher has met a failure (it flushes every 250 ms).
    while e.stats().unwrap().index_flush_failures == 0 {
        assert!(Instant::now() < deadline, "the index flusher never ran");
        match append(&e, s, b"x") {
            Ok(seq) => acked = seq,
            Err(Error::DiskFull { .. }) => {}
            Err(other) => panic!("expected success or DiskFull, got {other}"),
        }
    }
    assert!(!e.is_poisoned(), "a failed index flush poisoned the engine");
    e.fail_index_flushes(0);
    // Writes resume by themselves once a flush succeeds and the disk check sees space.
    let seq = loop {
        match append(&e, s, b"after") {
            Ok(seq) => break seq,
            Err(Error::DiskFull { .. }) if Instant::now() < deadline => std::thread::yield_now(),
            Err(other) => panic!("appends did not resume: {other}"),
        }
    };
    assert_eq!(seq, acked + 1);
    e.close().unwrap();
    drop(e);
    let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone())).unwrap();
    assert_eq!(e.read("s", s, 0, 10_000).unwrap().head, seq);
}

/// A request whose records fail to apply part way (a bug, a store failure) leaves no frame
/// and takes no LSN: its group is not written, and the log opens afterwards with every
/// acknowledged event and nothing of the failed request.
#[test]
fn a_request_that_fails_part_way_leaves_no_frame_behind() {
    let (fs, dir, e, s) = engine_with_a_stream(23);
    assert_eq!(append(&e, s, b"one").unwrap(), 1);
    e.fail_apply_at(2);
    let failed = e.append(Append {
        session: "s".into(),
        stream: s,
        expected_next_seq: None,
        events: (0..3)
            .map(|_| NewEvent::new("p", b"half".to_vec()))
            .collect(),
    });
    assert!(failed.is_err(), "{failed:?}");
    // Whatever the engine does next (it refuses writes until a restart), the log it leaves
    // must open, hold the acknowledged event, and nothing of the failed request.
    let _ = append(&e, s, b"two");
    e.simulate_crash();
    drop(e);
    let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone()))
        .unwrap_or_else(|err| panic!("the log does not open after a failed request: {err}"));
    let events = e.read("s", s, 0, 100).unwrap().events;
    assert!(
        events.iter().all(|ev| ev.payload.as_ref() != b"half"),
        "part of the failed request is in the log"
    );
    assert_eq!(
        events.first().map(|ev| ev.payload.to_vec()),
        Some(b"one".to_vec())
    );
    assert_eq!(append(&e, s, b"three").unwrap(), events.len() as u64 + 1);
}

/// An `OpenStream` with a producer lease that the full disk refuses leaves no lease behind:
/// the stream was never opened, and its id goes to the next record.
#[test]
fn a_refused_leased_open_leaves_no_lease() {
    let (fs, _dir, e, _) = engine_with_a_stream(24);
    let epoch = e.open_session("s").unwrap().epoch;
    assert_eq!(e.stats().unwrap().leased_streams, 0);
    fs.set_capacity(Some(used(&fs)));
    let refused = e.open_stream(OpenStream {
        session: "s".into(),
        epoch,
        correlation: None,
        lease_ms: Some(60_000),
    });
    assert!(
        matches!(refused, Err(Error::DiskFull { .. })),
        "{refused:?}"
    );
    assert_eq!(
        e.stats().unwrap().leased_streams,
        0,
        "a lease outlived its refused open"
    );
}
