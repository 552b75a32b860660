//! Issue 31 item 3 over the gRPC binding (`lf.a2a.v1.A2AService`), the
//! parts `tests/grpc.rs` leaves: leases a caller grants with a2a-rust's
//! `Delegation::start_leased` over gRPC (a parent process killed, and one
//! alive and renewing), leases a route imposes on gRPC streams, header
//! policy (`inject_extensions`, `inject_headers`, `strip_headers`) on gRPC
//! metadata, gRPC on the TLS listener (ALPN `h2`), and task ownership on a
//! route with `[routes.auth]`.
//!
//! Against an a2a-rust 0.15 worker and a Python a2a-sdk 1.3.0 worker, each
//! serving gRPC (h2c) on a port of its own. What the worker did is read from
//! the worker itself: its task state (over its HTTP side, which shares the
//! gRPC side's task store), its count of `CancelTask` calls, the
//! `a2a-extensions` metadata it saw.

use std::time::Duration;

use serde_json::Value;

use crate::harness::gateway::{free_port, Gateway};
use crate::harness::grpc::{
    send_request, start_streaming, start_streaming_on, subscribe_on, RawGrpc,
};
use crate::harness::http::{get_task_state_with, request, wait_for_state_with};
use crate::harness::parent::ParentProcess;
use crate::harness::redis::RedisServer;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::tls::PrivateCa;
use crate::harness::worker::{Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs};

const WORKING: &str = "TASK_STATE_WORKING";
const CANCELED: &str = "TASK_STATE_CANCELED";
const COMPLETED: &str = "TASK_STATE_COMPLETED";

/// The worker's state of `id` is `want` now, or panics with the gateway's
/// log.
async fn assert_state(worker: &Worker, gw: &Gateway, id: &str, want: &str, why: &str) {
    let got = worker.state(None, id).await;
    assert_eq!(
        got.as_deref(),
        Some(want),
        "{id}: {why}; gateway log:\n{}",
        gw.log_text()
    );
}

/// Waits until the worker reports `id` CANCELED within `within`; how long
/// that took. Panics with the gateway's log otherwise.
async fn wait_canceled(worker: &Worker, gw: &Gateway, id: &str, within: Duration) -> Duration {
    worker
        .wait_state(None, id, CANCELED, within)
        .await
        .unwrap_or_else(|s| {
            panic!(
                "{id} not canceled within {within:?} (state {s:?}); gateway log:\n{}",
                gw.log_text()
            )
        })
}

/// Polls the gateway's admin `/tasks/{id}` until `ok` accepts the view.
async fn task_view(gw: &Gateway, id: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    for _ in 0..scaled_count(100) {
        let r = request("GET", &gw.admin, &format!("/tasks/{id}"), &[], b"").await;
        if r.status == 200 {
            last = r.json();
            if ok(&last) {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("/tasks/{id} never matched; last view: {last}");
}

// ── 1. Delegation::start_leased over gRPC ───────────────────────────────────

/// A parent process whose a2a-rust client speaks gRPC to the gateway
/// (`build_grpc`, no card) delegates one child with
/// `Delegation::start_leased` (TTL 2 s) on a route where the gateway
/// enforces the grant (`worker_leases = "enforce"`; neither worker enforces
/// it: the a2a-rust one has no lease store, the Python SDK knows no leases)
/// and the cascade detaches (so only the lease can stop the child).
///
/// * SIGKILLed after its renewals kept the child past one TTL: the child is
///   CANCELED by the gateway within TTL + 1 s (scaled), with one
///   `CancelTask`, counted under `cause="lease_lapsed"`.
/// * Alive on a child that works 7 s (3.5 TTLs): its renewals (`GetTask`
///   over gRPC with the lease URI in `a2a-extensions`) keep it alive, it
///   completes, the delegation ends `Completed`, nothing more is cancelled,
///   and the gateway counted the renewals.
async fn delegation_over_grpc(kind: Kind) {
    let worker = Worker::start_with_grpc(kind).await;
    let gw = Gateway::in_front_of(
        &worker.grpc_url(),
        "worker_leases = \"enforce\"\ncascade = \"detach\"",
    )
    .await;
    let ttl = Duration::from_secs(2);

    let mut parent = ParentProcess::spawn_grpc(&gw.url, ttl, "work:60000", None).await;
    let dump = parent.dump();
    assert!(
        dump.contains("parent: gRPC") && dump.contains(&gw.url),
        "the parent speaks gRPC to the gateway:\n{dump}"
    );
    let id = parent.task_id.clone();
    worker
        .wait_state(None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the child runs");
    assert_eq!(
        gw.counter("a2agw_leases_started_total", &["kind=\"granted\""])
            .await,
        1.0,
        "the gateway enforces the grant; log:\n{}",
        gw.log_text()
    );
    // Renewals flow through the gateway for longer than one TTL.
    tokio::time::sleep(ttl + scaled_ms(500)).await;
    assert_state(&worker, &gw, &id, WORKING, "renewed, not lapsed").await;
    parent.sigkill().await;
    let took = wait_canceled(&worker, &gw, &id, ttl + scaled_ms(1000)).await;
    eprintln!("grpc_policy: child {id} CANCELED {took:?} after its gRPC parent was killed");
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels().await, 1, "one CancelTask");
    if let Worker::Rust(w) = &worker {
        assert_eq!(w.lease_stops(), 0, "the worker did not stop it itself");
    }
    assert_eq!(
        gw.counter_reaching(
            "a2agw_cancels_total",
            &["cause=\"lease_lapsed\"", "outcome=\"canceled\""],
            1.0
        )
        .await,
        1.0
    );
    assert_eq!(gw.counter("a2agw_leases_lapsed_total", &[]).await, 1.0);

    // A living parent: its renewals keep the child to completion.
    let renewals_before = gw
        .counter(
            "a2agw_lease_renewals_total",
            &["source=\"get_task\"", "outcome=\"renewed\""],
        )
        .await;
    let get_tasks_before = gw
        .counter(
            "a2agw_requests_total",
            &["method=\"GetTask\"", "binding=\"grpc\""],
        )
        .await;
    let mut parent = ParentProcess::spawn_grpc(&gw.url, ttl, "work:7000", None).await;
    let outcome = parent.wait_outcome(scaled_secs(20)).await;
    assert!(
        outcome.starts_with("Completed"),
        "{outcome}\n{}\ngateway log:\n{}",
        parent.dump(),
        gw.log_text()
    );
    assert_state(&worker, &gw, &parent.task_id, COMPLETED, "completed").await;
    assert_eq!(worker.cancels().await, 1, "no further cancel");
    let renewals = gw
        .counter(
            "a2agw_lease_renewals_total",
            &["source=\"get_task\"", "outcome=\"renewed\""],
        )
        .await
        - renewals_before;
    let get_tasks = gw
        .counter(
            "a2agw_requests_total",
            &["method=\"GetTask\"", "binding=\"grpc\""],
        )
        .await
        - get_tasks_before;
    eprintln!("grpc_policy: {renewals} renewals by {get_tasks} gRPC GetTasks over a 7 s child");
    // Every ttl/3 for 7 s: about 10.
    assert!(renewals >= 5.0, "{renewals} renewals");
    assert!(get_tasks >= renewals, "{get_tasks} GetTask over gRPC");
    assert_eq!(gw.counter("a2agw_leases_lapsed_total", &[]).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_delegation_over_grpc_lease_lapses_or_is_renewed() {
    delegation_over_grpc(Kind::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_delegation_over_grpc_lease_lapses_or_is_renewed() {
    delegation_over_grpc(Kind::Python).await;
}

// ── 2. A lease the route imposes ────────────────────────────────────────────

/// A route imposing a 2 s lease (`lease = { ttl = "2s" }`) on a gRPC
/// stream that granted none: the gateway holds it while the caller stays
/// connected (its admin view shows the lease and the gRPC binding; the
/// child keeps WORKING past 2 × TTL, the lease renewed by the holder). The
/// caller's connection dropped: the cascade cancels the child at once
/// (`caller_gone`), and the lease ends with it (no second cancel at its
/// lapse).
async fn imposed_lease_held_while_connected(kind: Kind) {
    let worker = Worker::start_with_grpc(kind).await;
    let gw = Gateway::in_front_of(&worker.grpc_url(), "lease = { ttl = \"2s\" }").await;
    let ttl = Duration::from_secs(2);
    let (conn, call, id) = start_streaming(&gw.url, "work:60000", "").await;
    let view = task_view(&gw, &id, |v| v["lease"].is_object()).await;
    assert_eq!(view["binding"], "grpc", "{view}");
    assert_eq!(view["lease"]["ttlMs"], 2000, "{view}");
    assert!(
        view["lease"]["holder"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "held by this replica: {view}"
    );
    assert_eq!(
        gw.counter("a2agw_leases_started_total", &["kind=\"imposed\""])
            .await,
        1.0
    );
    tokio::time::sleep(ttl * 2 + scaled_ms(500)).await;
    assert_state(&worker, &gw, &id, WORKING, "held while the caller stays").await;
    assert!(
        gw.counter(
            "a2agw_lease_renewals_total",
            &["source=\"held\"", "outcome=\"renewed\""]
        )
        .await
            >= 2.0,
        "the holder renewed it"
    );
    assert_eq!(worker.cancels().await, 0);

    drop(call);
    conn.close().await;
    let took = wait_canceled(&worker, &gw, &id, scaled_secs(1)).await;
    eprintln!("grpc_policy: imposed-lease child {id} CANCELED {took:?} after its caller left");
    tokio::time::sleep(ttl + scaled_ms(500)).await;
    assert_eq!(
        worker.cancels().await,
        1,
        "one CancelTask, none at the lapse"
    );
    assert_eq!(
        gw.counter_reaching("a2agw_cancels_total", &["cause=\"caller_gone\""], 1.0)
            .await,
        1.0
    );
    assert_eq!(
        gw.counter("a2agw_cancels_total", &["cause=\"lease_lapsed\""])
            .await,
        0.0
    );
    assert_eq!(gw.counter("a2agw_leases_lapsed_total", &[]).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_imposed_lease_held_while_connected() {
    imposed_lease_held_while_connected(Kind::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imposed_lease_held_while_connected() {
    imposed_lease_held_while_connected(Kind::Python).await;
}

/// The imposed lease lapses when nothing holds it any more: two replicas
/// on one Redis, a gRPC caller streaming through replica A (which holds
/// and renews the lease). A is SIGKILLed (so the caller's connection is
/// gone too, and no replica saw it leave): replica B claims the lapsed
/// lease and cancels the child over gRPC within TTL + 1 s (scaled), once.
async fn imposed_lease_lapses_when_its_holder_dies(kind: Kind) {
    let redis = RedisServer::start().await;
    let worker = Worker::start_with_grpc(kind).await;
    let cfg = format!(
        "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"2s\" }}\n",
        redis.url(),
        worker.grpc_url()
    );
    let mut a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let ttl = Duration::from_secs(2);
    let (_conn, _call, id) = start_streaming(&a.url, "work:60000", "").await;
    tokio::time::sleep(ttl + scaled_ms(1000)).await;
    assert_state(&worker, &a, &id, WORKING, "A holds the lease").await;
    a.kill().await;
    worker
        .wait_state(None, &id, CANCELED, ttl + scaled_ms(1000))
        .await
        .unwrap_or_else(|s| panic!("{id} not canceled by B ({s:?}); B's log:\n{}", b.log_text()));
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(worker.cancels().await, 1, "canceled once");
    assert_eq!(b.counter("a2agw_leases_lapsed_total", &[]).await, 1.0);
    assert_eq!(
        b.counter(
            "a2agw_cancels_total",
            &["cause=\"lease_lapsed\"", "outcome=\"canceled\""]
        )
        .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_imposed_lease_lapses_when_its_holder_dies() {
    imposed_lease_lapses_when_its_holder_dies(Kind::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_imposed_lease_lapses_when_its_holder_dies() {
    imposed_lease_lapses_when_its_holder_dies(Kind::Python).await;
}

/// On a route with `cascade = "detach"` the route's lease is not imposed
/// (docs/config.md, `routes.lease.ttl`: a detached child is the caller's to
/// manage): a gRPC caller that drops its connection leaves its child
/// running past the TTL, nothing cancelled, no lease started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_route_imposes_no_lease_on_grpc_streams() {
    let worker = Worker::start_with_grpc(Kind::Rust).await;
    let gw = Gateway::in_front_of(
        &worker.grpc_url(),
        "lease = { ttl = \"2s\" }\ncascade = \"detach\"",
    )
    .await;
    let (conn, call, id) = start_streaming(&gw.url, "work:60000", "").await;
    drop(call);
    conn.close().await;
    tokio::time::sleep(Duration::from_secs(2) + scaled_ms(1000)).await;
    assert_state(&worker, &gw, &id, WORKING, "detached, not leased").await;
    assert_eq!(worker.cancels().await, 0);
    assert_eq!(gw.counter("a2agw_leases_started_total", &[]).await, 0.0);
    assert_eq!(gw.counter("a2agw_cancels_total", &[]).await, 0.0);
}

// ── 3. Header policy on gRPC metadata ───────────────────────────────────────

const INJECTED_URI: &str = "urn:a2agw:test:injected";
const CALLER_URI: &str = "urn:a2agw:test:caller";

/// An a2a-rust worker that takes the tenant from `x-tenant-id`
/// (`HeaderTenantResolver`), so that the one header a worker shows is this
/// one: a task lands in the tenant the header the worker received names.
///
/// * `inject_extensions` and `inject_headers = { "x-tenant-id" = "acme" }`:
///   the worker's interceptor saw the injected URI beside the caller's on
///   the `SendStreamingMessage` (one `a2a-extensions` value); the task is in
///   tenant `acme` although the caller said `x-tenant-id: other` (replaced);
///   a `GetTask` through the gateway without the header finds it; the
///   caller's RST_STREAM cancels it in `acme` (the gateway's own gRPC
///   `CancelTask` carries the injected header).
/// * `strip_headers = ["x-tenant-id"]`: the caller's `x-tenant-id: acme`
///   does not reach the worker (the task is in the default tenant), nor the
///   gateway's `CancelTask`, which finds the task there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_header_policy_on_grpc_metadata() {
    let worker = RustWorker::start_with_grpc(RustWorkerOptions {
        header_tenant: true,
        ..RustWorkerOptions::default()
    })
    .await;
    let acme = [("x-tenant-id", "acme")];
    let gw = Gateway::in_front_of(
        &worker.grpc_url(),
        &format!(
            "inject_extensions = [\"{INJECTED_URI}\"]\ninject_headers = {{ \"x-tenant-id\" = \"acme\" }}"
        ),
    )
    .await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let (call, id) = start_streaming_on(
        &mut conn,
        &send_request("work:60000", ""),
        &[("x-tenant-id", "other"), ("a2a-extensions", CALLER_URI)],
    )
    .await;
    assert_eq!(
        get_task_state_with(&worker.url(), &acme, &id)
            .await
            .as_deref(),
        Some(WORKING),
        "the worker got the injected x-tenant-id"
    );
    assert_eq!(
        get_task_state_with(&worker.url(), &[("x-tenant-id", "other")], &id).await,
        None,
        "not the caller's"
    );
    let calls = worker.extension_calls();
    let sent = calls
        .iter()
        .find(|(m, _)| m == "SendStreamingMessage")
        .map(|(_, raw)| raw.clone())
        .unwrap_or_else(|| panic!("no a2a-extensions on the send: {calls:?}"));
    let uris: Vec<&str> = sent.split(',').map(str::trim).collect();
    assert!(
        uris.contains(&INJECTED_URI) && uris.contains(&CALLER_URI),
        "the injected URI merged with the caller's: {sent:?}"
    );
    assert_eq!(
        uris.iter().filter(|u| **u == INJECTED_URI).count(),
        1,
        "{sent:?}"
    );
    let task = conn
        .get_task("", &id)
        .await
        .unwrap_or_else(|e| panic!("GetTask through the gateway: {e:?}"));
    assert_eq!(task.id, id, "found in the injected tenant");
    call.reset().await;
    wait_for_state_with(&worker.url(), &acme, &id, CANCELED, scaled_secs(1))
        .await
        .unwrap_or_else(|s| panic!("not canceled in acme ({s:?}); log:\n{}", gw.log_text()));
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels(), 1);

    // Stripped: the caller's tenant header reaches neither the worker nor
    // the cancel.
    let gw = Gateway::in_front_of(&worker.grpc_url(), "strip_headers = [\"x-tenant-id\"]").await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let (call, id) = start_streaming_on(&mut conn, &send_request("work:60000", ""), &acme).await;
    assert_eq!(
        get_task_state_with(&worker.url(), &[], &id)
            .await
            .as_deref(),
        Some(WORKING),
        "in the default tenant: the worker never saw x-tenant-id"
    );
    assert_eq!(get_task_state_with(&worker.url(), &acme, &id).await, None);
    call.reset().await;
    wait_for_state_with(&worker.url(), &[], &id, CANCELED, scaled_secs(1))
        .await
        .unwrap_or_else(|s| {
            panic!(
                "not canceled in the default tenant ({s:?}); log:\n{}",
                gw.log_text()
            )
        });
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels(), 2);
}

/// The Python worker shows only the `a2a-extensions` it received
/// (`/_test/stats` `extensions_seen`; it records no other metadata): the
/// route's injected URI reaches it on a gRPC stream, merged with the
/// caller's, and on a call that asked for none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_inject_extensions_on_grpc_metadata() {
    let worker = Worker::start_with_grpc(Kind::Python).await;
    let Worker::Python(py) = &worker else {
        unreachable!()
    };
    let gw = Gateway::in_front_of(
        &worker.grpc_url(),
        &format!("inject_extensions = [\"{INJECTED_URI}\"]"),
    )
    .await;
    let mut conn = RawGrpc::connect(&gw.url).await;
    let (_call, _id) = start_streaming_on(
        &mut conn,
        &send_request("work:60000", ""),
        &[("a2a-extensions", CALLER_URI)],
    )
    .await;
    let seen = py.stats().await["extensions_seen"].clone();
    let seen: Vec<String> = serde_json::from_value(seen).expect("extensions_seen");
    assert_eq!(seen.len(), 1, "one call: {seen:?}");
    let uris: Vec<&str> = seen[0].split(',').map(str::trim).collect();
    assert!(
        uris.contains(&INJECTED_URI) && uris.contains(&CALLER_URI),
        "{seen:?}"
    );
    let answer: Result<a2a_protocol_types::proto::SendMessageResponse, _> = conn
        .unary("SendMessage", &send_request("quick", ""), &[])
        .await;
    answer.expect("SendMessage");
    let seen = py.stats().await["extensions_seen"].clone();
    let seen: Vec<String> = serde_json::from_value(seen).expect("extensions_seen");
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].trim(), INJECTED_URI, "{seen:?}");
}

// ── 4. gRPC on the TLS listener ─────────────────────────────────────────────

/// A gateway with only a `[server.tls]` listener (plus the harness's plain
/// one): a gRPC caller over TLS that offers ALPN `h2` (and trusts the test
/// CA) gets `h2` selected, streams a task, and its RST_STREAM cancels the
/// child within 1 s (scaled), with one `CancelTask`; a unary `GetTask` on
/// the same TLS connection answers; the request was counted as gRPC.
async fn tls_listener_speaks_grpc(kind: Kind) {
    let worker = Worker::start_with_grpc(kind).await;
    let ca = PrivateCa::new("grpc-alpn");
    let port = free_port();
    let gw = Gateway::start(&format!(
        "[server.tls]\nlisten = [\"127.0.0.1:{port}\"]\ncert = {:?}\nkey = {:?}\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        ca.cert_pem.display().to_string(),
        ca.key_pem.display().to_string(),
        worker.grpc_url()
    ))
    .await;
    let addr = format!("127.0.0.1:{port}");
    let mut conn = RawGrpc::connect_tls(&addr, &ca.ca_pem).await;
    let (call, id) = start_streaming_on(&mut conn, &send_request("work:60000", ""), &[]).await;
    let task = conn
        .get_task("", &id)
        .await
        .unwrap_or_else(|e| panic!("GetTask over TLS: {e:?}"));
    assert_eq!(task.id, id);
    assert_state(&worker, &gw, &id, WORKING, "runs").await;
    call.reset().await;
    let took = wait_canceled(&worker, &gw, &id, scaled_secs(1)).await;
    eprintln!("grpc_policy: child {id} CANCELED {took:?} after RST_STREAM over TLS");
    crate::grpc::one_caller_gone_cancel(&worker, &gw, "SendStreamingMessage").await;
    assert_eq!(worker.tasks_started().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_tls_listener_speaks_grpc_over_alpn_h2() {
    tls_listener_speaks_grpc(Kind::Rust).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_tls_listener_speaks_grpc_over_alpn_h2() {
    tls_listener_speaks_grpc(Kind::Python).await;
}

// ── 5. Ownership ────────────────────────────────────────────────────────────

const OWNER_KEY: &str = "ak-grpc-owner-0123456789";
const OTHER_KEY: &str = "ak-grpc-other-9876543210";

/// A route with `[routes.auth]` (API keys): a gRPC call without a key is
/// refused UNAUTHENTICATED and reaches no worker. The owner streams a child
/// over gRPC; a second identity's `SubscribeToTask` over gRPC is served
/// (its first event names the task) but does not watch it: the owner's
/// RST_STREAM cancels the child within 1 s (scaled) while the other's
/// subscription is still open, with one `CancelTask`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identitys_grpc_subscription_keeps_no_child_alive() {
    let worker = Worker::start_with_grpc(Kind::Rust).await;
    let dir = crate::harness::gateway::scratch_dir("grpc-auth");
    let hex = |key: &str| a2a_gateway::digest::sha256_hex(key.as_bytes());
    let keys = dir.join("keys");
    std::fs::write(
        &keys,
        format!("{} owner\n{} other\n", hex(OWNER_KEY), hex(OTHER_KEY)),
    )
    .unwrap();
    let gw = Gateway::in_front_of(
        &worker.grpc_url(),
        &format!(
            "[routes.auth]\napi_keys_file = {:?}\n",
            keys.display().to_string()
        ),
    )
    .await;

    let mut anon = RawGrpc::connect(&gw.url).await;
    let call = anon
        .call("SendStreamingMessage", &send_request("work:60000", ""), &[])
        .await;
    let (events, status, end) = call.finish(scaled_secs(5)).await;
    assert_eq!(status, Some(16), "UNAUTHENTICATED: {events:?} {end:?}");
    assert_eq!(worker.tasks_started().await, 0);

    let mut owner = RawGrpc::connect(&gw.url).await;
    let (owner_call, id) = start_streaming_on(
        &mut owner,
        &send_request("work:60000", ""),
        &[("x-api-key", OWNER_KEY)],
    )
    .await;
    let mut other = RawGrpc::connect(&gw.url).await;
    let (other_call, _) = subscribe_on(&mut other, "", &id, &[("x-api-key", OTHER_KEY)]).await;
    let view = task_view(&gw, &id, |v| v["watchers"] == 1).await;
    assert_eq!(view["owner"], "key:owner", "{view}");
    tokio::time::sleep(scaled_ms(200)).await;
    let view = task_view(&gw, &id, |_| true).await;
    assert_eq!(
        view["watchers"], 1,
        "the other identity does not watch: {view}"
    );

    owner_call.reset().await;
    let took = wait_canceled(&worker, &gw, &id, scaled_secs(1)).await;
    eprintln!(
        "grpc_policy: owner left; child {id} CANCELED {took:?} despite another's subscription"
    );
    drop(other_call);
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels().await, 1);
    std::fs::remove_dir_all(&dir).ok();
}
