//! The leader side of a replicated node's writer: a batch is planned exactly as a single
//! node plans it, then proposed instead of written (its groups merged into as few entries
//! as fit, see `sink.rs`), and each caller is answered from how its entries settled (see
//! `crate::propose`).
//!
//! Batches are pipelined: while up to [`IN_FLIGHT_MAX`] batches are in flight, the next is
//! planned against the state they will leave and proposed behind them. The batches planned
//! that way form a *window* sharing one overlay over the index (a batch's planned changes
//! are in it until the window ends, whether or not apply already put them in the index:
//! the index changes only by the window's own entries while this node leads), one group
//! buffer (a retry is matched against the events of the batches in flight), and LSN
//! predictions that run on from batch to batch. A window ends, and the next one starts
//! from the index once every batch in flight settled, when a group of it did not apply
//! (its plans are then stale), when the term changed, or when it grew past a bound (so its
//! overlay and buffer stay small; a window also ends whenever nothing is in flight).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::pipeline::{error_of, Answers, Batch, Pipeline, Planned, IN_FLIGHT_MAX};
use super::{drain, Sink, Writer, KEPT_BUFFER_BYTES_MAX};
use crate::error::Error;
use crate::index::{Index, Txn};
use crate::mailbox::{Command, Inbox, Request};

/// Most batches in one window.
const WINDOW_BATCHES_MAX: usize = 256;
/// The group buffer size past which a window ends (its frames, kept for retries).
const WINDOW_BYTES_MAX: usize = 16 << 20;

/// Batches planned one after another against one overlay (see the module's doc).
struct Window<'a> {
    txn: Txn<'a>,
    /// The frames of the window's batches, in order (retries are matched against them).
    buf: Vec<u8>,
    /// The term the window's batches were planned in.
    term: u64,
    batches: usize,
    /// Groups proposed in the window so far.
    groups: usize,
}

impl Writer {
    /// The replicated node's writer loop: gathers a batch, plans and proposes it (waiting
    /// only while [`IN_FLIGHT_MAX`] batches are in flight), until every sender is gone; then
    /// waits for the batches in flight to settle and closes.
    pub(super) fn run_pipelined(&mut self, rx: &Inbox) {
        let Sink::Proposals(proposals) = &self.log else {
            return self.run_loop(rx);
        };
        let pipeline = Arc::clone(&proposals.pipeline);
        let index = self.shared.index.clone();
        let mut window: Option<Window<'_>> = None;
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            drain(rx, &mut batch);
            // While the pipeline is full, requests queue and join this batch.
            pipeline.wait_below(IN_FLIGHT_MAX);
            // Every entry ends in `fdatasync`s: waiting for the producers the last batches
            // answered pays, as on a single node syncing always (see `gather`).
            let expected = self.producers.expected();
            self.gather(rx, &mut batch, expected);
            let bytes: u64 = batch.iter().map(|r| r.bytes).sum();
            if self.shared.poisoned.load(Ordering::Acquire) {
                self.fail_all(batch, || Error::Poisoned);
            } else {
                self.propose(batch, &index, &mut window, &pipeline);
            }
            self.shared.admission.give_back(bytes);
        }
        // Every batch in flight is answered before the writer closes.
        if let Some(w) = window.take() {
            self.keep_buffer(w.buf);
        }
        pipeline.start_window();
        if !self.shared.poisoned.load(Ordering::Acquire)
            && !self.shared.crashed.load(Ordering::Acquire)
        {
            if let Err(e) = self.shut_down() {
                tracing::error!(error = %e, "final flush on close failed");
                self.shared.poison(&e);
            }
        }
    }

    /// Plans `batch` in the current window (or a new one) and proposes its groups; its
    /// requests are answered once its entries settled (see `pipeline.rs`).
    fn propose<'a>(
        &mut self,
        batch: Vec<Request>,
        index: &'a Index,
        window: &mut Option<Window<'a>>,
        pipeline: &Arc<Pipeline>,
    ) {
        // A sync has nothing to wait for: an entry is durable before it is applied. It needs
        // no leadership either (a follower's engine closes with one).
        let (syncs, batch): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .partition(|r| matches!(r.cmd, Command::Sync));
        for r in syncs {
            r.reply.send(Ok(crate::mailbox::Reply::Done));
        }
        if batch.is_empty() {
            return;
        }
        let Sink::Proposals(proposals) = &mut self.log else {
            return self.fail_all(batch, || {
                Error::Internal("a single node's writer asked to propose".into())
            });
        };
        let proposer = Arc::clone(&proposals.proposer);
        let term = match proposer.prepare() {
            Ok(term) => term,
            Err(outcome) => return self.fail_all(batch, || error_of(&outcome)),
        };
        let ends = |w: &Window<'_>| {
            w.term != term
                || w.batches >= WINDOW_BATCHES_MAX
                || w.buf.len() >= WINDOW_BYTES_MAX
                || pipeline.len() == 0
                || pipeline.window_failed()
        };
        let mut w = match window.take() {
            Some(w) if !ends(&w) => w,
            ended => {
                if let Some(w) = ended {
                    self.keep_buffer(w.buf);
                }
                pipeline.start_window();
                let buf = self.start_group();
                if let Sink::Proposals(p) = &mut self.log {
                    p.start_window();
                }
                Window {
                    txn: Txn::new(index),
                    buf,
                    term,
                    batches: 0,
                    groups: 0,
                }
            }
        };
        if let Sink::Proposals(p) = &mut self.log {
            p.start_batch();
        }
        self.touched.clear();
        self.effects.clear();
        self.leased.clear();
        let mut planned: Vec<Planned> = Vec::with_capacity(batch.len());
        for Request { cmd, reply, .. } in batch {
            if matches!(cmd, Command::Retire { .. }) {
                reply.send(Err(Error::NotConfirmed(
                    "a replicated member retires segments when its log is purged, not on command"
                        .into(),
                )));
                continue;
            }
            let groups = w.groups + self.group_count();
            let (effects, leased) = (self.effects.len(), self.leased.len());
            let answer = self.plan(cmd, &mut w.txn, &mut w.buf);
            if self.overlay_broken || matches!(answer, Err(Error::Index(_))) {
                // The overlay may be half-applied: nothing of the batch is proposed, and the
                // window ends (the engine is poisoned: nothing is planned on it again).
                self.overlay_broken = false;
                self.log.rewind(self.log.next());
                self.disarm_group_leases();
                let e = match answer {
                    Err(e) => e,
                    Ok(_) => Error::Internal("a request half-applied to the index".into()),
                };
                self.poison(&e);
                reply.send(Err(e));
                for p in planned {
                    p.reply.send(Err(Error::Poisoned));
                }
                self.keep_buffer(w.buf);
                return;
            }
            // An error is a claim about the state planned against, held like any answer
            // until that state is known to stand (`pipeline.rs`).
            planned.push(Planned {
                reply,
                answer,
                groups: groups..w.groups + self.group_count(),
                effects: effects..self.effects.len(),
                leased: leased..self.leased.len(),
            });
        }
        let (entries, groups) = match &mut self.log {
            Sink::Proposals(p) => p.take(),
            Sink::Segments(_) => (Vec::new(), Vec::new()),
        };
        // The entries' groups, numbered from the window's first.
        let base = w.groups;
        w.groups += groups.last().map_or(0, |g| g.end);
        let groups = groups
            .into_iter()
            .map(|g| base + g.start..base + g.end)
            .collect();
        w.batches += 1;
        // Followers are woken by apply; the effects outside the index wait for the outcome.
        self.touched.clear();
        let settle = pipeline.push(Batch {
            planned,
            entries: groups,
            effects: std::mem::take(&mut self.effects),
            leased: std::mem::take(&mut self.leased),
            answers: Answers {
                shared: Arc::clone(&self.shared),
                acker: self.acker.clone(),
                in_flight: Arc::clone(&self.acks_in_flight),
            },
        });
        *window = Some(w);
        proposer.propose(entries, settle);
    }

    /// Keeps an ended window's group buffer (emptied) for the next one, unless it grew
    /// large.
    fn keep_buffer(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() <= KEPT_BUFFER_BYTES_MAX {
            buf.clear();
            self.buf = buf;
        }
    }

    /// The groups planned so far in this batch.
    fn group_count(&self) -> usize {
        match &self.log {
            Sink::Proposals(p) => p.len(),
            Sink::Segments(_) => 0,
        }
    }
}
