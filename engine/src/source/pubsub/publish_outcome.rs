//! What a failed publish says about its message: surely not stored (a refusal), or unknown.
//!
//! # Guarantee
//!
//! [`publish_refused`] is true only for errors after which Pub/Sub cannot hold the message:
//! Pub/Sub answered with a status that refuses the request (the topic is missing, the request
//! is invalid, the caller may not publish, the topic cannot take it now), or the client never
//! sent it (credentials, a request it could not build, an ordering key paused). Every other
//! error (a deadline, a connection lost after sending, a status such as `UNAVAILABLE` or
//! `CANCELLED`, the publisher shut down) leaves the outcome unknown: the message may be stored.
//!
//! # What it does not cover
//!
//! Nothing here finds out what an unknown outcome was: a caller that must not miss a stored
//! message treats it as stored (the watermark's probes), and one that must not lose a message
//! publishes it again (the dead-letter topic, whose consumers drop copies by id).

use google_cloud_pubsub::error::PublishError;

/// Whether `error` means the message was surely not stored (see the module docs).
pub fn publish_refused(error: &PublishError) -> bool {
    use google_cloud_gax::error::rpc::Code;
    match error {
        PublishError::Rpc(error) => {
            error.is_authentication()
                || error.is_binding()
                || error.is_serialization()
                || error.status().is_some_and(|s| {
                    matches!(
                        s.code,
                        Code::NotFound
                            | Code::InvalidArgument
                            | Code::PermissionDenied
                            | Code::Unauthenticated
                            | Code::FailedPrecondition
                    )
                })
        }
        PublishError::OrderingKeyPaused => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_gax::error::Error;
    use google_cloud_gax::error::rpc::{Code, Status};
    use std::sync::Arc;

    fn status(code: Code) -> PublishError {
        PublishError::Rpc(Arc::new(Error::service(
            Status::default().set_code(code).set_message("test"),
        )))
    }

    #[test]
    fn only_refusals_and_requests_never_sent_are_refused() {
        for code in [
            Code::NotFound,
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::FailedPrecondition,
        ] {
            assert!(publish_refused(&status(code)), "{code:?}");
        }
        assert!(publish_refused(&PublishError::OrderingKeyPaused));
        // The request may have reached Pub/Sub and been stored.
        for code in [
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::Cancelled,
            Code::Unknown,
            Code::Internal,
            Code::Aborted,
            Code::ResourceExhausted,
        ] {
            assert!(!publish_refused(&status(code)), "{code:?}");
        }
        assert!(!publish_refused(&PublishError::Shutdown));
    }
}
