//! Acting on what `policies::cascade` decides when a tracked stream ends.
//!
//! The proxy hooks only collect facts; this module waits (grace), reads the
//! store, and hands owed cancels to the [`Canceller`]. It runs in spawned
//! tasks so that no request waits on it.

use std::sync::Arc;

use policies::cascade::{decide, CancelCause, CascadePolicy, Decision, Event, Keep, Seen};

use crate::cancel::{CancelJob, Canceller, Probed};
use crate::metrics;
use crate::store::{Asker, CancelTarget, TaskKey, TaskStore, TaskUpdate};
use crate::tracker::Tracker;

/// Everything known about a tracked stream when it ended.
#[derive(Debug)]
pub struct StreamEnd {
    pub route: Arc<str>,
    pub policy: CascadePolicy,
    pub worker: config::WorkerUrl,
    pub target: CancelTarget,
    pub tenant: Option<String>,
    pub task_id: Option<Arc<str>>,
    /// The sent message's id, for a send that started a new task: the task
    /// is looked for by it when no event named it ([`Cascade::find_child`]).
    pub message_id: Option<String>,
    /// When the request arrived (Unix ms): the search by message looks at
    /// tasks whose status changed since (less a clock allowance).
    pub sent_ms: u64,
    pub seen: Seen,
    pub event: Event,
    /// This stream counted as a watcher in the store and must uncount.
    pub was_watching: bool,
    /// This stream held a lease the route imposed (not one the caller granted).
    pub imposed_lease: bool,
    /// What the cancel carries besides the gateway's own headers
    /// ([`crate::cancel::cancel_headers`]); in memory only.
    pub cancel_headers: Vec<(String, String)>,
    /// Who the stream's caller is: another identity than the task's owner
    /// moves none of its state, and its leaving cascades nothing.
    pub asker: Asker,
}

/// The call a cancel (or its probe) makes for a stream's task.
fn job(
    end: &StreamEnd,
    key: TaskKey,
    cause: CancelCause,
    headers: Vec<(String, String)>,
) -> CancelJob {
    CancelJob {
        key,
        worker: end.worker.clone(),
        target: end.target.clone(),
        headers,
        cause: cause.as_str(),
        message_id: end.message_id.clone(),
    }
}

/// Runs cascade decisions and sends the cancels they owe.
#[derive(Debug)]
pub struct Cascade {
    store: Arc<dyn TaskStore>,
    tracker: Tracker,
    canceller: Canceller,
    /// Delegation trees: references given and children linked (the
    /// proxy's `inject`), parents' ends followed (`observe`, `end`).
    tree: crate::tree::Tree,
}

impl Cascade {
    pub fn new(
        store: Arc<dyn TaskStore>,
        tracker: Tracker,
        canceller: Canceller,
        tree: crate::tree::Tree,
    ) -> Self {
        Cascade {
            store,
            tracker,
            canceller,
            tree,
        }
    }

    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// The gateway's connections to workers, for the proxy's carrier.
    pub fn worker_client(&self) -> Arc<crate::worker_client::WorkerClient> {
        self.canceller.client()
    }

    pub fn tree(&self) -> &crate::tree::Tree {
        &self.tree
    }

    /// Whether the route's worker may be searched for a child by its
    /// message ([`Canceller::searchable`]).
    pub fn searchable(&self, route: &str) -> bool {
        self.canceller.searchable(route)
    }

    /// Decides and acts on a stream's end; returns once nothing more is owed.
    pub async fn stream_ended(&self, mut end: StreamEnd) {
        let mut key = end
            .task_id
            .as_ref()
            .map(|id| TaskKey::new(&end.route, end.tenant.as_deref(), id.clone()));
        let mut watchers = 0;
        let mut recorded = None;
        if let Some(key) = &key {
            // Apply what this stream queued for the task, then uncount it
            // and read the record back in the same store call (one round
            // trip).
            self.tracker.flush_key(key).await;
            let rec = if end.was_watching {
                let update = TaskUpdate {
                    watchers_delta: -1,
                    asker: end.asker.clone(),
                    ..TaskUpdate::default()
                };
                self.store
                    .update(key, update, self.store.clock_ms())
                    .await
                    .map(Some)
            } else {
                self.store.get(key).await
            };
            if let Ok(Some(r)) = &rec {
                if !end.asker.moves(&key.tenant, Some(r)) {
                    // Someone else's child: passed to the worker, but this
                    // caller leaving cancels nothing (policies::owner).
                    metrics::CASCADE_DECISIONS
                        .with_label_values(&[&end.route, "keep_not_owner"])
                        .inc();
                    tracing::debug!(route = %end.route, task = %key, "stream of another caller than the task's owner ended; nothing to cancel");
                    return;
                }
                // Cancelled in the tenant the task was recorded in.
                recorded = Some(r.key.clone());
            }
            watchers = self.merge(key, rec, &mut end.seen);
        }
        if recorded.is_some() {
            key = recorded;
        }
        let mut event = end.event;
        let mut decision = decide(&end.policy, &end.seen, event, watchers);
        loop {
            let label = match decision {
                Decision::Keep(Keep::Settled) => "keep_settled",
                Decision::Keep(Keep::Detached) => "keep_detached",
                Decision::Keep(Keep::Watched) => "keep_watched",
                Decision::Cancel(_) => "cancel",
                Decision::Probe(_) => "probe",
                Decision::AwaitId(_) => "await_id",
                Decision::AwaitGrace(_) => "await_grace",
                Decision::Unreachable => "unreachable",
            };
            metrics::CASCADE_DECISIONS
                .with_label_values(&[&end.route, label])
                .inc();
            match decision {
                Decision::Keep(keep) => {
                    if keep == Keep::Detached && end.imposed_lease {
                        // A detached child is the caller's to manage: a lease
                        // the gateway imposed must not stop it (a lease the
                        // caller granted still does).
                        if let Some(key) = &key {
                            self.end_lease(key).await;
                        }
                    }
                    tracing::debug!(route = %end.route, task = ?end.task_id, decision = label, "stream ended; nothing to cancel");
                    return;
                }
                Decision::Probe(cause) => {
                    let Some(key) = &key else { return };
                    let job = job(&end, key.clone(), cause, end.cancel_headers.clone());
                    // Boxed, as the cancel below: inline, the two sized
                    // this future (13 KiB), which every ended stream spawns.
                    match Box::pin(self.canceller.task_state(&job)).await {
                        Probed::State(s) => {
                            end.seen.state = Some(s);
                            end.seen.unsure = false;
                            if s.is_settled() {
                                // Recorded (it ends the task's lease too),
                                // so that the reaper does not cancel what
                                // the worker handed back.
                                let update = TaskUpdate {
                                    state: Some(s),
                                    ..TaskUpdate::default()
                                };
                                if let Err(e) =
                                    self.store.update(key, update, self.store.clock_ms()).await
                                {
                                    metrics::STORE_ERRORS.with_label_values(&["update"]).inc();
                                    tracing::warn!(task = %key, error = %e, "could not record the state a GetTask found");
                                }
                            }
                        }
                        Probed::NotFound | Probed::Unknown => {}
                    }
                    end.seen.probed = true;
                    decision = decide(&end.policy, &end.seen, event, watchers);
                }
                Decision::Cancel(cause) => {
                    let Some(key) = key else { return };
                    let headers = std::mem::take(&mut end.cancel_headers);
                    let job = job(&end, key, cause, headers);
                    // Written to the outbox before the first attempt, so
                    // that another replica sends it if this one dies first.
                    let Some(token) = self.owe(&job).await else {
                        return;
                    };
                    Box::pin(self.canceller.deliver(&*self.store, &job, token.as_deref())).await;
                    return;
                }
                Decision::AwaitGrace(d) => {
                    // A drain about to run out ends the grace early: the
                    // decision is taken while the process can still act on it.
                    tokio::select! {
                        () = tokio::time::sleep(d) => {}
                        () = crate::drain::graces_cut() => {}
                    }
                    watchers = match &key {
                        Some(k) => self.refresh(k, &mut end.seen).await,
                        None => 0,
                    };
                    event = Event::GraceElapsed;
                    decision = decide(&end.policy, &end.seen, event, watchers);
                }
                Decision::AwaitId(wait) => {
                    // The worker's stream is gone with the caller's
                    // connection, so no event can name the task any more: it
                    // is looked for by its message, for as long as the id
                    // wait allows.
                    if let Some(id) = self.find_child(&end, wait).await {
                        let found = TaskKey::new(&end.route, end.tenant.as_deref(), id.clone());
                        // Found by a message id the caller chose: a task
                        // the store knows as another's (owner or tenant)
                        // is not this caller's to cancel.
                        if let Ok(Some(r)) = self.store.get(&found).await {
                            if !end.asker.moves(&found.tenant, Some(&r)) {
                                metrics::CASCADE_DECISIONS
                                    .with_label_values(&[&end.route, "keep_not_owner"])
                                    .inc();
                                return;
                            }
                        }
                        key = Some(found);
                        end.task_id = Some(id);
                        end.seen.id_known = true;
                        decision = decide(&end.policy, &end.seen, event, 0);
                        continue;
                    }
                    event = Event::IdWaitElapsed;
                    decision = decide(&end.policy, &end.seen, event, 0);
                }
                Decision::Unreachable => {
                    metrics::UNREACHABLE.with_label_values(&[&end.route]).inc();
                    tracing::warn!(route = %end.route, "the caller left before any event named its task; a child may be running that the gateway cannot cancel");
                    return;
                }
            }
        }
    }

    /// Finds the task a send started whose caller left before any event
    /// named it: the worker's `ListTasks` (the binding, tenant and headers a
    /// cancel would use), the task whose history holds the sent message,
    /// asked every 100 ms for at most `wait` (the route's `id_wait`): the
    /// worker may not have created it yet. Counted by outcome.
    async fn find_child(&self, end: &StreamEnd, wait: std::time::Duration) -> Option<Arc<str>> {
        let message_id = end.message_id.as_deref()?;
        let (found, asked) = self
            .canceller
            .wait_for_message(
                &end.worker,
                &end.target,
                &end.route,
                end.tenant.as_deref(),
                &end.cancel_headers,
                message_id,
                end.sent_ms,
                wait,
            )
            .await;
        let found = found.unwrap_or_else(|e| {
            tracing::warn!(route = %end.route, error = %e, "the worker does not serve ListTasks: the child of a caller that left cannot be found");
            None
        });
        let outcome = if found.is_some() {
            "found"
        } else {
            "not_found"
        };
        metrics::CHILDREN_LOOKED_UP
            .with_label_values(&[&end.route, outcome])
            .inc();
        match &found {
            Some(id) => {
                tracing::info!(route = %end.route, task = %id, asked, "the caller left before any event named its task; found it by its message");
            }
            None => {
                tracing::debug!(route = %end.route, asked, "no task holds the sent message");
            }
        }
        found.map(Arc::from)
    }

    /// Writes the job's cancel to the store's outbox (one round trip):
    /// `Some(Some(token))` to send it as its holder; `Some(None)` to send it
    /// without one (the store did not answer: the cancel is not held back
    /// for it, and a failure leaves the task's lease to the reaper);
    /// `None` when nothing is to be sent (another replica, or a lapse
    /// claim, carries it already; or the store knows the task settled).
    async fn owe(&self, job: &CancelJob) -> Option<Option<String>> {
        crate::cancel::owe(&*self.store, job).await
    }

    async fn end_lease(&self, key: &TaskKey) {
        if let Err(e) = self.store.lease_end(key).await {
            metrics::STORE_ERRORS
                .with_label_values(&["lease_end"])
                .inc();
            tracing::warn!(task = %key, error = %e, "could not end a lease");
        }
    }

    /// Applies queued updates, then reads the task back: other streams may
    /// have seen it settle, and others may be watching it.
    async fn refresh(&self, key: &TaskKey, seen: &mut Seen) -> u32 {
        self.tracker.flush_key(key).await;
        let rec = self.store.get(key).await;
        self.merge(key, rec, seen)
    }

    /// Folds a record read from the store into what this stream saw; returns
    /// the watchers the store counts.
    fn merge(
        &self,
        key: &TaskKey,
        rec: Result<Option<crate::store::TaskRecord>, crate::store::StoreError>,
        seen: &mut Seen,
    ) -> u32 {
        match rec {
            Ok(Some(rec)) => {
                policies::cascade::merge_record(seen, rec.state);
                rec.watchers
            }
            Ok(None) => 0,
            Err(e) => {
                metrics::STORE_ERRORS.with_label_values(&["get"]).inc();
                tracing::warn!(task = %key, error = %e, "store unreadable; deciding on what this stream saw");
                0
            }
        }
    }
}
