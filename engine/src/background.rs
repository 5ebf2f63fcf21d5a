//! Background work: producer-lease expiry, retention passes and moving the index memtable
//! into sled. The threads hold only the shared state and a sender to the writer — never the
//! engine handle — so dropping the last handle stops and joins them deterministically.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
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

/// Producer leases: stream → (lease length, deadline). In memory only: after a restart every
/// open stream with a lease gets a full lease again, so a producer can reconnect.
#[derive(Debug, Default)]
pub(crate) struct Leases(Mutex<HashMap<u64, (Duration, Instant)>>);

impl Leases {
    fn map(&self) -> MutexGuard<'_, HashMap<u64, (Duration, Instant)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts (or restarts) a lease of `ms` milliseconds.
    pub(crate) fn arm(&self, stream: u64, ms: u64) {
        let d = Duration::from_millis(ms);
        self.map().insert(stream, (d, Instant::now() + d));
    }

    /// Pushes the deadline out by a full lease, if the stream has one.
    pub(crate) fn renew(&self, stream: u64) {
        if let Some((d, at)) = self.map().get_mut(&stream) {
            *at = Instant::now() + *d;
        }
    }

    /// Drops the lease (the stream is terminal).
    pub(crate) fn remove(&self, stream: u64) {
        self.map().remove(&stream);
    }

    fn take_expired(&self, now: Instant) -> Vec<u64> {
        let mut map = self.map();
        let ids: Vec<u64> = map
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            map.remove(id);
        }
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
                tracing::error!(error = %e, "index flush failed; engine poisoned until reopened");
                shared.poisoned.store(true, Ordering::Release);
            }
        })
        .map_err(Error::io("starting the index flush thread"))
}
