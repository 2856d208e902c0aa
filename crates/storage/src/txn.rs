//! Multi-document transactions: a snapshot, the transaction's own writes kept over it, and
//! one atomic commit.
//!
//! A [`Transaction`] reads one engine snapshot, taken when it began (snapshot isolation),
//! through a view that overlays its own writes (`Overlay`), so it reads what it wrote and
//! nothing committed after it began. Its writes run the ordinary write path (prepare under
//! the collection's write lock) through a handle whose `WriteCtx` names the transaction;
//! `CollState::commit_pending` hands the prepared batch to `Transaction::absorb` instead of
//! the engine.
//!
//! Conflicts are found when a transaction writes, first writer wins, as in WiredTiger: each
//! record and index key a transaction writes is registered to it in the store's owner table
//! (`Shared::txn_owners`). Another transaction writing an owned key, or a key whose newest
//! version is not the one its snapshot saw (committed since it began), fails with
//! WriteConflict at once. An ordinary write to an owned key fails with WriteConflict before
//! it applies anything, and its caller waits for the owner to end
//! (`Store::wait_for_transactions`) and runs again, so it is ordered after the transaction,
//! as mongod's writes are. Keys are registered under the collection's write lock, which
//! ordinary writers hold while they check, so neither misses the other.
//!
//! The commit takes the write locks of every collection written (in id order), refuses if
//! one was dropped or its indexes changed meanwhile (its index entries were prepared for
//! the indexes it saw), and writes the changes, each collection's statistics, the
//! transaction's one `applyOps` oplog entry and the session's `config.transactions` record
//! as one engine batch: it becomes visible and durable whole. The statistics a transaction
//! changes are kept as deltas and added to the collections' at commit; record ids are taken
//! from the collection's counter as it writes, so concurrent transactions never share one.

use super::*;
use crate::engine::{KvIter, KvPair};

/// Bytes of the operations one transaction may log (its changes are held in memory until
/// it ends).
pub const TRANSACTION_OPS_BYTES_MAX: usize = 256 << 20;
/// Bytes of operations per oplog entry: a transaction larger than one entry logs a chain of
/// entries (`partialTxn`), each one BSON document (one operation at least).
pub const TRANSACTION_ENTRY_OPS_BYTES_MAX: usize = BSON_OBJECT_SIZE_MAX_BYTES - 64 * 1024;

pub(crate) type Writes = BTreeMap<(Space, Vec<u8>), Option<Vec<u8>>>;

/// A multi-document transaction (see the module's doc). Ended by `commit` or `abort`;
/// dropping an open one aborts it.
pub struct Transaction {
    id: u64,
    shared: Arc<Shared>,
    /// The store's catalog (for the collections the transaction creates).
    store: Arc<StoreInner>,
    /// `config.transactions` and the session (`lsid`, `txnNumber`) when the commit logs.
    session: Option<(Arc<CollState>, oplog::SessionTag)>,
    state: Mutex<TxnState>,
}

struct TxnState {
    base: Arc<dyn EngineSnapshot>,
    /// The transaction's writes over `base` (None: deleted). Copied on write while a view
    /// (a cursor's snapshot) still holds the previous version.
    writes: Arc<Writes>,
    /// Collections written, by id.
    colls: BTreeMap<u64, Touched>,
    /// The `applyOps` operations, in order.
    ops: Vec<Vec<u8>>,
    ops_bytes: usize,
    /// Keys registered to this transaction in `Shared::txn_owners`.
    owned: Vec<Vec<u8>>,
    /// Collections the transaction created: seen only through it until it commits.
    created: BTreeMap<(String, String), Arc<CollState>>,
    open: bool,
    /// The prepare entry, once prepared (`prepared.rs`): no statement runs after it.
    prepared: Option<OpTime>,
}

/// How a commit logs its changes.
enum Logging<'a> {
    Unlogged,
    /// The transaction's operations, in `applyOps` entries.
    Ops(&'a Arc<CollState>, &'a oplog::SessionTag),
    /// A prepared transaction's commit entry at `commit_ts`, after the prepare entry.
    Decision {
        records: &'a Arc<CollState>,
        tag: &'a oplog::SessionTag,
        prepared: OpTime,
        commit_ts: u64,
    },
}

/// A collection a transaction wrote: its metadata as first written, and the statistics the
/// transaction changes.
struct Touched {
    coll: Arc<CollState>,
    meta: Arc<MetaRt>,
    /// The collection's statistics in the transaction's snapshot (read once).
    base_stats: Stats,
    count_delta: i64,
    data_delta: i64,
    index_delta: BTreeMap<u64, i64>,
    multikey: BTreeSet<u64>,
    removes: bool,
}

fn write_conflict() -> Error {
    Error::new(
        Code::WriteConflict,
        "Write conflict during plan execution and yielding is disabled. :: Please retry your operation or multi-document transaction.",
    )
}

/// The owner table's key of an engine key.
fn owner_key(space: Space, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(space as u8);
    k.extend_from_slice(key);
    k
}

fn add_delta(v: u64, d: i64) -> u64 {
    if d >= 0 {
        v.saturating_add(d as u64)
    } else {
        v.saturating_sub(d.unsigned_abs())
    }
}

impl Store {
    /// Begin a transaction over the newest data, or, through a handle reading at a past point
    /// (`reading_at`), over the data there. `session`: the `lsid` and `txnNumber` its
    /// commit logs, with the session's `config.transactions` record; required where the store
    /// keeps an oplog, unless this handle is replicated (a secondary applying a committed
    /// transaction's entry).
    pub fn begin_transaction(&self, session: Option<(&[u8], i64)>) -> Result<Arc<Transaction>> {
        let logs = self.inner.shared.oplog.read().is_some() && !self.ctx.is_replicated();
        let session = match (session, logs) {
            (Some((lsid, txn)), true) => {
                let records = self.collection_or_create(SESSION_RECORDS_DB, SESSION_RECORDS_COLLECTION)?;
                Some((records.state, oplog::SessionTag { lsid: lsid.to_vec(), txn }))
            }
            (None, true) => return Err(Error::internal("a logged transaction needs its session")),
            (_, false) => None,
        };
        let shared = self.inner.shared.clone();
        let state = TxnState {
            base: self.ctx.read_view().cloned().unwrap_or_else(|| shared.engine.snapshot()),
            writes: Arc::default(),
            colls: BTreeMap::new(),
            ops: Vec::new(),
            ops_bytes: 0,
            owned: Vec::new(),
            created: BTreeMap::new(),
            open: true,
            prepared: None,
        };
        let id = shared.next_txn_id.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(Transaction { id, shared, store: self.inner.clone(), session, state: Mutex::new(state) }))
    }

    /// This store, reading and writing in `txn`.
    pub fn in_transaction(&self, txn: &Arc<Transaction>) -> Store {
        Store { inner: self.inner.clone(), ctx: self.ctx.transaction_ctx(txn.clone()) }
    }

    /// Wait until some transaction ends, or `timeout` passes: an ordinary write that met a
    /// key a transaction owns (WriteConflict) waits here before it runs again.
    pub fn wait_for_transactions(&self, timeout: std::time::Duration) {
        let shared = &self.inner.shared;
        let mut owners = shared.txn_owners.lock();
        if owners.is_empty() {
            return;
        }
        shared.txn_ended.wait_for(&mut owners, timeout);
    }

    /// Keys open transactions own (for tests and serverStatus).
    pub fn transaction_keys_owned(&self) -> usize {
        self.inner.shared.txn_keys_owned.load(Ordering::SeqCst)
    }
}

impl Shared {
    /// An ordinary write's check: fails with WriteConflict if `batch` changes a key an open
    /// transaction owns.
    pub(crate) fn check_not_owned(&self, batch: &Batch) -> Result<()> {
        let owners = self.txn_owners.lock();
        for op in &batch.ops {
            let (BatchOp::Put(space, key, _) | BatchOp::Delete(space, key)) = op;
            if *space != Space::Catalog && owners.contains_key(&owner_key(*space, key)) {
                return Err(write_conflict());
            }
        }
        Ok(())
    }
}

impl Transaction {
    /// The transaction's view: its snapshot with its own writes.
    pub(crate) fn view(&self) -> Arc<dyn EngineSnapshot> {
        let s = self.state.lock();
        Arc::new(Overlay { base: s.base.clone(), writes: s.writes.clone() })
    }

    /// A collection this transaction created, by name.
    pub(crate) fn created_collection(&self, db: &str, name: &str) -> Option<Arc<CollState>> {
        self.state.lock().created.get(&(db.to_string(), name.to_string())).cloned()
    }

    /// Create collection `db.name` in this transaction (the caller checked that no
    /// collection has the name): visible through the transaction only, until it commits.
    pub(crate) fn create_collection(&self, db: &str, name: &str, options: Document, uuid: Option<bson::Uuid>) -> Result<Arc<CollState>> {
        let mut s = self.state.lock();
        s.check_writable()?;
        if options.get_bool("capped").unwrap_or(false) {
            return Err(Error::new(Code::OperationNotSupportedInTransaction, "Cannot create a capped collection in a multi-document transaction."));
        }
        let shared = &self.shared;
        let id = shared.alloc_id();
        let indexes = vec![Arc::new(IndexRt::new(shared.alloc_id(), IndexSpec::id_index())?)];
        #[allow(clippy::unwrap_or_default)]
        let meta = MetaRt { uuid: uuid.unwrap_or_else(bson::Uuid::new), options, indexes };
        let mut create = doc! {"create": name};
        create.extend(meta.options.clone());
        let op = oplog::command_op(db, Some(meta.uuid), &create).map_err(Error::bad_value)?;
        let stats = Stats { next_rid: 1, ..Stats::default() };
        let st = CollState::new(shared, id, db, name, meta, stats.clone());
        Arc::make_mut(&mut s.writes).insert((Space::Catalog, stats_key(id)), Some(stats.to_bytes()));
        if self.session.is_some() {
            s.ops_bytes += op.len();
            s.ops.push(op);
        }
        s.created.insert((db.to_string(), name.to_string()), st.clone());
        Ok(st)
    }

    /// Whether this transaction created `coll`.
    pub(crate) fn created(&self, coll: &Arc<CollState>) -> bool {
        self.state.lock().created.values().any(|c| Arc::ptr_eq(c, coll))
    }

    /// Add index `spec` to `coll`, which this transaction created and which is still empty
    /// (mongod's rule for indexes in a transaction).
    pub(crate) fn create_index(&self, coll: &Arc<CollState>, spec: IndexSpec) -> Result<bool> {
        let mut s = self.state.lock();
        s.check_writable()?;
        let ns = coll.ns_string();
        if !s.created.values().any(|c| Arc::ptr_eq(c, coll)) {
            return Err(Error::new(
                Code::OperationNotSupportedInTransaction,
                format!("Cannot create new indexes on existing collection {ns} in a multi-document transaction."),
            ));
        }
        if s.colls.get(&coll.id).is_some_and(|t| t.count_delta != 0) {
            return Err(Error::new(
                Code::OperationNotSupportedInTransaction,
                format!("Cannot create new indexes on non-empty collection {ns} in a multi-document transaction."),
            ));
        }
        let meta = coll.meta.read().clone();
        if meta.indexes.iter().any(|i| i.spec.key == spec.key && i.spec.name == spec.name) {
            return Ok(false);
        }
        if meta.indexes.iter().any(|i| i.spec.name == spec.name || i.spec.key == spec.key) {
            return Err(Error::new(Code::IndexOptionsConflict, format!("An index with the same name or key already exists on {ns}")));
        }
        let idx = Arc::new(IndexRt::new(self.shared.alloc_id(), spec.clone())?);
        let mut indexes = meta.indexes.clone();
        indexes.push(idx);
        let new_meta = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
        *coll.meta.write() = new_meta.clone();
        if let Some(t) = s.colls.get_mut(&coll.id) {
            t.meta = new_meta;
        }
        if self.session.is_some() {
            let (db, name) = coll.ns.read().clone();
            let mut o = doc! {"createIndexes": name};
            o.extend(spec.spec.clone());
            let op = oplog::command_op(&db, Some(meta.uuid), &o).map_err(Error::bad_value)?;
            s.ops_bytes += op.len();
            s.ops.push(op);
        }
        Ok(true)
    }

    /// Whether the transaction wrote collection `db.name` (with `None`, any collection of `db`).
    pub fn wrote(&self, db: &str, name: Option<&str>) -> bool {
        self.state.lock().colls.values().any(|t| {
            let ns = t.coll.ns.read();
            ns.0 == db && name.is_none_or(|n| ns.1 == n)
        })
    }

    /// Whether the transaction has written nothing (so far).
    pub fn is_read_only(&self) -> bool {
        self.state.lock().colls.is_empty()
    }

    /// Take a write prepared in this transaction (`CollState::commit_pending`): check and
    /// register its keys, keep its changes, operations and statistics.
    pub(crate) fn absorb(&self, coll: &Arc<CollState>, pending: Pending) -> Result<()> {
        let mut s = self.state.lock();
        s.check_writable()?;
        if coll.meta.read().options.get_bool("capped").unwrap_or(false) {
            return Err(Error::new(
                Code::OperationNotSupportedInTransaction,
                format!("Collection '{}' is a capped collection. Writes in transactions are not allowed on capped collections.", coll.ns_string()),
            ));
        }
        let mut ops_bytes = s.ops_bytes;
        let mut ops = Vec::with_capacity(pending.oplog.len());
        for e in &pending.oplog {
            let op = oplog::inner_op(e).map_err(|e| Error::internal(format!("a transaction's operation: {e}")))?;
            ops_bytes += op.len();
            ops.push(op);
        }
        if ops_bytes > TRANSACTION_OPS_BYTES_MAX {
            return Err(Error::new(
                Code::TransactionTooLarge,
                format!("Total size of all transaction operations must be less than {TRANSACTION_OPS_BYTES_MAX}"),
            ));
        }
        // Check and register every key before changing anything (under the collection's
        // write lock, which ordinary writers hold while they check).
        let latest = self.shared.engine.snapshot();
        {
            let mut owners = self.shared.txn_owners.lock();
            for op in &pending.batch.ops {
                let (BatchOp::Put(space, key, _) | BatchOp::Delete(space, key)) = op;
                if *space == Space::Catalog {
                    continue;
                }
                let k = owner_key(*space, key);
                match owners.get(&k) {
                    Some(id) if *id == self.id => continue,
                    Some(_) => return Err(write_conflict()),
                    None => {}
                }
                // Written since the snapshot (a value from a later batch, or none where the
                // snapshot saw one): another writer got there first.
                let changed = match latest.written_at(*space, key)? {
                    Some(at) => at > s.base.position(),
                    None => s.base.get(*space, key)?.is_some(),
                };
                if changed {
                    return Err(write_conflict());
                }
                owners.insert(k.clone(), self.id);
                s.owned.push(k);
            }
            self.shared.txn_keys_owned.store(owners.len(), Ordering::SeqCst);
        }
        s.ops.append(&mut ops);
        s.ops_bytes = ops_bytes;
        // Statistics: the prepared ones started from the collection's (unchanged since: the
        // write lock is held); keep the difference, take the record ids it used.
        if !s.colls.contains_key(&coll.id) {
            let base_stats = match s.base.get(Space::Catalog, &stats_key(coll.id))? {
                Some(b) => Stats::from_bytes(&b)?,
                None => Stats::default(),
            };
            s.colls.insert(
                coll.id,
                Touched {
                    coll: coll.clone(),
                    meta: coll.meta.read().clone(),
                    base_stats,
                    count_delta: 0,
                    data_delta: 0,
                    index_delta: BTreeMap::new(),
                    multikey: BTreeSet::new(),
                    removes: false,
                },
            );
        }
        {
            let mut live = coll.stats.lock();
            let t = s.colls.get_mut(&coll.id).expect("inserted above");
            t.count_delta += pending.stats.count as i64 - live.count as i64;
            t.data_delta += pending.stats.data_bytes as i64 - live.data_bytes as i64;
            for (id, b) in &pending.stats.index_bytes {
                *t.index_delta.entry(*id).or_insert(0) += *b as i64 - live.index_bytes.get(id).copied().unwrap_or(0) as i64;
            }
            t.multikey.extend(pending.stats.multikey.iter().copied());
            t.removes |= pending.removes;
            live.next_rid = live.next_rid.max(pending.stats.next_rid);
            // A flag the planner reads: set at once (harmless should the transaction abort).
            live.multikey.extend(pending.stats.multikey.iter().copied());
        }
        let view_stats = s.colls.get(&coll.id).map(|t| t.apply(&t.base_stats)).unwrap_or_default();
        let writes = Arc::make_mut(&mut s.writes);
        for op in pending.batch.ops {
            match op {
                BatchOp::Put(space, key, value) => writes.insert((space, key), Some(value)),
                BatchOp::Delete(space, key) => writes.insert((space, key), None),
            };
        }
        // The view's statistics (counts a read in the transaction sees).
        writes.insert((Space::Catalog, stats_key(coll.id)), Some(view_stats.to_bytes()));
        Ok(())
    }

    /// Commit: the transaction's changes, its oplog entry and its session's record as one
    /// engine batch. Returns the entry's optime (None for a transaction that wrote nothing,
    /// or one that logs nothing). A WriteConflict aborts it (a collection written was dropped
    /// or its indexes changed).
    pub fn commit(&self) -> Result<Option<OpTime>> {
        let mut s = self.state.lock();
        s.check_writable()?;
        let logging = match &self.session {
            Some((records, tag)) => Logging::Ops(records, tag),
            None => Logging::Unlogged,
        };
        let result = self.commit_locked(&mut s, logging);
        s.open = false;
        self.release(&mut s);
        result.map(|(at, _)| at)
    }

    /// Log the prepare entry (`prepare: true` on the last of the transaction's entries) and
    /// the session's record (`state: "prepared"`) in one write, applying none of the
    /// changes. Returns the entry's optime; None for a transaction that wrote nothing.
    pub(crate) fn prepare(&self) -> Result<Option<OpTime>> {
        let mut s = self.state.lock();
        s.check_writable()?;
        let Some((records, tag)) = &self.session else { return Err(Error::internal("only a logged transaction is prepared")) };
        if !s.created.is_empty() {
            return Err(Error::new(
                Code::OperationNotSupportedInTransaction,
                "Cannot create new collections inside distributed transactions (a transaction that writes on several shards)",
            ));
        }
        if s.ops.is_empty() {
            return Ok(None);
        }
        // The collections' indexes and names stay as the writes were prepared for until the
        // decision: checked under their write locks (in id order), then held
        // (`CollState::prepared_txns`).
        {
            let _guards: Vec<WriteGuard> = s.colls.values().map(|t| WriteGuard::acquire(&t.coll)).collect();
            for t in s.colls.values() {
                t.coll.check_live().map_err(|_| write_conflict())?;
                if !Arc::ptr_eq(&t.coll.meta.read(), &t.meta) {
                    return Err(write_conflict());
                }
            }
            s.hold_collections();
        }
        let _records_lock = WriteGuard::acquire(records);
        let wall_ms = oplog::wall_now_ms();
        let entries = chain(&s.ops, tag, true, wall_ms);
        let record = oplog::transaction_record(&tag.lsid, tag.txn, oplog::TxnRecordState::Prepared, OpTime::default(), wall_ms);
        let mut batch = Batch::new();
        let logged = records.prepare_session_record(&mut batch, record).and_then(|(record_op, rp)| {
            let at = self.shared.apply_logged_with(batch, entries, Some(SessionStamp { prev: OpTime::NULL, record_op }))?;
            records.publish_pending(rp);
            Ok(at)
        });
        match logged {
            Ok(Some(at)) => {
                s.prepared = Some(at);
                Ok(Some(at))
            }
            other => {
                s.release_collections();
                other.and(Err(Error::internal("a prepare logged no entry")))
            }
        }
    }

    /// This transaction was prepared by the entry at `at` (a secondary applying it).
    pub(crate) fn mark_prepared(&self, at: OpTime) -> Result<()> {
        let mut s = self.state.lock();
        s.check_writable()?;
        s.prepared = Some(at);
        s.hold_collections();
        Ok(())
    }

    /// The decision on this prepared transaction: commit at `commit_ts` (Some) or abort.
    /// `log`: the session's records, its tag and the prepare entry, where the decision is
    /// logged. Returns the decision entry's optime and, for a commit, the engine position
    /// after it with the transaction's writes.
    pub(crate) fn decide(
        &self,
        commit_ts: Option<u64>,
        log: Option<(Arc<CollState>, oplog::SessionTag, OpTime)>,
    ) -> Result<(Option<OpTime>, Option<(u64, Arc<Writes>)>)> {
        let mut s = self.state.lock();
        if !s.open || s.prepared.is_none() {
            return Err(Error::new(Code::NoSuchTransaction, "Transaction is not prepared"));
        }
        let result = match (commit_ts, &log) {
            (Some(commit_ts), Some((records, tag, prepared))) => {
                // The commit entry comes after the commit timestamp (this member's clock may be
                // behind the coordinator's choice, another participant's prepare): a read at a
                // point before the commit timestamp must not see it, here or elsewhere.
                self.shared.clock_floor.fetch_max(commit_ts, Ordering::AcqRel);
                self.commit_locked(&mut s, Logging::Decision { records, tag, prepared: *prepared, commit_ts })
            }
            (Some(_), None) => self.commit_locked(&mut s, Logging::Unlogged),
            (None, Some((records, tag, prepared))) => {
                let _records_lock = WriteGuard::acquire(records);
                let wall_ms = oplog::wall_now_ms();
                let record = oplog::transaction_record(&tag.lsid, tag.txn, oplog::TxnRecordState::Aborted, OpTime::default(), wall_ms);
                let mut batch = Batch::new();
                let (record_op, rp) = records.prepare_session_record(&mut batch, record)?;
                let entries = vec![oplog::decision_entry(None, tag, wall_ms)];
                let at = self.shared.apply_logged_with(batch, entries, Some(SessionStamp { prev: *prepared, record_op }))?;
                records.publish_pending(rp);
                Ok((at, 0))
            }
            (None, None) => Ok((None, 0)),
        };
        // A decision that failed to apply leaves the transaction prepared, to be decided again.
        let (at, position) = result?;
        let writes = s.writes.clone();
        s.open = false;
        self.release(&mut s);
        Ok((at, commit_ts.map(|_| (position, writes))))
    }

    /// Write the changes (and log them as `logging` says). Returns the last entry logged
    /// and the engine position after the write (read before the keys are released, so no
    /// other write to them comes between).
    fn commit_locked(&self, s: &mut TxnState, logging: Logging<'_>) -> Result<(Option<OpTime>, u64)> {
        if s.colls.is_empty() && s.created.is_empty() {
            return Ok((None, 0));
        }
        // The catalog lock first when the transaction creates collections, then collection
        // locks in id order (the order every catalog change and multi-collection writer
        // takes).
        let _catalog = (!s.created.is_empty()).then(|| self.store.catalog.lock());
        for (db, name) in s.created.keys() {
            if self.store.colls.read().contains_key(&(db.clone(), name.clone())) {
                return Err(write_conflict());
            }
        }
        let _guards: Vec<WriteGuard> = s.colls.values().map(|t| WriteGuard::acquire(&t.coll)).collect();
        for t in s.colls.values() {
            t.coll.check_live().map_err(|_| write_conflict())?;
            if !Arc::ptr_eq(&t.coll.meta.read(), &t.meta) {
                return Err(write_conflict());
            }
        }
        let mut batch = Batch::new();
        for ((space, key), value) in s.writes.iter() {
            if *space == Space::Catalog {
                continue;
            }
            match value {
                Some(v) => batch.put(*space, key.clone(), v.clone()),
                None => batch.delete(*space, key.clone()),
            }
        }
        for ((db, name), st) in &s.created {
            batch.put(Space::Catalog, meta_key(db, name), encode_doc(&st.meta.read().to_doc(st.id, db, name))?);
            if !s.colls.contains_key(&st.id) {
                batch.put(Space::Catalog, stats_key(st.id), st.stats.lock().to_bytes());
            }
        }
        let mut published = Vec::with_capacity(s.colls.len());
        for t in s.colls.values() {
            let stats = t.apply(&t.coll.stats.lock());
            batch.put(Space::Catalog, stats_key(t.coll.id), stats.to_bytes());
            published.push(stats);
        }
        let mut last = None;
        let logged = match logging {
            Logging::Ops(records, tag) if !s.ops.is_empty() => Some((records, tag, chain(&s.ops, tag, false, oplog::wall_now_ms()), OpTime::NULL)),
            Logging::Decision { records, tag, prepared, commit_ts } => {
                Some((records, tag, vec![oplog::decision_entry(Some(commit_ts), tag, oplog::wall_now_ms())], prepared))
            }
            _ => None,
        };
        match logged {
            Some((records, tag, entries, prev)) => {
                let _records_lock = WriteGuard::acquire(records);
                let record = oplog::transaction_record(&tag.lsid, tag.txn, oplog::TxnRecordState::Committed, OpTime::default(), oplog::wall_now_ms());
                let (record_op, rp) = records.prepare_session_record(&mut batch, record)?;
                last = self.shared.apply_logged_with(batch, entries, Some(SessionStamp { prev, record_op }))?;
                records.publish_pending(rp);
            }
            None => self.shared.apply(batch)?,
        }
        let position = self.shared.engine.position();
        if !s.created.is_empty() {
            let mut colls = self.store.colls.write();
            for (key, st) in std::mem::take(&mut s.created) {
                colls.insert(key, st);
            }
        }
        for (t, stats) in s.colls.values().zip(published) {
            if t.removes {
                t.coll.removals.fetch_add(1, Ordering::SeqCst);
            }
            *t.coll.stats.lock() = stats;
            let total = &self.shared.total_data_bytes;
            let _ = total.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(add_delta(v, t.data_delta)));
        }
        Ok((last, position))
    }

    /// Abort: forget the writes and free the keys. Ending an ended transaction does nothing.
    pub fn abort(&self) {
        let mut s = self.state.lock();
        s.open = false;
        self.release(&mut s);
    }

    /// Free the keys this transaction owns and wake the writers waiting for them.
    fn release(&self, s: &mut TxnState) {
        if s.prepared.take().is_some() {
            s.release_collections();
        }
        s.writes = Arc::default();
        for st in std::mem::take(&mut s.created).into_values() {
            st.dropped.store(true, Ordering::SeqCst);
        }
        if s.owned.is_empty() {
            return;
        }
        let mut owners = self.shared.txn_owners.lock();
        for k in s.owned.drain(..) {
            if owners.get(&k) == Some(&self.id) {
                owners.remove(&k);
            }
        }
        self.shared.txn_keys_owned.store(owners.len(), Ordering::SeqCst);
        self.shared.txn_ended.notify_all();
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        let mut s = self.state.lock();
        s.open = false;
        self.release(&mut s);
    }
}

/// A transaction's entries: its operations in entries of at most
/// `TRANSACTION_ENTRY_OPS_BYTES_MAX` bytes, the last with the count when there are several.
fn chain(ops: &[Vec<u8>], tag: &oplog::SessionTag, prepare: bool, wall_ms: i64) -> Vec<Vec<u8>> {
    let mut groups: Vec<&[Vec<u8>]> = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, op) in ops.iter().enumerate() {
        if i > start && bytes + op.len() > TRANSACTION_ENTRY_OPS_BYTES_MAX {
            groups.push(&ops[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += op.len() + 8;
    }
    groups.push(&ops[start..]);
    let n = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            let part = match (n, i + 1 == n) {
                (1, _) => oplog::ChainPart::Whole,
                (_, false) => oplog::ChainPart::Partial,
                (_, true) => oplog::ChainPart::Last { count: ops.len() },
            };
            oplog::transaction_entry(g, part, prepare && i + 1 == n, tag, wall_ms)
        })
        .collect()
}

impl Touched {
    /// `stats` with this transaction's changes.
    fn apply(&self, stats: &Stats) -> Stats {
        let mut out = stats.clone();
        out.count = add_delta(out.count, self.count_delta);
        out.data_bytes = add_delta(out.data_bytes, self.data_delta);
        for (id, d) in &self.index_delta {
            let b = out.index_bytes.entry(*id).or_insert(0);
            *b = add_delta(*b, *d);
        }
        out.multikey.extend(self.multikey.iter().copied());
        out
    }
}

/// `base` with `writes` over it.
pub(crate) fn overlay(base: Arc<dyn EngineSnapshot>, writes: Arc<Writes>) -> Arc<dyn EngineSnapshot> {
    Arc::new(Overlay { base, writes })
}

impl TxnState {
    /// Keep the collections written from catalog changes until the decision (`release`
    /// lets go).
    fn hold_collections(&self) {
        for t in self.colls.values() {
            t.coll.prepared_txns.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn release_collections(&self) {
        for t in self.colls.values() {
            t.coll.prepared_txns.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A statement or a commit may change this transaction: it is open and not prepared.
    fn check_writable(&self) -> Result<()> {
        if !self.open {
            return Err(Error::new(Code::NoSuchTransaction, "Transaction has ended"));
        }
        if self.prepared.is_some() {
            return Err(Error::new(Code::PreparedTransactionInProgress, "Cannot change a prepared transaction"));
        }
        Ok(())
    }
}

/// A snapshot with a transaction's writes over it.
struct Overlay {
    base: Arc<dyn EngineSnapshot>,
    writes: Arc<Writes>,
}

impl EngineSnapshot for Overlay {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.writes.get(&(space, key.to_vec())) {
            Some(v) => Ok(v.clone()),
            None => self.base.get(space, key),
        }
    }

    fn iter(&self, space: Space, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>, reverse: bool) -> KvIter<'_> {
        let start = match &lower {
            Bound::Included(k) => Bound::Included((space, k.clone())),
            Bound::Excluded(k) => Bound::Excluded((space, k.clone())),
            Bound::Unbounded => Bound::Included((space, Vec::new())),
        };
        let in_range = |k: &[u8]| match &upper {
            Bound::Included(u) => k <= u.as_slice(),
            Bound::Excluded(u) => k < u.as_slice(),
            Bound::Unbounded => true,
        };
        let mut mine: Vec<(Vec<u8>, Option<Vec<u8>>)> = self
            .writes
            .range((start, Bound::Unbounded))
            .take_while(|((s, k), _)| *s == space && in_range(k))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect();
        if reverse {
            mine.reverse();
        }
        let base = self.base.iter(space, lower, upper, reverse);
        Box::new(Merge { base: base.peekable(), mine: mine.into_iter().peekable(), reverse })
    }

    // The transaction's own writes have no position yet: these describe its snapshot.
    fn position(&self) -> u64 {
        self.base.position()
    }

    fn written_at(&self, space: Space, key: &[u8]) -> Result<Option<u64>> {
        self.base.written_at(space, key)
    }

    fn later(&self, position: u64) -> Arc<dyn EngineSnapshot> {
        self.base.later(position)
    }
}

/// Two ordered streams merged, the transaction's writes winning over the snapshot's keys.
struct Merge<'a> {
    base: std::iter::Peekable<KvIter<'a>>,
    mine: std::iter::Peekable<std::vec::IntoIter<(Vec<u8>, Option<Vec<u8>>)>>,
    reverse: bool,
}

impl Iterator for Merge<'_> {
    type Item = Result<KvPair>;

    fn next(&mut self) -> Option<Result<KvPair>> {
        loop {
            let take_mine = match (self.base.peek(), self.mine.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) => return self.base.next(),
                (None, Some(_)) => true,
                (Some(Ok(_)), None) => false,
                (Some(Ok((b, _))), Some((m, _))) => {
                    let order = if self.reverse { b.cmp(m) } else { m.cmp(b) };
                    match order {
                        std::cmp::Ordering::Less => true,
                        std::cmp::Ordering::Greater => false,
                        std::cmp::Ordering::Equal => {
                            self.base.next();
                            true
                        }
                    }
                }
            };
            if !take_mine {
                return self.base.next();
            }
            match self.mine.next() {
                Some((k, Some(v))) => return Some(Ok((k, v))),
                Some((_, None)) => continue,
                None => return None,
            }
        }
    }
}
