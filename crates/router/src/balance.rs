//! Chunk placement: `split`, the balancer (`balancerStart`, `balancerStop`,
//! `balancerStatus`, and the rounds each router runs), `removeShard`'s draining, and
//! `movePrimary`.
//!
//! The balancer evens out chunk counts: each round, for each sharded collection, one chunk
//! moves from the shard with the most to the one with the fewest when they differ by
//! `IMBALANCE_CHUNKS_MIN` or more, and every chunk of a draining shard moves off it. It
//! runs in every router; two routers picking the same collection collide on its
//! config.migrations record, and one of them skips it. Its switch is config.settings
//! `{_id: "balancer", mode}` (on when absent, as in mongod). Each round first recovers
//! the migrations and movePrimaries whose routers died (their leases ran out), even with
//! the balancer off: their critical sections may hold writes.
//!
//! movePrimary moves a database's unsharded collections: config.databases records the
//! move, the old primary's critical section stops writes to them, they are copied with
//! their options and indexes, and the commit (the entry's new primary and version) is
//! conditional on the record, so a recovery's fence (`recover_move_primary`, after
//! `migrate::MOVE_PRIMARY_LEASE`) can make it fail. After the commit the old primary
//! drops its copies, and a router with the old entry gets StaleDbVersion from it.

use super::catalog::{now_timestamp, CONFIG_SHARD};
use super::Router;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use net::pool::{reply_result, COMMAND_TIMEOUT};
use shard::{ChunkVersion, Key};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The pause between balancer rounds that moved nothing (mongod's 10 s).
const ROUND_INTERVAL_IDLE: Duration = Duration::from_secs(10);
/// ...and after a round that moved a chunk: the next may have more to do.
const ROUND_INTERVAL_BUSY: Duration = Duration::from_millis(100);
/// Chunk counts of two shards must differ by this much for the balancer to move one.
const IMBALANCE_CHUNKS_MIN: usize = 2;

#[derive(Default)]
pub struct BalancerState {
    in_round: AtomicBool,
    rounds: AtomicU64,
    /// Woken by balancerStart and addShard/removeShard, so a round need not wait.
    pub wake: tokio::sync::Notify,
}

/// Run balancer rounds until the process ends.
pub async fn balancer_loop(router: Arc<Router>) {
    loop {
        let moved = match round(&router).await {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!("balancer round failed: {}", e.message);
                0
            }
        };
        let pause = if moved > 0 { ROUND_INTERVAL_BUSY } else { ROUND_INTERVAL_IDLE };
        let _ = tokio::time::timeout(pause, router.balancer.wake.notified()).await;
    }
}

async fn enabled(router: &Router) -> Result<bool> {
    let settings = router.config_find("settings", doc! {"_id": "balancer"}, doc! {}).await?;
    Ok(settings.first().is_none_or(|s| s.get_str("mode").unwrap_or("full") != "off" && !s.get_bool("stopped").unwrap_or(false)))
}

/// One round; returns how many chunks it moved. Dead routers' migrations and movePrimaries
/// are recovered even while the balancer is off: their critical sections may hold writes.
async fn round(router: &Router) -> Result<usize> {
    recover_abandoned(router).await?;
    if !enabled(router).await? {
        return Ok(0);
    }
    router.balancer.in_round.store(true, Ordering::SeqCst);
    let r = balance_all(router).await;
    router.balancer.in_round.store(false, Ordering::SeqCst);
    router.balancer.rounds.fetch_add(1, Ordering::Relaxed);
    r
}

/// Migrations and movePrimaries whose routers died (their critical sections may hold
/// writes).
async fn recover_abandoned(router: &Router) -> Result<()> {
    for m in router.config_find("migrations", doc! {}, doc! {}).await? {
        if super::migrate::is_abandoned(&m) {
            if let Err(e) = super::migrate::recover(router, &m).await {
                tracing::warn!("cannot recover an abandoned migration: {}", e.message);
            }
        }
    }
    if let Err(e) = super::coordinator::recover_abandoned(router).await {
        tracing::warn!("cannot finish an abandoned transaction commit: {}", e.message);
    }
    for d in router.config_find("databases", doc! {"movePrimaryInProgress": {"$exists": true}}, doc! {}).await? {
        if super::migrate::is_older_than(d.get_datetime("movePrimaryStarted").ok(), super::migrate::MOVE_PRIMARY_LEASE) {
            if let Err(e) = recover_move_primary(router, &d).await {
                tracing::warn!("cannot recover an abandoned movePrimary: {}", e.message);
            }
        }
    }
    Ok(())
}

async fn balance_all(router: &Router) -> Result<usize> {
    let shards = router.reload_shards().await?;
    let draining: Vec<String> =
        shards.iter().filter(|s| s.get_bool("draining").unwrap_or(false)).filter_map(|s| s.get_str("_id").ok().map(str::to_string)).collect();
    let active: Vec<String> = shards.iter().filter_map(|s| s.get_str("_id").ok().map(str::to_string)).filter(|s| !draining.contains(s)).collect();
    if active.is_empty() {
        return Ok(0);
    }
    let mut moved = 0;
    for c in router.config_find("collections", doc! {}, doc! {"_id": 1}).await? {
        let Ok(ns) = c.get_str("_id") else { continue };
        if c.get_bool("dropped").unwrap_or(false) || c.get_bool("noBalance").unwrap_or(false) {
            continue;
        }
        let Some(sc) = router.sharded(ns).await? else { continue };
        let mut counts: BTreeMap<&str, usize> = active.iter().map(|s| (s.as_str(), 0)).collect();
        let mut on_draining = None;
        for ch in sc.table.chunks() {
            if let Some(n) = counts.get_mut(ch.shard.as_str()) {
                *n += 1;
            } else if on_draining.is_none() {
                on_draining = Some(ch.clone());
            }
        }
        let (fewest, least) = counts.iter().min_by_key(|(_, n)| **n).map(|(s, n)| (s.to_string(), *n)).unwrap_or_default();
        let (most, greatest) = counts.iter().max_by_key(|(_, n)| **n).map(|(s, n)| (s.to_string(), *n)).unwrap_or_default();
        let chunk = match on_draining {
            Some(ch) => ch,
            None if greatest >= least + IMBALANCE_CHUNKS_MIN => match sc.table.chunks().iter().find(|ch| ch.shard == most) {
                Some(ch) => ch.clone(),
                None => continue,
            },
            None => continue,
        };
        match super::migrate::move_chunk(router, ns, &chunk.min, &fewest).await {
            Ok(()) => {
                tracing::info!(%ns, from = %chunk.shard, to = %fewest, "balancer moved a chunk");
                moved += 1;
            }
            Err(e) => tracing::info!(%ns, "balancer could not move a chunk: {}", e.message),
        }
    }
    Ok(moved)
}

/// balancerStart / balancerStop: set config.settings' switch. balancerStop returns once the
/// round under way (in this router) is over, as mongod's waits for its balancer.
pub async fn set_balancer(router: &Router, on: bool) -> Result<Document> {
    let mode = if on { "full" } else { "off" };
    router
        .config_write(doc! {"update": "settings", "updates": [{"q": {"_id": "balancer"}, "u": {"$set": {"mode": mode, "stopped": !on}}, "upsert": true}]})
        .await?;
    if on {
        router.balancer.wake.notify_one();
    } else {
        let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
        while router.balancer.in_round.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(Document::new())
}

pub async fn balancer_status(router: &Router) -> Result<Document> {
    let on = enabled(router).await?;
    Ok(doc! {
        "mode": if on { "full" } else { "off" },
        "inBalancerRound": router.balancer.in_round.load(Ordering::SeqCst),
        "numBalancerRounds": router.balancer.rounds.load(Ordering::Relaxed) as i64,
    })
}

/// `split: ns, middle: {...}`: the chunk holding `middle` becomes two at it. Or `bounds:
/// [min, max]` of a chunk of a hashed key: split at the middle of its hash range (a ranged
/// key's median would need the documents, which shoal's router does not ask shards for
/// yet).
pub async fn split(router: &Router, req: &wire::Request) -> Result<Document> {
    let cmd = &req.body;
    common::value::check_fields(&req.name, cmd, &["middle", "bounds", "find"])?;
    let ns = cmd.get_str(&req.name).map_err(|_| Error::type_mismatch("split takes a namespace string"))?;
    router.forget_collection(ns);
    let sc = router.sharded(ns).await?.ok_or_else(|| Error::new(Code(118, "NamespaceNotSharded"), format!("{ns} is not sharded")))?;
    let key = &sc.table.key;
    let middle: Key = match (cmd.get_document("middle"), cmd.get_array("bounds")) {
        (Ok(m), _) => key.key_of_bound(m)?,
        (Err(_), Ok(b)) if b.len() == 2 && key.hashed_field() == Some(0) => {
            let lo = b[0].as_document().ok_or_else(|| Error::bad_value("bounds must hold two documents")).and_then(|d| key.key_of_bound(d))?;
            let chunk = sc.table.chunk_for(&lo);
            let as_i128 = |v: &Bson| match v {
                Bson::Int64(i) => *i as i128,
                Bson::MinKey => i64::MIN as i128,
                _ => i64::MAX as i128 + 1,
            };
            let mid = ((as_i128(&chunk.min[0]) + as_i128(&chunk.max[0])) / 2).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
            let mut k = vec![Bson::Int64(mid)];
            k.extend(std::iter::repeat_n(Bson::MinKey, key.len() - 1));
            k
        }
        _ => return Err(Error::new(Code::CommandNotSupported, "split needs middle (or bounds of a chunk of a hashed shard key)")),
    };
    let chunk = sc.table.chunk_for(&middle).clone();
    if chunk.min == middle {
        return Err(Error::new(Code::InvalidOptions, format!("cannot split on {}: it is a chunk's lower bound already", key.key_doc(&middle))));
    }
    let version = sc.table.version();
    let right = ChunkVersion { major: version.major, minor: version.minor + 1 };
    let left = ChunkVersion { major: version.major, minor: version.minor + 2 };
    let now = now_timestamp();
    // The right half first, then the left one shrinks: in between, a reader sees the right
    // half inside the old chunk, and `RoutingTable::new` takes the inner chunk's bound (a
    // split cut short stays readable that way).
    router
        .config_write(doc! {"insert": "chunks", "documents": [{
            "_id": bson::oid::ObjectId::new(), "uuid": sc.uuid.clone(), "min": key.key_doc(&middle), "max": key.key_doc(&chunk.max), "shard": &chunk.shard,
            "lastmod": right.to_timestamp(), "onCurrentShardSince": now, "history": [{"validAfter": now, "shard": &chunk.shard}],
        }]})
        .await?;
    router
        .config_write(doc! {"update": "chunks", "updates": [{
            "q": {"uuid": sc.uuid.clone(), "min": key.key_doc(&chunk.min), "shard": &chunk.shard},
            "u": {"$set": {"max": key.key_doc(&middle), "lastmod": left.to_timestamp()}},
        }]})
        .await?;
    router.forget_collection(ns);
    Ok(Document::new())
}

/// `removeShard: id`: the first call starts draining (the balancer moves its chunks off,
/// no new database or chunk goes to it); later calls report what is left; once nothing is,
/// the shard leaves config.shards.
pub async fn remove_shard(router: &Router, req: &wire::Request) -> Result<Document> {
    let id = req.body.get_str(&req.name).map_err(|_| Error::type_mismatch("removeShard takes a shard id"))?.to_string();
    let shards = router.reload_shards().await?;
    let Some(entry) = shards.iter().find(|s| s.get_str("_id").ok() == Some(id.as_str())) else {
        return Err(Error::new(Code::ShardNotFound, format!("Shard {id} not found")));
    };
    if shards.len() == 1 {
        return Err(Error::new(Code::IllegalOperation, "Operation not allowed because it would remove the last shard"));
    }
    let dbs: Vec<String> = router
        .config_find("databases", doc! {"primary": &id}, doc! {"_id": 1})
        .await?
        .iter()
        .filter_map(|d| d.get_str("_id").ok().map(str::to_string))
        .collect();
    let note = "you need to call movePrimary for these databases (or drop them)";
    if !entry.get_bool("draining").unwrap_or(false) {
        router.config_write(doc! {"update": "shards", "updates": [{"q": {"_id": &id}, "u": {"$set": {"draining": true}}}]}).await?;
        router.reload_shards().await?;
        router.balancer.wake.notify_one();
        return Ok(doc! {"msg": "draining started successfully", "state": "started", "shard": &id, "note": note, "dbsToMove": dbs});
    }
    let chunks = router.config_find("chunks", doc! {"shard": &id}, doc! {}).await?.len() as i64;
    if chunks == 0 && dbs.is_empty() {
        router.config_write(doc! {"delete": "shards", "deletes": [{"q": {"_id": &id}, "limit": 1}]}).await?;
        router.reload_shards().await?;
        tracing::info!(shard = %id, "removed shard");
        return Ok(doc! {"msg": "removeshard completed successfully", "state": "completed", "shard": &id});
    }
    Ok(doc! {
        "msg": "draining ongoing", "state": "ongoing",
        "remaining": {"chunks": chunks, "dbs": dbs.len() as i64, "jumboChunks": 0i64, "collectionsToMove": 0i64},
        "note": note, "dbsToMove": dbs,
    })
}

/// `movePrimary: db, to: shard`: the database's unsharded collections move to `to`, which
/// becomes its primary shard (sharded collections' chunks stay where they are). As
/// mongod's: config.databases records the move (a primary that restarts or fails over then
/// holds writes), the old primary stops writes to those collections (its critical section),
/// they are copied with their options and indexes, the entry's primary and version change
/// (conditional on the record, so a recovery can fence it), the old primary lets writes go
/// on (routers with the old entry now get StaleDbVersion from it) and drops its copies.
pub async fn move_primary(router: &Router, req: &wire::Request) -> Result<Document> {
    let db = req.body.get_str(&req.name).map_err(|_| Error::type_mismatch("movePrimary takes a database name"))?.to_string();
    let to = req.body.get_str("to").map_err(|_| Error::location(40414, "BSON field 'movePrimary.to' is missing but a required field"))?.to_string();
    if matches!(db.as_str(), "admin" | "config" | "local") {
        return Err(Error::new(Code::InvalidOptions, format!("Can't move primary for {db} database")));
    }
    router.forget_database(&db);
    let from = router.db_primary(&db, false).await?.ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("Database {db} not found")))?;
    let target = router.shard(&to).await?;
    let reply = doc! {"primary": format!("{to}:{}", target.conn_string)};
    if from == to {
        return Ok(reply);
    }
    let source = router.shard(&from).await?;
    // The unsharded collections, with their options; none of them on the target yet.
    let listed = router.command(&source, &db, doc! {"listCollections": 1, "cursor": {"batchSize": 100_000}}).await?;
    let (_, colls) = net::peer::cursor_batch(&listed, "firstBatch")?;
    let mut moving = Vec::new();
    for c in colls {
        let Ok(name) = c.get_str("name") else { continue };
        if name.starts_with("system.") || router.sharded(&format!("{db}.{name}")).await?.is_some() {
            continue;
        }
        if c.get_str("type").unwrap_or("collection") != "collection" {
            return Err(Error::new(
                Code::CommandNotSupported,
                format!("{db}.{name} is a {}: movePrimary moves collections only", c.get_str("type").unwrap_or("?")),
            ));
        }
        moving.push((name.to_string(), c.get_document("options").cloned().unwrap_or_default()));
    }
    let listed = router.command(&target, &db, doc! {"listCollections": 1, "nameOnly": true, "cursor": {"batchSize": 100_000}}).await?;
    let (_, there) = net::peer::cursor_batch(&listed, "firstBatch")?;
    if let Some((name, _)) = moving.iter().find(|(n, _)| there.iter().any(|t| t.get_str("name").ok() == Some(n.as_str()))) {
        return Err(Error::new(Code::NamespaceExists, format!("{db}.{name} exists on {to} already")));
    }
    let id = bson::oid::ObjectId::new();
    let record = doc! {"$set": {"movePrimaryInProgress": id, "movePrimaryStarted": bson::DateTime::now()}};
    let r = router
        .config_write(
            doc! {"update": "databases", "updates": [{"q": {"_id": &db, "primary": &from, "movePrimaryInProgress": {"$exists": false}}, "u": record}]},
        )
        .await?;
    if r.get("n").and_then(common::value::as_i64) != Some(1) {
        return Err(Error::new(Code::ConflictingOperationInProgress, format!("database {db} is being moved already, or its primary changed")));
    }
    let moved = async {
        router.command(&source, &db, doc! {"_shardsvrEnterCriticalSection": &db, "migrationId": id}).await?;
        for (name, options) in &moving {
            copy_collection(router, &source, &target, &db, name, options).await?;
        }
        let commit = doc! {"$set": {"primary": &to}, "$inc": {"version.lastMod": 1}, "$unset": {"movePrimaryInProgress": "", "movePrimaryStarted": ""}};
        let r = router
            .config_write(doc! {"update": "databases", "updates": [{"q": {"_id": &db, "primary": &from, "movePrimaryInProgress": id}, "u": commit}]})
            .await?;
        if r.get("n").and_then(common::value::as_i64) != Some(1) {
            return Err(Error::new(Code::ConflictingOperationInProgress, format!("the move of database {db} was fenced by a recovery")));
        }
        Ok(())
    }
    .await;
    let committed = moved.is_ok();
    if let Err(e) = router.command(&source, &db, doc! {"_shardsvrExitCriticalSection": &db, "migrationId": id}).await {
        tracing::warn!(%db, "the old primary did not leave the critical section: {}", e.message);
    }
    // The copies nobody reads any more: the old primary's after the commit, the target's
    // after a failure.
    let (holder, set) = if committed { (&from, &source) } else { (&to, &target) };
    for (name, _) in &moving {
        if let Err(e) = router.command(set, &db, doc! {"drop": name}).await {
            if e.code != Code::NamespaceNotFound.0 {
                tracing::warn!(%db, collection = %name, "{holder} kept its copy: {}", e.message);
            }
        }
    }
    if !committed {
        let _ = router.config_write(doc! {"update": "databases", "updates": [{"q": {"_id": &db, "movePrimaryInProgress": id}, "u": {"$unset": {"movePrimaryInProgress": "", "movePrimaryStarted": ""}}}]}).await;
    }
    router.forget_database(&db);
    moved.map(|()| reply)
}

/// Copy collection `name` of `db` from `source` to `target`: created with its options, its
/// indexes, then its documents in batches (the source takes no writes meanwhile).
async fn copy_collection(
    router: &Router,
    source: &net::pool::ReplicaSet,
    target: &net::pool::ReplicaSet,
    db: &str,
    name: &str,
    options: &Document,
) -> Result<()> {
    const COPY_BATCH_DOCS: i32 = 10_000;
    let mut create = doc! {"create": name};
    create.extend(options.clone());
    router.command(target, db, create).await?;
    let listed = router.command(source, db, doc! {"listIndexes": name}).await?;
    let specs = super::commands::index_specs_to_copy(&listed)?;
    if !specs.is_empty() {
        router.command(target, db, doc! {"createIndexes": name, "indexes": specs}).await?;
    }
    let (host, first) = router.pool.run(source, db, doc! {"find": name, "batchSize": COPY_BATCH_DOCS}, None, COMMAND_TIMEOUT).await?;
    let (mut id, mut docs) = net::peer::cursor_batch(&reply_result(first)?, "firstBatch")?;
    loop {
        if !docs.is_empty() {
            // As a document sequence: a batch of up to 16 MiB of documents (or one of any
            // legal size) need not fit, with the command around it, in one 16 MiB body.
            let encoded = std::mem::take(&mut docs)
                .iter()
                .map(|d| d.to_vec().map_err(|e| Error::internal(format!("copying {db}.{name}: {e}"))))
                .collect::<Result<Vec<Vec<u8>>>>()?;
            let sequence = wire::RawSequence { identifier: "documents", documents: encoded.iter().map(Vec::as_slice).collect() };
            let r = reply_result(router.pool.run(target, db, doc! {"insert": name}, Some(&sequence), COMMAND_TIMEOUT).await?.1)?;
            if let Ok(errors) = r.get_array("writeErrors") {
                return Err(Error::new(Code::OperationFailed, format!("copying {db}.{name}: {errors:?}")));
            }
        }
        if id == 0 {
            return Ok(());
        }
        let more = reply_result(
            router.pool.run_on_host(&host, db, doc! {"getMore": id, "collection": name, "batchSize": COPY_BATCH_DOCS}, None, COMMAND_TIMEOUT).await?,
        )?;
        (id, docs) = net::peer::cursor_batch(&more, "nextBatch")?;
    }
}

/// Fence and end a movePrimary whose router died (config.databases still records it after
/// its lease): the record goes, so its commit can no longer match, and the old primary
/// lets writes go on.
async fn recover_move_primary(router: &Router, entry: &Document) -> Result<()> {
    let (Ok(db), Ok(id), Ok(primary)) = (entry.get_str("_id"), entry.get_object_id("movePrimaryInProgress"), entry.get_str("primary")) else { return Ok(()) };
    router.config_write(doc! {"update": "databases", "updates": [{"q": {"_id": db, "movePrimaryInProgress": id}, "u": {"$unset": {"movePrimaryInProgress": "", "movePrimaryStarted": ""}}}]}).await?;
    let set = router.shard(primary).await?;
    router.command(&set, db, doc! {"_shardsvrExitCriticalSection": db, "migrationId": id}).await?;
    tracing::warn!(%db, "recovered a movePrimary its router left");
    Ok(())
}

/// Shards new databases and chunks may go to: not draining, not the config servers.
pub fn placeable(shards: &[Document]) -> Vec<String> {
    shards
        .iter()
        .filter(|s| !s.get_bool("draining").unwrap_or(false))
        .filter_map(|s| s.get_str("_id").ok().map(str::to_string))
        .filter(|s| s != CONFIG_SHARD)
        .collect()
}
