//! The index's values: sessions and streams with the LSN their state was carried from, and
//! the typed encode/decode of every value (a value that does not decode names its key).

use crate::codec;
use crate::error::{Error, IndexError, Result};
use crate::record::{decode_session, decode_stream, encode_session, encode_stream, wire_codec};
use crate::state::{SessionMeta, StreamMeta};

/// A session with the LSN of the record its state was last carried from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredSession {
    pub meta: SessionMeta,
    pub origin_lsn: u64,
}

wire_codec!(
    StoredSession,
    |s, e| {
        encode_session(&s.meta, e)?;
        s.origin_lsn.encode(e)
    },
    |d| Ok(StoredSession {
        meta: decode_session(d)?,
        origin_lsn: u64::decode(d)?,
    })
);

/// A stream with the LSN of the record its state was last carried from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredStream {
    pub meta: StreamMeta,
    pub origin_lsn: u64,
}

wire_codec!(
    StoredStream,
    |s, e| {
        encode_stream(&s.meta, e)?;
        s.origin_lsn.encode(e)
    },
    |d| Ok(StoredStream {
        meta: decode_stream(d)?,
        origin_lsn: u64::decode(d)?,
    })
);

pub(super) fn decode_value<T: bincode::Decode<()>>(key: &[u8], v: &[u8]) -> Result<T> {
    codec::decode(v).map_err(|e| {
        Error::Index(IndexError::msg(format!(
            "undecodable index value under key prefix {:?}: {e}; delete the index directory to rebuild it",
            key.first().map(|b| char::from(*b))
        )))
    })
}

/// The index store's errors, as the engine's.
pub(crate) trait StoreResult<T> {
    /// Converts a sled error into [`Error::Index`].
    fn store(self) -> Result<T>;
}

impl<T> StoreResult<T> for std::result::Result<T, sled::Error> {
    fn store(self) -> Result<T> {
        self.map_err(|e| Error::Index(IndexError::wrap(e)))
    }
}

pub(super) fn encode_value<T: bincode::Encode>(v: &T) -> Vec<u8> {
    // Index values are small: one allocation instead of a few regrowths.
    let mut out = Vec::with_capacity(128);
    // Encoding index values into a Vec cannot fail: they are bounded, plain structs.
    let _ = codec::encode_into(v, &mut out);
    out
}
