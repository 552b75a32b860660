//! OpenTelemetry traces (`[tracing]`): one server span per proxied request
//! and one client span per call the gateway makes to a worker on its own
//! (`CancelTask`, the `GetTask` probe, the `ListTasks` lookup by message),
//! exported over OTLP/HTTP (protobuf) by a batch processor on its own
//! thread.
//!
//! - **Request spans** ([`start`], [`upstream`], [`task_known`], [`end`],
//!   called from the proxy's hooks): parented by the caller's W3C
//!   `traceparent`/`tracestate` when it sent one; the worker's request
//!   carries a `traceparent` naming the gateway's span in place of the
//!   caller's. Attributes: route, A2A method, binding, tenant, task id,
//!   HTTP method, path and status.
//! - **Client spans** ([`client`], from `cancel.rs`): a call caused by a
//!   request (a caller that left, a lost stream, a spent budget) is a child
//!   of that request's span; one with no request behind it (a lease's lapse,
//!   an owed cancel claimed from the outbox) is the root of its own trace,
//!   linked to the span of the request that started the task when this
//!   process saw it. The worker gets the client span's `traceparent`.
//!
//! Which request caused a call is found by the task: each request span's
//! context is remembered by its task key (and by its sent message's id, for
//! a child found by its message) in a bounded cache, [`REMEMBERED`] entries
//! for at most [`REMEMBER_FOR`].
//!
//! Off (no `[tracing]`), nothing is built: each hook checks one `Option`
//! in the request's context ([`on`] for the gateway's own calls), and no
//! `traceparent` is added or replaced.

use std::io::{Read as _, Write as _};
use std::net::ToSocketAddrs as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{
    Link, SpanContext, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer};
use opentelemetry_sdk::trace::{SdkTracerProvider, Span};
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::Error;

use crate::store::TaskKey;

/// How many request span contexts are remembered for the gateway's later
/// calls about their tasks (about 150 bytes each).
pub const REMEMBERED: u64 = 64 * 1024;
/// How long a request span's context is remembered after its last use.
pub const REMEMBER_FOR: Duration = Duration::from_secs(3600);
/// The batch processor's export interval unless `OTEL_BSP_SCHEDULE_DELAY`
/// says otherwise: spans are exported within about this long, and at most
/// this much is lost if the process is killed.
pub const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// The longest [`shutdown`] waits for the last spans to be exported.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// How long one export may take (connect, send, answer).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an export's answer is read (OTLP answers are a few bytes).
const ANSWER_LIMIT: u64 = 64 * 1024;

/// The tracer and what the gateway keeps beside it, when `[tracing]` is on.
struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    /// Request span contexts by task (`false`) or sent message id (`true`,
    /// the key's task id being the message id).
    spans: moka::sync::Cache<(bool, TaskKey), SpanContext>,
}

static TRACING: OnceLock<Tracing> = OnceLock::new();

/// Whether traces are on: the one check on every path when they are off.
#[inline]
pub fn on() -> bool {
    TRACING.get().is_some()
}

/// Starts the exporter and the tracer for `cfg` (once per process; a
/// second call changes nothing). `None`: traces stay off.
pub fn init(cfg: Option<&config::Tracing>) -> Result<(), String> {
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    let Some(cfg) = cfg else { return Ok(()) };
    if on() {
        return Ok(());
    }
    let endpoint = format!("{}/v1/traces", cfg.otlp_endpoint);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(PostClient)
        .with_endpoint(endpoint.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("tracing.otlp_endpoint {endpoint}: {e}"))?;
    // The SDK's defaults and OTEL_BSP_* variables, but a shorter interval:
    // the drain ends the process as soon as it has nothing left to do.
    let mut batch = BatchConfigBuilder::default();
    if std::env::var_os("OTEL_BSP_SCHEDULE_DELAY").is_none() {
        batch = batch.with_scheduled_delay(EXPORT_EVERY);
    }
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch.build())
        .build();
    let resource = opentelemetry_sdk::Resource::builder_empty()
        .with_service_name(cfg.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            cfg.sample_ratio.get(),
        ))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("a2a-gateway");
    let spans = moka::sync::Cache::builder()
        .max_capacity(REMEMBERED)
        .time_to_idle(REMEMBER_FOR)
        .build();
    let _ = TRACING.set(Tracing {
        provider,
        tracer,
        propagator: TraceContextPropagator::new(),
        spans,
    });
    tracing::info!(endpoint = %endpoint, service = %cfg.service_name, ratio = cfg.sample_ratio.get(), "exporting traces over OTLP/HTTP");
    Ok(())
}

/// Exports the spans not yet sent and stops the exporter, waiting at most
/// [`SHUTDOWN_WAIT`] (a receiver that is down must not hold up an exit).
/// Call before the process exits; nothing when traces are off.
pub fn shutdown() {
    if let Some(t) = TRACING.get() {
        if let Err(e) = t.provider.shutdown_with_timeout(SHUTDOWN_WAIT) {
            tracing::warn!(error = %e, "could not export the last spans");
        }
    }
}

/// A proxied request's span, in its context from the first hook to
/// `logging`.
#[derive(Debug)]
pub struct RequestSpan {
    span: Span,
    /// Remembered under the task's key already (the task id it names).
    remembered: Option<std::sync::Arc<str>>,
}

/// The caller's headers, read by the W3C trace-context propagator.
struct HeadersIn<'a>(&'a http::HeaderMap);

impl Extractor for HeadersIn<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A request head to the worker, written by the propagator.
struct HeadOut<'a>(&'a mut RequestHeader);

impl Injector for HeadOut<'_> {
    fn set(&mut self, key: &str, value: String) {
        // An empty `tracestate` is not sent.
        if value.is_empty() {
            return;
        }
        let _ = self.0.insert_header(key.to_owned(), value);
    }
}

/// What a request's span is told of the request, from the proxy's
/// context (`crate::proxy` builds it).
#[derive(Debug, Default)]
pub struct Facts<'a> {
    pub route: Option<&'a Arc<str>>,
    pub method: Option<&'static str>,
    pub binding: Option<&'static str>,
    pub tenant: Option<&'a str>,
    /// The task an answer named.
    pub task_id: Option<&'a Arc<str>>,
    /// The task the request itself names.
    pub request_task: Option<&'a str>,
    /// The sent message of a send that starts a task.
    pub message_id: Option<&'a str>,
}

/// `request_filter`: starts the request's span (child of the caller's
/// `traceparent`, if any) in `slot`. Nothing when traces are off.
pub fn start(session: &Session, slot: &mut Option<Box<RequestSpan>>) {
    let Some(t) = TRACING.get() else { return };
    let head = session.req_header();
    let parent = t.propagator.extract(&HeadersIn(&head.headers));
    let span = t
        .tracer
        .span_builder(head.method.as_str().to_owned())
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("http.request.method", head.method.as_str().to_owned()),
            KeyValue::new("url.path", head.uri.path().to_owned()),
        ])
        .start_with_context(&t.tracer, &parent);
    *slot = Some(Box::new(RequestSpan {
        span,
        remembered: None,
    }));
}

/// `upstream_request_filter`: the worker's request names the gateway's
/// span as its parent (`traceparent`, `tracestate`), in place of the
/// caller's.
pub fn upstream(head: &mut RequestHeader, span: Option<&RequestSpan>) {
    let (Some(t), Some(rs)) = (TRACING.get(), span) else {
        return;
    };
    use opentelemetry::trace::Span as _;
    let _ = head.remove_header("tracestate");
    let cx = Context::new().with_remote_span_context(rs.span.span_context().clone());
    t.propagator.inject_context(&cx, &mut HeadOut(head));
}

/// `response_body_filter`: once an event names the task, the span is
/// remembered under it, so that a cancel sent while the request is still
/// open (a spent budget) is its child.
#[inline]
pub fn task_known(slot: &mut Option<Box<RequestSpan>>, facts: &Facts<'_>) {
    let Some(rs) = slot.as_deref_mut() else {
        return;
    };
    if facts.task_id.is_some() && rs.remembered.as_ref() != facts.task_id {
        remember(rs, facts);
    }
}

/// Remembers the request span under its task (and message) key.
fn remember(rs: &mut RequestSpan, facts: &Facts<'_>) {
    let (Some(t), Some(route)) = (TRACING.get(), facts.route) else {
        return;
    };
    use opentelemetry::trace::Span as _;
    let sc = rs.span.span_context().clone();
    let task = facts
        .task_id
        .cloned()
        .or_else(|| facts.request_task.map(Arc::<str>::from));
    if let Some(task) = &task {
        if rs.remembered.as_ref() != Some(task) {
            t.spans.insert(
                (false, TaskKey::new(route, facts.tenant, task.clone())),
                sc.clone(),
            );
            rs.remembered = Some(task.clone());
        }
    }
    if let Some(m) = facts.message_id {
        t.spans
            .insert((true, TaskKey::new(route, facts.tenant, m)), sc);
    }
}

/// `logging`: the request's attributes and status, and the span's end.
/// Before the cascade is handed the request, so that its calls find the
/// span.
pub fn end(
    session: &Session,
    e: Option<&Error>,
    slot: &mut Option<Box<RequestSpan>>,
    facts: &Facts<'_>,
) {
    let Some(mut rs) = slot.take() else {
        return;
    };
    remember(&mut rs, facts);
    use opentelemetry::trace::Span as _;
    let span = &mut rs.span;
    if let Some(m) = facts.method {
        span.update_name(m);
        span.set_attribute(KeyValue::new("a2a.method", m));
    }
    if let Some(r) = facts.route {
        span.set_attribute(KeyValue::new("a2a.route", r.to_string()));
    }
    if let Some(b) = facts.binding {
        span.set_attribute(KeyValue::new("a2a.binding", b));
    }
    if let Some(tenant) = facts.tenant {
        span.set_attribute(KeyValue::new("a2a.tenant", tenant.to_owned()));
    }
    let task = facts.task_id.map(|t| &**t).or(facts.request_task);
    if let Some(task) = task {
        span.set_attribute(KeyValue::new("a2a.task_id", task.to_owned()));
    }
    let status = session.response_written().map(|r| r.status.as_u16());
    if let Some(s) = status {
        span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
    }
    if let Some(e) = e {
        let side = match e.esource() {
            pingora::ErrorSource::Upstream => "worker",
            pingora::ErrorSource::Downstream => "caller",
            _ => "gateway",
        };
        span.set_attribute(KeyValue::new("error.type", e.etype().as_str()));
        span.set_attribute(KeyValue::new("a2a.error_side", side));
    }
    // A caller that left is not the gateway's error; a failed worker or
    // gateway, or a 5xx answer, is.
    let failed = status.is_some_and(|s| s >= 500)
        || e.is_some_and(|e| *e.esource() != pingora::ErrorSource::Downstream);
    if failed {
        span.set_status(Status::error(e.map_or_else(
            || "5xx answer".to_owned(),
            |e| e.etype().as_str().to_owned(),
        )));
    }
    span.end();
}

/// [`client`] for a job's call about its task: the request that sent the
/// task's first message (`message_id`) stands in for one remembered under
/// the task (a passed send's answer is never read, so its task is only
/// remembered by its message): a tree's cancel of a background child is a
/// child of the span of the send that started it, in the parent's trace.
pub fn client_for(
    call: &'static str,
    key: &TaskKey,
    message_id: Option<&str>,
    cause: &'static str,
    worker: &config::WorkerUrl,
) -> Option<ClientSpan> {
    let t = TRACING.get()?;
    match message_id {
        Some(m) if !t.spans.contains_key(&(false, key.clone())) => client(
            call,
            &TaskKey::new(&key.route, key.tenant(), m),
            true,
            cause,
            worker,
        )
        .map(|mut s| {
            use opentelemetry::trace::Span as _;
            s.span
                .set_attribute(KeyValue::new("a2a.task_id", key.task_id.to_string()));
            s
        }),
        _ => client(call, key, false, cause, worker),
    }
}

/// A call the gateway makes to a worker on its own.
#[derive(Debug)]
pub struct ClientSpan {
    span: Span,
}

/// Starts the client span of `call` (`CancelTask`, `GetTask`, `ListTasks`)
/// for `key`'s task (`by_message`: the key's task id is the sent message's
/// id), made for `cause`. A cause with a request behind it (`caller_gone`,
/// `stream_lost`, `budget_exhausted`, `find`) is a child of that request's
/// span when this process remembers it; `lease_lapsed` and `outbox` are
/// roots of their own, linked to it. `None` when traces are off.
pub fn client(
    call: &'static str,
    key: &TaskKey,
    by_message: bool,
    cause: &'static str,
    worker: &config::WorkerUrl,
) -> Option<ClientSpan> {
    let t = TRACING.get()?;
    let origin = t.spans.get(&(by_message, key.clone()));
    let rooted = matches!(cause, "lease_lapsed" | "outbox");
    let mut attrs = vec![
        KeyValue::new("a2a.route", key.route.to_string()),
        KeyValue::new("a2a.cause", cause),
        KeyValue::new("server.address", worker.authority()),
    ];
    if let Some(tenant) = key.tenant() {
        attrs.push(KeyValue::new("a2a.tenant", tenant.to_owned()));
    }
    if by_message {
        attrs.push(KeyValue::new("a2a.message_id", key.task_id.to_string()));
    } else {
        attrs.push(KeyValue::new("a2a.task_id", key.task_id.to_string()));
    }
    let mut builder = t
        .tracer
        .span_builder(call)
        .with_kind(SpanKind::Client)
        .with_attributes(attrs);
    let parent = match origin {
        Some(sc) if !rooted => Context::new().with_remote_span_context(sc),
        Some(sc) => {
            builder = builder.with_links(vec![Link::with_context(sc)]);
            Context::new()
        }
        None => Context::new(),
    };
    Some(ClientSpan {
        span: builder.start_with_context(&t.tracer, &parent),
    })
}

impl ClientSpan {
    /// The `traceparent` (and `tracestate`) the worker gets: this span.
    pub fn headers(&self) -> Vec<(String, String)> {
        use opentelemetry::trace::Span as _;
        let Some(t) = TRACING.get() else {
            return Vec::new();
        };
        let cx = Context::new().with_remote_span_context(self.span.span_context().clone());
        let mut out = Headers(Vec::with_capacity(2));
        t.propagator.inject_context(&cx, &mut out);
        out.0
    }

    /// Notes how the call went (`canceled`, `failed`, a state…); a failed
    /// call also sets the span's error status.
    pub fn outcome(&mut self, outcome: &str, failed: Option<&str>) {
        use opentelemetry::trace::Span as _;
        self.span
            .set_attribute(KeyValue::new("a2a.outcome", outcome.to_owned()));
        if let Some(why) = failed {
            self.span.set_status(Status::error(why.to_owned()));
        }
    }

    /// Notes a number attribute (`a2a.attempts`).
    pub fn count(&mut self, name: &'static str, n: u64) {
        use opentelemetry::trace::Span as _;
        self.span
            .set_attribute(KeyValue::new(name, i64::try_from(n).unwrap_or(i64::MAX)));
    }
}

/// Remembers a task found by its sent message under its own key, with the
/// context of the request that sent the message, so that the cancel that
/// follows is that request's child too.
pub fn found_by_message(message: &TaskKey, task: &TaskKey) {
    let Some(t) = TRACING.get() else { return };
    if let Some(sc) = t.spans.get(&(true, message.clone())) {
        t.spans.insert((false, task.clone()), sc);
    }
}

/// Header pairs written by the propagator.
struct Headers(Vec<(String, String)>);

impl Injector for Headers {
    fn set(&mut self, key: &str, value: String) {
        if !value.is_empty() {
            self.0.push((key.to_owned(), value));
        }
    }
}

/// The exporter's HTTP client: one blocking HTTP/1.1 `POST` per export on
/// a fresh connection, on the batch processor's own thread (which runs the
/// export future to completion itself, outside any async runtime), with
/// [`EXPORT_TIMEOUT`] for connecting and for each read and write. Plain
/// `http://` only (the config refuses `https://`).
#[derive(Debug)]
struct PostClient;

#[async_trait]
impl opentelemetry_http::HttpClient for PostClient {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let sent = post(&request);
        note_export(&sent);
        sent.map_err(Into::into)
    }
}

/// Logs the exports' health as it changes: the first failure after a
/// success (or at start) at `warn`, the first success after failures at
/// `info`; nothing for each further export alike (one a second at most).
fn note_export(sent: &Result<http::Response<bytes::Bytes>, String>) {
    use std::sync::atomic::{AtomicU8, Ordering};
    /// 0: no export yet, 1: the last one succeeded, 2: the last one failed.
    static LAST: AtomicU8 = AtomicU8::new(0);
    let failure = match sent {
        Ok(r) if r.status().is_success() => None,
        Ok(r) => Some(format!(
            "HTTP {}: {}",
            r.status(),
            String::from_utf8_lossy(&r.body()[..r.body().len().min(200)])
        )),
        Err(e) => Some(e.clone()),
    };
    let now = if failure.is_some() { 2 } else { 1 };
    let before = LAST.swap(now, Ordering::Relaxed);
    match failure {
        Some(why) if before != 2 => {
            tracing::warn!(error = %why, "could not export spans to the OTLP receiver; they are dropped until it answers");
        }
        None if before == 2 => tracing::info!("exporting spans again"),
        _ => {}
    }
}

fn post(request: &http::Request<bytes::Bytes>) -> Result<http::Response<bytes::Bytes>, String> {
    let uri = request.uri();
    let host = uri.host().ok_or("no host in the OTLP endpoint")?;
    let port = uri.port_u16().unwrap_or(80);
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}:{port}: {e}"))?;
    let mut last = format!("{host}:{port}: no address");
    let mut conn = None;
    for addr in addrs {
        match std::net::TcpStream::connect_timeout(&addr, EXPORT_TIMEOUT) {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    let mut conn = conn.ok_or(last)?;
    let io = |e: std::io::Error| match e.kind() {
        // A socket timeout reads as EAGAIN.
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("{host}:{port}: no answer within {EXPORT_TIMEOUT:?}")
        }
        _ => format!("{host}:{port}: {e}"),
    };
    conn.set_read_timeout(Some(EXPORT_TIMEOUT)).map_err(io)?;
    conn.set_write_timeout(Some(EXPORT_TIMEOUT)).map_err(io)?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let body = request.body();
    let mut head = format!(
        "{} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
        request.method(),
        uri.authority().map_or(host, |a| a.as_str()),
        body.len()
    );
    for (k, v) in request.headers() {
        if matches!(k.as_str(), "host" | "content-length" | "connection") {
            continue;
        }
        if let Ok(v) = v.to_str() {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).map_err(io)?;
    conn.write_all(body).map_err(io)?;
    // The head, then its `content-length` bytes (a receiver may keep the
    // connection open despite `connection: close`); without a length, up
    // to the close. At most ANSWER_LIMIT bytes in all.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut head_end = None;
    let mut want = None;
    loop {
        if let Some(end) = head_end {
            if want.is_some_and(|n| answer.len() >= end + 4 + n) {
                break;
            }
        }
        if answer.len() as u64 >= ANSWER_LIMIT {
            break;
        }
        let n = conn.read(&mut chunk).map_err(io)?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
        if head_end.is_none() {
            head_end = answer.windows(4).position(|w| w == b"\r\n\r\n");
            if let Some(end) = head_end {
                want = content_length(&answer[..end]);
            }
        }
    }
    let end = head_end.ok_or_else(|| format!("{host}:{port}: no HTTP answer"))?;
    let head = String::from_utf8_lossy(&answer[..end]);
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{host}:{port}: not an HTTP answer: {head:.80}"))?;
    let stop = want.map_or(answer.len(), |n| (end + 4 + n).min(answer.len()));
    // The body as sent (a chunked one is only ever shown in an error).
    let body = bytes::Bytes::copy_from_slice(&answer[end + 4..stop]);
    http::Response::builder()
        .status(status)
        .body(body)
        .map_err(|e| e.to_string())
}

/// The `content-length` of an HTTP head.
fn content_length(head: &[u8]) -> Option<usize> {
    String::from_utf8_lossy(head)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exporter's client against a one-shot listener: the request as
    /// sent, the answer as read.
    #[test]
    fn posts_and_reads_the_answer() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.ends_with(b"hello") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
            }
            c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .unwrap();
            // The connection is held open: the answer's length ends it.
            std::thread::sleep(Duration::from_secs(2));
            String::from_utf8(got).unwrap()
        });
        let req = http::Request::post(format!("http://{addr}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(bytes::Bytes::from_static(b"hello"))
            .unwrap();
        let started = std::time::Instant::now();
        let resp = post(&req).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(resp.status(), 200);
        assert_eq!(&resp.body()[..], b"ok");
        let sent = server.join().unwrap();
        assert!(sent.starts_with("POST /v1/traces HTTP/1.1\r\n"), "{sent}");
        assert!(
            sent.contains("content-type: application/x-protobuf\r\n"),
            "{sent}"
        );
        assert!(sent.contains("content-length: 5\r\n"), "{sent}");
        // Nobody listening (the listener is gone): an error, not a hang.
        let req = http::Request::post(format!("http://{addr}/v1/traces"))
            .body(bytes::Bytes::new())
            .unwrap();
        assert!(post(&req).is_err());
    }
}
