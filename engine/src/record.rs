//! Records (one per state change) and their CRC32 frames. Pure: no I/O.
//!
//! A frame is a [`FrameHeader`] followed by the bincode body of one record. Records written
//! together for one request form an atomic *group*: each frame says how many records of its
//! group follow it, and recovery never keeps a partial group.

use bincode::{Decode, Encode};

use crate::codec;
use crate::format::{FrameHeader, BODY_BYTES_MAX, FRAME_HEADER_BYTES};
use crate::state::{SessionMeta, StreamMeta, StreamState};

mod task;
mod wire;

pub(crate) use task::{
    decode_message, decode_queue_state, decode_slot, decode_task, encode_message,
    encode_queue_state, encode_slot, encode_task, QueueSnapshot, TaskCancelRequested, TaskCreated,
    TaskDeleted, TaskDequeued, TaskEnded, TaskForgotten, TaskInputAnswered, TaskInputRequested,
    TaskQueued, TaskSnapshot, TaskUpdated,
};
pub(crate) use task::{RouteEntry, TaskRoutes};

pub(crate) use wire::wire_codec;
pub(crate) use wire::{decode_session, decode_stream, encode_session, encode_stream};

/// Record type tags (the frame's `record_type` byte). Never reuse a retired tag.
pub(crate) mod tag {
    pub const SESSION_OPENED: u8 = 1;
    pub const EPOCH_ADVANCED: u8 = 2;
    pub const SESSION_EXPIRED: u8 = 3;
    pub const STREAM_OPENED: u8 = 4;
    pub const EVENT: u8 = 5;
    pub const TERMINAL: u8 = 6;
    pub const TRIM: u8 = 7;
    pub const SESSION_SNAPSHOT: u8 = 8;
    pub const STREAM_SNAPSHOT: u8 = 9;
    pub const STREAM_FORGOTTEN: u8 = 10;
    pub const SESSION_FORGOTTEN: u8 = 11;
    pub const SESSION_STATE: u8 = 12;
    pub const SHUTDOWN: u8 = 13;
    pub const BLANK: u8 = 14;
    pub const MEMBERSHIP: u8 = 15;
    pub const TASK_CREATED: u8 = 16;
    pub const TASK_UPDATED: u8 = 17;
    pub const TASK_INPUT_REQUESTED: u8 = 18;
    pub const TASK_INPUT_ANSWERED: u8 = 19;
    pub const TASK_CANCEL_REQUESTED: u8 = 20;
    pub const TASK_ENDED: u8 = 21;
    pub const TASK_QUEUED: u8 = 22;
    pub const TASK_DEQUEUED: u8 = 23;
    pub const TASK_DELETED: u8 = 24;
    pub const TASK_SNAPSHOT: u8 = 25;
    pub const TASK_FORGOTTEN: u8 = 26;
    pub const TASK_ROUTES: u8 = 27;

    /// Whether this build knows the record type.
    pub(crate) fn is_known(tag: u8) -> bool {
        (SESSION_OPENED..=TASK_ROUTES).contains(&tag)
    }
}

/// An event's stored fields (also the terminal frame inside [`Terminal`]).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct EventBody {
    pub stream: u64,
    pub seq: u64,
    pub at_ms: u64,
    pub kind: String,
    pub correlation: Option<String>,
    pub payload: Vec<u8>,
}

/// A terminal tombstone: the stream enters `state` at `terminal_seq`, never to change again.
/// With a `frame`, the frame is the event at `terminal_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Terminal {
    pub stream: u64,
    pub state: StreamState,
    pub terminal_seq: u64,
    pub at_ms: u64,
    pub reason: Option<String>,
    pub frame: Option<EventBody>,
}

wire_codec!(
    Terminal,
    |t, e| {
        t.stream.encode(e)?;
        wire::encode_state(t.state, e)?;
        t.terminal_seq.encode(e)?;
        t.at_ms.encode(e)?;
        t.reason.encode(e)?;
        t.frame.encode(e)
    },
    |d| Ok(Terminal {
        stream: u64::decode(d)?,
        state: wire::decode_state(d)?,
        terminal_seq: u64::decode(d)?,
        at_ms: u64::decode(d)?,
        reason: Option::<String>::decode(d)?,
        frame: Option::<EventBody>::decode(d)?,
    })
);

/// [`SessionMeta`] as a record body (its private encoding).
struct SessionSnapshotBody(SessionMeta);

wire_codec!(SessionSnapshotBody, |s, e| encode_session(&s.0, e), |d| Ok(
    SessionSnapshotBody(decode_session(d)?)
));

/// Every state change cursorlog makes is one of these, in the log first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    SessionOpened {
        session: String,
        epoch: u64,
        at_ms: u64,
    },
    EpochAdvanced {
        session: String,
        epoch: u64,
        at_ms: u64,
    },
    SessionExpired {
        session: String,
        at_ms: u64,
    },
    StreamOpened(StreamOpened),
    Event(EventBody),
    Terminal(Terminal),
    /// Raises a stream's retention watermark (explicit trim or retention).
    Trim {
        stream: u64,
        watermark: u64,
        at_ms: u64,
    },
    /// Carries a session's state forward before the segment that created it is deleted.
    SessionSnapshot(SessionMeta),
    /// Carries a stream's state (and terminal frame) forward likewise.
    StreamSnapshot(StreamSnapshot),
    /// A terminated stream past the metadata horizon is forgotten: every index entry of it
    /// goes, and cursors into it become `UNKNOWN_CURSOR`.
    StreamForgotten {
        stream: u64,
        at_ms: u64,
    },
    /// An expired session past the metadata horizon is forgotten.
    SessionForgotten {
        session: String,
        at_ms: u64,
    },
    /// Replaces a session's opaque state (the front-end's, e.g. MCP `initialize` parameters).
    SessionState(SessionStateBody),
    /// The last record of a clean shutdown in format versions 1 and 2 (version 3 writes the
    /// `CLEAN` file instead, which takes no LSN): read, never written. Changes no state; a
    /// log that ends in it closed cleanly.
    Shutdown {
        at_ms: u64,
    },
    /// A replicated log's entry with no records of its own (a new Raft leader's first
    /// entry). Changes no state.
    Blank,
    /// A replicated log's membership change: the cluster configuration, opaque to the
    /// engine (the replication layer encodes it). Changes no engine state.
    Membership {
        config: Vec<u8>,
    },
    /// A task was created; its id is this record's LSN.
    TaskCreated(TaskCreated),
    /// A running task's status, message or timing changed.
    TaskUpdated(TaskUpdated),
    /// A task asks for input.
    TaskInputRequested(TaskInputRequested),
    /// A task's input requests were answered.
    TaskInputAnswered(TaskInputAnswered),
    /// A client asked to cancel a running task.
    TaskCancelRequested(TaskCancelRequested),
    /// A task ended, with its outcome.
    TaskEnded(TaskEnded),
    /// A message was enqueued on a task's queue.
    TaskQueued(TaskQueued),
    /// Messages were dequeued from a task's queue.
    TaskDequeued(TaskDequeued),
    /// A task's content was deleted; its tombstone stays.
    TaskDeleted(TaskDeleted),
    /// Carries a task's state forward before the segment that created it is retired.
    TaskSnapshot(TaskSnapshot),
    /// A deleted task past the metadata horizon is forgotten.
    TaskForgotten(TaskForgotten),
    /// Carries a task's inbound routes forward, beside its snapshot.
    TaskRoutes(TaskRoutes),
}

/// A session's opaque state, as set by the front-end.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct SessionStateBody {
    pub session: String,
    pub state: Vec<u8>,
    pub at_ms: u64,
}

/// A stream was opened.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct StreamOpened {
    pub stream: u64,
    pub session: String,
    pub epoch: u64,
    pub correlation: Option<String>,
    pub lease_ms: Option<u64>,
    pub at_ms: u64,
}

/// A stream's whole state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamSnapshot {
    pub meta: StreamMeta,
    pub terminal_frame: Option<EventBody>,
}

wire_codec!(
    StreamSnapshot,
    |s, e| {
        encode_stream(&s.meta, e)?;
        s.terminal_frame.encode(e)
    },
    |d| Ok(StreamSnapshot {
        meta: decode_stream(d)?,
        terminal_frame: Option::<EventBody>::decode(d)?,
    })
);

#[derive(Encode, Decode)]
struct SessionEpoch {
    session: String,
    epoch: u64,
    at_ms: u64,
}

#[derive(Encode, Decode)]
struct SessionAt {
    session: String,
    at_ms: u64,
}

#[derive(Encode, Decode)]
struct TrimBody {
    stream: u64,
    watermark: u64,
    at_ms: u64,
}

impl Record {
    /// The frame's record type tag.
    pub(crate) fn tag(&self) -> u8 {
        match self {
            Self::SessionOpened { .. } => tag::SESSION_OPENED,
            Self::EpochAdvanced { .. } => tag::EPOCH_ADVANCED,
            Self::SessionExpired { .. } => tag::SESSION_EXPIRED,
            Self::StreamOpened(_) => tag::STREAM_OPENED,
            Self::Event(_) => tag::EVENT,
            Self::Terminal(_) => tag::TERMINAL,
            Self::Trim { .. } => tag::TRIM,
            Self::SessionSnapshot(_) => tag::SESSION_SNAPSHOT,
            Self::StreamSnapshot(_) => tag::STREAM_SNAPSHOT,
            Self::StreamForgotten { .. } => tag::STREAM_FORGOTTEN,
            Self::SessionForgotten { .. } => tag::SESSION_FORGOTTEN,
            Self::SessionState(_) => tag::SESSION_STATE,
            Self::Shutdown { .. } => tag::SHUTDOWN,
            Self::Blank => tag::BLANK,
            Self::Membership { .. } => tag::MEMBERSHIP,
            Self::TaskCreated(_) => tag::TASK_CREATED,
            Self::TaskUpdated(_) => tag::TASK_UPDATED,
            Self::TaskInputRequested(_) => tag::TASK_INPUT_REQUESTED,
            Self::TaskInputAnswered(_) => tag::TASK_INPUT_ANSWERED,
            Self::TaskCancelRequested(_) => tag::TASK_CANCEL_REQUESTED,
            Self::TaskEnded(_) => tag::TASK_ENDED,
            Self::TaskQueued(_) => tag::TASK_QUEUED,
            Self::TaskDequeued(_) => tag::TASK_DEQUEUED,
            Self::TaskDeleted(_) => tag::TASK_DELETED,
            Self::TaskSnapshot(_) => tag::TASK_SNAPSHOT,
            Self::TaskForgotten(_) => tag::TASK_FORGOTTEN,
            Self::TaskRoutes(_) => tag::TASK_ROUTES,
        }
    }

    fn encode_body(&self, out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            Self::SessionOpened {
                session,
                epoch,
                at_ms,
            }
            | Self::EpochAdvanced {
                session,
                epoch,
                at_ms,
            } => codec::encode_into(
                &SessionEpoch {
                    session: session.clone(),
                    epoch: *epoch,
                    at_ms: *at_ms,
                },
                out,
            ),
            Self::SessionExpired { session, at_ms } => codec::encode_into(
                &SessionAt {
                    session: session.clone(),
                    at_ms: *at_ms,
                },
                out,
            ),
            Self::StreamOpened(b) => codec::encode_into(b, out),
            Self::Event(b) => {
                encode_event_body(b, out);
                Ok(())
            }
            Self::Terminal(b) => codec::encode_into(b, out),
            Self::Trim {
                stream,
                watermark,
                at_ms,
            } => codec::encode_into(
                &TrimBody {
                    stream: *stream,
                    watermark: *watermark,
                    at_ms: *at_ms,
                },
                out,
            ),
            Self::SessionSnapshot(b) => codec::encode_into(&SessionSnapshotBody(b.clone()), out),
            Self::StreamSnapshot(b) => codec::encode_into(b, out),
            Self::StreamForgotten { stream, at_ms } => codec::encode_into(
                &TrimBody {
                    stream: *stream,
                    watermark: 0,
                    at_ms: *at_ms,
                },
                out,
            ),
            Self::SessionForgotten { session, at_ms } => codec::encode_into(
                &SessionAt {
                    session: session.clone(),
                    at_ms: *at_ms,
                },
                out,
            ),
            Self::SessionState(b) => codec::encode_into(b, out),
            Self::Shutdown { at_ms } => codec::encode_into(at_ms, out),
            Self::Blank => Ok(()),
            Self::Membership { config } => {
                out.extend_from_slice(config);
                Ok(())
            }
            Self::TaskCreated(b) => codec::encode_into(b, out),
            Self::TaskUpdated(b) => codec::encode_into(b, out),
            Self::TaskInputRequested(b) => codec::encode_into(b, out),
            Self::TaskInputAnswered(b) => codec::encode_into(b, out),
            Self::TaskCancelRequested(b) => codec::encode_into(b, out),
            Self::TaskEnded(b) => codec::encode_into(b, out),
            Self::TaskQueued(b) => codec::encode_into(b, out),
            Self::TaskDequeued(b) => codec::encode_into(b, out),
            Self::TaskDeleted(b) => codec::encode_into(b, out),
            Self::TaskSnapshot(b) => codec::encode_into(b, out),
            Self::TaskForgotten(b) => codec::encode_into(b, out),
            Self::TaskRoutes(b) => codec::encode_into(b, out),
        }
    }

    /// The bell this record rings once committed (followers of it wake up): the stream or
    /// task whose state it changes, if it is about one. Task ids and stream ids are both
    /// LSNs, so they never collide.
    pub(crate) fn bell_id(&self) -> Option<u64> {
        match self {
            Self::Event(e) => Some(e.stream),
            Self::Terminal(t) => Some(t.stream),
            Self::Trim { stream, .. } | Self::StreamForgotten { stream, .. } => Some(*stream),
            Self::StreamOpened(o) => Some(o.stream),
            Self::StreamSnapshot(s) => Some(s.meta.id),
            Self::TaskCreated(t) => Some(t.id),
            Self::TaskUpdated(t) => Some(t.id),
            Self::TaskInputRequested(t) => Some(t.id),
            Self::TaskInputAnswered(t) => Some(t.id),
            Self::TaskCancelRequested(t) => Some(t.id),
            Self::TaskEnded(t) => Some(t.id),
            Self::TaskQueued(t) => Some(t.id),
            Self::TaskDequeued(t) => Some(t.id),
            Self::TaskDeleted(t) => Some(t.id),
            Self::TaskSnapshot(t) => Some(t.meta.id),
            Self::TaskForgotten(t) => Some(t.id),
            Self::TaskRoutes(t) => Some(t.id),
            _ => None,
        }
    }

    /// The (stream, seq) of the event this record carries, if it carries one.
    pub(crate) fn event_id(&self) -> Option<(u64, u64)> {
        match self {
            Self::Event(e) => Some((e.stream, e.seq)),
            Self::Terminal(t) if t.frame.is_some() => Some((t.stream, t.terminal_seq)),
            _ => None,
        }
    }

    /// True when this record's event directly follows `prev`'s event of the same stream,
    /// `prev` being the record just before it in the same group (so the frames are adjacent
    /// in one segment). Such an event needs no index entry of its own: see FORMAT.md, runs.
    pub(crate) fn continues_run(&self, prev: Option<&Self>) -> bool {
        match (prev.and_then(Self::event_id), self.event_id()) {
            (Some((ps, pq)), Some((s, q))) => ps == s && pq.checked_add(1) == Some(q),
            _ => false,
        }
    }

    /// Decodes a body of type `tag`.
    pub(crate) fn decode(tag: u8, body: &[u8]) -> Result<Self, String> {
        Ok(match tag {
            tag::SESSION_OPENED | tag::EPOCH_ADVANCED => {
                let b: SessionEpoch = codec::decode(body)?;
                let (session, epoch, at_ms) = (b.session, b.epoch, b.at_ms);
                if tag == tag::SESSION_OPENED {
                    Self::SessionOpened {
                        session,
                        epoch,
                        at_ms,
                    }
                } else {
                    Self::EpochAdvanced {
                        session,
                        epoch,
                        at_ms,
                    }
                }
            }
            tag::SESSION_EXPIRED => {
                let b: SessionAt = codec::decode(body)?;
                Self::SessionExpired {
                    session: b.session,
                    at_ms: b.at_ms,
                }
            }
            tag::STREAM_OPENED => Self::StreamOpened(codec::decode(body)?),
            tag::EVENT => Self::Event(decode_event_body(body)?),
            tag::TERMINAL => Self::Terminal(codec::decode(body)?),
            tag::TRIM => {
                let b: TrimBody = codec::decode(body)?;
                Self::Trim {
                    stream: b.stream,
                    watermark: b.watermark,
                    at_ms: b.at_ms,
                }
            }
            tag::SESSION_SNAPSHOT => {
                Self::SessionSnapshot(codec::decode::<SessionSnapshotBody>(body)?.0)
            }
            tag::STREAM_SNAPSHOT => Self::StreamSnapshot(codec::decode(body)?),
            tag::STREAM_FORGOTTEN => {
                let b: TrimBody = codec::decode(body)?;
                Self::StreamForgotten {
                    stream: b.stream,
                    at_ms: b.at_ms,
                }
            }
            tag::SESSION_FORGOTTEN => {
                let b: SessionAt = codec::decode(body)?;
                Self::SessionForgotten {
                    session: b.session,
                    at_ms: b.at_ms,
                }
            }
            tag::SESSION_STATE => Self::SessionState(codec::decode(body)?),
            tag::SHUTDOWN => Self::Shutdown {
                at_ms: codec::decode(body)?,
            },
            tag::BLANK if body.is_empty() => Self::Blank,
            tag::BLANK => return Err(format!("a blank entry with a {}-byte body", body.len())),
            tag::MEMBERSHIP => Self::Membership {
                config: body.to_vec(),
            },
            tag::TASK_CREATED => Self::TaskCreated(codec::decode(body)?),
            tag::TASK_UPDATED => Self::TaskUpdated(codec::decode(body)?),
            tag::TASK_INPUT_REQUESTED => Self::TaskInputRequested(codec::decode(body)?),
            tag::TASK_INPUT_ANSWERED => Self::TaskInputAnswered(codec::decode(body)?),
            tag::TASK_CANCEL_REQUESTED => Self::TaskCancelRequested(codec::decode(body)?),
            tag::TASK_ENDED => Self::TaskEnded(codec::decode(body)?),
            tag::TASK_QUEUED => Self::TaskQueued(codec::decode(body)?),
            tag::TASK_DEQUEUED => Self::TaskDequeued(codec::decode(body)?),
            tag::TASK_DELETED => Self::TaskDeleted(codec::decode(body)?),
            tag::TASK_SNAPSHOT => Self::TaskSnapshot(codec::decode(body)?),
            tag::TASK_FORGOTTEN => Self::TaskForgotten(codec::decode(body)?),
            tag::TASK_ROUTES => Self::TaskRoutes(codec::decode(body)?),
            other => return Err(format!("unknown record type {other}")),
        })
    }
}

/// Decodes an [`EventBody`] (the body of an `Event` record) exactly as [`codec::decode`]
/// does — same layout, same accept/reject decision (UTF-8 strings, option tags 0/1, no
/// trailing bytes) — but straight from the slice: the read path's per-event decode. Only the
/// error texts differ from bincode's. A proptest checks the two agree on arbitrary bytes.
///
/// # Errors
/// The body is not an event body.
pub(crate) fn decode_event_body(body: &[u8]) -> Result<EventBody, String> {
    let v = decode_event_view(body)?;
    Ok(EventBody {
        stream: v.stream,
        seq: v.seq,
        at_ms: v.at_ms,
        kind: v.kind.to_owned(),
        correlation: v.correlation.map(str::to_owned),
        payload: v.payload.to_vec(),
    })
}

/// Appends the body of an `Event` record exactly as [`codec::encode_into`] does (the layout
/// [`decode_event_view`] reads), without going through bincode: the write path's per-event
/// encode. A proptest checks the two agree.
pub(crate) fn encode_event_body(e: &EventBody, out: &mut Vec<u8>) {
    let correlation = e.correlation.as_deref();
    out.reserve(
        3 * 8 + 8 + e.kind.len() + 1 + correlation.map_or(0, |c| 8 + c.len()) + 8 + e.payload.len(),
    );
    out.extend_from_slice(&e.stream.to_le_bytes());
    out.extend_from_slice(&e.seq.to_le_bytes());
    out.extend_from_slice(&e.at_ms.to_le_bytes());
    put_bytes(out, e.kind.as_bytes());
    match correlation {
        None => out.push(0),
        Some(c) => {
            out.push(1);
            put_bytes(out, c.as_bytes());
        }
    }
    put_bytes(out, &e.payload);
}

/// A `u64` length, then the bytes (bincode's fixed-int layout of a string or `Vec<u8>`).
fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// An event body decoded in place: its strings and payload borrow the frame's bytes, so the
/// read path can share them (payload slices of a segment's map) instead of copying them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventView<'a> {
    pub stream: u64,
    pub seq: u64,
    pub at_ms: u64,
    pub kind: &'a str,
    pub correlation: Option<&'a str>,
    pub payload: &'a [u8],
}

/// [`decode_event_body`] without the copies: the same checks, the parts borrowed.
///
/// # Errors
/// The body is not an event body.
pub(crate) fn decode_event_view(body: &[u8]) -> Result<EventView<'_>, String> {
    let mut r = SliceReader(body);
    let stream = r.u64()?;
    let seq = r.u64()?;
    let at_ms = r.u64()?;
    let kind = r.str()?;
    let correlation = match r.u8()? {
        0 => None,
        1 => Some(r.str()?),
        t => return Err(format!("invalid option tag {t} for the correlation id")),
    };
    let payload = r.bytes()?;
    if !r.0.is_empty() {
        return Err(format!(
            "{} trailing bytes after the record body",
            r.0.len()
        ));
    }
    Ok(EventView {
        stream,
        seq,
        at_ms,
        kind,
        correlation,
        payload,
    })
}

/// A cursor over a record body in the codec's fixed-width little-endian layout.
struct SliceReader<'a>(&'a [u8]);

impl<'a> SliceReader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(format!(
                "body ends early: {n} bytes needed, {} left",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A `u64` length, then that many bytes.
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.u64()?;
        let len = usize::try_from(len).map_err(|_| format!("length {len} out of range"))?;
        self.take(len)
    }

    fn str(&mut self) -> Result<&'a str, String> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|e| format!("invalid UTF-8 in a string: {e}"))
    }
}

/// The frame header fields a writer decides (the rest come from the record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameStamp {
    /// The record's LSN.
    pub lsn: u64,
    /// The log entry (atomic group) it belongs to.
    pub entry: u64,
    /// That entry's term.
    pub term: u64,
    /// Records that follow it in its group.
    pub group_left: u32,
    /// The segment offset below which everything was durable when it was written.
    pub synced_through: u64,
}

/// Appends one frame for `record` to `out` and returns the frame's length in bytes.
///
/// # Errors
/// The body is larger than [`BODY_BYTES_MAX`] (callers check payload limits first, so this
/// is a bug guard) or cannot be encoded.
pub(crate) fn encode_frame(
    record: &Record,
    stamp: FrameStamp,
    out: &mut Vec<u8>,
) -> Result<u32, String> {
    let start = out.len();
    out.resize(start + FRAME_HEADER_BYTES, 0);
    record.encode_body(out)?;
    let body_len = out.len() - start - FRAME_HEADER_BYTES;
    let body_len = u32::try_from(body_len)
        .ok()
        .filter(|n| *n <= BODY_BYTES_MAX)
        .ok_or_else(|| format!("record body of {body_len} bytes exceeds {BODY_BYTES_MAX}"))?;
    let header = FrameHeader {
        body_len,
        crc: 0,
        lsn: stamp.lsn,
        synced_through: stamp.synced_through,
        entry: stamp.entry,
        term: stamp.term,
        group_left: stamp.group_left,
        record_type: record.tag(),
    };
    let (head, body) = out.split_at_mut(start + FRAME_HEADER_BYTES);
    let bytes = header.write(body);
    head[start..].copy_from_slice(&bytes);
    Ok(FRAME_HEADER_BYTES as u32 + body_len)
}

/// Why bytes at some offset are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// The bytes end inside the frame (a torn write, or the end of the data).
    Truncated,
    /// The length field is impossible.
    BadLength(u64),
    /// The CRC does not match.
    Crc { got: u32, expected: u32 },
    /// The frame checks, but its body is not a record of its type.
    BadBody(String),
}

/// A frame decoded from a buffer.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub header: FrameHeader,
    pub record: Record,
}

/// Decodes the frame at the start of `buf`, checking length and CRC before decoding.
///
/// # Errors
/// [`FrameError`] naming the first check that failed; never panics on any input.
#[cfg(test)]
pub(crate) fn decode_frame(buf: &[u8]) -> Result<Frame, FrameError> {
    let header = check_frame(buf)?;
    let body = buf
        .get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + header.body_len as usize)
        .ok_or(FrameError::Truncated)?;
    let record = Record::decode(header.record_type, body).map_err(FrameError::BadBody)?;
    Ok(Frame { header, record })
}

/// Checks length and CRC of the frame at the start of `buf` without decoding its body.
///
/// # Errors
/// As [`decode_frame`], without `BadBody`.
pub(crate) fn check_frame(buf: &[u8]) -> Result<FrameHeader, FrameError> {
    let raw: &[u8; FRAME_HEADER_BYTES] = buf
        .get(..FRAME_HEADER_BYTES)
        .and_then(|s| s.try_into().ok())
        .ok_or(FrameError::Truncated)?;
    let header = FrameHeader::read(raw);
    if header.body_len > BODY_BYTES_MAX {
        return Err(FrameError::BadLength(u64::from(header.body_len)));
    }
    let frame = buf
        .get(..FRAME_HEADER_BYTES + header.body_len as usize)
        .ok_or(FrameError::Truncated)?;
    let got = crate::format::frame_crc_contiguous(frame);
    if got != header.crc {
        return Err(FrameError::Crc {
            got,
            expected: header.crc,
        });
    }
    Ok(header)
}

#[cfg(test)]
mod tests;
