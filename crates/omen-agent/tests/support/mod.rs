//! Shared by the integration tests that need a real llama.cpp `llama-server`
//! (SmolLM2-135M-Instruct, installed by `make setup`) on loopback.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A llama-server child process, killed when dropped.
pub struct Server(Child);

impl Server {
    /// The server's process id (to signal it).
    #[allow(dead_code)] // not every test that includes this module signals the server
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts llama-server on a free loopback port with `extra` arguments; returns it and the port.
/// The caller waits for GET /health (blocking or async, as the test runs).
pub fn start_llama_server(extra: &[&str]) -> (Server, u16) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(root.join("scripts/llm-server.sh"))
        .arg("path")
        .output()
        .expect("run scripts/llm-server.sh");
    assert!(
        out.status.success(),
        "llama.cpp server not installed; run `make setup`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let (server, model) = (lines.next().unwrap().to_owned(), lines.next().unwrap().to_owned());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(&server)
        .args(["-m", &model, "--host", "127.0.0.1", "--port", &port.to_string()])
        // One thread that sleeps when idle: tests run several servers side by side on 2 cores,
        // and llama.cpp's spinning worker threads, oversubscribed, slowed tokens to seconds each.
        .args(["-c", "2048", "-np", "1", "-t", "1", "--poll", "0", "--alias", "smollm2-135m"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {server}: {e}; run `make setup`"));
    (Server(child), port)
}
