//! Background work: producer-lease expiry, retention passes and moving the index memtable
//! into sled. The threads hold only the shared state and a sender to the writer — never the
//! engine handle — so dropping the last handle stops and joins them deterministically.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::state::StreamState;
use crate::writer::{submit, Command, Request, Shared};

/// How often committed index changes are moved from the memtable into sled (off the writer
/// thread), bounding what a restart replays from the log.
const INDEX_FLUSH_EVERY: Duration = Duration::from_millis(250);
/// How often producer leases are checked.
const LEASE_TICK: Duration = Duration::from_millis(50);

/// Producer leases: stream → lease. In memory only: after a restart every open stream with
/// a lease gets a full lease again, so a producer can reconnect.
///
/// Renewal is on every append, from many threads at once: it takes the read lock only (the
/// deadline is an atomic), and skips even that while no stream has a lease.
#[derive(Debug)]
pub(crate) struct Leases {
    map: RwLock<HashMap<u64, Lease>>,
    armed: AtomicUsize,
    /// Deadlines are nanoseconds after this instant.
    epoch: Instant,
}

#[derive(Debug)]
struct Lease {
    length: Duration,
    deadline_ns: AtomicU64,
}

impl Default for Leases {
    fn default() -> Self {
        Self {
            map: RwLock::default(),
            armed: AtomicUsize::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Leases {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<u64, Lease>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<u64, Lease>> {
        self.map.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn ns_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn deadline_ns(&self, length: Duration) -> u64 {
        self.ns_at(Instant::now())
            .saturating_add(u64::try_from(length.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Starts (or restarts) a lease of `ms` milliseconds.
    pub(crate) fn arm(&self, stream: u64, ms: u64) {
        let length = Duration::from_millis(ms);
        let lease = Lease {
            length,
            deadline_ns: AtomicU64::new(self.deadline_ns(length)),
        };
        let mut map = self.write();
        map.insert(stream, lease);
        self.armed.store(map.len(), Ordering::Release);
    }

    /// Pushes the deadline out by a full lease, if the stream has one.
    pub(crate) fn renew(&self, stream: u64) {
        if self.armed.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(lease) = self.read().get(&stream) {
            lease
                .deadline_ns
                .fetch_max(self.deadline_ns(lease.length), Ordering::AcqRel);
        }
    }

    /// Drops the lease (the stream is terminal).
    pub(crate) fn remove(&self, stream: u64) {
        let mut map = self.write();
        map.remove(&stream);
        self.armed.store(map.len(), Ordering::Release);
    }

    fn take_expired(&self, now: Instant) -> Vec<u64> {
        if self.armed.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let now = self.ns_at(now);
        let mut map = self.write();
        let ids: Vec<u64> = map
            .iter()
            .filter(|(_, l)| l.deadline_ns.load(Ordering::Acquire) <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            map.remove(id);
        }
        self.armed.store(map.len(), Ordering::Release);
        ids
    }
}

/// Aborts every stream whose producer lease ran out.
fn expire_leases(shared: &Shared, tx: &SyncSender<Request>, leases: &Leases) {
    for stream in leases.take_expired(Instant::now()) {
        let cmd = Command::Terminate {
            session: None,
            stream,
            state: StreamState::Aborted,
            expected_next_seq: None,
            reason: Some("producer lease expired".into()),
            frame: None,
        };
        match submit(tx, shared, cmd) {
            Ok(_) => tracing::info!(stream, "aborted stream: producer lease expired"),
            Err(Error::StreamTerminated { .. } | Error::UnknownStream(_)) => {}
            Err(e) => tracing::warn!(stream, error = %e, "could not abort an expired lease"),
        }
    }
}

/// Runs one retention pass through the writer.
pub(crate) fn run_retention(shared: &Shared, tx: &SyncSender<Request>) -> Result<usize> {
    crate::retention::run_pass(shared, &|cmd| submit(tx, shared, cmd).map(|_| ()))
}

/// Starts the lease and retention thread.
pub(crate) fn spawn_maintenance(
    shared: Arc<Shared>,
    tx: SyncSender<Request>,
    leases: Arc<Leases>,
    shutdown: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    let interval = shared.config.retention.check_interval;
    std::thread::Builder::new()
        .name("cursorlog-background".into())
        .spawn(move || {
            let mut last_retention = Instant::now();
            loop {
                std::thread::park_timeout(LEASE_TICK);
                if shutdown.load(Ordering::Acquire) {
                    return;
                }
                expire_leases(&shared, &tx, &leases);
                if last_retention.elapsed() >= interval {
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
