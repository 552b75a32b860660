//! Task tracking over a2a-rust's WebSocket binding, after the `101`.
//!
//! Both directions' bytes are forwarded unchanged by pingora; a frame parser
//! per direction reads along. Requests (client → worker) tell which JSON-RPC
//! ids are sends or subscriptions and carry lease grants and renewals
//! (`GetTask` on a socket whose upgrade activated the lease extension);
//! answers and stream frames (worker → client) name the tasks, matched to
//! their request by JSON-RPC id. When the socket ends, every task it
//! started or watched that has not settled goes to the cascade, and so does
//! every send still awaiting the answer that would name its task (a
//! blocking `SendMessage` in flight, a stream before its first event): its
//! child is found as an HTTP caller's is, by the task it names or by its
//! message in the worker's `ListTasks`.

use std::sync::Arc;

use policies::cascade::Seen;
use serde::Deserialize;

use super::ctx::{shape_of, Ctx};
use super::observe::{endpoint, lease_rules};
use super::ws_session::{Pending, SocketTask, WsSession};
use super::Gateway;
use crate::a2a::request::jsonrpc_facts;
use crate::a2a::ws::WsItem;
use crate::a2a::{observe, A2aMethod, Binding, Observation};
use crate::metrics::Untracked;
use crate::store::{CancelTarget, TaskKey};

/// Requests awaiting answers on one socket, at most (the a2a-rust client
/// keeps 64 in flight); beyond it new ones are not tracked (counted).
const MAX_PENDING: usize = 1024;
/// Tasks tracked per socket, at most.
const MAX_TASKS: usize = 4096;

#[derive(Deserialize)]
struct IdOnly {
    #[serde(default)]
    id: Option<serde_json::Value>,
}

/// a2a-rust's end-of-stream frame on its WebSocket binding:
/// `{"result":{"status":"stream_complete"}}`, or from older servers
/// `{"result":{"stream_complete":true}}` (a transport marker, not an A2A
/// event; a2a-protocol-client 0.15 tells it apart the same way).
fn is_stream_complete(doc: &[u8]) -> bool {
    let Ok(frame) = serde_json::from_slice::<serde_json::Value>(doc) else {
        return false;
    };
    let r = &frame["result"];
    r.get("stream_complete").is_some() || r["status"].as_str() == Some("stream_complete")
}

/// What one worker → client frame told, kept in frame order.
enum WorkerFrame {
    /// An answer or stream event for the call with this JSON-RPC id.
    Answer(String, Observation<'static>),
    /// The end of that call's stream.
    End(String),
    /// A message the gateway could not read: it may have settled any of the
    /// socket's tasks.
    Unreadable,
}

fn count_item(item: &WsItem<'_>) {
    let reason = match item {
        WsItem::Binary => Untracked::WsBinary,
        WsItem::Overlong => Untracked::WsMessageTooLarge,
        WsItem::Compressed => Untracked::WsCompressed,
        WsItem::Invalid(_) => Untracked::WsInvalidFraming,
        _ => return,
    };
    reason.count();
}

impl Gateway {
    /// Client → worker bytes. Returns the renewals to apply (tenant, task).
    pub(super) fn ws_client_bytes(
        &self,
        ctx: &Ctx,
        ws: &mut WsSession,
        chunk: &[u8],
    ) -> Vec<(Option<String>, String)> {
        let lease_ext = ctx.lease.extension;
        let max_ttl = ctx
            .route
            .as_ref()
            .map_or(0, |r| r.cfg.lease.max_ttl.as_millis() as u64);
        let mut renewals = Vec::new();
        let pending = &mut ws.pending;
        let tasks = &ws.tasks;
        ws.client.feed(chunk, |item| {
            let WsItem::Text(doc) = item else {
                count_item(&item);
                return;
            };
            let Some(f) = jsonrpc_facts(doc) else {
                // A batch's calls are not tracked over WebSocket (a frame
                // cannot be refused without breaking the socket).
                let batch = doc.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
                if batch {
                    Untracked::WsJsonrpcBatch.count();
                } else {
                    Untracked::WsNotJsonrpc.count();
                }
                return;
            };
            match f.method {
                Some(m) if m.is_tracked() => {
                    let Some(id) = f.rpc_id else { return };
                    if pending.len() >= MAX_PENDING {
                        Untracked::WsTooManyPending.count();
                        return;
                    }
                    let lease_grant = match f.lease {
                        Some(Ok(ttl)) if policies::lease::validate_ttl(ttl, max_ttl).is_ok() => {
                            Some(ttl)
                        }
                        Some(_) => {
                            // A frame cannot be refused without breaking the
                            // socket: the grant is not enforced, and counted.
                            Untracked::WsInvalidLeaseGrant.count();
                            None
                        }
                        None => None,
                    };
                    let send = m != A2aMethod::SubscribeToTask;
                    pending.insert(
                        id.to_string(),
                        Pending {
                            method: m,
                            tenant: f.tenant,
                            lease_grant,
                            task_id: f.task_id.filter(|_| send),
                            message_id: f.message_id,
                            return_immediately: f.return_immediately,
                            named: false,
                        },
                    );
                }
                Some(A2aMethod::GetTask) => {
                    let Some(task) = f.task_id else { return };
                    // A task of this socket polled until it settled or was
                    // handed back (input-required) must not be cancelled
                    // when the socket closes: its answer says the state.
                    if let Some(id) = f.rpc_id {
                        if tasks.contains_key(&*task) && pending.len() < MAX_PENDING {
                            pending.insert(
                                id.to_string(),
                                Pending {
                                    method: A2aMethod::GetTask,
                                    tenant: f.tenant.clone(),
                                    lease_grant: None,
                                    task_id: None,
                                    message_id: None,
                                    return_immediately: false,
                                    named: true,
                                },
                            );
                        }
                    }
                    if lease_ext {
                        renewals.push((f.tenant, task));
                    }
                }
                _ => {}
            }
        });
        renewals
    }

    /// Worker → client bytes: answers and stream frames naming tasks.
    pub(super) fn ws_worker_bytes(&self, ctx: &Ctx, ws: &mut WsSession, chunk: &[u8]) {
        // In frame order: a stream's whole life (its task, its updates, its
        // end) can arrive in one chunk, and its end must not be acted on
        // before its events are.
        let mut seen: Vec<WorkerFrame> = Vec::new();
        let pending = &ws.pending;
        ws.worker.feed(chunk, |item| {
            let WsItem::Text(doc) = item else {
                count_item(&item);
                if matches!(
                    item,
                    WsItem::Overlong | WsItem::Compressed | WsItem::Invalid(_)
                ) {
                    seen.push(WorkerFrame::Unreadable);
                }
                return;
            };
            let Some(id) = serde_json::from_slice::<IdOnly>(doc)
                .ok()
                .and_then(|i| i.id)
            else {
                return;
            };
            let id = id.to_string();
            if !pending.contains_key(&id) {
                return;
            }
            // The cheap test first (most frames never mention it), then the
            // shape: an artifact that merely contains the words is an event.
            if memmem(doc, b"stream_complete") && is_stream_complete(doc) {
                seen.push(WorkerFrame::End(id));
                return;
            }
            match observe::observe(Binding::WebSocket, doc) {
                Some(o) => seen.push(WorkerFrame::Answer(id, o.into_owned())),
                None => {
                    Untracked::WsBadAnswer.count();
                    seen.push(WorkerFrame::Unreadable);
                }
            }
        });
        for frame in seen {
            match frame {
                WorkerFrame::Answer(id, obs) => self.ws_observation(ctx, ws, &id, obs),
                WorkerFrame::End(id) => {
                    ws.pending.remove(&id);
                }
                WorkerFrame::Unreadable => {
                    // Unattributable: each unsettled task's state may be
                    // stale (see `Seen::unsure`).
                    for t in ws.tasks.values_mut() {
                        t.seen.unsure = true;
                    }
                }
            }
        }
    }

    /// Applies one answer frame to the socket's tasks, through the same
    /// decisions as an HTTP answer (`policies::track`).
    fn ws_observation(&self, ctx: &Ctx, ws: &mut WsSession, id: &str, obs: Observation<'_>) {
        let Some(route) = ctx.route.clone() else {
            return;
        };
        let Some(p) = ws.pending.get_mut(id) else {
            return;
        };
        p.named |= obs.task_id.is_some();
        let p = p.clone();
        let shape = shape_of(p.method);
        let one_answer = matches!(p.method, A2aMethod::SendMessage | A2aMethod::GetTask);
        if obs.error || obs.message_only || one_answer {
            ws.pending.remove(id);
        }
        let Some(task_id) = obs.task_id else { return };
        let key = TaskKey::new(&route.name, p.tenant.as_deref(), &*task_id);
        if let Some(t) = ws.tasks.get_mut(&*task_id) {
            let was_settled = t.seen.is_settled();
            if let Some(s) = obs.state {
                t.seen.state = Some(s);
                t.seen.unsure = false;
            }
            if policies::track::records_settling(was_settled, t.seen.state) {
                self.settled(key, t.seen.state, None);
            }
            return;
        }
        let Some(shape) = shape.filter(|s| *s != policies::track::Shape::Poll) else {
            // A poll only updates a task this socket already has.
            return;
        };
        if ws.tasks.len() >= MAX_TASKS {
            // Settled tasks are done with: they make room, ended as the
            // socket's end would end them (a watcher less, a held lease
            // released).
            let done: Vec<(Arc<str>, SocketTask)> =
                ws.tasks.extract_if(|_, t| t.seen.is_settled()).collect();
            for (id, t) in done {
                self.ws_task_ended(ctx, &route, id, t, policies::cascade::Event::CallerGone);
            }
            if ws.tasks.len() >= MAX_TASKS {
                Untracked::WsTooManyTasks.count();
                return;
            }
        }
        let sight =
            policies::track::first_sight(shape, obs.state, p.lease_grant, &lease_rules(&route));
        let target = CancelTarget {
            binding: Binding::WebSocket,
            path: endpoint(ctx).to_string(),
        };
        self.first_sight(
            &route,
            &key,
            &sight,
            obs.state,
            obs.context_id.map(std::borrow::Cow::into_owned),
            super::observe::By {
                shape,
                asker: ctx.asker(&route),
                replica: ctx.replica_name(),
                target: Some(target),
                // A socket's sends are not linked (delegation trees).
                message_id: None,
            },
        );
        if !sight.keep {
            return;
        }
        ws.tasks.insert(
            task_id.into(),
            SocketTask {
                seen: Seen {
                    id_known: true,
                    state: obs.state,
                    ..Seen::default()
                },
                tenant: p.tenant,
                watching: sight.watch,
                held: sight.hold_ms.is_some(),
            },
        );
    }
}

fn memmem(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

impl Gateway {
    /// The socket ended: every task it started or watched goes to the
    /// cascade (settled ones only to uncount their watcher).
    pub(super) fn ws_ended(&self, ctx: &Ctx, ws: WsSession, e: Option<&pingora::Error>) {
        let Some(route) = ctx.route.clone() else {
            return;
        };
        let event = match e {
            Some(e) if *e.esource() == pingora::ErrorSource::Upstream => {
                policies::cascade::Event::StreamLost
            }
            _ => policies::cascade::Event::CallerGone,
        };
        let passes = route.cfg.cascade.blocking_sends == policies::carry::BlockingSends::Pass;
        for p in ws.pending.into_values() {
            let unnamed_send = match p.method {
                A2aMethod::SendMessage => !p.return_immediately && !passes,
                A2aMethod::SendStreamingMessage => true,
                _ => false,
            } && !p.named;
            let known = p
                .task_id
                .as_deref()
                .is_some_and(|t| ws.tasks.contains_key(t));
            if unnamed_send && !known {
                self.ws_send_ended(ctx, &route, p, event);
            }
        }
        for (task_id, t) in ws.tasks {
            self.ws_task_ended(ctx, &route, task_id, t, event);
        }
    }

    /// A send whose answer had not named its task when the socket ended:
    /// to the cascade with the task it continues, or its message id to find
    /// the child by.
    fn ws_send_ended(
        &self,
        ctx: &Ctx,
        route: &std::sync::Arc<crate::route::Route>,
        p: Pending,
        event: policies::cascade::Event,
    ) {
        let seen = Seen {
            id_known: p.task_id.is_some(),
            ..Seen::default()
        };
        let mut end = socket_end(ctx, route, p.tenant, seen, event);
        end.task_id = p.task_id.map(Arc::from);
        end.message_id = p.message_id;
        let cascade = self.cascade.clone();
        crate::drain::spawn_work(async move { cascade.stream_ended(end).await });
    }

    /// One task of a socket is done with (the socket ended, or the task
    /// settled and its table needs the room): its held lease released, and
    /// to the cascade unless it settled unwatched.
    fn ws_task_ended(
        &self,
        ctx: &Ctx,
        route: &std::sync::Arc<crate::route::Route>,
        task_id: std::sync::Arc<str>,
        t: SocketTask,
        event: policies::cascade::Event,
    ) {
        let key = TaskKey::new(&route.name, t.tenant.as_deref(), task_id.clone());
        if t.held {
            self.leases.release(&key, &ctx.asker(route));
        }
        if t.seen.is_settled() && !t.watching {
            return;
        }
        let mut end = socket_end(ctx, route, t.tenant, t.seen, event);
        end.task_id = Some(task_id);
        end.was_watching = t.watching;
        end.imposed_lease = t.held;
        let cascade = self.cascade.clone();
        crate::drain::spawn_work(async move { cascade.stream_ended(end).await });
    }
}

/// What the cascade judges of one of a socket's calls when the socket
/// ended: its cancel goes over the WebSocket binding, to the path the
/// caller upgraded on; task, message, watcher and lease unset.
fn socket_end(
    ctx: &Ctx,
    route: &crate::route::Route,
    tenant: Option<String>,
    seen: Seen,
    event: policies::cascade::Event,
) -> crate::cascade::StreamEnd {
    crate::cascade::StreamEnd {
        route: route.name.clone(),
        policy: route.cfg.cascade,
        worker: ctx.worker_url().unwrap_or_else(|| route.cfg.worker.clone()),
        target: CancelTarget {
            binding: Binding::WebSocket,
            path: endpoint(ctx).to_string(),
        },
        tenant,
        task_id: None,
        message_id: None,
        sent_ms: ctx.req.received_ms,
        seen,
        event,
        was_watching: false,
        imposed_lease: false,
        cancel_headers: crate::cancel::cancel_headers(&route.cfg, &ctx.req.caller_headers),
        asker: ctx.asker(route),
    }
}

#[cfg(test)]
mod tests {
    use super::is_stream_complete;

    #[test]
    fn stream_complete_is_the_sentinel_frame_only() {
        let table: &[(&str, bool)] = &[
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"status":"stream_complete"}}"#,
                true,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"stream_complete":true}}"#,
                true,
            ),
            // An event whose text mentions it is an event.
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"artifactUpdate":{"taskId":"t","artifact":{"parts":[{"text":"stream_complete"}]}}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"statusUpdate":{"taskId":"t","status":{"state":"TASK_STATE_INPUT_REQUIRED","message":{"parts":[{"text":"say stream_complete"}]}}}}}"#,
                false,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"stream_complete"}}"#,
                false,
            ),
            ("stream_complete", false),
        ];
        for (doc, want) in table {
            assert_eq!(is_stream_complete(doc.as_bytes()), *want, "{doc}");
        }
    }
}
