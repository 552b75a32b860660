//! The `A2A-Extensions` header: a comma-separated list of URIs, possibly over
//! several header lines.

/// The header's name, parsed once: looking a header up by a `&str` parses
/// the name again on every request.
pub static A2A_EXTENSIONS: http::HeaderName = http::HeaderName::from_static("a2a-extensions");

/// The URIs a header's lines name, in order, trimmed, empties dropped.
pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    lines
        .into_iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// `existing` plus each of `inject` not already there (URIs compare
/// case-insensitively), joined with `", "` as a2a-rust servers join them.
/// Returns the merged value and the URIs actually added.
pub fn merge<'a>(existing: &[&str], inject: &'a [String]) -> (String, Vec<&'a str>) {
    let mut all: Vec<&str> = Vec::with_capacity(existing.len() + inject.len());
    for uri in existing {
        if !all.iter().any(|u| u.eq_ignore_ascii_case(uri)) {
            all.push(uri);
        }
    }
    let mut added = Vec::new();
    for uri in inject {
        if !all.iter().any(|u| u.eq_ignore_ascii_case(uri)) {
            all.push(uri);
            added.push(uri.as_str());
        }
    }
    (all.join(", "), added)
}

/// Whether the list names `uri`.
pub fn names(list: &[&str], uri: &str) -> bool {
    list.iter().any(|u| u.eq_ignore_ascii_case(uri))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: &str = "https://a2a-rust.com/extensions/lease/v1";
    const BUDGET: &str = "https://a2a-rust.com/extensions/budget/v1";

    #[test]
    fn parse_table() {
        let table: Vec<(Vec<&str>, Vec<&str>)> = vec![
            (vec![], vec![]),
            (vec![""], vec![]),
            (vec![LEASE], vec![LEASE]),
            (vec!["a, b", "c"], vec!["a", "b", "c"]),
            (vec![" a ,,b "], vec!["a", "b"]),
        ];
        for (lines, want) in table {
            assert_eq!(parse(lines.clone()), want, "{lines:?}");
        }
    }

    #[test]
    fn merge_table() {
        let inject = vec![LEASE.to_string(), BUDGET.to_string()];
        let table: Vec<(Vec<&str>, &str, Vec<&str>)> = vec![
            (vec![], "https://a2a-rust.com/extensions/lease/v1, https://a2a-rust.com/extensions/budget/v1", vec![LEASE, BUDGET]),
            (vec![LEASE], "https://a2a-rust.com/extensions/lease/v1, https://a2a-rust.com/extensions/budget/v1", vec![BUDGET]),
            (vec!["HTTPS://A2A-RUST.COM/EXTENSIONS/LEASE/V1"], "HTTPS://A2A-RUST.COM/EXTENSIONS/LEASE/V1, https://a2a-rust.com/extensions/budget/v1", vec![BUDGET]),
            (vec!["x", "x", BUDGET], "x, https://a2a-rust.com/extensions/budget/v1, https://a2a-rust.com/extensions/lease/v1", vec![LEASE]),
        ];
        for (existing, want, added) in table {
            assert_eq!(
                merge(&existing, &inject),
                (want.to_string(), added),
                "{existing:?}"
            );
        }
        assert_eq!(merge(&["a"], &[]), ("a".to_string(), vec![]));
        assert!(names(&["x", LEASE], LEASE));
        assert!(!names(&["x"], LEASE));
    }
}
