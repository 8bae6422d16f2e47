//! The dedup ledger on SQLite: a key is a row of `sluice_ledger` with its expiry; the commit's
//! insert decides duplicates (`commit.rs`), and expired keys leave in small delete steps that
//! the writer thread runs between commits.

use super::{Command, PURGE_CHUNK, SqliteStore, flows, now_ms};
use crate::{
    CommitBatch, CommitOutcome, FlowHandle, FlowProgress, LedgerStore, LedgerUpkeep, StoreError,
};
use async_trait::async_trait;
use rusqlite::{Connection, params};

/// Deletes at most `limit` ledger keys that expired before `now_ms`; returns how many went.
pub(super) fn purge(conn: &Connection, now_ms: i64, limit: usize) -> Result<usize, StoreError> {
    let deleted = conn.execute(
        "DELETE FROM sluice_ledger WHERE (flow_id, key) IN
         (SELECT flow_id, key FROM sluice_ledger WHERE expires_at <= ?1 LIMIT ?2)",
        params![now_ms, i64::try_from(limit).unwrap_or(i64::MAX)],
    )?;
    Ok(deleted)
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn commit(&self, batch: CommitBatch) -> Result<CommitOutcome, StoreError> {
        self.ask(|reply| Command::Commit(Box::new(batch), reply))
            .await
    }

    async fn violations(&self, batch: &CommitBatch) -> Result<Vec<Vec<bool>>, StoreError> {
        if batch
            .typed
            .as_ref()
            .is_none_or(|q| q.expectations.is_empty())
        {
            return Ok(vec![Vec::new(); batch.entries.len()]);
        }
        let batch = batch.clone();
        self.call(move |conn| super::typed::violations(conn, &batch))
            .await
    }

    async fn keys_present(
        &self,
        flow: &FlowHandle,
        table: &str,
        keys: &[String],
    ) -> Result<Vec<bool>, StoreError> {
        let (flow, table, keys) = (flow.clone(), table.to_owned(), keys.to_vec());
        self.call(move |conn| flows::keys_present(conn, &flow, &table, &keys))
            .await
    }

    async fn commit_recorded(
        &self,
        flow: &FlowHandle,
        commit_id: &str,
    ) -> Result<bool, StoreError> {
        let (flow, id) = (flow.clone(), commit_id.to_owned());
        self.call(move |conn| flows::commit_recorded(conn, &flow, &id))
            .await
    }

    async fn flow_progress(&self, flow: &FlowHandle) -> Result<FlowProgress, StoreError> {
        let id = flow.id;
        self.ask(|reply| Command::FlowProgress(id, reply)).await
    }

    async fn expectation_counts(
        &self,
        flow: &FlowHandle,
    ) -> Result<Vec<crate::ExpectationCount>, StoreError> {
        let id = flow.id;
        self.call(move |conn| super::expectation_counts::read(conn, id))
            .await
    }

    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
        // One chunk per call: the writer purges by itself between commits, so a large backlog
        // is never removed in one go that would hold the writer.
        self.call(|conn| {
            Ok(LedgerUpkeep {
                keys_removed: self::purge(conn, now_ms(), PURGE_CHUNK)? as u64,
                ..LedgerUpkeep::default()
            })
        })
        .await
    }
}
