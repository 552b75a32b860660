//! One HTTP/2 request with prior knowledge (h2c) over plaintext TCP, read
//! to its end: for requests a test types as it likes (a JSON body under
//! `content-type: application/grpc`, say) to a gateway or a worker.
//!
//! * [`request`] / [`try_request`]: any method, path, headers and body, on
//!   a connection of its own (the HTTP/2 preface, SETTINGS, one stream,
//!   then the connection is dropped). The answer is an [`H2Response`]:
//!   status, head, body, trailers.
//! * [`post_typed`]: a POST of a JSON body under a content type of the
//!   test's choosing, with the headers a gRPC client sends
//!   (`te: trailers`) and `a2a-version: 1.0` (a2a-rust refuses a call
//!   without it before it looks at anything else).
//! * [`rest_send`] / [`jsonrpc_send`]: the bodies of a REST
//!   `POST /message:send` and a JSON-RPC `SendMessage`, with a budget grant
//!   on the message when given.
//!
//! Unlike `crate::harness::http`, nothing is added to the headers given to
//! [`request`] (no `a2a-version`, no `content-length`): HTTP/2 needs
//! neither, and a test of what a server accepts should send what it says.
//! Unlike `crate::harness::grpc`, the body is sent as it is (no gRPC
//! length prefix) and the path is the test's (a gRPC client's path is
//! fixed).
//!
//! Addresses are `http://host:port` (a worker's or gateway's `url`), with
//! an optional base path that is put before `path` (as `http::request`
//! does), or a bare `host:port`.

use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::worker::message;

/// `application/grpc`: what a gRPC client sends, and what the gateway
/// forwards upstream over HTTP/2.
pub const GRPC: &str = "application/grpc";
/// `application/grpc+json`: gRPC with a JSON codec (also forwarded over
/// HTTP/2 as gRPC).
pub const GRPC_JSON: &str = "application/grpc+json";

const BUDGET_URI: &str = "https://a2a-rust.com/extensions/budget/v1";
const BUDGET_KEY: &str = "a2a-rust.com/budget";

/// A response read to its end (or to the peer's reset, see `error`).
/// Its `Debug` shows the body as text.
#[derive(Clone, Default)]
pub struct H2Response {
    pub status: u16,
    /// The response head's fields, in order (names lowercase).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The trailers, if the answer ended with them.
    pub trailers: Vec<(String, String)>,
    /// Why the body or trailers stopped short (RST_STREAM, connection
    /// error), if they did; `status` and `headers` are then the head's.
    pub error: Option<String>,
}

impl std::fmt::Debug for H2Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Response")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.text())
            .field("trailers", &self.trailers)
            .field("error", &self.error)
            .finish()
    }
}

fn find<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

impl H2Response {
    /// A field of the response head.
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }

    /// A field of the trailers.
    pub fn trailer(&self, name: &str) -> Option<&str> {
        find(&self.trailers, name)
    }

    /// `grpc-status` from the trailers, or from the head (a Trailers-Only
    /// answer, as the gateway refuses a gRPC call); None when neither has
    /// one (an answer that is not gRPC).
    pub fn grpc_status(&self) -> Option<i32> {
        self.trailer("grpc-status")
            .or_else(|| self.header("grpc-status"))
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("grpc-status {s:?}"))
            })
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response body is not JSON ({e}): {} {:?} {}",
                self.status,
                self.headers,
                self.text()
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// (`host:port`, base path without a trailing `/`) of `addr`.
fn split(addr: &str) -> (String, String) {
    let rest = addr.strip_prefix("http://").unwrap_or(addr);
    match rest.find('/') {
        Some(i) => (
            rest[..i].to_string(),
            rest[i..].trim_end_matches('/').to_string(),
        ),
        None => (rest.to_string(), String::new()),
    }
}

/// How long a request may take, connect to last byte (30 s, scaled).
fn timeout() -> Duration {
    super::scaled_secs(30)
}

/// Sends one request over a fresh h2c connection to `addr` and reads the
/// answer to its end: `:method method`, `:scheme http`, `:path` base +
/// `path`, `:authority` the address, then exactly `headers`, then `body`
/// (one DATA frame with END_STREAM; none when empty). Panics when the
/// answer has not ended within 30 s (scaled) or the connection fails; see
/// [`try_request`].
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> H2Response {
    try_request(addr, method, path, headers, body)
        .await
        .unwrap_or_else(|e| panic!("h2c {method} {addr}{path}: {e}"))
}

/// As [`request`], returning why no answer came (the address refused
/// TCP, the server does not speak HTTP/2 and closed or answered
/// HTTP/1.1, it reset the stream before any head, or the answer had not
/// ended within 30 s) instead of panicking. A stream reset after the head is an answer, with
/// `error` set.
pub async fn try_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<H2Response, String> {
    let (authority, base) = split(addr);
    let path = format!("{base}{path}");
    let attempt = async {
        let tcp = TcpStream::connect(&authority)
            .await
            .map_err(|e| format!("tcp: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (mut send, conn) = h2::client::handshake(tcp)
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let _abort = AbortOnDrop(conn);
        poll_fn(|cx| send.poll_ready(cx))
            .await
            .map_err(|e| format!("h2 ready: {e}"))?;
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{authority}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(()).map_err(|e| format!("request: {e}"))?;
        let (response, mut stream) = send
            .send_request(req, body.is_empty())
            .map_err(|e| format!("send: {e}"))?;
        // A server may answer and end the stream from the head alone (a
        // gateway refusing the call): the body then cannot be sent, and
        // the answer is what counts.
        let unsent = match body.is_empty() {
            true => None,
            false => stream
                .send_data(Bytes::copy_from_slice(body), true)
                .err()
                .map(|e| format!("; the body was not sent: {e}")),
        };
        let resp = response
            .await
            .map_err(|e| format!("no response head: {e}{}", unsent.as_deref().unwrap_or("")))?;
        let (parts, mut recv) = resp.into_parts();
        let mut out = H2Response {
            status: parts.status.as_u16(),
            headers: fields(&parts.headers),
            ..H2Response::default()
        };
        loop {
            match recv.data().await {
                None => break,
                Some(Ok(chunk)) => {
                    let _ = recv.flow_control().release_capacity(chunk.len());
                    out.body.extend_from_slice(&chunk);
                }
                Some(Err(e)) => {
                    out.error = Some(format!("body: {e}"));
                    return Ok(out);
                }
            }
        }
        match recv.trailers().await {
            Ok(Some(t)) => out.trailers = fields(&t),
            Ok(None) => {}
            Err(e) => out.error = Some(format!("trailers: {e}")),
        }
        Ok::<_, String>(out)
    };
    tokio::time::timeout(timeout(), attempt)
        .await
        .map_err(|_| format!("no answer within {:?}", timeout()))?
}

/// Aborts the connection's task when the request is done with it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn fields(map: &http::HeaderMap) -> Vec<(String, String)> {
    map.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// POSTs `body` (JSON) to `addr` + `path` over h2c with
/// `content-type: content_type`, `te: trailers`, `a2a-version: 1.0`, then
/// `extra` (a name in `extra` replaces the default of that name).
pub async fn post_typed(
    addr: &str,
    path: &str,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &Value,
) -> H2Response {
    let mut headers: Vec<(&str, &str)> = vec![
        ("content-type", content_type),
        ("te", "trailers"),
        ("a2a-version", "1.0"),
    ];
    for (k, v) in extra {
        if let Some(slot) = headers.iter_mut().find(|(d, _)| d.eq_ignore_ascii_case(k)) {
            slot.1 = v;
        } else {
            headers.push((k, v));
        }
    }
    request(addr, "POST", path, &headers, body.to_string().as_bytes()).await
}

/// A user message whose text is `text` (the workers' script), with
/// `grant` as its budget grant (`metadata["a2a-rust.com/budget"]`, the
/// budget extension in `extensions`) when given.
fn budgeted_message(text: &str, grant: Option<Value>) -> Value {
    let mut m = message(text);
    if let Some(g) = grant {
        m["metadata"] = json!({ BUDGET_KEY: g });
        m["extensions"] = json!([BUDGET_URI]);
    }
    m
}

/// The body of a REST `POST /message:send` (`{"message": …}`) saying
/// `text`, with `grant` when given. The answer (`{"task": …}`) names the
/// task: `crate::harness::worker::task_id_of(&resp.json())`.
pub fn rest_send(text: &str, grant: Option<Value>) -> Value {
    json!({ "message": budgeted_message(text, grant) })
}

/// The body of a JSON-RPC `SendMessage` (POST to the JSON-RPC endpoint)
/// saying `text`, with `grant` when given. The answer's `result.task`
/// names the task: `crate::harness::worker::task_id_of(&resp.json())`.
pub fn jsonrpc_send(text: &str, grant: Option<Value>) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": "h2c-1",
        "method": "SendMessage",
        "params": { "message": budgeted_message(text, grant) },
    })
}
