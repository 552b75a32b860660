//! Issue 43 item 5 (in part): JWT keys fetched from a JWKS URL that stops
//! answering stay valid only until `jwks_max_stale` after the last good
//! fetch, then every JWT is refused (fail closed) until a fetch succeeds
//! again. The identity provider is an HTTP endpoint the test serves on
//! loopback; the worker is a real a2a-rust one.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::post_json;
use crate::harness::jwt::{JwksServer, Signer, AUD, ISS};
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::worker::message;
use crate::harness::{scaled_count, scaled_ms};

/// A JSON-RPC `SendMessage` with `bearer`: status and body.
async fn send(gw: &Gateway, bearer: &str) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = post_json(&gw.url, "/", &[("authorization", bearer)], &body).await;
    (r.status, r.json())
}

/// Keys fetched every second with `jwks_max_stale` a few seconds (one
/// refresh plus 3 s, scaled): while the endpoint answers, a token passes;
/// once it stops, the same token still passes before the bound (the last
/// good fetch plus `jwks_max_stale`) and is refused (401, the worker
/// starts nothing) after it, with one warning and `a2agw_jwks_stale` at
/// 1; when the endpoint answers again, the token passes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwks_outage_past_max_stale_refuses_every_jwt() {
    let signer = Signer::ed25519("idp-1");
    let idp = JwksServer::start(json!({"keys": [signer.jwk]}).to_string()).await;
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let max_stale = Duration::from_secs(1) + scaled_ms(3000);
    let gw = Gateway::in_front_of(
        &worker.url(),
        &format!(
            "[routes.auth]\njwks_url = \"{}\"\njwks_refresh = \"1s\"\njwks_max_stale = \"{}ms\"\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\n",
            idp.url,
            max_stale.as_millis()
        ),
    )
    .await;
    let bearer = format!("Bearer {}", signer.token(json!({})));
    let (status, body) = send(&gw, &bearer).await;
    assert_eq!(status, 200, "{body}; log:\n{}", gw.log_text());
    assert_eq!(
        gw.counter("a2agw_jwks_stale", &["route=\"w\""]).await,
        0.0,
        "exported at 0"
    );

    // Fetched again in the background (at least once more), then down.
    let fetched = idp.fetches();
    for _ in 0..scaled_count(100) {
        if idp.fetches() > fetched {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(idp.fetches() > fetched, "the keys are fetched every second");
    let last_good = idp.stop().await.expect("a fetch was served");
    let bound = last_good + max_stale;

    // Before the bound: the last keys still verify.
    let (status, body) = send(&gw, &bearer).await;
    let asked = Instant::now();
    assert_eq!(status, 200, "before the bound: {body}");
    assert!(
        asked < bound,
        "the check ran before the bound ({:?} after the last fetch)",
        asked - last_good
    );
    assert_eq!(worker.tasks_started(), 2);

    // After it: refused, and nothing reaches the worker.
    tokio::time::sleep(bound.saturating_duration_since(Instant::now()) + scaled_ms(200)).await;
    let (status, body) = send(&gw, &bearer).await;
    assert_eq!(
        status,
        401,
        "past jwks_max_stale: {body}; log:\n{}",
        gw.log_text()
    );
    assert_eq!(
        worker.tasks_started(),
        2,
        "the refused request started nothing"
    );
    // Dropped by the refresher (it wakes every second): gauge and one
    // warning, however many refreshes fail after.
    let stale = gw
        .counter_reaching("a2agw_jwks_stale", &["route=\"w\""], 1.0)
        .await;
    assert_eq!(stale, 1.0, "log:\n{}", gw.log_text());
    tokio::time::sleep(scaled_ms(2500)).await;
    let (status, _) = send(&gw, &bearer).await;
    assert_eq!(status, 401, "still refused");
    let log = gw.log_text();
    assert_eq!(
        log.matches("every JWT is refused until a read succeeds")
            .count(),
        1,
        "warned once: {log}"
    );

    // The provider answers again: the next fetch restores the keys.
    idp.resume();
    let mut status = 0;
    for _ in 0..scaled_count(100) {
        status = send(&gw, &bearer).await.0;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200, "restored; log:\n{}", gw.log_text());
    assert_eq!(worker.tasks_started(), 3);
    assert_eq!(gw.counter("a2agw_jwks_stale", &["route=\"w\""]).await, 0.0);
}
