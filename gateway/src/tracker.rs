//! The tracker: store writes from the proxy's synchronous hooks (a task
//! seen, settled, watched; a lease started; a delegation link), queued
//! without waiting and applied by background loops, sharded by task so
//! that a task's writes stay in order. On a store whose calls complete at
//! once (the memory store: [`TaskStore::completes_at_once`]) they are
//! applied where they are made instead: in order by construction, and
//! without waking the loops' thread for each.

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
}

/// What a shard's queue carries: ops, and the flushes that wait for them.
#[derive(Debug)]
enum Queued {
    Op(Op),
    /// Answered once every op queued before it has been applied.
    Flush(oneshot::Sender<()>),
}

/// The sending half handed to the proxy: never blocks, never awaits.
#[derive(Clone, Debug)]
pub struct Tracker {
    /// One queue per shard; a task's ops all go to one, in order.
    txs: Arc<[mpsc::Sender<Queued>]>,
    /// The store, when its calls complete at once: ops are applied here,
    /// nothing is queued.
    at_once: Option<Arc<dyn TaskStore>>,
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
            let (tx, rx) = mpsc::channel::<Queued>(TRACKER_QUEUE / TRACKER_SHARDS);
            txs.push(tx);
            shards.push(Self::apply(store.clone(), rx));
        }
        let at_once = store.completes_at_once().then_some(store);
        let run = async move {
            futures_util::future::join_all(shards).await;
        };
        (
            Tracker {
                txs: txs.into(),
                at_once,
            },
            run,
        )
    }

    /// One shard's loop: its ops, one after another.
    async fn apply(store: Arc<dyn TaskStore>, mut rx: mpsc::Receiver<Queued>) {
        while let Some(queued) = rx.recv().await {
            match queued {
                Queued::Op(op) => Self::apply_one(store.clone(), op).await,
                Queued::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Applies one op to `store`.
    async fn apply_one(store: Arc<dyn TaskStore>, op: Op) {
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
        }
    }

    /// The queue of `key`'s shard: a task's (a task is one record
    /// whatever tenant names it: [`TaskKey`]'s hash leaves the tenant
    /// out), or a reference's links.
    fn queue<K: std::hash::Hash + ?Sized>(&self, key: &K) -> &mpsc::Sender<Queued> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(key);
        &self.txs[(h % self.txs.len() as u64) as usize]
    }

    /// Applies `op` here when the store completes at once, else queues it
    /// on its shard's queue without waiting. `false`: the queue was full,
    /// the op dropped (counted).
    fn send(&self, op: Op) -> bool {
        let Some(store) = &self.at_once else {
            let q = match &op {
                Op::Update(key, _) | Op::LeaseStart { key, .. } => self.queue(key),
                Op::Link { parent, .. } => self.queue(parent.as_str()),
            };
            if q.try_send(Queued::Op(op)).is_err() {
                metrics::Untracked::TrackerQueueFull.count();
                return false;
            }
            return true;
        };
        let mut applying = Box::pin(Self::apply_one(store.clone(), op));
        if futures_util::FutureExt::now_or_never(&mut applying).is_none() {
            // Not a store that completes at once after all: the op is
            // finished in the background rather than lost.
            tracing::warn!(
                store = store.kind(),
                "a store write did not complete at once; finishing it in the background"
            );
            tokio::spawn(applying);
        }
        true
    }

    /// Queues a child's link under `parent` (a reference, hex) without
    /// waiting: written before the child's send is answered, off its path.
    pub fn link(&self, parent: String, child_ref: String, child: crate::store::ChildLink) {
        let route = child.route.clone();
        let op = Op::Link {
            parent,
            child_ref,
            child: Box::new(child),
        };
        if !self.send(op) {
            metrics::TREE_LINKS
                .with_label_values(&[&route, "dropped"])
                .inc();
        }
    }

    /// Queues an update without waiting.
    pub fn update(&self, key: TaskKey, update: TaskUpdate) {
        self.send(Op::Update(key, update));
    }

    /// Queues the start of a lease (after the update that recorded the
    /// task), for `asker`'s request: it starts nothing on a task `asker` may
    /// not move.
    pub fn lease_start(&self, key: TaskKey, ttl_ms: u64, holder: Option<String>, asker: Asker) {
        self.send(Op::LeaseStart {
            key,
            ttl_ms,
            holder,
            asker,
        });
    }

    /// Waits until every op queued for `key` before this call is applied:
    /// its shard's alone (one wake-up, where [`Tracker::flush`] wakes every
    /// shard). At once when nothing is queued (the store completes at once).
    pub async fn flush_key(&self, key: &TaskKey) {
        if self.at_once.is_some() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        if self.queue(key).send(Queued::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Waits until every update queued before this call is applied.
    pub async fn flush(&self) {
        if self.at_once.is_some() {
            return;
        }
        let waits = self.txs.iter().map(|q| async move {
            let (tx, rx) = oneshot::channel();
            if q.send(Queued::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        });
        futures_util::future::join_all(waits).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::timed::TimedStore;
    use policies::TaskState;
    use std::time::Duration;

    /// On the memory store the tracker writes where the hook calls it: the
    /// record and its lease are there with the tracker's loop never run,
    /// and a flush does not wait for that loop.
    #[tokio::test]
    async fn a_store_that_completes_at_once_is_written_in_the_call() {
        let store = TimedStore::wrap(Arc::new(MemoryStore::new(1_000, Duration::from_secs(60))));
        assert!(store.completes_at_once());
        let (tracker, _never_run) = Tracker::new(store.clone());
        let key = TaskKey::new(&Arc::from("r"), None, "t1");
        tracker.update(
            key.clone(),
            TaskUpdate {
                state: Some(TaskState::Working),
                watchers_delta: 1,
                ..TaskUpdate::default()
            },
        );
        tracker.lease_start(key.clone(), 5_000, None, Asker::default());
        tracker.flush_key(&key).await;
        tracker.flush().await;
        let rec = store
            .get(&key)
            .await
            .unwrap()
            .expect("recorded in the call");
        assert_eq!(rec.state, Some(TaskState::Working));
        assert_eq!(rec.watchers, 1);
        assert_eq!(rec.lease.map(|l| l.ttl_ms), Some(5_000));
    }
}
