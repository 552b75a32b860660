//! Prometheus metrics, served as text on the admin endpoint's `/metrics`.
//!
//! Labels are low-cardinality by construction: route names come from config,
//! every other label value is a `&'static str` chosen in code.

use std::sync::LazyLock;

use prometheus::{
    register_gauge, register_histogram_vec, register_int_counter_vec, register_int_gauge,
    register_int_gauge_vec, Gauge, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec,
};

macro_rules! counter {
    ($name:ident, $metric:literal, $help:literal, $labels:expr) => {
        pub static $name: LazyLock<IntCounterVec> = LazyLock::new(|| {
            register_int_counter_vec!($metric, $help, $labels).expect("metric registers once")
        });
    };
}

counter!(
    REQUESTS,
    "a2agw_requests_total",
    "Requests by route, A2A method, binding and status class (counted as each ends; status none: no answer was written, e.g. the caller left first).",
    &["route", "method", "binding", "status"]
);
counter!(
    WORKER_ERRORS,
    "a2agw_worker_errors_total",
    "Requests whose worker failed them, by kind: connect, timeout, reset, 5xx (an answer with a 5xx status), other.",
    &["route", "kind"]
);
counter!(
    BUDGET_CLAMPS,
    "a2agw_budget_clamps_total",
    "Grants lowered to a cap, by field (remainingMs or a capped meter).",
    &["route", "field"]
);
counter!(
    BUDGET_INJECTED,
    "a2agw_budget_injected_total",
    "Sends without a grant that got one from the route's caps.",
    &["route"]
);
counter!(
    BUDGET_EXHAUSTED,
    "a2agw_budget_exhausted_total",
    "Children the gateway cancelled for their budget, by what ran out (time or meter).",
    &["route", "by"]
);
counter!(
    BUDGET_RESERVED,
    "a2agw_budget_reserved_total",
    "Amounts reserved from accounts for starting children, by meter.",
    &["route", "meter"]
);
counter!(
    BUDGET_CHARGED,
    "a2agw_budget_charged_total",
    "Amounts charged to accounts when children settled, by meter.",
    &["route", "meter"]
);
counter!(
    TASKS_TRACKED,
    "a2agw_tasks_tracked_total",
    "Tasks whose id the gateway learned from a worker's answer.",
    &["route"]
);
counter!(
    CASCADE_DECISIONS,
    "a2agw_cascade_decisions_total",
    "What the gateway decided when a tracked stream ended.",
    &["route", "decision"]
);
counter!(
    CANCELS,
    "a2agw_cancels_total",
    "Gateway-sent CancelTask calls by final outcome.",
    &["route", "cause", "outcome"]
);
counter!(
    TREE_LINKS,
    "a2agw_tree_links_total",
    "Sends that carried a delegation reference, by what became of them: child (linked under the parent), too_deep (the parent at [delegation] max_depth), continues (a send continuing a task gains no parent), dropped (the parent holds the most children), store_error.",
    &["route", "outcome"]
);
counter!(
    STORE_FAILOVERS,
    "a2agw_store_failovers_total",
    "Times the Redis store moved its connection to a new primary that Sentinel named, by the primary's name (master).",
    &["master"]
);
counter!(
    TREE_CANCELS,
    "a2agw_tree_cancels_total",
    "Children of ended parents, by cause (parent_canceled, parent_failed, parent_completed) and outcome: canceled, not_cancelable, not_found, failed, not_owed (another replica carries it), elsewhere, settled (left alone: ended or handed back), lost (its route or replica gone).",
    &["route", "cause", "outcome"]
);
counter!(
    CANCEL_PROBES,
    "a2agw_cancel_probes_total",
    "GetTask calls sent before a CancelTask whose task's state the gateway could not see, by what they found (settled: not cancelled).",
    &["route", "found"]
);
counter!(
    CANCEL_ATTEMPTS,
    "a2agw_cancel_attempts_total",
    "CancelTask attempts, retries included.",
    &["route"]
);
counter!(
    TASKS_LOST,
    "a2agw_tasks_lost_total",
    "Tasks whose worker replica the route no longer has, or that did not answer past the cancel's retries: never sent to another replica as if it were theirs.",
    &["route"]
);
counter!(UNREACHABLE, "a2agw_unreachable_children_total", "Children whose caller left before any event named them: a task may run on that nobody can cancel.", &["route"]);
counter!(
    UNTRACKED,
    "a2agw_untracked_total",
    "Traffic passed through without tracking, by reason.",
    &["reason"]
);
counter!(
    CARDS_REWRITTEN,
    "a2agw_agent_cards_rewritten_total",
    "Agent cards whose interface URLs were rewritten.",
    &["route", "outcome"]
);
counter!(
    STORE_ERRORS,
    "a2agw_store_errors_total",
    "Store operations that failed.",
    &["op"]
);
counter!(
    WORKER_RESOLVE_ERRORS,
    "a2agw_worker_resolve_errors_total",
    "Failed lookups of a worker's host name (a request or cancel that found no address is answered or retried; a failed refresh keeps the last address).",
    &["worker"]
);
counter!(
    NO_ROUTE,
    "a2agw_no_route_total",
    "Requests that matched no route (answered 404).",
    &["listener"]
);

/// Why traffic passed without tracking (`a2agw_untracked_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Untracked {
    /// A POST that is no JSON-RPC request (passed verbatim).
    NotJsonrpc,
    /// A JSON-RPC batch with nothing the route must check.
    JsonrpcBatch,
    /// A request body over `limits.max_inspect_body`, passed unread.
    RequestBodyTooLarge,
    /// An answer over `limits.max_inspect_body`, passed unread.
    ResponseBodyTooLarge,
    /// An answer that is no A2A JSON document.
    BadJsonResponse,
    /// An SSE event that is no A2A JSON document.
    BadSseEvent,
    /// An SSE event over `limits.max_sse_event`.
    SseEventTooLarge,
    /// A compressed answer, passed unread.
    EncodedResponse,
    /// A compressed agent card, passed unrewritten.
    EncodedCard,
    /// An agent card over `limits.max_card_body`, passed unrewritten.
    CardTooLarge,
    /// A lease not enforced because the store was down (`fail-open`).
    StoreUnavailable,
    /// A budget not reserved because the store was down (`fail-open`).
    BudgetStoreUnavailable,
    /// A store update dropped: the tracker's queue was full.
    TrackerQueueFull,
    /// `Sec-WebSocket-Extensions` removed so frames stay readable.
    WsExtensionsDeclined,
    /// A binary WebSocket message.
    WsBinary,
    /// A WebSocket message over `limits.max_inspect_body`.
    WsMessageTooLarge,
    /// A compressed WebSocket message.
    WsCompressed,
    /// WebSocket framing the parser could not follow.
    WsInvalidFraming,
    /// A WebSocket text message that is no JSON-RPC request.
    WsNotJsonrpc,
    /// A JSON-RPC batch over WebSocket.
    WsJsonrpcBatch,
    /// A WebSocket request over the socket's pending bound.
    WsTooManyPending,
    /// A task over the socket's task table bound.
    WsTooManyTasks,
    /// A lease grant over WebSocket the gateway could not enforce.
    WsInvalidLeaseGrant,
    /// A worker's WebSocket answer that is no A2A document.
    WsBadAnswer,
    /// A gRPC request whose body is not one uncompressed A2A message.
    GrpcBadRequest,
    /// A gRPC answer message that is no A2A message.
    BadGrpcMessage,
    /// A compressed gRPC message (flag 1), passed unread.
    CompressedGrpcMessage,
    /// A gRPC message over `limits.max_sse_event`.
    GrpcMessageTooLarge,
}

impl Untracked {
    /// Every reason, for documentation and tests.
    pub const ALL: [Untracked; 28] = [
        Untracked::NotJsonrpc,
        Untracked::JsonrpcBatch,
        Untracked::RequestBodyTooLarge,
        Untracked::ResponseBodyTooLarge,
        Untracked::BadJsonResponse,
        Untracked::BadSseEvent,
        Untracked::SseEventTooLarge,
        Untracked::EncodedResponse,
        Untracked::EncodedCard,
        Untracked::CardTooLarge,
        Untracked::StoreUnavailable,
        Untracked::BudgetStoreUnavailable,
        Untracked::TrackerQueueFull,
        Untracked::WsExtensionsDeclined,
        Untracked::WsBinary,
        Untracked::WsMessageTooLarge,
        Untracked::WsCompressed,
        Untracked::WsInvalidFraming,
        Untracked::WsNotJsonrpc,
        Untracked::WsJsonrpcBatch,
        Untracked::WsTooManyPending,
        Untracked::WsTooManyTasks,
        Untracked::WsInvalidLeaseGrant,
        Untracked::WsBadAnswer,
        Untracked::GrpcBadRequest,
        Untracked::BadGrpcMessage,
        Untracked::CompressedGrpcMessage,
        Untracked::GrpcMessageTooLarge,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Untracked::NotJsonrpc => "not_jsonrpc",
            Untracked::JsonrpcBatch => "jsonrpc_batch",
            Untracked::RequestBodyTooLarge => "request_body_too_large",
            Untracked::ResponseBodyTooLarge => "response_body_too_large",
            Untracked::BadJsonResponse => "bad_json_response",
            Untracked::BadSseEvent => "bad_sse_event",
            Untracked::SseEventTooLarge => "sse_event_too_large",
            Untracked::EncodedResponse => "encoded_response",
            Untracked::EncodedCard => "encoded_card",
            Untracked::CardTooLarge => "card_too_large",
            Untracked::StoreUnavailable => "store_unavailable",
            Untracked::BudgetStoreUnavailable => "budget_store_unavailable",
            Untracked::TrackerQueueFull => "tracker_queue_full",
            Untracked::WsExtensionsDeclined => "ws_extensions_declined",
            Untracked::WsBinary => "ws_binary",
            Untracked::WsMessageTooLarge => "ws_message_too_large",
            Untracked::WsCompressed => "ws_compressed",
            Untracked::WsInvalidFraming => "ws_invalid_framing",
            Untracked::WsNotJsonrpc => "ws_not_jsonrpc",
            Untracked::WsJsonrpcBatch => "ws_jsonrpc_batch",
            Untracked::WsTooManyPending => "ws_too_many_pending",
            Untracked::WsTooManyTasks => "ws_too_many_tasks",
            Untracked::WsInvalidLeaseGrant => "ws_invalid_lease_grant",
            Untracked::WsBadAnswer => "ws_bad_answer",
            Untracked::GrpcBadRequest => "grpc_bad_request",
            Untracked::BadGrpcMessage => "bad_grpc_message",
            Untracked::CompressedGrpcMessage => "compressed_grpc_message",
            Untracked::GrpcMessageTooLarge => "grpc_message_too_large",
        }
    }

    /// Counts one.
    pub fn count(self) {
        UNTRACKED.with_label_values(&[self.as_str()]).inc();
    }
}

/// Time from the decision to cancel to the worker's answer.
pub static CANCEL_LATENCY: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "a2agw_cancel_latency_seconds",
        "From deciding to cancel to the worker's final answer.",
        &["route"],
        vec![0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
    )
    .expect("metric registers once")
});

/// The time a request spends in the gateway itself: what a caller waits
/// for beyond the worker. Kept apart from the worker's own time so that a
/// slow worker does not hide (or pass for) a slow gateway.
pub static PROXY_TIME: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "a2agw_proxy_seconds",
        "Time a request spent in the gateway (pingora included), not waiting on the worker: from its head read to the worker connection ready to take it, plus from the worker's answer head to the answer written to the caller. Requests answered by the worker with a non-streaming answer only.",
        &["route"],
        // Fine below a millisecond, where a pass-through's time lies.
        vec![
            0.000025, 0.00005, 0.000075, 0.0001, 0.000125, 0.00015, 0.000175, 0.0002, 0.00025,
            0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            1.0
        ]
    )
    .expect("metric registers once")
});

/// Owed cancels this replica claimed from the store's outbox: their
/// replica was gone (its heartbeat expired), or their last try failed and
/// was handed back.
pub static OUTBOX_CLAIMS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "a2agw_outbox_claims_total",
        "Owed cancels claimed from the store's outbox (their replica was gone, or their last try failed).",
        &["route"]
    )
    .expect("metric registers once")
});

/// `ListTasks` pages the gateway asked for to find children by their
/// message: what leaving callers cost the worker, besides each found
/// child's `GetTask` and `CancelTask`.
pub static LOOKUP_PAGES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "a2agw_lookup_pages_total",
        "ListTasks pages asked for to find children by their message (batched per worker).",
        &["route"]
    )
    .expect("metric registers once")
});

/// Children whose caller left before any event named them, looked for by
/// their message (`ListTasks`): `found` (then cancelled as any other), or
/// `not_found` within `id_wait`.
pub static CHILDREN_LOOKED_UP: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "a2agw_children_looked_up_total",
        "Children whose caller left before any event named them, looked for with ListTasks, by outcome.",
        &["route", "outcome"]
    )
    .expect("metric registers once")
});

/// Blocking `SendMessage` calls by what became of them
/// (`policies::carry::Handling::labels`): `guarded`, `carried` to the
/// worker as a stream, or `passed` unguarded, each with why.
pub static BLOCKING_SENDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "a2agw_blocking_sends_total",
        "Blocking SendMessage calls: guarded (passed, the caller's leaving acted on), carried to the worker as a stream, or passed unguarded; by reason.",
        &["route", "outcome", "reason"]
    )
    .expect("metric registers once")
});

/// Streams being watched right now on this replica.
pub static OPEN_STREAMS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "a2agw_open_tracked_streams",
        "Tracked streams open on this replica."
    )
    .expect("metric registers once")
});

/// The Redis server's clock minus this replica's, as the heartbeats
/// estimate it (not exported on the memory store). Deadlines follow the
/// server's clock whatever it is; a large value says the host's time sync
/// is off.
pub static STORE_CLOCK_OFFSET: LazyLock<Gauge> = LazyLock::new(|| {
    register_gauge!(
        "a2agw_store_clock_offset_seconds",
        "The store's clock minus this replica's, as estimated from the heartbeats."
    )
    .expect("metric registers once")
});

/// `a2agw_build_info{version}`: always 1; its label says which release
/// runs (join on it to see a rollout, or to tell replicas apart).
pub static BUILD_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "a2agw_build_info",
        "The running release: always 1, its version in the label.",
        &["version"]
    )
    .expect("metric registers once")
});

/// Registers what is not counted as requests go: the build's info, the
/// open-streams gauge, and the process's own metrics (`process_resident_memory_bytes`,
/// `process_open_fds`, `process_cpu_seconds_total`, … read from
/// `/proc/self` at each scrape, Linux only). Called by [`render`]; once.
fn register_static() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        BUILD_INFO
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // At 0 before the first stream opens it.
        LazyLock::force(&OPEN_STREAMS);
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            if let Err(e) = prometheus::register(Box::new(pc)) {
                tracing::warn!(error = %e, "process metrics not exported");
            }
        }
    });
}

/// Renders every registered metric in the Prometheus text format.
pub fn render() -> String {
    use prometheus::Encoder;
    register_static();
    let mut buf = Vec::new();
    let enc = prometheus::TextEncoder::new();
    if enc.encode(&prometheus::gather(), &mut buf).is_err() {
        return String::new();
    }
    String::from_utf8(buf).unwrap_or_default()
}

counter!(
    LEASES_STARTED,
    "a2agw_leases_started_total",
    "Leases the gateway started enforcing: granted by the caller, or imposed by the route.",
    &["route", "kind"]
);
counter!(
    LEASE_RENEWALS,
    "a2agw_lease_renewals_total",
    "Lease renewals by outcome (renewed, lapsed, no_lease) and source (get_task, held).",
    &["route", "source", "outcome"]
);
counter!(
    LEASES_LAPSED,
    "a2agw_leases_lapsed_total",
    "Lapsed leases this replica claimed and cancelled.",
    &["route"]
);
counter!(
    REFUSALS,
    "a2agw_refusals_total",
    "Requests refused before reaching the worker, by reason.",
    &["route", "reason"]
);
counter!(
    CONFIG_RELOADS,
    "a2agw_config_reloads_total",
    "Config reloads (SIGHUP or POST /reload) by outcome: applied, or refused (the running config kept).",
    &["outcome"]
);

/// What a request was, as `a2agw_requests_total{method, binding}` names it:
/// a fixed set, so that the labels stay bounded whatever callers send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Called {
    /// An A2A method over JSON-RPC (read from the body), REST (from the
    /// verb and path) or gRPC (from the path). A WebSocket counts as
    /// [`Called::Upgrade`].
    Method(crate::a2a::Binding, crate::a2a::A2aMethod),
    /// A `POST` to the JSON-RPC endpoint whose method the gateway did not
    /// read or know: a batch, a v0.3 method, no JSON-RPC, a body passed
    /// unread.
    JsonRpcOther,
    /// `GET …/.well-known/agent-card.json`.
    AgentCard,
    /// A WebSocket upgrade (its messages are not counted one by one).
    Upgrade,
    /// Anything else (a path that is no A2A call, a request matching no
    /// route).
    Other,
}

const METHODS: usize = crate::a2a::A2aMethod::ALL.len();

impl Called {
    /// How many (method, binding) pairs there are.
    pub const COUNT: usize = 3 * METHODS + 4;

    fn index(self) -> usize {
        use crate::a2a::Binding;
        match self {
            Called::Method(binding, m) => {
                let i = crate::a2a::A2aMethod::ALL
                    .iter()
                    .position(|x| *x == m)
                    .unwrap_or(0);
                match binding {
                    Binding::JsonRpc => i,
                    Binding::Rest => METHODS + i,
                    Binding::Grpc => 2 * METHODS + i,
                    Binding::WebSocket => Called::Upgrade.index(),
                }
            }
            Called::JsonRpcOther => 3 * METHODS,
            Called::AgentCard => 3 * METHODS + 1,
            Called::Upgrade => 3 * METHODS + 2,
            Called::Other => 3 * METHODS + 3,
        }
    }

    /// Every value, in [`Called::index`] order.
    pub fn all() -> impl Iterator<Item = Called> {
        use crate::a2a::{A2aMethod, Binding};
        let jsonrpc = A2aMethod::ALL.map(|m| Called::Method(Binding::JsonRpc, m));
        let rest = A2aMethod::ALL.map(|m| Called::Method(Binding::Rest, m));
        let grpc = A2aMethod::ALL.map(|m| Called::Method(Binding::Grpc, m));
        jsonrpc.into_iter().chain(rest).chain(grpc).chain([
            Called::JsonRpcOther,
            Called::AgentCard,
            Called::Upgrade,
            Called::Other,
        ])
    }

    /// The `method` and `binding` labels.
    pub fn labels(self) -> (&'static str, &'static str) {
        match self {
            Called::Method(crate::a2a::Binding::WebSocket, _) => Called::Upgrade.labels(),
            Called::Method(b, m) => (m.as_str(), b.as_str()),
            Called::JsonRpcOther => ("other", "jsonrpc"),
            Called::AgentCard => ("agent_card", "none"),
            Called::Upgrade => ("upgrade", "websocket"),
            Called::Other => ("other", "none"),
        }
    }
}

/// The `status` label values of `a2agw_requests_total`: the class of the
/// status written to the caller, or `none` when none was (the caller left
/// before an answer, or the connection broke first).
pub const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];

/// Classes whose series every route exports from start, at 0: what
/// dashboards and alerts divide by.
const PRESET_STATUS: [usize; 3] = [1, 3, 4];

fn status_index(status: Option<u16>) -> usize {
    match status {
        None => 5,
        Some(s) => usize::from(s / 100).clamp(1, 5) - 1,
    }
}

/// The `kind` label values of `a2agw_worker_errors_total`.
pub const WORKER_ERROR_KINDS: [&str; 5] = ["connect", "timeout", "reset", "5xx", "other"];

/// How a worker failed a request (`a2agw_worker_errors_total{kind}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerError {
    /// No connection: refused, unreachable, the TLS handshake failed.
    Connect,
    /// A connect, TLS handshake, read or write timed out.
    Timeout,
    /// The connection broke (closed or reset) mid-request.
    Reset,
    /// The worker answered with a 5xx status.
    Status5xx,
    /// Anything else from the worker's side (an answer pingora could not
    /// read as HTTP, …).
    Other,
}

impl WorkerError {
    fn index(self) -> usize {
        match self {
            WorkerError::Connect => 0,
            WorkerError::Timeout => 1,
            WorkerError::Reset => 2,
            WorkerError::Status5xx => 3,
            WorkerError::Other => 4,
        }
    }
}

/// Buckets for the worker's time to first byte: a quick answer takes well
/// under a millisecond on a local worker, a model's first token seconds.
const TTFB_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The worker's time to first byte: from the request handed to the worker's
/// connection to its answer head.
pub static WORKER_TTFB: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "a2agw_worker_ttfb_seconds",
        "Worker time to first byte: from the request handed to the worker connection (after connecting) to the worker's answer head, request body included. Every answer the worker gave (streams, upgrades and carried blocking sends: the time to their head).",
        &["route"],
        TTFB_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});

/// One route's request metrics, resolved when the route is built so that
/// counting a request is an array index and an atomic add, not a label
/// lookup: `a2agw_requests_total`, `a2agw_worker_errors_total`,
/// `a2agw_worker_ttfb_seconds`.
pub struct RouteMetrics {
    route: std::sync::Arc<str>,
    /// [`Called::COUNT`] × [`STATUS_CLASSES`], resolved on first use (the
    /// [`PRESET_STATUS`] ones at once).
    requests: Box<[std::sync::OnceLock<prometheus::IntCounter>]>,
    worker_errors: [prometheus::IntCounter; 5],
    ttfb: prometheus::Histogram,
    /// `a2agw_blocking_sends_total{outcome="guarded"}`: counted on every
    /// plain blocking send, so resolved once (on first use).
    guarded_sends: std::sync::OnceLock<prometheus::IntCounter>,
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMetrics")
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

impl RouteMetrics {
    /// Counts one blocking send as `policies::carry` handled it.
    pub fn blocking_send(&self, handling: policies::carry::Handling) {
        let series = || {
            let (outcome, reason) = handling.labels();
            BLOCKING_SENDS.with_label_values(&[&self.route, outcome, reason])
        };
        match handling {
            policies::carry::Handling::Guarded => self.guarded_sends.get_or_init(series).inc(),
            _ => series().inc(),
        }
    }

    /// The route's series; its 2xx, 4xx and 5xx requests of every kind, its
    /// worker errors of every kind, and the cascade, lease and budget
    /// counters its dashboard and alerts watch are exported from now on, at
    /// 0, so that rates over them exist before the first one. `""`: requests that
    /// matched no route.
    pub fn new(route: &str) -> Self {
        let requests: Box<[std::sync::OnceLock<prometheus::IntCounter>]> = (0..Called::COUNT
            * STATUS_CLASSES.len())
            .map(|_| std::sync::OnceLock::new())
            .collect();
        let m = RouteMetrics {
            route: route.into(),
            requests,
            worker_errors: WORKER_ERROR_KINDS.map(|k| WORKER_ERRORS.with_label_values(&[route, k])),
            ttfb: WORKER_TTFB.with_label_values(&[route]),
            guarded_sends: std::sync::OnceLock::new(),
        };
        if !route.is_empty() {
            // What the alerts watch, at 0 before the first (the cascade
            // counts them by route name).
            UNREACHABLE.with_label_values(&[route]);
            CANCEL_ATTEMPTS.with_label_values(&[route]);
            LEASES_LAPSED.with_label_values(&[route]);
            BUDGET_INJECTED.with_label_values(&[route]);
            for kind in ["granted", "imposed", "poll"] {
                LEASES_STARTED.with_label_values(&[route, kind]);
            }
            for by in ["time", "meter"] {
                BUDGET_EXHAUSTED.with_label_values(&[route, by]);
            }
            for cause in [
                "caller_gone",
                "stream_lost",
                "lease_lapsed",
                "budget_exhausted",
            ] {
                CANCELS.with_label_values(&[route, cause, "failed"]);
            }
            for called in Called::all() {
                for s in PRESET_STATUS {
                    m.request_counter(called, s);
                }
            }
        }
        m
    }

    fn request_counter(&self, called: Called, status: usize) -> &prometheus::IntCounter {
        self.requests[called.index() * STATUS_CLASSES.len() + status].get_or_init(|| {
            let (method, binding) = called.labels();
            REQUESTS.with_label_values(&[&self.route, method, binding, STATUS_CLASSES[status]])
        })
    }

    /// Counts one request that ended with `status` written to the caller
    /// (`None`: nothing was).
    pub fn count_request(&self, called: Called, status: Option<u16>) {
        self.request_counter(called, status_index(status)).inc();
    }

    /// Counts a request the worker failed.
    pub fn worker_error(&self, kind: WorkerError) {
        self.worker_errors[kind.index()].inc();
    }

    /// Observes the worker's time to first byte.
    pub fn worker_ttfb(&self, d: std::time::Duration) {
        self.ttfb.observe(d.as_secs_f64());
    }
}

/// Requests that matched no route: `route=""`.
pub static NO_ROUTE_REQUESTS: LazyLock<RouteMetrics> = LazyLock::new(|| RouteMetrics::new(""));

/// `a2agw_jwks_stale{route}`: 1 while the route's JWKS keys are dropped
/// because no read of its `jwks_file` or `jwks_url` succeeded within
/// `jwks_max_stale` (every JWT refused), else 0. Set for each route with
/// such keys when it is built.
pub static JWKS_STALE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "a2agw_jwks_stale",
        "1 while the route's JWT keys are dropped: no JWKS read succeeded within jwks_max_stale (every JWT refused).",
        &["route"]
    )
    .expect("metric registers once")
});

/// `a2agw_replica_up{route,replica}`: 1 while a replica of a route with
/// several (`workers`) passed its last health check and its last
/// connection did not fail, else 0. Set by each check.
pub static REPLICA_UP: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "a2agw_replica_up",
        "1 while a worker replica passed its last health check and no connection to it failed since.",
        &["route", "replica"]
    )
    .expect("metric registers once")
});

#[cfg(test)]
mod route_metrics_tests {
    use super::*;

    #[test]
    fn every_called_has_its_own_index_and_labels() {
        let all: Vec<Called> = Called::all().collect();
        assert_eq!(all.len(), Called::COUNT);
        for (i, c) in all.iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
        }
        let mut labels: Vec<_> = all.iter().map(|c| c.labels()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), Called::COUNT);
    }

    #[test]
    fn status_classes() {
        let cases = [
            (None, "none"),
            (Some(101), "1xx"),
            (Some(200), "2xx"),
            (Some(304), "3xx"),
            (Some(404), "4xx"),
            (Some(503), "5xx"),
            (Some(999), "5xx"),
        ];
        for (s, class) in cases {
            assert_eq!(STATUS_CLASSES[status_index(s)], class, "{s:?}");
        }
    }
}
