//! A collection's exclusive writer for read-modify-write operations.

use super::*;

/// An update's kind decides what its oplog entry carries, as in mongod: an update by
/// operators logs its diff (`{$v: 2, diff}`, see `diff`), a pipeline update its diff when
/// that is smaller than the new document, and a replacement the whole document. Change
/// streams tell an update from a replacement by it.
pub use query::update::UpdateForm;

/// Exclusive writer for read-modify-write operations; holds the collection write lock.
/// Each mutation is applied atomically (record and all index entries) immediately.
pub struct Writer {
    pub(crate) guard: WriteGuard,
    pub(crate) ctx: WriteCtx,
}

impl Writer {
    pub(crate) fn st(&self) -> &Arc<CollState> {
        &self.guard.coll
    }

    /// Latest state, including this writer's applied mutations.
    pub fn snapshot(&self) -> Snapshot {
        self.st().snapshot(&self.ctx)
    }

    pub fn insert(&mut self, doc: &Document) -> Result<RecordId> {
        let st = self.st();
        st.check_live()?;
        let meta = st.meta.read().clone();
        let snap = st.engine_view(&self.ctx);
        let mut pending = st.pending(&self.ctx);
        let rid = st.prepare_insert(&meta, &*snap, doc, &mut pending)?;
        st.commit_pending(pending)?;
        Ok(rid)
    }

    /// Replace record `id` with `new`, maintaining indexes, by an update of `form` (which
    /// decides how its oplog entry records it). `old` must be the stored document as read
    /// through this writer (its snapshot, under its lock), so it is current: its index
    /// entries are the ones removed. Decoding the stored bytes again would cost as much as
    /// the rest of an update.
    pub fn update(&mut self, id: RecordId, old: &Document, new: &Document, form: UpdateForm) -> Result<()> {
        let st = self.st();
        st.check_live()?;
        let meta = st.meta.read().clone();
        let snap = st.engine_view(&self.ctx);
        let old_bytes = snap
            .get(Space::Records, &record_key(st.id, id))?
            .ok_or_else(|| Error::new(Code::NoSuchKey, format!("record {id} not found in {}", st.ns_string())))?;
        debug_assert!(decode_doc(&old_bytes).is_ok_and(|d| &d == old), "Writer::update given a stale document");
        let mut pending = st.pending(&self.ctx);
        st.prepare_update(&meta, &*snap, id, old_bytes.len(), old, new, form, &mut pending)?;
        st.commit_pending(pending)
    }

    /// Log a retryable write's history that a chunk migration brought from the donor shard:
    /// for each `(stmtId, donor's entry)`, a no-op entry of this collection in the
    /// transaction this thread runs (`Store::begin_retryable_write`), all in one batch with
    /// the session's record. A retry here then finds those statements executed.
    pub fn log_session_history(&mut self, entries: &[(i32, Vec<u8>)]) -> Result<()> {
        let st = self.st();
        st.check_live()?;
        let mut pending = st.pending(&self.ctx);
        let Some(log) = pending.log.as_ref() else { return Err(Error::new(Code::IllegalOperation, "session history is logged on a replica-set member only")) };
        let Some(tag) = log.session.as_ref() else { return Err(Error::internal("session history is logged inside a retryable write")) };
        for (stmt, original) in entries {
            pending.oplog.push(oplog::migrated_session_entry(&log.ns, log.ui, original, log.wall_ms, (tag, *stmt)));
        }
        st.commit_pending(pending)
    }

    /// Delete record `id` and its index entries (computed from the stored document).
    pub fn delete(&mut self, id: RecordId, old: &Document) -> Result<()> {
        let _ = old;
        let st = self.st();
        st.check_live()?;
        let meta = st.meta.read().clone();
        let snap = st.engine_view(&self.ctx);
        let mut pending = st.pending(&self.ctx);
        st.prepare_delete(&meta, &*snap, id, &mut pending)?;
        st.commit_pending(pending)
    }
}
