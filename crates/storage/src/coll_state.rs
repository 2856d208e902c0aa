//! A collection's write path: its write lock, metadata and index runtime, statistics, and
//! the pending batch a write prepares (record, index entries, oplog entries) and commits.

use super::*;

/// The collection write lock; a guard can be owned (lives in a `Writer`).
pub(crate) struct WriteLock {
    pub(crate) held: Mutex<bool>,
    pub(crate) released: Condvar,
}

impl WriteLock {
    pub(crate) fn new() -> WriteLock {
        WriteLock { held: Mutex::new(false), released: Condvar::new() }
    }
}

pub(crate) struct WriteGuard {
    pub(crate) coll: Arc<CollState>,
}

impl WriteGuard {
    pub(crate) fn acquire(coll: &Arc<CollState>) -> WriteGuard {
        let mut held = coll.lock.held.lock();
        while *held {
            coll.lock.released.wait(&mut held);
        }
        *held = true;
        WriteGuard { coll: coll.clone() }
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        *self.coll.lock.held.lock() = false;
        self.coll.lock.released.notify_one();
    }
}

pub(crate) struct IndexRt {
    pub(crate) id: u64,
    pub(crate) spec: IndexSpec,
    pub(crate) fields: Vec<KeyField>,
    pub(crate) filter: Option<query::filter::Filter>,
    pub(crate) prefix: [u8; 8],
    /// Set while the index is being built: writers maintain it, readers do not see it.
    pub(crate) build: Option<Arc<BuildState>>,
    /// The engine position from which the index holds every key (set when a build makes it
    /// ready; 0 for indexes created with their collection or found at startup).
    pub(crate) ready_since: AtomicU64,
}

impl IndexRt {
    pub(crate) fn new(id: u64, spec: IndexSpec) -> Result<IndexRt> {
        let filter = match &spec.partial_filter {
            Some(f) => Some(query::filter::Filter::parse(f)?),
            None => None,
        };
        Ok(IndexRt { id, fields: key_fields(&spec.key), spec, filter, prefix: id.to_be_bytes(), build: None, ready_since: AtomicU64::new(0) })
    }

    pub(crate) fn ready(&self) -> bool {
        self.build.is_none()
    }

    /// A unique-key conflict met by a writer on a building index: the write goes ahead
    /// without that entry and the build fails (as MongoDB's hybrid builds do).
    pub(crate) fn building_conflict(&self, e: Error) -> bool {
        match &self.build {
            Some(b) => {
                b.conflict.lock().get_or_insert(e);
                true
            }
            None => false,
        }
    }

    /// The entries `doc` contributes: (stored key, stored value), and multikey. A stored
    /// value is `rid ‖ {"0": v0, ..}`; [`entry_values`] recovers the values (for errors).
    pub(crate) fn entries(&self, doc: &Document, rid: RecordId) -> Result<(Vec<StoredEntry>, bool)> {
        if let Some(f) = &self.filter {
            if !f.matches(doc) {
                return Ok((Vec::new(), false));
            }
        }
        // Fast path, the common case: one scalar (or missing) value per field, encoded
        // straight from the document without copying the values.
        if let Some(values) = keygen::scalar_key_values(&self.fields, doc) {
            if self.spec.sparse && values.iter().all(|v| v.is_none()) {
                return Ok((Vec::new(), false));
            }
            let values: Vec<&Bson> = values.into_iter().map(|v| v.unwrap_or(&Bson::Null)).collect();
            let mut stored = Vec::with_capacity(8 + 12 * values.len() + 8);
            stored.extend_from_slice(&self.prefix);
            for (f, v) in self.fields.iter().zip(&values) {
                encode_component(v, f.descending, &mut stored);
            }
            if !self.spec.unique {
                stored.extend_from_slice(&rid.to_be_bytes());
            }
            return Ok((vec![(stored, self.stored_value(rid, values.iter().copied())?)], false));
        }
        let (keys, multikey) = index_keys(&self.fields, self.spec.sparse, doc)?;
        let mut out = Vec::with_capacity(keys.len());
        for (k, values) in keys {
            let mut stored = Vec::with_capacity(8 + k.len() + 8);
            stored.extend_from_slice(&self.prefix);
            stored.extend_from_slice(&k);
            if !self.spec.unique {
                stored.extend_from_slice(&rid.to_be_bytes());
            }
            out.push((stored, self.stored_value(rid, values.iter())?));
        }
        Ok((out, multikey))
    }

    pub(crate) fn stored_value<'a>(&self, rid: RecordId, values: impl ExactSizeIterator<Item = &'a Bson>) -> Result<Vec<u8>> {
        let mut value = Vec::with_capacity(8 + 5 + 16 * values.len());
        value.extend_from_slice(&rid.to_be_bytes());
        bsonenc::append_values_doc(values, &mut value).map_err(|e| Error::bad_value(format!("cannot serialize index key: {e}")))?;
        Ok(value)
    }

    /// The encoded key part of a stored key.
    pub(crate) fn key_of<'a>(&self, stored: &'a [u8]) -> &'a [u8] {
        let end = if self.spec.unique { stored.len() } else { stored.len().saturating_sub(8) };
        stored.get(8..end).unwrap_or(&[])
    }
}

pub(crate) struct MetaRt {
    pub(crate) uuid: bson::Uuid,
    pub(crate) options: Document,
    /// `_id_` first, then in creation order; includes indexes being built.
    pub(crate) indexes: Vec<Arc<IndexRt>>,
}

impl MetaRt {
    /// A ready index (what readers may use).
    pub(crate) fn index(&self, name: &str) -> Option<&Arc<IndexRt>> {
        self.indexes.iter().find(|i| i.spec.name == name && i.ready())
    }

    /// Whether changes log the documents they change (`changeStreamPreAndPostImages`).
    pub(crate) fn logs_pre_images(&self) -> bool {
        self.options.get_document(PRE_AND_POST_IMAGES_OPTION).is_ok_and(|o| o.get_bool("enabled").ok() == Some(true))
    }

    pub(crate) fn ready_indexes(&self) -> impl Iterator<Item = &Arc<IndexRt>> {
        self.indexes.iter().filter(|i| i.ready())
    }

    /// The catalog entry: only ready indexes (a build interrupted by a crash is garbage).
    pub(crate) fn to_doc(&self, id: u64, db: &str, name: &str) -> Document {
        let indexes: Vec<Bson> = self.ready_indexes().map(|i| Bson::Document(doc! {"id": i.id as i64, "spec": i.spec.spec.clone()})).collect();
        doc! {"id": id as i64, "db": db, "name": name, "uuid": bson::Binary::from_uuid(self.uuid), "options": self.options.clone(), "indexes": indexes}
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Stats {
    pub(crate) next_rid: u64,
    pub(crate) count: u64,
    pub(crate) data_bytes: u64,
    /// Index id → bytes of its entries.
    pub(crate) index_bytes: BTreeMap<u64, u64>,
    pub(crate) multikey: BTreeSet<u64>,
}

impl Stats {
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut ix = Document::new();
        for (id, b) in &self.index_bytes {
            ix.insert(id.to_string(), *b as i64);
        }
        let mk: Vec<Bson> = self.multikey.iter().map(|id| Bson::Int64(*id as i64)).collect();
        let d = doc! {"n": self.next_rid as i64, "c": self.count as i64, "d": self.data_bytes as i64, "ix": ix, "mk": mk};
        d.to_vec().unwrap_or_default()
    }

    pub(crate) fn from_bytes(b: &[u8]) -> Result<Stats> {
        let d = decode_doc(b)?;
        let num = |k: &str| d.get_i64(k).map(|v| v.max(0) as u64).map_err(|_| corrupt("collection statistics"));
        let mut index_bytes = BTreeMap::new();
        if let Ok(ix) = d.get_document("ix") {
            for (k, v) in ix {
                if let (Ok(id), Bson::Int64(b)) = (k.parse::<u64>(), v) {
                    index_bytes.insert(id, (*b).max(0) as u64);
                }
            }
        }
        let multikey = match d.get_array("mk") {
            Ok(a) => a.iter().filter_map(|v| v.as_i64()).map(|v| v as u64).collect(),
            Err(_) => BTreeSet::new(),
        };
        Ok(Stats { next_rid: num("n")?, count: num("c")?, data_bytes: num("d")?, index_bytes, multikey })
    }
}

/// How often a catalog change waiting for prepared transactions looks again.
const CATALOG_CHANGE_PREPARED_POLL: std::time::Duration = std::time::Duration::from_millis(10);

pub(crate) struct CollState {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: u64,
    pub(crate) ns: RwLock<(String, String)>,
    pub(crate) meta: RwLock<Arc<MetaRt>>,
    pub(crate) lock: WriteLock,
    /// Published statistics; only the write lock holder changes them.
    pub(crate) stats: Mutex<Stats>,
    pub(crate) dropped: AtomicBool,
    /// Bumped after records are deleted (a delete, the oplog's truncation): a tailing reader
    /// checks that its position still exists only when this moved.
    pub(crate) removals: AtomicU64,
    /// Bumped before the oplog is truncated by a rollback (mongod's rollback id): a record
    /// at the position of a reader that began before may now be another branch's entry with
    /// the same timestamp, so such a reader must stop (`Collection::truncations`).
    pub(crate) truncations: AtomicU64,
    /// Prepared transactions that wrote here: the collection's indexes and name stay as
    /// their writes were prepared for until they are decided (`lock_for_catalog_change`).
    pub(crate) prepared_txns: std::sync::atomic::AtomicUsize,
}

impl CollState {
    /// A collection's state as its creation or the catalog's load makes it.
    pub(crate) fn new(shared: &Arc<Shared>, id: u64, db: &str, name: &str, meta: MetaRt, stats: Stats) -> Arc<CollState> {
        Arc::new(CollState {
            shared: shared.clone(),
            id,
            ns: RwLock::new((db.to_string(), name.to_string())),
            meta: RwLock::new(Arc::new(meta)),
            lock: WriteLock::new(),
            stats: Mutex::new(stats),
            dropped: AtomicBool::new(false),
            removals: AtomicU64::new(0),
            truncations: AtomicU64::new(0),
            prepared_txns: Default::default(),
        })
    }

    /// The write lock, for a change of the collection's indexes or name: waits while a
    /// prepared transaction that wrote here is undecided (its commit writes the index keys
    /// of the indexes it was prepared with), as mongod's catalog changes wait for the locks
    /// prepared transactions hold. LockTimeout after `PREPARE_CONFLICT_WAIT_MAX`.
    pub(crate) fn lock_for_catalog_change(self: &Arc<Self>) -> Result<WriteGuard> {
        let deadline = std::time::Instant::now() + crate::prepared::PREPARE_CONFLICT_WAIT_MAX;
        loop {
            let guard = WriteGuard::acquire(self);
            if self.prepared_txns.load(Ordering::SeqCst) == 0 {
                return Ok(guard);
            }
            drop(guard);
            if std::time::Instant::now() >= deadline {
                return Err(Error::new(
                    Code::LockTimeout,
                    format!("a prepared transaction on {} was not decided within {} s", self.ns_string(), crate::prepared::PREPARE_CONFLICT_WAIT_MAX.as_secs()),
                ));
            }
            std::thread::sleep(CATALOG_CHANGE_PREPARED_POLL);
        }
    }

    pub(crate) fn ns_string(&self) -> String {
        let ns = self.ns.read();
        format!("{}.{}", ns.0, ns.1)
    }

    /// The live oplog is written only by `apply_logged`: its records are keyed by timestamp
    /// and it has no indexes to maintain.
    pub(crate) fn check_not_oplog(&self) -> Result<()> {
        if self.shared.oplog.read().as_ref().is_some_and(|l| l.coll.id == self.id) {
            return Err(Error::new(Code::IllegalOperation, "the live oplog cannot be written to or indexed directly"));
        }
        Ok(())
    }

    /// `config.transactions`, where retryable writes keep their sessions' records.
    pub(crate) fn is_session_records(&self) -> bool {
        let ns = self.ns.read();
        ns.0 == SESSION_RECORDS_DB && ns.1 == SESSION_RECORDS_COLLECTION
    }

    pub(crate) fn check_live(&self) -> Result<()> {
        if self.dropped.load(Ordering::SeqCst) {
            return Err(Error::new(Code::NamespaceNotFound, format!("collection {} was dropped", self.ns_string())));
        }
        Ok(())
    }

    pub(crate) fn snapshot(self: &Arc<Self>, ctx: &WriteCtx) -> Snapshot {
        // Engine snapshot under the meta read lock: the index list matches the data.
        let meta = self.meta.read();
        let snap = self.engine_view(ctx);
        let mut m = meta.clone();
        drop(meta);
        // A view older than an index's readiness (a transaction's or a past point's) does
        // not hold all of that index's keys: it reads without the index.
        if ctx.transaction().is_some() || ctx.read_view().is_some() {
            let position = snap.position();
            if m.indexes.iter().any(|i| i.ready_since.load(Ordering::Relaxed) > position) {
                let indexes = m.indexes.iter().filter(|i| i.ready_since.load(Ordering::Relaxed) <= position).cloned().collect();
                m = Arc::new(MetaRt { uuid: m.uuid, options: m.options.clone(), indexes });
            }
        }
        Snapshot { snap, coll: self.clone(), meta: m }
    }

    pub(crate) fn meta_public(&self) -> CollectionMeta {
        let (db, name) = self.ns.read().clone();
        let m = self.meta.read().clone();
        CollectionMeta { db, name, uuid: m.uuid, options: m.options.clone(), indexes: m.ready_indexes().map(|i| i.spec.clone()).collect() }
    }

    /// The duplicate key error for an entry whose stored value is `value`.
    pub(crate) fn dup_error(&self, idx: &IndexRt, value: &[u8]) -> Error {
        let values = entry_values(value).unwrap_or_default();
        let kv = key_value_doc(&idx.fields, &values);
        Error::new(
            Code::DuplicateKey,
            format!("E11000 duplicate key error collection: {} index: {} dup key: {}", self.ns_string(), idx.spec.name, format_doc(&kv)),
        )
        .with_extra(doc! {"keyPattern": idx.spec.key.clone(), "keyValue": kv})
    }

    /// Add one document to `pending` (nothing is added if it fails a check).
    pub(crate) fn prepare_insert(&self, meta: &MetaRt, snap: &dyn EngineSnapshot, doc: &Document, pending: &mut Pending) -> Result<RecordId> {
        // Documents of one batch tend to be alike: size the buffer like the previous one.
        let bytes = encode_record(doc, pending.record_size_hint_bytes + pending.record_size_hint_bytes / 8)?;
        pending.record_size_hint_bytes = bytes.len();
        self.prepare_insert_encoded(meta, snap, doc, bytes, false, pending)
    }

    /// `prepare_insert` of a document already encoded as `bytes`. `doc` gives the index keys:
    /// the document itself, or only its `_id` when the `_id` index is the only one.
    /// `id_absent`: the caller found no `_id` entry for `doc` in `snap`; the `_id` index's
    /// own check then only looks at `pending`.
    pub(crate) fn prepare_insert_encoded(
        &self,
        meta: &MetaRt,
        snap: &dyn EngineSnapshot,
        doc: &Document,
        bytes: Vec<u8>,
        id_absent: bool,
        pending: &mut Pending,
    ) -> Result<RecordId> {
        if bytes.len() > BSON_OBJECT_SIZE_MAX_BYTES {
            return Err(Error::new(
                Code::BSONObjectTooLarge,
                format!("object to insert too large. size in bytes: {}, max size: {BSON_OBJECT_SIZE_MAX_BYTES}", bytes.len()),
            ));
        }
        match doc.get("_id") {
            None => return Err(Error::bad_value("document to insert has no _id field")),
            Some(Bson::Array(_)) => return Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type array")),
            Some(_) => {}
        }
        let rid = pending.stats.next_rid;
        let mut all = Vec::with_capacity(meta.indexes.len());
        for idx in &meta.indexes {
            let (mut entries, multikey) = idx.entries(doc, rid)?;
            if idx.spec.unique {
                let mut conflicts = Vec::new();
                for (i, (stored, value)) in entries.iter().enumerate() {
                    let checked = id_absent && idx.spec.name == ID_INDEX_NAME;
                    if pending.unique_keys.contains(stored) || (!checked && snap.get(Space::Index, stored)?.is_some()) {
                        if !idx.building_conflict(self.dup_error(idx, value)) {
                            return Err(self.dup_error(idx, value));
                        }
                        conflicts.push(i);
                    }
                }
                for i in conflicts.into_iter().rev() {
                    entries.remove(i);
                }
            }
            all.push((idx, entries, multikey));
        }
        pending.stats.next_rid += 1;
        pending.stats.count += 1;
        pending.stats.data_bytes += bytes.len() as u64;
        pending.data_delta += bytes.len() as i64;
        if let Some(log) = &pending.log {
            pending.oplog.push(oplog::insert_entry(&log.ns, log.ui, &bytes, log.wall_ms, log.session.as_ref().map(|t| (t, pending.ctx.current_stmt()))));
        }
        pending.batch.put(Space::Records, record_key(self.id, rid), bytes);
        for (idx, entries, multikey) in all {
            if multikey {
                pending.stats.multikey.insert(idx.id);
            }
            let mut added = 0u64;
            for (stored, value) in entries {
                added += (stored.len() + value.len()) as u64;
                if idx.spec.unique {
                    pending.unique_keys.insert(stored.clone());
                }
                pending.batch.put(Space::Index, stored, value);
            }
            *pending.stats.index_bytes.entry(idx.id).or_insert(0) += added;
        }
        Ok(rid)
    }

    /// Apply `pending` (plus the new statistics) as one batch and publish the statistics.
    /// Inside a transaction the changes join the transaction's instead
    /// (`Transaction::absorb`). A change to a document an open transaction has written
    /// fails with WriteConflict before anything is applied: the caller waits for the
    /// transaction to end (`Store::wait_for_transactions`) and tries again.
    pub(crate) fn commit_pending(self: &Arc<Self>, mut pending: Pending) -> Result<()> {
        self.check_not_oplog()?;
        if pending.ctx.read_view().is_some() {
            return Err(Error::internal("a handle reading at a past point cannot write"));
        }
        if let Some(txn) = pending.ctx.transaction().cloned() {
            return txn.absorb(self, pending);
        }
        if self.shared.txn_keys_owned.load(Ordering::SeqCst) > 0 {
            self.shared.check_not_owned(&pending.batch)?;
        }
        pending.batch.put(Space::Catalog, stats_key(self.id), pending.stats.to_bytes());
        let mut batch = std::mem::take(&mut pending.batch);
        let entries = std::mem::take(&mut pending.oplog);
        let tagged = pending.log.as_ref().is_some_and(|l| l.session.is_some()) && !entries.is_empty();
        let session = if tagged { pending.ctx.with_session(|s| s.map(|s| (s.records.clone(), s.lsid.clone(), s.txn, s.prev))) } else { None };
        let Some((records, lsid, txn, prev)) = session else {
            self.shared.apply_logged(batch, entries)?;
            self.publish_pending(pending);
            return Ok(());
        };
        // A retryable write: the session's record goes into the same batch, unlogged (each
        // member derives it from the entries, as mongod's secondaries do), so the write and
        // the record that makes a retry find it are one atomic engine write. The record's
        // collection is locked after this one's, as `Store::apply_replicated` locks it last.
        let _records_lock = WriteGuard::acquire(&records);
        let wall_ms = pending.log.as_ref().map_or_else(oplog::wall_now_ms, |l| l.wall_ms);
        let (record_op, rp) = records.prepare_session_record(&mut batch, oplog::session_record(&lsid, txn, OpTime::default(), wall_ms))?;
        let last = self.shared.apply_logged_with(batch, entries, Some(SessionStamp { prev, record_op }))?;
        if let Some(last) = last {
            pending.ctx.with_session(|s| {
                if let Some(s) = s {
                    s.prev = last;
                }
            });
        }
        records.publish_pending(rp);
        self.publish_pending(pending);
        Ok(())
    }

    /// Add a session's `config.transactions` `record` (this collection's) to `batch`, unlogged;
    /// returns the record's position in the batch, for stamping, and the pending change to
    /// publish once applied. The caller holds this collection's write lock.
    pub(crate) fn prepare_session_record(&self, batch: &mut Batch, record: Vec<u8>) -> Result<(usize, Pending)> {
        self.check_live()?;
        let meta = self.meta.read().clone();
        let snap = self.shared.engine.snapshot();
        let mut rp = self.pending(&WriteCtx::default());
        rp.log = None;
        let doc = bson::RawDocumentBuf::from_bytes(record).map_err(|e| Error::internal(format!("session record: {e}")))?;
        self.prepare_replicated(&meta, &*snap, &ReplicatedChange::Put { doc }, &mut rp)?;
        let prefix = self.id.to_be_bytes();
        let at = rp.batch.ops.iter().position(|op| matches!(op, BatchOp::Put(Space::Records, k, _) if k.starts_with(&prefix)));
        let record_op = batch.ops.len() + at.ok_or_else(|| Error::internal("a session record was not prepared"))?;
        rp.batch.put(Space::Catalog, stats_key(self.id), rp.stats.to_bytes());
        batch.ops.append(&mut rp.batch.ops);
        Ok((record_op, rp))
    }

    /// The engine view a write through a handle with `ctx` reads: its transaction's (the
    /// transaction's snapshot with its own writes), or the newest.
    pub(crate) fn engine_view(&self, ctx: &WriteCtx) -> Arc<dyn EngineSnapshot> {
        match (ctx.transaction(), ctx.read_view()) {
            (Some(txn), _) => txn.view(),
            (None, Some(view)) => view.clone(),
            (None, None) => self.shared.engine.snapshot(),
        }
    }

    /// The record whose `_id` is `id`, in `snap`.
    pub(crate) fn rid_by_id(&self, meta: &MetaRt, snap: &dyn EngineSnapshot, id: &Bson) -> Result<Option<RecordId>> {
        let Some(idx) = meta.index(ID_INDEX_NAME) else { return Ok(None) };
        let mut key = idx.prefix.to_vec();
        encode_component(id, false, &mut key);
        match snap.get(Space::Index, &key)? {
            Some(v) => Ok(Some(read_u64(&v).ok_or_else(|| corrupt("_id index entry"))?)),
            None => Ok(None),
        }
    }

    /// Add one replicated change to `pending` (see `Store::apply_replicated`).
    pub(crate) fn prepare_replicated(&self, meta: &MetaRt, snap: &dyn EngineSnapshot, change: &ReplicatedChange, pending: &mut Pending) -> Result<()> {
        match change {
            ReplicatedChange::Put { doc } => {
                let invalid = |e: bson::error::Error| Error::new(Code::InvalidBSON, format!("invalid replicated document: {e}"));
                let id = doc.get("_id").map_err(invalid)?.ok_or_else(|| Error::new(Code::FailedToParse, "a replicated document has no _id"))?;
                let id = Bson::try_from(id).map_err(invalid)?;
                let rid = self.rid_by_id(meta, snap, &id)?;
                // The index keys of a collection indexed on `_id` alone come from the `_id`:
                // the document is stored as it came, never decoded.
                let id_only = meta.indexes.iter().all(|i| i.spec.name == ID_INDEX_NAME);
                let keys_doc = match id_only {
                    true => doc! {"_id": id},
                    false => Document::try_from(doc.as_ref()).map_err(invalid)?,
                };
                let bytes = doc.as_bytes().to_vec();
                match rid {
                    Some(rid) if id_only => {
                        let old_len = snap
                            .get(Space::Records, &record_key(self.id, rid))?
                            .ok_or_else(|| corrupt(format!("_id index entry points at missing record {rid}")))?
                            .len();
                        self.prepare_update_encoded(meta, snap, rid, old_len, &keys_doc, &keys_doc, bytes, UpdateForm::Replacement, pending)
                    }
                    Some(rid) => {
                        let (old_bytes, old) = self.stored_doc(snap, rid)?;
                        self.prepare_update_encoded(meta, snap, rid, old_bytes.len(), &old, &keys_doc, bytes, UpdateForm::Replacement, pending)
                    }
                    None => self.prepare_insert_encoded(meta, snap, &keys_doc, bytes, true, pending).map(|_| ()),
                }
            }
            ReplicatedChange::Delete { id } => match self.rid_by_id(meta, snap, id)? {
                Some(rid) => self.prepare_delete(meta, snap, rid, pending),
                None => Ok(()),
            },
            ReplicatedChange::Patch { id, diffs } => {
                let Some(rid) = self.rid_by_id(meta, snap, id)? else { return Ok(()) };
                let (old_bytes, old) = self.stored_doc(snap, rid)?;
                let mut new = old.clone();
                for diff in diffs {
                    new = crate::diff::apply(&new, diff)?;
                }
                if new.get("_id").is_none_or(|n| !crate::diff::same_value(n, id)) {
                    return Err(Error::new(Code::ImmutableField, format!("a replicated update diff changes the _id of {id}")));
                }
                let new_bytes = encode_record(&new, old_bytes.len() + old_bytes.len() / 8)?;
                self.prepare_update_encoded(meta, snap, rid, old_bytes.len(), &old, &new, new_bytes, UpdateForm::Replacement, pending)
            }
        }
    }

    /// Publish what `pending` changed once its batch is applied (the write lock is held).
    pub(crate) fn publish_pending(&self, pending: Pending) {
        if pending.removes {
            self.removals.fetch_add(1, Ordering::SeqCst);
        }
        *self.stats.lock() = pending.stats;
        if pending.data_delta >= 0 {
            self.shared.total_data_bytes.fetch_add(pending.data_delta as u64, Ordering::Relaxed);
        } else {
            let d = pending.data_delta.unsigned_abs();
            let _ = self.shared.total_data_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(d)));
        }
    }

    /// Add the replacement of record `id` (stored as `old`, `old_len` bytes) by `new` to
    /// `pending`, maintaining indexes: only index entries that change are written.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prepare_update(
        &self,
        meta: &MetaRt,
        snap: &dyn EngineSnapshot,
        id: RecordId,
        old_len: usize,
        old: &Document,
        new: &Document,
        form: UpdateForm,
        pending: &mut Pending,
    ) -> Result<()> {
        let new_bytes = encode_record(new, old_len + old_len / 8)?;
        self.prepare_update_encoded(meta, snap, id, old_len, old, new, new_bytes, form, pending)
    }

    /// `prepare_update` to a document already encoded as `new_bytes`. `old` and `new` give
    /// the index keys: the documents themselves, or only their `_id` when the `_id` index is
    /// the only one.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prepare_update_encoded(
        &self,
        meta: &MetaRt,
        snap: &dyn EngineSnapshot,
        id: RecordId,
        old_len: usize,
        old: &Document,
        new: &Document,
        new_bytes: Vec<u8>,
        form: UpdateForm,
        pending: &mut Pending,
    ) -> Result<()> {
        let st = self;
        let old_doc = old;
        if new_bytes.len() > BSON_OBJECT_SIZE_MAX_BYTES {
            return Err(Error::new(Code::BSONObjectTooLarge, format!("Resulting document after update is larger than {BSON_OBJECT_SIZE_MAX_BYTES}")));
        }
        if matches!(new.get("_id"), Some(Bson::Array(_))) {
            return Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type array"));
        }
        let mut changes = Vec::with_capacity(meta.indexes.len());
        for idx in &meta.indexes {
            let (old_entries, _) = idx.entries(old_doc, id)?;
            let (new_entries, multikey) = idx.entries(new, id)?;
            let old_map: BTreeMap<&[u8], &[u8]> = old_entries.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
            let new_keys: HashSet<&[u8]> = new_entries.iter().map(|(k, _)| k.as_slice()).collect();
            let mut delta: i64 = 0;
            let mut ops = Vec::new();
            for (k, v) in &old_entries {
                if !new_keys.contains(k.as_slice()) {
                    delta -= (k.len() + v.len()) as i64;
                    ops.push(BatchOp::Delete(Space::Index, k.clone()));
                }
            }
            for (k, v) in &new_entries {
                let old = old_map.get(k.as_slice());
                // A building index may lack the old entry (record not yet scanned), and the
                // builder skips records changed since it read them: always write, and check
                // uniqueness even for keys the old version had.
                if idx.ready() && old.is_some_and(|ov| *ov == v.as_slice()) {
                    continue;
                }
                if idx.spec.unique && (old.is_none() || !idx.ready()) {
                    if let Some(existing) = snap.get(Space::Index, k)? {
                        if read_u64(&existing) != Some(id) {
                            if idx.building_conflict(st.dup_error(idx, v)) {
                                continue;
                            }
                            return Err(st.dup_error(idx, v));
                        }
                    }
                }
                match old {
                    Some(ov) => delta += v.len() as i64 - ov.len() as i64,
                    None => delta += (k.len() + v.len()) as i64,
                }
                ops.push(BatchOp::Put(Space::Index, k.clone(), v.clone()));
            }
            changes.push((idx.id, ops, delta, multikey));
        }
        for (iid, ops, delta, multikey) in changes {
            pending.batch.ops.extend(ops);
            let b = pending.stats.index_bytes.entry(iid).or_insert(0);
            *b = (*b as i64 + delta).max(0) as u64;
            if multikey {
                pending.stats.multikey.insert(iid);
            }
        }
        let delta = new_bytes.len() as i64 - old_len as i64;
        pending.stats.data_bytes = (pending.stats.data_bytes as i64 + delta).max(0) as u64;
        pending.data_delta += delta;
        if let Some(log) = &pending.log {
            let session = log.session.as_ref().map(|t| (t, pending.ctx.current_stmt()));
            if let (Some(tag), Some(image)) = (session, pending.ctx.retry_image()) {
                let doc = match image {
                    oplog::RetryImage::Before => encode_record(old_doc, old_len)?,
                    oplog::RetryImage::After => new_bytes.clone(),
                };
                pending.oplog.push(oplog::image_entry(&log.ns, log.ui, &doc, log.wall_ms, tag));
            }
            if meta.logs_pre_images() {
                let record = encode_record(old_doc, old_len)?;
                pending.oplog.push(oplog::pre_image_entry(&log.ns, log.ui, &record, log.wall_ms, session));
            }
            let id_doc = oplog::id_doc(new.get("_id").unwrap_or(&Bson::Null)).map_err(Error::bad_value)?;
            let diff = match form {
                UpdateForm::Replacement => None,
                UpdateForm::Modifiers | UpdateForm::Pipeline => {
                    let diff = crate::diff::compute(old_doc, new, form == UpdateForm::Modifiers);
                    let bytes = encode_record(&diff, 64).map_err(|e| Error::internal(format!("an update's diff: {}", e.message)))?;
                    // mongod logs an update by operators as its diff always, one by pipeline
                    // only when the diff is the smaller.
                    (form == UpdateForm::Modifiers || bytes.len() + DIFF_ENTRY_OVERHEAD_BYTES < new_bytes.len()).then_some(bytes)
                }
            };
            let change = match &diff {
                Some(d) => oplog::UpdateChange::Diff(d),
                None => oplog::UpdateChange::Document(&new_bytes),
            };
            pending.oplog.push(oplog::update_entry(&log.ns, log.ui, &change, &id_doc, log.wall_ms, session));
        }
        pending.batch.put(Space::Records, record_key(st.id, id), new_bytes);
        Ok(())
    }

    /// Add the deletion of record `rid` and its index entries (computed from the stored
    /// document) to `pending`.
    pub(crate) fn prepare_delete(&self, meta: &MetaRt, snap: &dyn EngineSnapshot, rid: RecordId, pending: &mut Pending) -> Result<()> {
        let (old_bytes, old_doc) = self.stored_doc(snap, rid)?;
        for idx in &meta.indexes {
            let (entries, _) = idx.entries(&old_doc, rid)?;
            let mut removed = 0u64;
            for (k, v) in entries {
                removed += (k.len() + v.len()) as u64;
                pending.batch.delete(Space::Index, k);
            }
            let b = pending.stats.index_bytes.entry(idx.id).or_insert(0);
            *b = b.saturating_sub(removed);
        }
        pending.stats.count = pending.stats.count.saturating_sub(1);
        pending.stats.data_bytes = pending.stats.data_bytes.saturating_sub(old_bytes.len() as u64);
        pending.data_delta -= old_bytes.len() as i64;
        pending.removes = true;
        pending.batch.delete(Space::Records, record_key(self.id, rid));
        if let Some(log) = &pending.log {
            let session = log.session.as_ref().map(|t| (t, pending.ctx.current_stmt()));
            if let Some(tag) = session.filter(|_| pending.ctx.retry_image().is_some()) {
                pending.oplog.push(oplog::image_entry(&log.ns, log.ui, &old_bytes, log.wall_ms, tag));
            }
            if meta.logs_pre_images() {
                pending.oplog.push(oplog::pre_image_entry(&log.ns, log.ui, &old_bytes, log.wall_ms, session));
            }
            let id = oplog::id_doc(old_doc.get("_id").unwrap_or(&Bson::Null)).map_err(Error::bad_value)?;
            pending.oplog.push(oplog::delete_entry(&log.ns, log.ui, &id, log.wall_ms, session));
        }
        Ok(())
    }

    /// Delete the documents with an entry of TTL index `idx` dated at or before `expiry_ms`,
    /// found by an index range scan, in batches of at most TTL_DELETE_BATCH_DOCS documents.
    pub(crate) fn ttl_delete_expired(self: &Arc<Self>, idx: &Arc<IndexRt>, expiry_ms: i64) -> Result<u64> {
        let descending = idx.fields.first().is_some_and(|f| f.descending);
        let bound = |ms: i64| {
            let mut k = Vec::with_capacity(10);
            encode_component(&Bson::DateTime(bson::DateTime::from_millis(ms)), descending, &mut k);
            k
        };
        let (oldest, newest) = (bound(i64::MIN), bound(expiry_ms));
        let bounds = if descending {
            IndexBounds { lower: Bound::Included(newest), upper: Bound::Included(oldest), reverse: true }
        } else {
            IndexBounds { lower: Bound::Included(oldest), upper: Bound::Included(newest), reverse: false }
        };
        let mut deleted = 0u64;
        loop {
            let _guard = WriteGuard::acquire(self);
            if self.dropped.load(Ordering::SeqCst) {
                return Ok(deleted);
            }
            let snapshot = self.snapshot(&WriteCtx::default());
            // The index may have been dropped (or recreated) since the pass started.
            if !snapshot.meta.ready_indexes().any(|i| i.id == idx.id) {
                return Ok(deleted);
            }
            let entries = snapshot.index_scan(&idx.spec.name, bounds.clone(), None, TTL_DELETE_BATCH_DOCS)?;
            let rids: BTreeSet<RecordId> = entries.iter().map(|e| e.record_id).collect();
            if rids.is_empty() {
                return Ok(deleted);
            }
            let mut pending = self.pending(&WriteCtx::default());
            for rid in &rids {
                self.prepare_delete(&snapshot.meta, &*snapshot.snap, *rid, &mut pending)?;
            }
            self.commit_pending(pending)?;
            deleted += rids.len() as u64;
            self.shared.ttl_deleted.fetch_add(rids.len() as u64, Ordering::Relaxed);
            if entries.len() < TTL_DELETE_BATCH_DOCS {
                return Ok(deleted);
            }
        }
    }

    pub(crate) fn pending(&self, ctx: &WriteCtx) -> Pending {
        let log = self.logs_changes(ctx).then(|| {
            // The session record's own collection is written in the same batch, not tagged.
            let session = ctx.with_session(|s| s.filter(|s| s.records.id != self.id).map(|s| oplog::SessionTag { lsid: s.lsid.clone(), txn: s.txn }));
            LogTarget { ns: self.ns_string(), ui: self.meta.read().uuid, wall_ms: oplog::wall_now_ms(), session }
        });
        Pending {
            batch: Batch::new(),
            stats: self.stats.lock().clone(),
            unique_keys: HashSet::new(),
            data_delta: 0,
            record_size_hint_bytes: 0,
            log,
            oplog: Vec::new(),
            removes: false,
            ctx: ctx.clone(),
        }
    }

    /// Changes are logged when the store keeps an oplog, except those of the `local`
    /// database, which no member replicates (the oplog itself lives there), and replicated
    /// ones.
    pub(crate) fn logs_changes(&self, ctx: &WriteCtx) -> bool {
        self.shared.oplog.read().is_some() && self.ns.read().0 != oplog::OPLOG_DB && !ctx.is_replicated()
    }

    pub(crate) fn stored_doc(&self, snap: &dyn EngineSnapshot, id: RecordId) -> Result<(Vec<u8>, Document)> {
        let bytes = snap
            .get(Space::Records, &record_key(self.id, id))?
            .ok_or_else(|| Error::new(Code::NoSuchKey, format!("record {id} not found in {}", self.ns_string())))?;
        let d = decode_doc(&bytes)?;
        Ok((bytes, d))
    }
}

pub(crate) struct Pending {
    pub(crate) batch: Batch,
    pub(crate) stats: Stats,
    /// Stored keys of unique indexes added by this batch.
    pub(crate) unique_keys: HashSet<Vec<u8>>,
    pub(crate) data_delta: i64,
    /// Size of the last record encoded.
    pub(crate) record_size_hint_bytes: usize,
    /// Set when this collection's changes go to the oplog.
    pub(crate) log: Option<LogTarget>,
    /// Oplog entries describing this batch, stamped when it is applied.
    pub(crate) oplog: Vec<Vec<u8>>,
    /// The batch deletes records (`CollState::removals` moves once it is applied).
    pub(crate) removes: bool,
    /// How the batch is logged (the handle's).
    pub(crate) ctx: WriteCtx,
}

/// An update entry's bytes beyond its `o` when `o` is a diff (`{$v: 2, diff: …}`): a
/// pipeline update logs the diff only when it and this are smaller than the document.
const DIFF_ENTRY_OVERHEAD_BYTES: usize = 4 + 8 + 7 + 1;

/// What every oplog entry of one batch shares.
pub(crate) struct LogTarget {
    pub(crate) ns: String,
    pub(crate) ui: bson::Uuid,
    pub(crate) wall_ms: i64,
    /// The retryable write the entries belong to.
    pub(crate) session: Option<oplog::SessionTag>,
}

/// How `Shared::apply_logged_with` stamps a retryable write's batch.
pub(crate) struct SessionStamp {
    /// The transaction's newest entry before this batch (`OpTime::NULL` if none).
    pub(crate) prev: OpTime,
    /// The position in the batch of the put of the session's `config.transactions` record.
    pub(crate) record_op: usize,
}

/// MongoDB's shell-like rendering used in duplicate key messages: `{ _id: 1, a: "x" }`.
pub(crate) fn format_doc(d: &Document) -> String {
    if d.is_empty() {
        return "{}".to_string();
    }
    let parts: Vec<String> = d.iter().map(|(k, v)| format!("{k}: {}", format_value(v))).collect();
    format!("{{ {} }}", parts.join(", "))
}

pub(crate) fn format_value(v: &Bson) -> String {
    match v {
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        Bson::Double(d) => {
            if d.is_finite() && d.fract() == 0.0 && d.abs() < 1e15 {
                format!("{d:.1}")
            } else {
                d.to_string()
            }
        }
        Bson::String(s) => format!("{s:?}"),
        Bson::ObjectId(o) => format!("ObjectId('{}')", o.to_hex()),
        Bson::Boolean(b) => b.to_string(),
        Bson::Null => "null".to_string(),
        Bson::Undefined => "undefined".to_string(),
        Bson::MinKey => "MinKey".to_string(),
        Bson::MaxKey => "MaxKey".to_string(),
        Bson::Document(d) => format_doc(d),
        Bson::Array(a) => {
            if a.is_empty() {
                "[]".to_string()
            } else {
                format!("[ {} ]", a.iter().map(format_value).collect::<Vec<_>>().join(", "))
            }
        }
        Bson::DateTime(d) => format!("new Date({})", d.timestamp_millis()),
        Bson::Decimal128(d) => format!("NumberDecimal(\"{d}\")"),
        other => other.to_string(),
    }
}
