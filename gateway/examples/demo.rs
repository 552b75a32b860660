//! One minute with a2a-gateway: `scripts/demo` runs this.
//!
//! It starts a worker that knows nothing about delegation policy (the Python
//! agent on the official `a2a-sdk`, `tests/workers/python_agent.py`), the
//! gateway in front of it on the embedded store, and then, printing what
//! happens as it happens:
//!
//! 1. a caller starts a long task through the gateway and goes away: the
//!    gateway cancels the child (read back from the worker itself) and its
//!    metric moves;
//! 2. the same caller straight to the worker: the task works on;
//! 3. a parent agent process (`a2a-protocol-client`'s
//!    `Delegation::start_leased`) delegates a leased child through a route
//!    that detaches (no cascade: only the lease protects), renews it, and
//!    is SIGKILLed: the gateway cancels the child once its lease lapses.
//!
//! Exits 0 when every step ended as described, 1 otherwise (the integration
//! test `demo::runs_to_completion` runs it).
//!
//! ```text
//! demo [--gateway PATH] [--python PATH] [--agent PATH] [--time-factor F]
//! demo parent URL TTL_MS TEXT        (internal: the parent agent process)
//! ```
//!
//! An example, not a binary of the gateway: it needs the a2a-rust client,
//! which the gateway itself does not depend on.

#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use a2a_protocol_client::{A2aClient, ClientBuilder};
use a2a_protocol_types::{
    Message, MessageRole, MessageSendParams, Part, StreamResponse, TaskQueryParams, TaskState,
};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// How long the child's lease lives without a renewal (the parent renews
/// every third of it).
const LEASE_TTL: Duration = Duration::from_secs(3);

/// Where things are, and how patient to be.
struct Setup {
    gateway: PathBuf,
    python: PathBuf,
    agent: PathBuf,
    factor: f64,
}

impl Setup {
    fn from_args(args: &[String]) -> Result<Setup, String> {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .ok_or("no workspace above the gateway package")?
            .to_path_buf();
        // target/<profile>/examples/demo -> target/<profile>/a2a-gateway
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let beside = exe
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("a2a-gateway"))
            .unwrap_or_default();
        let mut setup = Setup {
            gateway: beside,
            python: workspace.join("target/pyvenv/bin/python"),
            agent: workspace.join("tests/workers/python_agent.py"),
            factor: 1.0,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it.next().ok_or(format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--gateway" => setup.gateway = value.into(),
                "--python" => setup.python = value.into(),
                "--agent" => setup.agent = value.into(),
                "--time-factor" => {
                    setup.factor = value
                        .parse()
                        .ok()
                        .filter(|f: &f64| *f >= 1.0)
                        .ok_or("--time-factor: a number >= 1")?;
                }
                _ => return Err(format!("unknown argument {flag}")),
            }
        }
        for (what, path) in [
            ("gateway binary", &setup.gateway),
            ("python", &setup.python),
            ("agent", &setup.agent),
        ] {
            if !path.exists() {
                return Err(format!(
                    "{what} not found at {} (scripts/demo builds and finds everything)",
                    path.display()
                ));
            }
        }
        Ok(setup)
    }

    fn patience(&self, d: Duration) -> Duration {
        d.mul_f64(self.factor)
    }
}

/// Prints a line stamped with the time since the demo started.
struct Clock(Instant);

impl Clock {
    fn say(&self, who: &str, what: impl std::fmt::Display) {
        println!("[{:>5.1}s] {who:<8} {what}", self.0.elapsed().as_secs_f64());
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// GET `path` on `port` (HTTP/1.0, whole body).
async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
    // `Connection: close`: the admin endpoint keeps even an HTTP/1.0
    // connection open otherwise, and reading to the end would wait for its
    // idle timeout.
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Waits until `port` answers `path` with 200.
async fn wait_up(port: u16, path: &str, within: Duration) -> Result<(), String> {
    let until = Instant::now() + within;
    loop {
        if let Ok((200, _)) = http_get(port, path).await {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!(
                "127.0.0.1:{port}{path} did not answer within {within:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The gateway's `/metrics` lines that start with `name`.
async fn metric_lines(admin: u16, name: &str) -> Vec<String> {
    match http_get(admin, "/metrics").await {
        Ok((_, body)) => body
            .lines()
            .filter(|l| l.starts_with(name))
            .filter(|l| !l.ends_with(" 0"))
            .map(str::to_string)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Waits until the gateway has logged `logged` cancels in all and its
/// `a2agw_cancels_total` counts one with `cause`: the gateway logs and
/// counts a cancel once the worker has answered it, a moment after the
/// worker reports the task CANCELED.
async fn settled(
    cancels_logged: &AtomicUsize,
    logged: usize,
    admin: u16,
    cause: &str,
    within: Duration,
) -> Result<(), String> {
    let until = Instant::now() + within;
    let label = format!("cause=\"{cause}\"");
    loop {
        let counted = metric_lines(admin, "a2agw_cancels_total")
            .await
            .iter()
            .any(|l| l.contains(&label));
        if counted && cancels_logged.load(Ordering::SeqCst) >= logged {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!(
                "the gateway did not log and count its {cause} cancel within {within:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn client(url: &str) -> Result<A2aClient, String> {
    ClientBuilder::new(url.to_string())
        .with_protocol_binding("JSONRPC")
        .build()
        .map_err(|e| format!("A2A client for {url}: {e:?}"))
}

/// The task's state as the worker itself reports it.
async fn worker_state(worker: &A2aClient, id: &str) -> Option<TaskState> {
    worker
        .get_task(TaskQueryParams::new(id.to_string()))
        .await
        .ok()
        .map(|t| t.status.state)
}

/// Polls the worker until the task is `want`; the time it took.
async fn wait_state(
    worker: &A2aClient,
    id: &str,
    want: TaskState,
    within: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        let got = worker_state(worker, id).await;
        if got == Some(want) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            return Err(format!(
                "task {id}: still {got:?} after {within:?}, expected {want:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a streaming send of `text` at `url`, reads until the task is
/// WORKING, and returns its id with the open stream's owner (drop it to
/// leave).
async fn start_streaming(
    url: &str,
    text: &str,
    within: Duration,
) -> Result<(String, impl Sized), String> {
    let c = client(url)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let msg = Message::new(
        format!("demo-{}-{nanos}", std::process::id()),
        MessageRole::User,
        vec![Part::text(text)],
    );
    let mut stream = c
        .stream_message(MessageSendParams::new(msg))
        .await
        .map_err(|e| format!("SendStreamingMessage to {url}: {e:?}"))?;
    let mut task = None;
    let read = async {
        while let Some(ev) = stream.next().await {
            let ev = ev.map_err(|e| format!("stream event: {e:?}"))?;
            let (tid, state) = match ev {
                StreamResponse::Task(t) => (t.id.to_string(), t.status.state),
                StreamResponse::StatusUpdate(u) => (u.task_id.to_string(), u.status.state),
                _ => continue,
            };
            task = Some(tid);
            if state == TaskState::Working {
                return Ok(());
            }
        }
        Err("the stream ended before the task was WORKING".to_string())
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| format!("no WORKING event within {within:?}"))??;
    let id = task.ok_or("no task id")?;
    // Dropping the stream and its client closes the caller's connection.
    Ok((id, (stream, c)))
}

/// A caller starts a one-minute task at `url` and, once it is WORKING,
/// disconnects; the task's id.
async fn start_and_leave(clock: &Clock, url: &str, setup: &Setup) -> Result<String, String> {
    let (id, caller) =
        start_streaming(url, "work:60000", setup.patience(Duration::from_secs(10))).await?;
    clock.say(
        "caller",
        format!("child {id} is WORKING; the caller disconnects now"),
    );
    drop(caller);
    Ok(id)
}

/// Deletes the demo's config file when the demo ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Spawns `cmd`, killed when its handle is dropped.
fn spawn(cmd: &mut Command, what: &str) -> Result<Child, String> {
    cmd.kill_on_drop(true)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {what}: {e}"))
}

async fn run(setup: Setup) -> Result<(), String> {
    let clock = Clock(Instant::now());
    let (worker_port, gw_port, admin_port) = (free_port()?, free_port()?, free_port()?);
    let worker_url = format!("http://127.0.0.1:{worker_port}");
    let gw_url = format!("http://127.0.0.1:{gw_port}");

    println!("a2a-gateway in one minute\n");
    clock.say(
        "demo",
        format!("worker: the Python a2a-sdk agent on {worker_url} (knows nothing of leases or cascades)"),
    );
    let _worker = spawn(
        Command::new(&setup.python)
            .arg(&setup.agent)
            .args(["--port", &worker_port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "the Python agent",
    )?;
    wait_up(
        worker_port,
        "/.well-known/agent-card.json",
        setup.patience(Duration::from_secs(30)),
    )
    .await?;

    clock.say(
        "demo",
        format!(
            "gateway: {gw_url} in front of it, embedded store, admin on 127.0.0.1:{admin_port}"
        ),
    );
    // Two routes to the same worker: the catch-all cascades (the default);
    // `/leased` detaches, so there only a lease stops a child.
    let config = std::env::temp_dir().join(format!("a2a-gateway-demo-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = [\"127.0.0.1:{gw_port}\"]\nadmin = \"127.0.0.1:{admin_port}\"\n\
             log_flush = \"0s\"\n\n\
             [[routes]]\nname = \"leased\"\nworker = \"{worker_url}\"\n\
             path_prefix = \"/leased\"\nstrip_prefix = true\ncascade = \"detach\"\n\n\
             [[routes]]\nname = \"default\"\nworker = \"{worker_url}\"\n"
        ),
    )
    .map_err(|e| format!("writing {}: {e}", config.display()))?;
    let mut gateway = spawn(
        Command::new(&setup.gateway)
            .arg("--config")
            .arg(&config)
            .env(
                "A2A_GATEWAY_LOG",
                "info,a2agw::access=off,pingora_core=warn,pingora_proxy=warn",
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "the gateway",
    )?;
    let _config = RemoveOnDrop(config);
    // The gateway's own log lines about cancels and leases, as they come;
    // `cancels_logged` counts its "CancelTask sent" lines, so that each act
    // ends only once the gateway has said what it did (it logs, and counts
    // the metric, when the worker has answered the cancel: after the worker
    // already reports CANCELED).
    let cancels_logged = Arc::new(AtomicUsize::new(0));
    if let Some(err) = gateway.stderr.take() {
        let start = clock.0;
        let cancels_logged = cancels_logged.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("CancelTask") || line.contains("lease") {
                    if line.contains("CancelTask sent") {
                        cancels_logged.fetch_add(1, Ordering::SeqCst);
                    }
                    let msg = line
                        .split_once(": ")
                        .map(|(_, m)| m.to_string())
                        .unwrap_or(line);
                    Clock(start).say("gateway", format!("log: {msg}"));
                }
            }
        });
    }
    wait_up(
        admin_port,
        "/readyz",
        setup.patience(Duration::from_secs(10)),
    )
    .await?;
    let worker = client(&worker_url)?;
    let cancel_within = setup.patience(Duration::from_secs(5));

    println!("\n1. A caller starts a one-minute task through the gateway, then goes away.");
    let id = start_and_leave(&clock, &gw_url, &setup).await?;
    let took = wait_state(&worker, &id, TaskState::Canceled, cancel_within).await?;
    clock.say(
        "worker",
        format!(
            "child {id} is TASK_STATE_CANCELED ({} ms after the caller left)",
            took.as_millis()
        ),
    );
    settled(&cancels_logged, 1, admin_port, "caller_gone", cancel_within).await?;
    for l in metric_lines(admin_port, "a2agw_cancels_total").await {
        clock.say("metrics", l);
    }

    println!("\n2. The same caller straight to the worker: nothing cancels its child.");
    let id = start_and_leave(&clock, &worker_url, &setup).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    match worker_state(&worker, &id).await {
        Some(TaskState::Working) => clock.say(
            "worker",
            format!("child {id} is still TASK_STATE_WORKING 2 s later: an orphan"),
        ),
        other => return Err(format!("the direct child {id} is {other:?}, not WORKING")),
    }
    worker
        .cancel_task(id.clone())
        .await
        .map_err(|e| format!("cancelling the orphan {id}: {e:?}"))?;
    clock.say("demo", format!("(cancelled {id} by hand to clean up)"));

    println!(
        "\n3. A parent agent delegates a child with a {} s lease through {gw_url}/leased, a route\n   \
         that detaches (its children outlive their callers' connections), and is SIGKILLed.",
        LEASE_TTL.as_secs()
    );
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut parent = spawn(
        Command::new(exe)
            .args([
                "parent",
                &format!("{gw_url}/leased"),
                &LEASE_TTL.as_millis().to_string(),
                "work:60000",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
        "the parent agent",
    )?;
    let out = parent.stdout.take().ok_or("the parent's stdout")?;
    let mut lines = BufReader::new(out).lines();
    let child = tokio::time::timeout(setup.patience(Duration::from_secs(15)), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(id) = line.strip_prefix("CHILD ") {
                return Some(id.trim().to_string());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .ok_or("the parent did not name its child")?;
    clock.say(
        "parent",
        format!(
            "pid {}: child {child} started, lease renewed every {} ms",
            parent.id().unwrap_or(0),
            LEASE_TTL.as_millis() / 3
        ),
    );
    tokio::time::sleep(LEASE_TTL).await;
    let state = worker_state(&worker, &child).await;
    if state != Some(TaskState::Working) {
        return Err(format!(
            "the leased child {child} is {state:?} while its parent lives"
        ));
    }
    for l in metric_lines(admin_port, "a2agw_lease_renewals_total").await {
        clock.say("metrics", l);
    }
    clock.say(
        "worker",
        format!(
            "child {child} is still WORKING after {} s: the parent renews",
            LEASE_TTL.as_secs()
        ),
    );
    parent
        .start_kill()
        .map_err(|e| format!("SIGKILL the parent: {e}"))?;
    let _ = parent.wait().await;
    clock.say(
        "demo",
        "SIGKILL the parent: no goodbye, no CancelTask, no more renewals",
    );
    let took = wait_state(
        &worker,
        &child,
        TaskState::Canceled,
        LEASE_TTL + cancel_within,
    )
    .await?;
    clock.say(
        "worker",
        format!(
            "child {child} is TASK_STATE_CANCELED {} ms after the parent died (lease {} ms)",
            took.as_millis(),
            LEASE_TTL.as_millis()
        ),
    );
    if took < LEASE_TTL / 2 {
        return Err(format!(
            "the leased child {child} was cancelled {took:?} after its parent died, before its lease could lapse"
        ));
    }
    settled(
        &cancels_logged,
        2,
        admin_port,
        "lease_lapsed",
        cancel_within,
    )
    .await?;
    for l in metric_lines(admin_port, "a2agw_cancels_total").await {
        clock.say("metrics", l);
    }
    println!("\nDone: every child whose caller went away was cancelled by the gateway.");
    Ok(())
}

/// The parent agent process: one leased delegation, its child's id on
/// stdout, then it waits (to be SIGKILLed).
async fn parent(url: &str, ttl_ms: &str, text: &str) -> Result<(), String> {
    use a2a_protocol_client::delegation::Delegation;
    use std::io::Write as _;
    let ttl = Duration::from_millis(ttl_ms.parse().map_err(|_| "TTL_MS: a number")?);
    let c = Arc::new(client(url)?);
    let msg = Message::new(
        format!("demo-parent-{}", std::process::id()),
        MessageRole::User,
        vec![Part::text(text)],
    );
    let mut delegation = Delegation::start_leased(c, MessageSendParams::new(msg), ttl)
        .await
        .map_err(|e| format!("Delegation::start_leased: {e:?}"))?;
    while delegation.task_id().is_none() && !delegation.is_settled() {
        match delegation.next_event().await {
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
    let id = delegation.task_id().ok_or("no child id")?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "CHILD {id}");
    let _ = out.flush();
    drop(out);
    let done = delegation.wait(std::future::pending()).await;
    let _ = writeln!(std::io::stdout(), "OUTCOME {:?}", done.outcome);
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("parent") if args.len() == 4 => parent(&args[1], &args[2], &args[3]).await,
        _ => match Setup::from_args(&args) {
            Ok(setup) => run(setup).await,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}
