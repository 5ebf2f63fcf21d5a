//! Background work: producer-lease expiry, idle-session expiry, the free-space check,
//! retention passes (with forgetting past the horizon) and moving the index memtable into
//! sled. The threads hold only the shared state and a mailbox to the writer — never the
//! engine handle — so dropping the last handle stops and joins them deterministically.
//!
//! Each job is also a plain function, so a test with a [`crate::ManualClock`] can run a
//! round of it at once instead of waiting for the thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::duration_ms;
use crate::error::{Error, Result};
use crate::index::{prefix, KvRead};
use crate::mailbox::{send, submit, wait, Command, Mailbox, Reply};
use crate::member::Replica;
use crate::propose::Proposer;
use crate::shared::Shared;
use crate::state::StreamState;

mod tasks;
pub(crate) use tasks::{expire_task_leases, expire_tasks, renew_task_lease, running_task_ids};

/// How often committed index changes are moved from the memtable into sled (off the writer
/// thread), bounding what a restart replays from the log.
const INDEX_FLUSH_EVERY: Duration = Duration::from_millis(250);
/// How often leases and free space are checked.
const TICK: Duration = Duration::from_millis(50);
/// Most idle sessions expired per round (the rest wait for the next round, which comes at
/// the next tick when this one was full).
const IDLE_PER_ROUND: usize = 1024;

/// Aborts every stream whose producer lease ran out; returns how many.
pub(crate) fn expire_leases(shared: &Shared, tx: &Mailbox) -> usize {
    let _turn = shared
        .maintenance_lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let expired = shared.leases.take_expired(shared.now_ms());
    let mut n = 0;
    for stream in expired {
        let cmd = Command::Terminate {
            session: None,
            stream,
            state: StreamState::Aborted,
            expected_next_seq: None,
            reason: Some("producer lease expired".into()),
            frame: None,
        };
        match submit(tx, shared, cmd) {
            Ok(_) => {
                n += 1;
                tracing::info!(stream, "aborted stream: producer lease expired");
            }
            Err(Error::StreamTerminated { .. } | Error::UnknownStream(_)) => {}
            Err(e) => tracing::warn!(stream, error = %e, "could not abort an expired lease"),
        }
    }
    n
}

/// Expires the sessions no call named for the idle TTL (a follower pins its session);
/// returns how many. One round takes at most [`IDLE_PER_ROUND`] of them.
pub(crate) fn expire_idle_sessions(shared: &Shared, tx: &Mailbox) -> usize {
    let _turn = shared
        .maintenance_lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let found = scan_idle_sessions(shared);
    commit_idle_expiries(shared, tx, found)
}

/// The sessions idle for the TTL now and not pinned by a follower, at most
/// [`IDLE_PER_ROUND`], with the expiry command of each. Pinned sessions are passed over
/// before the batch is cut, so they cannot crowd the others out however many there are.
pub(crate) fn scan_idle_sessions(shared: &Shared) -> Vec<Command> {
    let Some(ttl) = shared.config.session_idle_ttl else {
        return Vec::new();
    };
    let followers = &shared.followers;
    shared
        .activity
        .idle(shared.now_ms(), duration_ms(ttl), IDLE_PER_ROUND, |s| {
            followers.pins(s)
        })
        .into_iter()
        .map(|(session, idle_ms)| Command::ExpireSession {
            session,
            idle_ms: Some(idle_ms),
        })
        .collect()
}

/// Sends the expiries a scan decided, all at once (the writer groups them), and waits for
/// each; returns how many sessions expired. The writer checks each session again when it
/// plans the expiry and keeps one that a call named, or a follower pinned, since the scan.
pub(crate) fn commit_idle_expiries(shared: &Shared, tx: &Mailbox, cmds: Vec<Command>) -> usize {
    let mut sent = Vec::with_capacity(cmds.len());
    for cmd in cmds {
        let Command::ExpireSession { session, idle_ms } = &cmd else {
            continue;
        };
        let (session, idle_ms) = (session.clone(), idle_ms.unwrap_or(0));
        match send(tx, shared, cmd) {
            Ok(reply) => sent.push((session, idle_ms, reply)),
            Err(e) => {
                tracing::warn!(session, error = %e, "could not expire an idle session");
                break;
            }
        }
    }
    let mut n = 0;
    for (session, idle_ms, reply) in sent {
        match wait(&reply) {
            Ok(Reply::Expired(_)) => {
                n += 1;
                tracing::info!(session, idle_ms, "expired an idle session");
            }
            Ok(_) => tracing::debug!(session, "idle session was active again; kept"),
            Err(Error::UnknownSession | Error::SessionExpired) => shared.activity.remove(&session),
            Err(e) => tracing::warn!(session, error = %e, "could not expire an idle session"),
        }
    }
    n
}

/// Reads the free space on the data directory's file system and refuses appends below the
/// reserve (or lets them in again above it).
pub(crate) fn check_disk(shared: &Shared) {
    let reserve = shared.config.disk_reserve_bytes;
    if reserve == 0 {
        shared.low_disk.store(false, Ordering::Release);
        return;
    }
    match shared.log.fs().available_bytes(shared.log.dir()) {
        Ok(free) => {
            shared
                .counters
                .disk_free_bytes
                .store(free, Ordering::Release);
            let low = free < reserve;
            let was = shared.low_disk.swap(low, Ordering::AcqRel);
            if low && !was {
                tracing::warn!(
                    free,
                    reserve,
                    "free disk space is below the reserve: refusing appends until retention or an operator frees space"
                );
            } else if !low && was {
                tracing::info!(
                    free,
                    reserve,
                    "free disk space is back above the reserve: accepting appends"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the free disk space"),
    }
}

/// Runs one retention pass through the writer; returns the segments retired.
pub(crate) fn run_retention(shared: &Shared, tx: &Mailbox) -> Result<usize> {
    crate::retention::run_pass(shared, &|cmd| submit(tx, shared, cmd), false)
}

/// Runs one retention pass on a cluster member: the leader (`leads`) decides and proposes
/// what to evict, carry forward and forget; then every member unlinks its segments that a
/// snapshot covers and nothing retained needs (`member.rs`). Returns the segments
/// unlinked here.
pub(crate) fn run_member_retention(
    shared: &Shared,
    tx: &Mailbox,
    replica: &Replica,
    leads: bool,
) -> Result<usize> {
    if leads {
        crate::retention::run_pass(shared, &|cmd| submit(tx, shared, cmd), true)?;
    }
    crate::member::retire_purged(shared, replica)
}

/// Starts the maintenance thread: leases and free space every tick, idle sessions every
/// tenth of the TTL (between 100 ms and 10 s), retention every `check_interval`.
///
/// On a replicated node (`cluster` is its proposer and its replica side) only the leader
/// decides expiries: the others skip those rounds, and a node that becomes leader first
/// re-arms sessions' idle clocks and streams' leases from its index (they are leader-only
/// memory, started afresh at the moment it took over). Retention runs on every member
/// ([`run_member_retention`]): the leader decides, each member unlinks its own segments.
pub(crate) fn spawn_maintenance(
    shared: Arc<Shared>,
    tx: Mailbox,
    shutdown: Arc<AtomicBool>,
    cluster: Option<(Arc<dyn Proposer>, Arc<Replica>)>,
) -> Result<JoinHandle<()>> {
    let retention_every = shared.config.retention.check_interval;
    let idle_every = shared
        .config
        .session_idle_ttl
        .map_or(Duration::from_secs(10), |t| {
            (t / 10).clamp(Duration::from_millis(100), Duration::from_secs(10))
        });
    std::thread::Builder::new()
        .name("cursorlog-background".into())
        .spawn(move || {
            let mut last_retention = Instant::now();
            let mut last_idle = Instant::now();
            let mut idle_backlog = false;
            let mut leading = false;
            loop {
                std::thread::park_timeout(TICK);
                if shutdown.load(Ordering::Acquire) {
                    return;
                }
                check_disk(&shared);
                let low = shared.low_disk.load(Ordering::Acquire);
                // Short of space, retention runs every tick: it is what frees space.
                let retention_due = low || last_retention.elapsed() >= retention_every;
                if let Some((cluster, replica)) = &cluster {
                    let leads = cluster.leads();
                    if retention_due {
                        last_retention = Instant::now();
                        if let Err(e) = run_member_retention(&shared, &tx, replica, leads) {
                            tracing::warn!(error = %e, "retention pass failed; will retry");
                        }
                    }
                    if leads && !leading {
                        // The previous term's tail commits with this term's first entry, after
                        // this node became leader: a ReadIndex round (the writer's own, if it
                        // ran one this term) applies it first, so what it opened is armed too
                        // (issue 30 item 3, review R6).
                        if let Err(not) = cluster.prepare() {
                            tracing::debug!(outcome = ?not, "not arming leases yet: this term's leadership is not confirmed");
                            continue;
                        }
                        if let Err(e) = arm_live_state(&shared) {
                            tracing::warn!(error = %e, "re-arming leases and idle clocks as the new leader failed; retrying");
                            continue;
                        }
                        tracing::info!("leading: deciding lease and idle expiries from now on");
                    }
                    if leading && !leads {
                        // Another node decides now, from calls this one no longer sees: what
                        // this one remembers would be stale if it led again.
                        shared.leases.clear();
                        shared.task_leases.clear();
                        shared.activity.clear();
                        tracing::info!("no longer leading: lease and idle expiries are the new leader's");
                    }
                    leading = leads;
                    if !leads {
                        continue;
                    }
                }
                let expiry = shared.config.background_expiry;
                if expiry {
                    expire_leases(&shared, &tx);
                    expire_task_leases(&shared, &tx);
                    if let Err(e) = expire_tasks(&shared, &tx) {
                        tracing::warn!(error = %e, "the task TTL pass failed; will retry");
                    }
                }
                if expiry && (idle_backlog || last_idle.elapsed() >= idle_every) {
                    last_idle = Instant::now();
                    // A full round leaves more behind: the next one runs at the next tick.
                    let _turn = shared
                        .maintenance_lock
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let found = scan_idle_sessions(&shared);
                    idle_backlog = found.len() >= IDLE_PER_ROUND;
                    commit_idle_expiries(&shared, &tx, found);
                }
                if cluster.is_none() && retention_due {
                    last_retention = Instant::now();
                    if let Err(e) = run_retention(&shared, &tx) {
                        tracing::warn!(error = %e, "retention pass failed; will retry");
                    }
                }
            }
        })
        .map_err(Error::io("starting the background thread"))
}

/// Starts the thread that moves the index memtable into sled.
pub(crate) fn spawn_index_flusher(
    shared: Arc<Shared>,
    shutdown: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("cursorlog-index".into())
        .spawn(move || loop {
            std::thread::park_timeout(INDEX_FLUSH_EVERY);
            if shutdown.load(Ordering::Acquire) {
                return;
            }
            if shared.poisoned.load(Ordering::Acquire) || shared.index.memtable_len() == 0 {
                continue;
            }
            if let Err(e) = shared.index.flush_memtable() {
                // Everything is in the log and in memory: nothing is lost. Refuse writes as
                // on a full disk (the index's store shares the disk) and try again later.
                tracing::warn!(error = %e, "the index could not be flushed: refusing appends until it can");
                shared.low_disk.store(true, Ordering::Release);
                shared
                    .counters
                    .index_flush_failures
                    .fetch_add(1, Ordering::Relaxed);
            }
        })
        .map_err(Error::io("starting the index flush thread"))
}

/// Starts the time-driven state of what recovery found live: a full idle TTL for every live
/// session, a full lease for every open stream and running task with one (a producer gets a full lease to
/// reconnect after a restart). A lease already armed keeps its deadline. A replicated node
/// calls it again each time it becomes the leader. Costs O(live sessions + open streams),
/// scanned, not loaded.
pub(crate) fn arm_live_state(shared: &Shared) -> Result<()> {
    let now = shared.now_ms();
    shared
        .index
        .for_each_with_prefix(&[prefix::SESSION], |k, _| {
            if let Some(s) = shared.index.stored_session(
                std::str::from_utf8(k.get(1..).unwrap_or_default()).unwrap_or_default(),
            )? {
                if s.meta.expired_at_ms.is_none() {
                    shared.activity.insert(&s.meta.id, now);
                }
            }
            Ok(())
        })?;
    for id in open_stream_ids(shared)? {
        if let Some(s) = shared.index.stored_stream(id)? {
            if let (StreamState::Open, Some(ms)) = (s.meta.state, s.meta.lease_ms) {
                shared.leases.arm_missing(id, ms, now);
            }
        }
    }
    tasks::arm_task_leases(shared)
}

/// Every open stream's id (the `L` keys end with it): O(open streams).
pub(crate) fn open_stream_ids(shared: &Shared) -> Result<Vec<u64>> {
    let mut open = Vec::new();
    shared
        .index
        .for_each_with_prefix(&[prefix::OPEN_STREAM], |k, _| {
            if let Some(id) = k
                .len()
                .checked_sub(8)
                .and_then(|at| k.get(at..))
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
            {
                open.push(id);
            }
            Ok(())
        })?;
    Ok(open)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{Config, Engine, ManualClock, OpenStream};

    const T0: u64 = 1_800_000_000_000;
    const TTL: Duration = Duration::from_secs(60);

    fn engine(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Engine {
        let mut c = Config::new(dir);
        c.clock = Arc::clone(clock) as _;
        c.session_idle_ttl = Some(TTL);
        c.disk_reserve_bytes = 0;
        // Only this test's own scan and commit expire anything.
        c.background_expiry = false;
        Engine::open(c).unwrap()
    }

    fn live(e: &Engine, session: &str) -> bool {
        e.session(session).unwrap().is_some_and(|s| !s.expired)
    }

    /// A call or a follower that arrives after the scan picked a session, but before its
    /// expiry is planned, keeps the session: the writer checks again.
    #[test]
    fn activity_between_the_scan_and_the_commit_keeps_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(T0));
        let e = engine(dir.path(), &clock);
        let epoch = e.open_session("touched").unwrap().epoch;
        e.open_session("followed").unwrap();
        let stream = e
            .open_stream(OpenStream {
                session: "followed".into(),
                epoch,
                correlation: None,
                lease_ms: None,
            })
            .unwrap()
            .stream;
        e.open_session("idle").unwrap();
        clock.advance(TTL + Duration::from_secs(1));
        let shared = &e.inner.shared;
        let tx = e.sender().unwrap();

        let found = scan_idle_sessions(shared);
        assert_eq!(found.len(), 3, "{found:?}");
        // Between the scan and the commit: a call names one, a follower pins another.
        e.touch_session("touched").unwrap();
        let follower = e.follow("followed", stream, 0).unwrap();
        assert_eq!(commit_idle_expiries(shared, &tx, found), 1);
        assert!(
            live(&e, "touched"),
            "a call after the scan keeps its session"
        );
        assert!(
            live(&e, "followed"),
            "a follower after the scan keeps its session"
        );
        assert!(!live(&e, "idle"));
        assert_eq!(e.stats().unwrap().sessions_expired_idle, 1);

        // Both are expired once idle for a whole TTL again.
        drop(follower);
        clock.advance(TTL);
        assert_eq!(expire_idle_sessions(shared, &tx), 2);
        assert!(!live(&e, "touched") && !live(&e, "followed"));
    }
}
