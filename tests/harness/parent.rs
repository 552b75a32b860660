//! A real parent agent process: it delegates one leased child with the
//! published `a2a-protocol-client` 0.15 `Delegation::start_leased`, so a test
//! can SIGKILL it and watch what becomes of the child.
//!
//! There is no separate binary: the integration test binary re-executes
//! itself, running only the `#[ignore]`d test [`parent_process_entry`] with
//! the environment below. Outside that (no `A2AGW_PARENT_URL`) the entry does
//! nothing, so `--ignored` runs stay harmless.
//!
//! | env | meaning |
//! |---|---|
//! | `A2AGW_PARENT_URL` | base URL of the agent (gateway or worker) |
//! | `A2AGW_PARENT_TTL_MS` | lease time to live, ms |
//! | `A2AGW_PARENT_TEXT` | the child message's text (e.g. `work:30000`) |
//! | `A2AGW_PARENT_TENANT` | optional tenant for the send (and so renewals) |
//! | `A2AGW_PARENT_NO_CARD` | set: build the client from the URL (JSON-RPC) instead of the card |
//! | `A2AGW_PARENT_GRPC` | set: the URL is a gRPC (h2c) address; the client is `ClientBuilder::new(url).with_protocol_binding("GRPC").build_grpc()`, no card fetched |
//!
//! The process prints `CHILD <task_id>` once the delegation knows the child's
//! id, then `OUTCOME <Outcome as Debug>` when the delegation ends, each on a
//! line of its own (libtest may put its `test … ...` prefix before the first,
//! so readers look for the marker anywhere in a line).
//!
//! # What the child process sends (a2a-protocol-client 0.15.0, read and run)
//!
//! * `GET {url}/.well-known/agent-card.json` with `A2A-Version: 1.0`; the
//!   client is then built with `ClientBuilder::from_card_preferring(card,
//!   ["JSONRPC"])`, i.e. to the card's JSON-RPC interface URL (the gateway
//!   rewrites it to itself) and the interface's tenant, if any.
//! * Start: one `POST` to that URL, `Content-Type: application/json`,
//!   `A2A-Version: 1.0`, `Accept: text/event-stream`, JSON-RPC method
//!   `SendStreamingMessage`; params `{"message":{…, "parts":[{"text":T}],
//!   "metadata":{"a2a-rust.com/lease":{"ttlMs":N}},
//!   "extensions":["https://a2a-rust.com/extensions/lease/v1"]},
//!   "configuration":{"acceptedOutputModes":["text/plain","application/json"]}}`
//!   (+ `tenant`). No `A2A-Extensions` header on the start. When the card
//!   declares the idempotency extension the message metadata also gets a
//!   64-hex-digit `a2a-rust.com/idempotency` key (`Delegation::start`).
//! * Renewals (`delegation/renewal.rs`): a task spawned by `start_leased`
//!   sleeps ttl/3, then (once an event named the child) sends
//!   `A2aClient::renew_lease` = JSON-RPC `GetTask` with params
//!   `{"id":"<task id>"}` (+ `"tenant"` when set; no `historyLength`), headers
//!   `A2A-Version: 1.0`, `Accept: application/json` and
//!   `a2a-extensions: https://a2a-rust.com/extensions/lease/v1` (lowercase
//!   name; the URI is appended with `", "` to any value an interceptor or
//!   `with_extensions` already set). It repeats every ttl/3 (sleep, then
//!   call, so the first renewal is ttl/3 after start) until a renewal returns
//!   a terminal task; errors are ignored; the task is aborted when the
//!   handle settles or is dropped.
//! * The stream ending unsettled makes `wait` send a best-effort `CancelTask`
//!   (`Outcome::Lost`); a SIGKILL sends nothing at all.
//!
//! With `A2AGW_PARENT_GRPC` ([`ParentProcess::spawn_grpc`]) the same calls go
//! over the A2A gRPC binding (`lf.a2a.v1.A2AService`, h2c with prior
//! knowledge, one HTTP/2 connection): the start is `SendStreamingMessage`
//! with the grant in `Message.metadata` (a `google.protobuf.Struct`) and the
//! URI in `Message.extensions`; each renewal is a unary `GetTask` whose
//! metadata holds `a2a-extensions: https://a2a-rust.com/extensions/lease/v1`
//! and `a2a-version: 1.0`.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const ENV_URL: &str = "A2AGW_PARENT_URL";
const ENV_TTL: &str = "A2AGW_PARENT_TTL_MS";
const ENV_TEXT: &str = "A2AGW_PARENT_TEXT";
const ENV_TENANT: &str = "A2AGW_PARENT_TENANT";
const ENV_NO_CARD: &str = "A2AGW_PARENT_NO_CARD";
/// Set: `A2AGW_PARENT_URL` is a `ws://` URL; the client speaks a2a-rust's
/// WebSocket binding there, without asking for any extension on the upgrade.
const ENV_WS: &str = "A2AGW_PARENT_WS";
/// Set: `A2AGW_PARENT_URL` is a gRPC (h2c) address; the client is built with
/// `build_grpc` (no agent card is fetched).
const ENV_GRPC: &str = "A2AGW_PARENT_GRPC";

/// Which binding the parent process speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Binding {
    /// JSON-RPC, to the interface the agent card names.
    Card,
    /// a2a-rust's WebSocket binding.
    Ws,
    /// The A2A gRPC binding.
    Grpc,
}

/// The test path of [`parent_process_entry`] inside the integration binary.
const ENTRY: &str = "harness::parent::parent_process_entry";

/// The parent process's body. Ignored, and a no-op without `A2AGW_PARENT_URL`.
#[tokio::test]
#[ignore = "run only as a re-executed parent process (harness::parent)"]
async fn parent_process_entry() {
    use std::io::Write;

    use a2a_protocol_client::ClientBuilder;

    let Ok(url) = std::env::var(ENV_URL) else {
        return;
    };
    let ttl_ms: u64 = std::env::var(ENV_TTL)
        .expect("A2AGW_PARENT_TTL_MS")
        .parse()
        .expect("A2AGW_PARENT_TTL_MS is a number of ms");
    let text = std::env::var(ENV_TEXT).expect("A2AGW_PARENT_TEXT");
    let tenant = std::env::var(ENV_TENANT).ok().filter(|t| !t.is_empty());

    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        // A leading newline so libtest's `test … ... ` prefix never shares it.
        let _ = writeln!(out, "\n{line}");
        let _ = out.flush();
    };

    if std::env::var_os(ENV_GRPC).is_some() {
        let builder = ClientBuilder::new(url.clone()).with_protocol_binding("GRPC");
        eprintln!("parent: gRPC {builder:?}");
        let client = builder
            .build_grpc()
            .await
            .unwrap_or_else(|e| panic!("gRPC client for {url}: {e:?}"));
        delegate(Arc::new(client), text, tenant, ttl_ms, say).await;
        return;
    }
    let builder = if std::env::var_os(ENV_WS).is_some() {
        use a2a_protocol_client::transport::websocket::{
            WebSocketTransport, WebSocketTransportConfig,
        };
        let transport = WebSocketTransport::connect_with_config(
            url.clone(),
            WebSocketTransportConfig::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("WebSocket connect to {url}: {e:?}"));
        ClientBuilder::new(url.clone()).with_custom_transport(transport)
    } else if std::env::var_os(ENV_NO_CARD).is_some() {
        ClientBuilder::new(url.clone()).with_protocol_binding("JSONRPC")
    } else {
        let card = a2a_protocol_client::resolve_agent_card(&url)
            .await
            .unwrap_or_else(|e| panic!("agent card of {url}: {e:?}"));
        ClientBuilder::from_card_preferring(&card, &["JSONRPC".to_owned()])
            .unwrap_or_else(|e| panic!("client builder from the card of {url}: {e:?}"))
            .with_protocol_binding("JSONRPC")
    };
    eprintln!("parent: {builder:?}");
    let client = Arc::new(builder.build().expect("build the A2A client"));
    delegate(client, text, tenant, ttl_ms, say).await;
}

/// The parent's delegation: `Delegation::start_leased` of one child over
/// `client`, printing `CHILD <id>` and `OUTCOME <outcome>` through `say`.
async fn delegate(
    client: Arc<a2a_protocol_client::A2aClient>,
    text: String,
    tenant: Option<String>,
    ttl_ms: u64,
    say: impl Fn(String),
) {
    use a2a_protocol_client::delegation::Delegation;
    use a2a_protocol_types::message::{Message, Part};
    use a2a_protocol_types::params::MessageSendParams;

    let id = format!(
        "parent-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let mut params = MessageSendParams::new(Message::user(id, vec![Part::text(text)]));
    params.tenant = tenant;

    let mut delegation =
        match Delegation::start_leased(client, params, Duration::from_millis(ttl_ms)).await {
            Ok(d) => d,
            Err(e) => {
                say(format!("START_ERROR {e:?}"));
                panic!("Delegation::start_leased failed: {e:?}");
            }
        };

    // Read events until one names the child (the handle records its id and
    // state, and hands the id to the renewal task).
    while delegation.task_id().is_none() && !delegation.is_settled() {
        match delegation.next_event().await {
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
    if let Some(task_id) = delegation.task_id() {
        say(format!("CHILD {task_id}"));
    }

    let done = delegation.wait(std::future::pending()).await;
    say(format!("OUTCOME {:?}", done.outcome));
}

/// What a parent process has printed, line by line.
#[derive(Debug, Default)]
struct Output {
    stdout: Vec<String>,
    stderr: Vec<String>,
}

/// A running parent process (`Delegation::start_leased` in a child process
/// of this test binary). Killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct ParentProcess {
    child: Child,
    /// The child task's id, as the delegation learned it.
    pub task_id: String,
    lines: mpsc::UnboundedReceiver<String>,
    output: Arc<Mutex<Output>>,
}

impl ParentProcess {
    /// Spawns `current_exe() --exact harness::parent::parent_process_entry
    /// --ignored --nocapture --test-threads 1` with the env above; waits
    /// (≤15 s, scaled) for the `CHILD <id>` line; panics with its output if
    /// not.
    pub async fn spawn(gateway_or_worker_url: &str, ttl: Duration, text: &str) -> ParentProcess {
        Self::spawn_with(gateway_or_worker_url, ttl, text, None).await
    }

    /// [`spawn`](Self::spawn), sending the child under `tenant` (the
    /// renewals then carry it too).
    pub async fn spawn_with(
        url: &str,
        ttl: Duration,
        text: &str,
        tenant: Option<&str>,
    ) -> ParentProcess {
        Self::spawn_inner(url, ttl, text, tenant, Binding::Card).await
    }

    /// A parent speaking the WebSocket binding to `ws_url` (no extensions
    /// requested on the upgrade, as a plain client would).
    pub async fn spawn_ws(ws_url: &str, ttl: Duration, text: &str) -> ParentProcess {
        Self::spawn_inner(ws_url, ttl, text, None, Binding::Ws).await
    }

    /// A parent speaking the A2A gRPC binding to `grpc_url` (a gateway's
    /// plain listener or a worker's `grpc_url`, h2c): its client is
    /// `ClientBuilder::new(url).with_protocol_binding("GRPC").build_grpc()`,
    /// built without a card; the child is sent under `tenant` (the renewals
    /// then carry it too).
    pub async fn spawn_grpc(
        grpc_url: &str,
        ttl: Duration,
        text: &str,
        tenant: Option<&str>,
    ) -> ParentProcess {
        Self::spawn_inner(grpc_url, ttl, text, tenant, Binding::Grpc).await
    }

    async fn spawn_inner(
        url: &str,
        ttl: Duration,
        text: &str,
        tenant: Option<&str>,
        binding: Binding,
    ) -> ParentProcess {
        let exe = std::env::current_exe().expect("current test binary");
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            ENTRY,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ENV_URL, url)
        .env(ENV_TTL, ttl.as_millis().to_string())
        .env(ENV_TEXT, text)
        .env_remove(ENV_NO_CARD)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        match tenant {
            Some(t) => cmd.env(ENV_TENANT, t),
            None => cmd.env_remove(ENV_TENANT),
        };
        cmd.env_remove(ENV_WS).env_remove(ENV_GRPC);
        match binding {
            Binding::Card => {}
            Binding::Ws => {
                cmd.env(ENV_WS, "1");
            }
            Binding::Grpc => {
                cmd.env(ENV_GRPC, "1");
            }
        }
        let mut child = cmd.spawn().expect("spawn the parent process");

        let output = Arc::new(Mutex::new(Output::default()));
        let (tx, lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().expect("piped stdout");
        let out = Arc::clone(&output);
        tokio::spawn(async move {
            let mut r = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = r.next_line().await {
                out.lock().unwrap().stdout.push(line.clone());
                let _ = tx.send(line);
            }
        });
        let stderr = child.stderr.take().expect("piped stderr");
        let out = Arc::clone(&output);
        tokio::spawn(async move {
            let mut r = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = r.next_line().await {
                out.lock().unwrap().stderr.push(line);
            }
        });

        let mut parent = ParentProcess {
            child,
            task_id: String::new(),
            lines,
            output,
        };
        let within = super::scaled_secs(15);
        match parent.next_marked("CHILD ", within).await {
            Some(id) => parent.task_id = id.trim().to_owned(),
            None => panic!(
                "the parent process printed no CHILD line within {within:?}\n{}",
                parent.dump()
            ),
        }
        parent
    }

    /// SIGKILL, then reap. The process gets no chance to send anything.
    pub async fn sigkill(&mut self) {
        // `Child::kill` sends SIGKILL on Unix and waits for the exit.
        let _ = self.child.kill().await;
    }

    /// The delegation's outcome: what follows `OUTCOME ` on its line (the
    /// `Debug` of `a2a_protocol_client::delegation::Outcome`, e.g.
    /// `Completed(TaskStatus { … })`). Then reaps the process. Panics with
    /// the process's output if no such line comes `within`.
    pub async fn wait_outcome(&mut self, within: Duration) -> String {
        let Some(outcome) = self.next_marked("OUTCOME ", within).await else {
            panic!(
                "the parent process printed no OUTCOME line within {within:?}\n{}",
                self.dump()
            );
        };
        if tokio::time::timeout(super::scaled_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        outcome
    }

    /// Everything the process has printed so far.
    pub fn dump(&self) -> String {
        let out = self.output.lock().unwrap();
        format!(
            "--- parent stdout ---\n{}\n--- parent stderr ---\n{}",
            out.stdout.join("\n"),
            out.stderr.join("\n")
        )
    }

    /// The rest of the next stdout line containing `marker`, if one comes
    /// within `within` (and before stdout closes).
    async fn next_marked(&mut self, marker: &str, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    if let Some(at) = line.find(marker) {
                        return Some(line[at + marker.len()..].to_owned());
                    }
                }
                Ok(None) | Err(_) => return None,
            }
        }
    }
}
