//! Live-state checks the planner makes: the cap on live sessions, whether a session the
//! idle scan picked is still idle when its expiry is planned, and which session a request
//! names (a planned request renews it).

use std::sync::atomic::Ordering;

use crate::error::{Error, LiveLimit, Result};
use crate::index::Txn;
use crate::mailbox::Command;
use crate::writer::Writer;

impl Writer {
    /// Refuses a new session while `live_sessions_max` are live (those committed plus those
    /// this group opened or expired so far: the count is exact, not racy).
    pub(in crate::writer) fn check_live_sessions(&self, txn: &Txn<'_>) -> Result<()> {
        let max = self.shared.config.live_sessions_max;
        let live = self.shared.index.counts().live_sessions + txn.pending_counts().live_sessions;
        if u64::try_from(live).unwrap_or(0) >= max {
            self.shared
                .counters
                .sessions_refused_at_capacity
                .fetch_add(1, Ordering::Relaxed);
            return Err(Error::AtCapacity {
                limit: LiveLimit::Sessions,
                max,
            });
        }
        Ok(())
    }

    /// Whether `session`, picked by the idle scan, is idle still at `now_ms`: idle for the
    /// whole TTL (no call named it since the scan, nor since any request of it was planned)
    /// and not pinned by a follower.
    pub(in crate::writer) fn still_idle(&self, session: &str, now_ms: u64) -> bool {
        let Some(ttl) = self.shared.config.session_idle_ttl else {
            return false;
        };
        if self.shared.followers.pins(session) {
            return false;
        }
        // Untracked: nothing renewed it; `live_session` has already decided it is live.
        self.shared
            .activity
            .last(session)
            .is_none_or(|last| now_ms.saturating_sub(last) >= crate::clock::duration_ms(ttl))
    }
}

/// The session a client request names, which its planning renews (`None`: expiry and the
/// engine's own work, and requests that name a stream only).
pub(super) fn named_session(cmd: &Command) -> Option<&str> {
    match cmd {
        Command::OpenSession { session, .. }
        | Command::SetSessionState { session, .. }
        | Command::AdvanceEpoch(session) => Some(session),
        Command::OpenStream(req) => Some(&req.session),
        Command::Append(req) => Some(&req.session),
        Command::Terminate { session, .. } | Command::Trim { session, .. } => session.as_deref(),
        Command::ExpireSession { .. }
        | Command::CarryForward { .. }
        | Command::Forget { .. }
        | Command::Retire { .. }
        | Command::Task(_)
        | Command::Sync => None,
    }
}
