//! The bare pingora pass-through the proxy bench compares the gateway with:
//! a `ProxyHttp` with `upstream_peer` and nothing else (no filters, no
//! routing, no logging), on the same pingora (0.9, the workspace's features)
//! and with the same server settings as the gateway (2 threads, no grace
//! period). WebSocket upgrades pass through pingora's own upgrade handling.
//! As the gateway, it takes HTTP/2 with prior knowledge (h2c) as well as
//! HTTP/1 on its listener, and sends a gRPC call (`content-type:
//! application/grpc…`) to the upstream over HTTP/2 (h2c), everything else
//! over HTTP/1.1.
//!
//! It runs on the gateway's heap allocator (mimalloc; `allocator.rs`), which
//! is the gateway's choice, not pingora's, so that the ratio between them
//! stays the policy layer's cost. Its one addition: the gateway's own
//! timing marks ([`ProxyTimes`]: four clock reads and a histogram
//! observation per request, 1,162 instructions of the 103,181 it executed
//! per `SendMessage` by `benches/callgrind.sh` in the seventh session,
//! 1.1%), so that its time inside the proxy is measured as the gateway's is,
//! as `a2agw_proxy_seconds` (with `--metrics ADDR`, served at `/metrics`).
//!
//! It is compiled into the bench binary and run as a separate process: the
//! bench re-executes itself (`std::env::current_exe()`) with
//! `--bare-pingora --listen ADDR --upstream HOST:PORT`. That keeps the
//! product's `cargo build`/`cargo test` and its Cargo.toml unchanged, needs no
//! second `cargo build` inside the bench, and the pass-through is always
//! built by the same profile, from the same pingora, as the gateway binary
//! the bench runs. By hand:
//! `target/release/deps/proxy-<hash> --bare-pingora --listen 127.0.0.1:8081 --upstream 127.0.0.1:9000`.

use a2a_gateway::proxy::timing::ProxyTimes;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::ServerSession;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, Result};

/// The gateway's allocator (mimalloc unless `A2A_GATEWAY_ALLOCATOR=system`)
/// for the whole bench binary: bare pingora, re-executed from it, runs on
/// the allocator the gateway it is compared with runs on, and so does the
/// in-process worker every column shares.
#[global_allocator]
static ALLOCATOR: a2a_gateway::allocator::Allocator = a2a_gateway::allocator::Allocator;

/// Makes bare pingora share its gRPC calls' upstream connections, this
/// many calls to one, as the gateway does for unary calls
/// (`limits.worker_h2_streams`): to compare the gateway with a
/// pass-through configured alike. Unset: pingora's default.
pub const H2_STREAMS_ENV: &str = "A2AGW_BENCH_BARE_H2_STREAMS";

/// The argument that turns the bench binary into the pass-through.
pub const FLAG: &str = "--bare-pingora";

/// Same as the gateway's default `server.threads` in the bench.
const THREADS: usize = 2;

struct Bare {
    upstream: String,
    /// gRPC calls sharing one upstream connection (`$A2AGW_BENCH_BARE_H2_STREAMS`,
    /// as the gateway's `limits.worker_h2_streams`); `None`: pingora's
    /// default, a connection per call.
    h2_streams: Option<usize>,
    /// `a2agw_proxy_seconds{route="bare"}`.
    own: prometheus::Histogram,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ProxyTimes;

    fn new_ctx(&self) -> ProxyTimes {
        ProxyTimes::default()
    }

    async fn request_filter(&self, _session: &mut Session, ctx: &mut ProxyTimes) -> Result<bool> {
        ctx.head();
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        _ctx: &mut ProxyTimes,
    ) -> Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.upstream.as_str(), false, String::new());
        // gRPC needs HTTP/2 to the upstream (h2c, prior knowledge), as the
        // gateway asks for it (`proxy/mod.rs`'s `upstream_peer`); everything
        // else goes over HTTP/1.1.
        if session
            .req_header()
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"))
        {
            peer.options.set_http_version(2, 2);
            if let Some(n) = self.h2_streams {
                let sharing = policies::connection::h2_sharing(Some(false), n);
                peer.options.max_h2_streams = sharing.streams;
                peer.options.h2_stream_window_size = Some(policies::connection::STREAM_WINDOW);
                peer.options.h2_connection_window_size = Some(sharing.connection_window);
            }
        }
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        _upstream: &mut RequestHeader,
        ctx: &mut ProxyTimes,
    ) -> Result<()> {
        ctx.upstream();
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut ProxyTimes,
    ) -> Result<()> {
        ctx.answer(resp);
        Ok(())
    }

    async fn logging(&self, _session: &mut Session, e: Option<&Error>, ctx: &mut ProxyTimes) {
        if let Some(own) = ctx.own(e) {
            self.own.observe(own.as_secs_f64());
        }
    }
}

/// `/metrics` of the pass-through (`a2agw_proxy_seconds{route="bare"}`).
struct Metrics;

#[async_trait]
impl pingora::apps::http_app::ServeHttp for Metrics {
    async fn response(&self, _session: &mut ServerSession) -> http::Response<Vec<u8>> {
        http::Response::new(a2a_gateway::metrics::render().into_bytes())
    }
}

/// The optional argument that serves `/metrics` at an address.
pub const METRICS: &str = "--metrics";

/// The optional argument that sets the listener's L4 read buffer (bytes)
/// instead of pingora's zero-filled 64 KiB, to show what that buffer costs
/// per open connection.
pub const L4_READ_BUFFER: &str = "--l4-read-buffer";

/// The optional argument that keeps idle upstream connections in
/// pingora-core's own pool (a task per idle connection), as published
/// pingora does, instead of the vendored pingora-proxy's (see
/// `vendor/pingora-proxy/PATCHED.md`): the proxy bench's "as published" line.
pub const PINGORA_CORE_POOL: &str = "--pingora-core-pool";

/// Runs the pass-through until killed. `args`: what follows [`FLAG`]:
/// `--listen ADDR --upstream HOST:PORT [--metrics ADDR] [--l4-read-buffer
/// BYTES] [--pingora-core-pool] [--threads N] [--no-steal]`. The last two override the gateway's server settings
/// (threads, pingora's work-stealing runtime), for trying pingora settings
/// by hand against the one the benches use; the benches pass neither.
pub fn run(args: &[String]) -> ! {
    // The argument after `name`, if `name` is given.
    let after = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let value = |name: &str| -> String {
        after(name).cloned().unwrap_or_else(|| {
            eprintln!("usage: {FLAG} --listen ADDR --upstream HOST:PORT");
            std::process::exit(2)
        })
    };
    let listen = value("--listen");
    let upstream = value("--upstream");
    let l4_read_buffer = after(L4_READ_BUFFER).and_then(|v| v.parse::<usize>().ok());

    let mut conf = a2a_gateway::server::server_conf(THREADS, std::time::Duration::ZERO);
    if let Some(t) = after("--threads").and_then(|v| v.parse().ok()) {
        conf.threads = t;
    }
    if args.iter().any(|a| a == "--no-steal") {
        conf.work_stealing = false;
    }
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Bare {
            upstream,
            h2_streams: std::env::var(H2_STREAMS_ENV)
                .ok()
                .and_then(|v| v.parse().ok()),
            own: a2a_gateway::metrics::PROXY_TIME.with_label_values(&["bare"]),
        },
        "bare-pingora",
    );
    if let Some(app) = proxy.app_logic_mut() {
        if args.iter().any(|a| a == PINGORA_CORE_POOL) {
            app.use_pingora_core_pool();
        }
        // HTTP/2 with prior knowledge (h2c) on the listener, as the gateway
        // has on its plain listeners (`server.rs`), for gRPC callers.
        let mut opts = pingora::apps::HttpServerOptions::default();
        opts.h2c = true;
        app.server_options = Some(opts);
    }
    match l4_read_buffer {
        Some(bytes) => {
            proxy.add_listener(pingora::listeners::ListenerConfig::tcp(listen).l4_buffer(
                pingora::listeners::L4BufferSettings::new(
                    bytes,
                    pingora::listeners::DEFAULT_L4_WRITE_BUFFER_SIZE,
                ),
            ))
        }
        None => proxy.add_tcp(&listen),
    }
    server.add_service(proxy);
    if let Some(addr) = after(METRICS) {
        let mut metrics = pingora::services::listening::Service::new(
            "metrics".to_string(),
            pingora::apps::http_app::HttpServer::new_app(Metrics),
        );
        metrics.add_tcp(addr);
        server.add_service(metrics);
    }
    server.run_forever()
}
