//! Stage 2, inspect: what the request body says (JSON-RPC method and id,
//! tenant, task, lease and budget grants).
//!
//! One entry, [`Gateway::inspect_and_admit`], serves the three ways a body
//! is read: before the worker is asked (small bodies, [`Gateway::pre_read`]),
//! copied as it passes (large bodies where nothing is re-written), and held
//! whole (large bodies on budgeted routes). A body the gateway cannot read is
//! passed untracked, unless the route checks every send.

use bytes::Bytes;
use pingora::proxy::Session;
use pingora::Result;
use policies::budget::BudgetRefusal;
use policies::track::{BatchCall, SendChecks};

use super::ctx::{shape_of, Ctx, RequestBody};
use super::refusal::Refusal;
use super::{expects_continue, stop_awaiting_id, Gateway, PRE_READ_LIMIT};
use crate::a2a::json;
use crate::a2a::request::{
    diagnose, jsonrpc_batch, jsonrpc_facts, rest_facts, BodyFault, RequestFacts, SentGrant,
};
use crate::a2a::{Binding, Call};
use crate::metrics::Untracked;

/// What a body carried that admission judges.
#[derive(Debug, Default)]
pub struct Grants {
    /// The sent message's lease grant: its TTL, or why it is malformed.
    pub lease: Option<std::result::Result<u64, String>>,
    /// The sent message's budget grant, checked as the SDK's server does.
    pub budget: Option<std::result::Result<SentGrant, BudgetRefusal>>,
    /// The call is a v0.3 send (`message/send`, `message/stream`).
    pub v03_send: bool,
}

/// What the body said, or why it is refused.
type Inspected = std::result::Result<Option<Grants>, Refusal>;

/// Reads the facts out of a whole body into the context; the grants are
/// left for admission. On a route that checks sends (`Route::checks_sends`)
/// a body is read completely and unambiguously or refused: not UTF-8 JSON,
/// trailing bytes, a number out of range, a member policy reads given twice
/// ([`BodyFault`]). Elsewhere what cannot be read passes untracked.
fn inspect(ctx: &mut Ctx, buf: &[u8]) -> Inspected {
    let strict = ctx.route.as_ref().is_some_and(|r| r.checks_sends());
    let facts: RequestFacts = match ctx.call {
        Call::JsonRpcCandidate => match jsonrpc_facts(buf) {
            Some(f) => f,
            None => {
                if let Some(calls) = jsonrpc_batch(buf) {
                    return inspect_batch(ctx, &calls, strict).map(|()| None);
                }
                // A body that is JSON after all (no `method`, not an
                // object) is no call any worker runs: it passes.
                let fault = (strict && !json::is_blank(buf))
                    .then(|| diagnose(buf))
                    .flatten();
                if let Some(fault) = fault {
                    ctx.req.binding = Some(Binding::JsonRpc);
                    return Err(Refusal::Unreadable(fault));
                }
                Untracked::NotJsonrpc.count();
                return Ok(None);
            }
        },
        Call::Grpc { method: Some(m) } => {
            match crate::a2a::grpc::single_message(buf)
                .and_then(|msg| crate::a2a::grpc::request_facts(m, msg))
            {
                Some(f) => f,
                None if strict => return Err(Refusal::Unreadable(BodyFault::NotGrpcMessage)),
                None => {
                    Untracked::GrpcBadRequest.count();
                    return Ok(None);
                }
            }
        }
        Call::Rest { .. } => match rest_facts(buf) {
            Some(f) => f,
            None if strict => {
                return Err(Refusal::Unreadable(
                    diagnose(buf).unwrap_or(BodyFault::NotJson),
                ))
            }
            None => RequestFacts::default(),
        },
        _ => return Ok(None),
    };
    if facts.is_jsonrpc {
        ctx.req.binding = Some(Binding::JsonRpc);
        ctx.req.method = facts.method;
        ctx.req.rpc_id = facts.rpc_id;
    }
    if let (true, Some(key)) = (strict, facts.duplicate) {
        return Err(Refusal::Unreadable(BodyFault::DuplicateKey(key)));
    }
    if ctx.req.tenant.is_none() {
        ctx.req.tenant = facts.tenant;
    }
    if ctx.req.task_id.is_none() {
        ctx.req.task_id = facts.task_id;
    }
    if ctx.req.task_id.is_none() {
        ctx.req.context_id = facts.context_id;
    }
    let is_send = ctx.req.is_send();
    if ctx.req.task_id.is_none() && is_send {
        ctx.req.message_id = facts.message_id;
    }
    ctx.req.return_immediately = facts.return_immediately && is_send;
    Ok(Some(Grants {
        lease: facts.lease.filter(|_| is_send),
        budget: facts.budget.filter(|_| is_send),
        v03_send: facts.v03_send,
    }))
}

/// A JSON-RPC batch is proxied untracked, unless it holds a send whose
/// grants this route must read (`policies::track::batch_must_be_read`):
/// then it is refused whole, one error per call (an a2a-rust worker runs
/// the `SendMessage` calls of a batch).
fn inspect_batch(
    ctx: &mut Ctx,
    calls: &[Option<RequestFacts>],
    strict: bool,
) -> std::result::Result<(), Refusal> {
    ctx.req.binding = Some(Binding::JsonRpc);
    let Some(route) = &ctx.route else {
        return Ok(());
    };
    if let (true, Some(key)) = (strict, calls.iter().flatten().find_map(|f| f.duplicate)) {
        return Err(Refusal::Unreadable(BodyFault::DuplicateKey(key)));
    }
    let checks = SendChecks {
        budgeted: route.cfg.budget.is_active(),
        enforces_grants: route.gateway_enforces_leases(),
        imposes: route.cfg.lease.impose_ttl.is_some(),
        polls: route.cfg.lease.poll_ttl.is_some(),
    };
    let read: Vec<BatchCall> = calls
        .iter()
        .flatten()
        .map(|f| BatchCall {
            shape: f.method.and_then(shape_of),
            lease_grant: f.lease.is_some(),
            return_immediately: f.return_immediately,
        })
        .collect();
    if !policies::track::batch_must_be_read(&read, &checks) {
        Untracked::JsonrpcBatch.count();
        return Ok(());
    }
    let ids = calls
        .iter()
        .filter_map(|f| match f {
            // A notification (no id) gets no answer.
            Some(f) => f.rpc_id.clone(),
            None => Some(serde_json::Value::Null),
        })
        .collect();
    Err(Refusal::BatchSend { ids })
}

impl Gateway {
    /// The one inspection entry: reads the body, admits the call (see
    /// `admit`), and ends the id wait where no new task's stream can follow.
    /// `rewritable`: the body has not gone to the worker yet, so an admitted
    /// budget grant can be written into it. A refusal is left in the
    /// context for the caller's path to answer.
    pub(super) async fn inspect_and_admit(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        buf: &[u8],
        rewritable: bool,
    ) {
        match inspect(ctx, buf) {
            Err(r) => ctx.refuse(r),
            Ok(grants) => {
                // A linked child's budget is bounded by its parent's.
                if ctx.req.is_send() && ctx.req.task_id.is_none() {
                    if let Some(p) = self.parent_of(&session.req_header().headers) {
                        ctx.req.parent = crate::budget::ParentHint {
                            reference: Some(crate::link::hex(&p.reference)),
                            deadline_ms: p.deadline_ms,
                            metered: p.metered,
                        };
                    }
                }
                self.admit(ctx, grants.unwrap_or_default(), rewritable.then_some(buf))
                    .await;
            }
        }
        if ctx.refusal.is_some() {
            stop_awaiting_id(session, ctx);
            return;
        }
        self.renew_if_asked(ctx).await;
        let new_task_stream = ctx.req.method == Some(crate::a2a::A2aMethod::SendStreamingMessage)
            && ctx.req.task_id.is_none();
        if !new_task_stream {
            stop_awaiting_id(session, ctx);
        }
    }

    /// Chooses how the body is read, given its declared length: small ones
    /// now, before the worker is contacted, so a refused request never
    /// reaches it (pingora replays them upstream from its retry buffer);
    /// larger ones copied as they pass, or held whole where a budget may
    /// re-write them. Returns a body read before the worker was asked, as
    /// the worker is to get it (re-written if admission changed it).
    pub(super) async fn read_body(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> Result<Option<Bytes>> {
        let content_length = session
            .req_header()
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if ctx.req.grpc {
            self.pre_read_grpc(session, ctx).await?;
            return Ok(None);
        }
        let small =
            content_length.is_some_and(|n| n <= PRE_READ_LIMIT.min(self.limits.max_inspect_body));
        if small {
            return self.pre_read(session, ctx).await.map(Some);
        }
        let buf = Vec::with_capacity(
            content_length
                .unwrap_or(1024)
                .min(self.limits.max_inspect_body),
        );
        ctx.body = if ctx.route.as_ref().is_some_and(|r| r.cfg.budget.is_active()) {
            RequestBody::Hold(buf)
        } else {
            RequestBody::Copy(buf)
        };
        Ok(None)
    }

    /// Reads a small body before the worker is asked, and inspects it.
    async fn pre_read(&self, session: &mut Session, ctx: &mut Ctx) -> Result<Bytes> {
        // A caller that asked `Expect: 100-continue` waits for the go ahead
        // before it sends the body the gateway is about to read: give it
        // here (the worker, which would have, is not asked yet), and drop
        // the header on the way to the worker.
        if expects_continue(session.req_header()) {
            session.downstream_session.write_continue_response().await?;
            ctx.req.continued = true;
        }
        session.downstream_session.enable_retry_buffering();
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
        let body = first.unwrap_or_else(|| Bytes::from(joined));
        self.inspect_and_admit(session, ctx, &body, true).await;
        Ok(match &ctx.body {
            RequestBody::Replace(new) => new.clone(),
            _ => body,
        })
    }

    /// Reads a gRPC call's body before the worker is asked, and inspects
    /// it: a refusal is then answered before anything reaches the worker
    /// (over HTTP/2 a request refused while its body streams is not
    /// aborted, so gRPC bodies are never inspected on the way). HTTP/2
    /// gives no length up front: reading stops once more than
    /// [`GRPC_PRE_READ`] arrived, which pingora's retry buffer (64 KiB)
    /// still holds whole; the rest follows unread, and the call passes
    /// untracked, or is refused on a route that checks sends. The read
    /// part is replayed to the worker from the retry buffer.
    async fn pre_read_grpc(&self, session: &mut Session, ctx: &mut Ctx) -> Result<()> {
        session.downstream_session.enable_retry_buffering();
        let limit = GRPC_PRE_READ.min(self.limits.max_inspect_body);
        let mut body = Vec::new();
        while let Some(chunk) = session.read_request_body().await? {
            body.extend_from_slice(&chunk);
            if body.len() > limit {
                if ctx.route.as_ref().is_some_and(|r| r.checks_sends()) {
                    ctx.refuse(Refusal::BodyTooLarge { limit });
                } else {
                    Untracked::RequestBodyTooLarge.count();
                }
                return Ok(());
            }
        }
        // Rewritable: pingora replays the body from its retry buffer
        // through `request_body_filter`, which sends a re-written one
        // instead (`RequestBody::Replace`).
        self.inspect_and_admit(session, ctx, &body, true).await;
        Ok(())
    }

    /// A body passing to the worker (`request_body_filter`): copied or held
    /// (bounded) until its end, then inspected. A request refused on the
    /// way loses its last chunk and is aborted, so the worker never
    /// receives it whole.
    pub(super) async fn body_chunk(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let limit = self.limits.max_inspect_body;
        let hold = match &mut ctx.body {
            RequestBody::Pass => return Ok(()),
            RequestBody::Replace(new) => {
                // The pre-read body, replayed (again, if pingora retries a
                // reused upstream connection): the re-written one instead.
                *body = Some(new.clone());
                return Ok(());
            }
            RequestBody::Copy(buf) => {
                if let Some(chunk) = body.as_ref() {
                    if buf.len() + chunk.len() > limit {
                        ctx.body = RequestBody::Pass;
                        if ctx.route.as_ref().is_some_and(|r| r.checks_sends()) {
                            // What went ahead is not a whole request: the
                            // worker never receives this one whole.
                            *body = None;
                            return Err(too_large(ctx, limit));
                        }
                        Untracked::RequestBodyTooLarge.count();
                        stop_awaiting_id(session, ctx);
                        return Ok(());
                    }
                    buf.extend_from_slice(chunk);
                }
                false
            }
            RequestBody::Hold(buf) => {
                if let Some(chunk) = body.take() {
                    if buf.len() + chunk.len() > limit {
                        ctx.body = RequestBody::Pass;
                        return Err(too_large(ctx, limit));
                    }
                    buf.extend_from_slice(&chunk);
                }
                if !end_of_stream {
                    // Nothing goes out yet (pingora skips empty chunks).
                    *body = Some(Bytes::new());
                }
                true
            }
        };
        if !end_of_stream {
            return Ok(());
        }
        let (RequestBody::Copy(buf) | RequestBody::Hold(buf)) = std::mem::take(&mut ctx.body)
        else {
            return Ok(());
        };
        self.inspect_and_admit(session, ctx, &buf, hold).await;
        if ctx.refusal.is_some() {
            *body = None;
            return Err(refused(400));
        }
        if hold {
            // Sent whole: re-written if its grant changed (see `admit`).
            *body = Some(match std::mem::take(&mut ctx.body) {
                RequestBody::Replace(b) => b,
                _ => Bytes::from(buf),
            });
        }
        Ok(())
    }
}

/// The most of a gRPC body read before the worker is asked: one more
/// HTTP/2 DATA frame (16 KiB, the frame size the gateway allows) past it
/// still fits pingora's 64 KiB retry buffer.
const GRPC_PRE_READ: usize = 48 * 1024;

/// Refuses a body over the limit; a JSON-RPC candidate is answered as one
/// (its id unread: `null`).
fn too_large(ctx: &mut Ctx, limit: usize) -> pingora::BError {
    if matches!(ctx.call, Call::JsonRpcCandidate) {
        ctx.req.binding = Some(Binding::JsonRpc);
    }
    ctx.refuse(Refusal::BodyTooLarge { limit });
    refused(413)
}

/// The error that makes pingora abort a refused request; `fail_to_proxy`
/// answers the refusal the context holds.
fn refused(status: u16) -> pingora::BError {
    pingora::Error::explain(
        pingora::ErrorType::HTTPStatus(status),
        "request refused by policy",
    )
}
