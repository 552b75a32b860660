//! The file's keys: which exist, their defaults, and the rules across them.

use std::collections::{hash_map, BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use policies::budget::{is_meter_name, Caps, OverCap, MAX_METERS, MAX_METER_NAME_LEN};
use policies::carry::BlockingSends;
use policies::cascade::{CascadeMode, CascadePolicy};
use toml_edit::Item;

use crate::read::{
    boolean, duration, expected, found, int_in, key_segment, nonzero_duration, one_of, size_in,
    string, Bad, Entry, Problem, Reader, Sink,
};
use crate::url::{split_url, UrlError};
use crate::{
    AccountPolicy, AccountScope, BudgetPolicy, Cancel, ClientCert, Config, HeaderPolicy,
    LeasePolicy, Leases, Limits, LogFormat, OnStoreError, Route, SampleRatio, Server, ServerTls,
    Store, StoreKind, Timeouts, Tracing, WorkerCa, WorkerLeases, WorkerUrl,
};

/// What the file refers to outside itself: environment variables
/// (`worker_credential_env`) and files (`worker_ca`, `[server.tls]`).
pub(crate) struct Outside<'e> {
    pub env: &'e dyn Fn(&str) -> Option<String>,
    /// The config file's directory, which relative paths start from; `None`:
    /// the working directory.
    pub dir: Option<&'e Path>,
}

pub(crate) type Env<'e> = &'e Outside<'e>;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Reads the whole document; `None` if anything was recorded in `sink`.
pub(crate) fn config<'a>(root: &mut Reader<'a>, sink: &Sink<'a>, env: Env<'_>) -> Option<Config> {
    let server = server(root.section("server"), env);
    let store = store(root.section("store"), env);
    let limits = limits(root.section("limits"));
    let timeouts = timeouts(root.section("timeouts"));
    let cancel = cancel(root.section("cancel"));
    let leases = leases(root.section("leases"));
    // Off without the table; with it, `otlp_endpoint` is required.
    let has_tracing = root.has("tracing");
    let tracing_reader = root.section("tracing");
    let tracing = if has_tracing {
        tracing(tracing_reader)
    } else {
        None
    };
    let delegation = delegation(root.section("delegation"));
    let mut defaults = defaults(root.section("defaults"));
    defaults.tick = leases.tick;
    let routes = routes(root, sink, &defaults, env);
    if sink.count() > 0 {
        return None;
    }
    Some(Config {
        server,
        store,
        limits,
        timeouts,
        cancel,
        leases,
        tracing,
        delegation,
        routes: routes?,
    })
}

/// `[delegation]`: every key defaulted.
fn delegation(mut r: Reader<'_>) -> crate::Delegation {
    let d = crate::Delegation::default();
    let link = r.or("link", d.link, boolean);
    let max_depth = r.or("max_depth", d.max_depth, int_in(1..=64));
    r.finish();
    crate::Delegation { link, max_depth }
}

fn leases(mut r: Reader<'_>) -> Leases {
    let d = Leases::default();
    let tick = r.or("tick", d.tick, duration);
    if tick < Duration::from_millis(10) || tick > Duration::from_secs(1) {
        let at = r.pos("tick");
        r.report_at(
            at,
            "tick",
            "must be between 10ms and 1s (a lapse is acted on within one tick)",
        );
    }
    let replica_id = r.opt("replica_id", |item| {
        let s = string(item)?;
        if s.is_empty() || s.len() > 128 || s.contains(char::is_whitespace) {
            return Err("must be 1 to 128 characters without spaces".to_string());
        }
        Ok(s.to_string())
    });
    r.finish();
    Leases { tick, replica_id }
}

/// `[tracing]`: `otlp_endpoint` required, the rest defaulted.
fn tracing(mut r: Reader<'_>) -> Option<Tracing> {
    let otlp_endpoint = r.required("otlp_endpoint", otlp_endpoint);
    let service_name = r.or(
        "service_name",
        crate::DEFAULT_SERVICE_NAME.to_string(),
        |item| -> Result<String, String> {
            let s = string(item)?;
            if s.is_empty() || s.len() > 255 || s.chars().any(char::is_control) {
                return Err("must be 1 to 255 characters without control characters".into());
            }
            Ok(s.to_string())
        },
    );
    let sample_ratio = r.or("sample_ratio", SampleRatio::default(), |item| {
        let n = match item.as_float() {
            Some(f) => f,
            None => item
                .as_integer()
                .ok_or_else(|| expected("a number from 0 to 1", item))? as f64,
        };
        SampleRatio::new(n).ok_or_else(|| format!("must be between 0 and 1, found {n}"))
    });
    r.finish();
    Some(Tracing {
        otlp_endpoint: otlp_endpoint?,
        service_name,
        sample_ratio,
    })
}

/// An OTLP/HTTP receiver's base URL: `http://host[:port][/path]`, without
/// user info, query or fragment; returned without a trailing `/`.
fn otlp_endpoint(item: &Item) -> Result<String, String> {
    let s = string(item)?;
    let shape = || {
        expected(
            "an http URL with a host, like \"http://collector:4318\"",
            item,
        )
    };
    let u = split_url(s).map_err(|e| match e {
        UrlError::Shape => shape(),
        UrlError::Invalid(why) => format!("invalid URL {}: {why}", found(item)),
    })?;
    match u.scheme.as_str() {
        "http" => {}
        "https" => {
            return Err(format!(
                "https is not supported for the OTLP exporter (plain HTTP only: send to a collector on loopback or a private network), found {}",
                found(item)
            ))
        }
        _ => return Err(shape()),
    }
    if u.userinfo.is_some() || u.query.is_some() || u.fragment.is_some() {
        return Err(format!(
            "an OTLP endpoint has no user info, query or fragment, found {}",
            found(item)
        ));
    }
    if u.path.ends_with("/v1/traces") {
        return Err(format!(
            "give the receiver's base URL; the gateway adds /v1/traces itself, found {}",
            found(item)
        ));
    }
    let port = u.port.map(|p| format!(":{p}")).unwrap_or_default();
    Ok(format!(
        "http://{}{port}{}",
        u.host,
        u.path.trim_end_matches('/')
    ))
}

/// Route defaults: the cascade policy and the largest lease TTL accepted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Defaults {
    cascade: CascadePolicy,
    max_lease_ttl: Duration,
    /// `leases.tick`, which imposed leases' renewals wait for.
    tick: Duration,
}

const MIN_LEASE_TTL: Duration = Duration::from_secs(1);
/// The longest lease a route may allow: the Redis store keeps a task record
/// 24 h after its last write, and a lease that outlived its record would
/// lapse unseen.
pub(crate) const MAX_LEASE_TTL: Duration = Duration::from_secs(12 * 3600);

/// `max_lease_ttl` within 1s..=12h.
fn max_lease_ttl(r: &mut Reader<'_>, default: Duration) -> Duration {
    let max_ttl = r.or("max_lease_ttl", default, duration);
    let problem = if max_ttl < MIN_LEASE_TTL {
        "must be at least 1s (the shortest lease the extension allows)"
    } else if max_ttl > MAX_LEASE_TTL {
        "must be at most 12h (a lease must lapse while the store still keeps its task)"
    } else {
        return max_ttl;
    };
    if r.has("max_lease_ttl") {
        let at = r.pos("max_lease_ttl");
        r.report_at(at, "max_lease_ttl", problem);
    }
    max_ttl
}

fn lease_policy(r: &mut Reader<'_>, d: &Defaults) -> LeasePolicy {
    let max_ttl = max_lease_ttl(r, d.max_lease_ttl);
    let worker_leases = r.or(
        "worker_leases",
        WorkerLeases::Auto,
        one_of(&[
            ("auto", WorkerLeases::Auto),
            ("enforce", WorkerLeases::Enforce),
            ("observe", WorkerLeases::Observe),
        ]),
    );
    let present = r.has("lease");
    let mut sub = r.section("lease");
    let impose_ttl = if present {
        let ttl = sub.required("ttl", duration);
        if let Some(t) = ttl {
            if t < MIN_LEASE_TTL || t > max_ttl {
                let at = sub.pos("ttl");
                sub.report_at(
                    at,
                    "ttl",
                    format!("must be between 1s and max_lease_ttl ({max_ttl:?})"),
                );
            } else if t < 3 * d.tick {
                // Renewals are due every TTL/3 and go out on the next tick.
                let at = sub.pos("ttl");
                sub.report_at(
                    at,
                    "ttl",
                    format!(
                        "must be at least 3 x leases.tick ({:?}), or its renewals may come after it lapsed",
                        3 * d.tick
                    ),
                );
            }
        }
        ttl
    } else {
        None
    };
    sub.finish();
    let poll_ttl = r.opt("poll_lease", duration);
    if poll_ttl.is_some_and(|t| !(MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&t)) {
        let at = r.pos("poll_lease");
        r.report_at(
            at,
            "poll_lease",
            "must be between 1s and 12h (a lease must lapse while the store still keeps its task)",
        );
    }
    LeasePolicy {
        max_ttl,
        impose_ttl,
        poll_ttl,
        worker_leases,
    }
}

fn server(mut r: Reader<'_>, env: Env<'_>) -> Server {
    let d = Server::default();
    // With TLS listeners, the plain ones may be none.
    let with_tls = r.has("tls");
    let listen = r.or("listen", d.listen, |item| listen(item, with_tls));
    let public_url = r.opt("public_url", public_url);
    let admin = r.opt("admin", socket_addr);
    if admin.is_some_and(|a| listen.contains(&a)) {
        let at = r.pos("admin");
        r.report_at(
            at,
            "admin",
            "the admin listener must not share an address with listen",
        );
    }
    let admin_token = admin_token(&mut r, env);
    if let Some(a) = admin.filter(|a| crate::admin_needs_token(*a) && admin_token.is_none()) {
        let at = r.pos("admin");
        r.report_at(
            at,
            "admin",
            format!(
                "{a} is not a loopback address: an admin listener others can reach needs admin_token_env or admin_token_file"
            ),
        );
    }
    let threads = r.or("threads", d.threads, int_in(1..=256));
    let read_buffer = r.or("read_buffer", d.read_buffer, size_in(0..=MIB));
    let log_format = r.or(
        "log_format",
        d.log_format,
        one_of(&[("text", LogFormat::Text), ("json", LogFormat::Json)]),
    );
    let access_log = r.or("access_log", d.access_log, boolean);
    let log_flush = r.or("log_flush", d.log_flush, |item: &Item| {
        let d = duration(item)?;
        if d > Duration::from_secs(60) {
            return Err(format!("must be at most 1m, found {}", found(item)));
        }
        Ok(d)
    });
    let tls_reader = r.section("tls");
    let tls = if with_tls {
        server_tls(tls_reader, env, &listen, admin)
    } else {
        None
    };
    r.finish();
    Server {
        listen,
        public_url,
        admin,
        admin_token,
        threads,
        read_buffer,
        tls,
        log_format,
        access_log,
        log_flush,
    }
}

/// `admin_token_env` (an environment variable's name) or `admin_token_file`
/// (a file holding the token; one trailing newline dropped), never both.
/// Errors never echo the token.
fn admin_token(r: &mut Reader<'_>, env: Env<'_>) -> Option<crate::Secret> {
    fn token(s: &str, from: &str) -> Result<crate::Secret, String> {
        if s.len() < 16 {
            return Err(format!(
                "{from}: the admin token is shorter than 16 characters"
            ));
        }
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{from}: the admin token has spaces, control or non-ASCII characters"
            ));
        }
        Ok(crate::Secret(s.to_owned()))
    }
    secret(r, env, ("admin_token_env", "admin_token_file"), token)
}

/// A secret from `keys.0` (an environment variable's name) or `keys.1` (a
/// file holding it; one trailing newline dropped), never both, checked by
/// `check(value, where_from)`. Errors never echo the secret.
fn secret(
    r: &mut Reader<'_>,
    env: Env<'_>,
    (env_key, file_key): (&'static str, &'static str),
    check: fn(&str, &str) -> Result<crate::Secret, String>,
) -> Option<crate::Secret> {
    let from_env = r.opt(env_key, |item| {
        let var = string(item)?;
        if var.is_empty() || var.contains(['=', '\0']) {
            return Err(format!("{var:?} is not an environment variable name"));
        }
        let value =
            (env.env)(var).ok_or_else(|| format!("environment variable {var} is not set"))?;
        check(&value, &format!("environment variable {var}"))
    });
    let from_file = r.opt(file_key, |item| {
        let path = config_path(string(item)?, env)?;
        let shown = path.display();
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let text = text.strip_suffix('\n').unwrap_or(&text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        check(text, &shown.to_string())
    });
    if r.has(env_key) && r.has(file_key) {
        let at = r.pos(file_key);
        r.report_at(
            at,
            file_key,
            format!("give {env_key} or {file_key}, not both"),
        );
    }
    from_env.or(from_file)
}

/// `[server.tls]`: its listeners (none shared with `listen` or `admin`), and
/// the certificate chain and key, each file read and parsed here.
fn server_tls(
    mut r: Reader<'_>,
    env: Env<'_>,
    plain: &[SocketAddr],
    admin: Option<SocketAddr>,
) -> Option<ServerTls> {
    let listen = r.required("listen", |item| listen(item, false));
    if let Some(shared) = listen
        .iter()
        .flatten()
        .find(|a| plain.contains(a) || admin == Some(**a))
    {
        let at = r.pos("listen");
        r.report_at(
            at,
            "listen",
            format!("{shared} is also a plain listener (server.listen or server.admin)"),
        );
    }
    let cert = r.required("cert", |item| pem_file(item, env, read_certificates));
    let key = r.required("key", |item| pem_file(item, env, read_private_key));
    r.finish();
    Some(ServerTls {
        listen: listen?,
        cert: cert?.0,
        key: key?.0,
    })
}

fn store(mut r: Reader<'_>, env: Env<'_>) -> Store {
    let d = Store::default();
    let url = r.opt("url", store_url);
    let on_store_error = r.or(
        "on_store_error",
        d.on_store_error,
        one_of(&[
            ("fail-open", OnStoreError::FailOpen),
            ("fail-closed", OnStoreError::FailClosed),
        ]),
    );
    let password = store_password(&mut r, env);
    let tls_ca = r.opt("tls_ca_file", |item| worker_ca(item, env));
    let tls_client_cert = client_cert(&mut r, env, ["tls_client_cert", "tls_client_key"]);
    // Against the file's URL when it names one (a bad one is reported as
    // such); without it, `--store` may name it, and `Store::check` runs at
    // start.
    if let Some(kind) = &url {
        let url = match kind {
            StoreKind::Memory => "memory://",
            StoreKind::Redis { url } => url,
        };
        for (key, misfit) in [
            (
                "password_env",
                password_misfit as fn(&str) -> Option<String>,
            ),
            ("password_file", password_misfit),
            ("tls_ca_file", tls_misfit),
            ("tls_client_cert", tls_misfit),
        ] {
            if let Some(why) = r.has(key).then(|| misfit(url)).flatten() {
                let at = r.pos(key);
                r.report_at(at, key, why);
            }
        }
    }
    r.finish();
    Store {
        kind: url.unwrap_or(d.kind),
        on_store_error,
        password,
        tls_ca,
        tls_client_cert,
    }
}

/// `store.password_env` (an environment variable's name) or
/// `store.password_file` (a file holding the password; one trailing newline
/// dropped), never both. Errors never echo the password.
fn store_password(r: &mut Reader<'_>, env: Env<'_>) -> Option<crate::Secret> {
    fn password(s: &str, from: &str) -> Result<crate::Secret, String> {
        if s.is_empty() {
            return Err(format!("{from}: the password is empty"));
        }
        Ok(crate::Secret(s.to_owned()))
    }
    secret(r, env, ("password_env", "password_file"), password)
}

/// Why a password from `password_env` or `password_file` does not fit the
/// store `url` (`memory://` or a checked Redis URL), if it does not.
pub(crate) fn password_misfit(url: &str) -> Option<String> {
    if url == "memory://" {
        return Some("a password is for a Redis store; the store is memory://".into());
    }
    let cluster = crate::ClusterUrl::parse(url).and_then(Result::ok);
    let userinfo = match &cluster {
        Some(c) => c.userinfo.as_deref(),
        None => split_url(url).ok().and_then(|u| u.userinfo),
    };
    let has_password =
        userinfo.is_some_and(|i| i.split_once(':').is_some_and(|(_, p)| !p.is_empty()));
    has_password.then(|| {
        "the store URL has a password too: give it in one place (the URL, password_env or password_file)".into()
    })
}

/// Why `tls_ca_file` or `tls_client_cert` does not fit the store `url`, if
/// it does not: both are for `rediss://` only.
pub(crate) fn tls_misfit(url: &str) -> Option<String> {
    if crate::ClusterUrl::parse(url).is_some_and(|c| c.is_ok_and(|c| c.tls)) {
        return None;
    }
    let scheme = split_url(url).map_or_else(|_| "memory".to_owned(), |u| u.scheme);
    if scheme == "rediss" {
        return None;
    }
    Some(format!(
        "applies to rediss:// or rediss+cluster:// (Redis over TLS) only; the store URL is {scheme}://"
    ))
}

fn limits(mut r: Reader<'_>) -> Limits {
    let d = Limits::default();
    let limits = Limits {
        max_inspect_body: r.or(
            "max_inspect_body",
            d.max_inspect_body,
            size_in(KIB..=64 * MIB),
        ),
        max_sse_event: r.or("max_sse_event", d.max_sse_event, size_in(KIB..=64 * MIB)),
        max_card_body: r.or("max_card_body", d.max_card_body, size_in(KIB..=64 * MIB)),
        max_tracked_tasks: r.or(
            "max_tracked_tasks",
            d.max_tracked_tasks,
            int_in(1..=i64::MAX),
        ),
        max_accounts: r.or("max_accounts", d.max_accounts, int_in(1..=i64::MAX)),
        worker_h2_streams: r.or(
            "worker_h2_streams",
            d.worker_h2_streams,
            int_in(1..=crate::MAX_WORKER_H2_STREAMS as i64),
        ),
    };
    r.finish();
    limits
}

fn timeouts(mut r: Reader<'_>) -> Timeouts {
    let d = Timeouts::default();
    let idle = |item: &Item| duration(item).map(|d| Some(d).filter(|d| !d.is_zero()));
    let timeouts = Timeouts {
        connect: r.or("connect", d.connect, nonzero_duration),
        upstream_idle: r.or("upstream_idle", d.upstream_idle, idle),
        downstream_idle: r.or("downstream_idle", d.downstream_idle, idle),
        dns_refresh: r.or("dns_refresh", d.dns_refresh, nonzero_duration),
        drain: r.or("drain", d.drain, |item| -> Result<Duration, String> {
            let d = duration(item)?;
            if d > crate::MAX_DRAIN {
                return Err("must be at most 1h".into());
            }
            Ok(d)
        }),
    };
    r.finish();
    timeouts
}

fn cancel(mut r: Reader<'_>) -> Cancel {
    let d = Cancel::default();
    let cancel = Cancel {
        attempts: r.or("attempts", d.attempts, int_in(1..=100)),
        backoff: r.or("backoff", d.backoff, duration),
        backoff_max: r.or("backoff_max", d.backoff_max, duration),
        timeout: r.or("timeout", d.timeout, nonzero_duration),
    };
    if cancel.backoff_max < cancel.backoff {
        let at = r.pos("backoff_max");
        r.report_at(at, "backoff_max", "must be at least backoff");
    }
    r.finish();
    cancel
}

/// The cascade keys, shared by `[defaults]` and each route.
fn cascade(r: &mut Reader<'_>, d: CascadePolicy) -> CascadePolicy {
    CascadePolicy {
        mode: r.or("cascade", d.mode, cascade_mode),
        disconnect_grace: r.or("disconnect_grace", d.disconnect_grace, duration),
        id_wait: r.or("id_wait", d.id_wait, duration),
        blocking_sends: r.or(
            "blocking_sends",
            d.blocking_sends,
            one_of(&[
                ("auto", BlockingSends::Auto),
                ("stream", BlockingSends::Stream),
                ("pass", BlockingSends::Pass),
            ]),
        ),
    }
}

fn defaults(mut r: Reader<'_>) -> Defaults {
    let cascade = cascade(&mut r, CascadePolicy::default());
    let max_lease_ttl = max_lease_ttl(&mut r, LeasePolicy::default().max_ttl);
    r.finish();
    Defaults {
        cascade,
        max_lease_ttl,
        tick: Leases::default().tick,
    }
}

/// The spellings are the policies crate's own.
fn cascade_mode(item: &Item) -> Result<CascadeMode, String> {
    let modes = [CascadeMode::Cancel, CascadeMode::Detach];
    item.as_str().and_then(CascadeMode::parse).ok_or_else(|| {
        let names: Vec<String> = modes.iter().map(|m| format!("{:?}", m.as_str())).collect();
        expected(&format!("one of {}", names.join(", ")), item)
    })
}

fn routes(
    root: &mut Reader<'_>,
    sink: &Sink<'_>,
    defaults: &Defaults,
    env: Env<'_>,
) -> Option<Vec<Route>> {
    let Some((field, readers)) = root.tables("routes") else {
        if !root.has("routes") {
            root.report_at(0, "routes", "at least one [[routes]] table is required");
        }
        return None;
    };
    if field.item.as_array().is_some_and(|a| a.is_empty()) {
        root.report(
            &field,
            Bad::from("at least one route is required".to_owned()),
        );
    }
    let mut routes = Vec::new();
    // (host, path_prefix) -> index of the first route with it
    let mut matches: HashMap<(Option<String>, Option<String>), usize> = HashMap::new();
    let mut names: HashMap<String, usize> = HashMap::new();
    // https worker host:port -> the first route naming it, its worker_ca and
    // its client certificate and key
    type Trust = (Option<PathBuf>, Option<(PathBuf, PathBuf)>);
    let mut trust: HashMap<String, (usize, Trust)> = HashMap::new();
    for (i, mut r) in readers.into_iter().enumerate() {
        let before = sink.count();
        let route = route(&mut r, defaults, env);
        if sink.count() > before {
            continue; // cross-checks on a half-read route would only add noise
        }
        let Some(route) = route else { continue };
        if let Some(&j) = names.get(&route.name) {
            let at = r.pos("name");
            r.report_at(
                at,
                "name",
                format!("duplicate route name; routes[{j}] has it too"),
            );
        } else {
            names.insert(route.name.clone(), i);
        }
        let key = (route.host.clone(), route.path_prefix.clone());
        if let Some(&j) = matches.get(&key) {
            let message = if key == (None, None) {
                format!(
                    "a second catch-all route (neither host nor path_prefix); routes[{j}] already matches everything"
                )
            } else {
                format!("same host and path_prefix as routes[{j}]; one of them could never match")
            };
            r.table_error(message);
        } else {
            matches.insert(key, i);
        }
        // One worker, one trust: the proxy and the gateway's cancels reach a
        // worker by its host:port, whichever route named it.
        for worker in route.workers.iter().filter(|w| w.tls) {
            let here = (
                route.worker_ca.as_ref().map(|c| c.path.clone()),
                route
                    .worker_client_cert
                    .as_ref()
                    .map(|c| (c.cert_path.clone(), c.key_path.clone())),
            );
            match trust.entry(worker.authority()) {
                hash_map::Entry::Occupied(e) => {
                    let (j, first) = e.get();
                    if *first != here {
                        let key = if first.0 != here.0 {
                            "worker_ca"
                        } else {
                            "worker_client_cert"
                        };
                        let at = r.pos(key);
                        r.report_at(
                            at,
                            key,
                            format!(
                                "routes[{j}] reaches the same worker ({}) with a different {key}; give both the same",
                                worker.authority()
                            ),
                        );
                    }
                }
                hash_map::Entry::Vacant(e) => {
                    e.insert((i, here));
                }
            }
        }
        routes.push(route);
    }
    Some(routes)
}

/// One `[[routes]]` table. Add a route key here: one line reading it, one
/// field on [`Route`].
fn route(r: &mut Reader<'_>, defaults: &Defaults, env: Env<'_>) -> Option<Route> {
    let name = r.required("name", route_name);
    let (worker, workers) = replicas(r);
    let worker_addresses = r.or(
        "worker_addresses",
        crate::WorkerAddresses::First,
        one_of(&[
            ("first", crate::WorkerAddresses::First),
            ("all", crate::WorkerAddresses::All),
        ]),
    );
    let health_interval = r.or("health_interval", crate::DEFAULT_HEALTH_INTERVAL, |item| {
        let d = duration(item)?;
        if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&d) {
            return Err(format!(
                "must be between 100ms and 1h, found {}",
                found(item)
            ));
        }
        Ok(d)
    });
    let path_prefix = r.opt("path_prefix", path_prefix);
    let host = r.opt("host", route_host);
    let strip_prefix = r.or("strip_prefix", true, boolean);
    let cascade = cascade(r, defaults.cascade);
    let worker_credential = credential(r, env);
    let worker_ca = r.opt("worker_ca", |item| worker_ca(item, env));
    let worker_client_cert = client_cert(r, env, ["worker_client_cert", "worker_client_key"]);
    let plain = worker.as_ref().is_some_and(|w| !w.tls);
    for (key, given) in [
        ("worker_ca", worker_ca.is_some()),
        ("worker_client_cert", worker_client_cert.is_some()),
    ] {
        if given && plain {
            let at = r.pos(key);
            r.report_at(
                at,
                key,
                format!("{key} applies to https workers only; this route's worker is http"),
            );
        }
    }
    let lease = lease_policy(r, defaults);
    if lease.poll_ttl.is_some() && cascade.mode == CascadeMode::Detach {
        let at = r.pos("poll_lease");
        r.report_at(
            at,
            "poll_lease",
            "cancels the tasks whose callers stopped polling, which cascade = \"detach\" never does: set cascade = \"cancel\" on this route, or remove poll_lease",
        );
    }
    let headers = header_policy(r);
    let grpc_pass_services = r.or("grpc_pass_services", Vec::new(), grpc_services);
    let auth = crate::auth::auth_policy(r, env);
    let binds_tenants = auth.as_ref().is_some_and(|a| a.tenants.is_some());
    let budget = budget_policy(r, auth.is_some(), binds_tenants);
    let on_parent_completed = r.or(
        "on_parent_completed",
        policies::delegation::OnParentCompleted::Keep,
        one_of(&[
            ("keep", policies::delegation::OnParentCompleted::Keep),
            ("cancel", policies::delegation::OnParentCompleted::Cancel),
        ]),
    );
    r.finish();
    Some(Route {
        name: name?,
        worker: worker?,
        workers: workers?,
        health_interval,
        worker_addresses,
        path_prefix,
        host,
        strip_prefix,
        cascade,
        worker_credential,
        worker_ca,
        worker_client_cert,
        lease,
        headers,
        budget,
        auth,
        grpc_pass_services,
        on_parent_completed,
    })
}

/// `worker` or `workers` (not both): the worker and its replicas. The
/// replicas of one route serve one agent: the same scheme and base path,
/// each its own `host:port`.
fn replicas(r: &mut Reader<'_>) -> (Option<WorkerUrl>, Option<Vec<WorkerUrl>>) {
    let parse = |item: &Item| WorkerUrl::parse(string(item)?);
    let worker = if r.has("workers") {
        r.opt("worker", parse)
    } else {
        r.required("worker", parse)
    };
    let list = r.opt("workers", |item| {
        let list = item
            .as_array()
            .ok_or_else(|| expected("an array of worker URLs", item))?;
        if list.is_empty() {
            return Err("names no worker; expected at least one URL".to_string());
        }
        let mut out: Vec<WorkerUrl> = Vec::new();
        for v in list {
            let url = WorkerUrl::parse(
                v.as_str()
                    .ok_or_else(|| format!("expected a worker URL string, found {v}"))?,
            )?;
            if let Some(first) = out.first() {
                if (first.tls, &first.base_path) != (url.tls, &url.base_path) {
                    return Err(format!(
                        "the replicas of one worker share its scheme and base path: {} differs from {}",
                        url.authority(),
                        first.authority()
                    ));
                }
            }
            if out.iter().any(|w| w.authority() == url.authority()) {
                return Err(format!("{} is named twice", url.authority()));
            }
            out.push(url);
        }
        Ok(out)
    });
    if r.has("worker") && r.has("workers") {
        let at = r.pos("workers");
        r.report_at(
            at,
            "workers",
            "give worker (one) or workers (its replicas), not both",
        );
        return (None, None);
    }
    match list {
        Some(list) => (list.first().cloned(), Some(list)),
        None => (worker.clone(), worker.map(|w| vec![w])),
    }
}

/// `grpc_pass_services`: fully qualified gRPC service names
/// (`grpc.health.v1.Health`), never the A2A service, which is read.
fn grpc_services(item: &Item) -> Result<Vec<String>, String> {
    let list = item
        .as_array()
        .ok_or_else(|| expected("an array of gRPC service names", item))?;
    let mut out: Vec<String> = Vec::new();
    for v in list {
        let name = v
            .as_str()
            .ok_or_else(|| format!("expected a gRPC service name string, found {v}"))?;
        let ok = !name.is_empty()
            && name.len() <= 256
            && name.split('.').all(|part| {
                !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            });
        if !ok {
            return Err(format!(
                "{name:?} is not a gRPC service name (dotted identifiers: grpc.health.v1.Health)"
            ));
        }
        if name == "lf.a2a.v1.A2AService" {
            return Err("the A2A service is read, never passed unread".into());
        }
        if !out.iter().any(|s| s == name) {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// A client certificate and its key (`worker_client_cert` and
/// `worker_client_key`, or the store's `tls_client_cert` and
/// `tls_client_key`, as `keys` names them): both or neither.
fn client_cert(
    r: &mut Reader<'_>,
    env: Env<'_>,
    [cert_key, key_key]: [&'static str; 2],
) -> Option<ClientCert> {
    let cert = r.opt(cert_key, |item| pem_file(item, env, read_certificates));
    let key = r.opt(key_key, |item| pem_file(item, env, read_private_key));
    for (given, missing) in [(cert_key, key_key), (key_key, cert_key)] {
        if r.has(given) && !r.has(missing) {
            let at = r.pos(given);
            r.report_at(at, given, format!("give {missing} too"));
        }
    }
    let ((cert_path, certs), (key_path, key)) = (cert?, key?);
    Some(ClientCert {
        cert_path,
        key_path,
        certs,
        key,
    })
}

/// A `worker_ca` file: PEM `CERTIFICATE` blocks, each a parseable X.509
/// certificate (pingora's wrapper panics on one that is not, where the
/// gateway builds its routes) and a trust anchor rustls accepts (else every
/// connection to the worker would fail on it).
fn worker_ca(item: &Item, env: Env<'_>) -> Result<WorkerCa, String> {
    let (path, certs) = pem_file(item, env, read_certificates)?;
    for (i, der) in certs.iter().enumerate() {
        let der = rustls_pki_types::CertificateDer::from(der.as_slice());
        if let Err(e) = webpki::anchor_from_trusted_cert(&der) {
            return Err(format!(
                "{}: certificate {} cannot be a trust anchor: {e}",
                path.display(),
                i + 1
            ));
        }
    }
    Ok(WorkerCa { path, certs })
}

/// A PEM file the config names (a path string), located by [`config_path`]
/// and read by `read`: the path and what was read.
fn pem_file<T>(
    item: &Item,
    env: Env<'_>,
    read: fn(&Path) -> Result<T, String>,
) -> Result<(PathBuf, T), String> {
    let path = config_path(string(item)?, env)?;
    let read = read(&path)?;
    Ok((path, read))
}

/// A path the file names: relative ones start at the config file's
/// directory.
pub(crate) fn config_path(path: &str, env: Env<'_>) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Err("expected the path of a PEM file, found an empty string".into());
    }
    Ok(match env.dir {
        Some(dir) if Path::new(path).is_relative() => dir.join(path),
        _ => Path::new(path).to_path_buf(),
    })
}

/// The certificates of a PEM file, DER-encoded: at least one, each a
/// parseable X.509 certificate.
fn read_certificates(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut certs = Vec::new();
    for (i, block) in pem_certificates(&pem).enumerate() {
        let der = block.map_err(|e| format!("{shown}: certificate {}: {e}", i + 1))?;
        if let Err(e) = x509_parser::parse_x509_certificate(&der) {
            return Err(format!(
                "{shown}: certificate {} is not an X.509 certificate: {e}",
                i + 1
            ));
        }
        certs.push(der);
    }
    if certs.is_empty() {
        return Err(format!(
            "{shown} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file, DER, in a form pingora can read (it
/// unwraps its own conversion of these bytes).
fn read_private_key(path: &Path) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let der = PrivateKeyDer::from_pem_slice(&pem)
        .map(|k| k.secret_der().to_vec())
        .map_err(|e| format!("{shown} holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"))?;
    PrivateKeyDer::try_from(der.clone())
        .map_err(|e| format!("{shown}: the private key cannot be read back: {e}"))?;
    Ok(der)
}

/// The DER of each `CERTIFICATE` block of a PEM text (other blocks, such as
/// keys, are skipped).
fn pem_certificates(pem: &[u8]) -> impl Iterator<Item = Result<Vec<u8>, String>> + '_ {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::pem_slice_iter(pem)
        .map(|c| c.map(|c| c.to_vec()).map_err(|e| format!("bad PEM: {e}")))
}

/// The shortest and longest `max_deadline`.
const MIN_DEADLINE: Duration = Duration::from_millis(10);
const MAX_DEADLINE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The shortest and longest account `window`.
const MIN_WINDOW: Duration = Duration::from_secs(1);
const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);
/// Why a `caller_header` is needed, for errors about its absence.
const NEEDS_CALLER_HEADER: &str =
    "needs caller_header, the header whose value names the caller (or [routes.auth])";

/// Why tenant caps and accounts need tenants bound to identities.
const NEEDS_TENANT_BINDING: &str = "[routes.auth] with tenants (which verified identities may name which tenant): without it a caller names any tenant, or none, and escapes it";

/// `[routes.budget]`: caps, tenants' and callers' caps, and accounts.
/// `authenticated`: the route has `[routes.auth]`, whose verified identity
/// names the caller (then `caller_header` is refused). `binds_tenants`:
/// its `tenants` says which identity may name which tenant, which tenant
/// caps and accounts need.
fn budget_policy(r: &mut Reader<'_>, authenticated: bool, binds_tenants: bool) -> BudgetPolicy {
    let mut b = r.section("budget");
    let caps = caps(&mut b);
    let over_cap = b.or("over_cap", OverCap::Clamp, over_cap);
    let caller_header = b.opt("caller_header", caller_header);
    if authenticated && b.has("caller_header") {
        let at = b.pos("caller_header");
        b.report_at(
            at,
            "caller_header",
            "this route has [routes.auth], whose verified identity names the caller: remove caller_header",
        );
    }
    // A bad caller_header is reported as such; only a missing one makes
    // `callers` and `per = "caller"` errors too.
    let has_caller_header = b.has("caller_header") || authenticated;
    let tenants_at = b.has("tenants").then(|| b.pos("tenants"));
    let tenants = named_caps(b.section("tenants"), tenant_name, |_, name| {
        key_segment(name)
    });
    if let (Some(at), false, false) = (tenants_at, tenants.is_empty(), binds_tenants) {
        b.report_at(
            at,
            "tenants",
            format!("tenant caps need {NEEDS_TENANT_BINDING}"),
        );
    }
    if b.has("callers") && !has_caller_header {
        let at = b.pos("callers");
        b.report_at(at, "callers", format!("callers {NEEDS_CALLER_HEADER}"));
    }
    // Caller keys are often API keys: paths name them by position only.
    let callers = named_caps(b.section("callers"), caller_key, |i, _| format!("[{i}]"));
    let accounts = accounts(&mut b, has_caller_header, binds_tenants);
    b.finish();
    BudgetPolicy {
        caps,
        over_cap,
        caller_header,
        tenants,
        callers,
        accounts,
    }
}

/// `max_deadline` and `meters`: the caps of a route, a tenant or a caller.
fn caps(r: &mut Reader<'_>) -> Caps {
    let max_deadline_ms = r.opt("max_deadline", max_deadline);
    let meters = r.opt("meters", meters(0)).map(meter_map);
    Caps {
        max_deadline_ms,
        meters: meters.unwrap_or_default(),
    }
}

/// `tenants` or `callers`: a table of caps tables by name. `check_name`
/// says what is wrong with a name (without echoing it); `segment` names an
/// entry in paths.
fn named_caps(
    r: Reader<'_>,
    check_name: fn(&str) -> Result<(), String>,
    segment: impl Fn(usize, &str) -> String,
) -> BTreeMap<String, Caps> {
    let mut out = BTreeMap::new();
    for Entry { name, mut reader } in r.entries(segment) {
        if let Err(message) = check_name(name) {
            reader.table_error(message);
        }
        // A table with only unknown keys gets those reported instead.
        if reader.is_empty() {
            reader.table_error("names no cap; give max_deadline, meters or both");
        }
        let caps = caps(&mut reader);
        reader.finish();
        out.insert(name.to_owned(), caps);
    }
    out
}

fn tenant_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a tenant name cannot be empty".into());
    }
    Ok(())
}

/// A caller key is compared with the value of `caller_header`, so it must
/// be one that can arrive. Errors never echo it.
fn caller_key(key: &str) -> Result<(), String> {
    let ok = !key.is_empty() && key.trim() == key && http::HeaderValue::from_str(key).is_ok();
    if !ok {
        return Err(
            "a caller key is a value of caller_header: not empty, visible ASCII, \
             no leading or trailing spaces"
                .into(),
        );
    }
    Ok(())
}

/// `[[routes.budget.accounts]]`. `has_caller_header`: whether the budget
/// table names a `caller_header` (good or bad); `binds_tenants`: whether
/// `[routes.auth] tenants` binds tenants to identities.
fn accounts(
    b: &mut Reader<'_>,
    has_caller_header: bool,
    binds_tenants: bool,
) -> Vec<AccountPolicy> {
    let Some((_, readers)) = b.tables("accounts") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // (per, meter) -> index of the first account that limits it
    let mut limited: HashMap<(AccountScope, String), usize> = HashMap::new();
    for (i, mut a) in readers.into_iter().enumerate() {
        let per = a.required(
            "per",
            one_of(&[
                ("route", AccountScope::Route),
                ("tenant", AccountScope::Tenant),
                ("caller", AccountScope::Caller),
            ]),
        );
        if per == Some(AccountScope::Caller) && !has_caller_header {
            let at = a.pos("per");
            a.report_at(at, "per", format!("per = \"caller\" {NEEDS_CALLER_HEADER}"));
        }
        if per == Some(AccountScope::Tenant) && !binds_tenants {
            let at = a.pos("per");
            a.report_at(
                at,
                "per",
                format!("per = \"tenant\" needs {NEEDS_TENANT_BINDING}"),
            );
        }
        let window = a.required("window", window);
        let meters = a.required("meters", meters(1));
        a.finish();
        let (Some(per), Some(window), Some(meters)) = (per, window, meters) else {
            continue;
        };
        for m in &meters {
            match limited.entry((per, m.name.clone())) {
                hash_map::Entry::Occupied(first) => {
                    let at = m.at.unwrap_or_else(|| a.pos("meters"));
                    a.report_at(
                        at,
                        &format!("meters{}", key_segment(&m.name)),
                        format!(
                            "an account per {} already limits {:?} (accounts[{}])",
                            per.as_str(),
                            m.name,
                            first.get()
                        ),
                    );
                }
                hash_map::Entry::Vacant(slot) => {
                    slot.insert(i);
                }
            }
        }
        out.push(AccountPolicy {
            per,
            window,
            meters: meter_map(meters),
        });
    }
    out
}

/// A duration from 10ms to 30 days, in milliseconds.
fn max_deadline(item: &Item) -> Result<u64, String> {
    let d = duration(item)?;
    if !(MIN_DEADLINE..=MAX_DEADLINE).contains(&d) {
        return Err(format!(
            "must be between 10ms and 720h (30 days), found {}",
            found(item)
        ));
    }
    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A duration from 1s to 366 days.
fn window(item: &Item) -> Result<Duration, String> {
    let d = duration(item)?;
    if !(MIN_WINDOW..=MAX_WINDOW).contains(&d) {
        return Err(format!(
            "must be between 1s and 8784h (366 days), found {}",
            found(item)
        ));
    }
    Ok(d)
}

/// The spellings are the policies crate's own.
fn over_cap(item: &Item) -> Result<OverCap, String> {
    let modes = [OverCap::Clamp, OverCap::Refuse];
    item.as_str().and_then(OverCap::parse).ok_or_else(|| {
        let names: Vec<String> = modes.iter().map(|m| format!("{:?}", m.as_str())).collect();
        expected(&format!("one of {}", names.join(", ")), item)
    })
}

/// A header name, lower-cased; not one the proxy manages per connection.
fn caller_header(item: &Item) -> Result<String, String> {
    let s = string(item)?;
    let name = http::HeaderName::from_bytes(s.as_bytes())
        .map_err(|_| format!("{s:?} is not a header name"))?;
    if is_hop_header(name.as_str()) {
        return Err(format!("{s}: a hop-by-hop header cannot name the caller"));
    }
    Ok(name.as_str().to_owned())
}

/// One `name = amount` of a `meters` table, with where its value is.
struct Meter {
    name: String,
    amount: u64,
    at: Option<usize>,
}

fn meter_map(meters: Vec<Meter>) -> BTreeMap<String, u64> {
    meters.into_iter().map(|m| (m.name, m.amount)).collect()
}

/// `meters = { tokens = 50000 }`: 1 to [`MAX_METERS`] meters, each a valid
/// meter name with an integer amount of at least `min`. Each problem is
/// reported at its own key or value.
fn meters(min: i64) -> impl Fn(&Item) -> Result<Vec<Meter>, Bad> {
    move |item| {
        let table = item.as_table_like().ok_or_else(|| {
            expected(
                "a table of meter names to amounts, like { tokens = 1000 }",
                item,
            )
        })?;
        if table.is_empty() {
            return Err(Bad::from(
                "names no meter; expected at least one, like { tokens = 1000 }".to_owned(),
            ));
        }
        if table.len() > MAX_METERS {
            return Err(Bad::from(format!(
                "at most {MAX_METERS} meters, found {}",
                table.len()
            )));
        }
        let mut out = Vec::new();
        let mut problems = Vec::new();
        for (name, value) in table.iter() {
            let key_at = table
                .get_key_value(name)
                .and_then(|(k, _)| k.span())
                .map(|s| s.start);
            let at = value.span().map(|s| s.start).or(key_at);
            if !is_meter_name(name) {
                problems.push(Problem {
                    at: key_at,
                    sub: String::new(),
                    message: format!(
                        "{name:?} is not a meter name (1 to {MAX_METER_NAME_LEN} of a-z, 0-9, '.', '_' and '-')"
                    ),
                });
                continue;
            }
            let amount = if value.is_table_like() {
                Err(format!(
                    "{}; quote a meter name with dots: \"gpu.seconds\" = 10",
                    expected("an integer", value)
                ))
            } else {
                int_in(min..=i64::MAX)(value)
            };
            match amount {
                Ok(amount) => out.push(Meter {
                    name: name.to_owned(),
                    amount,
                    at,
                }),
                Err(message) => problems.push(Problem {
                    at,
                    sub: key_segment(name),
                    message,
                }),
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(Bad(problems))
        }
    }
}

/// `inject_extensions`, `inject_headers`, `strip_headers`, `cancel_headers`.
fn header_policy(r: &mut Reader<'_>) -> HeaderPolicy {
    let inject_extensions = r.or("inject_extensions", Vec::new(), |item| {
        let list = item
            .as_array()
            .ok_or_else(|| expected("an array of extension URIs", item))?;
        let mut out: Vec<String> = Vec::new();
        for v in list {
            let uri = v
                .as_str()
                .ok_or_else(|| format!("expected an extension URI string, found {v}"))?;
            let ok =
                !uri.is_empty() && !uri.contains([',', ' ', '\t', '\r', '\n']) && uri.is_ascii();
            if !ok {
                return Err(format!(
                    "{uri:?} is not an extension URI (no commas, spaces or non-ASCII)"
                ));
            }
            if !out.iter().any(|u| u.eq_ignore_ascii_case(uri)) {
                out.push(uri.to_string());
            }
        }
        Ok(out)
    });
    let inject_headers = r.or("inject_headers", Vec::new(), |item| {
        let table = item
            .as_table_like()
            .ok_or_else(|| expected("a table of header names to values", item))?;
        let mut out = Vec::new();
        for (k, v) in table.iter() {
            let name = http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("{k:?} is not a header name"))?;
            let value = v
                .as_str()
                .ok_or_else(|| format!("{k}: expected a string value"))?;
            http::HeaderValue::from_str(value)
                .map_err(|_| format!("{k}: not a valid header value"))?;
            if is_hop_header(name.as_str()) {
                return Err(format!("{k}: a hop-by-hop header cannot be injected"));
            }
            out.push((name.as_str().to_string(), value.to_string()));
        }
        Ok(out)
    });
    let strip_headers = r.or("strip_headers", Vec::new(), |item| {
        header_names(item, |name| {
            is_hop_header(name).then_some("a hop-by-hop header cannot be stripped here")
        })
    });
    let cancel_headers = r.or(
        "cancel_headers",
        HeaderPolicy::default().cancel_headers,
        |item| {
            header_names(item, |name| {
                (is_hop_header(name) || is_cancel_header(name))
                    .then_some("the gateway sets this header on its own CancelTask")
            })
        },
    );
    HeaderPolicy {
        inject_extensions,
        inject_headers,
        strip_headers,
        cancel_headers,
    }
}

/// Headers the gateway writes itself on its `CancelTask` (the credential
/// comes from the caller or `worker_credential`).
fn is_cancel_header(name: &str) -> bool {
    matches!(
        name,
        "authorization" | "content-type" | "accept" | "a2a-version"
    )
}

/// An array of header names, lower-cased and without repeats; `refuse`
/// says why a (lower-case) name may not be listed.
fn header_names(
    item: &Item,
    refuse: impl Fn(&str) -> Option<&'static str>,
) -> Result<Vec<String>, String> {
    let list = item
        .as_array()
        .ok_or_else(|| expected("an array of header names", item))?;
    let mut out: Vec<String> = Vec::new();
    for v in list {
        let k = v
            .as_str()
            .ok_or_else(|| format!("expected a header name string, found {v}"))?;
        let name = http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("{k:?} is not a header name"))?;
        if let Some(why) = refuse(name.as_str()) {
            return Err(format!("{k}: {why}"));
        }
        if !out.iter().any(|n| n == name.as_str()) {
            out.push(name.as_str().to_string());
        }
    }
    Ok(out)
}

/// Headers the proxy itself manages per connection.
fn is_hop_header(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "upgrade"
            | "host"
            | "content-length"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "keep-alive"
    )
}

/// `worker_credential` or `worker_credential_env` (never both).
fn credential(r: &mut Reader<'_>, env: Env<'_>) -> Option<String> {
    let literal = r.opt("worker_credential", |item| header_value(string(item)?));
    let from_env = r.opt("worker_credential_env", |item| {
        let var = string(item)?;
        if var.is_empty() || var.contains(['=', '\0']) {
            return Err(format!("{var:?} is not an environment variable name"));
        }
        let value =
            (env.env)(var).ok_or_else(|| format!("environment variable {var} is not set"))?;
        header_value(&value).map_err(|e| format!("environment variable {var}: {e}"))
    });
    let both = r.has("worker_credential") && r.has("worker_credential_env");
    if both {
        let at = r.pos("worker_credential_env");
        r.report_at(
            at,
            "worker_credential_env",
            "give worker_credential or worker_credential_env, not both",
        );
    }
    literal.or(from_env)
}

/// A credential must be a valid `Authorization` value. Errors never echo it.
fn header_value(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the credential is empty".into());
    }
    http::HeaderValue::from_str(s).map_err(|_| {
        "the credential is not a valid HTTP header value (control characters or non-ASCII)"
            .to_owned()
    })?;
    Ok(s.to_owned())
}

fn route_name(item: &Item) -> Result<String, String> {
    let s = string(item)?;
    let ok = (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !ok {
        return Err(format!(
            "a route name is 1 to 64 of a-z, 0-9, '_' and '-', found {}",
            found(item)
        ));
    }
    Ok(s.to_owned())
}

fn path_prefix(item: &Item) -> Result<String, String> {
    let s = string(item)?;
    let why = if s == "/" {
        "\"/\" matches every path; leave path_prefix out for a catch-all route"
    } else if !s.starts_with('/') {
        "a path prefix starts with '/'"
    } else if s.ends_with('/') {
        "a path prefix does not end with '/'"
    } else if s.contains(['?', '#']) {
        "a path prefix has no '?' or '#'"
    } else if s.chars().any(|c| !c.is_ascii_graphic()) {
        "a path prefix has no spaces, control or non-ASCII characters (percent-encode them)"
    } else {
        return Ok(s.to_owned());
    };
    Err(format!("{why}, found {}", found(item)))
}

/// A host name or IP address without a port, lowercased.
fn route_host(item: &Item) -> Result<String, String> {
    let s = string(item)?;
    let v6 = s
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok());
    let name = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if v6 || name {
        return Ok(s.to_ascii_lowercase());
    }
    let why = if s.contains(':') && !s.starts_with('[') {
        "host is matched without its port; leave the port out"
    } else {
        "expected a host name or IP address"
    };
    Err(format!("{why}, found {}", found(item)))
}

fn socket_addr(item: &Item) -> Result<SocketAddr, String> {
    let s = string(item)?;
    let addr: SocketAddr = s.parse().map_err(|_| {
        format!(
            "expected an IP address and port like \"127.0.0.1:8080\" or \"[::]:8080\", found {}",
            found(item)
        )
    })?;
    crate::known_port(addr).map_err(|why| format!("{why}, found {}", found(item)))
}

/// One address or an array of them; an empty array only when `may_be_empty`
/// (plain listeners beside TLS ones).
fn listen(item: &Item, may_be_empty: bool) -> Result<Vec<SocketAddr>, Bad> {
    let Some(array) = item.as_array() else {
        if !item.is_str() {
            let what = "an address like \"127.0.0.1:8080\" or an array of them";
            return Err(expected(what, item).into());
        }
        return Ok(vec![socket_addr(item)?]);
    };
    if array.is_empty() && !may_be_empty {
        return Err(Bad::from("expected at least one address".to_owned()));
    }
    let mut addrs = Vec::new();
    let mut problems = Vec::new();
    for (i, v) in array.iter().enumerate() {
        let at = v.span().map(|s| s.start);
        let sub = format!("[{i}]");
        match socket_addr(&Item::Value(v.clone())) {
            Ok(a) if addrs.contains(&a) => problems.push(Problem {
                at,
                sub,
                message: format!("{a} is listed twice"),
            }),
            Ok(a) => addrs.push(a),
            Err(message) => problems.push(Problem { at, sub, message }),
        }
    }
    if problems.is_empty() {
        Ok(addrs)
    } else {
        Err(Bad(problems))
    }
}

/// An http(s) base URL, normalised and without a trailing `/`.
fn public_url(item: &Item) -> Result<String, String> {
    let s = string(item)?;
    let shape = || expected("an http or https URL with a host", item);
    let u = split_url(s).map_err(|e| match e {
        UrlError::Shape => shape(),
        UrlError::Invalid(why) => format!("invalid URL {}: {why}", found(item)),
    })?;
    if !matches!(u.scheme.as_str(), "http" | "https") {
        return Err(shape());
    }
    if u.userinfo.is_some() || u.query.is_some() || u.fragment.is_some() {
        return Err(format!(
            "a public URL has no user info, query or fragment, found {}",
            found(item)
        ));
    }
    let port = u.port.map(|p| format!(":{p}")).unwrap_or_default();
    Ok(format!(
        "{}://{}{port}{}",
        u.scheme,
        u.host,
        u.path.trim_end_matches('/')
    ))
}

/// `memory://` or a `redis://` or `rediss://` URL. Errors show the URL
/// with its password replaced ([`crate::redact_url`]).
fn store_url(item: &Item) -> Result<StoreKind, String> {
    parse_store_url(string(item)?)
}

/// [`store_url`] of a string (`--store` too).
pub(crate) fn parse_store_url(s: &str) -> Result<StoreKind, String> {
    if s == "memory://" {
        return Ok(StoreKind::Memory);
    }
    let shown = format!("{:?}", crate::redact_url(s));
    if let Some(parsed) = crate::SentinelUrl::parse(s) {
        return parsed
            .map(|_| StoreKind::Redis { url: s.to_owned() })
            .map_err(|why| format!("invalid store URL {shown}: {why}"));
    }
    if let Some(parsed) = crate::ClusterUrl::parse(s) {
        return parsed
            .map(|_| StoreKind::Redis { url: s.to_owned() })
            .map_err(|why| format!("invalid store URL {shown}: {why}"));
    }
    let shape = || {
        format!("expected \"memory://\" or a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL, found {shown}")
    };
    let u = split_url(s).map_err(|e| match e {
        UrlError::Shape => shape(),
        UrlError::Invalid(why) => format!("invalid store URL {shown}: {why}"),
    })?;
    if !matches!(u.scheme.as_str(), "redis" | "rediss") {
        return Err(shape());
    }
    let db = u.path.trim_start_matches('/');
    if u.path.len() > 1 && (db.is_empty() || !db.bytes().all(|b| b.is_ascii_digit())) {
        return Err(format!(
            "the path of a redis URL is a database number like \"/0\", found {shown}"
        ));
    }
    if u.fragment.is_some() {
        return Err(format!("a redis URL has no fragment, found {shown}"));
    }
    Ok(StoreKind::Redis { url: s.to_owned() })
}
