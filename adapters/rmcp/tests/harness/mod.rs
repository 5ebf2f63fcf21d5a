//! Test harness: real `cursorlog`, real rmcp replicas (`cursorlog-rmcp-demo`), a TCP proxy
//! standing in for a load balancer without affinity, and rmcp's own client.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use cursorlog_tests::{pb, Server};

/// One rmcp server process using the cursorlog adapter. Killed when dropped.
#[derive(Debug)]
pub struct Replica {
    child: Child,
    pub addr: SocketAddr,
}

impl Replica {
    pub fn start(cursorlog: &Server, exec_log: &Path, lease_ms: u64) -> Self {
        Self::start_with_token(cursorlog, exec_log, lease_ms, None)
    }

    pub fn start_with_token(
        cursorlog: &Server,
        exec_log: &Path,
        lease_ms: u64,
        token: Option<&str>,
    ) -> Self {
        Self::start_with(cursorlog, exec_log, lease_ms, token, &[])
    }

    /// A replica with extra command-line arguments.
    pub fn start_with(
        cursorlog: &Server,
        exec_log: &Path,
        lease_ms: u64,
        token: Option<&str>,
        extra: &[&str],
    ) -> Self {
        let endpoint = format!("http://{}", cursorlog.addr);
        Self::start_on(&endpoint, exec_log, lease_ms, token, extra)
    }

    /// A replica on `endpoints`: one cursorlog endpoint, or a cluster's comma-separated.
    pub fn start_on(
        endpoints: &str,
        exec_log: &Path,
        lease_ms: u64,
        token: Option<&str>,
        extra: &[&str],
    ) -> Self {
        Self::start_logged(endpoints, exec_log, lease_ms, token, extra, None)
    }

    /// [`Replica::start_on`] with the replica's log (stderr, `cursorlog_rmcp` at debug) written
    /// to `log` instead of the test's stderr, for a test that reads what the adapter did.
    pub fn start_logged(
        endpoints: &str,
        exec_log: &Path,
        lease_ms: u64,
        token: Option<&str>,
        extra: &[&str],
        log: Option<&Path>,
    ) -> Self {
        let stderr = match log {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("create the replica log")),
            None => Stdio::inherit(),
        };
        let mut command = Command::new(env!("CARGO_BIN_EXE_cursorlog-rmcp-demo"));
        command.args(extra);
        command.env_remove("CURSORLOG_AUTH_TOKEN");
        if let Some(token) = token {
            command.arg("--cursorlog-token").arg(token);
        }
        let mut child = command
            .args(["--listen", "127.0.0.1:0", "--sse-retry-ms", "200"])
            .arg("--cursorlog")
            .arg(endpoints)
            .arg("--exec-log")
            .arg(exec_log)
            .arg("--lease-ms")
            .arg(lease_ms.to_string())
            .env("RUST_LOG", "info,cursorlog_rmcp=debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start cursorlog-rmcp-demo");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line from the replica: {line:?}"));
        let addr = url.trim_end_matches("/mcp").parse().unwrap();
        Self { child, addr }
    }

    /// SIGKILL: the replica dies mid-call, leases and all.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP proxy in front of the replicas. It forwards each new connection to the current
/// backend; it can cut every live connection, hold new ones until released, and rewrite the
/// `Last-Event-ID` of a request (to present a foreign cursor).
#[derive(Debug, Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
}

#[derive(Debug)]
struct ProxyState {
    backend: Mutex<SocketAddr>,
    open: watch::Sender<bool>,
    live: Mutex<Vec<JoinHandle<()>>>,
    rewrite: Mutex<Option<String>>,
    resumes: Mutex<Vec<String>>,
    /// What each connection carried from the server to the client, in accept order.
    wire: Mutex<Vec<Tap>>,
}

/// The server-to-client bytes of one proxied connection, recorded once written to the client.
type Tap = Arc<Mutex<Vec<u8>>>;

impl Proxy {
    pub async fn start(backend: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState {
            backend: Mutex::new(backend),
            open: watch::channel(true).0,
            live: Mutex::default(),
            rewrite: Mutex::default(),
            resumes: Mutex::default(),
            wire: Mutex::default(),
        });
        let accept_state = state.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let state = accept_state.clone();
                let tap = Tap::default();
                accept_state.wire.lock().unwrap().push(tap.clone());
                let task = tokio::spawn(forward(socket, state, tap));
                accept_state.live.lock().unwrap().push(task);
            }
        });
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Drops every live connection (both directions), like a load balancer losing a node.
    pub fn cut(&self) {
        for task in self.state.live.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// New connections wait until [`Proxy::release_to`].
    pub fn hold(&self) {
        self.state.open.send_replace(false);
    }

    /// Routes new connections (and the held ones) to `backend`.
    pub fn release_to(&self, backend: SocketAddr) {
        *self.state.backend.lock().unwrap() = backend;
        self.state.open.send_replace(true);
    }

    /// Replaces the `Last-Event-ID` of later requests with `cursor`.
    pub fn rewrite_last_event_id(&self, cursor: &str) {
        *self.state.rewrite.lock().unwrap() = Some(cursor.to_owned());
    }

    /// The `Last-Event-ID`s that went through (after any rewrite).
    pub fn resumes(&self) -> Vec<String> {
        self.state.resumes.lock().unwrap().clone()
    }

    /// The countdown steps (`step N of M` → N) the proxy delivered to the client, connection
    /// by connection in accept order: the order on the wire, which is what the adapter
    /// controls. (rmcp's client runs each notification handler in its own task, so the order
    /// a handler records is not the order the events arrived in.)
    pub fn steps_on_the_wire(&self) -> Vec<u64> {
        let taps = self.state.wire.lock().unwrap().clone();
        let mut steps = Vec::new();
        for tap in taps {
            let bytes = tap.lock().unwrap().clone();
            let text = String::from_utf8_lossy(&bytes);
            for (at, _) in text.match_indices("step ") {
                let digits: String = text[at + 5..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                if text[at + 5 + digits.len()..].starts_with(" of ") {
                    steps.push(digits.parse().unwrap());
                }
            }
        }
        steps
    }

    /// Asserts the steps reached the client in strictly increasing order across every
    /// connection and reconnection: none repeated, none out of order.
    pub fn assert_steps_in_order(&self) {
        let steps = self.steps_on_the_wire();
        assert!(
            steps.windows(2).all(|w| w[0] < w[1]),
            "steps on the wire out of order or repeated: {steps:?}"
        );
    }
}

async fn forward(mut client: TcpStream, state: Arc<ProxyState>, tap: Tap) {
    let mut open = state.open.subscribe();
    if open.wait_for(|o| *o).await.is_err() {
        return;
    }
    let backend = *state.backend.lock().unwrap();
    let Ok(mut server) = TcpStream::connect(backend).await else {
        return;
    };
    // Look at the request head to see (and maybe rewrite) Last-Event-ID.
    let mut buf = vec![0u8; 64 * 1024];
    let Ok(n) = client.read(&mut buf).await else {
        return;
    };
    let head = rewrite_head(&buf[..n], &state);
    if server.write_all(&head).await.is_err() {
        return;
    }
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let upstream = async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
        let _ = to_server.shutdown().await;
    };
    let downstream = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from_server.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    tap.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            }
        }
        let _ = to_client.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

fn rewrite_head(bytes: &[u8], state: &ProxyState) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return bytes.to_vec();
    };
    let rewrite = state.rewrite.lock().unwrap().clone();
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive("\r\n") {
        match line.split_once(':') {
            Some((name, value)) if name.eq_ignore_ascii_case("last-event-id") => {
                let cursor = rewrite.clone().unwrap_or_else(|| value.trim().to_owned());
                state.resumes.lock().unwrap().push(cursor.clone());
                out.push_str(&format!("{name}: {cursor}\r\n"));
            }
            _ => out.push_str(line),
        }
    }
    out.into_bytes()
}

/// `(level, logger, data)` of a `notifications/message`.
pub type LogMessage = (String, Option<String>, serde_json::Value);

/// An rmcp client handler that records progress messages and `notifications/message` logs.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    pub progress: Arc<Mutex<Vec<String>>>,
    /// Each `notifications/message` log message.
    pub logs: Arc<Mutex<Vec<LogMessage>>>,
    /// Rung after each progress message is recorded.
    arrived: Arc<tokio::sync::Notify>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let message = params.message.unwrap_or_default();
        self.progress.lock().unwrap().push(message);
        self.arrived.notify_waiters();
    }

    // Logging is deprecated in rmcp (SEP-2577) but is how a gap is marked for the client.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let level = serde_json::to_value(params.level)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        self.logs
            .lock()
            .unwrap()
            .push((level, params.logger, params.data));
    }
}

impl Recorder {
    /// The progress messages in the order the handler ran. rmcp's client spawns a task per
    /// notification, so this order is racy: compare it to an expected list with
    /// [`Recorder::seen_by_step`], and check the wire order with [`Proxy::assert_steps_in_order`].
    pub fn seen(&self) -> Vec<String> {
        self.progress.lock().unwrap().clone()
    }

    /// The progress messages sorted by their step number (a repeated step stays repeated).
    pub fn seen_by_step(&self) -> Vec<String> {
        let mut seen = self.seen();
        seen.sort_by_key(|m| {
            m.strip_prefix("step ")
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(u64::MAX)
        });
        seen
    }

    /// Waits until at least `n` progress messages arrived.
    pub async fn wait_for(&self, n: usize) {
        let arrived = async {
            loop {
                let next = self.arrived.notified();
                if self.seen().len() >= n {
                    return;
                }
                next.await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(20), arrived)
            .await
            .is_err()
        {
            panic!("only {:?} progress arrived, waited for {n}", self.seen());
        }
    }
}

pub async fn connect(url: &str) -> (Recorder, RunningService<RoleClient, Recorder>) {
    let recorder = Recorder::default();
    let client = recorder
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(url.to_owned()))
        .await
        .expect("rmcp client connects and initializes");
    (recorder, client)
}

/// Starts `countdown {steps, delay_ms}` in the background; the handle yields the result text
/// or the JSON-RPC error.
pub fn call_countdown(
    client: &RunningService<RoleClient, Recorder>,
    steps: u64,
    delay_ms: u64,
) -> JoinHandle<Result<String, rmcp::model::ErrorData>> {
    let peer = client.peer().clone();
    tokio::spawn(async move {
        let args = serde_json::json!({"steps": steps, "delay_ms": delay_ms});
        let serde_json::Value::Object(args) = args else {
            unreachable!()
        };
        match peer
            .call_tool(CallToolRequestParams::new("countdown").with_arguments(args))
            .await
        {
            Ok(result) => Ok(result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<Vec<_>>()
                .join("")),
            Err(ServiceError::McpError(e)) => Err(e),
            Err(other) => panic!("call failed outside JSON-RPC: {other}"),
        }
    })
}

/// The progress messages `countdown` sends for `steps`.
pub fn expected_progress(steps: u64) -> Vec<String> {
    (1..=steps)
        .map(|i| format!("step {i} of {steps}"))
        .collect()
}

/// Execution log lines (`countdown session=… id=…`).
pub fn executions(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The MCP session id of each execution so far.
pub fn execution_sessions(path: &Path) -> Vec<String> {
    executions(path)
        .iter()
        .map(|line| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix("session="))
                .expect("session in the exec log")
                .to_owned()
        })
        .collect()
}

/// The MCP session id of the first execution.
pub fn session_of_first_execution(path: &Path) -> String {
    execution_sessions(path)
        .into_iter()
        .next()
        .expect("one execution")
}

/// One cursorlog and two replicas (A and B) sharing an execution log.
#[derive(Debug)]
pub struct Cluster {
    pub cursorlog: Server,
    pub a: Replica,
    pub b: Replica,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start(lease_ms: u64) -> Self {
        Self::start_with(lease_ms, &[], &[])
    }

    /// A cluster with extra `cursorlog serve` and replica arguments.
    pub fn start_with(lease_ms: u64, server_args: &[&str], replica_args: &[&str]) -> Self {
        let cursorlog = Server::start(server_args);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("exec.log");
        let a = Replica::start_with(&cursorlog, &log, lease_ms, None, replica_args);
        let b = Replica::start_with(&cursorlog, &log, lease_ms, None, replica_args);
        Self {
            cursorlog,
            a,
            b,
            log,
            _dir: dir,
        }
    }
}

/// The cursorlog stream answering the first `countdown` call, found the way an operator would:
/// by the MCP session and JSON-RPC request id in the replica's execution log.
pub async fn countdown_stream(cl: &Server, log: &std::path::Path) -> (String, pb::Outcome) {
    let session = session_of_first_execution(log);
    let line = executions(log).into_iter().next().unwrap();
    let request = line.rsplit("id=").next().unwrap().to_owned();
    let found = cl
        .client()
        .await
        .get_outcome(pb::GetOutcomeRequest {
            session: session.clone(),
            correlation: request,
            stream: None,
        })
        .await
        .unwrap()
        .into_inner();
    (
        session,
        found.outcome.expect("the call's stream is in cursorlog"),
    )
}

pub async fn head(cl: &Server, session: &str, outcome: &pb::Outcome) -> u64 {
    let r = cl
        .client()
        .await
        .resolve(pb::ResolveRequest {
            session: session.to_owned(),
            last_event_id: format!("{}-{}-0", outcome.epoch, outcome.stream),
            declared_stream: None,
        })
        .await
        .unwrap()
        .into_inner();
    r.head.unwrap_or_default()
}
