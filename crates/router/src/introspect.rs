//! The router's answers about itself and about data spread over shards, in mongos's shapes:
//! serverStatus and connectionStatus (the router's own state), dbStats and collStats (each
//! shard's reply under `raw` or `shards`, and their sums), a leading `$collStats` stage
//! (one document per shard, with its `shard`), `$shardedDataDistribution` (owned and
//! orphaned documents per shard), and explain (each targeted shard's plan under a
//! SINGLE_SHARD or SHARD_MERGE stage).

use super::commands::{buffered_cursor, collection_of, forwarded, router_stages, run_router_stages, timeout_of};
use super::Router;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};
use std::sync::atomic::Ordering;
use wire::Request;

fn num(d: &Document, f: &str) -> i64 {
    d.get(f).and_then(common::value::as_i64).unwrap_or(0)
}

/// serverStatus: the router process's identity, uptime and connections.
pub fn server_status(router: &Router) -> Document {
    let uptime = router.started.elapsed();
    let current = router.connections_current.load(Ordering::Relaxed);
    doc! {
        "host": format!("{}:{}", net::process::hostname(), router.config.port),
        "version": common::server::VERSION,
        "process": "mongos",
        "pid": std::process::id() as i64,
        "uptime": uptime.as_secs_f64().floor(),
        "uptimeMillis": uptime.as_millis() as i64,
        "uptimeEstimate": uptime.as_secs() as i64,
        "localTime": bson::DateTime::now(),
        "connections": {
            "current": current as i32,
            "available": (router.config.connections_max as u64).saturating_sub(current) as i32,
            "totalCreated": router.next_connection_id.load(Ordering::Relaxed).saturating_sub(1) as i64,
        },
        "transactions": router.txns.status(),
    }
}

/// dbStats: every shard's, under `raw` by its connection string, and their sums.
pub async fn db_stats(router: &Router, req: &Request) -> Result<Document> {
    let mut raw = Document::new();
    let (mut collections, mut views, mut objects, mut data, mut storage, mut indexes, mut index_size) = (0, 0, 0, 0, 0, 0, 0);
    for id in router.shard_ids().await? {
        let set = router.shard(&id).await?;
        let r = router.command(&set, &req.db, forwarded(req)).await?;
        collections += num(&r, "collections");
        views += num(&r, "views");
        objects += num(&r, "objects");
        data += num(&r, "dataSize");
        storage += num(&r, "storageSize");
        indexes += num(&r, "indexes");
        index_size += num(&r, "indexSize");
        raw.insert(set.conn_string.clone(), r);
    }
    let scale = req.body.get("scale").and_then(common::value::as_i64).filter(|s| *s > 0).unwrap_or(1);
    Ok(doc! {
        "raw": raw,
        "db": &req.db,
        "collections": collections,
        "views": views,
        "objects": objects,
        "avgObjSize": if objects > 0 { (data * scale) as f64 / objects as f64 } else { 0.0 },
        "dataSize": data,
        "storageSize": storage,
        "totalSize": storage + index_size,
        "indexes": indexes,
        "indexSize": index_size,
        "scaleFactor": scale,
    })
}

/// The shards holding collection `coll` of `req.db`: a sharded collection's chunk owners,
/// else the database's primary. With whether it is sharded.
async fn holders(router: &Router, req: &Request, coll: &str) -> Result<(Vec<String>, bool)> {
    let ns = format!("{}.{coll}", req.db);
    if let Some(sc) = router.sharded(&ns).await? {
        return Ok((sc.table.shards().into_iter().collect(), true));
    }
    let primary = router.db_primary(&req.db, false).await?.ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("Collection [{ns}] not found.")))?;
    Ok((vec![primary], false))
}

/// collStats: each holding shard's reply under `shards`, and their sums.
pub async fn coll_stats(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let (shards, sharded) = holders(router, req, &coll).await?;
    let mut per_shard = Document::new();
    let (mut count, mut size, mut storage, mut total_index, mut nindexes) = (0, 0, 0, 0, 0);
    let mut index_sizes = Document::new();
    for id in &shards {
        let set = router.shard(id).await?;
        let r = router.command(&set, &req.db, forwarded(req)).await?;
        count += num(&r, "count");
        size += num(&r, "size");
        storage += num(&r, "storageSize");
        total_index += num(&r, "totalIndexSize");
        nindexes = nindexes.max(num(&r, "nindexes"));
        if let Ok(sizes) = r.get_document("indexSizes") {
            for (name, v) in sizes {
                let before = index_sizes.get(name).and_then(common::value::as_i64).unwrap_or(0);
                index_sizes.insert(name.clone(), before + common::value::as_i64(v).unwrap_or(0));
            }
        }
        per_shard.insert(id.clone(), r);
    }
    let mut out = doc! {
        "sharded": sharded,
        "ns": format!("{}.{coll}", req.db),
        "count": count,
        "size": size,
        "storageSize": storage,
        "totalIndexSize": total_index,
        "totalSize": storage + total_index,
        "indexSizes": index_sizes,
        "avgObjSize": if count > 0 { size / count } else { 0 },
        "nindexes": nindexes,
    };
    if sharded {
        out.insert("nchunks", router.sharded(&format!("{}.{coll}", req.db)).await?.map_or(0, |sc| sc.table.chunks().len() as i64));
    } else if let Some(primary) = shards.first() {
        out.insert("primary", primary.clone());
    }
    out.insert("shards", per_shard);
    Ok(out)
}

/// An aggregate that starts with `$collStats`: that stage on each holding shard, each
/// document marked with its `shard` (as mongos does); the rest of the pipeline runs here.
pub async fn coll_stats_stage(router: &Router, req: &Request, stages: &[Document]) -> Result<Vec<Document>> {
    let coll = collection_of(req)?;
    let (shards, _) = holders(router, req, &coll).await?;
    let rest = router_stages(&stages[1..], "this stage cannot follow $collStats in shoal's router")?;
    let mut input = Vec::new();
    for id in &shards {
        let set = router.shard(id).await?;
        let body = doc! {"aggregate": &coll, "pipeline": [stages[0].clone()], "cursor": {}};
        let r = router.command(&set, &req.db, body).await?;
        let (_, docs) = net::peer::cursor_batch(&r, "firstBatch")?;
        for mut d in docs {
            d.insert("shard", id.clone());
            input.push(d);
        }
    }
    run_router_stages(&rest, input, false)
}

/// `{aggregate: 1, pipeline: [{$shardedDataDistribution: {}}, ...]}` on admin: the
/// distribution (`data_distribution`), the later stages run here over it.
pub async fn sharded_data_distribution(router: &Router, req: &Request, stages: &[Document], batch: usize) -> Result<Document> {
    // mongod's checks, in its order and with its codes.
    if !stages[0].get_document("$shardedDataDistribution").is_ok_and(|o| o.is_empty()) {
        return Err(Error::location(6789100, "The $shardedDataDistribution stage specification must be an empty object"));
    }
    if req.db != "admin" || !matches!(req.body.get("aggregate"), Some(Bson::Int32(1) | Bson::Int64(1) | Bson::Double(_))) {
        return Err(Error::location(6789102, "The $shardedDataDistribution stage must be run on the admin database"));
    }
    let rest = router_stages(&stages[1..], "this stage cannot follow $shardedDataDistribution in shoal's router")?;
    let out = run_router_stages(&rest, data_distribution(router).await?, false)?;
    buffered_cursor(router, req, "admin.$cmd.aggregate".to_string(), "$cmd.aggregate".to_string(), out, batch).await
}

/// For each sharded collection, each shard that owns chunks of it or holds documents of
/// it: the documents it owns (a count at the router's shard version, which counts owned
/// documents only), those it holds but does not own (orphans, such as a migration's
/// leftovers), and their sizes from the shard's average document size, as mongod
/// estimates them.
async fn data_distribution(router: &Router) -> Result<Vec<Document>> {
    let shards: Vec<String> = router.reload_shards().await?.iter().filter_map(|s| s.get_str("_id").ok().map(str::to_string)).collect();
    let mut out = Vec::new();
    for c in router.config_find("collections", doc! {}, doc! {"_id": 1}).await? {
        let Ok(ns) = c.get_str("_id") else { continue };
        if c.get_bool("dropped").unwrap_or(false) {
            continue;
        }
        let Some(sc) = router.sharded(ns).await? else { continue };
        let Some((db, coll)) = ns.split_once('.') else { continue };
        let owners = sc.table.shards();
        let mut per_shard = Vec::new();
        for shard in &shards {
            let set = router.shard(shard).await?;
            let stats = match router.command(&set, db, doc! {"collStats": coll}).await {
                Ok(s) => s,
                Err(e) if e.code == Code::NamespaceNotFound.0 => continue,
                Err(e) => return Err(e),
            };
            let (held, avg) = (num(&stats, "count"), num(&stats, "avgObjSize"));
            let owned = if owners.contains(shard) {
                num(&router.command(&set, db, doc! {"count": coll, "shardVersion": sc.version_doc(shard)}).await?, "n")
            } else {
                0
            };
            if held == 0 && !owners.contains(shard) {
                continue;
            }
            let orphaned = (held - owned).max(0);
            per_shard.push(doc! {
                "shardName": shard, "numOrphanedDocs": orphaned, "numOwnedDocuments": owned,
                "ownedSizeBytes": owned * avg, "orphanedSizeBytes": orphaned * avg,
            });
        }
        out.push(doc! {"ns": ns, "shards": per_shard});
    }
    Ok(out)
}

/// explain of a find, count, distinct or aggregate: each shard the command would target
/// explains it; their plans go under one SINGLE_SHARD or SHARD_MERGE stage, and their
/// execution statistics are summed.
pub async fn explain(router: &Router, req: &Request) -> Result<Document> {
    let inner = req.body.get_document("explain").map_err(|_| Error::location(40414, "BSON field 'explain.explain' is missing but a required field"))?.clone();
    let name = inner.keys().next().cloned().unwrap_or_default();
    let coll = match inner.get(&name) {
        Some(Bson::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(Error::new(Code::InvalidNamespace, "explain: the explained command must name a collection")),
    };
    let empty = Document::new();
    let filter = match name.as_str() {
        "find" => inner.get_document("filter").unwrap_or(&empty).clone(),
        "count" | "distinct" => inner.get_document("query").unwrap_or(&empty).clone(),
        "aggregate" => {
            let stages: Vec<Document> = inner
                .get_array("pipeline")
                .map_err(|_| Error::type_mismatch("aggregate.pipeline must be an array"))?
                .iter()
                .filter_map(|s| s.as_document().cloned())
                .collect();
            query::agg::Pipeline::parse(&stages)?.leading_match().unwrap_or_default()
        }
        // A write is explained where its first statement's filter targets.
        "update" | "delete" => {
            let key = if name == "update" { "updates" } else { "deletes" };
            let first = inner.get_array(key).ok().and_then(|a| a.first()).and_then(Bson::as_document);
            first.and_then(|s| s.get_document("q").ok()).cloned().unwrap_or_default()
        }
        "findAndModify" | "findandmodify" => inner.get_document("query").unwrap_or(&empty).clone(),
        other => return Err(Error::new(Code::CommandNotSupported, format!("explain of '{other}' is not supported by shoal's router yet"))),
    };
    let ns = format!("{}.{coll}", req.db);
    let targets: Vec<String> = match router.sharded(&ns).await? {
        Some(sc) => shard::shards_for_filter(&sc.table, &filter).into_iter().collect(),
        None => match router.db_primary(&req.db, false).await? {
            Some(p) => vec![p],
            None => return Err(Error::new(Code::NamespaceNotFound, format!("database {} not found", req.db))),
        },
    };
    let verbosity = req.body.get_str("verbosity").unwrap_or("allPlansExecution").to_string();
    let sends = targets.iter().map(|id| async move {
        let set = router.shard(id).await?;
        let r = router.pool.run(&set, &req.db, forwarded(req), None, timeout_of(req)).await?;
        net::pool::reply_result(r.1).map(|r| (id.clone(), set.conn_string.clone(), r))
    });
    let replies = futures_util::future::join_all(sends).await.into_iter().collect::<Result<Vec<_>>>()?;
    let stage = if replies.len() == 1 { "SINGLE_SHARD" } else { "SHARD_MERGE" };
    let mut planned = Vec::new();
    let mut executed = Vec::new();
    let (mut returned, mut keys, mut docs, mut millis) = (0, 0, 0, 0);
    for (id, conn_string, r) in &replies {
        let mut p = doc! {"shardName": id, "connectionString": conn_string};
        if let Ok(info) = r.get_document("serverInfo") {
            p.insert("serverInfo", info.clone());
        }
        if let Ok(qp) = r.get_document("queryPlanner") {
            p.extend(qp.clone());
        }
        planned.push(p);
        if let Ok(es) = r.get_document("executionStats") {
            returned += num(es, "nReturned");
            keys += num(es, "totalKeysExamined");
            docs += num(es, "totalDocsExamined");
            millis = millis.max(num(es, "executionTimeMillis"));
            let mut e = doc! {"shardName": id};
            e.extend(es.clone());
            executed.push(e);
        }
    }
    let mut out = doc! {"queryPlanner": {"mongosPlannerVersion": 1, "winningPlan": {"stage": stage, "shards": planned}}};
    if verbosity != "queryPlanner" {
        out.insert(
            "executionStats",
            doc! {
                "nReturned": returned, "executionTimeMillis": millis, "totalKeysExamined": keys, "totalDocsExamined": docs,
                "executionStages": {"stage": stage, "nReturned": returned, "executionTimeMillis": millis, "totalKeysExamined": keys, "totalDocsExamined": docs, "shards": executed},
            },
        );
    }
    out.insert("serverInfo", doc! {"host": net::process::hostname(), "port": router.config.port as i32, "version": common::server::VERSION});
    out.insert("command", inner);
    Ok(out)
}
