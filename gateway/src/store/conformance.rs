//! The behaviour every store must have; each implementation runs it (the
//! memory store in its unit tests, Redis in the integration tests).

#![allow(clippy::missing_panics_doc)]

use super::*;
use policies::lease::Renewal;

/// A claim's hold that never comes within these tests.
pub const NEVER: u64 = 1 << 50;

fn key(id: &str) -> TaskKey {
    TaskKey {
        route: "r".into(),
        tenant: "".into(),
        task_id: id.into(),
    }
}

/// Every check, on an empty store.
pub async fn run(store: &dyn TaskStore) {
    records(store).await;
    writes(store).await;
    owners(store).await;
    contexts(store).await;
    leases(store).await;
    accounts(store).await;
    outbox(store).await;
    links(store).await;
    tree_budgets(store).await;
}

/// A write is an update whose record is not read back: the same changes.
async fn writes(store: &dyn TaskStore) {
    let k = TaskKey {
        route: "w".into(),
        tenant: "acme".into(),
        task_id: "written".into(),
    };
    let watch = |state: Option<TaskState>, tenant: &str, delta: i32| {
        (
            TaskKey {
                tenant: tenant.into(),
                ..k.clone()
            },
            TaskUpdate {
                state,
                watchers_delta: delta,
                message_id: Some("m1".into()),
                ..TaskUpdate::default()
            },
        )
    };
    let (key, u) = watch(Some(TaskState::Working), "acme", 2);
    store.write(&key, u, 5).await.unwrap();
    // Another tenant's write moves the state only (as an update does).
    let (key, u) = watch(Some(TaskState::InputRequired), "other", 5);
    store.write(&key, u, 6).await.unwrap();
    let (key, u) = watch(None, "acme", -1);
    store.write(&key, u, 7).await.unwrap();
    let rec = store.get(&k).await.unwrap().expect("written");
    assert_eq!(
        (
            &*rec.key.tenant,
            rec.state,
            rec.watchers,
            rec.updated_ms,
            rec.message_id.as_deref()
        ),
        ("acme", Some(TaskState::InputRequired), 1, 7, Some("m1"))
    );
}

/// A parent's budget for its children on any replica: opened with its
/// grant and where its task is; charges summed across callers, before or
/// after the opening; exactly one charge told to stop it.
async fn tree_budgets(store: &dyn TaskStore) {
    let meters = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    };
    let parent = ChildLink {
        route: "p".into(),
        tenant: "acme".into(),
        message_id: "m-\"p\"/é".into(),
        target: CancelTarget {
            binding: Binding::Rest,
            path: "/v1".into(),
        },
        replica: Some("10.0.0.3:9000".into()),
        sent_ms: 1_700_000_000_000,
        depth: 2,
    };
    let far = now_ms() + 60_000;
    assert_eq!(store.tree_budget_get("b0").await.unwrap(), None);
    let grant = meters(&[("tokens", 100), ("calls", 3)]);
    store
        .tree_budget_open("b1", &grant, &parent, far)
        .await
        .unwrap();
    let b = store.tree_budget_get("b1").await.unwrap().unwrap();
    assert_eq!(
        (&b.grant, &b.spent, b.parent.as_ref(), b.stop),
        (&grant, &meters(&[]), Some(&parent), false)
    );
    let b = store
        .tree_budget_charge("b1", &meters(&[("tokens", 60)]))
        .await
        .unwrap();
    assert_eq!(
        (b.spent.clone(), b.stop),
        (meters(&[("tokens", 60)]), false)
    );
    // Exactly at the grant is within it; past it, one charge stops.
    let b = store
        .tree_budget_charge("b1", &meters(&[("tokens", 40), ("calls", 1)]))
        .await
        .unwrap();
    assert_eq!(
        (b.spent.clone(), b.stop),
        (meters(&[("tokens", 100), ("calls", 1)]), false)
    );
    let b = store
        .tree_budget_charge("b1", &meters(&[("tokens", 1)]))
        .await
        .unwrap();
    assert!(b.stop, "{b:?}");
    assert_eq!(b.parent.as_ref(), Some(&parent));
    let b = store
        .tree_budget_charge("b1", &meters(&[("calls", 9)]))
        .await
        .unwrap();
    assert!(!b.stop, "stopped once: {b:?}");
    assert_eq!(b.spent, meters(&[("tokens", 101), ("calls", 10)]));
    assert!(!store.tree_budget_get("b1").await.unwrap().unwrap().stop);
    // Charged before its opening: kept, and counted once opened.
    let b = store
        .tree_budget_charge("b2", &meters(&[("tokens", 7)]))
        .await
        .unwrap();
    assert_eq!(
        (b.grant.is_empty(), b.parent.is_none(), b.stop),
        (true, true, false)
    );
    store
        .tree_budget_open("b2", &meters(&[("tokens", 10)]), &parent, far)
        .await
        .unwrap();
    let b = store.tree_budget_get("b2").await.unwrap().unwrap();
    assert_eq!(b.spent, meters(&[("tokens", 7)]));
    assert!(
        store
            .tree_budget_charge("b2", &meters(&[("tokens", 4)]))
            .await
            .unwrap()
            .stop
    );
}

/// Delegation links: kept per reference in order, read across several,
/// bounded; and one key for every caller.
async fn links(store: &dyn TaskStore) {
    let child = |m: &str, depth: u8| ChildLink {
        route: "kids".into(),
        tenant: if depth == 1 { "".into() } else { "acme".into() },
        message_id: m.into(),
        target: CancelTarget {
            binding: if depth == 1 {
                Binding::JsonRpc
            } else {
                Binding::Grpc
            },
            path: if depth == 1 {
                "/rpc".into()
            } else {
                String::new()
            },
        },
        replica: (depth == 2).then(|| "10.0.0.2:9000".to_string()),
        sent_ms: 1_700_000_000_000 + u64::from(depth),
        depth,
    };
    assert!(store.children(&[]).await.unwrap().is_empty());
    assert!(store.children(&["p0".into()]).await.unwrap().is_empty());
    let (a, b, c) = (child("m-a", 1), child("m-b", 2), child("m \"c\"/é", 3));
    assert!(store.link_child("p1", "ra", &a).await.unwrap());
    assert!(store.link_child("p1", "rb", &b).await.unwrap());
    assert!(store.link_child("p2", "rc", &c).await.unwrap());
    assert_eq!(
        store.children(&["p1".into()]).await.unwrap(),
        vec![a.clone(), b.clone()]
    );
    assert_eq!(
        store
            .children(&["p0".into(), "p2".into(), "p1".into()])
            .await
            .unwrap(),
        vec![c, a.clone(), b]
    );
    for i in 2..MAX_CHILDREN {
        assert!(store
            .link_child("full", &format!("r{i}"), &child(&format!("m{i}"), 1))
            .await
            .unwrap());
    }
    assert!(store.link_child("full", "rfull", &a).await.unwrap());
    assert!(store.link_child("full", "rfull", &a).await.unwrap());
    assert!(
        !store.link_child("full", "rfull", &a).await.unwrap(),
        "past MAX_CHILDREN"
    );
    assert_eq!(
        store.children(&["full".into()]).await.unwrap().len(),
        MAX_CHILDREN
    );
    assert_eq!(store.parent_of(&[]).await.unwrap(), None);
    assert_eq!(store.parent_of(&["nobody".into()]).await.unwrap(), None);
    assert_eq!(
        store
            .parent_of(&["nobody".into(), "rb".into(), "rc".into()])
            .await
            .unwrap(),
        Some(("p1".to_string(), 2))
    );
    let k = store.link_key().await.unwrap();
    assert!(k.len() >= 16);
    assert_eq!(store.link_key().await.unwrap(), k);
}

fn okey(id: &str) -> TaskKey {
    TaskKey {
        route: "ob".into(),
        tenant: "acme".into(),
        task_id: id.into(),
    }
}

/// The routes an outbox claimer has: `okey`'s.
fn ob_routes() -> Vec<Arc<str>> {
    vec![Arc::from("ob")]
}

/// The token of a put that must have made this replica the holder.
async fn put_mine(store: &dyn TaskStore, key: &TaskKey, target: &CancelTarget, now: u64) -> String {
    match store
        .outbox_put(key, target, "caller_gone", now)
        .await
        .unwrap()
    {
        Owing::Mine(token) => token,
        other => panic!("{key}: {other:?}, not held"),
    }
}

async fn outbox(store: &dyn TaskStore) {
    let target = CancelTarget {
        binding: Binding::Rest,
        path: "/v1".into(),
    };
    let owns =
        |k: &'static str, t: String| async move { store.outbox_owns(&okey(k), &t).await.unwrap() };
    assert_eq!(store.outbox_get(&okey("o1")).await.unwrap(), None);

    // Written before the first attempt, held by this replica with a token.
    let t1 = put_mine(store, &okey("o1"), &target, 1_000).await;
    let got = store.outbox_get(&okey("o1")).await.unwrap().expect("held");
    assert_eq!(
        (&got.target, got.cause.as_str(), got.token.as_str()),
        (&target, "caller_gone", t1.as_str())
    );
    assert!(!got.owner.is_empty());
    assert!(owns("o1", t1.clone()).await);
    assert!(!owns("o1", "someone-else".into()).await);
    assert!(!owns("o1", String::new()).await);
    // Another stream's cascade of the same task: carried already.
    assert_eq!(
        store
            .outbox_put(&okey("o1"), &target, "stream_lost", 1_001)
            .await
            .unwrap(),
        Owing::Elsewhere
    );
    // Its holder lives: nobody claims it, however late.
    assert!(store
        .outbox_claim(NEVER, 100, &ob_routes())
        .await
        .unwrap()
        .is_empty());

    // Every attempt failed: handed back (by its holder only), due at
    // 40_000, claimed then once, by a claimer with its route, afresh.
    assert!(!store
        .outbox_retry(&okey("o1"), "stale", 40_000)
        .await
        .unwrap());
    assert!(store.outbox_retry(&okey("o1"), &t1, 40_000).await.unwrap());
    assert!(!owns("o1", t1.clone()).await);
    assert_eq!(
        store.outbox_get(&okey("o1")).await.unwrap().unwrap().owner,
        ""
    );
    assert!(store
        .outbox_claim(39_999, 100, &ob_routes())
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .outbox_claim(40_000, 100, &[Arc::from("elsewhere")])
        .await
        .unwrap()
        .is_empty());
    let c = store.outbox_claim(40_000, 100, &ob_routes()).await.unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (&c[0].key, &c[0].target, c[0].cause.as_str()),
        (&okey("o1"), &target, "caller_gone")
    );
    assert_ne!(c[0].token, t1);
    assert!(owns("o1", c[0].token.clone()).await);
    assert!(store
        .outbox_claim(NEVER, 100, &ob_routes())
        .await
        .unwrap()
        .is_empty());
    // The worker answered: removed, whoever holds it.
    store.outbox_done(&okey("o1")).await.unwrap();
    assert_eq!(store.outbox_get(&okey("o1")).await.unwrap(), None);
    assert!(!owns("o1", c[0].token.clone()).await);
    assert!(!store
        .outbox_retry(&okey("o1"), &c[0].token, 1)
        .await
        .unwrap());
    assert!(store
        .outbox_claim(NEVER, 100, &ob_routes())
        .await
        .unwrap()
        .is_empty());
    // Nothing for a zero limit or no routes.
    store
        .outbox_put(&okey("o0"), &target, "caller_gone", 1)
        .await
        .unwrap();
    let t0 = store.outbox_get(&okey("o0")).await.unwrap().unwrap().token;
    store.outbox_retry(&okey("o0"), &t0, 1).await.unwrap();
    assert!(store
        .outbox_claim(NEVER, 0, &ob_routes())
        .await
        .unwrap()
        .is_empty());
    assert!(store.outbox_claim(NEVER, 10, &[]).await.unwrap().is_empty());
    store.outbox_done(&okey("o0")).await.unwrap();

    // Writing it ends the task's lease: the outbox carries the cancel, not
    // a lapse, so the reaper does not send it too.
    let leases = store.lease_count().await.unwrap();
    store
        .lease_start(&okey("o2"), 1_000, None, 0, &Asker::Unverified)
        .await
        .unwrap();
    let t2 = put_mine(store, &okey("o2"), &target, 500).await;
    assert_eq!(store.get(&okey("o2")).await.unwrap().unwrap().lease, None);
    assert_eq!(store.lease_count().await.unwrap(), leases);
    assert!(claim(store, NEVER - 1, 100, NEVER, &ob_routes())
        .await
        .is_empty());
    // The task settles: nothing is owed any more; its holder's next check
    // says so.
    store
        .update(
            &okey("o2"),
            TaskUpdate {
                state: Some(TaskState::Completed),
                ..TaskUpdate::default()
            },
            600,
        )
        .await
        .unwrap();
    assert_eq!(store.outbox_get(&okey("o2")).await.unwrap(), None);
    assert!(!owns("o2", t2).await);
    assert_eq!(
        store
            .outbox_put(&okey("o2"), &target, "caller_gone", 700)
            .await
            .unwrap(),
        Owing::Settled
    );

    // A lapse claim holds the task's lease (its cancel in flight): that
    // claim delivers it, the cascade writes nothing.
    store
        .lease_start(&okey("o3"), 1_000, None, 0, &Asker::Unverified)
        .await
        .unwrap();
    let lapsed = claim(store, 5_000, 100, 60_000, &ob_routes()).await;
    assert_eq!(lapsed.len(), 1);
    assert_eq!(
        store
            .outbox_put(&okey("o3"), &target, "caller_gone", 6_000)
            .await
            .unwrap(),
        Owing::Elsewhere
    );
    assert_eq!(store.outbox_get(&okey("o3")).await.unwrap(), None);
    // Past its hold (the claimer died mid-cancel) the outbox takes it over,
    // and the lapse is not claimed again.
    put_mine(store, &okey("o3"), &target, 60_001).await;
    assert!(claim(store, NEVER - 1, 100, NEVER, &ob_routes())
        .await
        .is_empty());
    // A new lease on a task whose cancel the outbox carries does not make
    // the reaper send it as well.
    store
        .lease_start(&okey("o3"), 1_000, None, 70_000, &Asker::Unverified)
        .await
        .unwrap();
    assert!(claim(store, 80_000, 100, NEVER, &ob_routes())
        .await
        .is_empty());
    store.outbox_done(&okey("o3")).await.unwrap();
    assert_eq!(store.get(&okey("o3")).await.unwrap().unwrap().lease, None);
    assert_eq!(store.outbox_get(&okey("o3")).await.unwrap(), None);
    assert_eq!(store.lease_count().await.unwrap(), leases);
}

/// An ask with a ticket of its own.
fn ask(holder: &str, meter: &str, amount: u64, limit: u64) -> Reservation {
    static TICKETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = TICKETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Reservation {
        account: AccountKey {
            route: "r".into(),
            scope: "tenant".into(),
            holder: holder.into(),
            window_start_ms: 0,
        },
        meter: meter.into(),
        amount,
        limit,
        expires_ms: now_ms() + 60_000,
        ticket: format!("conformance-{n}"),
    }
}

async fn balance(store: &dyn TaskStore, holder: &str, meter: &str) -> policies::budget::Account {
    store
        .account_list(1000)
        .await
        .unwrap()
        .into_iter()
        .find(|v| &*v.account.holder == holder && v.meter == meter)
        .map(|v| v.balance)
        .expect("the account is listed")
}

/// Reserves `asks` (the store answered, and not with a full store).
async fn reserve(store: &dyn TaskStore, asks: &[Reservation]) -> Result<(), Shortfall> {
    match store.account_reserve(asks).await.unwrap() {
        Ok(()) => Ok(()),
        Err(Unreserved::Short(s)) => Err(s),
        Err(full) => panic!("{full:?}"),
    }
}

/// On a store built to keep at most `max` live accounts (an empty one):
/// `max` accounts open, the next is refused whole (an ask on an open
/// account beside it included), and open accounts still reserve.
pub async fn account_bound(store: &dyn TaskStore, max: u64) {
    for i in 0..max {
        reserve(store, &[ask(&format!("b{i}"), "tokens", 1, 10)])
            .await
            .unwrap();
    }
    let both = [ask("b0", "tokens", 1, 10), ask("new", "tokens", 1, 10)];
    assert_eq!(
        store.account_reserve(&both).await.unwrap(),
        Err(Unreserved::Full { max })
    );
    assert_eq!(
        balance(store, "b0", "tokens").await.reserved,
        1,
        "nothing reserved"
    );
    reserve(store, &[ask("b0", "tokens", 1, 10)]).await.unwrap();
    assert_eq!(balance(store, "b0", "tokens").await.reserved, 2);
}

async fn accounts(store: &dyn TaskStore) {
    use policies::budget::Account;
    let a = ask("acme", "tokens", 60, 100);
    assert_eq!(reserve(store, std::slice::from_ref(&a)).await, Ok(()));
    assert_eq!(
        balance(store, "acme", "tokens").await,
        Account {
            limit: 100,
            spent: 0,
            reserved: 60
        }
    );
    // 40 left: 50 does not fit, and nothing of the batch is reserved.
    let both = [ask("acme", "calls", 1, 10), ask("acme", "tokens", 50, 100)];
    assert_eq!(
        reserve(store, &both).await,
        Err(Shortfall { index: 1, left: 40 })
    );
    assert!(store
        .account_list(1000)
        .await
        .unwrap()
        .iter()
        .all(|v| v.meter != "calls" || v.balance.reserved == 0));
    // Two asks on one meter add up.
    assert_eq!(
        reserve(
            store,
            &[
                ask("acme", "tokens", 30, 100),
                ask("acme", "tokens", 30, 100)
            ]
        )
        .await,
        Err(Shortfall { index: 1, left: 10 })
    );
    // A ticket already held is not reserved again (a retried reserve).
    assert_eq!(reserve(store, std::slice::from_ref(&a)).await, Ok(()));
    assert_eq!(balance(store, "acme", "tokens").await.reserved, 60);
    // The withdrawal of a reservation that never landed (its answer lost,
    // the reserve not applied) takes nothing off the others', and its
    // reserve landing after it reserves nothing.
    let never = ask("acme", "tokens", 40, 100);
    store.account_settle(&[(never.clone(), 0)]).await.unwrap();
    assert_eq!(reserve(store, &[never]).await, Ok(()));
    assert_eq!(
        balance(store, "acme", "tokens").await,
        Account {
            limit: 100,
            spent: 0,
            reserved: 60
        }
    );
    // Settled with less than reserved: the rest comes back.
    store.account_settle(&[(a.clone(), 25)]).await.unwrap();
    let settled = Account {
        limit: 100,
        spent: 25,
        reserved: 0,
    };
    assert_eq!(balance(store, "acme", "tokens").await, settled);
    // A settlement sent again (a retry whose first answer was lost) is
    // applied once, and the ticket is not reserved again.
    store.account_settle(&[(a.clone(), 25)]).await.unwrap();
    assert_eq!(reserve(store, std::slice::from_ref(&a)).await, Ok(()));
    assert_eq!(balance(store, "acme", "tokens").await, settled);
    // Released (charged 0), and overdraft charged in full.
    let b = ask("acme", "tokens", 75, 100);
    assert_eq!(reserve(store, std::slice::from_ref(&b)).await, Ok(()));
    store.account_settle(&[(b.clone(), 0)]).await.unwrap();
    assert_eq!(balance(store, "acme", "tokens").await.left(), 75);
    let b = ask("acme", "tokens", 75, 100);
    assert_eq!(reserve(store, std::slice::from_ref(&b)).await, Ok(()));
    store.account_settle(&[(b, 90)]).await.unwrap();
    assert_eq!(
        balance(store, "acme", "tokens").await,
        Account {
            limit: 100,
            spent: 115,
            reserved: 0
        }
    );
    // Overdrawn: nothing left, but a 0 ask still goes.
    assert_eq!(
        reserve(store, &[ask("acme", "tokens", 1, 100)]).await,
        Err(Shortfall { index: 0, left: 0 })
    );
    assert_eq!(
        reserve(store, &[ask("acme", "tokens", 0, 100)]).await,
        Ok(())
    );
    // Another holder's account is its own.
    assert_eq!(
        reserve(store, &[ask("beta", "tokens", 100, 100)]).await,
        Ok(())
    );
    // Concurrent children: exactly limit / amount of them get a reservation.
    let tries = (0..20).map(|_| async move {
        store
            .account_reserve(&[ask("race", "tokens", 10, 95)])
            .await
    });
    let won = futures_util::future::join_all(tries)
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Ok(()))))
        .count();
    assert_eq!(won, 9);
    assert_eq!(balance(store, "race", "tokens").await.reserved, 90);
    // A child whose reservation the store lost (a Redis restarted without
    // persistence) is still charged what it spent, once.
    let lost = ask("lost", "tokens", 50, 100);
    store.account_settle(&[(lost.clone(), 30)]).await.unwrap();
    store.account_settle(&[(lost, 30)]).await.unwrap();
    assert_eq!(
        balance(store, "lost", "tokens").await,
        Account {
            limit: 100,
            spent: 30,
            reserved: 0
        }
    );
}

async fn records(store: &dyn TaskStore) {
    assert_eq!(store.get(&key("t1")).await.unwrap(), None);

    let target = CancelTarget {
        binding: Binding::JsonRpc,
        path: "/".into(),
    };
    let rec = store
        .update(
            &key("t1"),
            TaskUpdate {
                context_id: Some("c1".into()),
                state: Some(TaskState::Working),
                target: Some(target.clone()),
                watchers_delta: 1,
                ..TaskUpdate::default()
            },
            10,
        )
        .await
        .unwrap();
    assert_eq!(rec.watchers, 1);
    assert_eq!(rec.state, Some(TaskState::Working));

    // A second watcher, then both leave: never below zero.
    let up = |d| TaskUpdate {
        watchers_delta: d,
        ..TaskUpdate::default()
    };
    assert_eq!(
        store.update(&key("t1"), up(1), 11).await.unwrap().watchers,
        2
    );
    assert_eq!(
        store.update(&key("t1"), up(-1), 12).await.unwrap().watchers,
        1
    );
    assert_eq!(
        store.update(&key("t1"), up(-1), 13).await.unwrap().watchers,
        0
    );
    assert_eq!(
        store.update(&key("t1"), up(-1), 14).await.unwrap().watchers,
        0
    );

    // Terminal is final.
    let state = |s| TaskUpdate {
        state: Some(s),
        ..TaskUpdate::default()
    };
    store
        .update(&key("t1"), state(TaskState::Completed), 15)
        .await
        .unwrap();
    let rec = store
        .update(&key("t1"), state(TaskState::Working), 16)
        .await
        .unwrap();
    assert_eq!(rec.state, Some(TaskState::Completed));
    assert_eq!(rec.context_id.as_deref(), Some("c1"));
    assert_eq!(rec.target, Some(target));
    assert_eq!(rec.updated_ms, 16);

    // Interrupted is not final: a continuation works again.
    store
        .update(&key("t2"), state(TaskState::InputRequired), 20)
        .await
        .unwrap();
    let rec = store
        .update(&key("t2"), state(TaskState::Working), 21)
        .await
        .unwrap();
    assert_eq!(rec.state, Some(TaskState::Working));

    // A task is one record whatever tenant names it: the one it was
    // first recorded in stays, and another tenant's update moves only the
    // state (the worker's word), never watchers, owner or target.
    let other = TaskKey {
        tenant: "acme".into(),
        ..key("t1")
    };
    let rec = store.get(&other).await.unwrap().expect("the same record");
    assert_eq!(&*rec.key.tenant, "");
    let rec = store
        .update(
            &other,
            TaskUpdate {
                watchers_delta: 1,
                owner: Some("key:mallory".into()),
                target: Some(CancelTarget {
                    binding: Binding::Rest,
                    path: "/elsewhere".into(),
                }),
                ..TaskUpdate::default()
            },
            30,
        )
        .await
        .unwrap();
    assert_eq!(&*rec.key.tenant, "", "the first tenant stays");
    assert_eq!((rec.watchers, rec.owner.as_deref()), (0, None));
    assert_ne!(rec.target.map(|t| t.path), Some("/elsewhere".into()));
    // Nor does it start a lease there.
    store
        .lease_start(&other, 1_000, None, 30, &Asker::Unverified)
        .await
        .unwrap();
    assert_eq!(store.get(&key("t1")).await.unwrap().unwrap().lease, None);

    let listed = store.list(10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(store.list(1).await.unwrap().len(), 1);
}

/// The identity a send records owns the task: another identity's (or an
/// anonymous caller's) watcher counts change nothing, the owner's do, and
/// a route without auth (`Unverified`) is not held to it.
async fn owners(store: &dyn TaskStore) {
    use crate::store::Asker;
    let k = TaskKey {
        route: "own".into(),
        tenant: String::new().into(),
        task_id: "o1".into(),
    };
    let watch = |delta: i32, asker: Asker| TaskUpdate {
        watchers_delta: delta,
        asker,
        ..TaskUpdate::default()
    };
    let alice = || Asker::Identity("key:alice".into());
    let rec = store
        .update(
            &k,
            TaskUpdate {
                owner: Some("key:alice".into()),
                ..watch(1, alice())
            },
            10,
        )
        .await
        .unwrap();
    assert_eq!((rec.owner.as_deref(), rec.watchers), (Some("key:alice"), 1));
    for other in [Asker::Identity("jwt:alice".into()), Asker::Anonymous] {
        let rec = store.update(&k, watch(1, other.clone()), 11).await.unwrap();
        assert_eq!(rec.watchers, 1, "{other:?} counts nothing");
        let rec = store.update(&k, watch(-1, other), 12).await.unwrap();
        assert_eq!(rec.watchers, 1);
    }
    // A later send names no new owner.
    let rec = store
        .update(
            &k,
            TaskUpdate {
                owner: Some("key:bob".into()),
                ..watch(1, alice())
            },
            13,
        )
        .await
        .unwrap();
    assert_eq!((rec.owner.as_deref(), rec.watchers), (Some("key:alice"), 2));
    let rec = store
        .update(&k, watch(-1, Asker::Unverified), 14)
        .await
        .unwrap();
    assert_eq!(rec.watchers, 1);
    assert_eq!(
        store.get(&k).await.unwrap().and_then(|r| r.owner),
        Some("key:alice".to_string())
    );
}

/// A context's replica: the first pinned task's, per route, only from the
/// record's tenant, and only when asked.
async fn contexts(store: &dyn TaskStore) {
    let key = |route: &str, tenant: &str, id: &str| TaskKey {
        route: route.into(),
        tenant: tenant.into(),
        task_id: id.into(),
    };
    let sight = |context: &str, replica: &str, pin: bool| TaskUpdate {
        context_id: Some(context.into()),
        replica: Some(replica.into()),
        pin_context: pin,
        ..TaskUpdate::default()
    };
    let at = |route: &'static str, context: &'static str| async move {
        store.context_replica(route, context).await.unwrap()
    };
    assert_eq!(at("ctx", "c1").await, None);
    // Not asked to pin: the record has its replica, the context none.
    let rec = store
        .update(&key("ctx", "", "t0"), sight("c0", "r:1", false), 10)
        .await
        .unwrap();
    assert_eq!(rec.replica.as_deref(), Some("r:1"));
    assert_eq!(at("ctx", "c0").await, None);
    store
        .update(&key("ctx", "", "t1"), sight("c1", "r:1", true), 10)
        .await
        .unwrap();
    assert_eq!(at("ctx", "c1").await.as_deref(), Some("r:1"));
    // A later task in the context, on another replica: the first stays.
    store
        .update(&key("ctx", "", "t2"), sight("c1", "r:2", true), 11)
        .await
        .unwrap();
    assert_eq!(at("ctx", "c1").await.as_deref(), Some("r:1"));
    // Another route's context of the same name is its own.
    assert_eq!(at("ctx2", "c1").await, None);
    // The pin is the record's replica, not the update's.
    store
        .update(&key("ctx", "", "t1"), sight("c3", "r:9", true), 12)
        .await
        .unwrap();
    assert_eq!(at("ctx", "c3").await.as_deref(), Some("r:1"));
    // A request naming the task in another tenant pins nothing.
    store
        .update(&key("ctx", "acme", "t2"), sight("c4", "r:2", true), 13)
        .await
        .unwrap();
    assert_eq!(at("ctx", "c4").await, None);
    // Names with the separator in them stay apart.
    store
        .update(&key("a:b", "", "t5"), sight("c", "r:5", true), 14)
        .await
        .unwrap();
    assert_eq!(at("a", "b:c").await, None);
    assert_eq!(at("a:b", "c").await.as_deref(), Some("r:5"));
}

/// The routes a claimer has: `lkey`'s.
fn routes() -> Vec<Arc<str>> {
    vec![Arc::from("lease")]
}

/// [`TaskStore::lease_claim_lapsed`] by a claimer with `routes`.
async fn claim(
    store: &dyn TaskStore,
    now_ms: u64,
    limit: usize,
    hold_until_ms: u64,
    routes: &[Arc<str>],
) -> Vec<TaskRecord> {
    store
        .lease_claim_lapsed(now_ms, limit, hold_until_ms, routes)
        .await
        .unwrap()
}

fn lkey(id: &str) -> TaskKey {
    TaskKey {
        route: "lease".into(),
        tenant: "acme".into(),
        task_id: id.into(),
    }
}

async fn leases(store: &dyn TaskStore) {
    let before = store.lease_count().await.unwrap();
    store
        .lease_start(&lkey("l1"), 1_000, None, 100, &Asker::Unverified)
        .await
        .unwrap();
    let rec = store
        .get(&lkey("l1"))
        .await
        .unwrap()
        .expect("lease_start creates the record");
    assert_eq!(
        rec.lease,
        Some(LeaseRecord {
            ttl_ms: 1_000,
            deadline_ms: 1_100,
            holder: None
        })
    );
    assert_eq!(store.lease_count().await.unwrap(), before + 1);

    // Renewal moves the deadline by the TTL; at the deadline itself it is live.
    assert_eq!(
        store.lease_renew(&lkey("l1"), 600).await.unwrap(),
        Renewal::Renewed { deadline_ms: 1_600 }
    );
    assert_eq!(
        store.lease_renew(&lkey("l1"), 1_600).await.unwrap(),
        Renewal::Renewed { deadline_ms: 2_600 }
    );
    // Nothing has lapsed yet.
    assert!(claim(store, 2_600, 100, NEVER, &routes()).await.is_empty());
    // Past the deadline a renewal does not revive it; it is claimed once.
    assert_eq!(
        store.lease_renew(&lkey("l1"), 2_601).await.unwrap(),
        Renewal::Lapsed
    );
    let claimed = claim(store, 2_601, 100, NEVER, &routes()).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].key, lkey("l1"));
    assert!(claim(store, 9_999, 100, NEVER, &routes()).await.is_empty());
    // A claimed lease renews nothing.
    assert_eq!(
        store.lease_renew(&lkey("l1"), 2_602).await.unwrap(),
        Renewal::NoLease
    );
    // No lease at all.
    assert_eq!(
        store.lease_renew(&lkey("none"), 100).await.unwrap(),
        Renewal::NoLease
    );

    // A claimed lease handed back (its cancel failed) is claimed again once
    // its retry time comes, by one caller, and is never renewed meanwhile.
    store.lease_retry(&lkey("l1"), 5_000).await.unwrap();
    assert!(claim(store, 4_999, 100, NEVER, &routes()).await.is_empty());
    assert_eq!(
        store.lease_renew(&lkey("l1"), 4_999).await.unwrap(),
        Renewal::NoLease
    );
    let again = claim(store, 5_000, 100, NEVER, &routes()).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].key, lkey("l1"));
    assert!(claim(store, 99_999, 100, NEVER, &routes()).await.is_empty());
    // Handed back after its lease ended (the task settled): nothing to claim.
    store.lease_retry(&lkey("l1"), 6_000).await.unwrap();
    store.lease_end(&lkey("l1")).await.unwrap();
    assert!(claim(store, 99_999, 100, NEVER, &routes()).await.is_empty());
    // Unknown tasks are not handed back.
    store.lease_retry(&lkey("none"), 6_000).await.unwrap();
    assert!(claim(store, 99_999, 100, NEVER, &routes()).await.is_empty());

    // Held leases renew in a batch; unknown keys are skipped.
    store
        .lease_start(&lkey("h1"), 2_000, Some("replica-a"), 0, &Asker::Unverified)
        .await
        .unwrap();
    store
        .lease_start(&lkey("h2"), 2_000, Some("replica-a"), 0, &Asker::Unverified)
        .await
        .unwrap();
    let r = store
        .lease_renew_many(&[lkey("h1"), lkey("nobody"), lkey("h2")], 1_000)
        .await
        .unwrap();
    // A key the store has no record of is lost, not just unrenewed.
    assert_eq!(
        r,
        Renewals {
            renewed: 2,
            lost: vec![1]
        }
    );
    let h1 = store
        .get(&lkey("h1"))
        .await
        .unwrap()
        .unwrap()
        .lease
        .unwrap();
    assert_eq!(
        (h1.deadline_ms, h1.holder.as_deref()),
        (3_000, Some("replica-a"))
    );

    // Settling ends the lease: nothing to claim afterwards.
    store
        .update(
            &lkey("h1"),
            TaskUpdate {
                state: Some(TaskState::Completed),
                ..TaskUpdate::default()
            },
            1_100,
        )
        .await
        .unwrap();
    assert_eq!(store.get(&lkey("h1")).await.unwrap().unwrap().lease, None);
    // An ended lease is gone too.
    store.lease_end(&lkey("h2")).await.unwrap();
    assert!(claim(store, 99_999, 100, NEVER, &routes()).await.is_empty());
    assert_eq!(store.lease_count().await.unwrap(), before);

    // Claims are bounded by `limit`, and every lapsed lease is claimed once.
    for i in 0..5 {
        store
            .lease_start(&lkey(&format!("b{i}")), 1_000, None, 0, &Asker::Unverified)
            .await
            .unwrap();
    }
    let first = claim(store, 5_000, 3, NEVER, &routes()).await;
    let second = claim(store, 5_000, 3, NEVER, &routes()).await;
    assert_eq!((first.len(), second.len()), (3, 2));
    let mut ids: Vec<String> = first
        .iter()
        .chain(&second)
        .map(|r| r.key.task_id.to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, ["b0", "b1", "b2", "b3", "b4"]);

    // A claimer that dies mid-cancel: the lapse comes back at its hold, to
    // one claimer, and again at the next hold; ended, it is gone.
    store
        .lease_start(&lkey("d1"), 1_000, None, 0, &Asker::Unverified)
        .await
        .unwrap();
    let got = claim(store, 5_000, 10, 8_000, &routes()).await;
    assert_eq!(got.len(), 1);
    assert!(claim(store, 7_999, 10, NEVER, &routes()).await.is_empty());
    let again = claim(store, 8_000, 10, 9_000, &routes()).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].key, lkey("d1"));
    assert!(claim(store, 8_999, 10, NEVER, &routes()).await.is_empty());
    // Handed back sooner than its hold: due then, once (the hold replaced).
    store.lease_retry(&lkey("d1"), 8_500).await.unwrap();
    assert_eq!(claim(store, 8_500, 10, 20_000, &routes()).await.len(), 1);
    assert!(claim(store, 19_999, 10, NEVER, &routes()).await.is_empty());
    store.lease_end(&lkey("d1")).await.unwrap();
    assert!(claim(store, NEVER - 1, 10, NEVER, &routes())
        .await
        .is_empty());

    // A task that gets a new lease after a claim (the caller resumed it):
    // the old claim's hold does not reap the new lease.
    store
        .lease_start(&lkey("n1"), 1_000, None, 0, &Asker::Unverified)
        .await
        .unwrap();
    assert_eq!(claim(store, 5_000, 10, 8_000, &routes()).await.len(), 1);
    store
        .lease_start(&lkey("n1"), 60_000, None, 6_000, &Asker::Unverified)
        .await
        .unwrap();
    assert!(claim(store, 8_000, 10, NEVER, &routes()).await.is_empty());
    assert_eq!(
        store.lease_renew(&lkey("n1"), 9_000).await.unwrap(),
        Renewal::Renewed {
            deadline_ms: 69_000
        }
    );
    store.lease_end(&lkey("n1")).await.unwrap();

    // Handed-back leases are claimed by route: a claimer without the
    // lease's route (an older config mid rolling deploy) does not take back
    // what it handed back, a claimer with the route does; a first lapse is
    // anyone's, and so is nothing else.
    let other: Vec<Arc<str>> = vec![Arc::from("elsewhere")];
    store
        .lease_start(&lkey("h1"), 1_000, None, 0, &Asker::Unverified)
        .await
        .unwrap();
    let first = claim(store, 5_000, 10, NEVER, &other).await;
    assert_eq!(first.len(), 1, "a first lapse is claimed by any replica");
    store.lease_retry(&lkey("h1"), 5_000).await.unwrap();
    assert!(claim(store, 6_000, 10, NEVER, &other).await.is_empty());
    let taken = claim(store, 6_000, 10, 7_000, &routes()).await;
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].key, lkey("h1"));
    // Its claim's hold is by route too: if that claimer dies, a replica
    // with the route takes it, not one without.
    assert!(claim(store, 7_000, 10, NEVER, &other).await.is_empty());
    assert_eq!(claim(store, 7_000, 10, NEVER, &routes()).await.len(), 1);
    store.lease_end(&lkey("h1")).await.unwrap();
    assert!(claim(store, NEVER - 1, 10, NEVER, &routes())
        .await
        .is_empty());
}
