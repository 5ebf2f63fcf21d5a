//! Restarts followed by power losses: recovery never trusts bytes that were not synced, a
//! clean close never hides a later loss, and an index that remembers more than the log holds
//! is lost acknowledged data, fenced. In every case: no seq, stream id or epoch that a client
//! may hold is ever given to another event.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{
    Append, Config, Cursor, Engine, Error, Fault, FaultyFs, NewEvent, OpenStream, StreamState,
    SyncPolicy, Tear, Verdict,
};

fn config(dir: &Path, sync: SyncPolicy) -> Config {
    let mut c = Config::new(dir);
    c.sync = sync;
    c.segment_bytes_max = 1 << 20;
    c.retention.max_age = None;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c.disk_reserve_bytes = 0;
    c
}

fn open(dir: &Path, sync: SyncPolicy, fs: &FaultyFs) -> Engine {
    Engine::open_with_fs(config(dir, sync), Arc::new(fs.clone())).unwrap()
}

fn stream(e: &Engine, session: &str) -> (u64, u64) {
    let epoch = e.open_session(session).unwrap().epoch;
    let s = e
        .open_stream(OpenStream {
            session: session.into(),
            epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap();
    (s.epoch, s.stream)
}

fn append(e: &Engine, session: &str, stream: u64, payload: &[u8]) -> Result<u64, Error> {
    e.append(Append {
        session: session.into(),
        stream,
        expected_next_seq: None,
        events: vec![NewEvent::new("p", payload.to_vec())],
    })
    .map(|a| a.last_seq)
}

fn head(e: &Engine, session: &str, stream: u64) -> (u64, StreamState) {
    let b = e.read(session, stream, 0, 10_000).unwrap();
    (b.head, b.state)
}

/// Review F1(a). A killed run leaves unsynced groups in the page cache; the next run on the
/// same boot continues that tail and claims (`synced_through`) everything before its frames
/// was synced. A power loss that tears sectors of the killed run's bytes but keeps the new
/// run's frame then looks like damage to synced data: the start was refused
/// (`DamageBeforeValidRecords`). The tail must be synced before it is trusted.
#[test]
fn a_kill_then_a_restart_then_a_torn_power_loss_is_an_ordinary_torn_tail() {
    for sync in [SyncPolicy::Interval(3_600_000), SyncPolicy::Never] {
        for seed in 0..24 {
            let fs = FaultyFs::new(seed);
            fs.set_tear(Tear::Sectors);
            let dir = tempfile::tempdir().unwrap();
            let e = open(dir.path(), sync, &fs);
            let (_, s) = stream(&e, "s");
            for i in 0..3u8 {
                append(&e, "s", s, &[i; 3000]).unwrap(); // acknowledged, in the page cache
            }
            e.simulate_crash(); // kill -9: the page cache keeps every write
            drop(e);
            let e = open(dir.path(), sync, &fs); // same boot
            for i in 3..6u8 {
                // No open comes first: an open is synced under every policy and would make
                // the killed run's bytes durable by itself.
                append(&e, "s", s, &[i; 3000]).unwrap();
            }
            e.simulate_crash();
            drop(e);
            fs.crash(true); // power loss tearing unsynced sectors
            fs.revive();
            let e = Engine::open_with_fs(config(dir.path(), sync), Arc::new(fs.clone()))
                .unwrap_or_else(|err| panic!("{sync} seed {seed}: reopen refused: {err}"));
            // Everything the first run acknowledged was made durable by the second run's
            // open: its three events survived whatever the power loss tore after them.
            let h = head(&e, "s", s).0;
            assert!(h >= 3, "{sync} seed {seed}: head {h}");
        }
    }
}

/// Review F1(b). Under `always`, a group the killed run wrote but never acknowledged (its
/// fdatasync failed) is replayed from the page cache by the next run on the same boot and
/// served. Without a sync at open, a power loss then takes it back, and its seqs go to other
/// events: a reader that was served seq 2 would later find a different seq 2.
#[test]
fn what_a_restart_serves_from_an_unsynced_tail_survives_a_power_loss() {
    let fs = FaultyFs::new(7);
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), SyncPolicy::Always, &fs);
    let (_, s) = stream(&e, "s");
    append(&e, "s", s, b"one").unwrap();
    // The next write's fdatasync fails: the group is in the page cache, never acknowledged.
    fs.inject(2, Fault::Eio);
    assert!(append(&e, "s", s, b"two").is_err());
    e.simulate_crash();
    drop(e);
    fs.clear_faults();
    let e = open(dir.path(), SyncPolicy::Always, &fs); // same boot: the page cache is there
    let served = e.read("s", s, 0, 100).unwrap();
    let served: Vec<Vec<u8>> = served.events.iter().map(|ev| ev.payload.to_vec()).collect();
    e.simulate_crash();
    drop(e);
    fs.crash(false); // power loss: whatever was not synced is gone
    fs.revive();
    let e = open(dir.path(), SyncPolicy::Always, &fs);
    let after = e.read("s", s, 0, 100).unwrap();
    let after: Vec<Vec<u8>> = after.events.iter().map(|ev| ev.payload.to_vec()).collect();
    assert_eq!(
        after, served,
        "events served after the restart vanished in a power loss"
    );
    let next = append(&e, "s", s, b"three").unwrap();
    assert_eq!(next, served.len() as u64 + 1);
}

/// Review F2, as reproduced on `FaultyFs` under both policies: clean close, reopen, two
/// acknowledged appends (seqs 2 and 3), power loss, reopen. The log used to still end in the
/// old shutdown mark: `previous_clean = Some(true)`, nothing fenced, and the next append was
/// given seq 2 again.
#[test]
fn a_clean_close_does_not_hide_a_loss_after_the_next_start() {
    for sync in [SyncPolicy::Interval(3_600_000), SyncPolicy::Never] {
        for tear in [false, true] {
            let fs = FaultyFs::new(3);
            fs.set_tear(Tear::Sectors);
            let dir = tempfile::tempdir().unwrap();
            let e = open(dir.path(), sync, &fs);
            let (epoch, s) = stream(&e, "s");
            assert_eq!(append(&e, "s", s, b"1").unwrap(), 1);
            e.close().unwrap();
            drop(e);
            let e = open(dir.path(), sync, &fs); // same boot
            assert_eq!(e.recovery_report().previous_clean, Some(true));
            assert_eq!(append(&e, "s", s, b"2").unwrap(), 2); // acknowledged, unsynced
            assert_eq!(append(&e, "s", s, b"3").unwrap(), 3);
            e.simulate_crash();
            drop(e);
            fs.crash(tear);
            fs.revive();
            let e = open(dir.path(), sync, &fs);
            let report = e.recovery_report().clone();
            let case = format!("{sync} torn={tear}");
            assert_eq!(report.previous_clean, Some(false), "{case}: {report}");
            assert_eq!(report.streams_fenced, 1, "{case}: {report}");
            // A client holding seq 3's cursor gets an explicit discontinuity...
            let r = e
                .resolve("s", &Cursor::new(epoch, s, 3).to_string(), None)
                .unwrap();
            assert_eq!(r.verdict, Verdict::CursorAhead, "{case}");
            // ...and seq 2 is never given to another event.
            assert!(
                matches!(
                    append(&e, "s", s, b"other"),
                    Err(Error::StreamTerminated { .. })
                ),
                "{case}"
            );
        }
    }
}

/// A clean close followed by a clean close is still clean, and a restart after it fences
/// nothing: the new segment each start begins costs nothing else.
#[test]
fn clean_restarts_under_interval_stay_clean_and_fence_nothing() {
    let fs = FaultyFs::new(5);
    let dir = tempfile::tempdir().unwrap();
    let sync = SyncPolicy::Interval(3_600_000);
    let e = open(dir.path(), sync, &fs);
    let (_, s) = stream(&e, "s");
    append(&e, "s", s, b"1").unwrap();
    e.close().unwrap();
    drop(e);
    for round in 0..3u64 {
        let e = open(dir.path(), sync, &fs);
        let report = e.recovery_report().clone();
        assert_eq!(report.previous_clean, Some(true), "round {round}: {report}");
        assert_eq!(report.streams_fenced, 0, "round {round}");
        assert_eq!(append(&e, "s", s, b"x").unwrap(), round + 2);
        e.close().unwrap();
    }
    fs.crash(false); // everything was synced by the clean closes
    fs.revive();
    let e = open(dir.path(), sync, &fs);
    assert_eq!(e.recovery_report().streams_fenced, 0);
    assert_eq!(head(&e, "s", s), (4, StreamState::Open));
}

/// Item 3. Under `always`, the index only ever applies synced groups; an index ahead of the
/// log proves synced, acknowledged records vanished (here: cut from the file by hand, as a
/// disk that ignores fsync would lose them). The streams that lost events are ended, the
/// session that lost a stream moves past every epoch a client saw (so the lost stream's id,
/// given to a new stream, never matches an old cursor), and the loss is reported.
#[test]
fn an_index_ahead_of_the_log_is_lost_acknowledged_data_and_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), SyncPolicy::Always)).unwrap();
    let (epoch, a1) = stream(&e, "a");
    assert_eq!(append(&e, "a", a1, b"1").unwrap(), 1);
    assert_eq!(append(&e, "a", a1, b"2").unwrap(), 2);
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .unwrap();
    let keep = std::fs::metadata(&seg).unwrap().len();
    // Acknowledged (fsynced) after the point the disk will lose:
    assert_eq!(append(&e, "a", a1, b"3").unwrap(), 3);
    assert_eq!(append(&e, "a", a1, b"4").unwrap(), 4);
    let a2 = e
        .open_stream(OpenStream {
            session: "a".into(),
            epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream;
    assert_eq!(append(&e, "a", a2, b"x").unwrap(), 1);
    let (_, b1) = stream(&e, "b");
    append(&e, "b", b1, b"y").unwrap();
    e.close().unwrap(); // the index is flushed: it has applied all of the above
    drop(e);
    // The disk loses every synced write after `keep`.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(keep)
        .unwrap();

    let e = Engine::open(config(dir.path(), SyncPolicy::Always)).unwrap();
    let report = e.recovery_report().clone();
    assert!(report.lost_records >= 6, "{report}");
    assert_eq!(report.streams_fenced, 1, "{report}");
    assert_eq!(report.sessions_fenced, 1, "{report}");
    let stats = e.stats().unwrap();
    assert_eq!(stats.recovery_lost_records, report.lost_records);
    // a1 lost seqs 3 and 4: a cursor at 4 is an explicit discontinuity, and seq 3 is never
    // given to another event.
    assert_eq!(head(&e, "a", a1), (2, StreamState::Aborted));
    let r = e
        .resolve("a", &Cursor::new(epoch, a1, 4).to_string(), None)
        .unwrap();
    assert_ne!(r.verdict, Verdict::Resumable);
    assert!(matches!(
        append(&e, "a", a1, b"3'"),
        Err(Error::StreamTerminated { .. })
    ));
    // a2 vanished with its id: streams opened now may take it, in a later epoch, so the
    // old cursor can never resume into one of them.
    let now = e.open_session("a").unwrap().epoch;
    assert!(now > epoch, "session a stays at epoch {now}");
    let mut reissued = false;
    for _ in 0..8 {
        let s = e
            .open_stream(OpenStream {
                session: "a".into(),
                epoch: now,
                correlation: None,
                lease_ms: None,
            })
            .unwrap()
            .stream;
        append(&e, "a", s, b"new").unwrap();
        reissued |= s == a2;
    }
    assert!(reissued, "the test must reach the lost stream's id");
    let r = e
        .resolve("a", &Cursor::new(epoch, a2, 1).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::EpochMismatch);
    // Session b vanished whole: its id is unknown, never silently someone else's.
    let r = e
        .resolve("b", &Cursor::new(1, b1, 1).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::UnknownSession);
}
