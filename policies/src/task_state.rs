//! The A2A v1.0 task state machine, as far as delegation policy needs it.

use std::fmt;

/// A task's state as the A2A v1.0 wire spells it (`TASK_STATE_*`).
///
/// The gateway only needs to know which states end a task (terminal) and
/// which hand it back to the caller (interrupted); both are *settled*, and a
/// settled task is never cancelled on a caller's behalf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    Unspecified,
    Submitted,
    Working,
    Completed,
    Failed,
    Canceled,
    InputRequired,
    Rejected,
    AuthRequired,
}

impl TaskState {
    /// Every state, in the proto's order (stores derive their lists of
    /// terminal and settled states from it).
    pub const ALL: [TaskState; 9] = [
        TaskState::Unspecified,
        TaskState::Submitted,
        TaskState::Working,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::InputRequired,
        TaskState::Rejected,
        TaskState::AuthRequired,
    ];

    /// Does not compile once a state is added, so `ALL` gets it too.
    const fn _all_listed(self) {
        match self {
            TaskState::Unspecified
            | TaskState::Submitted
            | TaskState::Working
            | TaskState::Completed
            | TaskState::Failed
            | TaskState::Canceled
            | TaskState::InputRequired
            | TaskState::Rejected
            | TaskState::AuthRequired => {}
        }
    }

    /// Reads a state from the wire. Accepts the v1.0 `TASK_STATE_*` names and
    /// the lower-case input aliases (`input-required`, …) that peers accept;
    /// anything else is `None`, so an unknown state never counts as settled.
    pub fn from_wire(s: &str) -> Option<TaskState> {
        Self::from_wire_bytes(s.as_bytes())
    }

    /// The v1.0 wire name.
    pub fn as_wire(self) -> &'static str {
        self.wire_names()[0]
    }
    /// The task is over and nothing can change it: completed, failed,
    /// canceled or rejected.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }

    /// The task is handed back to the caller (input-required, auth-required):
    /// the worker's stream closes, and the task waits for a continuation.
    pub fn is_interrupted(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }

    /// Terminal or interrupted: the worker is no longer spending on the
    /// caller's behalf, so a caller leaving is no reason to cancel.
    pub fn is_settled(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }
}

/// `from_wire_bytes` and `wire_names`, from one table: a state's v1.0 name
/// first, then its lower-case alias where it has one.
macro_rules! wire_names {
    ($($state:ident: $name:literal $(| $alias:literal)?;)*) => {
        impl TaskState {
            /// [`TaskState::from_wire`] on raw bytes: a reader that looks
            /// for a state in a document before reading it need not check
            /// the bytes are UTF-8 first (every name is ASCII).
            pub fn from_wire_bytes(s: &[u8]) -> Option<TaskState> {
                Some(match s {
                    $($name $(| $alias)? => TaskState::$state,)*
                    _ => return None,
                })
            }

            /// Every name [`TaskState::from_wire`] reads as this state: the
            /// v1.0 name, and its lower-case alias where it has one. For a
            /// reader that looks for states in raw bytes before it reads
            /// them (the gateway's `may_settle` finds settled states by
            /// their names' ends, `ed`/`ED`, and length, checked on this
            /// list).
            pub fn wire_names(self) -> &'static [&'static str] {
                match self {
                    $(TaskState::$state => &const { [ascii($name) $(, ascii($alias))?] },)*
                }
            }
        }
    };
}

wire_names! {
    Unspecified: b"TASK_STATE_UNSPECIFIED";
    Submitted: b"TASK_STATE_SUBMITTED" | b"submitted";
    Working: b"TASK_STATE_WORKING" | b"working";
    Completed: b"TASK_STATE_COMPLETED" | b"completed";
    Failed: b"TASK_STATE_FAILED" | b"failed";
    Canceled: b"TASK_STATE_CANCELED" | b"canceled";
    InputRequired: b"TASK_STATE_INPUT_REQUIRED" | b"input-required";
    Rejected: b"TASK_STATE_REJECTED" | b"rejected";
    AuthRequired: b"TASK_STATE_AUTH_REQUIRED" | b"auth-required";
}

/// A wire name as text (at compile time: every name is ASCII).
const fn ascii(name: &'static [u8]) -> &'static str {
    match std::str::from_utf8(name) {
        Ok(s) => s,
        Err(_) => panic!("a wire name is not ASCII"),
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_wire())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        // (state, terminal, interrupted, settled)
        let table = [
            (TaskState::Unspecified, false, false, false),
            (TaskState::Submitted, false, false, false),
            (TaskState::Working, false, false, false),
            (TaskState::Completed, true, false, true),
            (TaskState::Failed, true, false, true),
            (TaskState::Canceled, true, false, true),
            (TaskState::InputRequired, false, true, true),
            (TaskState::Rejected, true, false, true),
            (TaskState::AuthRequired, false, true, true),
        ];
        assert_eq!(table.len(), TaskState::ALL.len());
        for (state, terminal, interrupted, settled) in table {
            assert_eq!(state.is_terminal(), terminal, "{state}");
            assert_eq!(state.is_interrupted(), interrupted, "{state}");
            assert_eq!(state.is_settled(), settled, "{state}");
        }
    }

    #[test]
    fn wire_names_round_trip() {
        for state in TaskState::ALL {
            assert_eq!(TaskState::from_wire(state.as_wire()), Some(state));
            assert_eq!(state.wire_names()[0], state.as_wire());
            for name in state.wire_names() {
                assert_eq!(TaskState::from_wire(name), Some(state), "{name}");
            }
        }
    }

    #[test]
    fn aliases_and_unknowns() {
        let table = [
            ("input-required", Some(TaskState::InputRequired)),
            ("auth-required", Some(TaskState::AuthRequired)),
            ("canceled", Some(TaskState::Canceled)),
            ("cancelled", None),
            ("TASK_STATE_DONE", None),
            ("", None),
            ("task_state_completed", None),
        ];
        for (wire, want) in table {
            assert_eq!(TaskState::from_wire(wire), want, "{wire:?}");
        }
    }
}
