//! Index creation and removal on a live collection: the build that does not block writers
//! (see the crate's docs), and the checks of a new index against the existing ones.

use super::*;

impl Collection {
    /// Build an index over existing documents. Ok(false) if an identical index exists.
    ///
    /// The build does not block writers: the index is first registered as building (writers
    /// maintain it from then on; readers and `CollectionMeta.indexes` do not see it), then
    /// existing records are indexed in chunks read without the write lock and applied under
    /// it only for records unchanged since they were read, then the index is made ready.
    pub fn create_index(&self, spec: IndexSpec) -> Result<bool> {
        let st = &self.state;
        st.check_not_oplog()?;
        validate_index_spec(&spec)?;
        let spec = IndexSpec { spec: spec.normalized_spec(), ..spec };
        if let Some(txn) = self.ctx.transaction() {
            // A secondary applying a committed transaction's entry again (after a restart)
            // finds the collection it created the first time: the index is built as usual.
            if self.ctx.is_replicated() && !txn.created(st) {
                return Collection { state: st.clone(), ctx: WriteCtx::replicated() }.create_index(spec);
            }
            return txn.create_index(st, spec);
        }
        let (idx, rid_end) = loop {
            let guard = st.lock_for_catalog_change()?;
            st.check_live()?;
            let meta = st.meta.read().clone();
            match check_new_index(&meta, &spec, st)? {
                NewIndex::Exists => return Ok(false),
                NewIndex::Building => {
                    // Like MongoDB, a request for an index being built waits for that build.
                    drop(guard);
                    std::thread::sleep(INDEX_BUILD_WAIT_POLL);
                    continue;
                }
                NewIndex::Absent => {}
            }
            let shared = &st.shared;
            let (rid_end, total) = {
                let stats = st.stats.lock();
                (stats.next_rid, stats.count)
            };
            let build = Arc::new(BuildState {
                coll: Arc::downgrade(st),
                index_name: spec.name.clone(),
                done_records: AtomicU64::new(0),
                total_records: AtomicU64::new(total),
                conflict: Mutex::new(None),
            });
            let mut idx = IndexRt::new(shared.alloc_id(), spec.clone())?;
            idx.build = Some(build.clone());
            let idx = Arc::new(idx);
            // The marker makes a crash mid-build delete the partial entries at the next open
            // (the catalog lists only ready indexes).
            let mut batch = Batch::new();
            batch.put(Space::Catalog, garbage_key(GARBAGE_INDEX, idx.id), Vec::new());
            shared.apply(batch)?;
            let mut indexes = meta.indexes.clone();
            indexes.push(idx.clone());
            *st.meta.write() = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
            shared.builds.lock().push(build);
            break (idx, rid_end);
        };
        let result = self.build_existing(&idx, rid_end).and_then(|()| self.finish_build(&idx));
        st.shared.unregister_build(&idx);
        match result {
            Ok(()) => Ok(true),
            Err(e) => {
                self.abort_build(&idx)?;
                Err(e)
            }
        }
    }

    /// Index the records with ids below `rid_end` (later ones were inserted after the index
    /// was registered, so writers indexed them).
    pub(crate) fn build_existing(&self, idx: &Arc<IndexRt>, rid_end: RecordId) -> Result<()> {
        let st = &self.state;
        let Some(build) = idx.build.as_ref() else { return Ok(()) };
        let end_key = record_key(st.id, rid_end);
        let mut next_rid: RecordId = 0;
        loop {
            // Unlocked: read and key a chunk from a fresh snapshot.
            let mut chunk = Vec::with_capacity(INDEX_BUILD_CHUNK_DOCS);
            {
                let snap = st.shared.engine.snapshot();
                let lower = Bound::Included(record_key(st.id, next_rid));
                for kv in snap.iter(Space::Records, lower, Bound::Excluded(end_key.clone()), false) {
                    let (k, v) = kv?;
                    let rid = read_u64(k.get(8..).unwrap_or(&[])).ok_or_else(|| corrupt("record key"))?;
                    let d = decode_doc(&v)?;
                    let (entries, multikey) = idx.entries(&d, rid)?;
                    chunk.push((rid, v, entries, multikey));
                    if chunk.len() >= INDEX_BUILD_CHUNK_DOCS {
                        break;
                    }
                }
            }
            let Some(last) = chunk.last().map(|c| c.0) else { return Ok(()) };
            next_rid = last.saturating_add(1);
            // Locked, briefly: records changed or deleted since the read were indexed by
            // their writers (the index was already registered); add the rest.
            let _guard = WriteGuard::acquire(st);
            self.check_build_alive(idx)?;
            let latest = st.shared.engine.snapshot();
            let mut pending = st.pending(&self.ctx);
            let mut added_bytes = 0u64;
            let mut multikey = false;
            let scanned = chunk.len() as u64;
            for (rid, bytes, entries, mk) in chunk {
                if latest.get(Space::Records, &record_key(st.id, rid))?.is_none_or(|b| b != bytes) {
                    continue;
                }
                multikey |= mk;
                for (stored, value) in entries {
                    if let Some(existing) = latest.get(Space::Index, &stored)? {
                        if idx.spec.unique && read_u64(&existing) != Some(rid) {
                            return Err(st.dup_error(idx, &value));
                        }
                        continue;
                    }
                    if idx.spec.unique && !pending.unique_keys.insert(stored.clone()) {
                        return Err(st.dup_error(idx, &value));
                    }
                    added_bytes += (stored.len() + value.len()) as u64;
                    pending.batch.put(Space::Index, stored, value);
                }
            }
            *pending.stats.index_bytes.entry(idx.id).or_insert(0) += added_bytes;
            if multikey {
                pending.stats.multikey.insert(idx.id);
            }
            st.commit_pending(pending)?;
            build.done_records.fetch_add(scanned, Ordering::Relaxed);
        }
    }

    /// Abort if the collection or the index was dropped, or a writer met a unique conflict.
    /// Caller holds the write lock.
    pub(crate) fn check_build_alive(&self, idx: &IndexRt) -> Result<()> {
        let st = &self.state;
        if st.dropped.load(Ordering::SeqCst) {
            return Err(Error::new(Code::IndexBuildAborted, format!("Index build aborted: {}: collection dropped", idx.spec.name)));
        }
        if !st.meta.read().indexes.iter().any(|i| i.id == idx.id) {
            return Err(Error::new(Code::IndexBuildAborted, format!("Index build aborted: {}: index dropped", idx.spec.name)));
        }
        if let Some(e) = idx.build.as_ref().and_then(|b| b.conflict.lock().clone()) {
            return Err(e);
        }
        Ok(())
    }

    /// Under the write lock: make the index ready and record it in the catalog.
    pub(crate) fn finish_build(&self, idx: &Arc<IndexRt>) -> Result<()> {
        let st = &self.state;
        let _guard = st.lock_for_catalog_change()?;
        self.check_build_alive(idx)?;
        let ready = Arc::new(IndexRt::new(idx.id, idx.spec.clone())?);
        let meta = st.meta.read().clone();
        let indexes = meta.indexes.iter().map(|i| if i.id == idx.id { ready.clone() } else { i.clone() }).collect();
        let new_meta = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
        let mut pending = st.pending(&self.ctx);
        let (db, name) = st.ns.read().clone();
        pending.batch.put(Space::Catalog, meta_key(&db, &name), encode_doc(&new_meta.to_doc(st.id, &db, &name))?);
        pending.batch.delete(Space::Catalog, garbage_key(GARBAGE_INDEX, idx.id));
        if let Some(log) = &pending.log {
            // Logged once the build is done: a member applying it builds the whole index.
            let mut o = doc! {"createIndexes": name.as_str()};
            o.extend(idx.spec.spec.clone());
            pending.oplog.push(oplog::command_entry(&db, Some(log.ui), &o, log.wall_ms).map_err(Error::bad_value)?);
        }
        let mut meta_guard = st.meta.write();
        st.commit_pending(pending)?;
        ready.ready_since.store(st.shared.engine.position(), Ordering::Relaxed);
        // Leave the list of builds before readers can see the index, so that no one sees it
        // both ready and building.
        st.shared.unregister_build(idx);
        *meta_guard = new_meta;
        Ok(())
    }

    /// Unregister a failed build and delete its entries (unless a drop already owns them).
    pub(crate) fn abort_build(&self, idx: &IndexRt) -> Result<()> {
        let st = &self.state;
        {
            let _guard = WriteGuard::acquire(st);
            if st.dropped.load(Ordering::SeqCst) {
                return Ok(());
            }
            let meta = st.meta.read().clone();
            if !meta.indexes.iter().any(|i| i.id == idx.id) {
                return Ok(());
            }
            let indexes = meta.indexes.iter().filter(|i| i.id != idx.id).cloned().collect();
            let new_meta = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
            let mut pending = st.pending(&self.ctx);
            pending.stats.index_bytes.remove(&idx.id);
            pending.stats.multikey.remove(&idx.id);
            let mut meta_guard = st.meta.write();
            st.commit_pending(pending)?;
            *meta_guard = new_meta;
        }
        st.shared.collect_garbage(GARBAGE_INDEX, idx.id)
    }

    /// IndexNotFound if absent; the `_id_` index cannot be dropped.
    pub fn drop_index(&self, name: &str) -> Result<()> {
        let st = &self.state;
        if name == ID_INDEX_NAME {
            return Err(Error::new(Code::InvalidOptions, "cannot drop _id index"));
        }
        let _guard = st.lock_for_catalog_change()?;
        st.check_live()?;
        let meta = st.meta.read().clone();
        // A build in progress is aborted by dropping its index.
        let Some(idx) = meta.indexes.iter().find(|i| i.spec.name == name).cloned() else {
            return Err(Error::new(Code::IndexNotFound, format!("index not found with name [{name}]")));
        };
        let indexes: Vec<Arc<IndexRt>> = meta.indexes.iter().filter(|i| i.id != idx.id).cloned().collect();
        let new_meta = Arc::new(MetaRt { uuid: meta.uuid, options: meta.options.clone(), indexes });
        let mut pending = st.pending(&self.ctx);
        pending.stats.index_bytes.remove(&idx.id);
        pending.stats.multikey.remove(&idx.id);
        let (db, coll) = st.ns.read().clone();
        pending.batch.put(Space::Catalog, meta_key(&db, &coll), encode_doc(&new_meta.to_doc(st.id, &db, &coll))?);
        pending.batch.put(Space::Catalog, garbage_key(GARBAGE_INDEX, idx.id), Vec::new());
        if let Some(log) = &pending.log {
            let o = doc! {"dropIndexes": coll.as_str(), "index": idx.spec.name.as_str()};
            pending.oplog.push(oplog::command_entry(&db, Some(log.ui), &o, log.wall_ms).map_err(Error::bad_value)?);
        }
        {
            let mut meta_guard = st.meta.write();
            st.commit_pending(pending)?;
            *meta_guard = new_meta;
        }
        st.shared.collect_garbage(GARBAGE_INDEX, idx.id)
    }
}

pub(crate) enum NewIndex {
    Absent,
    /// An identical index exists.
    Exists,
    /// An identical index is being built.
    Building,
}

/// Conflicts of a requested index with the existing ones (ready or building).
pub(crate) fn check_new_index(meta: &MetaRt, spec: &IndexSpec, st: &CollState) -> Result<NewIndex> {
    for existing in &meta.indexes {
        let e = &existing.spec;
        if e.name == spec.name {
            if e.key == spec.key {
                if e.same_options(spec) {
                    return Ok(if existing.ready() { NewIndex::Exists } else { NewIndex::Building });
                }
                return Err(Error::new(
                    Code::IndexOptionsConflict,
                    format!(
                        "An equivalent index already exists with the same name but different options. Requested index: {}, existing index: {}",
                        spec.spec, e.spec
                    ),
                ));
            }
            return Err(Error::new(
                Code::IndexKeySpecsConflict,
                format!("An existing index has the same name as the requested index. When index names are not specified, they are auto generated and can cause conflicts. Please refer to our documentation. Requested index: {}, existing index: {}", spec.spec, e.spec),
            ));
        }
        if e.key == spec.key && e.partial_filter == spec.partial_filter {
            if e.same_options(spec) {
                return Err(Error::new(Code::IndexOptionsConflict, format!("Index already exists with a different name: {}", e.name)));
            }
            return Err(Error::new(
                Code::IndexOptionsConflict,
                format!("An equivalent index already exists with a different name and options. Requested index: {}, existing index: {}", spec.spec, e.spec),
            ));
        }
    }
    if meta.indexes.len() >= INDEXES_PER_COLLECTION_MAX {
        return Err(Error::new(Code::CannotCreateIndex, format!("add index fails, too many indexes for {} key:{}", st.ns_string(), spec.key)));
    }
    Ok(NewIndex::Absent)
}

pub(crate) fn validate_index_spec(spec: &IndexSpec) -> Result<()> {
    if spec.name.is_empty() {
        return Err(Error::new(Code::CannotCreateIndex, "index name cannot be empty"));
    }
    if spec.key.is_empty() {
        return Err(Error::new(Code::CannotCreateIndex, "Index keys cannot be empty."));
    }
    for (field, dir) in &spec.key {
        let numeric_nonzero = match dir {
            Bson::Int32(i) => *i != 0,
            Bson::Int64(i) => *i != 0,
            Bson::Double(d) => *d != 0.0 && !d.is_nan(),
            Bson::Decimal128(_) => true,
            _ => false,
        };
        if let Bson::String(kind) = dir {
            if kind != keygen::HASHED {
                return Err(Error::new(Code::CannotCreateIndex, format!("Index type '{kind}' on field '{field}' is not supported")));
            }
        } else if !numeric_nonzero {
            return Err(Error::new(
                Code::CannotCreateIndex,
                format!("Values in the index key pattern can only be numbers or strings; bad key: {field}: {dir}"),
            ));
        }
        if field.is_empty() || field.split('.').any(str::is_empty) {
            return Err(Error::new(Code::CannotCreateIndex, format!("Index keys cannot be an empty field: {}", spec.key)));
        }
    }
    let hashed_fields = spec.key.values().filter(|d| keygen::is_hashed(d)).count();
    if hashed_fields > 0 {
        if spec.unique {
            return Err(Error::location(16764, "Currently hashed indexes cannot guarantee uniqueness. Use a regular index."));
        }
        if hashed_fields > 1 {
            return Err(Error::location(
                31303,
                format!("A maximum of one index field is allowed to be hashed but found {hashed_fields} for 'key' {}", format_doc(&spec.key)),
            ));
        }
    }
    if spec.unique && spec.key.keys().any(|k| k.contains("$")) {
        return Err(Error::new(Code::CannotCreateIndex, "index key cannot contain '$'"));
    }
    if let Some(f) = &spec.partial_filter {
        query::filter::Filter::parse(f)?;
    }
    Ok(())
}
