//! A timing the environment may change for every process of a pool (tests shorten waits that
//! exist for the emulator's slowness this way): a humane duration such as `90s` or `2m`, never
//! below a floor. A value that cannot be used is logged and the default kept, so a typo never
//! stops a worker.

use std::time::Duration;

/// The duration the environment variable `name` holds, or `default` when it is unset, not a
/// duration, or shorter than `shortest`.
pub(crate) fn from_env(name: &str, default: Duration, shortest: Duration) -> Duration {
    let Ok(text) = std::env::var(name) else {
        return default;
    };
    match humantime::parse_duration(text.trim()) {
        Ok(value) if value >= shortest => {
            tracing::info!(variable = name, ?value, "timing from the environment");
            value
        }
        Ok(value) => {
            tracing::warn!(
                variable = name,
                ?value,
                ?default,
                "shorter than {shortest:?}; using the default"
            );
            default
        }
        Err(error) => {
            tracing::warn!(variable = name, %text, %error, ?default,
                "not a duration; using the default");
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_short_and_unreadable_values_keep_the_default() {
        let default = Duration::from_secs(240);
        let shortest = Duration::from_secs(10);
        let name = "SLUICE_TEST_ENV_DURATION_UNSET";
        assert_eq!(from_env(name, default, shortest), default);
    }
}
