//! The configured routes: choosing one by host and path prefix for a
//! request, finding one by name for a task's later calls and cancels, and
//! the live set a reload swaps ([`LiveRoutes`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::resolve::{WorkerAddr, WorkerAddrs};

/// A configured route, ready for the hot path.
#[derive(Debug)]
pub struct Route {
    pub name: Arc<str>,
    pub cfg: config::Route,
    /// Where the worker is reached (looked up off the request path).
    pub addr: Arc<WorkerAddr>,
    /// The route's `inject_extensions` include the lease extension: every
    /// request it forwards activates it.
    pub injects_lease_extension: bool,
    /// `Host` for the worker (its configured `host:port`).
    pub host_header: http::HeaderValue,
    /// The route's request metrics (`a2agw_requests_total`, worker errors
    /// and time to first byte), resolved once; counted as requests end.
    pub metrics: crate::metrics::RouteMetrics,
    /// `a2agw_proxy_seconds{route}`, resolved once.
    pub proxy_time: prometheus::Histogram,
    /// The worker's agent card (seen passing through) declares the lease
    /// extension: with `worker_leases = "auto"` the worker enforces grants.
    pub card_declares_lease: std::sync::atomic::AtomicBool,
    /// `[routes.auth]`: the caller's credential is verified first.
    pub auth: Option<Arc<crate::auth::Authenticator>>,
    /// A route with several `workers`: which replica takes a new send.
    /// `None` for one worker, which `addr` reaches.
    pub replicas: Option<Arc<crate::replicas::Replicas>>,
}

impl Route {
    /// Whether the gateway enforces anything for this route's sends (lease
    /// grants, an imposed lease, a poll lease, a budget, a send's verified
    /// owner): then it must read every call it passes completely and
    /// unambiguously, and refuses what it cannot.
    pub fn checks_sends(&self) -> bool {
        self.auth.is_some()
            || self.cfg.budget.is_active()
            || self.cfg.lease.impose_ttl.is_some()
            || self.polls()
            || self.gateway_enforces_leases()
    }

    /// Where the gateway's own calls for a task of this route go (cancels,
    /// probes, lookups): the replica recorded with it on a route with
    /// several `workers`, else the worker. `None` when the route has no
    /// such replica (any more), or none was recorded: the task is lost to
    /// the gateway, and is never sent to another replica as if it ran there.
    pub async fn worker_for(&self, replica: Option<&str>) -> Option<config::WorkerUrl> {
        match (&self.replicas, replica) {
            // A task recorded on another worker than the route's one (a
            // reload scaled it down) is not this worker's; one recorded
            // before replicas were recorded is.
            (None, _) => replica
                .is_none_or(|a| a == self.addr.authority())
                .then(|| self.cfg.worker.clone()),
            (Some(r), Some(a)) => r.find_known(a).await.map(|m| m.url().clone()),
            (Some(_), None) => None,
        }
    }

    /// The route has `poll_lease`: non-blocking sends' tasks are cancelled
    /// when their callers stop polling.
    pub fn polls(&self) -> bool {
        self.cfg.lease.poll_ttl.is_some()
    }

    /// Whether the gateway enforces lease grants for this route's worker.
    pub fn gateway_enforces_leases(&self) -> bool {
        match self.cfg.lease.worker_leases {
            config::WorkerLeases::Enforce => true,
            config::WorkerLeases::Observe => false,
            config::WorkerLeases::Auto => !self
                .card_declares_lease
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// Routes in match order: host and prefix, then prefix (longest first), then
/// host only, then the catch-all.
#[derive(Debug)]
pub struct Routes {
    routes: Vec<Arc<Route>>,
    addrs: Arc<WorkerAddrs>,
}

/// A route and the request path as the worker's interface sees it.
#[derive(Debug)]
pub struct Matched<'a> {
    pub route: &'a Arc<Route>,
    /// The path below the route's prefix, starting with `/`: relative to the
    /// worker's interface URL, which is where A2A paths are defined.
    pub rel: &'a str,
    /// The prefix the gateway serves this route under (`""` when none).
    pub prefix: &'a str,
}

impl Route {
    /// The worker path that the route's root maps to: the worker's base path,
    /// plus the prefix when the route does not strip it.
    pub fn worker_root(&self, prefix: &str) -> String {
        let base = &self.cfg.worker.base_path;
        if self.cfg.strip_prefix {
            base.clone()
        } else {
            format!("{base}{prefix}")
        }
    }
}

impl Routes {
    /// `dns_refresh`: how long a worker name's looked-up address is used.
    pub fn new(cfg: &[config::Route], dns_refresh: Duration) -> Self {
        Routes::with_addrs(cfg, Arc::new(WorkerAddrs::new(cfg, dns_refresh)))
    }

    /// The routes of `cfg` reaching their workers through `addrs` (which
    /// must know them: [`WorkerAddrs::new`] or [`WorkerAddrs::update`] with
    /// `cfg`), as a reload builds them.
    pub fn with_addrs(cfg: &[config::Route], addrs: Arc<WorkerAddrs>) -> Self {
        let mut routes: Vec<Arc<Route>> = cfg
            .iter()
            .map(|r| {
                let injected: Vec<&str> = r
                    .headers
                    .inject_extensions
                    .iter()
                    .map(String::as_str)
                    .collect();
                let addr = addrs.get(&r.worker);
                Arc::new(Route {
                    name: r.name.as_str().into(),
                    cfg: r.clone(),
                    host_header: http::HeaderValue::from_str(addr.authority())
                        .expect("a validated worker authority is a header value"),
                    metrics: crate::metrics::RouteMetrics::new(&r.name),
                    proxy_time: crate::metrics::PROXY_TIME.with_label_values(&[&r.name]),
                    addr,
                    injects_lease_extension: crate::a2a::extensions::names(
                        &injected,
                        policies::lease::LEASE_EXTENSION_URI,
                    ),
                    card_declares_lease: std::sync::atomic::AtomicBool::new(false),
                    auth: r
                        .auth
                        .as_ref()
                        .map(|a| crate::auth::Authenticator::build(&r.name, a)),
                    replicas: (r.workers.len() > 1
                        || r.worker_addresses == config::WorkerAddresses::All)
                        .then(|| Arc::new(crate::replicas::Replicas::new(r, &addrs))),
                })
            })
            .collect();
        routes.sort_by_key(|r| {
            let prefix_len = r.cfg.path_prefix.as_ref().map_or(0, String::len);
            (
                std::cmp::Reverse(r.cfg.host.is_some() && r.cfg.path_prefix.is_some()),
                std::cmp::Reverse(prefix_len),
                std::cmp::Reverse(r.cfg.host.is_some()),
            )
        });
        Routes { routes, addrs }
    }

    /// The workers' addresses, shared with the gateway's own cancels.
    pub fn worker_addrs(&self) -> Arc<WorkerAddrs> {
        self.addrs.clone()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.routes.iter()
    }

    /// The route named `name` (as stored with a task), if this replica has it.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| &*r.name == name)
    }

    /// Every route, in match order.
    pub fn all(&self) -> &[Arc<Route>] {
        &self.routes
    }

    /// The route for `host` (without port, any case) and `path`.
    pub fn find<'a>(&'a self, host: Option<&str>, path: &'a str) -> Option<Matched<'a>> {
        for route in &self.routes {
            if let Some(h) = &route.cfg.host {
                if !host.is_some_and(|x| x.eq_ignore_ascii_case(h)) {
                    continue;
                }
            }
            let (rest, prefix) = match &route.cfg.path_prefix {
                Some(p) => match path.strip_prefix(p.as_str()) {
                    Some(rest) if rest.is_empty() || rest.starts_with('/') => (rest, p.as_str()),
                    _ => continue,
                },
                None => (path, ""),
            };
            return Some(Matched {
                route,
                rel: if rest.is_empty() { "/" } else { rest },
                prefix,
            });
        }
        None
    }
}

/// Removes a `:port` from a Host value (IPv6 literals keep their brackets).
pub fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// The routes new requests are matched against, swapped whole by a reload,
/// and the routes a reload removed, kept for the leases and owed cancels
/// that name them.
#[derive(Debug)]
pub struct LiveRoutes {
    current: ArcSwap<Routes>,
    /// Removed by a reload and not configured again since, by name: their
    /// lapsed leases and owed cancels are still claimed and sent with this
    /// config. One entry per route name ever removed (a name configured
    /// again leaves it), so it is bounded by the config files' routes.
    retired: Mutex<HashMap<Arc<str>, Arc<Route>>>,
    /// The current and retired routes' names, for the store's claims.
    names: ArcSwap<Vec<Arc<str>>>,
    addrs: Arc<WorkerAddrs>,
}

/// What a reload changed in the routes, by name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RouteChanges {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl LiveRoutes {
    pub fn new(routes: Routes) -> Self {
        let names = routes.iter().map(|r| r.name.clone()).collect();
        LiveRoutes {
            addrs: routes.worker_addrs(),
            current: ArcSwap::from_pointee(routes),
            retired: Mutex::new(HashMap::new()),
            names: ArcSwap::from_pointee(names),
        }
    }

    /// The routes for a new request: one atomic load. The request keeps the
    /// `Arc<Route>` it matched, so a reload after this changes nothing for it.
    #[inline]
    pub fn load(&self) -> arc_swap::Guard<Arc<Routes>> {
        self.current.load()
    }

    /// The route named `name` (as stored with a task): the configured one,
    /// else the one of that name a reload removed (its lapsed leases and owed
    /// cancels are still sent as it said), else `None`.
    pub fn by_name(&self, name: &str) -> Option<Arc<Route>> {
        if let Some(r) = self.current.load().by_name(name) {
            return Some(r.clone());
        }
        self.retired().get(name).cloned()
    }

    /// The names of the routes this replica claims lapsed leases and owed
    /// cancels for: the configured ones and the removed ones.
    pub fn claim_names(&self) -> Arc<Vec<Arc<str>>> {
        self.names.load_full()
    }

    /// The workers' addresses, shared with the gateway's own cancels.
    pub fn worker_addrs(&self) -> Arc<WorkerAddrs> {
        self.addrs.clone()
    }

    fn retired(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Route>>> {
        self.retired.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Builds the routes of `cfg` (new workers' addresses added to the
    /// shared ones and looked up in the background) and makes them the ones
    /// new requests match. A route whose worker is unchanged keeps what it
    /// learnt from the worker's agent card. Reloads are serialized by their
    /// caller ([`Reloader`]).
    pub fn replace(&self, cfg: &[config::Route]) -> RouteChanges {
        let added_addrs = self.addrs.update(cfg);
        if !added_addrs.is_empty() {
            tokio::spawn(async move { WorkerAddrs::warm(&added_addrs).await });
        }
        let new = Routes::with_addrs(cfg, self.addrs.clone());
        let old = self.current.load_full();
        let mut changes = RouteChanges::default();
        for r in new.iter() {
            match old.by_name(&r.name) {
                None => changes.added.push(r.name.to_string()),
                Some(o) => {
                    if o.cfg != r.cfg {
                        changes.changed.push(r.name.to_string());
                    }
                    if o.cfg.worker == r.cfg.worker {
                        let seen = o
                            .card_declares_lease
                            .load(std::sync::atomic::Ordering::Relaxed);
                        r.card_declares_lease
                            .store(seen, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        }
        let mut retired = self.retired();
        for o in old.iter() {
            if new.by_name(&o.name).is_none() {
                changes.removed.push(o.name.to_string());
                retired.insert(o.name.clone(), o.clone());
            }
        }
        for r in new.iter() {
            retired.remove(&r.name);
        }
        let mut names: Vec<Arc<str>> = new.iter().map(|r| r.name.clone()).collect();
        names.extend(retired.keys().cloned());
        self.names.store(Arc::new(names));
        self.current.store(Arc::new(new));
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, host: Option<&str>, prefix: Option<&str>) -> config::Route {
        let mut r =
            config::Config::single_worker("127.0.0.1:1".parse().unwrap(), "http://127.0.0.1:9000")
                .unwrap()
                .routes
                .remove(0);
        r.name = name.into();
        r.host = host.map(str::to_string);
        r.path_prefix = prefix.map(str::to_string);
        r
    }

    #[test]
    fn match_table() {
        let routes = Routes::new(
            &[
                route("catch", None, None),
                route("a", None, Some("/a")),
                route("ab", None, Some("/a/b")),
                route("h", Some("h.example"), None),
                route("ha", Some("h.example"), Some("/a")),
            ],
            Duration::from_secs(30),
        );
        let table = [
            (None, "/x", "catch", "/x"),
            (None, "/a", "a", "/"),
            (None, "/a/x", "a", "/x"),
            (None, "/ab", "catch", "/ab"),
            (None, "/a/b/c", "ab", "/c"),
            (Some("H.Example"), "/x", "h", "/x"),
            (Some("h.example"), "/a/x", "ha", "/x"),
            (Some("other"), "/a/b", "ab", "/"),
        ];
        for (host, path, name, rest) in table {
            let m = routes.find(host, path).unwrap();
            assert_eq!((&*m.route.name, m.rel), (name, rest), "{host:?} {path}");
        }
        let no_catch = Routes::new(&[route("a", None, Some("/a"))], Duration::from_secs(30));
        assert!(no_catch.find(None, "/b").is_none());
    }

    #[test]
    fn hosts() {
        assert_eq!(host_without_port("a.b:80"), "a.b");
        assert_eq!(host_without_port("a.b"), "a.b");
        assert_eq!(host_without_port("[::1]:80"), "[::1]");
    }
}
