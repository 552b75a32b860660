// a2a-gateway patch: this whole file (see patches/README.md, "One idle timer per
// exchange").

//! The upstream read timeout of an HTTP/1 exchange, as one timer.
//!
//! pingora-core's HTTP/1 client applies `read_timeout` to each read: every
//! read that has to wait boxes a new timer, registers it and removes it
//! again when the read completes (with the default bounds over 15 minutes,
//! a tokio timer). A streamed answer pays that for every event that arrives
//! on its own, a blocking call for its wait. The exchange's loop
//! (`proxy_handle_upstream`) keeps one timer instead, pinned in its own
//! frame: each pass of the loop moves a plain deadline, and the timer is
//! only re-armed when it fires before that deadline, so a stream whose
//! worker keeps talking touches it about once per bound, not once per read.
//!
//! What is bounded is nearly the same: the time a read of the worker's
//! answer waits, counted from when the loop last moved (a read completed,
//! or a chunk of the request body went out); a response head that arrives
//! in several reads is bounded as a whole.
//!
//! Tested in the repository's `tests/timeouts.rs` (the timer alone, and the
//! gateway in front of real workers that pause and go quiet).

use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The deadline of the loop's current pass: `bound` from now, or none
/// without a bound.
pub fn deadline(bound: Option<Duration>) -> Option<Instant> {
    bound.map(|t| Instant::now() + t)
}

/// Completes once `deadline` has passed, on the one timer kept in `timer`
/// (armed on the first call). Cancel-safe: dropped when another branch of
/// the loop wins, it leaves the timer armed where it was; the next call
/// moves it only if it fires before the new deadline.
pub async fn passed(mut timer: Pin<&mut Option<Sleep>>, deadline: Instant) {
    if timer.is_none() {
        timer.set(Some(tokio::time::sleep_until(deadline)));
    }
    let Some(mut sleep) = timer.as_mut().as_pin_mut() else {
        return;
    };
    loop {
        sleep.as_mut().await;
        if sleep.deadline() >= deadline {
            return;
        }
        // Fired for an earlier pass's deadline: the loop moved since.
        sleep.as_mut().reset(deadline);
    }
}
