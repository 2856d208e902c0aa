//! Sharded clusters through the router: `shoal cluster up --shards N` starts config servers,
//! N single-member shard sets and a router as real processes; the official driver talks to
//! the router, and direct connections to each shard check where documents landed.

mod common;

use common::cluster::*;
use common::*;
use mongodb::bson::{doc, Bson, Document};
use std::process::Command;
use std::time::Duration;

fn bson_int(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(n) => Some(*n as i64),
        Bson::Int64(n) => Some(*n),
        Bson::Double(f) => Some(*f as i64),
        _ => None,
    }
}

fn ids(docs: &[Document]) -> Vec<i64> {
    docs.iter().map(|d| num_field(d, "customerId") as i64).collect()
}

#[tokio::test]
async fn a_hashed_collection_spreads_over_shards_and_reads_merge_back() {
    // Eight single-member shards, as #7 asks the router to be tested with.
    let cluster = Cluster::up(8);
    let client = cluster.client().await;
    let admin = client.database("admin");
    let hello = admin.run_command(doc! {"hello": 1}).await.unwrap();
    assert_eq!(hello.get_str("msg").unwrap(), "isdbgrid");
    let shards = admin.run_command(doc! {"listShards": 1}).await.unwrap();
    assert_eq!(shards.get_array("shards").unwrap().len(), 8);
    // Admin commands belong to the admin database, and elsewhere do nothing.
    assert_code(client.database("app").run_command(doc! {"listShards": 1}).await, 13);
    assert_code(client.database("app").run_command(doc! {"shardCollection": "other.c", "key": {"k": 1}}).await, 13);
    assert_eq!(client.database("config").collection::<Document>("collections").count_documents(doc! {"_id": "other.c"}).await.unwrap(), 0);

    admin.run_command(doc! {"enableSharding": "app"}).await.unwrap();
    let r = admin.run_command(doc! {"shardCollection": "app.orders", "key": {"customerId": "hashed"}}).await.unwrap();
    assert_eq!(r.get_str("collectionsharded").unwrap(), "app.orders");
    // Again with the same key: nothing to do; with another key: refused.
    admin.run_command(doc! {"shardCollection": "app.orders", "key": {"customerId": "hashed"}}).await.unwrap();
    assert_code_name(admin.run_command(doc! {"shardCollection": "app.orders", "key": {"other": 1}}).await, 23, "AlreadyInitialized");
    assert_code(admin.run_command(doc! {"shardCollection": "app.u", "key": {"h": "hashed"}, "unique": true}).await, 72);

    // An empty collection's indexes go with it to every shard.
    client.database("app").run_command(doc! {"createIndexes": "idx", "indexes": [{"key": {"v": 1, "w": -1}, "name": "v_1_w_-1"}]}).await.unwrap();
    admin.run_command(doc! {"shardCollection": "app.idx", "key": {"h": "hashed"}}).await.unwrap();
    for i in 0..cluster.shards {
        let names = cluster.shard(i).await.database("app").collection::<Document>("idx").list_index_names().await.unwrap();
        assert!(names.contains(&"v_1_w_-1".to_string()) && names.contains(&"h_hashed".to_string()), "shard {i}: {names:?}");
    }

    // Sixteen chunks (two per shard) in config.chunks, one collection entry.
    let config = client.database("config");
    let entry = config.collection::<Document>("collections").find_one(doc! {"_id": "app.orders"}).await.unwrap().unwrap();
    assert_eq!(entry.get_document("key").unwrap(), &doc! {"customerId": "hashed"});
    let chunks = collect(config.collection::<Document>("chunks").find(doc! {"uuid": entry.get("uuid").unwrap().clone()}).await.unwrap()).await;
    assert_eq!(chunks.len(), 16);

    let orders = client.database("app").collection::<Document>("orders");
    let docs: Vec<Document> = (0..3000i64).map(|i| doc! {"_id": i, "customerId": i, "v": i % 7, "text": "x".repeat(100)}).collect();
    let r = orders.insert_many(docs).ordered(false).await.unwrap();
    assert_eq!(r.inserted_ids.len(), 3000);
    // Every shard holds a share, and the shares add up.
    let mut total = 0;
    let mut held = Vec::new();
    for i in 0..cluster.shards {
        let n = cluster.shard(i).await.database("app").collection::<Document>("orders").count_documents(doc! {}).await.unwrap();
        assert!((200..600).contains(&n), "shard {i} holds {n} of 3000");
        total += n;
        held.push(n);
    }
    assert_eq!(total, 3000);
    // $shardedDataDistribution (sh.status() reads it) says the same; a document written
    // directly into a shard outside its chunks is its orphan.
    let stray = cluster.shard(0).await.database("app").collection::<Document>("orders").find_one(doc! {}).await.unwrap().unwrap();
    cluster
        .shard(3)
        .await
        .database("app")
        .collection::<Document>("orders")
        .insert_one(doc! {"_id": -1, "customerId": stray.get("customerId").unwrap().clone()})
        .await
        .unwrap();
    let dist = collect(admin.aggregate(vec![doc! {"$shardedDataDistribution": {}}, doc! {"$match": {"ns": "app.orders"}}]).await.unwrap()).await;
    assert_eq!(dist.len(), 1, "{dist:?}");
    let per_shard = dist[0].get_array("shards").unwrap();
    assert_eq!(per_shard.len(), 8);
    for s in per_shard {
        let s = s.as_document().unwrap();
        let i: usize = s.get_str("shardName").unwrap().trim_start_matches("shard").parse().unwrap();
        let orphans = if i == 3 { 1 } else { 0 };
        assert_eq!(num_field(s, "numOwnedDocuments") as u64, held[i], "{s}");
        assert_eq!(num_field(s, "numOrphanedDocs") as u64, orphans, "{s}");
        assert!(num_field(s, "ownedSizeBytes") > 100.0 * held[i] as f64, "{s}");
    }
    assert_code(client.database("app").run_command(doc! {"aggregate": 1, "pipeline": [{"$shardedDataDistribution": {}}], "cursor": {}}).await, 6789102);
    assert_code(admin.run_command(doc! {"aggregate": 1, "pipeline": [{"$shardedDataDistribution": {"x": 1}}], "cursor": {}}).await, 6789100);
    assert_code(
        cluster.shard(0).await.database("admin").run_command(doc! {"aggregate": 1, "pipeline": [{"$shardedDataDistribution": {}}], "cursor": {}}).await,
        6789101,
    );
    cluster.shard(3).await.database("app").collection::<Document>("orders").delete_one(doc! {"_id": -1}).await.unwrap();

    // The router's own state and the spread of the data, in mongos's shapes.
    let status = admin.run_command(doc! {"serverStatus": 1}).await.unwrap();
    assert_eq!(status.get_str("process").unwrap(), "mongos");
    assert!(num_field(status.get_document("connections").unwrap(), "current") >= 1.0);
    let app = client.database("app");
    let db_stats = app.run_command(doc! {"dbStats": 1}).await.unwrap();
    assert_eq!(db_stats.get_document("raw").unwrap().len(), 8, "{db_stats}");
    assert_eq!(num_field(&db_stats, "objects") as u64, 3000);
    let coll_stats = app.run_command(doc! {"collStats": "orders"}).await.unwrap();
    assert_eq!((coll_stats.get_bool("sharded").unwrap(), num_field(&coll_stats, "count") as u64, num_field(&coll_stats, "nchunks") as u64), (true, 3000, 16));
    assert_eq!(coll_stats.get_document("shards").unwrap().len(), 8);
    let per_shard = collect(orders.aggregate(vec![doc! {"$collStats": {"count": {}}}, doc! {"$sort": {"shard": 1}}]).await.unwrap()).await;
    assert_eq!(
        per_shard.iter().map(|d| (d.get_str("shard").unwrap().to_string(), num_field(d, "count") as u64)).collect::<Vec<_>>(),
        (0..8).map(|i| (format!("shard{i}"), held[i])).collect::<Vec<_>>()
    );
    let point = app.run_command(doc! {"explain": {"find": "orders", "filter": {"customerId": 7}}, "verbosity": "queryPlanner"}).await.unwrap();
    assert_eq!(path(&point, "queryPlanner.winningPlan.stage").cloned(), Some(Bson::String("SINGLE_SHARD".into())), "{point}");
    let scatter = app.run_command(doc! {"explain": {"find": "orders", "filter": {"v": 1}}, "verbosity": "executionStats"}).await.unwrap();
    assert_eq!(path(&scatter, "queryPlanner.winningPlan.stage").cloned(), Some(Bson::String("SHARD_MERGE".into())), "{scatter}");
    assert_eq!(path(&scatter, "queryPlanner.winningPlan.shards").and_then(Bson::as_array).map(Vec::len), Some(8));
    assert_eq!(path(&scatter, "executionStats.nReturned").and_then(bson_int), Some((0..3000).filter(|i| i % 7 == 1).count() as i64));

    // Point reads go to one shard; scatter-gather reads merge sort, skip and limit.
    let one = orders.find_one(doc! {"customerId": 1234}).await.unwrap().unwrap();
    assert_eq!(one.get_i64("v").unwrap(), 1234 % 7);
    let page = collect(orders.find(doc! {}).sort(doc! {"customerId": -1}).skip(10).limit(25).await.unwrap()).await;
    assert_eq!(ids(&page), (2965..=2989).rev().collect::<Vec<_>>());
    // A projection that drops the sort field still sorts across shards.
    let projected = collect(orders.find(doc! {"v": 3}).sort(doc! {"customerId": 1}).projection(doc! {"_id": 1}).limit(5).await.unwrap()).await;
    assert_eq!(projected, (0..5i64).map(|k| doc! {"_id": 3 + 7 * k}).collect::<Vec<_>>());
    // Small batches: every document once, through getMores on every shard.
    let all = collect(orders.find(doc! {"v": {"$lt": 3}}).batch_size(17).await.unwrap()).await;
    let mut got = ids(&all);
    got.sort();
    assert_eq!(got, (0..3000).filter(|i| i % 7 < 3).collect::<Vec<_>>());
    assert_eq!(orders.count_documents(doc! {"v": 6}).await.unwrap(), (0..3000).filter(|i| i % 7 == 6).count() as u64);
    let n = client.database("app").run_command(doc! {"count": "orders", "query": {"v": 1}, "skip": 5, "limit": 100}).await.unwrap();
    assert_eq!(num_field(&n, "n"), 100.0);
    let distinct = orders.distinct("v", doc! {}).await.unwrap();
    assert_eq!(distinct, (0..7).map(Bson::Int64).collect::<Vec<_>>());
    let grouped = collect(
        orders
            .aggregate(vec![doc! {"$match": {"customerId": {"$lt": 70}}}, doc! {"$group": {"_id": "$v", "n": {"$sum": 1}}}, doc! {"$sort": {"_id": 1}}])
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(grouped, (0..7).map(|v| doc! {"_id": v as i64, "n": 10}).collect::<Vec<_>>());
    // Partial groups on the shards, merged by the router: sums, counts, extremes, averages
    // (of numbers only), in the client's field order.
    let grouped = collect(orders.aggregate(vec![
        doc! {"$group": {"_id": "$v", "total": {"$sum": "$customerId"}, "n": {"$count": {}}, "lo": {"$min": "$customerId"}, "avg": {"$avg": "$customerId"}, "hi": {"$max": "$customerId"}, "none": {"$avg": "$text"}}},
        doc! {"$sort": {"_id": 1}},
    ]).await.unwrap()).await;
    assert_eq!(grouped.len(), 7);
    for (v, g) in grouped.iter().enumerate() {
        let ks: Vec<i64> = (0..3000).filter(|i| i % 7 == v as i64).collect();
        let total: i64 = ks.iter().sum();
        assert_eq!(g.keys().collect::<Vec<_>>(), vec!["_id", "total", "n", "lo", "avg", "hi", "none"]);
        assert_eq!(num_field(g, "total") as i64, total);
        assert_eq!(num_field(g, "n") as usize, ks.len());
        assert_eq!((num_field(g, "lo") as i64, num_field(g, "hi") as i64), (ks[0], *ks.last().unwrap()));
        assert!((num_field(g, "avg") - total as f64 / ks.len() as f64).abs() < 1e-9);
        assert_eq!(g.get("none"), Some(&Bson::Null), "$avg of no numbers is null");
    }

    // Writes: by shard key to one shard, multi to all, by _id to all; a single write that
    // names neither is refused as mongos refuses it.
    let r = orders.update_one(doc! {"customerId": 42}, doc! {"$set": {"seen": true}}).await.unwrap();
    assert_eq!(r.modified_count, 1);
    let r = orders.update_one(doc! {"_id": 43}, doc! {"$set": {"seen": true}}).await.unwrap();
    assert_eq!(r.modified_count, 1);
    let r = orders.update_many(doc! {"v": 5}, doc! {"$inc": {"hits": 1}}).await.unwrap();
    assert_eq!(r.modified_count, (0..3000).filter(|i| i % 7 == 5).count() as u64);
    assert_code(orders.update_one(doc! {"v": 5}, doc! {"$set": {"x": 1}}).await, 61);
    assert_code(orders.update_one(doc! {"customerId": 7}, doc! {"$set": {"customerId": 8}}).await, 66);
    let r = orders.update_one(doc! {"customerId": 5000}, doc! {"$set": {"v": 9}}).upsert(true).await.unwrap();
    assert!(r.upserted_id.is_some());
    assert_code(orders.update_one(doc! {"v": 10}, doc! {"$set": {"x": 1}}).upsert(true).await, 61);
    assert_code(orders.delete_one(doc! {"v": 4}).await, 61);
    assert_eq!(orders.delete_one(doc! {"customerId": 4}).await.unwrap().deleted_count, 1);
    assert_eq!(orders.delete_many(doc! {"v": 2}).await.unwrap().deleted_count, (0..3000).filter(|i| i % 7 == 2).count() as u64);
    assert_eq!(orders.count_documents(doc! {}).await.unwrap(), 3000 + 1 - 1 - (0..3000).filter(|i| i % 7 == 2).count() as u64);

    // Errors come back at the client's positions: duplicate _ids land on the shard that
    // already holds them, whatever shard the rest of the batch goes to.
    let batch: Vec<Document> = vec![
        doc! {"_id": 10_001, "customerId": 10_001},
        doc! {"_id": 1, "customerId": 1},
        doc! {"_id": 10_002, "customerId": 10_002},
        doc! {"_id": 3, "customerId": 3},
    ];
    let e = orders.insert_many(batch).ordered(false).await.unwrap_err();
    let mongodb::error::ErrorKind::InsertMany(failure) = *e.kind else { panic!("{e:?}") };
    let mut failed: Vec<usize> = failure.write_errors.unwrap().iter().map(|w| w.index).collect();
    failed.sort();
    assert_eq!(failed, vec![1, 3]);
    assert_eq!(orders.count_documents(doc! {"_id": {"$in": [10_001, 10_002]}}).await.unwrap(), 2);

    // The same through documents in the command's body, without _id (the router adds one,
    // so every shard stores the document it routed).
    let r = client.database("app").run_command(doc! {"insert": "orders", "documents": [{"customerId": 20_001}, {"customerId": 20_002}]}).await.unwrap();
    assert_eq!(num_field(&r, "n"), 2.0);
    let added = collect(orders.find(doc! {"customerId": {"$in": [20_001, 20_002]}}).await.unwrap()).await;
    assert_eq!(added.len(), 2);
    assert!(added.iter().all(|d| d.get_object_id("_id").is_ok()));

    // An unsharded collection lives on its database's primary shard.
    let plain = client.database("app").collection::<Document>("plain");
    plain.insert_many((0..10).map(|i| doc! {"_id": i})).await.unwrap();
    let primary = client.database("config").collection::<Document>("databases").find_one(doc! {"_id": "app"}).await.unwrap().unwrap();
    let primary = primary.get_str("primary").unwrap();
    let at: usize = primary.trim_start_matches("shard").parse().unwrap();
    assert_eq!(cluster.shard(at).await.database("app").collection::<Document>("plain").count_documents(doc! {}).await.unwrap(), 10);
    assert_eq!(plain.count_documents(doc! {}).await.unwrap(), 10);
    let names = client.database("app").list_collection_names().await.unwrap();
    assert!(names.contains(&"plain".to_string()) && names.contains(&"orders".to_string()), "{names:?}");

    // An open cursor can be killed; a getMore then finds nothing.
    let reply = client.database("app").run_command(doc! {"find": "orders", "batchSize": 2}).await.unwrap();
    let id = reply.get_document("cursor").unwrap().get_i64("id").unwrap();
    assert_ne!(id, 0);
    let killed = client.database("app").run_command(doc! {"killCursors": "orders", "cursors": [id]}).await.unwrap();
    assert_eq!(killed.get_array("cursorsKilled").unwrap(), &vec![Bson::Int64(id)]);
    assert_code(client.database("app").run_command(doc! {"getMore": id, "collection": "orders"}).await, 43);

    // Unknown commands are absent, as on mongos.
    assert_code(admin.run_command(doc! {"noSuchCommand": 1}).await, 59);
}

#[tokio::test]
async fn a_restarted_router_reads_the_cluster_from_the_config_servers() {
    let cluster = Cluster::up(2);
    let client = cluster.client().await;
    client.database("admin").run_command(doc! {"shardCollection": "app.c", "key": {"k": "hashed"}}).await.unwrap();
    let c = client.database("app").collection::<Document>("c");
    c.insert_many((0..200).map(|i| doc! {"_id": i, "k": i})).await.unwrap();
    drop(client);

    // kill -9 the router and start another on the same port with the same config servers.
    let pid = cluster.router_pid();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let configdb = format!("cfg/127.0.0.1:{}", cluster.port + 1);
    let log = std::fs::File::create(cluster.dir.join("router2.log")).unwrap();
    let mut router = Command::new(binary_path()).args(["router", "--configdb", &configdb, "--port", &cluster.port.to_string()]).stderr(log).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", cluster.port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "the new router did not listen");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let client = cluster.client().await;
    let c = client.database("app").collection::<Document>("c");
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 200);
    // Its routing table is the config servers': a point write lands on the owning shard.
    c.insert_one(doc! {"_id": 1000, "k": 1000}).await.unwrap();
    let mut holders = 0;
    for i in 0..2 {
        holders += cluster.shard(i).await.database("app").collection::<Document>("c").count_documents(doc! {"_id": 1000}).await.unwrap();
    }
    assert_eq!(holders, 1);
    assert_eq!(c.find_one(doc! {"k": 1000}).await.unwrap().unwrap().get_i32("_id").unwrap(), 1000);
    let _ = router.kill();
    let _ = router.wait();
}

#[tokio::test]
async fn writes_through_the_router_go_on_after_a_shard_fails_over() {
    let cluster = Cluster::up_with(1, 3);
    let client = cluster.client().await;
    client.database("admin").run_command(doc! {"shardCollection": "app.f", "key": {"k": "hashed"}}).await.unwrap();
    let f = client.database("app").collection::<Document>("f");
    let mut acked: Vec<i64> = Vec::new();
    for i in 0..50i64 {
        f.insert_one(doc! {"_id": i, "k": i}).await.unwrap();
        acked.push(i);
    }
    // kill -9 the shard's primary.
    let member = cluster.shard(0).await;
    let hello = member.database("admin").run_command(doc! {"hello": 1}).await.unwrap();
    let primary = hello.get_str("primary").unwrap().to_string();
    unsafe { libc::kill(cluster.pid_of(&primary), libc::SIGKILL) };
    // Writes fail while the set elects (the driver retries each once), then go on: the
    // router finds the new primary by itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let mut i = 50i64;
    let mut after = 0;
    while after < 30 {
        assert!(std::time::Instant::now() < deadline, "no write succeeded through the router after the failover ({after} did)");
        match f.insert_one(doc! {"_id": i, "k": i}).await {
            Ok(_) => {
                acked.push(i);
                after += 1;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
        i += 1;
    }
    // Every acknowledged (majority) write survived the failover.
    let found: Vec<i64> = collect(f.find(doc! {}).await.unwrap()).await.iter().map(|d| d.get_i64("_id").unwrap()).collect();
    for id in &acked {
        assert!(found.contains(id), "acknowledged write {id} is missing after the failover");
    }
}

/// Chunks migrate while clients insert, update and delete through two routers, one of
/// which learns of each migration only from the shards (StaleConfig). Afterwards every
/// acknowledged write is there exactly once: the count, each document's counter and the
/// checksum agree with what the writers were told, and no shard holds a copy of a document
/// outside its chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chunks_migrate_under_concurrent_writes_without_losing_or_doubling_documents() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const DOCS: i64 = 2_000;
    let cluster = Cluster::up(2);
    let client = cluster.client().await;
    let admin = client.database("admin");
    admin.run_command(doc! {"shardCollection": "app.m", "key": {"k": "hashed"}}).await.unwrap();
    // The moves here are the test's own: every router's balancer stays out of them.
    admin.run_command(doc! {"balancerStop": 1}).await.unwrap();
    let m = client.database("app").collection::<Document>("m");
    m.insert_many((0..DOCS).map(|i| doc! {"_id": i, "k": i, "n": 0i64, "pad": "x".repeat(200)})).await.unwrap();
    let (_other, other_port) = second_router(&cluster);
    let other_client = mongodb::Client::with_uri_str(format!("mongodb://127.0.0.1:{other_port}/")).await.unwrap();
    // The second router reads the routing table now, and keeps it until a shard says it is stale.
    assert_eq!(other_client.database("app").collection::<Document>("m").count_documents(doc! {}).await.unwrap(), DOCS as u64);

    // Writers: router 0 and router 1 each increment their own documents' counters, insert
    // new documents and delete some; each records what was acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for (w, c) in [client.clone(), other_client.clone()].into_iter().enumerate() {
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let coll = c.database("app").collection::<Document>("m");
            let mut incs: std::collections::BTreeMap<i64, i64> = Default::default();
            let (mut inserted, mut deleted) = (Vec::new(), Vec::new());
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                // Documents with k % 2 == w are this writer's, so counts are exact.
                let k = (i * 7919 % (DOCS / 2)) * 2 + w as i64;
                if i % 50 == 49 && !deleted.contains(&k) {
                    let r = coll.delete_one(doc! {"k": k}).await.unwrap_or_else(|e| panic!("writer {w}: delete of {k} failed: {e}"));
                    assert_eq!(r.deleted_count, 1, "writer {w}: {k} was there to delete");
                    deleted.push(k);
                } else if !deleted.contains(&k) {
                    let r =
                        coll.update_one(doc! {"k": k}, doc! {"$inc": {"n": 1i64}}).await.unwrap_or_else(|e| panic!("writer {w}: update of {k} failed: {e}"));
                    assert_eq!(r.modified_count, 1, "writer {w}: the update of {k} found its document");
                    *incs.entry(k).or_default() += 1;
                }
                let new_k = DOCS + i * 2 + w as i64;
                coll.insert_one(doc! {"_id": new_k, "k": new_k, "n": 0i64}).await.unwrap_or_else(|e| panic!("writer {w}: insert of {new_k} failed: {e}"));
                inserted.push(new_k);
                i += 1;
            }
            (incs, inserted, deleted)
        }));
    }

    // Migrations through router 0: every chunk moves to the other shard, then half move back.
    let chunks_of = || async {
        let chunks: Vec<Document> =
            collect(client.database("config").collection::<Document>("chunks").find(doc! {}).sort(doc! {"min": 1}).await.unwrap()).await;
        chunks
    };
    let initial = chunks_of().await;
    assert_eq!(initial.len(), 4, "two chunks per shard to start with");
    let mut moves = 0;
    for round in 0..2 {
        for (j, c) in chunks_of().await.iter().enumerate() {
            if round == 1 && j % 2 == 0 {
                continue;
            }
            let to = if c.get_str("shard").unwrap() == "shard0" { "shard1" } else { "shard0" };
            let r = admin
                .run_command(doc! {"moveChunk": "app.m", "bounds": [c.get_document("min").unwrap().clone(), c.get_document("max").unwrap().clone()], "to": to})
                .await;
            r.unwrap_or_else(|e| panic!("moveChunk {j} in round {round} failed: {e}"));
            moves += 1;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    assert_eq!(moves, 6);
    stop.store(true, Ordering::Relaxed);
    let mut expected: std::collections::BTreeMap<i64, i64> = (0..DOCS).map(|k| (k, 0)).collect();
    let mut writes = 0;
    for w in writers {
        let (incs, inserted, deleted) = w.await.unwrap();
        writes += incs.values().sum::<i64>() + inserted.len() as i64 + deleted.len() as i64;
        for (k, n) in incs {
            *expected.get_mut(&k).unwrap() += n;
        }
        for k in inserted {
            expected.insert(k, 0);
        }
        for k in deleted {
            expected.remove(&k);
        }
    }
    assert!(writes > 200, "the writers ran during the migrations ({writes} writes)");

    // Each shard's chunks changed: 4 chunks, with new major versions on the movers.
    let after = chunks_of().await;
    assert_eq!(after.len(), 4);
    assert_ne!(
        after.iter().map(|c| c.get_str("shard").unwrap().to_string()).collect::<Vec<_>>(),
        initial.iter().map(|c| c.get_str("shard").unwrap().to_string()).collect::<Vec<_>>()
    );
    assert!(client.database("config").collection::<Document>("migrations").count_documents(doc! {}).await.unwrap() == 0, "no migration record is left");

    // Through both routers: the exact documents and counters.
    for c in [&client, &other_client] {
        let coll = c.database("app").collection::<Document>("m");
        assert_eq!(coll.count_documents(doc! {}).await.unwrap(), expected.len() as u64);
        let found: std::collections::BTreeMap<i64, i64> = collect(coll.find(doc! {}).projection(doc! {"k": 1, "n": 1}).await.unwrap())
            .await
            .iter()
            .map(|d| (num_field(d, "k") as i64, num_field(d, "n") as i64))
            .collect();
        assert_eq!(found.len(), expected.len(), "no document is returned twice");
        for (k, n) in &expected {
            assert_eq!(found.get(k), Some(n), "document {k}: its counter after every acknowledged $inc");
        }
        let sum = collect(coll.aggregate(vec![doc! {"$group": {"_id": null, "n": {"$sum": "$n"}, "k": {"$sum": "$k"}}}]).await.unwrap()).await;
        assert_eq!(num_field(&sum[0], "n") as i64, expected.values().sum::<i64>(), "checksum of counters");
        assert_eq!(num_field(&sum[0], "k") as i64, expected.keys().sum::<i64>(), "checksum of keys");
    }
    // Directly on the shards: the donors deleted their copies, so every document is on one
    // shard only.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..2 {
        for d in collect(cluster.shard(i).await.database("app").collection::<Document>("m").find(doc! {}).projection(doc! {"k": 1}).await.unwrap()).await {
            assert!(seen.insert(num_field(&d, "k") as i64), "document {} is on both shards", num_field(&d, "k"));
        }
    }
    assert_eq!(seen.len(), expected.len());

    // Errors as mongos gives them.
    let c0 = &after[0];
    let bounds = vec![Bson::Document(c0.get_document("min").unwrap().clone()), Bson::Document(c0.get_document("max").unwrap().clone())];
    assert_code(admin.run_command(doc! {"moveChunk": "app.m", "bounds": bounds.clone(), "to": "nosuchshard"}).await, 70);
    assert_code(client.database("app").run_command(doc! {"moveChunk": "app.m", "bounds": bounds, "to": "shard0"}).await, 13);
    assert_code(admin.run_command(doc! {"moveChunk": "app.unsharded", "find": {"k": 1}, "to": "shard0"}).await, 118);

    // movePrimary while the other router, which knows the old primary, keeps inserting into
    // an unsharded collection: the old primary holds its writes through the copy and then
    // answers StaleDbVersion, and the router finds the new primary.
    let plain = client.database("app").collection::<Document>("plain");
    plain.insert_many((0..500i64).map(|i| doc! {"_id": i, "v": i})).await.unwrap();
    plain.create_index(mongodb::IndexModel::builder().keys(doc! {"v": -1}).build()).await.unwrap();
    let stale_plain = other_client.database("app").collection::<Document>("plain");
    assert_eq!(stale_plain.count_documents(doc! {}).await.unwrap(), 500);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, stale_plain) = (stop.clone(), stale_plain.clone());
        tokio::spawn(async move {
            let mut i = 500i64;
            while !stop.load(Ordering::Relaxed) {
                stale_plain.insert_one(doc! {"_id": i, "v": i}).await.unwrap_or_else(|e| panic!("insert {i} during movePrimary failed: {e}"));
                i += 1;
            }
            i - 500
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let primary = collect(client.database("config").collection::<Document>("databases").find(doc! {"_id": "app"}).await.unwrap()).await[0]
        .get_str("primary")
        .unwrap()
        .to_string();
    let (from, to) = if primary == "shard0" { (0, 1) } else { (1, 0) };
    let moved = admin.run_command(doc! {"movePrimary": "app", "to": format!("shard{to}")}).await.unwrap();
    assert!(moved.get_str("primary").unwrap().starts_with(&format!("shard{to}:")), "{moved}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let inserted = writer.await.unwrap();
    assert!(inserted > 10, "the writer ran across the move ({inserted} inserts)");
    for c in [&plain, &stale_plain] {
        assert_eq!(c.count_documents(doc! {}).await.unwrap(), 500 + inserted as u64);
    }
    let new_home = cluster.shard(to).await.database("app").collection::<Document>("plain");
    assert_eq!(new_home.count_documents(doc! {}).await.unwrap(), 500 + inserted as u64, "every document on the new primary");
    let names: Vec<String> = new_home.list_index_names().await.unwrap();
    assert!(names.contains(&"v_-1".to_string()), "{names:?}");
    let old_home = cluster.shard(from).await.database("app").list_collection_names().await.unwrap();
    assert!(!old_home.contains(&"plain".to_string()), "the old primary dropped its copy: {old_home:?}");
    // The sharded collection did not move with the database.
    assert_eq!(m.count_documents(doc! {}).await.unwrap(), expected.len() as u64);
}

/// Start a one-member replica set `name` outside the cluster (a shard to add later).
async fn start_shard_set(cluster: &Cluster, name: &str) -> (Proc, String) {
    start_shard_set_with(cluster, name, &[]).await
}

async fn start_shard_set_with(cluster: &Cluster, name: &str, extra: &[&str]) -> (Proc, String) {
    let port = free_port();
    let host = format!("127.0.0.1:{port}");
    let data = cluster.dir.join(name);
    std::fs::create_dir_all(&data).unwrap();
    let log = std::fs::File::create(cluster.dir.join(format!("{name}.log"))).unwrap();
    let child = Proc(
        Command::new(binary_path())
            .args(["serve", "--port", &port.to_string(), "--replSet", name, "--dbpath", data.to_str().unwrap()])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(&host).is_err() {
        assert!(std::time::Instant::now() < deadline, "{name} did not listen");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let member = mongodb::Client::with_uri_str(format!("mongodb://{host}/?directConnection=true")).await.unwrap();
    member.database("admin").run_command(doc! {"replSetInitiate": {"_id": name, "version": 1, "members": [{"_id": 0, "host": &host}]}}).await.unwrap();
    while !member.database("admin").run_command(doc! {"hello": 1}).await.unwrap().get_bool("isWritablePrimary").unwrap_or(false) {
        assert!(std::time::Instant::now() < deadline, "{name} elected no primary");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    (child, format!("{name}/{host}"))
}

async fn chunk_counts(client: &mongodb::Client) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for c in collect(client.database("config").collection::<Document>("chunks").find(doc! {}).await.unwrap()).await {
        *counts.entry(c.get_str("shard").unwrap().to_string()).or_default() += 1;
    }
    counts
}

/// A shard added while clients write gets chunks from the balancer; removed again, it is
/// drained; split cuts a chunk in two. Every acknowledged insert is there once at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_balancer_fills_an_added_shard_and_drains_a_removed_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cluster = Cluster::up(2);
    let client = cluster.client().await;
    let admin = client.database("admin");
    admin.run_command(doc! {"shardCollection": "app.e", "key": {"k": "hashed"}, "numInitialChunks": 8}).await.unwrap();
    let e = client.database("app").collection::<Document>("e");
    e.insert_many((0..1000i64).map(|i| doc! {"_id": i, "k": i})).await.unwrap();
    let status = admin.run_command(doc! {"balancerStatus": 1}).await.unwrap();
    assert_eq!(status.get_str("mode").unwrap(), "full");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, e) = (stop.clone(), e.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut i = 1000i64;
            while !stop.load(Ordering::Relaxed) {
                e.insert_one(doc! {"_id": i, "k": i}).await.unwrap_or_else(|err| panic!("insert {i} failed: {err}"));
                acked.push(i);
                i += 1;
            }
            acked
        })
    };

    // Add a shard: the balancer moves chunks to it until no shard has two more than another.
    let (_extra, conn) = start_shard_set(&cluster, "shardx").await;
    admin.run_command(doc! {"addShard": &conn}).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let counts = chunk_counts(&client).await;
        let (lo, hi) = (counts.values().min().copied().unwrap_or(0), counts.values().max().copied().unwrap_or(0));
        if counts.len() == 3 && hi - lo < 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the balancer did not even out the chunks: {counts:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let on_extra = mongodb::Client::with_uri_str(format!("mongodb://{}/?directConnection=true", conn.split_once('/').unwrap().1)).await.unwrap();
    assert!(on_extra.database("app").collection::<Document>("e").count_documents(doc! {}).await.unwrap() > 0, "the added shard holds documents");
    assert!(admin.run_command(doc! {"balancerStatus": 1}).await.unwrap().get_i64("numBalancerRounds").unwrap() >= 1);

    // Remove it: draining starts, goes on, completes.
    let started = admin.run_command(doc! {"removeShard": "shardx"}).await.unwrap();
    assert_eq!(started.get_str("state").unwrap(), "started");
    loop {
        let r = admin.run_command(doc! {"removeShard": "shardx"}).await.unwrap();
        if r.get_str("state").unwrap() == "completed" {
            break;
        }
        assert_eq!(r.get_str("state").unwrap(), "ongoing");
        assert!(std::time::Instant::now() < deadline, "shardx did not drain: {r}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(!chunk_counts(&client).await.contains_key("shardx"));
    let listed = admin.run_command(doc! {"listShards": 1}).await.unwrap();
    assert_eq!(listed.get_array("shards").unwrap().len(), 2);
    assert_eq!(on_extra.database("app").collection::<Document>("e").count_documents(doc! {}).await.unwrap(), 0, "the drained shard deleted its copies");

    // Split a chunk at a hash value inside it.
    let before: usize = chunk_counts(&client).await.values().sum();
    let first = collect(client.database("config").collection::<Document>("chunks").find(doc! {}).sort(doc! {"min": 1}).await.unwrap()).await;
    let c = &first[1];
    admin.run_command(doc! {"split": "app.e", "bounds": [c.get_document("min").unwrap().clone(), c.get_document("max").unwrap().clone()]}).await.unwrap();
    assert_eq!(chunk_counts(&client).await.values().sum::<usize>(), before + 1);

    // A migration whose router died long ago (its record left in config.migrations): the
    // balancer fences it (the chunk's version moves, so its commit can never land) and
    // removes the record; the chunk stays where it was.
    let chunks = client.database("config").collection::<Document>("chunks");
    let victim = collect(chunks.find(doc! {}).sort(doc! {"min": 1}).await.unwrap()).await.remove(0);
    let lastmod = victim.get_timestamp("lastmod").unwrap();
    let owner = victim.get_str("shard").unwrap().to_string();
    let ten_minutes_ago = mongodb::bson::DateTime::from_millis(mongodb::bson::DateTime::now().timestamp_millis() - 600_000);
    client.database("config").collection::<Document>("migrations").insert_one(doc! {
        "_id": "app.e", "migrationId": mongodb::bson::oid::ObjectId::new(), "uuid": victim.get("uuid").unwrap().clone(), "donor": &owner,
        "recipient": if owner == "shard0" { "shard1" } else { "shard0" }, "min": victim.get_document("min").unwrap().clone(), "max": victim.get_document("max").unwrap().clone(),
        "chunkLastmod": lastmod, "inCriticalSection": true, "started": ten_minutes_ago,
    }).await.unwrap();
    admin.run_command(doc! {"balancerStart": 1}).await.unwrap();
    while client.database("config").collection::<Document>("migrations").count_documents(doc! {}).await.unwrap() > 0 {
        assert!(std::time::Instant::now() < deadline + std::time::Duration::from_secs(30), "the abandoned migration was not recovered");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let after = chunks.find_one(doc! {"uuid": victim.get("uuid").unwrap().clone(), "min": victim.get_document("min").unwrap().clone()}).await.unwrap().unwrap();
    assert_eq!(after.get_str("shard").unwrap(), owner);
    let fenced = after.get_timestamp("lastmod").unwrap();
    assert_eq!((fenced.time, fenced.increment), (lastmod.time, lastmod.increment + 1), "the fence bumped the chunk's minor version");

    admin.run_command(doc! {"balancerStop": 1}).await.unwrap();
    assert_eq!(admin.run_command(doc! {"balancerStatus": 1}).await.unwrap().get_str("mode").unwrap(), "off");
    stop.store(true, Ordering::Relaxed);
    let acked = writer.await.unwrap();
    assert!(acked.len() > 50, "the writer ran during the balancing ({} inserts)", acked.len());
    let total = 1000 + acked.len() as u64;
    assert_eq!(e.count_documents(doc! {}).await.unwrap(), total);
    let mut direct = 0;
    for i in 0..2 {
        direct += cluster.shard(i).await.database("app").collection::<Document>("e").count_documents(doc! {}).await.unwrap();
    }
    assert_eq!(direct, total, "each document on one shard only");
    // Errors as mongos gives them.
    assert_code(admin.run_command(doc! {"removeShard": "nosuchshard"}).await, 70);
    assert_code(admin.run_command(doc! {"movePrimary": "app", "to": "nosuchshard"}).await, 70);
    assert_code(admin.run_command(doc! {"movePrimary": "config", "to": "shard0"}).await, 72);
}

/// A retryable write's history moves with its chunk: a client whose write ran on the donor
/// (its reply lost) retries once the chunk has moved, and the recipient finds the statement
/// executed instead of running it again. Raw commands with a session and txnNumber, sent
/// twice, are what a driver sends when it retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_write_finds_its_first_attempt_after_the_chunk_moved() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cluster = Cluster::up(2);
    let client = cluster.client().await;
    let admin = client.database("admin");
    admin.run_command(doc! {"shardCollection": "app.r", "key": {"k": 1}}).await.unwrap();
    admin.run_command(doc! {"balancerStop": 1}).await.unwrap();
    admin.run_command(doc! {"split": "app.r", "middle": {"k": 0}}).await.unwrap();
    let owner = || async {
        let c = client.database("config").collection::<Document>("chunks").find_one(doc! {"min": {"k": 0}}).await.unwrap().unwrap();
        c.get_str("shard").unwrap().to_string()
    };
    let donor = owner().await;
    let recipient = if donor == "shard0" { "shard1" } else { "shard0" }.to_string();
    let lsid = |n: u32| {
        let mut bytes = vec![0xab; 16];
        bytes[..4].copy_from_slice(&n.to_be_bytes());
        doc! {"id": Bson::Binary(mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Uuid, bytes })}
    };
    let mut s = wire::connect(cluster.port);
    let mut request_id = 0;
    let mut send = |body: &Document| {
        request_id += 1;
        wire::command(&mut s, request_id, body).doc
    };
    // First attempts, on the donor (k >= 0) and on the shard that keeps k < 0.
    let insert = doc! {"insert": "r", "documents": [{"_id": -1, "k": -1, "n": 0}, {"_id": 1, "k": 1, "n": 0}, {"_id": 2, "k": 2, "n": 0}, {"_id": 3, "k": 3, "n": 0}], "lsid": lsid(1), "txnNumber": 1i64, "$db": "app"};
    let update = doc! {"update": "r", "updates": [{"q": {"k": 1}, "u": {"$inc": {"n": 1}}}], "lsid": lsid(2), "txnNumber": 1i64, "$db": "app"};
    let fam = doc! {"findAndModify": "r", "query": {"k": 2}, "update": {"$inc": {"n": 1}}, "new": true, "lsid": lsid(3), "txnNumber": 1i64, "$db": "app"};
    let delete = doc! {"delete": "r", "deletes": [{"q": {"k": 3}, "limit": 1}], "lsid": lsid(4), "txnNumber": 1i64, "$db": "app"};
    let upsert = doc! {"update": "r", "updates": [{"q": {"k": 4}, "u": {"$inc": {"n": 1}}, "upsert": true}], "lsid": lsid(5), "txnNumber": 1i64, "$db": "app"};
    let first: Vec<Document> = [&insert, &update, &fam, &delete, &upsert].into_iter().map(&mut send).collect();
    for r in &first {
        assert_eq!(r.get_f64("ok").ok(), Some(1.0), "{r}");
        assert!(r.get("writeErrors").is_none(), "{r}");
    }
    assert_eq!(first[0].get_i32("n").ok(), Some(4));
    // An upsert must fix the whole shard key, even while every chunk is on one shard.
    let keyless_upsert = send(&doc! {"update": "r", "updates": [{"q": {"n": 99}, "u": {"$set": {"x": 1}}, "upsert": true}], "$db": "app"});
    let code = keyless_upsert.get_array("writeErrors").ok().and_then(|e| e.first()).and_then(Bson::as_document).and_then(|e| e.get_str("codeName").ok());
    assert_eq!(code, Some("ShardKeyNotFound"), "{keyless_upsert}");
    // findAndModify goes to the one shard its shard key names; without one, mongod's error.
    let keyless = send(&doc! {"findAndModify": "r", "query": {"n": 0}, "update": {"$set": {"x": 1}}, "$db": "app"});
    assert_eq!(keyless.get_str("codeName").ok(), Some("ShardKeyNotFound"), "{keyless}");
    let unsharded = send(&doc! {"findAndModify": "plain", "query": {"_id": 1}, "update": {"$inc": {"n": 1}}, "upsert": true, "new": true, "$db": "app"});
    assert_eq!(path(&unsharded, "value.n").cloned(), Some(Bson::Int32(1)), "{unsharded}");
    assert_eq!(path(&first[2], "value.n").cloned(), Some(Bson::Int32(1)), "{}", first[2]);

    // A writer with a new session per write keeps going while the chunk moves: its writes
    // reach the recipient's history by the catch-up (transferMods), the ones above by the
    // clone's pass over config.transactions.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let port = cluster.port;
        std::thread::spawn(move || {
            let mut s = wire::connect(port);
            let mut acked = Vec::new();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) || acked.len() < 20 {
                let body = doc! {"update": "r", "updates": [{"q": {"k": 1}, "u": {"$inc": {"n": 1}}}], "lsid": lsid(1000 + i), "txnNumber": 1i64, "$db": "app"};
                let r = wire::command(&mut s, i as i32 + 1, &body).doc;
                assert_eq!(r.get_i32("nModified").ok(), Some(1), "writer's update {i}: {r}");
                acked.push(body);
                i += 1;
            }
            acked
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    admin.run_command(doc! {"moveChunk": "app.r", "find": {"k": 1}, "to": &recipient}).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let acked = writer.join().unwrap();
    assert_eq!(owner().await, recipient);

    // The retries: each answers as its first attempt did, and changes nothing.
    let r = send(&insert);
    assert_eq!((r.get_i32("n").ok(), r.get("writeErrors")), (Some(4), None), "the retried insert: {r}");
    let r = send(&update);
    assert_eq!((r.get_i32("n").ok(), r.get_i32("nModified").ok()), (Some(1), Some(1)), "the retried update: {r}");
    let r = send(&fam);
    assert_eq!(path(&r, "value.n").cloned(), Some(Bson::Int32(1)), "the retried findAndModify returns the document as its first attempt left it: {r}");
    assert_eq!(path(&r, "lastErrorObject.updatedExisting").cloned(), Some(Bson::Boolean(true)), "{r}");
    let r = send(&delete);
    assert_eq!(r.get_i32("n").ok(), Some(1), "the retried delete: {r}");
    let r = send(&upsert);
    let upserted = r.get_array("upserted").ok().and_then(|u| u.first()).and_then(Bson::as_document).and_then(|u| u.get_i32("index").ok());
    assert_eq!((r.get_i32("n").ok(), upserted), (Some(1), Some(0)), "the retried upsert reports its upsert: {r}");
    for (i, body) in acked.iter().enumerate() {
        let r = send(body);
        assert_eq!((r.get_i32("n").ok(), r.get_i32("nModified").ok()), (Some(1), Some(1)), "the writer's retried update {i}: {r}");
    }
    let coll = client.database("app").collection::<Document>("r");
    let docs = collect(coll.find(doc! {}).sort(doc! {"k": 1}).await.unwrap()).await;
    let n_of = |k: i32| docs.iter().find(|d| d.get_i32("k").ok() == Some(k)).map(|d| num_field(d, "n") as usize);
    assert_eq!(docs.len(), 4, "-1, 1, 2 and the upserted 4; 3 deleted once: {docs:?}");
    assert_eq!(n_of(1), Some(1 + acked.len()), "each update of k: 1 applied once");
    assert_eq!((n_of(2), n_of(4)), (Some(1), Some(1)));

    // The recipient logged the donor's entries in the sessions, as mongod does.
    let recipient_i = recipient.trim_start_matches("shard").parse::<usize>().unwrap();
    let direct = cluster.shard(recipient_i).await;
    let migrated = direct
        .database("local")
        .collection::<Document>("oplog.rs")
        .count_documents(doc! {"op": "n", "ns": "app.r", "o.$sessionMigrateInfo": 1, "fromMigrate": true})
        .await
        .unwrap();
    assert!(migrated >= 6 + acked.len() as u64 / 2, "{migrated} migrated session entries");
    let records = direct.database("config").collection::<Document>("transactions").count_documents(doc! {}).await.unwrap();
    assert!(records >= 5, "{records} session records on the recipient");

    // A newer transaction on a migrated session runs; the older one is then too old, on
    // the recipient as it was on the donor.
    let next = doc! {"update": "r", "updates": [{"q": {"k": 1}, "u": {"$inc": {"n": 1}}}], "lsid": lsid(2), "txnNumber": 2i64, "$db": "app"};
    assert_eq!(send(&next).get_i32("nModified").ok(), Some(1));
    let old = send(&update);
    let code =
        old.get_array("writeErrors").ok().and_then(|e| e.first()).and_then(Bson::as_document).map_or(old.get_i32("code").ok(), |e| e.get_i32("code").ok());
    assert_eq!(code, Some(225), "TransactionTooOld: {old}");

    // Back to the first shard: the history moves again (the recipient's migrated entries
    // stand for the donor's), and the retry of transaction 2 still runs nothing.
    admin.run_command(doc! {"moveChunk": "app.r", "find": {"k": 1}, "to": &donor}).await.unwrap();
    let r = send(&next);
    assert_eq!(r.get_i32("nModified").ok(), Some(1), "{r}");
    let r = send(&insert);
    assert_eq!((r.get_i32("n").ok(), r.get("writeErrors")), (Some(4), None), "the insert retried after two moves: {r}");
    let k1 = coll.find_one(doc! {"k": 1}).await.unwrap().unwrap();
    assert_eq!(num_field(&k1, "n") as usize, 2 + acked.len());

    // Large documents migrate too: a clone batch just under its 4 MiB, then a 13 MiB
    // document, which must start the next batch (together they would pass the 16 MiB a
    // reply may hold).
    admin.run_command(doc! {"shardCollection": "app.big", "key": {"k": 1}}).await.unwrap();
    let big = client.database("app").collection::<Document>("big");
    for k in 0..39 {
        big.insert_one(doc! {"_id": k, "k": k, "pad": "s".repeat(100 * 1024)}).await.unwrap();
    }
    big.insert_one(doc! {"_id": 39, "k": 39, "pad": "b".repeat(13 << 20)}).await.unwrap();
    let entry = client.database("config").collection::<Document>("collections").find_one(doc! {"_id": "app.big"}).await.unwrap().unwrap();
    let from = client.database("config").collection::<Document>("chunks").find_one(doc! {"uuid": entry.get("uuid").unwrap().clone()}).await.unwrap().unwrap();
    let to = if from.get_str("shard").unwrap() == "shard0" { "shard1" } else { "shard0" };
    admin.run_command(doc! {"moveChunk": "app.big", "find": {"k": 1}, "to": to}).await.unwrap();
    let moved = cluster.shard(to.trim_start_matches("shard").parse().unwrap()).await.database("app").collection::<Document>("big");
    assert_eq!(moved.count_documents(doc! {}).await.unwrap(), 40);
    let largest = moved.find_one(doc! {"_id": 39}).await.unwrap().unwrap();
    assert_eq!(largest.get_str("pad").unwrap().len(), 13 << 20);
}

/// A donor killed (-9) inside a migration's critical section restarts, finds the migration
/// in config.migrations and holds writes to the collection until the router resolves it;
/// then the writes go to the recipient. Every acknowledged write is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_donor_killed_in_the_critical_section_holds_writes_until_the_migration_is_resolved() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let (cluster, client, _recipient, recipient) = cluster_with_recipient("cs", 500).await;
    let admin = client.database("admin");
    let cs = client.database("app").collection::<Document>("cs");

    // A writer through the router: inserts of new keys and increments of old ones, in the
    // migrating chunk. Writes whose outcome the client never learned are "unknown".
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let cs = cs.clone();
        tokio::spawn(async move {
            let (mut inserted, mut unknown_inserts) = (Vec::new(), Vec::new());
            let mut incs: std::collections::BTreeMap<i64, (i64, i64)> = Default::default();
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let k = 1000 + i;
                match cs.insert_one(doc! {"_id": k, "k": k, "n": 0i64}).await {
                    Ok(_) => inserted.push(k),
                    Err(_) => unknown_inserts.push(k),
                }
                let old = i * 37 % 500;
                let e = incs.entry(old).or_default();
                match cs.update_one(doc! {"k": old}, doc! {"$inc": {"n": 1i64}}).await {
                    Ok(r) if r.modified_count == 1 => e.0 += 1,
                    Ok(r) => panic!("the update of {old} found no document: {r:?}"),
                    Err(_) => e.1 += 1,
                }
                i += 1;
            }
            (inserted, unknown_inserts, incs)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mover = move_until_final_transfer(&admin, &recipient, "cs").await;
    let record = client.database("config").collection::<Document>("migrations").find_one(doc! {"_id": "app.cs"}).await.unwrap().unwrap();
    assert_eq!(record.get_bool("inCriticalSection").ok(), Some(true), "{record}");

    // kill -9 the donor and start it again, as it was.
    let donor_host = format!("127.0.0.1:{}", cluster.port + 2);
    let pid = cluster.pid_of(&donor_host);
    let cmdline: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    while std::net::TcpStream::connect(&donor_host).is_ok() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = std::fs::OpenOptions::new().append(true).open(cluster.dir.join("shard0-m0.log")).unwrap();
    let _donor = Proc(Command::new(&cmdline[0]).args(&cmdline[1..]).stdout(std::process::Stdio::null()).stderr(log).spawn().unwrap());
    let donor = mongodb::Client::with_uri_str(format!("mongodb://{donor_host}/?directConnection=true")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !donor.database("admin").run_command(doc! {"hello": 1}).await.is_ok_and(|h| h.get_bool("isWritablePrimary").unwrap_or(false)) {
        assert!(Instant::now() < deadline, "the donor did not come back as primary");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The restarted donor takes no write to the collection while the migration is open
    // (the writer keeps trying through the router meanwhile).
    let donor_cs = donor.database("app").collection::<Document>("cs");
    let before = donor_cs.count_documents(doc! {}).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(donor_cs.count_documents(doc! {}).await.unwrap(), before, "the donor took writes inside the critical section");

    // Let the migration finish: it commits (the recipient has every change), the donor's
    // held writes meet the new version and go to the recipient.
    recipient.database("admin").run_command(fail_point(false)).await.unwrap();
    mover.await.unwrap().unwrap_or_else(|e| panic!("the migration failed: {e}"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (inserted, unknown_inserts, incs) = writer.await.unwrap();
    assert!(inserted.len() > 20, "the writer ran ({} inserts)", inserted.len());

    let owner = client.database("config").collection::<Document>("chunks").find_one(doc! {"min": {"k": 0}}).await.unwrap().unwrap();
    assert_eq!(owner.get_str("shard").unwrap(), "rcpt");
    let docs = collect(cs.find(doc! {}).await.unwrap()).await;
    let by_key: std::collections::BTreeMap<i64, i64> = docs.iter().map(|d| (num_field(d, "k") as i64, num_field(d, "n") as i64)).collect();
    assert_eq!(by_key.len(), docs.len(), "no key twice through the router");
    for k in &inserted {
        assert!(by_key.contains_key(k), "acknowledged insert {k} is missing");
    }
    for k in by_key.keys().filter(|k| **k >= 1000) {
        assert!(inserted.contains(k) || unknown_inserts.contains(k), "{k} was never inserted");
    }
    for (k, (acked, unknown)) in &incs {
        let n = by_key[k];
        assert!(n >= *acked && n <= acked + unknown, "document {k}: n = {n}, with {acked} acknowledged and {unknown} unknown increments");
    }
    // Directly: the range is on the recipient only, once the donor has cleaned up.
    let deadline = Instant::now() + Duration::from_secs(30);
    while donor_cs.count_documents(doc! {"k": {"$gte": 0}}).await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "the donor kept its copies of the moved range");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let on_recipient = recipient.database("app").collection::<Document>("cs").count_documents(doc! {}).await.unwrap();
    assert_eq!(on_recipient as usize, docs.len());
}

/// A router killed inside its migration's critical section leaves the donor holding the
/// collection's writes. Once the migration's lease runs out, another router's round (with
/// the balancer off, too) fences the commit, ends the critical section and deletes the
/// recipient's clone; the held writes then go on, on the donor.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_migration_whose_router_died_in_its_critical_section_is_recovered_after_its_lease() {
    use std::time::{Duration, Instant};
    let (cluster, client, _recipient, recipient) = cluster_with_recipient("dr", 200).await;
    let admin = client.database("admin");
    let (_other, other_port) = second_router(&cluster);
    let other = mongodb::Client::with_uri_str(format!("mongodb://127.0.0.1:{other_port}/")).await.unwrap();
    let chunk =
        |c: mongodb::Client| async move { c.database("config").collection::<Document>("chunks").find_one(doc! {"min": {"k": 0}}).await.unwrap().unwrap() };
    let before = chunk(other.clone()).await;

    let mover = move_until_final_transfer(&admin, &recipient, "dr").await;
    // The migration's router dies in the critical section; the recipient's transfer ends.
    unsafe { libc::kill(cluster.router_pid(), libc::SIGKILL) };
    recipient.database("admin").run_command(fail_point(false)).await.unwrap();
    let _ = mover.await;

    // A write through the other router waits for the recovery, then lands on the donor.
    let started = Instant::now();
    other.database("app").collection::<Document>("dr").insert_one(doc! {"_id": 5000, "k": 5000}).await.unwrap();
    let waited = started.elapsed();
    assert!(waited > Duration::from_secs(5) && waited < Duration::from_secs(120), "the write waited {waited:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while other.database("config").collection::<Document>("migrations").count_documents(doc! {}).await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "the migration's record stayed after its recovery");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = chunk(other.clone()).await;
    assert_eq!(after.get_str("shard").unwrap(), "shard0", "the migration did not commit");
    assert_ne!(after.get_timestamp("lastmod").unwrap(), before.get_timestamp("lastmod").unwrap(), "the recovery fenced the commit");
    let donor = cluster.shard(0).await;
    assert_eq!(donor.database("app").collection::<Document>("dr").count_documents(doc! {}).await.unwrap(), 201);
    let deadline = Instant::now() + Duration::from_secs(30);
    while recipient.database("app").collection::<Document>("dr").count_documents(doc! {}).await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "the recipient kept the clone of an aborted migration");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(other.database("app").collection::<Document>("dr").count_documents(doc! {}).await.unwrap(), 201);
}

/// One shard (the cluster's) with `app.<coll>` ranged on `k`, split at 0 and holding
/// `docs` documents `{_id: k, k, n: 0}`, the balancer off; then a second shard, "rcpt",
/// with its fail points enabled (its process, and a direct connection to it).
async fn cluster_with_recipient(coll: &str, docs: i64) -> (Cluster, mongodb::Client, Proc, mongodb::Client) {
    let cluster = Cluster::up(1);
    let client = cluster.client().await;
    let admin = client.database("admin");
    admin.run_command(doc! {"balancerStop": 1}).await.unwrap();
    let ns = format!("app.{coll}");
    admin.run_command(doc! {"shardCollection": &ns, "key": {"k": 1}}).await.unwrap();
    admin.run_command(doc! {"split": &ns, "middle": {"k": 0}}).await.unwrap();
    client.database("app").collection::<Document>(coll).insert_many((0..docs).map(|k| doc! {"_id": k, "k": k, "n": 0i64})).await.unwrap();
    // Added now, so that the database and its chunks are shard0's.
    let (recipient, recipient_cs) = start_shard_set_with(&cluster, "rcpt", &["--setParameter", "enableTestCommands=1"]).await;
    admin.run_command(doc! {"addShard": &recipient_cs, "name": "rcpt"}).await.unwrap();
    let direct = mongodb::Client::with_uri_str(format!("mongodb://{}/?directConnection=true", recipient_cs.split_once('/').unwrap().1)).await.unwrap();
    (cluster, client, recipient, direct)
}

fn fail_point(on: bool) -> Document {
    doc! {"configureFailPoint": "migrateHangInFinalTransfer", "mode": if on { "alwaysOn" } else { "off" }}
}

/// Start moving `app.<coll>`'s chunk of k >= 0 to "rcpt" (in a task: its result) and
/// return once the recipient holds the last transfer: the donor is in its critical section.
async fn move_until_final_transfer(
    admin: &mongodb::Database,
    recipient: &mongodb::Client,
    coll: &str,
) -> tokio::task::JoinHandle<mongodb::error::Result<Document>> {
    recipient.database("admin").run_command(fail_point(true)).await.unwrap();
    let mover = {
        let (admin, ns) = (admin.clone(), format!("app.{coll}"));
        tokio::spawn(async move { admin.run_command(doc! {"moveChunk": ns, "find": {"k": 1}, "to": "rcpt"}).await })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while recipient.database("admin").run_command(fail_point(true)).await.unwrap().get_i64("count").unwrap() == 0 {
        assert!(!mover.is_finished(), "the migration ended before its last transfer: {:?}", mover.await);
        assert!(std::time::Instant::now() < deadline, "the migration never reached its last transfer");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    mover
}

/// Documents near the 16 MiB limit through a router: two of 15 MB in one insert and one of
/// exactly 16 MiB, on shards of three members. A w:3 write is acknowledged after
/// them (every shard member fetched them), their chunk migrates whole, and an unsharded
/// collection of them moves with movePrimary.
#[tokio::test]
async fn near_limit_documents_replicate_and_migrate_through_the_router() {
    // {_id: 3, k: 3, s} is then exactly 16 MiB, the largest document there is.
    const LARGEST_S_BYTES: usize = 16 * 1024 * 1024 - 29;
    let cluster = Cluster::up_with(2, 3);
    let client = cluster.client().await;
    let admin = client.database("admin");
    admin.run_command(doc! {"enableSharding": "app"}).await.unwrap();
    admin.run_command(doc! {"shardCollection": "app.big", "key": {"k": 1}}).await.unwrap();
    let big = client.database("app").collection::<Document>("big");
    let w1 = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(1)).build();
    big.insert_many(vec![doc! {"_id": 1, "k": 1, "s": "x".repeat(15_000_000)}, doc! {"_id": 2, "k": 2, "s": "y".repeat(15_000_000)}])
        .write_concern(w1.clone())
        .await
        .unwrap();
    big.insert_one(doc! {"_id": 3, "k": 3, "s": "z".repeat(LARGEST_S_BYTES)}).write_concern(w1).await.unwrap();
    let w3 = mongodb::options::WriteConcern::builder().w(mongodb::options::Acknowledgment::Nodes(3)).w_timeout(Duration::from_secs(20)).build();
    let started = std::time::Instant::now();
    big.insert_one(doc! {"_id": 4, "k": 4}).write_concern(w3).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "the w:3 write took {:?}", started.elapsed());
    let entry = client.database("config").collection::<Document>("collections").find_one(doc! {"_id": "app.big"}).await.unwrap().unwrap();
    let from = client.database("config").collection::<Document>("chunks").find_one(doc! {"uuid": entry.get("uuid").unwrap().clone()}).await.unwrap().unwrap();
    let to = if from.get_str("shard").unwrap() == "shard0" { "shard1" } else { "shard0" };
    admin.run_command(doc! {"moveChunk": "app.big", "find": {"k": 1}, "to": to}).await.unwrap();
    let lens = |docs: Vec<Document>| docs.iter().map(|d| d.get_str("s").map_or(0, |s| s.len())).collect::<Vec<usize>>();
    let through_router = collect(big.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
    assert_eq!(lens(through_router), vec![15_000_000, 15_000_000, LARGEST_S_BYTES, 0]);
    // The collection's one chunk (all of it) is the recipient's now.
    let chunks =
        collect(client.database("config").collection::<Document>("chunks").find(doc! {"uuid": entry.get("uuid").unwrap().clone()}).await.unwrap()).await;
    assert!(!chunks.is_empty() && chunks.iter().all(|c| c.get_str("shard").unwrap() == to), "{chunks:?}");
    // An unsharded collection of the same documents moves with its database's primary.
    let plain = client.database("app").collection::<Document>("plain");
    let docs = collect(big.find(doc! {}).await.unwrap()).await;
    plain.insert_many(docs).await.unwrap();
    let primary = client.database("config").collection::<Document>("databases").find_one(doc! {"_id": "app"}).await.unwrap().unwrap();
    let other = if primary.get_str("primary").unwrap() == "shard0" { "shard1" } else { "shard0" };
    admin.run_command(doc! {"movePrimary": "app", "to": other}).await.unwrap();
    let copied = collect(plain.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
    assert_eq!(lens(copied), vec![15_000_000, 15_000_000, LARGEST_S_BYTES, 0]);
}
