//! The pingora service: one [`ProxyHttp`] implementation whose hooks only
//! call the stages below, in this order (see `docs/architecture.md`):
//!
//! 1. **classify** (`request_filter`): route, A2A call, worker path
//!    ([`classify`]);
//! 2. **inspect** (`request_filter` for small bodies, `request_body_filter`
//!    for large ones): what the body says ([`inspect`]);
//! 3. **admit**: `policies`' verdicts on its grants, renewals ([`admit`]);
//! 4. **inject** (`upstream_request_filter`): the head the worker gets
//!    ([`inject`]);
//! 5. **observe** (`response_filter`, `response_body_filter`): the answer
//!    read into observations and their effects ([`observe`], with
//!    [`budget_answer`], [`card`], [`websocket`]);
//! 6. **end** (`logging`, `fail_to_proxy`): budgets settled, leases
//!    released, the cascade handed what it must judge ([`end`]).
//!
//! Anything the gateway answers itself is a [`refusal::Refusal`]. Hooks never
//! await the store on the response path.

mod admit;
mod budget_answer;
mod card;
mod carry;
mod classify;
mod ctx;
mod end;
pub mod http1;
mod inject;
mod inspect;
mod observe;
pub mod refusal;
pub mod timing;
mod websocket;
mod ws_session;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType, Result};

pub use ctx::Ctx;
use ctx::{Answer, RequestBody};
use refusal::Refusal;

use crate::a2a::{A2aMethod, Call};
use crate::budget::Budgets;
use crate::cascade::Cascade;
use crate::lease::Leases;
use crate::route::LiveRoutes;
use crate::store::{StoreHealth, TaskStore};

/// The gateway's proxy service.
#[derive(Debug)]
pub struct Gateway {
    /// Swapped by a reload; a request keeps the route it matched.
    routes: Arc<LiveRoutes>,
    limits: config::Limits,
    timeouts: config::Timeouts,
    public_url: Option<String>,
    cascade: Arc<Cascade>,
    leases: Arc<Leases>,
    store: Arc<dyn TaskStore>,
    health: Arc<StoreHealth>,
    on_store_error: config::OnStoreError,
    budgets: Arc<Budgets>,
    /// Blocking sends carried as streams: the gateway's own connections.
    carrier: carry::Carrier,
    /// `server.access_log`: one line per request as it ends.
    access_log: bool,
}

/// Bodies up to this size are read before the worker is contacted, so that a
/// refused request never reaches it (pingora replays them from its retry
/// buffer, which holds this much). Larger bodies are inspected as they pass.
const PRE_READ_LIMIT: usize = 64 * 1024;

impl Gateway {
    pub fn new(
        cfg: &config::Config,
        routes: Arc<LiveRoutes>,
        cascade: Arc<Cascade>,
        leases: Arc<Leases>,
        store: Arc<dyn TaskStore>,
        health: Arc<StoreHealth>,
        budgets: Arc<Budgets>,
    ) -> Self {
        let carrier = carry::Carrier::new(cascade.worker_client());
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
            carrier,
            access_log: cfg.server.access_log,
        }
    }

    /// Answers a refused request itself; nothing reaches the worker.
    async fn answer_refusal(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let Some(r) = ctx.refusal.take() else {
            return Ok(false);
        };
        r.count(ctx.route.as_ref().map(|r| &*r.name));
        stop_awaiting_id(session, ctx);
        r.render(ctx.req.binding, ctx.req.rpc_id.as_ref())
            .write(session)
            .await?;
        Ok(true)
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
    if ctx.track.awaiting_id.take().is_some() {
        session.set_abort_on_close(true);
    }
}

/// Where the store says a request's task or context runs.
enum Affinity {
    /// On this replica of the route.
    Replica(Arc<crate::replicas::Replica>),
    /// The store knows neither the task nor the context (yet).
    Unknown,
    /// Nothing to look up, the store failed, or the replica is gone.
    None,
}

impl Gateway {
    /// The replica a request goes to on a route with several `workers`: a
    /// call bound to a task the store knows goes to the replica recorded
    /// with it, a send naming no task but a known `contextId` to the
    /// replica of that context's first task (one store read each); anything
    /// else (a new send, a task or context never seen) is balanced. A miss
    /// is looked up once more after this replica's queued store updates
    /// are applied, so that a call right behind the answer that named its
    /// task finds it. A task whose replica the route no longer has is
    /// counted lost and the call balanced: the caller gets that worker's
    /// own answer (not found), never the gateway's guess.
    pub(super) async fn replica_for(
        &self,
        ctx: &Ctx,
        route: &crate::route::Route,
        replicas: &crate::replicas::Replicas,
    ) -> Option<Arc<crate::replicas::Replica>> {
        match self.affinity(ctx, route, replicas).await {
            Affinity::Replica(r) => return Some(r),
            Affinity::Unknown => {
                self.cascade.tracker().flush().await;
                if let Affinity::Replica(r) = self.affinity(ctx, route, replicas).await {
                    return Some(r);
                }
            }
            Affinity::None => {}
        }
        // Nothing looked up yet (the first requests after a start or a
        // reload): look now.
        replicas.checked_once().await;
        replicas.pick().or_else(|| replicas.first())
    }

    /// One look at the store for [`Self::replica_for`].
    async fn affinity(
        &self,
        ctx: &Ctx,
        route: &crate::route::Route,
        replicas: &crate::replicas::Replicas,
    ) -> Affinity {
        if let Some(id) = &ctx.req.task_id {
            let key =
                crate::store::TaskKey::new(&route.name, ctx.req.tenant.as_deref(), id.as_str());
            let rec = match self.store.get(&key).await {
                Ok(rec) => rec,
                Err(e) => {
                    crate::metrics::STORE_ERRORS
                        .with_label_values(&["get"])
                        .inc();
                    tracing::warn!(route = %route.name, task = %key, error = %e, "the store did not say which worker replica runs the task: the call is balanced");
                    return Affinity::None;
                }
            };
            let Some(name) = rec.and_then(|r| r.replica) else {
                return Affinity::Unknown;
            };
            let found = replicas.find_known(&name).await;
            if found.is_none() {
                crate::replicas::lost(&key, Some(&name));
                tracing::info!(route = %route.name, task = %key, replica = %name, "a call for a task whose worker replica the route no longer has: balanced (a worker answers for itself)");
            }
            found.map_or(Affinity::None, Affinity::Replica)
        } else if let (Some(context), true) = (&ctx.req.context_id, ctx.req.is_send()) {
            // A send continuing a conversation: where its first task runs.
            let name = match self.store.context_replica(&route.name, context).await {
                Ok(Some(name)) => name,
                Ok(None) => return Affinity::Unknown,
                Err(e) => {
                    crate::metrics::STORE_ERRORS
                        .with_label_values(&["context_replica"])
                        .inc();
                    tracing::warn!(route = %route.name, context = %context, error = %e, "the store did not say which worker replica holds the context: the send is balanced");
                    return Affinity::None;
                }
            };
            let found = replicas.find_known(&name).await;
            if found.is_none() {
                tracing::info!(route = %route.name, context = %context, replica = %name, "a send continuing a context whose worker replica the route no longer has: balanced");
            }
            found.map_or(Affinity::None, Affinity::Replica)
        } else {
            Affinity::None
        }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: pingora keeps the CTX inside each request's future and copies
    /// that future whole when it boxes it; a pointer there instead of the
    /// whole `Ctx` copies less on every request.
    type CTX = Box<Ctx>;

    fn new_ctx(&self) -> Box<Ctx> {
        Box::default()
    }

    /// Classify, then (small bodies) inspect and admit before the worker is
    /// asked.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        ctx.times.head();
        crate::trace::start(session, &mut ctx.trace);
        let mut pre_read = None;
        match self.classify(session, ctx) {
            Err(r) => ctx.refuse(r),
            // Everything is in the head: its tenant is judged now (a body
            // read is judged with the rest of its call, in `admit`).
            Ok(classify::Next::Forward) => {
                if let Some(r) = Self::tenant_refusal(ctx) {
                    ctx.refuse(r);
                }
            }
            Ok(classify::Next::ReadBody) => pre_read = self.read_body(session, ctx).await?,
        }
        // The rare paths' futures are boxed: pingora boxes this hook's
        // future on every request, copying it whole, so a large state kept
        // inline for a path few requests take costs every request.
        if ctx.refusal.is_some() {
            return Box::pin(self.answer_refusal(session, ctx)).await;
        }
        // A blocking send the gateway carries as a stream: answered here.
        if let Some(plan) = self.carry_plan(ctx, pre_read.as_deref()).await {
            return Box::pin(self.carry(session, ctx, plan)).await;
        }
        // REST GetTask and SubscribeToTask: everything is in the head.
        if matches!(ctx.call, Call::Rest { .. })
            && matches!(
                ctx.req.method,
                Some(A2aMethod::GetTask | A2aMethod::SubscribeToTask)
            )
        {
            self.renew_if_asked(ctx).await;
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
        if let Some(replicas) = &route.replicas {
            ctx.req.replica = Box::pin(self.replica_for(ctx, &route, replicas)).await;
        }
        let worker = match &ctx.req.replica {
            Some(r) => r.addr().clone(),
            None => route.addr.clone(),
        };
        let addr = match worker.get().await {
            Ok(a) => a,
            Err(why) => {
                ctx.refuse(Refusal::WorkerUnresolvable(why.clone()));
                return Err(Error::explain(ErrorType::ConnectNoRoute, why));
            }
        };
        let mut peer = worker.peer(addr, route.cfg.worker.tls);
        if ctx.req.grpc {
            // gRPC needs HTTP/2: prior knowledge (h2c) on a plain
            // connection, ALPN `h2` on TLS. Unary calls share connections
            // (`limits.worker_h2_streams`), streaming calls get one each.
            peer.options.set_http_version(2, 2);
            let sharing = policies::connection::h2_sharing(
                ctx.req.method.map(A2aMethod::is_streaming),
                self.limits.worker_h2_streams,
            );
            peer.options.max_h2_streams = sharing.streams;
            peer.options.h2_stream_window_size = Some(policies::connection::STREAM_WINDOW);
            peer.options.h2_connection_window_size = Some(sharing.connection_window);
        }
        peer.options.connection_timeout = Some(self.timeouts.connect);
        if !matches!(ctx.call, Call::Upgrade) {
            peer.options.read_timeout = self.timeouts.upstream_idle;
            peer.options.write_timeout = self.timeouts.upstream_idle;
        }
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        Ok(Box::new(peer))
    }

    /// Inject: the worker's path, host and headers.
    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        ctx.times.upstream();
        crate::trace::upstream(upstream, ctx.trace.as_deref());
        inject::upstream_head(upstream, ctx)?;
        self.delegation(upstream, ctx)
    }

    /// Inspect a large body as it passes (or hold it), and read a
    /// WebSocket's client frames.
    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if let Answer::WebSocket(mut ws) = std::mem::take(&mut ctx.answer) {
            let renewals = match body.as_ref() {
                Some(chunk) => self.ws_client_bytes(ctx, &mut ws, chunk),
                None => Vec::new(),
            };
            ctx.answer = Answer::WebSocket(ws);
            for (tenant, task) in renewals {
                self.renew(ctx, tenant.as_deref(), &task).await;
            }
            return Ok(());
        }
        if matches!(ctx.body, RequestBody::Pass) {
            return Ok(());
        }
        self.body_chunk(session, body, end_of_stream, ctx).await
    }

    /// Observe: choose how the answer is read.
    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        ctx.times.answer(resp);
        // Passive health: a replica answering that it cannot serve (502,
        // 503, 504: overloaded, shutting down, its own upstream gone)
        // takes no new sends until it passes a check. A 500 is an answer
        // about the call, not the replica.
        if let (502..=504, Some(r), Some(replica)) = (
            resp.status.as_u16(),
            ctx.route.as_ref().and_then(|r| r.replicas.as_ref()),
            &ctx.req.replica,
        ) {
            r.failed(replica);
        }
        self.choose_reader(session, resp, ctx)
    }

    /// Observe: read the answer as it passes. Synchronous: store updates go
    /// to the tracker.
    fn response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        self.read_answer(session, body, end_of_stream, ctx);
        crate::trace::task_known(
            &mut ctx.trace,
            &ctx::trace_facts(&ctx.route, &ctx.req, &ctx.track),
        );
        Ok(None)
    }

    /// Observe: a gRPC answer's trailers. A non-zero `grpc-status` before
    /// any task was named is the worker refusing the call.
    fn upstream_response_trailer_filter(
        &self,
        _session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if observe::grpc_status(trailers).is_some_and(|s| s != 0) && ctx.track.task_id.is_none() {
            ctx.track.worker_refused = true;
        }
        Ok(())
    }

    /// End: every request ends here.
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX) {
        crate::trace::end(
            session,
            e,
            &mut ctx.trace,
            &ctx::trace_facts(&ctx.route, &ctx.req, &ctx.track),
        );
        self.end(session, e, ctx);
    }

    /// End: a refusal decided while the body streamed, or a failure, answered
    /// in the caller's binding.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
    ) -> FailToProxy {
        self.fail(session, e, ctx).await
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Self::CTX, error: &Error) -> bool {
        // A caller leaving mid-stream is routine for a streaming proxy; the
        // cascade logs what it does about it.
        *error.esource() == ErrorSource::Downstream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `make` returns, without running it.
    fn future_size<A, F: std::future::Future>(_make: impl FnOnce(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What every request's `request_filter` future holds inline: pingora
    /// boxes that future on each request and copies it whole, so a rare
    /// path's large future belongs behind a `Box::pin` (reading a worker's
    /// card in `carry_plan` once made it 12.8 KB, 10% of a gRPC call's
    /// instructions in the gateway). Today: 136, 184 and 1,504 bytes.
    #[test]
    fn request_filter_steps_stay_small() {
        let carry_plan = future_size(|(g, c): (&Gateway, &mut Ctx)| g.carry_plan(c, None));
        let renew = future_size(|(g, c): (&Gateway, &Ctx)| g.renew_if_asked(c));
        let read_body =
            future_size(|(g, s, c): (&Gateway, &mut Session, &mut Ctx)| g.read_body(s, c));
        assert!(carry_plan < 1024, "carry_plan's future: {carry_plan} bytes");
        assert!(renew < 1024, "renew_if_asked's future: {renew} bytes");
        assert!(read_body < 2048, "read_body's future: {read_body} bytes");
    }
}
