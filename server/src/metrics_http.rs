//! The metrics page over plain HTTP/1.1, served by hyper: any method and path get the page
//! ([`crate::metrics`]), with the bearer token when auth is configured (401 otherwise). One
//! request per connection; its head must arrive within [`HEAD_TIMEOUT`] (else the connection
//! is closed) and fit [`HEAD_BYTES_MAX`] (else 431). The accept loop backs off on errors
//! (EMFILE, ENFILE, ENOMEM) instead of spinning on them.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::Engine;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::auth::BearerToken;
use crate::metrics::{self, Metrics};

/// Largest request head (request line and headers) read, in bytes; a longer one is answered
/// 431.
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
    token: Option<BearerToken>,
) {
    let page = Arc::new(Page {
        engine,
        metrics,
        token,
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_header_size(HEAD_BYTES_MAX)
        .keep_alive(false);
    accept_loop(
        || listener.accept(),
        |(socket, peer)| {
            let page = Arc::clone(&page);
            let service = service_fn(move |request| {
                let page = Arc::clone(&page);
                async move { Ok::<_, Infallible>(page.respond(&request).await) }
            });
            let connection = http.serve_connection(TokioIo::new(socket), service);
            tokio::spawn(async move {
                if let Err(err) = connection.await {
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

/// What the metrics page is made of, and who may read it.
struct Page {
    engine: Engine,
    metrics: Arc<Metrics>,
    token: Option<BearerToken>,
}

impl Page {
    /// The answer to `request`: 401 without the token, else the page (503 when the engine
    /// cannot give its statistics).
    async fn respond(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        if let Some(token) = &self.token {
            let presented = request.headers().get(AUTHORIZATION);
            if let Err(failure) = token.check_header(presented.map(HeaderValue::as_bytes)) {
                let mut response = reply(StatusCode::UNAUTHORIZED, format!("{failure}\n"));
                response.headers_mut().insert(
                    WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"cursorlog\""),
                );
                return response;
            }
        }
        let stats = {
            let engine = self.engine.clone();
            tokio::task::spawn_blocking(move || engine.stats()).await
        };
        match stats {
            Ok(Ok(stats)) => match self.metrics.render(&stats) {
                Ok(text) => reply(StatusCode::OK, text),
                Err(err) => {
                    tracing::warn!(error = %err, "metrics: encoding the page failed");
                    reply(StatusCode::INTERNAL_SERVER_ERROR, String::new())
                }
            },
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "metrics: engine stats failed");
                reply(StatusCode::SERVICE_UNAVAILABLE, String::new())
            }
            Err(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, String::new()),
        }
    }
}

/// A response with `status` and `body`, typed as the page.
fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The metrics listener of a server on an empty data directory, with `token`.
    async fn serving(token: Option<&str>) -> (std::net::SocketAddr, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = cursorlog_engine::Config::new(dir.path());
        config.disk_reserve_bytes = 0;
        let engine = Engine::open(config).unwrap();
        let token = token.map(|t| BearerToken::new(t, &crate::auth::TokenOrigin::Env).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new(4));
        tokio::spawn(serve(listener, engine, metrics, token));
        (addr, dir)
    }

    /// Sends `request` and reads until the server closes the connection.
    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        socket.write_all(request).await.unwrap();
        let mut response = Vec::new();
        socket.read_to_end(&mut response).await.unwrap();
        String::from_utf8(response).unwrap()
    }

    /// The body of an HTTP/1.1 response.
    fn body(response: &str) -> &str {
        response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    #[tokio::test]
    async fn the_token_is_asked_for_and_the_page_parses() {
        let (addr, _dir) = serving(Some("t0k")).await;
        for request in [
            "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nauthorization: Bearer wrong\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nauthorization: Basic dDBr\r\n\r\n",
        ] {
            let response = exchange(addr, request.as_bytes()).await;
            assert!(
                response.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
                "{response}"
            );
            assert!(
                response.contains("\r\nwww-authenticate: Bearer realm=\"cursorlog\"\r\n"),
                "{response}"
            );
            assert!(!response.contains("cursorlog_"), "{response}");
        }
        // Header names are case-insensitive, and any path gets the page.
        let response = exchange(
            addr,
            b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\n\r\n",
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.contains("\r\ncontent-type: text/plain; version=0.0.4"),
            "{response}"
        );
        assert!(response.contains("\r\nconnection: close\r\n"), "{response}");
        let page = crate::metrics::check::parse(body(&response))
            .unwrap_or_else(|e| panic!("{e}\n{response}"));
        assert_eq!(page.value("cursorlog_poisoned", &[]), Some(0.0));
        assert_eq!(page.value("cursorlog_read_calls_max", &[]), Some(4.0));
    }

    #[tokio::test]
    async fn a_request_head_over_the_limit_is_refused() {
        let (addr, _dir) = serving(None).await;
        let long = format!(
            "GET /metrics HTTP/1.1\r\nx-padding: {}\r\n\r\n",
            "p".repeat(HEAD_BYTES_MAX)
        );
        let response = exchange(addr, long.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 431 "), "{response}");
        assert!(!response.contains("cursorlog_"), "{response}");
        // Just under the limit is served.
        let fits = format!(
            "GET /metrics HTTP/1.1\r\nx-padding: {}\r\n\r\n",
            "p".repeat(HEAD_BYTES_MAX / 2)
        );
        let response = exchange(addr, fits.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    }

    /// A client that never finishes its request head is disconnected once [`HEAD_TIMEOUT`]
    /// has passed (on a paused clock: no real waiting), with no answer.
    #[tokio::test(start_paused = true)]
    async fn a_slow_request_head_is_cut_off_after_the_timeout() {
        let (addr, _dir) = serving(None).await;
        for unfinished in [&b"GET /metrics HTTP/1.1\r\nhost: x\r\n"[..], b""] {
            let start = tokio::time::Instant::now();
            let response = exchange(addr, unfinished).await;
            assert_eq!(response, "");
            let waited = start.elapsed();
            assert!(waited >= HEAD_TIMEOUT, "{waited:?}");
            assert!(waited < HEAD_TIMEOUT * 2, "{waited:?}");
        }
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
