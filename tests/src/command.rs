//! One-shot `sluice` commands (`validate`, `status`, `reset`, a triggered `run`): run to their
//! end with a timeout, their exit code and both outputs collected.

use crate::sluice_bin;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a finished `sluice` command left.
#[derive(Debug)]
pub struct CommandOutput {
    /// Its exit code (-1 when a signal ended it).
    pub code: i32,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr (logs and error reports).
    pub stderr: String,
}

impl CommandOutput {
    /// Stdout then stderr, for assertion messages and searches across both.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// How long [`sluice_command`] lets a command run before it kills it and panics.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs `sluice ARGS` to its end, in `dir` (else the test's working directory), without the
/// environment's `PUBSUB_EMULATOR_HOST` and `RUST_LOG` (so logs are at the default `info`),
/// stdin closed; kills it and panics past [`COMMAND_TIMEOUT`].
pub fn sluice_command(args: &[&str], dir: Option<&Path>) -> CommandOutput {
    sluice_command_within(args, dir, COMMAND_TIMEOUT)
}

/// [`sluice_command`] with its own timeout.
pub fn sluice_command_within(
    args: &[&str],
    dir: Option<&Path>,
    timeout: Duration,
) -> CommandOutput {
    use std::io::Read;
    let mut command = Command::new(sluice_bin());
    command
        .args(args)
        .env_remove("PUBSUB_EMULATOR_HOST")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let mut child = command.spawn().unwrap();
    // Read both pipes while it runs, so that a full pipe never blocks it.
    let read = |mut from: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            from.read_to_string(&mut text).unwrap();
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "`sluice {}` did not exit within {timeout:?}; stderr:\n{}",
                args.join(" "),
                stderr.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    CommandOutput {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}
