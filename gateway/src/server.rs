//! Assembling the pingora server from a validated config.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::{L4BufferSettings, ListenerConfig, TcpSocketOptions};
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};

use crate::admin::Admin;
use crate::cancel::Canceller;
use crate::cascade::Cascade;
use crate::lease::Leases;
use crate::proxy::Gateway;
use crate::reload::{ConfigSource, Reloader, ServerCert, SignalReload};
use crate::route::LiveRoutes;
use crate::route::Routes;
use crate::store::default_replica_id;
use crate::store::memory::MemoryStore;
use crate::store::TaskStore;
use crate::tracker::Tracker;

type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Runs the tracker's queue consumer for the life of the server, a
/// graceful shutdown's drain included (streams still open keep writing).
struct TrackerLoop(Mutex<Option<BoxFuture>>);

#[async_trait]
impl BackgroundService for TrackerLoop {
    async fn start(&self, _shutdown: ShutdownWatch) {
        let run = self.0.lock().ok().and_then(|mut f| f.take());
        if let Some(run) = run {
            run.await;
        }
    }
}

/// Looks up the workers' host names once at start.
struct WarmAddrs(Arc<crate::resolve::WorkerAddrs>);

/// Looks up and health-checks the replicas of each route with several
/// (`workers`), each every `health_interval` (the routes a reload brings
/// included).
struct ReplicaChecks(Arc<LiveRoutes>);

#[async_trait]
impl BackgroundService for ReplicaChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let routes = self.0.load().clone();
            let now = crate::store::now_ms();
            for r in routes.all() {
                if let Some(replicas) = &r.replicas {
                    replicas.check_if_due(now).await;
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
        }
    }
}

#[async_trait]
impl BackgroundService for WarmAddrs {
    async fn start(&self, _shutdown: ShutdownWatch) {
        self.0.warm_up().await;
    }
}

/// The runtime that drives the Redis connection for the life of the process
/// (pingora's services each run their own runtimes; the connection's driver
/// must outlive them all).
static STORE_RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();

/// Redis keys are namespaced with this prefix.
pub const REDIS_NAMESPACE: &str = "a2agw";

/// Builds the store a config names, for replica `replica`. Redis must
/// answer at start-up. Its calls are timed (`a2agw_store_op_seconds`,
/// [`crate::store::timed`]).
pub fn build_store(cfg: &config::Config, replica: &str) -> Result<Arc<dyn TaskStore>, String> {
    match &cfg.store.kind {
        config::StoreKind::Memory => Ok(crate::store::timed::TimedStore::wrap(Arc::new(
            MemoryStore::new(
                cfg.limits.max_tracked_tasks,
                crate::store::memory::retention(cfg),
            )
            .with_max_accounts(cfg.limits.max_accounts),
        ))),
        config::StoreKind::Redis { url } => {
            let rt = STORE_RUNTIME.get_or_init(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("a2agw-store")
                    .enable_all()
                    .build()
                    .expect("a tokio runtime for the store")
            });
            // rustls's provider, for rediss:// (as for every other TLS).
            pingora::tls::install_default_crypto_provider();
            let store = rt
                .block_on(crate::store::redis::RedisStore::connect_with(
                    url,
                    &cfg.store,
                    REDIS_NAMESPACE,
                    replica,
                ))
                .map_err(|e| format!("store {}: {e}", config::redact_url(url)))?
                .with_max_accounts(cfg.limits.max_accounts);
            Ok(crate::store::timed::TimedStore::wrap(Arc::new(store)))
        }
    }
}

/// The pingora server settings of a gateway with `threads` worker threads
/// that drains for `drain` after SIGTERM (pingora's grace period, in whole
/// seconds, rounded up; [`crate::drain::Drainer`] ends the process sooner
/// when nothing is left), then gives its runtimes at most 5 s to stop. The
/// benches' bare pass-through uses the same, so that it differs from the
/// gateway only in its filters.
pub fn server_conf(threads: usize, drain: Duration) -> ServerConf {
    let grace = drain.as_secs() + u64::from(drain.subsec_nanos() > 0);
    ServerConf {
        threads,
        grace_period_seconds: Some(grace),
        graceful_shutdown_timeout_seconds: Some(5),
        ..ServerConf::default()
    }
}

/// Builds every service and runs until a signal stops the process.
/// `source`: the config file the config came from, re-read on SIGHUP and
/// `POST /reload` (`None`: started without one).
pub fn run(cfg: config::Config, source: Option<ConfigSource>) -> Result<(), String> {
    crate::reload::ignore_sighup_until_listening()?;
    crate::tls::check(&cfg)?;
    crate::auth::check_keys(&cfg.routes).map_err(|e| e.join("\n"))?;
    if let Some(a) = cfg.server.admin {
        if config::admin_needs_token(a) && cfg.server.admin_token.is_none() {
            return Err(format!(
                "admin {a} is not a loopback address: an admin listener others can reach needs server.admin_token_env or server.admin_token_file"
            ));
        }
    }
    check_binds(&cfg)?;
    let replica_id = cfg
        .leases
        .replica_id
        .clone()
        .unwrap_or_else(default_replica_id);
    let store = build_store(&cfg, &replica_id)?;
    let store_kind = store.kind();
    let (tracker, tracker_run) = Tracker::new(store.clone());
    let routes = Arc::new(LiveRoutes::new(Routes::new(
        &cfg.routes,
        cfg.timeouts.dns_refresh,
    )));
    let worker_addrs = routes.worker_addrs();
    let canceller = Canceller::new(
        cfg.cancel.clone(),
        cfg.timeouts.connect,
        worker_addrs.clone(),
    );
    let link_key = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime to read the delegation key: {e}"))?
        .block_on(store.link_key())
        .map_err(|e| format!("the delegation key: {e}"))?;
    let linker = Arc::new(crate::link::Linker::new(&link_key, &cfg.delegation));
    let tree = crate::tree::Tree::new(
        store.clone(),
        tracker.clone(),
        canceller.clone(),
        routes.clone(),
        linker.clone(),
    );
    tree.follow(&canceller);
    let cascade = Arc::new(Cascade::new(
        store.clone(),
        tracker.clone(),
        canceller.clone(),
        tree.clone(),
    ));
    let health = Arc::new(crate::store::StoreHealth::default());
    let budgets = Arc::new(crate::budget::Budgets::new(
        store.clone(),
        health.clone(),
        cfg.store.on_store_error,
        canceller.clone(),
        tree,
    ));
    let leases = Arc::new(Leases::new(
        store.clone(),
        canceller.clone(),
        routes.clone(),
        replica_id.clone(),
        cfg.leases.tick,
        health.clone(),
    ));

    let mut server =
        Server::new_with_opt_and_conf(None, server_conf(cfg.server.threads, cfg.timeouts.drain));
    server.bootstrap();

    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(
            &cfg,
            routes.clone(),
            cascade,
            leases.clone(),
            store.clone(),
            health,
            budgets.clone(),
        ),
        "a2a-gateway",
    );
    // HTTP/2 with prior knowledge (h2c) on the plain listeners, for gRPC
    // callers: a connection's first bytes tell the HTTP/2 preface from an
    // HTTP/1 request (docs/behaviour.md, gRPC; patches/README.md, core 10).
    if let Some(app) = proxy.app_logic_mut() {
        let mut opts = pingora::apps::HttpServerOptions::default();
        opts.h2c = true;
        app.server_options = Some(opts);
    }
    let buffers = L4BufferSettings::default().read(cfg.server.read_buffer);
    for addr in &cfg.server.listen {
        proxy.add_listener(
            ListenerConfig::tcp(addr.to_string())
                .tcp_socket_options(socket_options(addr))
                .l4_buffer(buffers),
        );
    }
    // One certificate for every TLS listener, replaced by a reload.
    let server_cert = match &cfg.server.tls {
        Some(tls) => Some(Arc::new(ServerCert::load(tls)?)),
        None => None,
    };
    if let (Some(tls), Some(server_cert)) = (&cfg.server.tls, &server_cert) {
        // Loaded and checked by `tls::check` above.
        let (cert, key) = crate::tls::paths(tls)?;
        for addr in &tls.listen {
            let mut settings = TlsSettings::intermediate(cert, key)
                .map_err(|e| format!("server.tls listener {addr}: {e}"))?;
            settings.set_cert_resolver(server_cert.clone());
            // ALPN: h2 (gRPC callers) or http/1.1.
            settings.enable_h2();
            proxy.add_listener(
                ListenerConfig::tcp(addr.to_string())
                    .tcp_socket_options(socket_options(addr))
                    .tls(settings)
                    .l4_buffer(buffers),
            );
        }
    }
    server.add_service(proxy);
    let reloader = Arc::new(Reloader::new(
        source,
        cfg.clone(),
        routes.clone(),
        server_cert,
    ));
    // The long-running ones are watched: one that stops turns /healthz 503.
    let services = Arc::new(crate::health::Services::default());
    let watched = |name, service: Arc<dyn BackgroundService + Send + Sync>| {
        background_service(
            name,
            crate::health::Watched::new(name, service, services.clone()),
        )
    };
    server.add_service(watched(
        "config reload",
        Arc::new(SignalReload(reloader.clone())),
    ));
    server.add_service(background_service(
        "worker addresses",
        WarmAddrs(worker_addrs),
    ));
    server.add_service(watched("replicas", Arc::new(ReplicaChecks(routes.clone()))));
    server.add_service(watched(
        "tracker",
        Arc::new(TrackerLoop(Mutex::new(Some(Box::pin(tracker_run))))),
    ));
    server.add_service(watched(
        "drain",
        Arc::new(crate::drain::Drainer {
            tracker: tracker.clone(),
            store: store.clone(),
            timeout: cfg.timeouts.drain,
        }),
    ));
    server.add_service(watched("leases", leases));
    if let Some(addr) = cfg.server.admin {
        let mut admin = pingora::services::listening::Service::new(
            "admin".to_string(),
            pingora::apps::http_app::HttpServer::new_app(
                Admin::new(
                    store,
                    budgets,
                    cfg.server
                        .listen
                        .iter()
                        .chain(cfg.server.tls.iter().flat_map(|t| &t.listen))
                        .copied()
                        .collect(),
                    cfg.server.admin_token.clone(),
                )
                .with_reload(reloader)
                .with_tasks(addr, routes, canceller, tracker)
                .with_linker(linker)
                .with_health(services),
            ),
        );
        admin.add_tcp_with_settings(&addr.to_string(), socket_options(&addr));
        server.add_service(admin);
    }
    tracing::info!(
        listen = ?cfg.server.listen,
        tls_listen = ?cfg.server.tls.as_ref().map(|t| &t.listen),
        admin = ?cfg.server.admin,
        routes = cfg.routes.len(),
        store = store_kind,
        replica = %replica_id,
        "a2a-gateway starting"
    );
    for r in &cfg.routes {
        let checks = r.send_checks();
        if checks.is_empty() {
            tracing::info!(route = %r.name, "the route checks no send: what it cannot read (not JSON, gRPC of other services, ...) passes to the worker untracked");
        } else {
            tracing::info!(route = %r.name, checks = %checks.join(","), "the route checks every send: what it cannot read as an A2A call is refused (docs/behaviour.md, strict reading)");
        }
    }
    server.run(pingora::server::RunArgs::default());
    // pingora's `run_forever`, with the log's last lines written first.
    crate::log_writer::flush();
    std::process::exit(0)
}

/// The socket options of a listener on `addr`: an IPv6 one is IPv6 only
/// (`IPV6_V6ONLY`, as nginx does), so that `"0.0.0.0:P"` and `"[::]:P"`
/// both bind on a dual-stack host, each for its own family, and `"[::]:P"`
/// alone does not take IPv4 callers.
fn socket_options(addr: &std::net::SocketAddr) -> TcpSocketOptions {
    let mut options = TcpSocketOptions::default();
    options.ipv6_only = addr.is_ipv6().then_some(true);
    options
}

/// Binds every listener address once (and lets it go) before pingora
/// starts: pingora binds in its service threads, where a failure panics a
/// thread and leaves the process up without that listener. An address that
/// cannot be bound (taken, not this host's, not permitted) is an error
/// naming it, its key and the OS error. IPv4 and IPv6 addresses are tried
/// in two passes, since an IPv6 listener is IPv6 only ([`socket_options`])
/// while the bind tried here is dual-stack. Something that takes an address
/// between this check and pingora's bind still panics a service thread.
pub fn check_binds(cfg: &config::Config) -> Result<(), String> {
    let mut all: Vec<(std::net::SocketAddr, &str)> = Vec::new();
    all.extend(cfg.server.listen.iter().map(|a| (*a, "server.listen")));
    if let Some(tls) = &cfg.server.tls {
        all.extend(tls.listen.iter().map(|a| (*a, "server.tls.listen")));
    }
    if let Some(a) = cfg.server.admin {
        all.push((a, "server.admin"));
    }
    for v6 in [false, true] {
        let mut held = Vec::new();
        for (addr, key) in all.iter().filter(|(a, _)| a.is_ipv6() == v6) {
            let listener = std::net::TcpListener::bind(addr)
                .map_err(|e| format!("cannot listen on {addr} ({key}): {e}"))?;
            held.push(listener);
        }
    }
    Ok(())
}
