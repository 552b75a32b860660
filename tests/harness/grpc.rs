//! A small client toolkit for the A2A gRPC binding (`lf.a2a.v1.A2AService`)
//! in tests: a real SDK client, and a raw HTTP/2 caller for what no SDK
//! client lets a test do.
//!
//! * [`client`]: an a2a-rust 0.15 `A2aClient` over gRPC (`build_grpc`), for
//!   a test that calls as an ordinary gRPC caller would (`stream_message`,
//!   `Delegation::start_leased`, `cancel_task`, …).
//! * [`RawGrpc`] / [`RawCall`]: gRPC spoken by hand over one `h2` client
//!   connection (h2c with prior knowledge over a tokio `TcpStream`: the
//!   plaintext form tonic and grpcio serve). A test sees every message as
//!   it arrives, the `grpc-status` whether it comes in trailers or in a
//!   Trailers-Only response, and can end a call the two ways a gateway must
//!   treat as "the caller left": [`RawCall::reset`] (RST_STREAM CANCEL on
//!   the one stream, the connection stays up) and [`RawGrpc::close`] (the
//!   TCP connection dropped, with no GOAWAY). [`RawGrpc::connect_tls`] is
//!   the same over TLS with ALPN `h2` (a gateway's `[server.tls]` listener).
//! * Request builders ([`send_request`], [`with_lease`], [`with_budget`],
//!   [`with_message_metadata`], [`with_message_extension`]) and readers
//!   ([`task_id_of`], [`state_of`]) for the protobuf messages of
//!   `a2a_protocol_types::proto`.
//!
//! Every raw call sends `content-type: application/grpc`, `te: trailers` and
//! `a2a-version: 1.0` (a2a-rust's `GrpcDispatcher` refuses a call without
//! `a2a-version`; [`RawGrpc::open_exact`] sends exactly the headers given,
//! to test that). A request's tenant is its `tenant` field, never metadata.
//!
//! Addresses: every function taking an address accepts `http://host:port`
//! (what `RustWorker::grpc_url`, `PythonWorker::grpc_url` and a gateway's
//! `url` are) or a bare `host:port`; a path after the authority is ignored,
//! as tonic and grpcio ignore it (calls always go to
//! `/lf.a2a.v1.A2AService/<Method>`).

use std::future::poll_fn;
use std::time::Duration;

use a2a_protocol_client::{A2aClient, ClientBuilder};
use a2a_protocol_types::budget::Budget;
use a2a_protocol_types::lease::Lease;
use a2a_protocol_types::proto;
use a2a_protocol_types::proto::stream_response::Payload;
use bytes::{Buf, Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, Request};
use prost::Message as _;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The service every A2A gRPC method belongs to.
pub const SERVICE: &str = "lf.a2a.v1.A2AService";

/// gRPC status codes a test compares `grpc-status` with (the numbers of
/// `google.rpc.Code`).
pub mod code {
    /// The call succeeded.
    pub const OK: i32 = 0;
    /// The call was cancelled (typically by the caller).
    pub const CANCELLED: i32 = 1;
    /// Invalid params (a2a-rust: invalid params, malformed request).
    pub const INVALID_ARGUMENT: i32 = 3;
    /// The deadline (`grpc-timeout`) passed.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// TaskNotFound (both SDKs), also an unknown method on grpcio.
    pub const NOT_FOUND: i32 = 5;
    /// Refused by authorization.
    pub const PERMISSION_DENIED: i32 = 7;
    /// Overloaded (a2a-rust: too many streams).
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    /// TaskNotCancelable, UnsupportedOperation, VersionNotSupported (e.g. no
    /// `a2a-version` metadata on a2a-rust).
    pub const FAILED_PRECONDITION: i32 = 9;
    /// A method the server does not implement (tonic: an unknown path).
    pub const UNIMPLEMENTED: i32 = 12;
    /// An internal error.
    pub const INTERNAL: i32 = 13;
    /// Unavailable (a2a-rust: halted; a proxy: the upstream is down).
    pub const UNAVAILABLE: i32 = 14;
    /// No or bad credentials.
    pub const UNAUTHENTICATED: i32 = 16;
}

/// How long the helpers that take no bound of their own wait for an answer
/// (connect, a unary call, the first events of [`start_streaming`]).
fn answer_timeout() -> Duration {
    super::scaled_secs(10)
}

/// `host:port` from `http://host:port/anything` or `host:port`.
fn authority(addr: &str) -> String {
    let rest = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .unwrap_or(addr);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// `/lf.a2a.v1.A2AService/<method>`, or `method` itself when it is a path.
fn method_path(method: &str) -> String {
    if method.starts_with('/') {
        method.to_string()
    } else {
        format!("/{SERVICE}/{method}")
    }
}

/// An a2a-rust `A2aClient` speaking gRPC to `url` (a worker's `grpc_url` or
/// a gateway's h2c URL): `ClientBuilder::new(url).with_protocol_binding("GRPC")`
/// with `tenant` as its default tenant (each request's `tenant` field) and
/// `extensions` sent as `a2a-extensions` metadata on every call, then
/// `build_grpc()`. The client sends `a2a-version: 1.0` itself. Use it where
/// a test should call the way a real gRPC caller does (streams, delegations
/// with leases and cancel-on-drop); use [`RawGrpc`] to see or control the
/// wire. Panics if the client cannot be built (the connection is lazy: an
/// unreachable address fails on the first call, not here).
pub async fn client(url: &str, tenant: Option<&str>, extensions: &[&str]) -> A2aClient {
    let mut builder = ClientBuilder::new(url).with_protocol_binding("GRPC");
    if let Some(t) = tenant {
        builder = builder.with_tenant(t);
    }
    if !extensions.is_empty() {
        builder = builder.with_extensions(extensions.iter().copied());
    }
    builder
        .build_grpc()
        .await
        .unwrap_or_else(|e| panic!("gRPC client for {url}: {e}"))
}

/// A fresh message id, unique in this test process.
fn next_message_id() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("grpc-msg-{}-{n}", std::process::id())
}

/// A `SendMessageRequest` (for `SendMessage` or `SendStreamingMessage`)
/// carrying a user message whose one text part is `text` (the workers'
/// script: `work:<ms>`, `quick`, …) and a fresh `message_id`, in `tenant`
/// (`""`: none, as proto3 leaves it unset). Add a grant with [`with_lease`]
/// or [`with_budget`].
pub fn send_request(text: &str, tenant: &str) -> proto::SendMessageRequest {
    proto::SendMessageRequest {
        tenant: tenant.to_string(),
        message: Some(proto::Message {
            message_id: next_message_id(),
            role: proto::Role::User as i32,
            parts: vec![proto::Part {
                content: Some(proto::part::Content::Text(text.to_string())),
                ..proto::Part::default()
            }],
            ..proto::Message::default()
        }),
        ..proto::SendMessageRequest::default()
    }
}

/// Applies `edit` to the request's message as a2a-rust's domain `Message`
/// (proto -> domain -> proto with `a2a_protocol_types::proto::convert`), so
/// what a2a-rust's helpers write is exactly what a2a-rust's own gRPC client
/// would send.
fn edit_domain_message(
    mut req: proto::SendMessageRequest,
    edit: impl FnOnce(&mut a2a_protocol_types::message::Message),
) -> proto::SendMessageRequest {
    let msg = req.message.take().expect("a request with a message");
    let mut domain = a2a_protocol_types::message::Message::try_from(msg)
        .unwrap_or_else(|e| panic!("message to domain: {e}"));
    edit(&mut domain);
    req.message =
        Some(proto::Message::try_from(domain).unwrap_or_else(|e| panic!("message to proto: {e}")));
    req
}

/// The request with a lease grant of `ttl_ms` on its message, exactly as
/// a2a-rust's `Lease::attach` writes it (which `Delegation::start_leased`
/// uses): `Message.metadata["a2a-rust.com/lease"] = {"ttlMs": ttl_ms}` (a
/// `google.protobuf.Struct`, the number a double) and
/// `https://a2a-rust.com/extensions/lease/v1` in `Message.extensions`.
pub fn with_lease(req: proto::SendMessageRequest, ttl_ms: u64) -> proto::SendMessageRequest {
    edit_domain_message(req, |m| {
        Lease::new(Duration::from_millis(ttl_ms)).attach(m);
    })
}

/// The request with a budget grant on its message, as a2a-rust's
/// `Budget::attach` writes it: `grant` is the grant's JSON (e.g.
/// `{"remainingMs": 5000, "meters": {"tokens": 100}}`) under
/// `a2a-rust.com/budget`, and the budget extension URI in
/// `Message.extensions`. Panics on a grant a2a-rust would not accept.
pub fn with_budget(
    req: proto::SendMessageRequest,
    grant: serde_json::Value,
) -> proto::SendMessageRequest {
    let budget: Budget =
        serde_json::from_value(grant).unwrap_or_else(|e| panic!("not a budget grant: {e}"));
    budget
        .validate()
        .unwrap_or_else(|e| panic!("budget grant: {e}"));
    edit_domain_message(req, |m| budget.attach(m))
}

/// The request with `key: value` added to its message's `metadata` Struct
/// (other keys kept; `value` converted from JSON to `google.protobuf.Value`
/// as a2a-rust converts it). For metadata no helper above writes, e.g. a
/// malformed grant.
pub fn with_message_metadata(
    mut req: proto::SendMessageRequest,
    key: &str,
    value: serde_json::Value,
) -> proto::SendMessageRequest {
    let entry = proto::convert::json_to_struct(serde_json::json!({ key: value }))
        .unwrap_or_else(|e| panic!("metadata {key}: {e}"));
    let msg = req.message.as_mut().expect("a request with a message");
    msg.metadata
        .get_or_insert_with(Default::default)
        .fields
        .extend(entry.fields);
    req
}

/// The request with `uri` added to its message's `extensions` (once).
pub fn with_message_extension(
    mut req: proto::SendMessageRequest,
    uri: &str,
) -> proto::SendMessageRequest {
    let msg = req.message.as_mut().expect("a request with a message");
    if !msg.extensions.iter().any(|u| u == uri) {
        msg.extensions.push(uri.to_string());
    }
    req
}

/// The task id a stream event names: a `Task`'s id, a status or artifact
/// update's `task_id`, or a `Message`'s `task_id` (None when empty).
pub fn task_id_of(ev: &proto::StreamResponse) -> Option<&str> {
    let id = match ev.payload.as_ref()? {
        Payload::Task(t) => &t.id,
        Payload::StatusUpdate(u) => &u.task_id,
        Payload::ArtifactUpdate(u) => &u.task_id,
        Payload::Message(m) => &m.task_id,
    };
    (!id.is_empty()).then_some(id.as_str())
}

/// The task state a stream event reports (a `Task`'s or a status update's),
/// if any.
pub fn state_of(ev: &proto::StreamResponse) -> Option<proto::TaskState> {
    let status = match ev.payload.as_ref()? {
        Payload::Task(t) => t.status.as_ref()?,
        Payload::StatusUpdate(u) => u.status.as_ref()?,
        _ => return None,
    };
    proto::TaskState::try_from(status.state).ok()
}

/// A task's state (`Unspecified` when it has no status).
pub fn task_state(task: &proto::Task) -> proto::TaskState {
    task.status
        .as_ref()
        .and_then(|s| proto::TaskState::try_from(s.state).ok())
        .unwrap_or(proto::TaskState::Unspecified)
}

/// A gRPC length-prefixed message: flag 0 (uncompressed), the length as a
/// big-endian u32, the bytes. For [`RawCall::send`] when a test writes a
/// body by hand (split across DATA frames, several messages, …).
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(
        &u32::try_from(message.len())
            .expect("message over 4 GiB")
            .to_be_bytes(),
    );
    out.extend_from_slice(message);
    out.freeze()
}

/// Decodes `%XX` escapes in a `grpc-message` value.
fn percent_decode(s: &str) -> String {
    let hex = |c: u8| char::from(c).to_digit(16);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One HTTP/2 connection speaking gRPC by hand (h2c, prior knowledge).
///
/// Open it with [`RawGrpc::connect`], start calls with [`RawGrpc::call`]
/// (several may run at once on it, as streams of the one connection), run
/// unary methods with [`RawGrpc::unary`] / [`RawGrpc::get_task`] /
/// [`RawGrpc::cancel_task`]. Dropping it leaves the connection up while any
/// [`RawCall`] of it lives (h2 closes it once nothing uses it);
/// [`RawGrpc::close`] cuts it at once.
pub struct RawGrpc {
    authority: String,
    send: SendRequest<Bytes>,
    conn: JoinHandle<()>,
    /// `:scheme` of its calls: `http` (h2c), `https` ([`RawGrpc::connect_tls`]).
    scheme: &'static str,
}

impl std::fmt::Debug for RawGrpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawGrpc")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl RawGrpc {
    /// Connects to `addr` and completes the HTTP/2 handshake (the preface
    /// and SETTINGS). Panics when that fails within 10 s (scaled).
    pub async fn connect(addr: &str) -> RawGrpc {
        Self::try_connect(addr)
            .await
            .unwrap_or_else(|e| panic!("gRPC connect {addr}: {e}"))
    }

    /// As [`RawGrpc::connect`], returning why it failed (for a test that
    /// expects a listener to refuse HTTP/2).
    pub async fn try_connect(addr: &str) -> Result<RawGrpc, String> {
        let authority = authority(addr);
        let attempt = async {
            let tcp = TcpStream::connect(&authority)
                .await
                .map_err(|e| format!("tcp: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let (send, conn) = h2::client::handshake(tcp)
                .await
                .map_err(|e| format!("h2 handshake: {e}"))?;
            let conn = tokio::spawn(async move {
                let _ = conn.await;
            });
            // The server's SETTINGS arrive with the first exchange; wait until
            // the connection can take a stream.
            let mut send = send;
            poll_fn(|cx| send.poll_ready(cx))
                .await
                .map_err(|e| format!("h2 ready: {e}"))?;
            Ok::<_, String>(RawGrpc {
                authority: authority.clone(),
                send,
                conn,
                scheme: "http",
            })
        };
        tokio::time::timeout(answer_timeout(), attempt)
            .await
            .map_err(|_| format!("no HTTP/2 connection within {:?}", answer_timeout()))?
    }

    /// Connects to `addr` over TLS offering ALPN `h2` only, trusting just
    /// the CA certificates in the PEM file `ca_pem` (a test's
    /// `PrivateCa::ca_pem`) for the name of `addr`'s IP address, and
    /// completes the HTTP/2 handshake: gRPC over TLS as grpc clients speak
    /// it. Calls carry `:scheme https`. Panics when the TLS handshake fails,
    /// when the server does not select `h2` by ALPN, or when HTTP/2 does not
    /// start within 10 s (scaled).
    pub async fn connect_tls(addr: &str, ca_pem: &std::path::Path) -> RawGrpc {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

        let authority = authority(addr);
        let ip: std::net::IpAddr = authority
            .rsplit_once(':')
            .and_then(|(h, _)| h.trim_matches(['[', ']']).parse().ok())
            .unwrap_or_else(|| panic!("connect_tls wants an ip:port address, not {addr}"));
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_pem)
            .unwrap_or_else(|e| panic!("{}: {e}", ca_pem.display()))
        {
            roots
                .add(cert.unwrap_or_else(|e| panic!("{}: {e}", ca_pem.display())))
                .expect("the CA as a trust anchor");
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let attempt = async {
            let tcp = TcpStream::connect(&authority)
                .await
                .map_err(|e| format!("tcp: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
                .connect(ServerName::IpAddress(ip.into()), tcp)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            if alpn.as_deref() != Some(b"h2".as_slice()) {
                return Err(format!(
                    "the server did not select ALPN h2 (selected {:?})",
                    alpn.map(|a| String::from_utf8_lossy(&a).into_owned())
                ));
            }
            let (send, conn) = h2::client::handshake(tls)
                .await
                .map_err(|e| format!("h2 handshake: {e}"))?;
            let conn = tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut send = send;
            poll_fn(|cx| send.poll_ready(cx))
                .await
                .map_err(|e| format!("h2 ready: {e}"))?;
            Ok::<_, String>(RawGrpc {
                authority: authority.clone(),
                send,
                conn,
                scheme: "https",
            })
        };
        tokio::time::timeout(answer_timeout(), attempt)
            .await
            .unwrap_or_else(|_| {
                panic!("no HTTP/2 over TLS to {addr} within {:?}", answer_timeout())
            })
            .unwrap_or_else(|e| panic!("gRPC over TLS to {addr}: {e}"))
    }

    /// `host:port` this connection goes to.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Starts `method` (a name such as `"SendStreamingMessage"`, or a whole
    /// path starting with `/`) with one `request` message: HEADERS with
    /// `content-type: application/grpc`, `te: trailers`, `a2a-version: 1.0`
    /// and `metadata` (a metadata key equal to one of those replaces it),
    /// then the 5-byte framed message with END_STREAM. Read the answer with
    /// [`RawCall::next_message`] / [`RawCall::finish`].
    pub async fn call(
        &mut self,
        method: &str,
        request: &impl prost::Message,
        metadata: &[(&str, &str)],
    ) -> RawCall {
        let mut call = self.open(method, metadata).await;
        // A server may answer before it read the request (a gateway's
        // refusal, trailers-only) and reset the stream (RFC 9113 §8.1):
        // then the body has nowhere to go, and the answer says the rest.
        if let Err(e) = call.send.send_data(frame(&request.encode_to_vec()), true) {
            call.error = Some(format!("request body not sent: {e}"));
        }
        call
    }

    /// Starts `method` with the usual headers and `metadata` (as
    /// [`RawGrpc::call`]) and no body yet: the request stream stays open for
    /// [`RawCall::send`] (a message split across DATA frames, a malformed
    /// body, a request that never ends).
    pub async fn open(&mut self, method: &str, metadata: &[(&str, &str)]) -> RawCall {
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("a2a-version", "1.0"),
        ];
        for (k, v) in metadata {
            if let Some(slot) = headers.iter_mut().find(|(d, _)| d.eq_ignore_ascii_case(k)) {
                slot.1 = v;
            } else {
                headers.push((k, v));
            }
        }
        self.open_exact(method, &headers).await
    }

    /// Starts `method` with exactly `headers` after the pseudo-headers
    /// (`:method POST`, `:scheme http` (`https` on a connection of
    /// [`RawGrpc::connect_tls`]), `:path`, `:authority`), none of the
    /// defaults: e.g. a call without `a2a-version`, or with another
    /// `content-type`. The request stream stays open for [`RawCall::send`].
    pub async fn open_exact(&mut self, method: &str, headers: &[(&str, &str)]) -> RawCall {
        let path = method_path(method);
        let mut req = Request::builder()
            .method("POST")
            .uri(format!("{}://{}{path}", self.scheme, self.authority));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(())
            .unwrap_or_else(|e| panic!("request {path}: {e}"));
        poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .unwrap_or_else(|e| panic!("h2 connection to {} not ready: {e}", self.authority));
        let (response, send) = self
            .send
            .send_request(req, false)
            .unwrap_or_else(|e| panic!("send {path}: {e}"));
        RawCall {
            path,
            send,
            response: Some(response),
            status: None,
            headers: HeaderMap::new(),
            body: None,
            buf: BytesMut::new(),
            data_done: false,
            trailers: None,
            done: false,
            error: None,
        }
    }

    /// Runs a unary `method`: sends `req`, reads the answer to its end
    /// (10 s, scaled) and decodes its one message as `Resp`. `Err((code,
    /// grpc-message))` when `grpc-status` is not 0 (from trailers or a
    /// Trailers-Only answer). Panics when the call ends without a
    /// `grpc-status` (a reset stream, a dropped connection) or with status 0
    /// and no message.
    pub async fn unary<Req: prost::Message, Resp: prost::Message + Default>(
        &mut self,
        method: &str,
        req: &Req,
        metadata: &[(&str, &str)],
    ) -> Result<Resp, (i32, String)> {
        let call = self.call(method, req, metadata).await;
        let path = call.path.clone();
        let (messages, end) = call.finish_raw(answer_timeout()).await;
        match end.grpc_status() {
            Some(0) => {
                let m = messages
                    .first()
                    .unwrap_or_else(|| panic!("{path}: status 0 but no message ({end:?})"));
                Ok(Resp::decode(m.clone()).unwrap_or_else(|e| panic!("{path}: bad answer: {e}")))
            }
            Some(code) => Err((code, end.grpc_message().unwrap_or_default())),
            None => panic!("{path}: ended without grpc-status ({end:?})"),
        }
    }

    /// `GetTask` of `id` in `tenant` (`""`: none), as a unary call.
    pub async fn get_task(&mut self, tenant: &str, id: &str) -> Result<proto::Task, (i32, String)> {
        let req = proto::GetTaskRequest {
            tenant: tenant.to_string(),
            id: id.to_string(),
            history_length: None,
        };
        self.unary("GetTask", &req, &[]).await
    }

    /// `CancelTask` of `id` in `tenant` (`""`: none), as a unary call: the
    /// task as the server answers it (`TASK_STATE_CANCELED` once canceled).
    pub async fn cancel_task(
        &mut self,
        tenant: &str,
        id: &str,
    ) -> Result<proto::Task, (i32, String)> {
        let req = proto::CancelTaskRequest {
            tenant: tenant.to_string(),
            id: id.to_string(),
            metadata: None,
        };
        self.unary("CancelTask", &req, &[]).await
    }

    /// Drops the TCP connection at once, with no GOAWAY and no RST_STREAM:
    /// the h2 connection task is aborted, which drops the socket (a FIN,
    /// or an RST when unread bytes remain). Every call on it ends for the
    /// peer as a connection error: "the caller vanished". Returns once the
    /// socket is closed.
    pub async fn close(self) {
        self.conn.abort();
        let _ = self.conn.await;
    }
}

/// What ended a call besides its messages: the response head and trailers.
#[derive(Debug, Clone, Default)]
pub struct CallEnd {
    /// The HTTP status of the response head (200 for any gRPC answer), if a
    /// head came.
    pub http_status: Option<u16>,
    /// The response head's headers (holding `grpc-status` in a Trailers-Only
    /// answer).
    pub headers: HeaderMap,
    /// The trailers, when the answer had a body and ended with them.
    pub trailers: Option<HeaderMap>,
    /// Why the stream failed instead of ending (RST_STREAM from the peer, a
    /// connection error), if it did.
    pub error: Option<String>,
}

impl CallEnd {
    /// A header of the trailers, else of the head (Trailers-Only).
    fn get(&self, name: &str) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get(name))
            .or_else(|| self.headers.get(name))
            .and_then(|v| v.to_str().ok())
    }

    /// `grpc-status` from the trailers, or from the head of a Trailers-Only
    /// answer; None when the call ended without one.
    pub fn grpc_status(&self) -> Option<i32> {
        self.get("grpc-status").map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("grpc-status {s:?}"))
        })
    }

    /// `grpc-message`, percent-decoded, where `grpc-status` is.
    pub fn grpc_message(&self) -> Option<String> {
        self.get("grpc-message").map(percent_decode)
    }
}

/// One gRPC call (an HTTP/2 stream) of a [`RawGrpc`].
///
/// Read it with [`RawCall::next_message`] (one message at a time, DATA
/// buffered across frames: a message may span frames and a frame hold
/// several) and [`RawCall::finish`] (to the end, trailers included). End it
/// early with [`RawCall::reset`]. Dropping it unfinished also makes h2 send
/// RST_STREAM CANCEL, but a test that means to leave should say so with
/// `reset`.
pub struct RawCall {
    path: String,
    send: SendStream<Bytes>,
    response: Option<ResponseFuture>,
    status: Option<u16>,
    headers: HeaderMap,
    body: Option<RecvStream>,
    buf: BytesMut,
    data_done: bool,
    trailers: Option<HeaderMap>,
    done: bool,
    error: Option<String>,
}

impl std::fmt::Debug for RawCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawCall")
            .field("path", &self.path)
            .field("status", &self.status)
            .field("done", &self.done)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// Takes one whole length-prefixed message off the front of `buf`.
fn take_message(buf: &mut BytesMut) -> Option<Bytes> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    assert_eq!(buf[0], 0, "a compressed gRPC message (flag {})", buf[0]);
    buf.advance(5);
    Some(buf.split_to(len).freeze())
}

impl RawCall {
    /// The call's path (`/lf.a2a.v1.A2AService/<Method>`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Sends `data` on the request stream as it is (no framing; see
    /// [`frame`]), ending the request when `end`. Panics when the stream
    /// is already closed for sending.
    pub fn send(&mut self, data: Bytes, end: bool) {
        self.send
            .send_data(data, end)
            .unwrap_or_else(|e| panic!("{}: send: {e}", self.path));
    }

    /// Waits (until `deadline`) for the response head; false on timeout.
    async fn read_head(&mut self, deadline: Instant) -> bool {
        let Some(response) = self.response.as_mut() else {
            return true;
        };
        match tokio::time::timeout_at(deadline, response).await {
            Err(_) => return false,
            Ok(Err(e)) => {
                self.error = Some(format!("no response head: {e}"));
                self.done = true;
            }
            Ok(Ok(resp)) => {
                let (parts, body) = resp.into_parts();
                self.status = Some(parts.status.as_u16());
                self.headers = parts.headers;
                if body.is_end_stream() {
                    // Trailers-Only: grpc-status is in the head.
                    self.data_done = true;
                    self.done = true;
                } else {
                    self.body = Some(body);
                }
            }
        }
        self.response = None;
        true
    }

    /// The next whole message's bytes (its 5-byte prefix removed), reading
    /// DATA frames until one is complete, the stream ends, or `within`
    /// passes (None in the last two cases; the call stays readable after a
    /// timeout).
    pub async fn next_raw(&mut self, within: Duration) -> Option<Bytes> {
        let deadline = Instant::now() + within;
        if !self.read_head(deadline).await {
            return None;
        }
        loop {
            if let Some(m) = take_message(&mut self.buf) {
                return Some(m);
            }
            if self.done {
                return None;
            }
            let body = self.body.as_mut().expect("a body until done");
            if !self.data_done {
                match tokio::time::timeout_at(deadline, body.data()).await {
                    Err(_) => return None,
                    Ok(Some(Ok(chunk))) => {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        self.buf.extend_from_slice(&chunk);
                    }
                    Ok(Some(Err(e))) => {
                        self.error = Some(format!("stream failed: {e}"));
                        self.done = true;
                    }
                    Ok(None) => self.data_done = true,
                }
                continue;
            }
            match tokio::time::timeout_at(deadline, body.trailers()).await {
                Err(_) => return None,
                Ok(Ok(t)) => self.trailers = t,
                Ok(Err(e)) => self.error = Some(format!("no trailers: {e}")),
            }
            self.done = true;
        }
    }

    /// The next message decoded as a `StreamResponse` (a stream's event), or
    /// None when the stream ended or `within` passed first. Panics on a
    /// message that does not decode.
    pub async fn next_message(&mut self, within: Duration) -> Option<proto::StreamResponse> {
        let m = self.next_raw(within).await?;
        Some(
            proto::StreamResponse::decode(m)
                .unwrap_or_else(|e| panic!("{}: not a StreamResponse: {e}", self.path)),
        )
    }

    /// Whether the call has ended (trailers read, a Trailers-Only answer, or
    /// a failure) and every whole message was taken.
    pub fn is_done(&self) -> bool {
        self.done && take_message(&mut self.buf.clone()).is_none()
    }

    /// Reads everything still to come, to the end of the stream within
    /// `within`: the raw messages and how the call ended. Panics if it does
    /// not end in time.
    pub async fn finish_raw(mut self, within: Duration) -> (Vec<Bytes>, CallEnd) {
        let deadline = Instant::now() + within;
        let mut messages = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_raw(left).await {
                Some(m) => messages.push(m),
                None if self.done => break,
                None => panic!(
                    "{}: did not end within {within:?} ({} messages read)",
                    self.path,
                    messages.len()
                ),
            }
        }
        let end = CallEnd {
            http_status: self.status,
            headers: std::mem::take(&mut self.headers),
            trailers: self.trailers.take(),
            error: self.error.take(),
        };
        (messages, end)
    }

    /// Reads the rest of a stream to its end within `within` (panics if it
    /// does not end): the events still to come, the `grpc-status` (from the
    /// trailers, or from the head of a Trailers-Only answer; None when the
    /// stream was reset or the connection dropped), and the head and
    /// trailers themselves.
    pub async fn finish(
        self,
        within: Duration,
    ) -> (Vec<proto::StreamResponse>, Option<i32>, CallEnd) {
        let path = self.path.clone();
        let (raw, end) = self.finish_raw(within).await;
        let events = raw
            .into_iter()
            .map(|m| {
                proto::StreamResponse::decode(m)
                    .unwrap_or_else(|e| panic!("{path}: not a StreamResponse: {e}"))
            })
            .collect();
        let status = end.grpc_status();
        (events, status, end)
    }

    /// Leaves the call: sends RST_STREAM with CANCEL on this stream (what
    /// grpc clients send when a call is cancelled). The connection stays
    /// open for other calls. Waits briefly so the frame is on the wire
    /// before returning.
    pub async fn reset(mut self) {
        self.send.send_reset(Reason::CANCEL);
        // The connection task writes the frame; give it a turn.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Opens `SendStreamingMessage` at `url_or_addr` (a worker's `grpc_url` or a
/// gateway) on a new connection, with [`send_request`]`(text, tenant)`, and
/// reads events until one reports the task `TASK_STATE_WORKING` (10 s,
/// scaled). Returns the connection, the open call and the task id. Panics
/// if the stream ends or fails first.
pub async fn start_streaming(
    url_or_addr: &str,
    text: &str,
    tenant: &str,
) -> (RawGrpc, RawCall, String) {
    start_streaming_request(url_or_addr, &send_request(text, tenant), &[]).await
}

/// As [`start_streaming`] with a request of the test's own (a lease grant,
/// metadata) and call metadata (`a2a-extensions`, `authorization`, …).
pub async fn start_streaming_request(
    url_or_addr: &str,
    req: &proto::SendMessageRequest,
    metadata: &[(&str, &str)],
) -> (RawGrpc, RawCall, String) {
    let mut conn = RawGrpc::connect(url_or_addr).await;
    let call = conn.call("SendStreamingMessage", req, metadata).await;
    let (call, id) = until_working(call, url_or_addr).await;
    (conn, call, id)
}

/// As [`start_streaming_request`] on a connection the test already holds
/// (a TLS one from [`RawGrpc::connect_tls`], or one that carries other
/// calls): starts `SendStreamingMessage` with `req` and `metadata` and reads
/// events until one reports the task `TASK_STATE_WORKING` (10 s, scaled).
/// Returns the open call and the task id; panics if the stream ends or
/// fails first.
pub async fn start_streaming_on(
    conn: &mut RawGrpc,
    req: &proto::SendMessageRequest,
    metadata: &[(&str, &str)],
) -> (RawCall, String) {
    let call = conn.call("SendStreamingMessage", req, metadata).await;
    let where_ = conn.authority().to_string();
    until_working(call, &where_).await
}

/// Opens `SubscribeToTask` of `id` in `tenant` (`""`: none) on `conn` with
/// `metadata`, and reads events until one names the task (10 s, scaled):
/// the open call and that first event. Panics if the stream ends first.
pub async fn subscribe_on(
    conn: &mut RawGrpc,
    tenant: &str,
    id: &str,
    metadata: &[(&str, &str)],
) -> (RawCall, proto::StreamResponse) {
    let req = proto::SubscribeToTaskRequest {
        tenant: tenant.to_string(),
        id: id.to_string(),
    };
    let mut call = conn.call("SubscribeToTask", &req, metadata).await;
    let deadline = Instant::now() + answer_timeout();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match call.next_message(left).await {
            Some(ev) if task_id_of(&ev) == Some(id) => return (call, ev),
            Some(_) => {}
            None => {
                let path = call.path().to_string();
                let (_, status, end) = call.finish(super::scaled_secs(1)).await;
                panic!("{path} of {id}: no event named the task (grpc-status {status:?}, {end:?})");
            }
        }
    }
}

/// Reads `call` until an event reports WORKING with a task id known.
async fn until_working(mut call: RawCall, where_: &str) -> (RawCall, String) {
    let deadline = Instant::now() + answer_timeout();
    let mut id: Option<String> = None;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(ev) = call.next_message(left).await else {
            if !call.is_done() {
                panic!(
                    "{where_}: no WORKING within {:?}; events: {seen:?}",
                    answer_timeout()
                );
            }
            let (_, status, end) = call.finish(super::scaled_secs(1)).await;
            panic!(
                "{where_}: the stream ended before WORKING (grpc-status {status:?}, \
                 {end:?}); events: {seen:?}"
            );
        };
        if id.is_none() {
            id = task_id_of(&ev).map(str::to_string);
        }
        let working = state_of(&ev) == Some(proto::TaskState::Working);
        seen.push(ev);
        if working {
            if let Some(id) = id {
                return (call, id);
            }
        }
    }
}
