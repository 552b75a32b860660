//! Issue 32 (production hardening), items 3 and 5: the admin endpoint's
//! `GET /tasks/{id}` (one task: record, lease, watchers, budget, owed
//! cancel) and `POST /tasks/{id}:cancel` (a `CancelTask` the gateway sends
//! itself), against a real a2a-rust worker and the gateway binary; both
//! need the admin token whenever one is configured, on loopback too.
//! (`/healthz` naming a background service that stopped is tested in
//! `gateway/src/health.rs`: no service of the binary can be stopped from
//! here.)

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::harness::gateway::{free_port, scratch_dir, Gateway};
use crate::harness::http::{request, Response};
use crate::harness::worker::{send_stream, state_of, subscribe, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs};

const CANCELED: &str = "TASK_STATE_CANCELED";
const WORKING: &str = "TASK_STATE_WORKING";

async fn admin(gw_admin: &str, method: &str, path: &str, token: Option<&str>) -> Response {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| ("authorization", a))
        .into_iter()
        .collect();
    request(method, gw_admin, path, &headers, b"").await
}

/// Polls `GET /tasks/{id}` until `ready` holds for its answer.
async fn task_view(gw: &Gateway, path: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let mut last = String::new();
    for _ in 0..scaled_count(100) {
        let r = admin(&gw.admin, "GET", path, None).await;
        if r.status == 200 && ready(&r.json()) {
            return r.json();
        }
        last = format!("{} {}", r.status, r.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "GET {path} never showed what was awaited within {:?}; last: {last}; log:\n{}",
        scaled_secs(2),
        gw.log_text()
    );
}

/// A counter's value once it is at least `want` (it is counted as the
/// worker's answer reaches the gateway), or its last value.
async fn counter_reaching(gw: &Gateway, name: &str, labels: &[&str], want: f64) -> f64 {
    let mut got = 0.0;
    for _ in 0..scaled_count(100) {
        got = gw.counter(name, labels).await;
        if got >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    got
}

/// A streaming task on a route that imposes a 30 s lease: `/tasks/{id}`
/// shows it working, watched once, its lease held by the replica with its
/// deadline ahead, no budget and no owed cancel. `POST :cancel` (loopback,
/// no token configured) cancels it through the gateway: the worker reports
/// CANCELED, counted one cancel, the gateway counted it under cause
/// `admin` and logged it; the stream's caller sees CANCELED. A second
/// cancel is answered `already_terminal`. Unknown ids are 404, other
/// methods 405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_view_and_admin_cancel_of_a_leased_stream() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "lease = { ttl = \"30s\" }").await;
    let (mut stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:60000").await;
    worker
        .wait_state(None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    let path = format!("/tasks/{id}");
    let view = task_view(&gw, &path, |v| v["watchers"] == 1 && v["lease"].is_object()).await;
    // The store records a task's first state and its settling one.
    assert!(
        ["TASK_STATE_SUBMITTED", WORKING].contains(&view["state"].as_str().unwrap_or("")),
        "{view}"
    );
    assert_eq!(view["id"], id.as_str(), "{view}");
    assert_eq!(view["route"], "w", "{view}");
    assert_eq!(view["tenant"], "", "{view}");
    assert_eq!(view["store"], "memory", "{view}");
    assert_eq!(view["binding"], "jsonrpc", "{view}");
    let lease = &view["lease"];
    assert_eq!(lease["ttlMs"], 30_000, "{view}");
    assert!(
        lease["holder"].as_str().is_some_and(|h| !h.is_empty()),
        "a gateway-held lease names its replica: {view}"
    );
    let left = lease["leftMs"].as_i64().expect("leftMs");
    assert!(left > 0 && left <= 30_000, "{view}");
    assert!(lease["deadlineMs"].as_u64().unwrap() > view["updatedMs"].as_u64().unwrap());
    assert!(view["budget"].is_null(), "{view}");
    assert!(view["caller"].is_null(), "{view}");
    assert!(
        view["owner"].is_null(),
        "no [routes.auth]: no owner: {view}"
    );
    assert!(view["cancelOwed"].is_null(), "{view}");

    // The same task named in full.
    let r = admin(&gw.admin, "GET", &format!("{path}?route=w&tenant="), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], id.as_str());
    // Named under a route or tenant it is not in: not found.
    for q in ["?route=other", "?tenant=acme", "?route=w&tenant=acme"] {
        let r = admin(&gw.admin, "GET", &format!("{path}{q}"), None).await;
        assert_eq!(r.status, 404, "{q}: {}", r.text());
    }

    let r = admin(&gw.admin, "POST", &format!("{path}:cancel"), None).await;
    assert_eq!(r.status, 200, "{}; log:\n{}", r.text(), gw.log_text());
    let body = r.json();
    assert_eq!(body["outcome"], "canceled", "{body}");
    assert_eq!(body["task"]["id"], id.as_str(), "{body}");
    assert!(body["error"].is_null(), "{body}");
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(2))
        .await
        .unwrap_or_else(|last| panic!("not canceled (state {last:?}); log:\n{}", gw.log_text()));
    // The caller's stream ends with the cancellation.
    let events = stream.rest(scaled_secs(5)).await;
    assert_eq!(
        events.iter().rev().find_map(state_of).as_deref(),
        Some(CANCELED),
        "{events:?}"
    );
    stream.close();
    let admin_canceled = ["cause=\"admin\"", "outcome=\"canceled\""];
    assert_eq!(
        counter_reaching(&gw, "a2agw_cancels_total", &admin_canceled, 1.0).await,
        1.0
    );
    // The stream's end settled nothing more: no other cancel was sent.
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_eq!(gw.counter("a2agw_cancels_total", &[]).await, 1.0);
    let log = gw.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("admin cancel") && l.contains(id.as_str()))
        .collect();
    assert_eq!(lines.len(), 1, "one admin cancel line: {lines:?}");
    assert!(lines[0].contains("outcome=\"canceled\""), "{}", lines[0]);
    assert!(lines[0].contains("from=127.0.0.1:"), "{}", lines[0]);

    // The store saw the settled state; the lease is gone.
    let view = task_view(&gw, &path, |v| v["state"] == CANCELED).await;
    assert!(view["lease"].is_null(), "{view}");
    assert_eq!(view["watchers"], 0, "{view}");

    // Again: the worker says the task is terminal.
    let r = admin(&gw.admin, "POST", &format!("{path}:cancel"), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["outcome"], "already_terminal", "{}", r.text());
    assert_eq!(
        counter_reaching(
            &gw,
            "a2agw_cancels_total",
            &["cause=\"admin\"", "outcome=\"not_cancelable\""],
            1.0
        )
        .await,
        1.0
    );

    // Unknown ids; wrong methods.
    for (method, p) in [
        ("GET", "/tasks/no-such-task"),
        ("POST", "/tasks/no-such-task:cancel"),
    ] {
        let r = admin(&gw.admin, method, p, None).await;
        assert_eq!(r.status, 404, "{method} {p}: {}", r.text());
    }
    for (method, p, allow) in [
        ("GET", format!("{path}:cancel"), "POST"),
        ("DELETE", path.clone(), "GET"),
        ("POST", path.clone(), "GET"),
    ] {
        let r = admin(&gw.admin, method, &p, None).await;
        assert_eq!(r.status, 405, "{method} {p}: {}", r.text());
        assert_eq!(r.header("allow"), Some(allow), "{method} {p}");
    }
    let r = admin(&gw.admin, "GET", &format!("{path}?tennant=x"), None).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = admin(&gw.admin, "GET", "/healthz", None).await;
    assert_eq!((r.status, r.text().as_str()), (200, "ok\n"));
}

/// One task id recorded under two routes (streamed through one, subscribed
/// to through the other): `/tasks/{id}` and its cancel answer 409 with both
/// candidates and send nothing; named with `?route=`, it is found and
/// cancelled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_under_two_routes_needs_naming() {
    let worker = Worker::start(Kind::Rust).await;
    let url = worker.url();
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"a\"\nworker = \"{url}\"\n\n[[routes]]\nname = \"b\"\nworker = \"{url}\"\npath_prefix = \"/b\"\n"
    ))
    .await;
    let (mut first, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:60000").await;
    let mut second = subscribe(&format!("{}/b", gw.url), Bind::JsonRpc, None, &id).await;
    assert_eq!(second.status, 200);
    let path = format!("/tasks/{id}");
    let mut last = String::new();
    let mut conflict = None;
    for _ in 0..scaled_count(100) {
        let r = admin(&gw.admin, "GET", &path, None).await;
        if r.status == 409 {
            conflict = Some(r.json());
            break;
        }
        last = format!("{} {}", r.status, r.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let conflict = conflict.unwrap_or_else(|| panic!("no 409; last: {last}"));
    let routes: Vec<&str> = conflict["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .map(|c| c["route"].as_str().unwrap())
        .collect();
    assert_eq!(routes, ["a", "b"], "{conflict}");
    let r = admin(&gw.admin, "POST", &format!("{path}:cancel"), None).await;
    assert_eq!(r.status, 409, "{}", r.text());
    tokio::time::sleep(scaled_ms(200)).await;
    assert_eq!(
        worker.cancels().await,
        0,
        "nothing sent for an ambiguous id"
    );

    let r = admin(&gw.admin, "GET", &format!("{path}?route=b"), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["route"], "b");
    let r = admin(&gw.admin, "POST", &format!("{path}:cancel?route=a"), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["outcome"], "canceled", "{}", r.text());
    assert_eq!(r.json()["task"]["route"], "a", "{}", r.text());
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(2))
        .await
        .expect("canceled");
    let _ = first.rest(scaled_secs(5)).await;
    let _ = second.rest(scaled_secs(5)).await;
    first.close();
    second.close();
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
}

/// A gateway process started on a config of the test's own (the harness's
/// gateway has its admin on 127.0.0.1); killed on drop.
struct OwnGateway {
    _child: tokio::process::Child,
    admin: String,
}

impl OwnGateway {
    /// `admin` as `server.admin`, with the token from `A2AGW_ADMIN_TEST_TOKEN`.
    async fn start(admin_addr: &str, token: &str) -> OwnGateway {
        let dir = scratch_dir("admin");
        let cfg = dir.join("gateway.toml");
        std::fs::write(
            &cfg,
            format!(
                "[server]\nlisten = \"127.0.0.1:{}\"\nadmin = \"{admin_addr}\"\nadmin_token_env = \"A2AGW_ADMIN_TEST_TOKEN\"\n\n[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:1\"\n",
                free_port()
            ),
        )
        .unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
            .arg("--config")
            .arg(&cfg)
            .env("A2AGW_ADMIN_TEST_TOKEN", token)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a2a-gateway");
        let port = admin_addr.rsplit(':').next().unwrap();
        let admin = format!("http://127.0.0.1:{port}");
        for _ in 0..scaled_count(200) {
            if tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
                .await
                .is_ok()
            {
                return OwnGateway {
                    _child: child,
                    admin,
                };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the gateway's admin never listened on {admin_addr}");
    }
}

/// With a token configured, `/tasks/{id}` and `POST /tasks/{id}:cancel`
/// answer 401 without it or with another, on an admin listener off loopback
/// (`0.0.0.0`) and on one bound to 127.0.0.1 alike; with it they answer as
/// usual (a leased task is shown and cancelled on loopback; an unknown id
/// is 404 off loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_paths_need_the_token_when_one_is_set() {
    let token = "admin-tasks-token-0123456789";
    let wrong = "admin-tasks-token-0123456789x";
    let open = OwnGateway::start(&format!("0.0.0.0:{}", free_port()), token).await;
    for (method, path) in [("GET", "/tasks/t1"), ("POST", "/tasks/t1:cancel")] {
        for given in [None, Some(wrong)] {
            let r = admin(&open.admin, method, path, given).await;
            assert_eq!(
                r.status,
                401,
                "off loopback {method} {path} {given:?}: {}",
                r.text()
            );
            assert!(r.header("www-authenticate").is_some());
        }
        let r = admin(&open.admin, method, path, Some(token)).await;
        assert_eq!(r.status, 404, "off loopback {method} {path}: {}", r.text());
    }
    drop(open);

    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start_with_env(
        &format!(
            "admin_token_env = \"A2AGW_ADMIN_TEST_TOKEN\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"30s\" }}\n",
            worker.url()
        ),
        &[("A2AGW_ADMIN_TEST_TOKEN", token)],
    )
    .await;
    let (stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:60000").await;
    let path = format!("/tasks/{id}");
    let mut shown = None;
    for _ in 0..scaled_count(100) {
        let r = admin(&gw.admin, "GET", &path, Some(token)).await;
        if r.status == 200 && r.json()["lease"].is_object() {
            shown = Some(r.json());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shown = shown.expect("the task and its lease shown with the token");
    assert_eq!(shown["watchers"], 1, "{shown}");
    for given in [None, Some(wrong)] {
        for (method, p) in [("GET", path.clone()), ("POST", format!("{path}:cancel"))] {
            let r = admin(&gw.admin, method, &p, given).await;
            assert_eq!(
                r.status,
                401,
                "loopback {method} {p} {given:?}: {}",
                r.text()
            );
        }
    }
    tokio::time::sleep(scaled_ms(200)).await;
    assert_eq!(worker.cancels().await, 0, "no cancel without the token");
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some(WORKING),
        "still running"
    );
    let r = admin(&gw.admin, "POST", &format!("{path}:cancel"), Some(token)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["outcome"], "canceled", "{}", r.text());
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(2))
        .await
        .expect("canceled with the token");
    stream.close();
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels().await, 1);
    assert!(!gw.log_text().contains(token));
}

/// A child the gateway cancelled because its caller left: no stream saw
/// its CANCELED, yet its record settles as CANCELED once the worker
/// accepted the cancel (so it is shown as the worker holds it and kept for
/// the settled retention, not the unsettled one), on the embedded store and
/// on Redis, where the record's expiry shrinks to the settled retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascaded_childs_record_settles_as_canceled() {
    let worker = Worker::start(Kind::Rust).await;
    let redis = crate::harness::redis::RedisServer::start().await;
    for store in ["", &format!("[store]\nurl = \"{}\"\n\n", redis.url())] {
        let gw = Gateway::start(&format!(
            "{store}[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
            worker.url()
        ))
        .await;
        let (stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:60000").await;
        worker
            .wait_state(None, &id, WORKING, scaled_secs(5))
            .await
            .expect("the task runs");
        let path = format!("/tasks/{id}");
        task_view(&gw, &path, |v| v["watchers"] == 1).await;
        stream.close();
        worker
            .wait_state(None, &id, CANCELED, scaled_secs(2))
            .await
            .unwrap_or_else(|last| {
                panic!("not canceled (state {last:?}); log:\n{}", gw.log_text())
            });
        let view = task_view(&gw, &path, |v| v["state"] == CANCELED).await;
        assert_eq!(view["watchers"], 0, "{view}");
        assert!(view["cancelOwed"].is_null(), "{view}");
        if !store.is_empty() {
            // The task's hash now expires within the settled retention
            // (10 minutes), not the unsettled one (24 hours).
            let keys = redis.cli(&["--scan", "--pattern", "*"]).await;
            let keys = String::from_utf8_lossy(&keys).into_owned();
            let key = keys
                .lines()
                .find(|k| k.contains(id.as_str()) && !k.contains("outbox"))
                .unwrap_or_else(|| panic!("no key for {id} in:\n{keys}"));
            let ttl = redis.cli(&["TTL", key]).await;
            let ttl: i64 = String::from_utf8_lossy(&ttl).trim().parse().expect("TTL");
            assert!(ttl > 0 && ttl <= 600, "TTL {ttl} of {key}");
        }
        assert_eq!(worker.cancels().await, if store.is_empty() { 1 } else { 2 });
    }
}
