//! Issue 33 items 5-6: the one-minute demo (`scripts/demo`, which runs
//! `gateway/examples/demo.rs`) runs to completion against the real Python
//! worker and gateway, and `a2a-gateway health` answers as a container
//! health check needs. The compose file and the Helm chart are checked with
//! their own tools when this machine has them (`docker compose config`,
//! `helm lint`, `helm template`); without them those tests say so and pass
//! (docs/operations.md says how to run them by hand).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::gateway::{free_port, Gateway};
use crate::harness::python_worker::{agent_script, python};
use crate::harness::time_factor;
use crate::harness::worker::{Kind, Worker};

/// `target/<profile>/a2a-gateway`: the gateway binary cargo built for the
/// tests.
fn gateway_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_a2a-gateway"))
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace above the gateway package")
        .to_path_buf()
}

/// The demo example beside the gateway binary. `cargo test --all-targets`
/// (scripts/test) builds it; a run of the integration binary alone does not.
fn demo_bin() -> PathBuf {
    let bin = gateway_bin()
        .parent()
        .expect("the binary's directory")
        .join("examples")
        .join("demo");
    assert!(
        bin.exists(),
        "{} is not built: scripts/test builds it (cargo test --all-targets); \
         alone: cargo build -p a2a-gateway --example demo",
        bin.display()
    );
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_to_completion() {
    let bin = demo_bin();
    let python = tokio::task::spawn_blocking(python).await.expect("venv");
    let out = tokio::process::Command::new(&bin)
        .arg("--gateway")
        .arg(gateway_bin())
        .arg("--python")
        .arg(python)
        .arg("--agent")
        .arg(agent_script())
        .args(["--time-factor", &time_factor().to_string()])
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // What it says happened, act by act: the gateway's cancel of act 1
    // (its log line and its metric), the orphan of act 2, the lease's lapse
    // of act 3. Within an act the gateway's log line and the worker's state
    // may come in either order (both follow the same cancel); each act ends
    // only once both have been printed.
    let acts = ["\n1. ", "\n2. ", "\n3. ", "\nDone:"];
    let mut at = Vec::new();
    for act in acts {
        at.push(
            stdout
                .find(act)
                .unwrap_or_else(|| panic!("{act:?} missing in:\n{stdout}")),
        );
    }
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "acts out of order:\n{stdout}"
    );
    let act = |i: usize| &stdout[at[i]..at[i + 1]];
    let expect: [(usize, &[&str]); 3] = [
        (
            0,
            &[
                "CancelTask sent",
                "cause=\"caller_gone\"",
                "is TASK_STATE_CANCELED",
                "a2agw_cancels_total{cause=\"caller_gone\"",
            ],
        ),
        (1, &["still TASK_STATE_WORKING 2 s later"]),
        (
            2,
            &[
                "a2agw_lease_renewals_total",
                "lease lapsed",
                "is TASK_STATE_CANCELED",
                "a2agw_cancels_total{cause=\"lease_lapsed\"",
            ],
        ),
    ];
    for (i, wants) in expect {
        for want in wants {
            assert!(
                act(i).contains(want),
                "{want:?} missing in act {} of:\n{stdout}",
                i + 1
            );
        }
    }
    // Act 2 is the direct connection: the gateway cancels nothing there.
    assert!(
        !act(1).contains("CancelTask sent"),
        "act 2 cancelled:\n{stdout}"
    );
}

/// Runs `a2a-gateway health ARGS`; its exit code and stderr.
fn health(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(gateway_bin())
        .arg("health")
        .args(args)
        .output()
        .expect("run a2a-gateway health");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_subcommand_answers_for_a_live_gateway_only() {
    let worker = Worker::start(Kind::Rust).await;
    let gw = Gateway::in_front_of(&worker.url(), "").await;
    let admin = gw.admin.trim_start_matches("http://").to_string();
    let (code, err) = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || health(&[&admin])
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "healthz: {err}");
    let (code, err) = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || health(&[&admin, "--ready"])
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "readyz: {err}");

    // Nothing listening: exit 1 with one line naming the address.
    let dead = format!("127.0.0.1:{}", free_port());
    let (code, err) = tokio::task::spawn_blocking({
        let dead = dead.clone();
        move || health(&[&dead, "--timeout", "1"])
    })
    .await
    .unwrap();
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&dead), "{err}");
}

/// `tool ARGS` when `tool` is on PATH; None (and a note) when it is not.
fn run_if_present(tool: &str, args: &[&str]) -> Option<std::process::Output> {
    match Command::new(tool)
        .args(args)
        .current_dir(workspace())
        .output()
    {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("{tool} is not installed: not checked here (docs/operations.md)");
            None
        }
        Err(e) => panic!("{tool}: {e}"),
    }
}

/// `docker compose config` (the plugin) or, without it, the standalone
/// `docker-compose config` validates deploy/docker-compose.yml; the
/// gateway's config it mounts passes `check-config`.
#[test]
fn compose_file_is_valid_where_docker_compose_is() {
    let file = "deploy/docker-compose.yml";
    // `docker compose version` fails without the plugin.
    let plugin =
        run_if_present("docker", &["compose", "version"]).is_some_and(|out| out.status.success());
    let out = if plugin {
        run_if_present("docker", &["compose", "-f", file, "config", "--quiet"])
    } else {
        run_if_present("docker-compose", &["-f", file, "config", "--quiet"])
    };
    if let Some(out) = out {
        assert!(
            out.status.success(),
            "compose config:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new(gateway_bin())
        .args(["check-config", "deploy/compose/gateway.toml"])
        .current_dir(workspace())
        .output()
        .expect("check-config");
    assert!(
        out.status.success(),
        "deploy/compose/gateway.toml:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn helm_chart_lints_and_renders_where_helm_is() {
    let chart = "deploy/helm/a2a-gateway";
    let Some(out) = run_if_present("helm", &["lint", "--strict", chart]) else {
        return;
    };
    assert!(
        out.status.success(),
        "helm lint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_if_present("helm", &["template", "gw", chart]).expect("helm");
    assert!(
        out.status.success(),
        "helm template:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "/healthz",
        "/readyz",
        "terminationGracePeriodSeconds",
        "preStop",
    ] {
        assert!(
            text.contains(want),
            "{want} not in the rendered chart:\n{text}"
        );
    }
}
