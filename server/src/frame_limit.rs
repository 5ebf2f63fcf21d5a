//! The request size limit, answered RESOURCE_EXHAUSTED as the API documents.
//!
//! tonic enforces `max_decoding_message_size` itself, but answers OUT_OF_RANGE, which the
//! cursorlog API reserves for "events evicted by retention overtook a replay". tonic's check
//! sits in its framing code (`codec/decode.rs`), below any codec, so it cannot be remapped
//! there. Instead this wrapper reads the 5-byte gRPC frame headers of the request body as they
//! stream past and fails the body with RESOURCE_EXHAUSTED the moment a header announces a
//! message over the limit: before tonic sees that header, and before any of the message is
//! buffered. tonic surfaces a body error that is a [`Status`] unchanged, so unary and
//! streaming calls get the same status (a streaming handler sees it from
//! `Streaming::message`). tonic's own limit stays configured to the same value as a backstop.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Frame, SizeHint};
use tonic::body::Body;
use tonic::codegen::{http, Bytes, Service};
use tonic::server::NamedService;
use tonic::Status;

/// Length of a gRPC message frame header: compression flag (1) and length (4, big-endian).
const HEADER_BYTES: usize = 5;

/// Wraps a gRPC service so request messages over `limit` bytes fail RESOURCE_EXHAUSTED.
#[derive(Debug, Clone)]
pub struct FrameLimit<S> {
    inner: S,
    limit: usize,
}

impl<S> FrameLimit<S> {
    /// `inner`, refusing request messages longer than `limit` bytes.
    pub fn new(inner: S, limit: usize) -> Self {
        Self { inner, limit }
    }
}

impl<S> Service<http::Request<Body>> for FrameLimit<S>
where
    S: Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let limit = self.limit;
        self.inner
            .call(request.map(|body| Body::new(LimitedBody::new(body, limit))))
    }
}

impl<S: NamedService> NamedService for FrameLimit<S> {
    const NAME: &'static str = S::NAME;
}

/// Where the scanner is in the stream of frames.
#[derive(Debug, Clone, Copy)]
enum Position {
    /// Inside a frame header; `have` of its bytes seen so far.
    Header {
        bytes: [u8; HEADER_BYTES],
        have: usize,
    },
    /// Inside a message; `left` bytes of it still to come.
    Message { left: usize },
}

/// Follows the gRPC framing of a byte stream and checks every announced message length.
#[derive(Debug, Clone)]
struct FrameScanner {
    limit: usize,
    position: Position,
}

impl FrameScanner {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            position: Position::Header {
                bytes: [0; HEADER_BYTES],
                have: 0,
            },
        }
    }

    /// Advances over `data`. When a header announces a message over the limit: the offset
    /// in `data` where that header starts (0 if it started in an earlier chunk) and the status.
    fn scan(&mut self, data: &[u8]) -> Result<(), (usize, Status)> {
        let mut at = 0;
        let mut header_start = 0;
        while at < data.len() {
            match &mut self.position {
                Position::Header { bytes, have } => {
                    if *have == 0 {
                        header_start = at;
                    }
                    let take = (HEADER_BYTES - *have).min(data.len() - at);
                    bytes[*have..*have + take].copy_from_slice(&data[at..at + take]);
                    *have += take;
                    at += take;
                    if *have == HEADER_BYTES {
                        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
                        let len = usize::try_from(len).unwrap_or(usize::MAX);
                        if len > self.limit {
                            let status = Status::resource_exhausted(format!(
                                "the request message is {len} bytes; the server's limit is {} \
                                 bytes (--grpc-message-bytes-max)",
                                self.limit
                            ));
                            return Err((header_start, status));
                        }
                        self.position = Position::Message { left: len };
                    }
                }
                Position::Message { left } => {
                    let take = (*left).min(data.len() - at);
                    *left -= take;
                    at += take;
                }
            }
            if matches!(self.position, Position::Message { left: 0 }) {
                self.position = Position::Header {
                    bytes: [0; HEADER_BYTES],
                    have: 0,
                };
            }
        }
        Ok(())
    }
}

/// A request body that fails once a frame header announces a message over the limit. The
/// messages before that header (in the same chunk too) are passed on first, so a streaming
/// call handles the requests that came before the oversized one.
#[derive(Debug)]
struct LimitedBody {
    inner: Body,
    scanner: FrameScanner,
    /// The status to end with, once the bytes before the oversized header are passed on.
    failure: Option<Status>,
    failed: bool,
}

impl LimitedBody {
    fn new(inner: Body, limit: usize) -> Self {
        Self {
            inner,
            scanner: FrameScanner::new(limit),
            failure: None,
            failed: false,
        }
    }
}

impl http_body::Body for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(status) = this.failure.take() {
            this.failed = true;
            return Poll::Ready(Some(Err(status)));
        }
        if this.failed {
            return Poll::Ready(None);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        let Some(Ok(frame)) = frame else {
            return Poll::Ready(frame);
        };
        let frame = match frame.into_data() {
            Ok(data) => match this.scanner.scan(&data) {
                Ok(()) => Frame::data(data),
                Err((0, status)) => {
                    this.failed = true;
                    return Poll::Ready(Some(Err(status)));
                }
                Err((before, status)) => {
                    this.failure = Some(status);
                    Frame::data(data.slice(..before))
                }
            },
            Err(frame) => frame,
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || (self.failure.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn frame(len: u32) -> Vec<u8> {
        let mut f = vec![0_u8];
        f.extend_from_slice(&len.to_be_bytes());
        f.extend(std::iter::repeat_n(7_u8, len as usize));
        f
    }

    #[test]
    fn messages_up_to_the_limit_pass_in_any_chunking() {
        let mut stream = frame(10);
        stream.extend(frame(0));
        stream.extend(frame(3));
        for chunk in 1..=stream.len() {
            let mut s = FrameScanner::new(10);
            for piece in stream.chunks(chunk) {
                s.scan(piece).unwrap();
            }
            assert!(matches!(s.position, Position::Header { have: 0, .. }));
        }
    }

    #[test]
    fn a_header_over_the_limit_fails_resource_exhausted_in_any_chunking() {
        let mut stream = frame(4);
        stream.extend(&frame(11)[..HEADER_BYTES]);
        for chunk in 1..=stream.len() {
            let mut s = FrameScanner::new(10);
            let mut passed = 0;
            let (before, err) = stream
                .chunks(chunk)
                .find_map(|piece| {
                    let r = s.scan(piece).err();
                    if r.is_none() {
                        passed += piece.len();
                    }
                    r
                })
                .expect("over the limit");
            assert_eq!(err.code(), tonic::Code::ResourceExhausted);
            assert!(err.message().contains("11 bytes"), "{}", err.message());
            // Everything before the oversized header is let through, nothing after it.
            assert_eq!(
                passed + before,
                frame(4).len().max(passed),
                "chunk size {chunk}"
            );
        }
    }

    #[test]
    fn a_huge_announced_length_fails_before_its_body() {
        let mut s = FrameScanner::new(16 << 20);
        let (_, err) = s.scan(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    }
}
