//! Prometheus text metrics: server-side counters plus the engine's own statistics (served
//! over HTTP by [`crate::metrics_http`]).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cursorlog_engine::{Stats, Verdict};

use crate::read_slots::ReadSlots;

/// Counters the server keeps itself (the engine keeps the storage ones).
#[derive(Debug)]
pub struct Metrics {
    verdicts: [AtomicU64; Verdict::ALL.len()],
    active_followers: AtomicU64,
    follows_started: AtomicU64,
    /// The Read call slots (active and refused calls).
    pub reads: Arc<ReadSlots>,
}

impl Metrics {
    /// Counters for a server admitting `read_calls_max` concurrent Read calls.
    pub fn new(read_calls_max: u32) -> Self {
        Self {
            verdicts: Default::default(),
            active_followers: AtomicU64::new(0),
            follows_started: AtomicU64::new(0),
            reads: ReadSlots::new(read_calls_max),
        }
    }

    /// Counts one verdict handed out (by Resolve or Read).
    pub fn record_verdict(&self, verdict: Verdict) {
        if let Some(counter) = Verdict::ALL
            .iter()
            .position(|v| *v == verdict)
            .and_then(|i| self.verdicts.get(i))
        {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many of `verdict` were handed out.
    pub fn verdicts(&self, verdict: Verdict) -> u64 {
        Verdict::ALL
            .iter()
            .position(|v| *v == verdict)
            .and_then(|i| self.verdicts.get(i))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Read calls currently following a stream live.
    pub fn active_followers(&self) -> u64 {
        self.active_followers.load(Ordering::Relaxed)
    }

    /// Registers a live follower until the guard is dropped.
    pub fn follower(self: &Arc<Self>) -> FollowerGuard {
        self.active_followers.fetch_add(1, Ordering::Relaxed);
        self.follows_started.fetch_add(1, Ordering::Relaxed);
        FollowerGuard {
            metrics: Arc::clone(self),
        }
    }

    /// Renders the Prometheus text exposition format (version 0.0.4).
    pub fn render(&self, stats: &Stats) -> String {
        let mut out = String::with_capacity(4096);
        let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        metric(
            "cursorlog_events_appended_total",
            "counter",
            "Events appended since start.",
            stats.events_appended,
        );
        metric(
            "cursorlog_payload_bytes_appended_total",
            "counter",
            "Event payload bytes appended since start.",
            stats.payload_bytes_appended,
        );
        metric(
            "cursorlog_fsyncs_total",
            "counter",
            "fdatasync calls on the write path since start.",
            stats.fsyncs,
        );
        metric(
            "cursorlog_commit_batches_total",
            "counter",
            "Group commits since start; records_written_total / commit_batches_total is the mean batch size.",
            stats.commit_batches,
        );
        metric(
            "cursorlog_records_written_total",
            "counter",
            "Log records written since start.",
            stats.records_written,
        );
        metric(
            "cursorlog_segments",
            "gauge",
            "Segment files in the log.",
            stats.segments,
        );
        metric(
            "cursorlog_log_bytes",
            "gauge",
            "Bytes in all segment files.",
            stats.log_bytes,
        );
        metric(
            "cursorlog_segments_deleted_total",
            "counter",
            "Segments deleted by retention since start.",
            stats.segments_deleted,
        );
        metric(
            "cursorlog_sessions",
            "gauge",
            "Sessions remembered.",
            stats.sessions,
        );
        metric(
            "cursorlog_streams",
            "gauge",
            "Streams remembered.",
            stats.streams,
        );
        metric(
            "cursorlog_last_lsn",
            "gauge",
            "Highest log sequence number written.",
            stats.last_lsn,
        );
        metric(
            "cursorlog_recovery_microseconds",
            "gauge",
            "How long recovery took when the data directory was opened.",
            stats.recovery_micros,
        );
        metric(
            "cursorlog_recovery_lost_records",
            "gauge",
            "Records the index had applied that the log no longer held when the data directory \
             was opened: under sync=always, acknowledged data the disk lost (an error is logged).",
            stats.recovery_lost_records,
        );
        metric(
            "cursorlog_recovery_streams_fenced",
            "gauge",
            "Streams ended when the data directory was opened because acknowledged events of \
             theirs may be lost.",
            stats.recovery_streams_fenced,
        );
        metric(
            "cursorlog_recovery_sessions_fenced",
            "gauge",
            "Sessions moved to a new epoch when the data directory was opened because a stream \
             or epoch of theirs was lost.",
            stats.recovery_sessions_fenced,
        );
        metric(
            "cursorlog_index_flush_failures_total",
            "counter",
            "Index flushes that failed (nothing lost: the log holds everything; writes are \
             refused as on a full disk until a flush succeeds).",
            stats.index_flush_failures,
        );
        metric(
            "cursorlog_active_followers",
            "gauge",
            "Read calls currently following a stream live.",
            self.active_followers(),
        );
        metric(
            "cursorlog_follows_started_total",
            "counter",
            "Read calls that started following a stream live.",
            self.follows_started.load(Ordering::Relaxed),
        );
        metric(
            "cursorlog_active_reads",
            "gauge",
            "Read calls running now (replaying or following), of cursorlog_read_calls_max.",
            self.reads.active(),
        );
        metric(
            "cursorlog_read_calls_max",
            "gauge",
            "Most Read calls admitted at once (--read-calls-max).",
            self.reads.max(),
        );
        metric(
            "cursorlog_read_calls_refused_total",
            "counter",
            "Read calls refused with RESOURCE_EXHAUSTED because --read-calls-max were running.",
            self.reads.refused(),
        );
        metric(
            "cursorlog_poisoned",
            "gauge",
            "1 once a failed write or fsync made the engine refuse every write: restart cursorlog.",
            u64::from(stats.poisoned),
        );
        metric(
            "cursorlog_live_sessions",
            "gauge",
            "Sessions not expired, of cursorlog_sessions.",
            stats.live_sessions,
        );
        metric(
            "cursorlog_open_streams",
            "gauge",
            "Streams in state OPEN, of cursorlog_streams.",
            stats.open_streams,
        );
        metric(
            "cursorlog_sessions_expired_idle_total",
            "counter",
            "Sessions expired after their idle TTL since start.",
            stats.sessions_expired_idle,
        );
        metric(
            "cursorlog_appends_refused_low_disk_total",
            "counter",
            "Appends refused because free disk space was below the reserve, since start.",
            stats.appends_refused_low_disk,
        );
        metric(
            "cursorlog_segment_descriptors",
            "gauge",
            "Segment files holding an open file descriptor.",
            stats.segment_descriptors,
        );
        metric(
            "cursorlog_followed_streams",
            "gauge",
            "Streams with at least one live follower.",
            stats.followed_streams,
        );
        metric(
            "cursorlog_writer_queue_bytes",
            "gauge",
            "Bytes of requests queued for the writer (and in its current group).",
            stats.writer_queue_bytes,
        );
        metric(
            "cursorlog_live_sessions_max",
            "gauge",
            "The cap on live sessions (--max-live-sessions); at it OpenSession is RESOURCE_EXHAUSTED.",
            stats.live_sessions_max,
        );
        metric(
            "cursorlog_sessions_refused_at_capacity_total",
            "counter",
            "New sessions refused with RESOURCE_EXHAUSTED because --max-live-sessions were live.",
            stats.sessions_refused_at_capacity,
        );
        metric(
            "cursorlog_leased_streams",
            "gauge",
            "Open streams holding a producer lease.",
            stats.leased_streams,
        );
        metric(
            "cursorlog_leased_streams_max",
            "gauge",
            "The cap on leased streams (--max-leased-streams).",
            stats.leased_streams_max,
        );
        metric(
            "cursorlog_leases_refused_at_capacity_total",
            "counter",
            "Leased streams refused with RESOURCE_EXHAUSTED because --max-leased-streams were open.",
            stats.leases_refused_at_capacity,
        );
        if let Some(free) = stats.disk_free_bytes {
            metric(
                "cursorlog_disk_free_bytes",
                "gauge",
                "Free bytes on the data directory's file system at the last check.",
                free,
            );
        }
        let _ = writeln!(
            out,
            "# HELP cursorlog_verdicts_total Resolve verdicts handed out, by verdict.\n\
             # TYPE cursorlog_verdicts_total counter"
        );
        for verdict in Verdict::ALL {
            let _ = writeln!(
                out,
                "cursorlog_verdicts_total{{verdict=\"{verdict}\"}} {}",
                self.verdicts(verdict)
            );
        }
        out
    }
}

/// Decrements the active follower gauge when dropped.
#[derive(Debug)]
pub struct FollowerGuard {
    metrics: Arc<Metrics>,
}

impl Drop for FollowerGuard {
    fn drop(&mut self) {
        self.metrics
            .active_followers
            .fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn renders_counters_and_verdicts() {
        let metrics = Arc::new(Metrics::new(4));
        metrics.record_verdict(Verdict::StreamTerminated);
        metrics.record_verdict(Verdict::StreamTerminated);
        metrics.record_verdict(Verdict::Resumable);
        let guard = metrics.follower();
        let stats = Stats {
            events_appended: 12,
            fsyncs: 3,
            live_sessions_max: 1000,
            sessions_refused_at_capacity: 2,
            leased_streams: 5,
            ..Stats::default()
        };
        let text = metrics.render(&stats);
        for line in [
            "cursorlog_live_sessions_max 1000\n",
            "cursorlog_sessions_refused_at_capacity_total 2\n",
            "cursorlog_leased_streams 5\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(
            text.contains("cursorlog_events_appended_total 12\n"),
            "{text}"
        );
        assert!(text.contains("cursorlog_fsyncs_total 3\n"));
        assert!(text.contains("cursorlog_verdicts_total{verdict=\"STREAM_TERMINATED\"} 2\n"));
        assert!(text.contains("cursorlog_verdicts_total{verdict=\"RESUMABLE\"} 1\n"));
        assert!(text.contains("cursorlog_active_followers 1\n"));
        assert!(text.contains("cursorlog_poisoned 0\n"), "{text}");
        let slot = metrics.reads.acquire().unwrap();
        let poisoned = Stats {
            poisoned: true,
            ..Stats::default()
        };
        let text = metrics.render(&poisoned);
        assert!(text.contains("cursorlog_poisoned 1\n"), "{text}");
        assert!(text.contains("cursorlog_active_reads 1\n"), "{text}");
        assert!(text.contains("cursorlog_read_calls_max 4\n"), "{text}");
        drop(slot);
        drop(guard);
        assert_eq!(metrics.active_followers(), 0);
    }
}
