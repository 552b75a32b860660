//! Issue 33 item 1: the log's formats and the access log. The real gateway
//! binary in front of a real worker; its stderr is a file (not a terminal).

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::post_json;
use crate::harness::worker::{message, send_stream, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms};

/// The access lines of a JSON log (target `a2agw::access`); panics on any
/// line that is not a JSON object.
fn access_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Value>(l)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {l}\nlog:\n{log}"))
        })
        .inspect(|v| assert!(v.is_object(), "not an object: {v}"))
        .filter(|v| v["target"] == "a2agw::access")
        .collect()
}

/// Waits (the line is written as the request ends, after the answer) for an
/// access line that `pick` accepts.
async fn wait_access(gw: &Gateway, pick: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..scaled_count(100) {
        if let Some(v) = access_lines(&gw.log_text()).into_iter().find(&pick) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no such access line; log:\n{}", gw.log_text());
}

/// `log_format = "json"`: every line is JSON; a stream's SendStreamingMessage,
/// a SendMessage and a GetTask each get one access line with their route,
/// method, binding, task (the worker's id), status and byte counts; the
/// stream its caller left shows the cascade was handed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_and_access_lines() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&format!(
        "log_format = \"json\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        worker.url()
    ))
    .await;

    // A stream its caller leaves: the cascade is handed it.
    let (stream, streamed) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    stream.close();
    let line = wait_access(&gw, |v| v["task"] == streamed.as_str()).await;
    assert_eq!(line["route"], "w", "{line}");
    assert_eq!(line["method"], "SendStreamingMessage", "{line}");
    assert_eq!(line["binding"], "jsonrpc", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["cascade"], "caller_gone", "{line}");
    assert_eq!(line["level"], "INFO", "{line}");
    assert!(line["bytes_in"].as_u64().unwrap() > 0, "{line}");
    assert!(line["bytes_out"].as_u64().unwrap() > 0, "{line}");
    assert!(line["duration_ms"].as_f64().unwrap() >= 0.0, "{line}");
    assert!(line.get("tenant").is_none(), "{line}");

    // A SendMessage that completes, then a GetTask of its task.
    let sent = post_json(
        &gw.url,
        "/",
        &[],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                "params": {"message": message("quick")}}),
    )
    .await;
    assert_eq!(sent.status, 200, "{}", sent.text());
    let v = sent.json();
    let id = v["result"]["task"]["id"]
        .as_str()
        .or_else(|| v["result"]["id"].as_str())
        .unwrap_or_else(|| panic!("no task in {v}"))
        .to_string();
    let line = wait_access(&gw, |v| v["method"] == "SendMessage").await;
    // A guarded blocking send's answer passes unread: the line names no
    // task (the GetTask below names it from its request).
    assert!(line.get("task").is_none(), "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["route"], "w", "{line}");
    assert_eq!(
        line["bytes_out"].as_u64(),
        Some(sent.body.len() as u64),
        "{line}"
    );

    let got = post_json(
        &gw.url,
        "/",
        &[],
        &json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}}),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let line = wait_access(&gw, |v| v["method"] == "GetTask").await;
    assert_eq!(line["task"], id.as_str(), "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["binding"], "jsonrpc", "{line}");
    assert!(line.get("cascade").is_none(), "{line}");

    // Every line of the log parsed (access_lines panics otherwise), and
    // none carries an escape byte.
    let log = gw.log_text();
    assert!(!log.contains('\u{1b}'), "ANSI escape in the log:\n{log}");
}

/// Text format with stderr a file: no ANSI escapes, and the access line is
/// there; `access_log = false`: none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_log_has_no_colour_and_access_log_can_be_off() {
    let worker = Worker::start(Kind::Rust).await;
    for access in [true, false] {
        let gw = Gateway::start(&format!(
            "access_log = {access}\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
            worker.url()
        ))
        .await;
        let got = post_json(
            &gw.url,
            "/",
            &[],
            &json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "nope"}}),
        )
        .await;
        assert_eq!(got.status, 200, "{}", got.text());
        // Another request after it: the first one's line is written by then.
        let _ = post_json(&gw.url, "/", &[], &json!({})).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let log = gw.log_text();
        assert!(!log.contains('\u{1b}'), "ANSI escape in the log:\n{log}");
        let lines = log.lines().filter(|l| l.contains("a2agw::access")).count();
        if access {
            assert!(
                log.lines().any(|l| l.contains("a2agw::access")
                    && l.contains("method=\"GetTask\"")
                    && l.contains("status=200")),
                "log:\n{log}"
            );
        } else {
            assert_eq!(lines, 0, "log:\n{log}");
        }
    }
}

/// Access lines beyond JSON-RPC: a REST call (method from the verb and
/// path), a REST stream in a tenant (`tenant` from the path), a WebSocket
/// session (one line when the socket ends: status 101, binding
/// `websocket`), and callers named by the route's `caller_header`: an API
/// key only as its fingerprint, a bearer JWT by its `sub`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_lines_for_rest_tenant_websocket_and_callers() {
    use base64::Engine as _;

    let worker = crate::harness::rust_worker::RustWorker::start(
        crate::harness::rust_worker::RustWorkerOptions {
            websocket: true,
            ..Default::default()
        },
    )
    .await;
    let ws = worker.ws_url().expect("a WebSocket listener");
    let (ws_authority, _) = crate::harness::http::split_url(&ws.replacen("ws://", "http://", 1));
    let gw = Gateway::start(&format!(
        "log_format = \"json\"\n\n\
         [[routes]]\nname = \"w\"\nworker = \"{}\"\n\n\
         [[routes]]\nname = \"s\"\nworker = \"http://{ws_authority}\"\npath_prefix = \"/s\"\n\n\
         [[routes]]\nname = \"b\"\nworker = \"{}\"\npath_prefix = \"/b\"\n\
         [routes.budget]\nmax_deadline = \"1m\"\ncaller_header = \"x-api-key\"\n",
        worker.url(),
        worker.url()
    ))
    .await;

    // REST: a blocking send, then its task.
    let sent = post_json(
        &gw.url,
        "/message:send",
        &[],
        &json!({"message": message("quick")}),
    )
    .await;
    assert_eq!(sent.status, 200, "{}", sent.text());
    let id = crate::harness::worker::task_id_of(&sent.json())
        .unwrap_or_else(|| panic!("no task in {}", sent.text()));
    let line = wait_access(&gw, |v| {
        v["method"] == "SendMessage" && v["binding"] == "rest"
    })
    .await;
    assert_eq!(line["route"], "w", "{line}");
    assert_eq!(line["path"], "/message:send", "{line}");
    assert_eq!(line["http_method"], "POST", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert!(line.get("task").is_none(), "unread answer: {line}");
    let got =
        crate::harness::http::request("GET", &gw.url, &format!("/tasks/{id}"), &[], b"").await;
    assert_eq!(got.status, 200, "{}", got.text());
    let line = wait_access(&gw, |v| v["method"] == "GetTask" && v["binding"] == "rest").await;
    assert_eq!(line["task"], id.as_str(), "{line}");
    assert_eq!(line["http_method"], "GET", "{line}");
    assert_eq!(line["status"], 200, "{line}");

    // A REST stream in a tenant.
    let (mut stream, streamed) = send_stream(&gw.url, Bind::Rest, Some("acme"), "quick").await;
    let _ = stream.rest(crate::harness::scaled_secs(10)).await;
    let line = wait_access(&gw, |v| v["task"] == streamed.as_str()).await;
    assert_eq!(line["tenant"], "acme", "{line}");
    assert_eq!(line["method"], "SendStreamingMessage", "{line}");
    assert_eq!(line["binding"], "rest", "{line}");
    assert_eq!(line["path"], "/acme/message:stream", "{line}");
    assert_eq!(line["status"], 200, "{line}");

    // A WebSocket session: one line, as the socket ends.
    let gw_ws = format!("{}/s/ws", gw.url.replacen("http://", "ws://", 1));
    let mut sock = crate::harness::ws::connect(&gw_ws).await.unwrap();
    let answer = crate::harness::ws::round_trip(
        &mut sock,
        7,
        json!({"jsonrpc": "2.0", "id": 7, "method": "GetTask", "params": {"id": id}}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(answer["result"]["id"], id.as_str(), "{answer}");
    drop(sock);
    let line = wait_access(&gw, |v| v["route"] == "s").await;
    assert_eq!(line["binding"], "websocket", "{line}");
    assert_eq!(line["status"], 101, "{line}");
    assert_eq!(line["path"], "/s/ws", "{line}");
    assert!(line["bytes_out"].as_u64().unwrap() > 0, "{line}");

    // Callers named by the route's caller_header.
    let key = "key-5f1c0a-not-for-logs";
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"sub":"alice"}"#);
    let jwt = format!("Bearer eyJhbGciOiJub25lIn0.{claims}.sig");
    for (value, shown) in [(key, None), (jwt.as_str(), Some("alice"))] {
        let got = crate::harness::http::request(
            "GET",
            &gw.url,
            &format!("/b/tasks/{id}"),
            &[("x-api-key", value)],
            b"",
        )
        .await;
        assert_eq!(got.status, 200, "{}", got.text());
        let line = wait_access(&gw, |v| {
            v["route"] == "b"
                && match shown {
                    Some(s) => v["caller"] == s,
                    None => v["caller"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("sha256:")),
                }
        })
        .await;
        assert_eq!(line["method"], "GetTask", "{line}");
    }
    let log = gw.log_text();
    assert!(!log.contains(key), "the API key is in the log:\n{log}");
}

/// `server.log_flush`: `info` lines (the access line) wait in the buffer,
/// written by the flush tick (the default, a second) or when the gateway
/// stops (SIGTERM); with a minute's flush a line is not there before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_log_lines_are_written_by_the_tick_or_at_the_end() {
    let worker = Worker::start(Kind::Rust).await;
    let get_task =
        json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "nope"}});
    let access = |log: &str| {
        log.lines()
            .any(|l| l.contains("a2agw::access") && l.contains("method=\"GetTask\""))
    };
    // The default (the harness writes every line at once unless the body
    // names `log_flush`, as this comment does).
    let gw = Gateway::start(&format!(
        "# server.log_flush: its default\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        worker.url()
    ))
    .await;
    assert_eq!(post_json(&gw.url, "/", &[], &get_task).await.status, 200);
    assert!(
        gw.wait_log(scaled_ms(3000), access).await,
        "no access line within the flush; log:\n{}",
        gw.log_text()
    );

    // A minute: the line waits (the tick ran once, at the start), and the
    // gateway's end writes it.
    let mut gw = Gateway::start(&format!(
        "log_flush = \"1m\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        worker.url()
    ))
    .await;
    assert_eq!(post_json(&gw.url, "/", &[], &get_task).await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = gw.log_text();
    assert!(!access(&before), "written before its flush:\n{before}");
    gw.terminate();
    let status = gw
        .wait_exit(crate::harness::scaled(Duration::from_secs(30)))
        .await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let after = gw.log_text();
    assert!(access(&after), "not written at the end:\n{after}");
    // What waited came first: the access line before the drain's own.
    let at = |needle: &str| after.find(needle).unwrap_or(usize::MAX);
    assert!(at("a2agw::access") < at("drained; exiting"), "{after}");
}
