//! Reading the few facts policy needs from a request body.

use policies::budget::{Amount, BudgetRefusal, Grant};

use super::{json, A2aMethod};

/// What a request body says, as far as the gateway cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// JSON-RPC only: the method named in the envelope (`None` if unknown).
    pub method: Option<A2aMethod>,
    /// JSON-RPC only: the envelope had a `method` string (known or not).
    pub is_jsonrpc: bool,
    /// JSON-RPC only: the method is an A2A v0.3 send (`message/send`,
    /// `message/stream`). v1.0 workers refuse it; a worker that still
    /// serves v0.3 would run it, and the gateway does not read it as a send.
    pub v03_send: bool,
    /// `params.tenant` / the REST body's `tenant`.
    pub tenant: Option<String>,
    /// `params.id` (GetTask, CancelTask, SubscribeToTask), `params.taskId`
    /// (the push-notification config calls, whose `id` names a config), or
    /// the sent message's `taskId` (a continuation of an existing task).
    pub task_id: Option<String>,
    /// The sent message's `contextId`, when it names no task: a send that
    /// continues a conversation goes to the worker replica that holds it.
    pub context_id: Option<String>,
    /// The sent message's `messageId`, when it names no task: how the
    /// gateway finds the task a send started whose caller left before the
    /// task was named (`ListTasks`, the task whose history holds it).
    pub message_id: Option<String>,
    /// The sent message's lease grant (`metadata["a2a-rust.com/lease"]`):
    /// its TTL in ms, or why it is malformed.
    pub lease: Option<Result<u64, String>>,
    /// The sent message's budget grant (`metadata["a2a-rust.com/budget"]`),
    /// checked as the SDK's server checks it.
    pub budget: Option<Result<SentGrant, BudgetRefusal>>,
    /// JSON-RPC only: the request id, echoed in an error the gateway answers.
    pub rpc_id: Option<serde_json::Value>,
    /// `configuration.returnImmediately` is `true`: a non-blocking send
    /// (answered at once with the task, which the caller then polls).
    pub return_immediately: bool,
    /// A member policy reads (`jsonrpc`, `method`, `id`, `params`,
    /// `tenant`, `message`, `taskId`, `metadata`, a grant, `configuration`,
    /// `returnImmediately`) that appears twice
    /// in its object: read last-wins here, as `serde_json::Value` does, but a
    /// worker that takes the first, or reads the tokens as they come, would
    /// run another call. A route that checks sends refuses such a body.
    pub duplicate: Option<&'static str>,
}

/// Notes a member of an object; the first member seen twice is kept in `dup`.
fn once(seen: &mut bool, name: &'static str, dup: &mut Option<&'static str>) {
    if std::mem::replace(seen, true) && dup.is_none() {
        *dup = Some(name);
    }
}

/// Why a body the reader could not read is unreadable, for a route that
/// refuses it (counted by this reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFault {
    /// Not UTF-8: a byte order mark, UTF-16 or UTF-32 (RFC 8259 §8.1: JSON
    /// exchanged between systems is UTF-8; Python's `json.loads` reads the
    /// others, so the gateway cannot pass them unread).
    NotUtf8,
    /// A JSON value followed by more than whitespace (Go's `json.Decoder`
    /// reads the first value and ignores the rest).
    TrailingBytes,
    /// A number no 64-bit float holds (`1e999`; Python reads `inf`).
    NumberOutOfRange,
    /// Anything else that is not JSON.
    NotJson,
    /// A member policy reads appears twice.
    DuplicateKey(&'static str),
    /// A gRPC body that is not one uncompressed message of the method's
    /// type (a compressed message is not read).
    NotGrpcMessage,
}

impl BodyFault {
    /// The metric label and log reason.
    pub fn reason(self) -> &'static str {
        match self {
            BodyFault::NotUtf8 => "body_not_utf8",
            BodyFault::TrailingBytes => "body_trailing_bytes",
            BodyFault::NumberOutOfRange => "body_number_out_of_range",
            BodyFault::NotJson => "body_not_json",
            BodyFault::DuplicateKey(_) => "body_duplicate_key",
            BodyFault::NotGrpcMessage => "body_not_grpc_message",
        }
    }
}

/// Why the reader could not read `body`: `None` when it is plain JSON after
/// all (a value that is no request, such as an object without `method`,
/// which no worker runs as a call).
pub fn diagnose(body: &[u8]) -> Option<BodyFault> {
    let utf16_or_32 = body.len() >= 2 && (body[0] == 0 || body[1] == 0);
    if body.starts_with(&[0xEF, 0xBB, 0xBF])
        || body.starts_with(&[0xFE, 0xFF])
        || body.starts_with(&[0xFF, 0xFE])
        || utf16_or_32
    {
        return Some(BodyFault::NotUtf8);
    }
    // A `Value`, not `IgnoredAny`: only a parsed number is checked for range.
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(_) => None,
        Err(e) => {
            let why = e.to_string();
            Some(if why.starts_with("trailing characters") {
                BodyFault::TrailingBytes
            } else if why.starts_with("number out of range") {
                BodyFault::NumberOutOfRange
            } else {
                BodyFault::NotJson
            })
        }
    }
}

/// The metadata key of a lease grant.
pub(crate) const LEASE_KEY: &str = "a2a-rust.com/lease";
/// The metadata key of a budget grant.
pub(crate) const BUDGET_KEY: &str = "a2a-rust.com/budget";

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
pub(crate) fn budget_grant(v: &serde_json::Value) -> Result<SentGrant, BudgetRefusal> {
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
pub(crate) fn lease_grant(v: &serde_json::Value) -> Result<u64, String> {
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

/// A member read as text: a string (escapes decoded), or absent when it is
/// missing, `null` or of another type. A worker reads another type as an
/// error or ignores the member (a2a-rust ignores `params.id` on a send):
/// either way no policy should hinge on it. `Err` for a string that cannot
/// be decoded (a lone surrogate escape, which Python reads): the body is
/// then unreadable rather than its tenant absent.
fn text(raw: Option<&[u8]>) -> Result<Option<String>, ()> {
    match raw {
        Some(raw) if raw.first() == Some(&b'"') => {
            let s = json::string(raw).ok_or(())?;
            Ok(Some(s.into_owned()).filter(|s| !s.is_empty()))
        }
        _ => Ok(None),
    }
}

/// A grant's value, read whole (it is small); `None` for a `null` one.
/// `Err` when it is not JSON: the body is then no request at all.
fn grant_value(raw: Option<&[u8]>) -> Result<Option<serde_json::Value>, ()> {
    match raw {
        None => Ok(None),
        Some(raw) => match serde_json::from_slice(raw).map_err(|_| ())? {
            serde_json::Value::Null => Ok(None),
            v => Ok(Some(v)),
        },
    }
}

/// The members of a `params` object that policy reads, as raw values.
#[derive(Default)]
struct ParamsRaw<'a> {
    tenant: Option<&'a [u8]>,
    id: Option<&'a [u8]>,
    /// `params.taskId` (the push-notification config calls).
    task_param: Option<&'a [u8]>,
    task: Option<&'a [u8]>,
    context: Option<&'a [u8]>,
    message_id: Option<&'a [u8]>,
    lease: Option<&'a [u8]>,
    budget: Option<&'a [u8]>,
    /// `configuration.returnImmediately`.
    return_immediately: Option<&'a [u8]>,
    /// The first member policy reads seen twice (in any object read).
    dup: Option<&'static str>,
}

/// Reads the `params` object `rest` starts with into `p` (a later `params`
/// replaces an earlier one whole, as does a later `message` or `metadata`);
/// the object's length. A `message` or `metadata` that is not an object
/// carries nothing: the worker refuses the first, and holds no grant in the
/// second.
fn read_params<'a>(rest: &'a [u8], p: &mut ParamsRaw<'a>) -> Option<usize> {
    let dup = p.dup;
    *p = ParamsRaw {
        dup,
        ..ParamsRaw::default()
    };
    let (mut tenant, mut id, mut message, mut configuration) = (false, false, false, false);
    let mut task_param = false;
    json::object(rest, |k, v| match k {
        b"configuration" => {
            once(&mut configuration, "configuration", &mut p.dup);
            p.return_immediately = None;
            if !json::is_object(v) {
                return json::skip(v);
            }
            let mut seen = false;
            json::object(v, |k, v| match k {
                b"returnImmediately" => {
                    once(&mut seen, "returnImmediately", &mut p.dup);
                    json::take(v, &mut p.return_immediately)
                }
                _ => json::skip(v),
            })
        }
        b"tenant" => {
            once(&mut tenant, "tenant", &mut p.dup);
            json::take(v, &mut p.tenant)
        }
        b"id" => {
            once(&mut id, "params.id", &mut p.dup);
            json::take(v, &mut p.id)
        }
        b"taskId" => {
            once(&mut task_param, "params.taskId", &mut p.dup);
            json::take(v, &mut p.task_param)
        }
        b"message" => {
            once(&mut message, "message", &mut p.dup);
            (p.task, p.context, p.message_id, p.lease, p.budget) = (None, None, None, None, None);
            if !json::is_object(v) {
                return json::skip(v);
            }
            let (mut task, mut metadata) = (false, false);
            json::object(v, |k, v| match k {
                b"taskId" => {
                    once(&mut task, "taskId", &mut p.dup);
                    json::take(v, &mut p.task)
                }
                // Only routes to a replica: a duplicate misroutes the
                // caller's own call, which its worker then judges.
                b"contextId" => json::take(v, &mut p.context),
                b"messageId" => json::take(v, &mut p.message_id),
                b"metadata" => {
                    once(&mut metadata, "metadata", &mut p.dup);
                    (p.lease, p.budget) = (None, None);
                    if !json::is_object(v) {
                        return json::skip(v);
                    }
                    let (mut lease, mut budget) = (false, false);
                    json::object(v, |k, v| match k {
                        k if k == LEASE_KEY.as_bytes() => {
                            once(&mut lease, LEASE_KEY, &mut p.dup);
                            json::take(v, &mut p.lease)
                        }
                        k if k == BUDGET_KEY.as_bytes() => {
                            once(&mut budget, BUDGET_KEY, &mut p.dup);
                            json::take(v, &mut p.budget)
                        }
                        _ => json::skip(v),
                    })
                }
                _ => json::skip(v),
            })
        }
        _ => json::skip(v),
    })
}

impl ParamsRaw<'_> {
    /// The facts the raw members give; `None` when a grant is not JSON (the
    /// body is then no request at all).
    fn facts(&self, method: Option<A2aMethod>, is_jsonrpc: bool) -> Option<RequestFacts> {
        let lease = grant_value(self.lease).ok()?;
        let budget = grant_value(self.budget).ok()?;
        let (id, task_param, task) = (
            text(self.id).ok()?,
            text(self.task_param).ok()?,
            text(self.task).ok()?,
        );
        let task_id = match method {
            Some(m) if m.is_push_config() => task_param,
            _ => id.or(task),
        };
        let context_id = text(self.context).ok()?.filter(|_| task_id.is_none());
        let message_id = text(self.message_id).ok()?.filter(|_| task_id.is_none());
        Some(RequestFacts {
            method,
            is_jsonrpc,
            v03_send: false,
            tenant: text(self.tenant).ok()?,
            task_id,
            context_id,
            message_id,
            lease: lease.map(|v| lease_grant(&v)),
            budget: budget.map(|v| budget_grant(&v)),
            rpc_id: None,
            // Only the literal `true`: anything else is a blocking send to
            // the SDKs (or refused by them).
            return_immediately: self.return_immediately == Some(b"true".as_slice()),
            duplicate: self.dup,
        })
    }
}

/// Reads one JSON-RPC request object. `None` when it is not one (not JSON,
/// a batch, no `method` string): such a request is proxied verbatim and
/// never tracked. Members are read last-wins, in one pass (see [`json`]).
pub fn jsonrpc_facts(body: &[u8]) -> Option<RequestFacts> {
    let (mut id, mut method) = (None, None);
    let mut params = ParamsRaw::default();
    let mut seen = [false; 4];
    let mut dup = None;
    let end = json::object(body, |k, v| match k {
        b"id" => {
            once(&mut seen[0], "id", &mut dup);
            json::take(v, &mut id)
        }
        b"method" => {
            once(&mut seen[1], "method", &mut dup);
            json::take(v, &mut method)
        }
        b"jsonrpc" => {
            once(&mut seen[2], "jsonrpc", &mut dup);
            json::skip(v)
        }
        // Params that are not an object: the worker refuses the call.
        b"params" => {
            once(&mut seen[3], "params", &mut dup);
            if json::is_object(v) {
                read_params(v, &mut params)
            } else {
                params = ParamsRaw {
                    dup: params.dup,
                    ..ParamsRaw::default()
                };
                json::skip(v)
            }
        }
        _ => json::skip(v),
    })?;
    if !json::is_blank(&body[end..]) {
        return None;
    }
    let name = json::string(method?)?;
    let mut facts = params.facts(A2aMethod::from_jsonrpc(&name), true)?;
    facts.duplicate = dup.or(facts.duplicate);
    facts.v03_send = matches!(&*name, "message/send" | "message/stream");
    facts.rpc_id = match id {
        None => None,
        Some(raw) => match serde_json::from_slice(raw).ok()? {
            serde_json::Value::Null => None,
            v => Some(v),
        },
    };
    Some(facts)
}

/// Reads a JSON-RPC batch (an array of calls), one entry per element: the
/// call's facts, or `None` for an element that is no request. `None` when
/// the body is not an array.
pub fn jsonrpc_batch(body: &[u8]) -> Option<Vec<Option<RequestFacts>>> {
    let mut calls = Vec::new();
    let end = json::array(body, |v| calls.push(jsonrpc_facts(v)))?;
    json::is_blank(&body[end..]).then_some(calls)
}

/// Reads a REST request body (the body of `message:send`, `message:stream`,
/// `tasks/{id}:cancel`, …). An empty body gives empty facts; `None` when it
/// is not a JSON object.
pub fn rest_facts(body: &[u8]) -> Option<RequestFacts> {
    if json::is_blank(body) {
        return Some(RequestFacts::default());
    }
    let mut params = ParamsRaw::default();
    let end = read_params(body, &mut params)?;
    if !json::is_blank(&body[end..]) {
        return None;
    }
    params.facts(None, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids() {
        let id = |b: &[u8], rpc: bool| {
            if rpc { jsonrpc_facts(b) } else { rest_facts(b) }.and_then(|f| f.message_id)
        };
        let rpc = br#"{"jsonrpc":"2.0","id":1,"method":"SendStreamingMessage","params":{"message":{"parts":[{"text":"x"}],"messageId":"m-\u0031"}}}"#;
        assert_eq!(id(rpc, true).as_deref(), Some("m-1"));
        assert_eq!(
            id(br#"{"message":{"messageId":"r"}}"#, false).as_deref(),
            Some("r")
        );
        assert_eq!(id(br#"{"message":{"messageId":""}}"#, false), None);
        assert_eq!(id(br#"{"message":{"messageId":7}}"#, false), None);
        // A send naming its task needs no search.
        assert_eq!(
            id(br#"{"message":{"messageId":"r","taskId":"t"}}"#, false),
            None
        );
        assert_eq!(id(b"garbage", true), None);
    }

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
                    v03_send: true,
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

    /// A later duplicate wins, as in `serde_json::Value` (what an a2a-rust
    /// worker reads metadata into): a grant written twice is read as its
    /// last copy, not refused and proxied unread.
    #[test]
    fn duplicate_keys_last_wins() {
        let body = r#"{"id":1,"method":"GetTask","method":"SendMessage","params":{"tenant":"a","message":{"metadata":{"a2a-rust.com/budget":{"meters":{"tokens":5}},"a2a-rust.com\/budget":{"meters":{"tokens":1000000}},"a2a-rust.com/lease":{"ttlMs":1},"a2a-rust.com/lease":null}},"tenant":"b"}}"#;
        let f = jsonrpc_facts(body.as_bytes()).expect("a request");
        assert_eq!(f.method, Some(A2aMethod::SendMessage));
        assert_eq!(f.tenant.as_deref(), Some("b"));
        assert_eq!(f.lease, None);
        let grant = f.budget.expect("a grant").expect("valid").grant;
        assert_eq!(grant.meters.get("tokens"), Some(&1_000_000));
    }

    /// Members of other types than the gateway reads are absent, not a
    /// reason to leave the request unread.
    #[test]
    fn other_types_read_as_absent() {
        let body = r#"{"id":null,"method":"SendMessage","params":{"id":7,"tenant":5,"message":{"taskId":[1],"metadata":"none"}}}"#;
        let f = jsonrpc_facts(body.as_bytes()).expect("a request");
        assert_eq!(
            f,
            RequestFacts {
                method: Some(A2aMethod::SendMessage),
                is_jsonrpc: true,
                ..Default::default()
            }
        );
        // A string that cannot be decoded leaves the body unread.
        assert_eq!(
            jsonrpc_facts(br#"{"method":"SendMessage","params":{"tenant":"a\ud800"}}"#),
            None
        );
        let f = jsonrpc_facts(br#"{"method":"SendMessage","params":[1]}"#).expect("a request");
        assert_eq!(f.method, Some(A2aMethod::SendMessage));
        assert_eq!(jsonrpc_facts(br#"{"method":5}"#), None);
        assert_eq!(jsonrpc_facts(br#"{"method":"GetTask"} x"#), None);
    }

    #[test]
    fn batches() {
        let b = jsonrpc_batch(
            br#" [{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"metadata":{"a2a-rust.com/lease":{"ttlMs":5}}}}}, 3, {"method":"GetTask"}] "#,
        )
        .expect("a batch");
        assert_eq!(b.len(), 3);
        let first = b[0].as_ref().expect("a call");
        assert_eq!(first.method, Some(A2aMethod::SendMessage));
        assert_eq!(first.lease, Some(Ok(5)));
        assert_eq!(first.rpc_id, Some(serde_json::json!(1)));
        assert_eq!(b[1], None);
        assert_eq!(
            b[2].as_ref().and_then(|f| f.method),
            Some(A2aMethod::GetTask)
        );
        assert_eq!(jsonrpc_batch(br#"{"method":"GetTask"}"#), None);
        assert_eq!(jsonrpc_batch(b"[1,"), None);
    }

    /// The facts as `serde_json::Value` gives them: what the reader must
    /// agree with on every valid document.
    fn reference(body: &[u8]) -> Option<RequestFacts> {
        use serde_json::Value;
        let v: Value = serde_json::from_slice(body).ok()?;
        let obj = v.as_object()?;
        let name = obj.get("method")?.as_str()?;
        let method = A2aMethod::from_jsonrpc(name);
        let s = |v: Option<&Value>| {
            v.and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let p = obj.get("params").and_then(Value::as_object);
        let m = p.and_then(|p| p.get("message")).and_then(Value::as_object);
        let md = m.and_then(|m| m.get("metadata")).and_then(Value::as_object);
        let grant = |k: &str| md.and_then(|md| md.get(k)).filter(|v| !v.is_null());
        let task_id = match method {
            Some(m) if m.is_push_config() => s(p.and_then(|p| p.get("taskId"))),
            _ => s(p.and_then(|p| p.get("id"))).or_else(|| s(m.and_then(|m| m.get("taskId")))),
        };
        Some(RequestFacts {
            method,
            is_jsonrpc: true,
            v03_send: matches!(name, "message/send" | "message/stream"),
            tenant: s(p.and_then(|p| p.get("tenant"))),
            task_id: task_id.clone(),
            context_id: s(m.and_then(|m| m.get("contextId"))).filter(|_| task_id.is_none()),
            message_id: s(m.and_then(|m| m.get("messageId"))).filter(|_| task_id.is_none()),
            lease: grant(LEASE_KEY).map(lease_grant),
            budget: grant(BUDGET_KEY).map(budget_grant),
            rpc_id: obj.get("id").filter(|v| !v.is_null()).cloned(),
            return_immediately: p
                .and_then(|p| p.get("configuration"))
                .and_then(Value::as_object)
                .and_then(|c| c.get("returnImmediately"))
                == Some(&Value::Bool(true)),
            // Compared apart: `serde_json::Value` keeps no trace of them.
            duplicate: None,
        })
    }

    /// Random JSON-RPC-shaped documents (duplicate keys, escaped keys,
    /// whitespace, nesting, grants valid and not): the reader agrees with
    /// `serde_json::Value` on each, and on prefixes of each it never reads a
    /// request where `serde_json` finds one and disagrees.
    #[test]
    fn agrees_with_serde_json_value() {
        struct Gen(u64);
        impl Gen {
            fn next(&mut self) -> u64 {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0
            }
            fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
                of[(self.next() % of.len() as u64) as usize]
            }
            fn ws(&mut self) -> &'static str {
                self.pick(&["", "", "", " ", "\n  ", "\t"])
            }
            fn key(&mut self, depth: u32) -> &'static str {
                let keys: &[&str] = match depth {
                    0 => &[
                        r#""method""#,
                        r#""params""#,
                        r#""id""#,
                        r#""jsonrpc""#,
                        r#""m\u0065thod""#,
                    ],
                    1 => &[
                        r#""message""#,
                        r#""tenant""#,
                        r#""id""#,
                        r#""taskId""#,
                        r#""configuration""#,
                    ],
                    2 => &[
                        r#""metadata""#,
                        r#""taskId""#,
                        r#""contextId""#,
                        r#""messageId""#,
                        r#""parts""#,
                        r#""role""#,
                        r#""returnImmediately""#,
                    ],
                    3 => &[
                        r#""a2a-rust.com/lease""#,
                        r#""a2a-rust.com/budget""#,
                        r#""a2a-rust.com\/budget""#,
                        r#""pad""#,
                    ],
                    _ => &[
                        r#""ttlMs""#,
                        r#""remainingMs""#,
                        r#""meters""#,
                        r#""tokens""#,
                        r#""x""#,
                    ],
                };
                self.pick(keys)
            }
            fn scalar(&mut self) -> &'static str {
                self.pick(&[
                    r#""SendMessage""#,
                    r#""SendStreamingMessage""#,
                    r#""GetTask""#,
                    r#""GetTaskPushNotificationConfig""#,
                    r#""acme""#,
                    r#""t-\"1\"""#,
                    r#""\u00e9\\ ]}""#,
                    r#""""#,
                    "2000",
                    "2000.0",
                    "-3",
                    "1e2",
                    "null",
                    "true",
                    "false",
                ])
            }
            fn value(&mut self, depth: u32, out: &mut String) {
                match self.next() % 6 {
                    0 | 1 if depth < 6 => self.object(depth, out),
                    2 if depth < 6 => {
                        out.push('[');
                        let n = self.next() % 3;
                        for i in 0..n {
                            if i > 0 {
                                out.push(',');
                            }
                            out.push_str(self.ws());
                            self.value(depth + 1, out);
                        }
                        out.push(']');
                    }
                    _ => out.push_str(self.scalar()),
                }
            }
            fn object(&mut self, depth: u32, out: &mut String) {
                out.push('{');
                let n = self.next() % 5;
                for i in 0..n {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(self.ws());
                    let key = self.key(depth);
                    out.push_str(key);
                    out.push_str(self.ws());
                    out.push(':');
                    out.push_str(self.ws());
                    // The members policy descends into are mostly objects,
                    // so that nested duplicates and replacements are common.
                    let nests = matches!(
                        key,
                        r#""params""# | r#""message""# | r#""metadata""# | r#""configuration""#
                    );
                    if nests && !self.next().is_multiple_of(4) {
                        self.object(depth + 1, out);
                    } else {
                        self.value(depth + 1, out);
                    }
                    out.push_str(self.ws());
                }
                out.push('}');
            }
        }
        let mut g = Gen(0x9E37_79B9_7F4A_7C15);
        let mut read = 0;
        for _ in 0..20_000 {
            let mut doc = String::new();
            g.object(0, &mut doc);
            let want = reference(doc.as_bytes());
            read += usize::from(want.is_some());
            let read_last_wins = |b: &[u8]| {
                jsonrpc_facts(b).map(|f| RequestFacts {
                    duplicate: None,
                    ..f
                })
            };
            assert_eq!(read_last_wins(doc.as_bytes()), want, "{doc}");
            let cut = (g.next() as usize) % (doc.len() + 1);
            let prefix = &doc.as_bytes()[..cut];
            if let Some(want) = reference(prefix) {
                assert_eq!(read_last_wins(prefix), Some(want), "{doc}");
            }
        }
        assert!(read > 1_000, "only {read} documents were requests");
    }

    /// `configuration.returnImmediately`: only `true` makes a send
    /// non-blocking, on either binding; the last member wins.
    #[test]
    fn non_blocking_sends() {
        #[rustfmt::skip]
        let table: &[(&str, bool)] = &[
            (r#"{"message":{},"configuration":{"returnImmediately":true}}"#, true),
            (r#"{"configuration":{"historyLength":2, "returnImmediately" : true },"message":{}}"#, true),
            (r#"{"message":{},"configuration":{"returnImmediately":false}}"#, false),
            (r#"{"message":{},"configuration":{"returnImmediately":"true"}}"#, false),
            (r#"{"message":{},"configuration":{"returnImmediately":1}}"#, false),
            (r#"{"message":{},"configuration":{"blocking":false}}"#, false),
            (r#"{"message":{},"configuration":true}"#, false),
            (r#"{"message":{"returnImmediately":true}}"#, false),
            (r#"{"message":{}}"#, false),
            (r#"{"configuration":{"returnImmediately":true},"configuration":{}}"#, false),
        ];
        for (params, want) in table {
            let rest = rest_facts(params.as_bytes()).expect("a body");
            assert_eq!(rest.return_immediately, *want, "REST {params}");
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{params}}}"#);
            let rpc = jsonrpc_facts(body.as_bytes()).expect("a request");
            assert_eq!(rpc.return_immediately, *want, "JSON-RPC {params}");
        }
    }

    #[test]
    fn duplicate_policy_members_are_named() {
        #[rustfmt::skip]
        let table: &[(&str, Option<&str>)] = &[
            (r#"{"method":"SendMessage","params":{"message":{"metadata":{}}}}"#, None),
            (r#"{"method":"SendMessage","method":"GetTask"}"#, Some("method")),
            (r#"{"method":"GetTask","id":1,"id":2}"#, Some("id")),
            (r#"{"jsonrpc":"2.0","jsonrpc":"2.0","method":"GetTask"}"#, Some("jsonrpc")),
            (r#"{"method":"SendMessage","params":{},"params":{}}"#, Some("params")),
            (r#"{"method":"SendMessage","params":{"tenant":"a","tenant":"b"}}"#, Some("tenant")),
            (r#"{"method":"SendMessage","params":{"message":{},"message":{}}}"#, Some("message")),
            (r#"{"method":"SendMessage","params":{"message":{"metadata":{},"metadata":{}}}}"#, Some("metadata")),
            (r#"{"method":"SendMessage","params":{"message":{"taskId":"a","taskId":"a"}}}"#, Some("taskId")),
            (r#"{"method":"SendMessage","params":{"message":{"metadata":{"a2a-rust.com/lease":null,"a2a-rust.com/lease":{"ttlMs":2000}}}}}"#, Some("a2a-rust.com/lease")),
            (r#"{"method":"SendMessage","params":{"configuration":{},"configuration":{"returnImmediately":true}}}"#, Some("configuration")),
            (r#"{"method":"SendMessage","params":{"configuration":{"returnImmediately":false,"returnImmediately":true}}}"#, Some("returnImmediately")),
            // An escaped key is the same key.
            (r#"{"method":"SendMessage","m\u0065thod":"GetTask"}"#, Some("method")),
            // Members policy does not read may repeat.
            (r#"{"method":"SendMessage","x":1,"x":2,"params":{"message":{"parts":[],"parts":[]}}}"#, None),
        ];
        for (body, want) in table {
            let f = jsonrpc_facts(body.as_bytes()).expect("a request");
            assert_eq!(f.duplicate, *want, "{body}");
        }
        let f = rest_facts(br#"{"message":{"metadata":{}},"message":{}}"#).expect("a body");
        assert_eq!(f.duplicate, Some("message"));
    }

    #[test]
    fn unreadable_bodies_are_told_apart() {
        let text = r#"{"method":"SendMessage","params":{"message":{"metadata":{"a2a-rust.com/lease":{"ttlMs":500}}}}}"#;
        let mut bom = vec![0xEF, 0xBB, 0xBF];
        bom.extend(text.as_bytes());
        let mut utf16 = vec![0xFF, 0xFE];
        utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        let utf16_no_bom: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
        #[rustfmt::skip]
        let table: Vec<(Vec<u8>, Option<BodyFault>)> = vec![
            (bom, Some(BodyFault::NotUtf8)),
            (utf16, Some(BodyFault::NotUtf8)),
            (utf16_no_bom, Some(BodyFault::NotUtf8)),
            (format!("{text}garbage").into_bytes(), Some(BodyFault::TrailingBytes)),
            (text.replace("500", "1e999").into_bytes(), Some(BodyFault::NumberOutOfRange)),
            (text.replace("500", "-1e999").into_bytes(), Some(BodyFault::NumberOutOfRange)),
            (b"not json".to_vec(), Some(BodyFault::NotJson)),
            (b"{\"a\":".to_vec(), Some(BodyFault::NotJson)),
            (vec![b'{', b'"', 0xFF, b'"', b':', b'1', b'}'], Some(BodyFault::NotJson)),
            // JSON, only no request: nothing to refuse.
            (br#"{"foo":1}"#.to_vec(), None),
            (b"[]".to_vec(), None),
        ];
        for (body, want) in table {
            assert_eq!(
                jsonrpc_facts(&body),
                None,
                "{}",
                String::from_utf8_lossy(&body)
            );
            assert_eq!(diagnose(&body), want, "{}", String::from_utf8_lossy(&body));
        }
    }

    /// A push-notification config call's task is `params.taskId`; its
    /// `params.id` names a config.
    #[test]
    fn push_config_calls_name_their_task() {
        let f = jsonrpc_facts(
            br#"{"jsonrpc":"2.0","id":1,"method":"GetTaskPushNotificationConfig","params":{"id":"cfg","taskId":"t1"}}"#,
        )
        .expect("a request");
        assert_eq!(f.task_id.as_deref(), Some("t1"));
        let f = jsonrpc_facts(
            br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t2","taskId":"x"}}"#,
        )
        .expect("a request");
        assert_eq!(f.task_id.as_deref(), Some("t2"));
    }

    #[test]
    fn rest_table() {
        assert_eq!(
            rest_facts(br#"{"tenant":"acme","message":{"messageId":"m","taskId":"t"}}"#),
            Some(RequestFacts {
                tenant: Some("acme".into()),
                task_id: Some("t".into()),
                ..Default::default()
            })
        );
        // A context counts only when no task is named: the task decides.
        assert_eq!(
            rest_facts(br#"{"message":{"contextId":"c","messageId":"m"}}"#),
            Some(RequestFacts {
                context_id: Some("c".into()),
                message_id: Some("m".into()),
                ..Default::default()
            })
        );
        assert_eq!(
            rest_facts(br#"{"message":{"contextId":"c","taskId":"t"}}"#).and_then(|f| f.context_id),
            None
        );
        assert_eq!(rest_facts(b" "), Some(RequestFacts::default()));
        assert_eq!(rest_facts(b"{"), None);
        assert_eq!(rest_facts(b"\xef\xbb\xbf{}"), None);
    }
}
