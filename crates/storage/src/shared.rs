//! The state every collection of a store shares: the engine, group commit (one fsync for
//! every writer waiting), the oplog's state, index builds in progress, id allocation, and
//! the deletion of dropped data.

use super::*;

pub(crate) struct CommitState {
    /// Highest applied-write sequence known durable.
    pub(crate) synced_seq: u64,
    pub(crate) syncing: bool,
}

pub(crate) struct Shared {
    pub(crate) engine: Arc<dyn Engine>,
    /// Count of write batches applied so far (their order of completion).
    pub(crate) applied_seq: AtomicU64,
    /// Called after `write_seq` moves (`Store::set_write_listener`), for readers that wait
    /// for new data (awaitData).
    pub(crate) write_listener: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    pub(crate) commit: Mutex<CommitState>,
    pub(crate) commit_done: Condvar,
    pub(crate) sync_count: AtomicU64,
    /// Time spent in those syncs.
    pub(crate) sync_us: AtomicU64,
    pub(crate) next_internal_id: AtomicU64,
    pub(crate) total_data_bytes: AtomicU64,
    /// Index builds in progress.
    pub(crate) builds: Mutex<Vec<Arc<BuildState>>>,
    pub(crate) ttl_deleted: AtomicU64,
    pub(crate) ttl_passes: AtomicU64,
    /// The oplog of a replica-set member; `None` on a standalone.
    pub(crate) oplog: RwLock<Option<Arc<Oplog>>>,
    /// The record and index keys open transactions have written, with their owner
    /// (`txn.rs`); `txn_keys_owned` is its size, so ordinary writes check it only when a
    /// transaction owns something.
    pub(crate) txn_owners: Mutex<HashMap<Vec<u8>, u64>>,
    pub(crate) txn_keys_owned: std::sync::atomic::AtomicUsize,
    /// Notified when a transaction frees its keys.
    pub(crate) txn_ended: Condvar,
    pub(crate) next_txn_id: AtomicU64,
    /// What reads at a past point in time need (`history.rs`).
    pub(crate) history: Mutex<History>,
    /// Entries logged from now on are stamped after this timestamp: a snapshot read at a
    /// point beyond the newest entry read today's state as that point's
    /// (`Store::snapshot_now_at`), which holds only if no later entry is stamped at or
    /// before it.
    pub(crate) clock_floor: AtomicU64,
    /// Prepared transactions (`prepared.rs`); `has_prepared` says whether any is undecided,
    /// so reads at a point in time look only then.
    pub(crate) prepared: Mutex<crate::prepared::Prepared>,
    pub(crate) has_prepared: AtomicBool,
    /// Notified when a prepared transaction is decided.
    pub(crate) prepared_changed: Condvar,
}

/// `local.oplog.rs` and the position of its newest entry.
pub(crate) struct Oplog {
    pub(crate) coll: Arc<CollState>,
    /// Oldest entries are deleted once the entries take more than this.
    pub(crate) cap_bytes: u64,
    pub(crate) state: Mutex<OplogState>,
}

pub(crate) struct OplogState {
    /// The newest entry written.
    pub(crate) last: OpTime,
    /// The newest entry known durable (every entry up to it was synced).
    pub(crate) durable: OpTime,
    /// The term new entries are stamped with.
    pub(crate) term: i64,
    /// The newest entries as written, oldest first: every entry after `recent_floor` is
    /// here. A secondary's fetcher tails the oplog a few entries behind its newest; reading
    /// those back through the engine (a snapshot and an LSM seek per getMore) was an eighth of
    /// a primary's CPU with two secondaries, and grows with each member that fetches from it.
    pub(crate) recent: std::collections::VecDeque<(u64, Arc<[u8]>)>,
    pub(crate) recent_floor: u64,
    pub(crate) recent_bytes: usize,
    /// When each recent batch was logged here: its first entry's timestamp and the time,
    /// oldest first. What a member's replication lag is measured with (`Store::oplog_lag`).
    pub(crate) logged_at: std::collections::VecDeque<(u64, std::time::Instant)>,
    /// Entries after this one are written but perhaps not applied: a secondary writes a
    /// fetched batch to its oplog, makes it durable (which acknowledges it) and applies it
    /// after (`Store::write_oplog_replicated`, `Store::apply_written`). `None` when the data
    /// holds every entry. Persisted (`CATALOG_APPLIED_THROUGH`) in the batches that move it,
    /// so a restart finds what is left to apply.
    pub(crate) applied_through: Option<OpTime>,
}

impl OplogState {
    pub(crate) fn new(last: OpTime) -> OplogState {
        OplogState {
            last,
            durable: last,
            term: last.term.max(0),
            recent: Default::default(),
            recent_floor: last.ts,
            recent_bytes: 0,
            logged_at: Default::default(),
            applied_through: None,
        }
    }

    /// Keep a new entry (the newest) in `recent`, dropping the oldest past the bound.
    pub(crate) fn remember(&mut self, ts: u64, entry: &[u8]) {
        debug_assert!(self.recent.back().is_none_or(|(t, _)| *t < ts) && ts > self.recent_floor);
        self.recent_bytes += entry.len() + OPLOG_RECENT_ENTRY_OVERHEAD_BYTES;
        self.recent.push_back((ts, Arc::from(entry)));
        while self.recent_bytes > OPLOG_RECENT_BYTES_MAX {
            let Some((t, e)) = self.recent.pop_front() else { break };
            self.recent_bytes -= e.len() + OPLOG_RECENT_ENTRY_OVERHEAD_BYTES;
            self.recent_floor = t;
        }
    }

    /// A batch whose first entry is `first_ts` was logged now.
    pub(crate) fn mark_logged(&mut self, first_ts: u64) {
        if self.logged_at.len() >= OPLOG_LOGGED_MARKS_MAX {
            self.logged_at.pop_front();
        }
        self.logged_at.push_back((first_ts, std::time::Instant::now()));
    }

    /// Entries after `after` are gone (a rollback's truncation).
    pub(crate) fn forget_after(&mut self, after: u64) {
        while self.logged_at.back().is_some_and(|(t, _)| *t > after) {
            self.logged_at.pop_back();
        }
        while self.recent.back().is_some_and(|(t, _)| *t > after) {
            if let Some((_, e)) = self.recent.pop_back() {
                self.recent_bytes -= e.len() + OPLOG_RECENT_ENTRY_OVERHEAD_BYTES;
            }
        }
        self.recent_floor = self.recent_floor.min(after);
    }
}

/// Progress and outcome of one index build, shared by the builder and concurrent writers.
pub(crate) struct BuildState {
    pub(crate) coll: std::sync::Weak<CollState>,
    pub(crate) index_name: String,
    pub(crate) done_records: AtomicU64,
    pub(crate) total_records: AtomicU64,
    /// First unique-key conflict met by a concurrent writer; fails the build.
    pub(crate) conflict: Mutex<Option<Error>>,
}

impl Shared {
    pub(crate) fn write_seq(&self) -> u64 {
        self.applied_seq.load(Ordering::SeqCst)
    }

    /// Tell the write listener that `write_seq` moved (or that the oplog's durable point did).
    pub(crate) fn notify_write_seq(&self) {
        if let Some(f) = self.write_listener.get() {
            f();
        }
    }

    pub(crate) fn apply(&self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.engine.write(batch)?;
        self.applied_seq.fetch_add(1, Ordering::SeqCst);
        self.notify_write_seq();
        Ok(())
    }

    /// Apply `batch` with the oplog `entries` that describe it: under the oplog lock, stamp
    /// each entry with the next optime and add it to the same engine batch, so entries reach
    /// the engine (and become visible) in timestamp order.
    pub(crate) fn apply_logged(&self, batch: Batch, entries: Vec<Vec<u8>>) -> Result<()> {
        self.apply_logged_with(batch, entries, None).map(|_| ())
    }

    /// `apply_logged`, for a retryable write when `session` is given: every entry is stamped
    /// with its transaction's previous entry (`prevOpTime`, the first with `session.prev`),
    /// and the session record at `session.record_op` in `batch` with the newest. Returns the
    /// newest entry's optime.
    pub(crate) fn apply_logged_with(&self, mut batch: Batch, entries: Vec<Vec<u8>>, session: Option<SessionStamp>) -> Result<Option<OpTime>> {
        if entries.is_empty() {
            return self.apply(batch).map(|_| None);
        }
        let Some(log) = self.oplog.read().clone() else {
            return self.apply(batch).map(|_| None);
        };
        let mut st = log.state.lock();
        let now_secs = (oplog::wall_now_ms() / 1000).clamp(0, u32::MAX as i64) as u32;
        let mut stats = log.coll.stats.lock().clone();
        let mut last = st.last;
        last.ts = last.ts.max(self.clock_floor.load(Ordering::Acquire));
        let mut added_bytes = 0u64;
        let mut prev = session.as_ref().map(|s| s.prev);
        st.mark_logged(oplog::next_ts(last.ts, now_secs));
        for mut e in entries {
            last = OpTime { ts: oplog::next_ts(last.ts, now_secs), term: st.term };
            oplog::stamp(&mut e, last);
            if let Some(p) = prev.as_mut() {
                oplog::stamp_prev(&mut e, *p);
                *p = last;
            }
            stats.count += 1;
            added_bytes += e.len() as u64;
            // Readers of `recent` hold the oplog lock, so they see these only once applied.
            st.remember(last.ts, &e);
            batch.put(Space::Records, record_key(log.coll.id, last.ts), e);
        }
        stats.data_bytes += added_bytes;
        batch.put(Space::Catalog, stats_key(log.coll.id), stats.to_bytes());
        if let Some(SessionStamp { record_op, .. }) = session {
            match batch.ops.get_mut(record_op) {
                Some(BatchOp::Put(Space::Records, _, record)) => oplog::stamp_session_record(record, last),
                _ => {
                    let newest = st.last.ts;
                    st.forget_after(newest);
                    return Err(Error::internal("a retryable write's batch lost its session record"));
                }
            }
        }
        if let Err(e) = self.apply(batch) {
            let newest = st.last.ts;
            st.forget_after(newest);
            return Err(e);
        }
        st.last = last;
        self.note_applied(last.ts);
        self.after_oplog_append(&log, stats, added_bytes, None);
        Ok(Some(last))
    }

    /// After a batch of oplog entries is applied (the caller holds the oplog lock): publish
    /// the collection's new stats, and truncate the oldest entries once over the cap.
    /// `applied_through`: entries after it are not applied yet, and capping keeps them.
    pub(crate) fn after_oplog_append(&self, log: &Oplog, stats: Stats, added_bytes: u64, applied_through: Option<OpTime>) {
        self.total_data_bytes.fetch_add(added_bytes, Ordering::Relaxed);
        let over_cap = stats.data_bytes > log.cap_bytes;
        *log.coll.stats.lock() = stats;
        if over_cap {
            // The write itself succeeded; a failed truncation is retried after the next one.
            if let Err(e) = self.truncate_oplog(log, applied_through) {
                tracing::warn!("oplog truncation failed: {}", e.message);
            }
        }
    }

    /// Delete the oldest oplog entries until they take at most 90% of the cap (at most
    /// OPLOG_TRUNCATE_ENTRIES_MAX per call), never one after `applied_through` (written, not
    /// yet applied: a restart applies it from here). The caller holds the oplog lock.
    pub(crate) fn truncate_oplog(&self, log: &Oplog, applied_through: Option<OpTime>) -> Result<()> {
        let mut stats = log.coll.stats.lock().clone();
        let target = log.cap_bytes / 10 * 9;
        let snap = self.engine.snapshot();
        let (lo, hi) = prefix_bounds(&log.coll.id.to_be_bytes());
        let mut batch = Batch::new();
        let mut removed = 0u64;
        for kv in snap.iter(Space::Records, lo, hi, false) {
            if stats.data_bytes <= target || batch.len() >= OPLOG_TRUNCATE_ENTRIES_MAX {
                break;
            }
            let (k, v) = kv?;
            let ts = read_u64(k.get(8..).unwrap_or(&[])).ok_or_else(|| corrupt("oplog key"))?;
            if applied_through.is_some_and(|a| ts > a.ts) {
                break;
            }
            stats.data_bytes = stats.data_bytes.saturating_sub(v.len() as u64);
            stats.count = stats.count.saturating_sub(1);
            removed += v.len() as u64;
            batch.delete(Space::Records, k);
        }
        if batch.is_empty() {
            return Ok(());
        }
        batch.put(Space::Catalog, stats_key(log.coll.id), stats.to_bytes());
        self.apply(batch)?;
        log.coll.removals.fetch_add(1, Ordering::SeqCst);
        *log.coll.stats.lock() = stats;
        let _ = self.total_data_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(removed)));
        Ok(())
    }

    /// Group commit: one caller (the leader) syncs on behalf of everyone whose writes were
    /// applied before the sync started; the others wait for that sync.
    pub(crate) fn commit_durable(&self) -> Result<()> {
        let target = self.applied_seq.load(Ordering::SeqCst);
        let mut st = self.commit.lock();
        loop {
            if st.synced_seq >= target {
                return Ok(());
            }
            if st.syncing {
                self.commit_done.wait(&mut st);
                continue;
            }
            st.syncing = true;
            // The oplog position and the batch count together, under the oplog lock (which
            // every logged batch holds while it is applied): entries up to `log_at` are
            // exactly those in batches counted by `covers`, so the sync makes them durable.
            let log = self.oplog.read().clone();
            let (log_at, covers) = match &log {
                Some(l) => {
                    let g = l.state.lock();
                    (Some(g.last), self.applied_seq.load(Ordering::SeqCst))
                }
                None => (None, self.applied_seq.load(Ordering::SeqCst)),
            };
            drop(st);
            let started = std::time::Instant::now();
            let r = self.engine.sync();
            self.sync_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            self.sync_count.fetch_add(1, Ordering::Relaxed);
            if let (true, Some(l), Some(at)) = (r.is_ok(), &log, log_at) {
                let moved = {
                    let mut ls = l.state.lock();
                    let moved = at > ls.durable;
                    ls.durable = ls.durable.max(at);
                    moved
                };
                // Where a set has one data-bearing member, durability is what commits an
                // entry: its change streams wait on the listener for this too.
                if moved {
                    self.notify_write_seq();
                }
            }
            st = self.commit.lock();
            st.syncing = false;
            if r.is_ok() {
                st.synced_seq = st.synced_seq.max(covers);
            }
            self.commit_done.notify_all();
            r?;
        }
    }

    /// Remove the build of `idx` from the builds in progress (idempotent).
    pub(crate) fn unregister_build(&self, idx: &IndexRt) {
        self.builds.lock().retain(|b| !idx.build.as_ref().is_some_and(|mine| Arc::ptr_eq(b, mine)));
    }

    pub(crate) fn alloc_id(&self) -> u64 {
        self.next_internal_id.fetch_add(1, Ordering::SeqCst)
    }

    /// Delete the data of a dropped collection or index, then its garbage marker.
    pub(crate) fn collect_garbage(&self, kind: u8, id: u64) -> Result<()> {
        let space = if kind == GARBAGE_COLLECTION { Space::Records } else { Space::Index };
        let snap = self.engine.snapshot();
        let (lo, hi) = prefix_bounds(&id.to_be_bytes());
        let mut batch = Batch::new();
        for kv in snap.iter(space, lo, hi, false) {
            let (k, _) = kv?;
            batch.delete(space, k);
            if batch.len() >= GARBAGE_CHUNK_KEYS {
                self.apply(std::mem::take(&mut batch))?;
            }
        }
        if kind == GARBAGE_COLLECTION {
            batch.delete(Space::Catalog, stats_key(id));
        }
        batch.delete(Space::Catalog, garbage_key(kind, id));
        self.apply(batch)
    }
}
