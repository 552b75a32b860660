//! The spellings of durations (`"1h30m"`) and sizes (`"64KiB"`) in config files.

use std::time::Duration;

/// Reads a duration written with units: `"250ms"`, `"5s"`, `"2m"`, `"1h"`,
/// `"1h30m"`, `"0s"`.
///
/// Units are `ms`, `s`, `m` and `h`; parts add up. A number without a unit
/// is refused (is `"5"` five seconds or five milliseconds?), and so are
/// fractions and negative values. Used for every duration in the file; also
/// handy for command-line flags that take durations.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration; write e.g. \"5s\" or \"250ms\"".into());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "duration {s:?} needs a unit (ms, s, m or h), e.g. \"{t}s\""
        ));
    }
    if t.starts_with('-') {
        return Err(format!("duration {s:?} is negative"));
    }
    let too_large = || format!("duration {s:?} is too large");
    let mut rest = t;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "invalid duration {s:?}: expected a number at {rest:?}; write e.g. \"1h30m\""
            ));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| too_large())?;
        rest = &rest[digits..];
        if rest.starts_with('.') {
            return Err(format!(
                "invalid duration {s:?}: fractions are not supported; use a smaller unit, e.g. \"1500ms\""
            ));
        }
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        let part = match unit {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3600).map(Duration::from_secs),
            "" => {
                return Err(format!(
                    "invalid duration {s:?}: a number needs a unit (ms, s, m or h)"
                ))
            }
            _ => {
                return Err(format!(
                    "invalid duration {s:?}: unknown unit {unit:?}; use ms, s, m or h"
                ))
            }
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or_else(too_large)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// Binary and decimal multipliers, matched case-insensitively.
const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
];

/// Reads a size in bytes: `"512B"`, `"64KiB"`, `"1MiB"`, `"2GiB"` (binary),
/// `"1KB"`, `"1MB"` (decimal), or plain digits (bytes).
///
/// Units are case-insensitive and may be separated from the number by
/// spaces; fractions are refused. Used for the body and event limits.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(format!(
            "invalid size {s:?}: expected a number with an optional unit, e.g. \"64KiB\" or \"1MiB\""
        ));
    }
    let n: u64 = t[..digits]
        .parse()
        .map_err(|_| format!("size {s:?} is too large"))?;
    let rest = &t[digits..];
    if rest.starts_with('.') {
        return Err(format!(
            "invalid size {s:?}: fractions are not supported; use a smaller unit, e.g. \"1536KiB\""
        ));
    }
    let unit = rest.trim_start().to_ascii_lowercase();
    let Some(&(_, mult)) = SIZE_UNITS.iter().find(|(u, _)| *u == unit) else {
        return Err(format!(
            "invalid size {s:?}: unknown unit {:?}; use B, KiB, MiB, GiB, KB, MB or GB",
            rest.trim_start()
        ));
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Writes a byte count the way a user would: `"64MiB"` when exact, else `"1000B"`.
pub(crate) fn format_size(n: u64) -> String {
    for (unit, mult) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= mult && n.is_multiple_of(mult) {
            return format!("{}{unit}", n / mult);
        }
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const S: Duration = Duration::from_secs(1);

    #[test]
    fn durations() {
        let ok: &[(&str, Duration)] = &[
            ("0s", Duration::ZERO),
            ("0ms", Duration::ZERO),
            ("250ms", 250 * MS),
            ("5s", 5 * S),
            ("2m", 120 * S),
            ("1h", 3600 * S),
            ("1h30m", 5400 * S),
            ("1m30s500ms", 90 * S + 500 * MS),
            (" 5s ", 5 * S),
            ("0h0m1s", S),
        ];
        for (s, want) in ok {
            assert_eq!(parse_duration(s), Ok(*want), "{s:?}");
        }
        let bad: &[(&str, &str)] = &[
            ("", "empty duration"),
            ("   ", "empty duration"),
            ("5", "needs a unit"),
            ("5 s", "needs a unit"),
            ("1.5s", "fractions"),
            ("-5s", "negative"),
            ("5x", "unknown unit \"x\""),
            ("5sec", "unknown unit \"sec\""),
            ("5us", "unknown unit \"us\""),
            ("1h30", "needs a unit"),
            ("s", "expected a number"),
            ("1h 30m", "expected a number"),
            ("99999999999999999999s", "too large"),
            ("9999999999999999999h", "too large"),
        ];
        for (s, want) in bad {
            let err = parse_duration(s).expect_err(s);
            assert!(err.contains(want), "{s:?}: {err}");
        }
    }

    #[test]
    fn sizes() {
        let ok: &[(&str, u64)] = &[
            ("0", 0),
            ("512", 512),
            ("512B", 512),
            ("512b", 512),
            ("64KiB", 64 << 10),
            ("1MiB", 1 << 20),
            ("1mib", 1 << 20),
            ("1 MiB", 1 << 20),
            ("2GiB", 2 << 30),
            ("1TiB", 1 << 40),
            ("1KB", 1_000),
            ("1kb", 1_000),
            ("1MB", 1_000_000),
            ("3GB", 3_000_000_000),
        ];
        for (s, want) in ok {
            assert_eq!(parse_size(s), Ok(*want), "{s:?}");
        }
        let bad: &[(&str, &str)] = &[
            ("", "expected a number"),
            ("MiB", "expected a number"),
            ("1.5MiB", "fractions"),
            ("-1", "expected a number"),
            ("1XB", "unknown unit \"XB\""),
            ("1 M", "unknown unit \"M\""),
            ("99999999999999999999", "too large"),
            ("99999999999TiB", "too large"),
        ];
        for (s, want) in bad {
            let err = parse_size(s).expect_err(s);
            assert!(err.contains(want), "{s:?}: {err}");
        }
    }

    #[test]
    fn size_formatting() {
        for (n, want) in [
            (0, "0B"),
            (512, "512B"),
            (1024, "1KiB"),
            (1536, "1536B"),
            (64 << 20, "64MiB"),
            (2 << 30, "2GiB"),
        ] {
            assert_eq!(format_size(n), want);
        }
    }
}
