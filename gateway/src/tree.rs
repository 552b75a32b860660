//! Delegation trees: when the gateway learns that a task ended (cancelled,
//! failed, or completed on a route that cancels what completed parents left
//! running), the children linked under the task's references
//! ([`crate::link`]) that have not settled are cancelled, each through the
//! outbox on the replica and tenant where it runs, then theirs, depth by
//! depth.
//!
//! A parent's end is learned from: every cancel of the gateway's that the
//! worker accepted (a caller that left, a lease lapse, a budget stop, an
//! admin cancel, a claimed owed cancel: [`crate::cancel::Canceller`] tells
//! the tree), a `CancelTask` a caller sent through the gateway that the
//! worker answered 2xx, and a settled state read on a tracked answer.
//!
//! A child is found by its sent message in its worker's `ListTasks` (as a
//! guarded blocking send's child), its state asked (`GetTask`) unless the
//! store knows it: one settled or handed back (input-required,
//! auth-required) is left alone ([`policies::delegation::child_action`]).
//! A parent whose first message the trigger did not carry has its history
//! read (`GetTask`) to recompute the references its sends were given.

use std::sync::Arc;
use std::time::Duration;

use policies::delegation::{child_action, on_parent_end, ChildAction, TreeCause};
use policies::TaskState;

use crate::cancel::{CancelJob, Canceller, Probed};
use crate::link::Linker;
use crate::metrics;
use crate::route::LiveRoutes;
use crate::store::{ChildLink, TaskKey, TaskStore};
use crate::tracker::Tracker;

/// How long a child is looked for by its message: its send may still be
/// on its way to the worker when its parent is cancelled.
pub const FIND_CHILD_FOR: Duration = Duration::from_secs(5);

/// A task the gateway learned ended, and how to reach its worker.
#[derive(Debug)]
pub struct Ended {
    /// The task (`key`), its worker, binding, tenant and headers; its
    /// `message_id`, when the request that saw the end knew it.
    pub job: CancelJob,
    /// How it ended; `None`: not known (asked of the worker).
    pub state: Option<TaskState>,
}

/// Whether a cancel's `cause` is a tree's own (its end is followed by the
/// tree itself, with the child's message at hand).
pub fn is_tree_cause(cause: &str) -> bool {
    cause.starts_with("parent_")
}

/// Cancels the children of ended tasks. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Tree {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn TaskStore>,
    /// This replica's queued store writes, links among them.
    tracker: Tracker,
    canceller: Canceller,
    routes: Arc<LiveRoutes>,
    linker: Arc<Linker>,
}

impl Tree {
    pub fn new(
        store: Arc<dyn TaskStore>,
        tracker: Tracker,
        canceller: Canceller,
        routes: Arc<LiveRoutes>,
        linker: Arc<Linker>,
    ) -> Self {
        Tree {
            inner: Arc::new(Inner {
                store,
                tracker,
                canceller,
                routes,
                linker,
            }),
        }
    }

    /// Follows the ends of the tasks `canceller`'s cancels end
    /// ([`policies::delegation::after_cancel`]): whatever the cause, a task
    /// the gateway cancelled takes its children with it, and so does one
    /// whose lease lapsed and whose worker lost it or cannot be reached
    /// (the tree's own cancels go on from there, with the child's message
    /// at hand).
    pub fn follow(&self, canceller: &Canceller) {
        let me = self.clone();
        canceller.on_canceled(Box::new(move |job, outcome| {
            use crate::cancel::CancelOutcome as O;
            use policies::delegation::{after_cancel, AfterCancel, CancelSeen};
            if is_tree_cause(job.cause) {
                return;
            }
            let seen = match outcome {
                O::Canceled => CancelSeen::Canceled,
                O::NotCancelable => CancelSeen::NotCancelable,
                O::NotFound => CancelSeen::NotFound,
                O::Failed => CancelSeen::Failed,
                O::NotOwed => CancelSeen::NotOwed,
            };
            let state = match after_cancel(seen, job.cause == "lease_lapsed") {
                AfterCancel::Ended(s) => Some(s),
                AfterCancel::Ask => None,
                AfterCancel::Nothing => return,
            };
            me.ended(Ended {
                job: job.clone(),
                state,
            });
        }));
    }

    /// The references' minter, for the proxy's requests.
    pub fn linker(&self) -> &Linker {
        &self.inner.linker
    }

    /// A task ended: its children are looked up and cancelled in the
    /// background (a drain waits for it). Nothing when linking is off.
    pub fn ended(&self, ended: Ended) {
        if !self.inner.linker.on {
            return;
        }
        let me = self.clone();
        crate::drain::spawn_work(async move { me.parent_ended(ended).await });
    }

    async fn parent_ended(&self, ended: Ended) {
        let Ended { job, mut state } = ended;
        let key = &job.key;
        let Some(route) = self.inner.routes.by_name(&key.route) else {
            return;
        };
        let mut messages: Vec<String> = job.message_id.iter().cloned().collect();
        if state.is_none() || messages.is_empty() {
            match self.inner.canceller.history(&job).await {
                (Probed::State(s), history) => {
                    state = state.or(Some(s));
                    messages.extend(history);
                }
                (Probed::NotFound | Probed::Unknown, _) => {}
            }
        }
        let Some(state) = state else { return };
        let Some(cause) = on_parent_end(state, route.cfg.on_parent_completed) else {
            return;
        };
        let refs = self
            .inner
            .linker
            .task_refs(&key.route, &key.tenant, &key.task_id, &messages);
        // A child's link is written off its send's path: one this replica
        // still has queued is applied before the children are read.
        self.inner.tracker.flush().await;
        let kids = match self.inner.store.children(&refs).await {
            Ok(k) => k,
            Err(e) => {
                metrics::STORE_ERRORS.with_label_values(&["children"]).inc();
                tracing::warn!(task = %key, error = %e, "could not read a task's children; they are not cancelled");
                return;
            }
        };
        if kids.is_empty() {
            return;
        }
        tracing::info!(task = %key, state = state.as_wire(), children = kids.len(), cause = cause.as_str(), "a parent ended; cancelling its children");
        let mut seen = std::collections::HashSet::new();
        for kid in kids {
            // A child linked twice (a retried link) is cancelled once.
            if !seen.insert((kid.route.clone(), kid.message_id.clone())) {
                continue;
            }
            let me = self.clone();
            crate::drain::spawn_work(async move { me.cancel_child(kid, cause).await });
        }
    }

    async fn cancel_child(&self, kid: ChildLink, cause: TreeCause) {
        let outcome = self.try_cancel_child(&kid, cause.as_str()).await;
        metrics::TREE_CANCELS
            .with_label_values(&[&kid.route, cause.as_str(), outcome])
            .inc();
    }

    /// Stops a parent whose children, on any replica, spent its budget
    /// past its grant ([`crate::budget`]), when its request is not on this
    /// replica: found by its message as a child is, cancelled through the
    /// outbox unless it settled; its own children follow as after any
    /// cancel of the gateway's.
    pub fn stop_parent(&self, parent: ChildLink) {
        let me = self.clone();
        crate::drain::spawn_work(async move {
            let outcome = me.try_cancel_child(&parent, "budget_exhausted").await;
            tracing::info!(route = %parent.route, message = %parent.message_id, outcome, "a parent's budget was spent past its grant by its children; stopping it");
        });
    }

    /// Finds, judges and cancels one child (or a parent: `cause` is not a
    /// tree's, and [`Tree::follow`] follows its end); returns the
    /// outcome's label.
    async fn try_cancel_child(&self, kid: &ChildLink, cause: &'static str) -> &'static str {
        let inner = &*self.inner;
        let Some(route) = inner.routes.by_name(&kid.route) else {
            tracing::warn!(route = %kid.route, "a child's route is gone; not cancelled");
            return "lost";
        };
        let Some(worker) = route.worker_for(kid.replica.as_deref()).await else {
            return "lost";
        };
        let headers = crate::cancel::cancel_headers(&route.cfg, &[]);
        let tenant = (!kid.tenant.is_empty()).then_some(&*kid.tenant);
        let (found, _) = inner
            .canceller
            .wait_for_message(
                &worker,
                &kid.target,
                &kid.route,
                tenant,
                &headers,
                &kid.message_id,
                kid.sent_ms,
                FIND_CHILD_FOR,
            )
            .await;
        let id = match found {
            Ok(Some(id)) => id,
            Ok(None) => {
                tracing::warn!(route = %kid.route, message = %kid.message_id, "a child was not found by its message; not cancelled");
                return "not_found";
            }
            Err(e) => {
                tracing::warn!(route = %kid.route, error = %e, "a child's worker does not serve ListTasks; the child cannot be found");
                return "not_found";
            }
        };
        let key = TaskKey::new(&kid.route, tenant, id);
        let job = CancelJob {
            key: key.clone(),
            worker,
            target: kid.target.clone(),
            headers,
            cause,
            message_id: Some(kid.message_id.clone()),
        };
        let known = match inner.store.get(&key).await {
            Ok(rec) => rec.and_then(|r| r.state),
            Err(_) => None,
        };
        let mut action = child_action(known);
        let mut state = known;
        if action == ChildAction::Probe {
            match inner.canceller.task_state(&job).await {
                Probed::State(s) => {
                    state = Some(s);
                    action = child_action(Some(s));
                }
                Probed::NotFound => return "not_found",
                Probed::Unknown => action = ChildAction::Cancel,
            }
        }
        match action {
            ChildAction::Keep => {
                // A child that ended on its own may have children of its
                // own still running: its end is followed as any other.
                if let Some(s) = state.filter(|s| s.is_terminal()) {
                    self.ended(Ended {
                        job,
                        state: Some(s),
                    });
                }
                "settled"
            }
            ChildAction::Probe | ChildAction::Cancel => {
                let Some(token) = crate::cancel::owe(&*inner.store, &job).await else {
                    return "elsewhere";
                };
                let outcome = inner
                    .canceller
                    .deliver(&*inner.store, &job, token.as_deref())
                    .await;
                // A tree's own cancel is not followed by `follow`.
                if outcome == crate::cancel::CancelOutcome::Canceled && is_tree_cause(cause) {
                    self.ended(Ended {
                        job,
                        state: Some(TaskState::Canceled),
                    });
                }
                outcome.as_str()
            }
        }
    }
}
