//! The internal commands a router runs on shards to migrate a chunk (mongod's
//! `_shardsvr*` and `_recvChunk*` family, in shoal's own shape). The router drives a
//! migration (`router::migrate`); the shards do the data work:
//!
//! - `_addShard`: tell a shard its name and the config servers (`sharding::ShardingState`).
//! - `_shardsvrCleanupRange`: delete the documents of a key range this shard does not own
//!   (checked with the config servers): the recipient's leftovers before a migration, the
//!   donor's copies after one commits, the recipient's clone after one aborts.
//! - On the donor: `_shardsvrMigrateStart` notes where its oplog is and starts a migration
//!   source; `_shardsvrMigrateClone` returns the range's documents a batch at a time;
//!   `_shardsvrTransferMods` returns what changed in the range since (read from the oplog:
//!   each touched `_id`'s document as it is now, or its deletion);
//!   `_shardsvrEnterCriticalSection` stops writes to the collection and waits for those
//!   admitted; `_shardsvrExitCriticalSection` lets them go on after the commit or abort.
//! - On the recipient: `_recvChunkApply` upserts documents and deletes `_id`s, only ever
//!   within the range, and logs the retryable writes' history that came with them.
//!
//! A retryable write's history moves with its documents, as mongod's session migration
//! does: a client whose write ran on the donor, and whose reply was lost, retries on the
//! recipient once the chunk has moved, and must find its statements executed there (else an
//! `$inc` runs twice, or an insert fails as a duplicate). The donor sends, for each session
//! whose newest transaction touched the range, that transaction's entries in the range
//! (`retry::history`): the clone sends every session's, from `config.transactions`, and
//! each transferMods those of the sessions that wrote since. The recipient logs them in
//! the same session and transaction (`retry::RetryTable::import`).
//!
//! Each is idempotent, so a router may send one again after a lost reply.

use super::Ctx;
use bson::{doc, oid::ObjectId, Bson, Document};
use common::{Code, Error, Result};
use parking_lot::Mutex;
use shard::{key::cmp_keys, Key, ShardKeyPattern};
use std::cmp::Ordering;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use storage::RecordId;

/// Bytes of documents a clone or transferMods reply carries at most (well below the 16 MiB
/// of a reply, 48 MiB of a message).
const MIGRATE_BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Whether a reply holding `bytes` takes a document of `size` more: its first always, the
/// others within MIGRATE_BATCH_BYTES_MAX. So a reply (and the `_recvChunkApply` that passes
/// it on) is never much larger than its largest document, within the wire's limit.
fn fits(bytes: usize, size: usize) -> bool {
    bytes == 0 || bytes + size <= MIGRATE_BATCH_BYTES_MAX
}

/// Records a clone batch or a range deletion reads per step.
const SCAN_STEP_DOCS: usize = 1000;
/// Oplog entries one transferMods reads at most.
const MODS_ENTRIES_MAX: usize = 20_000;
/// Session records the clone's pass over `config.transactions` reads per step (each one's
/// history is walked).
const SESSIONS_STEP: usize = 100;

/// A migration this shard is the donor of.
pub struct MigrationSource {
    pub id: ObjectId,
    db: String,
    coll: String,
    key: ShardKeyPattern,
    min: Key,
    max: Key,
    state: Mutex<SourceState>,
}

struct SourceState {
    /// The last record the clone returned.
    clone_after: Option<RecordId>,
    clone_done: bool,
    /// The last oplog entry read (its record id, the entry's timestamp).
    oplog_after: RecordId,
    /// Retryable writes' entries to send, a session's transaction's in order.
    sessions: VecDeque<SessionEntry>,
    /// The last `config.transactions` record the clone's pass read, and whether it read them
    /// all.
    sessions_after: Option<RecordId>,
    sessions_done: bool,
}

/// One entry of a session's transaction to send the recipient.
struct SessionEntry {
    lsid: Vec<u8>,
    txn: i64,
    entry: Document,
}

fn in_range(k: &[Bson], min: &[Bson], max: &[Bson]) -> bool {
    cmp_keys(min, k) != Ordering::Greater && (cmp_keys(k, max) == Ordering::Less || max.iter().all(|v| matches!(v, Bson::MaxKey)))
}

impl MigrationSource {
    fn holds(&self, doc: &Document) -> bool {
        self.key.key_of_doc(doc).is_ok_and(|k| in_range(&k, &self.min, &self.max))
    }

    /// Queue the statements of session `lsid`'s newest transaction that touched the range:
    /// those with an entry whose document is in it, or not known from the entry (a delete's
    /// `o` holds only the `_id`, an update's diff only what changed; sending more history than needed is harmless, since a retry
    /// of a statement only ever reaches the shard that owns its document). A history no
    /// longer complete here is not sent: a retry of it would fail here too.
    fn queue_history(&self, store: &storage::Store, lsid: &[u8], queue: &mut VecDeque<SessionEntry>) -> Result<()> {
        let (txn, entries) = match crate::retry::history(store, lsid) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(()),
            Err(e) if e.code == Code::IncompleteTransactionHistory.0 => return Ok(()),
            Err(e) => return Err(e),
        };
        let ns = format!("{}.{}", self.db, self.coll);
        let ours = |e: &Document| e.get_str("ns").ok() == Some(ns.as_str());
        let touched: HashSet<i32> = entries
            .iter()
            .filter(|(_, e)| {
                let in_range = match e.get_str("op") {
                    // An update's diff does not name the document's shard key.
                    Ok("u") if e.get_document("o").is_ok_and(|o| storage::diff::of_update_entry(o).is_some()) => true,
                    Ok("i" | "u" | "n") => e.get_document("o").is_ok_and(|d| self.holds(d)),
                    _ => true,
                };
                ours(e) && in_range
            })
            .map(|(stmt, _)| *stmt)
            .collect();
        for (stmt, entry) in entries {
            if ours(&entry) && touched.contains(&stmt) {
                queue.push_back(SessionEntry { lsid: lsid.to_vec(), txn, entry });
            }
        }
        Ok(())
    }

    /// Session history for a reply that holds `bytes` already, up to the batch size:
    /// queued entries, and when `scan`, more from the next sessions' records (the clone's
    /// pass). As `[{lsid, txnNumber, entries}]`.
    fn session_batch(&self, ctx: &Ctx, st: &mut SourceState, bytes: &mut usize, scan: bool) -> Result<Vec<Document>> {
        let store = &ctx.shared.store;
        let mut out: Vec<Document> = Vec::new();
        let mut group: Option<(Vec<u8>, i64)> = None;
        loop {
            let Some(size) = st.sessions.front().map(|e| doc_size(&e.entry)) else {
                if !scan || st.sessions_done {
                    break;
                }
                ctx.op.check()?;
                let Some(records) = store.collection(storage::SESSION_RECORDS_DB, storage::SESSION_RECORDS_COLLECTION) else {
                    st.sessions_done = true;
                    break;
                };
                let page = records.snapshot().scan(st.sessions_after, SESSIONS_STEP)?;
                st.sessions_done = page.len() < SESSIONS_STEP;
                for (rid, record) in page {
                    st.sessions_after = Some(rid);
                    if let Some(lsid) = session_id(record.get_document("_id").ok()) {
                        self.queue_history(store, lsid, &mut st.sessions)?;
                    }
                }
                continue;
            };
            if !fits(*bytes, size) {
                break;
            }
            let Some(e) = st.sessions.pop_front() else { break };
            *bytes += size;
            let same = group.as_ref().is_some_and(|(l, t)| *l == e.lsid && *t == e.txn);
            match out.last_mut().and_then(|g| g.get_array_mut("entries").ok()) {
                Some(entries) if same => entries.push(Bson::Document(e.entry)),
                _ => {
                    let lsid = bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: e.lsid.clone() };
                    out.push(doc! {"lsid": {"id": lsid}, "txnNumber": e.txn, "entries": [e.entry]});
                    group = Some((e.lsid, e.txn));
                }
            }
        }
        Ok(out)
    }
}

/// The command's namespace (its first field, "db.coll"), after forgetting what an earlier
/// term as primary knew (`ShardingState::on_term`).
fn begin(ctx: &Ctx) -> Result<(String, String)> {
    if let Some(repl) = &ctx.shared.repl {
        ctx.shared.sharding.on_term(repl.term());
    }
    let ns = ctx.cmd.get_str(ctx.name).map_err(|_| Error::type_mismatch(format!("{} takes a namespace string", ctx.name)))?;
    match ns.split_once('.') {
        Some((d, c)) if !d.is_empty() && !c.is_empty() => Ok((d.to_string(), c.to_string())),
        _ => Err(Error::new(Code::InvalidNamespace, format!("Invalid namespace {ns}"))),
    }
}

/// The command names a database (no collection): movePrimary's critical section.
fn database_only(ctx: &Ctx) -> Option<String> {
    if let Some(repl) = &ctx.shared.repl {
        ctx.shared.sharding.on_term(repl.term());
    }
    ctx.cmd.get_str(ctx.name).ok().filter(|n| !n.is_empty() && !n.contains('.')).map(str::to_string)
}

fn migration_id(ctx: &Ctx) -> Result<ObjectId> {
    ctx.cmd.get_object_id("migrationId").map_err(|_| Error::location(40414, format!("BSON field '{}.migrationId' is missing but a required field", ctx.name)))
}

/// The command's `min` and `max` bounds as keys of `key`.
fn bounds(ctx: &Ctx, key: &ShardKeyPattern) -> Result<(Key, Key)> {
    let get = |f: &str| ctx.cmd.get_document(f).map_err(|_| Error::location(40414, format!("BSON field '{}.{f}' is missing but a required field", ctx.name)));
    let (min, max) = (key.key_of_bound(get("min")?)?, key.key_of_bound(get("max")?)?);
    if cmp_keys(&min, &max) != Ordering::Less {
        return Err(Error::bad_value("min must be below max"));
    }
    Ok((min, max))
}

/// This shard's metadata of `ns`, read again from the config servers.
fn fresh_metadata(ctx: &Ctx, ns: &str) -> Result<Arc<crate::sharding::CollMeta>> {
    let handle = tokio::runtime::Handle::current();
    handle.block_on(ctx.shared.sharding.refresh(ns))?.ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("{ns} is not sharded")))
}

fn source(ctx: &Ctx, ns: &str) -> Result<Arc<MigrationSource>> {
    let id = migration_id(ctx)?;
    match ctx.shared.sharding.sources.lock().get(ns) {
        Some(s) if s.id == id => Ok(s.clone()),
        _ => Err(Error::new(Code::IllegalOperation, format!("no migration {id} of {ns} is running on this shard (it restarted, or the migration ended)"))),
    }
}

/// The bytes of a session id, `{id: BinData}`.
fn session_id(lsid: Option<&Document>) -> Option<&[u8]> {
    match lsid?.get("id") {
        Some(Bson::Binary(b)) => Some(&b.bytes),
        _ => None,
    }
}

fn doc_size(d: &Document) -> usize {
    crate::exec::approx_doc_size(d)
}

/// `_addShard: 1, shardIdentity: {shardName, configsvrConnectionString}`.
pub fn add_shard(ctx: &mut Ctx) -> Result<Document> {
    let id =
        ctx.cmd.get_document("shardIdentity").map_err(|_| Error::location(40414, "BSON field '_addShard.shardIdentity' is missing but a required field"))?;
    let name = id.get_str("shardName").map_err(|_| Error::bad_value("shardIdentity.shardName must be a string"))?;
    let config = id.get_str("configsvrConnectionString").map_err(|_| Error::bad_value("shardIdentity.configsvrConnectionString must be a string"))?;
    if ctx.shared.repl.is_none() {
        return Err(Error::new(Code::IllegalOperation, "a shard must be a replica set member (--replSet)"));
    }
    ctx.shared.sharding.set_identity(name, config)?;
    Ok(Document::new())
}

/// `_shardsvrCleanupRange: ns, min, max`: delete the range's documents, which must be no
/// chunk's of this shard.
pub fn cleanup_range(ctx: &mut Ctx) -> Result<Document> {
    let (db, coll) = begin(ctx)?;
    let ns = format!("{db}.{coll}");
    let meta = fresh_metadata(ctx, &ns)?;
    let (min, max) = bounds(ctx, &meta.key)?;
    if meta.owns_any_of(&min, &max) {
        return Err(Error::new(Code::IllegalOperation, format!("this shard owns part of the range to clean up in {ns}")));
    }
    let Some(c) = ctx.store().collection(&db, &coll) else { return Ok(doc! {"deleted": 0}) };
    let mut deleted = 0i64;
    let mut after = None;
    loop {
        ctx.op.check()?;
        // The write lock for one step at a time: the shard's own writes go on between.
        let mut writer = c.writer();
        let page = writer.snapshot().scan(after, SCAN_STEP_DOCS)?;
        for (rid, d) in &page {
            if meta.key.key_of_doc(d).is_ok_and(|k| in_range(&k, &min, &max)) {
                writer.delete(*rid, d)?;
                deleted += 1;
            }
        }
        match page.last() {
            Some((rid, _)) if page.len() == SCAN_STEP_DOCS => after = Some(*rid),
            _ => break,
        }
    }
    Ok(doc! {"deleted": deleted})
}

/// `_shardsvrMigrateStart: ns, migrationId, min, max`: this shard must own exactly that
/// chunk. From here on the oplog says what changes in it.
pub fn migrate_start(ctx: &mut Ctx) -> Result<Document> {
    let (db, coll) = begin(ctx)?;
    let ns = format!("{db}.{coll}");
    let id = migration_id(ctx)?;
    let meta = fresh_metadata(ctx, &ns)?;
    let (min, max) = bounds(ctx, &meta.key)?;
    if !meta.owns_chunk(&min, &max) {
        return Err(Error::new(Code::StaleConfig, format!("the range to migrate is not a chunk of this shard in {ns}")));
    }
    let oplog_after = ctx.shared.store.oplog_last().ok_or_else(|| Error::new(Code::IllegalOperation, "a donor shard needs its oplog (a replica set)"))?.ts;
    let mut sources = ctx.shared.sharding.sources.lock();
    match sources.get(&ns) {
        Some(s) if s.id == id => return Ok(Document::new()),
        Some(s) => return Err(Error::new(Code::ConflictingOperationInProgress, format!("migration {} of {ns} is running on this shard", s.id))),
        None => {}
    }
    let state =
        Mutex::new(SourceState { clone_after: None, clone_done: false, oplog_after, sessions: VecDeque::new(), sessions_after: None, sessions_done: false });
    sources.insert(ns, Arc::new(MigrationSource { id, db, coll, key: meta.key.clone(), min, max, state }));
    Ok(Document::new())
}

/// `_shardsvrMigrateClone: ns, migrationId`: the next documents of the range, in record
/// order, then the sessions' history in it, and whether the clone is done.
pub fn migrate_clone(ctx: &mut Ctx) -> Result<Document> {
    let (db, coll) = begin(ctx)?;
    let src = source(ctx, &format!("{db}.{coll}"))?;
    let Some(c) = ctx.store().collection(&src.db, &src.coll) else { return Ok(doc! {"docs": [], "sessions": [], "done": true}) };
    let mut st = src.state.lock();
    let mut docs = Vec::new();
    let mut bytes = 0;
    let mut full = false;
    while !st.clone_done && !full {
        ctx.op.check()?;
        let page = c.snapshot().scan(st.clone_after, SCAN_STEP_DOCS)?;
        st.clone_done = page.len() < SCAN_STEP_DOCS;
        for (rid, d) in page {
            if src.holds(&d) {
                let size = doc_size(&d);
                if !fits(bytes, size) {
                    // This document and the rest of the page come with the next batch.
                    st.clone_done = false;
                    full = true;
                    break;
                }
                bytes += size;
                docs.push(d);
            }
            st.clone_after = Some(rid);
        }
    }
    let sessions = if st.clone_done { src.session_batch(ctx, &mut st, &mut bytes, true)? } else { Vec::new() };
    let done = st.clone_done && st.sessions_done && st.sessions.is_empty();
    Ok(doc! {"docs": docs, "sessions": sessions, "done": done})
}

/// `_shardsvrTransferMods: ns, migrationId`: the range's documents changed since the last
/// call (or the start): each touched `_id`'s document as it is now if it is in the range,
/// else its `_id` to delete; the history of the sessions that wrote to the collection
/// meanwhile; `more` when there is more to send now.
pub fn transfer_mods(ctx: &mut Ctx) -> Result<Document> {
    let (db, coll) = begin(ctx)?;
    let ns = format!("{db}.{coll}");
    let src = source(ctx, &ns)?;
    let oplog = ctx
        .shared
        .store
        .collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION)
        .ok_or_else(|| Error::new(Code::IllegalOperation, "a donor shard needs its oplog"))?;
    let c = ctx.store().collection(&src.db, &src.coll);
    let mut st = src.state.lock();
    // Entries past our position must all still be there.
    if let Some((oldest, _)) = oplog.snapshot().scan(None, 1)?.first() {
        if *oldest > st.oplog_after {
            return Err(Error::new(Code::OplogStartMissing, format!("the oplog rolled over past the migration of {ns}; it must start again")));
        }
    }
    let entries = oplog.tail_chunk(Some(st.oplog_after), MODS_ENTRIES_MAX)?;
    let more = entries.len() == MODS_ENTRIES_MAX;
    let (mut upserts, mut deletes) = (Vec::new(), Vec::new());
    let mut seen = HashSet::new();
    let mut sessions = HashSet::new();
    let mut bytes = 0;
    let mut last = st.oplog_after;
    let mut cut = false;
    for (rid, raw) in &entries {
        if bytes >= MIGRATE_BATCH_BYTES_MAX {
            cut = true;
            break;
        }
        let before = last;
        last = *rid;
        let e = bson::RawDocument::from_bytes(raw.as_ref()).map_err(|e| Error::internal(format!("an oplog entry is not BSON: {e}")))?;
        if e.get_str("ns").ok() != Some(ns.as_str()) {
            if e.get_str("op").ok() == Some("c") && e.get_str("ns").ok() == Some(&format!("{db}.$cmd")) {
                let o = e.get_document("o").ok();
                let names_coll = |f: &str| o.and_then(|o| o.get_str(f).ok()) == Some(coll.as_str());
                if names_coll("drop") || o.is_some_and(|o| o.get_str("renameCollection").ok() == Some(ns.as_str())) {
                    return Err(Error::new(Code::ConflictingOperationInProgress, format!("{ns} was dropped or renamed during its migration")));
                }
            }
            continue;
        }
        if let Ok(lsid) = e.get_document("lsid").and_then(|l| l.get_binary("id")) {
            sessions.insert(lsid.bytes.to_vec());
        }
        let holder = match e.get_str("op").ok() {
            Some("u") => e.get_document("o2").ok(),
            Some("i" | "d") => e.get_document("o").ok(),
            _ => None,
        };
        let Some(id) = holder.and_then(|h| h.get("_id").ok().flatten()) else { continue };
        let id = Bson::try_from(id).map_err(|e| Error::internal(format!("an oplog entry's _id: {e}")))?;
        let id_key = bson::RawDocumentBuf::try_from(&doc! {"_id": id.clone()}).map(|r| r.into_bytes()).unwrap_or_default();
        if !seen.insert(id_key) {
            continue;
        }
        let now = match &c {
            Some(c) => c.snapshot().find_by_id(&id)?.map(|(_, d)| d),
            None => None,
        };
        match now {
            Some(d) if src.holds(&d) => {
                let size = doc_size(&d);
                if !fits(bytes, size) {
                    // This entry comes with the next batch.
                    last = before;
                    cut = true;
                    break;
                }
                bytes += size;
                upserts.push(d);
            }
            _ => {
                bytes += 32;
                deletes.push(id);
            }
        }
    }
    st.oplog_after = last;
    for lsid in &sessions {
        src.queue_history(&ctx.shared.store, lsid, &mut st.sessions)?;
    }
    let sessions = src.session_batch(ctx, &mut st, &mut bytes, false)?;
    let more = more || cut || !st.sessions.is_empty();
    Ok(doc! {"upserts": upserts, "deletes": deletes, "sessions": sessions, "more": more})
}

/// `_shardsvrEnterCriticalSection: ns, migrationId`: no more writes to the collection here
/// until the migration commits or aborts; returns once the writes admitted before are done.
/// Given a database name instead, the same for its unsharded collections (movePrimary).
pub fn enter_critical_section(ctx: &mut Ctx) -> Result<Document> {
    if let Some(db) = database_only(ctx) {
        // movePrimary's: the database's unsharded collections. Transactions that wrote in
        // the database end before the copy reads (a commit after it would be lost with the
        // old copies), as in a migration's below.
        ctx.shared.sharding.enter_db_critical_section(&db, migration_id(ctx)?)?;
        let aborted = ctx.shared.txns.abort_writers_of(&db, None);
        if aborted > 0 {
            tracing::info!(aborted, "aborted transactions that wrote {db} for its movePrimary's critical section");
        }
        ctx.shared.store.wait_for_prepared_on(&db, None)?;
        return Ok(Document::new());
    }
    let (db, coll) = begin(ctx)?;
    let ns = format!("{db}.{coll}");
    let src = source(ctx, &ns)?;
    ctx.shared.sharding.enter_critical_section(&ns, src.id)?;
    // Transactions that wrote here commit after no statement of theirs: those in progress
    // are aborted, and prepared ones decided, before the last transfer reads the oplog.
    let aborted = ctx.shared.txns.abort_writers_of(&db, Some(&coll));
    if aborted > 0 {
        tracing::info!(aborted, "aborted transactions that wrote {ns} for its migration's critical section");
    }
    // (On failure the router aborts the migration, which ends the critical section.)
    ctx.shared.store.wait_for_prepared_on(&db, Some(&coll))?;
    Ok(Document::new())
}

/// `_shardsvrExitCriticalSection: ns, migrationId`: the migration is over (committed or
/// not): writes go on, and see the versions the config servers have now.
pub fn exit_critical_section(ctx: &mut Ctx) -> Result<Document> {
    if let Some(db) = database_only(ctx) {
        let exited = ctx.shared.sharding.exit_db_critical_section(&db, migration_id(ctx)?);
        return Ok(doc! {"exited": exited});
    }
    let (db, coll) = begin(ctx)?;
    let ns = format!("{db}.{coll}");
    let id = migration_id(ctx)?;
    let exited = ctx.shared.sharding.exit_critical_section(&ns, id);
    let mut sources = ctx.shared.sharding.sources.lock();
    if sources.get(&ns).is_some_and(|s| s.id == id) {
        sources.remove(&ns);
    }
    Ok(doc! {"exited": exited})
}

/// `_recvChunkApply: ns, migrationId, min, max, upserts, deletes, sessions`: the
/// recipient's side of a clone or transferMods batch. Only documents in the range are
/// written or deleted; a document of the same `_id` outside it (another chunk's, which this
/// shard owns) fails the migration rather than be overwritten. Then the sessions' history
/// is logged (`retry::RetryTable::import`).
pub fn recv_chunk_apply(ctx: &mut Ctx) -> Result<Document> {
    let (db, coll) = begin(ctx)?;
    let ns = format!("{db}.{coll}");
    let key_doc = ctx.cmd.get_document("key").map_err(|_| Error::location(40414, "BSON field '_recvChunkApply.key' is missing but a required field"))?;
    let key = ShardKeyPattern::parse(key_doc)?;
    let (min, max) = bounds(ctx, &key)?;
    let holds = |d: &Document| key.key_of_doc(d).is_ok_and(|k| in_range(&k, &min, &max));
    let c = ctx
        .shared
        .store
        .collection(&db, &coll)
        .ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("{ns} does not exist on the recipient (its indexes are created first)")))?;
    let array = |f: &str| ctx.cmd.get_array(f).map(|a| a.as_slice()).unwrap_or_default();
    if ctx.cmd.get_document("writeConcern").is_ok_and(|w| w.get_str("w").ok() == Some("majority")) {
        // The last transfer, in the donor's critical section (a test may hold it there).
        crate::fault::FINAL_TRANSFER_HANG.hold(|| ctx.op.check())?;
    }
    let (mut written, mut deleted) = (0i64, 0i64);
    let mut writer = c.writer();
    for d in array("upserts") {
        let Bson::Document(d) = d else { return Err(Error::type_mismatch("upserts must hold documents")) };
        if !holds(d) {
            return Err(Error::bad_value(format!("a migrated document is outside the range of {ns}")));
        }
        let id = d.get("_id").ok_or_else(|| Error::bad_value("a migrated document has no _id"))?;
        match writer.snapshot().find_by_id(id)? {
            Some((_, old)) if !holds(&old) => {
                return Err(Error::new(Code::DuplicateKey, format!("{ns} on the recipient has a document with _id {id} outside the migrated range")));
            }
            Some((rid, old)) if &old != d => writer.update(rid, &old, d, storage::UpdateForm::Replacement)?,
            Some(_) => {}
            None => {
                writer.insert(d)?;
            }
        }
        written += 1;
    }
    for id in array("deletes") {
        if let Some((rid, old)) = writer.snapshot().find_by_id(id)? {
            if holds(&old) {
                writer.delete(rid, &old)?;
                deleted += 1;
            }
        }
    }
    drop(writer);
    let term = ctx.shared.repl.as_ref().map_or(0, |r| r.term());
    let mut logged = 0i64;
    for s in array("sessions") {
        let bad = |what: &str| Error::bad_value(format!("_recvChunkApply.sessions: {what}"));
        let Bson::Document(s) = s else { return Err(bad("elements must be documents")) };
        let lsid = session_id(s.get_document("lsid").ok()).ok_or_else(|| bad("lsid.id must be binary"))?;
        let txn = s.get_i64("txnNumber").map_err(|_| bad("txnNumber must be a long"))?;
        let entries: Vec<(i32, Document)> = s
            .get_array("entries")
            .map_err(|_| bad("entries must be an array"))?
            .iter()
            .map(|e| match e {
                Bson::Document(e) => e.get_i32("stmtId").map(|stmt| (stmt, e.clone())).map_err(|_| bad("an entry has no stmtId")),
                _ => Err(bad("entries must be documents")),
            })
            .collect::<Result<_>>()?;
        logged += ctx.shared.retry.import(&ctx.shared.store, term, lsid, txn, &entries, &c)? as i64;
    }
    Ok(doc! {"written": written, "deleted": deleted, "sessionEntries": logged})
}
