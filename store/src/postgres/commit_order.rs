//! The order of one commit's steps on PostgreSQL, in one place: a plain batch is one statement
//! (`commit.rs`); a batch that must do more runs one explicit transaction in this order: the
//! columns a typed query added while running (`TypedQuery::grown`), the hook attempt's
//! advisory lock, the statement, the caller's own work and its guard, the hook
//! and its commit mark, the page's position (after the page before it committed), the seal
//! (`commit_time.rs`), then COMMIT. A page that would wait long for the page before it rolls
//! back and waits without a connection.

use super::{
    PostgresStore, commit, error, expectation_counts, feed, flows, ledger, typed_checks, typed_rows,
};
use crate::{
    CommitBatch, CommitOutcome, FlowHandle, FlowProgress, LedgerStore, LedgerUpkeep, StoreError,
};
use async_trait::async_trait;
use deadpool_postgres::Client;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[async_trait]
impl LedgerStore for PostgresStore {
    async fn commit(&self, batch: CommitBatch) -> Result<CommitOutcome, StoreError> {
        loop {
            match self.commit_once(&batch).await? {
                Committed::Done(outcome) => return Ok(outcome),
                Committed::WaitForPage(gate, version) => {
                    // The connection went back to the pool with the rolled-back transaction:
                    // the page before this one may need it to commit.
                    if !gate.wait(version).await {
                        return Err(StoreError::Moved);
                    }
                }
            }
        }
    }

    async fn violations(&self, batch: &CommitBatch) -> Result<Vec<Vec<bool>>, StoreError> {
        let (client, _) = self.ready().await?;
        typed_checks::violations(&client, batch).await
    }

    /// Half the pool: commits overlap their round trips and the server's fsyncs, and the
    /// other half of the pool stays free for the other flows and for coordination.
    fn commit_concurrency(&self) -> usize {
        (self.options.pool_size / 2).max(1)
    }

    async fn keys_present(
        &self,
        flow: &FlowHandle,
        table: &str,
        keys: &[String],
    ) -> Result<Vec<bool>, StoreError> {
        let (client, _) = self.ready().await?;
        flows::keys_present(&client, flow, table, keys).await
    }

    async fn commit_recorded(
        &self,
        flow: &FlowHandle,
        commit_id: &str,
    ) -> Result<bool, StoreError> {
        let (mut client, _) = self.ready().await?;
        flows::commit_recorded(&mut client, flow, commit_id).await
    }

    async fn flow_progress(&self, flow: &FlowHandle) -> Result<FlowProgress, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(sum(committed), 0)::int8, COALESCE(sum(duplicates), 0)::int8,
                        COALESCE(sum(dead_lettered), 0)::int8, COALESCE(sum(batches), 0)::int8
                 FROM sluice_flow_counters WHERE flow_id = $1",
                &[&flow.id],
            )
            .await?;
        let get = |i: usize| -> Result<u64, StoreError> {
            Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or_default())
        };
        Ok(FlowProgress {
            committed: get(0)?,
            duplicates: get(1)?,
            dead_lettered: get(2)?,
            batches: get(3)?,
        })
    }

    async fn expectation_counts(
        &self,
        flow: &FlowHandle,
    ) -> Result<Vec<crate::ExpectationCount>, StoreError> {
        let (client, _) = self.ready().await?;
        expectation_counts::read(&client, flow.id).await
    }

    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
        let (mut client, width) = self.ready().await?;
        // Old ones go first: a holder that has many to create after a takeover (the lead
        // stood still meanwhile) does not keep the old ones waiting behind them.
        let generations_dropped = ledger::drop_expired(&mut client, width).await?;
        let generations_created =
            ledger::create_ahead(&mut client, width, self.largest_window_ms()).await?;
        // Workers that stopped beating a day ago are history.
        client
            .execute(
                "DELETE FROM sluice_workers WHERE last_beat < now() - interval '1 day'",
                &[],
            )
            .await?;
        Ok(LedgerUpkeep {
            keys_removed: 0,
            generations_created,
            generations_dropped,
        })
    }
}

/// How long a page's transaction, its work done, waits for the page before it with its
/// connection held: longer than a page's commit takes while the store answers (tens of
/// milliseconds), far shorter than the pool's wait for a connection (`connect.rs`). Past it,
/// the page waits without a connection and runs its transaction again.
const PAGE_WAIT_IN_TRANSACTION: Duration = Duration::from_millis(500);

/// How long a commit that adds a grown column waits for the table's lock
/// (`TypedQuery::grown`).
const GROW_LOCK_WAIT: &str = "SET LOCAL lock_timeout = '5s'";

/// What the commit statement reported.
struct Fresh {
    /// The keys the ledger let through.
    keys: Vec<String>,
    /// The rows written.
    rows_written: i64,
}

impl Fresh {
    /// The new rows a typed flow's `where:` left out: new row entries less rows written.
    fn filtered(&self, batch: &CommitBatch, written: &[bool]) -> u64 {
        if batch.typed.is_none() || batch.work.is_some() {
            return 0;
        }
        let new_rows = batch
            .entries
            .iter()
            .zip(written)
            .filter(|(e, new)| **new && matches!(e.effect, crate::Effect::Row { .. }))
            .count() as i64;
        u64::try_from(new_rows - self.rows_written).unwrap_or(0)
    }
}

/// Why the commit statement failed: PostgreSQL's error, or a typed record's values (to be
/// found with [`named_record_error`] once the statement's transaction has ended).
enum CommitError {
    Postgres(tokio_postgres::Error),
    Record(tokio_postgres::Error),
}

/// The record of `batch` whose typed query failed with `error`, and its column, found by
/// reading outside any transaction (a failed statement aborts the one it ran in); the
/// statement's own error when none is found.
async fn named_record_error(
    client: &impl deadpool_postgres::GenericClient,
    batch: &CommitBatch,
    error: tokio_postgres::Error,
) -> StoreError {
    let Some(query) = &batch.typed else {
        return error.into();
    };
    match typed_rows::find_record_error(client, batch, query).await {
        Ok(Some(record)) => record,
        Ok(None) => error.into(),
        Err(store) => store,
    }
}

impl From<tokio_postgres::Error> for CommitError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Postgres(error)
    }
}

impl From<CommitError> for StoreError {
    fn from(error: CommitError) -> Self {
        match error {
            CommitError::Postgres(error) | CommitError::Record(error) => error.into(),
        }
    }
}

/// How one commit attempt ended.
enum Committed {
    /// Committed.
    Done(CommitOutcome),
    /// Rolled back with nothing written, to wait for the page before it (the gate, and the
    /// version it waits for) without holding a connection; then tried again.
    WaitForPage(Arc<dyn crate::PositionGate>, i64),
}

impl PostgresStore {
    /// A commit that must do more inside its transaction: run a hook (a sink's file) with its
    /// commit mark, and move a reading flow's position (last, after waiting for the page before
    /// it; refused, the whole transaction rolls back). One explicit transaction (a few more
    /// round trips than a plain commit), which holds a hook attempt's advisory lock until it
    /// ends (see `flows::commit_recorded`), sealed as it commits (`commit_time.rs`).
    ///
    /// A page waits for the page before it for at most [`PAGE_WAIT_IN_TRANSACTION`] with its
    /// transaction open; past that the transaction rolls back and the connection goes back to
    /// the pool ([`Committed::WaitForPage`]): pages in flight together never hold the pool's
    /// connections while the page they wait for needs one.
    async fn commit_in_transaction(
        &self,
        client: &mut Client,
        width: i64,
        batch: &CommitBatch,
        arguments: &commit::Arguments<'_>,
    ) -> Result<Committed, StoreError> {
        let mut attempts_left = 2;
        loop {
            attempts_left -= 1;
            let tx = client.transaction().await?;
            // Columns a new schema revision added while the flow runs, before anything else
            // (an `ALTER TABLE` waits for the table's other writers and readers, so it is
            // taken while this transaction holds nothing they wait for, and waits at most
            // `GROW_LOCK_WAIT`: past it the commit fails as unavailable and is retried,
            // rather than queue every other commit of the table behind a long reader).
            if let Some(query) = batch.typed.as_ref().filter(|q| !q.grown.is_empty()) {
                let columns: Vec<_> = query.select.iter().map(|(c, _)| c.clone()).collect();
                tx.batch_execute(GROW_LOCK_WAIT).await?;
                super::typed::evolve(&tx, &batch.table, &columns).await?;
                tx.batch_execute("SET LOCAL lock_timeout TO DEFAULT")
                    .await?;
            }
            if let Some(hook) = &batch.hook {
                // Held until this transaction ends: `commit_recorded` waits for it.
                tx.execute(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                    &[&flows::COMMIT_ATTEMPT_LOCK, &hook.id()],
                )
                .await?;
            }
            let fresh = match self.run_commit(&tx, batch, arguments).await {
                Err(CommitError::Postgres(error))
                    if error::is_missing_generation(&error) && attempts_left > 0 =>
                {
                    drop(tx);
                    ledger::create_ahead(client, width, self.largest_window_ms()).await?;
                    continue;
                }
                Err(CommitError::Record(error)) => {
                    // Rolled back first: the failed statement aborted the transaction.
                    tx.rollback().await?;
                    return Err(named_record_error(&*client, batch, error).await);
                }
                other => other?.ok_or(StoreError::Stale)?,
            };
            let mut written = commit::outcome(batch, &arguments.firsts, &fresh.keys);
            let filtered = fresh.filtered(batch, &written);
            // The caller's own writes for the new rows (a library job), in this transaction.
            match &batch.work {
                None => {}
                Some(crate::TransactionWork::Postgres(work)) => {
                    work.write(&tx, &crate::work::new_rows(batch, &written))
                        .await?;
                    // A statement of the work that failed (its error swallowed) aborted the
                    // transaction, and COMMIT would then roll it back without a word: refuse.
                    tx.batch_execute("SELECT 1").await?;
                }
                Some(crate::TransactionWork::Sqlite(_)) => {
                    return Err(StoreError::Config(
                        "work for a SQLite transaction given to a PostgreSQL store".to_owned(),
                    ));
                }
            }
            if let Some(hook) = &batch.hook {
                // The hook writes and syncs a file: off the async threads, which other commits
                // need meanwhile.
                let (work, id) = (hook.clone(), hook.id().to_owned());
                let done = tokio::task::spawn_blocking(move || {
                    work.before_commit(&written).map(|()| written)
                })
                .await
                .map_err(|e| format!("panicked: {e}"))
                .and_then(|result| result);
                written =
                    done.map_err(|e| StoreError::Unavailable(format!("commit hook {id}: {e}")))?;
                tx.execute(
                    "INSERT INTO sluice_commit_marks (flow_id, commit_id) VALUES ($1, $2)",
                    &[&batch.flow.id, &hook.id()],
                )
                .await?;
            }
            // Last, so that pages in flight together overlap their work and move the position
            // in order, each after the one before it committed.
            if let Some(advance) = &batch.position {
                if let Some(gate) = &batch.position_gate {
                    let version = advance.expected_version;
                    match tokio::time::timeout(PAGE_WAIT_IN_TRANSACTION, gate.wait(version)).await {
                        Ok(true) => {}
                        Ok(false) => return Err(StoreError::Moved),
                        Err(_) => return Ok(Committed::WaitForPage(gate.clone(), version)),
                    }
                }
                feed::advance(&tx, batch.flow.id, advance).await?;
            }
            match self.seal(&tx, width, batch, arguments, &written).await {
                Err(error) if error::is_missing_generation(&error) && attempts_left > 0 => {
                    drop(tx);
                    ledger::create_ahead(client, width, self.largest_window_ms()).await?;
                    continue;
                }
                Err(error) => return Err(error.into()),
                Ok(false) => return Err(StoreError::Stale),
                Ok(true) => {}
            }
            tx.commit().await?;
            return Ok(Committed::Done(CommitOutcome { written, filtered }));
        }
    }

    /// One attempt at `batch`: committed, or rolled back to wait, without a connection, for
    /// the page before it.
    async fn commit_once(&self, batch: &CommitBatch) -> Result<Committed, StoreError> {
        let (mut client, width) = self.ready().await?;
        // Pages of a reading flow in flight together take different shards: a page waiting for
        // the one before it must not hold a counter row that one needs.
        let shard = match &batch.position {
            Some(advance) => i32::try_from(
                advance
                    .expected_version
                    .rem_euclid(commit::COUNTER_SHARDS.into()),
            )
            .unwrap_or_default(),
            None => rand::random_range(0..commit::COUNTER_SHARDS),
        };
        let deadline = self.server_deadline(&client, batch).await?;
        let arguments = commit::Arguments::new(batch, width, shard, deadline);
        if arguments.window_ms() > self.largest_window_ms() {
            ledger::record_window(&client, arguments.window_ms()).await?;
            self.largest_window_ms
                .fetch_max(arguments.window_ms(), Ordering::Relaxed);
        }
        let grows = batch.typed.as_ref().is_some_and(|q| !q.grown.is_empty());
        if batch.hook.is_some() || batch.position.is_some() || batch.work.is_some() || grows {
            return self
                .commit_in_transaction(&mut client, width, batch, &arguments)
                .await;
        }
        let fresh = match self.run_commit(&client, batch, &arguments).await {
            Err(CommitError::Postgres(error)) if error::is_missing_generation(&error) => {
                // The upkeep holder is late (or this is the first commit after a long pause):
                // create what is missing and try once more.
                ledger::create_ahead(&mut client, width, self.largest_window_ms()).await?;
                self.run_commit(&client, batch, &arguments).await
            }
            other => other,
        };
        let fresh = match fresh {
            Err(CommitError::Record(error)) => {
                return Err(named_record_error(&client, batch, error).await);
            }
            other => other?,
        }
        .ok_or(StoreError::Stale)?;
        let written = commit::outcome(batch, &arguments.firsts, &fresh.keys);
        Ok(Committed::Done(CommitOutcome {
            filtered: fresh.filtered(batch, &written),
            written,
        }))
    }

    /// Runs [`commit::SEAL`] in `tx`: `false` if the batch is past its deadline now.
    async fn seal(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        width: i64,
        batch: &CommitBatch,
        arguments: &commit::Arguments<'_>,
        written: &[bool],
    ) -> Result<bool, tokio_postgres::Error> {
        let won: Vec<&str> = batch
            .entries
            .iter()
            .zip(written)
            .filter(|(_, written)| **written)
            .map(|(entry, _)| entry.key.as_str())
            .collect();
        let statement = tx.prepare_cached(commit::SEAL).await?;
        let row = tx
            .query_one(
                &statement,
                &[
                    &arguments.commit_by_ms(),
                    &batch.flow.id,
                    &arguments.window_ms(),
                    &won,
                    &width,
                    &crate::RESTAMP_AFTER_MS,
                ],
            )
            .await?;
        row.try_get(0)
    }

    /// Runs the commit statement: the keys the ledger let through and the rows written, or
    /// `None` when the batch was past its deadline (nothing written). A typed table's record
    /// that fails its query is [`CommitError::Record`]: the caller names it
    /// ([`StoreError::Record`]) once the transaction the statement ran in has ended.
    async fn run_commit(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        batch: &CommitBatch,
        arguments: &commit::Arguments<'_>,
    ) -> Result<Option<Fresh>, CommitError> {
        let dead_letter = format!("{}__dead_letter", batch.flow.pipeline);
        let rows = match (&batch.work, &batch.typed) {
            (Some(_), _) => commit::Rows::None,
            (None, Some(query)) => commit::Rows::Typed(&batch.table, query),
            (None, None) => commit::Rows::Envelope(&batch.table),
        };
        let statement = client
            .prepare_cached(&commit::statement(rows, &dead_letter))
            .await?;
        let flow: &str = &batch.flow.name;
        let fields = batch
            .typed
            .as_deref()
            .map(|query| typed_rows::FieldArrays::new(batch, query, &arguments.firsts));
        let verdicts = batch
            .typed
            .as_deref()
            .filter(|query| !query.expectations.is_empty())
            .map(|query| expectation_counts::Verdicts::new(batch, query, &arguments.firsts));
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            arguments.params(&batch.flow.id, &flow).to_vec();
        if let Some(fields) = &fields {
            params.extend(fields.params());
        }
        if let Some(verdicts) = &verdicts {
            params.extend(verdicts.params());
        }
        let result = client.query(&statement, &params).await;
        let rows = match (result, &batch.typed) {
            // Found by the caller, outside this statement's transaction (which is aborted).
            (Err(error), Some(_)) if typed_rows::is_record_error(&error) => {
                return Err(CommitError::Record(error));
            }
            (result, _) => result?,
        };
        // Keys won, or one NULL when the batch was past its deadline (nothing written).
        let mut keys = Vec::with_capacity(rows.len());
        let mut rows_written = 0;
        for row in &rows {
            keys.push(row.try_get::<_, Option<String>>(0)?);
            rows_written = row.try_get::<_, i64>(1)?;
        }
        Ok(keys
            .into_iter()
            .collect::<Option<Vec<String>>>()
            .map(|keys| Fresh { keys, rows_written }))
    }

    /// The batch's commit deadline on the server's clock, measuring the clock first if it
    /// never was.
    async fn server_deadline(
        &self,
        client: &Client,
        batch: &CommitBatch,
    ) -> Result<Option<i64>, StoreError> {
        let Some(local) = batch.commit_by_ms else {
            return Ok(None);
        };
        if !self.server_clock.is_measured() {
            self.server_clock.measure(client).await?;
        }
        Ok(Some(self.server_clock.to_server(local)))
    }
}
