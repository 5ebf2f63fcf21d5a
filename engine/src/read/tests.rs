//! Reads resumed from a [`ReadPosition`]: the same answers as reads through the index, and a
//! damaged frame at the position still an error.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::os::unix::fs::FileExt;

use crate::error::Error;
use crate::{Append, Config, Engine, NewEvent, OpenStream};

/// Streams "a" and "b" of one session, appended in turns of `run` events each (so each
/// stream's frames come in runs of `run`), `turns` turns.
fn engine(dir: &std::path::Path, run: usize, turns: usize) -> (Engine, u64, u64) {
    let mut c = Config::new(dir);
    c.retention.max_age = None;
    c.disk_reserve_bytes = 0;
    let e = Engine::open(c).unwrap();
    let epoch = e.open_session("s").unwrap().epoch;
    let open = || {
        e.open_stream(OpenStream {
            session: "s".into(),
            epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream
    };
    let (a, b) = (open(), open());
    for turn in 0..turns {
        for stream in [a, b] {
            let events = (0..run)
                .map(|i| NewEvent::new("k", format!("{stream}-{turn}-{i}").into_bytes()))
                .collect();
            e.append(Append {
                session: "s".into(),
                stream,
                expected_next_seq: None,
                events,
            })
            .unwrap();
        }
    }
    (e, a, b)
}

#[test]
fn reads_resumed_from_their_positions_return_what_reads_through_the_index_do() {
    let dir = tempfile::tempdir().unwrap();
    let (e, a, b) = engine(dir.path(), 50, 6);
    let whole = e.read("s", a, 0, 1000).unwrap().events;
    assert_eq!(whole.len(), 300);
    let (mut after, mut from, mut got, mut resumed) = (0, None, Vec::new(), 0);
    while after < 300 {
        let batch = e.read_from("s", a, after, 7, from).unwrap();
        let plain = e.read("s", a, after, 7).unwrap();
        assert_eq!((&batch.events, batch.head), (&plain.events, plain.head));
        resumed += usize::from(from.is_some());
        from = batch.next;
        after = batch.events.last().unwrap().seq;
        got.extend(batch.events);
    }
    assert_eq!(got, whole);
    assert!(resumed > 30, "most reads start at a position ({resumed})");
    // A position for another stream, or another seq, is ignored.
    let first = e.read("s", a, 0, 7).unwrap();
    let other = e.read_from("s", b, 0, 7, first.next).unwrap();
    assert_eq!(other.events, e.read("s", b, 0, 7).unwrap().events);
    let skipped = e.read_from("s", a, 8, 7, first.next).unwrap();
    assert_eq!(skipped.events, e.read("s", a, 8, 7).unwrap().events);
}

#[test]
fn a_damaged_frame_at_a_position_is_still_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (e, a, _) = engine(dir.path(), 50, 2);
    let first = e.read("s", a, 0, 10).unwrap();
    let at = first.next.unwrap();
    assert_eq!(at.seq, 11);
    let place = at.place.unwrap();
    let (path, _, _) = e.segments().into_iter().next().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all_at(&[0xff; 16], place.offset + 60)
        .unwrap();
    let err = e.read_from("s", a, 10, 10, Some(at)).unwrap_err();
    assert!(
        matches!(&err, Error::Corruption { offset, .. } if *offset == place.offset),
        "{err:?}"
    );
    // Events before the damage are still served, with or without the position.
    assert_eq!(e.read("s", a, 0, 10).unwrap().events, first.events);
}
