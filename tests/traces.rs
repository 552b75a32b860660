//! Issue 33 item 3: OpenTelemetry traces. The real gateway binary exports
//! to an OTLP/HTTP receiver the test runs (`harness::otlp`), in front of a
//! real a2a-rust worker reached through a recording TCP relay, so that the
//! `traceparent` each request to the worker carried is seen as sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::harness::gateway::Gateway;
use crate::harness::otlp::{Receiver, Span, CLIENT, SERVER};
use crate::harness::stream::SseStream;
use crate::harness::worker::{message, task_id_of, Kind, Worker};
use crate::harness::{scaled_ms, scaled_secs};

const CANCELED: &str = "TASK_STATE_CANCELED";
const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";

/// What the gateway sent on each connection through a [`Recorder`].
type Sent = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// A TCP pass-through to a worker that keeps every byte the gateway sent
/// through it, one buffer per connection.
struct Recorder {
    url: String,
    sent: Sent,
}

impl Recorder {
    async fn start(to: &str) -> Recorder {
        let to = to
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sent: Sent = Arc::default();
        let all = sent.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(&to).await else {
                    continue;
                };
                let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
                all.lock().unwrap().push(buf.clone());
                let (mut ri, mut wi) = inbound.into_split();
                let (mut ro, mut wo) = outbound.into_split();
                tokio::spawn(async move {
                    let mut chunk = [0u8; 16 * 1024];
                    while let Ok(n) = ri.read(&mut chunk).await {
                        if n == 0 {
                            break;
                        }
                        buf.lock().unwrap().extend_from_slice(&chunk[..n]);
                        if wo.write_all(&chunk[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = wo.shutdown().await;
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut ro, &mut wi).await;
                    let _ = wi.shutdown().await;
                });
            }
        });
        Recorder { url, sent }
    }

    /// Every request the worker was sent: its head (lowercased) and the
    /// start of what followed it (its body).
    fn requests(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for conn in self.sent.lock().unwrap().iter() {
            let text = String::from_utf8_lossy(&conn.lock().unwrap()).into_owned();
            let mut from = 0;
            while let Some(i) = text[from..].find(" HTTP/1.1\r\n") {
                let at = from + i;
                let start = ["POST ", "GET "]
                    .iter()
                    .filter_map(|m| text[from..at].rfind(m).map(|p| from + p))
                    .max()
                    .unwrap_or(from);
                let Some(end) = text[at..].find("\r\n\r\n").map(|e| at + e) else {
                    break;
                };
                let head = text[start..end].to_ascii_lowercase();
                // The body is as long as the head says (none for a GET):
                // what follows on the connection is the next request.
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let after = &text[end + 4..];
                let body = after[..after.len().min(length).min(400)].to_owned();
                out.push((head, body));
                from = end + 4;
            }
        }
        out
    }

    /// The `traceparent` of the request whose body names `method`; waits
    /// for it to be sent. `None` inside: it carried none.
    async fn traceparent_of(&self, method: &str) -> Option<String> {
        for _ in 0..100 {
            if let Some((head, _)) = self
                .requests()
                .into_iter()
                .find(|(_, b)| b.contains(method))
            {
                return head
                    .lines()
                    .find_map(|l| l.strip_prefix("traceparent:"))
                    .map(|v| v.trim().to_owned());
            }
            tokio::time::sleep(scaled_ms(20)).await;
        }
        panic!("no {method} reached the worker: {:#?}", self.requests());
    }
}

/// A gateway exporting to `otlp` (none: no `[tracing]`), one route to
/// `worker`.
async fn gateway(otlp: Option<&Receiver>, worker: &str, env: &[(&str, &str)]) -> Gateway {
    let tracing = otlp
        .map(|r| {
            format!(
                "[tracing]\notlp_endpoint = \"{}\"\nservice_name = \"gw-test\"\n\n",
                r.url
            )
        })
        .unwrap_or_default();
    Gateway::start_with_env(
        &format!("{tracing}[[routes]]\nname = \"w\"\nworker = \"{worker}\"\n"),
        env,
    )
    .await
}

/// Opens a JSON-RPC `SendStreamingMessage` with `headers`; the open stream
/// and its task id.
async fn stream(
    url: &str,
    headers: &[(&str, &str)],
    msg: serde_json::Value,
) -> (SseStream, String) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": msg}});
    let mut s = SseStream::open(url, "/", headers, &body).await;
    assert_eq!(s.status, 200);
    for _ in 0..10 {
        let ev = s.next(scaled_secs(10)).await.expect("an event");
        if let Some(id) = task_id_of(&ev) {
            return (s, id);
        }
    }
    panic!("no event named the task");
}

/// The parts of a `traceparent`: (trace id, parent id, flags).
fn parts(tp: &str) -> (String, String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "not a traceparent: {tp}");
    assert_eq!(p[0], "00", "{tp}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

fn dump(spans: &[Span]) -> String {
    spans
        .iter()
        .map(|s| {
            format!(
                "{} kind={} trace={} span={} parent={} attrs={:?} links={:?}",
                s.name, s.kind, s.trace_id, s.span_id, s.parent_span_id, s.attrs, s.links
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A caller with a `traceparent` opens a stream and leaves: the receiver
/// gets the request's server span in the caller's trace (parent: the
/// caller's span) with its route, method, binding and task, and the
/// gateway's `CancelTask` as a client span, child of it; the worker's
/// request carried the gateway span's `traceparent`, the cancel its own;
/// the worker's task really ended CANCELED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_span_and_its_cancel_in_the_callers_trace() {
    let otlp = Receiver::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let rec = Recorder::start(&worker.url()).await;
    let gw = gateway(Some(&otlp), &rec.url, &[]).await;

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let tp = format!("00-{trace}-{caller_span}-01");
    let (s, id) = stream(
        &gw.url,
        &[("traceparent", &tp), ("tracestate", "vendor=abc")],
        message("work:30000"),
    )
    .await;
    s.close();
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(5))
        .await
        .unwrap_or_else(|st| panic!("not canceled ({st:?}); log:\n{}", gw.log_text()));

    let within = scaled_secs(10);
    let server = otlp
        .wait_span(within, |s| {
            s.kind == SERVER && s.attr("a2a.task_id") == Some(&id)
        })
        .await
        .unwrap_or_else(|| panic!("no request span; got:\n{}", dump(&otlp.spans())));
    assert_eq!(
        server.trace_id,
        trace,
        "{}",
        dump(std::slice::from_ref(&server))
    );
    assert_eq!(server.parent_span_id, caller_span);
    assert_eq!(server.name, "SendStreamingMessage");
    assert_eq!(server.service, "gw-test");
    assert_eq!(server.attr("a2a.route"), Some("w"));
    assert_eq!(server.attr("a2a.method"), Some("SendStreamingMessage"));
    assert_eq!(server.attr("a2a.binding"), Some("jsonrpc"));
    assert_eq!(server.attr("http.request.method"), Some("POST"));
    assert_eq!(server.attr("http.response.status_code"), Some("200"));

    let cancel = otlp
        .wait_span(within, |s| s.kind == CLIENT && s.name == "CancelTask")
        .await
        .unwrap_or_else(|| panic!("no CancelTask span; got:\n{}", dump(&otlp.spans())));
    assert_eq!(
        cancel.trace_id,
        trace,
        "{}",
        dump(std::slice::from_ref(&cancel))
    );
    assert_eq!(cancel.parent_span_id, server.span_id, "the request's child");
    assert_eq!(cancel.attr("a2a.task_id"), Some(id.as_str()));
    assert_eq!(cancel.attr("a2a.cause"), Some("caller_gone"));
    assert_eq!(cancel.attr("a2a.outcome"), Some("canceled"));
    assert_eq!(cancel.attr("a2a.attempts"), Some("1"));
    assert!(otlp.bad().is_empty(), "{:?}", otlp.bad());

    // What the worker was sent: the gateway's spans as parents, in the
    // caller's trace, sampled as the caller asked.
    let sent = rec
        .traceparent_of("SendStreamingMessage")
        .await
        .expect("the worker's request carries a traceparent");
    assert_eq!(
        parts(&sent),
        (trace.into(), server.span_id.clone(), "01".into())
    );
    let (head, _) = rec
        .requests()
        .into_iter()
        .find(|(_, b)| b.contains("SendStreamingMessage"))
        .unwrap();
    let named = |n: &str| head.lines().filter(|l| l.starts_with(n)).count();
    assert_eq!(
        named("traceparent:"),
        1,
        "one traceparent, the gateway's: {head}"
    );
    // The caller's member passed on, after the gateway's delegation
    // reference (docs/behaviour.md, delegation trees).
    assert!(
        head.lines()
            .any(|l| l.starts_with("tracestate: a2agw=") && l.ends_with(",vendor=abc")),
        "the caller's tracestate passed on: {head}"
    );
    assert_eq!(named("tracestate:"), 1, "{head}");
    let sent = rec
        .traceparent_of("CancelTask")
        .await
        .expect("the cancel carries a traceparent");
    assert_eq!(
        parts(&sent),
        (trace.into(), cancel.span_id.clone(), "01".into())
    );
}

/// Without `[tracing]` nothing is exported (not even with the OTLP
/// variables of the environment pointing at a receiver) and nothing is
/// added: a caller's `traceparent` reaches the worker as sent; a send
/// without one gets a fresh one, not sampled, only to carry the gateway's
/// delegation reference (`tracestate: a2agw=…`); the gateway's own cancel
/// carries none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tracing_nothing_is_exported_or_added() {
    let otlp = Receiver::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let rec = Recorder::start(&worker.url()).await;
    let gw = gateway(
        None,
        &rec.url,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url.as_str()),
            ("OTEL_TRACES_EXPORTER", "otlp"),
        ],
    )
    .await;

    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut m = message("quick");
    m["messageId"] = json!("with-traceparent");
    let (mut s, _) = stream(&gw.url, &[("traceparent", tp)], m).await;
    let _ = s.rest(scaled_secs(10)).await;
    let mut with = None;
    for _ in 0..100 {
        with = rec
            .requests()
            .into_iter()
            .find(|(_, b)| b.contains("with-traceparent"));
        if with.is_some() {
            break;
        }
        tokio::time::sleep(scaled_ms(20)).await;
    }
    let (head, _) = with.expect("the first request reached the worker");
    assert!(
        head.lines().any(|l| l == format!("traceparent: {tp}")),
        "the caller's traceparent, unchanged: {head}"
    );

    // No traceparent from the caller: a fresh unsampled one, for the
    // reference; none on the cancel.
    let (s, id) = stream(&gw.url, &[], message("work:30000")).await;
    s.close();
    worker
        .wait_state(None, &id, CANCELED, scaled_secs(5))
        .await
        .unwrap_or_else(|st| panic!("not canceled ({st:?}); log:\n{}", gw.log_text()));
    let cancel = rec.traceparent_of("CancelTask").await;
    assert_eq!(
        cancel, None,
        "the gateway added a traceparent to its cancel"
    );
    let streamed = rec
        .requests()
        .into_iter()
        .filter(|(_, b)| b.contains("SendStreamingMessage") && b.contains("work:30000"))
        .collect::<Vec<_>>();
    assert_eq!(streamed.len(), 1);
    let head = &streamed[0].0;
    let added: Vec<&str> = head
        .lines()
        .filter_map(|l| l.strip_prefix("traceparent: "))
        .collect();
    assert!(
        added.len() == 1 && added[0].len() == 55 && added[0].ends_with("-00"),
        "{head}"
    );
    let state: Vec<&str> = head
        .lines()
        .filter_map(|l| l.strip_prefix("tracestate: "))
        .collect();
    assert!(
        state.len() == 1 && state[0].starts_with("a2agw=") && !state[0].contains(','),
        "{head}"
    );

    // Twice the export interval a traced gateway has (1 s): nothing arrives.
    tokio::time::sleep(scaled_secs(2)).await;
    assert_eq!(otlp.exports(), 0, "{:?}", dump(&otlp.spans()));
}

/// A leased child whose lease lapses while its caller still holds the
/// stream: the gateway's cancel has no request behind it, so its span is
/// the root of a trace of its own, names the task and the cause, and links
/// to the span of the request that started the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_cancel_is_a_root_span_linked_to_its_request() {
    let otlp = Receiver::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let gw = gateway(Some(&otlp), &worker.url(), &[]).await;

    let mut m = message("work:30000");
    m["metadata"] = json!({ "a2a-rust.com/lease": {"ttlMs": 1000} });
    m["extensions"] = json!([LEASE_URI]);
    let trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let tp = format!("00-{trace}-10f067aa0ba902b8-01");
    let (_open, id) = stream(&gw.url, &[("traceparent", &tp)], m).await;
    worker
        .wait_state(
            None,
            &id,
            CANCELED,
            Duration::from_millis(1000) + scaled_secs(2),
        )
        .await
        .unwrap_or_else(|st| panic!("not canceled at lapse ({st:?}); log:\n{}", gw.log_text()));

    let within = scaled_secs(10);
    let cancel = otlp
        .wait_span(within, |s| s.kind == CLIENT && s.name == "CancelTask")
        .await
        .unwrap_or_else(|| panic!("no CancelTask span; got:\n{}", dump(&otlp.spans())));
    assert_eq!(
        cancel.parent_span_id,
        "",
        "a root: {}",
        dump(std::slice::from_ref(&cancel))
    );
    assert_ne!(cancel.trace_id, trace, "a trace of its own");
    assert_eq!(cancel.attr("a2a.task_id"), Some(id.as_str()));
    assert_eq!(cancel.attr("a2a.cause"), Some("lease_lapsed"));
    assert_eq!(cancel.attr("a2a.outcome"), Some("canceled"));
    let server = otlp
        .wait_span(within, |s| {
            s.kind == SERVER && s.attr("a2a.task_id") == Some(&id)
        })
        .await
        .unwrap_or_else(|| panic!("no request span; got:\n{}", dump(&otlp.spans())));
    assert_eq!(server.trace_id, trace);
    assert_eq!(
        cancel.links,
        vec![(server.trace_id.clone(), server.span_id.clone())],
        "linked to the request that started the task"
    );
}

/// A receiver that is down costs the requests nothing: they are answered
/// as without traces, and the gateway keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_is_down_holds_up_nothing() {
    let worker = Worker::start(Kind::Rust).await;
    let closed = format!("http://127.0.0.1:{}", crate::harness::gateway::free_port());
    let gw = Gateway::start(&format!(
        "[tracing]\notlp_endpoint = \"{closed}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        worker.url()
    ))
    .await;
    for _ in 0..3 {
        let started = tokio::time::Instant::now();
        let (mut s, id) = stream(&gw.url, &[], message("quick")).await;
        let events = s.rest(scaled_secs(10)).await;
        assert!(
            events
                .iter()
                .any(|e| crate::harness::worker::state_of(e).as_deref()
                    == Some("TASK_STATE_COMPLETED")),
            "{id}: {events:?}"
        );
        assert!(
            started.elapsed() < scaled_secs(5),
            "{:?}",
            started.elapsed()
        );
        // Past an export interval, so the next request meets a failed export.
        tokio::time::sleep(scaled_ms(1200)).await;
    }
    let log = gw.log_text();
    assert!(!log.contains("panicked"), "{log}");
    // Said once, not once per export.
    let said = log.matches("could not export spans").count();
    assert_eq!(said, 1, "{log}");
}

/// A fire-and-poll task nobody polls (a route with `poll_lease`): at the
/// lapse the gateway asks the worker (`GetTask`) and then cancels, each
/// call the root of a trace of its own naming the task and linked to the
/// span of the send that started it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_lease_lapse_probe_and_cancel_are_linked_roots() {
    let otlp = Receiver::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&format!(
        "[tracing]\notlp_endpoint = \"{}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{}\"\npoll_lease = \"1s\"\n",
        otlp.url,
        worker.url()
    ))
    .await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("work:30000"), "configuration": {"returnImmediately": true}}});
    let v = crate::harness::http::post_json(&gw.url, "/", &[], &body)
        .await
        .json();
    let id = v["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {v}"))
        .to_owned();
    worker
        .wait_state(
            None,
            &id,
            CANCELED,
            Duration::from_millis(1000) + scaled_secs(2),
        )
        .await
        .unwrap_or_else(|st| panic!("not canceled at lapse ({st:?}); log:\n{}", gw.log_text()));

    let within = scaled_secs(10);
    let send = otlp
        .wait_span(within, |s| {
            s.kind == SERVER && s.attr("a2a.task_id") == Some(&id)
        })
        .await
        .unwrap_or_else(|| panic!("no request span; got:\n{}", dump(&otlp.spans())));
    assert_eq!(send.name, "SendMessage");
    let link = vec![(send.trace_id.clone(), send.span_id.clone())];
    for (call, outcome) in [
        ("GetTask", "TASK_STATE_WORKING"),
        ("CancelTask", "canceled"),
    ] {
        let s = otlp
            .wait_span(within, |s| s.kind == CLIENT && s.name == call)
            .await
            .unwrap_or_else(|| panic!("no {call} span; got:\n{}", dump(&otlp.spans())));
        let shown = dump(std::slice::from_ref(&s));
        assert_eq!(s.parent_span_id, "", "a root: {shown}");
        assert_ne!(s.trace_id, send.trace_id, "{shown}");
        assert_eq!(s.attr("a2a.task_id"), Some(id.as_str()), "{shown}");
        assert_eq!(s.attr("a2a.cause"), Some("lease_lapsed"), "{shown}");
        assert_eq!(s.attr("a2a.outcome"), Some(outcome), "{shown}");
        assert_eq!(s.links, link, "{shown}");
    }
}

/// A blocking `SendMessage` the gateway carries to the worker as a stream
/// (the a2a-rust worker streams): the stream it becomes names the send's
/// span as its parent, in the caller's trace, as any other request does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_blocking_send_reaches_the_worker_as_the_spans_child() {
    let otlp = Receiver::start().await;
    let worker = Worker::start(Kind::Rust).await;
    let rec = Recorder::start(&worker.url()).await;
    let gw = Gateway::start(&format!(
        "[tracing]\notlp_endpoint = \"{}\"\nservice_name = \"gw-test\"\n\n\
         [[routes]]\nname = \"w\"\nworker = \"{}\"\nblocking_sends = \"stream\"\n",
        otlp.url, rec.url
    ))
    .await;

    let trace = "0af7651916cd43dd8448eb211c80319c";
    let tp = format!("00-{trace}-b7ad6b7169203331-01");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("quick")}});
    let r = crate::harness::http::post_json(&gw.url, "/", &[("traceparent", &tp)], &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no task in {}", r.text()))
        .to_owned();
    assert!(
        gw.counter("a2agw_blocking_sends_total", &["outcome=\"carried\""])
            .await
            >= 1.0,
        "the send was carried as a stream"
    );

    let server = otlp
        .wait_span(scaled_secs(10), |s| {
            s.kind == SERVER && s.name == "SendMessage"
        })
        .await
        .unwrap_or_else(|| panic!("no request span; got:\n{}", dump(&otlp.spans())));
    assert_eq!(server.trace_id, trace);
    assert_eq!(server.attr("a2a.task_id"), Some(id.as_str()));
    let sent = rec
        .traceparent_of("SendStreamingMessage")
        .await
        .unwrap_or_else(|| {
            panic!(
                "the carried stream carries no traceparent: {:#?}",
                rec.requests()
            )
        });
    assert_eq!(
        parts(&sent),
        (trace.into(), server.span_id.clone(), "01".into()),
        "the stream names the send's span, not the caller's"
    );
}
