//! An OTLP/HTTP trace receiver for the tests: a loopback listener that
//! answers `POST /v1/traces` (protobuf), decodes each export with
//! `opentelemetry-proto`'s prost types and keeps the spans for the test to
//! look at.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// One received span, ids in lowercase hex (`""` for no parent).
#[derive(Clone, Debug)]
pub struct Span {
    pub service: String,
    pub name: String,
    /// OTLP's `SpanKind`: 2 server, 3 client.
    pub kind: i32,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub attrs: Vec<(String, String)>,
    /// Linked spans: (trace id, span id).
    pub links: Vec<(String, String)>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
}

pub const SERVER: i32 = 2;
pub const CLIENT: i32 = 3;

impl Span {
    /// An attribute's value as text (ints in decimal).
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    /// POSTs received (each one export), decodable or not.
    exports: usize,
    /// Requests that were not a decodable `POST /v1/traces`.
    bad: Vec<String>,
}

/// The largest request body accepted (the gateway's exports are far
/// smaller).
const MAX_BODY: usize = 16 << 20;

/// A receiver on a free loopback port; stops with the test's runtime.
pub struct Receiver {
    /// `http://127.0.0.1:PORT`, for `tracing.otlp_endpoint`.
    pub url: String,
    got: Arc<Mutex<Received>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(Received::default()));
        let g = got.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, g.clone()));
            }
        });
        Receiver { url, got }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.got.lock().unwrap().spans.clone()
    }

    /// How many exports (POSTs) arrived.
    pub fn exports(&self) -> usize {
        self.got.lock().unwrap().exports
    }

    /// Requests that were not a decodable OTLP trace export.
    pub fn bad(&self) -> Vec<String> {
        self.got.lock().unwrap().bad.clone()
    }

    /// Waits up to `within` for a span `pick` accepts.
    pub async fn wait_span(&self, within: Duration, pick: impl Fn(&Span) -> bool) -> Option<Span> {
        let until = tokio::time::Instant::now() + within;
        loop {
            if let Some(s) = self.spans().into_iter().find(&pick) {
                return Some(s);
            }
            if tokio::time::Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Serves one connection: HTTP/1.1 requests with a `content-length` body,
/// until the client closes.
async fn serve(mut conn: TcpStream, got: Arc<Mutex<Received>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_until_head(&mut conn, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let len = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if len > MAX_BODY {
            got.lock().unwrap().bad.push(format!("body of {len} bytes"));
            return;
        }
        buf.drain(..end + 4);
        while buf.len() < len {
            let mut chunk = [0u8; 16 * 1024];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..len).collect();
        let first = head.lines().next().unwrap_or("").to_owned();
        {
            let mut g = got.lock().unwrap();
            g.exports += 1;
            if !first.starts_with("POST /v1/traces ") {
                g.bad.push(first);
            } else {
                match ExportTraceServiceRequest::decode(&body[..]) {
                    Ok(req) => g.spans.extend(spans_of(req)),
                    Err(e) => g.bad.push(format!("{first}: not OTLP protobuf: {e}")),
                }
            }
        }
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if conn.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads until `buf` holds a whole request head; its length (before the
/// blank line). `None`: the client closed.
async fn read_until_head(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(i);
        }
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn spans_of(req: ExportTraceServiceRequest) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .map(text)
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Span {
                    service: service.clone(),
                    name: s.name,
                    kind: s.kind,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    attrs: s
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(kv)))
                        .collect(),
                    links: s
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    status: s.status.map_or(0, |st| st.code),
                });
            }
        }
    }
    out
}
