//! Issue 31: the gRPC binding (`lf.a2a.v1.A2AService`) through the gateway,
//! against an a2a-rust 0.15 worker and a Python a2a-sdk 1.3.0 worker, each
//! serving gRPC (h2c) on a port of its own; callers speak HTTP/2 with
//! prior knowledge to the gateway's plain listener. What the worker did is
//! read from the worker itself (its HTTP side, which shares the gRPC
//! side's task store).

use std::time::Duration;

use a2a_protocol_types::proto;
use prost::Message as _;

use crate::harness::gateway::Gateway;
use crate::harness::grpc::{
    send_request, start_streaming, start_streaming_request, state_of, task_id_of, with_lease,
    RawGrpc,
};
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::worker::{Kind, Worker};
use crate::harness::{scaled_ms, scaled_secs};

const CANCELED: &str = "TASK_STATE_CANCELED";
const WORKING: &str = "TASK_STATE_WORKING";
const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";

async fn gateway(worker: &Worker, route_extra: &str) -> Gateway {
    Gateway::in_front_of(&worker.grpc_url(), route_extra).await
}

/// A caller that leaves a streaming call, by RST_STREAM (`reset`) or by
/// dropping its connection: the child is CANCELED within 1 s (scaled), by
/// exactly one CancelTask; the gateway counted it as a gRPC request.
async fn leaving_cancels(worker: Worker, reset: bool, tenant: &str) {
    let gw = gateway(&worker, "").await;
    let (conn, call, id) = start_streaming(&gw.url, "work:60000", tenant).await;
    let t = (!tenant.is_empty()).then_some(tenant);
    assert_eq!(worker.state(t, &id).await.as_deref(), Some(WORKING));
    if reset {
        call.reset().await;
    } else {
        drop(call);
        conn.close().await;
    }
    let took = worker
        .wait_state(t, &id, CANCELED, scaled_secs(1))
        .await
        .unwrap_or_else(|s| panic!("not canceled ({s:?}); log:\n{}", gw.log_text()));
    eprintln!("grpc: child {id} CANCELED {took:?} after its caller left");
    one_caller_gone_cancel(&worker, &gw, "SendStreamingMessage").await;
}

/// After a gRPC caller of `method` left and its child was seen CANCELED:
/// exactly one CancelTask reached the worker (none more 300 ms later,
/// scaled), the gateway counted it under `caller_gone`, and the call as a
/// gRPC `method`.
pub(crate) async fn one_caller_gone_cancel(worker: &Worker, gw: &Gateway, method: &str) {
    let method = format!("method=\"{method}\"");
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_eq!(
        gw.counter_reaching(
            "a2agw_cancels_total",
            &["cause=\"caller_gone\"", "outcome=\"canceled\""],
            1.0
        )
        .await,
        1.0
    );
    assert_eq!(
        gw.counter_reaching(
            "a2agw_requests_total",
            &[method.as_str(), "binding=\"grpc\""],
            1.0
        )
        .await,
        1.0
    );
}

/// A unary `SendMessage` (blocking) whose caller leaves after 1 s, by
/// RST_STREAM (`reset`) or by dropping its connection: guarded, the child
/// is found by its message in the worker's `ListTasks` and CANCELED within
/// 1 s (scaled), by exactly one CancelTask.
async fn unary_caller_leaves(worker: Worker, reset: bool, tenant: &str) {
    let gw = gateway(&worker, "").await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let call = conn
        .call("SendMessage", &send_request("work:30000", tenant), &[])
        .await;
    let t = (!tenant.is_empty()).then_some(tenant);
    let mut id = None;
    for _ in 0..crate::harness::scaled_count(200) {
        let ids = crate::harness::http::list_tasks(&worker.url(), t).await;
        assert!(ids.len() <= 1, "more than one task: {ids:?}");
        if let Some((found, state)) = ids.into_iter().next() {
            if state == WORKING {
                id = Some(found);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let id = id.expect("the worker runs the child");
    tokio::time::sleep(Duration::from_secs(1)).await;
    if reset {
        call.reset().await;
    } else {
        drop(call);
        conn.close().await;
    }
    let took = worker
        .wait_state(t, &id, CANCELED, scaled_secs(1))
        .await
        .unwrap_or_else(|s| panic!("not canceled ({s:?}); log:\n{}", gw.log_text()));
    eprintln!("grpc unary: child {id} CANCELED {took:?} after its caller left");
    one_caller_gone_cancel(&worker, &gw, "SendMessage").await;
    assert_eq!(
        gw.counter(
            "a2agw_blocking_sends_total",
            &["outcome=\"guarded\"", "reason=\"default\""]
        )
        .await,
        1.0
    );
    assert_eq!(
        gw.counter("a2agw_children_looked_up_total", &["outcome=\"found\""])
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_unary_send_reset_cancels() {
    unary_caller_leaves(Worker::start_with_grpc(Kind::Rust).await, true, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_unary_send_connection_close_cancels_in_its_tenant() {
    unary_caller_leaves(Worker::start_with_grpc(Kind::Rust).await, false, "acme").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_unary_send_reset_cancels() {
    unary_caller_leaves(Worker::start_with_grpc(Kind::Python).await, true, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_unary_send_connection_close_cancels() {
    unary_caller_leaves(Worker::start_with_grpc(Kind::Python).await, false, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_stream_reset_cancels() {
    leaving_cancels(Worker::start_with_grpc(Kind::Rust).await, true, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_connection_close_cancels() {
    leaving_cancels(Worker::start_with_grpc(Kind::Rust).await, false, "").await;
}

/// The cancel goes to the task's tenant (a2a-rust keeps tasks per tenant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_tenant_stream_reset_cancels_in_its_tenant() {
    leaving_cancels(Worker::start_with_grpc(Kind::Rust).await, true, "acme").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_stream_reset_cancels() {
    leaving_cancels(Worker::start_with_grpc(Kind::Python).await, true, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_connection_close_cancels() {
    leaving_cancels(Worker::start_with_grpc(Kind::Python).await, false, "").await;
}

/// A stream that ran to COMPLETED, and one handed back INPUT_REQUIRED
/// whose caller then left: no cancel. The answer passes unchanged,
/// `grpc-status` 0 in its trailers.
async fn settled_streams_are_not_cancelled(worker: Worker) {
    let gw = gateway(&worker, "").await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let call = conn
        .call("SendStreamingMessage", &send_request("quick", ""), &[])
        .await;
    let (events, status, _) = call.finish(scaled_secs(10)).await;
    assert_eq!(status, Some(0), "{events:?}");
    assert_eq!(
        events.iter().rev().find_map(state_of),
        Some(proto::TaskState::Completed),
        "{events:?}"
    );

    let mut call = conn
        .call("SendStreamingMessage", &send_request("ask", ""), &[])
        .await;
    let mut id = None;
    while let Some(ev) = call.next_message(scaled_secs(10)).await {
        id = id.or(task_id_of(&ev).map(str::to_owned));
        if state_of(&ev) == Some(proto::TaskState::InputRequired) {
            break;
        }
    }
    let id = id.expect("a task id");
    call.reset().await;
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED")
    );
    assert_eq!(worker.cancels().await, 0, "no CancelTask");
    assert_eq!(gw.counter("a2agw_cancels_total", &[]).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_settled_streams_are_not_cancelled() {
    settled_streams_are_not_cancelled(Worker::start_with_grpc(Kind::Rust).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_settled_streams_are_not_cancelled() {
    settled_streams_are_not_cancelled(Worker::start_with_grpc(Kind::Python).await).await;
}

/// Unary calls pass with their answers and statuses: `SendMessage`'s task,
/// `GetTask` of it, an unknown task's NOT_FOUND. A call of another gRPC
/// service is refused PERMISSION_DENIED on a route that checks sends (the
/// default), unless the route names the service in `grpc_pass_services`:
/// then it is proxied verbatim (the worker's UNIMPLEMENTED comes back), as
/// on a route that checks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_and_other_services_pass() {
    let worker = Worker::start_with_grpc(Kind::Rust).await;
    let checking = gateway(&worker, "").await;
    let mut conn = RawGrpc::connect(&checking.url).await;
    let other = conn
        .call(
            "/grpc.health.v1.Health/Check",
            &proto::GetTaskRequest::default(),
            &[],
        )
        .await;
    let (_, status, _) = other.finish(scaled_secs(5)).await;
    assert_eq!(status, Some(7), "PERMISSION_DENIED, from the gateway");
    let gw = gateway(
        &worker,
        "grpc_pass_services = [\"grpc.health.v1.Health\"]\n",
    )
    .await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let answer: proto::SendMessageResponse = conn
        .unary("SendMessage", &send_request("quick", ""), &[])
        .await
        .expect("SendMessage");
    let task = match answer.payload {
        Some(proto::send_message_response::Payload::Task(t)) => t,
        other => panic!("{other:?}"),
    };
    let got = conn.get_task("", &task.id).await.expect("GetTask");
    assert_eq!(got.id, task.id);
    let (code, _) = conn.get_task("", "no-such-task").await.unwrap_err();
    assert_eq!(code, 5, "NOT_FOUND");
    let mut other = conn
        .call(
            "/grpc.health.v1.Health/Check",
            &proto::GetTaskRequest::default(),
            &[],
        )
        .await;
    let _ = other.next_message(scaled_ms(200)).await;
    let (_, status, _) = other.finish(scaled_secs(5)).await;
    assert_eq!(status, Some(12), "UNIMPLEMENTED, from the worker");
    assert_eq!(worker.cancels().await, 0);
}

/// On a route where the gateway enforces lease grants, a malformed grant
/// (and one over `max_lease_ttl`) is refused INVALID_ARGUMENT and the
/// worker never sees the message; a good grant's child is cancelled when
/// its lease lapses, with the caller still connected but not renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_grants_are_checked_and_lapse() {
    let worker = RustWorker::start_with_grpc(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(
        &worker.grpc_url(),
        "worker_leases = \"enforce\"\nmax_lease_ttl = \"10s\"\ncascade = \"detach\"\n",
    )
    .await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    for (ttl, why) in [(60_000, "over max_lease_ttl"), (0, "zero")] {
        let req = with_lease(send_request("work:60000", ""), ttl);
        let call = conn
            .call(
                "SendStreamingMessage",
                &req,
                &[("a2a-extensions", LEASE_URI)],
            )
            .await;
        let (events, status, end) = call.finish(scaled_secs(5)).await;
        assert_eq!(
            status,
            Some(3),
            "{why}: INVALID_ARGUMENT, {events:?} {end:?}"
        );
        assert!(events.is_empty(), "{why}");
    }
    assert_eq!(worker.tasks_started(), 0, "the worker never saw them");
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"lease_out_of_bounds\""])
            .await
            + gw.counter("a2agw_refusals_total", &["reason=\"lease_malformed\""])
                .await,
        2.0
    );

    // A 2 s lease, never renewed: cancelled at its lapse though the caller
    // stays (the route detaches, so only the lease stops it).
    let req = with_lease(send_request("work:60000", ""), 2000);
    let (_conn, _call, id) =
        start_streaming_request(&gw.url, &req, &[("a2a-extensions", LEASE_URI)]).await;
    let start = std::time::Instant::now();
    loop {
        if worker.state(None, &id).await.as_deref() == Some(CANCELED) {
            break;
        }
        assert!(
            start.elapsed() < scaled_secs(4),
            "not cancelled at its lapse; log:\n{}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        gw.counter_reaching("a2agw_cancels_total", &["cause=\"lease_lapsed\""], 1.0)
            .await,
        1.0
    );
}

/// A gRPC call matching no route gets a gRPC status (trailers-only), and
/// nothing reaches the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_answers_a_grpc_status() {
    let worker = RustWorker::start_with_grpc(RustWorkerOptions::default()).await;
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"x\"\nworker = \"{}\"\npath_prefix = \"/x\"\n",
        worker.grpc_url()
    ))
    .await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let call = conn
        .call("SendStreamingMessage", &send_request("work:60000", ""), &[])
        .await;
    let (_, status, end) = call.finish(scaled_secs(5)).await;
    assert!(status.is_some_and(|s| s != 0), "{end:?}");
    assert_eq!(worker.tasks_started(), 0);
}

/// Callers that leave at once, 0 to 19 ms after their request (RST_STREAM,
/// or the connection dropped): whether the request reached the worker, and
/// whether an event named the task before the caller left, depends on the
/// moment; a child the worker started before any event named it is found
/// by its sent message (the worker's `ListTasks`, over gRPC). Every child
/// the worker started is cancelled, once.
async fn callers_leaving_at_once(worker: Worker) {
    let gw = gateway(&worker, "").await;
    let n = 20;
    for i in 0..n {
        let mut conn = RawGrpc::connect(&gw.url).await;
        let call = conn
            .call("SendStreamingMessage", &send_request("work:60000", ""), &[])
            .await;
        tokio::time::sleep(Duration::from_millis(i)).await;
        if i % 2 == 0 {
            call.reset().await;
            conn.close().await;
        } else {
            drop(call);
            conn.close().await;
        }
    }
    let start = std::time::Instant::now();
    let (mut started, mut cancels) = (0, 0);
    while start.elapsed() < scaled_secs(3) {
        started = worker.tasks_started().await;
        cancels = worker.cancels().await;
        if started > 0 && cancels == started {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started > 0, "the worker started no child");
    assert_eq!(
        cancels,
        started,
        "every started child cancelled; log:\n{}",
        gw.log_text()
    );
    tokio::time::sleep(scaled_ms(300)).await;
    // A send that reached the worker late starts a child after the loop
    // above looked: counted again, with the cancels, and each task once.
    let started = worker.tasks_started().await;
    assert_eq!(worker.cancels().await, started, "each once");
    if let Worker::Rust(w) = &worker {
        let mut per_task = std::collections::HashMap::new();
        for r in w.cancel_records() {
            *per_task.entry(r.task_id).or_insert(0) += 1;
        }
        assert!(
            per_task.values().all(|&k| k == 1),
            "a child cancelled twice: {per_task:?}"
        );
    }
    eprintln!(
        "grpc: {started} of {n} callers' children started, all cancelled ({} found by their message)",
        gw.counter("a2agw_children_looked_up_total", &["outcome=\"found\""])
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_callers_leaving_at_once() {
    callers_leaving_at_once(Worker::start_with_grpc(Kind::Rust).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_callers_leaving_at_once() {
    callers_leaving_at_once(Worker::start_with_grpc(Kind::Python).await).await;
}

const BUDGET_KEY: &str = "a2a-rust.com/budget";
const BUDGET_URI: &str = "https://a2a-rust.com/extensions/budget/v1";

/// A protobuf `Struct` as JSON (numbers as the doubles they are).
fn json_of(s: &a2a_protocol_types::proto::prost_types::Struct) -> serde_json::Value {
    use a2a_protocol_types::proto::prost_types::value::Kind;
    fn val(v: &a2a_protocol_types::proto::prost_types::Value) -> serde_json::Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
            Some(Kind::NumberValue(n)) => serde_json::json!(n),
            Some(Kind::StringValue(s)) => serde_json::json!(s),
            Some(Kind::BoolValue(b)) => serde_json::json!(b),
            Some(Kind::StructValue(s)) => json_of(s),
            Some(Kind::ListValue(l)) => l.values.iter().map(val).collect(),
        }
    }
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), val(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The SDK's budget-exhausted failure as a gRPC stream message: a status
/// update, FAILED, whose agent message carries the failure class and
/// extension, and whose metadata says why and how much was spent. Its
/// text, and the update's budget metadata.
fn budget_failure(ev: &proto::StreamResponse) -> Option<(String, serde_json::Value)> {
    let Some(proto::stream_response::Payload::StatusUpdate(u)) = &ev.payload else {
        return None;
    };
    let st = u.status.as_ref()?;
    if st.state != proto::TaskState::Failed as i32 {
        return None;
    }
    let m = st.message.as_ref()?;
    let meta = json_of(m.metadata.as_ref()?);
    let ok = meta["a2a-rust.com/failure"] == "budget-exhausted"
        && m.extensions == ["https://a2a-rust.com/extensions/failure/v1"]
        && m.role == proto::Role::Agent as i32;
    let text = match m.parts.first()?.content.as_ref()? {
        proto::part::Content::Text(t) => t.clone(),
        _ => return None,
    };
    let um = json_of(u.metadata.as_ref()?);
    (ok && um["error"] == text.as_str()).then(|| (text, um[BUDGET_KEY].clone()))
}

/// The message the worker stored as the task's first history entry (read
/// over its JSON-RPC side): what the gateway forwarded.
async fn forwarded_message(worker: &Worker, id: &str) -> serde_json::Value {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": "h", "method": "GetTask",
        "params": {"id": id, "historyLength": 10}});
    let v = crate::harness::http::post_json(&worker.url(), "/", &[], &body)
        .await
        .json();
    v["result"]["history"][0].clone()
}

/// A child reporting spend past its route's meter cap (no grant sent: the
/// gateway writes `{"meters":{"tokens":250}}` into the protobuf message) is
/// cancelled on the worker, and the gRPC caller's stream ends with the
/// budget-exhausted failure, nothing after it, `grpc-status` 0.
async fn spend_past_cap(worker: Worker) {
    let gw = gateway(&worker, "[routes.budget]\nmeters = { tokens = 250 }").await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let call = conn
        .call(
            "SendStreamingMessage",
            &send_request("spend:20000:tokens=100", ""),
            &[],
        )
        .await;
    let (events, status, end) = call.finish(scaled_secs(15)).await;
    assert_eq!(status, Some(0), "{end:?}");
    let id = events
        .iter()
        .find_map(task_id_of)
        .expect("a task id")
        .to_string();
    let last = events.last().expect("events");
    let (text, budget) =
        budget_failure(last).unwrap_or_else(|| panic!("last event: {last:?}; all: {events:?}"));
    assert_eq!(text, "[-32603] the budget's tokens meter is exhausted");
    assert_eq!(budget["meters"]["tokens"], 250.0, "{budget}");
    let spent = budget["spent"]["tokens"].as_f64().unwrap();
    assert!((251.0..=400.0).contains(&spent), "{spent}");
    assert_eq!(
        events
            .iter()
            .filter(|e| budget_failure(e).is_some())
            .count(),
        1
    );
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(3))
        .await
        .unwrap_or_else(|s| panic!("worker state {s:?}"));
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_eq!(
        gw.counter_reaching("a2agw_budget_exhausted_total", &["by=\"meter\""], 1.0)
            .await,
        1.0
    );
    // The worker got the injected grant and its extension.
    let fwd = forwarded_message(&worker, &id).await;
    assert_eq!(
        fwd["metadata"][BUDGET_KEY]["meters"]["tokens"].as_f64(),
        Some(250.0),
        "{fwd}"
    );
    assert!(fwd["extensions"].to_string().contains(BUDGET_URI), "{fwd}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_spend_past_cap_is_stopped() {
    spend_past_cap(Worker::start_with_grpc(Kind::Rust).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_spend_past_cap_is_stopped() {
    spend_past_cap(Worker::start_with_grpc(Kind::Python).await).await;
}

/// A caller's own deadline (`remainingMs` 800, on a worker that knows
/// nothing of budgets and a route with no cap) stops the child within
/// 250 ms (scaled) of it; the stream ends with the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_deadline_stops_the_child() {
    let worker = Worker::start_with_grpc(Kind::Python).await;
    let gw = gateway(&worker, "").await;
    let remaining = Duration::from_millis(800);
    let grant = serde_json::json!({"remainingMs": remaining.as_millis() as u64});
    let req = crate::harness::grpc::with_budget(send_request("work:20000", ""), grant);
    let sent = std::time::Instant::now();
    let mut conn = RawGrpc::connect(&gw.url).await;
    let call = conn.call("SendStreamingMessage", &req, &[]).await;
    let (events, status, end) = call.finish(scaled_secs(10)).await;
    let took = sent.elapsed();
    assert_eq!(status, Some(0), "{end:?}");
    let id = events
        .iter()
        .find_map(task_id_of)
        .expect("an id")
        .to_string();
    let (text, _) =
        budget_failure(events.last().unwrap()).unwrap_or_else(|| panic!("{:?}", events.last()));
    assert_eq!(text, "[-32603] the caller's budget deadline passed");
    assert!(took >= remaining, "{took:?}");
    assert!(
        took <= remaining + scaled_ms(250) + scaled_ms(250),
        "{took:?}"
    );
    assert_eq!(worker.state(None, &id).await.as_deref(), Some(CANCELED));
    assert_eq!(worker.cancels().await, 1);
}

/// Malformed and over-cap budget grants are refused INVALID_ARGUMENT with
/// `over_cap = "refuse"`; the worker never sees the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_budget_grants_are_refused() {
    let worker = Worker::start_with_grpc(Kind::Rust).await;
    let gw = gateway(
        &worker,
        "[routes.budget]\nmax_deadline = \"10s\"\nover_cap = \"refuse\"\n",
    )
    .await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let cases = [
        (
            "malformed",
            crate::harness::grpc::with_message_metadata(
                send_request("work:1000", ""),
                BUDGET_KEY,
                serde_json::json!("lots"),
            ),
        ),
        (
            "over the cap",
            crate::harness::grpc::with_budget(
                send_request("work:1000", ""),
                serde_json::json!({"remainingMs": 60000}),
            ),
        ),
    ];
    for (why, req) in cases {
        let call = conn.call("SendStreamingMessage", &req, &[]).await;
        let (events, status, end) = call.finish(scaled_secs(5)).await;
        assert_eq!(status, Some(3), "{why}: {end:?}");
        assert!(events.is_empty(), "{why}");
    }
    assert_eq!(worker.tasks_started().await, 0, "the worker never saw them");
}

/// Fire-and-poll over gRPC on a route with `poll_lease = "2s"`: a unary
/// `SendMessage` with `return_immediately` is answered with its task at
/// once; the caller's `GetTask` polls keep the child WORKING past two
/// TTLs; once they stop, the child is cancelled within the TTL and a
/// second (scaled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_poll_lease_holds_while_polled() {
    let worker = Worker::start_with_grpc(Kind::Rust).await;
    let gw = gateway(&worker, "poll_lease = \"2s\"\n").await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let mut req = send_request("work:60000", "");
    req.configuration = Some(proto::SendMessageConfiguration {
        return_immediately: true,
        ..Default::default()
    });
    let answer: proto::SendMessageResponse = conn
        .unary("SendMessage", &req, &[])
        .await
        .expect("SendMessage");
    let Some(proto::send_message_response::Payload::Task(task)) = answer.payload else {
        panic!("{answer:?}")
    };
    // A poll every 500 ms, each on its own connection and not waiting for
    // the one before: the gateway renews on a poll's arrival, so a slow
    // answer (the worker shares this process with the tests beside it)
    // must not hold the next poll back.
    let started = std::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut polls = Vec::new();
    let mut sent = Vec::new();
    while started.elapsed() < Duration::from_secs(5) {
        tick.tick().await;
        sent.push(started.elapsed());
        let (url, id) = (gw.url.clone(), task.id.clone());
        polls.push(tokio::spawn(async move {
            let mut c = RawGrpc::connect(&url).await;
            c.get_task("", &id).await.expect("GetTask")
        }));
    }
    let stopped = std::time::Instant::now();
    // A gap of a TTL between two polls would let the lease lapse rightly:
    // this process stalled, not the gateway.
    let gap = sent
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    assert!(
        gap < Duration::from_millis(1500),
        "this test sent no poll for {gap:?} (its process stalled)"
    );
    for p in polls {
        let t = p.await.expect("a poll");
        assert_ne!(
            t.status.map(|s| s.state),
            Some(proto::TaskState::Canceled as i32),
            "cancelled while polled; log:\n{}",
            gw.log_text()
        );
    }
    let took = worker
        .wait_state(
            None,
            &task.id,
            CANCELED,
            Duration::from_secs(2) + scaled_secs(1),
        )
        .await
        .unwrap_or_else(|s| panic!("not cancelled ({s:?}); log:\n{}", gw.log_text()));
    assert!(
        stopped.elapsed() >= Duration::from_millis(1000),
        "cancelled {took:?} after the last poll, before its lease could lapse"
    );
    assert_eq!(worker.cancels().await, 1);
}

/// With h2c on the plain listener, an HTTP/1 request shorter than the
/// HTTP/2 preface (18 bytes, no `Host`), whose client then waits, is
/// answered at once (pingora-core patch 0010: the preface is told from a
/// request at its first differing byte, not after 24 bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_http1_request_is_answered_on_an_h2c_listener() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let worker = Worker::start_with_grpc(Kind::Rust).await;
    let gw = gateway(&worker, "").await;
    let mut s = tokio::net::TcpStream::connect(gw.url.trim_start_matches("http://"))
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(scaled_secs(5), s.read_exact(&mut head))
        .await
        .expect("answered without more bytes")
        .unwrap();
    assert!(
        head.starts_with(b"HTTP/1."),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
}

/// Unary calls to one worker share the gateway's connection to it
/// (`limits.worker_h2_streams`, default 100): eight `SendMessage`s in
/// flight at once, from one caller connection, reach the worker on the one
/// connection the first call opened (counted by a relay in between). A
/// caller that resets one of them leaves its child cancelled, once, while
/// the seven others on the same connection are answered COMPLETED. Streaming
/// calls get a connection each. With `worker_h2_streams = 1` every unary
/// call in flight has its own connection, as pingora's default.
async fn unary_calls_share_a_worker_connection(kind: Kind) {
    let worker = Worker::start_with_grpc(kind).await;
    let relay =
        crate::harness::relay::Relay::start(crate::harness::http::split_url(&worker.grpc_url()).0)
            .await;
    let gw = Gateway::in_front_of(&format!("http://127.0.0.1:{}", relay.port), "").await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let _: proto::SendMessageResponse = conn
        .unary("SendMessage", &send_request("quick", ""), &[])
        .await
        .expect("SendMessage");
    assert_eq!(relay.accepted(), 1, "the first call's connection");
    let work = format!("work:{}", scaled_ms(4000).as_millis());
    let mut calls = start_sends(&mut conn, &work, 8).await;
    worker_tasks_in(&worker, WORKING, 8).await;
    assert_eq!(
        (relay.accepted(), relay.live()),
        (1, 1),
        "eight calls in flight on one connection; log:\n{}",
        gw.log_text()
    );
    let leaver = calls.remove(3);
    leaver.reset().await;
    let gone = worker_tasks_in(&worker, CANCELED, 1).await;
    let answers = futures::future::join_all(
        calls
            .into_iter()
            .map(|c| async move { c.finish_raw(scaled_secs(10)).await }),
    )
    .await;
    for (messages, end) in answers {
        assert_eq!(end.grpc_status(), Some(0), "{end:?}");
        let answer = proto::SendMessageResponse::decode(messages[0].clone()).unwrap();
        match answer.payload {
            Some(proto::send_message_response::Payload::Task(t)) => {
                assert_eq!(
                    crate::harness::grpc::task_state(&t),
                    proto::TaskState::Completed
                );
                assert!(!gone.contains(&t.id), "a stayer's task was cancelled");
            }
            other => panic!("{other:?}"),
        }
    }
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_eq!(
        gw.counter(
            "a2agw_cancels_total",
            &["cause=\"caller_gone\"", "outcome=\"canceled\""]
        )
        .await,
        1.0
    );

    // Streams: a connection each.
    let before = relay.accepted();
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(start_streaming(&gw.url, &work, "").await);
    }
    assert_eq!(relay.accepted() - before, 3, "a connection per stream");
    for (conn, call, id) in streams {
        let (_, status, _) = call.finish(scaled_secs(10)).await;
        assert_eq!(status, Some(0), "stream of {id}");
        conn.close().await;
    }

    // One stream per connection.
    let relay =
        crate::harness::relay::Relay::start(crate::harness::http::split_url(&worker.grpc_url()).0)
            .await;
    let gw = Gateway::in_front_of(
        &format!("http://127.0.0.1:{}", relay.port),
        "[limits]\nworker_h2_streams = 1\n",
    )
    .await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let calls = start_sends(&mut conn, &work, 8).await;
    let before = worker_tasks_in(&worker, WORKING, 8).await.len();
    assert_eq!(before, 8);
    assert_eq!(relay.accepted(), 8, "a connection per call");
    for c in calls {
        let (_, end) = c.finish_raw(scaled_secs(10)).await;
        assert_eq!(end.grpc_status(), Some(0), "{end:?}");
    }
}

/// Starts `n` unary `SendMessage`s of `text` on `conn`, 20 ms apart, so
/// that each finds the last one's connection to the worker in use (with
/// room, where calls share).
async fn start_sends(
    conn: &mut RawGrpc,
    text: &str,
    n: usize,
) -> Vec<crate::harness::grpc::RawCall> {
    let mut calls = Vec::new();
    for _ in 0..n {
        calls.push(conn.call("SendMessage", &send_request(text, ""), &[]).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    calls
}

/// The worker's tasks in `state`, once at least `n` are (10 s, scaled).
async fn worker_tasks_in(worker: &Worker, state: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..crate::harness::scaled_count(400) {
        ids = crate::harness::http::list_tasks(&worker.url(), None)
            .await
            .into_iter()
            .filter(|(_, s)| s == state)
            .map(|(id, _)| id)
            .collect();
        if ids.len() >= n {
            return ids;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{} of {n} tasks {state}: {ids:?}", ids.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_unary_calls_share_a_worker_connection() {
    unary_calls_share_a_worker_connection(Kind::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_unary_calls_share_a_worker_connection() {
    unary_calls_share_a_worker_connection(Kind::Python).await;
}
