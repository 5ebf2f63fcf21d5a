//! Structured mutations of a data directory's segment files, from `engine/FORMAT.md`.
//!
//! A mutation either leaves every CRC as it finds it ("raw": bit flips, overwrites,
//! truncations, duplicated or removed chunks, spliced frames, edited length fields, zeroed
//! sectors, removed or renamed files), so any frame it touches fails its check, or
//! recomputes the CRC of what it edited ("CRC-fixed": a frame header or body, a segment
//! header), so the edit passes the check and reaches the decoder. The harness checks served
//! events against what was written only after raw mutations.

/// splitmix64: tiny, deterministic, enough for choosing mutations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence follows `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True with probability 1/`n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// One segment file of a directory image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegFile {
    /// The file name (`<20 digits>.seg`).
    pub name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// The segment files of a data directory, in name order.
pub type Image = Vec<SegFile>;

/// Layout of one format version: segment header bytes, frame header bytes, where the
/// header CRC sits (it covers everything before it).
#[derive(Debug, Clone, Copy)]
struct Layout {
    segment_header: usize,
    frame_header: usize,
    header_crc_at: usize,
}

const V1: Layout = Layout {
    segment_header: 32,
    frame_header: 24,
    header_crc_at: 24,
};
const V2: Layout = Layout {
    segment_header: 64,
    frame_header: 32,
    header_crc_at: 60,
};
const V3: Layout = Layout {
    segment_header: 80,
    frame_header: 48,
    header_crc_at: 76,
};

fn layout(bytes: &[u8]) -> Layout {
    match bytes.get(8..12) {
        Some([1, 0, 0, 0]) => V1,
        Some([2, 0, 0, 0]) => V2,
        _ => V3,
    }
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 4)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// The frames of a segment image as (offset, total length), walking `body_len` fields from
/// the header until one runs past the end (CRCs are not checked: this finds where frames
/// are, not whether they are valid).
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let l = layout(bytes);
    let mut out = Vec::new();
    let mut off = l.segment_header;
    while let Some(body) = le_u32(bytes, off) {
        let Some(end) = (off + l.frame_header).checked_add(body as usize) else {
            break;
        };
        if end > bytes.len() {
            break;
        }
        out.push((off, end - off));
        off = end;
    }
    out
}

/// Recomputes the CRC of the frame at `off` (header fields after the CRC, then the body).
fn fix_frame_crc(bytes: &mut [u8], off: usize) {
    let l = layout(bytes);
    let Some(body) = le_u32(bytes, off) else {
        return;
    };
    let end = (off + l.frame_header + body as usize).min(bytes.len());
    if off + l.frame_header > end {
        return;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&bytes[off + 8..end]);
    let crc = h.finalize().to_le_bytes();
    bytes[off + 4..off + 8].copy_from_slice(&crc);
}

/// Recomputes a segment header's CRC.
fn fix_header_crc(bytes: &mut [u8]) {
    let l = layout(bytes);
    if bytes.len() < l.header_crc_at + 4 {
        return;
    }
    let crc = crc32fast::hash(&bytes[..l.header_crc_at]).to_le_bytes();
    bytes[l.header_crc_at..l.header_crc_at + 4].copy_from_slice(&crc);
}

/// Values that tend to sit on a decoder's edges.
const INTERESTING_U64: [u64; 12] = [
    0,
    1,
    2,
    63,
    64,
    255,
    4096,
    1 << 24,
    u32::MAX as u64,
    (u32::MAX as u64) + 1,
    i64::MAX as u64,
    u64::MAX,
];

fn interesting_u64(rng: &mut Rng) -> u64 {
    if rng.one_in(4) {
        rng.next_u64()
    } else {
        INTERESTING_U64[rng.below(INTERESTING_U64.len())]
    }
}

/// Length fields that tend to break a walker: 0, off by one, the body limit and past it.
fn interesting_len(rng: &mut Rng, current: u32) -> u32 {
    const LIMIT: u32 = 16 * 1024 * 1024 + 64 * 1024;
    match rng.below(8) {
        0 => 0,
        1 => current.wrapping_add(1),
        2 => current.wrapping_sub(1),
        3 => LIMIT,
        4 => LIMIT + 1,
        5 => u32::MAX,
        6 => current.wrapping_add(rng.below(64) as u32),
        _ => rng.next_u64() as u32,
    }
}

/// Picks a file, biased towards the tail segment (the one recovery may cut).
fn pick_file(rng: &mut Rng, image: &Image) -> Option<usize> {
    if image.is_empty() {
        return None;
    }
    if rng.one_in(2) {
        Some(image.len() - 1)
    } else {
        Some(rng.below(image.len()))
    }
}

/// Applies one random mutation; returns its description and whether it recomputed a CRC.
pub fn mutate(rng: &mut Rng, image: &mut Image) -> (String, bool) {
    let Some(fi) = pick_file(rng, image) else {
        return ("nothing to mutate".into(), false);
    };
    let others: Vec<Vec<u8>> = image.iter().map(|f| f.bytes.clone()).collect();
    let files = image.len();
    let file = &mut image[fi];
    let name = file.name.clone();
    let bytes = &mut file.bytes;
    let len = bytes.len();
    let fr = frames(bytes);
    match rng.below(16) {
        0 if len > 0 => {
            let at = rng.below(len);
            let bit = rng.below(8);
            bytes[at] ^= 1 << bit;
            (format!("{name}: flip bit {bit} at {at}"), false)
        }
        1 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below(8).min(len - at - 1);
            for b in &mut bytes[at..at + n] {
                *b = [0, 0xff, 0x7f, 0x80, rng.next_u64() as u8][rng.below(5)];
            }
            (format!("{name}: overwrite {n} bytes at {at}"), false)
        }
        2 => {
            // Truncate at any offset, often at or near a frame boundary.
            let at = match fr.get(rng.below(fr.len() + 1)) {
                Some((off, flen)) if rng.one_in(2) => off + rng.below(*flen + 1),
                _ => rng.below(len + 1),
            };
            bytes.truncate(at);
            (format!("{name}: truncate to {at}"), false)
        }
        3 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below(256.min(len - at));
            let chunk = bytes[at..at + n].to_vec();
            let to = rng.below(bytes.len() + 1);
            bytes.splice(to..to, chunk);
            (
                format!("{name}: duplicate {n} bytes from {at} at {to}"),
                false,
            )
        }
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below(256.min(len - at));
            bytes.drain(at..at + n);
            (format!("{name}: remove {n} bytes at {at}"), false)
        }
        5 => {
            // Splice a whole frame of this directory (same log) in, inserted or overwriting.
            let src = &others[rng.below(others.len())];
            let sf = frames(src);
            let Some(&(soff, slen)) = sf.get(rng.below(sf.len().max(1))) else {
                return (format!("{name}: no frame to splice"), false);
            };
            let frame = src[soff..soff + slen].to_vec();
            let to = fr.get(rng.below(fr.len().max(1))).map_or(len, |f| f.0);
            if rng.one_in(2) {
                bytes.splice(to..to, frame);
                (format!("{name}: insert a {slen}-byte frame at {to}"), false)
            } else {
                let end = (to + slen).min(bytes.len());
                bytes.splice(to..end, frame);
                (
                    format!("{name}: overwrite with a {slen}-byte frame at {to}"),
                    false,
                )
            }
        }
        6 if !fr.is_empty() => {
            let (off, _) = fr[rng.below(fr.len())];
            let cur = le_u32(bytes, off).unwrap_or(0);
            let v = interesting_len(rng, cur);
            bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
            (format!("{name}: body_len at {off} {cur} -> {v}"), false)
        }
        7 if len > 0 => {
            // Zero a 4 KiB sector (a write that never reached the disk).
            let sector = rng.below(len.div_ceil(4096));
            let end = ((sector + 1) * 4096).min(len);
            bytes[sector * 4096..end].fill(0);
            (format!("{name}: zero sector {sector}"), false)
        }
        8 if files > 1 => {
            let removed = image.remove(fi);
            (format!("{}: removed", removed.name), false)
        }
        9 => {
            // Rename: another base LSN in the name.
            let base: u64 = name.trim_end_matches(".seg").parse().unwrap_or(1);
            let new = match rng.below(3) {
                0 => base.saturating_add(1),
                1 => base.saturating_sub(1),
                _ => interesting_u64(rng),
            };
            image[fi].name = format!("{new:020}.seg");
            image.sort_by(|a, b| a.name.cmp(&b.name));
            image.dedup_by(|a, b| a.name == b.name);
            (format!("{name}: renamed to base {new}"), false)
        }
        10..=12 if !fr.is_empty() => {
            // CRC-fixed edit of a frame's header fields or body: reaches the decoder.
            let (off, flen) = fr[rng.below(fr.len())];
            let l = layout(bytes);
            let what = match rng.below(4) {
                0 => {
                    // A header field after the CRC: lsn, synced_through, group_left, type.
                    let at = off + 8 + rng.below(l.frame_header - 8);
                    bytes[at] = rng.next_u64() as u8;
                    format!("header byte {}", at - off)
                }
                1 if flen > l.frame_header + 8 => {
                    // A u64 inside the body (bincode lengths, ids, seqs, option tags).
                    let at = off + l.frame_header + rng.below(flen - l.frame_header - 7);
                    let v = interesting_u64(rng);
                    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
                    format!("body u64 at {} = {v}", at - off - l.frame_header)
                }
                2 if flen > l.frame_header => {
                    let n = 1 + rng.below(4);
                    for _ in 0..n {
                        let at = off + l.frame_header + rng.below(flen - l.frame_header);
                        bytes[at] = [0, 1, 2, 0xff, rng.next_u64() as u8][rng.below(5)];
                    }
                    format!("{n} body bytes")
                }
                _ => {
                    // Shrink or grow the body, keeping the length field true to it.
                    let body = flen - l.frame_header;
                    let new = if rng.one_in(2) {
                        rng.below(body + 1)
                    } else {
                        body + rng.below(32)
                    };
                    let at = off + l.frame_header;
                    if new < body {
                        bytes.drain(at + new..at + body);
                    } else {
                        let extra: Vec<u8> =
                            (0..new - body).map(|_| rng.next_u64() as u8).collect();
                        bytes.splice(at + body..at + body, extra);
                    }
                    bytes[off..off + 4].copy_from_slice(&(new as u32).to_le_bytes());
                    format!("body length {body} -> {new}")
                }
            };
            fix_frame_crc(bytes, off);
            (
                format!("{name}: frame at {off}: {what}, CRC recomputed"),
                true,
            )
        }
        13 if len >= layout(bytes).segment_header => {
            // CRC-fixed segment header edit: version, sync policy, base, term, boot id.
            let l = layout(bytes);
            let at = 8 + rng.below(l.header_crc_at - 8);
            bytes[at] = [0, 1, 2, 3, 0xff, rng.next_u64() as u8][rng.below(6)];
            fix_header_crc(bytes);
            (format!("{name}: header byte {at}, CRC recomputed"), true)
        }
        14 if fr.len() >= 2 => {
            // Swap two adjacent frames (each keeps its valid CRC; LSN order breaks).
            let i = rng.below(fr.len() - 1);
            let (a, al) = fr[i];
            let (_, bl) = fr[i + 1];
            let first = bytes[a..a + al].to_vec();
            let second = bytes[a + al..a + al + bl].to_vec();
            bytes.splice(a..a + al + bl, second.into_iter().chain(first));
            (format!("{name}: swap frames at {a}"), false)
        }
        _ => {
            // Append garbage or a copy of the last frame after the tail.
            if let (Some(&(off, flen)), true) = (fr.last(), rng.one_in(2)) {
                let copy = bytes[off..off + flen].to_vec();
                bytes.extend_from_slice(&copy);
                (format!("{name}: repeat the last frame"), false)
            } else {
                let n = 1 + rng.below(64);
                let extra: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                bytes.extend_from_slice(&extra);
                (format!("{name}: append {n} random bytes"), false)
            }
        }
    }
}
