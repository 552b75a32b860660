//! Issue 44: a worker host name that resolves to several addresses (a
//! headless Service) is that many replicas, with `worker_addresses =
//! "all"`, and is looked up again. The gateway resolves `agents.test`
//! from a hosts file of the test's own (bind-mounted over its
//! `/etc/hosts`), naming two loopback addresses; at each, a relay to a real
//! Python `a2a-sdk` worker with its own task store.

use std::time::Duration;

use crate::harness::gateway::{scratch_dir, Gateway};
use crate::harness::http::{request, wait_for_state};
use crate::harness::python_worker::PythonWorker;
use crate::harness::relay::Relay;
use crate::harness::scaled_secs;
use crate::harness::stream::SseStream;
use crate::harness::worker::{send_stream, Bind};

/// Two relays on one port at 127.0.0.2 and 127.0.0.3, one to each worker:
/// the port and the relays.
async fn two_addresses(a: &PythonWorker, b: &PythonWorker) -> (u16, Relay, Relay) {
    let to = |w: &PythonWorker| w.url().trim_start_matches("http://").to_owned();
    for _ in 0..20 {
        let first = Relay::start_at("127.0.0.2:0", to(a)).await.unwrap();
        if let Ok(second) = Relay::start_at(&format!("127.0.0.3:{}", first.port), to(b)).await {
            return (first.port, first, second);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

/// The address (`127.0.0.2:P` or `…3:P`) the gateway recorded `id` on
/// (its store write follows the event that named the task: waited for).
async fn recorded(gw: &Gateway, id: &str) -> String {
    let until = tokio::time::Instant::now() + scaled_secs(2);
    loop {
        let v = request("GET", &gw.admin, &format!("/tasks/{id}"), &[], b"")
            .await
            .json();
        if let Some(r) = v["replica"].as_str() {
            return r.to_owned();
        }
        if tokio::time::Instant::now() > until {
            return String::new();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ten streams spread over both addresses, each recorded on the one whose
/// worker runs it; when their callers leave, each child is cancelled on
/// its own worker (one CancelTask each, none on the other). Then the name
/// loses an address: new sends go to the other one only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_address_of_a_name_is_a_replica() {
    let (a, b) = (PythonWorker::start().await, PythonWorker::start().await);
    let (port, _ra, _rb) = two_addresses(&a, &b).await;
    let hosts = scratch_dir("hosts").join("hosts");
    let both = "127.0.0.1 localhost\n127.0.0.2 agents.test\n127.0.0.3 agents.test\n";
    std::fs::write(&hosts, both).unwrap();
    let gw = Gateway::start_with_hosts(
        &format!(
            "[[routes]]\nname = \"w\"\nworker = \"http://agents.test:{port}\"\n\
             worker_addresses = \"all\"\nhealth_interval = \"200ms\"\n"
        ),
        &hosts,
    )
    .await;
    let names = [format!("127.0.0.2:{port}"), format!("127.0.0.3:{port}")];
    let workers = [&a, &b];

    let mut streams: Vec<(SseStream, String, usize)> = Vec::new();
    for i in 0..10 {
        let (s, id) = send_stream(&gw.url, Bind::JsonRpc, None, "work:60000").await;
        let on = recorded(&gw, &id).await;
        let at = names
            .iter()
            .position(|n| *n == on)
            .unwrap_or_else(|| panic!("stream {i}: recorded on {on:?}, none of {names:?}"));
        assert_eq!(
            workers[at].state(None, &id).await.as_deref(),
            Some("TASK_STATE_WORKING"),
            "{id} runs where it was recorded"
        );
        assert_eq!(workers[1 - at].state(None, &id).await, None);
        streams.push((s, id, at));
    }
    let on = |k: usize| streams.iter().filter(|(_, _, at)| *at == k).count() as u64;
    let (on_a, on_b) = (on(0), on(1));
    assert!(
        on_a > 0 && on_b > 0,
        "spread over both addresses: {on_a}/{on_b}"
    );

    let ids: Vec<(String, usize)> = streams
        .iter()
        .map(|(_, id, at)| (id.clone(), *at))
        .collect();
    for (s, _, _) in streams {
        s.close();
    }
    for (id, at) in &ids {
        let got = wait_for_state(
            &workers[*at].url(),
            None,
            id,
            "TASK_STATE_CANCELED",
            scaled_secs(2),
        )
        .await;
        assert!(got.is_ok(), "{id}: {got:?}; log:\n{}", gw.log_text());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        a.stats().await["cancels"],
        on_a,
        "one cancel each, on its own worker"
    );
    assert_eq!(b.stats().await["cancels"], on_b);

    // The name loses 127.0.0.3: within the health interval (and a
    // bound), every new send goes to 127.0.0.2.
    std::fs::write(&hosts, "127.0.0.1 localhost\n127.0.0.2 agents.test\n").unwrap();
    let started_b = b.stats().await["tasks_started"].as_u64().unwrap();
    let until = tokio::time::Instant::now() + scaled_secs(5);
    loop {
        let view = request("GET", &gw.admin, "/replicas", &[], b"")
            .await
            .json();
        let listed = view["routes"][0]["replicas"].as_array().map_or(0, Vec::len);
        if listed == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the gone address is still listed: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..6 {
        let (s, id) = send_stream(&gw.url, Bind::Rest, None, "quick").await;
        assert_eq!(recorded(&gw, &id).await, names[0]);
        drop(s);
    }
    assert_eq!(
        b.stats().await["tasks_started"].as_u64().unwrap(),
        started_b,
        "nothing new reached the address the name lost"
    );
}
