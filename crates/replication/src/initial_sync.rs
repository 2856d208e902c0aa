//! Initial sync (mongod's logical initial sync): a member with an empty oplog copies every
//! database but `local` from its sync source while the set keeps taking writes, then
//! catches up through the oplog.
//!
//! 1. Note the source's rollback id and its majority-committed oplog entry (`begin`; its
//!    oldest while it knows none: a secondary's newest entry may not be applied yet, and an
//!    entry not committed may be rolled back from under our oplog).
//! 2. Drop what this member holds outside `local`, then clone each database, collection,
//!    its documents and its indexes (built after the documents, as a bulk build).
//! 3. Note the source's newest entry (`minValid`): every change the clone may have seen is
//!    in the source's oplog between `begin` and `minValid`. A source whose rollback id
//!    moved meanwhile may have taken back writes the clone copied: copy again.
//! 4. Start our oplog with the `begin` entry and stay RECOVERING. The ordinary fetcher then
//!    tails from `begin` and applies every later entry; application is idempotent
//!    (`crate::apply`), so entries whose effect the clone already copied do no harm. Once
//!    `minValid` is applied the data is consistent and the member becomes SECONDARY
//!    (`ReplCoord::after_apply`).
//!
//! The initial-sync flag is set (durably) before step 2 drops anything and cleared once
//! the oplog is seeded, so a crash or an error anywhere before starts the whole sync again,
//! as mongod does after a failed attempt (a crash after goes on from the oplog, RECOVERING
//! until minValid). Until minValid is applied, a divergence from the source starts the sync
//! over too (`ReplCoord::restart_initial_sync`): the copy may hold writes the set took back.
//! A member whose sync finished never starts another (`ReplCoord::initial_sync_reason`).

use crate::Host;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use net::peer::{cursor_batch, PeerConn};
use repl::MemberState;
use std::sync::Arc;
use std::time::Duration;
use storage::OpTime;

/// Documents asked for per find or getMore while cloning (replies stay under the message
/// limit on their own: a batch ends at 16 MiB whatever the count).
const CLONE_BATCH_DOCS: i32 = 5000;
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// What replSetGetStatus reports as `initialSyncStatus` (a subset of mongod's fields).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub failed_attempts: i32,
    pub start: Option<bson::DateTime>,
    pub end: Option<bson::DateTime>,
    pub elapsed_ms: i64,
    pub sync_source: String,
    /// Why it started (`ReplCoord::initial_sync_reason`).
    pub reason: String,
    pub oplog_start: Option<OpTime>,
    pub oplog_end: Option<OpTime>,
    pub databases_cloned: i32,
    pub documents_copied: i64,
}

impl Stats {
    pub fn to_doc(&self) -> Document {
        // No maxFailedInitialSyncAttempts: shoal retries without a limit.
        let mut d = doc! {"failedInitialSyncAttempts": self.failed_attempts};
        if let Some(t) = self.start {
            d.insert("initialSyncStart", t);
        }
        if let Some(t) = self.end {
            d.insert("initialSyncEnd", t);
        }
        d.insert("totalInitialSyncElapsedMillis", self.elapsed_ms);
        d.insert("syncSourceHost", self.sync_source.clone());
        d.insert("reason", self.reason.clone());
        if let Some(o) = self.oplog_start {
            d.insert("initialSyncOplogStart", o.timestamp());
        }
        if let Some(o) = self.oplog_end {
            d.insert("initialSyncOplogEnd", o.timestamp());
        }
        d.insert("databases", doc! {"databasesCloned": self.databases_cloned});
        d.insert("documentsCopied", self.documents_copied);
        d
    }
}

/// Clone from `host`, seed the oplog and enter RECOVERING until minValid. A failed attempt
/// is counted; the fetcher starts another.
pub async fn run(shared: &Arc<dyn Host>, conn: &mut PeerConn, host: &str, reason: String) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    let started = std::time::Instant::now();
    tracing::info!(%host, %reason, "starting an initial sync");
    // Out of the set's reads before the status says a sync runs.
    coord.set_state(MemberState::Startup2);
    {
        let mut inner = coord.inner.lock();
        let failed_attempts = inner.initial_sync.failed_attempts;
        inner.initial_sync = Stats { failed_attempts, start: Some(bson::DateTime::now()), sync_source: host.to_string(), reason, ..Stats::default() };
    }
    let r = attempt(shared, conn, host).await;
    let mut inner = coord.inner.lock();
    inner.initial_sync.elapsed_ms = started.elapsed().as_millis() as i64;
    match &r {
        Ok(()) => inner.initial_sync.end = Some(bson::DateTime::now()),
        Err(_) => inner.initial_sync.failed_attempts += 1,
    }
    r
}

async fn attempt(shared: &Arc<dyn Host>, conn: &mut PeerConn, host: &str) -> Result<()> {
    let coord = shared.coord().expect("replica set member");
    coord.set_info_message(format!("initial sync from {host}"));
    let rbid = rollback_id(conn).await?;
    let begin = begin_entry(conn).await?;
    let begin_at = OpTime::from_doc(&begin).ok_or_else(|| Error::new(Code::FailedToParse, format!("{host}'s oplog entry {begin} has no ts and t")))?;
    coord.inner.lock().initial_sync.oplog_start = Some(begin_at);
    let store = shared.store().clone();
    super::blocking(move || -> Result<()> {
        // Before anything is dropped: a crash from here until the oplog is seeded starts
        // the sync over after the restart, whatever the oplog holds by then.
        super::ReplCoord::persist_initial_sync_flag(&store, true)?;
        // What an attempt started over seeded goes too: the oplog restarts at `begin`.
        if store.oplog_last().unwrap_or_default() != OpTime::default() {
            store.truncate_oplog_after(OpTime::default())?;
        }
        // Not logged: these drops are this member's own, and its oplog must stay empty until
        // it is seeded with the source's entry.
        let store = store.replicated();
        for db in store.database_names() {
            if db != "local" {
                store.drop_database(&db)?;
            }
        }
        Ok(())
    })
    .await?;
    let dbs = conn.command("admin", doc! {"listDatabases": 1, "nameOnly": true, "$readPreference": secondary_ok()}, COMMAND_TIMEOUT).await?;
    for d in dbs.get_array("databases").map_err(|_| malformed(host, "listDatabases"))? {
        let Some(db) = d.as_document().and_then(|d| d.get_str("name").ok()) else { continue };
        if db == "local" {
            continue;
        }
        for (name, options, uuid) in list_collections(conn, host, db).await? {
            let n = clone_collection(shared, conn, host, db, &name, options, uuid).await?;
            coord.inner.lock().initial_sync.documents_copied += n as i64;
        }
        coord.inner.lock().initial_sync.databases_cloned += 1;
    }
    crate::fail_points::INITIAL_SYNC_CLONED_HANG.hold_async().await;
    let min_valid = OpTime::from_doc(&newest_entry(conn).await?).unwrap_or(begin_at);
    // A source that rolled back meanwhile may have taken back writes the clone copied,
    // which no entry from `begin` on would undo: copy again (mongod's rollback id check).
    if rollback_id(conn).await? != rbid {
        return Err(Error::new(Code::UnrecoverableRollbackError, format!("{host} rolled back while this member copied from it: copying again")));
    }
    coord.inner.lock().initial_sync.oplog_end = Some(min_valid);
    // Seed the oplog with `begin`, applied (idempotently) like any fetched entry, so the
    // fetcher's check that the source's first entry is our newest holds.
    let store = shared.store().clone();
    super::blocking(move || -> Result<()> {
        let bytes = begin.to_vec().map_err(|e| Error::internal(e.to_string()))?;
        // minValid first: once the seeded oplog is durable, so is minValid (one journal).
        super::ReplCoord::persist_min_valid(&store, min_valid)?;
        crate::apply::apply_entry(&store.replicated(), &begin)?;
        store.append_oplog_replicated(&[(begin_at, bytes)])?;
        // The flag stays until minValid is applied (`ReplCoord::after_apply`): the copy may
        // hold writes that only the entries up to minValid confirm, and a restart before
        // then copies again, as mongod's initial sync does when its oplog application
        // phase is cut short.
        store.commit_durable()
    })
    .await?;
    let documents_copied = coord.inner.lock().initial_sync.documents_copied;
    tracing::info!(%host, documents_copied, ?begin_at, ?min_valid, "initial sync cloned the data; applying the oplog up to minValid");
    coord.recover_from_initial_sync(min_valid, shared.store().oplog_applied().unwrap_or_default());
    Ok(())
}

/// Reads on a secondary source need the client's consent, as any driver's would.
fn secondary_ok() -> Document {
    doc! {"mode": "secondaryPreferred"}
}

fn malformed(host: &str, what: &str) -> Error {
    Error::new(Code::ProtocolError, format!("malformed {what} reply from {host}"))
}

/// Where our oplog starts: the source's majority-committed entry (its oldest, the set's
/// first, while it knows none). Its data has reached at least this far when the clone reads it;
/// not its newest entry, which a secondary may have written but not applied yet (a member
/// whose oplog started there never applied the entries in between, which the clone missed
/// too). And committed, so that no rollback ever needs to go back past it, where this
/// member has no entries to find a common point with another.
async fn begin_entry(conn: &mut PeerConn) -> Result<Document> {
    let host = conn.host.clone();
    let status = conn.command("admin", doc! {"replSetGetStatus": 1}, COMMAND_TIMEOUT).await?;
    let optimes = status.get_document("optimes").map_err(|_| malformed(&host, "replSetGetStatus"))?;
    let optime = |k: &str| optimes.get_document(k).ok().and_then(OpTime::from_doc);
    let applied = optime("appliedOpTime").ok_or_else(|| malformed(&host, "replSetGetStatus"))?;
    let Some(at) = optime("lastCommittedOpTime").filter(|c| *c != OpTime::default() && *c <= applied) else {
        // No commit point known yet (a new set): the source's oldest entry, the set's first,
        // which every member's oplog starts with.
        return oplog_edge(conn, 1).await;
    };
    let r = conn.command("local", doc! {"find": "oplog.rs", "filter": {"ts": at.timestamp()}, "limit": 1, "singleBatch": true}, COMMAND_TIMEOUT).await?;
    let batch = r.get_document("cursor").and_then(|c| c.get_array("firstBatch")).map_err(|_| malformed(&host, "oplog find"))?;
    match batch.first() {
        Some(Bson::Document(d)) if OpTime::from_doc(d) == Some(at) => Ok(d.clone()),
        _ => Err(Error::new(Code::OplogStartMissing, format!("{host}'s oplog has no entry at {at:?}"))),
    }
}

/// The source's rollback id (replSetGetRBID).
async fn rollback_id(conn: &mut PeerConn) -> Result<i32> {
    let host = conn.host.clone();
    let r = conn.command("admin", doc! {"replSetGetRBID": 1}, COMMAND_TIMEOUT).await?;
    r.get_i32("rbid").map_err(|_| malformed(&host, "replSetGetRBID"))
}

/// The source's newest oplog entry: its data cannot be past it (minValid).
async fn newest_entry(conn: &mut PeerConn) -> Result<Document> {
    oplog_edge(conn, -1).await
}

/// The source's oldest (`order` 1) or newest (-1) oplog entry.
async fn oplog_edge(conn: &mut PeerConn, order: i32) -> Result<Document> {
    let host = conn.host.clone();
    let r = conn.command("local", doc! {"find": "oplog.rs", "sort": {"$natural": order}, "limit": 1, "singleBatch": true}, COMMAND_TIMEOUT).await?;
    let batch = r.get_document("cursor").and_then(|c| c.get_array("firstBatch")).map_err(|_| malformed(&host, "oplog find"))?;
    match batch.first() {
        Some(Bson::Document(d)) => Ok(d.clone()),
        _ => Err(Error::new(Code::OplogStartMissing, format!("{host} has an empty oplog"))),
    }
}

/// Collections of `db` on the source, with their creation options and UUIDs.
pub async fn list_collections(conn: &mut PeerConn, host: &str, db: &str) -> Result<Vec<(String, Document, Option<bson::Uuid>)>> {
    let docs = all_docs(conn, host, db, "listCollections", doc! {"listCollections": 1, "$readPreference": secondary_ok()}).await?;
    let mut out = Vec::new();
    for c in docs {
        if c.get_str("type").unwrap_or("collection") != "collection" {
            return Err(Error::new(
                Code::CommandNotSupported,
                format!("{host} has a {} in {db}, which initial sync cannot copy", c.get_str("type").unwrap_or("?")),
            ));
        }
        let name = c.get_str("name").map_err(|_| malformed(host, "listCollections"))?.to_string();
        let uuid = match c.get_document("info").ok().and_then(|i| i.get("uuid")) {
            Some(Bson::Binary(b)) => b.to_uuid().ok(),
            _ => None,
        };
        out.push((name, c.get_document("options").cloned().unwrap_or_default(), uuid));
    }
    Ok(out)
}

/// Copy one collection: create it with its options, insert its documents batch by batch,
/// then build its indexes (the collection keeps the source's UUID). Returns how many
/// documents were copied.
pub async fn clone_collection(
    shared: &Arc<dyn Host>,
    conn: &mut PeerConn,
    host: &str,
    db: &str,
    name: &str,
    options: Document,
    uuid: Option<bson::Uuid>,
) -> Result<u64> {
    let store = shared.store().clone();
    let (d, n) = (db.to_string(), name.to_string());
    super::blocking(move || store.replicated().create_collection_as(&d, &n, options, uuid, false).map(|_| ())).await?;
    let mut copied = 0u64;
    let find = doc! {"find": name, "batchSize": CLONE_BATCH_DOCS, "$readPreference": secondary_ok()};
    let reply = conn.command(db, find, COMMAND_TIMEOUT).await?;
    let (mut id, mut batch) = cursor_batch(&reply, "firstBatch").map_err(|_| malformed(host, "find"))?;
    loop {
        if !batch.is_empty() {
            copied += batch.len() as u64;
            insert_batch(shared, db, name, std::mem::take(&mut batch)).await?;
        }
        if id == 0 {
            break;
        }
        let get_more = doc! {"getMore": id, "collection": name, "batchSize": CLONE_BATCH_DOCS, "$readPreference": secondary_ok()};
        let reply = conn.command(db, get_more, COMMAND_TIMEOUT).await?;
        (id, batch) = cursor_batch(&reply, "nextBatch").map_err(|_| malformed(host, "getMore"))?;
    }
    let specs = all_docs(conn, host, db, "listIndexes", doc! {"listIndexes": name, "$readPreference": secondary_ok()}).await?;
    let store = shared.store().clone();
    let (d, n) = (db.to_string(), name.to_string());
    super::blocking(move || -> Result<()> {
        let coll = store.replicated().collection(&d, &n).ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("{d}.{n} vanished while it was cloned")))?;
        for spec in specs {
            if spec.get_str("name").ok() == Some("_id_") {
                continue;
            }
            coll.create_index(storage::IndexSpec::from_spec(spec)?)?;
        }
        Ok(())
    })
    .await?;
    Ok(copied)
}

/// Insert cloned documents. A document already here (none should be: the collection was
/// created empty) is an error, not silently skipped.
async fn insert_batch(shared: &Arc<dyn Host>, db: &str, name: &str, docs: Vec<Document>) -> Result<()> {
    let store = shared.store().clone();
    let (d, n) = (db.to_string(), name.to_string());
    super::blocking(move || -> Result<()> {
        let coll = store.replicated().collection(&d, &n).ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("{d}.{n} vanished while it was cloned")))?;
        let outcome = coll.insert_many(&docs, true);
        match outcome.errors.into_iter().next() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    })
    .await
}

/// Every document of a command's cursor, batch after batch.
pub async fn all_docs(conn: &mut PeerConn, host: &str, db: &str, what: &str, cmd: Document) -> Result<Vec<Document>> {
    let reply = conn.command(db, cmd, COMMAND_TIMEOUT).await?;
    let (mut id, mut out) = cursor_batch(&reply, "firstBatch").map_err(|_| malformed(host, what))?;
    while id != 0 {
        let coll = reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_str("ns").ok())
            .and_then(|ns| ns.split_once('.'))
            .map(|(_, c)| c.to_string())
            .unwrap_or_default();
        let r = conn.command(db, doc! {"getMore": id, "collection": coll, "$readPreference": secondary_ok()}, COMMAND_TIMEOUT).await?;
        let (next, more) = cursor_batch(&r, "nextBatch").map_err(|_| malformed(host, what))?;
        id = next;
        out.extend(more);
    }
    Ok(out)
}
