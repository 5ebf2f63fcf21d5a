//! Upgrading a data directory written by an older format version to the current one, on
//! open.
//!
//! Record bodies never changed; only the framing did. Version 2 added the 64-byte segment
//! header (term, sync policy, boot id) and `synced_through` in every frame; version 3 added
//! the log entry index and term to every frame (one entry per atomic group) and the first
//! entry and the term before it to the segment header. Each older segment is rewritten
//! frame by frame, with the same LSNs and groups, into `<name>.v3tmp`, synced, and renamed
//! over the original, oldest first; entries are numbered on from the segment before. A
//! crash at any point leaves every segment wholly old or wholly new, and the next open
//! carries on (numbering from the last upgraded segment); leftover temporary files are
//! discarded. The index is rebuilt afterwards (its version changed with the frame offsets).

use std::path::Path;

use crate::clock::Clock;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{
    decode_segment_header, legacy_v1, legacy_v2, segment_version, FrameHeader, SegmentHeader,
    SyncPolicyTag, BOOT_ID_BYTES, FORMAT_VERSION, SEGMENT_HEADER_BYTES,
};
use crate::fs::FileSystem;
use crate::log::frames::walk;
use crate::log::open::{header_error, list_segments};
use crate::log::sync_dir;

/// Suffixes of a segment being rewritten (the version-1 upgrade's name is still cleaned up).
const TMP_SUFFIXES: [&str; 2] = [".v3tmp", ".v2tmp"];

/// An older segment's framing, as the rewrite needs it.
#[derive(Debug, Clone, Copy)]
struct OldFrame {
    body_len: u32,
    lsn: u64,
    synced_through: u64,
    group_left: u32,
    record_type: u8,
}

/// An older format version's frame decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Old {
    V1,
    V2,
}

impl Old {
    fn segment_header_bytes(self) -> usize {
        match self {
            Self::V1 => legacy_v1::SEGMENT_HEADER_BYTES,
            Self::V2 => legacy_v2::SEGMENT_HEADER_BYTES,
        }
    }

    fn frame_header_bytes(self) -> usize {
        match self {
            Self::V1 => legacy_v1::FRAME_HEADER_BYTES,
            Self::V2 => legacy_v2::FRAME_HEADER_BYTES,
        }
    }

    /// Checks the frame at the start of `buf` (length bound and CRC).
    fn check(self, buf: &[u8]) -> std::result::Result<(OldFrame, &[u8]), String> {
        match self {
            Self::V1 => legacy_v1::check_frame(buf).map(|(h, body)| {
                let f = OldFrame {
                    body_len: h.body_len,
                    lsn: h.lsn,
                    synced_through: 0,
                    group_left: h.group_left,
                    record_type: h.record_type,
                };
                (f, body)
            }),
            Self::V2 => legacy_v2::check_frame(buf).map(|(h, body)| {
                let f = OldFrame {
                    body_len: h.body_len,
                    lsn: h.lsn,
                    synced_through: h.synced_through,
                    group_left: h.group_left,
                    record_type: h.record_type,
                };
                (f, body)
            }),
        }
    }
}

/// Where the entries of the next segment start.
#[derive(Debug, Clone, Copy)]
struct EntryStart {
    entry: u64,
    prev_term: u64,
}

/// What an upgrade did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Upgraded {
    /// The oldest format version found.
    pub from: u32,
    /// A torn unsynced tail was cut from the last segment while rewriting it.
    pub tail_cut: bool,
}

/// Upgrades every older segment in `dir`; says what it did, if anything.
///
/// # Errors
/// Damage in an older segment that its own version would have refused (anything but a
/// torn unsynced tail of the last segment), an unknown version, I/O failures.
pub(crate) fn upgrade_if_needed(
    fs: &dyn FileSystem,
    dir: &Path,
    clock: &dyn Clock,
    boot_id: Option<[u8; BOOT_ID_BYTES]>,
) -> Result<Option<Upgraded>> {
    let entries = fs
        .list(dir)
        .map_err(Error::io(format!("listing {}", dir.display())))?;
    let mut removed_tmp = false;
    for (name, path) in entries {
        if TMP_SUFFIXES.iter().any(|s| name.ends_with(s)) {
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
    // A cheap first pass: most opens find nothing to upgrade.
    let mut versions = Vec::with_capacity(count);
    for (i, (_, path)) in segments.iter().enumerate() {
        let mut head = [0u8; 12];
        let n = read_prefix(fs, path, &mut head)?;
        versions.push(match segment_version(&head[..n]) {
            Ok(v) => Some(v),
            // A torn creation of the last segment is left to the open that follows.
            Err(_) if i + 1 == count => None,
            Err(e) => return Err(header_error(path, e)),
        });
    }
    if !versions
        .iter()
        .any(|v| v.is_some_and(|v| v != FORMAT_VERSION))
    {
        return Ok(None);
    }
    let mut oldest = FORMAT_VERSION;
    let mut tail_cut = false;
    let mut next = EntryStart {
        entry: 1,
        prev_term: 0,
    };
    for (i, ((base, path), version)) in segments.iter().zip(versions).enumerate() {
        let is_tail = i + 1 == count;
        let bytes = fs
            .read(path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        let old = match version {
            Some(FORMAT_VERSION) => {
                // Upgraded before a crash: number on from where it ends.
                let header = decode_segment_header(&bytes).map_err(|e| header_error(path, e))?;
                let end = walk(&mut bytes.as_slice(), header.base_lsn, |_| Ok(Ok(())))?;
                next = EntryStart {
                    entry: end.last_entry + 1,
                    prev_term: end.last_term,
                };
                continue;
            }
            Some(legacy_v1::VERSION) => Old::V1,
            Some(legacy_v2::VERSION) => Old::V2,
            Some(v) => {
                return Err(header_error(
                    path,
                    crate::format::HeaderError::UnknownVersion(v),
                ))
            }
            None => continue,
        };
        if is_tail && bytes.len() < old.segment_header_bytes() {
            continue;
        }
        let (header_base, term, sync, boot, created_at_ms) = match old {
            Old::V1 => {
                let b =
                    legacy_v1::decode_segment_header(&bytes).map_err(|e| header_error(path, e))?;
                let boot = boot_id.unwrap_or([0; BOOT_ID_BYTES]);
                (b, 1, SyncPolicyTag::Always, boot, clock.now_ms())
            }
            Old::V2 => {
                let h =
                    legacy_v2::decode_segment_header(&bytes).map_err(|e| header_error(path, e))?;
                (h.base_lsn, h.term, h.sync, h.boot_id, h.created_at_ms)
            }
        };
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
            term: term.max(next.prev_term),
            sync,
            boot_id: boot,
            created_at_ms,
            base_entry: next.entry,
            prev_term: next.prev_term,
        };
        let (rewritten, after, cut) = rewrite(old, path, &bytes, &header, is_tail)?;
        next = after;
        tail_cut |= cut;
        replace(fs, dir, path, &rewritten)?;
        oldest = oldest.min(match old {
            Old::V1 => legacy_v1::VERSION,
            Old::V2 => legacy_v2::VERSION,
        });
    }
    tracing::info!(
        from = oldest,
        "upgraded the data directory to format version {FORMAT_VERSION}"
    );
    Ok(Some(Upgraded {
        from: oldest,
        tail_cut,
    }))
}

/// Reads up to `buf.len()` bytes from the start of `path`; returns how many.
fn read_prefix(fs: &dyn FileSystem, path: &Path, buf: &mut [u8]) -> Result<usize> {
    let len = fs
        .len(path)
        .map_err(Error::io(format!("reading {}", path.display())))?;
    let n = usize::try_from(len).unwrap_or(usize::MAX).min(buf.len());
    let file = fs
        .open_read_only(path)
        .map_err(Error::io(format!("opening {}", path.display())))?;
    file.read_exact_at(&mut buf[..n], 0)
        .map_err(Error::io(format!("reading {}", path.display())))?;
    Ok(n)
}

/// Writes `bytes` to a temporary file, syncs it, renames it over `path`, syncs `dir`.
fn replace(fs: &dyn FileSystem, dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(TMP_SUFFIXES[0]);
    let tmp = std::path::PathBuf::from(tmp_name);
    let file = fs
        .create_new(&tmp)
        .map_err(Error::io(format!("creating {}", tmp.display())))?;
    file.write_all_at(bytes, 0)
        .and_then(|()| file.sync_data())
        .map_err(Error::io(format!("writing {}", tmp.display())))?;
    drop(file);
    fs.rename(&tmp, path).map_err(Error::io(format!(
        "renaming {} over {}",
        tmp.display(),
        path.display()
    )))?;
    sync_dir(fs, dir)
}

/// The current-version image of an older segment: the same frames, reframed, each group one
/// entry of the header's term. A damaged frame is corruption, except in the last segment
/// where the old version's own rule applies: a torn unsynced tail is cut; damage that a
/// valid frame says was synced (version 2), or that valid frames follow (version 1, which
/// recorded no sync points), is refused.
fn rewrite(
    old: Old,
    path: &Path,
    bytes: &[u8],
    header: &SegmentHeader,
    is_tail: bool,
) -> Result<(Vec<u8>, EntryStart, bool)> {
    let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 4);
    out.extend_from_slice(&header.encode());
    let mut offset = old.segment_header_bytes();
    let mut lsn = header.base_lsn;
    let mut entry = header.base_entry;
    let mut group_start = out.len();
    let mut in_group = false;
    // The highest sync point a frame before the damage claims (old offsets).
    let mut claimed = 0u64;
    let mut last_complete_end = offset;
    let mut cut = false;
    while offset < bytes.len() {
        let rest = bytes.get(offset..).unwrap_or_default();
        let frame = old.check(rest).and_then(|(h, body)| {
            if h.lsn == lsn {
                Ok((h, body))
            } else {
                Err(format!("lsn {} where {lsn} was expected", h.lsn))
            }
        });
        let (h, body) = match frame {
            Ok(f) => f,
            Err(why) => {
                let (after, claimed_after) = old_frames_after(old, bytes, offset, lsn);
                let synced_damage = claimed.max(claimed_after) > last_complete_end as u64
                    || (old == Old::V1 && after);
                if is_tail && !synced_damage {
                    tracing::warn!(path = %path.display(), offset, why, "cutting a torn unsynced tail while upgrading");
                    out.truncate(group_start);
                    return Ok((out, start_after(entry, header), true));
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
        if h.synced_through <= offset as u64 {
            claimed = claimed.max(h.synced_through);
        }
        let new = FrameHeader {
            body_len: h.body_len,
            crc: 0,
            lsn: h.lsn,
            // The rewritten file is synced whole before it replaces the old one.
            synced_through: out.len() as u64,
            entry,
            term: header.term,
            group_left: h.group_left,
            record_type: h.record_type,
        };
        out.extend_from_slice(&new.write(body));
        out.extend_from_slice(body);
        offset += old.frame_header_bytes() + body.len();
        lsn += 1;
        if h.group_left == 0 {
            in_group = false;
            entry += 1;
            last_complete_end = offset;
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
        cut = true;
    }
    debug_assert!(out.len() >= SEGMENT_HEADER_BYTES);
    Ok((out, start_after(entry, header), cut))
}

/// Where entries go on after a rewritten segment whose next entry would be `entry` (an
/// incomplete group cut off does not count).
fn start_after(entry: u64, header: &SegmentHeader) -> EntryStart {
    EntryStart {
        entry,
        prev_term: if entry > header.base_entry {
            header.term
        } else {
            header.prev_term
        },
    }
}

/// Whether a CRC-valid older frame with an LSN at or above `lsn` starts after `from`, and
/// the highest sync point such frames claim (each claim only up to its own offset).
fn old_frames_after(old: Old, bytes: &[u8], from: usize, lsn: u64) -> (bool, u64) {
    let mut found = false;
    let mut claimed = 0u64;
    for at in from + 1..bytes.len() {
        let Some((h, _)) = bytes.get(at..).and_then(|rest| old.check(rest).ok()) else {
            continue;
        };
        if h.lsn >= lsn && h.lsn < lsn.saturating_add(1 << 32) {
            found = true;
            if h.synced_through <= at as u64 {
                claimed = claimed.max(h.synced_through);
            }
        }
    }
    (found, claimed)
}
