//! Self-tests of `harness::rust_worker`: the worker is talked to directly,
//! with no gateway in between, so later tests can trust what it reports.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::net::TcpStream;

use crate::harness::http::{post_json, split_url, wait_for_state};
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::stream::SseStream;
use crate::harness::{scaled_count, scaled_ms, scaled_secs};

const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";

// ── A minimal SSE reader over a raw socket ──────────────────────────────────

// ── Request builders ────────────────────────────────────────────────────────

fn message(text: &str) -> Value {
    json!({
        "messageId": format!("m-{}", std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    })
}

fn rpc(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": "self-1", "method": method, "params": params})
}

/// The StreamResponse inside a JSON-RPC SSE `data` (or a bare REST one).
fn stream_response(data: &Value) -> &Value {
    if data.get("jsonrpc").is_some() {
        assert!(data.get("error").is_none(), "stream error: {data}");
        &data["result"]
    } else {
        data
    }
}

fn task_id_of(data: &Value) -> Option<String> {
    let r = stream_response(data);
    r["task"]["id"]
        .as_str()
        .or_else(|| r["statusUpdate"]["taskId"].as_str())
        .map(str::to_string)
}

fn state_of(data: &Value) -> Option<String> {
    let r = stream_response(data);
    r["statusUpdate"]["status"]["state"]
        .as_str()
        .or_else(|| r["task"]["status"]["state"].as_str())
        .map(str::to_string)
}

/// Opens a JSON-RPC SendStreamingMessage and returns the stream and task id.
async fn stream_jsonrpc(url: &str, params: Value) -> (SseStream, String) {
    let mut s = SseStream::open(url, "/", &[], &rpc("SendStreamingMessage", params)).await;
    assert_eq!(s.status, 200);
    assert!(
        s.content_type().starts_with("text/event-stream"),
        "{}",
        s.content_type()
    );
    let first = s.next(scaled_secs(5)).await.expect("a first event");
    assert_eq!(
        first["id"], "self-1",
        "SSE data echoes the request id: {first}"
    );
    let id = task_id_of(&first).unwrap_or_else(|| panic!("no task id in {first}"));
    (s, id)
}

const WORKING: &str = "TASK_STATE_WORKING";
const COMPLETED: &str = "TASK_STATE_COMPLETED";
const CANCELED: &str = "TASK_STATE_CANCELED";
const INPUT_REQUIRED: &str = "TASK_STATE_INPUT_REQUIRED";

// ── Tests ───────────────────────────────────────────────────────────────────

#[tokio::test]
async fn card_points_at_the_worker_itself() {
    let w = RustWorker::start(RustWorkerOptions {
        lease_store: true,
        websocket: true,
        ..RustWorkerOptions::default()
    })
    .await;
    let card =
        crate::harness::http::request("GET", &w.url(), "/.well-known/agent-card.json", &[], b"")
            .await
            .json();
    let urls: Vec<(String, String)> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["protocolBinding"].as_str().unwrap().to_string(),
                i["url"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let ws = w.ws_url().expect("ws url");
    assert_eq!(
        urls,
        vec![
            ("JSONRPC".to_string(), w.url()),
            ("HTTP+JSON".to_string(), w.url()),
            ("https://a2a-rust.com/bindings/websocket/v1".to_string(), ws),
        ]
    );
    let exts: Vec<&str> = card["capabilities"]["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["uri"].as_str().unwrap())
        .collect();
    assert!(exts.contains(&LEASE_URI), "{exts:?}");
    assert_eq!(card["capabilities"]["streaming"], true);

    let plain = RustWorker::start(RustWorkerOptions::default()).await;
    assert!(plain.ws_url().is_none());
    let card = crate::harness::http::request(
        "GET",
        &plain.url(),
        "/.well-known/agent-card.json",
        &[],
        b"",
    )
    .await
    .json();
    assert!(
        !card["capabilities"]["extensions"]
            .to_string()
            .contains(LEASE_URI),
        "no lease store, no lease extension: {card}"
    );
}

#[tokio::test]
async fn work_is_working_then_cancel_task_cancels_it_once() {
    let w = RustWorker::start(RustWorkerOptions::default()).await;
    let (mut s, id) = stream_jsonrpc(&w.url(), json!({"message": message("work:3000")})).await;
    wait_for_state(&w.url(), None, &id, WORKING, scaled_secs(2))
        .await
        .expect("WORKING");
    assert_eq!(w.state(None, &id).await.as_deref(), Some(WORKING));
    assert_eq!(w.tasks_started(), 1);
    assert_eq!(w.cancels(), 0);

    let t0 = tokio::time::Instant::now();
    let resp = post_json(&w.url(), "/", &[], &rpc("CancelTask", json!({"id": id}))).await;
    let v = resp.json();
    assert_eq!(v["result"]["status"]["state"], CANCELED, "{v}");
    assert_eq!(w.state(None, &id).await.as_deref(), Some(CANCELED));
    assert_eq!(w.cancels(), 1);

    // The open stream ends with CANCELED, promptly.
    let rest = s.rest(scaled_secs(3)).await;
    assert!(
        t0.elapsed() < scaled_secs(2),
        "stream ended late: {:?}",
        t0.elapsed()
    );
    let last = rest.last().expect("events after the cancel");
    assert_eq!(state_of(last).as_deref(), Some(CANCELED), "{rest:?}");

    // A second CancelTask is refused (-32002) and does not reach the hook.
    let v = post_json(&w.url(), "/", &[], &rpc("CancelTask", json!({"id": id})))
        .await
        .json();
    assert_eq!(v["error"]["code"], -32002, "{v}");
    assert_eq!(w.cancels(), 1);
    // And the executor stopped: still CANCELED well after.
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(w.state(None, &id).await.as_deref(), Some(CANCELED));
    assert_eq!(w.lease_stops(), 0);
}

#[tokio::test]
async fn work_runs_to_completion_with_progress_and_an_artifact() {
    let w = RustWorker::start(RustWorkerOptions::default()).await;
    let t0 = tokio::time::Instant::now();
    let (mut s, id) = stream_jsonrpc(&w.url(), json!({"message": message("work:500")})).await;
    let rest = s.rest(scaled_secs(5)).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < scaled_secs(3),
        "{took:?}"
    );
    let working = rest
        .iter()
        .filter(|e| state_of(e).as_deref() == Some(WORKING))
        .count();
    assert!(
        working >= 3,
        "a WORKING update about every 100 ms: {rest:?}"
    );
    assert!(
        rest.iter()
            .any(|e| !stream_response(e)["artifactUpdate"].is_null()),
        "an artifact: {rest:?}"
    );
    assert_eq!(state_of(rest.last().unwrap()).as_deref(), Some(COMPLETED));
    assert_eq!(w.state(None, &id).await.as_deref(), Some(COMPLETED));
    assert_eq!(w.cancels(), 0);
}

#[tokio::test]
async fn quick_completes_and_anything_else_too() {
    let w = RustWorker::start(RustWorkerOptions::default()).await;
    for text in ["quick", "hello there"] {
        let (mut s, id) = stream_jsonrpc(&w.url(), json!({"message": message(text)})).await;
        let rest = s.rest(scaled_secs(5)).await;
        assert_eq!(
            state_of(rest.last().unwrap()).as_deref(),
            Some(COMPLETED),
            "{rest:?}"
        );
        assert_eq!(w.state(None, &id).await.as_deref(), Some(COMPLETED));
    }
    assert_eq!(w.tasks_started(), 2);
    // Unknown tasks read as None.
    assert_eq!(w.state(None, "no-such-task").await, None);
}

#[tokio::test]
async fn ask_parks_in_input_required_and_a_continuation_completes_it() {
    let w = RustWorker::start(RustWorkerOptions::default()).await;
    let (mut s, id) = stream_jsonrpc(&w.url(), json!({"message": message("ask")})).await;
    // The stream closes by itself at INPUT_REQUIRED.
    let rest = s.rest(scaled_secs(5)).await;
    assert_eq!(
        state_of(rest.last().unwrap()).as_deref(),
        Some(INPUT_REQUIRED),
        "{rest:?}"
    );
    assert_eq!(w.state(None, &id).await.as_deref(), Some(INPUT_REQUIRED));
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(w.state(None, &id).await.as_deref(), Some(INPUT_REQUIRED));

    let mut cont = message("quick");
    cont["taskId"] = json!(id);
    let (mut s, id2) = stream_jsonrpc(&w.url(), json!({"message": cont})).await;
    assert_eq!(id2, id);
    let rest = s.rest(scaled_secs(5)).await;
    assert_eq!(
        state_of(rest.last().unwrap()).as_deref(),
        Some(COMPLETED),
        "{rest:?}"
    );
    assert_eq!(w.state(None, &id).await.as_deref(), Some(COMPLETED));
    assert_eq!(w.tasks_started(), 1, "a continuation creates no task");
    assert_eq!(w.executions(), 2);
    assert_eq!(w.cancels(), 0);
}

#[tokio::test]
async fn rest_stream_under_a_tenant_prefix() {
    let w = RustWorker::start(RustWorkerOptions::default()).await;
    let mut s = SseStream::open(
        &w.url(),
        "/acme/message:stream",
        &[],
        &json!({"message": message("work:1000")}),
    )
    .await;
    assert_eq!(s.status, 200);
    assert!(
        s.content_type().starts_with("text/event-stream"),
        "{}",
        s.content_type()
    );
    let first = s.next(scaled_secs(5)).await.expect("first event");
    assert!(
        first.get("jsonrpc").is_none(),
        "REST data is a bare StreamResponse: {first}"
    );
    let id = task_id_of(&first).expect("task id");
    wait_for_state(&w.url(), Some("acme"), &id, WORKING, scaled_secs(2))
        .await
        .expect("WORKING in tenant acme");
    // Tenants are isolated: the default tenant does not know the task.
    assert_eq!(w.state(None, &id).await, None);
    assert_eq!(w.state(Some("other"), &id).await, None);

    // Cancel in the tenant over REST.
    let resp = post_json(
        &w.url(),
        &format!("/acme/tasks/{id}:cancel"),
        &[],
        &json!({"tenant": "acme"}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["status"]["state"], CANCELED);
    assert_eq!(w.state(Some("acme"), &id).await.as_deref(), Some(CANCELED));
    assert_eq!(w.cancels(), 1);
    let rest = s.rest(scaled_secs(3)).await;
    assert_eq!(state_of(rest.last().unwrap()).as_deref(), Some(CANCELED));
}

#[tokio::test]
async fn lease_lapse_stops_the_task_without_a_cancel_task() {
    let w = RustWorker::start(RustWorkerOptions {
        lease_store: true,
        websocket: false,
        ..RustWorkerOptions::default()
    })
    .await;
    let mut msg = message("work:10000");
    msg["metadata"] = json!({"a2a-rust.com/lease": {"ttlMs": 1000}});
    msg["extensions"] = json!([LEASE_URI]);
    let t0 = tokio::time::Instant::now();
    let (mut s, id) = stream_jsonrpc(&w.url(), json!({"message": msg})).await;

    // One renewal over HTTP: recorded with its method.
    let renew = json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}});
    let v = post_json(&w.url(), "/", &[("a2a-extensions", LEASE_URI)], &renew)
        .await
        .json();
    assert!(v["result"]["status"]["state"].is_string(), "{v}");
    assert!(w.upgrade_extensions().contains(&LEASE_URI.to_string()));
    assert!(w
        .extension_calls()
        .contains(&("GetTask".to_string(), LEASE_URI.to_string())));

    let rest = s.rest(scaled_secs(6)).await;
    let took = t0.elapsed();
    assert_eq!(
        state_of(rest.last().unwrap()).as_deref(),
        Some(CANCELED),
        "{rest:?}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(1) + scaled_secs(3),
        "stopped {took:?} after start"
    );
    assert_eq!(w.state(None, &id).await.as_deref(), Some(CANCELED));
    assert_eq!(w.cancels(), 0, "no CancelTask reached the worker");
    assert_eq!(w.lease_stops(), 1);
}

#[tokio::test]
async fn websocket_stream_and_upgrade_extensions() {
    use a2a_protocol_client::transport::websocket::{WebSocketTransport, WebSocketTransportConfig};
    use a2a_protocol_client::ClientBuilder;
    use a2a_protocol_types::{
        Message, MessageRole, MessageSendParams, Part, StreamResponse, TaskState,
    };

    let w = RustWorker::start(RustWorkerOptions {
        lease_store: true,
        websocket: true,
        ..RustWorkerOptions::default()
    })
    .await;
    let ws = w.ws_url().unwrap();
    assert!(
        ws.starts_with("ws://127.0.0.1:") && ws.ends_with("/ws"),
        "{ws}"
    );
    let transport = WebSocketTransport::connect_with_config(
        ws.clone(),
        WebSocketTransportConfig::default().with_extensions([LEASE_URI]),
    )
    .await
    .expect("ws connect");
    let client = ClientBuilder::new(ws)
        .with_custom_transport(transport)
        .build()
        .expect("client");
    let msg = Message::new("ws-m1", MessageRole::User, vec![Part::text("quick")]);
    let mut stream = client
        .stream_message(MessageSendParams::new(msg))
        .await
        .expect("stream");
    let mut last = None;
    let mut id = None;
    while let Some(ev) = tokio::time::timeout(scaled_secs(5), stream.next())
        .await
        .expect("ws event in time")
    {
        match ev.expect("event") {
            StreamResponse::Task(t) => {
                id.get_or_insert(t.id.to_string());
                last = Some(t.status.state);
            }
            StreamResponse::StatusUpdate(u) => {
                id.get_or_insert(u.task_id.to_string());
                last = Some(u.status.state);
            }
            _ => {}
        }
    }
    assert_eq!(last, Some(TaskState::Completed));
    let id = id.unwrap();
    assert_eq!(w.state(None, &id).await.as_deref(), Some(COMPLETED));
    assert_eq!(w.upgrade_extensions(), vec![LEASE_URI.to_string()]);
    assert!(w
        .extension_calls()
        .iter()
        .any(|(m, v)| m == "SendStreamingMessage" && v == LEASE_URI));

    // CancelTask over the same socket reaches the cancel hook once.
    let msg = Message::new("ws-m2", MessageRole::User, vec![Part::text("work:5000")]);
    let mut stream = client
        .stream_message(MessageSendParams::new(msg))
        .await
        .expect("stream");
    let id = match stream.next().await.expect("first event").expect("event") {
        StreamResponse::Task(t) => t.id.to_string(),
        other => panic!("first event is not a task: {other:?}"),
    };
    wait_for_state(&w.url(), None, &id, WORKING, scaled_secs(2))
        .await
        .expect("WORKING");
    let task = client
        .cancel_task(id.clone())
        .await
        .expect("cancel over ws");
    assert_eq!(task.status.state, TaskState::Canceled);
    assert_eq!(w.cancels(), 1);
    assert_eq!(w.state(None, &id).await.as_deref(), Some(CANCELED));
}

#[tokio::test]
async fn dropping_the_worker_stops_accepting() {
    let w = RustWorker::start(RustWorkerOptions {
        lease_store: false,
        websocket: true,
        ..RustWorkerOptions::default()
    })
    .await;
    let (http, _) = split_url(&w.url());
    let ws = w.ws_url().unwrap();
    let ws = ws
        .trim_start_matches("ws://")
        .trim_end_matches("/ws")
        .to_string();
    assert!(TcpStream::connect(&http).await.is_ok());
    drop(w);
    for addr in [http, ws] {
        let mut refused = false;
        for _ in 0..scaled_count(40) {
            if TcpStream::connect(&addr).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(refused, "{addr} still accepts after drop");
    }
}
