//! The read side: verdicts, bounded reads, live followers and outcomes. Nothing here takes
//! the writer's lock: it reads the committed index and the segments (maps when sealed).

use crate::api::{Event, Outcome, ReadBatch};
use crate::engine::Engine;
use crate::error::{CorruptionKind, Error, Result};
use crate::index::KvRead;
use crate::log::Position;
use crate::record::{decode_frame, FrameError, Record};
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
        let positions = self.inner.shared.index.positions_from(stream, from, max)?;
        let mut events = Vec::with_capacity(positions.len());
        for (i, (seq, pos)) in positions.into_iter().enumerate() {
            if seq != from + i as u64 || seq > meta.head {
                break;
            }
            events.push(read_at(&self.inner.shared, stream, seq, pos)?);
        }
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
        let Ok(meta) = self.owned_stream(session, stream) else {
            return Ok(None);
        };
        let frame = if meta.has_terminal_frame {
            index.terminal_frame(stream)?.map(|b| Event {
                stream,
                seq: b.seq,
                kind: b.kind,
                correlation: b.correlation,
                payload: b.payload,
                appended_at_ms: b.at_ms,
            })
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

/// Reads and checks the stored event `seq` of `stream` at `pos`.
fn read_at(shared: &Shared, stream: u64, seq: u64, pos: Position) -> Result<Event> {
    let Some(seg) = shared.segments.get(pos.segment) else {
        return Err(missing_segment(shared, stream, seq, pos.segment));
    };
    let decoded = seg.with_bytes(pos.offset, u64::from(pos.len), decode_frame)?;
    let corrupt = |kind| Error::Corruption {
        segment: seg.path().to_path_buf(),
        offset: pos.offset,
        kind,
    };
    let frame = decoded.map_err(|e| {
        corrupt(match e {
            FrameError::Crc { got, expected } => CorruptionKind::Crc { got, expected },
            FrameError::BadBody(b) => CorruptionKind::BadBody(b),
            FrameError::BadLength(n) => CorruptionKind::BadLength(n),
            FrameError::Truncated => CorruptionKind::BadLength(u64::from(pos.len)),
        })
    })?;
    let body = match frame.record {
        Record::Event(b) => b,
        Record::Terminal(t) => t.frame.ok_or_else(|| {
            corrupt(CorruptionKind::BadBody(
                "terminal record without a frame".into(),
            ))
        })?,
        _ => {
            return Err(corrupt(CorruptionKind::BadBody(
                "index points at a non-event record".into(),
            )))
        }
    };
    if body.stream != stream || body.seq != seq {
        return Err(corrupt(CorruptionKind::BadBody(format!(
            "index points at {}/{} for {stream}/{seq}",
            body.stream, body.seq
        ))));
    }
    Ok(Event {
        stream,
        seq,
        kind: body.kind,
        correlation: body.correlation,
        payload: body.payload,
        appended_at_ms: body.at_ms,
    })
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
    match shared.index.position(stream, seq)? {
        Some(pos) => read_at(shared, stream, seq, pos).map(Some),
        None => Ok(None),
    }
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
