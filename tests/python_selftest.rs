//! The Python `a2a-sdk` 1.3.0 worker, talked to directly (no gateway): checks
//! that the agent behaves as the gateway tests assume, and pins the SDK's wire
//! facts the gateway depends on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::http::{self, post_json, wait_for_state};
use crate::harness::python_worker::{PythonWorker, SseStream};
use crate::harness::{scaled_ms, scaled_secs};

/// How long a test waits for the next SSE frame.
fn frame() -> Duration {
    scaled_secs(10)
}

fn user_message(text: &str) -> Value {
    static N: AtomicU64 = AtomicU64::new(0);
    json!({
        "messageId": format!("py-selftest-{}", N.fetch_add(1, Ordering::Relaxed)),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    })
}

fn rpc(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": format!("req-{method}"), "method": method, "params": params})
}

/// Opens a JSON-RPC SendStreamingMessage stream at `POST /`.
async fn rpc_stream(w: &PythonWorker, text: &str, headers: &[(&str, &str)]) -> SseStream {
    let s = SseStream::open(
        &w.url(),
        "/",
        headers,
        &rpc(
            "SendStreamingMessage",
            json!({"message": user_message(text)}),
        ),
    )
    .await;
    assert_eq!(s.status, 200);
    assert!(
        s.header("content-type")
            .unwrap_or("")
            .starts_with("text/event-stream"),
        "{:?}",
        s.headers
    );
    s
}

/// The task id in a StreamResponse (`task.id` or `*.taskId`).
fn task_id(sr: &Value) -> String {
    sr["task"]["id"]
        .as_str()
        .or_else(|| sr["statusUpdate"]["taskId"].as_str())
        .or_else(|| sr["artifactUpdate"]["taskId"].as_str())
        .unwrap_or_else(|| panic!("no task id in {sr}"))
        .to_string()
}

fn state_of(sr: &Value) -> Option<&str> {
    sr["statusUpdate"]["status"]["state"]
        .as_str()
        .or_else(|| sr["task"]["status"]["state"].as_str())
}

async fn cancel_rpc(w: &PythonWorker, tenant: Option<&str>, id: &str) -> Value {
    let mut params = json!({"id": id});
    if let Some(t) = tenant {
        params["tenant"] = json!(t);
    }
    post_json(&w.url(), "/", &[], &rpc("CancelTask", params))
        .await
        .json()
}

#[tokio::test]
async fn python_selftest_jsonrpc_work_then_cancel() {
    let w = PythonWorker::start().await;
    let mut s = rpc_stream(&w, "work:3000", &[]).await;

    // Exact framing: `data: <json>\r\n\r\n`, no `event:`/`id:` lines.
    let first = s.next_raw_frame(frame()).await.expect("first frame");
    assert!(
        first.starts_with("data: {") && first.ends_with("}\r\n\r\n"),
        "{first:?}"
    );
    assert_eq!(
        first.matches("\r\n").count(),
        2,
        "single-line data: {first:?}"
    );
    let env: Value = serde_json::from_str(first.trim_start_matches("data: ").trim_end()).unwrap();
    assert_eq!(env["jsonrpc"], "2.0");
    assert_eq!(env["id"], "req-SendStreamingMessage");
    let sr = &env["result"];
    assert_eq!(state_of(sr), Some("TASK_STATE_SUBMITTED"), "{sr}");
    let id = task_id(sr);

    wait_for_state(&w.url(), None, &id, "TASK_STATE_WORKING", scaled_secs(5))
        .await
        .unwrap_or_else(|last| panic!("never WORKING, last {last:?}"));
    assert_eq!(
        w.state(None, &id).await.as_deref(),
        Some("TASK_STATE_WORKING")
    );

    let reply = cancel_rpc(&w, None, &id).await;
    assert_eq!(
        reply["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{reply}"
    );
    assert_eq!(
        w.state(None, &id).await.as_deref(),
        Some("TASK_STATE_CANCELED")
    );

    // The open stream sees the cancel and closes.
    let rest = s.rest_json(frame()).await;
    let last = &rest.last().expect("frames after the first")["result"];
    assert_eq!(state_of(last), Some("TASK_STATE_CANCELED"), "{rest:?}");
    assert!(
        rest.iter().all(|f| f["result"]["artifactUpdate"].is_null()),
        "no artifact after cancel: {rest:?}"
    );

    // A second cancel: -32002 (not idempotent).
    let again = cancel_rpc(&w, None, &id).await;
    assert_eq!(again["error"]["code"], -32002, "{again}");

    // It stays canceled: the work loop did not resume.
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(
        w.state(None, &id).await.as_deref(),
        Some("TASK_STATE_CANCELED")
    );
    let stats = w.stats().await;
    assert_eq!(stats["cancels"], 1, "{stats}");
    assert_eq!(stats["tasks_started"], 1, "{stats}");
}

#[tokio::test]
async fn python_selftest_quick_completes() {
    let w = PythonWorker::start().await;
    let mut s = rpc_stream(&w, "quick", &[]).await;
    let frames = s.rest_json(frame()).await;
    let states: Vec<&str> = frames
        .iter()
        .filter_map(|f| state_of(&f["result"]))
        .collect();
    assert_eq!(
        states,
        [
            "TASK_STATE_SUBMITTED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED"
        ],
        "{frames:?}"
    );
    let id = task_id(&frames[0]["result"]);
    assert_eq!(
        w.state(None, &id).await.as_deref(),
        Some("TASK_STATE_COMPLETED")
    );

    // Unary SendMessage waits for the terminal state: {"task": {...}}.
    let reply = post_json(
        &w.url(),
        "/",
        &[],
        &rpc("SendMessage", json!({"message": user_message("whatever")})),
    )
    .await;
    let v = reply.json();
    assert_eq!(
        v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{v}"
    );

    // Without A2A-Version: -32009 over HTTP 200.
    let old = post_json(
        &w.url(),
        "/",
        &[("A2A-Version", "")],
        &rpc("GetTask", json!({"id": id})),
    )
    .await;
    assert_eq!(old.status, 200);
    assert_eq!(old.json()["error"]["code"], -32009, "{}", old.text());
}

#[tokio::test]
async fn python_selftest_ask_is_input_required_and_continues() {
    let w = PythonWorker::start().await;
    let mut s = rpc_stream(&w, "ask", &[]).await;
    // The stream closes by itself after INPUT_REQUIRED.
    let frames = s.rest_json(frame()).await;
    let last = &frames.last().unwrap()["result"];
    assert_eq!(
        state_of(last),
        Some("TASK_STATE_INPUT_REQUIRED"),
        "{frames:?}"
    );
    let id = task_id(last);
    let ctx = last["statusUpdate"]["contextId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        w.state(None, &id).await.as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED")
    );

    // A follow-up on the same task runs again (`quick` completes it); its
    // stream opens with a statusUpdate, not a task frame.
    let mut msg = user_message("quick");
    msg["taskId"] = json!(id);
    msg["contextId"] = json!(ctx);
    let mut s2 = SseStream::open(
        &w.url(),
        "/",
        &[],
        &rpc("SendStreamingMessage", json!({"message": msg})),
    )
    .await;
    let frames2 = s2.rest_json(frame()).await;
    let states: Vec<&str> = frames2
        .iter()
        .filter_map(|f| state_of(&f["result"]))
        .collect();
    assert_eq!(states.last(), Some(&"TASK_STATE_COMPLETED"), "{frames2:?}");
    assert!(
        frames2[0]["result"]["task"].is_null(),
        "continuation opens with: {}",
        frames2[0]
    );
    assert_eq!(
        w.state(None, &id).await.as_deref(),
        Some("TASK_STATE_COMPLETED")
    );
    let stats = w.stats().await;
    assert_eq!(stats["tasks_started"], 1, "{stats}");
    assert_eq!(stats["turns"], 2, "{stats}");

    // Cancelling a parked task also goes through the executor's cancel().
    let mut s3 = rpc_stream(&w, "ask", &[]).await;
    let parked = task_id(&s3.next_json(frame()).await.unwrap()["result"]);
    s3.rest_json(frame()).await;
    let reply = cancel_rpc(&w, None, &parked).await;
    assert_eq!(
        reply["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{reply}"
    );
    assert_eq!(w.stats().await["cancels"], 1);
}

#[tokio::test]
async fn python_selftest_rest_tenant() {
    let w = PythonWorker::start().await;
    let body = json!({"message": user_message("work:3000")});
    let mut s = SseStream::open(&w.url(), "/acme/message:stream", &[], &body).await;
    assert_eq!(s.status, 200);
    // REST frames carry the bare StreamResponse.
    let first = s.next_json(frame()).await.unwrap();
    assert_eq!(state_of(&first), Some("TASK_STATE_SUBMITTED"), "{first}");
    let id = task_id(&first);
    let second = s.next_json(frame()).await.unwrap();
    assert_eq!(state_of(&second), Some("TASK_STATE_WORKING"), "{second}");

    assert_eq!(
        w.state(Some("acme"), &id).await.as_deref(),
        Some("TASK_STATE_WORKING")
    );
    // The SDK's InMemoryTaskStore keys tasks by owner (the authenticated user),
    // not by tenant: any tenant, or none, finds the task.
    assert_eq!(
        w.state(Some("other"), &id).await.as_deref(),
        Some("TASK_STATE_WORKING")
    );
    assert_eq!(
        w.state(None, &id).await.as_deref(),
        Some("TASK_STATE_WORKING")
    );

    let got = http::request("GET", &w.url(), &format!("/acme/tasks/{id}"), &[], b"").await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.header("content-type"), Some("application/a2a+json"));
    assert_eq!(got.json()["status"]["state"], "TASK_STATE_WORKING");

    let cancel = post_json(
        &w.url(),
        &format!("/acme/tasks/{id}:cancel"),
        &[],
        &json!({"tenant": "acme"}),
    )
    .await;
    assert_eq!(cancel.status, 200, "{}", cancel.text());
    assert_eq!(cancel.json()["status"]["state"], "TASK_STATE_CANCELED");
    let rest = s.rest_json(frame()).await;
    assert_eq!(
        state_of(rest.last().unwrap()),
        Some("TASK_STATE_CANCELED"),
        "{rest:?}"
    );
    assert_eq!(
        w.state(Some("acme"), &id).await.as_deref(),
        Some("TASK_STATE_CANCELED")
    );

    // A second REST cancel: 400 TASK_NOT_CANCELABLE.
    let again = post_json(
        &w.url(),
        &format!("/acme/tasks/{id}:cancel"),
        &[],
        &json!({}),
    )
    .await;
    assert_eq!(again.status, 400, "{}", again.text());
    let unknown = http::request("GET", &w.url(), "/acme/tasks/no-such-task", &[], b"").await;
    assert_eq!(unknown.status, 404, "{}", unknown.text());
}

#[tokio::test]
async fn python_selftest_tenant_scoped_store() {
    // With --tenant-scoped the store is keyed by tenant, like the JS SDK.
    let w = PythonWorker::start_with_args(&["--tenant-scoped"]).await;
    let mut s = SseStream::open(
        &w.url(),
        "/acme/message:stream",
        &[],
        &json!({"message": user_message("work:2000")}),
    )
    .await;
    let id = task_id(&s.next_json(frame()).await.unwrap());
    wait_for_state(
        &w.url(),
        Some("acme"),
        &id,
        "TASK_STATE_WORKING",
        scaled_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(w.state(Some("other"), &id).await, None);
    assert_eq!(w.state(None, &id).await, None);
    let wrong = cancel_rpc(&w, None, &id).await;
    assert_eq!(wrong["error"]["code"], -32001, "{wrong}");
    let right = cancel_rpc(&w, Some("acme"), &id).await;
    assert_eq!(
        right["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{right}"
    );
    drop(s);
}

#[tokio::test]
async fn python_selftest_disconnect_does_not_cancel() {
    let w = PythonWorker::start().await;
    for reset in [false, true] {
        let mut s = rpc_stream(&w, "work:1500", &[]).await;
        let id = task_id(&s.next_json(frame()).await.unwrap()["result"]);
        let _ = s.next_json(frame()).await.unwrap();
        if reset {
            s.reset();
        } else {
            drop(s);
        }
        assert_eq!(
            w.state(None, &id).await.as_deref(),
            Some("TASK_STATE_WORKING")
        );
        wait_for_state(&w.url(), None, &id, "TASK_STATE_COMPLETED", scaled_secs(10))
            .await
            .unwrap_or_else(|last| {
                panic!("reset={reset}: the task did not run to completion: {last:?}")
            });
    }
    assert_eq!(w.stats().await["cancels"], 0);
}

#[tokio::test]
async fn python_selftest_spend_metadata_and_extensions() {
    let w = PythonWorker::start_with_args(&[
        "--declare-extension",
        "https://a2a-rust.com/extensions/budget/v1",
    ])
    .await;
    let card = http::request("GET", &w.url(), "/.well-known/agent-card.json", &[], b"").await;
    let card = card.json();
    assert_eq!(
        card["capabilities"]["extensions"][0]["uri"], "https://a2a-rust.com/extensions/budget/v1",
        "{card}"
    );
    assert_eq!(card["supportedInterfaces"][0]["url"], w.url());

    let ext = "https://a2a-rust.com/extensions/budget/v1, urn:x";
    let mut s = rpc_stream(&w, "spend:350:tokens=5", &[("A2A-Extensions", ext)]).await;
    let mut raw = Vec::new();
    while let Some(frame) = s.next_raw_frame(frame()).await {
        raw.push(frame);
    }
    let frames: Vec<Value> = raw
        .iter()
        .map(|f| serde_json::from_str(f.strip_prefix("data: ").unwrap().trim_end()).unwrap())
        .collect();
    let spent: Vec<f64> = frames
        .iter()
        .filter_map(|f| {
            f["result"]["statusUpdate"]["metadata"]["a2a-rust.com/budget"]["spent"]["tokens"]
                .as_f64()
        })
        .collect();
    // WORKING at about 0, 100, 200, 300 ms, then COMPLETED: the k-th status
    // update reports k*5 (as a float: protobuf Struct numbers are doubles).
    assert!(spent.len() >= 3, "{frames:?}");
    for (k, x) in spent.iter().enumerate() {
        assert_eq!(*x, 5.0 * (k + 1) as f64, "{spent:?}");
    }
    assert!(
        raw.iter().any(|f| f.contains(r#"{"tokens": 5.0}"#)),
        "numbers come back as floats, in Python's spaced JSON: {raw:?}"
    );
    assert_eq!(
        state_of(&frames.last().unwrap()["result"]),
        Some("TASK_STATE_COMPLETED")
    );
    assert!(
        frames
            .iter()
            .any(|f| f["result"]["artifactUpdate"]["artifact"].is_object()),
        "work/spend emit an artifact: {frames:?}"
    );
    let stats = w.stats().await;
    assert_eq!(stats["extensions_seen"], json!([ext]), "{stats}");
}
