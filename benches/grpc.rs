//! The proxy bench's gRPC rows (issue 31): the A2A gRPC binding
//! (`lf.a2a.v1.A2AService`) straight to the worker, through bare pingora and
//! through the gateway (memory store), in the same table as the other
//! bindings. A child module of `benches/proxy.rs`, which runs it after the
//! HTTP and WebSocket rounds, or alone with
//! `cargo bench -p a2a-gateway --bench proxy -- --grpc`.
//!
//! Targets (all h2c, HTTP/2 with prior knowledge, on loopback):
//! - direct: the worker's gRPC listener (`RustWorker::start_with_grpc`: the
//!   same a2a-rust 0.15 handler and executor as its HTTP side, served by
//!   `GrpcDispatcher` with `GrpcConfig::default()`, on the worker's one
//!   thread).
//! - bare pingora: `benches/bare_pingora.rs` in front of that listener (h2c
//!   on its listener, HTTP/2 to the worker for `application/grpc` calls).
//! - gateway (memory): the real binary, one route whose worker is the gRPC
//!   listener; every call is read (the request before the worker is asked,
//!   the answer's messages along the copy) and its task tracked.
//!
//! The load driver is in this file, on the `h2` crate over tokio
//! `TcpStream`s, on the bench's driver thread: each call is a HEADERS frame
//! (`content-type: application/grpc`, `te: trailers`, `a2a-version: 1.0`),
//! one length-prefixed message (`SendMessageRequest`, encoded by `prost`
//! from `a2a_protocol_types::proto`) with END_STREAM, then the answer read to
//! its trailers, which must say `grpc-status: 0`. The client's windows are
//! 1 MiB per stream and 4 MiB per connection (a tonic client's are of that
//! order; h2's 64 KiB default would make the streaming rows measure flow
//! control round trips).
//! - Unary: `SendMessage` of `quick` with ~600 bytes of message metadata
//!   (as the JSON-RPC row's body), [`UNARY_CONNS`] connections each with
//!   [`UNARY_STREAMS`] calls in flight (32 in all, as `wrk -c32`), each
//!   stream slot calling again as soon as its answer's trailers came, for
//!   [`UNARY_SECONDS`]: calls/s, p50 and p99 of the calls' times, the
//!   proxy's CPU (user + system, `/proc`) and the worker's per call. Run in
//!   [`UNARY_SLICES`] slices, each running every target once in an order
//!   that rotates from slice to slice; each cell is the median of its
//!   slices, and the gateway's ratio to bare pingora is also given as the
//!   median of the per-slice ratios ([`unary_slices`] says why).
//! - Streaming: `SendStreamingMessage` of `burst:`[`BURST`] (the SSE row's
//!   script: WORKING, n WORKING updates at once, COMPLETED) on
//!   [`STREAM_CONNS`] connections x [`STREAM_STREAMS`] stream slots (8 at a
//!   time, as the SSE row), each slot opening its next stream as soon as the
//!   last one's trailers came, for [`STREAM_SECONDS`] (connections opened
//!   before the clock starts): `StreamResponse` messages/s from the first
//!   request to the last trailers, and the proxy's CPU per message over all
//!   runs. A run of 8 single streams (the SSE row's way) took 0.1 s with
//!   `burst:2000`, and the gateway's ratio to bare pingora spread from 0.61
//!   to 1.05 over five runs of this bench; longer single streams are not an
//!   option: `burst:10000` overflowed the worker's event queue (a2a-rust's
//!   4,096 events: "event stream lagged", grpc-status 13) when its reader
//!   fell behind. [`BURST`] stays under that.
//! - Heap allocations, bare pingora against the gateway, each a fresh
//!   process under the `LD_PRELOAD` counter (`benches/alloc_shim.rs`; the
//!   C library's `malloc`, as in the `streams` bench): per `StreamResponse`
//!   message, (Δ(`burst:N`) − Δ(`burst:0`) − idle rate × Δt) / N, and per
//!   unary call, (Δ([`ALLOC_CALLS`] calls, one at a time) − idle rate × Δt)
//!   / [`ALLOC_CALLS`], counters read 50 ms after each run on one open
//!   connection; median of [`ALLOC_ROUNDS`].
//!
//! Streaming in rounds as for the other rows: against every target in turn,
//! [`super::ROUNDS`] times, the first round warming each target up; each
//! cell keeps its best run. Before any of it, every target is checked once:
//! a `quick` call answered with its task COMPLETED and a `burst:3` stream
//! ending COMPLETED. About a minute and a half in all.

use std::future::poll_fn;
use std::time::{Duration, Instant};

use a2a_protocol_types::proto;
use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use prost::Message as _;

use super::harness::gateway::{scratch_dir, Gateway};
use super::{alloc_shim, cpu_ticks, start_bare_env, worker_ticks, Proc, ROUNDS, USER_HZ};

/// The argument that runs only the gRPC rows (after `--`).
pub const FLAG: &str = "--grpc";

/// The argument that drives unary load at one address, for profiling by
/// hand next to `--serve`: `-- --grpc-load ADDR SECS`.
pub const LOAD_FLAG: &str = "--grpc-load";

/// `--grpc-load ADDR SECS`: the unary row's load against `ADDR` for `SECS`
/// seconds, its calls/s, p50 and p99 printed. `--grpc-load ADDR calls:N`:
/// N of the row's calls one at a time on one connection (for instruction
/// counts under valgrind, where a fixed number of calls matters, not time).
pub fn load(args: &[String]) -> ! {
    let usage = || -> ! {
        eprintln!("usage: {LOAD_FLAG} ADDR SECS | {LOAD_FLAG} ADDR calls:N");
        std::process::exit(2)
    };
    let (Some(addr), Some(what)) = (args.first(), args.get(1)) else {
        usage()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("driver runtime");
    if let Some(n) = what.strip_prefix("calls:") {
        let Ok(n) = n.parse::<usize>() else { usage() };
        let r = rt.block_on(async {
            let mut send = connect(addr).await?;
            let (uri, body) = (
                uri(addr, "SendMessage"),
                frame(&send_request("quick", true)),
            );
            for _ in 0..n {
                call(&mut send, &uri, body.clone(), false).await?;
            }
            Ok::<_, String>(())
        });
        if let Err(e) = r {
            eprintln!("{addr}: {e}");
            std::process::exit(1);
        }
        println!("{addr}: {n} calls");
        std::process::exit(0);
    }
    let Ok(secs) = what.parse::<f64>() else {
        usage()
    };
    match rt.block_on(unary_run(addr, secs)) {
        Ok(u) => {
            println!(
                "{addr}: {:.0} calls/s, p50 {:.2} ms, p99 {:.2} ms",
                u.per_sec, u.p50_ms, u.p99_ms
            );
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("{addr}: {e}");
            std::process::exit(1)
        }
    }
}

pub const UNARY_CONNS: usize = 4;
pub const UNARY_STREAMS: usize = 8;
pub const UNARY_SECONDS: f64 = 1.5;
pub const UNARY_SLICES: usize = 12;
const UNARY_WARMUP_SECONDS: f64 = 1.0;
pub const STREAM_CONNS: usize = 2;
pub const STREAM_STREAMS: usize = 4;
pub const BURST: usize = 4000;
pub const STREAM_SECONDS: f64 = 2.0;
const STREAM_WARMUP_SECONDS: f64 = 0.5;
pub const ALLOC_CALLS: usize = 1000;
const ALLOC_ROUNDS: usize = 3;

const STREAM_WINDOW: u32 = 1 << 20;
const CONN_WINDOW: u32 = 4 << 20;

/// Where one column's gRPC calls go.
pub struct GrpcTarget {
    /// `host:port`, h2c.
    pub addr: String,
    /// The processes whose CPU time counts as the proxy's (none: direct).
    pub procs: Vec<u32>,
}

/// A unary run: calls/s, latency, CPU per call.
pub struct Unary {
    pub per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub cpu_us: Option<f64>,
    pub worker_cpu_us: Option<f64>,
}

/// Heap allocation calls (reallocs included) per message and per call.
pub struct Allocs {
    pub per_message: f64,
    pub per_call: f64,
}

/// One column's gRPC figures (unary: medians of its slices; streaming:
/// best runs).
#[derive(Default)]
pub struct GrpcCol {
    pub unary: Option<Unary>,
    /// The median over the unary slices of this column's calls/s over bare
    /// pingora's in the same slice (none for bare itself).
    pub unary_vs_bare: Option<f64>,
    pub stream_per_sec: Option<f64>,
    /// The proxy's CPU over every streaming run (clock ticks) and the
    /// messages they carried.
    stream_ticks: u64,
    stream_messages: usize,
    pub allocs: Option<Result<Allocs, String>>,
    /// Why the column has no figures (its check failed).
    pub error: Option<String>,
}

impl GrpcCol {
    /// Nothing run for this column (no target).
    pub fn is_empty(&self) -> bool {
        self.unary.is_none()
            && self.stream_per_sec.is_none()
            && self.allocs.is_none()
            && self.error.is_none()
    }

    /// The proxy's CPU per streamed message (µs), over all streaming runs.
    pub fn stream_cpu_us(&self) -> Option<f64> {
        (self.stream_messages > 0 && self.stream_ticks > 0)
            .then(|| self.stream_ticks as f64 / USER_HZ * 1e6 / self.stream_messages as f64)
    }
}

// ── Requests and the wire ───────────────────────────────────────────────────

/// A `SendMessageRequest` saying `text`; with `pad`, ~600 bytes of message
/// metadata (`{"pad": "xxx…"}`), as the JSON-RPC row's body has.
fn send_request(text: &str, pad: bool) -> proto::SendMessageRequest {
    let metadata = pad.then(|| {
        proto::convert::json_to_struct(serde_json::json!({"pad": "x".repeat(600)}))
            .expect("metadata")
    });
    proto::SendMessageRequest {
        message: Some(proto::Message {
            message_id: "bench".to_string(),
            role: proto::Role::User as i32,
            parts: vec![proto::Part {
                content: Some(proto::part::Content::Text(text.to_string())),
                ..proto::Part::default()
            }],
            metadata,
            ..proto::Message::default()
        }),
        ..proto::SendMessageRequest::default()
    }
}

/// One gRPC message: `[0 (uncompressed), u32 BE length, bytes]`.
fn frame(msg: &impl prost::Message) -> Bytes {
    let bytes = msg.encode_to_vec();
    let mut out = BytesMut::with_capacity(5 + bytes.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(bytes.len()).expect("message under 4 GiB"));
    out.extend_from_slice(&bytes);
    out.freeze()
}

/// A call's URI on `addr`.
fn uri(addr: &str, method: &str) -> String {
    format!("http://{addr}/lf.a2a.v1.A2AService/{method}")
}

/// An h2c connection (prior knowledge) to `addr`, ready for streams; its
/// connection task runs until every handle to it is gone.
async fn connect(addr: &str) -> Result<SendRequest<Bytes>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .handshake(tcp)
        .await
        .map_err(|e| format!("h2 handshake with {addr}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send.ready()
        .await
        .map_err(|e| format!("h2 connection to {addr}: {e}"))
}

/// The gRPC messages of an answer, read as the bytes come (split anywhere).
#[derive(Default)]
struct Frames {
    head: [u8; 5],
    /// Bytes of `head` read; 5: inside a message's body.
    have: usize,
    /// Bytes of the current message's body still to come.
    left: usize,
    count: usize,
    /// Keep the messages' bytes (checks only, not the measured runs).
    keep: bool,
    cur: Vec<u8>,
    kept: Vec<Vec<u8>>,
}

impl Frames {
    fn feed(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            if self.have < 5 {
                let n = (5 - self.have).min(b.len());
                self.head[self.have..self.have + n].copy_from_slice(&b[..n]);
                self.have += n;
                b = &b[n..];
                if self.have == 5 {
                    let len = [self.head[1], self.head[2], self.head[3], self.head[4]];
                    self.left = u32::from_be_bytes(len) as usize;
                    if self.left == 0 {
                        self.end_message();
                    }
                }
                continue;
            }
            let n = self.left.min(b.len());
            if self.keep {
                self.cur.extend_from_slice(&b[..n]);
            }
            self.left -= n;
            b = &b[n..];
            if self.left == 0 {
                self.end_message();
            }
        }
    }

    fn end_message(&mut self) {
        self.count += 1;
        self.have = 0;
        if self.keep {
            self.kept.push(std::mem::take(&mut self.cur));
        }
    }
}

fn grpc_status(h: &http::HeaderMap) -> Option<(&str, &str)> {
    let status = h.get("grpc-status")?.to_str().unwrap_or("?");
    let message = h
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("");
    Some((status, message))
}

/// One call on `send`: `body` (one framed message) sent with END_STREAM,
/// the answer read to its trailers, which must say `grpc-status: 0`. The
/// answer's messages: counted, and kept with `keep`.
async fn call(
    send: &mut SendRequest<Bytes>,
    uri: &str,
    body: Bytes,
    keep: bool,
) -> Result<Frames, String> {
    poll_fn(|cx| send.poll_ready(cx))
        .await
        .map_err(|e| format!("h2 not ready: {e}"))?;
    let req = http::Request::builder()
        .method("POST")
        .uri(uri)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header("a2a-version", "1.0")
        .body(())
        .map_err(|e| e.to_string())?;
    let (answer, mut out) = send
        .send_request(req, false)
        .map_err(|e| format!("send {uri}: {e}"))?;
    out.send_data(body, true)
        .map_err(|e| format!("send {uri}'s message: {e}"))?;
    let answer = answer.await.map_err(|e| format!("{uri}: {e}"))?;
    let (head, mut recv) = answer.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(format!("{uri}: HTTP {}", head.status));
    }
    // Trailers-only: a refusal.
    if let Some((status, message)) = grpc_status(&head.headers) {
        if status != "0" {
            return Err(format!("{uri}: grpc-status {status} {message}"));
        }
    }
    let mut frames = Frames {
        keep,
        ..Frames::default()
    };
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(|e| format!("{uri}: {e}"))?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        frames.feed(&chunk);
    }
    let trailers = recv
        .trailers()
        .await
        .map_err(|e| format!("{uri}: trailers: {e}"))?
        .unwrap_or_default();
    match grpc_status(&trailers).or_else(|| grpc_status(&head.headers)) {
        Some(("0", _)) => Ok(frames),
        Some((status, message)) => Err(format!("{uri}: grpc-status {status} {message}")),
        None => Err(format!("{uri}: no grpc-status")),
    }
}

// ── Checks ──────────────────────────────────────────────────────────────────

fn state_of(ev: &proto::StreamResponse) -> Option<proto::TaskState> {
    use proto::stream_response::Payload;
    let status = match ev.payload.as_ref()? {
        Payload::Task(t) => t.status.as_ref()?,
        Payload::StatusUpdate(u) => u.status.as_ref()?,
        _ => return None,
    };
    proto::TaskState::try_from(status.state).ok()
}

/// A `quick` call answered with its task COMPLETED, and a `burst:3` stream
/// of 6 messages ending COMPLETED.
async fn check(addr: &str) -> Result<(), String> {
    let mut send = connect(addr).await?;
    let unary = call(
        &mut send,
        &uri(addr, "SendMessage"),
        frame(&send_request("quick", true)),
        true,
    )
    .await?;
    let [answer] = unary.kept.as_slice() else {
        return Err(format!("SendMessage: {} messages", unary.count));
    };
    let answer = proto::SendMessageResponse::decode(answer.as_slice())
        .map_err(|e| format!("SendMessage's answer: {e}"))?;
    match answer.payload {
        Some(proto::send_message_response::Payload::Task(t))
            if t.status.as_ref().map(|s| s.state) == Some(proto::TaskState::Completed as i32) => {}
        other => return Err(format!("SendMessage answered {other:?}")),
    }
    let stream = call(
        &mut send,
        &uri(addr, "SendStreamingMessage"),
        frame(&send_request("burst:3", false)),
        true,
    )
    .await?;
    let last = stream
        .kept
        .last()
        .map(|m| proto::StreamResponse::decode(m.as_slice()))
        .transpose()
        .map_err(|e| format!("a StreamResponse: {e}"))?;
    if stream.count < 5 || last.as_ref().and_then(state_of) != Some(proto::TaskState::Completed) {
        return Err(format!(
            "burst:3 stream: {} messages, the last {last:?}",
            stream.count
        ));
    }
    Ok(())
}

// ── Load ────────────────────────────────────────────────────────────────────

/// [`UNARY_CONNS`] x [`UNARY_STREAMS`] call loops for `secs`: calls/s,
/// p50, p99 (CPU left to the caller).
async fn unary_run(addr: &str, secs: f64) -> Result<Unary, String> {
    let body = frame(&send_request("quick", true));
    let uri = uri(addr, "SendMessage");
    let mut conns = Vec::new();
    for _ in 0..UNARY_CONNS {
        conns.push(connect(addr).await?);
    }
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut loops = Vec::new();
    for send in &conns {
        for _ in 0..UNARY_STREAMS {
            let (mut send, body, uri) = (send.clone(), body.clone(), uri.clone());
            loops.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < until {
                    let t = Instant::now();
                    let answer = call(&mut send, &uri, body.clone(), false).await?;
                    if answer.count != 1 {
                        return Err(format!("{uri}: {} messages", answer.count));
                    }
                    lat.push(t.elapsed());
                }
                Ok::<_, String>(lat)
            }));
        }
    }
    let mut lat = Vec::new();
    for l in loops {
        lat.extend(l.await.map_err(|e| e.to_string())??);
    }
    let secs = start.elapsed().as_secs_f64();
    if lat.is_empty() {
        return Err("no calls answered".into());
    }
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
    Ok(Unary {
        per_sec: lat.len() as f64 / secs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        cpu_us: None,
        worker_cpu_us: None,
    })
}

/// [`unary_run`] against `t` with the CPU its processes and the worker spent.
async fn unary_target(t: &GrpcTarget, secs: f64) -> Result<Unary, String> {
    let proxy_before = (!t.procs.is_empty()).then(|| cpu_ticks(&t.procs)).flatten();
    let worker_before = worker_ticks();
    let mut u = unary_run(&t.addr, secs).await?;
    let calls = u.per_sec * secs;
    let per_call = |ticks: u64| ticks as f64 / USER_HZ * 1e6 / calls.max(1.0);
    if let (Some(b), Some(a)) = (proxy_before, cpu_ticks(&t.procs)) {
        u.cpu_us = Some(per_call(a - b));
    }
    if let (Some(b), Some(a)) = (worker_before, worker_ticks()) {
        u.worker_cpu_us = Some(per_call(a - b));
    }
    Ok(u)
}

/// [`STREAM_CONNS`] x [`STREAM_STREAMS`] slots streaming `burst:`[`BURST`]
/// one stream after another for `secs`: messages, and the seconds from the
/// first request to the last trailers.
async fn stream_run(addr: &str, secs: f64) -> Result<(usize, f64), String> {
    let body = frame(&send_request(&format!("burst:{BURST}"), false));
    let uri = uri(addr, "SendStreamingMessage");
    let mut conns = Vec::new();
    for _ in 0..STREAM_CONNS {
        conns.push(connect(addr).await?);
    }
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut slots = Vec::new();
    for send in &conns {
        for _ in 0..STREAM_STREAMS {
            let (mut send, body, uri) = (send.clone(), body.clone(), uri.clone());
            slots.push(tokio::spawn(async move {
                let mut messages = 0;
                while Instant::now() < until {
                    messages += call(&mut send, &uri, body.clone(), false).await?.count;
                }
                Ok::<_, String>(messages)
            }));
        }
    }
    let mut messages = 0;
    for s in slots {
        messages += s.await.map_err(|e| e.to_string())??;
    }
    Ok((messages, start.elapsed().as_secs_f64()))
}

/// The unary scenario: every target warmed up once, then [`UNARY_SLICES`]
/// slices, each running every live target once for [`UNARY_SECONDS`], the
/// order rotating by one target from slice to slice. Each column keeps the
/// median of its slices (calls/s, p50, p99, CPU per call) and, beside bare
/// pingora, the median of its per-slice ratios to bare's calls/s.
///
/// Why slices and not best-of-rounds: the worker's own CPU per call, the
/// bottleneck of this row, moves between consecutive runs of the same
/// target (75 to 96 µs against the direct target, one run after another),
/// so a best-of-3 comparison of two proxies measured a few seconds apart
/// said more about the worker's state than about the proxies.
async fn unary_slices(targets: &[Option<&GrpcTarget>], cols: &mut [GrpcCol]) {
    let live: Vec<usize> = (0..targets.len())
        .filter(|&i| targets[i].is_some() && cols[i].error.is_none())
        .collect();
    eprintln!("gRPC SendMessage: warming up");
    for &i in &live {
        let t = targets[i].expect("live");
        let _ = unary_run(&t.addr, UNARY_WARMUP_SECONDS).await;
    }
    let mut runs: Vec<Vec<Option<Unary>>> = targets.iter().map(|_| Vec::new()).collect();
    for slice in 0..UNARY_SLICES {
        eprintln!("slice {}/{UNARY_SLICES}: gRPC SendMessage", slice + 1);
        for k in 0..live.len() {
            let i = live[(k + slice) % live.len()];
            let t = targets[i].expect("live");
            let r = unary_target(t, UNARY_SECONDS).await;
            if let Err(e) = &r {
                eprintln!("gRPC SendMessage against {}: {e}", t.addr);
            }
            runs[i].push(r.ok());
        }
    }
    let bare = 2;
    for &i in &live {
        let ok: Vec<&Unary> = runs[i].iter().flatten().collect();
        if ok.is_empty() {
            continue;
        }
        let med = |f: fn(&Unary) -> Option<f64>| median(ok.iter().filter_map(|u| f(u)).collect());
        cols[i].unary = Some(Unary {
            per_sec: med(|u| Some(u.per_sec)).unwrap_or(0.0),
            p50_ms: med(|u| Some(u.p50_ms)).unwrap_or(0.0),
            p99_ms: med(|u| Some(u.p99_ms)).unwrap_or(0.0),
            cpu_us: med(|u| u.cpu_us),
            worker_cpu_us: med(|u| u.worker_cpu_us),
        });
        if i != bare && runs.get(bare).is_some_and(|b| !b.is_empty()) {
            let ratios = runs[i]
                .iter()
                .zip(&runs[bare])
                .filter_map(|(c, b)| Some(c.as_ref()?.per_sec / b.as_ref()?.per_sec))
                .collect();
            cols[i].unary_vs_bare = median(ratios);
        }
    }
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Every scenario against every target, target by target within a
/// scenario, [`ROUNDS`] times; the first round warms each target up. Then
/// the allocation counts (`alloc_targets`: bare pingora's and the gateway's
/// columns, started afresh under the counter, in front of `worker`).
pub async fn rounds(targets: &[Option<&GrpcTarget>], worker: &str) -> Vec<GrpcCol> {
    let mut cols: Vec<GrpcCol> = targets.iter().map(|_| GrpcCol::default()).collect();
    for (t, col) in targets.iter().zip(&mut cols) {
        if let Some(t) = t {
            if let Err(e) = check(&t.addr).await {
                eprintln!("gRPC check against {}: {e}", t.addr);
                col.error = Some(e);
            }
        }
    }
    let live = |t: &Option<&GrpcTarget>, col: &GrpcCol| col.error.is_none() && t.is_some();
    unary_slices(targets, &mut cols).await;
    for round in 0..ROUNDS {
        let warm = round == 0;
        eprintln!("round {}/{ROUNDS}: gRPC SendStreamingMessage", round + 1);
        for (t, col) in targets.iter().zip(&mut cols) {
            if !live(t, col) {
                continue;
            }
            let t = t.expect("live");
            if warm {
                let _ = stream_run(&t.addr, STREAM_WARMUP_SECONDS).await;
            }
            let before = (!t.procs.is_empty()).then(|| cpu_ticks(&t.procs)).flatten();
            match stream_run(&t.addr, STREAM_SECONDS).await {
                Ok((messages, secs)) => {
                    let rate = messages as f64 / secs;
                    col.stream_per_sec = Some(col.stream_per_sec.map_or(rate, |b| b.max(rate)));
                    if let (Some(b), Some(a)) = (before, cpu_ticks(&t.procs)) {
                        col.stream_ticks += a - b;
                        col.stream_messages += messages;
                    }
                }
                Err(e) => eprintln!("gRPC stream against {}: {e}", t.addr),
            }
        }
    }
    eprintln!("gRPC: heap allocations (bare pingora, gateway)");
    let (bare, gw) = allocs(worker).await;
    for (name, r) in [("bare pingora", &bare), ("gateway", &gw)] {
        if let Err(e) = r {
            eprintln!("gRPC allocations, {name}: {e}");
        }
    }
    if let Some(c) = cols.get_mut(2) {
        c.allocs = Some(bare);
    }
    if let Some(c) = cols.get_mut(3) {
        c.allocs = Some(gw);
    }
    cols
}

// ── Heap allocations ────────────────────────────────────────────────────────

/// Bare pingora's and the gateway's allocations per message and per call,
/// each started afresh under the counter in front of `worker` (`host:port`).
async fn allocs(worker: &str) -> (Result<Allocs, String>, Result<Allocs, String>) {
    let dir = scratch_dir("grpc-allocs");
    let shim = match alloc_shim::build_shim(&dir) {
        Ok(s) => s,
        Err(e) => return (Err(e.clone()), Err(e)),
    };
    let shim = shim.to_string_lossy().into_owned();
    let bare_counter = dir.join("bare.bin");
    let gw_counter = dir.join("gateway.bin");
    let env = |counter: &std::path::Path| {
        [
            ("LD_PRELOAD".to_string(), shim.clone()),
            (
                alloc_shim::COUNTER_ENV.to_string(),
                counter.to_string_lossy().into_owned(),
            ),
            (
                alloc_shim::ALLOCATOR_ENV.0.to_string(),
                alloc_shim::ALLOCATOR_ENV.1.to_string(),
            ),
        ]
    };
    let bare_env = env(&bare_counter);
    let bare_env: Vec<(&str, &str)> = bare_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let bare = match start_bare_env(worker, &[], &bare_env).await {
        Ok((proc, listen, _)) => {
            let r = alloc_body(&listen, &bare_counter).await;
            drop::<Proc>(proc);
            r
        }
        Err(e) => Err(e),
    };
    let gw_env = env(&gw_counter);
    let gw_env: Vec<(&str, &str)> = gw_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut gw = Gateway::start_with_env(
        &format!("[[routes]]\nname = \"w\"\nworker = \"http://{worker}\"\n"),
        &gw_env,
    )
    .await;
    let addr = super::authority(&gw.url);
    let g = alloc_body(&addr, &gw_counter).await;
    gw.kill().await;
    (bare, g)
}

/// The counter 50 ms after the proxy's last work, and when.
async fn settled(counter: &std::path::Path) -> Result<(f64, Instant), String> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    let c = alloc_shim::read_counter(counter).ok_or("no allocation counter")?;
    Ok(((c[0] + c[1]) as f64, Instant::now()))
}

async fn alloc_body(addr: &str, counter: &std::path::Path) -> Result<Allocs, String> {
    let mut send = connect(addr).await?;
    let unary = (
        uri(addr, "SendMessage"),
        frame(&send_request("quick", true)),
    );
    let stream = uri(addr, "SendStreamingMessage");
    let (short, long) = (
        frame(&send_request("burst:0", false)),
        frame(&send_request(&format!("burst:{BURST}"), false)),
    );
    // Warm: pools, buffers, the allocator's caches.
    for _ in 0..3 {
        call(&mut send, &stream, long.clone(), false).await?;
        call(&mut send, &stream, short.clone(), false).await?;
    }
    for _ in 0..100 {
        call(&mut send, &unary.0, unary.1.clone(), false).await?;
    }
    let (i0, t0) = settled(counter).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (i1, t1) = settled(counter).await?;
    let idle = (i1 - i0) / (t1 - t0).as_secs_f64();
    let (mut per_message, mut per_call) = (Vec::new(), Vec::new());
    for _ in 0..ALLOC_ROUNDS {
        let (a0, t0) = settled(counter).await?;
        let short_n = call(&mut send, &stream, short.clone(), false).await?.count;
        let (a1, t1) = settled(counter).await?;
        let long_n = call(&mut send, &stream, long.clone(), false).await?.count;
        let (a2, t2) = settled(counter).await?;
        let dt_short = (t1 - t0).as_secs_f64();
        let dt_long = (t2 - t1).as_secs_f64();
        let extra = long_n.saturating_sub(short_n).max(1) as f64;
        per_message.push(((a2 - a1) - (a1 - a0) - idle * (dt_long - dt_short)) / extra);
        let (b0, s0) = settled(counter).await?;
        for _ in 0..ALLOC_CALLS {
            call(&mut send, &unary.0, unary.1.clone(), false).await?;
        }
        let (b1, s1) = settled(counter).await?;
        per_call.push(((b1 - b0) - idle * (s1 - s0).as_secs_f64()) / ALLOC_CALLS as f64);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Allocs {
        per_message: median(per_message),
        per_call: median(per_call),
    })
}
