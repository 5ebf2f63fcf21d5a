//! The engine's state, in one place: what the writer, the readers and the background
//! threads share. The [`crate::Engine`] handle owns one; the threads hold `Arc`s of it (and
//! never the handle, so dropping the last handle stops them).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::activity::SessionActivity;
use crate::admission::Admission;
use crate::clock::{duration_ms, Clock};
use crate::config::Config;
use crate::error::Error;
use crate::followers::Followers;
use crate::index::Index;
use crate::leases::Leases;
use crate::log::{Log, Summaries};

/// Counters for stats, all incremental (a scrape reads them, it never scans).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub events_appended: AtomicU64,
    pub payload_bytes_appended: AtomicU64,
    pub fsyncs: AtomicU64,
    pub commit_batches: AtomicU64,
    pub records_written: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub last_lsn: AtomicU64,
    pub appends_refused_low_disk: AtomicU64,
    /// Index flushes that failed (the data was intact in the log; writes were refused
    /// until a flush succeeded).
    pub index_flush_failures: AtomicU64,
    pub sessions_expired_idle: AtomicU64,
    /// New sessions refused at `live_sessions_max`.
    pub sessions_refused_at_capacity: AtomicU64,
    /// Leased streams refused at `leased_streams_max`.
    pub leases_refused_at_capacity: AtomicU64,
    /// Free bytes at the last check; `u64::MAX` before the first.
    pub disk_free_bytes: AtomicU64,
}

/// State shared between the writer thread, readers and background threads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: Config,
    pub clock: Arc<dyn Clock>,
    pub index: Index,
    pub log: Arc<Log>,
    pub poisoned: AtomicBool,
    pub counters: Counters,
    /// Retention's per-segment summaries (sealed segments never change).
    pub summaries: Summaries,
    /// Turns true (once, for good) when the engine is poisoned, for whoever must react at
    /// once: the server's health status, a supervisor.
    pub poison_signal: tokio::sync::watch::Sender<bool>,
    /// The writer queue's byte budget.
    pub admission: Admission,
    /// Live readers waiting for commits, by stream.
    pub followers: Arc<Followers>,
    /// When each live session was last named by a call (for the idle TTL).
    pub activity: SessionActivity,
    /// Producer leases of open streams.
    pub leases: Leases,
    /// Worker leases of running tasks (leader-only memory, like `leases`).
    pub task_leases: Leases,
    /// Set when free space is below the reserve: appends are refused.
    pub low_disk: AtomicBool,
    /// One retention pass at a time.
    pub retention_lock: std::sync::Mutex<()>,
    /// Lease and idle expiry passes take turns (the background thread's and
    /// `Engine::run_maintenance`'s): when a pass returns, whatever an earlier pass took is
    /// committed, so its effects are visible.
    pub maintenance_lock: std::sync::Mutex<()>,
    /// Set by a simulated crash (tests): the writer stops without the shutdown marker, the
    /// final sync or the index flush, as a killed process would.
    pub crashed: AtomicBool,
}

impl Shared {
    /// An engine's shared state over `index` and `log`, nothing armed, nothing counted
    /// yet (the single-node open and a replica's).
    pub(crate) fn new(config: Config, index: Index, log: Arc<Log>) -> Self {
        Self {
            clock: Arc::clone(&config.clock),
            admission: Admission::new(config.writer_queue_bytes_max),
            config,
            index,
            log,
            poisoned: false.into(),
            counters: Counters::default(),
            summaries: Summaries::default(),
            poison_signal: tokio::sync::watch::channel(false).0,
            followers: Arc::new(Followers::default()),
            activity: SessionActivity::default(),
            leases: Leases::default(),
            task_leases: Leases::default(),
            low_disk: AtomicBool::new(false),
            retention_lock: std::sync::Mutex::new(()),
            maintenance_lock: std::sync::Mutex::new(()),
            crashed: AtomicBool::new(false),
        }
    }

    /// Refuses every later write until the engine is reopened (recovery repairs what a
    /// failed write or fsync left), and says so: the log, the poison signal.
    pub(crate) fn poison(&self, e: &Error) {
        tracing::error!(
            error = %e,
            "write path failed; the engine refuses every write until it is reopened \
             (restart the server: recovery repairs the log)"
        );
        self.poisoned.store(true, Ordering::Release);
        self.poison_signal.send_replace(true);
    }

    /// Now, by the engine's clock.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The metadata horizon in ms.
    pub(crate) fn horizon_ms(&self) -> u64 {
        duration_ms(self.config.retention.metadata_horizon)
    }
}
