//! Expectation counts on PostgreSQL (see [`crate::CommitBatch::verdicts`]): a step of the
//! commit statement adds the verdicts of the entries whose key is new (sharded like the flow's
//! counters), and `sluice status` reads their sums.

use crate::typed::TypedQuery;
use crate::{CommitBatch, ExpectationCount, StoreError};
use tokio_postgres::types::ToSql;

/// Most expectations a flow's verdicts carry: one bit each in an `int8`.
pub(crate) const MOST: usize = 63;

/// The verdicts of the statement's input rows: per row a mask (bit `j`: expectation `j`
/// violated; NULL: no verdict), and the expectations' names.
pub(crate) struct Verdicts {
    masks: Vec<Option<i64>>,
    names: Vec<String>,
}

impl Verdicts {
    /// The verdicts of the entries at `firsts` (the statement's input rows, in order).
    pub(crate) fn new(batch: &CommitBatch, query: &TypedQuery, firsts: &[usize]) -> Self {
        let masks = firsts
            .iter()
            .map(|&index| {
                let verdict = batch.verdicts.get(index).filter(|v| !v.is_empty())?;
                Some(
                    verdict
                        .iter()
                        .take(MOST)
                        .enumerate()
                        .filter(|(_, violated)| **violated)
                        .fold(0i64, |mask, (j, _)| mask | (1 << j)),
                )
            })
            .collect();
        let names = query
            .expectations
            .iter()
            .take(MOST)
            .map(|(name, _)| name.clone())
            .collect();
        Self { masks, names }
    }

    /// The two parameters after the field arrays.
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 2] {
        [&self.masks, &self.names]
    }
}

/// The commit statement's step counting verdicts, its masks and names bound as `$first` and
/// `$first + 1`; `None` for a flow without expectations. Rows are upserted in name order, so
/// two commits of one shard never lock them in opposite orders.
pub(crate) fn step(query: &TypedQuery, first: usize) -> Option<String> {
    if query.expectations.is_empty() {
        return None;
    }
    let names = first + 1;
    Some(format!(
        "INSERT INTO sluice_expectation_counts AS e (flow_id, expectation, shard, passed,
                                                      violated)
         SELECT $1, x.name, $14,
                count(*) FILTER (WHERE (v.mask >> (x.j - 1)::int) & 1 = 0),
                count(*) FILTER (WHERE (v.mask >> (x.j - 1)::int) & 1 = 1)
         FROM input i JOIN fresh f ON f.key = i.key
         JOIN unnest(${first}::int8[]) WITH ORDINALITY AS v(mask, n) ON v.n = i._sluice_n
         CROSS JOIN unnest(${names}::text[]) WITH ORDINALITY AS x(name, j)
         WHERE v.mask IS NOT NULL
         GROUP BY x.name
         ORDER BY x.name
         ON CONFLICT (flow_id, expectation, shard) DO UPDATE SET
             passed = e.passed + excluded.passed, violated = e.violated + excluded.violated"
    ))
}

/// The flow's counts, by expectation name.
pub(crate) async fn read(
    client: &impl deadpool_postgres::GenericClient,
    flow_id: i64,
) -> Result<Vec<ExpectationCount>, StoreError> {
    let rows = client
        .query(
            "SELECT expectation, sum(passed)::int8, sum(violated)::int8
             FROM sluice_expectation_counts WHERE flow_id = $1
             GROUP BY expectation ORDER BY expectation",
            &[&flow_id],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(ExpectationCount {
                expectation: row.try_get(0)?,
                passed: u64::try_from(row.try_get::<_, i64>(1)?).unwrap_or_default(),
                violated: u64::try_from(row.try_get::<_, i64>(2)?).unwrap_or_default(),
            })
        })
        .collect()
}
