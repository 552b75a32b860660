//! Reading the few facts policy needs from a request body.

use std::borrow::Cow;

use serde::Deserialize;

use policies::budget::{Amount, BudgetRefusal, Grant};

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
    /// The sent message's lease grant (`metadata["a2a-rust.com/lease"]`):
    /// its TTL in ms, or why it is malformed.
    pub lease: Option<Result<u64, String>>,
    /// The sent message's budget grant (`metadata["a2a-rust.com/budget"]`),
    /// checked as the SDK's server checks it.
    pub budget: Option<Result<SentGrant, BudgetRefusal>>,
    /// JSON-RPC only: the request id, echoed in an error the gateway answers.
    pub rpc_id: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default)]
    id: Option<serde_json::Value>,
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
    #[serde(default)]
    metadata: Option<Metadata>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default, rename = "a2a-rust.com/lease")]
    lease: Option<serde_json::Value>,
    #[serde(default, rename = "a2a-rust.com/budget")]
    budget: Option<serde_json::Value>,
}

/// A valid budget grant as the caller sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentGrant {
    pub grant: Grant,
    /// Some number arrived as an integral float (`30000.0`, as Python peers
    /// send): an a2a-rust worker refuses that, so the gateway re-writes the
    /// grant with integers.
    pub had_floats: bool,
}

fn amount(n: &serde_json::Number) -> Amount {
    n.as_u64().map_or_else(
        || Amount::from(n.as_f64().unwrap_or(f64::NAN)),
        Amount::Whole,
    )
}

/// Reads a budget grant `{"remainingMs"?: N, "meters"?: {name: N}}`; `null`
/// parts count as absent, other fields are ignored (as serde does).
fn budget_grant(v: &serde_json::Value) -> Result<SentGrant, BudgetRefusal> {
    use serde_json::Value;
    let malformed = |why: String| BudgetRefusal::Malformed(why);
    let obj = v.as_object().ok_or_else(|| {
        malformed(format!(
            "invalid type: {v}, expected an object {{\"remainingMs\"?: N, \"meters\"?: {{name: N}}}}"
        ))
    })?;
    let mut had_floats = false;
    let mut num = |field: &str, v: &Value| match v {
        Value::Number(n) => {
            had_floats |= n.as_u64().is_none();
            Ok(amount(n))
        }
        other => Err(malformed(format!(
            "invalid type: {other} for `{field}`, expected a number"
        ))),
    };
    let remaining = match obj.get("remainingMs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(num("remainingMs", v)?),
    };
    let mut meters = Vec::new();
    match obj.get("meters") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (name, v) in m {
                meters.push((name.clone(), num(name, v)?));
            }
        }
        Some(other) => {
            return Err(malformed(format!(
                "invalid type: {other} for `meters`, expected a map of meter names to numbers"
            )))
        }
    }
    let grant = policies::budget::validate(remaining, &meters)?;
    Ok(SentGrant { grant, had_floats })
}

/// Reads a lease grant `{"ttlMs": N}`. Python peers send numbers as floats
/// (`2000.0`): an integral float is accepted.
fn lease_grant(v: &serde_json::Value) -> Result<u64, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("invalid type: {v}, expected an object {{\"ttlMs\": N}}"))?;
    let ttl = obj.get("ttlMs").ok_or("missing field `ttlMs`")?;
    if let Some(n) = ttl.as_u64() {
        return Ok(n);
    }
    match ttl.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64 => Ok(f as u64),
        _ => Err(format!(
            "invalid value: {ttl}, expected a non-negative integer `ttlMs`"
        )),
    }
}

fn owned(s: Option<Cow<'_, str>>) -> Option<String> {
    s.map(Cow::into_owned).filter(|s| !s.is_empty())
}

impl Params<'_> {
    fn into_facts(self, method: Option<A2aMethod>, is_jsonrpc: bool) -> RequestFacts {
        let (m_task, lease, budget) = match self.message {
            Some(m) => {
                let (lease, budget) = match m.metadata {
                    Some(md) => (
                        md.lease.map(|v| lease_grant(&v)),
                        md.budget.map(|v| budget_grant(&v)),
                    ),
                    None => (None, None),
                };
                (owned(m.task_id), lease, budget)
            }
            None => (None, None, None),
        };
        RequestFacts {
            method,
            is_jsonrpc,
            tenant: owned(self.tenant),
            task_id: owned(self.id).or(m_task),
            lease,
            budget,
            rpc_id: None,
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
    let mut facts = match env.params {
        Some(p) => p.into_facts(method, true),
        None => RequestFacts {
            method,
            is_jsonrpc: true,
            ..RequestFacts::default()
        },
    };
    facts.rpc_id = env.id;
    Some(facts)
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
                    ..Default::default()
                }),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":"SendMessage","params":{"message":{"messageId":"m2","taskId":"t1","contextId":"c1"}}}"#,
                Some(RequestFacts {
                    method: Some(A2aMethod::SendMessage),
                    is_jsonrpc: true,
                    task_id: Some("t1".into()),
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
            // The request id is checked in `lease_grants`.
            let got = jsonrpc_facts(body.as_bytes()).map(|f| RequestFacts { rpc_id: None, ..f });
            assert_eq!(got, want, "{body}");
        }
    }

    #[test]
    fn lease_grants() {
        let send = |md: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":9,"method":"SendStreamingMessage","params":{{"message":{{"messageId":"m","metadata":{md}}}}}}}"#
            )
        };
        let table: Vec<(&str, Option<Result<u64, ()>>)> = vec![
            (r#"{}"#, None),
            (r#"{"a2a-rust.com/lease":{"ttlMs":2000}}"#, Some(Ok(2000))),
            (r#"{"a2a-rust.com/lease":{"ttlMs":2000.0}}"#, Some(Ok(2000))),
            (r#"{"a2a-rust.com/lease":{"ttlMs":0}}"#, Some(Ok(0))),
            (r#"{"a2a-rust.com/lease":{"ttlMs":-5}}"#, Some(Err(()))),
            (r#"{"a2a-rust.com/lease":{"ttlMs":1.5}}"#, Some(Err(()))),
            (r#"{"a2a-rust.com/lease":{"ttlMs":"2000"}}"#, Some(Err(()))),
            (r#"{"a2a-rust.com/lease":{"ttl":2000}}"#, Some(Err(()))),
            (r#"{"a2a-rust.com/lease":"soon"}"#, Some(Err(()))),
            (r#"{"other":{"ttlMs":1}}"#, None),
        ];
        for (md, want) in table {
            let f = jsonrpc_facts(send(md).as_bytes()).expect("a request");
            assert_eq!(f.lease.map(|r| r.map_err(|_| ())), want, "{md}");
            assert_eq!(f.rpc_id, Some(serde_json::json!(9)));
        }
    }

    #[test]
    fn budget_grants() {
        let send = |md: &str| {
            format!(
                r#"{{"method":"SendMessage","params":{{"message":{{"messageId":"m","metadata":{md}}}}}}}"#
            )
        };
        let g = |ms: Option<u64>, m: &[(&str, u64)], had_floats: bool| {
            Some(Ok(SentGrant {
                grant: Grant {
                    remaining_ms: ms,
                    meters: m.iter().map(|&(k, v)| (k.to_owned(), v)).collect(),
                },
                had_floats,
            }))
        };
        let bad = |msg: &str| Some(Err(msg.to_owned()));
        let table: Vec<(&str, Option<Result<SentGrant, String>>)> = vec![
            (r#"{}"#, None),
            (
                r#"{"a2a-rust.com/budget":{"remainingMs":30000,"meters":{"tokens":50000}}}"#,
                g(Some(30000), &[("tokens", 50000)], false),
            ),
            (
                r#"{"a2a-rust.com/budget":{"remainingMs":30000.0,"meters":null}}"#,
                g(Some(30000), &[], true),
            ),
            (
                r#"{"a2a-rust.com/budget":{"meters":{"tokens":5},"spent":{"x":1}}}"#,
                g(None, &[("tokens", 5)], false),
            ),
            (
                r#"{"a2a-rust.com/budget":{}}"#,
                bad("malformed budget: it names neither remainingMs nor a meter"),
            ),
            (
                r#"{"a2a-rust.com/budget":{"remainingMs":0}}"#,
                bad("the budget's deadline has already passed (remainingMs is 0)"),
            ),
            (
                r#"{"a2a-rust.com/budget":{"meters":{"Tokens":5}}}"#,
                bad(r#"malformed budget: meter name "Tokens" is not 1 to 64 of [a-z0-9._-]"#),
            ),
            (
                r#"{"a2a-rust.com/budget":"lots"}"#,
                bad(r#"malformed budget: invalid type: "lots", expected an object {"remainingMs"?: N, "meters"?: {name: N}}"#),
            ),
            (
                r#"{"a2a-rust.com/budget":{"remainingMs":"5"}}"#,
                bad(r#"malformed budget: invalid type: "5" for `remainingMs`, expected a number"#),
            ),
            (
                r#"{"a2a-rust.com/budget":{"meters":[1]}}"#,
                bad("malformed budget: invalid type: [1] for `meters`, expected a map of meter names to numbers"),
            ),
            (
                r#"{"a2a-rust.com/budget":{"remainingMs":-1}}"#,
                bad("malformed budget: remainingMs is -1, not a whole number from 0 to 18446744073709551615"),
            ),
        ];
        for (md, want) in table {
            let f = jsonrpc_facts(send(md).as_bytes()).expect("a request");
            assert_eq!(f.budget.map(|r| r.map_err(|e| e.to_string())), want, "{md}");
        }
        let many: Vec<String> = (0..17).map(|i| format!(r#""m{i}":1"#)).collect();
        let md = format!(
            r#"{{"a2a-rust.com/budget":{{"meters":{{{}}}}}}}"#,
            many.join(",")
        );
        let f = jsonrpc_facts(send(&md).as_bytes()).expect("a request");
        assert_eq!(
            f.budget.map(|r| r.map_err(|e| e.to_string())),
            bad("malformed budget: 17 meters, more than 16")
        );
    }

    #[test]
    fn rest_table() {
        assert_eq!(
            rest_facts(br#"{"tenant":"acme","message":{"messageId":"m","taskId":"t"}}"#),
            RequestFacts {
                tenant: Some("acme".into()),
                task_id: Some("t".into()),
                ..Default::default()
            }
        );
        assert_eq!(rest_facts(b""), RequestFacts::default());
        assert_eq!(rest_facts(b"{"), RequestFacts::default());
    }
}
