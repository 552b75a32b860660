//! The gateway's upstream HTTP/1 connections, as the vendored pingora-proxy
//! keeps and writes them (vendor/pingora-proxy/PATCHED.md): first its pool
//! (`h1_pool`) against real sockets, then the gateway in front of real
//! workers, through a relay that counts the connections the gateway opens
//! and closes, and with request bodies of every shape (`held_head`); last,
//! the task pipes between an exchange's two halves (`task_pipe`) on their
//! own (every test through the gateway runs its exchanges through them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::protocols::Stream;
use pingora::proxy::h1_pool::H1Pool;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::gateway::Gateway;
use crate::harness::http::{parse_response, post_json, split_url, Response};
use crate::harness::python_worker::PythonWorker;
use crate::harness::relay::Relay;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::worker::{message, Kind, Worker};
use crate::harness::{scaled_ms, scaled_secs};

/// A connected pair: the pool's side as a pingora `Stream`, and the
/// upstream's side.
async fn pair() -> (Stream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = TcpStream::connect(addr).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let stream: Stream = Box::new(pingora::protocols::l4::stream::Stream::from(client));
    (stream, server)
}

fn pool(size: usize) -> Arc<H1Pool> {
    H1Pool::new(size, Arc::new(AtomicU64::new(0)))
}

#[tokio::test]
async fn takes_back_the_newest_idle_connection_of_its_peer() {
    let pool = pool(8);
    let (a, _sa) = pair().await;
    let (b, _sb) = pair().await;
    let (a_id, b_id) = (a.id(), b.id());
    pool.put(1, a, None);
    pool.put(1, b, None);
    assert!(pool.take(2).is_none(), "another peer's connection");
    assert_eq!(pool.take(1).unwrap().id(), b_id);
    assert_eq!(pool.take(1).unwrap().id(), a_id);
    assert!(pool.take(1).is_none());
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_not_reused() {
    let pool = pool(8);
    let (a, sa) = pair().await;
    let (b, mut sb) = pair().await;
    pool.put(1, a, None);
    pool.put(1, b, None);
    drop(sa);
    sb.shutdown().await.unwrap();
    tokio::time::sleep(scaled_ms(50)).await;
    // b (newest) closed: skipped; a closed too: none left.
    assert!(pool.take(1).is_none());
    let (c, _sc) = pair().await;
    let c_id = c.id();
    pool.put(1, c, None);
    assert_eq!(pool.take(1).unwrap().id(), c_id);
}

#[tokio::test]
async fn unexpected_data_drops_the_connection_and_is_counted() {
    let counter = Arc::new(AtomicU64::new(0));
    let pool = H1Pool::new(8, counter.clone());
    let (a, mut sa) = pair().await;
    pool.put(1, a, None);
    sa.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
    tokio::time::sleep(scaled_ms(50)).await;
    assert!(pool.take(1).is_none());
    assert_eq!(counter.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn idle_timeout_and_size_bound_what_is_kept() {
    let pool = pool(2);
    let (a, _sa) = pair().await;
    pool.put(1, a, Some(Duration::ZERO));
    assert_eq!(pool.idle_count(), 0, "a zero idle timeout keeps nothing");
    let (a, _sa) = pair().await;
    let (b, _sb) = pair().await;
    let (c, _sc) = pair().await;
    let (b_id, c_id) = (b.id(), c.id());
    pool.put(1, a, None);
    pool.put(1, b, None);
    pool.put(2, c, None);
    assert_eq!(pool.idle_count(), 2, "the oldest was closed for room");
    assert_eq!(pool.take(1).unwrap().id(), b_id);
    assert_eq!(pool.take(2).unwrap().id(), c_id);

    let (d, _sd) = pair().await;
    pool.put(1, d, Some(Duration::from_millis(20)));
    // Past its 20 ms.
    tokio::time::sleep(Duration::from_millis(20) + scaled_ms(20)).await;
    assert!(pool.take(1).is_none(), "past its idle timeout");
}

#[tokio::test]
async fn the_sweeper_closes_what_the_upstream_closed() {
    let pool = pool(8);
    let (a, sa) = pair().await;
    let (b, _sb) = pair().await;
    pool.put(1, a, None);
    pool.put(2, b, None);
    drop(sa);
    tokio::time::sleep(scaled_ms(50)).await;
    pool.sweep(Instant::now());
    assert_eq!(pool.idle_count(), 1);
    let (c, _sc) = pair().await;
    pool.put(3, c, Some(Duration::from_millis(10)));
    pool.sweep(Instant::now() + Duration::from_millis(20));
    assert_eq!(pool.idle_count(), 1, "past its idle timeout");
}

fn send_message(text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message(text)}})
}

/// One SendMessage through the gateway, answered by the worker.
async fn completed(gw: &Gateway) {
    let resp = post_json(&gw.url, "/", &[], &send_message("quick")).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let state = resp.json()["result"]["task"]["status"]["state"].clone();
    assert_eq!(state, "TASK_STATE_COMPLETED", "{}", resp.text());
}

/// Polls `cond` every 50 ms until it holds or `within` passes.
async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

/// Sequential requests reuse one upstream connection. When the worker
/// (uvicorn, which closes a connection idle for 5 s) closes it, the gateway
/// closes its side within the sweeper's second instead of leaving it in
/// CLOSE_WAIT until the next request, and the next request opens a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_worker_closing_idle_connections() {
    let worker = PythonWorker::start().await;
    let (authority, _) = split_url(&worker.url());
    let relay = Relay::start(authority).await;
    let gw = Gateway::in_front_of(&format!("http://127.0.0.1:{}", relay.port), "").await;
    for _ in 0..20 {
        completed(&gw).await;
    }
    assert_eq!(
        relay.accepted(),
        1,
        "20 sequential requests, one connection"
    );
    assert_eq!(relay.live(), 1);
    // uvicorn's keep-alive timeout (5 s), then the gateway's sweep (1 s).
    assert!(
        eventually(Duration::from_secs(5 + 1) + scaled_secs(3), || relay.live()
            == 0)
        .await,
        "the gateway kept the connection the worker closed; log:\n{}",
        gw.log_text()
    );
    completed(&gw).await;
    assert_eq!(relay.accepted(), 2);
}

/// Concurrent requests open no more connections than are in flight at
/// once; a worker that drops every connection (a restart) costs the callers
/// nothing: the next requests find the pooled connections closed and open
/// new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_worker_concurrent_requests_and_a_restart() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let (authority, _) = split_url(&worker.url());
    let relay = Relay::start(authority).await;
    let gw = Gateway::in_front_of(&format!("http://127.0.0.1:{}", relay.port), "").await;
    let gw = Arc::new(gw);
    for _ in 0..10 {
        let rounds: Vec<_> = (0..8)
            .map(|_| {
                let gw = gw.clone();
                tokio::spawn(async move { completed(&gw).await })
            })
            .collect();
        for r in rounds {
            r.await.unwrap();
        }
    }
    let opened = relay.accepted();
    assert!(
        (1..=8).contains(&opened),
        "80 requests, 8 at a time, opened {opened} connections"
    );
    relay.cut_all();
    assert!(eventually(scaled_secs(2), || relay.live() == 0).await);
    for _ in 0..5 {
        completed(&gw).await;
    }
    assert!(relay.accepted() > opened, "new connections after the cut");
    // pingora-core logs "failed to acquire reusable stream" at ERROR when a
    // request takes a pooled connection the pool's idle watcher still
    // holds for an instant (the watcher is closing it after the cut): the
    // request then opens a new connection, as the assertions above show.
    // Any other ERROR fails the test.
    let log = gw.log_text();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR"))
        .filter(|l| !l.contains("pingora_core::connectors: failed to acquire reusable stream"))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}\n{log}");
}

/// What a caller sends, in turn: each part after its pause; `None` waits
/// for a `100 Continue`.
type Parts = Vec<(Duration, Option<Vec<u8>>)>;

/// Sends `parts` to `authority` in turn, each after its pause, and reads
/// the answer to its end (every request here says `connection: close`).
/// A part `None` waits for a `100 Continue` (within 2 s, scaled) before going on.
async fn exchange(authority: &str, parts: &[(Duration, Option<&[u8]>)]) -> Response {
    let mut sock = TcpStream::connect(authority).await.unwrap();
    let mut raw = Vec::new();
    for (pause, part) in parts {
        tokio::time::sleep(*pause).await;
        match part {
            Some(bytes) => sock.write_all(bytes).await.unwrap(),
            None => {
                let mut buf = vec![0u8; 1024];
                let n = tokio::time::timeout(scaled_secs(2), sock.read(&mut buf))
                    .await
                    .unwrap_or_else(|_| panic!("no 100 Continue within {:?}", scaled_secs(2)))
                    .unwrap();
                let got = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(got.starts_with("HTTP/1.1 100"), "{got}");
            }
        }
    }
    tokio::time::timeout(scaled_secs(20), sock.read_to_end(&mut raw))
        .await
        .unwrap_or_else(|_| panic!("no answer within {:?}", scaled_secs(20)))
        .unwrap();
    parse_response(&raw)
}

/// A request whose body the gateway read first goes to the worker as its
/// head and body in one write (vendor/pingora-proxy's `held_head`): every
/// shape of body still reaches each worker whole and is answered, including
/// a body sent long after its head, one larger than the gateway's pre-read,
/// a chunked one, and one behind `Expect: 100-continue` that the worker
/// itself must answer (a held head there would leave both sides waiting).
/// The same with no read-ahead on callers' connections (`server.read_buffer`'s
/// default), with one smaller than a head (1 KiB against a 3 KiB head) and
/// with one larger (4 KiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_of_every_shape_reach_the_worker() {
    for kind in [Kind::Rust, Kind::Python] {
        let worker = Worker::start(kind).await;
        for read_buffer in ["", "read_buffer = \"1KiB\"\n", "read_buffer = \"4KiB\"\n"] {
            bodies_of_every_shape(kind, &worker, read_buffer).await;
        }
    }
}

/// One gateway (`read_buffer`: `[server]` keys) in front of `worker`, and
/// each shape of request body through it.
async fn bodies_of_every_shape(kind: Kind, worker: &Worker, read_buffer: &str) {
    // Keys before the first table header land in the harness's `[server]`.
    let gw = Gateway::start(&format!(
        "{read_buffer}[[routes]]\nname = \"w\"\nworker = \"{}\"\n",
        worker.url()
    ))
    .await;
    let (authority, _) = split_url(&gw.url);
    let small = send_message("quick").to_string();
    let mut big_message = message("quick");
    big_message["metadata"] = json!({"pad": "x".repeat(200 * 1024)});
    let big = json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage",
        "params": {"message": big_message}})
    .to_string();
    let head = |len: usize, extra: &str| {
        format!(
            "POST / HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\na2a-version: 1.0\r\nconnection: close\r\n{extra}content-length: {len}\r\n\r\n"
        )
    };
    let chunked = format!(
        "POST / HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\na2a-version: 1.0\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{small}\r\n0\r\n\r\n",
        small.len()
    );
    let now = Duration::ZERO;
    let later = Duration::from_millis(300);
    let cases: Vec<(&str, Parts)> = vec![
        (
            "small, one write",
            vec![(
                now,
                Some(format!("{}{small}", head(small.len(), "")).into_bytes()),
            )],
        ),
        (
            "small, body 300 ms after the head",
            vec![
                (now, Some(head(small.len(), "").into_bytes())),
                (later, Some(small.clone().into_bytes())),
            ],
        ),
        (
            "200 KiB",
            vec![(
                now,
                Some(format!("{}{big}", head(big.len(), "")).into_bytes()),
            )],
        ),
        (
            "200 KiB behind expect: 100-continue",
            vec![
                (
                    now,
                    Some(head(big.len(), "expect: 100-continue\r\n").into_bytes()),
                ),
                (now, None),
                (now, Some(big.clone().into_bytes())),
            ],
        ),
        ("chunked", vec![(now, Some(chunked.into_bytes()))]),
        (
            "a 3 KiB head",
            vec![(
                now,
                Some(
                    format!(
                        "{}{small}",
                        head(small.len(), &format!("x-pad: {}\r\n", "p".repeat(3 * 1024)))
                    )
                    .into_bytes(),
                ),
            )],
        ),
    ];
    for (name, parts) in cases {
        let parts: Vec<(Duration, Option<&[u8]>)> =
            parts.iter().map(|(d, p)| (*d, p.as_deref())).collect();
        let resp = exchange(&authority, &parts).await;
        let case = format!("{kind:?}, {read_buffer:?}, {name}");
        assert_eq!(resp.status, 200, "{case}: {}", resp.text());
        assert_eq!(
            resp.json()["result"]["task"]["status"]["state"],
            "TASK_STATE_COMPLETED",
            "{case}: {}",
            resp.text()
        );
    }
}

// ── The task pipes between an exchange's halves (`task_pipe`) ───────────────

/// A pipe of 4: values come out in the order they went in, around the ring
/// more than once; a fifth slot is refused until one is taken or a held one
/// is given back; `recv` ends (`None`) only after the values sent before
/// the sender went.
#[tokio::test]
async fn a_pipe_keeps_order_and_its_bound() {
    use pingora::proxy::task_pipe::{channel, TrySendError};

    let (tx, mut rx) = channel::<u32, 4>();
    let mut next = 0;
    for round in 0..3 {
        for _ in 0..4 {
            tx.send(next).await.unwrap();
            next += 1;
        }
        assert!(
            matches!(tx.try_reserve(), Err(TrySendError::Full(()))),
            "round {round}: a fifth slot"
        );
        for want in next - 4..next {
            assert_eq!(rx.recv().await, Some(want));
        }
    }
    // A held slot counts against the bound until it is given back.
    let held: Vec<_> = (0..4).map(|_| tx.try_reserve().unwrap()).collect();
    assert!(matches!(tx.try_reserve(), Err(TrySendError::Full(()))));
    drop(held);
    let permit = tx.try_reserve().expect("slots given back");
    permit.send(100);
    tx.send(101).await.unwrap();
    drop(tx);
    assert_eq!(rx.recv().await, Some(100));
    assert_eq!(rx.recv().await, Some(101));
    assert_eq!(rx.recv().await, None);
    assert_eq!(rx.recv().await, None);
}

/// Each end wakes the other across tasks: a sender waiting on a full pipe
/// goes on when a value is taken, a receiver waiting on an empty one when a
/// value arrives or the sender goes, and a sender waiting for a slot fails
/// when the receiver goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipe_wakes_the_other_end() {
    use pingora::proxy::task_pipe::{channel, SendError};
    let within = scaled_secs(5);

    // 1,000 values through a pipe of 4, the receiver slower at first.
    let (tx, mut rx) = channel::<u32, 4>();
    let sender = tokio::spawn(async move {
        for i in 0..1000 {
            tx.send(i).await.unwrap();
        }
    });
    tokio::time::sleep(scaled_ms(50)).await;
    for want in 0..1000 {
        let got = tokio::time::timeout(within, rx.recv())
            .await
            .expect("woken");
        assert_eq!(got, Some(want));
    }
    sender.await.unwrap();
    assert_eq!(rx.recv().await, None, "the sender is gone");

    // A receiver waiting on an empty pipe: woken by the sender's going.
    let (tx, mut rx) = channel::<u32, 4>();
    let receiver = tokio::spawn(async move { rx.recv().await });
    tokio::time::sleep(scaled_ms(50)).await;
    drop(tx);
    assert_eq!(
        tokio::time::timeout(within, receiver)
            .await
            .unwrap()
            .unwrap(),
        None
    );

    // A sender waiting for a slot: woken by the receiver's going, with its
    // value given back; later sends fail at once.
    let (tx, rx) = channel::<u32, 4>();
    for i in 0..4 {
        tx.send(i).await.unwrap();
    }
    let tx = Arc::new(tx);
    let waiting = tokio::spawn({
        let tx = tx.clone();
        async move { tx.send(4).await }
    });
    tokio::time::sleep(scaled_ms(50)).await;
    assert!(!waiting.is_finished(), "the pipe is full");
    assert!(!tx.is_closed());
    drop(rx);
    let res = tokio::time::timeout(within, waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(res, Err(SendError(4))), "{res:?}");
    assert!(tx.is_closed());
    assert!(tx.reserve().await.is_err());
}

/// Values left in a pipe are dropped when its receiver goes (a body's bytes
/// are not held for the sender's life), and a value sent through a permit
/// after that is dropped at once.
#[tokio::test]
async fn a_closed_pipe_lets_go_of_its_values() {
    use pingora::proxy::task_pipe::channel;
    let value = Arc::new(());
    let (tx, rx) = channel::<Arc<()>, 4>();
    tx.send(value.clone()).await.unwrap();
    tx.send(value.clone()).await.unwrap();
    let permit = tx.try_reserve().unwrap();
    assert_eq!(Arc::strong_count(&value), 3);
    drop(rx);
    assert_eq!(Arc::strong_count(&value), 1, "dropped with the receiver");
    permit.send(value.clone());
    assert_eq!(Arc::strong_count(&value), 1, "dropped at once");
}
