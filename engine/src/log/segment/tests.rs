//! Damage under a running engine: a sealed segment cut short, overwritten or gone is an
//! error for the range read (never a `SIGBUS`), and the rest of the log is still served.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::{cache, is_media_error, Segment};
use crate::error::{CorruptionKind, Error};
use crate::fs::{FileSystem, StdFs};
use crate::{Append, Config, Engine, NewEvent, OpenStream};

const EVENTS: u64 = 300;

/// An engine on 64 KiB segments holding stream "s" (300 events of 1000 bytes, about five
/// segments) and then stream "t" (20 events); returns it, both streams and the segment files.
fn engine_with_two_streams(dir: &std::path::Path) -> (Engine, u64, u64, Vec<PathBuf>) {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 64 * 1024;
    c.retention.max_age = None;
    c.disk_reserve_bytes = 0;
    let e = Engine::open(c).unwrap();
    let open = |session: &str| {
        let epoch = e.open_session(session).unwrap().epoch;
        e.open_stream(OpenStream {
            session: session.into(),
            epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream
    };
    let (s, t) = (open("s"), open("t"));
    for (session, stream, n) in [("s", s, EVENTS), ("t", t, 20)] {
        for _ in 0..n {
            e.append(Append {
                session: session.into(),
                stream,
                expected_next_seq: None,
                events: vec![NewEvent::new("p", vec![7; 1000])],
            })
            .unwrap();
        }
    }
    let files = e.segments().into_iter().map(|(p, _, _)| p).collect();
    (e, s, t, files)
}

#[test]
fn a_sealed_segment_cut_short_is_data_loss_for_that_range_and_the_rest_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let (e, s, t, files) = engine_with_two_streams(dir.path());
    assert!(files.len() >= 5, "test setup: {} segments", files.len());
    let damaged = &files[1];
    // Read once first, so the read path holds (caches) a descriptor of the file when it is cut.
    // The cut is at a page boundary: through a map, touching the next page was a SIGBUS.
    assert_eq!(e.read("s", s, 0, 1000).unwrap().events.len() as u64, EVENTS);
    std::fs::OpenOptions::new()
        .write(true)
        .open(damaged)
        .unwrap()
        .set_len(8192)
        .unwrap();

    let err = e.read("s", s, 0, 1000).unwrap_err();
    let Error::Corruption {
        segment,
        offset,
        kind: CorruptionKind::Truncated { file_len, written },
    } = &err
    else {
        panic!("expected a truncated segment, got {err:?}");
    };
    assert_eq!(segment, damaged);
    assert_eq!(*file_len, Some(8192));
    assert!(*offset >= 8192 && *offset < *written, "{err}");
    // The same range again: the same error (no crash), the events before it are served, and
    // so are the events after it and the other stream.
    assert!(matches!(
        e.read("s", s, 0, 1000),
        Err(Error::Corruption { .. })
    ));
    assert_eq!(e.read("s", s, 0, 1).unwrap().events.len(), 1);
    let tail = e.read("s", s, EVENTS - 10, 1000).unwrap();
    assert_eq!(tail.events.len(), 10);
    assert_eq!(e.read("t", t, 0, 1000).unwrap().events.len(), 20);
}

#[test]
fn a_sealed_segment_overwritten_is_data_loss_for_that_range() {
    let dir = tempfile::tempdir().unwrap();
    let (e, s, t, files) = engine_with_two_streams(dir.path());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[2])
        .unwrap();
    file.write_all_at(&[0xff; 64], 20_000).unwrap();
    let err = e.read("s", s, 0, 1000).unwrap_err();
    assert!(
        matches!(&err, Error::Corruption { segment, .. } if *segment == files[2]),
        "{err:?}"
    );
    assert_eq!(e.read("s", s, EVENTS - 10, 1000).unwrap().events.len(), 10);
    assert_eq!(e.read("t", t, 0, 1000).unwrap().events.len(), 20);
}

#[test]
fn a_sealed_segment_file_that_is_gone_is_a_missing_segment_not_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("00000000000000000001.seg");
    std::fs::write(&path, [1u8; 64]).unwrap();
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let seg = Segment::open_sealed(fs, path.clone(), 1, 64).unwrap();
    assert!(
        !seg.holds_descriptor(),
        "a sealed segment opens no descriptor at rest"
    );
    std::fs::remove_file(&path).unwrap();
    let err = seg.read_at(0, 8).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Corruption {
                kind: CorruptionKind::MissingSegment,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn sealed_segments_keep_at_most_the_cache_bound_of_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let segments: Vec<Segment> = (0..cache::DESCRIPTORS_MAX as u64 + 8)
        .map(|i| {
            let path = dir.path().join(format!("{i:020}.seg"));
            std::fs::write(&path, [1u8; 64]).unwrap();
            Segment::open_sealed(Arc::clone(&fs), path, i, 64).unwrap()
        })
        .collect();
    for seg in &segments {
        assert_eq!(seg.read_at(8, 8).unwrap(), [1u8; 8]);
    }
    let open = segments.iter().filter(|s| s.holds_descriptor()).count();
    assert!(open <= cache::DESCRIPTORS_MAX, "{open} descriptors held");
    // A dropped segment's cached descriptor is closed with it.
    let last = segments.last().unwrap();
    assert_eq!(last.read_at(0, 1).unwrap(), [1u8]);
    assert!(last.holds_descriptor());
    let id = last.id;
    drop(segments);
    assert!(!cache::contains(id));
}

#[test]
fn media_errors_are_data_loss_and_other_read_errors_are_not() {
    for (errno, media) in [
        (5, true),
        (6, true),
        (74, true),
        (117, true),
        (12, false),
        (9, false),
    ] {
        assert_eq!(
            is_media_error(&std::io::Error::from_raw_os_error(errno)),
            media,
            "errno {errno}"
        );
    }
    assert!(!is_media_error(&std::io::Error::other("injected")));
}
