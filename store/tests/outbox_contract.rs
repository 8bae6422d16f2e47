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

/// A letter is a record of a flow (its dedup key): the same bad record dead-lettered again after
/// a reset re-read it owes nothing more, whether its letter was published (it stays published)
/// or still waits (it keeps its place and id); the same key in another flow is another letter.
async fn a_record_dead_lettered_again_after_a_reset_owes_no_second_letter(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let publishing = |flow: &FlowHandle, entries| {
        let mut batch = batch(flow, entries);
        batch.publish_dead_letters = true;
        batch
    };
    store
        .commit(publishing(&flows[0], vec![dead("a"), dead("b")]))
        .await
        .unwrap();
    let first = store.take_outbox("p", 10, 1 << 20).await.unwrap();
    assert_eq!(first.len(), 2);
    let (a, b) = (&first[0], &first[1]);
    store.outbox_published("p", &[a.id]).await.unwrap();

    store
        .reset_flow(&flows[0], Some("p__events"), ResetRows::All, None)
        .await
        .unwrap();
    assert!(
        place.dead_letter_reasons().await.is_empty(),
        "the reset ran"
    );
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    store
        .commit(publishing(&flows[0], vec![dead("a"), dead("b")]))
        .await
        .unwrap();
    assert_eq!(
        place.dead_letter_reasons().await.len(),
        2,
        "both dead-lettered again"
    );
    store
        .commit(publishing(&flows[1], vec![dead("a")]))
        .await
        .unwrap();

    let owed = store.take_outbox("p", 10, 1 << 20).await.unwrap();
    let owed: Vec<(i64, &str, &str)> = owed
        .iter()
        .map(|l| (l.id, l.flow.as_str(), l.dedup_key.as_str()))
        .collect();
    assert_eq!(owed.len(), 2, "{owed:?}");
    assert_eq!(
        owed[0],
        (b.id, "live", "b"),
        "the waiting letter keeps its id"
    );
    assert_eq!(
        (owed[1].1, owed[1].2),
        ("other", "a"),
        "the same key in another flow is another letter"
    );
    assert!(owed[1].0 != a.id && owed[1].0 != b.id);
    store
        .outbox_published("p", &[owed[0].0, owed[1].0])
        .await
        .unwrap();
    assert_eq!(
        store.outbox_census("p").await.unwrap(),
        sluice_store::OutboxCensus {
            waiting: 0,
            refused: 0
        }
    );
}

/// An outbox from before letters were one per record (no `published_at`, copies of a letter a
/// reset added) is upgraded when the store opens: the oldest copy of each letter stays owed,
/// the others go, and the record owes nothing more.
async fn an_outbox_from_before_keeps_one_letter_per_record(postgres: bool) {
    let place = Place::new(postgres).await;
    let store = place.open();
    let flows = store.prepare(&layout(&["live"])).await.unwrap();
    let (id, blob, time, undo) = if postgres {
        (
            "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            "BYTEA",
            "TIMESTAMPTZ",
            // Migration 13 made letters one per record: undo it and let the store apply it
            // (and those after it, which may be applied again).
            "DELETE FROM sluice_migrations WHERE version >= 13;",
        )
    } else {
        ("INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB", "INTEGER", "")
    };
    let now = if postgres { "now()" } else { "1000" };
    let data = if postgres { "'\\x00'::bytea" } else { "x'00'" };
    let values = |key: &str| {
        format!(
            "INSERT INTO sluice_dead_letter_outbox (pipeline, flow, dedup_key, message_id,
                 publish_time_ms, attributes, data, reason, error, attempts, committed_at)
             VALUES ('p', 'live', '{key}', 'm-{key}', 1000, '{{}}', {data}, 'bad_timestamp',
                     'nope', 1, {now});"
        )
    };
    place
        .execute(&format!(
            "DROP TABLE sluice_dead_letter_outbox;
             CREATE TABLE sluice_dead_letter_outbox (
                 id {id}, pipeline TEXT NOT NULL, flow TEXT NOT NULL, dedup_key TEXT NOT NULL,
                 message_id TEXT NOT NULL, publish_time_ms BIGINT NOT NULL,
                 attributes TEXT NOT NULL, data {blob} NOT NULL, reason TEXT NOT NULL,
                 error TEXT NOT NULL, attempts INTEGER NOT NULL, committed_at {time} NOT NULL,
                 publishes INTEGER NOT NULL DEFAULT 0, refused TEXT);
             CREATE INDEX sluice_dead_letter_outbox_waiting
                 ON sluice_dead_letter_outbox (pipeline, id);
             {undo} {} {} {}",
            values("a"),
            values("a"),
            values("b")
        ))
        .await;
    drop(store);
    let store = place.open();
    let flows_again = store.prepare(&layout(&["live"])).await.unwrap();
    assert_eq!(flows_again[0].id, flows[0].id);
    let mut again = batch(&flows[0], vec![dead("a"), dead("c")]);
    again.publish_dead_letters = true;
    store.commit(again).await.unwrap();
    let owed = store.take_outbox("p", 10, 1 << 20).await.unwrap();
    let owed: Vec<(i64, &str)> = owed.iter().map(|l| (l.id, l.dedup_key.as_str())).collect();
    assert_eq!(owed[..2], [(1, "a"), (3, "b")], "{owed:?}");
    assert_eq!(owed.len(), 3, "and the new record c: {owed:?}");
    assert_eq!(owed[2].1, "c");
    let mut indexes = vec![
        "sluice_dead_letter_outbox_letter",
        "sluice_dead_letter_outbox_owed",
    ];
    if postgres {
        indexes.push("sluice_dead_letter_outbox_pkey");
    }
    assert_eq!(
        place.indexes("sluice_dead_letter_outbox").await,
        indexes,
        "the old index of every letter is gone"
    );
}

on_both_backends!(
    a_published_dead_letter_is_owed_once_and_counted_when_taken_again,
    a_record_dead_lettered_again_after_a_reset_owes_no_second_letter,
    an_outbox_from_before_keeps_one_letter_per_record,
);
