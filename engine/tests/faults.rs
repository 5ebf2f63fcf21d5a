//! What happens when the machine or the disk fails: unclean restarts that may have lost an
//! acknowledged tail are fenced (no cursor ever names two events), a full disk is an answer
//! (appends refused, reads go on, nothing acknowledged lost, appends resume when space
//! returns), on a simulated file system and on a real, size-limited one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{
    Append, Config, Cursor, Engine, Error, FaultyFs, NewEvent, OpenStream, StreamState, SyncPolicy,
    Verdict,
};

fn config(dir: &Path, sync: SyncPolicy) -> Config {
    let mut c = Config::new(dir);
    c.sync = sync;
    c.segment_bytes_max = 8192;
    c.retention.max_age = None;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c.disk_reserve_bytes = 0;
    c
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

/// Under `interval` or `never`, a power loss can lose acknowledged events. Without fencing, the next
/// append would take the lost events' seqs, and a client holding cursor `…-3` would later
/// resume at the *new* seq 3's successor, silently skipping events.
#[test]
fn a_reboot_that_lost_acknowledged_events_ends_the_open_streams() {
    for sync in [SyncPolicy::Interval(3_600_000), SyncPolicy::Never] {
        let fs = FaultyFs::new(11);
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open_with_fs(config(dir.path(), sync), Arc::new(fs.clone())).unwrap();
        let (epoch, s) = stream(&e, "s");
        for i in 0..3u8 {
            append(&e, "s", s, &[i]).unwrap(); // acknowledged, not synced
        }
        fs.crash(false); // power loss: the unsynced events are gone; the machine reboots
        drop(e);
        fs.revive();
        let e = Engine::open_with_fs(config(dir.path(), sync), Arc::new(fs.clone())).unwrap();
        let report = e.recovery_report().clone();
        assert_eq!(report.previous_clean, Some(false), "{sync}");
        assert_eq!(report.streams_fenced, 1, "{sync}: {report}");
        // The client's cursor names an event the log lost: an explicit discontinuity...
        let r = e
            .resolve("s", &Cursor::new(epoch, s, 3).to_string(), None)
            .unwrap();
        assert_eq!(r.verdict, Verdict::CursorAhead, "{sync}");
        // ...and seq 3 is never given to another event.
        assert!(
            matches!(
                append(&e, "s", s, b"new"),
                Err(Error::StreamTerminated {
                    state: StreamState::Aborted,
                    ..
                })
            ),
            "{sync}"
        );
        // A new stream works as usual.
        let (_, fresh) = stream(&e, "s");
        assert_eq!(append(&e, "s", fresh, b"x").unwrap(), 1, "{sync}");
    }
}

/// The same crash without a reboot (a killed process: the page cache kept every write), or
/// under `always` (nothing acknowledged was unsynced), or after a clean shutdown, fences
/// nothing: in-flight calls keep their streams.
#[test]
fn restarts_that_lost_nothing_acknowledged_fence_nothing() {
    for (sync, reboot, clean) in [
        (SyncPolicy::Interval(3_600_000), false, false),
        (SyncPolicy::Always, true, false),
        (SyncPolicy::Never, true, true),
    ] {
        let fs = FaultyFs::new(12);
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open_with_fs(config(dir.path(), sync), Arc::new(fs.clone())).unwrap();
        let (_, s) = stream(&e, "s");
        append(&e, "s", s, b"a").unwrap();
        if clean {
            e.close().unwrap();
        } else {
            e.simulate_crash();
        }
        drop(e);
        if reboot {
            fs.crash(false);
            fs.revive();
        }
        let e = Engine::open_with_fs(config(dir.path(), sync), Arc::new(fs.clone())).unwrap();
        let case = format!("{sync} reboot={reboot} clean={clean}");
        assert_eq!(e.recovery_report().streams_fenced, 0, "{case}");
        assert_eq!(append(&e, "s", s, b"b").unwrap(), 2, "{case}");
    }
}

fn fill(e: &Engine, stream: u64, payload: usize) -> Vec<u64> {
    let mut acked = Vec::new();
    loop {
        match append(e, "s", stream, &vec![7; payload]) {
            Ok(seq) => acked.push(seq),
            Err(Error::DiskFull { .. }) => return acked,
            Err(other) => panic!("expected DiskFull, got {other}"),
        }
    }
}

/// Below the free-space reserve appends are refused with `DiskFull`; reads, verdicts, trims
/// and retention go on; retention frees space with writes of its own (within the reserve);
/// appends resume without a restart; nothing acknowledged is lost.
#[test]
fn a_full_disk_refuses_appends_serves_reads_and_recovers_without_a_restart() {
    let fs = FaultyFs::new(13);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), SyncPolicy::Always);
    cfg.disk_reserve_bytes = 64 * 1024;
    fs.set_capacity(Some(256 * 1024));
    let e = Engine::open_with_fs(cfg.clone(), Arc::new(fs.clone())).unwrap();
    let (epoch, s) = stream(&e, "s");
    let mut acked = Vec::new();
    // Fill until the background check (run here at once) says the reserve is reached.
    loop {
        acked.push(append(&e, "s", s, &[5; 1000]).unwrap());
        e.run_maintenance().unwrap();
        let st = e.stats().unwrap();
        if st.disk_free_bytes.unwrap() < cfg.disk_reserve_bytes {
            break;
        }
    }
    let refused = append(&e, "s", s, b"one more");
    assert!(
        matches!(refused, Err(Error::DiskFull { .. })),
        "{refused:?}"
    );
    assert!(!e.is_poisoned(), "a full disk is an answer, not a failure");
    assert!(e.stats().unwrap().appends_refused_low_disk >= 1);
    // Reads and verdicts go on.
    let last = *acked.last().unwrap();
    assert_eq!(e.read("s", s, 0, 10_000).unwrap().events.len() as u64, last);
    assert_eq!(
        e.resolve("s", &Cursor::new(epoch, s, last).to_string(), None)
            .unwrap()
            .verdict,
        Verdict::Resumable
    );
    // The operator (or retention by age) releases old events; retention frees the space.
    // While the disk is low the background thread runs retention every tick too, so either
    // pass may be the one that retires the trimmed segments: what is checked is that they
    // are gone once this pass returns (passes take turns, so a pass that began after the
    // trim has finished by then), not which thread retired them.
    let segments = e.stats().unwrap().segments;
    e.trim("s", s, last - 5).unwrap();
    e.run_retention().unwrap();
    assert!(
        e.stats().unwrap().segments < segments,
        "the trimmed segments are retired"
    );
    e.run_maintenance().unwrap();
    assert!(e.stats().unwrap().disk_free_bytes.unwrap() >= cfg.disk_reserve_bytes);
    assert_eq!(
        append(&e, "s", s, b"again").unwrap(),
        last + 1,
        "no restart needed"
    );
    // Nothing acknowledged was lost: the retained events are all there, after a reopen too.
    e.close().unwrap();
    drop(e);
    let e = Engine::open_with_fs(cfg, Arc::new(fs.clone())).unwrap();
    let events = e.read("s", s, last - 5, 10_000).unwrap().events;
    let seqs: Vec<u64> = events.iter().map(|ev| ev.seq).collect();
    assert_eq!(seqs, ((last - 4)..=last + 1).collect::<Vec<_>>());
}

/// When the disk fills up between checks, the write itself fails (ENOSPC): the partial write
/// is cut off again, the group's requests get `DiskFull`, and the engine goes on (it is not
/// poisoned); once space returns, appends work again.
#[test]
fn enospc_on_a_write_is_refused_cleanly_and_not_fatal() {
    let fs = FaultyFs::new(14);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SyncPolicy::Always);
    let e = Engine::open_with_fs(cfg.clone(), Arc::new(fs.clone())).unwrap();
    let (_, s) = stream(&e, "s");
    append(&e, "s", s, b"first").unwrap();
    fs.set_capacity(Some(fs.files().len() as u64 * 8192 + 2048));
    let acked = fill(&e, s, 512);
    assert!(!e.is_poisoned());
    // Still full: refused again, from the low-disk flag or the write.
    assert!(matches!(
        append(&e, "s", s, &[1; 512]),
        Err(Error::DiskFull { .. })
    ));
    fs.set_capacity(None);
    e.run_maintenance().unwrap();
    let next = append(&e, "s", s, b"after").unwrap();
    assert_eq!(next, acked.last().copied().unwrap_or(1) + 1);
    e.close().unwrap();
    drop(e);
    let e = Engine::open_with_fs(cfg, Arc::new(fs)).unwrap();
    assert_eq!(e.read("s", s, 0, 10_000).unwrap().events.len() as u64, next);
}

/// The same on a real file system of a few MiB (tmpfs, mounted for the test): skipped, with
/// a message, where the machine does not allow mounting.
#[test]
fn a_real_size_limited_file_system_fills_and_recovers() {
    let mount = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "cursorlog-test"])
        .arg(mount.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a size-limited tmpfs here (needs root)");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(mount.path());
    let dir = mount.path().join("data");
    let mut cfg = config(&dir, SyncPolicy::Always);
    cfg.segment_bytes_max = 256 * 1024;
    cfg.disk_reserve_bytes = 1024 * 1024;
    cfg.index_cache_bytes = 1024 * 1024;
    let e = Engine::open(cfg.clone()).unwrap();
    let (_, s) = stream(&e, "s");
    let mut last = 0;
    for _ in 0..100_000 {
        match append(&e, "s", s, &[3; 4096]) {
            Ok(seq) => last = seq,
            Err(Error::DiskFull { .. }) => break,
            Err(other) => panic!("expected DiskFull, got {other}"),
        }
        if last % 16 == 0 {
            e.run_maintenance().unwrap();
        }
    }
    assert!(last > 0 && !e.is_poisoned());
    assert!(matches!(
        append(&e, "s", s, &[3; 4096]),
        Err(Error::DiskFull { .. })
    ));
    assert_eq!(
        e.read("s", s, 0, 100_000).unwrap().events.len() as u64,
        last
    );
    e.trim("s", s, last - 1).unwrap();
    e.run_retention().unwrap();
    e.run_maintenance().unwrap();
    assert_eq!(append(&e, "s", s, b"room again").unwrap(), last + 1);
    e.close().unwrap();
    drop(e);
    let e = Engine::open(cfg).unwrap();
    let events = e.read("s", s, last - 1, 10).unwrap().events;
    assert_eq!(
        events.iter().map(|ev| ev.seq).collect::<Vec<_>>(),
        [last, last + 1]
    );
    e.close().unwrap();
}
