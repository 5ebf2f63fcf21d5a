//! When each live session was last named by a call, for the session idle TTL.
//!
//! Only sessions that exist are tracked (a call naming an unknown session adds nothing), so
//! the map holds one small entry per live session: the session id and a timestamp.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

/// Last activity (ms since the Unix epoch) per live session.
#[derive(Debug, Default)]
pub(crate) struct SessionActivity {
    last: RwLock<HashMap<Box<str>, AtomicU64>>,
}

impl SessionActivity {
    /// Starts tracking a live session (opened, or found live at open), active at `now_ms`.
    pub(crate) fn insert(&self, session: &str, now_ms: u64) {
        self.last
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(session.into())
            .or_insert_with(|| AtomicU64::new(now_ms))
            .fetch_max(now_ms, Ordering::AcqRel);
    }

    /// Renews a tracked session; returns whether it is tracked (live).
    pub(crate) fn touch(&self, session: &str, now_ms: u64) -> bool {
        let map = self.last.read().unwrap_or_else(PoisonError::into_inner);
        match map.get(session) {
            Some(t) => {
                t.fetch_max(now_ms, Ordering::AcqRel);
                true
            }
            None => false,
        }
    }

    /// Stops tracking a session (expired or forgotten).
    pub(crate) fn remove(&self, session: &str) {
        self.last
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(session);
    }

    /// Sessions idle for at least `ttl_ms` at `now_ms`, with how long (at most `limit`).
    pub(crate) fn idle(&self, now_ms: u64, ttl_ms: u64, limit: usize) -> Vec<(String, u64)> {
        let map = self.last.read().unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .filter_map(|(s, t)| {
                let idle = now_ms.saturating_sub(t.load(Ordering::Acquire));
                (idle >= ttl_ms).then(|| (s.to_string(), idle))
            })
            .take(limit)
            .collect()
    }
}
