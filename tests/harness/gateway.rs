//! Starts the real `a2a-gateway` binary on free ports with a config file.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::process::{Child, Command};

/// A free loopback port (bound, then released), never one this process
/// was handed before: the kernel may give the same port to two `bind(0)`s
/// in a row once the first is released, and a gateway whose admin port came
/// out equal to its listen port refuses to start.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A scratch directory for one test's files.
pub fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "a2agw-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Overrides the gateways' log filter (`A2A_GATEWAY_LOG` syntax).
const LOG_ENV: &str = "A2AGW_HARNESS_GATEWAY_LOG";

/// The gateway's log filter: debug for tests (their failures print the
/// log), `$A2AGW_HARNESS_GATEWAY_LOG` when set (benches set the product's
/// default, so that they measure what a user runs).
fn log_filter() -> String {
    std::env::var(LOG_ENV).unwrap_or_else(|_| "info,a2a_gateway=debug".into())
}

/// The filter a gateway started without `A2A_GATEWAY_LOG` uses
/// (`gateway/src/main.rs`): `info`, the access log's line per request
/// included.
pub const PRODUCT_LOG: &str = "info,pingora_core=warn,pingora_proxy=warn";

/// For benches: their gateways log as a user's do by default
/// ([`PRODUCT_LOG`], an access line per request), so that what is
/// measured is what runs; unless `$A2AGW_HARNESS_GATEWAY_LOG` is already
/// set, e.g. to `warn` to see what the log costs, or to
/// `info,a2a_gateway::proxy=debug` to see in each gateway's `gateway.log`
/// how its WebSocket sessions ended.
pub fn product_log_unless_set() {
    if std::env::var_os(LOG_ENV).is_none() {
        std::env::set_var(LOG_ENV, PRODUCT_LOG);
    }
    std::env::set_var(PRODUCT_FLUSH_ENV, "1");
}

/// Set (by [`product_log_unless_set`]): the gateways buffer their log as
/// a user's do (`server.log_flush`'s default). Unset, as in tests: every
/// line is written at once (`log_flush = "0s"`), since tests read the log
/// as soon as what they look for has happened; a test that sets
/// `log_flush` itself keeps its own.
const PRODUCT_FLUSH_ENV: &str = "A2AGW_HARNESS_PRODUCT_LOG_FLUSH";

/// A running gateway process; killed on drop.
#[derive(Debug)]
pub struct Gateway {
    child: Child,
    pub url: String,
    pub admin: String,
    pub log: PathBuf,
    /// The config file it was started with (`--config`).
    pub config: PathBuf,
    /// The `[server]` lines the harness wrote before the body.
    server_head: String,
}

impl Gateway {
    /// Starts the gateway with `[server]` filled in by the harness and the
    /// rest of the config (routes, policies) from `body`, which follows the
    /// harness's `[server]` keys: keys before its first table header set
    /// more of `[server]`.
    pub async fn start(body: &str) -> Gateway {
        Gateway::start_with_env(body, &[]).await
    }

    /// [`Gateway::start`] with its wall clock `offset` (libfaketime's
    /// syntax: `"+30s"`, `"-30s"`) off the machine's: the clock that
    /// `SystemTime` reads. Timers (the monotonic clock) are left alone.
    pub async fn start_with_clock(body: &str, offset: &str) -> Gateway {
        let lib = ["x86_64-linux-gnu", "aarch64-linux-gnu"]
            .iter()
            .map(|a| format!("/usr/lib/{a}/faketime/libfaketimeMT.so.1"))
            .find(|p| std::path::Path::new(p).exists())
            .expect("libfaketime not installed (scripts/deps installs Debian's faketime)");
        Gateway::start_with_env(
            body,
            &[
                ("LD_PRELOAD", lib.as_str()),
                ("FAKETIME", offset),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ],
        )
        .await
    }

    /// [`Gateway::start`] with extra environment variables.
    pub async fn start_with_env(body: &str, env: &[(&str, &str)]) -> Gateway {
        Gateway::start_as(body, env, None).await
    }

    /// [`Gateway::start`] with `hosts` as the gateway's `/etc/hosts` (the
    /// file is bind-mounted over it in a mount namespace of the gateway's
    /// own, with `unshare`, as root): names the test resolves as it likes,
    /// the machine's resolver untouched. Rewriting `hosts` in place changes
    /// what the gateway resolves next.
    pub async fn start_with_hosts(body: &str, hosts: &std::path::Path) -> Gateway {
        Gateway::start_as(body, &[], Some(hosts)).await
    }

    async fn start_as(
        body: &str,
        env: &[(&str, &str)],
        hosts: Option<&std::path::Path>,
    ) -> Gateway {
        let port = free_port();
        let admin_port = free_port();
        let dir = scratch_dir("gw");
        let flush = if std::env::var_os(PRODUCT_FLUSH_ENV).is_some() || body.contains("log_flush") {
            ""
        } else {
            "log_flush = \"0s\"\n"
        };
        let server_head = format!(
            "[server]\nlisten = [\"127.0.0.1:{port}\"]\nadmin = \"127.0.0.1:{admin_port}\"\nthreads = 2\n{flush}\n"
        );
        let cfg = format!("{server_head}{body}");
        let cfg_path = dir.join("gateway.toml");
        std::fs::write(&cfg_path, cfg).unwrap();
        let log = dir.join("gateway.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let bin = env!("CARGO_BIN_EXE_a2a-gateway");
        let mut cmd = match hosts {
            None => Command::new(bin),
            Some(hosts) => {
                let mut c = Command::new("unshare");
                c.args([
                    "--mount",
                    "sh",
                    "-c",
                    "mount --bind \"$0\" /etc/hosts && exec \"$@\"",
                ])
                .arg(hosts)
                .arg(bin);
                c
            }
        };
        let child = cmd
            .arg("--config")
            .arg(&cfg_path)
            .env("A2A_GATEWAY_LOG", log_filter())
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a2a-gateway");
        let gw = Gateway {
            child,
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            log,
            config: cfg_path,
            server_head,
        };
        gw.wait_ready().await;
        gw
    }

    /// A one-route gateway in front of `worker`, with extra route keys.
    pub async fn in_front_of(worker: &str, route_extra: &str) -> Gateway {
        Gateway::start(&format!(
            "[[routes]]\nname = \"w\"\nworker = \"{worker}\"\n{route_extra}\n"
        ))
        .await
    }

    /// Waits for the admin listener, then for `/readyz` to answer 200: every
    /// proxy listener, TLS ones included (pingora binds them one after
    /// another), accepts connections.
    async fn wait_ready(&self) {
        let (admin, _) = super::http::split_url(&self.admin);
        self.wait_listening(&admin).await;
        let mut last = String::new();
        for _ in 0..super::scaled_count(200) {
            let r = super::http::request("GET", &self.admin, "/readyz", &[], b"").await;
            if r.status == 200 {
                return;
            }
            last = format!("{} {}", r.status, r.text());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "gateway not ready within {:?} (last /readyz: {last}); its log:\n{}",
            super::scaled_secs(5),
            self.log_text()
        );
    }

    /// Waits until `addr` (`host:port`) accepts connections.
    async fn wait_listening(&self, addr: &str) {
        for _ in 0..super::scaled_count(200) {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "gateway did not listen on {addr}; its log:\n{}",
            self.log_text()
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Reads the log every 50 ms until `holds` says yes of it (`true`), or
    /// `within` passed (`false`): what a test waits for the gateway to log.
    pub async fn wait_log(&self, within: Duration, holds: impl Fn(&str) -> bool) -> bool {
        let deadline = std::time::Instant::now() + within;
        loop {
            if holds(&self.log_text()) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The admin endpoint's `/metrics` text.
    pub async fn metrics(&self) -> String {
        super::http::request("GET", &self.admin, "/metrics", &[], b"")
            .await
            .text()
    }

    /// The sum of a counter's samples whose labels contain every `labels` item.
    pub async fn counter(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// [`Gateway::counter`] once it reaches `want`, asked every 20 ms for
    /// 2 s (scaled), or its last value: for counters the gateway moves a
    /// moment after what the test saw (a cancel is counted when the
    /// worker's answer to it arrives, after the worker already reports the
    /// task CANCELED; a request when it ends).
    pub async fn counter_reaching(&self, name: &str, labels: &[&str], want: f64) -> f64 {
        let mut got = 0.0;
        for _ in 0..super::scaled_count(100) {
            got = self.counter(name, labels).await;
            if got >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        got
    }

    /// Rewrites the config file with the harness's `[server]` lines (the
    /// same listeners) and a new `body`, as [`Gateway::start`] takes it.
    /// Nothing happens until a reload ([`Gateway::hangup`]).
    pub fn rewrite_config(&self, body: &str) {
        std::fs::write(&self.config, format!("{}{body}", self.server_head))
            .expect("rewrite the gateway's config");
    }

    /// Sends SIGHUP (reload the config) and returns at once.
    pub fn hangup(&self) {
        let pid = self.pid().expect("the gateway runs");
        let ok = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -HUP {pid}");
    }

    /// The gateway process's id (for a profiler to attach to).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGKILLs the gateway (no cleanup, no graceful shutdown).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Sends SIGTERM (a graceful shutdown) and returns at once.
    pub fn terminate(&self) {
        let pid = self.pid().expect("the gateway runs");
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -TERM {pid}");
    }

    /// Waits up to `within` for the process to exit: its status, or `None`
    /// if it still runs.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .map(|s| s.expect("wait for the gateway"))
    }
}

/// Runs the gateway binary with `cfg` as its config file (and `env`) until
/// it exits, which it must within 30 s (scaled): its exit code and stderr.
pub async fn run_config_to_exit(cfg: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let path = scratch_dir("run-to-exit").join("gateway.toml");
    std::fs::write(&path, cfg).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_a2a-gateway"))
        .arg("--config")
        .arg(&path)
        .env("A2A_GATEWAY_LOG", "debug")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a2a-gateway");
    let out = tokio::time::timeout(super::scaled_secs(30), child.wait_with_output())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "a2a-gateway still running after {:?}",
                super::scaled_secs(30)
            )
        })
        .expect("a2a-gateway's output");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}
