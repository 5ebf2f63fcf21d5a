//! Positioned reads of event frames: the read path's per-event work. A run of a stream's
//! events is adjacent frames in one segment; a read walks it from its start, checking each
//! frame (length, CRC, a strict decode, the stream and seq it must be).

use std::sync::Arc;

use bytes::Bytes;

use crate::api::Event;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::FRAME_HEADER_BYTES;
use crate::log::frames::{frame_len_in, ReadAhead};
use crate::log::Segment;
use crate::record::{
    check_frame, decode_event_view, tag, EventBody, EventView, FrameError, Record, Terminal,
};

fn frame_error(seg: &Segment, offset: u64, kind: CorruptionKind) -> Error {
    seg.corruption(offset, kind)
}

fn bad_length(n: u64) -> CorruptionKind {
    CorruptionKind::BadLength(n)
}

/// The kind string of the last event a read decoded: consecutive events of one kind (the
/// common case) share it instead of allocating one each.
#[derive(Default)]
pub(crate) struct Kinds(Option<Arc<str>>);

impl Kinds {
    pub(crate) fn get(&mut self, kind: &str) -> Arc<str> {
        match &self.0 {
            Some(last) if **last == *kind => Arc::clone(last),
            _ => Arc::clone(self.0.insert(Arc::from(kind))),
        }
    }
}

/// After a read-ahead window failed with `e`: when the window ran into the end of a file cut
/// short under us but `offset .. offset + need` is still there, just those bytes, so the
/// frames before the cut are still served and only the range past it is
/// [`CorruptionKind::Truncated`]; otherwise `e`.
fn before_the_cut(seg: &Segment, offset: u64, need: u64, e: Error) -> Result<Bytes> {
    match e {
        Error::Corruption {
            kind:
                CorruptionKind::Truncated {
                    file_len: Some(end),
                    ..
                },
            ..
        } if offset.saturating_add(need) <= end => {
            let len = need.min(seg.len().saturating_sub(offset));
            Ok(Bytes::from(seg.read_at(offset, len)?))
        }
        e => Err(e),
    }
}

/// Length of the frame at `offset`, from its header (the frames skipped on the way to the
/// first requested one are not returned, so their CRC is not checked).
pub(crate) fn frame_len_at(seg: &Segment, ahead: &mut ReadAhead, offset: u64) -> Result<u64> {
    let need = FRAME_HEADER_BYTES as u64;
    let len = match ahead.window(seg, offset, need) {
        Ok((bytes, from)) => bytes.get(from..).and_then(frame_len_in),
        Err(e) => frame_len_in(&before_the_cut(seg, offset, need, e)?),
    };
    len.ok_or_else(|| frame_error(seg, offset, bad_length(0)))
}

/// Reads and checks the frame at `offset`, which must be event `seq` of `stream`; returns it
/// with the frame's length.
///
/// Every call checks the frame's length bound and its CRC over the header fields and the
/// whole body, decodes the body strictly (UTF-8, option tags, no trailing bytes), and checks
/// the record is the event `stream`/`seq`. Frames are read with positional reads, a
/// read-ahead window at a time, sealed segments and the active one alike; an event's payload
/// shares the window's buffer.
pub(crate) fn read_frame_at(
    seg: &Segment,
    ahead: &mut ReadAhead,
    kinds: &mut Kinds,
    offset: u64,
    stream: u64,
    seq: u64,
) -> Result<(Event, u64)> {
    let len = frame_len_at(seg, ahead, offset)?;
    // The frame's bytes and the buffer they are in, which the payload will share.
    let cut_short;
    let (source, from) = match ahead.window(seg, offset, len) {
        Ok(window) => window,
        Err(e) => {
            cut_short = before_the_cut(seg, offset, len, e)?;
            (&cut_short, 0)
        }
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
