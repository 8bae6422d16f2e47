//! Update flows into a keyed table (`crate::changes`, SCD type 1): generated change streams
//! (upserts, deletes, equal sequences, redeliveries), shuffled and cut into batches, some
//! committed at once from two tasks, end in exactly the table a sequential replay in
//! `(sequence, dedup key)` order gives; a delete leaves a tombstone an older change does not
//! pass; a change without a sequence is refused naming the column; `ignore_null_updates`
//! keeps a row's values. Each test runs on both backends (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;
use sluice_store::{ChangeRule, ColumnType, Sql, TypedColumn, TypedQuery, TypedTable, TypedValue};
use std::collections::BTreeMap;

fn column(name: &str, ty: ColumnType, nullable: bool) -> TypedColumn {
    TypedColumn {
        name: name.into(),
        ty,
        nullable,
    }
}

fn keyed_layout() -> Layout {
    Layout {
        pipeline: "p".into(),
        tables: vec!["customers".into()],
        typed: vec![TypedTable {
            target: "customers".into(),
            columns: vec![
                column("id", ColumnType::Text, false),
                column("seq", ColumnType::Integer, false),
                column("name", ColumnType::Text, true),
            ],
            keys: vec!["id".into()],
        }],
        flows: vec!["cdc".into()],
    }
}

/// Fields `id`, `seq`, `name`, `op`; each column its field; `op = 'D'` deletes.
fn query(ignore_null_updates: bool) -> TypedQuery {
    use sluice_pipeline::ColumnType as P;
    let mut visible: Vec<(String, P)> = [
        ("id", P::Text),
        ("seq", P::Integer),
        ("name", P::Text),
        ("op", P::Text),
    ]
    .iter()
    .map(|(n, t)| (n.to_string(), *t))
    .collect();
    visible.extend(sluice_pipeline::query::envelope_fields());
    let sql = |text: &str| {
        let e = sluice_pipeline::expression::compile(text, &visible).unwrap();
        Sql {
            postgres: e.postgres,
            sqlite: e.sqlite,
        }
    };
    let table = keyed_layout().typed.remove(0);
    TypedQuery {
        fields: vec![
            ("id".into(), ColumnType::Text),
            ("seq".into(), ColumnType::Integer),
            ("name".into(), ColumnType::Text),
            ("op".into(), ColumnType::Text),
        ],
        select: table
            .columns
            .iter()
            .map(|c| (c.clone(), sql(&format!("\"{}\"", c.name))))
            .collect(),
        filter: None,
        expectations: Vec::new(),
        grown: Vec::new(),
        changes: Some(ChangeRule {
            keys: vec!["id".into()],
            sequence_by: "seq".into(),
            deletes: Some(sql("op = 'D'")),
            ignore_null_updates,
        }),
    }
}

/// One change: its dedup key, key, sequence, name, and whether it deletes.
#[derive(Debug, Clone)]
struct Change {
    dedup: String,
    id: String,
    seq: Option<i64>,
    name: Option<String>,
    delete: bool,
}

impl Change {
    fn entry(&self) -> Entry {
        let text = |v: Option<&str>| v.map_or(TypedValue::Null, |v| TypedValue::Text(v.into()));
        entry(
            &self.dedup,
            Effect::Row {
                event_time_ms: 5,
                values: vec![
                    TypedValue::Text(self.id.clone()),
                    self.seq.map_or(TypedValue::Null, TypedValue::Integer),
                    text(self.name.as_deref()),
                    TypedValue::Text(if self.delete { "D" } else { "U" }.into()),
                ],
            },
        )
    }
}

/// A small deterministic generator (no dependency for it).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// `id|seq|name|deleted` of every row, in key order.
async fn table(place: &Place) -> Vec<String> {
    place
        .texts(
            "SELECT id || '|' || seq || '|' || COALESCE(name, '') || '|'
                 || (_sluice_deleted_at IS NOT NULL) FROM p__customers ORDER BY id",
            "SELECT id || '|' || seq || '|' || COALESCE(name, '') || '|'
                 || CASE WHEN _sluice_deleted_at IS NOT NULL THEN 1 ELSE 0 END
             FROM p__customers ORDER BY id",
            &[],
        )
        .await
}

/// What a sequential replay in `(sequence, dedup key)` order leaves: each key's greatest
/// change (a delete as a tombstone without a name).
fn replay(changes: &[Change]) -> Vec<String> {
    let mut last: BTreeMap<&str, &Change> = BTreeMap::new();
    for change in changes {
        let newer = last
            .get(change.id.as_str())
            .is_none_or(|held| (change.seq, &change.dedup) > (held.seq, &held.dedup));
        if newer {
            last.insert(&change.id, change);
        }
    }
    last.values()
        .map(|c| {
            let name = if c.delete {
                ""
            } else {
                c.name.as_deref().unwrap_or("")
            };
            format!(
                "{}|{}|{name}|{}",
                c.id,
                c.seq.unwrap(),
                if c.delete { 1 } else { 0 }
            )
        })
        .collect()
}

async fn keyed_open(postgres: bool) -> (Place, Arc<dyn InspectableStore>, FlowHandle) {
    let place = Place::new(postgres).await;
    let store = place.open();
    let mut flows = store.prepare(&keyed_layout()).await.unwrap();
    (place, store, flows.remove(0))
}

fn keyed_batch(flow: &FlowHandle, changes: &[Change], query: &TypedQuery) -> CommitBatch {
    let mut batch = batch(flow, changes.iter().map(Change::entry).collect());
    batch.table = Arc::from(table_name("p", "customers").unwrap());
    batch.typed = Some(Arc::new(query.clone()));
    batch
}

/// Generated streams (12 keys, sequences 0..30 so that some are equal, one in five a delete,
/// one in ten a redelivery of an earlier change), shuffled and cut into batches of 1 to 15,
/// every other pair of batches committed at once from two tasks: the table is the replay's.
async fn any_order_of_changes_ends_as_the_sequential_replay(postgres: bool) {
    let q = query(false);
    for round in 0..4u64 {
        let (place, store, flow) = keyed_open(postgres).await;
        let mut rng = Lcg(round * 7 + 1);
        let mut changes: Vec<Change> = Vec::new();
        for i in 0..300 {
            if i > 0 && rng.below(10) == 0 {
                let again = changes[rng.below(changes.len() as u64) as usize].clone();
                changes.push(again);
                continue;
            }
            changes.push(Change {
                dedup: format!("c{i:04}"),
                id: format!("k{}", rng.below(12)),
                seq: Some(rng.below(30) as i64),
                name: (rng.below(4) > 0).then(|| format!("n{i}")),
                delete: rng.below(5) == 0,
            });
        }
        for i in (1..changes.len()).rev() {
            changes.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut batches: Vec<Vec<Change>> = Vec::new();
        let mut rest = &changes[..];
        while !rest.is_empty() {
            let n = (1 + rng.below(15) as usize).min(rest.len());
            // A batch holds one entry per dedup key (the engine's batches do).
            let mut batch: Vec<Change> = Vec::new();
            for change in &rest[..n] {
                if !batch.iter().any(|b| b.dedup == change.dedup) {
                    batch.push(change.clone());
                }
            }
            batches.push(batch);
            rest = &rest[n..];
        }
        for pair in batches.chunks(2) {
            let commits: Vec<_> = pair
                .iter()
                .map(|changes| {
                    let store = store.clone();
                    let batch = keyed_batch(&flow, changes, &q);
                    tokio::spawn(async move { store.commit(batch).await })
                })
                .collect();
            for commit in commits {
                commit.await.unwrap().unwrap();
            }
        }
        assert_eq!(table(&place).await, replay(&changes), "round {round}");
    }
}

/// A delete leaves a tombstone: an older upsert after it changes nothing, a newer one brings
/// the key back; a change without a sequence is refused naming the column, nothing written.
async fn a_tombstone_holds_off_older_changes(postgres: bool) {
    let (place, store, flow) = keyed_open(postgres).await;
    let q = query(false);
    let change = |dedup: &str, seq: Option<i64>, name: Option<&str>, delete: bool| Change {
        dedup: dedup.into(),
        id: "k".into(),
        seq,
        name: name.map(str::to_owned),
        delete,
    };
    for step in [
        change("a", Some(5), Some("five"), false),
        change("b", Some(7), None, true),
        change("c", Some(6), Some("six"), false),
    ] {
        store.commit(keyed_batch(&flow, &[step], &q)).await.unwrap();
    }
    assert_eq!(table(&place).await, ["k|7||1"], "the tombstone holds");
    let refused = store
        .commit(keyed_batch(
            &flow,
            &[change("d", None, Some("x"), false)],
            &q,
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, StoreError::Record { column, .. } if column == "seq"),
        "{refused:?}"
    );
    // The same beside a newer change of its key in one batch (SQLite sorts NULL last).
    let refused = store
        .commit(keyed_batch(
            &flow,
            &[
                change("d", None, Some("x"), false),
                change("f", Some(9), Some("nine"), false),
            ],
            &q,
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, StoreError::Record { index: 0, column, .. } if column == "seq"),
        "{refused:?}"
    );
    store
        .commit(keyed_batch(
            &flow,
            &[change("e", Some(8), Some("eight"), false)],
            &q,
        ))
        .await
        .unwrap();
    assert_eq!(
        table(&place).await,
        ["k|8|eight|0"],
        "a newer change is back"
    );
}

/// With `ignore_null_updates`, an update's NULL keeps the row's value.
async fn ignoring_null_updates_keeps_the_rows_values(postgres: bool) {
    let (place, store, flow) = keyed_open(postgres).await;
    let q = query(true);
    for (dedup, seq, name) in [("a", 1, Some("one")), ("b", 2, None)] {
        let change = Change {
            dedup: dedup.into(),
            id: "k".into(),
            seq: Some(seq),
            name: name.map(str::to_owned),
            delete: false,
        };
        store
            .commit(keyed_batch(&flow, &[change], &q))
            .await
            .unwrap();
    }
    assert_eq!(table(&place).await, ["k|2|one|0"]);
}

/// A table's keys do not change: other keys, or none, are refused at prepare; an append table
/// whose rows repeat a key cannot gain it; one whose rows do not, can.
async fn keys_are_kept_or_refused(postgres: bool) {
    let (place, store, flow) = keyed_open(postgres).await;
    let one = Change {
        dedup: "a".into(),
        id: "k".into(),
        seq: Some(1),
        name: None,
        delete: false,
    };
    store
        .commit(keyed_batch(&flow, &[one], &query(false)))
        .await
        .unwrap();
    let with_keys = |keys: &[&str]| {
        let mut layout = keyed_layout();
        layout.typed[0].keys = keys.iter().map(|k| k.to_string()).collect();
        layout
    };
    for keys in [&["id", "seq"][..], &[]] {
        let refused = store.prepare(&with_keys(keys)).await.unwrap_err();
        assert!(
            refused.to_string().contains("keys are [id]"),
            "{keys:?}: {refused}"
        );
    }
    store.prepare(&with_keys(&["id"])).await.unwrap();
    // An append table: its rows repeat `name`, not `id`.
    let append = || {
        let mut layout = with_keys(&[]);
        layout.tables = vec!["plain".into()];
        layout.typed[0].target = "plain".into();
        layout
    };
    store.prepare(&append()).await.unwrap();
    place
        .execute(
            "INSERT INTO p__plain (_sluice_dedup_key, _sluice_message_id, _sluice_publish_time,
                 _sluice_event_time, _sluice_flow, _sluice_committed_at, id, seq, name)
             VALUES ('a', 'm', 1, 1, 'cdc', 1, 'x', 1, 'same'),
                    ('b', 'm', 1, 1, 'cdc', 1, 'y', 1, 'same')"
                .replace(
                    ", 1, 1, 'cdc', 1,",
                    if postgres {
                        ", now(), now(), 'cdc', now(),"
                    } else {
                        ", 1, 1, 'cdc', 1,"
                    },
                )
                .as_str(),
        )
        .await;
    let mut by_name = append();
    by_name.typed[0].keys = vec!["name".into()];
    let refused = store.prepare(&by_name).await.unwrap_err();
    assert!(
        refused.to_string().contains("share their [name]"),
        "{refused}"
    );
    let mut by_id = append();
    by_id.typed[0].keys = vec!["id".into()];
    store.prepare(&by_id).await.unwrap();
}

on_both_backends!(
    keys_are_kept_or_refused,
    any_order_of_changes_ends_as_the_sequential_replay,
    a_tombstone_holds_off_older_changes,
    ignoring_null_updates_keeps_the_rows_values,
);
