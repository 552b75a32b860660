//! Issue 31: the gRPC binding (`lf.a2a.v1.A2AService`) through the gateway,
//! against an a2a-rust 0.15 worker and a Python a2a-sdk 1.3.0 worker, each
//! serving gRPC (h2c) on a port of its own; callers speak HTTP/2 with
//! prior knowledge to the gateway's plain listener. What the worker did is
//! read from the worker itself (its HTTP side, which shares the gRPC
//! side's task store).

use std::time::Duration;

use a2a_protocol_types::proto;

use crate::harness::gateway::Gateway;
use crate::harness::grpc::{
    send_request, start_streaming, start_streaming_request, state_of, task_id_of, with_lease,
    RawGrpc,
};
use crate::harness::python_worker::PythonWorker;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::{scaled_ms, scaled_secs};

const CANCELED: &str = "TASK_STATE_CANCELED";
const WORKING: &str = "TASK_STATE_WORKING";
const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";

/// The two workers, each with its gRPC URL, its task state (read over
/// HTTP) and its count of CancelTask calls.
enum W {
    Rust(RustWorker),
    Python(PythonWorker),
}

impl W {
    async fn rust() -> W {
        W::Rust(RustWorker::start_with_grpc(RustWorkerOptions::default()).await)
    }

    async fn python() -> W {
        W::Python(PythonWorker::start_with_grpc(&[]).await)
    }

    fn grpc_url(&self) -> String {
        match self {
            W::Rust(w) => w.grpc_url(),
            W::Python(w) => w.grpc_url(),
        }
    }

    async fn state(&self, tenant: Option<&str>, id: &str) -> Option<String> {
        match self {
            W::Rust(w) => w.state(tenant, id).await,
            W::Python(w) => w.state(tenant, id).await,
        }
    }

    async fn cancels(&self) -> u64 {
        match self {
            W::Rust(w) => w.cancels() as u64,
            W::Python(w) => w.stats().await["cancels"].as_u64().unwrap_or(0),
        }
    }

    /// Polls until the task is `want`; its last state otherwise.
    async fn wait_state(
        &self,
        tenant: Option<&str>,
        id: &str,
        want: &str,
        within: Duration,
    ) -> Result<Duration, Option<String>> {
        let start = std::time::Instant::now();
        loop {
            let got = self.state(tenant, id).await;
            if got.as_deref() == Some(want) {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                return Err(got);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn gateway(worker: &W, route_extra: &str) -> Gateway {
    Gateway::in_front_of(&worker.grpc_url(), route_extra).await
}

/// A caller that leaves a streaming call, by RST_STREAM (`reset`) or by
/// dropping its connection: the child is CANCELED within 1 s (scaled), by
/// exactly one CancelTask; the gateway counted it as a gRPC request.
async fn leaving_cancels(worker: W, reset: bool, tenant: &str) {
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
    assert_eq!(
        gw.counter(
            "a2agw_requests_total",
            &["method=\"SendStreamingMessage\"", "binding=\"grpc\""]
        )
        .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_stream_reset_cancels() {
    leaving_cancels(W::rust().await, true, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_connection_close_cancels() {
    leaving_cancels(W::rust().await, false, "").await;
}

/// The cancel goes to the task's tenant (a2a-rust keeps tasks per tenant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_tenant_stream_reset_cancels_in_its_tenant() {
    leaving_cancels(W::rust().await, true, "acme").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_stream_reset_cancels() {
    leaving_cancels(W::python().await, true, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_connection_close_cancels() {
    leaving_cancels(W::python().await, false, "").await;
}

/// A stream that ran to COMPLETED, and one handed back INPUT_REQUIRED
/// whose caller then left: no cancel. The answer passes unchanged,
/// `grpc-status` 0 in its trailers.
async fn settled_streams_are_not_cancelled(worker: W) {
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
    settled_streams_are_not_cancelled(W::rust().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_settled_streams_are_not_cancelled() {
    settled_streams_are_not_cancelled(W::python().await).await;
}

/// Unary calls pass with their answers and statuses: `SendMessage`'s task,
/// `GetTask` of it, an unknown task's NOT_FOUND; a call of another gRPC
/// service is proxied verbatim (the worker's UNIMPLEMENTED comes back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_and_other_services_pass() {
    let worker = W::rust().await;
    let gw = gateway(&worker, "").await;
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
        gw.counter("a2agw_cancels_total", &["cause=\"lease_lapsed\""])
            .await,
        1.0
    );
}

/// A budgeted route refuses gRPC calls (grants inside protobuf are not
/// re-written) with PERMISSION_DENIED; nothing reaches the worker. A gRPC
/// call matching no route gets a gRPC status too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgeted_routes_and_no_route_answer_grpc_statuses() {
    let worker = RustWorker::start_with_grpc(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(
        &worker.grpc_url(),
        "[routes.budget]\nmax_deadline = \"1m\"\n",
    )
    .await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let call = conn
        .call("SendStreamingMessage", &send_request("work:60000", ""), &[])
        .await;
    let (_, status, end) = call.finish(scaled_secs(5)).await;
    assert_eq!(status, Some(7), "PERMISSION_DENIED: {end:?}");
    assert_eq!(worker.tasks_started(), 0);
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"budget_grpc\""])
            .await,
        1.0
    );

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

impl W {
    async fn tasks_started(&self) -> u64 {
        match self {
            W::Rust(w) => w.tasks_started() as u64,
            W::Python(w) => w.stats().await["tasks_started"].as_u64().unwrap_or(0),
        }
    }
}

/// Callers that leave at once, 0 to 19 ms after their request (RST_STREAM,
/// or the connection dropped): whether the request reached the worker, and
/// whether an event named the task before the caller left, depends on the
/// moment; a child the worker started before any event named it is found
/// by its sent message (the worker's `ListTasks`, over gRPC). Every child
/// the worker started is cancelled, once.
async fn callers_leaving_at_once(worker: W) {
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
    assert_eq!(worker.cancels().await, started, "each once");
    eprintln!(
        "grpc: {started} of {n} callers' children started, all cancelled ({} found by their message)",
        gw.counter("a2agw_children_looked_up_total", &["outcome=\"found\""])
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_callers_leaving_at_once() {
    callers_leaving_at_once(W::rust().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_callers_leaving_at_once() {
    callers_leaving_at_once(W::python().await).await;
}
