//! Issue 30 item 3: owed cancels are durable on the Redis store.
//!
//! Two gateway replicas share one Redis; the worker sits behind a relay the
//! test closes (new connections hang, as a worker that stopped answering).
//! A caller streams a child through replica A and leaves: A decides the
//! cancel, writes it to the outbox (`a2agw:outbox:w`, the `ob_*` fields of
//! the task's hash) and keeps failing to deliver it. Then either A is
//! SIGKILLed and the worker comes back, and B claims the owed cancel once
//! A's heartbeat key has expired and delivers it; or A lives, B leaves it
//! alone, and A delivers it when the worker comes back. Either way the
//! worker gets exactly one `CancelTask` and the outbox is empty afterwards.

use std::time::Duration;

use a2a_gateway::store::redis::REPLICA_TTL;

use crate::harness::gateway::Gateway;
use crate::harness::redis::RedisServer;
use crate::harness::relay::Relay;
use crate::harness::worker::{send_stream, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scenarios};

const CANCELED: &str = "TASK_STATE_CANCELED";
/// The cancel's first backoff in [`config`].
const BACKOFF: Duration = Duration::from_millis(100);
/// Each attempt's timeout in [`config`]: an attempt on the closed relay
/// hangs this long.
const ATTEMPT: Duration = Duration::from_secs(1);

/// Two replicas' config: Redis, a route to the worker through `relay_port`,
/// and cancels that keep trying for about a minute (30 attempts of 1 s,
/// backoff 100 ms doubling to 400 ms).
fn config(redis: &RedisServer, relay_port: u16) -> String {
    format!(
        "[store]\nurl = \"{}\"\n\n[cancel]\nattempts = 30\ntimeout = \"1s\"\nbackoff = \"100ms\"\nbackoff_max = \"400ms\"\n\n[[routes]]\nname = \"w\"\nworker = \"http://127.0.0.1:{relay_port}\"\n",
        redis.url()
    )
}

/// A plain connection to look at what the gateways wrote.
async fn raw(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The task's hash: one per route and task id, whatever its tenant (task
/// ids here need no percent-encoding).
fn task_key(id: &str) -> String {
    format!("a2agw:task:w:{id}")
}

/// Who holds the task's owed cancel (`None`: the outbox holds none).
async fn holder(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg("ob_owner")
        .query_async(conn)
        .await
        .unwrap()
}

/// The outbox holds nothing: no entry in the route's set, no `ob_*` field
/// on the task (waits a little: the entry goes right after the answer).
async fn assert_outbox_empty(conn: &mut redis::aio::MultiplexedConnection, key: &str) {
    let mut left = (0, Vec::new());
    for _ in 0..scaled_count(100) {
        let n: u64 = redis::cmd("ZCARD")
            .arg("a2agw:outbox:w")
            .query_async(conn)
            .await
            .unwrap();
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(key)
            .query_async(conn)
            .await
            .unwrap();
        let ob: Vec<String> = fields
            .into_iter()
            .filter(|f| f.starts_with("ob_"))
            .collect();
        if n == 0 && ob.is_empty() {
            return;
        }
        left = (n, ob);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "the outbox still holds {} entries; task fields {:?}",
        left.0, left.1
    );
}

/// Two replicas, the worker behind `gate`; a caller streams a 60 s child
/// through A and leaves while the gate is closed. Returns once A holds the
/// owed cancel in Redis and has tried it at least once (the gate took a
/// connection after the stream's): A, B, the task id and A's holder name.
async fn owed_by_a(
    redis: &RedisServer,
    worker: &Worker,
    gate: &Relay,
    bind: Bind,
    tenant: Option<&str>,
) -> (Gateway, Gateway, String, String) {
    let cfg = config(redis, gate.port);
    let a = Gateway::start(&cfg).await;
    let b = Gateway::start(&cfg).await;
    let (stream, id) = send_stream(&a.url, bind, tenant, "work:60000").await;
    assert_eq!(
        worker.state(tenant, &id).await.as_deref(),
        Some("TASK_STATE_WORKING")
    );
    let through = gate.accepted();
    gate.set_open(false);
    stream.close();
    let mut conn = raw(redis).await;
    let key = task_key(&id);
    let mut owner = None;
    for _ in 0..scaled_count(250) {
        owner = holder(&mut conn, &key).await;
        if owner.is_some() && gate.accepted() > through {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let owner = owner.unwrap_or_else(|| {
        panic!(
            "A wrote no owed cancel for {id}; its log:\n{}",
            a.log_text()
        )
    });
    assert!(
        gate.accepted() > through,
        "A never tried the cancel; its log:\n{}",
        a.log_text()
    );
    assert!(!owner.is_empty(), "held by A, not handed back");
    (a, b, id, owner)
}

/// A dies owing the cancel; the worker comes back: B claims it once A's
/// heartbeat key expires and delivers it within that expiry plus one
/// backoff (and a scaled margin for B's tick and the call); exactly one
/// `CancelTask` reaches the worker.
async fn owner_killed(kind: Kind, bind: Bind, tenant: Option<&str>) {
    let redis = RedisServer::start().await;
    let worker = Worker::start(kind).await;
    let (authority, _) = crate::harness::http::split_url(&worker.url());
    let gate = Relay::start(authority).await;
    let (mut a, b, id, _) = owed_by_a(&redis, &worker, &gate, bind, tenant).await;
    a.kill().await;
    gate.set_open(true);
    worker
        .wait_state(
            tenant,
            &id,
            CANCELED,
            REPLICA_TTL + BACKOFF + scaled_ms(1500),
        )
        .await
        .unwrap_or_else(|s| {
            panic!(
                "{id} not cancelled by B ({s:?}); B's log:\n{}\nA's log:\n{}",
                b.log_text(),
                a.log_text()
            )
        });
    assert!(
        b.log_text().contains("claimed an owed cancel"),
        "B's log:\n{}",
        b.log_text()
    );
    tokio::time::sleep(scaled_ms(1000)).await;
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_outbox_empty(&mut raw(&redis).await, &task_key(&id)).await;
    assert_eq!(
        b.counter("a2agw_cancels_total", &["outcome=\"canceled\""])
            .await,
        1.0
    );
}

/// A lives owing the cancel, past a heartbeat expiry: B leaves it alone
/// (A's heartbeat key lives); the worker comes back and A's next attempt
/// delivers it. Exactly one `CancelTask`; the outbox is empty afterwards.
async fn owner_alive(kind: Kind, bind: Bind, tenant: Option<&str>) {
    let redis = RedisServer::start().await;
    let worker = Worker::start(kind).await;
    let (authority, _) = crate::harness::http::split_url(&worker.url());
    let gate = Relay::start(authority).await;
    let (a, b, id, owner) = owed_by_a(&redis, &worker, &gate, bind, tenant).await;
    let mut conn = raw(&redis).await;
    // Longer than a dead replica's heartbeat would last.
    tokio::time::sleep(REPLICA_TTL + scaled_ms(1000)).await;
    assert_eq!(
        worker.state(tenant, &id).await.as_deref(),
        Some("TASK_STATE_WORKING"),
        "the worker is unreachable"
    );
    assert_eq!(
        holder(&mut conn, &task_key(&id)).await.as_deref(),
        Some(owner.as_str()),
        "still A's: B's log:\n{}",
        b.log_text()
    );
    gate.set_open(true);
    // A's attempt in flight hangs out its timeout; the next, after at most
    // the longest backoff, goes through.
    worker
        .wait_state(
            tenant,
            &id,
            CANCELED,
            ATTEMPT + Duration::from_millis(400) + scaled_ms(1500),
        )
        .await
        .unwrap_or_else(|s| {
            panic!(
                "{id} not cancelled by A ({s:?}); A's log:\n{}",
                a.log_text()
            )
        });
    tokio::time::sleep(scaled_ms(1000)).await;
    assert_eq!(worker.cancels().await, 1, "exactly one CancelTask");
    assert_outbox_empty(&mut conn, &task_key(&id)).await;
    assert!(
        !b.log_text().contains("claimed an owed cancel"),
        "B claimed a live replica's cancel; its log:\n{}",
        b.log_text()
    );
    assert_eq!(
        a.counter("a2agw_cancels_total", &["outcome=\"canceled\""])
            .await,
        1.0
    );
}

scenarios! {
    rust_jsonrpc_owner_killed => owner_killed(Kind::Rust, Bind::JsonRpc, None);
    python_rest_tenant_owner_killed => owner_killed(Kind::Python, Bind::Rest, Some("acme"));
    rust_rest_tenant_owner_alive => owner_alive(Kind::Rust, Bind::Rest, Some("acme"));
    python_jsonrpc_owner_alive => owner_alive(Kind::Python, Bind::JsonRpc, None);
}
