//! An rmcp Streamable-HTTP front-end replica under load, with the cursorlog adapter and with
//! a Redis-Streams event store of the kind rmcp users write, in the same process, same run,
//! rounds interleaved.
//!
//! Each round starts `--calls` tool calls at once, one per MCP session (sessions are set up
//! before the rounds). Each call streams `--events` progress notifications and a result
//! through rmcp's real `StreamableHttpService` (HTTP/1.1, SSE) to a reqwest client that reads
//! the stream. rmcp stores every event (and waits for the store) before it sends it, so each
//! event received is durable. Measured per round: events received per second of wall time,
//! and each event's latency from the tool's `notify_progress` call (the time is in the
//! message) to its arrival at the client.
//!
//! cursorlog: `cursorlog serve --sync always` (release build) on a temporary directory.
//! Redis: `redis-server --appendonly yes --appendfsync always` on a temporary directory.
//! With `--ceiling`, a third side runs rmcp with no store at all: the most any store could
//! reach on this machine, since the front-end and its clients share the cores with it.
//! With `--memory-side`, another runs rmcp's event-store path with an in-memory store that
//! answers at once: the most any event store (durable or not) could reach. With
//! `--ideal-durable-side`, the same store waits for a real group-committed `fdatasync` per
//! event on the same disk: the most any durable store could reach.
//!
//! ```sh
//! cargo build --release -p cursorlog-server
//! cargo bench -p cursorlog-rmcp --bench rmcp_load -- --calls 200 --events 20 --rounds 7
//! ```

mod json_out;
mod memory_store;
mod redis_store;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clap::Parser;
use cursorlog_rmcp::{AdapterConfig, BatchConfig, Cursorlog};
use futures::StreamExt;
use hdrhistogram::Histogram;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    NumberOrString, ProgressNotificationParam, ProgressToken, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};

#[derive(Debug, Parser)]
struct Args {
    /// Concurrent tool calls per round (one session each).
    #[arg(long, default_value_t = 200)]
    calls: usize,
    /// Progress notifications per call (plus its result).
    #[arg(long, default_value_t = 20)]
    events: u64,
    /// Measured rounds per side (after one warm-up round each).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The `cursorlog` binary (default: target/release/cursorlog of this workspace).
    #[arg(long)]
    cursorlog_bin: Option<PathBuf>,
    /// The `redis-server` binary.
    #[arg(long, default_value = "redis-server")]
    redis_server: PathBuf,
    /// The adapter's `BatchConfig::max_in_flight`.
    #[arg(long, default_value_t = BatchConfig::default().max_in_flight)]
    max_in_flight: usize,
    /// Open request streams without a producer lease (`AdapterConfig::lease = None`).
    #[arg(long)]
    no_lease: bool,
    /// Also run a third side: rmcp with no store at all (its in-process resumption cache,
    /// nothing durable). Its throughput is the ceiling any store can reach on this machine.
    #[arg(long)]
    ceiling: bool,
    /// Also run a side with an in-memory event store (rmcp's event-store path, priming
    /// events included, with a store that costs nothing beyond serialising the message): the
    /// most any event store, durable or not, could reach on this machine.
    #[arg(long)]
    memory_side: bool,
    /// Also run the in-memory store with every event waiting for a real group-committed
    /// `fdatasync` on the same disk (an ideal durable store: the disk's latency, no server,
    /// no network): the most any durable event store could reach on this machine.
    #[arg(long)]
    ideal_durable_side: bool,
    /// Also run the cursorlog adapter with `BatchConfig::open_in_batch` off (one unary
    /// `OpenStream` per tool call, as before the `open` batch item), to measure that lever in
    /// the same run.
    #[arg(long)]
    unary_open_side: bool,
    /// Write every round's figures (and the store servers' CPU during it) as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// cargo bench passes `--bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

static START: OnceLock<Instant> = OnceLock::new();

fn now_us() -> u64 {
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// `burst {n}`: n progress notifications, then a result; each carries `t={µs}` of its send.
#[derive(Debug, Clone)]
struct Burst;

impl ServerHandler for Burst {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let n = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("n"))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        let token = context
            .meta
            .get_progress_token()
            .unwrap_or_else(|| ProgressToken(NumberOrString::String("burst".into())));
        for i in 1..=n {
            let p = ProgressNotificationParam::new(token.clone(), i as f64)
                .with_message(format!("t={}", now_us()));
            if let Err(e) = context.peer.notify_progress(p).await {
                return Err(ErrorData::internal_error(format!("progress: {e}"), None));
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("t={}", now_us()))]).into())
    }
}

/// A child process killed when dropped.
struct Proc(Child);

impl Proc {
    /// CPU seconds (user + system) the process used so far, from /proc.
    fn cpu_seconds(&self) -> f64 {
        cpu_seconds(&format!("/proc/{}/stat", self.0.id()))
    }
}

/// CPU seconds (user + system) from a /proc stat file (0 when unreadable).
fn cpu_seconds(stat: &str) -> f64 {
    let Ok(text) = std::fs::read_to_string(stat) else {
        return 0.0;
    };
    let Some(after) = text.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    ticks / 100.0
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn start_cursorlog(bin: &Path, dir: &Path) -> (Proc, SocketAddr) {
    use std::io::BufRead;
    let mut child = Command::new(bin)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--sync",
            "always",
            "--data-dir",
        ])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("cursorlog printed its address")
            .expect("line");
        if let Some(a) = line.strip_prefix("listening on ") {
            break a.parse().expect("address");
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), addr)
}

async fn start_redis(bin: &Path, dir: &Path) -> (Proc, redis::aio::ConnectionManager) {
    let port = free_port();
    let child = Command::new(bin)
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--dir"])
        .arg(dir)
        .args([
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let proc = Proc(child);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("redis url");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(conn) = redis::aio::ConnectionManager::new(client.clone()).await {
            return (proc, conn);
        }
        assert!(Instant::now() < deadline, "redis-server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

fn http_config(
    session_store: Option<Arc<dyn rmcp::transport::streamable_http_server::session::SessionStore>>,
) -> StreamableHttpServerConfig {
    let mut config = StreamableHttpServerConfig::default();
    config.session_store = session_store;
    config.sse_keep_alive = None;
    config
}

/// One side of the comparison: its URL and its initialized sessions.
struct Side {
    name: &'static str,
    url: String,
    sessions: Vec<String>,
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: String,
) -> reqwest::Response {
    let mut request = http
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Protocol-Version", "2025-11-25");
    if let Some(s) = session {
        request = request.header("Mcp-Session-Id", s);
    }
    let response = request.body(body).send().await.expect("POST");
    assert!(
        response.status().is_success(),
        "POST answered {}",
        response.status()
    );
    response
}

async fn init_session(http: &reqwest::Client, url: &str) -> String {
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#;
    let response = post(http, url, None, init.into()).await;
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .expect("id")
        .to_owned();
    let _ = response.bytes().await;
    let done = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let _ = post(http, url, Some(&session), done.into())
        .await
        .bytes()
        .await;
    session
}

/// One call: reads its SSE stream to the result; records each event's latency.
async fn call(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    id: u64,
    n: u64,
) -> (u64, Histogram<u64>) {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"burst","arguments":{{"n":{n}}},"_meta":{{"progressToken":{id}}}}}}}"#
    );
    let mut hist = Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram");
    let mut stream = post(http, url, Some(session), body).await.bytes_stream();
    let mut buf = String::new();
    let mut events = 0;
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.expect("SSE chunk")));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let Some(at) = block.find("t=") else { continue };
            let digits: String = block[at + 2..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let sent: u64 = digits.parse().expect("a send time");
            let _ = hist.record(now_us().saturating_sub(sent).max(1));
            events += 1;
            if block.contains("\"result\"") {
                return (events, hist);
            }
        }
    }
    panic!("call {id} ended without its result after {events} events");
}

struct RoundResult {
    events: u64,
    seconds: f64,
    hist: Histogram<u64>,
    /// CPU seconds this process (front-ends and clients) used during the round.
    cpu: f64,
}

async fn round(http: &reqwest::Client, side: &Side, n: u64, round_no: u64) -> RoundResult {
    let cpu_before = cpu_seconds("/proc/self/stat");
    let started = Instant::now();
    let calls = side.sessions.iter().enumerate().map(|(i, session)| {
        let id = round_no * 1_000_000 + i as u64 + 1;
        call(http, &side.url, session, id, n)
    });
    let results = futures::future::join_all(calls).await;
    let seconds = started.elapsed().as_secs_f64();
    let mut hist = Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram");
    let mut events = 0;
    for (e, h) in results {
        events += e;
        hist.add(h).expect("same bounds");
    }
    RoundResult {
        events,
        seconds,
        hist,
        cpu: cpu_seconds("/proc/self/stat") - cpu_before,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _ = now_us();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cursorlog_bin = args
        .cursorlog_bin
        .clone()
        .unwrap_or_else(|| workspace.join("target/release/cursorlog"));
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("redis")).expect("redis dir");
    let (_cursorlog_proc, cursorlog_addr) =
        start_cursorlog(&cursorlog_bin, &dir.path().join("cursorlog"));
    let (_redis_proc, redis) = start_redis(&args.redis_server, &dir.path().join("redis")).await;

    let cursorlog = Cursorlog::connect(format!("http://{cursorlog_addr}"))
        .await
        .expect("connect");
    let mut adapter = AdapterConfig::default();
    adapter.batch.max_in_flight = args.max_in_flight;
    if args.no_lease {
        adapter.lease = None;
    }
    let c_manager = Arc::new(cursorlog.session_manager(adapter.clone()));
    let c_service = StreamableHttpService::new(
        || Ok(Burst),
        c_manager.clone(),
        http_config(Some(Arc::new(cursorlog.session_store()))),
    );
    let r_manager =
        LocalSessionManager::default().with_event_store(Arc::new(redis_store::RedisEventStore {
            conn: redis.clone(),
        }));
    let r_service = StreamableHttpService::new(
        || Ok(Burst),
        Arc::new(r_manager),
        http_config(Some(Arc::new(redis_store::RedisSessionStore {
            conn: redis,
        }))),
    );
    let c_url = serve(axum::Router::new().nest_service("/mcp", c_service)).await;
    let r_url = serve(axum::Router::new().nest_service("/mcp", r_service)).await;
    let mut urls = vec![("cursorlog", c_url), ("redis", r_url)];
    if args.unary_open_side {
        let mut unary = adapter.clone();
        unary.batch.open_in_batch = false;
        let u_service = StreamableHttpService::new(
            || Ok(Burst),
            Arc::new(cursorlog.session_manager(unary)),
            http_config(Some(Arc::new(cursorlog.session_store()))),
        );
        let u_url = serve(axum::Router::new().nest_service("/mcp", u_service)).await;
        urls.push(("cursorlog-unary-open", u_url));
    }
    if args.memory_side {
        let manager = LocalSessionManager::default()
            .with_event_store(Arc::new(memory_store::MemoryEventStore::default()));
        let service =
            StreamableHttpService::new(|| Ok(Burst), Arc::new(manager), http_config(None));
        let url = serve(axum::Router::new().nest_service("/mcp", service)).await;
        urls.push(("memory", url));
    }
    if args.ideal_durable_side {
        let sync = memory_store::GroupSync::start(&dir.path().join("group-sync"))
            .expect("start the group-sync thread");
        let manager = LocalSessionManager::default()
            .with_event_store(Arc::new(memory_store::MemoryEventStore::with_sync(sync)));
        let service =
            StreamableHttpService::new(|| Ok(Burst), Arc::new(manager), http_config(None));
        let url = serve(axum::Router::new().nest_service("/mcp", service)).await;
        urls.push(("ideal-durable", url));
    }
    if args.ceiling {
        let m_service = StreamableHttpService::new(
            || Ok(Burst),
            Arc::new(LocalSessionManager::default()),
            http_config(None),
        );
        let m_url = serve(axum::Router::new().nest_service("/mcp", m_service)).await;
        urls.push(("no-store", m_url));
    }

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(4 * args.calls)
        .build()
        .expect("http client");
    let mut sides = Vec::new();
    for (name, url) in urls {
        let mut sessions = Vec::new();
        for _ in 0..args.calls {
            sessions.push(init_session(&http, &url).await);
        }
        sides.push(Side {
            name,
            url,
            sessions,
        });
    }
    println!(
        "rmcp_load: {} concurrent calls x ({} progress + 1 result), {} rounds per side, max_in_flight {}, leases {}",
        args.calls,
        args.events,
        args.rounds,
        args.max_in_flight,
        if args.no_lease { "off" } else { "on" }
    );
    for side in &sides {
        let _ = round(&http, side, args.events, 0).await; // warm-up
    }
    let mut results: Vec<Vec<RoundResult>> = sides.iter().map(|_| Vec::new()).collect();
    // Per side, per round: CPU seconds of the cursorlog server and of redis-server.
    let mut store_cpu: Vec<Vec<(f64, f64)>> = sides.iter().map(|_| Vec::new()).collect();
    let cpu_at_start = (
        _cursorlog_proc.cpu_seconds(),
        _redis_proc.cpu_seconds(),
        cpu_seconds("/proc/self/stat"),
    );
    for r in 0..args.rounds {
        // Alternate the order so neither side always runs on a warmer (or busier) machine.
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let stores_before = (_cursorlog_proc.cpu_seconds(), _redis_proc.cpu_seconds());
            let result = round(&http, &sides[i], args.events, r as u64 + 1).await;
            store_cpu[i].push((
                _cursorlog_proc.cpu_seconds() - stores_before.0,
                _redis_proc.cpu_seconds() - stores_before.1,
            ));
            println!(
                "round {} {:<9} {:>7} events in {:.3} s = {:>8.0} events/s  p50 {:>6.2} ms  p99 {:>7.2} ms",
                r + 1,
                sides[i].name,
                result.events,
                result.seconds,
                result.events as f64 / result.seconds,
                result.hist.value_at_quantile(0.5) as f64 / 1e3,
                result.hist.value_at_quantile(0.99) as f64 / 1e3,
            );
            results[i].push(result);
        }
    }
    let summary: Vec<(f64, f64, f64)> = results
        .iter()
        .map(|rs| {
            (
                median(rs.iter().map(|r| r.events as f64 / r.seconds).collect()),
                median(
                    rs.iter()
                        .map(|r| r.hist.value_at_quantile(0.5) as f64 / 1e3)
                        .collect(),
                ),
                median(
                    rs.iter()
                        .map(|r| r.hist.value_at_quantile(0.99) as f64 / 1e3)
                        .collect(),
                ),
            )
        })
        .collect();
    println!("\n| store | events/s (median) | p50 ms (median) | p99 ms (median) |");
    println!("|---|---|---|---|");
    for (side, (eps, p50, p99)) in sides.iter().zip(&summary) {
        println!("| {} | {eps:.0} | {p50:.2} | {p99:.2} |", side.name);
    }
    let redis = summary[1];
    println!();
    for (side, s) in sides.iter().zip(&summary) {
        if side.name == "redis" {
            continue;
        }
        let note = match side.name {
            "no-store" => " (rmcp with no event store at all)",
            "memory" => " (the most any event store could reach here)",
            "ideal-durable" => " (the most any durable event store could reach here)",
            _ => "",
        };
        println!(
            "{} / redis: throughput {:.2}x, p99 {:.2}x{note}",
            side.name,
            s.0 / redis.0,
            s.2 / redis.2
        );
    }
    println!(
        "CPU seconds over the measured rounds: cursorlog server {:.2}, redis-server {:.2}, this process (both front-ends and all clients) {:.2}",
        _cursorlog_proc.cpu_seconds() - cpu_at_start.0,
        _redis_proc.cpu_seconds() - cpu_at_start.1,
        cpu_seconds("/proc/self/stat") - cpu_at_start.2,
    );
    for (side, rs) in sides.iter().zip(&results) {
        let cpu: f64 = rs.iter().map(|r| r.cpu).sum();
        let events: u64 = rs.iter().map(|r| r.events).sum();
        println!(
            "{}: this process used {:.2} CPU s in its rounds, {:.1} µs per event",
            side.name,
            cpu,
            cpu * 1e6 / events as f64
        );
    }
    if let Some(path) = &args.json {
        let names: Vec<&str> = sides.iter().map(|s| s.name).collect();
        json_out::write(path, &args, &names, &results, &store_cpu);
    }
    let stats = c_manager.append_stats();
    println!(
        "cursorlog adapter: {} AppendBatch calls for {} writes ({:.1} per call), {} retries",
        stats.calls,
        stats.items,
        stats.items as f64 / stats.calls.max(1) as f64,
        stats.retries
    );
}
