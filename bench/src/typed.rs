//! `sluice bench typed`: what decoding and a query cost. The same orders (5 fields) drained
//! through sluice's whole path from an in-process source (no emulator in the way), landed
//! three ways: JSON as bytes in an envelope table; JSON decoded into a typed table of 5 columns
//! through a `select:` and a `where:` evaluated by the store; and the same orders as Avro
//! binary datums (what Pub/Sub carries for a topic with an Avro schema) decoded by a schema
//! into the same table. The ratios typed / bytes, per store, in one run; the shapes take turns
//! in each round (a different one first each round) and the medians are printed.

use crate::drain::{Measured, Progress, sluice_drain};
use crate::error::BenchError;
use crate::stores::{Backend, StoreChoice};
use bytes::Bytes;
use sluice_engine::{
    AvroRecord, CompiledSchema, InProcessSource, JsonFields, PayloadDecoder, SchemaFileDecoder,
    SourceMessage,
};
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
    pub(crate) fields: Arc<dyn PayloadDecoder>,
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
            keys: Vec::new(),
        },
        fields: Arc::new(JsonFields::new(fields.clone())),
        query: Arc::new(TypedQuery {
            fields,
            select,
            filter: Some(same("(\"amount\" > 0)")),
            expectations: Vec::new(),
            grown: Vec::new(),
            changes: None,
        }),
    }
}

/// The orders' Avro schema: `amount` a decimal of scale 2, `ts` a `timestamp-millis`.
const ORDER_AVRO: &str = r#"{"type":"record","name":"Order","fields":[
    {"name":"order_id","type":"string"},
    {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
    {"name":"qty","type":"long"},
    {"name":"region","type":"string"},
    {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

/// [`orders_shape`] decoding Avro datums of [`ORDER_AVRO`].
pub(crate) fn avro_orders_shape() -> Result<TypedShape, BenchError> {
    let mut shape = orders_shape();
    let schema = AvroRecord::parse(ORDER_AVRO).map_err(BenchError::Setup)?;
    let decoder = SchemaFileDecoder::new(CompiledSchema::Avro(schema), shape.query.fields.clone())
        .map_err(BenchError::Setup)?;
    shape.fields = Arc::new(decoder);
    Ok(shape)
}

/// Order `i` as an Avro datum of [`ORDER_AVRO`], with the values of [`order_json`].
fn order_avro(i: usize, schema: &apache_avro::Schema) -> Result<Vec<u8>, BenchError> {
    use apache_avro::types::Value;
    let order = if i % 10 == 9 { i / 10 } else { i };
    let cents = i64::try_from((1 + order % 500) * 100 + order % 100).unwrap_or(0);
    let second = i64::try_from(order % 60).unwrap_or(0);
    let record = Value::Record(vec![
        ("order_id".to_owned(), Value::String(format!("o{order}"))),
        (
            "amount".to_owned(),
            Value::Decimal(apache_avro::Decimal::from(cents.to_be_bytes().to_vec())),
        ),
        (
            "qty".to_owned(),
            Value::Long(i64::try_from(order % 7).unwrap_or(0)),
        ),
        (
            "region".to_owned(),
            Value::String(format!("r{}", order % 5)),
        ),
        (
            "ts".to_owned(),
            Value::TimestampMillis(1_796_378_400_000 + second * 61_000),
        ),
    ]);
    apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(record))
        .map_err(|e| BenchError::Setup(format!("an Avro order: {e}")))
}

/// `n` Avro orders ([`order_avro`]), the key in the attribute `key`.
pub(crate) fn avro_orders(n: usize) -> Result<InProcessSource, BenchError> {
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO)
        .map_err(|e| BenchError::Setup(format!("the orders' Avro schema: {e}")))?;
    let now = sluice_engine::now_ms();
    let messages = (0..n)
        .map(|i| {
            let (key, _) = order_json(i);
            Ok(SourceMessage {
                message_id: format!("m{i}"),
                publish_time_ms: now,
                attributes: BTreeMap::from([("key".to_owned(), key)]),
                data: Bytes::from(order_avro(i, &schema)?),
                event_time_ms: None,
                problem: None,
            })
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    Ok(InProcessSource::new(messages))
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
            keys: Vec::new(),
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
            grown: Vec::new(),
            changes: None,
        }),
    }
}

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}

/// What one drain lands.
#[derive(Clone, Copy)]
enum Shape {
    Bytes,
    Json,
    Avro,
}

/// Runs the benchmark and prints its table.
pub async fn typed(args: TypedArgs) -> Result<(), BenchError> {
    let n = args.messages;
    let (json, avro) = (orders_shape(), avro_orders_shape()?);
    println!(
        "messages {n} (orders, 5 fields, 10% publisher repeats; JSON, and Avro binary), rounds {}",
        args.rounds
    );
    println!();
    println!(
        "| store | bytes (envelope) msg/s | typed JSON (5 columns, select + where) msg/s | \
         typed Avro msg/s | JSON / bytes | Avro / bytes |"
    );
    println!("|---|---|---|---|---|---|");
    let shapes = [Shape::Bytes, Shape::Json, Shape::Avro];
    for backend in args.store.backends() {
        let mut rates: [Vec<f64>; 3] = Default::default();
        for round in 0..args.rounds.max(1) {
            for turn in 0..shapes.len() {
                let which = (round + turn) % shapes.len();
                let (source, shape): (InProcessSource, Option<&TypedShape>) = match shapes[which] {
                    Shape::Bytes => (orders(n), None),
                    Shape::Json => (orders(n), Some(&json)),
                    Shape::Avro => (avro_orders(n)?, Some(&avro)),
                };
                let m: Measured = sluice_drain(
                    Box::new(source),
                    n,
                    backend,
                    &args.postgres,
                    Progress::None,
                    shape,
                )
                .await?;
                rates[which].push(n as f64 / m.wall.as_secs_f64().max(1e-9));
            }
        }
        let [b, j, a] = rates.map(median);
        println!(
            "| {} | {b:.0} | {j:.0} | {a:.0} | {:.2} | {:.2} |",
            backend_name(backend),
            j / b.max(1e-9),
            a / b.max(1e-9)
        );
    }
    Ok(())
}

fn backend_name(backend: Backend) -> &'static str {
    backend.name()
}
