//! Stage 5, observe: the worker's answer, read as it passes.
//!
//! `response_filter` chooses how the answer is read ([`Answer`]): SSE
//! events, one JSON document, a budgeted child's answer held whole, an
//! agent card to rewrite, or WebSocket frames. Every reader turns what it
//! reads into the same [`Observation`]; what follows from one (record the
//! task, count a watcher, start or hold a lease, a poll lease for a
//! non-blocking send's task included, tell the budget) is decided
//! by `policies::track` and applied by [`Gateway::first_sight`] and
//! [`Gateway::settled`], for HTTP and WebSocket alike. Synchronous: store
//! updates go to the tracker, nothing here awaits.

use std::sync::Arc;

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;
use policies::track::{FirstSight, LeaseRules, LeaseStart, Shape};
use policies::TaskState;

use super::ctx::{Answer, Ctx};
use super::ws_session::WsSession;
use super::{stop_awaiting_id, Gateway};
use crate::a2a::grpc::{self, GrpcFrames, GrpcItem};
use crate::a2a::sse::{SseItem, SseParser};
use crate::a2a::{observe, Binding, Call, Observation};
use crate::cancel::{cancel_headers, CancelJob};
use crate::metrics::{self, Untracked};
use crate::route::Route;
use crate::store::{Asker, CancelTarget, TaskKey, TaskUpdate};

/// The gateway's own call about `key`'s task for this request, made for
/// `cause`: to the replica the request went to, where its cancel goes
/// (`target`), with the caller's headers a cancel repeats, and its sent
/// message.
pub(super) fn job_for(
    ctx: &Ctx,
    route: &Route,
    key: TaskKey,
    target: CancelTarget,
    cause: &'static str,
) -> CancelJob {
    CancelJob {
        key,
        worker: ctx.worker_url().unwrap_or_else(|| route.cfg.worker.clone()),
        target,
        headers: cancel_headers(&route.cfg, &ctx.req.caller_headers),
        cause,
        message_id: ctx.req.message_id.clone(),
    }
}

/// A route's lease rules, as `policies::track` reads them.
pub fn lease_rules(route: &Route) -> LeaseRules {
    LeaseRules {
        enforces_grants: route.gateway_enforces_leases(),
        impose_ttl_ms: route.cfg.lease.impose_ttl.map(|t| t.as_millis() as u64),
        poll_ttl_ms: route.cfg.lease.poll_ttl.map(|t| t.as_millis() as u64),
        cascade: route.cfg.cascade.mode,
        records_settled_sends: route.replicas.is_some(),
    }
}

/// The call a task is first seen through, who made it, and where its
/// cancel goes: a send's
/// verified caller owns the task it starts ([`policies::owner`]).
pub(super) struct By {
    pub shape: Shape,
    pub asker: Asker,
    /// The worker replica the request went to (routes with several).
    pub replica: Option<String>,
    /// Where a cancel of the task goes.
    pub target: Option<CancelTarget>,
    /// The sent message, for a send that started the task.
    pub message_id: Option<String>,
}

impl Gateway {
    /// Applies the first sight of a task (see `policies::track::first_sight`).
    pub(super) fn first_sight(
        &self,
        route: &Route,
        key: &TaskKey,
        sight: &FirstSight,
        state: Option<TaskState>,
        context_id: Option<String>,
        by: By,
    ) {
        metrics::TASKS_TRACKED
            .with_label_values(&[&route.name])
            .inc();
        let tracker = self.cascade.tracker();
        let recorded = sight.record.then(|| TaskUpdate {
            context_id,
            state,
            target: by.target,
            watchers_delta: i32::from(sight.watch),
            // A send's verified caller owns the task it starts.
            owner: matches!(by.shape, Shape::Send | Shape::Stream)
                .then(|| by.asker.as_policy().owner().map(str::to_owned))
                .flatten(),
            asker: by.asker.clone(),
            replica: by.replica,
            pin_context: route.replicas.is_some(),
            message_id: by.message_id,
        });
        if let Some(u) = &recorded {
            tracker.update(key.clone(), u.clone());
        }
        if let Some(start) = sight.lease {
            metrics::LEASES_STARTED
                .with_label_values(&[&route.name, start.kind()])
                .inc();
            let (ttl_ms, holder) = match start {
                LeaseStart::Granted { ttl_ms } => (ttl_ms, None),
                LeaseStart::Imposed { ttl_ms } => {
                    (ttl_ms, Some(self.leases.replica_id().to_string()))
                }
                // Renewed by the caller's polls on any replica; marked so
                // that its lapse is probed before the cancel.
                LeaseStart::Poll { ttl_ms } => {
                    (ttl_ms, Some(policies::lease::POLL_HOLDER.to_string()))
                }
            };
            tracker.lease_start(key.clone(), ttl_ms, holder, by.asker.clone());
        }
        if let Some(ttl) = sight.hold_ms {
            self.leases
                .hold(key.clone(), ttl, by.asker.clone(), recorded);
        }
    }

    /// A task already seen has settled: the store learns it (once); with
    /// `unwatch`, the stream of that asker stops counting as its watcher in
    /// the same write (`policies::track::unwatches_at_settle`).
    pub(super) fn settled(&self, key: TaskKey, state: Option<TaskState>, unwatch: Option<Asker>) {
        let (watchers_delta, asker) = match unwatch {
            Some(asker) => (-1, asker),
            None => (0, Asker::default()),
        };
        self.cascade.tracker().update(
            key,
            TaskUpdate {
                state,
                watchers_delta,
                asker,
                ..TaskUpdate::default()
            },
        );
    }

    /// Chooses how the answer is read from its head. Encoded (compressed)
    /// answers pass through unread.
    pub(super) fn choose_reader(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if matches!(ctx.call, Call::Upgrade) {
            if resp.status.as_u16() == 101 {
                ctx.answer =
                    Answer::WebSocket(Box::new(WsSession::new(self.limits.max_inspect_body)));
            }
            return Ok(());
        }
        if !resp.status.is_success() {
            ctx.track.worker_refused = true;
        }
        // HEAD answers have no body to rewrite.
        let ok = resp.status.is_success() && session.req_header().method != http::Method::HEAD;
        let card = matches!(ctx.call, Call::AgentCard)
            || ctx
                .req
                .method
                .is_some_and(crate::a2a::A2aMethod::returns_card);
        if card && ok && is_json(resp) {
            if is_encoded(resp) {
                Untracked::EncodedCard.count();
                return Ok(());
            }
            resp.remove_header(&http::header::CONTENT_LENGTH);
            resp.remove_header(&http::header::ETAG);
            resp.insert_header("transfer-encoding", "chunked")?;
            ctx.answer = Answer::Card {
                held: Vec::new(),
                jsonrpc: ctx.req.binding == Some(Binding::JsonRpc),
            };
            return Ok(());
        }
        let Some(shape) = ctx.tracked_shape() else {
            stop_awaiting_id(session, ctx);
            return Ok(());
        };
        if is_encoded(resp) {
            Untracked::EncodedResponse.count();
            stop_awaiting_id(session, ctx);
            return Ok(());
        }
        if let (Some(Binding::Grpc), Some(method)) = (ctx.req.binding, ctx.req.method) {
            // A trailers-only answer carries its error in the head.
            if grpc_status(&resp.headers).is_some_and(|s| s != 0) {
                ctx.track.worker_refused = true;
            }
            if crate::a2a::content_type_starts_with(&resp.headers, "application/grpc") {
                ctx.answer =
                    Answer::Grpc(Box::new(GrpcFrames::new(self.limits.max_sse_event)), method);
                ctx.track.shape = Some(streamed(shape));
            }
            return Ok(());
        }
        if is_sse(resp) {
            ctx.answer = Answer::Sse(SseParser::new(self.limits.max_sse_event));
            ctx.track.shape = Some(streamed(shape));
            return Ok(());
        }
        stop_awaiting_id(session, ctx);
        if !is_json(resp) {
            return Ok(());
        }
        ctx.track.shape = Some(Shape::Send);
        if ctx.budget.is_some() && resp.status.is_success() {
            resp.remove_header(&http::header::CONTENT_LENGTH);
            resp.insert_header("transfer-encoding", "chunked")?;
            ctx.answer = Answer::HeldJson(Vec::new());
        } else {
            ctx.answer = Answer::Json(Vec::new());
        }
        Ok(())
    }

    /// Reads one chunk of the answer with the reader chosen for it.
    pub(super) fn read_answer(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) {
        match std::mem::take(&mut ctx.answer) {
            Answer::Pass => {}
            Answer::WebSocket(mut ws) => {
                if let Some(chunk) = body.as_ref() {
                    self.ws_worker_bytes(ctx, &mut ws, chunk);
                }
                ctx.answer = Answer::WebSocket(ws);
            }
            Answer::Sse(mut parser) if ctx.budget.is_some() => {
                self.budgeted_sse(ctx, &mut parser, body, end_of_stream);
                ctx.answer = Answer::Sse(parser);
                self.check_id_wait(session, ctx);
            }
            Answer::Sse(mut parser) => {
                if let (Some(chunk), Some(binding)) = (body.as_ref(), ctx.req.binding) {
                    // Each event is acted on as the parser finds it, its
                    // strings borrowed from the parser: nothing is allocated
                    // per event. An event that can change nothing is not
                    // read (`policies::track::reads_event`); the chunk is
                    // searched for what may settle once, not each event.
                    let mut scan = observe::SettleScan::new(chunk);
                    parser.feed(chunk, |item| match item {
                        SseItem::Event { data, .. }
                            if !policies::track::reads_event(
                                &ctx.track.seen,
                                ctx.budget.is_some(),
                                || scan.may_settle(data),
                            ) => {}
                        SseItem::Event { data, .. } => match observe::observe(binding, data) {
                            Some(o) if !o.is_empty() => self.observed(ctx, o),
                            Some(_) => {}
                            None => unreadable_event(ctx, Untracked::BadSseEvent),
                        },
                        SseItem::Overlong => unreadable_event(ctx, Untracked::SseEventTooLarge),
                    });
                }
                ctx.answer = Answer::Sse(parser);
                self.check_id_wait(session, ctx);
            }
            Answer::Grpc(mut frames, method) if ctx.budget.is_some() => {
                self.budgeted_grpc(ctx, &mut frames, method, body, end_of_stream);
                ctx.answer = Answer::Grpc(frames, method);
            }
            Answer::Grpc(mut frames, method) => {
                if let Some(chunk) = body.as_ref() {
                    frames.feed(chunk, |item| match item {
                        GrpcItem::Message(m) => match grpc::observe(method, m) {
                            Some(o) if !o.is_empty() => self.observed(ctx, o),
                            Some(_) => {}
                            None => unreadable_event(ctx, Untracked::BadGrpcMessage),
                        },
                        GrpcItem::Compressed(_) => {
                            unreadable_event(ctx, Untracked::CompressedGrpcMessage)
                        }
                        GrpcItem::Overlong => unreadable_event(ctx, Untracked::GrpcMessageTooLarge),
                        GrpcItem::Skipped(_) => {}
                    });
                }
                ctx.answer = Answer::Grpc(frames, method);
            }
            Answer::Json(mut buf) => {
                if let Some(chunk) = body.as_ref() {
                    if buf.len() + chunk.len() > self.limits.max_inspect_body {
                        Untracked::ResponseBodyTooLarge.count();
                        return;
                    }
                    buf.extend_from_slice(chunk);
                }
                if !end_of_stream {
                    ctx.answer = Answer::Json(buf);
                    return;
                }
                if let Some(binding) = ctx.req.binding {
                    match observe::observe(binding, &buf) {
                        Some(o) => self.observed(ctx, o),
                        None => Untracked::BadJsonResponse.count(),
                    }
                }
            }
            Answer::HeldJson(held) => {
                let limit = self.limits.max_inspect_body;
                match hold(
                    held,
                    body,
                    end_of_stream,
                    limit,
                    Untracked::ResponseBodyTooLarge,
                ) {
                    Held::More(held) => ctx.answer = Answer::HeldJson(held),
                    Held::Whole(held) => {
                        *body = Some(Bytes::from(self.answer_held_json(ctx, held)));
                    }
                    Held::Released => {}
                }
            }
            Answer::Card { held, jsonrpc } => {
                let limit = self.limits.max_card_body;
                match hold(held, body, end_of_stream, limit, Untracked::CardTooLarge) {
                    Held::More(held) => ctx.answer = Answer::Card { held, jsonrpc },
                    Held::Whole(held) => {
                        *body = Some(Bytes::from(self.rewrite_card(session, ctx, held, jsonrpc)));
                    }
                    Held::Released => {}
                }
            }
        }
    }

    /// Applies one observation of an HTTP answer to the request's task.
    pub(super) fn observed(&self, ctx: &mut Ctx, mut obs: Observation<'_>) {
        let Some(route) = ctx.route.clone() else {
            return;
        };
        let t = &mut ctx.track;
        if obs.message_only && !t.seen.id_known {
            t.seen.message_only = true;
        }
        if obs.error && t.task_id.is_none() {
            t.worker_refused = true;
        }
        // Only a budget's failure event needs the context id.
        if t.context_id.is_none() && ctx.budget.is_some() {
            t.context_id = obs.context_id.as_deref().map(str::to_owned);
        }
        let spent = obs.spent.take();
        let settles = obs.state.is_some_and(TaskState::is_settled);
        let Some(id) = obs.task_id else { return };
        let was_settled = t.seen.is_settled();
        if let Some(s) = obs.state {
            t.seen.state = Some(s);
            t.seen.unsure = false;
        }
        match t.task_id.clone() {
            None => {
                let id: Arc<str> = id.into();
                t.task_id = Some(id.clone());
                t.seen.id_known = true;
                let shape = t.shape.unwrap_or(Shape::Send);
                let sight = policies::track::first_sight_polled(
                    shape,
                    t.seen.state,
                    ctx.lease.grant,
                    ctx.lease.poll_ms,
                    &lease_rules(&route),
                );
                let settled = t.seen.is_settled();
                t.watching = sight.watch;
                let key = TaskKey::new(&route.name, ctx.req.tenant.as_deref(), id.clone());
                let target = self.cancel_target(ctx);
                self.first_sight(
                    &route,
                    &key,
                    &sight,
                    ctx.track.seen.state,
                    obs.context_id.map(std::borrow::Cow::into_owned),
                    By {
                        shape,
                        asker: ctx.asker(&route),
                        replica: ctx.replica_name(),
                        target: target.clone(),
                        message_id: ctx.req.message_id.clone(),
                    },
                );
                if sight.hold_ms.is_some() {
                    ctx.lease.held = Some(Box::new(key.clone()));
                }
                if let (Some(b), Some(target)) = (&ctx.budget, target) {
                    let job = job_for(ctx, &route, key, target, "budget_exhausted");
                    b.child.task_known(&self.budgets, &id, job, settled);
                }
            }
            Some(id) => {
                if policies::track::records_settling(was_settled, t.seen.state) {
                    let key = TaskKey::new(&route.name, ctx.req.tenant.as_deref(), id);
                    let unwatch = policies::track::unwatches_at_settle(
                        ctx.track.watching,
                        ctx.track.seen.state,
                    )
                    .then(|| ctx.asker(&route));
                    if unwatch.is_some() {
                        ctx.track.watching = false;
                    }
                    self.settled(key, ctx.track.seen.state, unwatch);
                }
            }
        }
        if !was_settled {
            if let Some(s) = ctx.track.seen.state.filter(|s| s.is_terminal()) {
                self.parent_ended(ctx, &route, s);
            }
        }
        if let (Some(spent), Some(b)) = (spent, ctx.budget.as_deref_mut()) {
            if let crate::budget::Verdict::Exhausted(by) =
                b.child.on_spent(&self.budgets, spent, settles)
            {
                tracing::debug!(route = %route.name, task = ?ctx.track.task_id, by = by.as_str(), "reported spend passed the grant");
            }
        }
    }

    /// The request's task was seen to end in `state`: its children follow,
    /// where the route's policy says ([`crate::tree`]). Spawns nothing for
    /// an end that cancels no child (a completed parent, by default).
    pub(super) fn parent_ended(&self, ctx: &Ctx, route: &Route, state: TaskState) {
        if !self.cascade.tree().linker().on
            || policies::delegation::on_parent_end(state, route.cfg.on_parent_completed).is_none()
        {
            return;
        }
        let (Some(id), Some(target)) = (ctx.track.task_id.clone(), self.cancel_target(ctx)) else {
            return;
        };
        let key = TaskKey::new(&route.name, ctx.req.tenant.as_deref(), id);
        self.cascade.tree().ended(crate::tree::Ended {
            job: job_for(ctx, route, key, target, "observed"),
            state: Some(state),
        });
    }

    /// Where a cancel for this request's task goes: the JSON-RPC endpoint
    /// the caller used, or the REST base path below which the call's route sits.
    pub(super) fn cancel_target(&self, ctx: &Ctx) -> Option<CancelTarget> {
        Some(match ctx.req.binding? {
            b @ (Binding::JsonRpc | Binding::WebSocket) => CancelTarget {
                binding: b,
                path: endpoint(ctx).to_string(),
            },
            Binding::Rest => CancelTarget {
                binding: Binding::Rest,
                path: ctx.req.worker_root.clone(),
            },
            // The service's path is fixed.
            Binding::Grpc => CancelTarget {
                binding: Binding::Grpc,
                path: String::new(),
            },
        })
    }

    /// Ends the id wait once an event named the task, the task settled, or
    /// `id_wait` passed.
    fn check_id_wait(&self, session: &mut Session, ctx: &mut Ctx) {
        if let (Some(since), Some(route)) = (ctx.track.awaiting_id, &ctx.route) {
            let waited_enough = since.elapsed() >= route.cfg.cascade.id_wait;
            if ctx.track.seen.id_known || ctx.track.seen.is_settled() || waited_enough {
                stop_awaiting_id(session, ctx);
            }
        }
    }
}

/// The shape of a call whose answer is a stream of messages (SSE events,
/// gRPC messages): a stream's own, counted open; else a send's (a blocking
/// send answered with one message).
fn streamed(shape: Shape) -> Shape {
    if shape.is_stream() {
        metrics::OPEN_STREAMS.inc();
        shape
    } else {
        Shape::Send
    }
}

/// A gRPC answer's `grpc-status` (in its trailers, or the head of a
/// trailers-only answer).
pub fn grpc_status(headers: &http::HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The worker path the request went to, without its query.
pub fn endpoint(ctx: &Ctx) -> &str {
    ctx.req.upstream_path.split('?').next().unwrap_or("")
}

/// An SSE event the gateway could not read (over `max_sse_event`, or not an
/// A2A document): counted; if it carried the settling state, the cascade
/// must not take the stream's end for a caller abandoning a running task, so
/// the state seen so far is marked unsure (`Seen::unsure`).
pub fn unreadable_event(ctx: &mut Ctx, reason: Untracked) {
    reason.count();
    ctx.track.seen.unsure = true;
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

/// Adds this chunk to `held`, releasing everything unchanged (and counting
/// `too_large`) once it is over `limit`.
fn hold(
    mut held: Vec<u8>,
    body: &mut Option<Bytes>,
    end_of_stream: bool,
    limit: usize,
    too_large: Untracked,
) -> Held {
    if let Some(chunk) = body.take() {
        held.extend_from_slice(&chunk);
    }
    if held.len() > limit {
        too_large.count();
        *body = Some(Bytes::from(held));
        return Held::Released;
    }
    if end_of_stream {
        Held::Whole(held)
    } else {
        Held::More(held)
    }
}

pub(super) fn is_sse(resp: &ResponseHeader) -> bool {
    crate::a2a::sse::is_event_stream(&resp.headers)
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

fn is_encoded(resp: &ResponseHeader) -> bool {
    resp.headers
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"))
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
