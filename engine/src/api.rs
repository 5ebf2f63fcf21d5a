//! Request and response values of the engine's domain API.

use std::sync::Arc;

use bytes::Bytes;

use crate::cursor::Cursor;
use crate::record::EventBody;
use crate::state::StreamState;

mod task;
pub use task::{
    CancelMode, CreatedTask, InputAnswered, NewTask, TaskCancel, TaskCancelled, TaskChange,
    TaskDequeue, TaskDequeued, TaskEnqueue, TaskEnqueued, TaskFinish, TaskInputAnswer,
    TaskInputRequest, TaskPage, TaskRef, TaskVerdict, TaskView, TaskWritten,
};
pub use task::{TaskRoute, TaskRouted};

/// An event as handed in by a producer; cursorlog assigns its seq and time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Application-defined kind (e.g. "progress", "result"); at most `id_bytes_max` bytes.
    pub kind: String,
    /// JSON-RPC request id this event relates to, if any.
    pub correlation: Option<String>,
    /// The SSE frame payload, opaque to cursorlog; at most `payload_bytes_max` bytes.
    pub payload: Vec<u8>,
}

impl NewEvent {
    /// An event with a kind and payload and no correlation id.
    pub fn new(kind: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            kind: kind.into(),
            correlation: None,
            payload: payload.into(),
        }
    }
}

/// A stored event.
///
/// Reads share rather than copy: `payload` is a slice of the sealed segment's map (or of
/// the read's 256 KiB buffer for the active segment), and events of one read with the same
/// kind share one `kind` string. Holding an event keeps that map or buffer alive — and a
/// retired segment's disk space in use until its last event is dropped — so copy the
/// payload (`Bytes::copy_from_slice`) to keep it for long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its stream.
    pub stream: u64,
    /// Its seq within the stream (1-based).
    pub seq: u64,
    /// Application-defined kind.
    pub kind: Arc<str>,
    /// JSON-RPC request id, if any.
    pub correlation: Option<String>,
    /// The payload bytes, exactly as appended.
    pub payload: Bytes,
    /// When it was appended, ms since the Unix epoch.
    pub appended_at_ms: u64,
}

impl Event {
    /// The event a decoded body carries, copied out of it (terminal frames).
    pub(crate) fn from_body(b: EventBody) -> Self {
        Self {
            stream: b.stream,
            seq: b.seq,
            kind: b.kind.into(),
            correlation: b.correlation,
            payload: b.payload.into(),
            appended_at_ms: b.at_ms,
        }
    }
}

/// Result of opening (or re-opening) a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Session id.
    pub session: String,
    /// Its current epoch (1 for a new session).
    pub epoch: u64,
    /// True when this call created it.
    pub created: bool,
    /// The session's opaque state (empty when it has none).
    pub state: Vec<u8>,
}

/// What a replica needs to restore a session it did not create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionView {
    /// Session id.
    pub session: String,
    /// Its current epoch.
    pub epoch: u64,
    /// When it was opened, ms since the Unix epoch.
    pub opened_at_ms: u64,
    /// True once expired (explicitly or after its idle TTL); remembered until the horizon.
    pub expired: bool,
    /// The session's opaque state (empty when it has none).
    pub state: Vec<u8>,
}

/// Result of advancing a session's epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochAdvanced {
    /// The new current epoch.
    pub epoch: u64,
    /// Streams of older epochs that were open and are now `Superseded`.
    pub superseded: Vec<u64>,
}

/// Result of expiring a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionExpired {
    /// Streams that were open and are now `Aborted`.
    pub aborted: Vec<u64>,
}

/// A request to open a stream in a session's current epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenStream {
    /// Owning session.
    pub session: String,
    /// The epoch the producer believes is current; a stale one is refused.
    pub epoch: u64,
    /// JSON-RPC request id the stream answers; makes the outcome addressable.
    pub correlation: Option<String>,
    /// Producer lease in ms: the stream is aborted if not renewed within it.
    pub lease_ms: Option<u64>,
}

/// An opened stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamInfo {
    /// The new, globally unique stream id.
    pub stream: u64,
    /// Its epoch.
    pub epoch: u64,
}

/// A batch append to a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Append {
    /// Owning session (checked).
    pub session: String,
    /// The stream.
    pub stream: u64,
    /// The seq the first event must get. With it, a retry of an already-written batch returns
    /// the same seqs; without it, the batch is always appended.
    pub expected_next_seq: Option<u64>,
    /// The events, in order.
    pub events: Vec<NewEvent>,
}

/// Where an append landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Stream epoch (for building cursors).
    pub epoch: u64,
    /// The stream.
    pub stream: u64,
    /// Seq of the first event of the batch.
    pub first_seq: u64,
    /// Seq of the last event of the batch.
    pub last_seq: u64,
    /// True when this was a retry of a batch already in the log (nothing written).
    pub duplicate: bool,
}

impl Appended {
    /// The cursor (event id) of the batch's last event.
    pub fn last_cursor(&self) -> Cursor {
        Cursor::new(self.epoch, self.stream, self.last_seq)
    }
}

/// A terminal tombstone written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminated {
    /// The stream.
    pub stream: u64,
    /// The terminal state.
    pub state: StreamState,
    /// The terminal seq (the terminal frame's seq, or the head when there is none).
    pub terminal_seq: u64,
    /// Event id of the terminal seq.
    pub cursor: Cursor,
    /// True when this was a retry of the completion already in the log (same expected seq
    /// and terminal frame) and nothing was written.
    pub duplicate: bool,
}

/// One write of [`crate::Engine::write_batch_async`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchWrite {
    /// An append, as [`crate::Engine::append`].
    Append(Append),
    /// A new stream, as [`crate::Engine::open_stream`].
    Open(OpenStream),
    /// A completion, as [`crate::Engine::complete`].
    Complete {
        /// Owning session.
        session: String,
        /// The stream.
        stream: u64,
        /// The seq the terminal frame must get (a retry is recognised).
        expected_next_seq: Option<u64>,
        /// The terminal frame.
        terminal: NewEvent,
    },
}

/// The answer to one [`BatchWrite`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchWritten {
    /// The append was written (or recognised as a retry).
    Appended(Appended),
    /// The completion was written (or recognised as a retry).
    Completed(Terminated),
    /// The stream was opened.
    Opened(StreamInfo),
}

/// One bounded read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBatch {
    /// Events strictly after the requested seq, in order, gap-free.
    pub events: Vec<Event>,
    /// The stream's head when read.
    pub head: u64,
    /// The stream's state when read.
    pub state: StreamState,
    /// True when the batch reaches the terminal seq: nothing more will ever follow.
    pub end_of_stream: bool,
    /// Where the read stopped, if inside a run of the stream's frames: give it to the next
    /// read after the batch's last event ([`crate::Engine::read_from`]) to start there.
    pub next: Option<ReadPosition>,
}

/// Where a read of a stream stopped: the next event's seq, its frame when the read stopped
/// inside a run of the stream's frames, and the size of the last frame read. Handed to the
/// next read of the same stream after the same event ([`crate::Engine::read_from`]), that read
/// starts at the frame instead of walking the run from its start (the index knows run starts
/// only), so a replay in many bounded reads reads each frame once, and it reads windows sized
/// for the events it wants rather than whole read-ahead windows. Only a hint: the frame is
/// checked (length, CRC, decode, stream and seq) as any other, and a position that no longer
/// holds the event (its segment retired, say) sends the read through the index as if there
/// were none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPosition {
    pub(crate) stream: u64,
    /// The seq of the next event.
    pub(crate) seq: u64,
    /// Its frame, when it is the next one in the run the read stopped in.
    pub(crate) place: Option<FramePlace>,
    /// The length of the last frame read.
    pub(crate) frame_len: u64,
}

/// Where an event's frame is, in a run of its stream's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FramePlace {
    pub(crate) segment: u64,
    pub(crate) offset: u64,
    /// The seq of the next run start after this one (`u64::MAX` when unknown).
    pub(crate) run_end: u64,
}

/// The terminal outcome of a stream, addressable by (session, correlation id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The stream answering the correlation id.
    pub stream: u64,
    /// Its epoch.
    pub epoch: u64,
    /// Its state (`Open` while the call is still running).
    pub state: StreamState,
    /// The terminal seq, once terminal.
    pub terminal_seq: Option<u64>,
    /// The terminal frame, when the stream ended with one.
    pub frame: Option<Event>,
    /// Why it ended.
    pub reason: Option<String>,
}

/// Counters and sizes, for the stats RPC and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Sessions remembered.
    pub sessions: u64,
    /// Streams remembered.
    pub streams: u64,
    /// Segment files.
    pub segments: u64,
    /// Bytes in all segments.
    pub log_bytes: u64,
    /// Highest LSN written.
    pub last_lsn: u64,
    /// Events appended since open.
    pub events_appended: u64,
    /// Payload bytes appended since open.
    pub payload_bytes_appended: u64,
    /// fdatasync calls on the write path since open.
    pub fsyncs: u64,
    /// Group commits since open.
    pub commit_batches: u64,
    /// Records written since open.
    pub records_written: u64,
    /// Segments deleted by retention since open.
    pub segments_deleted: u64,
    /// Microseconds recovery took at open.
    pub recovery_micros: u64,
    /// Records the index had applied that the log no longer held at open (see
    /// [`crate::RecoveryReport::lost_records`]): acknowledged data lost under `sync=always`.
    pub recovery_lost_records: u64,
    /// Streams ended at open because events acknowledged in them may be lost.
    pub recovery_streams_fenced: u64,
    /// Sessions moved to a new epoch at open because a stream or epoch of theirs was lost.
    pub recovery_sessions_fenced: u64,
    /// Index flushes that failed since open (nothing was lost: the log holds it all; writes
    /// were refused until a flush succeeded).
    pub index_flush_failures: u64,
    /// Sessions not expired.
    pub live_sessions: u64,
    /// Streams in state `Open`.
    pub open_streams: u64,
    /// True once a failed write or fsync made the engine refuse every write.
    pub poisoned: bool,
    /// Free bytes on the data directory's file system at the last check (`None` before the
    /// first check).
    pub disk_free_bytes: Option<u64>,
    /// Appends refused because free space was below the reserve, since open.
    pub appends_refused_low_disk: u64,
    /// Sessions expired after their idle TTL, since open.
    pub sessions_expired_idle: u64,
    /// Segment files holding an open descriptor (the active one; sealed ones hold none).
    pub segment_descriptors: u64,
    /// Streams with at least one live follower.
    pub followed_streams: u64,
    /// Bytes of requests in the writer's queue (and its current group).
    pub writer_queue_bytes: u64,
    /// The cap on live sessions (`Config::live_sessions_max`).
    pub live_sessions_max: u64,
    /// New sessions refused because `live_sessions_max` were live, since open.
    pub sessions_refused_at_capacity: u64,
    /// Open streams holding a producer lease.
    pub leased_streams: u64,
    /// The cap on them (`Config::leased_streams_max`).
    pub leased_streams_max: u64,
    /// Leased streams refused because `leased_streams_max` were open, since open.
    pub leases_refused_at_capacity: u64,
}
