//! A history checker in the spirit of Jepsen's Knossos and Porcupine (issue 30 item 6).
//!
//! Clients record every call they make — which client, which member, the call, when it
//! started and when its answer came back, and the answer itself, successes *and* errors —
//! into a [`Recorder`]. [`check`] then splits the history by session (the key: nothing ever
//! crosses sessions, and a session's epoch supersedes its streams, so its streams share its
//! key) and searches, per session, for a total order of the calls that respects real time
//! (a call that ended before another started comes first) and in which every answer is what
//! a sequential model of the session and its streams would have answered
//! (Wing & Gong / Lowe's linearizability search, memoised on the set of calls placed and the
//! model state). No such order: a violation, printed as the shortest time-prefix of the
//! session's history that no order explains, stripped of the read-only calls it does not
//! need. The search is capped; a key it could not decide is reported as undecided.
//!
//! The model ([`Model`]): a session has an epoch (0 = absent; `OpenSession` creates it at 1,
//! `AdvanceEpoch` moves it up by one and supersedes the open streams of older epochs); a
//! stream has its epoch, its head and its phase (open, completed, aborted, superseded).
//! Every answer is a claim about that state at some instant of its call:
//! "stale epoch E: the session's current epoch is C" claims the epoch was C; "stream head
//! is H" claims the head was H; NOT_FOUND claims the stream (or the session) did not exist;
//! "terminated" claims the stream was no longer open; an OK `KeepAlive` claims it was open.
//! An answer that claims nothing (UNAVAILABLE, a deadline, a broken call, "outcome unknown")
//! leaves a write open-ended — it may take effect at any instant after it started, or never —
//! and makes a read say nothing. `UNAVAILABLE` with `cursorlog-retry: safe` claims the call
//! was never proposed: it is checked as having had no effect.

use std::collections::BTreeMap;
use std::fmt::Write as _;

mod model;
mod record;
mod search;

pub use model::*;
pub use record::*;
pub use search::*;

/// The verdict on one key's history.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Some order of the calls that respects real time explains every answer.
    Ok,
    /// None does: the shortest time-prefix no order explains (read-only calls it does not
    /// need removed), and the calls whose answers end it.
    Violation {
        /// The sub-history, in start order.
        witness: Vec<Op>,
        /// How the longest order found ended (what could not be placed).
        stuck: String,
    },
    /// The search hit its cap.
    Undecided,
}

impl Verdict {
    /// A violation's unexplained answer: the last of its witness's answers to end (answers
    /// that claim something; an outcome-unknown call is never the culprit).
    pub fn culprit(&self) -> Option<&Op> {
        match self {
            Self::Violation { witness, .. } => witness
                .iter()
                .filter(|o| !matches!(o.answer, Answer::Unknown { .. } | Answer::NotDone { .. }))
                .max_by_key(|o| o.end),
            _ => None,
        }
    }
}

/// How an op enters the search.
/// The verdicts of a whole history.
#[derive(Debug, Default)]
pub struct Report {
    /// Sessions whose every answer is explained.
    pub ok: usize,
    /// Sessions with at least one violation.
    pub sessions_with_violations: usize,
    /// Every violation found, with its session (several per session: see [`check`]).
    pub violations: Vec<(String, Verdict)>,
    /// Sessions the search could not decide.
    pub undecided: Vec<String>,
    /// Calls by (nemesis phase, "member N: answer kind").
    pub answers: BTreeMap<(String, String), usize>,
}

impl Report {
    /// A readable summary, with every violation's witness.
    pub fn render(&self) -> String {
        let mut out = format!(
            "history check: {} sessions ok, {} with violations ({} violations), {} undecided\n",
            self.ok,
            self.sessions_with_violations,
            self.violations.len(),
            self.undecided.len()
        );
        let mut by_phase: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
        for ((phase, kind), n) in &self.answers {
            *by_phase
                .entry(phase)
                .or_default()
                .entry(kind.as_str())
                .or_default() += n;
        }
        for (phase, kinds) in by_phase {
            let _ = writeln!(out, "  answers during {phase}: {kinds:?}");
        }
        if !self.undecided.is_empty() {
            let _ = writeln!(out, "  undecided sessions: {:?}", self.undecided);
        }
        let mut shown = std::collections::HashSet::new();
        for (key, verdict) in &self.violations {
            if !shown.insert(key) {
                // A session's later lies: the answer only (its first has the whole witness).
                if let Some(op) = verdict.culprit() {
                    let _ = writeln!(out, "VIOLATION in session {key:?} too: {op}");
                }
                continue;
            }
            if let Verdict::Violation { witness, stuck } = verdict {
                let _ = writeln!(
                    out,
                    "VIOLATION in session {key:?}: no order of these {} calls that respects \
                     real time explains every answer:",
                    witness.len()
                );
                for op in witness {
                    let _ = writeln!(out, "    {op}");
                }
                let _ = writeln!(out, "  {stuck}");
            }
        }
        out
    }
}

/// Checks every session of `ops` (each with at most `budget` search steps).
pub fn check(ops: &[Op], budget: usize) -> Report {
    let mut by_key: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
    let mut report = Report::default();
    for op in ops {
        by_key.entry(&op.session).or_default().push(op.clone());
        *report
            .answers
            .entry((
                op.phase.clone(),
                format!("member {}: {}", op.member + 1, op.answer.kind()),
            ))
            .or_default() += 1;
    }
    for (key, mut history) in by_key {
        // After a violation, the answer that proved it is set aside and the rest checked
        // again, so a session reports each lie (up to `VIOLATIONS_PER_SESSION`), not only
        // its first.
        let mut found = 0;
        loop {
            match check_key(&history, budget) {
                Verdict::Ok => {
                    if found == 0 {
                        report.ok += 1;
                    }
                    break;
                }
                Verdict::Undecided => {
                    report.undecided.push(key.to_owned());
                    break;
                }
                v @ Verdict::Violation { .. } => {
                    // Only an answer that changes nothing is set aside: without a write
                    // whose acknowledgement has no explanation, what follows would be
                    // judged against a state the cluster never had.
                    let next = v
                        .culprit()
                        .filter(|o| read_only(o))
                        .map(|o| (o.client, o.start));
                    report.violations.push((key.to_owned(), v));
                    report.sessions_with_violations += usize::from(found == 0);
                    found += 1;
                    let Some((client, start)) = next else {
                        break;
                    };
                    let before = history.len();
                    history.retain(|o| (o.client, o.start) != (client, start));
                    if found >= VIOLATIONS_PER_SESSION || history.len() == before {
                        break;
                    }
                }
            }
        }
    }
    report
}

/// The most violations reported per session.
pub const VIOLATIONS_PER_SESSION: usize = 10;

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "history_stream_tests.rs"]
mod stream_tests;

#[cfg(test)]
#[path = "history_queue_tests.rs"]
mod queue_tests;
