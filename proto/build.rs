//! Compiles `proto/cursorlog/v1/cursorlog.proto` with protox (a pure-Rust protobuf compiler,
//! so no `protoc` is needed) and generates the prost messages and tonic client and server stubs.
//! The encoded descriptor set (with source info, so reflection shows the comments) is written
//! next to the generated code for `tonic-reflection`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/cursorlog/v1/cursorlog.proto";
    println!("cargo:rerun-if-changed={proto}");
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files([proto])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("cursorlog_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        // Replayed payloads are slices of the engine's segment maps: no copy until encoding.
        .bytes(".cursorlog.v1.Event.payload")
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
