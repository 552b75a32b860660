//! Issue 3: leases enforced at the gateway for workers without a lease store.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, request};
use crate::harness::parent::ParentProcess;
use crate::harness::redis::RedisServer;
use crate::harness::relay::Relay;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::stream::SseStream;
use crate::harness::worker::{message, task_id_of, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs, scenarios};

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
async fn send_with_grant(
    url: &str,
    bind: Bind,
    grant: Value,
    pad: usize,
    text: &str,
) -> (u16, Value) {
    let mut msg = leased_message(text, grant);
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
        let (status, body) = send_with_grant(&gw.url, bind, grant.clone(), pad, "work:30000").await;
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
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(
        tasks_started(&worker).await,
        0,
        "no refused request created a task"
    );
    // A grant in bounds goes through.
    let (status, _) = send_with_grant(&gw.url, bind, json!({"ttlMs": 2000}), 0, "quick").await;
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
        let ev = s.next(scaled_secs(10)).await.expect("an event");
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
        .wait_state(
            None,
            &id,
            CANCELED,
            Duration::from_millis(1500) + scaled_ms(1000),
        )
        .await
        .unwrap_or_else(|s| panic!("not canceled at lapse ({s:?}); log:\n{}", gw.log_text()));
    // A lower bound: the lease started before the first event reached the
    // test, by a lag that a slower machine makes longer.
    assert!(
        started.elapsed() >= Duration::from_millis(1500).saturating_sub(scaled_ms(300)),
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
    let events = stream.rest(scaled_secs(10)).await;
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
        .wait_state(
            None,
            &id,
            CANCELED,
            Duration::from_millis(1500) + scaled_ms(1000),
        )
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

/// A parent process using `a2a-protocol-client` 0.15 `Delegation::start_leased`
/// (TTL 2 s) through the gateway to an a2a-rust worker WITHOUT a lease store:
/// killed with SIGKILL, its child is canceled within TTL + 1 s by the lease
/// alone (the route detaches, so the cascade does nothing); alive, its
/// renewals keep the child to completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegation_parent_killed_child_stops_at_lapse() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "cascade = \"detach\"").await;

    let mut parent = ParentProcess::spawn(&gw.url, Duration::from_secs(2), "work:30000").await;
    assert!(
        parent.dump().contains(&gw.url),
        "the parent talks to the gateway:\n{}",
        parent.dump()
    );
    worker
        .wait_state(None, &parent.task_id, "TASK_STATE_WORKING", scaled_secs(5))
        .await
        .expect("the child runs");
    // Let renewals flow through the gateway for longer than one TTL.
    tokio::time::sleep(Duration::from_secs(2) + scaled_ms(500)).await;
    assert_eq!(
        worker.state(None, &parent.task_id).await.as_deref(),
        Some("TASK_STATE_WORKING"),
        "renewed, not lapsed"
    );
    parent.sigkill().await;
    let took = worker
        .wait_state(
            None,
            &parent.task_id,
            CANCELED,
            Duration::from_secs(2) + scaled_ms(1000),
        )
        .await
        .unwrap_or_else(|s| {
            panic!(
                "not canceled within TTL + {:?} ({s:?}); log:\n{}",
                scaled_ms(1000),
                gw.log_text()
            )
        });
    eprintln!("child canceled {took:?} after its parent was killed");
    assert_eq!(worker.cancels().await, 1);
    assert_eq!(gw.counter("a2agw_leases_lapsed_total", &[]).await, 1.0);

    // A living parent renews: the child completes, nothing is canceled.
    let mut parent = ParentProcess::spawn(&gw.url, Duration::from_secs(2), "work:4000").await;
    let outcome = parent.wait_outcome(scaled_secs(15)).await;
    assert!(outcome.starts_with("Completed"), "{outcome}");
    assert_eq!(
        worker.state(None, &parent.task_id).await.as_deref(),
        Some("TASK_STATE_COMPLETED")
    );
    assert_eq!(worker.cancels().await, 1, "no further cancel");
    assert!(
        gw.counter(
            "a2agw_lease_renewals_total",
            &["source=\"get_task\"", "outcome=\"renewed\""]
        )
        .await
            >= 3.0
    );
}

/// A worker whose card declares the lease extension enforces grants itself:
/// the gateway passes the grant through and only observes (it learned that
/// from the card the parent fetched through it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_with_lease_store_enforces_itself() {
    let worker = RustWorker::start(RustWorkerOptions {
        lease_store: true,
        websocket: false,
        ..RustWorkerOptions::default()
    })
    .await;
    let gw = Gateway::in_front_of(&worker.url(), "cascade = \"detach\"").await;
    let mut parent = ParentProcess::spawn(&gw.url, Duration::from_secs(2), "work:30000").await;
    crate::harness::http::wait_for_state(
        &worker.url(),
        None,
        &parent.task_id,
        "TASK_STATE_WORKING",
        scaled_secs(5),
    )
    .await
    .expect("the child runs");
    parent.sigkill().await;
    crate::harness::http::wait_for_state(
        &worker.url(),
        None,
        &parent.task_id,
        CANCELED,
        Duration::from_secs(2) + scaled_ms(1500),
    )
    .await
    .expect("the worker's own lease store stops the child");
    assert_eq!(worker.lease_stops(), 1, "stopped by the worker's lease");
    assert_eq!(worker.cancels(), 0, "the gateway sent no CancelTask");
    assert_eq!(
        gw.counter("a2agw_leases_started_total", &[]).await,
        0.0,
        "the gateway only observed"
    );
}

/// A one-route config on `redis` whose route imposes a 2 s lease.
fn held_lease_route_on(redis: &RedisServer, worker: &Worker) -> String {
    format!(
        "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"2s\" }}\n",
        redis.url(),
        worker.url()
    )
}

/// `n` streams through `url` of tasks that work 30 s; the streams (keep
/// them open) and the task ids.
async fn long_streams(url: &str, n: usize) -> (Vec<SseStream>, Vec<String>) {
    let mut streams = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..n {
        let (s, id) =
            crate::harness::worker::send_stream(url, Bind::JsonRpc, None, "work:30000").await;
        streams.push(s);
        ids.push(id);
    }
    (streams, ids)
}

/// Each of `ids` is still working, as the worker itself says.
async fn assert_working(worker: &Worker, ids: &[String], why: &str) {
    for id in ids {
        assert_eq!(
            worker.state(None, id).await.as_deref(),
            Some("TASK_STATE_WORKING"),
            "{id}: {why}"
        );
    }
}

/// Two gateway replicas share one Redis; callers stream through replica A,
/// whose route imposes a 2 s lease that A renews while the callers are
/// connected. A is SIGKILLed: B cancels every child within TTL + 1 s, and
/// no child is canceled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_other_replica_cancels() {
    let redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let cfg = held_lease_route_on(&redis, &worker);
    let mut a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let (streams, ids) = long_streams(&a.url, 3).await;
    // Held leases are renewed by A: past one TTL, everything still runs.
    tokio::time::sleep(Duration::from_secs(2) + scaled_ms(1000)).await;
    assert_working(&worker, &ids, "A renews it").await;
    a.kill().await;
    crate::harness::worker::survivor_cancels_each_once(&worker, &ids, Duration::from_secs(2), &b)
        .await;
    drop(streams);
}

/// Replicas whose wall clocks disagree judge lapses by one clock, the Redis
/// server's: A (in step) holds its callers' leases (2 s TTL); B, 30 s
/// ahead, does not reap what A keeps renewing (by its own clock every lease
/// A wrote would be 28 s lapsed), and once A and B are killed, C, 30 s
/// behind, cancels A's children within TTL + 1 s (by its own clock it
/// would wait 30 s more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_skewed_clocks_agree_on_lapses() {
    let redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let cfg = held_lease_route_on(&redis, &worker);
    let mut a = Gateway::start(&cfg).await;
    let mut ahead = Gateway::start_with_clock(&cfg, "+30s").await;
    let behind = Gateway::start_with_clock(&cfg, "-30s").await;
    // Each replica sees the server's clock where it is (its first
    // heartbeat, at start).
    for (gw, want) in [(&ahead, -30.0), (&behind, 30.0)] {
        let offset = gw.counter("a2agw_store_clock_offset_seconds", &[]).await;
        assert!((offset - want).abs() < 1.0, "offset {offset}, want {want}");
    }
    let (streams, ids) = long_streams(&a.url, 3).await;
    tokio::time::sleep(Duration::from_secs(2) + scaled_ms(2000)).await;
    assert_working(
        &worker,
        &ids,
        &format!(
            "A renews it; the replica ahead reaped it? its log:\n{}",
            ahead.log_text()
        ),
    )
    .await;
    ahead.kill().await;
    a.kill().await;
    for id in &ids {
        worker
            .wait_state(None, id, CANCELED, Duration::from_secs(2) + scaled_ms(1000))
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "{id} not canceled by the replica behind ({s:?}); its log:\n{}",
                    behind.log_text()
                )
            });
    }
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(worker.cancels().await, 3, "each child canceled once");
    assert_eq!(behind.counter("a2agw_leases_lapsed_total", &[]).await, 3.0);
    drop(streams);
}

/// A rolling deploy that adds a route: replica A (with the route) dies while
/// its children's leases are held; replica B, still on the old config
/// without the route, claims the lapsed leases first and cannot cancel them.
/// It hands them back instead of dropping them, and replica C, started with
/// the route afterwards, cancels every child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_claimed_by_a_replica_without_the_route_is_handed_on() {
    let redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let with_route = format!(
        "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"1s\" }}\n",
        redis.url(),
        worker.url()
    );
    let without = format!(
        "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"old\"\nworker = \"{}\"\n",
        redis.url(),
        worker.url()
    );
    let mut a = Gateway::start(&with_route).await;
    let b = Gateway::start(&without).await;
    let mut streams = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (s, id) =
            crate::harness::worker::send_stream(&a.url, Bind::JsonRpc, None, "work:60000").await;
        streams.push(s);
        ids.push(id);
    }
    // A has written and renewed the leases (its tracker writes them behind
    // the request).
    tokio::time::sleep(scaled_ms(1500)).await;
    a.kill().await;
    // B claims the lapsed leases (within TTL + a few ticks) and hands them back.
    let handed_back = b
        .wait_log(scaled_ms(6000), |log| {
            ids.iter().all(|id| {
                log.lines().any(|l| {
                    l.contains("handed back for a replica that has it") && l.contains(id.as_str())
                })
            })
        })
        .await;
    assert!(
        handed_back,
        "B never claimed the lapses; its log:\n{}",
        b.log_text()
    );
    for id in &ids {
        assert_eq!(
            worker.state(None, id).await.as_deref(),
            Some("TASK_STATE_WORKING"),
            "B cannot cancel {id}"
        );
    }
    let c = Gateway::start(&with_route).await;
    for id in &ids {
        worker
            .wait_state(None, id, CANCELED, scaled_secs(15))
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "{id} not canceled by C ({s:?}); C's log:\n{}\nB's log:\n{}",
                    c.log_text(),
                    b.log_text()
                )
            });
    }
    assert_eq!(worker.cancels().await, 2, "each child canceled once");
    drop(streams);
}

/// Redis dies and comes back mid-run. fail-open: proxying goes on, leases are
/// not enforced while it is down, and work again once it is back.
/// fail-closed: a send that needs a lease is refused while Redis is down
/// (and creates no task); other traffic passes.
async fn redis_outage(mode: &str) {
    let mut redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&format!(
        "[store]\nurl = \"{}\"\non_store_error = \"{mode}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        redis.url(),
        worker.url()
    ))
    .await;
    redis.kill().await;
    // The reaper's heartbeat notices within a few ticks.
    tokio::time::sleep(scaled_ms(1500)).await;
    let send = json!({"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message": message("quick")}});
    let resp = post_json(&gw.url, "/", &[], &send).await;
    assert_eq!(
        resp.json()["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "plain traffic passes"
    );
    let before = worker.tasks_started_now();
    let (status, body) =
        send_with_grant(&gw.url, Bind::JsonRpc, json!({"ttlMs": 2000}), 0, "quick").await;
    match mode {
        "fail-closed" => {
            assert_eq!(body["error"]["code"], -32603, "{body}");
            assert_eq!(worker.tasks_started_now(), before, "refused: no task");
        }
        _ => {
            assert_eq!(status, 200);
            assert!(body.is_null() || body.get("error").is_none(), "{body}");
            assert_eq!(worker.tasks_started_now(), before + 1, "passed untracked");
        }
    }
    redis.restart().await;
    tokio::time::sleep(scaled_ms(1500)).await;
    // Back: a leased child that is not renewed is canceled at its lapse.
    let (_open, id) = leased_stream(&gw.url, 1000, "work:30000").await;
    worker
        .wait_state(
            None,
            &id,
            CANCELED,
            Duration::from_millis(1000) + scaled_ms(1500),
        )
        .await
        .unwrap_or_else(|s| {
            panic!(
                "lease not enforced after Redis came back ({s:?}); log:\n{}",
                gw.log_text()
            )
        });
}

scenarios! {
    rust_jsonrpc_refusals => refusals(Kind::Rust, Bind::JsonRpc, 0);
    rust_rest_refusals => refusals(Kind::Rust, Bind::Rest, 0);
    python_jsonrpc_refusals => refusals(Kind::Python, Bind::JsonRpc, 0);
    python_rest_refusals => refusals(Kind::Python, Bind::Rest, 0);
    rust_jsonrpc_refusals_large_body => refusals(Kind::Rust, Bind::JsonRpc, 100 * 1024);
    python_rest_refusals_large_body => refusals(Kind::Python, Bind::Rest, 100 * 1024);
    redis_outage_fail_open => redis_outage("fail-open");
    redis_outage_fail_closed => redis_outage("fail-closed");
}

/// Where the gateway holds the leases, a JSON-RPC batch holding a send with
/// a lease grant is refused: the a2a-rust worker would run the child, and
/// the gateway, which reads one send per request, would never hold its
/// lease. A batch of sends without grants passes.
#[tokio::test]
async fn batch_with_a_leased_send_is_refused() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let send = |id: u64, msg: Value| json!({"jsonrpc": "2.0", "id": id, "method": "SendMessage", "params": {"message": msg}});
    let leased = send(1, leased_message("quick", json!({"ttlMs": 2000})));
    let v = post_json(&gw.url, "/", &[], &json!([leased])).await.json();
    assert_eq!(v[0]["id"], 1, "{v}");
    assert_eq!(v[0]["error"]["code"], -32004, "{v}");
    assert_eq!(worker.tasks_started(), 0);

    let v = post_json(&gw.url, "/", &[], &json!([send(2, message("quick"))]))
        .await
        .json();
    assert_eq!(
        v[0]["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{v}"
    );
    assert_eq!(worker.tasks_started(), 1);
}

/// Replica A dies (SIGKILL) with a caller streaming a child through it; no
/// lease anywhere. The caller resubscribes through replica B and then
/// leaves too: B cancels the child. Before, A's stream stayed counted as a
/// watcher in Redis for ever, so B kept the child for it and the child ran
/// on. A dead replica's watchers stop counting once its heartbeat key
/// expires (6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_streams_stop_keeping_children_alive() {
    let redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let cfg = format!(
        "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        redis.url(),
        worker.url()
    );
    let mut a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let (stream, id) =
        crate::harness::worker::send_stream(&a.url, Bind::JsonRpc, None, "work:30000").await;
    // A's stream is counted in Redis (as every replica sees it) before A dies.
    let watchers = || async {
        let r = crate::harness::http::request("GET", &b.admin, "/tasks", &[], b"").await;
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        v["tasks"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["id"] == id.as_str()))
            .and_then(|t| t["watchers"].as_u64())
    };
    for _ in 0..scaled_count(100) {
        if watchers().await == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(watchers().await, Some(1), "A's stream is a watcher");
    a.kill().await;
    drop(stream);
    let mut resubscribed =
        crate::harness::worker::subscribe(&b.url, Bind::JsonRpc, None, &id).await;
    assert!(
        resubscribed.next(scaled_secs(5)).await.is_some(),
        "B streams the task"
    );
    // Past the dead replica's heartbeat.
    tokio::time::sleep(Duration::from_secs(6) + scaled_ms(500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_WORKING")
    );
    resubscribed.close();
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(2))
        .await
        .unwrap_or_else(|s| panic!("not cancelled by B ({s:?}); B's log:\n{}", b.log_text()));
    assert_eq!(worker.cancels().await, 1);
}

/// A replica claims a lapsed lease and dies while its cancel waits on a
/// worker that stopped answering. The claim is held only as long as a
/// cancel can take: then another replica claims the lapse again and
/// cancels the child. Before, the claim was lost with the replica and the
/// child ran on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_whose_claimer_dies_mid_cancel_is_claimed_again() {
    let redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let (authority, _) = crate::harness::http::split_url(&worker.url());
    let gate = Relay::start(authority).await;
    // A cancel takes at most 2 x 1 s + 100 ms here; the claim is held 5 s more.
    let cfg = format!(
        "[store]\nurl = \"{}\"\n\n[cancel]\nattempts = 2\ntimeout = \"1s\"\nbackoff = \"100ms\"\n\n[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:{}\"\ncascade = \"detach\"\n",
        redis.url(),
        gate.port
    );
    let mut a = Gateway::start(&cfg).await;
    // The caller grants a 1 s lease, never renews it, and leaves.
    let (stream, id) = leased_stream(&a.url, 1000, "work:60000").await;
    drop(stream);
    gate.set_open(false);
    // A claims the lapse and starts its cancel, which hangs at the gate.
    let claimed = a
        .wait_log(scaled_ms(5000), |log| {
            log.lines()
                .any(|l| l.contains("lease lapsed; cancelling the task") && l.contains(id.as_str()))
        })
        .await;
    assert!(
        claimed,
        "A never claimed the lapse; its log:\n{}",
        a.log_text()
    );
    a.kill().await;
    gate.set_open(true);
    let b = Gateway::start(&cfg).await;
    // Not scaled: B is due to claim the lapse again once A's claim runs out
    // (about 7 s after A made it); this only looks before that.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_WORKING"),
        "held by A's claim for now"
    );
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(12))
        .await
        .unwrap_or_else(|s| panic!("not cancelled by B ({s:?}); B's log:\n{}", b.log_text()));
    assert_eq!(worker.cancels().await, 1);
}
