//! Issue 2: routing, agent-card rewriting, verbatim pass-through, and the
//! command line (no-config mode, `check-config`).

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::harness::gateway::{free_port, scratch_dir, Gateway};
use crate::harness::http::{post_json, request};
use crate::harness::worker::{send_stream, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs};

/// Two workers behind one gateway, by path prefix; each card sends clients
/// back through the gateway, and a cascade through a prefixed route cancels
/// on the right worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_routes_cards_and_cascade() {
    let rust = Worker::start(Kind::Rust).await;
    let python = Worker::start(Kind::Python).await;
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"r\"\nworker = \"{}\"\npath_prefix = \"/r\"\n\n[[routes]]\nname = \"p\"\nworker = \"{}\"\npath_prefix = \"/p\"\n",
        rust.url(),
        python.url()
    ))
    .await;
    for prefix in ["/r", "/p"] {
        let card = request(
            "GET",
            &gw.url,
            &format!("{prefix}/.well-known/agent-card.json"),
            &[],
            b"",
        )
        .await;
        assert_eq!(card.status, 200, "{prefix}: {}", card.text());
        let card = card.json();
        let ifaces = card["supportedInterfaces"].as_array().expect("interfaces");
        assert!(!ifaces.is_empty());
        for iface in ifaces {
            let url = iface["url"].as_str().unwrap();
            assert!(
                url.starts_with(&format!("{}{prefix}", gw.url)),
                "{prefix}: {url} does not point at the gateway"
            );
        }
    }
    // A stream through each prefixed route is canceled on its own worker.
    for (prefix, worker, bind) in [("/r", &rust, Bind::Rest), ("/p", &python, Bind::JsonRpc)] {
        let base = format!("{}{prefix}", gw.url);
        let (stream, id) = send_stream(&base, bind, None, "work:30000").await;
        stream.close();
        worker
            .wait_state(None, &id, "TASK_STATE_CANCELED", scaled_secs(1))
            .await
            .unwrap_or_else(|s| panic!("{prefix}: not canceled ({s:?}); log:\n{}", gw.log_text()));
    }
    // No route: a clear 404 from the gateway itself.
    let none = request("GET", &gw.url, "/elsewhere", &[], b"").await;
    assert_eq!(none.status, 404);
    assert!(none.text().contains("no route"), "{}", none.text());
}

/// What the gateway does not understand reaches the worker byte for byte,
/// and the worker's answer comes back unchanged.
#[tokio::test]
async fn unknown_traffic_passes_verbatim() {
    let worker = Worker::start(Kind::Rust).await;
    // A route that checks nothing (a route that checks sends refuses what it
    // cannot read: tests/strict_reading.rs).
    let gw = Gateway::in_front_of(&worker.url(), "worker_leases = \"observe\"").await;
    let bodies: [&[u8]; 3] = [
        b"this is not json",
        b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"GetTask\",\"params\":{\"id\":\"x\"}}]",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"message/send\",\"params\":{}}",
    ];
    for body in bodies {
        let headers = [("content-type", "application/json")];
        let direct = request("POST", &worker.url(), "/", &headers, body).await;
        let via = request("POST", &gw.url, "/", &headers, body).await;
        assert_eq!(
            via.status,
            direct.status,
            "{}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(
            via.json(),
            direct.json(),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let direct = request("GET", &worker.url(), "/no/such/path", &[], b"").await;
    let via = request("GET", &gw.url, "/no/such/path", &[], b"").await;
    assert_eq!(via.status, direct.status);
    assert_eq!(via.body, direct.body);
    // A GetTask goes through; no policy needs its answer, which passes
    // unread. (A blocking SendMessage is carried as a stream and tracked:
    // tests/blocking_send.rs.)
    let get =
        json!({"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": "no-such-task"}});
    let direct = post_json(&worker.url(), "/", &[], &get).await;
    let via = post_json(&gw.url, "/", &[], &get).await;
    assert_eq!(via.status, direct.status);
    assert_eq!(via.body, direct.body);
    assert!(gw.counter("a2agw_untracked_total", &["not_jsonrpc"]).await >= 1.0);
    assert_eq!(gw.counter("a2agw_tasks_tracked_total", &[]).await, 0.0);
}

/// `a2a-gateway --listen ADDR --worker URL` runs with no config file.
#[tokio::test]
async fn runs_without_a_config_file() {
    let worker = Worker::start(Kind::Rust).await;
    let port = free_port();
    let admin = free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--worker",
            &worker.url(),
            "--admin",
            &format!("127.0.0.1:{admin}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let mut up = false;
    for _ in 0..scaled_count(200) {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(up, "gateway listens");
    let (stream, id) = send_stream(&url, Bind::JsonRpc, None, "work:30000").await;
    stream.close();
    worker
        .wait_state(None, &id, "TASK_STATE_CANCELED", scaled_secs(1))
        .await
        .expect("cascade on by default");
    let health = request(
        "GET",
        &format!("http://127.0.0.1:{admin}"),
        "/healthz",
        &[],
        b"",
    )
    .await;
    assert_eq!(health.status, 200);
    let ready = request(
        "GET",
        &format!("http://127.0.0.1:{admin}"),
        "/readyz",
        &[],
        b"",
    )
    .await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(ready.text(), "ready\n");
    let _ = child.kill().await;
}

/// `A2A_GATEWAY_ALLOCATOR` picks the heap allocator: an unknown value is
/// refused at start-up with why, and on `system` (glibc's `malloc` instead of
/// mimalloc) the gateway proxies and cascades as on its default.
#[tokio::test]
async fn allocator_is_picked_by_env() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .args(["--worker", "http://127.0.0.1:1"])
        .env("A2A_GATEWAY_ALLOCATOR", "jemalloc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("A2A_GATEWAY_ALLOCATOR=\"jemalloc\"") && err.contains("\"system\""),
        "{err}"
    );

    let worker = Worker::start(Kind::Rust).await;
    let route = format!("[[routes]]\nname = \"w\"\nworker = \"{}\"\n", worker.url());
    let gw = Gateway::start_with_env(&route, &[("A2A_GATEWAY_ALLOCATOR", "system")]).await;
    let (stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    stream.close();
    worker
        .wait_state(None, &id, "TASK_STATE_CANCELED", scaled_secs(1))
        .await
        .unwrap_or_else(|s| panic!("not canceled ({s:?}); log:\n{}", gw.log_text()));
    // The field's name may be wrapped in ANSI colour codes.
    let chosen = |log: &str, name: &str| {
        log.lines()
            .any(|l| l.contains("heap allocator") && l.contains(&format!("\"{name}\"")))
    };
    let log = gw.log_text();
    assert!(chosen(&log, "system"), "{log}");
    let default = Gateway::start(&route).await;
    let log = default.log_text();
    assert!(chosen(&log, "mimalloc"), "{log}");
}

/// A listener on port 0 (a port the kernel would pick, which no caller
/// could be told) is refused on the command line as in the config file.
#[tokio::test]
async fn port_zero_listeners_are_refused() {
    for flag in ["--listen", "--admin"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
            .args([flag, "127.0.0.1:0", "--worker", "http://127.0.0.1:1"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("port 0 is not allowed"), "{flag}: {err}");
    }
}

/// `check-config` prints every error at once, each with file:line:col.
#[tokio::test]
async fn check_config_reports_every_error() {
    let dir = scratch_dir("cfg");
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[server]\nthreads = 0\n\n[[routes]]\nname = \"a\"\nworker = \"ftp://x\"\ncascade = \"sometimes\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .arg("check-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("bad.toml:")).collect();
    assert_eq!(lines.len(), 3, "three errors, one line each:\n{err}");
    assert!(
        lines[0].contains("bad.toml:2:") && lines[0].contains("server.threads"),
        "{err}"
    );
    assert!(
        lines[1].contains("bad.toml:6:") && lines[1].contains("routes[0].worker"),
        "{err}"
    );
    assert!(
        lines[2].contains("bad.toml:7:") && lines[2].contains("routes[0].cascade"),
        "{err}"
    );

    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "[[routes]]\nname = \"a\"\nworker = \"http://127.0.0.1:1\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .arg("check-config")
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A worker named by host name is reached through the name's looked-up
/// address, for proxied calls and for the gateway's own cancel; a name that
/// does not resolve is answered 502 with why (it used to drop the
/// connection with no answer), and the other routes keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_host_names_are_resolved_off_the_request_path() {
    let worker = Worker::start(Kind::Rust).await;
    let named = worker.url().replace("127.0.0.1", "localhost");
    assert!(named.contains("//localhost:"), "{named}");
    let gw = Gateway::start(&format!(
        "[timeouts]\ndns_refresh = \"1s\"\n\n\
         [[routes]]\nname = \"named\"\nworker = \"{named}\"\npath_prefix = \"/n\"\n\n\
         [[routes]]\nname = \"gone\"\nworker = \"http://no-such-host.invalid:9\"\npath_prefix = \"/g\"\n"
    ))
    .await;
    let base = format!("{}/n", gw.url);

    // Proxied calls, across a refresh of the name's address.
    for round in 0..2 {
        let sent = post_json(
            &base,
            "/",
            &[],
            &json!({"jsonrpc": "2.0", "id": round, "method": "SendMessage",
                "params": {"message": crate::harness::worker::message("quick")}}),
        )
        .await;
        assert_eq!(sent.status, 200, "round {round}: {}", sent.text());
        let id = sent.json()["result"]["task"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("round {round}: no task in {}", sent.text()))
            .to_owned();
        assert_eq!(
            worker.state(None, &id).await.as_deref(),
            Some("TASK_STATE_COMPLETED"),
            "round {round}: the worker ran the task"
        );
        // Past a refresh (`dns_refresh = "1s"`).
        tokio::time::sleep(Duration::from_secs(1) + scaled_ms(100)).await;
    }

    // The gateway's own CancelTask reaches the named worker.
    let (stream, id) = send_stream(&base, Bind::JsonRpc, None, "work:30000").await;
    stream.close();
    worker
        .wait_state(None, &id, "TASK_STATE_CANCELED", scaled_secs(2))
        .await
        .unwrap_or_else(|s| panic!("not canceled ({s:?}); log:\n{}", gw.log_text()));

    // A name that does not resolve: a clear error for each binding.
    let rpc = post_json(
        &format!("{}/g", gw.url),
        "/",
        &[],
        &json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage",
            "params": {"message": crate::harness::worker::message("quick")}}),
    )
    .await;
    assert_eq!(rpc.status, 502, "a JSON-RPC error: {}", rpc.text());
    let body = rpc.json();
    assert_eq!(body["id"], 7, "{body}");
    assert_eq!(body["error"]["code"], -32603, "{body}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("\"no-such-host.invalid\" could not be resolved"),
        "{body}"
    );
    let rest = request("GET", &gw.url, "/g/tasks/x", &[], b"").await;
    assert_eq!(rest.status, 502, "{}", rest.text());
    assert_eq!(
        rest.json()["error"]["status"],
        "UNAVAILABLE",
        "{}",
        rest.text()
    );
    assert!(
        gw.counter(
            "a2agw_worker_resolve_errors_total",
            &["worker=\"no-such-host.invalid:9\""]
        )
        .await
            >= 2.0
    );
    assert_eq!(
        gw.counter(
            "a2agw_refusals_total",
            &["route=\"gone\"", "reason=\"worker_unresolvable\""]
        )
        .await,
        2.0
    );
    let log = gw.log_text();
    assert!(!log.contains("panicked"), "log:\n{log}");
    // Both names were looked up at start, before any request needed them.
    assert!(
        log.lines().any(|l| l.contains("worker address")
            && l.contains("localhost:")
            && l.contains("127.0.0.1:")),
        "log:\n{log}"
    );
    assert!(log.contains("worker address not found yet"), "log:\n{log}");
    // ... and the named route still serves.
    let card = request("GET", &gw.url, "/n/.well-known/agent-card.json", &[], b"").await;
    assert_eq!(card.status, 200, "{}", card.text());
}

/// `a2agw_proxy_seconds` holds what the gateway itself kept a request for:
/// a worker that takes 300 ms to answer does not show in it, a stream is not
/// counted (its length is the stream's), nor is a request the gateway
/// answers itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_time_leaves_the_worker_out() {
    let rust = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"w\"\nworker = \"{}\"\npath_prefix = \"/w\"\n",
        rust.url()
    ))
    .await;
    let route = ["route=\"w\""];
    let started = std::time::Instant::now();
    let rpc = post_json(
        &gw.url,
        "/w",
        &[],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": crate::harness::worker::message("work:300")}}),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(rpc.status, 200, "{}", rpc.text());
    let id = crate::harness::worker::task_id_of(&rpc.json())
        .unwrap_or_else(|| panic!("no task in {}", rpc.text()));
    assert_eq!(
        rust.state(None, &id).await.as_deref(),
        Some("TASK_STATE_COMPLETED"),
        "the worker did not run the task to its end"
    );
    assert!(took >= Duration::from_millis(300), "{took:?}");
    // Observed when a request ends, just after its answer was written.
    let count_reaches = |n: f64| {
        let gw = &gw;
        async move {
            let mut count = 0.0;
            for _ in 0..scaled_count(40) {
                count = gw.counter("a2agw_proxy_seconds_count", &route).await;
                if count >= n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            count
        }
    };
    assert_eq!(count_reaches(1.0).await, 1.0);
    let own = gw.counter("a2agw_proxy_seconds_sum", &route).await;
    // 150 ms scaled, but always short of the worker's 300 ms it must leave out.
    let most = scaled_ms(150).min(Duration::from_millis(250)).as_secs_f64();
    assert!(
        own > 0.0 && own < most,
        "the gateway's own time {own} s should leave out the worker's 300 ms (the call took {took:?})"
    );
    // A stream to its end: not counted.
    let (mut stream, _) =
        send_stream(&format!("{}/w", gw.url), Bind::JsonRpc, None, "burst:3").await;
    stream.rest(scaled_secs(10)).await;
    // Answered by the gateway itself (no route): not counted.
    assert_eq!(
        request("GET", &gw.url, "/elsewhere", &[], b"").await.status,
        404
    );
    // The card: counted.
    let card = request("GET", &gw.url, "/w/.well-known/agent-card.json", &[], b"").await;
    assert_eq!(card.status, 200, "{}", card.text());
    assert_eq!(count_reaches(2.0).await, 2.0, "{}", gw.metrics().await);
}

/// A caller that sends `Expect: 100-continue` (curl does for larger POSTs)
/// gets the `100 Continue` from the gateway, which reads small bodies before
/// it asks the worker, at once rather than after its own expect timeout; the
/// worker (both kinds) answers the call as usual.
#[tokio::test]
async fn expect_continue_is_answered_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for kind in [Kind::Rust, Kind::Python] {
        let worker = Worker::start(kind).await;
        let gw = Gateway::in_front_of(&worker.url(), "").await;
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage",
            "params": {"message": crate::harness::worker::message("quick")}})
        .to_string();
        let (authority, _) = crate::harness::http::split_url(&gw.url);
        let mut sock = tokio::net::TcpStream::connect(&authority).await.unwrap();
        let head = format!(
            "POST / HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\na2a-version: 1.0\r\nexpect: 100-continue\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        sock.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(scaled_ms(500), sock.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{kind:?}: no 100 Continue within {:?}", scaled_ms(500)))
            .unwrap();
        let first = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(first.starts_with("HTTP/1.1 100"), "{kind:?}: {first}");
        sock.write_all(body.as_bytes()).await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(scaled_secs(10), sock.read_to_end(&mut rest))
            .await
            .expect("the answer")
            .unwrap();
        let all = format!("{first}{}", String::from_utf8_lossy(&rest));
        assert!(all.contains("HTTP/1.1 200"), "{kind:?}: {all}");
        assert!(all.contains("\"result\""), "{kind:?}: {all}");
        assert_eq!(
            all.matches("HTTP/1.1 100").count(),
            1,
            "{kind:?}: one 100: {all}"
        );
    }
}
