//! Issue 32 item 6: faults. A worker SIGKILLed mid-stream and restarted on
//! its port; Redis killed and restarted with and without persistence; one
//! of three replicas SIGKILLed holding many leased children; a soak of a few
//! minutes of mixed traffic with callers leaving at random, watching the gateway's open
//! file descriptors and resident memory. Outcomes are read from the worker.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinSet;

use crate::harness::gateway::{free_port, scratch_dir, Gateway};
use crate::harness::http::{post_json, request, send_and_leave};
use crate::harness::python_worker::PythonWorker;
use crate::harness::redis::RedisServer;
use crate::harness::rust_worker::{RustWorker, RustWorkerCapacity, RustWorkerOptions};
use crate::harness::stream::SseStream;
use crate::harness::worker::{message, send_stream, state_of, task_id_of, Bind};
use crate::harness::{open_fds, rss_kib, scaled_count, scaled_ms, scaled_secs};

const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";
const CANCELED: &str = "TASK_STATE_CANCELED";
const COMPLETED: &str = "TASK_STATE_COMPLETED";
const WORKING: &str = "TASK_STATE_WORKING";

/// A streaming send through `url` whose message carries a lease grant of
/// `ttl_ms` (which nobody renews); the open stream and the task id.
async fn leased_stream(url: &str, ttl_ms: u64, text: &str) -> (SseStream, String) {
    let mut m = message(text);
    m["metadata"] = json!({ "a2a-rust.com/lease": {"ttlMs": ttl_ms} });
    m["extensions"] = json!([LEASE_URI]);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": m}});
    let mut s = SseStream::open(url, "/", &[], &body).await;
    assert_eq!(s.status, 200);
    let id = s.task_id().await;
    (s, id)
}

fn store_route(redis_url: &str, worker: &str, route_extra: &str) -> String {
    format!(
        "[store]\nurl = \"{redis_url}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{worker}\"\n{route_extra}\n"
    )
}

/// A `redis-server` with `appendonly yes` in its own directory, on a free
/// port: SIGKILLed and restarted (same port, same directory), it comes back
/// with what its append-only file holds. Killed on drop.
struct PersistentRedis {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<tokio::process::Child>,
}

impl PersistentRedis {
    async fn start() -> PersistentRedis {
        let mut r = PersistentRedis {
            port: free_port(),
            dir: scratch_dir("redis-aof"),
            child: None,
        };
        r.spawn().await;
        r
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// SIGKILL, then start again on the same port and directory.
    async fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
        self.spawn().await;
    }

    async fn spawn(&mut self) {
        let deadline = Instant::now() + scaled_secs(10);
        loop {
            let log = std::fs::File::create(self.dir.join("redis.log")).expect("redis log");
            let mut child = tokio::process::Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "yes", "--daemonize", "no"])
                .arg("--dir")
                .arg(&self.dir)
                .stdin(std::process::Stdio::null())
                .stdout(log)
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("start redis-server");
            loop {
                if redis_pong(self.port).await {
                    self.child = Some(child);
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "redis-server did not answer:\n{}",
                    self.log()
                );
                if let Ok(Some(_)) = child.try_wait() {
                    // The port may still be held for a moment after a kill.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Whether a Redis server on `port` answers `PING` with `+PONG`.
async fn redis_pong(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).await.ok()?;
        (&buf == b"+PONG\r\n").then_some(())
    };
    tokio::time::timeout(scaled_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .is_some()
}

async fn healthz(gw: &Gateway) -> u16 {
    request("GET", &gw.admin, "/healthz", &[], b"").await.status
}

/// A Python worker is SIGKILLed while a caller streams one of its tasks
/// through the gateway: the caller's stream ends (within 5 s, scaled), the
/// gateway stays healthy, and once the worker is back on the same port a
/// new stream through the same gateway works and its caller leaving gets
/// the child CANCELED, by one CancelTask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_mid_stream_then_restarted() {
    let worker = PythonWorker::start().await;
    let port = worker.port();
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (mut s, _id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    assert!(s.next(scaled_secs(5)).await.is_some(), "the stream flows");
    worker.kill().await;
    let killed = Instant::now();
    let bound = scaled_secs(5);
    let ended = tokio::time::timeout(bound, async { while s.next(bound).await.is_some() {} })
        .await
        .is_ok();
    assert!(
        ended && killed.elapsed() < bound,
        "the caller's stream did not end within {bound:?} of the worker's death; log:\n{}",
        gw.log_text()
    );
    assert_eq!(
        healthz(&gw).await,
        200,
        "gateway healthy with its worker dead"
    );

    let worker = PythonWorker::start_on_port(port, &[]).await;
    let (mut s, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    assert!(
        s.next(scaled_secs(5)).await.is_some(),
        "the new stream flows"
    );
    assert_eq!(worker.state(None, &id).await.as_deref(), Some(WORKING));
    s.close();
    let http =
        crate::harness::http::wait_for_state(&worker.url(), None, &id, CANCELED, scaled_ms(2000))
            .await;
    http.unwrap_or_else(|st| {
        panic!(
            "child of a caller who left not canceled after the restart ({st:?}); log:\n{}",
            gw.log_text()
        )
    });
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.stats().await["cancels"], 1, "one CancelTask");
    assert_eq!(healthz(&gw).await, 200);
}

/// Redis with `appendonly yes` holds a 3 s lease a caller granted through
/// replica A (nobody renews it). Redis is SIGKILLed and restarted (same
/// port, same directory), then A is SIGKILLed too: only what Redis kept
/// can tell replica B about the lease, and B cancels the child at its lapse
/// (within TTL + 3 s, scaled, of the send), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_survives_redis_restart_with_persistence() {
    let mut redis = PersistentRedis::start().await;
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let cfg = store_route(&redis.url(), &worker.url(), "");
    let mut a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let ttl = Duration::from_millis(3000);
    let sent = Instant::now();
    let (stream, id) = leased_stream(&a.url, 3000, "work:60000").await;
    // A writes the lease behind the request.
    tokio::time::sleep(scaled_ms(500)).await;
    redis.restart().await;
    a.kill().await;
    if sent.elapsed() < ttl {
        assert_eq!(
            crate::harness::http::get_task_state(&worker.url(), None, &id)
                .await
                .as_deref(),
            Some(WORKING),
            "not lapsed yet"
        );
    }
    let left = (ttl + scaled_ms(3000)).saturating_sub(sent.elapsed());
    crate::harness::http::wait_for_state(&worker.url(), None, &id, CANCELED, left)
        .await
        .unwrap_or_else(|st| {
            panic!(
                "lease lost across a persistent Redis restart ({st:?}); B's log:\n{}\nredis log:\n{}",
                b.log_text(),
                redis.log()
            )
        });
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels(), 1, "canceled once");
    assert_eq!(b.counter("a2agw_leases_lapsed_total", &[]).await, 1.0);
    drop(stream);
}

/// Redis without persistence is SIGKILLed and restarted empty: the gateway
/// recovers. A new leased child is canceled at its lapse, a new stream
/// whose caller leaves gets its child canceled, and /healthz answers 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_recovers_after_redis_restarts_empty() {
    let mut redis = RedisServer::start().await;
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Gateway::start(&store_route(&redis.url(), &worker.url(), "")).await;
    let (_before, _) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    tokio::time::sleep(scaled_ms(300)).await;
    redis.restart().await;
    // The store's heartbeat notices within a few ticks and reconnects.
    tokio::time::sleep(scaled_ms(1500)).await;
    assert_eq!(healthz(&gw).await, 200);

    let (_open, leased) = leased_stream(&gw.url, 1000, "work:30000").await;
    let (s, left) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    s.close();
    crate::harness::http::wait_for_state(&worker.url(), None, &left, CANCELED, scaled_ms(2000))
        .await
        .unwrap_or_else(|st| {
            panic!(
                "no cascade after Redis came back ({st:?}):\n{}",
                gw.log_text()
            )
        });
    crate::harness::http::wait_for_state(
        &worker.url(),
        None,
        &leased,
        CANCELED,
        Duration::from_millis(1000) + scaled_ms(2000),
    )
    .await
    .unwrap_or_else(|st| {
        panic!(
            "lease not enforced after Redis came back empty ({st:?}):\n{}",
            gw.log_text()
        )
    });
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels(), 2);
}

/// A lease the store lost while its caller still streams (Redis without
/// persistence restarted empty: every write lost, as an asynchronous
/// failover loses its last ones): replica A, which holds it, finds the task
/// gone at its next renewal and starts the lease again; so when A dies
/// too, replica B cancels the child at its lapse, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_store_lost_is_started_again() {
    let mut redis = RedisServer::start().await;
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let cfg = store_route(&redis.url(), &worker.url(), "lease = { ttl = \"2s\" }");
    let mut a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let (_open, id) = send_stream(&a.url, Bind::JsonRpc, None, "idle:60000").await;
    tokio::time::sleep(scaled_ms(300)).await;
    redis.restart().await;
    let deadline = Instant::now() + scaled_secs(10);
    while a
        .counter("a2agw_lease_renewals_total", &["outcome=\"restarted\""])
        .await
        < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "A did not start the lost lease again:\n{}",
            a.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(worker_state(&worker, &id).await.as_deref(), Some(WORKING));
    a.kill().await;
    crate::harness::http::wait_for_state(
        &worker.url(),
        None,
        &id,
        CANCELED,
        Duration::from_secs(2) + scaled_ms(2000),
    )
    .await
    .unwrap_or_else(|st| panic!("not cancelled at its lapse ({st:?}):\n{}", b.log_text()));
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.cancels(), 1);
}

/// How many leased children the three-replica test holds open.
const REPLICA_CHILDREN: usize = 1000;

/// Three replicas share one Redis; A holds `REPLICA_CHILDREN` streams whose
/// route imposes a 2 s lease A renews. A is SIGKILLed: B and C cancel every
/// child within TTL + 5 s (scaled), and no child is canceled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_with_many_leased_children() {
    let redis = RedisServer::start().await;
    let worker = Arc::new(
        RustWorker::start_with_capacity(
            RustWorkerOptions::default(),
            Some(RustWorkerCapacity {
                max_concurrent_streams: 4 * REPLICA_CHILDREN,
                max_tasks: 20 * REPLICA_CHILDREN,
            }),
        )
        .await,
    );
    let cfg = store_route(&redis.url(), &worker.url(), "lease = { ttl = \"2s\" }");
    let mut a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let c = Gateway::start(&cfg).await;

    let opening = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut set = JoinSet::new();
    for _ in 0..REPLICA_CHILDREN {
        let url = a.url.clone();
        let sem = Arc::clone(&sem);
        // Quiet streams (`idle:`): a thousand `work:` tasks would send ten
        // thousand events a second through debug builds on two cores, and
        // the test is of the lapses, not of the events.
        set.spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            send_stream(&url, Bind::JsonRpc, None, "idle:60000").await
        });
    }
    let mut streams = Vec::new();
    let mut ids = HashSet::new();
    while let Some(r) = set.join_next().await {
        let (s, id) = r.expect("open a stream");
        streams.push(s);
        ids.insert(id);
    }
    eprintln!(
        "faults: {} leased children open through A in {:?}",
        ids.len(),
        opening.elapsed()
    );
    assert_eq!(ids.len(), REPLICA_CHILDREN);
    // A renews: past one TTL nothing was canceled.
    tokio::time::sleep(Duration::from_secs(2) + scaled_ms(1000)).await;
    assert_eq!(worker.cancel_records().len(), 0, "A renews its leases");

    a.kill().await;
    let killed = Instant::now();
    let bound = Duration::from_secs(2) + scaled_ms(5000);
    while worker.cancel_records().len() < REPLICA_CHILDREN && killed.elapsed() < bound {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = killed.elapsed();
    tokio::time::sleep(scaled_ms(1000)).await;
    let records = worker.cancel_records();
    let mut per_task: HashMap<&str, usize> = HashMap::new();
    for r in &records {
        *per_task.entry(r.task_id.as_str()).or_default() += 1;
    }
    let missing = ids
        .iter()
        .filter(|id| !per_task.contains_key(id.as_str()))
        .count();
    let twice: Vec<_> = per_task.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!(
        "faults: {} of {} children canceled {took:?} after A's death",
        per_task.len(),
        REPLICA_CHILDREN
    );
    assert_eq!(
        missing,
        0,
        "children not canceled within {bound:?}; B's log:\n{}",
        b.log_text()
    );
    assert!(twice.is_empty(), "canceled more than once: {twice:?}");
    assert_eq!(per_task.len(), REPLICA_CHILDREN, "only A's children");
    assert!(records.iter().all(|r| r.by_cancel_task), "by CancelTask");
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
    let lapsed = b.counter("a2agw_leases_lapsed_total", &[]).await
        + c.counter("a2agw_leases_lapsed_total", &[]).await;
    assert_eq!(lapsed, REPLICA_CHILDREN as f64);
    drop(streams);
}

/// What one soak operation did.
enum Outcome {
    /// A caller who stayed: its child must complete.
    Stayed(String),
    /// A streaming caller who left before the child settled.
    LeftStream(String),
    /// A blocking caller who left (the child's id is not known to it).
    LeftBlocking,
}

/// One soak operation of kind `k` (0..5) through `url`.
async fn soak_op(url: &str, k: u64, jitter: u64) -> Outcome {
    match k {
        // Streaming, caller stays to the end.
        0 => {
            let (mut s, id) = send_stream(url, Bind::JsonRpc, None, "work:300").await;
            let last = s
                .rest(scaled_secs(10))
                .await
                .iter()
                .rev()
                .find_map(state_of);
            assert_eq!(last.as_deref(), Some(COMPLETED), "{id}");
            Outcome::Stayed(id)
        }
        // Streaming, caller aborts mid-stream (FIN or RST).
        1 => {
            let (s, id) = send_stream(url, Bind::JsonRpc, None, "work:5000").await;
            tokio::time::sleep(Duration::from_millis(jitter % 300)).await;
            if jitter.is_multiple_of(2) {
                s.close();
            } else {
                s.reset();
            }
            Outcome::LeftStream(id)
        }
        // Blocking send, caller waits for the answer.
        2 => {
            let body = json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage",
                "params": {"message": message("work:300")}});
            let v = post_json(url, "/", &[], &body).await.json();
            let task = &v["result"]["task"];
            assert_eq!(task["status"]["state"], COMPLETED, "{v}");
            Outcome::Stayed(task["id"].as_str().expect("task id").to_string())
        }
        // Blocking send, caller leaves after 300 ms.
        3 => {
            let body = json!({"jsonrpc": "2.0", "id": 3, "method": "SendMessage",
                "params": {"message": message("work:5000")}});
            send_and_leave(
                url,
                "/",
                &[("content-type", "application/json")],
                body.to_string().as_bytes(),
                Duration::from_millis(300),
            )
            .await;
            Outcome::LeftBlocking
        }
        // Polled: returnImmediately, then GetTask until it completes.
        _ => {
            let body = json!({"jsonrpc": "2.0", "id": 4, "method": "SendMessage",
                "params": {"message": message("work:300"), "configuration": {"returnImmediately": true}}});
            let v = post_json(url, "/", &[], &body).await.json();
            let id = task_id_of(&v)
                .or_else(|| v["result"]["task"]["id"].as_str().map(str::to_string))
                .unwrap_or_else(|| panic!("no task in {v}"));
            let get = json!({"jsonrpc": "2.0", "id": 5, "method": "GetTask", "params": {"id": id}});
            for _ in 0..scaled_count(200) {
                let v = post_json(url, "/", &[], &get).await.json();
                if v["result"]["status"]["state"] == COMPLETED {
                    return Outcome::Stayed(id);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("polled task {id} did not complete");
        }
    }
}

/// How many soak operations run at once.
const SOAK_LANES: u64 = 8;

/// How long the soak sends new operations: `A2AGW_SOAK_SECS` seconds
/// (default 150; the test command runs the default). Not scaled by the
/// harness's time factor: it is a length of traffic, not a bound.
fn soak_length() -> Duration {
    let secs = std::env::var("A2AGW_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    Duration::from_secs(secs)
}

/// A soak of a few minutes through one gateway ([`soak_length`]),
/// `SOAK_LANES` operations at a time, mixing streaming, blocking and polled
/// sends, with callers leaving at random. Every child whose caller left
/// before it settled is CANCELED, every child whose caller stayed
/// COMPLETED; the gateway's open fds return to their baseline (+ 16:
/// connections still winding down) and its RSS grows by at most 64 MiB at
/// its peak, and by at most 16 MiB between the end of the first third of
/// the soak and its end: a leak of one request's buffers or one stream's
/// state per operation (thousands of operations) would exceed either, the
/// allocator's own growth (measured: about 1 MiB) would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mixed_traffic_with_random_disconnects() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let gw = Arc::new(Gateway::in_front_of(&worker.url(), "").await);
    let pid = gw.pid().expect("gateway runs");

    // Warm up: every kind once per lane, then let it settle.
    let mut warm = JoinSet::new();
    for lane in 0..SOAK_LANES {
        let url = gw.url.clone();
        warm.spawn(async move {
            for k in 0..5 {
                soak_op(&url, k, lane).await;
            }
        });
    }
    while let Some(r) = warm.join_next().await {
        r.expect("warm-up");
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (fd0, rss0) = (open_fds(pid), rss_kib(pid));
    let cancels0 = worker.cancels();

    let started = Instant::now();
    let length = soak_length();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(rss0));
    // The RSS once a third of the soak has run: the end may not be far
    // above it (a slow leak grows with the operations, warm-up does not).
    let third = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let (peak, third) = (Arc::clone(&peak), Arc::clone(&third));
        tokio::spawn(async move {
            loop {
                let rss = rss_kib(pid);
                peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                if started.elapsed() >= length / 3 {
                    let _ = third.compare_exchange(
                        0,
                        rss,
                        std::sync::atomic::Ordering::Relaxed,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let mut lanes = JoinSet::new();
    for lane in 0..SOAK_LANES {
        let url = gw.url.clone();
        lanes.spawn(async move {
            // xorshift, seeded per lane: reproducible mixes.
            let mut x = 0x9E37_79B9_7F4A_7C15_u64 ^ (lane + 1);
            let mut out = Vec::new();
            while started.elapsed() < length {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                out.push(soak_op(&url, x % 5, x >> 8).await);
            }
            out
        });
    }
    let mut outcomes = Vec::new();
    while let Some(r) = lanes.join_next().await {
        outcomes.extend(r.expect("soak lane"));
    }
    let soak_took = started.elapsed();
    sampler.abort();

    let mut stayed = 0;
    let mut left_streams = 0;
    let mut left_blocking = 0;
    for o in &outcomes {
        match o {
            Outcome::Stayed(id) => {
                stayed += 1;
                assert_eq!(
                    worker_state(&worker, id).await.as_deref(),
                    Some(COMPLETED),
                    "{id}"
                );
            }
            Outcome::LeftStream(id) => {
                left_streams += 1;
                crate::harness::http::wait_for_state(
                    &worker.url(),
                    None,
                    id,
                    CANCELED,
                    scaled_ms(3000),
                )
                .await
                .unwrap_or_else(|st| panic!("{id}: caller left, child {st:?}"));
            }
            Outcome::LeftBlocking => left_blocking += 1,
        }
    }
    // Every leaver's child (blocking ones included) was canceled once.
    let mut cancels = worker.cancels() - cancels0;
    for _ in 0..scaled_count(60) {
        if cancels >= left_streams + left_blocking {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancels = worker.cancels() - cancels0;
    }
    assert_eq!(
        cancels,
        left_streams + left_blocking,
        "one CancelTask per leaver"
    );

    // Open fds come back to the baseline once connections wind down.
    let mut fds = open_fds(pid);
    for _ in 0..scaled_count(100) {
        if fds <= fd0 + 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        fds = open_fds(pid);
    }
    let rss1 = rss_kib(pid);
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let third = third.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "faults: soak {} ops in {soak_took:?} ({stayed} stayed, {left_streams} streams and \
         {left_blocking} blocking callers left); fds {fd0} -> {fds}; RSS {rss0} KiB -> \
         {third} KiB at a third -> peak {peak} KiB, end {rss1} KiB",
        outcomes.len()
    );
    assert!(fds <= fd0 + 16, "fds {fd0} -> {fds}");
    assert!(
        peak <= rss0 + 64 * 1024,
        "RSS {rss0} KiB -> peak {peak} KiB"
    );
    assert!(third > 0, "the sampler saw a third of the soak");
    assert!(
        rss1 <= third + 16 * 1024,
        "RSS {third} KiB at a third of the soak -> {rss1} KiB at its end"
    );
    assert_eq!(healthz(&gw).await, 200);
}

async fn worker_state(worker: &RustWorker, id: &str) -> Option<String> {
    crate::harness::http::get_task_state(&worker.url(), None, id).await
}
