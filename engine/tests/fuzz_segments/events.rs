//! Every event a segment image holds, decoded from FORMAT.md without engine code: the
//! oracle of what may ever be served at a (stream, seq) of an unmutated seed (events below
//! a watermark included, since a cut tail may take a trim away with it).

use std::collections::HashMap;

use cursorlog_engine::{Bytes, Event};

use super::mutate::SegFile;

/// Events by (stream, seq), as written (more than one where a mutation left two different
/// CRC-valid frames for one seq).
pub type Written = HashMap<(u64, u64), Vec<Event>>;

/// True when `ev` is one of the events written at its (stream, seq).
pub fn holds(written: &Written, ev: &Event) -> bool {
    written
        .get(&(ev.stream, ev.seq))
        .is_some_and(|v| v.contains(ev))
}

struct Body<'a> {
    b: &'a [u8],
    at: usize,
}

impl Body<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n).map(<[u8]>::to_vec)
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?).ok()
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        match self.u8()? {
            0 => Some(None),
            1 => f(self).map(Some),
            _ => None,
        }
    }
    fn event(&mut self) -> Option<Event> {
        let stream = self.u64()?;
        let seq = self.u64()?;
        let at_ms = self.u64()?;
        let kind = self.string()?;
        let correlation = self.opt(Self::string)?;
        let payload = self.bytes()?;
        Some(Event {
            stream,
            seq,
            kind: kind.into(),
            correlation,
            payload: Bytes::from(payload),
            appended_at_ms: at_ms,
        })
    }
    /// A record's event, if it carries one: Event (5), Terminal with a frame (6),
    /// StreamSnapshot with a terminal frame (9).
    fn record_event(&mut self, tag: u8) -> Option<Event> {
        match tag {
            5 => self.event(),
            6 => {
                self.u64()?; // stream
                self.u32()?; // state
                self.u64()?; // terminal_seq
                self.u64()?; // at_ms
                self.opt(Self::string)?; // reason
                self.opt(Self::event)?
            }
            9 => {
                self.u64()?; // id
                self.string()?; // session
                self.u64()?; // epoch
                self.u32()?; // state
                self.u64()?; // head
                self.u64()?; // watermark
                self.opt(Self::string)?; // correlation
                self.u64()?; // opened_at_ms
                self.opt(Self::u64)?; // ended_at_ms
                self.opt(Self::string)?; // end_reason
                self.u8()?; // has_terminal_frame
                self.opt(Self::u64)?; // lease_ms
                self.opt(Self::event)?
            }
            _ => None,
        }
    }
}

/// Adds the events of every CRC-valid frame of `files` to `out`: the frames in sequence and,
/// past damage, any CRC-valid frame at any offset (an index may point there directly).
pub fn collect(files: &[SegFile], out: &mut Written) {
    for f in files {
        let b = &f.bytes;
        let (header, frame_header, type_at) = match b.get(8..12) {
            Some([1, 0, 0, 0]) => (32, 24, 20),
            Some([2, 0, 0, 0]) => (64, 32, 28),
            _ => (80, 48, 44),
        };
        let mut off = header;
        while off + frame_header <= b.len() {
            let len = u32::from_le_bytes(b[off..off + 4].try_into().unwrap_or([0; 4]));
            let end = (off + frame_header).saturating_add(len as usize);
            let valid = b.get(off..end).filter(|frame| {
                let crc = u32::from_le_bytes(frame[4..8].try_into().unwrap_or([0; 4]));
                crc32fast::hash(&frame[8..]) == crc
            });
            let Some(frame) = valid else {
                off += 1;
                continue;
            };
            let mut body = Body {
                b: &frame[frame_header..],
                at: 0,
            };
            if let Some(ev) = body.record_event(frame[type_at]) {
                let at = out.entry((ev.stream, ev.seq)).or_default();
                if !at.contains(&ev) {
                    at.push(ev);
                }
            }
            off = end;
        }
    }
}
