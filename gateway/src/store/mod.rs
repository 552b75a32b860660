//! Where tracked-task state lives between hooks, requests and replicas.
//!
//! The trait is narrow on purpose: one read-modify-write (`update`) that a
//! Redis implementation does as one atomic script, one read, and a listing
//! for the admin endpoint. Callers' credentials and message contents are
//! never stored.

pub mod clock;
pub mod memory;
pub mod redis;
pub mod timed;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
pub use policies::lease::Renewal;
use policies::TaskState;

use crate::a2a::Binding;

/// A task as the gateway names it: the route it went through and the
/// worker's task id. The tenant travels with the key but is not part of
/// its identity (equality, order, hash and the store's key leave it out):
/// in a key read from the store it is the tenant the task was first
/// recorded in, which the gateway's own cancels use; in a key built from a
/// request it is the tenant the caller named, which the store compares
/// with the recorded one ([`policies::owner::moves_state`]). A tenant is a
/// caller's word, and a worker may ignore it on lookup: were it part of the
/// identity, naming another tenant would make a second, ownerless record
/// of someone else's task.
#[derive(Clone, Debug)]
pub struct TaskKey {
    pub route: Arc<str>,
    pub tenant: Arc<str>,
    pub task_id: Arc<str>,
}

impl PartialEq for TaskKey {
    fn eq(&self, other: &Self) -> bool {
        self.route == other.route && self.task_id == other.task_id
    }
}

impl Eq for TaskKey {}

impl std::hash::Hash for TaskKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.route.hash(state);
        self.task_id.hash(state);
    }
}

impl PartialOrd for TaskKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TaskKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.route, &self.task_id).cmp(&(&other.route, &other.task_id))
    }
}

impl TaskKey {
    /// The key of `task_id` sent through `route` in `tenant` (none is `""`).
    pub fn new(route: &Arc<str>, tenant: Option<&str>, task_id: impl Into<Arc<str>>) -> Self {
        TaskKey {
            route: route.clone(),
            tenant: tenant.unwrap_or("").into(),
            task_id: task_id.into(),
        }
    }

    pub fn tenant(&self) -> Option<&str> {
        (!self.tenant.is_empty()).then_some(&*self.tenant)
    }
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.route, self.tenant, self.task_id)
    }
}

/// How the gateway reaches the worker to cancel a task: the binding the
/// caller used and the worker path it used it on (the JSON-RPC endpoint, or
/// the REST base path below which `/{tenant}/tasks/{id}:cancel` lives).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelTarget {
    pub binding: Binding,
    pub path: String,
}

/// What the store holds about one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    pub key: TaskKey,
    pub context_id: Option<String>,
    pub state: Option<TaskState>,
    pub target: Option<CancelTarget>,
    /// Callers streaming the task through the gateway right now (any replica).
    pub watchers: u32,
    /// The lease the gateway enforces on the task, while it is unsettled.
    pub lease: Option<LeaseRecord>,
    /// Unix milliseconds of the last update.
    pub updated_ms: u64,
    /// The verified identity that started the task (`jwt:<sub>`,
    /// `key:<name>`), on a route with `[routes.auth]`: only its requests
    /// move the task's gateway state ([`policies::owner`]). `None`: no owner.
    pub owner: Option<String>,
    /// The worker (replica) that took the task's send, by its configured
    /// `host:port`, recorded on every route: on a route with several
    /// `workers` every later call and cancel for the task goes there, and
    /// a task recorded on a worker its route no longer names is lost.
    pub replica: Option<String>,
    /// The message of the send that started the task, as the gateway saw
    /// it: what the task's delegation reference was made of
    /// ([`crate::link`]), so that its children are found when it lapses,
    /// even when its worker can no longer be asked.
    pub message_id: Option<String>,
}

/// A lease the gateway enforces: who holds it and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    pub ttl_ms: u64,
    /// Unix milliseconds; lapsed once `now > deadline_ms`.
    pub deadline_ms: u64,
    /// The gateway replica renewing it for a live caller connection
    /// (gateway-held lease), or `None` when the caller renews it.
    pub holder: Option<String>,
}

/// One change to a task's record; absent fields keep their value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskUpdate {
    pub context_id: Option<String>,
    pub state: Option<TaskState>,
    pub target: Option<CancelTarget>,
    /// Added to `watchers` (saturating at zero), unless `asker` may not
    /// move the state of a task whose owner is someone else.
    pub watchers_delta: i32,
    /// The identity that started the task; recorded if the record has no
    /// owner yet (a send's first update).
    pub owner: Option<String>,
    /// Who the update is for (the caller whose stream it counts).
    pub asker: Asker,
    /// The replica that took the send; recorded if the record has none.
    pub replica: Option<String>,
    /// Routes with several workers: the record's replica also becomes its
    /// context's ([`TaskStore::context_replica`]; the first task recorded
    /// in a context wins), when the update names the context and comes
    /// from the record's tenant.
    pub pin_context: bool,
    /// The message of the send that started the task; recorded if the
    /// record has none.
    pub message_id: Option<String>,
}

/// Who an update is for, as [`policies::owner::Asker`] names it, owned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Asker {
    /// A route without `[routes.auth]` (and the gateway's own updates).
    #[default]
    Unverified,
    Anonymous,
    Identity(Arc<str>),
}

impl Asker {
    pub fn as_policy(&self) -> policies::owner::Asker<'_> {
        match self {
            Asker::Unverified => policies::owner::Asker::Unverified,
            Asker::Anonymous => policies::owner::Asker::Anonymous,
            Asker::Identity(id) => policies::owner::Asker::Identity(id),
        }
    }

    /// Whether this asker, naming the task in `tenant` (`""` for none),
    /// may move the state of `rec` (no record: yes).
    pub fn moves(&self, tenant: &str, rec: Option<&TaskRecord>) -> bool {
        rec.is_none_or(|r| {
            policies::owner::moves_state(
                r.owner.as_deref(),
                &r.key.tenant,
                self.as_policy(),
                tenant,
            )
        })
    }
}

/// One account in one window: a tenant's, a caller's or a route's meter
/// totals, reset when the window ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccountKey {
    pub route: Arc<str>,
    /// Whose account: `route`, `tenant` or `caller`.
    pub scope: Arc<str>,
    /// The tenant or caller it belongs to (`""` for the route's own).
    pub holder: Arc<str>,
    /// Unix ms at which its window started.
    pub window_start_ms: u64,
}

impl fmt::Display for AccountKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.route, self.scope)?;
        if !self.holder.is_empty() {
            write!(f, "/{}", self.holder)?;
        }
        Ok(())
    }
}

/// An amount of one meter held for a child from one account, from its
/// start until it settles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub account: AccountKey,
    pub meter: String,
    pub amount: u64,
    /// The account's limit for the meter, as configured when reserving.
    pub limit: u64,
    /// Unix ms after which the store may forget the account (its window's
    /// end plus slack for late settlements).
    pub expires_ms: u64,
    /// Unique to this reservation across replicas and restarts. The store
    /// reserves a ticket once and settles it once (a settled ticket is
    /// remembered for a while and not reserved again): a settlement can be
    /// retried, and a reservation whose answer was lost (a timeout after
    /// the store applied it) can be withdrawn without knowing whether it
    /// was applied.
    pub ticket: String,
}

/// A reservation that did not fit: which one (index into the asks) and
/// what its account had left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub index: usize,
    pub left: u64,
}

/// Why [`TaskStore::account_reserve`] reserved nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreserved {
    /// An ask did not fit its account.
    Short(Shortfall),
    /// The asks would open more live accounts than the store keeps
    /// (`limits.max_accounts`): refused rather than grown, since a caller
    /// named by a header it chooses could open one for every name.
    Full { max: u64 },
}

/// One meter of one account, for the admin endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountView {
    pub account: AccountKey,
    pub meter: String,
    pub balance: policies::budget::Account,
}

/// A `CancelTask` the gateway owes a task, as the store's outbox holds it
/// ([`TaskStore::outbox_put`]): from the decision until the worker answered
/// it (canceled, not cancelable, not found) or the task is known settled.
/// What the call needs besides the route's config: the binding and worker
/// path the caller used, and why. Never the caller's headers: a cancel
/// another replica claims carries only what the route's config gives
/// ([`crate::cancel::cancel_headers`] with no caller headers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwedCancel {
    pub key: TaskKey,
    pub target: CancelTarget,
    /// Why it is owed (`caller_gone`, `stream_lost`), for logs and metrics.
    pub cause: String,
    /// The replica process that holds it now (Redis: its heartbeat key's
    /// `{id}`; memory: `"local"`), `""` once handed back for a later claim.
    pub owner: String,
    /// Proves who holds it: set afresh by each put and claim, cleared by a
    /// hand-back ([`TaskStore::outbox_owns`]).
    pub token: String,
}

/// A send the gateway linked as a child of the request whose reference it
/// carried (delegation trees, [`crate::link`]): what a tree cancel needs to
/// find its task and cancel it, without the caller's headers (a child's
/// cancel carries what the route's config gives, as a claimed cancel does).
/// Its task is found by its message in the worker's `ListTasks`, as a
/// guarded blocking send's child is: a link is written before its answer,
/// which a passed send's is never read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildLink {
    pub route: Arc<str>,
    /// The tenant the send named (`""`: none).
    pub tenant: Arc<str>,
    /// The sent message's id.
    pub message_id: String,
    /// Where its cancel goes.
    pub target: CancelTarget,
    /// The worker (replica) that took the send, by its `host:port`.
    pub replica: Option<String>,
    /// When the send arrived (Unix ms): the search by message starts there.
    pub sent_ms: u64,
    /// Its depth in its tree (its parent's plus one).
    pub depth: u8,
}

/// What [`TaskStore::lease_renew_many`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Renewals {
    pub renewed: usize,
    /// Indexes (into the keys asked) of tasks the store has no record of:
    /// it lost them (a failover that lost writes, a restart without
    /// persistence, an eviction), though a live caller still holds the
    /// lease ([`crate::lease`] starts them again).
    pub lost: Vec<usize>,
}

/// A budgeted parent's meters as the store keeps them for children on
/// any replica ([`TaskStore::tree_budget_charge`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeBudget {
    /// The parent's grant, per meter (empty until opened).
    pub grant: BTreeMap<String, u64>,
    /// What the parent and every child charged to it spent, per meter.
    pub spent: BTreeMap<String, u64>,
    /// How to find and cancel the parent's task (once opened).
    pub parent: Option<ChildLink>,
    /// This charge is the first that found `spent` past `grant`: its
    /// replica stops the parent.
    pub stop: bool,
}

/// The most children kept under one reference; later links are dropped
/// (counted: `a2agw_tree_links_total{outcome="dropped"}`).
pub const MAX_CHILDREN: usize = 4096;

/// How long a link is kept after it was written: as long as an unsettled
/// task's record ([`OUTBOX_RETENTION`], Redis's live TTL).
pub const LINK_RETENTION: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// What [`TaskStore::outbox_put`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owing {
    /// This replica owes the cancel now: the token proves it in
    /// [`TaskStore::outbox_owns`] and [`TaskStore::outbox_retry`].
    Mine(String),
    /// The cancel is carried already: a live replica (this one included)
    /// holds the task's owed cancel, or a lapse claim of its lease holds it
    /// (or will try it again): that one delivers it.
    Elsewhere,
    /// The store knows the task settled: no cancel is owed.
    Settled,
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

/// The claim-token owner a store only this process uses writes.
pub const LOCAL_OWNER: &str = "local";

/// A store that could not answer.
#[derive(Debug)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// The tracked-task state, shared by every hook and background service.
#[async_trait]
pub trait TaskStore: Send + Sync + fmt::Debug + 'static {
    /// Applies `update` to the task's record (creating it), atomically with
    /// respect to every other replica sharing the store; returns the result.
    async fn update(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<TaskRecord, StoreError>;

    /// [`TaskStore::update`] for a writer that does not read the record
    /// back (the tracker, which writes every task a stream sees): a store
    /// may skip building it (Redis: no `HGETALL` in the script, and a reply
    /// of one integer).
    async fn write(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.update(key, update, now_ms).await.map(|_| ())
    }

    /// The task's record, if the store holds one.
    async fn get(&self, key: &TaskKey) -> Result<Option<TaskRecord>, StoreError>;

    /// The worker replica of the first task recorded in `context_id` on
    /// `route` with [`TaskUpdate::pin_context`]: where a send continuing
    /// the context goes. Kept as long as a task record is, from the last
    /// task recorded in the context.
    async fn context_replica(
        &self,
        route: &str,
        context_id: &str,
    ) -> Result<Option<String>, StoreError>;

    /// Up to `limit` records, for the admin endpoint (order unspecified).
    async fn list(&self, limit: usize) -> Result<Vec<TaskRecord>, StoreError>;

    /// Starts (or restarts, replacing) a lease on the task: deadline
    /// `now + ttl`, entered in the deadline index. Creates the record if the
    /// store has none. Does nothing when `asker`, naming the task in
    /// `key.tenant`, may not move the state of the record there is
    /// ([`Asker::moves`]): a lease someone else could let lapse would
    /// cancel the owner's task.
    async fn lease_start(
        &self,
        key: &TaskKey,
        ttl_ms: u64,
        holder: Option<&str>,
        now_ms: u64,
        asker: &Asker,
    ) -> Result<(), StoreError>;

    /// Renews the task's lease by its TTL, in one atomic step against a
    /// racing lapse: a lease already past its deadline is not revived.
    async fn lease_renew(&self, key: &TaskKey, now_ms: u64) -> Result<Renewal, StoreError>;

    /// Renews many leases in one round trip (a replica renewing the leases it
    /// holds for its live callers): how many were renewed, and which keys
    /// the store holds no record of at all.
    async fn lease_renew_many(&self, keys: &[TaskKey], now_ms: u64)
        -> Result<Renewals, StoreError>;

    /// Ends the task's lease (it settled, or it was cancelled).
    async fn lease_end(&self, key: &TaskKey) -> Result<(), StoreError>;

    /// Takes up to `limit` lapsed leases out of the deadline index (of any
    /// route), then handed-back ones due by `now_ms` of the `routes` the
    /// caller has (see [`TaskStore::lease_retry`]), and returns their
    /// records. Atomic: across every replica sharing the store, each lapsed
    /// lease is returned to exactly one caller. Each is also handed back for
    /// `hold_until_ms`, so that it is claimed again (by a replica with its
    /// route) if its claimer dies before ending it ([`TaskStore::lease_end`])
    /// or handing it back sooner.
    ///
    /// Handed-back leases are claimed by route so that a replica that lacks
    /// a route (an older config mid rolling deploy) cannot take a lease it
    /// handed back again before a replica with the route does: claims race
    /// on each replica's tick, and the hander, whose clock and tick phase
    /// may always come first, starved the others.
    async fn lease_claim_lapsed(
        &self,
        now_ms: u64,
        limit: usize,
        hold_until_ms: u64,
        routes: &[Arc<str>],
    ) -> Result<Vec<TaskRecord>, StoreError>;

    /// Hands a lapsed lease claimed by [`TaskStore::lease_claim_lapsed`]
    /// back for another claim at `at_ms` (its cancel failed, or the claiming
    /// replica lacks its route), by a replica that has its route, without
    /// reviving it: renewals still find no lease. Does nothing once the task
    /// or its lease is gone.
    async fn lease_retry(&self, key: &TaskKey, at_ms: u64) -> Result<(), StoreError>;

    /// Live leases in the deadline index (for metrics and the admin endpoint).
    async fn lease_count(&self) -> Result<u64, StoreError>;

    /// Reserves every ask from its account, all or nothing, atomically with
    /// respect to every replica: either each account had room for its ask
    /// and all are now reserved, or none is and the first that had not is
    /// returned. An ask whose ticket the store holds, or settled lately, is
    /// not reserved again. Nothing is reserved either when the asks would
    /// open more live accounts than the store keeps. One round trip.
    async fn account_reserve(
        &self,
        asks: &[Reservation],
    ) -> Result<Result<(), Unreserved>, StoreError>;

    /// Ends reservations: each is taken off its account's reserved total and
    /// `charged` is added to its spent total (the spend the child reported,
    /// the whole reservation when it reported none, 0 when the send was
    /// refused). Each ticket is settled once; one the store does not hold
    /// (its reserve never landed, or the store lost it) is still charged
    /// `charged`. One round trip.
    async fn account_settle(&self, settled: &[(Reservation, u64)]) -> Result<(), StoreError>;

    /// Up to `limit` account meters in live windows, for the admin endpoint.
    async fn account_list(&self, limit: usize) -> Result<Vec<AccountView>, StoreError>;

    /// Writes the task's owed cancel to the outbox, held by this replica,
    /// before its first attempt: `target` and `cause` are what another
    /// replica needs to send it ([`OwedCancel`]). Atomic: an entry a live
    /// replica holds, or a lease a lapse claim holds or handed back for
    /// later, is left alone ([`Owing::Elsewhere`]: that one delivers it);
    /// one handed back, or whose holder is gone, is taken over; a task the
    /// store knows settled owes nothing ([`Owing::Settled`]). Taking it
    /// ends the task's lease: from now on the outbox carries the cancel, not
    /// a lapse, so the two never both send it. One round trip.
    async fn outbox_put(
        &self,
        key: &TaskKey,
        target: &CancelTarget,
        cause: &str,
        now_ms: u64,
    ) -> Result<Owing, StoreError>;

    /// Whether the task's owed cancel is still held with `token`: checked
    /// before each retry, so that a replica stops once another claimed it or
    /// it was removed (the task settled). One round trip.
    async fn outbox_owns(&self, key: &TaskKey, token: &str) -> Result<bool, StoreError>;

    /// The task's owed cancel is settled (the worker answered it, or the
    /// task is known settled): removed, whoever holds it, and the task's
    /// lease ended with it ([`TaskStore::lease_end`]). One round trip.
    async fn outbox_done(&self, key: &TaskKey) -> Result<(), StoreError>;

    /// Hands the task's owed cancel back, if still held with `token`, to be
    /// claimed at `at_ms` by any replica with its route (its every attempt
    /// failed); returns whether it was. One round trip.
    async fn outbox_retry(
        &self,
        key: &TaskKey,
        token: &str,
        at_ms: u64,
    ) -> Result<bool, StoreError>;

    /// Claims up to `limit` owed cancels of the `routes` given whose holder
    /// is gone (its heartbeat key expired, or it stopped) or that were
    /// handed back and are due by `now_ms`, each with a fresh token held by
    /// this replica. Atomic: across every replica each is claimed by one.
    /// Entries of tasks known settled are dropped. One round trip.
    async fn outbox_claim(
        &self,
        now_ms: u64,
        limit: usize,
        routes: &[Arc<str>],
    ) -> Result<Vec<OwedCancel>, StoreError>;

    /// The task's owed cancel, if the outbox holds one (tests, admin).
    async fn outbox_get(&self, key: &TaskKey) -> Result<Option<OwedCancel>, StoreError>;

    /// Records `child` under the reference `parent` (hex), and `parent`
    /// as the parent of the child's own reference `child_ref` (what
    /// [`TaskStore::parent_of`] reads): one round trip, at most
    /// [`MAX_CHILDREN`] per reference (returns `false`, recording nothing,
    /// when the reference holds that many already), kept
    /// [`LINK_RETENTION`].
    async fn link_child(
        &self,
        parent: &str,
        child_ref: &str,
        child: &ChildLink,
    ) -> Result<bool, StoreError>;

    /// The parent reference (hex) and depth recorded for the first of
    /// `refs` that has one (the admin endpoint's `/tasks/{id}`).
    async fn parent_of(&self, refs: &[String]) -> Result<Option<(String, u8)>, StoreError>;

    /// The children linked under any of `parents` (references, hex), in
    /// the order they were linked. One round trip.
    async fn children(&self, parents: &[String]) -> Result<Vec<ChildLink>, StoreError>;

    /// Opens (or completes) the budget a parent request holds, under its
    /// reference (hex), for the children it starts through other replicas
    /// ([`crate::budget`]): its grant's meters and where its task runs
    /// (`parent`, found by its message as a tree's child is). Kept until
    /// `expires_ms` (Unix ms). Spend already charged is kept. One round trip.
    async fn tree_budget_open(
        &self,
        reference: &str,
        grant: &BTreeMap<String, u64>,
        parent: &ChildLink,
        expires_ms: u64,
    ) -> Result<(), StoreError>;

    /// A parent's budget as every replica charged it, if the store holds it.
    async fn tree_budget_get(&self, reference: &str) -> Result<Option<TreeBudget>, StoreError>;

    /// Adds `grew` (per meter) to what the parent's budget under
    /// `reference` has spent, and reads it back: one round trip, atomic
    /// with respect to every replica. A charge that arrives before the
    /// budget was opened is kept ([`LINK_RETENTION`]) and counted once it
    /// is. `stop` in the answer is set for exactly one charge: the first
    /// that found the spend past the grant.
    async fn tree_budget_charge(
        &self,
        reference: &str,
        grew: &BTreeMap<String, u64>,
    ) -> Result<TreeBudget, StoreError>;

    /// The key every replica sharing the store mints references with
    /// ([`crate::link`]): made once, by the first replica to ask (Redis
    /// `SET NX`); a store only this process uses makes one for itself.
    async fn link_key(&self) -> Result<Vec<u8>, StoreError>;

    /// Marks this replica alive for a few seconds (Redis:
    /// [`redis::REPLICA_TTL`]): the watchers it records count for other
    /// replicas only meanwhile, so that the streams of a replica that died
    /// stop keeping tasks alive. Sent every [`HEARTBEAT_EVERY`] by the lease
    /// service. A store only this process uses has nothing to do.
    async fn replica_alive(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// This replica is about to stop with streams still open (the end of a
    /// drain): its watchers stop counting now rather than when the
    /// heartbeat runs out, and later heartbeats are not sent.
    async fn replica_gone(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Unix ms by the clock lease deadlines, claim holds and budget windows
    /// are judged by: every `now_ms` passed to this store comes from here.
    /// A store shared by replicas answers with its own clock as this
    /// replica estimates it (Redis: [`clock`]), so that replicas whose wall
    /// clocks disagree still agree on when a lease lapsed; a store only this
    /// process uses, with the local clock.
    fn clock_ms(&self) -> u64 {
        now_ms()
    }

    /// `memory` or `redis`, for logs and metrics.
    fn kind(&self) -> &'static str;

    /// Whether every call completes on its first poll, without I/O or
    /// waiting (a store in this process's memory). The tracker then applies
    /// its writes where they are made instead of queueing them for its
    /// background loop: a queued write wakes that loop's thread, two or
    /// three system calls per tracked stream, more than the write itself
    /// costs.
    fn completes_at_once(&self) -> bool {
        false
    }
}

/// How long a store remembers a settled reservation's ticket (Redis:
/// `{ns}:ticket:{ticket}`, one per reserved meter of each child settled
/// lately): longer than a settlement is retried for and than a reserve can
/// be in flight (both bounded by the Redis call timeout per attempt), short
/// enough that they stay few. Like every Redis key of the gateway's, they
/// need a Redis that does not evict (`maxmemory-policy noeviction`, the
/// default).
pub const TICKET_TOMBSTONE: std::time::Duration = std::time::Duration::from_secs(120);

/// How long an owed cancel is kept at most ([`TaskStore::outbox_put`]),
/// handed back and claimed again every
/// [`crate::cancel::RETRY_FAILED_CANCEL`] while its every attempt fails:
/// Redis keeps it in the task's hash, which expires this long after the
/// task's last write ([`redis::LIVE_TTL`]); the memory store drops it then.
pub const OUTBOX_RETENTION: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// How often a replica tells the store it is alive
/// ([`TaskStore::replica_alive`]).
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl TaskRecord {
    /// A record for a task seen for the first time.
    pub fn new(key: TaskKey, now_ms: u64) -> Self {
        TaskRecord {
            key,
            context_id: None,
            state: None,
            target: None,
            watchers: 0,
            lease: None,
            updated_ms: now_ms,
            owner: None,
            replica: None,
            message_id: None,
        }
    }

    /// Applies an update; the one definition every store shares.
    /// `tenant`: the tenant the update's key names (the asker's); a record
    /// keeps the tenant it was created with.
    pub fn apply(&mut self, tenant: &str, u: TaskUpdate, now_ms: u64) {
        if u.context_id.is_some() {
            self.context_id = u.context_id;
        }
        // A terminal state is final: a late non-terminal report never undoes it.
        if let Some(s) = u.state {
            if !self.state.is_some_and(TaskState::is_terminal) {
                self.state = Some(s);
            }
            // A settled turn is no longer watched for a lapse (the SDK stops
            // watching when the turn ends; a continuation brings its own grant).
            if s.is_settled() {
                self.lease = None;
            }
        }
        // A request naming the task in another tenant than its record's
        // claims nothing: no owner, no cancel target, no watcher.
        if *self.key.tenant != *tenant {
            self.updated_ms = now_ms;
            return;
        }
        if u.target.is_some() {
            self.target = u.target;
        }
        if self.owner.is_none() {
            self.owner = u.owner;
        }
        if self.replica.is_none() {
            self.replica = u.replica;
        }
        if self.message_id.is_none() {
            self.message_id = u.message_id;
        }
        if policies::owner::moves_state(
            self.owner.as_deref(),
            &self.key.tenant,
            u.asker.as_policy(),
            tenant,
        ) {
            self.watchers = self.watchers.saturating_add_signed(u.watchers_delta);
        }
        self.updated_ms = now_ms;
    }
}

/// Whether the store answered its last calls, as seen by this replica's
/// background loops (the lease reaper calls it every tick, so this is a
/// heartbeat). `on_store_error` decides what requests do while it is down.
#[derive(Debug)]
pub struct StoreHealth {
    healthy: std::sync::atomic::AtomicBool,
}

impl Default for StoreHealth {
    fn default() -> Self {
        StoreHealth {
            healthy: std::sync::atomic::AtomicBool::new(true),
        }
    }
}

impl StoreHealth {
    /// Records the outcome of a store call; logs transitions.
    pub fn record<T>(&self, result: &Result<T, StoreError>) {
        let ok = result.is_ok();
        let was = self.healthy.swap(ok, std::sync::atomic::Ordering::Relaxed);
        match (was, result) {
            (true, Err(e)) => tracing::error!(error = %e, "the store stopped answering"),
            (false, Ok(_)) => tracing::info!("the store answers again"),
            _ => {}
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The store conformance suite every implementation passes: built for the
/// crate's own tests and, through the `conformance` feature, for the
/// integration tests (which turn it on); never in the release binary.
#[cfg(any(test, feature = "conformance"))]
#[doc(hidden)]
pub mod conformance;
