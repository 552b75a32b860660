//! An SSE client over a raw socket: read frames one by one (raw or as
//! JSON), then leave the way a real caller leaves (FIN with `close`, RST with
//! `reset`).

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http::split_url;

/// An SSE response read frame by frame over a raw socket, for holding a
/// stream open and then dropping it at a chosen moment.
#[derive(Debug)]
pub struct SseStream {
    sock: TcpStream,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunked: bool,
    /// Raw bytes after the response head, not yet de-chunked.
    raw: Vec<u8>,
    /// De-chunked body bytes not yet returned as frames.
    body: Vec<u8>,
    closed: bool,
}

impl SseStream {
    /// POSTs `body` (as `application/json`, with `Accept: text/event-stream`
    /// and `A2A-Version: 1.0` unless `headers` name them) and reads the head.
    pub async fn open(url: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> SseStream {
        let (authority, base) = split_url(url);
        let mut sock = TcpStream::connect(&authority)
            .await
            .unwrap_or_else(|e| panic!("connect {authority}: {e}"));
        let body = body.to_string();
        let mut head =
            format!("POST {base}{path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n");
        let named = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
        if !named("a2a-version") {
            head.push_str("a2a-version: 1.0\r\n");
        }
        if !named("accept") {
            head.push_str("accept: text/event-stream\r\n");
        }
        if !named("content-type") {
            head.push_str("content-type: application/json\r\n");
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
        sock.write_all(head.as_bytes()).await.unwrap();
        sock.write_all(body.as_bytes()).await.unwrap();

        let mut raw = Vec::new();
        let end = loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(super::scaled_secs(30), sock.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no response head within {:?}", super::scaled_secs(30)))
                .expect("read response head");
            assert!(
                n > 0,
                "connection closed before the response head: {:?}",
                String::from_utf8_lossy(&raw)
            );
            raw.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
        let rest = raw[end + 4..].to_vec();
        let mut s = SseStream {
            sock,
            status,
            headers,
            chunked,
            raw: Vec::new(),
            body: Vec::new(),
            closed: false,
        };
        s.push(&rest);
        s
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Feeds socket bytes in, moving every complete chunk into `body`.
    fn push(&mut self, bytes: &[u8]) {
        if !self.chunked {
            self.body.extend_from_slice(bytes);
            return;
        }
        self.raw.extend_from_slice(bytes);
        loop {
            let Some(nl) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size_line = String::from_utf8_lossy(&self.raw[..nl]).into_owned();
            let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16)
                .unwrap_or_else(|_| panic!("bad chunk size line {size_line:?}"));
            if size == 0 {
                self.closed = true;
                self.raw.clear();
                return;
            }
            if self.raw.len() < nl + 2 + size + 2 {
                return;
            }
            self.body
                .extend_from_slice(&self.raw[nl + 2..nl + 2 + size]);
            self.raw.drain(..nl + 2 + size + 2);
        }
    }

    /// The next raw frame, separator included (e.g. `data: {…}\r\n\r\n`), or
    /// `None` once the stream ended. Comment-only frames (`: ping`) are
    /// returned too. Panics after `within` without a frame.
    pub async fn next_raw_frame(&mut self, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = frame_end(&self.body) {
                let frame: Vec<u8> = self.body.drain(..end).collect();
                return Some(String::from_utf8(frame).expect("utf-8 frame"));
            }
            if self.closed {
                return None;
            }
            let mut buf = [0u8; 8192];
            let n = tokio::time::timeout_at(deadline, self.sock.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "no SSE frame within {within:?}; pending {:?}",
                        String::from_utf8_lossy(&self.body)
                    )
                })
                .unwrap_or(0);
            if n == 0 {
                self.closed = true;
                continue;
            }
            self.push(&buf[..n]);
        }
    }

    /// The JSON of the next `data:` frame (comments skipped), or `None` at the
    /// end of the stream.
    pub async fn next_json(&mut self, within: Duration) -> Option<Value> {
        loop {
            let frame = self.next_raw_frame(within).await?;
            let data: Vec<&str> = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if data.is_empty() {
                continue;
            }
            let text = data.join("\n");
            return Some(
                serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("frame data is not JSON ({e}): {text}")),
            );
        }
    }

    /// Reads every remaining `data:` frame until the server ends the stream.
    pub async fn rest_json(&mut self, within: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(v) = self.next_json(within).await {
            out.push(v);
        }
        out
    }

    /// Closes the socket with a reset (SO_LINGER 0) instead of a FIN.
    pub fn reset(self) {
        // Linger 0 does not block on drop, which is what the deprecation is about.
        #[allow(deprecated)]
        let _ = self.sock.set_linger(Some(Duration::ZERO));
        drop(self.sock);
    }
}

/// The end (exclusive) of the first complete SSE frame in `body`: a blank
/// line, whichever of CRLF / LF / CR the server uses.
fn frame_end(body: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < body.len() {
        for sep in [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"] {
            if body[i..].starts_with(sep) {
                return Some(i + sep.len());
            }
        }
        i += 1;
    }
    None
}

impl SseStream {
    /// The response's content type, lower-cased (`""` if none).
    pub fn content_type(&self) -> String {
        self.header("content-type")
            .unwrap_or("")
            .to_ascii_lowercase()
    }

    /// The next event's data as JSON, or `None` when the stream ended.
    pub async fn next(&mut self, within: Duration) -> Option<Value> {
        self.next_json(within).await
    }

    /// Reads events until one names its task (at most 10, each within 5 s,
    /// scaled), and returns that task's id; panics when none does.
    pub async fn task_id(&mut self) -> String {
        for _ in 0..10 {
            let ev = self.next(super::scaled_secs(5)).await.expect("an event");
            if let Some(t) = super::worker::task_id_of(&ev) {
                return t;
            }
        }
        panic!("no event named the task")
    }

    /// Every remaining event until the server ends the stream.
    pub async fn rest(&mut self, within: Duration) -> Vec<Value> {
        self.rest_json(within).await
    }

    /// Closes the connection (FIN), as a caller that goes away does.
    pub fn close(self) {
        drop(self.sock);
    }
}
