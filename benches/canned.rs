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
//! interleaved rounds: requests/s, and the CPU (user + system from `/proc`)
//! its processes spent per request in that run; then latency at a fixed
//! rate, half of nginx's saturation (the open-loop driver of the main table,
//! 16 connections), p50 and p99. The same for `SendStreamingMessage`, one
//! request being one whole stream. The direct column is the canned
//! responder alone.

use super::*;

pub const FLAG: &str = "--canned";
/// Events in the canned SSE stream.
const EVENTS: usize = 50;
const SECONDS: u32 = 5;
const ROUNDS: usize = 3;
const FIXED_SECONDS: f64 = 5.0;
const WRK_THREADS: u32 = 1;

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
    send: String,
    sse: String,
    procs: Vec<u32>,
}

#[derive(Default)]
struct Figures {
    send: Option<Send>,
    sse: Option<Send>,
    send_fixed: Option<Fixed>,
    sse_fixed: Option<Fixed>,
}

/// `wrk` against `url`, with the CPU `procs` spent per request.
async fn run_wrk(url: &str, body: &str, procs: &[u32]) -> Option<Send> {
    let before = cpu_ticks(procs);
    let (u, b) = (format!("http://{url}"), body.to_string());
    let mut s = tokio::task::spawn_blocking(move || wrk_with(&u, &b, WRK_THREADS, SECONDS))
        .await
        .ok()??;
    if let (Some(b), Some(a)) = (before, cpu_ticks(procs)) {
        s.cpu_us = Some((a - b) as f64 / USER_HZ * 1e6 / s.requests.max(1.0));
    }
    Some(s)
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

pub fn run() {
    harness::gateway::quiet_log_unless_set();
    let rt = driver_runtime();
    let load_before = loadavg();
    let ticks_before = machine_ticks();
    let started = Instant::now();
    let (cols, figs, canned_cpu) = rt.block_on(async {
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
                send: c_send.clone(),
                sse: c_sse.clone(),
                procs: canned_pid.clone(),
            },
            Col {
                name: "nginx (2 workers)",
                send: n_send,
                sse: n_sse,
                procs: vec![nginx_p.child.id()],
            },
            Col {
                name: "bare pingora (2 threads)",
                send: b_send,
                sse: b_sse,
                procs: vec![bare_send_p.child.id(), bare_sse_p.child.id()],
            },
            Col {
                name: "gateway (memory, pass; 2 threads)",
                send: authority(&gw_send.url),
                sse: authority(&gw_sse.url),
                procs: gw_send.pid().into_iter().chain(gw_sse.pid()).collect(),
            },
        ];
        let (send_b, sse_b) = (send_body(1), stream_body());
        let mut figs: Vec<Figures> = cols.iter().map(|_| Figures::default()).collect();
        // The canned responder's CPU per request in each column's best runs.
        let mut canned_cpu: Vec<[Option<f64>; 2]> = cols.iter().map(|_| [None, None]).collect();
        for c in &cols {
            let _ = run_wrk(&c.send, &send_b, &c.procs).await;
            let _ = run_wrk(&c.sse, &sse_b, &c.procs).await;
        }
        for round in 0..ROUNDS {
            eprintln!("canned, round {}/{ROUNDS}", round + 1);
            for (i, c) in cols.iter().enumerate() {
                for (k, (url, body)) in [(&c.send, &send_b), (&c.sse, &sse_b)]
                    .into_iter()
                    .enumerate()
                {
                    let cb = cpu_ticks(&canned_pid);
                    let Some(s) = run_wrk(url, body, &c.procs).await else {
                        continue;
                    };
                    let cc = match (cb, cpu_ticks(&canned_pid)) {
                        (Some(b), Some(a)) => {
                            Some((a - b) as f64 / USER_HZ * 1e6 / s.requests.max(1.0))
                        }
                        _ => None,
                    };
                    let best = if k == 0 {
                        &mut figs[i].send
                    } else {
                        &mut figs[i].sse
                    };
                    if best.as_ref().is_none_or(|b| s.rps > b.rps) {
                        *best = Some(s);
                        canned_cpu[i][k] = cc;
                    }
                }
            }
        }
        // Latency at half of nginx's saturation.
        let half = |k: usize| {
            let f = &figs[1];
            (if k == 0 { &f.send } else { &f.sse })
                .as_ref()
                .map(|s| (s.rps / 2.0).floor())
        };
        if let (Some(rs), Some(rx)) = (half(0), half(1)) {
            eprintln!("canned, fixed rate: {rs} SendMessage/s, {rx} streams/s");
            for (i, c) in cols.iter().enumerate() {
                figs[i].send_fixed = fixed(&c.send, &send_b, rs).await;
                figs[i].sse_fixed = fixed(&c.sse, &sse_b, rx).await;
            }
        }
        drop((canned_p, nginx_p, bare_send_p, bare_sse_p));
        gw_send.kill().await;
        gw_sse.kill().await;
        (cols, figs, canned_cpu)
    });
    let steal = steal_pct(ticks_before, machine_ticks());
    println!();
    println!(
        "proxy bench, canned responder, {} — {}; load average {load_before} before, {} after; {:.0} s; CPU time stolen by the host {steal}",
        utc_now(),
        cpus(),
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "{}; canned responder: nginx, 1 worker process (SendMessage ~1 KB, SSE {EVENTS} events); wrk -t{WRK_THREADS} -c32 {SECONDS}s, best of {ROUNDS} rounds; fixed rate: half of nginx's saturation, {FIXED_CONNS} connections, {FIXED_SECONDS}s",
        sh(NGINX, &["-v"])
    );
    println!();
    let mut header = String::from("| |");
    for c in &cols {
        header.push_str(&format!(" {} |", c.name));
    }
    header.push_str(" gw / bare | gw / nginx | bare / nginx |");
    println!("{header}");
    println!("|{}", "---|".repeat(cols.len() + 4));
    type Get = fn(&Figures) -> Option<f64>;
    let rows: Vec<(String, Get, usize)> = vec![
        (
            "SendMessage requests/s".into(),
            |f| f.send.as_ref().map(|s| s.rps),
            0,
        ),
        (
            "SendMessage: CPU per request (µs, user + system; direct: the responder's)".into(),
            |f| f.send.as_ref()?.cpu_us,
            1,
        ),
        (
            "SendMessage at half of nginx's saturation, p50 (ms)".into(),
            |f| f.send_fixed.as_ref().map(|x| x.p50_ms),
            3,
        ),
        (
            "SendMessage at half of nginx's saturation, p99 (ms)".into(),
            |f| f.send_fixed.as_ref().map(|x| x.p99_ms),
            3,
        ),
        (
            format!("SSE streams/s ({EVENTS} events each)"),
            |f| f.sse.as_ref().map(|s| s.rps),
            0,
        ),
        (
            "SSE events/s".into(),
            |f| f.sse.as_ref().map(|s| s.rps * EVENTS as f64),
            0,
        ),
        (
            "SSE: CPU per stream (µs; direct: the responder's)".into(),
            |f| f.sse.as_ref()?.cpu_us,
            1,
        ),
        (
            "SSE stream at half of nginx's saturation, p50 (ms, whole stream)".into(),
            |f| f.sse_fixed.as_ref().map(|x| x.p50_ms),
            3,
        ),
        (
            "SSE stream at half of nginx's saturation, p99 (ms)".into(),
            |f| f.sse_fixed.as_ref().map(|x| x.p99_ms),
            3,
        ),
    ];
    for (label, get, digits) in &rows {
        let mut line = format!("| {label} |");
        for f in &figs {
            match get(f) {
                Some(v) => line.push_str(&format!(" {v:.digits$} |")),
                None => line.push_str(" n/a |"),
            }
        }
        let ratio = |a: usize, b: usize| match (get(&figs[a]), get(&figs[b])) {
            (Some(a), Some(b)) if b > 0.0 => format!(" {:.2} |", a / b),
            _ => " - |".to_string(),
        };
        line.push_str(&ratio(3, 2));
        line.push_str(&ratio(3, 1));
        line.push_str(&ratio(2, 1));
        println!("{line}");
    }
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    println!();
    println!(
        "the canned responder's own CPU per request in each column's best run (µs, SendMessage / SSE stream): {}",
        cols.iter()
            .zip(&canned_cpu)
            .map(|(c, [s, x])| format!("{} {} / {}", c.name, show(*s), show(*x)))
            .collect::<Vec<_>>()
            .join("; ")
    );
}
