//! The read side: verdicts, bounded reads, live followers and outcomes. Nothing here takes
//! the writer's lock: it reads the committed index and the segments (maps when sealed).

use std::sync::Arc;

use bytes::Bytes;

use crate::api::{Event, Outcome, ReadBatch};
use crate::engine::Engine;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{FrameHeader, FRAME_HEADER_BYTES};
use crate::index::KvRead;
use crate::record::{
    check_frame, decode_event_view, tag, EventBody, EventView, FrameError, Record, Terminal,
};
use crate::segment::Segment;
use crate::state::StreamMeta;
use crate::verdict::{decide, past_horizon, Resolution};
use crate::writer::{duration_ms, now_ms, Shared};

impl Engine {
    fn horizon_ms(&self) -> u64 {
        duration_ms(self.config().retention.metadata_horizon)
    }

    /// The verdict for `cursor` presented in `session` (see [`crate::Verdict`]).
    ///
    /// # Errors
    /// Only index failures; every answer about the cursor is a verdict.
    pub fn resolve(
        &self,
        session: &str,
        cursor: &str,
        declared_stream: Option<u64>,
    ) -> Result<Resolution> {
        decide(
            &self.inner.shared.index,
            session,
            cursor,
            declared_stream,
            now_ms(),
            self.horizon_ms(),
        )
    }

    pub(crate) fn owned_stream(&self, session: &str, stream: u64) -> Result<StreamMeta> {
        let now = now_ms();
        match self.inner.shared.index.stored_stream(stream)? {
            Some(s)
                if s.meta.session == session
                    && !past_horizon(s.meta.ended_at_ms, now, self.horizon_ms()) =>
            {
                Ok(s.meta)
            }
            _ => Err(Error::UnknownStream(stream)),
        }
    }

    /// Up to `max_events` events strictly after `after_seq`, gap-free.
    ///
    /// # Errors
    /// Unknown stream (or another session's); [`Error::Evicted`] if the next event is below
    /// the watermark; corruption of the stored frames.
    pub fn read(
        &self,
        session: &str,
        stream: u64,
        after_seq: u64,
        max_events: u32,
    ) -> Result<ReadBatch> {
        let meta = self.owned_stream(session, stream)?;
        let from = after_seq.saturating_add(1);
        if from < meta.watermark {
            return Err(Error::Evicted {
                stream,
                seq: from,
                watermark: meta.watermark,
            });
        }
        let max = max_events.clamp(1, self.config().read_events_max) as usize;
        let events = read_events(&self.inner.shared, stream, from, meta.head, max)?;
        let last = events.last().map_or(after_seq, |e| e.seq);
        let end_of_stream = meta.state.is_terminal() && last >= meta.head;
        Ok(ReadBatch {
            events,
            head: meta.head,
            state: meta.state,
            end_of_stream,
        })
    }

    /// A live reader of `stream` after `after_seq`, woken by commits of any appender.
    ///
    /// # Errors
    /// As [`Engine::read`] for the first position.
    pub fn follow(&self, session: &str, stream: u64, after_seq: u64) -> Result<Follower> {
        let meta = self.owned_stream(session, stream)?;
        if after_seq.saturating_add(1) < meta.watermark {
            return Err(Error::Evicted {
                stream,
                seq: after_seq + 1,
                watermark: meta.watermark,
            });
        }
        Ok(Follower {
            engine: self.clone(),
            session: session.to_owned(),
            stream,
            after: after_seq,
            done: false,
            commits: self.inner.shared.commits.subscribe(),
        })
    }

    /// The outcome of the stream answering `correlation` in `session`.
    ///
    /// # Errors
    /// Index failures.
    pub fn outcome(&self, session: &str, correlation: &str) -> Result<Option<Outcome>> {
        let index = &self.inner.shared.index;
        let Some(stream) = index.outcome_stream(session, correlation)? else {
            return Ok(None);
        };
        self.stream_outcome(session, stream)
    }

    /// The outcome of `stream`, addressed by id; `None` unless `session` owns it (another
    /// session's stream is never revealed).
    ///
    /// # Errors
    /// Index failures.
    pub fn stream_outcome(&self, session: &str, stream: u64) -> Result<Option<Outcome>> {
        let index = &self.inner.shared.index;
        let Ok(meta) = self.owned_stream(session, stream) else {
            return Ok(None);
        };
        let frame = if meta.has_terminal_frame {
            index
                .terminal_frame(stream)?
                .map(|b| Event::from_body(EventBody { stream, ..b }))
        } else {
            None
        };
        Ok(Some(Outcome {
            stream,
            epoch: meta.epoch,
            state: meta.state,
            terminal_seq: meta.terminal_seq(),
            frame,
            reason: meta.end_reason,
        }))
    }
}

/// Events `from..=head` of `stream` (at most `max`), gap-free: each index entry starts a run
/// of adjacent frames, walked forward from the run start at or below `from`.
fn read_events(
    shared: &Shared,
    stream: u64,
    from: u64,
    head: u64,
    max: usize,
) -> Result<Vec<Event>> {
    if from > head {
        return Ok(Vec::new());
    }
    // Only runs starting before `until` can hold an event of this read: the last event it
    // may return is `until - 1`.
    let until = from.saturating_add(max as u64).min(head.saturating_add(1));
    let wanted = usize::try_from(until - from).unwrap_or(max).min(max);
    let mut events = Vec::with_capacity(wanted);
    let runs = shared.index.runs_from(stream, from, until, wanted)?;
    let mut expected = from;
    let mut kinds = Kinds::default();
    for (i, (start, pos)) in runs.iter().enumerate() {
        let run_end = runs.get(i + 1).map_or(u64::MAX, |r| r.0);
        if run_end <= expected || *start > expected {
            // A run wholly before `from`, or a hole in the index: the latter is corruption.
            if *start > expected {
                return Err(index_gap(shared, stream, expected, pos.segment));
            }
            continue;
        }
        let Some(seg) = shared.segments.get(pos.segment) else {
            return Err(missing_segment(shared, stream, expected, pos.segment));
        };
        let mut offset = pos.offset;
        let mut seq = *start;
        let mut ahead = ReadAhead::default();
        while seq < run_end && seq <= head && events.len() < max {
            if seq < expected {
                offset += frame_len_at(&seg, &mut ahead, offset)?;
            } else {
                let (event, len) =
                    read_frame_at(&seg, &mut ahead, &mut kinds, offset, stream, seq)?;
                events.push(event);
                offset += len;
                expected = seq + 1;
            }
            seq += 1;
        }
        if events.len() >= max || expected > head {
            break;
        }
    }
    if events.is_empty() && expected <= head {
        let segment = runs.first().map_or(0, |r| r.1.segment);
        return Err(index_gap(shared, stream, expected, segment));
    }
    Ok(events)
}

/// No index entry covers `seq`: evicted if a trim raced this read, otherwise the index is
/// damaged (it can be rebuilt from the log).
fn index_gap(shared: &Shared, stream: u64, seq: u64, segment: u64) -> Error {
    if let Error::Evicted { .. } = missing_segment(shared, stream, seq, segment) {
        return missing_segment(shared, stream, seq, segment);
    }
    Error::Corruption {
        segment: shared.config.dir.join(crate::format::segment_name(segment)),
        offset: 0,
        kind: CorruptionKind::BadBody(format!("the index has no entry covering {stream}/{seq}; delete the index directory to rebuild it")),
    }
}

fn frame_error(seg: &Segment, offset: u64, kind: CorruptionKind) -> Error {
    Error::Corruption {
        segment: seg.path().to_path_buf(),
        offset,
        kind,
    }
}

/// How much of a segment that is not memory-mapped (the active one) one positional read
/// fetches ahead: a run of frames then costs one `pread` per window instead of two per frame.
const READ_AHEAD_BYTES: u64 = 256 * 1024;

/// A window of a non-mapped segment's written bytes. Bytes below a segment's written length
/// never change (the log is append-only), so a window stays valid for the whole read.
#[derive(Debug, Default)]
pub(crate) struct ReadAhead {
    start: u64,
    /// A fresh buffer per window: the events read from the previous one share it.
    bytes: Bytes,
}

impl ReadAhead {
    /// The bytes from `offset` on, at least `need` of them unless the segment ends first.
    pub(crate) fn at(&mut self, seg: &Segment, offset: u64, need: u64) -> Result<&[u8]> {
        let (bytes, from) = self.window(seg, offset, need)?;
        Ok(bytes.get(from..).unwrap_or_default())
    }

    /// The window holding `offset .. offset + need` and where `offset` is in it.
    fn window(&mut self, seg: &Segment, offset: u64, need: u64) -> Result<(&Bytes, usize)> {
        let end = self.start + self.bytes.len() as u64;
        if offset < self.start || offset.saturating_add(need) > end {
            let len = need
                .max(READ_AHEAD_BYTES)
                .min(seg.len().saturating_sub(offset));
            self.bytes = seg.read_unmapped(offset, len)?.into();
            self.start = offset;
        }
        let from = usize::try_from(offset - self.start).unwrap_or(usize::MAX);
        Ok((&self.bytes, from))
    }
}

/// The kind string of the last event a read decoded: consecutive events of one kind (the
/// common case) share it instead of allocating one each.
#[derive(Default)]
struct Kinds(Option<Arc<str>>);

impl Kinds {
    fn get(&mut self, kind: &str) -> Arc<str> {
        match &self.0 {
            Some(last) if **last == *kind => Arc::clone(last),
            _ => Arc::clone(self.0.insert(Arc::from(kind))),
        }
    }
}

/// Length of the frame at `offset`, from its header (the frames skipped on the way to the
/// first requested one are not returned, so their CRC is not checked).
fn frame_len_at(seg: &Segment, ahead: &mut ReadAhead, offset: u64) -> Result<u64> {
    let bytes = match seg.mapped_from(offset) {
        Some(bytes) => bytes,
        None => ahead.at(seg, offset, FRAME_HEADER_BYTES as u64)?,
    };
    frame_len_in(bytes).ok_or_else(|| frame_error(seg, offset, bad_length(0)))
}

/// The frame length a frame header at the start of `b` claims, if it is within bounds.
pub(crate) fn frame_len_in(b: &[u8]) -> Option<u64> {
    let raw = b.get(..FRAME_HEADER_BYTES)?.try_into().ok()?;
    let header = FrameHeader::read(raw);
    (header.body_len <= crate::format::BODY_BYTES_MAX).then(|| header.frame_len())
}

fn bad_length(n: u64) -> CorruptionKind {
    CorruptionKind::BadLength(n)
}

/// Reads and checks the frame at `offset`, which must be event `seq` of `stream`; returns it
/// with the frame's length.
///
/// Every call checks the frame's length bound and its CRC over the header fields and the
/// whole body, decodes the body strictly (UTF-8, option tags, no trailing bytes), and checks
/// the record is the event `stream`/`seq`. A sealed segment's frame is checked in place in
/// the map (one access); the active segment's is read with positional reads.
fn read_frame_at(
    seg: &Segment,
    ahead: &mut ReadAhead,
    kinds: &mut Kinds,
    offset: u64,
    stream: u64,
    seq: u64,
) -> Result<(Event, u64)> {
    let len = frame_len_at(seg, ahead, offset)?;
    // The frame's bytes and the buffer they are in, which the payload will share.
    let (source, from) = match seg.map() {
        Some(map) => (map, usize::try_from(offset).unwrap_or(usize::MAX)),
        None => ahead.window(seg, offset, len)?,
    };
    let frame = usize::try_from(len)
        .ok()
        .and_then(|n| source.get(from..from.checked_add(n)?));
    let decoded = match frame {
        Some(frame) => decode_event_frame(frame),
        None => return Err(frame_error(seg, offset, bad_length(len))),
    };
    let (body, len) = decoded.map_err(|e| {
        frame_error(
            seg,
            offset,
            match e {
                FrameError::Crc { got, expected } => CorruptionKind::Crc { got, expected },
                FrameError::BadBody(b) => CorruptionKind::BadBody(b),
                FrameError::BadLength(n) => CorruptionKind::BadLength(n),
                FrameError::Truncated => CorruptionKind::BadLength(len),
            },
        )
    })?;
    let Some(body) = body else {
        return Err(frame_error(
            seg,
            offset,
            CorruptionKind::BadBody(format!(
                "expected event {stream}/{seq}, found another record"
            )),
        ));
    };
    let (found_stream, found_seq) = body.stream_seq();
    if found_stream != stream || found_seq != seq {
        return Err(frame_error(
            seg,
            offset,
            CorruptionKind::BadBody(format!(
                "expected event {stream}/{seq}, found {found_stream}/{found_seq}"
            )),
        ));
    }
    let event = match body {
        FrameEvent::InPlace(v) => Event {
            stream,
            seq,
            kind: kinds.get(v.kind),
            correlation: v.correlation.map(str::to_owned),
            payload: source.slice_ref(v.payload),
            appended_at_ms: v.at_ms,
        },
        FrameEvent::Copied(b) => Event::from_body(b),
    };
    Ok((event, len))
}

/// The event a frame carries: an `Event` record's, borrowed from the frame, or a `Terminal`
/// record's frame, decoded into its own copy.
enum FrameEvent<'a> {
    InPlace(EventView<'a>),
    Copied(EventBody),
}

impl FrameEvent<'_> {
    fn stream_seq(&self) -> (u64, u64) {
        match self {
            Self::InPlace(v) => (v.stream, v.seq),
            Self::Copied(b) => (b.stream, b.seq),
        }
    }
}

/// Checks the frame at the start of `buf` (length, CRC) and decodes the event it carries:
/// an `Event` record, or a `Terminal` one with a frame (`None` for any other record). Returns
/// the frame's length too.
fn decode_event_frame(
    buf: &[u8],
) -> std::result::Result<(Option<FrameEvent<'_>>, u64), FrameError> {
    let header = check_frame(buf)?;
    let body = buf
        .get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + header.body_len as usize)
        .ok_or(FrameError::Truncated)?;
    let event = if header.record_type == tag::EVENT {
        Some(FrameEvent::InPlace(
            decode_event_view(body).map_err(FrameError::BadBody)?,
        ))
    } else {
        match Record::decode(header.record_type, body).map_err(FrameError::BadBody)? {
            Record::Terminal(Terminal { frame, .. }) => frame.map(FrameEvent::Copied),
            _ => None,
        }
    };
    Ok((event, header.frame_len()))
}

/// A position whose segment is gone: evicted if retention raised the watermark past `seq`
/// meanwhile (a read racing a trim), otherwise a segment file was lost: data loss, said so.
fn missing_segment(shared: &Shared, stream: u64, seq: u64, segment: u64) -> Error {
    let watermark = shared
        .index
        .stored_stream(stream)
        .ok()
        .flatten()
        .map_or(u64::MAX, |s| s.meta.watermark);
    if seq < watermark {
        return Error::Evicted {
            stream,
            seq,
            watermark,
        };
    }
    Error::Corruption {
        segment: shared.config.dir.join(crate::format::segment_name(segment)),
        offset: 0,
        kind: CorruptionKind::MissingSegment,
    }
}

/// Reads one committed event, `None` if it has no index entry.
pub(crate) fn read_event(shared: &Shared, stream: u64, seq: u64) -> Result<Option<Event>> {
    Ok(read_events(shared, stream, seq, seq, 1)?.into_iter().next())
}

/// A live reader of one stream; yields batches until the terminal seq has been delivered.
#[derive(Debug)]
pub struct Follower {
    engine: Engine,
    session: String,
    stream: u64,
    after: u64,
    done: bool,
    commits: tokio::sync::watch::Receiver<u64>,
}

impl Follower {
    /// The next batch after what was delivered, waiting for a commit if there is none yet.
    /// `Ok(None)` once the stream's terminal seq has been delivered.
    ///
    /// # Errors
    /// As [`Engine::read`]; [`Error::Closed`] if the engine closes.
    pub async fn next_batch(&mut self, max_events: u32) -> Result<Option<Vec<Event>>> {
        loop {
            if self.done {
                return Ok(None);
            }
            self.commits.borrow_and_update();
            let batch = self
                .engine
                .read(&self.session, self.stream, self.after, max_events)?;
            self.done = batch.end_of_stream;
            if let Some(last) = batch.events.last() {
                self.after = last.seq;
                return Ok(Some(batch.events));
            }
            if self.done {
                return Ok(None);
            }
            self.commits.changed().await.map_err(|_| Error::Closed)?;
        }
    }

    /// The seq of the last event delivered.
    pub fn position(&self) -> u64 {
        self.after
    }
}
