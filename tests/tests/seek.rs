//! `--seek T` marks every message published before T as acknowledged, also what no worker ever
//! ingested: `sluice reset FLOW --seek T` and `sluice full-refresh --seek T` refuse (exit 2,
//! naming `--drop-unread`) unless told that dropping it is meant, refuse a T in the future
//! (exit 2, `--drop-unread` or not: it would also drop what is published until T), and leave
//! the subscription untouched when they refuse.
//!
//! Real parts: the Pub/Sub emulator (a subscription that retains acked messages, so a seek is
//! otherwise allowed), the `sluice` binary, a SQLite store.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{PipelineOptions, PubSub, Workdir, event, now_ms, sluice_command, unique};
use std::time::Duration;

const BACKLOG: usize = 100;

#[tokio::test(flavor = "multi_thread")]
async fn a_seek_that_would_drop_an_unread_backlog_needs_drop_unread() {
    let pubsub = PubSub::connect().await;
    let topic = unique("seek");
    pubsub.admin.create_topic(&topic).await.unwrap();
    let subscription = format!("{topic}-sub");
    pubsub
        .admin
        .create_replayable_subscription(&subscription, &topic, 10)
        .await
        .unwrap();
    let dir = Workdir::new();
    let file = dir.pipeline("p.yaml", "db", &PipelineOptions::continuous(&subscription));
    let file = file.to_str().unwrap();
    // A backlog no worker has read yet, then a seek to a time after it.
    pubsub
        .publish(
            &topic,
            (0..BACKLOG).map(|i| event(&format!("b{i}"))).collect(),
        )
        .await;
    // (The clock moves past the backlog's publish times; a seek in the future is refused.)
    tokio::time::sleep(Duration::from_millis(2)).await;
    let after_backlog = now_ms().to_string();

    for args in [
        vec!["reset", "ingest", "-c", file, "--seek", &after_backlog],
        vec!["full-refresh", "-c", file, "--seek", &after_backlog],
    ] {
        let out = sluice_command(&args, None);
        assert_eq!(out.code, 2, "{args:?} was not refused: {}", out.all());
        assert!(out.all().contains("--drop-unread"), "{}", out.all());
    }
    // Refused before anything was done: the backlog is still there, unacked.
    let still = pubsub
        .plain_client(&subscription, BACKLOG, Duration::from_secs(60), false)
        .await
        .unwrap();
    assert_eq!(still.len(), BACKLOG, "the refused seeks dropped nothing");

    let out = sluice_command(
        &[
            "reset",
            "ingest",
            "-c",
            file,
            "--seek",
            &after_backlog,
            "--drop-unread",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.all());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_seek_time_in_the_future_is_refused() {
    let pubsub = PubSub::connect().await;
    let topic = unique("seek-future");
    pubsub.admin.create_topic(&topic).await.unwrap();
    let subscription = format!("{topic}-sub");
    pubsub
        .admin
        .create_replayable_subscription(&subscription, &topic, 10)
        .await
        .unwrap();
    let dir = Workdir::new();
    let file = dir.pipeline("p.yaml", "db", &PipelineOptions::continuous(&subscription));
    let file = file.to_str().unwrap();
    pubsub
        .publish(
            &topic,
            (0..BACKLOG).map(|i| event(&format!("b{i}"))).collect(),
        )
        .await;
    // An hour ahead (ms since epoch), and a year (RFC 3339): with --drop-unread, so only the
    // time is wrong.
    let in_an_hour = (now_ms() + 3_600_000).to_string();
    let next_year = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(24 * 366))
        .unwrap()
        .to_string();
    for args in [
        vec!["reset", "ingest", "-c", file, "--seek", &in_an_hour],
        vec!["full-refresh", "-c", file, "--seek", &next_year],
    ] {
        let args: Vec<&str> = args.into_iter().chain(["--drop-unread"]).collect();
        let out = sluice_command(&args, None);
        assert_eq!(out.code, 2, "{args:?} was not refused: {}", out.all());
        assert!(out.all().contains("in the future"), "{}", out.all());
    }
    // Refused before anything was done: the backlog is still there, unacked.
    let still = pubsub
        .plain_client(&subscription, BACKLOG, Duration::from_secs(60), false)
        .await
        .unwrap();
    assert_eq!(still.len(), BACKLOG, "the refused seeks dropped nothing");
}
