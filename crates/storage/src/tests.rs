//! Store-level tests, run against both engines where it matters.

use std::path::{Path, PathBuf};

/// A fresh directory under /tmp, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!("shoal-storage-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

use super::*;
use bson::{doc, Bson, Document};
use std::sync::{Arc, Barrier};

/// A store on each engine: (label, store, directory kept alive for fjall).
fn stores() -> Vec<(&'static str, Store, Option<TempDir>)> {
    let dir = TempDir::new("store");
    let fj = Store::open(dir.path(), StoreOptions { cache_size_bytes: 8 << 20, fsync: true }).unwrap();
    vec![("memory", Store::open_in_memory(), None), ("fjall", fj, Some(dir))]
}

fn ids(snap: &Snapshot) -> Vec<Bson> {
    snap.scan(None, usize::MAX).unwrap().into_iter().map(|(_, d)| d.get("_id").unwrap().clone()).collect()
}

fn idx(key: Document, name: &str) -> IndexSpec {
    IndexSpec::new(key, name)
}

fn unique_idx(key: Document, name: &str) -> IndexSpec {
    IndexSpec { unique: true, ..IndexSpec::new(key, name) }
}

fn scan_values(snap: &Snapshot, name: &str, bounds: IndexBounds) -> Vec<Vec<Bson>> {
    snap.index_scan(name, bounds, None, usize::MAX).unwrap().into_iter().map(|e| e.values).collect()
}

#[test]
fn insert_read_update_delete() {
    for (label, store, _dir) in stores() {
        let c = store.create_collection("db", "c", doc! {}).unwrap();
        let out = c.insert_many(&[doc! {"_id": 1, "a": "x"}, doc! {"_id": 2, "a": "y"}, doc! {"_id": 3}], true);
        assert_eq!((out.inserted, out.errors.len()), (3, 0), "{label}");
        let snap = c.snapshot();
        assert_eq!(snap.count().unwrap(), 3);
        let all = snap.scan(None, 10).unwrap();
        assert_eq!(all.len(), 3);
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
        // Paged scan resumes after a record id.
        let page = snap.scan(Some(all[0].0), 1).unwrap();
        assert_eq!(page[0].0, all[1].0);
        assert_eq!(snap.get(all[1].0).unwrap().unwrap(), doc! {"_id": 2, "a": "y"});
        let (rid, d) = snap.find_by_id(&Bson::Int32(2)).unwrap().unwrap();
        assert_eq!((rid, d.get_str("a").unwrap()), (all[1].0, "y"));
        // The _id index compares numbers by value.
        assert!(snap.find_by_id(&Bson::Double(2.0)).unwrap().is_some());
        assert!(snap.find_by_id(&Bson::Int32(9)).unwrap().is_none());

        let mut w = c.writer();
        w.update(rid, &d, &doc! {"_id": 2, "a": "z", "b": [1, 2]}).unwrap();
        let r1 = all[0].0;
        w.delete(r1, &all[0].1).unwrap();
        let rid4 = w.insert(&doc! {"_id": 4}).unwrap();
        assert!(rid4 > all[2].0, "record ids are monotonic");
        assert_eq!(w.snapshot().count().unwrap(), 3);
        drop(w);
        let now = c.snapshot();
        assert_eq!(ids(&now), vec![Bson::Int32(2), Bson::Int32(3), Bson::Int32(4)]);
        assert_eq!(now.get(rid).unwrap().unwrap().get_str("a").unwrap(), "z");
        assert!(now.find_by_id(&Bson::Int32(1)).unwrap().is_none());
        // The old snapshot still sees the old state.
        assert_eq!(snap.count().unwrap(), 3);
        assert_eq!(ids(&snap), vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(3)]);
        let v = c.validate();
        assert!(v.valid, "{label}: {:?}", v.errors);
        assert_eq!(v.records, 3);
        store.commit_durable().unwrap();
        let st = c.stats();
        assert_eq!(st.count, 3);
        assert!(st.size_bytes > 0);
        assert_eq!(st.index_sizes.len(), 1);
        assert!(store.storage_size_bytes() > 0);
        let db = store.database_stats("db");
        assert_eq!((db.collections, db.objects, db.indexes), (1, 3, 1));
    }
}

#[test]
fn unique_violations_in_batch_and_against_stored() {
    for (label, store, _dir) in stores() {
        let c = store.collection_or_create("db", "c").unwrap();
        assert_eq!(c.insert_many(&[doc! {"_id": 1}], true).inserted, 1);
        // Against stored data, with MongoDB's exact message and extra fields.
        let out = c.insert_many(&[doc! {"_id": 0}, doc! {"_id": 1}, doc! {"_id": 2}], true);
        assert_eq!(out.inserted, 1, "{label}: ordered stops at the first error");
        assert_eq!(out.errors.len(), 1);
        let (i, e) = &out.errors[0];
        assert_eq!(*i, 1);
        assert_eq!(e.code, 11000);
        assert_eq!(e.message, "E11000 duplicate key error collection: db.c index: _id_ dup key: { _id: 1 }");
        assert_eq!(e.extra, Some(doc! {"keyPattern": {"_id": 1}, "keyValue": {"_id": 1}}));
        assert!(c.snapshot().find_by_id(&Bson::Int32(2)).unwrap().is_none());
        // Unordered: all valid documents go in; duplicates within the batch are caught.
        let out = c.insert_many(&[doc! {"_id": 5}, doc! {"_id": 5}, doc! {"_id": 1.0}, doc! {"_id": 6}], false);
        assert_eq!(out.inserted, 2);
        assert_eq!(out.errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(out.errors[1].1.message, "E11000 duplicate key error collection: db.c index: _id_ dup key: { _id: 1.0 }");
        assert_eq!(ids(&c.snapshot()), vec![Bson::Int32(1), Bson::Int32(0), Bson::Int32(5), Bson::Int32(6)]);
        // Secondary unique index: documents without the field index as null, so building
        // it over several such documents fails, as in MongoDB.
        assert_eq!(c.create_index(unique_idx(doc! {"email": 1}, "email_1")).unwrap_err().code, 11000);
        let u = store.collection_or_create("db", "u").unwrap();
        assert!(u.create_index(unique_idx(doc! {"email": 1}, "email_1")).unwrap());
        let out = u.insert_many(&[doc! {"_id": 7, "email": "a"}, doc! {"_id": 8, "email": "a"}, doc! {"_id": 9}, doc! {"_id": 10}], false);
        assert_eq!(out.inserted, 2);
        let e = &out.errors[0].1;
        assert_eq!(e.message, "E11000 duplicate key error collection: db.u index: email_1 dup key: { email: \"a\" }");
        assert_eq!(e.extra, Some(doc! {"keyPattern": {"email": 1}, "keyValue": {"email": "a"}}));
        assert_eq!(out.errors[1].1.message, "E11000 duplicate key error collection: db.u index: email_1 dup key: { email: null }");
        assert!(u.validate().valid);
        assert!(c.validate().valid);
        // Missing _id, arrays as _id, too-large documents.
        let out = c.insert_many(&[doc! {"x": 1}, doc! {"_id": [1]}, doc! {"_id": 99, "big": "x".repeat(17 << 20)}], false);
        let codes: Vec<i32> = out.errors.iter().map(|(_, e)| e.code).collect();
        assert_eq!(codes, vec![2, 53, 10334]);
    }
}

#[test]
fn unique_index_build_fails_on_duplicates_and_leaves_nothing() {
    for (label, store, _dir) in stores() {
        let c = store.collection_or_create("db", "c").unwrap();
        let docs: Vec<Document> = (0..2500).map(|i| doc! {"_id": i, "a": i % 2000}).collect();
        assert_eq!(c.insert_many(&docs, true).inserted, 2500);
        let e = c.create_index(unique_idx(doc! {"a": 1}, "a_1")).unwrap_err();
        assert_eq!(e.code, 11000, "{label}");
        assert!(e.message.contains("index: a_1 dup key: { a: "), "{}", e.message);
        assert_eq!(c.meta().indexes.len(), 1);
        // No stray entries of the failed build remain.
        let v = c.validate();
        assert!(v.valid, "{:?}", v.errors);
        assert_eq!(store.inner.shared.engine.snapshot().iter(Space::Catalog, Bound::Unbounded, Bound::Unbounded, false).filter(|kv| kv.as_ref().unwrap().0[0] == b'g').count(), 0);
        assert!(c.create_index(idx(doc! {"a": 1}, "a_1")).unwrap());
        assert_eq!(c.validate().keys_per_index, vec![("_id_".to_string(), 2500), ("a_1".to_string(), 2500)]);
    }
}

#[test]
fn create_index_conflicts_and_drop_index() {
    for (_label, store, _dir) in stores() {
        let c = store.collection_or_create("db", "c").unwrap();
        assert!(c.create_index(idx(doc! {"a": 1}, "a_1")).unwrap());
        assert!(!c.create_index(idx(doc! {"a": 1}, "a_1")).unwrap(), "identical index is a no-op");
        assert!(!c.create_index(IndexSpec::id_index()).unwrap());
        assert_eq!(c.create_index(idx(doc! {"b": 1}, "a_1")).unwrap_err().code, 86);
        assert_eq!(c.create_index(unique_idx(doc! {"a": 1}, "a_1")).unwrap_err().code, 85);
        let e = c.create_index(idx(doc! {"a": 1}, "other")).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (85, "Index already exists with a different name: a_1"));
        assert_eq!(c.create_index(IndexSpec::new(doc! {"a": "text"}, "t")).unwrap_err().code, 67);
        assert_eq!(c.create_index(IndexSpec::new(doc! {"a": 0}, "z")).unwrap_err().code, 67);
        assert_eq!(c.drop_index("_id_").unwrap_err().code, 72);
        assert_eq!(c.drop_index("nope").unwrap_err().code, 27);
        c.insert_many(&[doc! {"_id": 1, "a": 1}], true);
        let before = c.snapshot();
        c.drop_index("a_1").unwrap();
        assert_eq!(c.meta().indexes.iter().map(|i| i.name.clone()).collect::<Vec<_>>(), vec!["_id_"]);
        assert_eq!(c.snapshot().index_scan("a_1", IndexBounds::all(), None, 10).unwrap_err().code, 27);
        // A snapshot from before the drop does not crash (its data may be gone or old).
        let _ = before.index_scan("a_1", IndexBounds::all(), None, 10);
        assert!(c.validate().valid);
        let spec = &c.meta().indexes[0].spec;
        assert_eq!(spec, &doc! {"v": 2, "key": {"_id": 1}, "name": "_id_"});
    }
}

#[test]
fn secondary_indexes_scan_in_key_order() {
    for (label, store, _dir) in stores() {
        let c = store.collection_or_create("db", "c").unwrap();
        let docs = vec![
            doc! {"_id": 1, "a": 3, "b": "x"},
            doc! {"_id": 2, "a": 1.5, "b": "y"},
            doc! {"_id": 3, "a": [2, 10], "b": "z"},
            doc! {"_id": 4, "b": "w"},
            doc! {"_id": 5, "a": "str"},
            doc! {"_id": 6, "a": 3i64, "b": "a"},
        ];
        assert_eq!(c.insert_many(&docs, true).inserted, 6);
        // Built over existing documents, then maintained on insert.
        assert!(c.create_index(idx(doc! {"a": 1, "b": -1}, "a_1_b_-1")).unwrap());
        assert!(c.create_index(IndexSpec { sparse: true, ..idx(doc! {"a": 1}, "a_sparse") }).unwrap());
        assert!(c.create_index(IndexSpec { partial_filter: Some(doc! {"b": {"$exists": true}}), ..idx(doc! {"b": 1}, "b_partial") }).unwrap());
        c.insert_many(&[doc! {"_id": 7, "a": 2, "b": "q"}], true);
        let snap = c.snapshot();
        let got = scan_values(&snap, "a_1_b_-1", IndexBounds::all());
        let expect: Vec<Vec<Bson>> = vec![
            vec![Bson::Null, "w".into()],
            vec![Bson::Double(1.5), "y".into()],
            vec![Bson::Int32(2), "z".into()],
            vec![Bson::Int32(2), "q".into()],
            vec![Bson::Int32(3), "x".into()],
            vec![Bson::Int64(3), "a".into()],
            vec![Bson::Int32(10), "z".into()],
            vec!["str".into(), Bson::Null],
        ];
        assert_eq!(got, expect, "{label}");
        assert!(snap.index_is_multikey("a_1_b_-1").unwrap());
        assert!(!snap.index_is_multikey("b_partial").unwrap());
        assert_eq!(c.multikey_indexes(), vec!["a_1_b_-1".to_string(), "a_sparse".to_string()]);
        // Sparse skips the document without `a`; partial skips the one without `b`.
        assert_eq!(scan_values(&snap, "a_sparse", IndexBounds::all()).len(), 7);
        assert_eq!(scan_values(&snap, "b_partial", IndexBounds::all()).len(), 6);
        // Range [2, 3] over the first field with MinKey/MaxKey on the (descending) second.
        let pat = doc! {"a": 1, "b": -1};
        let lo = encode_index_key(&pat, &[Bson::Int32(2), Bson::MaxKey]);
        let hi = encode_index_key(&pat, &[Bson::Double(3.0), Bson::MinKey]);
        let b = IndexBounds { lower: Bound::Included(lo.clone()), upper: Bound::Included(hi.clone()), reverse: false };
        let got: Vec<i32> = snap.index_scan("a_1_b_-1", b.clone(), None, 100).unwrap().iter().map(|e| snap.get(e.record_id).unwrap().unwrap().get_i32("_id").unwrap()).collect();
        assert_eq!(got, vec![3, 7, 1, 6]);
        // Reverse, paged with resume positions.
        let mut rb = b.clone();
        rb.reverse = true;
        let mut after = None;
        let mut seen = Vec::new();
        loop {
            let page = snap.index_scan("a_1_b_-1", rb.clone(), after.clone(), 1).unwrap();
            let Some(e) = page.last() else { break };
            seen.push(snap.get(e.record_id).unwrap().unwrap().get_i32("_id").unwrap());
            after = Some(e.position.clone());
        }
        assert_eq!(seen, vec![6, 1, 7, 3]);
        // Exclusive bounds on a full key, and points.
        let k2z = encode_index_key(&pat, &[Bson::Int32(2), "z".into()]);
        let ex = IndexBounds { lower: Bound::Excluded(k2z.clone()), upper: Bound::Excluded(hi), reverse: false };
        // Under the descending second field, (3, MinKey) is the last key with a = 3.
        assert_eq!(scan_values(&snap, "a_1_b_-1", ex), vec![vec![Bson::Int32(2), "q".into()], vec![Bson::Int32(3), "x".into()], vec![Bson::Int64(3), "a".into()]]);
        assert_eq!(scan_values(&snap, "a_1_b_-1", IndexBounds::point(k2z)).len(), 1);
        // Index maintenance on update and delete.
        let (rid3, d3) = snap.find_by_id(&Bson::Int32(3)).unwrap().unwrap();
        let mut w = c.writer();
        w.update(rid3, &d3, &doc! {"_id": 3, "a": 100}).unwrap();
        let (rid1, d1) = snap.find_by_id(&Bson::Int32(1)).unwrap().unwrap();
        w.delete(rid1, &d1).unwrap();
        drop(w);
        let now = c.snapshot();
        let firsts: Vec<Bson> = scan_values(&now, "a_sparse", IndexBounds::all()).into_iter().map(|v| v[0].clone()).collect();
        assert_eq!(firsts, vec![Bson::Double(1.5), Bson::Int32(2), Bson::Int64(3), Bson::Int32(100), "str".into()]);
        let v = c.validate();
        assert!(v.valid, "{label}: {:?}", v.errors);
        assert_eq!(v.keys_per_index[1], ("a_1_b_-1".to_string(), 6));
    }
}

#[test]
fn update_checks_unique_indexes() {
    for (_label, store, _dir) in stores() {
        let c = store.collection_or_create("db", "c").unwrap();
        c.create_index(unique_idx(doc! {"u": 1}, "u_1")).unwrap();
        c.insert_many(&[doc! {"_id": 1, "u": 1}, doc! {"_id": 2, "u": 2}], true);
        let snap = c.snapshot();
        let (rid, d) = snap.find_by_id(&Bson::Int32(2)).unwrap().unwrap();
        let mut w = c.writer();
        let e = w.update(rid, &d, &doc! {"_id": 2, "u": 1}).unwrap_err();
        assert_eq!(e.code, 11000);
        // Unchanged key and a type-only change (2 -> 2.0) are fine.
        w.update(rid, &d, &doc! {"_id": 2, "u": 2, "x": 1}).unwrap();
        w.update(rid, &d, &doc! {"_id": 2, "u": 2.0}).unwrap();
        let too_big = doc! {"_id": 2, "s": "x".repeat(17 << 20)};
        assert_eq!(w.update(rid, &d, &too_big).unwrap_err().code, 10334);
        drop(w);
        let e = c.snapshot().index_scan("u_1", IndexBounds::all(), None, 10).unwrap();
        assert_eq!(e[1].values, vec![Bson::Double(2.0)]);
        assert!(c.validate().valid);
    }
}

#[test]
fn rename_and_drop() {
    for (label, store, _dir) in stores() {
        let a = store.create_collection("db1", "a", doc! {"x": 1}).unwrap();
        a.insert_many(&[doc! {"_id": 1}], true);
        a.create_index(idx(doc! {"k": 1}, "k_1")).unwrap();
        let b = store.create_collection("db1", "b", doc! {}).unwrap();
        b.insert_many(&[doc! {"_id": 2}], true);
        assert_eq!(store.create_collection("db1", "a", doc! {}).map(|_| ()).unwrap_err().message, "Collection db1.a already exists.");
        assert_eq!(store.rename_collection("db1", "nope", "db1", "z", false).unwrap_err().code, 26);
        assert_eq!(store.rename_collection("db1", "a", "db1", "b", false).unwrap_err().code, 48);
        let uuid = a.meta().uuid;
        let old_snap = a.snapshot();
        // Across databases, replacing the target.
        store.rename_collection("db1", "a", "db2", "b", false).unwrap();
        assert!(store.collection("db1", "a").is_none());
        let moved = store.collection("db2", "b").unwrap();
        assert_eq!(ids(&moved.snapshot()), vec![Bson::Int32(1)]);
        assert_ne!(moved.meta().uuid, uuid);
        assert_eq!(moved.meta().options, doc! {"x": 1});
        assert_eq!(moved.meta().indexes.len(), 2);
        assert_eq!(ids(&old_snap), vec![Bson::Int32(1)]);
        store.rename_collection("db1", "b", "db2", "b", true).unwrap();
        assert_eq!(ids(&store.collection("db2", "b").unwrap().snapshot()), vec![Bson::Int32(2)], "{label}");
        assert_eq!(store.database_names(), vec!["db2".to_string()]);
        // The replaced collection's handle is dead, its snapshot still readable.
        assert_eq!(moved.insert_many(&[doc! {"_id": 3}], true).errors[0].1.code, 26);
        let _ = moved.snapshot().scan(None, 10);
        // Drop.
        let c = store.collection("db2", "b").unwrap();
        let snap = c.snapshot();
        assert!(store.drop_collection("db2", "b").unwrap());
        assert!(!store.drop_collection("db2", "b").unwrap());
        let _ = snap.scan(None, 10);
        let _ = snap.count();
        assert!(store.database_names().is_empty());
        // A re-created collection starts empty.
        let c2 = store.collection_or_create("db2", "b").unwrap();
        assert_eq!(c2.snapshot().count().unwrap(), 0);
        assert!(ids(&c2.snapshot()).is_empty());
        store.collection_or_create("db3", "x").unwrap();
        store.collection_or_create("db3", "y").unwrap();
        store.drop_database("db3").unwrap();
        assert_eq!(store.database_names(), vec!["db2".to_string()]);
        // Dropped data is gone from the engine.
        let es = store.inner.shared.engine.snapshot();
        assert_eq!(es.iter(Space::Records, Bound::Unbounded, Bound::Unbounded, false).count(), 0);
        assert_eq!(es.iter(Space::Index, Bound::Unbounded, Bound::Unbounded, false).count(), 0);
    }
}

#[test]
fn names_are_validated() {
    let store = Store::open_in_memory();
    for (db, name) in [("", "c"), ("a.b", "c"), ("a b", "c"), ("db", ""), ("db", "a$b"), ("db", "a\0b"), ("db", "system.foo")] {
        assert_eq!(store.create_collection(db, name, doc! {}).map(|_| ()).unwrap_err().code, 73, "{db:?} {name:?}");
        assert_eq!(store.collection_or_create(db, name).map(|_| ()).unwrap_err().code, 73);
    }
    assert!(store.create_collection("db", "system.js", doc! {}).is_ok());
    assert!(store.create_collection("db", "a.b", doc! {}).is_ok());
    assert_eq!(store.rename_collection("db", "a.b", "db", "a.b", false).unwrap_err().code, 20);
}

#[test]
fn catalog_and_data_survive_reopen() {
    let dir = TempDir::new("reopen");
    let opts = StoreOptions { cache_size_bytes: 8 << 20, fsync: true };
    let (uuid, last_rid) = {
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        let c = store.create_collection("db", "c", doc! {"validator": {"a": 1}}).unwrap();
        c.create_index(unique_idx(doc! {"a": 1}, "a_1")).unwrap();
        let docs: Vec<Document> = (0..100).map(|i| doc! {"_id": i, "a": i}).collect();
        c.insert_many(&docs, true);
        store.create_collection("db", "gone", doc! {}).unwrap();
        store.drop_collection("db", "gone").unwrap();
        store.create_collection("other", "x", doc! {}).unwrap();
        store.rename_collection("other", "x", "other", "y", false).unwrap();
        c.create_index(idx(doc! {"b": 1}, "b_1")).unwrap();
        c.drop_index("b_1").unwrap();
        let snap = c.snapshot();
        let last = snap.scan(None, usize::MAX).unwrap().last().unwrap().0;
        // Delete the last record: its id must still not be reused after reopen.
        let mut w = c.writer();
        w.delete(last, &doc! {}).unwrap();
        drop(w);
        store.commit_durable().unwrap();
        (c.meta().uuid, last)
    };
    let store = Store::open(dir.path(), opts).unwrap();
    assert_eq!(store.database_names(), vec!["db".to_string(), "other".to_string()]);
    assert_eq!(store.list_collections("other").iter().map(|m| m.name.clone()).collect::<Vec<_>>(), vec!["y"]);
    let c = store.collection("db", "c").unwrap();
    let m = c.meta();
    assert_eq!(m.uuid, uuid);
    assert_eq!(m.options, doc! {"validator": {"a": 1}});
    assert_eq!(m.indexes.iter().map(|i| (i.name.clone(), i.unique)).collect::<Vec<_>>(), vec![("_id_".to_string(), true), ("a_1".to_string(), true)]);
    assert_eq!(c.snapshot().count().unwrap(), 99);
    assert_eq!(c.stats().count, 99);
    let v = c.validate();
    assert!(v.valid, "{:?}", v.errors);
    // Unique index still enforced; record ids keep increasing.
    assert_eq!(c.insert_many(&[doc! {"_id": 1000, "a": 5}], true).errors[0].1.code, 11000);
    let rid = c.writer().insert(&doc! {"_id": 1001, "a": 1001}).unwrap();
    assert!(rid > last_rid);
}

#[test]
fn snapshot_isolation() {
    for (_label, store, _dir) in stores() {
        let c = store.collection_or_create("db", "c").unwrap();
        c.insert_many(&[doc! {"_id": 1, "v": 1}], true);
        c.create_index(idx(doc! {"v": 1}, "v_1")).unwrap();
        let snap = c.snapshot();
        c.insert_many(&[doc! {"_id": 2, "v": 2}], true);
        let (rid, d) = snap.find_by_id(&Bson::Int32(1)).unwrap().unwrap();
        c.writer().update(rid, &d, &doc! {"_id": 1, "v": 9}).unwrap();
        assert_eq!(snap.count().unwrap(), 1);
        assert_eq!(ids(&snap), vec![Bson::Int32(1)]);
        assert_eq!(snap.get(rid).unwrap().unwrap(), doc! {"_id": 1, "v": 1});
        assert_eq!(scan_values(&snap, "v_1", IndexBounds::all()), vec![vec![Bson::Int32(1)]]);
        assert!(snap.find_by_id(&Bson::Int32(2)).unwrap().is_none());
        let now = c.snapshot();
        assert_eq!(scan_values(&now, "v_1", IndexBounds::all()), vec![vec![Bson::Int32(2)], vec![Bson::Int32(9)]]);
        // Snapshots are Send + 'static and outlive their collection handle.
        let c2 = c.clone();
        drop(c);
        let h = std::thread::spawn(move || snap.count().unwrap());
        assert_eq!(h.join().unwrap(), 1);
        drop(c2);
    }
}

/// An engine whose sync is slow, so concurrent commits overlap.
struct SlowSync(MemoryEngine);

impl Engine for SlowSync {
    fn snapshot(&self) -> Arc<dyn EngineSnapshot> {
        self.0.snapshot()
    }
    fn write(&self, batch: Batch) -> common::Result<()> {
        self.0.write(batch)
    }
    fn sync(&self) -> common::Result<()> {
        std::thread::sleep(std::time::Duration::from_millis(30));
        self.0.sync()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn space_size_bytes(&self, space: Space) -> u64 {
        self.0.space_size_bytes(space)
    }
}

fn concurrent_commits(store: Store) -> (u64, u64) {
    const THREADS: usize = 8;
    const ROUNDS: usize = 5;
    let c = store.collection_or_create("db", "c").unwrap();
    let base = store.sync_count();
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (store, c, barrier) = (store.clone(), c.clone(), barrier.clone());
            std::thread::spawn(move || {
                for r in 0..ROUNDS {
                    barrier.wait();
                    let out = c.insert_many(&[doc! {"_id": (t * 1000 + r) as i64}], true);
                    assert_eq!(out.inserted, 1);
                    store.commit_durable().unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(c.snapshot().count().unwrap(), (THREADS * ROUNDS) as u64);
    (store.sync_count() - base, (THREADS * ROUNDS) as u64)
}

#[test]
fn concurrent_commit_durable_coalesces() {
    let store = Store::open_with_engine(Arc::new(SlowSync(MemoryEngine::new()))).unwrap();
    let (syncs, commits) = concurrent_commits(store);
    // Each round's 8 commits share at most two syncs (one in flight, one covering the rest).
    assert!(syncs <= 2 * 5, "{syncs} syncs for {commits} commits");
    // And with fjall's real fsync.
    let dir = TempDir::new("group");
    let store = Store::open(dir.path(), StoreOptions { cache_size_bytes: 8 << 20, fsync: true }).unwrap();
    let (syncs, commits) = concurrent_commits(store);
    assert!(syncs < commits, "{syncs} syncs for {commits} commits");
    // Nothing new to sync: no sync at all.
    let store = Store::open_in_memory();
    store.commit_durable().unwrap();
    let n = store.sync_count();
    store.commit_durable().unwrap();
    assert_eq!(store.sync_count(), n);
}

#[test]
fn corrupt_records_are_errors_not_panics() {
    let engine = Arc::new(MemoryEngine::new());
    let store = Store::open_with_engine(engine.clone()).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    c.insert_many(&[doc! {"_id": 1}], true);
    let rid = c.snapshot().scan(None, 1).unwrap()[0].0;
    let mut b = Batch::new();
    b.put(Space::Records, record_key(c.state.id, rid), vec![5, 0, 0, 0, 7, 1, 2]);
    b.put(Space::Records, record_key(c.state.id, rid + 1), vec![]);
    engine.write(b).unwrap();
    let snap = c.snapshot();
    assert!(snap.get(rid).is_err());
    assert!(snap.get(rid + 1).is_err());
    assert!(snap.scan(None, 10).is_err());
    assert!(snap.find_by_id(&Bson::Int32(1)).is_err());
    assert!(c.writer().delete(rid, &doc! {}).is_err());
    let v = c.validate();
    assert!(!v.valid);
    assert!(!v.errors.is_empty());
}

/// Child half of the crash test: runs only when spawned by `acknowledged_writes_survive_kill_9`.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var("SHOAL_STORAGE_CRASH_DIR") else { return };
    let store = Store::open(Path::new(&dir), StoreOptions { cache_size_bytes: 8 << 20, fsync: true }).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    c.create_index(idx(doc! {"a": 1}, "a_1")).unwrap();
    use std::io::Write;
    let mut out = std::io::stdout();
    for batch in 0i64.. {
        let docs: Vec<Document> = (0..50).map(|i| doc! {"_id": batch * 50 + i, "a": i, "pad": "x".repeat(200)}).collect();
        assert_eq!(c.insert_many(&docs, true).inserted, 50);
        store.commit_durable().unwrap();
        writeln!(out, "ACK {batch}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    use std::io::BufRead;
    let dir = TempDir::new("crash");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tests::crash_child", "--nocapture", "--test-threads=1"])
        .env("SHOAL_STORAGE_CRASH_DIR", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut acked = -1i64;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("ACK ") {
            acked = n.parse().unwrap();
            if acked >= 40 {
                // SIGKILL mid-stream (the child keeps writing while we read).
                let _ = std::process::Command::new("kill").args(["-9", &child.id().to_string()]).status();
                break;
            }
        }
    }
    let _ = child.wait();
    assert!(acked >= 40);
    let store = Store::open(dir.path(), StoreOptions { cache_size_bytes: 8 << 20, fsync: true }).unwrap();
    let c = store.collection("db", "c").unwrap();
    let snap = c.snapshot();
    for id in 0..(acked + 1) * 50 {
        assert!(snap.find_by_id(&Bson::Int64(id)).unwrap().is_some(), "acknowledged _id {id} lost");
    }
    assert!(snap.count().unwrap() >= ((acked + 1) * 50) as u64);
    let v = c.validate();
    assert!(v.valid, "{:?}", v.errors);
}

#[test]
#[ignore]
fn bench_insert_1000_doc_batches() {
    let dir = TempDir::new("bench");
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    for f in ["a", "b", "c"] {
        c.create_index(idx(doc! {f: 1}, &format!("{f}_1"))).unwrap();
    }
    let batches = 50;
    let all: Vec<Vec<Document>> = (0..batches)
        .map(|b| {
            (0..1000)
                .map(|i| doc! {"_id": bson::oid::ObjectId::new(), "a": b * 1000 + i, "b": format!("user{i}"), "c": (i % 7) as f64, "pad": "x".repeat(900)})
                .collect()
        })
        .collect();
    let start = std::time::Instant::now();
    let mut in_insert = std::time::Duration::ZERO;
    for docs in &all {
        let t = std::time::Instant::now();
        assert_eq!(c.insert_many(docs, false).inserted, 1000);
        in_insert += t.elapsed();
        store.commit_durable().unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!("insert_many: {:.0} docs/s", (batches * 1000) as f64 / in_insert.as_secs_f64());
    eprintln!("{:.0} docs/s", (batches * 1000) as f64 / secs);
}

#[test]
fn interrupted_drops_and_builds_are_cleaned_at_open() {
    let engine = Arc::new(MemoryEngine::new());
    let (coll_id, stray_index) = {
        let store = Store::open_with_engine(engine.clone()).unwrap();
        let c = store.collection_or_create("db", "c").unwrap();
        c.insert_many(&[doc! {"_id": 1, "a": 1}], true);
        let id = c.state.id;
        // As if a crash hit an index build (marker + some entries) and a collection drop
        // (marker committed, data not yet deleted).
        let stray = store.inner.shared.alloc_id();
        let mut b = Batch::new();
        b.put(Space::Catalog, garbage_key(GARBAGE_INDEX, stray), vec![]);
        b.put(Space::Index, [stray.to_be_bytes().as_slice(), b"k"].concat(), vec![1]);
        b.put(Space::Catalog, garbage_key(GARBAGE_COLLECTION, 999), vec![]);
        b.put(Space::Records, record_key(999, 1), vec![1]);
        engine.write(b).unwrap();
        (id, stray)
    };
    let store = Store::open_with_engine(engine.clone()).unwrap();
    let snap = engine.snapshot();
    assert_eq!(snap.iter(Space::Catalog, Bound::Unbounded, Bound::Unbounded, false).filter(|kv| kv.as_ref().unwrap().0[0] == b'g').count(), 0);
    assert!(snap.get(Space::Records, &record_key(999, 1)).unwrap().is_none());
    assert_eq!(snap.iter(Space::Index, Bound::Included(stray_index.to_be_bytes().to_vec()), Bound::Unbounded, false).count(), 0);
    // Ids are allocated above everything seen, including the markers.
    assert!(store.inner.shared.alloc_id() > stray_index.max(999));
    let c = store.collection("db", "c").unwrap();
    assert_eq!(c.state.id, coll_id);
    assert!(c.validate().valid);
}
