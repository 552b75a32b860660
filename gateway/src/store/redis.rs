//! The shared store: several gateway replicas on one Redis: a server
//! (`redis://`, `rediss://`), the primary Sentinel names
//! (`redis+sentinel://`), or a Redis Cluster (`redis+cluster://`,
//! `rediss+cluster://`).
//!
//! # Shards
//!
//! The keys a script changes together are in one *shard*, `{P}` below. On a
//! single server there is one, and `{P}` is the namespace. On a cluster
//! there are [`CLUSTER_SHARDS`], and shard `i`'s `{P}` is `{ns}:{tag}` with
//! a hash tag chosen so that the shards' slots spread evenly over the slot
//! space ([`shard_tag`]), hence over the primaries: every script touches
//! one slot, and no one key (the lease index, an outbox) is hot. A task is
//! in the shard a hash of its route and id names (its record, lease, owed
//! cancel, and their index entries); a budget account in its route's (a
//! send reserves on its route's accounts only, in one script). The
//! delegation keys, the context pins and the link key are single keys,
//! each in its own slot. A replica heartbeats into every shard (a script
//! reads liveness from its own shard's key), and claims lapses and owed
//! cancels from every shard at once: first counting what each has due, so
//! that one tick's claims stay within its batch ([`RedisStore::shares`]).
//!
//! # Key layout
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `{P}:task:{route}:{task_id}` | hash | one [`TaskRecord`]; its `tenant` field is the tenant it was first recorded in (a task is one record whatever tenant a caller names it in: [`TaskKey`]) |
//! | `{P}:leases` | sorted set | member = a task key, score = its lease deadline (Unix ms) |
//! | `{P}:leases:retry:{route}` | sorted set | the route's lapsed leases handed back for another claim (and the holds of claimed ones), score = when; claimed only by replicas that have the route; expires a day after its last hand-back |
//! | `{P}:leases:retry` | sorted set | the same for every route, as written before they were kept per route: still claimed, no longer written |
//! | `{P}:outbox:{route}` | sorted set | the route's owed cancels (member = a task key whose hash holds the `ob_*` fields), score = when a claimer next looks at it: the earliest its holder's heartbeat could run out, or when a hand-back is due; claimed only by replicas that have the route; expires a day after its last write |
//! | `{P}:replica:{id}` | string | present while replica process `{id}` (`leases.replica_id`, `@` its start time) is alive: set every second with a 6 s expiry ([`REPLICA_TTL`]) |
//! | `{P}:acct:{route}:{per}:{holder}:{window_start}` | hash | one budget account in one window: `limit:{meter}`, `spent:{meter}`, `reserved:{meter}`, `route`, `scope`, `holder`, `window`, and `t:{ticket}` per reservation not yet settled (its amount); expires an hour after its window ends |
//! | `{P}:accounts` | sorted set | every live account hash of the shard (member: its key), score = when it expires: bounds them at `limits.max_accounts` per shard |
//! | `{P}:ticket:{ticket}` | string | a reservation settled in the last [`super::TICKET_TOMBSTONE`]: its settlement is not applied twice, nor its reserve after it |
//! | `{ns}:ctx:{route}:{context}` | string | the replica of a context's first pinned task (routes with several workers) |
//! | `{ns}:kids:{reference}` | list | the delegation links under a request's reference (JSON each, at most [`super::MAX_CHILDREN`]); expires a day after its last link |
//! | `{ns}:parent:{reference}` | string | a linked child's parent reference and depth (`"{hex} {depth}"`), for `/tasks/{id}`; expires a day after it was linked |
//! | `{ns}:link-key` | string | the key every replica mints delegation references with (hex), made by the first replica to start |
//!
//! Route and task id are percent-encoded (everything but
//! `A-Z a-z 0-9 - . _ ~`), so a `:` in any of them cannot make two tasks
//! share a key. The hash has one field per record field: `route`, `tenant`,
//! `task_id`, `context_id`, `state` (the wire name, `TASK_STATE_*`),
//! `binding` (`jsonrpc`/`rest`) and `target_path`, `updated_ms`, `owner`,
//! `replica`, `message_id` (the send that started the task),
//! `lease_ttl`, `lease_deadline`, `lease_holder`, the owed cancel's
//! `ob_owner` (the replica process holding it, `""` once handed back),
//! `ob_token`, `ob_binding`, `ob_path` and `ob_cause`, and `w:{replica}`: the
//! streams replica `{replica}` watches the task with. A missing or unreadable
//! field reads as `None`/`0`; bad data never panics.
//!
//! A record's `watchers` is read as the sum of the `w:` fields of replica
//! processes whose `{P}:replica:{id}` key still exists: one that crashed
//! (or was cut at the end of its drain) with streams open stops counting
//! within [`REPLICA_TTL`], so those streams no longer keep a task alive for
//! ever against the cascade of a caller that resubscribed elsewhere and
//! left. `{id}` names the process, not only the replica, so that a replica
//! restarted under a fixed `replica_id` does not revive its dead streams.
//! A `watchers` field (written by versions before these fields) still
//! counts, so that a rolling upgrade does not drop the old replicas'
//! watchers.
//!
//! Finding lapsed leases is one `ZRANGEBYSCORE` on the deadline index,
//! O(log n + claimed), never a scan.
//!
//! # Atomicity
//!
//! Every read-modify-write that replicas can race on is one Lua script
//! (sent as `EVALSHA`), so Redis runs it without interleaving: `update`,
//! `lease_start`, `lease_renew`, `lease_renew_many`, `lease_end`,
//! `lease_claim_lapsed`, `account_reserve` (all of a child's reservations or
//! none), `account_settle`, and the outbox's `outbox_put`, `outbox_done`,
//! `outbox_retry`, `outbox_claim`. An owed cancel is claimed only once its
//! holder's heartbeat key is gone (or it was handed back), inside the
//! script that hands it a new token, so across replicas each is claimed by
//! one; its former holder, if alive after all, finds its token gone before
//! its next retry and stops. A claim takes each lease out of the index inside the
//! script, so across replicas each lapsed lease goes to exactly one claimer,
//! and a renewal that races a claim either renews (and the claim no longer
//! sees a lapsed lease) or finds the lease gone (`NoLease`) — never both.
//!
//! # Round trips
//!
//! Each [`TaskStore`] call is one round trip: one `EVALSHA` or one
//! command (`ZCARD`, the outbox's `HGET` and `HMGET`, and the heartbeat's
//! `SET` or `DEL`); none for an empty batch or a zero limit. Exceptions:
//! an update that pins a context adds one (`SET NX`), as does a link's
//! parent key; on a cluster the calls that span shards (renewals, claims,
//! heartbeats, `lease_count`) send one per shard at once, and the claims
//! count first (one more). A cascade's
//! cancel adds two (the outbox's put before the first attempt, its removal,
//! which ends the task's lease too, after the answer: before the outbox the
//! lease's end was one), plus one per retry (`outbox_owns`); none per
//! streamed event. Each replica claims owed cancels once per lease tick (one
//! `EVALSHA`).
//! A task costs a constant number of calls over its lifetime (start, settle,
//! lease start/renew/end), and none per streamed event. Only after Redis lost its script cache (a restart) does the first
//! call of each script cost a second trip to load it (`SCRIPT LOAD`).
//! `list` (admin only) walks the keyspace with `SCAN … MATCH {P}:task:*`
//! inside one script per step, shard by shard (on a cluster each on the
//! node that has the shard), stopping at `limit` records.
//!
//! # Expiry
//!
//! Every write refreshes the hash's `PEXPIRE`: [`LIVE_TTL`] while the task is
//! unsettled or holds a lease, [`SETTLED_RETENTION`] once it settled
//! (terminal, input-required, auth-required) without a lease. Nothing is
//! left behind forever.
//!
//! # Failure
//!
//! The connection is a [`ConnectionManager`], which reconnects by itself with
//! a short backoff. Connecting and each answer time out after a second, and
//! every call is bounded by [`CALL_TIMEOUT`] on top, so a dead server makes
//! calls fail fast with a [`StoreError`] instead of hanging.
//! On a cluster the client follows `MOVED`/`ASK` and a failover's new
//! primary by itself; calls in flight on a primary that died fail as
//! above. What a failover can lose, and what the gateway does about it:
//! `docs/operations.md`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use policies::lease::{self, Renewal};
use policies::TaskState;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

use super::clock::{self, StoreClock};
use super::{
    AccountKey, AccountView, Asker, CancelTarget, ChildLink, LeaseRecord, OwedCancel, Owing,
    Renewals, Reservation, Shortfall, StoreError, TaskKey, TaskRecord, TaskStore, TaskUpdate,
    TreeBudget, Unreserved,
};
use crate::a2a::classify::percent_encode_segment;
use crate::a2a::Binding;
use crate::metrics;

/// How long a task's hash lives after its last write while it is unsettled
/// (or holds a lease).
pub const LIVE_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a settled task's hash lives after its last write.
pub const SETTLED_RETENTION: Duration = Duration::from_secs(10 * 60);
/// Upper bound on one store call, reconnecting included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on one connection attempt.
const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on one answer from the server.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on [`RedisStore::connect`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a replica counts as alive after its last heartbeat
/// ([`TaskStore::replica_alive`], sent every [`super::HEARTBEAT_EVERY`]):
/// room for three missed beats and a slow call ([`CALL_TIMEOUT`]) before a
/// live replica's streams would stop counting.
pub const REPLICA_TTL: Duration = Duration::from_secs(6);

/// A replica whose clock is this far off the server's says so in its log
/// (once, when the estimate first crosses it). Nothing breaks: every
/// replica judges deadlines by the server's clock.
const CLOCK_WARN_MS: i64 = 1000;

/// Lua numbers are doubles: integers above this are not exact. Times and
/// TTLs are clamped to it (it is some 285,000 years of Unix milliseconds).
const MAX_EXACT: u64 = (1 << 53) - 1;

/// Helpers every script starts with. `{TERMINAL}`, `{SETTLED}`, `{LIVE_MS}`,
/// `{SETTLED_MS}`, `{NS}` (the namespace, a Lua string) and
/// `{TOMBSTONE_MS}` are filled in from Rust, in the prelude and the script
/// after it ([`fill`]).
const PRELUDE: &str = include_str!("lua/prelude.lua");

/// KEYS: task, its shard's leases, the route's outbox in its shard. ARGV:
/// now, route, tenant, task_id, has_context, context, state (`""` = none),
/// has_target, binding, path, watchers_delta, replica (its `w:` field
/// takes the delta), owner, asker kind, asker id, the worker replica that
/// took the send (`""` none; kept once set), the send's message id, quiet
/// (`1`: answer `1`, not the record). A record keeps the tenant it was
/// created with; an update naming another changes only the state. Returns
/// the record (`record`). The context's pin is the caller's next call
/// ([`RedisStore::pin_context`]): the context's key is in its own slot.
const UPDATE: &str = include_str!("lua/update.lua");

/// KEYS: task. The record (`record`), `{}` when there is none.
const GET: &str = include_str!("lua/get.lua");

/// KEYS: task, leases, lease retries (as written before retries were kept
/// per route), the route's lease retries. ARGV: now, deadline, ttl,
/// has_holder, holder, route, tenant, task_id, asker kind, asker id. Does
/// nothing (0) for an asker that may not move the task's state. A hand-back
/// or claim hold of an earlier lease of the task is dropped: it must not
/// reap this one.
const LEASE_START: &str = include_str!("lua/lease_start.lua");

/// KEYS: task, leases. ARGV: now. Returns -1 (no lease), -2 (lapsed) or the
/// new deadline.
const LEASE_RENEW: &str = include_str!("lua/lease_renew.lua");

/// KEYS: leases, task… ARGV: now. Returns how many were renewed.
const LEASE_RENEW_MANY: &str = include_str!("lua/lease_renew_many.lua");

/// KEYS: task, leases, lease retries (before retries were kept per route),
/// the route's lease retries.
const LEASE_END: &str = include_str!("lua/lease_end.lua");

/// KEYS: leases, lease retries (as written before retries were kept per
/// route), then the lease retries of each route the claimer has. ARGV: now,
/// limit, hold until. Lapsed = deadline < now,
/// strictly, any route; then handed-back leases due by now, of the
/// claimer's routes, whose task still holds a lease. Each claimed one is
/// handed back for `hold until` into its route's retries (its claimer ends
/// it or hands it back sooner). Returns the claimed records (`record`); an
/// entry whose hash is gone is dropped.
const LEASE_CLAIM: &str = include_str!("lua/lease_claim.lua");

/// KEYS: task, its route's lease retries. ARGV: retry at. Only while the
/// task holds a lease; the deadline index is not touched, so renewals find
/// none. The route's set expires a day after its last hand-back, so that the
/// hand-backs of a route no replica has any more do not stay forever.
const LEASE_RETRY: &str = include_str!("lua/lease_retry.lua");

/// ARGV: cursor, MATCH pattern, how many records at most. One `SCAN` step
/// (`COUNT 1000`), so that a listing never holds Redis for a walk of the
/// whole keyspace (the admin port's `/tasks` and `/budgets` match few keys
/// among many): returns `{next cursor, record…}`; the caller steps until
/// the cursor is `0` or it has enough.
const LIST: &str = include_str!("lua/list.lua");

/// KEYS: one account hash per ask, then the live accounts' index. ARGV:
/// n, then per ask meter, amount, limit, expires_at, route, scope, holder,
/// window, ticket, then now and the most live accounts. All or nothing:
/// returns `{-1, "0"}` when every ask was reserved, `{-2, "0"}` when they
/// would open more accounts than that, else `{index, left}` of the first
/// that did not fit (asks on one account and meter add up). An
/// ask whose ticket the account holds (`t:{ticket}`) or that was settled
/// lately (`{ns}:ticket:{ticket}`) is skipped: a reserve that lands after
/// its own withdrawal reserves nothing.
const ACCOUNT_RESERVE: &str = include_str!("lua/account_reserve.lua");

/// KEYS: one account hash per settlement. ARGV per settlement: meter,
/// reserved, limit, expires_at, route, scope, holder, window, ticket,
/// charged. A settlement applies once: the ticket's reservation is taken
/// off (if the account holds it) and `charged` added to the spend, and a
/// tombstone (`{ns}:ticket:{ticket}`, [`super::TICKET_TOMBSTONE`]) makes a retry
/// of it, or a reserve of the ticket landing late, change nothing. A
/// ticket the account never held (its reserve never landed, or the account
/// was lost with a Redis restart) is still charged.
const ACCOUNT_SETTLE: &str = include_str!("lua/account_settle.lua");

/// KEYS: task, leases, lease retries (before retries were kept per route),
/// the route's lease retries, the route's outbox. ARGV: now, route, tenant,
/// task_id, owner (this replica), token, binding, path, cause, look again
/// (ms). Returns 1 (written, held by owner), 0 (a live holder or a lapse
/// claim carries it: nothing written) or 2 (the task is settled: nothing
/// owed). Writing it ends the task's lease.
const OUTBOX_PUT: &str = include_str!("lua/outbox_put.lua");

/// KEYS: task, leases, lease retries (before retries were kept per route),
/// the route's lease retries, the route's outbox. Removes the owed cancel
/// and the task's lease.
const OUTBOX_DONE: &str = include_str!("lua/outbox_done.lua");

/// KEYS: task, the route's outbox. ARGV: token, retry at. Only while held
/// with `token`: returns 1, else 0.
const OUTBOX_RETRY: &str = include_str!("lua/outbox_retry.lua");

/// KEYS: the outbox of each route the claimer has. ARGV: now, limit, owner
/// (the claimer), token, look again (ms). Entries due by now: dropped when
/// the task is settled or gone; re-scored to when the holder's heartbeat
/// key would run out when it lives; else claimed (owner and token set, next
/// look after `look again`). Returns `{route, tenant, task_id, binding,
/// path, cause}` per claimed entry.
const OUTBOX_CLAIM: &str = include_str!("lua/outbox_claim.lua");

/// Links a child under a reference, bounded ([`TaskStore::link_child`]).
const LINK_CHILD: &str = include_str!("lua/link_child.lua");

/// Charges a parent's budget, once-only stop ([`TaskStore::tree_budget_charge`]).
const TREE_CHARGE: &str = include_str!("lua/tree_charge.lua");

#[derive(Debug)]
struct Scripts {
    account_reserve: Script,
    account_settle: Script,
    update: Script,
    lease_start: Script,
    lease_renew: Script,
    lease_renew_many: Script,
    lease_end: Script,
    lease_claim: Script,
    lease_retry: Script,
    list: Script,
    get: Script,
    outbox_put: Script,
    outbox_done: Script,
    outbox_retry: Script,
    outbox_claim: Script,
    link_child: Script,
    tree_charge: Script,
}

/// How long a route's set of handed-back leases lives after its last
/// hand-back: a route no replica has any more leaves its hand-backs
/// unclaimed (claims are by route), and they go with the set.
const RETRIES_TTL: Duration = Duration::from_secs(24 * 3600);

/// A script (the prelude and a body) with the state sets, retention and
/// the namespace (`NS`, from which the prelude's `shard` finds the prefix
/// of a key's shard) filled in.
fn fill(text: &str, namespace: &str) -> String {
    let lua_set = |pred: fn(TaskState) -> bool| {
        let mut s = String::from("{");
        for st in TaskState::ALL.into_iter().filter(|s| pred(*s)) {
            let _ = write!(s, "['{}']=true,", st.as_wire());
        }
        s.push('}');
        s
    };
    text.replace("{TERMINAL}", &lua_set(TaskState::is_terminal))
        .replace("{SETTLED}", &lua_set(TaskState::is_settled))
        .replace("{LIVE_MS}", &LIVE_TTL.as_millis().to_string())
        .replace("{SETTLED_MS}", &SETTLED_RETENTION.as_millis().to_string())
        .replace(
            "{TOMBSTONE_MS}",
            &super::TICKET_TOMBSTONE.as_millis().to_string(),
        )
        .replace("{RETRIES_TTL_MS}", &RETRIES_TTL.as_millis().to_string())
        // The namespace last: nothing in it is taken for a placeholder.
        .replace("{NS}", &lua_string(namespace))
}

/// `s` as a Lua string literal.
fn lua_string(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:03}");
            }
        }
    }
    out.push('"');
    out
}

impl Scripts {
    fn new(namespace: &str) -> Self {
        let script = |body: &str| Script::new(&fill(&format!("{PRELUDE}{body}"), namespace));
        Scripts {
            account_reserve: script(ACCOUNT_RESERVE),
            account_settle: script(ACCOUNT_SETTLE),
            update: script(UPDATE),
            lease_start: script(LEASE_START),
            lease_renew: script(LEASE_RENEW),
            lease_renew_many: script(LEASE_RENEW_MANY),
            lease_end: script(LEASE_END),
            lease_claim: script(LEASE_CLAIM),
            lease_retry: script(LEASE_RETRY),
            list: script(LIST),
            get: script(GET),
            outbox_put: script(OUTBOX_PUT),
            outbox_done: script(OUTBOX_DONE),
            outbox_retry: script(OUTBOX_RETRY),
            outbox_claim: script(OUTBOX_CLAIM),
            link_child: script(LINK_CHILD),
            tree_charge: script(TREE_CHARGE),
        }
    }
}

/// How many shards a Redis Cluster's per-task keys are spread over: the
/// lease deadline index, the outbox and the accounts are one set per shard,
/// so that every script touches one hash slot, no one key is hot, and the
/// shards spread over the primaries ([`shard_tag`]). Standalone Redis has
/// one, with the key names of a single server. Fixed: changing it would
/// move every key.
pub const CLUSTER_SHARDS: usize = 16;

/// Redis Cluster's hash slots.
const SLOTS: usize = 16_384;

/// One shard's keys: every key a script touches together starts with its
/// prefix, which holds the shard's hash tag on a cluster.
#[derive(Debug)]
struct Shard {
    /// The namespace, and on a cluster `:{tag}`.
    prefix: String,
    /// `{prefix}:leases`: the deadline index of the shard's tasks.
    leases: String,
    /// `{prefix}:leases:retry`: lapsed leases handed back for another claim,
    /// as versions before the per-route sets wrote them: still claimed from
    /// and cleared, no longer written.
    retries: String,
    /// `{prefix}:accounts`: the shard's live accounts.
    accounts: String,
    /// `{prefix}:replica:{id}`: this process's heartbeat in the shard.
    replica_key: String,
}

/// The connection every call goes through: one server's (standalone, or
/// the primary Sentinel names), or a cluster's, whose client routes each
/// command by its key's slot and follows `MOVED`/`ASK` and topology changes
/// by itself.
#[derive(Clone)]
enum Conn {
    One(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::One(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::One(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::One(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Tracked tasks in Redis, shared by every replica on the same namespace.
pub struct RedisStore {
    /// The server's or cluster's connection; swapped when Sentinel names
    /// another primary ([`follow_primary`]).
    conn: Arc<std::sync::RwLock<Conn>>,
    namespace: String,
    /// One on a single server, [`CLUSTER_SHARDS`] on a cluster.
    shards: Vec<Shard>,
    /// Numbers this replica's outbox tokens.
    tokens: std::sync::atomic::AtomicU64,
    /// This process's `{id}` (its heartbeat keys' and its `w:` field's).
    replica: String,
    /// Set by `replica_gone`: no more heartbeats. Held across a heartbeat's
    /// check and `SET`, and across `replica_gone`'s `DEL`, so that no
    /// heartbeat lands after the key is deleted.
    gone: tokio::sync::Mutex<bool>,
    scripts: Scripts,
    /// The server's clock as this replica sees it, from each heartbeat's
    /// `TIME`: what every replica judges deadlines by.
    clock: StoreClock,
    /// At most this many live accounts (`limits.max_accounts`) in each
    /// shard's index.
    max_accounts: u64,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://[user:pass@]host:port/db`, or `rediss://`
    /// over TLS with the system's roots) and keeps every key under
    /// `namespace`, as replica `"default"` (see [`RedisStore::connect_as`]).
    /// Fails if the server cannot be reached now.
    pub async fn connect(url: &str, namespace: &str) -> Result<RedisStore, StoreError> {
        RedisStore::connect_as(url, namespace, "default").await
    }

    /// [`RedisStore::connect`] as replica `replica` (`leases.replica_id`):
    /// the watchers it records count only while it sends heartbeats
    /// ([`TaskStore::replica_alive`]); this sends the first. They are this
    /// connection's own (`{replica}@{now}`): after a restart under the same
    /// `replica_id` the dead process's watchers stay dead.
    pub async fn connect_as(
        url: &str,
        namespace: &str,
        replica: &str,
    ) -> Result<RedisStore, StoreError> {
        RedisStore::connect_with(url, &config::Store::default(), namespace, replica).await
    }

    /// [`RedisStore::connect_as`] with the `[store]` settings beyond its URL:
    /// the password from `password_env` or `password_file` (in place of the
    /// URL's), and for `rediss://` the CA certificates to trust
    /// (`tls_ca_file`; else the system's roots) and a client certificate.
    /// Errors show neither the URL nor the password.
    pub async fn connect_with(
        url: &str,
        settings: &config::Store,
        namespace: &str,
        replica: &str,
    ) -> Result<RedisStore, StoreError> {
        let bad_url = |why: String| StoreError(format!("redis: bad url: {why}"));
        let (conn, follow) = match (
            config::SentinelUrl::parse(url),
            config::ClusterUrl::parse(url),
        ) {
            (Some(Err(why)), _) | (_, Some(Err(why))) => return Err(bad_url(why)),
            (Some(Ok(sentinels)), _) => {
                let primary = primary_of(&sentinels).await?;
                let url = sentinels.data_url(&primary.0, primary.1);
                let conn = Conn::One(manager(&url, settings).await?);
                (conn, Some((sentinels, primary)))
            }
            (_, Some(Ok(nodes))) => {
                if namespace.contains(['{', '}']) {
                    return Err(bad_url(format!(
                        "on a Redis Cluster the namespace {namespace:?} cannot hold {{ or }}: they would choose the keys' hash slot"
                    )));
                }
                (Conn::Cluster(cluster(&nodes, settings).await?), None)
            }
            (None, None) => (Conn::One(manager(url, settings).await?), None),
        };
        let cluster = matches!(conn, Conn::Cluster(_));
        let conn = Arc::new(std::sync::RwLock::new(conn));
        if let Some((sentinels, primary)) = follow {
            tokio::spawn(follow_primary(
                Arc::downgrade(&conn),
                sentinels,
                primary,
                settings.clone(),
            ));
        }
        let replica = pct(&format!("{replica}@{}", super::now_ms()));
        let prefixes = if cluster {
            (0..CLUSTER_SHARDS)
                .map(|i| format!("{namespace}:{{{}}}", shard_tag(i, CLUSTER_SHARDS)))
                .collect()
        } else {
            vec![namespace.to_owned()]
        };
        let shards = prefixes
            .into_iter()
            .map(|prefix| Shard {
                leases: format!("{prefix}:leases"),
                retries: format!("{prefix}:leases:retry"),
                accounts: format!("{prefix}:accounts"),
                replica_key: format!("{prefix}:replica:{replica}"),
                prefix,
            })
            .collect();
        let store = RedisStore {
            conn,
            namespace: namespace.to_string(),
            shards,
            tokens: std::sync::atomic::AtomicU64::new(0),
            replica,
            gone: tokio::sync::Mutex::new(false),
            scripts: Scripts::new(namespace),
            clock: StoreClock::default(),
            max_accounts: config::Limits::default().max_accounts,
        };
        store.replica_alive().await?;
        Ok(store)
    }

    /// Keeps at most `max` live budget accounts (`limits.max_accounts`).
    pub fn with_max_accounts(mut self, max: u64) -> Self {
        self.max_accounts = max;
        self
    }

    /// The namespace every key starts with.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The shard a task's keys are in: the same for every replica (a hash
    /// of its route and id), so that its record, lease, owed cancel and
    /// their indexes are in one slot.
    fn task_shard(&self, key: &TaskKey) -> &Shard {
        self.shard_of(&[key.route.as_bytes(), &[0xff], key.task_id.as_bytes()])
    }

    /// The shard a route's budget accounts are in: every account one send
    /// reserves on is its route's, so one script reserves them all.
    fn route_shard(&self, route: &str) -> &Shard {
        self.shard_of(&[route.as_bytes()])
    }

    /// The shard the CRC16 of `parts` (one after another) picks; the only
    /// one on a single server.
    fn shard_of(&self, parts: &[&[u8]]) -> &Shard {
        let n = self.shards.len();
        if n == 1 {
            return &self.shards[0];
        }
        let mut h = crc16::State::<crc16::XMODEM>::new();
        for p in parts {
            h.update(p);
        }
        &self.shards[usize::from(h.get()) % n]
    }

    /// The Redis key of a task's hash.
    pub fn task_key(&self, key: &TaskKey) -> String {
        RedisStore::task_key_in(self.task_shard(key), key)
    }

    /// [`Self::task_key`] of a task in `shard` (its [`Self::task_shard`]).
    fn task_key_in(shard: &Shard, key: &TaskKey) -> String {
        format!(
            "{}:task:{}:{}",
            shard.prefix,
            pct(&key.route),
            pct(&key.task_id)
        )
    }

    /// The Redis key of an account's hash (one field set per meter:
    /// `limit:{m}`, `spent:{m}`, `reserved:{m}`).
    pub fn account_key(&self, a: &AccountKey) -> String {
        format!(
            "{}:acct:{}:{}:{}:{}",
            self.route_shard(&a.route).prefix,
            pct(&a.route),
            pct(&a.scope),
            pct(&a.holder),
            a.window_start_ms
        )
    }

    /// A reservation's key and its 9 arguments to the account scripts:
    /// meter, amount, limit, expires_at, route, scope, holder, window,
    /// ticket.
    fn reservation_args(&self, inv: &mut redis::ScriptInvocation<'_>, a: &Reservation) {
        inv.key(self.account_key(&a.account))
            .arg(&a.meter)
            .arg(a.amount.min(MAX_EXACT))
            .arg(a.limit.min(MAX_EXACT))
            .arg(a.expires_ms.min(MAX_EXACT))
            .arg(&*a.account.route)
            .arg(&*a.account.scope)
            .arg(&*a.account.holder)
            .arg(a.account.window_start_ms)
            .arg(&a.ticket);
    }

    /// The Redis key of a route's handed-back leases in `shard` (claimed
    /// only by replicas that have the route).
    fn retry_key(shard: &Shard, route: &str) -> String {
        format!("{}:leases:retry:{}", shard.prefix, pct(route))
    }

    /// The Redis key of a route's owed cancels in `shard`.
    fn outbox_in(shard: &Shard, route: &str) -> String {
        format!("{}:outbox:{}", shard.prefix, pct(route))
    }

    /// The Redis key of the outbox a task's owed cancel would be in.
    pub fn outbox_key(&self, key: &TaskKey) -> String {
        RedisStore::outbox_in(self.task_shard(key), &key.route)
    }

    /// The Redis key of a context's replica (a string): where a send
    /// continuing the context goes, on a route with several workers.
    pub fn context_key(&self, route: &str, context_id: &str) -> String {
        format!("{}:ctx:{}:{}", self.namespace, pct(route), pct(context_id))
    }

    /// The Redis key of a child's parent reference and depth.
    pub fn parent_key(&self, reference: &str) -> String {
        format!("{}:parent:{}", self.namespace, pct(reference))
    }

    /// The Redis key of a parent's budget, kept for its children.
    pub fn tree_budget_key(&self, reference: &str) -> String {
        format!("{}:tree-budget:{}", self.namespace, pct(reference))
    }

    /// The Redis key of a reference's children (a list of JSON links).
    pub fn kids_key(&self, reference: &str) -> String {
        format!("{}:kids:{}", self.namespace, pct(reference))
    }

    /// This replica's process id as the outbox names holders (its
    /// heartbeat key's `{id}`).
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// A token no other put or claim has used: this process's id and a
    /// count.
    fn token(&self) -> String {
        let n = self
            .tokens
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}#{n}", self.replica)
    }

    /// The keys a task's lease scripts take: the task, its shard's lease
    /// index, both lease retry sets of its shard.
    fn lease_keys(&self, inv: &mut redis::ScriptInvocation<'_>, key: &TaskKey) -> &Shard {
        let shard = self.task_shard(key);
        inv.key(RedisStore::task_key_in(shard, key))
            .key(&shard.leases)
            .key(&shard.retries)
            .key(RedisStore::retry_key(shard, &key.route));
        shard
    }

    /// The keys `outbox_put` and `outbox_done` take: [`Self::lease_keys`]
    /// and the route's outbox in the task's shard.
    fn outbox_keys(&self, inv: &mut redis::ScriptInvocation<'_>, key: &TaskKey) {
        let shard = self.lease_keys(inv, key);
        inv.key(RedisStore::outbox_in(shard, &key.route));
    }

    /// The Redis key of the lease deadline index a task's lease is in.
    pub fn leases_key(&self, key: &TaskKey) -> &str {
        &self.task_shard(key).leases
    }

    /// Whether this store is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.shards.len() > 1
    }

    /// Up to `limit` hashes whose keys, after a shard's prefix, match
    /// `pattern` (`task:*`), shard by shard, one bounded `SCAN` step per
    /// round trip (see [`LIST`]). On a cluster each shard's step runs on
    /// the node that has the shard: the script is sent with a key of it.
    async fn scan_hashes(
        &self,
        op: &str,
        pattern: &str,
        limit: usize,
    ) -> Result<Vec<Value>, StoreError> {
        let limit = limit.min(MAX_EXACT as usize);
        let mut out = Vec::new();
        for shard in &self.shards {
            if out.len() >= limit {
                break;
            }
            let pattern = format!("{}:{pattern}", glob_escape(&shard.prefix));
            self.scan_shard(op, shard, &pattern, limit, &mut out)
                .await?;
        }
        Ok(out)
    }

    /// [`Self::scan_hashes`] in one shard, adding to `out` up to `limit`.
    async fn scan_shard(
        &self,
        op: &str,
        shard: &Shard,
        pattern: &str,
        limit: usize,
        out: &mut Vec<Value>,
    ) -> Result<(), StoreError> {
        let mut cursor = "0".to_string();
        loop {
            let mut inv = self.scripts.list.prepare_invoke();
            inv.key(&shard.leases)
                .arg(&cursor)
                .arg(pattern)
                .arg(limit - out.len());
            let v: Value = self
                .call(op, |mut c| async move { inv.invoke_async(&mut c).await })
                .await?;
            let Value::Array(mut items) = v else {
                return Err(StoreError(format!(
                    "redis {op}: expected a list, got {v:?}"
                )));
            };
            if items.is_empty() {
                return Err(StoreError(format!("redis {op}: no cursor")));
            }
            let next = text_of(&items.remove(0))
                .ok_or_else(|| StoreError(format!("redis {op}: a cursor that is not text")))?;
            out.extend(items);
            if next == "0" || out.len() >= limit {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// The update script for `key`; with `quiet`, it answers `1` instead
    /// of the record.
    async fn run_update(
        &self,
        key: &TaskKey,
        update: &TaskUpdate,
        now_ms: u64,
        quiet: bool,
    ) -> Result<Value, StoreError> {
        let shard = self.task_shard(key);
        let mut inv = self.scripts.update.prepare_invoke();
        inv.key(RedisStore::task_key_in(shard, key))
            .key(&shard.leases)
            .key(RedisStore::outbox_in(shard, &key.route));
        inv.arg(now_ms.min(MAX_EXACT))
            .arg(&*key.route)
            .arg(&*key.tenant)
            .arg(&*key.task_id)
            .arg(u8::from(update.context_id.is_some()))
            .arg(update.context_id.as_deref().unwrap_or(""))
            .arg(update.state.map_or("", TaskState::as_wire))
            .arg(u8::from(update.target.is_some()))
            .arg(update.target.as_ref().map_or("", |t| t.binding.as_str()))
            .arg(update.target.as_ref().map_or("", |t| t.path.as_str()))
            .arg(update.watchers_delta)
            .arg(&self.replica)
            .arg(update.owner.as_deref().unwrap_or(""))
            .arg(asker_kind(&update.asker))
            .arg(asker_id(&update.asker))
            .arg(update.replica.as_deref().unwrap_or(""))
            .arg(update.message_id.as_deref().unwrap_or(""))
            .arg(u8::from(quiet));
        self.call(
            "update",
            |mut c| async move { inv.invoke_async(&mut c).await },
        )
        .await
    }

    /// [`TaskStore::lease_renew_many`] of tasks in the shard of lease
    /// index `leases`: `lost` indexes `keys`.
    async fn renew_in_shard(
        &self,
        leases: &str,
        keys: &[&TaskKey],
        now_ms: u64,
    ) -> Result<Renewals, StoreError> {
        let mut inv = self.scripts.lease_renew_many.prepare_invoke();
        inv.key(leases);
        for key in keys {
            inv.key(self.task_key(key));
        }
        inv.arg(now_ms.min(MAX_EXACT));
        let v: Value = self
            .call("lease_renew_many", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        let bad = || StoreError(format!("redis lease_renew_many: unexpected answer {v:?}"));
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        let mut ints = items.iter().map(int_of);
        let renewed = ints.next().flatten().filter(|n| *n >= 0).ok_or_else(bad)?;
        let lost = ints
            .map(|i| {
                i.and_then(|i| usize::try_from(i).ok())
                    .filter(|i| *i < keys.len())
            })
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(bad)?;
        Ok(Renewals {
            renewed: renewed as usize,
            lost,
        })
    }

    /// Makes `replica` the context's, unless it has one (which is kept
    /// alive): where a send continuing the context goes.
    async fn pin_context(
        &self,
        route: &str,
        context_id: &str,
        replica: &str,
    ) -> Result<(), StoreError> {
        let k = self.context_key(route, context_id);
        let live = LIVE_TTL.as_millis() as u64;
        self.call("pin_context", |mut c| async move {
            redis::pipe()
                .cmd("SET")
                .arg(&k)
                .arg(replica)
                .arg("NX")
                .arg("PX")
                .arg(live)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&k)
                .arg(live)
                .ignore()
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }

    /// How many of `limit` claims to ask of each shard: all of it on a
    /// single server; on a cluster, what each shard has due (one `ZCOUNT`
    /// per sorted set `due` names with its highest due score, every shard
    /// at once), given out shard by shard from a place that turns with
    /// each call, so that the claims stay within `limit` and no shard waits
    /// behind the others for ever.
    async fn shares(
        &self,
        op: &str,
        limit: usize,
        due: impl Fn(&Shard) -> Vec<(String, String)>,
    ) -> Result<Vec<usize>, StoreError> {
        let n = self.shards.len();
        if n == 1 {
            return Ok(vec![limit]);
        }
        let counts = self.shards.iter().map(|shard| {
            let sets = due(shard);
            self.call(op, |mut c| async move {
                let mut pipe = redis::pipe();
                for (key, max) in &sets {
                    pipe.cmd("ZCOUNT").arg(key).arg("-inf").arg(max);
                }
                pipe.query_async::<Vec<u64>>(&mut c).await
            })
        });
        let counts = futures_util::future::try_join_all(counts).await?;
        let start = self
            .tokens
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed) as usize;
        let mut shares = vec![0; n];
        let mut left = limit;
        for k in 0..n {
            let i = (start + k) % n;
            let have = counts[i].iter().sum::<u64>().min(usize::MAX as u64) as usize;
            shares[i] = have.min(left);
            left -= shares[i];
        }
        Ok(shares)
    }

    /// The owed cancels an `outbox_claim` answer names, held with `token`.
    fn owed_of(&self, v: &Value, token: &str) -> Result<Vec<OwedCancel>, StoreError> {
        let bad = || StoreError(format!("redis outbox_claim: unexpected answer {v:?}"));
        let entries = match &v {
            Value::Nil => return Ok(Vec::new()),
            Value::Array(items) => items,
            _ => return Err(bad()),
        };
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let Value::Array(f) = e else {
                return Err(bad());
            };
            let f: Vec<String> = f.iter().map(|x| text_of(x).unwrap_or_default()).collect();
            let [route, tenant, task_id, binding, path, cause] = &f[..] else {
                return Err(bad());
            };
            let Some(binding) = binding_of(binding) else {
                tracing::warn!(
                    route,
                    tenant,
                    task_id,
                    binding,
                    "an owed cancel names no binding this gateway knows; dropped"
                );
                continue;
            };
            out.push(OwedCancel {
                key: TaskKey {
                    route: route.as_str().into(),
                    tenant: tenant.as_str().into(),
                    task_id: task_id.as_str().into(),
                },
                target: CancelTarget {
                    binding,
                    path: path.clone(),
                },
                cause: cause.clone(),
                owner: self.replica.clone(),
                token: token.to_owned(),
            });
        }
        Ok(out)
    }

    /// Runs one round trip with the call's time bound, naming `op` in errors.
    async fn call<T, F>(&self, op: &str, f: impl FnOnce(Conn) -> F) -> Result<T, StoreError>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self
            .conn
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match tokio::time::timeout(CALL_TIMEOUT, f(conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError(format!("redis {op}: {e}"))),
            Err(_) => Err(StoreError(format!(
                "redis {op}: no answer within {CALL_TIMEOUT:?}"
            ))),
        }
    }
}

/// A connection to the server at `url` that reconnects by itself.
async fn manager(url: &str, settings: &config::Store) -> Result<ConnectionManager, StoreError> {
    let client = client(url, settings)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_ATTEMPT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(100))
        .set_max_delay(Duration::from_millis(500));
    tokio::time::timeout(
        CONNECT_TIMEOUT,
        ConnectionManager::new_with_config(client, config),
    )
    .await
    .map_err(|_| StoreError(format!("redis: no connection within {CONNECT_TIMEOUT:?}")))?
    .map_err(|e| StoreError(format!("redis: cannot connect: {}", connect_error(&e))))
}

/// A connection to the Redis Cluster the URL's nodes are in, with
/// `settings`' password and TLS files. The client learns the slots from the
/// nodes, routes each command to its key's primary, and follows `MOVED`,
/// `ASK` and a failover's new primary by itself.
async fn cluster(
    url: &config::ClusterUrl,
    settings: &config::Store,
) -> Result<redis::cluster_async::ClusterConnection, StoreError> {
    let mut b = redis::cluster::ClusterClient::builder(url.node_urls())
        .connection_timeout(CONNECT_ATTEMPT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .min_retry_wait(50)
        .max_retry_wait(500);
    if let Some(password) = &settings.password {
        b = b.password(password.expose());
    }
    if settings.tls_ca.is_some() || settings.tls_client_cert.is_some() {
        b = b.certs(certificates(settings));
    }
    let client = b
        .build()
        .map_err(|e| StoreError(format!("redis: bad url: {e}")))?;
    tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_connection())
        .await
        .map_err(|_| {
            StoreError(format!(
                "redis: no cluster connection within {CONNECT_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| {
            StoreError(format!(
                "redis: cannot connect to the cluster: {}",
                connect_error(&e)
            ))
        })
}

/// Shard `i` of `n`'s hash tag: the first `{i}.{j}` whose slot falls in the
/// `i`-th of `n` equal parts of the slots. A cluster's primaries hold
/// contiguous slot ranges, so the shards spread over them as evenly as the
/// ranges do.
fn shard_tag(i: usize, n: usize) -> String {
    let (lo, hi) = (i * SLOTS / n, (i + 1) * SLOTS / n);
    (0..1_000_000)
        .map(|j| format!("{i}.{j}"))
        .find(|t| (lo..hi).contains(&slot(t)))
        .unwrap_or_else(|| i.to_string())
}

/// The cluster slot of a hash tag (Redis's CRC16/XMODEM, modulo the slots).
fn slot(tag: &str) -> usize {
    usize::from(crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes())) % SLOTS
}

/// How often a Sentinel-backed store asks which node is the primary: a
/// failover is followed within this after the sentinels agreed on it.
pub const SENTINEL_POLL: Duration = Duration::from_millis(500);

/// The primary the first sentinel that answers names (`host`, `port`).
async fn primary_of(s: &config::SentinelUrl) -> Result<(String, u16), StoreError> {
    let mut last = String::new();
    for addr in &s.sentinels {
        let asked = async {
            let client = redis::Client::open(format!("redis://{addr}"))?;
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&s.master)
                .query_async::<Option<(String, u16)>>(&mut c)
                .await
        };
        match tokio::time::timeout(CONNECT_ATTEMPT_TIMEOUT, asked).await {
            Ok(Ok(Some(primary))) => return Ok(primary),
            Ok(Ok(None)) => last = format!("sentinel {addr} monitors no {:?}", s.master),
            Ok(Err(e)) => last = format!("sentinel {addr}: {e}"),
            Err(_) => {
                last = format!("sentinel {addr}: no answer within {CONNECT_ATTEMPT_TIMEOUT:?}")
            }
        }
    }
    Err(StoreError(format!(
        "redis: no sentinel named the primary ({last})"
    )))
}

/// Follows a Sentinel failover: asks the sentinels every
/// [`SENTINEL_POLL`] which node is the primary, and moves the store's
/// connection to a new one. Calls in flight on the old connection fail
/// (as any store error); the next go to the new primary. Ends with the
/// store.
async fn follow_primary(
    conn: std::sync::Weak<std::sync::RwLock<Conn>>,
    sentinels: config::SentinelUrl,
    mut primary: (String, u16),
    settings: config::Store,
) {
    loop {
        tokio::time::sleep(SENTINEL_POLL).await;
        if conn.strong_count() == 0 {
            return;
        }
        let now = match primary_of(&sentinels).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "the sentinels could not be asked for the Redis primary");
                continue;
            }
        };
        if now == primary {
            continue;
        }
        match manager(&sentinels.data_url(&now.0, now.1), &settings).await {
            Ok(m) => {
                let Some(conn) = conn.upgrade() else { return };
                *conn
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Conn::One(m);
                metrics::STORE_FAILOVERS
                    .with_label_values(&[&sentinels.master])
                    .inc();
                tracing::warn!(from = %format!("{}:{}", primary.0, primary.1), to = %format!("{}:{}", now.0, now.1), master = %sentinels.master, "the Redis primary moved (Sentinel); the store follows it");
                primary = now;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the new Redis primary Sentinel names cannot be reached yet");
            }
        }
    }
}

/// The client of `url` with `settings`' password and TLS files. The
/// config checked that they fit the URL (TLS files only for `rediss://`).
fn client(url: &str, settings: &config::Store) -> Result<redis::Client, StoreError> {
    use redis::IntoConnectionInfo as _;
    let bad_url = |e: redis::RedisError| StoreError(format!("redis: bad url: {e}"));
    let mut info = url.into_connection_info().map_err(bad_url)?;
    if let Some(password) = &settings.password {
        let redis = info
            .redis_settings()
            .clone()
            .set_password(password.expose());
        info = info.set_redis_settings(redis);
    }
    if settings.tls_ca.is_none() && settings.tls_client_cert.is_none() {
        return redis::Client::open(info).map_err(bad_url);
    }
    redis::Client::build_with_tls(info, certificates(settings))
        .map_err(|e| StoreError(format!("redis: TLS settings: {e}")))
}

/// `store.tls_ca_file` and the client certificate, as the Redis client
/// takes them.
fn certificates(settings: &config::Store) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: settings
            .tls_client_cert
            .as_ref()
            .map(|c| redis::ClientTlsConfig {
                client_cert: pem("CERTIFICATE", &c.certs),
                client_key: pem(key_label(&c.key), std::slice::from_ref(&c.key)),
            }),
        root_cert: settings
            .tls_ca
            .as_ref()
            .map(|ca| pem("CERTIFICATE", &ca.certs)),
    }
}

/// DER blocks as PEM text, as the Redis client reads certificates and keys.
fn pem(label: &str, blocks: &[Vec<u8>]) -> Vec<u8> {
    use base64::Engine as _;
    let mut out = String::new();
    for der in blocks {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let _ = writeln!(out, "-----BEGIN {label}-----");
        let mut rest = b64.as_str();
        while !rest.is_empty() {
            let (line, tail) = rest.split_at(rest.len().min(64));
            let _ = writeln!(out, "{line}");
            rest = tail;
        }
        let _ = writeln!(out, "-----END {label}-----");
    }
    out.into_bytes()
}

/// The PEM label of a private key's DER (the config read PKCS#8, PKCS#1 or
/// SEC1).
fn key_label(der: &[u8]) -> &'static str {
    match pingora::tls::PrivateKeyDer::try_from(der) {
        Ok(pingora::tls::PrivateKeyDer::Pkcs1(_)) => "RSA PRIVATE KEY",
        Ok(pingora::tls::PrivateKeyDer::Sec1(_)) => "EC PRIVATE KEY",
        _ => "PRIVATE KEY",
    }
}

/// Why connecting failed, in one line: a certificate the gateway does not
/// trust says which setting decides it.
fn connect_error(e: &redis::RedisError) -> String {
    let text = e.to_string();
    if text.contains("invalid peer certificate") {
        format!(
            "{text} (the server's TLS certificate is not trusted: store.tls_ca_file names the CA that signed it, else the system's roots are used)"
        )
    } else {
        text
    }
}

/// Who asks, as the scripts read it: `u` (no auth), `a` (anonymous) or
/// `i` (an identity, [`asker_id`]).
fn asker_kind(asker: &Asker) -> &'static str {
    match asker {
        Asker::Unverified => "u",
        Asker::Anonymous => "a",
        Asker::Identity(_) => "i",
    }
}

/// The identity an `i` asker names (`""` for the others).
fn asker_id(asker: &Asker) -> &str {
    match asker {
        Asker::Identity(id) => id,
        _ => "",
    }
}

#[async_trait]
impl TaskStore for RedisStore {
    async fn update(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<TaskRecord, StoreError> {
        let v = self.run_update(key, &update, now_ms, false).await?;
        let fields = fields_of(&v).map_err(|e| StoreError(format!("redis update: {e}")))?;
        let record = record_from(&fields, Some(key));
        // A request naming the task in another tenant pins nothing (the
        // record keeps the tenant it was first recorded in).
        if let (Some(context), true, Some(replica), true) = (
            &update.context_id,
            update.pin_context,
            &record.replica,
            record.key.tenant == key.tenant,
        ) {
            self.pin_context(&key.route, context, replica).await?;
        }
        Ok(record)
    }

    async fn write(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        // A pin needs the record's replica and tenant.
        if update.pin_context {
            return self.update(key, update, now_ms).await.map(|_| ());
        }
        self.run_update(key, &update, now_ms, true)
            .await
            .map(|_| ())
    }

    async fn get(&self, key: &TaskKey) -> Result<Option<TaskRecord>, StoreError> {
        let mut inv = self.scripts.get.prepare_invoke();
        inv.key(self.task_key(key));
        let v: Value = self
            .call("get", |mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let fields = fields_of(&v).map_err(|e| StoreError(format!("redis get: {e}")))?;
        Ok((!fields.is_empty()).then(|| record_from(&fields, Some(key))))
    }

    async fn context_replica(
        &self,
        route: &str,
        context_id: &str,
    ) -> Result<Option<String>, StoreError> {
        let k = self.context_key(route, context_id);
        self.call("context_replica", |mut c| async move {
            redis::cmd("GET").arg(k).query_async(&mut c).await
        })
        .await
    }

    async fn list(&self, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let hashes = self.scan_hashes("list", "task:*", limit).await?;
        records_of(&Value::Array(hashes)).map_err(|e| StoreError(format!("redis list: {e}")))
    }

    async fn lease_start(
        &self,
        key: &TaskKey,
        ttl_ms: u64,
        holder: Option<&str>,
        now_ms: u64,
        asker: &Asker,
    ) -> Result<(), StoreError> {
        let (now_ms, ttl_ms) = (now_ms.min(MAX_EXACT), ttl_ms.min(MAX_EXACT));
        let deadline_ms = lease::deadline(now_ms, ttl_ms).min(MAX_EXACT);
        let mut inv = self.scripts.lease_start.prepare_invoke();
        self.lease_keys(&mut inv, key);
        inv.arg(now_ms)
            .arg(deadline_ms)
            .arg(ttl_ms)
            .arg(u8::from(holder.is_some()))
            .arg(holder.unwrap_or(""))
            .arg(&*key.route)
            .arg(&*key.tenant)
            .arg(&*key.task_id)
            .arg(asker_kind(asker))
            .arg(asker_id(asker));
        let _: Value = self
            .call("lease_start", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(())
    }

    async fn lease_renew(&self, key: &TaskKey, now_ms: u64) -> Result<Renewal, StoreError> {
        let shard = self.task_shard(key);
        let mut inv = self.scripts.lease_renew.prepare_invoke();
        inv.key(RedisStore::task_key_in(shard, key))
            .key(&shard.leases)
            .arg(now_ms.min(MAX_EXACT));
        let v: Value = self
            .call("lease_renew", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        match int_of(&v) {
            Some(-2) => Ok(Renewal::Lapsed),
            Some(d) if d >= 0 => Ok(Renewal::Renewed {
                deadline_ms: d as u64,
            }),
            Some(_) => Ok(Renewal::NoLease),
            None => Err(StoreError(format!(
                "redis lease_renew: unexpected answer {v:?}"
            ))),
        }
    }

    async fn lease_renew_many(
        &self,
        keys: &[TaskKey],
        now_ms: u64,
    ) -> Result<Renewals, StoreError> {
        // One script per shard the tasks are in (one on a single server),
        // all at once.
        let mut by_shard: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            by_shard.entry(self.leases_key(key)).or_default().push(i);
        }
        let calls = by_shard.into_iter().map(|(leases, at)| async move {
            let batch: Vec<&TaskKey> = at.iter().map(|i| &keys[*i]).collect();
            let got = self.renew_in_shard(leases, &batch, now_ms).await?;
            let lost = got.lost.iter().map(|i| at[*i]).collect::<Vec<_>>();
            Ok::<_, StoreError>((got.renewed, lost))
        });
        let mut out = Renewals::default();
        for (renewed, lost) in futures_util::future::try_join_all(calls).await? {
            out.renewed += renewed;
            out.lost.extend(lost);
        }
        out.lost.sort_unstable();
        Ok(out)
    }

    async fn lease_end(&self, key: &TaskKey) -> Result<(), StoreError> {
        let mut inv = self.scripts.lease_end.prepare_invoke();
        self.lease_keys(&mut inv, key);
        let _: Value = self
            .call("lease_end", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(())
    }

    async fn lease_claim_lapsed(
        &self,
        now_ms: u64,
        limit: usize,
        hold_until_ms: u64,
        routes: &[Arc<str>],
    ) -> Result<Vec<TaskRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let due = |shard: &Shard| {
            let mut sets = vec![(shard.leases.clone(), format!("({now_ms}"))];
            for key in std::iter::once(shard.retries.clone())
                .chain(routes.iter().map(|r| RedisStore::retry_key(shard, r)))
            {
                sets.push((key, now_ms.to_string()));
            }
            sets
        };
        let shares = self.shares("lease_claim_lapsed", limit, due).await?;
        let calls = self.shards.iter().zip(shares).filter(|(_, n)| *n > 0).map(
            |(shard, share)| async move {
                let mut inv = self.scripts.lease_claim.prepare_invoke();
                inv.key(&shard.leases).key(&shard.retries);
                for route in routes {
                    inv.key(RedisStore::retry_key(shard, route));
                }
                inv.arg(now_ms.min(MAX_EXACT))
                    .arg(share.min(MAX_EXACT as usize))
                    .arg(hold_until_ms.min(MAX_EXACT));
                let v: Value = self
                    .call("lease_claim_lapsed", |mut c| async move {
                        inv.invoke_async(&mut c).await
                    })
                    .await?;
                records_of(&v).map_err(|e| StoreError(format!("redis lease_claim_lapsed: {e}")))
            },
        );
        let claimed = futures_util::future::try_join_all(calls).await?;
        Ok(claimed.into_iter().flatten().collect())
    }

    async fn lease_retry(&self, key: &TaskKey, at_ms: u64) -> Result<(), StoreError> {
        let shard = self.task_shard(key);
        let mut inv = self.scripts.lease_retry.prepare_invoke();
        inv.key(RedisStore::task_key_in(shard, key))
            .key(RedisStore::retry_key(shard, &key.route))
            .arg(at_ms.min(MAX_EXACT));
        let _: Value = self
            .call("lease_retry", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(())
    }
    async fn account_reserve(
        &self,
        asks: &[Reservation],
    ) -> Result<Result<(), Unreserved>, StoreError> {
        if asks.is_empty() {
            return Ok(Ok(()));
        }
        // All or nothing is one script: one shard. Every account a send
        // reserves on is its route's, so they are (`route_shard`).
        let shard = self.route_shard(&asks[0].account.route);
        if asks
            .iter()
            .any(|a| !std::ptr::eq(self.route_shard(&a.account.route), shard))
        {
            return Err(StoreError(
                "redis account_reserve: the accounts of one reservation are in different shards (routes)".into(),
            ));
        }
        let mut inv = self.scripts.account_reserve.prepare_invoke();
        inv.arg(asks.len());
        for a in asks {
            self.reservation_args(&mut inv, a);
        }
        inv.key(&shard.accounts)
            .arg(self.clock_ms().min(MAX_EXACT))
            .arg(self.max_accounts.min(MAX_EXACT));
        let v: Value = self
            .call("account_reserve", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        let pair = match &v {
            Value::Array(items) if items.len() == 2 => (int_of(&items[0]), int_of(&items[1])),
            _ => (None, None),
        };
        match pair {
            (Some(-1), _) => Ok(Ok(())),
            (Some(-2), _) => Ok(Err(Unreserved::Full {
                max: self.max_accounts,
            })),
            (Some(i), Some(left)) if i >= 0 => Ok(Err(Unreserved::Short(Shortfall {
                index: i as usize,
                left: left.max(0) as u64,
            }))),
            _ => Err(StoreError(format!(
                "redis account_reserve: unexpected answer {v:?}"
            ))),
        }
    }

    async fn account_settle(&self, settled: &[(Reservation, u64)]) -> Result<(), StoreError> {
        // Each settlement applies once by itself: one script per shard.
        let mut by_shard: BTreeMap<&str, Vec<&(Reservation, u64)>> = BTreeMap::new();
        for s in settled {
            by_shard
                .entry(&self.route_shard(&s.0.account.route).prefix)
                .or_default()
                .push(s);
        }
        let calls = by_shard.into_values().map(|batch| async move {
            let mut inv = self.scripts.account_settle.prepare_invoke();
            for (a, charged) in batch {
                self.reservation_args(&mut inv, a);
                inv.arg((*charged).min(MAX_EXACT));
            }
            self.call("account_settle", |mut c| async move {
                inv.invoke_async::<Value>(&mut c).await
            })
            .await
        });
        futures_util::future::try_join_all(calls).await?;
        Ok(())
    }

    async fn account_list(&self, limit: usize) -> Result<Vec<AccountView>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let hashes = self.scan_hashes("account_list", "acct:*", limit).await?;
        let mut out = Vec::new();
        for h in &hashes {
            let f = fields_of(h).map_err(|e| StoreError(format!("redis account_list: {e}")))?;
            let account = AccountKey {
                route: f.get("route").map_or("", String::as_str).into(),
                scope: f.get("scope").map_or("", String::as_str).into(),
                holder: f.get("holder").map_or("", String::as_str).into(),
                window_start_ms: u64_of(f.get("window")).unwrap_or(0),
            };
            for (field, limit) in &f {
                let Some(meter) = field.strip_prefix("limit:") else {
                    continue;
                };
                let get = |p: &str| u64_of(f.get(&format!("{p}:{meter}"))).unwrap_or(0);
                out.push(AccountView {
                    account: account.clone(),
                    meter: meter.to_string(),
                    balance: policies::budget::Account {
                        limit: u64_of(Some(limit)).unwrap_or(0),
                        spent: get("spent"),
                        reserved: get("reserved"),
                    },
                });
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    async fn outbox_put(
        &self,
        key: &TaskKey,
        target: &CancelTarget,
        cause: &str,
        now_ms: u64,
    ) -> Result<Owing, StoreError> {
        let token = self.token();
        let mut inv = self.scripts.outbox_put.prepare_invoke();
        self.outbox_keys(&mut inv, key);
        inv.arg(now_ms.min(MAX_EXACT))
            .arg(&*key.route)
            .arg(&*key.tenant)
            .arg(&*key.task_id)
            .arg(&self.replica)
            .arg(&token)
            .arg(target.binding.as_str())
            .arg(&target.path)
            .arg(cause)
            .arg(REPLICA_TTL.as_millis() as u64);
        let v: Value = self
            .call("outbox_put", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        match int_of(&v) {
            Some(1) => Ok(Owing::Mine(token)),
            Some(0) => Ok(Owing::Elsewhere),
            Some(2) => Ok(Owing::Settled),
            _ => Err(StoreError(format!(
                "redis outbox_put: unexpected answer {v:?}"
            ))),
        }
    }

    async fn outbox_owns(&self, key: &TaskKey, token: &str) -> Result<bool, StoreError> {
        let k = self.task_key(key);
        let v: Option<String> = self
            .call("outbox_owns", |mut c| async move {
                redis::cmd("HGET")
                    .arg(&k)
                    .arg("ob_token")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(!token.is_empty() && v.as_deref() == Some(token))
    }

    async fn outbox_done(&self, key: &TaskKey) -> Result<(), StoreError> {
        let mut inv = self.scripts.outbox_done.prepare_invoke();
        self.outbox_keys(&mut inv, key);
        let _: Value = self
            .call("outbox_done", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(())
    }

    async fn outbox_retry(
        &self,
        key: &TaskKey,
        token: &str,
        at_ms: u64,
    ) -> Result<bool, StoreError> {
        let shard = self.task_shard(key);
        let mut inv = self.scripts.outbox_retry.prepare_invoke();
        inv.key(RedisStore::task_key_in(shard, key))
            .key(RedisStore::outbox_in(shard, &key.route))
            .arg(token)
            .arg(at_ms.min(MAX_EXACT));
        let v: Value = self
            .call("outbox_retry", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(int_of(&v) == Some(1))
    }

    async fn outbox_claim(
        &self,
        now_ms: u64,
        limit: usize,
        routes: &[Arc<str>],
    ) -> Result<Vec<OwedCancel>, StoreError> {
        if limit == 0 || routes.is_empty() {
            return Ok(Vec::new());
        }
        let token = self.token();
        let due = |shard: &Shard| {
            routes
                .iter()
                .map(|r| (RedisStore::outbox_in(shard, r), now_ms.to_string()))
                .collect()
        };
        let shares = self.shares("outbox_claim", limit, due).await?;
        let calls = self
            .shards
            .iter()
            .zip(shares)
            .filter(|(_, n)| *n > 0)
            .map(|(shard, share)| {
                let token = &token;
                async move {
                    let mut inv = self.scripts.outbox_claim.prepare_invoke();
                    for route in routes {
                        inv.key(RedisStore::outbox_in(shard, route));
                    }
                    inv.arg(now_ms.min(MAX_EXACT))
                        .arg(share.min(MAX_EXACT as usize))
                        .arg(&self.replica)
                        .arg(token)
                        .arg(REPLICA_TTL.as_millis() as u64);
                    self.call("outbox_claim", |mut c| async move {
                        inv.invoke_async::<Value>(&mut c).await
                    })
                    .await
                }
            });
        let mut out = Vec::new();
        for v in futures_util::future::try_join_all(calls).await? {
            out.extend(self.owed_of(&v, &token)?);
        }
        Ok(out)
    }

    async fn outbox_get(&self, key: &TaskKey) -> Result<Option<OwedCancel>, StoreError> {
        let k = self.task_key(key);
        let v: Vec<Option<String>> = self
            .call("outbox_get", |mut c| async move {
                redis::cmd("HMGET")
                    .arg(&k)
                    .arg(&["ob_owner", "ob_token", "ob_binding", "ob_path", "ob_cause"])
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let [Some(owner), token, binding, path, cause] = &v[..] else {
            return Ok(None);
        };
        let Some(binding) = binding.as_deref().and_then(binding_of) else {
            return Ok(None);
        };
        Ok(Some(OwedCancel {
            key: key.clone(),
            target: CancelTarget {
                binding,
                path: path.clone().unwrap_or_default(),
            },
            cause: cause.clone().unwrap_or_default(),
            owner: owner.clone(),
            token: token.clone().unwrap_or_default(),
        }))
    }

    async fn lease_count(&self) -> Result<u64, StoreError> {
        let calls = self.shards.iter().map(|shard| async move {
            let z = &shard.leases;
            let v: Value = self
                .call("lease_count", |mut c| async move {
                    redis::cmd("ZCARD").arg(z).query_async(&mut c).await
                })
                .await?;
            match int_of(&v) {
                Some(n) if n >= 0 => Ok(n as u64),
                _ => Err(StoreError(format!(
                    "redis lease_count: unexpected answer {v:?}"
                ))),
            }
        });
        Ok(futures_util::future::try_join_all(calls)
            .await?
            .iter()
            .sum())
    }

    async fn replica_alive(&self) -> Result<(), StoreError> {
        let gone = self.gone.lock().await;
        if *gone {
            return Ok(());
        }
        let ttl = REPLICA_TTL.as_millis() as u64;
        let sent_us = self.clock.mono_us();
        // The heartbeat and a reading of the server's clock (the first
        // shard's node's, on a cluster), in one round trip; on a cluster the
        // heartbeat of each other shard at the same time.
        let first = &self.shards[0].replica_key;
        let timed = self.call("replica_alive", |mut c| async move {
            redis::pipe()
                .cmd("SET")
                .arg(first)
                .arg(1)
                .arg("PX")
                .arg(ttl)
                .ignore()
                .cmd("TIME")
                .query_async::<((u64, u64),)>(&mut c)
                .await
        });
        let others = self.shards[1..].iter().map(|shard| {
            self.call("replica_alive", move |mut c| async move {
                redis::cmd("SET")
                    .arg(&shard.replica_key)
                    .arg(1)
                    .arg("PX")
                    .arg(ttl)
                    .query_async::<()>(&mut c)
                    .await
            })
        });
        let (timed, others) = tokio::join!(timed, futures_util::future::try_join_all(others));
        let ((secs, micros),) = timed?;
        others?;
        let before = self.clock.offset_ms();
        let offset = self.clock.record(clock::Sample {
            sent_us,
            answered_us: self.clock.mono_us(),
            server_us: secs.saturating_mul(1_000_000).saturating_add(micros),
        });
        metrics::STORE_CLOCK_OFFSET.set(offset as f64 / 1000.0);
        if offset.abs() >= CLOCK_WARN_MS && before.abs() < CLOCK_WARN_MS {
            tracing::warn!(
                offset_ms = offset,
                "this replica's clock is off the Redis server's; leases, claims and budget windows follow the server's"
            );
        }
        Ok(())
    }

    fn clock_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    async fn replica_gone(&self) -> Result<(), StoreError> {
        let mut gone = self.gone.lock().await;
        *gone = true;
        let calls = self.shards.iter().map(|shard| {
            self.call("replica_gone", move |mut c| async move {
                redis::cmd("DEL")
                    .arg(&shard.replica_key)
                    .query_async::<()>(&mut c)
                    .await
            })
        });
        futures_util::future::try_join_all(calls).await?;
        Ok(())
    }

    async fn link_child(
        &self,
        parent: &str,
        child_ref: &str,
        child: &ChildLink,
    ) -> Result<bool, StoreError> {
        let retention = super::LINK_RETENTION.as_millis() as u64;
        let mut inv = self.scripts.link_child.prepare_invoke();
        inv.key(self.kids_key(parent))
            .arg(link_json(child))
            .arg(super::MAX_CHILDREN)
            .arg(retention);
        let linked: i64 = self
            .call("link_child", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        if linked != 1 {
            return Ok(false);
        }
        // The child's parent, for `/tasks/{id}`: its own key (slot).
        let k = self.parent_key(child_ref);
        let v = format!("{parent} {}", child.depth);
        self.call("link_child", |mut c| async move {
            redis::cmd("SET")
                .arg(&k)
                .arg(&v)
                .arg("PX")
                .arg(retention)
                .query_async::<()>(&mut c)
                .await
        })
        .await?;
        Ok(true)
    }

    async fn children(&self, parents: &[String]) -> Result<Vec<ChildLink>, StoreError> {
        if parents.is_empty() {
            return Ok(Vec::new());
        }
        // One `LRANGE` per reference, all at once (each its own slot).
        let calls = parents.iter().map(|p| {
            let k = self.kids_key(p);
            self.call("children", |mut c| async move {
                redis::cmd("LRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .query_async::<Vec<String>>(&mut c)
                    .await
            })
        });
        let lists = futures_util::future::try_join_all(calls).await?;
        let mut out = Vec::new();
        for item in lists.iter().flatten() {
            match link_of(item) {
                Some(l) => out.push(l),
                None => {
                    tracing::warn!(link = %item, "an unreadable delegation link in Redis; skipped")
                }
            }
        }
        Ok(out)
    }

    async fn parent_of(&self, refs: &[String]) -> Result<Option<(String, u8)>, StoreError> {
        if refs.is_empty() {
            return Ok(None);
        }
        let keys: Vec<String> = refs.iter().map(|r| self.parent_key(r)).collect();
        let found: Vec<Option<String>> = self
            .call("parent_of", |mut c| async move {
                redis::cmd("MGET").arg(&keys).query_async(&mut c).await
            })
            .await?;
        Ok(found.into_iter().flatten().find_map(|v| {
            let (p, d) = v.split_once(' ')?;
            Some((p.to_owned(), d.parse().ok()?))
        }))
    }

    async fn link_key(&self) -> Result<Vec<u8>, StoreError> {
        let k = format!("{}:link-key", self.namespace);
        let mine = crate::link::hex(&crate::link::random_key());
        let (key,): (String,) = self
            .call("link_key", |mut c| async move {
                redis::pipe()
                    .cmd("SET")
                    .arg(&k)
                    .arg(&mine)
                    .arg("NX")
                    .ignore()
                    .cmd("GET")
                    .arg(&k)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        unhex(&key).ok_or_else(|| StoreError("redis link_key: the stored key is not hex".into()))
    }

    async fn tree_budget_open(
        &self,
        reference: &str,
        grant: &BTreeMap<String, u64>,
        parent: &ChildLink,
        expires_ms: u64,
    ) -> Result<(), StoreError> {
        let k = self.tree_budget_key(reference);
        let mut fields: Vec<(String, String)> = grant
            .iter()
            .map(|(m, n)| (format!("g:{m}"), n.to_string()))
            .collect();
        fields.push(("parent".into(), link_json(parent)));
        self.call("tree_budget_open", |mut c| async move {
            redis::pipe()
                .atomic()
                .cmd("HSET")
                .arg(&k)
                .arg(&fields)
                .ignore()
                .cmd("PEXPIREAT")
                .arg(&k)
                .arg(expires_ms)
                .ignore()
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }

    async fn tree_budget_get(&self, reference: &str) -> Result<Option<TreeBudget>, StoreError> {
        let k = self.tree_budget_key(reference);
        let h: Vec<String> = self
            .call("tree_budget_get", |mut c| async move {
                redis::cmd("HGETALL").arg(&k).query_async(&mut c).await
            })
            .await?;
        Ok((!h.is_empty()).then(|| tree_budget_of(&h)))
    }

    async fn tree_budget_charge(
        &self,
        reference: &str,
        grew: &BTreeMap<String, u64>,
    ) -> Result<TreeBudget, StoreError> {
        let mut inv = self.scripts.tree_charge.prepare_invoke();
        inv.key(self.tree_budget_key(reference))
            .arg(super::LINK_RETENTION.as_millis() as u64);
        for (m, n) in grew {
            inv.arg(m).arg(n);
        }
        let h: Vec<String> = self
            .call("tree_budget_charge", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(tree_budget_of(&h))
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

/// A parent's budget from its hash's fields and values (`HGETALL`, plus
/// the charge script's `stop`); unreadable amounts count as 0.
fn tree_budget_of(h: &[String]) -> TreeBudget {
    let mut b = TreeBudget::default();
    for pair in h.chunks_exact(2) {
        let (f, v) = (pair[0].as_str(), pair[1].as_str());
        if let Some(m) = f.strip_prefix("g:") {
            b.grant.insert(m.to_owned(), v.parse().unwrap_or(0));
        } else if let Some(m) = f.strip_prefix("s:") {
            b.spent.insert(m.to_owned(), v.parse().unwrap_or(0));
        } else if f == "parent" {
            b.parent = link_of(v);
        } else if f == "stop" {
            b.stop = v == "1";
        }
    }
    b
}

/// A link as Redis keeps it: JSON.
fn link_json(l: &ChildLink) -> String {
    serde_json::json!({
        "route": &*l.route,
        "tenant": &*l.tenant,
        "message": l.message_id,
        "binding": l.target.binding.as_str(),
        "path": l.target.path,
        "replica": l.replica,
        "sent_ms": l.sent_ms,
        "depth": l.depth,
    })
    .to_string()
}

fn link_of(s: &str) -> Option<ChildLink> {
    let v: serde_json::Value = serde_json::from_str(s).ok()?;
    Some(ChildLink {
        route: v["route"].as_str()?.into(),
        tenant: v["tenant"].as_str()?.into(),
        message_id: v["message"].as_str()?.to_owned(),
        target: CancelTarget {
            binding: binding_of(v["binding"].as_str()?)?,
            path: v["path"].as_str()?.to_owned(),
        },
        replica: v["replica"].as_str().map(str::to_owned),
        sent_ms: v["sent_ms"].as_u64()?,
        depth: u8::try_from(v["depth"].as_u64()?).ok()?,
    })
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) || b.is_empty() {
        return None;
    }
    b.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
        .collect()
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn pct(s: &str) -> String {
    percent_encode_segment(s).into_owned()
}

/// Escapes `SCAN MATCH` glob characters.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text_of(other)?.trim().parse().ok(),
    }
}

/// A hash as HGETALL returns it (flat field/value pairs, or a RESP3 map).
fn fields_of(v: &Value) -> Result<HashMap<String, String>, String> {
    let pairs: Vec<(&Value, &Value)> = match v {
        Value::Nil => Vec::new(),
        Value::Array(items) if items.len() % 2 == 0 => {
            items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect()
        }
        Value::Map(items) => items.iter().map(|(k, v)| (k, v)).collect(),
        other => return Err(format!("expected a hash, got {other:?}")),
    };
    pairs
        .into_iter()
        .map(|(k, v)| match (text_of(k), text_of(v)) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(format!("unreadable hash field {k:?} = {v:?}")),
        })
        .collect()
}

/// A list of hashes (the claim and list scripts' answer).
fn records_of(v: &Value) -> Result<Vec<TaskRecord>, String> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .map(|h| Ok(record_from(&fields_of(h)?, None)))
            .collect(),
        other => Err(format!("expected a list of records, got {other:?}")),
    }
}

/// A binding as stored (`Binding::as_str`).
fn binding_of(s: &str) -> Option<Binding> {
    [
        Binding::JsonRpc,
        Binding::Rest,
        Binding::WebSocket,
        Binding::Grpc,
    ]
    .into_iter()
    .find(|b| b.as_str() == s)
}

fn u64_of(s: Option<&String>) -> Option<u64> {
    let s = s?.trim();
    s.parse::<u64>().ok().or_else(|| {
        s.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64)
    })
}

/// Reads a record; `key` names it when the caller knows it, else the hash's
/// own `route`/`task_id` fields do. Its tenant is always the hash's: the
/// one the task was first recorded in, whatever tenant `key` names.
fn record_from(f: &HashMap<String, String>, key: Option<&TaskKey>) -> TaskRecord {
    let field = |name: &str| f.get(name).map(String::as_str).unwrap_or("");
    let key = match key {
        Some(k) => TaskKey {
            tenant: f
                .get("tenant")
                .map_or_else(|| k.tenant.clone(), |t| t.as_str().into()),
            ..k.clone()
        },
        None => TaskKey {
            route: field("route").into(),
            tenant: field("tenant").into(),
            task_id: field("task_id").into(),
        },
    };
    let binding = f.get("binding").and_then(|b| binding_of(b));
    let target = binding
        .zip(f.get("target_path"))
        .map(|(binding, path)| CancelTarget {
            binding,
            path: path.clone(),
        });
    let lease = u64_of(f.get("lease_deadline")).map(|deadline_ms| LeaseRecord {
        ttl_ms: u64_of(f.get("lease_ttl")).unwrap_or(0),
        deadline_ms,
        holder: f.get("lease_holder").cloned(),
    });
    TaskRecord {
        key,
        context_id: f.get("context_id").cloned(),
        state: f.get("state").and_then(|s| TaskState::from_wire(s)),
        target,
        watchers: u64_of(f.get("watchers")).map_or(0, |w| w.min(u64::from(u32::MAX)) as u32),
        lease,
        updated_ms: u64_of(f.get("updated_ms")).unwrap_or(0),
        owner: f.get("owner").cloned(),
        replica: f.get("replica").cloned(),
        message_id: f.get("message_id").cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_keeps_keys_apart() {
        assert_eq!(pct("acme"), "acme");
        assert_eq!(pct(""), "");
        assert_eq!(pct("a:b"), "a%3Ab");
        assert_eq!(pct("a%3Ab"), "a%253Ab");
        assert_eq!(pct("é/x"), "%C3%A9%2Fx");
        assert_eq!(glob_escape("ns*[x]"), "ns\\*\\[x\\]");
    }

    #[test]
    fn scripts_know_the_states() {
        let p = [
            ACCOUNT_RESERVE,
            ACCOUNT_SETTLE,
            UPDATE,
            LEASE_CLAIM,
            LIST,
            GET,
        ]
        .iter()
        .map(|body| fill(&format!("{PRELUDE}{body}"), "ns\"x"))
        .collect::<String>();
        assert!(p.contains(
            "local TERMINAL = {['TASK_STATE_COMPLETED']=true,['TASK_STATE_FAILED']=true,\
             ['TASK_STATE_CANCELED']=true,['TASK_STATE_REJECTED']=true,}"
        ));
        assert!(p.contains("['TASK_STATE_INPUT_REQUIRED']=true,['TASK_STATE_REJECTED']=true,['TASK_STATE_AUTH_REQUIRED']=true,}"));
        assert!(p.contains("redis.call('PEXPIRE', k, 600000)"));
        assert!(p.contains("redis.call('PEXPIRE', k, 86400000)"));
        assert!(p.contains(r#"local NS = "ns\"x""#));
        assert!(p.contains("redis.call('EXISTS', rp .. string.sub(f, 3))"));
        assert!(p.contains("local tomb = shard(k) .. ':ticket:' .. ARGV[b + 9]"));
        assert!(p.contains("redis.call('SET', tomb, '1', 'PX', 120000)"));
        for placeholder in [
            "{TERMINAL}",
            "{SETTLED}",
            "{LIVE_MS}",
            "{SETTLED_MS}",
            "{NS}",
            "{TOMBSTONE_MS}",
        ] {
            assert!(!p.contains(placeholder), "{placeholder}");
        }
    }

    /// The shards' tags spread them over the slots evenly: shard `i` of
    /// `n` in the `i`-th `n`-th of them, whatever `n`.
    #[test]
    fn shard_tags_spread_over_the_slots() {
        for n in [1, 3, 16, 64] {
            for i in 0..n {
                let tag = shard_tag(i, n);
                let slot = slot(&tag);
                assert!(
                    (i * SLOTS / n..(i + 1) * SLOTS / n).contains(&slot),
                    "{i} of {n}: {tag} in {slot}"
                );
            }
        }
        // Redis's own slot of a known key: CLUSTER KEYSLOT foo is 12182.
        assert_eq!(slot("foo"), 12182);
    }

    #[test]
    fn bad_data_reads_as_none() {
        let mut f = HashMap::new();
        for (k, v) in [
            ("state", "bogus"),
            ("watchers", "-3"),
            ("updated_ms", "x"),
            ("binding", "carrier-pigeon"),
            ("target_path", "/"),
            ("lease_ttl", "1000"),
        ] {
            f.insert(k.to_string(), v.to_string());
        }
        let r = record_from(&f, None);
        assert_eq!(
            (r.state, r.watchers, r.updated_ms, r.target, r.lease),
            (None, 0, 0, None, None)
        );
        assert_eq!(&*r.key.task_id, "");
        f.insert("lease_deadline".into(), "1.5e3".into());
        f.insert("watchers".into(), "99999999999".into());
        let r = record_from(&f, None);
        assert_eq!(
            r.lease.map(|l| (l.ttl_ms, l.deadline_ms)),
            Some((1000, 1500))
        );
        assert_eq!(r.watchers, u32::MAX);
        assert!(fields_of(&Value::Array(vec![Value::Int(1)])).is_err());
        assert!(records_of(&Value::Okay).is_err());
    }
}
