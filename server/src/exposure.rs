//! What `serve` refuses before it opens anything, so a token never crosses a network in clear
//! and nothing is reachable from the network without a token, unless an operator says so
//! with a flag (logged at every start).
//!
//! | listener | needs |
//! |---|---|
//! | gRPC, loopback | nothing |
//! | gRPC, non-loopback | a token (or `--allow-insecure-non-loopback`), and with a token TLS (or `--allow-insecure-plaintext-token`) |
//! | metrics, loopback | nothing (the token when auth is configured) |
//! | metrics, non-loopback | `--allow-unauthenticated-metrics`, or a token and `--allow-insecure-plaintext-token` (metrics are plain HTTP) |

use std::net::SocketAddr;

use crate::auth::{self, BearerToken, TokenError, TokenOrigin};
use crate::ServeArgs;

/// A configuration `serve` refuses to start with.
#[derive(Debug, thiserror::Error)]
pub enum ExposureError {
    /// The token could not be configured.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// A non-loopback gRPC listener with nothing to keep strangers out.
    #[error(
        "refusing to listen on non-loopback address {listen} without an auth token: set \
         --auth-token-file (or CURSORLOG_AUTH_TOKEN) and TLS, or pass \
         --allow-insecure-non-loopback"
    )]
    NonLoopbackWithoutToken {
        /// The gRPC address.
        listen: SocketAddr,
    },
    /// A token on a non-loopback gRPC listener without TLS: it would cross the network in
    /// clear.
    #[error(
        "refusing to accept a bearer token on non-loopback address {listen} without TLS: the \
         token would cross the network in clear. Set --tls-cert and --tls-key, listen on \
         loopback, or pass --allow-insecure-plaintext-token"
    )]
    PlaintextToken {
        /// The gRPC address.
        listen: SocketAddr,
    },
    /// A non-loopback metrics listener with no token and no explicit permission.
    #[error(
        "refusing to serve metrics on non-loopback address {metrics} without auth: configure \
         a token (scrapes then need it) or pass --allow-unauthenticated-metrics; a bare \
         --metrics-listen PORT binds 127.0.0.1"
    )]
    MetricsWithoutToken {
        /// The metrics address.
        metrics: SocketAddr,
    },
    /// A non-loopback metrics listener that would take the token over plain HTTP.
    #[error(
        "refusing to take the bearer token on non-loopback metrics address {metrics}: metrics \
         are plain HTTP, so the token would cross the network in clear. Bind metrics to \
         loopback, pass --allow-unauthenticated-metrics (metrics hold counters only), or \
         --allow-insecure-plaintext-token"
    )]
    MetricsPlaintextToken {
        /// The metrics address.
        metrics: SocketAddr,
    },
}

/// The checked exposure settings.
#[derive(Debug)]
pub struct Exposure {
    /// The bearer token cursorlog RPCs need, if auth is configured.
    pub token: Option<BearerToken>,
    /// The token the metrics page needs (`None`: open).
    pub metrics_token: Option<BearerToken>,
    /// Where the token came from.
    pub origin: Option<TokenOrigin>,
    /// Warnings to log at every start (insecure overrides, a token in argv, ...).
    pub warnings: Vec<String>,
}

/// Loads the token and checks the listeners against the rules in the module docs.
///
/// # Errors
/// Any [`ExposureError`].
pub fn check(args: &ServeArgs) -> Result<Exposure, ExposureError> {
    let loaded = auth::load(
        args.auth_token_file.as_deref(),
        args.auth_token.as_deref(),
        args.auth_token_on_argv,
    )?;
    let (token, origin) = match loaded {
        Some((token, origin)) => (Some(token), Some(origin)),
        None => (None, None),
    };
    let mut warnings = Vec::new();
    let tls = args.tls_cert.is_some();
    let listen = args.listen;
    if !listen.ip().is_loopback() {
        if token.is_none() {
            if !args.allow_insecure_non_loopback {
                return Err(ExposureError::NonLoopbackWithoutToken { listen });
            }
            warnings.push(format!(
                "INSECURE: --allow-insecure-non-loopback: anyone who can reach {listen} can \
                 read and write every session"
            ));
        } else if !tls {
            if !args.allow_insecure_plaintext_token {
                return Err(ExposureError::PlaintextToken { listen });
            }
            warnings.push(format!(
                "INSECURE: --allow-insecure-plaintext-token: the bearer token crosses the \
                 network to {listen} in clear; anyone on the path can read it and use it"
            ));
        }
    }
    let mut metrics_token = token.clone();
    if let Some(metrics) = args.metrics_listen {
        if args.allow_unauthenticated_metrics {
            metrics_token = None;
            if !metrics.ip().is_loopback() {
                warnings.push(format!(
                    "--allow-unauthenticated-metrics: anyone who can reach {metrics} can read \
                     the metrics page (counters only)"
                ));
            }
        } else if !metrics.ip().is_loopback() {
            if token.is_none() {
                return Err(ExposureError::MetricsWithoutToken { metrics });
            }
            if !args.allow_insecure_plaintext_token {
                return Err(ExposureError::MetricsPlaintextToken { metrics });
            }
            warnings.push(format!(
                "INSECURE: --allow-insecure-plaintext-token: metrics scrapes send the bearer \
                 token to {metrics} over plain HTTP"
            ));
        }
    }
    match &origin {
        Some(TokenOrigin::Argv) => warnings.push(
            "the auth token was given with --auth-token on the command line, where any local \
             user can read it (ps, /proc); use --auth-token-file or CURSORLOG_AUTH_TOKEN"
                .to_owned(),
        ),
        Some(TokenOrigin::File(path)) if auth::readable_by_others(path) => warnings.push(format!(
            "the auth token file {} is readable by other users; chmod 600 it",
            path.display()
        )),
        _ => {}
    }
    Ok(Exposure {
        token,
        metrics_token,
        origin,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> ServeArgs {
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let mut argv = vec!["cursorlog"];
        argv.extend_from_slice(extra);
        let mut serve = Wrap::try_parse_from(argv).unwrap().serve;
        serve.auth_token_on_argv = serve.auth_token.is_some();
        serve
    }

    const TLS: [&str; 4] = ["--tls-cert", "c.pem", "--tls-key", "k.pem"];

    #[test]
    fn loopback_needs_nothing() {
        let e = check(&args(&[])).unwrap();
        assert!(e.token.is_none() && e.warnings.is_empty());
        let e = check(&args(&["--listen", "[::1]:1"])).unwrap();
        assert!(e.warnings.is_empty());
    }

    #[test]
    fn non_loopback_needs_a_token_or_an_override() {
        let err = check(&args(&["--listen", "0.0.0.0:1"])).unwrap_err();
        assert!(matches!(err, ExposureError::NonLoopbackWithoutToken { .. }));
        assert!(err.to_string().contains("--auth-token-file"), "{err}");
        let e = check(&args(&[
            "--listen",
            "0.0.0.0:1",
            "--allow-insecure-non-loopback",
        ]))
        .unwrap();
        assert!(e.warnings[0].starts_with("INSECURE"), "{:?}", e.warnings);
    }

    #[test]
    fn a_token_off_loopback_needs_tls_or_the_plaintext_flag() {
        let err = check(&args(&["--listen", "0.0.0.0:1", "--auth-token", "t"])).unwrap_err();
        assert!(matches!(err, ExposureError::PlaintextToken { .. }), "{err}");
        let mut with_tls = vec!["--listen", "0.0.0.0:1", "--auth-token", "t"];
        with_tls.extend(TLS);
        let e = check(&args(&with_tls)).unwrap();
        assert!(e.token.is_some());
        assert!(e.warnings.iter().all(|w| !w.starts_with("INSECURE")));
        let e = check(&args(&[
            "--listen",
            "0.0.0.0:1",
            "--auth-token",
            "t",
            "--allow-insecure-plaintext-token",
        ]))
        .unwrap();
        assert!(
            e.warnings.iter().any(|w| w.contains("in clear")),
            "{:?}",
            e.warnings
        );
    }

    #[test]
    fn a_token_on_argv_is_warned_about() {
        let e = check(&args(&["--auth-token", "t"])).unwrap();
        assert_eq!(e.origin, Some(TokenOrigin::Argv));
        assert!(
            e.warnings.iter().any(|w| w.contains("ps")),
            "{:?}",
            e.warnings
        );
        let mut from_env = args(&["--auth-token", "t"]);
        from_env.auth_token_on_argv = false;
        let e = check(&from_env).unwrap();
        assert_eq!(e.origin, Some(TokenOrigin::Env));
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
    }

    #[test]
    fn metrics_off_loopback_need_a_token_over_tls_rules_or_an_explicit_flag() {
        let e = check(&args(&["--metrics-listen", "9464"])).unwrap();
        assert!(e.metrics_token.is_none());
        let err = check(&args(&["--metrics-listen", "0.0.0.0:9464"])).unwrap_err();
        assert!(
            matches!(err, ExposureError::MetricsWithoutToken { .. }),
            "{err}"
        );
        let e = check(&args(&[
            "--metrics-listen",
            "0.0.0.0:9464",
            "--allow-unauthenticated-metrics",
        ]))
        .unwrap();
        assert!(e.metrics_token.is_none() && !e.warnings.is_empty());
        let err = check(&args(&[
            "--metrics-listen",
            "0.0.0.0:9464",
            "--auth-token",
            "t",
        ]))
        .unwrap_err();
        assert!(
            matches!(err, ExposureError::MetricsPlaintextToken { .. }),
            "{err}"
        );
        let e = check(&args(&[
            "--metrics-listen",
            "0.0.0.0:9464",
            "--auth-token",
            "t",
            "--allow-insecure-plaintext-token",
        ]))
        .unwrap();
        assert!(e.metrics_token.is_some());
        // On loopback the metrics page asks for the same token.
        let e = check(&args(&["--metrics-listen", "9464", "--auth-token", "t"])).unwrap();
        assert!(e.metrics_token.unwrap().matches(b"t"));
    }
}
