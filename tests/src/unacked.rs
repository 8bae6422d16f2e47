//! Reading what is left unacked on a subscription once a test's workers stopped, with a plain
//! client that acks what it reads. The emulator gives back what a closed stream held only after
//! that stream's ack deadline (and, before the harness fixed its stream fault, much later when
//! both cores were busy), so a read that finds nothing proves little unless it lasted as long as
//! such a give-back takes.
//! [`unacked_beside_control`] measures that wait in the same run: beside the real read, a
//! control subscription's messages are held by a plain stream that then closes, and the real
//! read lasts until every one of them came back, plus [`CONTROL_MARGIN`].

use crate::{PubSub, event};
use std::collections::HashSet;
use std::time::Duration;

/// How long a read for unacked messages lasts at most. Messages that a closed stream held come
/// back to a reader opened right after the close within about 20 s here; a reader opened 15 s
/// later got them only after 35 s more (measured on the emulator). With other end-to-end tests
/// loading both cores it takes longer: once 100 of 1 000 were still missing after 60 s, and once
/// (a CI run on 2026-12-01) 200 of 1 000 after 90 s. So the reader opens at once and reads for up
/// to four minutes, past the longest hold-back seen on the emulator (about three minutes, see
/// ARCHITECTURE.md). Those figures predate the emulator's stream fix; the control
/// ([`unacked_beside_control`]) ends the read as soon as this run's give-back allows.
pub const UNACKED_READ_WINDOW: Duration = Duration::from_secs(240);

/// How much longer than its control the real read of [`unacked_beside_control`] lasts. The
/// control's stream closes after the workers' streams did (it opens only once they stopped),
/// so its messages' ack deadlines end later than theirs; the margin covers a give-back spread
/// over a loaded emulator.
pub const CONTROL_MARGIN: Duration = Duration::from_secs(20);

/// Messages in the control: a plain stream holds [`CONTROL_HELD`] of them when it closes.
pub const CONTROL_MESSAGES: usize = 1_000;
/// How many of the control's messages its plain stream holds when it closes.
pub const CONTROL_HELD: usize = 500;

/// The message ids still unacked on `subscription`, read by a plain client (which acks them)
/// opened right away, for [`UNACKED_READ_WINDOW`] or until `expected` arrived.
pub async fn unacked_messages(
    pubsub: &PubSub,
    subscription: &str,
    expected: usize,
) -> HashSet<String> {
    let received = pubsub.plain_receiver(subscription, expected.max(1), UNACKED_READ_WINDOW);
    received.await.unwrap()
}

/// As [`unacked_messages`], the `event_id` attribute of each (`None` without one).
pub async fn unacked_event_ids(pubsub: &PubSub, subscription: &str) -> HashSet<Option<String>> {
    let received = pubsub.plain_client_taking(subscription, 1, UNACKED_READ_WINDOW, true, |m| {
        m.attributes.get("event_id").cloned()
    });
    received.await.unwrap()
}

/// `take(message)` of each message still unacked on `subscription` (a subscription no test
/// worker reads any more), read by a plain client opened at once, until a control shows that
/// the read lasted long enough: on a control topic of its own, a plain client takes
/// [`CONTROL_HELD`] of [`CONTROL_MESSAGES`] and closes its stream without acking them, and a
/// second reader must find all of them, the held ones included (it panics if not, within
/// [`UNACKED_READ_WINDOW`]). The real read ends [`CONTROL_MARGIN`] after the control's did.
pub async fn unacked_beside_control<T: std::hash::Hash + Eq + Send + 'static>(
    pubsub: &PubSub,
    subscription: &str,
    take: fn(&google_cloud_pubsub::model::Message) -> T,
) -> HashSet<T> {
    let (control_done, stop) = tokio::sync::watch::channel(false);
    let started = std::time::Instant::now();
    let real = pubsub.plain_client_until(
        subscription,
        usize::MAX,
        UNACKED_READ_WINDOW,
        true,
        take,
        stop,
    );
    let (control_topic, control_subs) = pubsub.topic_with("unacked-control", 1).await;
    pubsub
        .publish(
            &control_topic,
            (0..CONTROL_MESSAGES)
                .map(|i| event(&format!("x{i}")))
                .collect(),
        )
        .await;
    let held = pubsub
        .plain_client(
            &control_subs[0],
            CONTROL_HELD,
            Duration::from_secs(30),
            false,
        )
        .await
        .unwrap();
    let found = unacked_messages(pubsub, &control_subs[0], CONTROL_MESSAGES).await;
    let control_took = started.elapsed();
    tokio::time::sleep(CONTROL_MARGIN).await;
    let _ = control_done.send(true);
    let left = real.await.unwrap();
    println!(
        "unacked check: the control's messages were all back {:.0} s after the read began; \
         the read lasted {:.0} s",
        control_took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        held.len(),
        CONTROL_HELD,
        "the control's holder took too few"
    );
    let missed = held.difference(&found).count();
    assert_eq!(
        missed, 0,
        "the check missed {missed} messages a closed stream left unacked (the control)"
    );
    assert_eq!(found.len(), CONTROL_MESSAGES);
    left
}
