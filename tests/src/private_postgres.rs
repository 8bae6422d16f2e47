//! A PostgreSQL server of one test's own: a fresh cluster (`initdb`) in a temporary folder on a
//! free loopback port, for a test that stops and starts its server while other tests use the
//! machine's. It is the machine's PostgreSQL release, run as the `postgres` user when the test
//! runs as root (PostgreSQL refuses to run as root), and stopped when dropped.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped) private server.
pub struct PrivatePostgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
}

impl PrivatePostgres {
    /// Creates the cluster and starts it; panics with the reason when it cannot.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// As [`PrivatePostgres::start`], with server settings (`track_commit_timestamp=on`) added
    /// to its configuration file.
    pub fn start_with(settings: &[&str]) -> Self {
        Self::start_as(settings, None)
    }

    /// As [`PrivatePostgres::start`], with a server that asks for a password over TCP
    /// (`scram-sha-256`): user `postgres`'s is `password` (trust stays on the local socket).
    pub fn start_requiring_password(password: &str) -> Self {
        Self::start_as(&[], Some(password))
    }

    fn start_as(settings: &[&str], password: Option<&str>) -> Self {
        // The newest release installed (`/usr/lib/postgresql/<major>/bin`).
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's server binaries under /usr/lib/postgresql")
            .filter_map(Result::ok)
            .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path())))
            .filter(|(_, path)| path.join("bin/initdb").exists())
            .max_by_key(|(major, _)| *major)
            .map(|(_, path)| path.join("bin"))
            .expect("initdb under /usr/lib/postgresql/<version>/bin");
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let dir = tempfile::Builder::new()
            .prefix("sluice-pg-")
            .tempdir()
            .expect("temporary folder");
        if as_postgres {
            let chowned = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(chowned, "chown the private cluster's folder to postgres");
        }
        let port = sluice_bench::free_port().expect("a free port");
        let server = Self {
            bin,
            dir,
            port,
            as_postgres,
        };
        let data = server.data();
        let mut initdb = vec![
            "-D".to_owned(),
            data.clone(),
            "-U".to_owned(),
            "postgres".to_owned(),
            "--encoding=UTF8".to_owned(),
            "--locale=C".to_owned(),
            "--no-sync".to_owned(),
        ];
        match password {
            None => initdb.push("--auth=trust".to_owned()),
            Some(password) => {
                let file = server.dir.path().join("password");
                std::fs::write(&file, password).expect("password file");
                if as_postgres {
                    let _ = Command::new("chown").arg("postgres").arg(&file).status();
                }
                initdb.extend([
                    "--auth-local=trust".to_owned(),
                    "--auth-host=scram-sha-256".to_owned(),
                    format!("--pwfile={}", file.display()),
                ]);
            }
        }
        server.run(
            "initdb",
            &initdb.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        if !settings.is_empty() {
            let conf = std::path::Path::new(&data).join("postgresql.conf");
            let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
            for setting in settings {
                text.push_str(&format!("\n{setting}\n"));
            }
            std::fs::write(&conf, text).expect("postgresql.conf written");
        }
        server.resume();
        server
    }

    /// The administrative URL (user `postgres`, trust authentication).
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The URL of user `postgres` with `password` (for a server made by
    /// [`PrivatePostgres::start_requiring_password`]).
    pub fn url_with_password(&self, password: &str) -> String {
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// Stops the server (fast shutdown: connections are closed, like an outage).
    pub fn stop(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub fn resume(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log.to_string_lossy(),
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.is_ready() {
            assert!(
                Instant::now() < deadline,
                "private PostgreSQL did not start"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the server accepts connections.
    pub fn is_ready(&self) -> bool {
        Command::new("pg_isready")
            .args(["-h", "127.0.0.1", "-q", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }

    fn data(&self) -> String {
        self.dir.path().join("data").to_string_lossy().into_owned()
    }

    /// `program` of the server's release, as the user the server runs as.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let output = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for PrivatePostgres {
    /// Stops the server whatever state it is in (a stopped one makes `pg_ctl` fail, harmlessly),
    /// before its folder is deleted. A test killed from outside skips this: its server then
    /// keeps running until the machine stops (its folder is under the system's temp dir).
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .stdin(Stdio::null())
            .output();
    }
}
