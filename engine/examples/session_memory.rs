//! Resident memory per live idle session: opens N sessions, each with one open (lease-less)
//! stream holding one event — an idle MCP client with its standalone GET stream — and reports
//! how much the process's RSS grew per session, with the index cache at its default bound.
//!
//! `cargo run --release -p cursorlog-engine --example session_memory -- 100000 [DIR]`
//! (DIR defaults to a temporary directory; give one on a real disk: tmpfs pages count in RSS
//! of nobody, but the page cache is not what this measures either way.)

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use cursorlog_engine::{Append, Config, Engine, NewEvent, OpenStream};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let tmp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map_or_else(|| tmp.path().to_path_buf(), Into::into);
    let mut config = Config::new(&dir);
    config.disk_reserve_bytes = 0;
    let engine = Engine::open(config)?;
    let started = Instant::now();
    let before = rss_kib();
    let mut at_half = 0;
    for i in 0..n {
        let session = format!(
            "{:032x}",
            u128::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C834)
        );
        let epoch = engine.open_session(&session)?.epoch;
        let stream = engine.open_stream(OpenStream {
            session: session.clone(),
            epoch,
            correlation: None,
            lease_ms: None,
        })?;
        engine.append(Append {
            session,
            stream: stream.stream,
            expected_next_seq: Some(1),
            events: vec![NewEvent::new(
                "notification",
                br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#.to_vec(),
            )],
        })?;
        if i + 1 == n / 2 {
            at_half = rss_kib();
        }
        if (i + 1) % (n / 10).max(1) == 0 {
            eprintln!(
                "{} sessions, rss {} MiB, {:.1} s",
                i + 1,
                rss_kib() / 1024,
                started.elapsed().as_secs_f64()
            );
        }
    }
    engine.sync()?;
    let after = rss_kib();
    let stats = engine.stats()?;
    println!(
        "live sessions {}, open streams {}: RSS {} MiB before, {} MiB after ({} MiB at half); \
         {:.0} bytes per session overall, {:.0} bytes per session over the second half",
        stats.live_sessions,
        stats.open_streams,
        before / 1024,
        after / 1024,
        at_half / 1024,
        (after.saturating_sub(before) * 1024) as f64 / n as f64,
        (after.saturating_sub(at_half) * 1024) as f64 / (n - n / 2) as f64,
    );
    engine.close()?;
    Ok(())
}
