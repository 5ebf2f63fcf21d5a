//! gRPC definitions of cursorlog (package `cursorlog.v1`): prost messages, the tonic client
//! ([`v1::cursor_log_client::CursorLogClient`], [`v1::tasks_client::TasksClient`]) and server
//! ([`v1::cursor_log_server::CursorLogServer`], [`v1::tasks_server::TasksServer`]) stubs, and
//! the encoded file descriptor set for server reflection.
//!
//! The schema, with every field documented, is `proto/cursorlog/v1/cursorlog.proto` (the
//! event log) and `proto/cursorlog/v1/tasks.proto` (durable MCP tasks).

/// Package `cursorlog.v1`, generated from `cursorlog.proto` and `tasks.proto`.
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::unwrap_used,
    reason = "generated code"
)]
pub mod v1 {
    // Messages and client (tonic's prost codec).
    tonic::include_proto!("cursorlog.v1");
    // The server stub, generated in a second pass with `crate::codec::ServerCodec`.
    include!(concat!(env!("OUT_DIR"), "/server/cursorlog.v1.rs"));
}

/// Package `cursorlog.raft.v1`, generated from `raft.proto`: the internal Raft transport
/// between the nodes of a cluster (`cursorlog-replication` encodes the payloads).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::unwrap_used,
    reason = "generated code"
)]
pub mod raft_v1 {
    tonic::include_proto!("cursorlog.raft.v1");
}

/// The encoded `FileDescriptorSet` of `cursorlog.proto` and `tasks.proto`, for
/// `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("cursorlog_descriptor");

/// The server's codec: tonic's prost codec, except that a request message that does not
/// decode is INVALID_ARGUMENT (the client sent bytes that are not a valid message, e.g. a
/// string field that is not UTF-8), not INTERNAL, which the API reserves for server bugs.
///
/// It sits in the generated server stub (`codec_path`), so it covers unary and streaming
/// requests alike. Responses are encoded exactly as tonic's prost codec does.
pub mod codec {
    use std::marker::PhantomData;

    use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
    use tonic::Status;
    use tonic_prost::ProstEncoder;

    /// A [`Codec`] that encodes `T` with prost and decodes `U`, mapping decode errors to
    /// INVALID_ARGUMENT.
    #[derive(Debug, Clone)]
    pub struct ServerCodec<T, U> {
        _types: PhantomData<(T, U)>,
    }

    impl<T, U> Default for ServerCodec<T, U> {
        fn default() -> Self {
            Self {
                _types: PhantomData,
            }
        }
    }

    impl<T, U> Codec for ServerCodec<T, U>
    where
        T: prost::Message + Send + 'static,
        U: prost::Message + Default + Send + 'static,
    {
        type Encode = T;
        type Decode = U;
        type Encoder = ProstEncoder<T>;
        type Decoder = RequestDecoder<U>;

        fn encoder(&mut self) -> Self::Encoder {
            ProstEncoder::new(BufferSettings::default())
        }

        fn decoder(&mut self) -> Self::Decoder {
            RequestDecoder { _type: PhantomData }
        }
    }

    /// Decodes one request message of type `U`.
    #[derive(Debug, Clone)]
    pub struct RequestDecoder<U> {
        _type: PhantomData<U>,
    }

    impl<U: prost::Message + Default> Decoder for RequestDecoder<U> {
        type Item = U;
        type Error = Status;

        fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
            U::decode(buf)
                .map(Some)
                .map_err(|err| invalid_request(&err))
        }

        fn buffer_settings(&self) -> BufferSettings {
            BufferSettings::default()
        }
    }

    /// The status for a request that does not decode. prost's message names the message
    /// and field at fault (e.g. `AppendRequest.session: invalid string value: data is not
    /// UTF-8 encoded`).
    pub fn invalid_request(err: &prost::DecodeError) -> Status {
        Status::invalid_argument(format!("the request message does not decode: {err}"))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use prost::Message as _;

        #[test]
        fn a_non_utf8_string_field_is_invalid_argument_naming_the_field() {
            // Field 1 (`session`), length-delimited, two bytes that are not UTF-8.
            let bytes = [0x0a_u8, 0x02, 0xff, 0xfe];
            let Err(err) = crate::v1::AppendRequest::decode(&bytes[..]) else {
                panic!("non-UTF-8 must not decode");
            };
            let status = invalid_request(&err);
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(
                status.message().contains("AppendRequest.session"),
                "{}",
                status.message()
            );
        }
    }
}
