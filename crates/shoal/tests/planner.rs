//! Index selection and explain, through the official Rust driver against the real binary.
//! Every planned query is also run with `hint: {$natural: 1}` (a collection scan): the index
//! must never change the answer.

mod common;

use common::*;
use mongodb::bson::{doc, Bson, Document};
use mongodb::IndexModel;

async fn explain(db: &mongodb::Database, find: Document) -> Document {
    db.run_command(doc! {"explain": find, "verbosity": "executionStats"}).await.expect("explain")
}

fn winning(e: &Document) -> &Document {
    e.get_document("queryPlanner").and_then(|q| q.get_document("winningPlan")).expect("winningPlan")
}

/// The first stage of the given name in the winning plan tree.
fn find_stage<'a>(mut stage: &'a Document, name: &str) -> Option<&'a Document> {
    loop {
        if stage.get_str("stage").ok() == Some(name) {
            return Some(stage);
        }
        stage = stage.get_document("inputStage").ok()?;
    }
}

fn stats(e: &Document) -> (f64, f64, f64) {
    let s = e.get_document("executionStats").expect("executionStats");
    (num_field(s, "nReturned"), num_field(s, "totalKeysExamined"), num_field(s, "totalDocsExamined"))
}

async fn find_ids(db: &mongodb::Database, filter: Document, sort: Option<Document>, hint: Option<Bson>) -> Vec<Bson> {
    let mut cmd = doc! {"find": "c", "filter": filter, "batchSize": 100000};
    if let Some(s) = sort {
        cmd.insert("sort", s);
    }
    if let Some(h) = hint {
        cmd.insert("hint", h);
    }
    let r = db.run_command(cmd).await.expect("find");
    r.get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .expect("batch")
        .iter()
        .map(|d| d.as_document().and_then(|d| d.get("_id")).cloned().unwrap_or(Bson::Null))
        .collect()
}

#[tokio::test]
async fn index_choice_bounds_and_explain() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("c");
    let docs: Vec<Document> = (0..1000).map(|i| doc! {"_id": i, "a": i, "b": i % 10, "c": format!("s{i}"), "tags": [i % 7, i % 11]}).collect();
    coll.insert_many(docs).await.expect("seed");
    for keys in [doc! {"a": 1}, doc! {"b": 1, "a": -1}, doc! {"tags": 1}] {
        coll.create_index(IndexModel::builder().keys(keys).build()).await.expect("index");
    }

    // Equality on an indexed field: one key, one document.
    let e = explain(&db, doc! {"find": "c", "filter": {"a": 500}}).await;
    let ix = find_stage(winning(&e), "IXSCAN").expect("IXSCAN");
    assert_eq!(ix.get_str("indexName").ok(), Some("a_1"), "{e:?}");
    assert!(find_stage(winning(&e), "FETCH").is_some());
    assert_eq!(stats(&e), (1.0, 1.0, 1.0));

    // A range: exactly the keys in range are examined.
    let e = explain(&db, doc! {"find": "c", "filter": {"a": {"$gte": 10, "$lt": 20}}}).await;
    assert_eq!(stats(&e), (10.0, 10.0, 10.0), "{e:?}");
    assert_eq!(find_stage(winning(&e), "IXSCAN").and_then(|s| s.get_document("indexBounds").ok()), Some(&doc! {"a": ["[10, 20)"]}));

    // $in: one interval per value.
    let e = explain(&db, doc! {"find": "c", "filter": {"a": {"$in": [1, 5, 900, 5000]}}}).await;
    assert_eq!(stats(&e), (3.0, 3.0, 3.0), "{e:?}");

    // Equality prefix + sort on the next field: the index gives the order, no SORT stage.
    let e = explain(&db, doc! {"find": "c", "filter": {"b": 3}, "sort": {"a": -1}}).await;
    assert_eq!(find_stage(winning(&e), "IXSCAN").and_then(|s| s.get_str("indexName").ok()), Some("b_1_a_-1"), "{e:?}");
    assert!(find_stage(winning(&e), "SORT").is_none(), "{e:?}");
    assert_eq!(stats(&e), (100.0, 100.0, 100.0));
    // Sort the other way: the same index scanned backward.
    let e = explain(&db, doc! {"find": "c", "filter": {"b": 3}, "sort": {"a": 1}}).await;
    assert_eq!(find_stage(winning(&e), "IXSCAN").and_then(|s| s.get_str("direction").ok()), Some("backward"), "{e:?}");

    // Unindexed field: a collection scan that reads every document.
    let e = explain(&db, doc! {"find": "c", "filter": {"c": "s5"}}).await;
    assert!(find_stage(winning(&e), "COLLSCAN").is_some(), "{e:?}");
    assert_eq!(stats(&e), (1.0, 0.0, 1000.0));

    // _id equality: IDHACK.
    let e = explain(&db, doc! {"find": "c", "filter": {"_id": 7}}).await;
    assert_eq!(winning(&e).get_str("stage").ok(), Some("IDHACK"), "{e:?}");
    assert_eq!(stats(&e).0, 1.0);

    // hint forces an index even when it can't bound the scan.
    let e = explain(&db, doc! {"find": "c", "filter": {"c": "s5"}, "hint": "a_1"}).await;
    assert_eq!(find_stage(winning(&e), "IXSCAN").and_then(|s| s.get_str("indexName").ok()), Some("a_1"));
    assert_eq!(stats(&e), (1.0, 1000.0, 1000.0));
    // A hint naming no index is an error (BadValue).
    assert_code(db.run_command(doc! {"find": "c", "hint": "nope_1"}).await, 2);

    // The queryPlanner-only verbosity does not run the plan.
    let q = db.run_command(doc! {"explain": {"find": "c", "filter": {"a": 1}}, "verbosity": "queryPlanner"}).await.expect("explain");
    assert!(q.get_document("executionStats").is_err());

    // Answers with and without the planner agree, order included where sorted.
    let natural = Bson::Document(doc! {"$natural": 1});
    let cases: Vec<(Document, Option<Document>)> = vec![
        (doc! {"a": {"$gt": 990}}, None),
        (doc! {"a": {"$lte": 3}}, Some(doc! {"a": 1})),
        (doc! {"a": {"$gt": 5, "$lt": 3}}, None),
        (doc! {"b": 3, "a": {"$gt": 900}}, Some(doc! {"a": -1})),
        (doc! {"b": {"$in": [2, 4]}, "a": {"$lt": 50}}, Some(doc! {"a": 1})),
        (doc! {"$and": [{"a": {"$gte": 100}}, {"a": {"$lt": 110}}, {"b": 5}]}, None),
        (doc! {"tags": 3}, Some(doc! {"_id": 1})),
        // Multikey: each element may satisfy a different side of the range.
        (doc! {"tags": {"$gt": 8, "$lt": 2}}, Some(doc! {"_id": 1})),
        (doc! {"tags": {"$in": [0, 10]}, "a": {"$lt": 100}}, Some(doc! {"_id": 1})),
        (doc! {"a": {"$gte": "x"}}, None),
        (doc! {"a": 1.0}, None),
    ];
    for (filter, sort) in cases {
        let planned = find_ids(&db, filter.clone(), sort.clone(), None).await;
        let mut scanned = find_ids(&db, filter.clone(), sort.clone(), Some(natural.clone())).await;
        let mut planned_sorted = planned.clone();
        if sort.is_none() {
            planned_sorted.sort_by_key(|b| b.as_i32().unwrap_or(-1));
            scanned.sort_by_key(|b| b.as_i32().unwrap_or(-1));
        }
        assert_eq!(planned_sorted, scanned, "{filter:?} sort {sort:?}");
        assert!(!planned.is_empty() || filter.contains_key("a") || filter.contains_key("tags"), "{filter:?}");
    }
    // The multikey query finds documents that only element-wise semantics match:
    // _id 21 has tags [0, 10] (10 > 8 and 0 < 2), while _id 9 has [2, 9] (no element < 2).
    let mk = find_ids(&db, doc! {"tags": {"$gt": 8, "$lt": 2}}, Some(doc! {"_id": 1}), None).await;
    assert!(mk.contains(&Bson::Int32(21)) && !mk.contains(&Bson::Int32(9)), "{mk:?}");

    // count and aggregate use the planner too.
    let e = db.run_command(doc! {"explain": {"count": "c", "query": {"a": {"$lt": 5}}}, "verbosity": "executionStats"}).await.expect("explain count");
    assert_eq!(stats(&e).1, 5.0, "{e:?}");
    assert_eq!(coll.count_documents(doc! {"a": {"$lt": 5}}).await.expect("count"), 5);
    let e = db.run_command(doc! {"explain": {"aggregate": "c", "pipeline": [{"$match": {"a": {"$in": [4, 8]}}}, {"$group": {"_id": null, "n": {"$sum": 1}}}], "cursor": {}}, "verbosity": "executionStats"}).await.expect("explain agg");
    assert_eq!(stats(&e).1, 2.0, "{e:?}");
}

#[tokio::test]
async fn updates_and_deletes_through_indexes() {
    let server = Server::start();
    let client = server.client().await;
    let coll = client.database("test").collection::<Document>("c");
    coll.insert_many((0..500).map(|i| doc! {"_id": i, "a": i, "g": i % 5}).collect::<Vec<_>>()).await.expect("seed");
    coll.create_index(IndexModel::builder().keys(doc! {"a": 1}).build()).await.expect("index");
    // A multi-update that moves documents forward in the index it scans must update each once.
    let r = coll.update_many(doc! {"a": {"$gte": 100}}, doc! {"$inc": {"a": 1000}}).await.expect("update");
    assert_eq!((r.matched_count, r.modified_count), (400, 400));
    assert_eq!(coll.count_documents(doc! {"a": {"$gte": 1100}}).await.expect("count"), 400);
    assert_eq!(coll.count_documents(doc! {"a": {"$gte": 2100}}).await.expect("count"), 0);
    let r = coll.delete_many(doc! {"a": {"$lt": 50}}).await.expect("delete");
    assert_eq!(r.deleted_count, 50);
    let v = client.database("test").run_command(doc! {"validate": "c"}).await.expect("validate");
    assert_eq!(v.get_bool("valid").ok(), Some(true), "{v:?}");
    assert_eq!(num_field(v.get_document("keysPerIndex").expect("keys"), "a_1"), 450.0);
}

#[tokio::test]
async fn hashed_indexes_through_the_driver() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("h");
    coll.insert_many((0..100).map(|i| doc! {"_id": i, "check": i}).collect::<Vec<_>>()).await.expect("seed");
    let name = coll.create_index(IndexModel::builder().keys(doc! {"check": "hashed"}).build()).await.expect("hashed index").index_name;
    assert_eq!(name, "check_hashed");
    assert_eq!(coll.count_documents(doc! {"check": 42}).await.expect("count"), 1);
    // Arrays can't be hashed (16766); unique hashed indexes are refused (16764).
    assert_code(coll.insert_one(doc! {"_id": 1000, "check": [1, 2]}).await, 16766);
    let unique = db.run_command(doc! {"createIndexes": "h", "indexes": [{"key": {"x": "hashed"}, "name": "x_hashed", "unique": true}]}).await;
    assert_code(unique, 16764);
    assert_code(db.run_command(doc! {"createIndexes": "h", "indexes": [{"key": {"t": "text"}, "name": "t_text"}]}).await, 67);
}

/// The documents `find` returns, as an array of whole documents.
async fn find_docs(db: &mongodb::Database, coll: &str, filter: Document, projection: Document, hint: Option<Bson>) -> Vec<Bson> {
    let mut cmd = doc! {"find": coll, "filter": filter, "projection": projection, "batchSize": 100000};
    if let Some(h) = hint {
        cmd.insert("hint", h);
    }
    let r = db.run_command(cmd).await.expect("find");
    r.get_document("cursor").and_then(|c| c.get_array("firstBatch")).expect("batch").clone()
}

#[tokio::test]
async fn hashed_equality_uses_the_hashed_index() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("h");
    coll.insert_many((0..300).map(|i| doc! {"_id": i, "check": i % 100, "n": i}).collect::<Vec<_>>()).await.expect("seed");
    coll.create_index(IndexModel::builder().keys(doc! {"check": "hashed"}).build()).await.expect("hashed index");

    // Equality: one hashed key, MongoDB's hash of 42 as the bound, three documents.
    let e = explain(&db, doc! {"find": "h", "filter": {"check": 42}}).await;
    let ix = find_stage(winning(&e), "IXSCAN").expect("IXSCAN");
    assert_eq!(ix.get_str("indexName").ok(), Some("check_hashed"));
    assert_eq!(ix.get_document("indexBounds").expect("bounds"), &doc! {"check": ["[-944302157085130861, -944302157085130861]"]});
    assert_eq!(stats(&e), (3.0, 3.0, 3.0));
    // 42 as a double or a long hashes like the int (numbers squash to one integer).
    for v in [Bson::Double(42.0), Bson::Int64(42)] {
        assert_eq!(stats(&explain(&db, doc! {"find": "h", "filter": {"check": v}}).await).0, 3.0);
    }
    // $in: one key per value.
    let e = explain(&db, doc! {"find": "h", "filter": {"check": {"$in": [1, 2, 500]}}}).await;
    assert!(find_stage(winning(&e), "IXSCAN").is_some());
    assert_eq!(stats(&e), (6.0, 6.0, 6.0));
    // A range cannot use hash order.
    let e = explain(&db, doc! {"find": "h", "filter": {"check": {"$gt": 97}}}).await;
    assert!(find_stage(winning(&e), "COLLSCAN").is_some(), "{e}");
    // Same answers as a collection scan.
    for f in [doc! {"check": 42}, doc! {"check": {"$in": [1, 2, 500]}}, doc! {"check": 7, "n": {"$gt": 100}}, doc! {"check": 4.5}] {
        let mut by_index = find_ids(&db, f.clone(), None, None).await;
        let mut by_scan = find_ids(&db, f.clone(), None, Some(Bson::Document(doc! {"$natural": 1}))).await;
        by_index.sort_by_key(|v| v.as_i32());
        by_scan.sort_by_key(|v| v.as_i32());
        assert_eq!(by_index, by_scan, "{f}");
    }
}

#[tokio::test]
async fn covered_queries_read_no_documents() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("test");
    let coll = db.collection::<Document>("cv");
    let docs: Vec<Document> = (0..500)
        .map(|i| {
            let mut d = doc! {"_id": i, "a": i, "b": {"c": i % 10}, "x": "payload"};
            if i % 50 == 0 {
                d.remove("b");
            }
            d
        })
        .collect();
    coll.insert_many(docs).await.expect("seed");
    coll.create_index(IndexModel::builder().keys(doc! {"a": 1, "b.c": 1}).build()).await.expect("index");

    // Every filtered and projected field is a key field pinned to a value: covered.
    let q = doc! {"a": {"$gte": 400}, "b.c": 3};
    let e = explain(&db, doc! {"find": "cv", "filter": q.clone(), "projection": {"a": 1, "b.c": 1, "_id": 0}}).await;
    let w = winning(&e);
    assert_eq!(w.get_str("stage").ok(), Some("PROJECTION_COVERED"), "{w}");
    assert!(find_stage(w, "FETCH").is_none());
    let (n, keys, docs) = stats(&e);
    assert_eq!((n, docs), (10.0, 0.0));
    assert!(keys >= 10.0);
    let covered = find_docs(&db, "cv", q.clone(), doc! {"a": 1, "b.c": 1, "_id": 0}, None).await;
    let fetched = find_docs(&db, "cv", q.clone(), doc! {"a": 1, "b.c": 1, "_id": 0}, Some(Bson::Document(doc! {"$natural": 1}))).await;
    assert_eq!(covered, fetched);
    assert_eq!(covered.first().and_then(|d| d.as_document()), Some(&doc! {"a": 403, "b": {"c": 3}}));

    // Not covered: _id returned, a field the filter does not pin (b.c may be missing, which
    // the index stores as null), a field outside the index, or a sort the index lacks.
    for (filter, projection, sort) in [
        (doc! {"a": {"$gte": 400}}, doc! {"a": 1}, None),
        (doc! {"a": {"$gte": 400}}, doc! {"a": 1, "b.c": 1, "_id": 0}, None),
        (doc! {"a": {"$gte": 400}}, doc! {"a": 1, "x": 1, "_id": 0}, None),
        (doc! {"a": {"$gte": 400}, "b.c": 3}, doc! {"a": 1, "_id": 0}, Some(doc! {"b.c": 1})),
    ] {
        let mut find = doc! {"find": "cv", "filter": filter.clone(), "projection": projection.clone()};
        if let Some(s) = &sort {
            find.insert("sort", s.clone());
        }
        let e = explain(&db, find).await;
        assert!(find_stage(winning(&e), "FETCH").is_some(), "{filter} {projection}: {e}");
        let by_index = find_docs(&db, "cv", filter.clone(), projection.clone(), None).await;
        let by_scan = find_docs(&db, "cv", filter.clone(), projection.clone(), Some(Bson::Document(doc! {"$natural": 1}))).await;
        assert_eq!(by_index.len(), by_scan.len());
    }
    // A document missing b.c still comes back without it through the index plan.
    let missing = find_docs(&db, "cv", doc! {"a": {"$gte": 450}}, doc! {"a": 1, "b.c": 1, "_id": 0}, None).await;
    assert_eq!(missing.first().and_then(|d| d.as_document()), Some(&doc! {"a": 450}));
}

#[tokio::test]
async fn natural_order_scans_forward_and_backward() {
    let server = Server::start();
    let client = server.client().await;
    let db = client.database("nat");
    let coll = db.collection::<Document>("c");
    // Inserted out of _id order: record order is insertion order.
    let order = [5, 1, 9, 3, 7, 2, 8];
    for id in order {
        coll.insert_one(doc! {"_id": id, "even": id % 2 == 0}).await.unwrap();
    }
    let forward: Vec<Bson> = order.iter().map(|i| Bson::Int32(*i)).collect();
    let backward: Vec<Bson> = forward.iter().rev().cloned().collect();
    assert_eq!(find_ids(&db, doc! {}, Some(doc! {"$natural": 1}), None).await, forward);
    assert_eq!(find_ids(&db, doc! {}, Some(doc! {"$natural": -1}), None).await, backward);
    assert_eq!(find_ids(&db, doc! {}, None, Some(Bson::Document(doc! {"$natural": -1}))).await, backward);
    // A filter and a limit apply on the way; a real sort beside a $natural hint still sorts.
    let odd_back: Vec<Bson> = backward.iter().filter(|b| b.as_i32().unwrap() % 2 == 1).take(2).cloned().collect();
    let r = db.run_command(doc! {"find": "c", "filter": {"even": false}, "sort": {"$natural": -1}, "limit": 2}).await.unwrap();
    let got: Vec<Bson> =
        r.get_document("cursor").unwrap().get_array("firstBatch").unwrap().iter().map(|d| d.as_document().unwrap().get("_id").unwrap().clone()).collect();
    assert_eq!(got, odd_back);
    let mut sorted = forward.clone();
    sorted.sort_by_key(|b| b.as_i32().unwrap());
    assert_eq!(find_ids(&db, doc! {}, Some(doc! {"_id": 1}), Some(Bson::Document(doc! {"$natural": -1}))).await, sorted);
    let e = explain(&db, doc! {"find": "c", "sort": {"$natural": -1}}).await;
    let scan = find_stage(winning(&e), "COLLSCAN").expect("COLLSCAN");
    assert_eq!(scan.get_str("direction").unwrap(), "backward");
    assert!(find_stage(winning(&e), "SORT").is_none());
    assert_code(db.run_command(doc! {"find": "c", "sort": {"$natural": -1, "_id": 1}}).await, 2);
    assert_code(db.run_command(doc! {"find": "c", "sort": {"$natural": 2}}).await, 2);
}
