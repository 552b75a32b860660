//! A TCP pass-through between the gateway and a worker that counts and can
//! cut the connections through it, or stop passing new ones.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Listens on a free loopback port and passes each connection on to `to`.
pub struct Relay {
    pub port: u16,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    open: AtomicBool,
    accepted: AtomicUsize,
    live: AtomicUsize,
    /// Bumped by [`Relay::cut_all`]; each connection ends when it changes.
    cut: watch::Sender<u64>,
}

impl Relay {
    pub async fn start(to: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            open: AtomicBool::new(true),
            accepted: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            cut: watch::channel(0).0,
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                s.accepted.fetch_add(1, Ordering::SeqCst);
                let (s, to) = (s.clone(), to.clone());
                tokio::spawn(async move {
                    if !s.open.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        return;
                    }
                    let Ok(mut out) = tokio::net::TcpStream::connect(&to).await else {
                        return;
                    };
                    s.live.fetch_add(1, Ordering::SeqCst);
                    let mut cut = s.cut.subscribe();
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                        _ = cut.changed() => {}
                    }
                    s.live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Relay { port, shared, task }
    }

    /// While closed, new connections are accepted and left hanging (a
    /// worker that stopped answering); open ones pass on.
    pub fn set_open(&self, open: bool) {
        self.shared.open.store(open, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections passing now: one ends when both its sides have closed
    /// (a side the worker closed stays counted until the gateway closes
    /// its own), or when cut.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }

    /// Closes every connection through the relay, on both sides (a worker
    /// that restarted).
    pub fn cut_all(&self) {
        self.shared.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        self.cut_all();
    }
}
