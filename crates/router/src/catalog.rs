//! What the router knows of the cluster, read from the config servers' `config` database and
//! cached: the shards (config.shards), each database's primary shard (config.databases), and
//! each sharded collection's routing table (config.collections, config.chunks). Changes the
//! router makes are written there with w:"majority" before they are used.
//!
//! The `admin` and `config` databases live on the config servers (`CONFIG_SHARD`, mongos's
//! "config" shard). Each replica set's primary and the connections to it are `net::pool`'s;
//! a shard is told its name and the config servers (`_addShard`) before the router's first
//! operation on it. The router trusts that a collection is unsharded for at most
//! `UNSHARDED_TTL` (1 s) before it asks again. Its tables may be stale, and the shards
//! decide: each operation carries the version the router routed by (`shardVersion` from
//! `ShardedColl::version_doc`, or the database's `databaseVersion` from `with_db_version`),
//! and after StaleConfig or StaleDbVersion (`after_stale`) the router reads the entry again.

use super::Router;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use net::pool::{reply_result, Pool, ReplicaSet, COMMAND_TIMEOUT};
use parking_lot::RwLock;
use shard::{chunks::chunk_from_doc, ChunkVersion, RoutingTable, ShardKeyPattern};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the router trusts that a collection is not sharded before it asks again.
const UNSHARDED_TTL: Duration = Duration::from_secs(1);
/// Namespaces whose sharding the router remembers at most.
const COLLECTIONS_CACHED_MAX: usize = 100_000;
/// Documents a config read returns at most (a routing table's chunks are bounded apart).
const CONFIG_READ_DOCS_MAX: usize = shard::chunks::CHUNKS_MAX;

/// The config servers' id where a shard id is expected: the `admin` and `config` databases
/// live there (mongos's "config" shard).
pub const CONFIG_SHARD: &str = "config";

pub struct ShardedColl {
    pub ns: String,
    pub table: RoutingTable,
    pub uuid: Bson,
    pub unique: bool,
    /// Each shard's version in `table` (its highest chunk's), looked up on every operation.
    versions: HashMap<String, ChunkVersion>,
}

impl ShardedColl {
    pub fn new(ns: &str, table: RoutingTable, uuid: Bson, unique: bool) -> ShardedColl {
        let mut versions: HashMap<String, ChunkVersion> = HashMap::new();
        for c in table.chunks() {
            let v = versions.entry(c.shard.clone()).or_default();
            *v = (*v).max(c.lastmod);
        }
        ShardedColl { ns: ns.to_string(), table, uuid, unique, versions }
    }

    /// `shardVersion` for an operation on `shard` (`sharding::ShardingState::admit`).
    pub fn version_doc(&self, shard: &str) -> Document {
        doc! {"uuid": self.uuid.clone(), "v": self.versions.get(shard).copied().unwrap_or_default().to_timestamp()}
    }
}

#[derive(Clone)]
enum CollEntry {
    Sharded(Arc<ShardedColl>),
    Unsharded(Instant),
}

pub struct Catalog {
    pub config: Arc<ReplicaSet>,
    shards: RwLock<BTreeMap<String, Arc<ReplicaSet>>>,
    /// Each database's primary shard and its version (config.databases `version`).
    dbs: RwLock<HashMap<String, (String, Document)>>,
    colls: RwLock<HashMap<String, CollEntry>>,
}

impl Catalog {
    pub fn new(config: ReplicaSet) -> Catalog {
        Catalog { config: Arc::new(config), shards: Default::default(), dbs: Default::default(), colls: Default::default() }
    }
}

impl Router {
    /// Run a command on the config servers' primary, in the `config` database unless the
    /// body says otherwise; a reply with ok:0 is an `Err`.
    pub async fn config_command(&self, db: &str, body: Document) -> Result<Document> {
        let (_, reply) = self.pool.run(&self.catalog.config, db, body, None, COMMAND_TIMEOUT).await?;
        reply_result(reply)
    }

    /// Run a command on a set's primary (a shard's, for the router's own operations:
    /// migrations, movePrimary); a reply with ok:0 is an `Err`.
    pub async fn command(&self, set: &ReplicaSet, db: &str, body: Document) -> Result<Document> {
        reply_result(self.pool.run(set, db, body, None, COMMAND_TIMEOUT).await?.1)
    }

    /// Every document of `config.<coll>` matching `filter`, in `sort` order.
    pub async fn config_find(&self, coll: &str, filter: Document, sort: Document) -> Result<Vec<Document>> {
        net::pool::config_find(&self.pool, &self.catalog.config, coll, filter, sort, CONFIG_READ_DOCS_MAX).await
    }

    /// Write to the config database with w:"majority".
    pub async fn config_write(&self, body: Document) -> Result<Document> {
        config_write(&self.pool, &self.catalog.config, body).await
    }

    /// config.shards, read again (and the cache with it).
    pub async fn reload_shards(&self) -> Result<Vec<Document>> {
        let docs = self.config_find("shards", doc! {}, doc! {"_id": 1}).await?;
        let mut map = BTreeMap::new();
        for d in &docs {
            let (Ok(id), Ok(host)) = (d.get_str("_id"), d.get_str("host")) else { continue };
            let existing = self.catalog.shards.read().get(id).filter(|s| s.conn_string == host).cloned();
            map.insert(
                id.to_string(),
                match existing {
                    Some(s) => s,
                    None => Arc::new(ReplicaSet::parse(host)?),
                },
            );
        }
        *self.catalog.shards.write() = map;
        Ok(docs)
    }

    /// Every shard's id, in order.
    pub async fn shard_ids(&self) -> Result<Vec<String>> {
        if self.catalog.shards.read().is_empty() {
            self.reload_shards().await?;
        }
        Ok(self.catalog.shards.read().keys().cloned().collect())
    }

    /// The shards a new database or a new collection's chunks may go to: those not being
    /// drained by removeShard.
    pub async fn placeable_shard_ids(&self) -> Result<Vec<String>> {
        Ok(super::balance::placeable(&self.reload_shards().await?))
    }

    pub async fn shard(&self, id: &str) -> Result<Arc<ReplicaSet>> {
        if id == CONFIG_SHARD {
            return Ok(self.catalog.config.clone());
        }
        let cached = self.catalog.shards.read().get(id).cloned();
        let set = match cached {
            Some(s) => s,
            None => {
                self.reload_shards().await?;
                self.catalog.shards.read().get(id).cloned().ok_or_else(|| Error::new(Code::ShardNotFound, format!("Shard {id} not found")))?
            }
        };
        if !set.identity_sent.load(Ordering::Relaxed) {
            // The shard learns its name and the config servers before its first versioned
            // operation (`sharding::ShardingState`).
            let body = doc! {"_addShard": 1, "shardIdentity": {"shardName": id, "configsvrConnectionString": &self.catalog.config.conn_string}};
            reply_result(self.pool.run(&set, "admin", body, None, COMMAND_TIMEOUT).await?.1)?;
            set.identity_sent.store(true, Ordering::Relaxed);
        }
        Ok(set)
    }

    /// A shard answered StaleConfig or ShardingStateNotInitialized to an operation on `ns`:
    /// read the routing table again before the retry, and tell the shards who they are again.
    pub fn after_stale(&self, ns: &str, e: &Error) {
        self.forget_collection(ns);
        if e.code == Code::StaleDbVersion.0 {
            self.forget_database(ns.split_once('.').map_or(ns, |(db, _)| db));
        }
        if e.code == Code::ShardingStateNotInitialized.0 {
            for set in self.catalog.shards.read().values() {
                set.identity_sent.store(false, Ordering::Relaxed);
            }
        }
    }

    /// The database's primary shard; with `create`, a database not yet known gets the shard
    /// that is primary for the fewest databases (as mongos gives it the least loaded one).
    pub async fn db_primary(&self, db: &str, create: bool) -> Result<Option<String>> {
        if matches!(db, "admin" | "config") {
            return Ok(Some(CONFIG_SHARD.to_string()));
        }
        if let Some((p, _)) = self.catalog.dbs.read().get(db) {
            return Ok(Some(p.clone()));
        }
        let found = self.config_find("databases", doc! {"_id": db}, doc! {}).await?;
        if let Some(entry) = found.first() {
            if let Ok(p) = entry.get_str("primary") {
                let version = entry.get_document("version").cloned().unwrap_or_default();
                self.catalog.dbs.write().insert(db.to_string(), (p.to_string(), version));
                return Ok(Some(p.to_string()));
            }
        }
        if !create {
            return Ok(None);
        }
        let shards = self.placeable_shard_ids().await?;
        if shards.is_empty() {
            return Err(Error::new(Code::ShardNotFound, "Database could not be created because the cluster has no shards (addShard first)"));
        }
        let all = self.config_find("databases", doc! {}, doc! {}).await?;
        let primary = shards.iter().min_by_key(|s| all.iter().filter(|d| d.get_str("primary").ok() == Some(s.as_str())).count()).cloned().unwrap_or_default();
        self.create_database(db, &primary).await
    }

    /// Record the database with `primary`; if another router recorded it first, theirs wins.
    pub async fn create_database(&self, db: &str, primary: &str) -> Result<Option<String>> {
        let entry =
            doc! {"_id": db, "primary": primary, "partitioned": false, "version": {"uuid": bson::Uuid::new(), "timestamp": now_timestamp(), "lastMod": 1}};
        match self.config_write(doc! {"insert": "databases", "documents": [entry]}).await {
            Ok(_) => {}
            Err(e) if e.code == Code::DuplicateKey.0 => {}
            Err(e) => return Err(e),
        }
        self.catalog.dbs.write().remove(db);
        Box::pin(self.db_primary(db, false)).await
    }

    /// `body` with `databaseVersion`, the version of the database's entry the router routed
    /// by: an operation on an unsharded collection, sent to the primary shard, which checks
    /// it (`sharding::ShardingState::admit`). The config servers' databases have none.
    pub fn with_db_version(&self, db: &str, mut body: Document) -> Document {
        if let Some((_, v)) = self.catalog.dbs.read().get(db).filter(|(_, v)| !v.is_empty()) {
            body.insert("databaseVersion", v.clone());
        }
        body
    }

    pub fn forget_database(&self, db: &str) {
        self.catalog.dbs.write().remove(db);
        let prefix = format!("{db}.");
        self.catalog.colls.write().retain(|ns, _| !ns.starts_with(&prefix));
    }

    /// The collection's routing table if it is sharded.
    pub async fn sharded(&self, ns: &str) -> Result<Option<Arc<ShardedColl>>> {
        match self.catalog.colls.read().get(ns) {
            Some(CollEntry::Sharded(c)) => return Ok(Some(c.clone())),
            Some(CollEntry::Unsharded(at)) if at.elapsed() < UNSHARDED_TTL => return Ok(None),
            _ => {}
        }
        let coll = self.load_collection(ns).await?;
        let entry = match &coll {
            Some(c) => CollEntry::Sharded(c.clone()),
            None => CollEntry::Unsharded(Instant::now()),
        };
        let mut colls = self.catalog.colls.write();
        if colls.len() >= COLLECTIONS_CACHED_MAX {
            // Clients naming endless collections do not grow the cache: what is not sharded
            // is asked again anyway.
            colls.retain(|_, e| matches!(e, CollEntry::Sharded(_)));
        }
        colls.insert(ns.to_string(), entry);
        Ok(coll)
    }

    pub fn forget_collection(&self, ns: &str) {
        self.catalog.colls.write().remove(ns);
    }

    /// Forget every database's and collection's routing (flushRouterConfig).
    pub fn forget_all(&self) {
        self.catalog.dbs.write().clear();
        self.catalog.colls.write().clear();
    }

    async fn load_collection(&self, ns: &str) -> Result<Option<Arc<ShardedColl>>> {
        let found = self.config_find("collections", doc! {"_id": ns}, doc! {}).await?;
        let Some(entry) = found.into_iter().next() else { return Ok(None) };
        if entry.get_bool("dropped").unwrap_or(false) {
            return Ok(None);
        }
        let key = ShardKeyPattern::parse(entry.get_document("key").map_err(|_| Error::internal(format!("config.collections entry of {ns} has no key")))?)?;
        let uuid = entry.get("uuid").cloned().unwrap_or(Bson::Null);
        let docs = self.config_find("chunks", doc! {"uuid": uuid.clone()}, doc! {"min": 1}).await?;
        let chunks = docs.iter().map(|d| chunk_from_doc(&key, d)).collect::<Result<Vec<_>>>()?;
        let table = RoutingTable::new(key, chunks)?;
        Ok(Some(Arc::new(ShardedColl::new(ns, table, uuid, entry.get_bool("unique").unwrap_or(false)))))
    }
}

/// A write to the config database with w:"majority"; a write error or write concern error
/// is the `Err`.
pub async fn config_write(pool: &Pool, config: &ReplicaSet, mut body: Document) -> Result<Document> {
    body.insert("writeConcern", doc! {"w": "majority", "wtimeout": 60_000});
    let (_, reply) = pool.run(config, "config", body, None, COMMAND_TIMEOUT).await?;
    write_result(reply)
}

/// A write's reply as a result: ok:0, its first write error, or its write concern error is
/// the `Err`.
pub fn write_result(reply: Document) -> Result<Document> {
    let reply = reply_result(reply)?;
    if let Ok(errors) = reply.get_array("writeErrors") {
        if let Some(Bson::Document(e)) = errors.first() {
            let code = e.get_i32("code").unwrap_or(Code::UnknownError.0);
            return Err(Error::remote(code, e.get_str("codeName").unwrap_or("UnknownError"), e.get_str("errmsg").unwrap_or("").to_string()));
        }
    }
    if let Ok(e) = reply.get_document("writeConcernError") {
        return Err(Error::remote(
            e.get_i32("code").unwrap_or(64),
            e.get_str("codeName").unwrap_or("WriteConcernFailed"),
            e.get_str("errmsg").unwrap_or("").to_string(),
        ));
    }
    Ok(reply)
}

/// The wall clock as a Timestamp (config documents' `timestamp` and `topologyTime`).
pub fn now_timestamp() -> bson::Timestamp {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    bson::Timestamp { time: secs as u32, increment: 1 }
}
