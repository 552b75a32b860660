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
//! connection does not move the estimate. A local clock step shows within
//! that many heartbeats.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

/// One reading of the server's clock: local Unix µs when the request left
/// and when its answer came, and the server's Unix µs in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub sent_us: u64,
    pub answered_us: u64,
    pub server_us: u64,
}

impl Sample {
    /// Server minus local, at the midpoint of the round trip.
    fn offset_us(&self) -> i64 {
        let mid = (self.sent_us + self.answered_us) / 2;
        self.server_us as i64 - mid as i64
    }

    fn round_trip_us(&self) -> u64 {
        self.answered_us.saturating_sub(self.sent_us)
    }
}

/// A replica's estimate of how far the store's clock is from its own.
#[derive(Debug, Default)]
pub struct StoreClock {
    /// Store minus local, ms; 0 until the first sample.
    offset_ms: AtomicI64,
    recent: Mutex<VecDeque<Sample>>,
}

impl StoreClock {
    /// How many recent samples the estimate is chosen from.
    pub const SAMPLES: usize = 8;

    /// Takes a sample in; returns the estimate (store minus local, ms) after it.
    pub fn record(&self, s: Sample) -> i64 {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == Self::SAMPLES {
            recent.pop_front();
        }
        recent.push_back(s);
        let best = recent
            .iter()
            .min_by_key(|s| s.round_trip_us())
            .map_or(0, Sample::offset_us);
        let ms = best.div_euclid(1000);
        self.offset_ms.store(ms, Ordering::Relaxed);
        ms
    }

    /// Store minus local, ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// The store's time now, Unix ms, by the local clock and the estimate.
    pub fn now_ms(&self) -> u64 {
        super::now_ms().saturating_add_signed(self.offset_ms())
    }
}

/// Unix time in microseconds, by the local clock.
pub fn local_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sent_us: u64, rtt_us: u64, server_us: u64) -> Sample {
        Sample {
            sent_us,
            answered_us: sent_us + rtt_us,
            server_us,
        }
    }

    #[test]
    fn offset_is_taken_at_the_midpoint_of_the_round_trip() {
        let cases: &[(Sample, i64)] = &[
            // Server 30 s ahead, answered in 1 ms.
            (sample(1_000_000, 1_000, 31_000_500), 30_000),
            // Server 30 s behind.
            (sample(40_000_000, 1_000, 10_000_500), -30_000),
            // In step: the server read its clock mid-way.
            (sample(5_000_000, 2_000, 5_001_000), 0),
            // Less than a millisecond behind rounds down, not to zero.
            (sample(5_000_000, 0, 4_999_600), -1),
        ];
        for (s, want) in cases {
            let c = StoreClock::default();
            assert_eq!(c.record(*s), *want, "{s:?}");
            assert_eq!(c.offset_ms(), *want);
        }
    }

    #[test]
    fn the_shortest_round_trip_of_the_recent_samples_wins() {
        let c = StoreClock::default();
        assert_eq!(c.offset_ms(), 0, "no sample: the local clock");
        assert_eq!(c.record(sample(0, 200, 10_000_100)), 10_000);
        // Slower answers (queued behind other commands) do not move it.
        assert_eq!(c.record(sample(1_000_000, 400_000, 11_400_000)), 10_000);
        // A faster one does.
        assert_eq!(c.record(sample(2_000_000, 100, 12_000_050)), 10_000);
        assert_eq!(c.record(sample(3_000_000, 50, 3_000_025)), 0);
        // Once the best sample is SAMPLES old, the best of the rest wins:
        // a local clock step shows within SAMPLES heartbeats.
        for i in 0..StoreClock::SAMPLES as u64 {
            let sent = 6_000_000_000 + i;
            c.record(sample(sent, 1_000, sent + 500 - 5_000_000_000));
        }
        assert_eq!(c.offset_ms(), -5_000_000);
    }

    #[test]
    fn now_follows_the_estimate() {
        let c = StoreClock::default();
        let local = crate::store::now_ms();
        c.record(sample(local_us(), 0, local_us() + 60_000_000));
        let now = c.now_ms();
        assert!(
            (local + 59_000..local + 62_000).contains(&now),
            "{now} vs {local}"
        );
    }
}
