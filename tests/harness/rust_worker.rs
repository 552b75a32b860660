//! A real A2A agent on the published a2a-rust 0.15 crates, served in-process.
//!
//! [`RustWorker::start`] binds `127.0.0.1:0`, builds a `RequestHandler` whose
//! agent card points at that port, and serves it with `CombinedDispatcher`
//! (JSON-RPC at `POST /`, HTTP+JSON at every other path, `/{tenant}/…` too).
//! With `websocket` a `WebSocketDispatcher` gets a listener of its own.
//!
//! [`RustWorker::start_with_grpc`] also serves the same handler (same
//! executor, counters, task store, interceptor) over the A2A gRPC binding
//! (`lf.a2a.v1.A2AService`) on a listener of its own, [`RustWorker::grpc_url`]
//! (`http://127.0.0.1:PORT`, plaintext: h2c with prior knowledge; the port
//! also answers `GET /.well-known/agent-card.json` over HTTP/1.1), with
//! `GrpcDispatcher::new(handler, GrpcConfig::default())`, and its card lists
//! `AgentInterface::grpc(url)` last. Not in the other constructors, so that
//! every other test's card stays as it was. What a gRPC caller should know:
//!
//! * `GrpcConfig::default()` keeps `require_version_header: true`: a call
//!   without `a2a-version` metadata is refused with FAILED_PRECONDITION (9)
//!   before the handler (`tests/grpc_harness.rs` checks it). The Python SDK
//!   does not check it. `crate::harness::grpc` always sends `a2a-version: 1.0`.
//! * The tenant is the request's `tenant` field (1), which reaches the
//!   handler as the HTTP bindings' `params.tenant`: the tenant-aware store
//!   isolates a task made over gRPC under `acme` exactly as one made over
//!   HTTP, and the two sides see each other's tasks (same store).
//! * All metadata reaches the interceptor as the HTTP headers do, so
//!   `upgrade_extensions`/`extension_calls` also record gRPC calls'
//!   `a2a-extensions` (with the gRPC method name, e.g. `"GetTask"`).
//! * A caller's RST_STREAM (or a dropped connection) on a stream does not
//!   stop the task: it runs on as after an SSE disconnect (checked in
//!   `tests/grpc_harness.rs`), so stopping it is a gateway's job.
//!
//! What the executor does is chosen by the text of the user message
//! (`Message::text`, the first text part):
//!
//! * `work:<ms>`: `WORKING`, then a `WORKING` status update every 100 ms until
//!   `<ms>` have passed, then an artifact and `COMPLETED`. It watches the
//!   task's cancellation token and returns at once when it fires, writing
//!   nothing more: the server writes `CANCELED` (CancelTask, lease lapse).
//! * `burst:<n>`: `WORKING`, n more `WORKING` updates at once, `COMPLETED`.
//! * `quick`, and anything else: `WORKING` then `COMPLETED`.
//! * `spend:<ms>:<meter>=<n>`: as `work:<ms>`, charging `n` of the meter to
//!   the turn's budget (`RequestContext::budget`) before each status update,
//!   so the server reports the spend on every update; it never stops itself
//!   for its budget (`charged` counts what it charged).
//! * `ask`: `WORKING` then `INPUT_REQUIRED` (with an agent message). A
//!   continuation (same `taskId`) is run by the text rules again, so a
//!   continuation saying `quick` completes the task.
//! * `idle:<ms>`: `WORKING` once, then nothing (no periodic updates; the
//!   server's own SSE keep-alive comments, every 30 s, are all that moves)
//!   until `<ms>` have passed, then `COMPLETED`. It watches the cancellation
//!   token like `work:`. For holding many cheap, quiet streams open (the
//!   `streams` bench).
//! * `trickle:<n>:<ms>`: `WORKING`, then n more `WORKING` updates `<ms>`
//!   apart, then `COMPLETED` (watching the token): one event per socket write,
//!   unlike `burst:` whose events leave in batches.
//! * `spawn:<ms>@<binding>@<url>@<text>`: `WORKING`, then a background
//!   child: `<text>` sent non-blocking to `<url>` over `<binding>`
//!   (`jsonrpc`, `rest`, `grpc`) with the a2a-rust client, carrying the
//!   trace headers the task's request came with (an interceptor, as the
//!   client crate propagates none itself); then as `work:<ms>`.
//!   [`RustWorker::children`] lists them.
//!
//! Counters: `tasks_started` (executor runs that created a task; a
//! continuation of the same task id is not counted, see `executions`),
//! `cancels` (the executor's cancel hook run for a `CancelTask` call),
//! `lease_stops` (the cancel hook run for anything else: a lease lapse or a
//! halt), `upgrade_extensions` (every URI of `A2A-Extensions` any call
//! carried, from a `ServerInterceptor`).
//!
//! Cancel records: every run of the cancel hook is also recorded with its
//! task id and the time it ran (`Instant` and wall clock, so that another
//! process on the same machine can compare), in order:
//! [`RustWorker::cancel_records`], [`RustWorker::cancel_records_from`] (the
//! ones after the first n), [`RustWorker::cancelled_at`].
//!
//! Capacity: [`RustWorker::start`] keeps a2a-rust's defaults, which refuse
//! more than 1024 concurrent streams (`DEFAULT_MAX_CONCURRENT_STREAMS`) and
//! keep at most 10,000 tasks per tenant (evicting the oldest, running ones
//! last). [`RustWorker::start_with_capacity`] raises both, for benches that
//! hold thousands of tasks open at once.
//!
//! Tasks are kept in a `TenantAwareInMemoryTaskStore`: a task created under
//! tenant `acme` is only found again with tenant `acme`.
//!
//! Dropping the worker aborts every accept loop, so nothing new connects.
//! Connections already open (e.g. an SSE stream) are spawned by the crate
//! and live on until their task ends or the test's runtime stops; a test
//! that needs "the worker vanished mid-stream" cannot get it from Drop.
//!
//! # Reference (`/work/shared/a2a-reference.md`) versus the real 0.15.0 crates
//!
//! Checked by running `tests/worker_selftest.rs` (and a throw-away probe):
//!
//! * Matched: JSON-RPC at `POST /`; SSE frames `event: message` + `data:`
//!   (compact JSON), the first a `task` frame in `TASK_STATE_SUBMITTED` with
//!   no `id:` line, later ones `id: 1`, `id: 2`, …; JSON-RPC `data` is a
//!   success response echoing the request id, REST `data` a bare
//!   StreamResponse; `/{tenant}/message:stream` and
//!   `POST /{tenant}/tasks/{id}:cancel` work; CancelTask answers the Task in
//!   `TASK_STATE_CANCELED` and the open stream ends with a CANCELED
//!   `statusUpdate`; a second CancelTask gets -32002 without running the
//!   cancel hook; the stream closes at `INPUT_REQUIRED`; a lease grant with
//!   `ttlMs: 1000` and no renewal ends the task CANCELED about 1-1.3 s after
//!   the last renewal, with no CancelTask.
//! * Not in the reference: a request naming a tenant is refused with
//!   -32004 (`UNSUPPORTED_OPERATION`, "this server cannot isolate tenants…")
//!   unless the task and push-config stores partition by tenant (the
//!   `TenantAware*` stores) or the builder calls
//!   `accept_unisolated_tenants()`. So a "plain" a2a-rust agent with the
//!   default store rejects every tenant-carrying request. This worker uses
//!   `TenantAwareInMemoryTaskStore` (the push-config store follows it), so
//!   tenants are isolated: a task made under `acme` is unknown to GetTask
//!   without a tenant or with another tenant (-> `state()` is `None`).
//! * Not in the reference: a card without `capabilities.streaming: true`
//!   makes SendStreamingMessage fail before the stream with -32004 "agent
//!   does not support streaming" (plain `application/json`, HTTP 200).
//! * Precision on §5 "the cancel hook emits CANCELED": `AgentExecutor::cancel`
//!   runs for a `CancelTask` (its `RequestContext::call_context` has method
//!   `"CancelTask"`) and also, after the executor returns, for a lease lapse
//!   or halt (`TerminalTracking::finish_run`, with the executor's own call
//!   context, method `SendStreamingMessage`/`SendMessage`). A hook that
//!   writes nothing is fine: `cancel_with` writes the CANCELED status itself.
//!   That is how `cancels()` and `lease_stops()` are told apart.
//! * Precision on §2 "the executor sees only card-declared URIs":
//!   interceptors see the raw list (`CallContext::extensions`, parsed from
//!   the `a2a-extensions` header; raw value in `CallContext::http_headers`).
//!   Over WebSocket every call's `CallContext` carries the upgrade request's
//!   headers, so the interceptor sees the upgrade's `A2A-Extensions` on every
//!   call of the connection (not once at the upgrade itself: there is no
//!   hook for the upgrade).
//! * `serve_with_addr` (both dispatchers) spawns an accept loop with no
//!   handle; `Server::from_listener(..).serve_with_shutdown(..)` and
//!   `WebSocketDispatcher::serve_with_shutdown(listener, ..)` return futures
//!   this harness spawns and aborts.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use a2a_protocol_server::dispatch::grpc::{GrpcConfig, GrpcDispatcher};
use a2a_protocol_server::serve::Server;
use a2a_protocol_server::store::{InMemoryLeaseStore, TaskStoreConfig, TenantStoreConfig};
use a2a_protocol_server::streaming::EventQueueWriter;
use a2a_protocol_server::tenant_resolver::HeaderTenantResolver;
use a2a_protocol_server::{
    AgentExecutor, CallContext, CombinedDispatcher, EventEmitter, RequestContext,
    RequestHandlerBuilder, ServerInterceptor, TenantAwareInMemoryTaskStore, WebSocketDispatcher,
};
use a2a_protocol_types::agent_card::{AgentCard, AgentInterface, AgentSkill};
use a2a_protocol_types::error::A2aResult;
use a2a_protocol_types::events::{StreamResponse, TaskStatusUpdateEvent};
use a2a_protocol_types::message::{Message, Part};
use a2a_protocol_types::task::{ContextId, TaskState, TaskStatus};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How to build a [`RustWorker`]. `Default`: no lease store, no WebSocket.
/// (gRPC is not a field, since tests build this struct without `..Default`:
/// [`RustWorker::start_with_grpc`].)
#[derive(Debug, Clone, Copy, Default)]
pub struct RustWorkerOptions {
    /// Build with `with_lease_store(InMemoryLeaseStore::new())`: the card
    /// then declares `https://a2a-rust.com/extensions/lease/v1` and grants
    /// are honoured (lapse stops the task as CANCELED).
    pub lease_store: bool,
    /// Also serve the WebSocket binding on a second listener (`ws_url`).
    pub websocket: bool,
    /// Take the tenant from the `x-tenant-id` header
    /// (`with_tenant_resolver(HeaderTenantResolver::default())`): a call
    /// without the header is in the default tenant, and one naming another
    /// tenant in its path or params is refused.
    pub header_tenant: bool,
}

/// Limits for a worker that holds many tasks at once
/// ([`RustWorker::start_with_capacity`]).
#[derive(Debug, Clone, Copy)]
pub struct RustWorkerCapacity {
    /// `RequestHandlerBuilder::with_max_concurrent_streams`: event queues
    /// (running tasks) at once; a2a-rust's default is 1024.
    pub max_concurrent_streams: usize,
    /// The task store's `max_capacity` (per tenant); a2a-rust's default is
    /// 10,000.
    pub max_tasks: usize,
}

/// One run of the executor's cancel hook.
#[derive(Debug, Clone)]
pub struct CancelRecord {
    pub task_id: String,
    /// When the hook ran, on this process's monotonic clock.
    pub at: Instant,
    /// The same moment on the wall clock (comparable across processes).
    pub wall: SystemTime,
    /// Run for a `CancelTask` call (else a lease lapse or halt).
    pub by_cancel_task: bool,
}

/// What the worker observed, shared by executor, interceptor and handle.
#[derive(Debug, Default)]
struct Observed {
    tasks_started: AtomicUsize,
    executions: AtomicUsize,
    cancels: AtomicUsize,
    lease_stops: AtomicUsize,
    /// Meter units charged by `spend:` turns, all meters together.
    charged: AtomicUsize,
    /// Distinct extension URIs, in first-seen order.
    extensions: Mutex<Vec<String>>,
    /// (method, raw `a2a-extensions` value) for every call that carried one.
    extension_calls: Mutex<Vec<(String, String)>>,
    /// Every cancel-hook run, in order.
    cancel_log: Mutex<Vec<CancelRecord>>,
    /// The background children `spawn:` started, in order.
    children: Mutex<Vec<SpawnedChild>>,
}

/// A running a2a-rust 0.15 agent. Stops accepting when dropped.
#[derive(Debug)]
pub struct RustWorker {
    url: String,
    ws_url: Option<String>,
    grpc_url: Option<String>,
    observed: Arc<Observed>,
    serve_tasks: Vec<JoinHandle<()>>,
}

impl RustWorker {
    /// Binds, builds the handler and starts serving in tokio tasks.
    pub async fn start(opts: RustWorkerOptions) -> RustWorker {
        RustWorker::start_with_capacity(opts, None).await
    }

    /// As [`RustWorker::start`], with a2a-rust's concurrency and task-store
    /// limits raised to `capacity` (`None`: a2a-rust's defaults).
    pub async fn start_with_capacity(
        opts: RustWorkerOptions,
        capacity: Option<RustWorkerCapacity>,
    ) -> RustWorker {
        RustWorker::start_inner(opts, capacity, false).await
    }

    /// As [`RustWorker::start`], also serving the A2A gRPC binding on a
    /// listener of its own ([`RustWorker::grpc_url`]; see the module doc),
    /// declared in the card as `AgentInterface::grpc(url)`.
    pub async fn start_with_grpc(opts: RustWorkerOptions) -> RustWorker {
        RustWorker::start_inner(opts, None, true).await
    }

    async fn start_inner(
        opts: RustWorkerOptions,
        capacity: Option<RustWorkerCapacity>,
        grpc: bool,
    ) -> RustWorker {
        let http_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind http");
        let http_addr = http_listener.local_addr().unwrap();
        let url = format!("http://{http_addr}");

        let ws_listener = if opts.websocket {
            Some(TcpListener::bind("127.0.0.1:0").await.expect("bind ws"))
        } else {
            None
        };
        let ws_url = ws_listener
            .as_ref()
            .map(|l| format!("ws://{}/ws", l.local_addr().unwrap()));

        let grpc_listener = if grpc {
            Some(TcpListener::bind("127.0.0.1:0").await.expect("bind grpc"))
        } else {
            None
        };
        let grpc_url = grpc_listener
            .as_ref()
            .map(|l| format!("http://{}", l.local_addr().unwrap()));

        let mut card = AgentCard::new("rust-worker", "1.0.0", AgentInterface::jsonrpc(&url))
            .with_description("a2a-gateway test worker on a2a-protocol-server 0.15")
            .with_skill(
                AgentSkill::new("work", "Work", "work:<ms>, quick, ask").with_tags(["test"]),
            )
            .with_streaming(true)
            .with_interface(AgentInterface::rest(&url));
        if let Some(ws) = &ws_url {
            card = card.with_interface(AgentInterface::new(
                ws,
                a2a_protocol_types::WEBSOCKET_BINDING_URI,
            ));
        }
        if let Some(grpc) = &grpc_url {
            card = card.with_interface(AgentInterface::grpc(grpc));
        }

        let observed = Arc::new(Observed::default());
        let mut builder = RequestHandlerBuilder::new(WorkerExecutor {
            observed: Arc::clone(&observed),
        })
        .with_agent_card(card)
        .with_task_store(match capacity {
            None => TenantAwareInMemoryTaskStore::new(),
            Some(c) => TenantAwareInMemoryTaskStore::with_config(
                TenantStoreConfig::default().with_per_tenant(
                    TaskStoreConfig::default().with_max_capacity(Some(c.max_tasks)),
                ),
            ),
        })
        .with_interceptor(ExtensionRecorder {
            observed: Arc::clone(&observed),
        });
        if let Some(c) = capacity {
            builder = builder.with_max_concurrent_streams(c.max_concurrent_streams);
        }
        if opts.lease_store {
            builder = builder.with_lease_store(InMemoryLeaseStore::new());
        }
        if opts.header_tenant {
            builder = builder.with_tenant_resolver(HeaderTenantResolver::default());
        }
        let handler = Arc::new(builder.build().expect("build worker handler"));

        let mut serve_tasks = Vec::new();
        let http = Server::from_listener(http_listener).serve_with_shutdown(
            CombinedDispatcher::new(Arc::clone(&handler)),
            std::future::pending(),
        );
        serve_tasks.push(tokio::spawn(async move {
            let _report = http.await;
        }));
        if let Some(listener) = ws_listener {
            let ws = Arc::new(WebSocketDispatcher::new(Arc::clone(&handler)));
            serve_tasks.push(tokio::spawn(async move {
                let _report = ws
                    .serve_with_shutdown(listener, std::future::pending())
                    .await;
            }));
        }
        if let Some(listener) = grpc_listener {
            // `serve_with_shutdown` polls the server in place (no spawn), so
            // aborting this task on drop stops accepting, as for the others.
            let grpc = GrpcDispatcher::new(Arc::clone(&handler), GrpcConfig::default());
            serve_tasks.push(tokio::spawn(async move {
                let _report = grpc
                    .serve_with_shutdown(listener, std::future::pending())
                    .await;
            }));
        }

        RustWorker {
            url,
            ws_url,
            grpc_url,
            observed,
            serve_tasks,
        }
    }

    /// `http://127.0.0.1:PORT`: JSON-RPC at `POST /`, HTTP+JSON elsewhere.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// `ws://127.0.0.1:PORT2/ws` when started with `websocket: true`.
    pub fn ws_url(&self) -> Option<String> {
        self.ws_url.clone()
    }

    /// `http://127.0.0.1:PORT`, the gRPC binding's address (for
    /// `crate::harness::grpc`). Panics unless started with
    /// [`RustWorker::start_with_grpc`].
    pub fn grpc_url(&self) -> String {
        self.grpc_url
            .clone()
            .expect("rust worker started without gRPC (use start_with_grpc)")
    }

    /// Executor runs that created a task (continuations not counted).
    pub fn tasks_started(&self) -> usize {
        self.observed.tasks_started.load(Ordering::SeqCst)
    }

    /// Every executor run, continuations included.
    pub fn executions(&self) -> usize {
        self.observed.executions.load(Ordering::SeqCst)
    }

    /// Meter units `spend:` turns charged to their budgets so far.
    pub fn charged(&self) -> u64 {
        self.observed.charged.load(Ordering::SeqCst) as u64
    }

    /// `CancelTask` calls (any binding, gRPC included) that reached the
    /// executor's cancel hook.
    pub fn cancels(&self) -> usize {
        self.observed.cancels.load(Ordering::SeqCst)
    }

    /// The background children `spawn:` turns started, in order.
    pub fn children(&self) -> Vec<SpawnedChild> {
        self.observed.children.lock().unwrap().clone()
    }

    /// Cancel-hook runs not caused by `CancelTask`: a lease lapse (or halt)
    /// stopping a task.
    pub fn lease_stops(&self) -> usize {
        self.observed.lease_stops.load(Ordering::SeqCst)
    }

    /// Distinct `A2A-Extensions` URIs seen on any call (HTTP requests and
    /// every call on a WebSocket, which carries its upgrade's headers), in
    /// first-seen order. Read by a `ServerInterceptor` from the raw list.
    pub fn upgrade_extensions(&self) -> Vec<String> {
        self.observed.extensions.lock().unwrap().clone()
    }

    /// `(method, raw A2A-Extensions value)` for every call that carried the
    /// header, in arrival order (e.g. `("GetTask", "…/lease/v1")`).
    pub fn extension_calls(&self) -> Vec<(String, String)> {
        self.observed.extension_calls.lock().unwrap().clone()
    }

    /// Every cancel-hook run so far, in order.
    pub fn cancel_records(&self) -> Vec<CancelRecord> {
        self.observed.cancel_log.lock().unwrap().clone()
    }

    /// The cancel-hook runs after the first `from` (for polling).
    pub fn cancel_records_from(&self, from: usize) -> Vec<CancelRecord> {
        let log = self.observed.cancel_log.lock().unwrap();
        log.get(from..).map(<[_]>::to_vec).unwrap_or_default()
    }

    /// When the cancel hook first ran for `task_id`, if it did.
    pub fn cancelled_at(&self, task_id: &str) -> Option<Instant> {
        let log = self.observed.cancel_log.lock().unwrap();
        log.iter().find(|r| r.task_id == task_id).map(|r| r.at)
    }

    /// The task's state read straight from this worker (JSON-RPC GetTask).
    pub async fn state(&self, tenant: Option<&str>, id: &str) -> Option<String> {
        crate::harness::http::get_task_state(&self.url(), tenant, id).await
    }
}

impl Drop for RustWorker {
    fn drop(&mut self) {
        for task in &self.serve_tasks {
            task.abort();
        }
    }
}

// ── Executor ────────────────────────────────────────────────────────────────

struct WorkerExecutor {
    observed: Arc<Observed>,
}

enum Behaviour {
    Work(Duration),
    /// `burst:<n>`: n WORKING updates as fast as the server takes them, then
    /// COMPLETED (the streaming benchmark's worker).
    Burst(usize),
    Quick,
    /// `ask`, `ask:<bytes>`: WORKING, then INPUT_REQUIRED with a question
    /// padded to `<bytes>` (an event over a gateway's `max_sse_event`).
    Ask(usize),
    /// `idle:<ms>`: WORKING once, quiet until `<ms>` passed, COMPLETED.
    Idle(Duration),
    /// `trickle:<n>:<ms>`: n WORKING updates `<ms>` apart, then COMPLETED.
    Trickle(usize, Duration),
    /// `spend:<ms>:<meter>=<n>`: like `work:<ms>`, charging `n` of the meter
    /// to the turn's budget before every status update (the server reports
    /// the spend on each). It keeps going past its grant: stopping it is
    /// left to whoever enforces the budget.
    Spend(Duration, String, u64),
    /// `spawn:<ms>@<binding>@<url>@<text>`: WORKING, then a non-blocking
    /// `SendMessage` of `<text>` to the agent at `<url>` over `<binding>`
    /// (`jsonrpc`, `rest` or `grpc`) with the a2a-rust client, never
    /// followed (a background child), carrying the `traceparent`,
    /// `tracestate` and `baggage` the task's request arrived with (an
    /// interceptor propagating them, as an instrumented agent's does: the
    /// client crate has no trace propagation of its own); then as
    /// `work:<ms>`.
    Spawn {
        work: Duration,
        binding: String,
        url: String,
        text: String,
    },
}

fn behaviour(text: &str) -> Behaviour {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix("spawn:") {
        let mut parts = rest.splitn(4, '@');
        if let (Some(ms), Some(binding), Some(url), Some(child)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        {
            if let Ok(ms) = ms.parse::<u64>() {
                return Behaviour::Spawn {
                    work: Duration::from_millis(ms),
                    binding: binding.to_owned(),
                    url: url.to_owned(),
                    text: child.to_owned(),
                };
            }
        }
    }
    if let Some(ms) = text.strip_prefix("work:") {
        if let Ok(ms) = ms.trim().parse::<u64>() {
            return Behaviour::Work(Duration::from_millis(ms));
        }
    }
    if let Some(n) = text.strip_prefix("burst:") {
        if let Ok(n) = n.trim().parse::<usize>() {
            return Behaviour::Burst(n);
        }
    }
    if let Some(ms) = text.strip_prefix("idle:") {
        if let Ok(ms) = ms.trim().parse::<u64>() {
            return Behaviour::Idle(Duration::from_millis(ms));
        }
    }
    if let Some(rest) = text.strip_prefix("trickle:") {
        if let Some((n, ms)) = rest.split_once(':') {
            if let (Ok(n), Ok(ms)) = (n.trim().parse::<usize>(), ms.trim().parse::<u64>()) {
                return Behaviour::Trickle(n, Duration::from_millis(ms));
            }
        }
    }
    if let Some(rest) = text.strip_prefix("spend:") {
        let parsed = rest.split_once(':').and_then(|(ms, charge)| {
            let (meter, n) = charge.split_once('=')?;
            Some((ms.parse().ok()?, meter.to_owned(), n.parse().ok()?))
        });
        if let Some((ms, meter, n)) = parsed {
            return Behaviour::Spend(Duration::from_millis(ms), meter, n);
        }
    }
    if text == "ask" {
        return Behaviour::Ask(0);
    }
    if let Some(n) = text.strip_prefix("ask:") {
        if let Ok(n) = n.trim().parse::<usize>() {
            return Behaviour::Ask(n);
        }
    }
    Behaviour::Quick
}

fn next_message_id() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("worker-{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

async fn run(
    ctx: &RequestContext,
    queue: &dyn EventQueueWriter,
    observed: &Observed,
) -> A2aResult<()> {
    let emit = EventEmitter::new(ctx, queue);
    let token = &ctx.cancellation_token;
    let text = ctx.message.text().unwrap_or("").to_owned();
    let behaviour = behaviour(&text);
    let charge = || {
        if let (Behaviour::Spend(_, meter, n), Some(budget)) = (&behaviour, ctx.budget()) {
            // Over the grant `charge` says so and records the spend anyway.
            let _ = budget.charge(meter, *n);
            observed.charged.fetch_add(*n as usize, Ordering::SeqCst);
        }
    };
    charge();
    emit.status(TaskState::Working).await?;
    if let Behaviour::Spawn {
        binding, url, text, ..
    } = &behaviour
    {
        let headers: HashMap<String, String> = ctx
            .call_context
            .as_ref()
            .map(|c| {
                ["traceparent", "tracestate", "baggage"]
                    .iter()
                    .filter_map(|h| {
                        c.http_headers()
                            .get(*h)
                            .map(|v| ((*h).to_owned(), v.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let child = spawn_child(binding, url, text, headers).await;
        observed.children.lock().unwrap().push(child);
    }
    match &behaviour {
        Behaviour::Quick => emit.status(TaskState::Completed).await,
        Behaviour::Burst(n) => {
            for _ in 0..*n {
                if token.is_cancelled() {
                    return Ok(());
                }
                emit.status(TaskState::Working).await?;
            }
            emit.status(TaskState::Completed).await
        }
        Behaviour::Idle(total) => {
            tokio::select! {
                () = token.cancelled() => return Ok(()),
                () = tokio::time::sleep(*total) => {}
            }
            emit.status(TaskState::Completed).await
        }
        Behaviour::Trickle(n, gap) => {
            for _ in 0..*n {
                tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    () = tokio::time::sleep(*gap) => {}
                }
                emit.status(TaskState::Working).await?;
            }
            emit.status(TaskState::Completed).await
        }
        Behaviour::Ask(len) => {
            let mut question = String::from("what next?");
            while question.len() < *len {
                question.push('.');
            }
            let note = Message::agent(next_message_id(), vec![Part::text(question)])
                .with_task_id(ctx.task_id.clone())
                .with_context_id(ContextId::new(ctx.context_id.clone()));
            let mut status = TaskStatus::new(TaskState::InputRequired);
            status.message = Some(note);
            queue
                .write(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
                    task_id: ctx.task_id.clone(),
                    context_id: ContextId::new(ctx.context_id.clone()),
                    status,
                    metadata: None,
                }))
                .await
        }
        Behaviour::Work(total)
        | Behaviour::Spend(total, ..)
        | Behaviour::Spawn { work: total, .. } => {
            let total = *total;
            let deadline = tokio::time::Instant::now() + total;
            loop {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    break;
                }
                let step = (deadline - now).min(Duration::from_millis(100));
                tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    () = tokio::time::sleep(step) => {}
                }
                if tokio::time::Instant::now() < deadline {
                    charge();
                    emit.status(TaskState::Working).await?;
                }
            }
            emit.artifact(
                "result",
                vec![Part::text(format!("worked {} ms", total.as_millis()))],
                None,
                Some(true),
            )
            .await?;
            emit.status(TaskState::Completed).await
        }
    }
}

impl AgentExecutor for WorkerExecutor {
    fn execute<'a>(
        &'a self,
        ctx: &'a RequestContext,
        queue: &'a dyn EventQueueWriter,
    ) -> Pin<Box<dyn Future<Output = A2aResult<()>> + Send + 'a>> {
        Box::pin(async move {
            self.observed.executions.fetch_add(1, Ordering::SeqCst);
            let continuation = ctx
                .stored_task
                .as_ref()
                .is_some_and(|t| t.id == ctx.task_id);
            if !continuation {
                self.observed.tasks_started.fetch_add(1, Ordering::SeqCst);
            }
            let result = run(ctx, queue, &self.observed).await;
            // Once cancelled (CancelTask, lease lapse, halt) the server owns
            // the terminal state: write nothing more, report no failure.
            if ctx.cancellation_token.is_cancelled() {
                return Ok(());
            }
            result
        })
    }

    fn cancel<'a>(
        &'a self,
        ctx: &'a RequestContext,
        _queue: &'a dyn EventQueueWriter,
    ) -> Pin<Box<dyn Future<Output = A2aResult<()>> + Send + 'a>> {
        Box::pin(async move {
            let at = Instant::now();
            let wall = SystemTime::now();
            let by_cancel_task = ctx
                .call_context
                .as_ref()
                .is_some_and(|c| c.method() == "CancelTask");
            self.observed.cancel_log.lock().unwrap().push(CancelRecord {
                task_id: ctx.task_id.0.clone(),
                at,
                wall,
                by_cancel_task,
            });
            if by_cancel_task {
                self.observed.cancels.fetch_add(1, Ordering::SeqCst);
            } else {
                self.observed.lease_stops.fetch_add(1, Ordering::SeqCst);
            }
            // Writing nothing is fine: `TerminalTracking::cancel_with` then
            // writes the CANCELED status itself.
            Ok(())
        })
    }
}

/// A background child started by `spawn:`: its message id, and its task id
/// or why there is none.
#[derive(Debug, Clone)]
pub struct SpawnedChild {
    pub message_id: String,
    pub task: Result<String, String>,
}

/// Adds the parent request's trace headers to every call of a client.
struct Propagate(HashMap<String, String>);

impl a2a_protocol_client::interceptor::CallInterceptor for Propagate {
    #[allow(clippy::manual_async_fn)]
    fn before<'a>(
        &'a self,
        req: &'a mut a2a_protocol_client::interceptor::ClientRequest,
    ) -> impl Future<Output = a2a_protocol_client::error::ClientResult<()>> + Send + 'a {
        async move {
            req.extra_headers
                .extend(self.0.iter().map(|(k, v)| (k.clone(), v.clone())));
            Ok(())
        }
    }

    #[allow(clippy::manual_async_fn)]
    fn after<'a>(
        &'a self,
        _resp: &'a a2a_protocol_client::interceptor::ClientResponse,
    ) -> impl Future<Output = a2a_protocol_client::error::ClientResult<()>> + Send + 'a {
        async move { Ok(()) }
    }
}

/// `spawn:`'s send: the a2a-rust client over `binding`, non-blocking.
async fn spawn_child(
    binding: &str,
    url: &str,
    text: &str,
    headers: HashMap<String, String>,
) -> SpawnedChild {
    use a2a_protocol_client::ClientBuilder;
    use a2a_protocol_types::params::MessageSendParams;
    use a2a_protocol_types::responses::SendMessageResponse;
    let message_id = format!("rust-child-{}", next_message_id());
    let builder = ClientBuilder::new(url)
        .with_interceptor(Propagate(headers))
        .with_return_immediately(true);
    let client = match binding {
        "grpc" => builder.with_protocol_binding("GRPC").build_grpc().await,
        "rest" => builder.with_protocol_binding("HTTP+JSON").build(),
        _ => builder.build(),
    };
    let task = match client {
        Err(e) => Err(format!("client: {e:?}")),
        Ok(client) => {
            let params = MessageSendParams::new(Message::user(
                message_id.clone(),
                vec![Part::text(text.to_owned())],
            ));
            match client.send_message(params).await {
                Ok(SendMessageResponse::Task(t)) => Ok(t.id.0),
                Ok(other) => Err(format!("not a task: {other:?}")),
                Err(e) => Err(format!("send: {e:?}")),
            }
        }
    };
    SpawnedChild { message_id, task }
}

// ── Interceptor recording A2A-Extensions ────────────────────────────────────

struct ExtensionRecorder {
    observed: Arc<Observed>,
}

impl ServerInterceptor for ExtensionRecorder {
    fn before<'a>(
        &'a self,
        ctx: &'a CallContext,
    ) -> Pin<Box<dyn Future<Output = A2aResult<()>> + Send + 'a>> {
        Box::pin(async move {
            if let Some(raw) = ctx.http_headers().get("a2a-extensions") {
                self.observed
                    .extension_calls
                    .lock()
                    .unwrap()
                    .push((ctx.method().to_owned(), raw.clone()));
            }
            let mut seen = self.observed.extensions.lock().unwrap();
            for uri in ctx.extensions() {
                if !seen.contains(uri) {
                    seen.push(uri.clone());
                }
            }
            Ok(())
        })
    }

    fn after<'a>(
        &'a self,
        _ctx: &'a CallContext,
    ) -> Pin<Box<dyn Future<Output = A2aResult<()>> + Send + 'a>> {
        Box::pin(async { Ok(()) })
    }
}
