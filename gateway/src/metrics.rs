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
