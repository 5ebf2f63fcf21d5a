//! Fuzzing the bytes of a data directory: a coverage-free mutational harness that runs on
//! stable Rust (no libFuzzer).
//!
//! Seeds are real data directories: one the engine writes here (every record type, small
//! segments) and the committed format fixtures (`tests/fixtures/format-v1`, `-v2`; version 1
//! goes through the upgrade path). Each iteration applies one to four structured mutations
//! (`fuzz_segments/mutate.rs`), runs `verify`, opens the directory (usually on the in-memory
//! `FaultyFs`, one iteration in eight on the real file system, which sealed segments are read
//! from as in production; sometimes with the index the seed left, now stale; a directory that
//! does not open is repaired with `--accept-loss` and opened again), flips bits of the files
//! in place after some opens (bit rot while serving), and then reads every stream
//! the index knows, its outcome, a verdict, every session, the stats, and writes and reads
//! back a new stream. Properties:
//!
//! - nothing panics, on any thread (a panic hook records panics of the engine's threads);
//! - every served event is the stream's and in seq order, gap-free;
//! - after mutations that leave CRCs alone, every served event is exactly the event written
//!   at that (stream, seq): a frame that fails its check is never served;
//! - an event written after a successful open reads back as written.
//!
//! Environment: `CURSORLOG_FUZZ_SECS` (run time, default 3), `CURSORLOG_FUZZ_SEED` (the
//! first iteration's seed; default from the clock, printed), `CURSORLOG_FUZZ_ITERS` (stop
//! after this many iterations). A failure prints the failing iteration's seed (rerun with
//! `CURSORLOG_FUZZ_SEED=<seed> CURSORLOG_FUZZ_ITERS=1`) and writes the mutated directory to
//! a temp dir. Directories under `tests/fuzz-corpus/segments/` are replayed every run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "fuzz_segments/events.rs"]
mod events;
#[path = "fuzz_segments/mutate.rs"]
mod mutate;

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cursorlog_engine::{
    repair_dir_with, verify_dir_with, Append, Config, Engine, Event, FaultyFs, FileSystem,
    ManualClock, NewEvent, OpenStream, StdFs,
};
use mutate::{Image, Rng, SegFile};

/// The harness clock: after every fixture's and seed's record times.
const NOW_MS: u64 = 1_900_000_000_000;
/// Nothing in a seed is ever past its metadata horizon.
const HORIZON_FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Events written at each (stream, seq): every event a log holds.
type Baseline = events::Written;

struct Seed {
    name: String,
    image: Image,
    /// The index directory the seed's engine left (a copy is sometimes opened stale).
    index: PathBuf,
    baseline: Baseline,
    _dir: tempfile::TempDir,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.disk_reserve_bytes = 0;
    c.index_cache_bytes = 1 << 20;
    c.session_idle_ttl = None;
    c.retention.metadata_horizon = HORIZON_FOREVER;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c.clock = Arc::new(ManualClock::new(NOW_MS));
    c
}

fn payload(stream: u64, seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (stream as usize * 7 + seq as usize * 13 + i * 29) as u8)
        .collect()
}

fn stream(e: &Engine, session: &str, correlation: Option<&str>, lease: Option<u64>) -> u64 {
    let epoch = e.open_session(session).expect("session").epoch;
    e.open_stream(OpenStream {
        session: session.into(),
        epoch,
        correlation: correlation.map(Into::into),
        lease_ms: lease,
    })
    .expect("stream")
    .stream
}

fn append(e: &Engine, session: &str, stream: u64, n: u64, len: usize) {
    let events = (0..n)
        .map(|i| {
            let mut ev = NewEvent::new(format!("k{i}"), payload(stream, i, len + i as usize));
            if i % 2 == 0 {
                ev.correlation = Some(format!("c{i}"));
            }
            ev
        })
        .collect();
    e.append(Append {
        session: session.into(),
        stream,
        expected_next_seq: None,
        events,
    })
    .expect("append");
}

/// Writes a directory holding every record type the engine writes in normal use.
fn write_seed(e: &Engine) {
    let a = stream(e, "a", Some("r1"), None);
    append(e, "a", a, 3, 10);
    append(e, "a", a, 1, 300);
    e.complete("a", a, None, NewEvent::new("result", b"done".to_vec()))
        .expect("complete");
    let b = stream(e, "a", Some("r2"), Some(60_000));
    append(e, "a", b, 2, 0);
    e.abort("a", b, "cancelled", None).expect("abort");
    let c = stream(e, "b", None, None);
    e.set_session_state("b", b"{\"init\":1}".to_vec())
        .expect("state");
    for _ in 0..6 {
        append(e, "b", c, 4, 40);
    }
    e.trim("b", c, 10).expect("trim");
    e.advance_epoch("b").expect("advance");
    let d = stream(e, "b", Some("r3"), None);
    append(e, "b", d, 1, 3000);
    append(e, "b", d, 5, 5);
    let f = stream(e, "c", None, None);
    append(e, "c", f, 2, 20);
    e.expire_session("c").expect("expire");
    let g = stream(e, "d", Some("open"), None);
    append(e, "d", g, 3, 7);
}

fn read_image(fs: &dyn FileSystem, dir: &Path) -> Image {
    let mut image: Image = fs
        .list(dir)
        .expect("list")
        .into_iter()
        .filter(|(name, _)| name.ends_with(".seg"))
        .map(|(name, path)| SegFile {
            name,
            bytes: fs.read(&path).expect("read segment"),
        })
        .collect();
    image.sort_by(|a, b| a.name.cmp(&b.name));
    image
}

fn load_faulty(image: &Image, dir: &Path) -> FaultyFs {
    let fs = FaultyFs::new(1);
    for f in image {
        let file = fs.create_new(&dir.join(&f.name)).expect("create");
        file.write_all_at(&f.bytes, 0).expect("write");
        file.sync_data().expect("sync");
    }
    fs.sync_dir(dir).expect("sync dir");
    fs
}

fn write_real(image: &Image, dir: &Path) {
    for f in image {
        std::fs::write(dir.join(&f.name), &f.bytes).expect("write segment");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// What one exercise of an opened engine served.
#[derive(Default)]
struct Served {
    events: u64,
    /// Why opens were refused: the error's variant (and corruption kind), counted.
    refused: std::collections::BTreeMap<String, u64>,
    /// Why reads of an opened directory failed, counted the same way.
    read_errors: std::collections::BTreeMap<String, u64>,
    /// What `repair --accept-loss` made of directories that did not open.
    repair: std::collections::BTreeMap<String, u64>,
}

/// An engine error's variant, with its corruption kind when it has one.
fn error_key(err: &cursorlog_engine::Error) -> String {
    let debug = format!("{err:?}");
    let variant: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
    let kind = debug.split("kind: ").nth(1).map(|k| {
        k.chars()
            .take_while(|c| c.is_alphanumeric())
            .collect::<String>()
    });
    kind.map_or(variant.clone(), |k| format!("{variant}/{k}"))
}

/// What may be served.
struct Oracle<'a> {
    /// Events of the CRC-valid frames of the opened directory: every read event is one.
    image: Baseline,
    /// After raw mutations: what the seed wrote, which every served event must be.
    written: Option<&'a Baseline>,
    /// With the seed's (stale) index: the index keeps its own copy of terminal frames, so an
    /// outcome's frame may come from the seed rather than from this directory's frames.
    index_source: Option<&'a Baseline>,
}

impl Oracle<'_> {
    fn read_event(&self, ev: &Event) -> Result<(), String> {
        if !events::holds(&self.image, ev) {
            return Err(format!(
                "no CRC-valid frame of the directory holds it; there: {:?}",
                self.image.get(&(ev.stream, ev.seq))
            ));
        }
        self.written_event(ev)
    }

    fn written_event(&self, ev: &Event) -> Result<(), String> {
        match self.written {
            Some(w) if !events::holds(w, ev) => Err(format!(
                "the seed wrote something else there: {:?}",
                w.get(&(ev.stream, ev.seq))
            )),
            _ => Ok(()),
        }
    }

    fn outcome_frame(&self, ev: &Event) -> Result<(), String> {
        if self.index_source.is_some_and(|b| events::holds(b, ev)) {
            return self.written_event(ev);
        }
        self.read_event(ev)
    }
}

/// Reads everything the engine knows and checks what it serves against `oracle`; `Err`
/// names a violation.
fn exercise(e: &Engine, oracle: &Oracle<'_>, served: &mut Served) -> Result<(), String> {
    let _ = e.stats();
    if let Ok(sessions) = e.sessions() {
        for s in sessions {
            let _ = e.session(&s.id);
        }
    }
    let streams = match e.streams() {
        Ok(s) => s,
        Err(_) => return Ok(()),
    };
    for meta in streams {
        let mut after = meta.watermark.saturating_sub(1);
        for _ in 0..10_000 {
            let batch = match e.read(&meta.session, meta.id, after, 64) {
                Ok(batch) => batch,
                Err(err) => {
                    *served.read_errors.entry(error_key(&err)).or_default() += 1;
                    break;
                }
            };
            for ev in &batch.events {
                if ev.stream != meta.id || Some(ev.seq) != after.checked_add(1) {
                    return Err(format!(
                        "read of stream {} after {after} served stream {} seq {}",
                        meta.id, ev.stream, ev.seq
                    ));
                }
                if let Err(why) = oracle.read_event(ev) {
                    return Err(format!(
                        "read served stream {} seq {}: {ev:?}: {why}",
                        ev.stream, ev.seq
                    ));
                }
                served.events += 1;
                after = ev.seq;
            }
            if batch.events.is_empty() || batch.end_of_stream {
                break;
            }
        }
        if let Ok(Some(o)) = e.stream_outcome(&meta.session, meta.id) {
            if let Some(f) = &o.frame {
                let check = if f.stream == meta.id {
                    oracle.outcome_frame(f)
                } else {
                    Err("another stream's".into())
                };
                if let Err(why) = check {
                    return Err(format!(
                        "outcome of stream {} served frame {f:?}: {why}",
                        meta.id
                    ));
                }
            }
        }
        let cursor = format!("{}-{}-{after}", meta.epoch, meta.id);
        let _ = e.resolve(&meta.session, &cursor, Some(meta.id));
        if let Some(c) = &meta.correlation {
            let _ = e.outcome(&meta.session, c);
        }
    }
    // A write after a successful open reads back as written.
    if let Ok(s) = e.open_session("fuzz-writer") {
        let opened = e.open_stream(OpenStream {
            session: "fuzz-writer".into(),
            epoch: s.epoch,
            correlation: None,
            lease_ms: None,
        });
        if let Ok(st) = opened {
            let ev = NewEvent::new("w", b"written after open".to_vec());
            let appended = e.append(Append {
                session: "fuzz-writer".into(),
                stream: st.stream,
                expected_next_seq: Some(1),
                events: vec![ev],
            });
            if appended.is_ok() {
                match e.read("fuzz-writer", st.stream, 0, 8) {
                    Ok(b)
                        if b.events.len() == 1
                            && &b.events[0].payload[..] == b"written after open" => {}
                    other => return Err(format!("a new write read back as {other:?}")),
                }
            }
        }
    }
    Ok(())
}

/// Bit rot while the engine is open: flips a few bits of the segment files in place (on
/// the real file system, under the open engine).
fn rot_in_place(rng: &mut Rng, fs: Option<&FaultyFs>, dir: &Path) {
    use std::os::unix::fs::FileExt;
    let files: Vec<PathBuf> = match fs {
        Some(fs) => fs.files(),
        None => std::fs::read_dir(dir)
            .expect("read dir")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect(),
    };
    let segments: Vec<PathBuf> = files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    for _ in 0..1 + rng.below(4) {
        let Some(path) = segments.get(rng.below(segments.len())) else {
            return;
        };
        let bit = rng.below(8) as u8;
        match fs {
            Some(fs) => {
                let len = fs.durable_len(path).unwrap_or(0) as usize;
                fs.flip_bit(path, rng.below(len) as u64, bit);
            }
            None => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .expect("open segment");
                let len = file.metadata().expect("metadata").len() as usize;
                let at = rng.below(len) as u64;
                let mut b = [0u8];
                if file.read_exact_at(&mut b, at).is_ok() {
                    b[0] ^= 1 << bit;
                    file.write_all_at(&b, at).expect("rot");
                }
            }
        }
    }
}

/// Opens `dir` (segments already in place) and exercises it; with `rot`, flips bits of the
/// segment files after the open and before the reads.
fn open_and_check(
    fs: Option<FaultyFs>,
    dir: &Path,
    oracle: &Oracle<'_>,
    rot: &mut Option<Rng>,
    served: &mut Served,
) -> Result<bool, String> {
    let dyn_fs: Arc<dyn FileSystem> = match fs.clone() {
        Some(fs) => Arc::new(fs),
        None => Arc::new(StdFs),
    };
    let _ = verify_dir_with(dyn_fs.as_ref(), dir);
    let engine = match Engine::open_with_fs(config(dir), Arc::clone(&dyn_fs)) {
        Ok(engine) => engine,
        Err(err) => {
            *served.refused.entry(error_key(&err)).or_default() += 1;
            // What an operator does next: `cursorlog verify --repair --accept-loss`, then
            // start again. Repair only cuts, so what the directory serves after it is still
            // checked against the same oracle.
            let repaired = repair_dir_with(dyn_fs.as_ref(), dir, true);
            let reopened = match repaired {
                Ok(_) => Engine::open_with_fs(config(dir), Arc::clone(&dyn_fs)),
                Err(err) => {
                    *served
                        .repair
                        .entry(format!("repair refused: {}", error_key(&err)))
                        .or_default() += 1;
                    return Ok(false);
                }
            };
            match reopened {
                Ok(engine) => {
                    *served
                        .repair
                        .entry("repaired, then opened".into())
                        .or_default() += 1;
                    engine
                }
                Err(err) => {
                    let key = format!("repaired, then refused: {}", error_key(&err));
                    *served.repair.entry(key).or_default() += 1;
                    return Ok(false);
                }
            }
        }
    };
    if let Some(rng) = rot {
        rot_in_place(rng, fs.as_ref(), dir);
    }
    let result = exercise(&engine, oracle, served);
    let _ = engine.close();
    result.map(|()| true)
}

fn make_seed(name: &str, image: Option<Image>) -> Seed {
    let dir = tempfile::tempdir().expect("temp dir");
    let given = image.clone();
    let fs = match image {
        Some(image) => load_faulty(&image, dir.path()),
        None => {
            let fs = FaultyFs::new(7);
            let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone())).expect("open");
            write_seed(&e);
            e.close().expect("close");
            fs
        }
    };
    let e = Engine::open_with_fs(config(dir.path()), Arc::new(fs.clone())).expect("seed opens");
    let mut baseline = Baseline::new();
    if let Some(given) = &given {
        events::collect(given, &mut baseline);
    }
    events::collect(&read_image(&fs, dir.path()), &mut baseline);
    // The oracle agrees with what the engine serves from the unmutated seed.
    for meta in e.streams().expect("streams") {
        let batch = e
            .read(
                &meta.session,
                meta.id,
                meta.watermark.saturating_sub(1),
                100_000,
            )
            .expect("seed reads");
        for ev in batch.events {
            assert!(events::holds(&baseline, &ev), "seed {name}: {ev:?}");
        }
    }
    e.close().expect("close seed");
    // A fixture is mutated as committed (version 1 then goes through the upgrade); the
    // written seed as the baseline's open left it, so its index matches it exactly.
    let image = given.unwrap_or_else(|| read_image(&fs, dir.path()));
    assert!(!baseline.is_empty(), "seed {name} serves events");
    Seed {
        name: name.into(),
        image,
        index: dir.path().join("index"),
        baseline,
        _dir: dir,
    }
}

fn fixture_image(version: u32) -> Image {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(format!("format-v{version}/data"));
    read_image(&StdFs, &dir)
}

fn corpus_images() -> Vec<(String, Image)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus/segments");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Image)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                read_image(&StdFs, &e.path()),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Panics of any thread (the engine's writer and background threads included).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn install_panic_hook() {
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current().name().unwrap_or("?").to_owned();
        let at = info
            .location()
            .map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()));
        PANICS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("thread {thread} panicked at {at}: {info}"));
        previous(info);
    }));
}

fn take_panics() -> Vec<String> {
    std::mem::take(
        &mut *PANICS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// Runs one mutated image; `Err` is a finding.
fn run_image(
    image: &Image,
    seed: Option<&Seed>,
    baseline: Option<&Baseline>,
    real_fs: bool,
    stale_index: bool,
    mut rot: Option<Rng>,
    served: &mut Served,
) -> Result<bool, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    if let (true, Some(s)) = (stale_index, seed) {
        copy_dir(&s.index, &dir.path().join("index"));
    }
    // Whatever is served must come from a CRC-valid frame of this directory and, after raw
    // mutations only, be what the seed wrote there.
    let mut oracle = Oracle {
        image: Baseline::new(),
        written: baseline,
        index_source: seed.filter(|_| stale_index).map(|s| &s.baseline),
    };
    events::collect(image, &mut oracle.image);
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        if real_fs {
            write_real(image, dir.path());
            open_and_check(None, dir.path(), &oracle, &mut rot, served)
        } else {
            let fs = load_faulty(image, dir.path());
            open_and_check(Some(fs), dir.path(), &oracle, &mut rot, served)
        }
    }));
    let panics = take_panics();
    match outcome {
        Ok(_) if !panics.is_empty() => Err(panics.join("\n")),
        Ok(r) => r,
        Err(_) => Err(format!("panic: {}", panics.join("\n"))),
    }
}

fn save_failure(image: &Image, iter_seed: u64) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cursorlog-fuzz-segments-{iter_seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir failure dir");
    write_real(image, &dir);
    dir
}

#[test]
fn fuzz_segments() {
    install_panic_hook();
    let secs = env_u64("CURSORLOG_FUZZ_SECS").unwrap_or(3);
    let max_iters = env_u64("CURSORLOG_FUZZ_ITERS").unwrap_or(u64::MAX);
    let first_seed = env_u64("CURSORLOG_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("fuzz_segments: seed {first_seed}, {secs} s");

    // The committed corpus: interesting inputs found earlier, replayed every run.
    let corpus = corpus_images();
    let mut replayed = Served::default();
    for (name, image) in &corpus {
        for real_fs in [false, true] {
            if let Err(e) = run_image(image, None, None, real_fs, false, None, &mut replayed) {
                panic!("corpus entry {name} (real fs: {real_fs}): {e}");
            }
        }
    }
    eprintln!(
        "fuzz_segments: replayed {} corpus entries, {} events served and checked",
        corpus.len(),
        replayed.events
    );

    let seeds = [
        make_seed("written", None),
        make_seed("format-v1", Some(fixture_image(1))),
        make_seed("format-v2", Some(fixture_image(2))),
    ];
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut iter_seed = first_seed;
    let (mut iters, mut opened, mut served) = (0u64, 0u64, Served::default());
    let mut examples = std::collections::BTreeMap::new();
    while Instant::now() < deadline && iters < max_iters {
        let mut rng = Rng::new(iter_seed);
        let seed = &seeds[rng.below(seeds.len())];
        let mut image = seed.image.clone();
        let mut steps = Vec::new();
        let mut crc_fixed = false;
        let count = if rng.one_in(2) { 1 } else { 2 + rng.below(3) };
        for _ in 0..count {
            let (what, fixed) = mutate::mutate(&mut rng, &mut image);
            crc_fixed |= fixed;
            steps.push(what);
        }
        let real_fs = rng.one_in(8);
        let stale_index = rng.one_in(4);
        let rot = rng.one_in(4).then(|| Rng::new(rng.next_u64()));
        if rot.is_some() {
            steps.push("bit rot after open".into());
        }
        let baseline = (!crc_fixed).then_some(&seed.baseline);
        let repair_before = served.repair.clone();
        let result = run_image(
            &image,
            Some(seed),
            baseline,
            real_fs,
            stale_index,
            rot,
            &mut served,
        );
        // The first directory of each kind that repair left unopenable, for the report.
        for (key, n) in &served.repair {
            if key.contains("refused") && repair_before.get(key) != Some(n) {
                examples
                    .entry(key.clone())
                    .or_insert_with(|| format!("seed {iter_seed} ({}): {steps:?}", seed.name));
            }
        }
        match result {
            Ok(true) => opened += 1,
            Ok(false) => {}
            Err(e) => {
                let path = save_failure(&image, iter_seed);
                panic!(
                    "fuzz_segments finding at iteration {iters}: {e}\nseed {} mutations: {steps:?} \
                     (real fs: {real_fs}, stale index: {stale_index})\nmutated directory: {}\n\
                     reproduce: CURSORLOG_FUZZ_SEED={iter_seed} CURSORLOG_FUZZ_ITERS=1 \
                     cargo test -p cursorlog-engine --test fuzz_segments",
                    seed.name,
                    path.display()
                );
            }
        }
        iters += 1;
        iter_seed = Rng::new(iter_seed).next_u64();
    }
    eprintln!(
        "fuzz_segments: {iters} iterations in {:.1} s, {opened} opened, {} events served and checked; \
         opens refused: {:?}; reads refused: {:?}; repair --accept-loss of refused ones: {:?}",
        start.elapsed().as_secs_f64(),
        served.events,
        served.refused,
        served.read_errors,
        served.repair
    );
    for (key, example) in examples {
        eprintln!("fuzz_segments: {key}, first at {example}");
    }
}
