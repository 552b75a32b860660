//! Leases the gateway enforces for workers without a lease store.
//!
//! Two background duties, run by every replica on one tick:
//! - **Reaper**: claims lapsed leases from the store's deadline index (an
//!   atomic claim, so exactly one replica acts on each) and sends
//!   `CancelTask` with the route's worker credential.
//! - **Renewer**: renews the gateway-held leases of callers connected to this
//!   replica, every third of their TTL, in one store call per tick. When this
//!   replica dies the renewals stop and another replica's reaper cancels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use policies::lease;

use crate::cancel::{CancelJob, Canceller};
use crate::metrics;
use crate::proxy::route::Routes;
use crate::store::{now_ms, StoreHealth, TaskKey, TaskStore};

/// How many lapsed leases one tick claims at most (the rest wait a tick).
pub const CLAIM_BATCH: usize = 1000;

/// Gateway-held leases of this replica: when each is next due for renewal.
#[derive(Debug, Default)]
struct Held {
    /// key → (ttl, next renewal due, unix ms)
    leases: HashMap<TaskKey, (u64, u64)>,
}

/// The lease duties of one replica.
#[derive(Debug)]
pub struct Leases {
    store: Arc<dyn TaskStore>,
    canceller: Canceller,
    routes: Arc<Routes>,
    replica_id: String,
    tick: Duration,
    held: Mutex<Held>,
    health: Arc<StoreHealth>,
}

impl Leases {
    pub fn new(
        store: Arc<dyn TaskStore>,
        canceller: Canceller,
        routes: Arc<Routes>,
        replica_id: String,
        tick: Duration,
        health: Arc<StoreHealth>,
    ) -> Self {
        Leases {
            store,
            canceller,
            routes,
            replica_id,
            tick,
            held: Mutex::new(Held::default()),
            health,
        }
    }

    /// This replica's name as a lease holder.
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts renewing `key` for a caller connected here.
    pub fn hold(&self, key: TaskKey, ttl_ms: u64) {
        let due = now_ms() + lease::renew_every_ms(ttl_ms);
        self.held().leases.insert(key, (ttl_ms, due));
    }

    /// Stops renewing `key` (its caller's connection ended).
    pub fn release(&self, key: &TaskKey) {
        self.held().leases.remove(key);
    }

    /// Renews the held leases that are due, in one store call.
    pub async fn renew_due(&self, now: u64) {
        let due: Vec<TaskKey> = {
            let mut held = self.held();
            held.leases
                .iter_mut()
                .filter(|(_, (_, next))| *next <= now)
                .map(|(k, (ttl, next))| {
                    *next = now + lease::renew_every_ms(*ttl);
                    k.clone()
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        match self.store.lease_renew_many(&due, now).await {
            Ok(n) => {
                if let Some(k) = due.first() {
                    metrics::LEASE_RENEWALS
                        .with_label_values(&[&k.route, "held", "renewed"])
                        .inc_by(n as u64);
                }
            }
            Err(e) => {
                metrics::STORE_ERRORS
                    .with_label_values(&["lease_renew_many"])
                    .inc();
                tracing::warn!(error = %e, leases = due.len(), "could not renew held leases");
            }
        }
    }

    /// Claims lapsed leases and cancels their tasks; returns how many.
    pub async fn reap(&self, now: u64) -> usize {
        let claimed = self.store.lease_claim_lapsed(now, CLAIM_BATCH).await;
        self.health.record(&claimed);
        let lapsed = match claimed {
            Ok(l) => l,
            Err(e) => {
                metrics::STORE_ERRORS
                    .with_label_values(&["lease_claim_lapsed"])
                    .inc();
                tracing::warn!(error = %e, "could not look for lapsed leases");
                return 0;
            }
        };
        let n = lapsed.len();
        for rec in lapsed {
            if rec.state.is_some_and(|s| s.is_settled()) {
                continue;
            }
            let Some(route) = self.routes.by_name(&rec.key.route) else {
                tracing::warn!(task = %rec.key, "a lapsed lease names a route this replica does not have; not cancelled");
                continue;
            };
            let Some(target) = rec.target.clone() else {
                tracing::warn!(task = %rec.key, "a lapsed lease has no cancel target; not cancelled");
                continue;
            };
            metrics::LEASES_LAPSED
                .with_label_values(&[&rec.key.route])
                .inc();
            tracing::info!(task = %rec.key, "lease lapsed; cancelling the task");
            let job = CancelJob {
                key: rec.key.clone(),
                worker: route.cfg.worker.clone(),
                target,
                headers: crate::cancel::cancel_headers(&route.cfg, &[]),
                cause: "lease_lapsed",
            };
            let canceller = self.canceller.clone();
            tokio::spawn(async move {
                canceller.cancel(&job).await;
            });
        }
        n
    }
}

#[async_trait]
impl BackgroundService for Leases {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let now = now_ms();
            self.renew_due(now).await;
            // Drain a backlog of lapses without waiting a tick per batch.
            while self.reap(now_ms()).await == CLAIM_BATCH {}
        }
    }
}

/// A default replica id: host name, process id, start time.
pub fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "gateway".to_string());
    format!("{host}-{}-{}", std::process::id(), now_ms())
}
