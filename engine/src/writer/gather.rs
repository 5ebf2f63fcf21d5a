//! How long a group commit waits for producers to come back before it is written.
//!
//! A producer appends, waits for its acknowledgement, and appends again. With many
//! producers the writer must not commit the moment the first of them is back: the rest of
//! the previous group's producers are still being woken, and committing without them splits
//! the producers into cohorts that alternate on the disk, each with a fraction of the events
//! per `fdatasync` (measured: 64 producers settled into two cohorts of 32). So the writer
//! waits while the previous group's answers are still being delivered and, after that, while
//! fewer requests are queued than the producers of the last two groups, as long as
//! stragglers keep arriving; never longer than [`GATHER_WAIT_MAX`] in all.
//!
//! Waiting for stragglers only pays when a group ends in an `fdatasync` (the writer does not
//! ask for it otherwise), and a wait that catches nobody (say one producer taking turns on
//! two streams) backs off: the next 2, 4, … 64 groups do not wait for stragglers.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::index::IdHashing;
use crate::mailbox::{Command, Request};

/// Longest a group waits for producers to come back.
pub(super) const GATHER_WAIT_MAX: Duration = Duration::from_millis(1);
/// Longest a group short of the expected producers waits for the next one to arrive. Long
/// enough for a runtime to wake the acknowledged tasks, short beside an `fdatasync`.
pub(super) const GATHER_IDLE_MAX: Duration = Duration::from_micros(50);

/// The streams appended to by the last two groups: how many producers a group can expect
/// if every recent one comes back.
#[derive(Debug, Default)]
pub(super) struct Producers {
    last: HashSet<u64, IdHashing>,
    before: HashSet<u64, IdHashing>,
    /// Groups left that do not wait for stragglers (after waits that caught nobody).
    skip: u32,
    /// Straggler waits in a row that caught nobody (capped).
    futile_streak: u32,
}

/// Most groups a futile straggler wait makes skip waiting: `2^6`.
const FUTILE_STREAK_MAX: u32 = 6;

impl Producers {
    /// Producers of the last two groups (each counted once); 0 while backing off.
    pub(super) fn expected(&self) -> usize {
        if self.skip > 0 {
            return 0;
        }
        self.last.len() + self.before.difference(&self.last).count()
    }

    /// Notes the producers of a group about to be committed, and whether its wait for
    /// stragglers was futile (see [`Gather::futile`]).
    pub(super) fn record(&mut self, batch: &[Request], futile: bool) {
        if self.skip > 0 {
            self.skip -= 1;
        } else if futile {
            self.futile_streak = (self.futile_streak + 1).min(FUTILE_STREAK_MAX);
            self.skip = 1 << self.futile_streak;
        } else {
            self.futile_streak = 0;
        }
        std::mem::swap(&mut self.last, &mut self.before);
        self.last.clear();
        self.last.extend(batch.iter().filter_map(|r| match &r.cmd {
            Command::Append(a) => Some(a.stream),
            _ => None,
        }));
    }
}

/// When a group that started gathering at `since` stops waiting.
#[derive(Debug)]
pub(super) struct Gather {
    since: Instant,
    last_arrival: Instant,
    expected: usize,
    /// The last look decided to wait for stragglers.
    straggling: bool,
    /// It waited for stragglers at least once.
    waited: bool,
    /// A request arrived while it was waiting for stragglers.
    caught: bool,
}

impl Gather {
    /// A group starting to gather at `now`, expecting `expected` producers.
    pub(super) fn new(now: Instant, expected: usize) -> Self {
        Self {
            since: now,
            last_arrival: now,
            expected,
            straggling: false,
            waited: false,
            caught: false,
        }
    }

    /// It waited for stragglers and none came.
    pub(super) fn futile(&self) -> bool {
        self.waited && !self.caught
    }

    /// Whether to keep waiting at `now`, given the group's size, whether it grew since the
    /// last look, and whether the previous group's answers are still being delivered.
    pub(super) fn keep_waiting(
        &mut self,
        now: Instant,
        queued: usize,
        grew: bool,
        acks_pending: bool,
    ) -> bool {
        if grew && self.straggling {
            self.caught = true;
        }
        if grew || acks_pending {
            self.last_arrival = now;
        }
        self.straggling = false;
        if queued >= super::GROUP_REQUESTS_MAX || now.duration_since(self.since) >= GATHER_WAIT_MAX
        {
            return false;
        }
        if acks_pending {
            return true;
        }
        self.straggling =
            queued < self.expected && now.duration_since(self.last_arrival) < GATHER_IDLE_MAX;
        self.waited |= self.straggling;
        self.straggling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of appends, one per stream.
    fn group(streams: &[u64]) -> Vec<Request> {
        streams
            .iter()
            .map(|s| {
                let (tx, _) = tokio::sync::oneshot::channel();
                Request {
                    cmd: Command::Append(crate::Append {
                        session: "s".into(),
                        stream: *s,
                        expected_next_seq: None,
                        events: Vec::new(),
                    }),
                    reply: crate::mailbox::ReplyTo::Async(tx),
                    bytes: 0,
                }
            })
            .collect()
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_group_of_the_expected_size_does_not_wait() {
        let t = Instant::now();
        let mut g = Gather::new(t, 4);
        assert!(!g.keep_waiting(t, 4, true, false));
        let mut g = Gather::new(t, 1);
        assert!(!g.keep_waiting(t, 1, false, false), "one producer: no wait");
        let mut g = Gather::new(t, 8);
        assert!(!g.keep_waiting(t, crate::writer::GROUP_REQUESTS_MAX, true, true));
    }

    #[test]
    fn a_short_group_waits_for_stragglers_only_while_they_keep_coming() {
        let t = Instant::now();
        let mut g = Gather::new(t, 4);
        assert!(g.keep_waiting(t + us(10), 1, false, false));
        assert!(g.keep_waiting(t + us(40), 2, true, false));
        assert!(
            g.keep_waiting(t + us(80), 2, false, false),
            "40 us since the last arrival"
        );
        assert!(
            !g.keep_waiting(t + us(91), 2, false, false),
            "no arrival for longer than GATHER_IDLE_MAX"
        );
    }

    #[test]
    fn delivering_answers_is_waited_for_but_never_past_the_limit() {
        let t = Instant::now();
        let mut g = Gather::new(t, 1);
        assert!(g.keep_waiting(t + us(500), 1, false, true));
        assert!(!g.keep_waiting(t + GATHER_WAIT_MAX, 1, false, true));
        let mut g = Gather::new(t, 100);
        assert!(g.keep_waiting(t + us(990), 5, true, false));
        assert!(
            !g.keep_waiting(t + GATHER_WAIT_MAX, 6, true, false),
            "stragglers still arriving, but the group has waited long enough"
        );
    }

    #[test]
    fn producers_of_the_last_two_groups_are_expected_once_each() {
        let mut p = Producers::default();
        assert_eq!(p.expected(), 0);
        p.record(&group(&[1, 2, 3]), false);
        assert_eq!(p.expected(), 3);
        p.record(&group(&[4, 5, 3]), false);
        assert_eq!(p.expected(), 5, "two cohorts: both are expected back");
        p.record(&group(&[6]), false);
        assert_eq!(p.expected(), 4, "the group before last is forgotten");
    }

    #[test]
    fn waits_that_catch_nobody_back_off() {
        let t = Instant::now();
        // One producer taking turns on two streams: it is never back before the group.
        let mut g = Gather::new(t, 2);
        assert!(g.keep_waiting(t, 1, false, false));
        assert!(!g.keep_waiting(t + us(60), 1, false, false));
        assert!(g.futile());
        // Producers over those groups: a wait (expected 2, one request queued) catches
        // nobody each time, so waits come after 2, then 4 groups without.
        let mut p = Producers::default();
        let mut waits = Vec::new();
        for i in 0..11u64 {
            let waited = p.expected() > 1;
            waits.push(waited);
            p.record(&group(&[i % 2 + 1]), waited);
        }
        let (w, n) = (true, false);
        assert_eq!(waits, [n, n, w, n, n, w, n, n, n, n, w]);
    }

    #[test]
    fn a_wait_that_catches_a_straggler_is_not_futile() {
        let t = Instant::now();
        let mut g = Gather::new(t, 3);
        assert!(g.keep_waiting(t, 1, false, false));
        assert!(g.keep_waiting(t + us(20), 2, true, false));
        assert!(!g.keep_waiting(t + us(30), 3, true, false));
        assert!(!g.futile());
        // Delivering answers is not a straggler wait.
        let mut g = Gather::new(t, 1);
        assert!(g.keep_waiting(t, 1, false, true));
        assert!(!g.keep_waiting(t + us(10), 1, false, false));
        assert!(!g.futile());
    }
}
