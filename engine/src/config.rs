//! Engine configuration: durability, segment size, limits and retention, all with units.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};

/// When an append is made durable relative to its acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// `fdatasync` before any acknowledgement: an acknowledged append survives power loss.
    #[default]
    Always,
    /// Acknowledge after the write; sync at least every this many milliseconds. A power loss
    /// can lose at most the last interval of acknowledged appends; a process crash loses none.
    Interval(u64),
    /// Never sync on the write path (segments are still synced when sealed and on close).
    /// A process crash loses nothing; a power loss can lose anything not yet written back.
    Never,
}

impl std::str::FromStr for SyncPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => match other
                .strip_prefix("interval:")
                .or_else(|| other.strip_suffix("ms"))
            {
                Some(ms) => ms
                    .trim_start_matches("interval:")
                    .parse::<u64>()
                    .map(Self::Interval)
                    .map_err(|_| format!("bad sync interval {other:?}: expected e.g. interval:5")),
                None => Err(format!(
                    "unknown sync policy {other:?}: expected always, interval:<ms> or never"
                )),
            },
        }
    }
}

impl std::fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Always => f.write_str("always"),
            Self::Interval(ms) => write!(f, "interval:{ms}"),
            Self::Never => f.write_str("never"),
        }
    }
}

/// What is kept and for how long. `None` disables a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Events older than this are evicted (whole segments at a time). Default 24 h: a
    /// cursor older than that resolves `CURSOR_EVICTED`, explicitly.
    pub max_age: Option<Duration>,
    /// The log is kept below this many bytes by evicting the oldest segments.
    pub max_total_bytes: Option<u64>,
    /// Each stream keeps at most this many of its newest events.
    pub max_events_per_stream: Option<u64>,
    /// How long the metadata of a terminated stream or an expired session (state, tombstone,
    /// watermark, outcome) is remembered after it ended, so late cursors still get
    /// `STREAM_TERMINATED` / `CURSOR_EVICTED` rather than `UNKNOWN_*`.
    pub metadata_horizon: Duration,
    /// How often the background retention pass runs.
    pub check_interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_age: Some(Duration::from_secs(24 * 3600)),
            max_total_bytes: None,
            max_events_per_stream: None,
            metadata_horizon: Duration::from_secs(24 * 3600),
            check_interval: Duration::from_secs(10),
        }
    }
}

/// Limits and defaults of durable MCP tasks (docs/TASKS-DESIGN.md §1.7, §1.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLimits {
    /// A task created without a TTL lives this long. Default 1 h.
    pub ttl_default: Duration,
    /// Longest TTL granted: a longer (or unlimited) one is clamped to it, and the task says
    /// which it got (the protocol lets the receiver choose). Default 24 h.
    pub ttl_max: Duration,
    /// The poll interval a task gets when its creator names none. Default 1 s (the SDKs').
    pub poll_interval_default: Duration,
    /// Most tasks one owner may have that are not deleted: one more is refused with
    /// [`crate::Error::AtCapacity`] until some expire or are deleted. Default 10,000.
    pub per_owner_max: u64,
    /// Most tasks, all owners together, that are not deleted. Default 1,000,000.
    pub tasks_max: u64,
    /// Largest opaque context a task keeps (the request that created it), in bytes.
    /// Default 64 KiB.
    pub context_bytes_max: u32,
    /// Largest status message, in bytes. Default 4 KiB.
    pub status_message_bytes_max: u32,
    /// Most bytes of input requests and answers one task may hold over its life (they are
    /// kept until it is deleted, and carried forward with it). Default 4 MiB.
    pub input_bytes_max: u32,
    /// Largest result or error a task ends with, in bytes. Default 1 MiB.
    pub outcome_bytes_max: u32,
    /// Most messages one of a task's queues holds (an enqueuer's own `max_len` may be
    /// lower). Default 1024.
    pub queue_len_max: u32,
    /// Most bytes of messages one of a task's queues holds. Default 1 MiB (a task's whole
    /// state, both queues and their last batches included, must fit one record).
    pub queue_bytes_max: u32,
}

impl Default for TaskLimits {
    fn default() -> Self {
        Self {
            ttl_default: Duration::from_secs(3600),
            ttl_max: Duration::from_secs(24 * 3600),
            poll_interval_default: Duration::from_secs(1),
            per_owner_max: 10_000,
            tasks_max: 1_000_000,
            context_bytes_max: 64 * 1024,
            status_message_bytes_max: 4 * 1024,
            input_bytes_max: 4 * 1024 * 1024,
            outcome_bytes_max: 1024 * 1024,
            queue_len_max: 1024,
            queue_bytes_max: 1024 * 1024,
        }
    }
}

/// Engine configuration. [`Config::new`] gives production defaults for a directory.
#[derive(Debug, Clone)]
pub struct Config {
    /// The data directory (created if missing).
    pub dir: PathBuf,
    /// Durability of acknowledged appends.
    pub sync: SyncPolicy,
    /// A segment is sealed and a new one started once it reaches this many bytes.
    pub segment_bytes_max: u64,
    /// Largest accepted event payload, in bytes.
    pub payload_bytes_max: u32,
    /// Most events accepted in one append call.
    pub batch_events_max: u32,
    /// Largest accepted session id, correlation id or event kind, in bytes.
    pub id_bytes_max: u32,
    /// Most events returned by one read call.
    pub read_events_max: u32,
    /// Largest opaque session state (`open_session_with_state`), in bytes.
    pub session_state_bytes_max: u32,
    /// A session that no call names for this long is expired (its open streams end); `None`
    /// keeps idle sessions forever. Renewed by every call naming the session and held off
    /// while a follower of one of its streams is open.
    pub session_idle_ttl: Option<Duration>,
    /// Most open streams one session may have (bounds the group that ends them all).
    pub open_streams_per_session_max: u32,
    /// Most live (not expired) sessions: opening one more is refused with
    /// [`crate::Error::AtCapacity`] until some expire. A hard bound on the memory live state
    /// holds, which otherwise grows with sessions nobody expires (MCP clients rarely send
    /// `DELETE`) and whose idle TTL a follower holds off.
    ///
    /// Default 1,000,000: a live idle session with an open stream costs ~1.9 KiB of resident
    /// memory (measured: 1,929 bytes each at 100,000, the `session_memory` example), so a
    /// full table is ~1.8 GiB — under a tenth of a 24 GiB machine, leaving the rest to
    /// followers, the read path and the page cache that serves the log. One idle scan of a
    /// million entries takes tens of milliseconds, at most every tenth of the TTL.
    pub live_sessions_max: u64,
    /// Most open streams holding a producer lease: opening one more with a lease is refused
    /// with [`crate::Error::AtCapacity`]. Leases live in memory and the lease check visits
    /// all of them every 50 ms, so this bounds that work as well as the memory.
    ///
    /// Default 100,000: ~40 bytes of lease each (4 MiB in all) beside the stream's own state,
    /// and a check of all of them takes well under a millisecond per 50 ms tick. Lease-less
    /// streams (the usual MCP case) do not count.
    pub leased_streams_max: u64,
    /// Free space to keep on the data directory's file system, in bytes: below it appends
    /// are refused (`DiskFull`) while reads, verdicts and retention go on, so retention can
    /// always write what it needs to free space. 0 disables the check.
    pub disk_reserve_bytes: u64,
    /// Memory the index store may use for its page cache, in bytes.
    pub index_cache_bytes: u64,
    /// Bytes of requests the writer's queue holds before callers wait (back-pressure).
    pub writer_queue_bytes_max: u64,
    /// The clock every time-based decision uses (record times, leases, TTLs, horizon,
    /// retention by age). Tests inject a [`crate::ManualClock`].
    pub clock: Arc<dyn Clock>,
    /// Retention rules.
    pub retention: Retention,
    /// Whether the background thread expires producer leases and idle sessions (every 50 ms
    /// and every tenth of the TTL). `false` leaves both to [`crate::Engine::run_maintenance`]:
    /// for tests that move a [`crate::ManualClock`] and count what each pass expired, which a
    /// background pass would otherwise race. Free-space checks and retention run either way.
    pub background_expiry: bool,
    /// Durable MCP tasks: limits and defaults.
    pub tasks: TaskLimits,
}

impl Config {
    /// Defaults: sync `Always`, 64 MiB segments, 1 MiB payloads, 1024 events a batch.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            sync: SyncPolicy::Always,
            segment_bytes_max: 64 * 1024 * 1024,
            payload_bytes_max: 1024 * 1024,
            batch_events_max: 1024,
            id_bytes_max: 256,
            read_events_max: 4096,
            session_state_bytes_max: 64 * 1024,
            session_idle_ttl: Some(Duration::from_secs(3600)),
            open_streams_per_session_max: 1024,
            live_sessions_max: 1_000_000,
            leased_streams_max: 100_000,
            disk_reserve_bytes: 256 * 1024 * 1024,
            index_cache_bytes: 64 * 1024 * 1024,
            writer_queue_bytes_max: 64 * 1024 * 1024,
            clock: Arc::new(SystemClock),
            retention: Retention::default(),
            background_expiry: true,
            tasks: TaskLimits::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_policy_parses_and_prints() {
        for p in [
            SyncPolicy::Always,
            SyncPolicy::Never,
            SyncPolicy::Interval(5),
        ] {
            assert_eq!(p.to_string().parse::<SyncPolicy>(), Ok(p));
        }
        assert_eq!("10ms".parse::<SyncPolicy>(), Ok(SyncPolicy::Interval(10)));
        assert!("sometimes".parse::<SyncPolicy>().is_err());
        assert!("interval:x".parse::<SyncPolicy>().is_err());
    }
}
