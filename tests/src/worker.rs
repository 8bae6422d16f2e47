//! `sluice` worker processes (and the connector's example programs) started by a test, their
//! output in files beside the pipeline, killed when dropped.

use crate::{PROJECT, emulator, sluice_bin};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A `sluice` worker process.
pub struct Worker {
    child: Child,
    /// Its stdout.
    pub stdout: PathBuf,
    /// Its stderr (logs).
    pub stderr: PathBuf,
}

impl Worker {
    /// Starts `sluice run -c config`, logs into files next to the config.
    pub fn start(config: &Path, name: &str) -> Self {
        Self::spawn(
            &["run", "-c", config.to_str().unwrap()],
            config.parent().unwrap(),
            name,
        )
    }

    /// Starts `sluice ARGS` with its output in `dir/name.{out,err}`.
    pub fn spawn(args: &[&str], dir: &Path, name: &str) -> Self {
        let mut command = Command::new(sluice_bin());
        command.env_remove("PUBSUB_EMULATOR_HOST");
        Self::spawn_command(command, args, dir, name)
    }

    /// Starts `sluice ARGS` in `dir` (its working directory) with `env` set (and no other
    /// Pub/Sub emulator than one `env` names), its output in `dir/name.{out,err}`.
    pub fn spawn_with_env(args: &[&str], env: &[(String, String)], dir: &Path, name: &str) -> Self {
        let mut command = Command::new(sluice_bin());
        command.env_remove("PUBSUB_EMULATOR_HOST").current_dir(dir);
        command.envs(env.iter().map(|(k, v)| (k, v)));
        Self::spawn_command(command, args, dir, name)
    }

    /// Starts the connector's example `example` with `ARGS`, the run's emulator in
    /// `PUBSUB_EMULATOR_HOST` (the examples take Pub/Sub from the environment), its output in
    /// `dir/name.{out,err}`.
    pub fn example(example: &str, args: &[&str], dir: &Path, name: &str) -> Self {
        let bin = sluice_bin()
            .parent()
            .unwrap()
            .join("examples")
            .join(example);
        assert!(
            bin.exists(),
            "{} not built: `cargo build -p sluice-connector --examples` first (./scripts/test does)",
            bin.display()
        );
        let endpoint = emulator().endpoint();
        let host = endpoint.trim_start_matches("http://").to_owned();
        let mut command = Command::new(bin);
        command
            .env("PUBSUB_EMULATOR_HOST", host)
            .env("PUBSUB_PROJECT_ID", PROJECT);
        Self::spawn_command(command, args, dir, name)
    }

    fn spawn_command(mut command: Command, args: &[&str], dir: &Path, name: &str) -> Self {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let child = command
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// SIGKILL, and reap.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM (a drain).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the exit, at most `within`; kills the process and panics past that.
    pub fn wait(mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "worker did not exit within {within:?}; stderr:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Its stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Its stdout so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
