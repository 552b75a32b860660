//! A budgeted child's answer, re-written when its budget stops it: the
//! worker's settling event (SSE) or task status (a held blocking answer) is
//! replaced by the budget-exhausted failure the a2a-rust SDK sends, so the
//! caller learns why its child ended; nothing follows it.

use bytes::Bytes;

use super::ctx::Ctx;
use super::observe::unreadable_event;
use super::Gateway;
use crate::a2a::grpc::{self, GrpcFrames, GrpcItem};
use crate::a2a::sse::{SseItem, SseParser};
use crate::a2a::{observe, A2aMethod, Binding, Observation};
use crate::metrics::Untracked;

impl Gateway {
    /// The SSE stream of a child with a budget: events are forwarded whole
    /// (bytes after the last event boundary wait for the next chunk), so
    /// that once the budget is exhausted the worker's settling event can be
    /// replaced by the budget-exhausted failure, and nothing follows it.
    pub(super) fn budgeted_sse(
        &self,
        ctx: &mut Ctx,
        parser: &mut SseParser,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
    ) {
        if ctx.budget.as_ref().is_some_and(|b| b.failure_sent) {
            *body = None;
            return;
        }
        let Some(binding) = ctx.req.binding else {
            return;
        };
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
                        .ok_or(Untracked::BadSseEvent),
                ));
            }
            SseItem::Overlong => events.push((None, Err(Untracked::SseEventTooLarge))),
        });
        let Some(pending) = ctx.budget.as_ref().map(|b| b.sse_pending.len()) else {
            return;
        };
        let base = pending;
        let mut replace: Option<(usize, Vec<u8>)> = None;
        let mut prev_end = 0;
        for (end, obs) in events {
            match obs {
                Ok(o) if !o.is_empty() => {
                    let settles = o.state.is_some_and(policies::TaskState::is_settled);
                    self.observed(ctx, o);
                    let exhausted = ctx.budget.as_ref().and_then(|b| b.child.stopped());
                    if let (true, Some(by), Some(id), Some(b)) =
                        (settles, exhausted, &ctx.track.task_id, &ctx.budget)
                    {
                        let ev = b.child.failure_event(
                            binding,
                            ctx.req.rpc_id.as_ref(),
                            id,
                            ctx.track.context_id.as_deref(),
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
        let Some(b) = ctx.budget.as_deref_mut() else {
            return;
        };
        let mut all = std::mem::take(&mut b.sse_pending);
        all.extend_from_slice(&chunk);
        let mut out = match replace {
            Some((start, ev)) => {
                b.failure_sent = true;
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
                    b.sse_pending = all.split_off(cut);
                    all
                }
            }
        };
        if end_of_stream && !b.failure_sent {
            // The worker ended the stream without a settling event after the
            // cancel: the caller still gets the failure.
            if let (Some(by), Some(id)) = (b.child.exhausted(), &ctx.track.task_id) {
                if !ctx.track.seen.is_settled() {
                    out.extend_from_slice(&b.child.failure_event(
                        binding,
                        ctx.req.rpc_id.as_ref(),
                        id,
                        ctx.track.context_id.as_deref(),
                        &by,
                    ));
                    b.failure_sent = true;
                }
            }
        }
        *body = (!out.is_empty()).then(|| Bytes::from(out));
    }

    /// The gRPC answer of a child with a budget: messages are forwarded
    /// whole (a message split across chunks waits for its end), so that
    /// once the budget is exhausted the worker's settling message can be
    /// replaced by the budget-exhausted failure (a status update), and no
    /// message follows it. The worker's trailers still end the call. A
    /// message over the reader's bound passes as it comes.
    pub(super) fn budgeted_grpc(
        &self,
        ctx: &mut Ctx,
        frames: &mut GrpcFrames,
        method: A2aMethod,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
    ) {
        let chunk = body.take().unwrap_or_default();
        let mut out = Vec::with_capacity(chunk.len());
        frames.feed(&chunk, |item| {
            if ctx.budget.as_ref().is_some_and(|b| b.failure_sent) {
                return;
            }
            let msg = match item {
                GrpcItem::Message(m) => m,
                GrpcItem::Compressed(m) => {
                    unreadable_event(ctx, Untracked::CompressedGrpcMessage);
                    out.push(1);
                    out.extend_from_slice(&(m.len() as u32).to_be_bytes());
                    out.extend_from_slice(m);
                    return;
                }
                GrpcItem::Overlong => return unreadable_event(ctx, Untracked::GrpcMessageTooLarge),
                GrpcItem::Skipped(b) => return out.extend_from_slice(b),
            };
            match grpc::observe(method, msg) {
                Some(o) if !o.is_empty() => {
                    let settles = o.state.is_some_and(policies::TaskState::is_settled);
                    self.observed(ctx, o);
                    if settles {
                        if let Some(failure) = self.grpc_failure(ctx, method, msg) {
                            out.extend_from_slice(&failure);
                            return;
                        }
                    }
                }
                Some(_) => {}
                None => unreadable_event(ctx, Untracked::BadGrpcMessage),
            }
            out.extend_from_slice(&grpc::frame(msg));
        });
        if end_of_stream && method.is_streaming() && !ctx.track.seen.is_settled() {
            // The worker ended the stream without a settling message after
            // the cancel: the caller still gets the failure.
            if let Some(failure) = self.grpc_failure(ctx, method, &[]) {
                out.extend_from_slice(&failure);
            }
        }
        *body = (!out.is_empty()).then(|| Bytes::from(out));
    }

    /// The budget-exhausted failure in place of `msg` (the worker's
    /// settling message), once the child was stopped for its budget; marks
    /// it sent. `None`: not stopped, or sent already.
    fn grpc_failure(&self, ctx: &mut Ctx, method: A2aMethod, msg: &[u8]) -> Option<Vec<u8>> {
        // A unary send's task is named by its answer only: no budget
        // stopped it before (see docs/behaviour.md, gRPC).
        if !method.is_streaming() {
            return None;
        }
        let id = ctx.track.task_id.clone()?;
        let b = ctx.budget.as_deref_mut()?;
        if b.failure_sent {
            return None;
        }
        let by = if msg.is_empty() {
            b.child.exhausted()?
        } else {
            b.child.stopped()?
        };
        let update = crate::budget::failure_update(
            &id,
            ctx.track.context_id.as_deref(),
            &by,
            b.child.grant(),
            &b.child.spent(),
        );
        b.failure_sent = true;
        Some(grpc::status_update_event(&update))
    }

    /// Observes a held blocking answer and, when the child was stopped for
    /// its budget, replaces the task's status with the budget-exhausted
    /// failure.
    pub(super) fn answer_held_json(&self, ctx: &mut Ctx, held: Vec<u8>) -> Vec<u8> {
        let Some(binding) = ctx.req.binding else {
            return held;
        };
        let Some(obs) = observe::observe(binding, &held) else {
            Untracked::BadJsonResponse.count();
            return held;
        };
        let settles = obs.state.is_some_and(policies::TaskState::is_settled);
        self.observed(ctx, obs);
        let stopped = ctx.budget.as_ref().and_then(|b| b.child.stopped());
        let (true, Some(by), Some(id), Some(b)) = (
            settles,
            stopped,
            &ctx.track.task_id,
            ctx.budget.as_deref_mut(),
        ) else {
            return held;
        };
        let update = crate::budget::failure_update(
            id,
            ctx.track.context_id.as_deref(),
            &by,
            b.child.grant(),
            &b.child.spent(),
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
        b.failure_sent = true;
        serde_json::to_vec(&doc).unwrap_or(held)
    }
}
