//! Starts Google's Pub/Sub emulator on a free loopback port, for the demo, the benchmarks and
//! the tests, and stops it (its whole process group: the JVM outlives a killed launcher). Where
//! a JDK is installed it runs with the fix of `emulator_fix.rs`, so that a cancelled or killed
//! StreamingPull does not hold its subscription's messages back from new streams.

use crate::emulator_fix::{EmulatorFix, MAIN_CLASS};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long the emulator may take to say "Server started" (its JVM start takes 3–10 s here).
pub const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Heap cap: the emulator's JVM grows to several GB under traffic otherwise. It keeps every
/// topic's messages, so a long-lived one fills its heap: with 1 GB, the test suite's shared
/// emulator reused for a second hour was in back-to-back full collections (2026-12-05).
pub const JAVA_HEAP: &str = "-Xmx2g";

/// Where Debian's `google-cloud-cli-pubsub-emulator` puts the launcher.
const LAUNCHERS: &[&str] = &[
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator",
    "/usr/share/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator",
];

/// Why the emulator did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmulatorError {
    /// No launcher found.
    #[error(
        "the Pub/Sub emulator is not installed (apt-get install google-cloud-cli-pubsub-emulator); \
         or set PUBSUB_EMULATOR_HOST to a running one"
    )]
    NotInstalled,
    /// Starting or waiting failed.
    #[error("the Pub/Sub emulator did not start: {0}")]
    Start(String),
    /// [`Emulator::start_fixed`]: the stream fix could not be applied.
    #[error(
        "the Pub/Sub emulator's stream fix (bench/src/emulator_fix.rs) could not be applied: {0}; \
         install a JDK (apt-get install default-jdk-headless)"
    )]
    Unfixed(String),
}

/// A running emulator, stopped on drop.
#[derive(Debug)]
pub struct Emulator {
    child: Child,
    port: u16,
    /// Held for its directory of compiled classes, which the JVM loads from while it runs
    /// (boxed: an emulator is held inside enums).
    _fix: Box<EmulatorFix>,
}

impl Emulator {
    /// Starts an emulator on a free port and waits until it serves; with the stream fix where it
    /// can be applied, else as shipped.
    pub fn start() -> Result<Self, EmulatorError> {
        Self::launch(false)
    }

    /// As [`Emulator::start`], refusing (before any JVM starts) an emulator whose stream fix
    /// cannot be applied: the test harness's waits assume it.
    pub fn start_fixed() -> Result<Self, EmulatorError> {
        Self::launch(true)
    }

    fn launch(fixed_only: bool) -> Result<Self, EmulatorError> {
        let launcher = LAUNCHERS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or(EmulatorError::NotInstalled)?;
        let fix = EmulatorFix::prepare(&launcher);
        if let (true, Some(why)) = (fixed_only, fix.missing()) {
            return Err(EmulatorError::Unfixed(why.to_owned()));
        }
        let port = free_port().map_err(|e| EmulatorError::Start(e.to_string()))?;
        let mut command = Command::new("sh");
        // A watchdog shell runs the emulator in its own process group and kills the group when
        // this process is gone, so an emulator never outlives a test binary or a killed demo;
        // it removes the fix's classes too (a test process's emulator is never dropped).
        command.arg("-c").arg(format!(
            "trap 'rm -rf \"$SLUICE_EMULATOR_FIX_DIR\"; kill -KILL 0' EXIT; \
             \"$0\" \"$@\" --host=127.0.0.1 --port={port} & \
             while kill -0 {parent} 2>/dev/null; do sleep 1; done",
            parent = std::process::id()
        ));
        match &fix {
            EmulatorFix::Applied { java, classes, .. } => {
                command
                    .env("SLUICE_EMULATOR_FIX_DIR", classes.path())
                    .arg(java)
                    .arg(JAVA_HEAP)
                    .arg("-cp")
                    .arg(fix.class_path().unwrap_or_default())
                    .arg(MAIN_CLASS);
            }
            EmulatorFix::NotNeeded | EmulatorFix::Unavailable(_) => {
                command
                    .env_remove("SLUICE_EMULATOR_FIX_DIR")
                    .arg(&launcher)
                    .env("JAVA_OPTS", JAVA_HEAP);
            }
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| EmulatorError::Start(e.to_string()))?;
        let (ready_tx, ready_rx) = mpsc::channel();
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let ready_tx = ready_tx.clone();
            std::thread::spawn(move || {
                // Keep reading to the end so the emulator never blocks on a full pipe.
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if line.contains("Server started") {
                        let _ = ready_tx.send(());
                    }
                }
            });
        }
        let emulator = Self {
            child,
            port,
            _fix: Box::new(fix),
        };
        ready_rx.recv_timeout(START_TIMEOUT).map_err(|_| {
            EmulatorError::Start(format!("no \"Server started\" within {START_TIMEOUT:?}"))
        })?;
        Ok(emulator)
    }

    /// `127.0.0.1:PORT`, the value for `PUBSUB_EMULATOR_HOST`.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT`, the value for `pubsub.endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        // The launcher is a shell script that starts a JVM; kill the whole group.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
