//! Issue 33 item 2: the metrics, read from the real gateway's `/metrics`
//! while it serves real workers; and the Grafana dashboard and Prometheus
//! alert rules in `deploy/`, whose expressions must name only metrics the
//! gateway exports.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::harness::gateway::{free_port, Gateway};
use crate::harness::http::{leave, post_json, request, split_url};
use crate::harness::redis::RedisServer;
use crate::harness::relay::Relay;
use crate::harness::rust_worker::{RustWorker, RustWorkerCapacity, RustWorkerOptions};
use crate::harness::worker::{message, send_stream, task_id_of, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_secs};

/// A sample's labels, as (name, value) pairs.
type Labels = Vec<(String, String)>;

/// The labels of one sample line (`name{a="x",b="y"} 1`), and its value.
fn parse_sample(line: &str) -> Option<(&str, Labels, f64)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value = value.parse::<f64>().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}')?),
        None => (head, ""),
    };
    let mut out = Vec::new();
    // Label values here never hold `",` (route names and fixed words).
    for pair in labels.split("\",").filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once("=\"")?;
        out.push((k.to_string(), v.trim_end_matches('"').to_string()));
    }
    Some((name, out, value))
}

/// The sum of the samples named exactly `name` whose labels include every
/// `labels` pair (0 when none).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(parse_sample)
        .filter(|(n, ls, _)| {
            *n == name
                && labels
                    .iter()
                    .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// Whether a sample named `name` with exactly these labels is exported.
fn exported(text: &str, name: &str, labels: &[(&str, &str)]) -> bool {
    text.lines().filter_map(parse_sample).any(|(n, ls, _)| {
        n == name
            && ls.len() == labels.len()
            && labels
                .iter()
                .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
    })
}

/// Waits (requests are counted as they end, just after their answer is
/// written) until the sample reaches `at_least`; returns the metrics text.
async fn wait_sample(gw: &Gateway, name: &str, labels: &[(&str, &str)], at_least: f64) -> String {
    let mut text = String::new();
    for _ in 0..scaled_count(250) {
        text = gw.metrics().await;
        if sample(&text, name, labels) >= at_least {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{name}{labels:?} never reached {at_least}; /metrics:\n{}\nlog:\n{}",
        text.lines()
            .filter(|l| l.starts_with(name))
            .collect::<Vec<_>>()
            .join("\n"),
        gw.log_text()
    );
}

fn requests<'a>(
    route: &'a str,
    method: &'a str,
    binding: &'a str,
    status: &'a str,
) -> [(&'a str, &'a str); 4] {
    [
        ("route", route),
        ("method", method),
        ("binding", binding),
        ("status", status),
    ]
}

/// Each request counted once, as it ended, by route, A2A method (read from
/// the JSON-RPC body, or the REST verb and path), binding and the status
/// class the caller got: a JSON-RPC SendMessage and GetTask, a REST GetTask
/// found and one not found (the worker's 404), the agent card, a path that
/// matches no route (`route=""`, the gateway's 404), and a caller that left
/// before any answer (`status="none"`). The 2xx/4xx/5xx series of every
/// method are exported from start, at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_by_method_binding_and_status() {
    let worker = Worker::start(Kind::Rust).await;
    // A worker that never answers: a relay that holds new connections.
    let relay = Relay::start(split_url(&worker.url()).0).await;
    relay.set_open(false);
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"w\"\nworker = \"{}\"\npath_prefix = \"/w\"\n\n\
         [[routes]]\nname = \"h\"\nworker = \"http://127.0.0.1:{}\"\npath_prefix = \"/h\"\n",
        worker.url(),
        relay.port
    ))
    .await;
    let at_start = gw.metrics().await;
    for (method, binding) in [
        ("GetTask", "jsonrpc"),
        ("SendMessage", "rest"),
        ("agent_card", "none"),
    ] {
        for status in ["2xx", "4xx", "5xx"] {
            assert!(
                exported(
                    &at_start,
                    "a2agw_requests_total",
                    &requests("w", method, binding, status)
                ),
                "{method} {binding} {status} not exported at start:\n{at_start}"
            );
        }
    }
    assert_eq!(sample(&at_start, "a2agw_requests_total", &[]), 0.0);

    let sent = post_json(
        &gw.url,
        "/w",
        &[],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                "params": {"message": message("quick")}}),
    )
    .await;
    assert_eq!(sent.status, 200, "{}", sent.text());
    let id = task_id_of(&sent.json()).unwrap_or_else(|| panic!("no task in {}", sent.text()));
    let got = post_json(
        &gw.url,
        "/w",
        &[],
        &json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}}),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let rest = request("GET", &gw.url, &format!("/w/tasks/{id}"), &[], b"").await;
    assert_eq!(rest.status, 200, "{}", rest.text());
    let missing = request("GET", &gw.url, "/w/tasks/no-such-task", &[], b"").await;
    assert_eq!(missing.status, 404, "{}", missing.text());
    let card = request("GET", &gw.url, "/w/.well-known/agent-card.json", &[], b"").await;
    assert_eq!(card.status, 200, "{}", card.text());
    let nowhere = request("GET", &gw.url, "/nowhere", &[], b"").await;
    assert_eq!(nowhere.status, 404, "{}", nowhere.text());

    // A caller that leaves while the worker has not answered.
    let (authority, _) = split_url(&gw.url);
    let mut sock = tokio::net::TcpStream::connect(&authority).await.unwrap();
    sock.write_all(
        format!("GET /h/tasks/t1 HTTP/1.1\r\nhost: {authority}\r\na2a-version: 1.0\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    for _ in 0..scaled_count(100) {
        if relay.accepted() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(relay.accepted(), 1, "the request never reached the relay");
    leave(sock, false).await;

    let text = wait_sample(
        &gw,
        "a2agw_requests_total",
        &requests("h", "GetTask", "rest", "none"),
        1.0,
    )
    .await;
    let text = if sample(&text, "a2agw_requests_total", &[]) < 7.0 {
        wait_sample(&gw, "a2agw_requests_total", &[], 7.0).await
    } else {
        text
    };
    let expected = [
        (requests("w", "SendMessage", "jsonrpc", "2xx"), 1.0),
        (requests("w", "GetTask", "jsonrpc", "2xx"), 1.0),
        (requests("w", "GetTask", "rest", "2xx"), 1.0),
        (requests("w", "GetTask", "rest", "4xx"), 1.0),
        (requests("w", "agent_card", "none", "2xx"), 1.0),
        (requests("", "other", "none", "4xx"), 1.0),
        (requests("h", "GetTask", "rest", "none"), 1.0),
    ];
    for (labels, n) in &expected {
        assert_eq!(
            sample(&text, "a2agw_requests_total", labels),
            *n,
            "{labels:?}:\n{}",
            text.lines()
                .filter(|l| l.starts_with("a2agw_requests_total") && !l.ends_with(" 0"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // Each request once: nothing else counted.
    assert_eq!(sample(&text, "a2agw_requests_total", &[]), 7.0, "{text}");
}

/// The same against the Python `a2a-sdk` worker: a JSON-RPC stream and a
/// REST GetTask in a tenant (2xx, their worker TTFB observed), a REST
/// GetTask of a task it does not hold (its 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_against_the_python_worker() {
    let worker = Worker::start(Kind::Python).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (mut stream, id) = send_stream(&gw.url, Bind::JsonRpc, Some("acme"), "quick").await;
    let _ = stream.rest(scaled_secs(10)).await;
    let got = request("GET", &gw.url, &format!("/acme/tasks/{id}"), &[], b"").await;
    assert_eq!(got.status, 200, "{}", got.text());
    let missing = request("GET", &gw.url, "/acme/tasks/no-such-task", &[], b"").await;
    assert_eq!(missing.status, 404, "{}", missing.text());
    let text = wait_sample(&gw, "a2agw_requests_total", &[], 3.0).await;
    for (labels, n) in [
        (requests("w", "SendStreamingMessage", "jsonrpc", "2xx"), 1.0),
        (requests("w", "GetTask", "rest", "2xx"), 1.0),
        (requests("w", "GetTask", "rest", "4xx"), 1.0),
    ] {
        assert_eq!(
            sample(&text, "a2agw_requests_total", &labels),
            n,
            "{labels:?}:\n{text}"
        );
    }
    assert_eq!(sample(&text, "a2agw_requests_total", &[]), 3.0, "{text}");
    assert_eq!(
        sample(&text, "a2agw_worker_ttfb_seconds_count", &[("route", "w")]),
        3.0
    );
    assert_eq!(sample(&text, "a2agw_worker_errors_total", &[]), 0.0);
}

/// Worker failures by kind, each on its own route: `connect` (a worker port
/// nobody listens on), `5xx` (a2a-rust answering 503 to a stream over its
/// concurrency limit), `reset` (the worker's connection cut mid-stream),
/// `timeout` (a worker silent past `timeouts.upstream_idle`). No other kind
/// moves on those routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_errors_are_counted_by_kind() {
    let busy = RustWorker::start_with_capacity(
        RustWorkerOptions::default(),
        Some(RustWorkerCapacity {
            max_concurrent_streams: 1,
            max_tasks: 100,
        }),
    )
    .await;
    let worker = Worker::start(Kind::Rust).await;
    let relay = Relay::start(split_url(&worker.url()).0).await;
    let gw = Gateway::start(&format!(
        "[[routes]]\nname = \"c\"\nworker = \"http://127.0.0.1:{}\"\npath_prefix = \"/c\"\n\n\
         [[routes]]\nname = \"o\"\nworker = \"{}\"\npath_prefix = \"/o\"\n\n\
         [[routes]]\nname = \"r\"\nworker = \"http://127.0.0.1:{}\"\npath_prefix = \"/r\"\n",
        free_port(),
        busy.url(),
        relay.port
    ))
    .await;
    let kinds = ["connect", "timeout", "reset", "5xx", "other"];
    let at_start = gw.metrics().await;
    for route in ["c", "o", "r"] {
        for kind in kinds {
            assert!(
                exported(
                    &at_start,
                    "a2agw_worker_errors_total",
                    &[("route", route), ("kind", kind)]
                ),
                "{route} {kind} not exported at start"
            );
        }
    }

    // connect: nobody listens on the worker's port.
    let refused = request("GET", &gw.url, "/c/tasks/t1", &[], b"").await;
    assert_eq!(refused.status, 502, "{}", refused.text());

    // 5xx: the worker's one stream is taken; the next is refused with 503.
    let (held, _) = send_stream(&format!("{}/o", gw.url), Bind::Rest, None, "work:30000").await;
    let over = post_json(
        &gw.url,
        "/o/message:stream",
        &[],
        &json!({"message": message("work:30000")}),
    )
    .await;
    assert_eq!(over.status, 503, "{}", over.text());

    // reset: the worker's connection is cut under an open stream.
    let (mut cut, _) = send_stream(&format!("{}/r", gw.url), Bind::Rest, None, "work:30000").await;
    relay.cut_all();
    let _ = cut.rest(scaled_secs(10)).await;

    let text = wait_sample(
        &gw,
        "a2agw_worker_errors_total",
        &[("route", "r"), ("kind", "reset")],
        1.0,
    )
    .await;
    let text = if sample(&text, "a2agw_worker_errors_total", &[]) < 3.0 {
        wait_sample(&gw, "a2agw_worker_errors_total", &[], 3.0).await
    } else {
        text
    };
    for (route, expect) in [("c", "connect"), ("o", "5xx"), ("r", "reset")] {
        for kind in kinds {
            assert_eq!(
                sample(
                    &text,
                    "a2agw_worker_errors_total",
                    &[("route", route), ("kind", kind)]
                ),
                if kind == expect { 1.0 } else { 0.0 },
                "route {route}, kind {kind}:\n{}\nlog:\n{}",
                text.lines()
                    .filter(|l| l.starts_with("a2agw_worker_errors_total"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                gw.log_text()
            );
        }
    }
    // The caller got the class of what it was answered (counted last of
    // a request's series: waited for).
    for labels in [
        requests("c", "GetTask", "rest", "5xx"),
        requests("o", "SendStreamingMessage", "rest", "5xx"),
    ] {
        let text = wait_sample(&gw, "a2agw_requests_total", &labels, 1.0).await;
        assert_eq!(sample(&text, "a2agw_requests_total", &labels), 1.0);
    }
    held.close();

    // timeout: a worker silent past upstream_idle (its own gateway: the
    // bound is for every route).
    let gw = Gateway::start(&format!(
        "[timeouts]\nupstream_idle = \"600ms\"\n\n[[routes]]\nname = \"t\"\nworker = \"{}\"\n",
        worker.url()
    ))
    .await;
    let (mut quiet, _) = send_stream(&gw.url, Bind::Rest, None, "idle:20000").await;
    let _ = quiet.rest(scaled_secs(10)).await;
    let text = wait_sample(
        &gw,
        "a2agw_worker_errors_total",
        &[("route", "t"), ("kind", "timeout")],
        1.0,
    )
    .await;
    assert_eq!(
        sample(&text, "a2agw_worker_errors_total", &[("route", "t")]),
        1.0,
        "{text}"
    );
}

/// The worker's time to first byte is observed for every answer the worker
/// gave (a stream, a GetTask, a blocking send the gateway carried as a
/// stream: three), and store calls are timed by operation, on the memory
/// store and on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttfb_and_store_latency_are_observed() {
    let worker = Worker::start(Kind::Rust).await;
    let redis = RedisServer::start().await;
    for store in [
        String::new(),
        format!("[store]\nurl = \"{}\"\n\n", redis.url()),
    ] {
        let gw = Gateway::start(&format!(
            "{store}[[routes]]\nname = \"w\"\nworker = \"{}\"\nblocking_sends = \"stream\"\n",
            worker.url()
        ))
        .await;
        let at_start = gw.metrics().await;
        let kind = if store.is_empty() { "memory" } else { "redis" };
        assert_eq!(
            sample(
                &at_start,
                "a2agw_worker_ttfb_seconds_count",
                &[("route", "w")]
            ),
            0.0,
            "{kind}"
        );
        assert!(
            exported(
                &at_start,
                "a2agw_store_op_seconds_count",
                &[("op", "update")]
            ),
            "{kind}: store ops not exported at start"
        );
        let updates = sample(
            &at_start,
            "a2agw_store_op_seconds_count",
            &[("op", "update")],
        );

        let (mut stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:50").await;
        let _ = stream.rest(scaled_secs(10)).await;
        let got = post_json(
            &gw.url,
            "/",
            &[],
            &json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}}),
        )
        .await;
        assert_eq!(got.status, 200, "{kind}: {}", got.text());
        // A blocking send the gateway carries as a stream over its own
        // connection: its first byte is the worker stream's head.
        let carried = post_json(
            &gw.url,
            "/",
            &[],
            &json!({"jsonrpc": "2.0", "id": 3, "method": "SendMessage",
                    "params": {"message": message("quick")}}),
        )
        .await;
        assert_eq!(carried.status, 200, "{kind}: {}", carried.text());

        let text = wait_sample(
            &gw,
            "a2agw_worker_ttfb_seconds_count",
            &[("route", "w")],
            3.0,
        )
        .await;
        assert_eq!(
            sample(&text, "a2agw_worker_ttfb_seconds_count", &[("route", "w")]),
            3.0,
            "{kind}"
        );
        assert_eq!(
            sample(
                &text,
                "a2agw_blocking_sends_total",
                &[("route", "w"), ("outcome", "carried")]
            ),
            1.0,
            "{kind}"
        );
        let sum = sample(&text, "a2agw_worker_ttfb_seconds_sum", &[("route", "w")]);
        assert!(sum > 0.0 && sum < 10.0, "{kind}: ttfb sum {sum}");
        // The tracked stream's task went to the store.
        let text = wait_sample(
            &gw,
            "a2agw_store_op_seconds_count",
            &[("op", "update")],
            updates + 1.0,
        )
        .await;
        let sum = sample(&text, "a2agw_store_op_seconds_sum", &[("op", "update")]);
        assert!(sum > 0.0, "{kind}: store update sum {sum}");
        if kind == "redis" {
            // The heartbeat (every second) is a store call too.
            wait_sample(
                &gw,
                "a2agw_store_op_seconds_count",
                &[("op", "replica_alive")],
                1.0,
            )
            .await;
        }
    }
}

/// `a2agw_build_info{version}` is 1, the open-streams gauge is there before
/// any stream, and the process's own metrics are there with plausible
/// values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_info_and_process_metrics() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let text = gw.metrics().await;
    assert!(
        exported(
            &text,
            "a2agw_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        "{text}"
    );
    assert_eq!(sample(&text, "a2agw_build_info", &[]), 1.0);
    // Gauges are there before anything moves them.
    assert!(exported(&text, "a2agw_open_tracked_streams", &[]), "{text}");
    let rss = sample(&text, "process_resident_memory_bytes", &[]);
    assert!(rss > 1e6 && rss < 4e9, "rss {rss}");
    let fds = sample(&text, "process_open_fds", &[]);
    let max = sample(&text, "process_max_fds", &[]);
    assert!(fds >= 3.0 && fds < max, "fds {fds} of {max}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("process_cpu_seconds_total ")),
        "{text}"
    );
    assert!(sample(&text, "process_start_time_seconds", &[]) > 1.6e9);
}

/// The metric names in a PromQL expression: identifiers outside strings and
/// label matchers that are the gateway's (`a2agw_`) or its process's
/// (`process_`). Prometheus's own (`up`) and functions are not.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = expr.chars().peekable();
    let mut word = String::new();
    let mut depth = 0usize;
    let flush = |word: &mut String, names: &mut BTreeSet<String>, depth: usize| {
        if depth == 0 && (word.starts_with("a2agw_") || word.starts_with("process_")) {
            names.insert(word.clone());
        }
        word.clear();
    };
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                flush(&mut word, &mut names, depth);
                for d in chars.by_ref() {
                    if d == c {
                        break;
                    }
                }
            }
            '{' => {
                flush(&mut word, &mut names, depth);
                depth += 1;
            }
            '}' => {
                flush(&mut word, &mut names, depth);
                depth = depth.saturating_sub(1);
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == ':' => word.push(c),
            _ => flush(&mut word, &mut names, depth),
        }
    }
    flush(&mut word, &mut names, depth);
    names
}

/// Every `expr` string anywhere in a JSON document (Grafana targets).
fn json_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => json_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| json_exprs(x, out)),
        _ => {}
    }
}

/// `deploy/grafana/a2a-gateway-dashboard.json` and
/// `deploy/prometheus/alerts.yml` parse, and every metric their queries
/// name is on a running gateway's `/metrics` after traffic (a stream whose
/// caller left, cancelled by the cascade); histograms by their `_bucket`,
/// `_sum` and `_count` series. Every metric exported is in the table of
/// `docs/operations.md`, with its type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_name_only_exported_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/a2a-gateway-dashboard.json"))
            .expect("read the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    json_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{} dashboard queries", exprs.len());

    let alerts: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml"))
            .expect("read the alert rules"),
    )
    .expect("the alert rules are YAML");
    let mut rules = 0;
    for group in alerts["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no expr"));
            assert!(
                rule["labels"]["severity"].is_string(),
                "{name}: no severity"
            );
            assert!(
                rule["annotations"]["summary"].is_string(),
                "{name}: no summary"
            );
            exprs.push(expr.to_string());
            rules += 1;
        }
    }
    assert!(rules >= 5, "{rules} alert rules");

    let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    for must in [
        "a2agw_requests_total",
        "a2agw_worker_errors_total",
        "a2agw_worker_ttfb_seconds_bucket",
        "a2agw_store_op_seconds_bucket",
        "a2agw_cancels_total",
        "process_resident_memory_bytes",
    ] {
        assert!(used.contains(must), "no query uses {must}: {used:?}");
    }

    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let (stream, _) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    stream.close();
    let text = wait_sample(&gw, "a2agw_cancel_latency_seconds_count", &[], 1.0).await;
    let exported: BTreeSet<&str> = text
        .lines()
        .filter_map(parse_sample)
        .map(|(n, _, _)| n)
        .collect();
    let missing: Vec<&String> = used
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "queries name metrics the gateway does not export: {missing:?}"
    );

    // Every metric exported is in docs/operations.md's table, with its type.
    let docs = std::fs::read_to_string(root.join("docs/operations.md")).expect("read the docs");
    let table = &docs[docs.find("## Metrics").expect("a Metrics section")..];
    let table = &table[..table.find("\n## ").unwrap_or(table.len())];
    for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = line.split_once(' ').expect("# TYPE name kind");
        let row = table
            .lines()
            .find(|r| r.starts_with('|') && r.contains(&format!("`{name}`")))
            .unwrap_or_else(|| panic!("{name} is not in docs/operations.md's metrics table"));
        assert!(
            row.contains(&format!("| {kind} |")),
            "{name}: docs say otherwise than {kind}: {row}"
        );
    }
}

#[test]
fn metric_names_skip_strings_functions_and_matchers() {
    let names = metric_names(
        "sum by (route) (rate(a2agw_requests_total{status=\"5xx\",route=~\"a2agw_x\"}[5m])) \
         / on(route) process_open_fds or up{job=\"a2agw_gw\"} == 0",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["a2agw_requests_total", "process_open_fds"]
    );
}

/// A stream whose task completes costs the Redis store two writes over
/// its life, its first sight and its settling (which also ends its watch),
/// and nothing at its end: no store call, no task spawned for the cascade,
/// which counts it `keep_settled`. The record is left completed with no
/// watcher. Before, its end made a third write (the watch's end) and the
/// cascade's read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_stream_costs_the_store_two_writes() {
    let redis = RedisServer::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&format!(
        "[store]\nurl = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        redis.url(),
        worker.url()
    ))
    .await;
    let calls = |op: &'static str| {
        let gw = &gw;
        async move {
            gw.counter("a2agw_store_op_seconds_count", &[&format!("op=\"{op}\"")])
                .await
        }
    };
    let (updates, gets) = (calls("update").await, calls("get").await);
    let (mut stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "quick").await;
    let rest = stream.rest(scaled_secs(5)).await;
    assert!(
        rest.iter()
            .any(|e| e.to_string().contains("TASK_STATE_COMPLETED")),
        "{rest:?}"
    );
    let kept = gw
        .counter_reaching(
            "a2agw_cascade_decisions_total",
            &["decision=\"keep_settled\""],
            1.0,
        )
        .await;
    assert_eq!(kept, 1.0);
    let written = gw
        .counter_reaching(
            "a2agw_store_op_seconds_count",
            &["op=\"update\""],
            updates + 2.0,
        )
        .await;
    // Past the moment a third write or a read would have come.
    tokio::time::sleep(crate::harness::scaled_ms(300)).await;
    assert_eq!(calls("update").await, updates + 2.0, "{written}");
    assert_eq!(calls("get").await, gets, "no read at the stream's end");
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let record: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("a2agw:task:w:{id}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        record.get("state").map(String::as_str),
        Some("TASK_STATE_COMPLETED"),
        "{record:?}"
    );
    let watching: Vec<_> = record
        .iter()
        .filter(|(f, v)| f.starts_with("w:") && v.as_str() != "0")
        .collect();
    assert!(watching.is_empty(), "no watcher left: {record:?}");
}
