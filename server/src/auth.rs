//! The bearer token: where it comes from (file, environment, argv) and how a presented token
//! is checked.
//!
//! Only the token's SHA-256 digest is kept, and a presented token is compared by digest in
//! constant time: neither the time taken nor an early exit reveals its bytes or its length.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// Where the configured token came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOrigin {
    /// `--auth-token-file PATH`.
    File(PathBuf),
    /// The `CURSORLOG_AUTH_TOKEN` environment variable.
    Env,
    /// `--auth-token` on the command line (readable by any local user with `ps`).
    Argv,
}

impl std::fmt::Display for TokenOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "--auth-token-file {}", path.display()),
            Self::Env => f.write_str("CURSORLOG_AUTH_TOKEN"),
            Self::Argv => f.write_str("--auth-token"),
        }
    }
}

/// Why the token could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be read.
    #[error("cannot read --auth-token-file {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The token is empty (after trimming surrounding whitespace).
    #[error("the auth token from {origin} is empty")]
    Empty {
        /// Where it came from.
        origin: TokenOrigin,
    },
    /// The token has a character a client cannot send in an `authorization` header.
    #[error(
        "the auth token from {origin} has a character at byte {at} that is not visible ASCII \
         (only 0x21..=0x7e can travel in an authorization header)"
    )]
    BadCharacter {
        /// Where it came from.
        origin: TokenOrigin,
        /// Byte offset of the first bad character.
        at: usize,
    },
}

/// The configured bearer token (its digest only).
#[derive(Clone)]
pub struct BearerToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl BearerToken {
    /// A token from its text, which must be non-empty visible ASCII.
    ///
    /// # Errors
    /// [`TokenError::Empty`], [`TokenError::BadCharacter`].
    pub fn new(token: &str, origin: &TokenOrigin) -> Result<Self, TokenError> {
        if token.is_empty() {
            return Err(TokenError::Empty {
                origin: origin.clone(),
            });
        }
        if let Some(at) = token.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
            return Err(TokenError::BadCharacter {
                origin: origin.clone(),
                at,
            });
        }
        Ok(Self {
            digest: Sha256::digest(token.as_bytes()).into(),
        })
    }

    /// True when `presented` is the token (constant time in the bytes of both).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        digest.ct_eq(&self.digest).into()
    }

    /// Checks an `authorization` header value (`Bearer <token>`, scheme case-insensitive).
    ///
    /// # Errors
    /// [`AuthFailure::Missing`] without a bearer header, [`AuthFailure::Wrong`] for another
    /// token.
    pub fn check_header(&self, header: Option<&[u8]>) -> Result<(), AuthFailure> {
        let presented = header.and_then(bearer_value).ok_or(AuthFailure::Missing)?;
        if self.matches(presented) {
            Ok(())
        } else {
            Err(AuthFailure::Wrong)
        }
    }
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    /// No `authorization: Bearer <token>` header.
    #[error("authorization: Bearer <token> is required")]
    Missing,
    /// A bearer token that is not the configured one.
    #[error("bearer token is not valid")]
    Wrong,
}

/// The token of an `authorization: Bearer <token>` value.
fn bearer_value(header: &[u8]) -> Option<&[u8]> {
    let header = header.trim_ascii();
    let (scheme, rest) = header.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

/// The configured token, if any: `--auth-token-file`, else `--auth-token` /
/// `CURSORLOG_AUTH_TOKEN` (`on_argv` says which of those two it was).
///
/// # Errors
/// An unreadable file, an empty token or one with characters a header cannot carry.
pub fn load(
    file: Option<&Path>,
    text: Option<&str>,
    on_argv: bool,
) -> Result<Option<(BearerToken, TokenOrigin)>, TokenError> {
    let (token, origin) = match (file, text) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).map_err(|source| TokenError::Unreadable {
                path: path.to_path_buf(),
                source,
            })?;
            (text, TokenOrigin::File(path.to_path_buf()))
        }
        (None, Some(text)) => {
            let origin = if on_argv {
                TokenOrigin::Argv
            } else {
                TokenOrigin::Env
            };
            (text.to_owned(), origin)
        }
        (None, None) => return Ok(None),
    };
    let token = BearerToken::new(token.trim(), &origin)?;
    Ok(Some((token, origin)))
}

/// True when a token file can be read by users other than its owner (mode `o+r` or `g+r`).
pub fn readable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o044 != 0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn token(text: &str) -> BearerToken {
        BearerToken::new(text, &TokenOrigin::Env).unwrap()
    }

    #[test]
    fn only_the_exact_token_matches() {
        let t = token("s3cret");
        assert!(t.matches(b"s3cret"));
        for other in [&b"s3cres"[..], b"s3cret ", b"s3cre", b"", b"s3crets3cret"] {
            assert!(!t.matches(other), "{other:?}");
        }
    }

    #[test]
    fn headers_need_the_bearer_scheme() {
        let t = token("s3cret");
        assert_eq!(t.check_header(Some(b"Bearer s3cret")), Ok(()));
        assert_eq!(t.check_header(Some(b"bearer  s3cret ")), Ok(()));
        assert_eq!(
            t.check_header(Some(b"Bearer nope")),
            Err(AuthFailure::Wrong)
        );
        assert_eq!(t.check_header(Some(b"s3cret")), Err(AuthFailure::Missing));
        assert_eq!(
            t.check_header(Some(b"Basic s3cret")),
            Err(AuthFailure::Missing)
        );
        assert_eq!(t.check_header(None), Err(AuthFailure::Missing));
    }

    #[test]
    fn the_debug_form_hides_the_token() {
        assert!(!format!("{:?}", token("s3cret")).contains("s3cret"));
    }

    #[test]
    fn tokens_load_from_a_file_the_environment_or_argv() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  from-file\n").unwrap();
        let (t, origin) = load(Some(&path), None, false).unwrap().unwrap();
        assert!(t.matches(b"from-file"));
        assert_eq!(origin, TokenOrigin::File(path.clone()));

        let (t, origin) = load(None, Some("env-token"), false).unwrap().unwrap();
        assert!(t.matches(b"env-token"));
        assert_eq!(origin, TokenOrigin::Env);
        let (_, origin) = load(None, Some("argv-token"), true).unwrap().unwrap();
        assert_eq!(origin, TokenOrigin::Argv);
        assert!(load(None, None, false).unwrap().is_none());

        let missing = dir.path().join("missing");
        let err = load(Some(&missing), None, false).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            load(Some(&path), None, false),
            Err(TokenError::Empty { .. })
        ));
        assert!(matches!(
            load(None, Some("two words"), false),
            Err(TokenError::BadCharacter { at: 3, .. })
        ));
    }

    #[test]
    fn group_or_world_readable_token_files_are_noticed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "t").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(!readable_by_others(&path));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(readable_by_others(&path));
    }
}
