//! HTTP/1 conformance the gateway enforces in its own hooks (issue: "No
//! policy bypass", item 4), against an a2a-rust and a Python `a2a-sdk`
//! worker, with raw bytes on the caller's socket and a tap recording the
//! bytes that reach the worker:
//!
//! - an HTTP/1.1 request without `Host` is refused with 400, counted, and
//!   never reaches the worker (HTTP/1.0 may omit it);
//! - a `Content-Length` list of equal values reaches the worker as one
//!   value; unequal values are refused with 400 (by pingora) and never
//!   reach it;
//! - pipelined requests get one answer each, in order; an answer after
//!   which the gateway closes the connection says `Connection: close`.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::gateway::Gateway;
use crate::harness::http::{parse_response, split_url, Response};
use crate::harness::worker::{message, Kind, Worker};
use crate::harness::{scaled_ms, scaled_secs, scenarios};

scenarios! {
    rust_missing_host_is_refused => missing_host_is_refused(Kind::Rust);
    python_missing_host_is_refused => missing_host_is_refused(Kind::Python);
    rust_content_length_list_is_collapsed => content_length_list_is_collapsed(Kind::Rust);
    python_content_length_list_is_collapsed => content_length_list_is_collapsed(Kind::Python);
    rust_unequal_content_lengths_are_refused => unequal_content_lengths_are_refused(Kind::Rust);
    python_unequal_content_lengths_are_refused => unequal_content_lengths_are_refused(Kind::Python);
    rust_three_pipelined_requests_in_one_write => three_pipelined_requests_in_one_write(Kind::Rust);
    python_three_pipelined_requests_in_one_write => three_pipelined_requests_in_one_write(Kind::Python);
    rust_pipelined_while_the_first_is_served => pipelined_while_the_first_is_served(Kind::Rust);
    python_pipelined_while_the_first_is_served => pipelined_while_the_first_is_served(Kind::Python);
    rust_closed_after_a_refusal_says_close => closed_after_a_refusal_says_close(Kind::Rust);
    python_closed_after_a_refusal_says_close => closed_after_a_refusal_says_close(Kind::Python);
}

/// A TCP pass-through in front of the worker that records what the gateway
/// sent it.
struct Tap {
    port: u16,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    async fn start(worker: &str) -> Tap {
        let to = worker.trim_start_matches("http://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(out) = TcpStream::connect(&to).await else {
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
                        if n == 0 {
                            break;
                        }
                        s.lock().unwrap().extend_from_slice(&buf[..n]);
                        if out_w.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
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

    /// What reached the worker since the last call, taken.
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// A gateway on its default route (leases checked: strict reading) in
/// front of a tap in front of the worker. Blocking sends pass as they come
/// (`blocking_sends = "pass"`), so the tap sees the caller's own requests,
/// one for one, and not the gateway's own card read, stream and `GetTask`
/// of a carried send (tests/blocking_send.rs).
async fn setup(kind: Kind) -> (Worker, Tap, Gateway) {
    let worker = Worker::start(kind).await;
    let tap = Tap::start(&worker.url()).await;
    let gw = Gateway::in_front_of(&tap.url(), "blocking_sends = \"pass\"").await;
    (worker, tap, gw)
}

/// Tasks the worker started, read from the worker.
async fn started(w: &Worker) -> u64 {
    match w {
        Worker::Rust(r) => r.tasks_started() as u64,
        Worker::Python(p) => p.stats().await["tasks_started"].as_u64().unwrap_or(0),
    }
}

/// A SendMessage that completes at once.
fn send(id: u64) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "SendMessage",
        "params": {"message": message("quick")}})
    .to_string()
}

/// A POST of `body` to `/` in HTTP/`version`, with `host` (none if `None`),
/// the `Content-Length` lines `lengths` (the body's length if empty) and
/// extra header lines.
fn post(version: &str, host: Option<&str>, lengths: &[String], extra: &str, body: &str) -> Vec<u8> {
    let mut head = format!(
        "POST / HTTP/{version}\r\ncontent-type: application/json\r\na2a-version: 1.0\r\n{extra}"
    );
    if let Some(h) = host {
        head.push_str(&format!("host: {h}\r\n"));
    }
    if lengths.is_empty() {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    for l in lengths {
        head.push_str(&format!("content-length: {l}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// Writes `bytes` on a new connection to the gateway and reads until it
/// closes the connection.
async fn exchange(gw: &Gateway, bytes: &[u8]) -> Vec<u8> {
    let (authority, _) = split_url(&gw.url);
    let mut sock = TcpStream::connect(&authority).await.unwrap();
    sock.write_all(bytes).await.unwrap();
    read_until_closed(&mut sock).await
}

async fn read_until_closed(sock: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    tokio::time::timeout(scaled_secs(15), sock.read_to_end(&mut raw))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the gateway did not close the connection within {:?}; read so far: {}",
                scaled_secs(15),
                String::from_utf8_lossy(&raw)
            )
        })
        .expect("read");
    raw
}

/// The answers in `raw`, one after another (each framed by its
/// `Content-Length` or chunked encoding).
fn answers(mut raw: &[u8]) -> Vec<Response> {
    let mut out = Vec::new();
    while let Some(end) = memchr::memmem::find(raw, b"\r\n\r\n") {
        let head = parse_response(&raw[..end + 4]);
        let rest = &raw[end + 4..];
        let len = if head
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
        {
            chunked_len(rest)
        } else if let Some(n) = head.header("content-length") {
            n.parse::<usize>().unwrap().min(rest.len())
        } else {
            rest.len()
        };
        out.push(parse_response(&raw[..end + 4 + len]));
        raw = &raw[end + 4 + len..];
    }
    out
}

/// The length of a chunked body at the start of `data`, its last chunk and
/// final blank line included (all of `data` if it is cut short).
fn chunked_len(data: &[u8]) -> usize {
    let mut at = 0;
    while let Some(nl) = memchr::memmem::find(&data[at..], b"\r\n") {
        let line = std::str::from_utf8(&data[at..at + nl]).unwrap_or("0");
        let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        at += nl + 2;
        if size == 0 {
            return (at + 2).min(data.len());
        }
        at += size + 2;
        if at > data.len() {
            return data.len();
        }
    }
    data.len()
}

fn says_close(r: &Response) -> bool {
    r.header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close"))
}

/// The rule for a connection the gateway closed after `got` answers to
/// `sent` pipelined requests: only the last answer may say
/// `Connection: close`, and it must if requests were left unanswered.
fn assert_close_announced(got: &[Response], sent: usize, what: &str) {
    assert!(!got.is_empty(), "{what}: no answer");
    for (i, r) in got[..got.len() - 1].iter().enumerate() {
        assert!(
            !says_close(r),
            "{what}: answer {} says close, yet more followed",
            i + 1
        );
    }
    if got.len() < sent {
        assert!(
            says_close(got.last().unwrap()),
            "{what}: {} of {sent} requests answered, and the last answer did not say Connection: close: {:?}",
            got.len(),
            got.last().unwrap().headers
        );
    }
}

/// The head of each request that reached the worker, with its
/// `Content-Length` lines, and the bytes after the first head.
fn request_heads(seen: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(seen);
    text.split("\r\n\r\n")
        .filter_map(|part| {
            let at = part.find("POST ").or_else(|| part.find("GET "))?;
            Some(part[at..].to_string())
        })
        .collect()
}

fn content_length_lines(head: &str) -> Vec<String> {
    head.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim().to_string())
        .collect()
}

/// An HTTP/1.1 request without `Host` is answered 400 in the caller's
/// binding (a JSON-RPC error for the JSON-RPC endpoint, the REST shape
/// otherwise), counted, and nothing reaches the worker; the same request in
/// HTTP/1.0, which may omit `Host`, is served.
async fn missing_host_is_refused(kind: Kind) {
    let (worker, tap, gw) = setup(kind).await;
    let before = started(&worker).await;
    tap.take();

    let raw = exchange(&gw, &post("1.1", None, &[], "", &send(1))).await;
    let got = answers(&raw);
    assert_eq!(got.len(), 1, "{}", String::from_utf8_lossy(&raw));
    let r = &got[0];
    assert_eq!(r.status, 400, "{}", r.text());
    let v = r.json();
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert_eq!(v["id"], Value::Null, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("Host"),
        "{v}"
    );
    // The body was not read: the gateway closes, and says so.
    assert!(says_close(r), "{:?}", r.headers);

    let rest = b"GET /tasks/nope HTTP/1.1\r\na2a-version: 1.0\r\nconnection: close\r\n\r\n";
    let got = answers(&exchange(&gw, rest).await);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status, 400, "{}", got[0].text());
    assert_eq!(got[0].json()["error"]["status"], "INVALID_ARGUMENT");

    assert!(
        tap.take().is_empty(),
        "a request without Host reached the worker"
    );
    assert_eq!(started(&worker).await, before, "the worker started a task");
    assert_eq!(
        gw.counter(
            "a2agw_refusals_total",
            &["route=\"w\"", "reason=\"http_missing_host\""]
        )
        .await,
        2.0,
        "{}",
        gw.metrics().await
    );

    // HTTP/1.0 may omit Host: served.
    let raw = exchange(&gw, &post("1.0", None, &[], "", &send(2))).await;
    let got = answers(&raw);
    assert_eq!(got.len(), 1, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(got[0].status, 200, "{}", got[0].text());
    assert_eq!(
        got[0].json()["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{}",
        got[0].text()
    );
    assert_eq!(request_heads(&tap.take()).len(), 1);
    assert_eq!(started(&worker).await, before + 1);
}

/// Without `Host` and without a route for its path, the answer is still
/// HTTP/1's 400 (not the 404 for no route), counted with an empty route.
#[tokio::test]
async fn missing_host_without_a_route_is_400() {
    let gw = Gateway::start(
        "[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:9\"\npath_prefix = \"/w\"\n",
    )
    .await;
    let raw = exchange(&gw, b"GET /elsewhere HTTP/1.1\r\nconnection: close\r\n\r\n").await;
    let got = answers(&raw);
    assert_eq!(got.len(), 1, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(got[0].status, 400, "{}", got[0].text());
    assert_eq!(
        gw.counter(
            "a2agw_refusals_total",
            &["route=\"\"", "reason=\"http_missing_host\""]
        )
        .await,
        1.0,
        "{}",
        gw.metrics().await
    );
    assert_eq!(gw.counter("a2agw_no_route_total", &[]).await, 0.0);
}

/// `Content-Length: N, N` and two `Content-Length: N` lines reach the worker
/// as one `Content-Length: N` with the body as sent, and are served.
async fn content_length_list_is_collapsed(kind: Kind) {
    let (worker, tap, gw) = setup(kind).await;
    let (authority, _) = split_url(&gw.url);
    for (case, lengths) in [("a list", 1), ("two lines", 2)] {
        let body = send(7);
        let n = body.len();
        let lines: Vec<String> = if lengths == 1 {
            vec![format!("{n}, {n}")]
        } else {
            vec![n.to_string(), n.to_string()]
        };
        let before = started(&worker).await;
        tap.take();
        let raw = exchange(
            &gw,
            &post(
                "1.1",
                Some(&authority),
                &lines,
                "connection: close\r\n",
                &body,
            ),
        )
        .await;
        let got = answers(&raw);
        assert_eq!(got.len(), 1, "{case}: {}", String::from_utf8_lossy(&raw));
        assert_eq!(got[0].status, 200, "{case}: {}", got[0].text());
        assert_eq!(
            got[0].json()["result"]["task"]["status"]["state"],
            "TASK_STATE_COMPLETED",
            "{case}: {}",
            got[0].text()
        );
        assert_eq!(started(&worker).await, before + 1, "{case}");
        let seen = tap.take();
        let heads = request_heads(&seen);
        assert_eq!(heads.len(), 1, "{case}: {}", String::from_utf8_lossy(&seen));
        assert_eq!(
            content_length_lines(&heads[0]),
            [n.to_string()],
            "{case}: the worker's head:\n{}",
            heads[0]
        );
        assert!(
            seen.ends_with(format!("\r\n\r\n{body}").as_bytes()),
            "{case}: the body as sent: {}",
            String::from_utf8_lossy(&seen)
        );
    }
}

/// Unequal `Content-Length` values (a list, or two lines) are refused with
/// 400 and `Connection: close` before the worker sees anything (pingora's
/// request reader does this, before the gateway's hooks).
async fn unequal_content_lengths_are_refused(kind: Kind) {
    let (worker, tap, gw) = setup(kind).await;
    let (authority, _) = split_url(&gw.url);
    let before = started(&worker).await;
    tap.take();
    let body = send(8);
    let n = body.len();
    for (case, lines) in [
        ("a list", vec![format!("{n}, {}", n + 1)]),
        ("two lines", vec![n.to_string(), (n + 1).to_string()]),
        ("shorter first", vec![format!("{}, {n}", n - 1)]),
    ] {
        let raw = exchange(&gw, &post("1.1", Some(&authority), &lines, "", &body)).await;
        let got = answers(&raw);
        assert_eq!(got.len(), 1, "{case}: {}", String::from_utf8_lossy(&raw));
        assert_eq!(got[0].status, 400, "{case}");
        assert!(says_close(&got[0]), "{case}: {:?}", got[0].headers);
    }
    assert!(tap.take().is_empty(), "a request reached the worker");
    assert_eq!(started(&worker).await, before, "the worker started a task");
}

/// Three requests in one write: three answers in order, or a first answer
/// that says `Connection: close`. The gateway serves all three.
async fn three_pipelined_requests_in_one_write(kind: Kind) {
    let (worker, tap, gw) = setup(kind).await;
    let (authority, _) = split_url(&gw.url);
    let before = started(&worker).await;
    let mut bytes = post("1.1", Some(&authority), &[], "", &send(1));
    bytes.extend(post("1.1", Some(&authority), &[], "", &send(2)));
    bytes.extend(post(
        "1.1",
        Some(&authority),
        &[],
        "connection: close\r\n",
        &send(3),
    ));
    let raw = exchange(&gw, &bytes).await;
    let got = answers(&raw);
    assert_close_announced(&got, 3, "three in one write");
    assert_eq!(
        got.len(),
        3,
        "all three served: {}",
        String::from_utf8_lossy(&raw)
    );
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.status, 200, "answer {}: {}", i + 1, r.text());
        let v: Value = r.json();
        assert_eq!(v["id"], i as u64 + 1, "answers in order: {v}");
        assert_eq!(
            v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{v}"
        );
    }
    assert!(says_close(&got[2]), "the last asked for close");
    assert_eq!(started(&worker).await, before + 3);
    assert_eq!(request_heads(&tap.take()).len(), 3);
}

/// A request pipelined while the first is still at the worker is served
/// after it, and the first is answered whole.
async fn pipelined_while_the_first_is_served(kind: Kind) {
    let (worker, _tap, gw) = setup(kind).await;
    let (authority, _) = split_url(&gw.url);
    let before = started(&worker).await;
    let slow = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("work:1500")}})
    .to_string();
    let mut sock = TcpStream::connect(&authority).await.unwrap();
    sock.write_all(&post("1.1", Some(&authority), &[], "", &slow))
        .await
        .unwrap();
    // The second request arrives while the first is at the worker (which
    // works 1.5 s; served as well if it came later).
    tokio::time::sleep(scaled_ms(200)).await;
    sock.write_all(&post(
        "1.1",
        Some(&authority),
        &[],
        "connection: close\r\n",
        &send(2),
    ))
    .await
    .unwrap();
    let raw = read_until_closed(&mut sock).await;
    let got = answers(&raw);
    assert_close_announced(&got, 2, "pipelined during the first");
    assert_eq!(
        got.len(),
        2,
        "both served: {}",
        String::from_utf8_lossy(&raw)
    );
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.status, 200, "answer {}: {}", i + 1, r.text());
        assert_eq!(r.json()["id"], i as u64 + 1, "{}", r.text());
        assert!(r.json()["result"]["task"].is_object(), "{}", r.text());
    }
    assert_eq!(started(&worker).await, before + 2);
}

/// Pipelined after a request the gateway refuses before reading its body
/// (no `Host`): the refusal is the last answer and says
/// `Connection: close`; the request after it never reaches the worker.
async fn closed_after_a_refusal_says_close(kind: Kind) {
    let (worker, tap, gw) = setup(kind).await;
    let (authority, _) = split_url(&gw.url);
    let before = started(&worker).await;
    tap.take();
    let mut bytes = post("1.1", Some(&authority), &[], "", &send(1));
    bytes.extend(post("1.1", None, &[], "", &send(2)));
    bytes.extend(post("1.1", Some(&authority), &[], "", &send(3)));
    let raw = exchange(&gw, &bytes).await;
    let got = answers(&raw);
    assert_close_announced(&got, 3, "a refusal in the middle");
    assert_eq!(got.len(), 2, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(got[0].status, 200, "{}", got[0].text());
    assert_eq!(got[0].json()["id"], 1);
    assert_eq!(got[1].status, 400, "{}", got[1].text());
    assert!(says_close(&got[1]), "{:?}", got[1].headers);
    assert_eq!(started(&worker).await, before + 1);
    assert_eq!(request_heads(&tap.take()).len(), 1);
}
