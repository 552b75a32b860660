//! Micro-benchmarks of the gateway's hot parsers, in bytes/s
//! (`Throughput::Bytes`), with criterion.
//!
//! Run: `cargo bench -p a2a-gateway --bench parsers` (about 80 s; a
//! filter narrows it, e.g. `cargo bench -p a2a-gateway --bench parsers --
//! sse_observe`). Under `cargo test` (no `--bench` argument) criterion runs
//! each routine once, as a smoke test.
//!
//! Why these are the hot paths: the proxy reads every byte a worker streams
//! and runs these functions inline, on the pingora worker thread that moves
//! the bytes: one [`SseParser::feed`] per body chunk and one [`observe`] per
//! SSE event, one [`jsonrpc_facts`]/[`rest_facts`] per request, one
//! [`observe`] per buffered JSON answer, and one [`WsParser::feed`] per
//! chunk of an upgraded connection (each direction), i.e. per frame.
//!
//! What is measured (inputs are built once, before timing, in the shapes the
//! a2a-rust 0.15 SDK writes them, and checked to parse as expected):
//! - `sse/*`: [`SseParser`] alone on a 1,000-event stream (a `task` event,
//!   997 `statusUpdate`s `TASK_STATE_WORKING`, an `artifactUpdate`, a final
//!   `TASK_STATE_COMPLETED`), each event framed as the SDK's server frames
//!   it (`id: N\nevent: message\ndata: {…}\n\n`); `jsonrpc` wraps each
//!   StreamResponse in a JSON-RPC success envelope, `rest` sends it bare.
//!   Fed as one buffer (`whole`) and in 1460-byte (one TCP segment) and
//!   64-byte chunks, which split lines and events anywhere. A fresh parser
//!   per iteration (one per streamed response, as in the proxy).
//! - `sse_observe/*`: the same streams in 1460-byte chunks, with
//!   [`observe`] on every event's data, which is what the proxy does per
//!   event; `jsonrpc_budget` is the JSON-RPC stream whose status updates
//!   carry the budget extension's spend metadata
//!   (`"metadata":{"a2a-rust.com/budget":{…,"spent":{"tokens":N}}}`).
//! - `request_facts/*`: [`jsonrpc_facts`] / [`rest_facts`] on a ~1 KB
//!   SendMessage / SendStreamingMessage body, with and without lease and
//!   budget grants in `message.metadata`. One body per iteration.
//! - `observe/*`: [`observe`] on a ~1 KB SendMessage answer (a completed
//!   task with an artifact and a two-message history), JSON-RPC and REST.
//! - `ws/*`: [`WsParser`] on 1,000 small text frames, each a JSON-RPC stream
//!   answer (~270 B, as the worker sends them), unmasked (worker→client: a
//!   whole frame in one chunk is handed out without a copy) and masked
//!   (client→worker: copied and unmasked), fed whole and, unmasked, in
//!   1460-byte chunks (frames split across chunks are copied); one 512 KiB
//!   text message in 32 fragments of 16 KiB, unmasked and masked; and the
//!   frames recorded between a real a2a-rust client and worker
//!   (`tests/fixtures/ws/*.bin`, see `tests/ws_frames.rs`), repeated to
//!   1,000 frames per direction.
//!
//! Per-item cost: the streams and frame sets hold 1,000 items, so criterion's
//! time per iteration in µs is the cost per event or frame in ns; the
//! request and answer benches handle one document per iteration.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use a2a_gateway::a2a::observe::observe;
use a2a_gateway::a2a::request::{jsonrpc_facts, rest_facts};
use a2a_gateway::a2a::sse::{SseItem, SseParser};
use a2a_gateway::a2a::ws::{WsItem, WsParser};
use a2a_gateway::a2a::{A2aMethod, Binding};
use policies::TaskState;

/// The gateway's default `[limits] max_sse_event` and `max_inspect_body`
/// (the latter bounds a WebSocket text message).
const LIMIT: usize = 1 << 20;
/// Events per SSE stream and frames per WebSocket frame set.
const ITEMS: usize = 1000;
/// One TCP segment's payload on a 1500-byte MTU.
const SEGMENT: usize = 1460;

const TASK_ID: &str = "6b299a0c-2388-4b3b-8d26-9ac1fc67b735";
const CONTEXT_ID: &str = "b6d2e8cf-07c7-4c0d-af94-5e947e05a116";
/// The a2a-rust client numbers its JSON-RPC requests with UUIDs.
const RPC_ID: &str = "6025a4c2-30a2-4bc0-9d51-fe1183d59378";

const PROSE: &str = "Summarise the attached quarterly report for the board, \
    in five short paragraphs: revenue and margin against plan, the three \
    largest customer accounts and their renewal risk, hiring against the \
    approved headcount, the status of the data-centre migration, and the \
    open items the audit committee asked about last quarter. Keep every \
    figure as it appears in the report, name the source table for each one, \
    and flag anything that changed by more than ten percent since the last \
    report. Plain text, no tables, under four hundred words in all.";

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

/// An RFC 3339 timestamp `i` ticks of 101 ms into the recorded task.
fn timestamp(i: usize) -> String {
    let ms = (12 * 3600 + 22 * 60 + 48) * 1000 + 980 + i * 101;
    format!(
        "2026-12-02T{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// The `i`th of `ITEMS` StreamResponses of a recorded-style task, bare (the
/// REST binding's event data).
fn stream_response(i: usize, budget: bool) -> String {
    let ts = timestamp(i);
    if i == 0 {
        return format!(
            r#"{{"task":{{"id":"{TASK_ID}","contextId":"{CONTEXT_ID}","status":{{"state":"TASK_STATE_SUBMITTED","timestamp":"{ts}"}}}}}}"#
        );
    }
    if i == ITEMS - 2 {
        return format!(
            r#"{{"artifactUpdate":{{"taskId":"{TASK_ID}","contextId":"{CONTEXT_ID}","artifact":{{"artifactId":"result","parts":[{{"text":"worked 300 ms"}}]}},"lastChunk":true}}}}"#
        );
    }
    let state = if i == ITEMS - 1 {
        "TASK_STATE_COMPLETED"
    } else {
        "TASK_STATE_WORKING"
    };
    let metadata = if budget {
        format!(
            r#","metadata":{{"a2a-rust.com/budget":{{"remainingMs":{},"meters":{{"tokens":{}}},"spent":{{"tokens":{}}}}}}}"#,
            30_000 - i * 10,
            50_000 - i * 12,
            i * 12
        )
    } else {
        String::new()
    };
    format!(
        r#"{{"statusUpdate":{{"taskId":"{TASK_ID}","contextId":"{CONTEXT_ID}","status":{{"state":"{state}","timestamp":"{ts}"}}{metadata}}}}}"#
    )
}

/// A JSON-RPC success answer carrying `result`.
fn rpc_result(result: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":"{RPC_ID}","result":{result}}}"#)
}

/// The event data of a stream, one document per event.
fn stream_docs(binding: Binding, budget: bool) -> Vec<String> {
    (0..ITEMS)
        .map(|i| {
            let sr = stream_response(i, budget);
            match binding {
                Binding::Rest | Binding::Grpc => sr,
                Binding::JsonRpc | Binding::WebSocket => rpc_result(&sr),
            }
        })
        .collect()
}

/// A whole `text/event-stream` body as the SDK's server writes it.
fn sse_stream(binding: Binding, budget: bool) -> Vec<u8> {
    let mut out = String::new();
    for (i, doc) in stream_docs(binding, budget).iter().enumerate() {
        out.push_str(&format!("id: {i}\nevent: message\ndata: {doc}\n\n"));
    }
    out.into_bytes()
}

/// The message of a SendMessage / SendStreamingMessage, ~1 KB in the body.
fn message(grants: bool) -> serde_json::Value {
    let mut metadata = serde_json::json!({
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "client": {"name": "board-pack-builder", "version": "2.4.1"},
    });
    if grants {
        metadata["a2a-rust.com/lease"] = serde_json::json!({"ttlMs": 30000});
        let meters = serde_json::json!({"tokens": 50000, "tool-calls": 20});
        metadata["a2a-rust.com/budget"] =
            serde_json::json!({"remainingMs": 30000, "meters": meters});
    }
    serde_json::json!({
        "messageId": "9f1c7e52-8a43-4d3b-b1a2-6c0e9d7f3a15",
        "contextId": CONTEXT_ID,
        "role": "ROLE_USER",
        "parts": [{"text": PROSE}],
        "metadata": metadata,
    })
}

fn send_params(grants: bool) -> serde_json::Value {
    serde_json::json!({
        "configuration": {
            "acceptedOutputModes": ["text/plain", "application/json"],
            "historyLength": 10,
        },
        "message": message(grants),
    })
}

/// A JSON-RPC request body (serde_json orders keys, as the SDK client's
/// recorded requests are ordered).
fn jsonrpc_request(method: &str, grants: bool) -> Vec<u8> {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": RPC_ID,
        "method": method,
        "params": send_params(grants),
    })
    .to_string()
    .into_bytes()
}

/// A REST `message:send` / `message:stream` body.
fn rest_request(grants: bool) -> Vec<u8> {
    send_params(grants).to_string().into_bytes()
}

/// A SendMessage answer: a completed task with its artifact and history
/// (bare, as REST answers it).
fn send_answer() -> String {
    let answer = "Revenue came in at 4 percent over plan and margin held at 31 percent \
        (table R2). The three largest accounts renew in Q3; one of them has asked for a \
        price review (table C1). Hiring is at 92 percent of the approved headcount. The \
        data-centre migration is two weeks late but inside its budget.";
    format!(
        r#"{{"task":{{"id":"{TASK_ID}","contextId":"{CONTEXT_ID}","status":{{"state":"TASK_STATE_COMPLETED","timestamp":"{ts}"}},"artifacts":[{{"artifactId":"summary","name":"board summary","parts":[{{"text":"{answer}"}}]}}],"history":[{{"messageId":"9f1c7e52-8a43-4d3b-b1a2-6c0e9d7f3a15","contextId":"{CONTEXT_ID}","taskId":"{TASK_ID}","role":"ROLE_USER","parts":[{{"text":"{PROSE}"}}]}},{{"messageId":"0c5d1b7e-2f9a-4e61-8b3c-d4a7e9f01b26","contextId":"{CONTEXT_ID}","taskId":"{TASK_ID}","role":"ROLE_AGENT","parts":[{{"text":"Reading the report."}}]}}]}}}}"#,
        ts = timestamp(3)
    )
}

const FIN: u8 = 0x80;
const OP_TEXT: u8 = 0x1;
const OP_CONTINUATION: u8 = 0x0;

/// Appends one WebSocket frame (RFC 6455), with the shortest length form.
fn ws_frame(out: &mut Vec<u8>, b0: u8, mask: Option<[u8; 4]>, payload: &[u8]) {
    let m = if mask.is_some() { 0x80 } else { 0 };
    out.push(b0);
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n <= 0xFFFF => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend(payload.iter().zip(key.iter().cycle()).map(|(b, k)| b ^ k));
        }
        None => out.extend_from_slice(payload),
    }
}

/// A masking key that changes from frame to frame, as a client's does.
fn key(i: usize) -> [u8; 4] {
    let x = (i as u32).wrapping_mul(0x9E37_79B9) ^ 0x5BD1_E995;
    x.to_le_bytes()
}

/// `ITEMS` text frames, one JSON-RPC stream answer each.
fn ws_small_frames(masked: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, doc) in stream_docs(Binding::WebSocket, false).iter().enumerate() {
        ws_frame(
            &mut out,
            FIN | OP_TEXT,
            masked.then(|| key(i)),
            doc.as_bytes(),
        );
    }
    out
}

/// One JSON-RPC text message of about `size` bytes.
fn large_message(size: usize) -> Vec<u8> {
    let mut text = String::with_capacity(size);
    while text.len() + PROSE.len() + 300 < size {
        text.push_str(PROSE);
        text.push(' ');
    }
    rpc_result(&format!(
        r#"{{"artifactUpdate":{{"taskId":"{TASK_ID}","contextId":"{CONTEXT_ID}","artifact":{{"artifactId":"report","parts":[{{"text":"{text}"}}]}},"lastChunk":true}}}}"#
    ))
    .into_bytes()
}

/// `msg` as one text message in fragments of `fragment` bytes.
fn ws_fragmented(msg: &[u8], fragment: usize, masked: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let n = msg.len().div_ceil(fragment);
    for (i, part) in msg.chunks(fragment).enumerate() {
        let op = if i == 0 { OP_TEXT } else { OP_CONTINUATION };
        let fin = if i + 1 == n { FIN } else { 0 };
        ws_frame(&mut out, fin | op, masked.then(|| key(i)), part);
    }
    out
}

/// Frames recorded between an a2a-protocol-client 0.15 WebSocket client and
/// an a2a-protocol-server 0.15 worker (the bytes after the `101`): two
/// masked requests one way, eight unmasked answers the other.
const CLIENT_TO_WORKER: &[u8] = include_bytes!("../tests/fixtures/ws/client_to_worker.bin");
const WORKER_TO_CLIENT: &[u8] = include_bytes!("../tests/fixtures/ws/worker_to_client.bin");

// ---------------------------------------------------------------------------
// The measured loops (also used, once, to check the inputs)
// ---------------------------------------------------------------------------

/// Feeds a stream to a fresh parser; returns (events, data bytes).
fn sse_only(chunks: &[&[u8]]) -> (usize, usize) {
    let mut p = SseParser::new(LIMIT);
    let (mut events, mut bytes) = (0, 0);
    for c in chunks {
        p.feed(black_box(c), |item| match item {
            SseItem::Event { data, .. } => {
                events += 1;
                bytes += data.len();
            }
            SseItem::Overlong => panic!("nothing here is over the limit"),
        });
    }
    (events, bytes)
}

/// Feeds a stream and observes every event, as the proxy does; returns
/// (events naming the task, events reporting spend).
fn sse_observed(binding: Binding, chunks: &[&[u8]]) -> (usize, usize) {
    let mut p = SseParser::new(LIMIT);
    let (mut named, mut spent) = (0, 0);
    for c in chunks {
        p.feed(black_box(c), |item| {
            if let SseItem::Event { data, .. } = item {
                if let Some(o) = observe(binding, data) {
                    named += usize::from(o.task_id.is_some());
                    spent += usize::from(o.spent.is_some());
                    black_box(&o);
                }
            }
        });
    }
    (named, spent)
}

/// Feeds frames to a fresh parser; returns (text messages, their bytes).
fn ws_texts(chunks: &[&[u8]]) -> (usize, usize) {
    let mut p = WsParser::new(LIMIT);
    let (mut texts, mut bytes) = (0, 0);
    for c in chunks {
        p.feed(black_box(c), |item| match item {
            WsItem::Text(t) => {
                texts += 1;
                bytes += t.len();
            }
            WsItem::Invalid(_) | WsItem::Overlong | WsItem::Compressed => {
                panic!("unexpected {item:?}")
            }
            _ => {}
        });
    }
    (texts, bytes)
}

fn chunked(bytes: &[u8], size: usize) -> Vec<&[u8]> {
    bytes.chunks(size).collect()
}

// ---------------------------------------------------------------------------
// Benches
// ---------------------------------------------------------------------------

fn sse(c: &mut Criterion) {
    let mut g = c.benchmark_group("sse");
    for (name, binding) in [("jsonrpc", Binding::JsonRpc), ("rest", Binding::Rest)] {
        let stream = sse_stream(binding, false);
        let sizes: &[(&str, usize)] = match binding {
            // 64-byte chunks once: the framing differs only inside `data`.
            Binding::JsonRpc => &[
                ("whole", usize::MAX),
                ("chunks_1460", SEGMENT),
                ("chunks_64", 64),
            ],
            _ => &[("whole", usize::MAX), ("chunks_1460", SEGMENT)],
        };
        g.throughput(Throughput::Bytes(stream.len() as u64));
        for &(how, size) in sizes {
            let chunks = chunked(&stream, size);
            assert_eq!(sse_only(&chunks).0, ITEMS, "{name}/{how}");
            g.bench_with_input(BenchmarkId::new(name, how), &chunks, |b, chunks| {
                b.iter(|| sse_only(chunks))
            });
        }
    }
    g.finish();
}

fn sse_observe(c: &mut Criterion) {
    let mut g = c.benchmark_group("sse_observe");
    for (name, binding, budget) in [
        ("jsonrpc", Binding::JsonRpc, false),
        ("rest", Binding::Rest, false),
        ("jsonrpc_budget", Binding::JsonRpc, true),
    ] {
        let stream = sse_stream(binding, budget);
        let chunks = chunked(&stream, SEGMENT);
        // Every event names the task; with budget metadata, every status
        // update (all events but the first and the artifact) reports spend.
        let want_spent = if budget { ITEMS - 2 } else { 0 };
        assert_eq!(
            sse_observed(binding, &chunks),
            (ITEMS, want_spent),
            "{name}"
        );
        g.throughput(Throughput::Bytes(stream.len() as u64));
        g.bench_with_input(
            BenchmarkId::new(name, "chunks_1460"),
            &chunks,
            |b, chunks| b.iter(|| sse_observed(binding, chunks)),
        );
    }
    g.finish();
}

fn request_facts(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_facts");
    for (name, method, grants) in [
        ("send_message", "SendMessage", false),
        ("send_message_grants", "SendMessage", true),
        (
            "send_streaming_message_grants",
            "SendStreamingMessage",
            true,
        ),
    ] {
        let body = jsonrpc_request(method, grants);
        assert!(
            (900..1300).contains(&body.len()),
            "{name}: {} B",
            body.len()
        );
        let f = jsonrpc_facts(&body).expect("a JSON-RPC request");
        assert_eq!(f.method, A2aMethod::from_jsonrpc(method), "{name}");
        assert!(f.method.is_some(), "{name}");
        assert_eq!(f.lease.is_some(), grants, "{name}");
        assert_eq!(matches!(f.budget, Some(Ok(_))), grants, "{name}");
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::new("jsonrpc", name), &body, |b, body| {
            b.iter(|| jsonrpc_facts(black_box(body)))
        });
    }
    for (name, grants) in [("send_message", false), ("send_message_grants", true)] {
        let body = rest_request(grants);
        let f = rest_facts(&body).expect("a REST body");
        assert!(
            serde_json::from_slice::<serde_json::Value>(&body).is_ok(),
            "{name}"
        );
        assert_eq!(matches!(f.lease, Some(Ok(30000))), grants, "{name}");
        assert_eq!(matches!(f.budget, Some(Ok(_))), grants, "{name}");
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::new("rest", name), &body, |b, body| {
            b.iter(|| rest_facts(black_box(body)))
        });
    }
    g.finish();
}

fn observe_answer(c: &mut Criterion) {
    let mut g = c.benchmark_group("observe");
    let rest = send_answer();
    for (name, binding, doc) in [
        ("jsonrpc", Binding::JsonRpc, rpc_result(&rest)),
        ("rest", Binding::Rest, rest.clone()),
    ] {
        let doc = doc.into_bytes();
        assert!((900..1600).contains(&doc.len()), "{name}: {} B", doc.len());
        serde_json::from_slice::<serde_json::Value>(&doc).expect("valid JSON");
        let o = observe(binding, &doc).expect("an A2A answer");
        assert_eq!(o.state, Some(TaskState::Completed), "{name}");
        assert!(o.task_id.is_some() && o.context_id.is_some(), "{name}");
        g.throughput(Throughput::Bytes(doc.len() as u64));
        g.bench_with_input(
            BenchmarkId::new(name, "send_message_answer"),
            &doc,
            |b, doc| b.iter(|| observe(binding, black_box(doc)).map(|o| o.state)),
        );
    }
    g.finish();
}

fn ws(c: &mut Criterion) {
    let mut g = c.benchmark_group("ws");

    let unmasked = ws_small_frames(false);
    let masked = ws_small_frames(true);
    let large = large_message(512 << 10);
    let large_unmasked = ws_fragmented(&large, 16 << 10, false);
    let large_masked = ws_fragmented(&large, 16 << 10, true);
    // The reassembled large message is the one sent, unmasked.
    for framed in [&large_unmasked, &large_masked] {
        let mut p = WsParser::new(LIMIT);
        let mut got = None;
        p.feed(framed, |item| {
            if let WsItem::Text(t) = item {
                got = Some(t == large.as_slice());
            }
        });
        assert_eq!(got, Some(true));
    }

    let c2w: Vec<u8> = CLIENT_TO_WORKER.repeat(ITEMS / 2);
    let w2c: Vec<u8> = WORKER_TO_CLIENT.repeat(ITEMS / 8);

    let cases: [(&str, &str, &[u8], usize, usize); 7] = [
        ("small_unmasked", "whole", &unmasked, usize::MAX, ITEMS),
        ("small_unmasked", "chunks_1460", &unmasked, SEGMENT, ITEMS),
        ("small_masked", "whole", &masked, usize::MAX, ITEMS),
        (
            "large_fragmented_unmasked",
            "whole",
            &large_unmasked,
            usize::MAX,
            1,
        ),
        (
            "large_fragmented_masked",
            "whole",
            &large_masked,
            usize::MAX,
            1,
        ),
        (
            "recorded_worker_to_client",
            "whole",
            &w2c,
            usize::MAX,
            ITEMS,
        ),
        (
            "recorded_client_to_worker",
            "whole",
            &c2w,
            usize::MAX,
            ITEMS,
        ),
    ];
    for (name, how, bytes, size, texts) in cases {
        let chunks = chunked(bytes, size);
        assert_eq!(ws_texts(&chunks).0, texts, "{name}/{how}");
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_with_input(BenchmarkId::new(name, how), &chunks, |b, chunks| {
            b.iter(|| ws_texts(chunks))
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = parsers;
    config = config();
    targets = sse, sse_observe, request_facts, observe_answer, ws
}
criterion_main!(parsers);
