//! Delegation trees at scale, in one run: `cargo bench -p a2a-gateway
//! --bench trees` (needs `redis-server`).
//!
//! 1,000 trees of depth 3 (P → C → D), each agent an a2a-rust 0.15 worker
//! in this process that starts its child in the background (`spawn:`, its
//! client carrying the trace headers its request came with), every call
//! through the gateway: on the memory store, then on Redis. Then the root
//! cancels every P at once (1,000 concurrent `CancelTask` through the
//! gateway), and the workers' own cancel records say when each C and D was
//! cancelled.
//!
//! Reported per store: store calls per linked send while the trees grow
//! (from the gateway's `a2agw_store_op_seconds_count`, by method; on Redis
//! each is one round trip), the same per tree while they are cancelled,
//! the time from the first root cancel to the last child and to the last
//! grandchild, and that every descendant was cancelled exactly once.
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

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::json;

use harness::gateway::Gateway;
use harness::http::post_json;
use harness::redis::RedisServer;
use harness::rust_worker::{RustWorker, RustWorkerCapacity, RustWorkerOptions};

/// Trees grown and cancelled per store.
const TREES: usize = 1000;
/// Root sends in flight at once while the trees grow.
const GROW_AT_ONCE: usize = 50;

/// `a2agw_store_op_seconds_count` by method.
async fn store_ops(gw: &Gateway) -> BTreeMap<String, f64> {
    let text = gw.metrics().await;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("a2agw_store_op_seconds_count{op=\"") else {
            continue;
        };
        let Some((op, value)) = rest.split_once("\"} ") else {
            continue;
        };
        out.insert(op.to_owned(), value.trim().parse().unwrap_or(0.0));
    }
    out
}

fn diff(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

fn per(ops: &BTreeMap<String, f64>, n: usize) -> String {
    let total: f64 = ops.values().sum();
    let parts: Vec<String> = ops
        .iter()
        .map(|(k, v)| format!("{k} {:.2}", v / n as f64))
        .collect();
    format!("{:.2} ({})", total / n as f64, parts.join(", "))
}

/// Waits until `w` has started `n` children (its `spawn:` sends answered).
async fn children_started(w: &RustWorker, n: usize, within: Duration) {
    let start = Instant::now();
    loop {
        let kids = w.children();
        let failed: Vec<_> = kids.iter().filter(|c| c.task.is_err()).collect();
        assert!(failed.is_empty(), "child sends failed: {:?}", &failed[..1]);
        if kids.len() >= n {
            return;
        }
        assert!(
            start.elapsed() < within,
            "{} of {n} children started",
            kids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Row {
    store: &'static str,
    grow: Duration,
    grow_ops: String,
    cancel_ops: String,
    to_last_child: Duration,
    to_last_grandchild: Duration,
    once: String,
}

async fn run(redis: Option<&RedisServer>) -> Row {
    let cap = Some(RustWorkerCapacity {
        max_concurrent_streams: 4 * TREES,
        max_tasks: 4 * TREES,
    });
    let p = RustWorker::start_with_capacity(RustWorkerOptions::default(), cap).await;
    let c = RustWorker::start_with_capacity(RustWorkerOptions::default(), cap).await;
    let d = RustWorker::start_with_capacity(RustWorkerOptions::default(), cap).await;
    let store = match redis {
        Some(r) => format!("[store]\nurl = \"{}\"\n\n", r.url()),
        None => String::new(),
    };
    let gw = Gateway::start(&format!(
        "{store}[[routes]]\nname = \"p\"\npath_prefix = \"/p\"\nworker = \"{}\"\n\n\
         [[routes]]\nname = \"c\"\npath_prefix = \"/c\"\nworker = \"{}\"\n\n\
         [[routes]]\nname = \"d\"\npath_prefix = \"/d\"\nworker = \"{}\"\n",
        p.url(),
        c.url(),
        d.url()
    ))
    .await;
    let text = format!(
        "spawn:3600000@jsonrpc@{0}/c@spawn:3600000@jsonrpc@{0}/d@work:3600000",
        gw.url
    );
    let before = store_ops(&gw).await;
    let grow_start = Instant::now();
    let mut roots = Vec::with_capacity(TREES);
    for chunk in (0..TREES).collect::<Vec<_>>().chunks(GROW_AT_ONCE) {
        let sends = chunk.iter().map(|i| {
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {
                "message": {"messageId": format!("tree-{i}"), "role": "ROLE_USER",
                    "parts": [{"text": text}]},
                "configuration": {"returnImmediately": true}}});
            let url = gw.url.clone();
            async move { post_json(&url, "/p", &[], &body).await.json() }
        });
        for v in futures::future::join_all(sends).await {
            let id = v["result"]["task"]["id"]
                .as_str()
                .unwrap_or_else(|| panic!("no task: {v}"))
                .to_owned();
            roots.push(id);
        }
    }
    children_started(&p, TREES, Duration::from_secs(120)).await;
    children_started(&c, TREES, Duration::from_secs(120)).await;
    let grow = grow_start.elapsed();
    // The links are written off the sends' path: let the tracker finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = store_ops(&gw).await;
    let grow_ops = diff(&grown, &before);

    let cancel_start = Instant::now();
    let cancels = roots.iter().map(|id| {
        let body =
            json!({"jsonrpc": "2.0", "id": "c", "method": "CancelTask", "params": {"id": id}});
        let url = gw.url.clone();
        async move { post_json(&url, "/p", &[], &body).await.status }
    });
    let statuses = futures::future::join_all(cancels).await;
    assert!(statuses.iter().all(|s| *s == 200), "a root cancel failed");
    let until = Instant::now() + Duration::from_secs(120);
    while (c.cancels() < TREES || d.cancels() < TREES) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Late duplicates, if any, would show in the counts below.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cancelled = store_ops(&gw).await;
    let cancel_ops = diff(&cancelled, &grown);
    let last = |w: &RustWorker| {
        w.cancel_records()
            .iter()
            .map(|r| r.at.saturating_duration_since(cancel_start))
            .max()
            .unwrap_or_default()
    };
    let distinct = |w: &RustWorker| {
        w.cancel_records()
            .iter()
            .map(|r| r.task_id.clone())
            .collect::<HashSet<_>>()
            .len()
    };
    let once = format!(
        "C {}/{} ({} distinct), D {}/{} ({} distinct)",
        c.cancels(),
        TREES,
        distinct(&c),
        d.cancels(),
        TREES,
        distinct(&d)
    );
    Row {
        store: if redis.is_some() { "redis" } else { "memory" },
        grow,
        grow_ops: per(&grow_ops, 2 * TREES),
        cancel_ops: per(&cancel_ops, TREES),
        to_last_child: last(&c),
        to_last_grandchild: last(&d),
        once,
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("trees bench: skipped (run `cargo bench -p a2a-gateway --bench trees`)");
        return;
    }
    harness::gateway::product_log_unless_set();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!(
            "trees bench: {TREES} trees of depth 3 (P -> C -> D, background children), {}, {}, load {}",
            machine::utc_now(),
            machine::cpus(),
            machine::loadavg()
        );
        let memory = run(None).await;
        let redis = RedisServer::start().await;
        let on_redis = run(Some(&redis)).await;
        println!();
        println!("| store | grow 1,000 trees (s) | store calls per linked send while growing | store calls per tree while cancelling | first root cancel to last child (ms) | to last grandchild (ms) | CancelTask per descendant |");
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for r in [memory, on_redis] {
            println!(
                "| {} | {:.1} | {} | {} | {} | {} | {} |",
                r.store,
                r.grow.as_secs_f64(),
                r.grow_ops,
                r.cancel_ops,
                r.to_last_child.as_millis(),
                r.to_last_grandchild.as_millis(),
                r.once
            );
        }
    });
}
