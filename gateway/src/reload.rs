//! Hot reload: SIGHUP, or `POST /reload` on the admin endpoint, re-reads the
//! config file given with `--config` and the TLS certificate files.
//!
//! - A valid file replaces the routes (every `[[routes]]` key: workers,
//!   prefixes, hosts, cascade, lease, budget and header policies) for new
//!   requests in one atomic swap ([`LiveRoutes`]); `[server.tls]`'s
//!   certificate and key are loaded again and served to new TLS handshakes
//!   ([`ServerCert`]).
//! - What is already under way keeps what it started with: a request holds
//!   the route it matched for its whole life (its stream, its cascade when
//!   the caller leaves, its budget, its lease renewals), and so does a
//!   cancel being sent. Lapsed leases and owed cancels claimed from the
//!   store after the reload are sent with the route of their name as it is
//!   now; a route the reload removed is kept aside, unreachable by
//!   requests, so that they are still sent with its last config
//!   ([`LiveRoutes::by_name`]).
//! - An invalid file (or a certificate that does not load) is refused, every
//!   error logged, and nothing changes.
//! - Settings that cannot change in a running process (listeners, admin
//!   address and token, store, threads, limits, timeouts, …) are compared
//!   with the running ones; each that differs is named in a warning (and in
//!   `/reload`'s answer) and keeps its running value until a restart.
//!
//! Counted in `a2agw_config_reloads_total{outcome}`.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::tls::sign::CertifiedKey;
use pingora::tls::{ClientHello, ResolvesServerCert};
use serde_json::json;

use crate::route::{LiveRoutes, RouteChanges};

/// `[server.tls]`'s certificate for every TLS listener, replaced by a reload
/// for new handshakes (connections already open keep theirs).
#[derive(Debug)]
pub struct ServerCert {
    current: ArcSwap<CertifiedKey>,
}

impl ServerCert {
    /// Loads the chain and key of `tls` (a message naming both files when
    /// they do not load or do not belong together).
    pub fn load(tls: &config::ServerTls) -> Result<ServerCert, String> {
        Ok(ServerCert {
            current: ArcSwap::from_pointee(certified_key(tls)?),
        })
    }

    /// Loads `tls`'s files again and serves them to new handshakes.
    pub fn reload(&self, tls: &config::ServerTls) -> Result<(), String> {
        self.current.store(Arc::new(certified_key(tls)?));
        Ok(())
    }
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

fn certified_key(tls: &config::ServerTls) -> Result<CertifiedKey, String> {
    let (cert, key) = (tls.cert.display(), tls.key.display());
    let (chain, key_der) = match pingora::tls::load_certs_and_key_files(
        &tls.cert.to_string_lossy(),
        &tls.key.to_string_lossy(),
    ) {
        Ok(Some(pair)) => pair,
        Ok(None) => {
            return Err(format!(
                "server.tls: {cert} holds no certificate or {key} no private key"
            ))
        }
        Err(e) => return Err(format!("server.tls: cannot load {cert} and {key}: {e}")),
    };
    pingora::tls::install_default_crypto_provider();
    let provider = pingora::tls::CryptoProvider::get_default()
        .ok_or_else(|| "server.tls: no TLS crypto provider installed".to_string())?;
    CertifiedKey::from_der(chain, key_der, provider)
        .map_err(|e| format!("server.tls: cannot serve TLS with {cert} and {key}: {e}"))
}

/// Where a reload reads the config: the `--config` file, with the command
/// line's overrides (`--listen`, `--admin`, `--store`, …) applied as at
/// start-up, so that they are not taken for changes.
pub struct ConfigSource {
    pub path: PathBuf,
    pub overrides: Box<dyn Fn(&mut config::Config) + Send + Sync>,
}

impl std::fmt::Debug for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSource")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// What started a reload, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Signal,
    Admin,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Signal => "SIGHUP",
            Trigger::Admin => "POST /reload",
        }
    }
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The new routes (and certificate) serve new requests; the settings
    /// named in `restart_only` differ from the running ones and were not
    /// applied.
    Applied {
        routes: usize,
        changes: RouteChanges,
        restart_only: Vec<&'static str>,
        certificate_reloaded: bool,
    },
    /// Nothing changed; every reason.
    Refused { errors: Vec<String> },
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Applied { .. } => "applied",
            Outcome::Refused { .. } => "refused",
        }
    }

    /// `/reload`'s answer.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Outcome::Applied {
                routes,
                changes,
                restart_only,
                certificate_reloaded,
            } => json!({
                "outcome": "applied",
                "routes": routes,
                "added": changes.added,
                "removed": changes.removed,
                "changed": changes.changed,
                "certificateReloaded": certificate_reloaded,
                "restartRequired": restart_only,
            }),
            Outcome::Refused { errors } => json!({
                "outcome": "refused",
                "errors": errors,
            }),
        }
    }
}

/// Re-reads the config on demand and applies what can change.
#[derive(Debug)]
pub struct Reloader {
    /// `None`: started without a config file (`--worker`); nothing to read.
    source: Option<ConfigSource>,
    routes: Arc<LiveRoutes>,
    cert: Option<Arc<ServerCert>>,
    /// What runs: the start-up config with every reload's routes and
    /// certificate paths. Held across a reload: one at a time.
    running: tokio::sync::Mutex<config::Config>,
    /// How long the memory store keeps an untouched task (set at start from
    /// the routes' longest lease); `None`: another store.
    memory_retention: Option<std::time::Duration>,
}

impl Reloader {
    pub fn new(
        source: Option<ConfigSource>,
        running: config::Config,
        routes: Arc<LiveRoutes>,
        cert: Option<Arc<ServerCert>>,
    ) -> Self {
        for outcome in ["applied", "refused"] {
            crate::metrics::CONFIG_RELOADS
                .with_label_values(&[outcome])
                .inc_by(0);
        }
        let memory_retention = matches!(running.store.kind, config::StoreKind::Memory)
            .then(|| crate::store::memory::retention(&running));
        Reloader {
            source,
            routes,
            cert,
            running: tokio::sync::Mutex::new(running),
            memory_retention,
        }
    }

    /// Reads the file, and applies it if it is valid: logs and counts the
    /// outcome.
    pub async fn reload(&self, trigger: Trigger) -> Outcome {
        let mut running = self.running.lock().await;
        let outcome = self.apply(&mut running);
        crate::metrics::CONFIG_RELOADS
            .with_label_values(&[outcome.label()])
            .inc();
        let file = self.source.as_ref().map(|s| s.path.display().to_string());
        match &outcome {
            Outcome::Refused { errors } => {
                for (i, e) in errors.iter().enumerate() {
                    tracing::error!(
                        trigger = trigger.as_str(),
                        file = file.as_deref(),
                        "config reload refused ({}/{}): {e}",
                        i + 1,
                        errors.len()
                    );
                }
                tracing::warn!(
                    trigger = trigger.as_str(),
                    file = file.as_deref(),
                    errors = errors.len(),
                    "config reload refused; the running config is kept"
                );
            }
            Outcome::Applied {
                routes,
                changes,
                restart_only,
                certificate_reloaded,
            } => {
                tracing::info!(
                    trigger = trigger.as_str(),
                    file = file.as_deref(),
                    routes,
                    added = ?changes.added,
                    removed = ?changes.removed,
                    changed = ?changes.changed,
                    certificate_reloaded,
                    "config reloaded: new requests use the new routes; requests under way keep theirs"
                );
                if !restart_only.is_empty() {
                    tracing::warn!(
                        trigger = trigger.as_str(),
                        settings = ?restart_only,
                        "config reload: {} differ from the running config and take effect only after a restart; their running values are kept",
                        restart_only.join(", ")
                    );
                }
            }
        }
        outcome
    }

    fn apply(&self, running: &mut config::Config) -> Outcome {
        let refused = |errors: Vec<String>| Outcome::Refused { errors };
        let Some(source) = &self.source else {
            return refused(vec![
                "no config file to reload: the gateway was started with --worker, not --config"
                    .to_string(),
            ]);
        };
        let mut new = match config::load(&source.path) {
            Ok(c) => c,
            Err(errors) => {
                let file = source.path.display();
                return refused(
                    errors
                        .errors
                        .iter()
                        .map(|e| format!("{file}:{e}"))
                        .collect(),
                );
            }
        };
        (source.overrides)(&mut new);
        if let Err(e) = crate::tls::check(&new) {
            return refused(vec![e]);
        }
        if let Err(e) = crate::auth::check_keys(&new.routes) {
            return refused(e);
        }
        let mut restart_only = restart_only(running, &new);
        if self
            .memory_retention
            .is_some_and(|kept| crate::store::memory::retention(&new) > kept)
        {
            // The routes apply, but the memory store was sized at start: a
            // lease longer than it keeps untouched tasks could outlive its
            // task's record.
            restart_only.push("routes.max_lease_ttl (longer than the memory store keeps a task)");
        }
        // The certificate first: the only step here that can still fail.
        let mut certificate_reloaded = false;
        if let (Some(cert), Some(tls)) = (&self.cert, &new.server.tls) {
            if let Err(e) = cert.reload(tls) {
                return refused(vec![e]);
            }
            certificate_reloaded = true;
            if let Some(t) = running.server.tls.as_mut() {
                t.cert = tls.cert.clone();
                t.key = tls.key.clone();
            }
        }
        let changes = self.routes.replace(&new.routes);
        running.routes = new.routes;
        Outcome::Applied {
            routes: running.routes.len(),
            changes,
            restart_only,
            certificate_reloaded,
        }
    }
}

/// The settings of `new` that differ from `running` and need a restart:
/// everything but the routes and `[server.tls]`'s certificate and key
/// files. Named by key; anything this list does not name (a section added
/// later) is reported as `other settings`.
pub fn restart_only(running: &config::Config, new: &config::Config) -> Vec<&'static str> {
    let mut names = Vec::new();
    // `rest` becomes `new` with every named difference set back to the
    // running value: what still differs is unnamed.
    let mut rest = new.clone();
    macro_rules! compare {
        ($($($field:ident).+ => $name:literal),* $(,)?) => {
            $(
                if running.$($field).+ != new.$($field).+ {
                    names.push($name);
                    rest.$($field).+ = running.$($field).+.clone();
                }
            )*
        };
    }
    compare!(
        server.listen => "server.listen",
        server.public_url => "server.public_url",
        server.admin => "server.admin",
        server.admin_token => "server.admin_token",
        server.threads => "server.threads",
        server.read_buffer => "server.read_buffer",
        server.log_format => "server.log_format",
        server.access_log => "server.access_log",
        server.log_flush => "server.log_flush",
        store.kind => "store.url",
        store.on_store_error => "store.on_store_error",
        store.password => "store.password_env/password_file",
        store.tls_ca => "store.tls_ca_file",
        store.tls_client_cert => "store.tls_client_cert/tls_client_key",
        limits.max_inspect_body => "limits.max_inspect_body",
        limits.max_sse_event => "limits.max_sse_event",
        limits.max_card_body => "limits.max_card_body",
        limits.max_tracked_tasks => "limits.max_tracked_tasks",
        limits.worker_h2_streams => "limits.worker_h2_streams",
        timeouts.connect => "timeouts.connect",
        timeouts.upstream_idle => "timeouts.upstream_idle",
        timeouts.downstream_idle => "timeouts.downstream_idle",
        timeouts.dns_refresh => "timeouts.dns_refresh",
        timeouts.drain => "timeouts.drain",
        cancel.attempts => "cancel.attempts",
        cancel.backoff => "cancel.backoff",
        cancel.backoff_max => "cancel.backoff_max",
        cancel.timeout => "cancel.timeout",
        leases.tick => "leases.tick",
        leases.replica_id => "leases.replica_id",
        tracing => "tracing",
    );
    match (&running.server.tls, &new.server.tls) {
        (Some(a), Some(b)) => {
            if a.listen != b.listen {
                names.push("server.tls.listen");
            }
            rest.server.tls = running.server.tls.clone();
        }
        (None, None) => {}
        _ => {
            names.push("server.tls");
            rest.server.tls = running.server.tls.clone();
        }
    }
    rest.routes = running.routes.clone();
    if rest != *running {
        names.push("other settings");
    }
    names
}

/// Reloads on every SIGHUP for the life of the server.
#[derive(Debug)]
pub struct SignalReload(pub Arc<Reloader>);

#[async_trait]
impl BackgroundService for SignalReload {
    async fn start(&self, _shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGHUP; reload with POST /reload on the admin endpoint");
                return;
            }
        };
        while hup.recv().await.is_some() {
            self.0.reload(Trigger::Signal).await;
        }
    }
}

/// Makes SIGHUP harmless from now on (its default action ends the
/// process): called at start-up, before the signal is listened for by
/// [`SignalReload`]. A SIGHUP between the two is ignored.
pub fn ignore_sighup_until_listening() -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| format!("a runtime to install the SIGHUP handler: {e}"))?;
    // tokio installs the process's handler once and keeps it for good.
    rt.block_on(async {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map(drop)
    })
    .map_err(|e| format!("cannot install the SIGHUP handler: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Routes;
    use std::time::Duration;

    fn cfg(src: &str) -> config::Config {
        config::parse(src).unwrap()
    }

    const BASE: &str = "[server]\nlisten = [\"127.0.0.1:8080\"]\n\n\
        [[routes]]\nname = \"a\"\nworker = \"http://127.0.0.1:9001\"\npath_prefix = \"/a\"\n\
        [[routes]]\nname = \"b\"\nworker = \"http://127.0.0.1:9002\"\n";

    #[test]
    fn routes_alone_need_no_restart() {
        let old = cfg(BASE);
        let new = cfg(&BASE.replace("9002", "9003"));
        assert_eq!(restart_only(&old, &new), Vec::<&str>::new());
        assert_eq!(restart_only(&old, &old), Vec::<&str>::new());
    }

    #[test]
    fn restart_only_settings_are_named() {
        let old = cfg(BASE);
        let new = cfg(&BASE.replace(
            "listen = [\"127.0.0.1:8080\"]\n",
            "listen = [\"127.0.0.1:8081\"]\nthreads = 3\n\n[timeouts]\nconnect = \"7s\"\n",
        ));
        assert_eq!(
            restart_only(&old, &new),
            vec!["server.listen", "server.threads", "timeouts.connect"]
        );
        let traced = cfg(&format!(
            "{BASE}\n[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\n"
        ));
        assert_eq!(restart_only(&old, &traced), vec!["tracing"]);
        // The store's credentials are named too, not "other settings"
        // (`PATH`: an environment variable every test run has).
        let redis = format!("[store]\nurl = \"redis://127.0.0.1:6379\"\n\n{BASE}");
        let with_password = redis.replace("6379\"\n", "6379\"\npassword_env = \"PATH\"\n");
        assert_eq!(
            restart_only(&cfg(&redis), &cfg(&with_password)),
            vec!["store.password_env/password_file"]
        );
    }

    /// With the memory store, a lease longer than any at start is named
    /// (the store's retention was set from them); the routes still apply.
    #[tokio::test]
    async fn a_longer_lease_than_the_memory_store_keeps_is_named() {
        let dir = std::env::temp_dir().join(format!("a2agw-reload-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gw.toml");
        let start = cfg(BASE);
        let live = Arc::new(LiveRoutes::new(Routes::new(
            &start.routes,
            Duration::from_secs(30),
        )));
        let source = ConfigSource {
            path: path.clone(),
            overrides: Box::new(|_| {}),
        };
        let reloader = Reloader::new(Some(source), start, live.clone(), None);
        std::fs::write(
            &path,
            BASE.replace(
                "path_prefix = \"/a\"\n",
                "path_prefix = \"/a\"\nmax_lease_ttl = \"12h\"\n",
            ),
        )
        .unwrap();
        let Outcome::Applied {
            restart_only,
            changes,
            ..
        } = reloader.reload(Trigger::Admin).await
        else {
            panic!("refused");
        };
        assert_eq!(
            restart_only,
            ["routes.max_lease_ttl (longer than the memory store keeps a task)"]
        );
        assert_eq!(changes.changed, ["a"]);
        std::fs::write(&path, "[[routes]]\nname = 1\n").unwrap();
        assert!(matches!(
            reloader.reload(Trigger::Admin).await,
            Outcome::Refused { .. }
        ));
        assert_eq!(live.load().iter().count(), 2, "the running routes kept");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn removed_routes_are_kept_for_their_leases_and_names_come_back() {
        let old = cfg(BASE);
        let live = LiveRoutes::new(Routes::new(&old.routes, Duration::from_secs(30)));
        let a = live.by_name("a").unwrap();
        let new = cfg(&BASE.replace("name = \"a\"", "name = \"c\""));
        let changes = live.replace(&new.routes);
        assert_eq!(changes.added, vec!["c"]);
        assert_eq!(changes.removed, vec!["a"]);
        assert!(changes.changed.is_empty());
        // New requests cannot reach "a"; its leases still find it.
        assert!(live.load().by_name("a").is_none());
        assert!(live
            .load()
            .find(None, "/a/x")
            .is_some_and(|m| &*m.route.name == "c"));
        assert!(Arc::ptr_eq(&live.by_name("a").unwrap(), &a));
        let mut names: Vec<String> = live.claim_names().iter().map(|n| n.to_string()).collect();
        names.sort();
        assert_eq!(names, ["a", "b", "c"]);
        // "a" configured again: the new one, and no longer retired.
        let changes = live.replace(&old.routes);
        assert_eq!(
            (changes.added, changes.removed),
            (vec!["a".to_string()], vec!["c".to_string()])
        );
        assert!(!Arc::ptr_eq(&live.by_name("a").unwrap(), &a));
        assert_eq!(live.claim_names().len(), 3, "a, b, and the removed c");
    }

    #[tokio::test]
    async fn a_changed_route_keeps_what_the_card_said_when_its_worker_is_the_same() {
        let old = cfg(BASE);
        let live = LiveRoutes::new(Routes::new(&old.routes, Duration::from_secs(30)));
        for r in live.load().iter() {
            r.card_declares_lease
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let new = cfg(&BASE
            .replace(
                "worker = \"http://127.0.0.1:9002\"\n",
                "worker = \"http://127.0.0.1:9009\"\n",
            )
            .replace(
                "path_prefix = \"/a\"\n",
                "path_prefix = \"/a\"\ncascade = \"detach\"\n",
            ));
        let changes = live.replace(&new.routes);
        let mut changed = changes.changed.clone();
        changed.sort();
        assert_eq!(changed, ["a", "b"]);
        let seen = |n: &str| {
            live.by_name(n)
                .unwrap()
                .card_declares_lease
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        assert!(seen("a"), "same worker: the card's word is kept");
        assert!(!seen("b"), "another worker: its card is read anew");
    }
}
