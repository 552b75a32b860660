//! Issue 32 item 4, Redis in production: `rediss://` with a private CA
//! (`store.tls_ca_file`) and a client certificate, the password from an
//! environment variable or a file, and no secret (a Redis password, the
//! admin token, a worker credential, a caller's API key) in the gateway's
//! log or in Redis. The server is a real `redis-server` that speaks only
//! TLS and requires a password, with a CA and certificates made for the
//! test (`harness::tls::PrivateCa`).

use std::time::Duration;

use serde_json::json;

use crate::harness::gateway::{free_port, scratch_dir, Gateway};
use crate::harness::redis::{RedisServer, RedisTls};
use crate::harness::stream::SseStream;
use crate::harness::tls::PrivateCa;
use crate::harness::worker::{message, task_id_of, Bind, Kind, Worker};
use crate::harness::{http, scaled_ms, scaled_secs};

const CANCELED: &str = "TASK_STATE_CANCELED";
const PASSWORD_ENV: &str = "A2AGW_TEST_REDIS_PASSWORD";

/// A secret no test text holds by chance: `tag`, this process and the time.
fn secret(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{tag}-{}-{nanos:09}", std::process::id())
}

/// A TLS-only Redis with `ca`'s server certificate and `password`; with
/// `client_auth`, clients need a certificate `ca` signed.
async fn tls_redis(ca: &PrivateCa, password: &str, client_auth: bool) -> RedisServer {
    RedisServer::start_tls(RedisTls {
        cert: ca.cert_pem.clone(),
        key: ca.key_pem.clone(),
        ca: ca.ca_pem.clone(),
        password: password.to_owned(),
        client_auth,
        client_cert: client_auth.then(|| (ca.client_cert_pem.clone(), ca.client_key_pem.clone())),
    })
    .await
}

/// A file holding `password` and a newline, as a mounted secret does.
fn password_file(password: &str) -> std::path::PathBuf {
    let path = scratch_dir("redis-pw").join("redis-password");
    std::fs::write(&path, format!("{password}\n")).unwrap();
    path
}

/// One route to `worker` whose children hold a 2 s lease that the gateway
/// renews while their callers are connected.
fn leased_route(worker: &Worker) -> String {
    format!(
        "[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"2s\" }}\n",
        worker.url()
    )
}

/// Two gateway replicas on a TLS Redis, each trusting the test's CA: A
/// reads the password from an environment variable, B from a file. Callers
/// stream through A, which renews their children's leases; A is
/// SIGKILLed, and B cancels every child within TTL + 1 s, once each, as
/// the worker says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_tls_redis_share_leases() {
    let ca = PrivateCa::new("redis-leases");
    let password = secret("redis-pw");
    let redis = tls_redis(&ca, &password, false).await;
    let worker = Worker::start(Kind::Rust).await;
    let store = format!(
        "[store]\nurl = \"{}\"\ntls_ca_file = \"{}\"\n",
        redis.tls_url(),
        ca.ca_pem.display()
    );
    let a_cfg = format!(
        "{store}password_env = \"{PASSWORD_ENV}\"\n\n{}",
        leased_route(&worker)
    );
    let b_cfg = format!(
        "{store}password_file = \"{}\"\n\n{}",
        password_file(&password).display(),
        leased_route(&worker)
    );
    let mut a = Gateway::start_with_env(&a_cfg, &[(PASSWORD_ENV, &password)]).await;
    let b = Gateway::start(&b_cfg).await;

    let mut streams = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (s, id) =
            crate::harness::worker::send_stream(&a.url, Bind::JsonRpc, None, "work:30000").await;
        streams.push(s);
        ids.push(id);
    }
    // A renews the leases: past one TTL, everything still runs.
    tokio::time::sleep(Duration::from_secs(2) + scaled_ms(1000)).await;
    for id in &ids {
        assert_eq!(
            worker.state(None, id).await.as_deref(),
            Some("TASK_STATE_WORKING"),
            "{id}: A renews it; A's log:\n{}",
            a.log_text()
        );
    }
    a.kill().await;
    crate::harness::worker::survivor_cancels_each_once(&worker, &ids, Duration::from_secs(2), &b)
        .await;
    for (name, log) in [("A", a.log_text()), ("B", b.log_text())] {
        assert!(!log.contains(&password), "{name}'s log shows the password");
    }
    drop(streams);
}

/// A gateway on `rediss://` without the CA that signed the server's
/// certificate (the system's roots do not have it) stops at start with exit
/// status 1 and one line saying the certificate is not trusted; neither
/// that line nor anything else it wrote (its log at debug) shows the
/// password, whether it was in the URL or in an environment variable.
#[tokio::test]
async fn rediss_without_the_ca_fails_at_start_saying_why() {
    let ca = PrivateCa::new("redis-untrusted");
    let password = secret("redis-pw");
    let redis = tls_redis(&ca, &password, false).await;
    let port = redis.port;
    for (store, shown, env) in [
        (
            format!("url = \"rediss://:{password}@127.0.0.1:{port}/0\""),
            format!("rediss://:***@127.0.0.1:{port}/0"),
            vec![],
        ),
        (
            format!(
                "url = \"{}\"\npassword_env = \"{PASSWORD_ENV}\"",
                redis.tls_url()
            ),
            redis.tls_url(),
            vec![(PASSWORD_ENV, password.as_str())],
        ),
    ] {
        let cfg = format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\n\n[store]\n{store}\n\n[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:1\"\n",
            free_port()
        );
        let (code, out) = crate::harness::gateway::run_config_to_exit(&cfg, &env).await;
        assert_eq!(code, Some(1), "{store}:\n{out}");
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("a2a-gateway: "))
            .collect();
        let [line] = lines[..] else {
            panic!("{store}: want one line of why, got:\n{out}")
        };
        assert!(
            line.starts_with(&format!("a2a-gateway: store {shown}: ")),
            "{line}"
        );
        assert!(
            line.contains("certificate is not trusted") && line.contains("store.tls_ca_file"),
            "{line}"
        );
        assert!(
            !out.contains(&password),
            "{store}: the password shows:\n{out}"
        );
    }
}

/// A server that asks clients for a certificate (`tls-auth-clients yes`):
/// a gateway with `tls_client_cert` and `tls_client_key` starts and keeps
/// its tasks there; one without them stops at start with exit status 1.
#[tokio::test]
async fn rediss_with_a_client_certificate() {
    let ca = PrivateCa::new("redis-mtls");
    let password = secret("redis-pw");
    let redis = tls_redis(&ca, &password, true).await;
    let worker = Worker::start(Kind::Rust).await;
    let store = format!(
        "[store]\nurl = \"{}\"\npassword_env = \"{PASSWORD_ENV}\"\ntls_ca_file = \"{}\"\n",
        redis.tls_url(),
        ca.ca_pem.display()
    );
    let with_cert = format!(
        "{store}tls_client_cert = \"{}\"\ntls_client_key = \"{}\"\n\n{}",
        ca.client_cert_pem.display(),
        ca.client_key_pem.display(),
        leased_route(&worker)
    );
    let gw = Gateway::start_with_env(&with_cert, &[(PASSWORD_ENV, &password)]).await;
    let (stream, id) =
        crate::harness::worker::send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    // The tracker writes the task behind the request.
    let mut keys = Vec::new();
    for _ in 0..crate::harness::scaled_count(40) {
        keys = redis_keys(&redis).await;
        if keys.iter().any(|k| k.ends_with(&id)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        keys.iter().any(|k| k.ends_with(&id)),
        "{id} not in Redis: {keys:?}; log:\n{}",
        gw.log_text()
    );
    drop(stream);

    let cfg = format!(
        "[server]\nlisten = \"127.0.0.1:{}\"\n\n{store}\n{}",
        free_port(),
        leased_route(&worker)
    );
    let (code, out) =
        crate::harness::gateway::run_config_to_exit(&cfg, &[(PASSWORD_ENV, &password)]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.lines()
            .filter(|l| l.starts_with("a2a-gateway: store rediss://127.0.0.1:"))
            .count()
            == 1,
        "{out}"
    );
    assert!(!out.contains(&password), "{out}");
}

/// The name of every key in the server.
async fn redis_keys(redis: &RedisServer) -> Vec<String> {
    String::from_utf8(redis.cli(&["--raw", "KEYS", "*"]).await)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// After a run with every kind of secret, none of them is in either
/// gateway's log (at debug) or in Redis: a Redis password given in the URL
/// (gateway X) and in an environment variable (gateway Y), Y's admin token
/// (`server.admin_token_env`, sent to its admin endpoint), the worker
/// credential both send (`worker_credential_env`), and the callers' API key
/// in `Authorization`, which names their budget account (kept in Redis by
/// its fingerprint only). Callers leave, so both gateways cancel (the
/// outbox in Redis); Redis is then killed, so both log store errors too.
/// The dump is an uncompressed `SAVE` of everything Redis held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_the_log_or_the_store() {
    let ca = PrivateCa::new("redis-secrets");
    let password = secret("redis-pw");
    let admin_token = secret("admin-token");
    let credential = format!("Bearer {}", secret("worker-credential"));
    let api_key = secret("caller-key");
    let mut redis = tls_redis(&ca, &password, false).await;
    let worker = Worker::start(Kind::Rust).await;
    let route = format!(
        "[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"2s\" }}\nworker_credential_env = \"A2AGW_TEST_WORKER_CREDENTIAL\"\n\n\
         [routes.budget]\nmeters = {{ tokens = 100 }}\ncaller_header = \"authorization\"\n\n\
         [[routes.budget.accounts]]\nper = \"caller\"\nwindow = \"24h\"\nmeters = {{ tokens = 1000 }}\n",
        worker.url()
    );
    let tls_ca = format!("tls_ca_file = \"{}\"\n", ca.ca_pem.display());
    let x_cfg = format!(
        "[store]\nurl = \"rediss://:{password}@127.0.0.1:{}/0\"\n{tls_ca}\n{route}",
        redis.port
    );
    let y_cfg = format!(
        "admin_token_env = \"A2AGW_TEST_ADMIN_TOKEN\"\n\n[store]\nurl = \"{}\"\npassword_env = \"{PASSWORD_ENV}\"\n{tls_ca}\n{route}",
        redis.tls_url()
    );
    let credential_env = ("A2AGW_TEST_WORKER_CREDENTIAL", credential.as_str());
    let x = Gateway::start_with_env(&x_cfg, &[credential_env]).await;
    let y = Gateway::start_with_env(
        &y_cfg,
        &[
            credential_env,
            (PASSWORD_ENV, &password),
            ("A2AGW_TEST_ADMIN_TOKEN", &admin_token),
        ],
    )
    .await;

    let auth = format!("Bearer {api_key}");
    let mut ids = Vec::new();
    for gw in [&x, &y] {
        for text in ["work:30000", "quick"] {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": message(text)}});
            let mut s = SseStream::open(&gw.url, "/", &[("authorization", &auth)], &body).await;
            assert_eq!(s.status, 200, "stream refused");
            let mut id = None;
            for _ in 0..10 {
                let Some(ev) = s.next(scaled_secs(10)).await else {
                    break;
                };
                if let Some(t) = task_id_of(&ev) {
                    id = Some(t);
                    break;
                }
            }
            let id = id.expect("an event naming the task");
            if text == "quick" {
                s.rest(scaled_secs(5)).await;
            } else {
                // The caller leaves: the gateway cancels its child.
                ids.push((gw.url.clone(), id));
                tokio::time::sleep(scaled_ms(300)).await;
                s.close();
            }
        }
    }
    for (via, id) in &ids {
        worker
            .wait_state(None, id, CANCELED, scaled_secs(5))
            .await
            .unwrap_or_else(|s| panic!("{id} (through {via}) not canceled: {s:?}"));
    }
    // Y's admin endpoint, with its token and with a wrong one.
    let bearer = format!("Bearer {admin_token}");
    for path in ["/tasks", "/budgets"] {
        let r = http::request("GET", &y.admin, path, &[("authorization", &bearer)], b"").await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let r = http::request(
            "GET",
            &y.admin,
            path,
            &[("authorization", "Bearer not-the-token-0123456789")],
            b"",
        )
        .await;
        assert_eq!(r.status, 401, "{path}");
    }

    // Everything Redis holds, uncompressed, then its key names.
    redis.cli(&["CONFIG", "SET", "rdbcompression", "no"]).await;
    redis.cli(&["SAVE"]).await;
    let dump = std::fs::read(redis.dir().join("dump.rdb")).expect("dump.rdb");
    let keys = redis_keys(&redis).await;
    let fingerprint = a2a_gateway::budget::fingerprint(&auth);
    let fingerprint = fingerprint.trim_start_matches("sha256:");
    assert!(
        keys.iter()
            .any(|k| k.contains(":acct:") && k.contains(fingerprint)),
        "the callers' account is in Redis by its fingerprint: {keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.contains(":task:")),
        "tasks are in Redis: {keys:?}"
    );
    // Redis goes away: both gateways log store errors for a while.
    redis.kill().await;
    tokio::time::sleep(scaled_secs(2)).await;

    let (x_log, y_log) = (x.log_text(), y.log_text());
    assert!(
        x_log.contains("redis") && y_log.contains("redis"),
        "store errors are logged:\nX:\n{x_log}\nY:\n{y_log}"
    );
    let secrets = [
        ("the Redis password", password.as_str()),
        ("the admin token", admin_token.as_str()),
        ("the worker credential", credential.as_str()),
        (
            "the worker credential",
            credential.trim_start_matches("Bearer "),
        ),
        ("the caller's API key", api_key.as_str()),
    ];
    for (what, secret) in secrets {
        for (name, log) in [("X", &x_log), ("Y", &y_log)] {
            assert!(!log.contains(secret), "{name}'s log shows {what}:\n{log}");
        }
        assert!(
            !contains(&dump, secret.as_bytes()),
            "the Redis dump holds {what}"
        );
        assert!(
            !keys.iter().any(|k| k.contains(secret)),
            "a Redis key names {what}: {keys:?}"
        );
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
