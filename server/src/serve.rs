//! `cursorlog serve`: open the engine, serve gRPC (with health and reflection), shut down
//! cleanly on SIGINT/SIGTERM.
//!
//! Shutdown order: mark health NOT_SERVING, end live followers, stop accepting connections and
//! wait (up to the grace period) for in-flight calls, then close the engine, which drains the
//! writer and syncs. Exit status 0 means the engine closed cleanly; a poisoned engine (a
//! failed write or fsync) makes the exit status 1, so a supervisor restarts the server.
//!
//! A poisoned engine also turns health NOT_SERVING at once (overall and for
//! `cursorlog.v1.CursorLog`), sets `cursorlog_poisoned 1` and logs what to do. Then, unless
//! `--stay-up-when-poisoned`, the server shuts down by itself as on SIGTERM, giving in-flight
//! calls at most [`POISON_DRAIN`] (a poisoned engine serves reads only), and exits with status
//! 1: a plain `Restart=on-failure` supervisor restarts it, and recovery repairs the log.
//!
//! Connections are bounded ([`crate::connections`]): a cap with a reserve for health probes,
//! a deadline for the HTTP/2 preface, HTTP/2 keepalive, an accept loop that backs off when
//! descriptors run out, and the soft descriptor limit raised to the hard one at start.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::{Config, Engine, FileSystem, StdFs};
use cursorlog_proto::v1::cursor_log_server::CursorLogServer;
use cursorlog_proto::v1::tasks_server::TasksServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Status};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::auth::BearerToken;
use crate::connections::{self, Connections};
use crate::exposure;
use crate::fault::FailFsyncAfter;
use crate::frame_limit::FrameLimit;
use crate::metrics::{self, Metrics};
use crate::metrics_http;
use crate::power_cut::PowerCutFs;
use crate::read_slots::ReadSlots;
use crate::service::CursorLogService;
use crate::tasks::TasksService;
use crate::ServeArgs;

mod config;

use config::{check_limits, engine_config};

/// How long a poisoned server waits for in-flight calls before it exits (at most the
/// shutdown grace period).
const POISON_DRAIN: Duration = Duration::from_secs(5);

/// Runs the server until a shutdown signal; the process exit status.
pub fn run(args: ServeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(usize::from(args.blocking_threads))
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            tracing::error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            eprintln!("cursorlog: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The interceptor's check: `authorization: Bearer <token>` when a token is configured.
fn check_bearer(expected: Option<&BearerToken>, request: &Request<()>) -> Result<(), Status> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let header = request
        .metadata()
        .get("authorization")
        .map(|v| v.as_bytes());
    expected
        .check_header(header)
        .map_err(|failure| Status::unauthenticated(failure.to_string()))
}

/// Flips health to NOT_SERVING the moment the engine is poisoned, and says what to do.
async fn watch_poison(mut poisoned: watch::Receiver<bool>, health: HealthReporter, stay_up: bool) {
    if poisoned.wait_for(|p| *p).await.is_err() {
        return; // The engine is gone: shutting down.
    }
    set_health(&health, ServingStatus::NotServing).await;
    let next = if stay_up {
        "--stay-up-when-poisoned: the server stays up, read-only, until an operator restarts \
         it; it exits non-zero on SIGTERM so a supervisor restarts it"
    } else {
        "The server now drains in-flight calls and exits with status 1 by itself (pass \
         --stay-up-when-poisoned to keep it up, read-only, for an operator)"
    };
    tracing::error!(
        "the storage engine is POISONED: a write or fsync failed, so every write is refused \
         (UNAVAILABLE) and health is NOT_SERVING. Check the disk (dmesg, SMART, free space), \
         then restart cursorlog: recovery repairs the log, and everything acknowledged before \
         the failure is kept. {next}"
    );
}

/// Resolves once the engine is poisoned, unless the operator asked the server to stay up;
/// never when the engine closes first.
async fn poisoned(mut poisoned: watch::Receiver<bool>, stay_up: bool) {
    if stay_up || poisoned.wait_for(|p| *p).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves when a cluster member's Raft core stopped; never on a single node.
async fn raft_core_stopped(node: Option<&cursorlog_replication::ReplicatedNode>) -> String {
    match node {
        Some(node) => node.core_stopped().await,
        None => std::future::pending().await,
    }
}

/// The HTTP/2 keepalive interval the flags ask for (`None`: no pings).
fn keepalive_interval(args: &ServeArgs) -> Option<Duration> {
    (args.http2_keepalive_interval_secs > 0)
        .then(|| Duration::from_secs(args.http2_keepalive_interval_secs))
}

/// Raises the soft descriptor limit to the hard one, and says so.
fn raise_descriptor_limit() {
    match connections::raise_descriptor_limit() {
        Ok((before, after)) if before != after => tracing::info!(
            "raised the soft descriptor limit (RLIMIT_NOFILE) from {} to the hard limit {}",
            limit_text(before),
            limit_text(after)
        ),
        Ok((_, after)) => tracing::info!(
            "descriptor limit (RLIMIT_NOFILE): {} (the hard limit)",
            limit_text(after)
        ),
        Err(err) => tracing::warn!(
            error = %err,
            "cannot raise the soft descriptor limit (RLIMIT_NOFILE) to the hard one"
        ),
    }
}

fn limit_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
}

/// Sets the overall health and the cursorlog services'.
async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health
        .set_service_status(
            <CursorLogServer<CursorLogService> as NamedService>::NAME,
            status,
        )
        .await;
    health
        .set_service_status(<TasksServer<TasksService> as NamedService>::NAME, status)
        .await;
}

/// Ends every open health `Watch` call (after it delivers NOT_SERVING): they never end on
/// their own, and would hold the shutdown for the whole grace period.
async fn end_health_watches(mut health: HealthReporter) {
    health.clear_service_status("").await;
    health
        .clear_service_status(<CursorLogServer<CursorLogService> as NamedService>::NAME)
        .await;
    health
        .clear_service_status(<TasksServer<TasksService> as NamedService>::NAME)
        .await;
}

/// The file system under the data directory: the real one, or a test-only fault-injecting
/// one when a hidden `--fault-*` flag asks for it (each says so at WARN).
pub(crate) fn file_system(args: &ServeArgs) -> Arc<dyn FileSystem> {
    if let Some(n) = args.fault_fail_fsync_after {
        tracing::warn!(
            "TEST ONLY: --fault-fail-fsync-after {n}: fdatasync number {n} will fail with EIO \
             and poison the engine. Never use this flag in production"
        );
        return Arc::new(FailFsyncAfter::new(n));
    }
    if let Some(boot) = args.fault_power_cut_boot {
        tracing::warn!(
            "TEST ONLY: --fault-power-cut-boot {boot}: writes are held in memory until their \
             fdatasync, so killing this process loses them as a power cut would. Never use \
             this flag in production"
        );
        return Arc::new(PowerCutFs::new(boot));
    }
    Arc::new(StdFs)
}

/// Opens the engine (on the blocking pool: recovery reads the whole log).
async fn open_engine(args: &ServeArgs, config: Config) -> Result<Engine, String> {
    let data_dir = config.dir.clone();
    let fs = file_system(args);
    tokio::task::spawn_blocking(move || Engine::open_with_fs(config, fs))
        .await
        .map_err(|e| format!("opening the data directory panicked: {e}"))?
        .map_err(|e| format!("cannot open data directory {}: {e}", data_dir.display()))
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() -> Result<&'static str, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        _ = int.recv() => Ok("SIGINT"),
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let config = engine_config(&args);
    check_limits(&args, &config)?;
    let exposure = exposure::check(&args).map_err(|e| e.to_string())?;
    for warning in &exposure.warnings {
        tracing::warn!("{warning}");
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let cert = std::fs::read(cert)
                .map_err(|e| format!("cannot read --tls-cert {}: {e}", cert.display()))?;
            let key = std::fs::read(key)
                .map_err(|e| format!("cannot read --tls-key {}: {e}", key.display()))?;
            Some(
                ServerTlsConfig::new()
                    .identity(Identity::from_pem(cert, key))
                    .timeout(Duration::from_secs(args.handshake_timeout_secs)),
            )
        }
        _ => None,
    };
    // Install the signal handlers before anything slow, so an early SIGTERM is not fatal.
    let signal = tokio::spawn(shutdown_signal());

    raise_descriptor_limit();
    let node = crate::cluster::start(&args, config.clone()).await?;
    let engine = match &node {
        Some(node) => node.engine().clone(),
        None => open_engine(&args, config).await?,
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("listen address: {e}"))?;

    let mut metrics = Metrics::new(args.read_calls_max);
    metrics.reads = ReadSlots::with_buffers(
        args.read_calls_max,
        args.read_buffer_bytes,
        args.follow_buffer_bytes,
        args.read_buffer_bytes_total,
    );
    let metrics = Arc::new(metrics);
    let conns = Connections::new(
        args.connections_max,
        args.connections_reserved,
        Duration::from_secs(args.handshake_timeout_secs),
    );
    metrics.register_collector(metrics::connections(Arc::clone(&conns)));
    if let Some(node) = &node {
        metrics.register_collector(metrics::raft(node.clone()));
    }
    let metrics_task = match args.metrics_listen {
        Some(addr) => {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen for metrics on {addr}: {e}"))?;
            let bound = l
                .local_addr()
                .map_err(|e| format!("metrics address: {e}"))?;
            tracing::info!(
                auth = exposure.metrics_token.is_some(),
                "metrics on http://{bound}/metrics"
            );
            println!("metrics listening on {bound}");
            Some(tokio::spawn(metrics_http::serve(
                l,
                engine.clone(),
                Arc::clone(&metrics),
                exposure.metrics_token.clone(),
            )))
        }
        None => None,
    };

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let service = CursorLogService::new(
        engine.clone(),
        Arc::clone(&metrics),
        shutdown_rx.clone(),
        args.grpc_message_bytes_max,
    )
    .in_cluster(node.clone());
    let cursorlog = CursorLogServer::new(service)
        .max_decoding_message_size(args.grpc_message_bytes_max)
        .max_encoding_message_size(args.grpc_message_bytes_max);
    // Over-limit requests are RESOURCE_EXHAUSTED (tonic's own check says OUT_OF_RANGE).
    let cursorlog = FrameLimit::new(cursorlog, args.grpc_message_bytes_max);
    // Durable MCP tasks: same port, same limits, same interceptor (below).
    let tasks = TasksServer::new(TasksService::new(
        engine.clone(),
        node.clone(),
        Arc::clone(&metrics.reads),
        shutdown_rx.clone(),
    ))
    .max_decoding_message_size(args.grpc_message_bytes_max)
    .max_encoding_message_size(args.grpc_message_bytes_max);
    let tasks = FrameLimit::new(tasks, args.grpc_message_bytes_max);
    let token = exposure.token.clone();
    let connections_max = args.connections_max;
    let check = move |request: Request<()>| {
        connections::on_reserved_slot(request.extensions(), connections_max)?;
        check_bearer(token.as_ref(), &request).map(|()| request)
    };
    // Peers present the same token as clients (and connect over the same TLS).
    let raft = node.as_ref().map(|node| {
        InterceptedService::new(
            cursorlog_replication::RaftService::new(
                node.raft().clone(),
                cursorlog_replication::SnapshotSpool::in_dir(&args.data_dir),
            )
            .with_vote_guard(node.vote_guard())
            .with_identity(node.identity())
            .with_shutdown(shutdown_rx.clone())
            .into_server(),
            check.clone(),
        )
    });
    let admin = node.as_ref().map(|node| {
        InterceptedService::new(
            cursorlog_replication::AdminService::new(node.clone(), crate::cluster::founders(&args))
                .into_server(),
            check.clone(),
        )
    });
    let tasks = InterceptedService::new(tasks, check.clone());
    let cursorlog = InterceptedService::new(cursorlog, check);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    set_health(&health_reporter, ServingStatus::Serving).await;
    let stay_up = args.stay_up_when_poisoned;
    let mut poison_task = tokio::spawn(watch_poison(
        engine.poison_watch(),
        health_reporter.clone(),
        stay_up,
    ));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cursorlog_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| format!("reflection service: {e}"))?;
    // grpcurl before 1.9 and many other tools only speak the v1alpha reflection protocol.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cursorlog_proto::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| format!("reflection service (v1alpha): {e}"))?;

    let mut builder = Server::builder()
        .http2_keepalive_interval(keepalive_interval(&args))
        .http2_keepalive_timeout(Some(Duration::from_secs(args.http2_keepalive_timeout_secs)));
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| format!("TLS configuration: {e}"))?;
    }
    let incoming = connections::incoming(listener, Arc::clone(&conns));
    let mut stop_accepting = shutdown_rx.clone();
    let server = builder
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(cursorlog)
        .add_service(tasks)
        .add_optional_service(raft)
        .add_optional_service(admin)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stop_accepting.wait_for(|down| *down).await;
        });
    let mut server = tokio::spawn(server);

    tracing::info!(
        data_dir = %args.data_dir.display(),
        sync = %args.sync,
        tls = args.tls_cert.is_some(),
        auth = exposure.token.is_some(),
        token_from = exposure.origin.as_ref().map(ToString::to_string),
        read_calls_max = args.read_calls_max,
        connections_max = args.connections_max,
        connections_reserved = args.connections_reserved,
        handshake_timeout_secs = args.handshake_timeout_secs,
        stay_up_when_poisoned = stay_up,
        blocking_threads = args.blocking_threads,
        session_idle_ttl_secs = args.session_idle_ttl_secs,
        "cursorlog {} serving data dir {}; recovery: {}; listening on {local}",
        env!("CARGO_PKG_VERSION"),
        args.data_dir.display(),
        engine.recovery_report(),
    );
    println!("listening on {local}");
    let _ = std::io::stdout().flush();

    let mut grace = Duration::from_secs(args.shutdown_grace_secs);
    let outcome = tokio::select! {
        () = poisoned(engine.poison_watch(), stay_up) => {
            // Let the watcher say what happened (and turn health NOT_SERVING) first.
            let _ = tokio::time::timeout(Duration::from_secs(1), &mut poison_task).await;
            grace = grace.min(POISON_DRAIN);
            tracing::error!(
                "shutting down because the engine is poisoned (see above); in-flight calls \
                 get {grace:?}"
            );
            Ok(())
        }
        fatal = raft_core_stopped(node.as_ref()) => {
            grace = grace.min(POISON_DRAIN);
            Err(format!(
                "the Raft core of this cluster member stopped ({fatal}): exiting with status 1 \
                 so a supervisor restarts it; the data directory is kept"
            ))
        }
        signal = signal => match signal {
            Ok(Ok(name)) => {
                tracing::info!("{name} received: shutting down");
                Ok(())
            }
            Ok(Err(err)) => Err(err),
            Err(err) => Err(format!("signal handler failed: {err}")),
        },
        ended = &mut server => match ended {
            Ok(Ok(())) => Err("the gRPC server stopped unexpectedly".to_owned()),
            Ok(Err(err)) => Err(format!("the gRPC server failed: {err}")),
            Err(err) => Err(format!("the gRPC server panicked: {err}")),
        },
    };

    poison_task.abort();
    set_health(&health_reporter, ServingStatus::NotServing).await;
    end_health_watches(health_reporter).await;
    let _ = shutdown_tx.send(true);
    if !server.is_finished() {
        match tokio::time::timeout(grace, &mut server).await {
            Ok(Ok(Ok(()))) => tracing::info!("in-flight calls drained"),
            Ok(Ok(Err(err))) => tracing::warn!(error = %err, "gRPC server ended with an error"),
            Ok(Err(err)) => tracing::warn!(error = %err, "gRPC server task failed"),
            Err(_) => {
                tracing::warn!("in-flight calls still running after {grace:?}; closing anyway");
                server.abort();
            }
        }
    }
    if let Some(task) = metrics_task {
        task.abort();
    }
    let closed = match node {
        // Raft stops first (nothing more is applied), then the engine closes.
        Some(node) => node.shutdown().await,
        None => tokio::task::spawn_blocking(move || engine.close())
            .await
            .map_err(|e| format!("closing the engine panicked: {e}"))?,
    };
    match (closed, outcome) {
        (Ok(()), Ok(())) => {
            tracing::info!("engine closed cleanly; bye");
            Ok(())
        }
        (Err(cursorlog_engine::Error::Poisoned), _) => Err(
            "the engine was poisoned by a failed write or fsync: exiting with status 1 so a \
             supervisor restarts cursorlog; recovery repairs the log on the next start"
                .to_owned(),
        ),
        (Err(err), _) => Err(format!("closing the engine failed: {err}")),
        (Ok(()), Err(err)) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::auth::TokenOrigin;

    #[test]
    fn bearer_tokens_are_checked() {
        let token = BearerToken::new("s3cret", &TokenOrigin::Env).unwrap();
        let mut ok = Request::new(());
        ok.metadata_mut()
            .insert("authorization", "Bearer s3cret".parse().unwrap());
        assert!(check_bearer(Some(&token), &ok).is_ok());
        let mut bad = Request::new(());
        bad.metadata_mut()
            .insert("authorization", "Bearer s3cres".parse().unwrap());
        let err = check_bearer(Some(&token), &bad).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(check_bearer(Some(&token), &Request::new(())).is_err());
        assert!(check_bearer(None, &Request::new(())).is_ok());
    }
}
