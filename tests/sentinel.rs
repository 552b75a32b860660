//! Issue 47 item 2: the Redis store behind Sentinel (`redis+sentinel://`),
//! with a real primary, replica and three sentinels on loopback
//! (`harness::redis::SentinelSet`). A forced failover mid-run: the
//! gateways follow the new primary, keep proxying, and leases keep lapsing
//! into cancels after it, each once.

use std::time::{Duration, Instant};

use crate::harness::gateway::Gateway;
use crate::harness::redis::SentinelSet;
use crate::harness::worker::{send_stream, Bind, Kind, Worker};
use crate::harness::{scaled_ms, scaled_secs};

const WORKING: &str = "TASK_STATE_WORKING";

/// Leases of 4 s: longer than a failover's gap in renewals.
fn leased_route(worker: &Worker) -> String {
    format!(
        "[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"4s\" }}\n",
        worker.url()
    )
}

/// Waits until `gw` counts a move to the new primary.
async fn followed(gw: &Gateway, name: &str) {
    let deadline = Instant::now() + scaled_secs(10);
    while gw.counter("a2agw_store_failovers_total", &[]).await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "{name} did not follow the failover:\n{}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two replicas on a Sentinel-watched Redis. Children streamed through A
/// before and after a forced failover; A renews them throughout. A is
/// SIGKILLed: B cancels every child within TTL + 1 s, once each, from the
/// leases the new primary holds (those written before the failover came
/// to it by replication).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_lapse_into_cancels_after_a_sentinel_failover() {
    let set = SentinelSet::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let cfg = format!(
        "[store]\nurl = \"{}\"\n\n{}",
        set.url(),
        leased_route(&worker)
    );
    let mut a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let mut streams = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (s, id) = send_stream(&a.url, Bind::JsonRpc, None, "work:60000").await;
        streams.push(s);
        ids.push(id);
    }
    // Replicated before the primary changes (asynchronous replication: a
    // write the old primary acknowledged and never sent is what a
    // failover can lose; docs/operations.md).
    set.primary.cli(&["WAIT", "1", "5000"]).await;
    set.fail_over().await;
    assert_eq!(set.primary_port().await, set.replica.port);
    followed(&a, "A").await;
    followed(&b, "B").await;
    // The gateway keeps proxying, and records on the new primary.
    for _ in 0..3 {
        let (s, id) = send_stream(&a.url, Bind::JsonRpc, None, "work:60000").await;
        streams.push(s);
        ids.push(id);
    }
    // A renews all six through the new primary: past one TTL, all run.
    tokio::time::sleep(Duration::from_secs(4) + scaled_ms(1000)).await;
    for id in &ids {
        assert_eq!(
            worker.state(None, id).await.as_deref(),
            Some(WORKING),
            "{id}: A renews it; A's log:\n{}",
            a.log_text()
        );
    }
    a.kill().await;
    crate::harness::worker::survivor_cancels_each_once(&worker, &ids, Duration::from_secs(4), &b)
        .await;
    drop(streams);
}

/// A sentinel URL whose sentinels do not answer: the gateway does not
/// start, and says why.
#[tokio::test]
async fn no_sentinel_no_start() {
    let port = crate::harness::gateway::free_port();
    let cfg = format!(
        "[store]\nurl = \"redis+sentinel://127.0.0.1:{port}/mymaster\"\n\n\
         [[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:1\"\n"
    );
    let (code, stderr) = crate::harness::gateway::run_config_to_exit(&cfg, &[]).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("no sentinel named the primary"), "{stderr}");
}
