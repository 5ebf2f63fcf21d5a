//! Helpers shared by the durability (`recovery.rs`) and model (`model.rs`) tests: engine
//! configs for tests, file-level damage, and a raw frame walker that reads segment files
//! byte by byte from FORMAT.md without calling engine code (so a bug in the engine's own
//! scanner cannot hide a bug in what it wrote).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod history;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cursorlog_engine::{Append, Appended, Config, Engine, NewEvent, OpenStream, SyncPolicy};

/// Segment header bytes (FORMAT.md, version 3).
pub const SEGMENT_HEADER_BYTES: u64 = 80;
/// Frame header bytes (FORMAT.md, version 3).
pub const FRAME_HEADER_BYTES: u64 = 48;
/// Smallest allowed segment size; makes the log roll after a few dozen records.
pub const SMALL_SEGMENT: u64 = 4096;

/// Record type tags (FORMAT.md).
pub mod tag {
    pub const SESSION_OPENED: u8 = 1;
    pub const EPOCH_ADVANCED: u8 = 2;
    pub const SESSION_EXPIRED: u8 = 3;
    pub const STREAM_OPENED: u8 = 4;
    pub const EVENT: u8 = 5;
    pub const TERMINAL: u8 = 6;
    pub const TRIM: u8 = 7;
}

/// A test config: given sync policy and segment size, background retention effectively off
/// (so nothing but the test writes to the log).
pub fn config(dir: &Path, sync: SyncPolicy, segment_bytes_max: u64) -> Config {
    let mut c = Config::new(dir);
    c.sync = sync;
    c.segment_bytes_max = segment_bytes_max;
    c.retention.check_interval = Duration::from_secs(24 * 3600);
    c
}

/// Opens `dir` with [`config`].
pub fn open(dir: &Path, sync: SyncPolicy, segment_bytes_max: u64) -> Engine {
    Engine::open(config(dir, sync, segment_bytes_max)).expect("open engine")
}

/// Opens a session and a stream in its current epoch; returns (epoch, stream).
pub fn new_stream(e: &Engine, session: &str, correlation: Option<&str>) -> (u64, u64) {
    let s = e.open_session(session).expect("open session");
    let st = e
        .open_stream(OpenStream {
            session: session.into(),
            epoch: s.epoch,
            correlation: correlation.map(Into::into),
            lease_ms: None,
        })
        .expect("open stream");
    (st.epoch, st.stream)
}

/// Deterministic payload for event `seq` of `stream` (varied lengths, all byte values).
pub fn payload(stream: u64, seq: u64) -> Vec<u8> {
    let len = 1 + ((stream * 31 + seq * 17) % 97) as usize;
    (0..len)
        .map(|i| (stream as usize * 7 + seq as usize * 13 + i * 29) as u8)
        .collect()
}

/// The event [`payload`] describes, with a kind naming its seq.
pub fn event(stream: u64, seq: u64) -> NewEvent {
    NewEvent::new(format!("k{seq}"), payload(stream, seq))
}

/// Appends events `first..=last` (by [`event`]) with the expected next seq set.
pub fn append_range(e: &Engine, session: &str, stream: u64, first: u64, last: u64) -> Appended {
    let events = (first..=last).map(|q| event(stream, q)).collect();
    e.append(Append {
        session: session.into(),
        stream,
        expected_next_seq: Some(first),
        events,
    })
    .expect("append")
}

/// Recursively copies a directory (files and subdirectories).
pub fn copy_dir(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for entry in fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            fs::copy(entry.path(), &to).unwrap();
        }
    }
}

/// Copies only the segment files of `src` into `dst` (the on-disk log, no index).
pub fn copy_segments(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for p in segment_files(src) {
        fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
}

/// Segment files of a data directory, in LSN order.
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

/// The last (active) segment file.
pub fn last_segment(dir: &Path) -> PathBuf {
    segment_files(dir).pop().expect("at least one segment")
}

/// One frame as laid out on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame {
    /// Byte offset of the frame header in the file.
    pub offset: u64,
    /// Header + body bytes.
    pub len: u64,
    pub lsn: u64,
    /// The segment offset the writer says was synced when this frame was written.
    pub synced_through: u64,
    /// The log entry (atomic group) the frame belongs to, and its term.
    pub entry: u64,
    pub term: u64,
    pub group_left: u32,
    pub record_type: u8,
}

impl RawFrame {
    /// Offset one past the frame.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap())
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().unwrap())
}

/// Walks the frames of a well-formed segment file (test-written, so no checks beyond
/// lengths): panics if the file does not end exactly at a frame boundary.
pub fn frames(path: &Path) -> Vec<RawFrame> {
    let bytes = fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = SEGMENT_HEADER_BYTES as usize;
    while at < bytes.len() {
        let h = &bytes[at..at + FRAME_HEADER_BYTES as usize];
        let body_len = u64::from(le_u32(&h[0..]));
        let f = RawFrame {
            offset: at as u64,
            len: FRAME_HEADER_BYTES + body_len,
            lsn: le_u64(&h[8..]),
            synced_through: le_u64(&h[16..]),
            entry: le_u64(&h[24..]),
            term: le_u64(&h[32..]),
            group_left: le_u32(&h[40..]),
            record_type: h[44],
        };
        assert!(
            f.end() as usize <= bytes.len(),
            "{} ends inside a frame",
            path.display()
        );
        at = f.end() as usize;
        out.push(f);
    }
    out
}

/// Every frame of every segment, with its file.
pub fn all_frames(dir: &Path) -> Vec<(PathBuf, RawFrame)> {
    segment_files(dir)
        .into_iter()
        .flat_map(|p| frames(&p).into_iter().map(move |f| (p.clone(), f)))
        .collect()
}

/// XORs `mask` into the byte at `offset` of `path`.
pub fn xor_byte(path: &Path, offset: u64, mask: u8) {
    let mut b = fs::read(path).unwrap();
    b[offset as usize] ^= mask;
    fs::write(path, b).unwrap();
}

/// Overwrites bytes at `offset` of `path`.
pub fn write_at(path: &Path, offset: u64, data: &[u8]) {
    let mut b = fs::read(path).unwrap();
    b[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    fs::write(path, b).unwrap();
}

/// Cuts `path` to `len` bytes.
pub fn truncate(path: &Path, len: u64) {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Appends bytes to the end of `path`.
pub fn append_bytes(path: &Path, data: &[u8]) {
    use std::io::Write;
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(data)
        .unwrap();
}

/// File length.
pub fn file_len(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

/// A tiny deterministic PRNG (splitmix64) for garbage bytes and seeds.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Runs `f` over `items` on `threads` scoped threads. Engine open/close is dominated by
/// waiting (the background thread's tick, fsync), not CPU, so this shortens wall time on
/// small machines. A panic in `f` fails the caller.
pub fn par_for_each<T: Sync>(items: &[T], threads: usize, f: impl Fn(&T) + Sync) {
    let chunk = items.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for part in items.chunks(chunk) {
            let f = &f;
            s.spawn(move || part.iter().for_each(f));
        }
    });
}

/// A valid frame that would follow the last frame of `path` (its copy with the next LSN,
/// re-checksummed), for simulating the torn start of a real next write. `None` when the
/// segment holds no frame.
pub fn forge_next_frame(path: &Path) -> Option<Vec<u8>> {
    let last = *frames(path).last()?;
    let bytes = fs::read(path).unwrap();
    let mut f = bytes[last.offset as usize..last.end() as usize].to_vec();
    f[8..16].copy_from_slice(&(last.lsn + 1).to_le_bytes());
    f[24..28].copy_from_slice(&0u32.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&f[8..]);
    f[4..8].copy_from_slice(&h.finalize().to_le_bytes());
    Some(f)
}
