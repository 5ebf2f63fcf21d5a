//! Lifetimes under an injected clock: session idle TTL (renewal, follower pins, expiry through
//! the expiry record), forgetting past the metadata horizon, producer leases renewed only by
//! their owner, followers that end when the engine closes, and incremental stats.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{
    Append, Config, Cursor, Engine, Error, ManualClock, NewEvent, OpenStream, StreamState, Verdict,
};

const T0: u64 = 1_800_000_000_000;
const TTL: Duration = Duration::from_secs(60);
const HORIZON: Duration = Duration::from_secs(600);

fn config(dir: &Path, clock: &Arc<ManualClock>) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.clock = Arc::clone(clock) as _;
    c.session_idle_ttl = Some(TTL);
    c.retention.metadata_horizon = HORIZON;
    c.retention.max_age = None;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c.disk_reserve_bytes = 0;
    // Each test's own maintenance passes count what they expire: no background pass races them.
    c.background_expiry = false;
    c
}

fn stream(e: &Engine, session: &str, lease_ms: Option<u64>) -> (u64, u64) {
    let epoch = e.open_session(session).unwrap().epoch;
    let s = e
        .open_stream(OpenStream {
            session: session.into(),
            epoch,
            correlation: Some(format!("{session}-req")),
            lease_ms,
        })
        .unwrap();
    (s.epoch, s.stream)
}

fn append(e: &Engine, session: &str, stream: u64) -> Result<u64, Error> {
    e.append(Append {
        session: session.into(),
        stream,
        expected_next_seq: None,
        events: vec![NewEvent::new("p", b"x".to_vec())],
    })
    .map(|a| a.last_seq)
}

fn verdict(e: &Engine, session: &str, c: Cursor) -> cursorlog_engine::Resolution {
    e.resolve(session, &c.to_string(), None).unwrap()
}

#[test]
fn idle_sessions_expire_through_the_expiry_record_and_calls_renew_them() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let (ea, a) = stream(&e, "idle", None);
    let (_, b) = stream(&e, "busy", None);
    append(&e, "idle", a).unwrap();

    // Every call naming a session renews it.
    clock.advance(Duration::from_secs(40));
    append(&e, "busy", b).unwrap();
    clock.advance(Duration::from_secs(21));
    assert_eq!(
        e.run_maintenance().unwrap(),
        (0, 1),
        "only the idle one expires"
    );
    let r = verdict(&e, "idle", Cursor::new(ea, a, 1));
    assert_eq!(r.verdict, Verdict::UnknownSession);
    assert!(r.facts.session_expired, "an expiry, not an unknown session");
    // Its lease-less open stream ended with it, saying why (the outcome stays readable
    // until the metadata horizon).
    let outcome = e.stream_outcome("idle", a).unwrap().unwrap();
    assert_eq!(outcome.state, StreamState::Aborted);
    assert_eq!(
        outcome.reason.as_deref(),
        Some("session expired after 61 s idle")
    );
    assert!(matches!(
        append(&e, "idle", a),
        Err(Error::StreamTerminated { .. })
    ));
    assert_eq!(e.stats().unwrap().sessions_expired_idle, 1);

    // Resolve, keep-alive and touch renew too.
    for renew in 0..3 {
        clock.advance(Duration::from_secs(50));
        match renew {
            0 => drop(verdict(&e, "busy", Cursor::new(1, b, 1))),
            1 => e.keep_alive("busy", b).unwrap(),
            _ => e.touch_session("busy").unwrap(),
        }
        assert_eq!(e.run_maintenance().unwrap(), (0, 0), "renewal {renew}");
    }
    clock.advance(TTL);
    assert_eq!(e.run_maintenance().unwrap(), (0, 1));
    assert!(matches!(
        e.touch_session("busy"),
        Err(Error::SessionExpired)
    ));
    let stats = e.stats().unwrap();
    assert_eq!((stats.live_sessions, stats.open_streams), (0, 0));
    assert_eq!(
        stats.sessions, 2,
        "expired sessions are remembered until the horizon"
    );
}

#[tokio::test]
async fn an_open_follower_keeps_its_session_alive_and_its_end_restarts_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let (_, s) = stream(&e, "connected", None);
    let follower = e.follow("connected", s, 0).unwrap();
    clock.advance(TTL * 5);
    assert_eq!(
        e.run_maintenance().unwrap(),
        (0, 0),
        "a connected client is not idle"
    );
    drop(follower);
    clock.advance(TTL - Duration::from_secs(1));
    assert_eq!(
        e.run_maintenance().unwrap(),
        (0, 0),
        "idle time starts when it leaves"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(e.run_maintenance().unwrap(), (0, 1));
}

#[test]
fn past_the_horizon_everything_a_session_held_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    e.open_session_with_state("gone", Some(b"init".to_vec()))
        .unwrap();
    let (epoch, s) = stream(&e, "gone", None);
    append(&e, "gone", s).unwrap();
    let (_, keep) = stream(&e, "kept", None);
    let keys_of = |e: &Engine| {
        e.index_dump()
            .unwrap()
            .into_iter()
            .filter(|(k, _)| k.windows(4).any(|w| w == b"gone") || k.ends_with(&s.to_be_bytes()))
            .count()
    };
    assert!(keys_of(&e) > 0);
    clock.advance(TTL - Duration::from_secs(1));
    e.touch_session("kept").unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(e.run_maintenance().unwrap(), (0, 1));
    e.run_retention().unwrap();
    assert!(
        e.session("gone").unwrap().is_some(),
        "remembered while within the horizon"
    );
    assert_eq!(
        verdict(&e, "gone", Cursor::new(epoch, s, 1)).verdict,
        Verdict::UnknownSession
    );
    clock.advance(HORIZON);
    e.touch_session("kept").unwrap();
    e.run_retention().unwrap();
    assert_eq!(e.session("gone").unwrap(), None, "forgotten");
    assert_eq!(keys_of(&e), 0, "no index entry of it is left");
    let stats = e.stats().unwrap();
    assert_eq!(
        (stats.sessions, stats.streams),
        (1, 1),
        "only the kept session"
    );
    assert!(e.session("kept").unwrap().is_some());
    assert!(append(&e, "kept", keep).is_ok());
    // The same after a rebuild from the log: forgetting is a record.
    e.close().unwrap();
    drop(e);
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    assert_eq!(e.session("gone").unwrap(), None);
    assert_eq!(e.stats().unwrap().sessions, 1);
}

/// Another session appending to a stream id it does not own must not renew the owner's
/// producer lease (a dead producer's followers would never get the abort).
#[test]
fn only_the_owner_renews_a_producer_lease() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let (_, s) = stream(&e, "owner", Some(1_000));
    stream(&e, "intruder", None);
    for _ in 0..5 {
        clock.advance(Duration::from_millis(400));
        assert!(matches!(
            append(&e, "intruder", s),
            Err(Error::UnknownStream(_))
        ));
        e.touch_session("owner").unwrap();
    }
    assert_eq!(e.run_maintenance().unwrap().0, 1, "the lease ran out");
    let meta = e
        .streams()
        .unwrap()
        .into_iter()
        .find(|m| m.id == s)
        .unwrap();
    assert_eq!(meta.state, StreamState::Aborted);
    assert_eq!(meta.end_reason.as_deref(), Some("producer lease expired"));
}

#[tokio::test]
async fn a_waiting_follower_ends_with_closed_when_the_engine_closes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let (_, s) = stream(&e, "s", None);
    let mut follower = e.follow("s", s, 0).unwrap();
    let waiting = tokio::spawn(async move { follower.next_batch(10).await });
    tokio::task::yield_now().await;
    let closer = e.clone();
    tokio::task::spawn_blocking(move || closer.close())
        .await
        .unwrap()
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the follower woke up")
        .unwrap();
    assert!(matches!(ended, Err(Error::Closed)), "{ended:?}");
    assert!(matches!(e.follow("s", s, 0), Err(Error::Closed)));
}

#[tokio::test]
async fn a_follower_wakes_for_its_own_stream_only() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let (_, mine) = stream(&e, "s", None);
    let (_, other) = stream(&e, "s", None);
    let mut follower = e.follow("s", mine, 0).unwrap();
    assert_eq!(follower.poll(10).unwrap(), Some(Vec::new()));
    for _ in 0..20 {
        append(&e, "s", other).unwrap();
    }
    let before = e.stats().unwrap().followed_streams;
    assert_eq!(before, 1);
    // Commits of the other stream did not ring this follower's bell: its wait is pending.
    let woke = tokio::time::timeout(Duration::from_millis(1), follower.changed()).await;
    assert!(woke.is_err(), "woken by another stream's commits");
    append(&e, "s", mine).unwrap();
    tokio::time::timeout(Duration::from_secs(10), follower.changed())
        .await
        .expect("woken by its own stream")
        .unwrap();
    let events = follower.poll(10).unwrap().unwrap();
    assert_eq!(events.len(), 1);
    drop(follower);
    assert_eq!(e.stats().unwrap().followed_streams, 0);
}

#[test]
fn sealed_segments_hold_no_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let (_, s) = stream(&e, "s", None);
    for _ in 0..300 {
        e.append(Append {
            session: "s".into(),
            stream: s,
            expected_next_seq: None,
            events: vec![NewEvent::new("p", vec![1; 100])],
        })
        .unwrap();
    }
    let stats = e.stats().unwrap();
    assert!(stats.segments > 5, "test setup: many segments");
    assert_eq!(stats.segment_descriptors, 1, "only the active segment");
    // Reads of sealed segments still work (through their maps).
    assert_eq!(e.read("s", s, 0, 1000).unwrap().events.len(), 300);
}

/// The index is derived: a store that cannot be opened at all is rebuilt from the log.
#[test]
fn an_unreadable_index_is_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let (epoch, s) = stream(&e, "s", None);
    append(&e, "s", s).unwrap();
    e.close().unwrap();
    drop(e);
    // Damage every file of the index store.
    for entry in walk(&dir.path().join("index")) {
        std::fs::write(&entry, b"not a sled database").unwrap();
    }
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    assert!(e.recovery_report().index_rebuilt);
    assert_eq!(
        verdict(&e, "s", Cursor::new(epoch, s, 1)).verdict,
        Verdict::Resumable
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A poisoned engine says so when closed, so a server can exit non-zero.
#[test]
fn closing_a_poisoned_engine_is_an_error() {
    let fs = cursorlog_engine::FaultyFs::new(7);
    let dir = Path::new("/poisoned");
    let clock = Arc::new(ManualClock::new(T0));
    let mut c = config(dir, &clock);
    c.dir = tempfile::tempdir().unwrap().keep();
    let e = Engine::open_with_fs(c, Arc::new(fs.clone())).unwrap();
    let (_, s) = stream(&e, "s", None);
    let mut watch = e.poison_watch();
    fs.inject(1, cursorlog_engine::Fault::Eio);
    assert!(append(&e, "s", s).is_err());
    assert!(e.is_poisoned());
    assert!(*watch.borrow_and_update());
    assert!(matches!(append(&e, "s", s), Err(Error::Poisoned)));
    assert!(matches!(e.close(), Err(Error::Poisoned)));
}
