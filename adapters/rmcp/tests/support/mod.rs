//! Session-manager-level test support: a real `cursorlog`, this adapter's session manager,
//! and rmcp's own server runtime serving a small handler on each session's transport (what
//! `StreamableHttpService` does, without HTTP), so a test can drive `create_stream` directly
//! and hold a session's worker stuck behind a client that does not read.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cursorlog_rmcp::{AdapterConfig, CursorlogSessionManager};
use futures::{Stream, StreamExt};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ContentBlock,
    ErrorData, NumberOrString, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig, ServerJsonRpcMessage,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::json;
use tokio::sync::Notify;

pub use cursorlog_tests::{pb, Server};

/// Bound on every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(20);

/// A tool server: `emit {n, tag}` sends `n` progress notifications, then returns `done {tag}`.
/// It counts the notifications rmcp accepted (`sent`), so a test can tell when a session's
/// worker is stuck behind a client that does not read.
#[derive(Debug, Clone, Default)]
pub struct Emitter {
    pub sent: Arc<AtomicUsize>,
    pub failed: Arc<AtomicUsize>,
    pub changed: Arc<Notify>,
    /// A call with `"hold": true` waits for this before returning its result.
    pub release: Arc<Notify>,
}

impl Emitter {
    /// Waits until at least `n` notifications were accepted.
    pub async fn wait_sent(&self, n: usize) {
        self.wait(&self.sent, n).await;
    }

    /// Waits until at least `n` notifications failed.
    pub async fn wait_failed(&self, n: usize) {
        self.wait(&self.failed, n).await;
    }

    async fn wait(&self, counter: &AtomicUsize, n: usize) {
        tokio::time::timeout(WAIT, async {
            loop {
                let notified = self.changed.notified();
                if counter.load(Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("counter stayed at {}", counter.load(Ordering::SeqCst)));
    }
}

impl ServerHandler for Emitter {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let n = args
            .get("n")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        let tag = args
            .get("tag")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_owned();
        let token = context
            .meta
            .get_progress_token()
            .unwrap_or_else(|| ProgressToken(NumberOrString::String("emit".into())));
        for i in 1..=n {
            let progress = ProgressNotificationParam::new(token.clone(), i as f64)
                .with_message(format!("{tag} {i}"));
            if context.peer.notify_progress(progress).await.is_ok() {
                self.sent.fetch_add(1, Ordering::SeqCst);
            } else {
                self.failed.fetch_add(1, Ordering::SeqCst);
            }
            self.changed.notify_waiters();
        }
        if args.get("hold").and_then(serde_json::Value::as_bool) == Some(true) {
            self.release.notified().await;
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("done {tag}"))]).into())
    }
}

/// The cursorlog server and a session manager on it.
#[derive(Debug)]
pub struct Fixture {
    pub server: Server,
    pub manager: Arc<CursorlogSessionManager>,
}

impl Fixture {
    pub fn start(adjust: impl FnOnce(&mut AdapterConfig)) -> Self {
        let server = Server::start(&[]);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect_lazy();
        let mut config = AdapterConfig::default();
        adjust(&mut config);
        let manager =
            Arc::new(cursorlog_rmcp::Cursorlog::from_channel(channel).session_manager(config));
        Self { server, manager }
    }

    /// A new, initialized session served by `handler`.
    pub async fn session(&self, handler: Emitter) -> SessionId {
        let (id, transport) = self.manager.create_session().await.unwrap();
        tokio::spawn(async move {
            if let Ok(running) = handler.serve(transport).await {
                let _ = running.waiting().await;
            }
        });
        let init: ClientJsonRpcMessage = serde_json::from_value(json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}
        }))
        .unwrap();
        self.manager.initialize_session(&id, init).await.unwrap();
        let initialized: ClientJsonRpcMessage = serde_json::from_value(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .unwrap();
        self.manager.accept_message(&id, initialized).await.unwrap();
        id
    }

    pub async fn client(
        &self,
    ) -> cursorlog_proto::v1::cursor_log_client::CursorLogClient<tonic::transport::Channel> {
        self.server.client().await
    }
}

/// `tools/call emit {n, tag}` with request id `id` and a progress token.
pub fn emit(id: i64, n: u64, tag: &str) -> ClientJsonRpcMessage {
    serde_json::from_value(json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "emit", "arguments": {"n": n, "tag": tag},
                   "_meta": {"progressToken": format!("{tag}-progress")}}
    }))
    .unwrap()
}

/// `emit` that waits for [`Emitter::release`] before returning.
pub fn emit_held(id: i64, n: u64, tag: &str) -> ClientJsonRpcMessage {
    serde_json::from_value(json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "emit", "arguments": {"n": n, "tag": tag, "hold": true},
                   "_meta": {"progressToken": format!("{tag}-progress")}}
    }))
    .unwrap()
}

/// Reads a response stream to its end: the events (id and JSON-RPC message) in order.
pub async fn drain(
    stream: impl Stream<Item = ServerSseMessage> + Unpin,
) -> Vec<(Option<String>, Option<serde_json::Value>)> {
    tokio::time::timeout(
        WAIT,
        stream
            .map(|m| {
                let message = m
                    .message
                    .as_deref()
                    .map(|m: &ServerJsonRpcMessage| serde_json::to_value(m).unwrap());
                (m.event_id, message)
            })
            .collect::<Vec<_>>(),
    )
    .await
    .expect("the response stream ends")
}

/// The text result of a drained tool call stream (`done {tag}`), if it ended with one.
pub fn result_text(events: &[(Option<String>, Option<serde_json::Value>)]) -> Option<String> {
    let (_, last) = events.last()?;
    last.as_ref()?["result"]["content"][0]["text"]
        .as_str()
        .map(str::to_owned)
}

/// The outcome of the stream in `session` answering JSON-RPC request id `request`.
pub async fn outcome(fx: &Fixture, session: &SessionId, request: i64) -> Option<pb::Outcome> {
    fx.client()
        .await
        .get_outcome(pb::GetOutcomeRequest {
            session: session.to_string(),
            correlation: request.to_string(),
            stream: None,
        })
        .await
        .unwrap()
        .into_inner()
        .outcome
}
