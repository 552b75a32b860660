//! `https` workers behind a private CA (`worker_ca`): proxied calls and the
//! gateway's own `CancelTask`, over HTTP and over the WebSocket binding
//! (`wss://`), reach the worker through TLS; a worker whose certificate the
//! route does not trust is refused, not reached in plain text.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use crate::harness::gateway::Gateway;
use crate::harness::http::{post_json, wait_for_state};
use crate::harness::parent::ParentProcess;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
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

    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = post_json(&gw.url, "/", &[], &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["result"].is_object(), "{}", r.text());

    let (stream, id) = send_stream(&gw.url, bind, None, "work:30000").await;
    worker
        .wait_state(None, &id, WORKING, Duration::from_secs(5))
        .await
        .expect("the task runs");
    let before = front.handshakes();
    stream.close();
    worker
        .wait_state(None, &id, CANCELED, Duration::from_secs(2))
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

/// Without `worker_ca` the private CA is not trusted: the caller gets a
/// 502, the worker starts nothing, and the log says why.
#[tokio::test]
async fn untrusted_worker_certificate_is_refused() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let ca = PrivateCa::new("untrusted");
    let front = TlsFront::start(&ca, socket_addr(&worker.url())).await;
    let gw = Gateway::in_front_of(&front.url(), "").await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = post_json(&gw.url, "/", &[], &body).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(worker.tasks_started(), 0);
    assert_eq!(front.handshakes(), 0, "no TLS session was completed");
    let log = gw.log_text();
    assert!(
        log.to_lowercase().contains("certificate") || log.contains("UnknownIssuer"),
        "the log names the certificate problem:\n{log}"
    );
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
    wait_for_state(&worker.url(), None, &id, WORKING, Duration::from_secs(5))
        .await
        .expect("the child runs");
    let before = front.handshakes();
    parent.sigkill().await;
    wait_for_state(&worker.url(), None, &id, CANCELED, Duration::from_secs(2))
        .await
        .unwrap_or_else(|s| panic!("not canceled ({s:?}); log:\n{}", gw.log_text()));
    assert_eq!(worker.cancels(), 1);
    assert!(
        front.handshakes() > before,
        "the cancel came over a wss:// socket of its own"
    );
}
