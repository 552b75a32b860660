//! One interface over the real workers, so each scenario runs on both.

use std::time::Duration;

use serde_json::{json, Value};

use super::python_worker::PythonWorker;
use super::rust_worker::{RustWorker, RustWorkerOptions};
use super::stream::SseStream;

/// Which real worker a scenario runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An `a2a-protocol-server` 0.15 agent without a lease store.
    Rust,
    /// An agent on the official Python `a2a-sdk` 1.3.0.
    Python,
}

/// Which A2A binding the caller uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    JsonRpc,
    Rest,
}

#[derive(Debug)]
pub enum Worker {
    Rust(RustWorker),
    Python(PythonWorker),
}

impl Worker {
    pub async fn start(kind: Kind) -> Worker {
        match kind {
            Kind::Rust => Worker::Rust(RustWorker::start(RustWorkerOptions::default()).await),
            // Tenant-scoped, so a cancel sent in the wrong tenant would miss.
            Kind::Python => {
                Worker::Python(PythonWorker::start_with_args(&["--tenant-scoped"]).await)
            }
        }
    }

    /// As [`Worker::start`], also serving the A2A gRPC binding on a port of
    /// its own ([`Worker::grpc_url`]; `RustWorker::start_with_grpc`,
    /// `PythonWorker::start_with_grpc`), sharing the HTTP side's tasks.
    pub async fn start_with_grpc(kind: Kind) -> Worker {
        match kind {
            Kind::Rust => {
                Worker::Rust(RustWorker::start_with_grpc(RustWorkerOptions::default()).await)
            }
            Kind::Python => {
                Worker::Python(PythonWorker::start_with_grpc(&["--tenant-scoped"]).await)
            }
        }
    }

    /// The gRPC binding's `http://127.0.0.1:PORT` (for
    /// `crate::harness::grpc`); panics unless started with
    /// [`Worker::start_with_grpc`].
    pub fn grpc_url(&self) -> String {
        match self {
            Worker::Rust(w) => w.grpc_url(),
            Worker::Python(w) => w.grpc_url(),
        }
    }

    pub fn url(&self) -> String {
        match self {
            Worker::Rust(w) => w.url(),
            Worker::Python(w) => w.url(),
        }
    }

    /// The task's state, read from the worker itself.
    pub async fn state(&self, tenant: Option<&str>, id: &str) -> Option<String> {
        super::http::get_task_state(&self.url(), tenant, id).await
    }

    /// Tasks the Rust worker created so far (Rust workers only).
    pub fn tasks_started_now(&self) -> usize {
        match self {
            Worker::Rust(w) => w.tasks_started(),
            Worker::Python(_) => panic!("use stats() on the Python worker"),
        }
    }

    /// Executor runs that created a task (the Rust worker's counter, the
    /// Python worker's `/_test/stats`).
    pub async fn tasks_started(&self) -> u64 {
        match self {
            Worker::Rust(w) => w.tasks_started() as u64,
            Worker::Python(w) => w.stats().await["tasks_started"].as_u64().unwrap_or(0),
        }
    }

    /// How many CancelTask calls reached the worker's cancel path.
    pub async fn cancels(&self) -> u64 {
        match self {
            Worker::Rust(w) => w.cancels() as u64,
            Worker::Python(w) => w.stats().await["cancels"].as_u64().unwrap_or(0),
        }
    }

    /// Polls the worker until the task is in `want`; the time it took.
    pub async fn wait_state(
        &self,
        tenant: Option<&str>,
        id: &str,
        want: &str,
        within: Duration,
    ) -> Result<Duration, Option<String>> {
        super::http::wait_for_state(&self.url(), tenant, id, want, within).await
    }
}

/// A user message with a fresh id.
pub fn message(text: &str) -> Value {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    json!({
        "messageId": format!("msg-{}-{n}", std::process::id()),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    })
}

/// The StreamResponse inside an SSE event (JSON-RPC wraps it in `result`).
pub fn stream_response(ev: &Value) -> &Value {
    ev.get("result").unwrap_or(ev)
}

/// The task id an event names, if any.
pub fn task_id_of(ev: &Value) -> Option<String> {
    let r = stream_response(ev);
    r["task"]["id"]
        .as_str()
        .or_else(|| r["statusUpdate"]["taskId"].as_str())
        .or_else(|| r["artifactUpdate"]["taskId"].as_str())
        .map(str::to_string)
}

/// The state an event reports, if any.
pub fn state_of(ev: &Value) -> Option<String> {
    let r = stream_response(ev);
    r["task"]["status"]["state"]
        .as_str()
        .or_else(|| r["statusUpdate"]["status"]["state"].as_str())
        .map(str::to_string)
}

/// Opens `SendStreamingMessage` at `base` (a gateway or a worker URL) and
/// reads events until one names the task. Returns the open stream and the id.
pub async fn send_stream(
    base: &str,
    bind: Bind,
    tenant: Option<&str>,
    text: &str,
) -> (SseStream, String) {
    let msg = message(text);
    let mut stream = match bind {
        Bind::JsonRpc => {
            let mut params = json!({ "message": msg });
            if let Some(t) = tenant {
                params["tenant"] = json!(t);
            }
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": params});
            SseStream::open(base, "/", &[], &body).await
        }
        Bind::Rest => {
            let path = match tenant {
                Some(t) => format!("/{t}/message:stream"),
                None => "/message:stream".to_string(),
            };
            SseStream::open(base, &path, &[], &json!({ "message": msg })).await
        }
    };
    assert_eq!(stream.status, 200, "stream refused");
    assert!(
        stream.content_type().starts_with("text/event-stream"),
        "not SSE: {}",
        stream.content_type()
    );
    for _ in 0..10 {
        let ev = stream
            .next(super::scaled_secs(10))
            .await
            .expect("an event naming the task");
        if let Some(id) = task_id_of(&ev) {
            return (stream, id);
        }
    }
    panic!("no event named the task");
}

/// Opens `SubscribeToTask` for `id` at `base`.
pub async fn subscribe(base: &str, bind: Bind, tenant: Option<&str>, id: &str) -> SseStream {
    match bind {
        Bind::JsonRpc => {
            let mut params = json!({ "id": id });
            if let Some(t) = tenant {
                params["tenant"] = json!(t);
            }
            let body =
                json!({"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask", "params": params});
            SseStream::open(base, "/", &[], &body).await
        }
        Bind::Rest => {
            let path = match tenant {
                Some(t) => format!("/{t}/tasks/{id}:subscribe"),
                None => format!("/tasks/{id}:subscribe"),
            };
            SseStream::open(base, &path, &[], &json!({})).await
        }
    }
}

/// After the gateway replica that renewed the leases of `ids` died: each
/// child is cancelled by `survivor` within `ttl` + 1 s (scaled), exactly
/// once (the worker's own count), and `survivor` counts each lapse.
pub async fn survivor_cancels_each_once(
    worker: &Worker,
    ids: &[String],
    ttl: Duration,
    survivor: &super::gateway::Gateway,
) {
    for id in ids {
        worker
            .wait_state(
                None,
                id,
                "TASK_STATE_CANCELED",
                ttl + super::scaled_ms(1000),
            )
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "{id} not canceled by the survivor ({s:?}); its log:\n{}",
                    survivor.log_text()
                )
            });
    }
    tokio::time::sleep(super::scaled_ms(500)).await;
    assert_eq!(
        worker.cancels().await,
        ids.len() as u64,
        "each child canceled exactly once"
    );
    assert_eq!(
        survivor.counter("a2agw_leases_lapsed_total", &[]).await,
        ids.len() as f64
    );
}
