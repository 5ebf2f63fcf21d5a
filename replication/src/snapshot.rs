//! Snapshots as segment files on the wire (issue 19 item 4).
//!
//! A snapshot is the engine's [`LogSnapshot`]: the segment files holding the entries up to
//! the applied one, the last cut at that entry's end, plus a manifest (last entry, the LSN
//! the log goes on at, file names and lengths). openraft moves it as [`SegmentSnapshot`],
//! its `SnapshotData`, which reads as one byte stream:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | magic `CLSNAPS1` |
//! | 4 | manifest length, u32 LE |
//! | n | the manifest ([`SnapshotManifest::encode`], `engine/FORMAT.md` "Snapshots") |
//! | … | each file's first `len` bytes, in the manifest's order |
//!
//! The sender reads the files through descriptors opened when the snapshot was taken
//! (never more than one transport chunk in memory); the receiver ([`SnapshotSpool`]) writes
//! the stream to an unlinked spool file, and the state machine's install copies it, file by
//! file in bounded buffers, beside the log as staged files (`*.seg.staged`) before the
//! engine makes them the log. The spool costs a second write of the snapshot's bytes (a
//! first version: demultiplexing straight into staged files needs the receiver to know the
//! node's directory).
//!
//! Bytes sent and received are counted ([`bytes_sent`], [`bytes_received`]) for the
//! `cursorlog_raft_snapshot_*_bytes_total` metrics.

use std::collections::VecDeque;
use std::io::{self, Read, Seek as _, Write as _};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use cursorlog_engine::{LogSnapshot, SnapshotManifest, SnapshotStaging};
use openraft::type_config::alias::SnapshotMetaOf;
use tokio::io::{AsyncRead, ReadBuf};

use crate::service::SnapshotSink;
use crate::types::TypeConfig;

/// The stream's first bytes.
const MAGIC: &[u8; 8] = b"CLSNAPS1";
/// The copy buffer of an install (bounded memory per snapshot).
const COPY_BYTES: usize = 1 << 20;

/// A member builds a snapshot every this many entries by default: taking one opens the
/// segment files, nothing is copied or written.
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 10_000;

/// Entries openraft keeps below the last snapshot when it purges, by default: a member less
/// far behind (a restart) is sent entries (AppendEntries); one further behind (wiped, or
/// down for long) is sent the segment files, as issue 19 item 4 asks. Per GiB the two
/// measured about alike on a shared 2-core machine (9–20 s/GiB each, benches/HISTORY.md
/// "Catch-up of a wiped member").
pub const KEEP_BELOW_SNAPSHOT_ENTRIES: u64 = 10_000;

/// When a member snapshots and how much of its log it keeps below the snapshot. Retention
/// unlinks only purged segments (`engine/src/member.rs`), so a member's log holds, beyond
/// the retention bound, up to about `every + keep_below` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// A snapshot every this many entries (at least 1).
    pub every: u64,
    /// Entries kept below the last snapshot when the log is purged.
    pub keep_below: u64,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        Self {
            every: SNAPSHOT_EVERY_ENTRIES,
            keep_below: KEEP_BELOW_SNAPSHOT_ENTRIES,
        }
    }
}

/// `config` with snapshot policy `policy`, validated. [`crate::ClusterTiming`]'s config asks
/// for no snapshot (`SnapshotPolicy::Never`, for stores without this module's snapshots); a
/// member started by [`crate::ReplicatedNode`] uses this one.
///
/// # Errors
/// openraft refuses the result.
pub fn with_policy(
    config: openraft::Config,
    policy: SnapshotPolicy,
) -> Result<openraft::Config, openraft::ConfigError> {
    openraft::Config {
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(policy.every.max(1)),
        max_in_snapshot_log_to_keep: policy.keep_below,
        ..config
    }
    .validate()
}

static SENT: AtomicU64 = AtomicU64::new(0);
static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Snapshot bytes this process has sent to peers (file bytes, from the stream's reads).
pub fn bytes_sent() -> u64 {
    SENT.load(Ordering::Relaxed)
}

/// Snapshot bytes this process has received and installed (file bytes).
pub fn bytes_received() -> u64 {
    RECEIVED.load(Ordering::Relaxed)
}

/// openraft's snapshot data: a snapshot taken here (its files, to be sent), or one received
/// (its spool file, to be installed). Reads as the stream described in the module docs.
pub struct SegmentSnapshot {
    head: Vec<u8>,
    head_at: usize,
    /// Files still to read, with the bytes left of each (`u64::MAX`: to its end).
    files: VecDeque<(Box<dyn Read + Send>, u64)>,
    /// Counted as sent when read (a snapshot taken here).
    counts_sent: bool,
}

impl std::fmt::Debug for SegmentSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentSnapshot")
            .field("files_left", &self.files.len())
            .field("taken_here", &self.counts_sent)
            .finish()
    }
}

impl SegmentSnapshot {
    /// The stream of a snapshot taken from the log.
    pub fn taken(snapshot: LogSnapshot) -> Self {
        let manifest = snapshot.manifest.encode();
        let mut head = MAGIC.to_vec();
        head.extend_from_slice(
            &u32::try_from(manifest.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        head.extend_from_slice(&manifest);
        let files = snapshot
            .files
            .into_iter()
            .zip(snapshot.manifest.files.iter().map(|(_, len)| *len))
            .map(|(file, len)| (Box::new(file) as Box<dyn Read + Send>, len))
            .collect();
        Self {
            head,
            head_at: 0,
            files,
            counts_sent: true,
        }
    }

    /// A received stream, spooled in `file` (read from its start).
    pub fn spooled(file: std::fs::File) -> Self {
        Self {
            head: Vec::new(),
            head_at: 0,
            files: VecDeque::from([(Box::new(file) as Box<dyn Read + Send>, u64::MAX)]),
            counts_sent: false,
        }
    }

    /// Reads the stream's head: the manifest.
    ///
    /// # Errors
    /// The stream does not start with a snapshot head (`InvalidData`); read failures.
    pub fn read_manifest(&mut self) -> io::Result<SnapshotManifest> {
        let mut fixed = [0u8; 12];
        self.read_exact(&mut fixed)?;
        if &fixed[..8] != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a cursorlog snapshot stream",
            ));
        }
        let len = u32::from_le_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]);
        let mut manifest = vec![0; len as usize];
        self.read_exact(&mut manifest)?;
        SnapshotManifest::decode(&manifest).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "the snapshot manifest does not decode",
            )
        })
    }
}

impl Read for SegmentSnapshot {
    /// Blocking reads of the files (a snapshot's files are local, immutable bytes).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.head_at < self.head.len() {
            let n = buf.len().min(self.head.len() - self.head_at);
            buf[..n].copy_from_slice(&self.head[self.head_at..self.head_at + n]);
            self.head_at += n;
            return Ok(n);
        }
        while let Some((file, left)) = self.files.front_mut() {
            if *left == 0 {
                self.files.pop_front();
                continue;
            }
            let want = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
            let n = file.read(&mut buf[..want])?;
            if n == 0 {
                if *left == u64::MAX || !self.counts_sent {
                    // A spool: its end is the stream's end.
                    self.files.pop_front();
                    continue;
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "a snapshot file is shorter than its manifest says",
                ));
            }
            if *left != u64::MAX {
                *left -= n as u64;
            }
            if self.counts_sent {
                SENT.fetch_add(n as u64, Ordering::Relaxed);
            }
            return Ok(n);
        }
        Ok(0)
    }
}

impl AsyncRead for SegmentSnapshot {
    /// The file reads are synchronous (local, sequential, one transport chunk at a time):
    /// they block the calling task for about a disk read each.
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let n = this.read(buf.initialize_unfilled())?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// Copies a received stream into `staging`, file by file, in bounded buffers; logs the
/// progress (files and bytes) and counts the bytes received.
///
/// # Errors
/// The stream ends early or holds more than the manifest says; I/O failures.
pub fn copy_into(mut stream: SegmentSnapshot, staging: &SnapshotStaging) -> io::Result<()> {
    let manifest = staging.manifest().clone();
    let total = manifest.bytes();
    let files = manifest.files.len();
    let mut done = 0u64;
    let mut buf = vec![0u8; COPY_BYTES];
    for (i, (name, len)) in manifest.files.iter().enumerate() {
        let mut out = staging.create(i).map_err(io::Error::other)?;
        let mut left = *len;
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            let n = stream.read(&mut buf[..want])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the snapshot stream ended inside {name}"),
                ));
            }
            out.write_all(&buf[..n])?;
            left -= n as u64;
            done += n as u64;
            RECEIVED.fetch_add(n as u64, Ordering::Relaxed);
        }
        tracing::info!(
            file = %name,
            files_done = i + 1,
            files,
            bytes_done = done,
            bytes = total,
            "snapshot install: file received"
        );
    }
    if stream.read(&mut buf[..1])? != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the snapshot stream holds more than its manifest",
        ));
    }
    Ok(())
}

/// Receives snapshots into an unlinked spool file (in `dir`, or the system's temporary
/// directory), so a snapshot of any size costs no memory beyond a transport chunk.
#[derive(Debug, Clone, Default)]
pub struct SnapshotSpool {
    dir: Option<PathBuf>,
}

impl SnapshotSpool {
    /// Spools in `dir` (best on the data directory's file system).
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
        }
    }

    fn create(&self) -> io::Result<std::fs::File> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = self.dir.clone().unwrap_or_else(std::env::temp_dir);
        let path = dir.join(format!(
            ".cursorlog-snapshot-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        // Unlinked at once: the file lives while it is open, and no crash leaves it behind.
        std::fs::remove_file(&path)?;
        Ok(file)
    }
}

/// The spool file being written. Writes are synchronous (a transport chunk each, to a local
/// file): they block the receiving task for about a disk write each.
#[derive(Debug)]
pub struct SpoolWriter(std::fs::File);

impl tokio::io::AsyncWrite for SpoolWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(self.get_mut().0.write(buf))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().0.flush())
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl SnapshotSink<SegmentSnapshot> for SnapshotSpool {
    type Writer = SpoolWriter;

    async fn begin(&self, _meta: &SnapshotMetaOf<TypeConfig>) -> io::Result<SpoolWriter> {
        let spool = self.clone();
        let file = tokio::task::spawn_blocking(move || spool.create())
            .await
            .map_err(io::Error::other)??;
        Ok(SpoolWriter(file))
    }

    async fn finish(&self, writer: SpoolWriter) -> io::Result<SegmentSnapshot> {
        let mut file = writer.0;
        file.flush()?;
        file.rewind()?;
        Ok(SegmentSnapshot::spooled(file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_snapshots_every_n_entries_and_keeps_n_below_the_snapshot() {
        let config = with_policy(
            crate::ClusterTiming::default().config("t").unwrap(),
            SnapshotPolicy::default(),
        )
        .unwrap();
        assert!(matches!(
            config.snapshot_policy,
            openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_ENTRIES)
        ));
        assert_eq!(
            config.max_in_snapshot_log_to_keep,
            KEEP_BELOW_SNAPSHOT_ENTRIES
        );
        assert_eq!(config.enable_pre_vote, Some(true), "the rest is kept");
    }
}
