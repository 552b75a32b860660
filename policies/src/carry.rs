//! How a blocking `SendMessage` is guarded.
//!
//! A blocking send names its task only in its one answer, when the task has
//! settled: a caller that leaves before it leaves a child the gateway has
//! not seen named. Two ways keep the guarantee:
//!
//! - **Guarded** (the default): the send passes to the worker as it came,
//!   costing what a pass-through costs; only if its caller leaves before
//!   the answer does the gateway find the child (by the task the send names,
//!   or by the sent message's `messageId` in the worker's `ListTasks`) and
//!   cancel it as any cascade.
//! - **Carried**: sent as `SendStreamingMessage`, the first event names the
//!   task; the gateway reads the stream to its end and answers the caller
//!   what the blocking send would have. Kept where the route needs the
//!   task's events while it runs (a budget's spend and deadline, a lease to
//!   start or hold), or where the worker cannot be searched.
//!
//! Where neither can be done the send passes as it came, and a caller that
//! leaves it leaves its child running (`docs/behaviour.md`, "Blocking
//! sends").

use crate::cascade::CascadeMode;

/// The route's choice (`blocking_sends`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockingSends {
    /// Guarded; carried where the route needs the task's events (and the
    /// worker's agent card says `capabilities.streaming`) or the worker
    /// cannot be searched.
    #[default]
    Auto,
    /// Always carried where it can be (JSON-RPC and REST, the body in
    /// hand): the operator knows the worker streams. gRPC sends are
    /// guarded.
    Stream,
    /// Never guarded nor carried: passed as they come.
    Pass,
}

/// What the worker's agent card says of streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerStreams {
    Yes,
    No,
    /// No card could be read.
    Unknown,
}

/// The wire a blocking send came on (a WebSocket's sends are guarded by
/// its socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendWire {
    /// JSON-RPC or REST: it can be re-sent as `SendStreamingMessage`.
    Http,
    /// gRPC unary: guarded or passed, never carried.
    Grpc,
}

/// Why the route needs a send's events while its task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeedsEvents {
    /// The child has a budget: its reported spend and its deadline are
    /// enforced on the task, which must be named while it runs.
    Budget,
    /// A lease to start (the caller's grant) or to hold (the route's
    /// imposed lease) on the task while it runs.
    Lease,
}

/// What the gateway knows of one blocking send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockingSend {
    pub wire: SendWire,
    /// The body was read whole before the worker was asked (within the
    /// pre-read limit) and read unambiguously: it can be sent as the other
    /// method.
    pub body_in_hand: bool,
    /// `configuration.returnImmediately` was set: not a blocking send.
    pub return_immediately: bool,
    pub cascade: CascadeMode,
    pub needs_events: Option<NeedsEvents>,
    /// The send names its task (`message.taskId`): a leaving caller's
    /// child needs no search.
    pub names_task: bool,
    /// The sent message's `messageId` was read: the child can be searched
    /// for in the worker's `ListTasks`.
    pub message_id: bool,
}

/// Why a send is carried as a stream (a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carried {
    /// `blocking_sends = "stream"`.
    Configured,
    /// The child's budget is enforced while it runs.
    Budget,
    /// A lease is started or held while it runs.
    Lease,
    /// The worker refused a `ListTasks` lately: a leaving caller's child
    /// could not be found.
    Unsearchable,
}

/// Why a blocking send passes unguarded (a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passed {
    /// The route detaches children: nobody would cancel one.
    Detached,
    /// Off by the route's `blocking_sends = "pass"`.
    Configured,
    /// The worker cannot be searched and does not stream (by its card, or
    /// no card could be read).
    WorkerDoesNotStream,
    /// The body was over the pre-read limit, or not read unambiguously:
    /// neither its message id nor a re-written body is at hand.
    BodyNotRead,
}

/// How a blocking send reaches the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// Passed as it came, its caller's leaving acted on.
    Guarded,
    Carried(Carried),
    Passed(Passed),
}

impl Handling {
    /// The `outcome` and `reason` labels of `a2agw_blocking_sends_total`.
    pub fn labels(self) -> (&'static str, &'static str) {
        match self {
            Handling::Guarded => ("guarded", "default"),
            Handling::Carried(c) => (
                "carried",
                match c {
                    Carried::Configured => "configured",
                    Carried::Budget => "budget",
                    Carried::Lease => "lease",
                    Carried::Unsearchable => "unsearchable",
                },
            ),
            Handling::Passed(p) => (
                "passed",
                match p {
                    Passed::Detached => "detached",
                    Passed::Configured => "configured",
                    Passed::WorkerDoesNotStream => "worker_does_not_stream",
                    Passed::BodyNotRead => "body_not_read",
                },
            ),
        }
    }
}

/// How the send is handled; `None`: not a blocking send at all (nothing to
/// count). `searchable`: the worker has not refused a `ListTasks` lately.
pub fn handle(
    setting: BlockingSends,
    send: &BlockingSend,
    worker: WorkerStreams,
    searchable: bool,
) -> Option<Handling> {
    if send.return_immediately {
        return None;
    }
    if send.cascade == CascadeMode::Detach {
        return Some(Handling::Passed(Passed::Detached));
    }
    if setting == BlockingSends::Pass {
        return Some(Handling::Passed(Passed::Configured));
    }
    let http = send.wire == SendWire::Http;
    let carry = |why| {
        (http
            && send.body_in_hand
            && (setting == BlockingSends::Stream || worker == WorkerStreams::Yes))
            .then_some(Handling::Carried(why))
    };
    let guard = (send.names_task || (send.message_id && searchable)).then_some(Handling::Guarded);
    let unguarded = || {
        Handling::Passed(if http && !send.body_in_hand {
            Passed::BodyNotRead
        } else {
            Passed::WorkerDoesNotStream
        })
    };
    Some(match (setting, send.needs_events) {
        (BlockingSends::Stream, _) => carry(Carried::Configured)
            .or(guard)
            .unwrap_or_else(unguarded),
        (_, Some(NeedsEvents::Budget)) => {
            carry(Carried::Budget).or(guard).unwrap_or_else(unguarded)
        }
        (_, Some(NeedsEvents::Lease)) => carry(Carried::Lease).or(guard).unwrap_or_else(unguarded),
        (_, None) => guard
            .or_else(|| carry(Carried::Unsearchable))
            .unwrap_or_else(unguarded),
    })
}

/// Whether the body must be parsed (whole, for re-writing) to decide: only
/// where the send would be carried with it in hand. A guarded send parses
/// nothing more than the request reader did.
pub fn needs_body(setting: BlockingSends, send: &BlockingSend, searchable: bool) -> bool {
    let best = BlockingSend {
        body_in_hand: true,
        ..*send
    };
    matches!(
        handle(setting, &best, WorkerStreams::Yes, searchable),
        Some(Handling::Carried(_))
    )
}

/// Whether the card must be read to decide: only where what it says
/// changes the outcome.
pub fn needs_card(setting: BlockingSends, send: &BlockingSend, searchable: bool) -> bool {
    handle(setting, send, WorkerStreams::Yes, searchable)
        != handle(setting, send, WorkerStreams::Unknown, searchable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use BlockingSends::*;
    use WorkerStreams::*;

    const SEND: BlockingSend = BlockingSend {
        wire: SendWire::Http,
        body_in_hand: true,
        return_immediately: false,
        cascade: CascadeMode::Cancel,
        needs_events: None,
        names_task: false,
        message_id: true,
    };

    const G: Option<Handling> = Some(Handling::Guarded);
    const fn c(why: Carried) -> Option<Handling> {
        Some(Handling::Carried(why))
    }
    const fn p(why: Passed) -> Option<Handling> {
        Some(Handling::Passed(why))
    }

    #[test]
    fn table() {
        let grpc = BlockingSend {
            wire: SendWire::Grpc,
            ..SEND
        };
        let immediate = BlockingSend {
            return_immediately: true,
            ..SEND
        };
        let detached = BlockingSend {
            cascade: CascadeMode::Detach,
            ..SEND
        };
        let large = BlockingSend {
            body_in_hand: false,
            message_id: false,
            ..SEND
        };
        let budget = BlockingSend {
            needs_events: Some(NeedsEvents::Budget),
            ..SEND
        };
        let lease = BlockingSend {
            needs_events: Some(NeedsEvents::Lease),
            ..SEND
        };
        let continuation = BlockingSend {
            names_task: true,
            message_id: false,
            ..SEND
        };
        // (setting, send, card, searchable, handling)
        let cases: &[(
            BlockingSends,
            BlockingSend,
            WorkerStreams,
            bool,
            Option<Handling>,
        )] = &[
            // The default: guarded, whatever the card says.
            (Auto, SEND, Yes, true, G),
            (Auto, SEND, No, true, G),
            (Auto, SEND, Unknown, true, G),
            // A worker that refused ListTasks: carried where it streams.
            (Auto, SEND, Yes, false, c(Carried::Unsearchable)),
            (Auto, SEND, No, false, p(Passed::WorkerDoesNotStream)),
            // ... but a continuation needs no search.
            (Auto, continuation, No, false, G),
            // Events needed: carried where the worker streams, else guarded.
            (Auto, budget, Yes, true, c(Carried::Budget)),
            (Auto, budget, No, true, G),
            (Auto, lease, Yes, false, c(Carried::Lease)),
            (Auto, lease, Unknown, true, G),
            (Auto, lease, Unknown, false, p(Passed::WorkerDoesNotStream)),
            // `stream`: carried regardless of the card.
            (Stream, SEND, No, true, c(Carried::Configured)),
            (Stream, SEND, Unknown, false, c(Carried::Configured)),
            (Stream, large, Yes, true, p(Passed::BodyNotRead)),
            (Pass, SEND, Yes, true, p(Passed::Configured)),
            (Pass, budget, Yes, true, p(Passed::Configured)),
            // gRPC: guarded, never carried.
            (Auto, grpc, Yes, true, G),
            (Stream, grpc, Yes, true, G),
            (
                Auto,
                BlockingSend {
                    needs_events: Some(NeedsEvents::Budget),
                    ..grpc
                },
                Yes,
                true,
                G,
            ),
            (Auto, grpc, Yes, false, p(Passed::WorkerDoesNotStream)),
            (Stream, immediate, Yes, true, None),
            (Auto, immediate, Yes, true, None),
            (Stream, detached, Yes, true, p(Passed::Detached)),
            (Auto, large, Yes, true, p(Passed::BodyNotRead)),
        ];
        for (i, (setting, send, worker, searchable, want)) in cases.iter().enumerate() {
            assert_eq!(
                handle(*setting, send, *worker, *searchable),
                *want,
                "case {i}"
            );
        }
    }

    /// Every combination: a body is parsed only where it carries the send,
    /// and where none is parsed, not having one changes nothing; the card
    /// is read only where it changes the outcome.
    #[test]
    fn body_and_card_asked_only_when_they_decide() {
        for setting in [Auto, Stream, Pass] {
            for wire in [SendWire::Http, SendWire::Grpc] {
                for return_immediately in [false, true] {
                    for cascade in [CascadeMode::Cancel, CascadeMode::Detach] {
                        for needs_events in
                            [None, Some(NeedsEvents::Budget), Some(NeedsEvents::Lease)]
                        {
                            for (names_task, message_id, searchable) in [
                                (false, false, true),
                                (false, true, true),
                                (true, false, true),
                                (false, true, false),
                            ] {
                                let send = BlockingSend {
                                    wire,
                                    body_in_hand: true,
                                    return_immediately,
                                    cascade,
                                    needs_events,
                                    names_task,
                                    message_id,
                                };
                                let without = BlockingSend {
                                    body_in_hand: false,
                                    ..send
                                };
                                if !needs_body(setting, &send, searchable) {
                                    for worker in [Yes, No, Unknown] {
                                        assert_eq!(
                                            handle(setting, &without, worker, searchable),
                                            handle(setting, &send, worker, searchable),
                                            "{setting:?} {send:?} {worker:?}"
                                        );
                                        assert!(!matches!(
                                            handle(setting, &send, worker, searchable),
                                            Some(Handling::Carried(_))
                                        ));
                                    }
                                }
                                if !needs_card(setting, &send, searchable) {
                                    assert_eq!(
                                        handle(setting, &send, No, searchable),
                                        handle(setting, &send, Yes, searchable),
                                        "{setting:?} {send:?}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        // The default route's plain send reads neither.
        assert!(!needs_body(Auto, &SEND, true));
        assert!(!needs_card(Auto, &SEND, true));
    }
}
