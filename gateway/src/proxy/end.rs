//! Stage 6, end: every request ends in `logging`, and here. The child's
//! budget is settled; a held lease is released; a WebSocket's tasks, or a
//! tracked stream that ended unsettled (the caller left, or the worker's
//! stream broke or ended early), go to the cascade, which decides with
//! `policies::cascade::decide`. Failures the gateway answers itself
//! (`fail_to_proxy`) are mapped here too.

use pingora::proxy::{FailToProxy, Session};
use pingora::{Error, ErrorSource, ErrorType};
use policies::cascade::Event;
use policies::failure::{Kind, Side};

use super::ctx::{Answer, Ctx};
use super::refusal::Refusal;
use super::Gateway;
use crate::a2a::{Binding, Call};
use crate::cascade::StreamEnd;
use crate::store::TaskKey;

impl Gateway {
    /// The request is over (`logging`): its parts settled, then its
    /// access-log line (`server.access_log`).
    pub(super) fn end(&self, session: &Session, e: Option<&Error>, ctx: &mut Ctx) {
        count(session, e, ctx);
        self.cancel_forwarded(session, e, ctx);
        let cascade = self.settle(e, ctx);
        if self.access_log {
            access_log(session, e, ctx, cascade);
        }
    }

    /// A caller's `CancelTask` the worker answered 2xx: the task's children
    /// follow its end ([`crate::tree`]; the worker is asked how the task
    /// ended, a JSON-RPC error being a 200 too).
    fn cancel_forwarded(&self, session: &Session, e: Option<&Error>, ctx: &Ctx) {
        if e.is_some()
            || ctx.req.method != Some(crate::a2a::A2aMethod::CancelTask)
            || !self.cascade.tree().linker().on
        {
            return;
        }
        let ok = session
            .response_written()
            .is_some_and(|r| r.status.is_success());
        let (true, Some(route), Some(id), Some(target)) = (
            ok,
            &ctx.route,
            ctx.req.task_id.as_deref(),
            self.cancel_target(ctx),
        ) else {
            return;
        };
        // (A CancelTask names no sent message: the worker is asked.)
        let key = TaskKey::new(&route.name, ctx.req.tenant.as_deref(), id);
        self.cascade.tree().ended(crate::tree::Ended {
            job: super::observe::job_for(ctx, route, key, target, "caller_cancel"),
            state: None,
        });
    }

    /// Settles what the request held; returns what the cascade was handed
    /// to judge (its event), if anything: its decision comes later.
    fn settle(&self, e: Option<&Error>, ctx: &mut Ctx) -> Option<&'static str> {
        if let (Some(own), Some(route)) = (ctx.times.own(e), &ctx.route) {
            route.proxy_time.observe(own.as_secs_f64());
        }
        if ctx.track.streaming() {
            crate::metrics::OPEN_STREAMS.dec();
        }
        if let Some(b) = ctx.budget.take() {
            // No task and the worker said no (or could not be reached): no
            // child started, so its reservation goes back.
            let upstream_failed = e.is_some_and(|e| *e.esource() == ErrorSource::Upstream);
            let t = &ctx.track;
            let refused = t.task_id.is_none()
                && !t.seen.message_only
                && (t.worker_refused || ctx.refusal.is_some() || upstream_failed);
            let running = match (&t.task_id, &ctx.route) {
                (Some(id), Some(route)) if !t.seen.is_settled() => Some(TaskKey::new(
                    &route.name,
                    ctx.req.tenant.as_deref(),
                    id.clone(),
                )),
                _ => None,
            };
            b.child.settle(&self.budgets, refused, running);
        }
        if let Answer::WebSocket(ws) = std::mem::take(&mut ctx.answer) {
            // Not an error to log (see `suppress_error_log`), but how a
            // socket ended is what one asks first when a caller saw it cut.
            tracing::debug!(error = ?e, "WebSocket session ended");
            let handed = ws.awaits_a_task()
                || ws
                    .tasks
                    .values()
                    .any(|t| !t.seen.is_settled() || t.watching);
            let upstream = e.is_some_and(|e| *e.esource() == ErrorSource::Upstream);
            self.ws_ended(ctx, *ws, e);
            return handed.then_some(if upstream {
                "stream_lost"
            } else {
                "caller_gone"
            });
        }
        let imposed_lease = ctx.lease.held.is_some();
        if let Some(key) = ctx.lease.held.take() {
            let asker = ctx.route.as_ref().map(|r| ctx.asker(r)).unwrap_or_default();
            self.leases.release(&key, &asker);
        }
        let end = self.stream_end(e, ctx, imposed_lease)?;
        let event = match end.event {
            Event::CallerGone => "caller_gone",
            _ => "stream_lost",
        };
        if policies::cascade::settled_at_end(&end.seen, end.was_watching) {
            // Kept, as the cascade would decide after reading the store:
            // no task spawned, no store call.
            crate::metrics::CASCADE_DECISIONS
                .with_label_values(&[&end.route, "keep_settled"])
                .inc();
            return Some(event);
        }
        let cascade = self.cascade.clone();
        crate::drain::spawn_work(async move { cascade.stream_ended(end).await });
        Some(event)
    }

    /// What the cascade must judge of a streaming call that ended, if
    /// anything: a streaming call answered without a stream (an error before
    /// it started), or that failed on the worker's side before a stream
    /// began, created nothing the gateway knows of; only a caller leaving
    /// before the answer may have left a task behind.
    fn stream_end(
        &self,
        e: Option<&Error>,
        ctx: &mut Ctx,
        imposed_lease: bool,
    ) -> Option<StreamEnd> {
        let route = ctx.route.clone()?;
        let streaming_call = (ctx.track.carried
            || ctx.track.guarded
            || ctx
                .req
                .method
                .is_some_and(crate::a2a::A2aMethod::is_streaming))
            && ctx.req.binding.is_some();
        let caller_left = e.is_some_and(|e| *e.esource() == ErrorSource::Downstream);
        if !streaming_call || (!ctx.track.streaming() && !caller_left) {
            return None;
        }
        // A stream that ended without an error ended either settled (the
        // decision keeps the task) or early (a loss): both are StreamLost.
        let event = if caller_left {
            Event::CallerGone
        } else {
            Event::StreamLost
        };
        let t = &mut ctx.track;
        if t.task_id.is_none() {
            if let Some(id) = ctx.req.task_id.take() {
                t.task_id = Some(id.into());
                t.seen.id_known = true;
            }
        }
        let target = self.cancel_target(ctx)?;
        Some(StreamEnd {
            route: route.name.clone(),
            policy: route.cfg.cascade,
            worker: ctx.worker_url().unwrap_or_else(|| route.cfg.worker.clone()),
            target,
            tenant: ctx.req.tenant.clone(),
            task_id: ctx.track.task_id.clone(),
            message_id: ctx.req.message_id.take(),
            sent_ms: ctx.req.received_ms,
            seen: ctx.track.seen,
            event,
            was_watching: ctx.track.watching,
            imposed_lease,
            cancel_headers: crate::cancel::cancel_headers(&route.cfg, &ctx.req.caller_headers),
            asker: ctx.asker(&route),
        })
    }

    /// Answers a request the proxy could not complete: a refusal decided
    /// while its body streamed, or a failure. A2A callers get the A2A error
    /// of their binding (a JSON-RPC caller never an empty 502); a caller
    /// whose connection is gone gets nothing.
    pub(super) async fn fail(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Ctx,
    ) -> FailToProxy {
        let (side, kind) = failure_of(e);
        let r = match ctx.refusal.take() {
            Some(r) => *r,
            None => match policies::failure::status(side, kind) {
                None => {
                    return FailToProxy {
                        error_code: 0,
                        can_reuse_downstream: false,
                    }
                }
                Some(status) if side == Side::Worker => {
                    // Passive health: no new sends to that replica until
                    // it passes a check.
                    if let (Some(r), Some(replica)) = (
                        ctx.route.as_ref().and_then(|r| r.replicas.as_ref()),
                        &ctx.req.replica,
                    ) {
                        r.failed(replica);
                    }
                    Refusal::WorkerFailed {
                        status,
                        why: worker_failure(e),
                    }
                }
                Some(status) => {
                    let _ = session.respond_error(status).await;
                    return FailToProxy {
                        error_code: status,
                        can_reuse_downstream: false,
                    };
                }
            },
        };
        r.count(ctx.route.as_ref().map(|r| &*r.name));
        let answer = r.render(ctx.req.binding, ctx.req.rpc_id.as_ref());
        let status = answer.status;
        let _ = write_error(session, answer).await;
        FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        }
    }
}

/// Counts the request as it ends: `a2agw_requests_total` by what it was and
/// the status class the caller got, and on its route the worker's time to
/// first byte and how the worker failed it, if it did.
fn count(session: &Session, e: Option<&Error>, ctx: &Ctx) {
    use crate::metrics::{Called, WorkerError};
    let called = match &ctx.call {
        Call::AgentCard => Called::AgentCard,
        Call::Rest { method, .. } => Called::Method(Binding::Rest, *method),
        Call::JsonRpcCandidate => match ctx.req.method {
            Some(m) => Called::Method(Binding::JsonRpc, m),
            None => Called::JsonRpcOther,
        },
        Call::Upgrade => Called::Upgrade,
        Call::Grpc { method: Some(m) } => Called::Method(Binding::Grpc, *m),
        Call::Grpc { method: None } | Call::Other => Called::Other,
    };
    let status = session.response_written().map(|r| r.status.as_u16());
    let Some(route) = &ctx.route else {
        crate::metrics::NO_ROUTE_REQUESTS.count_request(called, status);
        return;
    };
    let m = &route.metrics;
    if let Some(ttfb) = ctx.times.worker_ttfb() {
        m.worker_ttfb(ttfb);
    }
    if ctx.times.worker_status().is_some_and(|s| s >= 500) {
        m.worker_error(WorkerError::Status5xx);
    }
    if let Some(e) = e.filter(|e| *e.esource() == ErrorSource::Upstream) {
        m.worker_error(match e.etype() {
            ErrorType::ConnectTimedout
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::ReadTimedout
            | ErrorType::WriteTimedout => WorkerError::Timeout,
            ErrorType::ConnectRefused
            | ErrorType::ConnectNoRoute
            | ErrorType::ConnectError
            | ErrorType::TLSHandshakeFailure
            | ErrorType::TLSWantX509Lookup
            | ErrorType::InvalidCert
            | ErrorType::HandshakeError
            | ErrorType::SocketError
            | ErrorType::BindError
            | ErrorType::ConnectProxyFailure => WorkerError::Connect,
            ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed => {
                WorkerError::Reset
            }
            _ => WorkerError::Other,
        });
    }
    // Last: a request seen counted has its other series in already.
    m.count_request(called, status);
}

/// The request's access-log line, at `info` under the target
/// `a2agw::access`: its fields are read only when that target is enabled.
/// `cascade` is what the cascade was handed to judge (its decision comes
/// later, in `a2agw_cascade_decisions_total` and the cascade's own lines).
fn access_log(session: &Session, e: Option<&Error>, ctx: &Ctx, cascade: Option<&'static str>) {
    let req = session.req_header();
    let task = ctx.track.task_id.as_deref().or(ctx.req.task_id.as_deref());
    let error_side = e.map(|e| match e.esource() {
        ErrorSource::Upstream => "worker",
        ErrorSource::Downstream => "caller",
        ErrorSource::Internal | ErrorSource::Unset => "gateway",
    });
    tracing::info!(
        target: "a2agw::access",
        route = ctx.route.as_ref().map(|r| &*r.name),
        http_method = req.method.as_str(),
        path = req.uri.path(),
        method = ctx.req.method.map(crate::a2a::A2aMethod::as_str),
        binding = ctx
            .req
            .binding
            .map(Binding::as_str)
            .or(matches!(ctx.call, Call::Upgrade).then_some("websocket")),
        tenant = ctx.req.tenant.as_deref(),
        caller = ctx.req.caller.as_ref().map(|c| c.shown.as_str()),
        task,
        status = session.response_written().map(|r| r.status.as_u16()),
        duration_ms = ctx
            .times
            .since_head()
            .map(|d| d.as_secs_f64() * 1000.0),
        bytes_in = session.body_bytes_read() as u64,
        bytes_out = session.body_bytes_sent() as u64,
        cascade,
        error = e.map(|e| e.etype().as_str()),
        error_side,
        "request"
    );
}

/// Which side failed, and how (the input of `policies::failure::status`).
fn failure_of(e: &Error) -> (Side, Kind) {
    let side = match e.esource() {
        ErrorSource::Upstream => Side::Worker,
        ErrorSource::Downstream => Side::Caller,
        ErrorSource::Internal | ErrorSource::Unset => Side::Gateway,
    };
    let kind = match e.etype() {
        ErrorType::HTTPStatus(code) => Kind::Status(*code),
        ErrorType::ConnectTimedout
        | ErrorType::ReadTimedout
        | ErrorType::WriteTimedout
        | ErrorType::TLSHandshakeTimedout => Kind::Timeout,
        ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => Kind::Broken,
        _ => Kind::Other,
    };
    (side, kind)
}

/// Why the worker failed, for the caller.
fn worker_failure(e: &Error) -> String {
    match e.etype() {
        ErrorType::ConnectTimedout => {
            "the worker did not accept the connection in time (timeouts.connect)".into()
        }
        ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            "the worker did not answer in time (timeouts.upstream_idle)".into()
        }
        ErrorType::TLSHandshakeTimedout => {
            "the TLS handshake with the worker did not finish in time".into()
        }
        t => format!(
            "the worker could not be reached or broke off ({})",
            t.as_str()
        ),
    }
}

/// Writes an error answer unless a response was already written (then the
/// connection is only closed); the caller's connection is not reused.
async fn write_error(session: &mut Session, answer: super::refusal::Answer) -> pingora::Result<()> {
    let (resp, body) = answer.parts()?;
    session.write_error_response(resp, body).await
}
