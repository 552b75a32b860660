//! A deliberately plain HTTP/1.1 client over a raw TCP socket.
//!
//! Tests need to do things a polished client hides: hold an SSE stream open,
//! then close or reset the socket at an exact moment, or send bytes a
//! well-behaved client never would. Every request is `Connection: close`.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response read to its end.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Splits `http://host:port/base` into (`host:port`, `/base`).
pub fn split_url(url: &str) -> (String, String) {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("only http:// URLs in tests: {url}"));
    match rest.find('/') {
        Some(i) => (
            rest[..i].to_string(),
            rest[i..].trim_end_matches('/').to_string(),
        ),
        None => (rest.to_string(), String::new()),
    }
}

fn request_bytes(
    method: &str,
    authority: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n");
    let mut has_version = false;
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("a2a-version") {
            has_version = true;
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_version {
        head.push_str("a2a-version: 1.0\r\n");
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Sends one request and reads the whole response (until the server closes).
/// The headers of a WebSocket upgrade request (RFC 6455's sample key).
pub const WS_UPGRADE: [(&str, &str); 4] = [
    ("connection", "upgrade"),
    ("upgrade", "websocket"),
    ("sec-websocket-version", "13"),
    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
];

/// `A2A-Version: 1.0` is added unless `headers` name it.
pub async fn request(
    method: &str,
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let (authority, base) = split_url(url);
    let mut sock = TcpStream::connect(&authority)
        .await
        .unwrap_or_else(|e| panic!("connect {authority}: {e}"));
    sock.write_all(&request_bytes(
        method,
        &authority,
        &format!("{base}{path}"),
        headers,
        body,
    ))
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(super::scaled_secs(30), sock.read_to_end(&mut raw))
        .await
        .unwrap_or_else(|_| panic!("no response within {:?}", super::scaled_secs(30)))
        .expect("read response");
    parse_response(&raw)
}

/// Sends a JSON POST on a connection of its own and returns the
/// connection unread: the caller then leaves ([`leave`]) or reads on.
pub async fn open_post_json(url: &str, path: &str, body: &Value) -> TcpStream {
    let (authority, base) = split_url(url);
    let mut sock = TcpStream::connect(&authority)
        .await
        .unwrap_or_else(|e| panic!("connect {authority}: {e}"));
    let bytes = request_bytes(
        "POST",
        &authority,
        &format!("{base}{path}"),
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    );
    sock.write_all(&bytes).await.expect("write the request");
    sock
}

/// POSTs a JSON body with `content-type: application/json`.
pub async fn post_json(url: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> Response {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    request("POST", url, path, &h, body.to_string().as_bytes()).await
}

pub fn parse_response(raw: &[u8]) -> Response {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = std::str::from_utf8(&raw[..end]).expect("ascii head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Response {
        status,
        headers,
        body,
    }
}

/// Decodes a chunked body (tolerating a truncated tail).
pub fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = data.windows(2).position(|w| w == b"\r\n") {
        let size_str = std::str::from_utf8(&data[..nl]).unwrap_or("0");
        let size =
            usize::from_str_radix(size_str.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        data = &data[nl + 2..];
        if size == 0 || data.len() < size {
            out.extend_from_slice(&data[..size.min(data.len())]);
            break;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[(size + 2).min(data.len())..];
    }
    out
}

/// Reads a task's state straight from a worker (never through the gateway):
/// JSON-RPC `GetTask` POSTed to `url` (the worker's JSON-RPC endpoint).
/// `None` when the worker does not know the task.
pub async fn get_task_state(url: &str, tenant: Option<&str>, id: &str) -> Option<String> {
    let mut params = json!({ "id": id });
    if let Some(t) = tenant {
        params["tenant"] = json!(t);
    }
    let body =
        json!({"jsonrpc": "2.0", "id": "harness-get", "method": "GetTask", "params": params});
    let resp = post_json(url, "/", &[], &body).await;
    let v = resp.json();
    v["result"]["status"]["state"].as_str().map(str::to_string)
}

/// The task's state, asked with `headers` (a worker that takes the tenant
/// from a header, for example); `None` when the worker does not find it.
pub async fn get_task_state_with(url: &str, headers: &[(&str, &str)], id: &str) -> Option<String> {
    let body =
        json!({"jsonrpc": "2.0", "id": "harness-get", "method": "GetTask", "params": {"id": id}});
    let resp = post_json(url, "/", headers, &body).await;
    resp.json()["result"]["status"]["state"]
        .as_str()
        .map(str::to_string)
}

/// Polls the worker until the task is in `want`, for at most `within`.
/// Returns how long it took, or the last state seen.
pub async fn wait_for_state(
    url: &str,
    tenant: Option<&str>,
    id: &str,
    want: &str,
    within: Duration,
) -> Result<Duration, Option<String>> {
    poll_state(want, within, || get_task_state(url, tenant, id)).await
}

/// [`wait_for_state`], asking with `headers` ([`get_task_state_with`]).
pub async fn wait_for_state_with(
    url: &str,
    headers: &[(&str, &str)],
    id: &str,
    want: &str,
    within: Duration,
) -> Result<Duration, Option<String>> {
    poll_state(want, within, || get_task_state_with(url, headers, id)).await
}

/// Calls `get` every 25 ms until it answers `want`, for at most `within`.
async fn poll_state<F, Fut>(
    want: &str,
    within: Duration,
    get: F,
) -> Result<Duration, Option<String>>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let start = tokio::time::Instant::now();
    let mut last = None;
    while start.elapsed() <= within {
        last = get().await;
        if last.as_deref() == Some(want) {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(last)
}

/// Sends one request and leaves after `after` (at once when zero) without
/// reading a byte of the answer: a caller that leaves before any event.
///
/// It leaves with a FIN, always: its sending side is shut down first, then
/// the socket is closed. Closing a socket that holds unread bytes sends a
/// reset (RST) instead of a FIN, so a plain close turned into a reset
/// whenever the gateway had written the answer's head before this task got
/// to close, which a loaded machine (or the tokio timer's millisecond
/// tick, when a zero `after` still went through `sleep`) made happen. The
/// gateway tolerates a FIN before the first event (it reads on to learn the
/// task's id) but not a reset, which ends the exchange at once; that other
/// call shape is not what the tests using this function are about.
pub async fn send_and_leave(
    url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    after: Duration,
) {
    let (authority, base) = split_url(url);
    let mut sock = TcpStream::connect(&authority)
        .await
        .unwrap_or_else(|e| panic!("connect {authority}: {e}"));
    sock.write_all(&request_bytes(
        "POST",
        &authority,
        &format!("{base}{path}"),
        headers,
        body,
    ))
    .await
    .unwrap();
    if !after.is_zero() {
        tokio::time::sleep(after).await;
    }
    // FIN now, whatever has arrived unread; the close after it may reset.
    let _ = sock.shutdown().await;
    drop(sock);
}

/// The ids of every task the worker holds (JSON-RPC `ListTasks`, straight to
/// the worker).
pub async fn list_task_ids(url: &str) -> Vec<String> {
    list_tasks(url, None)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Every task the worker holds in `tenant` (up to 100), with its state
/// (JSON-RPC `ListTasks`, straight to the worker).
pub async fn list_tasks(url: &str, tenant: Option<&str>) -> Vec<(String, String)> {
    let mut params = json!({"pageSize": 100});
    if let Some(t) = tenant {
        params["tenant"] = json!(t);
    }
    let body =
        json!({"jsonrpc": "2.0", "id": "harness-list", "method": "ListTasks", "params": params});
    let v = post_json(url, "/", &[], &body).await.json();
    v["result"]["tasks"]
        .as_array()
        .map(|tasks| {
            tasks
                .iter()
                .filter_map(|t| {
                    Some((
                        t["id"].as_str()?.to_string(),
                        t["status"]["state"].as_str().unwrap_or("").to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Leaves a raw connection: with a reset (SO_LINGER 0) or a FIN.
pub async fn leave(mut sock: TcpStream, reset: bool) {
    if reset {
        // Linger 0 does not block on drop, which is what the deprecation is about.
        #[allow(deprecated)]
        let _ = sock.set_linger(Some(Duration::ZERO));
    } else {
        let _ = sock.shutdown().await;
    }
    drop(sock);
}
