//! The closed-loop machinery every workload shares: the run's window ([`Shared`]), one
//! worker's op pacing and counters ([`Worker`]), and a small random generator ([`Rng`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::report::{histogram, record};

/// State shared by all workers of a run.
#[derive(Debug)]
pub struct Shared {
    /// Start of the measurement window.
    pub start: Instant,
    /// End of the measurement window (nothing starts after it).
    pub end: Instant,
    pub(crate) budget: Option<AtomicU64>,
    pub(crate) stop: AtomicBool,
    pub(crate) progress_ops: AtomicU64,
    pub(crate) progress_events: AtomicU64,
    pub(crate) progress_errors: AtomicU64,
    pub(crate) first_errors: Mutex<Vec<String>>,
}

/// One operation in progress.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub(crate) started: Instant,
    pub(crate) measured: bool,
}

impl Op {
    /// Whether this op started inside the measurement window.
    pub fn measured(&self) -> bool {
        self.measured
    }
}

/// A worker's own counters; merged at the end.
#[derive(Debug)]
pub struct Worker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) interval: Option<Duration>,
    pub(crate) next_at: Instant,
    pub(crate) primary: &'static str,
    pub(crate) hists: BTreeMap<&'static str, Histogram<u64>>,
    pub(crate) ops: u64,
    pub(crate) events: u64,
    pub(crate) errors: u64,
    pub(crate) last_done: Option<Instant>,
}

impl Worker {
    pub(crate) fn new(shared: Arc<Shared>, primary: &'static str) -> Self {
        Self {
            next_at: shared.start,
            shared,
            interval: None,
            primary,
            hists: BTreeMap::new(),
            ops: 0,
            events: 0,
            errors: 0,
            last_done: None,
        }
    }

    /// Paces this worker at one op per `interval`, the first at `first`.
    pub(crate) fn pace(&mut self, interval: Duration, first: Instant) {
        self.interval = Some(interval);
        self.next_at = first;
    }

    /// Starts the next op (waiting for its scheduled time with --rate), or `None` when the
    /// run is over (window ended, `--ops` reached).
    pub async fn begin(&mut self) -> Option<Op> {
        let mut now = Instant::now();
        if let Some(interval) = self.interval {
            let scheduled = self.next_at;
            self.next_at += interval;
            if scheduled >= self.shared.end {
                return None;
            }
            if now < scheduled {
                // On time: the timer's own lateness is the generator's, not the server's.
                tokio::time::sleep_until(scheduled.into()).await;
                now = Instant::now();
            } else {
                // Behind schedule because the previous op was slow: charge the wait.
                now = scheduled;
            }
        }
        if now >= self.shared.end || self.shared.stop.load(Ordering::Relaxed) {
            return None;
        }
        let measured = now >= self.shared.start;
        if measured {
            if let Some(budget) = &self.shared.budget {
                let took = budget
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
                    .is_ok();
                if !took {
                    self.shared.stop.store(true, Ordering::Relaxed);
                    return None;
                }
            }
        }
        Some(Op {
            started: now,
            measured,
        })
    }

    /// Whether the measurement window is still open (for long ops like a replay).
    pub fn in_window(&self) -> bool {
        Instant::now() < self.shared.end
    }

    /// Records a sub-operation's latency (e.g. one RPC of a mixed request).
    pub fn record(&mut self, op: Op, name: &'static str, d: Duration) {
        if op.measured && Instant::now() <= self.shared.end {
            record(self.hists.entry(name).or_insert_with(histogram), d);
        }
    }

    /// Counts events as they arrive (replay), if now is inside the window.
    pub fn add_events(&mut self, n: u64) {
        self.shared.progress_events.fetch_add(n, Ordering::Relaxed);
        let now = Instant::now();
        if now >= self.shared.start && now <= self.shared.end {
            self.events += n;
        }
    }

    /// Ends an op: its latency goes into the primary histogram and `events` are counted when
    /// it started and ended inside the window.
    pub fn finish(&mut self, op: Op, events: u64, result: Result<(), String>) {
        let done = Instant::now();
        self.shared.progress_ops.fetch_add(1, Ordering::Relaxed);
        self.shared
            .progress_events
            .fetch_add(events, Ordering::Relaxed);
        if let Err(e) = &result {
            self.shared.progress_errors.fetch_add(1, Ordering::Relaxed);
            let mut first = self
                .shared
                .first_errors
                .lock()
                .expect("error list lock poisoned");
            if first.len() < 5 {
                first.push(e.clone());
            }
        }
        if !op.measured || done > self.shared.end {
            return;
        }
        if result.is_err() {
            self.errors += 1;
            return;
        }
        record(
            self.hists.entry(self.primary).or_insert_with(histogram),
            done - op.started,
        );
        self.ops += 1;
        self.events += events;
        self.last_done = Some(self.last_done.map_or(done, |d| d.max(done)));
    }
}

/// A small xorshift generator (no need for cryptographic quality).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from `seed` (any value).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}
