//! Pipeline files for the tests, built key by key ([`PipelineYaml`], [`FlowYaml`]) and rendered
//! as YAML text; only what a test sets is written, so the worker's defaults apply to the rest.

use crate::{PROJECT, emulator};
use std::path::{Path, PathBuf};

/// A YAML double-quoted string (for paths, URLs and anything with a `:` in it).
fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A test pipeline file, built up key by key and rendered as YAML text:
///
/// ```yaml
/// pipeline: NAME
/// mode: MODE                                   # if set
/// store: "URL"                                 # if set
/// pubsub: { project: P, endpoint: "E" }        # if set
/// metrics: { listen: "ADDR" }                  # if set
/// control: { ... }                             # if set
/// schedule: { ... }                            # if set
/// targets:
///   - { name: N, kind: table }                 # or window, sink, foreach_batch:
///   - { name: N, kind: K, K: { ... } }
/// flows:
///   - name: ...                                # as [`FlowYaml`] renders it
/// ```
///
/// Only what a test sets is written: the worker's defaults apply to the rest. Inline maps
/// (`{ ... }`) are passed through as written. Malformed files stay literal text in their tests.
#[derive(Debug, Clone)]
pub struct PipelineYaml {
    name: String,
    mode: Option<String>,
    store: Option<String>,
    pubsub: Option<(String, String)>,
    metrics_listen: Option<String>,
    control: Option<String>,
    schedule: Option<String>,
    dead_letter_topic: Option<String>,
    targets: Vec<String>,
    flows: Vec<FlowYaml>,
}

impl PipelineYaml {
    /// `pipeline: NAME`, nothing else yet.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            mode: None,
            store: None,
            pubsub: None,
            metrics_listen: None,
            control: None,
            schedule: None,
            dead_letter_topic: None,
            targets: Vec::new(),
            flows: Vec::new(),
        }
    }

    /// `mode:` (`continuous` or `triggered`).
    pub fn mode(mut self, mode: &str) -> Self {
        self.mode = Some(mode.to_owned());
        self
    }

    /// `store:` URL (`sqlite://...`, `postgres://...`).
    pub fn store(mut self, url: &str) -> Self {
        self.store = Some(url.to_owned());
        self
    }

    /// `store: sqlite://PATH`.
    pub fn sqlite(self, path: &Path) -> Self {
        self.store(&format!("sqlite://{}", path.display()))
    }

    /// `pubsub: { project: PROJECT, endpoint: "ENDPOINT" }`.
    pub fn pubsub(mut self, project: &str, endpoint: &str) -> Self {
        self.pubsub = Some((project.to_owned(), endpoint.to_owned()));
        self
    }

    /// `pubsub:` of the run's emulator and [`PROJECT`].
    pub fn pubsub_emulator(self) -> Self {
        self.pubsub(PROJECT, &emulator().endpoint())
    }

    /// `metrics: { listen: "ADDRESS" }`.
    pub fn metrics(mut self, listen: &str) -> Self {
        self.metrics_listen = Some(listen.to_owned());
        self
    }

    /// `control: INLINE_MAP` (`{ listen: "127.0.0.1:PORT" }`).
    pub fn control(mut self, inline_map: &str) -> Self {
        self.control = Some(inline_map.to_owned());
        self
    }

    /// `schedule: INLINE_MAP` (`{ cron: "*/5 * * * * *" }`).
    pub fn schedule(mut self, inline_map: &str) -> Self {
        self.schedule = Some(inline_map.to_owned());
        self
    }

    /// `dead_letter: { topic: TOPIC }`.
    pub fn dead_letter_topic(mut self, topic: &str) -> Self {
        self.dead_letter_topic = Some(topic.to_owned());
        self
    }

    /// What the scheduled Pub/Sub tests share: `mode: triggered`, fires every 5 s
    /// (`*/5 * * * * *`), a table `events` filled by flow `ingest` from `subscription` (dedup
    /// by `event_id`, `drain_idle: 20s`, above the emulator's hold after a stream closes).
    pub fn ingest_every_five_seconds(self, subscription: &str) -> Self {
        self.mode("triggered")
            .schedule("{ cron: \"*/5 * * * * *\" }")
            .target_table("events")
            .flow(
                FlowYaml::pubsub("ingest", "events", subscription)
                    .dedup_attribute("event_id")
                    .drain_idle("20s"),
            )
    }

    /// A target `{ name: NAME, kind: table }`.
    pub fn target_table(mut self, name: &str) -> Self {
        self.targets
            .push(format!("{{ name: {name}, kind: table }}"));
        self
    }

    /// A target `{ name: NAME, kind: KIND, KIND: SETTINGS }`, `settings` an inline map (a
    /// window's `{ size: 10s, group_by: "attribute:region" }`, a sink's `{ format: jsonl, ... }`).
    pub fn target(mut self, name: &str, kind: &str, settings: &str) -> Self {
        self.targets.push(format!(
            "{{ name: {name}, kind: {kind}, {kind}: {settings} }}"
        ));
        self
    }

    /// A window target: `window: { size: SIZE, group_by: "GROUP_BY", allowed_lateness: L }`.
    pub fn target_window(
        self,
        name: &str,
        size: &str,
        group_by: &str,
        allowed_lateness: &str,
    ) -> Self {
        let settings = format!(
            "{{ size: {size}, group_by: {}, allowed_lateness: {allowed_lateness} }}",
            quoted(group_by)
        );
        self.target(name, "window", &settings)
    }

    /// A flow, after those added before.
    pub fn flow(mut self, flow: FlowYaml) -> Self {
        self.flows.push(flow);
        self
    }

    /// The YAML text.
    pub fn render(&self) -> String {
        let mut out = format!("pipeline: {}\n", self.name);
        if let Some(mode) = &self.mode {
            out.push_str(&format!("mode: {mode}\n"));
        }
        if let Some(store) = &self.store {
            out.push_str(&format!("store: {}\n", quoted(store)));
        }
        if let Some((project, endpoint)) = &self.pubsub {
            out.push_str(&format!(
                "pubsub: {{ project: {project}, endpoint: {} }}\n",
                quoted(endpoint)
            ));
        }
        if let Some(listen) = &self.metrics_listen {
            out.push_str(&format!("metrics: {{ listen: {} }}\n", quoted(listen)));
        }
        if let Some(control) = &self.control {
            out.push_str(&format!("control: {control}\n"));
        }
        if let Some(schedule) = &self.schedule {
            out.push_str(&format!("schedule: {schedule}\n"));
        }
        if let Some(topic) = &self.dead_letter_topic {
            out.push_str(&format!("dead_letter: {{ topic: {} }}\n", quoted(topic)));
        }
        out.push_str("targets:\n");
        for target in &self.targets {
            out.push_str(&format!("  - {target}\n"));
        }
        out.push_str("flows:\n");
        for flow in &self.flows {
            out.push_str(&flow.render());
        }
        out
    }

    /// Writes the text to `dir/file`; returns that path.
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, self.render()).unwrap();
        path
    }
}

/// The source of a [`FlowYaml`].
#[derive(Debug, Clone)]
enum FlowSource {
    /// `pubsub:` with its settings, in order (`subscription` first).
    PubSub(Vec<(String, String)>),
    /// `file: { path: "GLOB" }` with its other settings, in order.
    File(String, Vec<(String, String)>),
    /// `table: NAME`.
    Table(String),
}

/// One entry of a [`PipelineYaml`]'s `flows:`, rendered as
///
/// ```yaml
///   - name: NAME
///     target: TARGET
///     once: true                       # if set
///     depends_on: A                    # if set; several as [A, B]
///     source:
///       pubsub:
///         subscription: SUB
///         KEY: VALUE                   # each setting, in the order set
/// ```
///
/// or with `source: { file: { path: "GLOB" } }` or `source: { table: NAME }`.
#[derive(Debug, Clone)]
pub struct FlowYaml {
    name: String,
    target: String,
    once: bool,
    depends_on: Vec<String>,
    source: FlowSource,
}

impl FlowYaml {
    fn with_source(name: &str, target: &str, source: FlowSource) -> Self {
        Self {
            name: name.to_owned(),
            target: target.to_owned(),
            once: false,
            depends_on: Vec::new(),
            source,
        }
    }

    /// A flow from a Pub/Sub subscription (no other source settings yet).
    pub fn pubsub(name: &str, target: &str, subscription: &str) -> Self {
        let settings = vec![("subscription".to_owned(), subscription.to_owned())];
        Self::with_source(name, target, FlowSource::PubSub(settings))
    }

    /// A flow from the files matching `glob`.
    pub fn file(name: &str, target: &str, glob: &str) -> Self {
        Self::with_source(name, target, FlowSource::File(glob.to_owned(), Vec::new()))
    }

    /// A flow from the rows of table target `table`.
    pub fn table(name: &str, target: &str, table: &str) -> Self {
        Self::with_source(name, target, FlowSource::Table(table.to_owned()))
    }

    /// `once: true`.
    pub fn once(mut self) -> Self {
        self.once = true;
        self
    }

    /// `depends_on:` these flows.
    pub fn depends_on(mut self, flows: &[&str]) -> Self {
        self.depends_on = flows.iter().map(|f| (*f).to_owned()).collect();
        self
    }

    /// A setting of the `pubsub:` source, `value` as YAML (`3s`, `{ max_messages: 500 }`);
    /// panics for another source.
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        let FlowSource::PubSub(settings) = &mut self.source else {
            panic!(
                "flow {}: `{key}` is a setting of a pubsub source",
                self.name
            );
        };
        settings.push((key.to_owned(), value.to_owned()));
        self
    }

    /// A setting of the `file:` source besides its path, `value` as YAML (`1KiB`); panics for
    /// another source.
    pub fn file_setting(mut self, key: &str, value: &str) -> Self {
        let FlowSource::File(_, settings) = &mut self.source else {
            panic!("flow {}: `{key}` is a setting of a file source", self.name);
        };
        settings.push((key.to_owned(), value.to_owned()));
        self
    }

    /// `dedup: { by: attribute, attribute: ATTRIBUTE }`.
    pub fn dedup_attribute(self, attribute: &str) -> Self {
        self.setting(
            "dedup",
            &format!("{{ by: attribute, attribute: {attribute} }}"),
        )
    }

    /// `batch: { max_messages: N, max_delay: DELAY }`.
    pub fn batch(self, max_messages: usize, max_delay: &str) -> Self {
        self.setting(
            "batch",
            &format!("{{ max_messages: {max_messages}, max_delay: {max_delay} }}"),
        )
    }

    /// `drain_idle: DURATION`.
    pub fn drain_idle(self, duration: &str) -> Self {
        self.setting("drain_idle", duration)
    }

    /// `streams: N`.
    pub fn streams(self, streams: usize) -> Self {
        self.setting("streams", &streams.to_string())
    }

    /// `event_time: { attribute: ATTRIBUTE }`.
    pub fn event_time_attribute(self, attribute: &str) -> Self {
        self.setting("event_time", &format!("{{ attribute: {attribute} }}"))
    }

    /// `watermark: { tracking_subscription: TRACKING, band: BAND }` (`auto` or a name).
    pub fn watermark(self, tracking_subscription: &str, band: &str) -> Self {
        self.setting(
            "watermark",
            &format!("{{ tracking_subscription: {tracking_subscription}, band: {band} }}"),
        )
    }

    fn render(&self) -> String {
        let mut out = format!("  - name: {}\n    target: {}\n", self.name, self.target);
        if self.once {
            out.push_str("    once: true\n");
        }
        match self.depends_on.as_slice() {
            [] => {}
            [one] => out.push_str(&format!("    depends_on: {one}\n")),
            several => out.push_str(&format!("    depends_on: [{}]\n", several.join(", "))),
        }
        match &self.source {
            FlowSource::PubSub(settings) => {
                out.push_str("    source:\n      pubsub:\n");
                for (key, value) in settings {
                    out.push_str(&format!("        {key}: {value}\n"));
                }
            }
            FlowSource::File(glob, settings) => {
                let rest: String = settings
                    .iter()
                    .map(|(key, value)| format!(", {key}: {value}"))
                    .collect();
                out.push_str(&format!(
                    "    source: {{ file: {{ path: {}{rest} }} }}\n",
                    quoted(glob)
                ));
            }
            FlowSource::Table(table) => {
                out.push_str(&format!("    source: {{ table: {table} }}\n"))
            }
        }
        out
    }
}
