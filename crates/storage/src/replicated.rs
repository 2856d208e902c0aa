//! The oplog and replicated application: enabling the oplog, what a member has written,
//! applied and made durable, writing and applying fetched entries, truncation after a
//! common point.

use super::*;

/// One document's change in `Store::apply_replicated`.
#[derive(Debug, Clone)]
pub enum ReplicatedChange {
    /// The document with this `_id` becomes `doc` (inserted, or replacing the stored one),
    /// stored as these bytes.
    Put { doc: bson::RawDocumentBuf },
    /// The document with this `_id`, if any, is deleted.
    Delete { id: Bson },
    /// The document with this `_id`, if any, changes by these diffs (`diff::apply`), in
    /// order; a missing document stays missing.
    Patch { id: Bson, diffs: Vec<Document> },
}

impl Store {
    /// Keep an oplog from now on (a replica-set member): create `local.oplog.rs` if it does
    /// not exist, otherwise continue after its newest entry. Every later change outside the
    /// `local` database is logged in the batch that makes it. Idempotent.
    pub fn enable_oplog(&self, cap_bytes: u64) -> Result<()> {
        let shared = &self.inner.shared;
        let _cat = self.inner.catalog.lock();
        if shared.oplog.read().is_some() {
            return Ok(());
        }
        let coll = match self.collection(OPLOG_DB, OPLOG_COLLECTION) {
            Some(c) => c,
            None => self.create_locked(OPLOG_DB, OPLOG_COLLECTION, doc! {"capped": true, "size": cap_bytes as i64}, false, None)?,
        };
        let st = coll.state;
        let snap = shared.engine.snapshot();
        let (lo, hi) = prefix_bounds(&st.id.to_be_bytes());
        let last = match snap.iter(Space::Records, lo, hi, true).next() {
            None => OpTime::default(),
            Some(kv) => {
                let (k, v) = kv?;
                let ts = read_u64(k.get(8..).unwrap_or(&[])).ok_or_else(|| corrupt("oplog key"))?;
                let term = decode_doc(&v)?.get_i64("t").unwrap_or(0);
                OpTime { ts, term }
            }
        };
        // What is in the engine after a restart was synced (or replayed from its journal).
        let mut state = OplogState::new(last);
        state.applied_through = match snap.get(Space::Catalog, &[CATALOG_APPLIED_THROUGH])? {
            Some(v) => Some(decode_optime(&v).ok_or_else(|| corrupt("oplog applied-through point"))?),
            None => None,
        };
        *shared.oplog.write() = Some(Arc::new(Oplog { coll: st, cap_bytes, state: Mutex::new(state) }));
        Ok(())
    }

    /// Log a no-op entry (`msg` its note), stamped after every entry and after the clock
    /// floor (`advance_clock`): a primary's oplog then reaches a cluster time it was told,
    /// for a read that must wait until it has applied that far. Its optime.
    pub fn log_noop(&self, msg: &str) -> Result<OpTime> {
        self.log_note(&bson::doc! {"msg": msg})
    }

    /// `log_noop` with `o` as the entry's object (appendOplogNote's `data`).
    pub fn log_note(&self, o: &bson::Document) -> Result<OpTime> {
        let noop = crate::oplog::noop_entry(o, crate::oplog::wall_now_ms()).map_err(Error::bad_value)?;
        self.inner.shared.apply_logged_with(crate::engine::Batch::new(), vec![noop], None)?.ok_or_else(|| Error::internal("log_note: no oplog"))
    }

    /// Stamp every entry logged from now on after `ts` (a cluster time this member learned:
    /// what a client saw before it asks for a write is then ordered before the write).
    pub fn advance_clock(&self, ts: u64) {
        self.inner.shared.clock_floor.fetch_max(ts, std::sync::atomic::Ordering::AcqRel);
    }

    /// The newest oplog entry's optime (None without an oplog; zero when it is empty).
    pub fn oplog_last(&self) -> Option<OpTime> {
        self.inner.shared.oplog.read().as_ref().map(|l| l.state.lock().last)
    }

    /// The newest entry whose change the data holds: the newest entry, unless a secondary
    /// has written entries it has not applied yet (`write_oplog_replicated`).
    pub fn oplog_applied(&self) -> Option<OpTime> {
        self.inner.shared.oplog.read().as_ref().map(|l| {
            let st = l.state.lock();
            st.applied_through.unwrap_or(st.last)
        })
    }

    /// How far a member whose newest entry is `after` trails this oplog: how many entries
    /// follow it, and how long ago the oldest of them was logged here (zero when none
    /// does). `None` when those entries are no longer all in memory (far behind).
    pub fn oplog_lag(&self, after: OpTime) -> Option<(u64, std::time::Duration)> {
        let log = self.inner.shared.oplog.read().clone()?;
        let st = log.state.lock();
        if after.ts < st.recent_floor {
            return None;
        }
        let start = st.recent.partition_point(|(ts, _)| *ts <= after.ts);
        let Some(&(next, _)) = st.recent.get(start) else { return Some((0, std::time::Duration::ZERO)) };
        let behind = (st.recent.len() - start) as u64;
        // The batch holding that entry: the newest whose first entry is not after it.
        let i = st.logged_at.partition_point(|(first, _)| *first <= next);
        let age = i.checked_sub(1).and_then(|i| st.logged_at.get(i)).map_or(std::time::Duration::ZERO, |(_, at)| at.elapsed());
        Some((behind, age))
    }

    /// The newest oplog entry known durable (what a member reports as its durable optime).
    pub fn oplog_durable(&self) -> Option<OpTime> {
        self.inner.shared.oplog.read().as_ref().map(|l| l.state.lock().durable)
    }

    /// Append entries fetched from another member with their own optimes, in one engine
    /// batch: a secondary's oplog is a copy of its sync source's. The caller has applied
    /// their changes first (through a `Store::replicated` handle, so they logged nothing), so a
    /// crash in between leaves changes whose entries are fetched and applied again, which
    /// oplog application tolerates. Entries must be newer than the newest one, in order.
    pub fn append_oplog_replicated(&self, entries: &[(OpTime, Vec<u8>)]) -> Result<()> {
        self.apply_replicated_marked(&[], entries, Marker::Keep)
    }

    /// Write fetched entries to the oplog (as `append_oplog_replicated`) before their changes
    /// are applied: from here until `apply_written` covers them, `oplog_applied` stays at the
    /// newest entry applied before, and a restart applies the rest first
    /// (`oplog_unapplied`). mongod 8.0's secondaries do the same: a batch is acknowledged
    /// once durable in the oplog, and applied meanwhile.
    pub fn write_oplog_replicated(&self, entries: &[(OpTime, Vec<u8>)]) -> Result<()> {
        self.apply_replicated_marked(&[], entries, Marker::Written)
    }

    /// Apply the changes of entries already written (`write_oplog_replicated`), up to and
    /// including `through`, in one engine write with the moved applied-through point.
    /// `changes` as for `apply_replicated`; empty when the caller applied them itself, entry
    /// by entry (each its own write: a crash in between applies them again, which oplog
    /// application tolerates).
    pub fn apply_written(&self, changes: &[(Collection, Vec<ReplicatedChange>)], through: OpTime) -> Result<()> {
        self.apply_replicated_marked(changes, &[], Marker::Applied(through))
    }

    /// The written entries not yet applied (`write_oplog_replicated`), oldest first, at most
    /// `limit`: what a restart, or a member about to take writes, applies first.
    pub fn oplog_unapplied(&self, limit: usize) -> Result<Vec<(OpTime, Vec<u8>)>> {
        let shared = &self.inner.shared;
        let Some(log) = shared.oplog.read().clone() else { return Ok(Vec::new()) };
        let Some(from) = log.state.lock().applied_through else { return Ok(Vec::new()) };
        let snap = shared.engine.snapshot();
        let lo = std::ops::Bound::Excluded(record_key(log.coll.id, from.ts));
        let (_, hi) = prefix_bounds(&log.coll.id.to_be_bytes());
        let mut out = Vec::new();
        for kv in snap.iter(Space::Records, lo, hi, false).take(limit) {
            let (_, v) = kv?;
            let raw = bson::RawDocument::from_bytes(&v).map_err(|_| corrupt("oplog entry"))?;
            let at = OpTime::from_raw(raw).ok_or_else(|| corrupt("oplog entry without ts and t"))?;
            out.push((at, v.to_vec()));
        }
        Ok(out)
    }

    /// A secondary's batch in one engine write (one journal append): the final state of
    /// each document the fetched `entries` changed, per collection, and the entries
    /// themselves, appended to the oplog with their own optimes (newer than the newest
    /// entry, in order). Each collection appears once and each `_id` at most once in it.
    /// Applying a document's final state instead of every entry is what oplog application
    /// allows (entries are idempotent and the batch ends at the source's state as of its last
    /// entry), and one engine write per batch instead of one per entry takes a lock, a
    /// snapshot and a journal append per batch. Fails, having changed nothing, on a
    /// unique-key conflict among the changes (a key that moved between documents within the
    /// batch): the caller then applies the entries one by one.
    pub fn apply_replicated(&self, changes: &[(Collection, Vec<ReplicatedChange>)], entries: &[(OpTime, Vec<u8>)]) -> Result<()> {
        self.apply_replicated_marked(changes, entries, Marker::Keep)
    }

    pub(crate) fn apply_replicated_marked(&self, changes: &[(Collection, Vec<ReplicatedChange>)], entries: &[(OpTime, Vec<u8>)], marker: Marker) -> Result<()> {
        let shared = &self.inner.shared;
        let Some(log) = shared.oplog.read().clone() else {
            return Err(Error::new(Code::NoReplicationEnabled, "no oplog: not running with --replSet"));
        };
        if changes.is_empty() && entries.is_empty() && matches!(marker, Marker::Keep | Marker::Written) {
            return Ok(());
        }
        // Write locks in collection order (deadlock-free with any writer that holds one),
        // `config.transactions` last: a retryable write locks it after its own collection.
        let mut order: Vec<&(Collection, Vec<ReplicatedChange>)> = changes.iter().collect();
        order.sort_by_key(|(c, _)| (c.state.is_session_records(), c.state.id));
        if order.windows(2).any(|w| w[0].0.state.id == w[1].0.state.id) {
            return Err(Error::internal("apply_replicated: a collection appears twice"));
        }
        let _guards: Vec<WriteGuard> = order.iter().map(|(c, _)| WriteGuard::acquire(&c.state)).collect();
        let snap = shared.engine.snapshot();
        let mut batch = Batch::new();
        let mut published = Vec::with_capacity(order.len());
        for (coll, changes) in order {
            let st = &coll.state;
            st.check_live()?;
            st.check_not_oplog()?;
            let meta = st.meta.read().clone();
            let mut pending = st.pending(&WriteCtx::replicated());
            // Replicated changes are logged as the entries that carry them, below.
            pending.log = None;
            for change in changes {
                st.prepare_replicated(&meta, &*snap, change, &mut pending)?;
            }
            pending.batch.put(Space::Catalog, stats_key(st.id), pending.stats.to_bytes());
            batch.ops.append(&mut pending.batch.ops);
            published.push((st, pending));
        }
        let mut ost = log.state.lock();
        let mut last = ost.last;
        let mut stats = log.coll.stats.lock().clone();
        let mut added_bytes = 0u64;
        if let Some((first, _)) = entries.first().filter(|(at, _)| at.ts > last.ts) {
            ost.mark_logged(first.ts);
        }
        for (at, e) in entries {
            if at.ts <= last.ts {
                let newest = ost.last.ts;
                ost.forget_after(newest);
                return Err(Error::new(Code::OplogOutOfOrder, format!("oplog entry {:?} is not after the newest entry {:?}", at, last)));
            }
            last = *at;
            stats.count += 1;
            added_bytes += e.len() as u64;
            ost.remember(at.ts, e);
            batch.put(Space::Records, record_key(log.coll.id, at.ts), e.clone());
        }
        stats.data_bytes += added_bytes;
        batch.put(Space::Catalog, stats_key(log.coll.id), stats.to_bytes());
        let applied_through = match marker {
            Marker::Keep => ost.applied_through,
            Marker::Written => Some(ost.applied_through.unwrap_or(ost.last)),
            Marker::Applied(through) => {
                if ost.applied_through.is_none_or(|a| through <= a) || through > last {
                    return Err(Error::internal(format!("apply_written: {through:?} is not among the written, unapplied entries")));
                }
                (through < last).then_some(through)
            }
        };
        if applied_through != ost.applied_through {
            match applied_through {
                Some(at) => batch.put(Space::Catalog, vec![CATALOG_APPLIED_THROUGH], encode_optime(at)),
                None => batch.delete(Space::Catalog, vec![CATALOG_APPLIED_THROUGH]),
            }
        }
        if let Err(e) = shared.apply(batch) {
            let newest = ost.last.ts;
            ost.forget_after(newest);
            return Err(e);
        }
        let applied_before = ost.applied_through.unwrap_or(ost.last);
        ost.applied_through = applied_through;
        ost.last = last;
        let applied_now = applied_through.unwrap_or(last);
        if applied_now.ts > applied_before.ts {
            shared.note_applied(applied_now.ts);
        }
        ost.term = ost.term.max(last.term);
        shared.after_oplog_append(&log, stats, added_bytes, applied_through);
        drop(ost);
        for (st, pending) in published {
            st.publish_pending(pending);
        }
        Ok(())
    }

    /// Delete the oplog entries after `at` (rollback: they exist on no other member), so
    /// the oplog continues from `at`. Returns how many were deleted.
    pub fn truncate_oplog_after(&self, at: OpTime) -> Result<u64> {
        let shared = &self.inner.shared;
        let Some(log) = shared.oplog.read().clone() else {
            return Err(Error::new(Code::NoReplicationEnabled, "no oplog: not running with --replSet"));
        };
        let mut st = log.state.lock();
        let mut stats = log.coll.stats.lock().clone();
        let snap = shared.engine.snapshot();
        let lo = std::ops::Bound::Excluded(record_key(log.coll.id, at.ts));
        let (_, hi) = prefix_bounds(&log.coll.id.to_be_bytes());
        let mut batch = Batch::new();
        let mut removed = 0u64;
        let mut removed_bytes = 0u64;
        for kv in snap.iter(Space::Records, lo, hi, false) {
            let (k, v) = kv?;
            removed_bytes += v.len() as u64;
            stats.data_bytes = stats.data_bytes.saturating_sub(v.len() as u64);
            stats.count = stats.count.saturating_sub(1);
            removed += 1;
            batch.delete(Space::Records, k);
        }
        batch.put(Space::Catalog, stats_key(log.coll.id), stats.to_bytes());
        // Before the entries go: a reader that saw the old count before its snapshot and
        // sees it again after its read read none of the new branch.
        log.coll.truncations.fetch_add(1, Ordering::SeqCst);
        shared.apply(batch)?;
        log.coll.removals.fetch_add(1, Ordering::SeqCst);
        *log.coll.stats.lock() = stats;
        let _ = shared.total_data_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(removed_bytes)));
        st.last = at;
        st.durable = st.durable.min(at);
        st.forget_after(at.ts);
        shared.forget_boundaries_after(at.ts);
        debug_assert!(st.applied_through.is_none(), "rollback runs on a member that applied every entry it wrote");
        Ok(removed)
    }

    /// Stamp later oplog entries with term `t` (terms only grow).
    pub fn set_oplog_term(&self, t: i64) {
        if let Some(l) = self.inner.shared.oplog.read().as_ref() {
            let mut st = l.state.lock();
            st.term = st.term.max(t);
        }
    }

    /// Append a no-op entry carrying `o` (replSetInitiate's "initiating set"; new terms) and
    /// make it durable. Returns its optime.
    pub fn append_oplog_noop(&self, o: &Document) -> Result<OpTime> {
        let shared = &self.inner.shared;
        if shared.oplog.read().is_none() {
            return Err(Error::new(Code::NoReplicationEnabled, "no oplog: not running with --replSet"));
        }
        let entry = oplog::noop_entry(o, oplog::wall_now_ms()).map_err(Error::bad_value)?;
        shared.apply_logged(Batch::new(), vec![entry])?;
        shared.commit_durable()?;
        Ok(self.oplog_last().unwrap_or_default())
    }
}
