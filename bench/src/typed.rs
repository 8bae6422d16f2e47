//! `sluice bench typed`: what decoding and a query cost. The same JSON orders (5 fields) drained
//! through sluice's whole path from an in-process source (no emulator in the way), landed
//! twice: as bytes in an envelope table, and decoded into a typed table of 5 columns through a
//! `select:` and a `where:` evaluated by the store. The ratio typed / bytes, per store, in one
//! run; the two alternate in each round (bytes first in odd rounds, typed first in even ones)
//! and the medians are printed.

use crate::drain::{Measured, Progress, sluice_drain};
use crate::error::BenchError;
use crate::stores::{Backend, StoreChoice};
use bytes::Bytes;
use sluice_engine::{InProcessSource, JsonFields, SourceMessage};
use sluice_store::{ColumnType, Sql, TypedColumn, TypedQuery, TypedTable};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Options of `sluice bench typed`.
#[derive(Debug, Clone, clap::Args)]
pub struct TypedArgs {
    /// Messages per drain.
    #[arg(long, default_value_t = 200_000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub messages: usize,
    /// Rounds (each drains both shapes).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Stores to measure: `sqlite`, or `postgres` (PostgreSQL and SQLite side by side).
    #[arg(long, value_enum, default_value_t = StoreChoice::Sqlite)]
    pub store: StoreChoice,
    /// Administrative URL of the PostgreSQL server that holds the scratch databases.
    #[arg(long, default_value = sluice_store::DEFAULT_SCRATCH_SERVER)]
    pub postgres: String,
}

/// A typed table and the flow that fills it, as the worker would run it.
pub(crate) struct TypedShape {
    /// The table's declared columns.
    pub(crate) table: TypedTable,
    /// The payload's decoder.
    pub(crate) fields: Arc<JsonFields>,
    /// The query the store writes rows with.
    pub(crate) query: Arc<TypedQuery>,
}

fn column(name: &str, ty: ColumnType) -> TypedColumn {
    TypedColumn {
        name: name.to_owned(),
        ty,
        nullable: true,
    }
}

/// `orders(order_id text, cents integer, qty integer, region text, ts timestamp)` from the
/// fields `order_id, amount, qty, region, ts`: `cents` is `CAST(amount * 100 AS integer)`,
/// `region` `upper(region)`, the others as decoded; `where amount > 0` (every order passes).
/// The expressions are written as `sluice_pipeline`'s compiler writes them out.
pub(crate) fn orders_shape() -> TypedShape {
    let fields = vec![
        ("order_id".to_owned(), ColumnType::Text),
        ("amount".to_owned(), ColumnType::Numeric),
        ("qty".to_owned(), ColumnType::Integer),
        ("region".to_owned(), ColumnType::Text),
        ("ts".to_owned(), ColumnType::Timestamp),
    ];
    let columns = vec![
        column("order_id", ColumnType::Text),
        column("cents", ColumnType::Integer),
        column("qty", ColumnType::Integer),
        column("region", ColumnType::Text),
        column("ts", ColumnType::Timestamp),
    ];
    let same = |both: &str| Sql {
        postgres: both.to_owned(),
        sqlite: both.to_owned(),
    };
    let select = vec![
        (columns[0].clone(), same("\"order_id\"")),
        (
            columns[1].clone(),
            Sql {
                postgres: "CAST((\"amount\" * 100) AS BIGINT)".to_owned(),
                sqlite: "sluice_cast_integer((\"amount\" * 100))".to_owned(),
            },
        ),
        (columns[2].clone(), same("\"qty\"")),
        (columns[3].clone(), same("upper(\"region\")")),
        (columns[4].clone(), same("\"ts\"")),
    ];
    TypedShape {
        table: TypedTable {
            target: "events".to_owned(),
            columns,
        },
        fields: Arc::new(JsonFields::new(fields.clone())),
        query: Arc::new(TypedQuery {
            fields,
            select,
            filter: Some(same("(\"amount\" > 0)")),
            expectations: Vec::new(),
        }),
    }
}

/// Order `i`'s key (10 % of the orders a publisher's repeat of an earlier one) and its JSON.
pub(crate) fn order_json(i: usize) -> (String, String) {
    let order = if i % 10 == 9 { i / 10 } else { i };
    let payload = format!(
        r#"{{"order_id":"o{order}","amount":{}.{:02},"qty":{},"region":"r{}","ts":"2026-12-04T10:{:02}:{:02}Z"}}"#,
        1 + order % 500,
        order % 100,
        order % 7,
        order % 5,
        order % 60,
        order % 60
    );
    (format!("o{order}"), payload)
}

/// `n` JSON orders ([`order_json`]), the key in the attribute `key`.
pub(crate) fn orders(n: usize) -> InProcessSource {
    let now = sluice_engine::now_ms();
    InProcessSource::new(
        (0..n)
            .map(|i| {
                let (key, payload) = order_json(i);
                SourceMessage {
                    message_id: format!("m{i}"),
                    publish_time_ms: now,
                    attributes: BTreeMap::from([("key".to_owned(), key)]),
                    data: Bytes::from(payload),
                    event_time_ms: None,
                    problem: None,
                }
            })
            .collect(),
    )
}

/// A silver table `copies(order_id text, doubled integer, region text)` filled from the typed
/// `events` of [`orders_shape`] by a `table` flow: `doubled` is `cents * 2`, `where qty >= 0`
/// (every row passes). Its fields are `events`' columns, read from the feed's JSON objects.
pub(crate) fn silver_shape() -> TypedShape {
    let events = orders_shape().table.columns;
    let fields: Vec<(String, ColumnType)> = events.iter().map(|c| (c.name.clone(), c.ty)).collect();
    let columns = vec![
        column("order_id", ColumnType::Text),
        column("doubled", ColumnType::Integer),
        column("region", ColumnType::Text),
    ];
    let same = |both: &str| Sql {
        postgres: both.to_owned(),
        sqlite: both.to_owned(),
    };
    TypedShape {
        table: TypedTable {
            target: "copies".to_owned(),
            columns: columns.clone(),
        },
        fields: Arc::new(JsonFields::new(fields.clone())),
        query: Arc::new(TypedQuery {
            fields,
            select: vec![
                (columns[0].clone(), same("\"order_id\"")),
                (columns[1].clone(), same("(\"cents\" * 2)")),
                (columns[2].clone(), same("\"region\"")),
            ],
            filter: Some(same("(\"qty\" >= 0)")),
            expectations: Vec::new(),
        }),
    }
}

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the benchmark and prints its table.
pub async fn typed(args: TypedArgs) -> Result<(), BenchError> {
    let n = args.messages;
    let shape = orders_shape();
    println!(
        "messages {n} (JSON orders, 5 fields, 10% publisher repeats), rounds {}",
        args.rounds
    );
    println!();
    println!(
        "| store | bytes (envelope) msg/s | typed (5 columns, select + where) msg/s | typed / bytes |"
    );
    println!("|---|---|---|---|");
    for backend in args.store.backends() {
        let (mut bytes, mut typed) = (Vec::new(), Vec::new());
        for round in 0..args.rounds.max(1) {
            let order: [Option<&TypedShape>; 2] = if round % 2 == 0 {
                [None, Some(&shape)]
            } else {
                [Some(&shape), None]
            };
            for which in order {
                let m: Measured = sluice_drain(
                    Box::new(orders(n)),
                    n,
                    backend,
                    &args.postgres,
                    Progress::None,
                    which,
                )
                .await?;
                let rate = n as f64 / m.wall.as_secs_f64().max(1e-9);
                match which {
                    None => bytes.push(rate),
                    Some(_) => typed.push(rate),
                }
            }
        }
        let (b, t) = (median(bytes), median(typed));
        println!(
            "| {} | {b:.0} | {t:.0} | {:.2} |",
            backend_name(backend),
            t / b.max(1e-9)
        );
    }
    Ok(())
}

fn backend_name(backend: Backend) -> &'static str {
    backend.name()
}
