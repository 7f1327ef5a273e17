//! A full disk under the store: a real `omen run` whose store lives on a 16 MB tmpfs (in a
//! user and mount namespace, `unshare -rm`, so no root is needed) that the test then fills.
//! Pushes get a 503 naming the file and the fix, /readyz says why, reads keep working, and
//! writes resume by themselves once the space is back.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

/// The namespace's shell and the agent in it; the whole process group is killed on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.0.id())]).status();
        let _ = self.0.wait();
    }
}

fn wait_for_file(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn batch(signal: &str, n: usize, ts_ms: i64) -> Value {
    let samples: Vec<Value> = (0..n)
        .map(|i| json!({"signal": signal, "labels": {"layer": i.to_string()}, "value": i as f64, "ts_ms": ts_ms}))
        .collect();
    json!({ "samples": samples })
}

#[test]
fn a_full_disk_turns_pushes_into_503_and_the_agent_recovers_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let ctrl = dir.path().join("ctrl");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&ctrl).unwrap();
    let port = common::free_port();
    let config = dir.path().join("omen.yaml");
    std::fs::write(
        &config,
        format!(
            "store:\n  path: {}/omen.db\nhttp:\n  listen: 127.0.0.1:{port}\n  metrics_listen: null\n",
            mnt.display()
        ),
    )
    .unwrap();
    // Inside the namespace: mount the tmpfs, start the agent, fill the disk when asked
    // (ctrl/fill), free it when asked (ctrl/free).
    let script = format!(
        r#"set -e
mount -t tmpfs -o size=16m tmpfs {mnt}
{omen} run --config {config} >{dir}/agent.log 2>&1 &
agent=$!
while [ ! -e {ctrl}/fill ]; do sleep 0.05; done
dd if=/dev/zero of={mnt}/ballast bs=64k 2>/dev/null || true
touch {ctrl}/filled
while [ ! -e {ctrl}/free ]; do sleep 0.05; done
rm {mnt}/ballast
touch {ctrl}/freed
wait $agent
"#,
        mnt = mnt.display(),
        omen = env!("CARGO_BIN_EXE_omen"),
        config = config.display(),
        dir = dir.path().display(),
        ctrl = ctrl.display(),
    );
    let child = Command::new("unshare")
        .args(["-rm", "sh", "-c", &script])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) runs the agent in its own mount namespace");
    let _agent = Agent(child);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let waiting = format!("the agent to become ready (log: {})", dir.path().join("agent.log").display());
    common::wait_until(&waiting, 30, || common::agent_ready(&base));
    let push = |body: &Value| {
        let r = client.post(format!("{base}/v1/ingest/samples")).json(body).send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let t0 = 1_793_613_600_000i64;
    assert_eq!(push(&batch("before", 100, t0)).0, 200);

    std::fs::write(ctrl.join("fill"), "").unwrap();
    wait_for_file(&ctrl.join("filled"), "the disk to fill");
    // SQLite may still have room in pages it holds; new series soon need new ones.
    let mut refused = None;
    for i in 0..200 {
        let (status, body) = push(&batch(&format!("while_full_{i}"), 1000, t0 + 1000 + i));
        match status {
            200 => continue,
            503 => {
                refused = Some(body);
                break;
            }
            other => panic!("a push on a full disk got {other}: {body}"),
        }
    }
    let refused = refused.expect("a push on a full disk is refused");
    eprintln!("refused: {refused}");
    assert!(
        refused.contains("is full") && refused.contains("omen.db") && refused.contains("free space"),
        "{refused}"
    );
    let ready = client.get(format!("{base}/readyz")).send().unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let why = ready.text().unwrap();
    assert!(why.contains("cannot take writes") && why.contains("is full"), "{why}");
    // Reads keep working.
    let scores: Value = client
        .get(format!(
            "{base}/scores?signal=before&layer=7&since=2026-11-02T00:00:00Z&until=2026-11-03T00:00:00Z"
        ))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(scores["series"][0]["points"][0][1], 7.0, "{scores}");
    assert_eq!(client.get(format!("{base}/scores/latest")).send().unwrap().status().as_u16(), 200);

    std::fs::write(ctrl.join("free"), "").unwrap();
    wait_for_file(&ctrl.join("freed"), "the space to come back");
    let (status, body) = push(&batch("after", 100, t0 + 10_000));
    assert_eq!(status, 200, "writes resume by themselves: {body}");
    assert_eq!(client.get(format!("{base}/readyz")).send().unwrap().status().as_u16(), 200);
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    let failures = log.lines().filter(|l| l.contains("not stored")).count();
    assert_eq!(failures, 1, "one log line per spell of failures:\n{log}");
    assert!(log.contains("takes writes again"), "{log}");
}
