//! Fuzzing request decoding: a coverage-free mutational harness (stable Rust, no libFuzzer)
//! over the bytes of every request message of `cursorlog.v1`.
//!
//! Each iteration takes a real encoded request (seeds name live sessions, epochs and streams
//! of a real engine, so calls get past validation into the engine), mutates its bytes
//! (bit flips, overwrites, truncation, duplicated or removed chunks, splices with other
//! requests, appended fields of every wire type with edge values, edited lengths), decodes
//! it with prost as the server's codec does, and hands what decodes to the service handler
//! itself (`CursorLogService`, validation and engine call included). Properties:
//!
//! - nothing panics (a panic hook also catches panics of spawned tasks and threads);
//! - bytes that do not decode are INVALID_ARGUMENT (`cursorlog_proto::codec::invalid_request`);
//! - a decoded request is answered or refused with a typed status, never INTERNAL, UNKNOWN,
//!   DATA_LOSS or UNAVAILABLE (the engine must not be hurt by a request);
//! - a request missing a required field (empty session, stream 0, no events, ...) is
//!   INVALID_ARGUMENT, in `AppendBatch` per item.
//!
//! Environment as for the segment fuzzer: `CURSORLOG_FUZZ_SECS` (default 3),
//! `CURSORLOG_FUZZ_SEED` (first iteration's seed, printed), `CURSORLOG_FUZZ_ITERS`. A failure
//! prints the iteration's seed and writes the request bytes to a temp file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cursorlog_engine::{Config, Engine, SyncPolicy};
use cursorlog_proto::v1 as pb;
use prost::Message;
use tonic::{Code, Status};

use crate::metrics::Metrics;
use crate::service::CursorLogService;

/// The request messages, by index (one per RPC taking a distinct message).
const KINDS: [&str; 16] = [
    "OpenSession",
    "GetSession",
    "SetSessionState",
    "AdvanceEpoch",
    "ExpireSession",
    "OpenStream",
    "Append",
    "AppendBatch",
    "Complete",
    "Abort",
    "KeepAlive",
    "Resolve",
    "Read",
    "GetOutcome",
    "Trim",
    "Stats",
];

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

const INTERESTING: [u64; 11] = [
    0,
    1,
    2,
    255,
    256,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A random field of any wire type, with edge values, appended to a message (proto3 keeps
/// the last value of a scalar field, appends to repeated ones and merges messages).
fn random_field(rng: &mut Rng, seeds: &[(usize, Vec<u8>)]) -> Vec<u8> {
    let field = if rng.one_in(8) {
        rng.below(1 << 29) as u64
    } else {
        1 + rng.below(8) as u64
    };
    let wire = [0, 0, 1, 2, 2, 2, 5, 3, 4, 6, 7][rng.below(11)];
    let mut out = Vec::new();
    put_varint(&mut out, (field << 3) | wire);
    match wire {
        0 => put_varint(&mut out, INTERESTING[rng.below(INTERESTING.len())]),
        1 => out.extend_from_slice(&rng.next_u64().to_le_bytes()),
        5 => out.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes()),
        2 => {
            let body: Vec<u8> = match rng.below(6) {
                0 => Vec::new(),
                1 => seeds[rng.below(seeds.len())].1.clone(),
                2 => vec![0xff, 0xfe, 0xc3],
                3 => vec![b'x'; [65, 257, 1025, 70_000][rng.below(4)]],
                4 => b"1-2-3".to_vec(),
                _ => (0..rng.below(40)).map(|_| rng.next_u64() as u8).collect(),
            };
            if rng.one_in(8) {
                put_varint(&mut out, INTERESTING[rng.below(INTERESTING.len())]);
            } else {
                put_varint(&mut out, body.len() as u64);
            }
            out.extend_from_slice(&body);
        }
        _ => {} // groups and invalid wire types: decoding must refuse them
    }
    out
}

/// The length-delimited fields at the top level of a message: (where the length varint
/// starts, where the payload starts, the payload's length).
fn nested_fields(bytes: &[u8]) -> Vec<(usize, usize, usize)> {
    fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*at)?;
            *at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some(key) = varint(bytes, &mut at) else {
            break;
        };
        match key & 7 {
            0 if varint(bytes, &mut at).is_some() => {}
            1 => at += 8,
            5 => at += 4,
            2 => {
                let len_at = at;
                let Some(len) = varint(bytes, &mut at).and_then(|l| usize::try_from(l).ok()) else {
                    break;
                };
                if at.checked_add(len).is_none_or(|end| end > bytes.len()) {
                    break;
                }
                out.push((len_at, at, len));
                at += len;
            }
            _ => break,
        }
    }
    out
}

/// Appends a random field inside a nested message (an event, a batch item, the request
/// inside a batch item), fixing the enclosing lengths: reaches fields that appending at the
/// top level cannot.
fn mutate_nested(rng: &mut Rng, bytes: &mut Vec<u8>, seeds: &[(usize, Vec<u8>)], depth: u32) {
    let fields = nested_fields(bytes);
    let Some(&(len_at, start, len)) = fields.get(rng.below(fields.len())) else {
        let field = random_field(rng, seeds);
        bytes.extend_from_slice(&field);
        return;
    };
    let mut inner = bytes[start..start + len].to_vec();
    if depth > 0 && rng.one_in(2) {
        mutate_nested(rng, &mut inner, seeds, depth - 1);
    } else {
        inner.extend_from_slice(&random_field(rng, seeds));
    }
    let mut encoded_len = Vec::new();
    put_varint(&mut encoded_len, inner.len() as u64);
    encoded_len.extend_from_slice(&inner);
    bytes.splice(len_at..start + len, encoded_len);
}

/// Applies one random mutation to `bytes`.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, seeds: &[(usize, Vec<u8>)]) {
    let len = bytes.len();
    if rng.one_in(3) {
        mutate_nested(rng, bytes, seeds, 2);
        return;
    }
    match rng.below(10) {
        0 if len > 0 => {
            let at = rng.below(len);
            bytes[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            bytes[at] = [0, 0x7f, 0x80, 0xff, rng.next_u64() as u8][rng.below(5)];
        }
        2 => bytes.truncate(rng.below(len + 1)),
        3 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below(len - at);
            let chunk = bytes[at..at + n].to_vec();
            let to = rng.below(len + 1);
            bytes.splice(to..to, chunk);
        }
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below(len - at);
            bytes.drain(at..at + n);
        }
        5 => {
            // Splice with another request: its prefix or its whole encoding.
            let other = &seeds[rng.below(seeds.len())].1;
            let cut = rng.below(other.len() + 1);
            if rng.one_in(2) {
                bytes.extend_from_slice(&other[..cut]);
            } else {
                let keep = rng.below(len + 1);
                bytes.truncate(keep);
                bytes.extend_from_slice(&other[cut..]);
            }
        }
        6 if len > 1 => {
            // A length or varint byte made large (continuation bit set, high bits).
            let at = rng.below(len);
            bytes[at] |= 0x80;
        }
        _ => {
            let field = random_field(rng, seeds);
            bytes.extend_from_slice(&field);
        }
    }
}

/// The live names seeds refer to, refreshed so calls keep reaching the engine after the
/// fuzzer advanced epochs, expired sessions and ended streams.
struct Live {
    session: String,
    epoch: u64,
    stream: u64,
    correlation: String,
}

fn refresh(engine: &Engine, generation: u64) -> Live {
    let session = format!("s{generation}");
    let epoch = engine.open_session(&session).expect("open session").epoch;
    let correlation = format!("req-{generation}");
    let stream = engine
        .open_stream(cursorlog_engine::OpenStream {
            session: session.clone(),
            epoch,
            correlation: Some(correlation.clone()),
            lease_ms: None,
        })
        .expect("open stream")
        .stream;
    engine
        .append(cursorlog_engine::Append {
            session: session.clone(),
            stream,
            expected_next_seq: None,
            events: vec![cursorlog_engine::NewEvent::new("k", b"p".to_vec())],
        })
        .expect("append");
    Live {
        session,
        epoch,
        stream,
        correlation,
    }
}

fn new_event(kind: &str) -> pb::NewEvent {
    pb::NewEvent {
        kind: kind.into(),
        correlation: Some("c".into()),
        payload: b"{\"progress\":1}".to_vec(),
    }
}

/// Valid encodings of every request message, naming live state.
fn seeds(l: &Live) -> Vec<(usize, Vec<u8>)> {
    let s = || l.session.clone();
    let cursor = format!("{}-{}-0", l.epoch, l.stream);
    let append = pb::AppendRequest {
        session: s(),
        stream: l.stream,
        expected_next_seq: None,
        events: vec![new_event("progress"), new_event("log")],
    };
    let complete = pb::CompleteRequest {
        session: s(),
        stream: l.stream,
        expected_next_seq: Some(2),
        terminal: Some(new_event("result")),
    };
    let open = pb::OpenStreamRequest {
        session: s(),
        epoch: l.epoch,
        correlation: Some("r9".into()),
        lease_ms: Some(30_000),
    };
    let item = |i| pb::BatchItem { item: Some(i) };
    vec![
        (
            0,
            pb::OpenSessionRequest {
                session: s(),
                state: Some(b"init".to_vec()),
            }
            .encode_to_vec(),
        ),
        (1, pb::GetSessionRequest { session: s() }.encode_to_vec()),
        (
            2,
            pb::SetSessionStateRequest {
                session: s(),
                state: b"{}".to_vec(),
            }
            .encode_to_vec(),
        ),
        (3, pb::AdvanceEpochRequest { session: s() }.encode_to_vec()),
        (4, pb::ExpireSessionRequest { session: s() }.encode_to_vec()),
        (5, open.encode_to_vec()),
        (6, append.encode_to_vec()),
        (
            7,
            pb::AppendBatchRequest {
                items: vec![
                    item(pb::batch_item::Item::Append(append.clone())),
                    item(pb::batch_item::Item::Open(open.clone())),
                    item(pb::batch_item::Item::Complete(complete.clone())),
                ],
            }
            .encode_to_vec(),
        ),
        (8, complete.encode_to_vec()),
        (
            9,
            pb::AbortRequest {
                session: s(),
                stream: l.stream,
                reason: "cancelled".into(),
                terminal: Some(new_event("error")),
            }
            .encode_to_vec(),
        ),
        (
            10,
            pb::KeepAliveRequest {
                session: s(),
                stream: l.stream,
            }
            .encode_to_vec(),
        ),
        (
            11,
            pb::ResolveRequest {
                session: s(),
                last_event_id: cursor.clone(),
                declared_stream: Some(l.stream),
            }
            .encode_to_vec(),
        ),
        (
            12,
            pb::ReadRequest {
                session: s(),
                last_event_id: cursor,
                declared_stream: Some(l.stream),
                follow: true,
                batch_events_max: 2,
                resume_own_stream: true,
            }
            .encode_to_vec(),
        ),
        (
            13,
            pb::GetOutcomeRequest {
                session: s(),
                correlation: l.correlation.clone(),
                stream: None,
            }
            .encode_to_vec(),
        ),
        (
            14,
            pb::TrimRequest {
                session: s(),
                stream: l.stream,
                up_to_seq: 1,
            }
            .encode_to_vec(),
        ),
        (15, pb::StatsRequest {}.encode_to_vec()),
    ]
}

/// Decoding and calling one request, and judging the answer.
mod call;

/// Panics of the fuzzer's threads (runtime workers, blocking pool, engine threads).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn install_panic_hook() {
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current().name().unwrap_or("?").to_owned();
        if thread.starts_with("fuzz-") || thread.starts_with("cursorlog") || thread.contains("fuzz")
        {
            PANICS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(format!("thread {thread} panicked: {info}"));
        }
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

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn fuzz_requests() {
    install_panic_hook();
    let secs = env_u64("CURSORLOG_FUZZ_SECS").unwrap_or(3);
    let max_iters = env_u64("CURSORLOG_FUZZ_ITERS").unwrap_or(u64::MAX);
    let first_seed = env_u64("CURSORLOG_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("fuzz_requests: seed {first_seed}, {secs} s");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::new(dir.path());
    config.sync = SyncPolicy::Never;
    config.disk_reserve_bytes = 0;
    config.index_cache_bytes = 4 << 20;
    // Small limits, so short inputs reach them.
    config.payload_bytes_max = 1024;
    config.id_bytes_max = 64;
    config.batch_events_max = 16;
    config.session_state_bytes_max = 256;
    config.open_streams_per_session_max = 64;
    let engine = Engine::open(config).expect("open engine");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fuzz-rt")
        .enable_all()
        .build()
        .expect("runtime");
    // Shut down from the start: a `follow` Read ends once it has replayed (with UNAVAILABLE
    // "server is shutting down") instead of waiting for events.
    let (_shutdown_tx, shutdown) = tokio::sync::watch::channel(true);
    let service = CursorLogService::new(
        engine.clone(),
        Arc::new(Metrics::new(8)),
        shutdown,
        4 * 1024 * 1024,
    );

    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut iter_seed = first_seed;
    let mut iters = 0u64;
    let mut tally = call::Tally::default();
    let mut live = refresh(&engine, 0);
    let mut corpus = seeds(&live);
    while Instant::now() < deadline && iters < max_iters {
        if iters % 64 == 63 {
            live = refresh(&engine, iters);
            corpus = seeds(&live);
        }
        let mut rng = Rng(iter_seed);
        let (kind, mut bytes) = corpus[rng.below(corpus.len())].clone();
        // Sometimes decode as another message: what a confused client could send.
        let kind = if rng.one_in(16) {
            rng.below(KINDS.len())
        } else {
            kind
        };
        let steps = if rng.one_in(4) { 0 } else { 1 + rng.below(4) };
        for _ in 0..steps {
            mutate(&mut rng, &mut bytes, &corpus);
        }
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
            runtime.block_on(call::call(&service, kind, &bytes, &mut tally))
        }));
        let mut panics = take_panics();
        if engine.is_poisoned() {
            panics.push("the engine is poisoned".into());
        }
        let finding = match outcome {
            Ok(Ok(())) if panics.is_empty() => None,
            Ok(Ok(())) => Some(panics.join("\n")),
            Ok(Err(e)) => Some(e),
            Err(_) => Some(format!("panic: {}", panics.join("\n"))),
        };
        if let Some(e) = finding {
            let path = std::env::temp_dir().join(format!("cursorlog-fuzz-request-{iter_seed}.bin"));
            std::fs::write(&path, &bytes).expect("write failing input");
            panic!(
                "fuzz_requests finding at iteration {iters}, {} request: {e}\n\
                 request bytes: {}\nreproduce: CURSORLOG_FUZZ_SEED={iter_seed} \
                 CURSORLOG_FUZZ_ITERS=1 cargo test -p cursorlog-server fuzz_requests",
                KINDS[kind],
                path.display()
            );
        }
        iters += 1;
        iter_seed = Rng(iter_seed).next_u64();
    }
    eprintln!(
        "fuzz_requests: {iters} iterations in {:.1} s; {tally}",
        start.elapsed().as_secs_f64()
    );
    let _ = engine.close();
}

/// The status a request that does not decode gets from the server's codec.
fn decode_refusal(err: &prost::DecodeError) -> Status {
    cursorlog_proto::codec::invalid_request(err)
}

/// Codes a decoded request may be answered with: typed refusals, never a server fault.
fn acceptable(code: Code) -> bool {
    !matches!(
        code,
        Code::Internal | Code::Unknown | Code::DataLoss | Code::Unavailable
    )
}
