//! The dedup ledger on PostgreSQL: time-partitioned so that expired keys leave by dropping whole
//! tables, never by row deletes (no long locks, no bloat, no vacuum debt).
//!
//! # How a key is claimed
//!
//! Time (the database server's clock, shared by all replicas) is cut into **generations** of
//! width `G` (`ledger_generation`, default 10 minutes); generation `g` is the partition
//! `sluice_ledger_g<g>`. A batch committed at server time `t` with dedup window `W` claims each
//! of its keys in **every** generation from `⌊t/G⌋` to `⌊(t+W)/G⌋` (two for `W = G`), each claim
//! being an insert that takes over only an expired row. A key is new only if all its claims
//! succeeded; the later generations are claimed only for keys that won the first, so an
//! ordinary duplicate writes nothing.
//!
//! Why that is exactly-once: take two commits of one key at server times `t1 ≤ t2 < t1 + W`.
//! Generation `⌊t2/G⌋` lies in the range of both, so both insert the same primary key
//! `(generation, flow, key)`. PostgreSQL's unique index makes the second inserter wait for the
//! first transaction; once that committed, the second finds a row expiring at `t1 + W > t2`
//! (or `t2 + W > t1`), does not take it over, and its key counts as a duplicate, whichever of
//! the two started first. If `t2 ≥ t1 + W` the row has expired and is taken over: the window
//! has passed, as on SQLite. A row left in a first generation by a commit that then lost a
//! later one expires no later than the winner's rows (it started earlier), so it never
//! stretches a window.
//!
//! # Upkeep
//!
//! Statements only ever touch generations from the current one on, so a generation is detached
//! with `DETACH PARTITION ... CONCURRENTLY` (no lock that blocks inserts, and it waits for
//! statements still using it) and dropped once it ended [`DROP_GRACE_MS`] ago (a generation's
//! width if that is shorter).
//! Generations are created ahead of need (the current one up to the one holding now + the
//! largest window any replica has committed with, recorded in `sluice_settings`, +
//! [`AHEAD_MS`]) by `CREATE TABLE` then `ATTACH PARTITION` (again without a
//! lock that blocks inserts). One replica does this under the `ledger_upkeep` lease; a commit
//! that still finds its generation missing creates it and retries.

use crate::StoreError;
use deadpool_postgres::Client;
use std::collections::BTreeMap;

/// Advisory lock held while a generation is created (`"sluice"`, then 2).
const GENERATION_LOCK: i64 = 0x736c_7569_6365_0002;
/// How long after its end a generation is dropped: far longer than any statement runs.
pub(crate) const DROP_GRACE_MS: i64 = 60 * 1000;
/// Session advisory lock held while generations are dropped (`"sluice"`, then 3): detaching
/// cannot run in a transaction, and two replicas detaching one table at once fail.
const DROP_LOCK: i64 = 0x736c_7569_6365_0003;
/// How far beyond the largest window generations are created ahead of need, in ms (at least
/// two generations): well beyond a lease takeover, so a dead upkeep holder never leaves
/// commits without a partition.
const AHEAD_MS: i64 = 60 * 1000;

/// Name of generation `g`'s partition (an integer, so safe to splice).
fn partition(generation: i64) -> String {
    format!("sluice_ledger_g{generation}")
}

/// State of one generation's table as the catalog tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    Attached,
    DetachPending,
    Detached,
}

/// Generation tables present, by generation.
async fn tables(client: &Client) -> Result<BTreeMap<i64, Table>, StoreError> {
    let rows = client
        .query(
            "SELECT c.relname, i.inhrelid IS NOT NULL, COALESCE(i.inhdetachpending, false)
             FROM pg_class c LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
             WHERE c.relkind = 'r' AND c.relname LIKE 'sluice\\_ledger\\_g%'
               AND pg_table_is_visible(c.oid)",
            &[],
        )
        .await?;
    let mut found = BTreeMap::new();
    for row in rows {
        let name: String = row.try_get(0)?;
        let attached: bool = row.try_get(1)?;
        let pending: bool = row.try_get(2)?;
        if let Some(generation) = name
            .strip_prefix("sluice_ledger_g")
            .and_then(|g| g.parse::<i64>().ok())
        {
            let state = match (attached, pending) {
                (true, false) => Table::Attached,
                (true, true) => Table::DetachPending,
                (false, _) => Table::Detached,
            };
            found.insert(generation, state);
        }
    }
    Ok(found)
}

/// The database server's clock, ms since the epoch.
pub(crate) async fn server_now_ms(client: &Client) -> Result<i64, StoreError> {
    Ok(client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
            &[],
        )
        .await?
        .try_get(0)?)
}

/// The `sluice_settings` row holding the largest dedup window any replica has committed with.
const LARGEST_WINDOW_SETTING: &str = "ledger_largest_window_ms";

/// Records that a commit used a window of `window_ms`, unless a larger one is recorded: the
/// upkeep holder creates generations ahead for the largest window any replica uses, not only
/// for the windows its own commits used (a holder that took the lease before committing
/// anything would otherwise create only [`AHEAD_MS`] ahead).
pub(crate) async fn record_window(client: &Client, window_ms: i64) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO sluice_settings AS s (name, value) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE
                 SET value = GREATEST(s.value::int8, excluded.value::int8)::text",
            &[&LARGEST_WINDOW_SETTING, &window_ms.to_string()],
        )
        .await?;
    Ok(())
}

/// The largest window recorded by [`record_window`], ms (0: none yet).
async fn recorded_window(client: &Client) -> Result<i64, StoreError> {
    let row = client
        .query_opt(
            "SELECT value::int8 FROM sluice_settings WHERE name = $1",
            &[&LARGEST_WINDOW_SETTING],
        )
        .await?;
    Ok(match row {
        Some(row) => row.try_get(0)?,
        None => 0,
    })
}

/// Creates the generations from the current one to the one holding now + the largest window
/// (this replica's `local_window_ms` or the largest any replica recorded) + [`AHEAD_MS`];
/// returns how many it created.
pub(crate) async fn create_ahead(
    client: &mut Client,
    width_ms: i64,
    local_window_ms: i64,
) -> Result<u64, StoreError> {
    let now = server_now_ms(client).await?;
    let window = local_window_ms.max(recorded_window(client).await?);
    let horizon = window.saturating_add(AHEAD_MS).max(2 * width_ms);
    let present = tables(client).await?;
    let first = now / width_ms;
    let last = now.saturating_add(horizon) / width_ms;
    let mut created = 0;
    for generation in first..=last {
        if present.get(&generation) == Some(&Table::Attached) {
            continue;
        }
        if create(client, generation).await? {
            created += 1;
        }
    }
    Ok(created)
}

/// Creates and attaches one generation unless another replica did; true if this call did.
async fn create(client: &mut Client, generation: i64) -> Result<bool, StoreError> {
    let name = partition(generation);
    let tx = client.transaction().await?;
    tx.batch_execute("SET LOCAL lock_timeout = '5s'").await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&GENERATION_LOCK])
        .await?;
    let attached: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE c.relname = $1 AND pg_table_is_visible(c.oid) AND NOT i.inhdetachpending)",
            &[&name],
        )
        .await?
        .try_get(0)?;
    if attached {
        return Ok(false);
    }
    // A table left detached (or half-detached) by an interrupted drop is dropped first: its
    // keys are stale by construction (it was old when the drop began).
    tx.batch_execute(&format!(
        "DROP TABLE IF EXISTS {name};
         CREATE TABLE {name} (
             generation BIGINT NOT NULL CHECK (generation = {generation}),
             flow_id    BIGINT NOT NULL,
             key        TEXT COLLATE \"C\" NOT NULL,
             expires_at BIGINT NOT NULL,
             PRIMARY KEY (generation, flow_id, key)
         );
         ALTER TABLE sluice_ledger ATTACH PARTITION {name} FOR VALUES IN ({generation});"
    ))
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Detaches and drops the generations that ended more than the grace ago; returns how many
/// went.
pub(crate) async fn drop_expired(client: &mut Client, width_ms: i64) -> Result<u64, StoreError> {
    let locked: bool = client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&DROP_LOCK])
        .await?
        .try_get(0)?;
    if !locked {
        // Another replica is dropping right now.
        return Ok(0);
    }
    let dropped = drop_expired_locked(client, width_ms).await;
    // If the unlock fails, the connection is broken, and its session lock went with it.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&DROP_LOCK])
        .await;
    dropped
}

async fn drop_expired_locked(client: &mut Client, width_ms: i64) -> Result<u64, StoreError> {
    let now = server_now_ms(client).await?;
    let grace = DROP_GRACE_MS.min(width_ms);
    let mut dropped = 0;
    for (generation, state) in tables(client).await? {
        let ended_at = generation.saturating_add(1).saturating_mul(width_ms);
        if ended_at.saturating_add(grace) > now {
            break;
        }
        let name = partition(generation);
        match state {
            // Waits for transactions that may still use it, without blocking new inserts.
            // Cannot run inside a transaction block: sent on its own.
            Table::Attached => {
                client
                    .batch_execute(&format!(
                        "ALTER TABLE sluice_ledger DETACH PARTITION {name} CONCURRENTLY"
                    ))
                    .await?
            }
            Table::DetachPending => {
                client
                    .batch_execute(&format!(
                        "ALTER TABLE sluice_ledger DETACH PARTITION {name} FINALIZE"
                    ))
                    .await?
            }
            Table::Detached => {}
        }
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {name}"))
            .await?;
        dropped += 1;
    }
    Ok(dropped)
}

/// Generations currently attached (for tests and capacity notes).
pub(crate) async fn attached(client: &Client) -> Result<Vec<i64>, StoreError> {
    Ok(tables(client)
        .await?
        .into_iter()
        .filter(|(_, state)| *state == Table::Attached)
        .map(|(generation, _)| generation)
        .collect())
}
