//! Issue 47 item 1: the Redis store on a real Redis Cluster
//! (`redis+cluster://`): three primaries, each with a replica, on loopback
//! (`harness::redis::RedisCluster`), and three gateway replicas. Every
//! script touches one hash slot (the cluster refuses any that does not),
//! the lease index and outbox are sharded over the primaries, and the
//! guarantees of one server hold: lapses cancelled once by the survivors,
//! through a primary's failover, and budget accounts exact.

use std::time::{Duration, Instant};

use a2a_gateway::store::redis::{RedisStore, CLUSTER_SHARDS};
use a2a_gateway::store::TaskStore;

use crate::harness::gateway::Gateway;
use crate::harness::redis::RedisCluster;
use crate::harness::scaled_ms;
use crate::harness::stream::SseStream;
use crate::harness::worker::{send_stream, Bind, Kind, Worker};

const WORKING: &str = "TASK_STATE_WORKING";
const CANCELED: &str = "TASK_STATE_CANCELED";

/// Leases of 5 s: longer than a primary's failover (a 1 s node timeout,
/// then the election), during which its shards' renewals fail.
const TTL: Duration = Duration::from_secs(5);

/// The store's conformance suite, every script on a cluster: one that
/// touched keys of two slots would fail with `CROSSSLOT` or "Script
/// attempted to access a non local key". Then the keys are spread over
/// all three primaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_conforms_on_a_cluster() {
    let cluster = RedisCluster::start().await;
    let s = RedisStore::connect(&cluster.url(), "conf")
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    assert!(s.is_cluster());
    a2a_gateway::store::conformance::run(&s).await;
    let bounded = RedisStore::connect(&cluster.url(), "bound")
        .await
        .unwrap()
        .with_max_accounts(3);
    a2a_gateway::store::conformance::account_bound(&bounded, 3).await;
    // Records, a written one, an owned one, the contexts' four tasks, leases, lapses,
    // handed-back lapses and the outbox's four tasks, over every shard.
    assert_eq!(
        s.list(100).await.unwrap().len(),
        2 + 1 + 1 + 4 + 5 + 3 + 2 + 4
    );
    // Each primary holds some of the namespace's keys (the shards' tags
    // spread over the slot ranges), each replica process one heartbeat per
    // shard. The heartbeats live 6 s and nothing here beats every second as
    // a gateway does: one beat now, so that a suite slower than 6 s still
    // finds them.
    s.replica_alive().await.unwrap();
    for n in &cluster.nodes[..3] {
        let keys = n.cli(&["--scan", "--pattern", "conf:*"]).await;
        let keys = String::from_utf8_lossy(&keys);
        let heartbeats = keys.lines().filter(|k| k.contains(":replica:")).count();
        assert!(
            keys.lines().any(|k| k.contains(":task:")) && heartbeats > 0,
            "node {} holds no task of the namespace:\n{keys}",
            n.port
        );
    }
    let all: usize = {
        let mut n = 0;
        for node in &cluster.nodes[..3] {
            let keys = node.cli(&["--scan", "--pattern", "conf:*:replica:*"]).await;
            n += String::from_utf8_lossy(&keys).lines().count();
        }
        n
    };
    assert_eq!(all, CLUSTER_SHARDS, "one heartbeat key per shard");
}

/// A namespace with a brace would choose the keys' slot: refused.
#[tokio::test]
async fn a_namespace_with_a_brace_is_refused_on_a_cluster() {
    let cluster = RedisCluster::start().await;
    let err = RedisStore::connect(&cluster.url(), "a{b}")
        .await
        .expect_err("connected with a braced namespace");
    assert!(err.to_string().contains("namespace"), "{err}");
}

/// A route whose children hold [`TTL`] leases.
fn leased_config(cluster: &RedisCluster, worker: &Worker) -> String {
    format!(
        "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\nlease = {{ ttl = \"{}s\" }}\n",
        cluster.url(),
        worker.url(),
        TTL.as_secs()
    )
}

/// `n` children streamed through `gw`, each holding a lease.
async fn children(gw: &Gateway, n: usize) -> (Vec<SseStream>, Vec<String>) {
    let mut streams = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..n {
        let (s, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:60000").await;
        streams.push(s);
        ids.push(id);
    }
    (streams, ids)
}

/// Each of `ids` is cancelled within [`TTL`] + 1 s (scaled); then the
/// worker has had exactly `cancels` in all (once each), and the survivors
/// together counted `lapses` lapsed leases.
async fn cancelled_once_by(
    worker: &Worker,
    ids: &[String],
    survivors: &[&Gateway],
    cancels: u64,
    lapses: f64,
) {
    for id in ids {
        worker
            .wait_state(None, id, CANCELED, TTL + scaled_ms(1000))
            .await
            .unwrap_or_else(|s| {
                let logs: Vec<String> = survivors.iter().map(|g| g.log_text()).collect();
                panic!(
                    "{id} not cancelled by the survivors ({s:?}):\n{}",
                    logs.join("\n---\n")
                )
            });
    }
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(
        worker.cancels().await,
        cancels,
        "each child cancelled exactly once"
    );
    let mut counted = 0.0;
    for g in survivors {
        counted += g.counter("a2agw_leases_lapsed_total", &[]).await;
    }
    assert_eq!(counted, lapses, "the survivors counted each lapse once");
}

/// Three gateway replicas on a cluster, leased children started through
/// all three. A is SIGKILLed: B and C cancel each of A's children once,
/// and keep their own. Then a cluster primary is SIGKILLed and its replica
/// takes over: B and C keep proxying and renewing (a renewal the lost
/// primary's writes miss restarts its lease), all their children still run
/// past a TTL; B is SIGKILLed and C cancels each of B's children once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapses_are_cancelled_once_through_a_primary_failover() {
    let mut cluster = RedisCluster::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let cfg = leased_config(&cluster, &worker);
    let mut a = Gateway::start(&cfg).await;
    let mut b = Gateway::start(&cfg).await;
    let c = Gateway::start(&cfg).await;
    let (sa, ia) = children(&a, 4).await;
    let (sb, mut ib) = children(&b, 4).await;
    let (sc, ic) = children(&c, 4).await;

    a.kill().await;
    cancelled_once_by(&worker, &ia, &[&b, &c], 4, 4.0).await;
    for id in ib.iter().chain(&ic) {
        assert_eq!(
            worker.state(None, id).await.as_deref(),
            Some(WORKING),
            "{id}"
        );
    }

    let took_over = cluster.kill_primary(0).await;
    eprintln!("node 0 killed, node {took_over} took its slots over");
    // Proxying goes on, on the promoted node too.
    let (sb2, ib2) = children(&b, 4).await;
    ib.extend(ib2);
    // Past a TTL after the failover, everything B and C hold still runs.
    tokio::time::sleep(TTL + scaled_ms(1000)).await;
    for id in ib.iter().chain(&ic) {
        assert_eq!(
            worker.state(None, id).await.as_deref(),
            Some(WORKING),
            "{id}: renewed through the failover; B's log:\n{}",
            b.log_text()
        );
    }
    let counted = c.counter("a2agw_leases_lapsed_total", &[]).await;
    let started = Instant::now();
    b.kill().await;
    cancelled_once_by(&worker, &ib, &[&c], 4 + 8, counted + 8.0).await;
    eprintln!(
        "B's 8 children cancelled {:?} after its death",
        started.elapsed()
    );
    for id in &ic {
        assert_eq!(
            worker.state(None, id).await.as_deref(),
            Some(WORKING),
            "{id}"
        );
    }
    drop((sa, sb, sb2, sc));
}

/// Concurrent grants over three replicas against one account on a
/// cluster: exactly the affordable three start.
#[tokio::test]
async fn three_replicas_share_an_account_on_a_cluster() {
    let cluster = RedisCluster::start().await;
    crate::budgets::replicas_share_an_account(&cluster.url(), 3).await;
}

/// A cluster URL whose nodes do not answer: the gateway does not start,
/// and says why.
#[tokio::test]
async fn no_cluster_no_start() {
    let port = crate::harness::gateway::free_port();
    let cfg = format!(
        "[store]\nurl = \"redis+cluster://127.0.0.1:{port}\"\n\n\
         [[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:1\"\n"
    );
    let (code, stderr) = crate::harness::gateway::run_config_to_exit(&cfg, &[]).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("cluster"), "{stderr}");
}
