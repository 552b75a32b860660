//! Starts a real `redis-server` on a free loopback port, without persistence,
//! in plain TCP or ([`RedisServer::start_tls`]) TLS only, with a password.

use std::path::{Path, PathBuf};
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
    tls: Option<RedisTls>,
    /// More `redis-server` arguments (`--replicaof`).
    extra: Vec<String>,
}

/// How [`RedisServer::start_tls`] runs a server: TLS only (no plain port),
/// with this certificate, and `requirepass`.
#[derive(Clone, Debug)]
pub struct RedisTls {
    /// The server's certificate and key (PEM), for `127.0.0.1`.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA that signed them (and, with `client_auth`, the clients'
    /// certificates).
    pub ca: PathBuf,
    /// What clients must `AUTH` with.
    pub password: String,
    /// `tls-auth-clients yes`: clients must present a certificate the CA
    /// signed; else `no`.
    pub client_auth: bool,
    /// With `client_auth`: the certificate and key `redis-cli` presents.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    pub async fn start() -> RedisServer {
        RedisServer::start_with(None).await
    }

    /// Starts a server that speaks only TLS (`--port 0 --tls-port P`) and
    /// requires a password, and waits until it answers `redis-cli --tls`.
    pub async fn start_tls(tls: RedisTls) -> RedisServer {
        RedisServer::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<RedisTls>) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            child: None,
            dir: scratch_dir("redis"),
            tls,
            extra: Vec::new(),
        };
        server.spawn().await;
        server
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `rediss://127.0.0.1:PORT/0` (no password in it).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/0", self.port)
    }

    /// The server's working directory (where `SAVE` writes `dump.rdb`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `redis-cli` against the server (over TLS, with the password and
    /// the CA, for a TLS server) with `args`; its stdout, after checking
    /// that it succeeded.
    pub async fn cli(&self, args: &[&str]) -> Vec<u8> {
        let out = self
            .cli_command()
            .args(args)
            .output()
            .await
            .expect("run redis-cli");
        assert!(
            out.status.success(),
            "redis-cli {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// `redis-cli` aimed at the server, its password in the environment
    /// (`REDISCLI_AUTH`), not on its command line.
    fn cli_command(&self) -> Command {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(tls) = &self.tls {
            cmd.arg("--tls").arg("--cacert").arg(&tls.ca);
            if let Some((cert, key)) = &tls.client_cert {
                cmd.arg("--cert").arg(cert).arg("--key").arg(key);
            }
            cmd.env("REDISCLI_AUTH", &tls.password);
        }
        cmd
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
            let mut cmd = Command::new("redis-server");
            match &self.tls {
                None => cmd.args(["--port", &self.port.to_string()]),
                Some(tls) => cmd
                    .args(["--port", "0", "--tls-port", &self.port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .args([
                        "--tls-auth-clients",
                        if tls.client_auth { "yes" } else { "no" },
                    ])
                    .args(["--requirepass", &tls.password]),
            };
            let child = cmd
                .args(["--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .args(["--daemonize", "no"])
                .args(&self.extra)
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
                let up = match self.tls {
                    None => ping(self.port).await,
                    Some(_) => self.ping_tls().await,
                };
                if up {
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

impl RedisServer {
    /// Whether the TLS server answers `redis-cli PING` with `PONG`.
    async fn ping_tls(&self) -> bool {
        let out = tokio::time::timeout(
            super::scaled_secs(2),
            self.cli_command().arg("PING").output(),
        )
        .await;
        match out {
            Ok(Ok(out)) => out.stdout.starts_with(b"PONG"),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("redis-cli not found: install redis-tools (scripts/deps installs redis-server, which brings it)")
            }
            _ => false,
        }
    }
}

/// The name the sentinels of a [`SentinelSet`] monitor its primary by.
pub const MASTER: &str = "mymaster";

/// A primary, its replica, and three sentinels (quorum 2) watching them as
/// [`MASTER`], all on loopback; killed on drop.
#[derive(Debug)]
pub struct SentinelSet {
    pub primary: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<RedisServer>,
}

impl SentinelSet {
    /// Starts them, and waits until every sentinel knows the replica (a
    /// failover needs one to promote).
    pub async fn start() -> SentinelSet {
        let primary = RedisServer::start().await;
        let mut replica = RedisServer {
            port: free_port(),
            child: None,
            dir: scratch_dir("redis-replica"),
            tls: None,
            extra: vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.port.to_string(),
            ],
        };
        replica.spawn().await;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let dir = scratch_dir("sentinel");
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nsentinel monitor {MASTER} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 10000\n",
                    primary.port
                ),
            )
            .unwrap();
            let mut s = RedisServer {
                port,
                child: None,
                dir,
                tls: None,
                extra: Vec::new(),
            };
            s.spawn_sentinel(&conf).await;
            sentinels.push(s);
        }
        let set = SentinelSet {
            primary,
            replica,
            sentinels,
        };
        for s in &set.sentinels {
            let deadline = Instant::now() + super::scaled_secs(20);
            let ask = ["SENTINEL", "replicas", MASTER];
            s.until_naming(
                &ask,
                set.replica.port,
                deadline,
                "does not know the replica",
            )
            .await;
        }
        set
    }

    /// `redis+sentinel://` with the three sentinels, database 0.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER}/0", hosts.join(","))
    }

    /// The port the sentinels name as the primary's now (the first's word).
    pub async fn primary_port(&self) -> u16 {
        let out = self.sentinels[0]
            .cli(&["SENTINEL", "get-master-addr-by-name", MASTER])
            .await;
        let text = String::from_utf8_lossy(&out);
        text.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no primary named: {text:?}"))
    }

    /// Forces a failover (`SENTINEL FAILOVER`, no agreement needed) and
    /// waits until every sentinel names the replica as the primary.
    pub async fn fail_over(&self) {
        self.sentinels[0]
            .cli(&["SENTINEL", "FAILOVER", MASTER])
            .await;
        let deadline = Instant::now() + super::scaled_secs(20);
        let ask = ["SENTINEL", "get-master-addr-by-name", MASTER];
        for s in &self.sentinels {
            s.until_naming(
                &ask,
                self.replica.port,
                deadline,
                "did not move to the replica",
            )
            .await;
        }
    }
}

impl RedisServer {
    /// Asks this sentinel `ask` every 100 ms until its answer has `port`
    /// as a field; panics saying it `what` at `deadline`.
    async fn until_naming(&self, ask: &[&str], port: u16, deadline: Instant, what: &str) {
        let names = |a: &[String]| names_port(a[0].as_bytes(), port);
        self.until_answers(&[ask], names, deadline, what).await;
    }

    /// Runs `redis-server CONF --sentinel` and waits until it answers `PING`.
    async fn spawn_sentinel(&mut self, conf: &Path) {
        let log = std::fs::File::create(self.dir.join("redis.log")).expect("sentinel log file");
        let child = Command::new("redis-server")
            .arg(conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start redis-server --sentinel");
        self.child = Some(child);
        let deadline = Instant::now() + super::scaled_secs(10);
        while !ping(self.port).await {
            assert!(
                Instant::now() < deadline,
                "sentinel on port {} did not answer PING:\n{}",
                self.port,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether `redis-cli` output (one field per line) has `port` as a field.
fn names_port(out: &[u8], port: u16) -> bool {
    let port = port.to_string();
    String::from_utf8_lossy(out)
        .lines()
        .any(|l| l.trim() == port)
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

const CLUSTER_INFO: &[&str] = &["CLUSTER", "INFO"];
const REPLICATION: &[&str] = &["INFO", "replication"];

impl RedisServer {
    /// Runs each of `asks` with `redis-cli` every 100 ms until `ok` holds
    /// for their answers; panics saying the node `what` at `deadline`.
    async fn until_answers(
        &self,
        asks: &[&[&str]],
        ok: impl Fn(&[String]) -> bool,
        deadline: Instant,
        what: &str,
    ) {
        loop {
            let mut answers = Vec::new();
            for ask in asks {
                answers.push(String::from_utf8_lossy(&self.cli(ask).await).into_owned());
            }
            if ok(&answers) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {} {what}:\n{}\n{}",
                self.port,
                answers.join("\n"),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A Redis Cluster on loopback: three primaries, each with one replica,
/// joined by `redis-cli --cluster create`; killed on drop. Nodes time out
/// after a second (`cluster-node-timeout`), so a killed primary's replica
/// takes its slots over within a few.
#[derive(Debug)]
pub struct RedisCluster {
    /// Started as the primaries (`nodes[0..3]`) and their replicas.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the six nodes, creates the cluster, and waits until every
    /// node says it is `ok` and every replica has synced with its primary.
    pub async fn start() -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let mut node = RedisServer {
                port: free_port(),
                child: None,
                dir: scratch_dir("redis-cluster"),
                tls: None,
                extra: vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    "nodes.conf".into(),
                    "--cluster-node-timeout".into(),
                    "1000".into(),
                    "--cluster-port".into(),
                    free_port().to_string(),
                ],
            };
            node.spawn().await;
            nodes.push(node);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + super::scaled_secs(30);
        for n in &cluster.nodes {
            let ok = |a: &[String]| {
                a[0].contains("cluster_state:ok")
                    && (a[1].contains("role:master") || a[1].contains("master_link_status:up"))
            };
            n.until_answers(&[CLUSTER_INFO, REPLICATION], ok, deadline, "is not ok")
                .await;
        }
        cluster
    }

    /// `redis+cluster://` with every node.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// SIGKILLs node `i` (a primary) and waits until its replica has taken
    /// its slots over (says it is a primary) and the cluster is `ok` again
    /// on every live node; returns the replica's index.
    pub async fn kill_primary(&mut self, i: usize) -> usize {
        let primary = format!("master_port:{}", self.nodes[i].port);
        let mut replica = None;
        for (j, n) in self.nodes.iter().enumerate() {
            let repl = String::from_utf8_lossy(&n.cli(REPLICATION).await).into_owned();
            if repl.lines().any(|l| l.trim() == primary) {
                replica = Some(j);
            }
        }
        let replica = replica.unwrap_or_else(|| panic!("node {i} has no replica"));
        self.nodes[i].kill().await;
        let deadline = Instant::now() + super::scaled_secs(30);
        let promoted = |a: &[String]| a[0].contains("role:master");
        self.nodes[replica]
            .until_answers(&[REPLICATION], promoted, deadline, "did not take over")
            .await;
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            let ok = |a: &[String]| a[0].contains("cluster_state:ok");
            n.until_answers(&[CLUSTER_INFO], ok, deadline, "did not see the failover")
                .await;
        }
        replica
    }
}
