//! What a store cannot hold or index, found before a commit tries: U+0000, and dedup keys too
//! long to index.
//!
//! - PostgreSQL's `text` and `jsonb` refuse U+0000 (SQLSTATE 22021 and 22P05), so a message
//!   carrying it in its dedup key, its message id (a file record's id) or an attribute would be
//!   refused as a row and again as a dead letter, forever. Its text is written with each U+0000
//!   as the six characters `\u0000`. (A key that already holds the text `\u0000` and one that
//!   holds U+0000 there are then taken for one.)
//! - A dedup key is indexed (the ledger's primary key, the target's and the dead-letter table's
//!   `(flow, dedup_key)`), and PostgreSQL refuses an index entry over about 2.7 KB (SQLSTATE
//!   54000). A key longer than [`MAX_KEY_BYTES`] is kept as its digest
//!   (`sluice-key-digest:` and the key's 128-bit XXH3 in hex, the fingerprint the memory tier
//!   already identifies keys by).
//!
//! Such a message becomes a dead letter with reason `unstorable` on every backend (so a pipeline
//! behaves the same on SQLite and PostgreSQL), the reason's text saying what was found. Its key
//! is derived the same way wherever it is derived, so a redelivery finds the dead letter's
//! ledger key. A value the store refuses all the same (a limit this check does not know) is
//! caught at the commit: the dead letter is then kept without its data and attributes
//! (`commit.rs`).

use crate::flow::delivery::{SourceMessage, SourceProblem};
use std::borrow::Cow;

/// The reason of such dead letters.
pub const UNSTORABLE: &str = "unstorable";

/// What a store cannot hold.
const NUL: char = '\0';
/// What it is written as.
const ESCAPED_NUL: &str = "\\u0000";
/// The longest dedup key kept as it is, in bytes: well under PostgreSQL's limit for an index
/// entry (about 2 700 bytes, less what a table source's `<flow>/` prefix adds), one limit on
/// both stores.
pub const MAX_KEY_BYTES: usize = 1024;
/// What a key kept as its digest starts with.
const DIGEST_PREFIX: &str = "sluice-key-digest:";

/// `text` with U+0000 written as `\u0000`; borrowed when there is none.
pub(crate) fn storable(text: &str) -> Cow<'_, str> {
    if text.contains(NUL) {
        Cow::Owned(text.replace(NUL, ESCAPED_NUL))
    } else {
        Cow::Borrowed(text)
    }
}

/// If `message` (whose dedup key is `key`) holds U+0000 anywhere a store keeps text, escapes it
/// there, and if its key is longer than [`MAX_KEY_BYTES`], keeps the key's digest; then marks
/// the message as a dead letter (`unstorable`) and returns the key to use.
pub(crate) fn make_storable(message: &mut SourceMessage, key: &str) -> Option<String> {
    let mut found: Vec<String> = Vec::new();
    if key.contains(NUL) {
        found.push("its dedup key holds U+0000".to_owned());
    }
    if message.message_id.contains(NUL) {
        found.push("its id holds U+0000".to_owned());
        message.message_id = storable(&message.message_id).into_owned();
    }
    if message
        .attributes
        .iter()
        .any(|(name, value)| name.contains(NUL) || value.contains(NUL))
    {
        found.push("an attribute holds U+0000".to_owned());
        message.attributes = std::mem::take(&mut message.attributes)
            .into_iter()
            .map(|(name, value)| (storable(&name).into_owned(), storable(&value).into_owned()))
            .collect();
    }
    let mut stored = storable(key).into_owned();
    if stored.len() > MAX_KEY_BYTES {
        found.push(format!(
            "its dedup key is {} bytes, over the {MAX_KEY_BYTES} a store indexes; kept as its \
             digest",
            stored.len()
        ));
        stored = format!(
            "{DIGEST_PREFIX}{:032x}",
            sluice_dedup::DedupKey::new(stored).hash().0
        );
    }
    if found.is_empty() {
        return None;
    }
    if message.problem.is_none() {
        message.problem = Some(SourceProblem {
            reason: UNSTORABLE,
            error: format!(
                "{}: the store cannot hold it as it is (U+0000 written as \\u0000)",
                found.join("; ")
            ),
        });
    }
    Some(stored)
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
            problem.error.contains(
                "its dedup key holds U+0000; its id holds U+0000; an attribute holds U+0000"
            ),
            "{}",
            problem.error
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

    #[test]
    fn a_key_too_long_to_index_is_kept_as_its_digest_the_same_every_time() {
        let message = SourceMessage {
            message_id: "m".into(),
            publish_time_ms: 0,
            attributes: BTreeMap::new(),
            data: bytes::Bytes::new(),
            event_time_ms: None,
            problem: None,
        };
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        let (mut first, mut again) = (message.clone(), message.clone());
        let key = make_storable(&mut first, &long).expect("a long key is replaced");
        assert!(key.starts_with(DIGEST_PREFIX) && key.len() < 64, "{key}");
        assert_eq!(
            make_storable(&mut again, &long).as_deref(),
            Some(key.as_str())
        );
        let problem = first.problem.expect("marked unstorable");
        assert_eq!(problem.reason, UNSTORABLE);
        assert!(problem.error.contains("1025 bytes"), "{}", problem.error);
        let mut fits = message.clone();
        assert_eq!(make_storable(&mut fits, &"x".repeat(MAX_KEY_BYTES)), None);
    }
}
