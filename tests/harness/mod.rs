//! Small helpers that start real peers on free loopback ports and talk to them.
//!
//! # Timing bounds: one factor
//!
//! Every timing bound in the tests (how long a test waits for something to
//! happen before it calls it a failure) is derived from one factor,
//! [`time_factor`], read once from `A2AGW_TEST_TIME_FACTOR` (default `1`,
//! a decimal number, at least 1). It scales:
//!
//! * deadlines a test asserts ("canceled within 1 s": [`scaled_ms`],
//!   [`scaled_secs`], [`scaled`]), including the `within` of every poll
//!   (`wait_state`, `SseStream::next`, `ParentProcess::wait_outcome`, …);
//! * polling loops that retry a fixed number of times ([`scaled_count`]);
//! * waits that give something time to happen, or to fail to happen, before
//!   the test looks ("sleep 700 ms, then the task must still be running");
//! * the harness's own start-up and read timeouts (a peer answering, a
//!   response within 30 s).
//!
//! It does not scale what is part of a scenario itself: a lease TTL, a
//! `disconnect_grace` or `id_wait` configured in the gateway, how long a
//! worker works (`work:30000`), when a caller leaves or a parent runs before
//! it is killed. Where an expectation follows from such a parameter, the
//! bound is the parameter plus a scaled margin (`ttl + scaled_ms(1500)`).
//! A bound is never shortened to make a test pass; at factor 1 every bound
//! is what the test states.
//!
//! Raise it when the machine is slower than a developer's laptop: a shared
//! or throttled CI runner, a debug build under `valgrind` or a sanitizer, a
//! full suite run on two cores beside other work. `A2AGW_TEST_TIME_FACTOR=3
//! scripts/test` gives every bound three times its room. A test that fails
//! at factor 1 but passes at 3 is a slow machine or a bound too tight for
//! it; a test that fails at any factor is a bug.

#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::Duration;

pub mod gateway;
pub mod grpc;
pub mod h2c;
pub mod http;
pub mod jwt;
pub mod otlp;
pub mod parent;
pub mod python_worker;
pub mod redis;
pub mod relay;
pub mod replicas;
pub mod rust_worker;
pub mod stream;
pub mod tls;
pub mod worker;
pub mod ws;

/// The environment variable that sets [`time_factor`].
pub const TIME_FACTOR_ENV: &str = "A2AGW_TEST_TIME_FACTOR";

/// The factor every timing bound is multiplied by (see the module doc):
/// `$A2AGW_TEST_TIME_FACTOR`, or 1. Read once; panics on a value that is
/// not a finite number of at least 1 (bounds are only ever raised).
pub fn time_factor() -> f64 {
    static FACTOR: OnceLock<f64> = OnceLock::new();
    *FACTOR.get_or_init(|| match std::env::var(TIME_FACTOR_ENV) {
        Err(std::env::VarError::NotPresent) => 1.0,
        Err(e) => panic!("{TIME_FACTOR_ENV}: {e}"),
        Ok(s) => parse_time_factor(&s).unwrap_or_else(|e| panic!("{TIME_FACTOR_ENV}={s:?}: {e}")),
    })
}

/// A factor as `$A2AGW_TEST_TIME_FACTOR` spells it.
fn parse_time_factor(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("not a number ({e})"))?;
    if !f.is_finite() || f < 1.0 {
        return Err("must be a finite number of at least 1 (bounds are only raised)".into());
    }
    Ok(f)
}

/// A timing bound `d` scaled by [`time_factor`]; exactly `d` at factor 1.
pub fn scaled(d: Duration) -> Duration {
    let f = time_factor();
    if f == 1.0 {
        d
    } else {
        d.mul_f64(f)
    }
}

/// [`scaled`] `n` milliseconds.
pub fn scaled_ms(n: u64) -> Duration {
    scaled(Duration::from_millis(n))
}

/// [`scaled`] `n` seconds.
pub fn scaled_secs(n: u64) -> Duration {
    scaled(Duration::from_secs(n))
}

/// How many times a polling loop with a fixed pause tries: `n` scaled by
/// [`time_factor`] (rounded up), so that the loop's bound (`n` × its pause)
/// scales with the others; exactly `n` at factor 1.
pub fn scaled_count(n: u32) -> u32 {
    let f = time_factor();
    if f == 1.0 {
        n
    } else {
        (f64::from(n) * f).ceil() as u32
    }
}

/// How many file descriptors process `pid` holds open (`/proc/PID/fd`).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
        .count()
}

/// Process `pid`'s resident set size in KiB (`VmRSS` in `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// Declares one `#[tokio::test]` (multi-threaded, two workers) per line,
/// `name => future;`, each awaiting its future: a scenario run over each
/// worker and binding.
///
/// ```ignore
/// use crate::harness::scenarios;
/// scenarios! {
///     rust_jsonrpc_detach => detach(Kind::Rust, Bind::JsonRpc);
/// }
/// ```
#[allow(unused_macros)]
macro_rules! scenarios {
    ($($name:ident => $body:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $body.await
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use scenarios;

#[cfg(test)]
mod time_factor_tests {
    use super::parse_time_factor;

    #[test]
    fn factors_below_one_or_not_numbers_are_refused() {
        assert_eq!(parse_time_factor("1"), Ok(1.0));
        assert_eq!(parse_time_factor(" 2.5 "), Ok(2.5));
        for bad in ["0.5", "0", "-1", "nan", "inf", "", "fast"] {
            assert!(parse_time_factor(bad).is_err(), "{bad:?} accepted");
        }
    }
}
