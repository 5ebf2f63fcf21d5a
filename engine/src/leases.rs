//! Producer leases: stream → deadline. In memory only: after a restart every open stream
//! with a lease gets a full lease again, so a producer can reconnect.
//!
//! Renewal is on every append, from many threads at once: it takes the read lock only (the
//! deadline is an atomic), and skips even that while no stream has a lease.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::index::IdHashing;

#[derive(Debug)]
struct Lease {
    length_ms: u64,
    deadline_ms: AtomicU64,
}

/// The leases of open streams, by the engine's clock (ms).
#[derive(Debug, Default)]
pub(crate) struct Leases {
    map: RwLock<HashMap<u64, Lease, IdHashing>>,
    armed: AtomicUsize,
}

impl Leases {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<u64, Lease, IdHashing>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<u64, Lease, IdHashing>> {
        self.map.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts (or restarts) a lease of `ms` milliseconds at `now_ms`.
    pub(crate) fn arm(&self, stream: u64, ms: u64, now_ms: u64) {
        let lease = Lease {
            length_ms: ms,
            deadline_ms: AtomicU64::new(now_ms.saturating_add(ms)),
        };
        let mut map = self.write();
        map.insert(stream, lease);
        self.armed.store(map.len(), Ordering::Release);
    }

    /// Pushes the deadline out by a full lease from `now_ms`, if the stream has one.
    /// Arms `stream`'s lease unless it is armed already (a lease this node armed keeps its
    /// deadline when the live state is re-armed).
    pub(crate) fn arm_missing(&self, stream: u64, ms: u64, now_ms: u64) {
        let mut map = self.write();
        map.entry(stream).or_insert_with(|| Lease {
            length_ms: ms,
            deadline_ms: AtomicU64::new(now_ms.saturating_add(ms)),
        });
        self.armed.store(map.len(), Ordering::Release);
    }

    /// Forgets every lease (a replicated node that stopped leading).
    pub(crate) fn clear(&self) {
        let mut map = self.write();
        map.clear();
        self.armed.store(0, Ordering::Release);
    }

    pub(crate) fn renew(&self, stream: u64, now_ms: u64) {
        if self.armed.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(lease) = self.read().get(&stream) {
            lease
                .deadline_ms
                .fetch_max(now_ms.saturating_add(lease.length_ms), Ordering::AcqRel);
        }
    }

    /// Drops the lease (the stream is terminal).
    pub(crate) fn remove(&self, stream: u64) {
        if self.armed.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut map = self.write();
        map.remove(&stream);
        self.armed.store(map.len(), Ordering::Release);
    }

    /// Streams with a lease now.
    pub(crate) fn len(&self) -> usize {
        self.armed.load(Ordering::Acquire)
    }

    /// Takes the leases whose deadline passed at `now_ms`. Looks under the read lock (renewals
    /// go on meanwhile) and takes the write lock only when some ran out.
    pub(crate) fn take_expired(&self, now_ms: u64) -> Vec<u64> {
        if self.armed.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let passed = |l: &Lease| l.deadline_ms.load(Ordering::Acquire) <= now_ms;
        let due: Vec<u64> = self
            .read()
            .iter()
            .filter(|(_, l)| passed(l))
            .map(|(id, _)| *id)
            .collect();
        if due.is_empty() {
            return due;
        }
        let mut map = self.write();
        // A lease renewed (or re-armed) since the look is kept.
        let ids: Vec<u64> = due
            .into_iter()
            .filter(|id| map.get(id).is_some_and(passed))
            .collect();
        for id in &ids {
            map.remove(id);
        }
        self.armed.store(map.len(), Ordering::Release);
        ids
    }
}
