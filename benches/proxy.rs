//! Throughput and latency straight to a real worker and through four
//! proxies in front of the same worker, in one run, printed as one table.
//! `cargo bench -p a2a-gateway --bench proxy` (needs `wrk`, `redis-server`,
//! and for its column Debian's nginx: `apt-get install wrk redis-server
//! nginx-light`).
//!
//! Columns (each a separate process on loopback, all in front of the same
//! in-process a2a-rust 0.15 worker with its WebSocket listener on):
//! - direct: the worker itself.
//! - nginx: `/usr/sbin/nginx`, configured by this bench in a scratch dir (2
//!   workers, upstream keep-alive, buffering off so SSE streams, a second
//!   server block that passes WebSocket upgrades).
//! - bare pingora: a `ProxyHttp` with `upstream_peer` only
//!   (`benches/bare_pingora.rs`), same pingora and threads as the gateway.
//!   It is compiled into this bench binary, which runs it as a child process
//!   by re-executing itself with `--bare-pingora` (see that file for why).
//! - gateway (memory), gateway (Redis): the real `a2a-gateway` binary, one
//!   route, task tracking on, the product's default config and logs (`info`,
//!   an access line per request); the second with `[store] url =
//!   "redis://…"`. A blocking `SendMessage` is guarded as the default
//!   `blocking_sends = "auto"` does: passed as it came, the caller's leaving
//!   watched.
//! - gateway (memory, blocking_sends = stream): the memory gateway carrying
//!   blocking sends as streams (`SendStreamingMessage` over the gateway's own
//!   connection, then `GetTask`), what a route with a budget or a lease
//!   pays for its sends.
//!
//! Scenarios:
//! - `SendMessage` (JSON-RPC, `quick` task, ~1 KB answer), driven by `wrk`
//!   with 32 keep-alive connections: requests/s, p50, p99, and the CPU time
//!   (user + system, from `/proc`) the proxy's processes spent per request
//!   (nginx: master and workers; gateway (Redis): gateway and
//!   `redis-server`), which depends far less on what else the machine does
//!   than requests/s.
//! - `SendMessage` at a fixed rate, half of bare pingora's saturation, from
//!   an in-repo open-loop driver: p50, p99, each column paired with bare
//!   pingora at the same moments (half of the rate to each side), and the
//!   column's p99 minus bare's from those pairs; for the gateway and bare
//!   pingora also the time the request spent inside the proxy, the worker's
//!   left out (`a2agw_proxy_seconds`, read from each around every slice).
//!   The bare column's partner is a second bare pingora process, so its
//!   differences are the method's own noise.
//! - SSE: `SendStreamingMessage` of a task that emits N status updates at
//!   once, 8 streams at a time: events/s, with task tracking on.
//! - WebSocket: `SendMessage` `quick` request/response loops over 16 sockets
//!   (one request in flight on each) to the worker's WebSocket listener:
//!   round trips/s, p50, p99.
//! - gRPC (`benches/grpc.rs`, after the rounds above; direct, bare pingora
//!   and the gateway on the memory store only): unary `SendMessage` calls/s,
//!   p50, p99 and CPU per call, `SendStreamingMessage` messages/s and the
//!   proxy's CPU per message, over h2c from an in-repo `h2` driver to the
//!   worker's gRPC listener; and heap allocations per streamed message and
//!   per call, bare pingora against the gateway. `-- --grpc` runs these rows
//!   alone (about a minute).
//!
//! All proxies are started first. Each scenario is then run against every
//! column in turn (so a row's figures are taken within seconds of each
//! other), and the whole sequence [`ROUNDS`] times (SSE three times per
//! round); the table keeps each cell's best run (latencies from the run with
//! the best throughput), since load generator, proxies and worker share two
//! cores and single runs vary by 15-20%. The first round warms each target
//! up first. Then the fixed-rate latency rows: [`FIXED_SLICES`] short
//! slices, every column once per slice in turn, each run at the same time as
//! one against bare pingora, all slices pooled per column; the summary also
//! gives the median of the per-slice differences to bare.
//! About six minutes in all.
//!
//! `--serve` (after `--`) instead starts the worker, bare pingora and a
//! gateway (each also on the worker's WebSocket listener, and a pair of
//! them on its gRPC listener), prints their addresses and keeps them up, for profiling by hand and for
//! `benches/ws-upgrade.py`; `--grpc-load ADDR SECS` drives the gRPC unary
//! row's load at one of them and prints its calls/s.
//!
//! The worker runs on a runtime of one thread; the in-repo load drivers (SSE,
//! WebSocket) on another of their own, like `wrk` in its own process.
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

#[path = "canned.rs"]
mod canned;

#[path = "grpc.rs"]
mod grpc;

#[path = "alloc_shim.rs"]
mod alloc_shim;
use machine::{cpus, loadavg, machine_ticks, sh, steal_pct, utc_now};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::gateway::{free_port, scratch_dir, Gateway};
use harness::redis::RedisServer;
use harness::rust_worker::{RustWorker, RustWorkerOptions};
use harness::worker::{send_stream, Bind};
use harness::ws::{connect, round_trip};

const SEND_SECONDS: u32 = 5;
const SEND_WARMUP_SECONDS: u32 = 1;
const BURST: usize = 2000;
const STREAMS: usize = 8;
/// An SSE run takes well under a second; it is repeated in each round.
const SSE_REPEATS: usize = 3;
const WS_SOCKETS: usize = 16;
const WS_SECONDS: u64 = 4;
const WS_WARMUP: Duration = Duration::from_secs(1);
/// Each scenario is run this many times against every target; best kept.
const ROUNDS: usize = 3;
const NGINX: &str = "/usr/sbin/nginx";

// ── SendMessage over HTTP, driven by wrk ────────────────────────────────────

struct Send {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Requests answered in the run.
    requests: f64,
    /// CPU time (user + system) the proxy's processes spent per request
    /// during the run, in µs; `None` for direct (the worker shares the
    /// bench's process).
    cpu_us: Option<f64>,
    /// CPU time the worker's runtime threads spent per request, in µs: what
    /// the worker, the bottleneck, paid for a request as this column
    /// delivered it.
    worker_cpu_us: Option<f64>,
}

/// The `SendMessage` body both bindings send: `quick`, ~1 KB with metadata.
fn send_body(id: u64) -> String {
    serde_json::json!({
        "jsonrpc": "2.0", "id": id, "method": "SendMessage",
        "params": {"message": {"messageId": "bench", "role": "ROLE_USER",
            "parts": [{"text": "quick"}], "metadata": {"pad": "x".repeat(600)}}}
    })
    .to_string()
}

fn wrk_send(url: &str, seconds: u32) -> Option<Send> {
    wrk_with(url, &send_body(1), 2, seconds)
}

/// `wrk -t{threads} -c32` posting `body` to `url`.
fn wrk_with(url: &str, body: &str, threads: u32, seconds: u32) -> Option<Send> {
    let dir = scratch_dir("bench");
    let script = dir.join("send.lua");
    let lua = format!(
        "wrk.method = \"POST\"\nwrk.body = [[{body}]]\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"A2A-Version\"] = \"1.0\"\n"
    );
    std::fs::write(&script, lua).ok()?;
    let out = Command::new("wrk")
        .args([
            &format!("-t{threads}"),
            "-c32",
            &format!("-d{seconds}s"),
            "--latency",
            "-s",
        ])
        .arg(&script)
        .arg(format!("{url}/"))
        .output()
        .map_err(|e| eprintln!("wrk: {e} (apt-get install wrk)"))
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let num = |prefix: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.trim_start().starts_with(prefix))?;
        let v = line.trim_start()[prefix.len()..]
            .split_whitespace()
            .next()?;
        parse_ms(v).or_else(|| v.parse().ok())
    };
    if text.contains("Non-2xx") || text.contains("Socket errors") {
        eprintln!("wrk saw errors against {url}:\n{text}");
    }
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())?;
    Some(Send {
        rps: num("Requests/sec:")?,
        p50_ms: num("50%")?,
        p99_ms: num("99%")?,
        requests,
        cpu_us: None,
        worker_cpu_us: None,
    })
}

// ── SendMessage at a fixed rate: latency below saturation ──────────────────

/// Latency of `SendMessage` offered at a fixed rate (open loop: each
/// request has a scheduled time, and when the connection is still waiting
/// for the previous answer at that time, its latency counts from then, so a
/// slow answer cannot hide the requests queued behind it). When the
/// connection is free, latency counts from the moment the request is
/// written: the driver's own timer wakes up to a millisecond late (tokio's
/// timer granularity), and that lateness is the driver's, not the proxy's.
struct Fixed {
    offered: f64,
    p50_ms: f64,
    p99_ms: f64,
}

const FIXED_CONNS: usize = 16;
/// The fixed-rate runs are paired and interleaved: [`FIXED_SLICES`] slices
/// of [`FIXED_SLICE_SECONDS`] each, every column once per slice in turn, and
/// each of those runs at the same time as a run against bare pingora, each
/// offered half of the rate. Taken one after the other, a column's p99 moved
/// by up to 100 ms between two slices seconds apart on this machine (direct
/// included: the shared cores stall the worker now and then), a thousand
/// times the 0.2 ms to be shown; run at the same moments against the same
/// worker, the two sides of a pair meet the same stalls, and a second bare
/// pingora paired with the first shows what is left of the noise. Even so,
/// end to end the noise exceeds 0.2 ms in most runs; the time inside each
/// proxy (`a2agw_proxy_seconds`) leaves the worker's stalls out.
const FIXED_SLICES: usize = 10;
const FIXED_SLICE_SECONDS: f64 = 1.5;

/// Offers `rate` SendMessage/s for `seconds` over [`FIXED_CONNS`]
/// keep-alive connections, each sending on its own schedule; returns every
/// request's latency.
async fn fixed_rate(url: &str, rate: f64, seconds: f64) -> Result<Vec<Duration>, String> {
    fixed_rate_body(url, &send_body(1), rate, seconds).await
}

/// [`fixed_rate`] posting `body`.
async fn fixed_rate_body(
    url: &str,
    body: &str,
    rate: f64,
    seconds: f64,
) -> Result<Vec<Duration>, String> {
    use tokio::io::AsyncWriteExt;
    let (authority, base) = harness::http::split_url(url);
    let req = format!(
        "POST {base}/ HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\na2a-version: 1.0\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let period = Duration::from_secs_f64(FIXED_CONNS as f64 / rate);
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let end = start + Duration::from_secs_f64(seconds);
    let conns = (0..FIXED_CONNS).map(|i| {
        let (authority, req) = (authority.clone(), req.clone());
        async move {
            let mut sock = tokio::net::TcpStream::connect(&authority)
                .await
                .map_err(|e| e.to_string())?;
            sock.set_nodelay(true).map_err(|e| e.to_string())?;
            let mut lat = Vec::new();
            let mut buf = Vec::with_capacity(4096);
            let mut at = start + period.mul_f64(i as f64 / FIXED_CONNS as f64);
            // When the previous answer on this connection arrived.
            let mut free_at = start;
            while at < end {
                tokio::time::sleep_until(at).await;
                // Free at its time: any wait since `at` is the timer's.
                // Still busy at `at`: the previous answer came late, so this
                // one counts from its schedule, as an open-loop client's.
                let from = if free_at > at {
                    at
                } else {
                    tokio::time::Instant::now()
                };
                sock.write_all(req.as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                buf.clear();
                read_response(&mut sock, &mut buf).await?;
                free_at = tokio::time::Instant::now();
                lat.push(free_at - from);
                at += period;
            }
            let _ = sock.shutdown().await;
            Ok::<_, String>(lat)
        }
    });
    let mut all = Vec::new();
    for r in futures_util::future::join_all(conns).await {
        all.extend(r?);
    }
    if all.is_empty() {
        return Err("no answers".into());
    }
    Ok(all)
}

/// Percentiles of latencies (sorted in place) at a rate offered.
fn summarise(lat: &mut [Duration], rate: f64) -> Fixed {
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
    Fixed {
        offered: rate,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
    }
}

/// Reads one HTTP/1.1 response (Content-Length or chunked).
async fn read_response(sock: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..h]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 200") {
                return Err(format!("answer: {}", head.lines().next().unwrap_or("")));
            }
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            let done = match len {
                Some(n) => buf.len() >= h + 4 + n,
                None => buf.ends_with(b"0\r\n\r\n"),
            };
            if done {
                return Ok(());
            }
        }
        let n = sock.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// wrk prints latencies as `1.23ms`, `456.00us`, `1.01s`.
fn parse_ms(v: &str) -> Option<f64> {
    if let Some(x) = v.strip_suffix("us") {
        return x.parse::<f64>().ok().map(|x| x / 1000.0);
    }
    if let Some(x) = v.strip_suffix("ms") {
        return x.parse().ok();
    }
    if let Some(x) = v.strip_suffix('s') {
        return x.parse::<f64>().ok().map(|x| x * 1000.0);
    }
    None
}

// ── SSE ─────────────────────────────────────────────────────────────────────

async fn sse_events_per_sec(url: &str) -> f64 {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..STREAMS {
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            let (mut stream, _id) =
                send_stream(&url, Bind::JsonRpc, None, &format!("burst:{BURST}")).await;
            1 + stream.rest(Duration::from_secs(60)).await.len()
        }));
    }
    let mut events = 0;
    for t in tasks {
        events += t.await.expect("stream task");
    }
    events as f64 / start.elapsed().as_secs_f64()
}

// ── WebSocket request/response loops ────────────────────────────────────────

struct Ws {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// What one socket did: round-trip times (µs) and JSON-RPC errors.
type SocketRun = Result<(Vec<u32>, usize), String>;

/// One socket: `SendMessage` `quick`, wait for the answer with its id,
/// again, until `until`.
async fn ws_socket(url: String, until: Instant) -> SocketRun {
    let mut ws = connect(&url).await?;
    let mut rtts = Vec::new();
    let mut errors = 0;
    let mut id = 0u64;
    while Instant::now() < until {
        id += 1;
        let sent = Instant::now();
        let answer = round_trip(&mut ws, id, send_body(id))
            .await
            .map_err(|e| format!("{e} (after {} round trips)", rtts.len()))?;
        if answer.get("error").is_some() {
            errors += 1;
        }
        rtts.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
    }
    let _ = ws.close(None).await;
    Ok((rtts, errors))
}

async fn ws_round_trips(url: &str, run: Duration) -> Result<Ws, String> {
    let start = Instant::now();
    let until = start + run;
    let sockets: Vec<_> = (0..WS_SOCKETS)
        .map(|_| tokio::spawn(ws_socket(url.to_string(), until)))
        .collect();
    let mut rtts = Vec::new();
    let mut errors = 0;
    for s in sockets {
        let (r, e) = s.await.map_err(|e| e.to_string())??;
        rtts.extend(r);
        errors += e;
    }
    let secs = start.elapsed().as_secs_f64();
    if errors > 0 {
        eprintln!("WebSocket: {errors} JSON-RPC errors against {url}");
    }
    if rtts.is_empty() {
        return Err("no round trips".into());
    }
    rtts.sort_unstable();
    let pct = |p: f64| f64::from(rtts[((rtts.len() - 1) as f64 * p) as usize]) / 1000.0;
    Ok(Ws {
        per_sec: rtts.len() as f64 / secs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
    })
}

// ── Child processes: nginx, bare pingora ────────────────────────────────────

/// A proxy process this bench started; stopped on drop.
struct Proc {
    child: Child,
    /// Send SIGQUIT and wait (nginx: its workers outlive a SIGKILLed master).
    graceful: bool,
    log: PathBuf,
}

impl Proc {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Until every address accepts a connection, or the process exits.
    async fn wait_ready(&mut self, addrs: &[String]) -> Result<(), String> {
        for _ in 0..200 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited ({status}):\n{}", self.log_text()));
            }
            let mut up = true;
            for a in addrs {
                up &= tokio::net::TcpStream::connect(a.as_str()).await.is_ok();
            }
            if up {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(format!("did not listen within 5 s:\n{}", self.log_text()))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.graceful {
            let _ = Command::new("kill")
                .args(["-QUIT", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// The bare pass-through on a free port in front of `upstream` (`HOST:PORT`),
/// with its `/metrics` on another: the process, the proxy's address and the
/// metrics' URL.
async fn start_bare(upstream: &str) -> Result<(Proc, String, String), String> {
    start_bare_with(upstream, &[]).await
}

/// [`start_bare`] with `extra` arguments (e.g. [`bare_pingora::PINGORA_CORE_POOL`]).
async fn start_bare_with(upstream: &str, extra: &[&str]) -> Result<(Proc, String, String), String> {
    start_bare_env(upstream, extra, &[]).await
}

/// [`start_bare_with`] with more environment variables (the allocation
/// counter's).
async fn start_bare_env(
    upstream: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<(Proc, String, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = scratch_dir("bare").join("bare.log");
    let stderr = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let child = Command::new(exe)
        .arg(bare_pingora::FLAG)
        .args(["--listen", &listen, "--upstream", upstream])
        .args([bare_pingora::METRICS, &metrics])
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("spawn bare pingora: {e}"))?;
    let mut p = Proc {
        child,
        graceful: false,
        log,
    };
    p.wait_ready(&[listen.clone(), metrics.clone()])
        .await
        .map_err(|e| format!("bare pingora {e}"))?;
    Ok((p, listen, format!("http://{metrics}")))
}

/// nginx with two server blocks: HTTP (buffering off) to `http_up`, and
/// WebSocket upgrades to `ws_up`. Returns the process and both addresses.
async fn start_nginx(http_up: &str, ws_up: &str) -> Result<(Proc, String, String), String> {
    if !Path::new(NGINX).exists() {
        return Err("nginx not installed (apt-get install nginx-light)".into());
    }
    let dir = scratch_dir("nginx");
    let http_listen = format!("127.0.0.1:{}", free_port());
    let ws_listen = format!("127.0.0.1:{}", free_port());
    let d = dir.display();
    // As root nginx would hand its workers to `nobody`; keep the current user.
    let is_root = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    };
    let user = if is_root { "user root;\n" } else { "" };
    let conf = format!(
        r#"{user}worker_processes 2;
daemon off;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    # wrk's connections live for the whole run, as pingora's do.
    keepalive_requests 1000000;
    upstream worker {{ server {http_up}; keepalive 64; keepalive_requests 1000000; }}
    upstream worker_ws {{ server {ws_up}; }}
    server {{
        listen {http_listen};
        location / {{
            proxy_pass http://worker;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
    server {{
        listen {ws_listen};
        location / {{
            proxy_pass http://worker_ws;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout 300s;
        }}
    }}
}}
"#
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
    let log = dir.join("error.log");
    let stderr = std::fs::File::create(dir.join("stderr.log")).map_err(|e| e.to_string())?;
    let child = Command::new(NGINX)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("spawn nginx: {e}"))?;
    let mut p = Proc {
        child,
        graceful: true,
        log,
    };
    p.wait_ready(&[http_listen.clone(), ws_listen.clone()])
        .await
        .map_err(|e| format!("nginx {e}"))?;
    Ok((p, http_listen, ws_listen))
}

// ── Targets and rounds ──────────────────────────────────────────────────────

/// Where one column's load goes: `http`, the base URL for the HTTP
/// bindings; `ws`, the WebSocket URL that reaches the worker's `/ws`.
struct Target {
    http: String,
    ws: String,
    /// The processes serving `http` whose CPU time counts as the proxy's
    /// (nginx: its master, whose workers are found as its children).
    procs: Vec<u32>,
    /// Where the proxy serves `/metrics` with its `a2agw_proxy_seconds`
    /// (the gateway's admin endpoint; bare pingora's `--metrics`).
    metrics: Option<String>,
    /// The log of the gateway serving `ws` (named when a socket fails).
    ws_log: Option<PathBuf>,
}

/// CPU time (user + system, in clock ticks of 1/100 s, Linux's `USER_HZ`)
/// of `pids` and their child processes, from `/proc`.
fn cpu_ticks(pids: &[u32]) -> Option<u64> {
    let mut all = pids.to_vec();
    for p in pids {
        let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).ok()?;
        all.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    let mut ticks = 0;
    for p in all {
        ticks += stat_ticks(&std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?)?;
    }
    Some(ticks)
}

/// utime + stime from a `/proc/.../stat` line.
fn stat_ticks(stat: &str) -> Option<u64> {
    // Fields after the command (which may hold spaces) in parentheses:
    // utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// CPU time (clock ticks) of this process's threads named
/// [`WORKER_THREAD`]: the worker's runtime.
fn worker_ticks() -> Option<u64> {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // the thread has just exited
        };
        if comm.trim_end() == WORKER_THREAD {
            ticks += stat_ticks(&std::fs::read_to_string(dir.join("stat")).ok()?)?;
        }
    }
    Some(ticks)
}

const USER_HZ: f64 = 100.0;

/// One column's best figures over the rounds (a round whose run was slowed
/// by someone else's build on the shared cores loses to the other).
#[derive(Default)]
struct Column {
    send: Option<Send>,
    sse: Option<f64>,
    ws: Option<Ws>,
    /// At a fixed rate, this column's side of its pairs with bare pingora.
    fixed: Option<Fixed>,
    /// Bare pingora's side of the same pairs.
    fixed_bare: Option<Fixed>,
    /// The gRPC rows (`benches/grpc.rs`); `None`: not run for this column.
    grpc: Option<grpc::GrpcCol>,
    /// Per slice: this column's p99 minus bare pingora's in the same pair (ms).
    slice_p99_diff: Vec<f64>,
    /// This column's proxy's `a2agw_proxy_seconds` over its fixed-rate
    /// slices (for bare pingora: the second bare process's).
    own: Option<Hist>,
    /// Bare pingora's over the same slices.
    own_bare: Option<Hist>,
}

fn ws_of(base: &str) -> String {
    format!("{}/ws", base.replacen("http://", "ws://", 1))
}

/// The two gateways a column needs (HTTP route, WebSocket route); `store` is
/// a `[store]` table, or nothing for memory; `route_extra`, more route keys.
async fn gateways(
    store: &str,
    route_extra: &str,
    http_up: &str,
    ws_up: &str,
) -> (Gateway, Gateway, Target) {
    let route = |worker: &str| {
        format!("{store}\n[[routes]]\nname = \"w\"\nworker = \"{worker}\"\n{route_extra}\n")
    };
    let gw = Gateway::start(&route(http_up)).await;
    let gw_ws = Gateway::start(&route(ws_up)).await;
    let target = Target {
        http: gw.url.clone(),
        ws: ws_of(&gw_ws.url),
        procs: gw.pid().into_iter().collect(),
        metrics: Some(gw.admin.clone()),
        ws_log: Some(gw_ws.log.clone()),
    };
    (gw, gw_ws, target)
}

async fn wrk_blocking(url: &str, seconds: u32) -> Option<Send> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || wrk_send(&url, seconds))
        .await
        .expect("wrk")
}

/// [`wrk_blocking`] against `t`, with the CPU its processes and the
/// worker spent.
async fn wrk_target(t: &Target, seconds: u32) -> Option<Send> {
    let per_request = |ticks: u64, requests: f64| ticks as f64 / USER_HZ * 1e6 / requests.max(1.0);
    let proxy_before = (!t.procs.is_empty()).then(|| cpu_ticks(&t.procs)).flatten();
    let worker_before = worker_ticks();
    let mut s = wrk_blocking(&t.http, seconds).await?;
    if let (Some(b), Some(a)) = (proxy_before, cpu_ticks(&t.procs)) {
        s.cpu_us = Some(per_request(a - b, s.requests));
    }
    if let (Some(b), Some(a)) = (worker_before, worker_ticks()) {
        s.worker_cpu_us = Some(per_request(a - b, s.requests));
    }
    Some(s)
}

/// Every scenario against every target, scenario by scenario (so the
/// columns of a row are measured within seconds of each other), `ROUNDS`
/// times; the first round starts with a warm-up of each.
/// `bare_twin`: a second bare pingora process, the bare column's side of its
/// fixed-rate pairs (so that pairing bare with bare measures the method's
/// noise between two processes, as every other pair is).
async fn run_rounds(
    targets: &[Option<&Target>],
    bare_twin: Option<&Target>,
) -> (Vec<Column>, String) {
    let mut cols: Vec<Column> = targets.iter().map(|_| Column::default()).collect();
    for round in 0..ROUNDS {
        let warm = round == 0;
        eprintln!("round {}/{ROUNDS}: SendMessage", round + 1);
        for (t, col) in targets.iter().zip(&mut cols) {
            let Some(t) = t else { continue };
            if warm {
                let _ = wrk_blocking(&t.http, SEND_WARMUP_SECONDS).await;
            }
            if let Some(s) = wrk_target(t, SEND_SECONDS).await {
                if col.send.as_ref().is_none_or(|b| s.rps > b.rps) {
                    col.send = Some(s);
                }
            }
        }
        eprintln!("round {}/{ROUNDS}: SSE", round + 1);
        for (t, col) in targets.iter().zip(&mut cols) {
            let Some(t) = t else { continue };
            if warm {
                let _ = sse_events_per_sec(&t.http).await;
            }
            for _ in 0..SSE_REPEATS {
                let e = sse_events_per_sec(&t.http).await;
                col.sse = Some(col.sse.map_or(e, |b| b.max(e)));
            }
        }
        eprintln!("round {}/{ROUNDS}: WebSocket", round + 1);
        for (t, col) in targets.iter().zip(&mut cols) {
            let Some(t) = t else { continue };
            if warm {
                let _ = ws_round_trips(&t.ws, WS_WARMUP).await;
            }
            match ws_round_trips(&t.ws, Duration::from_secs(WS_SECONDS)).await {
                Ok(w) => {
                    if col.ws.as_ref().is_none_or(|b| w.per_sec > b.per_sec) {
                        col.ws = Some(w);
                    }
                }
                Err(e) => match &t.ws_log {
                    Some(log) => eprintln!(
                        "WebSocket against {}: {e} (the gateway's log: {})",
                        t.ws,
                        log.display()
                    ),
                    None => eprintln!("WebSocket against {}: {e}", t.ws),
                },
            }
        }
    }
    // Latency at half of the bare pass-through's saturation, each column
    // paired with bare pingora (see FIXED_SLICES).
    let bare_rps = cols.get(2).and_then(|c| c.send.as_ref()).map(|s| s.rps);
    let mut steal = "not run".to_string();
    if let (Some(rate), Some(Some(bare))) = (bare_rps.map(|r| (r / 2.0).floor()), targets.get(2)) {
        let before = machine_ticks();
        let mut sides = targets.to_vec();
        if bare_twin.is_some() {
            sides[2] = bare_twin;
        }
        fixed_rate_pairs(&sides, bare, rate, &mut cols).await;
        steal = steal_pct(before, machine_ticks());
    }
    (cols, steal)
}

/// SendMessage through bare pingora (`bare`, the vendored pingora-proxy's
/// upstream pool) and through bare pingora with pingora-core's own pool
/// (`published`), in `ROUNDS` interleaved rounds: the best round of each,
/// in that order. What the vendored pool changes, measured as the table is.
async fn published_rounds(bare: &Target, published: &Target) -> Option<(Send, Send)> {
    eprintln!("SendMessage: bare pingora with pingora-core's pool against the vendored pool");
    let _ = wrk_blocking(&published.http, SEND_WARMUP_SECONDS).await;
    let (mut best_b, mut best_p): (Option<Send>, Option<Send>) = (None, None);
    for _ in 0..ROUNDS {
        for (t, best) in [(published, &mut best_p), (bare, &mut best_b)] {
            if let Some(s) = wrk_target(t, SEND_SECONDS).await {
                if best.as_ref().is_none_or(|b| s.rps > b.rps) {
                    *best = Some(s);
                }
            }
        }
    }
    Some((best_b?, best_p?))
}

/// Offers `rate` SendMessage/s in all, half to a column and half to bare
/// pingora at the same time, slice by slice and column by column; fills the
/// columns' `fixed`, `fixed_bare` and `slice_p99_diff`.
async fn fixed_rate_pairs(
    targets: &[Option<&Target>],
    bare: &Target,
    rate: f64,
    cols: &mut [Column],
) {
    let half = rate / 2.0;
    eprintln!(
        "fixed rate: {rate} SendMessage/s, {half} to each side of a pair, {FIXED_SLICES} slices"
    );
    let mut lat: Vec<[Vec<Duration>; 2]> = targets.iter().map(|_| Default::default()).collect();
    for _ in 0..FIXED_SLICES {
        for (i, t) in targets.iter().enumerate() {
            let Some(t) = t else { continue };
            let before = (proxy_seconds(t).await, proxy_seconds(bare).await);
            let (col, base) = tokio::join!(
                fixed_rate(&t.http, half, FIXED_SLICE_SECONDS),
                fixed_rate(&bare.http, half, FIXED_SLICE_SECONDS)
            );
            let after = (proxy_seconds(t).await, proxy_seconds(bare).await);
            add_delta(&mut cols[i].own, after.0, before.0);
            add_delta(&mut cols[i].own_bare, after.1, before.1);
            match (col, base) {
                (Ok(mut c), Ok(mut b)) => {
                    let d = summarise(&mut c, half).p99_ms - summarise(&mut b, half).p99_ms;
                    cols[i].slice_p99_diff.push(d);
                    lat[i][0].extend(c);
                    lat[i][1].extend(b);
                }
                (Err(e), _) => eprintln!("fixed rate against {}: {e}", t.http),
                (_, Err(e)) => eprintln!("fixed rate against {}: {e}", bare.http),
            }
        }
    }
    for ([c, b], col) in lat.iter_mut().zip(cols) {
        if !c.is_empty() {
            col.fixed = Some(summarise(c, half));
            col.fixed_bare = Some(summarise(b, half));
        }
    }
}

/// Cumulative bucket counts of `a2agw_proxy_seconds`, by upper bound (s),
/// ascending, the last one infinite.
type Hist = Vec<(f64, f64)>;

/// `a2agw_proxy_seconds` from a proxy's `/metrics`, summed over its labels;
/// `None` for a proxy without it (direct, nginx) or that did not answer.
async fn proxy_seconds(t: &Target) -> Option<Hist> {
    let url = t.metrics.as_deref()?;
    let text = harness::http::request("GET", url, "/metrics", &[], b"")
        .await
        .text();
    let mut h: Hist = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("a2agw_proxy_seconds_bucket{"))
    {
        let le = line.split("le=\"").nth(1)?.split('"').next()?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let n: f64 = line.rsplit(' ').next()?.parse().ok()?;
        match h.iter_mut().find(|(b, _)| *b == le) {
            Some(bucket) => bucket.1 += n,
            None => h.push((le, n)),
        }
    }
    h.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!h.is_empty()).then_some(h)
}

/// Adds `after - before` (both from [`proxy_seconds`]) to `acc`.
fn add_delta(acc: &mut Option<Hist>, after: Option<Hist>, before: Option<Hist>) {
    let (Some(after), Some(before)) = (after, before) else {
        return;
    };
    let delta = after
        .iter()
        .map(|&(le, n)| {
            let was = before.iter().find(|(b, _)| *b == le).map_or(0.0, |b| b.1);
            (le, n - was)
        })
        .collect::<Hist>();
    match acc {
        Some(sum) if sum.len() == delta.len() => {
            for (s, d) in sum.iter_mut().zip(&delta) {
                s.1 += d.1;
            }
        }
        _ => *acc = Some(delta),
    }
}

/// The `q` quantile of `h` in µs, interpolated linearly inside its bucket
/// (as Prometheus' `histogram_quantile`); a quantile in the last, unbounded
/// bucket reads as the last finite bound.
fn quantile_us(h: &Hist, q: f64) -> Option<f64> {
    let total = h.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lo, mut below) = (0.0, 0.0);
    for &(le, n) in h {
        if n >= rank {
            if le.is_infinite() {
                return Some(lo * 1e6);
            }
            let frac = if n > below {
                (rank - below) / (n - below)
            } else {
                0.0
            };
            return Some((lo + (le - lo) * frac) * 1e6);
        }
        (lo, below) = (le, n);
    }
    None
}

/// The share of `h` (%) at or under `bound` seconds, one of its bounds.
fn share_within(h: &Hist, bound: f64) -> Option<f64> {
    let total = h.last()?.1;
    let n = h.iter().find(|(le, _)| (*le - bound).abs() < 1e-9)?.1;
    (total > 0.0).then(|| 100.0 * n / total)
}

/// The p99 of the time inside a column's proxy minus bare pingora's over
/// the same slices (µs).
fn own_added_p99(c: &Column) -> Option<f64> {
    Some(quantile_us(c.own.as_ref()?, 0.99)? - quantile_us(c.own_bare.as_ref()?, 0.99)?)
}

/// A percentile (`pct`) of a column at the fixed rate minus bare pingora's
/// at the same moments, all slices pooled (ms).
fn added(c: &Column, pct: fn(&Fixed) -> f64) -> Option<f64> {
    Some(pct(c.fixed.as_ref()?) - pct(c.fixed_bare.as_ref()?))
}

/// [`added`] for the p99, which the summary lines print too.
fn added_p99(c: &Column) -> Option<f64> {
    added(c, |f| f.p99_ms)
}

/// Median, least and greatest of `d`.
fn median_range(d: &[f64]) -> Option<(f64, f64, f64)> {
    let mut d = d.to_vec();
    if d.is_empty() {
        return None;
    }
    d.sort_by(f64::total_cmp);
    let n = d.len();
    let med = if n % 2 == 1 {
        d[n / 2]
    } else {
        (d[n / 2 - 1] + d[n / 2]) / 2.0
    };
    Some((med, d[0], d[n - 1]))
}

// ── The table ───────────────────────────────────────────────────────────────

type Cell = Result<Column, String>;

/// The table; with `only_grpc`, only the gRPC rows (`-- --grpc`).
fn print_table(cols: &[(&str, &Cell)], only_grpc: bool) {
    let [direct, nginx, bare, mem, redis, carry] = cols else {
        unreachable!("six columns")
    };
    let mut header = String::from("| scenario |");
    for (name, _) in cols {
        header.push_str(&format!(" {name} |"));
    }
    header.push_str(
        " gw mem / bare | gw Redis / bare | gw stream / bare | gw mem / nginx | gw stream / nginx | gw mem / direct | nginx / direct |",
    );
    println!("{header}");
    println!("|{}", "---|".repeat(cols.len() + 8));

    type Get = fn(&Column) -> Option<f64>;
    // (label, figure, decimals, whether ratios of it mean anything)
    let rows: Vec<(String, Get, usize, bool)> = vec![
        (
            format!("SendMessage req/s (JSON-RPC ~1 KB, wrk -t2 -c32, {SEND_SECONDS}s)"),
            |c| c.send.as_ref().map(|s| s.rps),
            0,
            true,
        ),
        (
            "SendMessage p50 (ms)".into(),
            |c| c.send.as_ref().map(|s| s.p50_ms),
            2,
            true,
        ),
        (
            "SendMessage p99 (ms)".into(),
            |c| c.send.as_ref().map(|s| s.p99_ms),
            2,
            true,
        ),
        (
            "SendMessage: the proxy's CPU per request (µs, user + system)".into(),
            |c| c.send.as_ref().and_then(|s| s.cpu_us),
            0,
            true,
        ),
        (
            "SendMessage: the worker's CPU per request (µs, its runtime's threads, same runs)".into(),
            |c| c.send.as_ref().and_then(|s| s.worker_cpu_us),
            0,
            true,
        ),
        (
            format!("SendMessage at half of bare's saturation, p50 (ms; open loop, half the rate to the column and half to bare pingora at the same moments, {FIXED_CONNS} conns each, {FIXED_SLICES} slices of {FIXED_SLICE_SECONDS}s)"),
            |c| c.fixed.as_ref().map(|f| f.p50_ms),
            2,
            true,
        ),
        (
            "… p50 minus bare pingora's p50 at the same moments (ms; bare column: a second bare pingora process against the first)".into(),
            |c| added(c, |f| f.p50_ms),
            2,
            false,
        ),
        (
            "SendMessage at half of bare's saturation, p99 (ms)".into(),
            |c| c.fixed.as_ref().map(|f| f.p99_ms),
            2,
            true,
        ),
        (
            "… p99 minus bare pingora's p99 at the same moments (ms; bare column: a second bare pingora process against the first, the method's own noise)".into(),
            added_p99,
            2,
            false,
        ),
        (
            "… time inside the proxy per SendMessage at that rate, p50 (µs; pingora included, the worker's time left out: the proxy's own `a2agw_proxy_seconds`, interpolated in its buckets)".into(),
            |c| quantile_us(c.own.as_ref()?, 0.5),
            0,
            true,
        ),
        (
            "… time inside the proxy, p99 (µs)".into(),
            |c| quantile_us(c.own.as_ref()?, 0.99),
            0,
            true,
        ),
        (
            "… time inside the proxy, p99 minus bare pingora's at the same moments (µs; bare column: a second bare pingora process against the first, the method's own noise)".into(),
            own_added_p99,
            0,
            false,
        ),
        (
            format!("SSE events/s ({STREAMS} streams x {BURST} events, tracked)"),
            |c| c.sse,
            0,
            true,
        ),
        (
            format!("WebSocket SendMessage round trips/s ({WS_SOCKETS} sockets, 1 in flight, {WS_SECONDS}s)"),
            |c| c.ws.as_ref().map(|w| w.per_sec),
            0,
            true,
        ),
        (
            "WebSocket round trip p50 (ms)".into(),
            |c| c.ws.as_ref().map(|w| w.p50_ms),
            2,
            true,
        ),
        (
            "WebSocket round trip p99 (ms)".into(),
            |c| c.ws.as_ref().map(|w| w.p99_ms),
            2,
            true,
        ),
    ];
    let grpc_rows: Vec<(String, Get, usize, bool)> = vec![
        (
            format!(
                "gRPC SendMessage calls/s (unary, ~1 KB, h2c, {} conns x {} streams; median of {} slices of {}s, each running every column, order rotating)",
                grpc::UNARY_CONNS,
                grpc::UNARY_STREAMS,
                grpc::UNARY_SLICES,
                grpc::UNARY_SECONDS
            ),
            |c| Some(c.grpc.as_ref()?.unary.as_ref()?.per_sec),
            0,
            true,
        ),
        (
            "… the column's calls/s over bare pingora's in the same slice (median of the slices)".into(),
            |c| c.grpc.as_ref()?.unary_vs_bare,
            2,
            false,
        ),
        (
            "gRPC SendMessage p50 (ms)".into(),
            |c| Some(c.grpc.as_ref()?.unary.as_ref()?.p50_ms),
            2,
            true,
        ),
        (
            "gRPC SendMessage p99 (ms)".into(),
            |c| Some(c.grpc.as_ref()?.unary.as_ref()?.p99_ms),
            2,
            true,
        ),
        (
            "gRPC SendMessage: the proxy's CPU per call (µs, user + system)".into(),
            |c| c.grpc.as_ref()?.unary.as_ref()?.cpu_us,
            0,
            true,
        ),
        (
            "gRPC SendMessage: the worker's CPU per call (µs, same runs)".into(),
            |c| c.grpc.as_ref()?.unary.as_ref()?.worker_cpu_us,
            0,
            true,
        ),
        (
            format!(
                "gRPC SendStreamingMessage messages/s ({} conns x {} slots streaming `burst:{}` one after another, {}s, tracked)",
                grpc::STREAM_CONNS,
                grpc::STREAM_STREAMS,
                grpc::BURST,
                grpc::STREAM_SECONDS
            ),
            |c| c.grpc.as_ref()?.stream_per_sec,
            0,
            true,
        ),
        (
            "gRPC stream: the proxy's CPU per message (µs, all streaming runs)".into(),
            |c| c.grpc.as_ref()?.stream_cpu_us(),
            2,
            true,
        ),
        (
            format!(
                "gRPC heap allocations per stream message (glibc `malloc`, `burst:{}` minus `burst:0`)",
                grpc::BURST
            ),
            |c| Some(c.grpc.as_ref()?.allocs.as_ref()?.as_ref().ok()?.per_message),
            2,
            false,
        ),
        (
            format!(
                "gRPC heap allocations per SendMessage call ({} calls, one at a time)",
                grpc::ALLOC_CALLS
            ),
            |c| Some(c.grpc.as_ref()?.allocs.as_ref()?.as_ref().ok()?.per_call),
            1,
            true,
        ),
    ];
    let all = rows
        .iter()
        .map(|r| (r, false))
        .chain(grpc_rows.iter().map(|r| (r, true)))
        .filter(|(_, is_grpc)| *is_grpc || !only_grpc);
    for ((label, get, digits, ratios), is_grpc) in all {
        let val = |cell: &Cell| cell.as_ref().ok().and_then(get);
        let mut line = format!("| {label} |");
        for (_, cell) in cols {
            match (cell, val(cell)) {
                (_, Some(v)) => line.push_str(&format!(" {v:.digits$} |")),
                (Err(e), None) => line.push_str(&format!(" {e} |")),
                (Ok(c), None) if is_grpc => match &c.grpc {
                    None => line.push_str(" not run |"),
                    Some(gc) => match (&gc.error, &gc.allocs) {
                        (Some(_), _) => line.push_str(" failed (see stderr) |"),
                        (None, Some(Err(_))) if label.contains("allocations") => {
                            line.push_str(" failed (see stderr) |")
                        }
                        _ => line.push_str(" n/a |"),
                    },
                },
                (Ok(_), None) => line.push_str(" n/a |"),
            }
        }
        let ratio = |a: &Cell, b: &Cell| match (val(a), val(b)) {
            (Some(a), Some(b)) if *ratios && b > 0.0 => format!(" {:.2} |", a / b),
            _ => " - |".to_string(),
        };
        line.push_str(&ratio(mem.1, bare.1));
        line.push_str(&ratio(redis.1, bare.1));
        line.push_str(&ratio(carry.1, bare.1));
        line.push_str(&ratio(mem.1, nginx.1));
        line.push_str(&ratio(carry.1, nginx.1));
        line.push_str(&ratio(mem.1, direct.1));
        line.push_str(&ratio(nginx.1, direct.1));
        println!("{line}");
    }
}

/// The argument that starts the worker, bare pingora and a gateway (memory
/// store), prints their addresses and keeps them up until SIGINT or SIGTERM
/// (which stops them all): for profiling one of them by hand (`wrk`,
/// `valgrind`, `perf`) against the same parts the bench measures.
/// `cargo bench -p a2a-gateway --bench proxy -- --serve`.
const SERVE_FLAG: &str = "--serve";

/// The name of the worker runtime's threads, by which the bench finds the
/// worker's CPU time among its own threads.
const WORKER_THREAD: &str = "bench-worker";

/// The worker's runtime: one thread of its own.
fn worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(WORKER_THREAD)
        .enable_all()
        .build()
        .expect("worker runtime")
}

/// The load drivers' and process handles' runtime, on the calling thread.
fn driver_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("driver runtime")
}

fn serve() -> ! {
    harness::gateway::product_log_unless_set();
    let worker_rt = worker_runtime();
    let worker = worker_rt.block_on(RustWorker::start_with_grpc(RustWorkerOptions {
        websocket: true,
        ..RustWorkerOptions::default()
    }));
    let rt = driver_runtime();
    rt.block_on(async {
        let url = worker.url();
        let grpc_up = authority(&worker.grpc_url());
        let (grpc_procs, grpc) = grpc_targets(&grpc_up).await;
        let ws_up = authority(&worker.ws_url().expect("the worker's WebSocket listener"));
        let (bare_proc, bare, bare_metrics) =
            start_bare(&authority(&url)).await.expect("bare pingora");
        let (bare_ws_proc, bare_ws, _) = start_bare(&ws_up).await.expect("bare pingora");
        let route = |worker: &str| format!("[[routes]]\nname = \"w\"\nworker = \"{worker}\"\n");
        let mut gw = Gateway::start(&route(&url)).await;
        let mut gw_ws = Gateway::start(&route(&format!("http://{ws_up}"))).await;
        println!("worker       {url} (WebSocket ws://{ws_up}/ws)");
        println!(
            "bare pingora http://{bare} (metrics {bare_metrics}; WebSocket ws://{bare_ws}/ws)"
        );
        println!(
            "gateway      {} (pid {:?}, admin {}; WebSocket {}, log {})",
            gw.url,
            gw.pid(),
            gw.admin,
            ws_of(&gw_ws.url),
            gw_ws.log.display()
        );
        println!(
            "gRPC (h2c): worker {grpc_up}, bare pingora {}, gateway {} (pid {:?})",
            grpc.bare.as_ref().map_or("failed", |t| t.addr.as_str()),
            grpc.gateway.addr,
            grpc.gateway.procs.first()
        );
        println!("SendMessage body: {}", send_body(1));
        // Until SIGINT or SIGTERM; then the children go too.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        drop(bare_proc);
        drop(bare_ws_proc);
        grpc_procs.stop().await;
        gw.kill().await;
        gw_ws.kill().await;
    });
    std::process::exit(0)
}

/// The gRPC rows' targets: direct (the worker's gRPC listener), bare
/// pingora and the gateway (memory) in front of it, in the table's column
/// order (nginx, the Redis and the carrying gateways: not run).
struct GrpcTargets {
    direct: grpc::GrpcTarget,
    bare: Result<grpc::GrpcTarget, String>,
    gateway: grpc::GrpcTarget,
}

impl GrpcTargets {
    fn each(&self) -> [Option<&grpc::GrpcTarget>; 6] {
        [
            Some(&self.direct),
            None,
            self.bare.as_ref().ok(),
            Some(&self.gateway),
            None,
            None,
        ]
    }
}

/// The processes behind [`GrpcTargets`].
struct GrpcProcs {
    bare: Option<Proc>,
    gateway: Gateway,
}

impl GrpcProcs {
    async fn stop(mut self) {
        drop(self.bare.take());
        self.gateway.kill().await;
    }
}

/// Bare pingora and a gateway (memory store, one route) in front of the
/// worker's gRPC listener `up` (`host:port`).
async fn grpc_targets(up: &str) -> (GrpcProcs, GrpcTargets) {
    let bare = start_bare(up).await;
    if let Err(e) = &bare {
        eprintln!("gRPC: {e}");
    }
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"w\"\nworker = \"http://{up}\"\n"
    ))
    .await;
    let targets = GrpcTargets {
        direct: grpc::GrpcTarget {
            addr: up.to_string(),
            procs: Vec::new(),
        },
        bare: bare
            .as_ref()
            .map(|(p, listen, _)| grpc::GrpcTarget {
                addr: listen.clone(),
                procs: vec![p.child.id()],
            })
            .map_err(Clone::clone),
        gateway: grpc::GrpcTarget {
            addr: authority(&gw.url),
            procs: gw.pid().into_iter().collect(),
        },
    };
    let procs = GrpcProcs {
        bare: bare.ok().map(|(p, _, _)| p),
        gateway: gw,
    };
    (procs, targets)
}

/// `-- --grpc`: the gRPC rows alone (worker, bare pingora, gateway on the
/// memory store), printed as the table's gRPC rows.
fn grpc_only() {
    harness::gateway::product_log_unless_set();
    let worker_rt = worker_runtime();
    let worker = worker_rt.block_on(RustWorker::start_with_grpc(RustWorkerOptions::default()));
    let rt = driver_runtime();
    let load_before = loadavg();
    let ticks_before = machine_ticks();
    let started = Instant::now();
    let cells = rt.block_on(async {
        let up = authority(&worker.grpc_url());
        let (procs, targets) = grpc_targets(&up).await;
        let grpc_cols = grpc::rounds(&targets.each(), &up).await;
        let bare_err = targets.bare.as_ref().err().cloned();
        procs.stop().await;
        let mut cells: Vec<Cell> = grpc_cols
            .into_iter()
            .map(|g| {
                if g.is_empty() {
                    Err("not run".to_string())
                } else {
                    Ok(Column {
                        grpc: Some(g),
                        ..Column::default()
                    })
                }
            })
            .collect();
        if let Some(e) = bare_err {
            cells[2] = Err(e
                .lines()
                .next()
                .unwrap_or("bare pingora failed")
                .to_string());
        }
        cells
    });
    let steal = steal_pct(ticks_before, machine_ticks());
    {
        let _in_runtime = worker_rt.enter();
        drop(worker);
    }
    println!();
    println!(
        "proxy bench, gRPC rows only, {} — {}; load average {load_before} before, {} after; {:.0} s; CPU time stolen by the host {steal}",
        utc_now(),
        cpus(),
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "pingora 0.9 (bare and gateway: 2 threads); worker: a2a-rust 0.15 on 1 thread; unary: medians of {} slices; streaming: best of {ROUNDS} rounds",
        grpc::UNARY_SLICES
    );
    println!();
    let cols: Vec<(&str, &Cell)> = COLUMN_NAMES.iter().copied().zip(cells.iter()).collect();
    print_table(&cols, true);
}

/// The table's columns.
const COLUMN_NAMES: [&str; 6] = [
    "direct",
    "nginx",
    "bare pingora",
    "gateway (memory)",
    "gateway (Redis)",
    "gateway (memory, blocking_sends = stream)",
];

/// `-- --replicas`: what task affinity costs (issue 44). The same gateway
/// config (memory store, the defaults) in front of one a2a-rust worker and
/// in front of two replicas of it (`workers`), both workers on the bench's
/// worker runtime: a blocking `SendMessage` (a replicated route picks a
/// replica, and records it with the task) and a `GetTask` of one task (a
/// replicated route reads the task's replica from the store first), each
/// in [`REPLICA_SLICES`] alternating wrk slices; medians of requests/s and
/// of the gateway's CPU per request, and the ratio.
fn replicas_only() {
    harness::gateway::product_log_unless_set();
    let worker_rt = worker_runtime();
    let (w1, w2) = worker_rt.block_on(async {
        (
            RustWorker::start(RustWorkerOptions::default()).await,
            RustWorker::start(RustWorkerOptions::default()).await,
        )
    });
    let rt = driver_runtime();
    let started = Instant::now();
    let rows = rt.block_on(async {
        let single = Gateway::start(&format!(
            "[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
            w1.url()
        ))
        .await;
        let replicated = Gateway::start(&format!(
            "[[routes]]\nname = \"w\"\nworkers = [\"{}\", \"{}\"]\n",
            w1.url(),
            w2.url()
        ))
        .await;
        let mut rows = Vec::new();
        for (what, single_body, replicated_body) in [
            ("SendMessage", send_body(1), send_body(1)),
            (
                "GetTask",
                get_body(&single.url).await,
                get_body(&replicated.url).await,
            ),
        ] {
            let mut cells: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
            for slice in 0..REPLICA_SLICES {
                // Alternating which goes first.
                let order = if slice % 2 == 0 { [0, 1] } else { [1, 0] };
                for k in order {
                    let (gw, body) = if k == 0 {
                        (&single, &single_body)
                    } else {
                        (&replicated, &replicated_body)
                    };
                    let pids: Vec<u32> = gw.pid().into_iter().collect();
                    let before = cpu_ticks(&pids);
                    let (url, body) = (gw.url.clone(), body.clone());
                    let run = tokio::task::spawn_blocking(move || wrk_with(&url, &body, 2, 3))
                        .await
                        .expect("wrk");
                    if let (Some(s), Some(b), Some(a)) = (run, before, cpu_ticks(&pids)) {
                        let cpu = (a - b) as f64 / USER_HZ * 1e6 / s.requests.max(1.0);
                        cells[k].push((s.rps, cpu));
                    }
                }
            }
            rows.push((what, cells));
        }
        rows
    });
    {
        let _in_runtime = worker_rt.enter();
        drop((w1, w2));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    println!();
    println!(
        "proxy bench, replica rows, {} — {}; load average {}; {:.0} s",
        utc_now(),
        cpus(),
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    println!("gateway on the memory store, 2 threads, default config; medians of {REPLICA_SLICES} alternating 3 s slices each");
    println!();
    println!("| row | one worker: req/s | two replicas: req/s | ratio | one worker: gateway CPU/req | two replicas: gateway CPU/req | ratio |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (what, cells) in rows {
        let [mut r1, mut r2] = cells
            .clone()
            .map(|c| c.iter().map(|x| x.0).collect::<Vec<_>>());
        let [mut c1, mut c2] = cells.map(|c| c.iter().map(|x| x.1).collect::<Vec<_>>());
        let (r1, r2, c1, c2) = (
            median(&mut r1),
            median(&mut r2),
            median(&mut c1),
            median(&mut c2),
        );
        println!(
            "| {what} | {r1:.0} | {r2:.0} | {:.2} | {c1:.0} µs | {c2:.0} µs | {:.2} |",
            r2 / r1,
            c2 / c1
        );
    }
}

/// A `GetTask` body for a task started through `gateway` (one `quick`
/// send, JSON-RPC).
async fn get_body(gateway: &str) -> String {
    let (_, id) = send_stream(gateway, Bind::JsonRpc, None, "quick").await;
    serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}})
        .to_string()
}

/// `-- --leavers`: what a caller that leaves a guarded blocking send costs
/// (issue 45). The gateway on the memory store with the default config,
/// in front of the bench's a2a-rust worker, which already holds
/// [`LEAVER_BACKLOG`] settled tasks from the last minutes (as a busy
/// worker does): blocking `SendMessage`s of long tasks whose callers leave
/// (FIN) once the worker runs them, [`LEAVERS_ALONE`] one after another,
/// then [`LEAVERS_TOGETHER`] at once. For each: the time from the caller's
/// leaving to the worker's cancel hook (p50, p99), and the worker calls it
/// cost (`ListTasks` pages from `a2agw_lookup_pages_total`, then one
/// `GetTask` and one `CancelTask` per child).
fn leavers_only() {
    harness::gateway::product_log_unless_set();
    let worker_rt = worker_runtime();
    let worker = worker_rt.block_on(RustWorker::start(RustWorkerOptions::default()));
    let rt = driver_runtime();
    let started = Instant::now();
    let rows = rt.block_on(async {
        let gw = Gateway::start(&format!(
            "[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
            worker.url()
        ))
        .await;
        // The backlog: settled tasks the searches page through.
        let _ = wrk_with(&worker.url(), &send_body(1), 2, 1);
        while worker.tasks_started() < LEAVER_BACKLOG {
            let _ = wrk_with(&worker.url(), &send_body(1), 2, 1);
        }
        let backlog = worker.tasks_started();
        let mut rows = Vec::new();
        for (what, n, together) in [
            ("one at a time", LEAVERS_ALONE, false),
            ("together", LEAVERS_TOGETHER, true),
        ] {
            let pages_before = gw.counter("a2agw_lookup_pages_total", &[]).await;
            let cancels_before = worker.cancel_records().len();
            let mut waits = Vec::new();
            let batches = if together { vec![n] } else { vec![1; n] };
            for size in batches {
                let running = worker.tasks_started();
                let mut socks = Vec::new();
                for _ in 0..size {
                    socks.push(open_blocking_send(&gw.url, "work:60000").await);
                }
                while worker.tasks_started() < running + size {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let seen = worker.cancel_records().len();
                let left = Instant::now();
                for s in socks {
                    drop(s);
                }
                let deadline = Instant::now() + Duration::from_secs(30);
                while worker.cancel_records().len() < seen + size && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                for r in worker.cancel_records().into_iter().skip(seen) {
                    waits.push(r.at.saturating_duration_since(left).as_secs_f64() * 1e3);
                }
            }
            let pages = gw.counter("a2agw_lookup_pages_total", &[]).await - pages_before;
            let cancelled = worker.cancel_records().len() - cancels_before;
            waits.sort_by(f64::total_cmp);
            let pct = |p: f64| {
                waits
                    .get(((waits.len() as f64 * p).ceil() as usize).saturating_sub(1))
                    .copied()
                    .unwrap_or(f64::NAN)
            };
            rows.push((what, n, cancelled, pct(0.5), pct(0.99), pages / n as f64));
        }
        (backlog, rows)
    });
    let (backlog, rows) = rows;
    {
        let _in_runtime = worker_rt.enter();
        drop(worker);
    }
    println!();
    println!(
        "proxy bench, leaver rows, {} — {}; load average {}; {:.0} s",
        utc_now(),
        cpus(),
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "gateway on the memory store, default config; a2a-rust worker holding {backlog} tasks"
    );
    println!();
    println!("| leavers | callers | children cancelled | leaving to cancel, p50 (ms) | p99 (ms) | ListTasks pages per leaver | worker calls per leaver |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (what, n, cancelled, p50, p99, pages) in rows {
        println!(
            "| {what} | {n} | {cancelled} | {p50:.1} | {p99:.1} | {pages:.2} | {:.2} |",
            pages + 2.0
        );
    }
}

/// Opens a blocking JSON-RPC `SendMessage` of `text` through `url` on a
/// socket of its own (the caller leaves by dropping it).
async fn open_blocking_send(url: &str, text: &str) -> tokio::net::TcpStream {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": harness::worker::message(text)}});
    harness::http::open_post_json(url, "/", &body).await
}

/// Settled tasks the worker holds before `--leavers` measures.
const LEAVER_BACKLOG: usize = 2000;
/// Leavers one after another in `--leavers`.
const LEAVERS_ALONE: usize = 30;
/// Leavers at once in `--leavers`.
const LEAVERS_TOGETHER: usize = 100;

/// Slices per column in `--replicas`.
const REPLICA_SLICES: usize = 6;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == bare_pingora::FLAG) {
        bare_pingora::run(&args[i + 1..]);
    }
    if let Some(i) = args.iter().position(|a| a == grpc::LOAD_FLAG) {
        grpc::load(&args[i + 1..]);
    }
    if args.iter().any(|a| a == SERVE_FLAG) {
        serve();
    }
    if args.iter().any(|a| a == canned::FLAG) {
        canned::run();
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        println!("proxy bench: skipped (run `cargo bench -p a2a-gateway --bench proxy`)");
        return;
    }
    if args.iter().any(|a| a == grpc::FLAG) {
        grpc_only();
        return;
    }
    if args.iter().any(|a| a == "--replicas") {
        replicas_only();
        return;
    }
    if args.iter().any(|a| a == "--leavers") {
        leavers_only();
        return;
    }
    // The gateways log as a user's do (an access line per request).
    harness::gateway::product_log_unless_set();
    // The worker on a runtime (one thread) of its own, its gRPC listener
    // beside its HTTP and WebSocket ones ...
    let worker_rt = worker_runtime();
    let worker = worker_rt.block_on(RustWorker::start_with_grpc(RustWorkerOptions {
        websocket: true,
        ..RustWorkerOptions::default()
    }));
    // ... and the load drivers and process handles on this thread.
    let rt = driver_runtime();
    let load_before = loadavg();
    let ticks_before = machine_ticks();
    let started = Instant::now();
    let (cells, tracked, fixed_steal, as_published) = rt.block_on(async {
        let http_url = worker.url();
        let ws_url = worker.ws_url().expect("the worker's WebSocket listener");
        let http_up = authority(&http_url);
        let ws_up = authority(&ws_url);
        let ws_base = format!("http://{ws_up}");

        // Every proxy up front, each a process of its own; all idle but the
        // one being measured.
        let direct = Target {
            http: http_url.clone(),
            ws: ws_url.clone(),
            procs: Vec::new(),
            metrics: None,
            ws_log: None,
        };
        let nginx = start_nginx(&http_up, &ws_up).await.map(|(p, h, w)| {
            let t = Target {
                http: format!("http://{h}"),
                ws: format!("ws://{w}/ws"),
                procs: vec![p.child.id()],
                metrics: None,
                ws_log: None,
            };
            (p, t)
        });
        let bare = match (start_bare(&http_up).await, start_bare(&ws_up).await) {
            (Ok((p1, h, metrics)), Ok((p2, w, _))) => {
                let procs = vec![p1.child.id()];
                let t = Target {
                    http: format!("http://{h}"),
                    ws: format!("ws://{w}/ws"),
                    procs,
                    metrics: Some(metrics),
                    ws_log: None,
                };
                Ok(([p1, p2], t))
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        // The bare column's partner at the fixed rate (see `run_rounds`).
        let bare_twin = start_bare(&http_up).await.map(|(p, h, metrics)| {
            let t = Target {
                http: format!("http://{h}"),
                ws: String::new(),
                procs: vec![p.child.id()],
                metrics: Some(metrics),
                ws_log: None,
            };
            (p, t)
        });
        // Bare pingora with pingora-core's own upstream pool, as published
        // (see `published_rounds`).
        let published = start_bare_with(&http_up, &[bare_pingora::PINGORA_CORE_POOL])
            .await
            .map(|(p, h, _)| {
                let t = Target {
                    http: format!("http://{h}"),
                    ws: String::new(),
                    procs: vec![p.child.id()],
                    metrics: None,
                    ws_log: None,
                };
                (p, t)
            });
        let (mem_gw, mem_gw_ws, mem) = gateways("", "", &http_url, &ws_base).await;
        // The memory gateway carrying blocking sends as streams
        // (`blocking_sends = "stream"`): what a budgeted or leased send
        // costs.
        let (carry_gw, carry_gw_ws, carry) =
            gateways("", "blocking_sends = \"stream\"", &http_url, &ws_base).await;
        let mut redis = RedisServer::start().await;
        let store = format!("[store]\nurl = \"{}\"\n", redis.url());
        let (red_gw, red_gw_ws, mut red) = gateways(&store, "", &http_url, &ws_base).await;
        // The store's CPU is part of what the Redis column costs.
        red.procs.extend(redis.pid());
        // The gRPC rows' bare pingora and gateway, in front of the worker's
        // gRPC listener.
        let grpc_up = authority(&worker.grpc_url());
        let (grpc_procs, grpc_targets) = grpc_targets(&grpc_up).await;

        for e in [
            nginx.as_ref().err(),
            bare.as_ref().err(),
            bare_twin.as_ref().err(),
        ]
        .into_iter()
        .flatten()
        {
            eprintln!("{e}");
        }
        // The worker's task store fills to its capacity (10,000) before any
        // column is measured, so none runs against an emptier store.
        let _ = wrk_blocking(&http_url, 3).await;

        let targets = [
            Some(&direct),
            nginx.as_ref().ok().map(|(_, t)| t),
            bare.as_ref().ok().map(|(_, t)| t),
            Some(&mem),
            Some(&red),
            Some(&carry),
        ];
        let (mut cols, fixed_steal) =
            run_rounds(&targets, bare_twin.as_ref().ok().map(|(_, t)| t)).await;
        let grpc_started = Instant::now();
        let grpc_cols = grpc::rounds(&grpc_targets.each(), &grpc_up).await;
        eprintln!("gRPC rows: {:.0} s", grpc_started.elapsed().as_secs_f64());
        for (col, g) in cols.iter_mut().zip(grpc_cols) {
            col.grpc = Some(g).filter(|g| !g.is_empty());
        }
        let as_published = match (&bare, &published) {
            (Ok((_, b)), Ok((_, p))) => published_rounds(b, p).await,
            _ => None,
        };
        let Ok([d, n, b, m, r, p]) = <[Column; 6]>::try_from(cols) else {
            unreachable!("a column per target")
        };
        let cells: [Cell; 6] = [
            Ok(d),
            match &nginx {
                Ok(_) => Ok(n),
                Err(e) => Err(e.lines().next().unwrap_or("nginx failed").to_string()),
            },
            match &bare {
                Ok(_) => Ok(b),
                Err(_) => Err("bare pingora failed (see stderr)".to_string()),
            },
            Ok(m),
            Ok(r),
            Ok(p),
        ];
        let tracked = (
            mem_gw.counter("a2agw_tasks_tracked_total", &[]).await
                + mem_gw_ws.counter("a2agw_tasks_tracked_total", &[]).await,
            red_gw.counter("a2agw_tasks_tracked_total", &[]).await
                + red_gw_ws.counter("a2agw_tasks_tracked_total", &[]).await,
        );
        drop((nginx, bare, bare_twin, published));
        grpc_procs.stop().await;
        // Killed and waited for, so no zombie outlives the bench.
        for mut gw in [mem_gw, mem_gw_ws, red_gw, red_gw_ws, carry_gw, carry_gw_ws] {
            gw.kill().await;
        }
        redis.kill().await;
        (cells, tracked, fixed_steal, as_published)
    });
    let load_after = loadavg();
    let steal = steal_pct(ticks_before, machine_ticks());
    {
        let _in_runtime = worker_rt.enter();
        drop(worker);
    }

    println!();
    println!(
        "proxy bench, {} — {}; load average {load_before} before, {load_after} after; {:.0} s; CPU time stolen by the host {steal} (during the fixed-rate slices {fixed_steal})",
        utc_now(),
        cpus(),
        started.elapsed().as_secs_f64()
    );
    let nginx_version = Some(sh(NGINX, &["-v"]))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "not installed".into());
    println!(
        "{nginx_version}; pingora 0.9 (bare and gateway: 2 threads); worker: a2a-rust 0.15 on 1 thread; best of {ROUNDS} rounds"
    );
    println!();
    let cols: Vec<(&str, &Cell)> = COLUMN_NAMES.iter().copied().zip(cells.iter()).collect();
    print_table(&cols, false);
    println!();
    if let Some((b, p)) = &as_published {
        let cpu = |s: &Send| s.cpu_us.map_or("-".to_string(), |c| format!("{c:.0}"));
        println!(
            "bare pingora with pingora-core's own upstream pool (pingora-proxy as published), {ROUNDS} interleaved rounds right after: {:.0} SendMessage/s, {} µs of CPU per request; bare pingora as above (the vendored pool) in the same rounds: {:.0}/s, {} µs ({:.2}x the requests/s)",
            p.rps,
            cpu(p),
            b.rps,
            cpu(b),
            b.rps / p.rps.max(1.0),
        );
        println!();
    }
    if let (Ok(b), Ok(m), Ok(r)) = (&cells[2], &cells[3], &cells[4]) {
        if let (Some(bf), Some(noise), Some(am), Some(ar)) =
            (&b.fixed, added_p99(b), added_p99(m), added_p99(r))
        {
            println!(
                "added p99 over bare pingora at the same moments, {:.0} SendMessage/s offered in all ({:.0} to each side), all slices pooled: gateway (memory) {am:+.2} ms, gateway (Redis) {ar:+.2} ms; a second bare pingora against the first {noise:+.2} ms",
                bf.offered * 2.0,
                bf.offered,
            );
            let show = |d: Option<(f64, f64, f64)>| {
                d.map_or("-".to_string(), |(med, lo, hi)| {
                    format!("{med:+.2} ms (slices {lo:+.2} to {hi:+.2})")
                })
            };
            println!(
                "added p99 slice by slice (each pair's column p99 minus bare's), median: gateway (memory) {}, gateway (Redis) {}, second bare against the first {}",
                show(median_range(&m.slice_p99_diff)),
                show(median_range(&r.slice_p99_diff)),
                show(median_range(&b.slice_p99_diff)),
            );
        }
    }
    let own = |cell: &Cell| {
        let c = cell.as_ref().ok()?;
        Some(format!(
            "{:.1}% within 0.2 ms, p99 {:.0} µs ({:+.0} µs over bare pingora's {:.0} over the same slices)",
            share_within(c.own.as_ref()?, 0.0002)?,
            quantile_us(c.own.as_ref()?, 0.99)?,
            own_added_p99(c)?,
            quantile_us(c.own_bare.as_ref()?, 0.99)?,
        ))
    };
    let none = || "-".to_string();
    println!(
        "time inside the proxy per SendMessage at the fixed rate (a2agw_proxy_seconds; the worker's time left out): a second bare pingora {}; gateway (memory) {}; gateway (Redis) {}; gateway (memory, stream) {}",
        own(&cells[2]).unwrap_or_else(none),
        own(&cells[3]).unwrap_or_else(none),
        own(&cells[4]).unwrap_or_else(none),
        own(&cells[5]).unwrap_or_else(none),
    );
    println!(
        "tasks tracked during the run: gateway (memory) {}, gateway (Redis) {}",
        tracked.0, tracked.1
    );
}
