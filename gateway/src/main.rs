//! The `a2a-gateway` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc unless `A2A_GATEWAY_ALLOCATOR=system` (see `allocator.rs`).
#[global_allocator]
static ALLOCATOR: a2a_gateway::allocator::Allocator = a2a_gateway::allocator::Allocator;

/// A reverse proxy that enforces A2A delegation policy in front of
/// unmodified A2A workers: cascade cancel, leases and budgets.
#[derive(Debug, Parser)]
#[command(name = "a2a-gateway", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Config file (TOML). Without one, --listen and --worker give one
    /// catch-all route with every default. Re-read on SIGHUP (and POST
    /// /reload on the admin address): see docs/operations.md.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides the config's `server.listen`).
    #[arg(long, value_parser = known_port)]
    listen: Option<SocketAddr>,
    /// The worker's URL, for running without a config file.
    #[arg(long)]
    worker: Option<String>,
    /// Admin address for /healthz, /readyz, /metrics, /tasks, /budgets and
    /// POST /reload.
    #[arg(long, value_parser = known_port)]
    admin: Option<SocketAddr>,
    /// Task store (overrides `store.url`): `memory://`, `redis://HOST:PORT/DB`,
    /// `rediss://HOST:PORT/DB` (TLS), `redis+sentinel://HOST:PORT,.../NAME`
    /// or `redis+cluster://HOST:PORT,...`.
    #[arg(long)]
    store: Option<String>,
    /// Proxy threads (overrides `server.threads`).
    #[arg(long)]
    threads: Option<usize>,
    /// Log lines on stderr: `text` or `json` (overrides `server.log_format`).
    #[arg(long, value_parser = log_format)]
    log_format: Option<config::LogFormat>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validates a config file and prints every error in it, with its location.
    CheckConfig { file: PathBuf },
    /// Asks a running gateway's admin endpoint whether it is healthy: exits 0
    /// when `/healthz` (or `/readyz` with --ready) answers 200, 1 otherwise
    /// with one line saying why. For container health checks (the image has
    /// no curl).
    Health {
        /// The admin address (`server.admin`).
        #[arg(default_value = "127.0.0.1:9090")]
        admin: SocketAddr,
        /// Ask `/readyz` (every proxy listener accepts) instead of `/healthz`.
        #[arg(long)]
        ready: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3)]
        timeout: u64,
    },
}

/// `a2a-gateway health`: one GET on the admin endpoint, blocking, no runtime.
fn health(admin: SocketAddr, path: &str, timeout: std::time::Duration) -> Result<(), String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&admin, timeout)
        .map_err(|e| format!("{admin}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("{admin}: {e}"))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .map_err(|e| format!("{admin}{path}: {e}"))?;
    // The probes' answers are a few bytes; never read more than a page.
    let mut head = Vec::new();
    s.take(4096)
        .read_to_end(&mut head)
        .map_err(|e| format!("{admin}{path}: {e}"))?;
    let text = String::from_utf8_lossy(&head);
    let status = text.split(' ').nth(1).unwrap_or("");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b.trim());
    if status == "200" {
        Ok(())
    } else if status.is_empty() {
        Err(format!("{admin}{path}: no HTTP answer"))
    } else {
        Err(format!("{admin}{path}: {status} {body}"))
    }
}

/// Starts logging to stderr in `format`, `info` and `debug` lines buffered
/// for up to `flush` (`server.log_flush`; zero: none, see `log_writer.rs`):
/// the filter from `A2A_GATEWAY_LOG`;
/// ANSI colour only when stderr is a terminal (never in a file or a
/// container's log); JSON one object per line, the event's fields at its
/// top level. When the filter enables `debug` or `trace` anywhere, every
/// line is scrubbed of credentials (pingora prints whole request heads
/// there; `redact.rs`); otherwise nothing is scanned.
fn init_logs(format: config::LogFormat, flush: std::time::Duration) {
    use a2a_gateway::log_writer::{Buffered, ToStderr, BUFFER};
    use a2a_gateway::redact::Redacting;
    let filter = tracing_subscriber::EnvFilter::try_from_env("A2A_GATEWAY_LOG")
        .unwrap_or_else(|_| "info,pingora_core=warn,pingora_proxy=warn".into());
    let redact = a2a_gateway::redact::needed(filter.max_level_hint());
    match (flush.is_zero(), redact) {
        (true, true) => install_logs(format, filter, Redacting(std::io::stderr)),
        (true, false) => install_logs(format, filter, std::io::stderr),
        (false, true) => install_logs(
            format,
            filter,
            Redacting(ToStderr(Buffered::start(flush, BUFFER))),
        ),
        (false, false) => install_logs(format, filter, ToStderr(Buffered::start(flush, BUFFER))),
    }
}

/// [`init_logs`] with its writer.
fn install_logs<W>(format: config::LogFormat, filter: tracing_subscriber::EnvFilter, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use std::io::IsTerminal as _;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        config::LogFormat::Text => fmt
            .with_ansi(std::io::stderr().is_terminal())
            .event_format(a2a_gateway::log_line::Line::default())
            .fmt_fields(a2a_gateway::log_line::Fields)
            .init(),
        config::LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// `--log-format`'s value.
fn log_format(s: &str) -> Result<config::LogFormat, String> {
    match s {
        "text" => Ok(config::LogFormat::Text),
        "json" => Ok(config::LogFormat::Json),
        _ => Err("expected text or json".to_string()),
    }
}

fn main() -> ExitCode {
    if let Err(e) = a2a_gateway::allocator::requested() {
        eprintln!("a2a-gateway: {e}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    if let Some(Command::Health {
        admin,
        ready,
        timeout,
    }) = &cli.command
    {
        let path = if *ready { "/readyz" } else { "/healthz" };
        let timeout = std::time::Duration::from_secs((*timeout).max(1));
        return match health(*admin, path, timeout) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("a2a-gateway health: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::CheckConfig { file }) = &cli.command {
        init_logs(
            cli.log_format.unwrap_or_default(),
            std::time::Duration::ZERO,
        );
        return match config::load(file) {
            // The TLS key pairs are checked as at start-up: a key that is not
            // its certificate's would stop the gateway, so it fails the check.
            Ok(cfg) => match a2a_gateway::tls::check(&cfg)
                .and_then(|()| a2a_gateway::auth::check_keys(&cfg.routes).map_err(|e| e.join("\n")))
            {
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    ExitCode::from(2)
                }
                Ok(()) => {
                    eprintln!("{}: ok ({} routes)", file.display(), cfg.routes.len());
                    ExitCode::SUCCESS
                }
            },
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::from(2)
            }
        };
    }
    let cfg = match (&cli.config, &cli.worker) {
        (Some(file), None) => config::load(file).map_err(|e| e.to_string()),
        (None, Some(worker)) => {
            let listen = cli
                .listen
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
            config::Config::single_worker(listen, worker)
        }
        (Some(_), Some(_)) => Err("give either --config or --worker, not both".to_string()),
        (None, None) => {
            Err("nothing to proxy: give --worker URL or --config FILE (see --help)".to_string())
        }
    };
    let mut cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            eprintln!("a2a-gateway: {e}");
            return ExitCode::from(2);
        }
    };
    let store = match cli.store.as_deref().map(config::parse_store_url) {
        None => None,
        Some(Ok(kind)) => Some(kind),
        Some(Err(e)) => {
            eprintln!("a2a-gateway: --store: {e}");
            return ExitCode::from(2);
        }
    };
    // The command line's overrides, applied again to every reload's config.
    let (listen, admin, threads, log_format) = (cli.listen, cli.admin, cli.threads, cli.log_format);
    let overrides = move |cfg: &mut config::Config| {
        if let Some(listen) = listen {
            cfg.server.listen = vec![listen];
        }
        if let Some(admin) = admin {
            cfg.server.admin = Some(admin);
        }
        if let Some(kind) = &store {
            cfg.store.kind = kind.clone();
        }
        if let Some(threads) = threads {
            cfg.server.threads = threads.clamp(1, 256);
        }
        if let Some(format) = log_format {
            cfg.server.log_format = format;
        }
    };
    overrides(&mut cfg);
    // The file's password and TLS settings against `--store`'s URL (the
    // file's own was checked with it).
    if let Err(e) = cfg.store.check() {
        eprintln!("a2a-gateway: {e}");
        return ExitCode::from(2);
    }
    // The log redacts this config's credentials, and those of every config
    // a reload reads (added, never dropped: removed routes keep sending
    // their owed cancels).
    a2a_gateway::redact::learn(&cfg);
    let source = cli
        .config
        .clone()
        .map(|path| a2a_gateway::reload::ConfigSource {
            path,
            overrides: Box::new(move |cfg: &mut config::Config| {
                overrides(cfg);
                a2a_gateway::redact::learn(cfg);
            }),
        });
    init_logs(cfg.server.log_format, cfg.server.log_flush);
    tracing::debug!(
        allocator = a2a_gateway::allocator::in_use(),
        "heap allocator"
    );
    if let Err(e) = a2a_gateway::trace::init(cfg.tracing.as_ref()) {
        eprintln!("a2a-gateway: {e}");
        return ExitCode::from(2);
    }
    let ran = a2a_gateway::server::run(cfg, source);
    a2a_gateway::trace::shutdown();
    a2a_gateway::log_writer::flush();
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("a2a-gateway: {e}");
            ExitCode::from(1)
        }
    }
}

/// A listener address, checked as the config file's are
/// ([`config::known_port`]).
fn known_port(s: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s
        .parse()
        .map_err(|e| format!("expected an IP address and port like 127.0.0.1:8080: {e}"))?;
    config::known_port(addr).map_err(str::to_owned)
}
