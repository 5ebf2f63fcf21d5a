//! The private encodings of the public state values. The public types ([`StreamState`],
//! [`SessionMeta`], [`StreamMeta`]) carry no encoding of their own: these functions write
//! and read them field by field in the order FORMAT.md gives, so a change to a public type
//! can never silently change the on-disk format (the golden-byte tests in `record/tests.rs`
//! pin every record and index value).

use bincode::de::Decoder;
use bincode::enc::Encoder;
use bincode::error::{DecodeError, EncodeError};
use bincode::{Decode, Encode};

use crate::state::{SessionMeta, StreamMeta, StreamState};

/// [`StreamState`] on disk: a `u32` variant index (0 Open, 1 Completed, 2 Aborted,
/// 3 Superseded).
pub(crate) fn encode_state<E: Encoder>(s: StreamState, e: &mut E) -> Result<(), EncodeError> {
    let index: u32 = match s {
        StreamState::Open => 0,
        StreamState::Completed => 1,
        StreamState::Aborted => 2,
        StreamState::Superseded => 3,
    };
    index.encode(e)
}

/// Reads what [`encode_state`] wrote.
pub(crate) fn decode_state<D: Decoder>(d: &mut D) -> Result<StreamState, DecodeError> {
    match u32::decode(d)? {
        0 => Ok(StreamState::Open),
        1 => Ok(StreamState::Completed),
        2 => Ok(StreamState::Aborted),
        3 => Ok(StreamState::Superseded),
        found => Err(DecodeError::UnexpectedVariant {
            type_name: "StreamState",
            allowed: &bincode::error::AllowedEnumVariants::Range { min: 0, max: 3 },
            found,
        }),
    }
}

/// [`SessionMeta`] on disk: id, epoch, opened_at_ms, expired_at_ms.
pub(crate) fn encode_session<E: Encoder>(m: &SessionMeta, e: &mut E) -> Result<(), EncodeError> {
    m.id.encode(e)?;
    m.epoch.encode(e)?;
    m.opened_at_ms.encode(e)?;
    m.expired_at_ms.encode(e)
}

/// Reads what [`encode_session`] wrote.
pub(crate) fn decode_session<C, D: Decoder<Context = C>>(
    d: &mut D,
) -> Result<SessionMeta, DecodeError> {
    Ok(SessionMeta {
        id: String::decode(d)?,
        epoch: u64::decode(d)?,
        opened_at_ms: u64::decode(d)?,
        expired_at_ms: Option::<u64>::decode(d)?,
    })
}

/// [`StreamMeta`] on disk: id, session, epoch, state, head, watermark, correlation,
/// opened_at_ms, ended_at_ms, end_reason, has_terminal_frame, lease_ms.
pub(crate) fn encode_stream<E: Encoder>(m: &StreamMeta, e: &mut E) -> Result<(), EncodeError> {
    m.id.encode(e)?;
    m.session.encode(e)?;
    m.epoch.encode(e)?;
    encode_state(m.state, e)?;
    m.head.encode(e)?;
    m.watermark.encode(e)?;
    m.correlation.encode(e)?;
    m.opened_at_ms.encode(e)?;
    m.ended_at_ms.encode(e)?;
    m.end_reason.encode(e)?;
    m.has_terminal_frame.encode(e)?;
    m.lease_ms.encode(e)
}

/// Reads what [`encode_stream`] wrote.
pub(crate) fn decode_stream<C, D: Decoder<Context = C>>(
    d: &mut D,
) -> Result<StreamMeta, DecodeError> {
    Ok(StreamMeta {
        id: u64::decode(d)?,
        session: String::decode(d)?,
        epoch: u64::decode(d)?,
        state: decode_state(d)?,
        head: u64::decode(d)?,
        watermark: u64::decode(d)?,
        correlation: Option::<String>::decode(d)?,
        opened_at_ms: u64::decode(d)?,
        ended_at_ms: Option::<u64>::decode(d)?,
        end_reason: Option::<String>::decode(d)?,
        has_terminal_frame: bool::decode(d)?,
        lease_ms: Option::<u64>::decode(d)?,
    })
}

/// Implements `Encode`/`Decode` for a crate type whose fields are written by `$enc` and read
/// by `$dec` (closures over the encoder/decoder).
macro_rules! wire_codec {
    ($ty:ty, |$s:ident, $e:ident| $enc:expr, |$d:ident| $dec:expr) => {
        impl bincode::Encode for $ty {
            fn encode<E: bincode::enc::Encoder>(
                &self,
                $e: &mut E,
            ) -> Result<(), bincode::error::EncodeError> {
                let $s = self;
                $enc
            }
        }

        impl<C> bincode::Decode<C> for $ty {
            fn decode<D: bincode::de::Decoder<Context = C>>(
                $d: &mut D,
            ) -> Result<Self, bincode::error::DecodeError> {
                $dec
            }
        }

        bincode::impl_borrow_decode!($ty);
    };
}

pub(crate) use wire_codec;
