//! How an `auto` tracking subscription is started (`Admin::ensure_tracking_subscription`), on
//! the real emulator: a snapshot of the base subscription is taken first, the tracking
//! subscription is created and seeked to it, and the snapshot is deleted; a start that stopped
//! between those steps is finished by whoever comes next.
//!
//! What the seek is for, tracking the messages already waiting in the base subscription, is
//! Pub/Sub's documented behaviour (a snapshot keeps the source subscription's unacked messages
//! and everything published after it; another subscription of the topic can be seeked to it).
//! The emulator does not do that part: a subscription seeked to another's snapshot receives only
//! what was published after the subscription was created (measured here with 19 000 waiting
//! messages, none delivered). So these tests check the steps and that nothing published after
//! the start is lost, not the backlog copy itself.
#![allow(clippy::unwrap_used, missing_docs)]

use google_cloud_pubsub::client::SubscriptionAdmin;
use sluice_engine::pubsub::TrackingStart;
use sluice_tests::{PROJECT, PubSub, event};
use std::collections::HashSet;
use std::time::Duration;

/// The emulator's subscription admin client, for the steps `Admin` does not expose.
async fn raw_admin(pubsub: &PubSub) -> SubscriptionAdmin {
    SubscriptionAdmin::builder()
        .with_endpoint(pubsub.config.endpoint().unwrap())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .unwrap()
}

/// `Admin::ensure_tracking_subscription`, as a worker calls it.
async fn start(pubsub: &PubSub, base: &str, tracking: &str) -> TrackingStart {
    pubsub
        .admin
        .ensure_tracking_subscription(base, tracking)
        .await
        .unwrap()
}

/// The messages a plain client receives (and acks) on `subscription`, waiting for `expected`.
async fn received(pubsub: &PubSub, subscription: &str, expected: usize) -> HashSet<String> {
    pubsub
        .plain_receiver(subscription, expected, Duration::from_secs(120))
        .await
        .unwrap()
}

fn snapshot_path(tracking: &str) -> String {
    format!("projects/{PROJECT}/snapshots/{tracking}-start")
}

async fn snapshot_exists(admin: &SubscriptionAdmin, tracking: &str) -> bool {
    admin
        .get_snapshot()
        .set_snapshot(snapshot_path(tracking))
        .send()
        .await
        .is_ok()
}

/// A missing tracking subscription is created from the base subscription's snapshot, which is
/// gone afterwards; a second call finds it started; what is published after the start reaches
/// it, and the base subscription keeps its own messages.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_tracking_subscription_starts_from_a_snapshot_of_the_base() {
    let pubsub = PubSub::connect().await;
    let raw = raw_admin(&pubsub).await;
    let (topic, subs) = pubsub.topic_with("start", 1).await;
    pubsub
        .publish(&topic, (0..100).map(|i| event(&format!("w{i}"))).collect())
        .await;
    let tracking = format!("{}-tracking", subs[0]);

    let first = start(&pubsub, &subs[0], &tracking).await;
    assert_eq!(first, TrackingStart::FromBacklog);
    assert!(pubsub.admin.subscription_exists(&tracking).await.unwrap());
    assert!(
        !snapshot_exists(&raw, &tracking).await,
        "the start snapshot is deleted after the seek"
    );
    let again = start(&pubsub, &subs[0], &tracking).await;
    assert_eq!(again, TrackingStart::Existing);
    // It keeps acked messages (a start seeks it back), and keeps messages as long as the base:
    // a tracking reader down for longer than a shorter retention would lose what the base holds.
    let mut found = Vec::new();
    for name in [&subs[0], &tracking] {
        let path = pubsub.config.subscription_path(name).unwrap();
        found.push(
            raw.get_subscription()
                .set_subscription(path)
                .send()
                .await
                .unwrap(),
        );
    }
    let (base_sub, tracking_sub) = (&found[0], &found[1]);
    assert!(tracking_sub.retain_acked_messages);
    let seconds = |d: Option<google_cloud_wkt::Duration>| d.map_or(7 * 24 * 3600, |d| d.seconds());
    assert!(
        seconds(tracking_sub.message_retention_duration)
            >= seconds(base_sub.message_retention_duration),
        "tracking retention {:?}, base {:?}",
        tracking_sub.message_retention_duration,
        base_sub.message_retention_duration
    );

    let after: Vec<String> = pubsub
        .publish(&topic, (0..200).map(|i| event(&format!("n{i}"))).collect())
        .await;
    let tracked = received(&pubsub, &tracking, after.len()).await;
    for id in &after {
        assert!(
            tracked.contains(id),
            "{id} published after the start is tracked"
        );
    }
    let base = received(&pubsub, &subs[0], 300).await;
    assert_eq!(
        base.len(),
        300,
        "the base subscription keeps all its messages"
    );
}

/// A replica that stopped after creating the snapshot and the subscription, before the seek:
/// the next call finds both, seeks, and deletes the snapshot. Messages published between the
/// subscription's creation and the seek are kept by the snapshot, so the seek loses none.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_left_half_done_is_finished_by_the_next_call() {
    let pubsub = PubSub::connect().await;
    let raw = raw_admin(&pubsub).await;
    let (topic, subs) = pubsub.topic_with("half", 1).await;
    let tracking = format!("{}-tracking", subs[0]);
    raw.create_snapshot()
        .set_name(snapshot_path(&tracking))
        .set_subscription(format!("projects/{PROJECT}/subscriptions/{}", subs[0]))
        .send()
        .await
        .unwrap();
    pubsub
        .admin
        .create_subscription(&tracking, &topic, 10)
        .await
        .unwrap();
    assert!(snapshot_exists(&raw, &tracking).await);
    let between = pubsub
        .publish(&topic, (0..100).map(|i| event(&format!("b{i}"))).collect())
        .await;

    let first = start(&pubsub, &subs[0], &tracking).await;
    assert_eq!(first, TrackingStart::FromBacklog, "the seek was finished");
    assert!(!snapshot_exists(&raw, &tracking).await);
    let again = start(&pubsub, &subs[0], &tracking).await;
    assert_eq!(again, TrackingStart::Existing);

    let after = pubsub
        .publish(&topic, (0..100).map(|i| event(&format!("h{i}"))).collect())
        .await;
    let tracked = received(&pubsub, &tracking, 200).await;
    for id in between.iter().chain(&after) {
        assert!(tracked.contains(id), "{id} is tracked");
    }
}

/// Replicas starting at once: every call succeeds, at least one of them started the
/// subscription, and no snapshot is left behind.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_starting_at_once_leave_one_started_subscription() {
    let pubsub = PubSub::connect().await;
    let raw = raw_admin(&pubsub).await;
    let (topic, subs) = pubsub.topic_with("race", 1).await;
    let tracking = format!("{}-tracking", subs[0]);
    let starts = futures::future::join_all((0..4).map(|_| {
        pubsub
            .admin
            .ensure_tracking_subscription(&subs[0], &tracking)
    }))
    .await;
    let starts: Vec<TrackingStart> = starts.into_iter().map(Result::unwrap).collect();
    assert!(
        starts.contains(&TrackingStart::FromBacklog),
        "one of them started it: {starts:?}"
    );
    assert!(
        starts
            .iter()
            .all(|s| matches!(s, TrackingStart::FromBacklog | TrackingStart::Existing)),
        "{starts:?}"
    );
    assert!(!snapshot_exists(&raw, &tracking).await);
    let after = pubsub
        .publish(&topic, (0..100).map(|i| event(&format!("r{i}"))).collect())
        .await;
    let tracked = received(&pubsub, &tracking, after.len()).await;
    assert_eq!(tracked.len(), after.len());
}

/// A tracking subscription must see what the flow's subscription sees (issue 19, hole 7):
/// `Admin::tracking_topic` refuses one on another topic, one whose filter is not the flow's
/// plus the probes, and the flow's own subscription, and gives the topic of a good one. An `auto` one copies the base
/// subscription's retention of acked messages, so `reset --seek` can replay both.
#[tokio::test(flavor = "multi_thread")]
async fn a_tracking_subscription_must_mirror_the_flows() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("mirror", 2).await;
    let (_, other_topic_subs) = pubsub.topic_with("mirror-other", 1).await;
    let path = format!("projects/{PROJECT}/topics/{topic}");
    assert_eq!(
        pubsub
            .admin
            .tracking_topic(&subs[0], &subs[1])
            .await
            .unwrap(),
        path
    );
    let refused = |r: Result<String, sluice_engine::pubsub::SourceError>| match r {
        Ok(topic) => panic!("accepted, topic {topic}"),
        Err(e) => e.to_string(),
    };
    let other = refused(
        pubsub
            .admin
            .tracking_topic(&subs[0], &other_topic_subs[0])
            .await,
    );
    assert!(other.contains("same topic"), "{other}");
    let own = refused(pubsub.admin.tracking_topic(&subs[0], &subs[0]).await);
    assert!(own.contains("own subscription"), "{own}");
    // The emulator stores a filter (it does not apply it), so the check can see it.
    let filtered = format!("{topic}-filtered");
    raw_admin(&pubsub)
        .await
        .create_subscription()
        .set_name(format!("projects/{PROJECT}/subscriptions/{filtered}"))
        .set_topic(&path)
        .set_filter("attributes.region = \"eu\"")
        .send()
        .await
        .unwrap();
    // Its twin, with the very same filter (as `auto` made them before the probes).
    let filtered_twin = format!("{topic}-filtered-twin");
    raw_admin(&pubsub)
        .await
        .create_subscription()
        .set_name(format!("projects/{PROJECT}/subscriptions/{filtered_twin}"))
        .set_topic(&path)
        .set_filter("attributes.region = \"eu\"")
        .send()
        .await
        .unwrap();
    let filter = refused(pubsub.admin.tracking_topic(&subs[0], &filtered).await);
    assert!(filter.contains("must have the filter"), "{filter}");
    // A filtered base: its tracking subscription needs the same filter plus the probes, which
    // the base filter would drop; `auto` makes it so.
    let tracking = format!("{filtered}-tracking");
    start(&pubsub, &filtered, &tracking).await;
    assert_eq!(
        pubsub
            .admin
            .tracking_topic(&filtered, &tracking)
            .await
            .unwrap(),
        path
    );
    let same = refused(pubsub.admin.tracking_topic(&filtered, &filtered_twin).await);
    assert!(same.contains("attributes:sluice-probe"), "{same}");

    let replayable = format!("{topic}-replayable");
    pubsub
        .admin
        .create_replayable_subscription(&replayable, &topic, 10)
        .await
        .unwrap();
    let tracking = format!("{replayable}-tracking");
    start(&pubsub, &replayable, &tracking).await;
    assert!(
        pubsub
            .admin
            .replay_window(&tracking)
            .await
            .unwrap()
            .is_some(),
        "the tracking subscription does not retain acked messages like its base"
    );
}
