//! The watermark's probes as messages: what a tracking reader publishes to its topic, and how
//! every source tells a probe from data that carries the reserved attribute.
//!
//! A probe has no data and one attribute, [`PROBE_ATTRIBUTE`], whose value is
//! `<reader>/<start>/<n>` (the reader's worker id, when that reading started in ms, the probe's
//! sequence number).
//!
//! # Guarantee
//!
//! Every message is a probe or data, the same for every source and the tracking reader
//! ([`is_probe`]). A data source acks a probe and counts it
//! (`sluice_probes_dropped_total{subscription}`). A message that carries [`PROBE_ATTRIBUTE`]
//! but is not shaped as a probe (it has data, or another value) is data that misuses the
//! reserved attribute: it is delivered with a problem ([`reserved_attribute_problem`]), so
//! the stage dead-letters it with reason [`RESERVED_ATTRIBUTE_REASON`], and the tracking reader
//! tracks it like any data (so its dead letter settles it for the watermark).
//!
//! # What it does not cover
//!
//! A message shaped exactly as a probe (the attribute with such a value, no data) is taken for
//! one: acked and counted, not dead-lettered.

use crate::flow::delivery::SourceProblem;

/// The attribute of the probes a watermark's tracking reader publishes to its topic (see
/// `sluice_watermark`'s horizon): every [`super::PubSubSource`] acks and drops probes
/// ([`is_probe`]), except the tracking reader's own.
pub const PROBE_ATTRIBUTE: &str = "sluice-probe";

/// The dead-letter reason of data that carries [`PROBE_ATTRIBUTE`] without being a probe.
pub const RESERVED_ATTRIBUTE_REASON: &str = "reserved_attribute";

/// Probe `seq` of the reading whose probes carry `prefix` (`<reader>/<start>/`).
pub fn probe_message(prefix: &str, seq: u64) -> google_cloud_pubsub::model::Message {
    google_cloud_pubsub::model::Message::new()
        .set_attributes([(PROBE_ATTRIBUTE, format!("{prefix}{seq}"))])
}

/// Whether a message whose [`PROBE_ATTRIBUTE`] is `value`, with `data`, is a probe: no data,
/// and a value `<reader>/<start>/<n>` (a non-empty reader, two numbers).
pub fn is_probe(value: &str, data: &[u8]) -> bool {
    let mut parts = value.rsplitn(3, '/');
    let number = |part: Option<&str>| {
        part.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    data.is_empty()
        && number(parts.next())
        && number(parts.next())
        && parts.next().is_some_and(|reader| !reader.is_empty())
}

/// The problem of a data message that carries [`PROBE_ATTRIBUTE`] = `value` without being a
/// probe: it is dead-lettered.
pub fn reserved_attribute_problem(value: &str) -> SourceProblem {
    SourceProblem {
        reason: RESERVED_ATTRIBUTE_REASON,
        error: format!(
            "the message carries the attribute {PROBE_ATTRIBUTE} ({value:?}), which sluice \
             reserves for its watermark probes, and is not one (a probe has no data and a value \
             <reader>/<start>/<n>)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_shaped_as_readers_publish_them() {
        let probe = probe_message("w-1a2b/1700000000000/", 7);
        let value = &probe.attributes[PROBE_ATTRIBUTE];
        assert!(is_probe(value, &probe.data));
        assert!(is_probe("host/with/slashes/12/0", b""));
        assert!(!is_probe(value, b"{\"id\":1}"), "data");
        for value in [
            "", "x", "w/12", "/12/3", "w/12/", "w//3", "w/1a/3", "w/12/-3",
        ] {
            assert!(!is_probe(value, b""), "{value:?}");
        }
    }
}
