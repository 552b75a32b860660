//! A [`TaskStore`] that times every call of the store it wraps, for
//! `a2agw_store_op_seconds{op}`.
//!
//! Wrapped once where the store is built, so that every caller (hooks, the
//! cascade, the lease and budget services, the admin endpoint) is timed
//! without a line at each call site. A call costs one `Instant::now` pair
//! and one histogram observation (a few atomic adds) more; the histograms
//! are resolved once, here, not looked up by label per call. Failures are
//! timed too (a Redis call that timed out shows as slow); they are counted
//! where they are handled, in `a2agw_store_errors_total`.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use async_trait::async_trait;
use prometheus::{register_histogram_vec, Histogram, HistogramVec};

use super::{
    AccountView, Asker, CancelTarget, ChildLink, OwedCancel, Owing, Renewal, Renewals, Reservation,
    StoreError, TaskKey, TaskRecord, TaskStore, TaskUpdate, TreeBudget, Unreserved,
};

/// The `op` label values: the [`TaskStore`] method names.
pub const OPS: [&str; 29] = [
    "update",
    "get",
    "list",
    "lease_start",
    "lease_renew",
    "lease_renew_many",
    "lease_end",
    "lease_claim_lapsed",
    "lease_retry",
    "lease_count",
    "account_reserve",
    "account_settle",
    "account_list",
    "outbox_put",
    "outbox_owns",
    "outbox_done",
    "outbox_retry",
    "outbox_claim",
    "outbox_get",
    "replica_alive",
    "replica_gone",
    "context_replica",
    "link_child",
    "children",
    "link_key",
    "parent_of",
    "tree_budget_open",
    "tree_budget_get",
    "tree_budget_charge",
];

/// The `op` values of `a2agw_store_errors_total`.
const ERROR_OPS: [&str; 22] = [
    "update",
    "get",
    "lease_start",
    "lease_renew",
    "lease_renew_many",
    "lease_end",
    "lease_claim_lapsed",
    "lease_retry",
    "account_reserve",
    "account_settle",
    "outbox_put",
    "outbox_owns",
    "outbox_done",
    "outbox_retry",
    "outbox_claim",
    "replica_alive",
    "context_replica",
    "link_child",
    "children",
    "tree_budget_open",
    "tree_budget_get",
    "tree_budget_charge",
];

/// From a memory store's microseconds to a Redis call that timed out.
const BUCKETS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 1.0, 5.0,
];

/// `a2agw_store_op_seconds{op}`.
pub static STORE_OP_TIME: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "a2agw_store_op_seconds",
        "Store call latency by operation (failed calls included), as the gateway waited for it.",
        &["op"],
        BUCKETS.to_vec()
    )
    .expect("metric registers once")
});

/// The wrapped store, its calls timed.
pub struct TimedStore {
    inner: Arc<dyn TaskStore>,
    /// One per [`OPS`] entry, in its order.
    hist: [Histogram; OPS.len()],
}

impl std::fmt::Debug for TimedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl TimedStore {
    /// Wraps `inner`; every op's series is exported from now on, at 0.
    /// `a2agw_store_errors_total` (counted where each failure is handled)
    /// is exported from now on too, at 0 for the ops that count it, so that
    /// an alert on its rate sees the first failure.
    pub fn wrap(inner: Arc<dyn TaskStore>) -> Arc<dyn TaskStore> {
        for op in ERROR_OPS {
            crate::metrics::STORE_ERRORS.with_label_values(&[op]);
        }
        Arc::new(TimedStore {
            inner,
            hist: OPS.map(|op| STORE_OP_TIME.with_label_values(&[op])),
        })
    }

    fn observe(&self, op: usize, since: Instant) {
        self.hist[op].observe(since.elapsed().as_secs_f64());
    }
}

/// Times one call: `timed!(self, index, call)`.
macro_rules! timed {
    ($self:ident, $op:expr, $call:expr) => {{
        let t = Instant::now();
        let r = $call.await;
        $self.observe($op, t);
        r
    }};
}

#[async_trait]
impl TaskStore for TimedStore {
    async fn update(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<TaskRecord, StoreError> {
        timed!(self, 0, self.inner.update(key, update, now_ms))
    }

    async fn write(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        timed!(self, 0, self.inner.write(key, update, now_ms))
    }

    async fn get(&self, key: &TaskKey) -> Result<Option<TaskRecord>, StoreError> {
        timed!(self, 1, self.inner.get(key))
    }

    async fn context_replica(
        &self,
        route: &str,
        context_id: &str,
    ) -> Result<Option<String>, StoreError> {
        timed!(self, 21, self.inner.context_replica(route, context_id))
    }

    async fn list(&self, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
        timed!(self, 2, self.inner.list(limit))
    }

    async fn lease_start(
        &self,
        key: &TaskKey,
        ttl_ms: u64,
        holder: Option<&str>,
        now_ms: u64,
        asker: &Asker,
    ) -> Result<(), StoreError> {
        timed!(
            self,
            3,
            self.inner.lease_start(key, ttl_ms, holder, now_ms, asker)
        )
    }

    async fn lease_renew(&self, key: &TaskKey, now_ms: u64) -> Result<Renewal, StoreError> {
        timed!(self, 4, self.inner.lease_renew(key, now_ms))
    }

    async fn lease_renew_many(
        &self,
        keys: &[TaskKey],
        now_ms: u64,
    ) -> Result<Renewals, StoreError> {
        timed!(self, 5, self.inner.lease_renew_many(keys, now_ms))
    }

    async fn lease_end(&self, key: &TaskKey) -> Result<(), StoreError> {
        timed!(self, 6, self.inner.lease_end(key))
    }

    async fn lease_claim_lapsed(
        &self,
        now_ms: u64,
        limit: usize,
        hold_until_ms: u64,
        routes: &[Arc<str>],
    ) -> Result<Vec<TaskRecord>, StoreError> {
        timed!(
            self,
            7,
            self.inner
                .lease_claim_lapsed(now_ms, limit, hold_until_ms, routes)
        )
    }

    async fn lease_retry(&self, key: &TaskKey, at_ms: u64) -> Result<(), StoreError> {
        timed!(self, 8, self.inner.lease_retry(key, at_ms))
    }

    async fn lease_count(&self) -> Result<u64, StoreError> {
        timed!(self, 9, self.inner.lease_count())
    }

    async fn account_reserve(
        &self,
        asks: &[Reservation],
    ) -> Result<Result<(), Unreserved>, StoreError> {
        timed!(self, 10, self.inner.account_reserve(asks))
    }

    async fn account_settle(&self, settled: &[(Reservation, u64)]) -> Result<(), StoreError> {
        timed!(self, 11, self.inner.account_settle(settled))
    }

    async fn account_list(&self, limit: usize) -> Result<Vec<AccountView>, StoreError> {
        timed!(self, 12, self.inner.account_list(limit))
    }

    async fn outbox_put(
        &self,
        key: &TaskKey,
        target: &CancelTarget,
        cause: &str,
        now_ms: u64,
    ) -> Result<Owing, StoreError> {
        timed!(self, 13, self.inner.outbox_put(key, target, cause, now_ms))
    }

    async fn outbox_owns(&self, key: &TaskKey, token: &str) -> Result<bool, StoreError> {
        timed!(self, 14, self.inner.outbox_owns(key, token))
    }

    async fn outbox_done(&self, key: &TaskKey) -> Result<(), StoreError> {
        timed!(self, 15, self.inner.outbox_done(key))
    }

    async fn outbox_retry(
        &self,
        key: &TaskKey,
        token: &str,
        at_ms: u64,
    ) -> Result<bool, StoreError> {
        timed!(self, 16, self.inner.outbox_retry(key, token, at_ms))
    }

    async fn outbox_claim(
        &self,
        now_ms: u64,
        limit: usize,
        routes: &[Arc<str>],
    ) -> Result<Vec<OwedCancel>, StoreError> {
        timed!(self, 17, self.inner.outbox_claim(now_ms, limit, routes))
    }

    async fn outbox_get(&self, key: &TaskKey) -> Result<Option<OwedCancel>, StoreError> {
        timed!(self, 18, self.inner.outbox_get(key))
    }

    async fn replica_alive(&self) -> Result<(), StoreError> {
        timed!(self, 19, self.inner.replica_alive())
    }

    async fn replica_gone(&self) -> Result<(), StoreError> {
        timed!(self, 20, self.inner.replica_gone())
    }

    async fn link_child(
        &self,
        parent: &str,
        child_ref: &str,
        child: &ChildLink,
    ) -> Result<bool, StoreError> {
        timed!(self, 22, self.inner.link_child(parent, child_ref, child))
    }

    async fn parent_of(&self, refs: &[String]) -> Result<Option<(String, u8)>, StoreError> {
        timed!(self, 25, self.inner.parent_of(refs))
    }

    async fn children(&self, parents: &[String]) -> Result<Vec<ChildLink>, StoreError> {
        timed!(self, 23, self.inner.children(parents))
    }

    async fn link_key(&self) -> Result<Vec<u8>, StoreError> {
        timed!(self, 24, self.inner.link_key())
    }

    async fn tree_budget_open(
        &self,
        reference: &str,
        grant: &BTreeMap<String, u64>,
        parent: &ChildLink,
        expires_ms: u64,
    ) -> Result<(), StoreError> {
        timed!(
            self,
            26,
            self.inner
                .tree_budget_open(reference, grant, parent, expires_ms)
        )
    }

    async fn tree_budget_get(&self, reference: &str) -> Result<Option<TreeBudget>, StoreError> {
        timed!(self, 27, self.inner.tree_budget_get(reference))
    }

    async fn tree_budget_charge(
        &self,
        reference: &str,
        grew: &BTreeMap<String, u64>,
    ) -> Result<TreeBudget, StoreError> {
        timed!(self, 28, self.inner.tree_budget_charge(reference, grew))
    }

    fn clock_ms(&self) -> u64 {
        self.inner.clock_ms()
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn completes_at_once(&self) -> bool {
        self.inner.completes_at_once()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    /// Every op is timed under its own label: the wrapper passes calls
    /// through and the op's count moves by one.
    #[tokio::test]
    async fn times_each_call_under_its_op() {
        let store = TimedStore::wrap(Arc::new(MemoryStore::new(
            100,
            std::time::Duration::from_secs(60),
        )));
        let count = |op: &str| STORE_OP_TIME.with_label_values(&[op]).get_sample_count();
        let key = TaskKey::new(&Arc::from("r"), None, "t1");
        let before = (count("update"), count("get"), count("lease_count"));
        let now = store.clock_ms();
        store
            .update(&key, TaskUpdate::default(), now)
            .await
            .unwrap();
        let got = store.get(&key).await.unwrap();
        assert_eq!(got.map(|r| r.key), Some(key));
        assert_eq!(store.lease_count().await.unwrap(), 0);
        assert_eq!(
            (count("update"), count("get"), count("lease_count")),
            (before.0 + 1, before.1 + 1, before.2 + 1)
        );
        assert_eq!(store.kind(), "memory");
    }
}
