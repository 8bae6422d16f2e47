//! Expectations' verdicts on PostgreSQL ([`crate::LedgerStore::violations`]): a read of the
//! flow's output for a batch's rows, outside the commit.

use super::typed_rows::{FieldArrays, is_record_error, rewrite_unused, source_relation};
use crate::typed::TypedQuery;
use crate::{CommitBatch, Effect, StoreError};
use tokio_postgres::types::ToSql;

/// The rows of a batch as the statement's `input` (with `fresh` letting every key through), for
/// reads outside the commit: keys, ids, times, attributes and data bound as `$2..$7`.
const ROWS_AS_INPUT: &str = "WITH input AS (
        SELECT u.key, u.message_id, u.publish_ms, u.event_ms, u.attributes, u.data,
               NULL::text AS reason, u._sluice_n
        FROM unnest($2::text[], $3::text[], $4::int8[], $5::int8[], $6::text[], $7::bytea[])
            WITH ORDINALITY AS u(key, message_id, publish_ms, event_ms, attributes, data, _sluice_n)),
     fresh AS (SELECT DISTINCT key FROM input)";

/// See [`crate::LedgerStore::violations`].
pub(crate) async fn violations(
    client: &impl deadpool_postgres::GenericClient,
    batch: &CommitBatch,
) -> Result<Vec<Vec<bool>>, StoreError> {
    let mut out = vec![Vec::new(); batch.entries.len()];
    let Some(query) = batch.typed.as_deref() else {
        return Ok(out);
    };
    if query.expectations.is_empty() {
        return Ok(out);
    }
    let rows: Vec<usize> = batch
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.effect, Effect::Row { .. }))
        .map(|(i, _)| i)
        .collect();
    // A row `where:` leaves out is not in the output: it gets no verdict (as on SQLite).
    let checks: Vec<&str> = query
        .expectations
        .iter()
        .map(|(_, sql)| sql.postgres.as_str())
        .collect();
    match evaluate(client, batch, query, &rows, &checks).await {
        Ok(found) => {
            for (n, violated) in found {
                out[rows[n]] = violated;
            }
            Ok(out)
        }
        Err(EvalError::Store(error)) => Err(error),
        Err(EvalError::Record(error)) => {
            // Which record, and which check: each alone.
            for &index in &rows {
                for (name, sql) in &query.expectations {
                    if let Err(EvalError::Record(why)) =
                        evaluate(client, batch, query, &[index], &[sql.postgres.as_str()]).await
                    {
                        return Err(StoreError::Record {
                            index,
                            column: crate::typed::expectation_column(name),
                            error: why,
                        });
                    }
                }
            }
            Err(StoreError::Rejected(error))
        }
    }
}

enum EvalError {
    /// A record's values made an expression fail (the server's message).
    Record(String),
    Store(StoreError),
}

/// Whether each of `checks` is false, over the rows at `indexes`: per row (its position in
/// `indexes`), the results.
async fn evaluate(
    client: &impl deadpool_postgres::GenericClient,
    batch: &CommitBatch,
    query: &TypedQuery,
    indexes: &[usize],
    checks: &[&str],
) -> Result<Vec<(usize, Vec<bool>)>, EvalError> {
    let entries: Vec<&crate::Entry> = indexes.iter().map(|&i| &batch.entries[i]).collect();
    let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
    let ids: Vec<&str> = entries
        .iter()
        .map(|e| e.message.message_id.as_str())
        .collect();
    let publish: Vec<i64> = entries.iter().map(|e| e.message.publish_time_ms).collect();
    let event: Vec<i64> = entries
        .iter()
        .map(|e| match e.effect {
            Effect::Row { event_time_ms, .. } => event_time_ms,
            Effect::DeadLetter { .. } => e.message.publish_time_ms,
        })
        .collect();
    let attributes: Vec<&str> = entries
        .iter()
        .map(|e| e.message.attributes_json.as_str())
        .collect();
    let data: Vec<&[u8]> = entries.iter().map(|e| e.message.data.as_ref()).collect();
    let arrays = FieldArrays::new(batch, query, indexes);
    let padding: Vec<Option<String>> = vec![None; 12];
    let none: Option<i64> = None;
    let mut params: Vec<&(dyn ToSql + Sync)> =
        vec![&none, &keys, &ids, &publish, &event, &attributes, &data];
    params.extend(padding.iter().map(|p| p as &(dyn ToSql + Sync)));
    params.extend(arrays.params());
    let tests: String = checks
        .iter()
        .map(|check| format!(", ({check}) IS FALSE"))
        .collect();
    let output = crate::typed::output_columns(query, "s._sluice_row", |e| &e.postgres);
    let text = rewrite_unused(&format!(
        "{ROWS_AS_INPUT} SELECT o._sluice_row, o._sluice_kept{tests}
         FROM (SELECT {output} FROM ({}) s) o",
        source_relation(query)
    ));
    let statement = client
        .prepare(&text)
        .await
        .map_err(|e| EvalError::Store(e.into()))?;
    let found = match client.query(&statement, &params).await {
        Ok(found) => found,
        Err(error) if is_record_error(&error) => {
            return Err(EvalError::Record(
                error
                    .as_db_error()
                    .map_or_else(|| error.to_string(), |db| db.message().to_owned()),
            ));
        }
        Err(error) => return Err(EvalError::Store(error.into())),
    };
    let count = checks.len();
    found
        .iter()
        .map(|row| {
            let n: i64 = row.try_get(0)?;
            let violated = if row.try_get::<_, bool>(1)? {
                (2..2 + count)
                    .map(|k| row.try_get::<_, bool>(k))
                    .collect::<Result<Vec<bool>, _>>()?
            } else {
                Vec::new()
            };
            Ok((usize::try_from(n - 1).unwrap_or(0), violated))
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(|e| EvalError::Store(e.into()))
}
