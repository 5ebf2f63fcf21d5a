/// Tests for concurrent SSE stream handling (shadow channels)
///
/// These tests verify that multiple GET SSE streams on the same session
/// don't kill each other by replacing the common channel sender.
///
/// Root cause: When POST SSE responses include `retry`, the EventSource API
/// reconnects via GET after the stream ends. Each GET was unconditionally
/// replacing `self.common.tx`, killing the other stream's receiver — causing
/// an infinite reconnect loop every `sse_retry` seconds.
///
/// Fix: `resume_or_shadow_common()` checks if the primary common channel is
/// still active. If so, it creates a "shadow" stream (idle, keep-alive only)
/// instead of replacing the primary.
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rmcp::{
    model::{Implementation, ServerCapabilities, ServerConfig, ToolsCapability},
    service::NotificationContext,
    transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService},
    RoleServer, ServerHandler,
};

use crate::cursorlog::Cursorlog;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub(crate) const ACCEPT_SSE: &str = "text/event-stream";
pub(crate) const ACCEPT_BOTH: &str = "text/event-stream, application/json";

// ─── Test server ────────────────────────────────────────────────────────────

#[derive(Clone)]
pub struct TestServer {
    trigger: Arc<Notify>,
}

impl TestServer {
    fn new(trigger: Arc<Notify>) -> Self {
        Self { trigger }
    }
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools_with({
                    let mut tools = ToolsCapability::default();
                    tools.list_changed = Some(true);
                    tools
                })
                .build(),
        )
        .with_server_info(Implementation::new("test-server", "1.0.0"))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let peer = context.peer.clone();
        let trigger = self.trigger.clone();

        tokio::spawn(async move {
            trigger.notified().await;
            let _ = peer.notify_tool_list_changed().await;
        });
    }
}

// ─── Helpers ────────────────────────────────────────────────────────────────

pub(crate) async fn start_test_server(ct: CancellationToken, trigger: Arc<Notify>) -> String {
    let server = TestServer::new(trigger);
    // cursorlog: this adapter's session manager on a cursorlog that lives as long as the
    // HTTP server task below.
    let cl = Cursorlog::start();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(cl.manager()),
        StreamableHttpServerConfig::default().with_cancellation_token(ct.child_token()),
    );

    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().unwrap();
    let url = format!("http://127.0.0.1:{}/mcp", addr.port());

    let ct_clone = ct.clone();
    tokio::spawn(async move {
        let _cursorlog = cl;
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { ct_clone.cancelled().await })
            .await
            .unwrap();
    });

    tokio::time::sleep(Duration::from_millis(100)).await;
    url
}

/// POST initialize and return session ID.
pub(crate) async fn initialize_session(client: &reqwest::Client, url: &str) -> String {
    let resp = client
        .post(url)
        .header("Accept", ACCEPT_BOTH)
        .header("Content-Type", "application/json")
        .json(&json!({
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2024-11-05",
                "capabilities": {},
                "clientInfo": { "name": "test-client", "version": "1.0.0" }
            }
        }))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .expect("POST initialize");

    assert!(resp.status().is_success(), "initialize should succeed");

    resp.headers()
        .get("Mcp-Session-Id")
        .expect("session ID header")
        .to_str()
        .unwrap()
        .to_string()
}

/// POST `notifications/initialized` to complete the MCP handshake.
/// This triggers the server's `on_initialized` handler.
pub(crate) async fn send_initialized_notification(
    client: &reqwest::Client,
    url: &str,
    session_id: &str,
) {
    let resp = client
        .post(url)
        .header("Accept", ACCEPT_BOTH)
        .header("Content-Type", "application/json")
        .header("Mcp-Session-Id", session_id)
        .json(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/initialized"
        }))
        .send()
        .await
        .expect("POST notifications/initialized");

    assert_eq!(
        resp.status().as_u16(),
        202,
        "notifications/initialized should return 202 Accepted"
    );
}

/// Open a standalone GET SSE stream (no Last-Event-ID).
pub(crate) async fn open_standalone_get(
    client: &reqwest::Client,
    url: &str,
    session_id: &str,
) -> reqwest::Response {
    client
        .get(url)
        .header("Accept", ACCEPT_SSE)
        .header("Mcp-Session-Id", session_id)
        .send()
        .await
        .expect("GET SSE stream")
}

/// Open a GET SSE stream with Last-Event-ID (resume).
pub(crate) async fn open_resume_get(
    client: &reqwest::Client,
    url: &str,
    session_id: &str,
    last_event_id: &str,
) -> reqwest::Response {
    client
        .get(url)
        .header("Accept", ACCEPT_SSE)
        .header("Mcp-Session-Id", session_id)
        .header("Last-Event-ID", last_event_id)
        .send()
        .await
        .expect("GET SSE stream with Last-Event-ID")
}

/// Read from an SSE byte stream until we find a specific text or timeout.
pub(crate) async fn wait_for_sse_event(
    resp: reqwest::Response,
    needle: &str,
    timeout: Duration,
) -> bool {
    let mut stream = resp.bytes_stream();
    let result = tokio::time::timeout(timeout, async {
        while let Some(Ok(chunk)) = stream.next().await {
            let text = String::from_utf8_lossy(&chunk);
            if text.contains(needle) {
                return true;
            }
        }
        false
    })
    .await;

    matches!(result, Ok(true))
}

// ─── Tests: Shadow stream creation ──────────────────────────────────────────

/// Second standalone GET with same session ID should return 200 OK
/// (shadow stream), NOT 409 Conflict.
#[tokio::test]
async fn shadow_second_standalone_get_returns_200() {
    let ct = CancellationToken::new();
    let trigger = Arc::new(Notify::new());
    let url = start_test_server(ct.clone(), trigger).await;
    let client = reqwest::Client::new();

    let session_id = initialize_session(&client, &url).await;

    // First GET — becomes primary common channel
    let get1 = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(get1.status(), 200, "First GET should succeed");

    tokio::time::sleep(Duration::from_millis(100)).await;

    // Second GET — should get 200 (shadow), NOT 409
    let get2 = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(
        get2.status(),
        200,
        "Second GET should return 200 (shadow stream), not 409 Conflict"
    );

    ct.cancel();
}

/// Multiple standalone GETs should all return 200 — the server can handle
/// many shadow streams concurrently.
#[tokio::test]
async fn shadow_multiple_standalone_gets_all_succeed() {
    let ct = CancellationToken::new();
    let trigger = Arc::new(Notify::new());
    let url = start_test_server(ct.clone(), trigger).await;
    let client = reqwest::Client::new();

    let session_id = initialize_session(&client, &url).await;

    // Open 5 concurrent standalone GETs
    let mut responses = Vec::new();
    for i in 0..5 {
        let resp = open_standalone_get(&client, &url, &session_id).await;
        assert_eq!(resp.status(), 200, "GET #{i} should succeed");
        responses.push(resp);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // All 5 should be alive (first is primary, rest are shadows)
    assert_eq!(responses.len(), 5);

    ct.cancel();
}

// ─── Tests: Dead primary replacement ────────────────────────────────────────

/// When the primary common channel is dead (first GET dropped), the next GET
/// should replace it and become the new primary.
#[tokio::test]
async fn dead_primary_gets_replaced_by_next_get() {
    let ct = CancellationToken::new();
    let trigger = Arc::new(Notify::new());
    let url = start_test_server(ct.clone(), trigger).await;
    let client = reqwest::Client::new();

    let session_id = initialize_session(&client, &url).await;

    // First GET — becomes primary
    let get1 = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(get1.status(), 200);

    // Drop primary — kills receiver, making sender closed
    drop(get1);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Second GET — primary is dead, should replace it
    let get2 = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(
        get2.status(),
        200,
        "GET should succeed as new primary after old primary was dropped"
    );

    ct.cancel();
}

/// After primary dies, the replacement primary should be able to receive
/// notifications (verifies the channel was actually replaced, not shadowed).
#[tokio::test]
async fn dead_primary_replacement_receives_notifications() {
    let ct = CancellationToken::new();
    let trigger = Arc::new(Notify::new());
    let url = start_test_server(ct.clone(), trigger.clone()).await;
    let client = reqwest::Client::new();

    let session_id = initialize_session(&client, &url).await;
    send_initialized_notification(&client, &url, &session_id).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    // First GET — becomes primary
    let get1 = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(get1.status(), 200);

    // Drop primary
    drop(get1);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Second GET — becomes new primary (replacement)
    let get2 = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(get2.status(), 200);

    // Trigger notification — should arrive on get2 (the new primary)
    trigger.notify_one();

    assert!(
        wait_for_sse_event(get2, "tools/list_changed", Duration::from_secs(3)).await,
        "Replacement primary should receive notifications"
    );

    ct.cancel();
}

/// Multiple drops and replacements should work: primary can be replaced
/// more than once.
#[tokio::test]
async fn dead_primary_can_be_replaced_multiple_times() {
    let ct = CancellationToken::new();
    let trigger = Arc::new(Notify::new());
    let url = start_test_server(ct.clone(), trigger).await;
    let client = reqwest::Client::new();

    let session_id = initialize_session(&client, &url).await;

    for i in 0..3 {
        let get = open_standalone_get(&client, &url, &session_id).await;
        assert_eq!(get.status(), 200, "GET #{i} should succeed");
        drop(get);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Final GET should still work
    let final_get = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(
        final_get.status(),
        200,
        "GET after multiple replacements should succeed"
    );

    ct.cancel();
}

// ─── Tests: Notification routing ────────────────────────────────────────────

/// Notification should arrive on the primary stream even after shadow streams
/// are created by subsequent GETs.
#[tokio::test]
async fn notification_reaches_primary_not_shadow() {
    let ct = CancellationToken::new();
    let trigger = Arc::new(Notify::new());
    let url = start_test_server(ct.clone(), trigger.clone()).await;
    let client = reqwest::Client::new();

    let session_id = initialize_session(&client, &url).await;
    send_initialized_notification(&client, &url, &session_id).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // First GET — primary common channel
    let get1 = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(get1.status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Second GET — shadow stream (should NOT steal notifications)
    let _get2 = open_standalone_get(&client, &url, &session_id).await;
    assert_eq!(_get2.status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Trigger notification
    trigger.notify_one();

    // Primary stream should receive the notification
    assert!(
        wait_for_sse_event(get1, "tools/list_changed", Duration::from_secs(3)).await,
        "Primary stream should receive notification even after shadow was created"
    );

    ct.cancel();
}
