//! The format-compatibility promise: a data directory written by an earlier on-disk format
//! version, committed under `tests/fixtures/format-v<N>/`, opens with this build and serves
//! exactly what the version that wrote it served.
//!
//! `tests/fixtures/format-v<N>/data/` is the directory (segments only: the index is derived
//! and rebuilt from the log) and `expected.txt` is what that version answered to a fixed list
//! of probes (every verdict, read, outcome and the metadata of every session and stream),
//! printed by [`describe`]. Each fixture was generated once, by the build of its version,
//! with `generate_fixture` below; later builds must never regenerate an old version's
//! fixture, only add the new one's. `format-v3-tasks` does the same for the task records
//! (16–27), added under format 3 after the `format-v3` fixture was made (`fixture/tasks.rs`):
//! it also pins what routing answers (RouteTaskMessage, probed on a scratch copy) for open,
//! answered and dead routes, one open route known only from a TaskRoutes (27) record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "fixture/tasks.rs"]
mod tasks;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cursorlog_engine::{Append, Config, Engine, Error, NewEvent, OpenStream, StreamMeta};

/// Far enough that nothing in a fixture is ever past its metadata horizon when served.
const HORIZON_FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn fixture_dir(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(format!("format-v{version}"))
}

fn serving_config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.retention.metadata_horizon = HORIZON_FOREVER;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c
}

fn payload(tag: u64, seq: u64) -> Vec<u8> {
    let len = 1 + ((tag * 31 + seq * 17) % 97) as usize;
    (0..len)
        .map(|i| (tag as usize * 7 + seq as usize * 13 + i * 29) as u8)
        .collect()
}

fn append(e: &Engine, session: &str, stream: u64, n: u64) {
    for _ in 0..n {
        let head = e
            .read(session, stream, u64::MAX - 1, 1)
            .map_or(0, |b| b.head);
        let seq = head + 1;
        let mut ev = NewEvent::new(format!("k{}", seq % 3), payload(stream, seq));
        if seq.is_multiple_of(4) {
            ev.correlation = Some(format!("c{seq}"));
        }
        e.append(Append {
            session: session.into(),
            stream,
            expected_next_seq: Some(seq),
            events: vec![ev],
        })
        .expect("append");
    }
}

fn open_stream(e: &Engine, session: &str, correlation: Option<&str>) -> u64 {
    let epoch = e.open_session(session).expect("session").epoch;
    e.open_stream(OpenStream {
        session: session.into(),
        epoch,
        correlation: correlation.map(Into::into),
        lease_ms: None,
    })
    .expect("open stream")
    .stream
}

/// Writes a data directory that holds every record type of the current format: sessions
/// opened, advanced, expired and forgotten; streams open, completed (with a frame), aborted
/// (with and without one), superseded and forgotten; trims; carried-forward snapshots; a
/// correlation id answered twice; many small segments, some retired.
fn generate(dir: &Path) {
    // Phase 1: a metadata horizon of zero, so retention forgets what ended (Forgotten
    // records) and carries forward what lives (Snapshot records).
    let mut c = serving_config(dir);
    c.retention.metadata_horizon = Duration::ZERO;
    let e = Engine::open(c).unwrap();
    e.open_session("alpha").unwrap();
    let g1 = open_stream(&e, "gamma", Some("bulk"));
    append(&e, "gamma", g1, 30);
    let gone = open_stream(&e, "s-forgotten", Some("r1"));
    append(&e, "s-forgotten", gone, 3);
    e.complete(
        "s-forgotten",
        gone,
        Some(4),
        NewEvent::new("result", b"{\"r\":1}".to_vec()),
    )
    .unwrap();
    let filler = open_stream(&e, "s-forgotten", None);
    append(&e, "s-forgotten", filler, 60);
    e.expire_session("s-forgotten").unwrap();
    e.trim("s-forgotten", gone, 4).unwrap();
    e.trim("s-forgotten", filler, 60).unwrap();
    e.trim("gamma", g1, 30).unwrap();
    assert!(e.run_retention().unwrap() > 0, "phase 1 retires segments");
    e.close().unwrap();
    drop(e);

    // Phase 2: remember everything.
    let e = Engine::open(serving_config(dir)).unwrap();
    append(&e, "gamma", g1, 90);
    e.trim("gamma", g1, 100).unwrap();

    let a1 = open_stream(&e, "alpha", Some("1"));
    append(&e, "alpha", a1, 5);
    e.complete(
        "alpha",
        a1,
        Some(6),
        NewEvent::new("result", b"{\"ok\":1}".to_vec()),
    )
    .unwrap();
    let a2 = open_stream(&e, "alpha", Some("2"));
    append(&e, "alpha", a2, 3);
    e.abort("alpha", a2, "gave up", None).unwrap();
    let a3 = open_stream(&e, "alpha", Some("3"));
    append(&e, "alpha", a3, 2);
    e.abort(
        "alpha",
        a3,
        "tool failed",
        Some(NewEvent::new("error", b"{\"e\":-1}".to_vec())),
    )
    .unwrap();
    let a4 = open_stream(&e, "alpha", Some("1"));
    append(&e, "alpha", a4, 4);
    let a5 = open_stream(&e, "alpha", None);
    append(&e, "alpha", a5, 2);
    e.advance_epoch("alpha").unwrap();
    let a6 = open_stream(&e, "alpha", Some("6"));
    append(&e, "alpha", a6, 6);
    e.trim("alpha", a6, 2).unwrap();

    let b1 = open_stream(&e, "beta", Some("b"));
    append(&e, "beta", b1, 2);
    e.expire_session("beta").unwrap();

    // Format 2: session state (and, on close, the shutdown marker).
    e.open_session_with_state(
        "delta",
        Some(b"{\"protocolVersion\":\"2025-11-25\"}".to_vec()),
    )
    .unwrap();
    let d1 = open_stream(&e, "delta", Some("d"));
    append(&e, "delta", d1, 3);
    e.set_session_state("delta", b"{\"protocolVersion\":\"2026-07-28\"}".to_vec())
        .unwrap();
    e.close().unwrap();
}

/// What the engine serves from a fixture written by format `version`, as text: one line per
/// probe (what a version could store decides what is probed).
fn describe(e: &Engine, version: u32) -> String {
    let mut out = String::new();
    let mut sessions = e.sessions().unwrap();
    sessions.sort_by(|a, b| a.id.cmp(&b.id));
    for s in &sessions {
        writeln!(
            out,
            "session {} epoch={} opened_at={} expired_at={:?}",
            s.id, s.epoch, s.opened_at_ms, s.expired_at_ms
        )
        .unwrap();
        if version >= 2 {
            let view = e.session(&s.id).unwrap().unwrap();
            writeln!(out, "  state {}", hex(&view.state)).unwrap();
        }
    }
    let mut streams: Vec<StreamMeta> = e.streams().unwrap();
    streams.sort_by_key(|s| s.id);
    for s in &streams {
        writeln!(
            out,
            "stream {} session={} epoch={} state={} head={} watermark={} correlation={:?} \
             opened_at={} ended_at={:?} reason={:?} frame={} lease={:?}",
            s.id,
            s.session,
            s.epoch,
            s.state,
            s.head,
            s.watermark,
            s.correlation,
            s.opened_at_ms,
            s.ended_at_ms,
            s.end_reason,
            s.has_terminal_frame,
            s.lease_ms
        )
        .unwrap();
    }
    let probe_sessions: &[&str] = if version >= 2 {
        &["alpha", "beta", "gamma", "delta", "s-forgotten", "nobody"]
    } else {
        &["alpha", "beta", "gamma", "s-forgotten", "nobody"]
    };
    let max_stream = streams.iter().map(|s| s.id).max().unwrap_or(0);
    // Every stream, one that was forgotten (1), and ids never allocated.
    let mut probe_streams: Vec<u64> = streams.iter().map(|s| s.id).collect();
    probe_streams.extend([1, 2, max_stream + 1, u64::MAX]);
    for &session in probe_sessions {
        for cursor in ["", "x", "1-2", "1-1-1-1", "18446744073709551616-1-1"] {
            let r = e.resolve(session, cursor, None).unwrap();
            writeln!(out, "resolve {session} {cursor:?} -> {}", resolution(&r)).unwrap();
        }
        for &stream in &probe_streams {
            let meta = streams.iter().find(|s| s.id == stream);
            let head = meta.map_or(1, |m| m.head);
            let epoch = meta.map_or(1, |m| m.epoch);
            for seq in [0, 1, head.saturating_sub(1), head, head + 1] {
                for ep in [epoch, epoch + 1] {
                    let cursor = format!("{ep}-{stream}-{seq}");
                    let r = e.resolve(session, &cursor, None).unwrap();
                    writeln!(out, "resolve {session} {cursor} -> {}", resolution(&r)).unwrap();
                    if seq == head {
                        let declared = e
                            .resolve(session, &cursor, Some(stream.wrapping_add(1)))
                            .unwrap();
                        writeln!(
                            out,
                            "resolve {session} {cursor} declared -> {}",
                            resolution(&declared)
                        )
                        .unwrap();
                    }
                }
            }
            if meta.is_none() {
                continue;
            }
            match e.read(session, stream, 0, 10_000) {
                Ok(b) => {
                    writeln!(
                        out,
                        "read {session} {stream} -> head={} state={} end={} events={}",
                        b.head,
                        b.state,
                        b.end_of_stream,
                        b.events.len()
                    )
                    .unwrap();
                    for ev in b.events {
                        writeln!(
                            out,
                            "  event {}/{} kind={} correlation={:?} at={} payload={}",
                            ev.stream,
                            ev.seq,
                            ev.kind,
                            ev.correlation,
                            ev.appended_at_ms,
                            hex(&ev.payload)
                        )
                        .unwrap();
                    }
                }
                Err(err) => {
                    writeln!(out, "read {session} {stream} -> error {}", kind(&err)).unwrap()
                }
            }
            if let Some(m) = meta {
                let after = m.watermark.saturating_sub(1);
                match e.read(session, stream, after, 10_000) {
                    Ok(b) => writeln!(
                        out,
                        "read {session} {stream} after {after} -> {:?}",
                        b.events.iter().map(|ev| ev.seq).collect::<Vec<_>>()
                    )
                    .unwrap(),
                    Err(err) => writeln!(
                        out,
                        "read {session} {stream} after {after} -> error {}",
                        kind(&err)
                    )
                    .unwrap(),
                }
            }
            let outcome = e.stream_outcome(session, stream).unwrap();
            writeln!(
                out,
                "outcome {session} stream {stream} -> {}",
                outcome_line(outcome)
            )
            .unwrap();
        }
        let correlations: &[&str] = if version >= 2 {
            &["1", "2", "3", "6", "b", "d", "bulk", "r1", "none"]
        } else {
            &["1", "2", "3", "6", "b", "bulk", "r1", "none"]
        };
        for &correlation in correlations {
            let outcome = e.outcome(session, correlation).unwrap();
            writeln!(
                out,
                "outcome {session} correlation {correlation} -> {}",
                outcome_line(outcome)
            )
            .unwrap();
        }
    }
    out
}

fn resolution(r: &cursorlog_engine::Resolution) -> String {
    let f = &r.facts;
    format!(
        "{} cursor={} epoch={:?} state={} head={:?} terminal={:?} watermark={:?} expired={} \
         missed={} detail={:?} correlation={:?}",
        r.verdict,
        r.cursor.map_or("none".into(), |c| c.to_string()),
        f.current_epoch,
        f.stream_state.map_or("none", |s| s.as_str()),
        f.head,
        f.terminal_seq,
        f.watermark,
        f.session_expired,
        r.missed_terminal_frame(),
        f.detail,
        f.correlation
    )
}

fn outcome_line(o: Option<cursorlog_engine::Outcome>) -> String {
    match o {
        None => "none".into(),
        Some(o) => format!(
            "stream={} epoch={} state={} terminal_seq={:?} reason={:?} frame={}",
            o.stream,
            o.epoch,
            o.state,
            o.terminal_seq,
            o.reason,
            o.frame.map_or("none".into(), |f| format!(
                "{}/{} kind={} at={} payload={}",
                f.stream,
                f.seq,
                f.kind,
                f.appended_at_ms,
                hex(&f.payload)
            ))
        ),
    }
}

/// The kind of an error, without the parts (paths, offsets) that may differ between builds.
fn kind(err: &Error) -> String {
    match err {
        Error::Evicted {
            stream,
            seq,
            watermark,
        } => format!("evicted {stream}/{seq} watermark {watermark}"),
        Error::UnknownStream(s) => format!("unknown stream {s}"),
        other => format!("{other}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Opens a copy of fixture `version` (opening may write: an upgrade, a new segment) and
/// checks it serves exactly what `expected.txt` recorded.
fn serves_identically(version: u32) {
    let fixture = fixture_dir(version);
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fixture.join("data"), tmp.path());
    let e = Engine::open(serving_config(tmp.path())).expect("the fixture opens");
    let got = describe(&e, version);
    let expected = std::fs::read_to_string(fixture.join("expected.txt")).unwrap();
    if got != expected {
        let first = got
            .lines()
            .zip(expected.lines())
            .position(|(g, x)| g != x)
            .unwrap_or(got.lines().count().min(expected.lines().count()));
        panic!(
            "format-v{version} fixture served differently; first difference at line {}:\n got: {:?}\nwant: {:?}",
            first + 1,
            got.lines().nth(first),
            expected.lines().nth(first)
        );
    }
    // A second open (after whatever the first one wrote) serves the same.
    e.close().unwrap();
    drop(e);
    let e = Engine::open(serving_config(tmp.path())).unwrap();
    assert_eq!(
        describe(&e, version),
        expected,
        "format-v{version} after a reopen"
    );
    e.close().unwrap();
}

#[test]
fn format_v1_fixture_serves_identically() {
    serves_identically(1);
}

#[test]
fn format_v2_fixture_serves_identically() {
    serves_identically(2);
}

/// Durable MCP tasks in every state and their routes, written under format 3 (records
/// 16–27).
#[test]
fn format_v3_tasks_fixture_serves_identically() {
    tasks::serves_identically();
}

/// The tasks fixture holds a record of every task type, TaskRoutes (27) included.
#[test]
fn format_v3_tasks_fixture_holds_every_task_record() {
    tasks::routes::holds_every_task_record();
}

/// The tasks fixture's generator still writes every task record type with this build: its
/// scenario keeps exercising the carry of routes (TaskRoutes) the fixture pins.
#[test]
fn format_v3_tasks_generator_writes_every_task_record() {
    tasks::routes::generator_writes_every_task_record();
}

/// Writes `tests/fixtures/format-v3-tasks` (`cargo test -p cursorlog-engine --test fixture
/// -- --ignored generate_tasks_fixture`). Never rerun it: the fixture is the promise.
#[test]
#[ignore = "writes tests/fixtures/format-v3-tasks; run by hand once"]
fn generate_tasks_fixture() {
    tasks::write_fixture();
}

/// Every format version up to the one this build writes has its fixture, and each serves
/// identically: bumping `FORMAT_VERSION` without committing the new version's fixture (and
/// a test for it) fails here.
#[test]
fn every_format_version_has_a_fixture_that_serves_identically() {
    for version in 1..=cursorlog_engine::FORMAT_VERSION {
        let dir = fixture_dir(version);
        assert!(
            dir.join("data").is_dir() && dir.join("expected.txt").is_file(),
            "no fixture for format version {version} at {}: generate it with \
             CURSORLOG_FIXTURE_VERSION={version} cargo test -p cursorlog-engine --test fixture \
             -- --ignored generate_fixture",
            dir.display()
        );
    }
    let newest = cursorlog_engine::FORMAT_VERSION;
    assert!(
        !fixture_dir(newest + 1).exists(),
        "a fixture for format version {} exists but this build writes version {newest}",
        newest + 1
    );
    serves_identically(newest);
}

/// The version-1 and version-2 fixtures upgraded on a simulated disk that loses power at
/// each step of the upgrade in turn (each rewrite, sync, rename, directory sync): the next
/// open finishes the upgrade (numbering entries on from the segments already upgraded) and
/// serves exactly what the old version served.
#[test]
fn a_crash_at_any_step_of_the_upgrade_loses_nothing() {
    crash_at_any_step_of_the_upgrade(1);
    crash_at_any_step_of_the_upgrade(2);
}

fn crash_at_any_step_of_the_upgrade(version: u32) {
    use cursorlog_engine::{Fault, FaultyFs, FileSystem};
    use std::sync::Arc;

    let fixture = fixture_dir(version);
    let expected = std::fs::read_to_string(fixture.join("expected.txt")).unwrap();
    for step in 1..10_000u64 {
        let fs = FaultyFs::new(step);
        let tmp = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(fixture.join("data")).unwrap() {
            let entry = entry.unwrap();
            let file = fs.create_new(&tmp.path().join(entry.file_name())).unwrap();
            file.write_all_at(&std::fs::read(entry.path()).unwrap(), 0)
                .unwrap();
            file.sync_data().unwrap();
        }
        fs.sync_dir(tmp.path()).unwrap();
        let before = fs.ops();
        fs.inject(step, Fault::CrashDuringOp);
        let opened = Engine::open_with_fs(serving_config(tmp.path()), Arc::new(fs.clone()));
        if fs.ops() < before + step {
            // The open finished before the planned crash: every step has been covered.
            let e = opened.expect("an upgrade without a crash");
            assert_eq!(describe(&e, version), expected, "upgraded without a crash");
            fs.clear_faults();
            e.close().unwrap();
            let crashes = step - 1;
            assert!(crashes >= 10, "crashed at each of many steps: {crashes}");
            return;
        }
        if let Ok(e) = opened {
            e.simulate_crash(); // the crash came after the open, in the writer's first group
        }
        fs.revive();
        let e = Engine::open_with_fs(serving_config(tmp.path()), Arc::new(fs.clone()))
            .unwrap_or_else(|err| panic!("after a crash at step {step}: {err}"));
        assert_eq!(
            describe(&e, version),
            expected,
            "after a crash at step {step}"
        );
        e.close().unwrap();
    }
    panic!("the upgrade did not finish within the steps tried");
}

/// Writes the current format's fixture: `cargo test -p cursorlog-engine --test fixture --
/// --ignored generate_fixture` with `CURSORLOG_FIXTURE_VERSION=<the current version>`.
/// Never rerun it for an older version: its fixture is the promise.
#[test]
#[ignore = "writes tests/fixtures; run by hand once per format version"]
fn generate_fixture() {
    let version: u32 = std::env::var("CURSORLOG_FIXTURE_VERSION")
        .expect("set CURSORLOG_FIXTURE_VERSION to the current format version")
        .parse()
        .unwrap();
    let root = fixture_dir(version);
    assert!(
        !root.exists(),
        "{} exists: fixtures are never regenerated",
        root.display()
    );
    let data = generate_into(&root, generate);
    let e = Engine::open(serving_config(&data)).unwrap();
    let text = describe(&e, version);
    e.close().unwrap();
    drop(e);
    // Opening wrote an index and a lock: the fixture is the segments alone.
    std::fs::remove_dir_all(data.join("index")).unwrap();
    let _ = std::fs::remove_file(data.join("LOCK"));
    std::fs::write(root.join("expected.txt"), text).unwrap();
}

/// Runs `generate` on a temporary directory and keeps its segments (only: the index is
/// derived) in `<root>/data`, which it returns.
fn generate_into(root: &Path, generate: impl FnOnce(&Path)) -> PathBuf {
    let tmp = tempfile::tempdir().unwrap();
    generate(tmp.path());
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for entry in std::fs::read_dir(tmp.path()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name.to_string_lossy().ends_with(".seg") {
            std::fs::copy(entry.path(), data.join(&name)).unwrap();
        }
    }
    data
}
