//! Graceful shutdown.
//!
//! On SIGTERM pingora closes the listeners and idle connections at once and
//! lets each request in flight finish (its connection then closes); it keeps
//! the process up for a fixed grace period (`timeouts.drain`), then drops
//! whatever is left. The gateway has more to finish than pingora knows of:
//! the cascade decisions and `CancelTask` calls a request's end started in
//! spawned tasks, and the tracker's queued store writes. This module counts
//! both ([`InFlight`], [`Work`]) and the [`Drainer`] ends the process as
//! soon as neither has anything left, instead of sleeping out the period.
//! SIGINT still stops at once, and so does SIGINT or a second SIGTERM
//! during the drain.
//!
//! Streams still open when the period runs out are cut without a cascade:
//! their callers did not leave and may resubscribe through another replica;
//! a lease (granted or imposed) stops a child nobody comes back for, as it
//! does when a replica dies.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::store::TaskStore;
use crate::tracker::Tracker;

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static WORK: AtomicUsize = AtomicUsize::new(0);

/// One unit of a counter while it lives.
#[derive(Debug)]
struct Counted(&'static AtomicUsize);

impl Counted {
    fn new(counter: &'static AtomicUsize) -> Counted {
        counter.fetch_add(1, Ordering::SeqCst);
        Counted(counter)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Held by a request for its whole life (in its context, dropped when
/// pingora drops the context, whatever way the request ended).
#[derive(Debug)]
pub struct InFlight {
    _count: Counted,
}

/// A new request's context counts itself (`Ctx` is built by `Default`).
impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            _count: Counted::new(&IN_FLIGHT),
        }
    }
}

/// Held by follow-up work a request left owed (a cascade decision, a
/// cancel) while it runs.
#[derive(Debug)]
pub struct Work {
    _count: Counted,
}

impl Work {
    pub fn start() -> Work {
        Work {
            _count: Counted::new(&WORK),
        }
    }
}

/// Spawns owed work that a drain waits for (see [`Work`]).
pub fn spawn_work<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let work = Work::start();
    tokio::spawn(async move {
        fut.await;
        drop(work);
    });
}

/// Wakes graces that would outlast the drain ([`graces_cut`]).
static GRACES_CUT: tokio::sync::Notify = tokio::sync::Notify::const_new();
static GRACES_CUT_FLAG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Completes when a drain is about to run out: a cascade waiting out a
/// `disconnect_grace` decides then (a resubscribe through another replica
/// has counted as a watcher by then), instead of being cut unsent.
pub async fn graces_cut() {
    let notified = GRACES_CUT.notified();
    if GRACES_CUT_FLAG.load(Ordering::SeqCst) {
        return;
    }
    notified.await;
}

fn cut_graces() {
    GRACES_CUT_FLAG.store(true, Ordering::SeqCst);
    GRACES_CUT.notify_waiters();
}

/// Requests in flight and owed work running.
pub fn pending() -> (usize, usize) {
    (
        IN_FLIGHT.load(Ordering::SeqCst),
        WORK.load(Ordering::SeqCst),
    )
}

/// The next signal of a listener, never for a listener that could not be
/// made.
async fn recv(sig: &mut Option<Signal>) -> Option<()> {
    match sig {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// How often a drain looks whether anything is left.
const POLL: Duration = Duration::from_millis(20);
/// How long before the end of `timeouts.drain` the drainer gives up.
const MARGIN: Duration = Duration::from_millis(250);
/// How long before it gives up the drainer ends cascades' graces, so that
/// their decisions and cancels are done by then.
const GRACE_CUT_BEFORE: Duration = Duration::from_secs(1);

/// Ends the process once a graceful shutdown has nothing left to finish.
#[derive(Debug)]
pub struct Drainer {
    pub tracker: Tracker,
    /// Told when the drain runs out with streams open
    /// ([`TaskStore::replica_gone`]).
    pub store: Arc<dyn TaskStore>,
    /// `timeouts.drain`: pingora's grace period; the drainer gives up then.
    pub timeout: Duration,
}

impl Drainer {
    /// A signal during the drain: exit without waiting for what is left
    /// (the streams cut stop counting as watchers first).
    async fn stop_now(&self, what: &str, code: i32) {
        let (requests, work) = pending();
        tracing::warn!(requests, work, "{what} during the drain; exiting now");
        let _ = tokio::time::timeout(Duration::from_millis(200), self.store.replica_gone()).await;
        export_last_spans().await;
        crate::log_writer::flush();
        std::process::exit(code);
    }
}

/// The spans still queued go to the OTLP receiver before the process
/// exits (at most `trace::SHUTDOWN_WAIT`; nothing when traces are off).
async fn export_last_spans() {
    let _ = tokio::task::spawn_blocking(crate::trace::shutdown).await;
}

#[async_trait]
impl BackgroundService for Drainer {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        // Listening only now: the SIGTERM that started the drain is behind
        // us; another signal means "stop now" (pingora no longer listens).
        let (mut int, mut term) = (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        );
        let started = tokio::time::Instant::now();
        // A little before pingora's grace period ends and it drops what is
        // left, so that the store hears of this replica's end first.
        let deadline = started + self.timeout.saturating_sub(MARGIN);
        let cut_at = deadline - GRACE_CUT_BEFORE.min(self.timeout.saturating_sub(MARGIN) / 2);
        let (requests, work) = pending();
        tracing::info!(
            requests,
            work,
            drain = ?self.timeout,
            "shutting down: no new connections; waiting for requests in flight and owed cancels"
        );
        loop {
            if pending() == (0, 0) {
                // Queued store writes (a stream's last state, its watcher
                // count) go out before the process does.
                let flushed = tokio::time::timeout_at(deadline, self.tracker.flush()).await;
                if flushed.is_ok() && pending() == (0, 0) {
                    tracing::info!(took = ?started.elapsed(), "drained; exiting");
                    export_last_spans().await;
                    crate::log_writer::flush();
                    std::process::exit(0);
                }
            }
            let now = tokio::time::Instant::now();
            if now >= cut_at && !GRACES_CUT_FLAG.load(Ordering::SeqCst) {
                cut_graces();
            }
            if now >= deadline {
                let (requests, work) = pending();
                tracing::warn!(
                    requests,
                    work,
                    "timeouts.drain ran out; cutting what is left (streams' children are left to their leases)"
                );
                // The streams cut now stop counting as watchers at once.
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), self.store.replica_gone()).await;
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                Some(()) = recv(&mut int) => self.stop_now("SIGINT", 130).await,
                Some(()) = recv(&mut term) => self.stop_now("a second SIGTERM", 143).await,
            }
        }
    }
}
