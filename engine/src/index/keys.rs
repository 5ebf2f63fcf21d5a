//! The index's key layout: one prefix byte per kind, then big-endian ids, so that sled's
//! byte order is the order scans need (schema in FORMAT.md, "Index key schema").

/// Key prefixes. One byte each; see FORMAT.md "Index key schema".
pub(crate) mod prefix {
    pub const SESSION: u8 = b'N';
    pub const STREAM: u8 = b'S';
    pub const EVENT: u8 = b'E';
    pub const TERMINAL_FRAME: u8 = b'F';
    pub const OUTCOME: u8 = b'O';
    pub const OPEN_STREAM: u8 = b'L';
    pub const ORIGIN: u8 = b'R';
    pub const SESSION_STATE: u8 = b'G';
    pub const ENDED: u8 = b'T';
}

pub(crate) fn session_key(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + id.len());
    k.push(prefix::SESSION);
    k.extend_from_slice(id.as_bytes());
    k
}

pub(crate) fn session_state_key(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + id.len());
    k.push(prefix::SESSION_STATE);
    k.extend_from_slice(id.as_bytes());
    k
}

pub(crate) fn stream_key(id: u64) -> [u8; 9] {
    let mut k = [prefix::STREAM; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn event_key(stream: u64, seq: u64) -> [u8; 17] {
    let mut k = [prefix::EVENT; 17];
    k[1..9].copy_from_slice(&stream.to_be_bytes());
    k[9..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub(crate) fn terminal_frame_key(stream: u64) -> [u8; 9] {
    let mut k = [prefix::TERMINAL_FRAME; 9];
    k[1..].copy_from_slice(&stream.to_be_bytes());
    k
}

/// Prefix + u16 BE length + session: unambiguous for any session id.
fn session_scoped(prefix: u8, session: &str) -> Vec<u8> {
    let len = u16::try_from(session.len()).unwrap_or(u16::MAX);
    let mut k = Vec::with_capacity(3 + session.len() + 16);
    k.push(prefix);
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(session.as_bytes());
    k
}

pub(crate) fn outcome_key(session: &str, correlation: &str) -> Vec<u8> {
    let mut k = session_scoped(prefix::OUTCOME, session);
    k.extend_from_slice(correlation.as_bytes());
    k
}

pub(crate) fn open_stream_prefix(session: &str) -> Vec<u8> {
    session_scoped(prefix::OPEN_STREAM, session)
}

pub(crate) fn open_stream_key(session: &str, stream: u64) -> Vec<u8> {
    let mut k = open_stream_prefix(session);
    k.extend_from_slice(&stream.to_be_bytes());
    k
}

/// Origin marker kinds.
pub(crate) const ORIGIN_SESSION: u8 = b'N';
pub(crate) const ORIGIN_STREAM: u8 = b'S';

pub(crate) fn origin_key(lsn: u64, kind: u8, id: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + id.len());
    k.push(prefix::ORIGIN);
    k.extend_from_slice(&lsn.to_be_bytes());
    k.push(kind);
    k.extend_from_slice(id);
    k
}

/// A time-ordered key of a session that expired or a stream that ended at `ended_ms`: the
/// forget pass finds everything past the metadata horizon by one range scan.
pub(crate) fn ended_key(ended_ms: u64, kind: u8, id: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + id.len());
    k.push(prefix::ENDED);
    k.extend_from_slice(&ended_ms.to_be_bytes());
    k.push(kind);
    k.extend_from_slice(id);
    k
}

/// Splits an ended key into (time, kind, id).
pub(crate) fn parse_ended_key(k: &[u8]) -> Option<(u64, u8, &[u8])> {
    parse_origin_key(k)
}

/// Splits an origin key into (lsn, kind, id).
pub(crate) fn parse_origin_key(k: &[u8]) -> Option<(u64, u8, &[u8])> {
    let lsn = u64::from_be_bytes(k.get(1..9)?.try_into().ok()?);
    Some((lsn, *k.get(9)?, k.get(10..)?))
}
