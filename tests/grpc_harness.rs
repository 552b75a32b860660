//! Self-tests of `harness::grpc` and of the workers' gRPC binding, with no
//! gateway in between: both workers are called directly over gRPC, so the
//! gateway's gRPC tests can trust the toolkit and the peers.
//!
//! What they establish (each checked below, on the a2a-rust 0.15 worker and
//! the Python `a2a-sdk` 1.3.0 worker):
//!
//! * `SendStreamingMessage` streams `Task(SUBMITTED)`, then `WORKING`
//!   updates; a unary `CancelTask` (with a tenant or none) answers the task
//!   `TASK_STATE_CANCELED`, runs the executor's cancel hook once, and the
//!   open stream ends with a CANCELED update and `grpc-status: 0` in
//!   trailers. GetTask over gRPC and over the worker's HTTP side (JSON-RPC)
//!   then report CANCELED: one task store behind both. A task made under a
//!   tenant is found only with that tenant, on both sides.
//! * `quick` ends the stream COMPLETED with `grpc-status: 0` in trailers
//!   (a head, DATA, then trailers: not Trailers-Only).
//! * `a2a-version` metadata: a2a-rust refuses a call without it with
//!   FAILED_PRECONDITION (9) in a Trailers-Only answer, before the handler
//!   runs; the Python SDK does not check it (the same GetTask gets
//!   NOT_FOUND, 5).
//! * An event larger than one DATA frame (`ask:40000`) arrives whole
//!   (the toolkit buffers a message across frames), and a request written
//!   in pieces is read whole by both servers.
//! * a2a-rust's own client (`build_grpc`) streams from both workers, and
//!   its `a2a-extensions` metadata is recorded on both (the interceptor on
//!   Rust, the context builder into `/_test/stats` on Python).
//! * [`with_lease`](crate::harness::grpc::with_lease) writes a grant
//!   a2a-rust honours over gRPC: unrenewed, the task ends CANCELED after its
//!   TTL (a lease stop, not a CancelTask).
//!
//! # What "the caller left" does to a task on each worker
//!
//! Checked by `*_reset_leaves_the_task_running` and
//! `*_closed_connection_leaves_the_task_running`: **on neither worker does a
//! caller's RST_STREAM(CANCEL), nor a dropped TCP connection, stop the
//! task.** The task stays WORKING (checked 700 ms after the caller left)
//! and later reaches COMPLETED on its own, and the executor's cancel hook
//! never runs, as after an SSE disconnect. So when a gRPC caller leaves
//! through a gateway, cancelling the task is entirely the gateway's job (its
//! cascade). `reset_and_close_are_what_the_server_sees` checks, against a
//! bare h2 server, that the toolkit's reset is one RST_STREAM(CANCEL) and
//! its close sends neither GOAWAY nor RST_STREAM.

use std::time::Duration;

use a2a_protocol_types::proto::{self, TaskState};

use crate::harness::grpc::{
    self, code, frame, send_request, start_streaming, state_of, task_id_of, task_state, RawGrpc,
};
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::scenarios;
use crate::harness::worker::{Kind, Worker};
use crate::harness::{scaled_ms, scaled_secs};

const CANCELED: &str = "TASK_STATE_CANCELED";
const COMPLETED: &str = "TASK_STATE_COMPLETED";
const WORKING: &str = "TASK_STATE_WORKING";

/// The state the last state-bearing event reports.
fn last_state(events: &[proto::StreamResponse]) -> Option<TaskState> {
    events.iter().rev().find_map(state_of)
}

// ── Stream, cancel, read back ───────────────────────────────────────────────

/// A `work:60000` stream reaches WORKING; a unary CancelTask (on a second
/// connection) cancels it; the stream ends CANCELED with status 0; GetTask
/// over gRPC and HTTP agree; the cancel hook ran once.
async fn stream_then_cancel(kind: Kind, tenant: &str) {
    let w = Worker::start_with_grpc(kind).await;
    let cancels_before = w.cancels().await;
    let (_conn, call, id) = start_streaming(&w.grpc_url(), "work:60000", tenant).await;
    let http_tenant = (!tenant.is_empty()).then_some(tenant);
    assert_eq!(
        w.state(http_tenant, &id).await.as_deref(),
        Some(WORKING),
        "the HTTP side sees the gRPC task"
    );

    let mut other = RawGrpc::connect(&w.grpc_url()).await;
    let task = other
        .cancel_task(tenant, &id)
        .await
        .unwrap_or_else(|e| panic!("CancelTask: {e:?}"));
    assert_eq!(task.id, id);
    assert_eq!(task_state(&task), TaskState::Canceled);

    let (events, status, end) = call.finish(scaled_secs(5)).await;
    assert_eq!(last_state(&events), Some(TaskState::Canceled), "{events:?}");
    assert_eq!(status, Some(code::OK), "{end:?}");
    assert!(end.trailers.is_some(), "status in trailers: {end:?}");

    let got = other
        .get_task(tenant, &id)
        .await
        .unwrap_or_else(|e| panic!("GetTask: {e:?}"));
    assert_eq!(task_state(&got), TaskState::Canceled);
    assert_eq!(w.state(http_tenant, &id).await.as_deref(), Some(CANCELED));
    assert_eq!(w.cancels().await, cancels_before + 1, "one cancel-hook run");

    if !tenant.is_empty() {
        // Tenant isolation holds on both sides of the one store.
        assert_eq!(w.state(None, &id).await, None, "found without its tenant");
        assert_eq!(
            w.state(Some("other"), &id).await,
            None,
            "found in another tenant"
        );
        let miss = other.get_task("", &id).await.map(|t| task_state(&t));
        assert_eq!(miss.map_err(|e| e.0), Err(code::NOT_FOUND));
    }
}

/// `quick` ends COMPLETED, `grpc-status: 0` in trailers after DATA.
async fn quick_completes(kind: Kind) {
    let w = Worker::start_with_grpc(kind).await;
    let mut conn = RawGrpc::connect(&w.grpc_url()).await;
    let call = conn
        .call("SendStreamingMessage", &send_request("quick", ""), &[])
        .await;
    let (events, status, end) = call.finish(scaled_secs(5)).await;
    assert_eq!(end.http_status, Some(200));
    assert_eq!(
        end.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/grpc")
    );
    assert!(
        end.headers.get("grpc-status").is_none(),
        "not Trailers-Only: {end:?}"
    );
    assert_eq!(status, Some(code::OK), "{end:?}");
    assert!(end.trailers.is_some());
    let first = events.first().expect("events");
    assert!(
        matches!(
            first.payload,
            Some(proto::stream_response::Payload::Task(_))
        ),
        "the first event is the Task: {first:?}"
    );
    assert_eq!(state_of(first), Some(TaskState::Submitted));
    assert_eq!(last_state(&events), Some(TaskState::Completed));
    let id = task_id_of(first).expect("task id").to_string();
    assert_eq!(w.state(None, &id).await.as_deref(), Some(COMPLETED));

    // Unary SendMessage: the task, completed.
    let resp: proto::SendMessageResponse = conn
        .unary("SendMessage", &send_request("quick", ""), &[])
        .await
        .unwrap_or_else(|e| panic!("SendMessage: {e:?}"));
    match resp.payload {
        Some(proto::send_message_response::Payload::Task(t)) => {
            assert_eq!(task_state(&t), TaskState::Completed)
        }
        other => panic!("SendMessage answered {other:?}"),
    }
}

/// An event larger than a DATA frame (16 KiB by default) arrives whole, and
/// a request sent in three pieces is read whole.
async fn big_event_and_split_request(kind: Kind) {
    let w = Worker::start_with_grpc(kind).await;
    let mut conn = RawGrpc::connect(&w.grpc_url()).await;
    let call = conn
        .call("SendStreamingMessage", &send_request("ask:40000", ""), &[])
        .await;
    let (events, status, end) = call.finish(scaled_secs(5)).await;
    assert_eq!(status, Some(code::OK), "{end:?}");
    let last = events.last().expect("events");
    assert_eq!(state_of(last), Some(TaskState::InputRequired));
    let Some(proto::stream_response::Payload::StatusUpdate(u)) = &last.payload else {
        panic!("last event: {last:?}")
    };
    let question = u
        .status
        .as_ref()
        .and_then(|s| s.message.as_ref())
        .expect("question");
    let Some(proto::part::Content::Text(text)) = &question.parts[0].content else {
        panic!("question: {question:?}")
    };
    assert!(text.len() >= 40000, "{} bytes", text.len());

    let body = frame(&prost::Message::encode_to_vec(&send_request("quick", "")));
    let mut call = conn.open("SendStreamingMessage", &[]).await;
    call.send(body.slice(..3), false);
    tokio::time::sleep(scaled_ms(50)).await;
    call.send(body.slice(3..20), false);
    tokio::time::sleep(scaled_ms(50)).await;
    call.send(body.slice(20..), true);
    let (events, status, end) = call.finish(scaled_secs(5)).await;
    assert_eq!(status, Some(code::OK), "{end:?}");
    assert_eq!(last_state(&events), Some(TaskState::Completed));
}

// ── The caller leaves ───────────────────────────────────────────────────────

/// How a caller leaves a stream.
#[derive(Clone, Copy, Debug)]
enum Leave {
    /// RST_STREAM(CANCEL) on the stream; the connection stays.
    Reset,
    /// The TCP connection dropped, no GOAWAY.
    Close,
}

/// The task runs on after the caller left (see the module doc): still
/// WORKING a while later, then COMPLETED on its own, no cancel-hook run.
async fn leaving_leaves_the_task_running(kind: Kind, leave: Leave) {
    let w = Worker::start_with_grpc(kind).await;
    let cancels_before = w.cancels().await;
    // The task must outlast the look after the caller left, at any time
    // factor, and end soon after it.
    let look_after = scaled_ms(700);
    let work = look_after + Duration::from_millis(1800);
    let text = format!("work:{}", work.as_millis());
    let (conn, call, id) = start_streaming(&w.grpc_url(), &text, "").await;
    let left_at = tokio::time::Instant::now();
    match leave {
        Leave::Reset => {
            call.reset().await;
            // The connection is still usable after the reset.
            let mut conn = conn;
            let t = conn
                .get_task("", &id)
                .await
                .expect("GetTask on the same connection");
            assert_eq!(task_state(&t), TaskState::Working);
        }
        Leave::Close => {
            conn.close().await;
            drop(call);
        }
    }
    tokio::time::sleep(look_after.saturating_sub(left_at.elapsed())).await;
    assert_eq!(
        w.state(None, &id).await.as_deref(),
        Some(WORKING),
        "{kind:?} {leave:?}: the task stopped when its caller left"
    );
    w.wait_state(
        None,
        &id,
        COMPLETED,
        work.saturating_sub(left_at.elapsed()) + scaled_secs(3),
    )
    .await
    .unwrap_or_else(|s| panic!("{kind:?} {leave:?}: not COMPLETED ({s:?})"));
    assert_eq!(w.cancels().await, cancels_before, "no cancel-hook run");
}

// ── a2a-version ─────────────────────────────────────────────────────────────

/// a2a-rust refuses a call without `a2a-version` metadata (Trailers-Only
/// FAILED_PRECONDITION) before the handler; the Python SDK serves it.
#[tokio::test]
async fn rust_worker_requires_a2a_version_python_does_not() {
    let rust = Worker::start_with_grpc(Kind::Rust).await;
    let python = Worker::start_with_grpc(Kind::Python).await;
    let req = proto::GetTaskRequest {
        tenant: String::new(),
        id: "no-such-task".into(),
        history_length: None,
    };
    let bare = [("content-type", "application/grpc"), ("te", "trailers")];
    for (w, want) in [
        (&rust, code::FAILED_PRECONDITION),
        (&python, code::NOT_FOUND),
    ] {
        let mut conn = RawGrpc::connect(&w.grpc_url()).await;
        let mut call = conn.open_exact("GetTask", &bare).await;
        call.send(frame(&prost::Message::encode_to_vec(&req)), true);
        let (events, status, end) = call.finish(scaled_secs(5)).await;
        assert!(events.is_empty());
        assert_eq!(status, Some(want), "{}: {end:?}", w.grpc_url());
        assert!(
            end.headers.get("grpc-status").is_some() && end.trailers.is_none(),
            "an error is Trailers-Only: {end:?}"
        );
        // With the version (the toolkit's default) both say NOT_FOUND.
        let with = conn.get_task("", "no-such-task").await;
        assert_eq!(with.map(|_| ()).map_err(|e| e.0), Err(code::NOT_FOUND));
    }
    let Worker::Rust(r) = &rust else {
        unreachable!()
    };
    assert_eq!(r.executions(), 0);
    let mut conn = RawGrpc::connect(&rust.grpc_url()).await;
    let mut call = conn.open_exact("SendStreamingMessage", &bare).await;
    call.send(
        frame(&prost::Message::encode_to_vec(&send_request("quick", ""))),
        true,
    );
    let (events, status, end) = call.finish(scaled_secs(5)).await;
    assert_eq!(status, Some(code::FAILED_PRECONDITION), "{end:?}");
    let msg = end.grpc_message().unwrap_or_default();
    assert!(!msg.is_empty(), "a reason: {end:?}");
    assert!(events.is_empty());
    assert_eq!(r.tasks_started(), 0, "refused before the executor");
}

// ── a2a-rust's client over gRPC ─────────────────────────────────────────────

/// `client()` (build_grpc) streams from the worker, with a tenant, and its
/// `a2a-extensions` metadata is recorded.
async fn sdk_client_streams(kind: Kind) {
    use a2a_protocol_types::events::StreamResponse;
    use a2a_protocol_types::message::{Message, MessageRole, Part};
    use a2a_protocol_types::params::MessageSendParams;
    use a2a_protocol_types::task::TaskState as DomainState;

    const EXT: &str = "urn:a2a-gateway:test:grpc-ext";
    let w = Worker::start_with_grpc(kind).await;
    let client = grpc::client(&w.grpc_url(), Some("acme"), &[EXT]).await;
    let msg = Message::new(
        format!("sdk-{}", std::process::id()),
        MessageRole::User,
        vec![Part::text("work:300")],
    );
    let mut stream = client
        .stream_message(MessageSendParams::new(msg))
        .await
        .expect("stream over gRPC");
    let (mut id, mut states) = (None, Vec::new());
    while let Some(ev) = tokio::time::timeout(scaled_secs(5), stream.next())
        .await
        .expect("an event in time")
    {
        match ev.expect("event") {
            StreamResponse::Task(t) => {
                id.get_or_insert(t.id.to_string());
                states.push(t.status.state);
            }
            StreamResponse::StatusUpdate(u) => {
                id.get_or_insert(u.task_id.to_string());
                states.push(u.status.state);
            }
            _ => {}
        }
    }
    assert_eq!(states.first(), Some(&DomainState::Submitted), "{states:?}");
    assert!(states.contains(&DomainState::Working), "{states:?}");
    assert_eq!(states.last(), Some(&DomainState::Completed), "{states:?}");
    let id = id.expect("a task id");
    assert_eq!(w.state(Some("acme"), &id).await.as_deref(), Some(COMPLETED));
    assert_eq!(w.state(None, &id).await, None, "made under tenant acme");
    match &w {
        Worker::Rust(r) => assert!(
            r.extension_calls()
                .iter()
                .any(|(m, v)| m == "SendStreamingMessage" && v == EXT),
            "{:?}",
            r.extension_calls()
        ),
        Worker::Python(p) => {
            let seen = p.stats().await["extensions_seen"].clone();
            assert!(seen.as_array().unwrap().iter().any(|v| v == EXT), "{seen}");
        }
    }
}

// ── Leases ──────────────────────────────────────────────────────────────────

/// `with_lease` writes what a2a-rust reads: an unrenewed 1 s grant stops the
/// task CANCELED about 1 s later (a lease stop, no CancelTask).
#[tokio::test]
async fn rust_worker_honours_a_lease_sent_over_grpc() {
    let w = RustWorker::start_with_grpc(RustWorkerOptions {
        lease_store: true,
        ..RustWorkerOptions::default()
    })
    .await;
    let req = grpc::with_lease(send_request("work:30000", ""), 1000);
    let msg = req.message.as_ref().unwrap();
    assert_eq!(
        msg.extensions,
        vec![a2a_protocol_types::lease::LEASE_EXTENSION_URI.to_string()]
    );
    let grant =
        &msg.metadata.as_ref().unwrap().fields[a2a_protocol_types::lease::LEASE_METADATA_KEY];
    assert_eq!(
        proto::convert::struct_to_json(proto::prost_types::Struct {
            fields: [("g".to_string(), grant.clone())].into_iter().collect()
        })
        .unwrap()["g"],
        serde_json::json!({"ttlMs": 1000})
    );
    let (_conn, call, id) = grpc::start_streaming_request(&w.grpc_url(), &req, &[]).await;
    let started = tokio::time::Instant::now();
    let (events, status, end) = call
        .finish(Duration::from_millis(1000) + scaled_secs(3))
        .await;
    assert_eq!(last_state(&events), Some(TaskState::Canceled), "{events:?}");
    assert_eq!(status, Some(code::OK), "{end:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1000) + scaled_ms(1500),
        "lapsed after {:?}",
        started.elapsed()
    );
    assert_eq!(w.state(None, &id).await.as_deref(), Some(CANCELED));
    assert_eq!((w.lease_stops(), w.cancels()), (1, 0));
}

// ── The card ────────────────────────────────────────────────────────────────

/// With gRPC on, each worker's card lists a `GRPC` interface at its
/// `grpc_url`, after the HTTP ones.
#[tokio::test]
async fn cards_declare_the_grpc_interface() {
    for kind in [Kind::Rust, Kind::Python] {
        let w = Worker::start_with_grpc(kind).await;
        let card = crate::harness::http::request(
            "GET",
            &w.url(),
            "/.well-known/agent-card.json",
            &[],
            b"",
        )
        .await
        .json();
        let ifaces = card["supportedInterfaces"].as_array().unwrap();
        let last = ifaces.last().unwrap();
        assert_eq!(last["protocolBinding"], "GRPC", "{kind:?}: {card}");
        assert_eq!(last["url"], w.grpc_url().as_str(), "{kind:?}");
        assert_eq!(ifaces[0]["url"], w.url().as_str(), "{kind:?}");
    }
}

scenarios! {
    rust_stream_then_cancel => stream_then_cancel(Kind::Rust, "");
    rust_stream_then_cancel_in_tenant => stream_then_cancel(Kind::Rust, "acme");
    python_stream_then_cancel => stream_then_cancel(Kind::Python, "");
    python_stream_then_cancel_in_tenant => stream_then_cancel(Kind::Python, "acme");
    rust_quick_completes_with_status_0 => quick_completes(Kind::Rust);
    python_quick_completes_with_status_0 => quick_completes(Kind::Python);
    rust_big_event_and_split_request => big_event_and_split_request(Kind::Rust);
    python_big_event_and_split_request => big_event_and_split_request(Kind::Python);
    rust_reset_leaves_the_task_running => leaving_leaves_the_task_running(Kind::Rust, Leave::Reset);
    python_reset_leaves_the_task_running => leaving_leaves_the_task_running(Kind::Python, Leave::Reset);
    rust_closed_connection_leaves_the_task_running => leaving_leaves_the_task_running(Kind::Rust, Leave::Close);
    python_closed_connection_leaves_the_task_running => leaving_leaves_the_task_running(Kind::Python, Leave::Close);
    rust_sdk_client_streams => sdk_client_streams(Kind::Rust);
    python_sdk_client_streams => sdk_client_streams(Kind::Python);
}

// ── The toolkit's ways of leaving, seen by an h2 server ─────────────────────

/// A socket that keeps a copy of every byte read from it (the client's
/// side of the conversation, for counting its frames).
struct Tap {
    inner: tokio::net::TcpStream,
    read: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl tokio::io::AsyncRead for Tap {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let fresh = buf.filled()[before..].to_vec();
        self.read.lock().unwrap().extend_from_slice(&fresh);
        r
    }
}

impl tokio::io::AsyncWrite for Tap {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The frames in what a client sent (after the 24-byte preface):
/// `(type, stream id, payload)`.
fn h2_frames(bytes: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
    let mut rest = bytes.get(24..).unwrap_or_default();
    let mut out = Vec::new();
    while rest.len() >= 9 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let ty = rest[3];
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
        let Some(payload) = rest.get(9..9 + len) else {
            break;
        };
        out.push((ty, stream, payload.to_vec()));
        rest = &rest[9 + len..];
    }
    out
}

const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;

/// What a [`leaving_probe`] saw: its reports (how each stream and the
/// connection ended, as h2 tells a server) and the client's raw bytes.
struct Probe {
    addr: String,
    reports: tokio::sync::mpsc::UnboundedReceiver<String>,
    client_bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Probe {
    /// The next report (5 s, scaled).
    async fn report(&mut self) -> String {
        tokio::time::timeout(scaled_secs(5), self.reports.recv())
            .await
            .expect("the probe reports in time")
            .expect("probe alive")
    }

    /// The client's frames of `ty` so far: `(stream id, payload)`.
    fn frames_of(&self, ty: u8) -> Vec<(u32, Vec<u8>)> {
        h2_frames(&self.client_bytes.lock().unwrap())
            .into_iter()
            .filter(|f| f.0 == ty)
            .map(|f| (f.1, f.2))
            .collect()
    }
}

/// A bare h2c server for one connection: answers every stream with a head
/// and one framed `StreamResponse` (WORKING), then holds it open.
async fn leaving_probe() -> Probe {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, reports) = tokio::sync::mpsc::unbounded_channel();
    let client_bytes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let read = client_bytes.clone();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tap = Tap { inner: tcp, read };
        let mut conn = h2::server::handshake(tap)
            .await
            .expect("h2 server handshake");
        loop {
            let (req, mut respond) = match conn.accept().await {
                None => {
                    let _ = tx.send("conn: ended".to_string());
                    break;
                }
                Some(Err(e)) => {
                    let _ = tx.send(format!("conn: {e}"));
                    break;
                }
                Some(Ok(s)) => s,
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let path = req.uri().path().to_string();
                let mut body = req.into_body();
                while let Some(Ok(_)) = body.data().await {}
                let head = http::Response::builder()
                    .status(200)
                    .header("content-type", "application/grpc")
                    .body(())
                    .unwrap();
                let mut send = respond.send_response(head, false).unwrap();
                let ev = proto::StreamResponse {
                    payload: Some(proto::stream_response::Payload::StatusUpdate(
                        proto::TaskStatusUpdateEvent {
                            task_id: "T".into(),
                            context_id: "C".into(),
                            status: Some(proto::TaskStatus {
                                state: TaskState::Working as i32,
                                ..Default::default()
                            }),
                            metadata: None,
                        },
                    )),
                };
                send.send_data(frame(&prost::Message::encode_to_vec(&ev)), false)
                    .unwrap();
                let end = std::future::poll_fn(|cx| send.poll_reset(cx)).await;
                let _ = tx.send(match end {
                    Ok(reason) => format!("{path}: reset {reason:?}"),
                    Err(e) => format!("{path}: io error {}", e.is_io()),
                });
            });
        }
    });
    Probe {
        addr,
        reports,
        client_bytes,
    }
}

/// `RawCall::reset` sends one RST_STREAM(CANCEL) on its stream and the
/// connection carries on; `RawGrpc::close` cuts the connection with no
/// GOAWAY and no RST_STREAM: the server's open stream fails with an I/O
/// error.
#[tokio::test]
async fn reset_and_close_are_what_the_server_sees() {
    let mut probe = leaving_probe().await;
    let mut conn = RawGrpc::connect(&probe.addr).await;
    let mut a = conn
        .call("SendStreamingMessage", &send_request("x", ""), &[])
        .await;
    let ev = a.next_message(scaled_secs(5)).await.expect("an event");
    assert_eq!(state_of(&ev), Some(TaskState::Working));
    a.reset().await;
    assert_eq!(
        probe.report().await,
        "/lf.a2a.v1.A2AService/SendStreamingMessage: reset CANCEL"
    );
    // RST_STREAM on stream 1, error code 8 (CANCEL).
    assert_eq!(probe.frames_of(RST_STREAM), vec![(1, vec![0, 0, 0, 8])]);

    // The same connection takes another call.
    let mut b = conn
        .call(
            "SubscribeToTask",
            &proto::SubscribeToTaskRequest::default(),
            &[],
        )
        .await;
    assert!(b.next_message(scaled_secs(5)).await.is_some());
    conn.close().await;
    let mut reports = vec![probe.report().await, probe.report().await];
    reports.sort();
    assert_eq!(
        reports,
        [
            "/lf.a2a.v1.A2AService/SubscribeToTask: io error true",
            "conn: ended"
        ]
    );
    assert_eq!(probe.frames_of(GOAWAY), vec![], "close sends no GOAWAY");
    assert_eq!(probe.frames_of(RST_STREAM).len(), 1, "nor a RST_STREAM");
    assert_eq!(b.next_message(scaled_secs(1)).await, None);
    assert!(b.is_done());
}
