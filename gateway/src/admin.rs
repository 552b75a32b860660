//! The admin endpoint: `/healthz` (the process is up and its background
//! services run, [`crate::health`]), `/readyz` (every proxy listener
//! accepts connections), `/metrics` (Prometheus text), `/tasks` (what the
//! store holds, as JSON, for debugging), `/tasks/{id}` (one task: its
//! record, lease, budget and owed cancel), `POST /tasks/{id}:cancel` (a
//! `CancelTask` sent by the gateway's own canceller), `/budgets` (accounts:
//! limit, spent, reserved, left; and this replica's in-flight child
//! budgets) and `POST /reload` (re-reads the config file, as SIGHUP does;
//! see [`crate::reload`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::json;

use crate::a2a::classify::percent_decode;
use crate::cancel::{CancelJob, CancelOutcome, Canceller};
use crate::metrics;
use crate::route::LiveRoutes;
use crate::store::{StoreError, TaskKey, TaskRecord, TaskStore};

/// Serves the admin paths.
#[derive(Debug)]
pub struct Admin {
    pub store: Arc<dyn TaskStore>,
    pub budgets: Arc<crate::budget::Budgets>,
    /// Every proxy listener (`server.listen` and `server.tls.listen`), for
    /// `/readyz`.
    pub listeners: Vec<SocketAddr>,
    /// The bearer token every path but `/healthz` and `/readyz` requires
    /// (`server.admin_token_*`); `None`: none.
    pub token: Option<config::Secret>,
    /// Set once every listener accepted a connection: they stay bound until
    /// the drain, which closes the admin listener as well.
    pub ready: AtomicBool,
    /// What `POST /reload` runs; `None`: not offered (404).
    pub reload: Option<Arc<crate::reload::Reloader>>,
    /// What `/tasks/{id}` looks in by route name and `POST
    /// /tasks/{id}:cancel` sends with; `None`: lookups by scan only, no
    /// cancel (404).
    pub tasks: Option<TaskAdmin>,
    /// The background services `/healthz` answers for.
    pub services: Arc<crate::health::Services>,
    /// Recomputes a task's delegation references, for `/tasks/{id}`'s
    /// `tree`; `None`: not shown.
    pub linker: Option<Arc<crate::link::Linker>>,
}

/// What the admin endpoint needs to find a task by its routes and to
/// cancel it.
#[derive(Debug)]
pub struct TaskAdmin {
    /// Where the admin listens: a cancel without a token only on loopback.
    pub addr: SocketAddr,
    pub routes: Arc<LiveRoutes>,
    pub canceller: Canceller,
    /// This replica's queued store writes: applied before a lookup, so
    /// that a task a stream here has named is found.
    pub tracker: crate::tracker::Tracker,
}

/// How many records a `/tasks/{id}` lookup scans for a task whose tenant
/// (or route) it was not given.
const LOOKUP_SCAN: usize = 10_000;

/// How long `/readyz` waits for one listener to accept.
const READY_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Where to connect to reach a listener: its own address, or loopback for
/// one bound to every interface.
fn reach(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

impl Admin {
    pub fn new(
        store: Arc<dyn TaskStore>,
        budgets: Arc<crate::budget::Budgets>,
        listeners: Vec<SocketAddr>,
        token: Option<config::Secret>,
    ) -> Admin {
        Admin {
            store,
            budgets,
            listeners,
            token,
            ready: AtomicBool::new(false),
            reload: None,
            tasks: None,
            services: Arc::default(),
            linker: None,
        }
    }

    /// Finds tasks by `routes`' names and offers `POST /tasks/{id}:cancel`,
    /// sent by `canceller`; `addr`: where the admin listens; `tracker`:
    /// this replica's queued writes, applied before each lookup.
    pub fn with_tasks(
        mut self,
        addr: SocketAddr,
        routes: Arc<LiveRoutes>,
        canceller: Canceller,
        tracker: crate::tracker::Tracker,
    ) -> Admin {
        self.tasks = Some(TaskAdmin {
            addr,
            routes,
            canceller,
            tracker,
        });
        self
    }

    /// `/tasks/{id}` shows the task's place in its delegation tree.
    pub fn with_linker(mut self, linker: Arc<crate::link::Linker>) -> Admin {
        self.linker = Some(linker);
        self
    }

    /// `/healthz` answers 503 once one of `services` stopped.
    pub fn with_health(mut self, services: Arc<crate::health::Services>) -> Admin {
        self.services = services;
        self
    }

    /// Offers `POST /reload`, run by `reloader`.
    pub fn with_reload(mut self, reloader: Arc<crate::reload::Reloader>) -> Admin {
        self.reload = Some(reloader);
        self
    }

    /// `POST /reload`: 200 and what was applied (with the settings that
    /// need a restart), or 422 and every reason it was refused.
    async fn reload(&self, session: &ServerSession) -> Response<Vec<u8>> {
        let Some(reloader) = &self.reload else {
            return not_found();
        };
        if session.req_header().method != http::Method::POST {
            let mut r = reply(
                405,
                "text/plain",
                b"method not allowed: POST /reload\n".to_vec(),
            );
            r.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
            return r;
        }
        let outcome = reloader.reload(crate::reload::Trigger::Admin).await;
        let status = match outcome {
            crate::reload::Outcome::Applied { .. } => 200,
            crate::reload::Outcome::Refused { .. } => 422,
        };
        reply(
            status,
            "application/json",
            outcome.to_json().to_string().into_bytes(),
        )
    }

    /// Readiness for an orchestrator (a Kubernetes `readinessProbe`):
    /// pingora binds a service's listeners one after another (a TLS one
    /// after loading its certificate), and the admin listener is its own
    /// service, so the admin answering says nothing about the proxy yet.
    /// Each listener is tried with a connection of its own until all have
    /// accepted once; the answer names those that did not.
    async fn readiness(&self) -> Response<Vec<u8>> {
        if self.ready.load(Ordering::Relaxed) {
            return reply(200, "text/plain", b"ready\n".to_vec());
        }
        let waiting = not_accepting(&self.listeners).await;
        if waiting.is_empty() {
            self.ready.store(true, Ordering::Relaxed);
            return reply(200, "text/plain", b"ready\n".to_vec());
        }
        let waiting: Vec<String> = waiting.iter().map(SocketAddr::to_string).collect();
        reply(
            503,
            "text/plain",
            format!(
                "not ready: not accepting connections yet on {}\n",
                waiting.join(", ")
            )
            .into_bytes(),
        )
    }
}

/// The listeners that did not accept a connection within
/// [`READY_CONNECT_TIMEOUT`].
async fn not_accepting(listeners: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut waiting = Vec::new();
    for &addr in listeners {
        let accepted = tokio::time::timeout(
            READY_CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(reach(addr)),
        )
        .await;
        if !matches!(accepted, Ok(Ok(_))) {
            waiting.push(addr);
        }
    }
    waiting
}

/// Whether an `Authorization` value is `Bearer <token>` (the scheme in any
/// case), compared in constant time.
fn bearer_matches(given: Option<&[u8]>, token: &str) -> bool {
    let Some(given) = given else {
        return false;
    };
    let Some((scheme, value)) = given.split_at_checked(7) else {
        return false;
    };
    let same = crate::auth::ct_eq(value, token.as_bytes());
    scheme.eq_ignore_ascii_case(b"bearer ") && same
}

impl Admin {
    /// Without a token (so on loopback), a 403 for a request not meant for
    /// this listener by a local client: a `Host` other than its own address
    /// (a browser led here by DNS rebinding sends the attacker's name), or
    /// an `Origin` other than `http://` and that `Host` (a page of another
    /// site: a cross-site `POST /reload`). `None`: it may pass.
    fn refuse_foreign(&self, session: &ServerSession) -> Option<Response<Vec<u8>>> {
        let own = self
            .tasks
            .as_ref()
            .map(|t| t.addr)
            .or_else(|| session.server_addr().and_then(|a| a.as_inet()).copied())?;
        let head = session.req_header();
        let why = foreign(own.port(), &head.headers, head.uri.authority())?;
        let from = session
            .client_addr()
            .map_or_else(|| "?".to_string(), ToString::to_string);
        tracing::info!(from = %from, path = %head.uri.path(), why, "admin request refused (no admin token: only this listener's own Host, no other Origin)");
        Some(reply(
            403,
            "text/plain",
            format!(
                "forbidden: {why}; without an admin token the admin endpoint answers only requests addressed to 127.0.0.1:{port}, [::1]:{port} or localhost:{port}, with no Origin of another site\n",
                port = own.port()
            )
            .into_bytes(),
        ))
    }
}

/// Why a request to a tokenless admin listening on `port` is not its own
/// ([`Admin::refuse_foreign`]), or `None`. `authority`: the request
/// target's, if absolute (HTTP/2's `:authority`).
fn foreign(
    port: u16,
    headers: &http::HeaderMap,
    authority: Option<&http::uri::Authority>,
) -> Option<&'static str> {
    let mut hosts = headers.get_all(http::header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Some("more than one Host header");
    }
    let host = match (host, authority) {
        (None, None) => return Some("no Host header"),
        (Some(h), a) => {
            let Ok(h) = h.to_str() else {
                return Some("the Host header is not visible ASCII");
            };
            if a.is_some_and(|a| !a.as_str().eq_ignore_ascii_case(h)) {
                return Some("the Host header and the request target name different hosts");
            }
            h
        }
        (None, Some(a)) => a.as_str(),
    };
    if !own_host(host, port) {
        return Some("the Host is not this listener's loopback address");
    }
    let mut origins = headers.get_all(http::header::ORIGIN).iter();
    match (origins.next(), origins.next()) {
        (None, _) => None,
        (Some(_), Some(_)) => Some("more than one Origin header"),
        (Some(o), None) => {
            let same = o
                .as_bytes()
                .strip_prefix(b"http://")
                .is_some_and(|o| o.eq_ignore_ascii_case(host.as_bytes()));
            (!same).then_some("a request from a page of another origin")
        }
    }
}

/// Whether `host` (a `Host` value) names this listener: `localhost`, a
/// loopback IPv4 address or `[::1]`, with `port` (80 when none is given).
fn own_host(host: &str, port: u16) -> bool {
    let (name, given) = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, "")) => (addr, None),
            Some((addr, rest)) => match rest.strip_prefix(':') {
                Some(p) => (addr, Some(p)),
                None => return false,
            },
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host, None),
        },
    };
    let port_ok = match given {
        None => port == 80,
        Some(p) => p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>() == Ok(port),
    };
    let loopback = if host.starts_with('[') {
        name.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback())
    } else {
        name.eq_ignore_ascii_case("localhost")
            || name.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback())
    };
    port_ok && loopback
}

fn not_found() -> Response<Vec<u8>> {
    reply(
        404,
        "text/plain",
        b"not found: try /healthz, /readyz, /metrics, /tasks, /tasks/{id}, POST /tasks/{id}:cancel, /budgets or POST /reload\n".to_vec(),
    )
}

fn reply(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .body(body)
        .unwrap_or_else(|_| Response::new(Vec::new()))
}

/// Which task `/tasks/{id}` names: its id (the path segment, decoded) and,
/// when given, its route and tenant (`?route=R&tenant=T`; `tenant=` is the
/// default tenant).
#[derive(Debug, PartialEq, Eq)]
struct Lookup {
    id: String,
    route: Option<String>,
    tenant: Option<String>,
}

impl Lookup {
    /// From the path after `/tasks/` (without `:cancel`) and the query.
    fn parse(raw_id: &str, query: Option<&str>) -> Result<Lookup, String> {
        if raw_id.is_empty() || raw_id.contains('/') {
            return Err("the path is /tasks/{id} or /tasks/{id}:cancel".into());
        }
        let mut lookup = Lookup {
            id: percent_decode(raw_id).into_owned(),
            route: None,
            tenant: None,
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(&v.replace('+', " ")).into_owned();
            match k {
                "route" => lookup.route = Some(v),
                "tenant" => lookup.tenant = Some(v),
                _ => {
                    return Err(format!(
                        "unknown query parameter {k:?}: only route and tenant"
                    ))
                }
            }
        }
        Ok(lookup)
    }

    fn matches(&self, key: &TaskKey) -> bool {
        *key.task_id == *self.id
            && self.route.as_deref().is_none_or(|r| r == &*key.route)
            && self.tenant.as_deref().is_none_or(|t| t == &*key.tenant)
    }

    fn to_json(&self) -> serde_json::Value {
        json!({"id": self.id, "route": self.route, "tenant": self.tenant})
    }
}

/// A task's name in the admin's answers.
fn key_json(key: &TaskKey) -> serde_json::Value {
    json!({"route": &*key.route, "tenant": &*key.tenant, "id": &*key.task_id})
}

/// The admin's words for a cancel's outcome.
fn outcome_word(outcome: CancelOutcome) -> &'static str {
    match outcome {
        CancelOutcome::Canceled => "canceled",
        CancelOutcome::NotCancelable => "already_terminal",
        CancelOutcome::NotFound => "unknown_to_worker",
        CancelOutcome::Failed | CancelOutcome::NotOwed => "worker_error",
    }
}

/// The budget of the in-flight child `key` names in `/budgets`' view of
/// this replica (`children`), with what is left of its grant at `now_ms`.
fn budget_of(view: &serde_json::Value, key: &TaskKey, now_ms: u64) -> Option<serde_json::Value> {
    let child = view["children"].as_array()?.iter().find(|c| {
        c["taskId"].as_str() == Some(&*key.task_id)
            && c["route"].as_str() == Some(&*key.route)
            && c["tenant"].as_str().unwrap_or("") == &*key.tenant
    })?;
    let mut left = serde_json::Map::new();
    if let Some(meters) = child["grant"]["meters"].as_object() {
        let meters: serde_json::Map<String, serde_json::Value> = meters
            .iter()
            .map(|(m, grant)| {
                let spent = child["spent"][m].as_u64().unwrap_or(0);
                let grant = grant.as_u64().unwrap_or(0);
                (m.clone(), grant.saturating_sub(spent).into())
            })
            .collect();
        left.insert("meters".into(), meters.into());
    }
    if let Some(deadline) = child["deadlineMs"].as_u64() {
        left.insert("remainingMs".into(), deadline.saturating_sub(now_ms).into());
    }
    Some(json!({
        "grant": child["grant"],
        "spent": child["spent"],
        "left": left,
        "deadlineMs": child["deadlineMs"],
        "exhausted": child["exhausted"],
        "reserved": child["reserved"],
        "caller": child["caller"],
    }))
}

fn json_reply(status: u16, body: &serde_json::Value) -> Response<Vec<u8>> {
    reply(status, "application/json", body.to_string().into_bytes())
}

fn method_not_allowed(allow: &'static str, what: &str) -> Response<Vec<u8>> {
    let mut r = reply(
        405,
        "text/plain",
        format!("method not allowed: {allow} {what}\n").into_bytes(),
    );
    r.headers_mut()
        .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
    r
}

impl Admin {
    /// `/tasks/{id}` and `/tasks/{id}:cancel`; `rest`: the path after
    /// `/tasks/`, as sent. An id that itself ends in `:cancel` is written
    /// with its colon escaped (`%3A`).
    async fn task(&self, session: &ServerSession, rest: &str) -> Response<Vec<u8>> {
        let (raw_id, cancel) = match rest.strip_suffix(":cancel") {
            Some(id) => (id, true),
            None => (rest, false),
        };
        let method = &session.req_header().method;
        if cancel && method != http::Method::POST {
            return method_not_allowed("POST", "/tasks/{id}:cancel");
        }
        if !cancel && method != http::Method::GET {
            return method_not_allowed("GET", "/tasks/{id}");
        }
        if cancel && self.tasks.is_none() {
            return not_found();
        }
        let lookup = match Lookup::parse(raw_id, session.req_header().uri.query()) {
            Ok(l) => l,
            Err(e) => return json_reply(400, &json!({"error": e})),
        };
        let found = match self.find(&lookup).await {
            Ok(found) => found,
            Err(e) => return json_reply(503, &json!({"error": e.to_string()})),
        };
        let from = session
            .client_addr()
            .map_or_else(|| "?".to_string(), ToString::to_string);
        let record = match <[TaskRecord; 1]>::try_from(found) {
            Ok([record]) => record,
            Err(found) => {
                let (status, body) = if found.is_empty() {
                    (
                        404,
                        json!({"error": "no such task in the store", "lookup": lookup.to_json()}),
                    )
                } else {
                    let candidates: Vec<_> = found
                        .iter()
                        .map(|r| {
                            let mut k = key_json(&r.key);
                            k["state"] = json!(r.state.map(|s| s.as_wire()));
                            k
                        })
                        .collect();
                    (
                        409,
                        json!({
                            "error": "several tasks have this id: name one with ?route=R&tenant=T",
                            "lookup": lookup.to_json(),
                            "candidates": candidates,
                        }),
                    )
                };
                if cancel {
                    tracing::info!(id = %lookup.id, route = ?lookup.route, tenant = ?lookup.tenant, from = %from, status, "admin cancel: not sent (no single task matches)");
                }
                return json_reply(status, &body);
            }
        };
        if cancel {
            self.cancel(record, &from).await
        } else {
            json_reply(200, &self.view(&record).await)
        }
    }

    /// The records `lookup` matches: read directly under each route (the
    /// one given, else every route this replica has) in the tenant given
    /// (else the default one), and, unless both were given, found by a
    /// scan of up to [`LOOKUP_SCAN`] records. Sorted by key.
    async fn find(&self, lookup: &Lookup) -> Result<Vec<TaskRecord>, StoreError> {
        // What streams on this replica have seen is written off their
        // path: applied first, so that it is found.
        if let Some(t) = &self.tasks {
            t.tracker.flush().await;
        }
        let routes: Vec<Arc<str>> = match (&lookup.route, &self.tasks) {
            (Some(r), _) => vec![Arc::from(r.as_str())],
            (None, Some(t)) => t.routes.claim_names().to_vec(),
            (None, None) => Vec::new(),
        };
        let tenant: Arc<str> = Arc::from(lookup.tenant.as_deref().unwrap_or(""));
        let mut found = Vec::new();
        for route in routes {
            let key = TaskKey {
                route,
                tenant: tenant.clone(),
                task_id: Arc::from(lookup.id.as_str()),
            };
            // A task is one record whatever tenant names it; the one asked
            // for must be the one it was recorded in.
            if let Some(record) = self.store.get(&key).await? {
                if lookup.tenant.is_none() || record.key.tenant == tenant {
                    found.push(record);
                }
            }
        }
        if lookup.route.is_none() || lookup.tenant.is_none() {
            for record in self.store.list(LOOKUP_SCAN).await? {
                if lookup.matches(&record.key) && !found.iter().any(|f| f.key == record.key) {
                    found.push(record);
                }
            }
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    /// `GET /replicas`: each route with several `workers`, each replica's
    /// authority and whether it is up (its last health check passed and no
    /// connection to it failed since).
    fn replicas(&self) -> Response<Vec<u8>> {
        let Some(tasks) = &self.tasks else {
            return json_reply(200, &json!({"routes": []}));
        };
        let routes: Vec<serde_json::Value> = tasks
            .routes
            .load()
            .all()
            .iter()
            .filter_map(|r| {
                let replicas = r.replicas.as_ref()?;
                let list: Vec<_> = replicas
                    .view()
                    .into_iter()
                    .map(|(replica, up)| json!({"replica": replica, "up": up}))
                    .collect();
                Some(json!({"route": &*r.name, "replicas": list}))
            })
            .collect();
        json_reply(200, &json!({ "routes": routes }))
    }

    /// `GET /tasks/{id}`: the record, its lease (and what is left of it),
    /// the budget this replica's ledger holds for it, and its owed cancel.
    async fn view(&self, record: &TaskRecord) -> serde_json::Value {
        let now = self.store.clock_ms();
        let owed = match self.store.outbox_get(&record.key).await {
            Ok(owed) => owed.map(|o| {
                json!({
                    "cause": o.cause,
                    "owner": o.owner,
                    "handedBack": o.owner.is_empty(),
                })
            }),
            Err(e) => Some(json!({"error": e.to_string()})),
        };
        let budget = budget_of(
            &self.budgets.admin_view().await,
            &record.key,
            crate::store::now_ms(),
        );
        let caller = budget
            .as_ref()
            .map_or(serde_json::Value::Null, |b| b["caller"].clone());
        let mut view = key_json(&record.key);
        let fields = json!({
            "store": self.store.kind(),
            "contextId": record.context_id,
            "state": record.state.map(|s| s.as_wire()),
            "binding": record.target.as_ref().map(|t| t.binding.as_str()),
            "watchers": record.watchers,
            "owner": record.owner,
            "replica": record.replica,
            "lease": record.lease.as_ref().map(|l| json!({
                "ttlMs": l.ttl_ms,
                "deadlineMs": l.deadline_ms,
                "leftMs": i128::from(l.deadline_ms) - i128::from(now),
                "holder": l.holder,
            })),
            "caller": caller,
            "budget": budget,
            "cancelOwed": owed,
            "updatedMs": record.updated_ms,
            "tree": self.tree_view(record).await,
        });
        if let (Some(view), Some(fields)) = (view.as_object_mut(), fields.as_object()) {
            view.extend(fields.clone());
        }
        view
    }

    /// The task's delegation tree as the store has it: the children linked
    /// under its references (its id, and its first message as recorded),
    /// and, for a linked child, its parent's reference and its depth.
    async fn tree_view(&self, record: &TaskRecord) -> serde_json::Value {
        let Some(linker) = &self.linker else {
            return serde_json::Value::Null;
        };
        let key = &record.key;
        let messages: Vec<String> = record.message_id.iter().cloned().collect();
        let refs = linker.task_refs(&key.route, &key.tenant, &key.task_id, &messages);
        let children = match self.store.children(&refs).await {
            Ok(kids) => json!(kids
                .iter()
                .map(|c| json!({
                    "route": &*c.route,
                    "tenant": &*c.tenant,
                    "messageId": c.message_id,
                    "binding": c.target.binding.as_str(),
                    "replica": c.replica,
                    "depth": c.depth,
                }))
                .collect::<Vec<_>>()),
            Err(e) => json!({"error": e.to_string()}),
        };
        let parent = match self.store.parent_of(&refs).await {
            Ok(Some((reference, depth))) => json!({"reference": reference, "depth": depth}),
            Ok(None) => serde_json::Value::Null,
            Err(e) => json!({"error": e.to_string()}),
        };
        json!({"references": refs, "parent": parent, "children": children})
    }

    /// `POST /tasks/{id}:cancel`: one `CancelTask` through the gateway's
    /// canceller (its retries, the task's binding and tenant, the route's
    /// credential and headers; cause `admin`), answered with its outcome.
    /// Once the worker answered, the task's owed cancel and lease end, as
    /// after any delivered cancel. One log line.
    async fn cancel(&self, record: TaskRecord, from: &str) -> Response<Vec<u8>> {
        let Some(tasks) = &self.tasks else {
            return not_found();
        };
        let key = record.key;
        if self.token.is_none() && config::admin_needs_token(tasks.addr) {
            // Refused at start; kept here so that it never goes unchecked.
            tracing::warn!(task = %key, from = %from, "admin cancel refused: no admin token off loopback");
            return json_reply(
                403,
                &json!({"error": "cancel needs server.admin_token_* on an admin listener off loopback"}),
            );
        }
        let unsent = |why: &str| {
            tracing::info!(task = %key, from = %from, why, "admin cancel: not sent");
            json_reply(422, &json!({"task": key_json(&key), "error": why}))
        };
        let Some(route) = tasks.routes.by_name(&key.route) else {
            return unsent("the task's route is not configured on this replica");
        };
        let Some(target) = record.target else {
            return unsent("the store does not say how the task was reached (no binding recorded)");
        };
        let Some(worker) = route.worker_for(record.replica.as_deref()).await else {
            crate::replicas::lost(&key, record.replica.as_deref());
            return unsent("the task's worker replica is not one of its route's workers any more");
        };
        let job = CancelJob {
            key: key.clone(),
            worker,
            target,
            headers: crate::cancel::cancel_headers(&route.cfg, &[]),
            cause: "admin",
            message_id: record.message_id.clone(),
        };
        // A drain waits for it.
        let _work = crate::drain::Work::start();
        let started = std::time::Instant::now();
        let (outcome, error) = tasks.canceller.cancel_reporting(&job).await;
        if outcome.is_done() {
            crate::cancel::record_canceled(&*self.store, &key, outcome).await;
            if let Err(e) = self.store.outbox_done(&key).await {
                metrics::STORE_ERRORS
                    .with_label_values(&["outbox_done"])
                    .inc();
                tracing::warn!(task = %key, error = %e, "could not end the task's lease and owed cancel after an admin cancel");
            }
        }
        let ms = started.elapsed().as_millis() as u64;
        let word = outcome_word(outcome);
        tracing::info!(task = %key, from = %from, outcome = word, ms, "admin cancel");
        json_reply(
            200,
            &json!({"task": key_json(&key), "outcome": word, "error": error, "ms": ms}),
        )
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if self.token.is_none() {
            if let Some(refused) = self.refuse_foreign(session) {
                return refused;
            }
        }
        let path = session.req_header().uri.path().to_string();
        if !matches!(path.as_str(), "/healthz" | "/readyz") {
            if let Some(token) = &self.token {
                let given = session
                    .req_header()
                    .headers
                    .get(http::header::AUTHORIZATION);
                if !bearer_matches(given.map(|v| v.as_bytes()), token.expose()) {
                    let mut r = reply(
                        401,
                        "text/plain",
                        b"unauthorized: send Authorization: Bearer <server.admin_token>\n".to_vec(),
                    );
                    r.headers_mut().insert(
                        http::header::WWW_AUTHENTICATE,
                        http::HeaderValue::from_static("Bearer realm=\"a2a-gateway admin\""),
                    );
                    return r;
                }
            }
        }
        if let Some(rest) = path.strip_prefix("/tasks/") {
            return self.task(session, rest).await;
        }
        match path.as_str() {
            "/healthz" => match self.services.unhealthy() {
                None => reply(200, "text/plain", b"ok\n".to_vec()),
                Some(why) => reply(503, "text/plain", why.into_bytes()),
            },
            "/readyz" => self.readiness().await,
            "/metrics" => reply(
                200,
                "text/plain; version=0.0.4",
                metrics::render().into_bytes(),
            ),
            "/budgets" => reply(
                200,
                "application/json",
                self.budgets.admin_view().await.to_string().into_bytes(),
            ),
            "/reload" => self.reload(session).await,
            "/replicas" => self.replicas(),
            "/tasks" => match self.store.list(1000).await {
                Ok(tasks) => {
                    let tasks: Vec<_> = tasks
                        .into_iter()
                        .map(|t| {
                            json!({
                                "route": &*t.key.route,
                                "tenant": &*t.key.tenant,
                                "id": &*t.key.task_id,
                                "contextId": t.context_id,
                                "state": t.state.map(|s| s.as_wire()),
                                "watchers": t.watchers,
                                "owner": t.owner,
                                "lease": t.lease.as_ref().map(|l| json!({
                                    "ttlMs": l.ttl_ms,
                                    "deadlineMs": l.deadline_ms,
                                    "holder": l.holder,
                                })),
                                "updatedMs": t.updated_ms,
                            })
                        })
                        .collect();
                    let leases = self.store.lease_count().await.ok();
                    let body =
                        json!({"store": self.store.kind(), "liveLeases": leases, "tasks": tasks});
                    reply(200, "application/json", body.to_string().into_bytes())
                }
                Err(e) => reply(
                    503,
                    "application/json",
                    json!({"error": e.to_string()}).to_string().into_bytes(),
                ),
            },
            _ => not_found(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener bound to every interface is reached on loopback; a port
    /// nothing listens on is named; an unbound port that starts listening
    /// is no longer named.
    #[tokio::test]
    async fn readiness_names_the_listeners_not_accepting() {
        let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let any_addr = SocketAddr::from(([0, 0, 0, 0], any.local_addr().unwrap().port()));
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free_addr = free.local_addr().unwrap();
        drop(free);
        let listeners = [any_addr, free_addr];
        assert_eq!(not_accepting(&listeners).await, vec![free_addr]);
        let now_bound = std::net::TcpListener::bind(free_addr).unwrap();
        assert_eq!(not_accepting(&listeners).await, Vec::<SocketAddr>::new());
        drop((any, now_bound));
    }

    #[test]
    fn bearer_tokens_compared_whole() {
        let t = "0123456789abcdef";
        assert!(bearer_matches(Some(b"Bearer 0123456789abcdef"), t));
        assert!(bearer_matches(Some(b"bearer 0123456789abcdef"), t));
        for bad in [
            &b"Bearer 0123456789abcde"[..],
            b"Bearer 0123456789abcdefg",
            b"Basic 0123456789abcdef",
            b"Bearer",
            b"",
        ] {
            assert!(!bearer_matches(Some(bad), t));
        }
        assert!(!bearer_matches(None, t));
    }

    /// The id is decoded after `:cancel` is split off; `tenant=` names the
    /// default tenant; unknown parameters and nested paths are refused.
    #[test]
    fn lookups_from_paths_and_queries() {
        let l = Lookup::parse("a%3Acancel", Some("route=w&tenant=")).unwrap();
        assert_eq!(
            l,
            Lookup {
                id: "a:cancel".into(),
                route: Some("w".into()),
                tenant: Some(String::new()),
            }
        );
        let key = TaskKey::new(&Arc::from("w"), None, "a:cancel");
        assert!(l.matches(&key));
        let l = Lookup::parse("t1", Some("tenant=acme%20co")).unwrap();
        assert_eq!(l.tenant.as_deref(), Some("acme co"));
        assert!(!l.matches(&TaskKey::new(&Arc::from("w"), None, "t1")));
        assert!(l.matches(&TaskKey::new(&Arc::from("x"), Some("acme co"), "t1")));
        assert!(Lookup::parse("t1", None)
            .unwrap()
            .matches(&key_of("r", "t", "t1")));
        assert!(Lookup::parse("t1", Some("tennant=x")).is_err());
        assert!(Lookup::parse("", None).is_err());
        assert!(Lookup::parse("a/b", None).is_err());
    }

    fn key_of(route: &str, tenant: &str, id: &str) -> TaskKey {
        TaskKey::new(&Arc::from(route), Some(tenant), id)
    }

    /// The child is found by route, tenant and id; what is left is the
    /// grant less the spend, and the time to its deadline.
    #[test]
    fn budget_left_of_a_child() {
        let view = json!({"accounts": [], "children": [
            {"route": "w", "tenant": null, "caller": "key:ab12", "taskId": "t1",
             "grant": {"remainingMs": 60000, "meters": {"tokens": 100}},
             "deadlineMs": 1_060_000u64, "spent": {"tokens": 30},
             "exhausted": null, "reserved": []},
        ]});
        let b = budget_of(&view, &key_of("w", "", "t1"), 1_010_000).unwrap();
        assert_eq!(
            b["left"],
            json!({"meters": {"tokens": 70}, "remainingMs": 50000})
        );
        assert_eq!(b["caller"], "key:ab12");
        assert!(budget_of(&view, &key_of("w", "acme", "t1"), 0).is_none());
        assert!(budget_of(&view, &key_of("v", "", "t1"), 0).is_none());
        assert!(budget_of(&view, &key_of("w", "", "t2"), 0).is_none());
    }

    /// A tokenless admin on port 9090 answers only its own loopback
    /// `Host`, and an `Origin` only when it is `http://` and that `Host`.
    #[test]
    fn foreign_hosts_and_origins() {
        let check = |headers: &[(&str, &str)], authority: Option<&str>| {
            let mut h = http::HeaderMap::new();
            for (k, v) in headers {
                h.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            let a = authority.map(|a| a.parse::<http::uri::Authority>().unwrap());
            foreign(9090, &h, a.as_ref())
        };
        for own in [
            "127.0.0.1:9090",
            "127.1.2.3:9090",
            "[::1]:9090",
            "localhost:9090",
            "LocalHost:9090",
        ] {
            assert_eq!(check(&[("host", own)], None), None, "{own}");
            let origin = format!("http://{own}");
            assert_eq!(
                check(&[("host", own), ("origin", &origin)], None),
                None,
                "{own}"
            );
            assert_eq!(check(&[], Some(own)), None, "HTTP/2 {own}");
        }
        for bad in [
            "evil.example:9090",
            "evil.example",
            "127.0.0.1",
            "127.0.0.1:9091",
            "127.0.0.1:09090x",
            "localhost",
            "localhost.:9090",
            "10.0.0.1:9090",
            "[::2]:9090",
            "[::1]9090",
            "[::1",
            "0.0.0.0:9090",
            "127.0.0.1.nip.io:9090",
        ] {
            assert_eq!(
                check(&[("host", bad)], None),
                Some("the Host is not this listener's loopback address"),
                "{bad}"
            );
        }
        assert!(own_host("localhost", 80));
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::HOST,
            http::HeaderValue::from_bytes(b"127.0.0.1:9090\xff").unwrap(),
        );
        assert_eq!(
            foreign(9090, &h, None),
            Some("the Host header is not visible ASCII")
        );
        assert_eq!(check(&[], None), Some("no Host header"));
        assert_eq!(
            check(
                &[("host", "127.0.0.1:9090"), ("host", "127.0.0.1:9090")],
                None
            ),
            Some("more than one Host header")
        );
        assert_eq!(
            check(&[("host", "127.0.0.1:9090")], Some("evil.example:9090")),
            Some("the Host header and the request target name different hosts")
        );
        for origin in [
            "http://evil.example",
            "null",
            "https://127.0.0.1:9090",
            "http://localhost:9090",
            "http://127.0.0.1:9090.evil.example",
        ] {
            assert_eq!(
                check(&[("host", "127.0.0.1:9090"), ("origin", origin)], None),
                Some("a request from a page of another origin"),
                "{origin}"
            );
        }
        assert_eq!(
            check(
                &[
                    ("host", "127.0.0.1:9090"),
                    ("origin", "http://127.0.0.1:9090"),
                    ("origin", "http://127.0.0.1:9090")
                ],
                None
            ),
            Some("more than one Origin header")
        );
    }

    #[test]
    fn unspecified_addresses_are_reached_on_loopback() {
        let v6: SocketAddr = "[::]:81".parse().unwrap();
        assert_eq!(reach(v6), "[::1]:81".parse().unwrap());
        let v4: SocketAddr = "0.0.0.0:80".parse().unwrap();
        assert_eq!(reach(v4), "127.0.0.1:80".parse().unwrap());
        let own: SocketAddr = "10.1.2.3:80".parse().unwrap();
        assert_eq!(reach(own), own);
    }
}
