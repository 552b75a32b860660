//! A real worker agent on the official Python SDK (`a2a-sdk` 1.3.0):
//! `tests/workers/python_agent.py`, run from a venv that
//! `tests/workers/setup-venv.sh` builds at `<workspace>/target/pyvenv`.
//!
//! The agent's behaviour is chosen by the first text part of the message:
//! `work:<ms>`, `quick`, `ask`, `spend:<ms>:<meter>=<n>` (see the script's
//! doc). JSON-RPC is at `POST /`, the REST routes at `/…` and `/{tenant}/…`,
//! and `GET /_test/stats` reports what the executor saw.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::harness::http;

/// How long the agent may take to answer its card URL after spawning.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running Python agent on a free loopback port, killed when dropped.
#[derive(Debug)]
pub struct PythonWorker {
    child: Child,
    port: u16,
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
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
        let venv = tokio::task::spawn_blocking(ensure_venv)
            .await
            .expect("venv setup thread")
            .unwrap_or_else(|e| panic!("python venv setup failed: {e}"));
        let script = workspace()
            .join("tests")
            .join("workers")
            .join("python_agent.py");

        // A free port can be taken by someone else before the agent binds
        // it: try a few.
        let mut last_err = String::new();
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(venv.join("bin").join("python"))
                .arg(&script)
                .arg("--port")
                .arg(port.to_string())
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
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    last_err = format!(
                        "python agent exited ({status}) before it answered; stderr:\n{}",
                        String::from_utf8_lossy(&stderr.lock().unwrap())
                    );
                    break;
                }
                if card_answers(&url).await {
                    return PythonWorker {
                        child,
                        port,
                        stderr,
                    };
                }
                if started.elapsed() > START_TIMEOUT {
                    let _ = child.start_kill();
                    panic!(
                        "python agent did not answer {url}/.well-known/agent-card.json \
                         within {START_TIMEOUT:?}; stdout:\n{}\nstderr:\n{}",
                        String::from_utf8_lossy(&stdout.lock().unwrap()),
                        String::from_utf8_lossy(&stderr.lock().unwrap())
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !last_err.contains("address already in use") {
                break;
            }
        }
        panic!("{last_err}");
    }

    /// `http://127.0.0.1:PORT`: JSON-RPC at `/`, REST under it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
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
    /// `tasks_started` counts new tasks, `turns` every executor run,
    /// `cancels` the executor's `cancel()` calls.
    pub async fn stats(&self) -> Value {
        let resp = http::request("GET", &self.url(), "/_test/stats", &[], b"").await;
        assert_eq!(resp.status, 200, "stats: {}", resp.text());
        resp.json()
    }

    /// Kills the agent now (SIGKILL) and waits for it.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
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
        tokio::time::timeout(Duration::from_secs(5), probe).await,
        Ok(resp) if resp.status == 200
    )
}

/// An SSE response read frame by frame over a raw socket, for holding a
/// stream open and then dropping it at a chosen moment.
#[derive(Debug)]
pub struct SseStream {
    sock: TcpStream,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunked: bool,
    /// Raw bytes after the response head, not yet de-chunked.
    raw: Vec<u8>,
    /// De-chunked body bytes not yet returned as frames.
    body: Vec<u8>,
    closed: bool,
}

impl SseStream {
    /// POSTs `body` (as `application/json`, with `Accept: text/event-stream`
    /// and `A2A-Version: 1.0` unless `headers` name them) and reads the head.
    pub async fn open(url: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> SseStream {
        let (authority, base) = http::split_url(url);
        let mut sock = TcpStream::connect(&authority)
            .await
            .unwrap_or_else(|e| panic!("connect {authority}: {e}"));
        let body = body.to_string();
        let mut head =
            format!("POST {base}{path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n");
        let named = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
        if !named("a2a-version") {
            head.push_str("a2a-version: 1.0\r\n");
        }
        if !named("accept") {
            head.push_str("accept: text/event-stream\r\n");
        }
        if !named("content-type") {
            head.push_str("content-type: application/json\r\n");
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
        sock.write_all(head.as_bytes()).await.unwrap();
        sock.write_all(body.as_bytes()).await.unwrap();

        let mut raw = Vec::new();
        let end = loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(30), sock.read(&mut buf))
                .await
                .expect("response head within 30 s")
                .expect("read response head");
            assert!(
                n > 0,
                "connection closed before the response head: {:?}",
                String::from_utf8_lossy(&raw)
            );
            raw.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
        let rest = raw[end + 4..].to_vec();
        let mut s = SseStream {
            sock,
            status,
            headers,
            chunked,
            raw: Vec::new(),
            body: Vec::new(),
            closed: false,
        };
        s.push(&rest);
        s
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Feeds socket bytes in, moving every complete chunk into `body`.
    fn push(&mut self, bytes: &[u8]) {
        if !self.chunked {
            self.body.extend_from_slice(bytes);
            return;
        }
        self.raw.extend_from_slice(bytes);
        loop {
            let Some(nl) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size_line = String::from_utf8_lossy(&self.raw[..nl]).into_owned();
            let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16)
                .unwrap_or_else(|_| panic!("bad chunk size line {size_line:?}"));
            if size == 0 {
                self.closed = true;
                self.raw.clear();
                return;
            }
            if self.raw.len() < nl + 2 + size + 2 {
                return;
            }
            self.body
                .extend_from_slice(&self.raw[nl + 2..nl + 2 + size]);
            self.raw.drain(..nl + 2 + size + 2);
        }
    }

    /// The next raw frame, separator included (e.g. `data: {…}\r\n\r\n`), or
    /// `None` once the stream ended. Comment-only frames (`: ping`) are
    /// returned too. Panics after `within` without a frame.
    pub async fn next_raw_frame(&mut self, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = frame_end(&self.body) {
                let frame: Vec<u8> = self.body.drain(..end).collect();
                return Some(String::from_utf8(frame).expect("utf-8 frame"));
            }
            if self.closed {
                return None;
            }
            let mut buf = [0u8; 8192];
            let n = tokio::time::timeout_at(deadline, self.sock.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "no SSE frame within {within:?}; pending {:?}",
                        String::from_utf8_lossy(&self.body)
                    )
                })
                .unwrap_or(0);
            if n == 0 {
                self.closed = true;
                continue;
            }
            self.push(&buf[..n]);
        }
    }

    /// The JSON of the next `data:` frame (comments skipped), or `None` at the
    /// end of the stream.
    pub async fn next_json(&mut self, within: Duration) -> Option<Value> {
        loop {
            let frame = self.next_raw_frame(within).await?;
            let data: Vec<&str> = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if data.is_empty() {
                continue;
            }
            let text = data.join("\n");
            return Some(
                serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("frame data is not JSON ({e}): {text}")),
            );
        }
    }

    /// Reads every remaining `data:` frame until the server ends the stream.
    pub async fn rest_json(&mut self, within: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(v) = self.next_json(within).await {
            out.push(v);
        }
        out
    }

    /// Closes the socket with a reset (SO_LINGER 0) instead of a FIN.
    pub fn reset(self) {
        // Linger 0 does not block on drop, which is what the deprecation is about.
        #[allow(deprecated)]
        let _ = self.sock.set_linger(Some(Duration::ZERO));
        drop(self.sock);
    }
}

/// The end (exclusive) of the first complete SSE frame in `body`: a blank
/// line, whichever of CRLF / LF / CR the server uses.
fn frame_end(body: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < body.len() {
        for sep in [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"] {
            if body[i..].starts_with(sep) {
                return Some(i + sep.len());
            }
        }
        i += 1;
    }
    None
}
