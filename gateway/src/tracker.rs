//! The tracker: store writes from the proxy's synchronous hooks (a task
//! seen, settled, watched; a lease started; a delegation link), queued
//! without waiting and applied by background loops, sharded by task so
//! that a task's writes stay in order.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::metrics;
use crate::store::{Asker, TaskKey, TaskStore, TaskUpdate};

/// Changes to the store, sent from the synchronous body filters.
#[derive(Debug)]
enum Op {
    Update(TaskKey, TaskUpdate),
    LeaseStart {
        key: TaskKey,
        ttl_ms: u64,
        holder: Option<String>,
        asker: Asker,
    },
    /// A send linked under a parent's reference (delegation trees).
    Link {
        parent: String,
        child_ref: String,
        child: Box<crate::store::ChildLink>,
    },
    /// Answered once every op sent before it has been applied.
    Flush(oneshot::Sender<()>),
}

/// The sending half handed to the proxy: never blocks, never awaits.
#[derive(Clone, Debug)]
pub struct Tracker {
    /// One queue per shard; a task's ops all go to one, in order.
    txs: Arc<[mpsc::Sender<Op>]>,
}

/// Capacity of the tracker's queues, all shards together. A full queue
/// drops the update (counted in
/// `a2agw_untracked_total{reason="tracker_queue_full"}`) rather than stall
/// a response.
pub const TRACKER_QUEUE: usize = 16 * 1024;

/// How many store calls the tracker has in flight at most: its ops are
/// sharded by task, each shard applying its own in order (a task's record
/// before its lease, its settling before its stream's end), the shards
/// side by side. On Redis a store call is a round trip: one shard would
/// apply one op per round trip, about 10,000 a second, fewer than a busy
/// gateway's streams and replicated sends need.
pub const TRACKER_SHARDS: usize = 16;

impl Tracker {
    /// A tracker and the loop that applies its ops to `store`; spawn the
    /// loop on a runtime that lives as long as the proxy.
    pub fn new(store: Arc<dyn TaskStore>) -> (Tracker, impl std::future::Future<Output = ()>) {
        let mut txs = Vec::with_capacity(TRACKER_SHARDS);
        let mut shards = Vec::with_capacity(TRACKER_SHARDS);
        for _ in 0..TRACKER_SHARDS {
            let (tx, rx) = mpsc::channel::<Op>(TRACKER_QUEUE / TRACKER_SHARDS);
            txs.push(tx);
            shards.push(Self::apply(store.clone(), rx));
        }
        let run = async move {
            futures_util::future::join_all(shards).await;
        };
        (Tracker { txs: txs.into() }, run)
    }

    /// One shard's loop: its ops, one after another.
    async fn apply(store: Arc<dyn TaskStore>, mut rx: mpsc::Receiver<Op>) {
        while let Some(op) = rx.recv().await {
            match op {
                Op::Update(key, update) => {
                    if let Err(e) = store.write(&key, update, store.clock_ms()).await {
                        metrics::STORE_ERRORS.with_label_values(&["update"]).inc();
                        tracing::warn!(task = %key, error = %e, "could not record a task");
                    }
                }
                Op::LeaseStart {
                    key,
                    ttl_ms,
                    holder,
                    asker,
                } => {
                    if let Err(e) = store
                        .lease_start(&key, ttl_ms, holder.as_deref(), store.clock_ms(), &asker)
                        .await
                    {
                        metrics::STORE_ERRORS
                            .with_label_values(&["lease_start"])
                            .inc();
                        tracing::warn!(task = %key, error = %e, "could not start a lease");
                    }
                }
                Op::Link {
                    parent,
                    child_ref,
                    child,
                } => {
                    let outcome = match store.link_child(&parent, &child_ref, &child).await {
                        Ok(true) => "child",
                        Ok(false) => "dropped",
                        Err(e) => {
                            metrics::STORE_ERRORS
                                .with_label_values(&["link_child"])
                                .inc();
                            tracing::warn!(route = %child.route, error = %e, "could not link a child to its parent; it is not cancelled with it");
                            "store_error"
                        }
                    };
                    metrics::TREE_LINKS
                        .with_label_values(&[&child.route, outcome])
                        .inc();
                }
                Op::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// The queue of `key`'s shard: a task's (a task is one record
    /// whatever tenant names it: [`TaskKey`]'s hash leaves the tenant
    /// out), or a reference's links.
    fn queue<K: std::hash::Hash + ?Sized>(&self, key: &K) -> &mpsc::Sender<Op> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(key);
        &self.txs[(h % self.txs.len() as u64) as usize]
    }

    /// Queues a child's link under `parent` (a reference, hex) without
    /// waiting: written before the child's send is answered, off its path.
    pub fn link(&self, parent: String, child_ref: String, child: crate::store::ChildLink) {
        let q = self.queue(parent.as_str());
        let route = child.route.clone();
        if q.try_send(Op::Link {
            parent,
            child_ref,
            child: Box::new(child),
        })
        .is_err()
        {
            metrics::Untracked::TrackerQueueFull.count();
            metrics::TREE_LINKS
                .with_label_values(&[&route, "dropped"])
                .inc();
        }
    }

    /// Queues an update without waiting.
    pub fn update(&self, key: TaskKey, update: TaskUpdate) {
        if self.queue(&key).try_send(Op::Update(key, update)).is_err() {
            metrics::Untracked::TrackerQueueFull.count();
        }
    }

    /// Queues the start of a lease (after the update that recorded the
    /// task), for `asker`'s request: it starts nothing on a task `asker` may
    /// not move.
    pub fn lease_start(&self, key: TaskKey, ttl_ms: u64, holder: Option<String>, asker: Asker) {
        if self
            .queue(&key)
            .try_send(Op::LeaseStart {
                key,
                ttl_ms,
                holder,
                asker,
            })
            .is_err()
        {
            metrics::Untracked::TrackerQueueFull.count();
        }
    }

    /// Waits until every op queued for `key` before this call is applied:
    /// its shard's alone (one wake-up, where [`Tracker::flush`] wakes every
    /// shard).
    pub async fn flush_key(&self, key: &TaskKey) {
        let (tx, rx) = oneshot::channel();
        if self.queue(key).send(Op::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Waits until every update queued before this call is applied.
    pub async fn flush(&self) {
        let waits = self.txs.iter().map(|q| async move {
            let (tx, rx) = oneshot::channel();
            if q.send(Op::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        });
        futures_util::future::join_all(waits).await;
    }
}
