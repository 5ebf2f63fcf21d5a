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
use crate::mailbox::{submit, Command, Mailbox};
use crate::shared::Shared;
use crate::state::StreamState;

/// How often committed index changes are moved from the memtable into sled (off the writer
/// thread), bounding what a restart replays from the log.
const INDEX_FLUSH_EVERY: Duration = Duration::from_millis(250);
/// How often leases and free space are checked.
const TICK: Duration = Duration::from_millis(50);
/// Most idle sessions expired per round (the rest wait for the next round).
const IDLE_PER_ROUND: usize = 1024;

/// Aborts every stream whose producer lease ran out; returns how many.
pub(crate) fn expire_leases(shared: &Shared, tx: &Mailbox) -> usize {
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
/// returns how many.
pub(crate) fn expire_idle_sessions(shared: &Shared, tx: &Mailbox) -> usize {
    let Some(ttl) = shared.config.session_idle_ttl else {
        return 0;
    };
    let now = shared.now_ms();
    let mut n = 0;
    for (session, idle_ms) in shared.activity.idle(now, duration_ms(ttl), IDLE_PER_ROUND) {
        if shared.followers.pins(&session) {
            continue;
        }
        let cmd = Command::ExpireSession {
            session: session.clone(),
            idle_ms: Some(idle_ms),
        };
        match submit(tx, shared, cmd) {
            Ok(_) => {
                n += 1;
                tracing::info!(session, idle_ms, "expired an idle session");
            }
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
    crate::retention::run_pass(shared, &|cmd| submit(tx, shared, cmd))
}

/// Starts the maintenance thread: leases and free space every tick, idle sessions every
/// tenth of the TTL (between 100 ms and 10 s), retention every `check_interval`.
pub(crate) fn spawn_maintenance(
    shared: Arc<Shared>,
    tx: Mailbox,
    shutdown: Arc<AtomicBool>,
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
            loop {
                std::thread::park_timeout(TICK);
                if shutdown.load(Ordering::Acquire) {
                    return;
                }
                check_disk(&shared);
                expire_leases(&shared, &tx);
                if last_idle.elapsed() >= idle_every {
                    last_idle = Instant::now();
                    expire_idle_sessions(&shared, &tx);
                }
                let low = shared.low_disk.load(Ordering::Acquire);
                // Short of space, retention runs every tick: it is what frees space.
                if low || last_retention.elapsed() >= retention_every {
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
                shared.poison(&e);
            }
        })
        .map_err(Error::io("starting the index flush thread"))
}
