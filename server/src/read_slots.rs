//! The cap on concurrent `Read` and `WatchTask` calls (`--read-calls-max`).
//!
//! Every Read call, replaying or following, and every WatchTask call holds one slot from the
//! moment it is admitted until its producer task ends. A call that finds every slot taken is refused at once with
//! RESOURCE_EXHAUSTED: it is never queued, so a flood of followers cannot stall the server
//! or the calls already admitted. The counts feed the metrics page and `Stats`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tonic::Status;

use crate::read_pipe::ReadBuffers;

/// Default `--read-buffer-bytes`: room for about 500 events of 512 bytes per read while
/// replaying (a replay reached 1.32 M events/s with it, 0.94 M with 64 KiB).
pub const BUFFER_BYTES_DEFAULT: u32 = 256 * 1024;
/// Default `--follow-buffer-bytes`: what a follower whose client stopped reading holds (400 of
/// them added 22 MiB to the server with it, 93 MiB with 64 KiB).
pub const FOLLOW_BUFFER_BYTES_DEFAULT: u32 = 8 * 1024;
/// Default `--read-buffer-bytes-total`.
const BUFFER_BYTES_TOTAL_DEFAULT: u64 = 256 * 1024 * 1024;

/// The slots and their counters.
#[derive(Debug)]
pub struct ReadSlots {
    max: u64,
    active: AtomicU64,
    refused: AtomicU64,
    buffers: Arc<ReadBuffers>,
}

impl ReadSlots {
    /// `max` slots (at least one), with the default response buffers.
    pub fn new(max: u32) -> Arc<Self> {
        Self::with_buffers(
            max,
            BUFFER_BYTES_DEFAULT,
            FOLLOW_BUFFER_BYTES_DEFAULT,
            BUFFER_BYTES_TOTAL_DEFAULT,
        )
    }

    /// `max` slots (at least one); each call may buffer `buffer_bytes` of responses for its
    /// client while it replays and `follow_bytes` once it follows live events, all calls
    /// together `buffer_bytes_total` (see [`crate::read_pipe`]).
    pub fn with_buffers(
        max: u32,
        buffer_bytes: u32,
        follow_bytes: u32,
        buffer_bytes_total: u64,
    ) -> Arc<Self> {
        Arc::new(Self {
            max: u64::from(max.max(1)),
            active: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            buffers: ReadBuffers::new(buffer_bytes, follow_bytes, buffer_bytes_total),
        })
    }

    /// The response buffers of every Read call.
    pub fn buffers(&self) -> &Arc<ReadBuffers> {
        &self.buffers
    }

    /// A slot, or RESOURCE_EXHAUSTED (counted as refused) when all are taken.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED naming the limit.
    pub fn acquire(self: &Arc<Self>) -> Result<ReadSlot, Status> {
        let taken = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |active| {
                (active < self.max).then_some(active + 1)
            });
        match taken {
            Ok(_) => Ok(ReadSlot {
                slots: Arc::clone(self),
            }),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Status::resource_exhausted(format!(
                    "too many concurrent Read and WatchTask calls: the server's limit is {} \
                     (--read-calls-max); retry later or end idle follows and watches",
                    self.max
                )))
            }
        }
    }

    /// Read calls running now.
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    /// Read calls refused because every slot was taken, since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The configured limit.
    pub fn max(&self) -> u64 {
        self.max
    }
}

/// One admitted Read call; frees its slot when dropped.
#[derive(Debug)]
pub struct ReadSlot {
    slots: Arc<ReadSlots>,
}

impl Drop for ReadSlot {
    fn drop(&mut self) {
        self.slots.active.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn one_call_over_the_limit_is_refused_and_a_freed_slot_is_reused() {
        let slots = ReadSlots::new(2);
        let a = slots.acquire().unwrap();
        let _b = slots.acquire().unwrap();
        let err = slots.acquire().unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message().contains("--read-calls-max"),
            "{}",
            err.message()
        );
        assert_eq!((slots.active(), slots.refused()), (2, 1));
        drop(a);
        assert_eq!(slots.active(), 1);
        let _c = slots.acquire().unwrap();
        assert_eq!((slots.active(), slots.refused()), (2, 1));
    }

    #[test]
    fn racing_acquirers_never_exceed_the_limit() {
        let slots = ReadSlots::new(8);
        let held: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..32)
                .map(|_| scope.spawn(|| slots.acquire().ok()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(held.iter().flatten().count(), 8);
        assert_eq!((slots.active(), slots.refused()), (8, 24));
    }
}
