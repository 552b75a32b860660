//! Issue 32 (production hardening), items 4 and 5 in part: a listener that
//! cannot be bound stops the gateway at once, naming it; `0.0.0.0:P` and
//! `[::]:P` together start (IPv6 listeners are IPv6 only), as
//! `config/examples/full.toml` lists them; no message prints a Redis URL's
//! password.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::harness::gateway::{free_port, scratch_dir};
use crate::harness::http::request;
use crate::harness::scaled_secs;

/// Runs the gateway binary with `args` until it exits, which it must do
/// within `within`; its output and how long it took.
async fn run_to_exit(args: &[&str], within: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a2a-gateway");
    let out = tokio::time::timeout(within, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("a2a-gateway {args:?} still running after {within:?}"))
        .expect("a2a-gateway's output");
    (out, started.elapsed())
}

/// A proxy or admin port that another socket holds: the gateway exits
/// non-zero within the bound, with one line naming the address, its key and
/// the OS error, and never gets as far as pingora (no panicked thread).
#[tokio::test]
async fn taken_listener_exits_at_once_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let free = format!("127.0.0.1:{}", free_port());
    for (listen, admin, key) in [
        (&taken_addr, &free, "server.listen"),
        (&free, &taken_addr, "server.admin"),
    ] {
        let (out, took) = run_to_exit(
            &[
                "--worker",
                "http://127.0.0.1:1",
                "--listen",
                listen,
                "--admin",
                admin,
            ],
            scaled_secs(5),
        )
        .await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(took < scaled_secs(2), "took {took:?}: {err}");
        let want = format!("a2a-gateway: cannot listen on {taken_addr} ({key}): ");
        assert!(
            err.lines()
                .any(|l| l.starts_with(&want) && l.contains("in use")),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    drop(taken);
}

/// Whether this host has IPv6 on loopback.
fn has_ipv6() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

/// `config/examples/full.toml` with its ports replaced starts (its
/// `listen = ["0.0.0.0:8080", "[::]:8080"]` on a dual-stack host), is
/// ready, and answers on both families.
#[tokio::test]
async fn full_example_starts_dual_stack() {
    let example = include_str!("../config/examples/full.toml");
    assert!(example.contains("listen = [\"0.0.0.0:8080\", \"[::]:8080\"]"));
    let port = free_port();
    let admin_port = free_port();
    let cfg = example
        .replace(":8080\"", &format!(":{port}\""))
        .replace("127.0.0.1:9090", &format!("127.0.0.1:{admin_port}"));
    let dir = scratch_dir("hardening");
    let path = dir.join("full.toml");
    std::fs::write(&path, cfg).unwrap();
    let log = dir.join("gateway.log");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .arg("--config")
        .arg(&path)
        .env("DEFAULT_WORKER_TOKEN", "Bearer example")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a2a-gateway");
    let admin = format!("http://127.0.0.1:{admin_port}");
    let deadline = Instant::now() + scaled_secs(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "full.toml: exited {status}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", admin_port))
            .await
            .is_ok()
            && request("GET", &admin, "/readyz", &[], b"").await.status == 200
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "full.toml: not ready; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("IPv4 listener");
    if has_ipv6() {
        tokio::net::TcpStream::connect(("::1", port))
            .await
            .expect("IPv6 listener");
    }
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!log_text.contains("panicked"), "{log_text}");
    child.kill().await.ok();
}

/// A URL with a password and `password_env` too fails `check-config` and
/// the start with why, as do bad `--store` URLs; no message (config errors,
/// `--store`'s, a Redis that does not answer) prints the password.
#[tokio::test]
async fn redis_urls_refused_or_failed_without_their_password() {
    let dir = scratch_dir("hardening");
    let path = dir.join("rediss.toml");
    std::fs::write(
        &path,
        "[store]\nurl = \"rediss://:hunter2@cache:6380/0\"\npassword_env = \"PATH\"\n\n[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:1\"\n",
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let (out, _) = run_to_exit(&["check-config", path], scaled_secs(5)).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the store URL has a password too"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    let (out, _) = run_to_exit(&["--config", path], scaled_secs(5)).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    for store in [
        "rediss://:hunter2@cache:6380/0#insecure",
        "postgres://u:hunter2@db",
    ] {
        let (out, _) = run_to_exit(
            &["--worker", "http://127.0.0.1:1", "--store", store],
            scaled_secs(5),
        )
        .await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{store}: {err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    // Nothing listens there: the start fails naming the URL, redacted.
    let nobody = free_port();
    let store = format!("redis://:hunter2@127.0.0.1:{nobody}/0");
    let listen = format!("127.0.0.1:{}", free_port());
    let (out, _) = run_to_exit(
        &[
            "--worker",
            "http://127.0.0.1:1",
            "--listen",
            &listen,
            "--store",
            &store,
        ],
        scaled_secs(30),
    )
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("store redis://:***@127.0.0.1:{nobody}/0: ")),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

/// With `server.admin_token_env`, every admin path but `/healthz` and
/// `/readyz` answers 401 (with `WWW-Authenticate`) without the token or
/// with another, and as before with it; an admin listener off loopback
/// without a token is refused at start and by `check-config`.
#[tokio::test]
async fn admin_requires_its_token() {
    let token = "s3cret-admin-token-0123456789";
    let gw = crate::harness::gateway::Gateway::start_with_env(
        "admin_token_env = \"HARDENING_ADMIN_TOKEN\"\n\n[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:1\"\n",
        &[("HARDENING_ADMIN_TOKEN", token)],
    )
    .await;
    let good = format!("Bearer {token}");
    let wrong = format!("Bearer {token}x");
    for path in ["/tasks", "/budgets", "/metrics", "/nowhere"] {
        for auth in [None, Some(wrong.as_str()), Some("Basic abc")] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("authorization", a)).into_iter().collect();
            let r = request("GET", &gw.admin, path, &headers, b"").await;
            assert_eq!(r.status, 401, "{path} {auth:?}: {}", r.text());
            assert!(
                r.headers
                    .iter()
                    .any(|(k, v)| k == "www-authenticate" && v.starts_with("Bearer")),
                "{path}: {:?}",
                r.headers
            );
        }
        let r = request("GET", &gw.admin, path, &[("authorization", &good)], b"").await;
        let want = if path == "/nowhere" { 404 } else { 200 };
        assert_eq!(r.status, want, "{path}: {}", r.text());
    }
    for path in ["/healthz", "/readyz"] {
        let r = request("GET", &gw.admin, path, &[], b"").await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    assert!(!gw.log_text().contains(token));

    let dir = scratch_dir("hardening");
    let path = dir.join("open-admin.toml");
    let admin = format!("0.0.0.0:{}", free_port());
    std::fs::write(
        &path,
        format!("[server]\nlisten = \"127.0.0.1:{}\"\nadmin = \"{admin}\"\n\n[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:1\"\n", free_port()),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let want = format!("{admin} is not a loopback address");
    for args in [&["check-config", path][..], &["--config", path][..]] {
        let (out, _) = run_to_exit(args, scaled_secs(5)).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&want), "{args:?}: {err}");
    }
    // --admin on the command line is held to the same rule.
    let (out, _) = run_to_exit(
        &[
            "--worker",
            "http://127.0.0.1:1",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--admin",
            &admin,
        ],
        scaled_secs(5),
    )
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&want), "{err}");
}
