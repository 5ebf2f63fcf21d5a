//! Deterministic simulation: random workloads (sessions, epochs, streams, appends, terminal
//! frames, trims, session expiry, retention passes) through `FaultyFs` with power loss at random
//! points (including mid-write, leaving torn bytes), I/O errors and ENOSPC, checked after every
//! recovery against an in-memory model:
//! * every acknowledged event (sync `Always`) is present and byte-identical, seqs gap-free;
//! * nothing unacknowledged or torn is ever visible;
//! * watermarks and terminal states never go backwards;
//! * every verdict after recovery is the model's.
//!
//! Power losses tear unsynced bytes either as a strict prefix or as any subset of 4 KiB
//! sectors (a multi-page write whose later sectors reached the disk before its earlier ones):
//! even seeds use one, odd seeds the other. Sealed segments are read through `FaultyFs`'s
//! in-memory maps, the production read path.
//!
//! `CURSORLOG_SEED=<n>` reruns one seed; `CURSORLOG_SIM_SEEDS=<count>` runs more (default 24);
//! `CURSORLOG_SIM_STEPS` sets operations per seed (default 150). A failure prints its seed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use cursorlog_engine::{
    Append, Config, Cursor, Engine, Error, Fault, FaultyFs, NewEvent, OpenStream, StreamState,
    Tear, Verdict,
};

/// splitmix64, so a seed reproduces a run exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn bytes(&mut self, max: u64) -> Vec<u8> {
        (0..self.below(max + 1))
            .map(|_| u8::try_from(self.next() & 0xff).unwrap())
            .collect()
    }
}

#[derive(Debug, Clone)]
struct MStream {
    session: String,
    epoch: u64,
    state: StreamState,
    /// Events 1..=head; `None` below the watermark.
    events: Vec<(String, Vec<u8>)>,
    watermark: u64,
}

impl MStream {
    fn head(&self) -> u64 {
        self.events.len() as u64
    }
}

#[derive(Debug, Default)]
struct Model {
    sessions: BTreeMap<String, u64>,
    expired: std::collections::BTreeSet<String>,
    streams: BTreeMap<u64, MStream>,
}

impl Model {
    fn verdict(&self, session: &str, c: Cursor) -> Verdict {
        let Some(&epoch) = self.sessions.get(session) else {
            return Verdict::UnknownSession;
        };
        if self.expired.contains(session) {
            return Verdict::UnknownSession;
        }
        if c.epoch != epoch {
            return Verdict::EpochMismatch;
        }
        let Some(s) = self
            .streams
            .get(&c.stream)
            .filter(|s| s.session == session && s.epoch == c.epoch)
        else {
            return Verdict::UnknownCursor;
        };
        if c.seq > s.head() {
            Verdict::CursorAhead
        } else if s.state != StreamState::Open {
            Verdict::StreamTerminated
        } else if c.seq + 1 < s.watermark {
            Verdict::CursorEvicted
        } else {
            Verdict::Resumable
        }
    }
}

const SESSIONS: [&str; 3] = ["alpha", "beta", "gamma"];

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.retention.check_interval = std::time::Duration::from_secs(3600);
    c
}

fn open(dir: &Path, fs: &FaultyFs) -> Engine {
    Engine::open_with_fs(config(dir), Arc::new(fs.clone()))
        .expect("recovery after a simulated crash must succeed")
}

/// Checks the engine against the model: contents, gap-freedom, verdicts.
fn check(engine: &Engine, model: &Model, seed: u64, step: usize) {
    let ctx = |what: &str| format!("seed {seed} step {step}: {what}");
    for (&id, s) in &model.streams {
        let from = s.watermark.saturating_sub(1);
        let mut got = Vec::new();
        let mut after = from;
        loop {
            let batch = engine
                .read(&s.session, id, after, 64)
                .unwrap_or_else(|e| panic!("{}", ctx(&format!("read {id}: {e}"))));
            if batch.events.is_empty() {
                assert_eq!(
                    batch.head,
                    s.head(),
                    "{}",
                    ctx(&format!("head of stream {id}"))
                );
                assert_eq!(
                    batch.state,
                    s.state,
                    "{}",
                    ctx(&format!("state of stream {id}"))
                );
                break;
            }
            for e in &batch.events {
                assert_eq!(e.seq, after + 1, "{}", ctx("gap-free replay"));
                after = e.seq;
                got.push((e.kind.to_string(), e.payload.to_vec()));
            }
        }
        let want: Vec<_> = s
            .events
            .iter()
            .skip(usize::try_from(from).unwrap())
            .cloned()
            .collect();
        assert_eq!(
            got,
            want,
            "{}",
            ctx(&format!(
                "acknowledged events of stream {id} (from seq {})",
                from + 1
            ))
        );
        for seq in [0, from.saturating_sub(1), from, s.head(), s.head() + 1] {
            let c = Cursor::new(s.epoch, id, seq);
            let r = engine.resolve(&s.session, &c.to_string(), None).unwrap();
            assert_eq!(
                r.verdict,
                model.verdict(&s.session, c),
                "{}",
                ctx(&format!("verdict for {c}"))
            );
        }
    }
    for (session, &epoch) in &model.sessions {
        let c = Cursor::new(epoch, 1, 0);
        let r = engine.resolve(session, &c.to_string(), None).unwrap();
        assert_eq!(
            r.verdict,
            model.verdict(session, c),
            "{}",
            ctx("session verdict")
        );
    }
}

/// One mutating operation; applies it to the model only if the engine acknowledged it
/// (the model changes only after the engine call returned `Ok`).
fn mutate(engine: &Engine, model: &mut Model, rng: &mut Rng) -> Result<(), Error> {
    let session = SESSIONS[usize::try_from(rng.below(3)).unwrap()].to_owned();
    let open_streams: Vec<u64> = model
        .streams
        .iter()
        .filter(|(_, s)| s.state == StreamState::Open)
        .map(|(id, _)| *id)
        .collect();
    let pick = |rng: &mut Rng| {
        open_streams
            .get(usize::try_from(rng.below(open_streams.len() as u64)).unwrap())
            .copied()
    };
    match rng.below(100) {
        0..=7 => {
            let info = engine.open_session(&session)?;
            assert_eq!(info.epoch, *model.sessions.entry(session).or_insert(1));
        }
        8..=11 if model.sessions.contains_key(&session) => {
            let adv = engine.advance_epoch(&session)?;
            let epoch = model.sessions.get_mut(&session).unwrap();
            *epoch += 1;
            assert_eq!(adv.epoch, *epoch);
            for s in model
                .streams
                .values_mut()
                .filter(|s| s.session == session && s.state == StreamState::Open)
            {
                s.state = StreamState::Superseded;
            }
        }
        12..=25 if model.sessions.contains_key(&session) => {
            let epoch = model.sessions[&session];
            let st = engine.open_stream(OpenStream {
                session: session.clone(),
                epoch,
                correlation: None,
                lease_ms: None,
            })?;
            let fresh = MStream {
                session,
                epoch,
                state: StreamState::Open,
                events: Vec::new(),
                watermark: 1,
            };
            assert!(
                model.streams.insert(st.stream, fresh).is_none(),
                "stream id reused"
            );
        }
        26..=80 => {
            let Some(id) = pick(rng) else { return Ok(()) };
            let s = &model.streams[&id];
            // Now and then a group spanning several 4 KiB sectors, so a power loss can keep
            // some of its sectors and not others.
            let max = if rng.below(3) == 0 { 5000 } else { 300 };
            let events: Vec<NewEvent> = (0..1 + rng.below(4))
                .map(|i| NewEvent::new(format!("k{i}"), rng.bytes(max)))
                .collect();
            let a = engine.append(Append {
                session: s.session.clone(),
                stream: id,
                expected_next_seq: Some(s.head() + 1),
                events: events.clone(),
            })?;
            let s = model.streams.get_mut(&id).unwrap();
            assert_eq!(a.first_seq, s.head() + 1);
            s.events
                .extend(events.into_iter().map(|e| (e.kind, e.payload)));
        }
        81..=87 => {
            let Some(id) = pick(rng) else { return Ok(()) };
            let session = model.streams[&id].session.clone();
            let frame = NewEvent::new("result", rng.bytes(100));
            engine.complete(&session, id, None, frame.clone())?;
            let s = model.streams.get_mut(&id).unwrap();
            s.events.push((frame.kind, frame.payload));
            s.state = StreamState::Completed;
        }
        88..=90 => {
            let Some(id) = pick(rng) else { return Ok(()) };
            let session = model.streams[&id].session.clone();
            engine.abort(&session, id, "gave up", None)?;
            model.streams.get_mut(&id).unwrap().state = StreamState::Aborted;
        }
        91 if model.sessions.contains_key(&session) && !model.expired.contains(&session) => {
            let expired = engine.expire_session(&session)?;
            let mut aborted = Vec::new();
            for (id, s) in &mut model.streams {
                if s.session == session && s.state == StreamState::Open {
                    s.state = StreamState::Aborted;
                    aborted.push(*id);
                }
            }
            assert_eq!(
                expired.aborted, aborted,
                "expiry aborts exactly the open streams"
            );
            model.expired.insert(session);
        }
        92..=94 => {
            // Retires segments whose events are all below their watermarks; changes nothing
            // a client can observe.
            engine.run_retention()?;
        }
        _ => {
            let ids: Vec<u64> = model.streams.keys().copied().collect();
            let Some(&id) = ids.get(usize::try_from(rng.below(ids.len() as u64)).unwrap()) else {
                return Ok(());
            };
            let s = &model.streams[&id];
            let up_to = rng.below(s.head() + 1);
            let wm = engine.trim(&s.session.clone(), id, up_to)?;
            let s = model.streams.get_mut(&id).unwrap();
            assert!(wm >= s.watermark, "watermark went backwards");
            s.watermark = wm;
        }
    }
    Ok(())
}

/// What a run exercised, so the test can insist the faults actually bit.
#[derive(Debug, Default)]
struct Exercised {
    crashes: u64,
    /// Crashes of seeds that tear sector subsets.
    sector_tear_crashes: u64,
    torn_bytes: u64,
    /// Torn-tail frames found valid after the damage (only sector tears leave them).
    frames_after_damage: u64,
    rebuilds: u64,
    segments_retired: u64,
}

fn run_seed(seed: u64, steps: usize) -> Exercised {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new(seed);
    let sectors = seed % 2 == 1;
    fs.set_tear(if sectors { Tear::Sectors } else { Tear::Prefix });
    let mut rng = Rng(seed ^ 0xC0FF_EE00);
    let mut model = Model::default();
    let mut engine = open(dir.path(), &fs);
    let mut seen = Exercised::default();
    for step in 0..steps {
        let roll = rng.below(100);
        if roll < 6 {
            // Power loss between operations (torn unsynced bytes, if any).
            fs.crash(true);
        } else if roll < 12 {
            // Power loss in the middle of the next operation's write or fsync.
            fs.inject(1 + rng.below(4), Fault::CrashDuringOp);
            let _ = mutate(&engine, &mut model, &mut rng);
            fs.crash(true);
        } else if roll < 15 {
            // The next write or sync fails (EIO) or the disk is full: the engine must poison
            // itself, acknowledge nothing, and lose nothing after a restart.
            let fault = if rng.below(2) == 0 {
                Fault::Eio
            } else {
                Fault::NoSpace
            };
            fs.inject(1 + rng.below(3), fault);
            for _ in 0..3 {
                let _ = mutate(&engine, &mut model, &mut rng);
            }
            fs.crash(false);
        } else {
            match mutate(&engine, &mut model, &mut rng) {
                Ok(()) => {}
                Err(
                    Error::StreamTerminated { .. } | Error::UnknownSession | Error::SessionExpired,
                ) => {}
                Err(e) => panic!("seed {seed} step {step}: unexpected error without a fault: {e}"),
            }
            continue;
        }
        seen.crashes += 1;
        seen.sector_tear_crashes += u64::from(sectors);
        seen.segments_retired += engine.stats().unwrap().segments_deleted;
        drop(engine);
        fs.revive();
        if rng.below(4) == 0 {
            // Lose the derived index too: it must be rebuilt from the log alone.
            std::fs::remove_dir_all(dir.path().join("index")).unwrap();
        }
        engine = open(dir.path(), &fs);
        seen.torn_bytes += engine.recovery_report().bytes_truncated;
        seen.frames_after_damage += engine.recovery_report().torn_frames_dropped;
        seen.rebuilds += u64::from(engine.recovery_report().index_rebuilt);
        check(&engine, &model, seed, step);
    }
    check(&engine, &model, seed, steps);
    seen
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn acknowledged_events_survive_crashes_torn_writes_and_io_errors() {
    let steps = env_u64("CURSORLOG_SIM_STEPS").map_or(150, |n| usize::try_from(n).unwrap());
    let seeds: Vec<u64> = match env_u64("CURSORLOG_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_u64("CURSORLOG_SIM_SEEDS").unwrap_or(24))
            .map(|i| 0x5EED_0000 + i)
            .collect(),
    };
    let many = seeds.len() >= 8;
    let mut total = Exercised::default();
    for seed in seeds {
        match std::panic::catch_unwind(|| run_seed(seed, steps)) {
            Ok(seen) => {
                total.crashes += seen.crashes;
                total.sector_tear_crashes += seen.sector_tear_crashes;
                total.torn_bytes += seen.torn_bytes;
                total.frames_after_damage += seen.frames_after_damage;
                total.rebuilds += seen.rebuilds;
                total.segments_retired += seen.segments_retired;
            }
            Err(e) => {
                eprintln!("simulation failed: rerun with CURSORLOG_SEED={seed}");
                std::panic::resume_unwind(e);
            }
        }
    }
    eprintln!("simulation: {total:?}");
    if many {
        assert!(
            total.crashes > 0
                && total.sector_tear_crashes > 0
                && total.frames_after_damage > 0
                && total.torn_bytes > 0
                && total.rebuilds > 0
                && total.segments_retired > 0,
            "the faults never bit: {total:?}"
        );
    }
}
