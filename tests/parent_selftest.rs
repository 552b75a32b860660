//! Self-tests of `harness::parent`: a real parent process delegating a leased
//! child straight to a real a2a-rust worker (no gateway), so later tests can
//! trust that SIGKILLing it really stops the renewals, and that a live one
//! really keeps its child alive.

use std::time::Duration;

use crate::harness::http::wait_for_state;
use crate::harness::parent::ParentProcess;
use crate::harness::rust_worker::{RustWorker, RustWorkerOptions};
use crate::harness::{scaled, scaled_ms, scaled_secs};

const LEASE_URI: &str = "https://a2a-rust.com/extensions/lease/v1";
const WORKING: &str = "TASK_STATE_WORKING";
const COMPLETED: &str = "TASK_STATE_COMPLETED";
const CANCELED: &str = "TASK_STATE_CANCELED";

const TTL: Duration = Duration::from_secs(2);

fn leased() -> RustWorkerOptions {
    RustWorkerOptions {
        lease_store: true,
        ..RustWorkerOptions::default()
    }
}

/// The worker sees the child WORKING (it was started and is running).
async fn await_working(worker: &RustWorker, parent: &ParentProcess) {
    if let Err(last) = wait_for_state(
        &worker.url(),
        None,
        &parent.task_id,
        WORKING,
        scaled_secs(5),
    )
    .await
    {
        panic!(
            "child {} never WORKING on the worker (last {last:?})\n{}",
            parent.task_id,
            parent.dump()
        );
    }
}

/// GetTask calls that carried the lease URI in `A2A-Extensions`.
fn lease_renewals(worker: &RustWorker) -> Vec<(String, String)> {
    worker
        .extension_calls()
        .into_iter()
        .filter(|(m, raw)| m == "GetTask" && raw.split(',').any(|u| u.trim() == LEASE_URI))
        .collect()
}

#[tokio::test]
async fn sigkilled_parent_child_stops_by_lease_lapse() {
    let worker = RustWorker::start(leased()).await;
    let mut parent = ParentProcess::spawn(&worker.url(), TTL, "work:30000").await;
    await_working(&worker, &parent).await;
    // Let at least one renewal land, so the lapse is measured from a renewal.
    tokio::time::sleep(scaled(TTL / 2)).await;
    assert_eq!(
        worker.state(None, &parent.task_id).await.as_deref(),
        Some(WORKING),
        "still running while the parent lives\n{}",
        parent.dump()
    );

    parent.sigkill().await;
    let stopped = wait_for_state(
        &worker.url(),
        None,
        &parent.task_id,
        CANCELED,
        TTL + scaled_secs(1),
    )
    .await;
    let took = stopped.unwrap_or_else(|last| {
        panic!(
            "child not CANCELED within TTL + {:?} of the SIGKILL (last {last:?})\n{}",
            scaled_secs(1),
            parent.dump()
        )
    });
    eprintln!("parent SIGKILLed; child CANCELED after {took:?}");
    assert_eq!(worker.lease_stops(), 1, "stopped by the lease lapse");
    assert_eq!(
        worker.cancels(),
        0,
        "no CancelTask: the parent sent nothing"
    );
    assert!(
        !lease_renewals(&worker).is_empty(),
        "renewals carried the lease URI before the kill: {:?}",
        worker.extension_calls()
    );
}

#[tokio::test]
async fn live_parent_renews_and_child_completes() {
    let worker = RustWorker::start(leased()).await;
    let mut parent = ParentProcess::spawn(&worker.url(), TTL, "work:4000").await;
    let outcome = parent.wait_outcome(scaled_secs(15)).await;
    assert!(
        outcome.starts_with("Completed("),
        "outcome {outcome}\n{}",
        parent.dump()
    );
    assert_eq!(
        worker.state(None, &parent.task_id).await.as_deref(),
        Some(COMPLETED)
    );
    assert_eq!(worker.lease_stops(), 0);
    assert_eq!(worker.cancels(), 0);
    let renewals = lease_renewals(&worker);
    eprintln!(
        "extension calls: {:?} ({} lease renewals)",
        worker.extension_calls(),
        renewals.len()
    );
    // 4 s of work renewed every 2 s / 3: about 6; a 4 s task would have
    // lapsed at ~2 s without them.
    assert!(
        renewals.len() >= 3,
        "GetTask renewals carrying {LEASE_URI}: {:?}",
        worker.extension_calls()
    );
}

#[tokio::test]
async fn without_lease_store_sigkilled_parent_child_keeps_running() {
    let worker = RustWorker::start(RustWorkerOptions::default()).await;
    let mut parent = ParentProcess::spawn(&worker.url(), TTL, "work:30000").await;
    await_working(&worker, &parent).await;
    parent.sigkill().await;
    tokio::time::sleep(TTL + scaled_ms(1500)).await;
    assert_eq!(
        worker.state(None, &parent.task_id).await.as_deref(),
        Some(WORKING),
        "a worker without a lease store ignores the grant: the orphan runs on\n{}",
        parent.dump()
    );
    assert_eq!(worker.lease_stops(), 0);
    assert_eq!(worker.cancels(), 0);
}
