//! `docs/config.md` names exactly the keys the config accepts.
//!
//! The accepted keys come from the reads themselves ([`read::Sink::keys`]):
//! a document that opens every table is read, and every key a read asked
//! about is noted by its shape (`routes.budget.tenants.*.meters`). The
//! documented keys are the first cells of the doc's key tables: every table
//! whose header row starts with `| key |`, one key per row, written as a
//! dotted path in backticks. A key in one set and not the other fails the
//! test, which names it.

use std::collections::BTreeSet;

use super::{read, schema};

/// A document that opens every table the reads walk into, so that every
/// key is asked about. Its values do not matter (it need not be valid): a
/// key is noted when its table is read, present or not. A new table must
/// be added here, or its own name shows up as an undocumented key.
const EVERY_TABLE: &str = r#"
[server.tls]
[tracing]

[[routes]]
lease = {}
auth = {}

[routes.budget.tenants.t]
[routes.budget.callers.c]
[[routes.budget.accounts]]
"#;

/// The keys the config accepts: every noted key that is not itself a table
/// of keys (`routes.lease` holds `routes.lease.ttl`).
fn accepted_keys() -> BTreeSet<String> {
    let sink = read::Sink::new(EVERY_TABLE);
    let doc = toml_edit::ImDocument::parse(EVERY_TABLE).expect("EVERY_TABLE is TOML");
    let env = |_: &str| None;
    let outside = schema::Outside {
        env: &env,
        dir: None,
    };
    let mut root = read::Reader::root(&sink, doc.as_table());
    // Its errors (missing required keys, an empty TLS table) do not matter.
    let _ = schema::config(&mut root, &sink, &outside);
    root.finish();
    let noted = sink.keys();
    noted
        .iter()
        .filter(|k| {
            let below = format!("{k}.");
            !noted.iter().any(|other| other.starts_with(&below))
        })
        .cloned()
        .collect()
}

/// The keys a markdown text documents: the first cell of each row of every
/// table whose header row starts with `| key |`. Errors name the line of a
/// row that is not one backticked key, and of a key given twice.
fn documented_keys(md: &str) -> Result<BTreeSet<String>, Vec<String>> {
    let mut keys = BTreeSet::new();
    let mut problems = Vec::new();
    // Inside a key table: past its header row (and its `| --- |` row).
    let mut in_table = false;
    for (n, line) in md.lines().enumerate() {
        let line = line.trim();
        let Some(row) = line.strip_prefix('|') else {
            in_table = false;
            continue;
        };
        let first = row.split('|').next().unwrap_or("").trim();
        if !in_table {
            in_table = first == "key";
            continue;
        }
        if first.starts_with("---") || first.starts_with(":-") {
            continue;
        }
        let key = first
            .strip_prefix('`')
            .and_then(|k| k.strip_suffix('`'))
            .filter(|k| {
                !k.is_empty()
                    && k.split('.').all(|part| {
                        part == "*"
                            || (!part.is_empty()
                                && part.bytes().all(|b| {
                                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'
                                }))
                    })
            });
        match key {
            Some(key) => {
                if !keys.insert(key.to_owned()) {
                    problems.push(format!("line {}: `{key}` is documented twice", n + 1));
                }
            }
            None => problems.push(format!(
                "line {}: the first cell of a key table's row must be one dotted key in backticks, found {first:?}",
                n + 1
            )),
        }
    }
    if problems.is_empty() {
        Ok(keys)
    } else {
        Err(problems)
    }
}

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md");

#[test]
fn docs_config_md_names_exactly_the_accepted_keys() {
    let md = std::fs::read_to_string(DOC).unwrap_or_else(|e| panic!("{DOC}: {e}"));
    let documented = documented_keys(&md).unwrap_or_else(|p| panic!("{DOC}:\n{}", p.join("\n")));
    let accepted = accepted_keys();
    let undocumented: Vec<&String> = accepted.difference(&documented).collect();
    let unknown: Vec<&String> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "{DOC} is out of step with the config:\n  accepted but not documented: {undocumented:?}\n  documented but not accepted: {unknown:?}"
    );
}

#[test]
fn accepted_keys_are_walked_into_every_table() {
    let keys = accepted_keys();
    // One key from each table EVERY_TABLE opens, and the shape of names.
    for key in [
        "server.listen",
        "server.tls.cert",
        "routes.name",
        "routes.lease.ttl",
        "routes.budget.over_cap",
        "routes.budget.tenants.*.max_deadline",
        "routes.budget.callers.*.meters",
        "routes.budget.accounts.window",
    ] {
        assert!(keys.contains(key), "{key} missing from {keys:?}");
    }
    // Tables of keys are not keys themselves.
    for table in [
        "server",
        "server.tls",
        "routes",
        "routes.lease",
        "routes.budget",
    ] {
        assert!(!keys.contains(table), "{table} listed as a key");
    }
}

#[test]
fn documented_keys_read_key_tables_only() {
    let md = "\
intro | not a table

| key | type | default | meaning |
| --- | --- | --- | --- |
| `a.b` | string | none | x |
| `a.*.c` | | | |

| metric | meaning |
| --- | --- |
| `not_a_key` | x |

| key | meaning |
|---|---|
| `d` | y |
";
    let want: BTreeSet<String> = ["a.b", "a.*.c", "d"].map(String::from).into();
    assert_eq!(documented_keys(md), Ok(want));

    let bad = "| key |\n| --- |\n| `a`, `b` |\n| `c` |\n| `c` |\n";
    let problems = documented_keys(bad).unwrap_err();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("line 3:"), "{problems:?}");
    assert!(
        problems[1].contains("`c` is documented twice"),
        "{problems:?}"
    );
}
