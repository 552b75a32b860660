//! Whether a blocking `SendMessage` is carried to the worker as a stream.
//!
//! A blocking send names its task only in its one answer, when the task has
//! settled: a caller that leaves before it leaves a child the gateway cannot
//! name, so cannot cancel. Carried as `SendStreamingMessage`, the first
//! event names the task; the gateway reads the stream to its end and answers
//! the caller what the blocking send would have (the task as `GetTask`
//! reads it then, or the message, or the error). Where that cannot be done
//! the send passes as it came, and a caller that leaves it leaves its child
//! running (`docs/behaviour.md`, "Blocking sends").

use crate::cascade::CascadeMode;

/// The route's choice (`blocking_sends`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockingSends {
    /// Carried when the worker's agent card says it streams
    /// (`capabilities.streaming`).
    #[default]
    Auto,
    /// Always carried: the operator knows the worker streams.
    Stream,
    /// Never carried: passed as they come.
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

/// What the gateway knows of one blocking send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockingSend {
    /// JSON-RPC or REST (a WebSocket's sends are tracked by its socket).
    pub http_binding: bool,
    /// The body was read whole before the worker was asked (within the
    /// pre-read limit): it can be sent as the other method.
    pub body_in_hand: bool,
    /// `configuration.returnImmediately` was set: not a blocking send.
    pub return_immediately: bool,
    pub cascade: CascadeMode,
}

/// Why a blocking send passes as it came (a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passed {
    /// The route detaches children: nobody would cancel one.
    Detached,
    /// Off by the route's `blocking_sends = "pass"`.
    Configured,
    /// The worker's card does not say it streams (or could not be read).
    WorkerDoesNotStream,
    /// The body was over the pre-read limit, or not read unambiguously.
    BodyNotRead,
}

impl Passed {
    pub fn as_str(self) -> &'static str {
        match self {
            Passed::Detached => "detached",
            Passed::Configured => "configured",
            Passed::WorkerDoesNotStream => "worker_does_not_stream",
            Passed::BodyNotRead => "body_not_read",
        }
    }
}

/// Whether the send is carried as a stream (`Ok`), or passes and why.
/// `None`: not a blocking send over HTTP at all (nothing to count).
pub fn carry(
    setting: BlockingSends,
    send: &BlockingSend,
    worker: WorkerStreams,
) -> Option<Result<(), Passed>> {
    if !send.http_binding || send.return_immediately {
        return None;
    }
    Some(if send.cascade == CascadeMode::Detach {
        Err(Passed::Detached)
    } else if setting == BlockingSends::Pass {
        Err(Passed::Configured)
    } else if !send.body_in_hand {
        Err(Passed::BodyNotRead)
    } else if setting == BlockingSends::Auto && worker != WorkerStreams::Yes {
        Err(Passed::WorkerDoesNotStream)
    } else {
        Ok(())
    })
}

/// Whether the body must be parsed to decide: not when the send passes (or
/// is no blocking send) for a reason `carry` weighs before the body, which
/// neither the body nor the card can change (the binding,
/// `returnImmediately`, a detaching route, `pass`). `send.body_in_hand` is
/// not asked: a send that needs no body gets the same answer from `carry`
/// without one, so a route on `pass` parses nothing.
pub fn needs_body(setting: BlockingSends, send: &BlockingSend) -> bool {
    let best = BlockingSend {
        body_in_hand: true,
        ..*send
    };
    carry(setting, &best, WorkerStreams::Yes) == Some(Ok(()))
}

/// Whether the card must be read to decide (only `auto` asks it, and only
/// for a send that would otherwise be carried).
pub fn needs_card(setting: BlockingSends, send: &BlockingSend) -> bool {
    setting == BlockingSends::Auto
        && carry(BlockingSends::Stream, send, WorkerStreams::Unknown) == Some(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use BlockingSends::*;
    use WorkerStreams::*;

    const SEND: BlockingSend = BlockingSend {
        http_binding: true,
        body_in_hand: true,
        return_immediately: false,
        cascade: CascadeMode::Cancel,
    };

    type Case = (
        BlockingSends,
        BlockingSend,
        WorkerStreams,
        Option<Result<(), Passed>>,
    );

    #[test]
    fn table() {
        let ws = BlockingSend {
            http_binding: false,
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
            ..SEND
        };
        let cases: &[Case] = &[
            (Auto, SEND, Yes, Some(Ok(()))),
            (Auto, SEND, No, Some(Err(Passed::WorkerDoesNotStream))),
            (Auto, SEND, Unknown, Some(Err(Passed::WorkerDoesNotStream))),
            (Stream, SEND, No, Some(Ok(()))),
            (Stream, SEND, Unknown, Some(Ok(()))),
            (Pass, SEND, Yes, Some(Err(Passed::Configured))),
            (Auto, ws, Yes, None),
            (Stream, immediate, Yes, None),
            (Stream, detached, Yes, Some(Err(Passed::Detached))),
            (Stream, large, Yes, Some(Err(Passed::BodyNotRead))),
        ];
        for (i, (setting, send, worker, want)) in cases.iter().enumerate() {
            assert_eq!(carry(*setting, send, *worker), *want, "case {i}");
        }
    }

    #[test]
    fn body_parsed_only_when_it_decides() {
        let cases: &[(BlockingSends, BlockingSend, bool)] = &[
            (Auto, SEND, true),
            (Stream, SEND, true),
            (Pass, SEND, false),
            (
                Auto,
                BlockingSend {
                    http_binding: false,
                    ..SEND
                },
                false,
            ),
            (
                Stream,
                BlockingSend {
                    return_immediately: true,
                    ..SEND
                },
                false,
            ),
            (
                Stream,
                BlockingSend {
                    cascade: CascadeMode::Detach,
                    ..SEND
                },
                false,
            ),
        ];
        for (i, (setting, send, want)) in cases.iter().enumerate() {
            assert_eq!(needs_body(*setting, send), *want, "case {i}");
        }
        // Where no body is needed, not having one changes nothing, whatever
        // the card says: every combination.
        for setting in [Auto, Stream, Pass] {
            for http_binding in [false, true] {
                for return_immediately in [false, true] {
                    for cascade in [CascadeMode::Cancel, CascadeMode::Detach] {
                        let send = BlockingSend {
                            http_binding,
                            body_in_hand: true,
                            return_immediately,
                            cascade,
                        };
                        if needs_body(setting, &send) {
                            continue;
                        }
                        let without = BlockingSend {
                            body_in_hand: false,
                            ..send
                        };
                        for worker in [Yes, No, Unknown] {
                            assert_eq!(
                                carry(setting, &without, worker),
                                carry(setting, &send, Yes),
                                "{setting:?} {send:?} {worker:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn card_asked_only_when_it_decides() {
        assert!(needs_card(Auto, &SEND));
        assert!(!needs_card(Stream, &SEND));
        assert!(!needs_card(Pass, &SEND));
        let large = BlockingSend {
            body_in_hand: false,
            ..SEND
        };
        assert!(!needs_card(Auto, &large));
    }
}
