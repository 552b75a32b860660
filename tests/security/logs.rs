//! Issue 43 item 5: no credential in the log at any level. The real gateway
//! binary at `trace` (text), at `debug` (JSON) and at the default filter, in
//! front of a real a2a-rust worker (HTTP and gRPC), with every kind of
//! secret the gateway sees: a bearer JWT and an API key verified by
//! `[routes.auth]` (a route-specific key header, and a wrong key), a
//! cookie and a `Proxy-Authorization` a caller sends, a gRPC caller's
//! bearer token, the route's `worker_credential` (sent by the cascade's
//! and the admin's `CancelTask`), `inject_headers` secrets (HTTP and gRPC
//! routes) and the admin token. The log must be full of pingora's header
//! lines (so the test is not vacuous: they are there, redacted) and hold
//! none of the secrets.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

use crate::harness::gateway::{scratch_dir, Gateway};
use crate::harness::grpc::{send_request, RawGrpc};
use crate::harness::http::{post_json, request};
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::scaled_secs;
use crate::harness::stream::SseStream;
use crate::harness::worker::{message, send_stream, task_id_of, Bind};

const ISS: &str = "https://idp.test";
const AUD: &str = "a2a-gateway";
const KEY_HEADER: &str = "x-caller-key";
const API_KEY: &str = "ak-logs-5ecret-7c1d02b9e4";
const WRONG_KEY: &str = "ak-logs-wr0ng-5ecret-38a1f";
const COOKIE: &str = "sid=cookie-5ecret-91f2e0aa";
const PROXY_AUTH: &str = "Basic cHJveHktNWVjcmV0LTQ0MmE=";
const GRPC_TOKEN: &str = "grpc-5ecret-token-b3c9d8";
const WORKER_CRED: &str = "worker-5ecret-cred-6d1e77";
const INJECT: &str = "inject-5ecret-0e4f9a2c1b";
const GRPC_INJECT: &str = "grpc-inject-5ecret-a81c5";
const ADMIN_TOKEN: &str = "admin-5ecret-token-f00d1e";
const ADMIN_TOKEN_ENV: &str = "A2AGW_TEST_LOGS_ADMIN_TOKEN";

/// A signed EdDSA JWT for `sub` "alice", and the public key's PEM.
fn jwt() -> (String, String) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({"iss": ISS, "aud": AUD, "sub": "alice", "exp": now + 3600, "iat": now});
    let key = EncodingKey::from_ed_pem(kp.serialize_pem().as_bytes()).unwrap();
    let token = encode(&Header::new(Algorithm::EdDSA), &claims, &key).unwrap();
    (token, kp.public_key_pem())
}

/// The config body: a gRPC route (the worker's h2c listener, an injected
/// secret), a route with `[routes.auth]` (JWT and API keys in
/// `x-caller-key`), a route with `worker_credential` and an injected
/// secret, and the admin token from the environment.
fn config(worker: &RustWorker, dir: &Path, jwt_pem: &str, json: bool) -> String {
    std::fs::write(dir.join("pub.pem"), jwt_pem).unwrap();
    std::fs::write(
        dir.join("keys"),
        format!(
            "{} billing\n",
            a2a_gateway::digest::sha256_hex(API_KEY.as_bytes())
        ),
    )
    .unwrap();
    let format = if json { "log_format = \"json\"\n" } else { "" };
    format!(
        "{format}admin_token_env = \"{ADMIN_TOKEN_ENV}\"\n\n\
         [[routes]]\nname = \"auth\"\nworker = \"{http}\"\npath_prefix = \"/auth\"\nstrip_prefix = true\n\
         [routes.auth]\njwt_public_key = \"{pem}\"\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\n\
         api_keys_file = \"{keys}\"\napi_key_header = \"{KEY_HEADER}\"\n\n\
         [[routes]]\nname = \"cred\"\nworker = \"{http}\"\npath_prefix = \"/cred\"\nstrip_prefix = true\n\
         worker_credential = \"Bearer {WORKER_CRED}\"\n\
         inject_headers = {{ \"x-worker-secret\" = \"{INJECT}\" }}\n\n\
         [[routes]]\nname = \"grpc\"\nworker = \"{grpc}\"\n\
         inject_headers = {{ \"x-grpc-secret\" = \"{GRPC_INJECT}\" }}\n",
        http = worker.url(),
        grpc = worker.grpc_url(),
        pem = dir.join("pub.pem").display(),
        keys = dir.join("keys").display(),
    )
}

/// Every secret the run below hands the gateway.
fn secrets(token: &str) -> Vec<String> {
    let signature = token.rsplit('.').next().unwrap().to_owned();
    let mut all: Vec<String> = [
        API_KEY,
        WRONG_KEY,
        COOKIE,
        PROXY_AUTH,
        GRPC_TOKEN,
        WORKER_CRED,
        INJECT,
        GRPC_INJECT,
        ADMIN_TOKEN,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // The parts of some, as a log line might cut them.
    all.extend(["cookie-5ecret", "cHJveHktNWVjcmV0", "5ecret"].map(String::from));
    all.push(token.to_owned());
    all.push(signature);
    all
}

/// Starts the gateway with `filter` (`json`: the JSON log format) and makes
/// a call carrying each secret; returns the gateway (its log complete:
/// every call answered, both cancels delivered) and the JWT.
async fn run(filter: &str, json_log: bool) -> (Gateway, RustWorker, String) {
    let worker = RustWorker::start_with_grpc(RustWorkerOptions::default()).await;
    let (token, pem) = jwt();
    let dir = scratch_dir("logs");
    let gw = Gateway::start_with_env(
        &config(&worker, &dir, &pem, json_log),
        &[("A2A_GATEWAY_LOG", filter), (ADMIN_TOKEN_ENV, ADMIN_TOKEN)],
    )
    .await;
    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let auth = format!("{}/auth", gw.url);
    let cred = format!("{}/cred", gw.url);

    // JSON-RPC with a verified JWT: a blocking send (which the gateway
    // carries as a stream of its own), then a GetTask pingora proxies.
    let bearer = format!("Bearer {token}");
    let r = post_json(&auth, "/", &[("authorization", &bearer)], &send).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = task_id_of(&r.json()).unwrap_or_else(|| panic!("no task: {}", r.text()));
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}});
    let r = post_json(&auth, "/", &[("authorization", &bearer)], &get).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // REST with a verified API key (a send, then its task), and a refused
    // wrong key.
    let rest = json!({"message": message("quick")});
    let r = post_json(&auth, "/message:send", &[(KEY_HEADER, API_KEY)], &rest).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = task_id_of(&r.json()).unwrap_or_else(|| panic!("no task: {}", r.text()));
    let r = request(
        "GET",
        &auth,
        &format!("/tasks/{id}"),
        &[(KEY_HEADER, API_KEY)],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post_json(&auth, "/message:send", &[(KEY_HEADER, WRONG_KEY)], &rest).await;
    assert_eq!(r.status, 401, "{}", r.text());
    // A cookie and a proxy credential, forwarded to the worker with the
    // route's injected secret.
    let theirs = [("cookie", COOKIE), ("proxy-authorization", PROXY_AUTH)];
    let r = post_json(&cred, "/", &theirs, &send).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // gRPC with a bearer token (and the gRPC route's injected secret).
    let mut conn = RawGrpc::connect(&gw.url).await;
    let bearer = format!("Bearer {GRPC_TOKEN}");
    let answer: a2a_protocol_types::proto::SendMessageResponse = conn
        .unary(
            "SendMessage",
            &send_request("quick", ""),
            &[("authorization", &bearer)],
        )
        .await
        .unwrap_or_else(|e| panic!("gRPC SendMessage: {e:?}; log:\n{}", gw.log_text()));
    assert!(answer.payload.is_some());
    conn.close().await;

    // The cascade's CancelTask, with the route's worker_credential: a
    // stream (proxied by pingora) whose caller, who sent a cookie and a
    // proxy credential but no `Authorization`, leaves.
    let stream_body = json!({"jsonrpc": "2.0", "id": 3, "method": "SendStreamingMessage",
        "params": {"message": message("work:60000")}});
    let mut stream = SseStream::open(&cred, "/", &theirs, &stream_body).await;
    assert_eq!(stream.status, 200);
    let mut left = None;
    while left.is_none() {
        let ev = stream
            .next(scaled_secs(10))
            .await
            .expect("an event naming the task");
        left = task_id_of(&ev);
    }
    stream.close();
    let left = left.unwrap();
    wait_canceled(&worker, &left, &gw).await;

    // The admin: a listing and a CancelTask (worker_credential again) with
    // the admin token.
    let admin_auth = format!("Bearer {ADMIN_TOKEN}");
    let r = request(
        "GET",
        &gw.admin,
        "/tasks",
        &[("authorization", &admin_auth)],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (mut stream, kept) = send_stream(&cred, Bind::JsonRpc, None, "work:60000").await;
    let path = format!("/tasks/{kept}:cancel");
    let r = request(
        "POST",
        &gw.admin,
        &path,
        &[("authorization", &admin_auth)],
        b"",
    )
    .await;
    assert_eq!(r.status, 200, "{}; log:\n{}", r.text(), gw.log_text());
    assert_eq!(r.json()["outcome"], "canceled", "{}", r.text());
    wait_canceled(&worker, &kept, &gw).await;
    let _ = stream.rest(scaled_secs(5)).await;
    // The cancels' answers are logged as they come: give the last line a
    // moment.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    (gw, worker, token)
}

/// Waits (5 s, scaled) for the worker to hold task `id` CANCELED.
async fn wait_canceled(worker: &RustWorker, id: &str, gw: &Gateway) {
    for _ in 0..crate::harness::scaled_count(250) {
        if worker.state(None, id).await.as_deref() == Some("TASK_STATE_CANCELED") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{id} not canceled; log:\n{}", gw.log_text());
}

/// No secret anywhere in `log`; `lines` (each a pair of substrings) are
/// each in some line, with `[redacted]`.
fn check(log: &str, token: &str, lines: &[(&str, &str)]) {
    for secret in secrets(token) {
        if let Some(at) = log.find(&secret) {
            let start = log[..at].rfind('\n').map_or(0, |i| i + 1);
            let end = log[at..].find('\n').map_or(log.len(), |i| at + i);
            panic!(
                "secret {secret:?} in the log ({} bytes), in:\n{}",
                log.len(),
                &log[start..end]
            );
        }
    }
    for (a, b) in lines {
        assert!(
            log.lines()
                .any(|l| l.contains(a) && l.contains(b) && l.contains("[redacted]")),
            "no line with {a:?}, {b:?} and [redacted] in the log ({} bytes)",
            log.len()
        );
    }
}

/// `A2A_GATEWAY_LOG=trace`, text: every upstream head pingora prints (the
/// HTTP/1 and h2 debug lines, the trace lines of the bytes written for the
/// gateway's own cancels, the workers' answers) is there with its
/// credentials redacted, and no secret is anywhere in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_log_holds_no_secret() {
    let (gw, _worker, token) = run("trace", false).await;
    let log = gw.log_text();
    assert!(
        log.len() > 50_000,
        "a trace log is large: {} bytes",
        log.len()
    );
    check(
        &log,
        &token,
        &[
            (
                "Sending header to upstream",
                "\"authorization\": \"[redacted]\"",
            ),
            (
                "Sending header to upstream",
                "\"x-caller-key\": \"[redacted]\"",
            ),
            ("Sending header to upstream", "\"cookie\": \"[redacted]\""),
            (
                "Sending header to upstream",
                "\"x-worker-secret\": \"[redacted]\"",
            ),
            ("Request to h2", "\"authorization\": \"[redacted]\""),
            ("Request to h2", "\"x-grpc-secret\": \"[redacted]\""),
            // The cancels: the route's credential and injected secret.
            (
                "x-worker-secret: [redacted]\\r\\n",
                "\\nauthorization: [redacted]\\r\\n",
            ),
        ],
    );
}

/// `A2A_GATEWAY_LOG=debug`, JSON: the same, through the JSON format's
/// escaping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_json_log_holds_no_secret() {
    let (gw, _worker, token) = run("debug", true).await;
    let log = gw.log_text();
    assert!(
        log.len() > 20_000,
        "a debug log is large: {} bytes",
        log.len()
    );
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not JSON after redaction ({e}): {line}"));
    }
    check(
        &log,
        &token,
        &[
            (
                "Sending header to upstream",
                "\\\"authorization\\\": \\\"[redacted]\\\"",
            ),
            (
                "Sending header to upstream",
                "\\\"x-caller-key\\\": \\\"[redacted]\\\"",
            ),
            ("Request to h2", "\\\"x-grpc-secret\\\": \\\"[redacted]\\\""),
        ],
    );
}

/// The default filter (`info`, pingora at `warn`): the log is not scrubbed
/// (nothing is scanned at that level), and no line carries a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_log_holds_no_secret() {
    let (gw, _worker, token) = run("info,pingora_core=warn,pingora_proxy=warn", false).await;
    let log = gw.log_text();
    assert!(log.contains("a2agw::access"), "{log}");
    assert!(!log.contains("Sending header to upstream"), "{log}");
    check(&log, &token, &[]);
}
