//! The Redis store against a real `redis-server`: the shared conformance
//! suite, plus what only a shared store has to get right (racing replicas,
//! a dying server, expiry).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use a2a_gateway::store::conformance::NEVER;
use a2a_gateway::store::redis::{RedisStore, LIVE_TTL, SETTLED_RETENTION};
use a2a_gateway::store::{Asker, CancelTarget, Owing, Renewal, TaskKey, TaskStore, TaskUpdate};
use policies::TaskState;

use crate::harness::gateway::free_port;
use crate::harness::redis::RedisServer;
use crate::harness::{scaled_ms, scaled_secs};

fn key(route: &str, tenant: &str, id: &str) -> TaskKey {
    TaskKey {
        route: route.into(),
        tenant: tenant.into(),
        task_id: id.into(),
    }
}

fn state(s: TaskState) -> TaskUpdate {
    TaskUpdate {
        state: Some(s),
        ..TaskUpdate::default()
    }
}

async fn store(server: &RedisServer, ns: &str) -> RedisStore {
    RedisStore::connect(&server.url(), ns)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", server.url(), server.log()))
}

/// A plain connection for looking at what the store wrote.
async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn redis_store_conformance() {
    let server = RedisServer::start().await;
    let s = store(&server, "conf").await;
    assert_eq!(s.kind(), "redis");
    a2a_gateway::store::conformance::run(&s).await;
    let bounded = store(&server, "bound").await.with_max_accounts(3);
    a2a_gateway::store::conformance::account_bound(&bounded, 3).await;
    // A second namespace on the same server is a separate store.
    let other = store(&server, "conf2").await;
    a2a_gateway::store::conformance::run(&other).await;
    // Records, a written one, an owned one, the contexts' four tasks, leases, lapses,
    // handed-back lapses; and the outbox's four tasks (a put writes the
    // task's hash).
    assert_eq!(
        other.list(100).await.unwrap().len(),
        2 + 1 + 1 + 4 + 5 + 3 + 2 + 4
    );
}

#[tokio::test]
async fn key_layout_and_bad_data() {
    let server = RedisServer::start().await;
    let s = store(&server, "ns").await;
    // The tenant is not part of a task's key (`TaskKey`).
    assert_eq!(s.task_key(&key("r", "a:b", "c")), "ns:task:r:c");
    assert_eq!(s.task_key(&key("r", "", "t/1")), "ns:task:r:t%2F1");
    assert_eq!(s.task_key(&key("a:b", "", "c")), "ns:task:a%3Ab:c");
    assert_eq!(s.leases_key(&key("r", "", "c")), "ns:leases");
    assert_eq!(s.outbox_key(&key("r", "", "c")), "ns:outbox:r");
    assert_eq!(s.context_key("a:b", "c/1"), "ns:ctx:a%3Ab:c%2F1");

    // A `:` in a route or task id never makes two tasks share a key.
    s.update(&key("r", "a:b", "c"), state(TaskState::Working), 1)
        .await
        .unwrap();
    assert_eq!(s.get(&key("r:c", "", "c")).await.unwrap(), None);
    assert_eq!(s.get(&key("r", "", "r:c")).await.unwrap(), None);
    let listed = s.list(10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, key("r", "a:b", "c"));
    assert_eq!(
        &*listed[0].key.tenant, "a:b",
        "the tenant is kept with the record"
    );

    // Garbage in a hash reads as None/0, never a panic.
    let mut c = raw(&server).await;
    // A context's replica expires as a live task's record does.
    s.update(
        &key("r", "", "p1"),
        TaskUpdate {
            context_id: Some("c9".into()),
            replica: Some("h:1".into()),
            pin_context: true,
            ..TaskUpdate::default()
        },
        1,
    )
    .await
    .unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(s.context_key("r", "c9"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        ttl > 0 && ttl <= LIVE_TTL.as_millis() as i64,
        "context key PTTL {ttl}"
    );
    let bad = s.task_key(&key("r", "", "bad"));
    let _: () = redis::cmd("HSET")
        .arg(&bad)
        .arg(&[
            ("state", "nonsense"),
            ("watchers", "-7"),
            ("updated_ms", "soon"),
            ("binding", "grpc"),
            ("lease_deadline", "never"),
        ])
        .query_async(&mut c)
        .await
        .unwrap();
    let rec = s.get(&key("r", "", "bad")).await.unwrap().unwrap();
    assert_eq!(
        (
            rec.state,
            rec.watchers,
            rec.updated_ms,
            rec.target,
            rec.lease
        ),
        (None, 0, 0, None, None)
    );
    // And the scripts cope with it too.
    let rec = s
        .update(
            &key("r", "", "bad"),
            TaskUpdate {
                watchers_delta: 2,
                ..state(TaskState::Working)
            },
            5,
        )
        .await
        .unwrap();
    assert_eq!(
        (rec.state, rec.watchers, rec.updated_ms),
        (Some(TaskState::Working), 2, 5)
    );

    // A key of the wrong type is an error, not a panic.
    let wrong = s.task_key(&key("r", "", "wrong"));
    let _: () = redis::cmd("SET")
        .arg(&wrong)
        .arg("x")
        .query_async(&mut c)
        .await
        .unwrap();
    let err = s.get(&key("r", "", "wrong")).await.unwrap_err();
    assert!(err.to_string().contains("redis get"), "{err}");
    assert!(s
        .update(&key("r", "", "wrong"), TaskUpdate::default(), 1)
        .await
        .is_err());
    // list skips it (the three: `c`, `bad` and `p1`).
    assert_eq!(s.list(100).await.unwrap().len(), 3);
}

/// Two replicas' reapers, eight claimers in all, over 200 lapsed leases:
/// every lease is claimed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_take_each_lease_once() {
    let server = RedisServer::start().await;
    let a = Arc::new(store(&server, "race").await);
    let b = Arc::new(store(&server, "race").await);
    for i in 0..200 {
        a.lease_start(
            &key("r", "t", &format!("task-{i}")),
            1_000,
            None,
            0,
            &Asker::Unverified,
        )
        .await
        .unwrap();
    }
    assert_eq!(a.lease_count().await.unwrap(), 200);

    let mut claimers = Vec::new();
    for n in 0..8 {
        let s = if n % 2 == 0 { a.clone() } else { b.clone() };
        claimers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = s
                    .lease_claim_lapsed(5_000, 7, NEVER, &[Arc::from("r")])
                    .await
                    .unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|r| r.key.task_id.to_string()));
            }
        }));
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), 200, "claimed {} in total", all.len());
    assert_eq!(unique.len(), 200);
    assert_eq!(a.lease_count().await.unwrap(), 0);
}

/// A renewal racing a claim of the same lease (on two connections, as two
/// replicas would): never both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_racing_a_claim_never_both() {
    let server = RedisServer::start().await;
    let renewer = Arc::new(store(&server, "rc").await);
    let claimer = Arc::new(store(&server, "rc").await);
    let (mut renewed_first, mut claimed_first) = (0, 0);
    for i in 0..100 {
        let k = key("r", "", &format!("t{i}"));
        // Deadline 1000.
        renewer
            .lease_start(&k, 1_000, None, 0, &Asker::Unverified)
            .await
            .unwrap();

        // Lapsed on both clocks: the renewal never revives it, the claim
        // always gets it.
        let (r, c) = tokio::join!(
            {
                let (s, k) = (renewer.clone(), k.clone());
                tokio::spawn(async move { s.lease_renew(&k, 2_000).await.unwrap() })
            },
            {
                let s = claimer.clone();
                tokio::spawn(async move {
                    s.lease_claim_lapsed(2_000, 10, NEVER, &[Arc::from("r")])
                        .await
                        .unwrap()
                })
            }
        );
        let (r, c) = (r.unwrap(), c.unwrap());
        assert!(matches!(r, Renewal::Lapsed | Renewal::NoLease), "{r:?}");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].key, k);

        // Live on the renewer's clock, lapsed on the claimer's (replica
        // clocks differ): whichever runs first wins, never both.
        renewer
            .lease_start(&k, 1_000, None, 0, &Asker::Unverified)
            .await
            .unwrap();
        let (r, c) = tokio::join!(
            {
                let (s, k) = (renewer.clone(), k.clone());
                tokio::spawn(async move { s.lease_renew(&k, 1_000).await.unwrap() })
            },
            {
                let s = claimer.clone();
                tokio::spawn(async move {
                    s.lease_claim_lapsed(1_500, 10, NEVER, &[Arc::from("r")])
                        .await
                        .unwrap()
                })
            }
        );
        match (r.unwrap(), c.unwrap().len()) {
            (Renewal::Renewed { deadline_ms: 2_000 }, 0) => {
                renewed_first += 1;
                assert_eq!(claimer.lease_count().await.unwrap(), 1);
                renewer.lease_end(&k).await.unwrap();
            }
            (Renewal::NoLease, 1) => claimed_first += 1,
            other => panic!("renewal and claim both or neither won: {other:?}"),
        }
        assert_eq!(claimer.lease_count().await.unwrap(), 0);
    }
    eprintln!("renewal first {renewed_first}, claim first {claimed_first}");
    assert_eq!(renewed_first + claimed_first, 100);
}

/// A dead server makes calls fail fast; once it is back, calls work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_server_fails_fast_then_recovers() {
    let mut server = RedisServer::start().await;
    let s = store(&server, "dead").await;
    let k = key("r", "", "t");
    s.update(&k, state(TaskState::Working), 1).await.unwrap();
    s.lease_start(&k, 1_000, None, 1, &Asker::Unverified)
        .await
        .unwrap();

    server.kill().await;
    for round in 0..4 {
        let started = Instant::now();
        let r = tokio::time::timeout(scaled_secs(10), async {
            match round % 4 {
                0 => s.get(&k).await.map(|_| ()),
                1 => s.update(&k, TaskUpdate::default(), 2).await.map(|_| ()),
                2 => s.lease_renew(&k, 3).await.map(|_| ()),
                _ => s
                    .lease_claim_lapsed(9_999, 10, NEVER, &[Arc::from("r")])
                    .await
                    .map(|_| ()),
            }
        })
        .await
        .expect("a call on a dead server hung");
        let took = started.elapsed();
        let err = r.expect_err("a call on a dead server succeeded");
        assert!(err.to_string().starts_with("store: redis "), "{err}");
        eprintln!("dead server, round {round}: {took:?}: {err}");
        assert!(
            took < scaled_ms(2_500),
            "round {round} took {took:?}: {err}"
        );
    }
    // Connecting to nothing fails fast too.
    let started = Instant::now();
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{}/0", free_port()), "x")
        .await
        .expect_err("connected to nothing");
    assert!(started.elapsed() < scaled_secs(6), "{err}");

    server.restart().await;
    let deadline = Instant::now() + scaled_secs(10);
    let got = loop {
        match s.get(&k).await {
            Ok(got) => break got,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no reconnect after restart: {e}"),
        }
    };
    // Without persistence the state is gone; everything works again,
    // scripts included (reloaded into the new server's cache).
    assert_eq!(got, None);
    s.update(&k, state(TaskState::Working), 10).await.unwrap();
    s.lease_start(&k, 1_000, Some("replica"), 10, &Asker::Unverified)
        .await
        .unwrap();
    assert_eq!(
        s.lease_renew(&k, 20).await.unwrap(),
        Renewal::Renewed { deadline_ms: 1_020 }
    );
    assert_eq!(s.lease_count().await.unwrap(), 1);
}

/// Every task hash expires: long while unsettled or leased, the short
/// retention once settled.
#[tokio::test]
async fn task_hashes_expire() {
    let server = RedisServer::start().await;
    let s = store(&server, "exp").await;
    let mut c = raw(&server).await;
    let pttl = {
        let c = c.clone();
        move |k: String| {
            let mut c = c.clone();
            async move {
                let ms: i64 = redis::cmd("PTTL").arg(k).query_async(&mut c).await.unwrap();
                ms
            }
        }
    };
    let live = LIVE_TTL.as_millis() as i64;
    let short = SETTLED_RETENTION.as_millis() as i64;

    let k = key("r", "", "t");
    s.update(&k, state(TaskState::Working), 1).await.unwrap();
    let t = pttl(s.task_key(&k)).await;
    assert!(t > short && t <= live, "{t}");

    s.update(&k, state(TaskState::Completed), 2).await.unwrap();
    let t = pttl(s.task_key(&k)).await;
    assert!(t > 0 && t <= short, "{t}");

    // Records made by a lease, and interrupted tasks holding a lease, live
    // long; ending the lease of an interrupted task shortens it.
    let l = key("r", "", "leased");
    s.lease_start(&l, 1_000, None, 1, &Asker::Unverified)
        .await
        .unwrap();
    let t = pttl(s.task_key(&l)).await;
    assert!(t > short && t <= live, "{t}");
    s.update(&l, state(TaskState::InputRequired), 2)
        .await
        .unwrap();
    let t = pttl(s.task_key(&l)).await;
    assert!(t > 0 && t <= short, "{t}");
    s.lease_start(&l, 1_000, None, 3, &Asker::Unverified)
        .await
        .unwrap();
    let t = pttl(s.task_key(&l)).await;
    assert!(t > short && t <= live, "{t}");
    s.lease_end(&l).await.unwrap();
    let t = pttl(s.task_key(&l)).await;
    assert!(t > 0 && t <= short, "{t}");

    // Nothing under the namespace is kept without an expiry but the index.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("exp:*")
        .query_async(&mut c)
        .await
        .unwrap();
    for k in keys {
        let t = pttl(k.clone()).await;
        assert!(t > 0 || k == s.leases_key(&l), "{k}: {t}");
    }
}

/// Listing walks the keyspace one bounded `SCAN` step per round trip: two
/// accounts among 5,000 task hashes are found (five or more steps of
/// `COUNT 1000`), and no script call runs longer than one step (`SLOWLOG`
/// records none over 50 ms; one script walking the whole keyspace took
/// longer before).
#[tokio::test]
async fn listing_steps_through_a_large_keyspace() {
    use a2a_gateway::store::{AccountKey, Reservation};
    let server = RedisServer::start().await;
    let s = store(&server, "big").await;
    let mut conn = raw(&server).await;
    let mut pipe = redis::pipe();
    for i in 0..5000 {
        pipe.hset(format!("big:task:r:t:{i}"), "state", "working")
            .ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    for holder in ["acme", "globex"] {
        let ask = Reservation {
            account: AccountKey {
                route: "r".into(),
                scope: "tenant".into(),
                holder: holder.into(),
                window_start_ms: 0,
            },
            meter: "tokens".into(),
            amount: 1,
            limit: 10,
            expires_ms: a2a_gateway::store::now_ms() + 60_000,
            ticket: format!("big-{holder}"),
        };
        assert_eq!(s.account_reserve(&[ask]).await.unwrap(), Ok(()));
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(50_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut conn)
        .await
        .unwrap();
    let calls_before = script_calls(&mut conn).await;
    let mut holders: Vec<String> = s
        .account_list(100)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.account.holder.to_string())
        .collect();
    holders.sort();
    assert_eq!(holders, ["acme", "globex"]);
    let steps = script_calls(&mut conn).await - calls_before;
    assert!(steps >= 5, "one script call per SCAN step: {steps} calls");
    assert_eq!(s.list(7).await.unwrap().len(), 7, "stops at the limit");
    assert_eq!(s.list(6000).await.unwrap().len(), 5000);
    let slow: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(slow.is_empty(), "script calls over 50 ms: {slow:?}");
}

/// Script calls (`EVAL` and `EVALSHA`) the server has run so far.
async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Each replica process's streams count as watchers only while its
/// heartbeat key lives: one that died (key expired) or stopped
/// (`replica_gone`) no longer keeps tasks watched for the others, and a
/// replica restarted under the same id does not bring them back.
#[tokio::test]
async fn watchers_of_a_replica_count_while_it_lives() {
    let server = RedisServer::start().await;
    let a = RedisStore::connect_as(&server.url(), "ns", "a/1")
        .await
        .unwrap();
    let b = RedisStore::connect_as(&server.url(), "ns", "b")
        .await
        .unwrap();
    let k = key("r", "", "t");
    let watch = |n: i32| TaskUpdate {
        watchers_delta: n,
        ..state(TaskState::Working)
    };
    assert_eq!(a.update(&k, watch(1), 1).await.unwrap().watchers, 1);
    assert_eq!(b.update(&k, watch(1), 2).await.unwrap().watchers, 2);
    assert_eq!(a.get(&k).await.unwrap().unwrap().watchers, 2);
    // The key layout: one heartbeat key per replica process, its id
    // (`replica_id@start`) percent-encoded.
    let mut c = raw(&server).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("ns:replica:a%2F1%40*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        (1..=a2a_gateway::store::redis::REPLICA_TTL.as_millis() as i64).contains(&ttl),
        "{ttl}"
    );
    // A replica that dies without a word: its heartbeat runs out.
    let _: () = redis::cmd("PEXPIRE")
        .arg(&keys[0])
        .arg(50)
        .query_async(&mut c)
        .await
        .unwrap();
    // Past the 50 ms it was given.
    tokio::time::sleep(Duration::from_millis(50) + scaled_ms(100)).await;
    assert_eq!(b.get(&k).await.unwrap().unwrap().watchers, 1);
    assert_eq!(b.list(10).await.unwrap()[0].watchers, 1);
    a.replica_alive().await.unwrap();
    assert_eq!(b.get(&k).await.unwrap().unwrap().watchers, 2);
    // One that stops: at once, and for good.
    a.replica_gone().await.unwrap();
    assert_eq!(b.get(&k).await.unwrap().unwrap().watchers, 1);
    a.replica_alive().await.unwrap();
    assert_eq!(b.get(&k).await.unwrap().unwrap().watchers, 1);
    // Restarted under the same id: a new process, none of the old streams.
    let a2 = RedisStore::connect_as(&server.url(), "ns", "a/1")
        .await
        .unwrap();
    assert_eq!(a2.get(&k).await.unwrap().unwrap().watchers, 1);
    // B's own count is its own.
    assert_eq!(b.update(&k, watch(-1), 3).await.unwrap().watchers, 0);
    // The count an older version kept in `watchers` still counts.
    let _: () = redis::cmd("HSET")
        .arg(b.task_key(&k))
        .arg("watchers")
        .arg(3)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(b.get(&k).await.unwrap().unwrap().watchers, 3);
}

/// The outbox across replicas: an owed cancel is claimed only once its
/// holder's heartbeat key is gone, by exactly one of the replicas racing
/// for it, with a token of its own; the former holder's token no longer
/// holds it. A live holder's entry is looked at again only when its
/// heartbeat could run out. The keys: `{ns}:outbox:{route}` and the
/// `ob_*` fields of the task's hash, both gone once it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owed_cancels_are_claimed_once_their_holder_is_gone() {
    let server = RedisServer::start().await;
    let connect = |id: &'static str| {
        let url = server.url();
        async move { RedisStore::connect_as(&url, "ns", id).await.unwrap() }
    };
    let (a, b, c) = (connect("a").await, connect("b").await, connect("c").await);
    let k = key("w", "acme", "t1");
    let target = CancelTarget {
        binding: a2a_gateway::a2a::Binding::JsonRpc,
        path: "/".into(),
    };
    let routes: Vec<Arc<str>> = vec![Arc::from("w")];
    let now = a.clock_ms();
    let Owing::Mine(ta) = a.outbox_put(&k, &target, "caller_gone", now).await.unwrap() else {
        panic!("not held by A");
    };
    let mut conn = raw(&server).await;
    let task = a.task_key(&k);
    let outbox = a.outbox_key(&k);
    assert_eq!(outbox, "ns:outbox:w");
    let owner: String = redis::cmd("HGET")
        .arg(&task)
        .arg("ob_owner")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner, a.replica());
    // First looked at when A's heartbeat could have run out.
    let score: f64 = redis::cmd("ZSCORE")
        .arg(&outbox)
        .arg(&task)
        .query_async(&mut conn)
        .await
        .unwrap();
    let ttl = a2a_gateway::store::redis::REPLICA_TTL.as_millis() as f64;
    assert_eq!(score, now as f64 + ttl);

    // A lives: B neither claims it nor writes its own.
    let later = now + 60_000;
    assert!(b.outbox_claim(later, 10, &routes).await.unwrap().is_empty());
    assert_eq!(
        b.outbox_put(&k, &target, "caller_gone", later)
            .await
            .unwrap(),
        Owing::Elsewhere
    );
    // B's look re-scored it to when A's key would expire.
    let score: f64 = redis::cmd("ZSCORE")
        .arg(&outbox)
        .arg(&task)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        score > later as f64 && score <= later as f64 + ttl,
        "{score} vs {later}"
    );

    // A is gone: B and C race for it; exactly one wins.
    a.replica_gone().await.unwrap();
    let far = later + 60_000;
    let (rb, rc) = tokio::join!(
        b.outbox_claim(far, 10, &routes),
        c.outbox_claim(far, 10, &routes)
    );
    let (rb, rc) = (rb.unwrap(), rc.unwrap());
    assert_eq!(rb.len() + rc.len(), 1, "{rb:?} {rc:?}");
    let (winner, won, other) = if rb.len() == 1 {
        (&b, &rb[0], &c)
    } else {
        (&c, &rc[0], &b)
    };
    assert_eq!((&won.key, &won.target), (&k, &target));
    assert_eq!(won.owner, winner.replica());
    assert!(winner.outbox_owns(&k, &won.token).await.unwrap());
    assert!(!a.outbox_owns(&k, &ta).await.unwrap(), "A's token is void");
    assert!(!a.outbox_retry(&k, &ta, 0).await.unwrap());
    assert!(other
        .outbox_claim(far + 60_000, 10, &routes)
        .await
        .unwrap()
        .is_empty());

    // Delivered: nothing left in Redis.
    winner.outbox_done(&k).await.unwrap();
    let left: u64 = redis::cmd("ZCARD")
        .arg(&outbox)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0);
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&task)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(fields.iter().all(|f| !f.starts_with("ob_")), "{fields:?}");
}
