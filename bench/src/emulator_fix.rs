//! A one-class fix for a packaging fault of the Pub/Sub emulator (0.8.20, Debian's
//! `google-cloud-cli-pubsub-emulator`), applied when the emulator is started here.
//!
//! # The fault
//!
//! The emulator's jar bundles a gRPC server whose cancellation path calls
//! `io.grpc.InternalStatus.asRuntimeException(Status, Metadata, boolean)`, but the
//! `io.grpc.InternalStatus` bundled beside it has only `asRuntimeExceptionWithoutStacktrace`. So
//! when a client cancels a StreamingPull, or its process dies, the server logs a
//! `NoSuchMethodError` and the stream's server-side loop is never told: it goes on pulling
//! messages every 50 ms for a stream nobody reads. Each message it takes is hidden for the dead
//! stream's ack deadline and then raced for again, so a subscription whose stream was cancelled
//! or killed delivers to new streams only after one or more ack deadlines (the 2-3 minute
//! stalls of `docs/architecture-notes.md`, "Pub/Sub client facts"). Found by reading the jar's
//! bytecode and measured with a raw gRPC client, 2026-12-05: a new message reached a new stream
//! 11 s after a cancel (1.1 s with this fix); messages held by a stream cancelled with a 60 s
//! ack deadline came back after 179 s (59 s, one deadline, with it); after a client process was
//! SIGKILLed its stream's loop lived on (with the fix: none).
//!
//! # The fix
//!
//! A class `io.grpc.InternalStatus` with the jar's own members, built as the jar builds them,
//! plus the missing method (a stack trace only when asked for, as gRPC does), compiled with the
//! machine's `javac` for the jar's Java 8 into a directory of its own for each start (the
//! [`EmulatorFix`] holds it; nothing is shared between starts or users) and put ahead of the
//! jar on the class path, so that a cancelled stream ends as it should. It is applied only where
//! the jar's own class lacks the method (checked with `javap`), and only where a JDK is
//! installed (`$JAVA_HOME/bin` when set, else the `PATH`); elsewhere the emulator runs by its
//! launcher as shipped and [`EmulatorFix::missing`] says why. The test harness refuses to run
//! without it: the suite's waits for a killed worker's messages assume one stream ack deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The emulator's entry point (its jar's `Main-Class`).
pub const MAIN_CLASS: &str = "com.google.cloud.pubsub.testing.v1.Main";

/// The class that replaces the jar's own: its two fields and its method as the jar has them,
/// plus the method the jar's server calls.
const FIXED_CLASS: &str = r#"package io.grpc;

/** sluice: the emulator's InternalStatus with the method its gRPC server calls on a cancel. */
public final class InternalStatus {
    public static final Metadata.Key<String> MESSAGE_KEY = Status.MESSAGE_KEY;
    public static final Metadata.Key<Status> CODE_KEY = Status.CODE_KEY;

    private InternalStatus() {}

    public static StatusRuntimeException asRuntimeExceptionWithoutStacktrace(
            Status status, Metadata trailers) {
        return new InternalStatusRuntimeException(status, trailers);
    }

    public static StatusRuntimeException asRuntimeException(
            Status status, Metadata trailers, boolean withStacktrace) {
        return withStacktrace
                ? new StatusRuntimeException(status, trailers)
                : new InternalStatusRuntimeException(status, trailers);
    }
}
"#;

/// The signature whose absence is the fault, as `javap` prints it.
const MISSING_METHOD: &str = "asRuntimeException(io.grpc.Status, io.grpc.Metadata, boolean)";

/// How the emulator's JVM is started: with the fix ahead of its jar, or by its own launcher.
#[derive(Debug)]
pub enum EmulatorFix {
    /// Run `java -cp <classes>:<jar> MAIN_CLASS`.
    Applied {
        /// The `java` of the JDK that compiled the fix.
        java: PathBuf,
        /// The compiled fix, removed when this is dropped.
        classes: tempfile::TempDir,
        /// The emulator's jar.
        jar: PathBuf,
    },
    /// The launcher as shipped: its jar has no such fault.
    NotNeeded,
    /// The launcher as shipped, with the fault, for the reason given (no JDK, say).
    Unavailable(String),
}

impl EmulatorFix {
    /// Decides for the emulator whose launcher is `launcher`, compiling the fix if it is needed.
    pub fn prepare(launcher: &Path) -> Self {
        match prepare(launcher) {
            Ok(Some(fix)) => fix,
            Ok(None) => Self::NotNeeded,
            Err(why) => Self::Unavailable(why),
        }
    }

    /// Why a cancelled or killed stream still holds its subscription back on this emulator, if
    /// it does.
    pub fn missing(&self) -> Option<&str> {
        match self {
            Self::Applied { .. } | Self::NotNeeded => None,
            Self::Unavailable(why) => Some(why),
        }
    }

    /// The class path that puts the fix ahead of the jar, when it is applied.
    pub fn class_path(&self) -> Option<String> {
        match self {
            Self::Applied { classes, jar, .. } => Some(format!(
                "{}:{}",
                classes.path().join("classes").display(),
                jar.display()
            )),
            Self::NotNeeded | Self::Unavailable(_) => None,
        }
    }
}

fn prepare(launcher: &Path) -> Result<Option<EmulatorFix>, String> {
    let jar = emulator_jar(launcher)?;
    let javap = run(Command::new(jdk_tool("javap"))
        .arg("-cp")
        .arg(&jar)
        .args(["io.grpc.InternalStatus", MAIN_CLASS]))?;
    if javap.contains(MISSING_METHOD) {
        return Ok(None);
    }
    let classes = tempfile::Builder::new()
        .prefix("sluice-emulator-fix-")
        .tempdir()
        .map_err(|e| format!("a directory for the fix: {e}"))?;
    let source_dir = classes.path().join("src/io/grpc");
    std::fs::create_dir_all(&source_dir).map_err(|e| e.to_string())?;
    let source = source_dir.join("InternalStatus.java");
    std::fs::write(&source, FIXED_CLASS).map_err(|e| e.to_string())?;
    // For the jar's Java 8 (class file version 52), so that any `java` loads it; a JDK that
    // no longer builds for Java 8 builds for its own `java`, which then runs the emulator.
    let javac = |release: &[&str]| {
        run(Command::new(jdk_tool("javac"))
            .arg("-nowarn")
            .args(release)
            .arg("-cp")
            .arg(&jar)
            .arg("-d")
            .arg(classes.path().join("classes"))
            .arg(&source))
    };
    javac(&["--release", "8"]).or_else(|_| javac(&[]))?;
    Ok(Some(EmulatorFix::Applied {
        java: jdk_tool("java"),
        classes,
        jar,
    }))
}

/// A JDK tool: from `$JAVA_HOME/bin` when it is set (as the launcher picks `java`), else from the
/// `PATH`.
fn jdk_tool(name: &str) -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) if !home.is_empty() => Path::new(&home).join("bin").join(name),
        _ => PathBuf::from(name),
    }
}

/// The jar beside the launcher: `<home>/bin/cloud-pubsub-emulator` runs
/// `<home>/lib/cloud-pubsub-emulator-<version>-all.jar`.
fn emulator_jar(launcher: &Path) -> Result<PathBuf, String> {
    let lib = launcher
        .parent()
        .and_then(Path::parent)
        .map(|home| home.join("lib"))
        .ok_or_else(|| format!("no lib directory beside {}", launcher.display()))?;
    std::fs::read_dir(&lib)
        .map_err(|e| format!("{}: {e}", lib.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name().is_some_and(|name| {
                let name = name.to_string_lossy();
                name.starts_with("cloud-pubsub-emulator-") && name.ends_with(".jar")
            })
        })
        .ok_or_else(|| format!("no emulator jar in {}", lib.display()))
}

/// Runs a JDK tool, its standard output on success.
fn run(command: &mut Command) -> Result<String, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} (a JDK) is not available: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
