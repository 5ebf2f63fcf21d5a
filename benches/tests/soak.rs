//! The soak at CI scale: `cursorlog-bench soak` against the real `cursorlog` binary (the debug
//! build next to the bench binary, which CI builds first) with short idle TTL, metadata
//! horizon and retention, and the flatness assertion of the long run: after the warm-up, the
//! last third's server RSS, data-directory bytes, descriptors and live sessions within 10 %
//! of the first third's, no failed operation, no follow call ended under a connected client.
//! One difference: the append p99 may change by 150 % here, not 10 %. In a 90 s window on a
//! shared 2-core machine it moved by up to +68 % between thirds of flat runs (fsync and
//! scheduling noise from other processes; benches/HISTORY.md has the figures), so a 10 % bound
//! would fail at random; 150 % still catches a latency that more than doubles. The long run
//! keeps 10 % for every resource. The p99 is judged on what the server controls: one that
//! left the band is excused when its ratio to the disk's own fdatasync p99 (the bench's
//! control probe beside the data directory) stayed within it. A busy machine's disk once took
//! the p99 +206 % (fsync p99 5.3 -> 14.9 ms, p99/fsync 3.35 -> 3.65): the disk's, not the
//! server's. The raw change is still printed in the table.
//!
//! `soak_without_idle_ttl_is_not_flat` runs the same fleet against a server whose sessions
//! never expire when idle and expects the check to fail: it proves the check sees growth. It
//! doubles the time, so it is ignored in CI:
//! `cargo test -p cursorlog-benches --test soak -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Seconds each simulated client stays connected; TTL, horizon and retention are short next
/// to it, so the steady state is reached within the warm-up.
const LIFETIME_SECS: &str = "6";
const WARMUP_SECS: &str = "60";
const DURATION_SECS: &str = "90";

fn server_bin() -> PathBuf {
    let bench = Path::new(env!("CARGO_BIN_EXE_cursorlog-bench"));
    let server = bench
        .parent()
        .expect("the bench binary has a directory")
        .join(format!("cursorlog{}", std::env::consts::EXE_SUFFIX));
    assert!(
        server.is_file(),
        "{} is missing: build it first (`cargo build -p cursorlog-server`)",
        server.display()
    );
    server
}

/// Runs the soak with `ttl_secs` as the server's idle TTL; returns its output and CSV.
fn soak(dir: &Path, ttl_secs: &str) -> (Output, String) {
    let csv = dir.join("soak.csv");
    let out = Command::new(env!("CARGO_BIN_EXE_cursorlog-bench"))
        .env("CURSORLOG_BENCH_DIR", dir)
        .args(["--spawn", "--server-bin"])
        .arg(server_bin())
        .args([
            "--warmup",
            WARMUP_SECS,
            "--duration",
            DURATION_SECS,
            "--connections",
            "8",
        ])
        .args([
            "soak",
            "--sessions-per-sec",
            "20",
            "--client-lifetime-secs",
            LIFETIME_SECS,
        ])
        .args(["--requests", "2", "--progress", "2", "--resume-pct", "10"])
        .args(["--interval-secs", "3", "--p99-tolerance-pct", "150"])
        .args(["--session-idle-ttl-secs", ttl_secs])
        .args([
            "--metadata-horizon-secs",
            "3",
            "--retention-max-age-secs",
            "3",
        ])
        .args([
            "--segment-bytes",
            "262144",
            "--retention-check-interval-ms",
            "500",
        ])
        .arg("--csv")
        .arg(&csv)
        .output()
        .expect("running cursorlog-bench");
    let csv = std::fs::read_to_string(&csv).unwrap_or_default();
    (out, csv)
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn soak_with_idle_ttl_is_flat() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (out, csv) = soak(dir.path(), "3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(stdout.contains("verdict: FLAT"), "{}", show(&out));
    // One CSV row per 3 s sample over 150 s, each third present.
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert!(rows.len() >= 49, "{} CSV rows:\n{csv}", rows.len());
    for phase in [",first,", ",middle,", ",last,"] {
        assert!(
            rows.iter().any(|r| r.contains(phase)),
            "no {phase} sample:\n{csv}"
        );
    }
}

#[test]
#[ignore = "proves the check fails on growth; doubles the soak's time (run with --ignored)"]
fn soak_without_idle_ttl_is_not_flat() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (out, _) = soak(dir.path(), "0");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(stdout.contains("verdict: NOT FLAT"), "{}", show(&out));
    assert!(stdout.contains("  - live sessions:"), "{}", show(&out));
    println!("{stdout}"); // the table, with --nocapture
}
