//! A workload that writes every kind of record, and a text of everything an engine serves,
//! to compare two engines' states (a single node's and a replicated node's).

use std::fmt::Write as _;

use cursorlog_engine::{Cursor, Engine};

use super::{append_range, event, new_stream};

/// A workload with every kind of record a request writes: sessions with
/// state, streams with correlations, batches, a completion with a frame, an abort, a trim,
/// an epoch advance that supersedes, an expiry.
pub fn history(e: &Engine) {
    e.open_session_with_state("alpha", Some(b"init".to_vec()))
        .unwrap();
    let (_, a1) = new_stream(e, "alpha", Some("req-1"));
    append_range(e, "alpha", a1, 1, 5);
    append_range(e, "alpha", a1, 6, 9);
    e.complete("alpha", a1, Some(10), event(a1, 10)).unwrap();
    let (_, a2) = new_stream(e, "alpha", Some("req-2"));
    append_range(e, "alpha", a2, 1, 3);
    e.trim("alpha", a2, 2).unwrap();
    let (_, b1) = new_stream(e, "beta", None);
    append_range(e, "beta", b1, 1, 2);
    e.abort("beta", b1, "tool failed", None).unwrap();
    let (_, b2) = new_stream(e, "beta", Some("req-9"));
    append_range(e, "beta", b2, 1, 4);
    e.advance_epoch("beta").unwrap();
    let (_, b3) = new_stream(e, "beta", None);
    append_range(e, "beta", b3, 1, 1);
    e.set_session_state("beta", b"later".to_vec()).unwrap();
    let (_, g1) = new_stream(e, "gamma", None);
    append_range(e, "gamma", g1, 1, 2);
    e.expire_session("gamma").unwrap();
}

/// Everything the engine serves about its state, as text.
pub fn describe(e: &Engine) -> String {
    let mut out = String::new();
    let mut sessions = e.sessions().unwrap();
    sessions.sort_by(|a, b| a.id.cmp(&b.id));
    for s in &sessions {
        let view = e.session(&s.id).unwrap().unwrap();
        writeln!(out, "{s:?} state={:?}", view.state).unwrap();
    }
    let mut streams = e.streams().unwrap();
    streams.sort_by_key(|s| s.id);
    for s in &streams {
        writeln!(out, "{s:?}").unwrap();
        match e.read(&s.session, s.id, s.watermark - 1, 1000) {
            Ok(batch) => {
                for ev in &batch.events {
                    writeln!(out, "  {ev:?}").unwrap();
                    let cursor = Cursor::new(s.epoch, s.id, ev.seq).to_string();
                    let r = e.resolve(&s.session, &cursor, Some(s.id)).unwrap();
                    writeln!(out, "  resolve {cursor}: {:?}", r.verdict).unwrap();
                }
            }
            Err(err) => writeln!(out, "  read: {err}").unwrap(),
        }
        if let Some(c) = &s.correlation {
            writeln!(
                out,
                "  outcome {c}: {:?}",
                e.outcome(&s.session, c).unwrap()
            )
            .unwrap();
        }
    }
    out
}
