//! A blocking `SendMessage` carried to the worker as a stream
//! (`policies::carry` decides which).
//!
//! A blocking send names its task only in its one answer, once the task has
//! settled, so a caller that leaves before it would leave a child the
//! gateway cannot name. Carried, the send goes to the worker as
//! `SendStreamingMessage` (same body and headers; JSON-RPC `method`
//! renamed, REST `message:send` → `message:stream`) over the gateway's own
//! connection, while the caller's connection is watched:
//!
//! * each event is observed as a stream's is (the task recorded and watched,
//!   leases started or held) through [`Gateway::observed`];
//! * the caller leaving (FIN or RST) ends the request as a stream's caller
//!   leaving does: `end` hands the task to the cascade. A caller that leaves
//!   before any event named the task is waited for up to the route's
//!   `id_wait`, the worker's stream read on, so the task is named all the
//!   same;
//! * when the stream ends (the task settled: terminal, input-required,
//!   auth-required), the caller gets what the blocking send answers: the
//!   task as `GetTask` reads it then (with the caller's `historyLength`) in
//!   the send's envelope, or the worker's message or error as the stream
//!   carried it, which is the blocking answer's own shape.
//!
//! Runs inside `request_filter`: the gateway answers the caller itself, so
//! none of pingora's later hooks but `logging` (`end`) run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::client::HttpSession;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, OrErr, Result};
use policies::carry::{BlockingSend, Handling, NeedsEvents, SendWire, WorkerStreams};
use policies::track::Shape;
use serde_json::value::RawValue;
use serde_json::Value;

use super::ctx::Ctx;
use super::refusal::Refusal;
use super::{inject, Gateway};
use crate::a2a::classify::percent_encode_segment;
use crate::a2a::sse::{SseItem, SseParser};
use crate::a2a::{observe, A2aMethod, Binding};
use crate::metrics::{self, Untracked};
use crate::route::Route;

/// How long what a worker's card says of streaming is believed.
const CARD_FRESH: Duration = Duration::from_secs(60);

/// The longest final answer (`GetTask`'s task, or the message event) read
/// whole.
const ANSWER_CAP: usize = crate::cancel::ANSWER_CAP;

/// The gateway's own connections for carried sends, and what each worker's
/// card said of streaming.
#[derive(Default)]
pub struct Carrier {
    /// The gateway's connections to workers (the canceller's).
    client: Arc<crate::worker_client::WorkerClient>,
    cards: Mutex<HashMap<Arc<str>, (WorkerStreams, Instant)>>,
}

impl std::fmt::Debug for Carrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Carrier").finish_non_exhaustive()
    }
}

impl Carrier {
    pub fn new(client: Arc<crate::worker_client::WorkerClient>) -> Self {
        Carrier {
            client,
            cards: Mutex::default(),
        }
    }
}

/// A connection to a worker with a request on it, and the peer it is
/// pooled under.
struct Upstream {
    session: HttpSession,
    peer: pingora::upstreams::peer::HttpPeer,
}

/// What the carried call sends, decided from the caller's request.
#[derive(Debug)]
pub struct Plan {
    body: Bytes,
    path: String,
    /// The caller's `configuration.historyLength`, for the final `GetTask`.
    history_length: Option<u64>,
}

/// The carried call: the body re-written as `SendStreamingMessage` and
/// the path it goes to. `None`: the body is not at hand, or does not
/// rename.
fn carried_plan(
    ctx: &Ctx,
    binding: Binding,
    body: Option<&[u8]>,
    history_length: Option<u64>,
) -> Option<Plan> {
    let (body, path) = match binding {
        Binding::JsonRpc => (
            Bytes::from(rename_method(body?, "SendStreamingMessage")?),
            ctx.req.upstream_path.clone(),
        ),
        _ => {
            let (path, query) = split_query(&ctx.req.upstream_path);
            let base = path.strip_suffix("message:send")?;
            (
                Bytes::copy_from_slice(body?),
                format!("{base}message:stream{query}"),
            )
        }
    };
    Some(Plan {
        body,
        path,
        history_length,
    })
}

/// The send's `configuration.historyLength`, which the final `GetTask`
/// repeats.
fn history_length(v: &Value, binding: Binding) -> Option<u64> {
    let params = match binding {
        Binding::JsonRpc => &v["params"],
        _ => v,
    };
    params["configuration"]["historyLength"].as_u64()
}

impl Gateway {
    /// How this admitted request, if it is a blocking send, reaches the
    /// worker (`policies::carry::handle`): carried (the plan returned),
    /// guarded (`ctx.track.guarded` set: passed, its caller's leaving acted
    /// on), or passed; counted by outcome and reason. `body`: the pre-read
    /// body as the worker would get it (`None` when it was not read before
    /// the worker was asked).
    pub(super) async fn carry_plan(&self, ctx: &mut Ctx, body: Option<&[u8]>) -> Option<Plan> {
        if ctx.req.method != Some(A2aMethod::SendMessage) {
            return None;
        }
        let route = ctx.route.clone()?;
        let binding = ctx.req.binding?;
        let wire = match binding {
            Binding::JsonRpc | Binding::Rest => SendWire::Http,
            Binding::Grpc => SendWire::Grpc,
            // A socket's sends are guarded by the socket.
            Binding::WebSocket => return None,
        };
        // Only a body read unambiguously (no member policy reads given
        // twice) is sent re-written; the others pass as they came.
        let unambiguous = |b: &[u8]| {
            let facts = match binding {
                Binding::JsonRpc => crate::a2a::request::jsonrpc_facts(b),
                _ => crate::a2a::request::rest_facts(b),
            };
            facts.is_some_and(|f| f.duplicate.is_none())
        };
        let setting = route.cfg.cascade.blocking_sends;
        let needs_events = if ctx.budget.is_some() {
            Some(NeedsEvents::Budget)
        } else if ctx.lease.grant.is_some() || route.cfg.lease.impose_ttl.is_some() {
            Some(NeedsEvents::Lease)
        } else {
            None
        };
        let mut send = BlockingSend {
            wire,
            // Set below, once the body is parsed (if it needs to be).
            body_in_hand: false,
            // As the request reader read it (only a literal `true`).
            return_immediately: ctx.req.return_immediately,
            cascade: route.cfg.cascade.mode,
            needs_events,
            names_task: ctx.req.task_id.is_some(),
            message_id: ctx.req.message_id.is_some(),
        };
        let searchable = self.cascade.searchable(&route.name);
        // Parsed only where it can decide: a guarded send reads no more of
        // its body than the request reader did.
        let parsed = body
            .filter(|b| policies::carry::needs_body(setting, &send, searchable) && unambiguous(b))
            .and_then(|b| serde_json::from_slice::<Value>(b).ok());
        send.body_in_hand = parsed.is_some();
        let history_length = parsed.as_ref().and_then(|v| history_length(v, binding));
        let worker = if policies::carry::needs_card(setting, &send, searchable) {
            // Boxed: reading a card is an HTTP exchange, whose future would
            // otherwise sit inline in every request's `request_filter`
            // future (12.8 KB), copied whole each time pingora boxes it.
            Box::pin(self.carrier_worker_streams(&route)).await
        } else {
            WorkerStreams::Unknown
        };
        let handling = policies::carry::handle(setting, &send, worker, searchable)?;
        route.metrics.blocking_send(handling);
        match handling {
            Handling::Guarded => {
                ctx.track.guarded = true;
                None
            }
            Handling::Passed(_) => None,
            Handling::Carried(_) => {
                let plan = carried_plan(ctx, binding, body, history_length);
                // A body that cannot be re-written after all (it read as
                // a send but renames as none) passes guarded.
                ctx.track.guarded = plan.is_none();
                plan
            }
        }
    }

    /// What the route's worker card says of streaming, read at most once a
    /// minute (`{base}/.well-known/agent-card.json`, then the host's root).
    async fn carrier_worker_streams(&self, route: &Route) -> WorkerStreams {
        if let Some((w, at)) = self.carrier.cards.lock().unwrap().get(&route.name) {
            if at.elapsed() < CARD_FRESH {
                return *w;
            }
        }
        let mut paths = vec![format!(
            "{}/.well-known/agent-card.json",
            route.cfg.worker.base_path
        )];
        if !route.cfg.worker.base_path.is_empty() {
            paths.push("/.well-known/agent-card.json".into());
        }
        let mut found = WorkerStreams::Unknown;
        for path in paths {
            let Ok(mut head) = RequestHeader::build("GET", path.as_bytes(), None) else {
                continue;
            };
            if head
                .insert_header("host", route.host_header.clone())
                .is_err()
            {
                continue;
            }
            let asked = tokio::time::timeout(
                self.timeouts.connect * 2,
                self.carrier_exchange(route, None, head, None),
            )
            .await;
            if let Ok(Ok((resp, body))) = asked {
                if resp.status != 200 {
                    continue;
                }
                let card: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                found = match card["capabilities"]["streaming"].as_bool() {
                    Some(true) => WorkerStreams::Yes,
                    _ => WorkerStreams::No,
                };
                break;
            }
        }
        tracing::debug!(route = %route.name, streams = ?found, "worker card read for blocking sends");
        self.carrier
            .cards
            .lock()
            .unwrap()
            .insert(route.name.clone(), (found, Instant::now()));
        found
    }

    /// Sends one request to the route's worker over a connection as the
    /// proxy makes one (pooled), and reads the answer's head. A pooled
    /// connection the worker closed meanwhile is retried on another, as
    /// the proxy does.
    /// `replica`: the one a route with several `workers` carries it to.
    async fn carrier_send(
        &self,
        route: &Route,
        replica: Option<&crate::replicas::Replica>,
        head: RequestHeader,
        body: Option<Bytes>,
    ) -> Result<Upstream> {
        let worker = match replica {
            Some(r) => r.addr(),
            None => &route.addr,
        };
        let addr = worker
            .get()
            .await
            .map_err(|why| Error::explain(ErrorType::ConnectNoRoute, why).into_up())?;
        let mut peer = worker.peer(addr, route.cfg.worker.tls);
        peer.options.connection_timeout = Some(self.timeouts.connect);
        peer.options.read_timeout = self.timeouts.upstream_idle;
        peer.options.write_timeout = self.timeouts.upstream_idle;
        let mut tries = 0;
        loop {
            tries += 1;
            let (mut session, reused) = self
                .carrier
                .client
                .session(&peer)
                .await
                .map_err(|e| e.into_up())?;
            // The connector leaves these to its user (the proxy sets them
            // per exchange): silence longer than `upstream_idle` between
            // events is the worker failing, as on a proxied stream.
            session.set_read_timeout(self.timeouts.upstream_idle);
            session.set_write_timeout(self.timeouts.upstream_idle);
            match send_request(&mut session, head.clone(), body.clone()).await {
                Ok(()) => return Ok(Upstream { session, peer }),
                Err(e) if reused && tries < 4 => {
                    tracing::debug!(error = %e, "a pooled connection to the worker failed; trying another");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one request and reads its whole answer (up to [`ANSWER_CAP`]).
    async fn carrier_exchange(
        &self,
        route: &Route,
        replica: Option<&crate::replicas::Replica>,
        head: RequestHeader,
        body: Option<Bytes>,
    ) -> Result<(ResponseHeader, Vec<u8>)> {
        let mut up = self.carrier_send(route, replica, head, body).await?;
        let resp = answer_head(&up.session)?;
        let body = read_whole(&mut up.session).await?;
        self.carrier_release(up).await;
        Ok((resp, body))
    }

    /// Pools a connection whose answer was read to its end.
    async fn carrier_release(&self, up: Upstream) {
        self.carrier
            .client
            .release(up.session, &up.peer, Duration::from_secs(60))
            .await;
    }

    /// Carries the send (see the module doc) and answers the caller.
    /// `Ok(true)`: answered. `Err`: a worker failure (`fail_to_proxy`
    /// answers it) or the caller gone (`end` hands its task to the cascade).
    pub(super) async fn carry(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        plan: Plan,
    ) -> Result<bool> {
        let Some(route) = ctx.route.clone() else {
            return Ok(false);
        };
        let binding = ctx.req.binding.unwrap_or(Binding::JsonRpc);
        ctx.track.carried = true;
        ctx.track.shape = Some(Shape::Stream);
        metrics::OPEN_STREAMS.inc();
        // On a route with several workers: the replica the send, its
        // events and the GetTask that answers it all go to.
        if let Some(replicas) = &route.replicas {
            ctx.req.replica = self.replica_for(ctx, &route, replicas).await;
        }

        let mut head = session.req_header().clone();
        crate::trace::upstream(&mut head, ctx.trace.as_deref());
        inject::upstream_head(&mut head, ctx)?;
        self.delegation(&mut head, ctx)?;
        head.set_version(http::Version::HTTP_11);
        head.set_uri(
            plan.path
                .parse()
                .or_err(ErrorType::InternalError, "carried send's path")?,
        );
        for h in [
            http::header::TRANSFER_ENCODING,
            http::header::EXPECT,
            http::header::ACCEPT_ENCODING,
            http::header::CONNECTION,
        ] {
            head.remove_header(&h);
        }
        head.insert_header("content-length", plan.body.len().to_string())?;
        head.insert_header("accept", "text/event-stream")?;
        let send_head = head.clone();

        ctx.times.upstream();
        let mut upstream = self
            .carrier_send(&route, ctx.req.replica.as_deref(), head, Some(plan.body))
            .await?;
        let up = &mut upstream.session;
        let resp = answer_head(up)?;
        if !resp.status.is_success() || !super::observe::is_sse(&resp) {
            // An error before any stream (or a worker that answered with
            // one document): that is what the blocking send answers too.
            ctx.track.worker_refused = true;
            let body = read_whole(up).await?;
            self.carrier_release(upstream).await;
            ctx.times.answer(&resp);
            let status = resp.status.as_u16();
            write_answer(session, status, Some(&resp), Bytes::from(body)).await?;
            return Ok(true);
        }

        // Read the stream, the caller watched.
        let mut parser = SseParser::new(self.limits.max_sse_event);
        let mut last: Option<Vec<u8>> = None;
        // Whether the worker's first task snapshot carried a history: a
        // worker whose snapshots omit it when no `historyLength` was asked
        // (a2a-rust) omits it from its blocking answer too.
        let mut snapshot_history: Option<bool> = None;
        let mut caller_left: Option<Instant> = None;
        let mut ended = false;
        let id_wait = route.cfg.cascade.id_wait;
        {
            let caller = session.downstream_session.read_body_or_idle(true);
            tokio::pin!(caller);
            let mut watching = true;
            loop {
                let chunk = if watching && caller_left.is_none() {
                    tokio::select! {
                        chunk = up.read_response_body() => chunk,
                        gone = &mut caller => {
                            match gone {
                                Err(e) if left(&e) => caller_left = Some(Instant::now()),
                                // Pipelined bytes, or a body where none
                                // belongs: not a caller leaving.
                                _ => watching = false,
                            }
                            continue;
                        }
                    }
                } else if let Some(at) = caller_left {
                    // The caller is gone: read on only while an event may
                    // still name the task (then the cascade looks for it).
                    let left_to_wait = id_wait.saturating_sub(at.elapsed());
                    match tokio::time::timeout(left_to_wait, up.read_response_body()).await {
                        Ok(chunk) => chunk,
                        Err(_) => break,
                    }
                } else {
                    up.read_response_body().await
                };
                let chunk = match chunk {
                    Ok(Some(c)) => c,
                    Ok(None) => {
                        ended = true;
                        break;
                    }
                    Err(e) if caller_left.is_some() => {
                        tracing::debug!(error = %e, "the worker's stream broke after the caller left");
                        break;
                    }
                    Err(e) => return Err(e.into_up()),
                };
                parser.feed(&chunk, |item| match item {
                    SseItem::Event { data, .. } => {
                        if snapshot_history.is_none() && !ctx.track.seen.id_known {
                            snapshot_history = task_snapshot_history(data);
                        }
                        match observe::observe(binding, data) {
                            Some(o) => {
                                // The message or error ends the blocking
                                // send as it ends the stream: kept as the
                                // answer.
                                if (o.message_only || o.error) && data.len() <= ANSWER_CAP {
                                    last = Some(data.to_vec());
                                }
                                if !o.is_empty() {
                                    self.observed(ctx, o);
                                }
                            }
                            None => super::observe::unreadable_event(ctx, Untracked::BadSseEvent),
                        }
                    }
                    SseItem::Overlong => {
                        super::observe::unreadable_event(ctx, Untracked::SseEventTooLarge)
                    }
                });
                if let Some(at) = caller_left {
                    if ctx.track.seen.id_known
                        || ctx.track.seen.is_settled()
                        || at.elapsed() >= id_wait
                    {
                        break;
                    }
                }
            }
        }
        if ended {
            self.carrier_release(upstream).await;
        }
        if caller_left.is_some() {
            return Err(Error::explain(
                ErrorType::ConnectionClosed,
                "the caller left before its blocking send was answered",
            )
            .into_down());
        }
        // The stream ended: answer what the blocking send answers.
        let Some(id) = ctx.track.task_id.clone().filter(|_| last.is_none()) else {
            let body = match last {
                Some(b) => b,
                None => {
                    ctx.refuse(Refusal::WorkerFailed {
                        status: 502,
                        why: "the worker's stream ended before it named a task or answered".into(),
                    });
                    return self.answer_refusal(session, ctx).await;
                }
            };
            let status = rest_error_status(binding, &body).unwrap_or(200);
            write_answer(session, status, Some(&resp), Bytes::from(body)).await?;
            return Ok(true);
        };
        let history_length = match (plan.history_length, snapshot_history) {
            (None, Some(false)) => Some(0),
            (n, _) => n,
        };
        let get = get_task_request(&send_head, ctx, binding, &id, history_length)?;
        let (got, body) = self
            .carrier_exchange(&route, ctx.req.replica.as_deref(), get.0, get.1)
            .await?;
        let status = got.status.as_u16();
        ctx.times.answer(&got);
        match final_answer(binding, ctx.req.rpc_id.as_ref(), status, &body) {
            Some(mut answer) => {
                if ctx.budget.is_some() {
                    // A child stopped for its budget is answered with the
                    // budget-exhausted failure, as a held blocking answer is.
                    answer = self.answer_held_json(ctx, answer);
                }
                write_answer(session, 200, Some(&got), Bytes::from(answer)).await?;
                Ok(true)
            }
            None => {
                tracing::warn!(route = %route.name, task = %id, status, "GetTask after a carried send did not answer a task");
                ctx.refuse(Refusal::WorkerFailed {
                    status: 502,
                    why: format!("the worker did not answer GetTask for task {id} after its stream ended (status {status})"),
                });
                self.answer_refusal(session, ctx).await
            }
        }
    }
}

/// The JSON-RPC request with its `method` replaced, every other member's
/// value as the caller wrote it (numbers, escapes and all), in its order.
fn rename_method(body: &[u8], method: &str) -> Option<Vec<u8>> {
    use std::borrow::Cow;
    struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);
    impl<'de> serde::Deserialize<'de> for Members<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Members<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> std::result::Result<Self::Value, A::Error> {
                    let mut out = Vec::new();
                    while let Some(k) = map.next_key::<Cow<'de, str>>()? {
                        out.push((k, map.next_value::<&'de RawValue>()?));
                    }
                    Ok(Members(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    let Members(members) = serde_json::from_slice(body).ok()?;
    let new = serde_json::to_string(method).ok()?;
    let mut out = Vec::with_capacity(body.len() + 16);
    out.push(b'{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(serde_json::to_string(k).ok()?.as_bytes());
        out.push(b':');
        let value = if k == "method" { new.as_str() } else { v.get() };
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'}');
    Some(out)
}

/// The head of the answer just read.
fn answer_head(up: &HttpSession) -> Result<ResponseHeader> {
    up.response_header()
        .cloned()
        .ok_or_else(|| Error::explain(ErrorType::InvalidHTTPHeader, "no answer head").into_up())
}

/// Whether an event that is a task snapshot (`{"task":…}`, in JSON-RPC's
/// `result` or bare) carries a `history`; `None` for other events.
fn task_snapshot_history(data: &[u8]) -> Option<bool> {
    let v: Value = serde_json::from_slice(data).ok()?;
    let r = v.get("result").unwrap_or(&v);
    Some(r.get("task")?.get("history").is_some())
}

/// The caller's connection closed or reset.
fn left(e: &Error) -> bool {
    matches!(
        e.etype(),
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::ReadTimedout
    )
}

fn split_query(path: &str) -> (&str, &str) {
    match path.find('?') {
        Some(i) => (&path[..i], &path[i..]),
        None => (path, ""),
    }
}

/// Writes one request on a fresh (or pooled) connection and reads the
/// answer's head.
async fn send_request(
    up: &mut HttpSession,
    head: RequestHeader,
    body: Option<Bytes>,
) -> Result<()> {
    up.write_request_header(Box::new(head))
        .await
        .map_err(|e| e.into_up())?;
    if let Some(body) = body {
        up.write_request_body(body, true)
            .await
            .map_err(|e| e.into_up())?;
    }
    up.finish_request_body().await.map_err(|e| e.into_up())?;
    up.read_response_header().await.map_err(|e| e.into_up())?;
    Ok(())
}

/// Reads the rest of an answer whole, up to [`ANSWER_CAP`].
async fn read_whole(up: &mut HttpSession) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = up.read_response_body().await.map_err(|e| e.into_up())? {
        if out.len() + chunk.len() > ANSWER_CAP {
            return Error::e_explain(
                ErrorType::InvalidHTTPHeader,
                format!("the worker's answer is over {ANSWER_CAP} bytes"),
            )
            .map_err(|e| e.into_up());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A REST error document's HTTP status (`{"error":{"code":404,…}}`).
fn rest_error_status(binding: Binding, body: &[u8]) -> Option<u16> {
    if binding != Binding::Rest {
        return None;
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    let code = v["error"]["code"].as_u64()?;
    u16::try_from(code).ok().filter(|c| (400..600).contains(c))
}

/// The `GetTask` that reads the carried task's final state: the send's own
/// head (its credential, tenant, injected headers), in its binding.
fn get_task_request(
    send_head: &RequestHeader,
    ctx: &Ctx,
    binding: Binding,
    id: &str,
    history_length: Option<u64>,
) -> Result<(RequestHeader, Option<Bytes>)> {
    let mut head = send_head.clone();
    head.remove_header(&http::header::ACCEPT);
    match binding {
        Binding::Rest => {
            let (path, _) = split_query(&ctx.req.upstream_path);
            let base = path.strip_suffix("message:send").unwrap_or(path);
            let mut target = format!("{base}tasks/{}", percent_encode_segment(id));
            if let Some(n) = history_length {
                target.push_str(&format!("?historyLength={n}"));
            }
            head.set_method(http::Method::GET);
            head.set_uri(
                target
                    .parse()
                    .or_err(ErrorType::InternalError, "GetTask path")?,
            );
            head.remove_header(&http::header::CONTENT_LENGTH);
            head.remove_header(&http::header::CONTENT_TYPE);
            Ok((head, None))
        }
        _ => {
            let mut params = serde_json::json!({ "id": id });
            if let Some(t) = &ctx.req.tenant {
                params["tenant"] = Value::from(t.as_str());
            }
            if let Some(n) = history_length {
                params["historyLength"] = Value::from(n);
            }
            let body = serde_json::json!({
                "jsonrpc": "2.0",
                "id": ctx.req.rpc_id.clone().unwrap_or(Value::Null),
                "method": "GetTask",
                "params": params,
            });
            let body = Bytes::from(body.to_string());
            head.set_uri(
                ctx.req
                    .upstream_path
                    .parse()
                    .or_err(ErrorType::InternalError, "GetTask path")?,
            );
            head.insert_header("content-length", body.len().to_string())?;
            Ok((head, Some(body)))
        }
    }
}

/// The blocking send's answer from `GetTask`'s: the task, in the send's
/// envelope (JSON-RPC `{"jsonrpc","id","result":{"task":…}}`, REST
/// `{"task":…}`), the task's bytes as the worker wrote them. `None`: the
/// answer was not a task.
fn final_answer(
    binding: Binding,
    rpc_id: Option<&Value>,
    status: u16,
    body: &[u8],
) -> Option<Vec<u8>> {
    if !(200..300).contains(&status) {
        return None;
    }
    let task: &RawValue = match binding {
        Binding::Rest => serde_json::from_slice(body).ok()?,
        _ => {
            #[derive(serde::Deserialize)]
            struct Envelope<'a> {
                #[serde(borrow)]
                result: Option<&'a RawValue>,
            }
            serde_json::from_slice::<Envelope>(body).ok()?.result?
        }
    };
    if !task.get().trim_start().starts_with('{') {
        return None;
    }
    let mut out = Vec::with_capacity(task.get().len() + 64);
    match binding {
        Binding::Rest => {
            out.extend_from_slice(b"{\"task\":");
            out.extend_from_slice(task.get().as_bytes());
            out.push(b'}');
        }
        _ => {
            out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
            let id = rpc_id.cloned().unwrap_or(Value::Null);
            out.extend_from_slice(id.to_string().as_bytes());
            out.extend_from_slice(b",\"result\":{\"task\":");
            out.extend_from_slice(task.get().as_bytes());
            out.extend_from_slice(b"}}");
        }
    }
    Some(out)
}

/// Writes the carried send's answer: `status`, the worker's content type
/// (JSON by default), the body with its length.
async fn write_answer(
    session: &mut Session,
    status: u16,
    worker: Option<&ResponseHeader>,
    body: Bytes,
) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(3))?;
    let content_type = worker
        .filter(|w| !super::observe::is_sse(w))
        .and_then(|w| w.headers.get(http::header::CONTENT_TYPE).cloned())
        .unwrap_or(http::HeaderValue::from_static("application/json"));
    resp.insert_header(http::header::CONTENT_TYPE, content_type)?;
    resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_answers() {
        let jr = br#"{"jsonrpc":"2.0","id":7,"result":{"id":"t","status":{"state":"TASK_STATE_COMPLETED"}}}"#;
        let id = Value::from(7);
        assert_eq!(
            final_answer(Binding::JsonRpc, Some(&id), 200, jr).unwrap(),
            br#"{"jsonrpc":"2.0","id":7,"result":{"task":{"id":"t","status":{"state":"TASK_STATE_COMPLETED"}}}}"#
        );
        let rest = br#"{"id":"t","status":{}}"#;
        assert_eq!(
            final_answer(Binding::Rest, None, 200, rest).unwrap(),
            br#"{"task":{"id":"t","status":{}}}"#
        );
        let err = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32001,"message":"x"}}"#;
        assert_eq!(final_answer(Binding::JsonRpc, Some(&id), 200, err), None);
        assert_eq!(final_answer(Binding::Rest, None, 404, rest), None);
    }

    #[test]
    fn method_renamed_members_kept() {
        let body = br#"{"jsonrpc":"2.0", "id":123456789012345678901234567890,"method":"SendMessage","params":{"message":{"parts":[{"text":"\u00e9 1.50"}]}}}"#;
        assert_eq!(
            String::from_utf8(rename_method(body, "SendStreamingMessage").unwrap()).unwrap(),
            r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"SendStreamingMessage","params":{"message":{"parts":[{"text":"\u00e9 1.50"}]}}}"#
        );
        assert_eq!(rename_method(b"[1]", "x"), None);
    }

    #[test]
    fn snapshots() {
        let with = br#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","history":[]}}}"#;
        assert_eq!(task_snapshot_history(with), Some(true));
        assert_eq!(
            task_snapshot_history(br#"{"task":{"id":"t"}}"#),
            Some(false)
        );
        assert_eq!(
            task_snapshot_history(br#"{"statusUpdate":{"taskId":"t"}}"#),
            None
        );
    }

    #[test]
    fn rest_error_statuses() {
        let e = br#"{"error":{"code":404,"status":"NOT_FOUND","message":"x"}}"#;
        assert_eq!(rest_error_status(Binding::Rest, e), Some(404));
        assert_eq!(rest_error_status(Binding::JsonRpc, e), None);
        assert_eq!(rest_error_status(Binding::Rest, b"{\"message\":{}}"), None);
    }

    #[test]
    fn send_configuration() {
        let v: Value = serde_json::json!({"params": {"configuration": {"historyLength": 2}}});
        assert_eq!(history_length(&v, Binding::JsonRpc), Some(2));
        let v: Value = serde_json::json!({"message": {}});
        assert_eq!(history_length(&v, Binding::Rest), None);
    }
}
