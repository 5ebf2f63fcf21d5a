//! The producer side of a `Read` call: replay from the cursor in bounded batches, then
//! (with `follow`) deliver live events until the stream ends, pushing messages into the
//! call's pipe, bounded in bytes ([`crate::read_pipe`]). It reads from the log only as much
//! as the pipe has room for, so a client that stops reading pauses its call at the cost of
//! one small buffer, and is fed from the log when it reads again. It holds the call's
//! [`ReadSlot`] until it ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cursorlog_engine::{self as engine, Cursor, Engine, Verdict};
use cursorlog_proto::v1 as pb;
use tokio::sync::watch;
use tonic::Status;

use crate::convert;
use crate::metrics::Metrics;
use crate::read_pipe::PipeTx;
use crate::read_slots::ReadSlot;
use crate::service::{run_blocking, run_engine, shutting_down};
use crate::status;

/// The producer side of one Read call: replays, then optionally follows, pushing messages
/// into a bounded channel. It stops as soon as a send fails (the client has gone), the client
/// disconnects while it waits, or the server shuts down.
pub(crate) struct Reader {
    /// This call's place under `--read-calls-max`, freed when the producer ends.
    pub(crate) _slot: ReadSlot,
    pub(crate) engine: Engine,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) tx: PipeTx,
    pub(crate) session: String,
    pub(crate) batch_events_max: u32,
    pub(crate) batch_bytes_max: usize,
    /// The largest event sent so far, in wire bytes (0 before the first): how many events
    /// fit the pipe's room is estimated from it.
    pub(crate) largest_event: AtomicUsize,
    /// The cluster member serving the call, if any: a follow ends when it stops leading.
    pub(crate) cluster: Option<cursorlog_replication::ReplicatedNode>,
}

/// Resolves when `cluster`'s member stops leading; never on a single node.
pub(crate) async fn deposed(cluster: Option<&cursorlog_replication::ReplicatedNode>) {
    match cluster {
        Some(node) => node.stopped_leading().await,
        None => std::future::pending().await,
    }
}

/// The size counted for a message that carries no events.
const CONTROL_MESSAGE_BYTES: usize = 64;

/// How much the next read from the log may bring.
#[derive(Debug, Clone, Copy)]
struct Budget {
    /// Events to ask for.
    events: u32,
    /// Bytes of events to keep (the pipe's room); always at least one event.
    bytes: usize,
}

impl Budget {
    /// How many of `events`, from the first, to keep.
    fn fits(&self, events: &[engine::Event]) -> usize {
        let mut used = 0_usize;
        events
            .iter()
            .enumerate()
            .take_while(|(i, e)| {
                used += convert::event_wire_bytes(e);
                used <= self.bytes || *i == 0
            })
            .count()
    }
}

/// Why a Read producer stopped early.
enum Stop {
    /// The client went away; nothing more can be sent.
    ClientGone,
}

impl Reader {
    /// Delivers what `resolution` allows, then ends (dropping the slot).
    pub(crate) async fn run(
        mut self,
        resolution: engine::Resolution,
        follow: bool,
        resume_own: bool,
    ) {
        let first = pb::read_response::Item::Resolution(convert::resolution(&resolution));
        if self.send(Ok(first)).await.is_err() {
            return;
        }
        let Some(cursor) = resolution.cursor else {
            return;
        };
        // What the verdict delivers: RESUMABLE always; to a client resuming its own stream,
        // also the missed end of a finished stream and the retained rest of an evicted one.
        let follow = match resolution.verdict {
            Verdict::Resumable => follow,
            Verdict::StreamTerminated if resume_own && resolution.missed_terminal_frame() => false,
            Verdict::CursorEvicted if resume_own => follow,
            _ => return,
        };
        if let Err(Stop::ClientGone) = self.replay_and_follow(cursor, follow, resume_own).await {
            tracing::debug!(stream = cursor.stream, "read: client went away");
        }
    }

    /// Replays from `cursor` until caught up, then (with `follow`) delivers live events until
    /// the stream ends. With `resume_own`, evicted events on the way are reported as a gap
    /// and delivery goes on after them.
    async fn replay_and_follow(
        &mut self,
        cursor: Cursor,
        follow: bool,
        resume_own: bool,
    ) -> Result<(), Stop> {
        let Cursor {
            epoch,
            stream,
            seq: mut after,
        } = cursor;
        'deliver: loop {
            // Replay what is stored, in bounded reads, until caught up with the head; each
            // read starts where the one before stopped (not at the start of its run).
            let mut position = None;
            loop {
                let session = self.session.clone();
                let budget = self.budget().await?;
                let max = budget.events;
                // A read from a position, or of one event, reads only about what it keeps
                // (`ReadPosition`): its events may share the buffer they were read into.
                let sized = position.is_some() || max == 1;
                let read = run_engine(&self.engine, move |e| {
                    e.read_from(&session, stream, after, max, position)
                });
                let mut batch = match read.await {
                    Ok(Ok(batch)) => batch,
                    Ok(Err(engine::Error::Evicted { watermark, .. })) if resume_own => {
                        after = self.skip_gap(epoch, stream, after, watermark).await?;
                        position = None;
                        continue;
                    }
                    Ok(Err(err)) => return self.send(Err(status::from_engine(&err))).await,
                    Err(status) => return self.send(Err(status)).await,
                };
                // Keep what the pipe has room for; the rest is read again next time.
                let fits = budget.fits(&batch.events);
                position = batch.next;
                if fits < batch.events.len() {
                    batch.events.truncate(fits);
                    batch.end_of_stream = false;
                    position = None;
                }
                let caught_up = batch.events.is_empty()
                    || batch.events.last().is_some_and(|e| e.seq >= batch.head);
                if let Some(last) = batch.events.last() {
                    after = last.seq;
                }
                self.send_events(epoch, batch.events, !sized).await?;
                if batch.end_of_stream {
                    return self.send_end(epoch, stream, after).await;
                }
                if caught_up {
                    break;
                }
            }
            if !follow {
                return Ok(());
            }
            // Caught up: from now on the call holds at most the follow buffer for a client
            // that stops reading (it waits here until its client read what no longer fits).
            self.tx
                .narrow_to_follow()
                .await
                .map_err(|_| Stop::ClientGone)?;
            let _guard = self.metrics.follower();
            let session = self.session.clone();
            let follower = run_blocking(&self.engine, move |e| e.follow(&session, stream, after));
            let mut follower = match follower.await {
                Ok(f) => f,
                Err(status) => return self.send(Err(status)).await,
            };
            loop {
                // Catch up off the async workers: the read runs on the blocking pool; no more
                // than the pipe has room for (waiting, paused, while the client is not reading).
                let budget = self.budget().await?;
                let polled = tokio::task::spawn_blocking(move || {
                    let mut used = 0_usize;
                    let batch = follower.poll_while(budget.events, |event| {
                        used += convert::event_wire_bytes(event);
                        used <= budget.bytes
                    });
                    (follower, batch)
                })
                .await;
                let batch = match polled {
                    Ok((f, batch)) => {
                        follower = f;
                        batch
                    }
                    Err(join) => {
                        tracing::error!(error = %join, "follower read panicked");
                        return self
                            .send(Err(Status::internal(
                                "follower read panicked; the server log has the details",
                            )))
                            .await;
                    }
                };
                match batch {
                    Ok(Some(events)) if !events.is_empty() => {
                        if let Some(last) = events.last() {
                            after = last.seq;
                        }
                        self.send_events(epoch, events, true).await?;
                        continue;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return self.send_end(epoch, stream, after).await,
                    Err(engine::Error::Evicted { watermark, .. }) if resume_own => {
                        after = self.skip_gap(epoch, stream, after, watermark).await?;
                        continue 'deliver;
                    }
                    Err(engine::Error::Closed) => return self.shut_down(),
                    Err(err) => return self.send(Err(status::from_engine(&err))).await,
                }
                // Nothing new: wait, at no cost, until a commit touches the stream.
                tokio::select! {
                    () = self.tx.closed() => return Err(Stop::ClientGone),
                    () = shutting_down(&mut self.shutdown) => return self.shut_down(),
                    () = deposed(self.cluster.as_ref()) => return self.deposed().await,
                    changed = follower.changed() => {
                        if changed.is_err() {
                            return self.shut_down();
                        }
                    }
                }
            }
        }
    }

    /// This member stopped leading: the follow ends with `UNAVAILABLE` naming the new
    /// leader (when known), where the client resumes after the last event it received.
    async fn deposed(&self) -> Result<(), Stop> {
        let leader = self.cluster.as_ref().and_then(|c| c.leader_addr());
        let status = crate::cluster::retry_is(
            crate::cluster::with_leader(
                Status::unavailable(match &leader {
                    Some(l) => format!("this member stopped leading: resume after your last event on the leader at {l}"),
                    None => "this member stopped leading: resume after your last event on the new leader".into(),
                }),
                leader.as_deref(),
            ),
            crate::cluster::Retry::Safe,
        );
        self.send(Err(status)).await
    }

    /// The server (or the engine) is shutting down: tell the client, best effort (a client
    /// that is not reading does not delay the shutdown).
    fn shut_down(&self) -> Result<(), Stop> {
        self.tx
            .send_now(Err(Status::unavailable("server is shutting down")));
        Ok(())
    }

    /// What to read next: as many events as the pipe has room for, estimated from the
    /// largest event sent so far (one before any was sent, and at least one), and the room
    /// itself, which bounds what is kept of the read. Waits, paused, until the client has read
    /// at least half of what the pipe holds.
    async fn budget(&self) -> Result<Budget, Stop> {
        let bytes = self.tx.room().await.map_err(|_| Stop::ClientGone)?;
        let largest = self.largest_event.load(Ordering::Relaxed);
        let fit = match largest {
            0 => 1,
            n => u32::try_from(bytes / n).unwrap_or(u32::MAX),
        };
        Ok(Budget {
            events: fit.clamp(1, self.batch_events_max.max(1)),
            bytes,
        })
    }

    /// Events `after + 1 .. watermark` were evicted: says so with a `gap`, except that a
    /// terminal frame among them is still delivered (from the outcome: "state as truth").
    /// Returns the seq delivery continues after.
    async fn skip_gap(
        &self,
        epoch: u64,
        stream: u64,
        after: u64,
        watermark: u64,
    ) -> Result<u64, Stop> {
        let last_gone = watermark.saturating_sub(1).max(after);
        let session = self.session.clone();
        let outcome = run_blocking(&self.engine, move |e| e.stream_outcome(&session, stream));
        let frame = match outcome.await {
            Ok(o) => o.and_then(|o| o.frame),
            Err(status) => {
                self.send(Err(status)).await?;
                return Err(Stop::ClientGone);
            }
        };
        let frame = frame.filter(|f| f.seq > after && f.seq <= last_gone);
        let gap_end = frame.as_ref().map_or(last_gone, |f| f.seq - 1);
        if gap_end > after {
            let gap = pb::EvictedGap {
                first_seq: after + 1,
                last_seq: gap_end,
            };
            self.send(Ok(pb::read_response::Item::Gap(gap))).await?;
        }
        match frame {
            Some(f) => {
                let seq = f.seq;
                self.send_events(epoch, vec![f], true).await?;
                Ok(seq)
            }
            None => Ok(last_gone),
        }
    }

    /// Sends `events` as one or more batches, each below the message size budget; with
    /// `copy`, each payload in its own buffer.
    async fn send_events(
        &self,
        epoch: u64,
        events: Vec<engine::Event>,
        copy: bool,
    ) -> Result<(), Stop> {
        let mut batch = Vec::with_capacity(events.len());
        let mut batch_bytes = 0_usize;
        for event in events {
            let bytes = convert::event_wire_bytes(&event);
            self.largest_event.fetch_max(bytes, Ordering::Relaxed);
            if !batch.is_empty() && batch_bytes + bytes > self.batch_bytes_max {
                let full = std::mem::take(&mut batch);
                let full_bytes = std::mem::take(&mut batch_bytes);
                let item = pb::read_response::Item::Events(pb::EventBatch { events: full });
                self.send_sized(Ok(item), full_bytes).await?;
            }
            batch_bytes += bytes;
            // A payload read from the log shares its read window with the events read
            // beside it. A window of a whole read-ahead (256 KiB) is copied out of, so a
            // message waiting in the pipe for a client that stopped reading holds its own
            // bytes only; a window sized for the read (about what the pipe had room for) is
            // shared as it is.
            let event = if copy {
                engine::Event {
                    payload: event.payload.to_vec().into(),
                    ..event
                }
            } else {
                event
            };
            batch.push(convert::event(epoch, event));
        }
        if !batch.is_empty() {
            let item = pb::read_response::Item::Events(pb::EventBatch { events: batch });
            self.send_sized(Ok(item), batch_bytes).await?;
        }
        Ok(())
    }

    /// Sends the `end` message once the stream is terminal, with its state and reason.
    async fn send_end(&self, epoch: u64, stream: u64, last_seq: u64) -> Result<(), Stop> {
        // The stream's own state, whatever has happened to the session since.
        let session = self.session.clone();
        let read = run_blocking(&self.engine, move |e| e.read(&session, stream, last_seq, 1));
        let batch = match read.await {
            Ok(batch) => batch,
            Err(status) => return self.send(Err(status)).await,
        };
        if !batch.state.is_terminal() {
            return Ok(());
        }
        // The reason is a fact of the verdict for the stream's last event.
        let session = self.session.clone();
        let cursor = Cursor::new(epoch, stream, batch.head).to_string();
        let resolved = run_blocking(&self.engine, move |e| e.resolve(&session, &cursor, None));
        let resolution = match resolved.await {
            Ok(r) => r,
            Err(status) => return self.send(Err(status)).await,
        };
        let facts = resolution.facts;
        let reason = match resolution.verdict {
            Verdict::StreamTerminated => facts.detail,
            Verdict::EpochMismatch => facts
                .current_epoch
                .map(|e| format!("session epoch advanced to {e}")),
            Verdict::UnknownSession if facts.session_expired => Some("session expired".into()),
            _ => None,
        };
        let end = pb::StreamEnd {
            state: convert::stream_state(batch.state).into(),
            terminal_seq: batch.head,
            terminal_event_id: Cursor::new(epoch, stream, batch.head).to_string(),
            reason,
        };
        self.send(Ok(pb::read_response::Item::End(end))).await
    }

    async fn send(&self, item: Result<pb::read_response::Item, Status>) -> Result<(), Stop> {
        self.send_sized(item, CONTROL_MESSAGE_BYTES).await
    }

    /// Sends a message of about `bytes` bytes, waiting (paused) for room in the pipe.
    async fn send_sized(
        &self,
        item: Result<pb::read_response::Item, Status>,
        bytes: usize,
    ) -> Result<(), Stop> {
        let message = item.map(|item| pb::ReadResponse { item: Some(item) });
        self.tx
            .send(message, bytes)
            .await
            .map_err(|_| Stop::ClientGone)
    }
}
