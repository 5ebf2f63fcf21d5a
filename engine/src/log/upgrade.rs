//! Upgrading a data directory written by format version 1 to the current version, on open.
//!
//! Version 2 changed only the framing (a 64-byte segment header with a term, the writer's
//! sync policy and boot id; a `synced_through` field in every frame header); record bodies
//! are unchanged. Each version-1 segment is rewritten frame by frame, with the same LSNs and
//! groups, into `<name>.v2tmp`, synced, and renamed over the original. A crash at any point
//! leaves every segment wholly version 1 or wholly version 2, and the next open carries on;
//! leftover temporary files are discarded. The index is rebuilt afterwards (the index
//! version changed with the frame offsets).

use std::path::Path;

use crate::clock::Clock;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{
    legacy_v1, segment_version, FrameHeader, SegmentHeader, SyncPolicyTag, BOOT_ID_BYTES,
    FORMAT_VERSION, FRAME_HEADER_BYTES, SEGMENT_HEADER_BYTES,
};
use crate::fs::FileSystem;
use crate::log::open::{header_error, list_segments};
use crate::log::sync_dir;

/// The suffix of a segment being rewritten.
const TMP_SUFFIX: &str = ".v2tmp";

/// Upgrades every version-1 segment in `dir`; returns `Some(1)` if any was.
///
/// # Errors
/// Damage in a version-1 segment that version 1 itself would have refused (anything but a
/// torn tail of the last segment), an unknown version, I/O failures.
pub(crate) fn upgrade_if_needed(
    fs: &dyn FileSystem,
    dir: &Path,
    clock: &dyn Clock,
    boot_id: Option<[u8; BOOT_ID_BYTES]>,
) -> Result<Option<u32>> {
    let entries = fs
        .list(dir)
        .map_err(Error::io(format!("listing {}", dir.display())))?;
    let mut removed_tmp = false;
    for (name, path) in entries {
        if name.ends_with(TMP_SUFFIX) {
            tracing::warn!(path = %path.display(), "removing an interrupted format upgrade's file");
            fs.remove(&path)
                .map_err(Error::io(format!("removing {}", path.display())))?;
            removed_tmp = true;
        }
    }
    if removed_tmp {
        sync_dir(fs, dir)?;
    }
    let segments = list_segments(fs, dir)?;
    let count = segments.len();
    let mut upgraded = 0;
    for (i, (base, path)) in segments.iter().enumerate() {
        let bytes = fs
            .read(path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        match segment_version(&bytes) {
            Ok(FORMAT_VERSION) => continue,
            Ok(legacy_v1::VERSION) => {}
            Ok(v) => {
                return Err(header_error(
                    path,
                    crate::format::HeaderError::UnknownVersion(v),
                ))
            }
            // A torn creation of the last segment is left to the open that follows.
            Err(_) if i + 1 == count && bytes.len() < legacy_v1::SEGMENT_HEADER_BYTES => continue,
            Err(e) => return Err(header_error(path, e)),
        }
        let header_base =
            legacy_v1::decode_segment_header(&bytes).map_err(|e| header_error(path, e))?;
        if header_base != *base {
            return Err(Error::Corruption {
                segment: path.clone(),
                offset: 0,
                kind: CorruptionKind::LsnGap {
                    expected: *base,
                    got: header_base,
                },
            });
        }
        let header = SegmentHeader {
            base_lsn: *base,
            term: 1,
            sync: SyncPolicyTag::Always,
            boot_id: boot_id.unwrap_or([0; BOOT_ID_BYTES]),
            created_at_ms: clock.now_ms(),
        };
        let rewritten = rewrite(path, &bytes, &header, i + 1 == count)?;
        let mut tmp_name = path.clone().into_os_string();
        tmp_name.push(TMP_SUFFIX);
        let tmp = std::path::PathBuf::from(tmp_name);
        let file = fs
            .create_new(&tmp)
            .map_err(Error::io(format!("creating {}", tmp.display())))?;
        file.write_all_at(&rewritten, 0)
            .and_then(|()| file.sync_data())
            .map_err(Error::io(format!("writing {}", tmp.display())))?;
        drop(file);
        fs.rename(&tmp, path).map_err(Error::io(format!(
            "renaming {} over {}",
            tmp.display(),
            path.display()
        )))?;
        sync_dir(fs, dir)?;
        upgraded += 1;
    }
    if upgraded > 0 {
        tracing::info!(
            segments = upgraded,
            "upgraded the data directory from format version 1 to {FORMAT_VERSION}"
        );
        Ok(Some(legacy_v1::VERSION))
    } else {
        Ok(None)
    }
}

/// The version-2 image of a version-1 segment: the same frames, reframed. A damaged frame
/// is corruption, except in the last segment where version 1's own rule applies: a torn
/// tail (no valid frame after the damage) is cut; damage followed by valid frames is refused.
fn rewrite(path: &Path, bytes: &[u8], header: &SegmentHeader, is_tail: bool) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 8);
    out.extend_from_slice(&header.encode());
    let mut offset = legacy_v1::SEGMENT_HEADER_BYTES;
    let mut lsn = header.base_lsn;
    let mut group_start = out.len();
    let mut in_group = false;
    while offset < bytes.len() {
        let rest = bytes.get(offset..).unwrap_or_default();
        let frame = legacy_v1::check_frame(rest).and_then(|(h, body)| {
            if h.lsn == lsn {
                Ok((h, body))
            } else {
                Err(format!("lsn {} where {lsn} was expected", h.lsn))
            }
        });
        let (h, body) = match frame {
            Ok(f) => f,
            Err(why) => {
                if is_tail && !valid_v1_frame_after(bytes, offset, lsn) {
                    tracing::warn!(path = %path.display(), offset, why, "cutting a torn version-1 tail while upgrading");
                    out.truncate(group_start);
                    return Ok(out);
                }
                return Err(Error::Corruption {
                    segment: path.to_path_buf(),
                    offset: offset as u64,
                    kind: if is_tail {
                        CorruptionKind::DamageBeforeValidRecords
                    } else {
                        CorruptionKind::BadBody(why)
                    },
                });
            }
        };
        if !in_group {
            group_start = out.len();
            in_group = true;
        }
        let new = FrameHeader {
            body_len: h.body_len,
            crc: 0,
            lsn: h.lsn,
            synced_through: out.len() as u64,
            group_left: h.group_left,
            record_type: h.record_type,
        };
        out.extend_from_slice(&new.write(body));
        out.extend_from_slice(body);
        offset += legacy_v1::FRAME_HEADER_BYTES + body.len();
        lsn += 1;
        if h.group_left == 0 {
            in_group = false;
        }
    }
    if in_group {
        if !is_tail {
            return Err(Error::Corruption {
                segment: path.to_path_buf(),
                offset: offset as u64,
                kind: CorruptionKind::BadLength(0),
            });
        }
        out.truncate(group_start);
    }
    debug_assert!(out.len() >= SEGMENT_HEADER_BYTES && FRAME_HEADER_BYTES == 32);
    Ok(out)
}

/// True when a CRC-valid version-1 frame with an LSN at or above `lsn` starts after `from`.
fn valid_v1_frame_after(bytes: &[u8], from: usize, lsn: u64) -> bool {
    (from + 1..bytes.len()).any(|at| {
        bytes
            .get(at..)
            .and_then(|rest| legacy_v1::check_frame(rest).ok())
            .is_some_and(|(h, _)| h.lsn >= lsn && h.lsn < lsn.saturating_add(1 << 32))
    })
}
