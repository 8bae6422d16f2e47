//! How letters reach the topic: the seam between the publisher's rounds and Pub/Sub
//! ([`LetterSender`], the client's [`Publisher`] in a worker), and what a failed publish means
//! for a letter ([`Failure`]).
//!
//! # Guarantees
//!
//! * Only an INVALID_ARGUMENT answer is [`Failure::Invalid`], the one answer that can make a
//!   letter refused for good. A missing topic, a refused permission or credential is
//!   [`Failure::NotTaken`]; no answer, an unavailable or overloaded service, a timeout, a
//!   publisher shut down are [`Failure::Unknown`]. Both are retried, never refused.
//!
//! # What it does not cover
//!
//! * Pub/Sub answers a request, not a message: a request holding one message it refuses fails
//!   with INVALID_ARGUMENT for every message in it (measured on the emulator, with a topic
//!   schema). The round tells them apart by sending each such letter again alone.

use google_cloud_gax::error::rpc::Code;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::error::PublishError;
use google_cloud_pubsub::model::Message;

/// Where letters are sent.
pub(super) trait LetterSender: Send + Sync {
    /// Sends `messages` (in as many requests as the sender makes of them) and waits for every
    /// answer; one per message, in order.
    async fn send(&self, messages: Vec<Message>) -> Vec<Result<(), Failure>>;
}

/// Why a publish did not go through, by what it means for the letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// Pub/Sub answered INVALID_ARGUMENT: its request held a message it will never take. Every
    /// message of that request gets this answer, so a letter is refused for good only when it
    /// was sent alone.
    Invalid(String),
    /// Pub/Sub answered that it took nothing, for a reason of the topic's or the client's (a
    /// missing topic, no permission): retried, and taking the letter again is no republish.
    NotTaken(String),
    /// The outcome is unknown (no answer, unavailable, a timeout): retried, and the letter may
    /// have been published.
    Unknown(String),
}

impl Failure {
    /// What Pub/Sub or the client said.
    pub(super) fn text(&self) -> &str {
        match self {
            Failure::Invalid(text) | Failure::NotTaken(text) | Failure::Unknown(text) => text,
        }
    }
}

impl LetterSender for Publisher {
    async fn send(&self, messages: Vec<Message>) -> Vec<Result<(), Failure>> {
        // Issued together, then awaited: the client batches them into few requests.
        let pending: Vec<_> = messages.into_iter().map(|m| self.publish(m)).collect();
        futures::future::join_all(pending)
            .await
            .into_iter()
            .map(|result| result.map(|_| ()).map_err(|error| failure(&error)))
            .collect()
    }
}

/// What a publish error means for the letter (see [`Failure`]).
pub(super) fn failure(error: &PublishError) -> Failure {
    match error {
        PublishError::Rpc(rpc) => match rpc.status() {
            Some(status) => {
                let text = format!("{:?}: {}", status.code, status.message);
                match status.code {
                    Code::InvalidArgument => Failure::Invalid(text),
                    Code::NotFound
                    | Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::FailedPrecondition => Failure::NotTaken(text),
                    _ => Failure::Unknown(text),
                }
            }
            None => Failure::Unknown(error.to_string()),
        },
        PublishError::OrderingKeyPaused => Failure::NotTaken(error.to_string()),
        _ => Failure::Unknown(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_gax::error::Error;
    use google_cloud_gax::error::rpc::Status;
    use std::sync::Arc;

    fn answered(code: Code) -> PublishError {
        PublishError::Rpc(Arc::new(Error::service(
            Status::default().set_code(code).set_message("said"),
        )))
    }

    #[test]
    fn only_invalid_argument_can_refuse_a_letter() {
        assert_eq!(
            failure(&answered(Code::InvalidArgument)),
            Failure::Invalid("InvalidArgument: said".into())
        );
        for code in [
            Code::NotFound,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::FailedPrecondition,
        ] {
            assert!(matches!(failure(&answered(code)), Failure::NotTaken(_)));
        }
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Internal,
            Code::Aborted,
            Code::Cancelled,
            Code::Unknown,
        ] {
            assert!(matches!(failure(&answered(code)), Failure::Unknown(_)));
        }
        let no_answer = PublishError::Rpc(Arc::new(Error::timeout("no answer")));
        assert!(matches!(failure(&no_answer), Failure::Unknown(_)));
        assert!(matches!(
            failure(&PublishError::Shutdown),
            Failure::Unknown(_)
        ));
    }
}
