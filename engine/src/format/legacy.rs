//! Earlier format versions, read only to upgrade a data directory to the current version
//! on open (`log/upgrade.rs`). Record bodies are the same in every version; only the
//! framing changed.

/// Format version 1, read only to upgrade a data directory to the current version: a
/// 32-byte segment header (magic, version, reserved, base LSN, CRC, reserved) and 24-byte
/// frame headers (body_len, crc, lsn, group_left, record_type, reserved) with the CRC over
/// bytes 8.. of the header and the body. Record bodies are the same in both versions.
pub(crate) mod legacy_v1 {
    use super::super::{le_u32, le_u64, HeaderError, SEGMENT_MAGIC};

    /// The version number.
    pub const VERSION: u32 = 1;
    /// Segment header bytes.
    pub const SEGMENT_HEADER_BYTES: usize = 32;
    /// Frame header bytes.
    pub const FRAME_HEADER_BYTES: usize = 24;

    /// A version-1 frame header.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct FrameHeader {
        pub body_len: u32,
        pub crc: u32,
        pub lsn: u64,
        pub group_left: u32,
        pub record_type: u8,
    }

    /// Checks a version-1 segment header; returns its base LSN.
    pub fn decode_segment_header(b: &[u8]) -> Result<u64, HeaderError> {
        let h = b.get(..SEGMENT_HEADER_BYTES).ok_or(HeaderError::Short)?;
        if h.get(..8) != Some(&SEGMENT_MAGIC[..]) {
            return Err(HeaderError::BadMagic);
        }
        let version = le_u32(h, 8);
        if version != VERSION {
            return Err(HeaderError::UnknownVersion(version));
        }
        let expected = le_u32(h, 24);
        let got = crc32fast::hash(h.get(..24).unwrap_or_default());
        if got != expected {
            return Err(HeaderError::Crc { got, expected });
        }
        Ok(le_u64(h, 16))
    }

    /// Reads and checks (length bound and CRC) the version-1 frame at the start of `buf`;
    /// returns its header and body.
    pub fn check_frame(buf: &[u8]) -> Result<(FrameHeader, &[u8]), String> {
        let h = buf
            .get(..FRAME_HEADER_BYTES)
            .ok_or_else(|| "truncated frame header".to_owned())?;
        let header = FrameHeader {
            body_len: le_u32(h, 0),
            crc: le_u32(h, 4),
            lsn: le_u64(h, 8),
            group_left: le_u32(h, 16),
            record_type: h.get(20).copied().unwrap_or(0),
        };
        if header.body_len > super::super::BODY_BYTES_MAX {
            return Err(format!("bad frame length {}", header.body_len));
        }
        let end = FRAME_HEADER_BYTES + header.body_len as usize;
        let frame = buf.get(..end).ok_or_else(|| "truncated frame".to_owned())?;
        let got = crc32fast::hash(frame.get(8..).unwrap_or_default());
        if got != header.crc {
            return Err(format!(
                "crc mismatch: got {got:#010x}, stored {:#010x}",
                header.crc
            ));
        }
        Ok((header, frame.get(FRAME_HEADER_BYTES..).unwrap_or_default()))
    }
}

/// Format version 2, read only to upgrade a data directory to the current version: the
/// same 64-byte segment header as version 3 minus `base_entry` and `prev_term` (magic,
/// version, sync policy, base LSN, term, boot id, creation time, reserved, CRC over 0..60)
/// and 32-byte frame headers (body_len, crc, lsn, synced_through, group_left, record_type,
/// reserved) with the CRC over bytes 8.. of the header and the body.
pub(crate) mod legacy_v2 {
    use super::super::{le_u32, le_u64, HeaderError, SyncPolicyTag, SEGMENT_MAGIC};

    /// The version number.
    pub const VERSION: u32 = 2;
    /// Segment header bytes.
    pub const SEGMENT_HEADER_BYTES: usize = 64;
    /// Frame header bytes.
    pub const FRAME_HEADER_BYTES: usize = 32;

    /// What a version-2 segment header says.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct SegmentHeader {
        pub base_lsn: u64,
        pub term: u64,
        pub sync: SyncPolicyTag,
        pub boot_id: [u8; 16],
        pub created_at_ms: u64,
    }

    /// A version-2 frame header.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct FrameHeader {
        pub body_len: u32,
        pub crc: u32,
        pub lsn: u64,
        pub synced_through: u64,
        pub group_left: u32,
        pub record_type: u8,
    }

    /// Checks a version-2 segment header.
    pub fn decode_segment_header(b: &[u8]) -> Result<SegmentHeader, HeaderError> {
        let h = b.get(..SEGMENT_HEADER_BYTES).ok_or(HeaderError::Short)?;
        if h.get(..8) != Some(&SEGMENT_MAGIC[..]) {
            return Err(HeaderError::BadMagic);
        }
        let version = le_u32(h, 8);
        if version != VERSION {
            return Err(HeaderError::UnknownVersion(version));
        }
        let expected = le_u32(h, 60);
        let got = crc32fast::hash(h.get(..60).unwrap_or_default());
        if got != expected {
            return Err(HeaderError::Crc { got, expected });
        }
        let sync = h
            .get(12)
            .copied()
            .and_then(SyncPolicyTag::from_byte)
            .ok_or(HeaderError::BadField("sync_policy"))?;
        let mut boot_id = [0u8; 16];
        boot_id.copy_from_slice(h.get(32..48).unwrap_or(&[0; 16]));
        Ok(SegmentHeader {
            base_lsn: le_u64(h, 16),
            term: le_u64(h, 24),
            sync,
            boot_id,
            created_at_ms: le_u64(h, 48),
        })
    }

    /// Reads and checks (length bound and CRC) the version-2 frame at the start of `buf`;
    /// returns its header and body.
    pub fn check_frame(buf: &[u8]) -> Result<(FrameHeader, &[u8]), String> {
        let h = buf
            .get(..FRAME_HEADER_BYTES)
            .ok_or_else(|| "truncated frame header".to_owned())?;
        let header = FrameHeader {
            body_len: le_u32(h, 0),
            crc: le_u32(h, 4),
            lsn: le_u64(h, 8),
            synced_through: le_u64(h, 16),
            group_left: le_u32(h, 24),
            record_type: h.get(28).copied().unwrap_or(0),
        };
        if header.body_len > super::super::BODY_BYTES_MAX {
            return Err(format!("bad frame length {}", header.body_len));
        }
        let end = FRAME_HEADER_BYTES + header.body_len as usize;
        let frame = buf.get(..end).ok_or_else(|| "truncated frame".to_owned())?;
        let got = crc32fast::hash(frame.get(8..).unwrap_or_default());
        if got != header.crc {
            return Err(format!(
                "crc mismatch: got {got:#010x}, stored {:#010x}",
                header.crc
            ));
        }
        Ok((header, frame.get(FRAME_HEADER_BYTES..).unwrap_or_default()))
    }
}
