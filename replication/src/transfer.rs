//! How long a snapshot transfer may take: as long as it makes progress. openraft gives the
//! call one deadline (`install_snapshot_timeout`), which bounded the *whole* transfer: at the
//! measured 10–20 s per GiB, a member whose log is a few GiB was sent its snapshot, timed out
//! and was sent it again, for ever. The deadline now bounds a stall instead: the time without
//! a chunk taken by the transport, and, once the last chunk is sent, the receiver's install
//! (allowed a rate of [`INSTALL_BYTES_PER_SEC`] on top).

use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cursorlog_proto::raft_v1::SnapshotChunk;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::time::Instant;

/// The slowest install rate allowed once every byte is sent (the receiver copies the
/// spooled stream beside the log and fsyncs it before it answers).
pub const INSTALL_BYTES_PER_SEC: u64 = 8 << 20;

/// Progress of one transfer, shared by the chunk stream and the wait for its answer.
#[derive(Debug, Clone)]
pub struct Progress(Arc<Mutex<State>>);

#[derive(Debug, Clone, Copy)]
struct State {
    at: Instant,
    sent: u64,
    done: bool,
}

impl Default for Progress {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(State {
            at: Instant::now(),
            sent: 0,
            done: false,
        })))
    }
}

impl Progress {
    /// A chunk of `bytes` was handed to the transport; `done` when it was the last.
    pub fn chunk(&self, bytes: usize, done: bool) {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        s.at = Instant::now();
        s.sent += bytes as u64;
        s.done |= done;
    }

    fn state(&self) -> State {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How a transfer ended.
#[derive(Debug)]
pub enum Ended<T, C> {
    /// The call answered.
    Answered(T),
    /// openraft closed the replication.
    Cancelled(C),
    /// No progress for `stall` (or the install took longer than its allowance).
    Stalled,
}

/// Waits for `call`, ending early on `cancel` or when `progress` stops moving for `stall`.
pub async fn unless_stalled<T, C>(
    call: impl Future<Output = T>,
    cancel: impl Future<Output = C>,
    progress: &Progress,
    stall: Duration,
) -> Ended<T, C> {
    tokio::pin!(call);
    tokio::pin!(cancel);
    loop {
        let seen = progress.state();
        let allowed = if seen.done {
            stall + Duration::from_secs_f64(seen.sent as f64 / INSTALL_BYTES_PER_SEC as f64)
        } else {
            stall
        };
        tokio::select! {
            closed = &mut cancel => return Ended::Cancelled(closed),
            answer = &mut call => return Ended::Answered(answer),
            () = tokio::time::sleep_until(seen.at + allowed) => {
                let now = progress.state();
                if now.at == seen.at && now.done == seen.done {
                    return Ended::Stalled;
                }
            }
        }
    }
}

/// Where the snapshot stream is.
enum ChunkState<R> {
    Head(Vec<u8>, R),
    Body(R),
    Done,
}

/// The chunks of one snapshot: `head`, then `reader`'s bytes, the last chunk marked done. A
/// read error is put in `read_error` and ends the stream without a done chunk, so the peer
/// installs nothing.
pub fn snapshot_chunks<R>(
    head: Vec<u8>,
    reader: R,
    chunk_bytes: usize,
    read_error: Arc<Mutex<Option<io::Error>>>,
    progress: Progress,
) -> impl futures_util::Stream<Item = SnapshotChunk> + Send + 'static
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let chunks = futures_util::stream::unfold(ChunkState::Head(head, reader), move |state| {
        let read_error = read_error.clone();
        async move {
            match state {
                ChunkState::Head(head, reader) => Some((
                    SnapshotChunk {
                        head: head.into(),
                        data: Default::default(),
                        done: false,
                    },
                    ChunkState::Body(reader),
                )),
                ChunkState::Body(mut reader) => match fill(&mut reader, chunk_bytes).await {
                    Ok((data, eof)) => Some((
                        SnapshotChunk {
                            head: Default::default(),
                            data: data.into(),
                            done: eof,
                        },
                        if eof {
                            ChunkState::Done
                        } else {
                            ChunkState::Body(reader)
                        },
                    )),
                    Err(err) => {
                        *read_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(err);
                        None
                    }
                },
                ChunkState::Done => None,
            }
        }
    });
    futures_util::StreamExt::inspect(chunks, move |c| progress.chunk(c.data.len(), c.done))
}

/// Reads up to `len` bytes; `true` when the reader reached its end.
async fn fill<R: AsyncRead + Unpin>(reader: &mut R, len: usize) -> io::Result<(Vec<u8>, bool)> {
    let mut buf = vec![0; len];
    let mut filled = 0;
    while filled < len {
        let n = reader.read(&mut buf[filled..]).await?;
        if n == 0 {
            buf.truncate(filled);
            return Ok((buf, true));
        }
        filled += n;
    }
    Ok((buf, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transfer of `chunks` chunks, one every `every`, answered `after` the last.
    async fn transfer(progress: Progress, chunks: u32, every: Duration, after: Duration) -> u32 {
        for i in 0..chunks {
            tokio::time::sleep(every).await;
            progress.chunk(1 << 20, i + 1 == chunks);
        }
        tokio::time::sleep(after).await;
        chunks
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_transfer_that_keeps_moving_is_not_cut_off() {
        let progress = Progress::default();
        let call = transfer(
            progress.clone(),
            100,
            Duration::from_secs(5),
            Duration::ZERO,
        );
        let never = std::future::pending::<()>();
        let ended = unless_stalled(call, never, &progress, Duration::from_secs(45)).await;
        assert!(
            matches!(ended, Ended::Answered(100)),
            "500 s of steady chunks under a 45 s stall bound: {ended:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_transfer_that_stops_moving_is_ended() {
        let progress = Progress::default();
        let call = transfer(progress.clone(), 3, Duration::from_secs(50), Duration::ZERO);
        let never = std::future::pending::<()>();
        let ended = unless_stalled(call, never, &progress, Duration::from_secs(45)).await;
        assert!(matches!(ended, Ended::Stalled), "{ended:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_install_after_the_last_chunk_gets_time_for_its_bytes() {
        // 100 MiB sent; the install may take 45 s + 100 MiB / 8 MiB/s = 57.5 s.
        let progress = Progress::default();
        let call = transfer(
            progress.clone(),
            100,
            Duration::from_millis(10),
            Duration::from_secs(55),
        );
        let never = std::future::pending::<()>();
        let ended = unless_stalled(call, never, &progress, Duration::from_secs(45)).await;
        assert!(matches!(ended, Ended::Answered(100)), "{ended:?}");
        let progress = Progress::default();
        let call = transfer(
            progress.clone(),
            100,
            Duration::from_millis(10),
            Duration::from_secs(60),
        );
        let ended = unless_stalled(
            call,
            std::future::pending::<()>(),
            &progress,
            Duration::from_secs(45),
        )
        .await;
        assert!(matches!(ended, Ended::Stalled), "{ended:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_ends_the_wait() {
        let progress = Progress::default();
        let call = std::future::pending::<()>();
        let ended = unless_stalled(call, async { 7 }, &progress, Duration::from_secs(45)).await;
        assert!(matches!(ended, Ended::Cancelled(7)), "{ended:?}");
    }
}
