//! Issue 32 item 1: verified callers. Routes with `[routes.auth]` in front
//! of a real a2a-rust worker; JWTs signed by keys the test generates
//! (Ed25519 and P-256, with `rcgen`) and API keys checked against a file of
//! their SHA-256 hashes. What the worker did is read from the worker.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, request};
use crate::harness::jwt::{stream_as, JwksServer, Signer, AUD, ISS};
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::stream::SseStream;
use crate::harness::worker::{message, task_id_of};
use crate::harness::{scaled_count, scaled_ms, scaled_secs};

const API_KEY: &str = "ak-billing-0123456789";
const OPS_KEY: &str = "ak-ops-9876543210";
const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A directory holding `jwks.json` (the given keys), `keys` (the API key's
/// hash, named "billing") and `pub.pem` (the first key's public half).
fn files(test: &str, signers: &[&Signer]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("a2agw-auth-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys: Vec<&Value> = signers.iter().map(|s| &s.jwk).collect();
    std::fs::write(dir.join("jwks.json"), json!({ "keys": keys }).to_string()).unwrap();
    let hex = |key: &str| a2a_gateway::digest::sha256_hex(key.as_bytes());
    std::fs::write(
        dir.join("keys"),
        format!(
            "# test keys\n{} billing\n{} ops\n",
            hex(API_KEY),
            hex(OPS_KEY)
        ),
    )
    .unwrap();
    std::fs::write(dir.join("pub.pem"), &signers[0].public_pem).unwrap();
    dir
}

fn auth_table(dir: &std::path::Path, keys: &str, extra: &str) -> String {
    format!(
        "[routes.auth]\n{keys} = \"{}\"\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\napi_keys_file = \"{}\"\n{extra}",
        dir.join(if keys == "jwt_public_key" { "pub.pem" } else { "jwks.json" }).display(),
        dir.join("keys").display()
    )
}

/// A JSON-RPC `SendMessage` ("quick") with `headers`: status, body, and
/// the `WWW-Authenticate` value.
async fn send(url: &str, headers: &[(&str, &str)]) -> (u16, Value, Option<String>) {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = post_json(url, "/", headers, &body).await;
    let challenge = r.header("www-authenticate").map(str::to_owned);
    (r.status, r.json(), challenge)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_expired_or_missing_credentials_are_refused_and_start_no_child() {
    let good = Signer::ed25519("k1");
    let es = Signer::p256("k2");
    let other = Signer::ed25519("k1"); // same kid, not in the set: a forgery
    let dir = files("refused", &[&good, &es]);
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(&worker.url(), &auth_table(&dir, "jwks_file", "")).await;

    let bearer = |t: String| format!("Bearer {t}");
    let refused: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("no credential", vec![]),
        (
            "forged signature",
            vec![("authorization", bearer(other.token(json!({}))))],
        ),
        (
            "expired",
            vec![(
                "authorization",
                bearer(good.token(json!({"exp": now() - 3600}))),
            )],
        ),
        (
            "not yet valid",
            vec![(
                "authorization",
                bearer(good.token(json!({"nbf": now() + 3600}))),
            )],
        ),
        (
            "wrong audience",
            vec![(
                "authorization",
                bearer(good.token(json!({"aud": "someone-else"}))),
            )],
        ),
        (
            "wrong issuer",
            vec![(
                "authorization",
                bearer(good.token(json!({"iss": "https://evil"}))),
            )],
        ),
        (
            "no exp",
            vec![("authorization", bearer(good.token(json!({"exp": null}))))],
        ),
        (
            "alg none",
            vec![(
                "authorization",
                // {"alg":"none"}.{"sub":"alice",...}. : an unsigned token
                bearer(format!(
                    "eyJhbGciOiJub25lIn0.{}.",
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
                        json!({"iss": ISS, "aud": AUD, "sub": "alice", "exp": now() + 3600})
                            .to_string()
                    )
                )),
            )],
        ),
        (
            "unknown API key",
            vec![("x-api-key", "ak-guess".to_string())],
        ),
        (
            "not a bearer",
            vec![("authorization", "Basic YTpi".to_string())],
        ),
    ];
    for (case, headers) in &refused {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, body, challenge) = send(&gw.url, &h).await;
        assert_eq!(status, 401, "{case}: {body}");
        assert_eq!(body["error"]["code"], -32600, "{case}: {body}");
        assert_eq!(body["id"], Value::Null, "{case}: {body}");
        let challenge = challenge.unwrap_or_else(|| panic!("{case}: no WWW-Authenticate"));
        assert!(
            challenge.starts_with("Bearer realm=\"a2a-gateway\""),
            "{case}: {challenge}"
        );
        assert_eq!(
            challenge.contains("invalid_token"),
            *case != "no credential",
            "{case}: {challenge}"
        );
    }
    assert_eq!(
        worker.tasks_started(),
        0,
        "no refused call reached the worker"
    );

    // REST callers get the REST shape.
    let r = post_json(
        &gw.url,
        "/message:send",
        &[],
        &json!({"message": message("quick")}),
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["error"]["status"], "UNAUTHENTICATED");
    // The agent card stays public.
    let r = request("GET", &gw.url, "/.well-known/agent-card.json", &[], b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(worker.tasks_started(), 0);

    // Verified callers pass: EdDSA and ES256 JWTs, and the API key.
    for (case, h) in [
        ("EdDSA", ("authorization", bearer(good.token(json!({}))))),
        (
            "ES256",
            ("authorization", bearer(es.token(json!({"sub": "bob"})))),
        ),
        ("API key", ("x-api-key", API_KEY.to_string())),
    ] {
        let (status, body, _) = send(&gw.url, &[(h.0, h.1.as_str())]).await;
        assert_eq!(status, 200, "{case}: {body}");
        assert!(body["result"]["task"]["id"].is_string(), "{case}: {body}");
    }
    assert_eq!(worker.tasks_started(), 3);
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"credential_rejected\""])
            .await,
        (refused.len() - 1) as f64
    );
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"unauthenticated\""])
            .await,
        2.0
    );
    // Nothing secret in the log: not the API key, not a token.
    let log = gw.log_text();
    assert!(!log.contains(API_KEY), "{log}");
    assert!(!log.contains(&good.token(json!({}))[..40]), "{log}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A JWT's subject and an API key's name are identities of two kinds: a
/// token whose `sub` is `key:billing` does not land in the account of the
/// API key named `billing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_kinds_of_identity_never_share_an_account() {
    let signer = Signer::p256("k");
    let dir = files("accounts", &[&signer]);
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let route = auth_table(
        &dir,
        "jwt_public_key",
        "[routes.budget]\nmeters = { tokens = 100 }\n\n\
         [routes.budget.callers.\"key:billing\"]\nmeters = { tokens = 10 }\n\n\
         [[routes.budget.accounts]]\nper = \"caller\"\nwindow = \"24h\"\nmeters = { tokens = 1000 }\n",
    );
    let gw = Gateway::in_front_of(&worker.url(), &route).await;
    let forged = format!("Bearer {}", signer.token(json!({"sub": "key:billing"})));
    let mut ids = Vec::new();
    for h in [("authorization", forged.as_str()), ("x-api-key", API_KEY)] {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
            "params": {"message": message("quick")}});
        let mut s = SseStream::open(&gw.url, "/", &[h], &body).await;
        assert_eq!(s.status, 200, "{h:?}");
        let events = s.rest(scaled_secs(5)).await;
        ids.push(events.iter().find_map(task_id_of).expect("a task"));
    }
    let v = request("GET", &gw.admin, "/budgets", &[], b"").await.json();
    let mut holders: Vec<String> = v["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["holder"].as_str().map(str::to_owned))
        .collect();
    holders.sort();
    assert_eq!(holders, ["jwt:key:billing", "key:billing"], "{v}");
    // The caps by caller apply to the API key's identity only.
    for (id, want) in ids.iter().zip([100, 10]) {
        let body = json!({"jsonrpc": "2.0", "id": "h", "method": "GetTask",
            "params": {"id": id, "historyLength": 10}});
        let got = post_json(&worker.url(), "/", &[], &body).await.json();
        let granted =
            &got["result"]["history"][0]["metadata"]["a2a-rust.com/budget"]["meters"]["tokens"];
        assert_eq!(granted.as_f64(), Some(f64::from(want)), "{got}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `mode = "optional"`: a caller without a credential passes unidentified;
/// a bad credential is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_auth_passes_anonymous_callers_only() {
    let signer = Signer::ed25519("k");
    let dir = files("optional", &[&signer]);
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(
        &worker.url(),
        &auth_table(&dir, "jwks_file", "mode = \"optional\"\n"),
    )
    .await;
    let (status, body, _) = send(&gw.url, &[]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = send(&gw.url, &[("x-api-key", "wrong")]).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(worker.tasks_started(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

/// The worker's state of `id`, polled until it is `want` (at most
/// `within`); the last state seen.
async fn wait_state(
    worker: &RustWorker,
    id: &str,
    want: &str,
    within: std::time::Duration,
) -> Option<String> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let s = worker.state(None, id).await;
        if s.as_deref() == Some(want) || tokio::time::Instant::now() > until {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Issue 32 item 2: the identity that started a task owns it. Another
/// identity's subscription is passed to the worker but does not keep the
/// child alive, and its `GetTask`s with the lease extension do not renew
/// the child's lease; the owner's own second stream does keep it alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_keeps_a_child_alive_or_renews_its_lease() {
    let signer = Signer::ed25519("k");
    let dir = files("owner", &[&signer]);
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(&worker.url(), &auth_table(&dir, "jwks_file", "")).await;
    let send = |text: &str| json!({"message": message(text)});

    // Another identity subscribes; the owner leaves: the child is cancelled.
    let (owner, id) = stream_as(&gw.url, API_KEY, "SendStreamingMessage", send("work:30000")).await;
    let (other, sub_id) = stream_as(&gw.url, OPS_KEY, "SubscribeToTask", json!({"id": id})).await;
    assert_eq!(
        sub_id, id,
        "the worker served the other identity's subscription"
    );
    let v = request("GET", &gw.admin, &format!("/tasks/{id}"), &[], b"")
        .await
        .json();
    assert_eq!(v["owner"], "key:billing", "{v}");
    assert_eq!(v["watchers"], 1, "the other identity does not watch: {v}");
    owner.close();
    let got = wait_state(&worker, &id, "TASK_STATE_CANCELED", scaled_secs(5)).await;
    assert_eq!(
        got.as_deref(),
        Some("TASK_STATE_CANCELED"),
        "{}",
        gw.log_text()
    );
    drop(other);
    tokio::time::sleep(scaled_secs(1)).await;
    assert_eq!(worker.cancels(), 1, "one cancel, for the owner's leaving");

    // The owner's own subscription keeps its child alive; it leaving last
    // cancels the child.
    let (first, id) = stream_as(&gw.url, API_KEY, "SendStreamingMessage", send("work:30000")).await;
    let (second, _) = stream_as(&gw.url, API_KEY, "SubscribeToTask", json!({"id": id})).await;
    first.close();
    tokio::time::sleep(scaled_ms(1500)).await;
    assert_eq!(
        worker.state(None, &id).await.as_deref(),
        Some("TASK_STATE_WORKING"),
        "the owner still watches"
    );
    second.close();
    let got = wait_state(&worker, &id, "TASK_STATE_CANCELED", scaled_secs(5)).await;
    assert_eq!(got.as_deref(), Some("TASK_STATE_CANCELED"));

    // A leased child (2 s): the other identity's renewals do not count.
    let mut m = message("work:30000");
    m["metadata"] = json!({"a2a-rust.com/lease": {"ttlMs": 2000}});
    m["extensions"] = json!([LEASE_URI]);
    let opened = tokio::time::Instant::now();
    let (_owner, id) = stream_as(
        &gw.url,
        API_KEY,
        "SendStreamingMessage",
        json!({"message": m}),
    )
    .await;
    let get = json!({"jsonrpc": "2.0", "id": 5, "method": "GetTask", "params": {"id": id}});
    let mut lapsed = None;
    while opened.elapsed() < std::time::Duration::from_secs(2) + scaled_secs(1) {
        let r = post_json(
            &gw.url,
            "/",
            &[("x-api-key", OPS_KEY), ("a2a-extensions", LEASE_URI)],
            &get,
        )
        .await;
        assert_eq!(r.status, 200, "passed to the worker: {}", r.text());
        if worker.state(None, &id).await.as_deref() == Some("TASK_STATE_CANCELED") {
            lapsed = Some(opened.elapsed());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert!(
        lapsed.is_some(),
        "the lease lapsed though another identity polled: {}",
        gw.log_text()
    );
    assert!(
        gw.counter("a2agw_lease_renewals_total", &["outcome=\"not_owner\""])
            .await
            >= 1.0
    );
    assert_eq!(
        gw.counter("a2agw_lease_renewals_total", &["outcome=\"renewed\""])
            .await,
        0.0
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A `poll_lease` child is held while its owner subscribes; another
/// identity's subscription (passed to the worker) holds nothing, and the
/// child is cancelled once its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owners_subscription_holds_a_poll_lease() {
    let signer = Signer::ed25519("k");
    let dir = files("hold", &[&signer]);
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let route = format!("poll_lease = \"2s\"\n{}", auth_table(&dir, "jwks_file", ""));
    let gw = Gateway::in_front_of(&worker.url(), &route).await;
    let fire = |text: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": message(text), "configuration": {"returnImmediately": true}}})
    };
    // Past the lease, its lapse's probe and cancel.
    let past = std::time::Duration::from_secs(2) + scaled_ms(1500);
    for (subscriber, survives) in [(API_KEY, true), (OPS_KEY, false)] {
        let r = post_json(&gw.url, "/", &[("x-api-key", API_KEY)], &fire("work:30000")).await;
        let id = r.json()["result"]["task"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{}", r.text()))
            .to_owned();
        let (sub, _) = stream_as(&gw.url, subscriber, "SubscribeToTask", json!({"id": id})).await;
        tokio::time::sleep(past).await;
        let state = worker.state(None, &id).await;
        if survives {
            assert_eq!(
                state.as_deref(),
                Some("TASK_STATE_WORKING"),
                "the owner's subscription holds it"
            );
            sub.close();
        } else {
            assert_eq!(
                state.as_deref(),
                Some("TASK_STATE_CANCELED"),
                "another identity's subscription held the lease: {}",
                gw.log_text()
            );
            drop(sub);
        }
    }
    assert!(
        gw.counter("a2agw_lease_renewals_total", &["outcome=\"not_owner\""])
            .await
            >= 1.0
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// RS256 tokens verified with keys the gateway fetches from a JWKS URL (an
/// HTTP endpoint the test serves) and fetches again every `jwks_refresh`:
/// a token of the served key passes and starts a child; a token of a key
/// the endpoint does not serve yet is refused and starts none, until the
/// endpoint rotates to serve it, when the next fetch lets it in; the key
/// rotated out is refused from then on. The PEM public key of an RSA key
/// works as well (`jwt_public_key`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs256_keys_fetched_from_a_jwks_url_and_rotated() {
    let dir = files("rs256", &[&Signer::ed25519("unused")]);
    let (old, new) = (Signer::rsa("rsa-old", &dir), Signer::rsa("rsa-new", &dir));
    let jwks = |s: &Signer| json!({ "keys": [s.jwk] }).to_string();
    let idp = JwksServer::start(jwks(&old)).await;
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(
        &worker.url(),
        &format!(
            "[routes.auth]\njwks_url = \"{}\"\njwks_refresh = \"1s\"\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\n",
            idp.url
        ),
    )
    .await;
    let bearer = |s: &Signer| format!("Bearer {}", s.token(json!({})));

    // The first fetch happens as the route is built, before the first call.
    assert!(idp.fetches() >= 1, "the JWKS was fetched at start");
    let (status, body, _) = send(&gw.url, &[("authorization", &bearer(&old))]).await;
    assert_eq!(status, 200, "RS256 from the JWKS URL: {body}");
    let (status, body, _) = send(&gw.url, &[("authorization", &bearer(&new))]).await;
    assert_eq!(status, 401, "a key not served yet: {body}");
    assert_eq!(
        worker.tasks_started(),
        1,
        "the refused call started nothing"
    );

    // The provider rotates: the new key in, the old one out.
    idp.serve(jwks(&new));
    let fetched = idp.fetches();
    let mut status = 0;
    for _ in 0..scaled_count(100) {
        status = send(&gw.url, &[("authorization", &bearer(&new))]).await.0;
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        status,
        200,
        "the rotated-in key passes once fetched; log:\n{}",
        gw.log_text()
    );
    assert!(idp.fetches() > fetched, "fetched again in the background");
    let (status, body, _) = send(&gw.url, &[("authorization", &bearer(&old))]).await;
    assert_eq!(status, 401, "the rotated-out key: {body}");
    assert_eq!(worker.tasks_started(), 2);
    drop(gw);

    // The same kind of key as a PEM file.
    std::fs::write(dir.join("pub.pem"), &old.public_pem).unwrap();
    let gw = Gateway::in_front_of(&worker.url(), &auth_table(&dir, "jwt_public_key", "")).await;
    let (status, body, _) = send(&gw.url, &[("authorization", &bearer(&old))]).await;
    assert_eq!(status, 200, "RS256 from a PEM: {body}");
    let (status, _, _) = send(&gw.url, &[("authorization", &bearer(&new))]).await;
    assert_eq!(status, 401, "another RSA key");
    assert_eq!(worker.tasks_started(), 3);
    std::fs::remove_dir_all(&dir).ok();
}
