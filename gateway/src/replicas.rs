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

use async_trait::async_trait;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, Backends, LoadBalancer};

use crate::resolve::{WorkerAddr, WorkerAddrs};

/// One replica: its URL, its shared address, and until when (Unix ms) a
/// failed connection keeps it out of new sends.
#[derive(Debug)]
struct Member {
    url: config::WorkerUrl,
    authority: String,
    addr: Arc<WorkerAddr>,
    down_until_ms: AtomicU64,
}

/// The replicas of one route with several.
pub struct Replicas {
    route: Arc<str>,
    members: Arc<Vec<Member>>,
    lb: LoadBalancer<RoundRobin>,
    interval: Duration,
    /// When the replicas were last looked up and checked (Unix ms).
    checked_ms: AtomicU64,
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("route", &self.route)
            .field("members", &self.members)
            .finish()
    }
}

/// The replica a backend stands for, as its `ext` carries it.
#[derive(Clone, Copy, Debug)]
struct Index(usize);

/// Discovery: each replica's last looked-up address (a replica whose name
/// has no address yet is left out until it has one).
struct Discovery(Arc<Vec<Member>>);

#[async_trait]
impl ServiceDiscovery for Discovery {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let mut found = BTreeSet::new();
        for (i, m) in self.0.iter().enumerate() {
            match m.addr.get().await {
                Ok(addr) => {
                    let mut b = Backend {
                        addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
                        weight: 1,
                        ext: http::Extensions::new(),
                    };
                    b.ext.insert(Index(i));
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
    /// The replicas of `route` (two or more `workers`), reached through
    /// `addrs`. Not checked yet: every replica counts as up until its first
    /// check ([`Replicas::check`]).
    pub fn new(route: &config::Route, addrs: &WorkerAddrs) -> Replicas {
        let members: Arc<Vec<Member>> = Arc::new(
            route
                .workers
                .iter()
                .map(|url| Member {
                    url: url.clone(),
                    authority: url.authority(),
                    addr: addrs.get(url),
                    down_until_ms: AtomicU64::new(0),
                })
                .collect(),
        );
        let backends = Backends::new(Box::new(Discovery(members.clone())));
        let mut check = TcpHealthCheck::new();
        check.peer_template.options.connection_timeout = Some(Duration::from_secs(1));
        let mut lb = LoadBalancer::from_backends(backends);
        lb.set_health_check(check);
        Replicas {
            route: route.name.as_str().into(),
            members,
            lb,
            interval: route.health_interval,
            checked_ms: AtomicU64::new(0),
        }
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
        if let Err(e) = self.lb.update().await {
            tracing::warn!(route = %self.route, error = %e, "worker replicas not looked up");
        }
        self.lb.backends().run_health_check(true).await;
        let ready: Vec<bool> = self.states();
        for (m, up) in self.members.iter().zip(ready) {
            if up {
                m.down_until_ms.store(0, Ordering::Relaxed);
            }
            crate::metrics::REPLICA_UP
                .with_label_values(&[&self.route, &m.authority])
                .set(i64::from(up && !self.passively_down(m, now_ms)));
        }
    }

    /// Whether each replica passed its last check (and has an address).
    fn states(&self) -> Vec<bool> {
        let mut up = vec![false; self.members.len()];
        for b in self.lb.backends().get_backend().iter() {
            if let Some(Index(i)) = b.ext.get::<Index>() {
                up[*i] = self.lb.backends().ready(b);
            }
        }
        up
    }

    fn passively_down(&self, m: &Member, now_ms: u64) -> bool {
        m.down_until_ms.load(Ordering::Relaxed) > now_ms
    }

    /// The replica a new send goes to: the next up one in round robin;
    /// `None` when none is up (the send then goes to the first, whose
    /// failure the caller gets).
    pub fn pick(&self) -> Option<usize> {
        let now = crate::store::now_ms();
        let picked = self
            .lb
            .select_with(b"", self.members.len() * 2, |b, healthy| {
                healthy
                    && b.ext
                        .get::<Index>()
                        .is_some_and(|Index(i)| !self.passively_down(&self.members[*i], now))
            })?;
        picked.ext.get::<Index>().map(|Index(i)| *i)
    }

    /// The replica named `authority` (as recorded with a task), if the
    /// route still has it.
    pub fn find(&self, authority: &str) -> Option<usize> {
        self.members.iter().position(|m| m.authority == authority)
    }

    /// A connection to replica `i` failed: no new sends go there until it
    /// passes a check again.
    pub fn failed(&self, i: usize) {
        if let Some(m) = self.members.get(i) {
            let until = crate::store::now_ms() + self.interval.as_millis() as u64;
            m.down_until_ms.store(until, Ordering::Relaxed);
            crate::metrics::REPLICA_UP
                .with_label_values(&[&self.route, &m.authority])
                .set(0);
        }
    }

    pub fn url(&self, i: usize) -> &config::WorkerUrl {
        &self.members[i].url
    }

    pub fn authority(&self, i: usize) -> &str {
        &self.members[i].authority
    }

    pub fn addr(&self, i: usize) -> &Arc<WorkerAddr> {
        &self.members[i].addr
    }

    /// Each replica's authority and whether it is up now, for the admin.
    pub fn view(&self) -> Vec<(String, bool)> {
        let now = crate::store::now_ms();
        let checked = self.checked_ms.load(Ordering::Relaxed) != 0;
        self.members
            .iter()
            .zip(self.states())
            .map(|(m, up)| {
                (
                    m.authority.clone(),
                    (up || !checked) && !self.passively_down(m, now),
                )
            })
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
        let addrs = WorkerAddrs::new(std::slice::from_ref(&cfg), Duration::from_secs(30));
        let r = Replicas::new(&cfg, &addrs);
        assert_eq!(r.pick(), None, "nothing discovered before the first check");
        r.check_if_due(crate::store::now_ms()).await;
        let picks: Vec<usize> = (0..4).filter_map(|_| r.pick()).collect();
        assert_eq!(picks.len(), 4);
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
        assert_eq!(r.find(&format!("127.0.0.1:{}", ports[1])), Some(1));
        assert_eq!(r.find("127.0.0.1:1"), None);

        r.failed(0);
        assert!(
            (0..4).all(|_| r.pick() == Some(1)),
            "a failed replica takes no sends"
        );
        assert_eq!(r.view()[0], (format!("127.0.0.1:{}", ports[0]), false));

        // Replica 1 stops listening; replica 0 passes its next check.
        tb.abort();
        let _ = tb.await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        r.check_if_due(crate::store::now_ms()).await;
        assert!((0..4).all(|_| r.pick() == Some(0)), "{:?}", r.view());
        ta.abort();
    }
}
