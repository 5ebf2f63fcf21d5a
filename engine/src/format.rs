//! On-disk constants: segment header, record frame, segment names. See `engine/FORMAT.md`.
//!
//! ```text
//! segment header (80 bytes)               record frame header (48 bytes) + body
//! 0  magic         [u8; 8]                0  body_len       u32 LE
//! 8  version       u32 LE (3)             4  crc32          u32 LE (over bytes 8.. + body)
//! 12 sync_policy   u8 (0/1/2), 3 x 0      8  lsn            u64 LE
//! 16 base_lsn      u64 LE                 16 synced_through u64 LE (segment offset)
//! 24 term          u64 LE                 24 entry          u64 LE (the group's log entry)
//! 32 boot_id       [u8; 16]               32 term           u64 LE (the entry's term)
//! 48 created_at_ms u64 LE                 40 group_left     u32 LE
//! 56 base_entry    u64 LE                 44 record_type    u8
//! 64 prev_term     u64 LE                 45 reserved       [u8; 3] (0)
//! 72 reserved      u32 (0)
//! 76 header_crc    u32 LE (over 0..76)
//! ```
//!
//! Format versions 1 and 2 are read only to upgrade a directory on open ([`legacy_v1`],
//! [`legacy_v2`]).

use std::mem::size_of;

use crate::config::SyncPolicy;

/// First bytes of every segment file. Like PNG's signature, the high-bit first byte and the
/// CR LF / SUB / LF tail detect text-mode mangling.
pub const SEGMENT_MAGIC: [u8; 8] = *b"\x89CLG\r\n\x1a\n";
/// Format version written by this build.
pub const FORMAT_VERSION: u32 = 3;

/// Version field offset (the magic is at 0).
pub const HDR_VERSION: usize = SEGMENT_MAGIC.len();
/// Sync policy byte offset (then 3 reserved bytes).
pub const HDR_SYNC: usize = HDR_VERSION + size_of::<u32>();
/// Base LSN field offset.
pub const HDR_BASE_LSN: usize = HDR_SYNC + size_of::<u32>();
/// Term field offset.
pub const HDR_TERM: usize = HDR_BASE_LSN + size_of::<u64>();
/// Boot id field offset.
pub const HDR_BOOT_ID: usize = HDR_TERM + size_of::<u64>();
/// Creation time field offset.
pub const HDR_CREATED: usize = HDR_BOOT_ID + BOOT_ID_BYTES;
/// Base entry field offset: the log entry index of the segment's first group.
pub const HDR_BASE_ENTRY: usize = HDR_CREATED + size_of::<u64>();
/// Previous term field offset: the term of the entry before `base_entry`.
pub const HDR_PREV_TERM: usize = HDR_BASE_ENTRY + size_of::<u64>();
/// Reserved field offset.
pub const HDR_RESERVED: usize = HDR_PREV_TERM + size_of::<u64>();
/// Header CRC field offset (the CRC covers every byte before it).
pub const HDR_CRC: usize = HDR_RESERVED + size_of::<u32>();
/// Segment header length in bytes.
pub const SEGMENT_HEADER_BYTES: usize = HDR_CRC + size_of::<u32>();
/// Bytes of a boot id (the kernel's random UUID for the current boot).
pub const BOOT_ID_BYTES: usize = 16;

/// Offsets within the record frame header.
pub const FRAME_BODY_LEN: usize = 0;
/// CRC field offset.
pub const FRAME_CRC: usize = FRAME_BODY_LEN + size_of::<u32>();
/// LSN field offset; the CRC covers from here to the end of the body.
pub const FRAME_LSN: usize = FRAME_CRC + size_of::<u32>();
/// Synced-through field offset.
pub const FRAME_SYNCED: usize = FRAME_LSN + size_of::<u64>();
/// Entry field offset: the log entry (one atomic group) the frame belongs to.
pub const FRAME_ENTRY: usize = FRAME_SYNCED + size_of::<u64>();
/// Term field offset: the term of the frame's entry.
pub const FRAME_TERM: usize = FRAME_ENTRY + size_of::<u64>();
/// Group-left field offset.
pub const FRAME_GROUP_LEFT: usize = FRAME_TERM + size_of::<u64>();
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
/// A cluster member's saved vote (FORMAT.md "Replicated log files"); its presence marks a
/// member's data directory.
pub const VOTE_FILE: &str = "VOTE";
/// The cluster a member belongs to (FORMAT.md "Replicated log files"): it refuses Raft
/// traffic of any other.
pub const CLUSTER_FILE: &str = "CLUSTER";
/// Present while a member that started on a new (or wiped) directory has not yet caught up
/// with a leader (FORMAT.md "Replicated log files"): its vote guard holds across restarts.
pub const AMNESIAC_FILE: &str = "AMNESIAC";

const _: () = assert!(
    SEGMENT_HEADER_BYTES == 80,
    "segment header is 80 bytes (FORMAT.md)"
);
const _: () = assert!(
    FRAME_HEADER_BYTES == 48,
    "frame header is 48 bytes (FORMAT.md)"
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

/// What a segment header says about its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// LSN of the first record; equals the number in the file name.
    pub base_lsn: u64,
    /// The writer's term when the segment was created. A single node starts a new term
    /// whenever an open starts a new segment (the sync policy or the machine's boot
    /// changed); an open that continues the tail keeps its term. Every entry a single node
    /// writes carries its writer's term (a replicated log's entries carry their leader's).
    pub term: u64,
    /// The sync policy of the writer that created the segment and wrote every frame in it.
    pub sync: SyncPolicyTag,
    /// The machine's boot id when the segment was created (zeros when unknown): when it
    /// differs from the current one, the machine restarted since, and unsynced writes may be
    /// lost.
    pub boot_id: [u8; BOOT_ID_BYTES],
    /// When the segment was created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// The log entry index of the segment's first group (entries are consecutive across
    /// the log, one per atomic group): the entry counter survives even when every earlier
    /// segment is retired and this one holds nothing yet.
    pub base_entry: u64,
    /// The term of entry `base_entry - 1` (0 when there is none): the log id of the last
    /// entry before this segment, which a replicated log reports once the segments before
    /// are purged.
    pub prev_term: u64,
}

/// The sync policy, as one header byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicyTag {
    /// `SyncPolicy::Always` (0).
    Always,
    /// `SyncPolicy::Interval` (1).
    Interval,
    /// `SyncPolicy::Never` (2).
    Never,
}

impl SyncPolicyTag {
    /// The tag of a policy.
    pub fn of(p: SyncPolicy) -> Self {
        match p {
            SyncPolicy::Always => Self::Always,
            SyncPolicy::Interval(_) => Self::Interval,
            SyncPolicy::Never => Self::Never,
        }
    }

    fn byte(self) -> u8 {
        match self {
            Self::Always => 0,
            Self::Interval => 1,
            Self::Never => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::Always),
            1 => Some(Self::Interval),
            2 => Some(Self::Never),
            _ => None,
        }
    }
}

impl SegmentHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut h = [0u8; SEGMENT_HEADER_BYTES];
        h[..HDR_VERSION].copy_from_slice(&SEGMENT_MAGIC);
        h[HDR_VERSION..HDR_SYNC].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[HDR_SYNC] = self.sync.byte();
        h[HDR_BASE_LSN..HDR_TERM].copy_from_slice(&self.base_lsn.to_le_bytes());
        h[HDR_TERM..HDR_BOOT_ID].copy_from_slice(&self.term.to_le_bytes());
        h[HDR_BOOT_ID..HDR_CREATED].copy_from_slice(&self.boot_id);
        h[HDR_CREATED..HDR_BASE_ENTRY].copy_from_slice(&self.created_at_ms.to_le_bytes());
        h[HDR_BASE_ENTRY..HDR_PREV_TERM].copy_from_slice(&self.base_entry.to_le_bytes());
        h[HDR_PREV_TERM..HDR_RESERVED].copy_from_slice(&self.prev_term.to_le_bytes());
        let crc = crc32fast::hash(&h[..HDR_CRC]);
        h[HDR_CRC..].copy_from_slice(&crc.to_le_bytes());
        h
    }
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
    /// A field holds a value no version ever wrote.
    BadField(&'static str),
}

/// The format version a segment file claims (magic checked), before anything else is read:
/// the upgrade path needs it to pick a decoder.
///
/// # Errors
/// Short or not our magic.
pub fn segment_version(b: &[u8]) -> Result<u32, HeaderError> {
    if b.len() < HDR_VERSION + 4 {
        return Err(HeaderError::Short);
    }
    if b.get(..HDR_VERSION) != Some(&SEGMENT_MAGIC[..]) {
        return Err(HeaderError::BadMagic);
    }
    Ok(le_u32(b, HDR_VERSION))
}

/// Checks a current-version segment header and returns what it says.
///
/// # Errors
/// The first check that fails, in the order magic, version, CRC, fields.
pub fn decode_segment_header(b: &[u8]) -> Result<SegmentHeader, HeaderError> {
    let version = segment_version(b)?;
    if version != FORMAT_VERSION {
        return Err(HeaderError::UnknownVersion(version));
    }
    let h = b.get(..SEGMENT_HEADER_BYTES).ok_or(HeaderError::Short)?;
    let expected = le_u32(h, HDR_CRC);
    let got = crc32fast::hash(h.get(..HDR_CRC).unwrap_or_default());
    if got != expected {
        return Err(HeaderError::Crc { got, expected });
    }
    let sync = h
        .get(HDR_SYNC)
        .copied()
        .and_then(SyncPolicyTag::from_byte)
        .ok_or(HeaderError::BadField("sync_policy"))?;
    let mut boot_id = [0u8; BOOT_ID_BYTES];
    boot_id.copy_from_slice(
        h.get(HDR_BOOT_ID..HDR_CREATED)
            .unwrap_or(&[0; BOOT_ID_BYTES]),
    );
    Ok(SegmentHeader {
        base_lsn: le_u64(h, HDR_BASE_LSN),
        term: le_u64(h, HDR_TERM),
        sync,
        boot_id,
        created_at_ms: le_u64(h, HDR_CREATED),
        base_entry: le_u64(h, HDR_BASE_ENTRY),
        prev_term: le_u64(h, HDR_PREV_TERM),
    })
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

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Body length in bytes.
    pub body_len: u32,
    /// Stored CRC.
    pub crc: u32,
    /// Log sequence number.
    pub lsn: u64,
    /// The segment offset below which every byte was durable (fsynced) when this frame was
    /// written: damage below it, found by recovery, is corruption of synced data; damage at
    /// or above the highest such claim is an unsynced write torn by a crash.
    pub synced_through: u64,
    /// The log entry the frame belongs to: every frame of one atomic group carries the
    /// same entry index, and entries are consecutive across the log (one per group).
    pub entry: u64,
    /// The term of that entry (the same in every frame of the group).
    pub term: u64,
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
            synced_through: le_u64(b, FRAME_SYNCED),
            entry: le_u64(b, FRAME_ENTRY),
            term: le_u64(b, FRAME_TERM),
            group_left: le_u32(b, FRAME_GROUP_LEFT),
            record_type: b[FRAME_TYPE],
        }
    }

    /// Writes the header fields, computing the CRC over `body`.
    pub fn write(&self, body: &[u8]) -> [u8; FRAME_HEADER_BYTES] {
        let mut h = [0u8; FRAME_HEADER_BYTES];
        h[FRAME_BODY_LEN..FRAME_CRC].copy_from_slice(&self.body_len.to_le_bytes());
        h[FRAME_LSN..FRAME_SYNCED].copy_from_slice(&self.lsn.to_le_bytes());
        h[FRAME_SYNCED..FRAME_ENTRY].copy_from_slice(&self.synced_through.to_le_bytes());
        h[FRAME_ENTRY..FRAME_TERM].copy_from_slice(&self.entry.to_le_bytes());
        h[FRAME_TERM..FRAME_GROUP_LEFT].copy_from_slice(&self.term.to_le_bytes());
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

pub(crate) mod legacy;
pub(crate) use legacy::{legacy_v1, legacy_v2};

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

    fn header() -> SegmentHeader {
        SegmentHeader {
            base_lsn: 42,
            term: 7,
            sync: SyncPolicyTag::Interval,
            boot_id: [9; BOOT_ID_BYTES],
            created_at_ms: 1_700_000_000_000,
            base_entry: 12,
            prev_term: 6,
        }
    }

    #[test]
    fn header_checks_each_field() {
        let h = header().encode();
        assert_eq!(decode_segment_header(&h), Ok(header()));
        assert_eq!(decode_segment_header(&h[..10]), Err(HeaderError::Short));
        let mut bad = h;
        bad[0] ^= 1;
        assert_eq!(decode_segment_header(&bad), Err(HeaderError::BadMagic));
        let mut v9 = h;
        v9[HDR_VERSION] = 9;
        assert_eq!(
            decode_segment_header(&v9),
            Err(HeaderError::UnknownVersion(9))
        );
        let mut flipped = h;
        flipped[HDR_BASE_LSN] ^= 0x10;
        assert!(matches!(
            decode_segment_header(&flipped),
            Err(HeaderError::Crc { .. })
        ));
    }

    /// The header's bytes, pinned: a change here is a format change (FORMAT.md).
    #[test]
    fn header_golden_bytes() {
        let hex: String = header()
            .encode()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "89434c470d0a1a0a03000000010000002a00000000000000070000000000000009090909090909090909090909090909\
             0068e5cf8b0100000c00000000000000060000000000000000000000f15733f0"
        );
    }

    proptest! {
        #[test]
        fn segment_name_round_trips(lsn: u64) {
            prop_assert_eq!(parse_segment_name(&segment_name(lsn)), Some(lsn));
        }
    }
}
