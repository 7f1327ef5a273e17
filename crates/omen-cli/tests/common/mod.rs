//! What the tests that run a real `omen run` (or a server beside it) share.
// Each test file uses the part it needs.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Polls `ok` every 50 ms; panics naming `what` after `secs` seconds.
pub fn wait_until(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the agent at `base` (http://host:port) answers GET /readyz with a 2xx.
pub fn agent_ready(base: &str) -> bool {
    reqwest::blocking::get(format!("{base}/readyz")).is_ok_and(|r| r.status().is_success())
}
