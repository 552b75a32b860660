//! `timeouts.upstream_idle`: how long a worker may stay silent.
//!
//! It bounds the silence between the worker's bytes, not the length of a
//! stream; a worker that goes quiet past it is cut off, its caller's stream
//! ends, and the child (still running on the worker) is cancelled like any
//! child whose stream broke. Against the real a2a-rust worker, read from the
//! worker itself.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::gateway::Gateway;
use crate::harness::http::post_json;
use crate::harness::worker::{message, send_stream, state_of, Bind, Kind, Worker};
use crate::harness::{scaled_count, scaled_ms, scaled_secs};

const IDLE: &str = "600ms";

fn config(worker: &str) -> String {
    format!(
        "[timeouts]\nupstream_idle = \"{IDLE}\"\n\n[[routes]]\nname = \"w\"\nworker = \"{worker}\"\n"
    )
}

/// A stream whose events come 250 ms apart runs for 2.5 s, four times the
/// idle bound, to its end: each event restarts the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_idle_bounds_silence_not_length() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&config(&worker.url())).await;
    for bind in [Bind::JsonRpc, Bind::Rest] {
        let started = Instant::now();
        let (mut stream, id) = send_stream(&gw.url, bind, None, "trickle:10:250").await;
        let events = stream.rest(scaled_secs(10)).await;
        let took = started.elapsed();
        assert_eq!(
            events.last().and_then(state_of).as_deref(),
            Some("TASK_STATE_COMPLETED"),
            "{bind:?}: the stream was cut after {took:?} ({} events); gateway log:\n{}",
            events.len(),
            gw.log_text()
        );
        assert!(events.len() >= 10, "{bind:?}: {} events", events.len());
        assert!(took >= Duration::from_millis(2400), "{bind:?}: {took:?}");
        assert_eq!(
            worker.state(None, &id).await.as_deref(),
            Some("TASK_STATE_COMPLETED")
        );
    }
    assert_eq!(worker.cancels().await, 0);
}

/// A worker that goes quiet mid-stream is cut off after the idle bound: the
/// caller's stream ends, and the child, still working on the worker, gets
/// its `CancelTask` (cause `stream_lost`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_worker_is_cut_off_and_its_child_cancelled() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&config(&worker.url())).await;
    for (n, bind) in [Bind::JsonRpc, Bind::Rest].into_iter().enumerate() {
        // `idle:` sends one WORKING update, then nothing for 20 s.
        let (mut stream, id) = send_stream(&gw.url, bind, None, "idle:20000").await;
        let quiet_from = Instant::now();
        let rest = stream.rest(scaled_secs(10)).await;
        let cut_after = quiet_from.elapsed();
        assert!(
            rest.iter()
                .all(|ev| state_of(ev).as_deref() != Some("TASK_STATE_COMPLETED")),
            "{bind:?}: {rest:?}"
        );
        // The gateway's idle timer started when the worker's last bytes
        // reached it, before they reached the test: the lower bound leaves
        // room for that lag, more on a slower machine.
        assert!(
            cut_after >= Duration::from_millis(600).saturating_sub(scaled_ms(300))
                && cut_after < scaled_secs(5),
            "{bind:?}: the stream ended {cut_after:?} after the worker went quiet"
        );
        worker
            .wait_state(None, &id, "TASK_STATE_CANCELED", scaled_secs(3))
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "{bind:?}: not canceled ({s:?}); gateway log:\n{}",
                    gw.log_text()
                )
            });
        assert_eq!(worker.cancels().await, n as u64 + 1, "{bind:?}");
    }
    let mut counted = 0.0;
    for _ in 0..scaled_count(100) {
        counted = gw
            .counter("a2agw_cancels_total", &["cause=\"stream_lost\""])
            .await;
        if counted >= 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counted, 2.0);
}

/// A blocking `SendMessage` whose worker answers nothing within the bound is
/// answered 504 (the worker timed out), not 502, with a JSON-RPC error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_call_past_the_bound_is_answered_504() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::start(&config(&worker.url())).await;
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": message("idle:3000")},
    });
    let started = Instant::now();
    let res = post_json(&gw.url, "/", &[], &body).await;
    let took = started.elapsed();
    assert_eq!(res.status, 504, "after {took:?}: {}", res.text());
    // With the JSON-RPC error the caller's SDK reads, naming its call.
    let answer = res.json();
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(took < scaled_ms(2500), "{took:?}");
    // The same call within the bound is answered by the worker.
    let body = json!({
        "jsonrpc": "2.0", "id": 2, "method": "SendMessage",
        "params": {"message": message("quick")},
    });
    let res = post_json(&gw.url, "/", &[], &body).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.json()["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
}

/// The exchange's one read timer (`pingora::proxy::idle_timer`, the vendored
/// pingora-proxy's): a pass the loop leaves before its deadline does not
/// time out although an earlier pass's deadline went by meanwhile; a pass
/// that waits ends at its own deadline, not an earlier one.
#[tokio::test]
async fn the_read_timer_fires_at_the_latest_deadline_only() {
    use pingora::proxy::idle_timer::{deadline, passed};
    let timer = None::<tokio::time::Sleep>;
    tokio::pin!(timer);
    let bound = Duration::from_millis(300);
    let start = Instant::now();
    // Four passes 100 ms apart, each left when its "read" completes: the
    // first pass's deadline (300 ms) passes during the fourth.
    for pass in 0..4 {
        let d = deadline(Some(bound)).expect("a bound gives a deadline");
        tokio::select! {
            biased;
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = passed(timer.as_mut(), d) => panic!("pass {pass} timed out after {:?}", start.elapsed()),
        }
    }
    // A pass that waits ends `bound` after it began.
    let began = Instant::now();
    tokio::time::timeout(
        scaled_secs(5),
        passed(timer.as_mut(), deadline(Some(bound)).unwrap()),
    )
    .await
    .expect("the timer fires");
    let waited = began.elapsed();
    assert!(
        waited >= bound && waited < bound + scaled_ms(200),
        "{waited:?}"
    );
    // Without a bound there is no deadline (the loop's branch is off).
    assert!(deadline(None).is_none());
}
