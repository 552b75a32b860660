//! Issue 43 items 2 and 3: a tenant is a caller's word. Naming another
//! tenant must not buy a second, ownerless record of someone else's task
//! (whose leaving would cancel it), nor a fresh budget account or a laxer
//! cap. Against the Python `a2a-sdk` worker, which ignores the tenant when
//! it looks a task up, as the review found.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, request};
use crate::harness::jwt::{api_keys_file, stream_as};
use crate::harness::python_worker::PythonWorker;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::worker::message;
use crate::harness::{scaled_ms, scaled_secs};

const ALICE: &str = "ak-alice-0123456789";
const BOB: &str = "ak-bob-9876543210";

/// An API keys file naming Alice's and Bob's keys.
fn key_file(test: &str) -> PathBuf {
    api_keys_file(
        &format!("tenants-{test}"),
        &[(ALICE, "alice"), (BOB, "bob")],
    )
}

/// Bob subscribes to Alice's task under a tenant Alice never used. The
/// worker serves him (it ignores the tenant), but the gateway keeps one
/// record, Alice's: Bob counts as no watcher, and his leaving cancels
/// nothing. Alice's own leaving still does. On the code before the fix, a
/// second, ownerless record made Bob its watcher and his hang-up sent a
/// `CancelTask` for Alice's task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_name_moves_nothing_of_an_owned_task() {
    let keys = key_file("alias");
    let worker = PythonWorker::start().await;
    let gw = Gateway::in_front_of(
        &worker.url(),
        &format!("[routes.auth]\napi_keys_file = \"{}\"\n", keys.display()),
    )
    .await;

    let send = json!({"message": message("work:30000"), "tenant": "alice-team"});
    let (alice, id) = stream_as(&gw.url, ALICE, "SendStreamingMessage", send).await;
    let (bob, bob_id) = stream_as(
        &gw.url,
        BOB,
        "SubscribeToTask",
        json!({"id": id, "tenant": "bob-team"}),
    )
    .await;
    assert_eq!(bob_id, id, "the worker served Bob's subscription");

    let v = request("GET", &gw.admin, &format!("/tasks/{id}"), &[], b"")
        .await
        .json();
    assert_eq!(v["owner"], "key:alice", "{v}");
    assert_eq!(v["tenant"], "alice-team", "{v}");
    assert_eq!(v["watchers"], 1, "Bob does not watch Alice's task: {v}");

    bob.close();
    tokio::time::sleep(scaled_ms(1500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_WORKING"),
        "Bob leaving cancelled Alice's task: {}",
        gw.log_text()
    );
    assert_eq!(
        worker.stats().await["cancels"],
        0,
        "no CancelTask reached it"
    );

    // Alice leaving is still a cascade, in the tenant she named.
    alice.close();
    let got = crate::harness::http::wait_for_state(
        &worker.url(),
        None,
        &id,
        "TASK_STATE_CANCELED",
        scaled_secs(5),
    )
    .await;
    assert!(got.is_ok(), "{got:?}: {}", gw.log_text());
}

/// A JSON-RPC answer is the gateway's refusal of the tenant.
fn assert_not_allowed(answer: &Value, tenant: Option<&str>) {
    let error = &answer["error"];
    assert_eq!(error["code"], -32004, "{tenant:?}: {answer}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("may not name this tenant")),
        "{tenant:?}: {answer}"
    );
}

/// A route binding tenants to identities (`[routes.auth] tenants`): Alice
/// may use `acme` only. Every other tenant name, and none, is refused
/// before the worker sees it, on every binding, so the `acme` cap holds
/// (10 tokens where the route allows 100) and no fresh account opens. A
/// caller the table does not list may name no tenant. Against the a2a-rust
/// worker, which reports the budget it was handed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_hopping_gets_no_more_than_the_callers_tenants_allow() {
    let keys = key_file("hop");
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(
        &worker.url(),
        &format!(
            "[routes.auth]\napi_keys_file = \"{}\"\ntenants = {{ \"key:alice\" = [\"acme\"] }}\n\
             [routes.budget]\nmeters = {{ tokens = 100 }}\n\
             [routes.budget.tenants.acme]\nmeters = {{ tokens = 10 }}\n\
             [[routes.budget.accounts]]\nper = \"tenant\"\nwindow = \"1h\"\nmeters = {{ tokens = 300 }}\n",
            keys.display()
        ),
    )
    .await;
    let grant = |tenant: Option<&str>| {
        let mut m = message("quick");
        m["metadata"] = json!({"a2a-rust.com/budget": {"meters": {"tokens": 1_000_000}}});
        let mut p = json!({"message": m});
        if let Some(t) = tenant {
            p["tenant"] = json!(t);
        }
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": p})
    };
    let started = worker.tasks_started();
    // Alice in her tenant: capped at 10.
    let r = post_json(&gw.url, "/", &[("x-api-key", ALICE)], &grant(Some("acme"))).await;
    assert_eq!(r.status, 200);
    assert!(r.json().get("result").is_some(), "{}", r.text());
    // Any other name, or none: refused, on JSON-RPC and REST alike.
    for tenant in [None, Some("acme1"), Some("ACME"), Some("")] {
        let r = post_json(&gw.url, "/", &[("x-api-key", ALICE)], &grant(tenant)).await;
        assert_not_allowed(&r.json(), tenant);
    }
    let rest = post_json(
        &gw.url,
        "/acme2/message:send",
        &[("x-api-key", ALICE)],
        &json!({"message": message("quick")}),
    )
    .await;
    assert_eq!(rest.status, 403, "{}", rest.text());
    // Bob has no entry: no tenant only.
    let r = post_json(&gw.url, "/", &[("x-api-key", BOB)], &grant(Some("acme"))).await;
    assert_not_allowed(&r.json(), Some("acme"));
    let r = post_json(&gw.url, "/", &[("x-api-key", BOB)], &grant(None)).await;
    assert!(r.json().get("result").is_some(), "{}", r.text());

    assert_eq!(
        worker.tasks_started() - started,
        2,
        "only Alice's acme send and Bob's untenanted one reached the worker"
    );
    let budgets = request("GET", &gw.admin, "/budgets", &[], b"").await.json();
    let holders: Vec<&str> = budgets["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["holder"].as_str())
        .collect();
    assert!(
        holders.iter().all(|h| ["acme", ""].contains(h)),
        "accounts only for acme and the untenanted: {budgets}"
    );
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"tenant_not_allowed\""])
            .await,
        6.0
    );
}
