//! Issue 33 item 4: hot reload. SIGHUP and `POST /reload` re-read the
//! config file: new routes and policies serve new requests, a stream open
//! across a reload keeps the policy it started with (its cascade), an
//! invalid file is refused with every error logged and the old routes kept,
//! a setting that needs a restart is named and keeps its running value, and
//! `[server.tls]`'s certificate is loaded again. The real gateway binary in
//! front of real workers.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::gateway::{free_port, Gateway};
use crate::harness::http::{post_json, request};
use crate::harness::tls::PrivateCa;
use crate::harness::worker::{message, send_stream, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs, scenarios};

const CANCELED: &str = "TASK_STATE_CANCELED";
const WORKING: &str = "TASK_STATE_WORKING";
const LONG: &str = "work:30000";

fn route(name: &str, worker: &str, extra: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\nworker = \"{worker}\"\n{extra}\n")
}

/// Waits until `a2agw_config_reloads_total{outcome}` is `n`.
async fn wait_reloads(gw: &Gateway, outcome: &str, n: f64) {
    let label = format!("outcome=\"{outcome}\"");
    let mut seen = 0.0;
    for _ in 0..scaled_count(250) {
        seen = gw.counter("a2agw_config_reloads_total", &[&label]).await;
        if seen >= n {
            assert_eq!(seen, n, "more reloads than asked for");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{outcome} reloads: {seen}, not {n}, within {:?}; log:\n{}",
        scaled_secs(5),
        gw.log_text()
    );
}

/// One JSON-RPC SendMessage (`quick`) at `base`: the HTTP status.
async fn send_quick(base: &str) -> u16 {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = post_json(base, "/", &[], &body).await;
    if r.status == 200 {
        assert!(r.json()["result"].is_object(), "{}", r.text());
    }
    r.status
}

/// `POST /reload` with `headers`: the status and the JSON answer.
async fn post_reload(gw: &Gateway, headers: &[(&str, &str)]) -> (u16, Value) {
    let r = request("POST", &gw.admin, "/reload", headers, b"").await;
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v)
}

/// SIGHUP with a route added: the new route reaches its worker, the old one
/// still reaches its own, and the log says what changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_route() {
    let one = Worker::start(Kind::Rust).await;
    let two = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&route("one", &one.url(), "")).await;
    let two_base = format!("{}/two", gw.url);

    // Before: /two is the catch-all's, and worker one has nothing there.
    assert_eq!(send_quick(&two_base).await, 404);
    assert_eq!((one.tasks_started_now(), two.tasks_started_now()), (0, 0));

    gw.rewrite_config(&format!(
        "{}{}",
        route("one", &one.url(), ""),
        route("two", &two.url(), "path_prefix = \"/two\"")
    ));
    gw.hangup();
    wait_reloads(&gw, "applied", 1.0).await;

    assert_eq!(send_quick(&two_base).await, 200);
    assert_eq!(
        (one.tasks_started_now(), two.tasks_started_now()),
        (0, 1),
        "the new route reached its worker"
    );
    assert_eq!(send_quick(&gw.url).await, 200);
    assert_eq!(
        (one.tasks_started_now(), two.tasks_started_now()),
        (1, 1),
        "the old route still reaches its worker"
    );
    let log = gw.log_text();
    assert!(
        log.lines().any(|l| l.contains("config reloaded")
            && l.contains("SIGHUP")
            && l.contains("\"two\"")),
        "log:\n{log}"
    );
    assert_eq!(
        gw.counter("a2agw_config_reloads_total", &["outcome=\"refused\""])
            .await,
        0.0
    );
}

/// `POST /reload` needs the admin token when one is configured; with it,
/// the answer says what was applied; GET is not a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_reload_needs_the_admin_token() {
    let token = "reload-admin-token-0123456789";
    let worker = Worker::start(Kind::Rust).await;
    let head = "admin_token_env = \"RELOAD_ADMIN_TOKEN\"\n\n";
    let gw = Gateway::start_with_env(
        &format!("{head}{}", route("w", &worker.url(), "")),
        &[("RELOAD_ADMIN_TOKEN", token)],
    )
    .await;
    gw.rewrite_config(&format!(
        "{head}{}",
        route("w", &worker.url(), "cascade = \"detach\"")
    ));
    let good = format!("Bearer {token}");
    let wrong = format!("Bearer {token}x");
    for auth in [None, Some(wrong.as_str())] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let (status, _) = post_reload(&gw, &headers).await;
        assert_eq!(status, 401, "{auth:?}");
    }
    let auth = [("authorization", good.as_str())];
    let r = request("GET", &gw.admin, "/reload", &auth, b"").await;
    assert_eq!(r.status, 405, "{}", r.text());
    assert_eq!(r.header("allow"), Some("POST"));
    // Nothing was reloaded by the refused calls.
    let log = gw.log_text();
    assert!(
        !log.contains("config reloaded") && !log.contains("config reload refused"),
        "{log}"
    );

    let (status, v) = post_reload(&gw, &auth).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["outcome"], "applied", "{v}");
    assert_eq!(v["changed"], json!(["w"]), "{v}");
    assert_eq!(v["added"], json!([]), "{v}");
    assert_eq!(v["restartRequired"], json!([]), "{v}");
    let metrics = request("GET", &gw.admin, "/metrics", &auth, b"")
        .await
        .text();
    assert!(
        metrics.contains("a2agw_config_reloads_total{outcome=\"applied\"} 1"),
        "{metrics}"
    );
    assert!(!gw.log_text().contains(token));
}

/// A stream open across a reload that turns its route's cascade off keeps
/// streaming, and when its caller leaves its child is still cancelled (the
/// policy it started with); a stream opened after the reload has the new
/// policy: its child runs on when its caller leaves.
async fn stream_keeps_its_policy(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (mut before, id_before) = send_stream(&gw.url, bind, None, LONG).await;
    worker
        .wait_state(None, &id_before, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");

    gw.rewrite_config(&route("w", &worker.url(), "cascade = \"detach\""));
    gw.hangup();
    wait_reloads(&gw, "applied", 1.0).await;

    // Still streaming: the worker's updates keep coming through.
    for _ in 0..3 {
        before
            .next(scaled_secs(2))
            .await
            .expect("the stream open across the reload still flows");
    }
    let (after, id_after) = send_stream(&gw.url, bind, None, LONG).await;
    worker
        .wait_state(None, &id_after, WORKING, scaled_secs(5))
        .await
        .expect("the second task runs");

    before.close();
    worker
        .wait_state(None, &id_before, CANCELED, scaled_secs(1))
        .await
        .unwrap_or_else(|s| {
            panic!(
                "the stream opened before the reload lost its cascade (state {s:?}); log:\n{}",
                gw.log_text()
            )
        });
    after.close();
    tokio::time::sleep(scaled_ms(1200)).await;
    assert_eq!(
        worker.state(None, &id_after).await.as_deref(),
        Some(WORKING),
        "the stream opened after the reload is detached"
    );
    assert_eq!(
        worker.cancels().await,
        1,
        "one CancelTask: the first task's"
    );
    assert!(
        gw.counter("a2agw_cascade_decisions_total", &["keep_detached"])
            .await
            >= 1.0
    );
}

scenarios! {
    rust_jsonrpc_stream_keeps_its_policy => stream_keeps_its_policy(Kind::Rust, Bind::JsonRpc);
    python_rest_stream_keeps_its_policy => stream_keeps_its_policy(Kind::Python, Bind::Rest);
}

/// A file with several errors is refused: each error is in the log (and in
/// `/reload`'s answer), the old routes still answer, and the refusal is
/// counted; a valid file after it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_file_is_refused_with_every_error() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    gw.rewrite_config(&format!(
        "{}{}",
        route("w", "ftp://127.0.0.1:1", "cascade = \"sometimes\""),
        route(
            "w",
            &worker.url(),
            "disconnect_grace = \"soon\"\nno_such_key = 1"
        ),
    ));
    let expected: Vec<String> = match config::load(&gw.config) {
        Ok(_) => panic!("the file was meant to be invalid"),
        Err(e) => e.errors.iter().map(|e| e.to_string()).collect(),
    };
    assert!(expected.len() >= 4, "several errors: {expected:?}");

    gw.hangup();
    wait_reloads(&gw, "refused", 1.0).await;
    let log = gw.log_text();
    for e in &expected {
        assert!(
            log.lines()
                .any(|l| l.contains("config reload refused") && l.contains(e.as_str())),
            "{e:?} not logged:\n{log}"
        );
    }
    assert!(log.contains("the running config is kept"), "log:\n{log}");
    assert_eq!(send_quick(&gw.url).await, 200, "the old route answers");
    assert_eq!(worker.tasks_started_now(), 1);

    let (status, v) = post_reload(&gw, &[]).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["outcome"], "refused", "{v}");
    let errors: Vec<&str> = v["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(errors.len(), expected.len(), "{v}");
    for (got, want) in errors.iter().zip(&expected) {
        assert!(got.ends_with(want.as_str()), "{got:?} / {want:?}");
    }
    wait_reloads(&gw, "refused", 2.0).await;
    assert_eq!(
        gw.counter("a2agw_config_reloads_total", &["outcome=\"applied\""])
            .await,
        0.0
    );

    gw.rewrite_config(&route("w", &worker.url(), "cascade = \"detach\""));
    let (status, v) = post_reload(&gw, &[]).await;
    assert_eq!((status, &v["outcome"]), (200, &json!("applied")), "{v}");
    assert_eq!(send_quick(&gw.url).await, 200);
}

/// A new listen address is named as needing a restart (log and answer);
/// the old listener keeps serving, the new address is not listened on, and
/// the route change in the same file applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_only_change_is_named_and_the_rest_applies() {
    let one = Worker::start(Kind::Rust).await;
    let two = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&one.url(), "").await;
    let old_port = gw.url.rsplit(':').next().unwrap().to_string();
    let new_port = free_port();
    let text = std::fs::read_to_string(&gw.config).unwrap();
    let old_listen = format!("listen = [\"127.0.0.1:{old_port}\"]");
    assert!(text.contains(&old_listen), "{text}");
    let text = text
        .replace(&old_listen, &format!("listen = [\"127.0.0.1:{new_port}\"]"))
        .replace(&one.url(), &two.url());
    std::fs::write(&gw.config, text).unwrap();

    let (status, v) = post_reload(&gw, &[]).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["restartRequired"], json!(["server.listen"]), "{v}");
    assert_eq!(v["changed"], json!(["w"]), "{v}");
    let log = gw.log_text();
    assert!(
        log.lines().any(|l| l.contains("server.listen")
            && l.contains("take effect only after a restart")
            && l.contains("WARN")),
        "log:\n{log}"
    );

    assert_eq!(send_quick(&gw.url).await, 200, "the old listener serves");
    assert_eq!(
        (one.tasks_started_now(), two.tasks_started_now()),
        (0, 1),
        "the route's new worker"
    );
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", new_port))
            .await
            .is_err(),
        "nothing listens on the new address before a restart"
    );
    // /readyz still checks the running listeners.
    let r = request("GET", &gw.admin, "/readyz", &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// `[server.tls]`'s certificate files replaced and reloaded: new TLS
/// handshakes get the new certificate (a client trusting only the new CA
/// connects, one trusting only the old no longer does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_certificate_is_reloaded() {
    let worker = Worker::start(Kind::Rust).await;
    let old = PrivateCa::new("reload-old");
    let new = PrivateCa::new("reload-new");
    let port = free_port();
    let dir = crate::harness::gateway::scratch_dir("reload-tls");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::copy(&old.cert_pem, &cert).unwrap();
    std::fs::copy(&old.key_pem, &key).unwrap();
    let body = format!(
        "[server.tls]\nlisten = [\"127.0.0.1:{port}\"]\ncert = {:?}\nkey = {:?}\n\n{}",
        cert.display().to_string(),
        key.display().to_string(),
        route("w", &worker.url(), "")
    );
    let gw = Gateway::start(&body).await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert!(old.connect(addr).await.is_ok(), "the first certificate");
    assert!(new.connect(addr).await.is_err());

    // A key that is not the certificate's: refused, the old one kept.
    std::fs::copy(&new.cert_pem, &cert).unwrap();
    let (status, v) = post_reload(&gw, &[]).await;
    assert_eq!(status, 422, "{v}");
    assert!(
        old.connect(addr).await.is_ok(),
        "still the first certificate"
    );

    std::fs::copy(&new.key_pem, &key).unwrap();
    let (status, v) = post_reload(&gw, &[]).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["certificateReloaded"], true, "{v}");
    assert!(
        new.connect(addr).await.is_ok(),
        "the new certificate; log:\n{}",
        gw.log_text()
    );
    assert!(old.connect(addr).await.is_err(), "not the old one");
}

/// A route removed by a reload is out of reach of new requests, but the
/// lease of a task started on it still lapses into a cancel sent with its
/// config: a non-blocking send on a `poll_lease` route, then a reload that
/// renames the route; nobody polls, and the worker has the task CANCELED
/// within `poll_lease` + 1 s of the send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_route_still_cancels_its_lapsed_lease() {
    const POLL: Duration = Duration::from_secs(2);
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&route("w", &worker.url(), "poll_lease = \"2s\"")).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message(LONG), "configuration": {"returnImmediately": true}}});
    let sent_at = tokio::time::Instant::now();
    let r = post_json(&gw.url, "/", &[], &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let id = v["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {v}"))
        .to_string();

    gw.rewrite_config(&route("v", &worker.url(), ""));
    let (status, v) = post_reload(&gw, &[]).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["added"], &v["removed"]),
        (&json!(["v"]), &json!(["w"])),
        "{v}"
    );
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some(WORKING),
        "not cancelled by the reload itself"
    );

    let bound = POLL + scaled_ms(1000);
    worker
        .wait_state(None, &id, CANCELED, bound.saturating_sub(sent_at.elapsed()))
        .await
        .unwrap_or_else(|s| {
            panic!(
                "the removed route's lapsed lease was not cancelled (state {s:?}); log:\n{}",
                gw.log_text()
            )
        });
    assert_eq!(worker.cancels().await, 1);
}
