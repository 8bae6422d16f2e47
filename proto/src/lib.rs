//! sluice's gRPC contracts, generated from `proto/sluice/v1/*.proto`.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Version 1 of the contracts.
pub mod v1 {
    tonic::include_proto!("sluice.v1");
}
