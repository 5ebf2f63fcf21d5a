//! `cursorlog-bench replicated` at CI scale against the real `cursorlog` binary (the debug
//! build next to the bench binary, which CI builds first: `cargo build -p cursorlog-server`):
//! a 1-second throughput window per batch size on a single node and a 3-member cluster, one
//! leader kill per timing, and the catch-up of a wiped follower after 2 MiB. The figures mean
//! nothing at this scale; the tests prove the tool starts the servers, finds the leader,
//! measures and prints every table.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

fn run(dir: &Path, parts: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cursorlog-bench"))
        .env("CURSORLOG_BENCH_DIR", dir)
        .arg("--server-bin")
        .arg(server_bin())
        .args(["--warmup", "0.5", "--duration", "1", "--quiet"])
        .args(["replicated", "--parts", parts])
        .args(extra)
        .output()
        .expect("running cursorlog-bench")
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The words of the summary line of `batch` (`batch single replicated ratio …`).
fn summary(stdout: &str, batch: &str) -> Option<Vec<String>> {
    let after = stdout.split("replicated vs single").nth(1)?;
    after.lines().find_map(|l| {
        let w: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
        (w.first().map(String::as_str) == Some(batch) && w.len() >= 4).then_some(w)
    })
}

#[test]
fn throughput_and_failover_print_positive_figures() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temporary directory");
    let out = run(
        dir.path(),
        "throughput,failover",
        &["--producers", "4", "--kills", "1"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", show(&out));
    for batch in ["1", "16"] {
        let w =
            summary(&stdout, batch).unwrap_or_else(|| panic!("no batch {batch}: {}", show(&out)));
        for v in &w[1..4] {
            let v: f64 = v.parse().expect("a number");
            assert!(v > 0.0, "batch {batch}: {w:?}\n{}", show(&out));
        }
    }
    for timing in ["default", "fast"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(timing))
            .unwrap_or_else(|| panic!("no {timing} failover row: {}", show(&out)));
        let w: Vec<&str> = line.split_whitespace().collect();
        // … kills min p50 p99 max
        let max: f64 = w[w.len() - 1].parse().expect("a number");
        assert_eq!(w[w.len() - 5], "1", "{line}");
        assert!(max > 0.0, "{line}");
    }
}

#[test]
#[ignore = "a wiped follower never catches up today (openraft's allow_log_reversion is off: the \
            leader's RaftCore panics on a debug assertion in a debug build and never resends \
            the log in a release build); run with --ignored once replication handles it"]
fn catchup_of_a_wiped_follower_prints_seconds_per_gib() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temporary directory");
    let out = run(
        dir.path(),
        "catchup",
        &["--catchup-mib", "2", "--catchup-timeout-secs", "120"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        stdout.contains("caught up in") && stdout.contains("s/GiB"),
        "{}",
        show(&out)
    );
}
