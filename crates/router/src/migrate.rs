//! Chunk migration, driven by the router that runs moveChunk or moveRange (the shards do
//! the data work: `commands::sharding`). The steps, as mongod's migration protocol:
//!
//! 1. Record the migration in config.migrations (one per collection at a time).
//! 2. The recipient gets the collection's indexes, and loses any leftovers in the range.
//! 3. The donor starts a migration source: from here its oplog says what changes.
//! 4. Clone: the range's documents, donor to recipient, a batch at a time; then the
//!    retryable writes' history in the range (so that a retry after the move finds its
//!    statements executed on the recipient).
//! 5. Catch up: what changed meanwhile (documents and sessions' history), until little is
//!    left.
//! 6. Critical section: config.migrations says so first (a donor that restarts or fails
//!    over then keeps writes waiting), then the donor stops writes to the collection and
//!    the last changes go over, majority-committed on the recipient.
//! 7. Commit on the config servers: first a version bump of a chunk the donor keeps, then
//!    the chunk itself moves to the recipient with a new major version, conditional on its
//!    owner and version (so a recovery's fence can make it fail).
//! 8. The donor lets writes go on: routers with the old table now get StaleConfig from it.
//! 9. The donor deletes its copies of the range; the migration's record goes.
//!
//! A failure before the commit aborts: the donor drops its source and opens its gate, and
//! the recipient deletes what it cloned. No document is lost or doubled at any step: until
//! the commit the donor owns the range and the recipient's copies are filtered out of reads
//! (`sharding::CollMeta::owns`); after it, the recipient has every change (the donor took
//! none after the last transfer), and the donor's copies are filtered out until deleted.
//!
//! The record holds a lease its router renews every `MIGRATION_LEASE_RENEW_INTERVAL` (5 s).
//! A record not renewed for `MIGRATION_LEASE` (30 s) is a dead router's, and any router's
//! next balancer round, or the collection's next migration, recovers it (`recover`): a
//! fence (the chunk's minor version bumped, if the donor still owns it at the recorded
//! version) decides the migration for good, since the commit is conditional on that
//! version; then the donor leaves its critical section, and the shard that does not own
//! the range deletes its copies. So the lease bounds how long a dead router's critical
//! section holds the donor's writes.

use super::catalog::{now_timestamp, ShardedColl};
use super::Router;
use bson::{doc, oid::ObjectId, Bson, Document};
use common::{Code, Error, Result};
use net::pool::{ReplicaSet, COMMAND_TIMEOUT};
use shard::{Chunk, ChunkVersion, Key};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Catch-up rounds before the critical section at most; and the changes one may leave for
/// the critical section.
const CATCH_UP_ROUNDS_MAX: usize = 100;
const CATCH_UP_LEFT_MAX: usize = 100;
/// The router running a migration renews its record's lease (`renewed`) this often; a
/// record not renewed for `MIGRATION_LEASE` is taken for a dead router's and recovered by
/// the next balancer round of any router (or the next migration of the collection). The
/// lease bounds how long a dead router's critical section holds the donor's writes.
const MIGRATION_LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(5);
pub const MIGRATION_LEASE: Duration = Duration::from_secs(30);
/// A movePrimary's record is not renewed: its lease is long enough for a large copy.
pub const MOVE_PRIMARY_LEASE: Duration = Duration::from_secs(300);
/// A catch-up that has not converged by then (the writes outpace the transfer) gives up.
const CATCH_UP_TIME_MAX: Duration = Duration::from_secs(240);

struct Migration<'a> {
    router: &'a Router,
    ns: String,
    db: String,
    coll: String,
    id: ObjectId,
    sc: Arc<ShardedColl>,
    chunk: Chunk,
    to: String,
    donor: Arc<ReplicaSet>,
    recipient: Arc<ReplicaSet>,
    started: Instant,
}

/// Move the chunk that starts at `min` to shard `to`. Returns once the donor has deleted
/// its copies (mongod's `_waitForDelete`) or failed to (logged; its copies stay filtered).
pub async fn move_chunk(router: &Router, ns: &str, min: &Key, to: &str) -> Result<()> {
    router.forget_collection(ns);
    let sc = router.sharded(ns).await?.ok_or_else(|| Error::new(Code(118, "NamespaceNotSharded"), format!("{ns} is not sharded")))?;
    let chunk = sc.table.chunk_for(min).clone();
    if &chunk.min != min {
        return Err(Error::new(Code::InvalidOptions, format!("{} is not the lower bound of a chunk of {ns}", sc.table.key.key_doc(min))));
    }
    let recipient = router.shard(to).await?;
    if chunk.shard == to {
        return Ok(());
    }
    let donor = router.shard(&chunk.shard).await?;
    let (db, coll) = ns.split_once('.').map(|(d, c)| (d.to_string(), c.to_string())).unwrap_or_default();
    let m = Migration { router, ns: ns.to_string(), db, coll, id: ObjectId::new(), sc, chunk, to: to.to_string(), donor, recipient, started: Instant::now() };
    m.record().await?;
    let mut committed = false;
    let work = async {
        let r = m.run(&mut committed).await;
        if let Err(e) = &r {
            tracing::warn!(ns = %m.ns, id = %m.id, committed, "migration failed: {}", e.message);
        }
        m.finish(committed).await;
        r
    };
    // The lease is renewed until the record is gone (`finish` deletes it).
    let renew = async {
        loop {
            tokio::time::sleep(MIGRATION_LEASE_RENEW_INTERVAL).await;
            let renewal =
                doc! {"update": "migrations", "updates": [{"q": {"_id": &m.ns, "migrationId": m.id}, "u": {"$set": {"renewed": bson::DateTime::now()}}}]};
            if let Err(e) = router.config_write(renewal).await {
                tracing::warn!(ns = %m.ns, "cannot renew the migration's lease: {}", e.message);
            }
        }
    };
    let r = tokio::select! {
        r = work => r,
        _ = renew => Err(Error::internal("a migration's lease renewal ended")),
    };
    router.forget_collection(ns);
    r
}

impl Migration<'_> {
    fn key_doc(&self, k: &Key) -> Document {
        self.sc.table.key.key_doc(k)
    }

    /// A command on the donor or recipient; `ok: 0` is the `Err`.
    async fn on(&self, set: &ReplicaSet, body: Document) -> Result<Document> {
        self.router.command(set, &self.db, body).await
    }

    fn range_fields(&self, name: &str) -> Document {
        doc! {name: &self.ns, "migrationId": self.id, "min": self.key_doc(&self.chunk.min), "max": self.key_doc(&self.chunk.max)}
    }

    /// Step 1; a record left by a router that died long ago is recovered first.
    async fn record(&self) -> Result<()> {
        let entry = doc! {
            "_id": &self.ns, "migrationId": self.id, "uuid": self.sc.uuid.clone(), "donor": &self.chunk.shard, "recipient": &self.to,
            "min": self.key_doc(&self.chunk.min), "max": self.key_doc(&self.chunk.max), "chunkLastmod": self.chunk.lastmod.to_timestamp(),
            "inCriticalSection": false, "started": bson::DateTime::now(),
        };
        for attempt in 0..2 {
            match self.router.config_write(doc! {"insert": "migrations", "documents": [entry.clone()]}).await {
                Ok(_) => return Ok(()),
                Err(e) if e.code == Code::DuplicateKey.0 && attempt == 0 => {
                    let existing = self.router.config_find("migrations", doc! {"_id": &self.ns}, doc! {}).await?;
                    let Some(old) = existing.into_iter().next() else { continue };
                    if !is_abandoned(&old) {
                        return Err(Error::new(
                            Code::ConflictingOperationInProgress,
                            format!("a migration of {} is in progress ({})", self.ns, old.get_object_id("migrationId").map(|i| i.to_hex()).unwrap_or_default()),
                        ));
                    }
                    recover(self.router, &old).await?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(Code::ConflictingOperationInProgress, format!("a migration of {} is in progress", self.ns)))
    }

    /// Send a transfer batch (from the clone or the catch-up) to the recipient.
    async fn apply(&self, upserts: Vec<Bson>, deletes: Vec<Bson>, sessions: Vec<Bson>, majority: bool) -> Result<()> {
        let mut body = self.range_fields("_recvChunkApply");
        body.insert("key", self.sc.table.key.to_doc().clone());
        body.insert("upserts", upserts);
        body.insert("deletes", deletes);
        body.insert("sessions", sessions);
        body.insert(
            "writeConcern",
            if majority {
                doc! {"w": "majority"}
            } else {
                doc! {"w": 1}
            },
        );
        let reply = self.router.pool.run(&self.recipient, &self.db, body, None, COMMAND_TIMEOUT).await?.1;
        super::catalog::write_result(reply).map(|_| ())
    }

    /// One transferMods round, applied on the recipient: how many changes it carried, and
    /// whether the donor's oplog has more now.
    async fn transfer(&self, majority: bool) -> Result<(usize, bool)> {
        // Reads on the donor need no write concern wait.
        let mods = self.on(&self.donor, doc! {"_shardsvrTransferMods": &self.ns, "migrationId": self.id, "writeConcern": {"w": 1, "j": false}}).await?;
        let upserts = mods.get_array("upserts").cloned().unwrap_or_default();
        let deletes = mods.get_array("deletes").cloned().unwrap_or_default();
        let sessions = mods.get_array("sessions").cloned().unwrap_or_default();
        let n = upserts.len() + deletes.len() + sessions.len();
        if n > 0 || majority {
            self.apply(upserts, deletes, sessions, majority).await?;
        }
        Ok((n, mods.get_bool("more").unwrap_or(false)))
    }

    async fn run(&self, committed: &mut bool) -> Result<()> {
        // 2: the recipient's indexes (and collection), and no leftovers in the range.
        let listed = self.on(&self.donor, doc! {"listIndexes": &self.coll}).await?;
        let specs = super::commands::index_specs_to_copy(&listed)?;
        if specs.is_empty() {
            self.on(&self.recipient, doc! {"create": &self.coll}).await.or_else(|e| {
                if e.code == Code::NamespaceExists.0 {
                    Ok(Document::new())
                } else {
                    Err(e)
                }
            })?;
        } else {
            self.on(&self.recipient, doc! {"createIndexes": &self.coll, "indexes": specs}).await?;
        }
        let mut cleanup = self.range_fields("_shardsvrCleanupRange");
        cleanup.remove("migrationId");
        self.on(&self.recipient, cleanup).await?;
        // 3 and 4.
        self.on(&self.donor, self.range_fields("_shardsvrMigrateStart")).await?;
        loop {
            let batch = self.on(&self.donor, doc! {"_shardsvrMigrateClone": &self.ns, "migrationId": self.id, "writeConcern": {"w": 1, "j": false}}).await?;
            let docs = batch.get_array("docs").cloned().unwrap_or_default();
            let sessions = batch.get_array("sessions").cloned().unwrap_or_default();
            if !docs.is_empty() || !sessions.is_empty() {
                self.apply(docs, Vec::new(), sessions, false).await?;
            }
            if batch.get_bool("done").unwrap_or(true) {
                break;
            }
        }
        // 5.
        for _ in 0..CATCH_UP_ROUNDS_MAX {
            let (n, more) = self.transfer(false).await?;
            if !more && n <= CATCH_UP_LEFT_MAX {
                break;
            }
        }
        if self.started.elapsed() > CATCH_UP_TIME_MAX {
            return Err(Error::new(Code::ExceededTimeLimit, format!("the migration of {} took too long to catch up", self.ns)));
        }
        // 6.
        self.router
            .config_write(
                doc! {"update": "migrations", "updates": [{"q": {"_id": &self.ns, "migrationId": self.id}, "u": {"$set": {"inCriticalSection": true}}}]},
            )
            .await?;
        self.on(&self.donor, doc! {"_shardsvrEnterCriticalSection": &self.ns, "migrationId": self.id}).await?;
        loop {
            let (_, more) = self.transfer(false).await?;
            if !more {
                break;
            }
        }
        // Everything the recipient took, majority-committed there.
        self.transfer(true).await?;
        // 7.
        let major = self.sc.table.version().major + 1;
        let now = now_timestamp();
        if let Some(kept) = self.sc.table.chunks().iter().find(|c| c.shard == self.chunk.shard && c.min != self.chunk.min) {
            let bump = ChunkVersion { major, minor: 1 }.to_timestamp();
            self.router.config_write(doc! {"update": "chunks", "updates": [{"q": {"uuid": self.sc.uuid.clone(), "min": self.key_doc(&kept.min), "shard": &kept.shard}, "u": {"$set": {"lastmod": bump}}}]}).await?;
        }
        let filter =
            doc! {"uuid": self.sc.uuid.clone(), "min": self.key_doc(&self.chunk.min), "shard": &self.chunk.shard, "lastmod": self.chunk.lastmod.to_timestamp()};
        let update = doc! {
            "$set": {"shard": &self.to, "lastmod": ChunkVersion { major, minor: 0 }.to_timestamp(), "onCurrentShardSince": now},
            "$push": {"history": {"$each": [{"validAfter": now, "shard": &self.to}], "$position": 0}},
        };
        let reply = self.router.config_write(doc! {"update": "chunks", "updates": [{"q": filter, "u": update}]}).await;
        match reply {
            Ok(r) if r.get("n").and_then(common::value::as_i64) == Some(1) => {
                *committed = true;
                Ok(())
            }
            Ok(_) => {
                Err(Error::new(Code::ConflictingOperationInProgress, format!("the chunk of {} changed during its migration (a recovery fenced it)", self.ns)))
            }
            Err(e) => {
                // The commit may have happened: decide by what the config servers hold.
                let now = self.router.config_find("chunks", doc! {"uuid": self.sc.uuid.clone(), "min": self.key_doc(&self.chunk.min)}, doc! {}).await?;
                *committed = now.first().and_then(|c| c.get_str("shard").ok()) == Some(self.to.as_str());
                if *committed {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Steps 8 and 9 after a commit; the abort otherwise. Each step is tried even if one
    /// before failed: what is left is filtered out of reads, and the record stays for a
    /// later recovery only if it cannot be removed.
    async fn finish(&self, committed: bool) {
        let exit = doc! {"_shardsvrExitCriticalSection": &self.ns, "migrationId": self.id, "committed": committed};
        if let Err(e) = self.on(&self.donor, exit).await {
            tracing::warn!(ns = %self.ns, "the donor did not leave the critical section: {}", e.message);
        }
        let mut cleanup = self.range_fields("_shardsvrCleanupRange");
        cleanup.remove("migrationId");
        let (side, set) = if committed { ("donor", &self.donor) } else { ("recipient", &self.recipient) };
        match self.on(set, cleanup).await {
            Ok(r) => {
                tracing::info!(ns = %self.ns, committed, deleted = r.get("deleted").and_then(common::value::as_i64).unwrap_or(0), "{side} deleted its copies of the range")
            }
            Err(e) => tracing::warn!(ns = %self.ns, "the {side} kept its copies of the range: {}", e.message),
        }
        if let Err(e) = self.router.config_write(doc! {"delete": "migrations", "deletes": [{"q": {"_id": &self.ns, "migrationId": self.id}, "limit": 1}]}).await
        {
            tracing::warn!(ns = %self.ns, "the migration record stays: {}", e.message);
        }
    }
}

/// Whether a migration's record (config.migrations) has outlived its lease, last renewed
/// (or started) more than `MIGRATION_LEASE` ago: its router died.
pub fn is_abandoned(record: &Document) -> bool {
    let renewed = record.get_datetime("renewed").or_else(|_| record.get_datetime("started")).ok();
    is_older_than(renewed, MIGRATION_LEASE)
}

/// Whether `at` is more than `lease` ago (no time counts as old).
pub fn is_older_than(at: Option<&bson::DateTime>, lease: Duration) -> bool {
    let age_ms = at.map(|t| bson::DateTime::now().timestamp_millis() - t.timestamp_millis()).unwrap_or(i64::MAX);
    age_ms >= lease.as_millis() as i64
}

/// Resolve a migration its router left (config.migrations `old`): fence the commit (bump
/// the chunk's minor version if it is still the donor's at the recorded version, so the
/// commit's conditional update can no longer match), then end it on the donor, and delete
/// the copies on the shard that does not own the range.
pub async fn recover(router: &Router, old: &Document) -> Result<()> {
    let ns = old.get_str("_id").unwrap_or_default().to_string();
    let (db, _) = ns.split_once('.').unwrap_or_default();
    let id = old.get_object_id("migrationId").map_err(|_| Error::internal("a migration record without migrationId"))?;
    let donor = old.get_str("donor").unwrap_or_default().to_string();
    let recipient = old.get_str("recipient").unwrap_or_default().to_string();
    let lastmod = old.get_timestamp("chunkLastmod").map_err(|_| Error::internal("a migration record without chunkLastmod"))?;
    let (min, max) = (old.get_document("min").cloned().unwrap_or_default(), old.get_document("max").cloned().unwrap_or_default());
    let uuid = old.get("uuid").cloned().unwrap_or(Bson::Null);
    let fence = Bson::Timestamp(bson::Timestamp { time: lastmod.time, increment: lastmod.increment + 1 });
    let r = router.config_write(doc! {"update": "chunks", "updates": [{"q": {"uuid": uuid.clone(), "min": min.clone(), "shard": &donor, "lastmod": lastmod}, "u": {"$set": {"lastmod": fence}}}]}).await?;
    let aborted = r.get("n").and_then(common::value::as_i64) == Some(1);
    tracing::warn!(%ns, %id, aborted, "recovering a migration its router left");
    let donor_set = router.shard(&donor).await?;
    router.command(&donor_set, db, doc! {"_shardsvrExitCriticalSection": &ns, "migrationId": id, "committed": !aborted}).await?;
    let holder = if aborted { recipient } else { donor };
    let set = router.shard(&holder).await?;
    if let Err(e) = router.command(&set, db, doc! {"_shardsvrCleanupRange": &ns, "min": min, "max": max}).await {
        tracing::warn!(%ns, "{holder} kept its copies of the left migration's range: {}", e.message);
    }
    router.config_write(doc! {"delete": "migrations", "deletes": [{"q": {"_id": &ns, "migrationId": id}, "limit": 1}]}).await?;
    Ok(())
}
