//! The store: opening it, the catalog (create, drop, rename, list), durability, stats.

use super::*;

pub(crate) struct StoreInner {
    pub(crate) shared: Arc<Shared>,
    /// Serializes catalog changes (create, drop, rename).
    pub(crate) catalog: Mutex<()>,
    pub(crate) colls: RwLock<BTreeMap<(String, String), Arc<CollState>>>,
    pub(crate) ttl: Arc<TtlMonitor>,
}

impl Drop for StoreInner {
    fn drop(&mut self) {
        *self.ttl.stop.lock() = true;
        self.ttl.wake.notify_all();
        let handle = self.ttl.thread.lock().take();
        if let Some(h) = handle {
            // The monitor itself may drop the last reference at the end of a pass.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        // The oplog's collection refers back to `Shared`: break the cycle so the engine closes.
        *self.shared.oplog.write() = None;
    }
}

#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<StoreInner>,
    /// How writes through this handle are logged.
    pub(crate) ctx: WriteCtx,
}

impl Store {
    /// Open (or create) a durable store in `path`.
    pub fn open(path: &std::path::Path, opts: StoreOptions) -> Result<Store> {
        let engine = FjallEngine::open(path, opts.cache_size_bytes, opts.fsync)?;
        Store::open_with_engine(Arc::new(engine))
    }

    pub fn open_in_memory() -> Store {
        Store::empty(Arc::new(MemoryEngine::new()))
    }

    pub(crate) fn empty(engine: Arc<dyn Engine>) -> Store {
        let shared = Arc::new(Shared {
            engine,
            applied_seq: AtomicU64::new(0),
            write_listener: std::sync::OnceLock::new(),
            commit: Mutex::new(CommitState { synced_seq: 0, syncing: false }),
            commit_done: Condvar::new(),
            sync_count: AtomicU64::new(0),
            sync_us: AtomicU64::new(0),
            next_internal_id: AtomicU64::new(1),
            total_data_bytes: AtomicU64::new(0),
            builds: Mutex::new(Vec::new()),
            ttl_deleted: AtomicU64::new(0),
            ttl_passes: AtomicU64::new(0),
            oplog: RwLock::new(None),
            txn_owners: Mutex::new(HashMap::new()),
            txn_keys_owned: std::sync::atomic::AtomicUsize::new(0),
            txn_ended: Condvar::new(),
            next_txn_id: AtomicU64::new(1),
            history: Mutex::new(History::default()),
            clock_floor: AtomicU64::new(0),
            prepared: Mutex::new(Default::default()),
            has_prepared: AtomicBool::new(false),
            prepared_changed: Condvar::new(),
        });
        let ttl = Arc::new(TtlMonitor { enabled: AtomicBool::new(true), stop: Mutex::new(false), wake: Condvar::new(), thread: Mutex::new(None) });
        Store { inner: Arc::new(StoreInner { shared, catalog: Mutex::new(()), colls: RwLock::new(BTreeMap::new()), ttl }), ctx: WriteCtx::default() }
    }

    /// Open a store over any engine, loading its catalog and finishing interrupted drops.
    pub fn open_with_engine(engine: Arc<dyn Engine>) -> Result<Store> {
        let store = Store::empty(engine);
        let shared = store.inner.shared.clone();
        let snap = shared.engine.snapshot();
        let mut max_id = 0u64;
        let mut colls = BTreeMap::new();
        let mut total_data = 0u64;
        let (lo, hi) = prefix_bounds(&[CATALOG_META]);
        for kv in snap.iter(Space::Catalog, lo, hi, false) {
            let (_, v) = kv?;
            let d = decode_doc(&v)?;
            let id = d.get_i64("id").map_err(|_| corrupt("catalog entry without id"))? as u64;
            let db = d.get_str("db").map_err(|_| corrupt("catalog entry without db"))?.to_string();
            let name = d.get_str("name").map_err(|_| corrupt("catalog entry without name"))?.to_string();
            let uuid = match d.get("uuid") {
                Some(Bson::Binary(b)) => b.to_uuid().map_err(|_| corrupt("catalog uuid"))?,
                _ => return Err(corrupt("catalog entry without uuid")),
            };
            let options = d.get_document("options").cloned().unwrap_or_default();
            let mut indexes = Vec::new();
            for ix in d.get_array("indexes").map_err(|_| corrupt("catalog entry without indexes"))? {
                let Bson::Document(ix) = ix else { return Err(corrupt("catalog index entry")) };
                let iid = ix.get_i64("id").map_err(|_| corrupt("catalog index id"))? as u64;
                let spec = IndexSpec::from_spec(ix.get_document("spec").map_err(|_| corrupt("catalog index spec"))?.clone())?;
                max_id = max_id.max(iid);
                let rt = match IndexRt::new(iid, spec.clone()) {
                    Ok(rt) => rt,
                    Err(e) => {
                        // A partial filter this build cannot parse: index every document
                        // rather than refuse to open.
                        tracing::warn!("index {} of {db}.{name}: {e}; ignoring its partial filter", spec.name);
                        IndexRt::new(iid, IndexSpec { partial_filter: None, ..spec })?
                    }
                };
                indexes.push(Arc::new(rt));
            }
            max_id = max_id.max(id);
            let mut stats = match snap.get(Space::Catalog, &stats_key(id))? {
                Some(b) => Stats::from_bytes(&b)?,
                None => Stats::default(),
            };
            // Statistics of an index build a crash interrupted.
            stats.index_bytes.retain(|iid, _| indexes.iter().any(|i| i.id == *iid));
            stats.multikey.retain(|iid| indexes.iter().any(|i| i.id == *iid));
            total_data += stats.data_bytes;
            let st = CollState::new(&shared, id, &db, &name, MetaRt { uuid, options, indexes }, stats);
            colls.insert((db, name), st);
        }
        let mut garbage = Vec::new();
        let (lo, hi) = prefix_bounds(&[CATALOG_GARBAGE]);
        for kv in snap.iter(Space::Catalog, lo, hi, false) {
            let (k, _) = kv?;
            let (Some(&kind), Some(id)) = (k.get(1), k.get(2..).and_then(read_u64)) else { return Err(corrupt("garbage marker")) };
            max_id = max_id.max(id);
            garbage.push((kind, id));
        }
        drop(snap);
        shared.next_internal_id.store(max_id + 1, Ordering::SeqCst);
        shared.total_data_bytes.store(total_data, Ordering::SeqCst);
        *store.inner.colls.write() = colls;
        for (kind, id) in garbage {
            shared.collect_garbage(kind, id)?;
        }
        shared.commit_durable()?;
        Ok(store)
    }

    /// Sorted; a database exists iff it has at least one collection.
    pub fn database_names(&self) -> Vec<String> {
        let colls = self.inner.colls.read();
        let mut names: Vec<String> = colls.keys().map(|(db, _)| db.clone()).collect();
        names.dedup();
        names
    }

    /// Sorted by name.
    pub fn list_collections(&self, db: &str) -> Vec<CollectionMeta> {
        self.colls_in(db).iter().map(|c| c.meta_public()).collect()
    }

    pub(crate) fn colls_in(&self, db: &str) -> Vec<Arc<CollState>> {
        let colls = self.inner.colls.read();
        colls.range((db.to_string(), String::new())..).take_while(|((d, _), _)| d == db).map(|(_, c)| c.clone()).collect()
    }

    pub fn collection(&self, db: &str, name: &str) -> Option<Collection> {
        if let Some(st) = self.ctx.transaction().and_then(|t| t.created_collection(db, name)) {
            return Some(Collection { state: st, ctx: self.ctx.clone() });
        }
        self.inner.colls.read().get(&(db.to_string(), name.to_string())).map(|c| Collection { state: c.clone(), ctx: self.ctx.clone() })
    }

    /// Create explicitly: NamespaceExists if present; InvalidNamespace for bad names.
    pub fn create_collection(&self, db: &str, name: &str, options: Document) -> Result<Collection> {
        self.create_inner(db, name, options, false, None)
    }

    /// Create a collection with the UUID another member gave it, if it gave one: oplog
    /// application and initial sync, so that a collection has one UUID across the set, as
    /// in mongod. Implicit when `existing_ok` (an insert's entry for a missing collection).
    pub fn create_collection_as(&self, db: &str, name: &str, options: Document, uuid: Option<bson::Uuid>, existing_ok: bool) -> Result<Collection> {
        self.create_inner(db, name, options, existing_ok, uuid)
    }

    /// Implicit creation (insert into a missing collection).
    pub fn collection_or_create(&self, db: &str, name: &str) -> Result<Collection> {
        if let Some(c) = self.collection(db, name) {
            return Ok(c);
        }
        self.create_inner(db, name, Document::new(), true, None)
    }

    pub(crate) fn create_inner(&self, db: &str, name: &str, options: Document, existing_ok: bool, uuid: Option<bson::Uuid>) -> Result<Collection> {
        validate_ns(db, name)?;
        let _cat = self.inner.catalog.lock();
        if let Some(c) = self.collection(db, name) {
            if existing_ok {
                return Ok(c);
            }
            return Err(Error::new(Code::NamespaceExists, format!("Collection {db}.{name} already exists.")));
        }
        if let Some(txn) = self.ctx.transaction() {
            let st = txn.create_collection(db, name, options, uuid)?;
            return Ok(Collection { state: st, ctx: self.ctx.clone() });
        }
        self.create_locked(db, name, options, true, uuid)
    }

    /// Create a collection (the caller holds the catalog lock and checked that it is absent),
    /// with an `_id` index unless it is the oplog.
    pub(crate) fn create_locked(&self, db: &str, name: &str, options: Document, id_index: bool, uuid: Option<bson::Uuid>) -> Result<Collection> {
        let shared = &self.inner.shared;
        let id = shared.alloc_id();
        let indexes = if id_index { vec![Arc::new(IndexRt::new(shared.alloc_id(), IndexSpec::id_index())?)] } else { Vec::new() };
        // A new collection's UUID is random (Uuid::new): said by name, not as a "default".
        #[allow(clippy::unwrap_or_default)]
        let meta = MetaRt { uuid: uuid.unwrap_or_else(bson::Uuid::new), options, indexes };
        let stats = Stats { next_rid: 1, ..Stats::default() };
        let mut batch = Batch::new();
        batch.put(Space::Catalog, meta_key(db, name), encode_doc(&meta.to_doc(id, db, name))?);
        batch.put(Space::Catalog, stats_key(id), stats.to_bytes());
        let mut create = doc! {"create": name};
        create.extend(meta.options.clone());
        let entry = self.command_entry(db, Some(meta.uuid), &create)?;
        shared.apply_logged(batch, entry)?;
        let st = CollState::new(shared, id, db, name, meta, stats);
        let new_db = {
            let mut colls = self.inner.colls.write();
            let new_db = colls.range((db.to_string(), String::new())..).next().is_none_or(|((d, _), _)| d != db);
            colls.insert((db.to_string(), name.to_string()), st.clone());
            new_db
        };
        shared.commit_durable()?;
        self.ctx.note_created(db, name, new_db);
        Ok(Collection { state: st, ctx: self.ctx.clone() })
    }

    /// The oplog entry of a catalog command on `db`, or none when changes to `db` are not
    /// logged (no oplog, or the `local` database).
    pub(crate) fn command_entry(&self, db: &str, ui: Option<bson::Uuid>, o: &Document) -> Result<Vec<Vec<u8>>> {
        if db == OPLOG_DB || self.inner.shared.oplog.read().is_none() || self.ctx.is_replicated() {
            return Ok(Vec::new());
        }
        Ok(vec![oplog::command_entry(db, ui, o, oplog::wall_now_ms()).map_err(Error::bad_value)?])
    }

    /// Garbage markers and deletes that remove `coll` from the catalog (caller holds its
    /// write lock and the catalog lock).
    pub(crate) fn drop_ops(coll: &CollState, batch: &mut Batch, delete_meta: bool) -> Vec<(u8, u64)> {
        let (db, name) = coll.ns.read().clone();
        if delete_meta {
            batch.delete(Space::Catalog, meta_key(&db, &name));
        }
        let mut garbage = vec![(GARBAGE_COLLECTION, coll.id)];
        for idx in &coll.meta.read().indexes {
            garbage.push((GARBAGE_INDEX, idx.id));
        }
        for (kind, id) in &garbage {
            batch.put(Space::Catalog, garbage_key(*kind, *id), Vec::new());
        }
        garbage
    }

    pub(crate) fn finish_drop(&self, coll: &CollState, garbage: Vec<(u8, u64)>) -> Result<()> {
        let data = coll.stats.lock().data_bytes;
        let _ = self.inner.shared.total_data_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(data)));
        for (kind, id) in garbage {
            self.inner.shared.collect_garbage(kind, id)?;
        }
        Ok(())
    }

    /// False if absent; removes data and indexes.
    pub fn drop_collection(&self, db: &str, name: &str) -> Result<bool> {
        let cat = self.inner.catalog.lock();
        let Some(coll) = self.inner.colls.read().get(&(db.to_string(), name.to_string())).cloned() else {
            return Ok(false);
        };
        self.check_not_live_oplog(db, name)?;
        let guard = coll.lock_for_catalog_change()?;
        let mut batch = Batch::new();
        let garbage = Store::drop_ops(&coll, &mut batch, true);
        let uuid = coll.meta.read().uuid;
        let entry = self.command_entry(db, Some(uuid), &doc! {"drop": name})?;
        self.inner.shared.apply_logged(batch, entry)?;
        self.inner.shared.note_catalog_change(db, name);
        coll.dropped.store(true, Ordering::SeqCst);
        self.inner.colls.write().remove(&(db.to_string(), name.to_string()));
        drop(guard);
        drop(cat);
        self.finish_drop(&coll, garbage)?;
        self.inner.shared.commit_durable()?;
        Ok(true)
    }

    pub fn drop_database(&self, db: &str) -> Result<()> {
        for c in self.colls_in(db) {
            let name = c.ns.read().1.clone();
            self.drop_collection(db, &name)?;
        }
        // As mongod: each collection's drop, then the database's.
        let entry = self.command_entry(db, None, &doc! {"dropDatabase": 1})?;
        self.inner.shared.apply_logged(Batch::new(), entry)?;
        self.inner.shared.commit_durable()
    }

    /// The live oplog cannot be dropped or renamed (mongod: IllegalOperation).
    pub(crate) fn check_not_live_oplog(&self, db: &str, name: &str) -> Result<()> {
        if db == OPLOG_DB && name == OPLOG_COLLECTION && self.inner.shared.oplog.read().is_some() {
            return Err(Error::new(Code::IllegalOperation, "can't drop or rename the live oplog while replicating"));
        }
        Ok(())
    }

    /// NamespaceNotFound if the source is missing; NamespaceExists unless `drop_target`.
    pub fn rename_collection(&self, from_db: &str, from: &str, to_db: &str, to: &str, drop_target: bool) -> Result<()> {
        validate_ns(to_db, to)?;
        let shared = &self.inner.shared;
        let cat = self.inner.catalog.lock();
        let from_key = (from_db.to_string(), from.to_string());
        let to_key = (to_db.to_string(), to.to_string());
        let (src, target) = {
            let colls = self.inner.colls.read();
            (colls.get(&from_key).cloned(), colls.get(&to_key).cloned())
        };
        let Some(src) = src else {
            return Err(Error::new(Code::NamespaceNotFound, format!("Source collection {from_db}.{from} does not exist")));
        };
        if from_key == to_key {
            return Err(Error::new(Code::IllegalOperation, "Can't rename a collection to itself"));
        }
        if target.is_some() && !drop_target {
            return Err(Error::new(Code::NamespaceExists, "target namespace exists"));
        }
        self.check_not_live_oplog(from_db, from)?;
        self.check_not_live_oplog(to_db, to)?;
        let src_guard = src.lock_for_catalog_change()?;
        let target_guard = target.as_ref().map(|t| t.lock_for_catalog_change()).transpose()?;
        let mut batch = Batch::new();
        let garbage = match &target {
            Some(t) => Store::drop_ops(t, &mut batch, false),
            None => Vec::new(),
        };
        batch.delete(Space::Catalog, meta_key(from_db, from));
        let mut meta_guard = src.meta.write();
        let old = meta_guard.clone();
        // Across databases MongoDB copies into a new collection: a new UUID.
        let uuid = if from_db == to_db { old.uuid } else { bson::Uuid::new() };
        let new_meta = Arc::new(MetaRt { uuid, options: old.options.clone(), indexes: old.indexes.clone() });
        batch.put(Space::Catalog, meta_key(to_db, to), encode_doc(&new_meta.to_doc(src.id, to_db, to))?);
        let rename = doc! {
            "renameCollection": format!("{from_db}.{from}"), "to": format!("{to_db}.{to}"), "stayTemp": false,
            "dropTarget": target.as_ref().map_or(Bson::Boolean(false), |t| Bson::Binary(bson::Binary::from_uuid(t.meta.read().uuid))),
        };
        // Logged under the source database unless that is `local` (then under the target's).
        let log_db = if from_db == OPLOG_DB { to_db } else { from_db };
        let entry = self.command_entry(log_db, Some(old.uuid), &rename)?;
        shared.apply_logged(batch, entry)?;
        shared.note_catalog_change(from_db, from);
        shared.note_catalog_change(to_db, to);
        *meta_guard = new_meta;
        drop(meta_guard);
        *src.ns.write() = to_key.clone();
        {
            let mut colls = self.inner.colls.write();
            colls.remove(&from_key);
            colls.insert(to_key, src.clone());
        }
        if let Some(t) = &target {
            t.dropped.store(true, Ordering::SeqCst);
        }
        drop(target_guard);
        drop(src_guard);
        drop(cat);
        if let Some(t) = &target {
            self.finish_drop(t, garbage)?;
        }
        shared.commit_durable()
    }

    /// Change collection options (`collMod`, its fields after the first, checked by the
    /// caller): each replaces the option of its name, except that
    /// `changeStreamPreAndPostImages: {enabled: false}` removes that option, as mongod shows
    /// it. Logged as `{collMod: name, ...changes}`; writes that start after this returns see
    /// the new options.
    pub fn modify_collection(&self, db: &str, name: &str, changes: &Document) -> Result<()> {
        let shared = &self.inner.shared;
        let _cat = self.inner.catalog.lock();
        let Some(coll) = self.inner.colls.read().get(&(db.to_string(), name.to_string())).cloned() else {
            return Err(Error::new(Code::NamespaceNotFound, format!("ns does not exist: {db}.{name}")));
        };
        self.check_not_live_oplog(db, name)?;
        let _guard = coll.lock_for_catalog_change()?;
        let mut meta_guard = coll.meta.write();
        let old = meta_guard.clone();
        let mut options = old.options.clone();
        for (k, v) in changes {
            match (k.as_str(), v) {
                (crate::PRE_AND_POST_IMAGES_OPTION, Bson::Document(d)) if d.get_bool("enabled").ok() != Some(true) => {
                    options.remove(k);
                }
                _ => {
                    options.insert(k, v.clone());
                }
            }
        }
        let new_meta = Arc::new(MetaRt { uuid: old.uuid, options, indexes: old.indexes.clone() });
        let mut batch = Batch::new();
        batch.put(Space::Catalog, meta_key(db, name), encode_doc(&new_meta.to_doc(coll.id, db, name))?);
        let mut o = doc! {"collMod": name};
        o.extend(changes.clone());
        let entry = self.command_entry(db, Some(old.uuid), &o)?;
        shared.apply_logged(batch, entry)?;
        *meta_guard = new_meta;
        drop(meta_guard);
        shared.commit_durable()
    }

    /// Make every write applied so far durable; concurrent callers share one sync.
    pub fn commit_durable(&self) -> Result<()> {
        self.inner.shared.commit_durable()
    }

    /// A counter of applied write batches: a reader that saw it
    /// before looking for new data and finds none waits for the write listener
    /// (`set_write_listener`) to report a change.
    pub fn write_seq(&self) -> u64 {
        self.inner.shared.write_seq()
    }

    /// Call `f` after every applied batch (whenever `write_seq` moves),
    /// on the writing thread: it must be cheap and must not write. Set once; later calls are
    /// ignored.
    pub fn set_write_listener(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.inner.shared.write_listener.set(f);
    }

    /// Number of engine syncs performed (group commit observability; tests).
    pub fn sync_count(&self) -> u64 {
        self.inner.shared.sync_count.load(Ordering::Relaxed)
    }

    /// Time spent in engine syncs so far.
    pub fn sync_time_us(&self) -> u64 {
        self.inner.shared.sync_us.load(Ordering::Relaxed)
    }

    pub fn database_stats(&self, db: &str) -> DbStats {
        let mut s = DbStats::default();
        for c in self.colls_in(db) {
            let cs = Collection { state: c, ctx: WriteCtx::default() }.stats();
            s.collections += 1;
            s.objects += cs.count;
            s.data_size_bytes += cs.size_bytes;
            s.storage_size_bytes += cs.storage_size_bytes;
            s.indexes += cs.index_sizes.len() as u64;
            s.index_size_bytes += cs.index_sizes.iter().map(|(_, b)| *b).sum::<u64>();
        }
        s
    }

    /// Index builds in progress.
    pub fn index_builds(&self) -> Vec<IndexBuildProgress> {
        let builds = self.inner.shared.builds.lock().clone();
        builds
            .iter()
            .filter_map(|b| {
                let coll = b.coll.upgrade()?;
                Some(IndexBuildProgress {
                    ns: coll.ns_string(),
                    index_name: b.index_name.clone(),
                    done_records: b.done_records.load(Ordering::Relaxed),
                    total_records: b.total_records.load(Ordering::Relaxed),
                })
            })
            .collect()
    }

    /// On-disk size of the whole store (fjall); approximate bytes held (in-memory).
    pub fn storage_size_bytes(&self) -> u64 {
        self.inner.shared.engine.size_bytes()
    }
}
