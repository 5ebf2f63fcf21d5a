//! The writer's mailbox: the requests it takes, the answers it gives, and admission.
//!
//! Admission is bounded in bytes, not requests: a request waits before entering the queue
//! while the requests queued and in the writer's current group hold more than
//! `writer_queue_bytes_max` (one request is always admitted into an empty queue, whatever
//! its size). Blocking callers wait on a condition variable; async callers await a
//! notification and never block a runtime worker.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Condvar, Mutex, PoisonError};

use crate::api::{
    Append, Appended, EpochAdvanced, NewEvent, OpenStream, SessionExpired, SessionInfo, StreamInfo,
    Terminated,
};
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::state::StreamState;

/// A request to the writer.
#[derive(Debug)]
pub(crate) enum Command {
    OpenSession {
        session: String,
        /// Stored with a session this creates (ignored for an existing one).
        state: Option<Vec<u8>>,
    },
    SetSessionState {
        session: String,
        state: Vec<u8>,
    },
    AdvanceEpoch(String),
    /// Expire a session (explicitly, or after its idle TTL: `idle_ms` says how long it was
    /// idle, for the tombstones' reason).
    ExpireSession {
        session: String,
        idle_ms: Option<u64>,
    },
    OpenStream(OpenStream),
    Append(Append),
    Terminate {
        session: Option<String>,
        stream: u64,
        state: StreamState,
        expected_next_seq: Option<u64>,
        reason: Option<String>,
        frame: Option<NewEvent>,
    },
    Trim {
        session: Option<String>,
        stream: u64,
        watermark: u64,
    },
    /// Carry forward (snapshot, or forget past the horizon) at most `limit` of the states
    /// born below `below_lsn`, in one group. Answers how many are left.
    CarryForward {
        below_lsn: u64,
        limit: usize,
    },
    /// Forget at most `limit` sessions and streams that ended more than the metadata
    /// horizon ago, in one group. Answers how many were forgotten.
    Forget {
        limit: usize,
    },
    /// Retire the segments `bases` (the oldest), once nothing born below `below_lsn` is left
    /// to carry forward; drops the run starts of `streams` that point into them.
    Retire {
        below_lsn: u64,
        bases: Vec<u64>,
        streams: Vec<u64>,
    },
    Sync,
}

impl Command {
    /// What the request costs the queue, in bytes (an estimate of its memory).
    pub(crate) fn admission_bytes(&self) -> u64 {
        const BASE: u64 = 256;
        match self {
            Self::Append(a) => {
                BASE + a
                    .events
                    .iter()
                    .map(|e| {
                        64 + e.payload.len() as u64
                            + e.kind.len() as u64
                            + e.correlation.as_ref().map_or(0, |c| c.len() as u64)
                    })
                    .sum::<u64>()
            }
            Self::Terminate { frame: Some(f), .. } => BASE + f.payload.len() as u64,
            Self::OpenSession { state: Some(s), .. } => BASE + s.len() as u64,
            Self::SetSessionState { state, .. } => BASE + state.len() as u64,
            _ => BASE,
        }
    }
}

/// The writer's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Session(SessionInfo),
    Epoch(EpochAdvanced),
    Expired(SessionExpired),
    Stream(StreamInfo),
    Appended(Appended),
    Terminated(Terminated),
    Watermark(u64),
    /// How many items a carry-forward or forget pass left or did.
    Count(usize),
    Done,
}

/// Where the writer sends a request's answer: a blocked thread, or an awaiting task.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    Blocking(SyncSender<Result<Reply>>),
    Async(tokio::sync::oneshot::Sender<Result<Reply>>),
}

impl ReplyTo {
    /// Delivers the answer; a caller that has gone away is no error (the request was
    /// carried out either way).
    pub(crate) fn send(self, reply: Result<Reply>) {
        match self {
            Self::Blocking(tx) => {
                let _ = tx.send(reply);
            }
            Self::Async(tx) => {
                let _ = tx.send(reply);
            }
        }
    }
}

/// A queued request: the command, where to answer, and the bytes it holds of the budget.
#[derive(Debug)]
pub(crate) struct Request {
    pub cmd: Command,
    pub reply: ReplyTo,
    pub bytes: u64,
}

/// The sending side of the mailbox.
pub(crate) type Mailbox = Sender<Request>;
/// The writer's side.
pub(crate) type Inbox = Receiver<Request>;

/// The byte budget of queued requests.
#[derive(Debug)]
pub(crate) struct Admission {
    queued: Mutex<u64>,
    limit: u64,
    freed: Condvar,
    freed_async: tokio::sync::Notify,
}

impl Admission {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            queued: Mutex::new(0),
            limit: limit.max(1),
            freed: Condvar::new(),
            freed_async: tokio::sync::Notify::new(),
        }
    }

    fn try_take(&self, queued: &mut u64, n: u64) -> bool {
        if *queued == 0 || queued.saturating_add(n) <= self.limit {
            *queued += n;
            true
        } else {
            false
        }
    }

    /// Takes `n` bytes of the budget, waiting (blocking the thread) while it is spent.
    pub(crate) fn take_blocking(&self, n: u64) {
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        while !self.try_take(&mut queued, n) {
            queued = self
                .freed
                .wait(queued)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Takes `n` bytes of the budget, awaiting (never blocking) while it is spent.
    pub(crate) async fn take(&self, n: u64) {
        loop {
            let freed = self.freed_async.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            {
                let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
                if self.try_take(&mut queued, n) {
                    return;
                }
            }
            freed.await;
        }
    }

    /// Gives `n` bytes back (the writer, once the request's group is done).
    pub(crate) fn give_back(&self, n: u64) {
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        *queued = queued.saturating_sub(n);
        drop(queued);
        self.freed.notify_all();
        self.freed_async.notify_waiters();
    }

    /// Bytes queued now.
    pub(crate) fn queued(&self) -> u64 {
        *self.queued.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn check_open(shared: &Shared) -> Result<()> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    Ok(())
}

/// Queues `cmd` (waiting, blocking, for admission); [`wait`] for the answer. Split from
/// [`submit`] so a caller can stop holding the mailbox while it waits.
pub(crate) fn send(tx: &Mailbox, shared: &Shared, cmd: Command) -> Result<Receiver<Result<Reply>>> {
    check_open(shared)?;
    let bytes = cmd.admission_bytes();
    shared.admission.take_blocking(bytes);
    let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
    let request = Request {
        cmd,
        reply: ReplyTo::Blocking(reply_tx),
        bytes,
    };
    if tx.send(request).is_err() {
        shared.admission.give_back(bytes);
        return Err(Error::Closed);
    }
    Ok(reply_rx)
}

/// Waits for the answer to a request queued with [`send`].
pub(crate) fn wait(reply: &Receiver<Result<Reply>>) -> Result<Reply> {
    reply.recv().map_err(|_| Error::Closed)?
}

/// Sends `cmd` to the writer and waits for its answer.
pub(crate) fn submit(tx: &Mailbox, shared: &Shared, cmd: Command) -> Result<Reply> {
    wait(&send(tx, shared, cmd)?)
}

/// Queues `cmd`, awaiting admission without blocking; the answer arrives on the returned
/// receiver. Requests queued one after another by one task apply in that order.
pub(crate) async fn send_async(
    tx: &Mailbox,
    shared: &Shared,
    cmd: Command,
) -> Result<tokio::sync::oneshot::Receiver<Result<Reply>>> {
    check_open(shared)?;
    let bytes = cmd.admission_bytes();
    shared.admission.take(bytes).await;
    let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
    let request = Request {
        cmd,
        reply: ReplyTo::Async(reply_tx),
        bytes,
    };
    if tx.send(request).is_err() {
        shared.admission.give_back(bytes);
        return Err(Error::Closed);
    }
    Ok(reply_rx)
}
