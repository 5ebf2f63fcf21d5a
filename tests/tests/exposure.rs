//! Safe to expose: where the token comes from, what a non-loopback listener needs, and the
//! metrics endpoint's binding and token — through the real binary.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use cursorlog_tests::{client_with_token, http_get, metric, pb, run_tool_env, Server, Start};
use tonic::Code;

fn tls_args(fixtures: &Path) -> [String; 4] {
    [
        "--tls-cert".into(),
        fixtures.join("server.pem").display().to_string(),
        "--tls-key".into(),
        fixtures.join("server.key").display().to_string(),
    ]
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls")
}

fn token_file(dir: &Path, token: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

async fn open_session_code<T>(client: &mut pb::cursor_log_client::CursorLogClient<T>) -> Code
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    match client
        .open_session(pb::OpenSessionRequest {
            session: "s".into(),
            state: None,
        })
        .await
    {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_comes_from_a_file_or_the_environment_and_argv_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let file = token_file(dir.path(), "from-file");
    let server = Server::start(&["--auth-token-file", &file]);
    let channel = server.channel().await;
    assert_eq!(
        open_session_code(&mut client_with_token(channel.clone(), "from-file")).await,
        Code::Ok
    );
    for wrong in ["from-fil", "from-file2", "x"] {
        assert_eq!(
            open_session_code(&mut client_with_token(channel.clone(), wrong)).await,
            Code::Unauthenticated,
            "{wrong}"
        );
    }
    let mut anonymous = pb::cursor_log_client::CursorLogClient::new(channel);
    assert_eq!(
        open_session_code(&mut anonymous).await,
        Code::Unauthenticated
    );
    assert!(server.wait_for_log("token_from=\"--auth-token-file"));
    assert!(!server.logs().contains("command line"), "{}", server.logs());

    let server = Server::start_with(Start {
        env: &[("CURSORLOG_AUTH_TOKEN", "from-env")],
        ..Start::default()
    });
    let channel = server.channel().await;
    assert_eq!(
        open_session_code(&mut client_with_token(channel.clone(), "from-env")).await,
        Code::Ok
    );
    assert!(server.wait_for_log("token_from=\"CURSORLOG_AUTH_TOKEN\""));
    assert!(!server.logs().contains("command line"), "{}", server.logs());

    let server = Server::start(&["--auth-token", "from-argv"]);
    assert!(server.wait_for_log("on the command line, where any local user can read it"));
    let channel = server.channel().await;
    assert_eq!(
        open_session_code(&mut client_with_token(channel, "from-argv")).await,
        Code::Ok
    );
}

#[test]
fn bad_token_sources_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let missing = dir.path().join("no-such-token");
    let (status, _, stderr) = run_tool_env(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
            "--auth-token-file",
            missing.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!status.success());
    assert!(stderr.contains("no-such-token"), "{stderr}");
    let empty = token_file(dir.path(), "  ");
    let (status, _, stderr) = run_tool_env(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
            "--auth-token-file",
            &empty,
        ],
        &[],
    );
    assert!(!status.success());
    assert!(stderr.contains("is empty"), "{stderr}");
    let (status, _, stderr) = run_tool_env(
        &["serve", "--listen", "127.0.0.1:0", "--data-dir", data],
        &[("CURSORLOG_AUTH_TOKEN", "has space")],
    );
    assert!(!status.success());
    assert!(stderr.contains("CURSORLOG_AUTH_TOKEN"), "{stderr}");
}

#[test]
fn a_token_on_a_non_loopback_listener_needs_tls_or_an_explicit_flag() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let file = token_file(dir.path(), "t0ken");
    let (status, _, stderr) = run_tool_env(
        &[
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
            data,
            "--auth-token-file",
            &file,
        ],
        &[],
    );
    assert!(!status.success());
    assert!(
        stderr.contains("in clear") && stderr.contains("--allow-insecure-plaintext-token"),
        "{stderr}"
    );
    // Without any token it is the older refusal.
    let (status, _, stderr) =
        run_tool_env(&["serve", "--listen", "0.0.0.0:0", "--data-dir", data], &[]);
    assert!(!status.success());
    assert!(stderr.contains("without an auth token"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_listener_serves_with_tls_or_loudly_without() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    let dir = tempfile::tempdir().unwrap();
    let file = token_file(dir.path(), "t0ken");

    // TLS and a token: no warning.
    let tls = tls_args(&fixtures());
    let mut args: Vec<&str> = tls.iter().map(String::as_str).collect();
    args.extend(["--auth-token-file", &file]);
    let server = Server::start_with(Start {
        listen: Some("0.0.0.0:0"),
        args: &args,
        ..Start::default()
    });
    assert!(server.wait_for_log("listening on"));
    assert!(!server.logs().contains("INSECURE"), "{}", server.logs());
    let ca = Certificate::from_pem(std::fs::read(fixtures().join("ca.pem")).unwrap());
    let channel = Channel::from_shared(format!("https://localhost:{}", server.addr.port()))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(ca)
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    assert_eq!(
        open_session_code(&mut client_with_token(channel, "t0ken")).await,
        Code::Ok
    );

    // The explicit override: it starts and says so at every start.
    for _ in 0..2 {
        let server = Server::start_with(Start {
            listen: Some("0.0.0.0:0"),
            args: &[
                "--auth-token-file",
                &file,
                "--allow-insecure-plaintext-token",
            ],
            ..Start::default()
        });
        assert!(server.wait_for_log("INSECURE: --allow-insecure-plaintext-token"));
        assert_eq!(
            open_session_code(&mut client_with_token(server.channel().await, "t0ken")).await,
            Code::Ok
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_bind_loopback_by_default_and_ask_for_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = token_file(dir.path(), "m3trics");
    // A bare port means loopback.
    let server = Server::start(&["--metrics-listen", "0", "--auth-token-file", &file]);
    let addr = server.metrics_addr.unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
    let page = tokio::task::spawn_blocking(move || {
        (
            http_get(addr, &[]),
            http_get(addr, &["authorization: Bearer wrong"]),
            http_get(addr, &["Authorization: Bearer m3trics"]),
        )
    })
    .await
    .unwrap();
    assert!(page.0.starts_with("HTTP/1.1 401"), "{}", page.0);
    assert!(page.0.contains("www-authenticate: Bearer"), "{}", page.0);
    assert!(!page.0.contains("cursorlog_"), "{}", page.0);
    assert!(page.1.starts_with("HTTP/1.1 401"), "{}", page.1);
    assert!(page.2.starts_with("HTTP/1.1 200"), "{}", page.2);
    assert_eq!(metric(&page.2, "cursorlog_poisoned"), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_loopback_metrics_need_auth_or_an_explicit_flag() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let (status, _, stderr) = run_tool_env(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
            "--metrics-listen",
            "0.0.0.0:0",
        ],
        &[],
    );
    assert!(!status.success());
    assert!(
        stderr.contains("--allow-unauthenticated-metrics"),
        "{stderr}"
    );
    // With a token, metrics are plain HTTP: the token would cross the network in clear.
    let (status, _, stderr) = run_tool_env(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
            "--metrics-listen",
            "0.0.0.0:0",
        ],
        &[("CURSORLOG_AUTH_TOKEN", "t")],
    );
    assert!(!status.success());
    assert!(stderr.contains("in clear"), "{stderr}");

    // Explicitly open metrics: served without the token, even with auth on for gRPC.
    let server = Server::start_with(Start {
        args: &[
            "--metrics-listen",
            "0.0.0.0:0",
            "--allow-unauthenticated-metrics",
        ],
        env: &[("CURSORLOG_AUTH_TOKEN", "t")],
        ..Start::default()
    });
    assert!(server.wait_for_log("--allow-unauthenticated-metrics: anyone"));
    let mut addr = server.metrics_addr.unwrap();
    assert!(addr.ip().is_unspecified());
    addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    let page = tokio::task::spawn_blocking(move || http_get(addr, &[]))
        .await
        .unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
}
