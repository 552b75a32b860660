//! Throughput and latency through the gateway versus straight to the same
//! real worker, in one run. `cargo bench -p a2a-gateway --bench proxy`
//! (needs `wrk`: `apt-get install wrk`).
//!
//! Scenarios:
//! - `SendMessage` (JSON-RPC, `quick` task, ~1 KB answer), driven by `wrk`
//!   with 32 keep-alive connections: requests/s, p50, p99.
//! - SSE: `SendStreamingMessage` of a task that emits N status updates at
//!   once, 8 streams at a time: events/s, with task tracking on.
//!
//! Under `cargo test` (no `--bench` argument) it only says it was skipped.

// A benchmark's report is its standard output.
#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
#[allow(dead_code, unused_imports, clippy::all)]
mod harness;

use std::process::Command;
use std::time::{Duration, Instant};

use harness::gateway::Gateway;
use harness::rust_worker::{RustWorker, RustWorkerOptions};
use harness::worker::{send_stream, Bind};

const SEND_SECONDS: u32 = 5;
const BURST: usize = 2000;
const STREAMS: usize = 8;

struct Send {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn wrk_send(url: &str) -> Option<Send> {
    let dir = harness::gateway::scratch_dir("bench");
    let script = dir.join("send.lua");
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "bench", "role": "ROLE_USER",
            "parts": [{"text": "quick"}], "metadata": {"pad": "x".repeat(600)}}}
    })
    .to_string();
    let lua = format!(
        "wrk.method = \"POST\"\nwrk.body = [[{body}]]\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"A2A-Version\"] = \"1.0\"\n"
    );
    std::fs::write(&script, lua).ok()?;
    let out = Command::new("wrk")
        .args([
            "-t2",
            "-c32",
            &format!("-d{SEND_SECONDS}s"),
            "--latency",
            "-s",
        ])
        .arg(&script)
        .arg(format!("{url}/"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let num = |prefix: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.trim_start().starts_with(prefix))?;
        let v = line.trim_start()[prefix.len()..]
            .split_whitespace()
            .next()?;
        parse_ms(v).or_else(|| v.parse().ok())
    };
    if text.contains("Non-2xx") {
        eprintln!("wrk saw errors:\n{text}");
    }
    Some(Send {
        rps: num("Requests/sec:")?,
        p50_ms: num("50%")?,
        p99_ms: num("99%")?,
    })
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

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("proxy bench: skipped (run `cargo bench -p a2a-gateway --bench proxy`)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let worker = RustWorker::start(RustWorkerOptions::default()).await;
        let gw = Gateway::in_front_of(&worker.url(), "").await;
        let direct_url = worker.url();
        let gw_url = gw.url.clone();

        let (d, g) = tokio::task::spawn_blocking(move || (wrk_send(&direct_url), wrk_send(&gw_url)))
            .await
            .expect("wrk");
        // Warm, then measure SSE.
        let _ = sse_events_per_sec(&worker.url()).await;
        let sse_direct = sse_events_per_sec(&worker.url()).await;
        let _ = sse_events_per_sec(&gw.url).await;
        let sse_gw = sse_events_per_sec(&gw.url).await;

        println!();
        println!("| scenario | direct | gateway | gateway / direct |");
        println!("|---|---|---|---|");
        match (d, g) {
            (Some(d), Some(g)) => {
                println!("| SendMessage requests/s (wrk -c32, {SEND_SECONDS}s) | {:.0} | {:.0} | {:.2} |", d.rps, g.rps, g.rps / d.rps);
                println!("| SendMessage p50 latency (ms) | {:.2} | {:.2} | {:.2} |", d.p50_ms, g.p50_ms, g.p50_ms / d.p50_ms);
                println!("| SendMessage p99 latency (ms) | {:.2} | {:.2} | {:.2} |", d.p99_ms, g.p99_ms, g.p99_ms / d.p99_ms);
            }
            _ => println!("| SendMessage | (wrk not installed: apt-get install wrk) | | |"),
        }
        println!("| SSE events/s ({STREAMS} streams x {BURST} events, tracked) | {sse_direct:.0} | {sse_gw:.0} | {:.2} |", sse_gw / sse_direct);
        let tracked = gw.counter("a2agw_tasks_tracked_total", &[]).await;
        println!();
        println!("tasks tracked by the gateway during the run: {tracked}");
    });
}
