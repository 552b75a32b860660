//! Callers that leave at once: each writes a whole `SendStreamingMessage`
//! and closes (FIN) or resets (RST) its connection straight away, before
//! any event. Every task the worker started is cancelled all the same
//! (issue: "No orphan in any call shape", item 2): a FIN is waited out
//! (the worker's stream is read until an event names the task), a reset
//! ends the exchange, and the task is then found by its message
//! (`ListTasks`).

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::harness::gateway::Gateway;
use crate::harness::http::{leave, list_tasks, split_url};
use crate::harness::worker::{message, Bind, Kind, Worker};
use crate::harness::{scaled_ms, scaled_secs, scenarios};

const CANCELED: &str = "TASK_STATE_CANCELED";

/// Writes one whole send of `text` (a streaming one, or a blocking one,
/// which the gateway carries as a stream) and leaves `after` it.
async fn send_and_go(
    gw: &str,
    bind: Bind,
    blocking: bool,
    text: &str,
    reset: bool,
    after: Duration,
) {
    let (authority, _) = split_url(gw);
    let msg = message(text);
    let (method, rest_path) = if blocking {
        ("SendMessage", "/message:send")
    } else {
        ("SendStreamingMessage", "/message:stream")
    };
    let (path, body) = match bind {
        Bind::JsonRpc => (
            "/",
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": msg}}),
        ),
        Bind::Rest => (rest_path, json!({ "message": msg })),
    };
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\naccept: text/event-stream\r\na2a-version: 1.0\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut sock = TcpStream::connect(&authority).await.unwrap();
    sock.write_all(req.as_bytes()).await.unwrap();
    if !after.is_zero() {
        tokio::time::sleep(after).await;
    }
    leave(sock, reset).await;
}

/// 20 callers leave with a FIN and 20 with an RST, all at once (each
/// within 0 to 45 ms of writing its request, so that some leave before the
/// gateway forwarded it and some after): within 3 s every task the worker
/// started is CANCELED, and stays the only thing it holds. The Python
/// worker sends its first event only 300 ms after the task started
/// (`late:300:`), so every caller leaves before any event.
async fn forty_leave_at_once(kind: Kind, bind: Bind, blocking: bool) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let text = match kind {
        Kind::Python => "late:300:work:30000",
        Kind::Rust => "work:30000",
    };
    let callers: Vec<_> = (0..40u64)
        .map(|i| {
            let url = gw.url.clone();
            let after = Duration::from_millis((i / 2 % 10) * 5);
            tokio::spawn(
                async move { send_and_go(&url, bind, blocking, text, i % 2 == 1, after).await },
            )
        })
        .collect();
    for c in callers {
        c.await.unwrap();
    }
    let left = Instant::now();
    let deadline = left + scaled_secs(3);
    // Judged at the deadline: a request the gateway forwards late (a
    // loaded machine) starts its task late, and is held to the same bound.
    let mut all_canceled_at = None;
    while Instant::now() < deadline {
        let tasks = list_tasks(&worker.url(), None).await;
        let done = !tasks.is_empty() && tasks.iter().all(|(_, s)| s == CANCELED);
        if done && all_canceled_at.is_none() {
            all_canceled_at = Some(left.elapsed());
        } else if !done {
            all_canceled_at = None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tasks = list_tasks(&worker.url(), None).await;
    let running: Vec<_> = tasks.iter().filter(|(_, s)| s != CANCELED).collect();
    assert!(
        running.is_empty(),
        "{} of {} tasks not canceled {:?} after the callers left: {running:?}\ngateway log:\n{}",
        running.len(),
        tasks.len(),
        scaled_secs(3),
        gw.log_text()
    );
    assert!(!tasks.is_empty(), "the worker started no task");
    // Nothing the worker starts later runs on either.
    tokio::time::sleep(scaled_ms(500)).await;
    let later = list_tasks(&worker.url(), None).await;
    assert_eq!(later.len(), tasks.len(), "tasks started after the check");
    assert!(later.iter().all(|(_, s)| s == CANCELED), "{later:?}");
    assert_eq!(
        gw.counter("a2agw_unreachable_children_total", &[]).await,
        0.0
    );
    eprintln!(
        "{kind:?}/{bind:?}/blocking={blocking}: {} tasks started by 40 callers, all canceled {:?} after they left; found by message: {}",
        tasks.len(),
        all_canceled_at,
        gw.counter("a2agw_children_looked_up_total", &["outcome=\"found\""])
            .await
    );
}

scenarios! {
    rust_jsonrpc_forty_leave_at_once => forty_leave_at_once(Kind::Rust, Bind::JsonRpc, false);
    rust_rest_forty_leave_at_once => forty_leave_at_once(Kind::Rust, Bind::Rest, false);
    python_jsonrpc_forty_leave_at_once => forty_leave_at_once(Kind::Python, Bind::JsonRpc, false);
    python_rest_forty_leave_at_once => forty_leave_at_once(Kind::Python, Bind::Rest, false);
    rust_rest_forty_blocking_leave_at_once => forty_leave_at_once(Kind::Rust, Bind::Rest, true);
    python_jsonrpc_forty_blocking_leave_at_once => forty_leave_at_once(Kind::Python, Bind::JsonRpc, true);
}
