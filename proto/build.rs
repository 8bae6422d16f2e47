//! Generates the gRPC code of `sluice/v1/*.proto` with the `protoc` that the
//! `protoc-bin-vendored` crate ships, so a build needs nothing installed by hand.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(
        config,
        &["sluice/v1/control.proto", "sluice/v1/stage.proto"],
        &["."],
    )?;
    Ok(())
}
