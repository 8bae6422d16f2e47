//! PostgreSQL: a flow's lifecycle beyond commits — forgetting it (`reset FLOW`, `full-refresh`)
//! and asking which keys it has already written.

use crate::schema::{check_table, table_name};
use crate::{FlowHandle, StoreError};
use deadpool_postgres::Client;

/// Deletes the flow's ledger keys (in every generation), counters, completion, dead letters
/// and (with `table`) rows, in one transaction.
pub(super) async fn reset_flow(
    client: &mut Client,
    flow: &FlowHandle,
    table: Option<&str>,
) -> Result<(), StoreError> {
    let dead_letter = table_name(&flow.pipeline, "dead_letter")?;
    if let Some(table) = table {
        check_table(table)?;
    }
    let name: &str = &flow.name;
    let tx = client.transaction().await?;
    tx.execute("DELETE FROM sluice_ledger WHERE flow_id = $1", &[&flow.id])
        .await?;
    tx.execute(
        "DELETE FROM sluice_completions WHERE flow_id = $1",
        &[&flow.id],
    )
    .await?;
    tx.execute(
        "DELETE FROM sluice_flow_counters WHERE flow_id = $1",
        &[&flow.id],
    )
    .await?;
    // Table names are validated identifiers (checked above); values are bound.
    tx.execute(
        &format!("DELETE FROM \"{dead_letter}\" WHERE flow = $1"),
        &[&name],
    )
    .await?;
    if let Some(table) = table {
        tx.execute(
            &format!("DELETE FROM \"{table}\" WHERE flow = $1"),
            &[&name],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// For each key, whether the flow has a row in `table` or a dead letter with it.
pub(super) async fn keys_present(
    client: &Client,
    flow: &FlowHandle,
    table: &str,
    keys: &[String],
) -> Result<Vec<bool>, StoreError> {
    check_table(table)?;
    let dead_letter = table_name(&flow.pipeline, "dead_letter")?;
    let name: &str = &flow.name;
    let sql = format!(
        "SELECT dedup_key FROM \"{table}\" WHERE flow = $1 AND dedup_key = ANY($2)
         UNION
         SELECT dedup_key FROM \"{dead_letter}\" WHERE flow = $1 AND dedup_key = ANY($2)"
    );
    let rows = client.query(&sql, &[&name, &keys]).await?;
    let present = rows
        .iter()
        .map(|row| row.try_get::<_, String>(0))
        .collect::<Result<std::collections::HashSet<_>, _>>()?;
    Ok(keys.iter().map(|k| present.contains(k)).collect())
}
