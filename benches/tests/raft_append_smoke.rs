//! `raft-append` at CI scale: one 1-second round of `raft3` (three openraft nodes over the
//! gRPC transport on loopback, each on its own segment log) and `single` (the segment log
//! alone) with one client, each printing a positive rate. The figures mean nothing at this
//! scale; the test proves the binary starts a cluster, writes through it and reports.

use std::process::Command;

/// The rate `raft-append` printed for `config`'s round-1 line, if any.
fn rate(stdout: &str, config: &str) -> Option<f64> {
    stdout.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next() != Some("round") {
            return None;
        }
        let words: Vec<&str> = words.collect();
        // round 1 N=1 raft3 209 entries/s ...
        match words.as_slice() {
            [_, _, c, rate, "entries/s", ..] if *c == config => rate.parse().ok(),
            _ => None,
        }
    })
}

#[test]
fn one_short_round_of_raft3_and_single_prints_positive_rates() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temporary directory");
    let out = Command::new(env!("CARGO_BIN_EXE_raft-append"))
        .env("CURSORLOG_BENCH_DIR", dir.path())
        .env("DURATION", "1")
        .env("ROUNDS", "1")
        .env("N", "1")
        .env("CONFIGS", "raft3,single")
        .output()
        .expect("raft-append runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "raft-append failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for config in ["raft3", "single"] {
        let r = rate(&stdout, config);
        assert!(
            r.is_some_and(|r| r > 0.0),
            "{config} printed no positive rate ({r:?}):\n{stdout}"
        );
    }
}
