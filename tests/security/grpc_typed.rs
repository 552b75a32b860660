//! Issue 43 item 1: a content type the caller picks must not skip the send
//! checks. The worker is the Python `a2a-sdk` agent served by Hypercorn,
//! which speaks h2c and runs a JSON send whatever its content type
//! (`h2c_workers.rs` shows it without the gateway). On a route that checks
//! sends, a gRPC-typed request is read as a call of the A2A service or
//! refused; on a route that checks nothing it passes, as documented.

use serde_json::json;

use crate::harness::gateway::Gateway;
use crate::harness::h2c::{jsonrpc_send, post_typed, rest_send, GRPC, GRPC_JSON};
use crate::harness::http::post_json;
use crate::harness::jwt::api_keys_file;
use crate::harness::python_worker::PythonWorker;

const KEY: &str = "ak-grpc-typed-0123456789";
/// gRPC's PERMISSION_DENIED.
const PERMISSION_DENIED: i32 = 7;

/// Five gRPC-typed requests that would each run an uncapped send (or an
/// unread call) at the worker are refused on a budgeted route with API
/// keys: the worker sees none of them, and no grant over the cap reaches
/// it. A JSON send on the same route is capped as before. Before the fix,
/// each gRPC-typed send reached the worker with its 1,000,000 tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_typed_sends_are_refused_where_sends_are_checked() {
    let keys = api_keys_file("grpc-typed", &[(KEY, "hb")]);
    let worker = PythonWorker::start_h2c(&[]).await;
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"hb\"\nworker = \"{w}\"\npath_prefix = \"/hb\"\n\
         [routes.auth]\napi_keys_file = \"{keys}\"\n\
         [routes.budget]\nmeters = {{ tokens = 100 }}\n\
         [[routes.budget.accounts]]\nper = \"route\"\nwindow = \"1h\"\nmeters = {{ tokens = 300 }}\n\
         [[routes]]\nname = \"open\"\nworker = \"{w}\"\npath_prefix = \"/open\"\nworker_leases = \"observe\"\n",
        w = worker.url(),
        keys = keys.display()
    ))
    .await;
    let grant = || Some(json!({"meters": {"tokens": 1_000_000}}));
    let auth = [("x-api-key", KEY)];
    let attempts = [
        // A REST send typed gRPC: no A2A gRPC method at that path.
        ("/hb/message:send", GRPC, rest_send("quick", grant())),
        ("/hb/message:stream", GRPC, rest_send("quick", grant())),
        // A JSON-RPC send typed as gRPC's JSON codec.
        ("/hb/", GRPC_JSON, jsonrpc_send("quick", grant())),
        // The A2A service's own method, in a codec the gateway cannot read.
        (
            "/hb/lf.a2a.v1.A2AService/SendMessage",
            GRPC_JSON,
            rest_send("quick", grant()),
        ),
        // Another gRPC service.
        ("/hb/grpc.health.v1.Health/Check", GRPC, json!({})),
    ];
    for (path, ct, body) in &attempts {
        let r = post_typed(&gw.url, path, ct, &auth, body).await;
        assert_eq!(
            r.grpc_status(),
            Some(PERMISSION_DENIED),
            "{path} {ct}: {r:?}"
        );
    }
    assert_eq!(worker.stats().await["tasks_started"], 0);
    assert!(worker.budgets_seen().await.is_empty());
    let posts: Vec<_> = worker
        .requests_seen()
        .await
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert!(posts.is_empty(), "the worker saw {posts:?}");
    for reason in ["grpc_other_service", "grpc_codec"] {
        assert!(
            gw.counter("a2agw_refusals_total", &[&format!("reason=\"{reason}\"")])
                .await
                >= 1.0,
            "{reason}"
        );
    }

    // The same send as JSON: read, capped at the route's 100.
    let r = post_json(
        &gw.url,
        "/hb/message:send",
        &auth,
        &rest_send("quick", grant()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = worker.budgets_seen().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0]["meters"]["tokens"].as_f64(),
        Some(100.0),
        "{seen:?}"
    );

    // A route that checks nothing passes what it cannot read, verbatim.
    let r = post_typed(
        &gw.url,
        "/open/message:send",
        GRPC,
        &[],
        &rest_send("quick", None),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(worker.stats().await["tasks_started"], 2);
}
