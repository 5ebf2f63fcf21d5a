//! Conversions between the proto messages and the engine's types, with request validation.
//!
//! Validation here is structural: a required field that is missing or empty is refused with
//! `INVALID_ARGUMENT` naming the field. Limits (lengths, sizes, batch counts) are the engine's
//! to check, so they are enforced identically for every caller.

use cursorlog_engine as engine;
use cursorlog_engine::Cursor;
use cursorlog_proto::v1 as pb;
use tonic::Status;

/// A required string field: refused when empty.
///
/// # Errors
/// `INVALID_ARGUMENT` naming `field` when `value` is empty.
pub fn required_str(field: &str, value: String) -> Result<String, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{field} is required and must not be empty"
        )));
    }
    Ok(value)
}

/// A required u64 id field (stream ids, epochs, seqs) where 0 means absent.
///
/// # Errors
/// `INVALID_ARGUMENT` naming `field` when `value` is 0.
pub fn required_id(field: &str, value: u64) -> Result<u64, Status> {
    if value == 0 {
        return Err(Status::invalid_argument(format!(
            "{field} is required and must be >= 1"
        )));
    }
    Ok(value)
}

/// An optional u64 id field where 0 means absent (proto3 `optional` fields set to 0 too).
pub fn optional_id(value: Option<u64>) -> Option<u64> {
    value.filter(|v| *v != 0)
}

/// One `AppendBatch` item as an engine write.
///
/// # Errors
/// `INVALID_ARGUMENT` naming the missing field, as the unary call would.
pub fn batch_write(item: pb::BatchItem) -> Result<engine::BatchWrite, Status> {
    match item.item {
        Some(pb::batch_item::Item::Append(r)) => Ok(engine::BatchWrite::Append(engine::Append {
            session: required_str("session", r.session)?,
            stream: required_id("stream", r.stream)?,
            expected_next_seq: r.expected_next_seq,
            events: new_events(r.events)?,
        })),
        Some(pb::batch_item::Item::Open(r)) => Ok(engine::BatchWrite::Open(engine::OpenStream {
            session: required_str("session", r.session)?,
            epoch: required_id("epoch", r.epoch)?,
            correlation: r.correlation,
            lease_ms: r.lease_ms,
        })),
        Some(pb::batch_item::Item::Complete(r)) => Ok(engine::BatchWrite::Complete {
            session: required_str("session", r.session)?,
            stream: required_id("stream", r.stream)?,
            expected_next_seq: r.expected_next_seq,
            terminal: r.terminal.map(new_event).ok_or_else(|| {
                Status::invalid_argument("terminal is required: the terminal frame")
            })?,
        }),
        None => Err(Status::invalid_argument(
            "item is required: an append, a complete or an open",
        )),
    }
}

/// A failed batch item: the status its unary call would have returned.
pub fn batch_failure(status: &Status) -> pb::BatchResult {
    pb::BatchResult {
        result: Some(pb::batch_result::Result::Failure(failure(status))),
    }
}

/// A status as a `Failure` message (inside streaming and batch calls).
pub fn failure(status: &Status) -> pb::Failure {
    pb::Failure {
        code: status.code() as i32,
        message: status.message().to_owned(),
    }
}

/// A written batch item.
pub fn batch_written(w: &engine::BatchWritten) -> pb::BatchResult {
    let result = match w {
        engine::BatchWritten::Appended(a) => pb::batch_result::Result::Appended(appended(a)),
        engine::BatchWritten::Completed(t) => pb::batch_result::Result::Completed(terminated(t)),
        engine::BatchWritten::Opened(s) => {
            pb::batch_result::Result::Opened(pb::OpenStreamResponse {
                stream: s.stream,
                epoch: s.epoch,
                start_event_id: Cursor::new(s.epoch, s.stream, 0).to_string(),
            })
        }
    };
    pb::BatchResult {
        result: Some(result),
    }
}

/// A producer event from the wire.
pub fn new_event(event: pb::NewEvent) -> engine::NewEvent {
    engine::NewEvent {
        kind: event.kind,
        correlation: event.correlation,
        payload: event.payload,
    }
}

/// The events of an append: at least one.
///
/// # Errors
/// `INVALID_ARGUMENT` naming `events` when the batch is empty.
pub fn new_events(events: Vec<pb::NewEvent>) -> Result<Vec<engine::NewEvent>, Status> {
    if events.is_empty() {
        return Err(Status::invalid_argument(
            "events is required: an append needs at least one event",
        ));
    }
    Ok(events.into_iter().map(new_event).collect())
}

/// The event id `{epoch}-{stream}-{seq}`, exactly as [`Cursor`]'s `Display` prints it.
///
/// Built with `itoa`: Read replays call this once per event, and going through `core::fmt`
/// (`Cursor::to_string`) cost about 1,300 instructions per event, a tenth of the whole
/// server-side cost of a replayed event (callgrind).
pub fn event_id(epoch: u64, stream: u64, seq: u64) -> String {
    let mut digits = itoa::Buffer::new();
    let mut id = String::with_capacity(62);
    id.push_str(digits.format(epoch));
    id.push('-');
    id.push_str(digits.format(stream));
    id.push('-');
    id.push_str(digits.format(seq));
    id
}

/// A stored event, with its event id built from the stream's epoch.
pub fn event(epoch: u64, event: engine::Event) -> pb::Event {
    pb::Event {
        id: event_id(epoch, event.stream, event.seq),
        stream: event.stream,
        seq: event.seq,
        kind: event.kind.to_string(),
        correlation: event.correlation,
        payload: event.payload,
        appended_at_ms: event.appended_at_ms,
    }
}

/// Approximate encoded size of an event on the wire, for splitting batches under the gRPC
/// message size limit. Overestimates the framing on purpose.
pub fn event_wire_bytes(event: &engine::Event) -> usize {
    const FRAMING_BYTES: usize = 128;
    event.payload.len()
        + event.kind.len()
        + event.correlation.as_ref().map_or(0, String::len)
        + FRAMING_BYTES
}

/// A stream state on the wire.
pub fn stream_state(state: engine::StreamState) -> pb::StreamState {
    match state {
        engine::StreamState::Open => pb::StreamState::Open,
        engine::StreamState::Completed => pb::StreamState::Completed,
        engine::StreamState::Aborted => pb::StreamState::Aborted,
        engine::StreamState::Superseded => pb::StreamState::Superseded,
    }
}

/// A verdict on the wire.
pub fn verdict(verdict: engine::Verdict) -> pb::Verdict {
    match verdict {
        engine::Verdict::Resumable => pb::Verdict::Resumable,
        engine::Verdict::MalformedCursor => pb::Verdict::MalformedCursor,
        engine::Verdict::UnknownSession => pb::Verdict::UnknownSession,
        engine::Verdict::EpochMismatch => pb::Verdict::EpochMismatch,
        engine::Verdict::UnknownCursor => pb::Verdict::UnknownCursor,
        engine::Verdict::StreamMismatch => pb::Verdict::StreamMismatch,
        engine::Verdict::StreamTerminated => pb::Verdict::StreamTerminated,
        engine::Verdict::CursorEvicted => pb::Verdict::CursorEvicted,
        engine::Verdict::CursorAhead => pb::Verdict::CursorAhead,
    }
}

/// A resolution (verdict and facts) on the wire.
pub fn resolution(resolution: &engine::Resolution) -> pb::Resolution {
    let facts = &resolution.facts;
    pb::Resolution {
        verdict: verdict(resolution.verdict).into(),
        cursor: resolution.cursor.map(|c| pb::Cursor {
            epoch: c.epoch,
            stream: c.stream,
            seq: c.seq,
        }),
        current_epoch: facts.current_epoch,
        stream_state: facts.stream_state.map(|s| stream_state(s).into()),
        head: facts.head,
        terminal_seq: facts.terminal_seq,
        watermark: facts.watermark,
        session_expired: facts.session_expired,
        detail: facts.detail.clone(),
        missed_terminal_frame: resolution.missed_terminal_frame(),
        correlation: facts.correlation.clone(),
    }
}

/// A tombstone written by complete or abort.
pub fn terminated(t: &engine::Terminated) -> pb::TerminateResponse {
    pb::TerminateResponse {
        stream: t.stream,
        state: stream_state(t.state).into(),
        terminal_seq: t.terminal_seq,
        terminal_event_id: t.cursor.to_string(),
        duplicate: t.duplicate,
    }
}

/// An append's acknowledgement, with the event ids of the batch.
pub fn appended(a: &engine::Appended) -> pb::AppendResponse {
    pb::AppendResponse {
        epoch: a.epoch,
        stream: a.stream,
        first_seq: a.first_seq,
        last_seq: a.last_seq,
        duplicate: a.duplicate,
        event_ids: (a.first_seq..=a.last_seq)
            .map(|seq| event_id(a.epoch, a.stream, seq))
            .collect(),
    }
}

/// An outcome lookup's answer.
pub fn outcome(outcome: Option<engine::Outcome>) -> pb::GetOutcomeResponse {
    let Some(o) = outcome else {
        return pb::GetOutcomeResponse {
            found: false,
            outcome: None,
        };
    };
    pb::GetOutcomeResponse {
        found: true,
        outcome: Some(pb::Outcome {
            stream: o.stream,
            epoch: o.epoch,
            state: stream_state(o.state).into(),
            terminal_seq: o.terminal_seq,
            terminal_event_id: o
                .terminal_seq
                .map(|t| Cursor::new(o.epoch, o.stream, t).to_string()),
            frame: o.frame.map(|f| event(o.epoch, f)),
            reason: o.reason,
        }),
    }
}

/// Engine statistics plus the server's live follower and Read call counts.
pub fn stats(
    s: &engine::Stats,
    active_followers: u64,
    reads: &crate::read_slots::ReadSlots,
) -> pb::StatsResponse {
    pb::StatsResponse {
        sessions: s.sessions,
        streams: s.streams,
        segments: s.segments,
        log_bytes: s.log_bytes,
        last_lsn: s.last_lsn,
        events_appended: s.events_appended,
        payload_bytes_appended: s.payload_bytes_appended,
        fsyncs: s.fsyncs,
        commit_batches: s.commit_batches,
        records_written: s.records_written,
        segments_deleted: s.segments_deleted,
        recovery_micros: s.recovery_micros,
        active_followers,
        live_sessions: s.live_sessions,
        open_streams: s.open_streams,
        poisoned: s.poisoned,
        disk_free_bytes: s.disk_free_bytes.unwrap_or(0),
        appends_refused_low_disk: s.appends_refused_low_disk,
        sessions_expired_idle: s.sessions_expired_idle,
        active_reads: reads.active(),
        read_calls_refused: reads.refused(),
    }
}

pub mod task;

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn required_fields_are_named() {
        let err = required_str("session", String::new()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("session"));
        assert_eq!(required_str("session", "s".into()).unwrap(), "s");
        let err = required_id("stream", 0).unwrap_err();
        assert!(err.message().contains("stream"));
        assert_eq!(required_id("stream", 9).unwrap(), 9);
        let err = new_events(Vec::new()).unwrap_err();
        assert!(err.message().contains("events"));
    }

    #[test]
    fn append_ids_cover_the_batch() {
        let a = engine::Appended {
            epoch: 2,
            stream: 7,
            first_seq: 4,
            last_seq: 6,
            duplicate: false,
        };
        assert_eq!(appended(&a).event_ids, vec!["2-7-4", "2-7-5", "2-7-6"]);
    }

    #[test]
    fn event_ids_match_the_cursor_display() {
        let values = [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ];
        for &epoch in &values {
            for &stream in &values {
                for &seq in &values {
                    assert_eq!(
                        event_id(epoch, stream, seq),
                        Cursor::new(epoch, stream, seq).to_string()
                    );
                }
            }
        }
    }

    #[test]
    fn terminated_resolution_reports_missed_frame() {
        let r = engine::Resolution {
            verdict: engine::Verdict::StreamTerminated,
            cursor: Some(Cursor::new(1, 3, 2)),
            facts: engine::Facts {
                current_epoch: Some(1),
                stream_state: Some(engine::StreamState::Completed),
                head: Some(5),
                terminal_seq: Some(5),
                watermark: Some(1),
                session_expired: false,
                detail: None,
                correlation: Some("7".into()),
            },
        };
        let p = resolution(&r);
        assert_eq!(p.verdict(), pb::Verdict::StreamTerminated);
        assert!(p.missed_terminal_frame);
        assert_eq!(p.stream_state(), pb::StreamState::Completed);
        assert_eq!(p.cursor.unwrap().seq, 2);
        assert_eq!(p.correlation.as_deref(), Some("7"));
        assert_eq!(p.terminal_seq, Some(5));
    }
}
