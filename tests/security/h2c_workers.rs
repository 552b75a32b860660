//! The premise of the gRPC-typed send attack (issue 43, item 1), shown on
//! the workers alone, no gateway: which real worker runs an A2A send that
//! arrives over HTTP/2 with prior knowledge (h2c) typed
//! `application/grpc` or `application/grpc+json` with a JSON body, as a
//! gateway that forwards every gRPC-typed request unread to an `http://`
//! worker over HTTP/2 would deliver it.
//!
//! * The Python `a2a-sdk` 1.3.0 worker served by Hypercorn
//!   (`PythonWorker::start_h2c`) runs it: Hypercorn speaks h2c on its one
//!   port and neither it nor the SDK's routes look at `Content-Type`. A
//!   REST `POST /message:send` (and `/message:stream`) and a JSON-RPC
//!   `SendMessage` at `POST /`, each under both types, start a task; the
//!   worker's own `GetTask`, `ListTasks` and counters show it, and a budget
//!   grant of 1,000,000 tokens in the message reaches the executor as sent.
//! * The same agent under uvicorn (every other `PythonWorker` constructor)
//!   speaks no HTTP/2: an h2c request gets no answer.
//! * The a2a-rust 0.15 worker (`RustWorker`, its JSON-RPC/REST listener)
//!   speaks h2c (hyper's auto mode) and runs a JSON-typed send over it, but
//!   refuses both gRPC types before the handler: REST with 400
//!   `ContentTypeNotSupported`, JSON-RPC with error -32005, no task.

use serde_json::{json, Value};

use crate::harness::h2c::{self, jsonrpc_send, post_typed, rest_send, H2Response, GRPC, GRPC_JSON};
use crate::harness::http::{list_task_ids, post_json};
use crate::harness::python_worker::{PythonWorker, SeenRequest};
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::worker::task_id_of;

const BUDGET_KEY: &str = "a2a-rust.com/budget";
const COMPLETED: &str = "TASK_STATE_COMPLETED";

/// The grant a caller writes for itself: far over any route's cap.
fn huge_grant() -> Value {
    json!({"meters": {"tokens": 1_000_000}})
}

/// The message the worker stored as the task's first history entry (its
/// JSON-RPC `GetTask`, over HTTP/1.1, straight to the worker).
async fn stored_message(url: &str, id: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": "h", "method": "GetTask",
        "params": {"id": id, "historyLength": 10}});
    let v = post_json(url, "/", &[], &body).await.json();
    assert_eq!(v["result"]["status"]["state"], COMPLETED, "{v}");
    v["result"]["history"][0].clone()
}

/// The tokens of a grant as the worker read it (the Python SDK's protobuf
/// `Struct` turns integers into floats).
fn tokens(grant: &Value) -> Option<f64> {
    grant["meters"]["tokens"].as_f64()
}

/// The task a send's answer names (REST `{"task": …}`, JSON-RPC
/// `{"result": {"task": …}}`), checking the answer is a success.
fn started_task(resp: &H2Response, what: &str) -> String {
    assert_eq!(resp.status, 200, "{what}: {resp:?}");
    let v = resp.json();
    assert!(v.get("error").is_none(), "{what}: {v}");
    task_id_of(&v).unwrap_or_else(|| panic!("{what}: no task in {v}"))
}

fn seen(path: &str, content_type: &str) -> SeenRequest {
    SeenRequest {
        http_version: "2".into(),
        method: "POST".into(),
        path: path.into(),
        content_type: Some(content_type.into()),
        traceparent: None,
        tracestate: None,
    }
}

/// What the worker saw, without the trace headers (a send through the
/// gateway carries its delegation reference).
async fn requests_seen(w: &PythonWorker) -> Vec<SeenRequest> {
    w.requests_seen()
        .await
        .into_iter()
        .map(|r| SeenRequest {
            traceparent: None,
            tracestate: None,
            ..r
        })
        .collect()
}

/// Hypercorn-served Python worker: a REST `POST /message:send` over h2c
/// typed `application/grpc` (then `application/grpc+json`) with a JSON
/// body and a 1,000,000-token grant starts a task, which completes; the
/// worker's GetTask shows the grant in the stored message, its executor
/// recorded it, its ListTasks lists the task, and it saw the request as
/// HTTP/2 with the gRPC type. A gRPC-typed `POST /message:stream` streams
/// SSE back over the same kind of connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hypercorn_python_runs_grpc_typed_rest_sends() {
    let w = PythonWorker::start_h2c(&[]).await;
    let mut ids = Vec::new();
    for ct in [GRPC, GRPC_JSON] {
        let resp = post_typed(
            &w.url(),
            "/message:send",
            ct,
            &[],
            &rest_send("quick", Some(huge_grant())),
        )
        .await;
        let id = started_task(&resp, ct);
        let stored = stored_message(&w.url(), &id).await;
        assert_eq!(
            tokens(&stored["metadata"][BUDGET_KEY]),
            Some(1_000_000.0),
            "{ct}: the grant as stored: {stored}"
        );
        ids.push(id);
    }
    assert_eq!(w.stats().await["tasks_started"], 2);
    let grants = w.budgets_seen().await;
    assert_eq!(grants.len(), 2, "{grants:?}");
    assert!(
        grants.iter().all(|g| tokens(g) == Some(1_000_000.0)),
        "{grants:?}"
    );
    let listed = list_task_ids(&w.url()).await;
    assert!(ids.iter().all(|id| listed.contains(id)), "{listed:?}");
    let requests = requests_seen(&w).await;
    for ct in [GRPC, GRPC_JSON] {
        assert!(
            requests.contains(&seen("/message:send", ct)),
            "{ct}: {requests:?}"
        );
    }

    let stream = post_typed(
        &w.url(),
        "/message:stream",
        GRPC,
        &[],
        &rest_send("quick", Some(huge_grant())),
    )
    .await;
    assert_eq!(stream.status, 200, "{stream:?}");
    assert!(
        stream
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{stream:?}"
    );
    assert!(stream.text().contains(COMPLETED), "{}", stream.text());
    assert_eq!(w.stats().await["tasks_started"], 3);
    assert_eq!(w.budgets_seen().await.len(), 3);
}

/// Hypercorn-served Python worker: a JSON-RPC `SendMessage` at `POST /`
/// over h2c typed `application/grpc+json` (then `application/grpc`) with a
/// 1,000,000-token grant starts a task, as the REST send does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hypercorn_python_runs_grpc_typed_jsonrpc_sends() {
    let w = PythonWorker::start_h2c(&[]).await;
    let mut ids = Vec::new();
    for ct in [GRPC_JSON, GRPC] {
        let resp = post_typed(
            &w.url(),
            "/",
            ct,
            &[],
            &jsonrpc_send("quick", Some(huge_grant())),
        )
        .await;
        let id = started_task(&resp, ct);
        let stored = stored_message(&w.url(), &id).await;
        assert_eq!(
            tokens(&stored["metadata"][BUDGET_KEY]),
            Some(1_000_000.0),
            "{ct}: the grant as stored: {stored}"
        );
        ids.push(id);
    }
    assert_eq!(w.stats().await["tasks_started"], 2);
    let grants = w.budgets_seen().await;
    assert_eq!(grants.len(), 2, "{grants:?}");
    assert!(
        grants.iter().all(|g| tokens(g) == Some(1_000_000.0)),
        "{grants:?}"
    );
    let listed = list_task_ids(&w.url()).await;
    assert!(ids.iter().all(|id| listed.contains(id)), "{listed:?}");
    let requests = requests_seen(&w).await;
    for ct in [GRPC_JSON, GRPC] {
        assert!(requests.contains(&seen("/", ct)), "{ct}: {requests:?}");
    }
}

/// The Python worker under uvicorn (`PythonWorker::start`, what every other
/// test runs) speaks no HTTP/2: a gRPC-typed send over h2c gets no answer
/// and starts nothing. Only `start_h2c` makes the Python worker a target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uvicorn_python_answers_no_h2c() {
    let w = PythonWorker::start().await;
    let body = rest_send("quick", Some(huge_grant())).to_string();
    let got = h2c::try_request(
        &w.url(),
        "POST",
        "/message:send",
        &[("content-type", GRPC), ("a2a-version", "1.0")],
        body.as_bytes(),
    )
    .await;
    assert!(got.is_err(), "uvicorn answered h2c: {got:?}");
    assert_eq!(w.stats().await["tasks_started"], 0);
}

/// The a2a-rust 0.15 worker's JSON-RPC/REST listener speaks h2c (its card
/// and a JSON-typed send are answered over it) but refuses gRPC-typed
/// sends, REST with 400 and JSON-RPC with -32005 (content type not
/// supported), before any task: it is no target for the attack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_worker_refuses_grpc_typed_sends_over_h2c() {
    let w = RustWorker::start(RustWorkerOptions::default()).await;

    let card = h2c::request(
        &w.url(),
        "GET",
        "/.well-known/agent-card.json",
        &[("a2a-version", "1.0")],
        b"",
    )
    .await;
    assert_eq!(card.status, 200, "{card:?}");
    let plain = post_typed(
        &w.url(),
        "/message:send",
        "application/json",
        &[],
        &rest_send("quick", Some(huge_grant())),
    )
    .await;
    started_task(&plain, "application/json over h2c");
    assert_eq!(w.tasks_started(), 1);

    for ct in [GRPC, GRPC_JSON] {
        let rest = post_typed(
            &w.url(),
            "/message:send",
            ct,
            &[],
            &rest_send("quick", Some(huge_grant())),
        )
        .await;
        assert_eq!(rest.status, 400, "REST {ct}: {rest:?}");
        assert!(
            rest.text().contains("CONTENT_TYPE_NOT_SUPPORTED"),
            "REST {ct}: {rest:?}"
        );
        let rpc = post_typed(
            &w.url(),
            "/",
            ct,
            &[],
            &jsonrpc_send("quick", Some(huge_grant())),
        )
        .await;
        let v = rpc.json();
        assert_eq!(v["error"]["code"], -32005, "JSON-RPC {ct}: {v}");
        assert_eq!(
            v["error"]["data"][0]["reason"], "CONTENT_TYPE_NOT_SUPPORTED",
            "JSON-RPC {ct}: {v}"
        );
    }
    assert_eq!(w.tasks_started(), 1, "a gRPC-typed send started a task");
}
