//! Issue 30 item 4: fire-and-poll. On a route with `poll_lease`, the task
//! of a non-blocking `SendMessage` (`configuration.returnImmediately`) is
//! cancelled once no `GetTask` or `SubscribeToTask` for it came through the
//! gateway for `poll_lease`; polls renew it (through any replica sharing
//! the store); a task that settled is never cancelled. Everything is read
//! from the worker itself: its task store and its cancel log.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, request};
use crate::harness::redis::RedisServer;
use crate::harness::worker::{message, state_of, subscribe, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs, scenarios};

const CANCELED: &str = "TASK_STATE_CANCELED";
const COMPLETED: &str = "TASK_STATE_COMPLETED";
const WORKING: &str = "TASK_STATE_WORKING";
const INPUT_REQUIRED: &str = "TASK_STATE_INPUT_REQUIRED";

/// The routes' `poll_lease` (part of the scenario: not scaled).
const POLL: Duration = Duration::from_secs(2);
const ROUTE_KEYS: &str = "poll_lease = \"2s\"";
/// How often the tests' callers poll (part of the scenario).
const EVERY: Duration = Duration::from_millis(500);

/// Sends `text` through `url` as a `SendMessage`, non-blocking when
/// `return_immediately`; the task id and the state the answer names.
async fn send(
    url: &str,
    bind: Bind,
    tenant: Option<&str>,
    text: &str,
    return_immediately: bool,
) -> (String, String) {
    let mut params = json!({ "message": message(text) });
    if return_immediately {
        params["configuration"] = json!({ "returnImmediately": true });
    }
    let v = match bind {
        Bind::JsonRpc => {
            if let Some(t) = tenant {
                params["tenant"] = json!(t);
            }
            let body =
                json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params});
            let v = post_json(url, "/", &[], &body).await.json();
            v["result"].clone()
        }
        Bind::Rest => {
            let path = match tenant {
                Some(t) => format!("/{t}/message:send"),
                None => "/message:send".to_string(),
            };
            let r = post_json(url, &path, &[], &params).await;
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()
        }
    };
    let task = &v["task"];
    let id = task["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {v}"))
        .to_string();
    let state = task["status"]["state"].as_str().unwrap_or("").to_string();
    (id, state)
}

/// `GetTask` for `id` through `url` (a plain one: no lease extension); the
/// state it answered.
async fn poll(url: &str, bind: Bind, tenant: Option<&str>, id: &str) -> Option<String> {
    let v: Value = match bind {
        Bind::JsonRpc => {
            let mut params = json!({ "id": id });
            if let Some(t) = tenant {
                params["tenant"] = json!(t);
            }
            let body = json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": params});
            post_json(url, "/", &[], &body).await.json()["result"].clone()
        }
        Bind::Rest => {
            let path = match tenant {
                Some(t) => format!("/{t}/tasks/{id}"),
                None => format!("/tasks/{id}"),
            };
            request("GET", url, &path, &[], b"").await.json()
        }
    };
    v["status"]["state"].as_str().map(str::to_string)
}

/// Polls `id` every [`EVERY`] for `how_long`, alternating through `urls`,
/// each poll answered WORKING; returns when the last poll was sent.
async fn keep_polling(
    urls: &[&str],
    bind: Bind,
    tenant: Option<&str>,
    id: &str,
    how_long: Duration,
) -> Instant {
    let start = Instant::now();
    let mut last = start;
    let mut n = 0;
    while start.elapsed() < how_long {
        tokio::time::sleep(EVERY).await;
        last = Instant::now();
        let url = urls[n % urls.len()];
        n += 1;
        assert_eq!(
            poll(url, bind, tenant, id).await.as_deref(),
            Some(WORKING),
            "poll {n} ({:?} in, through {url}): a polled task runs on",
            start.elapsed()
        );
    }
    last
}

/// How many `CancelTask` calls the gateway sent for lapsed leases.
async fn lapse_cancels(gw: &Gateway) -> f64 {
    gw.counter("a2agw_cancels_total", &["cause=\"lease_lapsed\""])
        .await
}

/// Polled every 500 ms for 5 s while it works, then silent: the worker has
/// the task CANCELED within `poll_lease` + 1 s of the last poll (and not
/// before `poll_lease`), by exactly one `CancelTask`.
async fn polled_then_silent(kind: Kind, bind: Bind, tenant: Option<&str>) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), ROUTE_KEYS).await;
    let (id, state) = send(&gw.url, bind, tenant, "work:30000", true).await;
    assert!(
        state == "TASK_STATE_SUBMITTED" || state == WORKING,
        "answered at once: {state}"
    );
    let last = keep_polling(&[&gw.url], bind, tenant, &id, Duration::from_secs(5)).await;
    let bound = POLL + scaled_ms(1000);
    worker
        .wait_state(tenant, &id, CANCELED, bound.saturating_sub(last.elapsed()))
        .await
        .unwrap_or_else(|s| {
            panic!(
                "not cancelled within {bound:?} of the last poll ({s:?}); log:\n{}",
                gw.log_text()
            )
        });
    let after = last.elapsed();
    // The last poll renewed the lease once it was sent: never before that
    // plus the lease (a few ms for clocks read apart).
    assert!(
        after >= POLL - Duration::from_millis(50),
        "cancelled {after:?} after the last poll, before its lease ran out"
    );
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_eq!(
        gw.counter("a2agw_leases_started_total", &["kind=\"poll\""])
            .await,
        1.0
    );
    assert!(
        gw.counter(
            "a2agw_lease_renewals_total",
            &["source=\"poll\"", "outcome=\"renewed\""]
        )
        .await
            >= 9.0,
        "every poll renewed"
    );
    assert_eq!(lapse_cancels(&gw).await, 1.0);
}

/// Polled until it completed: COMPLETED, and no `CancelTask`, though its
/// poll lease lapses after the last poll (the worker, asked at the lapse,
/// says the task is done).
async fn polled_until_done(kind: Kind, bind: Bind, tenant: Option<&str>) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), ROUTE_KEYS).await;
    let (id, _) = send(&gw.url, bind, tenant, "work:3000", true).await;
    let mut done = false;
    for _ in 0..scaled_count(30) {
        tokio::time::sleep(EVERY).await;
        let state = poll(&gw.url, bind, tenant, &id).await;
        if state.as_deref() == Some(COMPLETED) {
            done = true;
            break;
        }
        assert_eq!(
            state.as_deref(),
            Some(WORKING),
            "polled, so running until done"
        );
    }
    assert!(done, "never completed; log:\n{}", gw.log_text());
    // Past the lease and its lapse's probe.
    tokio::time::sleep(POLL + scaled_ms(1500)).await;
    assert_eq!(worker.state(tenant, &id).await.as_deref(), Some(COMPLETED));
    assert_eq!(worker.cancels().await, 0);
    assert_eq!(lapse_cancels(&gw).await, 0.0, "no CancelTask was sent");
    assert!(
        gw.counter("a2agw_cancel_probes_total", &["found=\"settled\""])
            .await
            >= 1.0,
        "the lapse asked the worker first; metrics:\n{}",
        gw.metrics().await
    );
}

/// A non-blocking send whose task asks for input, never polled: its poll
/// lease lapses, the worker says the task waits for input, and it is left
/// waiting (a task handed back is never cancelled).
async fn handed_back_is_not_cancelled(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), ROUTE_KEYS).await;
    let (id, state) = send(&gw.url, bind, None, "ask", true).await;
    assert_eq!(state, "TASK_STATE_SUBMITTED", "answered at once");
    worker
        .wait_state(None, &id, INPUT_REQUIRED, scaled_secs(5))
        .await
        .expect("the task asks for input");
    tokio::time::sleep(POLL + scaled_ms(1500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some(INPUT_REQUIRED),
        "left waiting for input; log:\n{}",
        gw.log_text()
    );
    assert_eq!(worker.cancels().await, 0);
    assert_eq!(lapse_cancels(&gw).await, 0.0);
    assert_eq!(
        gw.counter("a2agw_leases_started_total", &["kind=\"poll\""])
            .await,
        1.0,
        "it had a poll lease"
    );
}

/// A blocking send (no `returnImmediately`) starts no poll lease: it works
/// longer than `poll_lease`, nobody polls, it completes. A non-blocking
/// send on the same route does start one.
async fn blocking_send_starts_none(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), ROUTE_KEYS).await;
    let (id, state) = send(&gw.url, bind, None, "work:3000", false).await;
    assert_eq!(state, COMPLETED);
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.state(None, &id).await.as_deref(), Some(COMPLETED));
    assert_eq!(worker.cancels().await, 0);
    assert_eq!(
        gw.counter("a2agw_leases_started_total", &["kind=\"poll\""])
            .await,
        0.0
    );
    let (_, state) = send(&gw.url, bind, None, "work:30000", true).await;
    assert_ne!(state, COMPLETED);
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(
        gw.counter("a2agw_leases_started_total", &["kind=\"poll\""])
            .await,
        1.0
    );
}

/// A caller subscribed to its task (`SubscribeToTask`) watches it: the poll
/// lease is held for as long as the subscription lasts, past `poll_lease`
/// without a single `GetTask`.
async fn subscription_holds(kind: Kind, bind: Bind, tenant: Option<&str>) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), ROUTE_KEYS).await;
    let (id, _) = send(&gw.url, bind, tenant, "work:30000", true).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut sub = subscribe(&gw.url, bind, tenant, &id).await;
    assert_eq!(sub.status, 200);
    let start = Instant::now();
    while start.elapsed() < 2 * POLL {
        let ev = sub
            .next(scaled_secs(2))
            .await
            .unwrap_or_else(|| panic!("the subscription went quiet; log:\n{}", gw.log_text()));
        if let Some(s) = state_of(&ev) {
            assert_ne!(s, CANCELED, "cancelled under its subscriber");
        }
    }
    assert_eq!(
        worker.state(tenant, &id).await.as_deref(),
        Some(WORKING),
        "held while subscribed"
    );
    assert_eq!(worker.cancels().await, 0);
    assert!(
        gw.counter(
            "a2agw_lease_renewals_total",
            &["source=\"poll\"", "outcome=\"renewed\""]
        )
        .await
            >= 1.0,
        "the subscription renewed the lease"
    );
    sub.close();
}

scenarios! {
    rust_jsonrpc_polled_then_silent => polled_then_silent(Kind::Rust, Bind::JsonRpc, None);
    rust_rest_polled_then_silent_tenant => polled_then_silent(Kind::Rust, Bind::Rest, Some("acme"));
    python_jsonrpc_polled_then_silent_tenant => polled_then_silent(Kind::Python, Bind::JsonRpc, Some("acme"));
    python_rest_polled_then_silent => polled_then_silent(Kind::Python, Bind::Rest, None);
    rust_rest_polled_until_done => polled_until_done(Kind::Rust, Bind::Rest, None);
    python_jsonrpc_polled_until_done_tenant => polled_until_done(Kind::Python, Bind::JsonRpc, Some("acme"));
    rust_jsonrpc_handed_back_is_not_cancelled => handed_back_is_not_cancelled(Kind::Rust, Bind::JsonRpc);
    python_rest_handed_back_is_not_cancelled => handed_back_is_not_cancelled(Kind::Python, Bind::Rest);
    rust_jsonrpc_blocking_send_starts_none => blocking_send_starts_none(Kind::Rust, Bind::JsonRpc);
    python_rest_blocking_send_starts_none => blocking_send_starts_none(Kind::Python, Bind::Rest);
    rust_rest_subscription_holds_tenant => subscription_holds(Kind::Rust, Bind::Rest, Some("acme"));
    python_jsonrpc_subscription_holds => subscription_holds(Kind::Python, Bind::JsonRpc, None);
}

/// Two replicas on one Redis: the send goes through A, every poll through
/// B. B's polls renew the lease A started (the task runs on past several
/// leases); once they stop, the task is cancelled within `poll_lease` + 1 s
/// of the last, once, by whichever replica claims the lapse.
async fn polls_through_another_replica(kind: Kind, bind: Bind, tenant: Option<&str>) {
    let redis = RedisServer::start().await;
    let worker = Worker::start(kind).await;
    let cfg = format!(
        "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n{ROUTE_KEYS}\n",
        redis.url(),
        worker.url()
    );
    let a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let (id, _) = send(&a.url, bind, tenant, "work:30000", true).await;
    let last = keep_polling(&[&b.url], bind, tenant, &id, Duration::from_secs(5)).await;
    let bound = POLL + scaled_ms(1000);
    worker
        .wait_state(tenant, &id, CANCELED, bound.saturating_sub(last.elapsed()))
        .await
        .unwrap_or_else(|s| {
            panic!(
                "not cancelled ({s:?}); A's log:\n{}\nB's log:\n{}",
                a.log_text(),
                b.log_text()
            )
        });
    let after = last.elapsed();
    assert!(
        after >= POLL - Duration::from_millis(50),
        "cancelled {after:?} after the last poll, before its lease ran out"
    );
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(worker.cancels().await, 1, "cancelled once");
    assert_eq!(lapse_cancels(&a).await + lapse_cancels(&b).await, 1.0);
    assert!(
        b.counter(
            "a2agw_lease_renewals_total",
            &["source=\"poll\"", "outcome=\"renewed\""]
        )
        .await
            >= 9.0,
        "B renewed A's lease"
    );
}

scenarios! {
    rust_jsonrpc_polls_through_another_replica => polls_through_another_replica(Kind::Rust, Bind::JsonRpc, None);
    python_rest_polls_through_another_replica_tenant => polls_through_another_replica(Kind::Python, Bind::Rest, Some("acme"));
}
