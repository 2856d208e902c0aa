//! Metrics every role keeps: a latency histogram whose snapshots subtract.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of durations in logarithmic buckets, four per doubling: bucket 0 holds 0 µs,
/// bucket `i` > 0 durations below 2^(i/4) µs (and at least the previous bound); the last
/// bucket holds everything longer. Monotonic, so a reader computes the percentiles of an
/// interval from the difference of two snapshots.
pub struct LatencyHistogram {
    counts: [AtomicU64; LATENCY_BUCKETS],
    total_us: AtomicU64,
    max_us: AtomicU64,
}

pub const LATENCY_BUCKETS: usize = 128;

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { counts: std::array::from_fn(|_| AtomicU64::new(0)), total_us: AtomicU64::new(0), max_us: AtomicU64::new(0) }
    }
}

impl LatencyHistogram {
    /// The bucket of `us`: the first whose upper bound 2^(i/4) exceeds it.
    pub fn bucket(us: u64) -> usize {
        if us == 0 {
            return 0;
        }
        // log2(us) in quarters: the integer part from the leading bit, the quarter from
        // the next two bits' mantissa against 2^(1/4), 2^(2/4), 2^(3/4).
        let log2 = 63 - us.leading_zeros() as usize;
        let frac = us as f64 / (1u64 << log2) as f64;
        let quarter = [1.189_207_115, std::f64::consts::SQRT_2, 1.681_792_830].iter().filter(|&&b| frac >= b).count();
        (log2 * 4 + quarter + 1).min(LATENCY_BUCKETS - 1)
    }

    /// Upper bound of bucket `i` in µs (the last one's is the largest sample).
    pub fn upper_us(i: usize) -> f64 {
        if i == 0 {
            0.0
        } else {
            2f64.powf(i as f64 / 4.0)
        }
    }

    pub fn record(&self, us: u64) {
        self.counts[Self::bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.total_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// `{samples, totalMicros, maxMicros, p50Micros, p99Micros, counts}` (percentiles as
    /// bucket upper bounds).
    pub fn to_doc(&self) -> bson::Document {
        let counts: Vec<i64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed) as i64).collect();
        let samples: i64 = counts.iter().sum();
        let pct = |p: f64| -> f64 {
            let want = (samples as f64 * p).ceil() as i64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want.max(1) {
                    return Self::upper_us(i);
                }
            }
            0.0
        };
        bson::doc! {
            "samples": samples, "totalMicros": self.total_us.load(Ordering::Relaxed) as i64, "maxMicros": self.max_us.load(Ordering::Relaxed) as i64,
            "p50Micros": pct(0.5), "p99Micros": pct(0.99), "counts": counts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_quarter_doublings() {
        assert_eq!(LatencyHistogram::bucket(0), 0);
        assert_eq!(LatencyHistogram::bucket(1), 1);
        for us in [1u64, 2, 3, 7, 100, 999, 1000, 1001, 2000, 123_456, 10_000_000] {
            let b = LatencyHistogram::bucket(us);
            assert!((us as f64) < LatencyHistogram::upper_us(b) * 1.000_001 + 1e-9 || b == LATENCY_BUCKETS - 1, "{us} in bucket {b}");
            assert!(us as f64 >= LatencyHistogram::upper_us(b - 1) * 0.999_999, "{us} in bucket {b}: below its lower bound");
        }
        let h = LatencyHistogram::default();
        for us in 1..=100 {
            h.record(us * 10);
        }
        let d = h.to_doc();
        assert_eq!(d.get_i64("samples").unwrap(), 100);
        assert_eq!(d.get_i64("maxMicros").unwrap(), 1000);
        let p99 = d.get_f64("p99Micros").unwrap();
        assert!((990.0..=1200.0).contains(&p99), "{p99}");
        assert!(LatencyHistogram::bucket(u64::MAX) == LATENCY_BUCKETS - 1);
    }
}
