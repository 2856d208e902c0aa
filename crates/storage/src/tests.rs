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
    let fj = Store::open(dir.path(), StoreOptions { cache_size_bytes: crate::CACHE_SIZE_BYTES_MIN, fsync: true }).unwrap();
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
        w.update(rid, &d, &doc! {"_id": 2, "a": "z", "b": [1, 2]}, UpdateForm::Modifiers).unwrap();
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
        assert_eq!(e.extra.as_deref(), Some(&doc! {"keyPattern": {"_id": 1}, "keyValue": {"_id": 1}}));
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
        assert_eq!(e.extra.as_deref(), Some(&doc! {"keyPattern": {"email": 1}, "keyValue": {"email": "a"}}));
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
        assert_eq!(
            store
                .inner
                .shared
                .engine
                .snapshot()
                .iter(Space::Catalog, Bound::Unbounded, Bound::Unbounded, false)
                .filter(|kv| kv.as_ref().unwrap().0[0] == b'g')
                .count(),
            0
        );
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
        let got: Vec<i32> = snap
            .index_scan("a_1_b_-1", b.clone(), None, 100)
            .unwrap()
            .iter()
            .map(|e| snap.get(e.record_id).unwrap().unwrap().get_i32("_id").unwrap())
            .collect();
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
        assert_eq!(
            scan_values(&snap, "a_1_b_-1", ex),
            vec![vec![Bson::Int32(2), "q".into()], vec![Bson::Int32(3), "x".into()], vec![Bson::Int64(3), "a".into()]]
        );
        assert_eq!(scan_values(&snap, "a_1_b_-1", IndexBounds::point(k2z)).len(), 1);
        // Index maintenance on update and delete.
        let (rid3, d3) = snap.find_by_id(&Bson::Int32(3)).unwrap().unwrap();
        let mut w = c.writer();
        w.update(rid3, &d3, &doc! {"_id": 3, "a": 100}, UpdateForm::Modifiers).unwrap();
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
        let e = w.update(rid, &d, &doc! {"_id": 2, "u": 1}, UpdateForm::Modifiers).unwrap_err();
        assert_eq!(e.code, 11000);
        // Unchanged key and a type-only change (2 -> 2.0) are fine. `old` is always the
        // current stored document, as Writer::update requires.
        let d1 = doc! {"_id": 2, "u": 2, "x": 1};
        w.update(rid, &d, &d1, UpdateForm::Modifiers).unwrap();
        let d2 = doc! {"_id": 2, "u": 2.0};
        w.update(rid, &d1, &d2, UpdateForm::Modifiers).unwrap();
        let too_big = doc! {"_id": 2, "s": "x".repeat(17 << 20)};
        assert_eq!(w.update(rid, &d2, &too_big, UpdateForm::Modifiers).unwrap_err().code, 10334);
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
    let opts = StoreOptions { cache_size_bytes: crate::CACHE_SIZE_BYTES_MIN, fsync: true };
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
        c.writer().update(rid, &d, &doc! {"_id": 1, "v": 9}, UpdateForm::Modifiers).unwrap();
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
    fn position(&self) -> u64 {
        self.0.position()
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
    // And with fjall's real fsync. How much a fast fsync coalesces depends on scheduling (a
    // loaded machine may run the threads one after another), so only the bound that holds
    // regardless is asserted; the slow-sync engine above proves the coalescing.
    let dir = TempDir::new("group");
    let store = Store::open(dir.path(), StoreOptions { cache_size_bytes: crate::CACHE_SIZE_BYTES_MIN, fsync: true }).unwrap();
    let (syncs, commits) = concurrent_commits(store);
    assert!(syncs >= 1 && syncs <= commits, "{syncs} syncs for {commits} commits");
    eprintln!("fjall: {syncs} fsyncs for {commits} concurrent commits");
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
    let store = Store::open(Path::new(&dir), StoreOptions { cache_size_bytes: crate::CACHE_SIZE_BYTES_MIN, fsync: true }).unwrap();
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
    let store = Store::open(dir.path(), StoreOptions { cache_size_bytes: crate::CACHE_SIZE_BYTES_MIN, fsync: true }).unwrap();
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

#[test]
fn hashed_indexes() {
    for (label, store, _dir) in stores() {
        let c = store.collection_or_create("db", "h").unwrap();
        let docs: Vec<Document> = (0..100).map(|i| doc! {"_id": i, "a": i % 10, "b": format!("s{i}")}).collect();
        assert_eq!(c.insert_many(&docs, true).inserted, 100);
        // Built over existing data, then maintained by writes.
        assert!(c.create_index(idx(doc! {"a": "hashed"}, "a_hashed")).unwrap(), "{label}");
        assert!(c.create_index(idx(doc! {"b": 1, "a": "hashed"}, "b_1_a_hashed")).unwrap());
        assert_eq!(c.insert_many(&[doc! {"_id": 100, "a": 42.7}], true).inserted, 1);
        let snap = c.snapshot();
        let key = encode_index_key(&doc! {"a": "hashed"}, &[Bson::Int64(hashed_value(&Bson::Int32(42)).unwrap())]);
        assert_eq!(key, encode_index_key(&doc! {"a": 1}, &[Bson::Int64(-944302157085130861)]));
        let hits = snap.index_scan("a_hashed", IndexBounds::point(key), None, 10).unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(snap.get(hits[0].record_id).unwrap().unwrap().get_i32("_id").unwrap(), 100);
        assert_eq!(hits[0].values, vec![Bson::Int64(-944302157085130861)]);
        let key = encode_index_key(&doc! {"a": "hashed"}, &[Bson::Int64(hashed_value(&Bson::Int32(3)).unwrap())]);
        assert_eq!(snap.index_scan("a_hashed", IndexBounds::point(key), None, 100).unwrap().len(), 10);
        assert!(!snap.index_is_multikey("a_hashed").unwrap());
        // Arrays are refused per document, and fail a build.
        let out = c.insert_many(&[doc! {"_id": 101, "a": [1]}, doc! {"_id": 102, "a": 1}], false);
        assert_eq!((out.inserted, out.errors.len(), out.errors[0].1.code), (1, 1, 16766));
        let mut w = c.writer();
        let (rid, d) = w.snapshot().find_by_id(&Bson::Int32(102)).unwrap().unwrap();
        let d1 = doc! {"_id": 102, "a": {"x": [1]}};
        assert_eq!(w.update(rid, &d, &d1, UpdateForm::Modifiers).map_err(|e| e.code), Ok(()));
        assert_eq!(w.update(rid, &d1, &doc! {"_id": 102, "b": [1]}, UpdateForm::Modifiers).unwrap_err().code, 16766);
        drop(w);
        assert!(c.validate().valid, "{:?}", c.validate().errors);
        let c2 = store.collection_or_create("db", "h2").unwrap();
        c2.insert_many(&[doc! {"_id": 1, "a": [1, 2]}], true);
        assert_eq!(c2.create_index(idx(doc! {"a": "hashed"}, "a_hashed")).unwrap_err().code, 16766);
        assert_eq!(c2.meta().indexes.len(), 1);
        // Spec rules.
        let e = c.create_index(unique_idx(doc! {"x": "hashed"}, "x_hashed")).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (16764, "Currently hashed indexes cannot guarantee uniqueness. Use a regular index."));
        let e = c.create_index(idx(doc! {"x": "hashed", "y": "hashed"}, "xy")).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (31303, "A maximum of one index field is allowed to be hashed but found 2 for 'key' { x: \"hashed\", y: \"hashed\" }")
        );
        assert_eq!(c.create_index(idx(doc! {"x": "2dsphere"}, "x_2d")).unwrap_err().code, 67);
        // Sparse hashed skips documents without the field.
        assert!(c.create_index(IndexSpec { sparse: true, ..idx(doc! {"zz": "hashed"}, "zz_hashed") }).unwrap());
        assert_eq!(c.snapshot().index_scan("zz_hashed", IndexBounds::all(), None, 1000).unwrap().len(), 0);
    }
}

fn ttl_idx(key: Document, name: &str, secs: i64) -> IndexSpec {
    IndexSpec { expire_after_seconds: Some(secs), ..IndexSpec::new(key, name) }
}

fn date_ago(secs: i64) -> Bson {
    Bson::DateTime(bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - secs * 1000))
}

fn ids_i32(c: &Collection) -> Vec<i32> {
    let mut v: Vec<i32> = ids(&c.snapshot()).into_iter().filter_map(|b| b.as_i32()).collect();
    v.sort();
    v
}

#[test]
fn ttl_pass_deletes_expired_documents_in_batches() {
    for (label, store, _dir) in stores() {
        for (coll, dir) in [("asc", 1), ("desc", -1)] {
            let c = store.collection_or_create("db", coll).unwrap();
            c.create_index(ttl_idx(doc! {"at": dir}, "at_1", 60)).unwrap();
            c.create_index(idx(doc! {"k": 1}, "k_1")).unwrap();
            let kept = vec![
                doc! {"_id": 1, "at": date_ago(0), "k": 1},
                doc! {"_id": 2, "at": [date_ago(0), date_ago(10)], "k": 2},
                doc! {"_id": 3, "at": "not a date", "k": 3},
                doc! {"_id": 4, "k": 4},
                doc! {"_id": 5, "at": bson::Timestamp { time: 1, increment: 1 }},
            ];
            let expired = vec![doc! {"_id": 6, "at": date_ago(120)}, doc! {"_id": 7, "at": [date_ago(0), date_ago(3600)], "k": 7}];
            assert_eq!(c.insert_many(&kept, true).inserted, kept.len());
            assert_eq!(c.insert_many(&expired, true).inserted, expired.len());
            // More than one delete batch.
            let old: Vec<Document> = (0..2500).map(|i| doc! {"_id": 100 + i, "at": date_ago(61 + i as i64), "k": i}).collect();
            assert_eq!(c.insert_many(&old, true).inserted, old.len());
        }
        let before = store.ttl_passes();
        assert_eq!(store.run_ttl_pass().unwrap(), 2 * 2502, "{label}");
        assert_eq!(store.ttl_deleted_count(), 2 * 2502);
        assert_eq!(store.ttl_passes(), before + 1);
        for coll in ["asc", "desc"] {
            let c = store.collection("db", coll).unwrap();
            assert_eq!(ids_i32(&c), vec![1, 2, 3, 4, 5], "{label} {coll}");
            let v = c.validate();
            assert!(v.valid, "{:?}", v.errors);
            assert_eq!(c.snapshot().count().unwrap(), 5);
        }
        assert_eq!(store.run_ttl_pass().unwrap(), 0);
        // Capped collections are left alone.
        let capped = store.create_collection("db", "capped", doc! {"capped": true, "size": 100000}).unwrap();
        capped.create_index(ttl_idx(doc! {"at": 1}, "at_1", 0)).unwrap();
        capped.insert_many(&[doc! {"_id": 1, "at": date_ago(100)}], true);
        assert_eq!(store.run_ttl_pass().unwrap(), 0);
    }
}

#[test]
fn ttl_monitor_runs_in_background_and_stops_with_the_store() {
    let store = Store::open_in_memory();
    let c = store.collection_or_create("db", "c").unwrap();
    c.create_index(ttl_idx(doc! {"at": 1}, "at_1", 1)).unwrap();
    store.start_ttl_monitor(std::time::Duration::from_millis(20));
    store.start_ttl_monitor(std::time::Duration::from_millis(20));
    let docs: Vec<Document> = (0..10).map(|i| doc! {"_id": i, "at": date_ago(5)}).collect();
    c.insert_many(&docs, true);
    c.insert_many(&[doc! {"_id": 100, "at": date_ago(-3600)}], true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.ttl_deleted_count() < 10 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(store.ttl_deleted_count(), 10);
    assert!(store.ttl_passes() >= 1);
    assert_eq!(ids_i32(&c), vec![100]);
    let monitor = store.inner.ttl.clone();
    let weak = Arc::downgrade(&store.inner);
    drop(c);
    drop(store);
    // The last Store is gone (possibly released by the monitor itself, if a pass was under
    // way): the monitor was told to stop and its handle taken (joined, or detached when the
    // monitor dropped the store itself).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while weak.upgrade().is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(weak.upgrade().is_none());
    assert!(*monitor.stop.lock());
    assert!(monitor.thread.lock().is_none());
}

/// Inserts, updates and deletes on `c` until `stop`; returns the number of operations.
fn churn(c: Collection, stop: Arc<std::sync::atomic::AtomicBool>, ops: Arc<std::sync::atomic::AtomicU64>, first_id: i64) {
    use std::sync::atomic::Ordering::*;
    let mut next = first_id;
    let mut victim = 0i64;
    while !stop.load(Relaxed) {
        let batch: Vec<Document> = (0..20).map(|i| doc! {"_id": next + i, "a": (next + i) % 1000, "u": next + i}).collect();
        next += 20;
        assert_eq!(c.insert_many(&batch, true).inserted, 20);
        let mut w = c.writer();
        for _ in 0..5 {
            victim = (victim + 7919) % 50_000;
            if let Some((rid, d)) = w.snapshot().find_by_id(&Bson::Int64(victim)).unwrap() {
                if victim % 2 == 0 {
                    let mut n = d.clone();
                    n.insert("a", Bson::Int64(victim % 1000 + 5000));
                    n.insert("extra", [1, 2, 3]);
                    w.update(rid, &d, &n, UpdateForm::Modifiers).unwrap();
                } else {
                    w.delete(rid, &d).unwrap();
                }
            }
        }
        drop(w);
        ops.fetch_add(25, Relaxed);
    }
}

#[test]
fn index_builds_do_not_block_writers() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
    for (label, store, _dir) in stores() {
        let c = store.collection_or_create("db", "c").unwrap();
        for b in 0..50i64 {
            let docs: Vec<Document> = (0..1000).map(|i| b * 1000 + i).map(|i| doc! {"_id": i, "a": i % 1000, "u": i}).collect();
            assert_eq!(c.insert_many(&docs, true).inserted, 1000);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let writer = {
            let (c, stop, ops) = (c.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || churn(c, stop, ops, 1_000_000))
        };
        let watcher = {
            let (store, c, stop) = (store.clone(), c.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut max_done = 0;
                while !stop.load(Relaxed) {
                    for b in store.index_builds() {
                        assert_eq!(b.ns, "db.c");
                        assert!(b.done_records <= b.total_records + 1000);
                        max_done = max_done.max(b.done_records);
                        // Readers never see an index being built. The build may finish between
                        // listing it and looking, so a visible index must no longer be building.
                        let in_meta = c.meta().indexes.iter().any(|i| i.name == b.index_name);
                        let scannable = c.snapshot().index_scan(&b.index_name, IndexBounds::all(), None, 1).map_err(|e| e.code);
                        if in_meta || scannable.is_ok() {
                            assert!(store.index_builds().iter().all(|x| x.index_name != b.index_name), "a building index was visible to readers");
                        } else {
                            assert_eq!(scannable.err(), Some(27));
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                max_done
            })
        };
        while ops.load(Relaxed) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let ops_before = ops.load(Relaxed);
        assert!(c.create_index(idx(doc! {"a": 1, "extra": 1}, "a_1_extra_1")).unwrap(), "{label}");
        assert!(c.create_index(unique_idx(doc! {"u": 1}, "u_1")).unwrap());
        let ops_during = ops.load(Relaxed) - ops_before;
        stop.store(true, Relaxed);
        writer.join().unwrap();
        let max_done = watcher.join().unwrap();
        assert!(ops_during > 0, "{label}: writers made no progress during the builds");
        assert!(max_done > 0, "{label}: no build progress observed");
        assert!(store.index_builds().is_empty());
        let v = c.validate();
        assert!(v.valid, "{label}: {:?}", v.errors);
        let n = c.snapshot().count().unwrap();
        assert_eq!(v.keys_per_index.iter().find(|(k, _)| k == "u_1").map(|x| x.1), Some(n));
        assert!(c.multikey_indexes().contains(&"a_1_extra_1".to_string()));
        eprintln!("{label}: {ops_during} concurrent write ops during the builds, {n} records");
        // The builds are in the catalog.
        assert_eq!(c.meta().indexes.len(), 3);
    }
}

#[test]
fn unique_build_fails_on_a_concurrent_duplicate_and_the_write_succeeds() {
    let store = Store::open_in_memory();
    let c = store.collection_or_create("db", "c").unwrap();
    for b in 0..50i64 {
        let docs: Vec<Document> = (0..1000).map(|i| b * 1000 + i).map(|i| doc! {"_id": i, "u": i}).collect();
        c.insert_many(&docs, true);
    }
    let builder = {
        let c = c.clone();
        std::thread::spawn(move || c.create_index(unique_idx(doc! {"u": 1}, "u_1")))
    };
    // Once the build is under way, insert duplicates of an early and a late record.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let b = store.index_builds();
        if b.first().is_some_and(|b| b.done_records > 0) || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::yield_now();
    }
    // The build has 49 chunks left: it is still running when the insert goes in.
    assert!(store.index_builds().first().is_some_and(|b| b.done_records < b.total_records / 2));
    let out = c.insert_many(&[doc! {"_id": "dup1", "u": 0}, doc! {"_id": "dup2", "u": 49_999}], false);
    let result = builder.join().unwrap();
    assert_eq!(out.inserted, 2, "{:?}", out.errors);
    assert_eq!(result.unwrap_err().code, 11000);
    assert_eq!(c.meta().indexes.len(), 1);
    assert!(c.validate().valid);
    // Nothing of the failed build remains.
    let snap = store.inner.shared.engine.snapshot();
    assert_eq!(snap.iter(Space::Catalog, Bound::Unbounded, Bound::Unbounded, false).filter(|kv| kv.as_ref().unwrap().0[0] == b'g').count(), 0);
    assert_eq!(snap.iter(Space::Index, Bound::Unbounded, Bound::Unbounded, false).count(), 50_002);
}

#[test]
fn dropping_an_index_or_collection_aborts_its_build() {
    let store = Store::open_in_memory();
    for (coll, drop_collection) in [("i", false), ("c", true)] {
        let c = store.collection_or_create("db", coll).unwrap();
        for b in 0..50i64 {
            let docs: Vec<Document> = (0..1000).map(|i| b * 1000 + i).map(|i| doc! {"_id": i, "a": i}).collect();
            c.insert_many(&docs, true);
        }
        let builder = {
            let c = c.clone();
            std::thread::spawn(move || c.create_index(idx(doc! {"a": 1}, "a_1")))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.index_builds().first().is_none_or(|b| b.done_records == 0) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        if drop_collection {
            store.drop_collection("db", coll).unwrap();
        } else {
            c.drop_index("a_1").unwrap();
        }
        match builder.join().unwrap() {
            Err(e) => assert_eq!(e.code, 276, "{}", e.message),
            Ok(created) => assert!(created, "the build finished before the drop"),
        }
        if !drop_collection {
            assert_eq!(c.meta().indexes.len(), 1);
            assert!(c.validate().valid);
        }
    }
    // No entries of either build remain.
    let snap = store.inner.shared.engine.snapshot();
    assert_eq!(snap.iter(Space::Catalog, Bound::Unbounded, Bound::Unbounded, false).filter(|kv| kv.as_ref().unwrap().0[0] == b'g').count(), 0);
}

#[test]
fn entry_fast_path_matches_general_key_generation() {
    let docs = vec![
        doc! {"_id": 1, "a": 5, "b": "x", "c": {"d": 2.5}},
        doc! {"_id": 2, "a": null, "c": 7},
        doc! {"_id": 3, "b": {"z": [1]}, "c": {"d": {"e": 1}}},
        doc! {"_id": 4},
        doc! {"_id": 5, "a": [1, 2], "b": 1},
        doc! {"_id": 6, "c": [{"d": 1}, {"d": 2}]},
        doc! {"_id": 7, "c": {"d": []}},
    ];
    let patterns = vec![doc! {"a": 1}, doc! {"a": 1, "b": -1}, doc! {"c.d": 1, "a": 1}, doc! {"c.d.e": -1}, doc! {"b": 1, "_id": 1}];
    for pattern in patterns {
        for (unique, sparse) in [(false, false), (true, false), (false, true)] {
            let spec = IndexSpec { unique, sparse, ..IndexSpec::new(pattern.clone(), "i") };
            let rt = IndexRt::new(77, spec).unwrap();
            for d in &docs {
                let rid = 9;
                let (got, got_mk) = rt.entries(d, rid).unwrap();
                let (keys, mk) = index_keys(&rt.fields, sparse, d).unwrap();
                let want: Vec<(Vec<u8>, Vec<u8>)> = keys
                    .into_iter()
                    .map(|(k, values)| {
                        let mut stored = 77u64.to_be_bytes().to_vec();
                        stored.extend_from_slice(&k);
                        if !unique {
                            stored.extend_from_slice(&rid.to_be_bytes());
                        }
                        let mut vd = Document::new();
                        for (i, v) in values.into_iter().enumerate() {
                            vd.insert(i.to_string(), v);
                        }
                        let mut value = rid.to_be_bytes().to_vec();
                        value.extend_from_slice(&vd.to_vec().unwrap());
                        (stored, value)
                    })
                    .collect();
                assert_eq!((got, got_mk), (want, mk), "{pattern} {d} unique={unique} sparse={sparse}");
            }
        }
    }
}

fn oplog_entries(store: &Store) -> Vec<Document> {
    let log = store.collection(OPLOG_DB, OPLOG_COLLECTION).expect("oplog exists");
    log.snapshot().scan(None, usize::MAX).unwrap().into_iter().map(|(_, d)| d).collect()
}

fn ops(entries: &[Document]) -> Vec<(String, String)> {
    entries.iter().map(|e| (e.get_str("op").unwrap().to_string(), e.get_str("ns").unwrap().to_string())).collect()
}

#[test]
fn oplog_records_every_change_in_order_with_the_write() {
    for (label, store, _dir) in stores() {
        assert!(store.oplog_last().is_none(), "{label}: a standalone keeps no oplog");
        store.enable_oplog(64 << 20).unwrap();
        store.set_oplog_term(3);
        let noop = store.append_oplog_noop(&doc! {"msg": "initiating set"}).unwrap();
        let c = store.collection_or_create("db", "c").unwrap();
        let uuid = c.meta().uuid;
        assert_eq!(c.insert_many(&[doc! {"_id": 1, "a": 1}, doc! {"_id": 2, "a": 2}], true).inserted, 2);
        {
            let mut w = c.writer();
            let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(1)).unwrap().unwrap();
            w.update(rid, &old, &doc! {"_id": 1, "a": 10}, UpdateForm::Modifiers).unwrap();
            let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(2)).unwrap().unwrap();
            w.delete(rid, &old).unwrap();
        }
        assert!(c.create_index(idx(doc! {"a": 1}, "a_1")).unwrap());
        c.drop_index("a_1").unwrap();
        // The local database is never logged.
        store.collection_or_create("local", "scratch").unwrap().insert_many(&[doc! {"_id": 1}], true);
        store.rename_collection("db", "c", "db", "d", false).unwrap();
        store.drop_collection("db", "d").unwrap();

        let entries = oplog_entries(&store);
        let want = [
            ("n", ""),
            ("c", "db.$cmd"),
            ("i", "db.c"),
            ("i", "db.c"),
            ("u", "db.c"),
            ("d", "db.c"),
            ("c", "db.$cmd"),
            ("c", "db.$cmd"),
            ("c", "db.$cmd"),
            ("c", "db.$cmd"),
        ];
        let want: Vec<(String, String)> = want.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        assert_eq!(ops(&entries), want, "{label}");
        let o = |i: usize| entries[i].get_document("o").unwrap().clone();
        assert_eq!(o(0), doc! {"msg": "initiating set"});
        assert_eq!(o(1), doc! {"create": "c"});
        assert_eq!(o(2), doc! {"_id": 1, "a": 1});
        assert_eq!(o(4), doc! {"$v": 2, "diff": {"u": {"a": 10}}}, "an update by operators logs its diff");
        assert_eq!(entries[4].get_document("o2").unwrap(), &doc! {"_id": 1});
        assert_eq!(o(5), doc! {"_id": 2});
        assert_eq!(o(6), doc! {"createIndexes": "c", "v": 2, "key": {"a": 1}, "name": "a_1"});
        assert_eq!(o(7), doc! {"dropIndexes": "c", "index": "a_1"});
        assert_eq!(o(8).get_str("renameCollection").unwrap(), "db.c");
        assert_eq!(o(9), doc! {"drop": "d"});
        assert_eq!(entries[2].get("ui"), Some(&Bson::Binary(bson::Binary::from_uuid(uuid))));
        // Timestamps strictly increase, every entry carries the term, and the newest optime is
        // the last entry's.
        let ts: Vec<bson::Timestamp> = entries.iter().map(|e| e.get_timestamp("ts").unwrap()).collect();
        assert!(ts.windows(2).all(|w| (w[0].time, w[0].increment) < (w[1].time, w[1].increment)), "{label}: {ts:?}");
        assert!(entries.iter().all(|e| e.get_i64("t").ok() == Some(3)));
        assert_eq!(entries[0].get_timestamp("ts").unwrap(), noop.timestamp());
        assert_eq!(store.oplog_last().unwrap().timestamp(), *ts.last().unwrap());
        // The oplog itself cannot be dropped, written or indexed while live.
        assert_eq!(store.drop_collection(OPLOG_DB, OPLOG_COLLECTION).unwrap_err().code, Code::IllegalOperation.0);
        let log = store.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap();
        assert_eq!(log.insert_many(&[doc! {"_id": 1}], true).errors[0].1.code, Code::IllegalOperation.0);
        assert_eq!(log.create_index(idx(doc! {"op": 1}, "op_1")).unwrap_err().code, Code::IllegalOperation.0);
        assert_eq!(oplog_entries(&store).len(), entries.len());
    }
}

/// The record ids a tailing reader sees after `after`, read in chunks of `chunk` as a cursor does.
fn tail_ids(c: &Collection, after: Option<RecordId>, chunk: usize) -> Vec<RecordId> {
    let mut ids = Vec::new();
    let mut at = after;
    loop {
        let got = c.tail_chunk(at, chunk).unwrap();
        let n = got.len();
        for (rid, bytes) in got {
            let ts = crate::decode_record(bytes.as_ref()).unwrap().get_timestamp("ts").unwrap();
            assert_eq!(ts_of(rid), ts, "an entry is the record its id names");
            ids.push(rid);
            at = Some(rid);
        }
        if n < chunk {
            return ids;
        }
    }
}

#[test]
fn tailing_readers_get_the_same_entries_from_memory_as_from_the_engine() {
    // More entries than the cap holds, and than memory keeps (OPLOG_RECENT_BYTES_MAX): the
    // cap truncates the oldest, memory drops them; a rollback's truncation removes the
    // newest. At each step, a read from any position sees what the engine holds after it.
    let store = Store::open_in_memory();
    store.enable_oplog(20 << 20).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    let log = store.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap();
    let pad = "x".repeat(2000);
    let engine_ids = |after: RecordId| -> Vec<RecordId> { log.snapshot().scan_raw(Some(after), usize::MAX).unwrap().into_iter().map(|(rid, _)| rid).collect() };
    let check = |label: &str| {
        let all = engine_ids(0);
        for (i, &after) in all.iter().enumerate().step_by(997) {
            assert_eq!(tail_ids(&log, Some(after), 64), all[i + 1..].to_vec(), "{label}: after entry {i}");
        }
        if let Some(&newest) = all.last() {
            assert!(tail_ids(&log, Some(newest), 64).is_empty(), "{label}: caught up");
        }
    };
    for i in 0..6000 {
        c.insert_many(&[doc! {"_id": i, "pad": pad.clone()}], true);
    }
    check("within the bounds");
    for i in 6000..12_000 {
        c.insert_many(&[doc! {"_id": i, "pad": pad.clone()}], true);
    }
    assert!(engine_ids(0).len() < 12_000, "the cap truncated");
    check("past the cap and the memory bound");
    let all = engine_ids(0);
    let keep = all[all.len() - 10];
    // A capped deletion is a removal, not a rollback; truncation moves the rollback count
    // that tailing cursors check.
    let (removals, truncations) = (log.removals(), log.truncations());
    assert!(removals > 0, "capped deletions counted");
    store.truncate_oplog_after(OpTime { ts: keep, term: store.oplog_last().unwrap().term }).unwrap();
    assert_eq!(log.truncations(), truncations + 1);
    assert!(log.removals() > removals);
    assert_eq!(tail_ids(&log, Some(keep), 64), Vec::<RecordId>::new(), "truncated entries are gone from memory");
    c.insert_many(&[doc! {"_id": "after rollback"}], true);
    let newest = store.oplog_last().unwrap().ts;
    assert_eq!(tail_ids(&log, Some(all[all.len() - 12]), 64), vec![all[all.len() - 11], keep, newest]);
    check("after a rollback");
    // Entries a secondary copies in are tailed from memory too (members chain from it).
    let secondary = Store::open_in_memory();
    secondary.enable_oplog(64 << 20).unwrap();
    let entries: Vec<(OpTime, Vec<u8>)> = log
        .snapshot()
        .scan_raw(Some(keep), usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(rid, e)| (OpTime { ts: rid, term: crate::decode_record(&e).unwrap().get_i64("t").unwrap() }, e))
        .collect();
    secondary.append_oplog_replicated(&entries).unwrap();
    let slog = secondary.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap();
    assert_eq!(tail_ids(&slog, Some(keep), 1), vec![newest]);
}

#[test]
fn oplog_survives_reopen_and_continues_after_its_newest_entry() {
    let dir = TempDir::new("oplog-reopen");
    let opts = StoreOptions { cache_size_bytes: crate::CACHE_SIZE_BYTES_MIN, fsync: true };
    let last = {
        let store = Store::open(dir.path(), opts.clone()).unwrap();
        store.enable_oplog(64 << 20).unwrap();
        store.set_oplog_term(2);
        store.collection_or_create("db", "c").unwrap().insert_many(&[doc! {"_id": 1}], true);
        store.commit_durable().unwrap();
        store.oplog_last().unwrap()
    };
    let store = Store::open(dir.path(), opts).unwrap();
    store.enable_oplog(64 << 20).unwrap();
    assert_eq!(store.oplog_last(), Some(last));
    store.collection("db", "c").unwrap().insert_many(&[doc! {"_id": 2}], true);
    let entries = oplog_entries(&store);
    assert_eq!(entries.len(), 3);
    let newest = store.oplog_last().unwrap();
    assert!(newest > last && newest.term == 2, "{newest:?} after {last:?}");
}

#[test]
fn oplog_is_capped() {
    let store = Store::open_in_memory();
    let cap_bytes = 256 << 10;
    store.enable_oplog(cap_bytes).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    let pad = "x".repeat(1000);
    for i in 0..1000 {
        assert_eq!(c.insert_many(&[doc! {"_id": i, "pad": pad.as_str()}], true).inserted, 1);
    }
    let log = store.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap();
    let stats = log.stats();
    assert!(stats.size_bytes <= cap_bytes, "{} > {cap_bytes}", stats.size_bytes);
    let entries = oplog_entries(&store);
    assert_eq!(entries.len() as u64, stats.count);
    // The newest entries are kept, oldest first.
    assert_eq!(entries.last().unwrap().get_document("o").unwrap().get_i32("_id").unwrap(), 999);
    let first = entries[0].get_document("o").unwrap().get_i32("_id").unwrap();
    assert!(first > 0 && first as usize == 1000 - entries.len(), "first kept {first}, {} kept", entries.len());
}

/// A secondary's entries written ahead of their application: `oplog_applied` stays behind
/// until `apply_written` covers them, they are what `oplog_unapplied` returns, and capping
/// never deletes one of them, however far past the cap they take the oplog.
#[test]
fn entries_written_and_not_applied_are_kept_until_applied() {
    let primary = Store::open_in_memory();
    primary.enable_oplog(64 << 20).unwrap();
    let c = primary.collection_or_create("db", "c").unwrap();
    let pad = "x".repeat(1000);
    for i in 0..300 {
        assert_eq!(c.insert_many(&[doc! {"_id": i, "pad": pad.as_str()}], true).inserted, 1);
    }
    let log = primary.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap();
    let entries: Vec<(OpTime, Vec<u8>)> = log
        .snapshot()
        .scan_raw(None, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(rid, e)| (OpTime { ts: rid, term: crate::decode_record(&e).unwrap().get_i64("t").unwrap() }, e))
        .collect();
    let secondary = Store::open_in_memory();
    let cap_bytes = 64 << 10;
    secondary.enable_oplog(cap_bytes).unwrap();
    let (first, rest) = entries.split_at(10);
    secondary.append_oplog_replicated(first).unwrap();
    assert_eq!(secondary.oplog_applied(), secondary.oplog_last());
    // The rest, written: about 300 KB in a 64 KB oplog.
    secondary.write_oplog_replicated(rest).unwrap();
    assert_eq!(secondary.oplog_applied(), Some(first.last().unwrap().0));
    assert_eq!(secondary.oplog_last(), Some(rest.last().unwrap().0));
    assert_eq!(secondary.oplog_unapplied(usize::MAX).unwrap(), rest, "none capped away");
    assert_eq!(secondary.oplog_unapplied(3).unwrap(), rest[..3]);
    // Applied in two steps: the first moves the point, the second clears it.
    let (a, b) = rest.split_at(100);
    secondary.apply_written(&[], a.last().unwrap().0).unwrap();
    assert_eq!(secondary.oplog_applied(), Some(a.last().unwrap().0));
    assert_eq!(secondary.oplog_unapplied(usize::MAX).unwrap(), b);
    secondary.apply_written(&[], b.last().unwrap().0).unwrap();
    assert_eq!(secondary.oplog_applied(), secondary.oplog_last());
    assert!(secondary.oplog_unapplied(usize::MAX).unwrap().is_empty());
    // Nothing left to apply: applying again is refused.
    assert!(secondary.apply_written(&[], b.last().unwrap().0).is_err());
    // Now capping may take the old entries, with the next write.
    secondary.write_oplog_replicated(&[]).unwrap();
    let next = OpTime { ts: b.last().unwrap().0.ts + 1, term: b.last().unwrap().0.term };
    let noop = doc! {"ts": bson::Timestamp { time: (next.ts >> 32) as u32, increment: next.ts as u32 }, "t": next.term, "op": "n", "ns": "", "o": {"msg": "x"}}
        .to_vec()
        .unwrap();
    secondary.append_oplog_replicated(&[(next, noop)]).unwrap();
    let stats = secondary.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap().stats();
    assert!(stats.size_bytes <= cap_bytes, "{} > {cap_bytes}", stats.size_bytes);
}

#[test]
fn a_retryable_writes_entries_chain_back_and_its_record_names_the_newest() {
    let store = Store::open_in_memory();
    store.enable_oplog(64 << 20).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    let log = store.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap();
    let lsid = [7u8; 16];
    let start = store.oplog_last().unwrap();
    {
        let w = store.begin_retryable_write(&lsid, 5, OpTime::NULL).unwrap();
        // Its writes go through its store handle.
        let wc = w.store().collection("db", "c").unwrap();
        // An insert command's documents are its statements; an update's statement is set.
        w.set_statement_per_document(vec![0, 2]);
        assert!(wc.insert_many(&[doc! {"_id": 1}, doc! {"_id": 2}], true).errors.is_empty());
        w.set_statement(3);
        w.set_retry_image(Some(RetryImage::Before));
        let mut wr = wc.writer();
        let (rid, old) = wr.snapshot().find_by_id(&Bson::Int32(1)).unwrap().unwrap();
        wr.update(rid, &old, &doc! {"_id": 1, "x": 1}, UpdateForm::Modifiers).unwrap();
    }
    // Outside the write: no session fields, no record change.
    assert!(c.insert_many(&[doc! {"_id": 3}], true).errors.is_empty());
    // (The first retryable write created config.transactions: a logged catalog command.)
    let entries: Vec<Document> =
        log.snapshot().scan(Some(start.ts), usize::MAX).unwrap().into_iter().map(|(_, d)| d).filter(|e| e.get_str("op").ok() != Some("c")).collect();
    let shape: Vec<(&str, Option<i32>)> = entries.iter().map(|e| (e.get_str("op").unwrap(), e.get_i32("stmtId").ok())).collect();
    assert_eq!(shape, [("i", Some(0)), ("i", Some(2)), ("n", Some(3)), ("u", Some(3)), ("i", None)]);
    assert_eq!(entries[2].get_document("o").unwrap(), &doc! {"_id": 1}, "the pre-image");
    let mut prev = OpTime::NULL;
    for e in &entries[..4] {
        assert_eq!(e.get_i64("txnNumber").unwrap(), 5);
        assert!(matches!(e.get_document("lsid").unwrap().get("id"), Some(Bson::Binary(b)) if b.bytes == lsid), "{e}");
        assert_eq!(OpTime::from_doc(e.get_document("prevOpTime").unwrap()), Some(prev), "{e}");
        prev = OpTime::from_doc(e).unwrap();
    }
    assert!(!entries[4].contains_key("lsid"));
    // The record came with the entries, unlogged, and names the newest of them.
    let records = store.collection(SESSION_RECORDS_DB, SESSION_RECORDS_COLLECTION).unwrap();
    let all: Vec<Document> = records.snapshot().scan(None, usize::MAX).unwrap().into_iter().map(|(_, d)| d).collect();
    assert_eq!(all.len(), 1);
    let r = &all[0];
    assert_eq!(r.get_i64("txnNum").unwrap(), 5);
    assert_eq!(OpTime::from_doc(r.get_document("lastWriteOpTime").unwrap()), Some(prev));
    assert!(entries.iter().all(|e| e.get_str("ns").unwrap() != "config.transactions"), "the record is not logged");
    assert!(records.validate().valid);
    // A retryable write needs an oplog.
    let standalone = Store::open_in_memory();
    assert_eq!(standalone.begin_retryable_write(&lsid, 1, OpTime::NULL).err().unwrap().code, Code::IllegalOperation.0);
}

/// A transaction reads its snapshot and its own writes, conflicts first-writer-wins, and
/// commits its changes, statistics, one applyOps entry and its session's record at once.
#[test]
fn transactions_isolate_conflict_and_commit_whole() {
    let store = Store::open_in_memory();
    store.enable_oplog(64 << 20).unwrap();
    let c = store.create_collection("db", "c", Document::new()).unwrap();
    c.create_index(unique_idx(doc! {"k": 1}, "k_1")).unwrap();
    assert!(c.insert_many(&[doc! {"_id": 1, "k": 1, "v": 0}, doc! {"_id": 2, "k": 2, "v": 0}], true).errors.is_empty());

    let t1 = store.begin_transaction(Some((&[7; 16], 1))).unwrap();
    let s1 = store.in_transaction(&t1);
    let c1 = s1.collection("db", "c").unwrap();
    // Writes by others after the snapshot are invisible.
    assert!(c.insert_many(&[doc! {"_id": 3, "k": 3}], true).errors.is_empty());
    assert_eq!(ids(&c1.snapshot()), vec![Bson::Int32(1), Bson::Int32(2)]);
    // Own writes are visible, through records, indexes and counts.
    assert!(c1.insert_many(&[doc! {"_id": 4, "k": 4}], true).errors.is_empty());
    {
        let mut w = c1.writer();
        let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(1)).unwrap().unwrap();
        w.update(rid, &old, &doc! {"_id": 1, "k": 1, "v": 1}, UpdateForm::Modifiers).unwrap();
        let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(2)).unwrap().unwrap();
        w.delete(rid, &old).unwrap();
    }
    let view = c1.snapshot();
    assert_eq!(ids(&view), vec![Bson::Int32(1), Bson::Int32(4)]);
    assert_eq!(view.count().unwrap(), 2);
    assert_eq!(scan_values(&view, "k_1", IndexBounds::all()), vec![vec![Bson::Int32(1)], vec![Bson::Int32(4)]]);
    assert_eq!(view.find_by_id(&Bson::Int32(1)).unwrap().unwrap().1.get_i32("v").unwrap(), 1);
    // Outside, nothing changed yet.
    assert_eq!(ids(&c.snapshot()), vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(3)]);
    assert!(store.transaction_keys_owned() > 0);

    // A second transaction writing a key the first owns conflicts at once; so does one
    // writing a document committed after it began.
    let t2 = store.begin_transaction(Some((&[8; 16], 1))).unwrap();
    let c2 = store.in_transaction(&t2).collection("db", "c").unwrap();
    let e = c2.insert_many(&[doc! {"_id": 4, "k": 44}], true).errors;
    assert_eq!(e[0].1.code, Code::WriteConflict.0, "{e:?}");
    t2.abort();
    assert!(c.insert_many(&[doc! {"_id": 5, "k": 5}], true).errors.is_empty());
    let t3 = store.begin_transaction(Some((&[9; 16], 1))).unwrap();
    let c3 = store.in_transaction(&t3).collection("db", "c").unwrap();
    {
        let mut w = c.writer();
        let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(5)).unwrap().unwrap();
        w.update(rid, &old, &doc! {"_id": 5, "k": 5, "v": 9}, UpdateForm::Modifiers).unwrap();
    }
    let mut w3 = c3.writer();
    let (rid, old) = w3.snapshot().find_by_id(&Bson::Int32(5)).unwrap().unwrap();
    assert_eq!(w3.update(rid, &old, &doc! {"_id": 5, "k": 5, "v": 10}, UpdateForm::Modifiers).unwrap_err().code, Code::WriteConflict.0);
    drop(w3);
    drop(t3);
    // An ordinary write to an owned key waits for the transaction, then runs after it.
    let ordinary = {
        let c = c.clone();
        std::thread::spawn(move || c.insert_many(&[doc! {"_id": 4, "k": 40}], true))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!ordinary.is_finished(), "an ordinary write waits for the transaction");

    let before = store.oplog_last().unwrap();
    let at = t1.commit().unwrap().expect("logged");
    let errors = ordinary.join().unwrap().errors;
    assert_eq!(errors[0].1.code, Code::DuplicateKey.0, "it ran after the transaction: {errors:?}");
    assert!(at > before);
    assert_eq!(store.transaction_keys_owned(), 0);
    assert_eq!(ids(&c.snapshot()), vec![Bson::Int32(1), Bson::Int32(3), Bson::Int32(4), Bson::Int32(5)]);
    assert_eq!(c.stats().count, 4);
    assert!(c.validate().valid);
    // One entry: applyOps with the session's fields; the session's record says committed.
    let oplog = store.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap();
    let newest = oplog.snapshot().scan_reverse(None, 1).unwrap().remove(0).1;
    assert_eq!(newest.get_str("op").unwrap(), "c");
    assert_eq!(newest.get_document("o").unwrap().get_array("applyOps").unwrap().len(), 3);
    assert_eq!(newest.get_i64("txnNumber").unwrap(), 1);
    let records = store.collection(SESSION_RECORDS_DB, SESSION_RECORDS_COLLECTION).unwrap();
    let record = records
        .snapshot()
        .scan(None, 10)
        .unwrap()
        .into_iter()
        .find(|(_, d)| d.get_i64("txnNum").ok() == Some(1) && d.get_str("state").ok() == Some("committed"));
    assert!(record.is_some());
    assert!(t1.commit().is_err(), "a transaction commits once");
}

/// Reads at a past cluster time (`Store::snapshot_at`): the state after the write at or
/// before it, SnapshotUnavailable inside a write of several entries, SnapshotTooOld before
/// the history, no index built later, no namespace dropped later, and no writes.
#[test]
fn snapshot_reads_at_a_past_cluster_time() {
    let store = Store::open_in_memory();
    store.enable_oplog(64 << 20).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    assert_eq!(c.insert_many(&[doc! {"_id": 0, "x": 0}], true).inserted, 1);
    let before_history = store.oplog_last().unwrap().ts;
    store.keep_snapshot_history(1_000);
    // Unused history is not kept: the first read at a point in time starts it, from the newest
    // applied point (which it can read).
    assert_eq!(store.snapshot_at(before_history - 1).err().unwrap().code, Code::SnapshotTooOld.0);
    store.keep_snapshot_history(1_000);
    let (_, now) = store.snapshot_now().unwrap().unwrap();
    assert_eq!(now.ts, before_history);
    assert_eq!(c.insert_many(&[doc! {"_id": 1, "x": 1}], true).inserted, 1);
    let t1 = store.oplog_last().unwrap().ts;
    {
        let mut w = c.writer();
        let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(1)).unwrap().unwrap();
        w.update(rid, &old, &doc! {"_id": 1, "x": 2}, UpdateForm::Modifiers).unwrap();
    }
    let t2 = store.oplog_last().unwrap().ts;
    assert_eq!(c.insert_many(&[doc! {"_id": 2}, doc! {"_id": 3}], true).inserted, 2);
    let t3 = store.oplog_last().unwrap().ts;
    assert!(c.create_index(idx(doc! {"x": 1}, "x_1")).unwrap());

    let x_at = |ts: u64| {
        let (view, entry) = store.snapshot_at(ts).unwrap();
        assert!(entry.ts <= ts);
        let at = store.reading_at(view);
        let snap = at.collection("db", "c").unwrap().snapshot();
        assert!(snap.indexes().all(|i| i.name != "x_1"), "the index became ready later");
        let one = snap.find_by_id(&Bson::Int32(1)).unwrap().map(|(_, d)| d.get_i32("x").unwrap());
        (one, snap.count().unwrap())
    };
    assert_eq!(x_at(t1), (Some(1), 2));
    assert_eq!(x_at(t2), (Some(2), 2));
    assert_eq!(x_at(t3), (Some(2), 4));
    assert_eq!(store.snapshot_at(t3 - 1).err().unwrap().code, Code::SnapshotUnavailable.0, "inside the two-entry write");
    // The first read's point is a boundary too; before it, no history.
    assert_eq!(x_at(before_history), (None, 1));
    assert_eq!(store.snapshot_at(before_history - 1).err().unwrap().code, Code::SnapshotTooOld.0);
    assert_eq!(store.snapshot_boundary_at_or_before(t3 - 1), Some(t2));
    // Today's view has the index.
    assert!(c.snapshot().indexes().any(|i| i.name == "x_1"));

    // A handle reading at the past writes nothing.
    let at = store.reading_at(store.snapshot_at(t3).unwrap().0);
    assert!(at.collection("db", "c").unwrap().insert_many(&[doc! {"_id": 9}], true).inserted == 0);
    // A drop after the view's point: the view's reads refuse.
    assert!(at.check_catalog_at_view("db", "c").is_ok());
    store.drop_collection("db", "c").unwrap();
    assert_eq!(at.check_catalog_at_view("db", "c").unwrap_err().code, Code::SnapshotUnavailable.0);
    assert!(store.reading_at(store.snapshot_at(store.oplog_last().unwrap().ts).unwrap().0).check_catalog_at_view("db", "c").is_ok());

    // Past the window, the first pin goes and with it the history it held; a window with no
    // read at all lets go of everything.
    store.set_snapshot_history_window(300);
    store.keep_snapshot_history(1_100);
    assert!(store.snapshot_at(t1).is_ok());
    store.keep_snapshot_history(1_250);
    store.keep_snapshot_history(1_401);
    assert_eq!(store.snapshot_at(t1).err().unwrap().code, Code::SnapshotTooOld.0);
    store.keep_snapshot_history(1_702);
    assert_eq!(store.snapshot_at(t3).err().unwrap().code, Code::SnapshotTooOld.0, "nothing kept after an unused window");
    assert!(store.snapshot_at(store.oplog_last().unwrap().ts).is_ok(), "the newest point is today's state");
}

/// A transaction begun through a handle reading at a past point reads there, and a write to
/// a document changed since conflicts, also when the change was undone (the same value
/// again: the check is by the version's position, not its bytes).
#[test]
fn a_transaction_at_a_past_point_reads_there_and_conflicts_with_later_writes() {
    let store = Store::open_in_memory();
    store.enable_oplog(64 << 20).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    assert!(c.insert_many(&[doc! {"_id": 1, "v": 0}, doc! {"_id": 2, "v": 0}], true).errors.is_empty());
    store.keep_snapshot_history(1_000);
    let (_, now) = store.snapshot_now().unwrap().unwrap();
    let t0 = store.oplog_last().unwrap().ts;
    assert_eq!(now.ts, t0);
    let set = |id: i32, v: i32| {
        let mut w = c.writer();
        let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(id)).unwrap().unwrap();
        w.update(rid, &old, &doc! {"_id": id, "v": v}, UpdateForm::Modifiers).unwrap();
    };
    // _id 1 changes and changes back; _id 2 changes.
    set(1, 5);
    set(1, 0);
    set(2, 7);
    let (view, _) = store.snapshot_at(t0).unwrap();
    let past = store.reading_at(view);
    let txn = past.begin_transaction(Some((&[3; 16], 1))).unwrap();
    let tc = store.in_transaction(&txn).collection("db", "c").unwrap();
    let values: Vec<i32> = tc.snapshot().scan(None, 10).unwrap().into_iter().map(|(_, d)| d.get_i32("v").unwrap()).collect();
    assert_eq!(values, vec![0, 0], "the transaction reads the past point");
    for id in [1, 2] {
        let mut w = tc.writer();
        let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(id)).unwrap().unwrap();
        let e = w.update(rid, &old, &doc! {"_id": id, "v": 9}, UpdateForm::Modifiers).unwrap_err();
        assert_eq!(e.code, Code::WriteConflict.0, "_id {id}");
    }
    txn.abort();
}

/// A point after every entry reads today's state, and no entry is stamped at or before it
/// afterwards: the no-op logged for it, and every later write, come after.
#[test]
fn a_point_after_every_entry_reads_now_and_later_entries_come_after_it() {
    let store = Store::open_in_memory();
    store.enable_oplog(64 << 20).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    assert_eq!(c.insert_many(&[doc! {"_id": 1}], true).inserted, 1);
    let last = store.oplog_last().unwrap().ts;
    let point = last + (5 << 32);
    let (view, noop) = store.snapshot_now_at(point).unwrap();
    assert!(noop.ts > point);
    assert_eq!(store.reading_at(view).collection("db", "c").unwrap().snapshot().count().unwrap(), 1);
    assert_eq!(c.insert_many(&[doc! {"_id": 2}], true).inserted, 1);
    assert!(store.oplog_last().unwrap().ts > noop.ts);
    // A point before the newest entry is history's.
    let (view, entry) = store.snapshot_now_at(last).unwrap();
    assert_eq!(entry.ts, last);
    assert_eq!(store.reading_at(view).collection("db", "c").unwrap().snapshot().count().unwrap(), 1);
}

/// A prepared transaction: its prepare entry and record, its keys held against other
/// writers, a read at a point after its prepare waiting for the decision, and, once it
/// committed at a timestamp before its commit entry, reads at points between the two seeing
/// it; an aborted one leaves nothing.
#[test]
fn a_prepared_transaction_holds_its_keys_and_commits_at_its_commit_timestamp() {
    let store = Store::open_in_memory();
    store.enable_oplog(64 << 20).unwrap();
    let c = store.collection_or_create("db", "c").unwrap();
    assert!(c.insert_many(&[doc! {"_id": 1, "v": 0}, doc! {"_id": 2, "v": 0}], true).errors.is_empty());
    store.keep_snapshot_history(1_000);
    store.snapshot_now().unwrap().unwrap();
    let set = |coll: &Collection, id: i32, v: i32| {
        let mut w = coll.writer();
        let (rid, old) = w.snapshot().find_by_id(&Bson::Int32(id)).unwrap().unwrap();
        w.update(rid, &old, &doc! {"_id": id, "v": v}, UpdateForm::Modifiers)
    };
    let lsid = [7u8; 16];
    let txn = store.begin_transaction(Some((&lsid, 1))).unwrap();
    set(&store.in_transaction(&txn).collection("db", "c").unwrap(), 1, 1).unwrap();
    let prepared = store.prepare_transaction(&txn, &lsid, 1).unwrap();
    assert_eq!(store.oplog_last().unwrap(), prepared);
    let log = store.collection(OPLOG_DB, OPLOG_COLLECTION).unwrap();
    let entry = log.snapshot().get(prepared.ts).unwrap().unwrap();
    assert!(entry.get_document("o").unwrap().get_bool("prepare").unwrap());
    assert_eq!(store.prepared_transaction(&lsid), Some((1, prepared)));
    assert_eq!(set(&store.in_transaction(&txn).collection("db", "c").unwrap(), 1, 2).unwrap_err().code, Code::PreparedTransactionInProgress.0);
    // Its key is held; others are not.
    assert_eq!(set(&c, 1, 5).unwrap_err().code, Code::WriteConflict.0);
    set(&c, 2, 5).unwrap();
    let after = store.oplog_last().unwrap().ts;
    // A read at a point after the prepare waits for the decision; one before does not.
    assert_eq!(store.reading_at(store.snapshot_at(prepared.ts - 1).unwrap().0).collection("db", "c").unwrap().snapshot().count().unwrap(), 2);
    let v_at = |store: &Store, ts: u64, id: i32| {
        let view = store.snapshot_at(ts).unwrap().0;
        store.reading_at(view).collection("db", "c").unwrap().snapshot().find_by_id(&Bson::Int32(id)).unwrap().unwrap().1.get_i32("v").unwrap()
    };
    let reader = {
        let store = store.clone();
        std::thread::spawn(move || (v_at(&store, after, 1), v_at(&store, after, 2)))
    };
    // An index build waits for the decision: the commit writes the keys of the indexes the
    // transaction was prepared with.
    let build = {
        let c = c.clone();
        std::thread::spawn(move || c.create_index(idx(doc! {"v": 1}, "v_1")))
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!reader.is_finished(), "a read at a point after the prepare waits for the decision");
    assert!(!build.is_finished(), "a catalog change waits for the decision");
    // Committed at `after`: its entry comes later, and a read at `after` sees it whole.
    let committed = store.commit_prepared(&lsid, 1, after).unwrap().unwrap();
    assert!(committed.ts > after);
    assert_eq!(reader.join().unwrap(), (1, 5));
    assert!(build.join().unwrap().unwrap());
    assert!(c.validate().valid);
    assert_eq!(v_at(&store, after, 1), 1);
    assert_eq!(v_at(&store, prepared.ts, 1), 0, "before the commit timestamp");
    assert_eq!(store.prepared_transaction(&lsid), None);
    let entry = log.snapshot().get(committed.ts).unwrap().unwrap();
    assert_eq!(entry.get_document("o").unwrap().get_timestamp("commitTimestamp").unwrap(), common::optime::ts_of(after));
    assert_eq!(entry.get_document("prevOpTime").ok().and_then(OpTime::from_doc), Some(prepared));
    set(&c, 1, 6).unwrap();

    // Aborted: nothing changes, the key is free.
    let lsid = [8u8; 16];
    let txn = store.begin_transaction(Some((&lsid, 1))).unwrap();
    set(&store.in_transaction(&txn).collection("db", "c").unwrap(), 2, 9).unwrap();
    store.prepare_transaction(&txn, &lsid, 1).unwrap();
    assert!(store.abort_prepared(&lsid, 1).unwrap().is_some());
    assert_eq!(store.commit_prepared(&lsid, 1, after).unwrap_err().code, Code::NoSuchTransaction.0);
    set(&c, 2, 10).unwrap();
    let records = store.collection(SESSION_RECORDS_DB, SESSION_RECORDS_COLLECTION).unwrap().snapshot().scan(None, 10).unwrap();
    let states: Vec<&str> = records.iter().map(|(_, d)| d.get_str("state").unwrap()).collect();
    assert_eq!(states, vec!["committed", "aborted"]);
}
