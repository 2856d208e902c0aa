//! Process-wide server state shared by every connection.

use crate::config::ServerConfig;
use crate::cursor::CursorManager;
use crate::ops::OpRegistry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use storage::Store;

/// Counters reported by serverStatus. Relaxed atomics: they are statistics, not synchronization.
#[derive(Default)]
pub struct Counters {
    pub insert: AtomicU64,
    pub query: AtomicU64,
    pub update: AtomicU64,
    pub delete: AtomicU64,
    pub getmore: AtomicU64,
    pub command: AtomicU64,
    pub connections_current: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_active: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub requests: AtomicU64,
    pub connections_rejected: AtomicU64,
    /// Write-concern waits for other members (serverStatus metrics.getLastError): how many,
    /// their total time, and how many timed out.
    pub wc_waits: AtomicU64,
    pub wc_wait_us: AtomicU64,
    pub wc_timeouts: AtomicU64,
    /// A secondary's oplog application (metrics.repl.apply): batches, their total time
    /// (applying and logging, not the journal sync), and entries.
    pub repl_apply_batches: AtomicU64,
    pub repl_apply_us: AtomicU64,
    pub repl_apply_ops: AtomicU64,
    /// The fetcher's getMores to its sync source and their total time, waits included
    /// (metrics.repl.network.getmores).
    pub repl_getmores: AtomicU64,
    pub repl_getmore_us: AtomicU64,
    /// Reads that had to find this member applied up to a point first (readConcern
    /// afterClusterTime, or level "strict"), their total wait (those that waited), and the
    /// asks of the primary's position that strict reads shared (metrics.repl.readWaits).
    pub repl_read_waits: AtomicU64,
    pub repl_read_wait_us: AtomicU64,
    pub repl_strict_asks: AtomicU64,
    /// Strict reads that read the primary's position page instead of asking.
    pub repl_strict_page_reads: AtomicU64,
    /// Oplog bytes and entries a secondary fetched (metrics.repl.network.bytes, ops).
    pub repl_fetched_bytes: AtomicU64,
    pub repl_fetched_ops: AtomicU64,
    /// Batches a push stream brought (metrics.repl.network.streamBatches), and those of them
    /// that came through a shared-memory ring (ringBatches).
    pub repl_stream_batches: AtomicU64,
    pub repl_ring_batches: AtomicU64,
    /// Replication lag as the source sees it (metrics.repl.lag): each time a member reports
    /// new entries durable, how long ago the oldest of them was logged here.
    pub repl_lag: LatencyHistogram,
}

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

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

pub struct Shared {
    pub config: ServerConfig,
    pub store: Store,
    pub cursors: CursorManager,
    pub ops: OpRegistry,
    pub counters: Counters,
    pub started: Instant,
    /// topologyVersion.processId: changes on every restart so SDAM monitors notice.
    pub process_id: bson::oid::ObjectId,
    pub next_connection_id: AtomicU64,
    pub host_name: String,
    /// Signalled by the `shutdown` command; `serve` then flushes and returns.
    pub shutdown: tokio::sync::Notify,
    /// Set when running with `--replSet`.
    pub repl: Option<crate::repl::ReplCoord>,
    /// Replies of retryable writes, by session.
    pub retry: crate::retry::RetryTable,
    /// Notified after every write the store applies (`Store::set_write_listener`): awaitData
    /// getMores wait on it on the async worker, not in a blocked thread.
    pub writes: Arc<tokio::sync::Notify>,
    /// Users and whether commands need them (`security.authorization`).
    pub auth: crate::auth::AuthState,
    /// How client connections are accepted: plain, TLS, or either (`net.tls.mode`).
    pub tls: net::tls::Acceptor,
    /// The audit log, when `auditLog.destination` is set.
    pub audit: Option<crate::audit::Audit>,
    /// This member's part in a sharded cluster, if a router told it one.
    pub sharding: crate::sharding::ShardingState,
}

impl Shared {
    pub fn new(
        config: ServerConfig,
        store: Store,
        repl: Option<crate::repl::ReplCoord>,
        tls: net::tls::Acceptor,
        audit: Option<crate::audit::Audit>,
    ) -> Shared {
        let host_name = crate::sysinfo::hostname();
        let writes = Arc::new(tokio::sync::Notify::new());
        let w = writes.clone();
        store.set_write_listener(Box::new(move || w.notify_waiters()));
        let auth = crate::auth::AuthState { enabled: config.authorization, ..Default::default() };
        Shared {
            cursors: CursorManager::new(config.cursor_timeout_ms),
            config,
            store,
            ops: OpRegistry::default(),
            counters: Counters::default(),
            started: Instant::now(),
            process_id: bson::oid::ObjectId::new(),
            next_connection_id: AtomicU64::new(1),
            host_name,
            shutdown: tokio::sync::Notify::new(),
            repl,
            retry: Default::default(),
            writes,
            auth,
            tls,
            audit,
            sharding: Default::default(),
        }
    }

    /// Queue an audit record, if auditing is on.
    pub fn audit_event(&self, atype: &'static str, actor: &std::sync::Arc<crate::audit::Actor>, param: crate::audit::Param, result: i32) {
        if let Some(a) = &self.audit {
            a.log(atype, actor, param, result);
        }
    }

    /// `{processId, counter}` as hello, serverStatus.repl and not-primary errors report it.
    pub fn topology_version(&self) -> bson::Document {
        bson::doc! {"processId": self.process_id, "counter": self.repl.as_ref().map_or(0, |r| r.topology_counter())}
    }

    pub fn host_port(&self) -> String {
        format!("{}:{}", self.host_name, self.config.port)
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
