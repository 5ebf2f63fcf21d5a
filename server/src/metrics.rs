//! Prometheus text metrics: server-side counters plus the engine's own statistics, served over
//! plain HTTP/1.1 by a deliberately tiny responder (`GET` any path → the metrics page).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{Engine, Stats, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Counters the server keeps itself (the engine keeps the storage ones).
#[derive(Debug, Default)]
pub struct Metrics {
    verdicts: [AtomicU64; Verdict::ALL.len()],
    active_followers: AtomicU64,
    follows_started: AtomicU64,
    active_reads: AtomicU64,
}

impl Metrics {
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

    /// Read calls running now (replaying or following).
    pub fn active_reads(&self) -> u64 {
        self.active_reads.load(Ordering::Relaxed)
    }

    /// Counts a running Read call until the guard is dropped.
    pub fn read_call(self: &Arc<Self>) -> ReadGuard {
        self.active_reads.fetch_add(1, Ordering::Relaxed);
        ReadGuard {
            metrics: Arc::clone(self),
        }
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

/// Counts a running Read call (see [`Metrics::read_call`]).
#[derive(Debug)]
pub struct ReadGuard {
    metrics: Arc<Metrics>,
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        self.metrics.active_reads.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves the metrics page on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, engine: Engine, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut socket, peer)) = listener.accept().await else {
            continue;
        };
        let engine = engine.clone();
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            // Read (and ignore) the request head; give up on slow or oversized requests.
            let mut head = [0_u8; 4096];
            let read = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut head)).await;
            if !matches!(read, Ok(Ok(n)) if n > 0) {
                return;
            }
            let stats = tokio::task::spawn_blocking(move || engine.stats()).await;
            let response = match stats {
                Ok(Ok(stats)) => {
                    let body = metrics.render(&stats);
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                }
                Ok(Err(err)) => {
                    tracing::warn!(%peer, error = %err, "metrics: engine stats failed");
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        .to_owned()
                }
                Err(_) => return,
            };
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_verdicts() {
        let metrics = Arc::new(Metrics::default());
        metrics.record_verdict(Verdict::StreamTerminated);
        metrics.record_verdict(Verdict::StreamTerminated);
        metrics.record_verdict(Verdict::Resumable);
        let guard = metrics.follower();
        let stats = Stats {
            events_appended: 12,
            fsyncs: 3,
            ..Stats::default()
        };
        let text = metrics.render(&stats);
        assert!(
            text.contains("cursorlog_events_appended_total 12\n"),
            "{text}"
        );
        assert!(text.contains("cursorlog_fsyncs_total 3\n"));
        assert!(text.contains("cursorlog_verdicts_total{verdict=\"STREAM_TERMINATED\"} 2\n"));
        assert!(text.contains("cursorlog_verdicts_total{verdict=\"RESUMABLE\"} 1\n"));
        assert!(text.contains("cursorlog_active_followers 1\n"));
        drop(guard);
        assert_eq!(metrics.active_followers(), 0);
    }
}
