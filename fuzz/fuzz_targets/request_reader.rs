//! Arbitrary bytes as a JSON-RPC request body: the gateway's reader
//! (`a2a::request::jsonrpc_facts`) against `serde_json::Value`.
//!
//! - Where both read a call, they read the same method, tenant, task and
//!   grants (the reader is last-wins, as `Value` is; it names a duplicated
//!   member policy reads, which a route that checks sends refuses).
//! - Where `serde_json` reads a call, so does the reader: a body the
//!   reader cannot read is one `serde_json` cannot either (and `diagnose`
//!   names its fault, which a route that checks sends refuses), so nothing
//!   a worker would run passes such a route unread.
#![no_main]

use a2a_gateway::a2a::request::{diagnose, jsonrpc_facts};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|body: &[u8]| {
    let facts = jsonrpc_facts(body);
    let value: Option<Value> = serde_json::from_slice(body).ok();
    let call = value
        .as_ref()
        .and_then(Value::as_object)
        .filter(|o| o.get("method").is_some_and(Value::is_string));
    let Some(obj) = call else {
        return;
    };
    let Some(f) = facts else {
        panic!(
            "serde_json reads a call the reader does not (diagnose: {:?})",
            diagnose(body)
        );
    };
    let text = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let p = obj.get("params").and_then(Value::as_object);
    let m = p.and_then(|p| p.get("message")).and_then(Value::as_object);
    let md = m.and_then(|m| m.get("metadata")).and_then(Value::as_object);
    let grant = |k: &str| md.and_then(|md| md.get(k)).is_some_and(|v| !v.is_null());
    assert_eq!(f.tenant, text(p.and_then(|p| p.get("tenant"))));
    assert_eq!(
        f.task_id,
        text(p.and_then(|p| p.get("id"))).or_else(|| text(m.and_then(|m| m.get("taskId"))))
    );
    assert_eq!(f.lease.is_some(), grant("a2a-rust.com/lease"));
    assert_eq!(f.budget.is_some(), grant("a2a-rust.com/budget"));
});
