//! CRUD commands: insert, find, getMore, killCursors, update, delete, findAndModify, count,
//! distinct.

use super::{cursor_reply, Ctx};
use crate::cursor::{Cursor, Source, FIRST_BATCH_DOCS_DEFAULT};
use crate::exec::Scan;
use crate::plan::Plan;
use crate::state::Counters;
use bson::{doc, oid::ObjectId, Bson, Document};
use common::limits::{BSON_OBJECT_SIZE_MAX_BYTES, WRITE_BATCH_SIZE_MAX};
use common::value::as_i64;
use common::value::check_fields;
use common::{Code, Error, Result};
use query::filter::{Filter, MatchDetails};
use query::let_vars::LetVars;
use query::projection::Projection;
use query::sort::SortSpec;
use query::update::Update;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// With allowDiskUse shoal still sorts in memory (no spill yet), so the bound is larger but
/// real. Without it, the bound is internalQueryMaxBlockingSortMemoryUsageBytes
/// (`Config::sort_memory_bytes_max`).
pub const SORT_MEMORY_BYTES_MAX_DISK_USE: usize = 1024 * 1024 * 1024;

fn write_error(index: usize, e: &Error) -> Bson {
    // Status::serializeErrorToBSON order: code, codeName, errmsg, then the extra info.
    let mut d = doc! { "index": index as i32, "code": e.code, "codeName": e.code_name, "errmsg": e.message.clone() };
    if let Some(extra) = e.extra.as_deref() {
        for (k, v) in extra {
            d.insert(k.clone(), v.clone());
        }
    }
    Bson::Document(d)
}

fn check_batch_len(n: usize) -> Result<()> {
    if n == 0 || n > WRITE_BATCH_SIZE_MAX {
        return Err(Error::new(Code::InvalidLength, format!("Write batch sizes must be between 1 and {WRITE_BATCH_SIZE_MAX}. Got {n} operations.")));
    }
    Ok(())
}

/// `_id` rules for stored documents: present (generated ObjectId first when absent) and not an
/// array, regex or undefined.
fn prepare_for_insert(doc: Document) -> Result<Document> {
    match doc.get("_id") {
        None => {
            let mut out = Document::new();
            out.insert("_id", ObjectId::new());
            out.extend(doc);
            Ok(out)
        }
        Some(Bson::Array(_)) => Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type array")),
        Some(Bson::RegularExpression(_)) => Err(Error::new(Code::InvalidIdField, "The '_id' value cannot be of type regex")),
        Some(Bson::Undefined) => Err(Error::new(Code::InvalidIdField, "can't use a undefined for _id")),
        Some(Bson::Document(d)) if d.keys().any(|k| k.starts_with('$')) => {
            Err(Error::new(Code::DollarPrefixedFieldName, "_id fields may not contain '$'-prefixed fields"))
        }
        // MongoDB stores `_id` as the first field.
        Some(_) if doc.keys().next().map(String::as_str) != Some("_id") => {
            let mut doc = doc;
            let id = doc.remove("_id").unwrap_or(Bson::Null);
            let mut out = Document::new();
            out.insert("_id", id);
            out.extend(doc);
            Ok(out)
        }
        Some(_) => Ok(doc),
    }
}

/// A capped collection keeps its newest documents: delete the oldest (in insertion order, which
/// is RecordId order) until both the `size` and `max` bounds hold again.
fn enforce_capped(ctx: &Ctx, coll: &storage::Collection) -> Result<()> {
    let options = coll.meta().options;
    if !options.get_bool("capped").unwrap_or(false) {
        return Ok(());
    }
    let size_max = options.get("size").and_then(as_i64).unwrap_or(i64::MAX).max(0) as u64;
    let docs_max = options.get("max").and_then(as_i64).filter(|m| *m > 0).map(|m| m as u64).unwrap_or(u64::MAX);
    let stats = coll.stats();
    let (mut count, mut size) = (stats.count, stats.size_bytes);
    if count <= docs_max && size <= size_max {
        return Ok(());
    }
    let mut writer = coll.writer();
    let snapshot = writer.snapshot();
    let mut after = None;
    // Never delete the document just written: a capped collection always keeps at least one.
    while count > 1 && (count > docs_max || size > size_max) {
        ctx.op.check()?;
        let batch = snapshot.scan(after, 256)?;
        if batch.is_empty() {
            break;
        }
        for (rid, doc) in batch {
            after = Some(rid);
            if count <= 1 || (count <= docs_max && size <= size_max) {
                break;
            }
            writer.delete(rid, &doc)?;
            count -= 1;
            size = size.saturating_sub(wire::document_size_bytes(&doc) as u64);
        }
    }
    Ok(())
}

pub fn insert(ctx: &mut Ctx) -> Result<Document> {
    check_fields("insert", ctx.cmd, &["documents", "ordered", "bypassDocumentValidation", "stmtIds"])?;
    let name = ctx.collection_name()?.to_string();
    let ordered = ctx.bool_arg("ordered")?.unwrap_or(true);
    let docs = ctx.array_arg("documents")?.ok_or_else(|| Error::location(40414, "BSON field 'insert.documents' is missing but a required field"))?;
    check_batch_len(docs.len())?;
    let mut errors: Vec<(usize, Error)> = Vec::new();
    let mut prepared = Vec::with_capacity(docs.len());
    let mut positions = Vec::with_capacity(docs.len());
    let mut stmt_ids = Vec::with_capacity(docs.len());
    // A retry's documents inserted by an earlier attempt: counted, not inserted again.
    let mut retried = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        let stmt = ctx.statement_id(i);
        if ctx.retry.as_ref().is_some_and(|r| r.executed.statement(stmt).is_some()) {
            retried.push(stmt);
            continue;
        }
        let r = match d {
            Bson::Document(d) => prepare_for_insert(d.clone()),
            other => Err(Error::type_mismatch(format!("BSON field 'insert.documents' elements must be objects, got {}", common::value::type_name(other)))),
        };
        match r {
            Ok(d) => {
                prepared.push(d);
                positions.push(i);
                stmt_ids.push(stmt);
            }
            Err(e) => {
                errors.push((i, e));
                if ordered {
                    break;
                }
            }
        }
    }
    let mut inserted = 0usize;
    if !prepared.is_empty() {
        let coll = ctx.store().collection_or_create(ctx.db, &name)?;
        if let Some(r) = &ctx.retry {
            r.write.set_statement_per_document(stmt_ids);
        }
        let out = coll.insert_many(&prepared, ordered);
        inserted = out.inserted;
        enforce_capped(ctx, &coll)?;
        for (i, e) in out.errors {
            errors.push((positions[i], e));
        }
        ctx.commit_write()?;
    }
    if ordered {
        // An ordered batch stops at its first failure: only that one is reported.
        errors.sort_by_key(|(i, _)| *i);
        errors.truncate(1);
    } else {
        errors.sort_by_key(|(i, _)| *i);
    }
    Counters::add(&ctx.shared.counters.insert, inserted as u64);
    let mut r = doc! { "n": (inserted + retried.len()) as i32 };
    if !errors.is_empty() {
        r.insert("writeErrors", errors.iter().map(|(i, e)| write_error(*i, e)).collect::<Vec<_>>());
    }
    add_retried(&mut r, retried);
    Ok(r)
}

/// mongod's `retriedStmtIds`: the statements of a retry that an earlier attempt applied.
fn add_retried(reply: &mut Document, retried: Vec<i32>) {
    if !retried.is_empty() {
        reply.insert("retriedStmtIds", retried);
    }
}

fn entry_op(e: &Document) -> &str {
    e.get_str("op").unwrap_or("")
}

/// The `_id` of the document an insert entry inserted.
fn entry_id(e: &Document) -> Result<Bson> {
    e.get_document("o")
        .ok()
        .and_then(|o| o.get("_id"))
        .cloned()
        .ok_or_else(|| Error::new(Code::IncompleteTransactionHistory, "a retryable write's insert entry has no o._id"))
}

fn non_negative(ctx: &Ctx, field: &str) -> Result<Option<i64>> {
    match ctx.int_arg(field)? {
        Some(v) if v < 0 => Err(Error::location(51024, format!("BSON field '{field}' value must be >= 0, actual value '{v}'"))),
        other => Ok(other),
    }
}

/// Validate a `hint`: `{$natural: ±1}` or the name/key pattern of an existing index.
fn check_hint(ctx: &Ctx, hint: Option<&Bson>, coll: Option<&storage::Collection>) -> Result<()> {
    let Some(hint) = hint else { return Ok(()) };
    let bad = || Error::bad_value("error processing query: planner returned error :: caused by :: hint provided does not correspond to an existing index");
    match hint {
        Bson::Document(d) if d.is_empty() => Ok(()),
        Bson::Document(d) if d.contains_key("$natural") => Ok(()),
        Bson::Document(d) => match coll {
            Some(c) if c.meta().indexes.iter().any(|i| &i.key == d) => Ok(()),
            Some(_) => Err(bad()),
            None => Ok(()),
        },
        Bson::String(s) => match coll {
            Some(c) if c.meta().indexes.iter().any(|i| &i.name == s) => Ok(()),
            Some(_) => Err(bad()),
            None => Ok(()),
        },
        other => Err(Error::new(Code::FailedToParse, format!("hint must be a string or an object, not {}", common::value::type_name(other)))).map(|_: ()| {
            let _ = ctx;
        }),
    }
}

/// `{$natural: 1}` or `{$natural: -1}` as the whole sort: the `$natural` hint that scans in
/// that direction. `$natural` beside other sort fields is refused, as by mongod.
pub(crate) fn natural_sort(sort: &Document) -> Result<Option<Bson>> {
    let Some(v) = sort.get("$natural") else { return Ok(None) };
    if sort.len() > 1 {
        return Err(Error::bad_value("$natural sort cannot be combined with other sort fields"));
    }
    match as_i64(v) {
        Some(1) | Some(-1) => Ok(Some(Bson::Document(doc! {"$natural": v.clone()}))),
        _ => Err(Error::bad_value("$natural sort cannot be set to a value other than -1 or 1")),
    }
}

/// The matches of the scan in `sort` order (stable), the first `keep` when given, bounded
/// by the blocking sort's memory limit.
fn sorted_matches(
    ctx: &Ctx,
    mut scan: Scan,
    sort: &SortSpec,
    allow_disk_use: bool,
    keep: Option<usize>,
) -> Result<Vec<(storage::RecordId, Document, MatchDetails)>> {
    let bytes_max = ctx.shared.config.sort_memory_bytes_max;
    let bytes_max = if allow_disk_use { bytes_max.max(SORT_MEMORY_BYTES_MAX_DISK_USE) } else { bytes_max };
    scan.collect_sorted(ctx.op, sort, keep, bytes_max)
}

/// The first match in `sort` order: from the scan directly when the plan yields that order.
fn first_match(ctx: &Ctx, mut scan: Scan, plan: &Plan, sort: Option<&SortSpec>) -> Result<Option<(storage::RecordId, Document, MatchDetails)>> {
    match sort.filter(|s| !s.is_empty() && !plan.provides_sort) {
        Some(sort) => Ok(sorted_matches(ctx, scan, sort, false, Some(1))?.into_iter().next()),
        None => scan.next(ctx.op),
    }
}

const FIND_FIELDS: &[&str] = &[
    "filter",
    "sort",
    "projection",
    "hint",
    "skip",
    "limit",
    "batchSize",
    "singleBatch",
    "comment",
    "max",
    "min",
    "returnKey",
    "showRecordId",
    "tailable",
    "oplogReplay",
    "noCursorTimeout",
    "awaitData",
    "allowPartialResults",
    "collation",
    "allowDiskUse",
    "let",
    "readOnce",
    "ntoreturn",
    "term",
];

pub fn find(ctx: &mut Ctx) -> Result<Document> {
    check_fields("find", ctx.cmd, FIND_FIELDS)?;
    Counters::add(&ctx.shared.counters.query, 1);
    let name = ctx.collection_name()?.to_string();
    let ns = ctx.ns(&name);
    let vars = ctx.let_vars()?;
    let filter_doc = ctx.doc_arg("filter")?.cloned().unwrap_or_default();
    let filter_doc = if vars.is_empty() { filter_doc } else { vars.filter(&filter_doc) };
    let filter = Filter::parse(&filter_doc)?;
    let projection_doc = ctx.doc_arg("projection")?.filter(|p| !p.is_empty()).cloned();
    let projection_doc = match projection_doc {
        Some(p) if !vars.is_empty() => vars.expression(&Bson::Document(p)).as_document().cloned(),
        p => p,
    };
    let projection = projection_doc.as_ref().map(Projection::parse).transpose()?;
    let sort_doc = ctx.doc_arg("sort")?.cloned().unwrap_or_default();
    // `sort: {$natural: ±1}` asks for record order: a collection scan in that direction.
    let natural = natural_sort(&sort_doc)?;
    let sort = if natural.is_some() { SortSpec::parse(&Document::new())? } else { SortSpec::parse(&sort_doc)? };
    let skip = non_negative(ctx, "skip")?.unwrap_or(0) as u64;
    let limit = non_negative(ctx, "limit")?.filter(|l| *l > 0).map(|l| l as u64);
    let batch_size = non_negative(ctx, "batchSize")?.map(|b| b as usize);
    let single_batch = ctx.bool_arg("singleBatch")?.unwrap_or(false);
    let allow_disk_use = ctx.bool_arg("allowDiskUse")?.unwrap_or(false);
    let no_timeout = ctx.bool_arg("noCursorTimeout")?.unwrap_or(false);
    let return_key = ctx.bool_arg("returnKey")?.unwrap_or(false);
    let show_record_id = ctx.bool_arg("showRecordId")?.unwrap_or(false);
    let (key_min, key_max) = (ctx.doc_arg("min")?.filter(|d| !d.is_empty()), ctx.doc_arg("max")?.filter(|d| !d.is_empty()));
    if (key_min.is_some() || key_max.is_some()) && !ctx.cmd.contains_key("hint") {
        return Err(Error::location(51173, "When using min()/max() a hint of which index to use must be provided"));
    }
    let tailable = ctx.bool_arg("tailable")?.unwrap_or(false);
    let await_data = ctx.bool_arg("awaitData")?.unwrap_or(false);
    if await_data && !tailable {
        return Err(Error::new(Code::FailedToParse, "Cannot set 'awaitData' without also setting 'tailable'"));
    }
    if tailable
        && !(sort.is_empty() && natural.as_ref().is_none_or(|n| n.as_document().and_then(|d| d.get("$natural")).and_then(common::value::as_i64) == Some(1)))
    {
        return Err(Error::bad_value("error processing query: cannot use tailable option with a sort other than {$natural: 1}"));
    }
    if let Some(c) = ctx.cmd.get("collation") {
        check_collation(c)?;
    }
    let coll = ctx.store().collection(ctx.db, &name);
    check_hint(ctx, ctx.cmd.get("hint"), coll.as_ref())?;
    let Some(coll) = coll else {
        return Ok(cursor_reply(&ns, 0, Vec::new(), true));
    };
    if tailable {
        if !coll.is_capped() {
            return Err(Error::bad_value(format!("error processing query: ns={ns} tailable cursor requested on non capped collection")));
        }
        if skip > 0 {
            return Err(Error::new(Code::CommandNotSupported, "skip with a tailable cursor is not supported by shoal yet"));
        }
        let oplog = (ctx.db, name.as_str()) == (storage::OPLOG_DB, storage::OPLOG_COLLECTION);
        let (start_after, implied) = if oplog { oplog_start(ctx.doc_arg("filter")?) } else { (None, false) };
        let raw = implied && projection.is_none();
        let removals_seen = coll.removals();
        let truncations_seen = coll.truncations();
        let tail =
            crate::cursor::Tail { coll, filter, projection, last: None, start_after, await_data, raw, limit, returned: 0, removals_seen, truncations_seen };
        let mut cursor = Cursor::new(ns.clone(), Source::Tail(Box::new(tail)));
        cursor.lsid = ctx.lsid();
        cursor.no_timeout = no_timeout;
        let (batch, done) = cursor.next_batch(batch_size.unwrap_or(FIRST_BATCH_DOCS_DEFAULT), ctx.op)?;
        // As mongod: over an empty capped collection there is no position to tail from.
        let positioned = matches!(&cursor.source, Source::Tail(t) if t.last.is_some());
        let id = if done || single_batch || !positioned { 0 } else { ctx.register_cursor(cursor)? };
        return Ok(super::cursor_batch_reply(ctx, &ns, id, batch, true));
    }
    drop(filter);
    // returnKey, min and max read the index's fields from whole documents.
    let projected = projection.as_ref().filter(|_| !return_key && key_min.is_none() && key_max.is_none()).and_then(|p| p.included_paths());
    let hint = natural.as_ref().or(ctx.cmd.get("hint"));
    let (scan, plan) = ctx.planned_scan(coll.snapshot(), &filter_doc, Some(&sort), hint, projected.as_deref())?;
    let scan = match (key_min.is_some() || key_max.is_some(), &plan.access) {
        (false, _) => scan,
        (true, crate::plan::Access::IndexScan(p)) => scan.in_key_range(Some(crate::exec::KeyRange::new(&p.index.key, key_min, key_max)?)),
        (true, crate::plan::Access::IdPoint(_)) => scan.in_key_range(Some(crate::exec::KeyRange::new(&doc! {"_id": 1}, key_min, key_max)?)),
        (true, crate::plan::Access::CollScan { .. }) => {
            return Err(Error::location(51173, "When using min()/max() a hint of which index to use must be provided"));
        }
    };
    let key_output = crate::exec::KeyOutput::new(&plan, return_key, show_record_id).map(Box::new);
    let source = if sort.is_empty() || plan.provides_sort {
        Source::Find { scan: Box::new(scan), projection, key_output, skip, limit, returned: 0, held: None }
    } else {
        let keep = limit.map(|l| usize::try_from(l.saturating_add(skip)).unwrap_or(usize::MAX));
        let all = sorted_matches(ctx, scan, &sort, allow_disk_use, keep)?;
        let mut out = VecDeque::new();
        for (rid, doc, details) in all.into_iter().skip(skip as usize) {
            out.push_back(crate::exec::shape(projection.as_ref(), key_output.as_deref(), rid, doc, &details)?);
        }
        Source::Buffered(out)
    };
    let mut cursor = Cursor::new(ns.clone(), source);
    cursor.lsid = ctx.lsid();
    cursor.no_timeout = no_timeout;
    let mut docs_max = batch_size.unwrap_or(FIRST_BATCH_DOCS_DEFAULT);
    if let Some(l) = limit {
        docs_max = docs_max.min(l as usize);
        if batch_size.is_none() {
            docs_max = l as usize;
        }
    }
    let (batch, done) = cursor.next_batch(docs_max, ctx.op)?;
    let id = if done || single_batch { 0 } else { ctx.register_cursor(cursor)? };
    Ok(super::cursor_batch_reply(ctx, &ns, id, batch, true))
}

/// Where an oplog read can start: oplog record ids are timestamps, so a filter with
/// `ts: {$gte: T}` or `{$gt: T}` at its top level starts just before or at T (mongod's
/// oplogReplay optimization). The filter itself still decides what matches, unless it is
/// that condition alone.
///
/// Also whether the filter is that condition alone, so that every record after the start
/// matches it (oplog record ids increase with `ts`): then the tail need not look at them.
fn oplog_start(filter: Option<&Document>) -> (Option<storage::RecordId>, bool) {
    let Some(filter) = filter else { return (None, false) };
    let Ok(ts) = filter.get_document("ts") else { return (None, false) };
    let alone = filter.len() == 1 && ts.len() == 1;
    if let Ok(t) = ts.get_timestamp("$gte") {
        return (Some(common::optime::ts_value(t).saturating_sub(1)), alone);
    }
    match ts.get_timestamp("$gt") {
        Ok(t) => (Some(common::optime::ts_value(t)), alone),
        Err(_) => (None, false),
    }
}

/// How long an awaitData getMore waits for data without maxTimeMS (mongod: 1 s), and at most.
pub(crate) const AWAIT_DATA_MS_DEFAULT: i64 = 1000;
pub(crate) const AWAIT_DATA_MS_MAX: i64 = 60_000;

pub fn get_more(ctx: &mut Ctx) -> Result<Document> {
    check_fields("getMore", ctx.cmd, &["collection", "batchSize", "term", "lastKnownCommittedOpTime", "maxTimeMS", "$replProgress", "$replStream"])?;
    // A getMore run again after its awaitData wait (conn::await_data_loop) is the same one.
    if ctx.resumed.is_none() {
        Counters::add(&ctx.shared.counters.getmore, 1);
        // A fetching member's progress (replSetUpdatePosition's `optimes`) rides on its
        // next getMore: one round trip per batch both reports and fetches.
        // Its term, too: a later one than ours makes a primary step down (mongod's getMore
        // takes `term` so), before the progress counts.
        let term = replication::member_commands::reporter_term(ctx.cmd.get("term"))?;
        match ctx.cmd.get("$replProgress") {
            Some(Bson::Array(optimes)) => replication::member_commands::update_positions(ctx.shared, optimes, term)?,
            Some(_) => return Err(Error::type_mismatch("BSON field 'getMore.$replProgress' must be an array")),
            None if term.is_some() && ctx.shared.repl.is_some() => replication::member_commands::update_positions(ctx.shared, &[], term)?,
            None => {}
        }
    }
    let id = match ctx.cmd.get("getMore") {
        Some(Bson::Int64(id)) => *id,
        Some(v) => {
            return Err(Error::type_mismatch(format!("BSON field 'getMore.getMore' is the wrong type '{}', expected type 'long'", common::value::type_name(v))))
        }
        None => return Err(Error::location(40414, "BSON field 'getMore.getMore' is missing but a required field")),
    };
    let coll = ctx.str_arg("collection")?.ok_or_else(|| Error::location(40414, "BSON field 'getMore.collection' is missing but a required field"))?;
    let ns = ctx.ns(coll);
    let batch_size = match ctx.int_arg("batchSize")? {
        Some(b) if b < 0 => return Err(Error::location(51024, format!("BSON field 'batchSize' value must be >= 0, actual value '{b}'"))),
        Some(0) | None => usize::MAX,
        Some(b) => b as usize,
    };
    // maxTimeMS on a getMore is how long an awaitData cursor waits for new data (mongod
    // default 1 s); dispatch does not make it a deadline for getMore.
    let await_ms = match ctx.cmd.get("maxTimeMS") {
        None | Some(Bson::Null) => None,
        Some(v) => Some(common::value::as_i64(v).filter(|n| *n >= 0).ok_or_else(|| Error::bad_value("maxTimeMS must be a non-negative integer"))?),
    };
    let mut cursor = ctx.shared.cursors.checkout(id, &ns, ctx.user_name().as_ref())?;
    if let Some(e) = net::fail_point::get_more_fails(&ns, ctx.conn.app_name.as_deref(), ctx.conn.internal_client) {
        return Err(e);
    }
    if matches!(cursor.source, Source::ChangeStream(_)) {
        return crate::change_stream::get_more(ctx, cursor, batch_size, await_ms);
    }
    let await_data = matches!(&cursor.source, Source::Tail(t) if t.await_data);
    if await_ms.is_some() && !await_data {
        ctx.shared.cursors.restore(cursor);
        return Err(Error::bad_value("cannot set maxTimeMS on getMore command for a non-awaitData cursor"));
    }
    // Errors kill the cursor (it is not restored), as in MongoDB.
    let seen = ctx.shared.store.write_seq();
    let (batch, done) = cursor.next_batch(batch_size, ctx.op)?;
    if batch.is_empty() && !done && await_data {
        let wait = Duration::from_millis(await_ms.unwrap_or(AWAIT_DATA_MS_DEFAULT).min(AWAIT_DATA_MS_MAX) as u64);
        let deadline = ctx.resumed.unwrap_or_else(|| Instant::now() + wait);
        if Instant::now() < deadline {
            // The connection waits for a write, off this thread, and runs the getMore
            // again; any write wakes it, and one that was not to this collection waits again.
            ctx.shared.cursors.restore(cursor);
            ctx.out.await_data = Some(crate::dispatch::AwaitData { seen, deadline, commit_point: None });
            return Ok(Document::new());
        }
    }
    let id = if done { 0 } else { cursor.id };
    if !done {
        ctx.shared.cursors.restore(cursor);
    }
    Ok(super::cursor_batch_reply(ctx, &ns, id, batch, false))
}

pub fn kill_cursors(ctx: &mut Ctx) -> Result<Document> {
    check_fields("killCursors", ctx.cmd, &["cursors"])?;
    ctx.collection_name()?;
    let ids = ctx.array_arg("cursors")?.ok_or_else(|| Error::location(40414, "BSON field 'killCursors.cursors' is missing but a required field"))?;
    let mut killed = Vec::new();
    let mut not_found = Vec::new();
    // Another user's cursor is as good as absent.
    let owner = ctx.user_name();
    for v in ids {
        let Bson::Int64(id) = v else {
            return Err(Error::type_mismatch(format!("BSON field 'killCursors.cursors' elements must be 'long', got '{}'", common::value::type_name(v))));
        };
        if ctx.shared.cursors.kill(*id, owner.as_ref()) {
            killed.push(*id);
        } else {
            not_found.push(*id);
        }
    }
    Ok(doc! { "cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": [], "cursorsUnknown": [] })
}

/// One parsed update statement.
struct UpdateStmt {
    hint: Option<Bson>,
    query: Document,
    update: Update,
    upsert: bool,
    multi: bool,
}

/// A `collation` other than the simple one (code-point order) is refused: shoal compares
/// strings only so, and another collation would silently give other results.
pub(crate) fn check_collation(c: &Bson) -> Result<()> {
    match c {
        Bson::Null => Ok(()),
        Bson::Document(c) if c.is_empty() || c.get_str("locale").is_ok_and(|l| l == "simple") => Ok(()),
        Bson::Document(_) => Err(Error::new(Code::CommandNotSupported, "collations other than 'simple' are not supported by shoal yet")),
        _ => Err(Error::type_mismatch("BSON field 'collation' is the wrong type, expected type 'object'")),
    }
}

/// An update's `u` with the command's variables: a pipeline takes them; update operators
/// and a replacement hold values only.
fn bind_update(vars: &LetVars, u: &Bson) -> Bson {
    match u {
        Bson::Array(stages) => {
            let stages: Vec<Document> = stages.iter().filter_map(|s| s.as_document().cloned()).collect();
            if stages.len() != u.as_array().map_or(0, Vec::len) {
                return u.clone(); // not all objects: Update::parse reports it
            }
            Bson::Array(vars.pipeline(&stages).into_iter().map(Bson::Document).collect())
        }
        other => other.clone(),
    }
}

/// `vars`: the command's `let`, which the statement's constants (`c`) join. The outer error
/// fails the whole command, as mongod's parse of the command does (a statement that is not
/// an object, a missing, mistyped or unknown field); the inner one fails this statement (a
/// bad update or filter), a writeError.
fn parse_update_stmt(v: &Bson, vars: &LetVars) -> Result<Result<UpdateStmt>> {
    let Bson::Document(s) = v else {
        return Err(Error::type_mismatch("BSON field 'update.updates' elements must be objects"));
    };
    let mut q = None;
    let mut u = None;
    let mut upsert = false;
    let mut multi = false;
    let mut array_filters: Option<Vec<Document>> = None;
    let mut hint = None;
    let mut constants = None;
    for (k, v) in s {
        match k.as_str() {
            "q" => match v {
                Bson::Document(d) => q = Some(d.clone()),
                _ => return Err(Error::type_mismatch("BSON field 'update.updates.q' is the wrong type, expected type 'object'")),
            },
            "u" => u = Some(v.clone()),
            "upsert" => upsert = v.as_bool().unwrap_or(as_i64(v).unwrap_or(0) != 0),
            "multi" => multi = v.as_bool().unwrap_or(as_i64(v).unwrap_or(0) != 0),
            "arrayFilters" => match v {
                Bson::Array(a) => {
                    array_filters = Some(
                        a.iter()
                            .map(|f| match f {
                                Bson::Document(d) => Ok(d.clone()),
                                _ => Err(Error::type_mismatch("arrayFilters elements must be objects")),
                            })
                            .collect::<Result<_>>()?,
                    )
                }
                _ => return Err(Error::type_mismatch("BSON field 'update.updates.arrayFilters' is the wrong type, expected type 'array'")),
            },
            "hint" => hint = Some(v.clone()),
            "c" => match v {
                Bson::Document(c) => constants = Some(LetVars::parse(c)?),
                _ => return Err(Error::type_mismatch("BSON field 'update.updates.c' is the wrong type, expected type 'object'")),
            },
            "upsertSupplied" | "sampleId" => {}
            "collation" => check_collation(v)?,
            other => return Err(Error::location(40415, format!("BSON field 'update.updates.{other}' is an unknown field."))),
        }
    }
    let q = q.ok_or_else(|| Error::location(40414, "BSON field 'update.updates.q' is missing but a required field"))?;
    let u = u.ok_or_else(|| Error::location(40414, "BSON field 'update.updates.u' is missing but a required field"))?;
    if !matches!(u, Bson::Document(_) | Bson::Array(_)) {
        return Err(Error::type_mismatch("BSON field 'update.updates.u' is the wrong type, expected type 'object' or 'array'"));
    }
    let vars = vars.with(constants.unwrap_or_default());
    let (q, u) = if vars.is_empty() { (q, u) } else { (vars.filter(&q), bind_update(&vars, &u)) };
    Ok((|| {
        let update = Update::parse(&u, array_filters.as_deref())?;
        if multi && update.is_replacement() {
            return Err(Error::failed_to_parse("multi update is not supported for replacement-style update"));
        }
        // Parsed here too so a bad filter fails even where no collection exists yet.
        Filter::parse(&q)?;
        Ok(UpdateStmt { hint, query: q, update, upsert, multi })
    })())
}

/// Outcome of one update statement.
struct UpdateResult {
    n: u64,
    modified: u64,
    upserted: Option<Bson>,
    /// The document before/after (findAndModify needs them).
    before: Option<Document>,
    after: Option<Document>,
}

/// Apply one update statement under the collection's writer lock. With `sort`, only the first
/// document in that order is updated (findAndModify).
fn apply_update(ctx: &Ctx, coll_name: &str, stmt: &UpdateStmt, sort: Option<&SortSpec>) -> Result<UpdateResult> {
    let mut res = UpdateResult { n: 0, modified: 0, upserted: None, before: None, after: None };
    // The documents a multi-update changed before it met one a transaction wrote: skipped
    // when it runs again after the transaction.
    let mut done = std::collections::HashSet::new();
    crate::txn::after_transactions(ctx, || apply_update_once(ctx, coll_name, stmt, sort, &mut res, &mut done))?;
    Ok(res)
}

fn apply_update_once(
    ctx: &Ctx,
    coll_name: &str,
    stmt: &UpdateStmt,
    sort: Option<&SortSpec>,
    res: &mut UpdateResult,
    done: &mut std::collections::HashSet<storage::RecordId>,
) -> Result<()> {
    let coll = if stmt.upsert { Some(ctx.store().collection_or_create(ctx.db, coll_name)?) } else { ctx.store().collection(ctx.db, coll_name) };
    let Some(coll) = coll else { return Ok(()) };
    let mut writer = coll.writer();
    let snapshot = writer.snapshot();
    let apply_one = |writer: &mut storage::Writer, rid, doc: Document, details: MatchDetails, res: &mut UpdateResult| -> Result<()> {
        let new = stmt.update.apply(&doc, &details, false)?;
        if wire::document_size_bytes(&new) > BSON_OBJECT_SIZE_MAX_BYTES {
            return Err(Error::location(17419, format!("Resulting document after update is larger than {BSON_OBJECT_SIZE_MAX_BYTES}")));
        }
        if new != doc {
            writer.update(rid, &doc, &new, stmt.update.form())?;
            res.modified += 1;
        }
        res.n += 1;
        res.before = Some(doc);
        res.after = Some(new);
        Ok(())
    };
    let (mut scan, plan) = ctx.planned_scan(snapshot, &stmt.query, sort, stmt.hint.as_ref(), None)?;
    if stmt.multi {
        while let Some((rid, doc, details)) = scan.next(ctx.op)? {
            if done.contains(&rid) {
                continue;
            }
            apply_one(&mut writer, rid, doc, details, res)?;
            done.insert(rid);
        }
    } else if let Some((rid, doc, details)) = first_match(ctx, scan, &plan, sort)? {
        apply_one(&mut writer, rid, doc, details, res)?;
    }
    if res.n == 0 && stmt.upsert {
        let seed = query::update::upsert_seed(&stmt.query)?;
        let new = stmt.update.apply(&seed, &MatchDetails::default(), true)?;
        let new = prepare_for_insert(new)?;
        if wire::document_size_bytes(&new) > BSON_OBJECT_SIZE_MAX_BYTES {
            return Err(Error::location(17420, format!("Document to upsert is larger than {BSON_OBJECT_SIZE_MAX_BYTES}")));
        }
        let id = new.get("_id").cloned().unwrap_or(Bson::Null);
        writer.insert(&new)?;
        drop(writer);
        enforce_capped(ctx, &coll)?;
        res.upserted = Some(id);
        res.after = Some(new);
    }
    Ok(())
}

pub fn update(ctx: &mut Ctx) -> Result<Document> {
    check_fields("update", ctx.cmd, &["updates", "ordered", "bypassDocumentValidation", "let", "stmtIds", "isTimeseriesNamespace"])?;
    let name = ctx.collection_name()?.to_string();
    let ordered = ctx.bool_arg("ordered")?.unwrap_or(true);
    let stmts = ctx.array_arg("updates")?.ok_or_else(|| Error::location(40414, "BSON field 'update.updates' is missing but a required field"))?.clone();
    let vars = ctx.let_vars()?;
    check_batch_len(stmts.len())?;
    let parsed = stmts.iter().map(|s| parse_update_stmt(s, &vars)).collect::<Result<Vec<_>>>()?;
    let (mut n, mut modified) = (0u64, 0u64);
    let mut upserted = Vec::new();
    let mut errors = Vec::new();
    let mut retried = Vec::new();
    for (i, stmt) in parsed.iter().enumerate() {
        let stmt_id = ctx.statement_id(i);
        if let Some(entries) = ctx.begin_statement(stmt_id) {
            // Applied by an earlier attempt: its result, from what it logged (an update
            // logs the documents it changed; an upsert, the document it inserted).
            for e in entries {
                match entry_op(e) {
                    "u" => {
                        n += 1;
                        modified += 1;
                    }
                    "i" => {
                        n += 1;
                        upserted.push(Bson::Document(doc! { "index": i as i32, "_id": entry_id(e)? }));
                    }
                    _ => {}
                }
            }
            retried.push(stmt_id);
            continue;
        }
        Counters::add(&ctx.shared.counters.update, 1);
        let r = match stmt {
            Ok(stmt) => apply_update(ctx, &name, stmt, None),
            Err(e) => Err(e.clone()),
        };
        match r {
            Ok(r) => {
                n += r.n;
                modified += r.modified;
                if let Some(id) = r.upserted {
                    n += 1;
                    upserted.push(Bson::Document(doc! { "index": i as i32, "_id": id }));
                }
            }
            Err(e) => {
                errors.push(write_error(i, &e));
                if ordered {
                    break;
                }
            }
        }
    }
    ctx.commit_write()?;
    let mut r = doc! { "n": n as i32, "nModified": modified as i32 };
    if !upserted.is_empty() {
        r.insert("upserted", upserted);
    }
    if !errors.is_empty() {
        r.insert("writeErrors", errors);
    }
    add_retried(&mut r, retried);
    Ok(r)
}

/// Delete the documents matching `filter` (at most one unless `multi`, the first in `sort`
/// order when given). Returns the deleted documents.
fn apply_delete(ctx: &Ctx, coll_name: &str, query: &Document, multi: bool, sort: Option<&SortSpec>, hint: Option<&Bson>) -> Result<Vec<Document>> {
    let Some(coll) = ctx.store().collection(ctx.db, coll_name) else {
        Filter::parse(query)?;
        return Ok(Vec::new());
    };
    // What a multi-delete removed before it met a document a transaction wrote stays counted
    // when it runs again after the transaction.
    let mut deleted = Vec::new();
    crate::txn::after_transactions(ctx, || {
        let mut writer = coll.writer();
        let (mut scan, plan) = ctx.planned_scan(writer.snapshot(), query, sort, hint, None)?;
        if multi {
            while let Some((rid, doc, _)) = scan.next(ctx.op)? {
                writer.delete(rid, &doc)?;
                // Multi-deletes only need the count; keep memory flat.
                deleted.push(Document::new());
            }
        } else if let Some((rid, doc, _)) = first_match(ctx, scan, &plan, sort)? {
            writer.delete(rid, &doc)?;
            deleted.push(doc);
        }
        Ok(())
    })?;
    Ok(deleted)
}

/// One delete statement: its filter (with the command's `let`), whether it removes every
/// match (limit 0) or one, and its hint.
fn parse_delete_stmt(s: &Bson, vars: &LetVars) -> Result<(Document, bool, Option<Bson>)> {
    let Bson::Document(s) = s else { return Err(Error::type_mismatch("BSON field 'delete.deletes' elements must be objects")) };
    let mut q = None;
    let mut limit = None;
    let mut hint = None;
    for (k, v) in s {
        match k.as_str() {
            "q" => match v {
                Bson::Document(d) => q = Some(d),
                _ => return Err(Error::type_mismatch("BSON field 'delete.deletes.q' is the wrong type, expected type 'object'")),
            },
            "limit" => limit = Some(as_i64(v).ok_or_else(|| Error::type_mismatch("BSON field 'delete.deletes.limit' is the wrong type, expected a number"))?),
            "hint" => hint = Some(v.clone()),
            "collation" => check_collation(v)?,
            "sampleId" => {}
            other => return Err(Error::location(40415, format!("BSON field 'delete.deletes.{other}' is an unknown field."))),
        }
    }
    let q = q.ok_or_else(|| Error::location(40414, "BSON field 'delete.deletes.q' is missing but a required field"))?;
    let limit = limit.ok_or_else(|| Error::location(40414, "BSON field 'delete.deletes.limit' is missing but a required field"))?;
    if limit != 0 && limit != 1 {
        return Err(Error::failed_to_parse(format!("The limit field in delete objects must be 0 or 1. Got {limit}")));
    }
    let q = if vars.is_empty() { q.clone() } else { vars.filter(q) };
    Ok((q, limit == 0, hint))
}

pub fn delete(ctx: &mut Ctx) -> Result<Document> {
    check_fields("delete", ctx.cmd, &["deletes", "ordered", "let", "stmtIds", "bypassDocumentValidation"])?;
    let name = ctx.collection_name()?.to_string();
    let ordered = ctx.bool_arg("ordered")?.unwrap_or(true);
    let stmts = ctx.array_arg("deletes")?.ok_or_else(|| Error::location(40414, "BSON field 'delete.deletes' is missing but a required field"))?.clone();
    let vars = ctx.let_vars()?;
    check_batch_len(stmts.len())?;
    let mut n = 0u64;
    let mut errors = Vec::new();
    let mut retried = Vec::new();
    // The statements are parsed whole before any runs: a malformed one fails the command.
    let parsed = stmts.iter().map(|s| parse_delete_stmt(s, &vars)).collect::<Result<Vec<_>>>()?;
    for (i, (q, multi, hint)) in parsed.iter().enumerate() {
        let stmt_id = ctx.statement_id(i);
        if let Some(entries) = ctx.begin_statement(stmt_id) {
            n += entries.iter().filter(|e| entry_op(e) == "d").count() as u64;
            retried.push(stmt_id);
            continue;
        }
        Counters::add(&ctx.shared.counters.delete, 1);
        let r = apply_delete(ctx, &name, q, *multi, None, hint.as_ref()).map(|d| d.len() as u64);
        match r {
            Ok(k) => n += k,
            Err(e) => {
                errors.push(write_error(i, &e));
                if ordered {
                    break;
                }
            }
        }
    }
    ctx.commit_write()?;
    let mut r = doc! { "n": n as i32 };
    if !errors.is_empty() {
        r.insert("writeErrors", errors);
    }
    add_retried(&mut r, retried);
    Ok(r)
}

pub fn find_and_modify(ctx: &mut Ctx) -> Result<Document> {
    check_fields(
        ctx.name,
        ctx.cmd,
        &["query", "sort", "remove", "update", "new", "fields", "upsert", "bypassDocumentValidation", "collation", "arrayFilters", "hint", "let", "stmtId"],
    )?;
    let name = ctx.collection_name()?.to_string();
    if let Some(c) = ctx.cmd.get("collation") {
        check_collation(c)?;
    }
    let vars = ctx.let_vars()?;
    let query_doc = ctx.doc_arg("query")?.cloned().unwrap_or_default();
    let query_doc = if vars.is_empty() { query_doc } else { vars.filter(&query_doc) };
    let sort = SortSpec::parse(ctx.doc_arg("sort")?.unwrap_or(&Document::new()))?;
    let remove = ctx.bool_arg("remove")?.unwrap_or(false);
    let return_new = ctx.bool_arg("new")?.unwrap_or(false);
    let upsert = ctx.bool_arg("upsert")?.unwrap_or(false);
    let fields_doc = ctx.doc_arg("fields")?.filter(|f| !f.is_empty()).cloned();
    let fields_doc = match fields_doc {
        Some(f) if !vars.is_empty() => vars.expression(&Bson::Document(f)).as_document().cloned(),
        f => f,
    };
    let fields = fields_doc.as_ref().map(Projection::parse).transpose()?;
    let update = ctx.cmd.get("update").map(|u| if vars.is_empty() { u.clone() } else { bind_update(&vars, u) });
    let array_filters: Option<Vec<Document>> = match ctx.array_arg("arrayFilters")? {
        Some(a) => Some(
            a.iter().map(|f| f.as_document().cloned().ok_or_else(|| Error::type_mismatch("arrayFilters elements must be objects"))).collect::<Result<_>>()?,
        ),
        None => None,
    };
    let project = |d: Option<Document>| -> Result<Bson> {
        Ok(match (d, &fields) {
            (Some(d), Some(p)) => Bson::Document(p.apply(&d, &MatchDetails::default())?),
            (Some(d), None) => Bson::Document(d),
            (None, _) => Bson::Null,
        })
    };
    if let Some(r) = &ctx.retry {
        // What a retry returns and the change's own entry may not hold: the document as it
        // was, or (an update returning the new one) as it became.
        let image = if remove || !return_new { storage::RetryImage::Before } else { storage::RetryImage::After };
        r.write.set_retry_image(Some(image));
    }
    let stmt = match ctx.cmd.get("stmtId") {
        Some(Bson::Int32(id)) => *id,
        _ => 0,
    };
    if let Some(entries) = ctx.begin_statement(stmt) {
        let (leo, value) = find_and_modify_retried(entries, return_new)?;
        return Ok(doc! { "lastErrorObject": leo, "value": project(value)?, "retriedStmtId": stmt });
    }
    if remove {
        if update.is_some() {
            return Err(Error::failed_to_parse("Cannot specify both an update and remove=true"));
        }
        if upsert {
            return Err(Error::failed_to_parse("Cannot specify both upsert=true and remove=true "));
        }
        if return_new {
            return Err(Error::failed_to_parse("Cannot specify both new=true and remove=true; 'remove' always returns the deleted document"));
        }
        Counters::add(&ctx.shared.counters.delete, 1);
        let deleted = apply_delete(ctx, &name, &query_doc, false, Some(&sort), ctx.cmd.get("hint"))?;
        ctx.commit_write()?;
        let n = deleted.len() as i32;
        return Ok(doc! { "lastErrorObject": { "n": n }, "value": project(deleted.into_iter().next())? });
    }
    let Some(update) = update else {
        return Err(Error::failed_to_parse("Either an update or remove=true must be specified"));
    };
    if !matches!(update, Bson::Document(_) | Bson::Array(_)) {
        return Err(Error::failed_to_parse("Update argument must be either an object or an array"));
    }
    Counters::add(&ctx.shared.counters.update, 1);
    Filter::parse(&query_doc)?;
    let stmt =
        UpdateStmt { hint: ctx.cmd.get("hint").cloned(), update: Update::parse(&update, array_filters.as_deref())?, query: query_doc, upsert, multi: false };
    let r = apply_update(ctx, &name, &stmt, Some(&sort))?;
    ctx.commit_write()?;
    let mut leo = doc! { "n": (r.n + r.upserted.is_some() as u64) as i32, "updatedExisting": r.n > 0 };
    if let Some(id) = &r.upserted {
        leo.insert("upserted", id.clone());
    }
    let value = if return_new { project(r.after)? } else { project(r.before)? };
    Ok(doc! { "lastErrorObject": leo, "value": value })
}

pub fn count(ctx: &mut Ctx) -> Result<Document> {
    check_fields("count", ctx.cmd, &["query", "limit", "skip", "hint", "collation", "fields", "readConcern"])?;
    if let Some(c) = ctx.cmd.get("collation") {
        check_collation(c)?;
    }
    let name = ctx.collection_name()?.to_string();
    let query_doc = ctx.doc_arg("query")?.cloned().unwrap_or_default();
    let skip = match ctx.int_arg("skip")? {
        Some(s) if s < 0 => return Err(Error::bad_value("skip value is negative in count query")),
        s => s.unwrap_or(0) as u64,
    };
    // A negative limit means the same as its absolute value for count.
    let limit = ctx.int_arg("limit")?.map(|l| l.unsigned_abs()).filter(|l| *l > 0);
    let filter = Filter::parse(&query_doc)?;
    let Some(coll) = ctx.store().collection(ctx.db, &name) else { return Ok(doc! { "n": 0 }) };
    check_hint(ctx, ctx.cmd.get("hint"), Some(&coll))?;
    let snapshot = coll.snapshot();
    let total = if filter.is_match_all() && ctx.conn.shard_filter.is_none() {
        snapshot.count()?
    } else {
        let (mut scan, _) = ctx.planned_scan(snapshot, &query_doc, None, ctx.cmd.get("hint"), None)?;
        let mut n = 0u64;
        let cap = limit.map(|l| l + skip).unwrap_or(u64::MAX);
        while n < cap && scan.next(ctx.op)?.is_some() {
            n += 1;
        }
        n
    };
    let mut n = total.saturating_sub(skip);
    if let Some(l) = limit {
        n = n.min(l);
    }
    Ok(doc! { "n": n as i64 as i32 })
}

/// Values at a dotted path, one level of arrays expanded at each step (distinct's semantics).
pub fn values_at_path<'a>(doc: &'a Document, path: &str, out: &mut Vec<&'a Bson>) {
    fn walk<'a>(v: &'a Bson, parts: &[&str], out: &mut Vec<&'a Bson>) {
        if parts.is_empty() {
            match v {
                Bson::Array(a) => out.extend(a.iter()),
                other => out.push(other),
            }
            return;
        }
        match v {
            Bson::Document(d) => {
                if let Some(next) = d.get(parts[0]) {
                    walk(next, &parts[1..], out);
                }
            }
            Bson::Array(a) => {
                if let Ok(i) = parts[0].parse::<usize>() {
                    if let Some(e) = a.get(i) {
                        walk(e, &parts[1..], out);
                    }
                } else {
                    for e in a {
                        if let Bson::Document(_) = e {
                            walk(e, parts, out);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let parts: Vec<&str> = path.split('.').collect();
    if let Some(first) = doc.get(parts[0]) {
        walk(first, &parts[1..], out);
    }
}

pub fn distinct(ctx: &mut Ctx) -> Result<Document> {
    check_fields("distinct", ctx.cmd, &["key", "query", "collation", "hint", "readConcern"])?;
    if let Some(c) = ctx.cmd.get("collation") {
        check_collation(c)?;
    }
    let name = ctx.collection_name()?.to_string();
    let key = ctx.str_arg("key")?.ok_or_else(|| Error::location(40414, "BSON field 'distinct.key' is missing but a required field"))?.to_string();
    if key.is_empty() {
        return Err(Error::new(Code::InvalidPath, "FieldPath cannot be constructed with empty string"));
    }
    let query_doc = ctx.doc_arg("query")?.cloned().unwrap_or_default();
    Filter::parse(&query_doc)?;
    let Some(coll) = ctx.store().collection(ctx.db, &name) else { return Ok(doc! { "values": [] }) };
    let (mut scan, _) = ctx.planned_scan(coll.snapshot(), &query_doc, None, ctx.cmd.get("hint"), None)?;
    let mut values: Vec<Bson> = Vec::new();
    let mut size = 0usize;
    while let Some((_, doc, _)) = scan.next(ctx.op)? {
        let mut found = Vec::new();
        values_at_path(&doc, &key, &mut found);
        for v in found {
            // Kept sorted so each lookup is a binary search; equal values (1, 1.0) collapse.
            if let Err(pos) = values.binary_search_by(|x| query::compare::cmp_bson(x, v)) {
                size += crate::exec::approx_doc_size(&doc! { "v": v.clone() });
                if size > common::limits::BSON_OBJECT_SIZE_MAX_BYTES {
                    return Err(Error::location(17217, "distinct too big, 16mb cap"));
                }
                values.insert(pos, v.clone());
            }
        }
    }
    Ok(doc! { "values": values })
}

/// A retried findAndModify's `lastErrorObject` and document, from the entries its earlier
/// attempt logged: the change, and before it the document the reply shows (a no-op entry),
/// as it was or as it became; an upsert's insert holds the new document itself.
fn find_and_modify_retried(entries: &[Document], return_new: bool) -> Result<(Document, Option<Document>)> {
    let incomplete = |what: &str| Error::new(Code::IncompleteTransactionHistory, format!("a retried findAndModify's oplog entries lack {what}"));
    let image = || {
        entries
            .iter()
            .find(|e| entry_op(e) == "n" && !storage::is_pre_image(e))
            .and_then(|e| e.get_document("o").ok())
            .cloned()
            .ok_or_else(|| incomplete("the document it returned"))
    };
    let change = entries.iter().rev().find(|e| entry_op(e) != "n").ok_or_else(|| incomplete("the change"))?;
    let inserted = || change.get_document("o").cloned().map_err(|_| incomplete("the inserted document"));
    Ok(match entry_op(change) {
        "d" => (doc! { "n": 1 }, Some(image()?)),
        "u" => (doc! { "n": 1, "updatedExisting": true }, Some(image()?)),
        "i" => (doc! { "n": 1, "updatedExisting": false, "upserted": entry_id(change)? }, if return_new { Some(inserted()?) } else { None }),
        other => return Err(incomplete(&format!("a change it can make (op {other:?})"))),
    })
}
