//! Classifying a request by its method and path, before any body is read.

use std::borrow::Cow;

/// Which A2A HTTP binding a call uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Binding {
    /// JSON-RPC 2.0: one endpoint, the method in the body.
    JsonRpc,
    /// HTTP+JSON (REST): the method in the verb and path.
    Rest,
    /// a2a-rust's WebSocket binding: JSON-RPC messages in text frames.
    WebSocket,
    /// gRPC (`lf.a2a.v1.A2AService`) over HTTP/2: protobuf messages.
    Grpc,
}

impl Binding {
    pub fn as_str(self) -> &'static str {
        match self {
            Binding::JsonRpc => "jsonrpc",
            Binding::Rest => "rest",
            Binding::WebSocket => "websocket",
            Binding::Grpc => "grpc",
        }
    }
}

/// The A2A v1.0 methods, spelled as the spec spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum A2aMethod {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    CreateTaskPushNotificationConfig,
    GetTaskPushNotificationConfig,
    ListTaskPushNotificationConfigs,
    DeleteTaskPushNotificationConfig,
    GetExtendedAgentCard,
}

impl A2aMethod {
    /// Every method, in the spec's order.
    pub const ALL: [A2aMethod; 11] = [
        A2aMethod::SendMessage,
        A2aMethod::SendStreamingMessage,
        A2aMethod::GetTask,
        A2aMethod::ListTasks,
        A2aMethod::CancelTask,
        A2aMethod::SubscribeToTask,
        A2aMethod::CreateTaskPushNotificationConfig,
        A2aMethod::GetTaskPushNotificationConfig,
        A2aMethod::ListTaskPushNotificationConfigs,
        A2aMethod::DeleteTaskPushNotificationConfig,
        A2aMethod::GetExtendedAgentCard,
    ];

    /// Reads a JSON-RPC method name. v0.3 names (`message/send`) are not
    /// v1.0 methods and read as `None`: such calls are proxied untracked.
    pub fn from_jsonrpc(name: &str) -> Option<A2aMethod> {
        Some(match name {
            "SendMessage" => A2aMethod::SendMessage,
            "SendStreamingMessage" => A2aMethod::SendStreamingMessage,
            "GetTask" => A2aMethod::GetTask,
            "ListTasks" => A2aMethod::ListTasks,
            "CancelTask" => A2aMethod::CancelTask,
            "SubscribeToTask" => A2aMethod::SubscribeToTask,
            "CreateTaskPushNotificationConfig" => A2aMethod::CreateTaskPushNotificationConfig,
            "GetTaskPushNotificationConfig" => A2aMethod::GetTaskPushNotificationConfig,
            "ListTaskPushNotificationConfigs" => A2aMethod::ListTaskPushNotificationConfigs,
            "DeleteTaskPushNotificationConfig" => A2aMethod::DeleteTaskPushNotificationConfig,
            "GetExtendedAgentCard" => A2aMethod::GetExtendedAgentCard,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            A2aMethod::SendMessage => "SendMessage",
            A2aMethod::SendStreamingMessage => "SendStreamingMessage",
            A2aMethod::GetTask => "GetTask",
            A2aMethod::ListTasks => "ListTasks",
            A2aMethod::CancelTask => "CancelTask",
            A2aMethod::SubscribeToTask => "SubscribeToTask",
            A2aMethod::CreateTaskPushNotificationConfig => "CreateTaskPushNotificationConfig",
            A2aMethod::GetTaskPushNotificationConfig => "GetTaskPushNotificationConfig",
            A2aMethod::ListTaskPushNotificationConfigs => "ListTaskPushNotificationConfigs",
            A2aMethod::DeleteTaskPushNotificationConfig => "DeleteTaskPushNotificationConfig",
            A2aMethod::GetExtendedAgentCard => "GetExtendedAgentCard",
        }
    }

    /// Methods whose answer is an SSE stream of one task's events.
    pub fn is_streaming(self) -> bool {
        matches!(
            self,
            A2aMethod::SendStreamingMessage | A2aMethod::SubscribeToTask
        )
    }

    /// The push-notification config methods: their task is `taskId` (their
    /// `id` names a config).
    pub fn is_push_config(self) -> bool {
        matches!(
            self,
            A2aMethod::CreateTaskPushNotificationConfig
                | A2aMethod::GetTaskPushNotificationConfig
                | A2aMethod::ListTaskPushNotificationConfigs
                | A2aMethod::DeleteTaskPushNotificationConfig
        )
    }

    /// Methods whose answer names a task (and its state) the gateway tracks.
    pub fn is_tracked(self) -> bool {
        matches!(
            self,
            A2aMethod::SendMessage | A2aMethod::SendStreamingMessage | A2aMethod::SubscribeToTask
        )
    }

    /// Methods whose answer is an agent card, rewritten like the well-known one.
    pub fn returns_card(self) -> bool {
        matches!(self, A2aMethod::GetExtendedAgentCard)
    }
}

/// What a request is, from its verb and path alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `GET …/.well-known/agent-card.json`.
    AgentCard,
    /// A REST (HTTP+JSON) call; `tenant` from a `/{tenant}/` or
    /// `/tenants/{tenant}/` prefix, `task_id` from the path where the method has one.
    Rest {
        method: A2aMethod,
        tenant: Option<String>,
        task_id: Option<String>,
    },
    /// A `POST` that is not a REST route: a JSON-RPC call if its body says so.
    JsonRpcCandidate,
    /// An HTTP/1.1 `Upgrade` (WebSocket): proxied as is.
    Upgrade,
    /// A gRPC call (`content-type: application/grpc`) of the A2A service:
    /// `method` is `None` for a method this version does not know (passed
    /// untracked). A call of another gRPC service is [`Call::Other`], and
    /// goes to the worker over HTTP/2 all the same.
    Grpc { method: Option<A2aMethod> },
    /// Anything else: proxied verbatim, never tracked.
    Other,
}

/// Where an agent's card is, below its interface URL.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

fn is_route_head(seg: &str) -> bool {
    matches!(
        seg,
        "message:send" | "message:stream" | "message" | "tasks" | "extendedAgentCard"
    )
}

/// Classifies a request by verb and path (the path relative to the worker's
/// interface URL, i.e. after the route prefix is stripped) and query (also
/// read after a `?` in `path`): the query can name a REST call's tenant.
pub fn classify(method: &http::Method, path: &str, query: Option<&str>, is_upgrade: bool) -> Call {
    if is_upgrade {
        return Call::Upgrade;
    }
    let path = path.split('#').next().unwrap_or("");
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p, query.or(Some(q))),
        None => (path, query),
    };
    if path.ends_with(CARD_PATH) && (method == http::Method::GET || method == http::Method::HEAD) {
        return Call::AgentCard;
    }
    if let Some(call) = classify_rest(method, path, query) {
        return call;
    }
    if method == http::Method::POST {
        Call::JsonRpcCandidate
    } else {
        Call::Other
    }
}

/// A query parameter's value, percent-decoded (`+` is a space, as in a
/// form-encoded query).
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(&v.replace('+', " ")).into_owned())
    })
}

fn classify_rest(method: &http::Method, path: &str, query: Option<&str>) -> Option<Call> {
    // Segments are matched decoded, as workers route them (Starlette decodes
    // the path first): `/message%3Asend` is a send.
    let decoded: Vec<Cow<'_, str>> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = decoded.iter().map(|s| s.as_ref()).collect();
    let (tenant, rest): (Option<&str>, &[&str]) = match segs.as_slice() {
        [head, ..] if is_route_head(head) => (None, &segs[..]),
        ["tenants", t, head, ..] if is_route_head(head) => (Some(t), &segs[2..]),
        [t, head, ..] if is_route_head(head) => (Some(t), &segs[1..]),
        _ => return None,
    };
    let m = method.as_str();
    let (a2a, task_id) = match (m, rest) {
        ("POST", ["message:send"]) => (A2aMethod::SendMessage, None),
        ("POST", ["message:stream"]) => (A2aMethod::SendStreamingMessage, None),
        ("GET", ["tasks"]) => (A2aMethod::ListTasks, None),
        ("GET", ["extendedAgentCard"]) => (A2aMethod::GetExtendedAgentCard, None),
        ("POST", ["tasks", id, "cancel"]) => (A2aMethod::CancelTask, Some(*id)),
        ("POST" | "GET", ["tasks", id, "subscribe"]) => (A2aMethod::SubscribeToTask, Some(*id)),
        ("POST", ["tasks", id, "pushNotificationConfigs"]) => {
            (A2aMethod::CreateTaskPushNotificationConfig, Some(*id))
        }
        ("GET", ["tasks", id, "pushNotificationConfigs"]) => {
            (A2aMethod::ListTaskPushNotificationConfigs, Some(*id))
        }
        ("GET", ["tasks", id, "pushNotificationConfigs", _]) => {
            (A2aMethod::GetTaskPushNotificationConfig, Some(*id))
        }
        ("DELETE", ["tasks", id, "pushNotificationConfigs", _]) => {
            (A2aMethod::DeleteTaskPushNotificationConfig, Some(*id))
        }
        (_, ["tasks", id_verb]) => match id_verb.rsplit_once(':') {
            Some((id, "cancel")) if m == "POST" => (A2aMethod::CancelTask, Some(id)),
            Some((id, "subscribe")) if m == "POST" || m == "GET" => {
                (A2aMethod::SubscribeToTask, Some(id))
            }
            _ if m == "GET" => (A2aMethod::GetTask, Some(*id_verb)),
            _ => return None,
        },
        _ => return None,
    };
    // With no tenant in the path, a2a-rust takes `?tenant=` (the path wins
    // when both name one, and either wins over the body's).
    let tenant = match tenant {
        Some(t) => Some((*t).to_owned()),
        None => query
            .and_then(|q| query_param(q, "tenant"))
            .filter(|t| !t.is_empty()),
    };
    Some(Call::Rest {
        method: a2a,
        tenant,
        task_id: task_id.map(str::to_owned),
    })
}

/// Decodes `%XX` escapes; invalid escapes are kept as written.
pub fn percent_decode(s: &str) -> Cow<'_, str> {
    if !s.contains('%') {
        return Cow::Borrowed(s);
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Encodes a path segment (tenant, task id) for a REST path.
pub fn percent_encode_segment(s: &str) -> Cow<'_, str> {
    let safe = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'~');
    if s.bytes().all(safe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() * 3);
    for c in s.bytes() {
        if safe(c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn all_methods_read_back_from_their_names() {
        for m in A2aMethod::ALL {
            assert_eq!(A2aMethod::from_jsonrpc(m.as_str()), Some(m));
        }
        let names: std::collections::HashSet<_> =
            A2aMethod::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(names.len(), A2aMethod::ALL.len(), "no method listed twice");
    }

    fn rest(method: A2aMethod, tenant: Option<&str>, id: Option<&str>) -> Call {
        Call::Rest {
            method,
            tenant: tenant.map(str::to_string),
            task_id: id.map(str::to_string),
        }
    }

    #[test]
    fn classification_table() {
        use A2aMethod::*;
        let table = [
            (Method::GET, "/.well-known/agent-card.json", Call::AgentCard),
            (
                Method::GET,
                "/a/b/.well-known/agent-card.json?x=1",
                Call::AgentCard,
            ),
            (
                Method::POST,
                "/.well-known/agent-card.json",
                Call::JsonRpcCandidate,
            ),
            (Method::POST, "/message:send", rest(SendMessage, None, None)),
            (
                Method::POST,
                "/message:stream",
                rest(SendStreamingMessage, None, None),
            ),
            (
                Method::POST,
                "/acme/message:stream",
                rest(SendStreamingMessage, Some("acme"), None),
            ),
            (
                Method::POST,
                "/tenants/acme/message:send",
                rest(SendMessage, Some("acme"), None),
            ),
            (
                Method::POST,
                "/ac%20me/message:stream",
                rest(SendStreamingMessage, Some("ac me"), None),
            ),
            // Workers route the decoded path (the Python SDK does).
            (
                Method::POST,
                "/message%3Asend",
                rest(SendMessage, None, None),
            ),
            (
                Method::POST,
                "/acme/message%3astream",
                rest(SendStreamingMessage, Some("acme"), None),
            ),
            (
                Method::POST,
                "/tasks/t%2F1%3Acancel",
                rest(CancelTask, None, Some("t/1")),
            ),
            (
                Method::GET,
                "/tasks/a%253A",
                rest(GetTask, None, Some("a%3A")),
            ),
            (Method::GET, "/tasks", rest(ListTasks, None, None)),
            (Method::GET, "/tasks/t1", rest(GetTask, None, Some("t1"))),
            (
                Method::GET,
                "/tasks/t1?historyLength=2",
                rest(GetTask, None, Some("t1")),
            ),
            (
                Method::GET,
                "/acme/tasks/t1",
                rest(GetTask, Some("acme"), Some("t1")),
            ),
            (
                Method::POST,
                "/tasks/t1:cancel",
                rest(CancelTask, None, Some("t1")),
            ),
            (
                Method::POST,
                "/tasks/t1/cancel",
                rest(CancelTask, None, Some("t1")),
            ),
            (
                Method::POST,
                "/acme/tasks/t1:cancel",
                rest(CancelTask, Some("acme"), Some("t1")),
            ),
            (
                Method::POST,
                "/tasks/t1:subscribe",
                rest(SubscribeToTask, None, Some("t1")),
            ),
            (
                Method::GET,
                "/tasks/t1:subscribe",
                rest(SubscribeToTask, None, Some("t1")),
            ),
            (
                Method::POST,
                "/acme/tasks/t:1:subscribe",
                rest(SubscribeToTask, Some("acme"), Some("t:1")),
            ),
            (
                Method::POST,
                "/tasks/t1/pushNotificationConfigs",
                rest(CreateTaskPushNotificationConfig, None, Some("t1")),
            ),
            (
                Method::GET,
                "/tasks/t1/pushNotificationConfigs",
                rest(ListTaskPushNotificationConfigs, None, Some("t1")),
            ),
            (
                Method::GET,
                "/tasks/t1/pushNotificationConfigs/p",
                rest(GetTaskPushNotificationConfig, None, Some("t1")),
            ),
            (
                Method::DELETE,
                "/tasks/t1/pushNotificationConfigs/p",
                rest(DeleteTaskPushNotificationConfig, None, Some("t1")),
            ),
            (
                Method::GET,
                "/extendedAgentCard",
                rest(GetExtendedAgentCard, None, None),
            ),
            (Method::POST, "/", Call::JsonRpcCandidate),
            (Method::POST, "/rpc", Call::JsonRpcCandidate),
            (Method::GET, "/", Call::Other),
            (Method::GET, "/healthz", Call::Other),
            (Method::PUT, "/tasks/t1", Call::Other),
            (Method::DELETE, "/tasks/t1:cancel", Call::Other),
        ];
        for (method, path, want) in table {
            assert_eq!(
                classify(&method, path, None, false),
                want,
                "{method} {path}"
            );
        }
        assert_eq!(classify(&Method::GET, "/ws", None, true), Call::Upgrade);
        // The query names a REST call's tenant when the path does not.
        assert_eq!(
            classify(
                &Method::POST,
                "/message:stream",
                Some("x=1&tenant=ac%20me"),
                false
            ),
            rest(SendStreamingMessage, Some("ac me"), None)
        );
        assert_eq!(
            classify(&Method::GET, "/tasks/t1?tenant=acme", None, false),
            rest(GetTask, Some("acme"), Some("t1"))
        );
        assert_eq!(
            classify(&Method::GET, "/beta/tasks/t1", Some("tenant=acme"), false),
            rest(GetTask, Some("beta"), Some("t1"))
        );
        assert_eq!(
            classify(&Method::GET, "/tasks/t1", Some("tenant="), false),
            rest(GetTask, None, Some("t1"))
        );
    }

    #[test]
    fn percent_coding() {
        assert_eq!(percent_decode("a%2Fb"), "a/b");
        assert_eq!(percent_decode("a%zzb%"), "a%zzb%");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_encode_segment("ac me/x"), "ac%20me%2Fx");
        assert_eq!(percent_encode_segment("t-1_2.3~"), "t-1_2.3~");
        assert_eq!(percent_decode(&percent_encode_segment("ü:/ %")), "ü:/ %");
    }
}
