//! Latency histograms, the final table and its JSON form.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// A latency histogram in microseconds, 1 µs to 1 h, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Records `d` (saturating at the histogram's maximum).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
    h.saturating_record(us);
}

/// Server counters (the `Stats` RPC) and CPU seconds over the measurement window.
#[derive(Debug, Clone, Default)]
pub struct ServerDelta {
    /// Events appended in the window.
    pub events_appended: u64,
    /// fdatasync calls on the write path in the window.
    pub fsyncs: u64,
    /// Group commits in the window.
    pub commit_batches: u64,
    /// Log records written in the window.
    pub records_written: u64,
}

/// Everything one run measured.
#[derive(Debug)]
pub struct Report {
    /// `append`, `resolve`, `replay` or `mixed`.
    pub workload: String,
    /// The workload's parameters, for the header and the JSON.
    pub params: Value,
    /// The measurement window actually used.
    pub elapsed: Duration,
    /// Operations completed inside the window.
    pub ops: u64,
    /// Events written or read inside the window.
    pub events: u64,
    /// Failed operations inside the window.
    pub errors: u64,
    /// The first few error messages (any time).
    pub first_errors: Vec<String>,
    /// Name of the histogram that is one "op".
    pub primary: &'static str,
    /// Latency per operation kind.
    pub hists: BTreeMap<&'static str, Histogram<u64>>,
    /// Server counters over the window, when the Stats RPC answered.
    pub server: Option<ServerDelta>,
    /// CPU used by this client over the window, in seconds.
    pub client_cpu_secs: Option<f64>,
    /// CPU used by the spawned server over the window, in seconds.
    pub server_cpu_secs: Option<f64>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn rate(n: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

impl Report {
    /// Operations per second over the window.
    pub fn ops_per_sec(&self) -> f64 {
        rate(self.ops, self.elapsed)
    }

    /// Events per second over the window.
    pub fn events_per_sec(&self) -> f64 {
        rate(self.events, self.elapsed)
    }

    /// Prints the final table to stdout.
    pub fn print(&self) {
        let params = self
            .params
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        println!();
        println!("workload {}  {params}", self.workload);
        println!(
            "elapsed {:.2} s | {} ops, {:.1} ops/s | {} events, {:.1} events/s | errors {}",
            self.elapsed.as_secs_f64(),
            self.ops,
            self.ops_per_sec(),
            self.events,
            self.events_per_sec(),
            self.errors
        );
        println!(
            "{:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "latency (ms)", "count", "p50", "p99", "p99.9", "max", "mean"
        );
        for (name, h) in &self.hists {
            println!(
                "{:<14} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                if *name == self.primary {
                    format!("{name} *")
                } else {
                    (*name).to_owned()
                },
                h.len(),
                ms(h.value_at_quantile(0.50)),
                ms(h.value_at_quantile(0.99)),
                ms(h.value_at_quantile(0.999)),
                ms(h.max()),
                h.mean() / 1000.0
            );
        }
        if let Some(s) = &self.server {
            println!(
                "server: {} events, {} fsyncs, {} group commits, {} records in the window | \
                 events/fsync {} | records/commit {}",
                s.events_appended,
                s.fsyncs,
                s.commit_batches,
                s.records_written,
                fmt_opt(ratio(s.events_appended, s.fsyncs)),
                fmt_opt(ratio(s.records_written, s.commit_batches)),
            );
        }
        let secs = self.elapsed.as_secs_f64().max(f64::EPSILON);
        println!(
            "cpu (cores busy over the window): client {} | server {}",
            fmt_opt(self.client_cpu_secs.map(|c| c / secs)),
            fmt_opt(self.server_cpu_secs.map(|c| c / secs)),
        );
        for e in &self.first_errors {
            println!("error: {e}");
        }
    }

    /// The same figures as JSON.
    pub fn to_json(&self) -> Value {
        let hists: serde_json::Map<String, Value> = self
            .hists
            .iter()
            .map(|(name, h)| {
                (
                    (*name).to_owned(),
                    json!({
                        "count": h.len(),
                        "p50_ms": ms(h.value_at_quantile(0.50)),
                        "p90_ms": ms(h.value_at_quantile(0.90)),
                        "p99_ms": ms(h.value_at_quantile(0.99)),
                        "p999_ms": ms(h.value_at_quantile(0.999)),
                        "max_ms": ms(h.max()),
                        "mean_ms": h.mean() / 1000.0,
                    }),
                )
            })
            .collect();
        let secs = self.elapsed.as_secs_f64().max(f64::EPSILON);
        json!({
            "workload": self.workload,
            "params": self.params,
            "elapsed_secs": self.elapsed.as_secs_f64(),
            "ops": self.ops,
            "ops_per_sec": self.ops_per_sec(),
            "events": self.events,
            "events_per_sec": self.events_per_sec(),
            "errors": self.errors,
            "first_errors": self.first_errors,
            "primary": self.primary,
            "latency": hists,
            "server": self.server.as_ref().map(|s| json!({
                "events_appended": s.events_appended,
                "fsyncs": s.fsyncs,
                "commit_batches": s.commit_batches,
                "records_written": s.records_written,
                "events_per_fsync": ratio(s.events_appended, s.fsyncs),
                "records_per_commit": ratio(s.records_written, s.commit_batches),
            })),
            "client_cpu_cores": self.client_cpu_secs.map(|c| c / secs),
            "server_cpu_cores": self.server_cpu_secs.map(|c| c / secs),
        })
    }
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// CPU seconds (user + system) used so far by process `pid` (`self` for this one), from
/// `/proc/<pid>/stat`, assuming the usual 100 clock ticks per second.
pub fn cpu_secs(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}
