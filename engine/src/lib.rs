//! cursorlog-engine: a durable, segmented, append-only log of MCP SSE events, indexed by
//! session epoch and stream id, with terminal tombstones and retention watermarks.
//!
//! The engine answers one question for any front-end replica: *is this `Last-Event-ID`
//! resumable, and if so, what comes after it?* — and when it is not, exactly why
//! ([`Verdict`]).
//!
//! ```
//! use cursorlog_engine::{Append, Config, Engine, NewEvent, OpenStream, Verdict};
//! # fn main() -> Result<(), cursorlog_engine::Error> {
//! let dir = tempfile::tempdir().expect("temp dir");
//! let engine = Engine::open(Config::new(dir.path()))?;
//! let session = engine.open_session("mcp-session-1")?;
//! let stream = engine.open_stream(OpenStream {
//!     session: "mcp-session-1".into(),
//!     epoch: session.epoch,
//!     correlation: Some("req-7".into()),
//!     lease_ms: None,
//! })?;
//! let appended = engine.append(Append {
//!     session: "mcp-session-1".into(),
//!     stream: stream.stream,
//!     expected_next_seq: Some(1),
//!     events: vec![NewEvent::new("progress", b"50%".to_vec())],
//! })?;
//! let cursor = appended.last_cursor().to_string();
//! let resolution = engine.resolve("mcp-session-1", &cursor, Some(stream.stream))?;
//! assert_eq!(resolution.verdict, Verdict::Resumable);
//! engine.close()?;
//! # Ok(()) }
//! ```

mod activity;
mod admission;
mod api;
mod apply;
mod background;
mod clock;
mod codec;
mod config;
mod cursor;
mod engine;
mod entry_log;
mod error;
mod followers;
mod format;
mod fs;
mod index;
mod leases;
mod log;
mod lost;
mod mailbox;
mod member;
mod propose;
mod read;
mod record;
mod recovery;
mod retention;
mod shared;
mod state;
mod task;
mod task_watch;
mod validate;
mod verdict;
mod verify;
mod writer;

pub use api::ReadPosition;
pub use api::{
    Append, Appended, BatchWrite, BatchWritten, EpochAdvanced, Event, NewEvent, OpenStream,
    Outcome, ReadBatch, SessionExpired, SessionInfo, SessionView, Stats, StreamInfo, Terminated,
};
pub use api::{
    CancelMode, CreatedTask, InputAnswered, NewTask, TaskCancel, TaskCancelled, TaskChange,
    TaskDequeue, TaskDequeued, TaskEnqueue, TaskEnqueued, TaskFinish, TaskInputAnswer,
    TaskInputRequest, TaskPage, TaskRef, TaskVerdict, TaskView, TaskWritten,
};
pub use api::{TaskRoute, TaskRouted};
/// The payload type of [`Event`], re-exported so callers need not depend on `bytes` themselves.
pub use bytes::Bytes;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{Config, Retention, SyncPolicy, TaskLimits};
pub use cursor::{Cursor, CursorError};
pub use engine::{Applied, Progress};
pub use engine::{Engine, WeakEngine, TASK_PAGE_DEFAULT, TASK_PAGE_MAX};
pub use entry_log::{
    EntryId, EntryLog, EntryLogConfig, EntryLogState, EntryPayload, LogEntry, Proposal,
    ProposalError, ProposedRecord,
};
pub use entry_log::{LogSnapshot, SnapshotFile, SnapshotManifest, SnapshotStaging, StagedFile};
pub use error::LiveLimit;
pub use error::{CorruptionKind, Error, IndexError, Result};
pub use format::{BOOT_ID_BYTES, FORMAT_VERSION};
#[cfg(feature = "testing")]
pub use fs::{Fault, FaultyFs, Tear, SECTOR_BYTES};
pub use fs::{FileSystem, SegmentFile, StdFs};
pub use propose::{Proposed, Proposer, Settle};
pub use read::Follower;
pub use recovery::RecoveryReport;
pub use state::{SessionMeta, StreamMeta, StreamState};
pub use task::{
    may_move, EndCause, InputSlot, OutcomeKind, QueuedMessage, SlotState, TaskMeta, TaskOutcome,
    TaskRemoval, TaskStatus, INBOUND, OUTBOUND,
};
pub use task_watch::TaskWatch;
pub use verdict::{Facts, Resolution, Verdict};
pub use verify::{
    repair_dir, repair_dir_with, verify_dir, verify_dir_with, RepairReport, SegmentReport,
    VerifyReport,
};
