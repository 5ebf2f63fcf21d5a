//! Wake-ups for live readers: one bell per followed stream or watched task.
//!
//! A commit rings only the bells of the streams it touched (events, terminal states,
//! trims, forgetting; a session-wide end touches each of its streams through their
//! tombstones), so an idle follower costs nothing per commit but a lookup of the commit's
//! own streams. A wake-up is a counter comparison; the follower reads the stream only when
//! the counter moved. Followers also pin their session against the idle TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::index::IdHashing;

/// A followed stream's bell.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    /// Incremented by every commit that touches the stream.
    rings: AtomicU64,
    notify: tokio::sync::Notify,
}

impl Bell {
    /// How many times it rang.
    pub(crate) fn rings(&self) -> u64 {
        self.rings.load(Ordering::Acquire)
    }
}

/// Every bell, and the sessions followers pin.
#[derive(Debug, Default)]
pub(crate) struct Followers {
    bells: Mutex<HashMap<u64, Weak<Bell>, IdHashing>>,
    /// Bells in the map: zero makes ringing free.
    followed: AtomicUsize,
    pinned: Mutex<HashMap<String, usize>>,
    closed: AtomicBool,
}

impl Followers {
    fn bells(&self) -> MutexGuard<'_, HashMap<u64, Weak<Bell>, IdHashing>> {
        self.bells.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pinned(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.pinned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bell of `stream` (shared by its followers), and a pin on `session`.
    pub(crate) fn follow(self: &Arc<Self>, session: &str, stream: u64) -> Arc<Bell> {
        *self.pinned().entry(session.to_owned()).or_insert(0) += 1;
        self.follow_task(stream)
    }

    /// The bell of `id` without a pin: a task's, for a watch of it (a task pins no
    /// session), or a stream's for [`Followers::follow`].
    pub(crate) fn follow_task(&self, id: u64) -> Arc<Bell> {
        let mut bells = self.bells();
        if let Some(bell) = bells.get(&id).and_then(Weak::upgrade) {
            return bell;
        }
        let bell = Arc::new(Bell::default());
        bells.insert(id, Arc::downgrade(&bell));
        self.followed.store(bells.len(), Ordering::Release);
        bell
    }

    /// A watch of task `id` (or a follower of stream `id`, unpinned already) is gone.
    pub(crate) fn unfollow_task(&self, id: u64, bell: Arc<Bell>) {
        let mut bells = self.bells();
        drop(bell);
        if bells.get(&id).is_some_and(|w| w.strong_count() == 0) {
            bells.remove(&id);
        }
        self.followed.store(bells.len(), Ordering::Release);
    }

    /// A follower of `stream` in `session` is gone.
    pub(crate) fn unfollow(&self, session: &str, stream: u64, bell: Arc<Bell>) {
        {
            let mut pinned = self.pinned();
            if let Some(n) = pinned.get_mut(session) {
                *n -= 1;
                if *n == 0 {
                    pinned.remove(session);
                }
            }
        }
        self.unfollow_task(stream, bell);
    }

    /// True while some follower of one of the session's streams is open.
    pub(crate) fn pins(&self, session: &str) -> bool {
        self.pinned().contains_key(session)
    }

    /// Rings the bells of `streams` (the streams a commit touched).
    pub(crate) fn ring(&self, streams: &[u64]) {
        if self.followed.load(Ordering::Acquire) == 0 || streams.is_empty() {
            return;
        }
        let bells: Vec<Arc<Bell>> = {
            let map = self.bells();
            streams
                .iter()
                .filter_map(|s| map.get(s).and_then(Weak::upgrade))
                .collect()
        };
        for bell in bells {
            bell.rings.fetch_add(1, Ordering::AcqRel);
            bell.notify.notify_waiters();
        }
    }

    /// The engine is closing: every follower wakes up and ends.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let bells: Vec<Arc<Bell>> = self.bells().values().filter_map(Weak::upgrade).collect();
        for bell in bells {
            bell.notify.notify_waiters();
        }
    }

    /// True once [`Followers::close`] ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Streams with a live follower.
    pub(crate) fn followed(&self) -> usize {
        self.followed.load(Ordering::Acquire)
    }

    /// Waits until `bell` rang more than `seen` times, or the engine closes (`false`).
    pub(crate) async fn wait(&self, bell: &Bell, seen: u64) -> bool {
        loop {
            let rang = bell.notify.notified();
            let mut rang = std::pin::pin!(rang);
            rang.as_mut().enable();
            if self.is_closed() {
                return false;
            }
            if bell.rings() != seen {
                return true;
            }
            rang.await;
        }
    }
}
