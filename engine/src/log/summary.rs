//! Per-segment summaries for retention: for each sealed segment, its newest append time and
//! the highest event seq of every stream in it. A sealed segment never changes, so each is
//! scanned once, with positional reads (not through its map, so a pass leaves nothing
//! resident), and kept until the segment is gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::log::frames::{walk_known, Step, Windowed};
use crate::log::Segment;
use crate::record::{tag, Record};

/// Per segment: the newest append time and, per stream, the highest event seq in it.
#[derive(Debug)]
pub(crate) struct SegmentSummary {
    pub newest_ms: u64,
    pub max_seq: BTreeMap<u64, u64>,
}

/// Summaries of sealed segments, by base LSN. A sealed segment never changes, so each is
/// scanned once (and read with positional reads, not through its map, so a pass does not
/// leave a whole segment resident), instead of on every retention pass.
#[derive(Debug, Default)]
pub(crate) struct Summaries(Mutex<HashMap<u64, Arc<SegmentSummary>>>);

impl Summaries {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<SegmentSummary>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn get(&self, seg: &Segment) -> Result<Arc<SegmentSummary>> {
        if let Some(s) = self.lock().get(&seg.base_lsn()) {
            return Ok(Arc::clone(s));
        }
        let summary = Arc::new(summarize(seg)?);
        self.lock().insert(seg.base_lsn(), Arc::clone(&summary));
        Ok(summary)
    }

    /// Forgets segments that are gone.
    pub(crate) fn keep_only(&self, bases: &[u64]) {
        self.lock().retain(|base, _| bases.contains(base));
    }
}

fn summarize(seg: &Segment) -> Result<SegmentSummary> {
    let mut s = SegmentSummary {
        newest_ms: 0,
        max_seq: BTreeMap::new(),
    };
    // Window by window (positional reads, not the map, so nothing stays resident), frame by
    // frame. A frame that does not check is an error, never the end of the summary: a
    // summary missing the streams after it could call live events dead and retire them. A
    // record of a type this build does not know is one such frame (it may be a newer
    // build's record that keeps events alive).
    let end = walk_known(&mut Windowed::new(seg), seg.base_lsn(), |step| {
        let Step::Frame(f) = step else {
            return Ok(Ok(()));
        };
        let event = match f.header.record_type {
            tag::EVENT | tag::TERMINAL => match Record::decode(f.header.record_type, f.body) {
                Ok(Record::Event(e)) => Some((e.stream, e.seq, e.at_ms)),
                Ok(Record::Terminal(t)) if t.frame.is_some() => {
                    Some((t.stream, t.terminal_seq, t.at_ms))
                }
                Ok(_) => None,
                Err(why) => return Ok(Err(crate::error::CorruptionKind::BadBody(why))),
            },
            _ => None,
        };
        if let Some((stream, seq, at)) = event {
            s.newest_ms = s.newest_ms.max(at);
            let m = s.max_seq.entry(stream).or_insert(0);
            *m = (*m).max(seq);
        }
        Ok(Ok(()))
    })?;
    if let Some((offset, kind)) = end.damage {
        return Err(seg.corruption(offset, kind));
    }
    Ok(s)
}
