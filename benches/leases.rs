//! What the shared store costs and how fast a lapsed lease is acted on, in
//! one run. `cargo bench -p a2a-gateway --bench leases` (needs
//! `redis-server`).
//!
//! Scenarios:
//! - Store round trips per task lifetime: N tasks of `burst:<n>` streamed
//!   one after another through a gateway with `[store] url = "redis://…"`,
//!   with and without a lease grant, for two event counts. Redis answers
//!   what it ran: `INFO commandstats` before and after (every command,
//!   including those a Lua script runs) and a `MONITOR` connection (which
//!   tells a client's round trip from a command run inside a script). The
//!   reaper's per-tick claim, measured over an idle second first, is
//!   reported on its own and taken out of the per-task figures.
//! - Store round trips per cascade: N streams of `trickle:<n>:2` through
//!   the same gateway whose caller leaves after reading 5 or 50 events: the
//!   cascade cancels each child (no lease). The breakdown shows what the
//!   outbox costs (`outbox_put` before the first attempt, `outbox_done`
//!   after the answer, which ends the task's lease too: before the outbox
//!   that was one `lease_end`), and the two event counts that nothing is
//!   paid per event.
//! - Lapse-to-cancel latency: 10,000 live leases with far deadlines put in
//!   the deadline index directly, then 20 leased streams (TTL 1 s, never
//!   renewed) through the gateway; for each, the time from its lapse to the
//!   worker reporting `TASK_STATE_CANCELED`. The memory store is run with
//!   the 20 leases alone.
//!
//! Under `cargo test` (no `--bench` argument) it only says it was skipped.

// A benchmark's report is its standard output.
#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
#[allow(dead_code, unused_imports, clippy::all)]
mod harness;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use a2a_gateway::store::redis::RedisStore;
use a2a_gateway::store::{now_ms, Asker, TaskKey, TaskStore};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use harness::gateway::Gateway;
use harness::http::get_task_state;
use harness::redis::RedisServer;
use harness::rust_worker::{RustWorker, RustWorkerOptions};
use harness::stream::SseStream;
use harness::worker::{message, state_of, task_id_of};

const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";
const CANCELED: &str = "TASK_STATE_CANCELED";
/// Tasks streamed per round-trip variant.
const TASKS: usize = 200;
/// Live leases with far deadlines in the index during the lapse run.
const FAKE_LEASES: usize = 10_000;
/// Leased streams whose lapse is timed.
const LAPSING: usize = 20;
const LAPSE_TTL_MS: u64 = 1000;
/// The gateway's default `[leases] tick`.
const TICK: Duration = Duration::from_millis(100);
/// Commands this bench sends itself, never the gateway.
const OWN_COMMANDS: [&str; 4] = ["info", "echo", "monitor", "ping"];

// ── Redis, spoken raw ───────────────────────────────────────────────────────

fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// One connection for `INFO commandstats` and `ECHO` markers.
struct Admin {
    conn: BufReader<TcpStream>,
}

impl Admin {
    async fn connect(port: u16) -> Admin {
        let s = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect redis");
        Admin {
            conn: BufReader::new(s),
        }
    }

    /// Sends a command whose answer is a bulk string; returns it.
    async fn bulk(&mut self, args: &[&str]) -> String {
        self.conn.get_mut().write_all(&resp(args)).await.unwrap();
        let mut head = String::new();
        self.conn.read_line(&mut head).await.unwrap();
        let len: usize = head
            .trim_end()
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected redis answer {head:?}"));
        let mut body = vec![0u8; len + 2];
        self.conn.read_exact(&mut body).await.unwrap();
        body.truncate(len);
        String::from_utf8_lossy(&body).into_owned()
    }

    /// `calls=` of every `cmdstat_*` line, by command name.
    async fn commandstats(&mut self) -> BTreeMap<String, u64> {
        let text = self.bulk(&["INFO", "commandstats"]).await;
        text.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .split(',')
                    .next()?
                    .strip_prefix("calls=")?
                    .parse()
                    .ok()?;
                Some((name.to_string(), calls))
            })
            .collect()
    }
}

/// Commands the gateway caused between two `commandstats` snapshots.
fn gateway_commands(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .filter(|(name, _)| !OWN_COMMANDS.contains(&name.as_str()))
        .map(|(name, n)| n - before.get(name).copied().unwrap_or(0))
        .sum()
}

/// The label of a replica's heartbeat (once a second, not per task).
const HEARTBEAT: &str = "replica heartbeat (SET, with TIME)";
/// The label of the outbox's claim (once a tick, not per task).
const OUTBOX_CLAIM: &str = "outbox_claim";
/// Streamed tasks whose caller leaves, per cascade variant.
const CASCADES: usize = 200;
/// What a cascaded child does: many updates 2 ms apart (it is cancelled
/// long before the end).
const CASCADE_TASK: &str = "trickle:100000:2";
/// Background labels, per tick or per second, never per task.
const BACKGROUND: [&str; 3] = ["lease_claim_lapsed", HEARTBEAT, OUTBOX_CLAIM];

/// One client command as `MONITOR` shows it, with the commands its script
/// ran (shown as `[0 lua]` right after it).
#[derive(Debug, Clone)]
struct TopLevel {
    name: String,
    first_arg: String,
    inner: Vec<String>,
}

impl TopLevel {
    /// What the gateway was doing: the store call a script belongs to,
    /// told by what the script ran first.
    fn label(&self) -> String {
        if self.name != "evalsha" && self.name != "eval" {
            return match self.name.as_str() {
                "hgetall" => "get (HGETALL)".into(),
                "set" | "del" if self.first_arg.contains(":replica:") => HEARTBEAT.into(),
                "zcard" => "lease_count (ZCARD)".into(),
                "hget" if self.inner.is_empty() => "outbox_owns (HGET)".into(),
                other => other.to_uppercase(),
            };
        }
        let first = self.inner.first().map(String::as_str).unwrap_or("");
        let cmd = first.split(' ').next().unwrap_or("").to_ascii_uppercase();
        match cmd.as_str() {
            "ZRANGEBYSCORE" if first.contains(":outbox:") => OUTBOX_CLAIM.into(),
            "ZRANGEBYSCORE" => "lease_claim_lapsed".into(),
            "HGETALL" => "get".into(),
            "HGET" if first.contains("ob_owner") => "outbox_put".into(),
            "HGET" if first.contains("ob_token") => "outbox_retry".into(),
            "HSET" if first.contains("lease_deadline") => "lease_start".into(),
            "HSET" => "update".into(),
            "HDEL" if first.contains("ob_owner") => "outbox_done".into(),
            "HDEL" => "lease_end".into(),
            // lease_start first drops an earlier lease's hand-back.
            "ZREM" => "lease_start".into(),
            "ZSCORE" => "lease_renew".into(),
            "SCAN" => "list".into(),
            _ => format!("script {}", &self.first_arg[..self.first_arg.len().min(8)]),
        }
    }
}

/// The quoted words of a MONITOR line after `[db source]`.
fn monitor_words(rest: &str) -> Vec<String> {
    rest.split("\" \"")
        .map(|w| w.trim().trim_matches('"').to_string())
        .collect()
}

/// A `MONITOR` connection read in the background.
struct Monitor {
    seen: Arc<Mutex<Vec<TopLevel>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    async fn start(port: u16) -> Monitor {
        let mut s = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect redis");
        s.write_all(&resp(&["MONITOR"])).await.unwrap();
        let mut conn = BufReader::new(s);
        let mut ok = String::new();
        conn.read_line(&mut ok).await.unwrap();
        assert_eq!(ok.trim_end(), "+OK", "MONITOR refused");
        let seen = Arc::new(Mutex::new(Vec::<TopLevel>::new()));
        let sink = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut line = String::new();
            loop {
                line.clear();
                match conn.read_line(&mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                // `+1700000000.123456 [0 127.0.0.1:5000] "evalsha" "ab…" "2" …`
                let Some((source, rest)) =
                    line.split_once('[').and_then(|(_, r)| r.split_once("] "))
                else {
                    continue;
                };
                let words = monitor_words(rest.trim_end());
                let mut seen = sink.lock().unwrap();
                if source.ends_with(" lua") {
                    if let Some(last) = seen.last_mut() {
                        last.inner.push(words.join(" "));
                    }
                } else {
                    seen.push(TopLevel {
                        name: words.first().cloned().unwrap_or_default().to_lowercase(),
                        first_arg: words.get(1).cloned().unwrap_or_default(),
                        inner: Vec::new(),
                    });
                }
            }
        });
        Monitor { seen, task }
    }

    /// Sends a marker through `admin` and waits until MONITOR showed it:
    /// everything before it has been read. Returns the position.
    async fn mark(&self, admin: &mut Admin) -> usize {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let tag = format!(
            "bench-mark-{}",
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let _ = admin.bulk(&["ECHO", &tag]).await;
        for _ in 0..2000 {
            {
                let seen = self.seen.lock().unwrap();
                if let Some(i) = seen
                    .iter()
                    .rposition(|t| t.name == "echo" && t.first_arg == tag)
                {
                    return i;
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("MONITOR never showed {tag}");
    }

    /// The gateway's round trips between two marks, by label.
    fn between(&self, from: usize, to: usize) -> BTreeMap<String, u64> {
        let seen = self.seen.lock().unwrap();
        let mut out = BTreeMap::new();
        for t in &seen[from + 1..to] {
            // A heartbeat's `TIME` (the store clock's sample) travels in
            // one pipeline with its `SET`: the same round trip.
            if OWN_COMMANDS.contains(&t.name.as_str()) || t.name == "time" {
                continue;
            }
            *out.entry(t.label()).or_insert(0) += 1;
        }
        out
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ── Streams ─────────────────────────────────────────────────────────────────

fn stream_body(text: &str, lease_ttl_ms: Option<u64>) -> Value {
    let mut msg = message(text);
    if let Some(ttl) = lease_ttl_ms {
        msg["metadata"] = json!({ "a2a-rust.com/lease": { "ttlMs": ttl } });
        msg["extensions"] = json!([LEASE_URI]);
    }
    json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": msg}})
}

/// Streams one task to its end; returns how many events the caller got.
async fn stream_task(url: &str, text: &str, lease_ttl_ms: Option<u64>) -> usize {
    let mut s = SseStream::open(url, "/", &[], &stream_body(text, lease_ttl_ms)).await;
    assert_eq!(s.status, 200, "stream refused");
    let events = s.rest(Duration::from_secs(30)).await;
    assert_eq!(
        events.last().and_then(state_of).as_deref(),
        Some("TASK_STATE_COMPLETED"),
        "the task did not complete"
    );
    events.len()
}

/// Opens a leased stream and reads until an event names the task.
async fn open_leased(url: &str, ttl_ms: u64, text: &str) -> (SseStream, String) {
    let mut s = SseStream::open(url, "/", &[], &stream_body(text, Some(ttl_ms))).await;
    assert_eq!(s.status, 200, "stream refused");
    loop {
        let ev = s.next(Duration::from_secs(10)).await.expect("an event");
        if let Some(id) = task_id_of(&ev) {
            return (s, id);
        }
    }
}

// ── Scenario 1: round trips per task ────────────────────────────────────────

struct Background {
    round_trips_per_tick: f64,
    commands_per_tick: f64,
    round_trips: BTreeMap<String, u64>,
}

async fn idle_background(admin: &mut Admin, monitor: &Monitor) -> Background {
    let secs = 1.0;
    let before = admin.commandstats().await;
    let m0 = monitor.mark(admin).await;
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let m1 = monitor.mark(admin).await;
    let after = admin.commandstats().await;
    let round_trips = monitor.between(m0, m1);
    let ticks = secs / TICK.as_secs_f64();
    Background {
        round_trips_per_tick: round_trips.values().sum::<u64>() as f64 / ticks,
        commands_per_tick: gateway_commands(&before, &after) as f64 / ticks,
        round_trips,
    }
}

struct PerTask {
    events: f64,
    /// Client round trips with the reaper's claims left out, exactly.
    round_trips: f64,
    /// Client round trips minus the idle rate scaled by the run's duration.
    round_trips_rate: f64,
    /// Every command Redis ran (scripts' included), minus the idle rate.
    commands: f64,
    breakdown: BTreeMap<String, f64>,
}

async fn run_tasks(
    gw_url: &str,
    admin: &mut Admin,
    monitor: &Monitor,
    bg: &Background,
    burst: usize,
    lease: Option<u64>,
) -> PerTask {
    let text = format!("burst:{burst}");
    let before = admin.commandstats().await;
    let m0 = monitor.mark(admin).await;
    let start = Instant::now();
    let mut events = 0;
    for _ in 0..TASKS {
        events += stream_task(gw_url, &text, lease).await;
    }
    // Let each stream's end (watcher count, read-back) reach the store.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m1 = monitor.mark(admin).await;
    let after = admin.commandstats().await;
    let ticks = start.elapsed().as_secs_f64() / TICK.as_secs_f64();
    let by_label = monitor.between(m0, m1);
    let n = TASKS as f64;
    per_task(&by_label, bg, ticks, &before, &after, events, n)
}

/// Per-task figures from one run's round trips by label and command stats.
fn per_task(
    by_label: &BTreeMap<String, u64>,
    bg: &Background,
    ticks: f64,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    events: usize,
    n: f64,
) -> PerTask {
    let all: u64 = by_label.values().sum();
    let claims: u64 = BACKGROUND
        .iter()
        .map(|l| by_label.get(*l).copied().unwrap_or(0))
        .sum();
    PerTask {
        events: events as f64 / n,
        round_trips: (all - claims) as f64 / n,
        round_trips_rate: (all as f64 - bg.round_trips_per_tick * ticks) / n,
        commands: (gateway_commands(before, after) as f64 - bg.commands_per_tick * ticks) / n,
        breakdown: by_label
            .iter()
            .filter(|(k, _)| !BACKGROUND.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), *v as f64 / n))
            .collect(),
    }
}

/// [`CASCADES`] streams of [`CASCADE_TASK`], one after another, each left
/// by its caller after `leave_after` events: the gateway cancels each
/// child. Waits until the worker counted every cancel.
async fn run_cascades(
    gw_url: &str,
    worker: &RustWorker,
    admin: &mut Admin,
    monitor: &Monitor,
    bg: &Background,
    leave_after: usize,
) -> PerTask {
    let cancels = worker.cancels();
    let before = admin.commandstats().await;
    let m0 = monitor.mark(admin).await;
    let start = Instant::now();
    let mut events = 0;
    for _ in 0..CASCADES {
        let mut s = SseStream::open(gw_url, "/", &[], &stream_body(CASCADE_TASK, None)).await;
        assert_eq!(s.status, 200, "stream refused");
        for _ in 0..leave_after {
            s.next(Duration::from_secs(10)).await.expect("an event");
            events += 1;
        }
        s.close();
    }
    let give_up = Instant::now() + Duration::from_secs(30);
    while worker.cancels() < cancels + CASCADES {
        assert!(
            Instant::now() < give_up,
            "{} of {CASCADES} children cancelled",
            worker.cancels() - cancels
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the last cancels' removal from the outbox reach the store.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m1 = monitor.mark(admin).await;
    let after = admin.commandstats().await;
    let ticks = start.elapsed().as_secs_f64() / TICK.as_secs_f64();
    let by_label = monitor.between(m0, m1);
    per_task(
        &by_label,
        bg,
        ticks,
        &before,
        &after,
        events,
        CASCADES as f64,
    )
}

// ── Scenario 2: lapse to cancel ─────────────────────────────────────────────

/// Puts `n` live leases (deadline an hour away) in the index, as other
/// replicas' callers would have.
async fn fake_leases(redis_url: &str, n: usize) -> u64 {
    let store = Arc::new(
        RedisStore::connect(redis_url, "a2agw")
            .await
            .expect("connect the store"),
    );
    let now = now_ms();
    futures::stream::iter(0..n)
        .map(|i| {
            let store = Arc::clone(&store);
            async move {
                let key = TaskKey {
                    route: "w".into(),
                    tenant: "bench".into(),
                    task_id: format!("fake-{i}").into(),
                };
                store
                    .lease_start(
                        &key,
                        3_600_000,
                        Some("another-replica"),
                        now,
                        &Asker::Unverified,
                    )
                    .await
                    .expect("lease_start");
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    store.lease_count().await.expect("lease_count")
}

/// Opens `LAPSING` leased streams (staggered, so lapses fall at different
/// points of the reaper's tick), never renews them, and times each from its
/// lapse to `TASK_STATE_CANCELED` on the worker. Milliseconds, sorted.
async fn lapse_latencies(gw_url: &str, worker_url: &str) -> Vec<f64> {
    let mut handles = Vec::new();
    for i in 0..LAPSING {
        let (gw_url, worker_url) = (gw_url.to_string(), worker_url.to_string());
        handles.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(37 * i as u64)).await;
            let (stream, id) = open_leased(&gw_url, LAPSE_TTL_MS, "work:60000").await;
            let lapse = tokio::time::Instant::now() + Duration::from_millis(LAPSE_TTL_MS);
            tokio::time::sleep_until(lapse - Duration::from_millis(30)).await;
            let give_up = lapse + Duration::from_secs(5);
            loop {
                let state = get_task_state(&worker_url, None, &id).await;
                let now = tokio::time::Instant::now();
                if state.as_deref() == Some(CANCELED) {
                    drop(stream);
                    let ms = if now >= lapse {
                        (now - lapse).as_secs_f64() * 1000.0
                    } else {
                        -((lapse - now).as_secs_f64() * 1000.0)
                    };
                    return ms;
                }
                assert!(
                    now < give_up,
                    "task {id} not canceled 5 s after its lapse ({state:?})"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("lapse task"));
    }
    out.sort_by(f64::total_cmp);
    out
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn latency_cell(l: &[f64]) -> String {
    format!(
        "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (min {:.0} ms)",
        pct(l, 50.0),
        pct(l, 99.0),
        l[l.len() - 1],
        l[0]
    )
}

fn breakdown_cell(b: &BTreeMap<String, f64>) -> String {
    b.iter()
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("leases bench: skipped (run `cargo bench -p a2a-gateway --bench leases`)");
        return;
    }
    harness::gateway::product_log_unless_set();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let started = Instant::now();
        let redis = RedisServer::start().await;
        let worker = RustWorker::start(RustWorkerOptions::default()).await;
        let gw = Gateway::start(&format!(
            "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
            redis.url(),
            worker.url()
        ))
        .await;
        let mut admin = Admin::connect(redis.port).await;
        let monitor = Monitor::start(redis.port).await;

        // Warm up: the scripts get loaded, connections opened.
        for lease in [None, Some(60_000)] {
            for _ in 0..5 {
                stream_task(&gw.url, "burst:5", lease).await;
            }
        }
        // And the outbox's scripts: a few cascades.
        for _ in 0..5 {
            let mut s = SseStream::open(&gw.url, "/", &[], &stream_body(CASCADE_TASK, None)).await;
            s.next(Duration::from_secs(10)).await.expect("an event");
            s.close();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;

        let bg = idle_background(&mut admin, &monitor).await;
        let mut rows = Vec::new();
        for lease in [None, Some(60_000)] {
            for burst in [5, 50] {
                let r = run_tasks(&gw.url, &mut admin, &monitor, &bg, burst, lease).await;
                rows.push((burst, lease, r));
            }
        }
        let mut cascades = Vec::new();
        for leave_after in [5, 50] {
            let r = run_cascades(&gw.url, &worker, &mut admin, &monitor, &bg, leave_after).await;
            cascades.push((leave_after, r));
        }
        drop(monitor);

        // Lapse to cancel, Redis, with 10k other live leases in the index.
        let live = fake_leases(&redis.url(), FAKE_LEASES).await;
        let redis_lat = lapse_latencies(&gw.url, &worker.url()).await;
        let lapsed_redis = gw.counter("a2agw_leases_lapsed_total", &[]).await;
        drop(gw);

        // The same with the memory store.
        let gw_mem = Gateway::in_front_of(&worker.url(), "").await;
        let mem_lat = lapse_latencies(&gw_mem.url, &worker.url()).await;
        let lapsed_mem = gw_mem.counter("a2agw_leases_lapsed_total", &[]).await;

        println!();
        println!("| measurement | store | workload | result |");
        println!("|---|---|---|---|");
        for (burst, lease, r) in &rows {
            let lease = match lease {
                Some(ttl) => format!(", lease ttlMs {ttl}"),
                None => String::new(),
            };
            println!(
                "| store round trips per task | redis | {TASKS} x `burst:{burst}`{lease} ({:.0} events/task) | **{:.2}** round trips/task ({}); rate-subtracted {:.2}; {:.1} Redis commands/task incl. inside scripts; {:.3} round trips/event |",
                r.events,
                r.round_trips,
                breakdown_cell(&r.breakdown),
                r.round_trips_rate,
                r.commands,
                r.round_trips / r.events,
            );
        }
        for (leave_after, r) in &cascades {
            let outbox = r.breakdown.get("outbox_put").copied().unwrap_or(0.0)
                + r.breakdown.get("outbox_done").copied().unwrap_or(0.0);
            println!(
                "| store round trips per cascade | redis | {CASCADES} x `{CASCADE_TASK}`, the caller leaves after {leave_after} events, the child cancelled ({:.0} events/task read) | **{:.2}** round trips/cascade ({}); the outbox's share {:.2} (`outbox_put` + `outbox_done`, which replaces the `lease_end` a cancel made before: +1 per cascade); rate-subtracted {:.2}; {:.1} Redis commands/cascade incl. inside scripts; {:.3} round trips/event |",
                r.events,
                r.round_trips,
                breakdown_cell(&r.breakdown),
                outbox,
                r.round_trips_rate,
                r.commands,
                r.round_trips / r.events,
            );
        }
        let calls = |leased: bool| {
            rows.iter()
                .find(|(_, lease, _)| lease.is_some() == leased)
                .map_or(0.0, |(_, _, r)| r.round_trips.round())
        };
        println!(
            "| store round trips per task | memory | any | 0 by design (the same code path: {:.0} store calls/task, {:.0} with a lease, as in-process map operations) |",
            calls(false),
            calls(true)
        );
        println!(
            "| background (reaper) | redis | idle, per replica per tick ({} ms) | {:.2} round trips/tick ({}), {:.2} Redis commands/tick |",
            TICK.as_millis(),
            bg.round_trips_per_tick,
            bg.round_trips
                .iter()
                .map(|(k, v)| format!("{k} x{v} in 1 s"))
                .collect::<Vec<_>>()
                .join(", "),
            bg.commands_per_tick,
        );
        println!(
            "| lapse to CANCELED | redis | {live} live leases with far deadlines in the index + {LAPSING} lapsing, ttlMs {LAPSE_TTL_MS} | {} |",
            latency_cell(&redis_lat)
        );
        println!(
            "| lapse to CANCELED | memory | n/a (no outside leases), {LAPSING} lapsing, ttlMs {LAPSE_TTL_MS} | {} |",
            latency_cell(&mem_lat)
        );
        println!();
        println!(
            "Round trips are client commands as Redis's MONITOR saw them (a Lua script is one EVALSHA, whatever it runs inside); \
             the reaper's claims, the outbox's claims (one EVALSHA a tick each) and the replica's heartbeat (one SET a second) are left out by name, and the rate-subtracted figure takes the idle rate x run time off instead. \
             Redis commands are the sum of `INFO commandstats` calls, which counts every command a script runs too, \
             minus the idle rate x run time. Events are SSE events the caller read. \
             Lapse is the first event's arrival + {LAPSE_TTL_MS} ms; CANCELED is polled on the worker every 5 ms, \
             so figures include up to ~5 ms of polling and one reaper tick ({} ms). With {LAPSING} samples p99 is the max.",
            TICK.as_millis()
        );
        println!(
            "leases lapsed (gateway metric): redis {lapsed_redis}, memory {lapsed_mem}; whole run {:.1} s",
            started.elapsed().as_secs_f64()
        );
    });
}
