//! Blocking sends carried as streams: a blocking `SendMessage` whose caller
//! leaves has its child cancelled; one whose caller stays gets what the
//! worker would have answered (issue: "No orphan in any call shape").
//!
//! Against both real workers (a2a-rust 0.15, Python a2a-sdk 1.3.0), both
//! bindings, with and without a tenant; outcomes read from the worker.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::{leave, list_tasks, open_post_json, post_json, Response};
use crate::harness::worker::{message, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs, scenarios};

const CANCELED: &str = "TASK_STATE_CANCELED";
const WORKING: &str = "TASK_STATE_WORKING";

/// The path and body of a blocking send of `text`.
fn blocking_send(bind: Bind, tenant: Option<&str>, text: &str, conf: Value) -> (String, Value) {
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
        Bind::Rest => {
            let path = match tenant {
                Some(t) => format!("/{t}/message:send"),
                None => "/message:send".into(),
            };
            (path, json!({ "message": msg, "configuration": conf }))
        }
    }
}

/// Waits for the worker to hold exactly one task in `tenant`; its id.
async fn the_one_task(worker: &Worker, tenant: Option<&str>) -> String {
    for _ in 0..scaled_count(200) {
        let ids = list_tasks(&worker.url(), tenant).await;
        assert!(ids.len() <= 1, "more than one task: {ids:?}");
        if let Some((id, _)) = ids.into_iter().next() {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the worker started no task");
}

/// How a blocking send reaches the worker.
#[derive(Clone, Copy, Debug)]
enum How {
    /// The default: passed as it came, the caller's leaving acted on.
    Guarded,
    /// `blocking_sends = "stream"`: carried as a stream.
    Carried,
}

impl How {
    fn config(self) -> &'static str {
        match self {
            How::Guarded => "",
            How::Carried => "blocking_sends = \"stream\"",
        }
    }

    fn outcome(self) -> &'static str {
        match self {
            How::Guarded => "outcome=\"guarded\"",
            How::Carried => "outcome=\"carried\"",
        }
    }
}

/// A blocking send whose caller leaves (FIN, or RST) after 1 s: the child
/// is CANCELED within 1 s of it, by exactly one CancelTask.
async fn caller_leaves(kind: Kind, bind: Bind, tenant: Option<&str>, reset: bool, how: How) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), how.config()).await;
    let (path, body) = blocking_send(bind, tenant, "work:30000", json!({}));
    let sock = open_post_json(&gw.url, &path, &body).await;
    let id = the_one_task(&worker, tenant).await;
    worker
        .wait_state(tenant, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    tokio::time::sleep(Duration::from_secs(1)).await;
    leave(sock, reset).await;
    let left = Instant::now();
    worker
        .wait_state(tenant, &id, CANCELED, scaled_secs(1))
        .await
        .unwrap_or_else(|last| {
            panic!(
                "not canceled within {:?} (state {last:?}); gateway log:\n{}",
                scaled_secs(1),
                gw.log_text()
            )
        });
    eprintln!(
        "{kind:?}/{bind:?}/{tenant:?}/reset={reset}/{how:?}: canceled {:?} after the caller left",
        left.elapsed()
    );
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_eq!(
        gw.counter("a2agw_blocking_sends_total", &[how.outcome()])
            .await,
        1.0
    );
}

/// What is left of an answer once the values that differ between two runs
/// of the same send (ids, times) are blanked.
fn normalized(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if matches!(
                        k.as_str(),
                        "id" | "taskId" | "contextId" | "messageId" | "timestamp" | "artifactId"
                    ) && x.is_string()
                    {
                        *x = json!("…");
                    } else {
                        walk(x);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

/// The same blocking send straight to the worker and through the gateway:
/// the same status, content type and answer (ids and times aside), no
/// CancelTask, and the gateway handled it `how`.
async fn caller_stays(
    kind: Kind,
    bind: Bind,
    tenant: Option<&str>,
    text: &str,
    conf: Value,
    how: How,
) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), how.config()).await;
    let (path, direct_body) = blocking_send(bind, tenant, text, conf.clone());
    let direct = post_json(&worker.url(), &path, &[], &direct_body).await;
    let (path, body) = blocking_send(bind, tenant, text, conf);
    let through = post_json(&gw.url, &path, &[], &body).await;
    compare(&direct, &through);
    assert_eq!(
        gw.counter("a2agw_blocking_sends_total", &[how.outcome()])
            .await,
        1.0,
        "not {how:?}; gateway log:\n{}",
        gw.log_text()
    );
    // Whatever state the send ended in, nobody cancels it.
    tokio::time::sleep(scaled_ms(700)).await;
    assert_eq!(worker.cancels().await, 0, "a CancelTask reached the worker");
    let task = &through.json();
    let task = task.get("result").unwrap_or(task)["task"].clone();
    if let Some(id) = task["id"].as_str() {
        assert_eq!(
            worker.state(tenant, id).await.as_deref(),
            task["status"]["state"].as_str(),
            "the worker's task moved on"
        );
    }
}

fn compare(direct: &Response, through: &Response) {
    assert_eq!(through.status, direct.status, "{}", through.text());
    let ct = |r: &Response| {
        r.header("content-type")
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    };
    assert_eq!(ct(through), ct(direct));
    assert_eq!(
        normalized(through.json()),
        normalized(direct.json()),
        "direct: {}\nthrough: {}",
        direct.text(),
        through.text()
    );
}

/// A blocking send the worker refuses (a v1.0 send without a message): the
/// same error, status and envelope as straight from the worker.
async fn refused(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (path, body) = match bind {
        Bind::JsonRpc => (
            "/",
            json!({"jsonrpc": "2.0", "id": 5, "method": "SendMessage", "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}}),
        ),
        Bind::Rest => (
            "/message:send",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}),
        ),
    };
    let direct = post_json(&worker.url(), path, &[], &body).await;
    let through = post_json(&gw.url, path, &[], &body).await;
    compare(&direct, &through);
    assert!(
        direct.status >= 400 || direct.json().get("error").is_some(),
        "the worker accepted the send: {}",
        direct.text()
    );
}

/// `blocking_sends = "pass"`: the send passes as it came (not carried).
async fn passed_when_configured(kind: Kind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "blocking_sends = \"pass\"").await;
    let (path, body) = blocking_send(Bind::JsonRpc, None, "work:10", json!({}));
    let r = post_json(&gw.url, &path, &[], &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json()["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(
        gw.counter(
            "a2agw_blocking_sends_total",
            &["outcome=\"passed\"", "reason=\"configured\""]
        )
        .await,
        1.0
    );
}

/// Opens a blocking JSON-RPC send of `work:30000` through `gw` on a raw
/// socket, waits for the worker to run a task not in `known`, and leaves
/// (FIN); the task's id. (Python workers: their stats list the tasks they
/// started, `ListTasks` may be refused.)
async fn send_and_leave_once(gw: &Gateway, worker: &Worker, known: &[String]) -> String {
    let (path, body) = blocking_send(Bind::JsonRpc, None, "work:30000", json!({}));
    let sock = open_post_json(&gw.url, &path, &body).await;
    let Worker::Python(w) = worker else {
        panic!("the Python worker lists its started tasks in its stats")
    };
    for _ in 0..scaled_count(200) {
        let started = w.stats().await["task_ids"].clone();
        let fresh = started
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|id| id.as_str())
            .find(|id| !known.iter().any(|k| k == id))
            .map(str::to_owned);
        if let Some(id) = fresh {
            worker
                .wait_state(None, &id, WORKING, scaled_secs(5))
                .await
                .expect("the task runs");
            leave(sock, false).await;
            return id;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "the worker started no task; gateway log:\n{}",
        gw.log_text()
    );
}

/// A worker that does not serve `ListTasks` (the Python SDK's handler
/// without it): the first guarded send whose caller leaves cannot have its
/// child found (the lookup refused: counted unreachable, the child runs
/// on); from then on the route's blocking sends are carried as streams
/// (the worker streams), and the next leaver's child is CANCELED within
/// 1 s, by the one `CancelTask` of the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsearchable_worker_gets_its_sends_carried() {
    let worker = Worker::Python(
        crate::harness::python_worker::PythonWorker::start_with_args(&["--no-list-tasks"]).await,
    );
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let first = send_and_leave_once(&gw, &worker, &[]).await;
    assert_eq!(
        gw.counter_reaching("a2agw_unreachable_children_total", &[], 1.0)
            .await,
        1.0,
        "the refused lookup; gateway log:\n{}",
        gw.log_text()
    );
    assert_eq!(worker.state(None, &first).await.as_deref(), Some(WORKING));
    let second = send_and_leave_once(&gw, &worker, std::slice::from_ref(&first)).await;
    let left = Instant::now();
    worker
        .wait_state(None, &second, CANCELED, scaled_secs(1))
        .await
        .unwrap_or_else(|last| panic!("{last:?}; gateway log:\n{}", gw.log_text()));
    eprintln!(
        "carried for want of ListTasks: canceled {:?} after the caller left",
        left.elapsed()
    );
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(
        worker.cancels().await,
        1,
        "one CancelTask, the second child's"
    );
    assert_eq!(worker.state(None, &first).await.as_deref(), Some(WORKING));
    for (labels, want) in [
        (["outcome=\"guarded\"", "reason=\"default\""], 1.0),
        (["outcome=\"carried\"", "reason=\"unsearchable\""], 1.0),
    ] {
        assert_eq!(
            gw.counter("a2agw_blocking_sends_total", &labels).await,
            want,
            "{labels:?}"
        );
    }
}

/// Every task the worker holds, by the id of the first message in its
/// history: (task id, state). `ListTasks` straight to the worker, page
/// after page.
async fn tasks_by_message(url: &str) -> std::collections::HashMap<String, (String, String)> {
    let mut out = std::collections::HashMap::new();
    let mut token = String::new();
    loop {
        let mut params = json!({"pageSize": 100, "historyLength": 10});
        if !token.is_empty() {
            params["pageToken"] = json!(token);
        }
        let body = json!({"jsonrpc": "2.0", "id": "t", "method": "ListTasks", "params": params});
        let v = post_json(url, "/", &[], &body).await.json();
        let r = &v["result"];
        for t in r["tasks"].as_array().into_iter().flatten() {
            let (Some(id), Some(m)) = (t["id"].as_str(), t["history"][0]["messageId"].as_str())
            else {
                continue;
            };
            let state = t["status"]["state"].as_str().unwrap_or("").to_owned();
            out.insert(m.to_owned(), (id.to_owned(), state));
        }
        match r["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() && t != token => token = t.to_owned(),
            _ => return out,
        }
    }
}

/// 200 concurrent blocking callers (`work:5000`, JSON-RPC and REST
/// alternating), a seeded random half of which leave (FIN or RST) at a
/// random moment 300 to 2,000 ms after sending (3 s or more before the
/// child would complete): every leaver's child is CANCELED, by exactly one
/// `CancelTask` (a leaver gone before its send was forwarded has none);
/// no stayer's child is cancelled; every stayer is answered as a caller of
/// the worker itself is (ids and times aside).
async fn many_callers_half_leave(kind: Kind) {
    const N: usize = 200;
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let binds = [Bind::JsonRpc, Bind::Rest];
    // The worker's own answers, one per binding, sent beside the others.
    let direct: Vec<_> = binds
        .iter()
        .map(|&bind| {
            let url = worker.url();
            let (path, body) = blocking_send(bind, None, "work:5000", json!({}));
            tokio::spawn(async move { post_json(&url, &path, &[], &body).await })
        })
        .collect();
    let mut calls = Vec::new();
    for i in 0..N {
        let bind = binds[i % 2];
        let (path, body) = blocking_send(bind, None, "work:5000", json!({}));
        let msg = match bind {
            Bind::JsonRpc => &body["params"]["message"],
            Bind::Rest => &body["message"],
        };
        let message_id = msg["messageId"].as_str().unwrap().to_owned();
        let leave_after = (next(2) == 0).then(|| (300 + next(1700), next(2) == 0));
        let url = gw.url.clone();
        let call = tokio::spawn(async move {
            let Some((after_ms, reset)) = leave_after else {
                return Some(post_json(&url, &path, &[], &body).await);
            };
            let sock = open_post_json(&url, &path, &body).await;
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            leave(sock, reset).await;
            None
        });
        calls.push((bind, message_id, leave_after.is_some(), call));
    }
    let mut direct_answers = Vec::new();
    for d in direct {
        let r = d.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        direct_answers.push(r);
    }
    let (mut leavers, mut stayers) = (Vec::new(), Vec::new());
    for (bind, message_id, leaves, call) in calls {
        match call.await.unwrap() {
            Some(r) => {
                compare(&direct_answers[usize::from(bind == Bind::Rest)], &r);
                stayers.push(message_id);
            }
            None => {
                assert!(leaves);
                leavers.push(message_id);
            }
        }
    }
    assert!(
        (60..=140).contains(&leavers.len()),
        "about half leave: {}",
        leavers.len()
    );
    // Every leaver's child CANCELED, every stayer's COMPLETED. A leaver
    // may leave before the gateway forwarded its send (it is not, then):
    // its child never starts, and the lookup finding nothing counts it
    // unreachable. Any other state is an orphan.
    let settled = |tasks: &std::collections::HashMap<String, (String, String)>, m: &String| {
        tasks.get(m).is_none_or(|(_, s)| s == CANCELED)
    };
    let deadline = Instant::now() + scaled_secs(10);
    let mut tasks = tasks_by_message(&worker.url()).await;
    while !leavers.iter().all(|m| settled(&tasks, m)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        tasks = tasks_by_message(&worker.url()).await;
    }
    tokio::time::sleep(scaled_ms(500)).await;
    let tasks = tasks_by_message(&worker.url()).await;
    let orphans: Vec<_> = leavers
        .iter()
        .filter(|m| !settled(&tasks, m))
        .map(|m| (m, &tasks[m]))
        .collect();
    assert!(
        orphans.is_empty(),
        "{} of {} leavers' children not CANCELED: {orphans:?}; gateway log:\n{}",
        orphans.len(),
        leavers.len(),
        gw.log_text()
    );
    let started: Vec<&String> = leavers.iter().filter(|m| tasks.contains_key(*m)).collect();
    assert_eq!(
        gw.counter("a2agw_unreachable_children_total", &[]).await,
        (leavers.len() - started.len()) as f64,
        "leavers whose send never reached the worker"
    );
    for m in &stayers {
        assert_eq!(
            tasks.get(m).map(|(_, s)| s.as_str()),
            Some("TASK_STATE_COMPLETED"),
            "stayer {m}"
        );
    }
    assert_eq!(
        worker.cancels().await,
        started.len() as u64,
        "one CancelTask per leaver's child"
    );
    if let Worker::Rust(w) = &worker {
        let mut per_task = std::collections::HashMap::new();
        for r in w.cancel_records() {
            *per_task.entry(r.task_id).or_insert(0) += 1;
        }
        for m in &started {
            let id = &tasks[*m].0;
            assert_eq!(per_task.get(id), Some(&1), "leaver {m}'s child {id}");
        }
        assert_eq!(per_task.len(), started.len(), "only leavers' children");
    }
    assert_eq!(
        gw.counter("a2agw_blocking_sends_total", &["outcome=\"guarded\""])
            .await,
        N as f64
    );
}

scenarios! {
    rust_two_hundred_callers_half_leave => many_callers_half_leave(Kind::Rust);
    python_two_hundred_callers_half_leave => many_callers_half_leave(Kind::Python);
}

scenarios! {
    rust_jsonrpc_fin => caller_leaves(Kind::Rust, Bind::JsonRpc, None, false, How::Guarded);
    rust_rest_rst => caller_leaves(Kind::Rust, Bind::Rest, None, true, How::Guarded);
    rust_rest_tenant_fin => caller_leaves(Kind::Rust, Bind::Rest, Some("acme"), false, How::Guarded);
    rust_jsonrpc_tenant_rst => caller_leaves(Kind::Rust, Bind::JsonRpc, Some("acme"), true, How::Guarded);
    python_jsonrpc_fin => caller_leaves(Kind::Python, Bind::JsonRpc, None, false, How::Guarded);
    python_jsonrpc_rst => caller_leaves(Kind::Python, Bind::JsonRpc, None, true, How::Guarded);
    python_rest_fin => caller_leaves(Kind::Python, Bind::Rest, None, false, How::Guarded);
    python_rest_rst => caller_leaves(Kind::Python, Bind::Rest, None, true, How::Guarded);
    python_rest_tenant_rst => caller_leaves(Kind::Python, Bind::Rest, Some("acme"), true, How::Guarded);
    python_jsonrpc_tenant_fin => caller_leaves(Kind::Python, Bind::JsonRpc, Some("acme"), false, How::Guarded);
    rust_rest_carried_fin => caller_leaves(Kind::Rust, Bind::Rest, None, false, How::Carried);
    python_jsonrpc_tenant_carried_rst => caller_leaves(Kind::Python, Bind::JsonRpc, Some("acme"), true, How::Carried);

    rust_jsonrpc_stays => caller_stays(Kind::Rust, Bind::JsonRpc, None, "work:200", json!({}), How::Guarded);
    rust_rest_stays_history => caller_stays(Kind::Rust, Bind::Rest, None, "work:200", json!({"historyLength": 1}), How::Guarded);
    rust_rest_tenant_stays => caller_stays(Kind::Rust, Bind::Rest, Some("acme"), "work:200", json!({}), How::Guarded);
    python_jsonrpc_stays => caller_stays(Kind::Python, Bind::JsonRpc, None, "work:200", json!({}), How::Guarded);
    python_jsonrpc_stays_history => caller_stays(Kind::Python, Bind::JsonRpc, None, "work:200", json!({"historyLength": 1}), How::Guarded);
    python_rest_tenant_stays => caller_stays(Kind::Python, Bind::Rest, Some("acme"), "work:200", json!({}), How::Guarded);
    rust_jsonrpc_input_required => caller_stays(Kind::Rust, Bind::JsonRpc, None, "ask", json!({}), How::Guarded);
    python_rest_input_required => caller_stays(Kind::Python, Bind::Rest, None, "ask", json!({}), How::Guarded);
    rust_jsonrpc_carried_stays_history => caller_stays(Kind::Rust, Bind::JsonRpc, None, "work:200", json!({"historyLength": 1}), How::Carried);
    python_rest_tenant_carried_stays => caller_stays(Kind::Python, Bind::Rest, Some("acme"), "work:200", json!({}), How::Carried);
    rust_rest_carried_input_required => caller_stays(Kind::Rust, Bind::Rest, None, "ask", json!({}), How::Carried);

    rust_jsonrpc_refused => refused(Kind::Rust, Bind::JsonRpc);
    python_rest_refused => refused(Kind::Python, Bind::Rest);
    rust_passed_when_configured => passed_when_configured(Kind::Rust);
}
