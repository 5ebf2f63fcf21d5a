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
    pub const TASK: u8 = b'K';
    pub const TASK_ID: u8 = b'I';
    pub const TASK_REQUEST: u8 = b'Y';
    pub const OWNER_TASK: u8 = b'P';
    pub const OWNER_COUNT: u8 = b'C';
    pub const TASK_DEADLINE: u8 = b'D';
    pub const TASK_OUTCOME: u8 = b'Z';
    pub const TASK_SLOT: u8 = b'X';
    pub const TASK_MESSAGE: u8 = b'J';
    pub const TASK_QUEUE: u8 = b'Q';
    pub const TASK_BATCH: u8 = b'B';
    pub const TASK_DEDUPE: u8 = b'U';
    pub const TASK_ROUTE: u8 = b'W';
    pub const TASK_ROUTES: u8 = b'V';
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
pub(super) fn session_scoped(prefix: u8, session: &str) -> Vec<u8> {
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
pub(crate) const ORIGIN_TASK: u8 = b'K';

/// What an origin or ended key names: a session, a stream or a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marked<'a> {
    Session(&'a str),
    Stream(u64),
    Task(u64),
}

pub(crate) fn origin_key(lsn: u64, kind: u8, id: &[u8]) -> Vec<u8> {
    marker_key(prefix::ORIGIN, lsn, kind, id)
}

/// A time-ordered key of a session that expired or a stream that ended at `ended_ms`: the
/// forget pass finds everything past the metadata horizon by one range scan.
pub(crate) fn ended_key(ended_ms: u64, kind: u8, id: &[u8]) -> Vec<u8> {
    marker_key(prefix::ENDED, ended_ms, kind, id)
}

/// Prefix + u64 BE (an LSN or a time, so a range scan finds the oldest first) + kind + id.
fn marker_key(prefix: u8, at: u64, kind: u8, id: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + id.len());
    k.push(prefix);
    k.extend_from_slice(&at.to_be_bytes());
    k.push(kind);
    k.extend_from_slice(id);
    k
}

/// What an origin or ended key names; `None` for a key of another shape, an unknown kind or an
/// id that does not decode (such keys are skipped, never acted on).
pub(crate) fn parse_marker_key(k: &[u8]) -> Option<Marked<'_>> {
    let id = k.get(10..)?;
    match *k.get(9)? {
        ORIGIN_SESSION => std::str::from_utf8(id).ok().map(Marked::Session),
        ORIGIN_STREAM => Some(Marked::Stream(u64::from_be_bytes(id.try_into().ok()?))),
        ORIGIN_TASK => Some(Marked::Task(u64::from_be_bytes(id.try_into().ok()?))),
        _ => None,
    }
}
