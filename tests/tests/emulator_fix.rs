//! The test harness's emulator runs with the fix of `bench/src/emulator_fix.rs`: a cancelled
//! StreamingPull ends on the server too, so it takes no messages from the streams opened after
//! it. Without the fix (the emulator as shipped) the cancelled stream's server loop goes on
//! pulling and hides what it takes for its stream ack deadline, here 600 s, so the second stream
//! misses some of the messages and this test fails at its 60 s deadline (seen 2026-12-05 on the
//! emulator started by its own launcher).
//!
//! Real parts: the run's Pub/Sub emulator and the official client (no sluice).
#![allow(clippy::unwrap_used, missing_docs)]

use google_cloud_pubsub::client::Subscriber;
use sluice_tests::{PubSub, event};
use std::collections::HashSet;
use std::time::Duration;

async fn stream(
    pubsub: &PubSub,
    subscription: &str,
    lease_extension: Duration,
) -> google_cloud_pubsub::subscriber::MessageStream {
    Subscriber::builder()
        .with_endpoint(pubsub.config.endpoint().unwrap())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .unwrap()
        .subscribe(pubsub.config.subscription_path(subscription).unwrap())
        .set_max_lease_extension(lease_extension)
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_takes_nothing_from_the_streams_after_it() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("emufix", 1).await;
    let early = pubsub
        .publish(
            &topic,
            (0..5).map(|i| event(&format!("early{i}"))).collect(),
        )
        .await;
    // The first stream (stream ack deadline 600 s) takes the early messages and is dropped with
    // them: the client gives them back (nacks) and cancels the call. Without the fix, the
    // cancelled call's server loop takes them again, and the late ones, for 600 s each.
    let mut first = stream(&pubsub, &subs[0], Duration::from_secs(600)).await;
    let mut held = Vec::new();
    while held.len() < early.len() {
        let (_, handler) = tokio::time::timeout(Duration::from_secs(30), first.next())
            .await
            .expect("the first stream got the early messages")
            .unwrap()
            .unwrap();
        held.push(handler);
    }
    let token = first.shutdown_token();
    drop(held);
    drop(first);
    token.shutdown().await;

    let late = pubsub
        .publish(
            &topic,
            (0..20).map(|i| event(&format!("late{i}"))).collect(),
        )
        .await;
    let expected: HashSet<String> = early.into_iter().chain(late).collect();
    let mut second = stream(&pubsub, &subs[0], Duration::from_secs(10)).await;
    let mut got = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got.len() < expected.len() {
        match tokio::time::timeout_at(deadline, second.next()).await {
            Ok(Some(Ok((message, handler)))) => {
                handler.ack();
                got.insert(message.message_id.clone());
            }
            _ => break,
        }
    }
    let token = second.shutdown_token();
    drop(second);
    token.shutdown().await;
    let missing = expected.difference(&got).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} messages never reached the second stream: the cancelled stream's \
         server loop took them (is the emulator running without its fix?)",
        expected.len()
    );
}
