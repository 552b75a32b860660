//! Per-request state, shared by every hook of one request: what the request
//! is (set by `classify` and `inspect`), how its body is read, what is
//! tracked of its task, its lease and budget parts, and how the answer is
//! read. Each concern is one part; the states of the request body and of
//! the answer are enums, so an impossible mix (a held body that is also
//! streamed, a WebSocket with an SSE parser) cannot be written.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use policies::cascade::Seen;
use policies::track::Shape;

use super::refusal::Refusal;
use super::timing::ProxyTimes;
use super::ws_session::WsSession;
use crate::a2a::grpc::GrpcFrames;
use crate::a2a::sse::SseParser;
use crate::a2a::{A2aMethod, Binding, Call};
use crate::budget::{Caller, ChildBudget};
use crate::route::Route;
use crate::store::TaskKey;

/// Per-request state.
#[derive(Debug)]
pub struct Ctx {
    pub route: Option<Arc<Route>>,
    pub call: Call,
    pub req: Request,
    pub body: RequestBody,
    pub track: Tracking,
    pub lease: Lease,
    /// The child's budget, from admission until the request ends.
    pub budget: Option<Box<Budget>>,
    pub answer: Answer,
    /// Why the request is refused, when it is.
    pub refusal: Option<Box<Refusal>>,
    /// Moments that split the request's time between the gateway and the
    /// worker, for `a2agw_proxy_seconds`.
    pub times: ProxyTimes,
    /// The request's span when traces are on (`[tracing]`, `crate::trace`).
    pub trace: Option<Box<crate::trace::RequestSpan>>,
    /// Counts the request as in flight until pingora drops its context: a
    /// graceful shutdown waits for it ([`crate::drain`]).
    _in_flight: crate::drain::InFlight,
}

impl Default for Ctx {
    fn default() -> Self {
        Ctx {
            route: None,
            call: Call::Other,
            req: Request::default(),
            body: RequestBody::Pass,
            track: Tracking::default(),
            lease: Lease::default(),
            budget: None,
            answer: Answer::Pass,
            refusal: None,
            times: ProxyTimes::default(),
            trace: None,
            _in_flight: crate::drain::InFlight::default(),
        }
    }
}

/// What the request is, from its head (`classify`) and body (`inspect`).
#[derive(Debug, Default)]
pub struct Request {
    /// The path sent to the worker (worker root + path below the prefix + query).
    pub upstream_path: String,
    /// The worker path the route's root maps to (the REST base for cancels,
    /// the base removed from card URLs).
    pub worker_root: String,
    pub binding: Option<Binding>,
    pub method: Option<A2aMethod>,
    pub tenant: Option<String>,
    /// The task id the request itself names (SubscribeToTask, GetTask, a
    /// continuation), used when the caller leaves before any event.
    pub task_id: Option<String>,
    /// A send naming no task: its message's `contextId`, by which a route
    /// with several workers sends it to the replica holding the context.
    pub context_id: Option<String>,
    /// A send that starts a new task: its message's `messageId`, by which
    /// the task is found if the caller leaves before any event names it.
    pub message_id: Option<String>,
    /// The JSON-RPC request id, for errors the gateway answers itself.
    pub rpc_id: Option<serde_json::Value>,
    /// The caller's headers the gateway's own cancel repeats (its
    /// credential, the route's `cancel_headers`), in memory only.
    pub caller_headers: Vec<(String, String)>,
    /// The caller, as the route's `budget.caller_header` names it, or as
    /// `[routes.auth]` verified it.
    pub caller: Option<Box<Caller>>,
    /// `[routes.auth]` verified the caller's `Authorization` (a JWT): it
    /// may go on to the worker. Any other `Authorization` does not.
    pub checked_jwt: bool,
    /// When the request arrived (Unix ms): a grant's deadline counts from it.
    pub received_ms: u64,
    /// The gateway answered the caller's `Expect: 100-continue` itself
    /// (it reads the body before the worker is asked).
    pub continued: bool,
    /// A send's `configuration.returnImmediately` is `true` (non-blocking).
    pub return_immediately: bool,
    /// A gRPC call (`content-type: application/grpc`), of the A2A service
    /// or another: it goes to the worker over HTTP/2.
    pub grpc: bool,
    /// On a route with several `workers`: the replica the request went to
    /// (chosen in `upstream_peer`), recorded with the task it names.
    pub replica: Option<Arc<crate::replicas::Replica>>,
    /// The send's delegation link was judged (on the first attempt to the
    /// worker; a retry only names the request again).
    pub linked: bool,
    /// A send that starts a task under a parent (delegation trees): the
    /// parent's reference and budget deadline, which its own budget
    /// inherits.
    pub parent: crate::budget::ParentHint,
}

impl Request {
    /// The call's shape as tracking sees it, from its A2A method.
    pub fn shape(&self) -> Option<Shape> {
        shape_of(self.method?)
    }

    pub fn is_send(&self) -> bool {
        matches!(
            self.method,
            Some(A2aMethod::SendMessage | A2aMethod::SendStreamingMessage)
        )
    }
}

/// The tracking shape of an A2A method.
pub fn shape_of(method: A2aMethod) -> Option<Shape> {
    Some(match method {
        A2aMethod::SendMessage => Shape::Send,
        A2aMethod::SendStreamingMessage => Shape::Stream,
        A2aMethod::SubscribeToTask => Shape::Resubscribe,
        A2aMethod::GetTask => Shape::Poll,
        _ => return None,
    })
}

/// What the request's span is told ([`crate::trace`]), from the parts of
/// its context (field by field, so that the span itself can be borrowed
/// beside them).
pub fn trace_facts<'a>(
    route: &'a Option<Arc<Route>>,
    req: &'a Request,
    track: &'a Tracking,
) -> crate::trace::Facts<'a> {
    crate::trace::Facts {
        route: route.as_ref().map(|r| &r.name),
        method: req.method.map(A2aMethod::as_str),
        binding: req.binding.map(Binding::as_str),
        tenant: req.tenant.as_deref(),
        task_id: track.task_id.as_ref(),
        request_task: req.task_id.as_deref(),
        message_id: req.message_id.as_deref(),
    }
}

impl Ctx {
    /// The worker (replica) the request went to, as the store records it
    /// with the task: recorded on every route, so that a reload that
    /// changes the route's `workers` knows where its tasks run.
    pub fn replica_name(&self) -> Option<String> {
        let route = self.route.as_ref()?;
        Some(match &self.req.replica {
            Some(r) => r.authority().to_owned(),
            None => route.addr.authority().to_owned(),
        })
    }

    /// Where the gateway's own calls for this request's task go: the
    /// replica the request went to, else the route's worker.
    pub fn worker_url(&self) -> Option<config::WorkerUrl> {
        let route = self.route.as_ref()?;
        Some(match &self.req.replica {
            Some(r) => r.url().clone(),
            None => route.cfg.worker.clone(),
        })
    }

    /// Who is asking, for ownership ([`policies::owner`]): on a route with
    /// `[routes.auth]`, the verified identity or anonymous; else unverified.
    pub fn asker(&self, route: &crate::route::Route) -> crate::store::Asker {
        match (&route.auth, &self.req.caller) {
            (None, _) => crate::store::Asker::Unverified,
            (Some(_), Some(c)) => crate::store::Asker::Identity(c.shown.as_str().into()),
            (Some(_), None) => crate::store::Asker::Anonymous,
        }
    }
}

/// How the request body is read on its way to the worker.
#[derive(Debug, Default)]
pub enum RequestBody {
    /// Passed as it comes: read before the worker was asked, or never read.
    #[default]
    Pass,
    /// Copied as it passes, up to `limits.max_inspect_body`, then inspected.
    Copy(Vec<u8>),
    /// Held whole (a budgeted route's body too large to read before
    /// connecting), admitted at its end and sent re-written if need be.
    Hold(Vec<u8>),
    /// Read before the worker was asked and re-written with its admitted
    /// grant: sent instead of the caller's (on every replay of the body).
    Replace(Bytes),
}

/// What the request knows of its task.
#[derive(Debug, Default)]
pub struct Tracking {
    pub task_id: Option<Arc<str>>,
    pub seen: Seen,
    /// How the answer is read: a stream whose caller watches the task, or
    /// one answer. `None` until the answer's head says.
    pub shape: Option<Shape>,
    /// This request counted itself as a watcher of `task_id`.
    pub watching: bool,
    /// The caller may leave before any event names its new task: a FIN from
    /// it is tolerated (pingora's `abort_on_close` off) so the worker's
    /// stream is still read until an event names the task, for at most
    /// `id_wait`; then the caller's leaving is acted on with the id known.
    pub awaiting_id: Option<Instant>,
    /// The worker refused the call (an error answer before any task).
    pub worker_refused: bool,
    /// The task's context, kept for a budget's failure event.
    pub context_id: Option<String>,
    /// A blocking send carried to the worker as a stream (`carry`): its
    /// end is judged as a stream's.
    pub carried: bool,
    /// A blocking send passed as it came, guarded: its caller leaving
    /// before the answer hands its child (named by the send, or found by
    /// its message) to the cascade.
    pub guarded: bool,
}

impl Tracking {
    /// A tracked stream is flowing to the caller.
    pub fn streaming(&self) -> bool {
        self.shape.is_some_and(Shape::is_stream)
    }
}

/// The request's lease part.
#[derive(Debug, Default)]
pub struct Lease {
    /// The request's `A2A-Extensions` (or the route's injection) activates
    /// the lease extension.
    pub extension: bool,
    /// A valid lease grant the sent message carries (TTL in ms), where the
    /// gateway enforces it.
    pub grant: Option<u64>,
    /// A gateway-held lease this connection keeps renewing.
    pub held: Option<Box<TaskKey>>,
    /// The poll lease (TTL in ms) the task of this non-blocking send gets
    /// if its answer names it unsettled (the route's `poll_lease`).
    pub poll_ms: Option<u64>,
}

/// A child's budget and what its answer needs.
#[derive(Debug)]
pub struct Budget {
    pub child: ChildBudget,
    /// SSE bytes after the last event boundary, held while the child's
    /// budget may need its last event replaced.
    pub sse_pending: Vec<u8>,
    /// The budget-exhausted failure has been sent in place of the worker's
    /// last event; nothing after it is forwarded.
    pub failure_sent: bool,
}

/// How the worker's answer is read.
#[derive(Debug, Default)]
pub enum Answer {
    /// Passed through, read not at all.
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
    /// A WebSocket upgraded by the worker: its frames are read both ways.
    WebSocket(Box<WsSession>),
    /// gRPC messages of the call's `method`: `StreamResponse`s,
    /// a `SendMessageResponse`, or a `Task`.
    Grpc(Box<GrpcFrames>, A2aMethod),
}

impl Ctx {
    /// The gateway answers this request itself with `refusal`.
    pub fn refuse(&mut self, refusal: Refusal) {
        self.refusal = Some(Box::new(refusal));
    }

    /// The request's shape when its answer must be read (see
    /// `policies::track::reads_answer`).
    pub fn tracked_shape(&self) -> Option<Shape> {
        let shape = self.req.shape()?;
        let leased = self.lease.grant.is_some() || self.lease.poll_ms.is_some();
        let (replicated, cancels_completed) = self.route.as_ref().map_or((false, false), |r| {
            (
                r.replicas.is_some(),
                r.cfg.on_parent_completed == policies::delegation::OnParentCompleted::Cancel,
            )
        });
        policies::track::reads_answer(
            shape,
            leased,
            self.budget.is_some(),
            replicated,
            cancels_completed,
        )
        .then_some(shape)
    }
}
