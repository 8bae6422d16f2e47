//! The database server's clock as seen from this process: the offset between the server's
//! clock and the local one, measured with a round trip, so that a deadline the caller gives on
//! its own clock ([`crate::CommitBatch::commit_by_ms`]) can be checked on the server's.
//!
//! A measurement reads the server's `clock_timestamp()` between two local readings `before` and
//! `after`; the server read its clock somewhere in between, so the true offset lies in
//! `[server - after, server - before]`. The lower end is kept: converting a local deadline with
//! it gives a server deadline no later than the true one, whatever the round trip took. So a
//! slow or lost measurement can only make a deadline earlier (a batch nacked a little early),
//! never later.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// The latest lower bound of `server clock - local clock`, ms.
#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    offset_low_ms: AtomicI64,
    measured: AtomicBool,
}

impl ServerClock {
    /// Measures the offset on `client` (one round trip).
    pub(crate) async fn measure(
        &self,
        client: &impl deadpool_postgres::GenericClient,
    ) -> Result<(), tokio_postgres::Error> {
        let row = client
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
                &[],
            )
            .await?;
        let after = crate::local_clock::now_ms();
        let server: i64 = row.try_get(0)?;
        self.offset_low_ms
            .store(server.saturating_sub(after), Ordering::Relaxed);
        self.measured.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether a measurement was taken.
    pub(crate) fn is_measured(&self) -> bool {
        self.measured.load(Ordering::Acquire)
    }

    /// `local_ms` (the caller's clock) on the server's clock, at the latest.
    pub(crate) fn to_server(&self, local_ms: i64) -> i64 {
        local_ms.saturating_add(self.offset_low_ms.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_adds_the_offset() {
        let clock = ServerClock::default();
        clock.offset_low_ms.store(-1_500, Ordering::Relaxed);
        assert_eq!(clock.to_server(10_000), 8_500);
    }
}
