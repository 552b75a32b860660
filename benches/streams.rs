//! Many open streams: what each costs the gateway in memory, how fast a
//! caller's leaving reaches the worker as a cancel while they are open, and
//! how many heap allocations each SSE event costs on the way through, all in
//! one run printed as one table, next to the bare pingora pass-through.
//! `cargo bench -p a2a-gateway --bench streams` (needs a C compiler, `cc`,
//! for the allocation counter; about 45 s once built).
//!
//! Processes (all on loopback; this bench's own binary is re-executed for
//! the worker and the bare pass-through, like `benches/proxy.rs`):
//! - the worker: an a2a-rust 0.15 agent (`tests/harness/rust_worker.rs`,
//!   limits raised with `start_with_capacity`) in a process of its own
//!   (`--streams-worker`, 2 runtime threads), so that its sockets do not count
//!   against this process's file descriptors. It prints `URL <url>`, then
//!   `CANCELED <task> <unix ns> <by CancelTask>` each time its cancel hook
//!   runs (the time is taken in the hook; the line is printed within ~5 ms).
//! - the gateway: the real `a2a-gateway` binary
//!   (`env!("CARGO_BIN_EXE_a2a-gateway")`, started here rather than by the
//!   harness's `Gateway`, whose child pid is private), memory store, one
//!   route, 2 threads, the product's default logs (`info`, access lines on).
//! - bare pingora: `benches/bare_pingora.rs` (`--bare-pingora`), and the
//!   same with the gateway's read-ahead (`server.read_buffer`, none by
//!   default) as the L4 read buffer on its listener (its `--l4-read-buffer`)
//!   instead of pingora's zero-filled 64 KiB one.
//!
//! Scenarios:
//! 1. Memory per open stream. A fresh worker and proxy; a warm-up (64
//!    `quick` streams, 32 `idle` streams opened and closed); the proxy's
//!    `VmRSS` (`/proc/<pid>/status`); then N `SendStreamingMessage` streams
//!    of `idle:600000` (WORKING once, then quiet) opened from raw sockets,
//!    64 at a time, each read until its first event names the task (so the
//!    gateway has seen the id); for the gateway, until its
//!    `a2agw_open_tracked_streams` gauge says N; a second's settling; `VmRSS`
//!    again. Per stream: ΔRSS / N. Then (after scenario 2) all of them
//!    closed, and once settled (the gateway: its gauge at 0 and every child
//!    canceled on the worker), N opened again (fewer if the gateway's
//!    descriptors no longer fit N: the cancels' pooled worker connections)
//!    and `VmRSS` read a third time: per stream, (third − first) / the
//!    number opened, on memory the allocator hands out
//!    again, as in a proxy that has been up a while (a buffer allocated
//!    zeroed is then written in full; fresh pages are zero already and were
//!    left untouched the first time). The gateway holds 2 descriptors per stream
//!    (caller and worker side); N is 10,000 when its descriptor limit allows,
//!    else the most that fits (the bench tries `prlimit` to raise it first and
//!    says what happened). Run for the gateway, bare pingora and bare
//!    pingora with the small L4 read buffer, each with a fresh worker.
//! 2. Caller FIN to the worker's cancel hook, with the N streams open: 200 of
//!    them closed one by one, 20 ms apart (the socket drained first, so the
//!    close is a FIN, not a RST), each timed from just before `close` to the
//!    hook's wall-clock time in the worker's process (same machine clock).
//! 3. Heap allocations per SSE event. The proxies run with an `LD_PRELOAD`
//!    shim (compiled here with `cc`) that counts `malloc`, `calloc`,
//!    `realloc`, `posix_memalign`/`aligned_alloc`/`memalign` calls and bytes
//!    into a shared file; both proxies run on the C library's `malloc` for
//!    it (`A2A_GATEWAY_ALLOCATOR=system`: mimalloc, their default, is linked
//!    in and never calls `malloc`). The shim counts the real binaries, as
//!    they are released, rather than a counting allocator in a test build.
//!    Memory per stream (1.) is measured on their default, mimalloc.
//!    One stream of `burst:0` (3 events) and one of `burst:M`
//!    (M + 3 events), counters read 50 ms after each ends; per event =
//!    (Δ(M) − Δ(0) − idle rate × Δt) / M; median of 3 rounds. The same with
//!    `trickle:K:2` (one event per write, 2 ms apart) against `trickle:0:2`.
//!    Columns: bare pingora, the gateway tracking the stream, the gateway
//!    passing the same stream untracked (a `limits.max_inspect_body` of 1 KiB
//!    below the ~1.6 KiB request body, on a route that checks no sends,
//!    `worker_leases = "observe"`, so no SSE parsing at all), and the
//!    gateway tracking with `timeouts.upstream_idle = "0s"` (bare pingora
//!    sets no upstream read timeout; pingora-core's per-read timeout boxed a
//!    timer each time a timed read had to wait, 2 allocations per trickled
//!    event, until the vendored pingora-proxy kept one timer per exchange:
//!    this column shows the bound costs nothing per event).
//!
//! Under `cargo test` (no `--bench` argument) it only says it was skipped.

// A benchmark's report is its standard output.
#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
#[allow(dead_code, unused_imports, clippy::all)]
mod harness;

#[path = "bare_pingora.rs"]
mod bare_pingora;

#[path = "machine.rs"]
mod machine;

#[path = "alloc_shim.rs"]
mod alloc_shim;
use machine::{cpus, loadavg, machine_ticks, sh, steal_pct, utc_now};

/// The L4 read buffer of the "small L4" bare pingora column: the gateway's
/// default read-ahead on callers' connections (`server.read_buffer`),
/// instead of pingora's 64 KiB (`DEFAULT_L4_READ_BUFFER_SIZE`, allocated
/// zeroed by tokio's `BufReader::with_capacity` for every accepted
/// connection). Bare pingora with it is what the gateway's own share per
/// stream is measured against.
const SMALL_L4_READ_BUFFER: usize = config::DEFAULT_READ_BUFFER;

/// How the table names [`SMALL_L4_READ_BUFFER`].
fn small_l4() -> String {
    match SMALL_L4_READ_BUFFER {
        0 => "no L4 read buffer".into(),
        n => format!("{} KiB L4 read buffer", n / 1024),
    }
}

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use harness::gateway::{free_port, scratch_dir};
use harness::rust_worker::{RustWorker, RustWorkerCapacity, RustWorkerOptions};
use harness::worker::task_id_of;

/// The flag that turns this binary into the worker process.
const WORKER_FLAG: &str = "--streams-worker";
/// Streams wanted open at once (scenario 1).
const WANT_STREAMS: usize = 10_000;
/// Streams opening at a time.
const OPEN_CONCURRENCY: usize = 64;
/// What the held streams run: WORKING, then quiet for ten minutes.
const IDLE_TEXT: &str = "idle:600000";
/// Streams closed one by one for the cancel latency (scenario 2).
const CLOSES: usize = 200;
const CLOSE_GAP: Duration = Duration::from_millis(20);
/// Descriptors kept free on the gateway beside 2 per stream (listeners,
/// epoll, pooled worker connections, the cancels' own connections).
const FD_MARGIN: usize = 64;
/// Events of the `burst:` stream and of the `trickle:` stream (scenario 3).
const BURST: usize = 2000;
const TRICKLE: usize = 200;
const TRICKLE_GAP_MS: u64 = 2;
const ALLOC_ROUNDS: usize = 3;
/// Message metadata padding: the request body is ~1.6 KiB, over the
/// untracked gateway's 1 KiB `max_inspect_body`.
const PAD: usize = 1400;

fn unix_nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

// ── The worker process ──────────────────────────────────────────────────────

/// The worker process's body: serve until stdin closes (the bench ended or
/// died), printing every cancel-hook run.
fn worker_process() -> ! {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("worker runtime");
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        std::process::exit(0);
    });
    rt.block_on(async {
        let worker = RustWorker::start_with_capacity(
            RustWorkerOptions::default(),
            Some(RustWorkerCapacity {
                max_concurrent_streams: 100_000,
                max_tasks: 100_000,
            }),
        )
        .await;
        println!("URL {}", worker.url());
        let mut seen = 0;
        loop {
            let new = worker.cancel_records_from(seen);
            seen += new.len();
            if !new.is_empty() {
                let mut out = std::io::stdout().lock();
                for r in new {
                    let _ = writeln!(
                        out,
                        "CANCELED {} {} {}",
                        r.task_id,
                        unix_nanos(r.wall),
                        r.by_cancel_task
                    );
                }
                let _ = out.flush();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// A worker process and what it reported.
struct WorkerProc {
    child: Child,
    url: String,
    authority: String,
    /// Task id -> (unix ns of its cancel hook, by CancelTask).
    cancels: Arc<Mutex<HashMap<String, (u128, bool)>>>,
}

impl WorkerProc {
    async fn start() -> Result<WorkerProc, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let log = scratch_dir("streams-worker").join("worker.log");
        let stderr = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .arg(WORKER_FLAG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn the worker: {e}"))?;
        let stdout = child.stdout.take().ok_or("no worker stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .map_err(|_| "the worker did not start within 20 s".to_string())?
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let url = first
            .strip_prefix("URL ")
            .ok_or_else(|| format!("worker said {first:?}"))?
            .to_string();
        let authority = url.trim_start_matches("http://").to_string();
        let cancels = Arc::new(Mutex::new(HashMap::new()));
        let sink = Arc::clone(&cancels);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut w = line.split(' ');
                if w.next() != Some("CANCELED") {
                    continue;
                }
                if let (Some(id), Some(ns), Some(by)) = (w.next(), w.next(), w.next()) {
                    if let Ok(ns) = ns.parse() {
                        sink.lock()
                            .unwrap()
                            .entry(id.to_string())
                            .or_insert((ns, by == "true"));
                    }
                }
            }
        });
        Ok(WorkerProc {
            child,
            url,
            authority,
            cancels,
        })
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

// ── Proxies ─────────────────────────────────────────────────────────────────

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bare,
    /// The bare pass-through with the gateway's L4 read buffer on its
    /// listener ([`SMALL_L4_READ_BUFFER`]).
    BareSmallL4,
    Gateway,
    /// The gateway with a 1 KiB `max_inspect_body` on a route that checks no
    /// sends (`worker_leases = "observe"`): our requests pass untracked.
    GatewayUntracked,
    /// The gateway, tracking, with `timeouts.upstream_idle = "0s"` (no read
    /// timeout on worker connections).
    GatewayNoIdle,
}

/// A proxy process in front of the worker.
struct Proxy {
    child: Child,
    pid: u32,
    /// `host:port` callers connect to.
    listen: String,
    /// The gateway's admin base URL.
    admin: Option<String>,
    log: PathBuf,
    /// The allocation counter file, when started with the shim.
    counter: Option<PathBuf>,
}

impl Proxy {
    async fn start(kind: Kind, worker: &WorkerProc, shim: Option<&Path>) -> Result<Proxy, String> {
        let dir = scratch_dir("streams-proxy");
        let listen = format!("127.0.0.1:{}", free_port());
        let log = dir.join("proxy.log");
        let stderr = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut admin = None;
        let mut cmd = match kind {
            Kind::Bare | Kind::BareSmallL4 => {
                let mut c = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
                c.arg(bare_pingora::FLAG).args([
                    "--listen",
                    &listen,
                    "--upstream",
                    &worker.authority,
                ]);
                if kind == Kind::BareSmallL4 {
                    c.args([
                        bare_pingora::L4_READ_BUFFER,
                        &SMALL_L4_READ_BUFFER.to_string(),
                    ]);
                }
                c
            }
            Kind::Gateway | Kind::GatewayUntracked | Kind::GatewayNoIdle => {
                let admin_addr = format!("127.0.0.1:{}", free_port());
                let limits = match kind {
                    Kind::GatewayUntracked => "[limits]\nmax_inspect_body = \"1KiB\"\n",
                    Kind::GatewayNoIdle => "[timeouts]\nupstream_idle = \"0s\"\n",
                    _ => "",
                };
                // A route that checks sends refuses a body over the limit
                // instead of passing it untracked; with leases observed (and
                // no budget, imposed or polled lease) it checks none.
                let route = match kind {
                    Kind::GatewayUntracked => "worker_leases = \"observe\"\n",
                    _ => "",
                };
                let cfg = format!(
                    "[server]\nlisten = [\"{listen}\"]\nadmin = \"{admin_addr}\"\nthreads = 2\n\n{limits}\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n{route}",
                    worker.url
                );
                let path = dir.join("gateway.toml");
                std::fs::write(&path, cfg).map_err(|e| e.to_string())?;
                admin = Some(format!("http://{admin_addr}"));
                let mut c = Command::new(env!("CARGO_BIN_EXE_a2a-gateway"));
                c.arg("--config")
                    .arg(&path)
                    .env("A2A_GATEWAY_LOG", harness::gateway::PRODUCT_LOG);
                c
            }
        };
        let counter = shim.map(|_| dir.join("allocs.bin"));
        if let (Some(shim), Some(counter)) = (shim, &counter) {
            cmd.env("LD_PRELOAD", shim)
                .env(alloc_shim::COUNTER_ENV, counter)
                .env(alloc_shim::ALLOCATOR_ENV.0, alloc_shim::ALLOCATOR_ENV.1);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn proxy: {e}"))?;
        let pid = child.id().ok_or("proxy exited at once")?;
        let mut p = Proxy {
            child,
            pid,
            listen,
            admin,
            log,
            counter,
        };
        let mut addrs = vec![p.listen.clone()];
        if let Some(a) = &p.admin {
            addrs.push(a.trim_start_matches("http://").to_string());
        }
        p.wait_ready(&addrs).await?;
        Ok(p)
    }

    async fn wait_ready(&mut self, addrs: &[String]) -> Result<(), String> {
        for _ in 0..400 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "proxy exited ({status}): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            let mut up = true;
            for a in addrs {
                up &= TcpStream::connect(a.as_str()).await.is_ok();
            }
            if up {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err("proxy did not listen within 10 s".into())
    }

    fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map_or(0, |d| d.count())
    }

    /// (soft, hard) `RLIMIT_NOFILE` of the process.
    fn fd_limits(&self) -> Option<(usize, usize)> {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.pid)).ok()?;
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        let mut w = line["Max open files".len()..].split_whitespace();
        Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
    }

    /// Tries to raise the descriptor limit to `want` with `prlimit`.
    fn raise_fd_limit(&self, want: usize) -> String {
        let out = std::process::Command::new("prlimit")
            .arg("--pid")
            .arg(self.pid.to_string())
            .arg(format!("--nofile={want}:{want}"))
            .output();
        match out {
            Ok(o) if o.status.success() => format!("raised to {want} with prlimit"),
            Ok(o) => format!(
                "prlimit to {want} refused ({})",
                String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .trim_start_matches("prlimit: ")
            ),
            Err(e) => format!("prlimit not run ({e})"),
        }
    }

    /// A sample of the gateway's `/metrics` (0 when absent).
    async fn metric(&self, name: &str) -> f64 {
        let Some(admin) = &self.admin else { return 0.0 };
        harness::http::request("GET", admin, "/metrics", &[], b"")
            .await
            .text()
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits up to 15 s for the gateway's open tracked streams gauge to say
    /// `n`; else its last value.
    async fn wait_tracked(&self, n: usize) -> Result<(), usize> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let open = self.metric("a2agw_open_tracked_streams").await as usize;
            if open == n {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(open);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// (allocation calls, realloc calls, bytes asked) so far.
    fn allocs(&self) -> Option<[u64; 3]> {
        alloc_shim::read_counter(self.counter.as_ref()?)
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

// ── Raw SSE callers ─────────────────────────────────────────────────────────

fn stream_request(authority: &str, text: &str, close: bool) -> Vec<u8> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": {"messageId": format!("bench-{}", next_id()), "role": "ROLE_USER",
            "parts": [{"text": text}], "metadata": {"pad": "x".repeat(PAD)}}}})
    .to_string();
    let conn = if close { "connection: close\r\n" } else { "" };
    format!(
        "POST / HTTP/1.1\r\nhost: {authority}\r\n{conn}content-type: application/json\r\naccept: text/event-stream\r\na2a-version: 1.0\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn next_id() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// De-chunks what it can of `raw` into `body`; true at the last chunk.
fn dechunk(raw: &mut Vec<u8>, body: &mut Vec<u8>) -> Result<bool, String> {
    loop {
        let Some(nl) = raw.windows(2).position(|w| w == b"\r\n") else {
            return Ok(false);
        };
        let line = String::from_utf8_lossy(&raw[..nl]).into_owned();
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size {line:?}"))?;
        if size == 0 {
            return Ok(true);
        }
        if raw.len() < nl + 2 + size + 2 {
            return Ok(false);
        }
        body.extend_from_slice(&raw[nl + 2..nl + 2 + size]);
        raw.drain(..nl + 2 + size + 2);
    }
}

/// The JSON of the first complete `data:` frame in `body`, if any.
fn first_event(body: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    let mut rest = text.as_str();
    while let Some(end) = rest.find("\n\n") {
        let frame = &rest[..end];
        rest = &rest[end + 2..];
        let data: Vec<&str> = frame
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            return serde_json::from_str(&data.join("\n")).ok();
        }
    }
    None
}

/// An open stream whose task the caller knows.
struct Held {
    sock: TcpStream,
    task_id: String,
}

/// Opens a stream of `IDLE_TEXT` and reads until its first event names the task.
async fn open_idle(addr: String) -> Result<Held, String> {
    let work = async {
        let mut sock = TcpStream::connect(&addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = sock.set_nodelay(true);
        sock.write_all(&stream_request(&addr, IDLE_TEXT, false))
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        let mut body = Vec::new();
        let mut head_done = false;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = sock
                .read(&mut buf)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err(format!(
                    "closed before an event: {:?}",
                    String::from_utf8_lossy(&raw)
                ));
            }
            raw.extend_from_slice(&buf[..n]);
            if !head_done {
                let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
                if !head.starts_with("http/1.1 200") || !head.contains("text/event-stream") {
                    return Err(format!("not a stream: {head:?}"));
                }
                raw.drain(..end + 4);
                head_done = true;
            }
            dechunk(&mut raw, &mut body)?;
            if let Some(ev) = first_event(&body) {
                let id =
                    task_id_of(&ev).ok_or_else(|| format!("first event names no task: {ev}"))?;
                return Ok(Held { sock, task_id: id });
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .map_err(|_| "no first event within 60 s".to_string())?
}

/// Drains what the socket holds (so the close is a FIN, not a RST), then
/// closes it; returns the moment of the close.
fn close_fin(held: Held) -> SystemTime {
    let mut buf = [0u8; 2048];
    while let Ok(n) = held.sock.try_read(&mut buf) {
        if n == 0 {
            break;
        }
    }
    let at = SystemTime::now();
    drop(held.sock);
    at
}

/// Opens `n` idle streams, `OPEN_CONCURRENCY` at a time.
async fn open_many(addr: &str, n: usize) -> (Vec<Held>, Vec<String>) {
    let results: Vec<Result<Held, String>> = futures::stream::iter(0..n)
        .map(|_| open_idle(addr.to_string()))
        .buffer_unordered(OPEN_CONCURRENCY)
        .collect()
        .await;
    let mut held = Vec::with_capacity(n);
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(h) => held.push(h),
            Err(e) => errors.push(e),
        }
    }
    (held, errors)
}

/// One stream read to its end (the proxy closes: `connection: close`);
/// returns the number of `data:` events.
async fn stream_to_end(addr: &str, text: &str) -> Result<usize, String> {
    let work = async {
        let mut sock = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        sock.write_all(&stream_request(addr, text, true))
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        sock.read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&raw);
        if !text.contains("TASK_STATE_COMPLETED") {
            return Err(format!(
                "the stream did not complete: {}",
                &text[..text.len().min(300)]
            ));
        }
        Ok(text.matches("data:").count())
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .map_err(|_| "stream not done within 60 s".to_string())?
}

// ── Scenario 1 and 2: memory per stream, cancel latency ─────────────────────

#[derive(Default)]
struct MemRun {
    streams: usize,
    rss_before_kib: u64,
    rss_open_kib: u64,
    /// `VmRSS` with streams open again after closing the first ones, and
    /// how many: as many as the first time, or as still fit the descriptors.
    /// `None` when that opening did not happen or failed (see `note`).
    again: Option<(u64, usize)>,
    fds_open: usize,
    /// Cancel latencies (ms) of the closed streams; closes without a cancel.
    cancel_ms: Vec<f64>,
    missing_cancels: usize,
    open_secs: f64,
    note: String,
}

impl MemRun {
    fn per_stream_kib(&self) -> f64 {
        (self.rss_open_kib as f64 - self.rss_before_kib as f64) / self.streams as f64
    }

    fn per_stream_again_kib(&self) -> f64 {
        self.again.map_or(f64::NAN, |(kib, n)| {
            (kib as f64 - self.rss_before_kib as f64) / n as f64
        })
    }
}

/// Outcome of the descriptor-limit probe on the gateway.
struct FdPlan {
    streams: usize,
    text: String,
}

async fn memory_run(kind: Kind, plan: Option<&FdPlan>) -> Result<(MemRun, Option<FdPlan>), String> {
    let worker = WorkerProc::start().await?;
    let proxy = match Proxy::start(kind, &worker, None).await {
        Ok(p) => p,
        Err(e) => {
            worker.stop().await;
            return Err(e);
        }
    };
    let result = memory_body(kind, &worker, &proxy, plan).await;
    proxy.stop().await;
    worker.stop().await;
    result
}

async fn memory_body(
    kind: Kind,
    worker: &WorkerProc,
    proxy: &Proxy,
    plan: Option<&FdPlan>,
) -> Result<(MemRun, Option<FdPlan>), String> {
    let addr = proxy.listen.clone();
    // Warm-up: whole streams, and held streams closed again.
    let quick: Vec<_> = futures::stream::iter(0..64)
        .map(|_| stream_to_end(&addr, "quick"))
        .buffer_unordered(16)
        .collect()
        .await;
    if let Some(Err(e)) = quick.into_iter().find(Result::is_err) {
        return Err(format!("warm-up: {e}"));
    }
    let (warm, errors) = open_many(&addr, 32).await;
    if let Some(e) = errors.first() {
        return Err(format!("warm-up: {e}"));
    }
    for h in warm {
        close_fin(h);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // How many streams fit in the proxy's descriptors.
    let new_plan = match plan {
        Some(_) => None,
        None => {
            let want_fds = 2 * WANT_STREAMS + proxy.fds() + FD_MARGIN;
            let mut text = String::new();
            let (soft, hard) = proxy.fd_limits().unwrap_or((0, 0));
            if soft < want_fds {
                text = format!(
                    "fd limit {soft}/{hard} (soft/hard); {}",
                    proxy.raise_fd_limit(want_fds)
                );
            }
            let (soft, _) = proxy.fd_limits().unwrap_or((0, 0));
            let fit = soft.saturating_sub(proxy.fds() + FD_MARGIN) / 2;
            let streams = WANT_STREAMS.min(fit);
            if text.is_empty() {
                text = format!("fd limit {soft}: {streams} streams fit");
            } else {
                text = format!("{text}; {streams} streams fit");
            }
            Some(FdPlan { streams, text })
        }
    };
    let n = plan.or(new_plan.as_ref()).map_or(0, |p| p.streams);
    if n <= CLOSES {
        return Err(format!("only {n} streams fit"));
    }

    let rss_before = proxy.rss_kib().ok_or("no VmRSS")?;
    let opened = Instant::now();
    let (mut held, errors) = open_many(&addr, n).await;
    let open_secs = opened.elapsed().as_secs_f64();
    if !errors.is_empty() {
        for h in held {
            close_fin(h);
        }
        return Err(format!(
            "{} of {n} streams failed to open, first: {}",
            errors.len(),
            errors[0]
        ));
    }
    let mut note = String::new();
    if kind == Kind::Gateway {
        if let Err(open) = proxy.wait_tracked(n).await {
            note = format!("the gateway's open tracked streams gauge says {open}, not {n}");
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_open = proxy.rss_kib().ok_or("no VmRSS")?;
    let fds_open = proxy.fds();

    // Cancel latency: the most recently opened streams, closed one by one.
    let mut cancel_ms = Vec::new();
    let mut missing = 0;
    if kind == Kind::Gateway {
        let mut closes = Vec::with_capacity(CLOSES);
        for _ in 0..CLOSES {
            let h = held.pop().ok_or("no stream left to close")?;
            let id = h.task_id.clone();
            let at = close_fin(h);
            closes.push((id, unix_nanos(at)));
            tokio::time::sleep(CLOSE_GAP).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let done = {
                let c = worker.cancels.lock().unwrap();
                closes.iter().filter(|(id, _)| c.contains_key(id)).count()
            };
            if done == closes.len() || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let c = worker.cancels.lock().unwrap();
        for (id, closed_ns) in &closes {
            match c.get(id) {
                Some((ns, _)) => cancel_ms.push((*ns as f64 - *closed_ns as f64) / 1e6),
                None => missing += 1,
            }
        }
        let not_by_cancel = closes
            .iter()
            .filter(|(id, _)| c.get(id).is_some_and(|(_, by)| !by))
            .count();
        if not_by_cancel > 0 {
            note.push_str(&format!(
                " {not_by_cancel} hook runs were not CancelTask calls."
            ));
        }
    }

    // The same number again, once the first ones are closed and settled (for
    // the gateway: every child canceled on the worker): the proxy now runs on
    // memory its allocator hands out again, as one that has been up a while
    // does. A buffer allocated zeroed is then written in full (fresh pages
    // from the kernel are zero already and stay untouched).
    let ids: Vec<String> = held.iter().map(|h| h.task_id.clone()).collect();
    for h in held {
        close_fin(h);
    }
    if kind == Kind::Gateway {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let open = proxy.metric("a2agw_open_tracked_streams").await as usize;
            let canceled = {
                let c = worker.cancels.lock().unwrap();
                ids.iter().filter(|id| c.contains_key(*id)).count()
            };
            if open == 0 && canceled == ids.len() {
                break;
            }
            if Instant::now() > deadline {
                note.push_str(&format!(
                    " Before the second opening: {open} tracked streams still open, {canceled} of {} children canceled.",
                    ids.len()
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The gateway now also holds the cancels' pooled worker connections
    // (pingora's connector keeps up to 128): as many as still fit.
    let n_again = proxy.fd_limits().map_or(n, |(soft, _)| {
        n.min(soft.saturating_sub(proxy.fds() + FD_MARGIN) / 2)
    });
    // A failure here is noted; the first opening's figures stand.
    let mut again_kib = None;
    if n_again <= CLOSES {
        note.push_str(&format!(
            " Second opening skipped: only {n_again} streams fit."
        ));
    } else {
        let (again, errors) = open_many(&addr, n_again).await;
        if errors.is_empty() {
            if kind == Kind::Gateway {
                if let Err(open) = proxy.wait_tracked(n_again).await {
                    note.push_str(&format!(
                        " Second opening: the gauge says {open}, not {n_again}."
                    ));
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            again_kib = proxy.rss_kib();
        } else {
            note.push_str(&format!(
                " Second opening: {} of {n_again} streams failed to open, first: {}.",
                errors.len(),
                errors[0]
            ));
        }
        for h in again {
            close_fin(h);
        }
    }
    Ok((
        MemRun {
            streams: n,
            rss_before_kib: rss_before,
            rss_open_kib: rss_open,
            again: again_kib.map(|kib| (kib, n_again)),
            fds_open,
            cancel_ms,
            missing_cancels: missing,
            open_secs,
            note,
        },
        new_plan,
    ))
}

// ── Scenario 3: allocations per event ───────────────────────────────────────

/// Per-event allocation figures of one proxy.
#[derive(Default)]
struct AllocRun {
    /// Allocation calls (reallocs included) per event, `burst:` and `trickle:`.
    burst: f64,
    burst_bytes: f64,
    trickle: f64,
    trickle_bytes: f64,
    /// Of which reallocs.
    burst_reallocs: f64,
    trickle_reallocs: f64,
    /// Allocation calls per second with nothing flowing.
    idle_per_sec: f64,
    /// Events of the long streams as the caller counted them.
    burst_events: usize,
    trickle_events: usize,
    /// Allocation calls of the whole short stream (3 events).
    short_stream: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Counter snapshot after the proxy settled, and when.
async fn settled(p: &Proxy) -> Result<([u64; 3], Instant), String> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok((p.allocs().ok_or("no allocation counter")?, Instant::now()))
}

/// Δ of the long stream minus Δ of the short one, idle rate taken out, per
/// event: (calls incl. reallocs, reallocs, bytes), and the events counted.
async fn per_event(
    p: &Proxy,
    short: &str,
    long: &str,
    extra_events: usize,
    idle: [f64; 3],
) -> Result<([f64; 3], usize, f64), String> {
    let (a0, t0) = settled(p).await?;
    stream_to_end(&p.listen, short).await?;
    let (a1, t1) = settled(p).await?;
    let events = stream_to_end(&p.listen, long).await?;
    let (a2, t2) = settled(p).await?;
    let dt_short = (t1 - t0).as_secs_f64();
    let dt_long = (t2 - t1).as_secs_f64();
    let d = |i: usize, a: [u64; 3], b: [u64; 3]| b[i] as f64 - a[i] as f64;
    let calls = |a, b| d(0, a, b) + d(1, a, b);
    let short_calls = calls(a0, a1) - (idle[0] + idle[1]) * dt_short;
    let out = [
        (calls(a1, a2) - calls(a0, a1) - (idle[0] + idle[1]) * (dt_long - dt_short))
            / extra_events as f64,
        (d(1, a1, a2) - d(1, a0, a1) - idle[1] * (dt_long - dt_short)) / extra_events as f64,
        (d(2, a1, a2) - d(2, a0, a1) - idle[2] * (dt_long - dt_short)) / extra_events as f64,
    ];
    Ok((out, events, short_calls))
}

async fn alloc_run(kind: Kind, worker: &WorkerProc, shim: &Path) -> Result<AllocRun, String> {
    let p = Proxy::start(kind, worker, Some(shim)).await?;
    let result = alloc_body(&p).await;
    p.stop().await;
    result
}

async fn alloc_body(p: &Proxy) -> Result<AllocRun, String> {
    let burst = format!("burst:{BURST}");
    let trickle = format!("trickle:{TRICKLE}:{TRICKLE_GAP_MS}");
    let trickle0 = format!("trickle:0:{TRICKLE_GAP_MS}");
    for _ in 0..3 {
        stream_to_end(&p.listen, &burst).await?;
        stream_to_end(&p.listen, "burst:0").await?;
    }
    stream_to_end(&p.listen, &trickle).await?;
    stream_to_end(&p.listen, &trickle0).await?;
    let (i0, t0) = settled(p).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (i1, t1) = settled(p).await?;
    let secs = (t1 - t0).as_secs_f64();
    let idle = [
        (i1[0] - i0[0]) as f64 / secs,
        (i1[1] - i0[1]) as f64 / secs,
        (i1[2] - i0[2]) as f64 / secs,
    ];
    let mut run = AllocRun {
        idle_per_sec: idle[0] + idle[1],
        ..AllocRun::default()
    };
    let (mut b, mut br, mut bb, mut t, mut tr, mut tb, mut short) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..ALLOC_ROUNDS {
        let (x, events, s) = per_event(p, "burst:0", &burst, BURST, idle).await?;
        b.push(x[0]);
        br.push(x[1]);
        bb.push(x[2]);
        short.push(s);
        run.burst_events = events;
        let (x, events, _) = per_event(p, &trickle0, &trickle, TRICKLE, idle).await?;
        t.push(x[0]);
        tr.push(x[1]);
        tb.push(x[2]);
        run.trickle_events = events;
    }
    run.burst = median(b);
    run.burst_reallocs = median(br);
    run.burst_bytes = median(bb);
    run.trickle = median(t);
    run.trickle_reallocs = median(tr);
    run.trickle_bytes = median(tb);
    run.short_stream = median(short);
    Ok(run)
}

// ── The table ───────────────────────────────────────────────────────────────

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn cell<T>(r: &Result<T, String>, f: impl Fn(&T) -> String) -> String {
    match r {
        Ok(v) => f(v),
        Err(e) => format!("failed: {}", e.lines().next().unwrap_or("")),
    }
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "-",
    }
}

struct Results {
    /// Memory runs: bare, bare with the small L4 buffer, gateway.
    mem: [Result<MemRun, String>; 3],
    plan: String,
    /// Allocation runs: bare, gateway, gateway untracked, gateway with no
    /// upstream read timeout.
    allocs: [Result<AllocRun, String>; 4],
}

/// One table row: a label, a cell per column (bare, bare small L4, gateway,
/// gateway untracked, gateway no idle timeout), the target and the verdict.
fn row(label: &str, cells: [String; 5], target: &str, verdict: &str) {
    let mut line = format!("| {label} |");
    for c in cells {
        line.push_str(&format!(" {c} |"));
    }
    println!("{line} {target} | {verdict} |");
}

fn print_table(r: &Results) {
    let [bm, sm, gm] = &r.mem;
    let [ab, ag, au, an] = &r.allocs;
    let d = || "-".to_string();
    println!(
        "| measurement | bare pingora | bare pingora, {} | gateway (memory store, tracked) | gateway, stream untracked | gateway, tracked, `upstream_idle = \"0s\"` | target | |",
        small_l4()
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mem = |f: &dyn Fn(&MemRun) -> String| [cell(bm, f), cell(sm, f), cell(gm, f), d(), d()];
    let n_ok = gm.as_ref().ok().map(|m| m.streams >= WANT_STREAMS);
    row(
        "streams held open at once (`idle:`, first event read)",
        mem(&|m| match m.again {
            Some((_, n)) if n != m.streams => format!("{}; {n} the second time", m.streams),
            _ => m.streams.to_string(),
        }),
        "10,000",
        if n_ok == Some(false) {
            "fewer: fd limit (above)"
        } else {
            verdict(n_ok)
        },
    );
    row(
        "time to open them, 64 at a time (s)",
        mem(&|m| format!("{:.1}", m.open_secs)),
        "",
        "",
    );
    row(
        "proxy VmRSS warm, before (MiB)",
        mem(&|m| format!("{:.1}", m.rss_before_kib as f64 / 1024.0)),
        "",
        "",
    );
    row(
        "proxy VmRSS with them open (MiB); its fds",
        mem(&|m| format!("{:.1}; {}", m.rss_open_kib as f64 / 1024.0, m.fds_open)),
        "",
        "",
    );
    row(
        "proxy VmRSS with streams open again, after closing them (MiB)",
        mem(&|m| {
            m.again
                .map_or("-".into(), |(kib, _)| format!("{:.1}", kib as f64 / 1024.0))
        }),
        "",
        "",
    );
    // NaN: the second opening did not happen (see the notes).
    let kib = |x: f64| if x.is_nan() { d() } else { format!("{x:.2}") };
    let under = |f: fn(&MemRun) -> f64| {
        verdict(
            gm.as_ref()
                .ok()
                .map(f)
                .filter(|x| !x.is_nan())
                .map(|x| x < 16.0),
        )
    };
    row(
        "ΔRSS per open stream, first opened (KiB)",
        mem(&|m| kib(m.per_stream_kib())),
        "< 16",
        under(MemRun::per_stream_kib),
    );
    row(
        "ΔRSS per open stream, opened again: memory reused (KiB)",
        mem(&|m| kib(m.per_stream_again_kib())),
        "< 16",
        under(MemRun::per_stream_again_kib),
    );
    // Against bare pingora with the same read-ahead on callers' connections.
    let over = |f: fn(&MemRun) -> f64| match (gm, sm) {
        (Ok(g), Ok(b)) => Some(f(g) - f(b)).filter(|x| !x.is_nan()),
        _ => None,
    };
    for (label, f) in [
        ("first opened", MemRun::per_stream_kib as fn(&MemRun) -> f64),
        ("opened again", MemRun::per_stream_again_kib),
    ] {
        let x = over(f);
        row(
            &format!(
                "gateway's own share, {label}: ΔRSS per stream − bare's with {} (KiB)",
                small_l4()
            ),
            [d(), d(), x.map_or_else(d, |x| format!("{x:+.2}")), d(), d()],
            "< 16 (if meant over bare)",
            verdict(x.map(|x| x < 16.0)),
        );
    }
    let sorted = |m: &MemRun| {
        let mut v = m.cancel_ms.clone();
        v.sort_by(f64::total_cmp);
        v
    };
    let lat = |p: f64| {
        [
            d(),
            d(),
            cell(gm, |m| format!("{:.2}", pct(&sorted(m), p))),
            d(),
            d(),
        ]
    };
    let counts = cell(gm, |m| {
        format!(
            "{} closed, {} hooks seen, {} missing",
            m.cancel_ms.len() + m.missing_cancels,
            m.cancel_ms.len(),
            m.missing_cancels
        )
    });
    row(
        &format!(
            "caller FIN → worker's cancel hook, {CLOSES} closes {} ms apart, the rest open: p50 (ms)",
            CLOSE_GAP.as_millis()
        ),
        lat(0.5),
        "",
        &counts,
    );
    let p99_ok = gm
        .as_ref()
        .ok()
        .map(|m| m.missing_cancels == 0 && pct(&sorted(m), 0.99) < 20.0);
    row("… p99 (ms)", lat(0.99), "< 20", verdict(p99_ok));
    row("… max (ms)", lat(1.0), "", "");

    type Get = fn(&AllocRun) -> f64;
    let allocs = |f: Get, digits: usize| {
        let c = |r: &Result<AllocRun, String>| cell(r, |x| format!("{:.digits$}", f(x)));
        [c(ab), d(), c(ag), c(au), c(an)]
    };
    let not_above_bare = |f: Get| {
        verdict(match (ag, ab) {
            (Ok(g), Ok(b)) => Some(f(g) - f(b) < 0.05),
            _ => None,
        })
    };
    let b: Get = |x| x.burst;
    row(
        &format!("heap allocations per SSE event, `burst:{BURST}` (back to back)"),
        allocs(b, 2),
        "≤ bare",
        not_above_bare(b),
    );
    row(
        "… of which reallocs",
        allocs(|x| x.burst_reallocs, 2),
        "",
        "",
    );
    row(
        "… bytes asked per event",
        allocs(|x| x.burst_bytes, 0),
        "",
        "",
    );
    let t: Get = |x| x.trickle;
    row(
        &format!(
            "heap allocations per SSE event, `trickle:{TRICKLE}:{TRICKLE_GAP_MS}` (one event per write)"
        ),
        allocs(t, 2),
        "≤ bare",
        not_above_bare(t),
    );
    row(
        "… of which reallocs",
        allocs(|x| x.trickle_reallocs, 2),
        "",
        "",
    );
    row(
        "… bytes asked per event",
        allocs(|x| x.trickle_bytes, 0),
        "",
        "",
    );
    row(
        "heap allocations of a whole 3-event stream (`burst:0`, new connection)",
        allocs(|x| x.short_stream, 0),
        "",
        "",
    );
    row(
        "heap allocations per second, idle (taken out above)",
        allocs(|x| x.idle_per_sec, 1),
        "",
        "",
    );
    let ev = |r: &Result<AllocRun, String>| {
        cell(r, |x| format!("{}, {}", x.burst_events, x.trickle_events))
    };
    row(
        "events the caller counted (`burst`, `trickle`)",
        [ev(ab), d(), ev(ag), ev(au), ev(an)],
        "",
        "",
    );
    for note in r
        .mem
        .iter()
        .filter_map(|m| m.as_ref().ok())
        .map(|m| m.note.trim())
        .filter(|n| !n.is_empty())
    {
        println!();
        println!("note: {note}");
    }
}

/// The commit the sources are at, and whether the product's sources have
/// uncommitted changes (the bench measures what was built from them).
fn source_state() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let commit = sh("git", &["-C", dir, "log", "-1", "--format=%h"]);
    let changed = sh(
        "git",
        &[
            "-C",
            dir,
            "status",
            "--porcelain",
            "--",
            "gateway/src",
            "config/src",
            "policies/src",
            "vendor",
        ],
    );
    let n = changed.lines().count();
    if commit.is_empty() {
        return "sources: not a git checkout".into();
    }
    if n == 0 {
        format!("sources at {commit}")
    } else {
        format!("sources at {commit} + uncommitted changes in {n} product file(s)")
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == bare_pingora::FLAG) {
        bare_pingora::run(&args[i + 1..]);
    }
    if args.iter().any(|a| a == WORKER_FLAG) {
        worker_process();
    }
    if !args.iter().any(|a| a == "--bench") {
        println!("streams bench: skipped (run `cargo bench -p a2a-gateway --bench streams`)");
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("driver runtime");
    let sources = source_state();
    let load_before = loadavg();
    let ticks_before = machine_ticks();
    let started = Instant::now();
    let results = rt.block_on(async {
        eprintln!("memory and cancel latency: gateway");
        let (gw_mem, plan) = match memory_run(Kind::Gateway, None).await {
            Ok((m, p)) => (Ok(m), p),
            Err(e) => (Err(e), None),
        };
        let plan = plan.unwrap_or(FdPlan {
            streams: 9_000,
            text: "fd limit not probed (the gateway run failed); 9000 streams".into(),
        });
        eprintln!("{}", plan.text);
        eprintln!("memory: bare pingora");
        let bare_mem = memory_run(Kind::Bare, Some(&plan)).await.map(|(m, _)| m);
        eprintln!("memory: bare pingora, small L4 read buffer");
        let small_mem = memory_run(Kind::BareSmallL4, Some(&plan))
            .await
            .map(|(m, _)| m);
        eprintln!("allocations per event");
        let allocs = match alloc_shim::build_shim(&scratch_dir("alloc-shim")) {
            Err(e) => [Err(e.clone()), Err(e.clone()), Err(e.clone()), Err(e)],
            Ok(shim) => match WorkerProc::start().await {
                Err(e) => [Err(e.clone()), Err(e.clone()), Err(e.clone()), Err(e)],
                Ok(worker) => {
                    let b = alloc_run(Kind::Bare, &worker, &shim).await;
                    let g = alloc_run(Kind::Gateway, &worker, &shim).await;
                    let u = alloc_run(Kind::GatewayUntracked, &worker, &shim).await;
                    let n = alloc_run(Kind::GatewayNoIdle, &worker, &shim).await;
                    worker.stop().await;
                    [b, g, u, n]
                }
            },
        };
        Results {
            mem: [bare_mem, small_mem, gw_mem],
            plan: plan.text,
            allocs,
        }
    });
    let load_after = loadavg();
    let steal = steal_pct(ticks_before, machine_ticks());

    println!();
    println!(
        "streams bench, {} — {}; load average {load_before} before, {load_after} after; {:.0} s; CPU time stolen by the host {steal}; {sources}",
        utc_now(),
        cpus(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "pingora 0.9 (bare and gateway: 2 threads, gateway on the memory store); worker: a2a-rust 0.15 in its own process (2 threads); {}",
        results.plan
    );
    println!();
    print_table(&results);
}
