//! When a caller goes away, does its child task get a `CancelTask`?
//!
//! The gateway sees a task through the stream of one call (`SendStreamingMessage`,
//! `SubscribeToTask`). When that call ends, the gateway asks [`decide`] what to
//! do with what it saw; the answer may be to wait (for the task's id, or for a
//! grace in which the caller may resubscribe) and to ask again.

use std::time::Duration;

use crate::TaskState;

/// What a route does with a child whose caller went away unsettled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CascadeMode {
    /// Send `CancelTask` to the worker (after the grace, if any).
    #[default]
    Cancel,
    /// Leave the child running: the caller owns its lifetime.
    Detach,
}

impl CascadeMode {
    /// The spelling used in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            CascadeMode::Cancel => "cancel",
            CascadeMode::Detach => "detach",
        }
    }

    /// Reads the config spelling (`"cancel"`, `"detach"`).
    pub fn parse(s: &str) -> Option<CascadeMode> {
        match s {
            "cancel" => Some(CascadeMode::Cancel),
            "detach" => Some(CascadeMode::Detach),
            _ => None,
        }
    }
}

/// What the gateway has seen of one task on one stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Seen {
    /// Some event named the task's id.
    pub id_known: bool,
    /// The latest state any event reported.
    pub state: Option<TaskState>,
    /// The worker answered with a `message` before any task id: there is no
    /// task to cancel (the a2a-rust `Delegation` counts this as settled).
    pub message_only: bool,
    /// An event after the latest state could not be read (over the size
    /// limits, or not A2A): it may have settled the task, so `state` may be
    /// stale. Cleared by the next event that carries a state.
    pub unsure: bool,
    /// The worker was asked for the task's state ([`Decision::Probe`]) and
    /// its answer is folded in: never asked twice.
    pub probed: bool,
}

impl Seen {
    /// Settled: a terminal or interrupted state, or a message-only reply.
    pub fn is_settled(&self) -> bool {
        self.message_only || self.state.is_some_and(TaskState::is_settled)
    }

    /// The gateway cannot tell from what it saw whether the task settled:
    /// no event carried a state (the id came from the request, as for
    /// `SubscribeToTask`), or a later event was unreadable.
    pub fn state_unknown(&self) -> bool {
        self.state.is_none() || self.unsure
    }
}

/// Folds the state the store holds for a task (the last any stream of any
/// replica recorded) into what this stream saw. A settled record wins; an
/// unsettled one only fills a gap, and is then marked unsure: another
/// stream's last sight of the task, maybe long ago, is not enough to cancel
/// on without asking the worker.
pub fn merge_record(seen: &mut Seen, recorded: Option<TaskState>) {
    let Some(s) = recorded else { return };
    if s.is_settled() {
        seen.state = Some(s);
    } else if seen.state.is_none() {
        seen.state = Some(s);
        seen.unsure = true;
    }
}

/// Per-route knobs of the cascade.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CascadePolicy {
    pub mode: CascadeMode,
    /// After the caller goes, how long a `SubscribeToTask` for the task keeps
    /// it alive. Zero cancels at once.
    pub disconnect_grace: Duration,
    /// After the caller goes before any event named the task, how long the
    /// gateway keeps reading the worker's stream to learn the id.
    pub id_wait: Duration,
    /// Whether a blocking `SendMessage` is carried to the worker as a stream,
    /// so that its caller leaving can be acted on (`crate::carry`).
    pub blocking_sends: crate::carry::BlockingSends,
}

impl Default for CascadePolicy {
    fn default() -> Self {
        CascadePolicy {
            mode: CascadeMode::Cancel,
            disconnect_grace: Duration::ZERO,
            id_wait: DEFAULT_ID_WAIT,
            blocking_sends: crate::carry::BlockingSends::Auto,
        }
    }
}

/// The a2a-rust SDK's `DEFAULT_ID_WAIT`.
pub const DEFAULT_ID_WAIT: Duration = Duration::from_secs(5);

/// What ended (or may end) the gateway's watch over a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The caller's connection closed or reset, or its HTTP/2 stream was reset.
    CallerGone,
    /// The worker's stream ended or broke while the caller was still there.
    StreamLost,
    /// The `id_wait` after [`Decision::AwaitId`] passed.
    IdWaitElapsed,
    /// The grace after [`Decision::AwaitGrace`] passed.
    GraceElapsed,
}

/// Why nothing is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Terminal, interrupted, or a message-only reply.
    Settled,
    /// The route detaches children.
    Detached,
    /// Another caller is streaming the task through the gateway (it was
    /// already, or resubscribed within the grace).
    Watched,
}

/// Why a `CancelTask` is owed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelCause {
    CallerGone,
    StreamLost,
}

impl CancelCause {
    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelCause::CallerGone => "caller_gone",
            CancelCause::StreamLost => "stream_lost",
        }
    }
}

/// What the gateway does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Send nothing.
    Keep(Keep),
    /// Send `CancelTask` now.
    Cancel(CancelCause),
    /// A cancel is owed unless the task already settled, which the gateway
    /// could not see ([`Seen::state_unknown`]): ask the worker (`GetTask`),
    /// fold its answer into [`Seen`] with `probed` set, and decide again on
    /// the same event. A task handed back (input-required) is never
    /// cancelled for want of having seen it hand back.
    Probe(CancelCause),
    /// Keep reading the worker's stream for up to this long to learn the id,
    /// then decide again (with the id, or with [`Event::IdWaitElapsed`]).
    AwaitId(Duration),
    /// Wait this long for a resubscribe, then decide on [`Event::GraceElapsed`].
    AwaitGrace(Duration),
    /// No id came in time: a child may be running that nobody can cancel.
    /// Logged and counted, never silently dropped.
    Unreachable,
}

/// Decides what to do about a task when `event` happens; `watchers` is how
/// many *other* callers stream the task through the gateway right now.
///
/// Settled tasks and detaching routes are never cancelled, nor is a task
/// someone else still watches; otherwise the gateway needs the task's id
/// (waiting `id_wait` for it), then honours the grace, then cancels.
pub fn decide(policy: &CascadePolicy, seen: &Seen, event: Event, watchers: u32) -> Decision {
    if seen.is_settled() {
        return Decision::Keep(Keep::Settled);
    }
    if policy.mode == CascadeMode::Detach {
        return Decision::Keep(Keep::Detached);
    }
    let cause = match event {
        Event::CallerGone => CancelCause::CallerGone,
        Event::StreamLost => CancelCause::StreamLost,
        Event::IdWaitElapsed if !seen.id_known => return Decision::Unreachable,
        Event::IdWaitElapsed => CancelCause::CallerGone,
        Event::GraceElapsed if watchers > 0 => return Decision::Keep(Keep::Watched),
        Event::GraceElapsed => return cancel(seen, CancelCause::CallerGone),
    };
    if !seen.id_known {
        return Decision::AwaitId(policy.id_wait);
    }
    if watchers > 0 {
        return Decision::Keep(Keep::Watched);
    }
    if !policy.disconnect_grace.is_zero() {
        return Decision::AwaitGrace(policy.disconnect_grace);
    }
    cancel(seen, cause)
}

/// Whether a stream's end is decided without the store: it saw its task
/// settle and no longer counts as a watcher ([`crate::track::unwatches_at_settle`]),
/// so [`decide`] keeps the task whatever the record says: nothing to read,
/// nothing to write, nothing to wait for.
pub fn settled_at_end(seen: &Seen, watching: bool) -> bool {
    seen.is_settled() && !watching
}

/// A cancel, or first a probe when the task may have settled unseen.
fn cancel(seen: &Seen, cause: CancelCause) -> Decision {
    if seen.state_unknown() && !seen.probed {
        Decision::Probe(cause)
    } else {
        Decision::Cancel(cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn seen(id_known: bool, state: Option<TaskState>) -> Seen {
        Seen {
            id_known,
            state,
            ..Seen::default()
        }
    }

    #[test]
    fn a_settled_stream_that_no_longer_watches_ends_at_once() {
        use TaskState::*;
        for (state, watching, at_once) in [
            (Some(Completed), false, true),
            (Some(InputRequired), false, true),
            (Some(Completed), true, false),
            (Some(Working), false, false),
            (None, false, false),
        ] {
            let s = seen(true, state);
            assert_eq!(
                settled_at_end(&s, watching),
                at_once,
                "{state:?} {watching}"
            );
            if at_once {
                // What `decide` would say after reading any record.
                for w in [0, 3] {
                    let p = policy(CascadeMode::Cancel, Duration::ZERO);
                    assert_eq!(
                        decide(&p, &s, Event::CallerGone, w),
                        Decision::Keep(Keep::Settled)
                    );
                }
            }
        }
        let message_only = Seen {
            message_only: true,
            ..Seen::default()
        };
        assert!(settled_at_end(&message_only, false));
    }

    fn policy(mode: CascadeMode, grace: Duration) -> CascadePolicy {
        CascadePolicy {
            mode,
            disconnect_grace: grace,
            id_wait: 5 * S,
            ..CascadePolicy::default()
        }
    }

    #[test]
    fn decision_table() {
        use CascadeMode::*;
        use TaskState::*;
        let working = seen(true, Some(Working));
        let no_id = seen(false, None);
        let message = Seen {
            message_only: true,
            ..Seen::default()
        };
        let unsure = Seen {
            unsure: true,
            ..working
        };
        let probed = |s: Seen| Seen { probed: true, ..s };
        let table: Vec<(&str, CascadePolicy, Seen, Event, u32, Decision)> = vec![
            (
                "working, caller gone",
                policy(Cancel, Duration::ZERO),
                working,
                Event::CallerGone,
                0,
                Decision::Cancel(CancelCause::CallerGone),
            ),
            (
                "working, stream lost",
                policy(Cancel, Duration::ZERO),
                working,
                Event::StreamLost,
                0,
                Decision::Cancel(CancelCause::StreamLost),
            ),
            (
                "submitted is not settled",
                policy(Cancel, Duration::ZERO),
                seen(true, Some(Submitted)),
                Event::CallerGone,
                0,
                Decision::Cancel(CancelCause::CallerGone),
            ),
            (
                "id seen, no state yet: ask the worker first",
                policy(Cancel, Duration::ZERO),
                seen(true, None),
                Event::CallerGone,
                0,
                Decision::Probe(CancelCause::CallerGone),
            ),
            (
                "id seen, no state, asked: the worker did not say settled",
                policy(Cancel, Duration::ZERO),
                probed(seen(true, None)),
                Event::CallerGone,
                0,
                Decision::Cancel(CancelCause::CallerGone),
            ),
            (
                "asked: the worker said input-required",
                policy(Cancel, Duration::ZERO),
                probed(seen(true, Some(InputRequired))),
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "an unreadable event after working: ask the worker first",
                policy(Cancel, Duration::ZERO),
                unsure,
                Event::StreamLost,
                0,
                Decision::Probe(CancelCause::StreamLost),
            ),
            (
                "unsure, asked, still working",
                policy(Cancel, Duration::ZERO),
                probed(unsure),
                Event::StreamLost,
                0,
                Decision::Cancel(CancelCause::StreamLost),
            ),
            (
                "unsure waits out the grace before asking",
                policy(Cancel, 2 * S),
                unsure,
                Event::CallerGone,
                0,
                Decision::AwaitGrace(2 * S),
            ),
            (
                "unsure, grace over: ask",
                policy(Cancel, 2 * S),
                unsure,
                Event::GraceElapsed,
                0,
                Decision::Probe(CancelCause::CallerGone),
            ),
            (
                "unsure but watched: nothing to ask",
                policy(Cancel, Duration::ZERO),
                unsure,
                Event::CallerGone,
                1,
                Decision::Keep(Keep::Watched),
            ),
            (
                "unsure, detached",
                policy(Detach, Duration::ZERO),
                unsure,
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Detached),
            ),
            (
                "completed",
                policy(Cancel, Duration::ZERO),
                seen(true, Some(Completed)),
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "failed",
                policy(Cancel, Duration::ZERO),
                seen(true, Some(Failed)),
                Event::StreamLost,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "canceled",
                policy(Cancel, Duration::ZERO),
                seen(true, Some(Canceled)),
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "rejected",
                policy(Cancel, Duration::ZERO),
                seen(true, Some(Rejected)),
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "input-required is handed back",
                policy(Cancel, Duration::ZERO),
                seen(true, Some(InputRequired)),
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "auth-required is handed back",
                policy(Cancel, Duration::ZERO),
                seen(true, Some(AuthRequired)),
                Event::StreamLost,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "message-only reply",
                policy(Cancel, Duration::ZERO),
                message,
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "detach",
                policy(Detach, Duration::ZERO),
                working,
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Detached),
            ),
            (
                "detach, lost",
                policy(Detach, Duration::ZERO),
                working,
                Event::StreamLost,
                0,
                Decision::Keep(Keep::Detached),
            ),
            (
                "detach, no id",
                policy(Detach, Duration::ZERO),
                no_id,
                Event::CallerGone,
                0,
                Decision::Keep(Keep::Detached),
            ),
            (
                "no id yet",
                policy(Cancel, Duration::ZERO),
                no_id,
                Event::CallerGone,
                0,
                Decision::AwaitId(5 * S),
            ),
            (
                "no id, lost",
                policy(Cancel, Duration::ZERO),
                no_id,
                Event::StreamLost,
                0,
                Decision::AwaitId(5 * S),
            ),
            (
                "no id in time",
                policy(Cancel, Duration::ZERO),
                no_id,
                Event::IdWaitElapsed,
                0,
                Decision::Unreachable,
            ),
            (
                "id came during the wait",
                policy(Cancel, Duration::ZERO),
                working,
                Event::IdWaitElapsed,
                0,
                Decision::Cancel(CancelCause::CallerGone),
            ),
            (
                "id came during the wait, grace",
                policy(Cancel, 2 * S),
                working,
                Event::IdWaitElapsed,
                0,
                Decision::AwaitGrace(2 * S),
            ),
            (
                "settled during the wait",
                policy(Cancel, Duration::ZERO),
                seen(true, Some(Completed)),
                Event::IdWaitElapsed,
                0,
                Decision::Keep(Keep::Settled),
            ),
            (
                "grace",
                policy(Cancel, 2 * S),
                working,
                Event::CallerGone,
                0,
                Decision::AwaitGrace(2 * S),
            ),
            (
                "grace, nobody came back",
                policy(Cancel, 2 * S),
                working,
                Event::GraceElapsed,
                0,
                Decision::Cancel(CancelCause::CallerGone),
            ),
            (
                "grace, resubscribed",
                policy(Cancel, 2 * S),
                working,
                Event::GraceElapsed,
                1,
                Decision::Keep(Keep::Watched),
            ),
            (
                "someone else watches",
                policy(Cancel, Duration::ZERO),
                working,
                Event::CallerGone,
                1,
                Decision::Keep(Keep::Watched),
            ),
            (
                "someone else watches, lost",
                policy(Cancel, 2 * S),
                working,
                Event::StreamLost,
                2,
                Decision::Keep(Keep::Watched),
            ),
            (
                "grace, settled meanwhile",
                policy(Cancel, 2 * S),
                seen(true, Some(Completed)),
                Event::GraceElapsed,
                0,
                Decision::Keep(Keep::Settled),
            ),
        ];
        for (name, policy, seen, event, watchers, want) in table {
            assert_eq!(decide(&policy, &seen, event, watchers), want, "{name}");
        }
    }

    #[test]
    fn merging_a_record() {
        use TaskState::*;
        let saw = |state, unsure| Seen {
            id_known: true,
            state,
            unsure,
            ..Seen::default()
        };
        #[rustfmt::skip]
        let table = [
            // what the stream saw, what the store holds, the result
            (saw(Some(Working), false), None, saw(Some(Working), false)),
            (saw(Some(Working), false), Some(Completed), saw(Some(Completed), false)),
            (saw(Some(Working), true), Some(InputRequired), saw(Some(InputRequired), true)),
            (saw(Some(Working), false), Some(Submitted), saw(Some(Working), false)),
            (saw(None, false), Some(Working), saw(Some(Working), true)),
            (saw(None, false), Some(Canceled), saw(Some(Canceled), false)),
            (saw(None, false), None, saw(None, false)),
        ];
        for (i, (mut seen, recorded, want)) in table.into_iter().enumerate() {
            merge_record(&mut seen, recorded);
            assert_eq!(seen, want, "row {i}");
        }
    }

    #[test]
    fn mode_spellings() {
        for mode in [CascadeMode::Cancel, CascadeMode::Detach] {
            assert_eq!(CascadeMode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(CascadeMode::parse("Cancel"), None);
        assert_eq!(CascadeMode::default(), CascadeMode::Cancel);
    }
}
