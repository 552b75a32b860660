//! The admin endpoint: `/healthz`, `/metrics` (Prometheus text), `/tasks`
//! (what the store holds, as JSON, for debugging) and `/budgets` (accounts:
//! limit, spent, reserved, left; and this replica's in-flight child budgets).

use std::sync::Arc;

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
        match path.as_str() {
            "/healthz" => reply(200, "text/plain", b"ok\n".to_vec()),
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
            _ => reply(
                404,
                "text/plain",
                b"not found: try /healthz, /metrics, /tasks or /budgets\n".to_vec(),
            ),
        }
    }
}
