//! A collection handle: inserts, stats and validation, and snapshots of it.

use super::*;

#[derive(Clone)]
pub struct Collection {
    pub(crate) state: Arc<CollState>,
    /// How writes through this handle are logged (its store handle's).
    pub(crate) ctx: WriteCtx,
}

impl Collection {
    /// This collection, written through `store`'s handle (its `WriteCtx`).
    pub fn through(&self, store: &Store) -> Collection {
        Collection { state: self.state.clone(), ctx: store.ctx.clone() }
    }

    pub fn meta(&self) -> CollectionMeta {
        self.state.meta_public()
    }

    /// True once the collection was dropped (or renamed over): its handle sees no new data.
    pub fn is_dropped(&self) -> bool {
        self.state.dropped.load(Ordering::SeqCst)
    }

    /// Up to `max_docs` records after `after` (from the first when None), as stored, for a
    /// tailing reader. On the live oplog it takes the newest entries from memory
    /// (`OplogState::recent`) when they are all there, under the oplog lock, which every
    /// logged batch holds until it is applied: a batch's entries are read all or none.
    /// Entries from memory are not copied: they are shared (`RawRecord::Shared`).
    pub fn tail_chunk(&self, after: Option<RecordId>, max_docs: usize) -> Result<Vec<(RecordId, RawRecord)>> {
        let scan = |snap: Snapshot| -> Result<Vec<(RecordId, RawRecord)>> {
            Ok(snap.scan_raw(after, max_docs)?.into_iter().map(|(rid, b)| (rid, RawRecord::Owned(b))).collect())
        };
        let log = self.state.shared.oplog.read().clone();
        let Some(log) = log.filter(|l| l.coll.id == self.state.id) else {
            return scan(self.state.snapshot(&self.ctx));
        };
        let snap = {
            let st = log.state.lock();
            if let Some(after) = after.filter(|a| *a >= st.recent_floor) {
                let start = st.recent.partition_point(|(ts, _)| *ts <= after);
                return Ok(st.recent.range(start..).take(max_docs).map(|(ts, e)| (*ts, RawRecord::Shared(e.clone()))).collect());
            }
            self.state.snapshot(&self.ctx)
        };
        scan(snap)
    }

    /// Whether the oplog's in-memory tail holds every entry after `after`, from one at or
    /// before `after + 1` on (so `tail_chunk` from it reads no engine, and no truncation has
    /// reached it). False for other collections.
    pub fn tail_holds(&self, after: RecordId) -> bool {
        let log = self.state.shared.oplog.read().clone();
        log.filter(|l| l.coll.id == self.state.id).is_some_and(|l| {
            let st = l.state.lock();
            after >= st.recent_floor && st.recent.front().is_some_and(|(first, _)| *first <= after.saturating_add(1))
        })
    }

    /// A counter that moves once records of the collection were deleted. Read before taking
    /// a snapshot: if it has not moved since a position was read, the snapshot still holds
    /// that position's record.
    pub fn removals(&self) -> u64 {
        self.state.removals.load(Ordering::SeqCst)
    }

    /// A counter that moves before each rollback truncation of the oplog
    /// (`Store::truncate_oplog_after`). A reader that tails from a position must stop when
    /// it moved: its position's timestamp may now hold another branch's entry, and what
    /// follows is not what followed the entry it read. Read before the snapshot and again
    /// after the read, a batch between two equal reads saw no truncation.
    pub fn truncations(&self) -> u64 {
        self.state.truncations.load(Ordering::SeqCst)
    }

    /// Whether the collection was created capped (the oplog is).
    pub fn is_capped(&self) -> bool {
        matches!(self.state.meta.read().options.get("capped"), Some(Bson::Boolean(true)))
    }

    /// Names of the indexes that have indexed an expanded array (multikey).
    pub fn multikey_indexes(&self) -> Vec<String> {
        let mk = self.state.stats.lock().multikey.clone();
        self.state.meta.read().ready_indexes().filter(|i| mk.contains(&i.id)).map(|i| i.spec.name.clone()).collect()
    }

    /// Insert a batch as one atomic engine batch (documents must already have `_id`).
    /// Checks unique indexes against stored data and within the batch; `ordered` stops at
    /// the first failure (documents before it are inserted). Does not sync.
    ///
    /// A batch that meets a document an open transaction wrote waits, without the lock,
    /// until that transaction ends, and is prepared again (as mongod's writes wait).
    pub fn insert_many(&self, docs: &[Document], ordered: bool) -> InsertOutcome {
        loop {
            let outcome = self.insert_many_once(docs, ordered);
            let conflict = outcome.errors.iter().any(|(_, e)| e.code == Code::WriteConflict.0);
            if !conflict || self.ctx.in_transaction() {
                return outcome;
            }
            let mut owners = self.state.shared.txn_owners.lock();
            if !owners.is_empty() {
                self.state.shared.txn_ended.wait_for(&mut owners, std::time::Duration::from_millis(100));
            }
        }
    }

    fn insert_many_once(&self, docs: &[Document], ordered: bool) -> InsertOutcome {
        let st = &self.state;
        let _guard = WriteGuard::acquire(st);
        if let Err(e) = st.check_live() {
            return InsertOutcome { inserted: 0, errors: (0..docs.len()).map(|i| (i, e.clone())).collect() };
        }
        let meta = st.meta.read().clone();
        let snap = st.engine_view(&self.ctx);
        let mut pending = st.pending(&self.ctx);
        // A record and (usually) one entry per index for each document, plus the statistics.
        pending.batch.ops.reserve(docs.len() * (1 + meta.indexes.len()) + 1);
        let mut ok = Vec::with_capacity(docs.len());
        let mut errors = Vec::new();
        for (i, d) in docs.iter().enumerate() {
            self.ctx.select_document_statement(i);
            match st.prepare_insert(&meta, &*snap, d, &mut pending) {
                Ok(_) => ok.push(i),
                Err(e) => {
                    errors.push((i, e));
                    if ordered {
                        break;
                    }
                }
            }
        }
        if ok.is_empty() {
            return InsertOutcome { inserted: 0, errors };
        }
        if let Err(e) = st.commit_pending(pending) {
            errors.extend(ok.iter().map(|i| (*i, e.clone())));
            errors.sort_by_key(|(i, _)| *i);
            return InsertOutcome { inserted: 0, errors };
        }
        InsertOutcome { inserted: ok.len(), errors }
    }

    /// A consistent point-in-time view (owned, Send, may outlive this handle).
    pub fn snapshot(&self) -> Snapshot {
        self.state.snapshot(&self.ctx)
    }

    /// Exclusive writer; holds the collection write lock until dropped.
    pub fn writer(&self) -> Writer {
        Writer { guard: WriteGuard::acquire(&self.state), ctx: self.ctx.clone() }
    }

    pub fn stats(&self) -> CollStats {
        let st = &self.state;
        let stats = st.stats.lock().clone();
        let meta = st.meta.read().clone();
        let total = st.shared.total_data_bytes.load(Ordering::Relaxed);
        let records_space = st.shared.engine.space_size_bytes(Space::Records);
        // The records keyspace is shared: attribute its size by share of logical bytes.
        let storage = if total == 0 { 0 } else { (records_space as u128 * stats.data_bytes as u128 / total as u128) as u64 };
        CollStats {
            count: stats.count,
            size_bytes: stats.data_bytes,
            storage_size_bytes: storage,
            index_sizes: meta.ready_indexes().map(|i| (i.spec.name.clone(), stats.index_bytes.get(&i.id).copied().unwrap_or(0))).collect(),
        }
    }

    /// Recount records; check every record has exactly its index entries and every index
    /// entry belongs to a record with that key.
    pub fn validate(&self) -> ValidateReport {
        let snapshot = self.snapshot();
        let mut report = ValidateReport { valid: true, ..ValidateReport::default() };
        if let Err(e) = snapshot.validate_into(&mut report) {
            report.valid = false;
            report.errors.push(e.message);
        }
        report
    }
}
