// a2a-gateway patch: this whole file (see patches/README.md, "The upstream pool").

//! Idle HTTP/1 upstream connections kept for reuse, without a task per
//! connection.
//!
//! pingora-core's pool (`TransportConnector::release_stream`) wraps every
//! released connection in an `Arc<Mutex<_>>`, spawns a task that watches it
//! while it is idle, and on reuse wakes that task and waits for it to hand
//! the connection back, then asks the kernel for the socket's peer address
//! (`getpeername`). For a proxy that forwards every request over a pooled
//! connection, that is a task spawn, two task wake-ups, a system call and
//! several allocations per request, about a tenth of bare pingora's
//! instructions per proxied request (`benches/callgrind.sh`).
//!
//! This pool keeps the idle connection itself in a list per peer, newest
//! last. Taking one checks, without waiting, that nothing was received on
//! it since it was released (a closed or misbehaving connection is dropped
//! and the next one tried), the same test pingora-core makes. A sweeper task
//! (one per pool, started with the first idle connection) closes
//! connections that the upstream closed or whose idle timeout passed, once a
//! second, so sockets closed by the upstream do not linger.

use futures::FutureExt;
use log::{debug, warn};
use pingora_core::protocols::Stream;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// How often the sweeper looks at idle connections.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

struct Idle {
    stream: Stream,
    since: Instant,
    deadline: Option<Instant>,
}

#[derive(Default)]
struct Lists {
    /// Idle connections per `Peer::reuse_hash`, oldest first.
    peers: HashMap<u64, Vec<Idle>>,
    total: usize,
}

/// The pool. `size` bounds the idle connections across all peers (pingora's
/// `upstream_keepalive_pool_size`); the oldest one is closed to make room.
pub struct H1Pool {
    lists: Mutex<Lists>,
    size: usize,
    sweeper: AtomicBool,
    /// pingora-core's counter of pooled connections found with unexpected
    /// data, shared so that its accessors keep counting.
    unexpected_data: Arc<AtomicU64>,
}

impl H1Pool {
    pub fn new(size: usize, unexpected_data: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(H1Pool {
            lists: Mutex::new(Lists::default()),
            size,
            sweeper: AtomicBool::new(false),
            unexpected_data,
        })
    }

    /// An idle connection to the peer with this `reuse_hash`, if one is
    /// still usable.
    pub fn take(&self, key: u64) -> Option<Stream> {
        loop {
            // An emptied list stays (the sweep drops it), so that `put`
            // does not allocate a new one for each request.
            let mut idle = {
                let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
                let idle = lists.peers.get_mut(&key)?.pop()?;
                lists.total -= 1;
                idle
            };
            // Dropped (closed) outside the lock.
            if idle.deadline.is_some_and(|d| d <= Instant::now()) {
                continue;
            }
            if still_idle(&mut idle.stream, &self.unexpected_data) {
                return Some(idle.stream);
            }
        }
    }

    /// Keeps a connection whose exchange ended cleanly for the next request
    /// to the same peer, for at most `idle_timeout` (`None`: until the
    /// upstream closes it or the pool needs the room; zero: not kept).
    pub fn put(self: &Arc<Self>, key: u64, stream: Stream, idle_timeout: Option<Duration>) {
        if self.size == 0 || idle_timeout.is_some_and(|t| t.is_zero()) {
            return;
        }
        let since = Instant::now();
        let deadline = idle_timeout.and_then(|t| since.checked_add(t));
        let evicted = {
            let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
            let evicted = if lists.total >= self.size {
                lists.evict_oldest()
            } else {
                None
            };
            lists.peers.entry(key).or_default().push(Idle {
                stream,
                since,
                deadline,
            });
            lists.total += 1;
            evicted
        };
        drop(evicted);
        if !self.sweeper.load(Ordering::Relaxed) && !self.sweeper.swap(true, Ordering::AcqRel) {
            self.start_sweeper();
        }
    }

    fn start_sweeper(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to sweep on (not the case inside a proxy); the next
            // `put` tries again, and idle connections are still checked when
            // taken.
            self.sweeper.store(false, Ordering::Release);
            return;
        };
        let running = Running(Arc::downgrade(self));
        rt.spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(pool) = running.0.upgrade() else {
                    return;
                };
                pool.sweep(Instant::now());
            }
        });
    }

    /// Closes the idle connections the upstream closed (or sent data on)
    /// and those past their idle timeout (as of `now`).
    pub fn sweep(&self, now: Instant) {
        let mut closed = Vec::new();
        {
            let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
            let Lists { peers, total } = &mut *lists;
            peers.retain(|_, list| {
                closed.extend(list.extract_if(.., |idle| {
                    idle.deadline.is_some_and(|d| d <= now)
                        || !still_idle(&mut idle.stream, &self.unexpected_data)
                }));
                !list.is_empty()
            });
            *total -= closed.len();
        }
        if !closed.is_empty() {
            debug!("closed {} idle upstream connections", closed.len());
        }
    }

    /// How many idle connections the pool holds.
    pub fn idle_count(&self) -> usize {
        self.lists.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

/// Held by the sweeper task: when the task ends (its runtime shut down,
/// say), the next `put` starts another.
struct Running(Weak<H1Pool>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(pool) = self.0.upgrade() {
            pool.sweeper.store(false, Ordering::Release);
        }
    }
}

impl Lists {
    /// Takes out the longest-idle connection of all peers.
    fn evict_oldest(&mut self) -> Option<Idle> {
        // Each list is oldest first: the candidates are the first entries.
        let key = *self
            .peers
            .iter()
            .filter_map(|(k, list)| Some((k, list.first()?.since)))
            .min_by_key(|(_, since)| *since)?
            .0;
        let list = self.peers.get_mut(&key)?;
        let idle = list.remove(0);
        if list.is_empty() {
            self.peers.remove(&key);
        }
        self.total -= 1;
        Some(idle)
    }
}

/// Whether nothing arrived on an idle connection (no data, no FIN, no
/// error): a read that would wait. Same test as pingora-core's
/// `test_reusable_stream`.
fn still_idle(stream: &mut Stream, unexpected_data: &AtomicU64) -> bool {
    let mut buf = [0; 1];
    // `unconstrained`: `now_or_never` could otherwise see tokio's
    // cooperative budget instead of the read.
    match tokio::task::unconstrained(stream.read(&mut buf[..])).now_or_never() {
        None => true,
        Some(Ok(0)) => {
            debug!("idle upstream connection closed by the upstream");
            false
        }
        Some(Ok(_)) => {
            warn!("unexpected data read on an idle upstream connection");
            unexpected_data.fetch_add(1, Ordering::Relaxed);
            false
        }
        Some(Err(e)) => {
            debug!("idle upstream connection broken: {e:?}");
            false
        }
    }
}
