//! Derives index state from one record. The writer (live) and recovery (replay) both call
//! [`apply`], so the index a crash rebuilds is the index the live engine had.
//!
//! Application is blind: validation happened before the record was written, and replay of a
//! log whose oldest segments were retired may meet events of a stream whose state arrives
//! later in a snapshot record.

use crate::error::Result;
use crate::index::{
    ended_key, event_key, open_stream_key, origin_key, outcome_key, session_key, session_state_key,
    stream_key, terminal_frame_key, Counts, KvRead, StoredSession, StoredStream, Txn,
    ORIGIN_SESSION, ORIGIN_STREAM,
};
use crate::log::Position;
use crate::record::{Record, StreamSnapshot};
use crate::state::{SessionMeta, StreamMeta, StreamState};

mod task;

/// Applies `record`, written at `lsn` and `pos`, to the pending index state.
pub(crate) fn apply(
    txn: &mut Txn<'_>,
    lsn: u64,
    pos: Position,
    record: &Record,
    continues_run: bool,
) -> Result<()> {
    match record {
        Record::SessionOpened {
            session,
            epoch,
            at_ms,
        } => {
            let meta = SessionMeta {
                id: session.clone(),
                epoch: *epoch,
                opened_at_ms: *at_ms,
                expired_at_ms: None,
            };
            put_session(txn, meta, lsn)?;
        }
        Record::EpochAdvanced { session, epoch, .. } => {
            if let Some(mut s) = txn.stored_session(session)? {
                s.meta.epoch = s.meta.epoch.max(*epoch);
                txn.put_session(&s);
            }
        }
        Record::SessionExpired { session, at_ms } => {
            if let Some(mut s) = txn.stored_session(session)? {
                if s.meta.expired_at_ms.is_none() {
                    s.meta.expired_at_ms = Some(*at_ms);
                    txn.put_raw(
                        ended_key(*at_ms, ORIGIN_SESSION, session.as_bytes()),
                        Vec::new(),
                    );
                    txn.count(Counts {
                        live_sessions: -1,
                        ..Counts::default()
                    });
                    txn.put_session(&s);
                }
            }
        }
        Record::SessionSnapshot(meta) => put_session(txn, meta.clone(), lsn)?,
        Record::StreamOpened(o) => {
            let meta = StreamMeta {
                id: o.stream,
                session: o.session.clone(),
                epoch: o.epoch,
                state: StreamState::Open,
                head: 0,
                watermark: 1,
                correlation: o.correlation.clone(),
                opened_at_ms: o.at_ms,
                ended_at_ms: None,
                end_reason: None,
                has_terminal_frame: false,
                lease_ms: o.lease_ms,
            };
            put_stream(
                txn,
                StreamSnapshot {
                    meta,
                    terminal_frame: None,
                },
                lsn,
            )?;
        }
        Record::StreamSnapshot(snap) => put_stream(txn, snap.clone(), lsn)?,
        Record::Event(e) => {
            if !continues_run {
                txn.put_position(e.stream, e.seq, pos);
            }
            txn.raise_head(e.stream, e.seq)?;
        }
        Record::Terminal(t) => {
            if let Some(frame) = &t.frame {
                if !continues_run {
                    txn.put_position(t.stream, t.terminal_seq, pos);
                }
                txn.put_terminal_frame(frame);
            }
            if let Some(mut s) = txn.stored_stream(t.stream)? {
                if !s.meta.state.is_terminal() {
                    s.meta.state = t.state;
                    s.meta.head = t.terminal_seq;
                    s.meta.ended_at_ms = Some(t.at_ms);
                    s.meta.end_reason.clone_from(&t.reason);
                    s.meta.has_terminal_frame = t.frame.is_some();
                    txn.remove_raw(open_stream_key(&s.meta.session, t.stream));
                    txn.put_raw(
                        ended_key(t.at_ms, ORIGIN_STREAM, &t.stream.to_be_bytes()),
                        Vec::new(),
                    );
                    txn.count(Counts {
                        open_streams: -1,
                        ..Counts::default()
                    });
                    txn.put_stream(&s);
                }
            }
        }
        Record::StreamForgotten { stream, .. } => {
            if let Some(s) = txn.stored_stream(*stream)? {
                let m = s.meta;
                txn.remove_raw(open_stream_key(&m.session, m.id));
                if let Some(c) = &m.correlation {
                    if txn.outcome_stream(&m.session, c)? == Some(m.id) {
                        txn.remove_raw(outcome_key(&m.session, c));
                    }
                }
                txn.remove_raw(origin_key(s.origin_lsn, ORIGIN_STREAM, &m.id.to_be_bytes()));
                if let Some(ended) = m.ended_at_ms {
                    txn.remove_raw(ended_key(ended, ORIGIN_STREAM, &m.id.to_be_bytes()));
                }
                txn.count(Counts {
                    streams: -1,
                    open_streams: -i64::from(!m.state.is_terminal()),
                    ..Counts::default()
                });
            }
            txn.remove_raw(stream_key(*stream).to_vec());
            txn.remove_raw(terminal_frame_key(*stream).to_vec());
            remove_positions(txn, *stream, 0, u64::MAX)?;
        }
        Record::SessionForgotten { session, .. } => {
            if let Some(s) = txn.stored_session(session)? {
                txn.remove_raw(origin_key(s.origin_lsn, ORIGIN_SESSION, session.as_bytes()));
                if let Some(expired) = s.meta.expired_at_ms {
                    txn.remove_raw(ended_key(expired, ORIGIN_SESSION, session.as_bytes()));
                }
                txn.count(Counts {
                    sessions: -1,
                    live_sessions: -i64::from(s.meta.expired_at_ms.is_none()),
                    ..Counts::default()
                });
            }
            txn.remove_raw(session_key(session));
            txn.remove_raw(session_state_key(session));
        }
        Record::Shutdown { .. } | Record::Blank | Record::Membership { .. } => {}
        Record::TaskCreated(c) => task::created(txn, lsn, c)?,
        Record::TaskUpdated(u) => task::updated(txn, u)?,
        Record::TaskInputRequested(r) => task::input_requested(txn, r)?,
        Record::TaskInputAnswered(a) => task::input_answered(txn, a)?,
        Record::TaskCancelRequested(c) => task::cancel_requested(txn, c.id, c.version, c.at_ms)?,
        Record::TaskEnded(e) => task::ended(txn, e)?,
        Record::TaskQueued(q) => task::queued(txn, q)?,
        Record::TaskDequeued(d) => task::dequeued(txn, d)?,
        Record::TaskDeleted(d) => task::deleted(txn, d)?,
        Record::TaskSnapshot(s) => task::snapshot(txn, lsn, s)?,
        Record::TaskForgotten(f) => task::forgotten(txn, f.id)?,
        Record::TaskRoutes(r) => task::routes(txn, r)?,
        Record::SessionState(b) => {
            if b.state.is_empty() {
                txn.remove_raw(session_state_key(&b.session));
            } else {
                txn.put_raw(session_state_key(&b.session), b.state.clone());
            }
        }
        Record::Trim {
            stream, watermark, ..
        } => {
            match txn.stored_stream(*stream)? {
                Some(mut s) if s.meta.watermark < *watermark => {
                    s.meta.watermark = *watermark;
                    txn.put_stream(&s);
                }
                Some(_) => return Ok(()),
                None => {}
            }
            trim_runs(txn, *stream, *watermark)?;
        }
    }
    Ok(())
}

/// Removes the run starts of `stream` below `watermark`, except the last one: its run may
/// continue at or above the watermark, and reads find events through their run's start.
/// (Retiring its segment removes it later, see [`drop_runs_in`].)
fn trim_runs(txn: &mut Txn<'_>, stream: u64, watermark: u64) -> Result<()> {
    let mut below = txn.raw_range_keys(&event_key(stream, 0), &event_key(stream, watermark))?;
    below.pop();
    for k in below {
        txn.remove_raw(k);
    }
    Ok(())
}

/// Removes `stream`'s run starts that point into the segments `bases` (being retired): only
/// runs wholly below the watermark can be there.
pub(crate) fn drop_runs_in(txn: &mut Txn<'_>, stream: u64, bases: &[u64]) -> Result<()> {
    for (k, v) in txn.raw_scan(&event_key(stream, 0)[..9])? {
        if Position::decode(&v).is_some_and(|p| bases.contains(&p.segment)) {
            txn.remove_raw(k);
        }
    }
    Ok(())
}

/// Removes index entries of `stream`'s events with `from <= seq < to`.
pub(crate) fn remove_positions(txn: &mut Txn<'_>, stream: u64, from: u64, to: u64) -> Result<()> {
    if from >= to {
        return Ok(());
    }
    for k in txn.raw_range_keys(&event_key(stream, from), &event_key(stream, to))? {
        txn.remove_raw(k);
    }
    Ok(())
}

fn put_session(txn: &mut Txn<'_>, meta: SessionMeta, lsn: u64) -> Result<()> {
    let old = txn.stored_session(&meta.id)?;
    let was_live = old.as_ref().is_some_and(|o| o.meta.expired_at_ms.is_none());
    if let Some(old) = &old {
        txn.remove_raw(origin_key(
            old.origin_lsn,
            ORIGIN_SESSION,
            meta.id.as_bytes(),
        ));
        if let Some(t) = old.meta.expired_at_ms {
            txn.remove_raw(ended_key(t, ORIGIN_SESSION, meta.id.as_bytes()));
        }
    }
    if let Some(t) = meta.expired_at_ms {
        txn.put_raw(ended_key(t, ORIGIN_SESSION, meta.id.as_bytes()), Vec::new());
    }
    txn.count(Counts {
        sessions: i64::from(old.is_none()),
        live_sessions: i64::from(meta.expired_at_ms.is_none()) - i64::from(was_live),
        ..Counts::default()
    });
    txn.put_raw(
        origin_key(lsn, ORIGIN_SESSION, meta.id.as_bytes()),
        Vec::new(),
    );
    txn.put_session(&StoredSession {
        meta,
        origin_lsn: lsn,
    });
    Ok(())
}

fn put_stream(txn: &mut Txn<'_>, snap: StreamSnapshot, lsn: u64) -> Result<()> {
    let meta = snap.meta;
    let id = meta.id.to_be_bytes();
    let old = txn.stored_stream(meta.id)?;
    let was_open = old.as_ref().is_some_and(|o| !o.meta.state.is_terminal());
    if let Some(old) = &old {
        txn.remove_raw(origin_key(old.origin_lsn, ORIGIN_STREAM, &id));
        if let Some(t) = old.meta.ended_at_ms {
            txn.remove_raw(ended_key(t, ORIGIN_STREAM, &id));
        }
    }
    if let Some(t) = meta.ended_at_ms {
        txn.put_raw(ended_key(t, ORIGIN_STREAM, &id), Vec::new());
    }
    txn.count(Counts {
        streams: i64::from(old.is_none()),
        open_streams: i64::from(!meta.state.is_terminal()) - i64::from(was_open),
        ..Counts::default()
    });
    txn.put_raw(origin_key(lsn, ORIGIN_STREAM, &id), Vec::new());
    if let Some(c) = &meta.correlation {
        // The newest stream answering a correlation id is its outcome. A snapshot of an
        // older stream, carried forward when its segment retires, must not take it back.
        let newer_exists = txn
            .outcome_stream(&meta.session, c)?
            .is_some_and(|current| current > meta.id);
        if !newer_exists {
            txn.put_raw(
                outcome_key(&meta.session, c),
                meta.id.to_le_bytes().to_vec(),
            );
        }
    }
    if meta.state.is_terminal() {
        txn.remove_raw(open_stream_key(&meta.session, meta.id));
    } else {
        txn.put_raw(open_stream_key(&meta.session, meta.id), Vec::new());
    }
    if let Some(frame) = &snap.terminal_frame {
        txn.put_terminal_frame(frame);
    }
    txn.put_stream(&StoredStream {
        meta,
        origin_lsn: lsn,
    });
    Ok(())
}
