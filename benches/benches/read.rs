//! Read-after throughput: `Engine::read` in batches of 1024 events from the start of one
//! stream of 200,704 events of 512 bytes. With 1 MiB segments every event lies in a sealed
//! segment (read with positional reads since issue 18; the id `sealed_mmap` is kept so the
//! figures in benches/HISTORY.md stay comparable); a second bench reads a stream held in the
//! active segment for comparison. One iteration reads one full batch.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cursorlog_benches::{criterion_config, fill, open_stream, Fixture};
use cursorlog_engine::{Engine, SyncPolicy};

/// Events per read call.
const READ_BATCH: u32 = 1024;
/// Events in the sealed-segment stream: a whole number of read batches (196 × 1024).
const SEALED_EVENTS: u64 = 196 * READ_BATCH as u64;
/// Events in the active-segment stream (16 × 1024, about 9 MiB).
const ACTIVE_EVENTS: u64 = 16 * READ_BATCH as u64;
/// Small segments, so the sealed stream spans about a hundred sealed segments.
const SMALL_SEGMENT_BYTES_MAX: u64 = 1024 * 1024;
const DEFAULT_SEGMENT_BYTES_MAX: u64 = 64 * 1024 * 1024;
const FILL_BATCH: usize = 256;

/// Appends to another stream until the segment holding `session`'s last event is sealed:
/// the writer seals the active segment at the first commit after it is full.
fn seal_tail(engine: &Engine) {
    let before = engine.segments().len();
    let filler = "bench-filler";
    let stream = open_stream(engine, filler);
    while engine.segments().len() == before {
        fill(engine, filler, stream, FILL_BATCH, FILL_BATCH);
    }
}

/// Reads the whole stream in `READ_BATCH`es, round and round; each iteration is one batch.
fn bench_read(c: &mut Criterion, name: &str, engine: &Engine, session: &str, stream: u64) {
    let head = engine
        .read(session, stream, 0, 1)
        .expect("reading the head")
        .head;
    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Elements(u64::from(READ_BATCH)));
    let mut after = 0;
    group.bench_function(
        BenchmarkId::new(name, format!("{head}_events/batch_{READ_BATCH}")),
        |b| {
            b.iter(|| {
                let batch = engine
                    .read(session, stream, after, READ_BATCH)
                    .expect("read");
                assert_eq!(batch.events.len(), READ_BATCH as usize);
                after = if after + u64::from(READ_BATCH) >= head {
                    0
                } else {
                    after + u64::from(READ_BATCH)
                };
                batch
            });
        },
    );
    group.finish();
}

fn read_sealed(c: &mut Criterion) {
    let fixture = Fixture::open(SyncPolicy::Never, SMALL_SEGMENT_BYTES_MAX);
    let session = "bench-reader";
    let stream = fixture.stream(session);
    fill(
        &fixture.engine,
        session,
        stream,
        SEALED_EVENTS as usize,
        FILL_BATCH,
    );
    seal_tail(&fixture.engine);
    eprintln!(
        "read/sealed: {} events in {} segments of at most {SMALL_SEGMENT_BYTES_MAX} bytes",
        SEALED_EVENTS,
        fixture.engine.segments().len()
    );
    bench_read(c, "sealed_mmap", &fixture.engine, session, stream);
}

fn read_active(c: &mut Criterion) {
    let fixture = Fixture::open(SyncPolicy::Never, DEFAULT_SEGMENT_BYTES_MAX);
    let session = "bench-reader";
    let stream = fixture.stream(session);
    fill(
        &fixture.engine,
        session,
        stream,
        ACTIVE_EVENTS as usize,
        FILL_BATCH,
    );
    assert_eq!(fixture.engine.segments().len(), 1, "one active segment");
    bench_read(c, "active_pread", &fixture.engine, session, stream);
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = read_sealed, read_active
}
criterion_main!(benches);
