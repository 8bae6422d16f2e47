//! The dead-letter outbox role (`OutboxStore`): a batch that publishes its dead letters places
//! each new one in the outbox in its own transaction (a duplicate owes nothing, a row none); a
//! letter taken counts its publish before it happens, so one taken again says it may have
//! been published; published letters leave, refused ones stay and are taken no more. Each
//! test runs on both backends (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;

async fn a_published_dead_letter_is_owed_once_and_counted_when_taken_again(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let live = &flows[0];
    let mut first = batch(live, vec![dead("a"), row("b"), dead("c")]);
    first.publish_dead_letters = true;
    store.commit(first).await.unwrap();
    // A duplicate of a dead letter, and a batch that does not publish: nothing more is owed.
    let mut again = batch(live, vec![dead("a")]);
    again.publish_dead_letters = true;
    store.commit(again).await.unwrap();
    store.commit(batch(live, vec![dead("d")])).await.unwrap();

    let taken = store.take_outbox("p", 10, 1 << 20).await.unwrap();
    let keys: Vec<&str> = taken.iter().map(|l| l.dedup_key.as_str()).collect();
    assert_eq!(
        keys,
        ["a", "c"],
        "the new dead letters of the publishing batch, in order"
    );
    let a = &taken[0];
    assert_eq!(
        (
            a.flow.as_str(),
            a.message_id.as_str(),
            a.reason.as_str(),
            a.error.as_str()
        ),
        ("live", "m-a", "bad_timestamp", "nope")
    );
    assert_eq!((a.attempts, a.publish_time_ms), (1, 1_000));
    assert_eq!(
        (&a.data[..], a.attributes_json.as_str()),
        (&b"payload"[..], r#"{"k":"v"}"#)
    );
    assert!(taken.iter().all(|l| l.earlier_publishes == 0));

    // A byte budget smaller than one letter still takes the first, and only it.
    let first_only = store.take_outbox("p", 10, 1).await.unwrap();
    assert_eq!(first_only.len(), 1);
    assert_eq!(
        (first_only[0].id, first_only[0].earlier_publishes),
        (a.id, 1)
    );

    // The publisher died before recording: taken again, each says it may have been published.
    let again = store.take_outbox("p", 1, 1 << 20).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id, again[0].earlier_publishes), (a.id, 2));

    store.outbox_published("p", &[a.id]).await.unwrap();
    store
        .outbox_refused("p", taken[1].id, "too large")
        .await
        .unwrap();
    assert!(
        store
            .take_outbox("p", 10, 1 << 20)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.outbox_census("p").await.unwrap(),
        sluice_store::OutboxCensus {
            waiting: 0,
            refused: 1
        }
    );
    assert!(
        store
            .take_outbox("other", 10, 1 << 20)
            .await
            .unwrap()
            .is_empty()
    );
}

on_both_backends!(a_published_dead_letter_is_owed_once_and_counted_when_taken_again);
