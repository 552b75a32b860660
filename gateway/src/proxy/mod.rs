//! The pingora service: one [`ProxyHttp`] implementation whose hooks
//! classify, observe and, when a tracked stream ends, hand the facts to
//! [`Cascade`]. Hooks never await the store on the response path.

pub mod route;
pub mod timing;
mod websocket;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType, Result};
use policies::cascade::{Event, Seen};

use crate::a2a::card::CardRewrite;
use crate::a2a::extensions::A2A_EXTENSIONS;
use crate::a2a::request::SentGrant;
use crate::a2a::request::{jsonrpc_batch, jsonrpc_facts, rest_facts, RequestFacts};
use crate::a2a::sse::{SseItem, SseParser};
use crate::a2a::{classify, observe, A2aMethod, Binding, Call, Observation};
use crate::budget::{BudgetError, Budgets, ChildBudget, Verdict};
use crate::cancel::{caller_headers, cancel_headers, CancelJob};
use crate::cascade::{Cascade, StreamEnd};
use crate::lease::Leases;
use crate::metrics;
use crate::store::{now_ms, CancelTarget, Renewal, StoreHealth, TaskKey, TaskStore, TaskUpdate};
use route::{host_without_port, Routes};
use timing::ProxyTimes;
use websocket::WsSession;

/// The gateway's proxy service.
#[derive(Debug)]
pub struct Gateway {
    routes: Arc<Routes>,
    limits: config::Limits,
    timeouts: config::Timeouts,
    public_url: Option<String>,
    cascade: Arc<Cascade>,
    leases: Arc<Leases>,
    store: Arc<dyn TaskStore>,
    health: Arc<StoreHealth>,
    on_store_error: config::OnStoreError,
    budgets: Arc<Budgets>,
}

/// Bodies up to this size are read before the worker is contacted, so that a
/// refused request never reaches it (pingora replays them from its retry
/// buffer, which holds this much). Larger bodies are inspected as they pass.
const PRE_READ_LIMIT: usize = 64 * 1024;

/// A request the gateway answers itself, with an A2A error, instead of
/// forwarding it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Refusal {
    /// The JSON-RPC code: `-32602` InvalidParams, `-32603` Internal.
    code: i64,
    /// The REST status and its gRPC code name (400 INVALID_ARGUMENT, …).
    http: (u16, &'static str),
    message: String,
    /// Metric label.
    reason: &'static str,
    /// JSON-RPC `error.data` / REST `error.details`.
    data: Option<serde_json::Value>,
    /// Seconds for `Retry-After` (an exhausted account: until it resets).
    retry_after: Option<u64>,
}

impl Refusal {
    /// A body a budgeted route cannot read. Such a route checks every send's
    /// grant, so it does not pass what it cannot read: a worker may read it
    /// all the same (the Python SDK takes UTF-16 and a UTF-8 BOM). JSON-RPC
    /// callers get Parse error; REST callers the HTTP status.
    fn unreadable() -> Self {
        Refusal {
            code: -32700,
            http: (400, "INVALID_ARGUMENT"),
            message: "this route enforces budgets and checks every call it passes: the body could not be read as a JSON request (UTF-8 JSON, one object)".into(),
            reason: "budget_unreadable",
            data: None,
            retry_after: None,
        }
    }

    /// A call this route does not pass in the form it came in (a batch
    /// holding a send, a v0.3 send name): JSON-RPC `-32004`
    /// (UnsupportedOperation), REST 400.
    fn unsupported(message: &str, reason: &'static str) -> Self {
        Refusal {
            code: -32004,
            http: (400, "INVALID_ARGUMENT"),
            message: message.into(),
            reason,
            data: None,
            retry_after: None,
        }
    }

    fn invalid_params(message: String, reason: &'static str) -> Self {
        Refusal {
            code: -32602,
            http: (400, "INVALID_ARGUMENT"),
            message,
            reason,
            data: None,
            retry_after: None,
        }
    }
}

/// What the gateway does with the worker's response body.
#[derive(Debug, Default)]
enum Body {
    /// Pass through, read nothing.
    #[default]
    Pass,
    /// An SSE stream of task events.
    Sse(SseParser),
    /// One JSON document, copied up to the inspection limit.
    Json(Vec<u8>),
    /// The one JSON answer of a budgeted child's blocking send, held whole
    /// (bounded) so that a child stopped for its budget is answered with the
    /// budget-exhausted failure instead of the worker's CANCELED task.
    HeldJson(Vec<u8>),
    /// An agent card (or a JSON-RPC result holding one), held for rewriting.
    Card { held: Vec<u8>, jsonrpc: bool },
}

/// Per-request state, shared by every hook of one request.
#[derive(Debug, Default)]
pub struct Ctx {
    route: Option<Arc<route::Route>>,
    /// The path sent to the worker (worker root + path below the prefix + query).
    upstream_path: String,
    /// The worker path the route's root maps to (the REST base for cancels,
    /// the base removed from card URLs).
    worker_root: String,
    call: Option<Call>,
    binding: Option<Binding>,
    method: Option<A2aMethod>,
    tenant: Option<String>,
    /// Request body copy for inspection; `None` once read or abandoned.
    req_body: Option<Vec<u8>>,
    /// The caller's headers the gateway's own cancel repeats (its
    /// credential, the route's `cancel_headers`), in memory only.
    caller_headers: Vec<(String, String)>,
    body: Body,
    task_id: Option<Arc<str>>,
    /// The task id the request itself names (SubscribeToTask, a
    /// continuation), used when the caller leaves before any event.
    req_task_id: Option<String>,
    seen: Seen,
    /// This request counted itself as a watcher of `task_id`.
    watching: bool,
    /// A tracked SSE stream started flowing to the caller.
    streaming: bool,
    /// The caller may leave before any event names its new task: a FIN from
    /// it is tolerated (pingora's `abort_on_close` off) so the worker's
    /// stream is still read until an event names the task, for at most
    /// `id_wait`; then the caller's leaving is acted on with the id known.
    awaiting_id: Option<Instant>,
    /// The request's `A2A-Extensions` activates the lease extension.
    lease_ext: bool,
    /// A valid lease grant the sent message carries (TTL in ms).
    lease_grant: Option<u64>,
    /// A gateway-held lease this connection keeps renewing.
    held_lease: Option<Box<TaskKey>>,
    /// The JSON-RPC request id, for errors the gateway answers itself.
    rpc_id: Option<serde_json::Value>,
    /// A refused JSON-RPC batch: the ids its answer must name, one error
    /// per call (`Null` for an element that is no request).
    batch_ids: Option<Vec<serde_json::Value>>,
    /// Why the request is refused, when it is.
    refusal: Option<Box<Refusal>>,
    /// A WebSocket upgraded by the worker: its frames are read both ways.
    ws: Option<Box<WsSession>>,
    /// The gateway answered the caller's `Expect: 100-continue` itself
    /// (it reads the body before the worker is asked).
    continued: bool,
    /// When the request arrived (Unix ms): a grant's deadline counts from it.
    received_ms: u64,
    /// The caller, as the route's `budget.caller_header` names it (a bearer
    /// JWT's `sub`, else the header's value).
    caller: Option<Box<crate::budget::Caller>>,
    /// The grant the sent message carries, checked, until admission.
    sent_budget: Option<Box<std::result::Result<SentGrant, policies::budget::BudgetRefusal>>>,
    /// The child's budget, from admission until the request ends.
    budget: Option<Box<ChildBudget>>,
    /// The request body re-written with the admitted grant, sent instead.
    new_body: Option<Bytes>,
    /// A large body on a budgeted route, held whole until admitted (sent
    /// chunked, since its length may change).
    hold_request: bool,
    /// SSE bytes after the last event boundary, held while the child's
    /// budget may need its last event replaced.
    sse_pending: Vec<u8>,
    /// The budget-exhausted failure has been sent in place of the worker's
    /// last event; nothing after it is forwarded.
    failure_sent: bool,
    context_id: Option<String>,
    /// The worker refused the send (an error answer before any task).
    worker_refused: bool,
    /// Moments that split the request's time between the gateway and the
    /// worker, for `a2agw_proxy_seconds`.
    times: ProxyTimes,
    /// Counts the request as in flight until pingora drops its context: a
    /// graceful shutdown waits for it ([`crate::drain`]).
    _in_flight: crate::drain::InFlight,
}

impl Ctx {
    /// The gateway answers this request itself with `refusal`.
    fn refuse(&mut self, refusal: Refusal) {
        self.refusal = Some(Box::new(refusal));
    }

    /// The request's method when its answer must be read: a stream or
    /// subscription (cascade, leases), or a `SendMessage` whose child holds
    /// a lease or a budget. A plain `SendMessage` answer is passed unread:
    /// no policy acts on it, and parsing it would cost every request.
    fn tracked_method(&self) -> Option<A2aMethod> {
        self.method.filter(|m| {
            m.is_tracked()
                && (*m != A2aMethod::SendMessage
                    || self.lease_grant.is_some()
                    || self.budget.is_some())
        })
    }
}

impl Gateway {
    pub fn new(
        cfg: &config::Config,
        routes: Arc<Routes>,
        cascade: Arc<Cascade>,
        leases: Arc<Leases>,
        store: Arc<dyn TaskStore>,
        health: Arc<StoreHealth>,
        budgets: Arc<Budgets>,
    ) -> Self {
        Gateway {
            routes,
            limits: cfg.limits.clone(),
            timeouts: cfg.timeouts.clone(),
            public_url: cfg.server.public_url.clone(),
            cascade,
            leases,
            store,
            health,
            on_store_error: cfg.store.on_store_error,
            budgets,
        }
    }

    /// Reads what the request body says (method, tenant, task, grants).
    fn inspect_body(&self, ctx: &mut Ctx, buf: &[u8]) {
        let budgeted = ctx.route.as_ref().is_some_and(|r| r.cfg.budget.is_active());
        let facts: Option<RequestFacts> = match ctx.call {
            Some(Call::JsonRpcCandidate) => {
                let f = jsonrpc_facts(buf);
                if f.is_none() {
                    if let Some(calls) = jsonrpc_batch(buf) {
                        Self::inspect_batch(ctx, &calls, budgeted);
                        return;
                    }
                    if budgeted {
                        ctx.binding = Some(Binding::JsonRpc);
                        ctx.refuse(Refusal::unreadable());
                        return;
                    }
                    metrics::UNTRACKED.with_label_values(&["not_jsonrpc"]).inc();
                }
                f
            }
            Some(Call::Rest { .. }) => match rest_facts(buf) {
                Some(f) => Some(f),
                None if budgeted => {
                    ctx.refuse(Refusal::unreadable());
                    return;
                }
                None => Some(RequestFacts::default()),
            },
            _ => None,
        };
        let Some(f) = facts else { return };
        if f.is_jsonrpc {
            ctx.binding = Some(Binding::JsonRpc);
            ctx.method = f.method;
            ctx.rpc_id = f.rpc_id;
        }
        if budgeted && f.v03_send {
            // Not read as a send, so never admitted: refused rather than
            // passed to a worker that may still serve v0.3.
            ctx.refuse(Refusal::unsupported(
                "this route enforces budgets on A2A v1.0 sends: use SendMessage or SendStreamingMessage, not the v0.3 method names",
                "budget_v03_send",
            ));
            return;
        }
        if ctx.tenant.is_none() {
            ctx.tenant = f.tenant;
        }
        if ctx.req_task_id.is_none() {
            ctx.req_task_id = f.task_id;
        }
        let is_send = matches!(
            ctx.method,
            Some(A2aMethod::SendMessage | A2aMethod::SendStreamingMessage)
        );
        if is_send {
            ctx.sent_budget = f.budget.map(Box::new);
        }
        // Grants are checked only where the gateway enforces them; a worker
        // that enforces its own leases judges its own grants.
        let enforces = ctx
            .route
            .as_ref()
            .is_some_and(|r| r.gateway_enforces_leases());
        if let (true, true, Some(grant), Some(route)) = (is_send, enforces, f.lease, &ctx.route) {
            let checked = grant
                .map_err(policies::lease::LeaseRefusal::Malformed)
                .and_then(|ttl| {
                    let max = route.cfg.lease.max_ttl.as_millis() as u64;
                    policies::lease::validate_ttl(ttl, max)
                });
            match checked {
                Ok(ttl) => ctx.lease_grant = Some(ttl),
                Err(refusal) => {
                    let reason = match refusal {
                        policies::lease::LeaseRefusal::OutOfBounds { .. } => "lease_out_of_bounds",
                        policies::lease::LeaseRefusal::Malformed(_) => "lease_malformed",
                    };
                    ctx.refuse(Refusal::invalid_params(refusal.to_string(), reason));
                }
            }
        }
        // A send whose lease the gateway must hold, while the store is down.
        let needs_store = ctx.route.as_ref().is_some_and(|r| {
            (ctx.lease_grant.is_some() && r.gateway_enforces_leases())
                || (r.cfg.lease.impose_ttl.is_some()
                    && ctx.method == Some(A2aMethod::SendStreamingMessage))
        });
        if ctx.refusal.is_none() && needs_store && !self.health.is_healthy() {
            match self.on_store_error {
                config::OnStoreError::FailClosed => {
                    ctx.refuse(Refusal {
                        code: -32603,
                        http: (503, "UNAVAILABLE"),
                        message:
                            "the lease could not be stored: the gateway's store is unavailable"
                                .into(),
                        reason: "store_unavailable",
                        data: None,
                        retry_after: None,
                    });
                }
                config::OnStoreError::FailOpen => {
                    metrics::UNTRACKED
                        .with_label_values(&["store_unavailable"])
                        .inc();
                }
            }
        }
    }

    /// A JSON-RPC batch is proxied untracked, unless it holds a send whose
    /// grants this route must read: any send on a budgeted route, a send
    /// with a lease grant (or a stream that gets one imposed) where the
    /// gateway enforces leases. The gateway admits sends one per request (a
    /// batch's answer is one document for many children), so such a batch
    /// is refused whole rather than let its sends past the caps (an a2a-rust
    /// worker runs the `SendMessage` calls of a batch).
    fn inspect_batch(ctx: &mut Ctx, calls: &[Option<RequestFacts>], budgeted: bool) {
        ctx.binding = Some(Binding::JsonRpc);
        let Some(route) = &ctx.route else { return };
        let leases = route.gateway_enforces_leases();
        let imposes = route.cfg.lease.impose_ttl.is_some();
        let must_read = calls.iter().flatten().any(|f| match f.method {
            Some(A2aMethod::SendMessage) => budgeted || (leases && f.lease.is_some()),
            Some(A2aMethod::SendStreamingMessage) => {
                budgeted || (leases && (f.lease.is_some() || imposes))
            }
            _ => false,
        });
        if !must_read {
            metrics::UNTRACKED
                .with_label_values(&["jsonrpc_batch"])
                .inc();
            return;
        }
        ctx.batch_ids = Some(
            calls
                .iter()
                .filter_map(|f| match f {
                    // A notification (no id) gets no answer.
                    Some(f) => f.rpc_id.clone(),
                    None => Some(serde_json::Value::Null),
                })
                .collect(),
        );
        ctx.refuse(Refusal::unsupported(
            "this route checks each send's budget or lease grant, one send per request: send SendMessage and SendStreamingMessage outside JSON-RPC batches",
            "batch_send",
        ));
    }

    /// A `GetTask` whose request activates the lease extension renews the
    /// task's lease (as the SDK's lease store does); a plain one renews nothing.
    async fn renew_if_asked(&self, ctx: &Ctx) {
        if !ctx.lease_ext || ctx.method != Some(A2aMethod::GetTask) {
            return;
        }
        if let Some(id) = &ctx.req_task_id {
            self.renew(ctx, ctx.tenant.as_deref(), id).await;
        }
    }

    /// Renews the lease on (route, tenant, task), counting the outcome.
    async fn renew(&self, ctx: &Ctx, tenant: Option<&str>, task_id: &str) {
        let Some(route) = &ctx.route else { return };
        let key = TaskKey::new(&route.name, tenant, task_id);
        let outcome = match self.store.lease_renew(&key, self.store.clock_ms()).await {
            Ok(Renewal::Renewed { .. }) => "renewed",
            Ok(Renewal::Lapsed) => "lapsed",
            Ok(Renewal::NoLease) => "no_lease",
            Err(e) => {
                metrics::STORE_ERRORS
                    .with_label_values(&["lease_renew"])
                    .inc();
                tracing::warn!(task = %key, error = %e, "could not renew a lease");
                "store_error"
            }
        };
        metrics::LEASE_RENEWALS
            .with_label_values(&[&route.name, "get_task", outcome])
            .inc();
    }

    /// What follows reading the body: renewals, and the end of the id wait for
    /// anything but a new task's stream.
    async fn after_inspection(&self, session: &mut Session, ctx: &mut Ctx) {
        self.renew_if_asked(ctx).await;
        let new_task_stream =
            ctx.method == Some(A2aMethod::SendStreamingMessage) && ctx.req_task_id.is_none();
        if !new_task_stream {
            stop_awaiting_id(session, ctx);
        }
    }

    /// Decides and reserves the budget of a send (see [`crate::budget`]);
    /// sets the body to send instead when the grant changed, or a refusal.
    async fn admit_budget(&self, ctx: &mut Ctx, body: &[u8]) {
        let Some(route) = ctx.route.clone() else {
            return;
        };
        let is_send = matches!(
            ctx.method,
            Some(A2aMethod::SendMessage | A2aMethod::SendStreamingMessage)
        );
        if !is_send || ctx.refusal.is_some() {
            return;
        }
        let sent = ctx.sent_budget.take().map(|b| *b);
        let admitted = self
            .budgets
            .admit(
                &route.name,
                &route.cfg.budget,
                ctx.tenant.as_deref(),
                ctx.caller.as_deref(),
                sent,
                ctx.received_ms,
            )
            .await;
        match admitted {
            Ok(None) => {}
            Ok(Some(child)) => {
                if child.rewrite {
                    let jsonrpc = ctx.binding == Some(Binding::JsonRpc);
                    match crate::budget::rewrite_message(body, jsonrpc, child.grant()) {
                        Some(b) => ctx.new_body = Some(Bytes::from(b)),
                        None => {
                            child.settle(&self.budgets, true, None);
                            ctx.refuse(Refusal::invalid_params(
                                "the message could not be read to attach its budget".into(),
                                "budget_unreadable",
                            ));
                            return;
                        }
                    }
                }
                ctx.budget = Some(Box::new(child));
            }
            Err(e) => ctx.refuse(budget_refusal(&e)),
        }
    }

    /// Answers a refused request itself; nothing reaches the worker.
    async fn refuse(&self, session: &mut Session, ctx: &mut Ctx, r: &Refusal) -> Result<bool> {
        if let Some(route) = &ctx.route {
            metrics::REFUSALS
                .with_label_values(&[&route.name, r.reason])
                .inc();
            tracing::info!(route = %route.name, reason = r.reason, "request refused: {}", r.message);
        }
        stop_awaiting_id(session, ctx);
        let (status, body) = Self::refusal_response(ctx, r);
        self.respond_json_with(session, status, body, r.retry_after)
            .await
    }

    /// The error body and HTTP status for a refusal, in the caller's binding.
    fn refusal_response(ctx: &Ctx, r: &Refusal) -> (u16, serde_json::Value) {
        match ctx.binding {
            Some(Binding::Rest) => {
                let mut error =
                    serde_json::json!({"code": r.http.0, "status": r.http.1, "message": r.message});
                if let Some(d) = &r.data {
                    error["details"] = serde_json::json!([d]);
                }
                (r.http.0, serde_json::json!({ "error": error }))
            }
            _ => {
                let mut error = serde_json::json!({"code": r.code, "message": r.message});
                if let Some(d) = &r.data {
                    error["data"] = d.clone();
                }
                let answer = |id: serde_json::Value| serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error.clone()});
                match &ctx.batch_ids {
                    Some(ids) if !ids.is_empty() => (
                        200,
                        serde_json::Value::Array(ids.iter().cloned().map(answer).collect()),
                    ),
                    _ => (
                        200,
                        answer(ctx.rpc_id.clone().unwrap_or(serde_json::Value::Null)),
                    ),
                }
            }
        }
    }

    async fn respond_json(
        &self,
        session: &mut Session,
        status: u16,
        body: serde_json::Value,
    ) -> Result<bool> {
        self.respond_json_with(session, status, body, None).await
    }

    async fn respond_json_with(
        &self,
        session: &mut Session,
        status: u16,
        body: serde_json::Value,
        retry_after: Option<u64>,
    ) -> Result<bool> {
        let body = Bytes::from(body.to_string());
        let mut resp = ResponseHeader::build(status, Some(4))?;
        resp.insert_header("content-type", "application/json")?;
        resp.insert_header("content-length", body.len().to_string())?;
        if let Some(s) = retry_after {
            resp.insert_header("retry-after", s.to_string())?;
        }
        session.write_response_header(Box::new(resp), false).await?;
        session.write_response_body(Some(body), true).await?;
        Ok(true)
    }

    /// Applies one observation to the request's view of its task, and queues
    /// the store updates that matter (first id, settling) — never one per event.
    fn on_observation(&self, ctx: &mut Ctx, mut obs: Observation<'_>) {
        let Some(route) = ctx.route.clone() else {
            return;
        };
        if obs.message_only && !ctx.seen.id_known {
            ctx.seen.message_only = true;
        }
        if obs.error && ctx.task_id.is_none() {
            ctx.worker_refused = true;
        }
        // Only a budget's failure event needs the context id.
        if ctx.context_id.is_none() && ctx.budget.is_some() {
            ctx.context_id = obs.context_id.as_deref().map(str::to_owned);
        }
        let spent = obs.spent.take();
        let settles = obs.state.is_some_and(policies::TaskState::is_settled);
        let Some(id) = obs.task_id else { return };
        let prev_settled = ctx.seen.is_settled();
        if let Some(s) = obs.state {
            ctx.seen.state = Some(s);
            ctx.seen.unsure = false;
        }
        let key = |tenant: &Option<String>, task_id: Arc<str>| {
            TaskKey::new(&route.name, tenant.as_deref(), task_id)
        };
        if ctx.task_id.is_none() {
            let id: Arc<str> = id.into();
            ctx.task_id = Some(id.clone());
            ctx.seen.id_known = true;
            metrics::TASKS_TRACKED
                .with_label_values(&[&route.name])
                .inc();
            let watching = ctx.streaming;
            ctx.watching = watching;
            // A one-document answer naming a task already settled (the
            // usual blocking SendMessage) leaves nothing to cancel, watch or
            // renew: the store is spared the write (a Redis round trip).
            if ctx.streaming || !ctx.seen.is_settled() {
                let target = self.cancel_target(ctx);
                self.cascade.tracker().update(
                    key(&ctx.tenant, id.clone()),
                    TaskUpdate {
                        context_id: obs.context_id.map(std::borrow::Cow::into_owned),
                        state: ctx.seen.state,
                        target,
                        watchers_delta: i32::from(watching),
                    },
                );
            }
            if !ctx.seen.is_settled() {
                let k = key(&ctx.tenant, id.clone());
                self.start_lease(ctx, &route, k);
            }
            if let (Some(b), Some(target)) = (&ctx.budget, self.cancel_target(ctx)) {
                let job = CancelJob {
                    key: key(&ctx.tenant, id.clone()),
                    worker: route.cfg.worker.clone(),
                    target,
                    headers: cancel_headers(&route.cfg, &ctx.caller_headers),
                    cause: "budget_exhausted",
                };
                b.task_known(&self.budgets, &id, job, ctx.seen.is_settled());
            }
        } else if ctx.seen.is_settled() && !prev_settled {
            if let Some(id) = ctx.task_id.clone() {
                self.cascade.tracker().update(
                    key(&ctx.tenant, id),
                    TaskUpdate {
                        state: ctx.seen.state,
                        ..TaskUpdate::default()
                    },
                );
            }
        }
        if let (Some(spent), Some(b)) = (spent, ctx.budget.as_deref_mut()) {
            if let Verdict::Exhausted(by) = b.on_spent(&self.budgets, spent, settles) {
                tracing::debug!(route = %route.name, task = ?ctx.task_id, by = by.as_str(), "reported spend passed the grant");
            }
        }
    }

    /// Once a task's id is known: enforce the caller's lease grant, or the
    /// lease the route imposes on streams whose caller granted none.
    fn start_lease(&self, ctx: &mut Ctx, route: &route::Route, key: TaskKey) {
        if ctx.seen.is_settled() {
            return;
        }
        if let Some(ttl) = ctx.lease_grant {
            if route.gateway_enforces_leases() {
                metrics::LEASES_STARTED
                    .with_label_values(&[&route.name, "granted"])
                    .inc();
                self.cascade.tracker().lease_start(key, ttl, None);
            }
            return;
        }
        let Some(ttl) = route.cfg.lease.impose_ttl else {
            return;
        };
        if !ctx.streaming || route.cfg.cascade.mode == policies::CascadeMode::Detach {
            return;
        }
        let ttl = ttl.as_millis() as u64;
        if ctx.method == Some(A2aMethod::SendStreamingMessage) {
            metrics::LEASES_STARTED
                .with_label_values(&[&route.name, "imposed"])
                .inc();
            self.cascade.tracker().lease_start(
                key.clone(),
                ttl,
                Some(self.leases.replica_id().to_string()),
            );
        }
        // Any stream of the task (a resubscribe too) renews it while it lives.
        self.leases.hold(key.clone(), ttl);
        ctx.held_lease = Some(Box::new(key));
    }

    /// Where a cancel for this request's task goes: the JSON-RPC endpoint
    /// the caller used, or the REST base path below which the call's route sits.
    fn cancel_target(&self, ctx: &Ctx) -> Option<CancelTarget> {
        let path = ctx.upstream_path.split('?').next().unwrap_or("");
        Some(match ctx.binding? {
            b @ (Binding::JsonRpc | Binding::WebSocket) => CancelTarget {
                binding: b,
                path: path.to_string(),
            },
            Binding::Rest => CancelTarget {
                binding: Binding::Rest,
                path: ctx.worker_root.clone(),
            },
        })
    }

    fn gateway_base(&self, session: &Session, ctx: &Ctx) -> String {
        let origin = match &self.public_url {
            Some(u) => u.clone(),
            None => {
                let host = request_host(session.req_header()).unwrap_or("localhost");
                // A caller on a `[server.tls]` listener reaches it by https.
                let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
                let scheme = if tls { "https" } else { "http" };
                format!("{scheme}://{host}")
            }
        };
        // The route's public prefix (what `Routes::find` matched).
        let prefix = ctx
            .route
            .as_ref()
            .and_then(|r| r.cfg.path_prefix.as_deref());
        format!("{origin}{}", prefix.unwrap_or(""))
    }
}

/// Whether the request asks for `100 Continue` before its body.
fn expects_continue(req: &RequestHeader) -> bool {
    req.headers
        .get_all(http::header::EXPECT)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Ends the id wait: from now on a caller's FIN aborts the request at once
/// (pingora's default), and one that came during the wait is acted on.
fn stop_awaiting_id(session: &mut Session, ctx: &mut Ctx) {
    if ctx.awaiting_id.take().is_some() {
        session.set_abort_on_close(true);
    }
}

/// Applies the route's header policy to a request going to its worker:
/// strip, set, and merge extension URIs into `A2A-Extensions`. On a
/// WebSocket upgrade, `Sec-WebSocket-Extensions` is removed too, declining
/// permessage-deflate so that frames stay readable.
fn inject_headers(
    req: &mut RequestHeader,
    route: &route::Route,
    call: &Option<Call>,
) -> Result<()> {
    let policy = &route.cfg.headers;
    for name in &policy.strip_headers {
        req.remove_header(name.as_str());
    }
    for (name, value) in &policy.inject_headers {
        req.insert_header(name.clone(), value.as_str())?;
    }
    if !policy.inject_extensions.is_empty() {
        let added = add_extensions(req, &policy.inject_extensions)?;
        if !added.is_empty() {
            tracing::debug!(route = %route.name, injected = ?added, upgrade = matches!(call, Some(Call::Upgrade)), "A2A-Extensions injected");
        }
    }
    if matches!(call, Some(Call::Upgrade))
        && req
            .headers
            .contains_key(http::header::SEC_WEBSOCKET_EXTENSIONS)
    {
        req.remove_header(&http::header::SEC_WEBSOCKET_EXTENSIONS);
        metrics::UNTRACKED
            .with_label_values(&["ws_extensions_declined"])
            .inc();
    }
    Ok(())
}

/// The answer to a send whose budget is not admitted.
fn budget_refusal(e: &BudgetError) -> Refusal {
    let message = e.to_string();
    match e {
        BudgetError::Refused(r) => {
            let reason = match r {
                policies::budget::BudgetRefusal::AboveCap { .. }
                | policies::budget::BudgetRefusal::TooManyWithCaps(_) => "budget_above_cap",
                _ => "budget_malformed",
            };
            Refusal::invalid_params(message, reason)
        }
        BudgetError::Exhausted {
            account,
            meter,
            asked,
            left,
            limit,
            resets_at_ms,
            resets_in_ms,
        } => Refusal {
            code: -32603,
            http: (429, "RESOURCE_EXHAUSTED"),
            message,
            reason: "budget_account_exhausted",
            data: Some(serde_json::json!({
                policies::budget::FAILURE_METADATA_KEY: policies::budget::BUDGET_EXHAUSTED_CLASS,
                "account": {"route": &*account.route, "per": &*account.scope, "holder": &*account.holder},
                "meter": meter,
                "asked": asked,
                "left": left,
                "limit": limit,
                "resetsAtMs": resets_at_ms,
            })),
            retry_after: Some(resets_in_ms.div_ceil(1000)),
        },
        BudgetError::StoreUnavailable(_) => Refusal {
            code: -32603,
            http: (503, "UNAVAILABLE"),
            message,
            reason: "store_unavailable",
            data: None,
            retry_after: None,
        },
    }
}

/// Merges `inject` into the request's `A2A-Extensions` (one header line,
/// no URI twice); returns the URIs it added.
fn add_extensions<'a>(req: &mut RequestHeader, inject: &'a [String]) -> Result<Vec<&'a str>> {
    let existing: Vec<String> = req
        .headers
        .get_all(&A2A_EXTENSIONS)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let list = crate::a2a::extensions::parse(existing.iter().map(String::as_str));
    let (merged, added) = crate::a2a::extensions::merge(&list, inject);
    if !added.is_empty() {
        req.insert_header("a2a-extensions", merged)?;
    }
    Ok(added)
}

/// A body being held whole to be re-written.
enum Held {
    /// It continues: hold on.
    More(Vec<u8>),
    /// It ended: here it is, to re-write and send.
    Whole(Vec<u8>),
    /// It grew past its limit: what was held went out as it was, and the
    /// rest passes unread.
    Released,
}

/// An SSE event the gateway could not read (over `max_sse_event`, or not an
/// A2A document): counted; if it carried the settling state, the cascade
/// must not take the stream's end for a caller abandoning a running task, so
/// the state seen so far is marked unsure ([`Seen::unsure`]).
fn unreadable_event(ctx: &mut Ctx, reason: &'static str) {
    metrics::UNTRACKED.with_label_values(&[reason]).inc();
    ctx.seen.unsure = true;
}

/// Adds this chunk to `held`, releasing everything unchanged (and counting
/// `too_large`) once it is over `limit`.
fn hold(
    mut held: Vec<u8>,
    body: &mut Option<Bytes>,
    end_of_stream: bool,
    limit: usize,
    too_large: &'static str,
) -> Held {
    if let Some(chunk) = body.take() {
        held.extend_from_slice(&chunk);
    }
    if held.len() > limit {
        metrics::UNTRACKED.with_label_values(&[too_large]).inc();
        *body = Some(Bytes::from(held));
        return Held::Released;
    }
    if end_of_stream {
        Held::Whole(held)
    } else {
        Held::More(held)
    }
}

/// A card's `capabilities.extensions` names `uri`.
fn card_declares(card: &serde_json::Value, uri: &str) -> bool {
    card["capabilities"]["extensions"]
        .as_array()
        .is_some_and(|list| list.iter().any(|e| e["uri"].as_str() == Some(uri)))
}

/// The request's `A2A-Extensions` (any number of lines, comma-separated)
/// names the lease extension.
fn activates_lease(req: &RequestHeader) -> bool {
    req.headers.get_all(&A2A_EXTENSIONS).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',').any(|u| {
                u.trim()
                    .eq_ignore_ascii_case(policies::lease::LEASE_EXTENSION_URI)
            })
        })
    })
}

fn request_host(req: &RequestHeader) -> Option<&str> {
    req.uri.authority().map(|a| a.as_str()).or_else(|| {
        req.headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}

fn is_sse(resp: &ResponseHeader) -> bool {
    header_starts_with(resp, &http::header::CONTENT_TYPE, "text/event-stream")
}

fn is_json(resp: &ResponseHeader) -> bool {
    let ct = resp
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence.eq_ignore_ascii_case("application/a2a+json")
}

fn header_starts_with(resp: &ResponseHeader, name: &http::HeaderName, prefix: &str) -> bool {
    resp.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let v = v.trim_start().as_bytes();
            v.len() >= prefix.len() && v[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
        })
}

fn is_encoded(resp: &ResponseHeader) -> bool {
    resp.headers
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"))
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: pingora keeps the CTX inside each request's future and copies
    /// that future whole when it boxes it; a pointer there instead of the
    /// ~1.2 KB `Ctx` copies less on every request.
    type CTX = Box<Ctx>;

    fn new_ctx(&self) -> Box<Ctx> {
        Box::default()
    }

    /// Picks the route, classifies the call, and keeps what the cancel would
    /// need from the request head (tenant from a REST path, credential).
    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        ctx.times.head();
        let req = session.req_header();
        let host = request_host(req).map(host_without_port);
        let full_path = req.uri.path();
        let Some(m) = self.routes.find(host, full_path) else {
            metrics::NO_ROUTE.with_label_values(&["proxy"]).inc();
            let msg = format!(
                "no route for host {:?} and path {full_path:?}",
                host.unwrap_or("")
            );
            return self
                .respond_json(session, 404, serde_json::json!({"error": {"code": 404, "status": "NOT_FOUND", "message": msg}}))
                .await;
        };
        let route = m.route.clone();
        let call = classify(
            &req.method,
            m.rel,
            req.uri.query(),
            session.is_upgrade_req(),
        );
        ctx.received_ms = now_ms();
        if let Some(h) = &route.cfg.budget.caller_header {
            ctx.caller = req
                .headers
                .get(h.as_str())
                .and_then(|v| v.to_str().ok())
                .map(|v| Box::new(crate::budget::caller_identity(v)));
        }
        ctx.worker_root = route.worker_root(m.prefix);
        let rel = if m.rel == "/" && !ctx.worker_root.is_empty() && !full_path.ends_with('/') {
            ""
        } else {
            m.rel
        };
        let query = req.uri.query();
        let path = &mut ctx.upstream_path;
        path.reserve(1 + ctx.worker_root.len() + rel.len() + query.map_or(0, |q| q.len() + 1));
        if ctx.worker_root.is_empty() && rel.is_empty() {
            path.push('/');
        }
        path.push_str(&ctx.worker_root);
        path.push_str(rel);
        if let Some(q) = query {
            path.push('?');
            path.push_str(q);
        }
        ctx.caller_headers = caller_headers(&route.cfg, &req.headers);
        let kind = match &call {
            Call::AgentCard => "agent_card",
            Call::Rest { method, .. } => method.as_str(),
            Call::JsonRpcCandidate => "jsonrpc",
            Call::Upgrade => "upgrade",
            Call::Other => "other",
        };
        route.count_request(kind);
        match &call {
            Call::Rest {
                method,
                tenant,
                task_id,
            } => {
                ctx.binding = Some(Binding::Rest);
                ctx.method = Some(*method);
                ctx.tenant = tenant.clone();
                // A task id in the path (SubscribeToTask) is confirmed by the
                // stream's first event, which registers the watcher.
                ctx.req_task_id = task_id.clone();
                if matches!(
                    method,
                    A2aMethod::SendMessage | A2aMethod::SendStreamingMessage
                ) {
                    ctx.req_body = Some(Vec::new());
                }
            }
            Call::JsonRpcCandidate => ctx.req_body = Some(Vec::new()),
            _ => {}
        }
        let may_start_stream = match &call {
            Call::Rest { method, .. } => *method == A2aMethod::SendStreamingMessage,
            Call::JsonRpcCandidate => true,
            _ => false,
        };
        let policy = route.cfg.cascade;
        if may_start_stream
            && policy.mode == policies::CascadeMode::Cancel
            && !policy.id_wait.is_zero()
        {
            session.set_abort_on_close(false);
            ctx.awaiting_id = Some(Instant::now());
        }
        ctx.lease_ext = route.injects_lease_extension || activates_lease(session.req_header());
        let budgeted = route.cfg.budget.is_active();
        ctx.call = Some(call);
        ctx.route = Some(route);
        if budgeted && matches!(ctx.call, Some(Call::Upgrade)) {
            // Frames could carry sends whose grants the gateway cannot
            // rewrite; a budgeted route is served over HTTP bindings only.
            let r = Refusal {
                code: -32004,
                http: (403, "PERMISSION_DENIED"),
                message: "this route enforces budgets, which the gateway applies on the JSON-RPC and HTTP+JSON bindings only; use one of those".into(),
                reason: "budget_websocket",
                data: None,
                retry_after: None,
            };
            ctx.binding = Some(Binding::Rest);
            return self.refuse(session, ctx, &r).await;
        }
        // An idle WebSocket is not cut by read timeouts (ping/pong and
        // long silences pass); other requests get the configured one.
        if !matches!(ctx.call, Some(Call::Upgrade)) {
            if let Some(t) = self.timeouts.downstream_idle {
                session.set_read_timeout(Some(t));
            }
        }
        // REST GetTask: everything is in the head.
        if ctx.method == Some(A2aMethod::GetTask) {
            self.renew_if_asked(ctx).await;
        }
        // Small bodies are read now, before the worker is contacted, so a
        // refused request never reaches it; pingora replays them upstream.
        let content_length = session
            .req_header()
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let small =
            content_length.is_some_and(|n| n <= PRE_READ_LIMIT.min(self.limits.max_inspect_body));
        if ctx.req_body.is_some() && small {
            // A caller that asked `Expect: 100-continue` waits for the go
            // ahead before it sends the body the gateway is about to read:
            // give it here (the worker, which would have, is not asked
            // yet), and drop the header on the way to the worker.
            if expects_continue(session.req_header()) {
                session.downstream_session.write_continue_response().await?;
                ctx.continued = true;
            }
            session.downstream_session.enable_retry_buffering();
            ctx.req_body = None;
            // Usually one chunk, read in place; copied only when it is not.
            let mut first: Option<Bytes> = None;
            let mut joined = Vec::new();
            while let Some(chunk) = session.read_request_body().await? {
                match first.take() {
                    None if joined.is_empty() => first = Some(chunk),
                    earlier => {
                        if let Some(e) = earlier {
                            joined.extend_from_slice(&e);
                        }
                        joined.extend_from_slice(&chunk);
                    }
                }
            }
            let body: &[u8] = first.as_deref().unwrap_or(&joined);
            self.inspect_body(ctx, body);
            self.admit_budget(ctx, body).await;
            if let Some(r) = ctx.refusal.clone() {
                return self.refuse(session, ctx, &r).await;
            }
            self.after_inspection(session, ctx).await;
        } else if let Some(buf) = ctx.req_body.as_mut() {
            // Copied as it passes (request_body_filter), up to the limit.
            buf.reserve(
                content_length
                    .unwrap_or(1024)
                    .min(self.limits.max_inspect_body),
            );
            if ctx.route.as_ref().is_some_and(|r| r.cfg.budget.is_active()) {
                // Too large to read before connecting: held whole (bounded)
                // and admitted at its end, so its grant can still be
                // re-written.
                ctx.hold_request = true;
            }
        }
        Ok(false)
    }

    /// The route's worker, at the address last looked up for its name; a name
    /// that cannot be resolved is answered 502 with why.
    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        let Some(route) = ctx.route.clone() else {
            return Err(Error::explain(ErrorType::InternalError, "no route chosen"));
        };
        let addr = match route.addr.get().await {
            Ok(a) => a,
            Err(why) => {
                // JSON-RPC callers get a JSON-RPC error; everything else
                // (REST, cards, upgrades, unknown traffic) an HTTP 502.
                if ctx.binding != Some(Binding::JsonRpc) {
                    ctx.binding = Some(Binding::Rest);
                }
                ctx.refuse(Refusal {
                    code: -32603,
                    http: (502, "UNAVAILABLE"),
                    message: why.clone(),
                    reason: "worker_unresolvable",
                    data: None,
                    retry_after: None,
                });
                return Err(Error::explain(ErrorType::ConnectNoRoute, why));
            }
        };
        let mut peer = route.addr.peer(addr, route.cfg.worker.tls);
        peer.options.connection_timeout = Some(self.timeouts.connect);
        if !matches!(ctx.call, Some(Call::Upgrade)) {
            peer.options.read_timeout = self.timeouts.upstream_idle;
            peer.options.write_timeout = self.timeouts.upstream_idle;
        }
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        Ok(Box::new(peer))
    }

    /// Points the request at the worker's path and host; asks for identity
    /// encoding where the gateway reads the answer.
    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        ctx.times.upstream();
        if ctx.continued {
            upstream.remove_header(&http::header::EXPECT);
        }
        // The caller's own origin-form target, when it is already the
        // worker's path (no base path, no stripped prefix), is kept as is.
        let unchanged = upstream.uri.authority().is_none()
            && upstream
                .uri
                .path_and_query()
                .is_some_and(|pq| pq.as_str() == ctx.upstream_path);
        if !unchanged {
            let uri: http::Uri = ctx
                .upstream_path
                .parse()
                .map_err(|e| Error::because(ErrorType::InternalError, "upstream path", e))?;
            upstream.set_uri(uri);
        }
        if let Some(route) = &ctx.route {
            upstream.insert_header("host", route.host_header.clone())?;
        }
        let reads_answer = matches!(ctx.call, Some(Call::AgentCard))
            || (matches!(ctx.call, Some(Call::JsonRpcCandidate)) && ctx.method.is_none())
            || ctx.tracked_method().is_some()
            || ctx.method.is_some_and(A2aMethod::returns_card);
        if reads_answer {
            upstream.remove_header(&http::header::ACCEPT_ENCODING);
        }
        if let Some(route) = ctx.route.clone() {
            inject_headers(upstream, &route, &ctx.call)?;
        }
        if let Some(b) = &ctx.new_body {
            upstream.insert_header("content-length", b.len().to_string())?;
        } else if ctx.hold_request {
            upstream.remove_header(&http::header::CONTENT_LENGTH);
            upstream.insert_header("transfer-encoding", "chunked")?;
        }
        // A send with a grant activates the extension, as the SDK's client
        // does (a held body's grant is decided later: every budgeted send
        // gets one).
        if ctx.budget.is_some() || ctx.hold_request {
            add_extensions(
                upstream,
                &[policies::budget::BUDGET_EXTENSION_URI.to_owned()],
            )?;
        }
        Ok(())
    }

    /// Copies a large request body (bounded) to learn the JSON-RPC method,
    /// tenant, task and grants; the bytes pass through unchanged and unheld,
    /// except that a refused request loses its last chunk and is aborted, so
    /// the worker never receives it whole.
    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if ctx.ws.is_some() {
            if let Some(chunk) = body.as_ref() {
                for (tenant, task) in self.ws_client_bytes(ctx, chunk) {
                    self.renew(ctx, tenant.as_deref(), &task).await;
                }
            }
            return Ok(());
        }
        if let Some(new) = &ctx.new_body {
            // The pre-read body, replayed (again, if pingora retries a
            // reused upstream connection): send the re-written one instead.
            *body = Some(new.clone());
            return Ok(());
        }
        if ctx.hold_request {
            return self.held_body(session, body, end_of_stream, ctx).await;
        }
        let Some(buf) = ctx.req_body.as_mut() else {
            return Ok(());
        };
        if let Some(chunk) = body {
            if buf.len() + chunk.len() > self.limits.max_inspect_body {
                ctx.req_body = None;
                metrics::UNTRACKED
                    .with_label_values(&["request_body_too_large"])
                    .inc();
                stop_awaiting_id(session, ctx);
                return Ok(());
            }
            buf.extend_from_slice(chunk);
        }
        if !end_of_stream {
            return Ok(());
        }
        let buf = ctx.req_body.take().unwrap_or_default();
        self.inspect_body(ctx, &buf);
        if ctx.refusal.is_some() {
            *body = None;
            return Err(Error::explain(
                ErrorType::HTTPStatus(400),
                "request refused by policy",
            ));
        }
        self.after_inspection(session, ctx).await;
        Ok(())
    }

    /// Chooses how the answer is read: SSE events, one JSON document, or a
    /// card to rewrite. Encoded (compressed) answers pass through unread.
    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        ctx.times.answer(resp);
        if matches!(ctx.call, Some(Call::Upgrade)) {
            if resp.status.as_u16() == 101 {
                ctx.ws = Some(Box::new(WsSession::new(self.limits.max_inspect_body)));
            }
            return Ok(());
        }
        if !resp.status.is_success() {
            ctx.worker_refused = true;
        }
        // HEAD answers have no body to rewrite.
        let ok = resp.status.is_success() && session.req_header().method != http::Method::HEAD;
        let card = matches!(ctx.call, Some(Call::AgentCard))
            || ctx.method.is_some_and(A2aMethod::returns_card);
        if card && ok && is_json(resp) {
            if is_encoded(resp) {
                metrics::UNTRACKED
                    .with_label_values(&["encoded_card"])
                    .inc();
                return Ok(());
            }
            resp.remove_header(&http::header::CONTENT_LENGTH);
            resp.remove_header(&http::header::ETAG);
            resp.insert_header("transfer-encoding", "chunked")?;
            ctx.body = Body::Card {
                held: Vec::new(),
                jsonrpc: ctx.binding == Some(Binding::JsonRpc),
            };
            return Ok(());
        }
        let Some(method) = ctx.tracked_method() else {
            stop_awaiting_id(session, ctx);
            return Ok(());
        };
        if is_encoded(resp) {
            metrics::UNTRACKED
                .with_label_values(&["encoded_response"])
                .inc();
            stop_awaiting_id(session, ctx);
            return Ok(());
        }
        if is_sse(resp) {
            ctx.body = Body::Sse(SseParser::new(self.limits.max_sse_event));
            ctx.streaming = method.is_streaming();
            if ctx.streaming {
                metrics::OPEN_STREAMS.inc();
            }
            return Ok(());
        }
        stop_awaiting_id(session, ctx);
        if !is_json(resp) {
            return Ok(());
        }
        if ctx.budget.is_some() && resp.status.is_success() {
            resp.remove_header(&http::header::CONTENT_LENGTH);
            resp.insert_header("transfer-encoding", "chunked")?;
            ctx.body = Body::HeldJson(Vec::new());
        } else {
            ctx.body = Body::Json(Vec::new());
        }
        Ok(())
    }

    /// Reads task ids and states out of the answer as it passes. Synchronous:
    /// store updates go to the tracker's queue.
    fn response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        if ctx.ws.is_some() {
            if let Some(chunk) = body.as_ref() {
                self.ws_worker_bytes(ctx, chunk);
            }
            return Ok(None);
        }
        match std::mem::take(&mut ctx.body) {
            Body::Pass => {}
            Body::Sse(mut parser) if ctx.budget.is_some() => {
                self.budgeted_sse(ctx, &mut parser, body, end_of_stream);
                ctx.body = Body::Sse(parser);
                self.check_id_wait(session, ctx);
            }
            Body::Sse(mut parser) => {
                if let (Some(chunk), Some(binding)) = (body.as_ref(), ctx.binding) {
                    // Each event is acted on as the parser finds it, its
                    // strings borrowed from the parser: nothing is allocated
                    // per event.
                    parser.feed(chunk, |item| match item {
                        SseItem::Event { data, .. } => match observe::observe(binding, data) {
                            Some(o) if !o.is_empty() => self.on_observation(ctx, o),
                            Some(_) => {}
                            None => unreadable_event(ctx, "bad_sse_event"),
                        },
                        SseItem::Overlong => unreadable_event(ctx, "sse_event_too_large"),
                    });
                }
                ctx.body = Body::Sse(parser);
                self.check_id_wait(session, ctx);
            }
            Body::Json(mut buf) => {
                if let Some(chunk) = body.as_ref() {
                    if buf.len() + chunk.len() > self.limits.max_inspect_body {
                        metrics::UNTRACKED
                            .with_label_values(&["response_body_too_large"])
                            .inc();
                        return Ok(None);
                    }
                    buf.extend_from_slice(chunk);
                }
                if end_of_stream {
                    if let Some(binding) = ctx.binding {
                        match observe::observe(binding, &buf) {
                            Some(o) => self.on_observation(ctx, o),
                            None => metrics::UNTRACKED
                                .with_label_values(&["bad_json_response"])
                                .inc(),
                        }
                    }
                } else {
                    ctx.body = Body::Json(buf);
                }
            }
            Body::HeldJson(held) => {
                let limit = self.limits.max_inspect_body;
                match hold(held, body, end_of_stream, limit, "response_body_too_large") {
                    Held::More(held) => ctx.body = Body::HeldJson(held),
                    Held::Whole(held) => {
                        *body = Some(Bytes::from(self.answer_held_json(ctx, held)));
                    }
                    Held::Released => {}
                }
            }
            Body::Card { held, jsonrpc } => {
                let limit = self.limits.max_card_body;
                match hold(held, body, end_of_stream, limit, "card_too_large") {
                    Held::More(held) => ctx.body = Body::Card { held, jsonrpc },
                    Held::Whole(held) => {
                        *body = Some(Bytes::from(self.rewrite_card(session, ctx, held, jsonrpc)));
                    }
                    Held::Released => {}
                }
            }
        }
        Ok(None)
    }

    /// Every request ends here. A tracked stream that ended unsettled (the
    /// caller left, or the worker's stream broke or ended early) goes to the
    /// cascade.
    async fn logging(&self, _session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX) {
        if let (Some(own), Some(route)) = (ctx.times.own(e), &ctx.route) {
            route.proxy_time.observe(own.as_secs_f64());
        }
        if ctx.streaming {
            metrics::OPEN_STREAMS.dec();
        }
        if let Some(b) = ctx.budget.take() {
            // No task and the worker said no (or could not be reached): no
            // child started, so its reservation goes back.
            let upstream_failed = e.is_some_and(|e| *e.esource() == ErrorSource::Upstream);
            let refused = ctx.task_id.is_none()
                && !ctx.seen.message_only
                && (ctx.worker_refused || ctx.refusal.is_some() || upstream_failed);
            let running = match (&ctx.task_id, &ctx.route) {
                (Some(id), Some(route)) if !ctx.seen.is_settled() => {
                    Some(TaskKey::new(&route.name, ctx.tenant.as_deref(), id.clone()))
                }
                _ => None,
            };
            b.settle(&self.budgets, refused, running);
        }
        if let Some(ws) = ctx.ws.take() {
            // Not an error to log (see `suppress_error_log`), but how a
            // socket ended is what one asks first when a caller saw it cut.
            tracing::debug!(error = ?e, "WebSocket session ended");
            self.ws_ended(ctx, *ws, e);
            return;
        }
        let imposed_lease = ctx.held_lease.is_some();
        if let Some(key) = ctx.held_lease.take() {
            self.leases.release(&key);
        }
        let Some(route) = ctx.route.clone() else {
            return;
        };
        let streaming_call =
            ctx.method.is_some_and(A2aMethod::is_streaming) && ctx.binding.is_some();
        if !streaming_call {
            return;
        }
        // A streaming call answered without a stream (an error before it
        // started), or that failed on the worker's side before a stream began
        // (connect refused, bad answer), created nothing the gateway knows of.
        // Only a caller leaving before the answer may have left a task behind.
        let caller_left = e.is_some_and(|e| *e.esource() == ErrorSource::Downstream);
        if !ctx.streaming && !caller_left {
            return;
        }
        // A stream that ended without an error ended either settled (the
        // decision keeps the task) or early (a loss): both are StreamLost.
        let event = if caller_left {
            Event::CallerGone
        } else {
            Event::StreamLost
        };
        if ctx.task_id.is_none() {
            if let Some(id) = ctx.req_task_id.take() {
                ctx.task_id = Some(id.into());
                ctx.seen.id_known = true;
            }
        }
        let Some(target) = self.cancel_target(ctx) else {
            return;
        };
        let end = StreamEnd {
            route: route.name.clone(),
            policy: route.cfg.cascade,
            worker: route.cfg.worker.clone(),
            target,
            tenant: ctx.tenant.clone(),
            task_id: ctx.task_id.clone(),
            seen: ctx.seen,
            event,
            was_watching: ctx.watching,
            imposed_lease,
            cancel_headers: cancel_headers(&route.cfg, &ctx.caller_headers),
        };
        let cascade = self.cascade.clone();
        crate::drain::spawn_work(async move { cascade.stream_ended(end).await });
    }

    /// A request refused while its (large) body streamed gets the A2A error
    /// the caller's binding expects; anything else pingora's default answer,
    /// but a worker that timed out gets 504 where pingora answers 502.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
    ) -> pingora::proxy::FailToProxy {
        if let Some(r) = ctx.refusal.clone() {
            if let Some(route) = &ctx.route {
                metrics::REFUSALS
                    .with_label_values(&[&route.name, r.reason])
                    .inc();
            }
            let (status, body) = Self::refusal_response(ctx, &r);
            let _ = self
                .respond_json_with(session, status, body, r.retry_after)
                .await;
            return pingora::proxy::FailToProxy {
                error_code: status,
                can_reuse_downstream: false,
            };
        }
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            _ => match e.esource() {
                // The worker did not answer in time (`timeouts.connect`,
                // `timeouts.upstream_idle`): a gateway timeout, as nginx
                // answers it; any other failure of the worker is a 502.
                ErrorSource::Upstream => match e.etype() {
                    ErrorType::ConnectTimedout
                    | ErrorType::ReadTimedout
                    | ErrorType::WriteTimedout
                    | ErrorType::TLSHandshakeTimedout => 504,
                    _ => 502,
                },
                ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        if code > 0 {
            let _ = session.respond_error(code).await;
        }
        pingora::proxy::FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Self::CTX, error: &Error) -> bool {
        // A caller leaving mid-stream is routine for a streaming proxy; the
        // cascade logs what it does about it.
        *error.esource() == ErrorSource::Downstream
    }
}

impl Gateway {
    /// Ends the id wait once an event named the task, the task settled, or
    /// `id_wait` passed.
    fn check_id_wait(&self, session: &mut Session, ctx: &mut Ctx) {
        if let (Some(since), Some(route)) = (ctx.awaiting_id, &ctx.route) {
            let waited_enough = since.elapsed() >= route.cfg.cascade.id_wait;
            if ctx.seen.id_known || ctx.seen.is_settled() || waited_enough {
                stop_awaiting_id(session, ctx);
            }
        }
    }

    /// A large body on a budgeted route: held (bounded) until its end, then
    /// admitted and sent whole, re-written if its grant changed.
    async fn held_body(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let buf = ctx.req_body.get_or_insert_with(Vec::new);
        if let Some(chunk) = body.take() {
            if buf.len() + chunk.len() > self.limits.max_inspect_body {
                ctx.req_body = None;
                ctx.refuse(Refusal {
                    code: -32600,
                    http: (413, "INVALID_ARGUMENT"),
                    message: format!(
                        "the request body is over {} bytes (limits.max_inspect_body): a budgeted route must read a message whole to check its grant",
                        self.limits.max_inspect_body
                    ),
                    reason: "budget_body_too_large",
                    data: None,
                    retry_after: None,
                });
                return Err(Error::explain(
                    ErrorType::HTTPStatus(413),
                    "request refused by policy",
                ));
            }
            buf.extend_from_slice(&chunk);
        }
        if !end_of_stream {
            // Nothing goes out yet (pingora skips empty chunks).
            *body = Some(Bytes::new());
            return Ok(());
        }
        let buf = ctx.req_body.take().unwrap_or_default();
        self.inspect_body(ctx, &buf);
        self.admit_budget(ctx, &buf).await;
        if ctx.refusal.is_some() {
            return Err(Error::explain(
                ErrorType::HTTPStatus(400),
                "request refused by policy",
            ));
        }
        self.after_inspection(session, ctx).await;
        *body = Some(ctx.new_body.take().unwrap_or_else(|| Bytes::from(buf)));
        Ok(())
    }

    /// The SSE stream of a child with a budget: events are forwarded whole
    /// (bytes after the last event boundary wait for the next chunk), so
    /// that once the budget is exhausted the worker's settling event can be
    /// replaced by the budget-exhausted failure, and nothing follows it.
    fn budgeted_sse(
        &self,
        ctx: &mut Ctx,
        parser: &mut SseParser,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
    ) {
        if ctx.failure_sent {
            *body = None;
            return;
        }
        let Some(binding) = ctx.binding else { return };
        let chunk = body.take().unwrap_or_default();
        // In stream order, an unreadable event as `Err` (it may have
        // settled the task: a later state clears that doubt, an earlier one
        // does not).
        let mut events = Vec::new();
        let last = parser.feed(&chunk, |item| match item {
            SseItem::Event { data, end, .. } => {
                events.push((
                    Some(end),
                    observe::observe(binding, data)
                        .map(Observation::into_owned)
                        .ok_or("bad_sse_event"),
                ));
            }
            SseItem::Overlong => events.push((None, Err("sse_event_too_large"))),
        });
        let base = ctx.sse_pending.len();
        let mut replace: Option<(usize, Vec<u8>)> = None;
        let mut prev_end = 0;
        for (end, obs) in events {
            match obs {
                Ok(o) if !o.is_empty() => {
                    let settles = o.state.is_some_and(policies::TaskState::is_settled);
                    self.on_observation(ctx, o);
                    let exhausted = ctx.budget.as_deref().and_then(ChildBudget::stopped);
                    if let (true, Some(by), Some(id), Some(b)) =
                        (settles, exhausted, &ctx.task_id, &ctx.budget)
                    {
                        let ev = b.failure_event(
                            binding,
                            ctx.rpc_id.as_ref(),
                            id,
                            ctx.context_id.as_deref(),
                            &by,
                        );
                        replace = Some((prev_end, ev));
                        break;
                    }
                }
                Ok(_) => {}
                Err(reason) => unreadable_event(ctx, reason),
            }
            if let Some(end) = end {
                prev_end = base + end;
            }
        }
        if replace.is_none() && base == 0 && last == Some(chunk.len()) && !end_of_stream {
            *body = Some(chunk); // whole events only: pass as is
            return;
        }
        let mut all = std::mem::take(&mut ctx.sse_pending);
        all.extend_from_slice(&chunk);
        let mut out = match replace {
            Some((start, ev)) => {
                ctx.failure_sent = true;
                all.truncate(start);
                all.extend_from_slice(&ev);
                all
            }
            None => {
                let cut = match last {
                    Some(l) => base + l,
                    None => 0,
                };
                let held = all.len() - cut;
                if held > self.limits.max_sse_event || end_of_stream {
                    // Over the bound (the parser skips such an event too) or
                    // the end: release everything.
                    all
                } else {
                    ctx.sse_pending = all.split_off(cut);
                    all
                }
            }
        };
        if end_of_stream && !ctx.failure_sent {
            // The worker ended the stream without a settling event after the
            // cancel: the caller still gets the failure.
            let exhausted = ctx.budget.as_deref().and_then(ChildBudget::exhausted);
            if let (Some(by), Some(id), Some(b)) = (exhausted, &ctx.task_id, &ctx.budget) {
                if !ctx.seen.is_settled() {
                    out.extend_from_slice(&b.failure_event(
                        binding,
                        ctx.rpc_id.as_ref(),
                        id,
                        ctx.context_id.as_deref(),
                        &by,
                    ));
                    ctx.failure_sent = true;
                }
            }
        }
        *body = (!out.is_empty()).then(|| Bytes::from(out));
    }

    /// Observes a held blocking answer and, when the child was stopped for
    /// its budget, replaces the task's status with the budget-exhausted
    /// failure.
    fn answer_held_json(&self, ctx: &mut Ctx, held: Vec<u8>) -> Vec<u8> {
        let Some(binding) = ctx.binding else {
            return held;
        };
        let Some(obs) = observe::observe(binding, &held) else {
            metrics::UNTRACKED
                .with_label_values(&["bad_json_response"])
                .inc();
            return held;
        };
        let settles = obs.state.is_some_and(policies::TaskState::is_settled);
        self.on_observation(ctx, obs);
        let stopped = ctx.budget.as_deref().and_then(ChildBudget::stopped);
        let (true, Some(by), Some(id), Some(b)) = (settles, stopped, &ctx.task_id, &ctx.budget)
        else {
            return held;
        };
        let update = crate::budget::failure_update(
            id,
            ctx.context_id.as_deref(),
            &by,
            b.grant(),
            &b.spent(),
        );
        let Ok(mut doc) = serde_json::from_slice::<serde_json::Value>(&held) else {
            return held;
        };
        let result = if binding == Binding::Rest {
            &mut doc
        } else {
            &mut doc["result"]
        };
        let task = if result.get("task").is_some() {
            &mut result["task"]
        } else {
            result
        };
        if !task.is_object() {
            return held;
        }
        task["status"] = update["statusUpdate"]["status"].clone();
        ctx.failure_sent = true;
        serde_json::to_vec(&doc).unwrap_or(held)
    }

    fn rewrite_card(&self, session: &Session, ctx: &Ctx, held: Vec<u8>, jsonrpc: bool) -> Vec<u8> {
        let Some(route) = &ctx.route else { return held };
        let base = self.gateway_base(session, ctx);
        let rw = CardRewrite {
            worker_base_path: &ctx.worker_root,
            gateway_base: &base,
            worker_authority: route.addr.authority(),
        };
        let mut doc: serde_json::Value =
            serde_json::from_slice(&held).unwrap_or(serde_json::Value::Null);
        let card = if jsonrpc {
            doc.get_mut("result")
        } else {
            Some(&mut doc)
        };
        let result = match card {
            Some(card) => {
                // The card says whether the worker enforces leases itself
                // (a body that is no card says nothing).
                if card.is_object() {
                    let declares = card_declares(card, policies::lease::LEASE_EXTENSION_URI);
                    route
                        .card_declares_lease
                        .store(declares, std::sync::atomic::Ordering::Relaxed);
                }
                rw.card_value(card)
            }
            None => Ok(0),
        }
        .map(|n| {
            (
                if n > 0 {
                    serde_json::to_vec(&doc).unwrap_or_else(|_| held.clone())
                } else {
                    held.clone()
                },
                n,
            )
        });
        match result {
            Ok((out, n)) => {
                metrics::CARDS_REWRITTEN
                    .with_label_values(&[
                        &route.name,
                        if n > 0 { "rewritten" } else { "unchanged" },
                    ])
                    .inc();
                out
            }
            Err(e) => {
                metrics::CARDS_REWRITTEN
                    .with_label_values(&[&route.name, "unreadable"])
                    .inc();
                tracing::debug!(route = %route.name, error = ?e, "agent card passed through unchanged");
                held
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        let mut r = ResponseHeader::build(200, None).unwrap();
        r.insert_header("content-type", "application/a2a+json; charset=utf-8")
            .unwrap();
        assert!(is_json(&r) && !is_sse(&r));
        r.insert_header("content-type", "Text/Event-Stream")
            .unwrap();
        assert!(is_sse(&r) && !is_json(&r));
        r.insert_header("content-encoding", "gzip").unwrap();
        assert!(is_encoded(&r));
    }
}
