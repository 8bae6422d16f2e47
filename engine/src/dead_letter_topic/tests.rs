//! The publisher's rounds against a real SQLite outbox and a stand-in for Pub/Sub
//! ([`FakeTopic`], not the emulator: it answers whole requests the way the emulator was
//! measured to, see `sender.rs`). The emulator's own refusal is tested end to end in
//! `tests/tests/dead_letter_topic.rs`.
#![allow(clippy::unwrap_used)]

use super::sender::{Failure, LetterSender};
use super::{DeadLetterTopic, PAGE};
use crate::source::turn::ReaderTurn;
use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use sluice_dedup::DedupKey;
use sluice_store::{
    CommitBatch, Effect, Entry, MessageFields, OutboxCensus, SqliteStore, Store, table_name,
};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Answers a whole request, as Pub/Sub does, from the `name`s of the letters in it: one
/// named `poison*` makes it INVALID_ARGUMENT for every message, else one named `lost*` an
/// unknown outcome for every message, else a missing topic NOT_FOUND; else it is taken. It
/// records every request.
#[derive(Default)]
struct FakeTopic {
    requests: Mutex<Vec<Vec<String>>>,
    topic_missing: bool,
}

impl LetterSender for FakeTopic {
    async fn send(&self, messages: Vec<Message>) -> Vec<Result<(), Failure>> {
        let names: Vec<String> = messages
            .iter()
            .map(|m| m.attributes["name"].clone())
            .collect();
        let any = |prefix: &str| names.iter().any(|n| n.starts_with(prefix));
        let answer = if any("poison") {
            Err(Failure::Invalid(
                "InvalidArgument: Could not parse message".into(),
            ))
        } else if any("lost") {
            Err(Failure::Unknown("DeadlineExceeded: no answer".into()))
        } else if self.topic_missing {
            Err(Failure::NotTaken("NotFound: no topic".into()))
        } else {
            Ok(())
        };
        self.requests.lock().unwrap().push(names);
        vec![answer; messages.len()]
    }
}

impl FakeTopic {
    fn requests(&self) -> Vec<Vec<String>> {
        self.requests.lock().unwrap().clone()
    }
}

/// A store whose outbox holds a dead letter for each of `names`, in order.
async fn outbox_with(names: &[String]) -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let flows = store
        .prepare(&sluice_store::Layout {
            pipeline: "p".into(),
            tables: vec!["events".into()],
            typed: Vec::new(),
            flows: vec!["live".into()],
        })
        .await
        .unwrap();
    let entries = names
        .iter()
        .map(|name| Entry {
            key: DedupKey::new(name),
            message: MessageFields {
                message_id: name.clone(),
                publish_time_ms: 1_000,
                attributes_json: format!(r#"{{"name":"{name}"}}"#),
                data: Bytes::from_static(b"payload"),
            },
            effect: Effect::DeadLetter {
                reason: "bad_timestamp".into(),
                error: "nope".into(),
                attempts: 1,
            },
        })
        .collect();
    store
        .commit(CommitBatch {
            flow: flows[0].clone(),
            table: Arc::from(table_name("p", "events").unwrap()),
            entries,
            now_ms: 1_000,
            expires_at_ms: i64::MAX / 2,
            commit_by_ms: None,
            hook: None,
            watermark_progress: false,
            position: None,
            position_gate: None,
            work: None,
            publish_dead_letters: true,
            verdicts: Vec::new(),
            memory_duplicates: 0,
            typed: None,
        })
        .await
        .unwrap();
    (dir, store)
}

fn publisher(store: &Arc<dyn Store>) -> DeadLetterTopic {
    DeadLetterTopic {
        outbox: store.clone(),
        turn: ReaderTurn {
            pool: store.clone(),
            holder: "w".into(),
        },
        pipeline: "p".into(),
        topic: "projects/x/topics/dead".into(),
    }
}

fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// Rounds until none is left to take; the number of rounds.
async fn rounds_until_empty(topic: &DeadLetterTopic, fake: &FakeTopic) -> usize {
    let mut not_taken_before = HashSet::new();
    let mut rounds = 0;
    while topic
        .round(fake, &mut not_taken_before)
        .await
        .unwrap()
        .is_some()
    {
        rounds += 1;
        let requests = fake.requests();
        assert!(
            rounds < 10,
            "no end after {} requests; the last: {:?}",
            requests.len(),
            requests.last()
        );
    }
    rounds
}

#[tokio::test]
async fn a_letter_refused_alone_is_refused_for_good_and_the_others_in_its_request_go_out() {
    let (_dir, store) = outbox_with(&names(&["a", "poison", "c"])).await;
    let topic = publisher(&store);
    let fake = FakeTopic::default();
    assert_eq!(rounds_until_empty(&topic, &fake).await, 1);
    assert_eq!(
        fake.requests(),
        [
            names(&["a", "poison", "c"]),
            names(&["a"]),
            names(&["poison"]),
            names(&["c"])
        ],
        "the refused request's letters each sent again alone"
    );
    assert_eq!(
        store.outbox_census("p").await.unwrap(),
        OutboxCensus {
            waiting: 0,
            refused: 1
        }
    );
}

#[tokio::test]
async fn more_refused_letters_than_a_round_takes_hold_up_none_behind_them() {
    let mut letters: Vec<String> = (0..PAGE + 50).map(|i| format!("poison{i:03}")).collect();
    letters.push("late".into());
    let (_dir, store) = outbox_with(&letters).await;
    let topic = publisher(&store);
    let fake = FakeTopic::default();
    assert_eq!(rounds_until_empty(&topic, &fake).await, 2);
    assert!(
        fake.requests().iter().any(|r| r == &names(&["late"])),
        "the letter behind them went out alone: {:?}",
        fake.requests().last()
    );
    assert_eq!(
        store.outbox_census("p").await.unwrap(),
        OutboxCensus {
            waiting: 0,
            refused: (PAGE + 50) as u64
        }
    );
}

#[tokio::test]
async fn a_missing_topic_or_an_unknown_outcome_never_refuses_a_letter() {
    // A request refused for a poisoned letter, whose other letter's outcome is then unknown
    // alone; and a whole round against a missing topic.
    let (_dir, store) = outbox_with(&names(&["lost", "poison"])).await;
    let topic = publisher(&store);
    let fake = FakeTopic::default();
    let mut not_taken_before = HashSet::new();
    let round = topic
        .round(&fake, &mut not_taken_before)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(round.refused.len(), 1, "{round:?}");
    assert!(round.refused[0].1.contains("Could not parse message"));
    assert!(round.failed.is_some());
    let waiting = store.take_outbox("p", 10, 1 << 20).await.unwrap();
    assert_eq!(
        waiting.len(),
        1,
        "the letter whose outcome is unknown waits"
    );
    assert_eq!(
        (waiting[0].dedup_key.as_str(), waiting[0].earlier_publishes),
        ("lost", 1)
    );

    let (_dir, store) = outbox_with(&names(&["a", "b"])).await;
    let topic = publisher(&store);
    let missing = FakeTopic {
        topic_missing: true,
        ..FakeTopic::default()
    };
    let round = topic
        .round(&missing, &mut not_taken_before)
        .await
        .unwrap()
        .unwrap();
    assert!(round.refused.is_empty() && round.published.is_empty());
    assert_eq!(
        store.outbox_census("p").await.unwrap(),
        OutboxCensus {
            waiting: 2,
            refused: 0
        }
    );
    assert_eq!(
        rounds_until_empty(&topic, &FakeTopic::default()).await,
        1,
        "published once the topic takes them"
    );
    assert_eq!(
        store.outbox_census("p").await.unwrap(),
        OutboxCensus::default()
    );
}
