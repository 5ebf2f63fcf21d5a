//! The metrics page over plain HTTP/1.1: a deliberately tiny responder (`GET` any path → the
//! Prometheus text page), with the bearer token when auth is configured, and an accept loop
//! that backs off on errors (EMFILE, ENFILE, ENOMEM) instead of spinning on them.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::auth::BearerToken;
use crate::connections::Connections;
use crate::metrics::Metrics;

/// Largest request head read, in bytes; anything longer is refused.
const HEAD_BYTES_MAX: usize = 8 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// First pause after a failed `accept`.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between failed `accept`s.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Serves the metrics page on `listener` until the task is dropped. With `token`, a request
/// needs `authorization: Bearer <token>` (401 otherwise).
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    metrics: Arc<Metrics>,
    connections: Arc<Connections>,
    token: Option<BearerToken>,
) {
    let token = Arc::new(token);
    accept_loop(
        || listener.accept(),
        |(socket, peer)| {
            let engine = engine.clone();
            let metrics = Arc::clone(&metrics);
            let connections = Arc::clone(&connections);
            let token = Arc::clone(&token);
            tokio::spawn(async move {
                let page = Page {
                    engine: &engine,
                    metrics: &metrics,
                    connections: &connections,
                };
                if let Err(err) = respond(socket, &page, token.as_ref().as_ref()).await {
                    tracing::debug!(%peer, error = %err, "metrics: request failed");
                }
            });
        },
    )
    .await;
}

/// The pause after `failures` consecutive failed accepts: doubling from
/// [`ACCEPT_BACKOFF_MIN`] up to [`ACCEPT_BACKOFF_MAX`].
fn accept_backoff(failures: u32) -> Duration {
    let factor = 1_u32 << failures.saturating_sub(1).min(16);
    ACCEPT_BACKOFF_MIN
        .saturating_mul(factor)
        .min(ACCEPT_BACKOFF_MAX)
}

/// Accepts connections forever, handing each to `handle`. A failed accept (out of file
/// descriptors, a connection reset before it was accepted, ...) is logged and followed by a
/// growing pause, so the loop never spins on an error that persists.
async fn accept_loop<C, A, F>(mut accept: A, mut handle: impl FnMut(C))
where
    A: FnMut() -> F,
    F: Future<Output = io::Result<C>>,
{
    let mut failures = 0_u32;
    loop {
        match accept().await {
            Ok(connection) => {
                failures = 0;
                handle(connection);
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                let pause = accept_backoff(failures);
                tracing::warn!(error = %err, ?pause, failures, "metrics: accept failed; backing off");
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// What the metrics page is made of.
struct Page<'a> {
    engine: &'a Engine,
    metrics: &'a Metrics,
    connections: &'a Connections,
}

/// Reads one request head and answers it.
async fn respond(
    mut socket: TcpStream,
    page: &Page<'_>,
    token: Option<&BearerToken>,
) -> io::Result<()> {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut socket)).await {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => return reply(&mut socket, "431 Request Header Fields Too Large", "").await,
        Ok(Err(err)) => return Err(err),
        Err(_) => return Ok(()),
    };
    if let Some(token) = token {
        if let Err(failure) = token.check_header(header(&head, b"authorization")) {
            let body = format!("{failure}\n");
            let status = "401 Unauthorized\r\nwww-authenticate: Bearer realm=\"cursorlog\"";
            return reply(&mut socket, status, &body).await;
        }
    }
    let stats = {
        let engine = page.engine.clone();
        tokio::task::spawn_blocking(move || engine.stats()).await
    };
    match stats {
        Ok(Ok(stats)) => {
            let mut text = page.metrics.render(&stats);
            text.push_str(&page.connections.render());
            text.push_str(&page.metrics.reads.buffers().render());
            reply(&mut socket, "200 OK", &text).await
        }
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "metrics: engine stats failed");
            reply(&mut socket, "503 Service Unavailable", "").await
        }
        Err(_) => reply(&mut socket, "500 Internal Server Error", "").await,
    }
}

/// The request head (through the blank line), `None` when it exceeds [`HEAD_BYTES_MAX`].
async fn read_head(socket: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0_u8; 1024];
    loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(Some(head));
        }
        if head.len() > HEAD_BYTES_MAX {
            return Ok(None);
        }
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside the request head",
            ));
        }
        head.extend_from_slice(&buf[..n]);
    }
}

/// The value of header `name` (case-insensitive) in a request head.
fn header<'h>(head: &'h [u8], name: &[u8]) -> Option<&'h [u8]> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let colon = line.iter().position(|&b| b == b':')?;
        let (key, value) = line.split_at(colon);
        key.trim_ascii()
            .eq_ignore_ascii_case(name)
            .then(|| value[1..].trim_ascii())
    })
}

async fn reply(socket: &mut TcpStream, status: &str, body: &str) -> io::Result<()> {
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(response.as_bytes()).await?;
    socket.shutdown().await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn headers_are_found_case_insensitively() {
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\n\r\n";
        assert_eq!(header(head, b"authorization"), Some(&b"Bearer t0k"[..]));
        assert_eq!(header(head, b"host"), Some(&b"x"[..]));
        assert_eq!(header(head, b"cookie"), None);
        // The request line is not a header.
        assert_eq!(header(b"GET /a:b HTTP/1.1\r\n\r\n", b"get /a"), None);
    }

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        assert_eq!(accept_backoff(1), ACCEPT_BACKOFF_MIN);
        assert_eq!(accept_backoff(2), ACCEPT_BACKOFF_MIN * 2);
        assert_eq!(accept_backoff(3), ACCEPT_BACKOFF_MIN * 4);
        assert_eq!(accept_backoff(40), ACCEPT_BACKOFF_MAX);
        assert_eq!(accept_backoff(u32::MAX), ACCEPT_BACKOFF_MAX);
    }

    /// A listener that fails every accept (as with EMFILE) must not be polled in a tight
    /// loop: on a paused clock, the accepts after ten failures, one success and one more
    /// failure come exactly after the backoff schedule (a success resets it).
    #[tokio::test(start_paused = true)]
    async fn failing_accepts_back_off_and_a_success_resets_the_pause() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let start = tokio::time::Instant::now();
        let mut calls = 0_u32;
        let task = tokio::spawn(accept_loop(
            move || {
                calls += 1;
                let n = calls;
                let _ = tx.send((n, tokio::time::Instant::now()));
                async move {
                    match n {
                        // Ten failures, one success, one failure, then nothing more.
                        1..=10 | 12 => Err(io::Error::from_raw_os_error(24)), // EMFILE
                        11 => Ok(n),
                        _ => std::future::pending().await,
                    }
                }
            },
            |_| {},
        ));
        let mut at = Vec::new();
        while let Some((n, when)) = rx.recv().await {
            at.push(when - start);
            if n == 13 {
                break;
            }
        }
        task.abort();
        let schedule: Duration = (1..=10).map(accept_backoff).sum();
        assert_eq!(at[10], schedule, "the 11th accept follows ten pauses");
        assert_eq!(at[11], schedule, "a success is not followed by a pause");
        assert_eq!(
            at[12],
            schedule + accept_backoff(1),
            "after a success the pause starts again from the minimum"
        );
    }
}
