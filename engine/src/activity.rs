//! When each live session was last named by a call, for the session idle TTL.
//!
//! Only sessions that exist are tracked (a call naming an unknown session adds nothing), so
//! the map holds one small entry per live session: the session id and a timestamp.
//!
//! The map is split into [`SHARDS`] shards, each behind its own lock, so the idle scan (which
//! visits every entry) holds one shard's read lock at a time: the writer thread inserting a
//! new session waits for at most one shard's scan, not the whole map's.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Shards of the activity map (a power of two).
const SHARDS: usize = 64;

type Shard = RwLock<HashMap<Box<str>, AtomicU64>>;

/// Last activity (ms since the Unix epoch) per live session.
#[derive(Debug)]
pub(crate) struct SessionActivity {
    shards: Box<[Shard]>,
    /// Picks a session's shard.
    hasher: RandomState,
    /// The shard the next idle scan starts at: each scan starts one shard further, so a
    /// scan that stops at its limit does not always favour the same shards.
    next_scan: AtomicUsize,
}

impl Default for SessionActivity {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: RandomState::new(),
            next_scan: AtomicUsize::new(0),
        }
    }
}

impl SessionActivity {
    fn shard(&self, session: &str) -> &Shard {
        let i = self.hasher.hash_one(session) as usize % SHARDS;
        &self.shards[i]
    }

    fn read(shard: &Shard) -> RwLockReadGuard<'_, HashMap<Box<str>, AtomicU64>> {
        shard.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(shard: &Shard) -> RwLockWriteGuard<'_, HashMap<Box<str>, AtomicU64>> {
        shard.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts tracking a live session (opened, or found live at open), active at `now_ms`.
    pub(crate) fn insert(&self, session: &str, now_ms: u64) {
        Self::write(self.shard(session))
            .entry(session.into())
            .or_insert_with(|| AtomicU64::new(now_ms))
            .fetch_max(now_ms, Ordering::AcqRel);
    }

    /// Renews a tracked session; returns whether it is tracked (live).
    pub(crate) fn touch(&self, session: &str, now_ms: u64) -> bool {
        match Self::read(self.shard(session)).get(session) {
            Some(t) => {
                t.fetch_max(now_ms, Ordering::AcqRel);
                true
            }
            None => false,
        }
    }

    /// When the session was last active (`None`: not tracked).
    pub(crate) fn last(&self, session: &str) -> Option<u64> {
        Self::read(self.shard(session))
            .get(session)
            .map(|t| t.load(Ordering::Acquire))
    }

    /// Stops tracking a session (expired or forgotten).
    pub(crate) fn remove(&self, session: &str) {
        Self::write(self.shard(session)).remove(session);
    }

    /// Forgets every session's activity (a replicated node that stopped leading).
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            Self::write(shard).clear();
        }
    }

    /// Sessions tracked (live). Sums the shards: for stats and tests, not a hot path.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| Self::read(s).len()).sum()
    }

    /// At most `limit` sessions idle for at least `ttl_ms` at `now_ms` and not `pinned`
    /// (a follower holds them), with how long they were idle.
    ///
    /// Pinned sessions are passed over *before* the limit is counted, so any number of them
    /// never crowds the others out of the batch. `pinned` is asked only about idle sessions,
    /// under one shard's read lock.
    pub(crate) fn idle(
        &self,
        now_ms: u64,
        ttl_ms: u64,
        limit: usize,
        pinned: impl Fn(&str) -> bool,
    ) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let start = self.next_scan.fetch_add(1, Ordering::Relaxed);
        for k in 0..SHARDS {
            if out.len() >= limit {
                break;
            }
            let shard = Self::read(&self.shards[(start + k) % SHARDS]);
            for (s, t) in shard.iter() {
                if out.len() >= limit {
                    break;
                }
                let idle = now_ms.saturating_sub(t.load(Ordering::Acquire));
                if idle >= ttl_ms && !pinned(s) {
                    out.push((s.to_string(), idle));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_sessions_never_crowd_out_the_others() {
        let a = SessionActivity::default();
        for i in 0..3000 {
            a.insert(&format!("pinned-{i}"), 0);
        }
        for i in 0..10 {
            a.insert(&format!("free-{i}"), 0);
        }
        a.insert("busy", 900);
        assert_eq!(a.len(), 3011);
        let idle = a.idle(1000, 500, 1024, |s| s.starts_with("pinned-"));
        let mut names: Vec<&str> = idle.iter().map(|(s, _)| s.as_str()).collect();
        names.sort_unstable();
        let expected: Vec<String> = (0..10).map(|i| format!("free-{i}")).collect();
        assert_eq!(
            names,
            expected.iter().map(String::as_str).collect::<Vec<_>>()
        );
        assert!(idle.iter().all(|(_, ms)| *ms == 1000));
        assert_eq!(a.idle(1000, 500, 3, |_| false).len(), 3, "the limit holds");
        assert_eq!(a.last("busy"), Some(900));
        a.remove("busy");
        assert_eq!(a.last("busy"), None);
    }
}
