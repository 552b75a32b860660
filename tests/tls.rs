//! `https` workers behind a private CA (`worker_ca`): proxied calls and the
//! gateway's own `CancelTask`, over HTTP and over the WebSocket binding
//! (`wss://`), reach the worker through TLS; a worker whose certificate the
//! route does not trust is refused, not reached in plain text.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, wait_for_state};
use crate::harness::parent::ParentProcess;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::scaled_secs;
use crate::harness::tls::{PrivateCa, TlsFront};
use crate::harness::worker::{message, send_stream, Bind, Kind, Worker};

const CANCELED: &str = "TASK_STATE_CANCELED";
const WORKING: &str = "TASK_STATE_WORKING";

fn socket_addr(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).expect("a URL");
    let authority = rest.split('/').next().unwrap_or(rest);
    authority.parse().expect("an ip:port worker URL")
}

fn trust(ca: &PrivateCa) -> String {
    format!("worker_ca = {:?}", ca.ca_pem.display().to_string())
}

/// A caller that leaves an SSE stream to an `https` worker gets its child
/// canceled, over TLS; the worker answers through the gateway as it would
/// directly.
async fn https_worker_cascade(kind: Kind, bind: Bind) {
    let worker = Worker::start(kind).await;
    let ca = PrivateCa::new("https");
    let front = TlsFront::start(&ca, socket_addr(&worker.url())).await;
    let gw = Gateway::in_front_of(&front.url(), &trust(&ca)).await;

    let (status, text) = send_status(&gw).await;
    assert_eq!(status, 200, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).expect("JSON-RPC");
    assert!(answer["result"].is_object(), "{text}");

    caller_leaves(&worker, &gw, &front, bind).await;
}

/// A caller leaves an SSE stream through `gw` to the worker behind `front`:
/// the child is canceled, once, over a TLS connection of the gateway's own.
async fn caller_leaves(worker: &Worker, gw: &Gateway, front: &TlsFront, bind: Bind) {
    let (stream, id) = send_stream(&gw.url, bind, None, "work:30000").await;
    worker
        .wait_state(None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    let before = front.handshakes();
    stream.close();
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(2))
        .await
        .unwrap_or_else(|s| panic!("not canceled ({s:?}); log:\n{}", gw.log_text()));
    assert_eq!(worker.cancels().await, 1);
    assert!(
        front.handshakes() > before,
        "the cancel came over a TLS connection of its own"
    );
}

#[tokio::test]
async fn rust_https_worker_jsonrpc() {
    https_worker_cascade(Kind::Rust, Bind::JsonRpc).await;
}

#[tokio::test]
async fn python_https_worker_rest() {
    https_worker_cascade(Kind::Python, Bind::Rest).await;
}

/// One JSON-RPC `SendMessage` through `gw`: the HTTP status.
async fn send_status(gw: &Gateway) -> (u16, String) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = post_json(&gw.url, "/", &[], &body).await;
    (r.status, r.text())
}

/// A worker whose certificate the route does not trust is refused: without
/// `worker_ca` (the system's roots do not know the private CA) and with a
/// `worker_ca` naming another CA (it replaces the system's roots, it does
/// not add to the one that signed). The caller gets a 502, the worker
/// starts nothing, and the log says why.
#[tokio::test]
async fn untrusted_worker_certificate_is_refused() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let ca = PrivateCa::new("untrusted");
    let other = PrivateCa::new("other");
    let front = TlsFront::start(&ca, socket_addr(&worker.url())).await;
    for route_extra in [String::new(), trust(&other)] {
        let gw = Gateway::in_front_of(&front.url(), &route_extra).await;
        let (status, text) = send_status(&gw).await;
        assert_eq!(status, 502, "{route_extra}: {text}");
        let log = gw.log_text();
        assert!(
            log.to_lowercase().contains("certificate") || log.contains("UnknownIssuer"),
            "{route_extra}: the log names the certificate problem:\n{log}"
        );
    }
    assert_eq!(worker.tasks_started(), 0);
    assert_eq!(front.handshakes(), 0, "no TLS session was completed");
}

/// The worker's certificate is checked against the worker URL's host: a
/// name (`localhost`, in the certificate) is accepted; an address the
/// certificate does not name (`127.0.0.2`), though signed by the trusted
/// CA, is refused.
#[tokio::test]
async fn worker_host_name_is_verified() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let ca = PrivateCa::new("names");
    // The front listens where the gateway will look `localhost` up.
    let localhost = tokio::net::lookup_host("localhost:0")
        .await
        .expect("localhost resolves")
        .next()
        .expect("an address");
    let named = TlsFront::start_on(&ca, localhost.ip(), socket_addr(&worker.url())).await;
    let gw =
        Gateway::in_front_of(&format!("https://localhost:{}", named.port()), &trust(&ca)).await;
    let (status, text) = send_status(&gw).await;
    assert_eq!(status, 200, "by name: {text}\n{}", gw.log_text());
    assert_eq!(worker.tasks_started(), 1);

    let unnamed = TlsFront::start_on(&ca, [127, 0, 0, 2].into(), socket_addr(&worker.url())).await;
    let gw = Gateway::in_front_of(&unnamed.url(), &trust(&ca)).await;
    let (status, text) = send_status(&gw).await;
    assert_eq!(
        status, 502,
        "an address the certificate does not name: {text}"
    );
    assert_eq!(worker.tasks_started(), 1, "nothing more started");
    assert_eq!(unnamed.handshakes(), 0);
}

/// A worker that asks callers for a certificate (mutual TLS): with
/// `worker_client_cert` and `worker_client_key` the gateway presents the one
/// the worker's CA signed, on proxied calls and on its own `CancelTask`;
/// without them the worker refuses the gateway (502).
#[tokio::test]
async fn mutual_tls_worker() {
    let worker = Worker::start(Kind::Rust).await;
    let ca = PrivateCa::new("mutual");
    let front = TlsFront::start_mutual(&ca, socket_addr(&worker.url())).await;

    let gw = Gateway::in_front_of(&front.url(), &trust(&ca)).await;
    let (status, text) = send_status(&gw).await;
    assert_eq!(status, 502, "no client certificate: {text}");
    assert_eq!(front.handshakes(), 0);

    let gw = Gateway::in_front_of(
        &front.url(),
        &format!(
            "{}\nworker_client_cert = {:?}\nworker_client_key = {:?}",
            trust(&ca),
            ca.client_cert_pem.display().to_string(),
            ca.client_key_pem.display().to_string()
        ),
    )
    .await;
    let (status, text) = send_status(&gw).await;
    assert_eq!(status, 200, "{text}\n{}", gw.log_text());
    // The front takes no TLS session without the certificate: the cancel's
    // own connection presented it too.
    caller_leaves(&worker, &gw, &front, Bind::JsonRpc).await;
}

/// A2A over WebSocket to a `wss://` worker: the caller's socket goes through
/// the gateway over TLS, and when the caller dies the gateway's
/// `CancelTask` goes out on a TLS socket of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_socket_closed_cancels() {
    let worker = RustWorker::start(RustWorkerOptions {
        websocket: true,
        ..RustWorkerOptions::default()
    })
    .await;
    let ws = worker.ws_url().expect("a WebSocket listener");
    let ca = PrivateCa::new("wss");
    let front = TlsFront::start(&ca, socket_addr(&ws)).await;
    let gw = Gateway::in_front_of(&front.url(), &trust(&ca)).await;
    let gw_ws = format!("{}/ws", gw.url.replacen("http://", "ws://", 1));

    let mut parent = ParentProcess::spawn_ws(&gw_ws, Duration::from_secs(60), "work:30000").await;
    let id = parent.task_id.clone();
    wait_for_state(&worker.url(), None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the child runs");
    let before = front.handshakes();
    parent.sigkill().await;
    wait_for_state(&worker.url(), None, &id, CANCELED, scaled_secs(2))
        .await
        .unwrap_or_else(|s| panic!("not canceled ({s:?}); log:\n{}", gw.log_text()));
    assert_eq!(worker.cancels(), 1);
    assert!(
        front.handshakes() > before,
        "the cancel came over a wss:// socket of its own"
    );
}

/// `[server.tls]` with a certificate and key, listening on `port`.
fn tls_listener(cert: &Path, key: &Path, port: u16) -> String {
    format!(
        "[server.tls]\nlisten = [\"127.0.0.1:{port}\"]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    )
}

/// Writes `request` on a TLS connection and reads until `done` says the
/// bytes so far are enough (or the peer closes).
async fn exchange<S>(sock: &mut S, request: &str, done: impl Fn(&[u8]) -> bool) -> Vec<u8>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    sock.write_all(request.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while !done(&got) {
        let n = tokio::time::timeout(scaled_secs(10), sock.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no answer within {:?}", scaled_secs(10)))
            .expect("read");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// The first task id named by the SSE events of a raw HTTP response.
fn first_task_id(raw: &[u8]) -> Option<String> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
    let body = if head.contains("transfer-encoding: chunked") {
        crate::harness::http::dechunk(&raw[end + 4..])
    } else {
        raw[end + 4..].to_vec()
    };
    String::from_utf8_lossy(&body)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
        .find_map(|ev| crate::harness::worker::task_id_of(&ev))
}

/// Callers over the gateway's own TLS listener: the card names the gateway
/// by `https://`, and a caller that leaves an SSE stream over TLS gets its
/// child canceled on the worker, as over plain HTTP.
#[tokio::test]
async fn tls_listener_serves_and_cascades() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let ca = PrivateCa::new("listener");
    let port = crate::harness::gateway::free_port();
    let gw = Gateway::start(&format!(
        "{}\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        tls_listener(&ca.cert_pem, &ca.key_pem, port),
        worker.url()
    ))
    .await;
    // `Gateway::start` waited for `/readyz`, which covers this listener.
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let mut tls = ca.connect(addr).await.expect("TLS to the gateway");
    let card = exchange(
        &mut tls,
        &format!("GET /.well-known/agent-card.json HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n"),
        |_| false,
    )
    .await;
    let card = String::from_utf8_lossy(&card);
    assert!(card.starts_with("HTTP/1.1 200"), "{card}");
    assert!(
        card.contains(&format!("\"https://127.0.0.1:{port}")),
        "the card names the gateway by https: {card}"
    );
    assert!(
        !card.contains(&format!("\"http://127.0.0.1:{port}")),
        "{card}"
    );

    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": message("work:30000")}})
    .to_string();
    let request = format!(
        "POST / HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\naccept: text/event-stream\r\na2a-version: 1.0\r\ncontent-length: {}\r\n\r\n{body}",
        body.len(),
    );
    let mut tls = ca.connect(addr).await.expect("TLS to the gateway");
    let raw = exchange(&mut tls, &request, |b| first_task_id(b).is_some()).await;
    let id = first_task_id(&raw)
        .unwrap_or_else(|| panic!("no task id in {:?}", String::from_utf8_lossy(&raw)));
    wait_for_state(&worker.url(), None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    drop(tls);
    wait_for_state(&worker.url(), None, &id, CANCELED, scaled_secs(2))
        .await
        .unwrap_or_else(|s| panic!("not canceled ({s:?}); log:\n{}", gw.log_text()));
    assert_eq!(worker.cancels(), 1);
}

/// A key that is not the certificate's stops start-up with a message naming
/// both files (pingora would panic a thread on it), and fails `check-config`;
/// so does a route's client key that is not its certificate's.
#[tokio::test]
async fn tls_listener_with_the_wrong_key_does_not_start() {
    let (a, b) = (PrivateCa::new("pair-a"), PrivateCa::new("pair-b"));
    let port = crate::harness::gateway::free_port();
    let dir = crate::harness::gateway::scratch_dir("tls-wrong-key");
    let cfg = dir.join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}\n[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:9\"\n",
            tls_listener(&a.cert_pem, &b.key_pem, port)
        ),
    )
    .unwrap();
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .arg("--config")
        .arg(&cfg)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(scaled_secs(30), run)
        .await
        .expect("the gateway exits")
        .expect("run the gateway");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let says = format!(
        "{} is not the key of {}'s certificate",
        b.key_pem.display(),
        a.cert_pem.display()
    );
    assert!(stderr.contains(&says), "{stderr}");
    check_config_refuses(&cfg, &says);

    // The same for a route's client certificate.
    std::fs::write(
        &cfg,
        format!(
            "[[routes]]\nname = \"w\"\nworker = \"https://127.0.0.1:9\"\nworker_client_cert = {:?}\nworker_client_key = {:?}\n",
            a.client_cert_pem.display().to_string(),
            b.client_key_pem.display().to_string()
        ),
    )
    .unwrap();
    check_config_refuses(
        &cfg,
        &format!(
            "routes[0].worker_client_key: {} is not the key of {}'s certificate",
            b.client_key_pem.display(),
            a.client_cert_pem.display()
        ),
    );
}

/// `a2a-gateway check-config cfg` exits 2 saying `says`.
fn check_config_refuses(cfg: &Path, says: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .arg("check-config")
        .arg(cfg)
        .output()
        .expect("run check-config");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}
