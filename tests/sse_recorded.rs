//! The gateway's SSE parser on streams recorded from the real workers, fed
//! whole, split at every byte boundary, and byte by byte: the observations
//! (task id, states) must never depend on where the chunks fall.

use a2a_gateway::a2a::observe::observe;
use a2a_gateway::a2a::sse::{SseItem, SseParser};
use a2a_gateway::a2a::{Binding, Observation};
use serde_json::json;

use crate::harness::http::request;
use crate::harness::worker::{message, Bind, Kind, Worker};

/// Records one whole stream straight from the worker (body dechunked).
async fn record(worker: &Worker, bind: Bind, text: &str) -> Vec<u8> {
    let headers = [
        ("content-type", "application/json"),
        ("accept", "text/event-stream"),
    ];
    let resp = match bind {
        Bind::JsonRpc => {
            let body = json!({"jsonrpc": "2.0", "id": 7, "method": "SendStreamingMessage", "params": {"message": message(text)}});
            request(
                "POST",
                &worker.url(),
                "/",
                &headers,
                body.to_string().as_bytes(),
            )
            .await
        }
        Bind::Rest => {
            let body = json!({"message": message(text)});
            request(
                "POST",
                &worker.url(),
                "/message:stream",
                &headers,
                body.to_string().as_bytes(),
            )
            .await
        }
    };
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/event-stream"));
    resp.body
}

fn parse(binding: Binding, chunks: &[&[u8]]) -> Vec<Observation<'static>> {
    let mut parser = SseParser::new(1 << 20);
    let mut out = Vec::new();
    for chunk in chunks {
        parser.feed(chunk, |item| match item {
            SseItem::Event { data, .. } => out.push(
                observe(binding, data)
                    .expect("every event is an A2A document")
                    .into_owned(),
            ),
            SseItem::Overlong => panic!("nothing here is over the limit"),
        });
    }
    out
}

async fn every_split(kind: Kind, bind: Bind, text: &str, last_state: &str) {
    let worker = Worker::start(kind).await;
    let raw = record(&worker, bind, text).await;
    let binding = match bind {
        Bind::JsonRpc => Binding::JsonRpc,
        Bind::Rest => Binding::Rest,
    };
    let whole = parse(binding, &[&raw]);
    assert!(
        whole.len() >= 3,
        "a few events: {}",
        String::from_utf8_lossy(&raw)
    );
    let id = whole[0]
        .task_id
        .clone()
        .expect("the first event names the task");
    assert!(whole.iter().all(|o| o.task_id.as_deref() == Some(&*id)));
    assert_eq!(
        whole.last().unwrap().state.map(|s| s.as_wire()),
        Some(last_state)
    );
    for i in 0..=raw.len() {
        assert_eq!(
            parse(binding, &[&raw[..i], &raw[i..]]),
            whole,
            "split at byte {i}"
        );
    }
    let bytes: Vec<&[u8]> = raw.chunks(1).collect();
    assert_eq!(parse(binding, &bytes), whole, "byte by byte");
}

#[tokio::test]
async fn rust_jsonrpc_stream_every_split() {
    every_split(
        Kind::Rust,
        Bind::JsonRpc,
        "work:350",
        "TASK_STATE_COMPLETED",
    )
    .await;
}

#[tokio::test]
async fn rust_rest_stream_every_split() {
    every_split(Kind::Rust, Bind::Rest, "ask", "TASK_STATE_INPUT_REQUIRED").await;
}

#[tokio::test]
async fn python_jsonrpc_stream_every_split() {
    every_split(
        Kind::Python,
        Bind::JsonRpc,
        "work:350",
        "TASK_STATE_COMPLETED",
    )
    .await;
}

#[tokio::test]
async fn python_rest_stream_every_split() {
    every_split(Kind::Python, Bind::Rest, "ask", "TASK_STATE_INPUT_REQUIRED").await;
}
