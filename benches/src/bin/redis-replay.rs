//! `redis-replay`: the Redis Streams side of the replay comparison. A single client reads a
//! whole stream with `XRANGE key - + COUNT n`, then `XRANGE key (last-id + COUNT n` page by
//! page until a page comes back empty, repeatedly for `--duration` seconds, over one plain
//! RESP2 connection (no client library: a minimal encoder and parser, decoding every entry
//! into owned id, field and value buffers, as a client library would).
//!
//! ```sh
//! redis-replay --port 6379 --key bench --count 1000 --duration 10 [--json PATH]
//! ```

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::json;

type BoxError = Box<dyn std::error::Error>;

/// Replay a Redis stream with XRANGE paging.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Redis host.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Redis port.
    #[arg(long, default_value_t = 6379)]
    port: u16,
    /// Stream key.
    #[arg(long, default_value = "bench")]
    key: String,
    /// Entries per XRANGE page.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Seconds to replay for (whole replays; a replay cut by the end counts its entries).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of replays before measuring.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Fail unless every replay returns exactly this many entries.
    #[arg(long)]
    expect: Option<u64>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A RESP2 reply.
#[derive(Debug)]
enum Reply {
    Simple(#[allow(dead_code)] Vec<u8>),
    Error(String),
    Int(#[allow(dead_code)] i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

fn line(r: &mut impl BufRead) -> Result<Vec<u8>, BoxError> {
    let mut buf = Vec::new();
    r.read_until(b'\n', &mut buf)?;
    if buf.len() < 2 || !buf.ends_with(b"\r\n") {
        return Err("connection closed or malformed RESP line".into());
    }
    buf.truncate(buf.len() - 2);
    Ok(buf)
}

fn int(bytes: &[u8]) -> Result<i64, BoxError> {
    Ok(std::str::from_utf8(bytes)?.parse()?)
}

fn parse(r: &mut impl BufRead) -> Result<Reply, BoxError> {
    let l = line(r)?;
    let (&kind, rest) = l.split_first().ok_or("empty RESP line")?;
    Ok(match kind {
        b'+' => Reply::Simple(rest.to_vec()),
        b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
        b':' => Reply::Int(int(rest)?),
        b'$' => {
            let n = int(rest)?;
            if n < 0 {
                Reply::Bulk(None)
            } else {
                let mut buf = vec![0; usize::try_from(n)? + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(buf.len() - 2);
                Reply::Bulk(Some(buf))
            }
        }
        b'*' => {
            let n = int(rest)?;
            if n < 0 {
                Reply::Array(None)
            } else {
                let mut items = Vec::with_capacity(usize::try_from(n)?);
                for _ in 0..n {
                    items.push(parse(r)?);
                }
                Reply::Array(Some(items))
            }
        }
        _ => return Err(format!("unexpected RESP type byte {kind}").into()),
    })
}

fn send(w: &mut impl Write, args: &[&[u8]]) -> Result<(), BoxError> {
    write!(w, "*{}\r\n", args.len())?;
    for a in args {
        write!(w, "${}\r\n", a.len())?;
        w.write_all(a)?;
        w.write_all(b"\r\n")?;
    }
    w.flush()?;
    Ok(())
}

/// Entries counted inside the measurement window.
#[derive(Debug)]
struct Window {
    start: Instant,
    end: Instant,
    entries: u64,
}

/// One whole replay; returns its number of entries, or `None` when the window ended first.
/// Entries of each page are counted into `window` when the page arrives inside it.
fn replay(
    reader: &mut BufReader<TcpStream>,
    writer: &mut BufWriter<TcpStream>,
    cli: &Cli,
    window: &mut Window,
) -> Result<Option<u64>, BoxError> {
    let count = cli.count.to_string();
    let mut start = b"-".to_vec();
    let mut total = 0;
    loop {
        send(
            writer,
            &[
                b"XRANGE",
                cli.key.as_bytes(),
                &start,
                b"+",
                b"COUNT",
                count.as_bytes(),
            ],
        )?;
        let entries = match parse(reader)? {
            Reply::Array(Some(items)) => items,
            Reply::Error(e) => return Err(format!("XRANGE: {e}").into()),
            other => return Err(format!("XRANGE: unexpected reply {other:?}").into()),
        };
        if entries.is_empty() {
            return Ok(Some(total));
        }
        let page = entries.len() as u64;
        let mut last_id = None;
        for entry in entries {
            let Reply::Array(Some(mut parts)) = entry else {
                return Err("XRANGE entry is not an array".into());
            };
            match parts.pop() {
                Some(Reply::Array(Some(fields))) if !fields.is_empty() => {}
                _ => return Err("XRANGE entry without fields".into()),
            }
            if let Some(Reply::Bulk(Some(id))) = parts.pop() {
                last_id = Some(id);
            }
        }
        total += page;
        let now = Instant::now();
        if now >= window.start && now <= window.end {
            window.entries += page;
        }
        if now > window.end {
            return Ok(None);
        }
        let id = last_id.ok_or("XRANGE entry without id")?;
        start = [b"(".as_slice(), &id].concat();
    }
}

fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    let stream = TcpStream::connect((cli.host.as_str(), cli.port))?;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::with_capacity(1 << 20, stream.try_clone()?);
    let mut writer = BufWriter::new(stream);
    let warmup = Duration::from_secs_f64(cli.warmup.max(0.0));
    let duration = Duration::from_secs_f64(cli.duration.max(0.1));
    let t0 = Instant::now();
    let start = t0 + warmup;
    let end = start + duration;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let mut window = Window {
        start,
        end,
        entries: 0,
    };
    let mut replays = 0_u64;
    while Instant::now() < end {
        let began = Instant::now();
        let Some(n) = replay(&mut reader, &mut writer, &cli, &mut window)? else {
            break; // cut by the end of the window
        };
        if let Some(expect) = cli.expect {
            if n != expect {
                return Err(format!("replay returned {n} entries, expected {expect}").into());
            }
        }
        let done = Instant::now();
        if began >= start && done <= end {
            replays += 1;
            hist.saturating_record(u64::try_from((done - began).as_micros())?.max(1));
        }
    }
    // Entries delivered inside the window, over the window (as cursorlog-bench counts).
    let entries = window.entries;
    let secs = duration.as_secs_f64();
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "redis XRANGE COUNT {} replay of {}: {replays} replays, {entries} entries in {secs:.2} s \
         = {:.0} entries/s; replay p50 {:.1} ms p99 {:.1} ms max {:.1} ms",
        cli.count,
        cli.key,
        entries as f64 / secs,
        ms(hist.value_at_quantile(0.5)),
        ms(hist.value_at_quantile(0.99)),
        ms(hist.max()),
    );
    if let Some(path) = &cli.json {
        let doc = json!({
            "key": cli.key, "count": cli.count, "replays": replays, "entries": entries,
            "elapsed_secs": secs, "events_per_sec": entries as f64 / secs,
            "replay_p50_ms": ms(hist.value_at_quantile(0.5)),
            "replay_p99_ms": ms(hist.value_at_quantile(0.99)),
            "replay_max_ms": ms(hist.max()),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
