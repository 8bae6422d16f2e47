//! A caller's own writes in a commit's transaction (`CommitBatch::work`, what a library job's
//! exactly-once rests on): the work sees the new rows only (no duplicate, no dead letter),
//! writes in the same transaction as the ledger keys (no target rows are written), and an
//! error of the work rolls everything back, the ledger keys included. Each test runs on both
//! backends (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;
use sluice_store::{PostgresWork, SqliteWork, TransactionWork, WorkError};

/// Counts each new entry's key in `job_counts`, or fails when the batch holds `fail_on`.
struct Counting {
    keys: Vec<String>,
    fail_on: Option<(&'static str, bool)>,
}

impl Counting {
    fn check(&self, new: &[usize]) -> Result<(), WorkError> {
        match self.fail_on {
            Some((key, transient)) if new.iter().any(|i| self.keys[*i] == key) => {
                let message = format!("cannot count {key}");
                Err(if transient {
                    WorkError::transient(message)
                } else {
                    WorkError::rejected(message)
                })
            }
            _ => Ok(()),
        }
    }
}

impl SqliteWork for Counting {
    fn write(&self, tx: &rusqlite::Transaction<'_>, new: &[usize]) -> Result<(), WorkError> {
        for i in new {
            tx.execute(
                "INSERT INTO job_counts (key, n) VALUES (?1, 1)
                 ON CONFLICT (key) DO UPDATE SET n = n + 1",
                [&self.keys[*i]],
            )
            .map_err(|e| WorkError::rejected(e.to_string()))?;
        }
        self.check(new)
    }
}

#[async_trait::async_trait]
impl PostgresWork for Counting {
    async fn write(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        new: &[usize],
    ) -> Result<(), WorkError> {
        for i in new {
            tx.execute(
                "INSERT INTO job_counts (key, n) VALUES ($1, 1)
                 ON CONFLICT (key) DO UPDATE SET n = job_counts.n + 1",
                &[&self.keys[*i]],
            )
            .await
            .map_err(|e| WorkError::rejected(e.to_string()))?;
        }
        self.check(new)
    }
}

fn work(
    postgres: bool,
    entries: &[Entry],
    fail_on: Option<(&'static str, bool)>,
) -> TransactionWork {
    let counting = Counting {
        keys: entries.iter().map(|e| e.key.as_str().to_owned()).collect(),
        fail_on,
    };
    if postgres {
        TransactionWork::Postgres(Arc::new(counting))
    } else {
        TransactionWork::Sqlite(Arc::new(counting))
    }
}

async fn counts(place: &Place) -> Vec<String> {
    let sql = "SELECT key || '=' || n FROM job_counts ORDER BY key";
    place.texts(sql, sql, &[]).await
}

async fn the_work_writes_new_rows_only_in_the_ledgers_transaction(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    place
        .execute("CREATE TABLE job_counts (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
        .await;
    let entries = vec![row("a"), row("b"), dead("c"), row("a")];
    let mut first = batch(&flows[0], entries.clone());
    first.work = Some(work(postgres, &entries, None));
    // A job has no target table: the work is its effect.
    first.table = Arc::from("p__no_such_table");
    let outcome = store.commit(first).await.unwrap();
    assert_eq!(outcome.written, [true, true, true, false]);
    assert_eq!(counts(&place).await, ["a=1", "b=1"], "new rows only, once");
    assert_eq!(
        store.count_rows("p__events", None).await.unwrap(),
        0,
        "the work is the effect: no target rows"
    );
    assert_eq!(place.dead_letter_reasons().await, ["bad_timestamp"]);
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!((progress.committed, progress.dead_lettered), (2, 1));

    // A redelivery of the whole batch: every key a duplicate, the work sees nothing.
    let mut again = batch(&flows[0], entries.clone());
    again.work = Some(work(postgres, &entries, None));
    assert_eq!(
        store.commit(again).await.unwrap().written,
        [false, false, false, false]
    );
    assert_eq!(counts(&place).await, ["a=1", "b=1"]);
}

async fn a_failing_work_rolls_back_the_ledger_too(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    place
        .execute("CREATE TABLE job_counts (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
        .await;
    let entries = vec![row("x"), row("y")];
    for (transient, expected) in [(false, "rejected"), (true, "unavailable")] {
        let mut failing = batch(&flows[0], entries.clone());
        failing.work = Some(work(postgres, &entries, Some(("y", transient))));
        let refused = store.commit(failing).await;
        let kind = match &refused {
            Err(StoreError::Rejected(message)) if message.contains("cannot count y") => "rejected",
            Err(StoreError::Unavailable(message)) if message.contains("cannot count y") => {
                "unavailable"
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(kind, expected);
        assert!(counts(&place).await.is_empty(), "x's write rolled back too");
        assert_eq!(store.flow_progress(&flows[0]).await.unwrap().batches, 0);
    }
    // The keys were rolled back with the work: the next attempt finds them new.
    let mut retried = batch(&flows[0], entries.clone());
    retried.work = Some(work(postgres, &entries, None));
    assert_eq!(store.commit(retried).await.unwrap().written, [true, true]);
    assert_eq!(counts(&place).await, ["x=1", "y=1"]);

    // Work for the other backend is refused, nothing written.
    let mut mismatched = batch(&flows[1], vec![row("z")]);
    mismatched.work = Some(work(!postgres, &[row("z")], None));
    assert!(matches!(
        store.commit(mismatched).await,
        Err(StoreError::Config(_))
    ));
    assert_eq!(store.flow_progress(&flows[1]).await.unwrap().batches, 0);
}

/// A PostgreSQL handler that swallows a failed statement's error leaves its transaction
/// aborted; COMMIT would then roll everything back and report success. The store refuses the
/// batch instead, so nothing is acked for writes that did not land.
#[tokio::test]
async fn a_postgres_work_that_swallows_an_error_is_refused() {
    struct Swallowing;

    #[async_trait::async_trait]
    impl PostgresWork for Swallowing {
        async fn write(
            &self,
            tx: &tokio_postgres::Transaction<'_>,
            _: &[usize],
        ) -> Result<(), WorkError> {
            let _ignored = tx
                .execute("INSERT INTO no_such_table VALUES (1)", &[])
                .await;
            Ok(())
        }
    }

    let (place, store, flows) = open(true).await;
    place
        .execute("CREATE TABLE job_counts (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
        .await;
    let mut swallowing = batch(&flows[0], vec![row("a")]);
    swallowing.work = Some(TransactionWork::Postgres(Arc::new(Swallowing)));
    assert!(store.commit(swallowing).await.is_err());
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!(progress.batches, 0, "nothing committed");
    let mut again = batch(&flows[0], vec![row("a")]);
    again.work = Some(work(true, &[row("a")], None));
    assert_eq!(
        store.commit(again).await.unwrap().written,
        [true],
        "the key was not kept"
    );
}

on_both_backends!(
    the_work_writes_new_rows_only_in_the_ledgers_transaction,
    a_failing_work_rolls_back_the_ledger_too,
);
