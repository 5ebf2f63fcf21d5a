//! The engine's error type: I/O, corruption and domain states kept apart.
//!
//! Resolve verdicts are *data*, not errors (see [`crate::Verdict`]); everything here is a
//! request the engine could not carry out, with the reason named.

use std::path::PathBuf;

/// Result alias used across the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a stored frame or file failed its checks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorruptionKind {
    /// The CRC32 stored in a frame does not match the bytes it covers.
    Crc {
        /// CRC computed over the bytes on disk.
        got: u32,
        /// CRC stored in the frame header.
        expected: u32,
    },
    /// A segment header does not start with the cursorlog magic.
    BadMagic,
    /// A segment header names a format version this build does not read.
    UnknownVersion(u32),
    /// A frame length is zero-sized, beyond the limit, or runs past the end of the file.
    BadLength(u64),
    /// A frame decoded but its body is not a valid record of its type.
    BadBody(String),
    /// A frame whose CRC checks carries a record type this build does not know: a newer
    /// build wrote it. It is never taken for a torn write, so nothing is cut; run the newer
    /// build on the directory.
    UnknownRecordType(u8),
    /// Records do not carry the log sequence numbers their position requires.
    LsnGap {
        /// The LSN the position requires.
        expected: u64,
        /// The LSN found.
        got: u64,
    },
    /// Frames do not carry the log entry indexes their position requires: entries are
    /// consecutive (one per atomic group) and every frame of a group carries the same one.
    EntryGap {
        /// The entry index the position requires.
        expected: u64,
        /// The entry index found.
        got: u64,
    },
    /// A term does not follow the entry before it: a frame's term is below it or differs
    /// from the rest of its group, or a segment header names another term for the entry
    /// before the segment. Terms never decrease along a log.
    TermBackwards {
        /// The term the frame had to have at least.
        previous: u64,
        /// The term found.
        got: u64,
    },
    /// A frame of the segment says (`synced_through`) the damaged bytes had been synced, so
    /// the damage is not a torn unsynced write and cutting it would drop acknowledged data.
    DamageBeforeValidRecords,
    /// The index points into a segment file that is no longer there.
    MissingSegment,
    /// The file is shorter than the bytes the log wrote to it: something outside cursorlog
    /// cut it. The bytes from the reported offset on are gone.
    Truncated {
        /// The file's length on disk now (`None` if it could not be read).
        file_len: Option<u64>,
        /// The length the log wrote.
        written: u64,
    },
    /// The stored bytes could not be read back: a media error (`EIO`) or the file system's
    /// own checksum failure. The OS error.
    Unreadable(String),
    /// A cluster member's log ends before the entry it recorded as committed: the disk lost
    /// synced writes. Voting with it could elect a leader that lacks acknowledged entries.
    LostCommitted {
        /// The committed entry recorded in `COMMITTED`.
        committed: u64,
        /// The log's last entry now (`None`: empty).
        last: Option<u64>,
    },
    /// A cluster member's log starts after entry 1 (its oldest segments retired, or it was
    /// installed from a snapshot) but its `BASE` file does not account for the entries
    /// before that point (which its apply refused, the membership), so its state cannot be
    /// rebuilt exactly.
    LogBaseUnknown {
        /// The first entry the log holds.
        first: u64,
        /// The last entry `BASE` accounts for (0: none).
        through: u64,
    },
}

impl std::fmt::Display for CorruptionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Crc { got, expected } => {
                write!(
                    f,
                    "crc mismatch (computed {got:#010x}, stored {expected:#010x})"
                )
            }
            Self::BadMagic => f.write_str("bad magic"),
            Self::UnknownVersion(v) => write!(f, "unknown format version {v}"),
            Self::BadLength(n) => write!(f, "bad frame length {n}"),
            Self::BadBody(why) => write!(f, "undecodable record body: {why}"),
            Self::UnknownRecordType(tag) => write!(
                f,
                "record type {tag} is unknown to this build: the directory was probably \
                 written by a newer cursorlog. Open it with that newer build; nothing was cut"
            ),
            Self::LsnGap { expected, got } => {
                write!(f, "lsn gap (expected {expected}, found {got})")
            }
            Self::EntryGap { expected, got } => {
                write!(f, "entry gap (expected entry {expected}, found {got})")
            }
            Self::TermBackwards { previous, got } => {
                write!(f, "term goes backwards (term {got} after term {previous})")
            }
            Self::MissingSegment => f.write_str("segment file is missing"),
            Self::Truncated {
                file_len: Some(len),
                written,
            } => write!(
                f,
                "file cut short: {len} bytes on disk of the {written} written"
            ),
            Self::Truncated {
                file_len: None,
                written,
            } => write!(f, "file cut short: fewer than the {written} bytes written"),
            Self::Unreadable(why) => write!(f, "stored bytes unreadable: {why}"),
            Self::LostCommitted { committed, last } => write!(
                f,
                "the log ends at entry {} but entry {committed} was committed: the disk lost \
                 synced writes. This member must not vote with it: remove it from the cluster \
                 (`cursorlog cluster remove`), wipe its data directory, start it again and add \
                 it back (`cluster add-learner`, then `cluster promote`)",
                last.map_or_else(|| "none".to_owned(), |l| l.to_string())
            ),
            Self::LogBaseUnknown { first, through } => write!(
                f,
                "the log starts at entry {first} but BASE accounts only for entries up to \
                 {through}: the state cannot be rebuilt exactly. Wipe this member's data \
                 directory and start it again: it catches up from its peers"
            ),
            Self::DamageBeforeValidRecords => f.write_str(
                "damage in bytes a frame says were synced (not a torn unsynced write): \
                 cutting it would drop acknowledged data",
            ),
        }
    }
}

/// Everything the engine can refuse or fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O failure, with what was being done.
    #[error("i/o error while {context}")]
    Io {
        /// What the engine was doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Stored bytes failed a check; names the file and byte offset.
    #[error("corruption in {}: at offset {offset}: {kind}", segment.display())]
    Corruption {
        /// The damaged file.
        segment: PathBuf,
        /// Byte offset of the damaged frame or header.
        offset: u64,
        /// What check failed.
        kind: CorruptionKind,
    },
    /// The derived index failed. It is rebuilt from the log: deleting the `index/`
    /// directory and reopening repairs it (opening does that itself when it cannot read it).
    #[error("index error: {0}")]
    Index(#[source] IndexError),
    /// A previous write or fsync failed; no write is accepted until the engine is reopened.
    #[error("engine is poisoned by an earlier failed write or fsync; restart to recover")]
    Poisoned,
    /// The engine is shutting down or closed.
    #[error("engine is closed")]
    Closed,
    /// Another process holds the data directory.
    #[error("data directory {} is locked by another process", dir.display())]
    Locked {
        /// The data directory.
        dir: PathBuf,
    },
    /// A request argument is invalid; `field` names it.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A request is larger than a configured limit.
    #[error("{what} is {got} which exceeds the limit of {limit}")]
    TooLarge {
        /// What was too large (with its unit).
        what: &'static str,
        /// The size given.
        got: u64,
        /// The configured limit.
        limit: u64,
    },
    /// The session does not exist (or is past its horizon).
    #[error("unknown session")]
    UnknownSession,
    /// The session exists but was expired.
    #[error("session is expired")]
    SessionExpired,
    /// The stream does not exist in this session.
    #[error("unknown stream {0}")]
    UnknownStream(u64),
    /// An operation named an epoch that is not the session's current one.
    #[error("stale epoch {given}: the session's current epoch is {current}")]
    StaleEpoch {
        /// The epoch given.
        given: u64,
        /// The session's current epoch.
        current: u64,
    },
    /// The stream has a terminal tombstone; it accepts no more events.
    #[error("stream {stream} is terminated ({state}) at seq {terminal_seq}")]
    StreamTerminated {
        /// The stream.
        stream: u64,
        /// Its terminal state.
        state: crate::StreamState,
        /// Its terminal seq.
        terminal_seq: u64,
    },
    /// An append's expected next seq does not fit the stream (or a retry carried other events).
    #[error("seq conflict on stream {stream}: expected next seq {expected}, stream head is {head}: {reason}")]
    SeqConflict {
        /// The stream.
        stream: u64,
        /// The expected next seq given by the caller.
        expected: u64,
        /// The stream's current head seq.
        head: u64,
        /// Why the retry could not be matched.
        reason: &'static str,
    },
    /// The requested events lie below the stream's retention watermark.
    #[error("stream {stream}: seq {seq} is evicted (watermark {watermark})")]
    Evicted {
        /// The stream.
        stream: u64,
        /// The first seq asked for.
        seq: u64,
        /// The lowest retained seq.
        watermark: u64,
    },
    /// This engine is a replica's: it applies what the cluster committed and takes no
    /// writes of its own. Send the write to the leader.
    #[error("this node is not the leader{}: send writes to the leader", leader_hint(.leader.as_deref()))]
    NotLeader {
        /// The leader's client address (`host:port`), when this node knows it.
        leader: Option<String>,
    },
    /// A replicated write was not confirmed as planned: the cluster refused the entry (the
    /// state it was planned against changed under a leader change) or its outcome is
    /// unknown (leadership was lost while it was in flight). Retry it; retries are
    /// idempotent (`expected_next_seq` on appends, the session name on opens).
    #[error("the cluster did not confirm this write ({0}); retry it")]
    NotConfirmed(String),
    /// Free space on the data directory's file system is below the configured reserve:
    /// appends are refused (reads, verdicts and retention go on) until space returns.
    #[error("free disk space is {free_bytes} bytes, below the reserve of {reserve_bytes} bytes; appends resume once retention or an operator frees space")]
    DiskFull {
        /// Free bytes at the last check.
        free_bytes: u64,
        /// The configured reserve.
        reserve_bytes: u64,
    },
    /// A hard cap on live state is reached: nothing more of `limit` is created until some
    /// of it ends (sessions expire, leased streams end) or the cap is raised.
    #[error("{limit} are at their limit of {max} ({}); refused until some end", limit.setting())]
    AtCapacity {
        /// Which cap.
        limit: LiveLimit,
        /// The configured cap.
        max: u64,
    },
    /// A bug: an invariant of the engine did not hold. The message says which.
    #[error("internal error: {0}")]
    Internal(String),
    /// The on-disk format of the data directory is newer or older than this build reads.
    #[error("unsupported format in {}: {reason}", path.display())]
    UnsupportedFormat {
        /// The file at fault.
        path: PathBuf,
        /// What is unsupported.
        reason: String,
    },
    /// No task of this id for this owner (never created, another owner's, or deleted).
    #[error("task {task_id:?} not found")]
    UnknownTask {
        /// The task id asked for.
        task_id: String,
    },
    /// The owner has a task of this id, created by another request.
    #[error("task {task_id:?} exists already (created by another request); pick another task id")]
    TaskExists {
        /// The task id asked for.
        task_id: String,
    },
    /// The task has ended; its status never changes again.
    #[error("task {task_id:?} is {status}: a task that ended never changes")]
    TaskTerminated {
        /// The task.
        task_id: String,
        /// The status it ended in (the winner's, when two writers raced to end it).
        status: crate::TaskStatus,
    },
    /// One of the task's queues is full.
    #[error("the queue of task {task_id:?} is full: {queued} {what} (max {max}); dequeue first")]
    TaskQueueFull {
        /// The task.
        task_id: String,
        /// Messages or bytes.
        what: &'static str,
        /// How many it holds with this message.
        queued: u64,
        /// Its bound.
        max: u64,
    },
    /// A compare-and-set on the task's version failed: it changed since the caller read it.
    #[error(
        "task {task_id:?} is at version {version}, not {expected_version}: read it again and retry"
    )]
    TaskConflict {
        /// The task.
        task_id: String,
        /// The version the caller expected.
        expected_version: u64,
        /// The version it is at.
        version: u64,
    },
}

/// A hard cap on live state ([`Error::AtCapacity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LiveLimit {
    /// Live (not expired) sessions: [`crate::Config::live_sessions_max`].
    Sessions,
    /// Open streams with a producer lease: [`crate::Config::leased_streams_max`].
    LeasedStreams,
    /// Tasks of one owner that are not deleted: [`crate::TaskLimits::per_owner_max`].
    TasksPerOwner,
    /// Tasks of all owners that are not deleted: [`crate::TaskLimits::tasks_max`].
    Tasks,
}

impl LiveLimit {
    /// The [`crate::Config`] field that sets the cap.
    pub fn setting(self) -> &'static str {
        match self {
            Self::Sessions => "Config::live_sessions_max",
            Self::LeasedStreams => "Config::leased_streams_max",
            Self::TasksPerOwner => "Config::tasks.per_owner_max",
            Self::Tasks => "Config::tasks.tasks_max",
        }
    }
}

impl std::fmt::Display for LiveLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sessions => "live sessions",
            Self::LeasedStreams => "leased open streams",
            Self::TasksPerOwner => "tasks of this owner",
            Self::Tasks => "tasks",
        })
    }
}

/// A failure of the derived index store, kept opaque: what stores the index is not part of
/// the API (its error stays reachable through `source()` for logs).
#[derive(Debug)]
pub struct IndexError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl IndexError {
    /// An index failure described by `message`.
    pub(crate) fn msg(message: impl Into<String>) -> Self {
        Self(message.into().into())
    }

    /// Wraps the store's own error.
    pub(crate) fn wrap(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(e))
    }
}

impl std::fmt::Display for IndexError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for IndexError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

impl Error {
    /// True for an I/O failure that means the disk (or the user's quota) is full: the
    /// operation can succeed again once space returns.
    pub(crate) fn is_no_space(&self) -> bool {
        matches!(self, Self::Io { source, .. } if matches!(
            source.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        ))
    }

    /// Wraps an I/O error with what the engine was doing.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }

    /// Shorthand for an invalid argument.
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }
}

/// ` (the leader is at ADDR)` for an error message, or nothing when the leader is unknown.
fn leader_hint(leader: Option<&str>) -> String {
    leader
        .map(|l| format!(" (the leader is at {l})"))
        .unwrap_or_default()
}
