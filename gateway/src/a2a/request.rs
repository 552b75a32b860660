//! Reading the few facts policy needs from a request body.

use std::borrow::Cow;

use serde::Deserialize;

use super::A2aMethod;

/// What a request body says, as far as the gateway cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// JSON-RPC only: the method named in the envelope (`None` if unknown).
    pub method: Option<A2aMethod>,
    /// JSON-RPC only: the envelope had a `method` string (known or not).
    pub is_jsonrpc: bool,
    /// `params.tenant` / the REST body's `tenant`.
    pub tenant: Option<String>,
    /// `params.id` (GetTask, CancelTask, SubscribeToTask), or the sent
    /// message's `taskId` (a continuation of an existing task).
    pub task_id: Option<String>,
    /// The sent message's `contextId` and `messageId`.
    pub context_id: Option<String>,
    pub message_id: Option<String>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, default)]
    tenant: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default, rename = "taskId")]
    task_id: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "contextId")]
    context_id: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "messageId")]
    message_id: Option<Cow<'a, str>>,
}

fn owned(s: Option<Cow<'_, str>>) -> Option<String> {
    s.map(Cow::into_owned).filter(|s| !s.is_empty())
}

impl Params<'_> {
    fn into_facts(self, method: Option<A2aMethod>, is_jsonrpc: bool) -> RequestFacts {
        let (m_task, context_id, message_id) = match self.message {
            Some(m) => (owned(m.task_id), owned(m.context_id), owned(m.message_id)),
            None => (None, None, None),
        };
        RequestFacts {
            method,
            is_jsonrpc,
            tenant: owned(self.tenant),
            task_id: owned(self.id).or(m_task),
            context_id,
            message_id,
        }
    }
}

/// Reads a JSON-RPC request body. `None` when it is not a JSON-RPC request
/// object (not JSON, a batch, no `method`): such a request is proxied
/// verbatim and never tracked.
pub fn jsonrpc_facts(body: &[u8]) -> Option<RequestFacts> {
    let env: Envelope<'_> = serde_json::from_slice(body).ok()?;
    let name = env.method?;
    let method = A2aMethod::from_jsonrpc(&name);
    Some(match env.params {
        Some(p) => p.into_facts(method, true),
        None => RequestFacts {
            method,
            is_jsonrpc: true,
            ..RequestFacts::default()
        },
    })
}

/// Reads a REST request body (the body of `message:send`, `message:stream`,
/// `tasks/{id}:cancel`, …). An empty or unreadable body gives empty facts.
pub fn rest_facts(body: &[u8]) -> RequestFacts {
    if body.iter().all(u8::is_ascii_whitespace) {
        return RequestFacts::default();
    }
    serde_json::from_slice::<Params<'_>>(body)
        .map(|p| p.into_facts(None, false))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonrpc_table() {
        let table: Vec<(&str, Option<RequestFacts>)> = vec![
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"SendStreamingMessage","params":{"tenant":"acme","message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hi"}],"metadata":{"x":{"y":[1]}}}}}"#,
                Some(RequestFacts {
                    method: Some(A2aMethod::SendStreamingMessage),
                    is_jsonrpc: true,
                    tenant: Some("acme".into()),
                    message_id: Some("m1".into()),
                    ..Default::default()
                }),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":"SendMessage","params":{"message":{"messageId":"m2","taskId":"t1","contextId":"c1"}}}"#,
                Some(RequestFacts {
                    method: Some(A2aMethod::SendMessage),
                    is_jsonrpc: true,
                    task_id: Some("t1".into()),
                    context_id: Some("c1".into()),
                    message_id: Some("m2".into()),
                    ..Default::default()
                }),
            ),
            (
                r#"{"jsonrpc":"2.0","id":2,"method":"SubscribeToTask","params":{"id":"t9","tenant":""}}"#,
                Some(RequestFacts {
                    method: Some(A2aMethod::SubscribeToTask),
                    is_jsonrpc: true,
                    task_id: Some("t9".into()),
                    ..Default::default()
                }),
            ),
            (
                r#"{"jsonrpc":"2.0","id":2,"method":"message/send","params":{}}"#,
                Some(RequestFacts {
                    is_jsonrpc: true,
                    ..Default::default()
                }),
            ),
            (
                r#"{"jsonrpc":"2.0","id":2,"method":"GetTask"}"#,
                Some(RequestFacts {
                    method: Some(A2aMethod::GetTask),
                    is_jsonrpc: true,
                    ..Default::default()
                }),
            ),
            (r#"[{"jsonrpc":"2.0","id":2,"method":"GetTask"}]"#, None),
            (r#"{"jsonrpc":"2.0","id":2}"#, None),
            ("garbage", None),
            ("", None),
        ];
        for (body, want) in table {
            assert_eq!(jsonrpc_facts(body.as_bytes()), want, "{body}");
        }
    }

    #[test]
    fn rest_table() {
        assert_eq!(
            rest_facts(br#"{"tenant":"acme","message":{"messageId":"m","taskId":"t"}}"#),
            RequestFacts {
                tenant: Some("acme".into()),
                task_id: Some("t".into()),
                message_id: Some("m".into()),
                ..Default::default()
            }
        );
        assert_eq!(rest_facts(b""), RequestFacts::default());
        assert_eq!(rest_facts(b"{"), RequestFacts::default());
    }
}
