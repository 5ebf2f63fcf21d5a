//! Retention's share of the writer: carrying forward the states that live in segments about
//! to be retired, and forgetting what ended more than the metadata horizon ago. Both work in
//! bounded batches, one small group per state, so a retirement never needs much free space.

use super::Writer;
use crate::error::Result;
use crate::index::{ended_key, origin_key, parse_marker_key, KvRead, Marked, TaskRead, Txn};
use crate::record::{
    Record, SessionStateBody, StreamSnapshot, TaskForgotten, TaskRoutes, TaskSnapshot,
};
use crate::verdict::past_horizon;

impl Writer {
    /// Carries forward at most `limit` of the states born below `below_lsn`, each in a group
    /// of its own: a snapshot of what is still remembered, a forget record for what is past
    /// the metadata horizon. Returns how many it carried; 0 when none is left. Bounded, so a
    /// retirement never writes one huge group, and needs little free space at a time.
    pub(super) fn carry_forward(
        &mut self,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        below_lsn: u64,
        now: u64,
        limit: usize,
    ) -> Result<usize> {
        let horizon = self.shared.horizon_ms();
        let keys = self.shared.index.keys_in(
            &origin_key(0, 0, &[]),
            &origin_key(below_lsn, 0, &[]),
            limit,
        )?;
        let mut done = 0;
        for key in keys {
            let Some(marked) = parse_marker_key(&key) else {
                continue;
            };
            let records = match marked {
                Marked::Session(id) => {
                    let Some(s) = txn.stored_session(id)? else {
                        continue;
                    };
                    if past_horizon(s.meta.expired_at_ms, now, horizon) {
                        vec![Record::SessionForgotten {
                            session: id.to_owned(),
                            at_ms: now,
                        }]
                    } else {
                        let mut r = vec![Record::SessionSnapshot(s.meta)];
                        // The state lives as long as the session: carried with it.
                        if let Some(state) = txn.session_state(id)? {
                            r.push(Record::SessionState(SessionStateBody {
                                session: id.to_owned(),
                                state,
                                at_ms: now,
                            }));
                        }
                        r
                    }
                }
                Marked::Stream(id) => {
                    let Some(s) = txn.stored_stream(id)? else {
                        continue;
                    };
                    let m = s.meta;
                    if past_horizon(m.ended_at_ms, now, horizon) {
                        // Forgetting is a record too: a rebuild from the log must forget it
                        // as well, whatever of the stream is left in retained segments.
                        vec![Record::StreamForgotten {
                            stream: id,
                            at_ms: now,
                        }]
                    } else {
                        let terminal_frame = txn.terminal_frame(id)?;
                        vec![Record::StreamSnapshot(StreamSnapshot {
                            meta: m,
                            terminal_frame,
                        })]
                    }
                }
                Marked::Task(id) => {
                    let Some(t) = txn.stored_task(id)? else {
                        continue;
                    };
                    if past_horizon(t.meta.deleted_at_ms, now, horizon) {
                        vec![Record::TaskForgotten(TaskForgotten { id, at_ms: now })]
                    } else {
                        // Its whole content lives in the index and goes forward with it; its
                        // inbound routes in a record of their own after it (so the snapshot's
                        // body stays what format 3 wrote).
                        let routes = txn.task_routes(id, &t.meta.owner)?;
                        let mut r = vec![Record::TaskSnapshot(TaskSnapshot {
                            outcome: txn.task_outcome(id)?,
                            slots: txn.task_slots(id)?,
                            queues: txn.task_queues(id)?,
                            meta: t.meta,
                        })];
                        if !routes.is_empty() {
                            r.push(Record::TaskRoutes(TaskRoutes { id, routes }));
                        }
                        r
                    }
                }
            };
            self.emit(records, txn, buf)?;
            done += 1;
        }
        Ok(done)
    }

    /// Forgets at most `limit` sessions, streams and task tombstones that ended more than the metadata
    /// horizon ago (oldest first), each in a group of its own, wherever their records are:
    /// index entries, memory and carried-forward state go. Returns how many it forgot.
    pub(super) fn forget(
        &mut self,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
        limit: usize,
    ) -> Result<usize> {
        let horizon = self.shared.horizon_ms();
        let Some(cutoff) = now.checked_sub(horizon) else {
            return Ok(0);
        };
        let keys = self.shared.index.keys_in(
            &ended_key(0, 0, &[]),
            &ended_key(cutoff.saturating_add(1), 0, &[]),
            limit,
        )?;
        let mut done = 0;
        for key in keys {
            let record = match parse_marker_key(&key) {
                Some(Marked::Session(session)) => Record::SessionForgotten {
                    session: session.to_owned(),
                    at_ms: now,
                },
                Some(Marked::Stream(stream)) => Record::StreamForgotten { stream, at_ms: now },
                // A task's ended key is written when its content is deleted: its tombstone.
                Some(Marked::Task(id)) => Record::TaskForgotten(TaskForgotten { id, at_ms: now }),
                None => continue,
            };
            self.emit(vec![record], txn, buf)?;
            done += 1;
        }
        Ok(done)
    }
}
