//! A route that checks sends reads every call completely and unambiguously,
//! or refuses it before the worker sees it (issue: "No policy bypass").
//!
//! Each body below carries a lease grant the gateway must refuse
//! (`ttlMs: 500`, under the 1 s minimum) in a form some worker reads and a
//! lenient reader could miss. On a route that enforces leases each is
//! refused with the A2A error for it and the worker starts nothing; on a
//! route that checks nothing (`worker_leases = "observe"`) each reaches the
//! worker byte for byte.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::gateway::Gateway;
use crate::harness::http::request;
use crate::harness::worker::{message, Kind, Worker};

/// A SendMessage (JSON-RPC) whose message carries the grant.
fn send(method: &str) -> Value {
    let mut m = message("work:100");
    m["metadata"] = json!({"a2a-rust.com/lease": {"ttlMs": 500}});
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": m}})
}

/// The eight bodies, with the JSON-RPC code (or HTTP status for JSON-RPC
/// callers it is answered in: 200) and the refusal's metric reason.
fn cases() -> Vec<(&'static str, Vec<u8>, i64, &'static str)> {
    let text = send("SendMessage").to_string();
    let mut bom = vec![0xEF, 0xBB, 0xBF];
    bom.extend(text.as_bytes());
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    let trailing = format!("{text}garbage").into_bytes();
    let huge_number = text
        .replace("\"ttlMs\":500", "\"ttlMs\":1e999")
        .into_bytes();
    assert_ne!(huge_number, text.as_bytes(), "the grant is in the text");
    // Over `limits.max_inspect_body` (1 MiB): a long text part.
    let mut big = send("SendMessage");
    big["params"]["message"]["parts"][0]["text"] =
        json!(format!("work:100{}", " ".repeat(1 << 20)));
    let big = big.to_string().into_bytes();
    let two_methods = format!(
        "{},\"method\":\"GetTask\"}}",
        text.strip_suffix('}').expect("an object")
    )
    .into_bytes();
    // The grant's metadata first, then an empty one.
    let grant = "\"metadata\":{\"a2a-rust.com/lease\":{\"ttlMs\":500}}";
    let two_metadata = text.replace(grant, &format!("{grant},\"metadata\":{{}}"));
    assert!(
        two_metadata.matches("\"metadata\"").count() == 2,
        "{two_metadata}"
    );
    let v03 = send("message/send").to_string().into_bytes();
    vec![
        ("byte order mark", bom, -32700, "body_not_utf8"),
        ("UTF-16", utf16, -32700, "body_not_utf8"),
        ("trailing bytes", trailing, -32700, "body_trailing_bytes"),
        ("1e999", huge_number, -32700, "body_number_out_of_range"),
        ("over the inspection limit", big, -32600, "body_too_large"),
        ("method twice", two_methods, -32600, "body_duplicate_key"),
        (
            "metadata twice",
            two_metadata.into_bytes(),
            -32600,
            "body_duplicate_key",
        ),
        ("v0.3 message/send", v03, -32004, "v03_send"),
    ]
}

/// Tasks the worker started, read from the worker.
async fn started(w: &Worker) -> u64 {
    match w {
        Worker::Rust(r) => r.tasks_started() as u64,
        Worker::Python(p) => p.stats().await["tasks_started"].as_u64().unwrap_or(0),
    }
}

/// A TCP pass-through that records what the gateway sent the worker.
struct Tap {
    port: u16,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    async fn start(to: String) -> Tap {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(out) = tokio::net::TcpStream::connect(&to).await else {
                    return;
                };
                let (mut in_r, mut in_w) = inbound.into_split();
                let (mut out_r, mut out_w) = out.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut out_r, &mut in_w).await;
                });
                let s = s.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n) = in_r.read(&mut buf).await {
                        if n == 0 || out_w.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        s.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = out_w.shutdown().await;
                });
            }
        });
        Tap { port, seen }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether `body` went to the worker as it is.
    fn passed(&self, body: &[u8]) -> bool {
        memchr::memmem::find(&self.seen.lock().unwrap(), body).is_some()
    }
}

async fn each_case_refused_or_passed_verbatim(kind: Kind) {
    let worker = Worker::start(kind).await;
    let strict = Gateway::in_front_of(&worker.url(), "worker_leases = \"enforce\"").await;
    let tap = Tap::start(worker.url().trim_start_matches("http://").to_string()).await;
    let open = Gateway::in_front_of(&tap.url(), "worker_leases = \"observe\"").await;
    let h = [("content-type", "application/json")];
    for (case, body, code, reason) in cases() {
        let before = started(&worker).await;
        let r = request("POST", &strict.url, "/", &h, &body).await;
        assert_eq!(r.status, 200, "{case}: a JSON-RPC error: {}", r.text());
        let v = r.json();
        assert_eq!(v["error"]["code"], code, "{case}: {v}");
        assert_eq!(
            started(&worker).await,
            before,
            "{case}: the worker started a task"
        );
        assert!(
            strict
                .counter("a2agw_refusals_total", &[&format!("reason=\"{reason}\"")])
                .await
                >= 1.0,
            "{case}: counted as {reason}"
        );
        // Where nothing is checked, the same body reaches the worker as it is.
        let _ = request("POST", &open.url, "/", &h, &body).await;
        assert!(tap.passed(&body), "{case}: not passed byte for byte");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_jsonrpc_bodies_refused_or_passed_verbatim() {
    each_case_refused_or_passed_verbatim(Kind::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_jsonrpc_bodies_refused_or_passed_verbatim() {
    each_case_refused_or_passed_verbatim(Kind::Rust).await;
}

/// The REST binding's send gets the same reading: 400 INVALID_ARGUMENT (413
/// over the limit), and nothing started.
async fn rest_bodies_refused(kind: Kind) {
    let worker = Worker::start(kind).await;
    let gw = Gateway::in_front_of(&worker.url(), "worker_leases = \"enforce\"").await;
    let h = [("content-type", "application/json")];
    let text = json!({"message": send("SendMessage")["params"]["message"]}).to_string();
    let mut bom = vec![0xEF, 0xBB, 0xBF];
    bom.extend(text.as_bytes());
    let dup = text.replace("\"message\":{", "\"message\":{\"parts\":[]},\"message\":{");
    let bodies: [(&str, Vec<u8>); 3] = [
        ("byte order mark", bom),
        ("trailing bytes", format!("{text} x").into_bytes()),
        ("message twice", dup.into_bytes()),
    ];
    for (case, body) in bodies {
        let before = started(&worker).await;
        let r = request("POST", &gw.url, "/message:send", &h, &body).await;
        assert_eq!(r.status, 400, "{case}: {}", r.text());
        assert_eq!(r.json()["error"]["status"], "INVALID_ARGUMENT", "{case}");
        assert_eq!(started(&worker).await, before, "{case}: a task started");
    }
    // The readable grant is refused as before: the reading is the gate.
    let r = request("POST", &gw.url, "/message:send", &h, text.as_bytes()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("lease"), "{}", r.text());
}

#[tokio::test]
async fn python_rest_bodies_refused() {
    rest_bodies_refused(Kind::Python).await;
}

#[tokio::test]
async fn rust_rest_bodies_refused() {
    rest_bodies_refused(Kind::Rust).await;
}
