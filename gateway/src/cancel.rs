//! Sending `CancelTask` to workers, with retries.
//!
//! The gateway's own calls speak the binding the caller used, in the tenant
//! the task was sent to, with `A2A-Version: 1.0`, and with the headers the
//! worker may find the task by ([`cancel_headers`]): the caller's credential
//! and `cancel_headers` (held in memory for the life of the request, never
//! stored), else the route's configured worker credential, and the route's
//! `inject_headers`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;
use policies::TaskState;
use serde_json::{json, Value};

use crate::a2a::classify::percent_encode_segment;
use crate::a2a::{observe, Binding};
use crate::metrics;
use crate::resolve::{WorkerAddr, WorkerAddrs};
use crate::store::{CancelTarget, Owing, TaskKey, TaskStore};
use crate::worker_client::WorkerClient;

/// One owed cancel.
#[derive(Clone, Debug)]
pub struct CancelJob {
    pub key: TaskKey,
    pub worker: config::WorkerUrl,
    pub target: CancelTarget,
    /// Headers sent besides the gateway's own (`host`, `content-type`,
    /// `a2a-version`, `content-length`); built by [`cancel_headers`].
    pub headers: Vec<(String, String)>,
    /// Why (`caller_gone`, `stream_lost`, `admin`, …), for logs and metrics.
    pub cause: &'static str,
    /// The sent message that started the task, where the request that
    /// leads to the cancel knew it: what the task's delegation reference
    /// was made of ([`crate::tree`]); else its history is asked for.
    pub message_id: Option<String>,
}

/// The caller's request headers a cancel for its child must repeat:
/// `authorization` and the route's `cancel_headers`, unless the route strips
/// them (then the worker never saw them) or injects its own (added by
/// [`cancel_headers`]). Held in memory for the life of the request, never
/// stored. Allocates nothing when the caller sent none of them.
pub fn caller_headers(route: &config::Route, headers: &http::HeaderMap) -> Vec<(String, String)> {
    let policy = &route.headers;
    let mut out = Vec::new();
    let names =
        std::iter::once("authorization").chain(policy.cancel_headers.iter().map(String::as_str));
    for name in names {
        if policy.strip_headers.iter().any(|s| s == name)
            || policy.inject_headers.iter().any(|(k, _)| k == name)
        {
            continue;
        }
        for v in headers.get_all(name) {
            if let Ok(v) = v.to_str() {
                out.push((name.to_string(), v.to_string()));
            }
        }
    }
    out
}

/// Everything a `CancelTask` for a child of `route` carries besides the
/// gateway's own headers, so that the worker finds the task as it did for
/// the caller: the caller's headers ([`caller_headers`]; none when the
/// caller is unknown, as for a lapsed lease another replica saw), the
/// route's `worker_credential` when the caller gave no credential, and the
/// route's `inject_headers`, which the worker received in place of the
/// caller's.
pub fn cancel_headers(route: &config::Route, caller: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = caller.to_vec();
    if let Some(cred) = &route.worker_credential {
        if !out.iter().any(|(k, _)| k == "authorization") {
            out.push(("authorization".to_string(), cred.clone()));
        }
    }
    for (k, v) in &route.headers.inject_headers {
        if matches!(k.as_str(), "content-type" | "a2a-version") {
            // The cancel's own body and protocol version, not the caller's.
            continue;
        }
        out.retain(|(n, _)| n != k);
        out.push((k.clone(), v.clone()));
    }
    out
}

/// Writes the job's cancel to the store's outbox (one round trip), before
/// its first attempt: `Some(Some(token))` to send it as its holder;
/// `Some(None)` to send it without one (the store did not answer: the
/// cancel is not held back for it, and a failure leaves the task's lease to
/// the reaper); `None` when nothing is to be sent (another replica, or a
/// lapse claim, carries it already; or the store knows the task settled).
pub async fn owe(store: &dyn TaskStore, job: &CancelJob) -> Option<Option<String>> {
    match store
        .outbox_put(&job.key, &job.target, job.cause, store.clock_ms())
        .await
    {
        Ok(Owing::Mine(token)) => Some(Some(token)),
        Ok(Owing::Elsewhere) => {
            tracing::info!(task = %job.key, cause = job.cause, "a cancel is owed already (another stream's, another replica's or a lapse's); not sent again");
            None
        }
        Ok(Owing::Settled) => {
            tracing::debug!(task = %job.key, "the store knows the task settled; nothing to cancel");
            None
        }
        Err(e) => {
            metrics::STORE_ERRORS
                .with_label_values(&["outbox_put"])
                .inc();
            tracing::warn!(task = %job.key, error = %e, "could not write the owed cancel to the store; sending it without (lost if this replica dies before the worker answers)");
            Some(None)
        }
    }
}

/// `statusTimestampAfter` for a [`ListQuery`]: RFC 3339 in UTC, whole
/// seconds rounded down.
fn rfc3339(ms: u64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// One page of a `ListTasks` answer, as far as a search by message cares.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    /// (message id, task id) of each wanted message a task's history holds.
    pub found: Vec<(String, String)>,
    /// The next page's token (`None`: the last page).
    pub next: Option<String>,
}

/// Reads one `ListTasks` answer (its status and body): the tasks in it
/// whose history holds a message of `wanted`, and the next page's token;
/// or why there is no page. The worker does not serve the call
/// ([`LookupError::Refused`]) when it answers JSON-RPC `-32601` (method
/// not found) or `-32004` (unsupported operation), HTTP 404, 405 or 501
/// (gRPC `UNIMPLEMENTED` reads as 501). A JSON body is parsed once.
fn read_list<V>(
    binding: Binding,
    status: u16,
    body: &[u8],
    wanted: &HashMap<String, V>,
) -> Result<ListPage, LookupError> {
    let shown = || {
        format!(
            "ListTasks answered {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )
    };
    let json = match binding {
        Binding::Grpc => None,
        _ => serde_json::from_slice::<Value>(body).ok(),
    };
    let refused = match binding {
        Binding::JsonRpc | Binding::WebSocket => json
            .as_ref()
            .and_then(|v| v["error"]["code"].as_i64())
            .is_some_and(|c| c == -32601 || c == -32004),
        Binding::Rest | Binding::Grpc => matches!(status, 404 | 405 | 501),
    };
    if refused {
        return Err(LookupError::Refused(shown()));
    }
    if !(200..300).contains(&status) {
        return Err(LookupError::Failed(shown()));
    }
    let page =
        match (binding, &json) {
            (Binding::Grpc, _) => crate::a2a::grpc::list_page(body, |m| wanted.contains_key(m))
                .map(|(found, next)| ListPage {
                    found,
                    next: Some(next).filter(|t| !t.is_empty()),
                }),
            (_, Some(v)) => list_page(binding, v, wanted),
            (_, None) => None,
        };
    page.ok_or_else(|| LookupError::Failed(shown()))
}

/// A JSON `ListTasks` answer's page: see [`read_list`]. `None`: not a
/// `ListTasks` answer.
fn list_page<V>(binding: Binding, v: &Value, wanted: &HashMap<String, V>) -> Option<ListPage> {
    let list = match binding {
        Binding::Rest => v,
        _ => v.get("result")?,
    };
    let mut found = Vec::new();
    for t in list["tasks"].as_array()? {
        let Some(id) = t["id"].as_str() else { continue };
        for m in t["history"].as_array().into_iter().flatten() {
            if let Some(m) = m["messageId"].as_str().filter(|m| wanted.contains_key(*m)) {
                found.push((m.to_owned(), id.to_owned()));
            }
        }
    }
    let next = list["nextPageToken"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    Some(ListPage { found, next })
}

/// The label of a cause read back from the store's outbox: one of the
/// gateway's own (`caller_gone`, `stream_lost`, `lease_lapsed`,
/// `budget_exhausted`), else `outbox`.
pub fn cause_label(cause: &str) -> &'static str {
    [
        "caller_gone",
        "stream_lost",
        "lease_lapsed",
        "budget_exhausted",
    ]
    .into_iter()
    .find(|c| *c == cause)
    .unwrap_or("outbox")
}

/// When a cancel whose every attempt failed is tried again: a lapsed
/// lease claimed again, an owed cancel handed back to the outbox.
pub const RETRY_FAILED_CANCEL: Duration = Duration::from_secs(30);

/// How a cancel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The worker accepted the cancel.
    Canceled,
    /// The task was already terminal (`-32002` / `TASK_NOT_CANCELABLE`), or
    /// the worker answered a repeated cancel with the canceled task.
    NotCancelable,
    /// The worker does not know the task (`-32001` / 404).
    NotFound,
    /// Every attempt failed, or the worker refused for good (e.g. 401).
    Failed,
    /// Stopped between attempts: the store's outbox no longer holds the
    /// cancel for this replica (another replica claimed it, or the task
    /// settled).
    NotOwed,
}

impl CancelOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelOutcome::Canceled => "canceled",
            CancelOutcome::NotCancelable => "not_cancelable",
            CancelOutcome::NotFound => "not_found",
            CancelOutcome::Failed => "failed",
            CancelOutcome::NotOwed => "not_owed",
        }
    }

    /// The worker answered: the task no longer runs on the gateway's
    /// account.
    pub fn is_done(self) -> bool {
        matches!(
            self,
            CancelOutcome::Canceled | CancelOutcome::NotCancelable | CancelOutcome::NotFound
        )
    }
}

/// Settles the task's record as CANCELED when the worker accepted the
/// gateway's cancel: the record then shows what the worker holds (the
/// admin endpoint's `/tasks`) and is kept for the settled retention, not
/// the unsettled one. Other outcomes say nothing certain about the state
/// and leave the record as it is. A store error is counted and logged; the
/// record then keeps its last state until it expires.
pub async fn record_canceled(store: &dyn TaskStore, key: &TaskKey, outcome: CancelOutcome) {
    if outcome != CancelOutcome::Canceled {
        return;
    }
    let update = crate::store::TaskUpdate {
        state: Some(TaskState::Canceled),
        ..Default::default()
    };
    if let Err(e) = store.update(key, update, store.clock_ms()).await {
        metrics::STORE_ERRORS.with_label_values(&["update"]).inc();
        tracing::warn!(task = %key, error = %e, "could not record a cancelled task as CANCELED; its record keeps its last state until it expires");
    }
}

/// What one attempt learned.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Final(CancelOutcome),
    /// Worth another try (network error, 5xx, 429, timeout).
    Retry(String),
    /// Not worth another try (e.g. 401/403): the reason.
    Refused(String),
}

/// What the gateway asks a worker about a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call<'a> {
    Cancel,
    /// `GetTask`, to learn the state before a cancel ([`Canceller::task_state`]).
    Get,
    /// `GetTask` with the task's whole history ([`Canceller::history`]).
    History,
    /// One page of `ListTasks`, to find a child by its message
    /// ([`Canceller::find_by_message`]).
    List(&'a ListQuery),
}

/// One `ListTasks` page asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// `statusTimestampAfter` (Unix ms).
    pub since_ms: u64,
    /// `pageToken` (`""`: the first page).
    pub page_token: String,
}

/// How long before the send's start `ListTasks` looks for its child (by
/// status time): allows for the worker's clock being behind the
/// gateway's by that much.
pub const LIST_CLOCK_ALLOWANCE_MS: u64 = 60 * 1000;

/// The most `ListTasks` pages one search reads (100 tasks each): a worker
/// with more tasks whose status changed since the send began may hide
/// the child (counted as not found).
pub const LIST_MAX_PAGES: usize = 100;

/// How long a worker that refused a `ListTasks` is not searched again
/// (its blocking sends are carried meanwhile, where it streams).
const UNSEARCHABLE_FOR: Duration = Duration::from_secs(600);

/// Why a search by message found nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupError {
    /// The worker does not serve `ListTasks`.
    Refused(String),
    /// Any other failure (worth asking again).
    Failed(String),
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LookupError::Refused(e) => write!(f, "ListTasks refused: {e}"),
            LookupError::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// The longest answer to the gateway's own calls that is read whole (the
/// task, a cancel's answer too, may carry large artifacts and history). A
/// longer `GetTask` answer leaves the state unknown; a longer 2xx answer to
/// `CancelTask` counts as the cancelled task (no error is that long).
pub const ANSWER_CAP: usize = 4 << 20;

/// What a probe learned of a task's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probed {
    /// The worker's task is in this state.
    State(TaskState),
    /// The worker does not know the task (`-32001` / 404).
    NotFound,
    /// No answer that names a state (the reason is logged).
    Unknown,
}

/// Sends cancels. Cheap to clone; connections to workers are pooled.
#[derive(Clone)]
pub struct Canceller {
    /// The gateway's connections to workers, shared with the carrier.
    client: Arc<WorkerClient>,
    cfg: config::Cancel,
    connect_timeout: Duration,
    seq: Arc<AtomicU64>,
    addrs: Arc<WorkerAddrs>,
    /// Routes whose worker refused a `ListTasks`, and when.
    unsearchable: Arc<Mutex<HashMap<Arc<str>, Instant>>>,
    /// Searches by message, batched per worker, binding, tenant and
    /// headers ([`Canceller::find_by_message`]).
    scans: Arc<Mutex<HashMap<ScanKey, ScanState>>>,
    /// Told of every cancel's outcome (set once at start: the delegation
    /// tree follows the task's end to its children).
    on_canceled: Arc<std::sync::OnceLock<OnCanceled>>,
}

/// What a [`Canceller`] tells of each cancel it ended: the job and how.
pub type OnCanceled = Box<dyn Fn(&CancelJob, CancelOutcome) + Send + Sync>;

/// What one batch of searches by message shares: one `ListTasks` scan.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ScanKey {
    route: Arc<str>,
    worker: config::WorkerUrl,
    binding: Binding,
    path: String,
    tenant: Option<String>,
    headers: Vec<(String, String)>,
}

/// Whether a scan runs for a key, and the batch waiting for the next.
#[derive(Default)]
struct ScanState {
    running: bool,
    next: Option<Batch>,
}

/// The messages one scan looks for, each with who waits for its task.
struct Batch {
    /// The earliest `statusTimestampAfter` any of them needs.
    since_ms: u64,
    /// The trace context the scan's calls carry: its first search's span
    /// (none when traces are off).
    trace: Vec<(String, String)>,
    wanted: HashMap<String, Vec<Waiter>>,
}

/// Who waits for a search's answer.
type Waiter = tokio::sync::oneshot::Sender<Result<Option<String>, LookupError>>;

impl std::fmt::Debug for Canceller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Canceller").field("cfg", &self.cfg).finish()
    }
}

impl Canceller {
    /// `addrs`: the workers' addresses, shared with the proxy.
    pub fn new(cfg: config::Cancel, connect_timeout: Duration, addrs: Arc<WorkerAddrs>) -> Self {
        Canceller {
            client: Arc::default(),
            cfg,
            connect_timeout,
            seq: Arc::new(AtomicU64::new(1)),
            addrs,
            unsearchable: Arc::default(),
            scans: Arc::default(),
            on_canceled: Arc::default(),
        }
    }

    /// The gateway's connections to workers (the carrier shares them).
    pub fn client(&self) -> Arc<WorkerClient> {
        self.client.clone()
    }

    /// Every clone of this canceller calls `f` with each job and how its
    /// cancel ended (set once, at start; later calls do nothing).
    pub fn on_canceled(&self, f: OnCanceled) {
        let _ = self.on_canceled.set(f);
    }

    /// Whether the route's worker may be searched by message: it has not
    /// refused a `ListTasks` in the last [`UNSEARCHABLE_FOR`].
    pub fn searchable(&self, route: &str) -> bool {
        let mut m = self.unsearchable.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(route) {
            Some(at) if at.elapsed() < UNSEARCHABLE_FOR => false,
            Some(_) => {
                m.remove(route);
                true
            }
            None => true,
        }
    }

    /// The route's worker refused a `ListTasks`: not searched again for
    /// [`UNSEARCHABLE_FOR`].
    fn mark_unsearchable(&self, route: &Arc<str>) {
        let mut m = self.unsearchable.lock().unwrap_or_else(|p| p.into_inner());
        if m.insert(route.clone(), Instant::now()).is_none() {
            tracing::warn!(route = %route, "the worker refused ListTasks: a blocking send's child cannot be found by its message; such sends are carried as streams where the worker streams, for the next {UNSEARCHABLE_FOR:?}");
        }
    }

    /// The longest a [`Canceller::cancel`] can take: every attempt timing
    /// out, with every backoff between them.
    pub fn longest(&self) -> Duration {
        let mut total = self.cfg.timeout * self.cfg.attempts;
        let mut delay = self.cfg.backoff;
        for _ in 1..self.cfg.attempts {
            total += delay;
            delay = (delay * 2).min(self.cfg.backoff_max);
        }
        total
    }

    /// Cancels with retries and backoff; logs and counts the outcome.
    pub async fn cancel(&self, job: &CancelJob) -> CancelOutcome {
        self.cancel_while(job, || std::future::ready(true)).await
    }

    /// Delivers a cancel the store's outbox holds for this replica with
    /// `token` (`None`: the outbox could not be written; sent all the
    /// same): [`Canceller::cancel`], asking the store before each retry
    /// whether the outbox still holds it with `token` (another replica may
    /// have claimed it, taking this one for dead, or the task settled), so
    /// that it is not sent from two places. Then the outbox follows the
    /// outcome: the worker answered, the entry is removed and the task's
    /// lease ended with it; every attempt failed, it is handed back to be
    /// claimed [`RETRY_FAILED_CANCEL`] later by any replica
    /// with the route. Without a token a failed cancel leaves the task's
    /// lease, if it has one, to the reaper, as before the outbox.
    ///
    /// Store calls: none before the first attempt, one before each retry,
    /// one after the outcome.
    pub async fn deliver(
        &self,
        store: &dyn TaskStore,
        job: &CancelJob,
        token: Option<&str>,
    ) -> CancelOutcome {
        let owned = || async {
            let Some(token) = token else { return true };
            match store.outbox_owns(&job.key, token).await {
                Ok(owned) => owned,
                Err(e) => {
                    // Better a cancel sent twice than one not sent.
                    metrics::STORE_ERRORS
                        .with_label_values(&["outbox_owns"])
                        .inc();
                    tracing::warn!(task = %job.key, error = %e, "could not check the outbox before a retry; retrying");
                    true
                }
            }
        };
        let outcome = self.cancel_while(job, owned).await;
        if outcome.is_done() {
            record_canceled(store, &job.key, outcome).await;
            if let Err(e) = store.outbox_done(&job.key).await {
                metrics::STORE_ERRORS
                    .with_label_values(&["outbox_done"])
                    .inc();
                tracing::warn!(task = %job.key, error = %e, "could not remove a delivered cancel from the outbox; a replica that claims it sends it again (answered as not cancelable)");
            }
        } else if let (CancelOutcome::Failed, Some(token)) = (outcome, token) {
            let at = store.clock_ms() + RETRY_FAILED_CANCEL.as_millis() as u64;
            match store.outbox_retry(&job.key, token, at).await {
                Ok(true) => {
                    tracing::info!(task = %job.key, "owed cancel handed back; it is tried again in {:?}", RETRY_FAILED_CANCEL);
                }
                Ok(false) => {}
                Err(e) => {
                    metrics::STORE_ERRORS
                        .with_label_values(&["outbox_retry"])
                        .inc();
                    tracing::warn!(task = %job.key, error = %e, "could not hand back a failed cancel; it is claimed again once this replica is gone");
                }
            }
        }
        outcome
    }

    /// [`Canceller::cancel`], stopping before a retry when `still_owed`
    /// says the cancel is no longer this replica's to send
    /// ([`CancelOutcome::NotOwed`]).
    pub async fn cancel_while<F, Fut>(&self, job: &CancelJob, still_owed: F) -> CancelOutcome
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        self.run(job, still_owed).await.0
    }

    /// [`Canceller::cancel`], and why it failed (the last attempt's error)
    /// when it did: for the admin endpoint's `POST /tasks/{id}:cancel`.
    pub async fn cancel_reporting(&self, job: &CancelJob) -> (CancelOutcome, Option<String>) {
        let (outcome, last_err) = self.run(job, || std::future::ready(true)).await;
        (
            outcome,
            (outcome == CancelOutcome::Failed).then_some(last_err),
        )
    }

    /// [`Canceller::cancel_while`] and the last attempt's error.
    async fn run<F, Fut>(&self, job: &CancelJob, mut still_owed: F) -> (CancelOutcome, String)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let started = Instant::now();
        let route = &*job.key.route;
        let mut span = crate::trace::client_for(
            "CancelTask",
            &job.key,
            job.message_id.as_deref(),
            job.cause,
            &job.worker,
        );
        let trace = span.as_ref().map(crate::trace::ClientSpan::headers);
        let trace = trace.as_deref().unwrap_or_default();
        let mut attempts = 0;
        let mut delay = self.cfg.backoff;
        let mut outcome = CancelOutcome::Failed;
        let mut last_err = String::new();
        for attempt in 1..=self.cfg.attempts {
            metrics::CANCEL_ATTEMPTS.with_label_values(&[route]).inc();
            attempts = attempt;
            let res = tokio::time::timeout(self.cfg.timeout, self.attempt(job, trace)).await;
            match res {
                Ok(Attempt::Final(o)) => {
                    outcome = o;
                    break;
                }
                Ok(Attempt::Refused(e)) => {
                    last_err = e;
                    break;
                }
                Ok(Attempt::Retry(e)) => last_err = e,
                Err(_) => last_err = format!("timed out after {:?}", self.cfg.timeout),
            }
            if attempt < self.cfg.attempts {
                tracing::debug!(task = %job.key, attempt, error = %last_err, "CancelTask failed; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(self.cfg.backoff_max);
                if !still_owed().await {
                    outcome = CancelOutcome::NotOwed;
                    break;
                }
            }
        }
        let elapsed = started.elapsed();
        if let Some(span) = &mut span {
            span.count("a2a.attempts", u64::from(attempts));
            let failed = (outcome == CancelOutcome::Failed).then_some(last_err.as_str());
            span.outcome(outcome.as_str(), failed);
        }
        metrics::CANCEL_LATENCY
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
        metrics::CANCELS
            .with_label_values(&[route, job.cause, outcome.as_str()])
            .inc();
        if let Some(f) = self.on_canceled.get() {
            f(job, outcome);
        }
        if outcome.is_done() {
            tracing::info!(task = %job.key, cause = job.cause, outcome = outcome.as_str(), ms = elapsed.as_millis() as u64, "CancelTask sent");
        } else if outcome == CancelOutcome::NotOwed {
            tracing::info!(task = %job.key, cause = job.cause, error = %last_err, "CancelTask no longer owed here (claimed by another replica, or the task settled); stopped retrying");
        } else {
            tracing::warn!(task = %job.key, cause = job.cause, error = %last_err, "CancelTask failed; the child may still be running");
            if last_err.starts_with("connect") {
                // Its worker (replica) did not take a connection past the
                // retries: the task is lost with it (counted once).
                crate::replicas::lost(&job.key, Some(&job.worker.authority()));
            }
        }
        (outcome, last_err)
    }

    /// One `GetTask` for the job's task (`call`: [`Call::Get`], or
    /// [`Call::History`] with its whole history), one attempt within the
    /// cancel timeout, in the cancel's binding, tenant and headers, in its
    /// own client span: what it found, the answer (empty when none came)
    /// and why no state was read.
    async fn get_task(&self, job: &CancelJob, call: Call<'_>) -> (Probed, Vec<u8>, String) {
        let mut span = crate::trace::client_for(
            "GetTask",
            &job.key,
            job.message_id.as_deref(),
            job.cause,
            &job.worker,
        );
        let trace = span.as_ref().map(crate::trace::ClientSpan::headers);
        let trace = trace.as_deref().unwrap_or_default();
        let res = tokio::time::timeout(self.cfg.timeout, self.send(job, call, trace)).await;
        let (probed, body, why) = match res {
            Ok(Ok((status, body))) => {
                let (probed, why) = read_task_state(job.target.binding, status, &body);
                (probed, body, why)
            }
            Ok(Err(Attempt::Retry(e) | Attempt::Refused(e))) => (Probed::Unknown, Vec::new(), e),
            Ok(Err(Attempt::Final(_))) => (Probed::Unknown, Vec::new(), String::new()),
            Err(_) => (
                Probed::Unknown,
                Vec::new(),
                format!("timed out after {:?}", self.cfg.timeout),
            ),
        };
        if let Some(span) = &mut span {
            match probed {
                Probed::State(s) => span.outcome(s.as_wire(), None),
                Probed::NotFound => span.outcome("not_found", None),
                Probed::Unknown => span.outcome("failed", Some(&why)),
            }
        }
        (probed, body, why)
    }

    /// Asks the worker for the job's task state (`GetTask`): before
    /// cancelling a task whose state the gateway could not see, so that one
    /// handed back (input-required, auth-required) or already finished is
    /// left alone. Logged and counted.
    pub async fn task_state(&self, job: &CancelJob) -> Probed {
        let (probed, _, why) = self.get_task(job, Call::Get).await;
        let label = match probed {
            Probed::State(s) if s.is_settled() => "settled",
            Probed::State(_) => "unsettled",
            Probed::NotFound => "not_found",
            Probed::Unknown => "failed",
        };
        metrics::CANCEL_PROBES
            .with_label_values(&[&*job.key.route, label])
            .inc();
        match probed {
            Probed::State(s) => {
                tracing::debug!(task = %job.key, state = s.as_wire(), "GetTask before CancelTask");
            }
            Probed::NotFound => {
                tracing::debug!(task = %job.key, "GetTask before CancelTask: the worker does not know the task");
            }
            Probed::Unknown => {
                tracing::warn!(task = %job.key, error = %why, "GetTask before CancelTask failed; cancelling");
            }
        }
        probed
    }

    /// The task's state and the ids of the messages in its history (at
    /// most [`HISTORY_READ`], the first): one `GetTask` with the whole
    /// history. What a delegation tree needs of a parent it saw end
    /// without the request that started it ([`crate::tree`]).
    pub async fn history(&self, job: &CancelJob) -> (Probed, Vec<String>) {
        let (probed, body, why) = self.get_task(job, Call::History).await;
        if probed == Probed::Unknown {
            tracing::warn!(task = %job.key, error = %why, "GetTask for a task's history failed");
        }
        (probed, read_history(job.target.binding, &body))
    }

    /// The task a send started, found by its message: `ListTasks` of the
    /// tasks whose status changed since `sent_ms` (less
    /// [`LIST_CLOCK_ALLOWANCE_MS`]), page after page to the end (at most
    /// [`LIST_MAX_PAGES`]), each within the cancel timeout, in the cancel's
    /// binding, tenant and headers; the task whose history holds
    /// `message_id`. `Ok(None)`: not (yet) there. Searches of one worker,
    /// binding, tenant and headers are batched: while one scan runs, the
    /// messages asked for meanwhile wait for the next, which looks for all
    /// of them at once (many callers leaving together cost the worker one
    /// scan at a time, not one each). A worker that refuses the call is not
    /// searched again for a while ([`Self::searchable`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn find_by_message(
        &self,
        worker: &config::WorkerUrl,
        target: &CancelTarget,
        route: &Arc<str>,
        tenant: Option<&str>,
        headers: &[(String, String)],
        message_id: &str,
        sent_ms: u64,
    ) -> Result<Option<String>, LookupError> {
        let by_message = TaskKey::new(route, tenant, message_id);
        let mut span = crate::trace::client("ListTasks", &by_message, true, "find", worker);
        let key = ScanKey {
            route: route.clone(),
            worker: worker.clone(),
            binding: target.binding,
            path: target.path.clone(),
            tenant: tenant.map(str::to_owned),
            headers: headers.to_vec(),
        };
        let since_ms = sent_ms.saturating_sub(LIST_CLOCK_ALLOWANCE_MS);
        let trace = span.as_ref().map(crate::trace::ClientSpan::headers);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let lead = {
            let mut scans = self.scans.lock().unwrap_or_else(|p| p.into_inner());
            let state = scans.entry(key.clone()).or_default();
            let next = state.next.get_or_insert_with(|| Batch {
                since_ms,
                trace: trace.unwrap_or_default(),
                wanted: HashMap::new(),
            });
            next.since_ms = next.since_ms.min(since_ms);
            next.wanted
                .entry(message_id.to_owned())
                .or_default()
                .push(tx);
            !std::mem::replace(&mut state.running, true)
        };
        if lead {
            let me = self.clone();
            tokio::spawn(async move { me.run_scans(key).await });
        }
        let found = rx
            .await
            .unwrap_or_else(|_| Err(LookupError::Failed("the scan ended unanswered".into())));
        if let Err(LookupError::Refused(_)) = &found {
            self.mark_unsearchable(route);
        }
        if let Some(span) = &mut span {
            match &found {
                Ok(Some(id)) => {
                    span.outcome("found", None);
                    crate::trace::found_by_message(
                        &by_message,
                        &TaskKey::new(route, tenant, id.as_str()),
                    );
                }
                Ok(None) => span.outcome("not_found", None),
                Err(e) => span.outcome("failed", Some(&e.to_string())),
            }
        }
        found
    }

    /// [`Canceller::find_by_message`] asked every 100 ms until the task
    /// shows up, the worker refuses the call, or `wait` has passed (the
    /// send may not have reached the worker yet): the task's id, `None`, or
    /// why the worker refused; and how many times it asked. A failed
    /// search is asked again (logged at debug).
    #[allow(clippy::too_many_arguments)]
    pub async fn wait_for_message(
        &self,
        worker: &config::WorkerUrl,
        target: &CancelTarget,
        route: &Arc<str>,
        tenant: Option<&str>,
        headers: &[(String, String)],
        message_id: &str,
        sent_ms: u64,
        wait: Duration,
    ) -> (Result<Option<String>, String>, u32) {
        let until = tokio::time::Instant::now() + wait;
        let mut asked = 0u32;
        loop {
            asked += 1;
            match self
                .find_by_message(worker, target, route, tenant, headers, message_id, sent_ms)
                .await
            {
                Ok(Some(id)) => return (Ok(Some(id)), asked),
                Ok(None) => {}
                Err(LookupError::Refused(e)) => return (Err(e), asked),
                Err(LookupError::Failed(e)) => {
                    tracing::debug!(route = %route, error = %e, "ListTasks to find a task by its message failed");
                }
            }
            if tokio::time::Instant::now() + Duration::from_millis(100) > until {
                return (Ok(None), asked);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `key`'s batches one after another until none is waiting.
    async fn run_scans(&self, key: ScanKey) {
        loop {
            let batch = {
                let mut scans = self.scans.lock().unwrap_or_else(|p| p.into_inner());
                let Some(state) = scans.get_mut(&key) else {
                    return;
                };
                match state.next.take() {
                    Some(b) => b,
                    None => {
                        scans.remove(&key);
                        return;
                    }
                }
            };
            // A scan that panicked must not leave the key marked running
            // (every later search of it would wait forever): the key is
            // dropped, and with it the next batch's waiters, who see the
            // search failed.
            let scanned = std::panic::AssertUnwindSafe(self.scan(&key, batch));
            if futures_util::FutureExt::catch_unwind(scanned)
                .await
                .is_err()
            {
                tracing::error!(route = %key.route, "a ListTasks scan panicked");
                self.scans
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
                return;
            }
        }
    }

    /// One scan: `ListTasks` pages until every wanted message is found, the
    /// last page, or [`LIST_MAX_PAGES`]; each waiter answered as soon as its
    /// task shows up, the rest at the end.
    async fn scan(&self, key: &ScanKey, mut batch: Batch) {
        let job = CancelJob {
            key: TaskKey::new(&key.route, key.tenant.as_deref(), ""),
            worker: key.worker.clone(),
            target: CancelTarget {
                binding: key.binding,
                path: key.path.clone(),
            },
            headers: key.headers.clone(),
            cause: "find",
            message_id: None,
        };
        let outcome = self.list_pages(&job, &mut batch).await;
        for (_, waiters) in batch.wanted {
            for w in waiters {
                let _ = w.send(match &outcome {
                    Ok(()) => Ok(None),
                    Err(e) => Err(e.clone()),
                });
            }
        }
    }

    /// [`Self::scan`]'s pages; found messages leave `batch.wanted`,
    /// answered.
    async fn list_pages(&self, job: &CancelJob, batch: &mut Batch) -> Result<(), LookupError> {
        let binding = job.target.binding;
        let trace = std::mem::take(&mut batch.trace);
        let mut query = ListQuery {
            since_ms: batch.since_ms,
            page_token: String::new(),
        };
        let pages = metrics::LOOKUP_PAGES.with_label_values(&[&job.key.route]);
        for _ in 0..LIST_MAX_PAGES {
            pages.inc();
            let answer =
                tokio::time::timeout(self.cfg.timeout, self.send(job, Call::List(&query), &trace))
                    .await;
            let (status, body) = match answer {
                Ok(Ok(a)) => a,
                Ok(Err(Attempt::Retry(e) | Attempt::Refused(e))) => {
                    return Err(LookupError::Failed(e))
                }
                Ok(Err(Attempt::Final(_))) => return Err(LookupError::Failed("no answer".into())),
                Err(_) => {
                    return Err(LookupError::Failed(format!(
                        "timed out after {:?}",
                        self.cfg.timeout
                    )))
                }
            };
            let page = read_list(binding, status, &body, &batch.wanted)?;
            for (message_id, task_id) in page.found {
                for w in batch.wanted.remove(&message_id).unwrap_or_default() {
                    let _ = w.send(Ok(Some(task_id.clone())));
                }
            }
            if batch.wanted.is_empty() {
                return Ok(());
            }
            match page.next {
                // A token that does not move on would loop: the end.
                Some(next) if next != query.page_token => query.page_token = next,
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// The path and JSON body of `call` for the job's task (REST `GetTask`:
    /// the body is unused).
    fn request(&self, job: &CancelJob, call: Call<'_>) -> (String, Value) {
        let id = &*job.key.task_id;
        let tenant = job.key.tenant();
        match job.target.binding {
            Binding::JsonRpc | Binding::WebSocket => {
                let mut params = json!({ "id": id });
                if let Some(t) = tenant {
                    params["tenant"] = json!(t);
                }
                let (method, tag) = match call {
                    Call::Cancel => ("CancelTask", "cancel"),
                    Call::Get => {
                        params["historyLength"] = json!(0);
                        ("GetTask", "probe")
                    }
                    Call::History => ("GetTask", "history"),
                    Call::List(q) => {
                        params = json!({
                            "pageSize": 100,
                            "historyLength": 100,
                            "statusTimestampAfter": rfc3339(q.since_ms),
                        });
                        if !q.page_token.is_empty() {
                            params["pageToken"] = json!(q.page_token);
                        }
                        if let Some(t) = tenant {
                            params["tenant"] = json!(t);
                        }
                        ("ListTasks", "list")
                    }
                };
                let n = self.seq.fetch_add(1, Ordering::Relaxed);
                let body = json!({
                    "jsonrpc": "2.0",
                    "id": format!("a2a-gateway-{tag}-{n}"),
                    "method": method,
                    "params": params,
                });
                let path = if job.target.path.is_empty() {
                    "/".to_string()
                } else {
                    job.target.path.clone()
                };
                (path, body)
            }
            Binding::Grpc => unreachable!("send_grpc builds its own requests"),
            Binding::Rest => {
                let mut path = job.target.path.trim_end_matches('/').to_string();
                let mut body = json!({});
                if let Some(t) = tenant {
                    path.push('/');
                    path.push_str(&percent_encode_segment(t));
                    body["tenant"] = json!(t);
                }
                if let Call::List(q) = call {
                    path.push_str("/tasks?pageSize=100&historyLength=100&statusTimestampAfter=");
                    path.push_str(&rfc3339(q.since_ms));
                    if !q.page_token.is_empty() {
                        path.push_str("&pageToken=");
                        path.push_str(&percent_encode_segment(&q.page_token));
                    }
                    return (path, body);
                }
                path.push_str("/tasks/");
                path.push_str(&percent_encode_segment(id));
                path.push_str(match call {
                    Call::Cancel => ":cancel",
                    Call::Get => "?historyLength=0",
                    Call::History => "",
                    Call::List(_) => unreachable!("returned above"),
                });
                (path, body)
            }
        }
    }

    /// The worker's shared address and a peer for it as the proxy builds
    /// one (TLS settings included), with the cancel's connect timeout. `Err`:
    /// the worker's name has no address yet.
    async fn peer(&self, w: &config::WorkerUrl) -> Result<(Arc<WorkerAddr>, HttpPeer), String> {
        let worker_addr = self.addrs.get(w);
        let addr = worker_addr.get().await?;
        let mut peer = worker_addr.peer(addr, w.tls);
        peer.options.connection_timeout = Some(self.connect_timeout);
        Ok((worker_addr, peer))
    }

    async fn attempt(&self, job: &CancelJob, trace: &[(String, String)]) -> Attempt {
        match self.send(job, Call::Cancel, trace).await {
            Ok((status, body)) => judge(job.target.binding, status, &body),
            Err(ended) => ended,
        }
    }

    /// Sends `call` for the job's task in the binding the caller used and
    /// returns the answer's status and body (a WebSocket answer as 200 and
    /// its text frame). `trace`: the call's `traceparent` (none when traces
    /// are off). `Err`: the attempt's failure, or (a cancel answered at
    /// length) its `Final` outcome.
    async fn send(
        &self,
        job: &CancelJob,
        call: Call<'_>,
        trace: &[(String, String)],
    ) -> Result<(u16, Vec<u8>), Attempt> {
        if job.target.binding == Binding::WebSocket {
            return self
                .send_ws(job, call, trace)
                .await
                .map(|frame| (200, frame));
        }
        if job.target.binding == Binding::Grpc {
            return self.send_grpc(job, call, trace).await;
        }
        let (path, body) = self.request(job, call);
        let (method, body) = match call {
            Call::Get | Call::History | Call::List(_) if job.target.binding == Binding::Rest => {
                ("GET", None)
            }
            _ => ("POST", Some(Bytes::from(body.to_string()))),
        };
        let (worker_addr, mut peer) = self.peer(&job.worker).await.map_err(Attempt::Retry)?;
        peer.options.read_timeout = Some(self.cfg.timeout);
        peer.options.write_timeout = Some(self.cfg.timeout);

        let len = body.as_ref().map(|b| b.len().to_string());
        let mut headers = vec![("host", worker_addr.authority()), ("a2a-version", "1.0")];
        if let Some(len) = &len {
            headers.push(("content-type", "application/json"));
            headers.push(("content-length", len));
        }
        let mut session = self
            .open(&peer, method, &path, &headers, job, trace, body)
            .await?;
        let status = session.response_header().map_or(0, |h| h.status.as_u16());
        let cap = ANSWER_CAP;
        let mut resp = Vec::new();
        let mut whole = true;
        loop {
            match session.read_response_body().await {
                Ok(Some(chunk)) => {
                    if whole && resp.len() + chunk.len() <= cap {
                        resp.extend_from_slice(&chunk);
                    } else {
                        whole = false;
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(Attempt::Retry(format!("read body: {e}"))),
            }
        }
        self.client
            .release(session, &peer, Duration::from_secs(30))
            .await;
        if !whole {
            return match call {
                Call::Get | Call::History | Call::List(_) => {
                    Err(Attempt::Refused(format!("answer over {cap} bytes")))
                }
                // No error answer is that long: it is the cancelled task.
                Call::Cancel if (200..300).contains(&status) => {
                    Err(Attempt::Final(CancelOutcome::Canceled))
                }
                Call::Cancel => Ok((status, resp)),
            };
        }
        Ok((status, resp))
    }
}

impl Canceller {
    /// Sends one request of the gateway's own to the worker: `method` and
    /// `path` with the `headers` its binding needs, then the job's headers
    /// (the caller's credentials, the route's), then `trace`'s; the body,
    /// if any; and reads the answer's head. The session, to read the rest.
    #[allow(clippy::too_many_arguments)]
    async fn open(
        &self,
        peer: &HttpPeer,
        method: &str,
        path: &str,
        headers: &[(&'static str, &str)],
        job: &CancelJob,
        trace: &[(String, String)],
        body: Option<Bytes>,
    ) -> Result<pingora::protocols::http::client::HttpSession, Attempt> {
        let mut req = RequestHeader::build(method, path.as_bytes(), None)
            .map_err(|e| Attempt::Refused(format!("bad path {path}: {e}")))?;
        for (k, v) in headers {
            if req.insert_header(*k, *v).is_err() {
                return Err(Attempt::Refused(format!("bad header {k}")));
            }
        }
        for (k, v) in &job.headers {
            if req.append_header(k.clone(), v.as_str()).is_err() {
                return Err(Attempt::Refused(format!("{k}: not a valid header value")));
            }
        }
        for (k, v) in trace {
            let _ = req.insert_header(k.clone(), v.as_str());
        }
        let (mut session, _reused) = self
            .client
            .session(peer)
            .await
            .map_err(|e| Attempt::Retry(format!("connect: {e}")))?;
        session
            .write_request_header(Box::new(req))
            .await
            .map_err(|e| Attempt::Retry(format!("write: {e}")))?;
        if let Some(body) = body {
            session
                .write_request_body(body, true)
                .await
                .map_err(|e| Attempt::Retry(format!("write body: {e}")))?;
        }
        session
            .finish_request_body()
            .await
            .map_err(|e| Attempt::Retry(format!("finish body: {e}")))?;
        session
            .read_response_header()
            .await
            .map_err(|e| Attempt::Retry(format!("read: {e}")))?;
        Ok(session)
    }

    /// [`Canceller::send`] over gRPC: `CancelTask` or `GetTask` of the job's
    /// task (its tenant in the request's `tenant` field, the caller's
    /// headers as metadata) on an HTTP/2 connection to the worker (h2c, or
    /// TLS with ALPN `h2`). The answer's `grpc-status` (from the trailers,
    /// or the head of a trailers-only answer) is returned as the HTTP
    /// status the judgement reads ([`crate::a2a::grpc::http_status`]), with
    /// the framed answer.
    async fn send_grpc(
        &self,
        job: &CancelJob,
        call: Call<'_>,
        trace: &[(String, String)],
    ) -> Result<(u16, Vec<u8>), Attempt> {
        use crate::a2a::grpc;
        let tenant = job.key.tenant();
        let (method, body) = match call {
            Call::Cancel => (
                "CancelTask",
                grpc::task_request(tenant, &job.key.task_id, None),
            ),
            Call::Get => (
                "GetTask",
                grpc::task_request(tenant, &job.key.task_id, Some(0)),
            ),
            Call::History => (
                "GetTask",
                grpc::task_request(tenant, &job.key.task_id, None),
            ),
            Call::List(q) => (
                "ListTasks",
                grpc::list_request(tenant, q.since_ms, &q.page_token),
            ),
        };
        let path = format!("{}{method}", grpc::SERVICE_PREFIX);
        let (worker_addr, mut peer) = self.peer(&job.worker).await.map_err(Attempt::Retry)?;
        peer.options.set_http_version(2, 2);
        peer.options.read_timeout = Some(self.cfg.timeout);
        peer.options.write_timeout = Some(self.cfg.timeout);
        let headers = [
            ("host", worker_addr.authority()),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("a2a-version", "1.0"),
        ];
        let mut session = self
            .open(
                &peer,
                "POST",
                &path,
                &headers,
                job,
                trace,
                Some(Bytes::from(body)),
            )
            .await?;
        let head = session.response_header().cloned();
        let http = head.as_ref().map_or(0, |h| h.status.as_u16());
        let mut resp = Vec::new();
        loop {
            match session.read_response_body().await {
                Ok(Some(chunk)) => {
                    if resp.len() + chunk.len() > ANSWER_CAP {
                        return Err(Attempt::Refused(format!("answer over {ANSWER_CAP} bytes")));
                    }
                    resp.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => return Err(Attempt::Retry(format!("read body: {e}"))),
            }
        }
        let trailers = match &mut session {
            pingora::protocols::http::client::HttpSession::H2(h2) => h2
                .read_trailers()
                .await
                .map_err(|e| Attempt::Retry(format!("read trailers: {e}")))?,
            _ => None,
        };
        let grpc_status = |h: &http::HeaderMap| {
            h.get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u32>().ok())
        };
        let status = trailers
            .as_ref()
            .and_then(grpc_status)
            .or_else(|| head.as_ref().and_then(|h| grpc_status(&h.headers)));
        let message = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-message"))
            .or_else(|| head.as_ref().and_then(|h| h.headers.get("grpc-message")))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.client
            .release(session, &peer, Duration::from_secs(30))
            .await;
        match status {
            Some(0) => Ok((200, resp)),
            Some(code) => Ok((
                grpc::http_status(code),
                format!("grpc-status {code}: {message}").into_bytes(),
            )),
            None if http != 200 => Ok((http, resp)),
            None => Err(Attempt::Retry("no grpc-status in the answer".to_string())),
        }
    }

    /// `call` over a2a-rust's WebSocket binding: a fresh socket to the path
    /// the caller upgraded on (`wss://` for an `https` worker), one JSON-RPC
    /// text frame; returns the answer with the same id. (The caller's socket
    /// is gone by the time a cancel is owed.)
    async fn send_ws(
        &self,
        job: &CancelJob,
        call: Call<'_>,
        trace: &[(String, String)],
    ) -> Result<Vec<u8>, Attempt> {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
        use tokio_tungstenite::tungstenite::Message;

        let (path, body) = self.request(job, call);
        let w = &job.worker;
        let scheme = if w.tls { "wss" } else { "ws" };
        let url = format!("{scheme}://{}{}", w.authority(), path);
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| Attempt::Refused(format!("bad WebSocket URL {url}: {e}")))?;
        req.headers_mut()
            .insert("a2a-version", http::HeaderValue::from_static("1.0"));
        for (k, v) in job.headers.iter().chain(trace) {
            let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(k.as_bytes()),
                http::HeaderValue::from_str(v),
            ) else {
                return Err(Attempt::Refused(format!("{k}: not a valid header")));
            };
            req.headers_mut().append(name, value);
        }
        // The connection as the proxy makes it (TLS with the worker's
        // `worker_ca` and client certificate for wss://); the upgrade over
        // it is tungstenite's.
        let (_, peer) = self.peer(w).await.map_err(Attempt::Retry)?;
        // A cancel's answer (the cancelled task) is read whole, up to
        // tungstenite's own limits; a probe's up to its cap.
        let limits = match call {
            Call::Get | Call::History | Call::List(_) => WebSocketConfig::default()
                .max_message_size(Some(ANSWER_CAP))
                .max_frame_size(Some(ANSWER_CAP)),
            Call::Cancel => WebSocketConfig::default(),
        };
        let connect = async {
            let stream = self
                .client
                .transport()
                .new_stream(&peer)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            tokio_tungstenite::client_async_with_config(req, stream, Some(limits))
                .await
                .map_err(|e| format!("WebSocket upgrade: {e}"))
        };
        let mut ws = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(e)) => return Err(Attempt::Retry(e)),
            Err(_) => return Err(Attempt::Retry("WebSocket connect timed out".into())),
        };
        let id = body["id"].clone();
        if let Err(e) = ws.send(Message::text(body.to_string())).await {
            return Err(Attempt::Retry(format!("WebSocket send: {e}")));
        }
        let answer = loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                    if v["id"] == id {
                        break Ok(t.as_bytes().to_vec());
                    }
                }
                Some(Ok(Message::Close(_))) | None => {
                    break Err(Attempt::Retry("WebSocket closed before the answer".into()))
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => break Err(Attempt::Retry(format!("WebSocket read: {e}"))),
            }
        };
        let _ = ws.close(None).await;
        answer
    }
}

/// Reads a worker's answer to `GetTask`; the string says why there is no
/// state.
fn read_task_state(binding: Binding, status: u16, body: &[u8]) -> (Probed, String) {
    let brief = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    if status == 404 {
        return (Probed::NotFound, String::new());
    }
    if !(200..300).contains(&status) {
        return (Probed::Unknown, format!("HTTP {status}: {}", brief()));
    }
    // REST answers a bare Task, JSON-RPC `{"result": Task}`: `observe`
    // reads both.
    match observe::observe(binding, body).map(|o| (o.state, o.error)) {
        Some((Some(state), _)) => (Probed::State(state), String::new()),
        Some((None, true)) => {
            let v: Option<Value> = serde_json::from_slice(body).ok();
            match v.as_ref().and_then(|v| v["error"]["code"].as_i64()) {
                Some(-32001) => (Probed::NotFound, String::new()),
                _ => (Probed::Unknown, format!("error: {}", brief())),
            }
        }
        _ => (Probed::Unknown, format!("no task state in: {}", brief())),
    }
}

/// The most message ids read from a task's history.
pub const HISTORY_READ: usize = 64;

/// A `Task`'s history as far as delegation needs it (gRPC: field 5, each
/// `Message`'s `message_id`, field 1; prost skips the rest).
#[derive(Clone, PartialEq, prost::Message)]
struct PbHistory {
    #[prost(message, repeated, tag = "5")]
    history: Vec<PbMessageId>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PbMessageId {
    #[prost(string, tag = "1")]
    message_id: String,
}

/// The message ids of a `GetTask` answer's history, in order (at most
/// [`HISTORY_READ`]); none when the answer holds no task.
fn read_history(binding: Binding, body: &[u8]) -> Vec<String> {
    if binding == Binding::Grpc {
        use prost::Message as _;
        return crate::a2a::grpc::single_message(body)
            .and_then(|m| PbHistory::decode(m).ok())
            .map(|t| {
                t.history
                    .into_iter()
                    .map(|m| m.message_id)
                    .filter(|m| !m.is_empty())
                    .take(HISTORY_READ)
                    .collect()
            })
            .unwrap_or_default();
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let task = match binding {
        Binding::Rest => &v,
        _ => &v["result"],
    };
    task["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["messageId"].as_str())
        .take(HISTORY_READ)
        .map(str::to_owned)
        .collect()
}

/// Reads a worker's answer to `CancelTask`.
fn judge(binding: Binding, status: u16, body: &[u8]) -> Attempt {
    let v: Option<Value> = serde_json::from_slice(body).ok();
    let reason = || {
        v.as_ref()
            .and_then(|v| v["error"]["details"].as_array())
            .and_then(|d| d.iter().find_map(|e| e["reason"].as_str()))
            .unwrap_or("")
            .to_string()
    };
    let brief = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    match binding {
        Binding::JsonRpc | Binding::WebSocket if status == 200 => {
            let Some(v) = v else {
                return Attempt::Retry(format!("HTTP 200 with a non-JSON body: {}", brief()));
            };
            if v.get("result").is_some() {
                return Attempt::Final(CancelOutcome::Canceled);
            }
            match v["error"]["code"].as_i64() {
                Some(-32002) => Attempt::Final(CancelOutcome::NotCancelable),
                Some(-32001) => Attempt::Final(CancelOutcome::NotFound),
                Some(-32603) => Attempt::Retry(format!("internal error: {}", v["error"])),
                Some(_) => Attempt::Refused(format!("error {}", v["error"])),
                None => Attempt::Retry(format!("no result and no error: {}", brief())),
            }
        }
        Binding::Rest | Binding::Grpc if (200..300).contains(&status) => {
            Attempt::Final(CancelOutcome::Canceled)
        }
        _ if status == 404 => Attempt::Final(CancelOutcome::NotFound),
        _ if status == 409 => Attempt::Final(CancelOutcome::NotCancelable),
        _ if status == 400 && reason() == "TASK_NOT_CANCELABLE" => {
            Attempt::Final(CancelOutcome::NotCancelable)
        }
        _ if status == 429 || status == 408 || status >= 500 => {
            Attempt::Retry(format!("HTTP {status}: {}", brief()))
        }
        _ => Attempt::Refused(format!("HTTP {status}: {}", brief())),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_the_task_holding_a_message() {
        use super::{read_list, Binding, ListPage, LookupError};
        let rpc = br#"{"jsonrpc":"2.0","id":"l","result":{"tasks":[{"id":"a","history":[{"messageId":"m0"}]},{"id":"b"},{"id":"c","history":[{"messageId":"x"},{"messageId":"m1"}]}],"nextPageToken":"n2"}}"#;
        let wanted = |ids: &[&str]| -> std::collections::HashMap<String, ()> {
            ids.iter().map(|m| (m.to_string(), ())).collect()
        };
        let page = |found: &[(&str, &str)], next: Option<&str>| {
            Some(ListPage {
                found: found
                    .iter()
                    .map(|(m, t)| (m.to_string(), t.to_string()))
                    .collect(),
                next: next.map(str::to_owned),
            })
        };
        // A page, or none (`None`) for an answer that is no page.
        let list_page = |b: Binding, body: &[u8], w: &std::collections::HashMap<String, ()>| {
            read_list(b, 200, body, w).ok()
        };
        let refused = |b: Binding, status: u16, body: &[u8]| {
            matches!(
                read_list(b, status, body, &wanted(&["m1"])),
                Err(LookupError::Refused(_))
            )
        };
        assert_eq!(
            list_page(Binding::JsonRpc, rpc, &wanted(&["m1"])),
            page(&[("m1", "c")], Some("n2"))
        );
        // Several messages in one pass.
        assert_eq!(
            list_page(Binding::JsonRpc, rpc, &wanted(&["m1", "m0", "m9"])),
            page(&[("m0", "a"), ("m1", "c")], Some("n2"))
        );
        assert_eq!(
            list_page(Binding::JsonRpc, rpc, &wanted(&["m9"])),
            page(&[], Some("n2"))
        );
        let rest = br#"{"tasks":[{"id":"r","history":[{"messageId":"m1"}]}],"nextPageToken":""}"#;
        assert_eq!(
            list_page(Binding::Rest, rest, &wanted(&["m1"])),
            page(&[("m1", "r")], None)
        );
        assert_eq!(list_page(Binding::Rest, b"{}", &wanted(&["m1"])), None);
        let err =
            br#"{"jsonrpc":"2.0","id":"l","error":{"code":-32601,"message":"Method not found"}}"#;
        assert_eq!(list_page(Binding::JsonRpc, err, &wanted(&["m1"])), None);
        assert!(refused(Binding::JsonRpc, 200, err));
        assert!(!refused(Binding::JsonRpc, 200, rpc));
        assert!(refused(Binding::Rest, 404, b""));
        assert!(refused(Binding::Grpc, 501, b""));
        assert!(!refused(Binding::Rest, 500, b""));
        let since = super::rfc3339(1_700_000_000_250);
        assert_eq!(since, "2023-11-14T22:13:20Z");
    }

    use super::*;

    /// What a cancel carries, from the route's header policy and the
    /// caller's request headers.
    #[test]
    fn cancel_headers_table() {
        fn route(extra: &str) -> config::Route {
            let src = format!("[[routes]]\nname = \"r\"\nworker = \"http://w\"\n{extra}");
            config::parse(&src).unwrap().routes.remove(0)
        }
        fn caller(pairs: &[(&str, &str)]) -> http::HeaderMap {
            let mut h = http::HeaderMap::new();
            for (k, v) in pairs {
                h.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            h
        }
        type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)]);
        let table: &[Row] = &[
            // Nothing to repeat.
            ("", &[("x-other", "1")], &[]),
            // The default: the caller's credential and tenant header.
            (
                "",
                &[("authorization", "Bearer c"), ("x-tenant-id", "acme"), ("x-other", "1")],
                &[("authorization", "Bearer c"), ("x-tenant-id", "acme")],
            ),
            // The route's credential only when the caller gave none.
            ("worker_credential = \"Bearer w\"", &[], &[("authorization", "Bearer w")]),
            (
                "worker_credential = \"Bearer w\"",
                &[("authorization", "Bearer c")],
                &[("authorization", "Bearer c")],
            ),
            // Injected headers replace the caller's, as on the request.
            (
                "inject_headers = { \"x-tenant-id\" = \"research\", authorization = \"Bearer i\" }",
                &[("authorization", "Bearer c"), ("x-tenant-id", "acme")],
                &[("x-tenant-id", "research"), ("authorization", "Bearer i")],
            ),
            // Stripped headers never reached the worker.
            (
                "strip_headers = [\"authorization\", \"x-tenant-id\"]\nworker_credential = \"Bearer w\"",
                &[("authorization", "Bearer c"), ("x-tenant-id", "acme")],
                &[("authorization", "Bearer w")],
            ),
            // Other names, and none.
            (
                "cancel_headers = [\"x-org\"]",
                &[("x-tenant-id", "acme"), ("x-org", "o1"), ("x-org", "o2")],
                &[("x-org", "o1"), ("x-org", "o2")],
            ),
            ("cancel_headers = []", &[("x-tenant-id", "acme")], &[]),
            // The cancel's own content type and version are not replaced.
            (
                "inject_headers = { \"content-type\" = \"text/plain\", \"a2a-version\" = \"0.3\" }",
                &[],
                &[],
            ),
        ];
        for (extra, from_caller, want) in table {
            let r = route(extra);
            let kept = caller_headers(&r, &caller(from_caller));
            let got = cancel_headers(&r, &kept);
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(got, want, "route {extra:?}, caller {from_caller:?}");
        }
        // A lapsed lease another replica saw: the route's part only.
        let r =
            route("worker_credential = \"Bearer w\"\ninject_headers = { \"x-tenant-id\" = \"t\" }");
        assert_eq!(
            cancel_headers(&r, &[]),
            vec![
                ("authorization".to_string(), "Bearer w".to_string()),
                ("x-tenant-id".to_string(), "t".to_string())
            ]
        );
    }

    #[test]
    fn judge_table() {
        use CancelOutcome::*;
        let not_cancelable_rest = br#"{"error":{"code":400,"status":"FAILED_PRECONDITION","message":"x","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"TASK_NOT_CANCELABLE","domain":"a2a-protocol.org"}]}}"#;
        let table: Vec<(Binding, u16, &[u8], Attempt)> = vec![
            (
                Binding::JsonRpc,
                200,
                br#"{"jsonrpc":"2.0","id":"x","result":{"id":"t"}}"#,
                Attempt::Final(Canceled),
            ),
            (
                Binding::JsonRpc,
                200,
                br#"{"jsonrpc":"2.0","id":"x","error":{"code":-32002,"message":"no"}}"#,
                Attempt::Final(NotCancelable),
            ),
            (
                Binding::JsonRpc,
                200,
                br#"{"jsonrpc":"2.0","id":"x","error":{"code":-32001,"message":"no"}}"#,
                Attempt::Final(NotFound),
            ),
            (
                Binding::Rest,
                200,
                br#"{"id":"t"}"#,
                Attempt::Final(Canceled),
            ),
            (Binding::Rest, 404, b"{}", Attempt::Final(NotFound)),
            (Binding::Rest, 409, b"{}", Attempt::Final(NotCancelable)),
            (
                Binding::Rest,
                400,
                not_cancelable_rest,
                Attempt::Final(NotCancelable),
            ),
        ];
        for (binding, status, body, want) in table {
            assert_eq!(judge(binding, status, body), want, "{binding:?} {status}");
        }
        assert!(matches!(judge(Binding::Rest, 503, b""), Attempt::Retry(_)));
        assert!(matches!(
            judge(Binding::JsonRpc, 502, b""),
            Attempt::Retry(_)
        ));
        assert!(matches!(
            judge(Binding::JsonRpc, 200, b"oops"),
            Attempt::Retry(_)
        ));
        assert!(matches!(
            judge(Binding::JsonRpc, 401, b""),
            Attempt::Refused(_)
        ));
        assert!(matches!(
            judge(Binding::JsonRpc, 200, br#"{"error":{"code":-32009}}"#),
            Attempt::Refused(_)
        ));
        assert!(matches!(
            judge(Binding::Rest, 400, b"{}"),
            Attempt::Refused(_)
        ));
    }

    #[test]
    fn read_task_state_table() {
        use Probed::*;
        let table: Vec<(Binding, u16, &[u8], Probed)> = vec![
            (
                Binding::JsonRpc,
                200,
                br#"{"jsonrpc":"2.0","id":"p","result":{"id":"t","status":{"state":"TASK_STATE_INPUT_REQUIRED"}}}"#,
                State(TaskState::InputRequired),
            ),
            (
                Binding::WebSocket,
                200,
                br#"{"jsonrpc":"2.0","id":"p","result":{"id":"t","status":{"state":"TASK_STATE_WORKING"}}}"#,
                State(TaskState::Working),
            ),
            (
                Binding::Rest,
                200,
                br#"{"id":"t","contextId":"c","status":{"state":"TASK_STATE_COMPLETED"},"artifacts":[{"parts":[{"text":"x"}]}]}"#,
                State(TaskState::Completed),
            ),
            (
                Binding::JsonRpc,
                200,
                br#"{"jsonrpc":"2.0","id":"p","error":{"code":-32001,"message":"Task not found"}}"#,
                NotFound,
            ),
            (
                Binding::JsonRpc,
                200,
                br#"{"jsonrpc":"2.0","id":"p","error":{"code":-32603,"message":"boom"}}"#,
                Unknown,
            ),
            (Binding::Rest, 404, b"{}", NotFound),
            (Binding::Rest, 500, b"oops", Unknown),
            (Binding::Rest, 200, b"not json", Unknown),
            // A state this gateway does not know leaves it unknown.
            (
                Binding::Rest,
                200,
                br#"{"id":"t","status":{"state":"TASK_STATE_DREAMING"}}"#,
                Unknown,
            ),
        ];
        for (binding, status, body, want) in table {
            let (got, _) = read_task_state(binding, status, body);
            assert_eq!(
                got,
                want,
                "{binding:?} {status} {}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
