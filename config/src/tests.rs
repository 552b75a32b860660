use std::collections::BTreeMap;
use std::time::Duration;

use policies::budget::{Caps, OverCap};
use policies::cascade::{CascadeMode, CascadePolicy};

use super::*;

const S: Duration = Duration::from_secs(1);

fn env(name: &str) -> Option<String> {
    match name {
        "TOKEN" => Some("Bearer from-env".into()),
        "DEFAULT_WORKER_TOKEN" => Some("Bearer default".into()),
        "NEWLINE" => Some("Bearer a\nb".into()),
        _ => None,
    }
}

fn ok(src: &str) -> Config {
    match parse_with_env(src, &env) {
        Ok(c) => c,
        Err(e) => panic!("{src}\n---\n{e}"),
    }
}

/// The errors of `src`, as displayed.
fn errors(src: &str) -> Vec<String> {
    match parse_with_env(src, &env) {
        Ok(c) => panic!("{src}\n--- parsed: {c:?}"),
        Err(e) => e.errors.iter().map(ToString::to_string).collect(),
    }
}

const ROUTE: &str = "[[routes]]\nname = \"a\"\nworker = \"http://w\"\n";

#[test]
fn examples_parse() {
    let minimal = ok(include_str!("../examples/minimal.toml"));
    let listen = "127.0.0.1:8080".parse().unwrap();
    assert_eq!(
        minimal,
        Config::single_worker(listen, "http://127.0.0.1:9000").unwrap()
    );

    let full = ok(include_str!("../examples/full.toml"));
    assert_eq!(
        full.server.listen,
        vec![
            "0.0.0.0:8080".parse().unwrap(),
            "[::]:8080".parse().unwrap()
        ]
    );
    assert_eq!(
        full.server.public_url.as_deref(),
        Some("https://agents.example.com")
    );
    assert_eq!(full.server.admin, Some("127.0.0.1:9090".parse().unwrap()));
    // Every other section spells out its defaults.
    assert_eq!(full.store, Store::default());
    assert_eq!(full.limits, Limits::default());
    assert_eq!(full.timeouts, Timeouts::default());
    assert_eq!(full.cancel, Cancel::default());
    let [research, default] = &full.routes[..] else {
        panic!("{:?}", full.routes)
    };
    assert_eq!(
        research,
        &Route {
            name: "research".into(),
            worker: WorkerUrl::parse("http://127.0.0.1:9000/base").unwrap(),
            workers: vec![WorkerUrl::parse("http://127.0.0.1:9000/base").unwrap()],
            health_interval: DEFAULT_HEALTH_INTERVAL,
            worker_addresses: WorkerAddresses::First,
            path_prefix: Some("/research".into()),
            host: Some("research.example.com".into()),
            strip_prefix: true,
            cascade: CascadePolicy {
                mode: CascadeMode::Detach,
                disconnect_grace: 2 * S,
                id_wait: 5 * S,
                ..CascadePolicy::default()
            },
            worker_credential: Some("Bearer abc".into()),
            worker_ca: None,
            worker_client_cert: None,
            lease: LeasePolicy {
                max_ttl: 600 * S,
                impose_ttl: Some(30 * S),
                poll_ttl: None,
                worker_leases: WorkerLeases::Auto,
            },
            headers: HeaderPolicy {
                inject_extensions: vec!["https://a2a-rust.com/extensions/lease/v1".into()],
                inject_headers: vec![("x-tenant-id".into(), "research".into())],
                strip_headers: vec!["x-debug".into()],
                cancel_headers: vec!["x-tenant-id".into(), "x-org".into()],
            },
            budget: BudgetPolicy {
                caps: caps(Some(600_000), &[("tokens", 50_000)]),
                over_cap: OverCap::Clamp,
                caller_header: Some("x-api-key".into()),
                tenants: BTreeMap::new(),
                callers: BTreeMap::from([("key-1".into(), caps(None, &[("tokens", 1000)]))]),
                accounts: vec![AccountPolicy {
                    per: AccountScope::Route,
                    window: 24 * 3600 * S,
                    meters: meters(&[("tokens", 1_000_000)]),
                }],
            },
            auth: None,
            grpc_pass_services: Vec::new(),
            on_parent_completed: policies::delegation::OnParentCompleted::Cancel,
        }
    );
    assert_eq!(
        full.delegation,
        crate::Delegation {
            link: true,
            max_depth: 4
        }
    );
    assert_eq!(default.lease, LeasePolicy::default());
    assert_eq!(default.budget, BudgetPolicy::default());
    assert_eq!(full.leases.replica_id.as_deref(), Some("gw-1"));
    assert_eq!(default.worker.origin(), "https://worker.internal:8443");
    assert_eq!(default.cascade, CascadePolicy::default());
    assert_eq!(default.worker_credential.as_deref(), Some("Bearer default"));
}

#[test]
fn defaults() {
    let c = ok(ROUTE);
    assert_eq!(c.server, Server::default());
    assert_eq!(c.server.listen, vec!["127.0.0.1:8080".parse().unwrap()]);
    assert_eq!(c.server.threads, 2);
    assert_eq!(c.server.read_buffer, 0);
    assert_eq!(c.server.log_format, LogFormat::Text);
    assert!(c.server.access_log);
    assert_eq!(c.server.log_flush, Duration::from_secs(1));
    assert_eq!(c.store.kind, StoreKind::Memory);
    assert_eq!(c.store.on_store_error, OnStoreError::FailOpen);
    assert_eq!(c.limits.max_inspect_body, 1 << 20);
    assert_eq!(c.limits.max_sse_event, 1 << 20);
    assert_eq!(c.limits.max_card_body, 1 << 20);
    assert_eq!(c.limits.max_tracked_tasks, 1_000_000);
    assert_eq!(c.limits.max_accounts, 100_000);
    assert_eq!(c.limits.worker_h2_streams, 100);
    assert_eq!(c.timeouts.connect, 5 * S);
    assert_eq!(c.timeouts.upstream_idle, Some(3600 * S));
    assert_eq!(c.timeouts.downstream_idle, Some(3600 * S));
    assert_eq!(c.timeouts.dns_refresh, 30 * S);
    assert_eq!(c.timeouts.drain, 20 * S);
    assert_eq!(c.cancel.attempts, 5);
    assert_eq!(c.cancel.backoff, Duration::from_millis(100));
    assert_eq!(c.cancel.backoff_max, 5 * S);
    assert_eq!(c.cancel.timeout, 5 * S);
    let r = &c.routes[0];
    assert_eq!(r.name, "a");
    assert_eq!(r.worker.authority(), "w:80");
    assert_eq!(r.path_prefix, None);
    assert_eq!(r.host, None);
    assert!(r.strip_prefix);
    assert_eq!(r.cascade, CascadePolicy::default());
    assert_eq!(r.worker_credential, None);
    assert_eq!(r.budget, BudgetPolicy::default());
    assert!(!r.budget.is_active());
}

fn meters(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
    list.iter().map(|&(k, v)| (k.to_owned(), v)).collect()
}

fn caps(max_deadline_ms: Option<u64>, list: &[(&str, u64)]) -> Caps {
    Caps {
        max_deadline_ms,
        meters: meters(list),
    }
}

/// `[routes.budget]` with `body`, on the one route of the file.
fn budget_src(body: &str) -> String {
    format!("{ROUTE}[routes.budget]\n{body}")
}

fn budget(body: &str) -> BudgetPolicy {
    ok(&budget_src(body)).routes.remove(0).budget
}

/// [`budget_src`] on a route whose `[routes.auth]` (after the budget, so
/// that error positions in `body` stay as they are) binds tenants to
/// identities, which tenant caps and accounts need.
fn bound_src(body: &str) -> String {
    // Written once: tests run at once, and one reading while another
    // rewrites it would find it half written.
    static KEYS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("a2agw-config-tests-{}", std::process::id()));
        std::fs::write(&path, format!("{} a\n", "0".repeat(64))).unwrap();
        path
    });
    format!(
        "{}\n[routes.auth]\napi_keys_file = \"{}\"\ntenants = {{ \"key:a\" = [\"acme\"] }}\n",
        budget_src(body),
        keys.display()
    )
}

fn bound_budget(body: &str) -> BudgetPolicy {
    ok(&bound_src(body)).routes.remove(0).budget
}

#[test]
fn budget_policy() {
    // Every key, in inline forms this time.
    let b = budget(
        r#"max_deadline = "1h"
meters = { tokens = 50000, "gpu.seconds" = 0 }
over_cap = "refuse"
caller_header = "X-Api-Key"
callers = { "key-1" = { meters = { tokens = 1000 } }, "key 2" = { max_deadline = "10ms" } }
accounts = [
  { per = "route", window = "1h", meters = { tokens = 10000000 } },
  { per = "caller", window = "1s", meters = { tokens = 1 } },
  { per = "caller", window = "8784h", meters = { requests = 1 } },
]
"#,
    );
    let want = BudgetPolicy {
        caps: caps(Some(3_600_000), &[("tokens", 50_000), ("gpu.seconds", 0)]),
        over_cap: OverCap::Refuse,
        caller_header: Some("x-api-key".into()),
        tenants: BTreeMap::new(),
        callers: BTreeMap::from([
            ("key-1".into(), caps(None, &[("tokens", 1000)])),
            ("key 2".into(), caps(Some(10), &[])),
        ]),
        accounts: vec![
            AccountPolicy {
                per: AccountScope::Route,
                window: 3600 * S,
                meters: meters(&[("tokens", 10_000_000)]),
            },
            AccountPolicy {
                per: AccountScope::Caller,
                window: S,
                meters: meters(&[("tokens", 1)]),
            },
            AccountPolicy {
                per: AccountScope::Caller,
                window: 366 * 24 * 3600 * S,
                meters: meters(&[("requests", 1)]),
            },
        ],
    };
    assert_eq!(b, want);
    assert!(b.is_active());
    let scopes: Vec<&str> = b.accounts.iter().map(|a| a.per.as_str()).collect();
    assert_eq!(scopes, ["route", "caller", "caller"]);

    // Tenants' caps and accounts, on a route that binds tenants.
    let b = bound_budget(
        r#"tenants = { acme = { max_deadline = "5m" }, "big co" = { meters = { tokens = 20000 } } }
accounts = [
  { per = "tenant", window = "24h", meters = { tokens = 1000000, "gpu.seconds" = 3600 } },
]
"#,
    );
    assert_eq!(
        b.tenants,
        BTreeMap::from([
            ("acme".into(), caps(Some(300_000), &[])),
            ("big co".into(), caps(None, &[("tokens", 20_000)])),
        ])
    );
    assert_eq!(
        b.accounts,
        [AccountPolicy {
            per: AccountScope::Tenant,
            window: 24 * 3600 * S,
            meters: meters(&[("tokens", 1_000_000), ("gpu.seconds", 3600)]),
        }]
    );

    // The same in standard tables, at the bounds.
    let b = bound_budget(
        "max_deadline = \"720h\"\n\
         [routes.budget.tenants.acme]\nmax_deadline = \"10ms\"\n\
         [[routes.budget.accounts]]\nper = \"tenant\"\nwindow = \"1s\"\n\
         [routes.budget.accounts.meters]\ntokens = 9223372036854775807\n",
    );
    assert_eq!(b.caps, caps(Some(30 * 24 * 3_600_000), &[]));
    assert_eq!(b.tenants["acme"], caps(Some(10), &[]));
    assert_eq!(b.accounts[0].meters, meters(&[("tokens", i64::MAX as u64)]));

    // Sixteen meters are allowed.
    let sixteen: Vec<String> = (0..16).map(|i| format!("m{i} = 1")).collect();
    let b = budget(&format!("meters = {{ {} }}", sixteen.join(", ")));
    assert_eq!(b.caps.meters.len(), 16);
}

/// What makes a budget policy active, and what does not.
#[test]
fn budget_activity() {
    let active = [
        "max_deadline = \"1m\"",
        "meters = { tokens = 0 }",
        "[routes.budget.tenants.t]\nmeters = { tokens = 1 }",
        "caller_header = \"x-k\"\n[routes.budget.callers.k]\nmax_deadline = \"1s\"",
        "[[routes.budget.accounts]]\nper = \"route\"\nwindow = \"1h\"\nmeters = { tokens = 1 }",
    ];
    for body in active {
        let b = if body.contains("tenant") {
            bound_budget(body)
        } else {
            budget(body)
        };
        assert!(b.is_active(), "{body}");
    }
    let inactive = [
        "",
        "over_cap = \"refuse\"",
        "caller_header = \"x-k\"",
        "caller_header = \"x-k\"\ntenants = {}\ncallers = {}\naccounts = []",
    ];
    for body in inactive {
        let b = budget(body);
        assert!(!b.is_active(), "{body}");
    }
    assert_eq!(budget(""), BudgetPolicy::default());
    assert!(!BudgetPolicy::default().is_active());
    assert_eq!(BudgetPolicy::default().over_cap, OverCap::Clamp);
}

/// Each budget error, alone: the body of `[routes.budget]` (on line 4, so
/// the body starts on line 5) and its one error, as displayed.
#[test]
fn budget_errors() {
    let seventeen: Vec<String> = (0..17).map(|i| format!("m{i} = 1")).collect();
    let seventeen = format!("meters = {{ {} }}", seventeen.join(", "));
    let account =
        "[[routes.budget.accounts]]\nper = \"tenant\"\nwindow = \"1h\"\nmeters = { tokens = 1 }\n";
    let table: Vec<(&str, &str)> = vec![
        // caps
        ("max_deadline = \"5ms\"", "5:16: routes[0].budget.max_deadline: must be between 10ms and 720h (30 days), found \"5ms\""),
        ("max_deadline = \"721h\"", "5:16: routes[0].budget.max_deadline: must be between 10ms and 720h (30 days), found \"721h\""),
        ("max_deadline = 600", "5:16: routes[0].budget.max_deadline: a duration needs a unit, written as a string like \"5s\" or \"250ms\"; found integer 600"),
        ("meters = { Tokens = 1 }", "5:12: routes[0].budget.meters: \"Tokens\" is not a meter name (1 to 64 of a-z, 0-9, '.', '_' and '-')"),
        ("meters = { tokens = -1 }", "5:21: routes[0].budget.meters.tokens: must be at least 0, found -1"),
        ("meters = { tokens = \"50k\" }", "5:21: routes[0].budget.meters.tokens: expected an integer, found \"50k\""),
        ("meters = { \"gpu.s\" = 1.5 }", "5:22: routes[0].budget.meters.\"gpu.s\": expected an integer, found float 1.5"),
        ("meters = { gpu.seconds = 1 }", "5:12: routes[0].budget.meters.gpu: expected an integer, found a table; quote a meter name with dots: \"gpu.seconds\" = 10"),
        ("meters = {}", "5:10: routes[0].budget.meters: names no meter; expected at least one, like { tokens = 1000 }"),
        (&seventeen, "5:10: routes[0].budget.meters: at most 16 meters, found 17"),
        ("meters = 5", "5:10: routes[0].budget.meters: expected a table of meter names to amounts, like { tokens = 1000 }, found integer 5"),
        // route-wide keys
        ("over_cap = \"deny\"", "5:12: routes[0].budget.over_cap: expected one of \"clamp\", \"refuse\", found \"deny\""),
        ("caller_header = \"x api\"", "5:17: routes[0].budget.caller_header: \"x api\" is not a header name"),
        ("caller_header = \"\"", "5:17: routes[0].budget.caller_header: \"\" is not a header name"),
        ("caller_header = \"Connection\"", "5:17: routes[0].budget.caller_header: Connection: a hop-by-hop header cannot name the caller"),
        ("max_deadlines = \"1m\"", "5:1: routes[0].budget.max_deadlines: unknown key \"max_deadlines\" (did you mean \"max_deadline\"?); expected one of: max_deadline, meters, over_cap, caller_header, tenants, callers, accounts"),
        // tenants
        ("[routes.budget.tenants.acme]\n", "5:1: routes[0].budget.tenants.acme: names no cap; give max_deadline, meters or both"),
        ("tenants = { acme = {} }", "5:20: routes[0].budget.tenants.acme: names no cap; give max_deadline, meters or both"),
        ("tenants = { \"\" = { max_deadline = \"1m\" } }", "5:18: routes[0].budget.tenants.\"\": a tenant name cannot be empty"),
        ("tenants.acme = { max_deadlin = \"1m\" }", "5:18: routes[0].budget.tenants.acme.max_deadlin: unknown key \"max_deadlin\" (did you mean \"max_deadline\"?); expected one of: max_deadline, meters"),
        ("tenants.acme = { over_cap = \"refuse\" }", "5:18: routes[0].budget.tenants.acme.over_cap: unknown key \"over_cap\"; expected one of: max_deadline, meters"),
        ("[routes.budget.tenants.\"a b\"]\nmeters = { tokens = -5 }", "6:21: routes[0].budget.tenants.\"a b\".meters.tokens: must be at least 0, found -5"),
        ("tenants = { acme = 1 }", "5:20: routes[0].budget.tenants.acme: expected a table, found integer 1"),
        ("tenants = 1", "5:11: routes[0].budget.tenants: expected a table, found integer 1"),
        // callers
        ("[routes.budget.callers.k]\nmeters = { tokens = 1 }", "5:16: routes[0].budget.callers: callers needs caller_header, the header whose value names the caller (or [routes.auth])"),
        ("callers = { k = { meters = { tokens = 1 } } }", "5:11: routes[0].budget.callers: callers needs caller_header, the header whose value names the caller (or [routes.auth])"),
        ("caller_header = \"x-k\"\ncallers = { \" k\" = { meters = { tokens = 1 } } }", "6:20: routes[0].budget.callers[0]: a caller key is a value of caller_header: not empty, visible ASCII, no leading or trailing spaces"),
        ("caller_header = \"x-k\"\ncallers = { a = { max_deadline = \"1m\" }, b = {} }", "6:46: routes[0].budget.callers[1]: names no cap; give max_deadline, meters or both"),
        // accounts
        ("[[routes.budget.accounts]]\nper = \"caller\"\nwindow = \"1h\"\nmeters = { tokens = 1 }", "6:7: routes[0].budget.accounts[0].per: per = \"caller\" needs caller_header, the header whose value names the caller (or [routes.auth])"),
        ("[[routes.budget.accounts]]\nper = \"user\"\nwindow = \"1h\"\nmeters = { tokens = 1 }", "6:7: routes[0].budget.accounts[0].per: expected one of \"route\", \"tenant\", \"caller\", found \"user\""),
        ("[[routes.budget.accounts]]\nwindow = \"1h\"\nmeters = { tokens = 1 }", "5:1: routes[0].budget.accounts[0].per: missing required key"),
        ("[[routes.budget.accounts]]\nper = \"route\"\nmeters = { tokens = 1 }", "5:1: routes[0].budget.accounts[0].window: missing required key"),
        ("[[routes.budget.accounts]]\nper = \"route\"\nwindow = \"1h\"", "5:1: routes[0].budget.accounts[0].meters: missing required key"),
        ("[[routes.budget.accounts]]\nper = \"route\"\nwindow = \"999ms\"\nmeters = { tokens = 1 }", "7:10: routes[0].budget.accounts[0].window: must be between 1s and 8784h (366 days), found \"999ms\""),
        ("[[routes.budget.accounts]]\nper = \"route\"\nwindow = \"8785h\"\nmeters = { tokens = 1 }", "7:10: routes[0].budget.accounts[0].window: must be between 1s and 8784h (366 days), found \"8785h\""),
        ("[[routes.budget.accounts]]\nper = \"route\"\nwindow = \"1h\"\nmeters = { tokens = 0 }", "8:21: routes[0].budget.accounts[0].meters.tokens: must be at least 1, found 0"),
        ("[[routes.budget.accounts]]\nper = \"route\"\nwindow = \"1h\"\nmeters = {}", "8:10: routes[0].budget.accounts[0].meters: names no meter; expected at least one, like { tokens = 1000 }"),
        ("[[routes.budget.accounts]]\nper = \"route\"\nwindow = \"1h\"\nmeters = { tokens = 1 }\nreset = \"daily\"", "9:1: routes[0].budget.accounts[0].reset: unknown key \"reset\"; expected one of: per, window, meters"),
        ("accounts = 1", "5:12: routes[0].budget.accounts: expected an array of tables, found integer 1"),
        ("accounts = [1]", "5:13: routes[0].budget.accounts[0]: expected a table, found integer 1"),
    ];
    let duplicate = format!("{account}{account}");
    let mut table = table;
    table.push((&duplicate, "12:21: routes[0].budget.accounts[1].meters.tokens: an account per tenant already limits \"tokens\" (accounts[0])"));
    let mut wrong = Vec::new();
    // Tenant caps and accounts need tenants bound to identities.
    let unbound = [
        ("[routes.budget.tenants.acme]\nmax_deadline = \"1m\"", "5:16: routes[0].budget.tenants: tenant caps need [routes.auth] with tenants (which verified identities may name which tenant): without it a caller names any tenant, or none, and escapes it"),
        (account, "6:7: routes[0].budget.accounts[0].per: per = \"tenant\" needs [routes.auth] with tenants (which verified identities may name which tenant): without it a caller names any tenant, or none, and escapes it"),
    ];
    for (body, want) in unbound {
        let src = budget_src(body);
        let got = errors(&src);
        if got != [want] {
            wrong.push(format!("{src}\n  want: {want}\n  got:  {got:?}"));
        }
    }
    for (body, want) in &table {
        let src = if body.contains("tenant") {
            bound_src(body)
        } else {
            budget_src(body)
        };
        let got = errors(&src);
        if got != [*want] {
            wrong.push(format!("{src}\n  want: {want}\n  got:  {got:?}"));
        }
    }
    // `budget` itself must be a table.
    let got = errors(&format!("{ROUTE}budget = 1\n"));
    if got != ["4:10: routes[0].budget: expected a table, found integer 1"] {
        wrong.push(format!("budget = 1\n  got:  {got:?}"));
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n\n"));
}

#[test]
fn budget_errors_at_once() {
    let src = r#"[[routes]]
name = "a"
worker = "http://w"

[routes.budget]
max_deadline = "1ms"
meters = { Tokens = 1, tokens = -1 }
over_cap = "never"

[routes.budget.tenants.acme]

[routes.budget.callers.secret-key-1]
meters = { tokens = 1 }

[[routes.budget.accounts]]
per = "caller"
window = "0s"
meters = { tokens = 5, requests = 0 }

[[routes.budget.accounts]]
per = "route"
window = "1h"
meters = { tokens = 5 }

[[routes.budget.accounts]]
per = "route"
window = "24h"
meters = { tokens = 100 }
"#;
    let want = [
        "6:16: routes[0].budget.max_deadline: must be between 10ms and 720h (30 days), found \"1ms\"",
        "7:12: routes[0].budget.meters: \"Tokens\" is not a meter name (1 to 64 of a-z, 0-9, '.', '_' and '-')",
        "7:33: routes[0].budget.meters.tokens: must be at least 0, found -1",
        "8:12: routes[0].budget.over_cap: expected one of \"clamp\", \"refuse\", found \"never\"",
        "10:1: routes[0].budget.tenants.acme: names no cap; give max_deadline, meters or both",
        "10:16: routes[0].budget.tenants: tenant caps need [routes.auth] with tenants (which verified identities may name which tenant): without it a caller names any tenant, or none, and escapes it",
        "12:16: routes[0].budget.callers: callers needs caller_header, the header whose value names the caller (or [routes.auth])",
        "16:7: routes[0].budget.accounts[0].per: per = \"caller\" needs caller_header, the header whose value names the caller (or [routes.auth])",
        "17:10: routes[0].budget.accounts[0].window: must be between 1s and 8784h (366 days), found \"0s\"",
        "18:35: routes[0].budget.accounts[0].meters.requests: must be at least 1, found 0",
        "28:21: routes[0].budget.accounts[2].meters.tokens: an account per route already limits \"tokens\" (accounts[1])",
    ];
    assert_eq!(errors(src), want);
}

/// Valid files: a snippet (followed by a catch-all route unless it has
/// routes of its own) and what it must set.
#[test]
fn valid_files() {
    type Check = fn(&Config) -> bool;
    let table: Vec<(&str, Check)> = vec![
        ("[server]\nlisten = \"0.0.0.0:80\"", |c| {
            c.server.listen == vec!["0.0.0.0:80".parse().unwrap()]
        }),
        ("[server]\nlisten = [\"[::1]:80\", \"127.0.0.1:81\"]", |c| {
            c.server.listen.len() == 2 && c.server.listen[0].is_ipv6()
        }),
        ("[server]\npublic_url = \"https://A.example.com/\"", |c| {
            c.server.public_url.as_deref() == Some("https://a.example.com")
        }),
        ("[server]\npublic_url = \"http://x:8080/agents/\"", |c| {
            c.server.public_url.as_deref() == Some("http://x:8080/agents")
        }),
        ("[server]\nthreads = 256", |c| c.server.threads == 256),
        ("[server]\nthreads = 1", |c| c.server.threads == 1),
        ("server = { threads = 3 }", |c| c.server.threads == 3),
        ("server.threads = 4", |c| c.server.threads == 4),
        ("[server]\nread_buffer = 0", |c| c.server.read_buffer == 0),
        ("[server]\nread_buffer = \"4KiB\"", |c| c.server.read_buffer == 4096),
        ("[server]\nread_buffer = \"64KiB\"", |c| c.server.read_buffer == 64 << 10),
        ("[server]\nread_buffer = \"1MiB\"", |c| c.server.read_buffer == 1 << 20),
        ("[server]\nlog_format = \"json\"", |c| c.server.log_format == LogFormat::Json),
        ("[server]\nlog_format = \"text\"", |c| c.server.log_format == LogFormat::Text),
        ("[server]\naccess_log = false", |c| !c.server.access_log),
        ("[server]\naccess_log = true", |c| c.server.access_log),
        ("[server]\nlog_flush = \"0s\"", |c| c.server.log_flush.is_zero()),
        ("[server]\nlog_flush = \"250ms\"", |c| c.server.log_flush == Duration::from_millis(250)),
        ("[store]\nurl = \"redis://cache:6379/0\"", |c| {
            c.store.kind
                == StoreKind::Redis {
                    url: "redis://cache:6379/0".into(),
                }
        }),
        ("[store]\nurl = \"redis://:pw@cache\"\non_store_error = \"fail-closed\"", |c| {
            matches!(c.store.kind, StoreKind::Redis { .. })
                && c.store.on_store_error == OnStoreError::FailClosed
        }),
        ("[store]\nurl = \"rediss://cache:6380/0\"", |c| {
            c.store.kind
                == StoreKind::Redis {
                    url: "rediss://cache:6380/0".into(),
                }
                && c.store.tls_ca.is_none()
                && c.store.password.is_none()
        }),
        ("[limits]\nmax_inspect_body = 1024\nmax_sse_event = \"64MiB\"", |c| {
            c.limits.max_inspect_body == 1024 && c.limits.max_sse_event == 64 << 20
        }),
        ("[limits]\nmax_card_body = \"2MB\"\nmax_tracked_tasks = 1", |c| {
            c.limits.max_card_body == 2_000_000 && c.limits.max_tracked_tasks == 1
        }),
        ("[limits]\nworker_h2_streams = 1", |c| c.limits.worker_h2_streams == 1),
        ("[limits]\nworker_h2_streams = 1000", |c| c.limits.worker_h2_streams == 1000),
        ("[timeouts]\nconnect = \"250ms\"\nupstream_idle = \"0s\"\ndownstream_idle = \"1h30m\"\ndns_refresh = \"5m\"\ndrain = \"0s\"", |c| {
            c.timeouts.connect == Duration::from_millis(250)
                && c.timeouts.upstream_idle.is_none()
                && c.timeouts.downstream_idle == Some(5400 * S)
                && c.timeouts.dns_refresh == 300 * S
                && c.timeouts.drain.is_zero()
        }),
        ("[cancel]\nattempts = 1\nbackoff = \"1s\"\nbackoff_max = \"1s\"\ntimeout = \"2m\"", |c| {
            c.cancel
                == Cancel {
                    attempts: 1,
                    backoff: S,
                    backoff_max: S,
                    timeout: 120 * S,
                }
        }),
        ("[defaults]\ncascade = \"detach\"\ndisconnect_grace = \"3s\"", |c| {
            c.routes[0].cascade
                == CascadePolicy {
                    mode: CascadeMode::Detach,
                    disconnect_grace: 3 * S,
                    id_wait: 5 * S,
                    ..CascadePolicy::default()
                }
        }),
        // a route's own keys override [defaults], key by key
        (
            "[defaults]\ncascade = \"detach\"\nid_wait = \"1s\"\n[[routes]]\nname = \"r\"\nworker = \"http://w\"\ncascade = \"cancel\"\ndisconnect_grace = \"1m\"",
            |c| {
                c.routes[0].cascade
                    == CascadePolicy {
                        mode: CascadeMode::Cancel,
                        disconnect_grace: 60 * S,
                        id_wait: S,
                        ..CascadePolicy::default()
                    }
            },
        ),
        (
            "[[routes]]\nname = \"r-1_x\"\nworker = \"https://W:8443/base/\"\npath_prefix = \"/r\"\nhost = \"R.Example.com\"\nstrip_prefix = false",
            |c| {
                let r = &c.routes[0];
                r.name == "r-1_x"
                    && r.worker == WorkerUrl { tls: true, host: "w".into(), port: 8443, base_path: "/base".into() }
                    && r.path_prefix.as_deref() == Some("/r")
                    && r.host.as_deref() == Some("r.example.com")
                    && !r.strip_prefix
            },
        ),
        // same prefix on different hosts, same host with different prefixes
        (
            "[[routes]]\nname = \"a\"\nworker = \"http://w\"\npath_prefix = \"/x\"\nhost = \"a\"\n\
             [[routes]]\nname = \"b\"\nworker = \"http://w\"\npath_prefix = \"/x\"\nhost = \"b\"\n\
             [[routes]]\nname = \"c\"\nworker = \"http://w\"\npath_prefix = \"/x\"\n\
             [[routes]]\nname = \"d\"\nworker = \"http://w\"\nhost = \"a\"",
            |c| c.routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>() == ["a", "b", "c", "d"],
        ),
        (
            "routes = [{ name = \"i\", worker = \"http://w\", host = \"[::1]\" }]",
            |c| c.routes[0].name == "i" && c.routes[0].host.as_deref() == Some("[::1]"),
        ),
        (
            "[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential = \"Bearer x\"",
            |c| c.routes[0].worker_credential.as_deref() == Some("Bearer x"),
        ),
        (
            "[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential_env = \"TOKEN\"",
            |c| c.routes[0].worker_credential.as_deref() == Some("Bearer from-env"),
        ),
    ];
    for (snippet, check) in table {
        let src = if snippet.contains("routes") {
            snippet.to_owned()
        } else {
            format!("{snippet}\n{ROUTE}")
        };
        let c = ok(&src);
        assert!(check(&c), "{src}\n---\n{c:#?}");
    }
}

/// Each kind of error, alone: the file and its one error, as displayed.
#[test]
fn single_errors() {
    let table: &[(&str, &str)] = &[
        // logs
        ("[server]\nlog_format = \"xml\"\n", "2:14: server.log_format: expected one of \"text\", \"json\", found \"xml\""),
        ("[server]\naccess_log = \"off\"\n", "2:14: server.access_log: expected true or false, found \"off\""),
        ("[server]\nlog_flush = \"2m\"\n", "2:13: server.log_flush: must be at most 1m, found \"2m\""),
        ("[server]\nlog_flush = 1\n", "2:13: server.log_flush: a duration needs a unit, written as a string like \"5s\" or \"250ms\"; found integer 1"),
        // header injection
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\ninject_extensions = [\"a,b\"]", "4:21: routes[0].inject_extensions: \"a,b\" is not an extension URI (no commas, spaces or non-ASCII)"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\ninject_headers = { \"bad name\" = \"x\" }", "4:18: routes[0].inject_headers: \"bad name\" is not a header name"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nstrip_headers = [\"connection\"]", "4:17: routes[0].strip_headers: connection: a hop-by-hop header cannot be stripped here"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\ncancel_headers = [\"Authorization\"]", "4:18: routes[0].cancel_headers: Authorization: the gateway sets this header on its own CancelTask"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\ncancel_headers = [\"bad name\"]", "4:18: routes[0].cancel_headers: \"bad name\" is not a header name"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\ncancel_headers = \"x-tenant-id\"", "4:18: routes[0].cancel_headers: expected an array of header names, found \"x-tenant-id\""),
        // leases
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nmax_lease_ttl = \"500ms\"", "4:17: routes[0].max_lease_ttl: must be at least 1s (the shortest lease the extension allows)"),
        ("[leases]\ntick = \"500ms\"\n[[routes]]\nname = \"a\"\nworker = \"http://w\"\nlease = { ttl = \"1s\" }", "6:17: routes[0].lease.ttl: must be at least 3 x leases.tick (1.5s), or its renewals may come after it lapsed"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nmax_lease_ttl = \"13h\"", "4:17: routes[0].max_lease_ttl: must be at most 12h (a lease must lapse while the store still keeps its task)"),
        ("[defaults]\nmax_lease_ttl = \"24h\"\n[[routes]]\nname = \"a\"\nworker = \"http://w\"", "2:17: defaults.max_lease_ttl: must be at most 12h (a lease must lapse while the store still keeps its task)"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nmax_lease_ttl = \"1m\"\nlease = { ttl = \"2m\" }", "5:17: routes[0].lease.ttl: must be between 1s and max_lease_ttl (60s)"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nlease = { }", "4:9: routes[0].lease.ttl: missing required key"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_leases = \"sometimes\"", "4:17: routes[0].worker_leases: expected one of \"auto\", \"enforce\", \"observe\", found \"sometimes\""),
        ("[leases]\ntick = \"5s\"\n[[routes]]\nname = \"a\"\nworker = \"http://w\"", "2:8: leases.tick: must be between 10ms and 1s (a lapse is acted on within one tick)"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\npoll_lease = \"500ms\"", "4:14: routes[0].poll_lease: must be between 1s and 12h (a lease must lapse while the store still keeps its task)"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\npoll_lease = \"13h\"", "4:14: routes[0].poll_lease: must be between 1s and 12h (a lease must lapse while the store still keeps its task)"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\npoll_lease = 30", "4:14: routes[0].poll_lease: a duration needs a unit, written as a string like \"5s\" or \"250ms\"; found integer 30"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\ncascade = \"detach\"\npoll_lease = \"30s\"", "5:14: routes[0].poll_lease: cancels the tasks whose callers stopped polling, which cascade = \"detach\" never does: set cascade = \"cancel\" on this route, or remove poll_lease"),
        ("[defaults]\ncascade = \"detach\"\n[[routes]]\nname = \"a\"\nworker = \"http://w\"\npoll_lease = \"30s\"", "6:14: routes[0].poll_lease: cancels the tasks whose callers stopped polling, which cascade = \"detach\" never does: set cascade = \"cancel\" on this route, or remove poll_lease"),
        // TOML syntax
        ("[server\nthreads = 2", "1:8: invalid TOML: invalid table header; expected `.`, `]`"),
        ("a = \n", "1:5: invalid TOML: invalid string; expected `\"`, `'`"),
        ("[server]\nthreads = 2\nthreads = 3\n", "3:1: invalid TOML: duplicate key `threads` in table `server`"),
        // unknown keys, with a suggestion when one is close
        (
            "servr = 1\n[[routes]]\nname = \"a\"\nworker = \"http://w\"",
            "1:1: servr: unknown key \"servr\" (did you mean \"server\"?); expected one of: server, store, limits, timeouts, cancel, leases, tracing, delegation, defaults, routes",
        ),
        (
            "[server]\nlisten_on = \"0.0.0.0:1\"\n[[routes]]\nname = \"a\"\nworker = \"http://w\"",
            "2:1: server.listen_on: unknown key \"listen_on\"; expected one of: listen, public_url, admin, admin_token_env, admin_token_file, threads, read_buffer, log_format, access_log, log_flush, tls",
        ),
        (
            "[[routes]]\nname = \"a\"\nworker = \"http://w\"\nprefix = \"/a\"",
            "4:1: routes[0].prefix: unknown key \"prefix\"; expected one of: name, worker, workers, worker_addresses, health_interval, path_prefix, host, strip_prefix, cascade, disconnect_grace, id_wait, blocking_sends, worker_credential, worker_credential_env, worker_ca, worker_client_cert, worker_client_key, max_lease_ttl, worker_leases, lease, poll_lease, inject_extensions, inject_headers, strip_headers, cancel_headers, grpc_pass_services, budget, on_parent_completed",
        ),
        (
            "[timeouts]\nconect = \"1s\"\n[[routes]]\nname = \"a\"\nworker = \"http://w\"",
            "2:1: timeouts.conect: unknown key \"conect\" (did you mean \"connect\"?); expected one of: connect, upstream_idle, downstream_idle, dns_refresh, drain",
        ),
        // wrong types
        ("server = 1\n[[routes]]\nname = \"a\"\nworker = \"http://w\"", "1:10: server: expected a table, found integer 1"),
        ("[server]\nthreads = \"2\"\n[[routes]]\nname = \"a\"\nworker = \"http://w\"", "2:11: server.threads: expected an integer, found \"2\""),
        ("[server]\nlisten = 8080\n[[routes]]\nname = \"a\"\nworker = \"http://w\"", "2:10: server.listen: expected an address like \"127.0.0.1:8080\" or an array of them, found integer 8080"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nstrip_prefix = \"yes\"", "4:16: routes[0].strip_prefix: expected true or false, found \"yes\""),
        ("[[routes]]\nname = 7\nworker = \"http://w\"", "2:8: routes[0].name: expected a string, found integer 7"),
        ("routes = 1", "1:10: routes: expected an array of tables, found integer 1"),
        ("routes = [1]", "1:11: routes[0]: expected a table, found integer 1"),
        // missing and empty
        ("# no routes here", "1:1: routes: at least one [[routes]] table is required"),
        ("routes = []", "1:10: routes: at least one route is required"),
        ("[server]\n\n[[routes]]\nworker = \"http://w\"", "3:1: routes[0].name: missing required key"),
        ("[[routes]]\nname = \"a\"", "1:1: routes[0].worker: missing required key"),
        // bad values: server
        ("[server]\nlisten = \"localhost:80\"\n", "2:10: server.listen: expected an IP address and port like \"127.0.0.1:8080\" or \"[::]:8080\", found \"localhost:80\""),
        ("[server]\nlisten = \"0.0.0.0:0\"\n", "2:10: server.listen: port 0 is not allowed: a listener needs a known port, found \"0.0.0.0:0\""),
        ("[server]\nadmin = \"127.0.0.1:0\"\n", "2:9: server.admin: port 0 is not allowed: a listener needs a known port, found \"127.0.0.1:0\""),
        ("[server]\nlisten = []\n", "2:10: server.listen: expected at least one address"),
        ("[server]\nlisten = [\"1.2.3.4:5\", \"1.2.3.4:5\"]\n", "2:24: server.listen[1]: 1.2.3.4:5 is listed twice"),
        ("[server]\nthreads = 0\n", "2:11: server.threads: must be between 1 and 256, found 0"),
        ("[server]\nthreads = 257\n", "2:11: server.threads: must be between 1 and 256, found 257"),
        ("[server]\nread_buffer = \"2MiB\"\n", "2:15: server.read_buffer: must be between 0B and 1MiB, found \"2MiB\""),
        ("[server]\nread_buffer = \"4k\"\n", "2:15: server.read_buffer: invalid size \"4k\": unknown unit \"k\"; use B, KiB, MiB, GiB, KB, MB or GB"),
        ("[server]\npublic_url = \"agents.example.com\"\n", "2:14: server.public_url: expected an http or https URL with a host, found \"agents.example.com\""),
        ("[server]\npublic_url = \"https://x/?a=b\"\n", "2:14: server.public_url: a public URL has no user info, query or fragment, found \"https://x/?a=b\""),
        ("[server]\nadmin = \"127.0.0.1:8080\"\n", "2:9: server.admin: the admin listener must not share an address with listen"),
        // bad values: store
        ("[store]\nurl = \"postgres://db\"\n", "2:7: store.url: expected \"memory://\" or a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL, found \"postgres://db\""),
        ("[store]\nurl = \"rediss://:hunter2@cache:6380/0#insecure\"\n", "2:7: store.url: a redis URL has no fragment, found \"rediss://:***@cache:6380/0#insecure\""),
        ("[store]\nurl = \"postgres://u:hunter2@db\"\n", "2:7: store.url: expected \"memory://\" or a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL, found \"postgres://u:***@db\""),
        ("[store]\nurl = \"redis://:hunter2@cache/x\"\n", "2:7: store.url: the path of a redis URL is a database number like \"/0\", found \"redis://:***@cache/x\""),
        ("[store]\nurl = \"redis://cache/x\"\n", "2:7: store.url: the path of a redis URL is a database number like \"/0\", found \"redis://cache/x\""),
        ("[store]\nurl = \"redis://cache:99999\"\n", "2:7: store.url: invalid store URL \"redis://cache:99999\": invalid port \"99999\""),
        ("[store]\non_store_error = \"open\"\n", "2:18: store.on_store_error: expected one of \"fail-open\", \"fail-closed\", found \"open\""),
        // bad values: sizes
        ("[limits]\nmax_inspect_body = \"128MiB\"\n", "2:20: limits.max_inspect_body: must be between 1KiB and 64MiB, found \"128MiB\""),
        ("[limits]\nmax_sse_event = 100\n", "2:17: limits.max_sse_event: must be between 1KiB and 64MiB, found integer 100"),
        ("[limits]\nmax_card_body = \"1.5MiB\"\n", "2:17: limits.max_card_body: invalid size \"1.5MiB\": fractions are not supported; use a smaller unit, e.g. \"1536KiB\""),
        ("[limits]\nmax_card_body = -1\n", "2:17: limits.max_card_body: a size cannot be negative, found -1"),
        ("[limits]\nworker_h2_streams = 0\n", "2:21: limits.worker_h2_streams: must be between 1 and 1000, found 0"),
        ("[limits]\nworker_h2_streams = 1001\n", "2:21: limits.worker_h2_streams: must be between 1 and 1000, found 1001"),
        ("[limits]\nmax_tracked_tasks = 0\n", "2:21: limits.max_tracked_tasks: must be at least 1, found 0"),
        // bad values: durations
        ("[timeouts]\nconnect = 5\n", "2:11: timeouts.connect: a duration needs a unit, written as a string like \"5s\" or \"250ms\"; found integer 5"),
        ("[timeouts]\nconnect = \"5\"\n", "2:11: timeouts.connect: duration \"5\" needs a unit (ms, s, m or h), e.g. \"5s\""),
        ("[timeouts]\nconnect = \"0s\"\n", "2:11: timeouts.connect: must be more than zero"),
        ("[timeouts]\ndns_refresh = \"0s\"\n", "2:15: timeouts.dns_refresh: must be more than zero"),
        ("[timeouts]\ndrain = \"2h\"\n", "2:9: timeouts.drain: must be at most 1h"),
        ("[timeouts]\nupstream_idle = \"5 minutes\"\n", "2:17: timeouts.upstream_idle: invalid duration \"5 minutes\": a number needs a unit (ms, s, m or h)"),
        ("[timeouts]\ndownstream_idle = true\n", "2:19: timeouts.downstream_idle: expected a duration string like \"5s\", found boolean true"),
        // bad values: cancel
        ("[cancel]\nattempts = 101\n", "2:12: cancel.attempts: must be between 1 and 100, found 101"),
        ("[cancel]\nbackoff = \"10s\"\n", "1:1: cancel.backoff_max: must be at least backoff"),
        ("[cancel]\nbackoff = \"10s\"\nbackoff_max = \"1s\"\n", "3:15: cancel.backoff_max: must be at least backoff"),
        ("[cancel]\ntimeout = \"0ms\"\n", "2:11: cancel.timeout: must be more than zero"),
        // bad values: defaults
        ("[defaults]\ncascade = \"Cancel\"\n", "2:11: defaults.cascade: expected one of \"cancel\", \"detach\", found \"Cancel\""),
        ("[defaults]\nid_wait = \"5\"\n", "2:11: defaults.id_wait: duration \"5\" needs a unit (ms, s, m or h), e.g. \"5s\""),
        // bad values: routes
        ("[[routes]]\nname = \"Research\"\nworker = \"http://w\"", "2:8: routes[0].name: a route name is 1 to 64 of a-z, 0-9, '_' and '-', found \"Research\""),
        ("[[routes]]\nname = \"\"\nworker = \"http://w\"", "2:8: routes[0].name: a route name is 1 to 64 of a-z, 0-9, '_' and '-', found \"\""),
        ("[[routes]]\nname = \"a\"\nworker = \"ftp://x\"", "3:10: routes[0].worker: expected an http or https URL with a host, found \"ftp://x\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w/x?y\"", "3:10: routes[0].worker: invalid worker URL \"http://w/x?y\": a worker URL takes no query or fragment"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\npath_prefix = \"a\"", "4:15: routes[0].path_prefix: a path prefix starts with '/', found \"a\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\npath_prefix = \"/a/\"", "4:15: routes[0].path_prefix: a path prefix does not end with '/', found \"/a/\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\npath_prefix = \"/\"", "4:15: routes[0].path_prefix: \"/\" matches every path; leave path_prefix out for a catch-all route, found \"/\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\npath_prefix = \"/a?b\"", "4:15: routes[0].path_prefix: a path prefix has no '?' or '#', found \"/a?b\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\npath_prefix = \"/a b\"", "4:15: routes[0].path_prefix: a path prefix has no spaces, control or non-ASCII characters (percent-encode them), found \"/a b\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nhost = \"a.com:80\"", "4:8: routes[0].host: host is matched without its port; leave the port out, found \"a.com:80\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nhost = \"\"", "4:8: routes[0].host: expected a host name or IP address, found \"\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\ncascade = \"kill\"", "4:11: routes[0].cascade: expected one of \"cancel\", \"detach\", found \"kill\""),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\ndisconnect_grace = 2", "4:20: routes[0].disconnect_grace: a duration needs a unit, written as a string like \"5s\" or \"250ms\"; found integer 2"),
        // credentials; the secret is never echoed
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential = \"x\"\nworker_credential_env = \"TOKEN\"", "5:25: routes[0].worker_credential_env: give worker_credential or worker_credential_env, not both"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential_env = \"UNSET\"", "4:25: routes[0].worker_credential_env: environment variable UNSET is not set"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential_env = \"NEWLINE\"", "4:25: routes[0].worker_credential_env: environment variable NEWLINE: the credential is not a valid HTTP header value (control characters or non-ASCII)"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential_env = \"\"", "4:25: routes[0].worker_credential_env: \"\" is not an environment variable name"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential = \"Bearer s3cr\\u0000t\"", "4:21: routes[0].worker_credential: the credential is not a valid HTTP header value (control characters or non-ASCII)"),
        ("[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential = \" \"", "4:21: routes[0].worker_credential: the credential is empty"),
        // rules across routes
        (
            "[[routes]]\nname = \"a\"\nworker = \"http://w\"\n[[routes]]\nname = \"a\"\nworker = \"http://v\"\nhost = \"h\"",
            "5:8: routes[1].name: duplicate route name; routes[0] has it too",
        ),
        (
            "[[routes]]\nname = \"a\"\nworker = \"http://w\"\n\n[[routes]]\nname = \"b\"\nworker = \"http://v\"",
            "5:1: routes[1]: a second catch-all route (neither host nor path_prefix); routes[0] already matches everything",
        ),
        (
            "[[routes]]\nname = \"a\"\nworker = \"http://w\"\npath_prefix = \"/x\"\nhost = \"H\"\n[[routes]]\nname = \"b\"\nworker = \"http://v\"\npath_prefix = \"/x\"\nhost = \"h\"",
            "6:1: routes[1]: same host and path_prefix as routes[0]; one of them could never match",
        ),
    ];
    assert_eq!(
        errors(""),
        ["1:1: routes: at least one [[routes]] table is required"]
    );
    let mut wrong = Vec::new();
    for (src, want) in table {
        let src = if src.contains("routes") {
            src.to_string()
        } else {
            format!("{src}{ROUTE}")
        };
        let got = errors(&src);
        if got != [*want] {
            wrong.push(format!("{src}\n  want: {want}\n  got:  {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n\n"));
}

#[test]
fn every_error_at_once() {
    let src = r#"[server]
listen = ["0.0.0.0:8080", "nope"]
threads = 0
colour = "blue"

[limits]
max_sse_event = "1 lightyear"

[cancel]
backoff = "1s"
backoff_max = "500ms"

[[routes]]
name = "research"
worker = "ftp://x"
path_prefix = "research/"

[[routes]]
worker = "http://127.0.0.1:9001"
id_wait = 5

[[routes]]
name = "research"
worker = "http://127.0.0.1:9002"
"#;
    let want = [
        "2:27: server.listen[1]: expected an IP address and port like \"127.0.0.1:8080\" or \"[::]:8080\", found \"nope\"",
        "3:11: server.threads: must be between 1 and 256, found 0",
        "4:1: server.colour: unknown key \"colour\"; expected one of: listen, public_url, admin, admin_token_env, admin_token_file, threads, read_buffer, log_format, access_log, log_flush, tls",
        "7:17: limits.max_sse_event: invalid size \"1 lightyear\": unknown unit \"lightyear\"; use B, KiB, MiB, GiB, KB, MB or GB",
        "11:15: cancel.backoff_max: must be at least backoff",
        "15:10: routes[0].worker: expected an http or https URL with a host, found \"ftp://x\"",
        "16:15: routes[0].path_prefix: a path prefix starts with '/', found \"research/\"",
        "18:1: routes[1].name: missing required key",
        "20:11: routes[1].id_wait: a duration needs a unit, written as a string like \"5s\" or \"250ms\"; found integer 5",
    ];
    // routes[2] repeats routes[0]'s name, but routes[0] is broken: no
    // cross-route noise about half-read routes.
    assert_eq!(errors(src), want);
}

/// Both log keys wrong, and a route wrong: every error in one report.
#[test]
fn log_key_errors_at_once() {
    let src = "[server]\nlog_format = \"JSON\"\naccess_log = 0\n[[routes]]\nname = \"a\"\nworker = \"ftp://w\"\n";
    assert_eq!(
        errors(src),
        [
            "2:14: server.log_format: expected one of \"text\", \"json\", found \"JSON\"",
            "3:14: server.access_log: expected true or false, found integer 0",
            "6:10: routes[0].worker: expected an http or https URL with a host, found \"ftp://w\"",
        ]
    );
}

#[test]
fn cross_route_errors_with_others() {
    let src = "[[routes]]\nname = \"a\"\nworker = \"http://w\"\n\
               [[routes]]\nname = \"a\"\nworker = \"http://w\"\n\
               [[routes]]\nname = \"c\"\nworker = \"http://w\"\nbogus = 1\n";
    assert_eq!(
        errors(src),
        [
            "4:1: routes[1]: a second catch-all route (neither host nor path_prefix); routes[0] already matches everything",
            "5:8: routes[1].name: duplicate route name; routes[0] has it too",
            "10:1: routes[2].bogus: unknown key \"bogus\"; expected one of: name, worker, workers, worker_addresses, health_interval, path_prefix, host, strip_prefix, cascade, disconnect_grace, id_wait, blocking_sends, worker_credential, worker_credential_env, worker_ca, worker_client_cert, worker_client_key, max_lease_ttl, worker_leases, lease, poll_lease, inject_extensions, inject_headers, strip_headers, cancel_headers, grpc_pass_services, budget, on_parent_completed",
        ]
    );
}

#[test]
fn columns_count_characters() {
    let src = "[[routes]]\nname = \"a\"  # é\nworker = \"http://w\"\nhost = \"é\"\n";
    assert_eq!(
        errors(src),
        ["4:8: routes[0].host: expected a host name or IP address, found \"é\""]
    );
    let src = "# ééé\n[server]\nthreads = 0 \n[[routes]]\nname = \"a\"\nworker = \"http://w\"";
    assert_eq!(
        errors(src),
        ["3:11: server.threads: must be between 1 and 256, found 0"]
    );
}

#[test]
fn secrets_stay_out_of_messages() {
    let src = "[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential = \"Bearer s3cr\\u0000t\"";
    let shown = errors(src).join("\n");
    assert!(!shown.contains("s3cr"), "{shown}");

    let c = ok(
        "[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential = \"Bearer s3cret\"",
    );
    let debug = format!("{c:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");

    // Caller keys are often API keys: neither errors nor Debug show them.
    let src = "[[routes]]\nname = \"a\"\nworker = \"http://w\"\n\
               [routes.budget.callers.\"sk-live-1\"]\nmeters = { tokens = -1 }\nbogus = 1\n";
    let shown = errors(src).join("\n");
    assert!(!shown.contains("sk-live"), "{shown}");
    assert!(
        shown.contains("routes[0].budget.callers[0].meters.tokens"),
        "{shown}"
    );
    let c = ok(
        "[[routes]]\nname = \"a\"\nworker = \"http://w\"\n[routes.budget]\ncaller_header = \"x-api-key\"\n\
         [routes.budget.callers.\"sk-live-1\"]\nmeters = { tokens = 1 }\n",
    );
    for debug in [format!("{c:?}"), format!("{:?}", c.routes[0].budget)] {
        assert!(!debug.contains("sk-live"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
        assert!(debug.contains("x-api-key"), "{debug}");
    }
}

#[test]
fn error_display() {
    let e = ConfigError {
        line: 12,
        col: 10,
        path: "routes[1].worker".into(),
        message: "bad".into(),
    };
    assert_eq!(e.to_string(), "12:10: routes[1].worker: bad");
    let syntax = ConfigError {
        line: 1,
        col: 2,
        path: String::new(),
        message: "invalid TOML".into(),
    };
    assert_eq!(syntax.to_string(), "1:2: invalid TOML");
    let unplaced = ConfigError {
        line: 0,
        col: 0,
        path: String::new(),
        message: "cannot read".into(),
    };
    assert_eq!(unplaced.to_string(), "cannot read");

    let mut errors = ConfigErrors {
        file: None,
        errors: vec![e, syntax, unplaced],
    };
    assert_eq!(
        errors.to_string(),
        "12:10: routes[1].worker: bad\n1:2: invalid TOML\ncannot read"
    );
    errors.file = Some("gw.toml".into());
    assert_eq!(
        errors.to_string(),
        "gw.toml:12:10: routes[1].worker: bad\ngw.toml:1:2: invalid TOML\ngw.toml: cannot read"
    );
}

#[test]
fn load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("a2a-gateway-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let missing = dir.join("missing.toml");
    let e = load(&missing).unwrap_err();
    assert_eq!(e.file.as_deref(), Some(missing.as_path()));
    assert_eq!((e.errors[0].line, e.errors[0].col), (0, 0));
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!(
            "{}: cannot read the config file: ",
            missing.display()
        )),
        "{shown}"
    );

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[server]\nthreads = 0\n").unwrap();
    let e = load(&bad).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{0}:1:1: routes: at least one [[routes]] table is required\n{0}:2:11: server.threads: must be between 1 and 256, found 0",
            bad.display()
        )
    );

    let good = dir.join("good.toml");
    std::fs::write(&good, ROUTE).unwrap();
    assert_eq!(load(&good).unwrap().routes[0].name, "a");

    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn single_worker() {
    let listen = "0.0.0.0:8080".parse().unwrap();
    let c = Config::single_worker(listen, "https://w.example/base/").unwrap();
    assert_eq!(c.server.listen, vec![listen]);
    assert_eq!(c.server.threads, 2);
    assert_eq!(c.routes.len(), 1);
    let r = &c.routes[0];
    assert_eq!(r.name, "default");
    assert_eq!(r.worker.origin(), "https://w.example:443");
    assert_eq!(r.worker.base_path, "/base");
    assert_eq!((r.path_prefix.as_deref(), r.host.as_deref()), (None, None));
    assert!(r.strip_prefix);
    assert_eq!(r.cascade, CascadePolicy::default());
    let e = Config::single_worker(listen, "w.example:9000").unwrap_err();
    assert!(e.contains("expected an http or https URL"), "{e}");
}

#[test]
fn process_environment() {
    // `parse` reads the real environment; PATH is set wherever tests run.
    let src = "[[routes]]\nname = \"a\"\nworker = \"http://w\"\nworker_credential_env = \"PATH\"";
    let c = parse(src);
    assert!(c.is_ok() || std::env::var("PATH").is_err(), "{c:?}");
}

/// A CA certificate (P-256, made with `openssl req -x509`) for `worker_ca`.
const CA_PEM: &str = include_str!("../testdata/ca.pem");

/// `worker_ca`: read relative to the config file, every certificate kept,
/// and each way a file can be wrong reported with the route's others.
#[test]
fn worker_ca() {
    let dir = std::env::temp_dir().join(format!("a2a-gateway-config-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).unwrap();
    };
    write("ca.pem", CA_PEM);
    // Two certificates, with a key between them that is skipped.
    write(
        "two.pem",
        &format!("{CA_PEM}-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n{CA_PEM}"),
    );
    write("empty.pem", "no PEM here\n");
    // Valid base64 in a CERTIFICATE block, but not X.509 (pingora's
    // wrapper would panic on it while the gateway builds its routes).
    write(
        "junk.pem",
        "-----BEGIN CERTIFICATE-----\nAAECAwQF\n-----END CERTIFICATE-----\n",
    );
    // X.509 that x509-parser reads but rustls refuses as a trust anchor:
    // `ca.pem`'s certificate with two bytes after it in the block.
    write(
        "trailing.pem",
        include_str!("../testdata/trailing-data.pem"),
    );

    let route = |worker: &str, ca: &str| {
        format!("[[routes]]\nname = \"a\"\nworker = \"{worker}\"\nworker_ca = \"{ca}\"\n")
    };
    let parse_in = |src: &str| parse_at(src, Some(&dir), &env);

    let c = parse_in(&route("https://w", "ca.pem")).unwrap();
    let ca = c.routes[0].worker_ca.as_ref().unwrap();
    assert_eq!(ca.path, dir.join("ca.pem"));
    assert_eq!(ca.certs.len(), 1);
    assert_eq!(
        format!("{ca:?}"),
        format!("{} (1 certificate)", dir.join("ca.pem").display())
    );
    let abs = dir.join("two.pem").display().to_string();
    let c = parse_in(&route("https://w", &abs)).unwrap();
    assert_eq!(c.routes[0].worker_ca.as_ref().unwrap().certs.len(), 2);
    // `load` reads it from the file's directory.
    write("gw.toml", &route("https://w", "ca.pem"));
    assert_eq!(
        load(&dir.join("gw.toml")).unwrap().routes[0]
            .worker_ca
            .as_ref()
            .unwrap()
            .certs
            .len(),
        1
    );

    // An http route to the same host:port has no trust to disagree with.
    let mixed = format!(
        "[[routes]]\nname = \"p\"\nworker = \"http://w:443\"\npath_prefix = \"/p\"\n{}",
        route("https://w", "ca.pem")
    );
    assert!(parse_in(&mixed).unwrap().routes[1].worker_ca.is_some());

    let shown = |name: &str| dir.join(name).display().to_string();
    let table = [
        (route("https://w", "missing.pem"), format!("4:13: routes[0].worker_ca: cannot read {}: No such file or directory (os error 2)", shown("missing.pem"))),
        (route("https://w", "empty.pem"), format!("4:13: routes[0].worker_ca: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", shown("empty.pem"))),
        (route("https://w", "junk.pem"), format!("4:13: routes[0].worker_ca: {}: certificate 1 is not an X.509 certificate: ", shown("junk.pem"))),
        (route("https://w", "trailing.pem"), format!("4:13: routes[0].worker_ca: {}: certificate 1 cannot be a trust anchor: ", shown("trailing.pem"))),
        (route("https://w", ""), "4:13: routes[0].worker_ca: expected the path of a PEM file, found an empty string".to_owned()),
        (route("http://w", "ca.pem"), "4:13: routes[0].worker_ca: worker_ca applies to https workers only; this route's worker is http".to_owned()),
        (
            format!("{}path_prefix = \"/a\"\n[[routes]]\nname = \"b\"\nworker = \"https://w:443/other\"\n", route("https://w", "ca.pem")),
            "6:1: routes[1].worker_ca: routes[0] reaches the same worker (w:443) with a different worker_ca; give both the same".to_owned(),
        ),
    ];
    for (src, want) in table {
        let got: Vec<String> = match parse_in(&src) {
            Ok(c) => panic!("{src}\n--- parsed: {c:?}"),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        };
        assert_eq!(got.len(), 1, "{src}: {got:?}");
        assert!(
            got[0].starts_with(&want),
            "{src}\n got: {}\nwant: {want}",
            got[0]
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `[server.tls]`: TLS listeners with a certificate and key read relative to
/// the config file; plain listeners may then be none.
#[test]
fn server_tls() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let parse_in = |src: &str| parse_at(src, Some(&dir), &env);
    let tls =
        "[server.tls]\nlisten = \"127.0.0.1:8443\"\ncert = \"ca.pem\"\nkey = \"ca-key.pem\"\n";

    let c = parse_in(&format!("[server]\nlisten = []\n{tls}{ROUTE}")).unwrap();
    assert!(c.server.listen.is_empty());
    assert_eq!(
        c.server.tls,
        Some(ServerTls {
            listen: vec!["127.0.0.1:8443".parse().unwrap()],
            cert: dir.join("ca.pem"),
            key: dir.join("ca-key.pem"),
        })
    );
    let c = parse_in(&format!("{tls}{ROUTE}")).unwrap();
    assert_eq!(
        c.server.listen,
        Server::default().listen,
        "plain listener kept"
    );

    let errors_in = |src: &str| -> Vec<String> {
        match parse_in(src) {
            Ok(c) => panic!("{src}\n--- parsed: {c:?}"),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        }
    };
    let table: &[(&str, &[&str])] = &[
        (
            "[server.tls]\nlisten = \"127.0.0.1:8080\"\n",
            &[
                "1:1: server.tls.cert: missing required key",
                "1:1: server.tls.key: missing required key",
                "2:10: server.tls.listen: 127.0.0.1:8080 is also a plain listener (server.listen or server.admin)",
            ],
        ),
        (
            "[server]\nadmin = \"127.0.0.1:9\"\n[server.tls]\nlisten = [\"127.0.0.1:9\"]\ncert = \"ca.pem\"\nkey = \"ca.pem\"\n",
            &[
                "4:10: server.tls.listen: 127.0.0.1:9 is also a plain listener (server.listen or server.admin)",
                "6:7: server.tls.key: ",
            ],
        ),
        (
            "[server.tls]\nlisten = []\ncert = \"missing.pem\"\nkey = \"ca-key.pem\"\nalpn = \"h2\"\n",
            &[
                "2:10: server.tls.listen: expected at least one address",
                "3:8: server.tls.cert: cannot read ",
                "5:1: server.tls.alpn: unknown key \"alpn\"; expected one of: listen, cert, key",
            ],
        ),
        ("[server]\nlisten = []\n", &["2:10: server.listen: expected at least one address"]),
    ];
    for (snippet, want) in table {
        let src = format!("{snippet}{ROUTE}");
        let got = errors_in(&src);
        assert_eq!(got.len(), want.len(), "{src}\n{got:#?}");
        for (g, w) in got.iter().zip(want.iter()) {
            assert!(g.starts_with(w), "{src}\n got: {g}\nwant: {w}…");
        }
    }
    let got = errors_in(&format!("{}{ROUTE}", table[1].0));
    assert!(
        got[1].ends_with("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): no items found"),
        "{}",
        got[1]
    );
}

/// `worker_client_cert` and `worker_client_key`: both or neither, for https
/// workers, parsed at load; routes to one host:port present the same.
#[test]
fn worker_client_cert() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let parse_in = |src: &str| parse_at(src, Some(&dir), &env);
    let pair = "worker_client_cert = \"ca.pem\"\nworker_client_key = \"ca-key.pem\"\n";
    let c = parse_in(&format!(
        "[[routes]]\nname = \"a\"\nworker = \"https://w\"\n{pair}"
    ))
    .unwrap();
    let client = c.routes[0].worker_client_cert.as_ref().unwrap();
    assert_eq!(client.cert_path, dir.join("ca.pem"));
    assert_eq!(client.certs.len(), 1);
    assert!(!client.key.is_empty());
    let shown = format!("{client:?}");
    assert_eq!(
        shown,
        format!(
            "{} with key {}",
            dir.join("ca.pem").display(),
            dir.join("ca-key.pem").display()
        )
    );

    let errors_in = |src: &str| -> Vec<String> {
        match parse_in(src) {
            Ok(c) => panic!("{src}\n--- parsed: {c:?}"),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        }
    };
    let route = |worker: &str, extra: &str| {
        format!("[[routes]]\nname = \"a\"\nworker = \"{worker}\"\n{extra}")
    };
    let table: Vec<(String, Vec<&str>)> = vec![
        (
            route("https://w", "worker_client_cert = \"ca.pem\"\n"),
            vec!["4:22: routes[0].worker_client_cert: give worker_client_key too"],
        ),
        (
            route("https://w", "worker_client_key = \"ca-key.pem\"\n"),
            vec!["4:21: routes[0].worker_client_key: give worker_client_cert too"],
        ),
        (
            route("http://w", pair),
            vec!["4:22: routes[0].worker_client_cert: worker_client_cert applies to https workers only; this route's worker is http"],
        ),
        (
            route("https://w", "worker_client_cert = \"ca.pem\"\nworker_client_key = \"ca.pem\"\n"),
            vec!["5:21: routes[0].worker_client_key: "],
        ),
        (
            format!(
                "{}path_prefix = \"/a\"\n[[routes]]\nname = \"b\"\nworker = \"https://w:443/other\"\n",
                route("https://w", pair)
            ),
            vec!["7:1: routes[1].worker_client_cert: routes[0] reaches the same worker (w:443) with a different worker_client_cert; give both the same"],
        ),
    ];
    for (src, want) in table {
        let got = errors_in(&src);
        assert_eq!(got.len(), want.len(), "{src}\n{got:#?}");
        for (g, w) in got.iter().zip(want.iter()) {
            assert!(g.starts_with(w), "{src}\n got: {g}\nwant: {w}…");
        }
    }
}

/// An admin listener off loopback needs a token; the token comes from an
/// environment variable or a file, never both, and no error shows it.
#[test]
fn admin_token() {
    let route = "[[routes]]\nname = \"a\"\nworker = \"http://w\"\n";
    let env = |name: &str| match name {
        "TOK" => Some("0123456789abcdef-long".to_owned()),
        "SHORT" => Some("hunter2".to_owned()),
        _ => None,
    };
    let parse = |server: &str| parse_with_env(&format!("[server]\n{server}\n{route}"), &env);
    let c = parse("admin = \"127.0.0.1:9090\"").unwrap();
    assert_eq!(c.server.admin_token, None);
    let c = parse("admin = \"[::1]:9090\"").unwrap();
    assert_eq!(c.server.admin_token, None);
    let c = parse("admin = \"0.0.0.0:9090\"\nadmin_token_env = \"TOK\"").unwrap();
    assert_eq!(
        c.server.admin_token.as_ref().map(Secret::expose),
        Some("0123456789abcdef-long")
    );
    assert!(!format!("{c:?}").contains("0123456789abcdef"));
    let err = |server: &str| parse(server).unwrap_err().to_string();
    assert_eq!(
        err("admin = \"0.0.0.0:9090\""),
        "2:9: server.admin: 0.0.0.0:9090 is not a loopback address: an admin listener others can reach needs admin_token_env or admin_token_file"
    );
    let e = err("admin = \"127.0.0.1:9090\"\nadmin_token_env = \"SHORT\"");
    assert!(
        e.contains("environment variable SHORT: the admin token is shorter than 16"),
        "{e}"
    );
    assert!(!e.contains("hunter2"), "{e}");
    let e = err("admin_token_env = \"UNSET\"");
    assert!(e.contains("environment variable UNSET is not set"), "{e}");

    let dir = std::env::temp_dir().join(format!("a2agw-config-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), "from-a-file-0123456789\n").unwrap();
    let src = format!("[server]\nadmin = \"10.0.0.5:9090\"\nadmin_token_file = \"token\"\n{route}");
    let c = parse_at(&src, Some(&dir), &env).unwrap();
    assert_eq!(
        c.server.admin_token.as_ref().map(Secret::expose),
        Some("from-a-file-0123456789")
    );
    let src = format!("[server]\nadmin_token_env = \"TOK\"\nadmin_token_file = \"token\"\n{route}");
    let e = parse_at(&src, Some(&dir), &env).unwrap_err().to_string();
    assert!(
        e.contains("give admin_token_env or admin_token_file, not both"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `Debug` of a config shows a Redis URL without its password.
#[test]
fn store_url_debug_redacted() {
    let c = parse("[store]\nurl = \"redis://user:hunter2@cache:6379/0\"\n[[routes]]\nname = \"a\"\nworker = \"http://w\"\n").unwrap();
    let shown = format!("{c:?}");
    assert!(shown.contains("redis://user:***@cache:6379/0"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

/// The store's password from an environment variable or a file (never both,
/// never with one in the URL), and its TLS files (for `rediss://` only):
/// every error at once, none showing the password.
#[test]
fn store_password_and_tls() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let scratch = std::env::temp_dir().join(format!("a2agw-config-store-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join("pw"), "from-a-file hunter3\r\n").unwrap();
    std::fs::write(scratch.join("empty"), "\n").unwrap();
    let env = |name: &str| match name {
        "REDIS_PW" => Some("hunter2".to_owned()),
        "EMPTY" => Some(String::new()),
        _ => None,
    };
    let parse_in =
        |store: &str, at: &Path| parse_at(&format!("[store]\n{store}\n{ROUTE}"), Some(at), &env);
    let ok_in = |store: &str, at: &Path| match parse_in(store, at) {
        Ok(c) => c.store,
        Err(e) => panic!("{store}\n---\n{e}"),
    };

    let s = ok_in(
        "url = \"redis://cache:6379/0\"\npassword_env = \"REDIS_PW\"",
        &dir,
    );
    assert_eq!(s.password.as_ref().map(Secret::expose), Some("hunter2"));
    assert!(!format!("{s:?}").contains("hunter2"), "{s:?}");
    // A user name in the URL and the password from a file (one trailing
    // newline dropped, spaces kept), relative to the config file.
    let s = ok_in(
        "url = \"rediss://gw@cache:6380/0\"\npassword_file = \"pw\"",
        &scratch,
    );
    assert_eq!(
        s.password.as_ref().map(Secret::expose),
        Some("from-a-file hunter3")
    );
    let s = ok_in(
        "url = \"rediss://cache:6380/0\"\ntls_ca_file = \"ca.pem\"\ntls_client_cert = \"ca.pem\"\ntls_client_key = \"ca-key.pem\"",
        &dir,
    );
    assert_eq!(
        s.tls_ca.as_ref().map(|c| c.path.clone()),
        Some(dir.join("ca.pem"))
    );
    let client = s.tls_client_cert.as_ref().unwrap();
    assert_eq!(
        (&client.cert_path, &client.key_path),
        (&dir.join("ca.pem"), &dir.join("ca-key.pem"))
    );
    // Without `url`, `--store` may name one: checked at start instead.
    let s = ok_in(
        "password_env = \"REDIS_PW\"\ntls_ca_file = \"ca.pem\"",
        &dir,
    );
    assert!(s.check().unwrap_err().contains("the store is memory://"));
    let mut with_url = s.clone();
    with_url.kind = StoreKind::Redis {
        url: "rediss://cache:6380/0".into(),
    };
    assert_eq!(with_url.check(), Ok(()));
    with_url.kind = StoreKind::Redis {
        url: "redis://:hunter2@cache:6379/0".into(),
    };
    let e = with_url.check().unwrap_err();
    assert_eq!(
        e,
        "store.password_env or store.password_file: the store URL has a password too: give it in one place (the URL, password_env or password_file); store.tls_ca_file or store.tls_client_cert: applies to rediss:// or rediss+cluster:// (Redis over TLS) only; the store URL is redis://"
    );
    assert_eq!(Store::default().check(), Ok(()));

    let shown = |name: &str| scratch.join(name).display().to_string();
    let table: &[(&str, &[&str])] = &[
        (
            "url = \"redis://:hunter2@cache:6379/0\"\npassword_env = \"REDIS_PW\"",
            &["3:16: store.password_env: the store URL has a password too: give it in one place (the URL, password_env or password_file)"],
        ),
        (
            "url = \"rediss://u:hunter2@cache:6380/0\"\npassword_file = \"pw\"",
            &["3:17: store.password_file: the store URL has a password too: give it in one place (the URL, password_env or password_file)"],
        ),
        (
            "password_env = \"REDIS_PW\"\npassword_file = \"pw\"",
            &["3:17: store.password_file: give password_env or password_file, not both"],
        ),
        (
            "url = \"memory://\"\npassword_env = \"REDIS_PW\"",
            &["3:16: store.password_env: a password is for a Redis store; the store is memory://"],
        ),
        (
            "password_env = \"UNSET\"\npassword_file = \"missing\"",
            &[
                "2:16: store.password_env: environment variable UNSET is not set",
                "3:17: store.password_file: cannot read ",
                "3:17: store.password_file: give password_env or password_file, not both",
            ],
        ),
        ("password_env = \"EMPTY\"", &["2:16: store.password_env: environment variable EMPTY: the password is empty"]),
        ("password_env = \"A=B\"", &["2:16: store.password_env: \"A=B\" is not an environment variable name"]),
        ("password_file = \"empty\"", &["2:17: store.password_file: "]),
        ("password_file = \"\"", &["2:17: store.password_file: expected the path of a PEM file, found an empty string"]),
        (
            "url = \"redis://cache:6379/0\"\ntls_ca_file = \"missing.pem\"\ntls_client_cert = \"pw\"",
            &[
                "3:15: store.tls_ca_file: cannot read ",
                "3:15: store.tls_ca_file: applies to rediss:// or rediss+cluster:// (Redis over TLS) only; the store URL is redis://",
                "4:19: store.tls_client_cert: ",
                "4:19: store.tls_client_cert: give tls_client_key too",
                "4:19: store.tls_client_cert: applies to rediss:// or rediss+cluster:// (Redis over TLS) only; the store URL is redis://",
            ],
        ),
        (
            "url = \"memory://\"\ntls_ca_file = \"pw\"",
            &[
                "3:15: store.tls_ca_file: ",
                "3:15: store.tls_ca_file: applies to rediss:// or rediss+cluster:// (Redis over TLS) only; the store URL is memory://",
            ],
        ),
    ];
    for (snippet, want) in table {
        let got: Vec<String> = match parse_in(snippet, &scratch) {
            Ok(c) => panic!("{snippet}\n--- parsed: {c:?}"),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        };
        assert_eq!(got.len(), want.len(), "{snippet}: {got:?}");
        for (g, w) in got.iter().zip(*want) {
            assert!(g.starts_with(w), "{snippet}\n got: {g}\nwant: {w}");
            assert!(!g.contains("hunter"), "{g}");
        }
    }
    assert!(parse_in("password_file = \"empty\"", &scratch)
        .unwrap_err()
        .to_string()
        .contains(&format!("{}: the password is empty", shown("empty"))));
    std::fs::remove_dir_all(&scratch).ok();
}

/// `[tracing]`: off without the table; its keys, defaults and every error
/// at once.
#[test]
fn tracing_table() {
    assert_eq!(ok(ROUTE).tracing, None);
    let t = ok(&format!(
        "[tracing]\notlp_endpoint = \"http://collector:4318/\"\n{ROUTE}"
    ))
    .tracing
    .unwrap();
    assert_eq!(t.otlp_endpoint, "http://collector:4318");
    assert_eq!(t.service_name, "a2a-gateway");
    assert_eq!(t.sample_ratio.get(), 1.0);
    let t = ok(&format!(
        "[tracing]\notlp_endpoint = \"http://10.0.0.5/otel\"\nservice_name = \"gw-eu\"\nsample_ratio = 0.25\n{ROUTE}"
    ))
    .tracing
    .unwrap();
    assert_eq!(t.otlp_endpoint, "http://10.0.0.5/otel");
    assert_eq!(t.service_name, "gw-eu");
    assert_eq!(t.sample_ratio.get(), 0.25);
    let t = ok(&format!(
        "[tracing]\notlp_endpoint = \"http://c:4318\"\nsample_ratio = 0\n{ROUTE}"
    ))
    .tracing
    .unwrap();
    assert_eq!(t.sample_ratio.get(), 0.0);

    // Every error of the table at once.
    let errs = errors(&format!(
        "[tracing]\nservice_name = \"\"\nsample_ratio = 1.5\nendpoint = \"x\"\n{ROUTE}"
    ));
    let want = [
        "tracing.otlp_endpoint: missing required key",
        "tracing.service_name: must be 1 to 255 characters",
        "tracing.sample_ratio: must be between 0 and 1, found 1.5",
        "tracing.endpoint: unknown key \"endpoint\"",
    ];
    for w in want {
        assert!(errs.iter().any(|e| e.contains(w)), "{w:?} not in {errs:#?}");
    }
    assert_eq!(errs.len(), want.len(), "{errs:#?}");

    for (endpoint, why) in [
        ("https://c:4318", "https is not supported"),
        ("grpc://c:4317", "expected an http URL with a host"),
        ("collector:4318", "expected an http URL with a host"),
        ("http://u:p@c:4318", "no user info, query or fragment"),
        ("http://c:4318?x=1", "no user info, query or fragment"),
        (
            "http://c:4318/v1/traces",
            "the gateway adds /v1/traces itself",
        ),
    ] {
        let errs = errors(&format!(
            "[tracing]\notlp_endpoint = \"{endpoint}\"\n{ROUTE}"
        ));
        assert!(
            errs.len() == 1 && errs[0].contains("tracing.otlp_endpoint") && errs[0].contains(why),
            "{endpoint}: {errs:#?}"
        );
    }
    let errs = errors(&format!(
        "[tracing]\notlp_endpoint = \"http://c\"\nsample_ratio = \"all\"\n{ROUTE}"
    ));
    assert!(
        errs[0].contains("expected a number from 0 to 1"),
        "{errs:#?}"
    );
    let errs = errors(&format!("tracing = 1\n{ROUTE}"));
    assert!(errs[0].contains("expected a table"), "{errs:#?}");
}

/// What makes a route check sends, as its start-up log line names it.
#[test]
fn send_checks() {
    let checks = |extra: &str| ok(&format!("{ROUTE}{extra}")).routes[0].send_checks();
    assert_eq!(checks(""), ["lease_grants"], "worker_leases = \"auto\"");
    assert!(checks("worker_leases = \"observe\"").is_empty());
    assert_eq!(
        checks("worker_leases = \"observe\"\npoll_lease = \"1m\"\nlease = { ttl = \"30s\" }\n[routes.budget]\nmax_deadline = \"1m\""),
        ["budget", "imposed_lease", "poll_lease"]
    );
}

#[test]
fn grpc_pass_services() {
    let route = |extra: &str| format!("{ROUTE}{extra}");
    let c = ok(&route(
        "grpc_pass_services = [\"grpc.health.v1.Health\", \"x.Y\", \"x.Y\"]",
    ));
    assert_eq!(
        c.routes[0].grpc_pass_services,
        ["grpc.health.v1.Health", "x.Y"]
    );
    assert!(ok(ROUTE).routes[0].grpc_pass_services.is_empty());
    for (bad, why) in [
        ("[\"lf.a2a.v1.A2AService\"]", "the A2A service is read"),
        ("[\"a/b\"]", "is not a gRPC service name"),
        ("[\"a..b\"]", "is not a gRPC service name"),
        ("[\"\"]", "is not a gRPC service name"),
        ("\"grpc.health.v1.Health\"", "expected an array"),
    ] {
        let errs = errors(&route(&format!("grpc_pass_services = {bad}")));
        assert!(errs.len() == 1 && errs[0].contains(why), "{bad}: {errs:?}");
    }
}

#[test]
fn worker_replicas() {
    let route = |keys: &str| format!("[[routes]]\nname = \"a\"\n{keys}\n");
    let c = ok(&route(
        "workers = [\"http://a:9000/x\", \"http://b:9000/x\"]\nhealth_interval = \"1s\"",
    ));
    let r = &c.routes[0];
    assert_eq!(r.worker.authority(), "a:9000");
    let names: Vec<String> = r.workers.iter().map(WorkerUrl::authority).collect();
    assert_eq!(names, ["a:9000", "b:9000"]);
    assert_eq!(r.health_interval, S);
    assert_eq!(
        ok(ROUTE).routes[0].workers,
        [ok(ROUTE).routes[0].worker.clone()]
    );
    assert_eq!(ok(ROUTE).routes[0].worker_addresses, WorkerAddresses::First);
    let all = ok(&format!("{ROUTE}worker_addresses = \"all\""));
    assert_eq!(all.routes[0].worker_addresses, WorkerAddresses::All);
    let errs = errors(&format!("{ROUTE}worker_addresses = \"some\""));
    assert!(
        errs.len() == 1 && errs[0].contains("expected one of \"first\", \"all\""),
        "{errs:?}"
    );
    for (keys, why) in [
        (
            "worker = \"http://a\"\nworkers = [\"http://b\"]",
            "not both",
        ),
        ("workers = []", "names no worker"),
        (
            "workers = [\"http://a:1\", \"https://b:1\"]",
            "share its scheme and base path",
        ),
        (
            "workers = [\"http://a:1/x\", \"http://b:1/y\"]",
            "share its scheme and base path",
        ),
        ("workers = [\"http://a:1\", \"http://a:1/\"]", "named twice"),
        ("workers = [\"ftp://a\"]", "expected an http or https URL"),
        (
            "workers = [\"http://a\"]\nhealth_interval = \"10ms\"",
            "between 100ms and 1h",
        ),
    ] {
        let errs = errors(&route(keys));
        assert!(errs.len() == 1 && errs[0].contains(why), "{keys}: {errs:?}");
    }
}

#[test]
fn sentinel_urls() {
    use crate::SentinelUrl;
    assert_eq!(SentinelUrl::parse("redis://cache:6379"), None);
    assert_eq!(
        SentinelUrl::parse("redis+sentinel://:pw@s1,s2:26380/mymaster/2"),
        Some(Ok(SentinelUrl {
            sentinels: vec!["s1:26379".into(), "s2:26380".into()],
            master: "mymaster".into(),
            userinfo: Some(":pw".into()),
            db: Some(2),
        }))
    );
    let u = SentinelUrl::parse("redis+sentinel://127.0.0.1:1/m")
        .unwrap()
        .unwrap();
    assert_eq!(u.data_url("10.0.0.9", 6380), "redis://10.0.0.9:6380");
    for bad in [
        "redis+sentinel://s1",
        "redis+sentinel://s1/",
        "redis+sentinel://s1:x/m",
        "redis+sentinel://s1,/m",
        "redis+sentinel://s1/m/x",
        "redis+sentinel://s1/m?db=1",
    ] {
        assert!(
            matches!(SentinelUrl::parse(bad), Some(Err(_))),
            "{bad}: {:?}",
            SentinelUrl::parse(bad)
        );
    }
    // Through the config: accepted, and a bad one reported without its
    // password.
    let route = "[[routes]]\nname = \"a\"\npath_prefix = \"/a\"\nworker = \"http://127.0.0.1:1\"\n";
    let c = crate::parse(&format!(
        "[store]\nurl = \"redis+sentinel://s1:26379/m\"\n\n{route}"
    ));
    assert!(c.is_ok(), "{c:?}");
    let e = crate::parse(&format!(
        "[store]\nurl = \"redis+sentinel://:hunter2@s1\"\n\n{route}"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("sentinel") && !e.contains("hunter2"), "{e}");
}

#[test]
fn cluster_urls() {
    use crate::ClusterUrl;
    assert_eq!(ClusterUrl::parse("redis://cache:6379"), None);
    assert_eq!(ClusterUrl::parse("redis+sentinel://s1/m"), None);
    assert_eq!(
        ClusterUrl::parse("redis+cluster://:pw@n1,n2:7001"),
        Some(Ok(ClusterUrl {
            nodes: vec!["n1:6379".into(), "n2:7001".into()],
            userinfo: Some(":pw".into()),
            tls: false,
        }))
    );
    let u = ClusterUrl::parse("rediss+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7000/")
        .unwrap()
        .unwrap();
    assert_eq!(
        u.node_urls(),
        ["rediss://u:pw@10.0.0.1:7000", "rediss://u:pw@10.0.0.2:7000"]
    );
    for bad in [
        "redis+cluster://",
        "redis+cluster://n1:x",
        "redis+cluster://n1,",
        "redis+cluster://n1/0",
        "redis+cluster://n1?x=1",
        "redis+cluster://n{1}",
    ] {
        assert!(
            matches!(ClusterUrl::parse(bad), Some(Err(_))),
            "{bad}: {:?}",
            ClusterUrl::parse(bad)
        );
    }
    // Through the config: accepted, TLS files only with rediss+cluster://,
    // a password in one place only, a bad URL reported without its password.
    let route = "[[routes]]\nname = \"a\"\npath_prefix = \"/a\"\nworker = \"http://127.0.0.1:1\"\n";
    let c = crate::parse(&format!(
        "[store]\nurl = \"redis+cluster://n1:7000,n2:7000\"\n\n{route}"
    ));
    assert!(c.is_ok(), "{c:?}");
    let e = crate::parse(&format!(
        "[store]\nurl = \"redis+cluster://:hunter2@n1/3\"\n\n{route}"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("database") && !e.contains("hunter2"), "{e}");
    assert_eq!(crate::schema::tls_misfit("rediss+cluster://n1"), None);
    assert!(crate::schema::tls_misfit("redis+cluster://n1").is_some());
    assert!(crate::schema::password_misfit("redis+cluster://:pw@n1,n2").is_some());
    assert_eq!(
        crate::schema::password_misfit("redis+cluster://n1,n2"),
        None
    );
}
