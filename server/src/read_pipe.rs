//! The pipe between a `Read` call's producer and its gRPC response stream, bounded in bytes.
//!
//! Every message holds its size in permits of two semaphores until the response stream takes
//! it (hands it to tonic to encode): the call's own buffer and the budget of all Read calls
//! together (`--read-buffer-bytes-total`). The call's buffer is `--read-buffer-bytes` while
//! it replays stored events, and narrows to `--follow-buffer-bytes` once it has caught up
//! and follows live ones ([`PipeTx::narrow_to_follow`]): a replay is fastest with room for
//! many events per read (measured: 433 k events/s with 16 KiB, 1.32 M with 256 KiB), while a
//! follower whose client stopped reading should cost little (400 of them added 22 MiB to the
//! server with 8 KiB, 93 MiB with 64 KiB; `benches/HISTORY.md`). A producer that finds no
//! room waits, counted in `cursorlog_reads_paused`, and reads nothing more from the log
//! meanwhile ([`PipeTx::room`] tells it how much to read). So a client that stops reading
//! costs its call at most its buffer (or one event, if an event is larger), whatever is
//! appended; the events stay in the log and are read from it when the client reads again.
//! A message larger than the call's buffer waits for an empty buffer.

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use cursorlog_proto::v1 as pb;
use futures_util::Stream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// What the pipe carries.
type Message = Result<pb::ReadResponse, Status>;

/// The budget shared by every Read call, and the count of paused calls.
#[derive(Debug)]
pub struct ReadBuffers {
    per_call: u32,
    follow: u32,
    total_bytes: u64,
    total: Arc<Semaphore>,
    paused: AtomicU64,
}

impl ReadBuffers {
    /// `per_call` bytes for each Read call while it replays, `follow` once it follows live
    /// events, `total` for all of them (each at least 1; a call's buffer is at most the total,
    /// its follow buffer at most its buffer).
    pub fn new(per_call: u32, follow: u32, total: u64) -> Arc<Self> {
        let total = total.clamp(1, Semaphore::MAX_PERMITS as u64);
        let per_call = u64::from(per_call.max(1)).min(total);
        let follow = u64::from(follow.max(1)).min(per_call);
        Arc::new(Self {
            per_call: u32::try_from(per_call).unwrap_or(u32::MAX),
            follow: u32::try_from(follow).unwrap_or(u32::MAX),
            total_bytes: total,
            total: Arc::new(Semaphore::new(
                usize::try_from(total).unwrap_or(Semaphore::MAX_PERMITS),
            )),
            paused: AtomicU64::new(0),
        })
    }

    /// Read calls waiting now for their client to read (or for the shared budget).
    pub fn paused(&self) -> u64 {
        self.paused.load(Ordering::Relaxed)
    }

    /// Bytes of responses held by all Read calls now.
    pub fn held(&self) -> u64 {
        self.total_bytes
            .saturating_sub(self.total.available_permits() as u64)
    }

    /// The budget of all Read calls together, in bytes (`--read-buffer-bytes-total`).
    pub fn budget(&self) -> u64 {
        self.total_bytes
    }
}

/// Counts a paused call while it lives.
struct Paused<'a>(&'a AtomicU64);

impl<'a> Paused<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A message's place in both budgets, given back when the response stream takes it.
#[derive(Debug)]
struct Held {
    _call: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

/// The client has gone: nothing more can be sent.
#[derive(Debug)]
pub struct Gone;

/// The producer's end.
#[derive(Debug)]
pub struct PipeTx {
    tx: mpsc::UnboundedSender<(Message, Option<Held>)>,
    call: Arc<Semaphore>,
    /// The call's buffer now, in bytes: the replay size, then the follow size.
    size: AtomicU32,
    buffers: Arc<ReadBuffers>,
}

/// The response stream's end.
#[derive(Debug)]
pub struct PipeRx {
    rx: mpsc::UnboundedReceiver<(Message, Option<Held>)>,
}

/// A pipe for one Read call, drawing on `buffers`.
pub fn pipe(buffers: &Arc<ReadBuffers>) -> (PipeTx, PipeRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let call = Arc::new(Semaphore::new(buffers.per_call as usize));
    (
        PipeTx {
            tx,
            call,
            size: AtomicU32::new(buffers.per_call),
            buffers: Arc::clone(buffers),
        },
        PipeRx { rx },
    )
}

impl PipeTx {
    /// Sends `message` of about `bytes` bytes, first waiting (paused) for room in both
    /// budgets.
    ///
    /// # Errors
    /// [`Gone`] when the client has gone.
    pub async fn send(&self, message: Message, bytes: usize) -> Result<(), Gone> {
        let n = u32::try_from(bytes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.size.load(Ordering::Relaxed));
        let held = self.hold(n).await?;
        self.tx.send((message, Some(held))).map_err(|_| Gone)
    }

    /// Sends `message` without waiting for room (a last word, such as "shutting down").
    pub fn send_now(&self, message: Message) {
        let _ = self.tx.send((message, None));
    }

    /// Resolves when the client has gone.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Waits (paused) until at least half of the call's buffer is free; the bytes free then,
    /// which is how much the producer should read from the log next.
    ///
    /// # Errors
    /// [`Gone`] when the client has gone.
    pub async fn room(&self) -> Result<usize, Gone> {
        let half = (self.size.load(Ordering::Relaxed) / 2).max(1);
        if self.call.available_permits() < half as usize {
            let _paused = Paused::new(&self.buffers.paused);
            tokio::select! {
                () = self.tx.closed() => return Err(Gone),
                // Only this producer takes permits, so the room stays once seen.
                acquired = self.call.acquire_many(half) => drop(acquired.map_err(|_| Gone)?),
            }
        }
        Ok(self.call.available_permits())
    }

    /// Narrows the call's buffer to the follow size (once it has caught up), waiting (paused)
    /// until the client has read what no longer fits. Only the producer calls it.
    ///
    /// # Errors
    /// [`Gone`] when the client has gone.
    pub async fn narrow_to_follow(&self) -> Result<(), Gone> {
        let size = self.size.load(Ordering::Relaxed);
        let excess = size.saturating_sub(self.buffers.follow);
        if excess == 0 {
            return Ok(());
        }
        // Paused only while the client has not read what no longer fits.
        let _paused = (self.call.available_permits() < excess as usize)
            .then(|| Paused::new(&self.buffers.paused));
        tokio::select! {
            () = self.tx.closed() => return Err(Gone),
            acquired = self.call.acquire_many(excess) => acquired.map_err(|_| Gone)?.forget(),
        }
        self.size.store(size - excess, Ordering::Relaxed);
        Ok(())
    }

    /// `n` permits of both budgets, waiting (paused) for them if need be.
    async fn hold(&self, n: u32) -> Result<Held, Gone> {
        let call = Arc::clone(&self.call);
        let total = Arc::clone(&self.buffers.total);
        if let (Ok(c), Ok(t)) = (
            Arc::clone(&call).try_acquire_many_owned(n),
            Arc::clone(&total).try_acquire_many_owned(n),
        ) {
            return Ok(Held {
                _call: c,
                _total: t,
            });
        }
        let _paused = Paused::new(&self.buffers.paused);
        let both = async {
            // The call's own permits first: only this producer waits for them, so holding
            // them while waiting for the shared budget blocks nobody else.
            let c = call.acquire_many_owned(n).await.map_err(|_| Gone)?;
            let t = total.acquire_many_owned(n).await.map_err(|_| Gone)?;
            Ok(Held {
                _call: c,
                _total: t,
            })
        };
        tokio::select! {
            () = self.tx.closed() => Err(Gone),
            held = both => held,
        }
    }
}

impl Stream for PipeRx {
    type Item = Message;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        // The permits are dropped here: once tonic has the message, its room is free.
        self.rx
            .poll_recv(cx)
            .map(|next| next.map(|(message, _held)| message))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use futures_util::StreamExt;

    fn msg() -> Message {
        Ok(pb::ReadResponse { item: None })
    }

    #[tokio::test]
    async fn a_full_buffer_pauses_the_producer_until_the_client_reads() {
        let buffers = ReadBuffers::new(100, 100, 1000);
        let (tx, mut rx) = pipe(&buffers);
        tx.send(msg(), 40).await.unwrap();
        assert_eq!(tx.room().await.unwrap(), 60);
        assert_eq!(buffers.held(), 40);
        let tx = Arc::new(tx);
        let producer = {
            let tx = Arc::clone(&tx);
            tokio::spawn(async move { tx.send(msg(), 70).await })
        };
        while buffers.paused() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!producer.is_finished());
        rx.next().await.unwrap().unwrap();
        producer.await.unwrap().unwrap();
        assert_eq!(buffers.paused(), 0);
        assert_eq!(buffers.held(), 70);
        // Less than half the buffer free: the producer waits before it reads more.
        let room = {
            let tx = Arc::clone(&tx);
            tokio::spawn(async move { tx.room().await })
        };
        while buffers.paused() == 0 {
            tokio::task::yield_now().await;
        }
        rx.next().await.unwrap().unwrap();
        assert_eq!(room.await.unwrap().unwrap(), 100);
        assert_eq!(buffers.held(), 0);
    }

    #[tokio::test]
    async fn the_total_budget_is_shared_and_a_large_message_takes_a_whole_buffer() {
        let buffers = ReadBuffers::new(100, 100, 150);
        let (a, mut ra) = pipe(&buffers);
        let (b, _rb) = pipe(&buffers);
        a.send(msg(), 10_000).await.unwrap();
        assert_eq!(
            buffers.held(),
            100,
            "a large message holds one whole buffer"
        );
        b.send(msg(), 50).await.unwrap();
        let waiting = tokio::spawn(async move { b.send(msg(), 50).await });
        while buffers.paused() == 0 {
            tokio::task::yield_now().await;
        }
        ra.next().await.unwrap().unwrap();
        waiting.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_caught_up_call_narrows_to_the_follow_buffer_once_its_client_read_the_excess() {
        let buffers = ReadBuffers::new(100, 20, 1000);
        let (tx, mut rx) = pipe(&buffers);
        tx.send(msg(), 60).await.unwrap();
        tx.send(msg(), 10).await.unwrap();
        let tx = Arc::new(tx);
        let narrowing = {
            let tx = Arc::clone(&tx);
            tokio::spawn(async move { tx.narrow_to_follow().await })
        };
        // 70 of 100 are held: 80 must be free before the buffer can shrink to 20.
        while buffers.paused() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!narrowing.is_finished());
        rx.next().await.unwrap().unwrap();
        narrowing.await.unwrap().unwrap();
        assert_eq!(buffers.paused(), 0);
        // 10 still held of a buffer of 20.
        assert_eq!(tx.room().await.unwrap(), 10);
        rx.next().await.unwrap().unwrap();
        assert_eq!(tx.room().await.unwrap(), 20);
        // A message larger than the follow buffer takes the whole of it.
        tx.send(msg(), 50).await.unwrap();
        assert_eq!(buffers.held(), 20);
        // Narrowing again changes nothing.
        rx.next().await.unwrap().unwrap();
        tx.narrow_to_follow().await.unwrap();
        assert_eq!(tx.room().await.unwrap(), 20);
    }

    #[tokio::test]
    async fn a_gone_client_ends_a_paused_producer() {
        let buffers = ReadBuffers::new(10, 10, 10);
        let (tx, rx) = pipe(&buffers);
        tx.send(msg(), 10).await.unwrap();
        let waiting = tokio::spawn(async move { tx.send(msg(), 10).await });
        while buffers.paused() == 0 {
            tokio::task::yield_now().await;
        }
        drop(rx);
        assert!(waiting.await.unwrap().is_err());
        assert_eq!(buffers.held(), 0, "the dropped message gave its room back");
        assert_eq!(buffers.paused(), 0);
    }
}
