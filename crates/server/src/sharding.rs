//! A shard's side of sharding (mongod's ShardingState and filtering metadata): who this
//! member's set is in the cluster, which chunks of each sharded collection it owns, and the
//! gate a migration closes to stop writes for its commit.
//!
//! A router sends `shardVersion` (`{uuid, v}`: the collection's uuid and this shard's
//! version, its highest chunk's `lastmod`, in the router's routing table) with every
//! operation on a sharded collection. `admit` checks it against what this shard knows,
//! asking the config servers again when the router's is newer. A different major version
//! or collection is StaleConfig (13388): the router refreshes its table and retries. So
//! once a migration has committed (raising the donor's and the recipient's major version),
//! no router can read or write the moved range on the old owner.
//!
//! Reads that carry a shard version see only the documents in this shard's chunks: a
//! migration's documents live on both shards for a while (cloned to the recipient before
//! the commit, deleted from the donor after it), and the shard that does not own them
//! filters them out (`CollMeta::owns`, applied by `exec::Scan`).
//!
//! The shard learns its name and the config servers from `_addShard`, sent by routers. It
//! keeps them in memory only; a member that restarts or becomes primary answers
//! ShardingStateNotInitialized (203) until a router sends them again.

use bson::{doc, oid::ObjectId, Bson, Document};
use common::{Code, Error, Result};
use net::pool::config_find;
use net::pool::{Pool, ReplicaSet};
use parking_lot::{Mutex, RwLock};
use shard::{chunks::chunk_from_doc, key::cmp_keys, ChunkVersion, Key, ShardKeyPattern};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::Request;

/// How long a write waits for a migration's critical section to end before it answers
/// StaleConfig (the router retries it).
pub const CRITICAL_SECTION_WAIT: Duration = Duration::from_secs(30);
/// How long a migration waits for the writes already admitted to finish when it closes the
/// gate.
pub const GATE_DRAIN_WAIT: Duration = Duration::from_secs(10);
/// Sharded collections whose metadata a shard caches at most.
const COLLECTIONS_CACHED_MAX: usize = 10_000;

pub struct Identity {
    pub shard_name: String,
    pub config: Arc<ReplicaSet>,
}

/// What this shard knows of one sharded collection: its uuid, key, and the chunks it owns.
pub struct CollMeta {
    pub uuid: Bson,
    pub key: ShardKeyPattern,
    /// This shard's chunks as (min, max), in key order.
    owned: Vec<(Key, Key)>,
    /// This shard's version: its highest chunk's lastmod (zero if it owns none).
    pub version: ChunkVersion,
    /// config.migrations names this shard the donor of a migration in its critical section
    /// that this process does not hold (it restarted or became primary meanwhile): writes
    /// wait until the migration is resolved.
    blocked: bool,
}

impl CollMeta {
    pub fn owns_key(&self, k: &[Bson]) -> bool {
        let i = self.owned.partition_point(|(min, _)| cmp_keys(min, k) != Ordering::Greater);
        if i == 0 {
            return false;
        }
        let max = &self.owned[i - 1].1;
        // The chunk ending at MaxKey holds MaxKey too.
        cmp_keys(k, max) == Ordering::Less || max.iter().all(|v| matches!(v, Bson::MaxKey))
    }

    /// Whether this shard owns the document (by its shard key). A document whose key cannot
    /// be taken (an array) is no shard's.
    pub fn owns(&self, doc: &Document) -> bool {
        self.key.key_of_doc(doc).is_ok_and(|k| self.owns_key(&k))
    }

    /// Whether any owned chunk overlaps [min, max).
    pub fn owns_any_of(&self, min: &[Bson], max: &[Bson]) -> bool {
        self.owned.iter().any(|(lo, hi)| cmp_keys(lo, max) == Ordering::Less && cmp_keys(min, hi) == Ordering::Less)
    }

    /// Whether exactly [min, max) is one of this shard's chunks.
    pub fn owns_chunk(&self, min: &[Bson], max: &[Bson]) -> bool {
        self.owned.iter().any(|(lo, hi)| lo.as_slice() == min && hi.as_slice() == max)
    }
}

/// What this shard knows of a database's entry (config.databases): whether it is the
/// primary shard, and the entry's version.
pub struct DbMeta {
    uuid: Bson,
    last_mod: i64,
    version: Document,
    primary_here: bool,
    /// A movePrimary this process does not hold is in its critical section (as
    /// `CollMeta::blocked`).
    blocked: bool,
}

/// The gate key of a database's unsharded collections (no collection is named so: a
/// collection name holds no `$` but the oplog's).
fn db_gate_key(db: &str) -> String {
    format!("{db}.$db")
}

/// The gate writes to one sharded collection pass: open, any number at once; closed by a
/// migration's critical section, none, and the migration first waits for those admitted.
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: tokio::sync::Notify,
}

#[derive(Default)]
struct GateState {
    writes: u64,
    closed_by: Option<ObjectId>,
}

/// A write admitted through a gate; it leaves when this drops.
pub struct GateGuard(Arc<Gate>);

impl Drop for GateGuard {
    fn drop(&mut self) {
        self.0.state.lock().writes -= 1;
        self.0.changed.notify_waiters();
    }
}

impl Gate {
    async fn enter(self: &Arc<Self>, deadline: tokio::time::Instant) -> Result<GateGuard> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state.lock();
                if s.closed_by.is_none() {
                    s.writes += 1;
                    return Ok(GateGuard(self.clone()));
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(Error::new(Code::StaleConfig, "a chunk migration's critical section did not end in time; retry the write"));
            }
        }
    }

    /// Close the gate for migration `id` and wait until the writes admitted before are done
    /// (called off the async workers: it sleeps).
    fn close(&self, id: ObjectId) -> Result<()> {
        {
            let mut s = self.state.lock();
            match s.closed_by {
                Some(other) if other != id => {
                    return Err(Error::new(Code::ConflictingOperationInProgress, format!("migration {other} holds the critical section")))
                }
                _ => s.closed_by = Some(id),
            }
        }
        let deadline = Instant::now() + GATE_DRAIN_WAIT;
        while self.state.lock().writes > 0 {
            if Instant::now() >= deadline {
                self.open(id);
                return Err(Error::new(Code::ExceededTimeLimit, "writes admitted before the critical section did not finish in time"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn open(&self, id: ObjectId) -> bool {
        let opened = {
            let mut s = self.state.lock();
            let mine = s.closed_by == Some(id);
            if mine {
                s.closed_by = None;
            }
            mine
        };
        self.changed.notify_waiters();
        opened
    }

    fn closed_by(&self) -> Option<ObjectId> {
        self.state.lock().closed_by
    }
}

/// What `admit` lets a command run with: the metadata its scans filter by (reads, updates,
/// deletes), and for a write, its place through the gate.
#[derive(Default)]
pub struct Admission {
    pub filter: Option<Arc<CollMeta>>,
    pub gate: Option<GateGuard>,
}

#[derive(Default)]
pub struct ShardingState {
    /// The term this member was primary in when it last admitted an operation.
    term: std::sync::atomic::AtomicI64,
    identity: RwLock<Option<Arc<Identity>>>,
    pub pool: Pool,
    colls: Mutex<HashMap<String, Arc<CollMeta>>>,
    dbs: Mutex<HashMap<String, Arc<DbMeta>>>,
    gates: Mutex<HashMap<String, Arc<Gate>>>,
    /// Migrations this shard is the donor of, by namespace (`commands::sharding`).
    pub sources: Mutex<HashMap<String, Arc<crate::commands::sharding::MigrationSource>>>,
}

/// Remember `meta` under `key`; a cache at its bound starts over (what it forgets is read
/// again from the config servers when next needed).
fn cache<T>(map: &mut HashMap<String, Arc<T>>, key: &str, meta: &Arc<T>) {
    if map.len() >= COLLECTIONS_CACHED_MAX {
        map.clear();
    }
    map.insert(key.to_string(), meta.clone());
}

fn stale(ns: &str, received: Option<ChunkVersion>, wanted: ChunkVersion, shard: &str, why: &str) -> Error {
    let v = |c: ChunkVersion| Bson::Timestamp(c.to_timestamp());
    Error::new(Code::StaleConfig, format!("{why} for {ns} on shard {shard}"))
        .with_extra(doc! {"ns": ns, "vReceived": received.map(v).unwrap_or(Bson::Null), "vWanted": v(wanted), "shardId": shard})
}

impl ShardingState {
    /// `_addShard`: this set is shard `name` of the cluster whose config servers are
    /// `config`. A set belongs to one cluster under one name.
    pub fn set_identity(&self, name: &str, config: &str) -> Result<()> {
        let mut id = self.identity.write();
        if let Some(have) = id.as_ref() {
            if have.shard_name != name || have.config.conn_string != config {
                return Err(Error::new(
                    Code::IllegalOperation,
                    format!("this shard is {} of the cluster with config servers {}", have.shard_name, have.config.conn_string),
                ));
            }
            return Ok(());
        }
        *id = Some(Arc::new(Identity { shard_name: name.to_string(), config: Arc::new(ReplicaSet::parse(config)?) }));
        Ok(())
    }

    pub fn identity(&self) -> Result<Arc<Identity>> {
        self.identity.read().clone().ok_or_else(|| {
            Error::new(Code::ShardingStateNotInitialized, "this shard has not been told its identity (_addShard) since it started or became primary")
        })
    }

    /// Called before each versioned operation with the current term: in a new term, forget
    /// what an earlier time as primary knew (another primary may have migrated chunks
    /// meanwhile), and drop migrations and critical sections of that time.
    pub fn on_term(&self, term: i64) {
        if self.term.swap(term, std::sync::atomic::Ordering::SeqCst) == term {
            return;
        }
        self.colls.lock().clear();
        self.dbs.lock().clear();
        self.sources.lock().clear();
        let gates = std::mem::take(&mut *self.gates.lock());
        for g in gates.values() {
            if let Some(id) = g.closed_by() {
                g.open(id);
            }
        }
    }

    pub fn gate(&self, ns: &str) -> Arc<Gate> {
        let mut gates = self.gates.lock();
        // Looked up by &str first: every versioned write passes here.
        if let Some(g) = gates.get(ns) {
            return g.clone();
        }
        if gates.len() >= COLLECTIONS_CACHED_MAX {
            // Keep only gates in use: held by a write or closed by a migration.
            gates.retain(|_, g| Arc::strong_count(g) > 1 || g.closed_by().is_some());
        }
        gates.entry(ns.to_string()).or_default().clone()
    }

    pub fn forget(&self, ns: &str) {
        self.colls.lock().remove(ns);
    }

    pub fn cached(&self, ns: &str) -> Option<Arc<CollMeta>> {
        self.colls.lock().get(ns).cloned()
    }

    /// Read the collection's metadata from the config servers (and cache it). `None`: the
    /// collection is not sharded there.
    pub async fn refresh(&self, ns: &str) -> Result<Option<Arc<CollMeta>>> {
        let id = self.identity()?;
        let found = config_find(&self.pool, &id.config, "collections", doc! {"_id": ns}, doc! {}, shard::chunks::CHUNKS_MAX).await?;
        let Some(entry) = found.into_iter().next().filter(|e| !e.get_bool("dropped").unwrap_or(false)) else {
            self.forget(ns);
            return Ok(None);
        };
        let key = ShardKeyPattern::parse(entry.get_document("key").map_err(|_| Error::internal(format!("config.collections entry of {ns} has no key")))?)?;
        let uuid = entry.get("uuid").cloned().unwrap_or(Bson::Null);
        let docs =
            config_find(&self.pool, &id.config, "chunks", doc! {"uuid": uuid.clone(), "shard": &id.shard_name}, doc! {"min": 1}, shard::chunks::CHUNKS_MAX)
                .await?;
        let mut owned = Vec::with_capacity(docs.len());
        let mut version = ChunkVersion::default();
        for d in &docs {
            let c = chunk_from_doc(&key, d)?;
            version = version.max(c.lastmod);
            owned.push((c.min, c.max));
        }
        owned.sort_by(|a, b| cmp_keys(&a.0, &b.0));
        let migration = config_find(&self.pool, &id.config, "migrations", doc! {"_id": ns}, doc! {}, shard::chunks::CHUNKS_MAX).await?;
        let blocked = migration.first().is_some_and(|m| {
            m.get_str("donor").ok() == Some(id.shard_name.as_str())
                && m.get_bool("inCriticalSection").unwrap_or(false)
                && m.get_object_id("migrationId").ok() != self.gate(ns).closed_by()
        });
        let meta = Arc::new(CollMeta { uuid, key, owned, version, blocked });
        if !blocked {
            cache(&mut self.colls.lock(), ns, &meta);
        }
        Ok(Some(meta))
    }

    /// Read the database's entry from the config servers (and cache it). `None`: there is none.
    pub async fn refresh_db(&self, db: &str) -> Result<Option<Arc<DbMeta>>> {
        let id = self.identity()?;
        let found = config_find(&self.pool, &id.config, "databases", doc! {"_id": db}, doc! {}, shard::chunks::CHUNKS_MAX).await?;
        let Some(entry) = found.into_iter().next() else {
            self.dbs.lock().remove(db);
            return Ok(None);
        };
        let version = entry.get_document("version").cloned().unwrap_or_default();
        let blocked = entry.get_object_id("movePrimaryInProgress").is_ok_and(|m| Some(m) != self.gate(&db_gate_key(db)).closed_by());
        let meta = Arc::new(DbMeta {
            uuid: version.get("uuid").cloned().unwrap_or(Bson::Null),
            last_mod: version.get("lastMod").and_then(common::value::as_i64).unwrap_or(0),
            primary_here: entry.get_str("primary").ok() == Some(id.shard_name.as_str()),
            version,
            blocked,
        });
        if !blocked {
            cache(&mut self.dbs.lock(), db, &meta);
        }
        Ok(Some(meta))
    }

    /// A command on an unsharded collection from a router, with the `databaseVersion` it
    /// routed by: this shard must be the database's primary at that version (else
    /// StaleDbVersion, 249, and the router reads the entry again). Its writes pass the
    /// database's gate, which movePrimary's critical section closes.
    async fn admit_db(&self, req: &Request, dv: &Document) -> Result<Admission> {
        let uuid = dv.get("uuid").cloned().unwrap_or(Bson::Null);
        let last_mod = dv.get("lastMod").and_then(common::value::as_i64).unwrap_or(0);
        let db = req.db.as_str();
        let write = !matches!(req.name.as_str(), "find" | "count" | "distinct" | "aggregate" | "listCollections" | "listIndexes");
        let deadline = tokio::time::Instant::now() + CRITICAL_SECTION_WAIT;
        let gate = if write { Some(self.gate(&db_gate_key(db)).enter(deadline).await?) } else { None };
        let stale = |wanted: Option<&DbMeta>, why: &str| {
            Error::new(Code::StaleDbVersion, format!("{why} for database {db}"))
                .with_extra(doc! {"db": db, "vReceived": dv.clone(), "vWanted": wanted.map(|m| Bson::Document(m.version.clone())).unwrap_or(Bson::Null)})
        };
        loop {
            let cached = self.dbs.lock().get(db).cloned();
            let meta = match cached {
                Some(m) if m.uuid != uuid || last_mod > m.last_mod => {
                    self.dbs.lock().remove(db);
                    continue;
                }
                Some(m) => m,
                None => match self.refresh_db(db).await? {
                    Some(m) => m,
                    None => return Err(stale(None, "the database is not in the cluster")),
                },
            };
            if meta.uuid != uuid || meta.last_mod != last_mod || !meta.primary_here {
                return Err(stale(Some(&meta), "this shard is not the primary at the router's version"));
            }
            if write && meta.blocked {
                if tokio::time::Instant::now() >= deadline {
                    return Err(stale(Some(&meta), "a movePrimary is in its critical section"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            return Ok(Admission { filter: None, gate });
        }
    }

    /// Close the gate of a database's unsharded collections for movePrimary `id`.
    pub fn enter_db_critical_section(&self, db: &str, id: ObjectId) -> Result<()> {
        self.gate(&db_gate_key(db)).close(id)
    }

    pub fn exit_db_critical_section(&self, db: &str, id: ObjectId) -> bool {
        self.dbs.lock().remove(db);
        self.gate(&db_gate_key(db)).open(id)
    }

    /// Check a command's `shardVersion` (see the module's comment) and admit it: a write
    /// through the collection's gate, waiting while a migration's critical section holds it.
    /// A command with `databaseVersion` instead is checked by `admit_db`.
    pub async fn admit(&self, req: &Request) -> Result<Admission> {
        if let Ok(dv) = req.body.get_document("databaseVersion") {
            if !req.body.contains_key("shardVersion") {
                return self.admit_db(req, dv).await;
            }
        }
        let sv = req.body.get_document("shardVersion").map_err(|_| Error::type_mismatch("shardVersion must be a document"))?;
        let uuid = sv.get("uuid").cloned().unwrap_or(Bson::Null);
        let received = ChunkVersion::from_timestamp(sv.get_timestamp("v").map_err(|_| Error::type_mismatch("shardVersion.v must be a timestamp"))?);
        let coll = req.body.get_str(&req.name).map_err(|_| Error::new(Code::InvalidNamespace, "a versioned command names its collection"))?;
        let ns = format!("{}.{coll}", req.db);
        let write = matches!(req.name.as_str(), "insert" | "update" | "delete" | "findAndModify" | "findandmodify");
        let deadline = tokio::time::Instant::now() + CRITICAL_SECTION_WAIT;
        let gate = if write { Some(self.gate(&ns).enter(deadline).await?) } else { None };
        loop {
            let meta = match self.cached(&ns) {
                Some(m) if m.uuid != uuid || received.major > m.version.major => {
                    // The router knows something newer: ask the config servers.
                    self.forget(&ns);
                    continue;
                }
                Some(m) => m,
                None => {
                    let shard = self.identity()?.shard_name.clone();
                    match self.refresh(&ns).await? {
                        Some(m) => m,
                        None => return Err(stale(&ns, Some(received), ChunkVersion::default(), &shard, "the collection is not sharded")),
                    }
                }
            };
            let shard = self.identity()?.shard_name.clone();
            if meta.uuid != uuid {
                return Err(stale(&ns, Some(received), meta.version, &shard, "the collection was dropped and created again"));
            }
            if received.major != meta.version.major {
                return Err(stale(&ns, Some(received), meta.version, &shard, "the shard version differs"));
            }
            if write && meta.blocked {
                // A migration this member did not hold is in its critical section: the
                // router that runs it (or another, recovering it) resolves it.
                if tokio::time::Instant::now() >= deadline {
                    return Err(stale(&ns, Some(received), meta.version, &shard, "a migration is in its critical section"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let filter = (req.name != "insert").then_some(meta);
            return Ok(Admission { filter, gate });
        }
    }

    /// Close the collection's gate for migration `id` (the critical section).
    pub fn enter_critical_section(&self, ns: &str, id: ObjectId) -> Result<()> {
        self.gate(ns).close(id)
    }

    /// Open it again, and forget the metadata (a commit changed it): writes that waited see
    /// the new versions.
    pub fn exit_critical_section(&self, ns: &str, id: ObjectId) -> bool {
        self.forget(ns);
        self.gate(ns).open(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(owned: Vec<(Key, Key)>) -> CollMeta {
        CollMeta { uuid: Bson::Null, key: ShardKeyPattern::parse(&doc! {"a": 1}).unwrap(), owned, version: ChunkVersion::default(), blocked: false }
    }

    #[test]
    fn ownership_follows_the_chunks_bounds() {
        let m = meta(vec![(vec![Bson::MinKey], vec![Bson::Int32(10)]), (vec![Bson::Int32(20)], vec![Bson::MaxKey])]);
        assert!(m.owns(&doc! {"a": 9}));
        assert!(!m.owns(&doc! {"a": 10}), "max is exclusive");
        assert!(!m.owns(&doc! {"a": 15}));
        assert!(m.owns(&doc! {"a": 20}));
        assert!(m.owns(&doc! {"a": Bson::MaxKey}), "the last chunk holds MaxKey");
        assert!(m.owns(&doc! {"b": 1}), "a missing key is null, below 10");
        assert!(!m.owns(&doc! {"a": [1, 2]}), "an array is no shard's");
        assert!(m.owns_any_of(&[Bson::Int32(5)], &[Bson::Int32(12)]));
        assert!(!m.owns_any_of(&[Bson::Int32(10)], &[Bson::Int32(20)]));
        assert!(m.owns_chunk(&[Bson::Int32(20)], &[Bson::MaxKey]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_gate_holds_writes_until_it_opens() {
        let gate = Arc::new(Gate::default());
        let id = ObjectId::new();
        let g = gate.enter(tokio::time::Instant::now() + Duration::from_secs(1)).await.unwrap();
        // Closing waits for the admitted write.
        let closer = {
            let gate = gate.clone();
            tokio::task::spawn_blocking(move || gate.close(id))
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!closer.is_finished(), "close waits for the write admitted before");
        drop(g);
        closer.await.unwrap().unwrap();
        let short = gate.enter(tokio::time::Instant::now() + Duration::from_millis(50)).await;
        assert_eq!(short.err().map(|e| e.code), Some(Code::StaleConfig.0));
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(tokio::time::Instant::now() + Duration::from_secs(5)).await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!gate.open(ObjectId::new()), "only its migration opens it");
        assert!(gate.open(id));
        waiting.await.unwrap().unwrap();
    }
}
