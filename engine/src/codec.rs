//! The one place bincode is used: a fixed configuration for record bodies.
//!
//! Little-endian, fixed-width integers, and a decode limit so hostile bytes cannot make the
//! decoder allocate without bound. Changing this configuration changes the on-disk format.

use bincode::config::{Configuration, Fixint, Limit, LittleEndian};

use crate::format::BODY_BYTES_MAX;

type Codec = Configuration<LittleEndian, Fixint, Limit<{ BODY_BYTES_MAX as usize }>>;

const CONFIG: Codec = bincode::config::standard()
    .with_little_endian()
    .with_fixed_int_encoding()
    .with_limit::<{ BODY_BYTES_MAX as usize }>();

/// Appends the encoding of `value` to `out`.
pub(crate) fn encode_into<T: bincode::Encode>(value: &T, out: &mut Vec<u8>) -> Result<(), String> {
    bincode::encode_into_std_write(value, out, CONFIG)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Decodes exactly one value that fills `bytes`.
pub(crate) fn decode<T: bincode::Decode<()>>(bytes: &[u8]) -> Result<T, String> {
    let (value, used) =
        bincode::decode_from_slice::<T, _>(bytes, CONFIG).map_err(|e| e.to_string())?;
    if used != bytes.len() {
        return Err(format!(
            "{} trailing bytes after the record body",
            bytes.len() - used
        ));
    }
    Ok(value)
}
