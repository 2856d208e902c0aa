//! The router's commands. Each either answers from what the router knows (hello, the
//! cluster's metadata), changes the metadata on the config servers (addShard,
//! shardCollection...), or sends the operation to the shards it targets and merges their
//! replies. A command the router does not route answers CommandNotFound, as mongos does for
//! commands it lacks.
//!
//! A write to a sharded collection is split per shard (`split_write`), each write error at
//! the statement's position in the client's command. An insert into a sharded collection
//! is read with `wire::raw_msg` (`raw_insert`): each document goes on as the bytes it came
//! as, only its shard key decoded (`ShardKeyPattern::key_of_raw`). findAndModify goes to the
//! one shard its exact shard key names (`shard::exact_key`; without one, ShardKeyNotFound).
//! An operation on a sharded collection carries the shard's `shardVersion`, and a
//! StaleConfig answer makes the router read the routing table again and send the operation
//! (or a write's unexecuted statements) again; one on an unsharded collection carries the
//! database's `databaseVersion`, and StaleDbVersion makes the router read the database's
//! entry again. A `$group` whose accumulators combine runs partially on the shards, the
//! router merging their groups (`split_group`).

use super::catalog::{now_timestamp, ShardedColl};
use super::cursor::{RouterCursor, Stream};
use super::{Router, RouterConn};
use bson::{doc, Bson, DateTime, Document};
use common::server::{LOGICAL_SESSION_TIMEOUT_MINUTES, MAX_WIRE_VERSION};
use common::{limits, Code, Error, Result};
use net::peer::cursor_batch;
use net::pool::{reply_result, ReplicaSet, COMMAND_TIMEOUT, CONNECT_TIMEOUT};
use shard::chunks::{initial_chunks, INITIAL_CHUNKS_PER_SHARD, INITIAL_CHUNKS_PER_SHARD_MAX};
use shard::{shards_for_filter, ShardKeyPattern};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use wire::Request;

/// First batch of a find or aggregate when the client names none (mongod's 101).
const FIRST_BATCH_DOCS_DEFAULT: usize = 101;
/// Longest wait of an awaitable hello.
const AWAIT_TIME_MS_MAX: i64 = 60_000;
/// Documents a sharded aggregate's merging stages may take in, in bytes (mongod's 100 MiB
/// per blocking stage).
const MERGE_INPUT_BYTES_MAX: usize = common::limits::AGG_MEMORY_BYTES_MAX;

pub async fn run(router: &Router, conn: &mut RouterConn, req: Request) -> net::service::Reply<Vec<u8>> {
    let reply = |d: Document| net::service::Reply::new(d);
    // An unknown command is CommandNotFound before anything else, as on mongod.
    let Some(row) = super::table::lookup(&req.name) else {
        return reply(Error::new(Code::CommandNotFound, format!("no such command: '{}'", req.name)).to_reply());
    };
    if let Err(e) = common::api::check(&req.name, &req.body) {
        return reply(e.to_reply());
    }
    if router.config.auth {
        if let Err(e) = super::users::authorize(router, conn, &req).await {
            return reply(e.to_reply());
        }
    }
    if row.admin_only {
        if let Err(e) = admin_only(&req) {
            return reply(e.to_reply());
        }
    }
    if let Err(e) = router.sessions.touch_request(&req.body, &conn.auth) {
        return reply(e.to_reply());
    }
    match common::optime::gossiped_cluster_time(&req.body) {
        Ok(Some(t)) => router.pool.gossip_in(t),
        Ok(None) => {}
        Err(e) => return reply(e.to_reply()),
    }
    let label_kind = common::labels::kind(&req.name, &req.body);
    let fired = match net::fail_point::FAIL_COMMAND.is_active() {
        true => {
            let app_name = net::fail_point::app_name(conn.app_name.as_deref(), &req.name, &req.body);
            let client = net::fail_point::Client { app_name, internal: conn.internal_client };
            net::fail_point::fail_command(&req.name, &req.namespace(), &client)
        }
        false => None,
    };
    net::fail_point::around_command(
        fired,
        label_kind,
        |e| e.to_reply(),
        |wce| async move {
            let (mut body, operation_time) = net::pool::with_operation_time(run_row(router, conn, row, &req)).await;
            if let Some(wce) = wce {
                body.insert("writeConcernError", wce);
            }
            if let Some(t) = operation_time {
                body.insert("operationTime", t);
            }
            // The newest time the router knows, which the client's next commands carry
            // (causally consistent sessions chain on it).
            if let Some(t) = router.pool.cluster_time() {
                body.insert("$clusterTime", common::optime::cluster_time_doc(t));
            }
            reply(body)
        },
    )
    .await
}

async fn run_row(router: &Router, conn: &mut RouterConn, row: &super::table::Row, req: &Request) -> Document {
    if let Some(e) = req.body.get("maxTimeMS").filter(|_| req.name != "getMore").and_then(|_| net::fail_point::max_time_expires()) {
        return e.to_reply();
    }
    // A primary shard that answers StaleDbVersion ran nothing: the database moved (or the
    // router's entry is old). Read it again and route the command again.
    let mut attempt = 0;
    let routed = loop {
        if super::txn::is_statement(req) {
            break super::txn::run(router, conn, row, req).await;
        }
        match (row.run)(router, conn, req).await {
            Err(e) if e.code == Code::StaleDbVersion.0 && attempt < STALE_RETRIES_MAX => {
                attempt += 1;
                router.forget_database(&req.db);
                tokio::time::sleep(stale_backoff(attempt)).await;
            }
            r => break r,
        }
    };
    match routed {
        Ok(mut reply) => {
            if !reply.contains_key("ok") {
                reply.insert("ok", 1.0);
            }
            reply
        }
        Err(e) => {
            if e.code == Code::AuthenticationFailed.0 {
                conn.auth.failures += 1;
            }
            e.to_reply()
        }
    }
}

/// A read, or a findAndModify (one shard), run again on a routing table read again while a
/// shard answers StaleConfig: nothing was returned to the client yet, reads change
/// nothing, and a shard that answers StaleConfig ran nothing.
pub(crate) async fn whole(router: &Router, req: &Request) -> Result<Document> {
    let mut attempt = 0;
    loop {
        let r = match req.name.as_str() {
            "find" => find(router, req).await,
            "count" => count(router, req).await,
            "distinct" => distinct(router, req).await,
            "findAndModify" | "findandmodify" => find_and_modify(router, req).await,
            _ => aggregate(router, req).await,
        };
        match r {
            Err(e) if is_stale(&e) && attempt < STALE_RETRIES_MAX => {
                attempt += 1;
                router.after_stale(&format!("{}.{}", req.db, req.body.get_str(&req.name).unwrap_or("")), &e);
                tokio::time::sleep(stale_backoff(attempt)).await;
            }
            r => return r,
        }
    }
}

fn admin_only(req: &Request) -> Result<()> {
    if req.db == "admin" {
        Ok(())
    } else {
        Err(Error::new(Code::Unauthorized, format!("{} may only be run against the admin database.", req.name)))
    }
}

/// The command's first field as a collection name.
pub(super) fn collection_of(req: &Request) -> Result<String> {
    match req.body.get(&req.name) {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(Error::new(Code::InvalidNamespace, format!("Invalid namespace specified '{}.'", req.db))),
    }
}

/// The body sent on to a shard: the client's, without `$db` (the connection adds it).
pub(super) fn forwarded(req: &Request) -> Document {
    let mut body = (*req.body).clone();
    body.remove("$db");
    body
}

pub(super) fn timeout_of(req: &Request) -> Duration {
    match req.body.get("maxTimeMS").and_then(common::value::as_i64) {
        // The shard enforces maxTimeMS; the router waits a little longer for its answer.
        Some(ms) if ms > 0 => Duration::from_millis(ms as u64) + Duration::from_secs(5),
        _ => COMMAND_TIMEOUT,
    }
}

// ---------------------------------------------------------------------------------------
// Handshake

pub(crate) async fn hello(router: &Router, conn: &mut RouterConn, req: &Request) -> Result<Document> {
    let cmd = &req.body;
    if cmd.contains_key("client") {
        if conn.client_metadata_seen {
            return Err(Error::new(Code::ClientMetadataCannotBeMutated, "The client metadata document may only be sent in the first hello"));
        }
        conn.client_metadata_seen = true;
        conn.app_name =
            cmd.get_document("client").ok().and_then(|c| c.get_document("application").ok()).and_then(|a| a.get_str("name").ok()).map(str::to_string);
    }
    if cmd.contains_key("internalClient") {
        conn.internal_client = true;
    }
    // An awaitable hello (a driver's streaming monitor) waits: a router's topology does not
    // change, so the whole maxAwaitTimeMS, unless the client saw another process.
    let max_await = cmd.get("maxAwaitTimeMS").and_then(common::value::as_i64);
    let seen_us = cmd.get_document("topologyVersion").ok().and_then(|t| t.get_object_id("processId").ok()) == Some(router.process_id);
    if let (Some(ms), true) = (max_await, seen_us) {
        tokio::time::sleep(Duration::from_millis(ms.clamp(0, AWAIT_TIME_MS_MAX) as u64)).await;
    }
    let mut r = Document::new();
    if cmd.get_bool("helloOk").unwrap_or(false) {
        r.insert("helloOk", true);
    }
    r.insert(if req.name == "hello" { "isWritablePrimary" } else { "ismaster" }, true);
    r.insert("msg", "isdbgrid");
    r.insert("topologyVersion", doc! {"processId": router.process_id, "counter": 0i64});
    r.insert("maxBsonObjectSize", limits::BSON_OBJECT_SIZE_MAX_BYTES as i32);
    r.insert("maxMessageSizeBytes", limits::MESSAGE_SIZE_MAX_BYTES as i32);
    r.insert("maxWriteBatchSize", limits::WRITE_BATCH_SIZE_MAX as i32);
    r.insert("localTime", DateTime::now());
    r.insert("logicalSessionTimeoutMinutes", LOGICAL_SESSION_TIMEOUT_MINUTES);
    r.insert("connectionId", conn.id as i64);
    r.insert("minWireVersion", 0);
    r.insert("maxWireVersion", MAX_WIRE_VERSION);
    r.insert("readOnly", false);
    if let Some(Bson::Array(offered)) = cmd.get("compression") {
        conn.compressors = net::service::negotiate_compressors(&router.config.compressors, offered);
        r.insert("compression", conn.compressors.iter().map(|c| c.name()).collect::<Vec<_>>());
    }
    super::users::hello_fields(router, conn, &req.name, cmd, &mut r).await?;
    Ok(r)
}

/// Sessions live on the shards (their retryable-write records): each ends them there.
pub(crate) async fn end_sessions(router: &Router, req: &Request) -> Result<Document> {
    for s in req.body.get_array("endSessions").map(|a| a.as_slice()).unwrap_or_default() {
        if let Some(Bson::Binary(id)) = s.as_document().and_then(|d| d.get("id")) {
            router.sessions.end(&id.bytes);
            router.txns.end_sessions(std::slice::from_ref(&id.bytes));
        }
    }
    let body = forwarded(req);
    let mut errors = Vec::new();
    for id in router.shard_ids().await? {
        let set = router.shard(&id).await?;
        if let Err(e) = router.pool.run(&set, "admin", body.clone(), None, COMMAND_TIMEOUT).await.and_then(|(_, r)| reply_result(r)) {
            errors.push(e);
        }
    }
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(Document::new()),
    }
}

// ---------------------------------------------------------------------------------------
// Cluster metadata

pub(crate) async fn add_shard(router: &Router, req: &Request) -> Result<Document> {
    let conn_string = req.body.get_str(&req.name).map_err(|_| Error::type_mismatch("addShard takes a replica set connection string"))?;
    let set = ReplicaSet::parse(conn_string)?;
    if set.set_name == router.catalog.config.set_name {
        return Err(Error::new(Code::OperationFailed, format!("can't add the config server replica set {} as a shard", set.set_name)));
    }
    // Reaching its primary proves the set is up and named as given.
    let primary =
        router.pool.primary(&set).await.map_err(|e| Error::new(Code::OperationFailed, format!("failed to add shard {conn_string}: {}", e.message)))?;
    let name = match req.body.get("name") {
        None => set.set_name.clone(),
        Some(Bson::String(n)) if !n.is_empty() => n.clone(),
        Some(_) => return Err(Error::bad_value("addShard's name must be a non-empty string")),
    };
    if name == super::catalog::CONFIG_SHARD {
        return Err(Error::bad_value(format!("the shard name '{name}' is reserved for the config servers")));
    }
    let shards = router.reload_shards().await?;
    for s in &shards {
        let (id, host) = (s.get_str("_id").unwrap_or(""), s.get_str("host").unwrap_or(""));
        let same_set = ReplicaSet::parse(host).is_ok_and(|h| h.set_name == set.set_name);
        if id == name && host == conn_string {
            return Ok(doc! {"shardAdded": name});
        }
        if id == name || same_set {
            return Err(Error::new(Code::OperationFailed, format!("A shard named {id} or of replica set {} already exists ({host})", set.set_name)));
        }
    }
    // The shard's databases join the cluster with it as their primary, unless the cluster
    // has one of that name already.
    let listed = reply_result(router.pool.run_on_host(&primary, "admin", doc! {"listDatabases": 1, "nameOnly": true}, None, CONNECT_TIMEOUT).await?)?;
    let dbs: Vec<String> =
        listed.get_array("databases").map(|a| a.iter().filter_map(|d| d.as_document()?.get_str("name").ok().map(str::to_string)).collect()).unwrap_or_default();
    let dbs: Vec<String> = dbs.into_iter().filter(|d| !matches!(d.as_str(), "admin" | "local" | "config")).collect();
    for db in &dbs {
        if router.db_primary(db, false).await?.is_some() {
            return Err(Error::new(Code::OperationFailed, format!("can't add shard '{conn_string}' because a local database '{db}' exists in another shard")));
        }
    }
    router.config_write(doc! {"insert": "shards", "documents": [{"_id": &name, "host": conn_string, "state": 1, "topologyTime": now_timestamp()}]}).await?;
    router.reload_shards().await?;
    for db in &dbs {
        router.create_database(db, &name).await?;
    }
    tracing::info!(shard = %name, host = conn_string, "added shard");
    // The new shard is the emptiest: the balancer starts its round now.
    router.balancer.wake.notify_one();
    Ok(doc! {"shardAdded": name})
}

pub(crate) async fn list_shards(router: &Router) -> Result<Document> {
    let shards = router.reload_shards().await?;
    Ok(doc! {"shards": shards})
}

pub(crate) async fn enable_sharding(router: &Router, req: &Request) -> Result<Document> {
    let db = req.body.get_str(&req.name).map_err(|_| Error::type_mismatch("enableSharding takes a database name"))?;
    if db.is_empty() || matches!(db, "admin" | "local" | "config") || db.contains(['.', '/', '\\', ' ', '"', '$']) {
        return Err(Error::new(Code::InvalidNamespace, format!("invalid database name: '{db}'")));
    }
    match req.body.get_str("primaryShard") {
        Ok(p) => {
            router.shard(p).await?;
            let got = router.create_database(db, p).await?;
            if got.as_deref() != Some(p) {
                return Err(Error::new(Code::NamespaceExists, format!("database {db} already exists with primary shard {}", got.unwrap_or_default())));
            }
        }
        Err(_) => {
            router.db_primary(db, true).await?;
        }
    }
    Ok(Document::new())
}

/// moveChunk (`find`: a document whose chunk moves, or `bounds`: the chunk's [min, max],
/// and `to`) and moveRange (`min`, optionally `max`, and `toShard`): the chunk must exist
/// as given (shoal's router does not split within them yet).
pub(crate) async fn move_chunk(router: &Router, req: &Request) -> Result<Document> {
    let cmd = &req.body;
    let move_range = req.name == "moveRange";
    let known: &[&str] = if move_range {
        &["toShard", "min", "max", "waitForDelete", "_waitForDelete", "forceJumbo", "secondaryThrottle", "writeConcern"]
    } else {
        &["to", "find", "bounds", "_waitForDelete", "waitForDelete", "forceJumbo", "secondaryThrottle", "writeConcern", "maxTimeMS"]
    };
    common::value::check_fields(&req.name, cmd, known)?;
    let ns = cmd.get_str(&req.name).map_err(|_| Error::type_mismatch(format!("{} takes a namespace string", req.name)))?;
    let to = cmd.get_str(if move_range { "toShard" } else { "to" }).map_err(|_| {
        Error::location(40414, format!("BSON field '{}.{}' is missing but a required field", req.name, if move_range { "toShard" } else { "to" }))
    })?;
    let sc = router.sharded(ns).await?.ok_or_else(|| Error::new(Code(118, "NamespaceNotSharded"), format!("{ns} is not sharded")))?;
    let key = &sc.table.key;
    let (min, max) = match (cmd.get_document("find"), cmd.get_array("bounds"), cmd.get_document("min")) {
        (Ok(find), Err(_), _) if !move_range => {
            let k = key.key_of_doc(find)?;
            (sc.table.chunk_for(&k).min.clone(), None)
        }
        (Err(_), Ok(bounds), _) if !move_range && bounds.len() == 2 => {
            let bound = |i: usize| bounds[i].as_document().ok_or_else(|| Error::bad_value("bounds must hold two documents")).and_then(|d| key.key_of_bound(d));
            (bound(0)?, Some(bound(1)?))
        }
        (_, _, Ok(min)) if move_range => (key.key_of_bound(min)?, cmd.get_document("max").ok().map(|m| key.key_of_bound(m)).transpose()?),
        _ => return Err(Error::new(Code::InvalidOptions, if move_range { "moveRange needs min" } else { "moveChunk needs either find or bounds" })),
    };
    if let Some(max) = max {
        if sc.table.chunk_for(&min).max != max || sc.table.chunk_for(&min).min != min {
            return Err(Error::new(
                Code::InvalidOptions,
                format!("[{}, {}) is not a chunk of {ns}; shoal's router moves whole chunks", key.key_doc(&min), key.key_doc(&max)),
            ));
        }
    }
    let started = std::time::Instant::now();
    super::migrate::move_chunk(router, ns, &min, to).await?;
    Ok(if move_range {
        Document::new()
    } else {
        doc! {"millis": started.elapsed().as_millis() as i64}
    })
}

/// The index name mongod gives a key pattern: `customerId_hashed`, `a_1_b_1`.
fn index_name(key: &Document) -> String {
    key.iter()
        .map(|(k, v)| match v {
            Bson::String(s) => format!("{k}_{s}"),
            v => format!("{k}_{}", common::value::as_i64(v).unwrap_or(1)),
        })
        .collect::<Vec<_>>()
        .join("_")
}

pub(crate) async fn shard_collection(router: &Router, req: &Request) -> Result<Document> {
    let cmd = &req.body;
    common::value::check_fields(
        &req.name,
        cmd,
        &["key", "unique", "numInitialChunks", "presplitHashedZones", "collation", "implicitlyCreateIndex", "enforceUniquenessCheck"],
    )?;
    let ns = cmd.get_str(&req.name).map_err(|_| Error::type_mismatch("shardCollection takes a namespace string"))?.to_string();
    let Some((db, coll)) = ns.split_once('.').filter(|(d, c)| !d.is_empty() && !c.is_empty()) else {
        return Err(Error::new(Code::InvalidNamespace, format!("Invalid namespace {ns}")));
    };
    if matches!(db, "admin" | "local" | "config") || coll.starts_with("system.") {
        return Err(Error::new(Code::IllegalOperation, format!("can't shard {ns}")));
    }
    let key_doc = cmd.get_document("key").map_err(|_| Error::new(Code::FailedToParse, "shardCollection needs a key document"))?;
    let key = ShardKeyPattern::parse(key_doc)?;
    let unique = cmd.get_bool("unique").unwrap_or(false);
    if unique && key.hashed_field().is_some() {
        return Err(Error::new(Code::InvalidOptions, "hashed shard keys cannot be declared unique. It's possible to ensure uniqueness on the hashed field by declaring an additional (non-hashed) unique index on the field."));
    }
    if let Ok(c) = cmd.get_document("collation") {
        if c.get_str("locale").ok() != Some("simple") {
            return Err(Error::bad_value("The collation for shardCollection must be {locale: 'simple'}, which shoal uses for every collection"));
        }
    }
    if cmd.get_bool("presplitHashedZones").unwrap_or(false) {
        return Err(Error::new(Code::InvalidOptions, "presplitHashedZones needs zones, which shoal's router does not have yet"));
    }
    let shard_ids = router.placeable_shard_ids().await?;
    let per_shard = match cmd.get("numInitialChunks").and_then(common::value::as_i64) {
        None | Some(0) => INITIAL_CHUNKS_PER_SHARD,
        Some(n) if n > 0 && (n as u64) <= INITIAL_CHUNKS_PER_SHARD_MAX * shard_ids.len().max(1) as u64 => (n as u64).div_ceil(shard_ids.len().max(1) as u64),
        Some(_) => return Err(Error::new(Code::InvalidOptions, format!("numInitialChunks must be 1 to {} per shard", INITIAL_CHUNKS_PER_SHARD_MAX))),
    };
    let primary = router.db_primary(db, true).await?.ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("database {db} not found")))?;
    if let Some(existing) = router.sharded(&ns).await? {
        if existing.table.key.to_doc() == key.to_doc() {
            return Ok(doc! {"collectionsharded": &ns});
        }
        return Err(Error::new(Code::AlreadyInitialized, format!("sharding already enabled for collection {ns} with key {}", existing.table.key.to_doc())));
    }
    let primary_set = router.shard(&primary).await?;
    let on_primary = |body: Document| async { router.pool.run(&primary_set, db, body, None, COMMAND_TIMEOUT).await.and_then(|(_, r)| reply_result(r)) };
    let count = on_primary(doc! {"count": coll}).await?.get("n").and_then(common::value::as_i64).unwrap_or(0);
    let index = doc! {"key": key.to_doc().clone(), "name": index_name(key.to_doc()), "unique": unique};
    let chunks = if count == 0 {
        let chunks = initial_chunks(&key, &shard_ids, &primary, per_shard);
        // The shard-key index on the primary, then the collection with every index the
        // primary has on each other shard that gets a chunk (a migration copies indexes too).
        reply_result(router.pool.run(&primary_set, db, doc! {"createIndexes": coll, "indexes": [index.clone()]}, None, COMMAND_TIMEOUT).await?.1)?;
        let listed = on_primary(doc! {"listIndexes": coll}).await?;
        let specs = index_specs_to_copy(&listed)?;
        let owners: BTreeSet<&str> = chunks.iter().map(|c| c.shard.as_str()).filter(|s| *s != primary).collect();
        for owner in owners {
            let set = router.shard(owner).await?;
            reply_result(router.pool.run(&set, db, doc! {"createIndexes": coll, "indexes": specs.clone()}, None, COMMAND_TIMEOUT).await?.1)?;
        }
        chunks
    } else {
        // A populated collection keeps its documents on the primary in one chunk; the index
        // that serves the key must be there already, as mongod requires.
        let indexes = on_primary(doc! {"listIndexes": coll}).await?;
        let (_, specs) = cursor_batch(&indexes, "firstBatch")?;
        let prefix: Vec<(&String, &Bson)> = key.to_doc().iter().collect();
        let served = specs.iter().any(|s| s.get_document("key").is_ok_and(|k| k.iter().take(prefix.len()).eq(prefix.iter().copied())));
        if !served {
            return Err(Error::new(Code::InvalidOptions, "Please create an index that starts with the proposed shard key before sharding the collection."));
        }
        initial_chunks(&key, &[], &primary, 1)
    };
    let listed = on_primary(doc! {"listCollections": 1, "filter": {"name": coll}}).await?;
    let (_, infos) = cursor_batch(&listed, "firstBatch")?;
    let uuid = infos.first().and_then(|i| i.get_document("info").ok()).and_then(|i| i.get("uuid")).cloned().unwrap_or(Bson::Null);
    let now = now_timestamp();
    let chunk_docs: Vec<Document> = chunks
        .iter()
        .map(|c| {
            doc! {
                "_id": bson::oid::ObjectId::new(), "uuid": uuid.clone(), "min": key.key_doc(&c.min), "max": key.key_doc(&c.max), "shard": &c.shard,
                "lastmod": c.lastmod.to_timestamp(), "onCurrentShardSince": now, "history": [{"validAfter": now, "shard": &c.shard}],
            }
        })
        .collect();
    // Chunks first, then the entry that makes routers use them.
    for part in chunk_docs.chunks(1000) {
        router.config_write(doc! {"insert": "chunks", "documents": part.to_vec()}).await?;
    }
    router
        .config_write(doc! {"insert": "collections", "documents": [{
            "_id": &ns, "lastmodEpoch": bson::oid::ObjectId::new(), "lastmod": DateTime::now(), "timestamp": now, "uuid": uuid,
            "key": key.to_doc().clone(), "unique": unique, "noBalance": false,
        }]})
        .await?;
    router.forget_collection(&ns);
    tracing::info!(%ns, key = %key.to_doc(), chunks = chunks.len(), "sharded collection");
    Ok(doc! {"collectionsharded": ns})
}

// ---------------------------------------------------------------------------------------
// Writes

/// One statement of a write command and where it goes.
struct Stmt<'a> {
    /// Its position in the client's command.
    index: usize,
    body: StmtBody<'a>,
    shards: Vec<String>,
    /// Refused by the router before any shard saw it.
    error: Option<Error>,
    /// Shards that ran it (a statement sent again after StaleConfig skips them).
    done: Vec<String>,
}

enum StmtBody<'a> {
    Doc(Document),
    /// A document of the client's batch as the bytes it came as (`raw_insert`).
    Raw(&'a [u8]),
}

#[derive(Clone, Copy, PartialEq)]
enum WriteKind {
    Insert,
    Update,
    Delete,
}

impl WriteKind {
    fn field(self) -> &'static str {
        match self {
            WriteKind::Insert => "documents",
            WriteKind::Update => "updates",
            WriteKind::Delete => "deletes",
        }
    }
}

impl<'a> Stmt<'a> {
    fn new(index: usize, body: StmtBody<'a>, kind: WriteKind, sc: &ShardedColl) -> Stmt<'a> {
        let mut s = Stmt { index, body, shards: Vec::new(), error: None, done: Vec::new() };
        s.target(kind, sc);
        s
    }

    /// Where the statement goes under `sc`'s routing table, or why it goes nowhere.
    fn target(&mut self, kind: WriteKind, sc: &ShardedColl) {
        let targets = match (&self.body, kind) {
            (StmtBody::Doc(d), WriteKind::Insert) => sc.table.key.key_of_doc(d).map(|k| vec![sc.table.chunk_for(&k).shard.clone()]),
            (StmtBody::Raw(b), _) => bson::RawDocument::from_bytes(b)
                .map_err(|e| Error::new(Code::InvalidBSON, e.to_string()))
                .and_then(|d| sc.table.key.key_of_raw(d))
                .map(|k| vec![sc.table.chunk_for(&k).shard.clone()]),
            (StmtBody::Doc(d), WriteKind::Update) => update_targets(sc, d),
            (StmtBody::Doc(d), WriteKind::Delete) => delete_targets(sc, d),
        };
        match targets {
            Ok(t) => {
                self.shards = t.into_iter().filter(|s| !self.done.contains(s)).collect();
                self.error = None;
            }
            Err(e) => {
                self.shards = Vec::new();
                self.error = Some(e);
            }
        }
    }
}

/// The statements' array field of a write command ("documents", "updates", "deletes").
fn statements<'a>(req: &'a Request, field: &str) -> Result<&'a Vec<Bson>> {
    match req.body.get(field) {
        Some(Bson::Array(a)) => Ok(a),
        _ => Err(Error::location(40414, format!("BSON field '{}.{field}' is missing but a required field", req.name))),
    }
}

pub(crate) async fn insert(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let primary = router.db_primary(&req.db, true).await?.ok_or_else(|| Error::internal("no primary shard"))?;
    let Some(sc) = router.sharded(&ns).await? else { return forward_write(router, req, &primary).await };
    let docs = statements(req, "documents")?;
    let mut stmts = Vec::with_capacity(docs.len());
    for (index, d) in docs.iter().enumerate() {
        let Bson::Document(d) = d else {
            return Err(Error::type_mismatch("BSON field 'insert.documents' must hold documents"));
        };
        // The _id first, as mongod would give it, so every shard stores the same document.
        let d = if d.contains_key("_id") {
            d.clone()
        } else {
            let mut with_id = doc! {"_id": bson::oid::ObjectId::new()};
            with_id.extend(d.clone());
            with_id
        };
        stmts.push(Stmt::new(index, StmtBody::Doc(d), WriteKind::Insert, &sc));
    }
    split_write(router, req, WriteKind::Insert, sc, stmts).await
}

/// An insert into a sharded collection, its documents in a document sequence (as drivers
/// send them) or in the body: each document goes to its shard as the bytes it came as, only
/// its shard key decoded. `None` when the message is not such an insert (or a document
/// lacks an `_id`, which the router would have to add): the caller decodes it and runs it
/// as any command.
pub async fn raw_insert(router: &Router, conn: &mut RouterConn, msg: &wire::RawMsg<'_>) -> Option<Document> {
    if msg.body.iter().next().and_then(|e| e.ok()).map(|(k, _)| k.as_str()) != Some("insert") {
        return None;
    }
    // The body's other fields decoded; the documents left as BSON.
    let mut body = Document::new();
    let mut in_body: Option<Vec<&[u8]>> = None;
    for element in msg.body.iter() {
        let (k, v) = element.ok()?;
        if k.as_str() == "documents" {
            let docs: Option<Vec<&[u8]>> = v.as_array()?.into_iter().map(|d| d.ok()?.as_document().map(|d| d.as_bytes())).collect();
            in_body = Some(docs?);
        } else {
            body.insert(k.as_str(), Bson::try_from(v).ok()?);
        }
    }
    let documents = match (in_body, msg.sequences.as_slice()) {
        (Some(docs), []) => docs,
        (None, [seq]) if seq.identifier == "documents" => seq.documents.clone(),
        _ => return None,
    };
    let req = Request::from_msg(body, Vec::new()).ok()?;
    if super::txn::is_statement(&req) {
        return None;
    }
    let coll = collection_of(&req).ok()?;
    if router.config.auth {
        if let Err(e) = super::users::authorize(router, conn, &req).await {
            return Some(e.to_reply());
        }
    }
    let ns = format!("{}.{coll}", req.db);
    let sc = match router.sharded(&ns).await {
        Ok(Some(sc)) => sc,
        Ok(None) => return None,
        Err(e) => return Some(e.to_reply()),
    };
    let mut stmts = Vec::with_capacity(documents.len());
    for (index, bytes) in documents.iter().copied().enumerate() {
        let doc = bson::RawDocument::from_bytes(bytes).ok()?;
        if !matches!(doc.get("_id"), Ok(Some(_))) {
            return None;
        }
        stmts.push(Stmt::new(index, StmtBody::Raw(bytes), WriteKind::Insert, &sc));
    }
    let mut reply = match split_write(router, &req, WriteKind::Insert, sc, stmts).await {
        Ok(r) => r,
        Err(e) => return Some(e.to_reply()),
    };
    reply.insert("ok", 1.0);
    Some(reply)
}

/// Whether `filter` fixes `_id` to one value (a single update or delete may then go to every
/// shard: at most one holds it).
fn fixes_id(filter: &Document) -> bool {
    match filter.get("_id") {
        Some(Bson::Document(d)) if d.keys().next().is_some_and(|k| k.starts_with('$')) => d.len() == 1 && d.contains_key("$eq"),
        Some(Bson::Array(_) | Bson::RegularExpression(_)) | None => false,
        Some(_) => true,
    }
}

/// Whether an update's modifier names a shard-key field (itself, a parent or a child).
fn modifies_key(u: &Document, key: &ShardKeyPattern) -> Option<String> {
    for (op, fields) in u {
        let Bson::Document(fields) = fields else { continue };
        if !op.starts_with('$') {
            continue;
        }
        for path in fields.keys() {
            for k in key.field_names() {
                let related = path == k || k.starts_with(&format!("{path}.")) || path.starts_with(&format!("{k}."));
                if related {
                    return Some(path.clone());
                }
            }
        }
    }
    None
}

pub(super) fn update_targets(sc: &ShardedColl, stmt: &Document) -> Result<Vec<String>> {
    let filter = stmt.get_document("q").cloned().unwrap_or_default();
    let multi = stmt.get_bool("multi").unwrap_or(false);
    let upsert = stmt.get_bool("upsert").unwrap_or(false);
    let targets: Vec<String> = shards_for_filter(&sc.table, &filter).into_iter().collect();
    let moved =
        || Error::new(Code::ImmutableField, "this update would change a document's shard key; shoal's router does not move documents between shards yet");
    match stmt.get("u") {
        Some(Bson::Document(u)) if u.keys().next().is_some_and(|k| k.starts_with('$')) => {
            if let Some(path) = modifies_key(u, &sc.table.key) {
                return Err(Error::new(
                    Code::ImmutableField,
                    format!("Performing an update on the path '{path}' would modify the shard key; shoal's router does not move documents between shards yet"),
                ));
            }
        }
        Some(Bson::Document(replacement)) => {
            // A replacement keeps the document where it is only if its key is the filter's.
            let key = sc.table.key.key_of_doc(replacement)?;
            if targets.len() != 1 || sc.table.chunk_for(&key).shard != targets[0] {
                return Err(if targets.len() == 1 {
                    moved()
                } else {
                    Error::new(Code::ShardKeyNotFound, "A replacement update on a sharded collection must fix the full shard key in its filter")
                });
            }
        }
        Some(Bson::Array(_)) if targets.len() != 1 => {
            return Err(Error::new(Code::ShardKeyNotFound, "A pipeline update on a sharded collection must fix the full shard key in its filter"));
        }
        _ => {}
    }
    if upsert {
        // The upserted document takes its shard key from the filter's equalities, so the
        // filter must fix the whole key (wherever the chunks are now): else the document
        // could land on a shard its key does not map to.
        let Some(key) = shard::exact_key(&sc.table.key, &filter) else {
            return Err(Error::new(Code::ShardKeyNotFound, format!("Failed to target upsert by query :: could not extract exact shard key from {filter}")));
        };
        return Ok(vec![sc.table.chunk_for(&key).shard.clone()]);
    }
    if !multi && targets.len() > 1 && !fixes_id(&filter) {
        return Err(Error::new(
            Code::ShardKeyNotFound,
            "A {multi:false} update on a sharded collection must contain an exact match on _id (and have the collection default collation) or contain the shard key (and have the simple collation).",
        ));
    }
    Ok(targets)
}

pub(crate) async fn update(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let primary = router.db_primary(&req.db, true).await?.ok_or_else(|| Error::internal("no primary shard"))?;
    let Some(sc) = router.sharded(&ns).await? else { return forward_write(router, req, &primary).await };
    let mut stmts = Vec::new();
    for (index, s) in statements(req, "updates")?.iter().enumerate() {
        let Bson::Document(d) = s else { return Err(Error::type_mismatch("BSON field 'update.updates' must hold documents")) };
        stmts.push(Stmt::new(index, StmtBody::Doc(d.clone()), WriteKind::Update, &sc));
    }
    split_write(router, req, WriteKind::Update, sc, stmts).await
}

pub(crate) async fn delete(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let primary = router.db_primary(&req.db, true).await?.ok_or_else(|| Error::internal("no primary shard"))?;
    let Some(sc) = router.sharded(&ns).await? else { return forward_write(router, req, &primary).await };
    let mut stmts = Vec::new();
    for (index, s) in statements(req, "deletes")?.iter().enumerate() {
        let Bson::Document(d) = s else { return Err(Error::type_mismatch("BSON field 'delete.deletes' must hold documents")) };
        stmts.push(Stmt::new(index, StmtBody::Doc(d.clone()), WriteKind::Delete, &sc));
    }
    split_write(router, req, WriteKind::Delete, sc, stmts).await
}

pub(super) fn delete_targets(sc: &ShardedColl, stmt: &Document) -> Result<Vec<String>> {
    let filter = stmt.get_document("q").cloned().unwrap_or_default();
    let single = stmt.get("limit").and_then(common::value::as_i64) == Some(1);
    let shards: Vec<String> = shards_for_filter(&sc.table, &filter).into_iter().collect();
    if single && shards.len() > 1 && !fixes_id(&filter) {
        return Err(Error::new(
            Code::ShardKeyNotFound,
            "A single delete on a sharded collection must contain an exact match on _id (and have the collection default collation) or contain the shard key (and have the simple collation).",
        ));
    }
    Ok(shards)
}

/// findAndModify changes one document, so it goes to one shard: on a sharded collection,
/// the one its filter's shard key names (without one, ShardKeyNotFound, as mongod before
/// 7.0's two-phase writes), with the same rules for the update as `update_targets`.
async fn find_and_modify(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let primary = router.db_primary(&req.db, true).await?.ok_or_else(|| Error::internal("no primary shard"))?;
    let Some(sc) = router.sharded(&ns).await? else { return forward_write(router, req, &primary).await };
    let filter = match req.body.get("query") {
        Some(Bson::Document(q)) => q.clone(),
        None => Document::new(),
        Some(_) => return Err(Error::type_mismatch("BSON field 'findAndModify.query' is the wrong type, expected type 'object'")),
    };
    let Some(key) = shard::exact_key(&sc.table.key, &filter) else {
        return Err(Error::new(Code::ShardKeyNotFound, format!("Query for sharded findAndModify must contain the shard key ({})", sc.table.key.to_doc())));
    };
    if !req.body.get_bool("remove").unwrap_or(false) {
        // The update's own rules: the shard key stays.
        let mut stmt = doc! {"q": filter, "upsert": req.body.get_bool("upsert").unwrap_or(false)};
        if let Some(u) = req.body.get("update") {
            stmt.insert("u", u.clone());
        }
        update_targets(&sc, &stmt)?;
    }
    let shard = &sc.table.chunk_for(&key).shard;
    shard_run(router, shard, &req.db, versioned(&forwarded(req), Some(&sc), shard), None, timeout_of(req)).await
}

/// A write on an unsharded collection: the whole command to the database's primary shard,
/// its statements as a document sequence (`statements_apart`).
async fn forward_write(router: &Router, req: &Request, primary: &str) -> Result<Document> {
    let (body, statements) = statements_apart(&req.name, router.with_db_version(&req.db, forwarded(req)))?;
    let sequence = statements.as_ref().map(|(identifier, docs)| wire::RawSequence { identifier, documents: docs.iter().map(Vec::as_slice).collect() });
    shard_run(router, primary, &req.db, body, sequence.as_ref(), timeout_of(req)).await
}

/// Run `body` on `shard` (through its primary), its reply or error. Within a transaction's
/// statement it goes as the transaction's statement there (`txn::on_shard`).
pub(super) async fn shard_run(
    router: &Router,
    shard: &str,
    db: &str,
    body: Document,
    sequence: Option<&wire::RawSequence<'_>>,
    timeout: Duration,
) -> Result<Document> {
    let (_, raw) = shard_run_raw(router, shard, db, body, sequence, timeout).await?;
    net::pool::decode(raw)
}

/// `shard_run` with the host that answered and its reply as it came (a cursor command's).
pub(super) async fn shard_run_raw(
    router: &Router,
    shard: &str,
    db: &str,
    mut body: Document,
    sequence: Option<&wire::RawSequence<'_>>,
    timeout: Duration,
) -> Result<(String, bson::RawDocumentBuf)> {
    let set = router.shard(shard).await?;
    let sent = super::txn::on_shard(shard, &mut body);
    let (host, raw) = router.pool.run_raw(&set, db, body, sequence, timeout).await?;
    match net::pool::raw_error(&raw) {
        Some(e) => {
            super::txn::answered(sent, Some(&e));
            Err(e)
        }
        None => Ok((host, raw)),
    }
}

/// A write's statements (insert's documents, update's and delete's statements) taken out of
/// its body, encoded, to go as a document sequence as drivers send them: each may be near
/// 16 MiB, and together up to the 48 MB of a message, more than one body may hold.
pub(super) fn statements_apart(name: &str, mut body: Document) -> Result<(Document, Option<(&'static str, Vec<Vec<u8>>)>)> {
    let field = match name {
        "insert" => "documents",
        "update" => "updates",
        "delete" => "deletes",
        _ => return Ok((body, None)),
    };
    let Some(Bson::Array(statements)) = body.remove(field) else { return Ok((body, None)) };
    let encoded = statements
        .iter()
        .map(|s| match s {
            Bson::Document(d) => d.to_vec().map_err(|e| Error::new(Code::InvalidBSON, e.to_string())),
            _ => Err(Error::type_mismatch(format!("BSON field '{name}.{field}' holds a {}, expected objects", common::value::type_name(s)))),
        })
        .collect::<Result<Vec<Vec<u8>>>>()?;
    Ok((body, Some((field, encoded))))
}

/// The merged result of a write split over shards.
#[derive(Default)]
struct WriteResult {
    n: i64,
    n_modified: Option<i64>,
    upserted: Vec<Document>,
    write_errors: Vec<Document>,
    write_concern_error: Option<Bson>,
}

impl WriteResult {
    fn error(&mut self, index: usize, e: &Error) {
        let mut d = doc! {"index": index as i32, "code": e.code, "codeName": e.code_name, "errmsg": &e.message};
        if let Some(extra) = e.extra.as_deref() {
            d.extend(extra.clone());
        }
        self.write_errors.push(d);
    }

    /// Take a shard's reply to the sub-batch `indexes` (positions in the client's command).
    fn take(&mut self, indexes: &[usize], reply: Result<Document>) {
        let reply = match reply.and_then(reply_result) {
            Ok(r) => r,
            Err(e) => {
                // The shard refused the whole sub-batch: each statement failed with it.
                for &i in indexes {
                    self.error(i, &e);
                }
                return;
            }
        };
        self.n += reply.get("n").and_then(common::value::as_i64).unwrap_or(0);
        if let Some(m) = reply.get("nModified").and_then(common::value::as_i64) {
            *self.n_modified.get_or_insert(0) += m;
        }
        let original = |d: &Document| d.get("index").and_then(common::value::as_i64).and_then(|i| indexes.get(i as usize)).copied();
        for u in reply.get_array("upserted").map(|a| a.as_slice()).unwrap_or_default() {
            if let Some(mut u) = u.as_document().cloned() {
                if let Some(i) = original(&u) {
                    u.insert("index", i as i32);
                    self.upserted.push(u);
                }
            }
        }
        for e in reply.get_array("writeErrors").map(|a| a.as_slice()).unwrap_or_default() {
            if let Some(mut e) = e.as_document().cloned() {
                if let Some(i) = original(&e) {
                    e.insert("index", i as i32);
                    self.write_errors.push(e);
                }
            }
        }
        if self.write_concern_error.is_none() {
            self.write_concern_error = reply.get("writeConcernError").cloned();
        }
    }

    fn into_reply(mut self, field: &str) -> Document {
        // Int32, as mongod and mongos reply (a batch holds at most 100,000 statements).
        let mut r = doc! {"n": self.n as i32};
        if field == "updates" {
            r.insert("nModified", self.n_modified.unwrap_or(0) as i32);
            if !self.upserted.is_empty() {
                self.upserted.sort_by_key(|u| u.get_i32("index").unwrap_or(0));
                r.insert("upserted", self.upserted);
            }
        }
        if !self.write_errors.is_empty() {
            self.write_errors.sort_by_key(|e| e.get_i32("index").unwrap_or(0));
            r.insert("writeErrors", self.write_errors);
        }
        if let Some(wce) = self.write_concern_error {
            r.insert("writeConcernError", wce);
        }
        r
    }
}

/// Send each shard the statements that target it, as one command with the client's other
/// fields (write concern, session, `ordered`) and the shard's version. Unordered: every
/// shard at once. Ordered: runs of consecutive statements with the same targets, one run
/// after another, stopping at the first error, as mongos does. A shard that answers
/// StaleConfig ran none of its statements: the router reads the routing table again and
/// sends them where it now says, skipping the shards that already ran them.
async fn split_write(router: &Router, req: &Request, kind: WriteKind, mut sc: Arc<ShardedColl>, mut stmts: Vec<Stmt<'_>>) -> Result<Document> {
    let field = kind.field();
    let ordered = req.body.get_bool("ordered").unwrap_or(true);
    let mut result = WriteResult::default();
    let mut base = forwarded(req);
    base.remove(field);
    // A retryable write's statement ids (a transaction's statements have none).
    let stmt_ids: Option<Vec<i32>> = (req.body.contains_key("txnNumber") && !req.body.contains_key("autocommit")).then(|| {
        let given = req.body.get_array("stmtIds").ok();
        (0..stmts.len()).map(|i| given.and_then(|g| g.get(i)).and_then(|v| v.as_i32()).unwrap_or(i as i32)).collect()
    });
    base.remove("stmtIds");
    let mut i = 0;
    let mut stale_rounds = 0;
    while i < stmts.len() {
        // The statements of this round: a run (ordered) or all of them (unordered).
        let mut end = i;
        if ordered {
            while end < stmts.len() && stmts[end].error.is_none() && stmts[end].shards == stmts[i].shards {
                end += 1;
            }
            if end == i {
                // A statement the router refused ends an ordered batch there.
                let s = &stmts[i];
                result.error(s.index, s.error.as_ref().expect("a run stops only at a refused statement"));
                break;
            }
        } else {
            end = stmts.len();
        }
        let before = result.write_errors.len();
        let mut pending: Vec<usize> = (i..end).collect();
        while !pending.is_empty() {
            let mut per_shard: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for &p in &pending {
                let s = &stmts[p];
                match &s.error {
                    Some(e) => result.error(s.index, e),
                    None => {
                        for shard in &s.shards {
                            per_shard.entry(shard.clone()).or_default().push(p);
                        }
                    }
                }
            }
            let sends = per_shard.into_iter().map(|(shard, list)| {
                let mut body = base.clone();
                if let Some(ids) = &stmt_ids {
                    body.insert("stmtIds", list.iter().map(|&p| ids[stmts[p].index]).collect::<Vec<i32>>());
                }
                body.insert("shardVersion", sc.version_doc(&shard));
                let stmts = &stmts;
                async move {
                    // Each statement as BSON: a raw one as it came, a decoded one encoded once.
                    let encoded: Result<Vec<Vec<u8>>> = list
                        .iter()
                        .filter_map(|&p| match &stmts[p].body {
                            StmtBody::Doc(d) => {
                                Some(bson::RawDocumentBuf::try_from(d).map(|r| r.into_bytes()).map_err(|e| Error::new(Code::InvalidBSON, e.to_string())))
                            }
                            StmtBody::Raw(_) => None,
                        })
                        .collect();
                    let reply = match encoded {
                        Ok(encoded) => {
                            let mut owned = encoded.iter();
                            let documents: Vec<&[u8]> = list
                                .iter()
                                .filter_map(|&p| match &stmts[p].body {
                                    StmtBody::Raw(b) => Some(*b),
                                    StmtBody::Doc(_) => owned.next().map(Vec::as_slice),
                                })
                                .collect();
                            let sequence = wire::RawSequence { identifier: field, documents };
                            shard_run(router, &shard, &req.db, body, Some(&sequence), timeout_of(req)).await
                        }
                        Err(e) => Err(e),
                    };
                    (shard, list, reply)
                }
            });
            let mut stale = Vec::new();
            for (shard, list, reply) in futures_util::future::join_all(sends).await {
                if let Err(e) = &reply {
                    if is_stale(e) && stale_rounds < STALE_RETRIES_MAX {
                        router.after_stale(&sc.ns, e);
                        stale.extend(list);
                        continue;
                    }
                }
                let indexes: Vec<usize> = list.iter().map(|&p| stmts[p].index).collect();
                result.take(&indexes, reply);
                for &p in &list {
                    stmts[p].done.push(shard.clone());
                }
            }
            pending = stale;
            if !pending.is_empty() {
                stale_rounds += 1;
                tokio::time::sleep(stale_backoff(stale_rounds)).await;
                sc = match router.sharded(&sc.ns).await? {
                    Some(fresh) => fresh,
                    None => return Err(Error::new(Code::NamespaceNotFound, format!("{} is no longer sharded", sc.ns))),
                };
                pending.sort_unstable();
                pending.dedup();
                for &p in &pending {
                    stmts[p].target(kind, &sc);
                }
            }
        }
        if ordered && result.write_errors.len() > before {
            break;
        }
        i = end;
    }
    Ok(result.into_reply(field))
}

/// Times an operation is sent again after StaleConfig (mongos's 10 attempts).
pub(super) const STALE_RETRIES_MAX: u32 = 10;

/// An answer that the router's routing table, or the shard's identity, is out of date.
/// Such an answer means the shard ran nothing, and the operation may go again, except a
/// transaction's statement that a participant answered (`txn::may_retry_stale`).
pub(super) fn is_stale(e: &Error) -> bool {
    is_stale_code(e.code) && super::txn::may_retry_stale()
}

pub(super) fn is_stale_code(code: i32) -> bool {
    code == Code::StaleConfig.0 || code == Code::ShardingStateNotInitialized.0 || code == Code::StaleDbVersion.0
}

/// The wait before the `n`th retry after StaleConfig: none first, then growing, as a
/// migration's critical section may hold the shard's answer for a while.
pub(super) fn stale_backoff(n: u32) -> Duration {
    Duration::from_millis(if n <= 1 { 0 } else { (10u64 << n.min(7)).min(1000) })
}

// ---------------------------------------------------------------------------------------
// Reads

fn batch_size_of(v: Option<&Bson>) -> Result<Option<usize>> {
    match v {
        None => Ok(None),
        Some(v) => match common::value::as_i64(v) {
            Some(n) if n >= 0 => Ok(Some(n as usize)),
            _ => Err(Error::bad_value("batchSize must be a non-negative number")),
        },
    }
}

/// `{cursor: {firstBatch, id, ns}}`.
fn cursor_reply(ns: &str, id: i64, batch: Vec<Document>, key: &str) -> Document {
    doc! {"cursor": {key: batch, "id": id, "ns": ns}}
}

/// A reply for the client from a router cursor: its first batch, and the cursor kept if it
/// has more (and the client did not ask for one batch only).
async fn first_batch(router: &Router, mut cursor: RouterCursor, batch: usize, single: bool) -> Result<Document> {
    let docs = match cursor.next_batch(&router.pool, batch).await {
        Ok(d) => d,
        Err(e) => {
            cursor.kill(&router.pool).await;
            return Err(e);
        }
    };
    let ns = cursor.ns.clone();
    let id = if cursor.exhausted() || single {
        cursor.kill(&router.pool).await;
        0
    } else {
        router.cursors.register(cursor)?
    };
    Ok(cursor_reply(&ns, id, docs, "firstBatch"))
}

/// Run a cursor command on each shard, all at once; any failure kills the cursors the others
/// opened and is the answer.
/// A snapshot read outside a transaction that names no `atClusterTime`: on several shards
/// it must read one point of all of them.
fn unpinned_snapshot(body: &Document) -> bool {
    !body.contains_key("autocommit")
        && body.get_document("readConcern").is_ok_and(|rc| rc.get_str("level").ok() == Some("snapshot") && !rc.contains_key("atClusterTime"))
}

/// `body` reading at `t`, with `t` as the cluster time it gossips (a shard refuses a point
/// beyond the cluster time it knows).
fn at_cluster_time(body: &Document, t: bson::Timestamp) -> Document {
    let mut body = body.clone();
    if let Ok(rc) = body.get_document_mut("readConcern") {
        rc.insert("atClusterTime", t);
    }
    gossip_cluster_time(&mut body, t);
    body
}

/// `body` gossiping cluster time `t` (unsigned, as shoal runs without keys).
pub(super) fn gossip_cluster_time(body: &mut Document, t: bson::Timestamp) {
    body.insert("$clusterTime", common::optime::cluster_time_doc(t));
}

/// The point a snapshot read read at, in a router reply: `cursor.atClusterTime` for find
/// and aggregate, `atClusterTime` for distinct.
fn answer_point(reply: &mut Document, at: Option<bson::Timestamp>) {
    let Some(t) = at else { return };
    match reply.get_document_mut("cursor") {
        Ok(c) => {
            c.insert("atClusterTime", t);
        }
        Err(_) => {
            reply.insert("atClusterTime", t);
        }
    }
}

/// `body` for `shards` shards. A snapshot read over several shards with no point of its own
/// reads at the router's cluster time (as mongos): the newest any shard or config server
/// told it, so at or after every write it acknowledged. Each shard reads there once the point
/// is majority-committed there.
fn pinned<'a>(router: &Router, body: &'a Document, shards: usize) -> Result<std::borrow::Cow<'a, Document>> {
    if shards < 2 || !unpinned_snapshot(body) {
        return Ok(std::borrow::Cow::Borrowed(body));
    }
    let t = router.pool.cluster_time().ok_or_else(|| Error::new(Code::SnapshotUnavailable, "the router knows no cluster time yet; please retry"))?;
    Ok(std::borrow::Cow::Owned(at_cluster_time(body, t)))
}

/// Open a cursor on each shard.
async fn open_streams(router: &Router, req: &Request, sc: &ShardedColl, shards: &BTreeSet<String>, body: &Document) -> Result<Vec<Stream>> {
    match open_streams_once(router, req, sc, shards, &*pinned(router, body, shards.len())?).await {
        // A shard keeps history only while reads at a point use it: one that had none at the
        // router's point has it now, and its reply moved the router's cluster time past its
        // newest entry. Once more, at the new point.
        Err(e) if e.code == Code::SnapshotTooOld.0 && unpinned_snapshot(body) && shards.len() > 1 => {
            open_streams_once(router, req, sc, shards, &*pinned(router, body, shards.len())?).await
        }
        r => r,
    }
}

async fn open_streams_once(router: &Router, req: &Request, sc: &ShardedColl, shards: &BTreeSet<String>, body: &Document) -> Result<Vec<Stream>> {
    let opens = shards.iter().map(|s| async move {
        let (host, raw) = shard_run_raw(router, s, &req.db, versioned(body, Some(sc), s), None, timeout_of(req)).await?;
        Stream::from_reply(host, &req.db, &raw)
    });
    let mut streams = Vec::new();
    let mut error = None;
    for r in futures_util::future::join_all(opens).await {
        match r {
            Ok(s) => streams.push(s),
            Err(e) => error = error.or(Some(e)),
        }
    }
    if let Some(e) = error {
        RouterCursor::new(String::new(), streams, None, 0, None, None).kill(&router.pool).await;
        return Err(e);
    }
    Ok(streams)
}

/// `body` with the shard's version in `sc`'s routing table, if the collection is sharded.
fn versioned(body: &Document, sc: Option<&ShardedColl>, shard: &str) -> Document {
    let mut body = body.clone();
    if let Some(sc) = sc {
        body.insert("shardVersion", sc.version_doc(shard));
    }
    body
}

/// A cursor command for one shard, its reply passed on with the router's cursor id.
pub(super) async fn single_shard_cursor(router: &Router, req: &Request, shard: &str, body: Document) -> Result<Document> {
    let ns_default = format!("{}.{}", req.db, req.body.get_str(&req.name).unwrap_or("$cmd"));
    let (host, raw) = shard_run_raw(router, shard, &req.db, body, None, timeout_of(req)).await?;
    let ns = raw.get_document("cursor").ok().and_then(|c| c.get_str("ns").ok()).unwrap_or(&ns_default).to_string();
    let mut stream = Stream::from_reply(host, &req.db, &raw)?;
    let batch: Vec<Document> = stream.buf.drain(..).map(|(d, _)| d).collect();
    let at = stream.at_cluster_time;
    let id = if stream.id == 0 { 0 } else { router.cursors.register(RouterCursor::new(ns.clone(), vec![stream], None, 0, None, None))? };
    let mut reply = cursor_reply(&ns, id, batch, "firstBatch");
    answer_point(&mut reply, at);
    Ok(reply)
}

async fn find(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let Some(primary) = router.db_primary(&req.db, false).await? else { return Ok(cursor_reply(&ns, 0, Vec::new(), "firstBatch")) };
    let Some(sc) = router.sharded(&ns).await? else { return single_shard_cursor(router, req, &primary, router.with_db_version(&req.db, forwarded(req))).await };
    let cmd = &req.body;
    let filter = cmd.get_document("filter").cloned().unwrap_or_default();
    let targets = shards_for_filter(&sc.table, &filter);
    if targets.is_empty() {
        return Ok(cursor_reply(&ns, 0, Vec::new(), "firstBatch"));
    }
    if targets.len() == 1 {
        let only = targets.into_iter().next().unwrap_or_default();
        return single_shard_cursor(router, req, &only, versioned(&forwarded(req), Some(&sc), &only)).await;
    }
    let skip = cmd.get("skip").and_then(common::value::as_i64).unwrap_or(0).max(0) as u64;
    let limit = cmd.get("limit").and_then(common::value::as_i64).filter(|l| *l > 0).map(|l| l as u64);
    let batch = batch_size_of(cmd.get("batchSize"))?;
    let sort = match cmd.get_document("sort") {
        Ok(s) if !s.is_empty() => Some(query::sort::SortSpec::parse(s)?),
        _ => None,
    };
    let mut body = forwarded(req);
    body.remove("skip");
    body.remove("singleBatch");
    if let Some(l) = limit {
        body.insert("limit", (l + skip) as i64);
    }
    // A sort needs its fields in what the shards return: the projection waits for the merge.
    let projection = match (cmd.get_document("projection"), &sort) {
        (Ok(p), Some(_)) if !p.is_empty() => {
            body.remove("projection");
            Some(query::projection::Projection::parse(p)?)
        }
        _ => None,
    };
    let streams = open_streams(router, req, &sc, &targets, &body).await?;
    let at = streams.first().and_then(|s| s.at_cluster_time);
    let cursor = RouterCursor::new(ns, streams, sort, skip, limit, projection);
    let mut reply = first_batch(router, cursor, batch.unwrap_or(FIRST_BATCH_DOCS_DEFAULT), cmd.get_bool("singleBatch").unwrap_or(false)).await?;
    answer_point(&mut reply, at);
    Ok(reply)
}

pub(crate) async fn get_more(router: &Router, req: &Request) -> Result<Document> {
    let id = match req.body.get("getMore") {
        Some(Bson::Int64(id)) => *id,
        _ => return Err(Error::type_mismatch("BSON field 'getMore.getMore' is the wrong type, expected type 'long'")),
    };
    let coll = req.body.get_str("collection").map_err(|_| Error::location(40414, "BSON field 'getMore.collection' is missing but a required field"))?;
    let batch = batch_size_of(req.body.get("batchSize"))?.filter(|b| *b > 0).unwrap_or(usize::MAX);
    let Some(cursor) = router.cursors.get(id) else {
        return Err(Error::new(Code::CursorNotFound, format!("cursor id {id} not found")));
    };
    let mut c = cursor.lock().await;
    let ns = format!("{}.{coll}", req.db);
    if c.ns != ns {
        return Err(Error::new(Code::Unauthorized, format!("Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {}", c.ns)));
    }
    let docs = match c.next_batch(&router.pool, batch).await {
        Ok(d) => d,
        Err(e) => {
            c.kill(&router.pool).await;
            router.cursors.remove(id);
            return Err(e);
        }
    };
    let done = c.exhausted();
    if done {
        router.cursors.remove(id);
    }
    Ok(cursor_reply(&ns, if done { 0 } else { id }, docs, "nextBatch"))
}

pub(crate) async fn kill_cursors(router: &Router, req: &Request) -> Result<Document> {
    let ids = req.body.get_array("cursors").map_err(|_| Error::location(40414, "BSON field 'killCursors.cursors' is missing but a required field"))?;
    let (mut killed, mut not_found) = (Vec::new(), Vec::new());
    for id in ids {
        let Some(id) = id.as_i64() else { continue };
        match router.cursors.remove(id) {
            Some(c) => {
                c.lock().await.kill(&router.pool).await;
                killed.push(id);
            }
            None => not_found.push(id),
        }
    }
    Ok(doc! {"cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": [], "cursorsUnknown": []})
}

/// The shards a read of `filter` on `ns` goes to: the targeted ones if the collection is
/// sharded (with its routing table), else its database's primary; none if the database does
/// not exist.
async fn read_targets(router: &Router, db: &str, ns: &str, filter: &Document) -> Result<(BTreeSet<String>, Option<Arc<ShardedColl>>)> {
    let Some(primary) = router.db_primary(db, false).await? else { return Ok((BTreeSet::new(), None)) };
    Ok(match router.sharded(ns).await? {
        Some(sc) => (shards_for_filter(&sc.table, filter), Some(sc)),
        None => ([primary].into_iter().collect(), None),
    })
}

/// Run `body` on each shard at once (with its version if the collection is sharded); every
/// reply, or the first error.
async fn on_each(router: &Router, req: &Request, sc: Option<&ShardedColl>, shards: &BTreeSet<String>, body: &Document) -> Result<Vec<Document>> {
    let once = |body: Document| async move {
        let sends = shards.iter().map(|s| {
            let body = &body;
            async move { shard_run(router, s, &req.db, versioned(body, sc, s), None, timeout_of(req)).await }
        });
        futures_util::future::join_all(sends).await.into_iter().collect::<Result<Vec<Document>>>()
    };
    match once(pinned(router, body, shards.len())?.into_owned()).await {
        // As `open_streams`: once more at the router's new cluster time.
        Err(e) if e.code == Code::SnapshotTooOld.0 && unpinned_snapshot(body) && shards.len() > 1 => {
            once(pinned(router, body, shards.len())?.into_owned()).await
        }
        r => r,
    }
}

async fn count(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let filter = req.body.get_document("query").cloned().unwrap_or_default();
    let (targets, sc) = read_targets(router, &req.db, &ns, &filter).await?;
    let skip = req.body.get("skip").and_then(common::value::as_i64).unwrap_or(0).max(0);
    let limit = req.body.get("limit").and_then(common::value::as_i64).unwrap_or(0).abs();
    let mut body = forwarded(req);
    body.remove("skip");
    if limit > 0 {
        body.insert("limit", limit + skip);
    }
    if sc.is_none() {
        body = router.with_db_version(&req.db, body);
    }
    let mut n = 0;
    for r in on_each(router, req, sc.as_deref(), &targets, &body).await? {
        n += r.get("n").and_then(common::value::as_i64).unwrap_or(0);
    }
    n = (n - skip).max(0);
    if limit > 0 {
        n = n.min(limit);
    }
    Ok(doc! {"n": n})
}

async fn distinct(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let filter = req.body.get_document("query").cloned().unwrap_or_default();
    let (targets, sc) = read_targets(router, &req.db, &ns, &filter).await?;
    let mut values: Vec<Bson> = Vec::new();
    let body = if sc.is_none() { router.with_db_version(&req.db, forwarded(req)) } else { forwarded(req) };
    let mut at = None;
    for r in on_each(router, req, sc.as_deref(), &targets, &body).await? {
        values.extend(r.get_array("values").cloned().unwrap_or_default());
        at = at.or(r.get_timestamp("atClusterTime").ok());
    }
    values.sort_by(query::compare::cmp_bson);
    values.dedup_by(|a, b| query::compare::cmp_bson(a, b) == std::cmp::Ordering::Equal);
    let mut reply = doc! {"values": values};
    answer_point(&mut reply, at);
    Ok(reply)
}

/// A `$group` split in two: the one each shard runs, and the stages the router runs over
/// the shards' groups. `None` unless every accumulator combines: $sum and $count (sums of
/// partial sums), $min and $max, and $avg (a partial sum and count of numeric values, whose
/// quotient the router takes; none is null, as $avg of nothing).
fn split_group(group: &Document) -> Option<(Document, Vec<Document>)> {
    let mut shard = doc! {"_id": group.get("_id")?.clone()};
    let mut merge = doc! {"_id": "$_id"};
    let mut project = doc! {"_id": 1};
    let mut averaged = false;
    for (field, spec) in group.iter().filter(|(k, _)| k.as_str() != "_id") {
        let acc = spec.as_document().filter(|d| d.len() == 1)?;
        let (op, arg) = acc.iter().next()?;
        let mine = format!("${field}");
        match op.as_str() {
            "$sum" | "$min" | "$max" => {
                shard.insert(field, doc! {op: arg.clone()});
                merge.insert(field, doc! {if op == "$min" || op == "$max" { op.as_str() } else { "$sum" }: &mine});
                project.insert(field, &mine);
            }
            "$count" if arg.as_document().is_some_and(|d| d.is_empty()) => {
                shard.insert(field, doc! {"$sum": 1});
                merge.insert(field, doc! {"$sum": &mine});
                project.insert(field, &mine);
            }
            "$avg" => {
                let (sum, n) = (format!("__shoal_avg_sum_{field}"), format!("__shoal_avg_n_{field}"));
                shard.insert(&sum, doc! {"$sum": arg.clone()});
                shard.insert(&n, doc! {"$sum": {"$cond": [{"$isNumber": arg.clone()}, 1, 0]}});
                merge.insert(&sum, doc! {"$sum": format!("${sum}")});
                merge.insert(&n, doc! {"$sum": format!("${n}")});
                project.insert(field, doc! {"$cond": [{"$eq": [format!("${n}"), 0]}, Bson::Null, {"$divide": [format!("${sum}"), format!("${n}")]}]});
                averaged = true;
            }
            _ => return None,
        }
    }
    let mut stages = vec![doc! {"$group": merge}];
    if averaged {
        // The fields in the client's order, each average from its parts.
        stages.push(doc! {"$project": project});
    }
    Some((shard, stages))
}

/// Stages each shard can run on its own documents: they look at one document at a time.
fn runs_on_shards(stage: &Document) -> bool {
    matches!(
        stage.keys().next().map(String::as_str),
        Some("$match" | "$project" | "$addFields" | "$set" | "$unset" | "$replaceRoot" | "$replaceWith" | "$unwind")
    )
}

async fn aggregate(router: &Router, req: &Request) -> Result<Document> {
    let cmd = &req.body;
    if cmd.get_bool("explain").unwrap_or(false) {
        return Err(Error::new(Code::CommandNotSupported, "aggregate explain is not supported by shoal yet"));
    }
    let stages: Vec<Document> = cmd
        .get_array("pipeline")
        .map_err(|_| Error::location(40414, "BSON field 'aggregate.pipeline' is missing but a required field"))?
        .iter()
        .filter_map(|s| s.as_document().cloned())
        .collect();
    let batch = batch_size_of(cmd.get_document("cursor").ok().and_then(|c| c.get("batchSize")))?.unwrap_or(FIRST_BATCH_DOCS_DEFAULT);
    if stages.first().is_some_and(|s| s.contains_key("$shardedDataDistribution")) {
        return super::introspect::sharded_data_distribution(router, req, &stages, batch).await;
    }
    let coll = collection_of(req).map_err(|_| Error::new(Code::CommandNotSupported, "aggregate without a collection is not supported by shoal's router"))?;
    let ns = format!("{}.{coll}", req.db);
    if stages.first().is_some_and(|s| s.contains_key("$collStats")) {
        let out = super::introspect::coll_stats_stage(router, req, &stages).await?;
        return buffered_cursor(router, req, ns, coll, out, batch).await;
    }
    let Some(primary) = router.db_primary(&req.db, false).await? else { return Ok(cursor_reply(&ns, 0, Vec::new(), "firstBatch")) };
    let Some(sc) = router.sharded(&ns).await? else { return single_shard_cursor(router, req, &primary, router.with_db_version(&req.db, forwarded(req))).await };
    let split = stages.iter().position(|s| !runs_on_shards(s)).unwrap_or(stages.len());
    let (on_shards, merge) = stages.split_at(split);
    // A $group whose accumulators combine runs on the shards too, partially: each shard
    // groups its own documents, and the router groups their groups.
    let partial = merge.first().and_then(|s| s.get_document("$group").ok()).and_then(split_group);
    let (on_shards, merge): (Vec<Document>, Vec<Document>) = match partial {
        Some((shard_group, merging)) => {
            let mut shard_stages = on_shards.to_vec();
            shard_stages.push(doc! {"$group": shard_group});
            (shard_stages, merging.into_iter().chain(merge[1..].iter().cloned()).collect())
        }
        None => (on_shards.to_vec(), merge.to_vec()),
    };
    let (on_shards, merge) = (on_shards.as_slice(), merge.as_slice());
    // The leading $matches decide the shards.
    let filter = query::agg::Pipeline::parse(on_shards)?.leading_match().unwrap_or_default();
    let targets = shards_for_filter(&sc.table, &filter);
    if targets.len() == 1 {
        let only = targets.into_iter().next().unwrap_or_default();
        return single_shard_cursor(router, req, &only, versioned(&forwarded(req), Some(&sc), &only)).await;
    }
    let merge = router_stages(merge, "this stage is not supported on a sharded collection by shoal's router yet")?;
    let mut body = forwarded(req);
    body.insert("pipeline", on_shards.iter().cloned().map(Bson::Document).collect::<Vec<_>>());
    body.insert("cursor", Document::new());
    let streams = open_streams(router, req, &sc, &targets, &body).await?;
    let at = streams.first().and_then(|s| s.at_cluster_time);
    let mut cursor = RouterCursor::new(ns.clone(), streams, None, 0, None, None);
    if merge.stages.is_empty() {
        let mut reply = first_batch(router, cursor, batch, false).await?;
        answer_point(&mut reply, at);
        return Ok(reply);
    }
    // The rest of the pipeline runs here, over every document the shards return.
    let mut input = Vec::new();
    let mut bytes = 0;
    while !cursor.exhausted() {
        for d in cursor.next_batch(&router.pool, usize::MAX).await? {
            bytes += doc_size(&d);
            input.push(d);
        }
        if bytes > MERGE_INPUT_BYTES_MAX {
            cursor.kill(&router.pool).await;
            return Err(Error::new(Code::ExceededMemoryLimit, format!("a sharded aggregate's merge took in more than {MERGE_INPUT_BYTES_MAX} bytes")));
        }
    }
    let out = run_router_stages(&merge, input, cmd.get_bool("allowDiskUse").unwrap_or(false))?;
    let mut reply = buffered_cursor(router, req, ns, coll, out, batch).await?;
    answer_point(&mut reply, at);
    Ok(reply)
}

/// Stages the router runs itself, over documents it holds (a sharded aggregate's merge, or
/// what a first stage the router answers made): none may need a collection (`refusal`).
pub(super) fn router_stages(stages: &[Document], refusal: &str) -> Result<query::agg::Pipeline> {
    let p = query::agg::Pipeline::parse(stages)?;
    if p.stages.iter().any(|s| matches!(s, query::agg::Stage::External(..))) {
        return Err(Error::new(Code::CommandNotSupported, refusal));
    }
    Ok(p)
}

/// Run `router_stages` over `input`, within an aggregate's memory limit.
pub(super) fn run_router_stages(p: &query::agg::Pipeline, input: Vec<Document>, allow_disk_use: bool) -> Result<Vec<Document>> {
    let opts = query::agg::RunOptions { allow_disk_use, mem_limit_bytes: common::limits::AGG_MEMORY_BYTES_MAX };
    p.run(&mut input.into_iter().map(Ok), &opts)
}

/// Documents the router computed, returned as a cursor of batches of `batch`.
/// aggregate: `$listLocalSessions` answered from this router's sessions, any other pipeline
/// routed (`whole`).
pub(crate) async fn aggregate_command(router: &Router, conn: &RouterConn, req: &Request) -> Result<Document> {
    let first = req.body.get_array("pipeline").ok().and_then(|p| p.first()).and_then(Bson::as_document);
    let Some(spec) = first.and_then(|s| s.get("$listLocalSessions")) else { return whole(router, req).await };
    let stages: Vec<Document> = req.body.get_array("pipeline").map(|p| p.iter().skip(1).filter_map(|s| s.as_document().cloned()).collect()).unwrap_or_default();
    let batch = batch_size_of(req.body.get_document("cursor").ok().and_then(|c| c.get("batchSize")))?.unwrap_or(FIRST_BATCH_DOCS_DEFAULT);
    list_local_sessions(router, conn, req, spec, &stages, batch).await
}

/// `$listLocalSessions`: this router's own sessions, through the rest of the pipeline here.
async fn list_local_sessions(router: &Router, conn: &RouterConn, req: &Request, spec: &Bson, rest: &[Document], batch: usize) -> Result<Document> {
    if collection_of(req).is_ok() {
        return Err(Error::new(Code::InvalidNamespace, "$listLocalSessions must be the first stage of an {aggregate: 1}"));
    }
    let current = conn.auth.user.as_ref().map(|u| (u.user.as_str(), u.db.as_str()));
    let users = access::sessions::list_spec(spec, current)?;
    let docs = router.sessions.list(users.as_deref());
    let pipeline = query::agg::Pipeline::parse(rest)?;
    let opts = query::agg::RunOptions { allow_disk_use: req.body.get_bool("allowDiskUse").unwrap_or(false), mem_limit_bytes: MERGE_INPUT_BYTES_MAX };
    let out = pipeline.run_interruptible(&mut docs.into_iter().map(Ok), &opts, &|| Ok(()))?;
    buffered_cursor(router, req, format!("{}.$cmd.aggregate", req.db), String::new(), out, batch).await
}

pub(super) async fn buffered_cursor(router: &Router, req: &Request, ns: String, coll: String, docs: Vec<Document>, batch: usize) -> Result<Document> {
    let buffered: Vec<(Document, usize)> = docs
        .into_iter()
        .map(|d| {
            let size = doc_size(&d);
            (d, size)
        })
        .collect();
    let stream = Stream { host: String::new(), db: req.db.clone(), coll, id: 0, buf: buffered.into(), at_cluster_time: None };
    first_batch(router, RouterCursor::new(ns, vec![stream], None, 0, None, None), batch, false).await
}

// ---------------------------------------------------------------------------------------
// Databases, collections and indexes

pub(crate) async fn list_databases(router: &Router, req: &Request) -> Result<Document> {
    let name_only = req.body.get_bool("nameOnly").unwrap_or(false);
    let mut sizes: BTreeMap<String, i64> = BTreeMap::new();
    let mut body = forwarded(req);
    body.remove("filter");
    for id in router.shard_ids().await? {
        let set = router.shard(&id).await?;
        let reply = reply_result(router.pool.run(&set, "admin", body.clone(), None, COMMAND_TIMEOUT).await?.1)?;
        for d in reply.get_array("databases").map(|a| a.as_slice()).unwrap_or_default() {
            let Some(d) = d.as_document() else { continue };
            let Ok(name) = d.get_str("name") else { continue };
            if matches!(name, "local" | "admin" | "config") {
                continue;
            }
            *sizes.entry(name.to_string()).or_default() += d.get("sizeOnDisk").and_then(common::value::as_i64).unwrap_or(0);
        }
    }
    let total: i64 = sizes.values().sum();
    let dbs: Vec<Document> = sizes
        .into_iter()
        .map(|(name, size)| {
            if name_only {
                doc! {"name": name}
            } else {
                doc! {"name": name, "sizeOnDisk": size, "empty": size == 0}
            }
        })
        .collect();
    let dbs = match req.body.get_document("filter") {
        Ok(f) => {
            let f = query::filter::Filter::parse(f)?;
            dbs.into_iter().filter(|d| f.matches(d)).collect()
        }
        Err(_) => dbs,
    };
    let mut r = doc! {"databases": dbs};
    if !name_only {
        r.insert("totalSize", total);
    }
    Ok(r)
}

/// A command about one unsharded thing in a database: to its primary shard.
pub(crate) async fn forward_to_primary(router: &Router, req: &Request) -> Result<Document> {
    let primary = match router.db_primary(&req.db, req.name == "create").await? {
        Some(p) => p,
        None if req.name == "listCollections" => return Ok(cursor_reply(&format!("{}.$cmd.listCollections", req.db), 0, Vec::new(), "firstBatch")),
        None => return Err(Error::new(Code::NamespaceNotFound, format!("database {} not found", req.db))),
    };
    let body = router.with_db_version(&req.db, forwarded(req));
    if matches!(req.name.as_str(), "listCollections" | "listIndexes") {
        return single_shard_cursor(router, req, &primary, body).await;
    }
    shard_run(router, &primary, &req.db, body, None, timeout_of(req)).await
}

/// Indexes and drops of a sharded collection go to every shard that has it; of an unsharded
/// one, to its primary shard.
pub(crate) async fn forward_to_owners(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let Some(primary) = router.db_primary(&req.db, req.name == "createIndexes").await? else {
        return Err(Error::new(Code::NamespaceNotFound, format!("ns not found: {ns}")));
    };
    let Some(sc) = router.sharded(&ns).await? else {
        return shard_run(router, &primary, &req.db, router.with_db_version(&req.db, forwarded(req)), None, timeout_of(req)).await;
    };
    let mut owners = sc.table.shards();
    owners.insert(primary.clone());
    let replies = on_each(router, req, None, &owners, &forwarded(req)).await?;
    if req.name == "drop" {
        router.config_write(doc! {"delete": "chunks", "deletes": [{"q": {"uuid": sc.uuid.clone()}, "limit": 0}]}).await?;
        router.config_write(doc! {"delete": "collections", "deletes": [{"q": {"_id": &ns}, "limit": 1}]}).await?;
        router.forget_collection(&ns);
    }
    // The primary shard's reply speaks for the collection.
    let at = owners.iter().position(|s| *s == primary).unwrap_or(0);
    Ok(replies.into_iter().nth(at).unwrap_or_default())
}

pub(crate) async fn drop_database(router: &Router, req: &Request) -> Result<Document> {
    if matches!(req.db.as_str(), "admin" | "config" | "local") {
        return Err(Error::new(Code::IllegalOperation, format!("Cannot drop the {} database through the router", req.db)));
    }
    let shards: BTreeSet<String> = router.shard_ids().await?.into_iter().collect();
    on_each(router, req, None, &shards, &forwarded(req)).await?;
    let prefix = format!("^{}\\.", regex_escape(&req.db));
    let colls = router.config_find("collections", doc! {"_id": {"$regex": &prefix}}, doc! {}).await?;
    for c in &colls {
        router.config_write(doc! {"delete": "chunks", "deletes": [{"q": {"uuid": c.get("uuid").cloned().unwrap_or(Bson::Null)}, "limit": 0}]}).await?;
    }
    router.config_write(doc! {"delete": "collections", "deletes": [{"q": {"_id": {"$regex": &prefix}}, "limit": 0}]}).await?;
    router.config_write(doc! {"delete": "databases", "deletes": [{"q": {"_id": &req.db}, "limit": 1}]}).await?;
    router.forget_database(&req.db);
    Ok(doc! {"dropped": &req.db})
}

/// A document's size as BSON.
fn doc_size(d: &Document) -> usize {
    bson::RawDocumentBuf::try_from(d).map(|r| r.as_bytes().len()).unwrap_or(0)
}

fn regex_escape(s: &str) -> String {
    s.chars().flat_map(|c| if c.is_ascii_alphanumeric() || c == '_' { vec![c] } else { vec!['\\', c] }).collect()
}

/// The index specs of a listIndexes reply that another shard creates to hold a copy of the
/// collection: every index but `_id_` (created with the collection), without its version.
pub(crate) fn index_specs_to_copy(listed: &Document) -> Result<Vec<Document>> {
    let (_, specs) = cursor_batch(listed, "firstBatch")?;
    Ok(specs
        .into_iter()
        .filter(|s| s.get_str("name").ok() != Some("_id_"))
        .map(|mut s| {
            s.remove("v");
            s
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_split_into_shard_and_merge_parts_when_their_accumulators_combine() {
        let (shard, merge) = split_group(&doc! {"_id": "$a", "s": {"$sum": "$x"}, "m": {"$max": "$x"}}).unwrap();
        assert_eq!(shard, doc! {"_id": "$a", "s": {"$sum": "$x"}, "m": {"$max": "$x"}});
        assert_eq!(merge, vec![doc! {"$group": {"_id": "$_id", "s": {"$sum": "$s"}, "m": {"$max": "$m"}}}]);
        let (_, merge) = split_group(&doc! {"_id": null, "a": {"$avg": "$x"}, "c": {"$count": {}}}).unwrap();
        assert_eq!(merge.len(), 2, "an average is taken from its parts after the merge");
        assert!(split_group(&doc! {"_id": null, "p": {"$push": "$x"}}).is_none());
        assert!(split_group(&doc! {"_id": null, "f": {"$first": "$x"}}).is_none());
    }

    #[test]
    fn index_names_follow_mongods_rule() {
        assert_eq!(index_name(&doc! {"customerId": "hashed"}), "customerId_hashed");
        assert_eq!(index_name(&doc! {"a": 1, "b.c": 1}), "a_1_b.c_1");
    }

    #[test]
    fn single_writes_may_go_everywhere_only_by_id() {
        assert!(fixes_id(&doc! {"_id": 5}));
        assert!(fixes_id(&doc! {"_id": {"$eq": 5}, "x": 1}));
        assert!(!fixes_id(&doc! {"_id": {"$gt": 5}}));
        assert!(!fixes_id(&doc! {"x": 1}));
    }

    #[test]
    fn updates_that_touch_the_shard_key_are_seen() {
        let key = ShardKeyPattern::parse(&doc! {"a.b": 1}).unwrap();
        assert_eq!(modifies_key(&doc! {"$set": {"a": {"b": 1}}}, &key).as_deref(), Some("a"));
        assert_eq!(modifies_key(&doc! {"$inc": {"a.b.c": 1}}, &key).as_deref(), Some("a.b.c"));
        assert_eq!(modifies_key(&doc! {"$set": {"ab": 1, "c": 2}}, &key), None);
    }
}
