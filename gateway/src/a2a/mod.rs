//! A2A framing: what a request is, and what the worker's answer says.
//!
//! Everything here works on bytes and borrowed strings, never on a full JSON
//! tree: the proxy's hot path runs these functions once per chunk or event.

pub mod card;
pub mod classify;
pub mod extensions;
pub mod grpc;
pub mod json;
pub mod observe;
pub mod request;
pub mod sse;
pub mod ws;

use std::borrow::Cow;
use std::collections::BTreeMap;

use policies::TaskState;

pub use classify::{classify, A2aMethod, Binding, Call};

/// Whether a message's `Content-Type` starts with `prefix` (any case,
/// leading spaces skipped; parameters and a `+suffix` after it allowed).
pub fn content_type_starts_with(headers: &http::HeaderMap, prefix: &str) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let v = v.trim_start().as_bytes();
            v.len() >= prefix.len() && v[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
        })
}

/// The task facts one document carries, borrowing its strings from the
/// document where they need no unescaping (so reading an event allocates
/// nothing; [`Observation::into_owned`] keeps one past its document).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation<'a> {
    pub task_id: Option<Cow<'a, str>>,
    pub context_id: Option<Cow<'a, str>>,
    /// The state, when the document carried a known one.
    pub state: Option<TaskState>,
    /// The answer was a `message` that names no task: nothing to cancel.
    pub message_only: bool,
    /// The document is an error (JSON-RPC `error`, REST `{"error":…}`).
    pub error: bool,
    /// A status update's reported spend so far
    /// (`metadata["a2a-rust.com/budget"].spent`, cumulative per meter).
    pub spent: Option<BTreeMap<String, u64>>,
}

impl Observation<'_> {
    /// The same facts, owning their strings.
    pub fn into_owned(self) -> Observation<'static> {
        Observation {
            task_id: self.task_id.map(|c| Cow::Owned(c.into_owned())),
            context_id: self.context_id.map(|c| Cow::Owned(c.into_owned())),
            state: self.state,
            message_only: self.message_only,
            error: self.error,
            spent: self.spent,
        }
    }

    /// Whether the document told anything worth acting on.
    pub fn is_empty(&self) -> bool {
        self.task_id.is_none() && self.state.is_none() && !self.message_only && !self.error
    }
}
