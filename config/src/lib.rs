//! The a2a-gateway config file (TOML) and its validation into [`Config`].
//!
//! [`parse`] checks the whole file and reports every problem at once, each
//! with its line and column and the dotted path of the key
//! (`12:10: routes[1].worker: expected an http or https URL with a host,
//! found "ftp://x"`), so a user fixes a file in one round. Route indexes in
//! paths count from 0, in file order.
//!
//! `examples/minimal.toml` and `examples/full.toml` in this crate show the
//! format; the latter names every key with its default.
//!
//! Nothing here does I/O but [`load`] (which reads the file), [`parse`]
//! reading the environment variables that `worker_credential_env` names, and
//! both reading the certificate and key files that `worker_ca`,
//! `worker_client_cert`, `worker_client_key` and `[server.tls]` name.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use policies::budget::{Caps, OverCap};
use policies::cascade::CascadePolicy;

mod auth;
mod read;
mod schema;
mod units;
mod url;

pub use auth::{
    check_jwks, is_identity_name, parse_api_keys, read_api_keys, read_jwks, ApiKeys, AuthMode,
    AuthPolicy, JwtAuth, JwtKeys,
};
pub use units::{parse_duration, parse_size};
pub use url::{redact_url, ClusterUrl, SentinelUrl, WorkerUrl, REDIS_PORT, SENTINEL_PORT};

/// Everything the gateway runs with, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub server: Server,
    pub store: Store,
    pub limits: Limits,
    pub timeouts: Timeouts,
    pub cancel: Cancel,
    pub leases: Leases,
    /// `[tracing]`: OpenTelemetry traces. `None` (no table): no traces.
    pub tracing: Option<Tracing>,
    /// `[delegation]`: how the gateway links the tasks agents start while
    /// serving a task to that task.
    pub delegation: Delegation,
    /// In file order; at least one. The router picks among them.
    pub routes: Vec<Route>,
}

/// `server.read_buffer`'s default: the read-ahead on a caller's connection,
/// none. pingora reads a request's head into its own 4 KiB buffer and a body
/// into its 64 KiB body buffer, so a read-ahead smaller than those is passed
/// by (a read asking for as much or more goes straight to the socket) and
/// only held: the same system calls per request with none as with 4 KiB
/// (`strace`, sequential SendMessage), as on pingora's connections to
/// workers, which have none either. pingora's default, 64 KiB, is allocated
/// zeroed for every accepted connection and kept until it closes: once the
/// allocator hands out reused memory, the zeroing makes all of it resident,
/// and an open stream cost twice what it does without (`benches/streams.rs`).
/// A read-ahead larger than pingora's own buffers saves read calls only when
/// a caller sends more than those at once: many pipelined requests, or over
/// TLS (rustls reads 4 KiB or more at a time) large bodies.
pub const DEFAULT_READ_BUFFER: usize = 0;

/// `[server]`: where the gateway listens and how it names itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// Proxy listeners; at least one. Default `127.0.0.1:8080`.
    pub listen: Vec<SocketAddr>,
    /// Base URL written into rewritten agent cards, without a trailing `/`.
    /// `None`: derived per request from the caller's `Host`.
    pub public_url: Option<String>,
    /// Listener for `/healthz`, `/metrics` and `/tasks`; none by default.
    /// Off loopback only with `admin_token`.
    pub admin: Option<SocketAddr>,
    /// The bearer token the admin endpoint requires on everything but
    /// `/healthz` and `/readyz` (`server.admin_token_env` or
    /// `server.admin_token_file`). `None`: no token, and then the admin
    /// listener must be on loopback.
    pub admin_token: Option<Secret>,
    /// Proxy worker threads, 1 to 256. Default 2.
    pub threads: usize,
    /// Bytes read ahead on each caller connection (plain and TLS), 0 (none)
    /// to 1 MiB; held while the connection is open. Default
    /// [`DEFAULT_READ_BUFFER`].
    pub read_buffer: usize,
    /// `[server.tls]`: listeners that terminate TLS for callers. `None`:
    /// plain HTTP only (`listen`).
    pub tls: Option<ServerTls>,
    /// How log lines are written to stderr. Default [`LogFormat::Text`].
    pub log_format: LogFormat,
    /// One access-log line per request as it ends (target `a2agw::access`).
    /// Default on.
    pub access_log: bool,
    /// How long `info` and `debug` lines may wait in the log's buffer
    /// before they are written to stderr (a warning or an error is written
    /// at once, with what waited before it; so is a full buffer). Zero:
    /// every line at once. At most a minute. Default
    /// [`DEFAULT_LOG_FLUSH`].
    pub log_flush: std::time::Duration,
}

/// `server.log_flush`'s default: one write to stderr per second (or per
/// 64 KiB of lines) instead of one per request's access line.
pub const DEFAULT_LOG_FLUSH: std::time::Duration = std::time::Duration::from_secs(1);

/// A secret read from the environment or a file; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl Secret {
    /// The secret itself, for comparing; never for printing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Whether the admin endpoint may listen on `admin` without a token: only
/// on loopback, where only this host can reach it.
pub fn admin_needs_token(admin: SocketAddr) -> bool {
    !admin.ip().is_loopback()
}

/// `server.log_format`: the shape of the log lines on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event (ANSI colour only on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[server.tls]`: callers reach these listeners over TLS (HTTP/1.1); the
/// gateway serves the same routes on them as on `listen`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    /// At least one; none shared with `listen` or `admin`.
    pub listen: Vec<SocketAddr>,
    /// PEM certificate chain, leaf first; each certificate parsed at load.
    pub cert: PathBuf,
    /// PEM private key of the leaf (PKCS#8, PKCS#1 or SEC1); parsed at load.
    /// That it matches `cert` is checked when the gateway starts.
    pub key: PathBuf,
}

impl Default for Server {
    fn default() -> Self {
        Server {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 8080))],
            public_url: None,
            admin: None,
            admin_token: None,
            threads: 2,
            read_buffer: DEFAULT_READ_BUFFER,
            tls: None,
            log_format: LogFormat::Text,
            access_log: true,
            log_flush: DEFAULT_LOG_FLUSH,
        }
    }
}

/// Where task records live.
///
/// `Debug` hides the Redis URL's password ([`redact_url`]).
#[derive(Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// In this process (`memory://`): lost on restart, not shared.
    Memory,
    /// A Redis server (`redis://`, or `rediss://` over TLS), shared by
    /// gateway replicas.
    Redis { url: String },
}

impl fmt::Debug for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreKind::Memory => f.write_str("Memory"),
            StoreKind::Redis { url } => f
                .debug_struct("Redis")
                .field("url", &redact_url(url))
                .finish(),
        }
    }
}

/// What a request does when the store cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStoreError {
    /// Let the request through untracked (availability first).
    FailOpen,
    /// Refuse the request (policy first).
    FailClosed,
}

/// `[store]`.
///
/// `Debug` shows no password: the URL's is `***`, [`Secret`] hides the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    pub kind: StoreKind,
    pub on_store_error: OnStoreError,
    /// The Redis password from `store.password_env` or `store.password_file`,
    /// sent in place of one in the URL (which then has none). `None`: the
    /// URL's, if any.
    pub password: Option<Secret>,
    /// `store.tls_ca_file`: for `rediss://`, the CA certificates the
    /// server's certificate must chain to, in place of the system's roots.
    pub tls_ca: Option<WorkerCa>,
    /// `store.tls_client_cert` and `store.tls_client_key`: for `rediss://`,
    /// the certificate the gateway presents to a server that asks clients
    /// for one.
    pub tls_client_cert: Option<ClientCert>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            kind: StoreKind::Memory,
            on_store_error: OnStoreError::FailOpen,
            password: None,
            tls_ca: None,
            tls_client_cert: None,
        }
    }
}

/// A store URL as `store.url` takes it (`--store`): `memory://`, or a
/// `redis://` or `rediss://` URL. Errors show the URL with its password as
/// `***`.
pub fn parse_store_url(s: &str) -> Result<StoreKind, String> {
    schema::parse_store_url(s)
}

impl Store {
    /// Whether the settings fit the store's URL: a password from
    /// `password_env` or `password_file` only for a Redis URL without one
    /// of its own, TLS files only for `rediss://`. The config file's check
    /// makes the same when it names `store.url`; this one is for the URL
    /// `--store` gives. Messages show no password.
    pub fn check(&self) -> Result<(), String> {
        let url = match &self.kind {
            StoreKind::Memory => "memory://",
            StoreKind::Redis { url } => url,
        };
        let mut problems = Vec::new();
        if self.password.is_some() {
            if let Some(why) = schema::password_misfit(url) {
                problems.push(format!("store.password_env or store.password_file: {why}"));
            }
        }
        if self.tls_ca.is_some() || self.tls_client_cert.is_some() {
            if let Some(why) = schema::tls_misfit(url) {
                problems.push(format!("store.tls_ca_file or store.tls_client_cert: {why}"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// `[limits]`: the most the gateway holds in memory for one thing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// JSON bodies up to this many bytes are read for policy; larger ones
    /// pass through untracked.
    pub max_inspect_body: usize,
    /// The longest SSE line or event the stream parser holds.
    pub max_sse_event: usize,
    /// Agent-card bodies buffered for rewriting.
    pub max_card_body: usize,
    /// Capacity of the in-memory task store.
    pub max_tracked_tasks: u64,
    /// Live budget accounts (one per route, tenant or caller and window)
    /// the store keeps; a send that would open one more is refused.
    pub max_accounts: u64,
    /// Unary gRPC calls to one worker address that may share one HTTP/2
    /// connection at once (streaming calls get a connection each); 1 gives
    /// every call its own, as pingora does by default.
    pub worker_h2_streams: usize,
}

/// The most unary gRPC calls `limits.worker_h2_streams` lets share one
/// connection to a worker.
pub const MAX_WORKER_H2_STREAMS: usize = 1000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_inspect_body: 1 << 20,
            max_sse_event: 1 << 20,
            max_card_body: 1 << 20,
            max_tracked_tasks: 1_000_000,
            max_accounts: 100_000,
            worker_h2_streams: 100,
        }
    }
}

/// `[timeouts]` on connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting to a worker. Default 5s.
    pub connect: Duration,
    /// Read/write idle timeout on worker connections; `None` for none
    /// (`"0s"`). Default 1h: SSE streams may idle long.
    pub upstream_idle: Option<Duration>,
    /// The same for callers' connections. Default 1h.
    pub downstream_idle: Option<Duration>,
    /// How long a worker host name's resolved address is used before it is
    /// looked up again (in the background; requests keep using the last
    /// address meanwhile). IP addresses are never looked up. Default 30s.
    pub dns_refresh: Duration,
    /// After SIGTERM: how long requests in flight, and the cancels and store
    /// writes they left owed, may take before the process exits anyway (it
    /// exits as soon as none are left). Zero cuts them at once, as SIGINT
    /// does. Default 20s (under the 30 s Kubernetes waits before SIGKILL); at
    /// most [`MAX_DRAIN`].
    pub drain: Duration,
}

/// The longest `timeouts.drain`.
pub const MAX_DRAIN: Duration = Duration::from_secs(3600);

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            upstream_idle: Some(Duration::from_secs(3600)),
            downstream_idle: Some(Duration::from_secs(3600)),
            dns_refresh: Duration::from_secs(30),
            drain: Duration::from_secs(20),
        }
    }
}

/// `[cancel]`: how the gateway retries its own `CancelTask` calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cancel {
    /// Total tries, 1 to 100. Default 5.
    pub attempts: u32,
    /// Delay before the first retry, doubling each time. Default 100ms.
    pub backoff: Duration,
    /// Cap on the delay; at least `backoff`. Default 5s.
    pub backoff_max: Duration,
    /// Per attempt. Default 5s.
    pub timeout: Duration,
}

impl Default for Cancel {
    fn default() -> Self {
        Cancel {
            attempts: 5,
            backoff: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
        }
    }
}

/// `[tracing]`: OpenTelemetry spans for proxied requests and for the
/// gateway's own calls to workers, exported over OTLP/HTTP (protobuf). The
/// table is off by default; present, `otlp_endpoint` is required.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracing {
    /// The OTLP/HTTP receiver's base URL, `http://host:port` with an
    /// optional path, without a trailing `/` (spans are posted to
    /// `{otlp_endpoint}/v1/traces`). Plain HTTP only: a collector on
    /// loopback or a private network forwards them on.
    pub otlp_endpoint: String,
    /// `service.name` of the exported resource. Default `"a2a-gateway"`.
    pub service_name: String,
    /// The share of new traces (requests without a caller's sampled
    /// `traceparent`) that are recorded, 0 to 1. A caller's
    /// `traceparent` decides for its own trace. Default 1.
    pub sample_ratio: SampleRatio,
}

/// A ratio from 0 to 1 (never NaN, so it is `Eq`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleRatio(f64);

impl Eq for SampleRatio {}

impl SampleRatio {
    /// `r` if it is a number from 0 to 1.
    pub fn new(r: f64) -> Option<SampleRatio> {
        (0.0..=1.0).contains(&r).then_some(SampleRatio(r))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

impl Default for SampleRatio {
    fn default() -> Self {
        SampleRatio(1.0)
    }
}

/// `routes.worker_addresses`: what the addresses of a worker's name are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerAddresses {
    /// The first address is the worker (what a client library does); a
    /// name with several (dual-stack `localhost`, a load balancer's
    /// addresses) stays one worker.
    #[default]
    First,
    /// Every address is a replica (a Kubernetes headless Service): looked
    /// up again every `health_interval`; one that appears takes sends, one
    /// that goes away loses its tasks.
    All,
}

/// `routes.health_interval`'s default.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(5);

/// `tracing.service_name`'s default.
pub const DEFAULT_SERVICE_NAME: &str = "a2a-gateway";

/// `[[routes]]`: which requests go to which worker, under which policy.
///
/// `Debug` hides the credential.
#[derive(Clone, PartialEq, Eq)]
pub struct Route {
    /// Unique; 1 to 64 of `a-z0-9_-`. Used in logs and metrics.
    pub name: String,
    /// The worker: `worker`, or the first of `workers`.
    pub worker: WorkerUrl,
    /// Every replica of the worker (`workers`; `[worker]` for one), in
    /// config order, each its own `host:port`, all with `worker`'s scheme
    /// and base path. New sends are balanced over them; a task's later
    /// calls and cancels go to the one that took its send.
    pub workers: Vec<WorkerUrl>,
    /// How often the replicas of a route with several are health-checked
    /// (a TCP connect) and their addresses looked up again.
    pub health_interval: Duration,
    /// Whether each address a worker's name resolves to is a replica of its
    /// own (a headless Service), or only the first is used.
    pub worker_addresses: WorkerAddresses,
    /// Matches this path and paths below it (`/research`, `/research/x`);
    /// starts with `/`, never ends with one. `None`: any path.
    pub path_prefix: Option<String>,
    /// Matches the caller's `Host` (without port); lowercase. `None`: any host.
    pub host: Option<String>,
    /// Drop `path_prefix` before appending the path to the worker's base path.
    pub strip_prefix: bool,
    pub cascade: CascadePolicy,
    /// `Authorization` value for the gateway's own calls to this worker
    /// (such as `CancelTask`) when the caller's request carried none.
    pub worker_credential: Option<String>,
    /// The certificates an `https` worker's certificate must chain to, in
    /// place of the system's roots (workers behind a private CA). `None`:
    /// the system's roots.
    pub worker_ca: Option<WorkerCa>,
    /// The certificate and key the gateway presents to an `https` worker
    /// that asks for one (mutual TLS). `None`: none.
    pub worker_client_cert: Option<ClientCert>,
    pub lease: LeasePolicy,
    pub headers: HeaderPolicy,
    /// `[routes.budget]`: caps on the budget grants of the child tasks this
    /// route starts, and accounts they are reserved from. Inactive (the
    /// default) when the route names none.
    pub budget: BudgetPolicy,
    /// `[routes.auth]`: callers verified (JWT, API keys). `None`: callers
    /// are not authenticated, and `budget.caller_header` names them
    /// unverified.
    pub auth: Option<AuthPolicy>,
    /// gRPC services (`grpc.health.v1.Health`) whose calls pass to the
    /// worker unread even where the route checks sends: the operator's
    /// word that the worker serves no A2A send at their paths.
    pub grpc_pass_services: Vec<String>,
    /// What becomes of the children this route's tasks started through the
    /// gateway that still run when their parent completes
    /// (`on_parent_completed`, default `keep`).
    pub on_parent_completed: policies::delegation::OnParentCompleted,
}

impl Route {
    /// What makes the route check every send it passes (strict reading:
    /// what it cannot read is refused, not passed), as the words its
    /// start-up log line gives; empty when nothing does. `"lease_grants"`
    /// under `worker_leases = "auto"` holds until the worker's card
    /// declares the lease extension.
    pub fn send_checks(&self) -> Vec<&'static str> {
        let mut why = Vec::new();
        if self.auth.is_some() {
            why.push("auth");
        }
        if self.budget.is_active() {
            why.push("budget");
        }
        if self.lease.impose_ttl.is_some() {
            why.push("imposed_lease");
        }
        if self.lease.poll_ttl.is_some() {
            why.push("poll_lease");
        }
        if self.lease.worker_leases != WorkerLeases::Observe {
            why.push("lease_grants");
        }
        why
    }
}

/// How a route holds the children it starts to budgets (the a2a-rust budget
/// extension, `a2a-rust.com/budget`): each grant is checked, lowered to (or
/// refused above) the caps of the route, the caller's tenant and the caller,
/// and reserved from the accounts. Inactive (the default) when it has no
/// caps and no accounts.
///
/// `Debug` hides the caller keys (they are often API keys).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct BudgetPolicy {
    /// Route-wide caps on one task's grant.
    pub caps: Caps,
    /// What a grant above a cap gets: lowered to it (`Clamp`, the default)
    /// or refused (`Refuse`).
    pub over_cap: OverCap,
    /// Lower-cased name of the request header that names the caller, for
    /// `callers` and `per = "caller"` accounts: its value (an API key, say),
    /// or a `Bearer` JWT's `sub` claim (read by the gateway, not verified).
    /// `None`: callers are not told apart.
    pub caller_header: Option<String>,
    /// Caps on top of the route's for the tasks of each tenant (the A2A
    /// `tenant` of the request), by tenant name; none is empty.
    pub tenants: BTreeMap<String, Caps>,
    /// Caps on top of the route's for each caller, by the caller's exact
    /// name (see `caller_header`); none is empty. Non-empty only with `caller_header`.
    pub callers: BTreeMap<String, Caps>,
    /// Windowed allowances grants are reserved from, in file order. No two
    /// with the same `per` limit the same meter.
    pub accounts: Vec<AccountPolicy>,
}

impl BudgetPolicy {
    /// Whether the route holds budgets to anything: any caps (the route's,
    /// a tenant's or a caller's) or any account.
    pub fn is_active(&self) -> bool {
        !self.caps.is_empty()
            || self.tenants.values().any(|c| !c.is_empty())
            || self.callers.values().any(|c| !c.is_empty())
            || !self.accounts.is_empty()
    }
}

impl fmt::Debug for BudgetPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured so that a new field cannot be forgotten here.
        let BudgetPolicy {
            caps,
            over_cap,
            caller_header,
            tenants,
            callers,
            accounts,
        } = self;
        f.debug_struct("BudgetPolicy")
            .field("caps", caps)
            .field("over_cap", over_cap)
            .field("caller_header", caller_header)
            .field("tenants", tenants)
            .field(
                "callers",
                &callers
                    .values()
                    .map(|c| ("<redacted>", c))
                    .collect::<Vec<_>>(),
            )
            .field("accounts", accounts)
            .finish()
    }
}

/// Whose usage one budget account adds up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccountScope {
    /// One account for the whole route.
    Route,
    /// One account per tenant (the A2A `tenant` of the request).
    Tenant,
    /// One account per caller (the value of the route's `caller_header`).
    Caller,
}

impl AccountScope {
    /// The spelling used in config files (`per = "tenant"`).
    pub fn as_str(self) -> &'static str {
        match self {
            AccountScope::Route => "route",
            AccountScope::Tenant => "tenant",
            AccountScope::Caller => "caller",
        }
    }
}

/// `[[routes.budget.accounts]]`: an allowance of meters per route, tenant
/// or caller that the grants of its children are reserved from, so that a
/// network of tasks cannot spend more than it in one window however it fans
/// out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountPolicy {
    pub per: AccountScope,
    /// The account resets at each multiple of this since the Unix epoch
    /// (windows are aligned, so replicas agree on them). 1s to 366 days.
    pub window: Duration,
    /// The allowance of each meter per window; at least one, each at
    /// least 1, at most [`policies::budget::MAX_METERS`].
    pub meters: BTreeMap<String, u64>,
}

/// Headers the gateway adds to or removes from requests it forwards to a
/// route's worker (plain HTTP and WebSocket upgrades alike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderPolicy {
    /// Extension URIs merged into `A2A-Extensions` (never duplicated). On a
    /// WebSocket upgrade this is the only way to activate an extension for
    /// the whole socket.
    pub inject_extensions: Vec<String>,
    /// Headers set (replacing any the caller sent); names lower-case.
    pub inject_headers: Vec<(String, String)>,
    /// Headers removed before forwarding; names lower-case.
    pub strip_headers: Vec<String>,
    /// The caller's request headers that the gateway's own `CancelTask` for
    /// that caller's child repeats (as the worker received them), for
    /// workers that find a task by a header, such as a tenant header; names
    /// lower-case. Default `["x-tenant-id"]`.
    pub cancel_headers: Vec<String>,
}

impl Default for HeaderPolicy {
    fn default() -> Self {
        HeaderPolicy {
            inject_extensions: Vec::new(),
            inject_headers: Vec::new(),
            strip_headers: Vec::new(),
            // The header a2a-rust's `HeaderTenantResolver` reads by default.
            cancel_headers: vec!["x-tenant-id".to_string()],
        }
    }
}

/// Who enforces the lease extension for a route's worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WorkerLeases {
    /// Enforce unless the worker's agent card declares the lease extension
    /// (then the worker enforces grants itself and the gateway observes).
    #[default]
    Auto,
    /// Always enforce at the gateway.
    Enforce,
    /// Never enforce: pass grants through and only observe.
    Observe,
}

/// Per-route lease policy (the a2a-rust lease extension, enforced on the
/// wire for workers without a lease store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Grants above this are refused with InvalidParams (`max_lease_ttl`,
    /// default 1 h, as the SDK's `DEFAULT_MAX_LEASE_TTL`).
    pub max_ttl: Duration,
    /// `lease = { ttl = "30s" }`: a lease the gateway imposes on a streamed
    /// task whose caller granted none, renewed by the replica holding the
    /// caller's connection for as long as it lives.
    pub impose_ttl: Option<Duration>,
    /// `poll_lease = "30s"`: the task of a non-blocking `SendMessage`
    /// (`returnImmediately`) is cancelled when no `GetTask` or
    /// `SubscribeToTask` for it came through the gateway for this long.
    /// Off (`None`) by default.
    pub poll_ttl: Option<Duration>,
    pub worker_leases: WorkerLeases,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy {
            max_ttl: Duration::from_secs(3600),
            impose_ttl: None,
            poll_ttl: None,
            worker_leases: WorkerLeases::Auto,
        }
    }
}

/// `[delegation]`: delegation trees. Every send that may start or continue
/// a task gets a reference in the W3C trace context the worker receives
/// (`tracestate` member `a2agw`); a send that arrives carrying one starts a
/// child of that task, cancelled when its parent ends cancelled or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delegation {
    /// Whether references are given and children linked (default true).
    pub link: bool,
    /// The deepest a tree grows: a send whose parent is this deep is not
    /// linked (counted). 1 to 64, default 8.
    pub max_depth: u8,
}

impl Default for Delegation {
    fn default() -> Self {
        Delegation {
            link: true,
            max_depth: policies::delegation::DEFAULT_MAX_DEPTH,
        }
    }
}

/// `[leases]`: how this replica runs the lease reaper and renewer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leases {
    /// How often lapsed leases are looked for (default 100 ms; a lapse is
    /// acted on within this plus one CancelTask round trip).
    pub tick: Duration,
    /// How this replica names itself as the holder of gateway-held leases;
    /// default: host name, process id and start time.
    pub replica_id: Option<String>,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            tick: Duration::from_millis(100),
            replica_id: None,
        }
    }
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured so that a new field cannot be forgotten here.
        let Route {
            name,
            worker,
            workers,
            health_interval,
            worker_addresses,
            path_prefix,
            host,
            strip_prefix,
            cascade,
            worker_credential,
            worker_ca,
            worker_client_cert,
            lease,
            headers,
            budget,
            auth,
            grpc_pass_services,
            on_parent_completed,
        } = self;
        f.debug_struct("Route")
            .field("name", name)
            .field("worker", worker)
            .field("workers", workers)
            .field("health_interval", health_interval)
            .field("worker_addresses", worker_addresses)
            .field("path_prefix", path_prefix)
            .field("host", host)
            .field("strip_prefix", strip_prefix)
            .field("cascade", cascade)
            .field(
                "worker_credential",
                &worker_credential.as_ref().map(|_| "<redacted>"),
            )
            .field("worker_ca", worker_ca)
            .field("worker_client_cert", worker_client_cert)
            .field("lease", lease)
            .field(
                "headers",
                &format_args!(
                    "inject_extensions={:?} inject_headers={:?} strip_headers={:?} cancel_headers={:?}",
                    headers.inject_extensions,
                    headers
                        .inject_headers
                        .iter()
                        .map(|(k, _)| k)
                        .collect::<Vec<_>>(),
                    headers.strip_headers,
                    headers.cancel_headers
                ),
            )
            .field("budget", budget)
            .field("auth", auth)
            .field("grpc_pass_services", grpc_pass_services)
            .field("on_parent_completed", on_parent_completed)
            .finish()
    }
}

/// A route's `worker_ca` (or `store.tls_ca_file`): a PEM file of trust
/// anchors, read and checked when the config loads, so that a missing or
/// broken file stops start-up rather than failing each connection.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerCa {
    /// The file as configured, resolved against the config file's directory.
    pub path: PathBuf,
    /// Each certificate of the file, DER-encoded, in file order; at least one,
    /// each a parseable X.509 certificate.
    pub certs: Vec<Vec<u8>>,
}

impl fmt::Debug for WorkerCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.certs.len();
        let s = if n == 1 { "" } else { "s" };
        write!(f, "{} ({n} certificate{s})", self.path.display())
    }
}

/// A route's `worker_client_cert` and `worker_client_key` (or
/// `store.tls_client_cert` and `store.tls_client_key`): what the gateway
/// presents to a worker (or Redis) that asks callers for a certificate. Read and parsed
/// when the config loads; that the key is the certificate's is checked when
/// the gateway starts.
///
/// `Debug` shows the paths, never the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The PEM chain as configured (leaf first), resolved against the config
    /// file's directory.
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    /// The chain, DER-encoded, leaf first; at least one.
    pub certs: Vec<Vec<u8>>,
    /// The private key, DER (PKCS#8, PKCS#1 or SEC1).
    pub key: Vec<u8>,
}

impl fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} with key {}",
            self.cert_path.display(),
            self.key_path.display()
        )
    }
}

impl Config {
    /// The config of running without a file: every default, listening on
    /// `listen`, with one catch-all route named `"default"` to `worker`.
    pub fn single_worker(listen: SocketAddr, worker: &str) -> Result<Config, String> {
        Ok(Config {
            server: Server {
                listen: vec![listen],
                ..Server::default()
            },
            store: Store::default(),
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            cancel: Cancel::default(),
            routes: vec![Route {
                name: "default".into(),
                worker: WorkerUrl::parse(worker)?,
                workers: vec![WorkerUrl::parse(worker)?],
                health_interval: DEFAULT_HEALTH_INTERVAL,
                worker_addresses: WorkerAddresses::First,
                path_prefix: None,
                host: None,
                strip_prefix: true,
                cascade: CascadePolicy::default(),
                worker_credential: None,
                worker_ca: None,
                worker_client_cert: None,
                lease: LeasePolicy::default(),
                headers: HeaderPolicy::default(),
                budget: BudgetPolicy::default(),
                auth: None,
                grpc_pass_services: Vec::new(),
                on_parent_completed: Default::default(),
            }],
            leases: Leases::default(),
            tracing: None,
            delegation: Delegation::default(),
        })
    }
}

/// One problem in a config file.
///
/// Displays as `line:col: path: message`; `line` and `col` are 1-based
/// (`col` counts characters), or both 0 when the problem has no place
/// (the file could not be read), and then they are left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub line: usize,
    pub col: usize,
    /// Dotted path of the key, like `routes[1].worker`; empty for syntax
    /// errors and unreadable files.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "{}:{}: ", self.line, self.col)?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in a config file, in file order.
///
/// Displays one per line, each prefixed with `file:` when the errors come
/// from [`load`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors {
    /// The file the errors are about, when known.
    pub file: Option<PathBuf>,
    /// At least one.
    pub errors: Vec<ConfigError>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            if let Some(file) = &self.file {
                write!(f, "{}:", file.display())?;
                if e.line == 0 {
                    f.write_str(" ")?;
                }
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// A listener address whose port callers can be told: port 0 would bind one
/// the kernel picks, which nobody could be told (and `/readyz` could never
/// find). Checked for the config file's listeners and the command line's
/// `--listen` and `--admin` alike.
pub fn known_port(addr: SocketAddr) -> Result<SocketAddr, &'static str> {
    if addr.port() == 0 {
        Err("port 0 is not allowed: a listener needs a known port")
    } else {
        Ok(addr)
    }
}

/// Reads and validates a config file; errors are about `path`.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let with_file = |mut errors: ConfigErrors| {
        errors.file = Some(path.to_owned());
        errors
    };
    let src = std::fs::read_to_string(path).map_err(|e| {
        with_file(ConfigErrors {
            file: None,
            errors: vec![ConfigError {
                line: 0,
                col: 0,
                path: String::new(),
                message: format!("cannot read the config file: {e}"),
            }],
        })
    })?;
    let env = |name: &str| std::env::var(name).ok();
    parse_at(&src, path.parent(), &env).map_err(with_file)
}

/// Validates a config file's text. `worker_credential_env` keys are looked
/// up in the process environment.
pub fn parse(src: &str) -> Result<Config, ConfigErrors> {
    parse_with_env(src, &|name| std::env::var(name).ok())
}

/// [`parse`], looking up `worker_credential_env` variables with `env`
/// rather than in the process environment (for tests and embedding).
pub fn parse_with_env(
    src: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    parse_at(src, None, env)
}

/// [`parse_with_env`] for a file in `dir`: relative paths of the files it
/// names (`worker_ca`, `[server.tls]`) start there (at the working
/// directory when `dir` is `None`).
pub fn parse_at(
    src: &str,
    dir: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let outside = schema::Outside { env, dir };
    let sink = read::Sink::new(src);
    let doc = match toml_edit::ImDocument::parse(src) {
        Ok(doc) => doc,
        Err(e) => {
            let at = e.span().map_or(0, |s| s.start);
            let message = e.message().trim().replace('\n', "; ");
            let message = if message.is_empty() {
                "invalid TOML".to_owned()
            } else {
                format!("invalid TOML: {message}")
            };
            sink.push(at, "", message);
            return Err(ConfigErrors {
                file: None,
                errors: sink.into_errors(),
            });
        }
    };
    let mut root = read::Reader::root(&sink, doc.as_table());
    let config = schema::config(&mut root, &sink, &outside);
    root.finish();
    match config {
        Some(config) if sink.count() == 0 => Ok(config),
        _ => Err(ConfigErrors {
            file: None,
            errors: sink.into_errors(),
        }),
    }
}

#[cfg(test)]
mod docs_tests;
#[cfg(test)]
mod tests;
