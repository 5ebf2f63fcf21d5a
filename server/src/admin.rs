//! Offline tools: `cursorlog verify <dir>` and `cursorlog inspect <dir>`.

use std::path::Path;
use std::process::ExitCode;

use cursorlog_engine::{repair_dir, verify_dir, Config, Engine, SessionMeta, StreamMeta};

/// Exit status of `verify` when the directory cannot be checked at all (not a data directory,
/// unreadable, ...), as opposed to checked and found corrupt (1).
const EXIT_CANNOT_CHECK: u8 = 2;

/// Checks every segment of `dir`; prints the report. Exit 0 when clean, 1 on corruption, 2 when
/// the directory cannot be checked.
pub fn verify(dir: &Path) -> ExitCode {
    if !dir.is_dir() {
        eprintln!("cursorlog verify: {} is not a directory", dir.display());
        return ExitCode::from(EXIT_CANNOT_CHECK);
    }
    match verify_dir(dir) {
        Ok(report) => {
            println!("{report}");
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err @ cursorlog_engine::Error::Corruption { .. }) => {
            println!("corrupt: {err}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("cursorlog verify: cannot check {}: {err}", dir.display());
            ExitCode::from(EXIT_CANNOT_CHECK)
        }
    }
}

/// Repairs `dir` offline (see `cursorlog_engine::repair_dir`), then verifies it. Exit 0 when
/// the directory is clean afterwards, 1 when repair refused (data would be lost), 2 when the
/// directory cannot be checked.
pub fn repair(dir: &Path, accept_loss: bool) -> ExitCode {
    if !dir.is_dir() {
        eprintln!(
            "cursorlog verify --repair: {} is not a directory",
            dir.display()
        );
        return ExitCode::from(EXIT_CANNOT_CHECK);
    }
    match repair_dir(dir, accept_loss) {
        Ok(report) => {
            println!("{report}");
            verify(dir)
        }
        Err(
            err @ cursorlog_engine::Error::Corruption {
                kind: cursorlog_engine::CorruptionKind::UnknownRecordType(_),
                ..
            },
        ) => {
            // Not damage: a newer build's record, which no repair cuts (--accept-loss too).
            println!("refused: {err}");
            println!(
                "this directory holds records of a newer cursorlog: run that build on it \
                 (do not repair it with this one)"
            );
            ExitCode::FAILURE
        }
        Err(err @ cursorlog_engine::Error::Corruption { .. }) => {
            println!("refused: {err}");
            println!(
                "repairing this would drop records that may have been acknowledged; restore the \
                 directory from a copy, or rerun with --repair --accept-loss to cut the log at \
                 the damage"
            );
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!(
                "cursorlog verify --repair: cannot repair {}: {err}",
                dir.display()
            );
            ExitCode::from(EXIT_CANNOT_CHECK)
        }
    }
}

/// Prints the sessions, streams and segments of `dir` (with `digest`, only digests of them
/// and of a member's committed log, for comparing members).
pub fn inspect(dir: &Path, digest: bool) -> ExitCode {
    if !dir.is_dir() {
        eprintln!("cursorlog inspect: {} is not a directory", dir.display());
        return ExitCode::from(EXIT_CANNOT_CHECK);
    }
    let member = dir.join("VOTE").exists();
    let opened = if member {
        open_member(dir, digest)
    } else {
        Engine::open(Config::new(dir))
    };
    let engine = match opened {
        Ok(engine) => engine,
        Err(err) => {
            eprintln!("cursorlog inspect: cannot open {}: {err}", dir.display());
            return ExitCode::FAILURE;
        }
    };
    let printed = if digest {
        print_state_digest(&engine)
    } else {
        print_inventory(&engine, dir)
    };
    let closed = engine.close();
    match (printed, closed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("cursorlog inspect: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Opens a cluster member's directory as a replica (its index rebuilt from the log up to the
/// committed entry; nothing is written to the log), and prints where its log stands.
fn open_member(dir: &Path, digest: bool) -> cursorlog_engine::Result<Engine> {
    let log = cursorlog_engine::EntryLog::open(cursorlog_engine::EntryLogConfig::new(dir))?;
    let state = log.state();
    if digest {
        print_log_digest(&log)?;
        return Engine::open_replica(Config::new(dir), &log);
    }
    println!("cluster member: yes (VOTE present)");
    println!(
        "log: last entry {}, committed {}, purged through {}",
        entry(state.last),
        entry(log.committed()),
        entry(state.last_purged),
    );
    Engine::open_replica(Config::new(dir), &log)
}

/// Entries read at a time while digesting the log.
const DIGEST_CHUNK: u64 = 1024;

/// `log <first>..=<committed> <crc32 hex>`: the CRC-32 of every entry from the first the log
/// holds to the committed one (term, index and payload), so two members' lines are equal
/// when they hold the same committed log (from the same first entry: a purge moves it).
fn print_log_digest(log: &cursorlog_engine::EntryLog) -> cursorlog_engine::Result<()> {
    let first = log.state().last_purged.map_or(1, |p| p.index + 1);
    let Some(committed) = log.committed() else {
        println!("log none");
        return Ok(());
    };
    let mut hasher = crc32fast::Hasher::new();
    let mut at = first;
    while at <= committed.index {
        let to = committed.index.min(at + DIGEST_CHUNK - 1);
        for e in log.read(at, to)? {
            hasher.update(&e.id.term.to_le_bytes());
            hasher.update(&e.id.index.to_le_bytes());
            match &e.payload {
                cursorlog_engine::EntryPayload::Blank => hasher.update(&[0]),
                cursorlog_engine::EntryPayload::Membership(m) => {
                    hasher.update(&[1]);
                    hasher.update(m);
                }
                cursorlog_engine::EntryPayload::Records(p) => {
                    hasher.update(&[2]);
                    hasher.update(p.as_bytes());
                }
            }
        }
        at = to + 1;
    }
    println!(
        "log {first}..={} term {} {:08x}",
        committed.index,
        committed.term,
        hasher.finalize()
    );
    Ok(())
}

/// `sessions <n> <crc32 hex>` and `streams <n> <crc32 hex>`: digests of everything
/// `inspect` prints about them.
fn print_state_digest(engine: &Engine) -> cursorlog_engine::Result<()> {
    let sessions = engine.sessions()?;
    let streams = engine.streams()?;
    let digest = |text: String| crc32fast::hash(text.as_bytes());
    println!(
        "sessions {} {:08x}",
        sessions.len(),
        digest(format!("{sessions:?}"))
    );
    println!(
        "streams {} {:08x}",
        streams.len(),
        digest(format!("{streams:?}"))
    );
    Ok(())
}

fn entry(id: Option<cursorlog_engine::EntryId>) -> String {
    id.map_or_else(
        || "none".into(),
        |id| format!("{} (term {})", id.index, id.term),
    )
}

fn print_inventory(engine: &Engine, dir: &Path) -> cursorlog_engine::Result<()> {
    println!("data dir: {}", dir.display());
    println!("recovery: {}", engine.recovery_report());

    let segments = engine.segments();
    println!("\nsegments ({}):", segments.len());
    println!("  {:<40} {:>12} {:>12}", "file", "base lsn", "bytes");
    for (path, base_lsn, bytes) in &segments {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        println!("  {name:<40} {base_lsn:>12} {bytes:>12}");
    }

    let sessions = engine.sessions()?;
    println!("\nsessions ({}):", sessions.len());
    println!(
        "  {:<36} {:>6} {:>15} {:>15}",
        "session", "epoch", "opened ms", "expired ms"
    );
    for SessionMeta {
        id,
        epoch,
        opened_at_ms,
        expired_at_ms,
    } in &sessions
    {
        let expired = expired_at_ms.map_or_else(|| "-".to_owned(), |t| t.to_string());
        println!("  {id:<36} {epoch:>6} {opened_at_ms:>15} {expired:>15}");
    }

    let streams = engine.streams()?;
    println!("\nstreams ({}):", streams.len());
    println!(
        "  {:>8} {:<24} {:>6} {:<10} {:>8} {:>9} {:>9} {:<16} reason",
        "stream", "session", "epoch", "state", "head", "watermark", "lease ms", "correlation"
    );
    for s in &streams {
        print_stream(s);
    }
    Ok(())
}

fn print_stream(s: &StreamMeta) {
    let lease = s
        .lease_ms
        .map_or_else(|| "-".to_owned(), |ms| ms.to_string());
    let correlation = s.correlation.as_deref().unwrap_or("-");
    let mut reason = s.end_reason.clone().unwrap_or_default();
    if s.has_terminal_frame {
        reason = format!("terminal frame at seq {}; {reason}", s.head);
    }
    println!(
        "  {:>8} {:<24} {:>6} {:<10} {:>8} {:>9} {:>9} {:<16} {}",
        s.id,
        s.session,
        s.epoch,
        s.state.as_str(),
        s.head,
        s.watermark,
        lease,
        correlation,
        reason.trim_end_matches("; "),
    );
}
