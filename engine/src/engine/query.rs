//! The read side of the facade: verdicts, reads, live followers, outcomes. Each renews the
//! idle TTL of the session it names; none goes through the writer.

use crate::api::{Outcome, ReadBatch};
use crate::error::{Error, Result};
use crate::index::KvRead;
use crate::read::Follower;
use crate::verdict::Resolution;

use super::Engine;

impl Engine {
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
        self.touch(session);
        crate::read::resolve(&self.inner.shared, session, cursor, declared_stream)
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
        self.read_from(session, stream, after_seq, max_events, None)
    }

    /// [`Engine::read`], starting at `from` (a [`ReadBatch::next`] of the read before, which
    /// ended at `after_seq`) rather than walking the run of frames holding the next event from
    /// its start. A position that does not fit (another stream or seq, a retired segment, a
    /// frame that does not check) is ignored: the answer is the same as without it.
    ///
    /// # Errors
    /// As [`Engine::read`].
    pub fn read_from(
        &self,
        session: &str,
        stream: u64,
        after_seq: u64,
        max_events: u32,
        from: Option<crate::ReadPosition>,
    ) -> Result<ReadBatch> {
        self.touch(session);
        crate::read::read(
            &self.inner.shared,
            session,
            stream,
            after_seq,
            max_events,
            from,
        )
    }

    /// A live reader of `stream` after `after_seq`, woken only by commits that touch the
    /// stream. While it lives its session does not expire idle.
    ///
    /// # Errors
    /// As [`Engine::read`] for the first position; [`Error::Closed`] after close.
    pub fn follow(&self, session: &str, stream: u64, after_seq: u64) -> Result<Follower> {
        let shared = &self.inner.shared;
        if shared.followers.is_closed() {
            return Err(Error::Closed);
        }
        let meta = crate::read::owned_stream(shared, session, stream)?;
        if after_seq.saturating_add(1) < meta.watermark {
            return Err(Error::Evicted {
                stream,
                seq: after_seq + 1,
                watermark: meta.watermark,
            });
        }
        self.touch(session);
        Ok(Follower::new(
            std::sync::Arc::clone(shared),
            session,
            stream,
            after_seq,
        ))
    }

    /// The outcome of the stream answering `correlation` in `session`.
    ///
    /// # Errors
    /// Index failures.
    pub fn outcome(&self, session: &str, correlation: &str) -> Result<Option<Outcome>> {
        let Some(stream) = self
            .inner
            .shared
            .index
            .outcome_stream(session, correlation)?
        else {
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
        self.touch(session);
        crate::read::stream_outcome(&self.inner.shared, session, stream)
    }
}
