//! A demo rmcp Streamable HTTP server (one "replica") wired to cursorlog. Start two of them on
//! one cursorlog and a client can lose its connection to one and resume on the other.
//!
//! Tool `countdown {steps, delay_ms}` sends `steps` progress notifications, `delay_ms` apart,
//! then returns "countdown of N done". Each execution is appended to `--exec-log` (if set), so
//! a test can prove that a resumed call ran exactly once.
//!
//! With `--tasks` the replica also advertises the tasks extension (SEP-2663) and serves the
//! conformance suite's task fixtures as durable tasks in cursorlog (see `demo/tasks.rs`).

#[path = "demo/tasks.rs"]
mod fixtures;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use cursorlog_rmcp::tasks::CursorlogTaskManager;
use cursorlog_rmcp::{AdapterConfig, Cursorlog, OnEvicted};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    ErrorData, GetTaskParams, GetTaskResult, ListToolsResult, NumberOrString,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};

#[derive(Debug, Parser)]
#[command(about = "Demo rmcp replica whose SSE events live in cursorlog")]
struct Args {
    /// Address to listen on; port 0 picks a free one. The bound URL is printed on stdout.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// cursorlog's gRPC endpoint; for a replicated cursorlog, its members comma-separated
    /// (`http://a:7001,http://b:7001,http://c:7001`): calls follow the leader.
    #[arg(
        long,
        env = "CURSORLOG_ENDPOINTS",
        default_value = "http://127.0.0.1:50051"
    )]
    cursorlog: String,
    /// Bearer token, when cursorlog runs with `--auth-token`.
    #[arg(long, env = "CURSORLOG_AUTH_TOKEN")]
    cursorlog_token: Option<String>,
    /// Append one line per tool execution to this file.
    #[arg(long)]
    exec_log: Option<PathBuf>,
    /// Producer lease of each request stream, in ms (0 = none).
    #[arg(long, default_value_t = 10_000)]
    lease_ms: u64,
    /// SSE `retry` hint the client waits before reconnecting, in ms.
    #[arg(long, default_value_t = 3_000)]
    sse_retry_ms: u64,
    /// What a client resuming from an evicted cursor gets: `mark-gap` (a warning, then the
    /// rest of the stream) or `error` (the -32011 error).
    #[arg(long, default_value = "mark-gap", value_parser = ["mark-gap", "error"])]
    on_evicted: String,
    /// Serve durable tasks (SEP-2663) and the conformance suite's task fixtures.
    #[arg(long)]
    tasks: bool,
    /// Worker lease of each task, in ms: a task whose replica dies fails after it.
    #[arg(long, default_value_t = 10_000)]
    task_worker_lease_ms: u64,
}

#[derive(Debug, Clone)]
struct Demo {
    exec_log: Option<Arc<PathBuf>>,
    tasks: Option<CursorlogTaskManager>,
}

fn tasks_off() -> ErrorData {
    ErrorData::method_not_found::<rmcp::model::GetTaskMethod>()
}

impl Demo {
    fn record(&self, line: &str) -> Result<(), ErrorData> {
        let Some(path) = &self.exec_log else {
            return Ok(());
        };
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path.as_ref())
            .and_then(|mut f| writeln!(f, "{line}"))
            .map_err(|e| ErrorData::internal_error(format!("exec log: {e}"), None))
    }
}

fn countdown_tool() -> Tool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "steps": {"type": "integer", "minimum": 0},
            "delay_ms": {"type": "integer", "minimum": 0}
        }
    });
    let serde_json::Value::Object(schema) = schema else {
        unreachable!("the literal above is an object")
    };
    Tool::new(
        "countdown",
        "Sends `steps` progress notifications `delay_ms` apart, then returns",
        Arc::new(schema),
    )
}

fn arg(request: &CallToolRequestParams, name: &str, default: u64) -> u64 {
    request
        .arguments
        .as_ref()
        .and_then(|a| a.get(name))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(default)
}

impl ServerHandler for Demo {
    fn get_info(&self) -> ServerConfig {
        if self.tasks.is_some() {
            return ServerConfig::new(
                ServerCapabilities::builder()
                    .enable_tools()
                    .enable_tasks()
                    .build(),
            );
        }
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let tasks = self.tasks.as_ref().ok_or_else(tasks_off)?;
        fixtures::get_task(tasks, request, context).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let tasks = self.tasks.as_ref().ok_or_else(tasks_off)?;
        fixtures::update_task(tasks, request, context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let tasks = self.tasks.as_ref().ok_or_else(tasks_off)?;
        fixtures::cancel_task(tasks, request, context).await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = vec![countdown_tool()];
        if self.tasks.is_some() {
            tools.extend(fixtures::tools());
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(tasks) = &self.tasks {
            if fixtures::is_fixture(&request.name) {
                return fixtures::call_tool(tasks, request, context).await;
            }
        }
        if request.name != "countdown" {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        let steps = arg(&request, "steps", 5);
        let delay = Duration::from_millis(arg(&request, "delay_ms", 100));
        let session = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        self.record(&format!("countdown session={session} id={}", context.id))?;
        let token = context
            .meta
            .get_progress_token()
            .unwrap_or_else(|| ProgressToken(NumberOrString::String("countdown".into())));
        for step in 1..=steps {
            tokio::time::sleep(delay).await;
            let progress = ProgressNotificationParam::new(token.clone(), step as f64)
                .with_total(steps as f64)
                .with_message(format!("step {step} of {steps}"));
            if let Err(e) = context.peer.notify_progress(progress).await {
                tracing::warn!(error = %e, "progress notification not delivered");
            }
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "countdown of {steps} done"
        ))])
        .into())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,cursorlog_rmcp=debug".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut cursorlog = if args.cursorlog.contains(',') {
        Cursorlog::connect_list(&args.cursorlog)?
    } else {
        Cursorlog::connect(args.cursorlog.clone()).await?
    };
    if let Some(token) = &args.cursorlog_token {
        cursorlog = cursorlog.with_token(token)?;
    }
    let mut adapter = AdapterConfig {
        lease: (args.lease_ms > 0).then(|| Duration::from_millis(args.lease_ms)),
        on_evicted: match args.on_evicted.as_str() {
            "error" => OnEvicted::EndWithError,
            _ => OnEvicted::MarkGap,
        },
        ..AdapterConfig::default()
    };
    adapter.session.sse_retry = Some(Duration::from_millis(args.sse_retry_ms));
    let mut config = StreamableHttpServerConfig::default();
    config.sse_retry = Some(Duration::from_millis(args.sse_retry_ms));
    config.session_store = Some(Arc::new(cursorlog.session_store()));
    let tasks = args.tasks.then(|| {
        cursorlog
            .task_manager()
            .with_worker_lease(Duration::from_millis(args.task_worker_lease_ms.max(1)))
    });
    let demo = Demo {
        exec_log: args.exec_log.map(Arc::new),
        tasks,
    };
    let service = StreamableHttpService::new(
        move || Ok(demo.clone()),
        Arc::new(cursorlog.session_manager(adapter)),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    println!("listening on {url}");
    tracing::info!(%url, cursorlog = %args.cursorlog, "rmcp demo replica serving");
    axum::serve(listener, router).await?;
    Ok(())
}
