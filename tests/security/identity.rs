//! Issue 43 item 4: the worker is told who the gateway verified, in a
//! header a caller cannot forge, and receives only credentials the gateway
//! checked or the route's own. What reached the worker is read off the
//! wire, from a relay between the gateway and a real Python `a2a-sdk`
//! worker.

use serde_json::json;

use crate::harness::gateway::Gateway;
use crate::harness::http::post_json;
use crate::harness::jwt::api_keys_file;
use crate::harness::python_worker::PythonWorker;
use crate::harness::relay::Relay;
use crate::harness::worker::message;

const ALICE: &str = "ak-alice-0123456789";
/// An `alg: none` JWT naming `sub=admin`: no signature, never verified.
const FORGED: &str = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiJ9.";
const ROUTE_SECRET: &str = "Bearer route-own-credential-42";

/// On a route that checks API keys only, a caller's `Authorization` is
/// nothing the gateway verified: the worker gets the route's own
/// `worker_credential` in its place, and `a2a-gateway-caller: key:alice`
/// whatever the caller put there. Before the fix the forged token and the
/// forged identity header both reached the worker, and no header said who
/// was verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_is_told_the_verified_caller_and_no_unchecked_credential() {
    let keys = api_keys_file("identity", &[(ALICE, "alice")]);
    let worker = PythonWorker::start().await;
    let url = worker.url();
    let worker_addr = url.trim_start_matches("http://").trim_end_matches('/');
    let relay = Relay::start_recording(worker_addr.to_owned()).await;
    let gw = Gateway::in_front_of(
        &format!("http://127.0.0.1:{}", relay.port),
        &format!(
            "worker_credential = \"{ROUTE_SECRET}\"\n[routes.auth]\napi_keys_file = \"{}\"\n",
            keys.display()
        ),
    )
    .await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = post_json(
        &gw.url,
        "/",
        &[
            ("x-api-key", ALICE),
            ("authorization", &format!("Bearer {FORGED}")),
            ("a2a-gateway-caller", "key:admin"),
        ],
        &body,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().get("result").is_some(), "{}", r.text());

    let sent = relay.sent_text().to_ascii_lowercase();
    // Each header line ends in CRLF, the last one included.
    let head = sent
        .split("\r\n\r\n")
        .find(|h| h.contains("post "))
        .map(|h| format!("{h}\r\n"))
        .expect("the send reached the worker");
    assert!(
        head.contains("\r\na2a-gateway-caller: key:alice\r\n"),
        "the verified identity: {head}"
    );
    assert!(!sent.contains("key:admin"), "the forged identity: {head}");
    assert!(
        !sent.contains(&FORGED.to_ascii_lowercase()),
        "the unchecked token: {head}"
    );
    assert!(
        head.contains(&format!(
            "\r\nauthorization: {}\r\n",
            ROUTE_SECRET.to_ascii_lowercase()
        )),
        "the route's own credential in its place: {head}"
    );
    assert_eq!(
        head.matches("\r\nauthorization:").count(),
        1,
        "one Authorization: {head}"
    );
}
