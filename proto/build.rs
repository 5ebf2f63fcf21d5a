//! Compiles `proto/cursorlog/v1/cursorlog.proto` and `tasks.proto` (both package
//! `cursorlog.v1`, so one generated module holds both services) with protox (a pure-Rust protobuf compiler,
//! so no `protoc` is needed) and generates the prost messages and tonic client and server stubs.
//! The encoded descriptor set (with source info, so reflection shows the comments) is written
//! next to the generated code for `tonic-reflection`.
//!
//! Two passes: the messages and the client use tonic's prost codec; the server stub is
//! generated on its own (its message types refer to the first pass's) with
//! `codec::ServerCodec` (in `src/lib.rs`), which answers a request that does not decode with
//! INVALID_ARGUMENT rather than tonic's INTERNAL (the client keeps INTERNAL for a response
//! that does not decode: that one is the server's fault).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/cursorlog/v1/cursorlog.proto",
        "proto/cursorlog/v1/tasks.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(protos)?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("cursorlog_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        // Replayed payloads are slices of the engine's segment maps: no copy until encoding.
        .bytes(".cursorlog.v1.Event.payload")
        .build_client(true)
        .build_server(false)
        .compile_fds(compiler.file_descriptor_set())?;
    let server_dir = out_dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::configure()
        // Every message is the first pass's: this pass emits only `cursor_log_server` and
        // `tasks_server`.
        .extern_path(".cursorlog.v1", "crate::v1")
        .codec_path("crate::codec::ServerCodec")
        .build_client(false)
        .build_server(true)
        .out_dir(&server_dir)
        .compile_fds(compiler.file_descriptor_set())?;
    compile_raft(&out_dir)?;
    Ok(())
}

/// The internal Raft transport, `proto/cursorlog/raft/v1/raft.proto` (package
/// `cursorlog.raft.v1`), in one pass with its own compiler: client and server with tonic's
/// prost codec (peers are our own nodes, so the INVALID_ARGUMENT mapping above is not needed),
/// and no descriptor set (it is not offered through reflection).
fn compile_raft(out_dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/cursorlog/raft/v1/raft.proto";
    println!("cargo:rerun-if-changed={proto}");
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).open_files([proto])?;
    tonic_prost_build::configure()
        // The encoded payloads are decoded straight from the received buffer (no copy).
        .bytes(".cursorlog.raft.v1")
        .build_client(true)
        .build_server(true)
        .out_dir(out_dir)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
