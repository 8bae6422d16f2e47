//! A worker's `/metrics` and HTTP endpoints, read from the test process.

use std::time::Duration;

/// The value of a metric of one flow of pipeline `test` from a worker's `/metrics` on `port`
/// (`None`: not exported, or the worker does not answer).
pub fn flow_metric(port: u16, name: &str, flow: &str) -> Option<f64> {
    let series = format!("{name}{{pipeline=\"test\",flow=\"{flow}\"}} ");
    metrics_text(port)
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
}

/// The value of the first series of metric `name` whose labels contain `label` (such as
/// `outcome="refused"`) from a worker's `/metrics` on `port` (`None`: not exported).
pub fn labelled_metric(port: u16, name: &str, label: &str) -> Option<f64> {
    metrics_text(port).lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.split_once("} ")?;
        labels.contains(label).then(|| value.trim().parse().ok())?
    })
}

/// What a worker's `/metrics` on `port` serves (empty when nothing answers), read with one
/// HTTP/1.0 request from this process: a `curl` process per scrape took hundreds of
/// milliseconds on a loaded machine, too slow for the crash test's aim at a commit.
pub fn metrics_text(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    if stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return String::new();
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response);
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
            body.to_owned()
        }
        _ => String::new(),
    }
}

/// The HTTP status `GET http://127.0.0.1:{port}{path}` answers (`000`: no answer).
pub fn http_status(port: u16, path: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
