//! Budgets at the network: the grant a child gets, the accounts it draws
//! from, and stopping it when it overruns.
//!
//! The decisions are `policies::budget`'s; this module does the edges:
//!
//! * **Admission** ([`Budgets::admit`]), before the worker sees the send:
//!   the caller's grant is checked as the SDK's server checks it, held to
//!   the route's, tenant's and caller's caps (clamped or refused), injected
//!   when there is none, and reserved from every account it draws on in
//!   one atomic store call, so concurrent children on any replica cannot
//!   each take the whole.
//! * **Enforcement** ([`ChildBudget`]): a timer per child fires at its
//!   deadline; a status update reporting spend past a meter's grant
//!   exhausts it at once. Either way the gateway sends `CancelTask` and the
//!   proxy ends the caller's stream with the SDK's budget-exhausted
//!   `TASK_STATE_FAILED` update in place of the worker's last event.
//! * **Settlement** ([`ChildBudget::settle`]): when the request ends, each
//!   reservation is replaced by the spend the child reported on its
//!   settling update, kept whole when it ended any other way, and returned
//!   when the worker refused the send.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use policies::budget::{
    apply_caps, exhausted_text, window_end, window_start, Admitted, BudgetRefusal, Caps,
    Exhaustion, Grant, BUDGET_EXHAUSTED_CLASS, BUDGET_EXTENSION_URI, BUDGET_METADATA_KEY,
    FAILURE_EXTENSION_URI, FAILURE_METADATA_KEY,
};
use serde_json::{json, Map, Value};

use crate::a2a::request::SentGrant;
use crate::a2a::Binding;
use crate::cancel::{CancelJob, Canceller};
use crate::metrics;
use crate::store::{
    now_ms, AccountKey, Reservation, Shortfall, StoreHealth, TaskStore, Unreserved,
};

/// How long past its window's end an account is kept, so that children
/// that started in it still settle into it.
const ACCOUNT_SLACK_MS: u64 = 3_600_000;

/// How often, and how far apart, a child's send reads its parent's budget
/// from the store before it gives up on it ([`Budgets::tree_left`]): the
/// parent's replica writes it as it forwards the parent's send, which a
/// child's send reaches the store after unless the store lags by more.
const TREE_BUDGET_READS: u32 = 5;
const TREE_BUDGET_WAIT: Duration = Duration::from_millis(10);

/// Why a send is not let through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BudgetError {
    /// The grant is malformed, or over a cap under `over_cap = "refuse"`:
    /// `-32602` / 400.
    Refused(BudgetRefusal),
    /// An account cannot cover the grant: 429 / `-32603` with the account.
    Exhausted {
        account: AccountKey,
        meter: String,
        asked: u64,
        left: u64,
        limit: u64,
        /// When the account's window ends and it is full again (Unix ms,
        /// by the store's clock: [`TaskStore::clock_ms`]).
        resets_at_ms: u64,
        /// How long until then, from when the send was refused.
        resets_in_ms: u64,
    },
    /// The store could not reserve (and `on_store_error = "fail-closed"`).
    StoreUnavailable(String),
    /// The grant would open an account past `limits.max_accounts`: 503.
    AccountsFull { max: u64 },
}

impl std::fmt::Display for BudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BudgetError::Refused(r) => r.fmt(f),
            BudgetError::Exhausted {
                account,
                meter,
                asked,
                left,
                limit,
                resets_in_ms,
                ..
            } => write!(
                f,
                "budget account {account} is exhausted for meter {meter:?}: {left} of {limit} left, \
                 the child's grant needs {asked}; the account resets in {}s",
                resets_in_ms.div_ceil(1000)
            ),
            BudgetError::StoreUnavailable(e) => write!(
                f,
                "the budget could not be reserved: the gateway's store is unavailable ({e})"
            ),
            BudgetError::AccountsFull { max } => write!(
                f,
                "the budget could not be reserved: the gateway keeps at most {max} budget accounts (limits.max_accounts) and this send would open another"
            ),
        }
    }
}

/// The runtime side of budgets, one per gateway process.
#[derive(Debug)]
pub struct Budgets {
    store: Arc<dyn TaskStore>,
    health: Arc<StoreHealth>,
    fail_closed: bool,
    canceller: Canceller,
    /// Children with a budget in flight on this replica, for the admin view.
    live: Mutex<HashMap<u64, Arc<Shared>>>,
    /// Numbers live children and reservation tickets.
    seq: AtomicU64,
    /// This process's part of every reservation ticket
    /// ([`ticket_prefix`]): tickets stay unique across replicas and
    /// restarts.
    tickets: String,
    /// Live budgets by the delegation reference of the request that holds
    /// them (hex): a linked child's send on this replica finds its
    /// parent's, is granted what it has left and charges it what it spends.
    by_reference: Mutex<HashMap<String, std::sync::Weak<Shared>>>,
    /// The store is shared with other replicas (Redis): a parent's budget
    /// with meters is kept there too, for its children sent through them.
    trees_in_store: bool,
    /// Stops a parent that is not on this replica.
    tree: crate::tree::Tree,
}

/// What a send that starts a task knows of its parent (delegation trees).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParentHint {
    /// The parent request's reference (hex).
    pub reference: Option<String>,
    /// When the parent's budget ends (Unix ms), as its reference says.
    pub deadline_ms: Option<u64>,
    /// The store keeps the parent's meters ([`TaskStore::tree_budget_get`]),
    /// as its reference says.
    pub metered: bool,
}

/// What one child's budget looks like right now, shared between its
/// request, its deadline timer and the admin endpoint.
#[derive(Debug)]
pub struct Shared {
    route: Arc<str>,
    tenant: Option<String>,
    caller: Option<String>,
    grant: Grant,
    deadline_ms: Option<u64>,
    reservations: Vec<Reservation>,
    state: Mutex<SharedState>,
    /// The request ended: the timer has nothing left to do, unless the
    /// child it ended with is still running (`after_end`).
    done: AtomicBool,
    /// The child's key when the request ended before it settled (a
    /// non-blocking send, a detached stream): its deadline still holds,
    /// checked against the store's view of the task when it comes.
    after_end: Mutex<Option<crate::store::TaskKey>>,
    ended: tokio::sync::Notify,
    /// A linked child's parent budget (on this replica): what this child
    /// spends is charged to it too.
    parent: Option<Arc<Shared>>,
    /// The delegation reference this budget is found by, once registered.
    reference: Mutex<Option<String>>,
    /// The references whose budgets the store keeps that this one's spend
    /// is charged to: its parent's (given at admission), and its own once
    /// opened there ([`ChildBudget::register_reference`]).
    charged_refs: Mutex<Vec<String>>,
}

#[derive(Debug, Default)]
struct SharedState {
    /// How to cancel the child, once an event named it.
    job: Option<CancelJob>,
    task_id: Option<String>,
    exhausted: Option<Exhaustion>,
    cancel_sent: bool,
    /// The first event naming the child showed it settled: nothing to stop.
    settled_when_named: bool,
    spent: BTreeMap<String, u64>,
    /// What its linked children reported spending, summed per meter.
    children_spent: BTreeMap<String, u64>,
}

/// A child's budget, held in the request's context from admission until
/// it settles.
#[derive(Debug)]
pub struct ChildBudget {
    pub shared: Arc<Shared>,
    id: u64,
    /// The grant on the child's message differs from the sent one (or
    /// none was sent): the body is re-written and the header set.
    pub rewrite: bool,
    /// The report on the update that settled the child.
    settled_spent: Option<BTreeMap<String, u64>>,
}

/// What to do after an event of the child's stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    /// A meter passed its grant with this event: cancel (done here) and end
    /// the caller's stream once the worker answers.
    Exhausted(Exhaustion),
}

/// The caps that apply to a send: the route's, tightened by the tenant's
/// and the caller's, plus an account's limit on any meter it keeps that no
/// cap names.
pub fn caps_for(policy: &config::BudgetPolicy, tenant: Option<&str>, caller: Option<&str>) -> Caps {
    let mut caps = policy.caps.clone();
    if let Some(t) = tenant.and_then(|t| policy.tenants.get(t)) {
        caps = caps.tighten(t);
    }
    if let Some(c) = caller.and_then(|c| policy.callers.get(c)) {
        caps = caps.tighten(c);
    }
    // A meter an account limits is never left unlimited: without a cap of
    // its own, one child may be granted at most the whole account.
    for acct in &policy.accounts {
        for (meter, &limit) in &acct.meters {
            caps.meters.entry(meter.clone()).or_insert(limit);
        }
    }
    caps
}

impl Budgets {
    pub fn new(
        store: Arc<dyn TaskStore>,
        health: Arc<StoreHealth>,
        on_store_error: config::OnStoreError,
        canceller: Canceller,
        tree: crate::tree::Tree,
    ) -> Self {
        Budgets {
            health,
            fail_closed: on_store_error == config::OnStoreError::FailClosed,
            canceller,
            live: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(1),
            tickets: ticket_prefix(),
            by_reference: Mutex::new(HashMap::new()),
            trees_in_store: store.kind() != "memory",
            tree,
            store,
        }
    }

    /// Decides the grant of a send that starts or continues a task, and
    /// reserves it. `Ok(None)`: the route sets no budget and the caller
    /// sent none, so nothing is attached or enforced.
    ///
    /// # Errors
    ///
    /// [`BudgetError`]: the send must be refused and no child started.
    #[allow(clippy::too_many_arguments)]
    pub async fn admit(
        self: &Arc<Self>,
        route: &Arc<str>,
        policy: &config::BudgetPolicy,
        tenant: Option<&str>,
        caller: Option<&Caller>,
        sent: Option<Result<SentGrant, BudgetRefusal>>,
        received_ms: u64,
        parent: &ParentHint,
    ) -> Result<Option<ChildBudget>, BudgetError> {
        // A linked child's parent budget, when it is held on this replica.
        let parent_budget = parent.reference.as_deref().and_then(|r| {
            lock(&self.by_reference)
                .get(r)
                .and_then(std::sync::Weak::upgrade)
        });
        // A linked child's parent budget kept in the store, for a parent
        // on any replica: this child's spend is charged to it.
        let parent_in_store = parent
            .reference
            .as_ref()
            .filter(|_| parent.metered && self.trees_in_store);
        // Nothing sent and nothing to impose: what the caps below would
        // conclude, without building them (every plain send comes here).
        if sent.is_none()
            && !policy.is_active()
            && parent.deadline_ms.is_none()
            && parent_budget.is_none()
            && parent_in_store.is_none()
        {
            return Ok(None);
        }
        let sent = match sent {
            Some(Err(r)) => return Err(BudgetError::Refused(r)),
            Some(Ok(g)) => Some(g),
            None => None,
        };
        let caps = caps_for(policy, tenant, caller.map(|c| c.name.as_str()));
        let admitted = apply_caps(sent.as_ref().map(|s| &s.grant), &caps, policy.over_cap)
            .map_err(BudgetError::Refused)?;
        // A linked child's deadline is at most its parent's (delegation
        // trees): what the parent has left as the send arrives; and one
        // that carries no grant is granted what its parent (on this
        // replica) has left of each meter.
        let admitted = policies::budget::inherit_deadline(
            admitted,
            parent.deadline_ms.map(|d| d.saturating_sub(received_ms)),
        );
        let parent_left = match (parent_in_store, &parent_budget) {
            // What every replica charged, when its children may be on any.
            (Some(r), _) if sent.is_none() => self.tree_left(r).await,
            (_, Some(p)) => {
                let st = lock(&p.state);
                let mut spent = st.spent.clone();
                for (m, n) in &st.children_spent {
                    *spent.entry(m.clone()).or_insert(0) += n;
                }
                Some(policies::budget::remaining_meters(&p.grant, &spent))
            }
            _ => None,
        };
        let admitted =
            policies::budget::inherit_meters(admitted, parent_left.as_ref(), sent.is_some());
        let Some(Admitted {
            grant,
            clamped,
            filled,
            injected,
        }) = admitted
        else {
            return Ok(None);
        };
        for field in &clamped {
            metrics::BUDGET_CLAMPS
                .with_label_values(&[route, field])
                .inc();
        }
        if injected {
            metrics::BUDGET_INJECTED.with_label_values(&[route]).inc();
        }
        let rewrite = injected
            || !clamped.is_empty()
            || !filled.is_empty()
            || sent.as_ref().is_some_and(|s| s.had_floats);
        let reservations = self
            .reserve(
                route,
                policy,
                tenant,
                caller.map(|c| c.shown.as_str()),
                &grant,
                self.store.clock_ms(),
            )
            .await?;
        let shared = Arc::new(Shared {
            route: route.clone(),
            tenant: tenant.map(str::to_owned),
            caller: caller.map(|c| c.shown.clone()),
            deadline_ms: grant
                .remaining_ms
                .map(|ms| policies::budget::deadline_ms(received_ms, ms)),
            grant,
            reservations,
            state: Mutex::new(SharedState::default()),
            done: AtomicBool::new(false),
            after_end: Mutex::new(None),
            ended: tokio::sync::Notify::new(),
            parent: parent_budget,
            reference: Mutex::new(None),
            charged_refs: Mutex::new(parent_in_store.cloned().into_iter().collect()),
        });
        let id = self.seq.fetch_add(1, Ordering::Relaxed);
        lock(&self.live).insert(id, shared.clone());
        if let Some(deadline) = shared.deadline_ms {
            let this = self.clone();
            let shared = shared.clone();
            tokio::spawn(async move { this.watch_deadline(shared, deadline).await });
        }
        Ok(Some(ChildBudget {
            shared,
            id,
            rewrite,
            settled_spent: None,
        }))
    }

    /// Reserves the grant's meters from every account the route keeps;
    /// `caller` as [`Caller::shown`] (it becomes a store key); `now` by the
    /// store's clock, which decides the window every replica charges.
    async fn reserve(
        &self,
        route: &Arc<str>,
        policy: &config::BudgetPolicy,
        tenant: Option<&str>,
        caller: Option<&str>,
        grant: &Grant,
        now: u64,
    ) -> Result<Vec<Reservation>, BudgetError> {
        let mut asks = Vec::new();
        let ticket = self.seq.fetch_add(1, Ordering::Relaxed);
        for acct in &policy.accounts {
            let window_ms = acct.window.as_millis() as u64;
            let holder = match acct.per {
                config::AccountScope::Route => "",
                config::AccountScope::Tenant => tenant.unwrap_or(""),
                config::AccountScope::Caller => caller.unwrap_or(""),
            };
            let account = AccountKey {
                route: route.clone(),
                scope: acct.per.as_str().into(),
                holder: holder.into(),
                window_start_ms: window_start(now, window_ms),
            };
            for (meter, &limit) in &acct.meters {
                // Config guarantees a cap on every account meter, so the
                // grant names it (a cap fills an omitted meter with 0).
                let amount = grant.meters.get(meter).copied().unwrap_or(0);
                asks.push(Reservation {
                    account: account.clone(),
                    meter: meter.clone(),
                    amount,
                    limit,
                    expires_ms: window_end(now, window_ms).saturating_add(ACCOUNT_SLACK_MS),
                    ticket: format!("{}-{}.{}", self.tickets, ticket, asks.len()),
                });
            }
        }
        if asks.is_empty() {
            return Ok(asks);
        }
        let result = self.store.account_reserve(&asks).await;
        self.health.record(&result);
        match result {
            Ok(Ok(())) => {
                for a in &asks {
                    metrics::BUDGET_RESERVED
                        .with_label_values(&[route, &a.meter])
                        .inc_by(a.amount);
                }
                Ok(asks)
            }
            Ok(Err(Unreserved::Full { max })) => {
                tracing::warn!(route = %route, max, "a budget account was not opened: limits.max_accounts live accounts already");
                Err(BudgetError::AccountsFull { max })
            }
            Ok(Err(Unreserved::Short(Shortfall { index, left }))) => {
                let a = &asks[index];
                let resets_at_ms = a.expires_ms - ACCOUNT_SLACK_MS;
                Err(BudgetError::Exhausted {
                    account: a.account.clone(),
                    meter: a.meter.clone(),
                    asked: a.amount,
                    left,
                    limit: a.limit,
                    resets_at_ms,
                    resets_in_ms: resets_at_ms.saturating_sub(now),
                })
            }
            Err(e) => {
                metrics::STORE_ERRORS
                    .with_label_values(&["account_reserve"])
                    .inc();
                // The store may have applied the reservation and only its
                // answer was lost (a timeout): withdraw it, which changes
                // nothing if it never landed and keeps it from landing
                // later. Either way the child runs unreserved or not at all.
                let withdraw = asks.iter().map(|a| (a.clone(), 0)).collect();
                crate::drain::spawn_work(settle_retrying(
                    self.store.clone(),
                    withdraw,
                    &WITHDRAW_RETRIES,
                    "withdraw",
                ));
                if self.fail_closed {
                    Err(BudgetError::StoreUnavailable(e.to_string()))
                } else {
                    tracing::warn!(route = %route, error = %e, "budget accounts unavailable; the child starts unreserved (on_store_error = fail-open)");
                    metrics::Untracked::BudgetStoreUnavailable.count();
                    Ok(Vec::new())
                }
            }
        }
    }

    async fn watch_deadline(self: Arc<Self>, shared: Arc<Shared>, deadline_ms: u64) {
        let wait = Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shared.ended.notified() => return,
        }
        if shared.done.load(Ordering::Acquire) {
            let key = lock(&shared.after_end).clone();
            let Some(key) = key else { return };
            // Settled since, as any request through any replica saw it?
            match self.store.get(&key).await {
                Ok(Some(rec)) if rec.state.is_some_and(policies::TaskState::is_settled) => {
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(task = %key, error = %e, "store unreadable at a child's deadline; cancelling on what this replica saw");
                }
            }
        }
        self.exhaust(&shared, Exhaustion::Time);
    }

    /// Marks the child exhausted (once) and cancels it if its id is known;
    /// otherwise the cancel goes out when an event names it.
    fn exhaust(&self, shared: &Arc<Shared>, by: Exhaustion) {
        let job = {
            let mut st = lock(&shared.state);
            if st.exhausted.is_some() {
                return;
            }
            tracing::info!(route = %shared.route, task = ?st.task_id, by = by.as_str(), "budget exhausted; cancelling the child");
            metrics::BUDGET_EXHAUSTED
                .with_label_values(&[
                    &shared.route,
                    match by {
                        Exhaustion::Time => "time",
                        Exhaustion::Meter(_) => "meter",
                    },
                ])
                .inc();
            st.exhausted = Some(by);
            take_job(&mut st)
        };
        if let Some(job) = job {
            self.send_cancel(job);
        }
    }

    /// What a parent whose budget the store keeps has left of each meter.
    /// Its reference promised the budget, whose opening is written as the
    /// parent's send is forwarded: a child's send that overtakes it waits
    /// for it a little. `None`: not there (or the store failed): the child
    /// inherits no meters, and is still charged to the parent.
    async fn tree_left(&self, reference: &str) -> Option<BTreeMap<String, u64>> {
        for attempt in 0..TREE_BUDGET_READS {
            if attempt > 0 {
                tokio::time::sleep(TREE_BUDGET_WAIT).await;
            }
            match self.store.tree_budget_get(reference).await {
                Ok(Some(b)) if b.parent.is_some() => {
                    return Some(policies::budget::remaining_meters_of(&b.grant, &b.spent))
                }
                Ok(_) => {}
                Err(e) => {
                    metrics::STORE_ERRORS
                        .with_label_values(&["tree_budget_get"])
                        .inc();
                    tracing::warn!(error = %e, "a parent's budget could not be read; its child inherits no meters");
                    return None;
                }
            }
        }
        tracing::warn!(
            reference,
            "a parent's budget was not in the store; its child inherits no meters"
        );
        None
    }

    /// Charges what a budget's spend grew by to the budgets the store
    /// keeps that it counts against (off the request's path); the one
    /// charge that takes one past its grant stops its parent: here when
    /// its request is on this replica, else by its message.
    fn charge_trees(self: &Arc<Self>, refs: Vec<String>, grew: BTreeMap<String, u64>) {
        let me = self.clone();
        crate::drain::spawn_work(async move {
            for r in refs {
                let b = match me.store.tree_budget_charge(&r, &grew).await {
                    Ok(b) => b,
                    Err(e) => {
                        metrics::STORE_ERRORS
                            .with_label_values(&["tree_budget_charge"])
                            .inc();
                        tracing::warn!(error = %e, "a child's spend could not be charged to its parent's budget");
                        continue;
                    }
                };
                if !b.stop {
                    continue;
                }
                let meter = policies::budget::meters_over(&b.grant, &b.spent).unwrap_or_default();
                let local = lock(&me.by_reference)
                    .get(&r)
                    .and_then(std::sync::Weak::upgrade);
                match (local, b.parent) {
                    (Some(p), _) => me.exhaust(&p, Exhaustion::Meter(meter)),
                    (None, Some(parent)) => {
                        metrics::BUDGET_EXHAUSTED
                            .with_label_values(&[&parent.route, "meter"])
                            .inc();
                        me.tree.stop_parent(parent);
                    }
                    (None, None) => {}
                }
            }
        });
    }

    /// Sends a budget's cancel through the store's outbox, as the cascade's
    /// are: written before the first attempt, so that another replica sends
    /// it if this one dies first.
    fn send_cancel(&self, job: CancelJob) {
        let canceller = self.canceller.clone();
        let store = self.store.clone();
        crate::drain::spawn_work(async move {
            if let Some(token) = crate::cancel::owe(&*store, &job).await {
                canceller.deliver(&*store, &job, token.as_deref()).await;
            }
        });
    }

    /// The accounts and in-flight child budgets, for `/budgets`.
    pub async fn admin_view(&self) -> Value {
        let children: Vec<Value> = {
            let live = lock(&self.live);
            live.values().map(|s| s.view()).collect()
        };
        let accounts = match self.store.account_list(1000).await {
            Ok(list) => Value::Array(
                list.into_iter()
                    .map(|v| {
                        json!({
                            "route": &*v.account.route,
                            "per": &*v.account.scope,
                            "holder": &*v.account.holder,
                            "windowStartMs": v.account.window_start_ms,
                            "meter": v.meter,
                            "limit": v.balance.limit,
                            "spent": v.balance.spent,
                            "reserved": v.balance.reserved,
                            "left": v.balance.left(),
                        })
                    })
                    .collect(),
            ),
            Err(e) => json!({"error": e.to_string()}),
        };
        json!({"accounts": accounts, "children": children})
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every change under these locks is a single assignment or insert.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cancel owed once, if it is owed and the child's id is known.
fn take_job(st: &mut SharedState) -> Option<CancelJob> {
    if st.exhausted.is_none() || st.cancel_sent || st.settled_when_named {
        return None;
    }
    let job = st.job.clone()?;
    st.cancel_sent = true;
    Some(job)
}

impl Shared {
    fn view(&self) -> Value {
        let st = lock(&self.state);
        json!({
            "route": &*self.route,
            "tenant": self.tenant,
            "caller": self.caller,
            "taskId": st.task_id,
            "grant": grant_json(&self.grant),
            "deadlineMs": self.deadline_ms,
            "spent": st.spent,
            "exhausted": st.exhausted.as_ref().map(Exhaustion::as_str),
            "reserved": self.reservations.iter().map(|r| json!({
                "account": r.account.to_string(), "meter": r.meter, "amount": r.amount,
            })).collect::<Vec<_>>(),
        })
    }
}

impl ChildBudget {
    /// Makes this budget findable by the delegation reference of its
    /// request (hex), for the children it starts on this replica.
    /// On a store shared with other replicas, a budget with meters is
    /// opened there too (`parent`: how to find its task), so that children
    /// sent through any replica inherit and charge it: then `true`, and
    /// the reference says so ([`policies::delegation::Wire::metered`]).
    pub fn register_reference(
        &self,
        budgets: &Budgets,
        reference: String,
        parent: Option<crate::store::ChildLink>,
    ) -> bool {
        let mut mine = lock(&self.shared.reference);
        if mine.is_none() {
            lock(&budgets.by_reference).insert(reference.clone(), Arc::downgrade(&self.shared));
            *mine = Some(reference.clone());
            let Some(parent) =
                parent.filter(|_| budgets.trees_in_store && !self.shared.grant.meters.is_empty())
            else {
                return false;
            };
            lock(&self.shared.charged_refs).push(reference.clone());
            let store = budgets.store.clone();
            let grant = self.shared.grant.meters.clone();
            let expires_ms = self.shared.deadline_ms.map_or_else(
                || now_ms() + crate::store::LINK_RETENTION.as_millis() as u64,
                |d| d + ACCOUNT_SLACK_MS,
            );
            crate::drain::spawn_work(async move {
                if let Err(e) = store
                    .tree_budget_open(&reference, &grant, &parent, expires_ms)
                    .await
                {
                    metrics::STORE_ERRORS
                        .with_label_values(&["tree_budget_open"])
                        .inc();
                    tracing::warn!(error = %e, "a parent's budget could not be kept for its children on other replicas");
                }
            });
            return true;
        }
        lock(&self.shared.charged_refs).contains(&reference)
    }

    /// When the child's budget ends (Unix ms), if its grant has a
    /// deadline: what its own children inherit.
    pub fn deadline_ms(&self) -> Option<u64> {
        self.shared.deadline_ms
    }

    /// The grant the child's message carries.
    pub fn grant(&self) -> &Grant {
        &self.shared.grant
    }

    /// What exhausted the child, if anything has.
    pub fn exhausted(&self) -> Option<Exhaustion> {
        lock(&self.shared.state).exhausted.clone()
    }

    /// What stopped the child, once the gateway has cancelled it for its
    /// budget: then its settling event is answered with the failure.
    pub fn stopped(&self) -> Option<Exhaustion> {
        let st = lock(&self.shared.state);
        match &st.exhausted {
            Some(by) if st.cancel_sent => Some(by.clone()),
            _ => None,
        }
    }

    /// An event named the child: from now on it can be cancelled (at once,
    /// when its deadline already passed, unless it named a settled child:
    /// a blocking send's answer).
    pub fn task_known(&self, budgets: &Budgets, task_id: &str, job: CancelJob, settled: bool) {
        let job = {
            let mut st = lock(&self.shared.state);
            st.task_id = Some(task_id.to_owned());
            st.job = Some(job);
            st.settled_when_named |= settled;
            take_job(&mut st)
        };
        if let Some(job) = job {
            budgets.send_cancel(job);
        }
    }

    /// Charges a status update's reported spend (cumulative per meter).
    /// `settles`: the update settled the child, so its report is what the
    /// reservation is replaced by.
    pub fn on_spent(
        &mut self,
        budgets: &Arc<Budgets>,
        spent: BTreeMap<String, u64>,
        settles: bool,
    ) -> Verdict {
        let (over, grew) = {
            let mut st = lock(&self.shared.state);
            let mut grew = BTreeMap::new();
            for (meter, &n) in &spent {
                let e = st.spent.entry(meter.clone()).or_insert(0);
                if n > *e {
                    grew.insert(meter.clone(), n - *e);
                    *e = n;
                }
            }
            (
                policies::budget::over_grant(&st.spent, &st.children_spent, &self.shared.grant),
                grew,
            )
        };
        if !grew.is_empty() {
            let refs = lock(&self.shared.charged_refs).clone();
            if !refs.is_empty() {
                budgets.charge_trees(refs, grew.clone());
            }
        }
        // A linked child's spend is its parent's too: a parent it takes
        // past its grant is stopped (and its children with it).
        if let (Some(parent), false) = (&self.shared.parent, grew.is_empty()) {
            let over_parent = {
                let mut st = lock(&parent.state);
                for (m, n) in grew {
                    *st.children_spent.entry(m).or_insert(0) += n;
                }
                policies::budget::over_grant(&st.spent, &st.children_spent, &parent.grant)
            };
            if let Some(meter) = over_parent {
                budgets.exhaust(parent, Exhaustion::Meter(meter));
            }
        }
        if settles {
            self.settled_spent = Some(spent);
        }
        match over {
            Some(meter) => {
                let by = Exhaustion::Meter(meter);
                budgets.exhaust(&self.shared, by.clone());
                Verdict::Exhausted(by)
            }
            None => Verdict::Continue,
        }
    }

    /// The spend reported so far, per meter.
    pub fn spent(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.state).spent.clone()
    }

    /// Ends the child's budget when its request ends: settles every
    /// reservation, and stops the deadline timer unless `running` names a
    /// child still unsettled (its deadline then still holds). `refused`:
    /// the worker refused the send (no task was created), so the
    /// reservations go back whole.
    pub fn settle(self, budgets: &Budgets, refused: bool, running: Option<crate::store::TaskKey>) {
        let keep_timer = running.is_some() && self.shared.deadline_ms.is_some();
        *lock(&self.shared.after_end) = running;
        self.shared.done.store(true, Ordering::Release);
        if !keep_timer {
            self.shared.ended.notify_one();
        }
        lock(&budgets.live).remove(&self.id);
        if let Some(r) = lock(&self.shared.reference).take() {
            lock(&budgets.by_reference).remove(&r);
        }
        if self.shared.reservations.is_empty() {
            return;
        }
        let known = lock(&self.shared.state).spent.clone();
        let settled: Vec<(Reservation, u64)> = self
            .shared
            .reservations
            .iter()
            .map(|r| {
                let charged = if refused {
                    0
                } else if let Some(n) = self
                    .settled_spent
                    .as_ref()
                    .and_then(|s| s.get(&r.meter).copied())
                {
                    n
                } else {
                    // Lost stream, cancel, or a settling update without the
                    // meter: the reservation stays spent (more if more was
                    // reported).
                    r.amount.max(known.get(&r.meter).copied().unwrap_or(0))
                };
                (r.clone(), charged)
            })
            .collect();
        for (r, charged) in &settled {
            metrics::BUDGET_CHARGED
                .with_label_values(&[&self.shared.route, &r.meter])
                .inc_by(*charged);
        }
        crate::drain::spawn_work(settle_retrying(
            budgets.store.clone(),
            settled,
            &SETTLE_RETRIES,
            "settle",
        ));
    }

    /// The SSE event that ends the caller's stream of an exhausted child:
    /// the SDK's budget-exhausted `TASK_STATE_FAILED` status update.
    pub fn failure_event(
        &self,
        binding: Binding,
        rpc_id: Option<&Value>,
        task_id: &str,
        context_id: Option<&str>,
        by: &Exhaustion,
    ) -> Vec<u8> {
        let update = failure_update(task_id, context_id, by, &self.shared.grant, &self.spent());
        let doc = match binding {
            // gRPC streams get theirs from `grpc::status_update_event`.
            Binding::Rest | Binding::Grpc => update,
            Binding::JsonRpc | Binding::WebSocket => json!({
                "jsonrpc": "2.0",
                "id": rpc_id.cloned().unwrap_or(Value::Null),
                "result": update,
            }),
        };
        let mut out = b"data: ".to_vec();
        out.extend_from_slice(doc.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
        out
    }
}

/// The caller a `caller_header` value names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// What `callers` caps are looked up by: a bearer JWT's `sub` claim, else
    /// the header's value (an API key). Held in memory for the request only.
    pub name: String,
    /// What the store, `/budgets` and logs name the caller by: the `sub`
    /// claim as it is (an identity, not a secret), else `sha256:` and the
    /// first 16 hex digits of the value's SHA-256, so that an API key is
    /// never written anywhere.
    pub shown: String,
}

/// The caller a `caller_header` value names: the `sub` claim of a bearer
/// JWT (read, not verified: put the gateway behind whatever verifies the
/// token), else the value itself (an API key, shown only as a fingerprint).
pub fn caller_identity(value: &str) -> Caller {
    use base64::Engine as _;
    let value = value.trim();
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim);
    let sub = token.and_then(|t| {
        let mut parts = t.split('.');
        let (_, claims, _) = (parts.next()?, parts.next()?, parts.next()?);
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims.trim_end_matches('='))
            .ok()?;
        let claims: Value = serde_json::from_slice(&raw).ok()?;
        claims["sub"].as_str().map(str::to_owned)
    });
    match sub {
        Some(sub) => Caller {
            name: sub.clone(),
            shown: sub,
        },
        None => Caller {
            name: value.to_owned(),
            shown: fingerprint(value),
        },
    }
}

/// `sha256:` and the first 16 hex digits of the SHA-256 of `secret`.
pub fn fingerprint(secret: &str) -> String {
    format!(
        "sha256:{}",
        &crate::digest::sha256_hex(secret.as_bytes())[..16]
    )
}

/// A grant as the extension writes it: integers, empty parts omitted.
pub fn grant_json(grant: &Grant) -> Value {
    let mut o = Map::new();
    if let Some(ms) = grant.remaining_ms {
        o.insert("remainingMs".into(), ms.into());
    }
    if !grant.meters.is_empty() {
        o.insert("meters".into(), json!(grant.meters));
    }
    Value::Object(o)
}

/// `{"statusUpdate": …}` failing the task for its budget, shaped as the
/// SDK's server shapes its own (`a2a-reference.md` §6).
pub fn failure_update(
    task_id: &str,
    context_id: Option<&str>,
    by: &Exhaustion,
    grant: &Grant,
    spent: &BTreeMap<String, u64>,
) -> Value {
    let text = exhausted_text(by);
    let mut status_budget = Map::new();
    status_budget.insert("remainingMs".into(), 0.into());
    if !grant.meters.is_empty() {
        status_budget.insert("meters".into(), json!(grant.meters));
    }
    if !spent.is_empty() {
        status_budget.insert("spent".into(), json!(spent));
    }
    let now = chrono_like_timestamp();
    json!({"statusUpdate": {
        "taskId": task_id,
        "contextId": context_id.unwrap_or(""),
        "status": {
            "state": "TASK_STATE_FAILED",
            "timestamp": now,
            "message": {
                "messageId": format!("a2agw-{}-{}", task_id, now_ms()),
                "role": "ROLE_AGENT",
                "taskId": task_id,
                "contextId": context_id.unwrap_or(""),
                "parts": [{"text": text}],
                "metadata": {FAILURE_METADATA_KEY: BUDGET_EXHAUSTED_CLASS},
                "extensions": [FAILURE_EXTENSION_URI],
            },
        },
        "metadata": {
            "error": text,
            BUDGET_METADATA_KEY: Value::Object(status_budget),
        },
    }})
}

/// This process's part of every reservation ticket: host, process id,
/// start time and a random number (two containers may share a host name
/// and a process id, and start in the same millisecond).
fn ticket_prefix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nonce = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{}-{nonce:016x}", crate::store::default_replica_id())
}

/// When a settlement the store did not take is sent again, after the first
/// attempt: the store may be restarting or failing over.
const SETTLE_RETRIES: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
];

/// When the withdrawal of a reservation whose answer was lost is sent
/// again: through a short failover, not as long as a settlement (most
/// reserve errors are a store that is down, where nothing landed, and each
/// send refused or let through unreserved in an outage owes one).
const WITHDRAW_RETRIES: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(5)];

/// Settles reservations, retrying while the store does not answer: each
/// ticket settles once however often it is sent
/// ([`TaskStore::account_settle`]). `what` names the cause in logs:
/// `settle` (a child ended) or `withdraw` (a reservation whose answer was
/// lost, charged nothing).
async fn settle_retrying(
    store: Arc<dyn TaskStore>,
    settled: Vec<(Reservation, u64)>,
    retries: &[Duration],
    what: &str,
) {
    let mut waits = retries.iter();
    loop {
        let Err(e) = store.account_settle(&settled).await else {
            return;
        };
        metrics::STORE_ERRORS
            .with_label_values(&["account_settle"])
            .inc();
        match waits.next() {
            Some(wait) => {
                tracing::debug!(error = %e, what, retry_in = ?wait, "could not settle budget reservations; retrying");
                tokio::time::sleep(*wait).await;
            }
            None => {
                tracing::warn!(error = %e, what, "could not settle budget reservations after retries; they stay reserved until the account's window ends");
                return;
            }
        }
    }
}

/// RFC 3339 UTC with milliseconds, as the SDKs write status timestamps.
fn chrono_like_timestamp() -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(now_ms() as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Writes `grant` into the sent message (`metadata["a2a-rust.com/budget"]`,
/// and the budget URI in `extensions`), returning the new body; `None`
/// when the body is not a message send the gateway can edit (it then goes
/// unchanged, and the caller's send is refused by the proxy).
pub fn rewrite_message(body: &[u8], jsonrpc: bool, grant: &Grant) -> Option<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(body).ok()?;
    let msg = if jsonrpc {
        doc.get_mut("params")?.get_mut("message")?
    } else {
        doc.get_mut("message")?
    };
    let msg = msg.as_object_mut()?;
    let md = msg
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if md.is_null() {
        *md = Value::Object(Map::new());
    }
    md.as_object_mut()?
        .insert(BUDGET_METADATA_KEY.into(), grant_json(grant));
    let ext = msg
        .entry("extensions")
        .or_insert_with(|| Value::Array(Vec::new()));
    if ext.is_null() {
        *ext = Value::Array(Vec::new());
    }
    let list = ext.as_array_mut()?;
    if !list
        .iter()
        .any(|u| u.as_str() == Some(BUDGET_EXTENSION_URI))
    {
        list.push(BUDGET_EXTENSION_URI.into());
    }
    serde_json::to_vec(&doc).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(ms: Option<u64>, m: &[(&str, u64)]) -> Grant {
        Grant {
            remaining_ms: ms,
            meters: m.iter().map(|&(k, v)| (k.to_owned(), v)).collect(),
        }
    }

    #[test]
    fn rewrites_grants_into_messages() {
        let g = grant(Some(5000), &[("tokens", 10)]);
        let table = [
            (
                true,
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","parts":[]}}}"#,
                Some(
                    json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","parts":[],
                    "metadata":{"a2a-rust.com/budget":{"remainingMs":5000,"meters":{"tokens":10}}},
                    "extensions":["https://a2a-rust.com/extensions/budget/v1"]}}}),
                ),
            ),
            (
                false,
                r#"{"message":{"messageId":"m","metadata":{"a2a-rust.com/budget":{"remainingMs":9e3},"x":1},"extensions":["https://a2a-rust.com/extensions/budget/v1","u"]}}"#,
                Some(
                    json!({"message":{"messageId":"m","metadata":{"a2a-rust.com/budget":{"remainingMs":5000,"meters":{"tokens":10}},"x":1},
                    "extensions":["https://a2a-rust.com/extensions/budget/v1","u"]}}),
                ),
            ),
            (
                false,
                r#"{"message":{"metadata":null,"extensions":null}}"#,
                Some(
                    json!({"message":{"metadata":{"a2a-rust.com/budget":{"remainingMs":5000,"meters":{"tokens":10}}},
                    "extensions":["https://a2a-rust.com/extensions/budget/v1"]}}),
                ),
            ),
            (
                true,
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{}}"#,
                None,
            ),
            (false, r#"[1]"#, None),
            (false, "not json", None),
        ];
        for (jsonrpc, body, want) in table {
            let got = rewrite_message(body.as_bytes(), jsonrpc, &g)
                .map(|b| serde_json::from_slice::<Value>(&b).unwrap());
            assert_eq!(got, want, "{body}");
        }
    }

    #[test]
    fn failure_update_is_the_sdks_shape() {
        let spent: BTreeMap<String, u64> = [("tokens".to_owned(), 12)].into();
        let v = failure_update(
            "t1",
            Some("c1"),
            &Exhaustion::Time,
            &grant(Some(100), &[("tokens", 10)]),
            &spent,
        );
        let u = &v["statusUpdate"];
        assert_eq!(u["taskId"], "t1");
        assert_eq!(u["status"]["state"], "TASK_STATE_FAILED");
        assert_eq!(
            u["status"]["message"]["parts"][0]["text"],
            "[-32603] the caller's budget deadline passed"
        );
        assert_eq!(
            u["status"]["message"]["metadata"]["a2a-rust.com/failure"],
            "budget-exhausted"
        );
        assert_eq!(
            u["status"]["message"]["extensions"][0],
            "https://a2a-rust.com/extensions/failure/v1"
        );
        assert_eq!(
            u["metadata"]["error"],
            u["status"]["message"]["parts"][0]["text"]
        );
        assert_eq!(
            u["metadata"]["a2a-rust.com/budget"],
            json!({"remainingMs":0,"meters":{"tokens":10},"spent":{"tokens":12}})
        );
        let ts = u["status"]["timestamp"].as_str().unwrap();
        assert_eq!(ts.len(), "2026-12-02T14:37:35.123Z".len(), "{ts}");
        assert!(ts.starts_with("20") && ts.ends_with('Z'), "{ts}");
    }

    #[test]
    fn caller_identities() {
        // {"alg":"none"} . {"sub":"alice","iat":1} . sig
        let jwt = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSIsImlhdCI6MX0.c2ln";
        // `printf key-123 | sha256sum`
        let key = fingerprint("key-123");
        assert_eq!(key, "sha256:65803be0872fa538");
        let table = [
            ("key-123", "key-123", key.as_str()),
            (" key-123 ", "key-123", key.as_str()),
            (&*format!("Bearer {jwt}"), "alice", "alice"),
            (&*format!("bearer {jwt}"), "alice", "alice"),
            (
                "Bearer opaque-token",
                "Bearer opaque-token",
                &*fingerprint("Bearer opaque-token"),
            ),
            (
                "Bearer a.b.c",
                "Bearer a.b.c",
                &*fingerprint("Bearer a.b.c"),
            ),
        ];
        for (value, name, shown) in table {
            let c = caller_identity(value);
            assert_eq!(
                (c.name.as_str(), c.shown.as_str()),
                (name, shown),
                "{value}"
            );
            assert!(!c.shown.contains("key-123") && !c.shown.contains("opaque"));
        }
    }

    #[test]
    fn caps_merge_route_tenant_caller() {
        let caps = |ms: Option<u64>, m: &[(&str, u64)]| Caps {
            max_deadline_ms: ms,
            meters: m.iter().map(|&(k, v)| (k.to_owned(), v)).collect(),
        };
        let policy = config::BudgetPolicy {
            caps: caps(Some(60_000), &[("tokens", 1000)]),
            tenants: [("acme".to_owned(), caps(Some(10_000), &[]))].into(),
            callers: [("k1".to_owned(), caps(None, &[("tokens", 10)]))].into(),
            ..Default::default()
        };
        assert_eq!(
            caps_for(&policy, None, None),
            caps(Some(60_000), &[("tokens", 1000)])
        );
        assert_eq!(
            caps_for(&policy, Some("acme"), Some("k1")),
            caps(Some(10_000), &[("tokens", 10)])
        );
        assert_eq!(
            caps_for(&policy, Some("other"), Some("k2")),
            caps(Some(60_000), &[("tokens", 1000)])
        );
    }
}
