//! A real worker agent on the official Python SDK (`a2a-sdk` 1.3.0):
//! `tests/workers/python_agent.py`, run from a venv that
//! `tests/workers/setup-venv.sh` builds at `<workspace>/target/pyvenv`.
//!
//! The agent's behaviour is chosen by the first text part of the message:
//! `work:<ms>`, `quick`, `ask`, `spend:<ms>:<meter>=<n>` (see the script's
//! doc). JSON-RPC is at `POST /`, the REST routes at `/…` and `/{tenant}/…`,
//! and `GET /_test/stats` reports what the executor saw.
//!
//! [`PythonWorker::start_with_grpc`] also serves the A2A gRPC binding
//! (`lf.a2a.v1.A2AService`, plaintext HTTP/2 with prior knowledge) on a
//! second port, [`PythonWorker::grpc_url`]: the SDK's `GrpcHandler` over the
//! same handler, so tasks, tenants and `/_test/stats` are shared with the
//! HTTP side (`extensions_seen` also gets every `a2a-extensions` metadata
//! value). Unlike a2a-rust, the SDK does not require `a2a-version` metadata.
//! A caller's RST_STREAM or dropped connection does not stop the task (as
//! an SSE disconnect does not): see `tests/grpc_harness.rs`.
//!
//! [`PythonWorker::start_h2c`] runs the same agent under Hypercorn instead
//! of uvicorn (`--server hypercorn`): its one port, [`PythonWorker::url`],
//! speaks HTTP/1.1 and HTTP/2 with prior knowledge (h2c), and neither
//! Hypercorn nor the SDK's routes check `Content-Type`, so a REST
//! `POST /message:send` or a JSON-RPC `POST /` typed `application/grpc`
//! (or `application/grpc+json`) with a JSON body is run like any send
//! (`tests/security/h2c_workers.rs`). It also records every request
//! ([`PythonWorker::requests_seen`]: HTTP version, method, path, content
//! type) and every new task's budget grant ([`PythonWorker::budgets_seen`]).
//! uvicorn, under every other constructor, speaks no HTTP/2 at all.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::harness::gateway::free_port;
use crate::harness::http;

/// How long the agent may take to answer its card URL after spawning.
fn start_timeout() -> Duration {
    super::scaled_secs(30)
}

/// A running Python agent on a free loopback port, killed when dropped.
#[derive(Debug)]
pub struct PythonWorker {
    child: Child,
    port: u16,
    grpc_port: Option<u16>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

/// `<workspace>`: the parent of the gateway package's manifest dir.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace above the gateway package")
        .to_path_buf()
}

/// The venv's path, built once per test process (the script itself is
/// idempotent and locks against other processes).
fn ensure_venv() -> Result<PathBuf, String> {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    VENV.get_or_init(|| {
        let ws = workspace();
        let venv = ws.join("target").join("pyvenv");
        let script = ws.join("tests").join("workers").join("setup-venv.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(&venv)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}):\n{}{}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(venv)
    })
    .clone()
}

/// The venv's Python interpreter (building the venv on first use), for
/// tests that start a Python process of their own (tests/demo.rs).
pub fn python() -> PathBuf {
    ensure_venv()
        .unwrap_or_else(|e| panic!("the Python venv: {e}"))
        .join("bin")
        .join("python")
}

/// The Python agent's script.
pub fn agent_script() -> PathBuf {
    workspace()
        .join("tests")
        .join("workers")
        .join("python_agent.py")
}

/// Copies a child's pipe into `sink` until it closes (so the pipe never fills).
fn drain(mut pipe: impl AsyncRead + Unpin + Send + 'static, sink: Arc<Mutex<Vec<u8>>>) {
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => sink.lock().unwrap().extend_from_slice(&buf[..n]),
            }
        }
    });
}

impl PythonWorker {
    /// Starts the agent with the SDK's defaults (tasks not scoped by tenant).
    pub async fn start() -> PythonWorker {
        Self::start_with_args(&[]).await
    }

    /// Starts the agent with extra command-line flags:
    /// `--tenant-scoped` keys stored tasks by tenant (a GetTask/CancelTask
    /// naming another tenant then gets -32001), and
    /// `--declare-extension URI` (repeatable) lists URI in the card
    /// (`required: false`).
    pub async fn start_with_args(args: &[&str]) -> PythonWorker {
        Self::start_fresh(args, false).await
    }

    /// As [`PythonWorker::start_with_args`], also serving the gRPC binding
    /// on a port of its own (`--grpc-port`, [`PythonWorker::grpc_url`]).
    pub async fn start_with_grpc(args: &[&str]) -> PythonWorker {
        Self::start_fresh(args, true).await
    }

    /// As [`PythonWorker::start_with_args`], served by Hypercorn
    /// (`--server hypercorn --record-requests`): HTTP/1.1 and h2c (prior
    /// knowledge) on [`PythonWorker::url`], no content type checked, every
    /// request and budget grant recorded (see the module doc). `args` as
    /// [`PythonWorker::start_with_args`] takes them (`--grpc-port` aside).
    pub async fn start_h2c(args: &[&str]) -> PythonWorker {
        let mut all = vec!["--server", "hypercorn", "--record-requests"];
        all.extend_from_slice(args);
        Self::start_fresh(&all, false).await
    }

    /// Starts the agent on fresh free ports (a second one for gRPC).
    async fn start_fresh(args: &[&str], grpc: bool) -> PythonWorker {
        let venv = tokio::task::spawn_blocking(ensure_venv)
            .await
            .expect("venv setup thread")
            .unwrap_or_else(|e| panic!("python venv setup failed: {e}"));
        let script = agent_script();

        // A free port can be taken by someone else before the agent binds
        // it: try a few.
        let mut last_err = String::new();
        for _ in 0..3 {
            let grpc_port = grpc.then(free_port);
            match Self::spawn_on(&venv, &script, free_port(), grpc_port, args).await {
                Ok(w) => return w,
                Err(e) => last_err = e,
            }
            if !last_err.contains("address already in use") {
                break;
            }
        }
        panic!("{last_err}");
    }

    /// Starts the agent on `port` (one that a killed agent held: the
    /// address may stay in use for a moment, so it retries for up to 10 s,
    /// scaled), with `args` as [`PythonWorker::start_with_args`] takes them.
    pub async fn start_on_port(port: u16, args: &[&str]) -> PythonWorker {
        let venv = tokio::task::spawn_blocking(ensure_venv)
            .await
            .expect("venv setup thread")
            .unwrap_or_else(|e| panic!("python venv setup failed: {e}"));
        let script = agent_script();
        let deadline = tokio::time::Instant::now() + super::scaled_secs(10);
        loop {
            match Self::spawn_on(&venv, &script, port, None, args).await {
                Ok(w) => return w,
                Err(e)
                    if e.contains("address already in use")
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// One attempt to start the agent on `port` (and gRPC on `grpc_port`):
    /// the agent once it answers, or why it exited first (panics when it
    /// neither answers nor exits). The agent binds gRPC before HTTP, so a
    /// card answering means both listen.
    async fn spawn_on(
        venv: &Path,
        script: &Path,
        port: u16,
        grpc_port: Option<u16>,
        args: &[&str],
    ) -> Result<PythonWorker, String> {
        let mut cmd = Command::new(venv.join("bin").join("python"));
        cmd.arg(script).arg("--port").arg(port.to_string());
        if let Some(g) = grpc_port {
            cmd.arg("--grpc-port").arg(g.to_string());
        }
        let mut child = cmd
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", script.display()));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        drain(child.stdout.take().unwrap(), stdout.clone());
        drain(child.stderr.take().unwrap(), stderr.clone());

        let url = format!("http://127.0.0.1:{port}");
        let started = tokio::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("poll agent") {
                // Let the drain tasks catch the last words.
                tokio::time::sleep(super::scaled_ms(100)).await;
                return Err(format!(
                    "python agent exited ({status}) before it answered; stderr:\n{}",
                    String::from_utf8_lossy(&stderr.lock().unwrap())
                ));
            }
            if card_answers(&url).await {
                return Ok(PythonWorker {
                    child,
                    port,
                    grpc_port,
                    stderr,
                });
            }
            if started.elapsed() > start_timeout() {
                let _ = child.start_kill();
                panic!(
                    "python agent did not answer {url}/.well-known/agent-card.json \
                     within {:?}; stdout:\n{}\nstderr:\n{}",
                    start_timeout(),
                    String::from_utf8_lossy(&stdout.lock().unwrap()),
                    String::from_utf8_lossy(&stderr.lock().unwrap())
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://127.0.0.1:PORT`: JSON-RPC at `/`, REST under it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:GRPC_PORT`, the gRPC binding's address (for
    /// `crate::harness::grpc`). Panics unless started with
    /// [`PythonWorker::start_with_grpc`].
    pub fn grpc_url(&self) -> String {
        let port = self
            .grpc_port
            .expect("python worker started without gRPC (use start_with_grpc)");
        format!("http://127.0.0.1:{port}")
    }

    /// What the agent wrote on stderr so far (for diagnostics).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// The task's state read straight from the agent (JSON-RPC GetTask);
    /// `None` when the agent does not know it.
    pub async fn state(&self, tenant: Option<&str>, id: &str) -> Option<String> {
        http::get_task_state(&self.url(), tenant, id).await
    }

    /// `GET /_test/stats`: `{"tasks_started": n, "turns": n, "cancels": n,
    /// "extensions_seen": [<A2A-Extensions header values, in arrival order>]}`.
    /// `tasks_started` counts new tasks (`task_ids` their ids, in the
    /// order they started), `turns` every executor run,
    /// `cancels` the executor's `cancel()` calls.
    pub async fn stats(&self) -> Value {
        let resp = http::request("GET", &self.url(), "/_test/stats", &[], b"").await;
        assert_eq!(resp.status, 200, "stats: {}", resp.text());
        resp.json()
    }

    /// `requests_seen` of [`PythonWorker::stats`]: every HTTP request the
    /// agent got (but `/_test/stats`), in arrival order. Empty unless
    /// started with [`PythonWorker::start_h2c`] (`--record-requests`).
    pub async fn requests_seen(&self) -> Vec<SeenRequest> {
        let seen = self.stats().await["requests_seen"].clone();
        serde_json::from_value(seen).expect("requests_seen")
    }

    /// `budgets_seen` of [`PythonWorker::stats`]: the budget grant
    /// (`metadata["a2a-rust.com/budget"]`) of every new task's message that
    /// had one, in order, as the worker read it (protobuf `Struct`: numbers
    /// are floats, `1000000.0`). Empty unless started with
    /// [`PythonWorker::start_h2c`] (`--record-requests`).
    pub async fn budgets_seen(&self) -> Vec<Value> {
        let seen = self.stats().await["budgets_seen"].clone();
        serde_json::from_value(seen).expect("budgets_seen")
    }

    /// Kills the agent now (SIGKILL) and waits for it.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// One request as the agent's ASGI app saw it (`requests_seen`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct SeenRequest {
    /// The ASGI `http_version`: `"1.1"`, `"2"`.
    pub http_version: String,
    pub method: String,
    pub path: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The `traceparent` and `tracestate` headers (lines joined), if any.
    #[serde(default)]
    pub traceparent: Option<String>,
    #[serde(default)]
    pub tracestate: Option<String>,
}

/// Whether `GET /.well-known/agent-card.json` answers 200. Connects first,
/// since `http::request` panics on a refused connection.
async fn card_answers(url: &str) -> bool {
    let (authority, _) = http::split_url(url);
    if TcpStream::connect(&authority).await.is_err() {
        return false;
    }
    let probe = http::request("GET", url, "/.well-known/agent-card.json", &[], b"");
    matches!(
        tokio::time::timeout(super::scaled_secs(5), probe).await,
        Ok(resp) if resp.status == 200
    )
}

/// The SSE reader the Python self-tests use is the shared one.
pub use super::stream::SseStream;
