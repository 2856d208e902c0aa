//! Oplog application: make one MongoDB-shaped oplog entry take effect, idempotently, so that
//! applying an entry twice (a fetcher that restarts, an initial sync that overlaps the oplog
//! it then applies) leaves the same data as applying it once. This is what a secondary does
//! with each entry it fetches, and what the applyOps command does.
//!
//! Idempotence, as in mongod's oplog application: inserts and whole-document updates are
//! upserts by `_id`; deleting a missing document succeeds; catalog commands that already took
//! effect (create of an existing collection, drop of a missing one, an index that exists)
//! succeed.
//!
//! A secondary's batch (`apply_written`) of inserts, whole-document updates, deletes,
//! no-ops and whole transactions of these goes to the engine as each document's final state,
//! in one engine write with the oplog's applied-through point (`Store::apply_written`). Catalog commands, update
//! operators, and final states that move a unique key between documents are applied one
//! entry at a time (`apply_entry`), as the applyOps command applies its entries. The
//! `config.transactions` records of retryable writes travel in no entry of their own: each
//! member derives them from the entries' `lsid` and `txnNumber` (`session_record_of`), as
//! the primary wrote them with the entries.

use bson::{Bson, Document, RawDocument};
use common::{Code, Error, Result};
use query::filter::MatchDetails;
use query::update::Update;
use std::collections::HashMap;
use storage::{Collection, IndexSpec, OpTime, ReplicatedChange, Store};

/// Write a secondary's fetched batch into our oplog as it came (`logged`: each entry's
/// optime and BSON), ahead of applying it (`apply_written`). Entries are checked first as
/// decoding them would check them, so nothing invalid is logged.
pub fn write_fetched(store: &Store, logged: &[(OpTime, Vec<u8>)]) -> Result<()> {
    for (at, bytes) in logged {
        let entry = RawDocument::from_bytes(bytes).map_err(|e| Error::new(Code::InvalidBSON, format!("oplog entry {at:?} is not valid BSON: {e}")))?;
        // Logged and stored as they came, so checked as decoding them would check them.
        check_strings(entry)?;
    }
    store.write_oplog_replicated(logged)
}

/// Apply entries `write_fetched` wrote: the oldest written entries not yet applied, in
/// order; moves the applied-through point to the last of them. A batch of CRUD entries
/// whose updates are whole documents (what shoal logs) goes to the engine as one write of
/// each document's final state (`Store::apply_written`), read from the entries without
/// decoding them. Anything else (catalog commands, update operators), or a batch whose
/// final states move a unique key between documents, is decoded and applied entry by entry.
pub fn apply_written(store: &Store, logged: &[(OpTime, Vec<u8>)]) -> Result<()> {
    let Some(&(through, _)) = logged.last() else { return Ok(()) };
    // Applied, not logged again: our oplog has these entries as they came.
    let store = &store.replicated();
    let raw: Vec<&RawDocument> = logged
        .iter()
        .map(|(_, b)| RawDocument::from_bytes(b).map_err(|e| Error::new(Code::InvalidBSON, format!("oplog entry is not valid BSON: {e}"))))
        .collect::<Result<_>>()?;
    if raw.iter().all(|e| is_final_state(e)) {
        match store.apply_written(&final_states(store, &raw)?, through) {
            Ok(()) => return Ok(()),
            Err(e) if e.code == Code::DuplicateKey.0 => tracing::debug!("a batch moves a unique key: applying it entry by entry ({})", e.message),
            Err(e) => return Err(e),
        }
    }
    for (e, (at, _)) in raw.iter().zip(logged) {
        apply_fetched(store, e, *at)?;
    }
    store.apply_written(&[], through)
}

/// Apply every entry written and not yet applied (after a restart, or before this member
/// takes writes), in batches; returns how many. The caller holds the apply lock.
pub fn apply_unapplied(store: &Store) -> Result<u64> {
    let mut applied = 0u64;
    loop {
        let batch = store.oplog_unapplied(UNAPPLIED_BATCH_ENTRIES)?;
        if batch.is_empty() {
            return Ok(applied);
        }
        apply_written(store, &batch)?;
        applied += batch.len() as u64;
    }
}

/// Entries per batch when applying the written, unapplied tail of the oplog.
const UNAPPLIED_BATCH_ENTRIES: usize = 5000;

/// Apply one fetched entry (logged at `at` on the source), and the session record it
/// carries if it is a retryable write's.
fn apply_fetched(store: &Store, entry: &RawDocument, at: OpTime) -> Result<()> {
    let e = Document::try_from(entry).map_err(|err| Error::new(Code::InvalidBSON, format!("oplog entry {at:?} is not valid BSON: {err}")))?;
    apply_entry(store, &e).map_err(|err| Error::new(Code(err.code, err.code_name), format!("applying oplog entry {at:?} failed: {}", err.message)))?;
    if let Some(record) = session_record_of(entry, at)? {
        let doc = Document::try_from(record.as_ref()).map_err(|e| Error::internal(format!("session record: {e}")))?;
        upsert(&session_records(store)?, &doc, false)?;
    }
    Ok(())
}

/// The `config.transactions` record a retryable write's entry (logged at `at`) leaves, as
/// the primary wrote it with the entry (`storage::Store::begin_retryable_write`); `None` for
/// an entry of no session.
fn session_record_of(entry: &RawDocument, at: OpTime) -> Result<Option<bson::RawDocumentBuf>> {
    let Ok(lsid) = entry.get_document("lsid") else { return Ok(None) };
    let bad = |what: &str| Error::new(Code::FailedToParse, format!("oplog entry {at:?} has an lsid but no {what}"));
    let id = lsid.get_binary("id").map_err(|_| bad("binary lsid.id"))?;
    let txn = entry.get_i64("txnNumber").map_err(|_| bad("long txnNumber"))?;
    let wall_ms = entry.get_datetime("wall").map(|w| w.timestamp_millis()).unwrap_or(0);
    match transaction_state(entry) {
        Some(state) => Ok(Some(storage::transaction_session_record(id.bytes, txn, state, at, wall_ms))),
        None => Ok(Some(storage::session_record(id.bytes, txn, at, wall_ms))),
    }
}

/// The state a transaction's entry leaves its session's record in: an `applyOps` commits
/// (or prepares, with `prepare: true`); a decision's entry commits or aborts. None for a
/// retryable write's entry.
fn transaction_state(entry: &RawDocument) -> Option<storage::TxnRecordState> {
    if entry.get_str("op").ok()? != "c" {
        return None;
    }
    let o = entry.get_document("o").ok()?;
    let has = |k: &str| o.get(k).ok().flatten().is_some();
    if has("applyOps") {
        return Some(match o.get_bool("prepare").unwrap_or(false) {
            true => storage::TxnRecordState::Prepared,
            false => storage::TxnRecordState::Committed,
        });
    }
    if has("commitTransaction") {
        return Some(storage::TxnRecordState::Committed);
    }
    has("abortTransaction").then_some(storage::TxnRecordState::Aborted)
}

fn session_records(store: &Store) -> Result<Collection> {
    store.collection_or_create(storage::SESSION_RECORDS_DB, storage::SESSION_RECORDS_COLLECTION)
}

/// Whether `entry` leaves a document in a state of its own (insert, whole-document update,
/// delete), changes it by a diff (`{$v: 2, diff}`, applied to the state before it), or
/// changes nothing (no-op), so that a batch can be applied as each document's final state.
fn is_final_state(entry: &RawDocument) -> bool {
    match entry.get_str("op") {
        Ok("n" | "i" | "d") => true,
        Ok("u") => {
            entry.get_document("o").is_ok_and(|o| is_diff(o) || !o.into_iter().next().is_some_and(|f| f.is_ok_and(|(k, _)| k.as_str().starts_with('$'))))
        }
        // A whole transaction (not a chain's part) of such operations: the batch's one
        // engine write applies it whole.
        Ok("c") => transaction_ops(entry).is_some_and(|ops| ops.iter().all(|op| is_final_state(op))),
        _ => false,
    }
}

/// The operations of a committed transaction's entry that is a whole transaction
/// (`applyOps` on `admin.$cmd`, neither `partialTxn` nor the `count` of a chain's last).
/// Whether an update entry's `o` is a diff (`{$v: 2, diff: {…}}`).
fn is_diff(o: &RawDocument) -> bool {
    let v2 = match o.get("$v") {
        Ok(Some(bson::RawBsonRef::Int32(2) | bson::RawBsonRef::Int64(2))) => true,
        Ok(Some(bson::RawBsonRef::Double(v))) => v == 2.0,
        _ => false,
    };
    v2 && o.get_document("diff").is_ok()
}

fn transaction_ops(entry: &RawDocument) -> Option<Vec<&RawDocument>> {
    if entry.get_str("op").ok()? != "c" || entry.get_str("ns").ok()? != "admin.$cmd" {
        return None;
    }
    let o = entry.get_document("o").ok()?;
    if ["partialTxn", "count", "prepare"].iter().any(|k| o.get(k).ok().flatten().is_some()) {
        return None;
    }
    o.get_array("applyOps").ok()?.into_iter().map(|op| op.ok().and_then(|op| op.as_document())).collect()
}

/// Each collection's documents as `entries` (all `is_final_state`) leave them: the last
/// insert, whole-document update or delete of each `_id`. Collections that inserts or
/// updates name are created first, as `apply_entry` creates them.
fn final_states(store: &Store, entries: &[&RawDocument]) -> Result<Vec<(Collection, Vec<ReplicatedChange>)>> {
    struct Group {
        ns: String,
        coll: Option<Collection>,
        changes: Vec<ReplicatedChange>,
        /// A change's index in `changes` by its `_id`'s index key.
        by_id: HashMap<Vec<u8>, usize>,
    }
    let parse = |what: &str| Error::new(Code::FailedToParse, format!("oplog entry has no {what}"));
    let to_bson = |id| Bson::try_from(id).map_err(|e| Error::new(Code::InvalidBSON, format!("invalid _id in an oplog entry: {e}")));
    let mut groups: Vec<Group> = Vec::new();
    // Sessions' records (config.transactions), by lsid: the newest entry of each session.
    let mut sessions: Vec<ReplicatedChange> = Vec::new();
    let mut session_by_lsid: HashMap<Vec<u8>, usize> = HashMap::new();
    for entry in entries {
        // (`write_fetched` checked its strings.)
        let at = OpTime::from_raw(entry).ok_or_else(|| parse("ts and t"))?;
        if let Some(doc) = session_record_of(entry, at)? {
            let lsid = entry.get_document("lsid").and_then(|l| l.get_binary("id")).map(|b| b.bytes.to_vec()).unwrap_or_default();
            match session_by_lsid.get(&lsid) {
                Some(&i) => sessions[i] = ReplicatedChange::Put { doc },
                None => {
                    session_by_lsid.insert(lsid, sessions.len());
                    sessions.push(ReplicatedChange::Put { doc });
                }
            }
        }
        // A transaction's entry stands for its operations.
        let units = transaction_ops(entry).unwrap_or_else(|| vec![entry]);
        for entry in units {
            let op = entry.get_str("op").map_err(|_| parse("string field 'op'"))?;
            if op == "n" {
                continue;
            }
            let o = entry.get_document("o").map_err(|_| parse("object field 'o'"))?;
            let raw_id = o.get("_id").ok().flatten();
            let (change, id) = match (op, raw_id) {
                ("u", _) if is_diff(o) => {
                    let id = entry.get_document("o2").ok().and_then(|o2| o2.get("_id").ok().flatten()).ok_or_else(|| parse("o2._id (update)"))?;
                    let id = to_bson(id)?;
                    let diff = o.get_document("diff").map_err(|_| parse("o.diff"))?;
                    let diff = Document::try_from(diff).map_err(|e| Error::new(Code::InvalidBSON, format!("invalid update diff: {e}")))?;
                    (ReplicatedChange::Patch { id: id.clone(), diffs: vec![diff] }, id)
                }
                ("d", Some(id)) => {
                    let id = to_bson(id)?;
                    (ReplicatedChange::Delete { id: id.clone() }, id)
                }
                ("d", None) => return Err(parse("o._id (delete)")),
                (_, Some(id)) => {
                    let id = to_bson(id)?;
                    (ReplicatedChange::Put { doc: o.to_owned() }, id)
                }
                ("u", None) => {
                    // A whole document without its _id: the _id comes from o2, as apply_entry does.
                    let id = entry.get_document("o2").ok().and_then(|o2| o2.get("_id").ok().flatten()).ok_or_else(|| parse("o2._id (update)"))?;
                    let id = to_bson(id)?;
                    let mut doc = Document::try_from(o).map_err(|e| Error::new(Code::InvalidBSON, format!("invalid oplog entry: {e}")))?;
                    doc.insert("_id", id.clone());
                    let doc = bson::RawDocumentBuf::try_from(&doc).map_err(|e| Error::bad_value(format!("cannot encode a document: {e}")))?;
                    (ReplicatedChange::Put { doc }, id)
                }
                _ => return Err(parse("o._id (insert)")),
            };
            let mut key = Vec::with_capacity(16);
            storage::encode_component(&id, false, &mut key);
            let ns = entry.get_str("ns").map_err(|_| parse("string field 'ns'"))?;
            let g = match groups.iter().position(|g| g.ns == ns) {
                Some(i) => i,
                None => {
                    groups.push(Group { ns: ns.to_string(), coll: collection(store, ns, None)?, changes: Vec::new(), by_id: HashMap::new() });
                    groups.len() - 1
                }
            };
            let g = &mut groups[g];
            // A diff after the document's earlier change in this batch applies to that.
            let change = match (change, g.by_id.get(&key).map(|&i| &mut g.changes[i])) {
                (ReplicatedChange::Patch { diffs, .. }, Some(earlier)) => {
                    match earlier {
                        ReplicatedChange::Put { doc } => {
                            let mut d = Document::try_from(doc.as_ref()).map_err(|e| Error::new(Code::InvalidBSON, format!("invalid oplog entry: {e}")))?;
                            for diff in &diffs {
                                d = storage::diff::apply(&d, diff)?;
                            }
                            let doc = bson::RawDocumentBuf::try_from(&d).map_err(|e| Error::bad_value(format!("cannot encode a document: {e}")))?;
                            ReplicatedChange::Put { doc }
                        }
                        ReplicatedChange::Patch { diffs: before, .. } => {
                            before.extend(diffs);
                            continue;
                        }
                        // A diff of a deleted document changes nothing.
                        ReplicatedChange::Delete { .. } => continue,
                    }
                }
                (change, _) => change,
            };
            if g.coll.is_none() && matches!(change, ReplicatedChange::Put { .. }) {
                let ui = match entry.get_binary("ui") {
                    Ok(b) => Some(
                        <[u8; 16]>::try_from(b.bytes)
                            .map(bson::Uuid::from_bytes)
                            .map_err(|_| Error::new(Code::FailedToParse, "oplog entry field 'ui' is not a UUID"))?,
                    ),
                    Err(_) => None,
                };
                g.coll = collection(store, ns, Some(ui))?;
            }
            match g.by_id.get(&key) {
                Some(&i) => g.changes[i] = change,
                None => {
                    g.by_id.insert(key, g.changes.len());
                    g.changes.push(change);
                }
            }
        }
    }
    if !sessions.is_empty() {
        // The records are derived, not logged: a group for config.transactions holds only
        // direct writes to it, if any (a record written both ways in one batch is refused as
        // a duplicate key, and the batch is applied entry by entry).
        let ns = format!("{}.{}", storage::SESSION_RECORDS_DB, storage::SESSION_RECORDS_COLLECTION);
        match groups.iter_mut().find(|g| g.ns == ns) {
            Some(g) => {
                g.coll = Some(session_records(store)?);
                g.changes.extend(sessions);
            }
            None => groups.push(Group { ns, coll: Some(session_records(store)?), changes: sessions, by_id: HashMap::new() }),
        }
    }
    // Deletes in a collection that does not exist have nothing to delete.
    Ok(groups.into_iter().filter_map(|g| g.coll.map(|c| (c, g.changes))).collect())
}

/// An entry stored as it came from the sync source is checked as decoding it would check it:
/// the wire layer checked its structure, and reading each element checks its strings and
/// field names for UTF-8.
fn check_strings(doc: &RawDocument) -> Result<()> {
    let invalid = |e: bson::error::Error| Error::new(Code::InvalidBSON, format!("invalid document in an oplog entry: {e}"));
    let mut open: Vec<bson::raw::RawIter<'_>> = vec![doc.iter_elements()];
    while let Some(it) = open.last_mut() {
        let Some(element) = it.next() else {
            open.pop();
            continue;
        };
        match element.and_then(|e| e.value()).map_err(invalid)? {
            bson::RawBsonRef::Document(d) => open.push(d.iter_elements()),
            bson::RawBsonRef::Array(a) => open.push(a.iter_elements()),
            bson::RawBsonRef::JavaScriptCodeWithScope(c) => open.push(c.scope.iter_elements()),
            _ => {}
        }
    }
    Ok(())
}

/// Apply `entry`; the caller makes the result durable (`Store::commit_durable`).
pub fn apply_entry(store: &Store, entry: &Document) -> Result<()> {
    let op = entry.get_str("op").map_err(|_| Error::new(Code::FailedToParse, "oplog entry has no string field 'op'"))?;
    let ns = entry.get_str("ns").map_err(|_| Error::new(Code::FailedToParse, "oplog entry has no string field 'ns'"))?;
    let o = entry.get_document("o").map_err(|_| Error::new(Code::FailedToParse, "oplog entry has no object field 'o'"))?;
    // The collection's UUID on the member that logged the entry: a collection this creates
    // takes it, so a collection has one UUID across the set.
    let ui = match entry.get("ui") {
        Some(Bson::Binary(b)) => Some(b.to_uuid().map_err(|_| Error::new(Code::FailedToParse, "oplog entry field 'ui' is not a UUID"))?),
        _ => None,
    };
    match op {
        "n" => Ok(()),
        "i" => {
            let coll = collection(store, ns, Some(ui))?.expect("created");
            upsert(&coll, o, true)
        }
        "u" => {
            let id = entry
                .get_document("o2")
                .ok()
                .and_then(|o2| o2.get("_id"))
                .ok_or_else(|| Error::new(Code::FailedToParse, "update oplog entry has no o2._id"))?;
            let coll = collection(store, ns, Some(ui))?.expect("created");
            update(&coll, id, o)
        }
        "d" => {
            let id = o.get("_id").ok_or_else(|| Error::new(Code::FailedToParse, "delete oplog entry has no o._id"))?;
            let Some(coll) = collection(store, ns, None)? else { return Ok(()) };
            let mut w = coll.writer();
            if let Some((rid, old)) = w.snapshot().find_by_id(id)? {
                w.delete(rid, &old)?;
            }
            Ok(())
        }
        "c" if ns == "admin.$cmd" && o.contains_key("applyOps") => apply_transaction(store, entry, o),
        "c" if ns == "admin.$cmd" && (o.contains_key("commitTransaction") || o.contains_key("abortTransaction")) => apply_decision(store, entry, o),
        "c" => command(store, ns, o, ui),
        other => Err(Error::new(Code::FailedToParse, format!("unknown oplog operation type '{other}'"))),
    }
}

/// A committed transaction's entry (`applyOps` on `admin.$cmd`): its operations become
/// visible together, as one engine write (`storage::Transaction`), as they did on the
/// primary. A transaction too large for one entry logged a chain: the entries before the
/// last (`partialTxn`) apply nothing; the last (with `count`) applies the whole chain, read
/// back from the oplog through `prevOpTime`, where every entry of it was written before.
///
/// A prepared transaction's entry (`prepare: true`) applies its operations into a
/// transaction that is kept, prepared, until the decision's entry (`apply_decision`).
fn apply_transaction(store: &Store, entry: &Document, o: &Document) -> Result<()> {
    if o.get_bool("partialTxn").unwrap_or(false) {
        return Ok(());
    }
    if store.write_ctx().in_transaction() {
        return Err(Error::new(Code::FailedToParse, "applyOps cannot be nested in a transaction's applyOps"));
    }
    let prepare = o.get_bool("prepare").unwrap_or(false);
    let session = match prepare {
        true => Some(prepared_session(store, entry)?),
        false => None,
    };
    let ops_of = |o: &Document| o.get_array("applyOps").cloned().map_err(|_| Error::new(Code::FailedToParse, "applyOps needs an array of operations"));
    let mut chain = vec![ops_of(o)?];
    if o.contains_key("count") {
        let oplog = store
            .collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION)
            .ok_or_else(|| Error::new(Code::NamespaceNotFound, "a transaction's chain is applied from the oplog, and there is none"))?;
        let snap = oplog.snapshot();
        let mut prev = entry.get_document("prevOpTime").ok().and_then(OpTime::from_doc);
        while let Some(p) = prev.filter(|p| p.ts != 0) {
            let earlier = snap.get(p.ts)?.ok_or_else(|| Error::new(Code::NoSuchKey, format!("entry {p:?} of a transaction's chain is not in the oplog")))?;
            let eo = earlier.get_document("o").map_err(|_| Error::new(Code::FailedToParse, "a transaction's entry has no object field 'o'"))?;
            if !eo.get_bool("partialTxn").unwrap_or(false) {
                break;
            }
            chain.push(ops_of(eo)?);
            prev = earlier.get_document("prevOpTime").ok().and_then(OpTime::from_doc);
        }
        chain.reverse();
    }
    let txn = store.begin_transaction(None)?;
    let in_txn = store.in_transaction(&txn);
    for op in chain.iter().flatten() {
        let Bson::Document(op) = op else { return Err(Error::new(Code::FailedToParse, "an applyOps operation is not an object")) };
        apply_entry(&in_txn, op)?;
    }
    match session {
        Some((lsid, txn_number)) => {
            let at = OpTime::from_doc(entry).ok_or_else(|| Error::new(Code::FailedToParse, "a prepare entry has no ts and t"))?;
            store.note_prepared(txn, &lsid, txn_number, at)
        }
        None => txn.commit().map(|_| ()),
    }
}

/// The session (`lsid.id`, `txnNumber`) of a prepared transaction's entry, which only an
/// applier of the oplog applies (the applyOps command refuses it).
fn prepared_session(store: &Store, entry: &Document) -> Result<(Vec<u8>, i64)> {
    if !store.write_ctx().is_replicated() {
        return Err(Error::new(Code::CommandNotSupported, "applyOps does not apply the entries of prepared transactions"));
    }
    let lsid = match entry.get_document("lsid").ok().and_then(|l| l.get("id")) {
        Some(Bson::Binary(b)) => b.bytes.clone(),
        _ => return Err(Error::new(Code::FailedToParse, "a prepared transaction's entry has no lsid")),
    };
    let txn_number = entry.get_i64("txnNumber").map_err(|_| Error::new(Code::FailedToParse, "a prepared transaction's entry has no txnNumber"))?;
    Ok((lsid, txn_number))
}

/// The decision on a prepared transaction (`commitTransaction` with its `commitTimestamp`,
/// or `abortTransaction`). A transaction not kept prepared here was decided already (an
/// entry applied again after a restart): nothing to do.
fn apply_decision(store: &Store, entry: &Document, o: &Document) -> Result<()> {
    let (lsid, txn_number) = prepared_session(store, entry)?;
    if store.prepared_transaction(&lsid).is_none_or(|(n, _)| n != txn_number) {
        // Kept nowhere: decided already, unless its record says prepared (then it is
        // prepared again from its entry first).
        match prepared_record(store, &lsid)? {
            Some(record) if record.get_i64("txnNum").ok() == Some(txn_number) => recover_one(store, &record)?,
            _ => return Ok(()),
        }
    }
    match o.get("commitTransaction") {
        Some(_) => {
            let ts = o.get_timestamp("commitTimestamp").map_err(|_| Error::new(Code::FailedToParse, "a commitTransaction entry has no commitTimestamp"))?;
            store.commit_prepared(&lsid, txn_number, common::optime::ts_value(ts)).map(|_| ())
        }
        None => store.abort_prepared(&lsid, txn_number).map(|_| ()),
    }
}

/// Session records read at a time while looking for prepared transactions.
const RECOVER_SCAN_PAGE_DOCS: usize = 10_000;

/// Keep again, prepared, the transactions whose session records say `state: "prepared"`
/// (after a restart, a rollback or an initial sync): each one's operations are read back
/// from its prepare entry (and the chain before it). Returns how many.
pub fn recover_prepared(store: &Store) -> Result<usize> {
    let Some(records) = store.collection(storage::SESSION_RECORDS_DB, storage::SESSION_RECORDS_COLLECTION) else { return Ok(0) };
    if store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).is_none() {
        return Ok(0);
    }
    let mut found = 0;
    let mut prepared = Vec::new();
    let snap = records.snapshot();
    let mut after = None;
    loop {
        let page = snap.scan(after, RECOVER_SCAN_PAGE_DOCS)?;
        let Some(&(last, _)) = page.last() else { break };
        after = Some(last);
        prepared.extend(page.into_iter().map(|(_, d)| d).filter(|d| d.get_str("state").ok() == Some("prepared")));
    }
    for record in prepared {
        recover_one(store, &record)?;
        found += 1;
    }
    Ok(found)
}

/// The session's `config.transactions` record if it says `state: "prepared"`.
fn prepared_record(store: &Store, lsid: &[u8]) -> Result<Option<Document>> {
    let Some(records) = store.collection(storage::SESSION_RECORDS_DB, storage::SESSION_RECORDS_COLLECTION) else { return Ok(None) };
    let id = Bson::Document(bson::doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: lsid.to_vec() }});
    Ok(records.snapshot().find_by_id(&id)?.map(|(_, r)| r).filter(|r| r.get_str("state").ok() == Some("prepared")))
}

/// Keep prepared the transaction a `state: "prepared"` record names, from its prepare entry.
fn recover_one(store: &Store, record: &Document) -> Result<()> {
    let oplog = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).ok_or_else(|| Error::internal("no oplog"))?;
    let at =
        record.get_document("lastWriteOpTime").ok().and_then(OpTime::from_doc).ok_or_else(|| Error::internal("a prepared record without lastWriteOpTime"))?;
    let entry =
        oplog.snapshot().get(at.ts)?.ok_or_else(|| Error::internal(format!("the prepare entry {at:?} of a prepared transaction is not in the oplog")))?;
    let o = entry.get_document("o").map_err(|_| Error::internal("a prepare entry without o"))?;
    apply_transaction(&store.replicated(), &entry, o)
}

/// The operations logged before a transaction's `entry`, in order: a prepared
/// transaction's, which its decision (`commitTransaction`) decides, or those of a chain's
/// `partialTxn` entries before its last; read from the oplog through `prevOpTime`.
pub fn operations_before(store: &Store, entry: &Document) -> Result<Vec<Document>> {
    let oplog = store.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).ok_or_else(|| Error::internal("no oplog"))?;
    let snap = oplog.snapshot();
    // Newest entry first while walking back; put in log order at the end.
    let mut chunks: Vec<Vec<Document>> = Vec::new();
    let mut prev = entry.get_document("prevOpTime").ok().and_then(OpTime::from_doc);
    while let Some(p) = prev.filter(|p| p.ts != 0) {
        let Some(earlier) = snap.get(p.ts)? else {
            return Err(Error::new(
                Code::OplogStartMissing,
                format!("the prepare entry {p:?} of a commit to roll back is not in the oplog: this member needs a resync"),
            ));
        };
        let Ok(eo) = earlier.get_document("o") else { break };
        let Ok(inner) = eo.get_array("applyOps") else { break };
        chunks.push(inner.iter().filter_map(|op| op.as_document()).cloned().collect());
        prev = earlier.get_document("prevOpTime").ok().and_then(OpTime::from_doc);
    }
    Ok(chunks.into_iter().rev().flatten().collect())
}

/// `db.coll` split; the collection, created when missing and `create` is given (with the
/// entry's UUID, if it has one).
fn collection(store: &Store, ns: &str, create: Option<Option<bson::Uuid>>) -> Result<Option<Collection>> {
    let (db, name) = ns.split_once('.').ok_or_else(|| Error::new(Code::InvalidNamespace, format!("invalid namespace in oplog entry: {ns}")))?;
    match (store.collection(db, name), create) {
        (Some(c), _) => Ok(Some(c)),
        (None, Some(uuid)) => Ok(Some(store.create_collection_as(db, name, Document::new(), uuid, true)?)),
        (None, None) => Ok(None),
    }
}

/// Insert `doc`, or replace the document with its `_id`. For an insert entry the insert
/// is tried first (`insert_first`), as mongod's applier does: nearly every such entry needs
/// it, and its unique check finds an existing `_id` without a lookup of its own.
pub fn upsert(coll: &Collection, doc: &Document, insert_first: bool) -> Result<()> {
    let id = doc.get("_id").ok_or_else(|| Error::new(Code::FailedToParse, "insert oplog entry has no o._id"))?;
    let mut w = coll.writer();
    if insert_first {
        match w.insert(doc) {
            Err(e) if e.code == Code::DuplicateKey.0 => {}
            other => return other.map(|_| ()),
        }
    }
    match w.snapshot().find_by_id(id)? {
        Some((rid, old)) => w.update(rid, &old, doc, storage::UpdateForm::Replacement),
        None => w.insert(doc).map(|_| ()),
    }
}

fn update(coll: &Collection, id: &Bson, o: &Document) -> Result<()> {
    if let Some(diff) = storage::diff::of_update_entry(o) {
        let mut w = coll.writer();
        // A diff of a document that is gone changes nothing: a later entry deleted it, and
        // applying entries again (a restarted fetch, an initial sync's overlap) must not fail.
        let Some((rid, old)) = w.snapshot().find_by_id(id)? else { return Ok(()) };
        let new = storage::diff::apply(&old, diff)?;
        if storage::diff::same_document(&old, &new) {
            return Ok(());
        }
        return w.update(rid, &old, &new, storage::UpdateForm::Modifiers);
    }
    if o.get("$v").is_some() && !o.keys().any(|k| k != "$v" && k.starts_with('$')) {
        return Err(Error::new(Code::FailedToParse, format!("an update oplog entry of unknown version: {o}")));
    }
    let modifier = o.keys().next().is_some_and(|k| k.starts_with('$'));
    if !modifier {
        // A whole document (what shoal logs): an upsert, with the entry's _id.
        let mut doc = o.clone();
        if !doc.contains_key("_id") {
            doc.insert("_id", id.clone());
        }
        return upsert(coll, &doc, false);
    }
    let u = Update::parse(&Bson::Document(o.clone()), None)?;
    let mut w = coll.writer();
    let Some((rid, old)) = w.snapshot().find_by_id(id)? else {
        return Err(Error::new(Code::NoMatchingDocument, format!("cannot apply an update operator to a missing document: _id {id}")));
    };
    let new = u.apply(&old, &MatchDetails::default(), false)?;
    w.update(rid, &old, &new, storage::UpdateForm::Modifiers)
}

fn command(store: &Store, ns: &str, o: &Document, ui: Option<bson::Uuid>) -> Result<()> {
    let db = ns.strip_suffix(".$cmd").ok_or_else(|| Error::new(Code::InvalidNamespace, format!("command oplog entry on {ns}, not on db.$cmd")))?;
    let (name, arg) = o.iter().next().ok_or_else(|| Error::new(Code::FailedToParse, "empty command in oplog entry"))?;
    let coll_name = || arg.as_str().ok_or_else(|| Error::new(Code::FailedToParse, format!("oplog {name} needs a collection name")));
    match name.as_str() {
        "create" => {
            let mut options = o.clone();
            options.remove("create");
            match store.create_collection_as(db, coll_name()?, options, ui, false) {
                Err(e) if e.code == Code::NamespaceExists.0 => Ok(()),
                other => other.map(|_| ()),
            }
        }
        "drop" => store.drop_collection(db, coll_name()?).map(|_| ()),
        "collMod" => {
            // Of a collection dropped since (or of an earlier one of its name): nothing to do.
            let Some(coll) = store.collection(db, coll_name()?) else { return Ok(()) };
            if ui.is_some_and(|ui| ui != coll.meta().uuid) {
                return Ok(());
            }
            let mut changes = o.clone();
            changes.remove("collMod");
            store.modify_collection(db, coll_name()?, &changes)
        }
        "dropDatabase" => store.drop_database(db),
        "createIndexes" => {
            let coll = collection(store, &format!("{db}.{}", coll_name()?), Some(ui))?.expect("created");
            let mut spec = o.clone();
            spec.remove("createIndexes");
            coll.create_index(IndexSpec::from_spec(spec)?).map(|_| ())
        }
        "dropIndexes" | "deleteIndexes" => {
            let Some(coll) = store.collection(db, coll_name()?) else { return Ok(()) };
            let index = o.get_str("index").map_err(|_| Error::new(Code::FailedToParse, "oplog dropIndexes needs an index name"))?;
            match coll.drop_index(index) {
                Err(e) if e.code == Code::IndexNotFound.0 => Ok(()),
                other => other,
            }
        }
        "renameCollection" => {
            let from = coll_name()?;
            let to = o.get_str("to").map_err(|_| Error::new(Code::FailedToParse, "oplog renameCollection needs 'to'"))?;
            let split = |ns: &str| ns.split_once('.').map(|(d, c)| (d.to_string(), c.to_string()));
            let ((from_db, from_c), (to_db, to_c)) = match (split(from), split(to)) {
                (Some(f), Some(t)) => (f, t),
                _ => return Err(Error::new(Code::InvalidNamespace, "oplog renameCollection needs full namespaces")),
            };
            let drop_target = !matches!(o.get("dropTarget"), None | Some(Bson::Boolean(false)));
            if store.collection(&from_db, &from_c).is_none() && store.collection(&to_db, &to_c).is_some() {
                return Ok(()); // already renamed
            }
            store.rename_collection(&from_db, &from_c, &to_db, &to_c, drop_target)
        }
        other => Err(Error::new(Code::CommandNotSupported, format!("applying oplog command '{other}' is not supported yet"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// The entries `primary` logged after `after`, as a fetcher receives them.
    fn entries_after(primary: &Store, after: OpTime) -> (Vec<Document>, Vec<(OpTime, Vec<u8>)>) {
        let log = primary.collection(storage::OPLOG_DB, storage::OPLOG_COLLECTION).unwrap();
        let raw = log.snapshot().scan_raw(Some(after.ts), usize::MAX).unwrap();
        let docs: Vec<Document> = raw.iter().map(|(_, b)| storage::decode_record(b).unwrap()).collect();
        let logged = raw.into_iter().zip(&docs).map(|((_, b), d)| (OpTime::from_doc(d).unwrap(), b)).collect();
        (docs, logged)
    }

    fn contents(store: &Store, ns: &str) -> Vec<Document> {
        let (db, name) = ns.split_once('.').unwrap();
        let Some(c) = store.collection(db, name) else { return Vec::new() };
        let report = c.validate();
        assert!(report.valid, "{ns}: {:?}", report.errors);
        let mut docs: Vec<Document> = c.snapshot().scan(None, usize::MAX).unwrap().into_iter().map(|(_, d)| d).collect();
        docs.sort_by_key(|d| format!("{:?}", d.get("_id")));
        docs
    }

    /// Each batch reaches one secondary through `write_fetched` and `apply_written` (final
    /// states, in one engine write where it can) and another entry by entry: both end with the primary's data
    /// and oplog, valid indexes included. The batches hold documents written several times,
    /// deleted and inserted again, deletes of documents inserted in the same batch, and a
    /// unique key that moves from one document to another (which `apply_replicated`
    /// refuses, and `apply_written` then applies entry by entry).
    #[test]
    fn a_batch_applied_as_final_states_leaves_what_entry_by_entry_leaves() {
        let primary = Store::open_in_memory();
        let (batched, one_by_one) = (Store::open_in_memory(), Store::open_in_memory());
        for s in [&primary, &batched, &one_by_one] {
            s.enable_oplog(64 << 20).unwrap();
        }
        let mut at = primary.oplog_last().unwrap();
        let mut ship = |label: &str, primary: &Store| {
            let (docs, logged) = entries_after(primary, at);
            assert!(!docs.is_empty(), "{label}");
            let at_before = batched.oplog_last().unwrap();
            at = logged.last().unwrap().0;
            {
                write_fetched(&batched, &logged).unwrap();
                assert_eq!(batched.oplog_applied(), Some(at_before), "{label}: written, not applied");
                apply_written(&batched, &logged).unwrap();
                assert_eq!(batched.oplog_applied(), batched.oplog_last(), "{label}: applied");
                for (at, bytes) in &logged {
                    apply_fetched(&one_by_one.replicated(), RawDocument::from_bytes(bytes).unwrap(), *at).unwrap();
                }
                one_by_one.append_oplog_replicated(&logged).unwrap();
            }
            for ns in ["db.a", "db.b", "config.transactions"] {
                let want = contents(primary, ns);
                assert_eq!(contents(&batched, ns), want, "{label}: {ns} applied as a batch");
                assert_eq!(contents(&one_by_one, ns), want, "{label}: {ns} applied entry by entry");
            }
            for s in [&batched, &one_by_one] {
                assert_eq!(entries_after(s, OpTime::default()).1, entries_after(primary, OpTime::default()).1, "{label}: the oplog is a copy");
            }
        };
        // Catalog commands (applied entry by entry).
        let a = primary.collection_or_create("db", "a").unwrap();
        a.create_index(IndexSpec::from_spec(doc! {"key": {"k": 1}, "name": "k_1", "unique": true}).unwrap()).unwrap();
        a.create_index(IndexSpec::from_spec(doc! {"key": {"tags": 1}, "name": "tags_1"}).unwrap()).unwrap();
        let b = primary.collection_or_create("db", "b").unwrap();
        // (The first retryable write creates config.transactions.)
        drop(primary.begin_retryable_write(&[1; 16], 1, OpTime::NULL).unwrap());
        ship("catalog", &primary);
        // Inserts, updates, deletes; some documents changed several times in the batch.
        let docs: Vec<Document> = (0..40).map(|i| doc! {"_id": i, "k": i, "tags": [i % 3, i % 5]}).collect();
        assert!(a.insert_many(&docs, true).errors.is_empty());
        assert!(b.insert_many(&[doc! {"_id": "x", "v": 1}, doc! {"_id": "y", "v": 1}], true).errors.is_empty());
        // A replacement logs the whole document; an update by operators its diff, which a
        // batch applies to the document's earlier state in it, or to the stored one.
        let write = |c: &Collection, id: Bson, new: Document, form: storage::UpdateForm| {
            let mut w = c.writer();
            let (rid, old) = w.snapshot().find_by_id(&id).unwrap().unwrap();
            w.update(rid, &old, &new, form).unwrap();
        };
        let replace = |c: &Collection, id: Bson, new: Document| write(c, id, new, storage::UpdateForm::Replacement);
        let update = |c: &Collection, id: Bson, new: Document| write(c, id, new, storage::UpdateForm::Modifiers);
        let delete = |c: &Collection, id: Bson| {
            let mut w = c.writer();
            let (rid, old) = w.snapshot().find_by_id(&id).unwrap().unwrap();
            w.delete(rid, &old).unwrap();
        };
        replace(&a, Bson::Int32(5), doc! {"_id": 5, "k": 100, "tags": [0]});
        for round in 1..3 {
            update(&a, Bson::Int32(5), doc! {"_id": 5, "k": 100 + round, "tags": [round, {"n": round}]});
        }
        delete(&a, Bson::Int32(7));
        assert!(a.insert_many(&[doc! {"_id": 7, "k": 7, "tags": ["again"]}], true).errors.is_empty());
        update(&a, Bson::Int32(7), doc! {"_id": 7, "k": 7, "tags": ["again", "more"], "new": true});
        update(&a, Bson::Int32(9), doc! {"_id": 9, "tags": [0, 4]});
        delete(&a, Bson::Int32(9));
        delete(&a, Bson::Int32(8));
        update(&b, Bson::String("x".into()), doc! {"_id": "x", "v": 2});
        assert!(b.insert_many(&[doc! {"_id": "z"}], true).errors.is_empty());
        delete(&b, Bson::String("z".into()));
        // Retryable writes: each member derives the sessions' records from their entries
        // (session 2 writes twice: its record names the second).
        for (lsid, txn) in [([2; 16], 1), ([3; 16], 7), ([2; 16], 2)] {
            let w = primary.begin_retryable_write(&lsid, txn, OpTime::NULL).unwrap();
            w.set_statement_per_document(vec![0]);
            assert!(b.insert_many(&[doc! {"_id": format!("s{}-{txn}", lsid[0])}], true).errors.is_empty());
        }
        ship("documents", &primary);
        // A unique key moves: document 1 gives up k: 1, document 99 takes it.
        replace(&a, Bson::Int32(1), doc! {"_id": 1, "k": 1001});
        {
            let w = primary.begin_retryable_write(&[3; 16], 8, OpTime::NULL).unwrap();
            w.set_statement_per_document(vec![0]);
            assert!(a.insert_many(&[doc! {"_id": 99, "k": 1}], true).errors.is_empty());
        }
        delete(&b, Bson::String("y".into()));
        ship("a unique key that moves", &primary);
        // Documents the secondaries hold, replaced: in a collection with secondary indexes
        // (keys from the decoded documents) and in one indexed on _id alone (stored as
        // fetched, never decoded).
        replace(&a, Bson::Int32(2), doc! {"_id": 2, "k": 2002, "tags": ["replaced"]});
        replace(&b, Bson::String("x".into()), doc! {"_id": "x", "v": 3, "w": "longer than before"});
        ship("replacements", &primary);
        // Documents the secondaries hold, changed by diffs alone.
        update(&a, Bson::Int32(6), doc! {"_id": 6, "k": 6006, "tags": [0, 1, "x"]});
        update(&a, Bson::Int32(6), doc! {"_id": 6, "tags": [0], "k": 6});
        update(&b, Bson::String("x".into()), doc! {"_id": "x", "v": 4, "w": "longer than before"});
        ship("diffs", &primary);
        // Transactions: one whole (applied in the batch), and a session's record that says
        // committed.
        {
            let txn = primary.begin_transaction(Some((&[4; 16], 3))).unwrap();
            let t = primary.in_transaction(&txn);
            let (ta, tb) = (t.collection("db", "a").unwrap(), t.collection("db", "b").unwrap());
            replace(&ta, Bson::Int32(3), doc! {"_id": 3, "k": 3003});
            update(&ta, Bson::Int32(10), doc! {"_id": 10, "k": 1010, "tags": [1]});
            delete(&tb, Bson::String("x".into()));
            assert!(ta.insert_many(&[doc! {"_id": 500, "k": 500}], true).errors.is_empty());
            txn.commit().unwrap();
        }
        let newest = entries_after(&primary, OpTime::default()).1.pop().unwrap().1;
        assert!(transaction_ops(RawDocument::from_bytes(&newest).unwrap()).is_some_and(|ops| ops.len() == 4));
        ship("a transaction", &primary);
        // Prepared transactions: the prepare entry applies nothing and keeps the transaction
        // prepared on each secondary (found again from the records after a restart); the
        // decision's entry commits or aborts it there.
        for (lsid, commit) in [([5u8; 16], true), ([6u8; 16], false)] {
            let txn = primary.begin_transaction(Some((&lsid, 1))).unwrap();
            let ta = primary.in_transaction(&txn).collection("db", "a").unwrap();
            replace(&ta, Bson::Int32(4), doc! {"_id": 4, "k": 4004 + lsid[0] as i32});
            let prepared = primary.prepare_transaction(&txn, &lsid, 1).unwrap();
            ship("a prepare", &primary);
            for s in [&batched, &one_by_one] {
                assert_eq!(s.prepared_transaction(&lsid), Some((1, prepared)));
                s.forget_prepared();
                assert_eq!(recover_prepared(s).unwrap(), 1);
                assert_eq!(s.prepared_transaction(&lsid), Some((1, prepared)), "found again from its record");
            }
            let record = |s: &Store| {
                contents(s, "config.transactions")
                    .into_iter()
                    .find(|r| matches!(r.get_document("_id").unwrap().get("id"), Some(Bson::Binary(b)) if b.bytes == lsid))
                    .unwrap()
            };
            assert_eq!(record(&batched).get_str("state").unwrap(), "prepared");
            match commit {
                true => primary.commit_prepared(&lsid, 1, prepared.ts).unwrap(),
                false => primary.abort_prepared(&lsid, 1).unwrap(),
            };
            ship(if commit { "a prepared transaction's commit" } else { "a prepared transaction's abort" }, &primary);
            for s in [&batched, &one_by_one] {
                assert_eq!(s.prepared_transaction(&lsid), None);
                assert_eq!(record(s).get_str("state").unwrap(), if commit { "committed" } else { "aborted" });
            }
        }
        assert_eq!(contents(&batched, "db.a").into_iter().find(|d| d.get_i32("_id").ok() == Some(4)).unwrap().get_i32("k").ok(), Some(4009));
        // A fetched entry whose strings are not UTF-8 is refused, as decoding it would be,
        // though it is stored without being decoded: nothing is applied or logged.
        let marker = "\u{1}\u{2}";
        let entry = doc! {"ts": bson::Timestamp { time: u32::MAX, increment: 1 }, "t": 1_i64, "op": "i", "ns": "db.b", "o": {"_id": "bad", "s": marker}};
        let mut bad = bson::RawDocumentBuf::try_from(&entry).unwrap().into_bytes();
        let at = bad.windows(2).position(|w| w == marker.as_bytes()).unwrap();
        bad[at..at + 2].copy_from_slice(&[0xff, 0xfe]);
        let before = entries_after(&batched, OpTime::default()).1.len();
        let err = write_fetched(&batched, &[(OpTime { ts: u64::from(u32::MAX) << 32 | 1, term: 1 }, bad)]).unwrap_err();
        assert_eq!(err.code, Code::InvalidBSON.0, "{}", err.message);
        assert_eq!(entries_after(&batched, OpTime::default()).1.len(), before);
        assert_eq!(contents(&batched, "db.b"), contents(&primary, "db.b"));
    }
}
