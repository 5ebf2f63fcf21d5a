//! The linearizability search of one key's history (Wing & Gong / Lowe, memoised on the
//! set of calls placed and the model state, capped).

use std::collections::HashSet;
use std::fmt::Write as _;

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Its answer must be explained.
    Definite,
    /// A write that may take effect at any instant after its start, or never.
    Maybe,
}

struct Search<'a> {
    ops: Vec<(&'a Op, Role)>,
    memo: HashSet<(Vec<u64>, Model)>,
    budget: usize,
    visited: usize,
    best: usize,
    best_stuck: String,
}

fn bit(set: &[u64], i: usize) -> bool {
    set[i / 64] & (1 << (i % 64)) != 0
}

impl<'a> Search<'a> {
    fn new(history: &[&'a Op], budget: usize) -> Self {
        let mut ops: Vec<(&Op, Role)> = history
            .iter()
            .filter_map(|op| {
                let role = match &op.answer {
                    Answer::NotDone { .. } => return None,
                    // An unknown OpenStream can only have made a stream nobody learned of.
                    Answer::Unknown { .. }
                        if op.call.is_write() && !matches!(op.call, Call::OpenStream { .. }) =>
                    {
                        Role::Maybe
                    }
                    Answer::Unknown { .. } => return None,
                    _ => Role::Definite,
                };
                Some((*op, role))
            })
            .collect();
        ops.sort_by_key(|(op, _)| op.start);
        Self {
            ops,
            memo: HashSet::new(),
            budget,
            visited: 0,
            best: 0,
            best_stuck: String::new(),
        }
    }

    fn end(&self, i: usize) -> u64 {
        match self.ops[i].1 {
            Role::Definite => self.ops[i].0.end,
            Role::Maybe => u64::MAX,
        }
    }

    /// `Some(true)`: an order exists; `Some(false)`: none; `None`: out of budget.
    fn run(&mut self) -> Option<bool> {
        let words = self.ops.len().div_ceil(64).max(1);
        let definite = self
            .ops
            .iter()
            .filter(|(_, r)| *r == Role::Definite)
            .count();
        let mut set = vec![0_u64; words];
        self.dfs(&mut set, Model::default(), 0, definite)
    }

    fn dfs(
        &mut self,
        set: &mut Vec<u64>,
        state: Model,
        placed: usize,
        definite: usize,
    ) -> Option<bool> {
        if placed == definite {
            return Some(true);
        }
        self.visited += 1;
        if self.visited > self.budget {
            return None;
        }
        if !self.memo.insert((set.clone(), state.clone())) {
            return Some(false);
        }
        // A call may come next unless an unplaced call ended before it started.
        let min_end = (0..self.ops.len())
            .filter(|i| !bit(set, *i))
            .map(|i| self.end(i))
            .min()
            .unwrap_or(u64::MAX);
        let mut tried_definite = Vec::new();
        for i in 0..self.ops.len() {
            let (op, role) = self.ops[i];
            if op.start > min_end {
                break;
            }
            if bit(set, i) {
                continue;
            }
            let next = match role {
                Role::Definite => state.apply(&op.call, &op.answer),
                Role::Maybe => state.effect(&op.call),
            };
            if role == Role::Definite {
                tried_definite.push(i);
            }
            let Some(next) = next else { continue };
            set[i / 64] |= 1 << (i % 64);
            let placed_now = placed + usize::from(role == Role::Definite);
            let found = self.dfs(set, next, placed_now, definite);
            set[i / 64] &= !(1 << (i % 64));
            match found {
                Some(false) => {}
                other => return other,
            }
        }
        if placed >= self.best {
            self.best = placed;
            let mut why = format!(
                "after {placed} of {definite} answers placed, the model is {state:?}; none of \
                 these answers fits it next:"
            );
            for i in tried_definite {
                let _ = write!(why, "\n      {}", self.ops[i].0);
            }
            self.best_stuck = why;
        }
        Some(false)
    }
}

/// Whether `history` (one key's calls) is linearizable: `Some(Ok(()))` yes, `Some(Err(stuck))`
/// no, `None` undecided within `budget` search steps.
fn linearizable(history: &[&Op], budget: usize) -> Option<Result<(), String>> {
    let mut search = Search::new(history, budget);
    match search.run()? {
        true => Some(Ok(())),
        false => Some(Err(search.best_stuck)),
    }
}

/// The history up to `t`: calls that ended by `t` keep their answers, writes still running
/// at `t` become unknown (but those that say they were never proposed stay without effect),
/// reads still running are dropped, later calls are dropped. When it
/// has no explanation, neither has the whole history (every later call is ordered after the
/// calls that ended by `t`).
fn prefix(history: &[&Op], t: u64) -> Vec<Op> {
    history
        .iter()
        .filter(|op| op.start <= t)
        .filter_map(|op| {
            if op.end <= t {
                Some((*op).clone())
            } else if matches!(op.answer, Answer::NotDone { .. }) {
                // It had no effect either way.
                None
            } else if op.call.is_write() {
                let mut o = (*op).clone();
                o.answer = Answer::Unknown {
                    what: format!("(cut: still running, was {})", op.answer),
                };
                Some(o)
            } else {
                None
            }
        })
        .collect()
}

/// True when removing `op` from a history keeps every other answer as it was: a call that
/// changes no state whatever order it takes.
pub(super) fn read_only(op: &Op) -> bool {
    match &op.answer {
        Answer::Refused { .. } | Answer::NotDone { .. } => true,
        Answer::Unknown { .. } => !op.call.is_write(),
        Answer::Appended { duplicate, .. } | Answer::Completed { duplicate, .. } => *duplicate,
        Answer::Session { created, .. } => *created != Some(true),
        Answer::Advanced { .. } | Answer::Opened { .. } => false,
        Answer::Enqueued { duplicate, .. } => *duplicate,
        Answer::Dequeued {
            messages,
            duplicate,
        } => *duplicate || messages.is_empty(),
        Answer::Alive
        | Answer::Resolved { .. }
        | Answer::TaskRead { .. }
        | Answer::Followed { .. } => true,
        Answer::Task {
            duplicate, created, ..
        } => match op.call {
            Call::CreateTask => *created != Some(true),
            _ => *duplicate,
        },
    }
}

/// Checks one key's history.
pub fn check_key(history: &[Op], budget: usize) -> Verdict {
    let all: Vec<&Op> = history.iter().collect();
    match linearizable(&all, budget) {
        None => return Verdict::Undecided,
        Some(Ok(())) => return Verdict::Ok,
        Some(Err(_)) => {}
    }
    // The shortest time-prefix without an explanation.
    let mut ends: Vec<u64> = history.iter().map(|o| o.end).collect();
    ends.sort_unstable();
    ends.dedup();
    let fails = |t: u64| {
        let p = prefix(&all, t);
        let refs: Vec<&Op> = p.iter().collect();
        matches!(linearizable(&refs, budget), Some(Err(_)))
    };
    let (mut lo, mut hi) = (0, ends.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fails(ends[mid]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let mut witness = if fails(ends[hi]) {
        prefix(&all, ends[hi])
    } else {
        history.to_vec()
    };
    // Without the read-only calls it does not need (removing one never invents a violation).
    let mut i = 0;
    while i < witness.len() {
        if read_only(&witness[i]) {
            let mut less = witness.clone();
            less.remove(i);
            let refs: Vec<&Op> = less.iter().collect();
            if matches!(linearizable(&refs, budget), Some(Err(_))) {
                witness = less;
                continue;
            }
        }
        i += 1;
    }
    witness.sort_by_key(|o| o.start);
    let refs: Vec<&Op> = witness.iter().collect();
    let stuck = match linearizable(&refs, budget) {
        Some(Err(stuck)) => stuck,
        _ => String::from("(the witness's search ran out of budget)"),
    };
    Verdict::Violation { witness, stuck }
}
