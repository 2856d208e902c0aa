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
}

impl Shared {
    pub fn new(config: ServerConfig, store: Store, repl: Option<crate::repl::ReplCoord>) -> Shared {
        let host_name = crate::sysinfo::hostname();
        let writes = Arc::new(tokio::sync::Notify::new());
        let w = writes.clone();
        store.set_write_listener(Box::new(move || w.notify_waiters()));
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
