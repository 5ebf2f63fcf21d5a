//! The writer queue's byte budget: a request waits before entering the queue while the bytes
//! already queued exceed the budget, so memory held by queued requests is bounded by bytes,
//! not by a count of requests of any size. Blocking callers wait on a condition variable;
//! async callers await a notification and never block a runtime worker.

use std::sync::{Condvar, Mutex, PoisonError};

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
        // The common case, room in the budget, takes the lock once and no waiter slot in
        // `freed_async` (registering one and dropping it locks the `Notify` twice more, a
        // lock every append shares).
        if self.try_take(
            &mut self.queued.lock().unwrap_or_else(PoisonError::into_inner),
            n,
        ) {
            return;
        }
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
