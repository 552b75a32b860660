//! Issue 4: budgets enforced at the gateway, for workers that do and do not
//! implement the budget extension.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, request};
use crate::harness::python_worker::PythonWorker;
use crate::harness::redis::RedisServer;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::stream::SseStream;
use crate::harness::worker::{message, state_of, stream_response, task_id_of, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs};

const BUDGET_URI: &str = "https://a2a-rust.com/extensions/budget/v1";
const BUDGET_KEY: &str = "a2a-rust.com/budget";
const CANCELED: &str = "TASK_STATE_CANCELED";
const FAILED: &str = "TASK_STATE_FAILED";

/// A user message, with a budget grant when `grant` is given.
fn budgeted(text: &str, grant: Option<Value>) -> Value {
    let mut m = message(text);
    if let Some(g) = grant {
        m["metadata"] = json!({ BUDGET_KEY: g });
        m["extensions"] = json!([BUDGET_URI]);
    }
    m
}

/// The streaming send's body and path for `bind`.
fn stream_request(bind: Bind, tenant: Option<&str>, msg: Value) -> (String, Value) {
    match bind {
        Bind::JsonRpc => {
            let mut params = json!({ "message": msg });
            if let Some(t) = tenant {
                params["tenant"] = json!(t);
            }
            (
                "/".into(),
                json!({"jsonrpc": "2.0", "id": "b1", "method": "SendStreamingMessage", "params": params}),
            )
        }
        Bind::Rest => (
            tenant.map_or("/message:stream".into(), |t| format!("/{t}/message:stream")),
            json!({ "message": msg }),
        ),
    }
}

/// Opens a streaming send that must be admitted; returns the stream and
/// the child's id.
async fn open(url: &str, bind: Bind, tenant: Option<&str>, msg: Value) -> (SseStream, String) {
    let (path, body) = stream_request(bind, tenant, msg);
    let mut s = SseStream::open(url, &path, &[], &body).await;
    assert_eq!(s.status, 200);
    assert!(
        s.content_type().starts_with("text/event-stream"),
        "{}",
        s.content_type()
    );
    for _ in 0..10 {
        let ev = s.next(scaled_secs(10)).await.expect("an event");
        if let Some(id) = task_id_of(&ev) {
            return (s, id);
        }
    }
    panic!("no event named the child");
}

/// Whether an event is the SDK's budget-exhausted failure.
fn is_budget_failure(ev: &Value) -> bool {
    let u = &stream_response(ev)["statusUpdate"];
    u["status"]["state"] == FAILED
        && u["status"]["message"]["metadata"]["a2a-rust.com/failure"] == "budget-exhausted"
        && u["status"]["message"]["extensions"][0] == "https://a2a-rust.com/extensions/failure/v1"
        && u["metadata"]["error"] == u["status"]["message"]["parts"][0]["text"]
        && u["metadata"][BUDGET_KEY]["remainingMs"] == 0
}

/// Numbers compared by value: the Python SDK stores metadata as a protobuf
/// `Struct`, so the integers the gateway sent come back as `250.0`.
fn same_numbers(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_numbers(v, w)))
        }
        _ => a == b,
    }
}

/// The message the worker stored as the task's first history entry: what
/// the gateway actually forwarded.
async fn forwarded_message(url: &str, tenant: Option<&str>, id: &str) -> Value {
    let mut params = json!({ "id": id, "historyLength": 10 });
    if let Some(t) = tenant {
        params["tenant"] = json!(t);
    }
    let body = json!({"jsonrpc": "2.0", "id": "h", "method": "GetTask", "params": params});
    let v = post_json(url, "/", &[], &body).await.json();
    v["result"]["history"][0].clone()
}

/// How long after `since` the worker itself reports the task CANCELED,
/// asked every 10 ms (for at most 5 s, scaled).
async fn canceled_after(worker: &Worker, id: &str, since: Instant) -> Duration {
    while since.elapsed() < scaled_secs(5) {
        if worker.state(None, id).await.as_deref() == Some(CANCELED) {
            return since.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the worker did not report CANCELED within {:?}",
        scaled_secs(5)
    );
}

/// A child reporting spend past its meter's cap is cancelled on the worker,
/// and the caller's stream ends with the budget-exhausted failure.
async fn spend_past_cap(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let gw =
        Gateway::in_front_of(&worker.url(), "[routes.budget]\nmeters = { tokens = 250 }").await;
    // No grant: the gateway injects {"meters":{"tokens":250}}.
    let (mut s, id) = open(
        &gw.url,
        bind,
        None,
        budgeted("spend:20000:tokens=100", None),
    )
    .await;
    let events = s.rest(scaled_secs(10)).await;
    let last = events.last().expect("events after the first");
    assert!(is_budget_failure(last), "last event: {last}");
    let u = &stream_response(last)["statusUpdate"];
    assert_eq!(u["taskId"], id.as_str());
    assert_eq!(
        u["status"]["message"]["parts"][0]["text"],
        "[-32603] the budget's tokens meter is exhausted"
    );
    assert_eq!(u["metadata"][BUDGET_KEY]["meters"], json!({"tokens": 250}));
    let spent = u["metadata"][BUDGET_KEY]["spent"]["tokens"]
        .as_u64()
        .unwrap();
    assert!(
        (251..=400).contains(&spent),
        "stopped soon after passing 250: {spent}"
    );
    // Nothing after the failure, and the spend that passed the cap went by.
    assert!(
        events.iter().any(
            |e| stream_response(e)["statusUpdate"]["metadata"][BUDGET_KEY]["spent"]["tokens"]
                .as_f64()
                .is_some_and(|n| n > 250.0)
        ),
        "{events:?}"
    );
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(3))
        .await
        .unwrap_or_else(|last| panic!("worker state {last:?}, want CANCELED"));
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_eq!(
        gw.counter("a2agw_budget_exhausted_total", &["by=\"meter\""])
            .await,
        1.0
    );
    assert_eq!(gw.counter("a2agw_budget_injected_total", &[]).await, 1.0);
    // The worker got the injected grant, integers, with its extension.
    let fwd = forwarded_message(&worker.url(), None, &id).await;
    assert!(
        same_numbers(
            &fwd["metadata"][BUDGET_KEY],
            &json!({"meters": {"tokens": 250}})
        ),
        "{fwd}"
    );
    assert!(fwd["extensions"].to_string().contains(BUDGET_URI), "{fwd}");
}

#[tokio::test]
async fn spend_past_cap_python_jsonrpc() {
    spend_past_cap(Kind::Python, Bind::JsonRpc).await;
}

#[tokio::test]
async fn spend_past_cap_python_rest() {
    spend_past_cap(Kind::Python, Bind::Rest).await;
}

#[tokio::test]
async fn spend_past_cap_rust_jsonrpc() {
    spend_past_cap(Kind::Rust, Bind::JsonRpc).await;
}

#[tokio::test]
async fn spend_past_cap_rust_rest() {
    spend_past_cap(Kind::Rust, Bind::Rest).await;
}

/// A child that outlives its deadline is cancelled within 250 ms of it, on
/// a worker that knows nothing of budgets and a route that sets no cap: the
/// caller's own grant is enforced.
async fn deadline(bind: Bind) {
    let worker = Worker::start(Kind::Python).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let remaining = Duration::from_millis(800);
    let sent = Instant::now();
    let grant = json!({"remainingMs": remaining.as_millis() as u64});
    let (mut s, id) = open(&gw.url, bind, None, budgeted("work:20000", Some(grant))).await;
    // The worker itself is asked, every 10 ms, until it reports CANCELED.
    let after = canceled_after(&worker, &id, sent).await;
    assert!(after >= remaining, "not before the deadline: {after:?}");
    assert!(
        after <= remaining + scaled_ms(250),
        "cancelled {:?} after the deadline",
        after - remaining
    );
    let events = s.rest(scaled_secs(5)).await;
    let last = events.last().expect("the failure");
    assert!(is_budget_failure(last), "{last}");
    assert_eq!(
        stream_response(last)["statusUpdate"]["status"]["message"]["parts"][0]["text"],
        "[-32603] the caller's budget deadline passed"
    );
    assert_eq!(worker.cancels().await, 1);
    assert_eq!(
        gw.counter("a2agw_budget_exhausted_total", &["by=\"time\""])
            .await,
        1.0
    );
}

#[tokio::test]
async fn deadline_cancels_within_250ms_jsonrpc() {
    deadline(Bind::JsonRpc).await;
}

#[tokio::test]
async fn deadline_cancels_within_250ms_rest() {
    deadline(Bind::Rest).await;
}

/// A route's `max_deadline` clamps a longer grant; the a2a-rust worker gets
/// the clamped grant and the child ends at the capped deadline (the worker
/// enforces it too, so either it fails the turn or the gateway cancels it).
#[tokio::test]
async fn max_deadline_clamps_a_longer_grant() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "[routes.budget]\nmax_deadline = \"700ms\"").await;
    let sent = Instant::now();
    let grant = json!({"remainingMs": 3_600_000});
    let (mut s, id) = open(
        &gw.url,
        Bind::JsonRpc,
        None,
        budgeted("work:20000", Some(grant)),
    )
    .await;
    let events = s.rest(scaled_secs(5)).await;
    let took = sent.elapsed();
    let last = events.last().expect("a last event");
    assert_eq!(state_of(last).as_deref(), Some(FAILED), "{last}");
    assert!(is_budget_failure(last), "{last}");
    assert!(
        took < Duration::from_millis(700) + scaled_ms(250),
        "{took:?}"
    );
    let state = worker.state(None, &id).await;
    assert!(
        matches!(state.as_deref(), Some(FAILED | CANCELED)),
        "worker: {state:?}"
    );
    assert_eq!(
        gw.counter("a2agw_budget_clamps_total", &["field=\"remainingMs\""])
            .await,
        1.0
    );
    let fwd = forwarded_message(&worker.url(), None, &id).await;
    assert!(
        same_numbers(&fwd["metadata"][BUDGET_KEY], &json!({"remainingMs": 700})),
        "{fwd}"
    );
}

/// Sends `n` streaming children at once (alternating bindings and, when
/// given, gateways); returns (admitted: final events of each, refusals).
async fn concurrent_children(
    urls: &[&str],
    tenant: &str,
    n: usize,
    text: &str,
) -> (Vec<Vec<Value>>, Vec<(u16, Value, Option<String>)>) {
    let sends = (0..n).map(|i| {
        let url = urls[i % urls.len()].to_string();
        let bind = if i % 2 == 0 {
            Bind::JsonRpc
        } else {
            Bind::Rest
        };
        let (path, body) = stream_request(bind, Some(tenant), budgeted(text, None));
        async move {
            let r = post_json(
                &url,
                &path,
                &[("accept", "text/event-stream"), ("x-api-key", TENANT_KEY)],
                &body,
            )
            .await;
            (bind, r)
        }
    });
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for (bind, r) in futures::future::join_all(sends).await {
        let is_sse = r
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"));
        if is_sse {
            // Both workers send one-line `data:` fields.
            let events: Vec<Value> = r
                .text()
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| serde_json::from_str(d.trim()).unwrap())
                .collect();
            admitted.push(events);
        } else {
            let retry = r.header("retry-after").map(str::to_string);
            let body = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if bind == Bind::JsonRpc {
                assert_eq!(r.status, 200, "{body}");
            }
            refused.push((r.status, body, retry));
        }
    }
    (admitted, refused)
}

/// The spend a child reported on the update that settled it.
fn settled_spend(events: &[Value]) -> u64 {
    let last = events.last().expect("events");
    assert_eq!(
        state_of(last).as_deref(),
        Some("TASK_STATE_COMPLETED"),
        "{last}"
    );
    stream_response(last)["statusUpdate"]["metadata"][BUDGET_KEY]["spent"]["tokens"]
        .as_f64()
        .expect("a spend report") as u64
}

/// One account's balance as `/budgets` shows it.
async fn account(gw: &Gateway, holder: &str) -> Value {
    let v = request("GET", &gw.admin, "/budgets", &[], b"").await.json();
    v["accounts"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|x| x["holder"] == holder && x["meter"] == "tokens")
                .cloned()
        })
        .unwrap_or_else(|| panic!("no account for {holder}: {v}"))
}

fn check_refusal(status: u16, body: &Value, retry: Option<&str>) {
    if status == 200 {
        assert_eq!(body["error"]["code"], -32603, "{body}");
        let data = &body["error"]["data"];
        assert_eq!(data["a2a-rust.com/failure"], "budget-exhausted", "{body}");
        assert_eq!(data["meter"], "tokens");
        assert_eq!(data["asked"], 100);
        assert!(data["left"].as_u64().unwrap() < 100, "{body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(
            msg.starts_with("budget account w/tenant/acme is exhausted for meter \"tokens\""),
            "{msg}"
        );
    } else {
        assert_eq!(status, 429, "{body}");
        assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED", "{body}");
        assert!(
            retry.is_some_and(|s| s.parse::<u64>().is_ok()),
            "Retry-After: {retry:?}"
        );
    }
}

/// The API key [`concurrent_children`] sends, which [`account_route`]
/// lets name the tenants `acme` and `beta`.
const TENANT_KEY: &str = "ak-tenants-0123456789";

/// A route keeping one account per tenant, which needs its callers'
/// tenants bound to their verified identities: the key `TENANT_KEY` may
/// name `acme` and `beta`.
fn account_route() -> String {
    let keys = crate::harness::jwt::api_keys_file("budget-accounts", &[(TENANT_KEY, "tenants")]);
    format!(
        "[routes.auth]\napi_keys_file = \"{}\"\ntenants = {{ \"key:tenants\" = [\"acme\", \"beta\"] }}\n\
         [routes.budget]\nmeters = {{ tokens = 100 }}\n\n\
         [[routes.budget.accounts]]\nper = \"tenant\"\nwindow = \"1h\"\nmeters = {{ tokens = 350 }}\n",
        keys.display()
    )
}

/// Ten concurrent children against an account of 350 (each granted 100):
/// three start, seven are refused with the account and what is left, and
/// the account is charged what the three reported, after which it admits
/// again. Another tenant's account is its own.
#[tokio::test]
async fn ten_children_share_an_account() {
    let worker = Worker::start(Kind::Python).await;
    let gw = Gateway::in_front_of(&worker.url(), &account_route()).await;
    let (admitted, refused) =
        concurrent_children(&[&gw.url], "acme", 10, "spend:600:tokens=10").await;
    assert_eq!(
        admitted.len(),
        3,
        "3 × 100 fit in 350; refusals: {refused:?}"
    );
    assert_eq!(refused.len(), 7);
    for (status, body, retry) in &refused {
        check_refusal(*status, body, retry.as_deref());
    }
    assert_eq!(
        worker.tasks_started().await,
        3,
        "refused children never reached the worker"
    );
    let spent: u64 = admitted.iter().map(|e| settled_spend(e)).sum();
    assert!(spent > 0 && spent <= 300, "{spent}");
    // Settled: the reservations are replaced by the reported spend.
    let mut acct = Value::Null;
    for _ in 0..scaled_count(50) {
        acct = account(&gw, "acme").await;
        if acct["reserved"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(acct["reserved"], 0, "{acct}");
    assert_eq!(acct["spent"], spent, "{acct}");
    assert_eq!(acct["limit"], 350);
    assert_eq!(acct["left"], 350 - spent);
    // The refund made room again; another tenant was never short.
    let (again, none) = concurrent_children(&[&gw.url], "acme", 1, "quick").await;
    assert_eq!((again.len(), none.len()), (1, 0), "{none:?}");
    let (beta, none) = concurrent_children(&[&gw.url], "beta", 3, "quick").await;
    assert_eq!((beta.len(), none.len()), (3, 0), "{none:?}");
    assert_eq!(
        gw.counter(
            "a2agw_refusals_total",
            &["reason=\"budget_account_exhausted\""]
        )
        .await,
        7.0
    );
}

/// A one-route config on the Redis store at `url` whose route keeps
/// [`account_route`]'s tenant account.
fn account_route_on(url: &str, worker: &Worker) -> String {
    format!(
        "[store]\nurl = \"{url}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n{}",
        worker.url(),
        account_route()
    )
}

/// Holds every write (scripts included) on `redis` for `ms`: calls sent
/// meanwhile wait, time out at the gateway after a second, and run when
/// the pause ends.
async fn pause_writes(redis: &RedisServer, ms: u64) {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
}

/// Two replicas sharing Redis: children split across them never take the
/// account past its limit; exactly as many start as fit.
#[tokio::test]
async fn two_replicas_share_an_account_on_redis() {
    let redis = RedisServer::start().await;
    replicas_share_an_account(&redis.url(), 2).await;
}

/// `n` replicas on the Redis store at `url`, ten concurrent children
/// split across them against an account that fits three: exactly three
/// start, and every replica sees the one balance they settled into.
pub(crate) async fn replicas_share_an_account(url: &str, n: usize) {
    let worker = Worker::start(Kind::Python).await;
    let cfg = account_route_on(url, &worker);
    let mut gws = Vec::new();
    for _ in 0..n {
        gws.push(Gateway::start(&cfg).await);
    }
    let urls: Vec<&str> = gws.iter().map(|g| g.url.as_str()).collect();
    let b = &gws[n - 1];
    let (admitted, refused) = concurrent_children(&urls, "acme", 10, "spend:600:tokens=10").await;
    assert_eq!(admitted.len(), 3, "refusals: {refused:?}");
    for (status, body, retry) in &refused {
        check_refusal(*status, body, retry.as_deref());
    }
    assert_eq!(worker.tasks_started().await, 3);
    let spent: u64 = admitted.iter().map(|e| settled_spend(e)).sum();
    let mut acct = Value::Null;
    for _ in 0..scaled_count(50) {
        acct = account(b, "acme").await;
        if acct["reserved"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(acct["reserved"], 0, "{acct}");
    assert_eq!(
        acct["spent"], spent,
        "both replicas settled into one account: {acct}"
    );
    for gw in &gws {
        assert_eq!(
            account(gw, "acme").await,
            acct,
            "every replica sees one balance"
        );
    }
}

/// A reservation whose answer the gateway never got is withdrawn: Redis
/// holds every write for 1.5 s, the reserve times out after 1 s (the child
/// starts unreserved, `on_store_error = "fail-open"`) and is applied when
/// the pause ends; the gateway's withdrawal, sent after it, takes it off
/// again. Before, the account stayed 100 tokens short until its window
/// ended (an hour here).
#[tokio::test]
async fn a_reservation_whose_answer_was_lost_is_withdrawn() {
    let redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Python).await;
    let cfg = account_route_on(&redis.url(), &worker);
    let gw = Gateway::start(&cfg).await;
    // The account exists (one child reserved and settled through it).
    let (admitted, _) = concurrent_children(&[&gw.url], "acme", 1, "spend:0:tokens=10").await;
    assert_eq!(admitted.len(), 1);
    let mut before = Value::Null;
    for _ in 0..scaled_count(50) {
        before = account(&gw, "acme").await;
        if before["reserved"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(before["reserved"], 0, "{before}");

    pause_writes(&redis, 1500).await;
    let (admitted, refused) = concurrent_children(&[&gw.url], "acme", 1, "spend:0:tokens=10").await;
    assert_eq!(
        (admitted.len(), refused.len()),
        (1, 0),
        "fail-open: the child starts unreserved"
    );
    assert!(
        gw.counter("a2agw_store_errors_total", &["account_reserve"])
            .await
            >= 1.0,
        "the reserve timed out"
    );
    // The pause has ended; the reservation landed, and the withdrawal
    // after it.
    let mut after = Value::Null;
    for _ in 0..scaled_count(100) {
        after = account(&gw, "acme").await;
        if after["reserved"] == 0 && after["spent"] == before["spent"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(after["reserved"], 0, "withdrawn: {after}");
    assert_eq!(after["spent"], before["spent"], "nothing charged: {after}");
}

/// A settlement the store did not take is sent again: Redis holds every
/// write for 1.5 s while the child settles, and the settle fails without
/// landing (with retries off, the account keeps the reservation: checked).
/// The retry a second later lands: the account is charged what the child
/// reported, once, and holds no reservation. Before, the reservation stayed
/// until the account's window ended. (A retry of a settlement that did
/// land changes nothing: the store conformance checks.)
#[tokio::test]
async fn a_settlement_the_store_did_not_take_is_retried() {
    let redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Python).await;
    let cfg = account_route_on(&redis.url(), &worker);
    let gw = Gateway::start(&cfg).await;
    let url = gw.url.clone();
    let child = tokio::spawn(async move {
        concurrent_children(&[&url], "acme", 1, "spend:800:tokens=10").await
    });
    // Reserved by now; the child reports and settles while writes wait.
    // Not scaled: the pause must begin before the child settles (800 ms).
    tokio::time::sleep(Duration::from_millis(400)).await;
    pause_writes(&redis, 1500).await;
    let (admitted, _) = child.await.unwrap();
    assert_eq!(admitted.len(), 1);
    let spent = settled_spend(&admitted[0]);
    // Past the pause and the retry (1 s after the timeout).
    tokio::time::sleep(scaled_ms(3000)).await;
    assert!(
        gw.counter("a2agw_store_errors_total", &["account_settle"])
            .await
            >= 1.0,
        "the first settle failed"
    );
    let acct = account(&gw, "acme").await;
    assert_eq!(acct["reserved"], 0, "{acct}");
    assert_eq!(acct["spent"], spent, "charged once: {acct}");
}

/// Malformed grants are refused with InvalidParams before the worker sees
/// them (small bodies read up front, large ones held), and no task starts.
async fn bad_grants(kind: Kind, bind: Bind, pad: usize) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(
        &worker.url(),
        "[routes.budget]\nmeters = { tokens = 100 }\nover_cap = \"refuse\"",
    )
    .await;
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("m{i}"), json!(1))).collect();
    let table = [
        (
            json!({}),
            "malformed budget: it names neither remainingMs nor a meter",
        ),
        (
            json!({ "meters": many }),
            "malformed budget: 17 meters, more than 16",
        ),
        (
            json!({"meters": {"Tokens": 1}}),
            "malformed budget: meter name \"Tokens\" is not 1 to 64 of [a-z0-9._-]",
        ),
        (
            json!({"remainingMs": 0}),
            "the budget's deadline has already passed (remainingMs is 0)",
        ),
        (json!("lots"), "malformed budget: invalid type"),
        (
            json!({"remainingMs": 1.5}),
            "malformed budget: remainingMs is 1.5",
        ),
        (
            json!({"meters": {"tokens": 500}}),
            "budget over the gateway's cap: meter \"tokens\" is 500, the cap is 100",
        ),
    ];
    for (grant, want) in table {
        let mut msg = budgeted("work:30000", Some(grant.clone()));
        if pad > 0 {
            msg["metadata"]["pad"] = json!("x".repeat(pad));
        }
        let (path, body) = stream_request(bind, None, msg);
        let r = post_json(&gw.url, &path, &[("accept", "text/event-stream")], &body).await;
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        let msg = match bind {
            Bind::JsonRpc => {
                assert_eq!(r.status, 200, "{grant}: {v}");
                assert_eq!(v["error"]["code"], -32602, "{grant}: {v}");
                assert_eq!(v["id"], "b1");
                v["error"]["message"].as_str().unwrap_or("").to_owned()
            }
            Bind::Rest => {
                assert_eq!(r.status, 400, "{grant}: {v}");
                assert_eq!(v["error"]["status"], "INVALID_ARGUMENT", "{grant}: {v}");
                v["error"]["message"].as_str().unwrap_or("").to_owned()
            }
        };
        assert!(
            msg.starts_with(want),
            "{grant}: {msg:?} does not start with {want:?}"
        );
    }
    tokio::time::sleep(scaled_ms(200)).await;
    assert_eq!(
        worker.tasks_started().await,
        0,
        "no refused send created a task"
    );
    // A grant within the cap, and one with none, go through.
    let mut msg = budgeted("quick", Some(json!({"meters": {"tokens": 50}})));
    if pad > 0 {
        msg["metadata"]["pad"] = json!("x".repeat(pad));
    }
    let (mut s, id) = open(&gw.url, bind, None, msg).await;
    let _ = s.rest(scaled_secs(5)).await;
    let (mut s2, id2) = open(&gw.url, bind, None, budgeted("quick", None)).await;
    let _ = s2.rest(scaled_secs(5)).await;
    assert_eq!(worker.tasks_started().await, 2);
    let fwd = forwarded_message(&worker.url(), None, &id).await;
    assert!(
        same_numbers(
            &fwd["metadata"][BUDGET_KEY],
            &json!({"meters": {"tokens": 50}})
        ),
        "{fwd}"
    );
    if pad > 0 {
        assert_eq!(
            fwd["metadata"]["pad"].as_str().map(str::len),
            Some(pad),
            "the held body arrived whole"
        );
    }
    let fwd = forwarded_message(&worker.url(), None, &id2).await;
    assert!(
        same_numbers(
            &fwd["metadata"][BUDGET_KEY],
            &json!({"meters": {"tokens": 100}})
        ),
        "{fwd}"
    );
    assert!(
        gw.counter("a2agw_refusals_total", &["reason=\"budget_malformed\""])
            .await
            >= 6.0
    );
}

#[tokio::test]
async fn bad_grants_refused_python_jsonrpc() {
    bad_grants(Kind::Python, Bind::JsonRpc, 0).await;
}

#[tokio::test]
async fn bad_grants_refused_python_rest_large_body() {
    bad_grants(Kind::Python, Bind::Rest, 100 * 1024).await;
}

#[tokio::test]
async fn bad_grants_refused_rust_rest() {
    bad_grants(Kind::Rust, Bind::Rest, 0).await;
}

#[tokio::test]
async fn bad_grants_refused_rust_jsonrpc_large_body() {
    bad_grants(Kind::Rust, Bind::JsonRpc, 100 * 1024).await;
}

/// A parent on `a2a-protocol-client` 0.15 `Delegation::start_budgeted`,
/// through the gateway (which clamps its grant to the route's cap), is
/// charged exactly what the child reported.
#[tokio::test]
async fn start_budgeted_parent_is_charged_what_the_child_reported() {
    use a2a_protocol_client::delegation::{Delegation, Outcome};
    use a2a_protocol_client::ClientBuilder;
    use a2a_protocol_types::budget::{Budget, BudgetHandle};
    use a2a_protocol_types::message::{Message, Part};
    use a2a_protocol_types::params::MessageSendParams;

    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw =
        Gateway::in_front_of(&worker.url(), "[routes.budget]\nmeters = { tokens = 200 }").await;
    let parent = BudgetHandle::start(
        &Budget::new()
            .with_time(Duration::from_secs(60))
            .with_meter("tokens", 1000)
            .unwrap(),
    );
    let grant = parent
        .grant(&Budget::new().with_meter("tokens", 300).unwrap())
        .expect("the parent can grant 300");
    assert_eq!(parent.remaining("tokens"), Some(700), "300 reserved");
    let client = Arc::new(
        ClientBuilder::new(gw.url.clone())
            .with_protocol_binding("JSONRPC")
            .build()
            .unwrap(),
    );
    let params = MessageSendParams::new(Message::user(
        "budgeted-parent-1",
        vec![Part::text("spend:350:tokens=7")],
    ));
    let child = Delegation::start_budgeted(client, params, grant, None)
        .await
        .expect("the child starts");
    let done = child.wait(std::future::pending()).await;
    assert!(
        matches!(done.outcome, Outcome::Completed(_)),
        "{:?}",
        done.outcome
    );
    let charged = worker.charged();
    assert!(charged >= 14, "the child spent something: {charged}");
    assert_eq!(
        parent.remaining("tokens"),
        Some(1000 - charged),
        "charged the reported {charged}, not the 300 reserved"
    );
    assert_eq!(
        gw.counter("a2agw_budget_clamps_total", &["field=\"tokens\""])
            .await,
        1.0,
        "the 300 asked went to the child as 200"
    );
}

/// A budgeted route does not serve the WebSocket binding, whose frames
/// could carry grants the gateway cannot re-write: the upgrade is refused
/// with a clear error.
#[tokio::test]
async fn budgeted_route_refuses_websocket_upgrades() {
    let worker = PythonWorker::start().await;
    let gw = Gateway::in_front_of(&worker.url(), "[routes.budget]\nmax_deadline = \"1m\"").await;
    let r = request("GET", &gw.url, "/", &crate::harness::http::WS_UPGRADE, b"").await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("enforces budgets"), "{}", r.text());
}

/// A non-blocking `SendMessage` is answered at once, while its child
/// runs on: the deadline still holds after the request ended, and the
/// gateway cancels the child within 250 ms of it.
#[tokio::test]
async fn deadline_outlives_a_non_blocking_send() {
    let worker = Worker::start(Kind::Python).await;
    let gw = Gateway::in_front_of(&worker.url(), "[routes.budget]\nmax_deadline = \"700ms\"").await;
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage",
        "params": {"message": budgeted("work:20000", None), "configuration": {"returnImmediately": true}}});
    let sent = Instant::now();
    let v = post_json(&gw.url, "/", &[], &body).await.json();
    let id = v["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {v}"))
        .to_owned();
    // Not scaled: the scenario needs the answer before the 700 ms deadline.
    assert!(
        sent.elapsed() < Duration::from_millis(700),
        "answered before the deadline"
    );
    let after = canceled_after(&worker, &id, sent).await;
    assert!(
        (Duration::from_millis(700)..=Duration::from_millis(700) + scaled_ms(250)).contains(&after),
        "{after:?}"
    );
    assert_eq!(worker.cancels().await, 1);
}

/// A blocking `SendMessage` is carried as a stream, so its deadline holds
/// as a stream's does: the child is stopped when it passes, and the caller,
/// who stayed, gets the budget-exhausted failure in place of the worker's
/// CANCELED task.
#[tokio::test]
async fn blocking_send_past_its_deadline_is_stopped() {
    let worker = Worker::start(Kind::Python).await;
    let gw = Gateway::in_front_of(&worker.url(), "[routes.budget]\nmax_deadline = \"300ms\"").await;
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage",
        "params": {"message": budgeted("work:3000", None), "configuration": {"returnImmediately": false}}});
    let v = post_json(&gw.url, "/", &[], &body).await.json();
    let task = &v["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{v}");
    let id = task["id"].as_str().unwrap();
    assert_eq!(
        worker.state(None, id).await.as_deref(),
        Some("TASK_STATE_CANCELED")
    );
    assert_eq!(worker.cancels().await, 1);
    // A budgeted child's events are needed while it runs: carried.
    assert_eq!(
        gw.counter(
            "a2agw_blocking_sends_total",
            &["outcome=\"carried\"", "reason=\"budget\""]
        )
        .await,
        1.0
    );
}

/// Caps per caller, the caller named by a header: an API key as it is, a
/// bearer JWT by its `sub`. Each gets its own grant (and account).
#[tokio::test]
async fn callers_get_their_own_caps_and_accounts() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let route = "[routes.budget]\nmeters = { tokens = 100 }\ncaller_header = \"authorization\"\n\n\
        [routes.budget.callers.alice]\nmeters = { tokens = 10 }\n\n\
        [[routes.budget.accounts]]\nper = \"caller\"\nwindow = \"24h\"\nmeters = { tokens = 1000 }\n";
    let gw = Gateway::in_front_of(&worker.url(), route).await;
    // {"sub":"alice","iat":1}, unsigned: the gateway reads, never verifies.
    let alice = "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSIsImlhdCI6MX0.c2ln";
    for (auth, want) in [(alice, 10), ("Bearer key-of-bob", 100)] {
        let (path, body) = stream_request(Bind::JsonRpc, None, budgeted("quick", None));
        let mut s = SseStream::open(&gw.url, &path, &[("authorization", auth)], &body).await;
        let events = s.rest(scaled_secs(5)).await;
        let id = events.iter().find_map(task_id_of).expect("a task");
        let fwd = forwarded_message(&worker.url(), None, &id).await;
        assert!(
            same_numbers(
                &fwd["metadata"][BUDGET_KEY],
                &json!({"meters": {"tokens": want}})
            ),
            "{auth}: {fwd}"
        );
    }
    let v = request("GET", &gw.admin, "/budgets", &[], b"").await.json();
    let holders: Vec<&str> = v["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["holder"].as_str())
        .collect();
    // A JWT's subject as it is; an API key only as its fingerprint, here and
    // in the store.
    let bob = a2a_gateway::budget::fingerprint("Bearer key-of-bob");
    assert!(
        holders.contains(&"alice") && holders.contains(&bob.as_str()),
        "{v}"
    );
    assert!(!v.to_string().contains("key-of-bob"), "{v}");
}

/// The route of the tests below: every child's `tokens` capped at 100.
const CAP_100: &str = "[routes.budget]\nmeters = { tokens = 100 }";

/// A message granting far more than [`CAP_100`] allows.
fn over_cap() -> Value {
    budgeted("quick", Some(json!({"meters": {"tokens": 1_000_000}})))
}

/// Asserts, from the worker's own record of the message, that the child
/// got its grant capped at 100 tokens.
async fn assert_capped(worker_url: &str, task_id: &str) {
    let fwd = forwarded_message(worker_url, None, task_id).await;
    assert!(
        same_numbers(
            &fwd["metadata"][BUDGET_KEY],
            &json!({"meters": {"tokens": 100}})
        ),
        "{fwd}"
    );
}

/// A grant whose key is written twice is ambiguous: a worker that keeps
/// metadata as a JSON value takes the last copy, one that reads the tokens
/// as they come may take the first. The budgeted route refuses it before the
/// worker sees it (`tests/strict_reading.rs` has the other cases).
#[tokio::test]
async fn duplicate_grant_key_is_refused() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(&worker.url(), CAP_100).await;
    let m = message("quick");
    let mid = m["messageId"].as_str().unwrap();
    // The second key spells the slash as an escape; JSON reads it the same.
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{{"messageId":"{mid}","role":"ROLE_USER","parts":[{{"text":"quick"}}],"extensions":["{BUDGET_URI}"],"metadata":{{"{BUDGET_KEY}":{{"meters":{{"tokens":5}}}},"a2a-rust.com\/budget":{{"meters":{{"tokens":1000000}}}}}}}}}}}}"#
    );
    let h = [("content-type", "application/json")];
    let v = request("POST", &gw.url, "/", &h, body.as_bytes())
        .await
        .json();
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert_eq!(v["id"], 1, "{v}");
    assert_eq!(worker.tasks_started(), 0, "the worker started a task");
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"body_duplicate_key\""])
            .await,
        1.0
    );
}

/// An a2a-rust worker runs the `SendMessage` calls of a JSON-RPC batch. On a
/// budgeted route a batch holding a send is refused whole, one error per
/// call, and the worker starts nothing; a batch of reads passes untouched.
#[tokio::test]
async fn batch_with_a_send_is_refused_on_a_budgeted_route() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(&worker.url(), CAP_100).await;
    let send = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "SendMessage",
            "params": {"message": over_cap()}})
    };
    // Direct to the worker, such a batch does run: the refusal is the
    // gateway's doing.
    let direct = post_json(&worker.url(), "/", &[], &json!([send(1)]))
        .await
        .json();
    let child = direct[0]["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("the worker ran the batch: {direct}"))
        .to_owned();
    let started = worker.tasks_started();

    let get = json!({"jsonrpc": "2.0", "id": "g", "method": "GetTask", "params": {"id": child}});
    let v = post_json(&gw.url, "/", &[], &json!([send(2), get, send(3)]))
        .await
        .json();
    let answers = v.as_array().unwrap_or_else(|| panic!("an array: {v}"));
    let ids: Vec<&Value> = answers.iter().map(|a| &a["id"]).collect();
    assert_eq!(ids, [&json!(2), &json!("g"), &json!(3)], "{v}");
    for a in answers {
        assert_eq!(a["error"]["code"], -32004, "{v}");
        assert!(
            a["error"]["message"]
                .as_str()
                .unwrap()
                .contains("outside JSON-RPC batches"),
            "{v}"
        );
    }
    assert_eq!(worker.tasks_started(), started, "the worker started a task");
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"batch_send\""])
            .await,
        1.0
    );

    let reads = json!([get, {"jsonrpc": "2.0", "id": "l", "method": "ListTasks", "params": {}}]);
    let v = post_json(&gw.url, "/", &[], &reads).await.json();
    assert_eq!(v[0]["result"]["id"], child.as_str(), "{v}");
    assert_eq!(v[1]["id"], "l", "{v}");
    assert_eq!(
        gw.counter("a2agw_untracked_total", &["reason=\"jsonrpc_batch\""])
            .await,
        1.0
    );
}

/// The Python SDK reads JSON bodies in UTF-16 and UTF-8 with a BOM, which
/// the gateway does not read: a budgeted route refuses a body it cannot
/// read rather than pass a grant it never checked.
#[tokio::test]
async fn unreadable_body_is_refused_on_a_budgeted_route() {
    let worker = Worker::start(Kind::Python).await;
    let gw = Gateway::in_front_of(&worker.url(), CAP_100).await;
    let call = || json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": over_cap()}});
    let utf16 = |v: &Value| -> Vec<u8> {
        let mut b = vec![0xFF, 0xFE];
        b.extend(v.to_string().encode_utf16().flat_map(u16::to_le_bytes));
        b
    };
    let bom = |v: &Value| -> Vec<u8> {
        let mut b = vec![0xEF, 0xBB, 0xBF];
        b.extend(v.to_string().into_bytes());
        b
    };
    let h = [("content-type", "application/json")];
    // Direct, the worker runs both: the refusals are the gateway's doing.
    for body in [utf16(&call()), bom(&call())] {
        let v = request("POST", &worker.url(), "/", &h, &body).await.json();
        assert!(v["result"]["task"]["id"].is_string(), "{v}");
    }
    let started = worker.tasks_started().await;
    for body in [utf16(&call()), bom(&call())] {
        let v = request("POST", &gw.url, "/", &h, &body).await.json();
        assert_eq!(v["error"]["code"], -32700, "{v}");
        assert_eq!(v["id"], Value::Null, "{v}");
    }
    let r = request(
        "POST",
        &gw.url,
        "/message:send",
        &h,
        &bom(&json!({"message": over_cap()})),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["status"], "INVALID_ARGUMENT");
    assert_eq!(
        worker.tasks_started().await,
        started,
        "the worker started a task"
    );
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"body_not_utf8\""])
            .await,
        3.0
    );
}

/// The Python SDK routes the decoded path, so `/message%3Asend` is a REST
/// send there: the gateway reads it as one and caps its grant.
#[tokio::test]
async fn percent_encoded_rest_send_is_capped() {
    let worker = Worker::start(Kind::Python).await;
    let gw = Gateway::in_front_of(&worker.url(), CAP_100).await;
    let v = post_json(
        &gw.url,
        "/message%3Asend",
        &[],
        &json!({ "message": over_cap() }),
    )
    .await
    .json();
    let id = v["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {v}"));
    assert_capped(&worker.url(), id).await;
}

/// A v0.3 send name is not read as a send, so a budgeted route refuses it
/// rather than pass it unadmitted to a worker that may still serve v0.3;
/// on a route that checks nothing it reaches the worker, which (a2a-rust
/// 0.15) answers -32601.
#[tokio::test]
async fn v03_send_is_refused_on_a_budgeted_route() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let capped = Gateway::in_front_of(&worker.url(), CAP_100).await;
    let plain = Gateway::in_front_of(&worker.url(), "worker_leases = \"observe\"").await;
    let call = json!({"jsonrpc": "2.0", "id": "v3", "method": "message/send",
        "params": {"message": over_cap()}});
    let v = post_json(&capped.url, "/", &[], &call).await.json();
    assert_eq!(v["id"], "v3", "{v}");
    assert_eq!(v["error"]["code"], -32004, "{v}");
    assert_eq!(
        capped
            .counter("a2agw_refusals_total", &["reason=\"v03_send\""])
            .await,
        1.0
    );
    let v = post_json(&plain.url, "/", &[], &call).await.json();
    assert_eq!(v["error"]["code"], -32601, "the worker's answer: {v}");
    assert_eq!(worker.tasks_started(), 0);
}
