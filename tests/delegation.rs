//! Delegation trees through the gateway, with real agents: the Python
//! `a2a-sdk` 1.3.0 worker run as parent, child and grandchild agents
//! (`spawn:`: a background child it starts and never follows; `await:`: a
//! child it streams and waits for), served inside OpenTelemetry's ASGI
//! middleware with its own httpx instrumentation (`--otel`), as an
//! instrumented agent is; and a2a-rust 0.15 agents whose client carries
//! the trace headers through an interceptor. Nothing in the agents knows
//! of the gateway: the only link between a parent's task and its child's
//! is the trace context the parent's client propagates (or a caller's
//! `A2A-Parent-Task`). Every assertion is on the agents' own task states,
//! cancel counts and stored messages, and on the gateway's metrics and
//! exported spans.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, wait_for_state};
use crate::harness::python_worker::PythonWorker;
use crate::harness::redis::RedisServer;
use crate::harness::{scaled_ms, scaled_secs};

const CANCELED: &str = "TASK_STATE_CANCELED";
const WORKING: &str = "TASK_STATE_WORKING";

/// Routes `p`, `c` and `d` (path prefixes) to the three agents.
fn routes(p: &PythonWorker, c: &PythonWorker, d: &PythonWorker, p_extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"p\"\npath_prefix = \"/p\"\nworker = \"{}\"\n{p_extra}\n\n\
         [[routes]]\nname = \"c\"\npath_prefix = \"/c\"\nworker = \"{}\"\n\n\
         [[routes]]\nname = \"d\"\npath_prefix = \"/d\"\nworker = \"{}\"\n",
        p.url(),
        c.url(),
        d.url()
    )
}

async fn agents() -> (PythonWorker, PythonWorker, PythonWorker) {
    let (p, c, d) = tokio::join!(
        PythonWorker::start_with_args(&["--otel"]),
        PythonWorker::start_with_args(&["--otel"]),
        PythonWorker::start_with_args(&["--otel"]),
    );
    (p, c, d)
}

fn message(text: &str) -> Value {
    json!({
        "messageId": format!("root-{}", unique()),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    })
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed) + u64::from(std::process::id()) * 1_000_000
}

/// A root's trace.
const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A non-blocking `SendMessage` to `path` on the gateway; the task's id.
async fn send_detached(gw: &str, path: &str, text: &str) -> String {
    send_detached_with(gw, path, &[], text).await
}

async fn send_detached_with(gw: &str, path: &str, headers: &[(&str, &str)], text: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": "root", "method": "SendMessage",
        "params": {"message": message(text), "configuration": {"returnImmediately": true}}});
    let r = post_json(gw, path, headers, &body).await;
    let v = r.json();
    v["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no task in {v}"))
        .to_owned()
}

/// The one child `agent` started (`spawn:`), once its send was answered.
async fn child_of(agent: &PythonWorker) -> String {
    for _ in 0..crate::harness::scaled_count(400) {
        let s = agent.stats().await;
        if let Some(c) = s["children"].as_array().and_then(|c| c.first()) {
            if let Some(id) = c["task_id"].as_str() {
                return id.to_owned();
            }
            assert!(c["error"].is_null(), "the child's send failed: {c}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no child started: {}", agent.stats().await);
}

/// `CancelTask` through the gateway, as a root caller sends it.
async fn cancel_through(gw: &str, path: &str, id: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": "root-cancel", "method": "CancelTask",
        "params": {"id": id}});
    post_json(gw, path, &[], &body).await.json()
}

async fn cancels(agent: &PythonWorker) -> u64 {
    agent.stats().await["cancels"].as_u64().unwrap()
}

/// The tree P → C → D, each started in the background by its parent.
async fn start_tree(
    gw: &str,
    p: &PythonWorker,
    c: &PythonWorker,
    d: &PythonWorker,
) -> (String, String, String) {
    let p_task = send_detached(gw, "/p", &tree(gw, gw)).await;
    let c_task = child_of(p).await;
    let d_task = child_of(c).await;
    for (agent, id) in [(p, &p_task), (c, &c_task), (d, &d_task)] {
        wait_for_state(&agent.url(), None, id, WORKING, scaled_secs(5))
            .await
            .unwrap_or_else(|s| panic!("{id} not WORKING: {s:?}"));
    }
    (p_task, c_task, d_task)
}

/// Waits until `agent` holds task `id` CANCELED, for at most `within`;
/// panics naming `what` with the gateway's log otherwise. How long it took.
async fn cancelled(
    agent: &PythonWorker,
    id: &str,
    within: Duration,
    what: &str,
    gw: &Gateway,
) -> Duration {
    wait_for_state(&agent.url(), None, id, CANCELED, within)
        .await
        .unwrap_or_else(|s| panic!("{what} not cancelled: {s:?}\n{}", gw.log_text()))
}

/// P's text for the tree P → C → D: C started in the background through
/// the gateway at `c_gw`, D by C through `d_gw`, each working a minute.
fn tree(c_gw: &str, d_gw: &str) -> String {
    format!("spawn:60000@{c_gw}/c@spawn:60000@{d_gw}/d@work:60000")
}

/// P's child, then its grandchild, each cancelled within a hop.
async fn descendants_cancelled(
    c: &PythonWorker,
    c_task: &str,
    d: &PythonWorker,
    d_task: &str,
    gw: &Gateway,
) {
    cancelled(c, c_task, per_hop(), "child", gw).await;
    cancelled(d, d_task, per_hop(), "grandchild", gw).await;
}

/// Each hop's cancel lands within this of the one above it.
fn per_hop() -> Duration {
    scaled_secs(1)
}

#[tokio::test]
async fn root_cancel_cancels_the_detached_child_and_grandchild() {
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    let (p_task, c_task, d_task) = start_tree(&gw.url, &p, &c, &d).await;

    let answer = cancel_through(&gw.url, "/p", &p_task).await;
    assert_eq!(answer["result"]["status"]["state"], CANCELED, "{answer}");
    let to_c = cancelled(&c, &c_task, per_hop(), "child", &gw).await;
    let to_d = cancelled(&d, &d_task, per_hop(), "grandchild", &gw).await;
    eprintln!("tree cancel: child after {to_c:?}, grandchild {to_d:?} after that");
    // One CancelTask each: the root's for P, the gateway's for C and D.
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(
        (cancels(&p).await, cancels(&c).await, cancels(&d).await),
        (1, 1, 1)
    );
    assert_eq!(
        gw.counter(
            "a2agw_tree_links_total",
            &["route=\"c\"", "outcome=\"child\""]
        )
        .await,
        1.0
    );
    assert_eq!(
        gw.counter(
            "a2agw_tree_cancels_total",
            &[
                "route=\"d\"",
                "cause=\"parent_canceled\"",
                "outcome=\"canceled\""
            ]
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn the_root_leaving_cancels_the_tree() {
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    let text = tree(&gw.url, &gw.url);
    let body = json!({"jsonrpc": "2.0", "id": "root", "method": "SendStreamingMessage",
        "params": {"message": message(&text)}});
    // The root streams P's task, then leaves once the grandchild runs.
    let sock = crate::harness::http::open_post_json(&gw.url, "/p", &body).await;
    let c_task = child_of(&p).await;
    let d_task = child_of(&c).await;
    wait_for_state(&d.url(), None, &d_task, WORKING, scaled_secs(5))
        .await
        .unwrap();
    let p_task = p.stats().await["task_ids"][0].as_str().unwrap().to_owned();
    crate::harness::http::leave(sock, true).await;
    cancelled(&p, &p_task, per_hop(), "parent", &gw).await;
    descendants_cancelled(&c, &c_task, &d, &d_task, &gw).await;
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(
        (cancels(&p).await, cancels(&c).await, cancels(&d).await),
        (1, 1, 1)
    );
}

/// A child sent with only the caller's `traceparent` (no `tracestate`) is
/// not linked: the same trace is no proof of parenthood.
#[tokio::test]
async fn no_link_without_the_gateways_reference() {
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    let p_task = send_detached(
        &gw.url,
        "/p",
        &format!("spawnbare:60000@{}/c@work:60000", gw.url),
    )
    .await;
    let c_task = child_of(&p).await;
    let answer = cancel_through(&gw.url, "/p", &p_task).await;
    assert_eq!(answer["result"]["status"]["state"], CANCELED, "{answer}");
    tokio::time::sleep(per_hop() + scaled_ms(500)).await;
    assert_eq!(c.state(None, &c_task).await.as_deref(), Some(WORKING));
    assert_eq!(cancels(&c).await, 0);
    assert_eq!(
        gw.counter("a2agw_tree_links_total", &["route=\"c\""]).await,
        0.0
    );
}

/// A child that settled input-required is handed back, not cancelled; a
/// task of another tree beside it is not touched.
#[tokio::test]
async fn a_handed_back_child_and_another_tree_are_left_alone() {
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    // Tree 1: P1 → C (asks for input). Tree 2, another root in the same
    // trace: X (on C's agent) → D (works).
    let p1 = send_detached_with(
        &gw.url,
        "/p",
        &[("traceparent", TRACE)],
        &format!("spawn:60000@{}/c@ask", gw.url),
    )
    .await;
    let asked = child_of(&p).await;
    wait_for_state(
        &c.url(),
        None,
        &asked,
        "TASK_STATE_INPUT_REQUIRED",
        scaled_secs(5),
    )
    .await
    .unwrap();
    let _p2 = send_detached_with(
        &gw.url,
        "/c",
        &[("traceparent", TRACE)],
        &format!("spawn:60000@{}/d@work:60000", gw.url),
    )
    .await;
    let d_task = child_of(&c).await;
    let answer = cancel_through(&gw.url, "/p", &p1).await;
    assert_eq!(answer["result"]["status"]["state"], CANCELED, "{answer}");
    tokio::time::sleep(per_hop() + scaled_ms(500)).await;
    assert_eq!(
        c.state(None, &asked).await.as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED")
    );
    assert_eq!(d.state(None, &d_task).await.as_deref(), Some(WORKING));
    assert_eq!((cancels(&c).await, cancels(&d).await), (0, 0));
    assert_eq!(
        gw.counter(
            "a2agw_tree_cancels_total",
            &["route=\"c\"", "outcome=\"settled\""]
        )
        .await,
        1.0
    );
}

/// A parent that completes leaves its running children by default; a route
/// with `on_parent_completed = "cancel"` takes them with it, whether the
/// parent's completion came on a stream or as a blocking send's answer
/// (which that setting has read).
#[tokio::test]
async fn a_completed_parent_keeps_or_cancels_its_children_as_the_route_says() {
    let (p, c, d) = agents().await;
    for (extra, want, method) in [
        ("", WORKING, "SendStreamingMessage"),
        ("", WORKING, "SendMessage"),
        (
            "on_parent_completed = \"cancel\"",
            CANCELED,
            "SendStreamingMessage",
        ),
        ("on_parent_completed = \"cancel\"", CANCELED, "SendMessage"),
    ] {
        let gw = Gateway::start(&routes(&p, &c, &d, extra)).await;
        let before = c.stats().await["task_ids"].as_array().unwrap().len();
        let text = format!("spawn:200@{}/c@work:60000", gw.url);
        let body = json!({"jsonrpc": "2.0", "id": "root", "method": method,
            "params": {"message": message(&text)}});
        let r = post_json(&gw.url, "/p", &[], &body).await;
        assert!(r.text().contains("TASK_STATE_COMPLETED"), "{}", r.text());
        let ids = c.stats().await["task_ids"].clone();
        let c_task = ids[before].as_str().unwrap().to_owned();
        if want == CANCELED {
            cancelled(&c, &c_task, per_hop(), "child", &gw).await;
        } else {
            tokio::time::sleep(per_hop() + scaled_ms(500)).await;
            assert_eq!(c.state(None, &c_task).await.as_deref(), Some(WORKING));
        }
    }
}

/// The three agents behind two gateway replicas, A and B, sharing one
/// Redis (kept alive by the caller).
async fn replicas_on_redis() -> (
    RedisServer,
    (PythonWorker, PythonWorker, PythonWorker),
    Gateway,
    Gateway,
) {
    let redis = RedisServer::start().await;
    let (p, c, d) = agents().await;
    let cfg = format!(
        "[store]\nurl = \"{}\"\n\n{}",
        redis.url(),
        routes(&p, &c, &d, "")
    );
    let a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    (redis, (p, c, d), a, b)
}

/// The parent's send through gateway replica A, its child's through B, on
/// one Redis: the link is in the store, and A's cancel of the parent takes
/// the child with it.
#[tokio::test]
async fn a_tree_across_gateway_replicas_on_redis() {
    let (_redis, (p, c, d), a, b) = replicas_on_redis().await;
    let text = tree(&b.url, &a.url);
    let p_task = send_detached(&a.url, "/p", &text).await;
    let c_task = child_of(&p).await;
    let d_task = child_of(&c).await;
    wait_for_state(&d.url(), None, &d_task, WORKING, scaled_secs(5))
        .await
        .unwrap();
    let answer = cancel_through(&a.url, "/p", &p_task).await;
    assert_eq!(answer["result"]["status"]["state"], CANCELED, "{answer}");
    wait_for_state(&c.url(), None, &c_task, CANCELED, per_hop())
        .await
        .unwrap_or_else(|s| {
            panic!(
                "child not cancelled: {s:?}\nA:\n{}\nB:\n{}",
                a.log_text(),
                b.log_text()
            )
        });
    wait_for_state(&d.url(), None, &d_task, CANCELED, per_hop())
        .await
        .unwrap_or_else(|s| {
            panic!(
                "grandchild not cancelled: {s:?}\nA:\n{}\nB:\n{}",
                a.log_text(),
                b.log_text()
            )
        });
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!((cancels(&c).await, cancels(&d).await), (1, 1));
}

/// P's caller granted a lease on P's task and stopped renewing it, and P's
/// agent was SIGKILLed: the lapse takes P's children with it, though P's
/// own cancel finds no worker (the lease's record says which message
/// started P, so its references are known without asking P).
#[tokio::test]
async fn a_parent_whose_lease_lapsed_takes_its_children_with_it() {
    let (p, c, d) = agents().await;
    let cfg = format!(
        "[cancel]\nattempts = 1\ntimeout = \"500ms\"\n\n{}",
        routes(&p, &c, &d, "worker_leases = \"enforce\"")
    );
    let gw = Gateway::start(&cfg).await;
    let ttl = Duration::from_millis(1500);
    let mut msg = message(&tree(&gw.url, &gw.url));
    msg["metadata"] = json!({"a2a-rust.com/lease": {"ttlMs": ttl.as_millis() as u64}});
    msg["extensions"] = json!(["https://a2a-rust.com/extensions/lease/v1"]);
    let body = json!({"jsonrpc": "2.0", "id": "root", "method": "SendMessage",
        "params": {"message": msg, "configuration": {"returnImmediately": true}}});
    let sent = tokio::time::Instant::now();
    let r = post_json(&gw.url, "/p", &[], &body).await;
    assert!(r.json()["result"]["task"]["id"].is_string(), "{}", r.text());
    let c_task = child_of(&p).await;
    let d_task = child_of(&c).await;
    wait_for_state(&d.url(), None, &d_task, WORKING, scaled_secs(5))
        .await
        .unwrap();
    p.kill().await;
    // Lapsed at `ttl` after the send (a tick and a refused connect later
    // the tree starts), then one hop each.
    let lapse_left = ttl.saturating_sub(sent.elapsed());
    cancelled(&c, &c_task, lapse_left + per_hop(), "child", &gw).await;
    cancelled(&d, &d_task, per_hop(), "grandchild", &gw).await;
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!((cancels(&c).await, cancels(&d).await), (1, 1));
}

/// P's budget deadline passes: the gateway stops P, and P's children with
/// it.
#[tokio::test]
async fn a_parent_past_its_deadline_takes_its_children_with_it() {
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    let deadline = Duration::from_millis(1500);
    let mut msg = message(&tree(&gw.url, &gw.url));
    msg["metadata"] = json!({"a2a-rust.com/budget": {"remainingMs": deadline.as_millis() as u64}});
    msg["extensions"] = json!(["https://a2a-rust.com/extensions/budget/v1"]);
    let body = json!({"jsonrpc": "2.0", "id": "root", "method": "SendStreamingMessage",
        "params": {"message": msg}});
    let sent = tokio::time::Instant::now();
    let sock = crate::harness::http::open_post_json(&gw.url, "/p", &body).await;
    let c_task = child_of(&p).await;
    let d_task = child_of(&c).await;
    let p_task = p.stats().await["task_ids"][0].as_str().unwrap().to_owned();
    let left = deadline.saturating_sub(sent.elapsed());
    cancelled(&p, &p_task, left + scaled_ms(250), "parent", &gw).await;
    descendants_cancelled(&c, &c_task, &d, &d_task, &gw).await;
    drop(sock);
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(
        (cancels(&p).await, cancels(&c).await, cancels(&d).await),
        (1, 1, 1)
    );
}

/// The same tree of a2a-rust 0.15 agents, each call on another binding: the
/// root reaches P over gRPC, P its child over REST, the child its own over
/// JSON-RPC, each agent's a2a-rust client carrying on the trace headers its
/// request arrived with (an interceptor: the client crate propagates none).
/// The root's gRPC `CancelTask` for P takes both with it.
#[tokio::test]
async fn a_tree_of_a2a_rust_agents_over_grpc_rest_and_jsonrpc() {
    use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
    use a2a_protocol_types::message::{Message, Part};
    use a2a_protocol_types::params::{MessageSendParams, SendMessageConfiguration};
    use a2a_protocol_types::responses::SendMessageResponse;

    let p = RustWorker::start_with_grpc(RustWorkerOptions::default()).await;
    let c = RustWorker::start(RustWorkerOptions::default()).await;
    let d = RustWorker::start(RustWorkerOptions::default()).await;
    // P's route is the catch-all (gRPC paths are the service's own).
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"p\"\nworker = \"{}\"\n\n\
         [[routes]]\nname = \"c\"\npath_prefix = \"/c\"\nworker = \"{}\"\n\n\
         [[routes]]\nname = \"d\"\npath_prefix = \"/d\"\nworker = \"{}\"\n",
        p.grpc_url(),
        c.url(),
        d.url()
    ))
    .await;
    let root = crate::harness::grpc::client(&gw.url, None, &[]).await;
    let text = format!(
        "spawn:60000@rest@{}/c@spawn:60000@jsonrpc@{}/d@work:60000",
        gw.url, gw.url
    );
    let mut params = MessageSendParams::new(Message::user(
        format!("root-{}", unique()),
        vec![Part::text(text)],
    ));
    params.configuration = Some(SendMessageConfiguration {
        accepted_output_modes: Vec::new(),
        task_push_notification_config: None,
        history_length: None,
        return_immediately: Some(true),
    });
    let p_task = match root.send_message(params).await {
        Ok(SendMessageResponse::Task(t)) => t.id.0,
        other => panic!("{other:?}"),
    };
    let spawned = |w: &RustWorker| {
        w.children()
            .first()
            .map(|c| c.task.clone().unwrap_or_else(|e| panic!("child send: {e}")))
    };
    let mut ids = (None, None);
    for _ in 0..crate::harness::scaled_count(400) {
        ids = (spawned(&p), spawned(&c));
        if ids.1.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (Some(c_task), Some(d_task)) = ids else {
        panic!("the tree did not grow: {ids:?}\n{}", gw.log_text());
    };
    root.cancel_task(&p_task)
        .await
        .unwrap_or_else(|e| panic!("cancel P: {e:?}"));
    for (w, id, what) in [(&c, &c_task, "child"), (&d, &d_task, "grandchild")] {
        let start = tokio::time::Instant::now();
        loop {
            if w.state(None, id).await.as_deref() == Some(CANCELED) {
                break;
            }
            assert!(
                start.elapsed() <= per_hop(),
                "{what} not cancelled: {:?}\n{}",
                w.state(None, id).await,
                gw.log_text()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!((p.cancels(), c.cancels(), d.cancels()), (1, 1, 1));
}

/// P awaits its child as a stream in its executor: cancelling P stops the
/// executor, which closes the child's stream (a caller leaving, the
/// cascade's), and P's end reaches the child through its link too: the
/// child is cancelled once.
#[tokio::test]
async fn an_awaited_child_is_cancelled_once() {
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    let p_task = send_detached(
        &gw.url,
        "/p",
        &format!("await:60000@{}/c@work:60000", gw.url),
    )
    .await;
    let c_task = child_of(&p).await;
    wait_for_state(&c.url(), None, &c_task, WORKING, scaled_secs(5))
        .await
        .unwrap();
    let answer = cancel_through(&gw.url, "/p", &p_task).await;
    assert_eq!(answer["result"]["status"]["state"], CANCELED, "{answer}");
    cancelled(&c, &c_task, per_hop(), "child", &gw).await;
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(cancels(&c).await, 1);
}

/// `/tasks/{id}` shows a task's place in its tree: a parent streamed by
/// its root lists the child it awaits (by its message), and the child,
/// streamed by the parent, names the parent's reference (the one it was
/// given in its `tracestate`) and its depth.
#[tokio::test]
async fn the_admin_endpoint_shows_parent_and_children() {
    let (_, c, d) = agents().await;
    let p = PythonWorker::start_with_args(&["--otel", "--record-requests"]).await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    let text = format!("await:60000@{}/c@work:60000", gw.url);
    let body = json!({"jsonrpc": "2.0", "id": "root", "method": "SendStreamingMessage",
        "params": {"message": message(&text)}});
    let _open = crate::harness::http::open_post_json(&gw.url, "/p", &body).await;
    let c_task = child_of(&p).await;
    let p_task = p.stats().await["task_ids"][0].as_str().unwrap().to_owned();
    let c_message = p.stats().await["children"][0]["message_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = |id: String| {
        let admin = gw.admin.clone();
        async move {
            crate::harness::http::request("GET", &admin, &format!("/tasks/{id}"), &[], b"")
                .await
                .json()
        }
    };
    let mut parent = Value::Null;
    for _ in 0..crate::harness::scaled_count(100) {
        parent = view(p_task.clone()).await;
        if parent["tree"]["children"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let kids = parent["tree"]["children"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(kids.len(), 1, "{parent}");
    assert_eq!(kids[0]["messageId"], c_message.as_str(), "{parent}");
    assert_eq!(
        (kids[0]["route"].as_str(), kids[0]["depth"].as_u64()),
        (Some("c"), Some(1))
    );
    assert!(parent["tree"]["parent"].is_null(), "{parent}");

    let child = view(c_task.clone()).await;
    let given = p
        .requests_seen()
        .await
        .into_iter()
        .find_map(|r| {
            r.tracestate
                .as_deref()
                .and_then(|t| t.strip_prefix("a2agw="))
                .map(|v| v[..16].to_owned())
        })
        .expect("P's request carried the gateway's member");
    // The child's send came from P's request: P's reference.
    assert_eq!(child["tree"]["parent"]["depth"], 1, "{child}");
    assert!(
        parent["tree"]["references"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == &child["tree"]["parent"]["reference"]),
        "{parent}\n{child}"
    );
    // The one P was given (and passed on).
    assert!(
        given == child["tree"]["parent"]["reference"].as_str().unwrap(),
        "given {given}, {child}"
    );
}

/// With `[tracing]`, the trace the gateway exports shows the tree: the
/// tree's `CancelTask` for P's background child is a child of the span of
/// the child's send, in the trace P's own request started (P's agent
/// propagated it), with the cause `parent_canceled`.
#[tokio::test]
async fn the_exported_trace_holds_the_tree_cancel() {
    use crate::harness::otlp::{Receiver, CLIENT, SERVER};
    let otlp = Receiver::start().await;
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&format!(
        "[tracing]\notlp_endpoint = \"{}\"\nservice_name = \"gw-tree\"\n\n{}",
        otlp.url,
        routes(&p, &c, &d, "")
    ))
    .await;
    let p_task = send_detached(
        &gw.url,
        "/p",
        &format!("spawn:60000@{}/c@work:60000", gw.url),
    )
    .await;
    let c_task = child_of(&p).await;
    let answer = cancel_through(&gw.url, "/p", &p_task).await;
    assert_eq!(answer["result"]["status"]["state"], CANCELED, "{answer}");
    cancelled(&c, &c_task, per_hop(), "child", &gw).await;
    let within = scaled_secs(5);
    let cancel = otlp
        .wait_span(within, |s| {
            s.kind == CLIENT
                && s.name == "CancelTask"
                && s.attr("a2a.route") == Some("c")
                && s.attr("a2a.cause") == Some("parent_canceled")
        })
        .await
        .unwrap_or_else(|| panic!("no tree cancel span: {:?}", otlp.spans()));
    assert_eq!(cancel.attr("a2a.task_id"), Some(c_task.as_str()));
    let send = |route: &'static str| {
        move |s: &crate::harness::otlp::Span| {
            s.kind == SERVER
                && s.attr("a2a.route") == Some(route)
                && s.attr("a2a.method") == Some("SendMessage")
        }
    };
    let p_send = otlp
        .wait_span(within, send("p"))
        .await
        .expect("P's send span");
    let c_send = otlp
        .wait_span(within, send("c"))
        .await
        .expect("C's send span");
    assert_eq!(
        cancel.parent_span_id, c_send.span_id,
        "{cancel:?}\n{c_send:?}"
    );
    assert_eq!(cancel.trace_id, p_send.trace_id);
    assert_eq!(
        c_send.trace_id, p_send.trace_id,
        "P's agent carried the trace on"
    );
}

/// A caller that names its send's parent itself (`A2A-Parent-Task`) links
/// it there, over any reference its trace context carries.
#[tokio::test]
async fn an_explicit_parent_wins_over_the_trace_context() {
    let (_, c, d) = agents().await;
    let p = PythonWorker::start_with_args(&["--otel", "--record-requests"]).await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    let p1 = send_detached(&gw.url, "/p", "work:60000").await;
    let p2 = send_detached(&gw.url, "/p", "work:60000").await;
    // The reference P2's request was given (the second send P saw).
    let p2_member = p
        .requests_seen()
        .await
        .into_iter()
        .filter_map(|r| {
            r.tracestate?
                .strip_prefix("a2agw=")
                .map(|v| v[..34].to_owned())
        })
        .nth(1)
        .expect("P2's request carried the gateway's member");
    let named = format!("route=p;task={p1}");
    let baggage = format!("a2agw={p2_member}");
    let child = send_detached_with(
        &gw.url,
        "/c",
        &[("a2a-parent-task", &named), ("baggage", &baggage)],
        "work:60000",
    )
    .await;
    let answer = cancel_through(&gw.url, "/p", &p2).await;
    assert_eq!(answer["result"]["status"]["state"], CANCELED, "{answer}");
    tokio::time::sleep(per_hop() + scaled_ms(500)).await;
    assert_eq!(c.state(None, &child).await.as_deref(), Some(WORKING));
    let answer = cancel_through(&gw.url, "/p", &p1).await;
    assert_eq!(answer["result"]["status"]["state"], CANCELED, "{answer}");
    cancelled(&c, &child, per_hop(), "explicit child", &gw).await;
    assert_eq!(cancels(&c).await, 1);
}

/// A child inherits its parent's deadline: P's budget ends 2 s after its
/// send, P completes at once leaving its background child running (kept, by
/// default), and the child, whose own send carried no grant, is stopped at
/// P's deadline all the same: the gateway wrote P's remaining time into the
/// child's message as its grant and enforces it.
#[tokio::test]
async fn a_child_cannot_outlive_its_parents_deadline() {
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    let deadline = Duration::from_millis(2000);
    let mut msg = message(&format!("spawn:100@{}/c@work:60000", gw.url));
    msg["metadata"] = json!({"a2a-rust.com/budget": {"remainingMs": deadline.as_millis() as u64}});
    msg["extensions"] = json!(["https://a2a-rust.com/extensions/budget/v1"]);
    let body = json!({"jsonrpc": "2.0", "id": "root", "method": "SendStreamingMessage",
        "params": {"message": msg}});
    let sent = tokio::time::Instant::now();
    let r = post_json(&gw.url, "/p", &[], &body).await;
    assert!(r.text().contains("TASK_STATE_COMPLETED"), "{}", r.text());
    let c_task = child_of(&p).await;
    assert_eq!(c.state(None, &c_task).await.as_deref(), Some(WORKING));
    // The grant the child's worker got: at most what P had left.
    let got = post_json(
        &c.url(),
        "/",
        &[],
        &json!({"jsonrpc": "2.0", "id": "h", "method": "GetTask",
            "params": {"id": c_task, "historyLength": 10}}),
    )
    .await
    .json();
    let granted = got["result"]["history"][0]["metadata"]["a2a-rust.com/budget"]["remainingMs"]
        .as_f64()
        .unwrap_or_else(|| panic!("no grant on the child's message: {got}"));
    assert!(
        granted > 0.0 && granted <= deadline.as_millis() as f64,
        "{granted}"
    );
    let left = deadline.saturating_sub(sent.elapsed());
    cancelled(
        &c,
        &c_task,
        left + scaled_ms(250),
        "child past its parent's deadline",
        &gw,
    )
    .await;
    assert!(
        sent.elapsed() + scaled_ms(300) >= deadline,
        "cancelled before the parent's deadline: {:?}",
        sent.elapsed()
    );
}

/// P, through gateway `a`, holds a 100-token grant and awaits a child it
/// sends through `b` without a grant, which reports 30 tokens every 100 ms:
/// the child is granted what P has left (100 tokens), and its spend, which
/// `b` sees, is charged to P, whose grant it exhausts: `b` stops P (which
/// spent nothing itself), once, and the child with it.
async fn a_child_spends_its_parents_budget(
    a: &Gateway,
    b: &Gateway,
    p: &PythonWorker,
    c: &PythonWorker,
) {
    let mut msg = message(&format!("await:60000@{}/c@spend:60000:tokens=30", b.url));
    msg["metadata"] = json!({"a2a-rust.com/budget": {"meters": {"tokens": 100}}});
    msg["extensions"] = json!(["https://a2a-rust.com/extensions/budget/v1"]);
    let body = json!({"jsonrpc": "2.0", "id": "root", "method": "SendStreamingMessage",
        "params": {"message": msg}});
    let _open = crate::harness::http::open_post_json(&a.url, "/p", &body).await;
    let c_task = child_of(p).await;
    let p_task = p.stats().await["task_ids"][0].as_str().unwrap().to_owned();
    let got = post_json(
        &c.url(),
        "/",
        &[],
        &json!({"jsonrpc": "2.0", "id": "h", "method": "GetTask",
            "params": {"id": c_task, "historyLength": 10}}),
    )
    .await
    .json();
    let granted = &got["result"]["history"][0]["metadata"]["a2a-rust.com/budget"];
    assert_eq!(
        granted["meters"]["tokens"].as_f64(),
        Some(100.0),
        "{got}\n{}",
        b.log_text()
    );
    // 30 tokens every 100 ms: past 100 at the fourth report.
    cancelled(
        p,
        &p_task,
        scaled_secs(3),
        "parent charged past its grant",
        b,
    )
    .await;
    cancelled(c, &c_task, per_hop(), "child", b).await;
    assert!(
        b.counter(
            "a2agw_budget_exhausted_total",
            &["route=\"p\"", "by=\"meter\""]
        )
        .await
            >= 1.0,
        "{}",
        b.metrics().await
    );
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(cancels(p).await, 1, "the parent cancelled once");
}

/// Parent and child through one gateway (the memory store).
#[tokio::test]
async fn a_childs_spend_is_charged_to_its_parent() {
    let (p, c, d) = agents().await;
    let gw = Gateway::start(&routes(&p, &c, &d, "")).await;
    a_child_spends_its_parents_budget(&gw, &gw, &p, &c).await;
}

/// The parent's send through gateway replica A, the child's through B, on
/// one Redis: the parent's budget is kept in the store (its reference says
/// so), B grants the child what it has left and, seeing its spend, stops
/// the parent A forwarded, found by its message.
#[tokio::test]
async fn a_childs_spend_on_another_replica_is_charged_to_its_parent() {
    let (_redis, (p, c, _d), a, b) = replicas_on_redis().await;
    a_child_spends_its_parents_budget(&a, &b, &p, &c).await;
}

/// A route that strips the trace context (`strip_headers`) keeps it from
/// its worker: the gateway adds no reference back.
#[tokio::test]
async fn a_route_that_strips_the_trace_context_gets_no_reference() {
    let (_, c, d) = agents().await;
    let p = PythonWorker::start_with_args(&["--otel", "--record-requests"]).await;
    let gw = Gateway::start(&routes(
        &p,
        &c,
        &d,
        "strip_headers = [\"traceparent\", \"tracestate\"]",
    ))
    .await;
    send_detached_with(&gw.url, "/p", &[("traceparent", TRACE)], "quick").await;
    let seen = p.requests_seen().await;
    let send = seen
        .iter()
        .find(|r| r.method == "POST")
        .expect("the send reached P");
    assert_eq!(
        (send.traceparent.as_deref(), send.tracestate.as_deref()),
        (None, None),
        "{seen:?}"
    );
}
