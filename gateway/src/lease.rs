//! Leases the gateway enforces for workers without a lease store.
//!
//! Two background duties, run by every replica on one tick:
//! - **Reaper**: claims lapsed leases from the store's deadline index (an
//!   atomic claim, so exactly one replica acts on each) and sends
//!   `CancelTask` with the route's worker credential; a poll lease's task
//!   is asked for first (`GetTask`), and left alone if it settled between
//!   polls ([`lease::at_lapse`]). A lease whose cancel
//!   failed every attempt is handed back to be claimed again later, one whose
//!   route this replica lacks at once; either only by replicas that have its
//!   route (never revived: renewals still fail).
//! - **Outbox**: claims the owed cancels (the cascade writes one before its
//!   first attempt) whose holder's replica is gone, or that were handed back
//!   after every attempt failed, of the routes this replica has, and sends
//!   them with the same retries and backoff (see
//!   [`crate::cancel::Canceller::deliver`]): with the route's configured
//!   headers only, the caller's are not stored.
//! - **Renewer**: renews the gateway-held leases of callers connected to this
//!   replica, every third of their TTL, in one store call per tick. When this
//!   replica dies the renewals stop and another replica's reaper cancels.
//!
//! Routes are looked up by name in the running config; after a reload, a
//! route it removed is still found (with its last config) for its leases
//! and owed cancels, and claimed for ([`crate::route::LiveRoutes`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use policies::lease::{self, AtLapse};

use crate::cancel::{CancelJob, Canceller, Probed};
use crate::metrics;
use crate::route::LiveRoutes;
use crate::store::{Asker, StoreHealth, TaskKey, TaskStore, TaskUpdate};

/// How many lapsed leases one tick claims at most (the rest wait a tick).
pub const CLAIM_BATCH: usize = 1000;

/// How much longer than its cancel can take ([`Canceller::longest`]) a
/// claimed lapse is held before it is claimed again: its claimer neither
/// ended it nor handed it back, so it died mid-cancel. Room for the claim's
/// own answer and the `lease_end` after the cancel, each up to the Redis
/// call timeout (2 s), and a tick.
pub const CLAIM_HOLD_MARGIN: Duration = Duration::from_secs(5);

/// Gateway-held leases of this replica: when each is next due for renewal,
/// and how many of this replica's streams hold it (a stream and a
/// resubscribe to the same task, say): renewals go on until the last one
/// ends, or the task would be reaped under a caller still watching it.
#[derive(Debug, Default)]
struct Held {
    leases: HashMap<TaskKey, HeldLease>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HeldLease {
    ttl_ms: u64,
    /// Next renewal due, unix ms.
    due: u64,
    holders: u32,
    /// Who each holder is; only holders who may move the task's state
    /// ([`policies::owner`]) keep it renewed. All `Unverified` on routes
    /// without `[routes.auth]`.
    askers: Vec<Asker>,
    /// The task's record as its first sight wrote it (its cancel target,
    /// owner, message): written again if the store loses the task.
    record: Option<TaskUpdate>,
}

impl Held {
    fn hold(
        &mut self,
        key: TaskKey,
        ttl_ms: u64,
        now: u64,
        asker: Asker,
        record: Option<TaskUpdate>,
    ) {
        let due = now + lease::renew_every_ms(ttl_ms);
        let h = self.leases.entry(key).or_insert(HeldLease {
            ttl_ms,
            due,
            holders: 0,
            askers: Vec::new(),
            record: None,
        });
        if h.record.is_none() {
            h.record = record;
        }
        h.holders = h.holders.saturating_add(1);
        h.askers.push(asker);
        // The shorter TTL's renewals keep both holders' leases alive.
        if ttl_ms < h.ttl_ms {
            h.ttl_ms = ttl_ms;
            h.due = h.due.min(due);
        }
    }

    fn release(&mut self, key: &TaskKey, asker: &Asker) {
        if let Some(h) = self.leases.get_mut(key) {
            h.holders = h.holders.saturating_sub(1);
            if let Some(i) = h.askers.iter().position(|a| a == asker) {
                h.askers.swap_remove(i);
            }
            if h.holders == 0 {
                self.leases.remove(key);
            }
        }
    }

    /// The keys due for renewal at `now`, each moved to its next due time,
    /// with the holders that must be the task's owner to renew it (empty:
    /// a holder on a route without auth, which always renews).
    /// A held lease's TTL, its record, and how many hold it here.
    fn lost_view(&self, key: &TaskKey) -> Option<(u64, Option<TaskUpdate>, u32)> {
        self.leases
            .get(key)
            .map(|h| (h.ttl_ms, h.record.clone(), h.holders))
    }

    fn take_due(&mut self, now: u64) -> Vec<(TaskKey, Vec<Asker>)> {
        self.leases
            .iter_mut()
            .filter(|(_, h)| h.due <= now)
            .map(|(k, h)| {
                h.due = now + lease::renew_every_ms(h.ttl_ms);
                let checked = if h.askers.contains(&Asker::Unverified) {
                    Vec::new()
                } else {
                    h.askers.clone()
                };
                (k.clone(), checked)
            })
            .collect()
    }
}

/// The lease duties of one replica.
#[derive(Debug)]
pub struct Leases {
    store: Arc<dyn TaskStore>,
    canceller: Canceller,
    /// The routes as configured now, and those a reload removed (their
    /// leases and owed cancels are still sent with their last config):
    /// lapsed leases and owed cancels are claimed only for these names.
    routes: Arc<LiveRoutes>,
    replica_id: String,
    tick: Duration,
    held: Mutex<Held>,
    health: Arc<StoreHealth>,
}

impl Leases {
    pub fn new(
        store: Arc<dyn TaskStore>,
        canceller: Canceller,
        routes: Arc<LiveRoutes>,
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

    /// Starts renewing `key` for a caller connected here (one more holder
    /// if another of this replica's streams holds it already).
    /// `asker`: the stream's caller; on a route with `[routes.auth]` only
    /// the task's owner's streams keep it renewed.
    /// `record`: the task's record as first written (for a store that
    /// loses it).
    pub fn hold(&self, key: TaskKey, ttl_ms: u64, asker: Asker, record: Option<TaskUpdate>) {
        self.held()
            .hold(key, ttl_ms, self.store.clock_ms(), asker, record);
    }

    /// One holder of `key` is gone (its caller's connection ended); renewals
    /// stop with the last.
    pub fn release(&self, key: &TaskKey, asker: &Asker) {
        self.held().release(key, asker);
    }

    /// Renews the held leases that are due, in one store call (and, for
    /// leases held only by verified callers, one read of each record to
    /// find its owner).
    pub async fn renew_due(&self, now: u64) {
        let taken = self.held().take_due(now);
        let mut due = Vec::new();
        // Who holds each due lease, for one the store lost (below).
        let mut askers = Vec::new();
        for (key, checked) in taken {
            if checked.is_empty() {
                due.push(key);
                askers.push(Asker::Unverified);
                continue;
            }
            // Renewed if any holder is the owner; a store error renews
            // (as an unreadable store counts as a live parent).
            let rec = self.store.get(&key).await.ok();
            if rec
                .as_ref()
                .is_none_or(|r| checked.iter().any(|a| a.moves(&key.tenant, r.as_ref())))
            {
                due.push(key);
                askers.push(checked.into_iter().next().unwrap_or(Asker::Unverified));
            } else {
                metrics::LEASE_RENEWALS
                    .with_label_values(&[&key.route, "held", "not_owner"])
                    .inc();
            }
        }
        if due.is_empty() {
            return;
        }
        match self.store.lease_renew_many(&due, now).await {
            Ok(r) => {
                if let Some(k) = due.first() {
                    metrics::LEASE_RENEWALS
                        .with_label_values(&[&k.route, "held", "renewed"])
                        .inc_by(r.renewed as u64);
                }
                for i in r.lost {
                    self.restart_lost(&due[i], &askers[i], now).await;
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

    /// A lease this replica holds for a live caller whose task the store
    /// no longer has at all: the store lost it (a Sentinel failover that
    /// lost the last writes, a Redis restart without persistence, an
    /// eviction). Started again, as its caller's stream would have, so that
    /// a lapse still cancels the child if this replica dies; a lease that
    /// lapsed or was claimed keeps its record and is never revived.
    async fn restart_lost(&self, key: &TaskKey, asker: &Asker, now: u64) {
        let Some((ttl, record, holders)) = self.held().lost_view(key) else {
            return; // released meanwhile
        };
        // The record first, as its first sight wrote it (its cancel target
        // above all: a lapse without one cancels nothing), watched by the
        // callers holding it here.
        let rewritten = match record {
            Some(u) => self
                .store
                .update(
                    key,
                    TaskUpdate {
                        watchers_delta: i32::try_from(holders).unwrap_or(i32::MAX),
                        ..u
                    },
                    now,
                )
                .await
                .map(drop),
            None => Ok(()),
        };
        let started = match rewritten {
            Ok(()) => {
                self.store
                    .lease_start(key, ttl, Some(&self.replica_id), now, asker)
                    .await
            }
            Err(e) => Err(e),
        };
        match started {
            Ok(()) => {
                metrics::LEASE_RENEWALS
                    .with_label_values(&[&key.route, "held", "restarted"])
                    .inc();
                tracing::warn!(task = %key, "a held lease the store had lost was started again");
            }
            Err(e) => {
                metrics::STORE_ERRORS
                    .with_label_values(&["lease_start"])
                    .inc();
                tracing::warn!(task = %key, error = %e, "a held lease the store had lost could not be started again");
            }
        }
    }

    /// Claims lapsed leases and cancels their tasks; returns how many.
    pub async fn reap(&self, now: u64) -> usize {
        let hold = now + (self.canceller.longest() + CLAIM_HOLD_MARGIN).as_millis() as u64;
        let claimed = self
            .store
            .lease_claim_lapsed(now, CLAIM_BATCH, hold, &self.routes.claim_names())
            .await;
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
            let holder = rec.lease.as_ref().and_then(|l| l.holder.as_deref());
            let at = lease::at_lapse(rec.state, holder);
            if at == AtLapse::End {
                self.end(&rec.key).await;
                continue;
            }
            let Some(route) = self.routes.by_name(&rec.key.route) else {
                tracing::debug!(task = %rec.key, "a lapsed lease names a route this replica does not have; handed back for a replica that has it");
                self.retry(&rec.key, now).await;
                continue;
            };
            let Some(target) = rec.target.clone() else {
                tracing::warn!(task = %rec.key, "a lapsed lease has no cancel target; not cancelled");
                self.end(&rec.key).await;
                continue;
            };
            let Some(worker) = route.worker_for(rec.replica.as_deref()).await else {
                crate::replicas::lost(&rec.key, rec.replica.as_deref());
                self.end(&rec.key).await;
                continue;
            };
            let job = CancelJob {
                key: rec.key.clone(),
                worker,
                target,
                headers: crate::cancel::cancel_headers(&route.cfg, &[]),
                cause: "lease_lapsed",
                message_id: rec.message_id.clone(),
            };
            let (canceller, store) = (self.canceller.clone(), self.store.clone());
            crate::drain::spawn_work(async move {
                if at == AtLapse::Probe && !probe_says_cancel(&canceller, &*store, &job, hold).await
                {
                    return;
                }
                metrics::LEASES_LAPSED
                    .with_label_values(&[&job.key.route])
                    .inc();
                tracing::info!(task = %job.key, "lease lapsed; cancelling the task");
                // Done: the lease ends (else its claim's hold would bring it
                // back). Every attempt failed (the worker down, say): it goes
                // back to be claimed and cancelled again, by any replica.
                let outcome = canceller.cancel(&job).await;
                if outcome.is_done() {
                    crate::cancel::record_canceled(&*store, &job.key, outcome).await;
                    if let Err(e) = store.lease_end(&job.key).await {
                        metrics::STORE_ERRORS
                            .with_label_values(&["lease_end"])
                            .inc();
                        tracing::warn!(task = %job.key, error = %e, "could not end a lapsed lease after its cancel; it is claimed again after its hold");
                    }
                } else {
                    let at =
                        store.clock_ms() + crate::cancel::RETRY_FAILED_CANCEL.as_millis() as u64;
                    if let Err(e) = store.lease_retry(&job.key, at).await {
                        tracing::warn!(task = %job.key, error = %e, "could not hand back a lapsed lease whose cancel failed");
                    }
                }
            });
        }
        n
    }

    async fn end(&self, key: &TaskKey) {
        if let Err(e) = self.store.lease_end(key).await {
            metrics::STORE_ERRORS
                .with_label_values(&["lease_end"])
                .inc();
            tracing::warn!(task = %key, error = %e, "could not end a lapsed lease");
        }
    }

    /// Claims owed cancels whose holder is gone (or handed back and due)
    /// and delivers each; returns how many were claimed. One store call.
    pub async fn claim_owed(&self, now: u64) -> usize {
        let claimed = match self
            .store
            .outbox_claim(now, CLAIM_BATCH, &self.routes.claim_names())
            .await
        {
            Ok(c) => c,
            Err(e) => {
                metrics::STORE_ERRORS
                    .with_label_values(&["outbox_claim"])
                    .inc();
                tracing::warn!(error = %e, "could not look for owed cancels");
                return 0;
            }
        };
        let n = claimed.len();
        for owed in claimed {
            let Some(route) = self.routes.by_name(&owed.key.route) else {
                // Claims are by route: not reached unless the config changed
                // under the claim. Handed back for a replica with the route.
                let at = self.store.clock_ms();
                let _ = self.store.outbox_retry(&owed.key, &owed.token, at).await;
                continue;
            };
            metrics::OUTBOX_CLAIMS
                .with_label_values(&[&route.name])
                .inc();
            tracing::info!(task = %owed.key, cause = %owed.cause, "claimed an owed cancel (its replica is gone, or its last try failed); sending it");
            // The worker (replica) the task runs on, as its record says.
            let (worker, message_id) = match self.store.get(&owed.key).await {
                Ok(rec) => {
                    let (replica, message_id) =
                        rec.map_or((None, None), |r| (r.replica, r.message_id));
                    (route.worker_for(replica.as_deref()).await, message_id)
                }
                Err(_) => {
                    // Looked for again at its next claim.
                    let at = self.store.clock_ms();
                    let _ = self.store.outbox_retry(&owed.key, &owed.token, at).await;
                    continue;
                }
            };
            let Some(worker) = worker else {
                crate::replicas::lost(&owed.key, None);
                let _ = self.store.outbox_done(&owed.key).await;
                continue;
            };
            let job = CancelJob {
                key: owed.key,
                worker,
                target: owed.target,
                // Only what the config gives: the caller's headers were never
                // stored.
                headers: crate::cancel::cancel_headers(&route.cfg, &[]),
                cause: crate::cancel::cause_label(&owed.cause),
                message_id,
            };
            let (canceller, store) = (self.canceller.clone(), self.store.clone());
            crate::drain::spawn_work(async move {
                canceller.deliver(&*store, &job, Some(&owed.token)).await;
            });
        }
        n
    }

    /// Makes a claimed lapse claimable again at `at` (store clock, ms).
    async fn retry(&self, key: &TaskKey, at: u64) {
        if let Err(e) = self.store.lease_retry(key, at).await {
            metrics::STORE_ERRORS
                .with_label_values(&["lease_retry"])
                .inc();
            tracing::warn!(task = %key, error = %e, "could not hand back a lapsed lease");
        }
    }
}

#[async_trait]
impl BackgroundService for Leases {
    /// Renews and reaps every tick; beside it, on its own clock (a slow
    /// renewal must not delay it), tells the store the replica is alive
    /// every [`crate::store::HEARTBEAT_EVERY`]. Each tick also claims owed
    /// cancels ([`Leases::claim_owed`]). In a graceful shutdown it keeps
    /// renewing the leases of streams still open (they drain for up to
    /// `timeouts.drain`) and its heartbeat, but claims no more lapses or
    /// owed cancels: a cancel it started could be cut with the process, and
    /// other replicas claim them.
    async fn start(&self, shutdown: ShutdownWatch) {
        let store = self.store.clone();
        tokio::spawn(async move {
            let mut beat = tokio::time::interval(crate::store::HEARTBEAT_EVERY);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                beat.tick().await;
                if let Err(e) = store.replica_alive().await {
                    metrics::STORE_ERRORS
                        .with_label_values(&["replica_alive"])
                        .inc();
                    tracing::debug!(error = %e, "could not send the replica's heartbeat");
                }
            }
        });
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = self.store.clock_ms();
            self.renew_due(now).await;
            if *shutdown.borrow() {
                continue;
            }
            // Drain a backlog of lapses without waiting a tick per batch.
            while self.reap(self.store.clock_ms()).await == CLAIM_BATCH {}
            while self.claim_owed(self.store.clock_ms()).await == CLAIM_BATCH {}
        }
    }
}

/// The longest the probe of a lapsed poll lease's task (`GetTask`, see
/// [`lease::AtLapse::Probe`]) is waited for (the route's cancel timeout,
/// if shorter); its claim is held this much longer than other lapses'.
pub const POLL_PROBE_WAIT: Duration = Duration::from_secs(5);

/// Asks the worker for the state of a task whose poll lease lapsed
/// (claimed, held until `hold`): whether to cancel it. A task that settled
/// between polls, unseen (done, or handed back for input), is left alone:
/// its state is recorded and its lease ended. The claim is held
/// [`POLL_PROBE_WAIT`] longer first, so that no other replica claims it
/// again while this one probes and cancels.
async fn probe_says_cancel(
    canceller: &Canceller,
    store: &dyn TaskStore,
    job: &CancelJob,
    hold: u64,
) -> bool {
    let wait = POLL_PROBE_WAIT.as_millis() as u64;
    if let Err(e) = store.lease_retry(&job.key, hold + wait).await {
        metrics::STORE_ERRORS
            .with_label_values(&["lease_retry"])
            .inc();
        tracing::warn!(task = %job.key, error = %e, "could not extend the claim of a lapsed poll lease for its probe");
    }
    let probed = tokio::time::timeout(POLL_PROBE_WAIT, canceller.task_state(job))
        .await
        .unwrap_or(Probed::Unknown);
    let (found, state) = match probed {
        Probed::State(s) => (true, Some(s)),
        Probed::NotFound => (false, None),
        Probed::Unknown => (true, None),
    };
    if lease::cancel_after_probe(found, state) {
        return true;
    }
    tracing::info!(task = %job.key, state = ?state.map(|s| s.as_wire()), "poll lease lapsed on a task that settled, or that the worker does not know; not cancelled");
    if let Some(s) = state {
        let update = TaskUpdate {
            state: Some(s),
            ..TaskUpdate::default()
        };
        if let Err(e) = store.update(&job.key, update, store.clock_ms()).await {
            metrics::STORE_ERRORS.with_label_values(&["update"]).inc();
            tracing::warn!(task = %job.key, error = %e, "could not record the state a lapsed poll lease's probe found");
        }
    }
    if let Err(e) = store.lease_end(&job.key).await {
        metrics::STORE_ERRORS
            .with_label_values(&["lease_end"])
            .inc();
        tracing::warn!(task = %job.key, error = %e, "could not end a lapsed poll lease; it is claimed again after its hold");
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> TaskKey {
        TaskKey::new(&Arc::from("r"), None, id)
    }

    /// Holders of one task on one replica: renewals go on until the last
    /// releases it; the shortest TTL sets the pace.
    #[test]
    fn held_until_the_last_holder_releases() {
        let mut held = Held::default();
        let u = Asker::Unverified;
        held.hold(key("t"), 30_000, 0, u.clone(), None);
        held.hold(key("t"), 30_000, 5_000, u.clone(), None);
        held.release(&key("t"), &u);
        assert_eq!(
            held.take_due(10_000),
            vec![(key("t"), vec![])],
            "still held by the second"
        );
        held.release(&key("t"), &u);
        assert!(held.leases.is_empty());
        assert!(held.take_due(1_000_000).is_empty());
        // A stray release (a stream that held nothing) changes nothing.
        held.release(&key("t"), &u);
        assert!(held.leases.is_empty());

        held.hold(key("u"), 30_000, 0, u.clone(), None);
        held.hold(key("u"), 3_000, 0, u.clone(), None);
        let h = held.leases[&key("u")].clone();
        assert_eq!((h.ttl_ms, h.holders), (3_000, 2));
        assert_eq!(h.due, lease::renew_every_ms(3_000));
        assert_eq!(held.take_due(h.due), vec![(key("u"), vec![])]);
        assert_eq!(held.leases[&key("u")].due, 2 * lease::renew_every_ms(3_000));

        // Verified holders are named, to be checked against the owner.
        let a = Asker::Identity("key:a".into());
        let b = Asker::Identity("key:b".into());
        held.hold(key("v"), 30_000, 0, a.clone(), None);
        held.hold(key("v"), 30_000, 0, b.clone(), None);
        held.release(&key("v"), &a);
        let due: Vec<_> = held
            .take_due(1_000_000)
            .into_iter()
            .filter(|(k, _)| *k == key("v"))
            .collect();
        assert_eq!(due, vec![(key("v"), vec![b])]);
    }
}
