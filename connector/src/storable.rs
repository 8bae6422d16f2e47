//! Text a store cannot hold: U+0000. PostgreSQL's `text` and `jsonb` refuse it (SQLSTATE 22021
//! and 22P05), so a message carrying it in its dedup key, its message id (a file record's id) or
//! an attribute would be refused as a row and again as a dead letter, forever.
//!
//! Such a message becomes a dead letter with reason `unstorable` on every backend (so a pipeline
//! behaves the same on SQLite and PostgreSQL), its text written with each U+0000 as the six
//! characters `\u0000`. Its key is escaped the same way wherever it is derived, so a redelivery
//! finds the dead letter's ledger key. (A key that already holds the text `\u0000` and one that
//! holds U+0000 there are then taken for one.)

use crate::delivery::{SourceMessage, SourceProblem};
use std::borrow::Cow;

/// The reason of such dead letters.
pub const UNSTORABLE: &str = "unstorable";

/// What a store cannot hold.
const NUL: char = '\0';
/// What it is written as.
const ESCAPED_NUL: &str = "\\u0000";

/// `text` with U+0000 written as `\u0000`; borrowed when there is none.
pub(crate) fn storable(text: &str) -> Cow<'_, str> {
    if text.contains(NUL) {
        Cow::Owned(text.replace(NUL, ESCAPED_NUL))
    } else {
        Cow::Borrowed(text)
    }
}

/// If `message` (whose dedup key is `key`) holds U+0000 anywhere a store keeps text, escapes it
/// there and marks the message as a dead letter (`unstorable`); returns the key to use.
pub(crate) fn make_storable(message: &mut SourceMessage, key: &str) -> Option<String> {
    let mut found: Vec<&str> = Vec::new();
    if key.contains(NUL) {
        found.push("its dedup key");
    }
    if message.message_id.contains(NUL) {
        found.push("its id");
        message.message_id = storable(&message.message_id).into_owned();
    }
    if message
        .attributes
        .iter()
        .any(|(name, value)| name.contains(NUL) || value.contains(NUL))
    {
        found.push("an attribute");
        message.attributes = std::mem::take(&mut message.attributes)
            .into_iter()
            .map(|(name, value)| (storable(&name).into_owned(), storable(&value).into_owned()))
            .collect();
    }
    if found.is_empty() {
        return None;
    }
    if message.problem.is_none() {
        message.problem = Some(SourceProblem {
            reason: UNSTORABLE,
            error: format!(
                "{} holds U+0000, which the store cannot hold; written with it as \\u0000",
                found.join(" and ")
            ),
        });
    }
    Some(storable(key).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn nul_is_escaped_and_marks_the_message() {
        let mut message = SourceMessage {
            message_id: "m\0".into(),
            publish_time_ms: 0,
            attributes: BTreeMap::from([("a".into(), "x\0y".into())]),
            data: bytes::Bytes::new(),
            event_time_ms: None,
            problem: None,
        };
        assert_eq!(
            make_storable(&mut message, "k\0").as_deref(),
            Some("k\\u0000")
        );
        assert_eq!(message.message_id, "m\\u0000");
        assert_eq!(message.attributes["a"], "x\\u0000y");
        let problem = message.problem.clone().expect("marked unstorable");
        assert_eq!(problem.reason, UNSTORABLE);
        assert!(
            problem
                .error
                .contains("its dedup key and its id and an attribute")
        );
        let mut clean = SourceMessage {
            message_id: "m".into(),
            ..message.clone()
        };
        clean.attributes = BTreeMap::new();
        clean.problem = None;
        assert_eq!(make_storable(&mut clean, "k"), None);
        assert!(clean.problem.is_none());
    }
}
