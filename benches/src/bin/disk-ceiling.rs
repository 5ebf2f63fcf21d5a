//! `disk-ceiling`: what the disk allows a single writer that makes appends durable, without
//! any database in the way: 512-byte `write`s appended to a growing file (a new file every
//! 64 MiB, like the engine's segments), one `fdatasync` (`File::sync_data`) per N writes.
//!
//! ```sh
//! disk-ceiling --writes-per-sync 1,64 --duration 5 [--dir DIR] [--json PATH]
//! ```
//!
//! The directory defaults to `target/bench-data` in the repository (or
//! `$CURSORLOG_BENCH_DIR`), the disk cursorlog's benchmarks run on.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::json;

/// Raw fdatasync ceiling of the disk for appends of a fixed size.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Directory to write in (a temporary subdirectory is created and removed).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Writes per fdatasync, comma separated; each is measured in turn.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    writes_per_sync: Vec<u64>,
    /// Bytes per write.
    #[arg(long, default_value_t = 512)]
    payload: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Most syncs per measurement (also bounded by --duration).
    #[arg(long, default_value_t = 1_000_000)]
    max_syncs: u64,
    /// File size at which a new file is started.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    file_bytes: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn new_file(dir: &Path, n: &mut u64) -> std::io::Result<File> {
    *n += 1;
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.join(format!("{n:08}.log")))
}

fn measure(cli: &Cli, dir: &Path, per_sync: u64) -> std::io::Result<serde_json::Value> {
    let body = vec![b'x'; cli.payload];
    let mut files = 0;
    let mut file = new_file(dir, &mut files)?;
    // Directory entry durable once, as the engine does when it creates a segment.
    file.sync_all()?;
    let mut size = 0_u64;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let limit = Duration::from_secs_f64(cli.duration.max(0.1));
    let started = Instant::now();
    let mut syncs = 0_u64;
    while started.elapsed() < limit && syncs < cli.max_syncs {
        if size >= cli.file_bytes {
            file = new_file(dir, &mut files)?;
            file.sync_all()?;
            size = 0;
        }
        let t = Instant::now();
        for _ in 0..per_sync {
            file.write_all(&body)?;
        }
        file.sync_data()?;
        let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
        hist.saturating_record(us.max(1));
        size += per_sync * cli.payload as u64;
        syncs += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    let events = syncs * per_sync;
    let ms = |us: u64| us as f64 / 1000.0;
    let result = json!({
        "writes_per_sync": per_sync,
        "payload_bytes": cli.payload,
        "elapsed_secs": secs,
        "syncs": syncs,
        "events": events,
        "syncs_per_sec": syncs as f64 / secs,
        "events_per_sec": events as f64 / secs,
        "sync_group_p50_ms": ms(hist.value_at_quantile(0.5)),
        "sync_group_p99_ms": ms(hist.value_at_quantile(0.99)),
        "sync_group_max_ms": ms(hist.max()),
    });
    println!(
        "disk ceiling, {per_sync:>4} x {} B per fdatasync: {:>10.0} events/s, {:>7.0} syncs/s, \
         group p50 {:.3} ms p99 {:.3} ms max {:.3} ms ({syncs} syncs in {secs:.1} s)",
        cli.payload,
        events as f64 / secs,
        syncs as f64 / secs,
        ms(hist.value_at_quantile(0.5)),
        ms(hist.value_at_quantile(0.99)),
        ms(hist.max()),
    );
    for n in 1..=files {
        std::fs::remove_file(dir.join(format!("{n:08}.log")))?;
    }
    Ok(result)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let root = match &cli.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => cursorlog_benches::bench_root(),
    };
    let temp = tempfile::Builder::new()
        .prefix("disk-ceiling-")
        .tempdir_in(&root)?;
    let fs = cursorlog_benches::fs_type(temp.path()).unwrap_or_else(|| "unknown".to_owned());
    eprintln!("writing in {} ({fs})", temp.path().display());
    let mut results = Vec::new();
    for &n in &cli.writes_per_sync {
        results.push(measure(&cli, temp.path(), n.max(1))?);
    }
    if let Some(path) = &cli.json {
        let doc = json!({ "dir": temp.path(), "fs": fs, "results": results });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
