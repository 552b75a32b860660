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
    /// What the gateway sent the worker through the relay, every
    /// connection's bytes appended as they passed (up to 4 MiB), when the
    /// relay records ([`Relay::start_recording`]).
    sent: std::sync::Mutex<Vec<u8>>,
    record: bool,
    open: AtomicBool,
    accepted: AtomicUsize,
    live: AtomicUsize,
    /// Bumped by [`Relay::cut_all`]; each connection ends when it changes.
    cut: watch::Sender<u64>,
}

impl Relay {
    pub async fn start(to: String) -> Relay {
        Relay::start_at("127.0.0.1:0", to)
            .await
            .expect("a loopback port for the relay")
    }

    /// [`Relay::start`], keeping what the gateway sent ([`Relay::sent_text`]).
    pub async fn start_recording(to: String) -> Relay {
        Relay::bind("127.0.0.1:0", to, true)
            .await
            .expect("a loopback port for the relay")
    }

    /// [`Relay::start`] listening on `listen` (an address of the
    /// loopback range and a port, `0` for any free one).
    pub async fn start_at(listen: &str, to: String) -> std::io::Result<Relay> {
        Relay::bind(listen, to, false).await
    }

    async fn bind(listen: &str, to: String, record: bool) -> std::io::Result<Relay> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            sent: std::sync::Mutex::new(Vec::new()),
            record,
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
                    let Ok(out) = tokio::net::TcpStream::connect(&to).await else {
                        return;
                    };
                    s.live.fetch_add(1, Ordering::SeqCst);
                    let mut cut = s.cut.subscribe();
                    if !s.record {
                        let mut out = out;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                            _ = cut.changed() => {}
                        }
                        s.live.fetch_sub(1, Ordering::SeqCst);
                        return;
                    }
                    let (mut from_gw, mut to_gw) = inbound.split();
                    let (mut from_worker, mut to_worker) = out.into_split();
                    let up = async {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match from_gw.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            {
                                let mut sent = s.sent.lock().unwrap();
                                if sent.len() + n <= 4 << 20 {
                                    sent.extend_from_slice(&buf[..n]);
                                }
                            }
                            if to_worker.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = to_worker.shutdown().await;
                    };
                    // Each direction ends by closing the other side's
                    // write half, as `copy_bidirectional` does.
                    let down = async {
                        use tokio::io::AsyncWriteExt;
                        let _ = tokio::io::copy(&mut from_worker, &mut to_gw).await;
                        let _ = to_gw.shutdown().await;
                    };
                    tokio::select! {
                        _ = async { tokio::join!(up, down) } => {}
                        _ = cut.changed() => {}
                    }
                    s.live.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Ok(Relay { port, shared, task })
    }

    /// While closed, new connections are accepted and left hanging (a
    /// worker that stopped answering); open ones pass on.
    pub fn set_open(&self, open: bool) {
        self.shared.open.store(open, Ordering::SeqCst);
    }

    /// Everything the gateway sent the worker through a recording relay so
    /// far (request heads and bodies, as bytes on the wire), lossily as
    /// text; empty for one that does not record.
    pub fn sent_text(&self) -> String {
        String::from_utf8_lossy(&self.shared.sent.lock().unwrap()).into_owned()
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
