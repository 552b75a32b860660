//! A route's worker replicas (`workers = [...]`): which one takes a new
//! send, and which ones are up.
//!
//! Selection and active health are pingora's own load-balancing crate
//! (`pingora::lb`): round robin over the replicas whose last TCP health
//! check passed. Round robin, not hashing: a send starts a new task, so no
//! key of it should pin it anywhere; what pins a task to its replica is the
//! store's record of where it started ([`crate::store::TaskRecord::replica`]),
//! not a hash a membership change would move. A replica whose connection
//! fails is also left out at once (passive), until its next passing check.
//! Discovery is the gateway's own asynchronous lookup of each replica's
//! `host:port` ([`WorkerAddr`]), so that no request waits on DNS.
//!
//! A replica is named by its configured authority (`host:port`), which the
//! store records with each task and which stays the same when its address
//! changes.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, Backends, LoadBalancer};

use crate::resolve::{WorkerAddr, WorkerAddrs};

/// One replica: its URL, its shared address, and until when (Unix ms) a
/// failed connection keeps it out of new sends.
#[derive(Debug)]
pub struct Replica {
    url: config::WorkerUrl,
    authority: String,
    /// The configured worker it is (an address of).
    origin: String,
    addr: Arc<WorkerAddr>,
    down_until_ms: AtomicU64,
}

impl Replica {
    /// Its URL: where the gateway's own calls for its tasks go.
    pub fn url(&self) -> &config::WorkerUrl {
        &self.url
    }

    /// Its name: the configured `host:port` (`ip:port` for an address of a
    /// name with `worker_addresses = "all"`), as the store records it.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    pub fn addr(&self) -> &Arc<WorkerAddr> {
        &self.addr
    }

    fn down(&self, now_ms: u64) -> bool {
        self.down_until_ms.load(Ordering::Relaxed) > now_ms
    }
}

/// Where the replicas come from: the configured `workers` (each name's
/// first address), or every address of each (`worker_addresses = "all"`).
struct Source {
    workers: Vec<(config::WorkerUrl, Arc<WorkerAddr>)>,
    every_address: bool,
    addrs: Arc<WorkerAddrs>,
}

/// The replicas of one route with several.
pub struct Replicas {
    route: Arc<str>,
    source: Source,
    members: Arc<ArcSwap<Vec<Arc<Replica>>>>,
    lb: LoadBalancer<RoundRobin>,
    interval: Duration,
    /// When the replicas were last looked up and checked (Unix ms).
    checked_ms: AtomicU64,
    /// Set once a look-up and check has completed (the members are known):
    /// what a request that finds none waits for.
    first_check: tokio::sync::OnceCell<()>,
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("route", &self.route)
            .field("members", &self.members.load())
            .finish()
    }
}

/// Discovery: each replica's address, as the last lookup of its member set
/// left it (a replica whose name has no address yet is left out until it
/// has one). The backend's `ext` carries its replica.
struct Discovery(Arc<ArcSwap<Vec<Arc<Replica>>>>);

#[async_trait]
impl ServiceDiscovery for Discovery {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let mut found = BTreeSet::new();
        for m in self.0.load().iter() {
            match m.addr.get().await {
                Ok(addr) => {
                    let mut b = Backend {
                        addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
                        weight: 1,
                        ext: http::Extensions::new(),
                    };
                    b.ext.insert(m.clone());
                    found.insert(b);
                }
                Err(e) => {
                    tracing::warn!(worker = %m.authority, error = %e, "a worker replica has no address");
                }
            }
        }
        Ok((found, HashMap::new()))
    }
}

impl Replicas {
    /// The replicas of `route` (two or more `workers`, or
    /// `worker_addresses = "all"`), reached through `addrs`. None is known
    /// until the first check ([`Replicas::check_if_due`]), which the
    /// replicas' background service runs at once.
    pub fn new(route: &config::Route, addrs: &Arc<WorkerAddrs>) -> Replicas {
        let source = Source {
            workers: route
                .workers
                .iter()
                .map(|url| (url.clone(), addrs.get(url)))
                .collect(),
            every_address: route.worker_addresses == config::WorkerAddresses::All,
            addrs: addrs.clone(),
        };
        // Named replicas are known at once; a name's addresses once looked
        // up (the first check, or the first call that needs them).
        let members: Vec<Arc<Replica>> = if source.every_address {
            Vec::new()
        } else {
            source
                .workers
                .iter()
                .map(|(url, addr)| {
                    Arc::new(Replica {
                        url: url.clone(),
                        authority: url.authority(),
                        origin: url.authority(),
                        addr: addr.clone(),
                        down_until_ms: AtomicU64::new(0),
                    })
                })
                .collect()
        };
        let members = Arc::new(ArcSwap::from_pointee(members));
        let backends = Backends::new(Box::new(Discovery(members.clone())));
        let mut check = TcpHealthCheck::new();
        check.peer_template.options.connection_timeout = Some(Duration::from_secs(1));
        let mut lb = LoadBalancer::from_backends(backends);
        lb.set_health_check(check);
        Replicas {
            route: route.name.as_str().into(),
            source,
            members,
            lb,
            interval: route.health_interval,
            checked_ms: AtomicU64::new(0),
            first_check: tokio::sync::OnceCell::new(),
        }
    }

    /// The replicas as the configuration and the lookups give them now; a
    /// replica kept from the last set keeps its state.
    async fn members_now(&self) -> Vec<Arc<Replica>> {
        let old = self.members.load();
        let keep = |authority: &str, make: &dyn Fn() -> Replica| {
            old.iter()
                .find(|m| m.authority == authority)
                .cloned()
                .unwrap_or_else(|| Arc::new(make()))
        };
        let mut out: Vec<Arc<Replica>> = Vec::new();
        for (url, addr) in &self.source.workers {
            if !self.source.every_address {
                let authority = url.authority();
                out.push(keep(&authority, &|| Replica {
                    url: url.clone(),
                    authority: authority.clone(),
                    origin: authority.clone(),
                    addr: addr.clone(),
                    down_until_ms: AtomicU64::new(0),
                }));
                continue;
            }
            let all = match addr.lookup_all().await {
                Ok(all) => all,
                Err(e) => {
                    tracing::warn!(route = %self.route, worker = %url.authority(), error = %e, "a worker's addresses not looked up; its replicas are kept as they were");
                    out.extend(old.iter().filter(|m| m.origin == url.authority()).cloned());
                    continue;
                }
            };
            for ip in all.iter() {
                let at = config::WorkerUrl {
                    tls: url.tls,
                    host: match ip {
                        std::net::SocketAddr::V4(a) => a.ip().to_string(),
                        std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
                    },
                    port: ip.port(),
                    base_path: url.base_path.clone(),
                };
                let authority = at.authority();
                if out.iter().any(|m| m.authority == authority) {
                    continue;
                }
                out.push(keep(&authority, &|| Replica {
                    addr: self.source.addrs.pinned(addr, *ip, &at),
                    url: at.clone(),
                    authority: authority.clone(),
                    origin: url.authority(),
                    down_until_ms: AtomicU64::new(0),
                }));
            }
        }
        out
    }

    /// Looks the replicas up and checks each (one TCP connect) when
    /// `health_interval` passed since the last time; sets
    /// `a2agw_replica_up`. Run by the replicas' background service.
    pub async fn check_if_due(&self, now_ms: u64) {
        let last = self.checked_ms.load(Ordering::Relaxed);
        if last != 0 && now_ms < last + self.interval.as_millis() as u64 {
            return;
        }
        self.checked_ms.store(now_ms, Ordering::Relaxed);
        self.check(now_ms).await;
        let _ = self.first_check.set(());
    }

    /// Looks the replicas up and checks each, now.
    async fn check(&self, now_ms: u64) {
        let now = self.members_now().await;
        for gone in self
            .members
            .load()
            .iter()
            .filter(|m| !now.iter().any(|n| n.authority == m.authority))
        {
            tracing::info!(route = %self.route, replica = %gone.authority, "a worker replica is gone: its tasks are lost to the gateway");
            let _ = crate::metrics::REPLICA_UP.remove_label_values(&[&self.route, &gone.authority]);
        }
        self.members.store(Arc::new(now));
        if let Err(e) = self.lb.update().await {
            tracing::warn!(route = %self.route, error = %e, "worker replicas not looked up");
        }
        self.lb.backends().run_health_check(true).await;
        for (m, up) in self.states() {
            if up {
                m.down_until_ms.store(0, Ordering::Relaxed);
            }
            crate::metrics::REPLICA_UP
                .with_label_values(&[&self.route, &m.authority])
                .set(i64::from(up && !m.down(now_ms)));
        }
    }

    /// Each replica and whether it passed its last check (and has an
    /// address).
    fn states(&self) -> Vec<(Arc<Replica>, bool)> {
        let backends = self.lb.backends().get_backend();
        self.members
            .load()
            .iter()
            .map(|m| {
                let up = backends.iter().any(|b| {
                    b.ext
                        .get::<Arc<Replica>>()
                        .is_some_and(|r| Arc::ptr_eq(r, m))
                        && self.lb.backends().ready(b)
                });
                (m.clone(), up)
            })
            .collect()
    }

    /// The replica a new send goes to: the next up one in round robin;
    /// `None` when none is up (or none is known yet).
    pub fn pick(&self) -> Option<Arc<Replica>> {
        let now = crate::store::now_ms();
        let n = self.members.load().len();
        let picked = self.lb.select_with(b"", n * 2, |b, healthy| {
            healthy && b.ext.get::<Arc<Replica>>().is_some_and(|r| !r.down(now))
        })?;
        picked.ext.get::<Arc<Replica>>().cloned()
    }

    /// The replica a new send goes to when none is up: the first (its
    /// failure is the caller's answer).
    pub fn first(&self) -> Option<Arc<Replica>> {
        self.members.load().first().cloned()
    }

    /// [`Replicas::find`], once the replicas were looked up at least once
    /// (a route a reload just built may not have been yet: looked up now).
    pub async fn find_known(&self, authority: &str) -> Option<Arc<Replica>> {
        self.checked_once().await;
        self.find(authority)
    }

    /// Returns once the replicas have been looked up and checked at least
    /// once: at once after that; before it (the first requests after a
    /// start or a reload), after a look-up of its own, made once however
    /// many wait for it, even while the background service's first one
    /// runs (whose half-done look-up knows no replica yet).
    pub async fn checked_once(&self) {
        self.first_check
            .get_or_init(|| async {
                self.check(crate::store::now_ms()).await;
            })
            .await;
    }

    /// The replica named `authority` (as recorded with a task), if the
    /// route has it now.
    pub fn find(&self, authority: &str) -> Option<Arc<Replica>> {
        self.members
            .load()
            .iter()
            .find(|m| m.authority == authority)
            .cloned()
    }

    /// A connection to `replica` failed (or it answered 502-504): no new
    /// sends go there until it passes a check again.
    pub fn failed(&self, replica: &Replica) {
        let until = crate::store::now_ms() + self.interval.as_millis() as u64;
        replica.down_until_ms.store(until, Ordering::Relaxed);
        crate::metrics::REPLICA_UP
            .with_label_values(&[&self.route, &replica.authority])
            .set(0);
    }

    /// Each replica's authority and whether it is up now, for the admin.
    pub fn view(&self) -> Vec<(String, bool)> {
        let now = crate::store::now_ms();
        self.states()
            .into_iter()
            .map(|(m, up)| (m.authority.clone(), up && !m.down(now)))
            .collect()
    }
}

/// Counts a task lost to the gateway, once per task in this process: its
/// worker replica is not one of its route's any more (or none was
/// recorded), or it did not answer its cancel past the retries. Its
/// cancels are never sent to another replica as if the task ran there.
pub fn lost(key: &crate::store::TaskKey, replica: Option<&str>) {
    static SEEN: std::sync::LazyLock<moka::sync::Cache<crate::store::TaskKey, ()>> =
        std::sync::LazyLock::new(|| {
            moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(24 * 3600))
                .build()
        });
    if SEEN.contains_key(key) {
        return;
    }
    SEEN.insert(key.clone(), ());
    crate::metrics::TASKS_LOST
        .with_label_values(&[&key.route])
        .inc();
    tracing::warn!(task = %key, replica = ?replica, "the task's worker replica is gone (from its route, or unreachable past the cancel's retries): nothing for it is sent to another replica");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(ports: &[u16]) -> config::Route {
        let workers: Vec<String> = ports
            .iter()
            .map(|p| format!("\"http://127.0.0.1:{p}\""))
            .collect();
        let src = format!(
            "[[routes]]\nname = \"r\"\nworkers = [{}]\nhealth_interval = \"100ms\"\n",
            workers.join(", ")
        );
        config::parse(&src).unwrap().routes.remove(0)
    }

    /// Round robin over the replicas that pass their TCP check; a failed
    /// connection takes one out until a check passes again; one that stops
    /// listening is out after its next check.
    #[tokio::test]
    async fn balanced_over_the_replicas_that_are_up() {
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ports = [
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port(),
        ];
        let names = ports.map(|p| format!("127.0.0.1:{p}"));
        // Accepts (and drops) the checks' connections.
        let serve = |l: tokio::net::TcpListener| {
            tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    drop(s);
                }
            })
        };
        let (ta, tb) = (serve(a), serve(b));
        let cfg = route(&ports);
        let addrs = Arc::new(WorkerAddrs::new(
            std::slice::from_ref(&cfg),
            Duration::from_secs(30),
        ));
        let r = Replicas::new(&cfg, &addrs);
        assert!(r.pick().is_none(), "nothing known before the first check");
        r.check_if_due(crate::store::now_ms()).await;
        let picks: Vec<String> = (0..4)
            .filter_map(|_| r.pick().map(|m| m.authority().to_owned()))
            .collect();
        assert_eq!(picks.len(), 4);
        assert!(names.iter().all(|n| picks.contains(n)), "{picks:?}");
        assert!(r.find(&names[1]).is_some());
        assert!(r.find("127.0.0.1:1").is_none());

        r.failed(&r.find(&names[0]).unwrap());
        assert!(
            (0..4).all(|_| r.pick().unwrap().authority() == names[1]),
            "a failed replica takes no sends"
        );
        assert_eq!(r.view()[0], (names[0].clone(), false));

        // Replica 1 stops listening; replica 0 passes its next check.
        tb.abort();
        let _ = tb.await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        r.check_if_due(crate::store::now_ms()).await;
        assert!(
            (0..4).all(|_| r.pick().unwrap().authority() == names[0]),
            "{:?}",
            r.view()
        );
        ta.abort();
    }

    /// `worker_addresses = "all"`: each address of the name is a replica,
    /// named `ip:port`, reached at that address.
    #[tokio::test]
    async fn every_address_of_a_name_is_a_replica() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let src = format!(
            "[[routes]]\nname = \"r\"\nworker = \"http://localhost:{port}\"\nworker_addresses = \"all\"\nhealth_interval = \"100ms\"\n"
        );
        let cfg = config::parse(&src).unwrap().routes.remove(0);
        let addrs = Arc::new(WorkerAddrs::new(
            std::slice::from_ref(&cfg),
            Duration::from_secs(30),
        ));
        let r = Replicas::new(&cfg, &addrs);
        r.check_if_due(crate::store::now_ms()).await;
        let listed: Vec<String> = r.view().into_iter().map(|(n, _)| n).collect();
        let resolved: Vec<String> = tokio::net::lookup_host(("localhost", port))
            .await
            .unwrap()
            .map(|a| match a {
                std::net::SocketAddr::V4(a) => a.to_string(),
                std::net::SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
            })
            .fold(Vec::new(), |mut v, a| {
                if !v.contains(&a) {
                    v.push(a);
                }
                v
            });
        assert_eq!(listed, resolved, "one replica per address");
        let v4 = format!("127.0.0.1:{port}");
        let m = r.find(&v4).expect("the IPv4 address is a replica");
        assert_eq!(m.url().authority(), v4);
        assert_eq!(
            m.addr().get().await.unwrap(),
            v4.parse::<std::net::SocketAddr>().unwrap()
        );
        // Only it listens: after the check it takes every send.
        assert!(
            (0..4).all(|_| r.pick().unwrap().authority() == v4),
            "{:?}",
            r.view()
        );
        drop(l);
    }
}
