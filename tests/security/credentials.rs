//! Issue 43 item 4 (in part): a request names one identity. A second
//! `Authorization` header (a forged `alg: none` token naming `sub=admin`
//! behind a valid one, or before it), an API key beside a valid JWT, or
//! two API keys are refused 401 before anything reaches the worker, on a
//! route that verifies both kinds, in front of a real a2a-rust worker.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::harness::gateway::{scratch_dir, Gateway};
use crate::harness::http::post_json;
use crate::harness::jwt::{Signer, AUD, ISS};
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::worker::message;

const BILLING_KEY: &str = "ak-billing-5555555555";
const OPS_KEY: &str = "ak-ops-7777777777";

/// `jwks.json` with `signer`'s key and `keys` with both API keys' hashes
/// (named `billing` and `ops`) in a scratch directory.
fn files(signer: &Signer) -> PathBuf {
    let dir = scratch_dir("sec-credentials");
    std::fs::write(
        dir.join("jwks.json"),
        json!({"keys": [signer.jwk]}).to_string(),
    )
    .unwrap();
    let hex = |key: &str| a2a_gateway::digest::sha256_hex(key.as_bytes());
    std::fs::write(
        dir.join("keys"),
        format!("{} billing\n{} ops\n", hex(BILLING_KEY), hex(OPS_KEY)),
    )
    .unwrap();
    dir
}

/// `[routes.auth]` verifying JWTs from `dir`'s JWKS and its API keys.
fn both_kinds(dir: &Path) -> String {
    format!(
        "[routes.auth]\njwks_file = \"{}\"\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\napi_keys_file = \"{}\"\n",
        dir.join("jwks.json").display(),
        dir.join("keys").display()
    )
}

/// An unsigned token (`alg: none`) naming `sub`, otherwise valid.
fn forged(sub: &str) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.",
        b64(json!({"alg": "none", "typ": "JWT"})),
        b64(json!({"iss": ISS, "aud": AUD, "sub": sub, "exp": exp}))
    )
}

/// A JSON-RPC `SendMessage` with `headers` (repeated names sent as
/// repeated header lines): its status and body.
async fn send(gw: &Gateway, headers: &[(&str, &str)]) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = post_json(&gw.url, "/", headers, &body).await;
    (r.status, r.json())
}

/// Two `Authorization` headers, a valid JWT first and a forged `alg: none`
/// one naming `sub=admin` second (and the other way round, and twice the
/// same valid one), are refused: the gateway cannot verify one and pass
/// both on. The worker starts nothing. Each credential alone passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_authorization_header_is_refused() {
    let signer = Signer::ed25519("k1");
    let dir = files(&signer);
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(&worker.url(), &both_kinds(&dir)).await;
    let good = format!("Bearer {}", signer.token(json!({"sub": "alice"})));
    let admin = format!("Bearer {}", forged("admin"));

    for (case, headers) in [
        (
            "valid, then forged",
            [("authorization", good.as_str()), ("authorization", &admin)],
        ),
        (
            "forged, then valid",
            [("authorization", &admin), ("authorization", &good)],
        ),
        (
            "the same valid token twice",
            [("authorization", &good), ("authorization", &good)],
        ),
    ] {
        let (status, body) = send(&gw, &headers).await;
        assert_eq!(status, 401, "{case}: {body}");
        assert_eq!(body["error"]["code"], -32600, "{case}: {body}");
    }
    assert_eq!(
        worker.tasks_started(),
        0,
        "no refused request started a task on the worker; log:\n{}",
        gw.log_text()
    );
    assert!(
        gw.log_text().contains("more than one Authorization header"),
        "why is logged"
    );

    // The valid token alone passes and starts one task.
    let (status, body) = send(&gw, &[("authorization", &good)]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(worker.tasks_started(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

/// An API key beside a valid JWT (which identity would be meant?), beside
/// a forged one, and two API keys are refused; the worker starts nothing.
/// Each alone passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_beside_a_jwt_or_another_key_is_refused() {
    let signer = Signer::p256("k2");
    let dir = files(&signer);
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::in_front_of(&worker.url(), &both_kinds(&dir)).await;
    let good = format!("Bearer {}", signer.token(json!({"sub": "alice"})));
    let admin = format!("Bearer {}", forged("admin"));

    for (case, headers) in [
        (
            "API key and a valid JWT",
            [("x-api-key", BILLING_KEY), ("authorization", good.as_str())],
        ),
        (
            "a valid JWT and an API key",
            [("authorization", good.as_str()), ("x-api-key", BILLING_KEY)],
        ),
        (
            "API key and a forged JWT",
            [("x-api-key", BILLING_KEY), ("authorization", &admin)],
        ),
        (
            "two API keys",
            [("x-api-key", OPS_KEY), ("x-api-key", BILLING_KEY)],
        ),
        (
            "the same API key twice",
            [("x-api-key", BILLING_KEY), ("x-api-key", BILLING_KEY)],
        ),
    ] {
        let (status, body) = send(&gw, &headers).await;
        assert_eq!(status, 401, "{case}: {body}");
    }
    assert_eq!(
        worker.tasks_started(),
        0,
        "no refused request started a task on the worker; log:\n{}",
        gw.log_text()
    );
    let log = gw.log_text();
    assert!(log.contains("two credentials"), "why is logged: {log}");
    assert!(log.contains("more than one x-api-key header"), "{log}");
    assert!(
        !log.contains(BILLING_KEY) && !log.contains(&good[7..47]),
        "no credential in the log"
    );
    assert_eq!(
        gw.counter("a2agw_refusals_total", &["reason=\"credential_rejected\""])
            .await,
        5.0
    );

    for (case, h) in [
        ("API key", ("x-api-key", BILLING_KEY)),
        ("JWT", ("authorization", good.as_str())),
    ] {
        let (status, body) = send(&gw, &[h]).await;
        assert_eq!(status, 200, "{case}: {body}");
    }
    assert_eq!(worker.tasks_started(), 2);
    std::fs::remove_dir_all(&dir).ok();
}
