//! Model-based test: random sequences of domain operations, reopens and process crashes run
//! against the engine and against a small in-memory model of DESIGN.md's semantics (and the
//! rules documented in `engine/src/verdict.rs`). Every result is compared: verdicts with
//! their facts, read contents, outcomes, error variants, and after every step the whole
//! remembered state (sessions, streams, watermarks, terminal states), which must also never
//! go backwards. Durable MCP task operations run beside them (`model/tasks.rs`): each
//! task's view and every owner's listing are compared after every step too.
//!
//! The model is written from the documents, not from engine code. Segments are 4096 bytes so
//! rotation (and, with trims, retention) happens. A crash copies the segment files while the
//! engine is open (process crash: everything acknowledged is in the page cache) with either
//! no index or a stale index from an earlier clean close, then opens the copy: nothing
//! acknowledged may be lost.
//!
//! Runs `PROPTEST_CASES` cases (default 24); `PROPTEST_RNG_SEED` replays a run. A failure
//! prints the shrunk operation list; turn it into a named regression test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "model/tasks.rs"]
mod task_model;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use cursorlog_engine::{
    Append, Engine, Error, Event, Facts, NewEvent, OpenStream, Resolution, StreamState, SyncPolicy,
    Verdict,
};
use proptest::prelude::*;
use task_model::{task_op, TaskModel, TaskOp};
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// Sessions are picked from a small pool so operations collide; the last is rarely opened.
const SESSIONS: [&str; 4] = ["s0", "s1", "s2", "never"];
const KINDS: [&str; 4] = ["", "progress", "result", "ütf-8 ✓"];
const CORRELATIONS: [&str; 3] = ["req-1", "req-2", "7"];

#[derive(Debug, Clone)]
struct Ev {
    kind: u8,
    correlation: Option<u8>,
    len: u16,
    seed: u8,
}

impl Ev {
    fn to_new(&self) -> NewEvent {
        NewEvent {
            kind: KINDS[self.kind as usize % KINDS.len()].into(),
            correlation: self
                .correlation
                .map(|c| CORRELATIONS[c as usize % CORRELATIONS.len()].to_string()),
            payload: (0..self.len)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(self.seed))
                .collect(),
        }
    }
}

/// Which seq, relative to the model's view of the stream.
#[derive(Debug, Clone, Copy)]
enum SeqPick {
    Zero,
    Head,
    HeadPlus(u8),
    HeadMinus(u8),
    Watermark,
    WatermarkMinus(u8),
    Abs(u8),
    Max,
}

#[derive(Debug, Clone)]
enum Expect {
    None,
    Next,
    /// The previous batch of this stream again, unchanged (an idempotent retry).
    RetryLast,
    /// The previous batch again with one payload changed (a conflicting retry).
    RetryLastChanged,
    Offset(i8),
}

#[derive(Debug, Clone)]
enum CursorPick {
    Malformed(u8),
    Derived {
        stream: u8,
        epoch_delta: i8,
        seq: SeqPick,
    },
    Raw {
        epoch: u8,
        stream: u8,
        seq: u8,
    },
}

#[derive(Debug, Clone)]
enum Op {
    OpenSession(u8),
    AdvanceEpoch(u8),
    ExpireSession(u8),
    OpenStream {
        session: u8,
        epoch_delta: i8,
        correlation: Option<u8>,
    },
    Append {
        stream: u8,
        as_session: Option<u8>,
        expect: Expect,
        events: Vec<Ev>,
    },
    Complete {
        stream: u8,
        as_session: Option<u8>,
        expect_offset: Option<i8>,
        frame: Ev,
    },
    Abort {
        stream: u8,
        as_session: Option<u8>,
        frame: Option<Ev>,
    },
    Trim {
        stream: u8,
        as_session: Option<u8>,
        up_to: SeqPick,
    },
    Resolve {
        as_session: Option<u8>,
        cursor: CursorPick,
        declared: Option<Option<u8>>,
    },
    Read {
        stream: u8,
        as_session: Option<u8>,
        after: SeqPick,
        max: u8,
    },
    Outcome {
        session: u8,
        correlation: u8,
    },
    RunRetention,
    Reopen,
    Crash {
        stale_index: bool,
        /// Bytes of an unacknowledged write torn at the tail (0: none).
        torn: u8,
        /// The torn bytes are the start of a well-formed next frame (else random bytes).
        partial_frame: bool,
    },
    /// A durable MCP task operation.
    Task(TaskOp),
}

const MALFORMED: [&str; 9] = [
    "",
    "1-2",
    "1-2-3-4",
    "a-1-1",
    "+1-1-1",
    "1--1",
    " 1-1-1",
    "18446744073709551616-1-1",
    "1-1-1\n",
];

fn ev() -> impl Strategy<Value = Ev> {
    (
        0u8..4,
        prop::option::weighted(0.2, 0u8..3),
        prop_oneof![3 => 0u16..200, 1 => 200u16..1200],
        any::<u8>(),
    )
        .prop_map(|(kind, correlation, len, seed)| Ev {
            kind,
            correlation,
            len,
            seed,
        })
}

fn seq_pick() -> impl Strategy<Value = SeqPick> {
    prop_oneof![
        1 => Just(SeqPick::Zero),
        3 => Just(SeqPick::Head),
        2 => (1u8..3).prop_map(SeqPick::HeadPlus),
        3 => (1u8..4).prop_map(SeqPick::HeadMinus),
        2 => Just(SeqPick::Watermark),
        2 => (1u8..3).prop_map(SeqPick::WatermarkMinus),
        1 => any::<u8>().prop_map(SeqPick::Abs),
        1 => Just(SeqPick::Max),
    ]
}

fn as_session() -> impl Strategy<Value = Option<u8>> {
    prop::option::weighted(0.15, 0u8..4)
}

fn op() -> impl Strategy<Value = Op> {
    let expect = prop_oneof![
        3 => Just(Expect::None),
        4 => Just(Expect::Next),
        3 => Just(Expect::RetryLast),
        1 => Just(Expect::RetryLastChanged),
        1 => (-3i8..3).prop_map(Expect::Offset),
    ];
    let cursor = prop_oneof![
        1 => (0u8..9).prop_map(CursorPick::Malformed),
        8 => (any::<u8>(), prop_oneof![6 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)], seq_pick())
            .prop_map(|(stream, epoch_delta, seq)| CursorPick::Derived { stream, epoch_delta, seq }),
        1 => (0u8..4, any::<u8>(), 0u8..8).prop_map(|(epoch, stream, seq)| CursorPick::Raw { epoch, stream, seq }),
    ];
    prop_oneof![
        4 => (0u8..4).prop_map(Op::OpenSession),
        1 => (0u8..4).prop_map(Op::AdvanceEpoch),
        1 => (0u8..4).prop_map(Op::ExpireSession),
        4 => (0u8..4, prop_oneof![8 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)], prop::option::weighted(0.6, 0u8..3))
            .prop_map(|(session, epoch_delta, correlation)| Op::OpenStream { session, epoch_delta, correlation }),
        14 => (any::<u8>(), as_session(), expect, prop_oneof![1 => Just(vec![]), 12 => prop::collection::vec(ev(), 1..8)])
            .prop_map(|(stream, as_session, expect, events)| Op::Append { stream, as_session, expect, events }),
        2 => (any::<u8>(), as_session(), prop::option::weighted(0.5, -1i8..2), ev())
            .prop_map(|(stream, as_session, expect_offset, frame)| Op::Complete { stream, as_session, expect_offset, frame }),
        1 => (any::<u8>(), as_session(), prop::option::of(ev()))
            .prop_map(|(stream, as_session, frame)| Op::Abort { stream, as_session, frame }),
        5 => (any::<u8>(), as_session(), prop_oneof![2 => Just(SeqPick::Head), 3 => seq_pick()])
            .prop_map(|(stream, as_session, up_to)| Op::Trim { stream, as_session, up_to }),
        10 => (prop::option::weighted(0.2, 0u8..4), cursor, prop::option::weighted(0.5, prop::option::weighted(0.3, any::<u8>())))
            .prop_map(|(as_session, cursor, declared)| Op::Resolve { as_session, cursor, declared }),
        5 => (any::<u8>(), as_session(), seq_pick(), 0u8..8)
            .prop_map(|(stream, as_session, after, max)| Op::Read { stream, as_session, after, max }),
        1 => (0u8..4, 0u8..3).prop_map(|(session, correlation)| Op::Outcome { session, correlation }),
        1 => Just(Op::RunRetention),
        1 => Just(Op::Reopen),
        2 => (any::<bool>(), prop_oneof![1 => Just(0u8), 1 => any::<u8>()], any::<bool>())
            .prop_map(|(stale_index, torn, partial_frame)| Op::Crash { stale_index, torn, partial_frame }),
        20 => task_op().prop_map(Op::Task),
    ]
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct MEvent {
    kind: String,
    correlation: Option<String>,
    payload: Vec<u8>,
    /// Learned from the first read; must never change afterwards (across reopens too).
    at_ms: Option<u64>,
}

impl MEvent {
    fn from_new(e: &NewEvent) -> Self {
        Self {
            kind: e.kind.clone(),
            correlation: e.correlation.clone(),
            payload: e.payload.clone(),
            at_ms: None,
        }
    }

    fn same_as(&self, e: &NewEvent) -> bool {
        self.kind == e.kind && self.correlation == e.correlation && self.payload == e.payload
    }
}

#[derive(Debug, Clone)]
struct MSession {
    epoch: u64,
    expired: bool,
}

#[derive(Debug, Clone)]
struct MStream {
    id: u64,
    session: String,
    epoch: u64,
    state: StreamState,
    head: u64,
    watermark: u64,
    /// Retained events (seq >= watermark).
    events: BTreeMap<u64, MEvent>,
    correlation: Option<String>,
    end_reason: Option<String>,
    /// The terminal frame (kept for the outcome even once trimmed from `events`).
    terminal_frame: Option<(u64, MEvent)>,
    /// The last appended batch (first seq and events), for retries.
    last_batch: Option<(u64, Vec<NewEvent>)>,
}

impl MStream {
    fn terminal_seq(&self) -> Option<u64> {
        self.state.is_terminal().then_some(self.head)
    }
}

#[derive(Debug, Default)]
struct Model {
    sessions: BTreeMap<String, MSession>,
    /// In creation order; ids must be strictly increasing.
    streams: Vec<MStream>,
    /// (session, correlation) -> stream answering it (the latest opened).
    outcomes: BTreeMap<(String, String), u64>,
}

/// Errors reduced to what the model predicts (reasons and messages are not compared).
#[derive(Debug, Clone, PartialEq, Eq)]
enum MErr {
    Invalid(&'static str),
    UnknownSession,
    SessionExpired,
    UnknownStream(u64),
    StaleEpoch {
        given: u64,
        current: u64,
    },
    Terminated {
        stream: u64,
        state: StreamState,
        terminal_seq: u64,
    },
    SeqConflict {
        stream: u64,
        expected: u64,
        head: u64,
    },
    Evicted {
        stream: u64,
        seq: u64,
        watermark: u64,
    },
    Other(String),
}

fn merr(e: Error) -> MErr {
    match e {
        Error::InvalidArgument { field, .. } => MErr::Invalid(field),
        Error::UnknownSession => MErr::UnknownSession,
        Error::SessionExpired => MErr::SessionExpired,
        Error::UnknownStream(s) => MErr::UnknownStream(s),
        Error::StaleEpoch { given, current } => MErr::StaleEpoch { given, current },
        Error::StreamTerminated {
            stream,
            state,
            terminal_seq,
        } => MErr::Terminated {
            stream,
            state,
            terminal_seq,
        },
        Error::SeqConflict {
            stream,
            expected,
            head,
            ..
        } => MErr::SeqConflict {
            stream,
            expected,
            head,
        },
        Error::Evicted {
            stream,
            seq,
            watermark,
        } => MErr::Evicted {
            stream,
            seq,
            watermark,
        },
        other => MErr::Other(format!("{other:?}")),
    }
}

/// A cursor text as DESIGN.md defines it: three decimal u64s separated by dashes.
fn parse_cursor(text: &str) -> Option<(u64, u64, u64)> {
    let parts: Vec<&str> = text.split('-').collect();
    if parts.len() != 3 {
        return None;
    }
    let mut v = [0u64; 3];
    for (slot, p) in v.iter_mut().zip(&parts) {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *slot = p.parse().ok()?;
    }
    Some((v[0], v[1], v[2]))
}

impl Model {
    fn stream(&self, id: u64) -> Option<&MStream> {
        self.streams.iter().find(|s| s.id == id)
    }

    fn stream_mut(&mut self, id: u64) -> Option<&mut MStream> {
        self.streams.iter_mut().find(|s| s.id == id)
    }

    /// The stream `session` may act on, or `UnknownStream`.
    fn owned(&self, session: &str, id: u64) -> Result<&MStream, MErr> {
        self.stream(id)
            .filter(|s| s.session == session)
            .ok_or(MErr::UnknownStream(id))
    }

    fn live_session(&self, session: &str) -> Result<&MSession, MErr> {
        match self.sessions.get(session) {
            None => Err(MErr::UnknownSession),
            Some(s) if s.expired => Err(MErr::SessionExpired),
            Some(s) => Ok(s),
        }
    }

    /// Terminates every open stream of `session` with `state` and `reason`; returns their ids
    /// in ascending order.
    fn end_open_streams(&mut self, session: &str, state: StreamState, reason: &str) -> Vec<u64> {
        let mut ids = Vec::new();
        for s in self.streams.iter_mut().filter(|s| s.session == session) {
            if s.state == StreamState::Open {
                s.state = state;
                s.end_reason = Some(reason.into());
                ids.push(s.id);
            }
        }
        ids.sort_unstable();
        ids
    }

    /// The verdict DESIGN.md's table gives (with verdict.rs's two documented refinements: a
    /// cursor past the terminal seq is CURSOR_AHEAD, a cursor at `watermark - 1` resumes).
    fn resolve(&self, session: &str, text: &str, declared: Option<u64>) -> Resolution {
        let Some((epoch, stream, seq)) = parse_cursor(text) else {
            return Resolution {
                verdict: Verdict::MalformedCursor,
                cursor: None,
                facts: Facts::default(),
            };
        };
        let cursor = Some(cursorlog_engine::Cursor::new(epoch, stream, seq));
        let answer = |verdict, facts| Resolution {
            verdict,
            cursor,
            facts,
        };
        let Some(sess) = self.sessions.get(session) else {
            return answer(Verdict::UnknownSession, Facts::default());
        };
        if sess.expired {
            let facts = Facts {
                session_expired: true,
                ..Facts::default()
            };
            return answer(Verdict::UnknownSession, facts);
        }
        let epoch_only = Facts {
            current_epoch: Some(sess.epoch),
            ..Facts::default()
        };
        if epoch != sess.epoch {
            return answer(Verdict::EpochMismatch, epoch_only);
        }
        let Some(st) = self
            .stream(stream)
            .filter(|s| s.session == session && s.epoch == epoch)
        else {
            return answer(Verdict::UnknownCursor, epoch_only);
        };
        let facts = Facts {
            current_epoch: Some(sess.epoch),
            stream_state: Some(st.state),
            head: Some(st.head),
            terminal_seq: st.terminal_seq(),
            watermark: Some(st.watermark),
            session_expired: false,
            detail: st.end_reason.clone(),
            correlation: st.correlation.clone(),
        };
        let verdict = if declared.is_some_and(|d| d != stream) {
            Verdict::StreamMismatch
        } else if seq > st.head {
            Verdict::CursorAhead
        } else if st.state.is_terminal() {
            Verdict::StreamTerminated
        } else if seq.saturating_add(1) < st.watermark {
            Verdict::CursorEvicted
        } else {
            Verdict::Resumable
        };
        answer(verdict, facts)
    }
}

// ---------------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------------

struct Harness {
    /// Every directory used so far (a crash moves to a copy); the last is current.
    dirs: Vec<TempDir>,
    engine: Option<Engine>,
    /// An index copied at the last clean close, for crashes that keep a stale index.
    stale_index: Option<TempDir>,
    model: Model,
    tasks: TaskModel,
    last_lsn: u64,
    step: usize,
}

fn open_engine(dir: &Path) -> Engine {
    open(dir, SyncPolicy::Never, SMALL_SEGMENT)
}

impl Harness {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let engine = open_engine(dir.path());
        Self {
            dirs: vec![dir],
            engine: Some(engine),
            stale_index: None,
            model: Model::default(),
            tasks: TaskModel::default(),
            last_lsn: 0,
            step: 0,
        }
    }

    fn e(&self) -> &Engine {
        self.engine.as_ref().unwrap()
    }

    fn dir(&self) -> PathBuf {
        self.dirs.last().unwrap().path().to_path_buf()
    }

    /// The stream an op names by index, or an id no stream has. Most picks land on an open
    /// stream (when there is one) so that appends mostly succeed.
    fn pick_stream(&self, k: u8) -> u64 {
        let open: Vec<u64> = self
            .model
            .streams
            .iter()
            .filter(|s| s.state == StreamState::Open)
            .map(|s| s.id)
            .collect();
        match (self.model.streams.len(), open.len()) {
            (0, _) => 1_000_000 + u64::from(k),
            (_, m) if m > 0 && k < 160 => open[k as usize % m],
            (n, _) => self.model.streams[k as usize % n].id,
        }
    }

    /// The stream's own session, or the session an op acts as (possibly another one).
    fn owner_or(&self, id: u64, as_session: Option<u8>) -> String {
        match (as_session, self.model.stream(id)) {
            (None, Some(s)) => s.session.clone(),
            (k, _) => SESSIONS[k.unwrap_or(0) as usize % SESSIONS.len()].to_string(),
        }
    }

    fn seq(&self, id: u64, pick: SeqPick) -> u64 {
        let (head, wm) = self
            .model
            .stream(id)
            .map_or((0, 1), |s| (s.head, s.watermark));
        match pick {
            SeqPick::Zero => 0,
            SeqPick::Head => head,
            SeqPick::HeadPlus(k) => head + u64::from(k),
            SeqPick::HeadMinus(k) => head.saturating_sub(u64::from(k)),
            SeqPick::Watermark => wm,
            SeqPick::WatermarkMinus(k) => wm.saturating_sub(u64::from(k)),
            SeqPick::Abs(k) => u64::from(k),
            SeqPick::Max => u64::MAX,
        }
    }

    fn ctx(&self, op: &Op) -> String {
        format!("step {} ({op:?})", self.step)
    }

    fn run(&mut self, op: &Op) {
        let ctx = self.ctx(op);
        match op {
            Op::OpenSession(k) => {
                let name = SESSIONS[*k as usize];
                let got = self.e().open_session(name).map_err(merr);
                let want = match self.model.sessions.get(name) {
                    Some(s) if s.expired => Err(MErr::SessionExpired),
                    Some(s) => Ok((s.epoch, false)),
                    None => {
                        self.model.sessions.insert(
                            name.into(),
                            MSession {
                                epoch: 1,
                                expired: false,
                            },
                        );
                        Ok((1, true))
                    }
                };
                assert_eq!(got.map(|s| (s.epoch, s.created)), want, "{ctx}");
            }
            Op::AdvanceEpoch(k) => {
                let name = SESSIONS[*k as usize];
                let got = self.e().advance_epoch(name).map_err(merr);
                let want = match self.model.live_session(name) {
                    Err(e) => Err(e),
                    Ok(_) => {
                        let s = self.model.sessions.get_mut(name).unwrap();
                        s.epoch += 1;
                        let epoch = s.epoch;
                        let ids = self.model.end_open_streams(
                            name,
                            StreamState::Superseded,
                            "epoch advanced",
                        );
                        Ok((epoch, ids))
                    }
                };
                assert_eq!(got.map(|a| (a.epoch, a.superseded)), want, "{ctx}");
            }
            Op::ExpireSession(k) => {
                let name = SESSIONS[*k as usize];
                let got = self.e().expire_session(name).map_err(merr);
                let want = match self.model.live_session(name) {
                    Err(e) => Err(e),
                    Ok(_) => {
                        self.model.sessions.get_mut(name).unwrap().expired = true;
                        Ok(self.model.end_open_streams(
                            name,
                            StreamState::Aborted,
                            "session expired",
                        ))
                    }
                };
                assert_eq!(got.map(|x| x.aborted), want, "{ctx}");
            }
            Op::OpenStream {
                session,
                epoch_delta,
                correlation,
            } => {
                let name = SESSIONS[*session as usize];
                let current = self.model.sessions.get(name).map_or(1, |s| s.epoch);
                let epoch = current.saturating_add_signed(i64::from(*epoch_delta));
                let correlation = correlation.map(|c| CORRELATIONS[c as usize].to_string());
                let got = self
                    .e()
                    .open_stream(OpenStream {
                        session: name.into(),
                        epoch,
                        correlation: correlation.clone(),
                        lease_ms: None,
                    })
                    .map_err(merr);
                let want = self.model.live_session(name).and_then(|s| {
                    if s.epoch == epoch {
                        Ok(epoch)
                    } else {
                        Err(MErr::StaleEpoch {
                            given: epoch,
                            current: s.epoch,
                        })
                    }
                });
                assert_eq!(
                    got.as_ref().map(|s| s.epoch).map_err(Clone::clone),
                    want,
                    "{ctx}"
                );
                if let Ok(info) = got {
                    if let Some(prev) = self.model.streams.last() {
                        assert!(info.stream > prev.id, "{ctx}: stream ids are increasing");
                    }
                    if let Some(c) = &correlation {
                        self.model
                            .outcomes
                            .insert((name.to_string(), c.clone()), info.stream);
                    }
                    self.model.streams.push(MStream {
                        id: info.stream,
                        session: name.into(),
                        epoch,
                        state: StreamState::Open,
                        head: 0,
                        watermark: 1,
                        events: BTreeMap::new(),
                        correlation,
                        end_reason: None,
                        terminal_frame: None,
                        last_batch: None,
                    });
                }
            }
            Op::Append {
                stream,
                as_session,
                expect,
                events,
            } => self.append(&ctx, *stream, *as_session, expect, events),
            Op::Complete {
                stream,
                as_session,
                expect_offset,
                frame,
            } => {
                let id = self.pick_stream(*stream);
                let session = self.owner_or(id, *as_session);
                let head = self.model.stream(id).map_or(0, |s| s.head);
                let expected =
                    expect_offset.map(|o| (head + 1).saturating_add_signed(i64::from(o)));
                let frame = frame.to_new();
                let got = self
                    .e()
                    .complete(&session, id, expected, frame.clone())
                    .map_err(merr);
                let want = self.terminate(&session, id, expected, Some(frame), None);
                assert_eq!(
                    got.map(|t| (t.stream, t.state, t.terminal_seq, t.cursor.to_string())),
                    want,
                    "{ctx}"
                );
            }
            Op::Abort {
                stream,
                as_session,
                frame,
            } => {
                let id = self.pick_stream(*stream);
                let session = self.owner_or(id, *as_session);
                let frame = frame.as_ref().map(Ev::to_new);
                let got = self
                    .e()
                    .abort(&session, id, "producer gave up", frame.clone())
                    .map_err(merr);
                let want = self.terminate(&session, id, None, frame, Some("producer gave up"));
                assert_eq!(
                    got.map(|t| (t.stream, t.state, t.terminal_seq, t.cursor.to_string())),
                    want,
                    "{ctx}"
                );
            }
            Op::Trim {
                stream,
                as_session,
                up_to,
            } => {
                let id = self.pick_stream(*stream);
                let session = self.owner_or(id, *as_session);
                let up_to = self.seq(id, *up_to);
                let got = self.e().trim(&session, id, up_to).map_err(merr);
                let want = match self.model.owned(&session, id) {
                    Err(e) => Err(e),
                    Ok(_) => {
                        let s = self.model.stream_mut(id).unwrap();
                        let target = up_to.saturating_add(1).min(s.head + 1);
                        if target > s.watermark {
                            s.watermark = target;
                            s.events.retain(|q, _| *q >= target);
                        }
                        Ok(s.watermark)
                    }
                };
                assert_eq!(got, want, "{ctx}");
            }
            Op::Resolve {
                as_session,
                cursor,
                declared,
            } => self.resolve(&ctx, *as_session, cursor, *declared),
            Op::Read {
                stream,
                as_session,
                after,
                max,
            } => {
                let id = self.pick_stream(*stream);
                let session = self.owner_or(id, *as_session);
                let after = self.seq(id, *after);
                let got = self
                    .e()
                    .read(&session, id, after, u32::from(*max))
                    .map_err(merr);
                let want = match self.model.owned(&session, id) {
                    Err(e) => Err(e),
                    Ok(s) => {
                        let from = after.saturating_add(1);
                        if from < s.watermark {
                            Err(MErr::Evicted {
                                stream: id,
                                seq: from,
                                watermark: s.watermark,
                            })
                        } else {
                            let n = usize::from((*max).max(1));
                            let seqs: Vec<u64> =
                                s.events.range(from..).map(|(q, _)| *q).take(n).collect();
                            let last = seqs.last().copied().unwrap_or(after);
                            let end = s.state.is_terminal() && last >= s.head;
                            Ok((seqs, s.head, s.state, end))
                        }
                    }
                };
                match (got, want) {
                    (Ok(batch), Ok((seqs, head, state, end))) => {
                        assert_eq!(
                            (batch.head, batch.state, batch.end_of_stream),
                            (head, state, end),
                            "{ctx}"
                        );
                        let got_seqs: Vec<u64> = batch.events.iter().map(|e| e.seq).collect();
                        assert_eq!(got_seqs, seqs, "{ctx}: events read");
                        self.check_events(&ctx, id, &batch.events);
                    }
                    (got, want) => assert_eq!(got.map(|_| ()), want.map(|_| ()), "{ctx}"),
                }
            }
            Op::Outcome {
                session,
                correlation,
            } => {
                let name = SESSIONS[*session as usize];
                let c = CORRELATIONS[*correlation as usize];
                let got = self.e().outcome(name, c).unwrap();
                let want = self
                    .model
                    .outcomes
                    .get(&(name.to_string(), c.to_string()))
                    .and_then(|id| self.model.stream(*id));
                match (got, want) {
                    (None, None) => {}
                    (Some(o), Some(s)) => {
                        assert_eq!(
                            (o.stream, o.epoch, o.state, o.terminal_seq, &o.reason),
                            (s.id, s.epoch, s.state, s.terminal_seq(), &s.end_reason),
                            "{ctx}"
                        );
                        let want_frame = s.terminal_frame.clone();
                        match (o.frame, want_frame) {
                            (None, None) => {}
                            (Some(f), Some((seq, m))) => {
                                assert_eq!(
                                    (f.stream, f.seq, &*f.kind, &f.correlation, &f.payload[..]),
                                    (s.id, seq, m.kind.as_str(), &m.correlation, &m.payload[..]),
                                    "{ctx}: terminal frame"
                                );
                                let id = s.id;
                                let slot = &mut self
                                    .model
                                    .stream_mut(id)
                                    .unwrap()
                                    .terminal_frame
                                    .as_mut()
                                    .unwrap()
                                    .1
                                    .at_ms;
                                assert_eq!(
                                    *slot.get_or_insert(f.appended_at_ms),
                                    f.appended_at_ms,
                                    "{ctx}"
                                );
                            }
                            (got, want) => panic!("{ctx}: terminal frame {got:?}, model {want:?}"),
                        }
                    }
                    (got, want) => panic!("{ctx}: outcome {got:?}, model {want:?}"),
                }
            }
            Op::RunRetention => {
                // No age or size rules: only segments whose events are all trimmed may go.
                self.e().run_retention().unwrap();
            }
            Op::Reopen => {
                let e = self.engine.take().unwrap();
                e.close().unwrap();
                drop(e);
                let snap = tempfile::tempdir().unwrap();
                copy_dir(&self.dir().join("index"), snap.path());
                self.stale_index = Some(snap);
                self.reopen(&ctx, self.dir(), 0);
            }
            Op::Crash {
                stale_index,
                torn,
                partial_frame,
            } => {
                // The on-disk log as of now, with the engine still running.
                let copy = tempfile::tempdir().unwrap();
                copy_segments(&self.dir(), copy.path());
                // The torn start of a write that was never acknowledged.
                let tail = last_segment(copy.path());
                let seed = (u64::from(*torn) << 32) | self.step as u64;
                let garbage = match forge_next_frame(&tail) {
                    Some(f) if *partial_frame => f[..usize::from(*torn) % f.len()].to_vec(),
                    _ => SplitMix(seed).bytes(usize::from(*torn)),
                };
                append_bytes(&tail, &garbage);
                if let (true, Some(idx)) = (stale_index, &self.stale_index) {
                    copy_dir(idx.path(), &copy.path().join("index"));
                }
                drop(self.engine.take());
                self.dirs.push(copy);
                self.reopen(&ctx, self.dir(), garbage.len() as u64);
            }
            Op::Task(op) => {
                let e = self.engine.as_ref().unwrap();
                self.tasks.run(e, op, &ctx);
            }
        }
    }

    /// Opens `dir`, whose tail carries `torn` bytes of an unacknowledged write.
    fn reopen(&mut self, ctx: &str, dir: PathBuf, torn: u64) {
        let e = open_engine(&dir);
        let rep = e.recovery_report().clone();
        assert_eq!(
            rep.bytes_truncated, torn,
            "{ctx}: exactly the torn write is cut: {rep}"
        );
        assert!(
            rep.last_lsn >= self.last_lsn,
            "{ctx}: the log went backwards: {rep}"
        );
        self.engine = Some(e);
        self.check_all_events(ctx);
    }

    fn append(&mut self, ctx: &str, k: u8, as_session: Option<u8>, expect: &Expect, evs: &[Ev]) {
        let id = self.pick_stream(k);
        let session = self.owner_or(id, as_session);
        let (head, last_batch) = self
            .model
            .stream(id)
            .map_or((0, None), |s| (s.head, s.last_batch.clone()));
        let mut events: Vec<NewEvent> = evs.iter().map(Ev::to_new).collect();
        let expected = match (expect, last_batch) {
            (Expect::None, _) => None,
            (Expect::Next, _) => Some(head + 1),
            (Expect::RetryLast, Some((first, batch))) => {
                events = batch;
                Some(first)
            }
            (Expect::RetryLastChanged, Some((first, mut batch))) => {
                let last = batch.last_mut().unwrap();
                last.payload.push(0xEE);
                events = batch;
                Some(first)
            }
            (Expect::RetryLast | Expect::RetryLastChanged, None) => Some(head + 1),
            (Expect::Offset(o), _) => Some((head + 1).saturating_add_signed(i64::from(*o))),
        };
        let got = self
            .e()
            .append(Append {
                session: session.clone(),
                stream: id,
                expected_next_seq: expected,
                events: events.clone(),
            })
            .map_err(merr);
        let want = self.model_append(&session, id, expected, &events);
        assert_eq!(
            got.map(|a| (a.epoch, a.stream, a.first_seq, a.last_seq, a.duplicate)),
            want,
            "{ctx}"
        );
    }

    fn model_append(
        &mut self,
        session: &str,
        id: u64,
        expected: Option<u64>,
        events: &[NewEvent],
    ) -> Result<(u64, u64, u64, u64, bool), MErr> {
        if events.is_empty() {
            return Err(MErr::Invalid("events"));
        }
        if expected == Some(0) {
            return Err(MErr::Invalid("expected_next_seq"));
        }
        let s = self.model.owned(session, id)?;
        if s.state.is_terminal() {
            return Err(MErr::Terminated {
                stream: id,
                state: s.state,
                terminal_seq: s.head,
            });
        }
        let n = events.len() as u64;
        let next = s.head + 1;
        let conflict = |expected| MErr::SeqConflict {
            stream: id,
            expected,
            head: s.head,
        };
        match expected {
            Some(x) if x < next => {
                // A retry: it must be exactly a batch already written.
                if x + n - 1 > s.head {
                    return Err(conflict(x));
                }
                if x < s.watermark {
                    return Err(MErr::Evicted {
                        stream: id,
                        seq: x,
                        watermark: s.watermark,
                    });
                }
                let same = events
                    .iter()
                    .enumerate()
                    .all(|(i, e)| s.events.get(&(x + i as u64)).is_some_and(|m| m.same_as(e)));
                if !same {
                    return Err(conflict(x));
                }
                Ok((s.epoch, id, x, x + n - 1, true))
            }
            Some(x) if x > next => Err(conflict(x)),
            _ => {
                let s = self.model.stream_mut(id).unwrap();
                for (i, e) in events.iter().enumerate() {
                    s.events.insert(next + i as u64, MEvent::from_new(e));
                }
                s.head += n;
                s.last_batch = Some((next, events.to_vec()));
                Ok((s.epoch, id, next, next + n - 1, false))
            }
        }
    }

    fn terminate(
        &mut self,
        session: &str,
        id: u64,
        expected: Option<u64>,
        frame: Option<NewEvent>,
        reason: Option<&str>,
    ) -> Result<(u64, StreamState, u64, String), MErr> {
        let s = self.model.owned(session, id)?;
        if s.state.is_terminal() {
            return Err(MErr::Terminated {
                stream: id,
                state: s.state,
                terminal_seq: s.head,
            });
        }
        if let Some(x) = expected {
            if x != s.head + 1 {
                return Err(MErr::SeqConflict {
                    stream: id,
                    expected: x,
                    head: s.head,
                });
            }
        }
        let s = self.model.stream_mut(id).unwrap();
        s.state = if reason.is_some() {
            StreamState::Aborted
        } else {
            StreamState::Completed
        };
        s.end_reason = reason.map(Into::into);
        if let Some(f) = &frame {
            s.head += 1;
            s.events.insert(s.head, MEvent::from_new(f));
            s.terminal_frame = Some((s.head, MEvent::from_new(f)));
        }
        Ok((id, s.state, s.head, format!("{}-{id}-{}", s.epoch, s.head)))
    }

    fn resolve(
        &mut self,
        ctx: &str,
        as_session: Option<u8>,
        cursor: &CursorPick,
        declared: Option<Option<u8>>,
    ) {
        let (text, owner) = match cursor {
            CursorPick::Malformed(k) => (MALFORMED[*k as usize].to_string(), None),
            CursorPick::Derived {
                stream,
                epoch_delta,
                seq,
            } => {
                let id = self.pick_stream(*stream);
                let (epoch, owner) = self
                    .model
                    .stream(id)
                    .map_or((1, None), |s| (s.epoch, Some(s.session.clone())));
                let epoch = epoch.saturating_add_signed(i64::from(*epoch_delta));
                (format!("{epoch}-{id}-{}", self.seq(id, *seq)), owner)
            }
            CursorPick::Raw { epoch, stream, seq } => (format!("{epoch}-{stream}-{seq}"), None),
        };
        let session = match (as_session, owner) {
            (None, Some(o)) => o,
            (k, _) => SESSIONS[k.unwrap_or(0) as usize].to_string(),
        };
        let cursor_stream = parse_cursor(&text).map_or(0, |c| c.1);
        let declared = declared.map(|d| d.map_or(cursor_stream, |k| self.pick_stream(k)));
        let got = self.e().resolve(&session, &text, declared).unwrap();
        let mut want = self.model.resolve(&session, &text, declared);
        if want.verdict == Verdict::MalformedCursor {
            // The engine says why; the model only requires that it does.
            assert!(
                got.facts.detail.is_some(),
                "{ctx}: a malformed verdict says why"
            );
            want.facts.detail.clone_from(&got.facts.detail);
        }
        assert_eq!(
            got, want,
            "{ctx}: resolve({session:?}, {text:?}, {declared:?})"
        );
        // The gap-free promise: after a RESUMABLE cursor, a read returns exactly the
        // retained events after it.
        if got.verdict == Verdict::Resumable {
            let c = got.cursor.unwrap();
            let batch = self.e().read(&session, c.stream, c.seq, 4096).unwrap();
            let want: Vec<u64> = (c.seq + 1..=got.facts.head.unwrap()).collect();
            let seqs: Vec<u64> = batch.events.iter().map(|e| e.seq).collect();
            assert_eq!(
                seqs, want,
                "{ctx}: replay after a resumable cursor is gap-free"
            );
            self.check_events(ctx, c.stream, &batch.events);
        }
    }

    /// Compares events read with the model's, learning and then pinning their times.
    fn check_events(&mut self, ctx: &str, id: u64, events: &[Event]) {
        let s = self.model.stream_mut(id).unwrap();
        for e in events {
            let m = s
                .events
                .get_mut(&e.seq)
                .unwrap_or_else(|| panic!("{ctx}: engine served {id}/{} the model lacks", e.seq));
            assert_eq!(
                (e.stream, &*e.kind, &e.correlation, &e.payload[..]),
                (id, m.kind.as_str(), &m.correlation, &m.payload[..]),
                "{ctx}: event {id}/{} differs",
                e.seq
            );
            assert_eq!(
                *m.at_ms.get_or_insert(e.appended_at_ms),
                e.appended_at_ms,
                "{ctx}: event {id}/{} changed its time",
                e.seq
            );
        }
    }

    /// Reads every retained event of every stream and compares.
    fn check_all_events(&mut self, ctx: &str) {
        let ids: Vec<(u64, String, u64)> = self
            .model
            .streams
            .iter()
            .map(|s| (s.id, s.session.clone(), s.watermark))
            .collect();
        for (id, session, wm) in ids {
            let batch = self.e().read(&session, id, wm - 1, 4096).unwrap();
            let want: Vec<u64> = self
                .model
                .stream(id)
                .unwrap()
                .events
                .keys()
                .copied()
                .collect();
            let got: Vec<u64> = batch.events.iter().map(|e| e.seq).collect();
            assert_eq!(got, want, "{ctx}: all retained events of {id}");
            self.check_events(ctx, id, &batch.events);
        }
    }

    /// After every step: the engine's whole remembered state equals the model's, and no
    /// watermark, head, epoch or terminal state went backwards.
    fn check_state(&mut self, ctx: &str) {
        let e = self.e();
        let mut sessions: Vec<(String, u64, bool)> = e
            .sessions()
            .unwrap()
            .into_iter()
            .map(|s| (s.id, s.epoch, s.expired_at_ms.is_some()))
            .collect();
        sessions.sort();
        let want: Vec<(String, u64, bool)> = self
            .model
            .sessions
            .iter()
            .map(|(k, s)| (k.clone(), s.epoch, s.expired))
            .collect();
        assert_eq!(sessions, want, "{ctx}: sessions");
        let mut streams: Vec<_> = e
            .streams()
            .unwrap()
            .into_iter()
            .map(|s| {
                (
                    s.id,
                    s.session,
                    s.epoch,
                    s.state,
                    s.head,
                    s.watermark,
                    s.correlation,
                    s.end_reason,
                    s.has_terminal_frame,
                )
            })
            .collect();
        streams.sort_by_key(|s| s.0);
        let want: Vec<_> = self
            .model
            .streams
            .iter()
            .map(|s| {
                (
                    s.id,
                    s.session.clone(),
                    s.epoch,
                    s.state,
                    s.head,
                    s.watermark,
                    s.correlation.clone(),
                    s.end_reason.clone(),
                    s.terminal_frame.is_some(),
                )
            })
            .collect();
        assert_eq!(streams, want, "{ctx}: streams");
        let lsn = e.stats().unwrap().last_lsn;
        assert!(lsn >= self.last_lsn, "{ctx}: last lsn went backwards");
        self.last_lsn = lsn;
        let e = self.engine.as_ref().unwrap();
        self.tasks.check(e, ctx);
    }
}

/// Every case starts from the same few sessions and streams, so generated operations mostly
/// act on something that exists.
fn prelude() -> Vec<Op> {
    let mut ops: Vec<Op> = (0..3).map(Op::OpenSession).collect();
    for session in [0, 0, 1, 2] {
        ops.push(Op::OpenStream {
            session,
            epoch_delta: 0,
            correlation: Some(session),
        });
    }
    ops
}

/// Runs one case and checks it step by step. Watermarks, heads and terminal states are
/// compared to a model in which they only ever move forward, so any regression is caught.
fn run_case(ops: &[Op]) {
    let mut h = Harness::new();
    for op in prelude() {
        h.run(&op);
    }
    let mut prev: BTreeMap<u64, (StreamState, u64, u64)> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        h.step = i;
        h.run(op);
        let ctx = h.ctx(op);
        h.check_state(&ctx);
        for s in &h.model.streams {
            if let Some((state, head, wm)) = prev.get(&s.id) {
                assert!(
                    s.watermark >= *wm && s.head >= *head,
                    "{ctx}: went backwards"
                );
                assert!(
                    !state.is_terminal() || s.state == *state,
                    "{ctx}: terminal state changed"
                );
            }
            prev.insert(s.id, (s.state, s.head, s.watermark));
        }
    }
    let ctx = format!("end after {} steps", ops.len());
    h.check_all_events(&ctx);
    // A final clean close and reopen must show the same state.
    let e = h.engine.take().unwrap();
    e.close().unwrap();
    drop(e);
    h.reopen(&ctx, h.dir(), 0);
    h.check_state(&ctx);
    h.e().close().unwrap();
}

fn proptest_config() -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = 24;
    }
    if std::env::var_os("PROPTEST_MAX_SHRINK_TIME").is_none() {
        c.max_shrink_time = 120_000;
    }
    // Failures are printed (shrunk), not written next to the sources.
    c.failure_persistence = None;
    c
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn engine_matches_the_model(ops in prop::collection::vec(op(), 1..120)) {
        run_case(&ops);
    }
}

/// A fixed, hand-written sequence touching every operation once, so the harness itself is
/// exercised even with `PROPTEST_CASES=0`.
#[test]
fn model_smoke_sequence() {
    let e = |len| Ev {
        kind: 1,
        correlation: None,
        len,
        seed: 3,
    };
    let ops = vec![
        Op::OpenSession(0),
        Op::OpenStream {
            session: 0,
            epoch_delta: 0,
            correlation: Some(0),
        },
        Op::Append {
            stream: 0,
            as_session: None,
            expect: Expect::Next,
            events: vec![e(10), e(300), e(0)],
        },
        Op::Append {
            stream: 0,
            as_session: None,
            expect: Expect::RetryLast,
            events: vec![],
        },
        Op::Append {
            stream: 0,
            as_session: None,
            expect: Expect::RetryLastChanged,
            events: vec![],
        },
        Op::Append {
            stream: 0,
            as_session: Some(1),
            expect: Expect::None,
            events: vec![e(5)],
        },
        Op::Resolve {
            as_session: None,
            cursor: CursorPick::Derived {
                stream: 0,
                epoch_delta: 0,
                seq: SeqPick::HeadMinus(2),
            },
            declared: Some(None),
        },
        Op::Trim {
            stream: 0,
            as_session: None,
            up_to: SeqPick::HeadMinus(1),
        },
        Op::Read {
            stream: 0,
            as_session: None,
            after: SeqPick::Zero,
            max: 3,
        },
        Op::Crash {
            stale_index: false,
            torn: 0,
            partial_frame: false,
        },
        Op::Complete {
            stream: 0,
            as_session: None,
            expect_offset: Some(0),
            frame: e(7),
        },
        Op::Outcome {
            session: 0,
            correlation: 0,
        },
        Op::Reopen,
        Op::OpenStream {
            session: 0,
            epoch_delta: 0,
            correlation: None,
        },
        Op::AdvanceEpoch(0),
        Op::Abort {
            stream: 1,
            as_session: None,
            frame: Some(e(1)),
        },
        Op::RunRetention,
        Op::Crash {
            stale_index: true,
            torn: 200,
            partial_frame: true,
        },
        Op::Resolve {
            as_session: None,
            cursor: CursorPick::Malformed(7),
            declared: None,
        },
        Op::ExpireSession(0),
        Op::OpenSession(0),
    ];
    run_case(&ops);
}

/// A fixed sequence touching every task operation (and a crash and a reopen between them),
/// so the task model is exercised even with `PROPTEST_CASES=0`.
#[test]
fn model_task_smoke_sequence() {
    let t = |op: TaskOp| Op::Task(op);
    let ops = vec![
        t(TaskOp::Create {
            owner: 0,
            task: 0,
            key: 0,
        }),
        t(TaskOp::Create {
            owner: 0,
            task: 1,
            key: 0,
        }),
        t(TaskOp::Create {
            owner: 0,
            task: 0,
            key: 1,
        }),
        t(TaskOp::Create {
            owner: 1,
            task: 0,
            key: 0,
        }),
        t(TaskOp::Change {
            owner: 0,
            task: 0,
            input_required: false,
            expected: Some(0),
            message: Some(1),
        }),
        t(TaskOp::Change {
            owner: 0,
            task: 0,
            input_required: false,
            expected: Some(-1),
            message: None,
        }),
        t(TaskOp::RequestInput {
            owner: 0,
            task: 0,
            keys: vec![0, 1],
        }),
        t(TaskOp::RequestInput {
            owner: 0,
            task: 0,
            keys: vec![1],
        }),
        t(TaskOp::Answer {
            owner: 0,
            task: 0,
            keys: vec![0, 0, 3],
        }),
        t(TaskOp::Enqueue {
            owner: 0,
            task: 0,
            inbound: false,
            dedupe: Some(0),
            len: 5,
        }),
        t(TaskOp::Enqueue {
            owner: 0,
            task: 0,
            inbound: false,
            dedupe: Some(0),
            len: 5,
        }),
        t(TaskOp::Enqueue {
            owner: 0,
            task: 0,
            inbound: true,
            dedupe: None,
            len: 0,
        }),
        Op::Crash {
            stale_index: false,
            torn: 0,
            partial_frame: false,
        },
        t(TaskOp::Dequeue {
            owner: 0,
            task: 0,
            inbound: false,
            max: 0,
            token: 0,
        }),
        t(TaskOp::Dequeue {
            owner: 0,
            task: 0,
            inbound: false,
            max: 0,
            token: 0,
        }),
        t(TaskOp::Cancel {
            owner: 0,
            task: 0,
            terminal: false,
        }),
        t(TaskOp::Finish {
            owner: 0,
            task: 0,
            status: 0,
            expected: Some(0),
            outcome: 1,
        }),
        t(TaskOp::Finish {
            owner: 0,
            task: 0,
            status: 0,
            expected: None,
            outcome: 0,
        }),
        t(TaskOp::Finish {
            owner: 0,
            task: 0,
            status: 1,
            expected: None,
            outcome: 3,
        }),
        Op::Reopen,
        t(TaskOp::Cancel {
            owner: 1,
            task: 0,
            terminal: true,
        }),
        t(TaskOp::Delete { owner: 0, task: 0 }),
        t(TaskOp::Delete { owner: 0, task: 0 }),
        t(TaskOp::Create {
            owner: 0,
            task: 0,
            key: 0,
        }),
        t(TaskOp::Create {
            owner: 0,
            task: 2,
            key: 0,
        }),
        Op::Crash {
            stale_index: true,
            torn: 9,
            partial_frame: true,
        },
    ];
    run_case(&ops);
}
