//! How the Redis store's lease work grows with the number of live leased
//! tasks, in one run: `cargo bench -p a2a-gateway --bench scale` (needs
//! `redis-server`). Issue 47's scale table: standalone Redis, and a Redis
//! Cluster of three primaries with a replica each (all on this machine).
//!
//! For 1,000, 10,000 and 100,000 tasks, on a fresh `redis-server` (or
//! cluster) each time, three replicas (three [`RedisStore`] connections with their own
//! replica ids, as three gateway processes hold them) each lease a third
//! of the tasks (`lease_start`, which also creates the task's record, as a
//! tracked leased child has one), then:
//! - **memory per task**: Redis's `used_memory` grown, per task (record and
//!   deadline-index entry), summed over the primaries (a cluster's replicas
//!   hold as much again);
//! - **renewals**: for 5 s each replica renews all its leases as fast as
//!   the store lets it, through `lease_renew_many` in the gateway's batches
//!   (one call per [`BATCH`] leases; the gateway makes one call per tick
//!   with every lease then due): renewals per second, and the CPU each
//!   renewal costs the Redis server (every node of a cluster, its
//!   replicas' replication included) and this process (the client side of
//!   three replicas, an upper bound of what one costs a gateway);
//! - **lapse to claim**: every lease restarted with a deadline spread over
//!   [`SPREAD_MS`], never renewed; the three replicas' reapers claim as the
//!   gateway's do (every 100 ms, up to `CLAIM_BATCH` each): the time from
//!   each lease's deadline to its claim, p50 and p99, and that each lapsed
//!   lease was claimed exactly once. The cancel that follows a claim (one
//!   `CancelTask` to the worker) is measured end to end by the `leases`
//!   bench; this one measures what grows with the count.
//!
//! Then the gateway's own memory per tracked task: one real gateway on
//! standalone Redis in front of an a2a-rust worker, on a route that
//! imposes a lease; [`STREAMS`] leased children streamed through it
//! (quiet `idle:` streams, each caller holding its connection open): its
//! resident memory grown, per child. That is the whole cost of a leased
//! child whose caller streams: the two connections' buffers, the stream's
//! state, the tracker's record and the lease it renews.
//!
//! Under `cargo test` (no `--bench` argument) it only says it was skipped.

// A benchmark's report is its standard output.
#![allow(clippy::print_stdout)]

#[path = "../tests/harness/mod.rs"]
#[allow(dead_code, unused_imports, clippy::all)]
mod harness;

#[path = "machine.rs"]
#[allow(dead_code)]
mod machine;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use a2a_gateway::lease::CLAIM_BATCH;
use a2a_gateway::store::redis::RedisStore;
use a2a_gateway::store::{now_ms, Asker, TaskKey, TaskStore};
use futures::StreamExt;

use harness::redis::{RedisCluster, RedisServer};

/// The store a run measures.
enum Redis {
    One(Box<RedisServer>),
    Cluster(RedisCluster),
}

impl Redis {
    async fn start(cluster: bool) -> Redis {
        if cluster {
            Redis::Cluster(RedisCluster::start().await)
        } else {
            Redis::One(Box::new(RedisServer::start().await))
        }
    }

    fn url(&self) -> String {
        match self {
            Redis::One(s) => s.url(),
            Redis::Cluster(c) => c.url(),
        }
    }

    /// The nodes that hold the data once (a cluster's primaries).
    fn primaries(&self) -> Vec<&RedisServer> {
        match self {
            Redis::One(s) => vec![s],
            Redis::Cluster(c) => c.nodes[..3].iter().collect(),
        }
    }

    /// Every server process.
    fn pids(&self) -> Vec<String> {
        let nodes: Vec<&RedisServer> = match self {
            Redis::One(s) => vec![s],
            Redis::Cluster(c) => c.nodes.iter().collect(),
        };
        nodes
            .iter()
            .map(|n| n.pid().expect("redis-server's pid").to_string())
            .collect()
    }

    async fn used_memory(&self) -> u64 {
        let mut sum = 0;
        for n in self.primaries() {
            sum += used_memory(n).await;
        }
        sum
    }

    fn cpu_ticks(&self) -> u64 {
        self.pids().iter().map(|p| cpu_ticks(p)).sum()
    }
}

/// Live leased tasks per run.
const COUNTS: [usize; 3] = [1_000, 10_000, 100_000];
/// Gateway replicas sharing the store.
const REPLICAS: usize = 3;
/// Leases per `lease_renew_many` call.
const BATCH: usize = 1000;
/// How long renewals are driven.
const RENEW_FOR: Duration = Duration::from_secs(5);
/// Lapse deadlines are spread over this, starting this far ahead.
const SPREAD_MS: u64 = 5_000;
const LAPSE_AHEAD_MS: u64 = 2_000;
/// The gateway's default `[leases] tick`.
const TICK: Duration = Duration::from_millis(100);
/// Lease calls in flight per replica while leases start.
const IN_FLIGHT: usize = 64;

/// Leased children held open through one gateway, for its memory.
const STREAMS: [usize; 2] = [500, 2_000];

/// A process's resident memory (`VmRSS`), in bytes.
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The gateway's resident memory grown per leased child streaming through
/// it, for each count of [`STREAMS`] (a fresh gateway, worker and Redis
/// each): `(children, bytes per child)`.
async fn gateway_memory() -> Vec<(usize, f64)> {
    use harness::rust_worker::{RustWorker, RustWorkerCapacity, RustWorkerOptions};
    use harness::worker::{send_stream, Bind};
    let mut out = Vec::new();
    for n in STREAMS {
        let redis = RedisServer::start().await;
        let worker = RustWorker::start_with_capacity(
            RustWorkerOptions::default(),
            Some(RustWorkerCapacity {
                max_concurrent_streams: 2 * n + 100,
                max_tasks: 4 * n + 100,
            }),
        )
        .await;
        let cfg = format!(
            "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"30s\" }}\n",
            redis.url(),
            worker.url()
        );
        let gw = harness::gateway::Gateway::start(&cfg).await;
        let pid = gw.pid().expect("the gateway's pid");
        let open = |k: usize| {
            let url = gw.url.clone();
            async move {
                futures::stream::iter(0..k)
                    .map(|_| {
                        let url = url.clone();
                        async move { send_stream(&url, Bind::JsonRpc, None, "idle:600000").await }
                    })
                    .buffer_unordered(32)
                    .collect::<Vec<_>>()
                    .await
            }
        };
        // Warm: pools, buffers and the allocator's first arenas.
        let warm = open(100).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = rss(pid);
        let held = open(n).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let after = rss(pid);
        out.push((n, after.saturating_sub(before) as f64 / n as f64));
        drop((warm, held));
    }
    out
}

fn key(i: usize) -> TaskKey {
    TaskKey {
        route: "w".into(),
        tenant: "bench".into(),
        task_id: format!("task-{i:07}").into(),
    }
}

/// utime + stime (clock ticks) of process `pid` (`self` for this one).
fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(close) = stat.rfind(')') else {
        return 0;
    };
    let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// Microseconds per clock tick.
fn tick_us() -> f64 {
    let hz: f64 = machine::sh("getconf", &["CLK_TCK"])
        .trim()
        .parse()
        .unwrap_or(100.0);
    1e6 / hz
}

/// `used_memory` from `INFO memory`.
async fn used_memory(redis: &RedisServer) -> u64 {
    let out = redis.cli(&["INFO", "memory"]).await;
    String::from_utf8_lossy(&out)
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// Starts a lease on each of `keys` (deadline `ttl_of(i)` after `now`),
/// as replica `store`.
async fn start_leases(
    store: &Arc<RedisStore>,
    keys: &[(usize, TaskKey)],
    now: u64,
    ttl_of: fn(usize) -> u64,
) {
    futures::stream::iter(keys.iter().cloned())
        .map(|(i, k)| {
            let store = Arc::clone(store);
            async move {
                store
                    .lease_start(&k, ttl_of(i), Some("bench"), now, &Asker::Unverified)
                    .await
                    .expect("lease_start");
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// Task `i`'s lease in the lapse run: `LAPSE_AHEAD_MS`, plus a spread
/// over `SPREAD_MS` that interleaves the replicas' shares.
fn lapse_in(i: usize) -> u64 {
    LAPSE_AHEAD_MS + (i as u64 * 7919) % SPREAD_MS
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Row {
    cluster: bool,
    n: usize,
    start_per_s: f64,
    bytes_per_task: f64,
    renewals_per_s: f64,
    redis_us_per_renewal: f64,
    client_us_per_renewal: f64,
    lapse_p50_ms: f64,
    lapse_p99_ms: f64,
    claimed: usize,
    twice: usize,
}

async fn run(n: usize, cluster: bool) -> Row {
    let redis = Redis::start(cluster).await;
    let mut stores = Vec::new();
    for r in 0..REPLICAS {
        stores.push(Arc::new(
            RedisStore::connect_as(&redis.url(), "a2agw", &format!("replica-{r}"))
                .await
                .expect("connect the store"),
        ));
    }
    let shares: Vec<Vec<(usize, TaskKey)>> = (0..REPLICAS)
        .map(|r| (r..n).step_by(REPLICAS).map(|i| (i, key(i))).collect())
        .collect();

    // Leases start: a far deadline (an hour).
    let mem0 = redis.used_memory().await;
    let t = Instant::now();
    futures::future::join_all(
        stores
            .iter()
            .zip(&shares)
            .map(|(s, keys)| start_leases(s, keys, now_ms(), |_| 3_600_000)),
    )
    .await;
    let start_per_s = n as f64 / t.elapsed().as_secs_f64();
    let mem1 = redis.used_memory().await;
    assert_eq!(stores[0].lease_count().await.unwrap(), n as u64);

    // Renewals, as fast as they go, for RENEW_FOR.
    let (redis0, self0) = (redis.cpu_ticks(), cpu_ticks("self"));
    let t = Instant::now();
    let renewed: usize = futures::future::join_all(stores.iter().zip(&shares).map(|(s, keys)| {
        let s = Arc::clone(s);
        let keys: Vec<TaskKey> = keys.iter().map(|(_, k)| k.clone()).collect();
        async move {
            let mut done = 0;
            while t.elapsed() < RENEW_FOR {
                for batch in keys.chunks(BATCH) {
                    done += s
                        .lease_renew_many(batch, now_ms())
                        .await
                        .expect("lease_renew_many")
                        .renewed;
                }
            }
            done
        }
    }))
    .await
    .into_iter()
    .sum();
    let took = t.elapsed().as_secs_f64();
    let (redis1, self1) = (redis.cpu_ticks(), cpu_ticks("self"));
    let us = tick_us();

    // Lapses: every lease restarted to lapse within SPREAD_MS, then three
    // reapers claim as the gateway's do.
    let base = now_ms();
    futures::future::join_all(
        stores
            .iter()
            .zip(&shares)
            .map(|(s, keys)| start_leases(s, keys, base, lapse_in)),
    )
    .await;
    let claims: Vec<Vec<(usize, u64)>> = futures::future::join_all(stores.iter().map(|s| {
        let s = Arc::clone(s);
        async move {
            let mut got = Vec::new();
            let routes: Vec<Arc<str>> = vec!["w".into()];
            // Until the index has been empty for a second.
            let mut idle = 0;
            while idle < 10 {
                tokio::time::sleep(TICK).await;
                let now = now_ms();
                let claimed = s
                    .lease_claim_lapsed(now, CLAIM_BATCH, now + 60_000, &routes)
                    .await
                    .expect("lease_claim_lapsed");
                let at = now_ms();
                if claimed.is_empty() && s.lease_count().await.unwrap() == 0 {
                    idle += 1;
                }
                for rec in claimed {
                    let i: usize = rec.key.task_id["task-".len()..].parse().unwrap();
                    got.push((i, at));
                }
            }
            got
        }
    }))
    .await;
    let mut per_task: HashMap<usize, usize> = HashMap::new();
    let mut lat: Vec<f64> = Vec::new();
    for &(i, at) in claims.iter().flatten() {
        *per_task.entry(i).or_default() += 1;
        lat.push(at.saturating_sub(base + lapse_in(i)) as f64);
    }
    lat.sort_by(f64::total_cmp);
    let twice = per_task.values().filter(|&&c| c > 1).count();
    let claimed = per_task.len();
    Row {
        cluster,
        n,
        start_per_s,
        bytes_per_task: (mem1.saturating_sub(mem0)) as f64 / n as f64,
        renewals_per_s: renewed as f64 / took,
        redis_us_per_renewal: (redis1 - redis0) as f64 * us / renewed as f64,
        client_us_per_renewal: (self1 - self0) as f64 * us / renewed as f64,
        lapse_p50_ms: pct(&lat, 0.50),
        lapse_p99_ms: pct(&lat, 0.99),
        claimed,
        twice,
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("scale: skipped (run with cargo bench)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut rows = Vec::new();
        for cluster in [false, true] {
            for n in COUNTS {
                rows.push(run(n, cluster).await);
            }
        }
        let gateway = gateway_memory().await;
        println!(
            "scale: redis-server {}, standalone and a cluster of 3 primaries + 3 replicas, {REPLICAS} gateway replicas' stores; {}; load {}",
            String::from_utf8_lossy(
                &std::process::Command::new("redis-server")
                    .arg("--version")
                    .output()
                    .map(|o| o.stdout)
                    .unwrap_or_default()
            )
            .split_whitespace()
            .find(|w| w.starts_with("v="))
            .unwrap_or("?"),
            machine::cpus(),
            machine::loadavg(),
        );
        println!();
        println!("| store | live leased tasks | lease starts/s | Redis bytes/task | renewals/s (batches of {BATCH}) | Redis CPU/renewal | client CPU/renewal | lapse to claim p50 / p99 | claimed once |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in rows {
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} µs | {:.2} µs | {:.0} / {:.0} ms | {} of {}, {} twice |",
                if r.cluster { "cluster" } else { "standalone" },
                r.n,
                r.start_per_s,
                r.bytes_per_task,
                r.renewals_per_s,
                r.redis_us_per_renewal,
                r.client_us_per_renewal,
                r.lapse_p50_ms,
                r.lapse_p99_ms,
                r.claimed,
                r.n,
                r.twice,
            );
        }
        println!();
        println!("| leased children streaming through one gateway (Redis) | gateway resident memory per child |");
        println!("|---:|---:|");
        for (n, per) in gateway {
            println!("| {n} | {:.1} KiB |", per / 1024.0);
        }
    });
}
