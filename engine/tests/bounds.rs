//! Live state has a hard bound: idle expiry cannot be starved by sessions followers pin, and
//! the caps on live sessions and leased streams refuse with `AtCapacity`, exactly at the cap.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{
    Config, Engine, Error, LiveLimit, ManualClock, NewEvent, OpenStream, SyncPolicy,
};

const T0: u64 = 1_800_000_000_000;
const TTL: Duration = Duration::from_secs(60);

fn config(dir: &Path, clock: &Arc<ManualClock>) -> Config {
    let mut c = Config::new(dir);
    c.sync = SyncPolicy::Never;
    c.clock = Arc::clone(clock) as _;
    c.session_idle_ttl = Some(TTL);
    c.retention.max_age = None;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c.disk_reserve_bytes = 0;
    // Each test's own maintenance passes count what they expire: no background pass races them.
    c.background_expiry = false;
    c
}

fn open_stream(e: &Engine, session: &str, lease_ms: Option<u64>) -> Result<u64, Error> {
    let epoch = e.open_session(session)?.epoch;
    e.open_stream(OpenStream {
        session: session.into(),
        epoch,
        correlation: None,
        lease_ms,
    })
    .map(|s| s.stream)
}

fn expired(e: &Engine, session: &str) -> bool {
    e.session(session).unwrap().expect("remembered").expired
}

/// 1,100 idle sessions held by a follower each (more than one expiry round takes) beside
/// 100 idle ones nobody holds: a few rounds expire all 100 and none of the held ones.
/// Before the fix every round took the same 1,024 idle sessions, most of them pinned, and
/// skipped those: the free ones hashed after them never expired.
#[test]
fn sessions_pinned_by_followers_never_starve_the_expiry_of_the_others() {
    const PINNED: usize = 1100;
    const FREE: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(config(dir.path(), &clock)).unwrap();
    let followers: Vec<_> = (0..PINNED)
        .map(|i| {
            let session = format!("pinned-{i}");
            let stream = open_stream(&e, &session, None).unwrap();
            e.follow(&session, stream, 0).unwrap()
        })
        .collect();
    for i in 0..FREE {
        e.open_session(&format!("free-{i}")).unwrap();
    }
    clock.advance(TTL + Duration::from_secs(1));
    let mut total = 0;
    for _ in 0..3 {
        total += e.run_maintenance().unwrap().1;
    }
    assert_eq!(
        total, FREE,
        "every free idle session expired, no pinned one"
    );
    let stats = e.stats().unwrap();
    assert_eq!(stats.live_sessions, PINNED as u64);
    assert_eq!(stats.sessions_expired_idle, FREE as u64);
    assert!((0..FREE).all(|i| expired(&e, &format!("free-{i}"))));
    drop(followers);
}

/// At `live_sessions_max` a new session is refused, naming the cap; an existing one still
/// opens; once one expires a new one fits. Opened from many threads at once (so several
/// land in one group commit), exactly the cap's worth succeed.
#[test]
fn the_live_session_cap_refuses_exactly_at_the_cap() {
    const MAX: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let mut c = config(dir.path(), &clock);
    c.live_sessions_max = MAX;
    let e = Engine::open(c).unwrap();
    let (opened, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..8 {
            let (e, opened, refused) = (&e, &opened, &refused);
            s.spawn(move || {
                for i in 0..5 {
                    match e.open_session(&format!("s-{t}-{i}")) {
                        Ok(_) => opened.fetch_add(1, Ordering::Relaxed),
                        Err(Error::AtCapacity {
                            limit: LiveLimit::Sessions,
                            max: MAX,
                        }) => refused.fetch_add(1, Ordering::Relaxed),
                        Err(other) => panic!("{other}"),
                    };
                }
            });
        }
    });
    assert_eq!(opened.load(Ordering::Relaxed), MAX);
    assert_eq!(refused.load(Ordering::Relaxed), 40 - MAX);
    let err = e.open_session("one-more").unwrap_err();
    assert!(
        err.to_string().contains("live_sessions_max") && err.to_string().contains("20"),
        "{err}"
    );
    let live = (0..8)
        .flat_map(|t| (0..5).map(move |i| format!("s-{t}-{i}")))
        .find(|s| e.session(s).unwrap().is_some())
        .unwrap();
    assert!(
        !e.open_session(&live).unwrap().created,
        "an existing one still opens"
    );
    let stats = e.stats().unwrap();
    assert_eq!((stats.live_sessions, stats.live_sessions_max), (MAX, MAX));
    assert_eq!(stats.sessions_refused_at_capacity, 40 - MAX + 1);

    e.expire_session(&live).unwrap();
    assert!(e.open_session("one-more").unwrap().created);
    assert!(matches!(
        e.open_session("two-more"),
        Err(Error::AtCapacity { .. })
    ));
}

/// At `leased_streams_max` a stream with a lease is refused (one without still opens); a
/// leased stream that ends frees its place.
#[test]
fn the_leased_stream_cap_refuses_exactly_at_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let mut c = config(dir.path(), &clock);
    c.leased_streams_max = 2;
    let e = Engine::open(c).unwrap();
    let first = open_stream(&e, "a", Some(10_000)).unwrap();
    open_stream(&e, "b", Some(10_000)).unwrap();
    let err = open_stream(&e, "c", Some(10_000)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::AtCapacity {
                limit: LiveLimit::LeasedStreams,
                max: 2
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("leased_streams_max"), "{err}");
    open_stream(&e, "c", None).expect("a lease-less stream does not count");
    let stats = e.stats().unwrap();
    assert_eq!(
        (
            stats.leased_streams,
            stats.leased_streams_max,
            stats.leases_refused_at_capacity
        ),
        (2, 2, 1)
    );

    e.complete("a", first, None, NewEvent::new("result", b"done".to_vec()))
        .unwrap();
    open_stream(&e, "d", Some(10_000)).expect("an ended leased stream frees its place");
    // A lease that runs out ends its stream and frees its place too.
    clock.advance(Duration::from_secs(11));
    assert_eq!(e.run_maintenance().unwrap().0, 2);
    open_stream(&e, "e", Some(10_000)).unwrap();
    open_stream(&e, "f", Some(10_000)).unwrap();
}
