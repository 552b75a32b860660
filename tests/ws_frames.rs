//! The gateway's WebSocket frame parser on frames recorded between a real
//! a2a-protocol-client 0.15 WebSocket client and a real a2a-protocol-server
//! 0.15 worker, through a recording TCP relay: each direction (client→worker
//! masked, worker→client not) is fed whole, split at every byte, byte by
//! byte and in the chunks TCP delivered, and must give the same items, whose
//! text messages are the JSON-RPC calls and answers that were exchanged.
//!
//! With `A2A_RECORD_WS_FIXTURES=1` the recording is also written to
//! `tests/fixtures/ws/{client_to_worker,worker_to_client}.bin`, which the
//! parser's unit tests read (so they need no worker).

use std::sync::{Arc, Mutex};

use a2a_gateway::a2a::ws::{OwnedWsItem, WsItem, WsParser};
use a2a_protocol_client::transport::websocket::{WebSocketTransport, WebSocketTransportConfig};
use a2a_protocol_client::ClientBuilder;
use a2a_protocol_types::{
    Message, MessageRole, MessageSendParams, Part, StreamResponse, TaskQueryParams, TaskState,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::scaled_secs;

/// The reads of one direction, as TCP delivered them.
type Recording = Arc<Mutex<Vec<Vec<u8>>>>;

/// A one-connection TCP relay that records both directions.
struct Relay {
    port: u16,
    up: Recording,
    down: Recording,
    task: JoinHandle<()>,
}

impl Relay {
    async fn start(target: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let port = listener.local_addr().unwrap().port();
        let up = Recording::default();
        let down = Recording::default();
        let (up2, down2) = (up.clone(), down.clone());
        let task = tokio::spawn(async move {
            let (client, _) = listener.accept().await.expect("accept");
            let worker = TcpStream::connect(target).await.expect("connect worker");
            let (cr, cw) = client.into_split();
            let (wr, ww) = worker.into_split();
            tokio::join!(pump(cr, ww, up2), pump(wr, cw, down2));
        });
        Relay {
            port,
            up,
            down,
            task,
        }
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, rec: Recording) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        rec.lock().unwrap().push(buf[..n].to_vec());
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The recorded chunks after the HTTP upgrade head (which must start with
/// `head_start`), and the HTTP head itself.
fn after_upgrade(rec: &Recording, head_start: &str) -> (String, Vec<Vec<u8>>) {
    let chunks = rec.lock().unwrap().clone();
    let all = chunks.concat();
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP head")
        + 4;
    let head = String::from_utf8_lossy(&all[..end]).into_owned();
    assert!(head.starts_with(head_start), "{head}");
    // Re-cut the TCP chunks at the end of the head.
    let mut out = Vec::new();
    let mut at = 0;
    for c in chunks {
        let (from, to) = (at, at + c.len());
        at = to;
        if to > end {
            out.push(c[end.saturating_sub(from)..].to_vec());
        }
    }
    (head, out)
}

type Got = OwnedWsItem;

fn parse(chunks: &[&[u8]]) -> Vec<Got> {
    let mut p = WsParser::new(4 << 20);
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, |item| {
            if let WsItem::Text(t) = item {
                assert!(std::str::from_utf8(t).is_ok(), "UTF-8 text");
            }
            out.push(item.to_owned_item());
        });
    }
    assert!(!p.is_stopped(), "{out:?}");
    out
}

/// Parses one direction every way and checks that the items never depend on
/// where the chunks fall; returns its text messages as JSON.
fn every_split(name: &str, tcp_chunks: &[Vec<u8>]) -> Vec<Value> {
    let raw = tcp_chunks.concat();
    assert!(!raw.is_empty(), "{name}: no frames recorded");
    let whole = parse(&[&raw]);
    assert!(
        whole
            .iter()
            .all(|g| matches!(g, Got::Text(_) | Got::Close(_) | Got::Ping | Got::Pong)),
        "{name}: {whole:?}"
    );
    let as_sent: Vec<&[u8]> = tcp_chunks.iter().map(|c| &c[..]).collect();
    assert_eq!(parse(&as_sent), whole, "{name}: as TCP delivered");
    for i in 0..=raw.len() {
        assert_eq!(
            parse(&[&raw[..i], &raw[i..]]),
            whole,
            "{name}: split at {i}"
        );
    }
    // Three chunks: the first cut at every byte of the first frames, the
    // second all along.
    for i in 0..raw.len().min(120) {
        for j in (i..=raw.len()).step_by(29) {
            assert_eq!(
                parse(&[&raw[..i], &raw[i..j], &raw[j..]]),
                whole,
                "{name}: split at {i},{j}"
            );
        }
    }
    let bytes: Vec<&[u8]> = raw.chunks(1).collect();
    assert_eq!(parse(&bytes), whole, "{name}: byte by byte");
    whole
        .iter()
        .filter_map(|g| match g {
            Got::Text(t) => Some(serde_json::from_slice(t).expect("JSON text message")),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn recorded_ws_frames_parse_the_same_at_every_split() {
    let w = RustWorker::start(RustWorkerOptions {
        websocket: true,
        lease_store: false,
        ..RustWorkerOptions::default()
    })
    .await;
    let ws = w.ws_url().expect("ws url");
    let target = ws
        .trim_start_matches("ws://")
        .trim_end_matches("/ws")
        .to_string();
    let relay = Relay::start(target).await;
    let via = format!("ws://127.0.0.1:{}/ws", relay.port);

    let transport =
        WebSocketTransport::connect_with_config(via.clone(), WebSocketTransportConfig::default())
            .await
            .expect("ws connect");
    let client = ClientBuilder::new(via)
        .with_custom_transport(transport)
        .build()
        .expect("client");
    let msg = Message::new(
        "ws-frames-1",
        MessageRole::User,
        vec![Part::text("work:300")],
    );
    let mut stream = client
        .stream_message(MessageSendParams::new(msg))
        .await
        .expect("stream");
    let mut id = None;
    let mut last = None;
    let mut events = 0;
    while let Some(ev) = tokio::time::timeout(scaled_secs(5), stream.next())
        .await
        .expect("ws event in time")
    {
        events += 1;
        match ev.expect("event") {
            StreamResponse::Task(t) => {
                id.get_or_insert(t.id.to_string());
                last = Some(t.status.state);
            }
            StreamResponse::StatusUpdate(u) => {
                id.get_or_insert(u.task_id.to_string());
                last = Some(u.status.state);
            }
            _ => {}
        }
    }
    assert_eq!(last, Some(TaskState::Completed));
    let id = id.expect("a task id");
    let task = client
        .get_task(TaskQueryParams::new(id.clone()))
        .await
        .expect("GetTask over ws");
    assert_eq!(task.status.state, TaskState::Completed);

    // Close the client; the relay ends when both sides have closed (or we
    // stop waiting: every answer is in already).
    drop(stream);
    drop(client);
    let _ = tokio::time::timeout(scaled_secs(3), relay.task).await;

    let (req_head, up) = after_upgrade(&relay.up, "GET /ws ");
    let (resp_head, down) = after_upgrade(&relay.down, "HTTP/1.1 101");
    assert!(
        req_head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{req_head}"
    );
    assert!(
        !resp_head
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions"),
        "no permessage-deflate: {resp_head}"
    );
    let up_raw = up.concat();
    let down_raw = down.concat();
    assert_ne!(up_raw[1] & 0x80, 0, "client frames are masked");
    assert_eq!(down_raw[1] & 0x80, 0, "worker frames are not masked");

    if std::env::var_os("A2A_RECORD_WS_FIXTURES").is_some() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/ws");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("client_to_worker.bin"), &up_raw).unwrap();
        std::fs::write(dir.join("worker_to_client.bin"), &down_raw).unwrap();
    }

    // Client → worker: the two requests, in order.
    let requests = every_split("client to worker", &up);
    let methods: Vec<&str> = requests
        .iter()
        .map(|r| r["method"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(methods, ["SendStreamingMessage", "GetTask"], "{requests:?}");
    for r in &requests {
        assert_eq!(r["jsonrpc"], "2.0", "{r}");
        assert!(r["id"].is_string(), "{r}");
    }
    assert_eq!(requests[1]["params"]["id"], id.as_str());
    let (stream_id, get_id) = (&requests[0]["id"], &requests[1]["id"]);

    // Worker → client: one frame per stream event, then stream_complete,
    // then the GetTask answer.
    let answers = every_split("worker to client", &down);
    for a in &answers {
        assert_eq!(a["jsonrpc"], "2.0", "{a}");
        assert!(a.get("error").is_none(), "{a}");
        assert!(a.get("result").is_some(), "{a}");
    }
    let streamed: Vec<&Value> = answers.iter().filter(|a| &a["id"] == stream_id).collect();
    assert_eq!(streamed.len(), events + 1, "{answers:?}");
    assert_eq!(
        streamed.last().unwrap()["result"],
        serde_json::json!({"status": "stream_complete"})
    );
    assert_eq!(
        streamed[0]["result"]["task"]["id"],
        id.as_str(),
        "the stream opens with the task"
    );
    let got: Vec<&Value> = answers.iter().filter(|a| &a["id"] == get_id).collect();
    assert_eq!(got.len(), 1, "{answers:?}");
    assert_eq!(got[0]["result"]["id"], id.as_str());
    assert_eq!(got[0]["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(answers.len(), streamed.len() + 1, "{answers:?}");
}
