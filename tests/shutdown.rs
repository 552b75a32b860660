//! Graceful shutdown (`timeouts.drain`): SIGTERM refuses new connections,
//! lets requests in flight finish, sends the cancels their ends owe, and
//! exits as soon as nothing is left. Before, SIGTERM cut every request at
//! once (its caller saw the connection drop) and no cascade ran for them.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::gateway::Gateway;
use crate::harness::http::post_json;
use crate::harness::worker::{message, send_stream, Bind, Kind, Worker};
use crate::harness::{scaled_ms, scaled_secs};

const WORKING: &str = "TASK_STATE_WORKING";

fn route(worker: &str, drain: &str) -> String {
    format!("[timeouts]\ndrain = \"{drain}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{worker}\"\n")
}

/// A blocking `SendMessage` in flight when SIGTERM comes gets its whole
/// answer; a new connection is refused meanwhile; the process exits right
/// after, not at the end of the 30 s drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_finishes_then_the_gateway_exits() {
    let worker = Worker::start(Kind::Python).await;
    let mut gw = Gateway::start(&route(&worker.url(), "30s")).await;
    let url = gw.url.clone();
    let call = tokio::spawn(async move {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": message("work:1500")}});
        post_json(&url, "/", &[], &body).await
    });
    // Not scaled: SIGTERM comes while the call (1.5 s of work) is in flight.
    tokio::time::sleep(Duration::from_millis(500)).await;
    gw.terminate();
    tokio::time::sleep(scaled_ms(200)).await;
    let (addr, _) = crate::harness::http::split_url(&gw.url);
    assert!(
        tokio::net::TcpStream::connect(&addr).await.is_err(),
        "no new connections while draining"
    );
    let answer = call.await.unwrap();
    let answered = Instant::now();
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let doc: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(
        doc["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "the whole answer: {doc}"
    );
    let status = gw.wait_exit(scaled_secs(5)).await.unwrap_or_else(|| {
        panic!(
            "still running {:?} after its last request; log:\n{}",
            scaled_secs(5),
            gw.log_text()
        )
    });
    assert!(status.success(), "{status:?}");
    assert!(
        answered.elapsed() < scaled_secs(2),
        "exited {:?} after the last answer",
        answered.elapsed()
    );
}

/// With nothing in flight SIGTERM ends the process at once, whatever the
/// drain allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_gateway_exits_at_once() {
    let worker = Worker::start(Kind::Python).await;
    let mut gw = Gateway::start(&route(&worker.url(), "30s")).await;
    let started = Instant::now();
    gw.terminate();
    let status = gw.wait_exit(scaled_secs(5)).await.expect("exited");
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < scaled_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// A caller that leaves while the gateway drains still gets its child
/// cancelled, and the gateway exits once that cancel is answered. Before,
/// SIGTERM cut the stream at once and the child ran on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_leaving_during_the_drain_gets_its_child_cancelled() {
    let worker = Worker::start(Kind::Rust).await;
    let mut gw = Gateway::start(&route(&worker.url(), "30s")).await;
    let (mut stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    worker
        .wait_state(None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    gw.terminate();
    tokio::time::sleep(scaled_ms(500)).await;
    assert!(
        stream.next(scaled_secs(2)).await.is_some(),
        "the stream goes on while the gateway drains"
    );
    assert_eq!(gw.wait_exit(Duration::ZERO).await, None, "still draining");
    stream.close();
    worker
        .wait_state(None, &id, "TASK_STATE_CANCELED", scaled_secs(2))
        .await
        .unwrap_or_else(|last| panic!("not cancelled ({last:?}); log:\n{}", gw.log_text()));
    let status = gw.wait_exit(scaled_secs(5)).await.expect("exited");
    assert!(status.success(), "{status:?}");
    assert_eq!(worker.cancels().await, 1);
}

/// A stream still open when the drain runs out is cut, and its child is
/// left running: its caller did not leave and may resubscribe through
/// another replica (a lease stops it if nobody does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_open_at_the_end_of_the_drain_is_cut_and_its_child_left() {
    let worker = Worker::start(Kind::Python).await;
    let mut gw = Gateway::start(&route(&worker.url(), "1s")).await;
    let (mut stream, id) = send_stream(&gw.url, Bind::Rest, None, "work:30000").await;
    let started = Instant::now();
    gw.terminate();
    let rest = stream.rest(scaled_secs(10)).await;
    let cut = started.elapsed();
    // Not before the 1 s drain (its timer starts after `started`), and
    // within the drain plus a margin.
    assert!(
        (Duration::from_millis(800)..Duration::from_secs(1) + scaled_secs(7)).contains(&cut),
        "cut {cut:?} after SIGTERM ({} events meanwhile)",
        rest.len()
    );
    let status = gw.wait_exit(scaled_secs(10)).await.expect("exited");
    assert!(status.success(), "{status:?}");
    tokio::time::sleep(scaled_ms(300)).await;
    assert_eq!(worker.state(None, &id).await.as_deref(), Some(WORKING));
    assert_eq!(worker.cancels().await, 0);
}

/// A second SIGTERM during the drain stops the gateway at once (exit status
/// 143) instead of being swallowed for the rest of the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_stops_the_drain() {
    use std::os::unix::process::ExitStatusExt;
    let worker = Worker::start(Kind::Python).await;
    let mut gw = Gateway::start(&route(&worker.url(), "30s")).await;
    let (_stream, _id) = send_stream(&gw.url, Bind::Rest, None, "work:30000").await;
    gw.terminate();
    tokio::time::sleep(scaled_ms(500)).await;
    assert_eq!(gw.wait_exit(Duration::ZERO).await, None, "draining");
    let again = Instant::now();
    gw.terminate();
    let status = gw.wait_exit(scaled_secs(5)).await.expect("exited");
    assert_eq!(status.code(), Some(143), "{status:?} {:?}", status.signal());
    assert!(again.elapsed() < scaled_secs(2), "{:?}", again.elapsed());
}

/// A caller leaves during the drain on a route with a `disconnect_grace`
/// longer than the drain: the grace ends a second before the drain does,
/// the cascade decides (nobody resubscribed) and cancels the child, and the
/// gateway exits. Before, the grace outlasted the process and the child ran
/// on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_longer_than_the_drain_still_ends_in_a_cancel() {
    let worker = Worker::start(Kind::Rust).await;
    let mut gw = Gateway::start(&format!(
        "{}disconnect_grace = \"60s\"\n",
        route(&worker.url(), "3s")
    ))
    .await;
    let (stream, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:30000").await;
    worker
        .wait_state(None, &id, WORKING, scaled_secs(5))
        .await
        .expect("the task runs");
    let started = Instant::now();
    gw.terminate();
    // Not scaled: the caller leaves during the drain, well before the grace
    // is cut (a second before the drain's end).
    tokio::time::sleep(Duration::from_millis(300)).await;
    stream.close();
    worker
        .wait_state(None, &id, "TASK_STATE_CANCELED", scaled_secs(5))
        .await
        .unwrap_or_else(|last| panic!("not cancelled ({last:?}); log:\n{}", gw.log_text()));
    let status = gw.wait_exit(scaled_secs(5)).await.expect("exited");
    assert!(status.success(), "{status:?}");
    // Not past the 3 s drain by more than a margin.
    assert!(
        started.elapsed() < Duration::from_secs(3) + scaled_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(worker.cancels().await, 1);
}
