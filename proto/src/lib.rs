//! gRPC definitions of cursorlog (package `cursorlog.v1`): prost messages, the tonic client
//! ([`v1::cursor_log_client::CursorLogClient`]) and server
//! ([`v1::cursor_log_server::CursorLogServer`]) stubs, and the encoded file descriptor set for
//! server reflection.
//!
//! The schema, with every field documented, is `proto/cursorlog/v1/cursorlog.proto`.

/// Package `cursorlog.v1`, generated from `cursorlog.proto`.
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::unwrap_used,
    reason = "generated code"
)]
pub mod v1 {
    tonic::include_proto!("cursorlog.v1");
}

/// The encoded `FileDescriptorSet` of `cursorlog.proto`, for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("cursorlog_descriptor");
