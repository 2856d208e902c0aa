//! What a member needs of the process it runs in, and nothing more: its store, its
//! coordinator, where it keeps files, how it fetches, its counters, and one hook for writes
//! to users and settings that arrive by replication.

use crate::ReplCoord;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use storage::Store;

/// How a secondary gets the oplog from its sync source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogTransport {
    /// mongod's oplog fetcher: a getMore per batch, each asking for the next.
    Pull,
    /// The source streams batches as they are logged, against credits the member returns
    /// with its acknowledgements on the same connection, and the member applies them on a
    /// thread of its own while it writes the next.
    Push,
    /// Push, with the batches in a ring of shared memory when the source is on this host
    /// (`shm::LogRing`); push over TCP otherwise.
    Shm,
}

impl LogTransport {
    pub fn parse(s: &str) -> common::Result<LogTransport> {
        match s {
            "pull" => Ok(LogTransport::Pull),
            "push" => Ok(LogTransport::Push),
            "shm" => Ok(LogTransport::Shm),
            other => Err(common::Error::bad_value(format!("replication.logTransport must be pull, push or shm, not '{other}'"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LogTransport::Pull => "pull",
            LogTransport::Push => "push",
            LogTransport::Shm => "shm",
        }
    }
}

/// The process a member runs in.
pub trait Host: Send + Sync + 'static {
    fn store(&self) -> &Store;
    /// The coordinator; None when this process is not a replica-set member.
    fn coord(&self) -> Option<&ReplCoord>;
    fn counters(&self) -> &Counters;
    fn log_transport(&self) -> LogTransport;
    /// The data directory (rollback files go under it).
    fn dbpath(&self) -> &Path;
    /// Whether `on_replicated_writes` needs to hear of anything: when it does not, applied
    /// batches are not scanned for it.
    fn watches_replicated_writes(&self) -> bool;
    /// Applied entries wrote to the admin database (users, roles) or to config.settings:
    /// the host takes them up (connections read their user again, the audit filter reloads).
    fn on_replicated_writes(&self, admin: bool, settings: bool);
}

/// What a member's replication counts, reported under serverStatus metrics.repl. Relaxed
/// atomics: statistics, not synchronization.
#[derive(Default)]
pub struct Counters {
    /// A secondary's oplog application (metrics.repl.apply): batches, their total time
    /// (applying and logging, not the journal sync), and entries.
    pub apply_batches: AtomicU64,
    pub apply_us: AtomicU64,
    pub apply_ops: AtomicU64,
    /// The fetcher's getMores to its sync source and their total time, waits included
    /// (metrics.repl.network.getmores).
    pub getmores: AtomicU64,
    pub getmore_us: AtomicU64,
    /// The asks of the primary's position that strict reads shared (metrics.repl.readWaits).
    pub strict_asks: AtomicU64,
    /// Oplog bytes and entries a secondary fetched (metrics.repl.network.bytes, ops).
    pub fetched_bytes: AtomicU64,
    pub fetched_ops: AtomicU64,
    /// Batches a push stream brought (metrics.repl.network.streamBatches), and those of them
    /// that came through a shared-memory ring (ringBatches).
    pub stream_batches: AtomicU64,
    pub ring_batches: AtomicU64,
    /// Replication lag as the source sees it (metrics.repl.lag): each time a member reports
    /// new entries durable, how long ago the oldest of them was logged here.
    pub lag: common::metrics::LatencyHistogram,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}
