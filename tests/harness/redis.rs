//! Starts a real `redis-server` on a free loopback port, without persistence.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::harness::gateway::{free_port, scratch_dir};

/// A running `redis-server`; killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    pub async fn start() -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            child: None,
            dir: scratch_dir("redis"),
        };
        server.spawn().await;
        server
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// The server process's id while it runs (for a bench to read its CPU).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts the server again on the same port (empty: nothing persists).
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    async fn spawn(&mut self) {
        let deadline = Instant::now() + super::scaled_secs(10);
        loop {
            let log = std::fs::File::create(self.dir.join("redis.log")).expect("redis log file");
            let child = Command::new("redis-server")
                .args(["--port", &self.port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .args(["--daemonize", "no"])
                .arg("--dir")
                .arg(&self.dir)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn();
            let mut child = match child {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    panic!("redis-server not found: install redis-server (scripts/deps does)")
                }
                Err(e) => panic!("cannot start redis-server: {e}"),
            };
            // Until it answers PING, or exits (the port may still be held by
            // the previous instance for a moment after a kill).
            loop {
                if ping(self.port).await {
                    self.child = Some(child);
                    return;
                }
                if let Ok(Some(status)) = child.try_wait() {
                    if Instant::now() > deadline {
                        panic!(
                            "redis-server on port {} exited ({status}):\n{}",
                            self.port,
                            self.log()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    break; // start it again
                }
                if Instant::now() > deadline {
                    panic!(
                        "redis-server on port {} did not answer PING within {:?}:\n{}",
                        self.port,
                        super::scaled_secs(10),
                        self.log()
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Whether a Redis server on `port` answers `PING` with `+PONG`.
async fn ping(port: u16) -> bool {
    let attempt = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).await.ok()?;
        (&buf == b"+PONG\r\n").then_some(())
    };
    tokio::time::timeout(super::scaled_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .is_some()
}
