//! The metrics page: Prometheus text (format 0.0.4) encoded by `prometheus-client`, served
//! over HTTP by [`crate::metrics_http`].
//!
//! The page is made of two kinds of metric:
//! - **Live metrics**, which their owner updates as things happen: verdicts handed out and
//!   live followers here, and whatever another part of the server adds to [`Metrics`]'
//!   registry with [`Metrics::register`] (a typed metric it keeps a handle to and updates)
//!   or [`Metrics::register_collector`] (values it reads at each scrape; the connection
//!   counters come this way, see [`values::connections`]).
//! - **Scrape-time values** kept elsewhere (the engine's [`Stats`], the Read slots and
//!   buffers), read at each scrape and described by the tables in [`values`].
//!
//! Names are given as exposed: a counter's ends in `_total`. prometheus-client adds that
//! suffix itself, so it is taken off before a counter is handed to it (see [`values::Row`]
//! and [`Metrics::register`]); a test checks every name on the page against today's list.

mod values;

#[cfg(test)]
pub(crate) mod check;

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cursorlog_engine::{Stats, Verdict};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};

use crate::read_slots::ReadSlots;

pub use values::{connections, raft};

/// The `Content-Type` of the page.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A gauge of whole numbers, the kind most of the page is made of.
pub type U64Gauge = Gauge<u64, AtomicU64>;

/// The label set of `cursorlog_verdicts_total`.
type VerdictLabel = [(&'static str, &'static str); 1];

/// Why a metric could not be registered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegisterError {
    /// The name is on the page already.
    #[error("metric {name} is already on the metrics page")]
    Duplicate {
        /// The exposed name.
        name: String,
    },
    /// The name is not a cursorlog metric name.
    #[error("metric name {name} must start with cursorlog_ and be [a-z0-9_]")]
    BadName {
        /// The name given.
        name: String,
    },
    /// A counter whose name does not end in `_total`.
    #[error("counter {name} must be named with its _total suffix")]
    CounterWithoutTotal {
        /// The name given.
        name: String,
    },
}

/// The server's live metrics and the registry other parts of the server add theirs to.
#[derive(Debug)]
pub struct Metrics {
    /// One counter per verdict, in [`Verdict::ALL`] order: handles into the family registered
    /// as `cursorlog_verdicts_total`.
    verdicts: [Counter; Verdict::ALL.len()],
    active_followers: U64Gauge,
    follows_started: Counter,
    /// The Read call slots (active and refused calls).
    pub reads: Arc<ReadSlots>,
    registry: Mutex<Registered>,
}

/// The registry and the names on it (prometheus-client does not refuse a duplicate, which
/// would make the page malformed).
#[derive(Debug)]
struct Registered {
    registry: Registry,
    names: HashSet<String>,
}

impl Metrics {
    /// Counters for a server admitting `read_calls_max` concurrent Read calls.
    pub fn new(read_calls_max: u32) -> Self {
        let verdict_family = Family::<VerdictLabel, Counter>::default();
        // Every verdict is on the page from the start, at 0.
        let verdicts = Verdict::ALL.map(|v| verdict_family.get_or_create_owned(&label(v)));
        let metrics = Self {
            verdicts,
            active_followers: U64Gauge::default(),
            follows_started: Counter::default(),
            reads: ReadSlots::new(read_calls_max),
            registry: Mutex::new(Registered {
                registry: Registry::default(),
                names: values::names().map(str::to_owned).collect(),
            }),
        };
        // Never refused: these names are distinct, well formed and not in `values` (the
        // test `the_page_has_exactly_todays_names` fails otherwise).
        for registered in [
            metrics.register(
                "cursorlog_active_followers",
                "Read calls currently following a stream live.",
                metrics.active_followers.clone(),
            ),
            metrics.register(
                "cursorlog_follows_started_total",
                "Read calls that started following a stream live.",
                metrics.follows_started.clone(),
            ),
            metrics.register(
                "cursorlog_verdicts_total",
                "Resolve verdicts handed out, by verdict.",
                verdict_family,
            ),
        ] {
            if let Err(err) = registered {
                tracing::error!(%err, "metrics: a built-in metric was refused");
            }
        }
        metrics
    }

    /// Counts one verdict handed out (by Resolve or Read).
    pub fn record_verdict(&self, verdict: Verdict) {
        if let Some(counter) = Verdict::ALL
            .iter()
            .position(|v| *v == verdict)
            .and_then(|i| self.verdicts.get(i))
        {
            counter.inc();
        }
    }

    /// Read calls currently following a stream live.
    pub fn active_followers(&self) -> u64 {
        self.active_followers.get()
    }

    /// Registers a live follower until the guard is dropped.
    pub fn follower(&self) -> FollowerGuard {
        self.active_followers.inc();
        self.follows_started.inc();
        FollowerGuard {
            active: self.active_followers.clone(),
        }
    }

    /// Puts `metric` on the page as `name`, with `help` (one sentence; a final period is
    /// added when missing). The caller keeps a clone of `metric` (prometheus-client metrics
    /// are handles to one shared value) and updates it; the page shows its value at each
    /// scrape. `name` is the exposed name: `cursorlog_` and `[a-z0-9_]`, and a counter's ends
    /// in `_total`.
    ///
    /// This is where replication (issue 19) adds its metrics, without touching the page's
    /// encoding: name them `cursorlog_raft_*`, for example a [`U64Gauge`] registered as
    /// `cursorlog_raft_commit_index` and `set` on every change. Values read from elsewhere
    /// at each scrape (openraft's metrics channel, say) go through
    /// [`Metrics::register_collector`] instead. Nothing is registered here for it yet.
    ///
    /// # Errors
    /// [`RegisterError`]: a name already on the page, not a cursorlog name, or a counter
    /// without `_total`.
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl Metric,
    ) -> Result<(), RegisterError> {
        let bad_name = || RegisterError::BadName {
            name: name.to_owned(),
        };
        let suffix = name.strip_prefix("cursorlog_").ok_or_else(bad_name)?;
        if suffix.is_empty()
            || !suffix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(bad_name());
        }
        // prometheus-client appends `_total` to a counter's name, and a period to help.
        let family = if metric.metric_type() == MetricType::Counter {
            name.strip_suffix("_total")
                .ok_or_else(|| RegisterError::CounterWithoutTotal {
                    name: name.to_owned(),
                })?
        } else {
            name
        };
        let help = help.strip_suffix('.').unwrap_or(help);
        let mut registered = self.registered();
        if !registered.names.insert(name.to_owned()) {
            return Err(RegisterError::Duplicate {
                name: name.to_owned(),
            });
        }
        registered.registry.register(family, help, metric);
        Ok(())
    }

    /// Adds `collector`, asked for its metrics at each scrape: for values kept elsewhere and
    /// read when the page is served (as [`connections`] does). Its metrics' names must be
    /// `cursorlog_*` and on the page nowhere else; write them with the descriptor encoder
    /// of prometheus-client (the names without a counter's `_total`), or as rows like
    /// [`values::connections`].
    pub fn register_collector(&self, collector: impl Collector) {
        self.registered()
            .registry
            .register_collector(Box::new(collector));
    }

    fn registered(&self) -> MutexGuard<'_, Registered> {
        // Nothing panics half-way through a change of the registry: a poisoned lock still
        // guards a whole one.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The page: `stats` (taken for this scrape) and the Read slots, then every registered
    /// metric.
    ///
    /// # Errors
    /// A collector that failed to encode.
    pub fn render(&self, stats: &Stats) -> Result<String, fmt::Error> {
        let mut scrape = Registry::default();
        scrape.register_collector(Box::new(values::Snapshot::new(stats.clone(), &self.reads)));
        let mut out = String::with_capacity(8 * 1024);
        prometheus_text::encode(&mut out, &scrape)?;
        prometheus_text::encode(&mut out, &self.registered().registry)?;
        Ok(out)
    }
}

/// The label of `verdict` on `cursorlog_verdicts_total`.
fn label(verdict: Verdict) -> VerdictLabel {
    [("verdict", verdict.as_str())]
}

/// Decrements the active follower gauge when dropped.
#[derive(Debug)]
pub struct FollowerGuard {
    active: U64Gauge,
}

impl Drop for FollowerGuard {
    fn drop(&mut self) {
        self.active.dec();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;
    use crate::connections::Connections;

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
        let text = metrics.render(&stats).unwrap();
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
        let text = metrics.render(&poisoned).unwrap();
        assert!(text.contains("cursorlog_poisoned 1\n"), "{text}");
        assert!(text.contains("cursorlog_active_reads 1\n"), "{text}");
        assert!(text.contains("cursorlog_read_calls_max 4\n"), "{text}");
        drop(slot);
        drop(guard);
        assert_eq!(metrics.active_followers(), 0);
    }

    /// Every field of `Stats` set to a distinct value, `disk_free_bytes` included.
    fn full_stats() -> Stats {
        Stats {
            sessions: 1,
            streams: 2,
            segments: 3,
            log_bytes: 4,
            last_lsn: 5,
            events_appended: 6,
            payload_bytes_appended: 7,
            fsyncs: 8,
            commit_batches: 9,
            records_written: 10,
            segments_deleted: 11,
            recovery_micros: 12,
            recovery_lost_records: 13,
            recovery_streams_fenced: 14,
            recovery_sessions_fenced: 15,
            index_flush_failures: 16,
            live_sessions: 17,
            open_streams: 18,
            poisoned: true,
            disk_free_bytes: Some(20),
            appends_refused_low_disk: 21,
            sessions_expired_idle: 22,
            segment_descriptors: 23,
            followed_streams: 24,
            writer_queue_bytes: 25,
            live_sessions_max: 26,
            sessions_refused_at_capacity: 27,
            leased_streams: 28,
            leased_streams_max: 29,
            leases_refused_at_capacity: 30,
        }
    }

    /// The page as the server serves it: every value set, a follower, a Read call, the
    /// connection counters registered.
    fn full_page() -> (Arc<Metrics>, String) {
        let metrics = Arc::new(Metrics::new(4));
        metrics.record_verdict(Verdict::StreamTerminated);
        metrics.register_collector(connections(Connections::new(7, 2, Duration::from_secs(1))));
        let _follower = metrics.follower();
        let _slot = metrics.reads.acquire().unwrap();
        let page = metrics.render(&full_stats()).unwrap();
        (metrics, page)
    }

    #[test]
    fn the_whole_page_parses_as_prometheus_text() {
        let (_, text) = full_page();
        let page = check::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(page.value("cursorlog_poisoned", &[]), Some(1.0));
        assert_eq!(page.value("cursorlog_disk_free_bytes", &[]), Some(20.0));
        assert_eq!(page.value("cursorlog_connections_max", &[]), Some(7.0));
        assert_eq!(
            page.value(
                "cursorlog_verdicts_total",
                &[("verdict", "STREAM_TERMINATED")]
            ),
            Some(1.0)
        );
        assert_eq!(
            page.value("cursorlog_verdicts_total", &[("verdict", "CURSOR_AHEAD")]),
            Some(0.0),
            "every verdict is on the page from the start"
        );
        // Without a free-space reading the gauge is left off, and the page still parses.
        let metrics = Metrics::new(1);
        let text = metrics.render(&Stats::default()).unwrap();
        let page = check::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(page.value("cursorlog_disk_free_bytes", &[]), None);
    }

    /// The names and types on the page before it moved to prometheus-client (the
    /// hand-written page of metrics.rs, connections.rs and read_pipe.rs): none may change.
    const TODAYS_PAGE: &[(&str, &str)] = &[
        ("cursorlog_accept_failures_total", "counter"),
        ("cursorlog_active_followers", "gauge"),
        ("cursorlog_active_reads", "gauge"),
        ("cursorlog_appends_refused_low_disk_total", "counter"),
        ("cursorlog_commit_batches_total", "counter"),
        ("cursorlog_connections", "gauge"),
        ("cursorlog_connections_handshake_timeouts_total", "counter"),
        ("cursorlog_connections_max", "gauge"),
        ("cursorlog_connections_refused_total", "counter"),
        ("cursorlog_disk_free_bytes", "gauge"),
        ("cursorlog_events_appended_total", "counter"),
        ("cursorlog_followed_streams", "gauge"),
        ("cursorlog_follows_started_total", "counter"),
        ("cursorlog_fsyncs_total", "counter"),
        ("cursorlog_index_flush_failures_total", "counter"),
        ("cursorlog_last_lsn", "gauge"),
        ("cursorlog_leased_streams", "gauge"),
        ("cursorlog_leased_streams_max", "gauge"),
        ("cursorlog_leases_refused_at_capacity_total", "counter"),
        ("cursorlog_live_sessions", "gauge"),
        ("cursorlog_live_sessions_max", "gauge"),
        ("cursorlog_log_bytes", "gauge"),
        ("cursorlog_open_streams", "gauge"),
        ("cursorlog_payload_bytes_appended_total", "counter"),
        ("cursorlog_poisoned", "gauge"),
        ("cursorlog_read_buffer_bytes", "gauge"),
        ("cursorlog_read_buffer_bytes_max", "gauge"),
        ("cursorlog_read_calls_max", "gauge"),
        ("cursorlog_read_calls_refused_total", "counter"),
        ("cursorlog_reads_paused", "gauge"),
        ("cursorlog_records_written_total", "counter"),
        ("cursorlog_recovery_lost_records", "gauge"),
        ("cursorlog_recovery_microseconds", "gauge"),
        ("cursorlog_recovery_sessions_fenced", "gauge"),
        ("cursorlog_recovery_streams_fenced", "gauge"),
        ("cursorlog_segment_descriptors", "gauge"),
        ("cursorlog_segments", "gauge"),
        ("cursorlog_segments_deleted_total", "counter"),
        ("cursorlog_sessions", "gauge"),
        ("cursorlog_sessions_expired_idle_total", "counter"),
        ("cursorlog_sessions_refused_at_capacity_total", "counter"),
        ("cursorlog_streams", "gauge"),
        ("cursorlog_verdicts_total", "counter"),
        ("cursorlog_writer_queue_bytes", "gauge"),
    ];

    #[test]
    fn the_page_has_exactly_todays_names() {
        let (_, text) = full_page();
        let page = check::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let mut got: Vec<(String, String)> = page
            .families
            .into_iter()
            .map(|f| (f.name, f.kind))
            .collect();
        got.sort();
        let mut want: Vec<(String, String)> = TODAYS_PAGE
            .iter()
            .map(|(n, k)| ((*n).to_owned(), (*k).to_owned()))
            .collect();
        want.sort();
        assert_eq!(got, want);
        // Each family's samples carry the family's name, the verdicts' the label `verdict`.
        for sample in &page.scrape.samples {
            let labels: Vec<&String> = sample.labels.keys().collect();
            match sample.metric.as_str() {
                "cursorlog_verdicts_total" => assert_eq!(labels, ["verdict"]),
                _ => assert!(labels.is_empty(), "{}: {labels:?}", sample.metric),
            }
        }
        assert_eq!(
            page.scrape
                .samples
                .iter()
                .filter(|s| s.metric == "cursorlog_verdicts_total")
                .count(),
            Verdict::ALL.len()
        );
    }

    #[test]
    fn registered_metrics_join_the_page_and_bad_names_are_refused() {
        let metrics = Metrics::new(1);
        let gauge = U64Gauge::default();
        metrics
            .register("cursorlog_example_gauge", "An example.", gauge.clone())
            .unwrap();
        let counter = Counter::<u64>::default();
        metrics
            .register(
                "cursorlog_example_total",
                "An example counter",
                counter.clone(),
            )
            .unwrap();
        gauge.set(41);
        counter.inc_by(3);
        let text = metrics.render(&Stats::default()).unwrap();
        let page = check::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(page.value("cursorlog_example_gauge", &[]), Some(41.0));
        assert_eq!(page.value("cursorlog_example_total", &[]), Some(3.0));
        assert!(
            text.contains("# HELP cursorlog_example_total An example counter.\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP cursorlog_example_gauge An example.\n"),
            "{text}"
        );

        for (name, metric, want) in [
            (
                "cursorlog_example_gauge",
                U64Gauge::default(),
                RegisterError::Duplicate {
                    name: "cursorlog_example_gauge".into(),
                },
            ),
            (
                "cursorlog_fsyncs_total",
                U64Gauge::default(),
                RegisterError::Duplicate {
                    name: "cursorlog_fsyncs_total".into(),
                },
            ),
            (
                "cursorlog_connections",
                U64Gauge::default(),
                RegisterError::Duplicate {
                    name: "cursorlog_connections".into(),
                },
            ),
            (
                "raft_term",
                U64Gauge::default(),
                RegisterError::BadName {
                    name: "raft_term".into(),
                },
            ),
            (
                "cursorlog_Bad-name",
                U64Gauge::default(),
                RegisterError::BadName {
                    name: "cursorlog_Bad-name".into(),
                },
            ),
        ] {
            assert_eq!(metrics.register(name, "x", metric), Err(want));
        }
        assert_eq!(
            metrics.register("cursorlog_example_count", "x", Counter::<u64>::default()),
            Err(RegisterError::CounterWithoutTotal {
                name: "cursorlog_example_count".into()
            })
        );
        // Nothing refused reached the page.
        let again = metrics.render(&Stats::default()).unwrap();
        assert!(check::parse(&again).is_ok(), "{again}");
        assert_eq!(
            again.matches("cursorlog_example").count(),
            text.matches("cursorlog_example").count()
        );
    }
}
