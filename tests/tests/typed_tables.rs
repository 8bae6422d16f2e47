//! Typed tables end to end: JSON orders from the real emulator decoded into columns, a
//! `select:` computed and a `where:` applied by the store in the commit's transaction; a
//! silver table filled from the typed orders by a `table` source with its own `select:` and
//! `where:` over the orders' columns, holding exactly that function of the orders.
//!
//! * On SQLite (triggered, drains until idle): publisher duplicates land once; a payload whose
//!   amount is not a number is a dead letter `undecodable` naming `$.amount`; a record whose
//!   `CAST(qty AS integer)` fails is a dead letter `expression:qty`; a zero amount is filtered
//!   (counted in the run's summary, no row, acked); every typed value is exact.
//! * On PostgreSQL, two workers, one SIGKILLed right after PostgreSQL shows it inside a
//!   transaction: the same outcome, each order once (the orders flow alone: the chains run in
//!   the pool test below, where the emulator's slow return of a killed stream's messages is
//!   waited out once).
//!
//! Real: the emulator, `sluice` processes, a SQLite file, PostgreSQL on 127.0.0.1:5432.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use sluice_tests::{Db, PgDb, PubSub, Workdir, Worker, emulator, eventually, publish_in_chunks};
use std::time::Duration;

/// Orders `o0..o{n}`: amount `i.25` (0 for every 20th: filtered), `qty` `"x"` for every
/// 100th from 1 (its cast fails), region `r{i % 5}`.
fn order(i: usize) -> Message {
    let amount = if i.is_multiple_of(20) {
        "0".to_owned()
    } else {
        format!("{i}.25")
    };
    let qty = if i % 100 == 1 {
        "x".to_owned()
    } else {
        (i % 7).to_string()
    };
    payload(
        &format!("o{i}"),
        &format!(
            r#"{{"order_id":"o{i}","amount":{amount},"qty":"{qty}","region":"r{}","ts":"2026-12-04T10:{:02}:00Z"}}"#,
            i % 5,
            i % 60
        ),
    )
}

fn payload(order_id: &str, json: &str) -> Message {
    Message::new()
        .set_data(Bytes::from(json.to_owned()))
        .set_attributes([("order_id", order_id.to_owned())])
}

/// `n` orders, `dups` publisher duplicates of them, and `corrupt` orders whose amount is text.
fn messages(n: usize, dups: usize, corrupt: usize) -> Vec<Message> {
    let mut all: Vec<Message> = (0..n).map(order).collect();
    all.extend((0..dups).map(|d| order(d * 7 % n)));
    all.extend((0..corrupt).map(|k| {
        payload(
            &format!("c{k}"),
            &format!(r#"{{"order_id":"c{k}","amount":"abc","qty":"1"}}"#),
        )
    }));
    all
}

/// What the orders that land hold: count and the sum of their cents.
fn expected(n: usize) -> (i64, i64) {
    let landed: Vec<usize> = (0..n).filter(|i| i % 20 != 0 && i % 100 != 1).collect();
    let cents = landed.iter().map(|i| *i as i64 * 100 + 25).sum();
    (landed.len() as i64, cents)
}

/// The view `big` holds the orders of 100 or more, and `big_copy`, filled by a flow reading
/// the view, exactly its rows (with a tag computed from the view's column).
fn the_view_and_its_reader_agree(count: impl Fn(&str) -> i64) {
    let big = count("SELECT COUNT(*) FROM shop__orders WHERE amount >= 100");
    assert!(big > 0);
    assert_eq!(count("SELECT COUNT(*) FROM shop__big"), big);
    assert_eq!(count("SELECT COUNT(*) FROM shop__big_copy"), big);
    assert_eq!(
        count("SELECT COUNT(DISTINCT order_id) FROM shop__big_copy"),
        big
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM shop__big_copy c JOIN shop__orders o ON o.order_id = c.order_id
             WHERE o.amount >= 100 AND c.euros = o.amount
               AND c.tag = CASE WHEN o.amount >= 1000 THEN 'large' ELSE 'medium' END"
        ),
        big
    );
}

/// Silver is exactly f(orders): one row per order outside region R0, with its values.
fn silver_is_f_of_orders(count: impl Fn(&str) -> i64) {
    let expected = count("SELECT COUNT(*) FROM shop__orders WHERE region <> 'R0'");
    assert!(expected > 0);
    assert_eq!(count("SELECT COUNT(*) FROM shop__silver"), expected);
    assert_eq!(
        count("SELECT COUNT(DISTINCT order_id) FROM shop__silver"),
        expected
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM shop__silver s JOIN shop__orders o ON o.order_id = s.order_id
             WHERE o.region <> 'R0' AND s.doubled = o.cents * 2 AND s.ts = o.ts
               AND s.big = (o.qty >= 3) AND s.region = o.region"
        ),
        expected
    );
}

fn pipeline(store: &str, mode: &str, subscription: &str) -> String {
    format!(
        "pipeline: shop
mode: {mode}
store: \"{store}\"
pubsub: {{ project: {project}, endpoint: \"{endpoint}\" }}
targets:
  - name: orders
    kind: table
    columns:
      - {{ name: order_id, type: text, nullable: false }}
      - {{ name: amount, type: numeric }}
      - {{ name: cents, type: integer }}
      - {{ name: qty, type: integer }}
      - {{ name: region, type: text }}
      - {{ name: ts, type: timestamp }}
  - name: silver
    kind: table
    columns:
      - {{ name: order_id, type: text, nullable: false }}
      - {{ name: doubled, type: integer }}
      - {{ name: big, type: boolean }}
      - {{ name: region, type: text }}
      - {{ name: ts, type: timestamp }}
  - name: big
    kind: view
    columns:
      - {{ name: order_id, type: text }}
      - {{ name: euros, type: numeric }}
  - name: big_copy
    kind: table
    columns:
      - {{ name: order_id, type: text }}
      - {{ name: euros, type: numeric }}
      - {{ name: tag, type: text }}
flows:
  - name: big_orders
    target: big
    source: {{ table: orders }}
    select: {{ euros: \"amount\" }}
    where: \"amount >= 100\"
  - name: from_view
    target: big_copy
    source: {{ table: big }}
    select: {{ tag: \"CASE WHEN euros >= 1000 THEN 'large' ELSE 'medium' END\" }}
  - name: clean
    target: silver
    source: {{ table: orders }}
    select:
      doubled: \"cents * 2\"
      big: \"qty >= 3\"
    where: \"region <> 'R0'\"
  - name: orders
    target: orders
    source:
      pubsub:
        subscription: {subscription}
        dedup: {{ by: attribute, attribute: order_id }}
        drain_idle: 15s
    decode:
      format: json
      fields: {{ order_id: text, amount: numeric, qty: text, region: text, ts: timestamp }}
    select:
      cents: \"CAST(amount * 100 AS integer)\"
      qty: \"CAST(qty AS integer)\"
      region: \"upper(region)\"
    where: \"amount > 0\"
",
        project = sluice_tests::PROJECT,
        endpoint = emulator().endpoint(),
    )
}

/// `pipeline` with the orders flow alone (no silver, no view and its reader).
fn orders_only(pipeline: &str) -> String {
    let chains = pipeline.find("  - name: silver\n").unwrap();
    let orders = pipeline
        .find("  - name: orders\n    target: orders")
        .unwrap();
    format!("{}flows:\n{}", &pipeline[..chains], &pipeline[orders..])
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_orders_land_exactly_once_on_sqlite() {
    const ORDERS: usize = 2_000;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("typed", 1).await;
    pubsub.publish(&topic, messages(ORDERS, 200, 50)).await;
    let dir = Workdir::new();
    let db_path = dir.db("shop");
    let store = format!("sqlite://{}", db_path.display());
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, pipeline(&store, "triggered", &subs[0])).unwrap();
    let worker = Worker::start(&file, "typed");
    let out = worker.stdout.clone();
    assert!(
        worker.wait(Duration::from_secs(180)).success(),
        "{}",
        std::fs::read_to_string(&out).unwrap()
    );
    let db = Db(db_path);
    let (rows, cents) = expected(ORDERS);
    assert_eq!(db.query("SELECT COUNT(*) FROM shop__orders"), rows);
    assert_eq!(
        db.query("SELECT COUNT(DISTINCT _sluice_dedup_key) FROM shop__orders"),
        rows
    );
    assert_eq!(db.query("SELECT SUM(cents) FROM shop__orders"), cents);
    // Typed values, exact: o7 is 7.25, qty 0, region R2, ts 10:07.
    assert_eq!(
        db.query(
            "SELECT COUNT(*) FROM shop__orders WHERE order_id = 'o7' AND amount = 7.25
             AND cents = 725 AND qty = 0 AND region = 'R2' AND ts = '2026-12-04T10:07:00.000Z'"
        ),
        1
    );
    assert_eq!(
        db.query(
            "SELECT COUNT(*) FROM shop__dead_letter WHERE reason = 'undecodable'
             AND error LIKE '$.amount: %'"
        ),
        50
    );
    assert_eq!(
        db.query(
            "SELECT COUNT(*) FROM shop__dead_letter WHERE reason = 'expression:qty'
             AND error LIKE 'column qty: %'"
        ),
        (ORDERS / 100) as i64
    );
    assert_eq!(db.query("SELECT COUNT(*) FROM shop__dead_letter"), 50 + 20);
    silver_is_f_of_orders(|sql| db.query(sql));
    the_view_and_its_reader_agree(|sql| db.query(sql));
    let summary = std::fs::read_to_string(&out).unwrap();
    assert!(
        summary.contains(&format!("{} records filtered out by `where`", ORDERS / 20)),
        "{summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_orders_land_exactly_once_on_postgres_under_sigkill() {
    const ORDERS: usize = 6_000;
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("typedpg", 1).await;
    let dir = Workdir::new();
    // Each worker connects under its own name, so the test sees which one is in a transaction.
    let start = |name: &str| {
        let file = dir.path().join(format!("{name}.yaml"));
        let store = format!("{}?application_name={name}", database.url());
        std::fs::write(
            &file,
            orders_only(&pipeline(&store, "continuous", &subs[0])),
        )
        .unwrap();
        Worker::start(&file, name)
    };
    // Both workers' streams are open before the kill, as a pool's would be.
    let victim = start("victim");
    let survivor = start("survivor");
    // About 12 s of publishing: the kill must land while the victim still has work (a run that
    // published in 3 s had landed everything before the aim found the victim in a transaction).
    let publishing = publish_in_chunks(
        &topic,
        messages(ORDERS, 600, 100),
        100,
        Duration::from_millis(200),
    )
    .await;
    let rows = || db.query("SELECT COUNT(*) FROM shop__orders");
    assert!(
        eventually(Duration::from_secs(120), || rows() > 500).await,
        "nothing landed:\n{}",
        victim.logs()
    );
    // Aimed: killed right after PostgreSQL shows the victim inside a transaction, watched over
    // one open session every 5 ms (a `psql` per look, 30-50 ms, missed every one of the
    // victim's short commits through 12 s of publishing in one run of three).
    let (watch, session) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(session);
    let aim_until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = 'victim' AND xact_start IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if seen > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < aim_until
                && !(publishing.is_finished() && rows() >= expected(ORDERS).0),
            "the victim was never seen in a transaction while there was work"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let at_kill = rows();
    victim.kill9();
    publishing.await.unwrap();
    let (expected_rows, cents) = expected(ORDERS);
    let dead = || db.query("SELECT COUNT(*) FROM shop__dead_letter");
    assert!(
        eventually(Duration::from_secs(420), || rows() == expected_rows
            && dead() == 100 + (ORDERS / 100) as i64)
        .await,
        "rows {} of {expected_rows}, dead letters {}; survivor:\n{}",
        rows(),
        dead(),
        survivor.logs()
    );
    println!("killed at {at_kill} rows of {expected_rows}");
    assert!(at_kill < expected_rows, "the kill landed after the end");
    assert_eq!(
        db.query("SELECT COUNT(DISTINCT _sluice_dedup_key) FROM shop__orders"),
        expected_rows
    );
    assert_eq!(db.query("SELECT SUM(cents)::int8 FROM shop__orders"), cents);
    assert_eq!(
        db.query(
            "SELECT COUNT(*) FROM shop__orders WHERE order_id = 'o7' AND amount = 7.25
             AND cents = 725 AND qty = 0 AND region = 'R2'
             AND ts = '2026-12-04T10:07:00Z'::timestamptz"
        ),
        1
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM shop__dead_letter WHERE reason = 'undecodable'"),
        100
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM shop__dead_letter WHERE reason = 'expression:qty'"),
        (ORDERS / 100) as i64
    );
}

/// Orders for the expectations: amount `i`, region `mars` for every 20th from 3 (5 %).
fn checked_order(i: usize) -> Message {
    let region = if i % 20 == 3 { "mars" } else { "earth" };
    payload(
        &format!("o{i}"),
        &format!(r#"{{"order_id":"o{i}","amount":{i},"region":"{region}"}}"#),
    )
}

fn checked_pipeline(
    store: &str,
    mode: &str,
    subscription: &str,
    expect: &str,
    metrics: &str,
) -> String {
    format!(
        "pipeline: shop
mode: {mode}
store: \"{store}\"
pubsub: {{ project: {project}, endpoint: \"{endpoint}\" }}
{metrics}targets:
  - name: orders
    kind: table
    columns:
      - {{ name: order_id, type: text, nullable: false }}
      - {{ name: amount, type: integer }}
      - {{ name: region, type: text }}
flows:
  - name: orders
    target: orders
    source:
      pubsub:
        subscription: {subscription}
        dedup: {{ by: attribute, attribute: order_id }}
        drain_idle: 15s
    decode: {{ format: json }}
    expect:
{expect}",
        project = sluice_tests::PROJECT,
        endpoint = emulator().endpoint(),
    )
}

/// `warn` and `drop` on 5 % of the records each: warned records land, dropped ones are dead
/// letters `expectation:NAME`; `sluice_expectation_records_total` counts each record once,
/// passed or violated, per expectation, and so does the store (`sluice status`).
#[tokio::test(flavor = "multi_thread")]
async fn expectations_warn_and_drop_count_each_record_once() {
    const ORDERS: usize = 2_000;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("expect", 1).await;
    let mut messages: Vec<Message> = (0..ORDERS).map(checked_order).collect();
    messages.extend((0..100).map(|d| checked_order(d * 13 % ORDERS)));
    pubsub.publish(&topic, messages).await;
    let dir = Workdir::new();
    let db_path = dir.db("shop");
    let port = sluice_bench::free_port().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(
        &file,
        checked_pipeline(
            &format!("sqlite://{}", db_path.display()),
            "continuous",
            &subs[0],
            "      - { name: small, check: \"amount < 1900\", on_violation: warn }
      - { name: known_region, check: \"region <> 'mars'\", on_violation: drop }
",
            &format!("metrics: {{ listen: \"127.0.0.1:{port}\" }}\n"),
        ),
    )
    .unwrap();
    let worker = Worker::start(&file, "expect");
    let db = Db(db_path);
    let landed = || {
        db.query("SELECT COUNT(*) FROM shop__orders")
            + db.query("SELECT COUNT(*) FROM shop__dead_letter")
    };
    assert!(
        eventually(Duration::from_secs(120), || landed() == ORDERS as i64).await,
        "{} of {ORDERS}:\n{}",
        landed(),
        worker.logs()
    );
    assert_eq!(db.query("SELECT COUNT(*) FROM shop__orders"), 1_900);
    assert_eq!(
        db.query("SELECT COUNT(*) FROM shop__orders WHERE amount >= 1900"),
        95,
        "warned records land"
    );
    assert_eq!(
        db.query(
            "SELECT COUNT(*) FROM shop__dead_letter WHERE reason = 'expectation:known_region'"
        ),
        100
    );
    let count = |expectation: &str, outcome: &str| {
        sluice_tests::labelled_metric(
            port,
            "sluice_expectation_records_total",
            &format!("expectation=\"{expectation}\",outcome=\"{outcome}\""),
        )
    };
    assert!(
        eventually(Duration::from_secs(10), || count("small", "violated")
            == Some(100.0))
        .await,
        "{}",
        sluice_tests::metrics_text(port)
    );
    assert_eq!(count("small", "passed"), Some(1_900.0));
    assert_eq!(count("known_region", "violated"), Some(100.0));
    assert_eq!(count("known_region", "passed"), Some(1_900.0));
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());
    // The store kept the same counts, in the commits' transactions: `sluice status` shows them.
    let out = sluice_tests::sluice_command(
        &["status", "-c", file.to_str().unwrap(), "--format", "json"],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let kept = |name: &str| {
        json["expectations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["expectation"] == name)
            .map(|e| {
                (
                    e["passed"].as_u64().unwrap(),
                    e["violated"].as_u64().unwrap(),
                )
            })
    };
    assert_eq!(kept("small"), Some((1_900, 100)), "{json}");
    assert_eq!(kept("known_region"), Some((1_900, 100)), "{json}");
}

/// `fail`: the triggered run exits non-zero naming the expectation and the record, without a
/// retry; nothing is committed and nothing acked (the run's counts: received 400, acked 0,
/// nacked 400). A plain client whose stream opened before the worker gave them back (batches
/// wait 3 s to form), after a seek back to before the publish (the subscription keeps no acked
/// messages), reads what came back; how many within 90 s depends on the emulator, which holds
/// messages a closing stream had leased for minutes at times, so it is printed, not asserted:
/// `engine/tests/expectations.rs` shows with an exact tally that every delivery is given back.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_expectation_stops_the_flow_and_acks_nothing() {
    const ORDERS: usize = 400;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("expectfail", 1).await;
    let dir = Workdir::new();
    let db_path = dir.db("shop");
    let file = dir.path().join("p.yaml");
    let yaml = checked_pipeline(
        &format!("sqlite://{}", db_path.display()),
        "triggered",
        &subs[0],
        "      - { name: known_region, check: \"region <> 'mars'\", on_violation: fail }
",
        "",
    )
    .replace(
        "        drain_idle: 15s\n",
        "        drain_idle: 15s\n        batch: { max_messages: 1000, max_delay: 3s }\n",
    );
    std::fs::write(&file, yaml).unwrap();
    let worker = Worker::start(&file, "fail");
    assert!(
        eventually(Duration::from_secs(60), || worker
            .logs()
            .contains("flow started"))
        .await,
        "{}",
        worker.logs()
    );
    let before = sluice_tests::now_ms() - 1_000;
    let ids = pubsub
        .publish(&topic, (0..ORDERS).map(checked_order).collect())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let plain = pubsub.plain_receiver(&subs[0], ORDERS, Duration::from_secs(90));
    let (out, err) = (worker.stdout.clone(), worker.stderr.clone());
    let status = worker.wait(Duration::from_secs(120));
    let summary = std::fs::read_to_string(&out).unwrap();
    let logs = std::fs::read_to_string(&err).unwrap();
    assert!(!status.success(), "{summary}\n{logs}");
    assert!(
        summary.contains("FAILED (expectation known_region failed on message")
            && summary.contains(&format!("received {ORDERS}, rows 0"))
            && summary.contains(&format!("acked 0, nacked {ORDERS}")),
        "{summary}"
    );
    assert!(logs.contains("not retried"), "{logs}");
    pubsub.admin.seek_to_time(&subs[0], before).await.unwrap();
    let failing = summary
        .split("failed on message ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap()
        .to_owned();
    // Not asserted whole: in loaded runs the emulator kept 100 of the 400 from a plain client
    // for more than 420 s (fresh-clone run, 2026-12-05; 400 within 101 s alone): the fail
    // mode's "still deliverable" is shown by `acked 0, nacked 400` above and by the ids that
    // come back.
    let back = plain.await.unwrap();
    assert!(back.iter().all(|id| ids.contains(id)));
    println!(
        "{} of {ORDERS} came back within 90 s, the failing one {}",
        back.len(),
        if back.contains(&failing) {
            "among them"
        } else {
            "not yet"
        }
    );
    assert_eq!(Db(db_path).query("SELECT COUNT(*) FROM shop__orders"), 0);
}

/// `pipeline` in a pool: the orders flow with a watermark (from a tracking subscription), and
/// `gold`, a 5 s window over `silver` per region with the sum of `doubled`. Its windows wait
/// 60 s past the watermark: the emulator hands a killed worker's messages back after their
/// stream ack deadline (10 s), and a row committed after its window was emitted would be late.
/// (Before the harness fixed the emulator's stream fault it took up to about 180 s, and a
/// fresh-clone run with no lateness allowed had 201 late rows: gold counted 4 539 of silver's
/// 4 740.)
fn pooled_pipeline(store: &str, subscription: &str) -> String {
    pipeline(store, "continuous", subscription)
        .replace(
            "        drain_idle: 15s\n",
            "        watermark: { tracking_subscription: auto, band: 10s }\n",
        )
        .replace(
            "flows:\n",
            "  - name: gold
    kind: window
    window:
      size: 5s
      allowed_lateness: 60s
      group_by: \"column:region\"
      aggregates: { total: \"sum(doubled)\", biggest: \"max(doubled)\" }
flows:
  - name: totals
    target: gold
    source: { table: silver }
",
        )
}

/// bronze -> silver -> gold on a pool of three workers under SIGKILL: typed orders decoded
/// from Pub/Sub (bronze), a `table` flow with `select:` and `where:` (silver), a window over
/// silver grouped by a column with a sum (gold); beside them a view over bronze and a table
/// filled by a flow reading the view. Silver must hold exactly f(bronze), and gold
/// exactly the aggregate of silver per window and region (a silver row committed after its
/// window was emitted would break it). Kills 2 and 3 are aimed at the holder of silver's feed
/// lease, and the test shows the feed changed hands.
///
/// Real: the emulator (with a tracking subscription), three `sluice` processes, PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bronze_silver_gold_on_a_pool_under_sigkill() {
    const ORDERS: usize = 6_000;
    const KILLS: usize = 3;
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("typedgold", 1).await;
    let dir = Workdir::new();
    let file = dir.path().join("p.yaml");
    let store = format!("{}?pool_size=4", database.url());
    std::fs::write(&file, pooled_pipeline(&store, &subs[0])).unwrap();
    let mut workers: Vec<Worker> = (0..3)
        .map(|i| Worker::start(&file, &format!("g{i}-0")))
        .collect();
    let publishing = publish_in_chunks(
        &topic,
        messages(ORDERS, 600, 100),
        100,
        Duration::from_millis(200),
    )
    .await;
    let feed_holder = || {
        db.text(
            "SELECT holder FROM sluice_leases WHERE pipeline = 'shop' AND role = 'feed/clean'
               AND expires_at > now()",
        )
    };
    let mut readers = std::collections::HashSet::new();
    let mut silver_at_kills = Vec::new();
    for kill in 1..=KILLS {
        tokio::time::sleep(Duration::from_millis(rand::random_range(3_000..5_000))).await;
        let holder = feed_holder();
        if !holder.is_empty() {
            readers.insert(holder.clone());
        }
        // A worker's id is `<host>-<pid>-<random>`.
        let aimed = (kill > 1)
            .then(|| holder.rsplit('-').nth(1)?.parse::<u32>().ok())
            .flatten()
            .and_then(|pid| workers.iter().position(|w| w.pid() == pid));
        let victim = aimed.unwrap_or_else(|| rand::random_range(0..workers.len()));
        // The successor's streams are open before the kill (the emulator holds a killed
        // stream's messages back from streams opened after the close).
        let successor = Worker::start(&file, &format!("g{victim}-{kill}"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        silver_at_kills.push(db.query("SELECT COUNT(*) FROM shop__silver"));
        std::mem::replace(&mut workers[victim], successor).kill9();
    }
    publishing.await.unwrap();
    let (expected_rows, cents) = expected(ORDERS);
    let count = |sql: &str| db.query(sql);
    let mut done = || {
        let holder = feed_holder();
        if !holder.is_empty() {
            readers.insert(holder);
        }
        count("SELECT COUNT(*) FROM shop__orders") == expected_rows
            && count("SELECT COUNT(*) FROM shop__silver")
                == count("SELECT COUNT(*) FROM shop__orders WHERE region <> 'R0'")
            && count("SELECT COALESCE(SUM(count), 0)::int8 FROM shop__gold__windows")
                == count("SELECT COUNT(*) FROM shop__silver")
            && count("SELECT COUNT(*) FROM shop__big_copy")
                == count("SELECT COUNT(*) FROM shop__orders WHERE amount >= 100")
    };
    let mut landed = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while std::time::Instant::now() < deadline {
        if done() {
            landed = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        landed,
        "orders {}, silver {}, gold counts {}; logs:\n{}",
        count("SELECT COUNT(*) FROM shop__orders"),
        count("SELECT COUNT(*) FROM shop__silver"),
        count("SELECT COALESCE(SUM(count), 0)::int8 FROM shop__gold__windows"),
        workers
            .iter()
            .map(|w| w.logs())
            .collect::<Vec<_>>()
            .join("\n----\n")
    );
    sluice_tests::stop_all(workers);
    assert_eq!(
        count("SELECT COUNT(DISTINCT _sluice_dedup_key) FROM shop__orders"),
        expected_rows
    );
    assert_eq!(count("SELECT SUM(cents)::int8 FROM shop__orders"), cents);
    silver_is_f_of_orders(count);
    the_view_and_its_reader_agree(count);
    // Gold is exactly the aggregate of silver, window by window and region by region, with
    // the window start computed as the emission computes it.
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM (
                 SELECT ms - ms % 5000 AS window_start, COALESCE(region, '') AS g,
                        SUM(doubled) AS total, MAX(doubled) AS biggest, COUNT(*) AS n
                 FROM (SELECT (extract(epoch FROM _sluice_event_time) * 1000)::int8 AS ms,
                              region, doubled FROM shop__silver) AS s
                 GROUP BY 1, 2) AS x
             FULL JOIN shop__gold__windows w
                 ON w.window_start = x.window_start AND w.group_key = x.g
             WHERE w.count IS DISTINCT FROM x.n OR w.total IS DISTINCT FROM x.total
                OR w.biggest IS DISTINCT FROM x.biggest"
        ),
        0,
        "gold differs from the aggregate of silver"
    );
    assert!(count("SELECT COUNT(*) FROM shop__gold__windows") > 5);
    // The kills landed while silver was being filled.
    let silver = count("SELECT COUNT(*) FROM shop__silver");
    println!("silver held {silver_at_kills:?} rows of {silver} at the kills");
    assert!(silver_at_kills.iter().any(|&at| at > 0 && at < silver));
    println!("silver's feed was read by {readers:?}");
    assert!(
        readers.len() >= 2,
        "silver's feed never changed hands, so no kill hit its reader: {readers:?}"
    );
}
