//! [`RawPipeline`] → [`Pipeline`]: applies every default and checks each value on its own
//! (presence, range, humane syntax, which sub-section goes with which kind). Checks that relate
//! several parts of the file (names, references, mode) live in [`crate::validate`].
//!
//! Every problem is recorded in the [`Collector`]; the returned model is only meaningful when
//! none was.

use std::time::Duration;

use crate::errors::{Collector, ErrorCode};
use crate::fields::{duration, non_empty, positive_duration, required};
use crate::model::{
    Mode, Pipeline, PubSubSettings, Schedule, ScheduleSemantics, ScheduleWhen, Target, TargetKind,
};
use crate::raw::{
    RawControl, RawKind, RawMetrics, RawMode, RawPipeline, RawSchedule, RawSemantics, RawTarget,
};
use crate::{defaults, paths, source, timetable};

/// Converts the whole file.
pub(crate) fn convert(raw: RawPipeline, c: &mut Collector<'_>) -> Pipeline {
    let name = required(c, raw.pipeline, "pipeline");
    let mode = match raw.mode {
        None | Some(RawMode::Continuous) => Mode::Continuous,
        Some(RawMode::Triggered) => Mode::Triggered,
    };
    let store = match raw.store {
        None => format!("sqlite://state/{name}.db"),
        Some(store) => check_store(c, store),
    };
    let store = paths::store_beside(c.file(), store);
    let pubsub = raw
        .pubsub
        .map_or_else(PubSubSettings::default, |p| PubSubSettings {
            project: p.project.map(|v| non_empty(c, v, "pubsub.project")),
            endpoint: p.endpoint.map(|v| non_empty(c, v, "pubsub.endpoint")),
        });
    let metrics_listen = raw
        .metrics
        .map(|m: RawMetrics| listen(c, m.listen, "metrics.listen"));
    let (control_listen, control_token_file) = match raw.control {
        None => (None, None),
        Some(RawControl {
            listen: l,
            token_file,
        }) => (
            Some(listen(c, l, "control.listen")),
            token_file.map(|t| paths::beside(c.file(), &non_empty(c, t, "control.token_file"))),
        ),
    };
    let dead_letter_topic = raw.dead_letter.map(|d| {
        let topic = required(c, d.topic, "dead_letter.topic");
        if let Err(why) = check_topic(&topic) {
            c.push(ErrorCode::InvalidValue, "dead_letter.topic", why);
        }
        topic
    });
    let schedule = raw.schedule.map(|s| schedule(c, s));
    let give_up_after = match mode {
        Mode::Triggered => Some(positive_duration(
            c,
            raw.give_up_after,
            "give_up_after",
            defaults::GIVE_UP_AFTER,
        )),
        Mode::Continuous => {
            if raw.give_up_after.is_some() {
                c.push(
                    ErrorCode::InvalidValue,
                    "give_up_after",
                    "a continuous pipeline waits for its store and Pub/Sub as long as they are \
                     away (its pods stay up, as Kubernetes expects): `give_up_after` is for \
                     `mode: triggered`",
                );
            }
            None
        }
    };
    let targets: Vec<Target> = raw
        .targets
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| target(c, t, &format!("targets[{i}]")))
        .collect();
    let flows = raw
        .flows
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, f)| source::flow(c, f, &format!("flows[{i}]"), &targets))
        .collect::<Vec<_>>();
    crate::apply_changes::one_sequence_per_table(c, &flows);
    Pipeline {
        name,
        mode,
        store,
        pubsub,
        metrics_listen,
        control_listen,
        control_token_file,
        dead_letter_topic,
        schedule,
        give_up_after,
        targets,
        flows,
        views: Vec::new(),
    }
}

/// A topic name as Pub/Sub accepts it: `projects/P/topics/T` or `T`, where `T` has 3 to 255
/// characters, starts with a letter, holds only letters, digits and `-_.~+%`, and does not
/// start with `goog` (Pub/Sub's resource name rules). An empty name is `required`'s error.
fn check_topic(name: &str) -> Result<(), String> {
    let short = match name.strip_prefix("projects/") {
        None => name,
        Some(rest) => match rest.split_once("/topics/") {
            Some((project, topic)) if !project.is_empty() && !project.contains('/') => topic,
            _ => return Err(format!("`{name}` is not projects/PROJECT/topics/TOPIC")),
        },
    };
    let allowed = |ch: char| ch.is_ascii_alphanumeric() || "-_.~+%".contains(ch);
    if name.is_empty()
        || ((3..=255).contains(&short.len())
            && short.starts_with(|ch: char| ch.is_ascii_alphabetic())
            && short.chars().all(allowed)
            && !short.starts_with("goog"))
    {
        Ok(())
    } else {
        Err(format!(
            "`{short}` is not a topic name: 3 to 255 letters, digits or -_.~+%, starting with \
             a letter and not with goog"
        ))
    }
}

fn check_store(c: &mut Collector<'_>, store: String) -> String {
    let known = ["sqlite:", "postgres://", "postgresql://"];
    if !known.iter().any(|scheme| store.starts_with(scheme)) {
        c.push(
            ErrorCode::InvalidValue,
            "store",
            format!("`{store}` is not a store URL; use sqlite://PATH or postgres://USER@HOST/DB"),
        );
    }
    store
}

/// `host:port` with a numeric port.
fn listen(c: &mut Collector<'_>, value: Option<String>, path: &str) -> String {
    let value = required(c, value, path);
    let ok = value
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !value.is_empty() && !ok {
        c.push(
            ErrorCode::InvalidValue,
            path,
            format!("`{value}` is not HOST:PORT (e.g. 127.0.0.1:9464)"),
        );
    }
    value
}

fn schedule(c: &mut Collector<'_>, raw: RawSchedule) -> Schedule {
    let when = match (raw.cron, raw.every) {
        (Some(cron), None) => {
            if let Err(message) = timetable::parse_cron(&cron) {
                c.push(ErrorCode::InvalidSchedule, "schedule.cron", message);
            }
            ScheduleWhen::Cron(cron)
        }
        (None, Some(every)) => {
            let every = positive_duration(c, Some(every), "schedule.every", Duration::ZERO);
            if !every.is_zero() && every.subsec_nanos() != 0 {
                c.push(
                    ErrorCode::InvalidSchedule,
                    "schedule.every",
                    "must be a whole number of seconds",
                );
            }
            ScheduleWhen::Every(every)
        }
        (cron, every) => {
            let message = if cron.is_some() && every.is_some() {
                "give either `cron` or `every`, not both"
            } else {
                "a schedule needs `cron` or `every`"
            };
            c.push(ErrorCode::InvalidSchedule, "schedule", message);
            ScheduleWhen::Every(Duration::ZERO)
        }
    };
    let timezone = raw
        .timezone
        .unwrap_or_else(|| defaults::SCHEDULE_TIMEZONE.to_owned());
    if let Err(message) = timetable::time_zone(&timezone) {
        c.push(ErrorCode::InvalidSchedule, "schedule.timezone", message);
    }
    let semantics = match raw.semantics {
        None | Some(RawSemantics::Trigger) => ScheduleSemantics::Trigger,
        Some(RawSemantics::DataInterval) => ScheduleSemantics::DataInterval,
    };
    let interval = raw.interval.map(|i| {
        if semantics != ScheduleSemantics::DataInterval {
            c.push(
                ErrorCode::InvalidSchedule,
                "schedule.interval",
                "`interval` sets the data interval of each run: it needs `semantics: data_interval`",
            );
        }
        positive_duration(c, Some(i), "schedule.interval", Duration::ZERO)
    });
    let (on_update, update_condition) = crate::update_condition::on_update(c, raw.on_update);
    if raw.min_interval.is_some() && !on_update {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule.min_interval",
            "`min_interval` spaces the runs `on_update` fires: it needs `on_update`",
        );
    }
    let zone = timetable::time_zone(&timezone).ok();
    let mut date = |text: Option<String>, key: &str| {
        let (text, zone) = (text?, zone.as_ref()?);
        timetable::instant(&text, zone)
            .map_err(|message| c.push(ErrorCode::InvalidSchedule, key, message))
            .ok()
    };
    let start_ms = date(raw.start_date, "schedule.start_date");
    let end_ms = date(raw.end_date, "schedule.end_date");
    if let (Some(start), Some(end)) = (start_ms, end_ms)
        && end < start
    {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule.end_date",
            "`end_date` is before `start_date`: the schedule would never fire",
        );
    }
    if on_update && (start_ms.is_some() || end_ms.is_some()) {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule.on_update",
            "runs fired by `on_update` do not keep to `start_date` and `end_date` yet: give \
             either `on_update` or the dates",
        );
    }
    // Airflow's `max_active_runs`: a pipeline's runs never overlap here (one run at a time,
    // in a pool too), so 1 is the only bound there is.
    if raw.max_active_runs.is_some_and(|n| n != 1) {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule.max_active_runs",
            "a pipeline's runs never overlap (one run at a time, in a pool too), so \
             `max_active_runs` can only be 1, the default",
        );
    }
    let depends_on_past = raw.depends_on_past.unwrap_or(false);
    if depends_on_past && on_update {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule.depends_on_past",
            "a fire that waits for the one before it holds every other run back, those \
             `on_update` fires too: give either `on_update` or `depends_on_past` (not built \
             together)",
        );
    }
    let retries = raw.retries.unwrap_or(0);
    if raw.retry_delay.is_some() && retries == 0 {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule.retry_delay",
            "`retry_delay` spaces the retries of a failed run: it needs `retries`",
        );
    }
    let retry_delay = positive_duration(
        c,
        raw.retry_delay,
        "schedule.retry_delay",
        defaults::SCHEDULE_RETRY_DELAY,
    );
    Schedule {
        when,
        timezone,
        semantics,
        start_ms,
        end_ms,
        retries,
        retry_delay,
        depends_on_past,
        catchup: raw.catchup.unwrap_or(false),
        interval,
        on_update,
        update_condition,
        min_interval: positive_duration(
            c,
            raw.min_interval,
            "schedule.min_interval",
            defaults::SCHEDULE_MIN_INTERVAL,
        ),
    }
}

fn target(c: &mut Collector<'_>, raw: RawTarget, path: &str) -> Target {
    let name = required(c, raw.name, &format!("{path}.name"));
    let Some(kind) = raw.kind else {
        c.push(
            ErrorCode::MissingField,
            &format!("{path}.kind"),
            "`kind` is required: table, view, sink, window or foreach_batch",
        );
        return Target {
            name,
            kind: TargetKind::Table,
            columns: Vec::new(),
            columns_follow_schema: false,
            keys: Vec::new(),
        };
    };
    // A sub-section is required with its own kind and refused with any other.
    let sections = [
        ("sink", RawKind::Sink, raw.sink.is_some()),
        ("window", RawKind::Window, raw.window.is_some()),
        (
            "foreach_batch",
            RawKind::ForeachBatch,
            raw.foreach_batch.is_some(),
        ),
    ];
    for (key, owner, present) in sections {
        if present && kind != owner {
            c.push(
                ErrorCode::UnknownKey,
                &format!("{path}.{key}"),
                format!("`{key}` only applies to targets of kind {key}"),
            );
        } else if !present && kind == owner {
            c.push(
                ErrorCode::MissingField,
                &format!("{path}.{key}"),
                format!("a target of kind {key} needs a `{key}:` section"),
            );
        }
    }
    let kind = match kind {
        RawKind::Table => TargetKind::Table,
        RawKind::View => TargetKind::View,
        RawKind::Sink => {
            let sink = raw.sink.unwrap_or_default();
            let at = format!("{path}.sink.format");
            let format = sink.format.unwrap_or_else(|| "jsonl".to_owned());
            if format != "jsonl" {
                c.push(
                    ErrorCode::InvalidValue,
                    &at,
                    format!("unknown sink format `{format}`; the only one is jsonl"),
                );
            }
            let path_at = format!("{path}.sink.path");
            let folder = required(c, sink.path, &path_at);
            if let Some((scheme, _)) = folder.split_once("://") {
                c.push(
                    ErrorCode::InvalidValue,
                    &path_at,
                    format!(
                        "`{folder}`: a sink writes files to a local folder; `{scheme}://` is \
                         not a place sinks can write to (object storage is not built yet), \
                         so give a path like out/events"
                    ),
                );
            }
            TargetKind::Sink {
                format,
                path: paths::beside(c.file(), &folder),
            }
        }
        RawKind::Window => {
            let window = raw.window.unwrap_or_default();
            let size_path = format!("{path}.window.size");
            if window.size.is_none() && raw_has_section(c, &format!("{path}.window")) {
                c.push(ErrorCode::MissingField, &size_path, "`size` is required");
            }
            TargetKind::Window {
                size: positive_duration(c, window.size, &size_path, Duration::ZERO),
                group_by: required(c, window.group_by, &format!("{path}.window.group_by")),
                allowed_lateness: duration(
                    c,
                    window.allowed_lateness,
                    &format!("{path}.window.allowed_lateness"),
                    Duration::ZERO,
                ),
                aggregates: crate::aggregates::aggregates(
                    c,
                    window.aggregates,
                    &format!("{path}.window.aggregates"),
                ),
            }
        }
        RawKind::ForeachBatch => TargetKind::ForeachBatch {
            endpoint: required(
                c,
                raw.foreach_batch.and_then(|f| f.endpoint),
                &format!("{path}.foreach_batch.endpoint"),
            ),
        },
    };
    let columns = match raw.columns {
        None => Vec::new(),
        Some(_) if !matches!(kind, TargetKind::Table | TargetKind::View) => {
            c.push(
                ErrorCode::UnknownKey,
                &format!("{path}.columns"),
                "`columns` only applies to targets of kind table and view",
            );
            Vec::new()
        }
        Some(columns) => crate::query::columns(c, columns, &format!("{path}.columns")),
    };
    let keys = crate::apply_changes::keys(c, raw.keys, path, &kind, &columns);
    Target {
        name,
        kind,
        columns,
        columns_follow_schema: raw.columns_follow_schema,
        keys,
    }
}

/// Whether the file has this exact path (to avoid a second error under a missing section).
fn raw_has_section(c: &Collector<'_>, path: &str) -> bool {
    c.locator().contains(path)
}
