//! Reading what a worker's answer says about its task.
//!
//! One JSON document (a whole JSON body, one SSE event's `data`, one WebSocket
//! text frame) becomes one small [`Observation`]. Deserialisation is typed
//! and borrowing: only the few fields the gateway needs are read, every other
//! field is skipped without building a tree.

use std::borrow::Cow;
use std::collections::BTreeMap;

use policies::TaskState;
use serde::Deserialize;

use super::Binding;

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

#[derive(Deserialize)]
struct Rpc<'a> {
    #[serde(borrow, default)]
    result: Option<Payload<'a>>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

/// A StreamResponse (`task` / `message` / `statusUpdate` / `artifactUpdate`),
/// a SendMessage response (`task` / `message`), or a bare Task (GetTask,
/// CancelTask): the union of their relevant fields.
#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(borrow, default)]
    task: Option<TaskObj<'a>>,
    #[serde(borrow, default)]
    message: Option<MessageObj<'a>>,
    #[serde(borrow, default, rename = "statusUpdate")]
    status_update: Option<UpdateObj<'a>>,
    #[serde(borrow, default, rename = "artifactUpdate")]
    artifact_update: Option<UpdateObj<'a>>,
    // Bare Task fields.
    #[serde(borrow, default, deserialize_with = "borrowed")]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed", rename = "contextId")]
    context_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status: Option<StatusObj<'a>>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct TaskObj<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow, default, deserialize_with = "borrowed", rename = "contextId")]
    context_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status: Option<StatusObj<'a>>,
}

#[derive(Deserialize)]
struct MessageObj<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed", rename = "taskId")]
    task_id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed", rename = "contextId")]
    context_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct UpdateObj<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed", rename = "taskId")]
    task_id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed", rename = "contextId")]
    context_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status: Option<StatusObj<'a>>,
    #[serde(default)]
    metadata: Option<UpdateMeta>,
}

#[derive(Deserialize)]
struct UpdateMeta {
    #[serde(default, rename = "a2a-rust.com/budget")]
    budget: Option<BudgetStatus>,
}

/// `{"remainingMs","meters","spent"}`: only `spent` is read.
#[derive(Deserialize)]
struct BudgetStatus {
    #[serde(default)]
    spent: Option<BTreeMap<String, serde_json::Value>>,
}

/// Reported spend, meter by meter; amounts that are not whole numbers
/// (a Python peer's `12.0` counts) are skipped.
fn spent_of(meta: Option<UpdateMeta>) -> Option<BTreeMap<String, u64>> {
    let spent = meta?.budget?.spent?;
    Some(
        spent
            .into_iter()
            .filter_map(|(name, v)| {
                let n = v.as_u64().or_else(|| {
                    v.as_f64()
                        .and_then(|f| policies::budget::Amount::Float(f).whole())
                })?;
                Some((name, n))
            })
            .collect(),
    )
}

#[derive(Deserialize)]
struct StatusObj<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed")]
    state: Option<Cow<'a, str>>,
}

/// An optional string borrowed from the document when it has no escapes.
/// (`#[serde(borrow)]` borrows a bare `Cow` only: on an `Option<Cow>` it
/// always copies, which would allocate on every event.)
fn borrowed<'de: 'a, 'a, D>(d: D) -> Result<Option<Cow<'a, str>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Option::<Borrowed<'a>>::deserialize(d).map(|o| o.map(|b| b.0))
}

fn state_of(s: &Option<StatusObj<'_>>) -> Option<TaskState> {
    s.as_ref()
        .and_then(|s| s.state.as_deref())
        .and_then(TaskState::from_wire)
}

impl<'a> Payload<'a> {
    fn into_observation(self) -> Observation<'a> {
        if self.error.is_some() {
            return Observation {
                error: true,
                ..Observation::default()
            };
        }
        if let Some(t) = self.task {
            return Observation {
                state: state_of(&t.status),
                task_id: Some(t.id),
                context_id: t.context_id,
                ..Observation::default()
            };
        }
        if let Some(u) = self.status_update {
            return Observation {
                state: state_of(&u.status),
                task_id: u.task_id,
                context_id: u.context_id,
                spent: spent_of(u.metadata),
                ..Observation::default()
            };
        }
        if let Some(u) = self.artifact_update {
            return Observation {
                task_id: u.task_id,
                context_id: u.context_id,
                ..Observation::default()
            };
        }
        if let Some(m) = self.message {
            let message_only = m.task_id.is_none();
            return Observation {
                task_id: m.task_id,
                context_id: m.context_id,
                message_only,
                ..Observation::default()
            };
        }
        if let (Some(id), Some(_)) = (self.id, &self.status) {
            return Observation {
                state: state_of(&self.status),
                task_id: Some(id),
                context_id: self.context_id,
                ..Observation::default()
            };
        }
        Observation::default()
    }
}

/// Reads one document of the given binding. Anything that is not JSON, or not
/// an A2A answer, gives `None`: the caller counts it and tracks nothing.
pub fn observe(binding: Binding, doc: &[u8]) -> Option<Observation<'_>> {
    match binding {
        Binding::JsonRpc | Binding::WebSocket => {
            let rpc: Rpc<'_> = serde_json::from_slice(doc).ok()?;
            if rpc.error.is_some() {
                return Some(Observation {
                    error: true,
                    ..Observation::default()
                });
            }
            Some(rpc.result?.into_observation())
        }
        Binding::Rest => {
            let p: Payload<'_> = serde_json::from_slice(doc).ok()?;
            Some(p.into_observation())
        }
        // A whole gRPC answer body: one framed `Task` (GetTask, CancelTask).
        Binding::Grpc => {
            super::grpc::observe(super::A2aMethod::GetTask, super::grpc::single_message(doc)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    fn obs(id: Option<&str>, state: Option<TaskState>) -> Observation<'static> {
        Observation {
            task_id: id.map(|s| Cow::Owned(s.to_string())),
            context_id: Some("c1".into()),
            state,
            ..Observation::default()
        }
    }

    #[test]
    fn strings_are_borrowed_from_the_document() {
        let doc = br#"{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING"}}}"#;
        let o = observe(Binding::Rest, doc).unwrap();
        assert!(matches!(o.task_id, Some(Cow::Borrowed("t1"))), "{o:?}");
        assert!(matches!(o.context_id, Some(Cow::Borrowed("c1"))), "{o:?}");
        // An escaped string cannot be borrowed, and still reads right.
        let o = observe(Binding::Rest, br#"{"task":{"id":"t\"1","status":{}}}"#).unwrap();
        assert_eq!(o.task_id.as_deref(), Some("t\"1"));
    }

    #[test]
    fn rest_documents() {
        let table: Vec<(&str, Option<Observation>)> = vec![
            (
                r#"{"task":{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_SUBMITTED"}}}"#,
                Some(obs(Some("t1"), Some(Submitted))),
            ),
            (
                r#"{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING","timestamp":"x"},"metadata":{"a":[1,2,{"b":null}]}}}"#,
                Some(obs(Some("t1"), Some(Working))),
            ),
            (
                r#"{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_INPUT_REQUIRED","message":{"parts":[{"text":"?"}]}}}}"#,
                Some(obs(Some("t1"), Some(InputRequired))),
            ),
            (
                r#"{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING"},"metadata":{"a2a-rust.com/budget":{"remainingMs":5,"meters":{"tokens":9},"spent":{"tokens":12.0,"calls":3,"odd":1.5}}}}}"#,
                Some(Observation {
                    spent: Some([("calls".to_owned(), 3), ("tokens".to_owned(), 12)].into()),
                    ..obs(Some("t1"), Some(Working))
                }),
            ),
            (
                r#"{"artifactUpdate":{"taskId":"t1","contextId":"c1","artifact":{"parts":[]}}}"#,
                Some(obs(Some("t1"), None)),
            ),
            (
                r#"{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_CANCELED"}}"#,
                Some(obs(Some("t1"), Some(Canceled))),
            ),
            (
                r#"{"message":{"messageId":"m","role":"ROLE_AGENT","parts":[],"contextId":"c1"}}"#,
                Some(Observation {
                    context_id: Some("c1".into()),
                    message_only: true,
                    ..Default::default()
                }),
            ),
            (
                r#"{"message":{"messageId":"m","taskId":"t1","contextId":"c1"}}"#,
                Some(obs(Some("t1"), None)),
            ),
            (
                r#"{"error":{"code":404,"status":"NOT_FOUND","message":"x"}}"#,
                Some(Observation {
                    error: true,
                    ..Default::default()
                }),
            ),
            (
                r#"{"task":{"id":"t\"1","contextId":"c1","status":{"state":"weird"}}}"#,
                Some(obs(Some("t\"1"), None)),
            ),
            ("not json", None),
            (r#"[1,2]"#, None),
            (r#"{}"#, Some(Observation::default())),
        ];
        for (doc, want) in table {
            assert_eq!(observe(Binding::Rest, doc.as_bytes()), want, "{doc}");
        }
    }

    #[test]
    fn jsonrpc_documents() {
        let table: Vec<(&str, Option<Observation>)> = vec![
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING"}}}}"#,
                Some(obs(Some("t1"), Some(Working))),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"x","result":{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_COMPLETED"}}}}"#,
                Some(obs(Some("t1"), Some(Completed))),
            ),
            (
                r#"{"id":null,"jsonrpc":"2.0","result":{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_FAILED"}}}"#,
                Some(obs(Some("t1"), Some(Failed))),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Task not found"}}"#,
                Some(Observation {
                    error: true,
                    ..Default::default()
                }),
            ),
            (r#"{"jsonrpc":"2.0","id":1}"#, None),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"status":"stream_complete"}}"#,
                None,
            ),
        ];
        for (doc, want) in table {
            let got = observe(Binding::JsonRpc, doc.as_bytes());
            // `{"status":"stream_complete"}` has a string status: not a task.
            assert_eq!(got.filter(|o| !o.is_empty() || o.error), want, "{doc}");
        }
    }
}
