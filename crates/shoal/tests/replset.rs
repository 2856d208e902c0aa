//! Replica sets through the official Rust driver: replSetInitiate, hello for SDAM, the oplog,
//! replSetGetStatus/GetConfig, member state checks, and retryable writes.

mod common;

use common::*;
use mongodb::bson::{doc, Bson, Document, Timestamp};
use mongodb::Client;
use std::time::Duration;

async fn direct(server: &Server) -> Client {
    server.client_with("directConnection=true").await
}

async fn admin(client: &Client, cmd: Document) -> mongodb::error::Result<Document> {
    client.database("admin").run_command(cmd).await
}

fn host(server: &Server) -> String {
    format!("127.0.0.1:{}", server.port)
}

async fn initiate(server: &Server) {
    let client = direct(server).await;
    admin(&client, doc! {"replSetInitiate": {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": host(server)}]}}).await.unwrap();
}

async fn oplog(client: &Client, filter: Document) -> Vec<Document> {
    let coll = client.database("local").collection::<Document>("oplog.rs");
    collect(coll.find(filter).await.unwrap()).await
}

fn ts_key(e: &Document) -> (u32, u32) {
    let ts: Timestamp = e.get_timestamp("ts").unwrap();
    (ts.time, ts.increment)
}

#[tokio::test]
async fn a_standalone_has_no_replication() {
    let server = Server::start();
    let client = server.client().await;
    assert_code_name(admin(&client, doc! {"replSetGetStatus": 1}).await, 76, "NoReplicationEnabled");
    assert_code_name(admin(&client, doc! {"replSetInitiate": {}}).await, 76, "NoReplicationEnabled");
    assert_code_name(admin(&client, doc! {"replSetGetConfig": 1}).await, 76, "NoReplicationEnabled");
    let hello = admin(&client, doc! {"hello": 1}).await.unwrap();
    assert!(hello.get("setName").is_none() && hello.get_bool("isWritablePrimary").unwrap());
}

#[tokio::test]
async fn before_initiate_a_member_takes_no_writes_and_reports_no_config() {
    let server = Server::start_with_args(&["--replSet", "rs0"]);
    let client = direct(&server).await;
    let hello = admin(&client, doc! {"hello": 1}).await.unwrap();
    assert!(!hello.get_bool("isWritablePrimary").unwrap());
    assert!(hello.get_bool("isreplicaset").unwrap());
    assert_eq!(hello.get_str("info").unwrap(), "Does not have a valid replica set config");
    assert_code_name(admin(&client, doc! {"replSetGetStatus": 1}).await, 94, "NotYetInitialized");
    assert_code_name(admin(&client, doc! {"replSetGetConfig": 1}).await, 94, "NotYetInitialized");
    let db = client.database("app");
    assert_code_name(db.run_command(doc! {"insert": "c", "documents": [{"_id": 1}]}).await, 10107, "NotWritablePrimary");
    // A driver connected directly reads with primaryPreferred, which a member with no
    // config refuses as mongod does (it is neither primary nor secondary); a plain read too.
    assert_code_name(db.run_command(doc! {"find": "c"}).await, 13436, "NotPrimaryOrSecondary");
    let mut s = wire::connect(server.port);
    let plain = wire::command(&mut s, 1, &doc! {"find": "c", "$db": "app"}).doc;
    assert_eq!((plain.get_i32("code").unwrap(), plain.get_str("codeName").unwrap()), (13435, "NotPrimaryNoSecondaryOk"));
    let primary = wire::command(&mut s, 2, &doc! {"find": "c", "$readPreference": {"mode": "primary"}, "$db": "app"}).doc;
    assert_eq!(primary.get_i32("code").unwrap(), 13435);
    // The local database is always open.
    client.database("local").run_command(doc! {"insert": "scratch", "documents": [{"_id": 1}]}).await.unwrap();
    // Only on the admin database.
    assert_code(db.run_command(doc! {"replSetInitiate": {}}).await, 13);
}

#[tokio::test]
async fn replset_initiate_validates_the_config() {
    let server = Server::start_with_args(&["--replSet", "rs0"]);
    let client = direct(&server).await;
    let me = host(&server);
    let initiate = |cfg: Document| {
        let client = client.clone();
        async move { admin(&client, doc! {"replSetInitiate": cfg}).await }
    };
    let e = assert_code_name(initiate(doc! {"_id": "other", "version": 1, "members": [{"_id": 0, "host": me.clone()}]}).await, 93, "InvalidReplicaSetConfig");
    assert!(e.to_string().contains("command line reports rs0"), "{e}");
    assert_code(initiate(doc! {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": "127.0.0.1:1"}]}).await, 93);
    let eight: Vec<Bson> = (0..8).map(|i| Bson::Document(doc! {"_id": i, "host": format!("127.0.0.{}:{}", i + 1, server.port)})).collect();
    let e = assert_code(initiate(doc! {"_id": "rs0", "version": 1, "members": eight}).await, 93);
    assert!(e.to_string().contains("8 voting members, but must be at most 7"), "{e}");
    assert_code(initiate(doc! {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": me.clone(), "colour": 1}]}).await, 40415);
    assert_code(initiate(doc! {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": me.clone(), "hidden": true}]}).await, 93);
    // Every other member must answer (mongod's quorum check); nothing listens there.
    let two = vec![Bson::Document(doc! {"_id": 0, "host": me.clone()}), Bson::Document(doc! {"_id": 1, "host": format!("127.0.0.1:{}", free_port())})];
    let e = assert_code_name(initiate(doc! {"_id": "rs0", "version": 1, "members": two}).await, 74, "NodeNotFound");
    assert!(e.to_string().contains("quorum check failed"), "{e}");
    // Nothing above initiated the set; the default config does.
    admin(&client, doc! {"replSetInitiate": {}}).await.unwrap();
    assert_code_name(initiate(doc! {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": me}]}).await, 23, "AlreadyInitialized");
}

#[tokio::test]
async fn a_one_member_set_serves_drivers_and_logs_every_write() {
    let mut server = Server::start_with_args(&["--replSet", "rs0"]);
    initiate(&server).await;
    let me = host(&server);

    // hello for SDAM.
    let direct = direct(&server).await;
    let hello = admin(&direct, doc! {"hello": 1}).await.unwrap();
    assert!(hello.get_bool("isWritablePrimary").unwrap());
    assert_eq!(hello.get_str("setName").unwrap(), "rs0");
    assert_eq!(hello.get_array("hosts").unwrap(), &vec![Bson::String(me.clone())]);
    assert_eq!(hello.get_str("primary").unwrap(), me);
    assert_eq!(hello.get_str("me").unwrap(), me);
    assert_eq!(hello.get_object_id("electionId").unwrap().to_hex(), "7fffffff0000000000000001");
    assert_eq!(hello.get_i32("setVersion").unwrap(), 1);
    assert!(path(&hello, "lastWrite.opTime.ts").is_some());

    // A replica-set URI: the driver discovers the set and its primary, and uses retryable
    // writes (lsid + txnNumber) by default.
    let client = Client::with_uri_str(format!("mongodb://{me}/?replicaSet=rs0")).await.unwrap();
    let coll = client.database("app").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "a": 1}).await.unwrap();
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"a": 1}}).await.unwrap();
    coll.insert_one(doc! {"_id": 2}).await.unwrap();
    coll.delete_one(doc! {"_id": 2}).await.unwrap();
    assert_eq!(coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap(), doc! {"_id": 1, "a": 2});

    // The oplog, in order, in MongoDB's shape.
    let entries = oplog(&direct, doc! {"ns": {"$in": ["app.c", "app.$cmd"]}}).await;
    let ops: Vec<(&str, &str)> = entries.iter().map(|e| (e.get_str("op").unwrap(), e.get_str("ns").unwrap())).collect();
    assert_eq!(ops, vec![("c", "app.$cmd"), ("i", "app.c"), ("u", "app.c"), ("i", "app.c"), ("d", "app.c")]);
    assert_eq!(entries[0].get_document("o").unwrap(), &doc! {"create": "c"});
    assert_eq!(entries[2].get_document("o").unwrap(), &doc! {"$v": 2, "diff": {"u": {"a": 2}}});
    assert_eq!(entries[2].get_document("o2").unwrap(), &doc! {"_id": 1});
    assert_eq!(entries[4].get_document("o").unwrap(), &doc! {"_id": 2});
    assert!(entries.windows(2).all(|w| ts_key(&w[0]) < ts_key(&w[1])));
    assert!(entries.iter().all(|e| e.get_i64("t").unwrap() == 1 && e.get_i64("v").unwrap() == 2 && e.get_datetime("wall").is_ok()));
    // The driver's writes were retryable: each entry names its session and transaction, as
    // mongod's do, and the session's record in config.transactions, written with them but
    // not logged, names the newest.
    for e in &entries[1..] {
        assert!(e.get_document("lsid").is_ok() && e.get_i64("txnNumber").is_ok() && e.get_i32("stmtId").ok() == Some(0), "{e}");
        assert_eq!(path(e, "prevOpTime.t"), Some(&Bson::Int64(-1)), "one entry per transaction: {e}");
    }
    let records = collect(direct.database("config").collection::<Document>("transactions").find(doc! {}).await.unwrap()).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].get_i64("txnNum").unwrap(), entries[4].get_i64("txnNumber").unwrap());
    assert_eq!(records[0].get_document("lastWriteOpTime").unwrap().get_timestamp("ts").unwrap(), entries[4].get_timestamp("ts").unwrap());
    let all = oplog(&direct, doc! {}).await;
    assert!(all.iter().all(|e| e.get_str("ns").ok() != Some("config.transactions") || e.get_str("op").ok() == Some("c")));
    assert_eq!(all[0].get_document("o").unwrap(), &doc! {"msg": "initiating set"});
    assert_eq!(all[1].get_document("o").unwrap(), &doc! {"msg": "new primary"});

    // replSetGetStatus and replSetGetConfig.
    let status = admin(&direct, doc! {"replSetGetStatus": 1}).await.unwrap();
    assert_eq!(status.get_str("set").unwrap(), "rs0");
    assert_eq!(status.get_i32("myState").unwrap(), 1);
    assert_eq!(status.get_i64("term").unwrap(), 1);
    assert_eq!(status.get_i32("majorityVoteCount").unwrap(), 1);
    let member = status.get_array("members").unwrap()[0].as_document().unwrap().clone();
    assert_eq!((member.get_str("stateStr").unwrap(), member.get_bool("self").unwrap()), ("PRIMARY", true));
    let applied = path(&status, "optimes.appliedOpTime.ts").unwrap().as_timestamp().unwrap();
    assert_eq!((applied.time, applied.increment), ts_key(all.last().unwrap()));
    let config = admin(&direct, doc! {"replSetGetConfig": 1}).await.unwrap();
    let config = config.get_document("config").unwrap();
    assert_eq!((config.get_str("_id").unwrap(), config.get_i32("version").unwrap(), config.get_i64("term").unwrap()), ("rs0", 1, 1));
    assert!(path(config, "settings.replicaSetId").unwrap().as_object_id().is_some());
    assert_eq!(path(config, "members.0.host"), None, "members is an array");
    assert_eq!(config.get_array("members").unwrap()[0].as_document().unwrap().get_str("host").unwrap(), me);

    let ss = admin(&direct, doc! {"serverStatus": 1}).await.unwrap();
    assert_eq!(path(&ss, "repl.setName").unwrap(), &Bson::String("rs0".into()));
    assert_eq!(path(&ss, "repl.isWritablePrimary").unwrap(), &Bson::Boolean(true));

    // The live oplog cannot be dropped.
    assert_code(direct.database("local").run_command(doc! {"drop": "oplog.rs"}).await, 20);

    // After a restart the member is primary again in a new term, and the oplog continues.
    drop((client, direct));
    server.restart();
    let direct = self::direct(&server).await;
    let hello = admin(&direct, doc! {"hello": 1}).await.unwrap();
    assert!(hello.get_bool("isWritablePrimary").unwrap(), "{hello:?}");
    assert_eq!(hello.get_object_id("electionId").unwrap().to_hex(), "7fffffff0000000000000002");
    direct.database("app").collection::<Document>("c").insert_one(doc! {"_id": 3}).await.unwrap();
    let after = oplog(&direct, doc! {}).await;
    assert_eq!(after.len(), all.len() + 2, "a new-primary entry and the insert");
    let last = after.last().unwrap();
    assert_eq!((last.get_str("op").unwrap(), last.get_i64("t").unwrap()), ("i", 2));
    assert!(ts_key(last) > ts_key(all.last().unwrap()));
}

#[tokio::test]
async fn a_retried_write_is_applied_once() {
    let server = Server::start_with_args(&["--replSet", "rs0"]);
    initiate(&server).await;
    let mut s = wire::connect(server.port);
    let lsid = doc! {"id": Bson::Binary(mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] })};
    let update = |txn: i64| {
        doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}, "upsert": true}], "lsid": lsid.clone(), "txnNumber": txn, "$db": "app"}
    };
    let first = wire::command(&mut s, 1, &update(1)).doc;
    assert_eq!(first.get_f64("ok").unwrap(), 1.0, "{first:?}");
    // The retry (same session and txnNumber) gets the first result, rebuilt from the
    // oplog, with mongod's retriedStmtIds, and writes nothing.
    let mut retry = wire::command(&mut s, 2, &update(1)).doc;
    assert_eq!(retry.remove("retriedStmtIds"), Some(Bson::Array(vec![Bson::Int32(0)])), "{retry:?}");
    assert_eq!(retry, first);
    let next = wire::command(&mut s, 3, &update(2)).doc;
    assert_eq!(next.get_i32("nModified").unwrap(), 1, "{next:?}");
    let old = wire::command(&mut s, 4, &update(1)).doc;
    assert_eq!(old.get_i32("code").unwrap(), 225, "{old:?}");
    let found = wire::command(&mut s, 5, &doc! {"find": "c", "filter": {"_id": 1}, "$db": "app"}).doc;
    assert_eq!(path(&found, "cursor.firstBatch.0.n"), None);
    let doc0 = found.get_document("cursor").unwrap().get_array("firstBatch").unwrap()[0].as_document().unwrap().clone();
    assert_eq!(doc0, doc! {"_id": 1, "n": 2});
    // txnNumber belongs to retryable writes only, and needs a session.
    let bad = wire::command(&mut s, 6, &doc! {"find": "c", "lsid": lsid.clone(), "txnNumber": 3i64, "$db": "app"}).doc;
    assert_eq!(bad.get_i32("code").unwrap(), 50768, "{bad:?}");
    let bad = wire::command(&mut s, 7, &doc! {"insert": "c", "documents": [{"_id": 9}], "txnNumber": 3i64, "$db": "app"}).doc;
    assert_eq!(bad.get_i32("code").unwrap(), 72, "{bad:?}");
}

#[tokio::test]
async fn awaitable_hello_answers_when_the_member_becomes_primary() {
    let server = Server::start_with_args(&["--replSet", "rs0"]);
    let mut s = wire::connect(server.port);
    let hello = wire::command(&mut s, 1, &doc! {"hello": 1, "$db": "admin"}).doc;
    let tv = hello.get_document("topologyVersion").unwrap().clone();
    // An awaitable hello waits up to maxAwaitTimeMS for a change; initiating is one.
    let port = server.port;
    let waiter = std::thread::spawn(move || {
        let mut s = wire::connect(port);
        let started = std::time::Instant::now();
        let r = wire::command(&mut s, 2, &doc! {"hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 10_000, "$db": "admin"}).doc;
        (r, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    initiate(&server).await;
    let (r, waited) = waiter.join().unwrap();
    assert!(r.get_bool("isWritablePrimary").unwrap(), "{r:?}");
    assert!(waited < Duration::from_secs(8), "answered on the change, not at the timeout: {waited:?}");
}

#[tokio::test]
async fn write_concern_beyond_the_set_is_reported_beside_the_applied_write() {
    let server = Server::start_with_args(&["--replSet", "rs0"]);
    initiate(&server).await;
    let client = direct(&server).await;
    let db = client.database("app");
    for w in [Bson::Int32(1), Bson::String("majority".into())] {
        let r = db.run_command(doc! {"insert": "c", "documents": [{}], "writeConcern": {"w": w.clone()}}).await.unwrap();
        assert!(r.get("writeConcernError").is_none(), "w {w}: {r:?}");
    }
    // Two members' acknowledgement from a one-member set: applied, and an error beside it.
    let r = db.run_command(doc! {"insert": "c", "documents": [{"_id": "w2"}], "writeConcern": {"w": 2}}).await.unwrap();
    assert_eq!(r.get_i32("n").unwrap(), 1);
    let wce = r.get_document("writeConcernError").unwrap();
    assert_eq!((wce.get_i32("code").unwrap(), wce.get_str("codeName").unwrap()), (100, "UnsatisfiableWriteConcern"));
    assert_eq!(path(wce, "errInfo.writeConcern.w").unwrap(), &Bson::Int32(2));
    assert_eq!(db.collection::<Document>("c").count_documents(doc! {"_id": "w2"}).await.unwrap(), 1);
    let r = db.run_command(doc! {"insert": "c", "documents": [{}], "writeConcern": {"w": "eastAndWest"}}).await.unwrap();
    assert_eq!(path(&r, "writeConcernError.code").unwrap(), &Bson::Int32(79));
    assert_code(db.run_command(doc! {"insert": "c", "documents": [{}], "writeConcern": {"w": 51}}).await, 9);
    // Linearizable reads are served by the primary.
    db.run_command(doc! {"find": "c", "readConcern": {"level": "linearizable"}}).await.unwrap();
}

/// Every user collection's documents (by _id) and index names and keys.
async fn contents(client: &Client) -> Vec<(String, Vec<Document>, Vec<String>)> {
    let mut out = Vec::new();
    let mut dbs = client.list_database_names().await.unwrap();
    dbs.sort();
    for db in dbs.iter().filter(|d| !["admin", "local", "config"].contains(&d.as_str())) {
        let mut colls = client.database(db).list_collection_names().await.unwrap();
        colls.sort();
        for c in colls {
            let coll = client.database(db).collection::<Document>(&c);
            let docs = collect(coll.find(doc! {}).sort(doc! {"_id": 1}).await.unwrap()).await;
            let mut indexes = Vec::new();
            let mut cursor = coll.list_indexes().await.unwrap();
            while cursor.advance().await.unwrap() {
                let m = cursor.deserialize_current().unwrap();
                indexes.push(format!("{:?} {}", m.options.and_then(|o| o.name), m.keys));
            }
            indexes.sort();
            out.push((format!("{db}.{c}"), docs, indexes));
        }
    }
    out
}

#[tokio::test]
async fn applying_a_members_oplog_rebuilds_its_data_and_reapplying_changes_nothing() {
    let primary = Server::start_with_args(&["--replSet", "rs0"]);
    initiate(&primary).await;
    let p = direct(&primary).await;
    let app = p.database("app");
    let c = app.collection::<Document>("c");
    c.insert_many((0..20).map(|i| doc! {"_id": i, "n": i, "tag": format!("t{}", i % 3)})).await.unwrap();
    c.create_index(mongodb::IndexModel::builder().keys(doc! {"tag": 1, "n": -1}).build()).await.unwrap();
    c.update_many(doc! {"n": {"$lt": 5}}, doc! {"$inc": {"n": 100}, "$set": {"big": true}}).await.unwrap();
    c.replace_one(doc! {"_id": 7}, doc! {"replaced": true}).await.unwrap();
    c.delete_many(doc! {"tag": "t2"}).await.unwrap();
    app.collection::<Document>("gone").insert_one(doc! {"x": 1}).await.unwrap();
    app.collection::<Document>("gone").drop().await.unwrap();
    app.collection::<Document>("old").insert_one(doc! {"_id": "r"}).await.unwrap();
    p.database("admin").run_command(doc! {"renameCollection": "app.old", "to": "app.renamed"}).await.unwrap();
    p.database("other").collection::<Document>("k").insert_one(doc! {"_id": 1, "a": [1, 2]}).await.unwrap();
    c.create_index(mongodb::IndexModel::builder().keys(doc! {"scratch": 1}).build()).await.unwrap();
    c.drop_index("scratch_1").await.unwrap();
    // A tail of plain CRUD, re-applied below.
    c.update_one(doc! {"_id": 9}, doc! {"$set": {"late": 1}}).await.unwrap();
    c.insert_one(doc! {"_id": 100}).await.unwrap();
    c.delete_one(doc! {"_id": 10}).await.unwrap();
    let want = contents(&p).await;
    let names: Vec<&str> = want.iter().map(|(ns, _, _)| ns.as_str()).collect();
    assert_eq!(names, vec!["app.c", "app.renamed", "other.k"]);
    assert_eq!(want[0].1.len(), 14);
    assert_eq!(want[0].2.len(), 2, "{:?}", want[0].2);

    let entries: Vec<Bson> = oplog(&p, doc! {}).await.into_iter().map(Bson::Document).collect();
    let standalone = Server::start();
    let s = standalone.client().await;
    let r = s.database("admin").run_command(doc! {"applyOps": entries.clone()}).await.unwrap();
    assert_eq!(r.get_i32("applied").unwrap() as usize, entries.len());
    assert_eq!(contents(&s).await, want);
    // Re-applying the CRUD tail (a fetcher that restarts behind what it applied).
    let tail = entries[entries.len() - 3..].to_vec();
    s.database("admin").run_command(doc! {"applyOps": tail}).await.unwrap();
    assert_eq!(contents(&s).await, want);
    // A failing entry reports how far it got.
    let bad = vec![Bson::Document(doc! {"op": "i", "ns": "app.c", "o": {"_id": 500}}), Bson::Document(doc! {"op": "x", "ns": "app.c", "o": {}})];
    let e = assert_code(s.database("admin").run_command(doc! {"applyOps": bad}).await, 9);
    assert!(e.to_string().contains("unknown oplog operation type"), "{e}");
    assert_eq!(s.database("app").collection::<Document>("c").count_documents(doc! {"_id": 500}).await.unwrap(), 1);
}

/// A tail of the oplog from a timestamp (`{ts: {$gte: T}}` alone: what a secondary's fetcher
/// sends) is answered with the entries as stored, without decoding them; a client must read
/// exactly what any other read of the oplog gives.
#[tokio::test]
async fn an_oplog_tail_from_a_timestamp_reads_what_any_oplog_read_does() {
    let server = Server::start_with_args(&["--replSet", "rs0"]);
    initiate(&server).await;
    let client = direct(&server).await;
    let c = client.database("app").collection::<Document>("c");
    let bin = mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Generic, bytes: vec![0, 1, 255] };
    let docs: Vec<Document> = (0..20).map(|i| doc! {"_id": i, "s": format!("é{i}"), "n": {"a": [i, {"b": Bson::Null}]}, "bin": bin.clone()}).collect();
    c.insert_many(docs).await.unwrap();
    c.update_one(doc! {"_id": 3}, doc! {"$set": {"x": 1.5}}).await.unwrap();
    c.delete_one(doc! {"_id": 4}).await.unwrap();
    let all = oplog(&client, doc! {}).await;
    assert!(all.len() > 20, "{}", all.len());
    let local = client.database("local");
    let t = all[5].get_timestamp("ts").unwrap();
    let cases = [
        (doc! {"ts": {"$gte": t}}, None, 5),
        (doc! {"ts": {"$gt": t}}, None, 6),
        // Not the bare timestamp condition: filtered and projected as any find.
        (doc! {"ts": {"$gte": t}, "op": {"$exists": true}}, None, 5),
        (doc! {"ts": {"$gte": t}}, Some(doc! {"op": 1, "ns": 1}), 5),
    ];
    for (filter, projection, from) in cases {
        let expected: Vec<Document> = all[from..]
            .iter()
            .map(|e| match &projection {
                Some(_) => doc! {"op": e.get_str("op").unwrap(), "ns": e.get_str("ns").unwrap()},
                None => e.clone(),
            })
            .collect();
        let mut find = doc! {"find": "oplog.rs", "filter": filter.clone(), "tailable": true, "batchSize": 4};
        if let Some(p) = &projection {
            find.insert("projection", p.clone());
        }
        let r = local.run_command(find).await.unwrap();
        let cursor = r.get_document("cursor").unwrap();
        let id = cursor.get_i64("id").unwrap();
        let mut got: Vec<Document> = cursor.get_array("firstBatch").unwrap().iter().map(|d| d.as_document().unwrap().clone()).collect();
        assert_eq!(got.len(), 4, "{filter}");
        while got.len() < expected.len() {
            let r = local.run_command(doc! {"getMore": id, "collection": "oplog.rs", "batchSize": 4}).await.unwrap();
            let batch = r.get_document("cursor").unwrap().get_array("nextBatch").unwrap().clone();
            assert!(!batch.is_empty(), "{filter}: {} of {}", got.len(), expected.len());
            got.extend(batch.into_iter().map(|d| d.as_document().unwrap().clone()));
        }
        assert_eq!(got[..expected.len()], expected[..], "{filter} {projection:?}");
    }
}

#[tokio::test]
async fn a_tailable_await_cursor_follows_the_oplog() {
    let server = Server::start_with_args(&["--replSet", "rs0"]);
    initiate(&server).await;
    let mut s = wire::connect(server.port);
    let find = doc! {"find": "oplog.rs", "filter": {"ns": "app.c"}, "tailable": true, "awaitData": true, "$db": "local"};
    let r = wire::command(&mut s, 1, &find).doc;
    let id = path(&r, "cursor.id").and_then(|v| v.as_i64()).unwrap();
    assert_ne!(id, 0, "the oplog is not empty, so the cursor has a position: {r:?}");
    assert_eq!(r.get_document("cursor").unwrap().get_array("firstBatch").unwrap().len(), 0);

    // A getMore with nothing new waits up to maxTimeMS, then answers an empty batch.
    let get_more = |n: i64| doc! {"getMore": id, "collection": "oplog.rs", "maxTimeMS": n, "$db": "local"};
    let started = std::time::Instant::now();
    let r = wire::command(&mut s, 2, &get_more(300)).doc;
    assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
    assert_eq!(path(&r, "cursor.id").and_then(|v| v.as_i64()), Some(id));
    assert_eq!(r.get_document("cursor").unwrap().get_array("nextBatch").unwrap().len(), 0);

    // An insert while a getMore waits wakes it with the new entry.
    let port = server.port;
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut w = wire::connect(port);
        wire::command(&mut w, 1, &doc! {"insert": "c", "documents": [{"_id": 1}], "$db": "app"});
    });
    let started = std::time::Instant::now();
    let r = wire::command(&mut s, 3, &get_more(10_000)).doc;
    writer.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(8), "woken by the write, not the timeout: {:?}", started.elapsed());
    let batch = r.get_document("cursor").unwrap().get_array("nextBatch").unwrap().clone();
    let ops: Vec<&str> = batch.iter().map(|e| e.as_document().unwrap().get_str("op").unwrap()).collect();
    assert!(ops.contains(&"i"), "{batch:?}");
    assert_eq!(path(&r, "cursor.id").and_then(|v| v.as_i64()), Some(id), "a tailable cursor stays open");

    // The rules: capped collections only; awaitData needs tailable; no sort but $natural: 1;
    // an empty capped collection gives no position; maxTimeMS only for awaitData getMores.
    let code = |r: &Document| r.get_i32("code").unwrap_or(0);
    let r = wire::command(&mut s, 4, &doc! {"find": "c", "tailable": true, "$db": "app"}).doc;
    assert_eq!(code(&r), 2, "{r:?}");
    let r = wire::command(&mut s, 5, &doc! {"find": "oplog.rs", "awaitData": true, "$db": "local"}).doc;
    assert_eq!(code(&r), 9, "{r:?}");
    let r = wire::command(&mut s, 6, &doc! {"find": "oplog.rs", "tailable": true, "sort": {"$natural": -1}, "$db": "local"}).doc;
    assert_eq!(code(&r), 2, "{r:?}");
    wire::command(&mut s, 7, &doc! {"create": "capped", "capped": true, "size": 4096, "$db": "app"});
    let r = wire::command(&mut s, 8, &doc! {"find": "capped", "tailable": true, "$db": "app"}).doc;
    assert_eq!(path(&r, "cursor.id").and_then(|v| v.as_i64()), Some(0), "{r:?}");
    wire::command(&mut s, 9, &doc! {"insert": "capped", "documents": [{"_id": 1}, {"_id": 2}], "$db": "app"});
    let r = wire::command(&mut s, 10, &doc! {"find": "capped", "tailable": true, "batchSize": 1, "$db": "app"}).doc;
    let tid = path(&r, "cursor.id").and_then(|v| v.as_i64()).unwrap();
    assert_ne!(tid, 0);
    let r = wire::command(&mut s, 11, &doc! {"getMore": tid, "collection": "capped", "maxTimeMS": 10, "$db": "app"}).doc;
    assert_eq!(code(&r), 2, "maxTimeMS on a getMore of a tailable cursor without awaitData: {r:?}");
    let r = wire::command(&mut s, 12, &doc! {"getMore": tid, "collection": "capped", "$db": "app"}).doc;
    assert_eq!(r.get_document("cursor").unwrap().get_array("nextBatch").unwrap().len(), 1, "{r:?}");
    // New documents push the cursor's position out of the capped collection: the cursor dies.
    let r = wire::command(&mut s, 13, &doc! {"getMore": tid, "collection": "capped", "$db": "app"}).doc;
    assert_eq!(r.get_document("cursor").unwrap().get_array("nextBatch").unwrap().len(), 0, "{r:?}");
    let big: Vec<Document> = (3..13).map(|i| doc! {"_id": i, "pad": "x".repeat(1000)}).collect();
    wire::command(&mut s, 14, &doc! {"insert": "capped", "documents": big, "$db": "app"});
    let r = wire::command(&mut s, 15, &doc! {"getMore": tid, "collection": "capped", "$db": "app"}).doc;
    assert_eq!((code(&r), r.get_str("codeName").unwrap_or("")), (136, "CappedPositionLost"), "{r:?}");
}

/// A fetcher's getMore and replSetUpdatePosition carry the reporter's term; a later term than
/// the primary's makes it step down before it counts the report (mongod's getMore takes
/// `term` the same way). Otherwise a member that voted for a new primary could go on making
/// the old primary's writes majority-durable, and acknowledged, after the new primary was
/// elected without them (found by the simulation, crates/sim).
#[tokio::test]
async fn a_progress_report_from_a_later_term_makes_the_primary_step_down() {
    let server = Server::start_with_args(&["--replSet", "rs0"]);
    initiate(&server).await;
    let mut s = wire::connect(server.port);
    let status = |s: &mut std::net::TcpStream, id: i32| wire::command(s, id, &doc! {"replSetGetStatus": 1, "$db": "admin"}).doc;
    let term = status(&mut s, 1).get_i64("term").unwrap();
    let hello = wire::command(&mut s, 2, &doc! {"hello": 1, "$db": "admin"}).doc;
    assert!(hello.get_bool("isWritablePrimary").unwrap());

    // A report in the primary's own term changes nothing.
    let r = wire::command(&mut s, 3, &doc! {"replSetUpdatePosition": 1, "optimes": [], "term": term, "$db": "admin"}).doc;
    assert_eq!(r.get_f64("ok").unwrap(), 1.0, "{r:?}");
    assert!(wire::command(&mut s, 4, &doc! {"hello": 1, "$db": "admin"}).doc.get_bool("isWritablePrimary").unwrap());
    // A malformed term is refused.
    let r = wire::command(&mut s, 5, &doc! {"replSetUpdatePosition": 1, "optimes": [], "term": "later", "$db": "admin"}).doc;
    assert_eq!(r.get_str("codeName").unwrap(), "TypeMismatch", "{r:?}");

    // An oplog getMore from a later term: the primary adopts it and steps down.
    let find = doc! {"find": "oplog.rs", "filter": {}, "tailable": true, "batchSize": 1, "$db": "local"};
    let id = path(&wire::command(&mut s, 6, &find).doc, "cursor.id").and_then(|v| v.as_i64()).unwrap();
    wire::command(&mut s, 7, &doc! {"getMore": id, "collection": "oplog.rs", "term": term + 3, "maxTimeMS": 10, "$db": "local"});
    let hello = wire::command(&mut s, 8, &doc! {"hello": 1, "$db": "admin"}).doc;
    assert!(!hello.get_bool("isWritablePrimary").unwrap(), "{hello:?}");
    assert_eq!(status(&mut s, 9).get_i64("term").unwrap(), term + 3);

    // replSetUpdatePosition from a later still term: adopted too.
    wire::command(&mut s, 10, &doc! {"replSetUpdatePosition": 1, "optimes": [], "term": term + 5, "$db": "admin"});
    assert_eq!(status(&mut s, 11).get_i64("term").unwrap(), term + 5);
}
