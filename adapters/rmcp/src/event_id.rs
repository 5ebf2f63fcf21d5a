//! The SSE event ids this adapter hands to rmcp: a cursorlog cursor, plus the JSON-RPC
//! request id the stream answers.
//!
//! Text form: `{epoch}-{stream}-{seq}` for the standalone (GET) stream, and
//! `{epoch}-{stream}-{seq}.{request}` for a request's stream, where `{request}` is `n` and
//! the decimal number for a numeric request id, or `s` and the unpadded base64url of the
//! UTF-8 text for a string id. A stateless (2026-07-28) stream has no MCP session, so its ids
//! carry the unguessable name of the cursorlog session it lives in instead:
//! `{epoch}-{stream}-{seq}~{token}` (see [`crate::stateless`]). Every byte is visible ASCII,
//! so the id is a valid SSE `id:` field and `Last-Event-ID` header.
//!
//! Why the request id rides along: rmcp's client matches a resumed stream's response to the
//! pending call by its JSON-RPC id. cursorlog tells the adapter the request id of any stream
//! of the presenting session (`Resolution.correlation`), but for a cursor it must not explain
//! (`UNKNOWN_CURSOR`, another session's stream) it reveals nothing; the id the client itself
//! sent back is then the only way to end the client's pending call with an error instead of a
//! silent reconnect loop. Echoing the client's own text back reveals nothing either.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rmcp::model::RequestId;

/// A parsed `Last-Event-ID` as issued by this adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventId {
    /// The cursorlog cursor text, passed to cursorlog verbatim (cursorlog judges it).
    pub cursor: String,
    /// The JSON-RPC request id the client claims the stream answers, if the id carries one.
    pub request: Option<RequestId>,
    /// The stateless stream's token, for a stateless stream's id.
    pub token: Option<String>,
}

impl EventId {
    /// Splits a `Last-Event-ID`. Never fails: a suffix that does not decode is dropped, and the
    /// cursor part is left for cursorlog to call malformed.
    pub fn parse(text: &str) -> Self {
        if let Some((cursor, token)) = text.split_once('~') {
            return Self {
                cursor: cursor.to_owned(),
                request: None,
                token: Some(token.to_owned()),
            };
        }
        match text.split_once('.') {
            Some((cursor, request)) => Self {
                cursor: cursor.to_owned(),
                request: decode_request(request),
                token: None,
            },
            None => Self {
                cursor: text.to_owned(),
                request: None,
                token: None,
            },
        }
    }
}

/// The suffix after a cursor in the ids of a stream answering `request` (empty for none).
pub(crate) fn request_suffix(request: Option<&RequestId>) -> String {
    request.map_or_else(String::new, |r| format!(".{}", encode_request(r)))
}

/// The suffix after a cursor in the ids of the stateless stream `token`.
pub(crate) fn token_suffix(token: &str) -> String {
    format!("~{token}")
}

/// The event id for `cursor` in a stream answering `request`.
pub fn format(cursor: &str, request: Option<&RequestId>) -> String {
    format!("{cursor}{}", request_suffix(request))
}

/// The correlation text stored in cursorlog for a request id: its JSON form (`7`, `"abc"`),
/// so the type survives the round trip.
pub fn correlation(request: &RequestId) -> String {
    serde_json::to_string(request).unwrap_or_else(|_| request.to_string())
}

/// The request id back from its correlation text; `None` if it is not one of ours.
pub fn request_from_correlation(text: &str) -> Option<RequestId> {
    serde_json::from_str(text).ok()
}

fn encode_request(request: &RequestId) -> String {
    match request {
        RequestId::Number(n) => format!("n{n}"),
        RequestId::String(s) => format!("s{}", URL_SAFE_NO_PAD.encode(s.as_bytes())),
    }
}

fn decode_request(text: &str) -> Option<RequestId> {
    if let Some(n) = text.strip_prefix('n') {
        return n.parse().ok().map(RequestId::Number);
    }
    let bytes = URL_SAFE_NO_PAD.decode(text.strip_prefix('s')?).ok()?;
    String::from_utf8(bytes)
        .ok()
        .map(|s| RequestId::String(s.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_numeric_and_string_request_ids() {
        for request in [
            RequestId::Number(7),
            RequestId::Number(-3),
            RequestId::String("tools/call 1 ✓".into()),
            RequestId::String("".into()),
        ] {
            let text = format("2-17-5", Some(&request));
            assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{text}");
            let parsed = EventId::parse(&text);
            assert_eq!(parsed.cursor, "2-17-5");
            assert_eq!(parsed.request, Some(request.clone()));
            let stored = correlation(&request);
            assert_eq!(request_from_correlation(&stored), Some(request));
        }
    }

    #[test]
    fn standalone_and_garbage_suffixes_leave_the_cursor_to_cursorlog() {
        assert_eq!(
            EventId::parse("1-2-3"),
            EventId {
                cursor: "1-2-3".into(),
                request: None,
                token: None,
            }
        );
        let bad = EventId::parse("1-2-3.x!!");
        assert_eq!((bad.cursor.as_str(), bad.request), ("1-2-3", None));
        let junk = EventId::parse("not a cursor");
        assert_eq!(junk.cursor, "not a cursor");
    }

    #[test]
    fn stateless_ids_carry_their_token() {
        let text = format!("1-9-2{}", token_suffix("0123abcd"));
        let parsed = EventId::parse(&text);
        assert_eq!(parsed.cursor, "1-9-2");
        assert_eq!(parsed.token.as_deref(), Some("0123abcd"));
        assert_eq!(parsed.request, None);
    }
}
