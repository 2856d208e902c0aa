//! TTL indexes: the monitor thread and its passes, deleting expired documents in bounded
//! batches.

use super::*;

/// The TTL monitor thread's controls. The thread holds the store only weakly (and strongly
/// only during a pass), so dropping the last `Store` stops it.
pub(crate) struct TtlMonitor {
    /// Cleared on a replica-set member that is not primary: its deletions arrive through
    /// the oplog, as the primary's TTL monitor made them.
    pub(crate) enabled: AtomicBool,
    pub(crate) stop: Mutex<bool>,
    pub(crate) wake: Condvar,
    pub(crate) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Expired documents deleted per write batch (the collection lock is released between).
pub(crate) const TTL_DELETE_BATCH_DOCS: usize = 1000;

impl Store {
    /// Start the TTL monitor: every `interval` (MongoDB: 60 s) delete expired documents of
    /// every collection with a TTL index. Idempotent; stops when the last Store clone drops.
    pub fn start_ttl_monitor(&self, interval: std::time::Duration) {
        let mut thread = self.inner.ttl.thread.lock();
        if thread.is_some() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let monitor = self.inner.ttl.clone();
        let spawned = std::thread::Builder::new().name("ttl-monitor".to_string()).spawn(move || loop {
            {
                let mut stop = monitor.stop.lock();
                if !*stop {
                    monitor.wake.wait_for(&mut stop, interval);
                }
                if *stop {
                    return;
                }
            }
            let Some(inner) = weak.upgrade() else { return };
            let store = Store { inner, ctx: WriteCtx::default() };
            if !monitor.enabled.load(Ordering::SeqCst) {
                continue;
            }
            if let Err(e) = store.run_ttl_pass() {
                tracing::warn!("TTL monitor pass failed: {}", e.message);
            }
        });
        match spawned {
            Ok(h) => *thread = Some(h),
            Err(e) => tracing::error!("cannot start the TTL monitor thread: {e}"),
        }
    }

    /// Whether the TTL monitor deletes (a replica-set member deletes only while primary).
    pub fn set_ttl_deletes_enabled(&self, enabled: bool) {
        self.inner.ttl.enabled.store(enabled, Ordering::SeqCst);
    }

    /// One TTL pass (what the monitor runs every interval): in every non-capped collection,
    /// delete the documents whose TTL-indexed date (an array's earliest) is older than now
    /// minus expireAfterSeconds. Returns the number deleted.
    pub fn run_ttl_pass(&self) -> Result<u64> {
        let now_ms = bson::DateTime::now().timestamp_millis();
        let colls: Vec<Arc<CollState>> = self.inner.colls.read().values().cloned().collect();
        let mut deleted = 0u64;
        let mut first_error = None;
        for coll in colls {
            let meta = coll.meta.read().clone();
            if matches!(meta.options.get("capped"), Some(Bson::Boolean(true))) {
                continue;
            }
            for idx in meta.ready_indexes() {
                let Some(secs) = idx.spec.expire_after_seconds else { continue };
                if idx.fields.len() != 1 || idx.fields[0].hashed || secs < 0 {
                    continue;
                }
                let expiry_ms = now_ms.saturating_sub(secs.saturating_mul(1000));
                // One failing collection does not stop the others.
                match coll.ttl_delete_expired(idx, expiry_ms) {
                    Ok(n) => deleted += n,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        self.inner.shared.ttl_passes.fetch_add(1, Ordering::Relaxed);
        match first_error {
            Some(e) => Err(e),
            None => Ok(deleted),
        }
    }

    /// Documents the TTL monitor has deleted since open.
    pub fn ttl_deleted_count(&self) -> u64 {
        self.inner.shared.ttl_deleted.load(Ordering::Relaxed)
    }

    /// Completed TTL passes since open.
    pub fn ttl_passes(&self) -> u64 {
        self.inner.shared.ttl_passes.load(Ordering::Relaxed)
    }
}
