//! The opcodes of drivers older than OP_MSG, as mongod 5.0 took them: OP_QUERY (commands on
//! `<db>.$cmd`, and finds on a collection), OP_GET_MORE, OP_KILL_CURSORS, and the writes
//! OP_INSERT, OP_UPDATE and OP_DELETE, which have no reply: a client learns their outcome
//! with getLastError. Each becomes the command it stands for, run through the service like
//! any other, so access control, auditing and replication treat it alike.
//!
//! Per connection the loop keeps what these need (`Legacy`): the last write's outcome, and
//! the namespace of each cursor a legacy find opened, which OP_KILL_CURSORS does not name.

use crate::service::Service;
use bson::{doc, Bson, Document};
use std::collections::HashMap;
use wire::legacy::{OpDelete, OpGetMore, OpInsert, OpKillCursors, OpUpdate};
use wire::{Message, OpQuery, OpReply, Request};

/// OP_QUERY's flags.
const QUERY_TAILABLE: u32 = 1 << 1;
const QUERY_SECONDARY_OK: u32 = 1 << 2;
const QUERY_NO_CURSOR_TIMEOUT: u32 = 1 << 4;
const QUERY_AWAIT_DATA: u32 = 1 << 5;
const QUERY_EXHAUST: u32 = 1 << 6;
const QUERY_PARTIAL: u32 = 1 << 7;
/// OP_REPLY's responseFlags.
const REPLY_CURSOR_NOT_FOUND: u32 = 1;
const REPLY_QUERY_FAILURE: u32 = 2;
const REPLY_AWAIT_CAPABLE: u32 = 8;
/// Cursors a connection's legacy finds keep open at most (their namespaces, for
/// OP_KILL_CURSORS); past it the oldest are forgotten (their cursors still time out).
const CURSORS_MAX: usize = 10_000;

/// A connection's legacy state.
#[derive(Default)]
pub struct Legacy {
    /// getLastError's answer for the last legacy write.
    last_write: Option<Document>,
    /// Open cursors of legacy finds: id -> (namespace, documents returned so far).
    cursors: HashMap<i64, (String, i32)>,
    /// The client was told once, in the log, that it uses legacy opcodes.
    logged: bool,
}

impl Legacy {
    fn note(&mut self, conn_id: u64, op: &str) {
        if !self.logged {
            self.logged = true;
            tracing::warn!(conn = conn_id, "the client uses the legacy opcode {op}, which MongoDB 6.0 removed; upgrade its driver");
        }
    }
}

/// What a legacy message leaves the loop to do.
pub enum Outcome {
    Reply(OpReply),
    /// A write or OP_KILL_CURSORS: no reply.
    Nothing,
    /// The service dropped the connection.
    Close,
}

/// Serve one legacy message (any but OP_MSG and OP_REPLY).
pub async fn handle<S: Service>(service: &S, conn: &mut S::Conn, legacy: &mut Legacy, message: Message) -> Outcome {
    let replied = |r: Option<OpReply>| r.map_or(Outcome::Close, Outcome::Reply);
    let done = |r: Option<()>| r.map_or(Outcome::Close, |()| Outcome::Nothing);
    match message {
        Message::Query(q) => replied(op_query(service, conn, legacy, q).await),
        Message::GetMore(g) => replied(op_get_more(service, conn, legacy, g).await),
        Message::KillCursors(k) => done(op_kill_cursors(service, conn, legacy, k).await),
        Message::Insert(i) => done(op_write(service, conn, legacy, LegacyWrite::Insert(i)).await),
        Message::Update(u) => done(op_write(service, conn, legacy, LegacyWrite::Update(u)).await),
        Message::Delete(d) => done(op_write(service, conn, legacy, LegacyWrite::Delete(d)).await),
        Message::Msg(_) | Message::Reply(_) => Outcome::Close,
    }
}

fn split_namespace(ns: &str) -> Option<(&str, &str)> {
    ns.split_once('.').filter(|(db, coll)| !db.is_empty() && !coll.is_empty())
}

fn error_doc(message: impl Into<String>, code: i32) -> Document {
    doc! {"$err": message.into(), "code": code, "ok": 0.0}
}

fn reply(flags: u32, cursor_id: i64, starting_from: i32, documents: Vec<Document>) -> OpReply {
    OpReply { response_flags: flags, cursor_id, starting_from, documents }
}

/// Run `body` on `db` as a command; `None` when the service dropped the connection.
async fn run<S: Service>(service: &S, conn: &mut S::Conn, db: &str, mut body: Document) -> Option<Document> {
    body.insert("$db", db);
    match Request::from_msg(body, Vec::new()) {
        Ok(r) => {
            let out = service.run(conn, r).await;
            (!out.close).then(|| out.into_document())
        }
        Err(e) => Some(e.to_reply()),
    }
}

fn ok(reply: &Document) -> bool {
    matches!(reply.get("ok"), Some(Bson::Double(v)) if *v == 1.0) || matches!(reply.get("ok"), Some(Bson::Int32(1)))
}

/// OP_QUERY: a command on `<db>.$cmd`, or a find on a collection. `None`: drop the connection.
async fn op_query<S: Service>(service: &S, conn: &mut S::Conn, legacy: &mut Legacy, q: OpQuery) -> Option<OpReply> {
    let Some((db, coll)) = split_namespace(&q.full_collection_name) else {
        return Some(reply(REPLY_QUERY_FAILURE, 0, 0, vec![error_doc(format!("Invalid namespace specified '{}'", q.full_collection_name), 73)]));
    };
    if coll == "$cmd" {
        // Old drivers may wrap the command as {$query: {...}, $readPreference: ...}.
        let cmd = match q.query.get_document("$query") {
            Ok(inner) => inner.clone(),
            Err(_) => q.query.clone(),
        };
        let name = cmd.keys().next().cloned().unwrap_or_default();
        if !wire::is_hello(&name) {
            legacy.note(S::conn_id(conn), "OP_QUERY");
        }
        let out = if name.eq_ignore_ascii_case("getLastError") {
            let mut gle = legacy.last_write.clone().unwrap_or_else(|| doc! {"n": 0, "err": Bson::Null});
            gle.insert("ok", 1.0);
            gle
        } else {
            run(service, conn, db, cmd).await?
        };
        return Some(reply(0, 0, 0, vec![out]));
    }
    legacy.note(S::conn_id(conn), "OP_QUERY");
    if q.flags & QUERY_EXHAUST != 0 {
        return Some(reply(REPLY_QUERY_FAILURE, 0, 0, vec![error_doc("exhaust legacy queries are not supported by shoal", 115)]));
    }
    let find = match find_command(coll, &q) {
        Ok(f) => f,
        Err(e) => return Some(reply(REPLY_QUERY_FAILURE, 0, 0, vec![error_doc(e.message, e.code)])),
    };
    let out = run(service, conn, db, find).await?;
    Some(cursor_reply(legacy, &q.full_collection_name, out, "firstBatch", 0))
}

/// A legacy query's find command: the query document is the filter, or `$query` beside
/// modifiers ($orderby, $hint, $min, $max, $returnKey, $showDiskLoc, $comment, $maxTimeMS).
fn find_command(coll: &str, q: &OpQuery) -> common::Result<Document> {
    let mut find = doc! {"find": coll};
    let wrapped = q.query.contains_key("$query") || q.query.contains_key("query") && q.query.keys().any(|k| k.starts_with('$'));
    if wrapped {
        for (k, v) in &q.query {
            let field = match k.as_str() {
                "$query" | "query" => "filter",
                "$orderby" | "orderby" => "sort",
                "$hint" => "hint",
                "$min" => "min",
                "$max" => "max",
                "$returnKey" => "returnKey",
                "$showDiskLoc" => "showRecordId",
                "$comment" => "comment",
                "$maxTimeMS" => "maxTimeMS",
                "$readPreference" => "$readPreference",
                "$explain" | "$snapshot" => {
                    return Err(common::Error::new(common::Code::CommandNotSupported, format!("the legacy query modifier {k} is not supported by shoal")))
                }
                other => return Err(common::Error::bad_value(format!("unknown legacy query modifier {other}"))),
            };
            find.insert(field, v.clone());
        }
    } else {
        find.insert("filter", q.query.clone());
    }
    if let Some(p) = &q.return_fields_selector {
        find.insert("projection", p.clone());
    }
    if q.number_to_skip > 0 {
        find.insert("skip", q.number_to_skip);
    }
    // numberToReturn: negative (or 1) is a limit in one batch, positive the first batch.
    match q.number_to_return {
        n if n < 0 || n == 1 => {
            find.insert("limit", n.unsigned_abs() as i64);
            find.insert("singleBatch", true);
        }
        n if n > 1 => {
            find.insert("batchSize", n);
        }
        _ => {}
    }
    for (flag, field) in
        [(QUERY_TAILABLE, "tailable"), (QUERY_AWAIT_DATA, "awaitData"), (QUERY_NO_CURSOR_TIMEOUT, "noCursorTimeout"), (QUERY_PARTIAL, "allowPartialResults")]
    {
        if q.flags & flag != 0 {
            find.insert(field, true);
        }
    }
    if q.flags & QUERY_SECONDARY_OK != 0 && !find.contains_key("$readPreference") {
        find.insert("$readPreference", doc! {"mode": "secondaryPreferred"});
    }
    Ok(find)
}

/// A cursor command's reply as OP_REPLY; the cursor is remembered while it stays open.
fn cursor_reply(legacy: &mut Legacy, ns: &str, out: Document, batch_key: &str, starting_from: i32) -> OpReply {
    if !ok(&out) {
        let code = out.get_i32("code").unwrap_or(common::Code::InternalError.0);
        let flags = if code == common::Code::CursorNotFound.0 { REPLY_CURSOR_NOT_FOUND } else { REPLY_QUERY_FAILURE };
        let docs = if flags == REPLY_CURSOR_NOT_FOUND { Vec::new() } else { vec![error_doc(out.get_str("errmsg").unwrap_or_default(), code)] };
        return reply(flags, 0, starting_from, docs);
    }
    let cursor = out.get_document("cursor").cloned().unwrap_or_default();
    let id = cursor.get_i64("id").unwrap_or(0);
    let docs: Vec<Document> = cursor.get_array(batch_key).map(|b| b.iter().filter_map(|d| d.as_document().cloned()).collect()).unwrap_or_default();
    let returned = starting_from.saturating_add(docs.len() as i32);
    if id != 0 {
        if legacy.cursors.len() >= CURSORS_MAX && !legacy.cursors.contains_key(&id) {
            if let Some(oldest) = legacy.cursors.keys().next().copied() {
                legacy.cursors.remove(&oldest);
            }
        }
        legacy.cursors.insert(id, (ns.to_string(), returned));
    }
    reply(REPLY_AWAIT_CAPABLE, id, starting_from, docs)
}

/// OP_GET_MORE: the cursor's next batch.
async fn op_get_more<S: Service>(service: &S, conn: &mut S::Conn, legacy: &mut Legacy, g: OpGetMore) -> Option<OpReply> {
    legacy.note(S::conn_id(conn), "OP_GET_MORE");
    let Some((db, coll)) = split_namespace(&g.full_collection_name) else {
        return Some(reply(REPLY_QUERY_FAILURE, 0, 0, vec![error_doc("Invalid namespace", 73)]));
    };
    let mut cmd = doc! {"getMore": g.cursor_id, "collection": coll};
    if g.number_to_return > 0 {
        cmd.insert("batchSize", g.number_to_return);
    }
    let out = run(service, conn, db, cmd).await?;
    let starting_from = legacy.cursors.remove(&g.cursor_id).map_or(0, |(_, n)| n);
    Some(cursor_reply(legacy, &g.full_collection_name, out, "nextBatch", starting_from))
}

/// OP_KILL_CURSORS: no reply. A cursor this connection's legacy finds did not open is one
/// whose namespace it does not know; that one times out instead.
async fn op_kill_cursors<S: Service>(service: &S, conn: &mut S::Conn, legacy: &mut Legacy, k: OpKillCursors) -> Option<()> {
    legacy.note(S::conn_id(conn), "OP_KILL_CURSORS");
    let mut by_ns: HashMap<String, Vec<i64>> = HashMap::new();
    for id in k.cursor_ids {
        if let Some((ns, _)) = legacy.cursors.remove(&id) {
            by_ns.entry(ns).or_default().push(id);
        }
    }
    for (ns, ids) in by_ns {
        if let Some((db, coll)) = split_namespace(&ns) {
            run(service, conn, db, doc! {"killCursors": coll, "cursors": ids}).await?;
        }
    }
    Some(())
}

/// getLastError's answer for a write's reply: its count and its first error.
fn last_error(out: &Document, n: i64) -> Document {
    let mut gle = doc! {"n": n, "err": Bson::Null};
    let first_error = out.get_array("writeErrors").ok().and_then(|w| w.first()).and_then(Bson::as_document);
    match (ok(out), first_error) {
        (true, None) => {}
        (true, Some(e)) => {
            gle.insert("err", e.get_str("errmsg").unwrap_or_default());
            gle.insert("code", e.get_i32("code").unwrap_or(common::Code::InternalError.0));
        }
        (false, _) => {
            gle.insert("err", out.get_str("errmsg").unwrap_or_default());
            gle.insert("code", out.get_i32("code").unwrap_or(common::Code::InternalError.0));
        }
    }
    if let Ok(wce) = out.get_document("writeConcernError") {
        gle.insert("writeConcernError", wce.clone());
    }
    gle
}

fn count(out: &Document, field: &str) -> i64 {
    out.get(field).and_then(common::value::as_i64).unwrap_or(0)
}

/// OP_INSERT, OP_UPDATE or OP_DELETE: run as its command; the outcome is kept for
/// getLastError. `None`: drop the connection.
async fn op_write<S: Service>(service: &S, conn: &mut S::Conn, legacy: &mut Legacy, write: LegacyWrite) -> Option<()> {
    let (op, ns) = match &write {
        LegacyWrite::Insert(i) => ("OP_INSERT", i.full_collection_name.clone()),
        LegacyWrite::Update(u) => ("OP_UPDATE", u.full_collection_name.clone()),
        LegacyWrite::Delete(d) => ("OP_DELETE", d.full_collection_name.clone()),
    };
    legacy.note(S::conn_id(conn), op);
    let Some((db, coll)) = split_namespace(&ns) else {
        legacy.last_write = Some(doc! {"n": 0, "err": format!("Invalid namespace specified '{ns}'"), "code": 73});
        return Some(());
    };
    let gle = match write {
        LegacyWrite::Insert(OpInsert { flags, documents, .. }) => {
            let ordered = flags & wire::legacy::INSERT_CONTINUE_ON_ERROR == 0;
            let out = run(service, conn, db, doc! {"insert": coll, "documents": documents, "ordered": ordered}).await?;
            // As mongod's getLastError: n is 0 after an insert.
            last_error(&out, 0)
        }
        LegacyWrite::Update(OpUpdate { flags, selector, update, .. }) => {
            let upsert = flags & wire::legacy::UPDATE_UPSERT != 0;
            let multi = flags & wire::legacy::UPDATE_MULTI != 0;
            let stmt = doc! {"q": selector, "u": update, "upsert": upsert, "multi": multi};
            let out = run(service, conn, db, doc! {"update": coll, "updates": [stmt]}).await?;
            let upserted = out.get_array("upserted").ok().and_then(|u| u.first()).and_then(Bson::as_document).and_then(|u| u.get("_id")).cloned();
            let mut gle = last_error(&out, count(&out, "n"));
            gle.insert("updatedExisting", upserted.is_none() && count(&out, "n") > 0);
            if let Some(id) = upserted {
                gle.insert("upserted", id);
            }
            gle
        }
        LegacyWrite::Delete(OpDelete { flags, selector, .. }) => {
            let limit = i32::from(flags & wire::legacy::DELETE_SINGLE_REMOVE != 0);
            let out = run(service, conn, db, doc! {"delete": coll, "deletes": [{"q": selector, "limit": limit}]}).await?;
            last_error(&out, count(&out, "n"))
        }
    };
    legacy.last_write = Some(gle);
    Some(())
}

/// The legacy writes, which share `op_write`.
enum LegacyWrite {
    Insert(OpInsert),
    Update(OpUpdate),
    Delete(OpDelete),
}
