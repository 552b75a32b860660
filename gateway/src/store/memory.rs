//! The embedded store: one gateway process, no dependencies.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use moka::sync::Cache;
use policies::budget::Account;
use policies::lease::{self, Renewal};

use super::{
    AccountKey, AccountView, Asker, CancelTarget, ChildLink, LeaseRecord, OwedCancel, Owing,
    Renewals, Reservation, Shortfall, StoreError, TaskKey, TaskRecord, TaskStore, TaskUpdate,
    TreeBudget, Unreserved, LOCAL_OWNER,
};

/// Tracked tasks in a bounded in-process cache (moka). Records idle longer
/// than the retention are dropped; past capacity the least useful go first
/// (moka's TinyLFU), which at worst forgets a task and so skips its cancel:
/// size `limits.max_tracked_tasks` above the live tasks you expect.
///
/// Leases are indexed by deadline in an ordered set, so finding lapsed ones
/// is O(log n) per lease, never a scan.
/// Handed-back leases by when they are due, one time per task (a later
/// hand-back replaces the earlier, as a Redis sorted set's `ZADD` does).
#[derive(Debug, Default)]
struct Retries {
    due: BTreeSet<(u64, TaskKey)>,
    at: std::collections::HashMap<TaskKey, u64>,
}

impl Retries {
    fn set(&mut self, key: TaskKey, at_ms: u64) {
        if let Some(old) = self.at.insert(key.clone(), at_ms) {
            self.due.remove(&(old, key.clone()));
        }
        self.due.insert((at_ms, key));
    }

    fn remove(&mut self, key: &TaskKey) {
        if let Some(at) = self.at.remove(key) {
            self.due.remove(&(at, key.clone()));
        }
    }

    /// Takes up to `limit` entries due by `now_ms` of the `routes` given.
    fn take_due(&mut self, now_ms: u64, limit: usize, routes: &[Arc<str>]) -> Vec<TaskKey> {
        let due: Vec<(u64, TaskKey)> = self
            .due
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .filter(|(_, k)| routes.contains(&k.route))
            .take(limit)
            .cloned()
            .collect();
        for item in &due {
            self.due.remove(item);
            self.at.remove(&item.1);
        }
        due.into_iter().map(|(_, k)| k).collect()
    }
}

/// The owed cancels of this process (its outbox): one per task. Nobody
/// else can claim them: a process that dies loses them.
#[derive(Debug, Default)]
struct Outbox {
    entries: HashMap<TaskKey, Owed>,
    /// Handed-back entries by when they are due.
    due: Retries,
    tokens: u64,
}

#[derive(Debug)]
struct Owed {
    target: CancelTarget,
    cause: String,
    /// `""` once handed back.
    token: String,
    /// When it was written (Unix ms): given up after
    /// [`super::OUTBOX_RETENTION`], as Redis lets the task's hash expire.
    since_ms: u64,
}

impl Outbox {
    fn token(&mut self) -> String {
        self.tokens += 1;
        format!("{LOCAL_OWNER}#{}", self.tokens)
    }

    fn remove(&mut self, key: &TaskKey) {
        self.entries.remove(key);
        self.due.remove(key);
    }
}

/// How long the memory store keeps a task nobody has touched, at least.
pub const RETENTION: Duration = Duration::from_secs(3600);

/// How long the memory store keeps an untouched task: [`RETENTION`],
/// or longer than the longest lease a route allows plus a margin, so that a
/// lease whose caller died (nothing touches its task any more) lapses while
/// its task is still there to be cancelled.
pub fn retention(cfg: &config::Config) -> Duration {
    let longest = cfg.routes.iter().map(|r| r.lease.max_ttl).max();
    RETENTION.max(longest.unwrap_or_default() + Duration::from_secs(300))
}

#[derive(Debug)]
pub struct MemoryStore {
    tasks: Cache<TaskKey, TaskRecord>,
    /// (route, context id) → the replica of its first pinned task.
    contexts: Cache<(Arc<str>, Arc<str>), Arc<str>>,
    /// (deadline, task) for every live lease.
    deadlines: Mutex<BTreeSet<(u64, TaskKey)>>,
    /// Lapsed leases handed back (`lease_retry`, and each claim's hold).
    retries: Mutex<Retries>,
    /// Budget accounts, at most `max_accounts` live ones.
    accounts: Mutex<Accounts>,
    max_accounts: u64,
    /// Tickets settled lately, as Redis keeps them
    /// ([`super::TICKET_TOMBSTONE`]).
    tombstones: Mutex<Tombstones>,
    /// Owed cancels. Lock order: this one first, never taken while another
    /// of the store's locks (or a cache entry's) is held.
    outbox: Mutex<Outbox>,
    /// Parents' budgets by reference (hex), for their children.
    tree_budgets: Cache<String, Arc<Mutex<TreeBudget>>>,
    /// Delegation links: a reference (hex) → the children linked under it.
    links: Cache<String, Arc<Mutex<Vec<ChildLink>>>>,
    /// A child's reference (hex) → its parent's reference and its depth.
    parents: Cache<String, (Arc<str>, u8)>,
    /// The key references are minted with, made at start.
    link_key: Vec<u8>,
}

/// Settled tickets, forgotten after [`super::TICKET_TOMBSTONE`].
#[derive(Debug, Default)]
struct Tombstones {
    tickets: HashSet<String>,
    /// (when it is forgotten, ticket), oldest first.
    expiry: VecDeque<(u64, String)>,
}

impl Tombstones {
    fn prune(&mut self, now: u64) {
        while self.expiry.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, t)) = self.expiry.pop_front() {
                self.tickets.remove(&t);
            }
        }
    }

    fn add(&mut self, ticket: &str, now: u64) {
        if self.tickets.insert(ticket.to_string()) {
            let ttl = super::TICKET_TOMBSTONE.as_millis() as u64;
            self.expiry.push_back((now + ttl, ticket.to_string()));
        }
    }
}

/// The budget accounts: each meter's balance, and the live accounts.
#[derive(Debug, Default)]
struct Accounts {
    meters: BTreeMap<(AccountKey, String), Meter>,
    /// Every live account and when it may be forgotten (its meters' latest).
    open: HashMap<AccountKey, u64>,
    /// When expired accounts were last dropped.
    pruned_ms: u64,
}

impl Accounts {
    /// Drops expired accounts, at most once a second unless `now_please`:
    /// a walk of every account under the lock, which a reservation must
    /// not pay each time. An expired account lingering meanwhile is of a
    /// past window, which no reservation names again.
    fn prune(&mut self, now: u64, now_please: bool) {
        if !now_please && now < self.pruned_ms.saturating_add(1000) {
            return;
        }
        self.pruned_ms = now;
        self.meters.retain(|_, m| m.expires_ms > now);
        self.open.retain(|_, expires| *expires > now);
    }

    /// Counts `r`'s account as live until `r.expires_ms` at least.
    fn note(&mut self, r: &Reservation) {
        let e = self.open.entry(r.account.clone()).or_insert(0);
        *e = (*e).max(r.expires_ms);
    }
}

/// One meter of one budget account.
#[derive(Debug)]
struct Meter {
    balance: Account,
    /// When it may be forgotten, Unix ms.
    expires_ms: u64,
    /// The reservations it holds (their tickets), each settled once.
    tickets: HashSet<String>,
}

impl Meter {
    /// A meter first reserved from, or charged, by `r`.
    fn new(r: &Reservation) -> Self {
        Meter {
            balance: Account::new(r.limit),
            expires_ms: r.expires_ms,
            tickets: HashSet::new(),
        }
    }
}

impl MemoryStore {
    /// Keeps at most `max` live budget accounts (`limits.max_accounts`).
    pub fn with_max_accounts(mut self, max: u64) -> Self {
        self.max_accounts = max;
        self
    }

    pub fn new(capacity: u64, retention: Duration) -> Self {
        MemoryStore {
            tasks: Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(retention)
                .build(),
            contexts: Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(retention)
                .build(),
            deadlines: Mutex::new(BTreeSet::new()),
            retries: Mutex::new(Retries::default()),
            accounts: Mutex::new(Accounts::default()),
            max_accounts: config::Limits::default().max_accounts,
            tombstones: Mutex::new(Tombstones::default()),
            outbox: Mutex::new(Outbox::default()),
            links: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(super::LINK_RETENTION)
                .build(),
            tree_budgets: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(super::LINK_RETENTION)
                .build(),
            parents: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(super::LINK_RETENTION)
                .build(),
            link_key: crate::link::random_key(),
        }
    }

    fn outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the task's lease (see [`TaskStore::lease_end`]).
    fn end_lease(&self, key: &TaskKey) {
        self.retries().remove(key);
        // One atomic step on the entry (a read, then an insert, would undo an
        // update or a new lease that came in between); a missing task stays
        // missing.
        self.tasks.entry_by_ref(key).and_compute_with(|old| {
            let Some(entry) = old else {
                return moka::ops::compute::Op::Nop;
            };
            let mut rec = entry.into_value();
            match rec.lease.take() {
                Some(l) => {
                    self.index().remove(&(l.deadline_ms, key.clone()));
                    moka::ops::compute::Op::Put(rec)
                }
                None => moka::ops::compute::Op::Nop,
            }
        });
    }

    fn retries(&self) -> std::sync::MutexGuard<'_, Retries> {
        self.retries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn index(&self) -> std::sync::MutexGuard<'_, BTreeSet<(u64, TaskKey)>> {
        // A panic while holding the lock leaves the set consistent (every
        // operation on it is a single insert/remove), so poisoning is ignored.
        self.deadlines.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tombstones(&self) -> std::sync::MutexGuard<'_, Tombstones> {
        self.tombstones.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn accounts(&self) -> std::sync::MutexGuard<'_, Accounts> {
        // Every change under the lock is applied whole or not at all.
        self.accounts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Read-modify-write of one record, atomic per key; `f` returns a value
    /// for the caller. Index changes happen under the index lock inside `f`.
    fn modify<T>(
        &self,
        key: &TaskKey,
        now_ms: u64,
        f: impl FnOnce(&mut TaskRecord) -> T,
    ) -> (TaskRecord, T) {
        let mut out = None;
        let entry = self.tasks.entry_by_ref(key).and_upsert_with(|old| {
            let mut rec =
                old.map_or_else(|| TaskRecord::new(key.clone(), now_ms), |e| e.into_value());
            out = Some(f(&mut rec));
            rec
        });
        (entry.into_value(), out.expect("upsert ran the closure"))
    }
}

#[async_trait]
impl TaskStore for MemoryStore {
    async fn account_reserve(
        &self,
        asks: &[Reservation],
    ) -> Result<Result<(), Unreserved>, StoreError> {
        let now = super::now_ms();
        let mut tombstones = self.tombstones();
        tombstones.prune(now);
        let mut guard = self.accounts();
        guard.prune(now, false);
        // An ask whose ticket is held already, or was settled lately, is
        // not reserved again.
        let fresh: Vec<(usize, &Reservation)> = asks
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                !tombstones.tickets.contains(&a.ticket)
                    && guard
                        .meters
                        .get(&(a.account.clone(), a.meter.clone()))
                        .is_none_or(|m| !m.tickets.contains(&a.ticket))
            })
            .collect();
        drop(tombstones);
        // Accounts these asks would open, within the bound.
        let opens = |g: &Accounts| {
            let new: HashSet<&AccountKey> = fresh
                .iter()
                .map(|(_, a)| &a.account)
                .filter(|k| !g.open.contains_key(*k))
                .collect();
            g.open.len() + new.len()
        };
        let max = usize::try_from(self.max_accounts).unwrap_or(usize::MAX);
        if opens(&guard) > max {
            guard.prune(now, true);
            if opens(&guard) > max {
                return Ok(Err(Unreserved::Full {
                    max: self.max_accounts,
                }));
            }
        }
        let accounts = &mut *guard;
        // Check everything first (asks for one account and meter add up),
        // then apply: all or nothing.
        let mut trial: BTreeMap<(AccountKey, String), Account> = BTreeMap::new();
        for &(index, ask) in &fresh {
            let id = (ask.account.clone(), ask.meter.clone());
            let acct = trial.entry(id.clone()).or_insert_with(|| {
                let mut a = accounts
                    .meters
                    .get(&id)
                    .map_or(Account::new(ask.limit), |m| m.balance);
                a.limit = ask.limit;
                a
            });
            if let Err(e) = acct.reserve(ask.amount) {
                return Ok(Err(Unreserved::Short(Shortfall {
                    index,
                    left: e.left,
                })));
            }
        }
        for (_, ask) in fresh {
            accounts.note(ask);
            let id = (ask.account.clone(), ask.meter.clone());
            let m = accounts
                .meters
                .entry(id.clone())
                .or_insert_with(|| Meter::new(ask));
            if let Some(a) = trial.remove(&id) {
                m.balance = a;
            }
            m.expires_ms = m.expires_ms.max(ask.expires_ms);
            m.tickets.insert(ask.ticket.clone());
        }
        Ok(Ok(()))
    }

    async fn account_settle(&self, settled: &[(Reservation, u64)]) -> Result<(), StoreError> {
        let now = super::now_ms();
        let mut tombstones = self.tombstones();
        tombstones.prune(now);
        let mut accounts = self.accounts();
        for (r, charged) in settled {
            let id = (r.account.clone(), r.meter.clone());
            let held = accounts
                .meters
                .get_mut(&id)
                .is_some_and(|m| m.tickets.remove(&r.ticket));
            if !held && tombstones.tickets.contains(&r.ticket) {
                continue; // settled already
            }
            if held || *charged > 0 {
                accounts.note(r);
                let m = accounts.meters.entry(id).or_insert_with(|| Meter::new(r));
                // Not held: its reserve never landed (or was forgotten);
                // what it spent is charged all the same.
                m.balance
                    .settle(if held { r.amount } else { 0 }, Some(*charged));
            }
            tombstones.add(&r.ticket, now);
        }
        Ok(())
    }

    async fn account_list(&self, limit: usize) -> Result<Vec<AccountView>, StoreError> {
        let now = super::now_ms();
        Ok(self
            .accounts()
            .meters
            .iter()
            .filter(|(_, m)| m.expires_ms > now)
            .take(limit)
            .map(|((account, meter), m)| AccountView {
                account: account.clone(),
                meter: meter.clone(),
                balance: m.balance,
            })
            .collect())
    }

    async fn update(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<TaskRecord, StoreError> {
        let settled = update.state.is_some_and(|s| s.is_settled());
        let pin = update
            .pin_context
            .then(|| update.context_id.clone())
            .flatten();
        let (rec, ()) = self.modify(key, now_ms, |rec| {
            let before = rec.lease.as_ref().map(|l| l.deadline_ms);
            rec.apply(&key.tenant, update, now_ms);
            if let (Some(d), None) = (before, &rec.lease) {
                self.index().remove(&(d, key.clone()));
            }
        });
        if settled {
            // A settled task owes no cancel.
            self.outbox().remove(key);
        }
        if let (Some(context), Some(replica), true) =
            (pin, &rec.replica, rec.key.tenant == key.tenant)
        {
            // First wins; a later pin only keeps it alive (a read).
            self.contexts
                .entry((key.route.clone(), Arc::from(context)))
                .or_insert_with(|| Arc::from(replica.as_str()));
        }
        Ok(rec)
    }

    async fn get(&self, key: &TaskKey) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.tasks.get(key))
    }

    async fn context_replica(
        &self,
        route: &str,
        context_id: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(self
            .contexts
            .get(&(Arc::from(route), Arc::from(context_id)))
            .map(|r| r.to_string()))
    }

    async fn list(&self, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
        Ok(self.tasks.iter().take(limit).map(|(_, v)| v).collect())
    }

    async fn link_child(
        &self,
        parent: &str,
        child_ref: &str,
        child: &ChildLink,
    ) -> Result<bool, StoreError> {
        let kids = self
            .links
            .get_with_by_ref(parent, || Arc::new(Mutex::new(Vec::new())));
        let mut kids = kids.lock().unwrap_or_else(|p| p.into_inner());
        if kids.len() >= super::MAX_CHILDREN {
            return Ok(false);
        }
        kids.push(child.clone());
        self.parents
            .insert(child_ref.to_owned(), (parent.into(), child.depth));
        Ok(true)
    }

    async fn parent_of(&self, refs: &[String]) -> Result<Option<(String, u8)>, StoreError> {
        Ok(refs
            .iter()
            .find_map(|r| self.parents.get(r))
            .map(|(p, d)| (p.to_string(), d)))
    }

    async fn children(&self, parents: &[String]) -> Result<Vec<ChildLink>, StoreError> {
        let mut out = Vec::new();
        for p in parents {
            if let Some(kids) = self.links.get(p.as_str()) {
                out.extend(
                    kids.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .cloned(),
                );
            }
        }
        Ok(out)
    }

    async fn link_key(&self) -> Result<Vec<u8>, StoreError> {
        Ok(self.link_key.clone())
    }

    // One process holds a parent's budget and its children's in memory
    // ([`crate::budget`]); these keep the trait's contract for the
    // conformance suite (expiry: the cache's retention, not `expires_ms`).
    async fn tree_budget_open(
        &self,
        reference: &str,
        grant: &BTreeMap<String, u64>,
        parent: &ChildLink,
        _expires_ms: u64,
    ) -> Result<(), StoreError> {
        let b = self
            .tree_budgets
            .get_with_by_ref(reference, || Arc::new(Mutex::new(TreeBudget::default())));
        let mut b = b.lock().unwrap_or_else(|p| p.into_inner());
        b.grant.clone_from(grant);
        b.parent = Some(parent.clone());
        Ok(())
    }

    async fn tree_budget_get(&self, reference: &str) -> Result<Option<TreeBudget>, StoreError> {
        Ok(self.tree_budgets.get(reference).map(|b| {
            let mut b = b.lock().unwrap_or_else(|p| p.into_inner()).clone();
            b.stop = false;
            b
        }))
    }

    async fn tree_budget_charge(
        &self,
        reference: &str,
        grew: &BTreeMap<String, u64>,
    ) -> Result<TreeBudget, StoreError> {
        let b = self
            .tree_budgets
            .get_with_by_ref(reference, || Arc::new(Mutex::new(TreeBudget::default())));
        let mut b = b.lock().unwrap_or_else(|p| p.into_inner());
        for (m, n) in grew {
            *b.spent.entry(m.clone()).or_insert(0) += n;
        }
        let was_stopped = std::mem::take(&mut b.stop);
        let over = policies::budget::meters_over(&b.grant, &b.spent).is_some();
        // `stop` is kept set once found (the store's memory of it), and
        // answered only to the charge that found it.
        let mut out = b.clone();
        out.stop = over && !was_stopped;
        b.stop = was_stopped || over;
        Ok(out)
    }

    async fn lease_start(
        &self,
        key: &TaskKey,
        ttl_ms: u64,
        holder: Option<&str>,
        now_ms: u64,
        asker: &Asker,
    ) -> Result<(), StoreError> {
        if !asker.moves(&key.tenant, self.tasks.get(key).as_ref()) {
            return Ok(());
        }
        // A hand-back or claim hold of an earlier lease must not reap this one.
        self.retries().remove(key);
        self.modify(key, now_ms, |rec| {
            let mut index = self.index();
            if let Some(old) = &rec.lease {
                index.remove(&(old.deadline_ms, key.clone()));
            }
            let deadline_ms = lease::deadline(now_ms, ttl_ms);
            index.insert((deadline_ms, key.clone()));
            rec.lease = Some(LeaseRecord {
                ttl_ms,
                deadline_ms,
                holder: holder.map(str::to_string),
            });
            rec.updated_ms = now_ms;
        });
        Ok(())
    }

    async fn lease_renew(&self, key: &TaskKey, now_ms: u64) -> Result<Renewal, StoreError> {
        if !self.tasks.contains_key(key) {
            return Ok(Renewal::NoLease);
        }
        let (_, renewal) = self.modify(key, now_ms, |rec| {
            let mut index = self.index();
            let live = rec
                .lease
                .as_ref()
                .filter(|l| index.contains(&(l.deadline_ms, key.clone())))
                .map(|l| (l.deadline_ms, l.ttl_ms));
            let renewal = match (live, &rec.lease) {
                (None, Some(_)) => Renewal::NoLease, // claimed by the reaper already
                _ => lease::renew(now_ms, live),
            };
            if let (Renewal::Renewed { deadline_ms }, Some(l)) = (renewal, rec.lease.as_mut()) {
                index.remove(&(l.deadline_ms, key.clone()));
                index.insert((deadline_ms, key.clone()));
                l.deadline_ms = deadline_ms;
            }
            renewal
        });
        Ok(renewal)
    }

    async fn lease_renew_many(
        &self,
        keys: &[TaskKey],
        now_ms: u64,
    ) -> Result<Renewals, StoreError> {
        let mut out = Renewals::default();
        for (i, key) in keys.iter().enumerate() {
            if !self.tasks.contains_key(key) {
                out.lost.push(i);
            } else if let Renewal::Renewed { .. } = self.lease_renew(key, now_ms).await? {
                out.renewed += 1;
            }
        }
        Ok(out)
    }

    async fn lease_end(&self, key: &TaskKey) -> Result<(), StoreError> {
        self.end_lease(key);
        Ok(())
    }

    async fn lease_claim_lapsed(
        &self,
        now_ms: u64,
        limit: usize,
        hold_until_ms: u64,
        routes: &[Arc<str>],
    ) -> Result<Vec<TaskRecord>, StoreError> {
        // Held throughout (it comes first in the lock order): a task whose
        // cancel the outbox carries is not claimed for its lapse too.
        let outbox = self.outbox();
        let claimed: Vec<(u64, TaskKey)> = {
            let mut index = self.index();
            let lapsed: Vec<(u64, TaskKey)> = index
                .iter()
                .take_while(|(d, _)| lease::is_lapsed(now_ms, *d))
                .take(limit)
                .cloned()
                .collect();
            for item in &lapsed {
                index.remove(item);
            }
            lapsed
        };
        let mut out: Vec<TaskRecord> = claimed
            .into_iter()
            .filter(|(_, key)| !outbox.entries.contains_key(key))
            .filter_map(|(_, key)| self.tasks.get(&key))
            .collect();
        let mut retries = self.retries();
        if out.len() < limit {
            let due = retries.take_due(now_ms, limit - out.len(), routes);
            out.extend(
                due.into_iter()
                    .filter(|key| !outbox.entries.contains_key(key))
                    .filter_map(|key| self.tasks.get(&key))
                    .filter(|rec| rec.lease.is_some()),
            );
        }
        for rec in &out {
            retries.set(rec.key.clone(), hold_until_ms);
        }
        Ok(out)
    }

    async fn lease_retry(&self, key: &TaskKey, at_ms: u64) -> Result<(), StoreError> {
        if self.tasks.get(key).is_some_and(|rec| rec.lease.is_some()) {
            self.retries().set(key.clone(), at_ms);
        }
        Ok(())
    }

    async fn lease_count(&self) -> Result<u64, StoreError> {
        Ok(self.index().len() as u64)
    }

    async fn outbox_put(
        &self,
        key: &TaskKey,
        target: &CancelTarget,
        cause: &str,
        now_ms: u64,
    ) -> Result<Owing, StoreError> {
        let mut outbox = self.outbox();
        if outbox.entries.get(key).is_some_and(|e| !e.token.is_empty()) {
            return Ok(Owing::Elsewhere);
        }
        let rec = self.tasks.get(key);
        if rec
            .as_ref()
            .and_then(|r| r.state)
            .is_some_and(|s| s.is_settled())
        {
            return Ok(Owing::Settled);
        }
        // A lapse claim holds the task's lease (or handed it back for
        // later): that claim delivers the cancel.
        if rec.is_some_and(|r| r.lease.is_some())
            && self.retries().at.get(key).is_some_and(|at| *at > now_ms)
        {
            return Ok(Owing::Elsewhere);
        }
        let token = outbox.token();
        outbox.due.remove(key);
        outbox.entries.insert(
            key.clone(),
            Owed {
                target: target.clone(),
                cause: cause.to_string(),
                token: token.clone(),
                since_ms: now_ms,
            },
        );
        // The outbox carries the cancel now, not a lapse.
        self.end_lease(key);
        Ok(Owing::Mine(token))
    }

    async fn outbox_owns(&self, key: &TaskKey, token: &str) -> Result<bool, StoreError> {
        Ok(!token.is_empty()
            && self
                .outbox()
                .entries
                .get(key)
                .is_some_and(|e| e.token == token))
    }

    async fn outbox_done(&self, key: &TaskKey) -> Result<(), StoreError> {
        let mut outbox = self.outbox();
        outbox.remove(key);
        self.end_lease(key);
        Ok(())
    }

    async fn outbox_retry(
        &self,
        key: &TaskKey,
        token: &str,
        at_ms: u64,
    ) -> Result<bool, StoreError> {
        let mut outbox = self.outbox();
        match outbox.entries.get_mut(key) {
            Some(e) if !token.is_empty() && e.token == token => {
                e.token.clear();
                outbox.due.set(key.clone(), at_ms);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn outbox_claim(
        &self,
        now_ms: u64,
        limit: usize,
        routes: &[Arc<str>],
    ) -> Result<Vec<OwedCancel>, StoreError> {
        // This process holds every entry not handed back: only hand-backs
        // that are due can be claimed.
        let mut outbox = self.outbox();
        let due = outbox.due.take_due(now_ms, limit, routes);
        let retention = super::OUTBOX_RETENTION.as_millis() as u64;
        let mut out = Vec::new();
        for key in due {
            let settled = self
                .tasks
                .get(&key)
                .and_then(|r| r.state)
                .is_some_and(|s| s.is_settled());
            let token = outbox.token();
            let Some(e) = outbox.entries.get_mut(&key) else {
                continue;
            };
            if settled || e.since_ms.saturating_add(retention) < now_ms {
                outbox.entries.remove(&key);
                continue;
            }
            e.token.clone_from(&token);
            out.push(OwedCancel {
                key,
                target: e.target.clone(),
                cause: e.cause.clone(),
                owner: LOCAL_OWNER.to_string(),
                token,
            });
        }
        Ok(out)
    }

    async fn outbox_get(&self, key: &TaskKey) -> Result<Option<OwedCancel>, StoreError> {
        Ok(self.outbox().entries.get(key).map(|e| OwedCancel {
            key: key.clone(),
            target: e.target.clone(),
            cause: e.cause.clone(),
            owner: if e.token.is_empty() {
                String::new()
            } else {
                LOCAL_OWNER.to_string()
            },
            token: e.token.clone(),
        }))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    /// Every method is synchronous code behind an `async` signature.
    fn completes_at_once(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn conformance() {
        let store = MemoryStore::new(1000, Duration::from_secs(60));
        super::super::conformance::run(&store).await;
        let bounded = MemoryStore::new(1000, Duration::from_secs(60)).with_max_accounts(3);
        super::super::conformance::account_bound(&bounded, 3).await;
    }
}
