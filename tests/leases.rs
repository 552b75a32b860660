//! Issue 3: leases enforced at the gateway for workers without a lease store.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, request};
use crate::harness::stream::SseStream;
use crate::harness::worker::{message, task_id_of, Bind, Kind, Worker};

const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";
const CANCELED: &str = "TASK_STATE_CANCELED";

/// A user message carrying a lease grant (metadata + extension URI).
fn leased_message(text: &str, grant: Value) -> Value {
    let mut m = message(text);
    m["metadata"] = json!({ "a2a-rust.com/lease": grant });
    m["extensions"] = json!([LEASE_URI]);
    m
}

async fn tasks_started(worker: &Worker) -> u64 {
    match worker {
        Worker::Rust(w) => w.tasks_started() as u64,
        Worker::Python(w) => w.stats().await["tasks_started"].as_u64().unwrap_or(0),
    }
}

/// Sends a streaming message with `grant` and returns (HTTP status, body).
async fn send_with_grant(url: &str, bind: Bind, grant: Value, pad: usize) -> (u16, Value) {
    let mut msg = leased_message("work:30000", grant);
    if pad > 0 {
        msg["metadata"]["pad"] = json!("x".repeat(pad));
    }
    let headers = [("accept", "text/event-stream")];
    let resp = match bind {
        Bind::JsonRpc => {
            let body = json!({"jsonrpc": "2.0", "id": "r1", "method": "SendStreamingMessage", "params": {"message": msg}});
            post_json(url, "/", &headers, &body).await
        }
        Bind::Rest => post_json(url, "/message:stream", &headers, &json!({ "message": msg })).await,
    };
    (
        resp.status,
        serde_json::from_slice(&resp.body).unwrap_or(Value::Null),
    )
}

/// Grants out of bounds or malformed are refused with InvalidParams (REST:
/// 400) and no task is created on the worker. `pad` makes the body large
/// enough that it is inspected as it streams rather than read up front.
async fn refusals(kind: Kind, bind: Bind, pad: usize) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "max_lease_ttl = \"10s\"").await;
    let table = [
        (
            json!({"ttlMs": 0}),
            "a lease must be between 1000 ms and 10000 ms; this one is 0 ms",
        ),
        (
            json!({"ttlMs": 500}),
            "a lease must be between 1000 ms and 10000 ms; this one is 500 ms",
        ),
        (
            json!({"ttlMs": 10001}),
            "a lease must be between 1000 ms and 10000 ms; this one is 10001 ms",
        ),
        (
            json!({"ttl": 2000}),
            "malformed lease: missing field `ttlMs`",
        ),
        (json!("soon"), "malformed lease: invalid type"),
        (json!({"ttlMs": -3}), "malformed lease: invalid value"),
    ];
    for (grant, want) in table {
        let (status, body) = send_with_grant(&gw.url, bind, grant.clone(), pad).await;
        match bind {
            Bind::JsonRpc => {
                assert_eq!(status, 200, "{grant}: {body}");
                assert_eq!(body["error"]["code"], -32602, "{grant}: {body}");
                assert_eq!(body["id"], "r1");
                let msg = body["error"]["message"].as_str().unwrap_or("");
                assert!(
                    msg.starts_with(want),
                    "{grant}: {msg:?} does not start with {want:?}"
                );
            }
            Bind::Rest => {
                assert_eq!(status, 400, "{grant}: {body}");
                assert_eq!(
                    body["error"]["status"], "INVALID_ARGUMENT",
                    "{grant}: {body}"
                );
                let msg = body["error"]["message"].as_str().unwrap_or("");
                assert!(
                    msg.starts_with(want),
                    "{grant}: {msg:?} does not start with {want:?}"
                );
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        tasks_started(&worker).await,
        0,
        "no refused request created a task"
    );
    // A grant in bounds goes through.
    let (status, _) = send_with_grant(&gw.url, bind, json!({"ttlMs": 2000}), 0).await;
    assert_eq!(status, 200);
    assert_eq!(tasks_started(&worker).await, 1);
    assert!(gw.counter("a2agw_refusals_total", &[]).await >= 6.0);
}

/// Opens a leased stream through the gateway; returns it and the task id.
async fn leased_stream(url: &str, ttl_ms: u64, text: &str) -> (SseStream, String) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": leased_message(text, json!({"ttlMs": ttl_ms}))}});
    let mut s = SseStream::open(url, "/", &[], &body).await;
    assert_eq!(s.status, 200);
    loop {
        let ev = s.next(Duration::from_secs(10)).await.expect("an event");
        if let Some(id) = task_id_of(&ev) {
            return (s, id);
        }
    }
}

async fn get_task(url: &str, id: &str, with_lease: bool) {
    let body = json!({"jsonrpc": "2.0", "id": 5, "method": "GetTask", "params": {"id": id}});
    let headers: &[(&str, &str)] = if with_lease {
        &[("a2a-extensions", LEASE_URI)]
    } else {
        &[]
    };
    let resp = post_json(url, "/", headers, &body).await;
    assert_eq!(resp.status, 200);
}

/// A caller that grants a lease and never renews it loses the child at TTL,
/// even while its stream is open; one that renews (GetTask with the lease
/// extension active) keeps it to completion; plain GetTasks renew nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_lease_lapses_unless_renewed() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;

    // No renewals: canceled within TTL + 1 s.
    let (_open, id) = leased_stream(&gw.url, 1500, "work:30000").await;
    let started = tokio::time::Instant::now();
    worker
        .wait_state(None, &id, CANCELED, Duration::from_millis(1500 + 1000))
        .await
        .unwrap_or_else(|s| panic!("not canceled at lapse ({s:?}); log:\n{}", gw.log_text()));
    assert!(
        started.elapsed() >= Duration::from_millis(1200),
        "not before the TTL"
    );

    // Renewed with the extension active: runs to completion.
    let (mut stream, id) = leased_stream(&gw.url, 1500, "work:3500").await;
    let renewer = {
        let (url, id) = (gw.url.clone(), id.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                get_task(&url, &id, true).await;
            }
        })
    };
    let events = stream.rest(Duration::from_secs(10)).await;
    renewer.abort();
    assert_eq!(
        events
            .last()
            .and_then(crate::harness::worker::state_of)
            .as_deref(),
        Some("TASK_STATE_COMPLETED")
    );
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_COMPLETED")
    );

    // Plain GetTasks renew nothing: the gap over a client that forgot the header.
    let (_open, id) = leased_stream(&gw.url, 1500, "work:30000").await;
    let plain = {
        let (url, id) = (gw.url.clone(), id.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(400)).await;
                get_task(&url, &id, false).await;
            }
        })
    };
    worker
        .wait_state(None, &id, CANCELED, Duration::from_millis(1500 + 1000))
        .await
        .expect("plain GetTask does not renew");
    plain.abort();
    assert_eq!(worker.cancels().await, 2, "one cancel per lapsed child");
    assert!(
        gw.counter("a2agw_lease_renewals_total", &["outcome=\"renewed\""])
            .await
            >= 3.0
    );
    assert_eq!(gw.counter("a2agw_leases_lapsed_total", &[]).await, 2.0);
    let card = request("GET", &gw.url, "/.well-known/agent-card.json", &[], b"").await;
    assert_eq!(card.status, 200);
}

macro_rules! scenarios {
    ($($name:ident => $body:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $body.await
            }
        )*
    };
}

scenarios! {
    rust_jsonrpc_refusals => refusals(Kind::Rust, Bind::JsonRpc, 0);
    rust_rest_refusals => refusals(Kind::Rust, Bind::Rest, 0);
    python_jsonrpc_refusals => refusals(Kind::Python, Bind::JsonRpc, 0);
    python_rest_refusals => refusals(Kind::Python, Bind::Rest, 0);
    rust_jsonrpc_refusals_large_body => refusals(Kind::Rust, Bind::JsonRpc, 100 * 1024);
    python_rest_refusals_large_body => refusals(Kind::Python, Bind::Rest, 100 * 1024);
}
