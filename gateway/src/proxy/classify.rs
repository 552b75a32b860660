//! Stage 1, classify: from the request head alone, the route, the A2A call
//! (binding, method, tenant, task), the worker's path, what a cancel would
//! repeat of the caller's headers, and how the request is watched (the id
//! wait, the read timeout, the lease extension). First the head is held to
//! HTTP/1's rules ([`http1`](super::http1)).

use std::time::Instant;

use pingora::http::RequestHeader;
use pingora::proxy::Session;

use super::ctx::Ctx;
use super::http1;
use super::inject::activates_lease;
use super::refusal::Refusal;
use super::Gateway;
use crate::a2a::{classify, A2aMethod, Binding, Call};
use crate::cancel::caller_headers;
use crate::route::{host_without_port, Matched};
use crate::store::now_ms;

/// What classifying the head decided about the body.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The body may carry an A2A call: read it (`inspect`).
    ReadBody,
    /// Nothing in the body matters: pass it.
    Forward,
}

impl Gateway {
    /// Classifies the request into the context, or says why it is refused.
    pub(super) fn classify(&self, session: &mut Session, ctx: &mut Ctx) -> Result<Next, Refusal> {
        let fault = http1::conform(session).err();
        let req = session.req_header();
        let content_type = req.headers.get(http::header::CONTENT_TYPE);
        let grpc = req.method == http::Method::POST
            && content_type.is_some_and(|ct| crate::a2a::grpc::is_grpc_content_type(ct.as_bytes()));
        ctx.req.grpc = grpc;
        let host = request_host(req).map(host_without_port);
        let full_path = req.uri.path();
        let routes = self.routes.load();
        let Some(Matched { route, prefix, rel }) = routes.find(host, full_path) else {
            ctx.req.binding = Some(if grpc { Binding::Grpc } else { Binding::Rest });
            if let Some(fault) = fault {
                return Err(Refusal::Http1(fault));
            }
            return Err(Refusal::NoRoute {
                host: host.unwrap_or("").to_owned(),
                path: full_path.to_owned(),
            });
        };
        let route = route.clone();
        let call = match crate::a2a::grpc::method_of(rel).filter(|_| grpc) {
            Some(method) => Call::Grpc { method },
            None if grpc => Call::Other,
            None => classify(&req.method, rel, req.uri.query(), session.is_upgrade_req()),
        };
        if let Some(fault) = fault {
            // Refused before the body is read, in the call's binding
            // (`refused_as`); HTTP 400 but for gRPC (a status).
            ctx.req.binding = Some(refused_as(&call, grpc));
            ctx.route = Some(route);
            return Err(Refusal::Http1(fault));
        }
        ctx.req.received_ms = now_ms();
        // On a route that checks sends, a gRPC call is read as a call of
        // the A2A service in the protobuf codec, or refused: a worker that
        // serves h2c and ignores content types (hypercorn, hyper's auto
        // mode) would run a send typed `application/grpc` at its REST or
        // JSON-RPC path, which the gateway passes unread elsewhere.
        if grpc {
            let seen = policies::reading::GrpcCall {
                a2a_service: matches!(call, Call::Grpc { .. }),
                known_method: matches!(call, Call::Grpc { method: Some(_) }),
                proto: content_type
                    .is_some_and(|ct| crate::a2a::grpc::is_proto_codec(ct.as_bytes())),
                passed_service: crate::a2a::grpc::service_of(rel)
                    .is_some_and(|s| route.cfg.grpc_pass_services.iter().any(|p| p == s)),
            };
            if let Some(what) = policies::reading::grpc_refusal(route.checks_sends(), seen) {
                ctx.req.binding = Some(Binding::Grpc);
                ctx.route = Some(route);
                return Err(Refusal::GrpcUnread(what));
            }
        }
        // The agent card is the public discovery document: served to
        // anyone, as A2A workers serve it (the route's own card only:
        // `/.well-known/agent-card.json` below the route, not any path
        // ending so, which the worker may serve as something else).
        let public_card = call == Call::AgentCard && rel == crate::a2a::classify::CARD_PATH;
        if let Some(auth) = route.auth.as_ref().filter(|_| !public_card) {
            // The verified identity names the caller (the config refuses
            // `caller_header` beside `auth`).
            ctx.route = Some(route.clone());
            match auth.check(&req.headers) {
                crate::auth::Verdict::Identified(id) => {
                    ctx.req.checked_jwt = id.via == crate::auth::Via::Jwt;
                    ctx.req.caller = Some(Box::new(crate::budget::Caller {
                        name: id.shown.clone(),
                        shown: id.shown,
                    }));
                }
                crate::auth::Verdict::Anonymous => {}
                crate::auth::Verdict::Refused(failure) => {
                    if let crate::auth::Failure::Rejected { why } = &failure {
                        tracing::info!(route = %route.name, why = %why, "credential rejected");
                    }
                    ctx.req.binding = Some(refused_as(&call, grpc));
                    return Err(Refusal::Unauthenticated {
                        rejected: matches!(failure, crate::auth::Failure::Rejected { .. }),
                        challenge: auth.challenge(&failure),
                        what: auth.what_to_send(),
                    });
                }
            }
        } else if let Some(h) = &route.cfg.budget.caller_header {
            ctx.req.caller = req
                .headers
                .get(h.as_str())
                .and_then(|v| v.to_str().ok())
                .map(|v| Box::new(crate::budget::caller_identity(v)));
        }
        ctx.req.worker_root = route.worker_root(prefix);
        ctx.req.upstream_path = upstream_path(&ctx.req.worker_root, rel, full_path, req);
        ctx.req.caller_headers = caller_headers(&route.cfg, &req.headers);
        if let Some(policy) = &route.cfg.auth {
            // A cancel on the caller's behalf carries what the worker got:
            // a credential the gateway checked (else the route's own), and
            // the verified identity.
            if !ctx.req.checked_jwt {
                ctx.req.caller_headers.retain(|(k, _)| k != "authorization");
            }
            ctx.req
                .caller_headers
                .retain(|(k, _)| *k != policy.identity_header);
            if let Some(c) = &ctx.req.caller {
                ctx.req
                    .caller_headers
                    .push((policy.identity_header.clone(), c.name.clone()));
            }
        }
        let next = match &call {
            Call::Rest {
                method,
                tenant,
                task_id,
            } => {
                ctx.req.binding = Some(Binding::Rest);
                ctx.req.method = Some(*method);
                ctx.req.tenant = tenant.clone();
                // A task id in the path (SubscribeToTask) is confirmed by the
                // stream's first event, which registers the watcher.
                ctx.req.task_id = task_id.clone();
                if matches!(
                    method,
                    A2aMethod::SendMessage | A2aMethod::SendStreamingMessage
                ) {
                    Next::ReadBody
                } else {
                    Next::Forward
                }
            }
            Call::JsonRpcCandidate => Next::ReadBody,
            Call::Grpc { method } => {
                ctx.req.binding = Some(Binding::Grpc);
                ctx.req.method = *method;
                // The tenant and the task are in the message, for every
                // method policy reads; a push-notification config call's
                // task only routes it to its replica.
                let push_config = method.is_some_and(A2aMethod::is_push_config);
                if matches!(
                    method,
                    Some(
                        A2aMethod::SendMessage
                            | A2aMethod::SendStreamingMessage
                            | A2aMethod::GetTask
                            | A2aMethod::CancelTask
                            | A2aMethod::SubscribeToTask
                    )
                ) || (push_config && route.replicas.is_some())
                {
                    Next::ReadBody
                } else {
                    Next::Forward
                }
            }
            _ => Next::Forward,
        };
        // (Not over gRPC: HTTP/2 has no half-close to wait through; a
        // child whose caller left before it was named is found by its sent
        // message instead, `cascade::find_child`.)
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
            ctx.track.awaiting_id = Some(Instant::now());
        }
        ctx.lease.extension =
            route.injects_lease_extension || activates_lease(session.req_header());
        let upgrade = matches!(call, Call::Upgrade);
        let budgeted = route.cfg.budget.is_active();
        ctx.call = call;
        ctx.route = Some(route);
        let binds_tenants = ctx
            .route
            .as_ref()
            .and_then(|r| r.cfg.auth.as_ref())
            .is_some_and(|a| a.tenants.is_some());
        // Frames could carry sends whose grants the gateway cannot rewrite,
        // or tenants it would have to refuse: such a route is served over
        // the HTTP bindings only.
        if let (true, Some(why)) = (
            upgrade,
            policies::reading::websocket_refusal(budgeted, binds_tenants),
        ) {
            ctx.req.binding = Some(Binding::Rest);
            return Err(match why {
                policies::reading::WebSocketRefusal::Budget => Refusal::BudgetWebSocket,
                policies::reading::WebSocketRefusal::Tenants => Refusal::TenantWebSocket,
            });
        }
        // An idle WebSocket is not cut by read timeouts (ping/pong and long
        // silences pass); other requests get the configured one.
        if !upgrade {
            if let Some(t) = self.timeouts.downstream_idle {
                session.set_read_timeout(Some(t));
            }
        }
        Ok(next)
    }
}

/// The binding a call refused before its body is read is answered in: a
/// gRPC status for a gRPC call (of any service), a JSON-RPC error for a
/// call to the JSON-RPC endpoint (its id unknown), else the REST shape.
fn refused_as(call: &Call, grpc: bool) -> Binding {
    match call {
        _ if grpc => Binding::Grpc,
        Call::JsonRpcCandidate => Binding::JsonRpc,
        _ => Binding::Rest,
    }
}

/// The path sent to the worker: the worker root, the path below the
/// route's prefix, the query.
fn upstream_path(worker_root: &str, rel: &str, full_path: &str, req: &RequestHeader) -> String {
    let rel = if rel == "/" && !worker_root.is_empty() && !full_path.ends_with('/') {
        ""
    } else {
        rel
    };
    let query = req.uri.query();
    let mut path =
        String::with_capacity(1 + worker_root.len() + rel.len() + query.map_or(0, |q| q.len() + 1));
    if worker_root.is_empty() && rel.is_empty() {
        path.push('/');
    }
    path.push_str(worker_root);
    path.push_str(rel);
    if let Some(q) = query {
        path.push('?');
        path.push_str(q);
    }
    path
}

/// The request's host: its URI's authority, else its `Host` header.
pub fn request_host(req: &RequestHeader) -> Option<&str> {
    req.uri.authority().map(|a| a.as_str()).or_else(|| {
        req.headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}
