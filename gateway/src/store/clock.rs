//! The store's clock as one replica sees it.
//!
//! Replicas sharing a Redis judge lease deadlines, claim holds and budget
//! windows that other replicas wrote. Judged by each replica's own wall
//! clock, a replica whose clock runs ahead reaps leases another replica just
//! renewed, and one that runs behind cancels a dead replica's children late.
//! So every replica judges by one clock, the Redis server's: each heartbeat
//! also asks the server for its `TIME`, and [`StoreClock`] turns those
//! samples into an offset added to the local clock.
//!
//! A sample's error is at most half its round trip (the server read its
//! clock somewhere between send and answer), so of the last
//! [`StoreClock::SAMPLES`] the one with the shortest round trip wins, as in
//! NTP's clock filter: a sample delayed behind other commands on the shared
//! connection does not move the estimate. Samples are timed by the
//! monotonic clock and the estimate is the server's time minus it, so a
//! step of the local wall clock (NTP) changes nothing. The monotonic clock
//! itself stops while a VM is paused or the host suspended: the first
//! sample after that disagrees with the older ones by more than their round
//! trips explain, and the estimate starts again from it
//! ([`StoreClock::record`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// One reading of the server's clock: this process's monotonic µs (see
/// [`StoreClock::mono_us`]) when the request left and when its answer came,
/// and the server's Unix µs in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub sent_us: u64,
    pub answered_us: u64,
    pub server_us: u64,
}

impl Sample {
    /// Server Unix µs minus monotonic µs, at the midpoint of the round
    /// trip; `None` for a reading no server gives (past i64).
    fn offset_us(&self) -> Option<i64> {
        let mid = i64::try_from(self.sent_us.checked_add(self.answered_us)? / 2).ok()?;
        i64::try_from(self.server_us)
            .ok()?
            .checked_sub(mid)
            .filter(|o| *o != NONE)
    }

    fn round_trip_us(&self) -> u64 {
        self.answered_us.saturating_sub(self.sent_us)
    }
}

/// A replica's estimate of the store's clock.
#[derive(Debug)]
pub struct StoreClock {
    /// Where this process's monotonic µs count from.
    base: Instant,
    /// Server Unix µs minus monotonic µs; [`NONE`] until the first sample.
    offset_us: AtomicI64,
    recent: Mutex<VecDeque<Sample>>,
}

impl Default for StoreClock {
    fn default() -> Self {
        StoreClock {
            base: Instant::now(),
            offset_us: AtomicI64::new(NONE),
            recent: Mutex::new(VecDeque::new()),
        }
    }
}

/// No sample yet: the local wall clock stands in.
const NONE: i64 = i64::MIN;

/// How far a sample may disagree with the estimate, beyond what the two
/// round trips explain, before it counts as a clock step.
const STEP_US: u64 = 20_000;

impl StoreClock {
    /// How many recent samples the estimate is chosen from.
    pub const SAMPLES: usize = 8;

    /// Monotonic µs since this clock was made: what samples are timed by.
    pub fn mono_us(&self) -> u64 {
        self.base.elapsed().as_micros() as u64
    }

    /// Takes a sample in; returns the store's clock minus the local wall
    /// clock after it, in ms (for metrics and logs). A sample that
    /// disagrees with the current estimate by more than both round trips
    /// allow (plus [`STEP_US`]) means a clock stepped (the monotonic clock
    /// stops while a VM is paused or the host suspended): the older
    /// samples are dropped, and the estimate follows at once.
    pub fn record(&self, s: Sample) -> i64 {
        let Some(offset) = s.offset_us() else {
            return self.offset_ms();
        };
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let best = |r: &VecDeque<Sample>| r.iter().min_by_key(|s| s.round_trip_us()).copied();
        if let Some(b) = best(&recent).filter(|b| {
            let room = (b.round_trip_us() + s.round_trip_us()) / 2 + STEP_US;
            b.offset_us().is_none_or(|o| o.abs_diff(offset) > room)
        }) {
            tracing::debug!(from_us = ?b.offset_us(), to_us = offset, "the store clock's estimate stepped");
            recent.clear();
        }
        if recent.len() == Self::SAMPLES {
            recent.pop_front();
        }
        recent.push_back(s);
        if let Some(o) = best(&recent).and_then(|b| b.offset_us()) {
            self.offset_us.store(o, Ordering::Relaxed);
        }
        drop(recent);
        self.offset_ms()
    }

    /// The store's clock minus the local wall clock, ms (0 before any
    /// sample).
    pub fn offset_ms(&self) -> i64 {
        if self.offset_us.load(Ordering::Relaxed) == NONE {
            return 0;
        }
        self.now_ms() as i64 - super::now_ms() as i64
    }

    /// The store's time now, Unix ms: the monotonic clock plus the
    /// estimate, or the local wall clock before the first sample.
    pub fn now_ms(&self) -> u64 {
        match self.offset_us.load(Ordering::Relaxed) {
            NONE => super::now_ms(),
            off => ((self.mono_us() as i64).saturating_add(off).max(0) as u64) / 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wall_us() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }

    /// A sample taken now, answered in `rtt_us`, from a server whose clock
    /// is `ahead_ms` ahead of the local one.
    fn now_sample(c: &StoreClock, ahead_ms: i64, rtt_us: u64) -> Sample {
        let sent_us = c.mono_us();
        Sample {
            sent_us,
            answered_us: sent_us + rtt_us,
            server_us: (wall_us() as i64 + ahead_ms * 1000 + rtt_us as i64 / 2) as u64,
        }
    }

    fn near(got: i64, want: i64) -> bool {
        (got - want).abs() <= 50
    }

    #[test]
    fn offset_is_taken_at_the_midpoint_of_the_round_trip() {
        for ahead in [30_000, -30_000, 0, 5] {
            let c = StoreClock::default();
            assert_eq!(c.offset_ms(), 0, "no sample: the local clock");
            let got = c.record(now_sample(&c, ahead, 1_000));
            assert!(near(got, ahead), "{got} vs {ahead}");
            assert!(near(c.offset_ms(), ahead));
            let now = c.now_ms() as i64;
            assert!(near(now - crate::store::now_ms() as i64, ahead), "{now}");
        }
    }

    #[test]
    fn the_shortest_round_trip_of_the_recent_samples_wins() {
        let c = StoreClock::default();
        let off = |c: &StoreClock| c.offset_us.load(Ordering::Relaxed);
        let at = |sent_us: u64, rtt_us: u64, server_us: u64| Sample {
            sent_us,
            answered_us: sent_us + rtt_us,
            server_us,
        };
        c.record(at(0, 200, 10_000_100));
        assert_eq!(off(&c), 10_000_000);
        // Slower answers (queued behind other commands) do not move it.
        c.record(at(1_000_000, 400_000, 11_400_000));
        assert_eq!(off(&c), 10_000_000);
        // A faster one does.
        c.record(at(3_000_000, 50, 3_000_025));
        assert_eq!(off(&c), 0);
        // Within what the round trips explain, the best of the recent
        // samples wins; once it is SAMPLES old, the best of the rest.
        for i in 0..StoreClock::SAMPLES as u64 {
            let sent = 6_000_000 + i;
            c.record(at(sent, 1_000, sent + 500 + 10_000));
        }
        assert_eq!(off(&c), 10_000);
        // A step (the monotonic clock stood still for 10 s while the VM was
        // paused) is followed at once, though its round trip is longer.
        c.record(at(7_000_000, 3_000, 7_001_500 + 10_000 + 10_000_000));
        assert_eq!(off(&c), 10_010_000);
        // A reading no server gives is ignored.
        c.record(at(8_000_000, 10, u64::MAX));
        assert_eq!(off(&c), 10_010_000);
    }
}
