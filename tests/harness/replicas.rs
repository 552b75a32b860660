//! Several replicas of one worker behind one route (`workers = [...]`,
//! issue 44): each replica a worker of its own (its own process for the
//! Python agent, its own server and in-memory task store for a2a-rust),
//! optionally behind a [`Relay`] that records every byte the gateway sent
//! that replica, so a test can show what never reached it.
//!
//! * [`start`], [`start_fronts`], [`start_grpc`]: the replicas.
//! * [`route`]: a `[[routes]]` table naming them.
//! * [`Replica::kill`]: a replica gone for good, as the gateway sees it
//!   (connections refused, open ones cut): a Python replica is SIGKILLed; an
//!   a2a-rust replica, which runs in the test's process, is cut off by
//!   dropping the relay it sits behind (its server keeps running, unreachable).
//! * [`admin_replica`]: the `replica` the gateway recorded for a task.
//! * [`holder`]: which replica's own store knows a task.

use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;

use super::gateway::Gateway;
use super::http::{list_tasks, request, split_url};
use super::python_worker::PythonWorker;
use super::relay::Relay;
use super::worker::{Kind, Worker};

/// How the gateway reaches a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// The worker's own port.
    Direct,
    /// A [`Relay`] in front of the worker's port, recording what passed.
    Relayed,
}

/// One replica: a worker, and the relay in front of it, if any.
#[derive(Debug)]
pub struct Replica {
    /// `None` once a Python replica was killed.
    worker: Option<Worker>,
    relay: Option<RelayBox>,
    /// The URL the gateway is given (the relay's, else the worker's).
    url: String,
    alive: bool,
}

/// A [`Relay`] (which is not `Debug`).
struct RelayBox(Relay);

impl std::fmt::Debug for RelayBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Relay(127.0.0.1:{})", self.0.port)
    }
}

impl Replica {
    /// Puts `worker` behind `front`; `grpc`: the gateway speaks to the
    /// worker's gRPC port (else its HTTP port).
    async fn new(worker: Worker, front: Front, grpc: bool) -> Replica {
        let target = if grpc {
            worker.grpc_url()
        } else {
            worker.url()
        };
        let relay = match front {
            Front::Direct => None,
            Front::Relayed => Some(RelayBox(Relay::start_recording(split_url(&target).0).await)),
        };
        let url = match &relay {
            Some(r) => format!("http://127.0.0.1:{}", r.0.port),
            None => target,
        };
        Replica {
            worker: Some(worker),
            relay,
            url,
            alive: true,
        }
    }

    /// The worker itself (its own store, cancel log, counters). Panics for
    /// a Python replica that was killed.
    pub fn worker(&self) -> &Worker {
        self.worker
            .as_ref()
            .expect("this replica's worker was killed")
    }

    /// The URL the gateway's route names for this replica.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// `127.0.0.1:PORT`: the replica's configured authority, as the
    /// gateway reports it (`replica` in the admin task view, the `replica`
    /// label of `a2agw_replica_up`).
    pub fn authority(&self) -> String {
        split_url(&self.url).0
    }

    /// Whether [`Replica::kill`] has not been called.
    pub fn alive(&self) -> bool {
        self.alive
    }

    /// Every byte the gateway sent this replica so far, lossily as text
    /// (the relay's record, up to 4 MiB). Panics for a direct replica.
    pub fn sent_text(&self) -> String {
        self.relay
            .as_ref()
            .expect("a direct replica records nothing (use Front::Relayed)")
            .0
            .sent_text()
    }

    /// Whether this replica records what it was sent ([`Front::Relayed`]).
    pub fn relayed(&self) -> bool {
        self.relay.is_some()
    }

    /// The replica goes away for the gateway: new connections refused, open
    /// ones cut. A Python worker is SIGKILLed (behind a relay, the relay is
    /// dropped first); an a2a-rust worker, in the test's own process, must
    /// sit behind a relay, which is dropped (its server and tasks live on,
    /// unreachable: its store and cancel log can still be read).
    pub async fn kill(&mut self) {
        assert!(self.alive, "killed twice");
        self.alive = false;
        // Dropping the relay aborts its accept loop (the listener closes:
        // connections refused) and cuts every connection through it.
        let had_relay = self.relay.take().is_some();
        match self.worker.take() {
            Some(Worker::Python(w)) => w.kill().await,
            Some(w @ Worker::Rust(_)) => {
                assert!(
                    had_relay,
                    "an a2a-rust replica is killed by dropping its relay: start it Front::Relayed"
                );
                self.worker = Some(w);
            }
            None => unreachable!(),
        }
        // Let the kernel tear the sockets down before the test goes on.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Python agent as [`Worker::start`] starts it (tenant-scoped), also
/// recording every request (`--record-requests`: `requests_seen`).
async fn python_worker(grpc: bool) -> Worker {
    let args = ["--tenant-scoped", "--record-requests"];
    Worker::Python(if grpc {
        PythonWorker::start_with_grpc(&args).await
    } else {
        PythonWorker::start_with_args(&args).await
    })
}

async fn worker(kind: Kind, grpc: bool) -> Worker {
    match (kind, grpc) {
        (Kind::Python, _) => python_worker(grpc).await,
        (Kind::Rust, false) => Worker::start(kind).await,
        (Kind::Rust, true) => Worker::start_with_grpc(kind).await,
    }
}

/// `n` replicas of `kind`, all behind `front`, started at once.
pub async fn start(kind: Kind, n: usize, front: Front) -> Vec<Replica> {
    start_fronts(kind, &vec![front; n]).await
}

/// One replica of `kind` per entry of `fronts`, each behind its front.
pub async fn start_fronts(kind: Kind, fronts: &[Front]) -> Vec<Replica> {
    let workers = join_all(fronts.iter().map(|_| worker(kind, false))).await;
    let mut out = Vec::new();
    for (w, f) in workers.into_iter().zip(fronts) {
        out.push(Replica::new(w, *f, false).await);
    }
    out
}

/// `n` replicas of `kind` serving gRPC too, the route naming their gRPC
/// ports (behind `front`); read their state over HTTP as usual.
pub async fn start_grpc(kind: Kind, n: usize, front: Front) -> Vec<Replica> {
    let workers = join_all((0..n).map(|_| worker(kind, true))).await;
    let mut out = Vec::new();
    for w in workers {
        out.push(Replica::new(w, front, true).await);
    }
    out
}

/// `workers = ["http://127.0.0.1:P1", ...]` for `replicas`.
pub fn workers_line(replicas: &[Replica]) -> String {
    let urls: Vec<String> = replicas
        .iter()
        .map(|r| format!("\"{}\"", r.url()))
        .collect();
    format!("workers = [{}]", urls.join(", "))
}

/// A `[[routes]]` table named `w` over `replicas`, with `extra` route keys.
pub fn route(replicas: &[Replica], extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"w\"\n{}\n{extra}\n",
        workers_line(replicas)
    )
}

/// [`route`] over the replicas at indexes `which` only (a config a reload
/// gives that removed or replaced some).
pub fn route_over(replicas: &[Replica], which: &[usize], extra: &str) -> String {
    let urls: Vec<String> = which
        .iter()
        .map(|&i| format!("\"{}\"", replicas[i].url()))
        .collect();
    format!(
        "[[routes]]\nname = \"w\"\nworkers = [{}]\n{extra}\n",
        urls.join(", ")
    )
}

/// The admin endpoint's view of task `id` (`GET /tasks/{id}`) once it
/// names the replica that took the send, asked every 20 ms for 2 s
/// (scaled): the `replica` it names. Panics with the log otherwise.
pub async fn admin_replica(gw: &Gateway, id: &str) -> String {
    let path = format!("/tasks/{id}");
    let mut last = String::new();
    for _ in 0..super::scaled_count(100) {
        let r = request("GET", &gw.admin, &path, &[], b"").await;
        if r.status == 200 {
            let v: Value = r.json();
            if let Some(rep) = v["replica"].as_str() {
                return rep.to_string();
            }
        }
        last = format!("{} {}", r.status, r.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "GET {path} named no replica within {:?}; last: {last}; log:\n{}",
        super::scaled_secs(2),
        gw.log_text()
    );
}

/// The index of the one live replica whose own store knows task `id` in
/// `tenant`; panics when none does or more than one does.
pub async fn holder(replicas: &[Replica], tenant: Option<&str>, id: &str) -> usize {
    let mut found = Vec::new();
    for (i, r) in replicas.iter().enumerate() {
        if r.alive() && r.worker().state(tenant, id).await.is_some() {
            found.push(i);
        }
    }
    assert_eq!(
        found.len(),
        1,
        "task {id} should be in exactly one replica's store: found in {found:?}"
    );
    found[0]
}

/// The index of the replica whose authority is `authority`; panics when
/// none is.
pub fn index_of(replicas: &[Replica], authority: &str) -> usize {
    replicas
        .iter()
        .position(|r| r.authority() == authority)
        .unwrap_or_else(|| {
            let all: Vec<String> = replicas.iter().map(Replica::authority).collect();
            panic!("{authority:?} is none of the replicas {all:?}")
        })
}

/// Every task id the live replicas hold in `tenant`, per replica (JSON-RPC
/// `ListTasks` straight to each; up to 100 each).
pub async fn task_ids(replicas: &[Replica], tenant: Option<&str>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for r in replicas {
        if r.alive() {
            let ids = list_tasks(&r.worker().url(), tenant).await;
            out.push(ids.into_iter().map(|(id, _)| id).collect());
        } else {
            out.push(Vec::new());
        }
    }
    out
}

/// How many `CancelTask` calls reached each replica's cancel path
/// ([`Worker::cancels`]), in order (0 for a killed Python replica).
pub async fn cancels(replicas: &[Replica]) -> Vec<u64> {
    let mut out = Vec::new();
    for r in replicas {
        out.push(match &r.worker {
            Some(w) => w.cancels().await,
            None => 0,
        });
    }
    out
}

/// `a2agw_replica_up{replica="AUTHORITY"}` as the gateway reports it now
/// (`None` when no such sample).
pub async fn replica_up(gw: &Gateway, authority: &str) -> Option<f64> {
    let label = format!("replica=\"{authority}\"");
    gw.metrics()
        .await
        .lines()
        .find(|l| l.starts_with("a2agw_replica_up") && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The task ids among `ids` that occur anywhere in the bytes the gateway
/// sent `replica` (its relay's record): a task id is the worker's own, so
/// it only ever travels to the replica that runs the task.
pub fn named_in(replica: &Replica, ids: &[String]) -> Vec<String> {
    let sent = replica.sent_text();
    ids.iter()
        .filter(|id| sent.contains(id.as_str()))
        .cloned()
        .collect()
}
