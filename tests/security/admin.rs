//! Issue 43 item 5 (in part): an admin listener without a token (so on
//! loopback) answers only requests addressed to it: a browser led there by
//! DNS rebinding sends the attacker's `Host`, and a page of another site
//! posting to it (`POST /reload`, `POST /tasks/{id}:cancel`) sends its
//! `Origin`. Both are refused 403 and change nothing; the listener's own
//! `Host` is served. Against the gateway binary and a real a2a-rust worker.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::harness::gateway::Gateway;
use crate::harness::http::{parse_response, split_url, Response};
use crate::harness::worker::{send_stream, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs};

const WORKING: &str = "TASK_STATE_WORKING";
const CANCELED: &str = "TASK_STATE_CANCELED";

/// One request to the gateway's admin with exactly these header lines (no
/// `Host` unless given): its response.
async fn admin(gw: &Gateway, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let (authority, _) = split_url(&gw.admin);
    let mut sock = tokio::net::TcpStream::connect(&authority)
        .await
        .unwrap_or_else(|e| panic!("connect {authority}: {e}"));
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: 0\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(scaled_secs(30), sock.read_to_end(&mut raw))
        .await
        .expect("an answer")
        .expect("read the answer");
    parse_response(&raw)
}

/// The admin's own `Host` (`127.0.0.1:PORT`) and its port.
fn own_host(gw: &Gateway) -> (String, u16) {
    let (authority, _) = split_url(&gw.admin);
    let port = authority.rsplit_once(':').unwrap().1.parse().unwrap();
    (authority, port)
}

/// `POST /reload` with a foreign `Host` (a rebound name, the right port),
/// no `Host`, or a cross-site `Origin` is refused 403 and reloads nothing
/// (`a2agw_config_reloads_total` stays 0); `GET /metrics` with a foreign
/// `Host` too. The listener's own `Host`, as `127.0.0.1:PORT`,
/// `localhost:PORT` or with its own origin, is served: the reload is
/// applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenless_admin_refuses_foreign_hosts_and_origins_on_reload() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (own, port) = own_host(&gw);
    let rebound = format!("evil.example:{port}");
    let own_origin = format!("http://{own}");
    // Something for a reload to apply.
    gw.rewrite_config(&format!(
        "[[routes]]\nname = \"w\"\nworker = \"{}\"\ncascade = \"detach\"\n",
        worker.url()
    ));

    let refused: [(&str, Vec<(&str, &str)>); 5] = [
        ("a rebound Host", vec![("host", rebound.as_str())]),
        ("another port", vec![("host", "127.0.0.1:1")]),
        ("no Host", vec![]),
        (
            "a cross-site Origin",
            vec![("host", own.as_str()), ("origin", "http://evil.example")],
        ),
        (
            "a null Origin",
            vec![("host", own.as_str()), ("origin", "null")],
        ),
    ];
    for (case, headers) in &refused {
        let r = admin(&gw, "POST", "/reload", headers).await;
        assert_eq!(r.status, 403, "{case}: {}", r.text());
        assert!(r.text().starts_with("forbidden: "), "{case}: {}", r.text());
    }
    let r = admin(&gw, "GET", "/metrics", &[("host", &rebound)]).await;
    assert_eq!(r.status, 403, "metrics by a rebound name: {}", r.text());
    let r = admin(&gw, "GET", "/tasks", &[("host", &rebound)]).await;
    assert_eq!(r.status, 403, "tasks by a rebound name: {}", r.text());
    assert_eq!(
        gw.counter("a2agw_config_reloads_total", &[]).await,
        0.0,
        "nothing reloaded; log:\n{}",
        gw.log_text()
    );
    assert!(
        !gw.log_text().contains("config reloaded"),
        "{}",
        gw.log_text()
    );

    // Its own Host, bare or with its own origin, is served.
    let r = admin(
        &gw,
        "GET",
        "/healthz",
        &[("host", &format!("localhost:{port}"))],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = admin(
        &gw,
        "POST",
        "/reload",
        &[("host", own.as_str()), ("origin", own_origin.as_str())],
    )
    .await;
    assert_eq!(r.status, 200, "{}; log:\n{}", r.text(), gw.log_text());
    assert_eq!(
        gw.counter("a2agw_config_reloads_total", &["outcome=\"applied\""])
            .await,
        1.0
    );
}

/// `POST /tasks/{id}:cancel` of a long-running task with a rebound `Host`
/// or a cross-site `Origin` is refused 403: the worker still runs the task
/// and received no cancel. With the listener's own `Host` it is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenless_admin_refuses_a_foreign_cancel() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (own, port) = own_host(&gw);
    let (_stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:60000").await;
    worker
        .wait_state(None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    // The store knows the task (the admin finds it by id).
    let path = format!("/tasks/{id}");
    let mut found = 0;
    for _ in 0..scaled_count(100) {
        found = admin(&gw, "GET", &path, &[("host", &own)]).await.status;
        if found == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(found, 200, "the admin finds the task");

    let cancel = format!("{path}:cancel");
    let rebound = format!("attacker.example:{port}");
    for (case, headers) in [
        ("a rebound Host", vec![("host", rebound.as_str())]),
        (
            "a cross-site Origin",
            vec![("host", own.as_str()), ("origin", "http://evil.example")],
        ),
    ] {
        let r = admin(&gw, "POST", &cancel, &headers).await;
        assert_eq!(r.status, 403, "{case}: {}", r.text());
    }
    // Time for a cancel to have reached the worker, had one been sent.
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some(WORKING),
        "the task still runs; log:\n{}",
        gw.log_text()
    );
    assert_eq!(worker.cancels().await, 0, "no cancel reached the worker");

    let r = admin(&gw, "POST", &cancel, &[("host", &own)]).await;
    assert_eq!(r.status, 200, "{}; log:\n{}", r.text(), gw.log_text());
    assert_eq!(r.json()["outcome"], "canceled", "{}", r.text());
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(2))
        .await
        .unwrap_or_else(|last| panic!("not canceled (state {last:?})"));
}
