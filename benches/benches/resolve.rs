//! `Engine::resolve` on a populated engine: the RESUMABLE hit path, cycling over many
//! cursors, and one bench per other verdict kind, each checked to give that verdict first.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cursorlog_benches::{criterion_config, fill, open_stream, payload, Fixture};
use cursorlog_engine::{Cursor, Engine, NewEvent, SyncPolicy, Verdict};

/// Sessions in the populated engine.
const SESSIONS: usize = 2000;
/// Streams per session.
const STREAMS_PER_SESSION: usize = 4;
/// Events per stream.
const EVENTS_PER_STREAM: u64 = 16;
const SEGMENT_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// One resolve call's inputs.
struct Case {
    session: String,
    cursor: String,
    declared: Option<u64>,
}

fn session_name(i: usize) -> String {
    format!("mcp-session-{i:06}")
}

/// Fills the engine with `SESSIONS` × `STREAMS_PER_SESSION` open streams of
/// `EVENTS_PER_STREAM` events; returns a RESUMABLE case for a mid-stream cursor of each.
fn populate(engine: &Engine) -> Vec<Case> {
    let mut cases = Vec::with_capacity(SESSIONS * STREAMS_PER_SESSION);
    for i in 0..SESSIONS {
        let session = session_name(i);
        for _ in 0..STREAMS_PER_SESSION {
            let stream = open_stream(engine, &session);
            fill(engine, &session, stream, EVENTS_PER_STREAM as usize, 16);
            cases.push(Case {
                session: session.clone(),
                cursor: Cursor::new(1, stream, EVENTS_PER_STREAM / 2).to_string(),
                declared: Some(stream),
            });
        }
    }
    cases
}

/// One case per non-RESUMABLE verdict, set up inside the populated engine.
fn other_verdicts(engine: &Engine, resumable: &Case) -> Vec<(Verdict, Case)> {
    let case = |session: &str, cursor: Cursor, declared: Option<u64>| Case {
        session: session.to_owned(),
        cursor: cursor.to_string(),
        declared,
    };
    let mut out = Vec::new();
    out.push((
        Verdict::MalformedCursor,
        Case {
            session: resumable.session.clone(),
            cursor: "12-not-a-cursor".to_owned(),
            declared: None,
        },
    ));
    out.push((
        Verdict::UnknownSession,
        Case {
            session: "mcp-session-never-opened".to_owned(),
            cursor: resumable.cursor.clone(),
            declared: None,
        },
    ));

    // A session that moved on to epoch 2; the cursor is from epoch 1.
    let old = "mcp-session-epoch";
    let stream = open_stream(engine, old);
    fill(engine, old, stream, 4, 4);
    engine.advance_epoch(old).expect("advancing the epoch");
    out.push((
        Verdict::EpochMismatch,
        case(old, Cursor::new(1, stream, 2), Some(stream)),
    ));

    // Another session's stream, presented under session 0: nothing may be revealed.
    let cursor: Cursor = resumable.cursor.parse().expect("a valid cursor");
    let foreign = open_stream(engine, "mcp-session-foreign");
    fill(engine, "mcp-session-foreign", foreign, 4, 4);
    out.push((
        Verdict::UnknownCursor,
        case(
            &resumable.session,
            Cursor::new(1, foreign, 2),
            Some(foreign),
        ),
    ));
    out.push((
        Verdict::StreamMismatch,
        case(&resumable.session, cursor, Some(cursor.stream + 1)),
    ));

    // A completed stream; the cursor is its terminal event (seed 000).
    let done = "mcp-session-completed";
    let stream = open_stream(engine, done);
    fill(engine, done, stream, 4, 4);
    let terminated = engine
        .complete(done, stream, Some(5), NewEvent::new("result", payload()))
        .expect("completing a stream");
    out.push((
        Verdict::StreamTerminated,
        case(done, terminated.cursor, Some(stream)),
    ));

    // A trimmed stream; the cursor is below the watermark.
    let trimmed = "mcp-session-trimmed";
    let stream = open_stream(engine, trimmed);
    fill(engine, trimmed, stream, 16, 16);
    engine.trim(trimmed, stream, 8).expect("trimming a stream");
    out.push((
        Verdict::CursorEvicted,
        case(trimmed, Cursor::new(1, stream, 2), Some(stream)),
    ));

    out.push((
        Verdict::CursorAhead,
        case(
            &resumable.session,
            Cursor::new(1, cursor.stream, EVENTS_PER_STREAM + 1),
            Some(cursor.stream),
        ),
    ));
    out
}

fn resolve_verdict(engine: &Engine, case: &Case) -> Verdict {
    engine
        .resolve(&case.session, &case.cursor, case.declared)
        .expect("resolve")
        .verdict
}

fn resolve(c: &mut Criterion) {
    // Resolve never writes, so the fixture is populated without fsyncs.
    let fixture = Fixture::open(SyncPolicy::Never, SEGMENT_BYTES_MAX);
    let engine = &fixture.engine;
    let cases = populate(engine);
    let first = cases.first().expect("at least one populated stream");
    let others = other_verdicts(engine, first);
    for case in &cases {
        assert_eq!(resolve_verdict(engine, case), Verdict::Resumable);
    }
    for (verdict, case) in &others {
        assert_eq!(resolve_verdict(engine, case), *verdict, "{}", case.cursor);
    }

    let mut group = c.benchmark_group("resolve");
    group.throughput(Throughput::Elements(1));
    let mut cycle = cases.iter().cycle();
    group.bench_function(
        BenchmarkId::new("RESUMABLE", format!("{}_streams", cases.len())),
        |b| {
            b.iter(|| {
                let case = cycle.next().expect("a cycle never ends");
                resolve_verdict(engine, case)
            });
        },
    );
    for (verdict, case) in &others {
        group.bench_function(BenchmarkId::from_parameter(verdict.as_str()), |b| {
            b.iter(|| resolve_verdict(engine, case));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = resolve
}
criterion_main!(benches);
