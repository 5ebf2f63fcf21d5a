//! cursorlog's openraft glue: everything that knows about openraft lives in this crate (issue
//! 19: "all Raft glue in one module", so an openraft bump touches one place).
//!
//! Today it holds the transport half:
//! - [`types`]: the [`TypeConfig`] (node id `u64`, node = gRPC address, log id =
//!   `(term, index)`, entries carrying an opaque [`Proposal`]) and the cluster's
//!   [`ClusterTiming`];
//! - [`network`]: openraft's network over the `cursorlog.raft.v1.Raft` gRPC service
//!   (deadlines, error mapping, bearer token, TLS);
//! - [`service`]: the tonic service that hands peers' requests to the local
//!   [`openraft::Raft`];
//! - [`codec`]: the one wire encoding of openraft's messages (postcard).
//!
//! The log store (the engine's segment log as the Raft log) and the state machine (apply
//! after commit) come next; until then the tests run over an in-memory store in
//! `tests/support/`, which is a test fixture only.
//!
//! openraft is pinned exactly (`=0.10.0-alpha.37`, see Cargo.toml): its 0.10 API still
//! changes between alphas.

pub mod codec;
pub mod network;
pub mod service;
pub mod types;

pub use network::{ClientOptions, NetworkClient, NetworkFactory, OptionsError};
pub use service::{InMemorySnapshots, RaftService, SnapshotSink};
pub use types::{
    ApplyResult, ClusterTiming, Entry, LogId, NodeId, Proposal, Raft, RaftNode, TypeConfig, Vote,
};

/// The openraft version this crate is built and tested against (the Cargo.toml pin).
pub const OPENRAFT_VERSION: &str = "0.10.0-alpha.37";
