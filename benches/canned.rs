//! The proxies where the proxy, not the worker, is the bottleneck (issue 35):
//! `cargo bench -p a2a-gateway --bench proxy -- --canned`.
//!
//! The main table puts every proxy in front of one a2a-rust worker on one
//! thread, which caps the rate near what that worker serves: there every
//! proxy looks alike. Here the upstream is a canned responder that costs
//! little per request: nginx, an instance of its own with one worker
//! process, answering every POST on one port with a fixed ~1 KB
//! `SendMessage` result and on another with a fixed SSE stream of
//! [`EVENTS`] events (its task id is nginx's `$request_id`, new for every
//! request, so the gateway tracks a new task each time). In front of it, each
//! a process (or instance) of its own, none running any of the responder's
//! work:
//! - nginx as a proxy, `worker_processes 2` (as many as the gateway's
//!   threads), upstream keep-alive, buffering off;
//! - bare pingora (`benches/bare_pingora.rs`, 2 threads);
//! - the gateway on the memory store, task tracking on, with
//!   `blocking_sends = "pass"` (the canned responder answers every request
//!   with the same body, so it cannot serve the stream and `GetTask` that a
//!   carried blocking send asks for: the pass-through is what is compared).
//!
//! Per column: `wrk -t1 -c32` for [`SECONDS`] s, best of [`ROUNDS`]
//! interleaved rounds: requests/s (the column's saturation), and the CPU
//! (user + system from `/proc`, and the system part alone) its processes
//! spent per request in that run. Then latency from the open-loop driver of
//! the main table (16 connections, [`FIXED_SECONDS`] s per column, one run
//! each), p50 and p99, at two fixed rates:
//! - half of the slowest proxy's saturation, below every proxy's: the rate
//!   at which the columns' latencies compare;
//! - half of nginx's saturation (issue 35's rate), which on a small machine
//!   is at or near the saturation of the slower proxies: a cell offered 80%
//!   or more of its own column's saturation is marked, since what it shows
//!   is queueing under overload, not the proxy's latency, and no ratio is
//!   given for it.
//!
//! The same for `SendStreamingMessage`, one request being one whole stream.
//! The direct column is the canned responder alone.
//!
//! `proxy --canned --responder` starts only the canned responder, prints
//! its two addresses (`send HOST:PORT`, `sse HOST:PORT`) and keeps it up
//! until SIGINT or SIGTERM: `benches/cpu-split.sh` counts instructions in
//! front of it.

use super::*;

pub const FLAG: &str = "--canned";
/// With [`FLAG`]: only the canned responder, for `benches/cpu-split.sh`.
const RESPONDER: &str = "--responder";
/// Events in the canned SSE stream.
const EVENTS: usize = 50;
const SECONDS: u32 = 5;
const ROUNDS: usize = 3;
const FIXED_SECONDS: f64 = 5.0;
const WRK_THREADS: u32 = 1;
/// A fixed-rate cell offered this share of its own column's saturation or
/// more is marked as overloaded.
const OVERLOAD: f64 = 0.8;

/// The canned `SendMessage` answer: a completed task, ~1 KB.
fn send_answer() -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"task":{{"id":"$request_id","contextId":"canned","status":{{"state":"TASK_STATE_COMPLETED"}},"artifacts":[{{"artifactId":"a","parts":[{{"text":"{}"}}]}}]}}}}}}"#,
        "x".repeat(800)
    )
}

/// The canned stream, as nginx directives (a parameter of nginx's config is
/// at most 4 KiB, so the stream is put together at run time from three
/// variables): the task, working updates, a completed update.
fn sse_answer() -> String {
    let ev =
        |result: String| format!("data: {{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{result}}}\n\n");
    let update = |state: &str| {
        ev(format!(
            r#"{{"statusUpdate":{{"taskId":"$request_id","contextId":"canned","status":{{"state":"{state}"}}}}}}"#
        ))
    };
    let first = ev(
        r#"{"task":{"id":"$request_id","contextId":"canned","status":{"state":"TASK_STATE_SUBMITTED"}}}"#
            .to_string(),
    );
    format!(
        "set $first '{first}'; set $working '{}'; set $done '{}'; return 200 '$first{}$done';",
        update("TASK_STATE_WORKING"),
        update("TASK_STATE_COMPLETED"),
        "$working".repeat(EVENTS - 2)
    )
}

fn stream_body() -> String {
    send_body(1).replacen("\"SendMessage\"", "\"SendStreamingMessage\"", 1)
}

/// nginx, an instance of its own, from `server_blocks` (each listening on
/// one of `listens`), `workers` worker processes.
async fn nginx(
    name: &str,
    workers: u32,
    server_blocks: &str,
    listens: &[String],
) -> Result<Proc, String> {
    if !Path::new(NGINX).exists() {
        return Err("nginx not installed (apt-get install nginx-light)".into());
    }
    let dir = scratch_dir(name);
    let d = dir.display();
    let is_root = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    };
    let user = if is_root { "user root;\n" } else { "" };
    let conf = format!(
        r#"{user}worker_processes {workers};
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
    keepalive_requests 1000000;
{server_blocks}
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
    p.wait_ready(listens)
        .await
        .map_err(|e| format!("{name} {e}"))?;
    Ok(p)
}

/// The canned responder: (process, SendMessage address, SSE address).
async fn canned() -> Result<(Proc, String, String), String> {
    let send = format!("127.0.0.1:{}", free_port());
    let sse = format!("127.0.0.1:{}", free_port());
    let blocks = format!(
        "    server {{ listen {send}; location / {{ default_type application/json; return 200 '{}'; }} }}\n    server {{ listen {sse}; location / {{ default_type text/event-stream; {} }} }}",
        send_answer(),
        sse_answer()
    );
    let p = nginx("canned", 1, &blocks, &[send.clone(), sse.clone()]).await?;
    Ok((p, send, sse))
}

/// nginx as a proxy in front of both canned ports.
async fn nginx_proxy(send_up: &str, sse_up: &str) -> Result<(Proc, String, String), String> {
    let send = format!("127.0.0.1:{}", free_port());
    let sse = format!("127.0.0.1:{}", free_port());
    let mut blocks = String::new();
    for (name, listen, up) in [("send", &send, send_up), ("sse", &sse, sse_up)] {
        blocks.push_str(&format!(
            r#"    upstream {name} {{ server {up}; keepalive 64; keepalive_requests 1000000; }}
    server {{
        listen {listen};
        location / {{
            proxy_pass http://{name};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
"#
        ));
    }
    let p = nginx("nginx-proxy", 2, &blocks, &[send.clone(), sse.clone()]).await?;
    Ok((p, send, sse))
}

/// One column: where SendMessage and SSE go, and whose CPU counts.
struct Col {
    name: &'static str,
    /// The name in a row's label.
    short: &'static str,
    send: String,
    sse: String,
    procs: Vec<u32>,
}

/// A `wrk` run, with the CPU its column's processes spent per request in it
/// (`s.cpu_us`: user + system).
struct Run {
    s: Send,
    /// The system (kernel) part of `s.cpu_us`.
    sys_us: Option<f64>,
}

/// One column's figures, per scenario (0: SendMessage, 1: SSE stream).
#[derive(Default)]
struct Figures {
    /// The best `wrk` run: the column's saturation.
    best: [Option<Run>; 2],
    /// At half of the slowest proxy's saturation.
    low: [Option<Fixed>; 2],
    /// At half of nginx's saturation.
    nginx_half: [Option<Fixed>; 2],
}

impl Figures {
    fn rps(&self, k: usize) -> Option<f64> {
        self.best[k].as_ref().map(|r| r.s.rps)
    }
}

/// The fixed rates, per scenario.
#[derive(Default)]
struct Rates {
    /// Half of the slowest proxy's saturation, and that proxy's column.
    low: [Option<(f64, usize)>; 2],
    /// Half of nginx's saturation.
    nginx_half: [Option<f64>; 2],
}

/// CPU time of `pids` and their child processes from `/proc`, in clock
/// ticks: (user, system).
fn cpu_split(pids: &[u32]) -> Option<(u64, u64)> {
    let mut all = pids.to_vec();
    for p in pids {
        let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).ok()?;
        all.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    let (mut user, mut sys) = (0, 0);
    for p in all {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        // utime and stime: the 12th and 13th fields after the command.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        user += f.get(11)?.parse::<u64>().ok()?;
        sys += f.get(12)?.parse::<u64>().ok()?;
    }
    Some((user, sys))
}

/// µs per request of `ticks` over `requests`.
fn per_request(ticks: u64, requests: f64) -> f64 {
    ticks as f64 / USER_HZ * 1e6 / requests.max(1.0)
}

/// `wrk` against `url`, with the CPU `procs` spent per request.
async fn run_wrk(url: &str, body: &str, procs: &[u32]) -> Option<Run> {
    let before = cpu_split(procs);
    let (u, b) = (format!("http://{url}"), body.to_string());
    let mut s = tokio::task::spawn_blocking(move || wrk_with(&u, &b, WRK_THREADS, SECONDS))
        .await
        .ok()??;
    let mut sys_us = None;
    if let (Some((u0, s0)), Some((u1, s1))) = (before, cpu_split(procs)) {
        s.cpu_us = Some(per_request((u1 + s1) - (u0 + s0), s.requests));
        sys_us = Some(per_request(s1 - s0, s.requests));
    }
    Some(Run { s, sys_us })
}

async fn fixed(url: &str, body: &str, rate: f64) -> Option<Fixed> {
    match fixed_rate_body(&format!("http://{url}"), body, rate, FIXED_SECONDS).await {
        Ok(mut lat) => Some(summarise(&mut lat, rate)),
        Err(e) => {
            eprintln!("fixed rate against {url}: {e}");
            None
        }
    }
}

/// [`RESPONDER`]: the canned responder alone, its addresses on standard
/// output, until SIGINT or SIGTERM.
fn responder() {
    let rt = driver_runtime();
    rt.block_on(async {
        let (p, send, sse) = canned().await.expect("the canned responder");
        println!("send {send}");
        println!("sse {sse}");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        drop(p);
    });
}

/// A row of the table.
struct Row {
    label: String,
    get: fn(&Figures) -> Option<f64>,
    digits: usize,
    /// A fixed-rate row's scenario and rate: a cell offered [`OVERLOAD`] of
    /// its own column's saturation or more is marked, and given no ratio.
    rate: Option<(usize, f64)>,
}

pub fn run() {
    if std::env::args().any(|a| a == RESPONDER) {
        responder();
        return;
    }
    harness::gateway::product_log_unless_set();
    let rt = driver_runtime();
    let load_before = loadavg();
    let ticks_before = machine_ticks();
    let started = Instant::now();
    let (cols, figs, canned_cpu, rates) = rt.block_on(async {
        let (canned_p, c_send, c_sse) = canned().await.expect("the canned responder");
        let canned_pid = vec![canned_p.child.id()];
        let (nginx_p, n_send, n_sse) = nginx_proxy(&c_send, &c_sse).await.expect("nginx proxy");
        let (bare_send_p, b_send, _) = start_bare(&c_send).await.expect("bare pingora");
        let (bare_sse_p, b_sse, _) = start_bare(&c_sse).await.expect("bare pingora");
        let route = |up: &str| {
            format!(
                "[[routes]]\nname = \"w\"\nworker = \"http://{up}\"\nblocking_sends = \"pass\"\n"
            )
        };
        let mut gw_send = Gateway::start(&route(&c_send)).await;
        let mut gw_sse = Gateway::start(&route(&c_sse)).await;
        let cols = vec![
            Col {
                name: "direct (the canned nginx)",
                short: "direct",
                send: c_send.clone(),
                sse: c_sse.clone(),
                procs: canned_pid.clone(),
            },
            Col {
                name: "nginx (2 workers)",
                short: "nginx",
                send: n_send,
                sse: n_sse,
                procs: vec![nginx_p.child.id()],
            },
            Col {
                name: "bare pingora (2 threads)",
                short: "bare pingora",
                send: b_send,
                sse: b_sse,
                procs: vec![bare_send_p.child.id(), bare_sse_p.child.id()],
            },
            Col {
                name: "gateway (memory, pass; 2 threads)",
                short: "the gateway",
                send: authority(&gw_send.url),
                sse: authority(&gw_sse.url),
                procs: gw_send.pid().into_iter().chain(gw_sse.pid()).collect(),
            },
        ];
        let bodies = [send_body(1), stream_body()];
        let target = |c: &Col, k: usize| -> String {
            if k == 0 {
                c.send.clone()
            } else {
                c.sse.clone()
            }
        };
        let mut figs: Vec<Figures> = cols.iter().map(|_| Figures::default()).collect();
        // The canned responder's CPU per request in each column's best runs.
        let mut canned_cpu: Vec<[Option<f64>; 2]> = cols.iter().map(|_| [None, None]).collect();
        for c in &cols {
            for (k, body) in bodies.iter().enumerate() {
                let _ = run_wrk(&target(c, k), body, &c.procs).await;
            }
        }
        for round in 0..ROUNDS {
            eprintln!("canned, round {}/{ROUNDS}", round + 1);
            for (i, c) in cols.iter().enumerate() {
                for (k, body) in bodies.iter().enumerate() {
                    let cb = cpu_split(&canned_pid);
                    let Some(r) = run_wrk(&target(c, k), body, &c.procs).await else {
                        continue;
                    };
                    let cc = match (cb, cpu_split(&canned_pid)) {
                        (Some((u0, s0)), Some((u1, s1))) => {
                            Some(per_request((u1 + s1) - (u0 + s0), r.s.requests))
                        }
                        _ => None,
                    };
                    let best = &mut figs[i].best[k];
                    if best.as_ref().is_none_or(|b| r.s.rps > b.s.rps) {
                        *best = Some(r);
                        canned_cpu[i][k] = cc;
                    }
                }
            }
        }
        // The fixed rates: half of the slowest proxy's saturation (the
        // direct column is no proxy), and half of nginx's.
        let mut rates = Rates::default();
        for k in 0..2 {
            rates.low[k] = (1..cols.len())
                .filter_map(|i| Some((figs[i].rps(k)?, i)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(r, i)| ((r / 2.0).floor(), i));
            rates.nginx_half[k] = figs[1].rps(k).map(|r| (r / 2.0).floor());
        }
        eprintln!(
            "canned, fixed rates: {:?} (half of the slowest proxy's), {:?} (half of nginx's); SendMessage/s, streams/s",
            rates.low, rates.nginx_half
        );
        // Below every proxy's saturation first, then half of nginx's.
        for nginx_half in [false, true] {
            for (i, c) in cols.iter().enumerate() {
                for (k, body) in bodies.iter().enumerate() {
                    let rate = if nginx_half {
                        rates.nginx_half[k]
                    } else {
                        rates.low[k].map(|(r, _)| r)
                    };
                    let Some(rate) = rate else { continue };
                    let f = fixed(&target(c, k), body, rate).await;
                    if nginx_half {
                        figs[i].nginx_half[k] = f;
                    } else {
                        figs[i].low[k] = f;
                    }
                }
            }
        }
        drop((canned_p, nginx_p, bare_send_p, bare_sse_p));
        gw_send.kill().await;
        gw_sse.kill().await;
        (cols, figs, canned_cpu, rates)
    });
    let steal = steal_pct(ticks_before, machine_ticks());
    let rate_text = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.0}"));
    println!();
    println!(
        "proxy bench, canned responder, {} — {}; load average {load_before} before, {} after; {:.0} s; CPU time stolen by the host {steal}",
        utc_now(),
        cpus(),
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "{}; canned responder: nginx, 1 worker process (SendMessage ~1 KB, SSE {EVENTS} events); wrk -t{WRK_THREADS} -c32 {SECONDS}s, best of {ROUNDS} rounds; fixed rates (open loop, {FIXED_CONNS} connections, {FIXED_SECONDS}s, one run per cell): half of the slowest proxy's saturation ({} SendMessage/s, {} streams/s) and half of nginx's ({} SendMessage/s, {} streams/s)",
        sh(NGINX, &["-v"]),
        rate_text(rates.low[0].map(|(r, _)| r)),
        rate_text(rates.low[1].map(|(r, _)| r)),
        rate_text(rates.nginx_half[0]),
        rate_text(rates.nginx_half[1]),
    );
    println!();
    let mut header = String::from("| |");
    for c in &cols {
        header.push_str(&format!(" {} |", c.name));
    }
    header.push_str(" gw / bare | gw / nginx | bare / nginx |");
    println!("{header}");
    println!("|{}", "---|".repeat(cols.len() + 4));
    let low_label = |k: usize, what: &str, unit: &str| -> (String, Option<(usize, f64)>) {
        match rates.low[k] {
            Some((r, i)) => (
                format!(
                    "{what} at {r:.0}/s = half of the slowest proxy's saturation ({}), below every proxy's: {unit}",
                    cols[i].short
                ),
                Some((k, r)),
            ),
            None => (format!("{what} at half of the slowest proxy's saturation: {unit}"), None),
        }
    };
    let nginx_label = |k: usize, what: &str, unit: &str| -> (String, Option<(usize, f64)>) {
        match rates.nginx_half[k] {
            Some(r) => (
                format!(
                    "{what} at {r:.0}/s = half of nginx's saturation: {unit} (‡: overload, see below)"
                ),
                Some((k, r)),
            ),
            None => (format!("{what} at half of nginx's saturation: {unit}"), None),
        }
    };
    let plain = |label: &str, get: fn(&Figures) -> Option<f64>, digits: usize| Row {
        label: label.to_string(),
        get,
        digits,
        rate: None,
    };
    let fixed_row = |(label, rate): (String, Option<(usize, f64)>),
                     get: fn(&Figures) -> Option<f64>| Row {
        label,
        get,
        digits: 3,
        rate,
    };
    let rows: Vec<Row> = vec![
        plain("SendMessage requests/s (saturation)", |f| f.rps(0), 0),
        plain(
            "SendMessage: CPU per request (µs, user + system; direct: the responder's)",
            |f| f.best[0].as_ref()?.s.cpu_us,
            1,
        ),
        plain(
            "SendMessage: of which system (kernel) time (µs)",
            |f| f.best[0].as_ref()?.sys_us,
            1,
        ),
        fixed_row(low_label(0, "SendMessage", "p50 (ms)"), |f| {
            f.low[0].as_ref().map(|x| x.p50_ms)
        }),
        fixed_row(low_label(0, "SendMessage", "p99 (ms)"), |f| {
            f.low[0].as_ref().map(|x| x.p99_ms)
        }),
        fixed_row(nginx_label(0, "SendMessage", "p50 (ms)"), |f| {
            f.nginx_half[0].as_ref().map(|x| x.p50_ms)
        }),
        fixed_row(nginx_label(0, "SendMessage", "p99 (ms)"), |f| {
            f.nginx_half[0].as_ref().map(|x| x.p99_ms)
        }),
        plain(
            &format!("SSE streams/s ({EVENTS} events each; saturation)"),
            |f| f.rps(1),
            0,
        ),
        plain("SSE events/s", |f| f.rps(1).map(|r| r * EVENTS as f64), 0),
        plain(
            "SSE: CPU per stream (µs; direct: the responder's)",
            |f| f.best[1].as_ref()?.s.cpu_us,
            1,
        ),
        plain(
            "SSE: of which system (kernel) time (µs)",
            |f| f.best[1].as_ref()?.sys_us,
            1,
        ),
        fixed_row(low_label(1, "SSE stream", "p50 (ms, whole stream)"), |f| {
            f.low[1].as_ref().map(|x| x.p50_ms)
        }),
        fixed_row(low_label(1, "SSE stream", "p99 (ms)"), |f| {
            f.low[1].as_ref().map(|x| x.p99_ms)
        }),
        fixed_row(
            nginx_label(1, "SSE stream", "p50 (ms, whole stream)"),
            |f| f.nginx_half[1].as_ref().map(|x| x.p50_ms),
        ),
        fixed_row(nginx_label(1, "SSE stream", "p99 (ms)"), |f| {
            f.nginx_half[1].as_ref().map(|x| x.p99_ms)
        }),
    ];
    // Whether column `i`'s cell in `row` was offered OVERLOAD of its own
    // saturation or more.
    let overloaded = |row: &Row, i: usize| {
        row.rate
            .is_some_and(|(k, rate)| figs[i].rps(k).is_some_and(|sat| rate >= OVERLOAD * sat))
    };
    for row in &rows {
        let digits = row.digits;
        let mut line = format!("| {} |", row.label);
        for (i, f) in figs.iter().enumerate() {
            match (row.get)(f) {
                Some(v) if overloaded(row, i) => line.push_str(&format!(" {v:.digits$} ‡ |")),
                Some(v) => line.push_str(&format!(" {v:.digits$} |")),
                None => line.push_str(" n/a |"),
            }
        }
        let ratio = |a: usize, b: usize| match ((row.get)(&figs[a]), (row.get)(&figs[b])) {
            _ if overloaded(row, a) || overloaded(row, b) => " - |".to_string(),
            (Some(a), Some(b)) if b > 0.0 => format!(" {:.2} |", a / b),
            _ => " - |".to_string(),
        };
        line.push_str(&ratio(3, 2));
        line.push_str(&ratio(3, 1));
        line.push_str(&ratio(2, 1));
        println!("{line}");
    }
    println!();
    println!(
        "‡ offered {:.0}% or more of this column's own saturation (its requests/s or streams/s above): what it shows is queueing under overload, not the proxy's latency, and no ratio is given for it.",
        OVERLOAD * 100.0
    );
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    println!(
        "the canned responder's own CPU per request in each column's best run (µs, SendMessage / SSE stream): {}",
        cols.iter()
            .zip(&canned_cpu)
            .map(|(c, [s, x])| format!("{} {} / {}", c.name, show(*s), show(*x)))
            .collect::<Vec<_>>()
            .join("; ")
    );
}
