//! What follows from what the gateway reads in a request or an answer.
//!
//! The proxy reads HTTP bodies, SSE events and WebSocket frames into one
//! observation (a task id, a state); the functions here say what that sight
//! means for the gateway's state: record the task in the store, count a
//! watcher, start or hold a lease, tell the budget its task. They also
//! decide which answers are read at all, which requests the gateway must
//! read whole (a batch holding a send it checks), and what a store outage
//! does to a request that needs the store. The gateway applies the result in
//! one place (`gateway/src/proxy/observe.rs`, `track`).

use crate::cascade::{CascadeMode, Seen};
use crate::TaskState;

/// The shape of the call a task is seen through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A blocking or non-blocking `SendMessage`: one answer.
    Send,
    /// `SendStreamingMessage`: a stream that starts (or continues) a task.
    Stream,
    /// `SubscribeToTask`: a stream of a task started elsewhere.
    Resubscribe,
    /// `GetTask`: a poll of a task already known.
    Poll,
}

impl Shape {
    /// The answer is a stream whose caller watches the task while it lasts.
    pub fn is_stream(self) -> bool {
        matches!(self, Shape::Stream | Shape::Resubscribe)
    }
}

/// A route's lease rules, as far as tracking needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRules {
    /// The gateway enforces callers' grants (the worker does not).
    pub enforces_grants: bool,
    /// The lease imposed on streams whose caller granted none (ms).
    pub impose_ttl_ms: Option<u64>,
    /// `poll_lease` (ms): a non-blocking send's unsettled task is cancelled
    /// when no `GetTask` or `SubscribeToTask` for it came for this long.
    pub poll_ttl_ms: Option<u64>,
    pub cascade: CascadeMode,
    /// The route has several workers: where a task ran is worth a store
    /// write even for a send answered settled, so that later calls for
    /// the task (and sends continuing its context) reach that replica.
    pub records_settled_sends: bool,
}

/// A lease the gateway starts for a task it just learned of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseStart {
    /// The caller's grant, enforced by the gateway; the caller renews it.
    Granted { ttl_ms: u64 },
    /// The route's lease, held by this replica while the stream lives.
    Imposed { ttl_ms: u64 },
    /// The route's `poll_lease` on the task of a non-blocking send: renewed
    /// by every `GetTask` or `SubscribeToTask` for the task, on any replica.
    Poll { ttl_ms: u64 },
}

impl LeaseStart {
    /// The `kind` label of `a2agw_leases_started_total`.
    pub fn kind(self) -> &'static str {
        match self {
            LeaseStart::Granted { .. } => "granted",
            LeaseStart::Imposed { .. } => "imposed",
            LeaseStart::Poll { .. } => "poll",
        }
    }
}

/// What the first sight of a task on a request (or socket) calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FirstSight {
    /// Write the task to the store (its state, where to cancel it).
    pub record: bool,
    /// Count this call as a watcher of the task while it lasts.
    pub watch: bool,
    /// Start enforcing a lease on the task.
    pub lease: Option<LeaseStart>,
    /// Renew the task's imposed lease (TTL in ms) while this call lasts: any
    /// stream of the task, a resubscribe too, keeps it alive.
    pub hold_ms: Option<u64>,
    /// Keep the task in the call's own table (a socket tracks many).
    pub keep: bool,
}

/// The first time a request or socket sees `state` for a task: what to
/// record, watch and lease. `grant_ms` is the caller's valid lease grant,
/// when it sent one; a grant the worker enforces itself (`enforces_grants`
/// off) is the worker's, and the route's imposed lease applies as if none
/// was sent.
pub fn first_sight(
    shape: Shape,
    state: Option<TaskState>,
    grant_ms: Option<u64>,
    rules: &LeaseRules,
) -> FirstSight {
    first_sight_polled(shape, state, grant_ms, None, rules)
}

/// [`first_sight`] of a call that may be a non-blocking send on a route
/// with `poll_lease`: `poll_ms` is what [`poll_lease`] decided for it. The
/// task such a send's answer names unsettled gets a poll lease, unless the
/// caller's grant, which the gateway enforces, is its lease already.
pub fn first_sight_polled(
    shape: Shape,
    state: Option<TaskState>,
    grant_ms: Option<u64>,
    poll_ms: Option<u64>,
    rules: &LeaseRules,
) -> FirstSight {
    let settled = state.is_some_and(TaskState::is_settled);
    // A poll only updates a task the call already has.
    if shape == Shape::Poll {
        return FirstSight::default();
    }
    let watch = shape.is_stream();
    // A one-answer send naming a task already settled (the usual blocking
    // SendMessage) leaves nothing to cancel, watch or renew: the store is
    // spared the write.
    if !watch && settled {
        return FirstSight {
            record: rules.records_settled_sends,
            ..FirstSight::default()
        };
    }
    let mut sight = FirstSight {
        record: true,
        watch,
        keep: true,
        ..FirstSight::default()
    };
    if settled {
        return sight;
    }
    if let Some(ttl_ms) = grant_ms.filter(|_| rules.enforces_grants) {
        sight.lease = Some(LeaseStart::Granted { ttl_ms });
        return sight;
    }
    if rules.cascade == CascadeMode::Detach {
        return sight;
    }
    if let (Some(ttl_ms), Shape::Send) = (poll_ms, shape) {
        sight.lease = Some(LeaseStart::Poll { ttl_ms });
        return sight;
    }
    if let (Some(ttl_ms), Shape::Stream) = (rules.impose_ttl_ms, shape) {
        sight.lease = Some(LeaseStart::Imposed { ttl_ms });
    }
    // Any stream of the task keeps its gateway lease alive while it lasts:
    // a resubscribe holds a poll lease too (its caller watches the task;
    // no poll is needed meanwhile). Renewed at the shorter TTL's pace.
    let poll_hold = rules.poll_ttl_ms.filter(|_| shape == Shape::Resubscribe);
    sight.hold_ms = match (rules.impose_ttl_ms.filter(|_| watch), poll_hold) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    sight
}

/// The poll lease (TTL in ms) a send's task gets if its answer names it
/// unsettled: on a route with `poll_lease` (`poll_ttl_ms`), for a
/// `SendMessage` that asked `returnImmediately` (a blocking send's answer
/// comes when the task settled; a stream is the cascade's), unless the
/// caller's lease grant, enforced by the gateway, leases it already
/// (`enforced_grant`). Never on a detached route.
pub fn poll_lease(
    shape: Option<Shape>,
    return_immediately: bool,
    enforced_grant: bool,
    rules: &LeaseRules,
) -> Option<u64> {
    let non_blocking_send = shape == Some(Shape::Send) && return_immediately;
    if !non_blocking_send || enforced_grant || rules.cascade == CascadeMode::Detach {
        return None;
    }
    rules.poll_ttl_ms
}

/// Which lease renewal a request naming a task makes at the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewBy {
    /// A `GetTask` activating the lease extension (the SDK's renewal).
    GetTask,
    /// A `GetTask` or `SubscribeToTask` on a route with `poll_lease`.
    Poll,
}

impl RenewBy {
    /// The `source` label of `a2agw_lease_renewals_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            RenewBy::GetTask => "get_task",
            RenewBy::Poll => "poll",
        }
    }
}

/// Whether a request of `shape` naming a task renews the task's lease: a
/// `GetTask` with the lease extension active always (as the SDK's lease
/// store does); on a route with `poll_lease` every `GetTask` and
/// `SubscribeToTask` (a poll of the task renews its poll lease, and
/// whatever lease the task holds). One renewal per request.
pub fn renews(shape: Option<Shape>, extension: bool, route_polls: bool) -> Option<RenewBy> {
    match shape? {
        Shape::Poll if extension => Some(RenewBy::GetTask),
        Shape::Poll | Shape::Resubscribe if route_polls => Some(RenewBy::Poll),
        _ => None,
    }
}

/// A later state of a task already seen: whether the store must learn it
/// (once, when it settles; never one write per event).
pub fn records_settling(was_settled: bool, state: Option<TaskState>) -> bool {
    !was_settled && state.is_some_and(TaskState::is_settled)
}

/// A stream that watches its task (it counts as a watcher in the store)
/// saw the task settle at `state`: whether the watch ends with the settle's
/// write, one store write where the stream's end would make a second. Only
/// at a terminal state, which nothing resumes; a task handed back
/// (input-required, auth-required) is watched until the stream ends, as
/// its caller may go on with it.
pub fn unwatches_at_settle(watching: bool, state: Option<TaskState>) -> bool {
    watching && state.is_some_and(TaskState::is_terminal)
}

/// Whether an event of a stream must be read (walked for its task id,
/// state and reported spend), when its bytes show it cannot report a
/// settled state (`may_settle` false: it holds no escape and no settled
/// state's wire name as a whole string). Such an event can change nothing
/// once the stream knows its task (`seen.id_known`), has seen it in a
/// state that is not settled (a later unsettled state decides nothing a
/// `WORKING` does not: every decision asks whether the task settled) and
/// is sure of it (`unsure`: an unreadable event is cleared only by a
/// state read), and no budget reads the spend it may report. It is not
/// read then: most events of a long stream are progress (artifacts,
/// `WORKING` updates), and a tracked stream's cost was their reading.
/// `may_settle` is asked last, only when nothing else decides.
pub fn reads_event(seen: &Seen, budgeted: bool, may_settle: impl FnOnce() -> bool) -> bool {
    budgeted
        || !seen.id_known
        || seen.unsure
        || seen.is_settled()
        || seen.state.is_none()
        || may_settle()
}

/// Whether the gateway reads the answer to a call of `shape`. A stream or
/// subscription is always read (cascade, leases); a `SendMessage` answer
/// only when its child gets a lease (`leased`: the caller's grant, or a
/// poll lease), holds a budget, runs on one of several workers
/// (`replicated`: where it ran is recorded), or its route cancels the
/// children a completed parent left running (`cancels_completed`: a
/// blocking send's answer is where its task completes): no policy acts on
/// a plain one, and parsing it would cost every request.
pub fn reads_answer(
    shape: Shape,
    leased: bool,
    budget: bool,
    replicated: bool,
    cancels_completed: bool,
) -> bool {
    match shape {
        Shape::Stream | Shape::Resubscribe => true,
        Shape::Send => leased || budget || replicated || cancels_completed,
        Shape::Poll => false,
    }
}

/// One call of a JSON-RPC batch, as far as admission cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchCall {
    pub shape: Option<Shape>,
    /// The call's message carries a lease grant (valid or not).
    pub lease_grant: bool,
    /// A send asking `returnImmediately` (a non-blocking send).
    pub return_immediately: bool,
}

/// What a route checks on every send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendChecks {
    /// The route enforces budgets: every send's grant is read.
    pub budgeted: bool,
    /// The gateway enforces callers' lease grants.
    pub enforces_grants: bool,
    /// The route imposes a lease on streams without a grant.
    pub imposes: bool,
    /// The route has `poll_lease`: non-blocking sends get a poll lease.
    pub polls: bool,
}

/// Whether a JSON-RPC batch holds a send this route must check. The gateway
/// admits sends one per request (a batch's answer is one document for many
/// children), so such a batch is refused whole rather than let its sends
/// past the checks; any other batch passes untracked.
pub fn batch_must_be_read(calls: &[BatchCall], checks: &SendChecks) -> bool {
    calls.iter().any(|c| match c.shape {
        Some(Shape::Send) => {
            checks.budgeted
                || (checks.enforces_grants && c.lease_grant)
                || (checks.polls && c.return_immediately)
        }
        Some(Shape::Stream) => {
            checks.budgeted || (checks.enforces_grants && (c.lease_grant || checks.imposes))
        }
        _ => false,
    })
}

/// What a request that needs the store gets while the store is down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOutage {
    /// The store is up, or the request does not need it.
    Proceed,
    /// `fail_open`: passed, its lease untracked (counted).
    ProceedUntracked,
    /// `fail_closed`: refused, the worker never sees it.
    Refuse,
}

/// A send needs the store when the gateway must hold a lease for it: a
/// grant it enforces, a non-blocking send that gets a poll lease
/// (`polls`), or a stream the route imposes a lease on.
pub fn store_outage(
    shape: Option<Shape>,
    enforced_grant: bool,
    polls: bool,
    imposes: bool,
    store_healthy: bool,
    fail_closed: bool,
) -> StoreOutage {
    let needs_store = enforced_grant || polls || (imposes && shape == Some(Shape::Stream));
    match (needs_store && !store_healthy, fail_closed) {
        (false, _) => StoreOutage::Proceed,
        (true, true) => StoreOutage::Refuse,
        (true, false) => StoreOutage::ProceedUntracked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    const ENFORCE: LeaseRules = LeaseRules {
        enforces_grants: true,
        impose_ttl_ms: None,
        poll_ttl_ms: None,
        cascade: CascadeMode::Cancel,
        records_settled_sends: false,
    };
    const IMPOSE: LeaseRules = LeaseRules {
        enforces_grants: true,
        impose_ttl_ms: Some(30_000),
        poll_ttl_ms: None,
        cascade: CascadeMode::Cancel,
        records_settled_sends: false,
    };
    const REPLICATED: LeaseRules = LeaseRules {
        records_settled_sends: true,
        ..ENFORCE
    };
    const IMPOSE_DETACH: LeaseRules = LeaseRules {
        cascade: CascadeMode::Detach,
        ..IMPOSE
    };
    const WORKER_ENFORCES: LeaseRules = LeaseRules {
        enforces_grants: false,
        ..IMPOSE
    };
    const POLLS: LeaseRules = LeaseRules {
        poll_ttl_ms: Some(2_000),
        ..ENFORCE
    };
    const POLLS_IMPOSE: LeaseRules = LeaseRules {
        poll_ttl_ms: Some(2_000),
        ..IMPOSE
    };
    const POLLS_DETACH: LeaseRules = LeaseRules {
        cascade: CascadeMode::Detach,
        ..POLLS
    };

    fn sight(
        record: bool,
        watch: bool,
        lease: Option<LeaseStart>,
        hold_ms: Option<u64>,
    ) -> FirstSight {
        FirstSight {
            record,
            watch,
            lease,
            hold_ms,
            keep: record,
        }
    }

    /// Shape, state, grant, rules, what follows.
    type Row = (
        Shape,
        Option<TaskState>,
        Option<u64>,
        LeaseRules,
        FirstSight,
    );

    #[test]
    fn first_sight_table() {
        let granted = Some(LeaseStart::Granted { ttl_ms: 5_000 });
        let imposed = Some(LeaseStart::Imposed { ttl_ms: 30_000 });
        let nothing = FirstSight::default();
        #[rustfmt::skip]
        let table: &[Row] = &[
            // A blocking send answered settled: nothing at all.
            (Shape::Send, Some(Completed), None, ENFORCE, nothing),
            (Shape::Send, Some(InputRequired), Some(5_000), ENFORCE, nothing),
            // ... but on a route with several workers, where it ran.
            (Shape::Send, Some(Completed), None, REPLICATED, FirstSight { record: true, ..nothing }),
            (Shape::Send, Some(InputRequired), None, REPLICATED, FirstSight { record: true, ..nothing }),
            // A send answered running: recorded, not watched; its grant leased.
            (Shape::Send, Some(Working), None, ENFORCE, sight(true, false, None, None)),
            (Shape::Send, Some(Working), Some(5_000), ENFORCE, sight(true, false, granted, None)),
            (Shape::Send, None, Some(5_000), ENFORCE, sight(true, false, granted, None)),
            // Never imposed on a one-answer send.
            (Shape::Send, Some(Working), None, IMPOSE, sight(true, false, None, None)),
            // A stream: recorded and watched, settled or not.
            (Shape::Stream, Some(Completed), None, IMPOSE, sight(true, true, None, None)),
            (Shape::Stream, Some(Working), None, ENFORCE, sight(true, true, None, None)),
            (Shape::Stream, Some(Working), Some(5_000), IMPOSE, sight(true, true, granted, None)),
            (Shape::Stream, Some(Submitted), None, IMPOSE, sight(true, true, imposed, Some(30_000))),
            // A detached route imposes nothing.
            (Shape::Stream, Some(Working), None, IMPOSE_DETACH, sight(true, true, None, None)),
            // The worker enforces grants: the gateway enforces none, and
            // imposes its own lease as on a stream without a grant.
            (Shape::Stream, Some(Working), Some(5_000), WORKER_ENFORCES, sight(true, true, imposed, Some(30_000))),
            (Shape::Stream, Some(Working), None, WORKER_ENFORCES, sight(true, true, imposed, Some(30_000))),
            // A resubscribe holds (renews) the imposed lease, starts none.
            (Shape::Resubscribe, Some(Working), None, IMPOSE, sight(true, true, None, Some(30_000))),
            (Shape::Resubscribe, Some(Working), None, ENFORCE, sight(true, true, None, None)),
            (Shape::Resubscribe, Some(Canceled), None, IMPOSE, sight(true, true, None, None)),
            // A poll never creates.
            (Shape::Poll, Some(Working), Some(5_000), IMPOSE, nothing),
        ];
        for (i, (shape, state, grant, rules, want)) in table.iter().enumerate() {
            assert_eq!(
                first_sight(*shape, *state, *grant, rules),
                *want,
                "row {i}: {shape:?} {state:?} grant {grant:?}"
            );
        }
    }

    /// Shape, state, grant, poll lease decided for the send, rules.
    type PolledRow = (
        Shape,
        Option<TaskState>,
        Option<u64>,
        Option<u64>,
        LeaseRules,
        FirstSight,
    );

    #[test]
    fn poll_lease_first_sight_table() {
        let poll = Some(LeaseStart::Poll { ttl_ms: 2_000 });
        let granted = Some(LeaseStart::Granted { ttl_ms: 5_000 });
        let nothing = FirstSight::default();
        #[rustfmt::skip]
        let table: &[PolledRow] = &[
            // A non-blocking send answered running: a poll lease.
            (Shape::Send, Some(Submitted), None, Some(2_000), POLLS, sight(true, false, poll, None)),
            (Shape::Send, Some(Working), None, Some(2_000), POLLS, sight(true, false, poll, None)),
            (Shape::Send, None, None, Some(2_000), POLLS, sight(true, false, poll, None)),
            // Answered settled (input-required included): nothing to lease.
            (Shape::Send, Some(Completed), None, Some(2_000), POLLS, nothing),
            (Shape::Send, Some(InputRequired), None, Some(2_000), POLLS, nothing),
            (Shape::Send, Some(AuthRequired), None, Some(2_000), POLLS, nothing),
            // A blocking send (no poll lease decided): as before.
            (Shape::Send, Some(Working), None, None, POLLS, sight(true, false, None, None)),
            // The caller's enforced grant is the lease.
            (Shape::Send, Some(Working), Some(5_000), Some(2_000), POLLS, sight(true, false, granted, None)),
            // A detached route leases nothing.
            (Shape::Send, Some(Working), None, Some(2_000), POLLS_DETACH, sight(true, false, None, None)),
            // A resubscribe holds the poll lease while it lasts, at the
            // shorter TTL's pace when the route imposes one too.
            (Shape::Resubscribe, Some(Working), None, None, POLLS, sight(true, true, None, Some(2_000))),
            (Shape::Resubscribe, None, None, None, POLLS, sight(true, true, None, Some(2_000))),
            (Shape::Resubscribe, Some(Working), None, None, POLLS_IMPOSE, sight(true, true, None, Some(2_000))),
            (Shape::Resubscribe, Some(InputRequired), None, None, POLLS, sight(true, true, None, None)),
            (Shape::Resubscribe, Some(Working), None, None, POLLS_DETACH, sight(true, true, None, None)),
            // A stream is the cascade's: imposed or not, never polled.
            (Shape::Stream, Some(Working), None, None, POLLS, sight(true, true, None, None)),
            (Shape::Stream, Some(Working), None, None, POLLS_IMPOSE, sight(true, true, Some(LeaseStart::Imposed { ttl_ms: 30_000 }), Some(30_000))),
            // A poll never creates.
            (Shape::Poll, Some(Working), None, Some(2_000), POLLS, nothing),
        ];
        for (i, (shape, state, grant, poll_ms, rules, want)) in table.iter().enumerate() {
            assert_eq!(
                first_sight_polled(*shape, *state, *grant, *poll_ms, rules),
                *want,
                "row {i}: {shape:?} {state:?} grant {grant:?} poll {poll_ms:?}"
            );
        }
        assert_eq!(LeaseStart::Poll { ttl_ms: 1 }.kind(), "poll");
        assert_eq!(LeaseStart::Granted { ttl_ms: 1 }.kind(), "granted");
        assert_eq!(LeaseStart::Imposed { ttl_ms: 1 }.kind(), "imposed");
    }

    #[test]
    fn which_sends_get_a_poll_lease() {
        #[rustfmt::skip]
        let table = [
            // shape, returnImmediately, enforced grant, rules, poll lease
            (Some(Shape::Send), true, false, POLLS, Some(2_000)),
            (Some(Shape::Send), false, false, POLLS, None),
            (Some(Shape::Send), true, true, POLLS, None),
            (Some(Shape::Send), true, false, ENFORCE, None),
            (Some(Shape::Send), true, false, POLLS_DETACH, None),
            (Some(Shape::Stream), true, false, POLLS, None),
            (Some(Shape::Poll), true, false, POLLS, None),
            (None, true, false, POLLS, None),
        ];
        for (shape, ri, grant, rules, want) in table {
            assert_eq!(
                poll_lease(shape, ri, grant, &rules),
                want,
                "{shape:?} returnImmediately {ri} grant {grant} {rules:?}"
            );
        }
    }

    #[test]
    fn which_requests_renew() {
        use RenewBy::*;
        #[rustfmt::skip]
        let table = [
            // shape, lease extension active, route polls
            (Some(Shape::Poll), true, false, Some(GetTask)),
            (Some(Shape::Poll), true, true, Some(GetTask)),
            (Some(Shape::Poll), false, false, None),
            (Some(Shape::Poll), false, true, Some(Poll)),
            (Some(Shape::Resubscribe), false, true, Some(Poll)),
            (Some(Shape::Resubscribe), true, false, None),
            (Some(Shape::Send), true, true, None),
            (Some(Shape::Stream), true, true, None),
            (None, true, true, None),
        ];
        for (shape, ext, polls, want) in table {
            assert_eq!(
                renews(shape, ext, polls),
                want,
                "{shape:?} ext {ext} polls {polls}"
            );
        }
        assert_eq!(Poll.as_str(), "poll");
        assert_eq!(GetTask.as_str(), "get_task");
    }

    #[test]
    fn a_terminal_settle_ends_the_watch() {
        for (watching, state, ends) in [
            (true, Some(Completed), true),
            (true, Some(Failed), true),
            (true, Some(Canceled), true),
            (true, Some(Rejected), true),
            (true, Some(InputRequired), false),
            (true, Some(AuthRequired), false),
            (true, Some(Working), false),
            (true, None, false),
            (false, Some(Completed), false),
        ] {
            assert_eq!(
                unwatches_at_settle(watching, state),
                ends,
                "{watching} {state:?}"
            );
        }
    }

    #[test]
    fn settling_is_recorded_once() {
        assert!(records_settling(false, Some(Completed)));
        assert!(records_settling(false, Some(InputRequired)));
        assert!(!records_settling(true, Some(Completed)));
        assert!(!records_settling(false, Some(Working)));
        assert!(!records_settling(false, None));
    }

    #[test]
    fn which_events_are_read() {
        let sure = |state| Seen {
            id_known: true,
            state,
            ..Seen::default()
        };
        #[rustfmt::skip]
        let table = [
            // The one case left unread: task known, working, sure, no budget,
            // and the event cannot settle it.
            (sure(Some(Working)), false, false, false),
            (sure(Some(Submitted)), false, false, false),
            (sure(Some(Working)), false, true, true),
            (sure(Some(Working)), true, false, true),
            (Seen { id_known: false, ..sure(Some(Working)) }, false, false, true),
            (Seen { unsure: true, ..sure(Some(Working)) }, false, false, true),
            (sure(None), false, false, true),
            // Handed back: an event may resume it.
            (sure(Some(InputRequired)), false, false, true),
            (sure(Some(Completed)), false, false, true),
            (Seen { message_only: true, ..sure(Some(Working)) }, false, false, true),
        ];
        for (seen, budgeted, may_settle, want) in table {
            assert_eq!(
                reads_event(&seen, budgeted, || may_settle),
                want,
                "{seen:?} {budgeted} {may_settle}"
            );
        }
    }

    #[test]
    fn which_answers_are_read() {
        #[rustfmt::skip]
        let table = [
            (Shape::Send, false, false, false, false, false),
            (Shape::Send, true, false, false, false, true),
            (Shape::Send, false, true, false, false, true),
            (Shape::Send, false, false, true, false, true),
            (Shape::Send, false, false, false, true, true),
            (Shape::Stream, false, false, false, false, true),
            (Shape::Resubscribe, false, false, false, false, true),
            (Shape::Poll, true, true, true, true, false),
        ];
        for (shape, lease, budget, replicated, completed, want) in table {
            assert_eq!(
                reads_answer(shape, lease, budget, replicated, completed),
                want,
                "{shape:?} {lease} {budget} {replicated} {completed}"
            );
        }
    }

    #[test]
    fn batches_that_must_be_read() {
        let send = |lease_grant| BatchCall {
            shape: Some(Shape::Send),
            lease_grant,
            return_immediately: false,
        };
        let non_blocking = BatchCall {
            return_immediately: true,
            ..send(false)
        };
        let stream = |lease_grant| BatchCall {
            shape: Some(Shape::Stream),
            lease_grant,
            return_immediately: false,
        };
        let poll = BatchCall {
            shape: Some(Shape::Poll),
            lease_grant: true,
            return_immediately: true,
        };
        let checks = |budgeted, enforces_grants, imposes| SendChecks {
            budgeted,
            enforces_grants,
            imposes,
            polls: false,
        };
        let polls = SendChecks {
            polls: true,
            ..checks(false, true, false)
        };
        #[rustfmt::skip]
        let table: &[(&[BatchCall], SendChecks, bool)] = &[
            (&[send(false), poll], checks(false, true, true), false),
            (&[send(false)], checks(true, false, false), true),
            (&[send(true)], checks(false, true, false), true),
            (&[send(true)], checks(false, false, true), false),
            (&[stream(false)], checks(false, true, true), true),
            (&[stream(false)], checks(false, true, false), false),
            (&[stream(false)], checks(false, false, true), false),
            (&[poll, poll], checks(true, true, true), false),
            // A non-blocking send on a route with poll_lease; a blocking
            // one there, and a non-blocking one elsewhere, pass.
            (&[poll, non_blocking], polls, true),
            (&[send(false)], polls, false),
            (&[non_blocking], checks(false, true, true), false),
            (&[poll], polls, false),
            (&[], checks(true, true, true), false),
        ];
        for (i, (calls, c, want)) in table.iter().enumerate() {
            assert_eq!(batch_must_be_read(calls, c), *want, "row {i}");
        }
    }

    #[test]
    fn store_outage_table() {
        use StoreOutage::*;
        #[rustfmt::skip]
        let table = [
            // shape, enforced grant, poll lease, imposes, healthy, fail_closed
            (Some(Shape::Send), true, false, false, true, true, Proceed),
            (Some(Shape::Send), true, false, false, false, true, Refuse),
            (Some(Shape::Send), true, false, false, false, false, ProceedUntracked),
            (Some(Shape::Send), false, false, true, false, true, Proceed),
            (Some(Shape::Send), false, true, false, false, true, Refuse),
            (Some(Shape::Send), false, true, false, false, false, ProceedUntracked),
            (Some(Shape::Send), false, true, false, true, true, Proceed),
            (Some(Shape::Stream), false, false, true, false, true, Refuse),
            (Some(Shape::Stream), false, false, false, false, true, Proceed),
            (Some(Shape::Poll), false, false, true, false, true, Proceed),
            (None, false, false, true, false, true, Proceed),
        ];
        for (shape, grant, polls, imposes, healthy, closed, want) in table {
            assert_eq!(
                store_outage(shape, grant, polls, imposes, healthy, closed),
                want,
                "{shape:?} grant {grant} polls {polls} imposes {imposes} healthy {healthy} closed {closed}"
            );
        }
    }
}
