//! Issue 2: a caller that goes away no longer leaves its child running.
//!
//! Each scenario runs against both real workers (a2a-rust 0.15 without a
//! lease store, Python a2a-sdk 1.3.0) over both bindings (JSON-RPC, REST),
//! and reads the outcome from the worker itself.

use std::time::Duration;

use serde_json::json;

use crate::harness::gateway::Gateway;
use crate::harness::http::{list_task_ids, send_and_leave};
use crate::harness::stream::SseStream;
use crate::harness::worker::{send_stream, state_of, subscribe, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs, scenarios};

const CANCELED: &str = "TASK_STATE_CANCELED";
const WORKING: &str = "TASK_STATE_WORKING";
const LONG: &str = "work:30000";

/// The caller closes (FIN) or resets (RST) mid-task: the worker's task is
/// canceled within 1 s, exactly once.
async fn caller_leaves(kind: Kind, bind: Bind, tenant: Option<&str>, reset: bool) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (stream, id) = send_stream(&gw.url, bind, tenant, LONG).await;
    worker
        .wait_state(tenant, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    if reset {
        stream.reset();
    } else {
        stream.close();
    }
    let took = worker
        .wait_state(tenant, &id, CANCELED, scaled_secs(1))
        .await
        .unwrap_or_else(|last| {
            panic!(
                "not canceled within {:?} (state {last:?}); gateway log:\n{}",
                scaled_secs(1),
                gw.log_text()
            )
        });
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    eprintln!("{kind:?}/{bind:?}: canceled {took:?} after the caller left");
    // The worker reports CANCELED before its answer to the CancelTask has
    // reached the gateway, which counts the outcome then.
    let outcome = ["outcome=\"canceled\""];
    let mut counted = 0.0;
    for _ in 0..scaled_count(100) {
        counted = gw.counter("a2agw_cancels_total", &outcome).await;
        if counted > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counted, 1.0);
}

/// A task that completes while its caller watches gets no cancel.
async fn completed_task(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (mut stream, id) = send_stream(&gw.url, bind, None, "work:300").await;
    let events = stream.rest(scaled_secs(10)).await;
    assert_eq!(
        events.last().and_then(state_of).as_deref(),
        Some("TASK_STATE_COMPLETED")
    );
    stream.close();
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_COMPLETED")
    );
    assert_eq!(worker.cancels().await, 0);
    assert_eq!(gw.counter("a2agw_cancel_attempts_total", &[]).await, 0.0);
    assert!(
        gw.counter("a2agw_cascade_decisions_total", &["keep_settled"])
            .await
            >= 1.0
    );
}

/// A task handed back (input-required) whose caller leaves gets no cancel.
async fn input_required(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (mut stream, id) = send_stream(&gw.url, bind, None, "ask").await;
    let mut last = None;
    while let Some(ev) = stream.next(scaled_secs(10)).await {
        if let Some(s) = state_of(&ev) {
            last = Some(s.clone());
            if s == "TASK_STATE_INPUT_REQUIRED" {
                break;
            }
        }
    }
    assert_eq!(last.as_deref(), Some("TASK_STATE_INPUT_REQUIRED"));
    stream.close();
    tokio::time::sleep(scaled_ms(700)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED")
    );
    assert_eq!(worker.cancels().await, 0);
}

/// With `cascade = "detach"` the child runs on.
async fn detach(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "cascade = \"detach\"").await;
    let (stream, id) = send_stream(&gw.url, bind, None, LONG).await;
    stream.close();
    tokio::time::sleep(scaled_ms(1200)).await;
    assert_eq!(worker.state(None, &id).await.as_deref(), Some(WORKING));
    assert_eq!(worker.cancels().await, 0);
    assert!(
        gw.counter("a2agw_cascade_decisions_total", &["keep_detached"])
            .await
            >= 1.0
    );
}

/// With a grace, a resubscribe inside it keeps the child alive; when that
/// caller leaves too, the child is canceled after another grace.
async fn grace_resubscribe(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "disconnect_grace = \"1500ms\"").await;
    let (stream, id) = send_stream(&gw.url, bind, None, LONG).await;
    stream.close();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut again = subscribe(&gw.url, bind, None, &id).await;
    assert_eq!(again.status, 200);
    again
        .next(scaled_secs(5))
        .await
        .expect("the resubscribed stream flows");
    // The first caller's grace runs out while the resubscriber watches.
    tokio::time::sleep(Duration::from_millis(1500) + scaled_ms(500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some(WORKING),
        "kept alive by the resubscribe"
    );
    assert_eq!(worker.cancels().await, 0);
    again.close();
    worker
        .wait_state(
            None,
            &id,
            CANCELED,
            Duration::from_millis(1500) + scaled_ms(1000),
        )
        .await
        .unwrap_or_else(|last| {
            panic!(
                "not canceled after the second grace (state {last:?}); log:\n{}",
                gw.log_text()
            )
        });
    assert_eq!(worker.cancels().await, 1);
}

/// The caller sends its request and leaves (FIN) before reading a byte, so
/// no event named the task while it was there: the gateway keeps reading the
/// worker's stream (up to `id_wait`) to learn the id, then cancels. (A
/// caller that resets instead ends the exchange before any id is known:
/// another call shape, see `send_and_leave`.)
async fn caller_leaves_before_first_event(kind: Kind, bind: Bind, text: &str, after: Duration) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let msg = crate::harness::worker::message(text);
    let (path, body) = match bind {
        Bind::JsonRpc => (
            "/",
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": msg}}),
        ),
        Bind::Rest => ("/message:stream", json!({"message": msg})),
    };
    let headers = [
        ("content-type", "application/json"),
        ("accept", "text/event-stream"),
    ];
    send_and_leave(&gw.url, path, &headers, body.to_string().as_bytes(), after).await;
    let mut ids = Vec::new();
    for _ in 0..scaled_count(300) {
        ids = list_task_ids(&worker.url()).await;
        if !ids.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ids.len(), 1, "the worker started the task");
    worker
        .wait_state(None, &ids[0], CANCELED, scaled_secs(2))
        .await
        .unwrap_or_else(|last| panic!("not canceled (state {last:?}); log:\n{}", gw.log_text()));
    assert_eq!(worker.cancels().await, 1);
    assert_eq!(
        gw.counter("a2agw_unreachable_children_total", &[]).await,
        0.0
    );
}

/// Without the gateway the child keeps running: the gap the gateway closes.
async fn gap_without_gateway(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let (stream, id) = send_stream(&worker.url(), bind, None, LONG).await;
    stream.close();
    tokio::time::sleep(scaled_ms(1500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some(WORKING),
        "the orphan runs on"
    );
    assert_eq!(worker.cancels().await, 0);
}

scenarios! {
    rust_jsonrpc_caller_close_cancels => caller_leaves(Kind::Rust, Bind::JsonRpc, None, false);
    rust_rest_caller_close_cancels => caller_leaves(Kind::Rust, Bind::Rest, None, false);
    rust_jsonrpc_caller_reset_cancels => caller_leaves(Kind::Rust, Bind::JsonRpc, None, true);
    rust_jsonrpc_tenant_cancel => caller_leaves(Kind::Rust, Bind::JsonRpc, Some("acme"), false);
    rust_rest_tenant_cancel => caller_leaves(Kind::Rust, Bind::Rest, Some("acme"), false);
    python_jsonrpc_caller_close_cancels => caller_leaves(Kind::Python, Bind::JsonRpc, None, false);
    python_rest_caller_close_cancels => caller_leaves(Kind::Python, Bind::Rest, None, false);
    python_rest_caller_reset_cancels => caller_leaves(Kind::Python, Bind::Rest, None, true);
    python_jsonrpc_tenant_cancel => caller_leaves(Kind::Python, Bind::JsonRpc, Some("acme"), false);
    python_rest_tenant_cancel => caller_leaves(Kind::Python, Bind::Rest, Some("acme"), false);

    rust_jsonrpc_completed_no_cancel => completed_task(Kind::Rust, Bind::JsonRpc);
    rust_rest_completed_no_cancel => completed_task(Kind::Rust, Bind::Rest);
    python_jsonrpc_completed_no_cancel => completed_task(Kind::Python, Bind::JsonRpc);
    python_rest_completed_no_cancel => completed_task(Kind::Python, Bind::Rest);

    rust_jsonrpc_input_required_no_cancel => input_required(Kind::Rust, Bind::JsonRpc);
    rust_rest_input_required_no_cancel => input_required(Kind::Rust, Bind::Rest);
    python_jsonrpc_input_required_no_cancel => input_required(Kind::Python, Bind::JsonRpc);
    python_rest_input_required_no_cancel => input_required(Kind::Python, Bind::Rest);

    rust_jsonrpc_detach => detach(Kind::Rust, Bind::JsonRpc);
    rust_rest_detach => detach(Kind::Rust, Bind::Rest);
    python_jsonrpc_detach => detach(Kind::Python, Bind::JsonRpc);
    python_rest_detach => detach(Kind::Python, Bind::Rest);

    rust_jsonrpc_grace_resubscribe => grace_resubscribe(Kind::Rust, Bind::JsonRpc);
    rust_rest_grace_resubscribe => grace_resubscribe(Kind::Rust, Bind::Rest);
    python_jsonrpc_grace_resubscribe => grace_resubscribe(Kind::Python, Bind::JsonRpc);
    python_rest_grace_resubscribe => grace_resubscribe(Kind::Python, Bind::Rest);

    rust_jsonrpc_leaves_at_once => caller_leaves_before_first_event(Kind::Rust, Bind::JsonRpc, LONG, Duration::ZERO);
    rust_rest_leaves_at_once => caller_leaves_before_first_event(Kind::Rust, Bind::Rest, LONG, Duration::ZERO);
    python_jsonrpc_leaves_at_once => caller_leaves_before_first_event(Kind::Python, Bind::JsonRpc, LONG, Duration::ZERO);
    // The worker names the task only after 1 s; the caller left at 300 ms.
    python_jsonrpc_leaves_before_late_first_event => caller_leaves_before_first_event(Kind::Python, Bind::JsonRpc, "late:1000:work:30000", Duration::from_millis(300));
    python_rest_leaves_before_late_first_event => caller_leaves_before_first_event(Kind::Python, Bind::Rest, "late:1000:work:30000", Duration::from_millis(300));

    rust_jsonrpc_gap_without_gateway => gap_without_gateway(Kind::Rust, Bind::JsonRpc);
    python_rest_gap_without_gateway => gap_without_gateway(Kind::Python, Bind::Rest);
}

/// A worker that takes the tenant from a header (a2a-rust's
/// `HeaderTenantResolver`, `x-tenant-id`): the gateway's CancelTask must
/// carry the header the worker saw, or the worker looks for the task in
/// the default tenant and it runs on. `route_extra` is the route's header
/// policy, `caller` the header the caller sends; `expect_cancel` whether
/// the worker is expected to stop the task.
async fn header_tenant(route_extra: &str, caller: &[(&str, &str)], expect_cancel: bool) {
    use crate::harness::http::{get_task_state_with, wait_for_state_with};
    use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
    let worker = RustWorker::start(RustWorkerOptions {
        header_tenant: true,
        ..RustWorkerOptions::default()
    })
    .await;
    let gw = Gateway::in_front_of(&worker.url(), route_extra).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": crate::harness::worker::message(LONG)}});
    let mut stream = SseStream::open(&gw.url, "/", caller, &body).await;
    assert_eq!(stream.status, 200);
    let id = stream.task_id().await;
    let acme = [("x-tenant-id", "acme")];
    assert_eq!(
        get_task_state_with(&worker.url(), &acme, &id)
            .await
            .as_deref(),
        Some(WORKING),
        "the task runs in tenant acme"
    );
    assert_eq!(
        get_task_state_with(&worker.url(), &[], &id).await,
        None,
        "the worker scopes tasks by the header: not found without it"
    );
    stream.close();
    let canceled = wait_for_state_with(&worker.url(), &acme, &id, CANCELED, scaled_secs(2)).await;
    if expect_cancel {
        canceled.unwrap_or_else(|last| {
            panic!(
                "not canceled (state {last:?}); gateway log:\n{}",
                gw.log_text()
            )
        });
        assert_eq!(worker.cancels(), 1);
    } else {
        assert_eq!(
            canceled.map_err(|last| last.as_deref() == Some(WORKING)),
            Err(true),
            "the cancel missed the task, which runs on"
        );
        assert_eq!(worker.cancels(), 0);
        let mut missed = 0.0;
        for _ in 0..scaled_count(100) {
            missed = gw
                .counter("a2agw_cancels_total", &["outcome=\"not_found\""])
                .await;
            if missed > 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(missed, 1.0, "the gateway counted its cancel as not found");
    }
}

/// The caller's `x-tenant-id` is repeated on the cancel (the default
/// `cancel_headers`).
#[tokio::test]
async fn caller_tenant_header_is_repeated_on_cancel() {
    header_tenant("", &[("x-tenant-id", "acme")], true).await;
}

/// A tenant header the route injects reaches the cancel too.
#[tokio::test]
async fn injected_tenant_header_is_sent_on_cancel() {
    header_tenant("inject_headers = { \"x-tenant-id\" = \"acme\" }", &[], true).await;
}

/// Without the header on the cancel the worker does not find the task: what
/// the two tests above would see if the gateway dropped it.
#[tokio::test]
async fn cancel_without_the_tenant_header_misses() {
    header_tenant("cancel_headers = []", &[("x-tenant-id", "acme")], false).await;
}

/// a2a-rust takes a REST call's tenant from `?tenant=` when the path names
/// none: the gateway must cancel in that tenant, or the tenant-aware worker
/// does not find the task and it runs on.
#[tokio::test]
async fn rest_query_tenant_is_the_cancel_tenant() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let body = json!({ "message": crate::harness::worker::message(LONG) });
    let mut stream = SseStream::open(&gw.url, "/message:stream?tenant=acme", &[], &body).await;
    assert_eq!(stream.status, 200);
    let id = stream.task_id().await;
    worker
        .wait_state(Some("acme"), &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs in tenant acme");
    stream.close();
    worker
        .wait_state(Some("acme"), &id, CANCELED, scaled_secs(2))
        .await
        .unwrap_or_else(|last| {
            panic!(
                "not canceled (state {last:?}); gateway log:\n{}",
                gw.log_text()
            )
        });
}

/// A task handed back (input-required) by an event the gateway could not
/// read (over `limits.max_sse_event`): the stream's end looks like a task
/// abandoned while working, so the gateway asks the worker (`GetTask`)
/// before cancelling, and leaves the task alone.
async fn input_required_unseen(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::start(&format!(
        "[limits]\nmax_sse_event = \"1KiB\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        worker.url()
    ))
    .await;
    let (mut stream, id) = send_stream(&gw.url, bind, None, "ask:4096").await;
    let events = stream.rest(scaled_secs(10)).await;
    let last = events.last().expect("events after the first");
    assert_eq!(
        state_of(last).as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED"),
        "the caller gets the question whole"
    );
    assert!(last.to_string().len() > 4096, "an event over the limit");
    stream.close();
    tokio::time::sleep(scaled_ms(700)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED"),
        "gateway log:\n{}",
        gw.log_text()
    );
    assert_eq!(worker.cancels().await, 0);
    assert_eq!(gw.counter("a2agw_cancel_attempts_total", &[]).await, 0.0);
    assert_eq!(
        gw.counter("a2agw_cancel_probes_total", &["found=\"settled\""])
            .await,
        1.0,
        "one GetTask, which found the task handed back"
    );
    assert!(
        gw.counter("a2agw_untracked_total", &["sse_event_too_large"])
            .await
            >= 1.0
    );
}

scenarios! {
    rust_jsonrpc_unseen_input_required_no_cancel => input_required_unseen(Kind::Rust, Bind::JsonRpc);
    rust_rest_unseen_input_required_no_cancel => input_required_unseen(Kind::Rust, Bind::Rest);
    python_jsonrpc_unseen_input_required_no_cancel => input_required_unseen(Kind::Python, Bind::JsonRpc);
    python_rest_unseen_input_required_no_cancel => input_required_unseen(Kind::Python, Bind::Rest);
}

/// A child whose `CancelTask` answer is long (the Python SDK answers with
/// the task's history, here a 100 KB message; a2a-rust's answer stays
/// short): the cancel counts as done at the first attempt. Before, the
/// gateway kept only the answer's first 64 KiB, could not parse it, and
/// retried until it called a successful cancel failed.
async fn long_cancel_answer(kind: Kind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let mut msg = crate::harness::worker::message(LONG);
    msg["parts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"text": "x".repeat(100_000)}));
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": msg}});
    let mut stream = SseStream::open(&gw.url, "/", &[], &body).await;
    let id = stream.task_id().await;
    worker
        .wait_state(None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    stream.close();
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(2))
        .await
        .expect("cancelled");
    let mut done = 0.0;
    for _ in 0..scaled_count(100) {
        done = gw
            .counter("a2agw_cancels_total", &["outcome=\"canceled\""])
            .await;
        if done > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(done, 1.0, "log:\n{}", gw.log_text());
    assert_eq!(gw.counter("a2agw_cancel_attempts_total", &[]).await, 1.0);
}

scenarios! {
    rust_long_cancel_answer => long_cancel_answer(Kind::Rust);
    python_long_cancel_answer => long_cancel_answer(Kind::Python);
}
