//! The soak's samples and its flatness check: after the warm-up, the measured window is cut
//! into thirds, and the last third's mean of every resource (server RSS, data-directory
//! bytes, open descriptors, append p99, live sessions) must be within the tolerance of the
//! first third's. A run with failed operations, an interval without a single acknowledged
//! append, or a third without samples fails too.

use serde_json::{json, Value};

/// Which part of the run a sample belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the measured window (its interval started before the warm-up ended).
    Warmup,
    /// Third 0, 1 or 2 of the measured window (by the middle of the sample's interval).
    Third(usize),
    /// After the measured window (never judged).
    After,
}

impl Phase {
    /// The phase of the sample whose interval is `(end - interval, end]`, seconds since start.
    pub fn of(end: f64, interval: f64, warmup: f64, duration: f64) -> Self {
        // A hundredth of an interval of slack: sample times are scheduled, not measured, but
        // the sums are floating point.
        let slack = interval / 100.0;
        if end - interval < warmup - slack {
            return Self::Warmup;
        }
        if end > warmup + duration + slack {
            return Self::After;
        }
        let mid = end - interval / 2.0 - warmup;
        let third = (mid / (duration / 3.0)).floor();
        Self::Third(if third < 1.0 {
            0
        } else if third < 2.0 {
            1
        } else {
            2
        })
    }

    /// Its name in the table and the CSV.
    pub fn label(self) -> &'static str {
        match self {
            Self::Warmup => "warm-up",
            Self::Third(0) => "first",
            Self::Third(1) => "middle",
            Self::Third(_) => "last",
            Self::After => "after",
        }
    }
}

/// What one interval measured.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// End of the interval, seconds since the fleet started (scheduled time).
    pub t: f64,
    /// Server resident set size, bytes.
    pub rss_bytes: u64,
    /// Data directory size (allocated blocks), bytes.
    pub disk_bytes: u64,
    /// Server file descriptors.
    pub fds: u64,
    /// Append latency median over the interval, µs (`None`: no append was acknowledged).
    pub append_p50_us: Option<u64>,
    /// Append latency p99 over the interval, µs.
    pub append_p99_us: Option<u64>,
    /// Appends acknowledged in the interval.
    pub appends: u64,
    /// `Stats.live_sessions` (`None`: Stats failed).
    pub live_sessions: Option<u64>,
    /// `Stats.sessions` (remembered, live or expired).
    pub sessions: u64,
    /// `Stats.streams` (remembered).
    pub streams: u64,
    /// `Stats.open_streams`.
    pub open_streams: u64,
    /// `Stats.active_followers`.
    pub server_followers: u64,
    /// Follow calls the fleet holds open.
    pub client_followers: u64,
    /// Server CPU over the interval, in cores.
    pub server_cpu: Option<f64>,
    /// Sessions the fleet opened so far.
    pub sessions_opened: u64,
    /// Failed operations and checks so far.
    pub errors: u64,
    /// Follow calls the server ended while their client was still connected, so far (a
    /// session expiring under a connected client).
    pub followers_ended: u64,
}

/// One judged resource.
#[derive(Debug, Clone)]
pub struct Row {
    /// Its name and unit.
    pub name: &'static str,
    /// Mean per third (`None`: no sample in that third).
    pub means: [Option<f64>; 3],
    /// Whether the last third is within the tolerance of the first.
    pub flat: bool,
}

impl Row {
    /// Relative change from the first to the last third (`None` when either is missing, or
    /// the first is 0 and the last not).
    pub fn change(&self) -> Option<f64> {
        let (first, last) = (self.means[0]?, self.means[2]?);
        if first == 0.0 {
            return (last == 0.0).then_some(0.0);
        }
        Some((last - first) / first)
    }
}

/// The flatness check's result.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Every judged resource.
    pub rows: Vec<Row>,
    /// Everything that failed, in words (empty: flat).
    pub problems: Vec<String>,
}

impl Verdict {
    /// True when the steady state was flat and nothing failed.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    /// The table of means per third, for stdout.
    pub fn print(&self, tolerance: f64) {
        println!(
            "\n{:<18} {:>12} {:>12} {:>12} {:>9}  within {:.0} %",
            "resource (mean)",
            "first third",
            "middle",
            "last third",
            "change",
            tolerance * 100.0
        );
        for r in &self.rows {
            let cell = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
            let change = r
                .change()
                .map_or_else(|| "-".to_owned(), |c| format!("{:+.1} %", c * 100.0));
            println!(
                "{:<18} {:>12} {:>12} {:>12} {:>9}  {}",
                r.name,
                cell(r.means[0]),
                cell(r.means[1]),
                cell(r.means[2]),
                change,
                if r.flat { "yes" } else { "NO" }
            );
        }
        if self.passed() {
            println!("verdict: FLAT");
        } else {
            println!("verdict: NOT FLAT");
            for p in &self.problems {
                println!("  - {p}");
            }
        }
    }

    /// The same as JSON.
    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "resource": r.name,
                    "first_third": r.means[0],
                    "middle_third": r.means[1],
                    "last_third": r.means[2],
                    "change": r.change(),
                    "flat": r.flat,
                })
            })
            .collect();
        json!({ "flat": self.passed(), "rows": rows, "problems": self.problems })
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Judges the samples: `phases[i]` is the phase of `samples[i]`, `before` the last sample
/// before the measured window (its running counts are the baseline), `tolerance` a fraction
/// (0.1 = 10 %).
pub fn judge(samples: &[Sample], phases: &[Phase], before: &Sample, tolerance: f64) -> Verdict {
    type Get = fn(&Sample) -> Option<f64>;
    let metrics: [(&'static str, Get); 5] = [
        ("RSS MiB", |s| Some(s.rss_bytes as f64 / MIB)),
        ("disk MiB", |s| Some(s.disk_bytes as f64 / MIB)),
        ("descriptors", |s| Some(s.fds as f64)),
        ("append p99 ms", |s| {
            s.append_p99_us.map(|us| us as f64 / 1000.0)
        }),
        ("live sessions", |s| s.live_sessions.map(|n| n as f64)),
    ];
    let mut problems = Vec::new();
    let measured: Vec<(&Sample, usize)> = samples
        .iter()
        .zip(phases)
        .filter_map(|(s, p)| match p {
            Phase::Third(i) => Some((s, *i)),
            _ => None,
        })
        .collect();
    for third in 0..3 {
        if !measured.iter().any(|(_, i)| *i == third) {
            problems.push(format!(
                "the {} third has no sample: measure longer or sample more often",
                Phase::Third(third).label()
            ));
        }
    }
    for (s, _) in &measured {
        if s.append_p99_us.is_none() {
            problems.push(format!(
                "no append was acknowledged in the interval ending at {:.0} s",
                s.t
            ));
        }
        if s.live_sessions.is_none() {
            problems.push(format!(
                "Stats failed in the interval ending at {:.0} s",
                s.t
            ));
        }
    }
    let mut rows = Vec::new();
    for (name, get) in metrics {
        let mut means = [None; 3];
        for (third, mean) in means.iter_mut().enumerate() {
            let values: Vec<f64> = measured
                .iter()
                .filter(|(_, i)| *i == third)
                .filter_map(|(s, _)| get(s))
                .collect();
            if !values.is_empty() {
                *mean = Some(values.iter().sum::<f64>() / values.len() as f64);
            }
        }
        let mut row = Row {
            name,
            means,
            flat: false,
        };
        row.flat = row.change().is_some_and(|c| c.abs() <= tolerance);
        if !row.flat {
            problems.push(match row.change() {
                Some(c) => format!(
                    "{name}: the last third is {:+.1} % from the first (allowed ±{:.0} %)",
                    c * 100.0,
                    tolerance * 100.0
                ),
                None => format!("{name}: not measured in the first or the last third"),
            });
        }
        rows.push(row);
    }
    let errors_after = measured.last().map_or(before.errors, |(s, _)| s.errors);
    if errors_after > before.errors {
        problems.push(format!(
            "{} operations failed during the measured window",
            errors_after - before.errors
        ));
    }
    let ended_after = measured
        .last()
        .map_or(before.followers_ended, |(s, _)| s.followers_ended);
    if ended_after > before.followers_ended {
        problems.push(format!(
            "the server ended {} follow calls of connected clients during the measured window",
            ended_after - before.followers_ended
        ));
    }
    Verdict { rows, problems }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, rss_mib: u64, live: u64, p99_us: u64) -> Sample {
        Sample {
            t,
            rss_bytes: rss_mib * 1024 * 1024,
            disk_bytes: 40 * 1024 * 1024,
            fds: 30,
            append_p50_us: Some(p99_us / 4),
            append_p99_us: Some(p99_us),
            appends: 100,
            live_sessions: Some(live),
            ..Sample::default()
        }
    }

    /// 10 s warm-up, 30 s measured, 5 s interval: samples at 5..=40.
    fn phases(samples: &[Sample]) -> Vec<Phase> {
        samples
            .iter()
            .map(|s| Phase::of(s.t, 5.0, 10.0, 30.0))
            .collect()
    }

    #[test]
    fn phases_follow_the_middle_of_each_interval() {
        let p = |end| Phase::of(end, 5.0, 10.0, 30.0);
        assert_eq!(p(5.0), Phase::Warmup);
        assert_eq!(p(10.0), Phase::Warmup);
        assert_eq!(p(15.0), Phase::Third(0));
        assert_eq!(p(20.0), Phase::Third(0));
        assert_eq!(p(25.0), Phase::Third(1));
        assert_eq!(p(30.0), Phase::Third(1));
        assert_eq!(p(35.0), Phase::Third(2));
        assert_eq!(p(40.0), Phase::Third(2));
        assert_eq!(p(45.0), Phase::After);
    }

    #[test]
    fn a_flat_run_passes_and_warm_up_growth_is_ignored() {
        let samples: Vec<Sample> = (1u32..=8)
            .map(|k| {
                let t = 5.0 * f64::from(k);
                // Growth during the warm-up only, then a plateau with ±3 % noise.
                let rss = if k <= 2 {
                    20 * u64::from(k)
                } else {
                    100 + u64::from(k % 2) * 3
                };
                sample(t, rss, 600, 4000 + u64::from(k % 2) * 100)
            })
            .collect();
        let v = judge(&samples, &phases(&samples), &Sample::default(), 0.10);
        assert!(v.passed(), "{:?}", v.problems);
        assert_eq!(v.rows.len(), 5);
    }

    #[test]
    fn steady_growth_fails_and_names_the_resource() {
        // Live sessions grow linearly (no idle TTL): 100 per 5 s.
        let samples: Vec<Sample> = (1u32..=8)
            .map(|k| sample(5.0 * f64::from(k), 100, 100 * u64::from(k), 4000))
            .collect();
        let v = judge(&samples, &phases(&samples), &Sample::default(), 0.10);
        assert!(!v.passed());
        assert!(
            v.problems.iter().any(|p| p.starts_with("live sessions")),
            "{:?}",
            v.problems
        );
        assert!(
            !v.problems.iter().any(|p| p.starts_with("RSS")),
            "{:?}",
            v.problems
        );
    }

    #[test]
    fn a_shrinking_resource_beyond_the_tolerance_fails_too() {
        let samples: Vec<Sample> = (1u32..=8)
            .map(|k| sample(5.0 * f64::from(k), 200 - 10 * u64::from(k), 600, 4000))
            .collect();
        let v = judge(&samples, &phases(&samples), &Sample::default(), 0.10);
        assert!(
            v.problems.iter().any(|p| p.starts_with("RSS")),
            "{:?}",
            v.problems
        );
    }

    #[test]
    fn errors_stalls_and_missing_thirds_fail() {
        let mut samples: Vec<Sample> = (1u32..=8)
            .map(|k| sample(5.0 * f64::from(k), 100, 600, 4000))
            .collect();
        samples[7].errors = 3;
        samples[7].followers_ended = 4;
        samples[5].append_p99_us = None;
        let v = judge(&samples, &phases(&samples), &Sample::default(), 0.10);
        assert!(v.problems.iter().any(|p| p.contains("3 operations failed")));
        assert!(v
            .problems
            .iter()
            .any(|p| p.contains("ended 4 follow calls")));
        // Counts from the warm-up are not the window's.
        let before = Sample {
            errors: 3,
            followers_ended: 4,
            ..Sample::default()
        };
        let v = judge(&samples, &phases(&samples), &before, 0.10);
        assert!(!v.problems.iter().any(|p| p.contains("operations failed")));
        assert!(!v.problems.iter().any(|p| p.contains("follow calls")));
        assert!(v.problems.iter().any(|p| p.contains("ending at 30 s")));

        let short: Vec<Sample> = samples[..4].to_vec();
        let v = judge(&short, &phases(&short), &Sample::default(), 0.10);
        assert!(v
            .problems
            .iter()
            .any(|p| p.contains("the last third has no sample")));
    }

    #[test]
    fn change_handles_zero() {
        let row = |first, last| Row {
            name: "x",
            means: [Some(first), None, Some(last)],
            flat: false,
        };
        assert_eq!(row(0.0, 0.0).change(), Some(0.0));
        assert_eq!(row(0.0, 1.0).change(), None);
        assert_eq!(row(10.0, 11.0).change(), Some(0.1));
    }
}
