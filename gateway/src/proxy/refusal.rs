//! Every answer the gateway gives itself instead of the worker's: policy
//! refusals (nothing reaches the worker) and worker failures (the worker
//! could not be reached or did not answer in time).
//!
//! One enum, and one `impl` that says, for each case, the JSON-RPC code, the
//! REST status and its gRPC-style name, the message, `error.data`, the
//! metric label and `Retry-After`; matched exhaustively, so a new case
//! cannot be half answered. A JSON-RPC caller gets a JSON-RPC error (HTTP
//! 200 for a refusal, as A2A JSON-RPC servers answer errors; the worker's
//! 502 or 504 for a failed worker), a REST caller the HTTP status with
//! `{"error": {code, status, message, details?}}`; so does traffic the
//! gateway did not read as A2A.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use policies::budget::BudgetRefusal;
use policies::lease::LeaseRefusal;
use serde_json::{json, Value};

use super::http1::Http1Fault;
use crate::a2a::request::BodyFault;
use crate::a2a::Binding;
use crate::budget::BudgetError;
use crate::metrics;

/// Why the gateway answers a request itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No route matches the request's host and path.
    NoRoute { host: String, path: String },
    /// A request head HTTP/1 says must be refused (400 whatever the
    /// binding): an HTTP/1.1 request without `Host`, `Content-Length`
    /// values that cannot be collapsed into one.
    Http1(Http1Fault),
    /// A route that checks sends could not read this body completely and
    /// unambiguously. A worker may read it all the same (the Python SDK
    /// takes UTF-16 and a UTF-8 BOM, Go ignores trailing bytes, a worker may
    /// take the first of two `method`s), so it is not passed.
    Unreadable(BodyFault),
    /// A v0.3 send name on a route that checks sends: not read as a send,
    /// so never admitted; refused rather than passed to a worker that may
    /// serve it.
    V03Send,
    /// A JSON-RPC batch holding a send this route checks; `ids` are the
    /// calls' ids, one error each (`Null` for an element that is no request).
    BatchSend { ids: Vec<Value> },
    /// A lease grant out of bounds or malformed.
    Lease(LeaseRefusal),
    /// A lease the gateway must hold while its store is down
    /// (`on_store_error = "fail-closed"`).
    LeaseStoreUnavailable,
    /// A budget grant refused, an account exhausted, or the store down.
    Budget(BudgetError),
    /// The admitted grant could not be written into the message.
    BudgetNotAttached,
    /// A body over `limits.max_inspect_body` on a route that checks sends.
    BodyTooLarge { limit: usize },
    /// A WebSocket upgrade on a budgeted route.
    BudgetWebSocket,
    /// A gRPC call on a route that checks sends that the gateway would
    /// pass unread: another service, an A2A method this version does not
    /// know, or a codec other than protobuf.
    GrpcUnread(GrpcUnread),
    /// `[routes.auth] tenants`: the verified caller (or an anonymous one)
    /// named a tenant it may not use.
    TenantNotAllowed,
    /// A WebSocket upgrade on a route that binds tenants to identities.
    TenantWebSocket,
    /// `[routes.auth]`: no credential on a route that requires one
    /// (`rejected: false`), or one that was not accepted. `challenge` is the
    /// `WWW-Authenticate` value, `what` what the caller must send. Why a
    /// credential failed is logged, never told the caller.
    Unauthenticated {
        rejected: bool,
        challenge: String,
        what: String,
    },
    /// The worker's host name did not resolve.
    WorkerUnresolvable(String),
    /// The worker could not be reached, broke off, or did not answer in
    /// time (`status` 502 or 504, from `policies::failure`).
    WorkerFailed { status: u16, why: String },
}

pub use policies::reading::GrpcUnread;

/// The parts of an A2A error answer.
struct Parts {
    /// JSON-RPC `error.code`.
    code: i64,
    /// REST status and its name.
    http: (u16, &'static str),
    message: String,
    /// JSON-RPC `error.data` / REST `error.details[0]`.
    data: Option<Value>,
    /// Seconds for `Retry-After`.
    retry_after: Option<u64>,
}

const INVALID_ARGUMENT: (u16, &str) = (400, "INVALID_ARGUMENT");

impl Refusal {
    /// The metric label (`a2agw_refusals_total{reason}`) and log reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoRoute { .. } => "no_route",
            Refusal::Http1(Http1Fault::MissingHost) => "http_missing_host",
            Refusal::Http1(Http1Fault::ContentLength) => "http_content_length",
            Refusal::Unreadable(fault) => fault.reason(),
            Refusal::V03Send => "v03_send",
            Refusal::BatchSend { .. } => "batch_send",
            Refusal::Lease(LeaseRefusal::OutOfBounds { .. }) => "lease_out_of_bounds",
            Refusal::Lease(LeaseRefusal::Malformed(_)) => "lease_malformed",
            Refusal::LeaseStoreUnavailable => "store_unavailable",
            Refusal::Budget(BudgetError::Refused(
                BudgetRefusal::AboveCap { .. } | BudgetRefusal::TooManyWithCaps(_),
            )) => "budget_above_cap",
            Refusal::Budget(BudgetError::Refused(_)) => "budget_malformed",
            Refusal::Budget(BudgetError::Exhausted { .. }) => "budget_account_exhausted",
            Refusal::Budget(BudgetError::StoreUnavailable(_)) => "store_unavailable",
            Refusal::Budget(BudgetError::AccountsFull { .. }) => "budget_accounts_full",
            Refusal::BudgetNotAttached => "budget_unreadable",
            Refusal::BodyTooLarge { .. } => "body_too_large",
            Refusal::BudgetWebSocket => "budget_websocket",
            Refusal::GrpcUnread(GrpcUnread::Service) => "grpc_other_service",
            Refusal::GrpcUnread(GrpcUnread::Method) => "grpc_unknown_method",
            Refusal::GrpcUnread(GrpcUnread::Codec) => "grpc_codec",
            Refusal::TenantNotAllowed => "tenant_not_allowed",
            Refusal::TenantWebSocket => "tenants_websocket",
            Refusal::Unauthenticated {
                rejected: false, ..
            } => "unauthenticated",
            Refusal::Unauthenticated { rejected: true, .. } => "credential_rejected",
            Refusal::WorkerUnresolvable(_) => "worker_unresolvable",
            Refusal::WorkerFailed { status: 504, .. } => "worker_timeout",
            Refusal::WorkerFailed { .. } => "worker_failed",
        }
    }

    /// A refusal by policy (counted in `a2agw_refusals_total`), not a
    /// failure of the worker or a request for no route.
    fn is_policy(&self) -> bool {
        !matches!(self, Refusal::NoRoute { .. } | Refusal::WorkerFailed { .. })
    }

    /// The worker could not be reached or did not answer.
    fn is_worker_failure(&self) -> bool {
        matches!(
            self,
            Refusal::WorkerUnresolvable(_) | Refusal::WorkerFailed { .. }
        )
    }

    /// Answered with its HTTP status in every binding: a failed worker's
    /// 502 or 504, and HTTP/1's 400 for a head it requires be refused.
    fn keeps_status(&self) -> bool {
        self.is_worker_failure()
            || matches!(self, Refusal::Http1(_) | Refusal::Unauthenticated { .. })
    }

    fn parts(&self) -> Parts {
        let parts = |code, http, message: String| Parts {
            code,
            http,
            message,
            data: None,
            retry_after: None,
        };
        match self {
            Refusal::NoRoute { host, path } => parts(
                -32601,
                (404, "NOT_FOUND"),
                format!("no route for host {host:?} and path {path:?}"),
            ),
            Refusal::Http1(Http1Fault::MissingHost) => parts(
                -32600,
                (400, "INVALID_ARGUMENT"),
                "an HTTP/1.1 request must carry a Host header (RFC 9112, section 3.2)".into(),
            ),
            Refusal::Http1(Http1Fault::ContentLength) => parts(
                -32600,
                (400, "INVALID_ARGUMENT"),
                "the Content-Length values differ or are not numbers (RFC 9110, section 8.6)"
                    .into(),
            ),
            Refusal::Unreadable(fault) => {
                let why = match fault {
                    BodyFault::NotUtf8 => "it is not UTF-8 (a byte order mark, UTF-16 or UTF-32); send UTF-8 JSON without a byte order mark (RFC 8259, section 8.1)".into(),
                    BodyFault::TrailingBytes => "more than whitespace follows the JSON value".into(),
                    BodyFault::NumberOutOfRange => "a number is out of the range of a 64-bit float".into(),
                    BodyFault::NotJson => "it is not JSON".into(),
                    BodyFault::DuplicateKey(key) => format!("the member {key:?} appears twice in its object"),
                    BodyFault::NotGrpcMessage => "it is not one uncompressed protobuf message of the method's type (send it without grpc-encoding)".into(),
                };
                let code = if matches!(fault, BodyFault::DuplicateKey(_)) {
                    -32600
                } else {
                    -32700
                };
                parts(
                    code,
                    INVALID_ARGUMENT,
                    format!("this route checks every send it passes and could not read this request unambiguously: {why}"),
                )
            }
            Refusal::V03Send => parts(
                -32004,
                INVALID_ARGUMENT,
                "this route checks A2A v1.0 sends: use SendMessage or SendStreamingMessage, not the v0.3 method names".into(),
            ),
            Refusal::BatchSend { .. } => parts(
                -32004,
                INVALID_ARGUMENT,
                "this route checks each send's budget or lease grant, one send per request: send SendMessage and SendStreamingMessage outside JSON-RPC batches".into(),
            ),
            Refusal::Lease(r) => parts(-32602, INVALID_ARGUMENT, r.to_string()),
            Refusal::LeaseStoreUnavailable => parts(
                -32603,
                (503, "UNAVAILABLE"),
                "the lease could not be stored: the gateway's store is unavailable".into(),
            ),
            Refusal::Budget(e @ BudgetError::Refused(_)) => {
                parts(-32602, INVALID_ARGUMENT, e.to_string())
            }
            Refusal::Budget(
                e @ BudgetError::Exhausted {
                    account,
                    meter,
                    asked,
                    left,
                    limit,
                    resets_at_ms,
                    resets_in_ms,
                },
            ) => Parts {
                code: -32603,
                http: (429, "RESOURCE_EXHAUSTED"),
                message: e.to_string(),
                data: Some(json!({
                    policies::budget::FAILURE_METADATA_KEY: policies::budget::BUDGET_EXHAUSTED_CLASS,
                    "account": {"route": &*account.route, "per": &*account.scope, "holder": &*account.holder},
                    "meter": meter,
                    "asked": asked,
                    "left": left,
                    "limit": limit,
                    "resetsAtMs": resets_at_ms,
                })),
                retry_after: Some(resets_in_ms.div_ceil(1000)),
            },
            Refusal::Budget(e @ (BudgetError::StoreUnavailable(_) | BudgetError::AccountsFull { .. })) => {
                parts(-32603, (503, "UNAVAILABLE"), e.to_string())
            }
            Refusal::BudgetNotAttached => parts(
                -32602,
                INVALID_ARGUMENT,
                "the message could not be read to attach its budget".into(),
            ),
            Refusal::BodyTooLarge { limit } => parts(
                -32600,
                (413, "INVALID_ARGUMENT"),
                format!("the request body is over {limit} bytes (limits.max_inspect_body): this route checks every send and must read a request whole"),
            ),
            Refusal::BudgetWebSocket => parts(
                -32004,
                (403, "PERMISSION_DENIED"),
                "this route enforces budgets, which the gateway applies on the JSON-RPC and HTTP+JSON bindings only; use one of those".into(),
            ),
            Refusal::GrpcUnread(what) => parts(
                -32004,
                (403, "PERMISSION_DENIED"),
                format!(
                    "this route checks every send it passes, and passes gRPC calls of lf.a2a.v1.A2AService in the protobuf codec only: {}",
                    match what {
                        GrpcUnread::Service => "this path is no method of that service",
                        GrpcUnread::Method => "this method of that service is not one the gateway reads",
                        GrpcUnread::Codec => "send application/grpc or application/grpc+proto",
                    }
                ),
            ),
            Refusal::TenantNotAllowed => parts(
                -32004,
                (403, "PERMISSION_DENIED"),
                "the caller may not name this tenant on this route".into(),
            ),
            Refusal::TenantWebSocket => parts(
                -32004,
                (403, "PERMISSION_DENIED"),
                "this route binds tenants to callers, which the gateway checks on the JSON-RPC, HTTP+JSON and gRPC bindings only; use one of those".into(),
            ),
            // As a2a-rust answers a refused credential: 401 on every
            // binding (a client refreshes its token on the status), with
            // an Invalid Request body.
            Refusal::Unauthenticated { rejected, what, .. } => parts(
                -32600,
                (401, "UNAUTHENTICATED"),
                if *rejected {
                    format!("the credential was not accepted; send {what}")
                } else {
                    format!("this route requires a verified caller; send {what}")
                },
            ),
            Refusal::WorkerUnresolvable(why) => parts(-32603, (502, "UNAVAILABLE"), why.clone()),
            Refusal::WorkerFailed { status, why } => {
                let name = if *status == 504 {
                    "DEADLINE_EXCEEDED"
                } else {
                    "UNAVAILABLE"
                };
                parts(-32603, (*status, name), why.clone())
            }
        }
    }

    /// Counts and logs the refusal, once, where it is answered. A policy
    /// refusal of a request that matched no route (an HTTP/1 fault) is
    /// counted with an empty `route`.
    pub fn count(&self, route: Option<&str>) {
        let reason = self.reason();
        match (self, route) {
            (Refusal::NoRoute { .. }, _) => {
                metrics::NO_ROUTE.with_label_values(&["proxy"]).inc();
            }
            (_, route) if self.is_policy() => {
                let route = route.unwrap_or("");
                metrics::REFUSALS.with_label_values(&[route, reason]).inc();
                tracing::info!(route, reason, "request refused: {}", self.parts().message);
            }
            _ => {
                tracing::debug!(
                    route,
                    reason,
                    "answered for the worker: {}",
                    self.parts().message
                );
            }
        }
    }

    /// The status and body for a caller of `binding`; traffic the gateway
    /// did not read as JSON-RPC gets the REST shape.
    pub fn render(&self, binding: Option<Binding>, rpc_id: Option<&Value>) -> Answer {
        let p = self.parts();
        let challenge = match self {
            Refusal::Unauthenticated { challenge, .. } => Some(challenge.clone()),
            _ => None,
        };
        if binding == Some(Binding::Grpc) {
            // Trailers-only: HTTP 200, the status in the head.
            return Answer {
                status: 200,
                body: Value::Null,
                retry_after: p.retry_after,
                challenge,
                grpc: Some((grpc_code(p.http.1), p.message)),
            };
        }
        if !matches!(binding, Some(Binding::JsonRpc | Binding::WebSocket)) {
            let mut error = json!({"code": p.http.0, "status": p.http.1, "message": p.message});
            if let Some(d) = &p.data {
                error["details"] = json!([d]);
            }
            return Answer {
                status: p.http.0,
                body: json!({ "error": error }),
                retry_after: p.retry_after,
                challenge,
                grpc: None,
            };
        }
        let mut error = json!({"code": p.code, "message": p.message});
        if let Some(d) = p.data {
            error["data"] = d;
        }
        let answer = |id: Value| json!({"jsonrpc": "2.0", "id": id, "error": error.clone()});
        let body = match self {
            Refusal::BatchSend { ids } if !ids.is_empty() => {
                Value::Array(ids.iter().cloned().map(answer).collect())
            }
            _ => answer(rpc_id.cloned().unwrap_or(Value::Null)),
        };
        // A policy refusal is an application error: HTTP 200, as A2A
        // JSON-RPC servers answer errors. A failed worker keeps its 502 or
        // 504, as any proxy answers it, so logs, load balancers and retries
        // see it, and HTTP/1's faults their 400; the body is what the
        // caller's SDK reads.
        let status = if self.keeps_status() { p.http.0 } else { 200 };
        Answer {
            status,
            body,
            retry_after: p.retry_after,
            challenge,
            grpc: None,
        }
    }
}

/// The gRPC status code of a gRPC-style status name (the names the REST
/// shape already carries).
fn grpc_code(name: &str) -> u32 {
    match name {
        "CANCELLED" => 1,
        "INVALID_ARGUMENT" => 3,
        "DEADLINE_EXCEEDED" => 4,
        "NOT_FOUND" => 5,
        "ALREADY_EXISTS" => 6,
        "PERMISSION_DENIED" => 7,
        "RESOURCE_EXHAUSTED" => 8,
        "FAILED_PRECONDITION" => 9,
        "ABORTED" => 10,
        "OUT_OF_RANGE" => 11,
        "UNIMPLEMENTED" => 12,
        "INTERNAL" => 13,
        "UNAVAILABLE" => 14,
        "DATA_LOSS" => 15,
        "UNAUTHENTICATED" => 16,
        _ => 2,
    }
}

/// `grpc-message`: percent-encoded outside printable ASCII (and `%`), as
/// the gRPC HTTP/2 protocol spells it.
fn grpc_message(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for b in msg.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What the caller is answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub retry_after: Option<u64>,
    /// `WWW-Authenticate`, on a 401.
    pub challenge: Option<String>,
    /// A gRPC caller's answer: `grpc-status` and its message, in the head
    /// of an answer without a body (trailers-only).
    pub grpc: Option<(u32, String)>,
}

impl Answer {
    /// The answer's head and body, as written.
    pub fn parts(self) -> pingora::Result<(ResponseHeader, Bytes)> {
        if let Some((code, message)) = self.grpc {
            let mut resp = ResponseHeader::build(200, Some(4))?;
            resp.insert_header("content-type", "application/grpc")?;
            resp.insert_header("grpc-status", code.to_string())?;
            resp.insert_header("grpc-message", grpc_message(&message))?;
            if let Some(c) = self.challenge {
                resp.insert_header("www-authenticate", c)?;
            }
            return Ok((resp, Bytes::new()));
        }
        let body = Bytes::from(self.body.to_string());
        let mut resp = ResponseHeader::build(self.status, Some(4))?;
        resp.insert_header("content-type", "application/json")?;
        resp.insert_header("content-length", body.len().to_string())?;
        if let Some(s) = self.retry_after {
            resp.insert_header("retry-after", s.to_string())?;
        }
        if let Some(c) = self.challenge {
            resp.insert_header("www-authenticate", c)?;
        }
        Ok((resp, body))
    }

    /// Writes the answer in place of the worker's.
    pub async fn write(self, session: &mut Session) -> pingora::Result<()> {
        let (resp, body) = self.parts()?;
        if body.is_empty() {
            return session.write_response_header(Box::new(resp), true).await;
        }
        session.write_response_header(Box::new(resp), false).await?;
        session.write_response_body(Some(body), true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every() -> Vec<Refusal> {
        vec![
            Refusal::NoRoute {
                host: "h".into(),
                path: "/p".into(),
            },
            Refusal::Http1(Http1Fault::MissingHost),
            Refusal::Http1(Http1Fault::ContentLength),
            Refusal::Unauthenticated {
                rejected: true,
                challenge: "Bearer realm=\"a2a-gateway\", error=\"invalid_token\"".into(),
                what: "Authorization: Bearer <JWT>".into(),
            },
            Refusal::Unreadable(BodyFault::NotUtf8),
            Refusal::Unreadable(BodyFault::TrailingBytes),
            Refusal::Unreadable(BodyFault::NumberOutOfRange),
            Refusal::Unreadable(BodyFault::NotJson),
            Refusal::Unreadable(BodyFault::NotGrpcMessage),
            Refusal::Unreadable(BodyFault::DuplicateKey("method")),
            Refusal::V03Send,
            Refusal::BatchSend {
                ids: vec![json!(1), Value::Null],
            },
            Refusal::Lease(LeaseRefusal::OutOfBounds {
                ttl_ms: 1,
                max_ms: 10,
            }),
            Refusal::Lease(LeaseRefusal::Malformed("x".into())),
            Refusal::LeaseStoreUnavailable,
            Refusal::Budget(BudgetError::StoreUnavailable("down".into())),
            Refusal::Budget(BudgetError::AccountsFull { max: 2 }),
            Refusal::BudgetNotAttached,
            Refusal::GrpcUnread(GrpcUnread::Service),
            Refusal::GrpcUnread(GrpcUnread::Method),
            Refusal::GrpcUnread(GrpcUnread::Codec),
            Refusal::TenantNotAllowed,
            Refusal::TenantWebSocket,
            Refusal::BodyTooLarge { limit: 1 },
            Refusal::BudgetWebSocket,
            Refusal::WorkerUnresolvable("no such host".into()),
            Refusal::WorkerFailed {
                status: 504,
                why: "slow".into(),
            },
            Refusal::WorkerFailed {
                status: 502,
                why: "refused".into(),
            },
        ]
    }

    /// A gRPC caller gets a trailers-only answer: HTTP 200, no body, a
    /// non-zero `grpc-status` of the same name as the REST status, and a
    /// printable `grpc-message`.
    #[test]
    fn grpc_callers_get_a_grpc_status() {
        for r in every() {
            let a = r.render(Some(Binding::Grpc), None);
            let name = r.parts().http.1;
            let (head, body) = a.parts().unwrap();
            assert_eq!(head.status.as_u16(), 200, "{r:?}");
            assert!(body.is_empty(), "{r:?}");
            let h = |k: &str| head.headers.get(k).unwrap().to_str().unwrap().to_string();
            assert_eq!(h("content-type"), "application/grpc");
            let code: u32 = h("grpc-status").parse().unwrap();
            assert_ne!(code, 0, "{r:?}");
            assert_eq!(code, grpc_code(name), "{r:?}");
            assert!(h("grpc-message").bytes().all(|b| (0x20..0x7f).contains(&b)));
        }
        assert_eq!(grpc_code("INVALID_ARGUMENT"), 3);
        assert_eq!(grpc_code("RESOURCE_EXHAUSTED"), 8);
        assert_eq!(grpc_message("50% – ok"), "50%25 %E2%80%93 ok");
    }

    #[test]
    fn jsonrpc_callers_always_get_a_jsonrpc_error() {
        for r in every() {
            let a = r.render(Some(Binding::JsonRpc), Some(&json!(7)));
            let status = if r.keeps_status() {
                r.parts().http.0
            } else {
                200
            };
            assert_eq!(a.status, status, "{r:?}");
            let body = a.body;
            let first = if body.is_array() { &body[0] } else { &body };
            assert_eq!(first["jsonrpc"], "2.0", "{r:?}");
            assert!(first["error"]["code"].as_i64().is_some(), "{r:?}");
            assert!(
                !first["error"]["message"].as_str().unwrap().is_empty(),
                "{r:?}"
            );
        }
    }

    #[test]
    fn rest_callers_get_the_status_and_an_error_body() {
        for r in every() {
            let a = r.render(Some(Binding::Rest), None);
            let body = a.body;
            assert_eq!(body["error"]["code"], a.status, "{r:?}");
            assert!(body["error"]["status"].as_str().is_some(), "{r:?}");
        }
    }

    #[test]
    fn worker_failures_keep_their_status() {
        #[rustfmt::skip]
        let table = [
            (Refusal::WorkerFailed { status: 504, why: String::new() }, 504, "worker_timeout"),
            (Refusal::WorkerFailed { status: 502, why: String::new() }, 502, "worker_failed"),
            (Refusal::WorkerUnresolvable(String::new()), 502, "worker_unresolvable"),
        ];
        for (r, status, reason) in table {
            assert_eq!(r.render(None, None).status, status);
            assert_eq!(r.render(Some(Binding::Rest), None).status, status);
            assert_eq!(r.reason(), reason);
        }
    }

    #[test]
    fn http1_faults_are_400_in_every_binding() {
        for fault in [Http1Fault::MissingHost, Http1Fault::ContentLength] {
            let r = Refusal::Http1(fault);
            let rpc = r.render(Some(Binding::JsonRpc), None);
            assert_eq!(rpc.status, 400, "{r:?}");
            assert_eq!(rpc.body["error"]["code"], -32600, "{r:?}");
            assert_eq!(rpc.body["id"], Value::Null, "{r:?}");
            let rest = r.render(Some(Binding::Rest), None);
            assert_eq!(rest.status, 400, "{r:?}");
            assert_eq!(rest.body["error"]["status"], "INVALID_ARGUMENT", "{r:?}");
            assert!(r.is_policy(), "{r:?}: counted");
        }
    }

    #[test]
    fn a_batch_gets_one_error_per_call() {
        let r = Refusal::BatchSend {
            ids: vec![json!(1), json!("b"), Value::Null],
        };
        let body = r.render(Some(Binding::JsonRpc), None).body;
        let ids: Vec<&Value> = body.as_array().unwrap().iter().map(|a| &a["id"]).collect();
        assert_eq!(ids, [&json!(1), &json!("b"), &Value::Null]);
    }
}
