//! Prometheus metrics, served as text on the admin endpoint's `/metrics`.
//!
//! Labels are low-cardinality by construction: route names come from config,
//! every other label value is a `&'static str` chosen in code.

use std::sync::LazyLock;

use prometheus::{
    register_gauge, register_histogram_vec, register_int_counter_vec, register_int_gauge, Gauge,
    HistogramVec, IntCounterVec, IntGauge,
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
    "Requests by route and A2A call kind.",
    &["route", "call"]
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
}

impl Untracked {
    /// Every reason, for documentation and tests.
    pub const ALL: [Untracked; 24] = [
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

/// Blocking `SendMessage` calls by what became of them: `carried` to the
/// worker as a stream, or why they passed as they came (see
/// `policies::carry::Passed`).
pub static BLOCKING_SENDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "a2agw_blocking_sends_total",
        "Blocking SendMessage calls: carried to the worker as a stream, or passed as they came (by reason).",
        &["route", "outcome"]
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

/// Renders every registered metric in the Prometheus text format.
pub fn render() -> String {
    use prometheus::Encoder;
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
