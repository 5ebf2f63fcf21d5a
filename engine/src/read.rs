//! The read side: verdicts, bounded reads, live followers and outcomes. Nothing here takes
//! the writer's lock: it reads the committed index and the log (positional reads).

use std::sync::Arc;

use crate::api::{Event, FramePlace, Outcome, ReadBatch, ReadPosition};
use crate::error::{CorruptionKind, Error, Result};
use crate::followers::Bell;
use crate::index::KvRead;
use crate::log::events::{frame_len_at, read_frame_at, Kinds};
use crate::log::frames::ReadAhead;
use crate::record::EventBody;
use crate::shared::Shared;
use crate::state::StreamMeta;
use crate::verdict::{decide, past_horizon, Resolution};

#[cfg(test)]
mod tests;

/// The verdict for `cursor` presented in `session` (see [`crate::Verdict`]).
pub(crate) fn resolve(
    shared: &Shared,
    session: &str,
    cursor: &str,
    declared_stream: Option<u64>,
) -> Result<Resolution> {
    decide(
        // One moment's session and stream: a write between the two reads would give a
        // verdict of no moment (a stream superseded under the old epoch).
        &shared.index.snapshot(),
        session,
        cursor,
        declared_stream,
        shared.now_ms(),
        shared.horizon_ms(),
    )
}

/// The stream, if `session` owns it and it is remembered.
pub(crate) fn owned_stream(shared: &Shared, session: &str, stream: u64) -> Result<StreamMeta> {
    match shared.index.stored_stream(stream)? {
        Some(s)
            if s.meta.session == session
                && !past_horizon(s.meta.ended_at_ms, shared.now_ms(), shared.horizon_ms()) =>
        {
            Ok(s.meta)
        }
        _ => Err(Error::UnknownStream(stream)),
    }
}

/// Up to `max_events` events strictly after `after_seq`, gap-free, starting at `from` when it
/// is where the event after `after_seq` is.
pub(crate) fn read(
    shared: &Shared,
    session: &str,
    stream: u64,
    after_seq: u64,
    max_events: u32,
    from: Option<ReadPosition>,
) -> Result<ReadBatch> {
    let meta = owned_stream(shared, session, stream)?;
    let first = after_seq.saturating_add(1);
    if first < meta.watermark {
        return Err(Error::Evicted {
            stream,
            seq: first,
            watermark: meta.watermark,
        });
    }
    let max = max_events.clamp(1, shared.config.read_events_max) as usize;
    let hint = from.filter(|p| p.stream == stream && p.seq == first);
    let (events, next) = read_events_from(shared, stream, first, meta.head, max, hint)?;
    let last = events.last().map_or(after_seq, |e| e.seq);
    let end_of_stream = meta.state.is_terminal() && last >= meta.head;
    Ok(ReadBatch {
        events,
        head: meta.head,
        state: meta.state,
        end_of_stream,
        next,
    })
}

/// The outcome of `stream`, addressed by id; `None` unless `session` owns it.
pub(crate) fn stream_outcome(
    shared: &Shared,
    session: &str,
    stream: u64,
) -> Result<Option<Outcome>> {
    let Ok(meta) = owned_stream(shared, session, stream) else {
        return Ok(None);
    };
    let frame = if meta.has_terminal_frame {
        shared
            .index
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

/// Events `from..=head` of `stream` (at most `max`), gap-free: each index entry starts a run
/// of adjacent frames, walked forward from the run start at or below `from`.
pub(crate) fn read_events(
    shared: &Shared,
    stream: u64,
    from: u64,
    head: u64,
    max: usize,
) -> Result<Vec<Event>> {
    Ok(read_events_from(shared, stream, from, head, max, None)?.0)
}

/// [`read_events`], starting at `hint`'s frame (event `from`'s) when it still holds the event,
/// and where the read stopped.
fn read_events_from(
    shared: &Shared,
    stream: u64,
    from: u64,
    head: u64,
    max: usize,
    hint: Option<ReadPosition>,
) -> Result<(Vec<Event>, Option<ReadPosition>)> {
    if from > head {
        return Ok((Vec::new(), hint));
    }
    // Only runs starting before `until` can hold an event of this read: the last event it
    // may return is `until - 1`.
    let until = from.saturating_add(max as u64).min(head.saturating_add(1));
    let wanted = usize::try_from(until - from).unwrap_or(max).min(max);
    // Windows sized for what this read wants (an event's frame is about as long as the last
    // one read; one frame when only one is wanted), not whole read-ahead windows.
    let window = match hint {
        Some(h) => Some(h.frame_len.saturating_mul(wanted as u64)),
        None => (wanted == 1).then_some(0),
    };
    let new_window = || window.map_or_else(ReadAhead::default, ReadAhead::sized);
    let mut events = Vec::with_capacity(wanted);
    let mut kinds = Kinds::default();
    if let Some((h, place)) = hint.and_then(|h| Some((h, h.place?))) {
        // The frames from the hint on, as far as they check; the rest through the index.
        let next = walk_from(
            shared,
            stream,
            head,
            max,
            h,
            place,
            new_window(),
            &mut events,
            &mut kinds,
        );
        if events.len() >= max || from + events.len() as u64 > head {
            return Ok((events, next));
        }
    }
    let mut expected = from + events.len() as u64;
    let mut next = None;
    let runs = shared
        .index
        .runs_from(stream, expected, until, wanted - events.len())?;
    for (i, (start, pos)) in runs.iter().enumerate() {
        let run_end = runs.get(i + 1).map_or(u64::MAX, |r| r.0);
        if run_end <= expected || *start > expected {
            // A run wholly before `from`, or a hole in the index: the latter is corruption.
            if *start > expected {
                return Err(index_gap(shared, stream, expected, pos.segment));
            }
            continue;
        }
        let Some(seg) = shared.log.get(pos.segment) else {
            return Err(missing_segment(shared, stream, expected, pos.segment));
        };
        let mut offset = pos.offset;
        let mut seq = *start;
        let mut ahead = new_window();
        let mut frame_len = 0;
        while seq < run_end && seq <= head && events.len() < max {
            if seq < expected {
                offset += frame_len_at(&seg, &mut ahead, offset)
                    .map_err(|e| gone(shared, stream, expected, pos.segment, e))?;
            } else {
                let (event, len) = read_frame_at(&seg, &mut ahead, &mut kinds, offset, stream, seq)
                    .map_err(|e| gone(shared, stream, seq, pos.segment, e))?;
                events.push(event);
                offset += len;
                frame_len = len;
                expected = seq + 1;
            }
            seq += 1;
        }
        if frame_len > 0 {
            next = Some(ReadPosition {
                stream,
                seq,
                place: (seq < run_end).then_some(FramePlace {
                    segment: pos.segment,
                    offset,
                    run_end,
                }),
                frame_len,
            });
        }
        if events.len() >= max || expected > head {
            break;
        }
    }
    if events.is_empty() && expected <= head {
        let segment = runs.first().map_or(0, |r| r.1.segment);
        return Err(index_gap(shared, stream, expected, segment));
    }
    Ok((events, next))
}

/// Reads into `events` the frames from `place` (event `hint.seq`'s) on: at most `max` events
/// in all, none past `head` nor past the run. Stops quietly at the first frame that is not
/// the event it should be or cannot be read: the caller reads that one again through the
/// index, which reports it if it is damaged. Returns where the walk stopped.
#[allow(clippy::too_many_arguments, reason = "one call site, the read's state")]
fn walk_from(
    shared: &Shared,
    stream: u64,
    head: u64,
    max: usize,
    hint: ReadPosition,
    mut place: FramePlace,
    mut ahead: ReadAhead,
    events: &mut Vec<Event>,
    kinds: &mut Kinds,
) -> Option<ReadPosition> {
    let seg = shared.log.get(place.segment)?;
    let mut at = hint;
    while at.seq < place.run_end && at.seq <= head && events.len() < max {
        let (event, len) =
            read_frame_at(&seg, &mut ahead, kinds, place.offset, stream, at.seq).ok()?;
        events.push(event);
        at.seq += 1;
        place.offset += len;
        at.frame_len = len;
    }
    at.place = (at.seq < place.run_end).then_some(place);
    Some(at)
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

/// A read of `segment` that found its file gone: [`missing_segment`] decides between a read
/// racing retention (the file was unlinked after the read found the segment) and a lost file.
fn gone(shared: &Shared, stream: u64, seq: u64, segment: u64, e: Error) -> Error {
    match e {
        Error::Corruption {
            kind: CorruptionKind::MissingSegment,
            ..
        } => missing_segment(shared, stream, seq, segment),
        e => e,
    }
}

/// Reads one committed event, `None` if it has no index entry.
pub(crate) fn read_event(shared: &Shared, stream: u64, seq: u64) -> Result<Option<Event>> {
    Ok(read_events(shared, stream, seq, seq, 1)?.into_iter().next())
}

/// A live reader of one stream: yields batches until the terminal seq has been delivered.
///
/// Waiting costs nothing while the stream is quiet: a commit wakes only the followers of the
/// streams it touched, and the wake-up is a comparison ([`Follower::changed`]); the read
/// that follows ([`Follower::poll`]) can run wherever the caller likes (an async server
/// runs it on its blocking pool). While it lives, a follower keeps its session from
/// expiring idle; when it is dropped, the session's idle time starts again.
#[derive(Debug)]
pub struct Follower {
    shared: Arc<Shared>,
    session: String,
    stream: u64,
    after: u64,
    /// Where the last read stopped, for the next one to start there.
    position: Option<ReadPosition>,
    done: bool,
    bell: Option<Arc<Bell>>,
    /// The bell's count when the last read started.
    seen: u64,
}

impl Follower {
    pub(crate) fn new(shared: Arc<Shared>, session: &str, stream: u64, after: u64) -> Self {
        let bell = shared.followers.follow(session, stream);
        Self {
            shared,
            session: session.to_owned(),
            stream,
            after,
            position: None,
            done: false,
            bell: Some(bell),
            seen: 0,
        }
    }

    /// The events after what was delivered, now, without waiting: `Ok(Some(events))` (empty
    /// when there is nothing new), `Ok(None)` once the terminal seq has been delivered.
    /// Blocking: it reads the index and the log.
    ///
    /// # Errors
    /// As [`crate::Engine::read`]; [`Error::Closed`] once the engine closed.
    pub fn poll(&mut self, max_events: u32) -> Result<Option<Vec<Event>>> {
        if self.done {
            return Ok(None);
        }
        if self.shared.followers.is_closed() {
            return Err(Error::Closed);
        }
        if let Some(bell) = &self.bell {
            self.seen = bell.rings();
        }
        let batch = read(
            &self.shared,
            &self.session,
            self.stream,
            self.after,
            max_events,
            self.position,
        )?;
        self.done = batch.end_of_stream;
        self.position = batch.next;
        if let Some(last) = batch.events.last() {
            self.after = last.seq;
        }
        if self.done && batch.events.is_empty() {
            return Ok(None);
        }
        Ok(Some(batch.events))
    }

    /// As [`Follower::poll`], but delivers only the first events `keep` accepts, called on
    /// each in order (the first event is delivered whatever it says); the position stays
    /// after the last event delivered, so the next poll reads the rest again. For a caller
    /// that must not hold more than it can pass on (a reader whose client stopped reading).
    ///
    /// # Errors
    /// As [`Follower::poll`].
    pub fn poll_while(
        &mut self,
        max_events: u32,
        mut keep: impl FnMut(&Event) -> bool,
    ) -> Result<Option<Vec<Event>>> {
        let Some(mut events) = self.poll(max_events)? else {
            return Ok(None);
        };
        let n = events
            .iter()
            .enumerate()
            .take_while(|(i, e)| keep(e) || *i == 0)
            .count();
        if n < events.len() {
            events.truncate(n);
            if let Some(last) = events.last() {
                self.after = last.seq;
            }
            self.position = None;
            self.done = false;
        }
        Ok(Some(events))
    }

    /// Waits until a commit touched the stream since the last [`Follower::poll`] began.
    ///
    /// # Errors
    /// [`Error::Closed`] when the engine closes.
    pub async fn changed(&mut self) -> Result<()> {
        let Some(bell) = &self.bell else {
            return Err(Error::Closed);
        };
        if self.shared.followers.wait(bell, self.seen).await {
            Ok(())
        } else {
            Err(Error::Closed)
        }
    }

    /// The next non-empty batch after what was delivered, waiting for a commit if there is
    /// none yet (reading inline). `Ok(None)` once the terminal seq has been delivered.
    ///
    /// # Errors
    /// As [`Follower::poll`].
    pub async fn next_batch(&mut self, max_events: u32) -> Result<Option<Vec<Event>>> {
        loop {
            match self.poll(max_events)? {
                None => return Ok(None),
                Some(events) if !events.is_empty() => return Ok(Some(events)),
                Some(_) => self.changed().await?,
            }
        }
    }

    /// The seq of the last event delivered.
    pub fn position(&self) -> u64 {
        self.after
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        if let Some(bell) = self.bell.take() {
            self.shared
                .followers
                .unfollow(&self.session, self.stream, bell);
        }
        // The session's idle time starts now, not when the follow began.
        self.shared
            .activity
            .touch(&self.session, self.shared.now_ms());
    }
}
