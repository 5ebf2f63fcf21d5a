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
//! - [`log_store`]: openraft's log storage over the engine's segment log (the segment log is
//!   the Raft log), passing openraft's storage `Suite` (`tests/storage_suite.rs`).
//!
//! The state machine (apply after commit) comes next; until then the transport tests run
//! over an in-memory store in `tests/support/`, which is a test fixture only.
//!
//! openraft is pinned exactly (`=0.10.0-alpha.37`, see Cargo.toml): its 0.10 API still
//! changes between alphas.

pub mod admin;
pub mod amnesia;
pub mod append_limit;
pub mod append_pipeline;
mod client_options;
pub mod codec;
pub mod formation;
pub mod identity;
pub mod log_store;
mod log_sync;
pub mod network;
pub mod node;
pub mod recovery;
pub mod service;
pub mod snapshot;
mod space;
pub mod state_machine;
pub mod transfer;
pub mod types;

pub use admin::AdminService;
pub use amnesia::VoteGuard;
pub use identity::{ClusterId, ClusterIdentity, IdentityError, CLUSTER_HEADER};
pub use log_store::SegmentLogStore;
pub use network::{ClientOptions, NetworkClient, NetworkFactory, OptionsError};
pub use node::{NodeOptions, NodeStatus, RaftProposer, ReplicatedNode, StartError};
pub use service::{InMemorySnapshots, RaftService, SnapshotSink};
pub use snapshot::{SegmentSnapshot, SnapshotPolicy, SnapshotSpool};
pub use state_machine::EngineStateMachine;
pub use types::{
    ApplyResult, ClusterTiming, Entry, LogId, NodeId, Proposal, Raft, RaftNode, TypeConfig, Vote,
};

/// The openraft version this crate is built and tested against (the Cargo.toml pin).
pub const OPENRAFT_VERSION: &str = "0.10.0-alpha.37";
