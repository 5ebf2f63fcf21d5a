//! The event id / resumption cursor: `{epoch}-{stream}-{seq}`, three decimal u64s.
//!
//! The session is never inside the cursor; it always travels beside it and a cursor is only
//! interpreted inside that session.

use std::fmt;
use std::str::FromStr;

/// Longest accepted cursor text: three 20-digit u64s and two dashes.
pub const CURSOR_TEXT_BYTES_MAX: usize = 3 * 20 + 2;

/// A parsed event id: the position `seq` in stream `stream`, issued in session epoch `epoch`.
///
/// `seq` 0 names the position before a stream's first event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cursor {
    /// Session epoch the event was issued in.
    pub epoch: u64,
    /// Globally unique stream id.
    pub stream: u64,
    /// Event sequence number within the stream (1-based; 0 = before the first event).
    pub seq: u64,
}

/// Why a cursor text is not a cursor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CursorError {
    /// The text is longer than any valid cursor.
    #[error("cursor is {0} bytes long; a cursor is at most 62 bytes")]
    TooLong(usize),
    /// The text does not have exactly three dash-separated parts.
    #[error(
        "cursor must have three dash-separated parts ({{epoch}}-{{stream}}-{{seq}}), found {0}"
    )]
    Parts(usize),
    /// A part is not a plain decimal u64.
    #[error("cursor {part} {text:?} is not a decimal u64")]
    NotDecimal {
        /// Which part ("epoch", "stream" or "seq").
        part: &'static str,
        /// The offending text (truncated to the cursor's length limit).
        text: String,
    },
}

impl Cursor {
    /// Builds a cursor.
    pub const fn new(epoch: u64, stream: u64, seq: u64) -> Self {
        Self { epoch, stream, seq }
    }
}

fn parse_part(part: &'static str, text: &str) -> Result<u64, CursorError> {
    // Only ASCII digits: `u64::from_str` would also accept a leading '+'.
    let ok = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| text.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| CursorError::NotDecimal {
            part,
            text: text.to_owned(),
        })
}

impl FromStr for Cursor {
    type Err = CursorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() > CURSOR_TEXT_BYTES_MAX {
            return Err(CursorError::TooLong(s.len()));
        }
        let parts: Vec<&str> = s.split('-').collect();
        let [epoch, stream, seq] = parts.as_slice() else {
            return Err(CursorError::Parts(parts.len()));
        };
        Ok(Self {
            epoch: parse_part("epoch", epoch)?,
            stream: parse_part("stream", stream)?,
            seq: parse_part("seq", seq)?,
        })
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.epoch, self.stream, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints() {
        let c: Cursor = "3-17-42".parse().unwrap();
        assert_eq!(c, Cursor::new(3, 17, 42));
        assert_eq!(c.to_string(), "3-17-42");
        let max = format!("{0}-{0}-{0}", u64::MAX);
        assert_eq!(max.parse::<Cursor>().unwrap().to_string(), max);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "1-2",
            "1-2-3-4",
            "a-2-3",
            "1--3",
            "+1-2-3",
            "1-2-3 ",
            "-1-2-3",
            "18446744073709551616-1-1",
            "１-2-3",
        ] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?} must not parse");
        }
        assert!(matches!(
            "1".repeat(100).parse::<Cursor>(),
            Err(CursorError::TooLong(100))
        ));
    }

    proptest! {
        #[test]
        fn round_trips(e: u64, s: u64, q: u64) {
            let c = Cursor::new(e, s, q);
            prop_assert_eq!(c.to_string().parse::<Cursor>(), Ok(c));
        }

        #[test]
        fn arbitrary_text_never_panics(text in ".{0,80}") {
            let _ = text.parse::<Cursor>();
        }
    }
}
