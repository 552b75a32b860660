//! Worker addresses, looked up off the request path.
//!
//! pingora's `HttpPeer::new("host:port", ..)` resolves the name with the
//! blocking system resolver on every call and panics when that fails. Per
//! request, that would hold a proxy thread on DNS for every call to a named
//! worker, and a name that stops resolving would drop every caller's
//! connection without an answer (and a cancel to that worker would vanish
//! uncounted). Here a worker's address is looked up asynchronously, kept for
//! `timeouts.dns_refresh`, then looked up again in the background while
//! requests keep the last address. A worker given as an IP address is never
//! looked up.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use pingora::protocols::tls::CaType;
use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::{parse_x509, CertKey, WrappedX509};

use crate::metrics;

/// One worker's address and TLS settings (shared by every route and cancel
/// that names the same `host:port`; the config makes such routes agree on
/// `worker_ca` and the client certificate).
pub struct WorkerAddr {
    /// `host:port` as configured, for messages and the metric label.
    authority: String,
    /// The name to look up (an IPv6 literal without its brackets).
    host: String,
    port: u16,
    /// Set when the host is an IP address: nothing to look up.
    literal: Option<SocketAddr>,
    refresh: Duration,
    last: RwLock<Option<Resolved>>,
    refreshing: AtomicBool,
    /// The route's `worker_ca`, as pingora takes it; `None`: the system's
    /// roots.
    ca: Option<Arc<CaType>>,
    /// The route's `worker_client_cert` and key; `None`: none presented.
    client: Option<Arc<CertKey>>,
    /// The configured `worker_ca` and `worker_client_cert` these were made
    /// from: a reload keeps this address (and its last lookup) while they
    /// are unchanged.
    tls_source: (Option<config::WorkerCa>, Option<config::ClientCert>),
}

impl std::fmt::Debug for WorkerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerAddr")
            .field("authority", &self.authority)
            .field("literal", &self.literal)
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

#[derive(Clone, Debug)]
struct Resolved {
    addr: SocketAddr,
    /// Every address the lookup gave, in the resolver's order (`addr` is
    /// the first): a route with `worker_addresses = "all"` makes each a
    /// replica.
    all: Arc<[SocketAddr]>,
    at: Instant,
}

impl WorkerAddr {
    /// `refresh`: how long a looked-up address is used before the next
    /// lookup starts.
    /// `ca`, `client`: the route's `worker_ca` and `worker_client_cert`.
    pub fn new(
        worker: &config::WorkerUrl,
        ca: Option<&config::WorkerCa>,
        client: Option<&config::ClientCert>,
        refresh: Duration,
    ) -> Self {
        let host = worker
            .host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&worker.host)
            .to_owned();
        let literal = host
            .parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, worker.port));
        WorkerAddr {
            authority: worker.authority(),
            host,
            port: worker.port,
            literal,
            refresh,
            last: RwLock::new(None),
            refreshing: AtomicBool::new(false),
            ca: ca.map(|ca| {
                // The config parsed each of them as pingora will.
                let certs: Vec<WrappedX509> = ca
                    .certs
                    .iter()
                    .map(|der| WrappedX509::new(der.clone(), parse_x509))
                    .collect();
                Arc::from(certs)
            }),
            // The config parsed the chain and the key as pingora will.
            client: client.map(|c| Arc::new(CertKey::new(c.certs.clone(), c.key.clone()))),
            tls_source: (ca.cloned(), client.cloned()),
        }
    }

    /// How the proxy and the gateway's own calls reach the worker at
    /// `addr`: over TLS when `tls`, with the worker's host name as SNI,
    /// checked against its `worker_ca` (else the system's roots), presenting
    /// its client certificate if one is configured.
    pub fn peer(&self, addr: SocketAddr, tls: bool) -> HttpPeer {
        // SNI only matters on TLS; an empty name is not allocated.
        let sni = if tls {
            self.host.clone()
        } else {
            String::new()
        };
        let mut peer = HttpPeer::new(addr, tls, sni);
        if tls {
            peer.options.ca = self.ca.clone();
            peer.client_cert_key = self.client.clone();
        }
        peer
    }

    /// `host:port` as configured.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The address to connect to now. Never blocks the thread: an IP address
    /// is returned as is; a name's last address is returned while it is
    /// fresh, and while a background lookup replaces a stale one; only a
    /// name never resolved yet (or whose every lookup failed) is looked up
    /// here, and its failure is the error.
    pub async fn get(self: &Arc<Self>) -> Result<SocketAddr, String> {
        if let Some(a) = self.literal {
            return Ok(a);
        }
        // The address and its age only: every request asks, and the list
        // of every address is for the replicas' checks.
        let last = self
            .last
            .read()
            .ok()
            .and_then(|l| l.as_ref().map(|r| (r.addr, r.at)));
        match last {
            Some((addr, at)) if at.elapsed() < self.refresh => Ok(addr),
            Some((addr, _)) => {
                self.refresh_in_background();
                Ok(addr)
            }
            None => self.lookup().await,
        }
    }

    /// Every address of the worker's name, looked up now (the replicas'
    /// check does, every `health_interval`); the literal address of a
    /// worker given as one.
    pub async fn lookup_all(self: &Arc<Self>) -> Result<Arc<[SocketAddr]>, String> {
        if let Some(a) = self.literal {
            return Ok(Arc::from([a]));
        }
        self.lookup().await?;
        let all = self
            .last
            .read()
            .ok()
            .and_then(|l| l.as_ref().map(|r| r.all.clone()));
        all.ok_or_else(|| format!("the worker host {:?} has no address yet", self.host))
    }

    /// Looks the name up and keeps every address; the first (the system
    /// resolver's order, as pingora would have used) is the worker's.
    async fn lookup(&self) -> Result<SocketAddr, String> {
        let found = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|e| e.to_string())
            .and_then(|addrs| {
                let mut all: Vec<SocketAddr> = Vec::new();
                for a in addrs {
                    if !all.contains(&a) {
                        all.push(a);
                    }
                }
                (!all.is_empty())
                    .then_some(all)
                    .ok_or_else(|| "no addresses".to_owned())
            });
        match found {
            Ok(all) => {
                let addr = all[0];
                if let Ok(mut l) = self.last.write() {
                    *l = Some(Resolved {
                        addr,
                        all: all.into(),
                        at: Instant::now(),
                    });
                }
                Ok(addr)
            }
            Err(e) => {
                metrics::WORKER_RESOLVE_ERRORS
                    .with_label_values(&[&self.authority])
                    .inc();
                Err(format!(
                    "the worker host {:?} could not be resolved: {e}",
                    self.host
                ))
            }
        }
    }

    /// One lookup at a time; a failed one keeps the last address for another
    /// `refresh` (a resolver that is down is not asked once per request).
    fn refresh_in_background(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.lookup().await {
                tracing::warn!(worker = %me.authority, error = %e, "keeping the worker's last address");
                if let Ok(mut l) = me.last.write() {
                    if let Some(r) = l.as_mut() {
                        r.at = Instant::now();
                    }
                }
            }
            me.refreshing.store(false, Ordering::Release);
        });
    }
}

/// Every configured worker's address, one per distinct `host:port`.
/// Shared by the proxy's routes and the gateway's own cancels; a reload
/// ([`WorkerAddrs::update`]) adds the new workers in place.
#[derive(Debug, Default)]
pub struct WorkerAddrs {
    by_authority: arc_swap::ArcSwap<HashMap<String, Arc<WorkerAddr>>>,
    refresh: Duration,
}

/// The route whose TLS settings a worker's `host:port` takes: the config
/// makes the https routes to one host:port agree on them; an http route to
/// it has none and must not hide them.
/// Every replica a route names (`workers`) is a worker of its own here.
fn tls_routes(routes: &[config::Route]) -> HashMap<String, (&config::Route, &config::WorkerUrl)> {
    let mut first: HashMap<String, (&config::Route, &config::WorkerUrl)> = HashMap::new();
    for r in routes {
        for w in &r.workers {
            let e = first.entry(w.authority()).or_insert((r, w));
            if !e.1.tls {
                *e = (r, w);
            }
        }
    }
    first
}

fn worker_addr((r, w): (&config::Route, &config::WorkerUrl), refresh: Duration) -> Arc<WorkerAddr> {
    Arc::new(WorkerAddr::new(
        w,
        r.worker_ca.as_ref(),
        r.worker_client_cert.as_ref(),
        refresh,
    ))
}

impl WorkerAddrs {
    /// One per distinct worker `host:port` of `routes`, with its TLS
    /// settings.
    pub fn new(routes: &[config::Route], refresh: Duration) -> Self {
        let by_authority = tls_routes(routes)
            .into_iter()
            .map(|(k, r)| (k, worker_addr(r, refresh)))
            .collect();
        WorkerAddrs {
            by_authority: arc_swap::ArcSwap::from_pointee(by_authority),
            refresh,
        }
    }

    /// A reload's routes: a worker already known with the same TLS settings
    /// keeps its address (and its last lookup); a new worker, or one whose
    /// `worker_ca` or client certificate changed, gets a new one. Workers
    /// no route names any more are kept, so that the cancels still owed to
    /// them (a removed route's leases) reach them as configured. Returns
    /// the new addresses, to be looked up ([`WorkerAddrs::warm`]).
    /// Reloads are serialized by their caller.
    pub fn update(&self, routes: &[config::Route]) -> Vec<Arc<WorkerAddr>> {
        let mut map = HashMap::clone(&self.by_authority.load());
        let mut added = Vec::new();
        for (k, (r, w)) in tls_routes(routes) {
            let same = map.get(&k).is_some_and(|a| {
                a.tls_source.0.as_ref() == r.worker_ca.as_ref()
                    && a.tls_source.1.as_ref() == r.worker_client_cert.as_ref()
            });
            if !same {
                let a = worker_addr((r, w), self.refresh);
                added.push(a.clone());
                map.insert(k, a);
            }
        }
        self.by_authority.store(Arc::new(map));
        added
    }

    /// Looks up every worker host name once, so that the first requests
    /// find an address waiting; a name that fails is logged and looked up
    /// again by the first request that needs it.
    pub async fn warm_up(&self) {
        let all: Vec<Arc<WorkerAddr>> = self.by_authority.load().values().cloned().collect();
        WorkerAddrs::warm(&all).await;
    }

    /// [`WorkerAddrs::warm_up`] for `addrs` only (those a reload added).
    pub async fn warm(addrs: &[Arc<WorkerAddr>]) {
        for a in addrs {
            if a.literal.is_some() {
                continue;
            }
            match a.get().await {
                Ok(addr) => tracing::info!(worker = %a.authority, %addr, "worker address"),
                Err(e) => {
                    tracing::warn!(worker = %a.authority, error = %e, "worker address not found yet")
                }
            }
        }
    }

    /// The worker `base` names, at one of its addresses (a replica of a
    /// route with `worker_addresses = "all"`): `ip:port` as its authority,
    /// `base`'s name for TLS (SNI, certificate checks), CA and client
    /// certificate. Kept by authority like a configured worker, so that a
    /// cancel for a task on it finds the same settings.
    pub fn pinned(
        &self,
        base: &WorkerAddr,
        addr: SocketAddr,
        url: &config::WorkerUrl,
    ) -> Arc<WorkerAddr> {
        let authority = url.authority();
        if let Some(a) = self.by_authority.load().get(&authority) {
            return a.clone();
        }
        let a = Arc::new(WorkerAddr {
            authority: authority.clone(),
            host: base.host.clone(),
            port: addr.port(),
            literal: Some(addr),
            refresh: base.refresh,
            last: RwLock::new(None),
            refreshing: AtomicBool::new(false),
            ca: base.ca.clone(),
            client: base.client.clone(),
            tls_source: base.tls_source.clone(),
        });
        self.by_authority.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.entry(authority.clone()).or_insert_with(|| a.clone());
            m
        });
        self.by_authority
            .load()
            .get(&authority)
            .cloned()
            .unwrap_or(a)
    }

    /// The shared address of a configured worker; an unconfigured one gets
    /// an address of its own (looked up on first use).
    pub fn get(&self, worker: &config::WorkerUrl) -> Arc<WorkerAddr> {
        self.by_authority
            .load()
            .get(&worker.authority())
            .cloned()
            .unwrap_or_else(|| Arc::new(WorkerAddr::new(worker, None, None, self.refresh)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> config::WorkerUrl {
        config::WorkerUrl::parse(s).unwrap()
    }

    fn addr(u: &str, refresh: Duration) -> Arc<WorkerAddr> {
        Arc::new(WorkerAddr::new(&url(u), None, None, refresh))
    }

    fn last(a: &WorkerAddr) -> Option<Resolved> {
        a.last.read().unwrap().clone()
    }

    #[tokio::test]
    async fn ip_addresses_are_never_looked_up() {
        for (u, want) in [
            ("http://127.0.0.1:9000", "127.0.0.1:9000"),
            ("http://[::1]:9000/x", "[::1]:9000"),
            ("https://10.0.0.7", "10.0.0.7:443"),
        ] {
            let a = addr(u, Duration::from_secs(30));
            assert_eq!(a.get().await.unwrap().to_string(), want, "{u}");
            assert!(last(&a).is_none(), "{u}: nothing cached");
        }
    }

    #[tokio::test]
    async fn a_name_is_looked_up_once_and_kept() {
        let a = addr("http://localhost:9000", Duration::from_secs(30));
        let first = a.get().await.unwrap();
        assert!(first.ip().is_loopback() && first.port() == 9000, "{first}");
        let at = last(&a).unwrap().at;
        assert_eq!(a.get().await.unwrap(), first);
        assert_eq!(last(&a).unwrap().at, at, "fresh: not looked up again");
    }

    #[tokio::test]
    async fn a_stale_address_is_served_while_it_is_looked_up_again() {
        let a = addr("http://localhost:9000", Duration::from_millis(1));
        let first = a.get().await.unwrap();
        let at = last(&a).unwrap().at;
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(a.get().await.unwrap(), first, "the stale address, at once");
        for _ in 0..200 {
            if last(&a).unwrap().at > at {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the background lookup never replaced the stale address");
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_an_error_not_a_panic() {
        let a = addr("http://no-such-host.invalid:9000", Duration::from_secs(30));
        let e = a.get().await.unwrap_err();
        assert!(
            e.contains("\"no-such-host.invalid\" could not be resolved"),
            "{e}"
        );
        assert!(last(&a).is_none());
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_the_last_address() {
        let a = addr("http://no-such-host.invalid:9000", Duration::from_millis(1));
        let kept: SocketAddr = "10.1.2.3:9000".parse().unwrap();
        let at = Instant::now();
        *a.last.write().unwrap() = Some(Resolved {
            addr: kept,
            all: std::sync::Arc::from([kept]),
            at,
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(a.get().await.unwrap(), kept);
        for _ in 0..400 {
            if !a.refreshing.load(Ordering::Acquire) {
                let now = last(&a).unwrap();
                if now.at > at {
                    assert_eq!(now.addr, kept, "kept after the failed lookup");
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the failed lookup never finished");
    }

    /// An http route to a host:port does not hide the `worker_ca` of an
    /// https route to it, whichever comes first.
    #[test]
    fn a_worker_ca_is_kept_for_its_host_and_port() {
        let dir = std::env::temp_dir().join(format!("a2agw-resolve-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("ca.pem"),
            include_str!("../../config/testdata/ca.pem"),
        )
        .unwrap();
        let plain = "[[routes]]\nname = \"p\"\nworker = \"http://w:443/a\"\npath_prefix = \"/p\"\n";
        let tls = "[[routes]]\nname = \"t\"\nworker = \"https://w/b\"\nworker_ca = \"ca.pem\"\n";
        for src in [format!("{plain}{tls}"), format!("{tls}{plain}")] {
            let cfg = config::parse_at(&src, Some(&dir), &|_| None).unwrap();
            let addrs = WorkerAddrs::new(&cfg.routes, Duration::from_secs(30));
            let a = addrs.get(&url("https://w/b"));
            let addr = "127.0.0.1:443".parse().unwrap();
            let ca = a.peer(addr, true).options.ca;
            assert_eq!(ca.map(|c| c.len()), Some(1), "{src}");
            assert!(
                a.peer(addr, false).options.ca.is_none(),
                "no trust on plain TCP"
            );
            assert!(Arc::ptr_eq(&a, &addrs.get(&url("http://w:443"))));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A reload keeps the address of a worker it still names, adds the new
    /// ones (returned, to be looked up), and keeps those no route names any
    /// more, for the cancels still owed to them.
    #[test]
    fn an_update_adds_new_workers_and_keeps_the_others() {
        let old = config::parse(
            "[[routes]]\nname = \"a\"\nworker = \"http://localhost:9000\"\npath_prefix = \"/a\"\n\
             [[routes]]\nname = \"b\"\nworker = \"http://localhost:9001\"\n",
        )
        .unwrap();
        let new = config::parse(
            "[[routes]]\nname = \"a\"\nworker = \"http://localhost:9000/x\"\npath_prefix = \"/a\"\n\
             [[routes]]\nname = \"c\"\nworker = \"http://localhost:9002\"\n",
        )
        .unwrap();
        let addrs = WorkerAddrs::new(&old.routes, Duration::from_secs(30));
        let (a, b) = (
            addrs.get(&old.routes[0].worker),
            addrs.get(&old.routes[1].worker),
        );
        let added = addrs.update(&new.routes);
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].authority(), "localhost:9002");
        assert!(Arc::ptr_eq(&addrs.get(&new.routes[0].worker), &a), "kept");
        assert!(Arc::ptr_eq(&addrs.get(&new.routes[1].worker), &added[0]));
        assert!(
            Arc::ptr_eq(&addrs.get(&old.routes[1].worker), &b),
            "kept for owed cancels"
        );
        assert!(
            addrs.update(&new.routes).is_empty(),
            "nothing new the second time"
        );
    }

    #[test]
    fn workers_with_the_same_authority_share_one_address() {
        let src = "[[routes]]\nname = \"a\"\nworker = \"http://localhost:9000/a\"\npath_prefix = \"/a\"\n\
                   [[routes]]\nname = \"b\"\nworker = \"http://localhost:9000/b\"\npath_prefix = \"/b\"\n\
                   [[routes]]\nname = \"c\"\nworker = \"http://localhost:9001\"\n";
        let cfg = config::parse(src).unwrap();
        let addrs = WorkerAddrs::new(&cfg.routes, Duration::from_secs(30));
        let (w1, w2, w3) = (
            &cfg.routes[0].worker,
            &cfg.routes[1].worker,
            &cfg.routes[2].worker,
        );
        assert!(Arc::ptr_eq(&addrs.get(w1), &addrs.get(w2)));
        assert!(!Arc::ptr_eq(&addrs.get(w1), &addrs.get(w3)));
        assert_eq!(addrs.by_authority.load().len(), 2);
    }
}
