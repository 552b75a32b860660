//! Lease arithmetic: a child lives only while its parent renews.
//!
//! Mirrors the a2a-rust SDK's lease extension (ADR 0020): a grant names a
//! time to live; each renewal moves the deadline to `now + ttl`; a lease is
//! lapsed once `now > deadline`. Times are Unix milliseconds.
//!
//! The gateway starts three kinds of lease (`track::LeaseStart`): a
//! caller's grant, a lease the route imposes on streams, and a route's poll
//! lease on the task of a non-blocking send. They share this arithmetic,
//! the store and the reaper; a lapsed poll lease is probed before its
//! cancel ([`at_lapse`]).

use crate::TaskState;

/// `https://a2a-rust.com/extensions/lease/v1`.
pub const LEASE_EXTENSION_URI: &str = "https://a2a-rust.com/extensions/lease/v1";
/// The metadata key of a grant: `{"ttlMs": N}`.
pub const LEASE_METADATA_KEY: &str = "a2a-rust.com/lease";
/// The SDK's `MIN_LEASE_TTL`.
pub const MIN_LEASE_TTL_MS: u64 = 1_000;
/// The SDK's `DEFAULT_MAX_LEASE_TTL`.
pub const DEFAULT_MAX_LEASE_TTL_MS: u64 = 3_600_000;

/// Why a grant is refused (JSON-RPC `-32602` InvalidParams).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseRefusal {
    /// The TTL is outside `[MIN_LEASE_TTL_MS, max]`.
    OutOfBounds { ttl_ms: u64, max_ms: u64 },
    /// The grant is not `{"ttlMs": <non-negative integer>}`.
    Malformed(String),
}

impl std::fmt::Display for LeaseRefusal {
    /// The SDK's own wording, so callers see the same error either way.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseRefusal::OutOfBounds { ttl_ms, max_ms } => write!(
                f,
                "a lease must be between {MIN_LEASE_TTL_MS} ms and {max_ms} ms; this one is {ttl_ms} ms"
            ),
            LeaseRefusal::Malformed(why) => write!(f, "malformed lease: {why}"),
        }
    }
}

/// Checks a grant's TTL against the bounds.
pub fn validate_ttl(ttl_ms: u64, max_ms: u64) -> Result<u64, LeaseRefusal> {
    if (MIN_LEASE_TTL_MS..=max_ms).contains(&ttl_ms) {
        Ok(ttl_ms)
    } else {
        Err(LeaseRefusal::OutOfBounds { ttl_ms, max_ms })
    }
}

/// The deadline a (re)start or renewal at `now_ms` sets.
pub fn deadline(now_ms: u64, ttl_ms: u64) -> u64 {
    now_ms.saturating_add(ttl_ms)
}

/// Lapsed: strictly past the deadline (the SDK's `now_ms > deadline_ms`).
pub fn is_lapsed(now_ms: u64, deadline_ms: u64) -> bool {
    now_ms > deadline_ms
}

/// How often a holder renews: every third of the TTL, as the SDK's
/// `Renewal` does, so two renewals may fail before the lease lapses.
pub fn renew_every_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 3).max(1)
}

/// The holder a poll lease is stored with (`lease_holder`): no replica
/// renews it, its caller's polls do. Not a replica id (those have no
/// spaces), so a lapse can tell a poll lease from the others.
pub const POLL_HOLDER: &str = "caller polls";

/// What a replica that claimed a lapsed lease does with its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtLapse {
    /// The store knows the task settled: end the lease, send nothing.
    End,
    /// A poll lease: the gateway sees a polled task's states only in the
    /// answers it does not read, so the task may have finished, or handed
    /// back (input-required), between polls. Ask the worker (`GetTask`)
    /// first, then [`cancel_after_probe`].
    Probe,
    /// Send `CancelTask`.
    Cancel,
}

/// Decides what a lapsed lease calls for, from the task's stored state and
/// the lease's holder.
pub fn at_lapse(state: Option<TaskState>, holder: Option<&str>) -> AtLapse {
    if state.is_some_and(TaskState::is_settled) {
        AtLapse::End
    } else if holder == Some(POLL_HOLDER) {
        AtLapse::Probe
    } else {
        AtLapse::Cancel
    }
}

/// After [`AtLapse::Probe`]: whether the task is cancelled. `found`: the
/// worker knows the task (or could not be asked); `state`: what it said,
/// `None` when it could not be asked. A settled task (terminal, or
/// input-required, auth-required) is never cancelled, nor one the worker
/// does not know; one whose state could not be learnt is, as a lapse
/// without a probe would be.
pub fn cancel_after_probe(found: bool, state: Option<TaskState>) -> bool {
    found && !state.is_some_and(TaskState::is_settled)
}

/// The outcome of a renewal, decided in one atomic step by the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The deadline moved to this.
    Renewed { deadline_ms: u64 },
    /// The task has no live lease (none was granted, or it settled).
    NoLease,
    /// Too late: the lease lapsed before this renewal; the reaper owns it.
    Lapsed,
}

/// Decides a renewal of a lease with `deadline_ms` and `ttl_ms` at `now_ms`.
pub fn renew(now_ms: u64, lease: Option<(u64, u64)>) -> Renewal {
    match lease {
        None => Renewal::NoLease,
        Some((deadline_ms, _)) if is_lapsed(now_ms, deadline_ms) => Renewal::Lapsed,
        Some((_, ttl_ms)) => Renewal::Renewed {
            deadline_ms: deadline(now_ms, ttl_ms),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_table() {
        let max = DEFAULT_MAX_LEASE_TTL_MS;
        let table = [
            (0, false),
            (500, false),
            (999, false),
            (1_000, true),
            (2_000, true),
            (3_600_000, true),
            (3_600_001, false),
            (u64::MAX, false),
        ];
        for (ttl, ok) in table {
            assert_eq!(validate_ttl(ttl, max).is_ok(), ok, "{ttl}");
        }
        assert_eq!(
            validate_ttl(2_000, 1_500),
            Err(LeaseRefusal::OutOfBounds {
                ttl_ms: 2_000,
                max_ms: 1_500
            })
        );
        assert_eq!(
            LeaseRefusal::OutOfBounds {
                ttl_ms: 500,
                max_ms: max
            }
            .to_string(),
            "a lease must be between 1000 ms and 3600000 ms; this one is 500 ms"
        );
        assert_eq!(
            LeaseRefusal::Malformed("x".into()).to_string(),
            "malformed lease: x"
        );
    }

    #[test]
    fn renewal_table() {
        let table = [
            (1_000, None, Renewal::NoLease),
            (
                1_000,
                Some((2_000, 500)),
                Renewal::Renewed { deadline_ms: 1_500 },
            ),
            (
                2_000,
                Some((2_000, 500)),
                Renewal::Renewed { deadline_ms: 2_500 },
            ),
            (2_001, Some((2_000, 500)), Renewal::Lapsed),
        ];
        for (now, lease, want) in table {
            assert_eq!(renew(now, lease), want, "{now} {lease:?}");
        }
    }

    #[test]
    fn lapse_table() {
        use TaskState::*;
        let poll = Some(POLL_HOLDER);
        #[rustfmt::skip]
        let table = [
            (Some(Completed), poll, AtLapse::End),
            (Some(InputRequired), None, AtLapse::End),
            (Some(Canceled), Some("replica-1"), AtLapse::End),
            (Some(Working), poll, AtLapse::Probe),
            (None, poll, AtLapse::Probe),
            (Some(Working), None, AtLapse::Cancel),
            (Some(Submitted), Some("replica-1"), AtLapse::Cancel),
            (None, Some("caller"), AtLapse::Cancel),
        ];
        for (state, holder, want) in table {
            assert_eq!(at_lapse(state, holder), want, "{state:?} {holder:?}");
        }
        assert!(!POLL_HOLDER.is_empty() && POLL_HOLDER.contains(' '));
    }

    #[test]
    fn after_probe_table() {
        use TaskState::*;
        #[rustfmt::skip]
        let table = [
            (true, Some(Working), true),
            (true, Some(Submitted), true),
            // The probe failed: cancelled, as a lapse is.
            (true, None, true),
            (true, Some(Completed), false),
            (true, Some(Failed), false),
            (true, Some(Canceled), false),
            (true, Some(Rejected), false),
            (true, Some(InputRequired), false),
            (true, Some(AuthRequired), false),
            // The worker does not know it: nothing to cancel.
            (false, None, false),
        ];
        for (found, state, want) in table {
            assert_eq!(cancel_after_probe(found, state), want, "{found} {state:?}");
        }
    }

    #[test]
    fn arithmetic() {
        assert_eq!(deadline(10, 5), 15);
        assert_eq!(deadline(u64::MAX, 5), u64::MAX);
        assert!(!is_lapsed(15, 15));
        assert!(is_lapsed(16, 15));
        assert_eq!(renew_every_ms(2_000), 666);
        assert_eq!(renew_every_ms(1), 1);
    }
}
