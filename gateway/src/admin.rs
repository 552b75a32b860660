//! The admin endpoint: `/healthz` (the process is up), `/readyz` (every
//! proxy listener accepts connections), `/metrics` (Prometheus text),
//! `/tasks` (what the store holds, as JSON, for debugging), `/budgets`
//! (accounts: limit, spent, reserved, left; and this replica's in-flight
//! child budgets) and `POST /reload` (re-reads the config file, as SIGHUP
//! does; see [`crate::reload`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::json;

use crate::metrics;
use crate::store::TaskStore;

/// Serves the admin paths.
#[derive(Debug)]
pub struct Admin {
    pub store: Arc<dyn TaskStore>,
    pub budgets: Arc<crate::budget::Budgets>,
    /// Every proxy listener (`server.listen` and `server.tls.listen`), for
    /// `/readyz`.
    pub listeners: Vec<SocketAddr>,
    /// The bearer token every path but `/healthz` and `/readyz` requires
    /// (`server.admin_token_*`); `None`: none.
    pub token: Option<config::Secret>,
    /// Set once every listener accepted a connection: they stay bound until
    /// the drain, which closes the admin listener as well.
    pub ready: AtomicBool,
    /// What `POST /reload` runs; `None`: not offered (404).
    pub reload: Option<Arc<crate::reload::Reloader>>,
}

/// How long `/readyz` waits for one listener to accept.
const READY_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Where to connect to reach a listener: its own address, or loopback for
/// one bound to every interface.
fn reach(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

impl Admin {
    pub fn new(
        store: Arc<dyn TaskStore>,
        budgets: Arc<crate::budget::Budgets>,
        listeners: Vec<SocketAddr>,
        token: Option<config::Secret>,
    ) -> Admin {
        Admin {
            store,
            budgets,
            listeners,
            token,
            ready: AtomicBool::new(false),
            reload: None,
        }
    }

    /// Offers `POST /reload`, run by `reloader`.
    pub fn with_reload(mut self, reloader: Arc<crate::reload::Reloader>) -> Admin {
        self.reload = Some(reloader);
        self
    }

    /// `POST /reload`: 200 and what was applied (with the settings that
    /// need a restart), or 422 and every reason it was refused.
    async fn reload(&self, session: &ServerSession) -> Response<Vec<u8>> {
        let Some(reloader) = &self.reload else {
            return not_found();
        };
        if session.req_header().method != http::Method::POST {
            let mut r = reply(
                405,
                "text/plain",
                b"method not allowed: POST /reload\n".to_vec(),
            );
            r.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
            return r;
        }
        let outcome = reloader.reload(crate::reload::Trigger::Admin).await;
        let status = match outcome {
            crate::reload::Outcome::Applied { .. } => 200,
            crate::reload::Outcome::Refused { .. } => 422,
        };
        reply(
            status,
            "application/json",
            outcome.to_json().to_string().into_bytes(),
        )
    }

    /// Readiness for an orchestrator (a Kubernetes `readinessProbe`):
    /// pingora binds a service's listeners one after another (a TLS one
    /// after loading its certificate), and the admin listener is its own
    /// service, so the admin answering says nothing about the proxy yet.
    /// Each listener is tried with a connection of its own until all have
    /// accepted once; the answer names those that did not.
    async fn readiness(&self) -> Response<Vec<u8>> {
        if self.ready.load(Ordering::Relaxed) {
            return reply(200, "text/plain", b"ready\n".to_vec());
        }
        let waiting = not_accepting(&self.listeners).await;
        if waiting.is_empty() {
            self.ready.store(true, Ordering::Relaxed);
            return reply(200, "text/plain", b"ready\n".to_vec());
        }
        let waiting: Vec<String> = waiting.iter().map(SocketAddr::to_string).collect();
        reply(
            503,
            "text/plain",
            format!(
                "not ready: not accepting connections yet on {}\n",
                waiting.join(", ")
            )
            .into_bytes(),
        )
    }
}

/// The listeners that did not accept a connection within
/// [`READY_CONNECT_TIMEOUT`].
async fn not_accepting(listeners: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut waiting = Vec::new();
    for &addr in listeners {
        let accepted = tokio::time::timeout(
            READY_CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(reach(addr)),
        )
        .await;
        if !matches!(accepted, Ok(Ok(_))) {
            waiting.push(addr);
        }
    }
    waiting
}

/// Whether an `Authorization` value is `Bearer <token>` (the scheme in any
/// case), compared in constant time.
fn bearer_matches(given: Option<&[u8]>, token: &str) -> bool {
    let Some(given) = given else {
        return false;
    };
    let Some((scheme, value)) = given.split_at_checked(7) else {
        return false;
    };
    // Every byte is looked at whatever differs (the length is no secret).
    let token = token.as_bytes();
    let diff = value
        .iter()
        .zip(token)
        .fold(0u8, |acc, (a, b)| acc | std::hint::black_box(a ^ b));
    scheme.eq_ignore_ascii_case(b"bearer ") && value.len() == token.len() && diff == 0
}

fn not_found() -> Response<Vec<u8>> {
    reply(
        404,
        "text/plain",
        b"not found: try /healthz, /readyz, /metrics, /tasks, /budgets or POST /reload\n".to_vec(),
    )
}

fn reply(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .body(body)
        .unwrap_or_else(|_| Response::new(Vec::new()))
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        if !matches!(path.as_str(), "/healthz" | "/readyz") {
            if let Some(token) = &self.token {
                let given = session
                    .req_header()
                    .headers
                    .get(http::header::AUTHORIZATION);
                if !bearer_matches(given.map(|v| v.as_bytes()), token.expose()) {
                    let mut r = reply(
                        401,
                        "text/plain",
                        b"unauthorized: send Authorization: Bearer <server.admin_token>\n".to_vec(),
                    );
                    r.headers_mut().insert(
                        http::header::WWW_AUTHENTICATE,
                        http::HeaderValue::from_static("Bearer realm=\"a2a-gateway admin\""),
                    );
                    return r;
                }
            }
        }
        match path.as_str() {
            "/healthz" => reply(200, "text/plain", b"ok\n".to_vec()),
            "/readyz" => self.readiness().await,
            "/metrics" => reply(
                200,
                "text/plain; version=0.0.4",
                metrics::render().into_bytes(),
            ),
            "/budgets" => reply(
                200,
                "application/json",
                self.budgets.admin_view().await.to_string().into_bytes(),
            ),
            "/reload" => self.reload(session).await,
            "/tasks" => match self.store.list(1000).await {
                Ok(tasks) => {
                    let tasks: Vec<_> = tasks
                        .into_iter()
                        .map(|t| {
                            json!({
                                "route": &*t.key.route,
                                "tenant": &*t.key.tenant,
                                "id": &*t.key.task_id,
                                "contextId": t.context_id,
                                "state": t.state.map(|s| s.as_wire()),
                                "watchers": t.watchers,
                                "lease": t.lease.as_ref().map(|l| json!({
                                    "ttlMs": l.ttl_ms,
                                    "deadlineMs": l.deadline_ms,
                                    "holder": l.holder,
                                })),
                                "updatedMs": t.updated_ms,
                            })
                        })
                        .collect();
                    let leases = self.store.lease_count().await.ok();
                    let body =
                        json!({"store": self.store.kind(), "liveLeases": leases, "tasks": tasks});
                    reply(200, "application/json", body.to_string().into_bytes())
                }
                Err(e) => reply(
                    503,
                    "application/json",
                    json!({"error": e.to_string()}).to_string().into_bytes(),
                ),
            },
            _ => not_found(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener bound to every interface is reached on loopback; a port
    /// nothing listens on is named; an unbound port that starts listening
    /// is no longer named.
    #[tokio::test]
    async fn readiness_names_the_listeners_not_accepting() {
        let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let any_addr = SocketAddr::from(([0, 0, 0, 0], any.local_addr().unwrap().port()));
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free_addr = free.local_addr().unwrap();
        drop(free);
        let listeners = [any_addr, free_addr];
        assert_eq!(not_accepting(&listeners).await, vec![free_addr]);
        let now_bound = std::net::TcpListener::bind(free_addr).unwrap();
        assert_eq!(not_accepting(&listeners).await, Vec::<SocketAddr>::new());
        drop((any, now_bound));
    }

    #[test]
    fn bearer_tokens_compared_whole() {
        let t = "0123456789abcdef";
        assert!(bearer_matches(Some(b"Bearer 0123456789abcdef"), t));
        assert!(bearer_matches(Some(b"bearer 0123456789abcdef"), t));
        for bad in [
            &b"Bearer 0123456789abcde"[..],
            b"Bearer 0123456789abcdefg",
            b"Basic 0123456789abcdef",
            b"Bearer",
            b"",
        ] {
            assert!(!bearer_matches(Some(bad), t));
        }
        assert!(!bearer_matches(None, t));
    }

    #[test]
    fn unspecified_addresses_are_reached_on_loopback() {
        let v6: SocketAddr = "[::]:81".parse().unwrap();
        assert_eq!(reach(v6), "[::1]:81".parse().unwrap());
        let v4: SocketAddr = "0.0.0.0:80".parse().unwrap();
        assert_eq!(reach(v4), "127.0.0.1:80".parse().unwrap());
        let own: SocketAddr = "10.1.2.3:80".parse().unwrap();
        assert_eq!(reach(own), own);
    }
}
