//! What a route does with a request it would pass unread.
//!
//! A route that checks sends (budgets, enforced or imposed leases, poll
//! leases, verified callers) must read every call that could start a task,
//! because some worker would run a call the gateway did not read: a worker
//! that speaks h2c and ignores content types runs a JSON send typed
//! `application/grpc` at its REST or JSON-RPC path. These are the pure
//! decisions; `docs/behaviour.md` (strict reading) lists them.

/// A gRPC-typed call (`content-type: application/grpc…`), as classifying
/// its head found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcCall {
    /// Its path names a method of `lf.a2a.v1.A2AService`.
    pub a2a_service: bool,
    /// ... one this version knows.
    pub known_method: bool,
    /// Its content type names the protobuf codec.
    pub proto: bool,
    /// Its path names a service the route passes unread
    /// (`grpc_pass_services`).
    pub passed_service: bool,
}

/// Why a gRPC-typed call is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcUnread {
    /// Not a method of the A2A service (another service, or a REST or
    /// JSON-RPC path), nor one the route passes.
    Service,
    /// A method of the A2A service this version does not know.
    Method,
    /// A codec other than protobuf.
    Codec,
}

/// Whether a route refuses a gRPC-typed call: only one that checks sends,
/// and only what it would not read.
pub fn grpc_refusal(checks_sends: bool, call: GrpcCall) -> Option<GrpcUnread> {
    if !checks_sends {
        return None;
    }
    match call {
        GrpcCall {
            a2a_service: true,
            known_method: false,
            ..
        } => Some(GrpcUnread::Method),
        GrpcCall {
            a2a_service: true,
            proto: false,
            ..
        } => Some(GrpcUnread::Codec),
        GrpcCall {
            a2a_service: true, ..
        } => None,
        GrpcCall {
            passed_service: true,
            ..
        } => None,
        _ => Some(GrpcUnread::Service),
    }
}

/// Whether a route refuses a WebSocket upgrade: frames cannot be refused
/// one by one without breaking the socket, so a route that would have to
/// refuse one (a budget it could not rewrite, a tenant the caller may not
/// name) serves the HTTP bindings only. The budget reason comes first.
pub fn websocket_refusal(budgeted: bool, binds_tenants: bool) -> Option<WebSocketRefusal> {
    if budgeted {
        Some(WebSocketRefusal::Budget)
    } else if binds_tenants {
        Some(WebSocketRefusal::Tenants)
    } else {
        None
    }
}

/// Why a WebSocket upgrade is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebSocketRefusal {
    Budget,
    Tenants,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_calls() {
        let call = |a2a_service, known_method, proto, passed_service| GrpcCall {
            a2a_service,
            known_method,
            proto,
            passed_service,
        };
        use GrpcUnread::*;
        for (c, want) in [
            (call(true, true, true, false), None),
            (call(true, false, true, false), Some(Method)),
            (call(true, false, false, false), Some(Method)),
            (call(true, true, false, false), Some(Codec)),
            (call(false, false, true, false), Some(Service)),
            (call(false, false, false, false), Some(Service)),
            (call(false, false, true, true), None),
            // A passed service is still the A2A service's rules if it is
            // that service (the config refuses naming it).
            (call(true, true, false, true), Some(Codec)),
        ] {
            assert_eq!(grpc_refusal(true, c), want, "{c:?}");
            assert_eq!(
                grpc_refusal(false, c),
                None,
                "a route that checks nothing: {c:?}"
            );
        }
    }

    #[test]
    fn websocket_upgrades() {
        use WebSocketRefusal::*;
        assert_eq!(websocket_refusal(false, false), None);
        assert_eq!(websocket_refusal(true, false), Some(Budget));
        assert_eq!(websocket_refusal(false, true), Some(Tenants));
        assert_eq!(websocket_refusal(true, true), Some(Budget));
    }
}
