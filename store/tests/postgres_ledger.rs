//! PostgreSQL-only behaviour, on a real server: the time-partitioned ledger (generations created
//! ahead, claimed across boundaries, dropped whole), recovery from a missing generation, and
//! TLS with certificate verification.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use sluice_dedup::DedupKey;
use sluice_store::{
    CommitBatch, Effect, Entry, FlowHandle, Layout, MessageFields, PostgresStore, ScratchDatabase,
    table_name,
};
use sluice_store::{FlowStore, Inspect, LedgerStore};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn batch(flow: &FlowHandle, keys: &[&str], window_ms: i64) -> CommitBatch {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    CommitBatch {
        flow: flow.clone(),
        table: Arc::from(table_name("p", "events").unwrap()),
        entries: keys
            .iter()
            .map(|key| Entry {
                key: DedupKey::new(*key),
                message: MessageFields {
                    message_id: key.to_string(),
                    publish_time_ms: now,
                    attributes_json: "{}".into(),
                    data: Bytes::from_static(b"x"),
                },
                effect: Effect::row(now),
            })
            .collect(),
        now_ms: now,
        expires_at_ms: now + window_ms,
        hook: None,
        watermark_progress: false,
        commit_by_ms: None,
        position: None,
        position_gate: None,
        work: None,
        publish_dead_letters: false,
        verdicts: Vec::new(),
        memory_duplicates: 0,
        typed: None,
    }
}

async fn prepared(store: &PostgresStore) -> FlowHandle {
    store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["events".into()],
            typed: Vec::new(),
            flows: vec!["live".into()],
        })
        .await
        .unwrap()
        .remove(0)
}

async fn admin(db: &ScratchDatabase) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// One-second generations and a 2.5 s window: a key stays a duplicate across three generation
/// boundaries while upkeep drops old generations underneath, then is new once the window ends.
#[tokio::test]
async fn keys_stay_duplicates_across_generations_while_old_ones_are_dropped() {
    let db = ScratchDatabase::create().await.unwrap();
    let store = PostgresStore::open(&format!("{}?ledger_generation=1s", db.url())).unwrap();
    let flow = prepared(&store).await;
    let started = Instant::now();
    assert_eq!(
        store
            .commit(batch(&flow, &["a"], 2_500))
            .await
            .unwrap()
            .written,
        vec![true]
    );
    let mut dropped = 0;
    while started.elapsed() < Duration::from_millis(2_200) {
        let out = store.commit(batch(&flow, &["a"], 2_500)).await.unwrap();
        assert_eq!(out.written, vec![false], "at {:?}", started.elapsed());
        dropped += store.ledger_upkeep().await.unwrap().generations_dropped;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_millis(3_000).saturating_sub(started.elapsed())).await;
    assert_eq!(
        store
            .commit(batch(&flow, &["a"], 2_500))
            .await
            .unwrap()
            .written,
        vec![true]
    );
    dropped += store.ledger_upkeep().await.unwrap().generations_dropped;
    assert!(dropped >= 2, "old generations dropped: {dropped}");
    // What is left starts at most one generation before the current one.
    let generations = store.ledger_generations().await.unwrap();
    let now_generation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        generations[0] >= now_generation - 2,
        "{generations:?} at {now_generation}"
    );
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 2);
}

/// Someone drops every generation by hand (or the upkeep holder was away for long): the next
/// commit creates what it needs and still deduplicates.
#[tokio::test]
async fn a_commit_recreates_missing_generations() {
    let db = ScratchDatabase::create().await.unwrap();
    let store = PostgresStore::open(db.url()).unwrap();
    let flow = prepared(&store).await;
    let admin = admin(&db).await;
    for generation in store.ledger_generations().await.unwrap() {
        admin
            .batch_execute(&format!(
                "ALTER TABLE sluice_ledger DETACH PARTITION sluice_ledger_g{generation};
                 DROP TABLE sluice_ledger_g{generation};"
            ))
            .await
            .unwrap();
    }
    assert!(store.ledger_generations().await.unwrap().is_empty());
    let out = store
        .commit(batch(&flow, &["a", "b"], 600_000))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true, true]);
    let out = store
        .commit(batch(&flow, &["b", "c"], 600_000))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false, true]);
    assert!(!store.ledger_generations().await.unwrap().is_empty());
}

/// The upkeep lease moves to a replica that has committed nothing yet (all messages went to
/// the one that died): it still creates generations as far ahead as the largest window any
/// replica commits with, not only its own margin (CI of stop 36: the newest generation stood
/// still after a takeover).
#[tokio::test]
async fn an_upkeep_holder_that_committed_nothing_keeps_the_pools_lead() {
    let db = ScratchDatabase::create().await.unwrap();
    let url = format!("{}?ledger_generation=1s", db.url());
    let committer = PostgresStore::open(&url).unwrap();
    let flow = prepared(&committer).await;
    committer
        .commit(batch(&flow, &["a"], 600_000))
        .await
        .unwrap();
    let newest = |generations: Vec<i64>| *generations.last().unwrap();
    let lead = newest(committer.ledger_generations().await.unwrap());
    let holder = PostgresStore::open(&url).unwrap();
    prepared(&holder).await;
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let upkeep = holder.ledger_upkeep().await.unwrap();
    let later = newest(holder.ledger_generations().await.unwrap());
    assert!(
        later > lead && upkeep.generations_created >= 2,
        "newest generation {lead} then {later} after the holder's upkeep ({upkeep:?})"
    );
}

/// Upkeep run by several replicas at once (a lease overlap) neither fails nor loses keys.
#[tokio::test]
async fn concurrent_upkeep_is_safe() {
    let db = ScratchDatabase::create().await.unwrap();
    let url = format!("{}?ledger_generation=1s", db.url());
    let store = PostgresStore::open(&url).unwrap();
    let flow = prepared(&store).await;
    store.commit(batch(&flow, &["a"], 5_000)).await.unwrap();
    let committed_at = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let store = PostgresStore::open(&url).unwrap();
            for _ in 0..5 {
                store.ledger_upkeep().await.unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Still within its 5 s window, "a" is a duplicate (on a loaded machine the upkeep may take
    // longer than the window, and then "a" has rightly expired: CI run 2026-12-04).
    let out = store.commit(batch(&flow, &["a"], 5_000)).await.unwrap();
    if committed_at.elapsed() < Duration::from_millis(4_500) {
        assert_eq!(out.written, vec![false]);
    }
    // The ledger the four upkeeps left behind still takes keys and finds their duplicates.
    let fresh = store.commit(batch(&flow, &["z"], 5_000)).await.unwrap();
    let again = store.commit(batch(&flow, &["z"], 5_000)).await.unwrap();
    assert_eq!((fresh.written, again.written), (vec![true], vec![false]));
}

/// `sslmode=require` verifies the server certificate: the local server's self-signed
/// certificate (CN localhost) is accepted with `sslrootcert` pointing at it, and refused when
/// `sslrootcert` names another CA (a public root that did not sign it).
#[tokio::test]
async fn tls_is_verified() {
    let db = ScratchDatabase::create().await.unwrap();
    let admin = admin(&db).await;
    let ssl: String = admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    assert_eq!(
        ssl, "on",
        "this test needs a server with TLS (Debian's default)"
    );
    let tls_url =
        db.url().replace("127.0.0.1", "localhost") + "?hostaddr=127.0.0.1&sslmode=require";
    let verified = PostgresStore::open(&format!(
        "{tls_url}&sslrootcert=/etc/ssl/certs/ssl-cert-snakeoil.pem"
    ))
    .unwrap();
    prepared(&verified).await;
    let encrypted: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.datname = $1 AND a.application_name = 'sluice' AND s.ssl",
            &[&db.name()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(encrypted >= 1, "no TLS connection from sluice");
    let unverified = PostgresStore::open(&format!(
        "{tls_url}&sslrootcert=/usr/share/ca-certificates/mozilla/ISRG_Root_X1.crt"
    ))
    .unwrap();
    let error = unverified
        .prepare(&Layout {
            pipeline: "p".into(),
            ..Layout::default()
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("TLS"), "{error}");
}

/// An acked commit must survive a server crash, so sluice's sessions commit synchronously even
/// where the database's (or the server's) default says otherwise.
#[tokio::test]
async fn sessions_commit_synchronously_whatever_the_database_default() {
    let db = ScratchDatabase::create().await.unwrap();
    admin(&db)
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET synchronous_commit = off",
            db.name()
        ))
        .await
        .unwrap();
    let store = PostgresStore::open(db.url()).unwrap();
    let flow = prepared(&store).await;
    store.commit(batch(&flow, &["a"], 60_000)).await.unwrap();
    assert_eq!(
        store.session_setting("synchronous_commit").await.unwrap(),
        "on"
    );
}
