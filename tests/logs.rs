//! Issue 33 item 1: the log's formats and the access log. The real gateway
//! binary in front of a real worker; its stderr is a file (not a terminal).

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::post_json;
use crate::harness::scaled_count;
use crate::harness::worker::{message, send_stream, Bind, Kind, Worker};

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
    assert_eq!(line["task"], id.as_str(), "{line}");
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
