//! What a first-time user meets: every command's help shows an example, `check-config
//! --print` shows a config that is itself valid, and the common first mistakes (a port in
//! use, no server at the URL, a URL without /v1) end in a message that says what to do.

use std::process::{Command, Output};

mod common;

fn omen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run omen")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The subcommands `omen --help` lists (this build's features decide which).
fn subcommands() -> Vec<String> {
    let help = text(&omen(&["--help"]).stdout);
    let listed = help.split("Commands:").nth(1).expect("omen --help lists its commands");
    listed
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn omen_and_every_subcommand_show_an_example_in_their_help() {
    let top = text(&omen(&["--help"]).stdout);
    assert!(top.contains("Examples:") && top.contains("omen run --config"), "{top}");
    let names = subcommands();
    assert!(names.iter().any(|n| n == "run") && names.iter().any(|n| n == "check-config"), "{names:?}");
    for name in names {
        let out = omen(&[&name, "--help"]);
        let help = text(&out.stdout);
        assert!(out.status.success(), "omen {name} --help failed: {}", text(&out.stderr));
        assert!(
            help.contains(&format!("Example: omen {name} ")),
            "omen {name} --help has no example:\n{help}"
        );
    }
}

#[test]
fn the_printed_effective_config_is_a_valid_config_with_every_default() {
    let out = omen(&["check-config", "--print", "deploy/omen.local.yaml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    // The local file sets four keys; the print fills in the rest.
    for key in ["raw_min_interval:", "max_series_per_signal:", "min_r_squared:", "slos:", "worker:"] {
        assert!(printed.contains(key), "the effective config lacks {key}:\n{printed}");
    }
    assert!(printed.contains("path: deploy/traces/demo-degradation.jsonl.gz"), "{printed}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effective.yaml");
    std::fs::write(&file, &printed).unwrap();
    let again = omen(&["check-config", "--print", file.to_str().unwrap()]);
    assert!(again.status.success(), "the printed config is not valid: {}", text(&again.stderr));
    assert_eq!(text(&again.stdout), printed, "printing the printed config changes it");
}

#[test]
fn a_printed_config_never_shows_the_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("omen.yaml");
    std::fs::write(
        &file,
        "sources:\n  canary:\n    target: {base_url: 'http://127.0.0.1:8000/v1', model: m, api_key: s3cret-token}\n    prompts: [{id: c, prompt: hi}]\n",
    )
    .unwrap();
    let out = omen(&["check-config", "--print", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert!(!printed.contains("s3cret-token") && printed.contains("api_key: <redacted>"), "{printed}");
}

#[test]
fn a_port_in_use_names_the_field_and_the_fix() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("omen.yaml");
    std::fs::write(
        &file,
        format!(
            "store: {{path: {}}}\nhttp: {{listen: '{addr}'}}\nsources: {{nvml: {{enabled: false}}}}\n",
            dir.path().join("omen.db").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_omen"))
        .args(["run", "--config", file.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // It must give up on its own, not hang or retry forever.
    let mut status = None;
    common::wait_until("omen run to exit on a port in use", 30, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(!status.unwrap().success());
    assert!(
        stderr.contains("http.listen")
            && stderr.contains(&addr.to_string())
            && stderr.contains("choose a free address"),
        "{stderr}"
    );
    drop(taken);
}

/// `omen bench` of one request of the shipped workflow against `endpoint`.
#[cfg(feature = "bench")]
fn bench_one_request(endpoint: &str) -> Output {
    let report = tempfile::NamedTempFile::new().unwrap();
    let path = report.path().to_str().unwrap().to_owned();
    omen(&[
        "bench",
        "--workflow",
        "deploy/workflows/chat.yaml",
        "--endpoint",
        endpoint,
        "--max-requests",
        "1",
        "--no-progress",
        "--out",
        &path,
    ])
}

#[cfg(feature = "bench")]
#[test]
fn no_server_at_the_endpoint_says_to_check_the_server_and_the_url() {
    let port = common::free_port();
    let out = bench_one_request(&format!("http://127.0.0.1:{port}/v1"));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    assert!(stderr.contains("check that the server is running") && stderr.contains("--endpoint"), "{stderr}");
}

#[cfg(feature = "bench")]
#[test]
fn a_url_without_v1_says_where_the_api_root_is() {
    // A server that answers 404 to everything, as vLLM does for /models without /v1.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read as _, Write as _};
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let _ = conn.read(&mut buf);
            let body = "{\"detail\":\"Not Found\"}";
            let _ = write!(
                conn,
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let out = bench_one_request(&format!("http://127.0.0.1:{port}"));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("404") && stderr.contains("/v1"), "{stderr}");
}
