//! Generates the gRPC code of `sluice/v1/*.proto` (needs `protoc`: Debian's
//! `protobuf-compiler`, which `.ci/run` installs when missing).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(
        &["sluice/v1/control.proto", "sluice/v1/stage.proto"],
        &["."],
    )?;
    Ok(())
}
