//! Rust-driver compatibility tests against the real binary. Expectations come from the
//! MongoDB 7.0 manual, not from shoal's code.

mod common;

use common::*;
use mongodb::bson::{doc, oid::ObjectId, spec::BinarySubtype, Binary, Bson, DateTime, Decimal128, Document, Regex, Timestamp};
use mongodb::options::{IndexOptions, ReturnDocument};
use mongodb::{Collection, IndexModel};
use std::time::Duration;

fn ids(docs: &[Document]) -> Vec<i32> {
    docs.iter().map(|d| d.get_i32("_id").unwrap_or_else(|_| panic!("_id not int32 in {d:?}"))).collect()
}

fn field_i32(docs: &[Document], key: &str) -> Vec<i32> {
    docs.iter().map(|d| d.get_i32(key).unwrap_or_else(|_| panic!("{key} not int32 in {d:?}"))).collect()
}

fn keys(d: &Document) -> Vec<&str> {
    d.keys().map(|k| k.as_str()).collect()
}

async fn seed(coll: &Collection<Document>, n: i32) {
    let docs: Vec<Document> = (0..n).map(|i| doc! {"_id": i, "a": i % 3, "b": i, "sub": {"x": i}, "tags": ["t", format!("t{}", i % 2)]}).collect();
    coll.insert_many(docs).await.expect("seed insert_many");
}

// ---------------------------------------------------------------- handshake

#[tokio::test]
async fn hello_ping_buildinfo_shape() {
    let server = Server::start();
    let client = server.client().await;
    let admin = client.database("admin");

    let pong = ping(&client).await.expect("ping");
    assert_eq!(pong.get("ok"), Some(&Bson::Double(1.0)), "{pong:?}");

    let hello = admin.run_command(doc! {"hello": 1}).await.expect("hello");
    assert_eq!(hello.get_bool("isWritablePrimary").ok(), Some(true), "{hello:?}");
    assert_eq!(num_field(&hello, "maxBsonObjectSize"), 16_777_216.0);
    assert_eq!(num_field(&hello, "maxMessageSizeBytes"), 48_000_000.0);
    assert_eq!(num_field(&hello, "maxWriteBatchSize"), 100_000.0);
    assert_eq!(num_field(&hello, "minWireVersion"), 0.0);
    assert_eq!(num_field(&hello, "maxWireVersion"), 21.0);
    assert_eq!(num_field(&hello, "logicalSessionTimeoutMinutes"), 30.0);
    assert!(matches!(hello.get("localTime"), Some(Bson::DateTime(_))), "{hello:?}");
    assert!(hello.get("connectionId").and_then(num).is_some(), "{hello:?}");
    assert_eq!(hello.get_bool("readOnly").ok(), Some(false));
    assert_eq!(hello.get("ok"), Some(&Bson::Double(1.0)));
    // A standalone is not a replica set member.
    assert!(hello.get("setName").is_none(), "{hello:?}");

    // Legacy handshake names still answer, with the legacy field name.
    for name in ["isMaster", "ismaster"] {
        let legacy = admin.run_command(doc! {name: 1}).await.expect("isMaster");
        assert_eq!(legacy.get_bool("ismaster").ok(), Some(true), "{legacy:?}");
        assert_eq!(num_field(&legacy, "maxWireVersion"), 21.0);
    }
    // hello works on any database.
    let hello_test = client.database("test").run_command(doc! {"hello": 1}).await.expect("hello on test");
    assert_eq!(hello_test.get_bool("isWritablePrimary").ok(), Some(true));

    let build = admin.run_command(doc! {"buildInfo": 1}).await.expect("buildInfo");
    let version = build.get_str("version").expect("version string");
    assert!(version.starts_with("7.0"), "version {version}");
    let va = build.get_array("versionArray").expect("versionArray");
    assert_eq!(va.len(), 4, "{va:?}");
    assert_eq!(va.first().and_then(num), Some(7.0));
    assert_eq!(va.get(1).and_then(num), Some(0.0));
    assert_eq!(num_field(&build, "bits"), 64.0);
    assert_eq!(num_field(&build, "maxBsonObjectSize"), 16_777_216.0);
    assert!(build.get_str("gitVersion").is_ok(), "{build:?}");
    assert_eq!(num_field(&build, "ok"), 1.0);
    // Case-insensitive alias used by old tools.
    let build2 = admin.run_command(doc! {"buildinfo": 1}).await.expect("buildinfo");
    assert_eq!(build2.get_str("version").ok(), Some(version));
}

#[tokio::test]
async fn config_file_start_and_getcmdlineopts() {
    let yaml = "net:\n  port: {port}\n  bindIp: 127.0.0.1\nstorage:\n  dbPath: {dbpath}\n";
    let server = Server::start_with(ServerOptions { args_extra: vec![], config_yaml: Some(yaml.to_string()), ..Default::default() });
    let client = server.client().await;
    ping(&client).await.expect("ping");
    let opts = client.database("admin").run_command(doc! {"getCmdLineOpts": 1}).await.expect("getCmdLineOpts");
    assert!(opts.get_array("argv").is_ok(), "{opts:?}");
    let parsed = opts.get_document("parsed").expect("parsed");
    assert_eq!(path(parsed, "net.port").and_then(num), Some(server.port as f64), "{parsed:?}");
    assert_eq!(path(parsed, "storage.dbPath").and_then(|v| v.as_str()), Some(server.dbpath.to_str().unwrap_or_default()), "{parsed:?}");
    assert!(parsed.get_str("config").is_ok(), "{parsed:?}");
}

// ---------------------------------------------------------------- inserts

#[tokio::test]
async fn insert_one_round_trips_every_bson_type() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("types");
    let generated = coll.insert_one(doc! {"x": 1}).await.expect("insert without _id");
    let oid = generated.inserted_id.as_object_id().expect("driver-generated ObjectId _id");
    let back = coll.find_one(doc! {"_id": oid}).await.expect("find_one").expect("present");
    assert_eq!(back, doc! {"_id": oid, "x": 1});

    let original = doc! {
        "_id": "str-id",
        "double": 1.5,
        "string": "héllo",
        "doc": {"nested": {"deep": [1, {"k": "v"}]}},
        "array": [1, "two", 3.0, null, [4]],
        "binary": Binary { subtype: BinarySubtype::Generic, bytes: vec![0, 1, 2, 255] },
        "uuid": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] },
        "oid": ObjectId::new(),
        "bool": true,
        "date": DateTime::from_millis(1_700_000_000_123),
        "null": null,
        "regex": Regex { pattern: "^a.*b$".try_into().expect("cstr"), options: "i".try_into().expect("cstr") },
        "int32": 42_i32,
        "timestamp": Timestamp { time: 1_700_000_000, increment: 7 },
        "int64": 9_007_199_254_740_993_i64,
        "decimal": "1234.5678".parse::<Decimal128>().expect("decimal"),
        "minkey": Bson::MinKey,
        "maxkey": Bson::MaxKey,
        "code": Bson::JavaScriptCode("function() { return 1; }".into()),
        "empty_doc": {},
        "empty_arr": [],
    };
    let r = coll.insert_one(original.clone()).await.expect("insert typed doc");
    assert_eq!(r.inserted_id, Bson::String("str-id".into()));
    let back = coll.find_one(doc! {"_id": "str-id"}).await.expect("find").expect("present");
    // Exact equality: same types, same values, same field order.
    assert_same(&back, &original);
}

#[tokio::test]
async fn insert_many_ordered_and_unordered_duplicates() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1}).await.expect("seed");

    // Ordered: stops at the first error; documents before it are inserted.
    let r = coll.insert_many(vec![doc! {"_id": 0}, doc! {"_id": 1}, doc! {"_id": 2}]).await;
    let e = r.expect_err("duplicate must fail");
    let mongodb::error::ErrorKind::InsertMany(bulk) = e.kind.as_ref() else { panic!("expected InsertMany error, got {e:?}") };
    let errors = bulk.write_errors.as_ref().expect("write errors");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].index, 1);
    assert_eq!(errors[0].code, 11000);
    let all = collect(coll.find(doc! {}).sort(doc! {"_id": 1}).await.expect("find")).await;
    assert_eq!(ids(&all), vec![0, 1], "ordered insert must stop at the duplicate");

    // Unordered: every other document is inserted, each duplicate reported by index.
    let r = coll.insert_many(vec![doc! {"_id": 3}, doc! {"_id": 1}, doc! {"_id": 4}, doc! {"_id": 0}]).ordered(false).await;
    let e = r.expect_err("duplicates must fail");
    let mongodb::error::ErrorKind::InsertMany(bulk) = e.kind.as_ref() else { panic!("expected InsertMany error, got {e:?}") };
    let errors = bulk.write_errors.as_ref().expect("write errors");
    let got: Vec<(usize, i32)> = errors.iter().map(|w| (w.index, w.code)).collect();
    assert_eq!(got, vec![(1, 11000), (3, 11000)]);
    let all = collect(coll.find(doc! {}).sort(doc! {"_id": 1}).await.expect("find")).await;
    assert_eq!(ids(&all), vec![0, 1, 3, 4]);

    // insert_one duplicate: a single write error.
    let e = assert_code(coll.insert_one(doc! {"_id": 4}).await, 11000);
    assert!(matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Write(_)), "{e:?}");
}

#[tokio::test]
async fn duplicate_key_write_error_shape() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    db.collection::<Document>("c").insert_one(doc! {"_id": 1, "email": "a@x"}).await.expect("seed");
    let reply = db
        .run_command(doc! {"insert": "c", "documents": [{"_id": 2}, {"_id": 1}, {"_id": 3}, {"_id": 1}], "ordered": false})
        .await
        .expect("insert command replies ok:1 with writeErrors");
    assert_eq!(num_field(&reply, "ok"), 1.0);
    assert_eq!(num_field(&reply, "n"), 2.0, "{reply:?}");
    let errors = reply.get_array("writeErrors").expect("writeErrors");
    assert_eq!(errors.len(), 2);
    for (e, index) in errors.iter().zip([1, 3]) {
        let e = e.as_document().expect("write error doc");
        assert_eq!(num_field(e, "index"), index as f64);
        assert_eq!(num_field(e, "code"), 11000.0);
        assert_eq!(e.get_document("keyPattern").ok(), Some(&doc! {"_id": 1}), "{e:?}");
        assert_eq!(e.get_document("keyValue").ok(), Some(&doc! {"_id": 1}), "{e:?}");
        let msg = e.get_str("errmsg").expect("errmsg");
        assert!(msg.starts_with("E11000 duplicate key error collection: test.c index: _id_ dup key: { _id: 1 }"), "{msg}");
    }

    // Secondary unique index: keyPattern/keyValue name the indexed field. (A fresh collection:
    // in "c" two documents lack `email`, and a unique index treats both as null, so MongoDB
    // refuses to build it there.)
    let coll = db.collection::<Document>("u");
    coll.insert_one(doc! {"_id": 1, "email": "a@x"}).await.expect("seed u");
    let model = IndexModel::builder().keys(doc! {"email": 1}).options(IndexOptions::builder().unique(true).build()).build();
    assert_eq!(coll.create_index(model).await.expect("create unique").index_name, "email_1");
    let reply = db.run_command(doc! {"insert": "u", "documents": [{"_id": 9, "email": "a@x"}]}).await.expect("insert");
    assert_eq!(num_field(&reply, "n"), 0.0);
    let e = reply.get_array("writeErrors").expect("writeErrors")[0].as_document().expect("doc").clone();
    assert_eq!(num_field(&e, "code"), 11000.0);
    assert_eq!(e.get_document("keyPattern").ok(), Some(&doc! {"email": 1}));
    assert_eq!(e.get_document("keyValue").ok(), Some(&doc! {"email": "a@x"}));
    assert!(e.get_str("errmsg").unwrap_or_default().contains("index: email_1 dup key: { email: \"a@x\" }"), "{e:?}");
    // The failed insert left nothing behind.
    assert_eq!(coll.count_documents(doc! {"_id": 9}).await.expect("count"), 0);
}

#[tokio::test]
async fn insert_into_invalid_namespace_is_rejected() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    assert_code(db.run_command(doc! {"insert": "a$b", "documents": [{"x": 1}]}).await, 73);
    // Writing to a system collection that users may not create.
    assert!(db.run_command(doc! {"insert": "system.foo", "documents": [{"x": 1}]}).await.is_err());
}

// ---------------------------------------------------------------- find and cursors

#[tokio::test]
async fn find_filter_projection_sort_skip_limit() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    seed(&coll, 20).await;

    let got = collect(coll.find(doc! {"a": 1}).sort(doc! {"b": -1}).skip(1).limit(3).await.expect("find")).await;
    assert_eq!(field_i32(&got, "b"), vec![16, 13, 10]);

    // Inclusion keeps _id by default; order of fields follows the document.
    let got = collect(coll.find(doc! {"_id": 5}).projection(doc! {"b": 1}).await.expect("find")).await;
    assert_eq!(got, vec![doc! {"_id": 5, "b": 5}]);
    let got = collect(coll.find(doc! {"_id": 5}).projection(doc! {"b": 1, "_id": 0}).await.expect("find")).await;
    assert_eq!(got, vec![doc! {"b": 5}]);
    let got = collect(coll.find(doc! {"_id": 5}).projection(doc! {"sub": 0, "tags": 0}).await.expect("find")).await;
    assert_eq!(got, vec![doc! {"_id": 5, "a": 2, "b": 5}]);
    let got = collect(coll.find(doc! {"_id": 5}).projection(doc! {"sub.x": 1}).await.expect("find")).await;
    assert_eq!(got, vec![doc! {"_id": 5, "sub": {"x": 5}}]);
    // Mixing inclusion and exclusion (other than _id) is an error: 31254 in 7.0.
    assert_code(coll.find(doc! {}).projection(doc! {"a": 1, "b": 0}).await.map(|_| ()), 31254);

    // Compound sort.
    let got = collect(coll.find(doc! {"b": {"$lt": 6}}).sort(doc! {"a": 1, "b": -1}).await.expect("find")).await;
    assert_eq!(ids(&got), vec![3, 0, 4, 1, 5, 2]);

    // Query operators.
    let cases: Vec<(Document, Vec<i32>)> = vec![
        (doc! {"b": {"$gt": 17}}, vec![18, 19]),
        (doc! {"b": {"$gte": 3, "$lte": 5}}, vec![3, 4, 5]),
        (doc! {"b": {"$in": [1, 7, 100]}}, vec![1, 7]),
        (doc! {"b": {"$nin": (2..20).collect::<Vec<i32>>()}}, vec![0, 1]),
        (doc! {"a": {"$ne": 0}, "b": {"$lt": 4}}, vec![1, 2]),
        (doc! {"$or": [{"b": 2}, {"b": 11}]}, vec![2, 11]),
        (doc! {"$and": [{"a": 0}, {"b": {"$gt": 12}}]}, vec![15, 18]),
        (doc! {"$nor": [{"b": {"$gt": 1}}]}, vec![0, 1]),
        (doc! {"sub.x": 4}, vec![4]),
        (doc! {"tags": "t1", "b": {"$lt": 5}}, vec![1, 3]),
        (doc! {"tags": {"$all": ["t", "t0"]}, "b": {"$lt": 5}}, vec![0, 2, 4]),
        (doc! {"tags": {"$size": 2}, "b": {"$lt": 2}}, vec![0, 1]),
        (doc! {"tags.1": "t1", "b": {"$lt": 4}}, vec![1, 3]),
        (doc! {"missing": {"$exists": true}}, vec![]),
        (doc! {"b": {"$not": {"$gt": 1}}}, vec![0, 1]),
        (doc! {"b": {"$type": "int"}, "a": 2, "b2": {"$exists": false}}, vec![2, 5, 8, 11, 14, 17]),
        (doc! {"b": {"$mod": [10, 3]}}, vec![3, 13]),
        (doc! {"tags": {"$elemMatch": {"$eq": "t1"}}, "b": {"$lt": 4}}, vec![1, 3]),
        (doc! {"tags": {"$regex": "^t1$"}, "b": {"$lt": 4}}, vec![1, 3]),
        (doc! {"$expr": {"$eq": ["$a", {"$subtract": ["$b", 18]}]}}, vec![18, 19]),
    ];
    for (filter, want) in cases {
        let got = collect(coll.find(filter.clone()).sort(doc! {"_id": 1}).await.expect("find")).await;
        assert_eq!(ids(&got), want, "filter {filter:?}");
    }
    // find_one with sort picks the first document of the sort order.
    let top = coll.find_one(doc! {}).sort(doc! {"b": -1}).await.expect("find_one").expect("doc");
    assert_eq!(top.get_i32("_id").ok(), Some(19));
}

#[tokio::test]
async fn cursor_across_get_more_1000_docs_batch_7() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    let docs: Vec<Document> = (0..1000).map(|i| doc! {"_id": i, "v": format!("value-{i}")}).collect();
    coll.insert_many(docs).await.expect("insert 1000");

    let got = collect(coll.find(doc! {}).sort(doc! {"_id": 1}).batch_size(7).await.expect("find")).await;
    assert_eq!(ids(&got), (0..1000).collect::<Vec<i32>>());
    let got = collect(coll.find(doc! {}).sort(doc! {"_id": -1}).batch_size(7).limit(10).await.expect("find")).await;
    assert_eq!(ids(&got), (990..1000).rev().collect::<Vec<i32>>());

    // The raw protocol: a default first batch is 101 documents, getMore returns the rest.
    let first = db.run_command(doc! {"find": "c", "sort": {"_id": 1}}).await.expect("find");
    let cursor = first.get_document("cursor").expect("cursor");
    assert_eq!(cursor.get_str("ns").ok(), Some("test.c"));
    assert_eq!(cursor.get_array("firstBatch").expect("firstBatch").len(), 101);
    let id = cursor.get_i64("id").expect("cursor id is int64");
    assert_ne!(id, 0);
    let more = db.run_command(doc! {"getMore": id, "collection": "c"}).await.expect("getMore");
    let cursor = more.get_document("cursor").expect("cursor");
    assert_eq!(cursor.get_array("nextBatch").expect("nextBatch").len(), 899);
    assert_eq!(cursor.get_i64("id").ok(), Some(0), "exhausted cursor reports id 0");
    assert_eq!(cursor.get_str("ns").ok(), Some("test.c"));
    // An exhausted cursor is gone.
    assert_code_name(db.run_command(doc! {"getMore": id, "collection": "c"}).await, 43, "CursorNotFound");

    // batchSize 7 then getMore batchSize 7, then killCursors.
    let first = db.run_command(doc! {"find": "c", "batchSize": 7}).await.expect("find");
    let cursor = first.get_document("cursor").expect("cursor");
    assert_eq!(cursor.get_array("firstBatch").expect("firstBatch").len(), 7);
    let id = cursor.get_i64("id").expect("id");
    let more = db.run_command(doc! {"getMore": id, "collection": "c", "batchSize": 7}).await.expect("getMore");
    assert_eq!(more.get_document("cursor").and_then(|c| c.get_array("nextBatch")).map(|b| b.len()).ok(), Some(7));
    let killed = db.run_command(doc! {"killCursors": "c", "cursors": [id]}).await.expect("killCursors");
    assert_eq!(killed.get_array("cursorsKilled").ok(), Some(&vec![Bson::Int64(id)]), "{killed:?}");
    assert_code(db.run_command(doc! {"getMore": id, "collection": "c"}).await, 43);
    let killed = db.run_command(doc! {"killCursors": "c", "cursors": [id]}).await.expect("killCursors again");
    assert_eq!(killed.get_array("cursorsNotFound").ok(), Some(&vec![Bson::Int64(id)]), "{killed:?}");

    // batchSize 0: empty first batch, open cursor.
    let first = db.run_command(doc! {"find": "c", "batchSize": 0}).await.expect("find");
    let cursor = first.get_document("cursor").expect("cursor");
    assert!(cursor.get_array("firstBatch").expect("firstBatch").is_empty());
    assert_ne!(cursor.get_i64("id").expect("id"), 0);
    // singleBatch closes the cursor after the first batch.
    let first = db.run_command(doc! {"find": "c", "batchSize": 5, "singleBatch": true}).await.expect("find");
    assert_eq!(first.get_document("cursor").and_then(|c| c.get_i64("id")).ok(), Some(0));
}

#[tokio::test]
async fn count_estimated_and_distinct() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    seed(&coll, 20).await;
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 20);
    assert_eq!(coll.count_documents(doc! {"a": 0}).await.expect("count"), 7);
    assert_eq!(coll.count_documents(doc! {"a": 0}).skip(2).limit(3).await.expect("count"), 3);
    assert_eq!(coll.count_documents(doc! {"a": 0}).skip(6).await.expect("count"), 1);
    assert_eq!(coll.estimated_document_count().await.expect("estimated"), 20);
    let raw = db.run_command(doc! {"count": "c", "query": {"a": 1}}).await.expect("count command");
    assert_eq!(num_field(&raw, "n"), 7.0);

    let missing = db.collection::<Document>("missing");
    assert_eq!(missing.count_documents(doc! {}).await.expect("count missing"), 0);
    assert_eq!(missing.estimated_document_count().await.expect("estimated missing"), 0);
    assert!(missing.distinct("a", doc! {}).await.expect("distinct missing").is_empty());

    let mut d = coll.distinct("a", doc! {}).await.expect("distinct");
    d.sort_by(|x, y| num(x).partial_cmp(&num(y)).unwrap_or(std::cmp::Ordering::Equal));
    assert_eq!(d, vec![Bson::Int32(0), Bson::Int32(1), Bson::Int32(2)]);
    let d = coll.distinct("a", doc! {"b": {"$gt": 17}}).await.expect("distinct filtered");
    let mut d: Vec<i32> = d.iter().filter_map(|v| v.as_i32()).collect();
    d.sort();
    assert_eq!(d, vec![0, 1]);
    // Arrays are unwound one level.
    let arr = db.collection::<Document>("arr");
    arr.insert_many(vec![doc! {"x": [1, 2]}, doc! {"x": 2}, doc! {"x": [3, [4]]}, doc! {"y": 1}]).await.expect("insert");
    let mut got: Vec<String> = arr.distinct("x", doc! {}).await.expect("distinct").iter().map(|v| format!("{v}")).collect();
    got.sort();
    assert_eq!(got, vec!["1", "2", "3", "[4]"]);
    let mut nested: Vec<String> = coll.distinct("sub.x", doc! {"b": {"$lt": 3}}).await.expect("distinct").iter().map(|v| format!("{v}")).collect();
    nested.sort();
    assert_eq!(nested, vec!["0", "1", "2"]);
}

// ---------------------------------------------------------------- updates

#[tokio::test]
async fn update_operators() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "a": 1, "b": "x", "arr": [1, 2, 3], "n": {"m": 5}, "f": 2.5}).await.expect("seed");
    let get = || async { coll.find_one(doc! {"_id": 1}).await.expect("find").expect("present") };

    let r = coll
        .update_one(doc! {"_id": 1}, doc! {"$inc": {"a": 2}, "$set": {"n.m": 6, "n.new": true}, "$unset": {"b": ""}, "$push": {"arr": 4}, "$mul": {"f": 2}})
        .await
        .expect("update");
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    assert!(r.upserted_id.is_none());
    let d = get().await;
    assert_eq!(d.get("a"), Some(&Bson::Int32(3)), "int32 + int32 stays int32: {d:?}");
    assert_eq!(d.get_document("n").ok(), Some(&doc! {"m": 6, "new": true}));
    assert!(d.get("b").is_none());
    assert_eq!(d.get_array("arr").ok(), Some(&vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(3), Bson::Int32(4)]));
    assert_eq!(d.get("f"), Some(&Bson::Double(5.0)));

    coll.update_one(doc! {"_id": 1}, doc! {"$addToSet": {"arr": {"$each": [4, 5]}}}).await.expect("addToSet");
    assert_eq!(get().await.get_array("arr").map(|a| a.len()).ok(), Some(5));
    coll.update_one(doc! {"_id": 1}, doc! {"$pull": {"arr": {"$gte": 4}}}).await.expect("pull");
    assert_eq!(get().await.get_array("arr").ok(), Some(&vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(3)]));
    coll.update_one(doc! {"_id": 1}, doc! {"$pop": {"arr": 1}}).await.expect("pop last");
    coll.update_one(doc! {"_id": 1}, doc! {"$pop": {"arr": -1}}).await.expect("pop first");
    assert_eq!(get().await.get_array("arr").ok(), Some(&vec![Bson::Int32(2)]));
    coll.update_one(doc! {"_id": 1}, doc! {"$push": {"arr": {"$each": [5, 1, 4], "$sort": 1, "$slice": 3}}}).await.expect("push each sort slice");
    assert_eq!(get().await.get_array("arr").ok(), Some(&vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(4)]));
    coll.update_one(doc! {"_id": 1}, doc! {"$rename": {"a": "alpha"}}).await.expect("rename");
    let d = get().await;
    assert!(d.get("a").is_none());
    assert_eq!(d.get_i32("alpha").ok(), Some(3));
    coll.update_one(doc! {"_id": 1}, doc! {"$min": {"alpha": 1}}).await.expect("min");
    assert_eq!(get().await.get_i32("alpha").ok(), Some(1));
    coll.update_one(doc! {"_id": 1}, doc! {"$max": {"alpha": 10}}).await.expect("max");
    assert_eq!(get().await.get_i32("alpha").ok(), Some(10));
    coll.update_one(doc! {"_id": 1}, doc! {"$currentDate": {"ts": true}, "$inc": {"fresh": 1}}).await.expect("currentDate");
    let d = get().await;
    assert!(matches!(d.get("ts"), Some(Bson::DateTime(_))), "{d:?}");
    assert_eq!(d.get_i32("fresh").ok(), Some(1), "$inc creates a missing field");

    // A no-op update matches but does not modify.
    let r = coll.update_one(doc! {"_id": 1}, doc! {"$set": {"alpha": 10}}).await.expect("noop");
    assert_eq!((r.matched_count, r.modified_count), (1, 0));
    // No match.
    let r = coll.update_one(doc! {"_id": 999}, doc! {"$set": {"x": 1}}).await.expect("no match");
    assert_eq!((r.matched_count, r.modified_count), (0, 0));

    // update_many touches every match.
    coll.insert_many((2..=5).map(|i| doc! {"_id": i, "g": i % 2}).collect::<Vec<_>>()).await.expect("insert");
    let r = coll.update_many(doc! {"g": 0}, doc! {"$set": {"even": true}}).await.expect("update_many");
    assert_eq!((r.matched_count, r.modified_count), (2, 2));
    assert_eq!(coll.count_documents(doc! {"even": true}).await.expect("count"), 2);
}

#[tokio::test]
async fn upserts() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    let r = coll.update_one(doc! {"k": "x"}, doc! {"$set": {"v": 1}, "$setOnInsert": {"created": true}}).upsert(true).await.expect("upsert insert");
    assert_eq!((r.matched_count, r.modified_count), (0, 0));
    let id = r.upserted_id.expect("upserted id");
    assert!(id.as_object_id().is_some(), "generated _id is an ObjectId: {id:?}");
    let d = coll.find_one(doc! {"_id": id.clone()}).await.expect("find").expect("upserted");
    assert_eq!(d, doc! {"_id": id.clone(), "k": "x", "v": 1, "created": true});

    // Second upsert matches; $setOnInsert is not applied again.
    let r = coll.update_one(doc! {"k": "x"}, doc! {"$set": {"v": 1}, "$setOnInsert": {"created": false}}).upsert(true).await.expect("upsert match");
    assert_eq!((r.matched_count, r.modified_count), (1, 0));
    assert!(r.upserted_id.is_none());
    assert_eq!(coll.find_one(doc! {"k": "x"}).await.expect("find").expect("doc").get_bool("created").ok(), Some(true));

    // An _id equality in the filter becomes the new document's _id.
    let r = coll.update_one(doc! {"_id": 42, "q": {"$gt": 5}}, doc! {"$inc": {"n": 1}}).upsert(true).await.expect("upsert");
    assert_eq!(r.upserted_id, Some(Bson::Int32(42)));
    assert_eq!(coll.find_one(doc! {"_id": 42}).await.expect("find").expect("doc"), doc! {"_id": 42, "n": 1});

    let r = coll.update_many(doc! {"group": "g"}, doc! {"$set": {"m": true}}).upsert(true).await.expect("update_many upsert");
    assert!(r.upserted_id.is_some());
    assert_eq!(coll.count_documents(doc! {"group": "g", "m": true}).await.expect("count"), 1);

    // Replacement upserts insert the replacement; filter fields other than _id are not copied.
    let r = coll.replace_one(doc! {"x": 9}, doc! {"y": 1}).upsert(true).await.expect("replace upsert");
    let id = r.upserted_id.expect("upserted");
    let d = coll.find_one(doc! {"_id": id.clone()}).await.expect("find").expect("doc");
    assert_eq!(d, doc! {"_id": id, "y": 1});
}

#[tokio::test]
async fn array_filters_and_positional_operators() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "grades": [95, 102, 90, 150], "students": [{"name": "a", "score": 5}, {"name": "b", "score": 9}]}).await.expect("seed");
    let get = || async { coll.find_one(doc! {"_id": 1}).await.expect("find").expect("present") };

    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"grades.$[el]": 100}}).array_filters(vec![doc! {"el": {"$gte": 100}}]).await.expect("arrayFilters");
    assert_eq!(get().await.get_array("grades").ok(), Some(&vec![Bson::Int32(95), Bson::Int32(100), Bson::Int32(90), Bson::Int32(100)]));
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"students.$[s].score": 1}})
        .array_filters(vec![doc! {"s.score": {"$gt": 6}}])
        .await
        .expect("nested arrayFilters");
    let d = get().await;
    assert_eq!(d.get_array("students").ok(), Some(&vec![Bson::Document(doc! {"name": "a", "score": 5}), Bson::Document(doc! {"name": "b", "score": 10})]));
    coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"grades.$[]": 1}}).await.expect("all positional");
    assert_eq!(get().await.get_array("grades").ok(), Some(&vec![Bson::Int32(96), Bson::Int32(101), Bson::Int32(91), Bson::Int32(101)]));
    coll.update_one(doc! {"_id": 1, "grades": 91}, doc! {"$set": {"grades.$": 0}}).await.expect("positional $");
    assert_eq!(get().await.get_array("grades").ok(), Some(&vec![Bson::Int32(96), Bson::Int32(101), Bson::Int32(0), Bson::Int32(101)]));
    coll.update_one(doc! {"_id": 1, "students.name": "a"}, doc! {"$set": {"students.$.score": 50}}).await.expect("positional $ in docs");
    assert_eq!(path(&get().await, "students").and_then(|s| s.as_array()).and_then(|a| a[0].as_document()).and_then(|s| s.get_i32("score").ok()), Some(50));
    // An array filter identifier that is not used in the update is an error (FailedToParse, 9).
    assert_code(coll.update_one(doc! {"_id": 1}, doc! {"$set": {"grades.$[el]": 1}}).array_filters(vec![doc! {"el": 1}, doc! {"unused": 1}]).await, 9);
    // Positional operator without a matching array in the query: BadValue (2).
    assert_code(coll.update_one(doc! {"_id": 1}, doc! {"$set": {"grades.$": 1}}).await, 2);
}

#[tokio::test]
async fn pipeline_updates() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_many(vec![doc! {"_id": 1, "a": 2, "b": 3}, doc! {"_id": 2, "a": 10, "b": 1}]).await.expect("seed");
    let r = coll.update_one(doc! {"_id": 1}, vec![doc! {"$set": {"total": {"$add": ["$a", "$b"]}}}, doc! {"$unset": ["a"]}]).await.expect("pipeline update");
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    assert_same(&coll.find_one(doc! {"_id": 1}).await.expect("find").expect("doc"), &doc! {"_id": 1, "b": 3, "total": 5});
    coll.update_many(doc! {}, vec![doc! {"$set": {"big": {"$cond": [{"$gt": ["$b", 2]}, true, false]}}}]).await.expect("pipeline update_many");
    let got = collect(coll.find(doc! {}).sort(doc! {"_id": 1}).projection(doc! {"big": 1}).await.expect("find")).await;
    assert_eq!(got, vec![doc! {"_id": 1, "big": true}, doc! {"_id": 2, "big": false}]);
    // $replaceWith inside an update pipeline.
    coll.update_one(doc! {"_id": 2}, vec![doc! {"$replaceWith": {"_id": "$_id", "sum": {"$add": ["$a", "$b"]}}}]).await.expect("replaceWith");
    assert_same(&coll.find_one(doc! {"_id": 2}).await.expect("find").expect("doc"), &doc! {"_id": 2, "sum": 11});
}

#[tokio::test]
async fn replace_one_and_update_errors() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"_id": 1, "a": 1, "b": 2, "s": "str"}).await.expect("seed");
    let r = coll.replace_one(doc! {"_id": 1}, doc! {"c": 3}).await.expect("replace");
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    assert_same(&coll.find_one(doc! {"_id": 1}).await.expect("find").expect("doc"), &doc! {"_id": 1, "c": 3});
    coll.update_one(doc! {"_id": 1}, doc! {"$set": {"s": "str"}}).await.expect("set s");

    // _id is immutable (ImmutableField, 66).
    assert_code_name(coll.replace_one(doc! {"_id": 1}, doc! {"_id": 2, "c": 1}).await, 66, "ImmutableField");
    assert_code_name(coll.update_one(doc! {"_id": 1}, doc! {"$set": {"_id": 5}}).await, 66, "ImmutableField");
    // $inc on a string (TypeMismatch, 14).
    assert_code_name(coll.update_one(doc! {"_id": 1}, doc! {"$inc": {"s": 1}}).await, 14, "TypeMismatch");
    // Two operators on one path (ConflictingUpdateOperators, 40).
    assert_code_name(coll.update_one(doc! {"_id": 1}, doc! {"$set": {"c": 1}, "$inc": {"c": 1}}).await, 40, "ConflictingUpdateOperators");
    // Unknown modifier (FailedToParse, 9), sent raw because the driver checks for '$'.
    let db = client.database("test");
    let reply = db.run_command(doc! {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$foo": {"c": 1}}}]}).await;
    let reply = reply.expect("update command reports write errors in the reply");
    let e = reply.get_array("writeErrors").expect("writeErrors")[0].as_document().expect("doc").clone();
    assert_eq!(num_field(&e, "code"), 9.0, "{e:?}");
    assert!(e.get_str("errmsg").unwrap_or_default().contains("Unknown modifier: $foo"), "{e:?}");
    // Nothing above changed the document.
    assert_eq!(coll.find_one(doc! {"_id": 1}).await.expect("find").expect("doc"), doc! {"_id": 1, "c": 3, "s": "str"});
    // The driver refuses an operator document as a replacement before sending anything.
    assert!(coll.replace_one(doc! {"_id": 1}, doc! {"$set": {"c": 1}}).await.is_err());
}

#[tokio::test]
async fn deletes() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    seed(&coll, 20).await;
    let r = coll.delete_one(doc! {"a": 0}).await.expect("delete_one");
    assert_eq!(r.deleted_count, 1);
    assert_eq!(coll.count_documents(doc! {"a": 0}).await.expect("count"), 6);
    let r = coll.delete_many(doc! {"a": 1}).await.expect("delete_many");
    assert_eq!(r.deleted_count, 7);
    let r = coll.delete_many(doc! {"a": 1}).await.expect("delete_many none");
    assert_eq!(r.deleted_count, 0);
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 12);
    let r = coll.delete_many(doc! {}).await.expect("delete all");
    assert_eq!(r.deleted_count, 12);
    assert_eq!(coll.estimated_document_count().await.expect("count"), 0);
    // Raw delete reply with limit 1.
    coll.insert_many(vec![doc! {"z": 1}, doc! {"z": 1}]).await.expect("insert");
    let reply = client.database("test").run_command(doc! {"delete": "c", "deletes": [{"q": {"z": 1}, "limit": 1}]}).await.expect("delete cmd");
    assert_eq!(num_field(&reply, "n"), 1.0);
    assert_eq!(num_field(&reply, "ok"), 1.0);
}

#[tokio::test]
async fn find_one_and_modify_variants() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    coll.insert_many(vec![doc! {"_id": 1, "n": 1}, doc! {"_id": 2, "n": 2}, doc! {"_id": 3, "n": 3}]).await.expect("seed");

    let before = coll.find_one_and_update(doc! {"_id": 1}, doc! {"$inc": {"n": 10}}).await.expect("fam").expect("found");
    assert_eq!(before, doc! {"_id": 1, "n": 1}, "default returns the document before the update");
    let after = coll
        .find_one_and_update(doc! {"_id": 1}, doc! {"$inc": {"n": 10}})
        .return_document(ReturnDocument::After)
        .projection(doc! {"_id": 0})
        .await
        .expect("fam after")
        .expect("found");
    assert_eq!(after, doc! {"n": 21});
    assert!(coll.find_one_and_update(doc! {"_id": 99}, doc! {"$set": {"x": 1}}).await.expect("fam none").is_none());
    let up = coll
        .find_one_and_update(doc! {"_id": 7}, doc! {"$set": {"x": 1}})
        .upsert(true)
        .return_document(ReturnDocument::After)
        .await
        .expect("fam upsert")
        .expect("upserted doc returned");
    assert_eq!(up, doc! {"_id": 7, "x": 1});
    let none = coll.find_one_and_update(doc! {"_id": 8}, doc! {"$set": {"x": 1}}).upsert(true).await.expect("fam upsert before");
    assert!(none.is_none(), "upsert with returnDocument before returns null");
    assert_eq!(coll.count_documents(doc! {"_id": 8}).await.expect("count"), 1);

    let replaced = coll.find_one_and_replace(doc! {"_id": 2}, doc! {"z": 1}).return_document(ReturnDocument::After).await.expect("far").expect("found");
    assert_same(&replaced, &doc! {"_id": 2, "z": 1});
    let old = coll.find_one_and_replace(doc! {"_id": 2}, doc! {"z": 2}).await.expect("far before").expect("found");
    assert_eq!(old, doc! {"_id": 2, "z": 1});

    let deleted = coll.find_one_and_delete(doc! {"n": {"$exists": true}}).sort(doc! {"n": -1}).await.expect("fad").expect("found");
    assert_eq!(deleted, doc! {"_id": 1, "n": 21});
    assert_eq!(coll.count_documents(doc! {"_id": 1}).await.expect("count"), 0);
    assert!(coll.find_one_and_delete(doc! {"_id": 1}).await.expect("fad none").is_none());

    // Raw reply shape.
    let reply = db.run_command(doc! {"findAndModify": "c", "query": {"_id": 3}, "update": {"$set": {"n": 30}}}).await.expect("findAndModify");
    let leo = reply.get_document("lastErrorObject").expect("lastErrorObject");
    assert_eq!(num_field(leo, "n"), 1.0);
    assert_eq!(leo.get_bool("updatedExisting").ok(), Some(true));
    assert_eq!(reply.get_document("value").ok(), Some(&doc! {"_id": 3, "n": 3}));
    let reply =
        db.run_command(doc! {"findAndModify": "c", "query": {"_id": 50}, "update": {"$set": {"n": 1}}, "upsert": true, "new": true}).await.expect("fam upsert");
    let leo = reply.get_document("lastErrorObject").expect("lastErrorObject");
    assert_eq!(leo.get_bool("updatedExisting").ok(), Some(false));
    assert_eq!(leo.get("upserted"), Some(&Bson::Int32(50)));
    assert_eq!(reply.get_document("value").ok(), Some(&doc! {"_id": 50, "n": 1}));
    let reply = db.run_command(doc! {"findAndModify": "c", "query": {"_id": 404}, "remove": true}).await.expect("fam remove none");
    assert_eq!(reply.get("value"), Some(&Bson::Null));
    assert_eq!(reply.get_document("lastErrorObject").map(|l| num_field(l, "n")).ok(), Some(0.0));
}

// ---------------------------------------------------------------- aggregation

async fn sales(client: &mongodb::Client) -> Collection<Document> {
    let coll = client.database("test").collection::<Document>("sales");
    coll.insert_many(vec![
        doc! {"_id": 1, "item": "a", "price": 10, "qty": 2, "tags": ["x", "y"]},
        doc! {"_id": 2, "item": "b", "price": 20, "qty": 1, "tags": ["x"]},
        doc! {"_id": 3, "item": "a", "price": 5, "qty": 10, "tags": []},
        doc! {"_id": 4, "item": "c", "price": 7, "qty": 3},
    ])
    .await
    .expect("seed sales");
    coll
}

async fn agg(coll: &Collection<Document>, pipeline: Vec<Document>) -> Vec<Document> {
    collect(coll.aggregate(pipeline).await.expect("aggregate")).await
}

#[tokio::test]
async fn aggregate_stages() {
    let server = Server::start();
    let client = server.client().await;
    let coll = sales(&client).await;

    let got = agg(&coll, vec![doc! {"$match": {"price": {"$gte": 7}}}, doc! {"$sort": {"_id": 1}}]).await;
    assert_eq!(ids(&got), vec![1, 2, 4]);

    let got = agg(
        &coll,
        vec![
            doc! {"$sort": {"_id": 1}},
            doc! {"$group": {
                "_id": "$item",
                "total": {"$sum": {"$multiply": ["$price", "$qty"]}},
                "count": {"$sum": 1},
                "avgPrice": {"$avg": "$price"},
                "maxQty": {"$max": "$qty"},
                "minQty": {"$min": "$qty"},
                "ids": {"$push": "$_id"},
                "first": {"$first": "$_id"},
                "last": {"$last": "$_id"},
                "items": {"$addToSet": "$item"},
            }},
            doc! {"$sort": {"total": -1}},
        ],
    )
    .await;
    assert_same_all(
        &got,
        &[
            doc! {"_id": "a", "total": 70, "count": 2, "avgPrice": 7.5, "maxQty": 10, "minQty": 2, "ids": [1, 3], "first": 1, "last": 3, "items": ["a"]},
            doc! {"_id": "c", "total": 21, "count": 1, "avgPrice": 7.0, "maxQty": 3, "minQty": 3, "ids": [4], "first": 4, "last": 4, "items": ["c"]},
            doc! {"_id": "b", "total": 20, "count": 1, "avgPrice": 20.0, "maxQty": 1, "minQty": 1, "ids": [2], "first": 2, "last": 2, "items": ["b"]},
        ],
    );

    let got = agg(&coll, vec![doc! {"$group": {"_id": null, "n": {"$sum": "$qty"}}}]).await;
    assert_eq!(got, vec![doc! {"_id": null, "n": 16}]);

    let got = agg(&coll, vec![doc! {"$sort": {"_id": 1}}, doc! {"$project": {"_id": 0, "item": 1, "revenue": {"$multiply": ["$price", "$qty"]}}}]).await;
    assert_eq!(got[0], doc! {"item": "a", "revenue": 20});
    assert_eq!(got.len(), 4);

    let got = agg(&coll, vec![doc! {"$unwind": "$tags"}, doc! {"$sort": {"_id": 1, "tags": 1}}, doc! {"$project": {"tags": 1}}]).await;
    assert_eq!(got, vec![doc! {"_id": 1, "tags": "x"}, doc! {"_id": 1, "tags": "y"}, doc! {"_id": 2, "tags": "x"}]);
    let got = agg(
        &coll,
        vec![
            doc! {"$unwind": {"path": "$tags", "preserveNullAndEmptyArrays": true, "includeArrayIndex": "idx"}},
            doc! {"$sort": {"_id": 1, "idx": 1}},
            doc! {"$project": {"tags": 1, "idx": 1}},
        ],
    )
    .await;
    assert_eq!(got.len(), 5, "{got:?}");
    assert_eq!(got[1].get("tags"), Some(&Bson::String("y".into())));
    assert_eq!(got[1].get("idx").and_then(num), Some(1.0));
    // Empty array and missing field: kept, without the field, with a null index.
    assert_eq!(got[3], doc! {"_id": 3, "idx": null});
    assert_eq!(got[4], doc! {"_id": 4, "idx": null});

    let got = agg(&coll, vec![doc! {"$match": {"price": {"$gt": 6}}}, doc! {"$count": "n"}]).await;
    assert_eq!(got, vec![doc! {"n": 3}]);
    // $count over nothing produces no document at all.
    let got = agg(&coll, vec![doc! {"$match": {"price": {"$gt": 1000}}}, doc! {"$count": "n"}]).await;
    assert!(got.is_empty(), "{got:?}");

    let got = agg(&coll, vec![doc! {"$sort": {"price": 1}}, doc! {"$skip": 1}, doc! {"$limit": 2}, doc! {"$project": {"_id": 1}}]).await;
    assert_eq!(ids(&got), vec![4, 1]);

    let got = agg(
        &coll,
        vec![doc! {"$match": {"_id": 1}}, doc! {"$addFields": {"rev": {"$multiply": ["$price", "$qty"]}, "sub.deep": 1}}, doc! {"$unset": ["tags", "qty"]}],
    )
    .await;
    assert_eq!(got, vec![doc! {"_id": 1, "item": "a", "price": 10, "rev": 20, "sub": {"deep": 1}}]);
    let got = agg(&coll, vec![doc! {"$match": {"_id": 2}}, doc! {"$unset": "tags"}, doc! {"$set": {"x": {"$concat": ["$item", "-", "z"]}}}]).await;
    assert_eq!(got, vec![doc! {"_id": 2, "item": "b", "price": 20, "qty": 1, "x": "b-z"}]);

    // Aggregating a missing collection yields nothing.
    let missing = client.database("test").collection::<Document>("nope");
    assert!(agg(&missing, vec![doc! {"$match": {}}]).await.is_empty());

    // Errors.
    assert_code(coll.aggregate(vec![doc! {"$foo": 1}]).await.map(|_| ()), 40324);
    assert_code(coll.aggregate(vec![doc! {"$group": {"total": {"$sum": 1}}}]).await.map(|_| ()), 15955);
}

#[tokio::test]
async fn aggregate_cursor_batches() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    coll.insert_many((0..1000).map(|i| doc! {"_id": i, "g": i % 10}).collect::<Vec<_>>()).await.expect("insert");
    let got = collect(coll.aggregate(vec![doc! {"$sort": {"_id": 1}}]).batch_size(7).await.expect("aggregate")).await;
    assert_eq!(ids(&got), (0..1000).collect::<Vec<i32>>());

    let first = db.run_command(doc! {"aggregate": "c", "pipeline": [{"$sort": {"_id": -1}}], "cursor": {"batchSize": 0}}).await.expect("aggregate raw");
    let cursor = first.get_document("cursor").expect("cursor");
    assert!(cursor.get_array("firstBatch").expect("firstBatch").is_empty());
    assert_eq!(cursor.get_str("ns").ok(), Some("test.c"));
    let id = cursor.get_i64("id").expect("id");
    assert_ne!(id, 0);
    let more = db.run_command(doc! {"getMore": id, "collection": "c", "batchSize": 3}).await.expect("getMore");
    let batch = more.get_document("cursor").and_then(|c| c.get_array("nextBatch")).expect("nextBatch").clone();
    let batch_ids: Vec<i32> = batch.iter().filter_map(|d| d.as_document()).filter_map(|d| d.get_i32("_id").ok()).collect();
    assert_eq!(batch_ids, vec![999, 998, 997]);
    // aggregate without a cursor option is an error in 3.6+ (FailedToParse, 9).
    assert_code(db.run_command(doc! {"aggregate": "c", "pipeline": []}).await, 9);

    let got = collect(coll.aggregate(vec![doc! {"$group": {"_id": "$g", "n": {"$sum": 1}}}, doc! {"$sort": {"_id": 1}}]).await.expect("group")).await;
    assert_eq!(got.len(), 10);
    assert!(got.iter().all(|d| d.get_i32("n").ok() == Some(100)), "{got:?}");
}

// ---------------------------------------------------------------- catalog

#[tokio::test]
async fn list_and_drop_databases() {
    let server = Server::start();
    let client = server.client().await;
    client.database("alpha_db").collection::<Document>("c").insert_one(doc! {"x": 1}).await.expect("insert alpha");
    client.database("beta_db").collection::<Document>("c").insert_one(doc! {"x": 1}).await.expect("insert beta");
    let names = client.list_database_names().await.expect("names");
    assert!(names.contains(&"alpha_db".to_string()) && names.contains(&"beta_db".to_string()), "{names:?}");
    let specs = client.list_databases().await.expect("list_databases");
    let alpha = specs.iter().find(|s| s.name == "alpha_db").expect("alpha listed");
    assert!(!alpha.empty);

    let raw = client.database("admin").run_command(doc! {"listDatabases": 1}).await.expect("raw");
    assert!(raw.get_array("databases").is_ok());
    assert!(raw.get("totalSize").and_then(num).is_some(), "{raw:?}");
    assert!(raw.get("totalSizeMb").and_then(num).is_some(), "{raw:?}");
    let only = client.database("admin").run_command(doc! {"listDatabases": 1, "nameOnly": true, "filter": {"name": "alpha_db"}}).await.expect("filtered");
    assert_eq!(only.get_array("databases").ok(), Some(&vec![Bson::Document(doc! {"name": "alpha_db"})]), "{only:?}");
    let drop = client.database("beta_db").run_command(doc! {"dropDatabase": 1}).await.expect("dropDatabase");
    assert_eq!(drop.get_str("dropped").ok(), Some("beta_db"), "{drop:?}");
    let names = client.list_database_names().await.expect("names");
    assert!(!names.contains(&"beta_db".to_string()), "{names:?}");
    assert!(client.database("beta_db").list_collection_names().await.expect("list").is_empty());
    // Dropping a missing database succeeds.
    client.database("never_db").drop().await.expect("drop missing db");
    client.database("alpha_db").drop().await.expect("drop alpha");
    assert!(!client.list_database_names().await.expect("names").contains(&"alpha_db".to_string()));
}

#[tokio::test]
async fn list_create_drop_collections() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    db.create_collection("c1").await.expect("create c1");
    db.collection::<Document>("c2").insert_one(doc! {"x": 1}).await.expect("implicit create c2");
    let mut names = db.list_collection_names().await.expect("names");
    names.sort();
    assert_eq!(names, vec!["c1", "c2"]);

    let raw = db.run_command(doc! {"listCollections": 1, "filter": {"name": "c1"}}).await.expect("listCollections");
    let cursor = raw.get_document("cursor").expect("cursor");
    assert_eq!(cursor.get_i64("id").ok(), Some(0));
    assert_eq!(cursor.get_str("ns").ok(), Some("test.$cmd.listCollections"));
    let batch = cursor.get_array("firstBatch").expect("firstBatch");
    assert_eq!(batch.len(), 1);
    let spec = batch[0].as_document().expect("spec");
    assert_eq!(spec.get_str("name").ok(), Some("c1"));
    assert_eq!(spec.get_str("type").ok(), Some("collection"));
    assert_eq!(spec.get_document("options").ok(), Some(&doc! {}));
    let info = spec.get_document("info").expect("info");
    assert_eq!(info.get_bool("readOnly").ok(), Some(false));
    assert!(matches!(info.get("uuid"), Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid), "{info:?}");
    assert_eq!(spec.get_document("idIndex").ok(), Some(&doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"}));
    let name_only = db.run_command(doc! {"listCollections": 1, "nameOnly": true}).await.expect("nameOnly");
    for entry in name_only.get_document("cursor").and_then(|c| c.get_array("firstBatch")).expect("batch") {
        let d = entry.as_document().expect("doc");
        assert_eq!(keys(d), vec!["name", "type"], "{d:?}");
    }
    // The driver's typed listing.
    let mut cursor = db.list_collections().filter(doc! {"name": "c2"}).await.expect("list_collections");
    assert!(cursor.advance().await.expect("advance"));
    assert_eq!(cursor.deserialize_current().expect("spec").name, "c2");
    assert!(!cursor.advance().await.expect("advance"));

    assert_code_name(db.create_collection("c1").await, 48, "NamespaceExists");
    // Capped collections keep their options.
    db.create_collection("capped").capped(true).size(4096).await.expect("capped");
    let raw = db.run_command(doc! {"listCollections": 1, "filter": {"name": "capped"}}).await.expect("list");
    let opts = raw.get_document("cursor").and_then(|c| c.get_array("firstBatch")).expect("batch")[0]
        .as_document()
        .and_then(|d| d.get_document("options").ok())
        .cloned();
    let opts = opts.expect("options");
    assert_eq!(opts.get_bool("capped").ok(), Some(true), "{opts:?}");
    assert_eq!(opts.get("size").and_then(num), Some(4096.0), "{opts:?}");

    db.collection::<Document>("c1").drop().await.expect("drop c1");
    let mut names = db.list_collection_names().await.expect("names");
    names.sort();
    assert_eq!(names, vec!["c2", "capped"]);
    // 7.0: dropping a missing collection succeeds.
    let reply = db.run_command(doc! {"drop": "never"}).await.expect("drop missing collection");
    assert_eq!(num_field(&reply, "ok"), 1.0);
    let reply = db.run_command(doc! {"drop": "c2"}).await.expect("drop c2");
    assert_eq!(reply.get_str("ns").ok(), Some("test.c2"), "{reply:?}");
    assert!(reply.get("nIndexesWas").and_then(num).is_some(), "{reply:?}");
}

#[tokio::test]
async fn indexes() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    let reply = db.run_command(doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}]}).await.expect("createIndexes");
    assert_eq!(num_field(&reply, "numIndexesBefore"), 1.0, "{reply:?}");
    assert_eq!(num_field(&reply, "numIndexesAfter"), 2.0);
    assert_eq!(reply.get_bool("createdCollectionAutomatically").ok(), Some(true));
    let again = db.run_command(doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "a_1"}]}).await.expect("same index again");
    assert_eq!(num_field(&again, "numIndexesBefore"), 2.0);
    assert_eq!(num_field(&again, "numIndexesAfter"), 2.0);

    let name = coll.create_index(IndexModel::builder().keys(doc! {"a": 1, "b": -1}).build()).await.expect("compound").index_name;
    assert_eq!(name, "a_1_b_-1");
    let unique = IndexModel::builder().keys(doc! {"email": 1}).options(IndexOptions::builder().unique(true).name("email_uniq".to_string()).build()).build();
    coll.create_index(unique).await.expect("unique");

    let raw = db.run_command(doc! {"listIndexes": "c"}).await.expect("listIndexes");
    let cursor = raw.get_document("cursor").expect("cursor");
    assert_eq!(cursor.get_str("ns").ok(), Some("test.c"));
    let batch: Vec<Document> = cursor.get_array("firstBatch").expect("batch").iter().filter_map(|b| b.as_document().cloned()).collect();
    assert_eq!(
        batch,
        vec![
            doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"},
            doc! {"v": 2, "key": {"a": 1}, "name": "a_1"},
            doc! {"v": 2, "key": {"a": 1, "b": -1}, "name": "a_1_b_-1"},
            doc! {"v": 2, "key": {"email": 1}, "name": "email_uniq", "unique": true},
        ]
    );
    let mut names = coll.list_index_names().await.expect("names");
    names.sort();
    assert_eq!(names, vec!["_id_", "a_1", "a_1_b_-1", "email_uniq"]);

    // The unique index is enforced; a missing field counts as null, once.
    coll.insert_one(doc! {"email": "x"}).await.expect("first x");
    assert_code(coll.insert_one(doc! {"email": "x"}).await, 11000);
    coll.insert_one(doc! {"other": 1}).await.expect("first null");
    assert_code(coll.insert_one(doc! {"other": 2}).await, 11000);
    // Building a unique index over duplicate data fails (DuplicateKey).
    coll.insert_many(vec![doc! {"d": 1, "email": "d1"}, doc! {"d": 1, "email": "d2"}]).await.expect("dups");
    let dup_index = IndexModel::builder().keys(doc! {"d": 1}).options(IndexOptions::builder().unique(true).build()).build();
    assert_code(coll.create_index(dup_index).await, 11000);
    // Same name, other key: IndexKeySpecsConflict (86). Same key, other name: IndexOptionsConflict (85).
    assert_code(db.run_command(doc! {"createIndexes": "c", "indexes": [{"key": {"zz": 1}, "name": "a_1"}]}).await, 86);
    assert_code(db.run_command(doc! {"createIndexes": "c", "indexes": [{"key": {"a": 1}, "name": "other"}]}).await, 85);

    let reply = db.run_command(doc! {"dropIndexes": "c", "index": "a_1"}).await.expect("dropIndexes");
    assert_eq!(num_field(&reply, "nIndexesWas"), 4.0, "{reply:?}");
    assert_code_name(db.run_command(doc! {"dropIndexes": "c", "index": "a_1"}).await, 27, "IndexNotFound");
    assert_code_name(db.run_command(doc! {"dropIndexes": "c", "index": "_id_"}).await, 72, "InvalidOptions");
    coll.drop_index("a_1_b_-1").await.expect("driver drop_index");
    db.run_command(doc! {"dropIndexes": "c", "index": "*"}).await.expect("drop all");
    assert_eq!(coll.list_index_names().await.expect("names"), vec!["_id_"]);
    assert_code_name(db.run_command(doc! {"listIndexes": "missing"}).await, 26, "NamespaceNotFound");
}

#[tokio::test]
async fn rename_collection() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let admin = client.database("admin");
    let src = db.collection::<Document>("src");
    src.insert_many(vec![doc! {"_id": 1, "a": 1}, doc! {"_id": 2, "a": 2}, doc! {"_id": 3, "a": 3}]).await.expect("seed");
    src.create_index(IndexModel::builder().keys(doc! {"a": 1}).build()).await.expect("index");

    admin.run_command(doc! {"renameCollection": "test.src", "to": "test.dst"}).await.expect("rename");
    let names = db.list_collection_names().await.expect("names");
    assert_eq!(names, vec!["dst"]);
    let dst = db.collection::<Document>("dst");
    assert_eq!(dst.count_documents(doc! {}).await.expect("count"), 3);
    let mut idx = dst.list_index_names().await.expect("index names");
    idx.sort();
    assert_eq!(idx, vec!["_id_", "a_1"], "indexes move with the collection");
    // Index still works after rename: a unique violation would not be caught otherwise, so check a query.
    assert_eq!(dst.find_one(doc! {"a": 2}).await.expect("find").and_then(|d| d.get_i32("_id").ok()), Some(2));

    assert_code_name(admin.run_command(doc! {"renameCollection": "test.src", "to": "test.x"}).await, 26, "NamespaceNotFound");
    db.collection::<Document>("other").insert_one(doc! {"_id": 9}).await.expect("other");
    assert_code_name(admin.run_command(doc! {"renameCollection": "test.dst", "to": "test.other"}).await, 48, "NamespaceExists");
    admin.run_command(doc! {"renameCollection": "test.dst", "to": "test.other", "dropTarget": true}).await.expect("dropTarget");
    let other = collect(db.collection::<Document>("other").find(doc! {}).sort(doc! {"_id": 1}).await.expect("find")).await;
    assert_eq!(ids(&other), vec![1, 2, 3]);
    // renameCollection may only run against the admin database.
    assert!(db.run_command(doc! {"renameCollection": "test.other", "to": "test.y"}).await.is_err());
    // Across databases works too.
    admin.run_command(doc! {"renameCollection": "test.other", "to": "test2.moved"}).await.expect("cross-db rename");
    assert_eq!(client.database("test2").collection::<Document>("moved").count_documents(doc! {}).await.expect("count"), 3);
}

// ---------------------------------------------------------------- errors

#[tokio::test]
async fn error_codes() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    coll.insert_one(doc! {"a": 1}).await.expect("seed");

    let e = assert_code_name(db.run_command(doc! {"foo": 1}).await, 59, "CommandNotFound");
    let mongodb::error::ErrorKind::Command(c) = e.kind.as_ref() else { panic!("{e:?}") };
    assert_eq!(c.message, "no such command: 'foo'");

    let e = assert_code_name(coll.find(doc! {"a": {"$foo": 1}}).await.map(|_| ()), 2, "BadValue");
    let mongodb::error::ErrorKind::Command(c) = e.kind.as_ref() else { panic!("{e:?}") };
    assert_eq!(c.message, "unknown operator: $foo");
    assert_code(coll.find(doc! {"$and": []}).await.map(|_| ()), 2);
    assert_code(coll.find(doc! {"a": {"$in": 5}}).await.map(|_| ()), 2);
    // Unknown top-level operator.
    assert_code(coll.find(doc! {"$bogus": 1}).await.map(|_| ()), 2);

    let e = assert_code_name(db.run_command(doc! {"getMore": 12345_i64, "collection": "c"}).await, 43, "CursorNotFound");
    let mongodb::error::ErrorKind::Command(c) = e.kind.as_ref() else { panic!("{e:?}") };
    assert!(c.message.contains("12345"), "{}", c.message);

    // Wrong field type in a command (TypeMismatch, 14).
    assert_code(db.run_command(doc! {"find": "c", "filter": 5}).await, 14);
    // Unknown field in a strict command (IDL: 40415).
    assert_code(db.run_command(doc! {"find": "c", "bogusField": 1}).await, 40415);
    // Errors carry ok:0, errmsg, code and codeName.
    let e = db.run_command(doc! {"foo": 1}).await.expect_err("error");
    let raw = e.server_response().expect("server response");
    let raw: Document = raw.try_into().expect("document");
    assert_eq!(num_field(&raw, "ok"), 0.0);
    assert!(raw.get_str("errmsg").is_ok() && raw.get_str("codeName").is_ok(), "{raw:?}");
}

#[tokio::test]
async fn max_time_ms_expired() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    coll.insert_many((0..200).map(|i| doc! {"_id": i}).collect::<Vec<_>>()).await.expect("seed");
    // 200 x 5000 = 1M documents through $unwind: far longer than 1 ms anywhere.
    let pipeline = vec![doc! {"$project": {"r": {"$range": [0, 5000]}}}, doc! {"$unwind": "$r"}, doc! {"$group": {"_id": null, "n": {"$sum": 1}}}];
    // Bound the wait so a server that ignores maxTimeMS fails instead of hanging the suite.
    let run = coll.aggregate(pipeline).max_time(Duration::from_millis(1));
    let r = tokio::time::timeout(Duration::from_secs(60), run).await.expect("server did not answer within 60 s: maxTimeMS ignored?");
    assert_code_name(r.map(|_| ()), 50, "MaxTimeMSExpired");
    let raw = db.run_command(doc! {"find": "c", "filter": {"$expr": {"$gt": [{"$size": {"$range": [0, 200000]}}, 0]}}, "maxTimeMS": 1}).await;
    assert_code(raw, 50);
    // The server keeps serving.
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 200);
}

// ---------------------------------------------------------------- sessions

#[tokio::test]
async fn sessions() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    let mut session = client.start_session().await.expect("start_session");
    assert!(matches!(session.id().get("id"), Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid));
    for i in 0..20 {
        coll.insert_one(doc! {"_id": i}).session(&mut session).await.expect("insert in session");
    }
    coll.update_one(doc! {"_id": 0}, doc! {"$set": {"s": true}}).session(&mut session).await.expect("update in session");
    assert_eq!(coll.count_documents(doc! {}).session(&mut session).await.expect("count in session"), 20);
    let mut cursor = coll.find(doc! {}).sort(doc! {"_id": 1}).batch_size(3).session(&mut session).await.expect("find in session");
    let mut seen = Vec::new();
    while cursor.advance(&mut session).await.expect("advance") {
        seen.push(cursor.deserialize_current().expect("doc").get_i32("_id").expect("_id"));
    }
    assert_eq!(seen, (0..20).collect::<Vec<i32>>());
    drop(cursor);
    let got = coll.find_one_and_delete(doc! {"_id": 0}).session(&mut session).await.expect("fad in session").expect("doc");
    assert_eq!(got, doc! {"_id": 0, "s": true});

    // Raw session commands.
    let admin = client.database("admin");
    let started = admin.run_command(doc! {"startSession": 1}).await.expect("startSession");
    let id = started.get_document("id").expect("id").clone();
    assert!(matches!(id.get("id"), Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid), "{started:?}");
    assert_eq!(num_field(&started, "timeoutMinutes"), 30.0);
    client.database("test").run_command(doc! {"find": "c", "filter": {}, "lsid": id.clone()}).await.expect("find with explicit lsid");
    admin.run_command(doc! {"endSessions": [id.clone()]}).await.expect("endSessions");
    admin.run_command(doc! {"refreshSessions": [session.id().clone()]}).await.expect("refreshSessions");

    // Transactions need a replica set: on a standalone they fail (IllegalOperation, 20, server side).
    if session.start_transaction().await.is_ok() {
        let r = coll.insert_one(doc! {"_id": 100}).session(&mut session).await;
        let e = r.expect_err("transactions are not supported by a standalone");
        if let Some(code) = error_code(&e) {
            assert_eq!(code, 20, "{e}");
        }
        let _ = session.abort_transaction().await;
    }
    assert_eq!(coll.count_documents(doc! {"_id": 100}).await.expect("count"), 0);
}

// ---------------------------------------------------------------- compression

#[tokio::test]
async fn compressors_round_trip() {
    let server = Server::start();
    for compressor in ["snappy", "zlib", "zstd"] {
        let client = server.client_with(&format!("compressors={compressor}")).await;
        let coll = client.database("test").collection::<Document>(compressor);
        let big = "abcdefghij".repeat(100_000); // 1 MB, very compressible
        coll.insert_one(doc! {"_id": "big", "payload": big.clone()}).await.expect("insert big");
        coll.insert_many((0..100).map(|i| doc! {"_id": i, "v": format!("small-{i}")}).collect::<Vec<_>>()).await.expect("insert small");
        let back = coll.find_one(doc! {"_id": "big"}).await.expect("find").expect("present");
        assert_eq!(back.get_str("payload").ok(), Some(big.as_str()), "{compressor}");
        let smalls = collect(coll.find(doc! {"_id": {"$type": "int"}}).sort(doc! {"_id": 1}).batch_size(9).await.expect("find")).await;
        assert_eq!(smalls.len(), 100, "{compressor}");
        assert_eq!(smalls[42].get_str("v").ok(), Some("small-42"));
        ping(&client).await.expect("ping");
    }
}

// ---------------------------------------------------------------- diagnostics

#[tokio::test]
async fn server_status_opcounters() {
    let server = Server::start();
    let client = server.client().await;
    let admin = client.database("admin");
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"warm": 1}).await.expect("warm up");
    let before = admin.run_command(doc! {"serverStatus": 1}).await.expect("serverStatus");
    let b = before.get_document("opcounters").expect("opcounters").clone();
    coll.insert_many((0..5).map(|i| doc! {"_id": i}).collect::<Vec<_>>()).await.expect("insert 5");
    collect(coll.find(doc! {}).await.expect("find")).await;
    coll.update_many(doc! {}, doc! {"$set": {"u": 1}}).await.expect("update");
    coll.delete_one(doc! {"_id": 0}).await.expect("delete");
    let after = admin.run_command(doc! {"serverStatus": 1}).await.expect("serverStatus");
    let a = after.get_document("opcounters").expect("opcounters");
    let delta = |k: &str| num_field(a, k) - num_field(&b, k);
    assert_eq!(delta("insert"), 5.0, "each inserted document counts: {b:?} -> {a:?}");
    assert_eq!(delta("query"), 1.0, "{b:?} -> {a:?}");
    assert_eq!(delta("update"), 1.0, "{b:?} -> {a:?}");
    assert_eq!(delta("delete"), 1.0, "{b:?} -> {a:?}");
    assert!(delta("command") >= 1.0, "serverStatus itself is a command: {b:?} -> {a:?}");
    assert!(a.get("getmore").and_then(num).is_some());

    assert!(after.get_str("version").unwrap_or_default().starts_with("7.0"), "{after:?}");
    assert_eq!(after.get_str("process").ok(), Some("mongod"));
    assert!(after.get_str("host").is_ok());
    assert!(after.get("uptime").and_then(num).is_some());
    assert!(after.get("pid").and_then(num).is_some());
    assert!(matches!(after.get("localTime"), Some(Bson::DateTime(_))));
    let conns = after.get_document("connections").expect("connections");
    assert!(num_field(conns, "current") >= 1.0);
    assert!(num_field(conns, "available") >= 1.0);
    assert!(num_field(conns, "totalCreated") >= 1.0);
    assert_eq!(num_field(&after, "ok"), 1.0);
}

#[tokio::test]
async fn db_stats_and_coll_stats() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("statsdb");
    let c = db.collection::<Document>("c");
    c.insert_many((0..10).map(|i| doc! {"_id": i, "a": i, "pad": "x".repeat(100)}).collect::<Vec<_>>()).await.expect("insert");
    c.create_index(IndexModel::builder().keys(doc! {"a": 1}).build()).await.expect("index");
    db.collection::<Document>("d").insert_one(doc! {"z": 1}).await.expect("insert d");

    let s = db.run_command(doc! {"dbStats": 1}).await.expect("dbStats");
    assert_eq!(s.get_str("db").ok(), Some("statsdb"));
    assert_eq!(num_field(&s, "collections"), 2.0);
    assert_eq!(num_field(&s, "objects"), 11.0);
    assert_eq!(num_field(&s, "indexes"), 3.0);
    for k in ["dataSize", "storageSize", "indexSize", "totalSize", "avgObjSize"] {
        assert!(num_field(&s, k) > 0.0, "{k} must be > 0: {s:?}");
    }
    assert_eq!(num_field(&s, "scaleFactor"), 1.0);
    assert_eq!(num_field(&s, "ok"), 1.0);
    let scaled = db.run_command(doc! {"dbStats": 1, "scale": 1024}).await.expect("dbStats scaled");
    assert_eq!(num_field(&scaled, "scaleFactor"), 1024.0);

    let cs = db.run_command(doc! {"collStats": "c"}).await.expect("collStats");
    assert_eq!(cs.get_str("ns").ok(), Some("statsdb.c"));
    assert_eq!(num_field(&cs, "count"), 10.0);
    assert_eq!(num_field(&cs, "nindexes"), 2.0);
    for k in ["size", "storageSize", "totalIndexSize", "avgObjSize"] {
        assert!(num_field(&cs, k) > 0.0, "{k} must be > 0: {cs:?}");
    }
    // Each document is > 100 bytes, so the data size is at least 10 * 100.
    assert!(num_field(&cs, "size") >= 1000.0, "{cs:?}");
    let sizes = cs.get_document("indexSizes").expect("indexSizes");
    assert!(num_field(sizes, "_id_") > 0.0 && num_field(sizes, "a_1") > 0.0, "{sizes:?}");
}

#[tokio::test]
async fn validate_collection() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let c = db.collection::<Document>("c");
    c.insert_many((0..50).map(|i| doc! {"_id": i, "a": i % 5}).collect::<Vec<_>>()).await.expect("insert");
    c.create_index(IndexModel::builder().keys(doc! {"a": 1}).build()).await.expect("index");
    c.delete_many(doc! {"a": 0}).await.expect("delete");
    c.update_many(doc! {"a": 1}, doc! {"$set": {"a": 100}}).await.expect("update");
    let v = db.run_command(doc! {"validate": "c"}).await.expect("validate");
    assert_eq!(v.get_bool("valid").ok(), Some(true), "{v:?}");
    assert_eq!(v.get_str("ns").ok(), Some("test.c"));
    assert_eq!(num_field(&v, "nrecords"), 40.0);
    assert_eq!(num_field(&v, "nIndexes"), 2.0);
    let kpi = v.get_document("keysPerIndex").expect("keysPerIndex");
    assert_eq!(num_field(kpi, "_id_"), 40.0);
    assert_eq!(num_field(kpi, "a_1"), 40.0);
    assert_eq!(v.get_array("errors").map(|e| e.len()).ok(), Some(0));
    assert!(v.get_array("warnings").is_ok());
    assert_eq!(num_field(&v, "nInvalidDocuments"), 0.0);
    assert_eq!(num_field(&v, "ok"), 1.0);
    assert_code(db.run_command(doc! {"validate": "missing"}).await, 26);
}

#[tokio::test]
async fn data_survives_graceful_restart_and_shutdown_command() {
    let mut server = Server::start();
    {
        let client = server.client().await;
        let coll = client.database("test").collection::<Document>("c");
        coll.insert_many((0..100).map(|i| doc! {"_id": i}).collect::<Vec<_>>()).await.expect("insert");
        coll.create_index(IndexModel::builder().keys(doc! {"k": 1}).build()).await.expect("index");
    }
    // mongod exits 0 on SIGTERM.
    assert_eq!(server.stop_graceful(Duration::from_secs(20)), Some(0), "stderr:\n{}", server.stderr_tail());
    server.restart();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 100);
    let mut idx = coll.list_index_names().await.expect("indexes");
    idx.sort();
    assert_eq!(idx, vec!["_id_", "k_1"]);

    // The shutdown command stops the server (the reply may never arrive).
    let _ = client.database("admin").run_command(doc! {"shutdown": 1}).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server.is_running() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!server.is_running(), "shutdown command did not stop the server");
    server.restart();
    let client = server.client().await;
    assert_eq!(client.database("test").collection::<Document>("c").count_documents(doc! {}).await.expect("count"), 100);
}

// ---------------------------------------------------------------- semantics that apps rely on

#[tokio::test]
async fn comparison_semantics_across_types_nulls_and_arrays() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_many(vec![
        doc! {"_id": 1, "a": null},
        doc! {"_id": 2},
        doc! {"_id": 3, "a": 1},
        doc! {"_id": 4, "a": 1.0},
        doc! {"_id": 5, "a": 1_i64},
        doc! {"_id": 6, "a": "1".parse::<Decimal128>().expect("decimal")},
        doc! {"_id": 7, "a": "1"},
        doc! {"_id": 8, "a": [1, 5]},
        doc! {"_id": 9, "a": [[1]]},
        doc! {"_id": 10, "a": {"b": 1}},
        doc! {"_id": 11, "a": []},
        doc! {"_id": 12, "a": true},
    ])
    .await
    .expect("seed");
    let cases: Vec<(Document, Vec<i32>)> = vec![
        // Numbers compare by value whatever their BSON type; arrays match by element.
        (doc! {"a": 1}, vec![3, 4, 5, 6, 8]),
        (doc! {"a": "1.0".parse::<Decimal128>().expect("decimal")}, vec![3, 4, 5, 6, 8]),
        // null matches null and missing.
        (doc! {"a": null}, vec![1, 2]),
        (doc! {"a": {"$exists": false}}, vec![2]),
        // Range operators stay within their type bracket.
        (doc! {"a": {"$gt": 0}}, vec![3, 4, 5, 6, 8]),
        (doc! {"a": {"$lt": "2"}}, vec![7]),
        (doc! {"a": {"$gte": false}}, vec![12]),
        // Whole-array equality, and an array element that is itself an array.
        (doc! {"a": [1, 5]}, vec![8]),
        (doc! {"a": [1]}, vec![9]),
        (doc! {"a": {"$size": 0}}, vec![11]),
        (doc! {"a": {"$type": "array"}}, vec![8, 9, 11]),
        (doc! {"a": {"$type": "number"}}, vec![3, 4, 5, 6, 8]),
        (doc! {"a.b": 1}, vec![10]),
        (doc! {"a": {"$in": [null, "1"]}}, vec![1, 2, 7]),
        (doc! {"a": {"$ne": 1}}, vec![1, 2, 7, 9, 10, 11, 12]),
        (doc! {"a": {"$nin": [1, null]}}, vec![7, 9, 10, 11, 12]),
        (doc! {"a": {"$all": [1, 5]}}, vec![8]),
        (doc! {"a": {"$elemMatch": {"$gt": 4}}}, vec![8]),
        (doc! {"a": {"$gt": 4}}, vec![8]),
    ];
    for (filter, want) in cases {
        let got = collect(coll.find(filter.clone()).sort(doc! {"_id": 1}).await.expect("find")).await;
        assert_eq!(ids(&got), want, "filter {filter:?}");
    }
    // BSON sort order: [] < null/missing < numbers < strings < objects < arrays < booleans.
    // Ascending sorts arrays by their smallest element, descending by their largest.
    let asc = collect(coll.find(doc! {}).sort(doc! {"a": 1, "_id": 1}).await.expect("find")).await;
    assert_eq!(ids(&asc), vec![11, 1, 2, 3, 4, 5, 6, 8, 7, 10, 9, 12]);
    let desc = collect(coll.find(doc! {}).sort(doc! {"a": -1, "_id": 1}).await.expect("find")).await;
    assert_eq!(ids(&desc), vec![12, 9, 10, 7, 8, 3, 4, 5, 6, 1, 2, 11]);
}

#[tokio::test]
async fn id_moves_first_and_indexes_agree_with_collection_scans() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    // MongoDB stores _id as the first field whatever the client sent.
    coll.insert_one(doc! {"a": 1, "_id": 5, "b": 2}).await.expect("insert");
    assert_same(&coll.find_one(doc! {"_id": 5}).await.expect("find").expect("doc"), &doc! {"_id": 5, "a": 1, "b": 2});
    coll.delete_many(doc! {}).await.expect("clear");

    let docs: Vec<Document> =
        (0..300).map(|i| doc! {"_id": i, "a": i % 7, "b": format!("s{:03}", i % 50), "tags": [i % 3, i % 5], "n": {"x": i % 11}}).collect();
    coll.insert_many(docs).await.expect("seed");
    for keys in [doc! {"a": 1, "b": -1}, doc! {"tags": 1}, doc! {"n.x": 1}, doc! {"b": 1}] {
        coll.create_index(IndexModel::builder().keys(keys).build()).await.expect("index");
    }
    // Updates move documents between index keys; the indexes must follow.
    coll.update_many(doc! {"a": 3}, doc! {"$set": {"a": 30}, "$push": {"tags": 99}}).await.expect("update");
    coll.delete_many(doc! {"n.x": 4}).await.expect("delete");
    let queries: Vec<(Document, Document, &str)> = vec![
        (doc! {"a": {"$gte": 2, "$lt": 5}}, doc! {"a": 1, "b": -1, "_id": 1}, "a_1_b_-1"),
        (doc! {"a": 30, "b": {"$gt": "s010"}}, doc! {"b": -1, "_id": 1}, "a_1_b_-1"),
        (doc! {"a": {"$in": [0, 6, 30]}}, doc! {"_id": -1}, "a_1_b_-1"),
        (doc! {"tags": 99}, doc! {"_id": 1}, "tags_1"),
        (doc! {"tags": {"$gt": 3}}, doc! {"_id": 1}, "tags_1"),
        (doc! {"tags": {"$all": [0, 4]}}, doc! {"_id": 1}, "tags_1"),
        (doc! {"n.x": {"$lte": 2}}, doc! {"n.x": -1, "_id": 1}, "n.x_1"),
        (doc! {"b": {"$regex": "^s00"}}, doc! {"b": 1, "_id": 1}, "b_1"),
        (doc! {"b": {"$exists": true}, "a": {"$ne": 1}}, doc! {"_id": 1}, "b_1"),
    ];
    for (filter, sort, index) in queries {
        let scan = collect(coll.find(filter.clone()).sort(sort.clone()).hint(mongodb::options::Hint::Keys(doc! {"$natural": 1})).await.expect("scan")).await;
        let via = collect(coll.find(filter.clone()).sort(sort.clone()).hint(mongodb::options::Hint::Name(index.to_string())).await.expect("indexed")).await;
        assert!(!scan.is_empty(), "{filter:?} should match something");
        assert_eq!(ids(&via), ids(&scan), "index {index} disagrees with a collection scan for {filter:?}");
        let n = coll.count_documents(filter.clone()).hint(mongodb::options::Hint::Name(index.to_string())).await.expect("count");
        assert_eq!(n as usize, scan.len(), "count via {index} for {filter:?}");
    }
    // A hint naming no index is BadValue (2).
    assert_code(coll.find(doc! {}).hint(mongodb::options::Hint::Name("nope".into())).await.map(|_| ()), 2);
    // A unique violation caused by an update leaves the document unchanged.
    coll.create_index(IndexModel::builder().keys(doc! {"u": 1}).options(IndexOptions::builder().unique(true).build()).build())
        .await
        .expect_err("300 docs share a null u");
    let uniq = client.database("test").collection::<Document>("uniq");
    uniq.create_index(IndexModel::builder().keys(doc! {"u": 1}).options(IndexOptions::builder().unique(true).build()).build()).await.expect("unique");
    uniq.insert_many(vec![doc! {"_id": 1, "u": 1}, doc! {"_id": 2, "u": 2}]).await.expect("seed uniq");
    assert_code(uniq.update_one(doc! {"_id": 2}, doc! {"$set": {"u": 1}}).await, 11000);
    assert_eq!(uniq.find_one(doc! {"_id": 2}).await.expect("find").expect("doc"), doc! {"_id": 2, "u": 2});
    assert_eq!(uniq.count_documents(doc! {"u": 2}).hint(mongodb::options::Hint::Name("u_1".into())).await.expect("count"), 1);
}

#[tokio::test]
async fn write_batch_limits_and_document_growth() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    // Over maxWriteBatchSize: the driver splits, the server accepts each batch.
    coll.insert_many((0..120_000).map(|i| doc! {"_id": i}).collect::<Vec<_>>()).await.expect("120k inserts");
    assert_eq!(coll.estimated_document_count().await.expect("count"), 120_000);
    // A single command above the limit, or with nothing in it, is InvalidLength (16).
    let too_many: Vec<Document> = (0..100_001).map(|i| doc! {"x": i}).collect();
    assert_code(db.run_command(doc! {"insert": "other", "documents": too_many}).await, 16);
    assert_code(db.run_command(doc! {"insert": "other", "documents": []}).await, 16);
    assert_eq!(db.collection::<Document>("other").count_documents(doc! {}).await.expect("count"), 0);

    // Many large documents: one insert_many the driver must split by message size (48 MB).
    let big = db.collection::<Document>("big");
    let payload = "p".repeat(1024 * 1024);
    big.insert_many((0..60).map(|i| doc! {"_id": i, "p": payload.clone()}).collect::<Vec<_>>()).await.expect("60 x 1 MB");
    // The first batch of a find stops at 16 MB, not at 101 documents.
    let first = db.run_command(doc! {"find": "big", "sort": {"_id": 1}}).await.expect("find");
    let n_first = first.get_document("cursor").and_then(|c| c.get_array("firstBatch")).map(|b| b.len()).expect("firstBatch");
    assert!(n_first > 0 && n_first <= 16, "first batch of 1 MB documents holds {n_first}");
    let all = collect(big.find(doc! {}).sort(doc! {"_id": 1}).await.expect("find")).await;
    assert_eq!(ids(&all), (0..60).collect::<Vec<i32>>());
    assert!(all.iter().all(|d| d.get_str("p").map(|p| p.len()).ok() == Some(payload.len())));

    // An update may not grow a document past 16 MB (17419).
    let ten_mb = "t".repeat(10 * 1024 * 1024);
    big.insert_one(doc! {"_id": "grow", "a": ten_mb.clone()}).await.expect("10 MB doc");
    assert_code(big.update_one(doc! {"_id": "grow"}, doc! {"$set": {"b": ten_mb}}).await, 17419);
    let d = big.find_one(doc! {"_id": "grow"}).await.expect("find").expect("doc");
    assert!(d.get("b").is_none(), "failed update must leave the document as it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_increments_and_queue_claims_are_atomic() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_one(doc! {"_id": "counter", "n": 0}).await.expect("seed");
    const TASKS: i32 = 8;
    const INCREMENTS_PER_TASK: i32 = 100;
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let coll = coll.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..INCREMENTS_PER_TASK {
                coll.update_one(doc! {"_id": "counter"}, doc! {"$inc": {"n": 1}}).await.expect("inc");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    let d = coll.find_one(doc! {"_id": "counter"}).await.expect("find").expect("doc");
    assert_eq!(d.get_i32("n").ok(), Some(TASKS * INCREMENTS_PER_TASK), "lost updates: {d:?}");

    // A work queue: every job is claimed exactly once by find_one_and_update.
    let jobs = client.database("test").collection::<Document>("jobs");
    jobs.insert_many((0..200).map(|i| doc! {"_id": i, "state": "new"}).collect::<Vec<_>>()).await.expect("jobs");
    let mut handles = Vec::new();
    for worker in 0..TASKS {
        let jobs = jobs.clone();
        handles.push(tokio::spawn(async move {
            let mut claimed = Vec::new();
            while let Some(job) =
                jobs.find_one_and_update(doc! {"state": "new"}, doc! {"$set": {"state": "taken", "by": worker}}).sort(doc! {"_id": 1}).await.expect("claim")
            {
                claimed.push(job.get_i32("_id").expect("_id"));
            }
            claimed
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("worker"));
    }
    all.sort();
    assert_eq!(all, (0..200).collect::<Vec<i32>>(), "each job claimed exactly once");
    assert_eq!(jobs.count_documents(doc! {"state": "taken"}).await.expect("count"), 200);
}

#[tokio::test]
async fn sort_order_of_strings_and_numbers() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    // Strings compare by their UTF-8 bytes (no collation by default).
    let strings = ["b", "B", "a", "é", "ab", ""];
    coll.insert_many(strings.iter().enumerate().map(|(i, s)| doc! {"_id": i as i32, "s": *s}).collect::<Vec<_>>()).await.expect("strings");
    let got: Vec<String> = collect(coll.find(doc! {"s": {"$exists": true}}).sort(doc! {"s": 1}).await.expect("find"))
        .await
        .iter()
        .map(|d| d.get_str("s").unwrap_or_default().to_string())
        .collect();
    assert_eq!(got, vec!["", "B", "a", "ab", "b", "é"]);
    assert_eq!(coll.count_documents(doc! {"s": {"$gt": "a", "$lt": "b"}}).await.expect("count"), 1, "only \"ab\" lies between");

    // Numbers of every type interleave by value; NaN sorts below every other number.
    let nums = [
        Bson::Double(f64::NAN),
        Bson::Double(f64::NEG_INFINITY),
        Bson::Decimal128("0.5".parse().expect("decimal")),
        Bson::Int32(1),
        Bson::Double(1.5),
        Bson::Int64(2),
        Bson::Int64(i64::MAX),
        Bson::Double(f64::INFINITY),
    ];
    let scrambled = [5usize, 0, 7, 2, 6, 1, 4, 3];
    coll.insert_many(scrambled.iter().map(|&i| doc! {"_id": 100 + i as i32, "n": nums[i].clone()}).collect::<Vec<_>>()).await.expect("numbers");
    let got = collect(coll.find(doc! {"n": {"$exists": true}}).sort(doc! {"n": 1}).await.expect("find")).await;
    assert_eq!(ids(&got), (100..108).collect::<Vec<i32>>(), "{got:?}");
    let got = collect(coll.find(doc! {"n": {"$exists": true}}).sort(doc! {"n": -1}).await.expect("find")).await;
    assert_eq!(ids(&got), (100..108).rev().collect::<Vec<i32>>(), "{got:?}");
    // Range queries on mixed numeric types.
    let got = collect(coll.find(doc! {"n": {"$gt": 1, "$lte": 2.0}}).sort(doc! {"_id": 1}).await.expect("find")).await;
    assert_eq!(ids(&got), vec![104, 105]);
    // NaN equals only NaN.
    let got = collect(coll.find(doc! {"n": f64::NAN}).await.expect("find")).await;
    assert_eq!(ids(&got), vec![100]);
}
