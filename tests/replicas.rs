//! Issue 44: worker replicas and task affinity. A route names several
//! replicas of one worker (`workers = [...]`); new sends are balanced over
//! the healthy ones, and every later call bound to a task, and every cancel
//! the gateway sends itself, goes to the replica that took the send.
//!
//! Each replica is a worker of its own with its own in-memory task store
//! (a2a-rust 0.15 servers in the test's process, Python a2a-sdk 1.3.0
//! processes), so a call that reaches the wrong replica finds nothing there.
//! Outcomes are read from each replica itself: its store (`GetTask`,
//! `ListTasks` straight to it), its cancel count and, for a2a-rust, its
//! cancel log. Most replicas sit behind a recording relay
//! (`harness::replicas`): a task id is the worker's own, so the bytes the
//! gateway sent a replica must never name another replica's task.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::harness::gateway::Gateway;
use crate::harness::grpc::{start_streaming, RawCall, RawGrpc};
use crate::harness::http::{leave, open_post_json, post_json, request, send_and_leave};
use crate::harness::redis::RedisServer;
use crate::harness::replicas::{
    self, admin_replica, cancels, holder, index_of, named_in, replica_up, route, route_over,
    task_ids, Front, Replica,
};
use crate::harness::stream::SseStream;
use crate::harness::worker::{message, send_stream, state_of, subscribe, task_id_of, Bind, Kind};
use crate::harness::{scaled_count, scaled_ms, scaled_secs, scenarios};

const CANCELED: &str = "TASK_STATE_CANCELED";
const COMPLETED: &str = "TASK_STATE_COMPLETED";
const WORKING: &str = "TASK_STATE_WORKING";
const LONG: &str = "work:30000";
const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";

/// One child: where its caller sent it and where it runs.
struct Child {
    id: String,
    tenant: Option<&'static str>,
    bind: Bind,
    /// The index of the replica whose own store holds it.
    at: usize,
}

fn tenant_path(tenant: Option<&str>, rest: &str) -> String {
    match tenant {
        Some(t) => format!("/{t}{rest}"),
        None => rest.to_string(),
    }
}

/// `GetTask` (`cancel`: `CancelTask`) for `id` from the caller, through
/// the gateway at `url`, over `bind`: the task it answered. Panics on an
/// error answer (the task not found: the call went to a replica that does
/// not run it).
async fn task_call(url: &str, bind: Bind, tenant: Option<&str>, id: &str, cancel: bool) -> Value {
    let method = if cancel { "CancelTask" } else { "GetTask" };
    match bind {
        Bind::JsonRpc => {
            let mut params = json!({ "id": id });
            if let Some(t) = tenant {
                params["tenant"] = json!(t);
            }
            let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
            let r = post_json(url, "/", &[], &body).await;
            let v = r.json();
            assert!(
                r.status == 200 && v["result"].is_object(),
                "JSON-RPC {method} {id} ({tenant:?}) through the gateway: {} {}",
                r.status,
                r.text()
            );
            v["result"].clone()
        }
        Bind::Rest => {
            let r = if cancel {
                let path = tenant_path(tenant, &format!("/tasks/{id}:cancel"));
                post_json(url, &path, &[], &json!({})).await
            } else {
                let path = tenant_path(tenant, &format!("/tasks/{id}"));
                request("GET", url, &path, &[], b"").await
            };
            assert_eq!(
                r.status,
                200,
                "REST {method} {id} through the gateway: {}",
                r.text()
            );
            r.json()
        }
    }
}

async fn get_through(url: &str, bind: Bind, tenant: Option<&str>, id: &str) -> Value {
    task_call(url, bind, tenant, id, false).await
}

async fn cancel_through(url: &str, bind: Bind, tenant: Option<&str>, id: &str) -> Value {
    task_call(url, bind, tenant, id, true).await
}

/// Where `id` landed: the replica whose store holds it, checked against
/// the replica the gateway recorded (the admin task view).
async fn placed(gw: &Gateway, reps: &[Replica], tenant: Option<&str>, id: &str) -> usize {
    let at = holder(reps, tenant, id).await;
    let recorded = admin_replica(gw, id).await;
    assert_eq!(
        recorded,
        reps[at].authority(),
        "the gateway recorded {id} on {recorded}, but replica {at} ({}) runs it",
        reps[at].authority()
    );
    at
}

/// How many of `children` each of `n` replicas runs.
fn per_replica(children: &[Child], n: usize) -> Vec<u64> {
    let mut out = vec![0; n];
    for c in children {
        out[c.at] += 1;
    }
    out
}

/// Each of `n` replicas runs some of `children` (`what` says whose).
fn assert_spread(children: &[Child], n: usize, what: &str) {
    let spread = per_replica(children, n);
    assert!(spread.iter().all(|&k| k > 0), "{what}: {spread:?}");
}

/// No bytes the gateway sent a relayed replica name a task another replica
/// runs.
fn assert_no_foreign_ids(gw: &Gateway, reps: &[Replica], children: &[Child]) {
    for (k, r) in reps.iter().enumerate() {
        if !r.relayed() {
            continue;
        }
        let foreign: Vec<String> = children
            .iter()
            .filter(|c| c.at != k)
            .map(|c| c.id.clone())
            .collect();
        let wrong = named_in(r, &foreign);
        assert!(
            wrong.is_empty(),
            "replica {k} ({}) was sent calls naming other replicas' tasks: {wrong:?}; \
             gateway log:\n{}",
            r.authority(),
            gw.log_text()
        );
    }
}

/// Waits until each child is CANCELED in its own replica's store, all by
/// `deadline`; the longest it took from `from`.
async fn all_canceled(
    gw: &Gateway,
    reps: &[Replica],
    children: &[Child],
    from: Instant,
    deadline: Instant,
) -> Duration {
    let mut slowest = Duration::ZERO;
    for c in children {
        let within = deadline.saturating_duration_since(Instant::now());
        let waited = reps[c.at]
            .worker()
            .wait_state(c.tenant, &c.id, CANCELED, within)
            .await;
        if let Err(last) = waited {
            panic!(
                "{} ({:?}, {:?}) not CANCELED on its replica {} within {:?} (state {last:?}); \
                 cancels per replica {:?}; gateway log:\n{}",
                c.id,
                c.bind,
                c.tenant,
                c.at,
                deadline - from,
                cancels(reps).await,
                gw.log_text()
            );
        }
        slowest = slowest.max(from.elapsed());
    }
    slowest
}

/// Each replica's cancel count is the number of its own children among
/// `cancelled`, and on a2a-rust its cancel log names exactly those
/// children, each once, each by a `CancelTask`.
async fn assert_cancels_per_replica(gw: &Gateway, reps: &[Replica], cancelled: &[Child]) {
    let expect = per_replica(cancelled, reps.len());
    let got = cancels(reps).await;
    assert_eq!(
        got,
        expect,
        "CancelTask calls per replica, against the children each runs; gateway log:\n{}",
        gw.log_text()
    );
    for (k, r) in reps.iter().enumerate() {
        if let crate::harness::worker::Worker::Rust(w) = r.worker() {
            let mut logged: Vec<String> = w
                .cancel_records()
                .into_iter()
                .map(|rec| {
                    assert!(rec.by_cancel_task, "{} stopped by a lapse", rec.task_id);
                    rec.task_id
                })
                .collect();
            logged.sort();
            let mut own: Vec<String> = cancelled
                .iter()
                .filter(|c| c.at == k)
                .map(|c| c.id.clone())
                .collect();
            own.sort();
            assert_eq!(logged, own, "replica {k}'s cancel log");
        }
    }
}

// ── 1. Thirty streaming callers over two or three replicas ─────────────────

/// 30 streaming callers through one route over `n` replicas (JSON-RPC and
/// REST alternating, a third in tenant `acme`): every replica takes some;
/// the gateway records each task's replica; `GetTask` through the gateway
/// finds every task over JSON-RPC and REST; the callers leave (half FIN,
/// half RST): each child is CANCELED on its own replica within 1 s, by
/// exactly one `CancelTask` in all, and no replica was sent a call naming
/// another's task.
async fn thirty_callers(kind: Kind, n: usize) {
    let reps = replicas::start(kind, n, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "")).await;
    let mut streams = Vec::new();
    let mut children = Vec::new();
    for i in 0..30 {
        let bind = if i % 2 == 0 {
            Bind::JsonRpc
        } else {
            Bind::Rest
        };
        let tenant = (i % 3 == 2).then_some("acme");
        let (stream, id) = send_stream(&gw.url, bind, tenant, LONG).await;
        streams.push(stream);
        children.push(Child {
            id,
            tenant,
            bind,
            at: 0,
        });
    }
    for c in &mut children {
        c.at = placed(&gw, &reps, c.tenant, &c.id).await;
    }
    let spread = per_replica(&children, n);
    eprintln!("{kind:?}: 30 callers over {n} replicas: {spread:?}");
    assert!(
        spread.iter().all(|&k| k > 0),
        "every replica takes some sends: {spread:?}"
    );
    for r in &reps {
        assert_eq!(
            replica_up(&gw, &r.authority()).await,
            Some(1.0),
            "a2agw_replica_up of {}; metrics:\n{}",
            r.authority(),
            gw.metrics().await
        );
    }
    for c in &children {
        for bind in [Bind::JsonRpc, Bind::Rest] {
            let task = get_through(&gw.url, bind, c.tenant, &c.id).await;
            assert_eq!(task["id"], c.id.as_str(), "{task}");
            assert_eq!(task["status"]["state"], WORKING, "{task}");
        }
    }
    assert_eq!(cancels(&reps).await, vec![0; n], "nothing cancelled yet");

    for (i, s) in streams.into_iter().enumerate() {
        if (i / 2) % 2 == 0 {
            s.close();
        } else {
            s.reset();
        }
    }
    let left = Instant::now();
    let slowest = all_canceled(&gw, &reps, &children, left, left + scaled_secs(1)).await;
    eprintln!("{kind:?}: every child CANCELED on its replica within {slowest:?}");
    tokio::time::sleep(scaled_ms(300)).await;
    assert_cancels_per_replica(&gw, &reps, &children).await;
    assert_eq!(
        gw.counter_reaching("a2agw_cancels_total", &["outcome=\"canceled\""], 30.0)
            .await,
        30.0
    );
    assert_eq!(gw.counter("a2agw_cancel_attempts_total", &[]).await, 30.0);
    assert_eq!(
        gw.counter("a2agw_cancels_total", &["outcome=\"not_found\""])
            .await,
        0.0
    );
    assert_eq!(gw.counter("a2agw_tasks_lost_total", &[]).await, 0.0);
    assert_no_foreign_ids(&gw, &reps, &children);
    // The relays did see the calls: each replica was sent its own ids.
    for (k, r) in reps.iter().enumerate() {
        let own: Vec<String> = children
            .iter()
            .filter(|c| c.at == k)
            .map(|c| c.id.clone())
            .collect();
        assert!(
            !named_in(r, &own).is_empty(),
            "replica {k}'s relay saw none of its tasks"
        );
    }
}

scenarios! {
    rust_three_replicas_thirty_callers => thirty_callers(Kind::Rust, 3);
    rust_two_replicas_thirty_callers => thirty_callers(Kind::Rust, 2);
    python_three_replicas_thirty_callers => thirty_callers(Kind::Python, 3);
    python_two_replicas_thirty_callers => thirty_callers(Kind::Python, 2);
}

// ── Calls bound to a task: subscribe, the caller's cancel, the admin's ─────

/// Six streaming children over two replicas: `SubscribeToTask` through the
/// gateway reaches each one's replica (its first event names the task), as
/// do its push-notification config calls (JSON-RPC and REST); two are
/// cancelled by their caller with JSON-RPC `CancelTask`, two with
/// REST `POST /tasks/{id}:cancel`, two by the admin's `POST
/// /tasks/{id}:cancel`: each answer is the task CANCELED, each child
/// CANCELED on its own replica by one `CancelTask`, and the callers leaving
/// afterwards cancel nothing more.
async fn calls_bound_to_a_task(kind: Kind) {
    let reps = replicas::start(kind, 2, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "")).await;
    let mut streams = Vec::new();
    let mut children = Vec::new();
    for i in 0..6 {
        let bind = if i % 2 == 0 {
            Bind::JsonRpc
        } else {
            Bind::Rest
        };
        let tenant = (i % 4 == 1).then_some("acme");
        let (stream, id) = send_stream(&gw.url, bind, tenant, LONG).await;
        let at = placed(&gw, &reps, tenant, &id).await;
        streams.push(stream);
        children.push(Child {
            id,
            tenant,
            bind,
            at,
        });
    }
    assert_spread(&children, 2, "both replicas take some");
    for c in &children {
        let mut sub = subscribe(&gw.url, c.bind, c.tenant, &c.id).await;
        assert_eq!(sub.status, 200, "SubscribeToTask {}", c.id);
        assert!(
            sub.content_type().starts_with("text/event-stream"),
            "SubscribeToTask {} answered {} (not a stream): the wrong replica?",
            c.id,
            sub.content_type()
        );
        let ev = sub
            .next(scaled_secs(5))
            .await
            .unwrap_or_else(|| panic!("SubscribeToTask {}: no event", c.id));
        assert!(ev.get("error").is_none(), "SubscribeToTask {}: {ev}", c.id);
        assert_eq!(task_id_of(&ev).as_deref(), Some(c.id.as_str()), "{ev}");
        sub.close();
    }
    // Push-notification config calls name the task by `taskId` (JSON-RPC;
    // `id` is a config's) or in the path (REST): each reaches the task's
    // replica, whatever the worker answers (the relays check that no
    // replica was sent another's task id).
    for c in &children {
        let mut list = json!({"taskId": c.id});
        let mut get = json!({"taskId": c.id, "id": "cfg-1"});
        if let Some(t) = c.tenant {
            list["tenant"] = json!(t);
            get["tenant"] = json!(t);
        }
        for (method, params) in [
            ("ListTaskPushNotificationConfigs", list),
            ("GetTaskPushNotificationConfig", get),
        ] {
            let body = json!({"jsonrpc": "2.0", "id": 5, "method": method, "params": params});
            let r = post_json(&gw.url, "/", &[], &body).await;
            assert_eq!(r.status, 200, "{method} {}: {}", c.id, r.text());
        }
        let path = tenant_path(
            c.tenant,
            &format!("/tasks/{}/pushNotificationConfigs", c.id),
        );
        let r = request("GET", &gw.url, &path, &[], b"").await;
        assert!(r.status < 500, "REST push configs {}: {}", c.id, r.text());
    }
    for (i, c) in children.iter().enumerate() {
        match i {
            0 | 1 => {
                let task = cancel_through(&gw.url, Bind::JsonRpc, c.tenant, &c.id).await;
                assert_eq!(task["status"]["state"], CANCELED, "{task}");
            }
            2 | 3 => {
                let task = cancel_through(&gw.url, Bind::Rest, c.tenant, &c.id).await;
                assert_eq!(task["status"]["state"], CANCELED, "{task}");
            }
            _ => {
                let r = request(
                    "POST",
                    &gw.admin,
                    &format!("/tasks/{}:cancel", c.id),
                    &[],
                    b"",
                )
                .await;
                assert_eq!(r.status, 200, "admin cancel: {}", r.text());
                assert_eq!(r.json()["outcome"], "canceled", "{}", r.text());
            }
        }
        assert_eq!(
            reps[c.at].worker().state(c.tenant, &c.id).await.as_deref(),
            Some(CANCELED),
            "{} on its replica {}",
            c.id,
            c.at
        );
    }
    for mut s in streams {
        let events = s.rest(scaled_secs(5)).await;
        assert_eq!(
            events.iter().rev().find_map(state_of).as_deref(),
            Some(CANCELED),
            "the caller's stream ends CANCELED: {events:?}"
        );
        s.close();
    }
    tokio::time::sleep(scaled_ms(500)).await;
    assert_cancels_per_replica(&gw, &reps, &children).await;
    assert_eq!(
        gw.counter_reaching(
            "a2agw_cancels_total",
            &["cause=\"admin\"", "outcome=\"canceled\""],
            2.0
        )
        .await,
        2.0
    );
    assert_eq!(
        gw.counter("a2agw_cancel_attempts_total", &[]).await,
        2.0,
        "only the admin's cancels are the gateway's own"
    );
    assert_no_foreign_ids(&gw, &reps, &children);
}

scenarios! {
    rust_calls_bound_to_a_task => calls_bound_to_a_task(Kind::Rust);
    python_calls_bound_to_a_task => calls_bound_to_a_task(Kind::Python);
}

// ── A send continuing a task ───────────────────────────────────────────────

/// Four tasks over two replicas that ask for input (`ask`); each is then
/// continued by a blocking `SendMessage` naming its `taskId` and
/// `contextId` through the gateway (`quick`): the continuation reaches the
/// replica that runs the task (which completes it; another would not know
/// the task), no other.
async fn continuation_goes_to_its_replica(kind: Kind, bind: Bind) {
    let reps = replicas::start(kind, 2, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "")).await;
    let mut children = Vec::new();
    for _ in 0..4 {
        let (path, body) = send_message(bind, None, "ask", json!({}));
        let r = post_json(&gw.url, &path, &[], &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let task = answered_task(&r);
        assert_eq!(
            task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{task}"
        );
        let id = task["id"].as_str().unwrap().to_string();
        let context = task["contextId"].as_str().unwrap().to_string();
        let at = placed(&gw, &reps, None, &id).await;
        children.push((
            Child {
                id,
                tenant: None,
                bind,
                at,
            },
            context,
        ));
    }
    let only: Vec<Child> = children
        .iter()
        .map(|(c, _)| Child {
            id: c.id.clone(),
            tenant: None,
            bind,
            at: c.at,
        })
        .collect();
    assert_spread(&only, 2, "both replicas take some");
    for (c, context) in &children {
        let (path, mut body) = send_message(bind, None, "quick", json!({}));
        let msg = match bind {
            Bind::JsonRpc => &mut body["params"]["message"],
            Bind::Rest => &mut body["message"],
        };
        msg["taskId"] = json!(c.id);
        msg["contextId"] = json!(context);
        let r = post_json(&gw.url, &path, &[], &body).await;
        assert_eq!(r.status, 200, "continuing {}: {}", c.id, r.text());
        let task = answered_task(&r);
        assert_eq!(task["id"], c.id.as_str(), "{task}");
        assert_eq!(task["status"]["state"], COMPLETED, "{task}");
        assert_eq!(
            reps[c.at].worker().state(None, &c.id).await.as_deref(),
            Some(COMPLETED)
        );
    }
    assert_eq!(cancels(&reps).await, vec![0, 0]);
    assert_no_foreign_ids(&gw, &reps, &only);
}

/// Two contexts started by blocking sends (through gateway A); three sends
/// each that name only the `contextId` (through B, which shares A's Redis
/// when `redis`, else A itself): each starts its new task on the replica
/// that holds the context (three in a row would alternate if balanced),
/// and the worker keeps it in that context. Four sends naming contexts the
/// gateway never saw are balanced over both replicas.
async fn context_goes_to_its_replica(kind: Kind, bind: Bind, redis: bool) {
    let reps = replicas::start(kind, 2, Front::Relayed).await;
    let server = if redis {
        Some(RedisServer::start().await)
    } else {
        None
    };
    let cfg = match &server {
        Some(r) => format!("[store]\nurl = \"{}\"\n\n{}", r.url(), route(&reps, "")),
        None => route(&reps, ""),
    };
    let a = Gateway::start(&cfg).await;
    let b = match redis {
        true => Some(Gateway::start(&cfg).await),
        false => None,
    };
    let later = b.as_ref().unwrap_or(&a);
    let send = |url: String, context: Option<String>| async move {
        let (path, mut body) = send_message(bind, None, "quick", json!({}));
        if let Some(c) = context {
            match bind {
                Bind::JsonRpc => body["params"]["message"]["contextId"] = json!(c),
                Bind::Rest => body["message"]["contextId"] = json!(c),
            }
        }
        let r = post_json(&url, &path, &[], &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let task = answered_task(&r);
        assert_eq!(task["status"]["state"], COMPLETED, "{task}");
        let id = task["id"].as_str().unwrap().to_string();
        let context = task["contextId"].as_str().unwrap().to_string();
        (id, context)
    };
    let mut all = Vec::new();
    let mut contexts: Vec<(String, usize)> = Vec::new();
    for _ in 0..2 {
        let (id, context) = send(a.url.clone(), None).await;
        let at = placed(&a, &reps, None, &id).await;
        all.push(Child {
            id,
            tenant: None,
            bind,
            at,
        });
        contexts.push((context, at));
    }
    for (context, at) in &contexts {
        for _ in 0..3 {
            let (id, kept) = send(later.url.clone(), Some(context.clone())).await;
            assert_eq!(&kept, context, "the worker kept the context");
            let now = placed(later, &reps, None, &id).await;
            assert_eq!(
                now, *at,
                "{id} in context {context} ran on {now}, its context on {at}"
            );
            all.push(Child {
                id,
                tenant: None,
                bind,
                at: now,
            });
        }
    }
    let mut fresh = Vec::new();
    for n in 0..4 {
        let context = format!("ctx-{}-{n}-{}", std::process::id(), redis);
        let (id, kept) = send(later.url.clone(), Some(context.clone())).await;
        assert_eq!(kept, context);
        let at = placed(later, &reps, None, &id).await;
        fresh.push(Child {
            id,
            tenant: None,
            bind,
            at,
        });
    }
    assert_spread(&fresh, 2, "sends in contexts never seen are balanced");
    all.extend(fresh);
    assert_eq!(cancels(&reps).await, vec![0, 0]);
    assert_no_foreign_ids(&a, &reps, &all);
}

scenarios! {
    rust_jsonrpc_context_goes_to_its_replica => context_goes_to_its_replica(Kind::Rust, Bind::JsonRpc, false);
    python_rest_context_goes_to_its_replica_on_redis => context_goes_to_its_replica(Kind::Python, Bind::Rest, true);
}

scenarios! {
    rust_jsonrpc_continuation_goes_to_its_replica => continuation_goes_to_its_replica(Kind::Rust, Bind::JsonRpc);
    python_rest_continuation_goes_to_its_replica => continuation_goes_to_its_replica(Kind::Python, Bind::Rest);
}

// ── gRPC ───────────────────────────────────────────────────────────────────

/// A route over the replicas' gRPC ports: eight gRPC streaming callers
/// spread over both; gRPC `GetTask` through the gateway finds every task;
/// the callers leave (RST_STREAM, or the connection dropped): each child
/// CANCELED on its own replica within 1 s, one `CancelTask` each.
async fn grpc_callers(kind: Kind) {
    let reps = replicas::start_grpc(kind, 2, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "")).await;
    let mut calls: Vec<(RawGrpc, RawCall)> = Vec::new();
    let mut children = Vec::new();
    for i in 0..8 {
        let tenant = if i % 3 == 1 { "acme" } else { "" };
        let (conn, call, id) = start_streaming(&gw.url, LONG, tenant).await;
        let t = (!tenant.is_empty()).then_some("acme");
        let at = placed(&gw, &reps, t, &id).await;
        calls.push((conn, call));
        children.push(Child {
            id,
            tenant: t,
            bind: Bind::JsonRpc,
            at,
        });
    }
    assert_spread(&children, 2, "both replicas take some");
    let mut asker = RawGrpc::connect(&gw.url).await;
    for c in &children {
        let task = asker
            .get_task(c.tenant.unwrap_or(""), &c.id)
            .await
            .unwrap_or_else(|e| panic!("gRPC GetTask {} through the gateway: {e:?}", c.id));
        assert_eq!(task.id, c.id);
    }
    asker.close().await;
    let mut kept = Vec::new();
    for (i, (conn, call)) in calls.into_iter().enumerate() {
        if i % 2 == 0 {
            call.reset().await;
            kept.push(conn);
        } else {
            drop(call);
            conn.close().await;
        }
    }
    let left = Instant::now();
    let slowest = all_canceled(&gw, &reps, &children, left, left + scaled_secs(1)).await;
    eprintln!("{kind:?}/grpc: every child CANCELED on its replica within {slowest:?}");
    tokio::time::sleep(scaled_ms(300)).await;
    assert_cancels_per_replica(&gw, &reps, &children).await;
    assert_eq!(gw.counter("a2agw_cancel_attempts_total", &[]).await, 8.0);
    assert_no_foreign_ids(&gw, &reps, &children);
    drop(kept);
}

scenarios! {
    rust_grpc_callers => grpc_callers(Kind::Rust);
    python_grpc_callers => grpc_callers(Kind::Python);
}

// ── Callers that leave before the first event ──────────────────────────────

/// Callers that send and leave (FIN) before any event named their task: the
/// gateway finds each child by its message id on the replica that took the
/// send, and cancels it there. `text`/`after`: what the worker does and
/// when the caller leaves (the Python agent's `late:` names the task only
/// after a second).
async fn leaving_at_once(kind: Kind, text: &str, after: Duration) {
    let reps = replicas::start(kind, 2, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "")).await;
    let headers = [
        ("content-type", "application/json"),
        ("accept", "text/event-stream"),
    ];
    let n = 4;
    for i in 0..n {
        let msg = message(text);
        let (path, body) = if i % 2 == 0 {
            (
                "/",
                json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
                    "params": {"message": msg}}),
            )
        } else {
            ("/message:stream", json!({ "message": msg }))
        };
        send_and_leave(&gw.url, path, &headers, body.to_string().as_bytes(), after).await;
    }
    let mut held = Vec::new();
    for _ in 0..scaled_count(300) {
        held = task_ids(&reps, None).await;
        if held.iter().map(Vec::len).sum::<usize>() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let children: Vec<Child> = held
        .iter()
        .enumerate()
        .flat_map(|(at, ids)| {
            ids.iter().map(move |id| Child {
                id: id.clone(),
                tenant: None,
                bind: Bind::JsonRpc,
                at,
            })
        })
        .collect();
    assert_eq!(
        children.len(),
        n,
        "the replicas started the tasks: {held:?}"
    );
    assert!(
        held.iter().all(|ids| !ids.is_empty()),
        "both replicas take some: {held:?}"
    );
    let now = Instant::now();
    all_canceled(&gw, &reps, &children, now, now + scaled_secs(2)).await;
    tokio::time::sleep(scaled_ms(300)).await;
    assert_cancels_per_replica(&gw, &reps, &children).await;
    assert_eq!(
        gw.counter("a2agw_unreachable_children_total", &[]).await,
        0.0
    );
    assert_no_foreign_ids(&gw, &reps, &children);
}

scenarios! {
    rust_leaving_at_once => leaving_at_once(Kind::Rust, LONG, Duration::ZERO);
    python_leaving_at_once => leaving_at_once(Kind::Python, LONG, Duration::ZERO);
    // The worker names the task only after 1 s; the caller left at 300 ms.
    python_leaving_before_a_late_first_event => leaving_at_once(Kind::Python, "late:1000:work:30000", Duration::from_millis(300));
}

// ── 2. Two gateway replicas on Redis; gateway A SIGKILLed ──────────────────

/// The lease grant in the scenario (not scaled).
const TTL: Duration = Duration::from_millis(2000);
/// How often the test renews the leases it keeps (part of the scenario).
const RENEW_EVERY: Duration = Duration::from_millis(250);

/// A streaming send through `url` granting a lease of [`TTL`] (metadata,
/// the message's `extensions` and `A2A-Extensions`); the open stream, the
/// task id and when its first event naming the task arrived.
async fn leased_stream(url: &str, text: &str) -> (SseStream, String, Instant) {
    let mut msg = message(text);
    msg["metadata"] = json!({ "a2a-rust.com/lease": { "ttlMs": TTL.as_millis() as u64 } });
    msg["extensions"] = json!([LEASE_URI]);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": msg}});
    let mut s = SseStream::open(url, "/", &[("a2a-extensions", LEASE_URI)], &body).await;
    assert_eq!(s.status, 200);
    let id = s.task_id().await;
    (s, id, Instant::now())
}

/// Renews the lease of `id` through `url` every [`RENEW_EVERY`] (GetTask
/// with the lease extension active) until `stop`; each renewal must find
/// the task WORKING. The moment the last renewal was answered.
fn renew_until(url: String, id: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Instant> {
    tokio::spawn(async move {
        let mut last = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(RENEW_EVERY).await;
            let body = json!({"jsonrpc": "2.0", "id": 9, "method": "GetTask",
                "params": {"id": id}});
            let r = post_json(&url, "/", &[("a2a-extensions", LEASE_URI)], &body).await;
            let v = r.json();
            assert_eq!(
                v["result"]["status"]["state"],
                WORKING,
                "renewing {id} through {url}: {}",
                r.text()
            );
            last = Instant::now();
        }
        last
    })
}

/// Two gateways on one Redis, the same route over two worker replicas.
/// Leased children (2 s) are started through A until each replica runs
/// one; the ones on replica 1 are renewed through B. A is SIGKILLed: B
/// cancels replica 2's children there within TTL + 1 s of their start;
/// replica 1 gets no cancel while B renews its children (B's `GetTask`s
/// find them: they go to replica 1). Then the renewals stop and B cancels
/// replica 1's children on replica 1 within TTL + 1 s of the last.
async fn gateway_killed_lease_lapses_on_its_replica(kind: Kind) {
    let redis = RedisServer::start().await;
    let reps = replicas::start(kind, 2, Front::Relayed).await;
    let cfg = format!("[store]\nurl = \"{}\"\n\n{}", redis.url(), route(&reps, ""));
    let mut a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut streams = Vec::new();
    let mut children = Vec::new();
    let mut started = HashMap::new();
    let mut renewers = Vec::new();
    for _ in 0..6 {
        let (s, id, at_start) = leased_stream(&a.url, LONG).await;
        streams.push(s);
        let at = index_of(&reps, &admin_replica(&a, &id).await);
        assert_eq!(
            holder(&reps, None, &id).await,
            at,
            "{id} runs where recorded"
        );
        if at == 0 {
            renewers.push((
                id.clone(),
                renew_until(b.url.clone(), id.clone(), stop.clone()),
            ));
        }
        started.insert(id.clone(), at_start);
        children.push(Child {
            id,
            tenant: None,
            bind: Bind::JsonRpc,
            at,
        });
        if per_replica(&children, 2).iter().all(|&k| k > 0) {
            break;
        }
    }
    let spread = per_replica(&children, 2);
    assert!(
        spread.iter().all(|&k| k > 0),
        "six sends through A never reached both replicas: {spread:?}"
    );
    a.kill().await;
    for c in children.iter().filter(|c| c.at == 1) {
        let deadline = started[&c.id] + TTL + scaled_ms(1000);
        reps[1]
            .worker()
            .wait_state(
                None,
                &c.id,
                CANCELED,
                deadline.saturating_duration_since(Instant::now()),
            )
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "{} not CANCELED on replica 2 within TTL + 1 s ({s:?}); B's log:\n{}\nA's log:\n{}",
                    c.id,
                    b.log_text(),
                    a.log_text()
                )
            });
    }
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(
        cancels(&reps).await,
        vec![0, spread[1]],
        "replica 1 got no cancel; replica 2 one per child; B's log:\n{}",
        b.log_text()
    );
    for c in children.iter().filter(|c| c.at == 0) {
        assert_eq!(
            reps[0].worker().state(None, &c.id).await.as_deref(),
            Some(WORKING),
            "{} kept by its renewals",
            c.id
        );
    }
    assert_eq!(
        b.counter_reaching("a2agw_leases_lapsed_total", &[], spread[1] as f64)
            .await,
        spread[1] as f64
    );

    stop.store(true, Ordering::SeqCst);
    for (id, h) in renewers {
        let last = h.await.expect("the renewer found its task every time");
        let deadline = last + TTL + scaled_ms(1000);
        reps[0]
            .worker()
            .wait_state(
                None,
                &id,
                CANCELED,
                deadline.saturating_duration_since(Instant::now()),
            )
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "{id} not CANCELED on replica 1 within TTL + 1 s of its last renewal ({s:?}); \
                     B's log:\n{}",
                    b.log_text()
                )
            });
    }
    tokio::time::sleep(scaled_ms(300)).await;
    assert_cancels_per_replica(&b, &reps, &children).await;
    assert_no_foreign_ids(&b, &reps, &children);
    drop(streams);
}

scenarios! {
    rust_gateway_killed_lease_lapses_on_its_replica => gateway_killed_lease_lapses_on_its_replica(Kind::Rust);
    python_gateway_killed_lease_lapses_on_its_replica => gateway_killed_lease_lapses_on_its_replica(Kind::Python);
}

// ── 3. A worker replica killed mid-run ─────────────────────────────────────

/// The route's `health_interval` (part of the scenario).
const HEALTH: Duration = Duration::from_secs(1);

/// Three replicas (`health_interval = "1s"`, cancels tried 3 times), three
/// streaming children on each. Replica 3 is killed (a Python replica
/// SIGKILLed; an a2a-rust one cut off by dropping its relay). Within the
/// health interval plus 1 s the gateway reports it down and new sends all
/// go to the other two and all succeed. The callers of the dead replica's
/// tasks leave (and ask for them once): no cancel reaches a live replica,
/// and no call naming those tasks either. The other callers then leave and
/// their children are CANCELED on their own replicas. Last, the dead
/// replica's tasks were counted in `a2agw_tasks_lost_total`, once each.
async fn replica_killed(kind: Kind) {
    let fronts = match kind {
        Kind::Python => [Front::Relayed, Front::Relayed, Front::Direct],
        Kind::Rust => [Front::Relayed; 3],
    };
    let mut reps = replicas::start_fronts(kind, &fronts).await;
    let gw = Gateway::start(&format!(
        "[cancel]\nattempts = 3\ntimeout = \"1s\"\nbackoff = \"100ms\"\nbackoff_max = \"200ms\"\n\n{}",
        route(&reps, "health_interval = \"1s\"")
    ))
    .await;
    let mut streams = Vec::new();
    let mut children = Vec::new();
    for i in 0..9 {
        let bind = if i % 2 == 0 {
            Bind::JsonRpc
        } else {
            Bind::Rest
        };
        let (s, id) = send_stream(&gw.url, bind, None, LONG).await;
        let at = placed(&gw, &reps, None, &id).await;
        streams.push(s);
        children.push(Child {
            id,
            tenant: None,
            bind,
            at,
        });
    }
    assert_spread(&children, 3, "every replica takes some");
    let dead = 2;
    let dead_authority = reps[dead].authority();
    reps[dead].kill().await;
    let killed = Instant::now();

    tokio::time::sleep_until(killed + HEALTH + scaled_ms(1000)).await;
    assert_eq!(
        replica_up(&gw, &dead_authority).await,
        Some(0.0),
        "the killed replica is reported down within the health interval + 1 s; metrics:\n{}",
        gw.metrics().await
    );
    for r in reps.iter().filter(|r| r.alive()) {
        assert_eq!(replica_up(&gw, &r.authority()).await, Some(1.0));
    }
    let mut later = Vec::new();
    for i in 0..6 {
        let bind = if i % 2 == 0 {
            Bind::JsonRpc
        } else {
            Bind::Rest
        };
        let (s, id) = send_stream(&gw.url, bind, None, LONG).await;
        let at = placed(&gw, &reps, None, &id).await;
        assert_ne!(at, dead);
        streams.push(s);
        later.push(Child {
            id,
            tenant: None,
            bind,
            at,
        });
    }
    assert!(
        (0..3)
            .filter(|&k| k != dead)
            .all(|k| later.iter().any(|c| c.at == k)),
        "new sends go to both live replicas"
    );

    // The dead replica's callers leave; the cancels of its tasks cannot
    // connect (3 tries, 300 ms of backoff between them).
    let lost: Vec<String> = children
        .iter()
        .filter(|c| c.at == dead)
        .map(|c| c.id.clone())
        .collect();
    let mut kept_streams = Vec::new();
    for (s, c) in streams.into_iter().zip(children.iter().chain(later.iter())) {
        if c.at == dead {
            s.close();
        } else {
            kept_streams.push(s);
        }
    }
    // Asked for, a lost task is not looked for on another replica.
    for id in &lost {
        let r = request("GET", &gw.url, &format!("/tasks/{id}"), &[], b"").await;
        eprintln!(
            "{kind:?}: GetTask of lost {id} through the gateway: {} {}",
            r.status,
            r.text()
        );
    }
    tokio::time::sleep(scaled_ms(1000)).await;
    let mut live_cancels = cancels(&reps).await;
    live_cancels[dead] = 0;
    assert_eq!(
        live_cancels,
        vec![0; 3],
        "no cancel reached a live replica; log:\n{}",
        gw.log_text()
    );
    if kind == Kind::Rust {
        // Cut off, its server still runs: nothing reached it after the cut.
        assert_eq!(reps[dead].worker().cancels().await, 0);
        for id in &lost {
            assert_eq!(
                reps[dead].worker().state(None, id).await.as_deref(),
                Some(WORKING)
            );
        }
    }
    let all: Vec<Child> = children.into_iter().chain(later).collect();
    assert_no_foreign_ids(&gw, &reps, &all);

    // The others' callers leave: cancelled where they run.
    drop(kept_streams);
    let live: Vec<Child> = all.into_iter().filter(|c| c.at != dead).collect();
    let left = Instant::now();
    all_canceled(&gw, &reps, &live, left, left + scaled_secs(1)).await;
    tokio::time::sleep(scaled_ms(300)).await;
    let mut got = cancels(&reps).await;
    got[dead] = 0;
    assert_eq!(got, per_replica(&live, 3), "log:\n{}", gw.log_text());
    assert_no_foreign_ids(&gw, &reps, &live);

    // The dead replica's tasks were counted lost, each once.
    let n_lost = lost.len() as f64;
    assert_eq!(
        gw.counter_reaching("a2agw_tasks_lost_total", &["route=\"w\""], n_lost)
            .await,
        n_lost,
        "the dead replica's tasks {lost:?} are counted lost; log:\n{}",
        gw.log_text()
    );
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(
        gw.counter("a2agw_tasks_lost_total", &["route=\"w\""]).await,
        n_lost,
        "each lost task counted once"
    );
}

scenarios! {
    rust_replica_cut_off => replica_killed(Kind::Rust);
    python_replica_killed => replica_killed(Kind::Python);
}

// ── A replica gone from the config ─────────────────────────────────────────

/// Reloads the gateway's config with `body`; waits until the reload is
/// applied (`a2agw_config_reloads_total{outcome="applied"}` 1).
async fn reload(gw: &Gateway, body: &str) {
    gw.rewrite_config(body);
    gw.hangup();
    let mut applied = 0.0;
    for _ in 0..scaled_count(250) {
        applied = gw
            .counter("a2agw_config_reloads_total", &["outcome=\"applied\""])
            .await;
        if applied >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(applied, 1.0, "reload applied; log:\n{}", gw.log_text());
}

/// A fire-and-poll send (`returnImmediately`) of `text` through `url`: the
/// task id.
async fn fire(url: &str, text: &str) -> String {
    let (path, body) = send_message(
        Bind::JsonRpc,
        None,
        text,
        json!({"returnImmediately": true}),
    );
    let r = post_json(url, &path, &[], &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    answered_task(&r)["id"].as_str().unwrap().to_string()
}

/// Replicas 1 and 2 of `n` in the route, poll-leased children on each; a
/// reload leaves the replicas `after` (replica 2 gone), and the polls stop
/// after one `GetTask` each through the gateway. New sends go to the
/// replicas left only. Replica 1's children are CANCELED there when their
/// leases lapse; replica 2's get no cancel from anyone, nothing about them
/// (the `GetTask`, the lapse's probe) reaches another replica, and they are
/// counted lost (`a2agw_tasks_lost_total`).
async fn removed_by_a_reload(n: usize, after: &[usize]) {
    let reps = replicas::start(Kind::Rust, n, Front::Relayed).await;
    let keys = "poll_lease = \"2s\"";
    let gw = Gateway::start(&route_over(&reps, &[0, 1], keys)).await;
    let mut children = Vec::new();
    while !per_replica(&children, n)[..2].iter().all(|&k| k > 0) {
        assert!(children.len() < 4, "four sends never reached both replicas");
        let id = fire(&gw.url, LONG).await;
        let at = placed(&gw, &reps, None, &id).await;
        children.push(Child {
            id,
            tenant: None,
            bind: Bind::JsonRpc,
            at,
        });
    }
    let spread = per_replica(&children, n);
    reload(&gw, &route_over(&reps, after, keys)).await;
    let mut last = HashMap::new();
    for c in &children {
        let r = post_json(
            &gw.url,
            "/",
            &[],
            &json!({"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": c.id}}),
        )
        .await;
        last.insert(c.id.clone(), Instant::now());
        if c.at == 0 {
            assert_eq!(
                r.json()["result"]["status"]["state"],
                WORKING,
                "{}",
                r.text()
            );
        } else {
            // Its replica is gone from the route: the call is balanced,
            // and the caller gets a remaining worker's own answer (it does
            // not know the task), not the gateway's guess.
            assert_eq!(
                r.json()["error"]["code"],
                -32001,
                "GetTask of {} (on replica 2, removed): {}",
                c.id,
                r.text()
            );
        }
    }
    let mut later = Vec::new();
    for _ in 0..4 {
        let (mut s, id) = send_stream(&gw.url, Bind::Rest, None, "quick").await;
        let events = s.rest(scaled_secs(5)).await;
        assert_eq!(
            events.iter().rev().find_map(state_of).as_deref(),
            Some(COMPLETED)
        );
        s.close();
        let at = if after.len() > 1 {
            placed(&gw, &reps, None, &id).await
        } else {
            holder(&reps, None, &id).await
        };
        assert!(after.contains(&at), "a new send went to replica {at}");
        later.push(Child {
            id,
            tenant: None,
            bind: Bind::Rest,
            at,
        });
    }
    for c in children.iter().filter(|c| c.at == 0) {
        let deadline = last[&c.id] + POLL + scaled_ms(1000);
        reps[0]
            .worker()
            .wait_state(
                None,
                &c.id,
                CANCELED,
                deadline.saturating_duration_since(Instant::now()),
            )
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "{} not CANCELED on replica 1 ({s:?}); log:\n{}",
                    c.id,
                    gw.log_text()
                )
            });
    }
    let n_lost = spread[1] as f64;
    let counted = gw
        .counter_reaching("a2agw_tasks_lost_total", &["route=\"w\""], n_lost)
        .await;
    tokio::time::sleep(scaled_ms(300)).await;
    let mut want = vec![0; n];
    want[0] = spread[0];
    assert_eq!(
        cancels(&reps).await,
        want,
        "replica 1 cancels its own; replica 2, gone from the route, gets none; log:\n{}",
        gw.log_text()
    );
    for c in children.iter().filter(|c| c.at == 1) {
        assert_eq!(
            reps[1].worker().state(None, &c.id).await.as_deref(),
            Some(WORKING),
            "{} runs on: nobody may cancel it",
            c.id
        );
    }
    eprintln!(
        "after the reload to {after:?}: {counted} of replica 2's {n_lost} tasks counted lost"
    );
    // No call for a task that runs on replica 1 went elsewhere (replica
    // 2's tasks were asked for on replica 1 by their callers' GetTask,
    // above, and nothing else: replica 1 got no cancel for them).
    let kept: Vec<Child> = children
        .into_iter()
        .filter(|c| c.at == 0)
        .chain(later)
        .collect();
    assert_no_foreign_ids(&gw, &reps, &kept);
    assert_eq!(
        counted,
        n_lost,
        "replica 2's tasks are counted lost; log:\n{}",
        gw.log_text()
    );
}

/// Replica 2 replaced by replica 3 (a pod rescheduled under a new address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_replaced_by_a_reload() {
    removed_by_a_reload(3, &[0, 2]).await;
}

/// The route scaled down to replica 1 alone (`workers` of one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_scaled_down_to_one_by_a_reload() {
    removed_by_a_reload(2, &[0]).await;
}

/// A stream open across a reload that removes its replica: its caller then
/// leaves. Whatever the gateway does with the child (the request keeps the
/// route it matched, which still names replica 2, or the task is counted
/// lost), nothing about it reaches replica 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_across_a_reload_that_removes_its_replica() {
    let reps = replicas::start(Kind::Rust, 2, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "")).await;
    let mut streams = Vec::new();
    let mut children = Vec::new();
    while !per_replica(&children, 2).iter().all(|&k| k > 0) {
        assert!(children.len() < 4, "four sends never reached both replicas");
        let (s, id) = send_stream(&gw.url, Bind::JsonRpc, None, LONG).await;
        let at = placed(&gw, &reps, None, &id).await;
        streams.push(s);
        children.push(Child {
            id,
            tenant: None,
            bind: Bind::JsonRpc,
            at,
        });
    }
    reload(&gw, &route(&reps[..1], "")).await;
    let mut on_1 = Vec::new();
    let mut on_2 = Vec::new();
    for (s, c) in streams.into_iter().zip(&children) {
        if c.at == 1 {
            s.close();
            on_2.push(c);
        } else {
            on_1.push(s);
        }
    }
    tokio::time::sleep(scaled_ms(1000)).await;
    let lost = gw.counter("a2agw_tasks_lost_total", &["route=\"w\""]).await;
    for c in &on_2 {
        eprintln!(
            "replica 2's {} after its caller left: {:?} there; {} cancel(s) on replica 2; \
             lost counted {lost}",
            c.id,
            reps[1].worker().state(None, &c.id).await,
            reps[1].worker().cancels().await
        );
    }
    assert_eq!(
        reps[0].worker().cancels().await,
        0,
        "log:\n{}",
        gw.log_text()
    );
    assert_no_foreign_ids(&gw, &reps, &children);
    drop(on_1);
}

// ── 4. Blocking sends and fire-and-poll on a replicated route ──────────────

/// The path and body of a `SendMessage` of `text` (`conf`: its
/// configuration).
fn send_message(bind: Bind, tenant: Option<&str>, text: &str, conf: Value) -> (String, Value) {
    let msg = message(text);
    match bind {
        Bind::JsonRpc => {
            let mut params = json!({ "message": msg, "configuration": conf });
            if let Some(t) = tenant {
                params["tenant"] = json!(t);
            }
            (
                "/".into(),
                json!({"jsonrpc": "2.0", "id": 11, "method": "SendMessage", "params": params}),
            )
        }
        Bind::Rest => (
            tenant_path(tenant, "/message:send"),
            json!({ "message": msg, "configuration": conf }),
        ),
    }
}

/// The task of a `SendMessage` answer (JSON-RPC `result` or REST body).
fn answered_task(r: &crate::harness::http::Response) -> Value {
    let v = r.json();
    let task = v.get("result").unwrap_or(&v)["task"].clone();
    assert!(task["id"].is_string(), "a task: {}", r.text());
    task
}

/// Waits for one task no replica held in `known` to appear in a replica's
/// store; (replica, id).
async fn new_task(
    reps: &[Replica],
    tenant: Option<&str>,
    known: &BTreeSet<String>,
) -> (usize, String) {
    for _ in 0..scaled_count(200) {
        for (at, ids) in task_ids(reps, tenant).await.into_iter().enumerate() {
            if let Some(id) = ids.into_iter().find(|id| !known.contains(id)) {
                return (at, id);
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no replica started the task");
}

/// Blocking `SendMessage`s on a replicated route behave as on one worker:
/// four that complete are answered COMPLETED by the replica that ran them
/// (spread over both, nobody cancels them); two whose caller leaves (FIN,
/// then RST) after the child runs get it CANCELED on its own replica within
/// 1 s, by one `CancelTask` (guarded: found by their message in the
/// `ListTasks` of the replica that took them).
async fn blocking_sends(kind: Kind, bind: Bind, tenant: Option<&'static str>) {
    let reps = replicas::start(kind, 2, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "")).await;
    let mut known = BTreeSet::new();
    let mut done = Vec::new();
    for _ in 0..4 {
        let (path, body) = send_message(bind, tenant, "work:200", json!({}));
        let r = post_json(&gw.url, &path, &[], &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let task = answered_task(&r);
        assert_eq!(task["status"]["state"], COMPLETED, "{task}");
        let id = task["id"].as_str().unwrap().to_string();
        let at = placed(&gw, &reps, tenant, &id).await;
        assert_eq!(
            reps[at].worker().state(tenant, &id).await.as_deref(),
            Some(COMPLETED)
        );
        known.insert(id.clone());
        done.push(Child {
            id,
            tenant,
            bind,
            at,
        });
    }
    assert_spread(&done, 2, "both replicas take some");
    let mut cancelled = Vec::new();
    for reset in [false, true] {
        let (path, body) = send_message(bind, tenant, LONG, json!({}));
        let sock = open_post_json(&gw.url, &path, &body).await;
        let (at, id) = new_task(&reps, tenant, &known).await;
        known.insert(id.clone());
        reps[at]
            .worker()
            .wait_state(tenant, &id, WORKING, scaled_secs(5))
            .await
            .expect("the task runs");
        // Guarded, the send passed as it came: nothing has named its task
        // to the gateway yet; its caller leaving has it looked up by its
        // message on the replica the send went to.
        leave(sock, reset).await;
        let left = Instant::now();
        let child = Child {
            id,
            tenant,
            bind,
            at,
        };
        all_canceled(
            &gw,
            &reps,
            std::slice::from_ref(&child),
            left,
            left + scaled_secs(1),
        )
        .await;
        cancelled.push(child);
    }
    tokio::time::sleep(scaled_ms(300)).await;
    assert_cancels_per_replica(&gw, &reps, &cancelled).await;
    for c in &done {
        assert_eq!(
            reps[c.at].worker().state(tenant, &c.id).await.as_deref(),
            Some(COMPLETED)
        );
    }
    assert_eq!(
        gw.counter("a2agw_blocking_sends_total", &["outcome=\"guarded\""])
            .await,
        6.0
    );
    let all: Vec<Child> = done.into_iter().chain(cancelled).collect();
    assert_no_foreign_ids(&gw, &reps, &all);
}

/// The routes' `poll_lease` (part of the scenario: not scaled).
const POLL: Duration = Duration::from_secs(2);
/// How often the callers poll (part of the scenario).
const POLL_EVERY: Duration = Duration::from_millis(500);

/// Fire-and-poll on a replicated route (`poll_lease = "2s"`): four
/// non-blocking sends spread over both replicas; each polled through the
/// gateway every 500 ms for 3 s, every poll finding it WORKING; then the
/// polls stop and each child is CANCELED on its own replica within
/// `poll_lease` + 1 s of its last poll, not before `poll_lease`, by one
/// `CancelTask`.
async fn fire_and_poll(kind: Kind, bind: Bind, tenant: Option<&'static str>) {
    let reps = replicas::start(kind, 2, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "poll_lease = \"2s\"")).await;
    let mut children = Vec::new();
    for _ in 0..4 {
        let (path, body) = send_message(bind, tenant, LONG, json!({"returnImmediately": true}));
        let r = post_json(&gw.url, &path, &[], &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let task = answered_task(&r);
        assert_ne!(
            task["status"]["state"], COMPLETED,
            "answered at once: {task}"
        );
        let id = task["id"].as_str().unwrap().to_string();
        let at = placed(&gw, &reps, tenant, &id).await;
        children.push(Child {
            id,
            tenant,
            bind,
            at,
        });
    }
    assert_spread(&children, 2, "both replicas take some");
    let start = Instant::now();
    let mut last = vec![start; children.len()];
    while start.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(POLL_EVERY).await;
        for (i, c) in children.iter().enumerate() {
            let task = get_through(&gw.url, bind, tenant, &c.id).await;
            last[i] = Instant::now();
            assert_eq!(task["id"], c.id.as_str(), "{task}");
            assert_eq!(
                task["status"]["state"], WORKING,
                "a polled task runs on: {task}"
            );
        }
    }
    for (i, c) in children.iter().enumerate() {
        let deadline = last[i] + POLL + scaled_ms(1000);
        reps[c.at]
            .worker()
            .wait_state(
                tenant,
                &c.id,
                CANCELED,
                deadline.saturating_duration_since(Instant::now()),
            )
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "{} not CANCELED on its replica {} within poll_lease + 1 s of its last poll \
                     ({s:?}); log:\n{}",
                    c.id,
                    c.at,
                    gw.log_text()
                )
            });
        let after = last[i].elapsed();
        assert!(
            after >= POLL - Duration::from_millis(50),
            "{} cancelled {after:?} after its last poll, before its lease ran out",
            c.id
        );
    }
    tokio::time::sleep(scaled_ms(300)).await;
    assert_cancels_per_replica(&gw, &reps, &children).await;
    assert_eq!(
        gw.counter_reaching(
            "a2agw_cancels_total",
            &["cause=\"lease_lapsed\"", "outcome=\"canceled\""],
            4.0
        )
        .await,
        4.0
    );
    assert_no_foreign_ids(&gw, &reps, &children);
}

/// Budgets on a replicated route (`meters = { tokens = 250 }`): streamed
/// children that report spend past the cap and, on the Python worker
/// (which knows nothing of budgets), children whose caller's deadline
/// passes, spread over both replicas: each stopped on its own replica
/// (CANCELED there, one `CancelTask` each, none elsewhere), each caller's
/// stream ended by the budget failure.
async fn budgets(kind: Kind) {
    const BUDGET_URI: &str = "https://a2a-rust.com/extensions/budget/v1";
    let reps = replicas::start(kind, 2, Front::Relayed).await;
    let gw = Gateway::start(&route(&reps, "[routes.budget]\nmeters = { tokens = 250 }")).await;
    let mut texts = vec![("spend:20000:tokens=100", None); 2];
    if kind == Kind::Python {
        texts.extend([("work:20000", Some(1500)); 2]);
    }
    let mut children = Vec::new();
    let mut streams = Vec::new();
    for (text, deadline_ms) in texts {
        let mut msg = message(text);
        if let Some(ms) = deadline_ms {
            msg["metadata"] = json!({ "a2a-rust.com/budget": { "remainingMs": ms } });
            msg["extensions"] = json!([BUDGET_URI]);
        }
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
            "params": {"message": msg}});
        let mut s = SseStream::open(&gw.url, "/", &[], &body).await;
        assert_eq!(s.status, 200);
        let id = s.task_id().await;
        let at = placed(&gw, &reps, None, &id).await;
        children.push(Child {
            id,
            tenant: None,
            bind: Bind::JsonRpc,
            at,
        });
        streams.push(s);
    }
    assert_spread(&children, 2, "both replicas run children");
    for (s, c) in streams.iter_mut().zip(&children) {
        let events = s.rest(scaled_secs(10)).await;
        let last = events.last().expect("the stream's last event");
        let u = &crate::harness::worker::stream_response(last)["statusUpdate"];
        assert_eq!(
            (u["taskId"].as_str(), u["status"]["state"].as_str()),
            (Some(c.id.as_str()), Some("TASK_STATE_FAILED")),
            "{last}"
        );
        assert_eq!(
            u["status"]["message"]["metadata"]["a2a-rust.com/failure"], "budget-exhausted",
            "{last}"
        );
        reps[c.at]
            .worker()
            .wait_state(None, &c.id, CANCELED, scaled_secs(3))
            .await
            .unwrap_or_else(|last| panic!("{} on replica {}: {last:?}", c.id, c.at));
    }
    tokio::time::sleep(scaled_ms(300)).await;
    assert_cancels_per_replica(&gw, &reps, &children).await;
    assert_eq!(
        gw.counter("a2agw_budget_exhausted_total", &[]).await,
        children.len() as f64
    );
    assert_no_foreign_ids(&gw, &reps, &children);
}

scenarios! {
    rust_budgets => budgets(Kind::Rust);
    python_budgets => budgets(Kind::Python);
}

scenarios! {
    rust_jsonrpc_blocking_sends => blocking_sends(Kind::Rust, Bind::JsonRpc, None);
    python_rest_tenant_blocking_sends => blocking_sends(Kind::Python, Bind::Rest, Some("acme"));
    rust_rest_tenant_fire_and_poll => fire_and_poll(Kind::Rust, Bind::Rest, Some("acme"));
    python_jsonrpc_fire_and_poll => fire_and_poll(Kind::Python, Bind::JsonRpc, None);
}
