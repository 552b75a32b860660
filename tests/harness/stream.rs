//! An SSE client over a raw socket: read events one by one, then leave the
//! way a real caller leaves (FIN with `close`, RST with `reset`).

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http::split_url;

/// One streaming response, read event by event.
pub struct SseStream {
    sock: TcpStream,
    pub status: u16,
    pub content_type: String,
    chunked: bool,
    /// Undecoded bytes after the head.
    raw: Vec<u8>,
    /// Decoded body bytes not yet parsed into events.
    body: Vec<u8>,
    eof: bool,
}

impl SseStream {
    /// POSTs `body` as JSON to `url` + `path` with `Accept: text/event-stream`.
    pub async fn open(url: &str, path: &str, extra: &[(&str, &str)], body: &Value) -> SseStream {
        let (authority, base) = split_url(url);
        let mut sock = TcpStream::connect(&authority).await.expect("connect");
        let body = body.to_string();
        let mut head = format!(
            "POST {base}{path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\
             content-type: application/json\r\naccept: text/event-stream\r\n\
             a2a-version: 1.0\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (k, v) in extra {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        sock.write_all(head.as_bytes()).await.unwrap();
        sock.write_all(body.as_bytes()).await.unwrap();

        let mut raw = Vec::new();
        let end = loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), sock.read(&mut buf))
                .await
                .expect("response head within 10 s")
                .unwrap();
            assert!(n > 0, "closed before the response head");
            raw.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let mut content_type = String::new();
        let mut chunked = false;
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
                if k == "content-type" {
                    content_type = v;
                } else if k == "transfer-encoding" && v.contains("chunked") {
                    chunked = true;
                }
            }
        }
        let raw = raw[end + 4..].to_vec();
        SseStream {
            sock,
            status,
            content_type,
            chunked,
            raw,
            body: Vec::new(),
            eof: false,
        }
    }

    /// Moves complete chunks (or everything, unchunked) from `raw` to `body`.
    fn decode(&mut self) {
        if !self.chunked {
            self.body.append(&mut self.raw);
            return;
        }
        loop {
            let Some(nl) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size_line = String::from_utf8_lossy(&self.raw[..nl]).into_owned();
            let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16)
                .expect("chunk size");
            if size == 0 {
                self.eof = true;
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

    /// Takes one complete event's `data` (parsed) from `body`, if there is one.
    pub fn take_event(&mut self) -> Option<Value> {
        loop {
            let text = String::from_utf8_lossy(&self.body).into_owned();
            let norm = text.replace("\r\n", "\n");
            let end = norm.find("\n\n")?;
            // Find the same boundary in the raw text to drain the right bytes.
            let consumed = if text.contains("\r\n") {
                text.find("\r\n\r\n").map(|i| i + 4).unwrap_or(end + 2)
            } else {
                end + 2
            };
            let frame = norm[..end].to_string();
            self.body.drain(..consumed.min(self.body.len()));
            let data: Vec<&str> = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if data.is_empty() {
                continue; // a comment such as `: keep-alive`
            }
            return Some(serde_json::from_str(&data.join("\n")).expect("event data is JSON"));
        }
    }

    /// The next event's data, or `None` when the stream ended.
    pub async fn next(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            self.decode();
            if let Some(ev) = self.take_event() {
                return Some(ev);
            }
            if self.eof {
                return None;
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, self.sock.read(&mut buf))
                .await
                .expect("next SSE event in time")
                .unwrap_or(0);
            if n == 0 {
                self.eof = true;
                self.decode();
                return self.take_event();
            }
            self.raw.extend_from_slice(&buf[..n]);
        }
    }

    /// Every remaining event until the server ends the stream.
    pub async fn rest(&mut self, within: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(ev) = self.next(within).await {
            out.push(ev);
        }
        out
    }
}

impl SseStream {
    /// Closes the connection (FIN), as a caller that goes away does.
    pub fn close(self) {
        drop(self.sock);
    }

    /// Resets the connection (RST), as a crashed caller's kernel does.
    pub fn reset(self) {
        // Linger zero makes close send RST; with zero it never blocks.
        #[allow(deprecated)]
        let _ = self.sock.set_linger(Some(Duration::ZERO));
        drop(self.sock);
    }
}
