//! Issue 43, the smaller doors: the agent-card exemption is the route's
//! card only, and a route that binds tenants to callers serves no binding
//! whose frames it cannot refuse. Against a real a2a-rust worker.

use crate::harness::gateway::Gateway;
use crate::harness::http::request;
use crate::harness::jwt::api_keys_file;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};

const KEY: &str = "ak-edges-0123456789";

/// A route requiring API keys, whose `tenants` binds `key:edges` to `acme`.
async fn gateway(worker: &RustWorker, test: &str) -> Gateway {
    let keys = api_keys_file(test, &[(KEY, "edges")]);
    Gateway::in_front_of(
        &worker.url(),
        &format!(
            "[routes.auth]\napi_keys_file = \"{}\"\ntenants = {{ \"key:edges\" = [\"acme\"] }}\n",
            keys.display()
        ),
    )
    .await
}

/// The route's own card is public; any other path that merely ends like
/// one is not (before the fix, every GET ending in
/// `/.well-known/agent-card.json` passed without a credential).
#[tokio::test]
async fn only_the_routes_own_card_is_public() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = gateway(&worker, "card").await;
    let card = request("GET", &gw.url, "/.well-known/agent-card.json", &[], b"").await;
    assert_eq!(card.status, 200, "{}", card.text());
    for path in [
        "/x/.well-known/agent-card.json",
        "/tasks/t1/.well-known/agent-card.json",
        "/acme/.well-known/agent-card.json",
    ] {
        let r = request("GET", &gw.url, path, &[], b"").await;
        assert_eq!(r.status, 401, "{path}: {}", r.text());
    }
    let with_key = request(
        "GET",
        &gw.url,
        "/x/.well-known/agent-card.json",
        &[("x-api-key", KEY)],
        b"",
    )
    .await;
    assert_ne!(with_key.status, 401, "a verified caller passes");
}

/// WebSocket frames cannot be refused one by one without breaking the
/// socket, so a route that binds tenants refuses the upgrade with a clear
/// error (as a budgeted route does), even for a verified caller.
#[tokio::test]
async fn a_route_binding_tenants_refuses_websocket_upgrades() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = gateway(&worker, "ws").await;
    let r = request(
        "GET",
        &gw.url,
        "/",
        &[&[("x-api-key", KEY)][..], &crate::harness::http::WS_UPGRADE].concat(),
        b"",
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("binds tenants"), "{}", r.text());
}
