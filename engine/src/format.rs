//! On-disk constants: segment header, record frame, segment names. See `engine/FORMAT.md`.
//!
//! ```text
//! segment header (32 bytes)              record frame header (24 bytes) + body
//! 0  magic       [u8; 8]                 0  body_len    u32 LE
//! 8  version     u32 LE                  4  crc32       u32 LE  (over bytes 8.. of header + body)
//! 12 reserved    u32 (0)                 8  lsn         u64 LE
//! 16 base_lsn    u64 LE                  16 group_left  u32 LE  (records after this one in its group)
//! 24 header_crc  u32 LE (over 0..24)     20 record_type u8
//! 28 reserved    u32 (0)                 21 reserved    [u8; 3] (0)
//! ```

use std::mem::size_of;

/// First bytes of every segment file. Like PNG's signature, the high-bit first byte and the
/// CR LF / SUB / LF tail detect text-mode mangling.
pub const SEGMENT_MAGIC: [u8; 8] = *b"\x89CLG\r\n\x1a\n";
/// Format version written by this build, and the only one it reads.
pub const FORMAT_VERSION: u32 = 1;

/// Offsets within the segment header.
pub const HDR_MAGIC: usize = 0;
/// Version field offset.
pub const HDR_VERSION: usize = HDR_MAGIC + SEGMENT_MAGIC.len();
/// Reserved field offset.
pub const HDR_RESERVED: usize = HDR_VERSION + size_of::<u32>();
/// Base LSN field offset.
pub const HDR_BASE_LSN: usize = HDR_RESERVED + size_of::<u32>();
/// Header CRC field offset (the CRC covers every byte before it).
pub const HDR_CRC: usize = HDR_BASE_LSN + size_of::<u64>();
/// Trailing reserved field offset.
pub const HDR_RESERVED2: usize = HDR_CRC + size_of::<u32>();
/// Segment header length in bytes.
pub const SEGMENT_HEADER_BYTES: usize = HDR_RESERVED2 + size_of::<u32>();

/// Offsets within the record frame header.
pub const FRAME_BODY_LEN: usize = 0;
/// CRC field offset.
pub const FRAME_CRC: usize = FRAME_BODY_LEN + size_of::<u32>();
/// LSN field offset; the CRC covers from here to the end of the body.
pub const FRAME_LSN: usize = FRAME_CRC + size_of::<u32>();
/// Group-left field offset.
pub const FRAME_GROUP_LEFT: usize = FRAME_LSN + size_of::<u64>();
/// Record type field offset.
pub const FRAME_TYPE: usize = FRAME_GROUP_LEFT + size_of::<u32>();
/// Reserved bytes offset.
pub const FRAME_RESERVED: usize = FRAME_TYPE + size_of::<u8>();
/// Frame header length in bytes.
pub const FRAME_HEADER_BYTES: usize = FRAME_RESERVED + 3;

/// Largest record body accepted on decode: bounds allocation on hostile input. Payloads are
/// limited to [`PAYLOAD_BYTES_LIMIT`]; the rest is room for ids and fields.
pub const BODY_BYTES_MAX: u32 = PAYLOAD_BYTES_LIMIT + 64 * 1024;
/// Highest value `Config::payload_bytes_max` may take.
pub const PAYLOAD_BYTES_LIMIT: u32 = 16 * 1024 * 1024;
/// Smallest segment size: a segment must hold at least one full record.
pub const SEGMENT_BYTES_MIN: u64 = 4096;

/// Digits in a segment file name's LSN: `u64::MAX` has 20.
pub const SEGMENT_NAME_DIGITS: usize = 20;
/// Segment file extension.
pub const SEGMENT_EXTENSION: &str = "seg";
/// The sled index directory inside the data directory.
pub const INDEX_DIR: &str = "index";
/// The lock file inside the data directory.
pub const LOCK_FILE: &str = "LOCK";

const _: () = assert!(
    SEGMENT_HEADER_BYTES == 32,
    "segment header is 32 bytes (FORMAT.md)"
);
const _: () = assert!(
    FRAME_HEADER_BYTES == 24,
    "frame header is 24 bytes (FORMAT.md)"
);
const _: () = assert!(SEGMENT_HEADER_BYTES <= 4096, "segment header fits a page");
const _: () = assert!(
    (SEGMENT_HEADER_BYTES + FRAME_HEADER_BYTES) as u64 <= SEGMENT_BYTES_MIN,
    "a segment holds at least a header and a frame header"
);

/// The file name of the segment whose first record has `base_lsn`.
pub fn segment_name(base_lsn: u64) -> String {
    format!(
        "{base_lsn:0width$}.{SEGMENT_EXTENSION}",
        width = SEGMENT_NAME_DIGITS
    )
}

/// The base LSN named by a segment file name, or `None` if it is not a segment name.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_EXTENSION)?.strip_suffix('.')?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Builds a segment header for `base_lsn`.
pub fn encode_segment_header(base_lsn: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES];
    h[HDR_MAGIC..HDR_VERSION].copy_from_slice(&SEGMENT_MAGIC);
    h[HDR_VERSION..HDR_RESERVED].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[HDR_BASE_LSN..HDR_CRC].copy_from_slice(&base_lsn.to_le_bytes());
    let crc = crc32fast::hash(&h[..HDR_CRC]);
    h[HDR_CRC..HDR_RESERVED2].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Why a segment header is not valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer bytes than a header.
    Short,
    /// Not our magic.
    BadMagic,
    /// Our magic, another version.
    UnknownVersion(u32),
    /// Header CRC mismatch.
    Crc {
        /// Computed.
        got: u32,
        /// Stored.
        expected: u32,
    },
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// Checks a segment header and returns its base LSN.
///
/// # Errors
/// The first check that fails, in the order magic, version, CRC.
pub fn decode_segment_header(b: &[u8]) -> Result<u64, HeaderError> {
    let h = b.get(..SEGMENT_HEADER_BYTES).ok_or(HeaderError::Short)?;
    if h.get(HDR_MAGIC..HDR_VERSION) != Some(&SEGMENT_MAGIC[..]) {
        return Err(HeaderError::BadMagic);
    }
    let version = le_u32(h, HDR_VERSION);
    if version != FORMAT_VERSION {
        return Err(HeaderError::UnknownVersion(version));
    }
    let expected = le_u32(h, HDR_CRC);
    let got = crc32fast::hash(h.get(..HDR_CRC).unwrap_or_default());
    if got != expected {
        return Err(HeaderError::Crc { got, expected });
    }
    Ok(le_u64(h, HDR_BASE_LSN))
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Body length in bytes.
    pub body_len: u32,
    /// Stored CRC.
    pub crc: u32,
    /// Log sequence number.
    pub lsn: u64,
    /// Records that follow this one in its atomic group.
    pub group_left: u32,
    /// Record type tag.
    pub record_type: u8,
}

impl FrameHeader {
    /// Total frame bytes (header + body).
    pub fn frame_len(&self) -> u64 {
        FRAME_HEADER_BYTES as u64 + u64::from(self.body_len)
    }

    /// Reads the fixed fields (no checks).
    pub fn read(b: &[u8; FRAME_HEADER_BYTES]) -> Self {
        Self {
            body_len: le_u32(b, FRAME_BODY_LEN),
            crc: le_u32(b, FRAME_CRC),
            lsn: le_u64(b, FRAME_LSN),
            group_left: le_u32(b, FRAME_GROUP_LEFT),
            record_type: b[FRAME_TYPE],
        }
    }

    /// Writes the header fields, computing the CRC over `body`.
    pub fn write(&self, body: &[u8]) -> [u8; FRAME_HEADER_BYTES] {
        let mut h = [0u8; FRAME_HEADER_BYTES];
        h[FRAME_BODY_LEN..FRAME_CRC].copy_from_slice(&self.body_len.to_le_bytes());
        h[FRAME_LSN..FRAME_GROUP_LEFT].copy_from_slice(&self.lsn.to_le_bytes());
        h[FRAME_GROUP_LEFT..FRAME_TYPE].copy_from_slice(&self.group_left.to_le_bytes());
        h[FRAME_TYPE] = self.record_type;
        let crc = frame_crc(&h, body);
        h[FRAME_CRC..FRAME_LSN].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

/// CRC32 of a frame: the header from the LSN on, then the body.
pub fn frame_crc(header: &[u8; FRAME_HEADER_BYTES], body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[FRAME_LSN..]);
    hasher.update(body);
    hasher.finalize()
}

/// [`frame_crc`] of a whole frame held in one slice (header then body): the same bytes in
/// one pass. `frame` must be at least a frame header long.
pub(crate) fn frame_crc_contiguous(frame: &[u8]) -> u32 {
    crc32fast::hash(frame.get(FRAME_LSN..).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn segment_names_are_fixed_width_and_sort() {
        assert_eq!(segment_name(1), "00000000000000000001.seg");
        assert_eq!(segment_name(u64::MAX), "18446744073709551615.seg");
        assert!(segment_name(9) < segment_name(10));
        for bad in [
            "1.seg",
            "00000000000000000001.log",
            "0000000000000000000a.seg",
            "x",
        ] {
            assert_eq!(parse_segment_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn header_checks_each_field() {
        let h = encode_segment_header(42);
        assert_eq!(decode_segment_header(&h), Ok(42));
        assert_eq!(decode_segment_header(&h[..10]), Err(HeaderError::Short));
        let mut bad = h;
        bad[0] ^= 1;
        assert_eq!(decode_segment_header(&bad), Err(HeaderError::BadMagic));
        let mut v2 = h;
        v2[HDR_VERSION] = 2;
        assert_eq!(
            decode_segment_header(&v2),
            Err(HeaderError::UnknownVersion(2))
        );
        let mut flipped = h;
        flipped[HDR_BASE_LSN] ^= 0x10;
        assert!(matches!(
            decode_segment_header(&flipped),
            Err(HeaderError::Crc { .. })
        ));
    }

    proptest! {
        #[test]
        fn segment_name_round_trips(lsn: u64) {
            prop_assert_eq!(parse_segment_name(&segment_name(lsn)), Some(lsn));
        }
    }
}
