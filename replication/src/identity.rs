//! Which cluster a member belongs to, so it never takes Raft traffic from another one.
//!
//! Raft trusts whoever reaches a member's address. A member of another cluster that has this
//! address in its `--peers` (a stale configuration, two clusters on one host with a port
//! reused, two test clusters handed one port, or a cluster re-formed on the same hosts)
//! would otherwise get its votes and entries accepted: its node 1 of term 1 is
//! indistinguishable from this cluster's node 1 of term 1, and the member would mix two
//! clusters' entries in one log.
//!
//! So every member holds a [`ClusterId`], saved in its directory (`CLUSTER`, FORMAT.md), and
//! every Raft request carries it in the [`CLUSTER_HEADER`] header:
//!
//! - The member that forms the cluster (`crate::formation`, or `cluster init`) picks a
//!   random one ([`ClusterId::random`]) and saves it before it initializes: each formation
//!   is a new cluster, even on the same hosts and addresses.
//! - Every other member has none until a peer reaches it: it adopts the first identity
//!   presented, saved before the request is served.
//! - A member with an identity refuses a request with another one with
//!   `FAILED_PRECONDITION` naming both, changes nothing, and logs it once per foreign
//!   identity. A request without one comes from a build before identities: it is admitted,
//!   so a cluster can be upgraded one member at a time.
//! - A saved identity stands: a member of an earlier build, whose identity was derived from
//!   its founders' addresses, keeps it (the other members saved the same value).

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use cursorlog_engine::EntryLog;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// The header every Raft request carries its sender's cluster identity in.
pub const CLUSTER_HEADER: &str = "cursorlog-cluster";

/// A cluster's identity: 64 bits, written as 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterId(u64);

impl ClusterId {
    /// A new identity for a cluster being formed: 64 random bits (the standard library's
    /// per-process random hash keys, mixed with the time and the process id), never 0.
    pub fn random() -> Self {
        use std::hash::{BuildHasher as _, Hasher as _};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        hasher.write_u128(now);
        hasher.write_u32(std::process::id());
        Self(hasher.finish().max(1))
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for ClusterId {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != 16 {
            return Err(format!("{text:?} is not 16 hex digits"));
        }
        u64::from_str_radix(text, 16)
            .map(Self)
            .map_err(|_| format!("{text:?} is not 16 hex digits"))
    }
}

/// Why an identity could not be loaded or kept.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The log's directory could not be read or written.
    #[error("the cluster identity file: {0}")]
    Storage(#[from] cursorlog_engine::Error),
    /// The saved file does not hold an identity.
    #[error("the cluster identity file holds {0}")]
    Malformed(String),
    /// This member already belongs to another cluster.
    #[error(
        "this member belongs to cluster {saved}, not to cluster {wanted} (its --peers changed \
         since it joined?): start it on a new data directory with --join and add it with \
         `cursorlog cluster add-learner`"
    )]
    Other {
        /// The identity saved in the directory.
        saved: ClusterId,
        /// The identity asked for.
        wanted: ClusterId,
    },
}

/// This member's cluster identity: saved, or not yet (a `--join` member). Clones share it.
#[derive(Debug, Clone)]
pub struct ClusterIdentity {
    log: EntryLog,
    current: Arc<Mutex<Option<ClusterId>>>,
    /// Foreign identities already logged (each once, not on every heartbeat).
    warned: Arc<Mutex<HashSet<String>>>,
}

impl ClusterIdentity {
    /// The identity saved in `log`'s directory, if any.
    ///
    /// # Errors
    /// A damaged or malformed file; I/O failures.
    pub fn load(log: EntryLog) -> Result<Self, IdentityError> {
        let current = match log.read_cluster()? {
            None => None,
            Some(bytes) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                Some(text.parse().map_err(IdentityError::Malformed)?)
            }
        };
        Ok(Self {
            log,
            current: Arc::new(Mutex::new(current)),
            warned: Arc::default(),
        })
    }

    /// The identity, if this member has one.
    pub fn current(&self) -> Option<ClusterId> {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `id` this member's identity (saved durably first), or checks that it is.
    ///
    /// # Errors
    /// [`IdentityError::Other`] when the member already belongs to another cluster; I/O.
    pub fn establish(&self, id: ClusterId) -> Result<(), IdentityError> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        match *current {
            Some(saved) if saved == id => Ok(()),
            Some(saved) => Err(IdentityError::Other { saved, wanted: id }),
            None => {
                self.log.save_cluster(id.to_string().as_bytes())?;
                *current = Some(id);
                tracing::info!(cluster = %id, "this member belongs to cluster {id}");
                Ok(())
            }
        }
    }

    /// Admits a Raft request whose headers are `metadata`, or says why not. A member without
    /// an identity adopts the one presented (saved before this returns).
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` for another cluster's request; `INVALID_ARGUMENT` for a
    /// malformed header; `UNAVAILABLE` when the adopted identity cannot be saved.
    pub fn admit(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let presented = match metadata.get(CLUSTER_HEADER) {
            None => None,
            Some(value) => Some(
                value
                    .to_str()
                    .map_err(|_| ())
                    .and_then(|text| text.parse::<ClusterId>().map_err(|_| ()))
                    .map_err(|()| {
                        Status::invalid_argument(format!(
                            "the {CLUSTER_HEADER} header is not 16 hex digits"
                        ))
                    })?,
            ),
        };
        match (self.current(), presented) {
            // Nothing presented: a member of a build before identities (a rolling upgrade).
            (_, None) => Ok(()),
            (Some(mine), Some(theirs)) if mine == theirs => Ok(()),
            (None, Some(theirs)) => match self.establish(theirs) {
                Ok(()) => Ok(()),
                // Another request adopted a different identity first.
                Err(err @ IdentityError::Other { .. }) => {
                    Err(Status::failed_precondition(err.to_string()))
                }
                Err(err) => Err(Status::unavailable(format!(
                    "cannot save the cluster identity {theirs}: {err}"
                ))),
            },
            (Some(mine), Some(theirs)) => {
                let theirs = theirs.to_string();
                let why = format!(
                    "this member belongs to cluster {mine}; the request is of cluster \
                     {theirs}: a member of another cluster has this member's address in its \
                     --peers (fix that member's --peers, or give this member another address)"
                );
                if self
                    .warned
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(theirs.clone())
                {
                    tracing::warn!(cluster = %mine, foreign = %theirs, "refused Raft traffic: {why}");
                }
                Err(Status::failed_precondition(why))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cursorlog_engine::EntryLogConfig;
    use tonic::Code;

    fn open(dir: &std::path::Path) -> EntryLog {
        EntryLog::open(EntryLogConfig {
            dir: dir.to_path_buf(),
            segment_bytes_max: 1 << 20,
        })
        .expect("open the log")
    }

    fn headers(id: Option<ClusterId>) -> MetadataMap {
        let mut map = MetadataMap::new();
        if let Some(id) = id {
            map.insert(CLUSTER_HEADER, id.to_string().parse().expect("ascii"));
        }
        map
    }

    #[test]
    fn each_formation_draws_another_identity_that_reads_back() {
        let a = ClusterId::random();
        let b = ClusterId::random();
        assert_ne!(a, b, "two formations, even on the same hosts");
        assert_eq!(a.to_string().parse::<ClusterId>(), Ok(a));
        assert!("xyz".parse::<ClusterId>().is_err());
    }

    #[test]
    fn a_member_admits_its_own_cluster_and_refuses_another() {
        let dir = tempfile::tempdir().expect("dir");
        let identity = ClusterIdentity::load(open(dir.path())).expect("load");
        let mine = ClusterId(0x1111);
        identity.establish(mine).expect("establish");
        identity
            .admit(&headers(Some(mine)))
            .expect("its own cluster");
        let refused = identity
            .admit(&headers(Some(ClusterId(0x2222))))
            .expect_err("refused");
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert!(refused.message().contains(&mine.to_string()), "{refused:?}");
        assert!(
            refused.message().contains("0000000000002222"),
            "{refused:?}"
        );
        identity
            .admit(&headers(None))
            .expect("a member of an earlier build, during an upgrade");
        let mut bad = MetadataMap::new();
        bad.insert(CLUSTER_HEADER, "not-hex".parse().expect("ascii"));
        assert_eq!(
            identity.admit(&bad).expect_err("malformed").code(),
            Code::InvalidArgument
        );
        assert!(matches!(
            identity.establish(ClusterId(0x2222)),
            Err(IdentityError::Other { .. })
        ));
    }

    #[test]
    fn a_joining_member_adopts_the_first_identity_durably_and_then_refuses_others() {
        let dir = tempfile::tempdir().expect("dir");
        let identity = ClusterIdentity::load(open(dir.path())).expect("load");
        assert_eq!(identity.current(), None);
        identity
            .admit(&headers(None))
            .expect("nothing to check yet");
        let first = ClusterId(0xabcd);
        identity.admit(&headers(Some(first))).expect("adopted");
        assert_eq!(identity.current(), Some(first));
        let refused = identity.admit(&headers(Some(ClusterId(0xef))));
        assert_eq!(
            refused.expect_err("refused").code(),
            Code::FailedPrecondition
        );
        drop(identity);
        let reopened = ClusterIdentity::load(open(dir.path())).expect("reload");
        assert_eq!(
            reopened.current(),
            Some(first),
            "saved before it was admitted"
        );
    }
}
