//! Process-wide server state shared by every connection.

use crate::config::ServerConfig;
use crate::cursor::CursorManager;
use crate::ops::OpRegistry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    /// Reads that had to find this member applied up to a point first (readConcern
    /// afterClusterTime, or level "strict") and their total wait (those that waited)
    /// (metrics.repl.readWaits).
    pub repl_read_waits: AtomicU64,
    pub repl_read_wait_us: AtomicU64,
    /// Strict reads that read the primary's position page instead of asking.
    pub repl_strict_page_reads: AtomicU64,
    /// What a member's replication counts (metrics.repl).
    pub repl: replication::Counters,
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
    /// Change events made once for every stream of a kind.
    pub change_feed: crate::change_stream::Feed,
    /// The logical sessions commands named (`$listLocalSessions`).
    pub sessions: access::sessions::SessionCache,
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
    pub repl: Option<replication::ReplCoord>,
    /// Replies of retryable writes, by session.
    pub retry: crate::retry::RetryTable,
    /// Sessions' multi-document transactions.
    pub txns: crate::txn::TransactionTable,
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
        repl: Option<replication::ReplCoord>,
        tls: net::tls::Acceptor,
        audit: Option<crate::audit::Audit>,
    ) -> Shared {
        let host_name = net::process::hostname();
        let writes = Arc::new(tokio::sync::Notify::new());
        let w = writes.clone();
        store.set_write_listener(Box::new(move || w.notify_waiters()));
        let auth = crate::auth::AuthState { enabled: config.authorization, ..Default::default() };
        let txn_lifetime = Duration::from_secs(config.transaction_lifetime_secs);
        Shared {
            cursors: CursorManager::new(config.cursor_timeout_ms),
            change_feed: crate::change_stream::Feed::default(),
            sessions: Default::default(),
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
            txns: crate::txn::TransactionTable::new(txn_lifetime),
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

/// A replica-set member reaches this process through `replication::Host` only.
impl replication::Host for Shared {
    fn store(&self) -> &Store {
        &self.store
    }

    fn coord(&self) -> Option<&replication::ReplCoord> {
        self.repl.as_ref()
    }

    fn counters(&self) -> &replication::Counters {
        &self.counters.repl
    }

    fn log_transport(&self) -> replication::LogTransport {
        self.config.log_transport
    }

    fn dbpath(&self) -> &std::path::Path {
        &self.config.dbpath
    }

    fn watches_replicated_writes(&self) -> bool {
        self.auth.enabled || self.audit.is_some()
    }

    fn on_replicated_writes(&self, admin: bool, settings: bool) {
        // A replicated change to users (admin.system.users, or the admin database itself)
        // reaches connections already logged in here too (`auth::AuthState::generation`),
        // and setAuditConfig's runtime configuration (config.settings) is taken here too.
        if self.auth.enabled && admin {
            self.auth.users_changed();
        }
        if self.audit.is_some() && settings {
            if let Err(e) = crate::audit::load_stored(self) {
                tracing::warn!("cannot take the replicated audit configuration: {}", e.message);
            }
        }
    }
}
