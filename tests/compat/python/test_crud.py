"""CRUD through pymongo, checked against MongoDB 7.0 documented behaviour."""

import datetime
import re
import uuid

import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, SON, Timestamp
from bson.codec_options import CodecOptions
from pymongo import ASCENDING, DESCENDING, DeleteOne, InsertOne, ReplaceOne, ReturnDocument, UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure, WriteError


def test_insert_one_generates_objectid(db):
    r = db.c.insert_one({"x": 1})
    assert isinstance(r.inserted_id, ObjectId)
    assert r.acknowledged
    assert db.c.find_one({"_id": r.inserted_id}) == {"_id": r.inserted_id, "x": 1}


def test_bson_types_round_trip_with_order(db):
    doc = SON(
        [
            ("_id", "typed"),
            ("double", 1.5),
            ("string", "héllo"),
            ("doc", {"nested": [1, {"k": "v"}]}),
            ("array", [1, "two", 3.0, None, [4]]),
            ("bin", Binary(b"\x00\x01\xff", 128)),
            ("uuid", Binary(uuid.UUID(int=7).bytes, 4)),
            ("oid", ObjectId()),
            ("bool", False),
            ("date", datetime.datetime(2024, 1, 2, 3, 4, 5, 678000)),
            ("null", None),
            ("regex", Regex("^a.*b$", "i")),
            ("int32", 42),
            ("ts", Timestamp(1700000000, 7)),
            ("int64", Int64(9007199254740993)),
            ("dec", Decimal128("1234.5678")),
            ("min", MinKey()),
            ("max", MaxKey()),
            ("code", Code("function() { return 1; }")),
        ]
    )
    db.c.insert_one(doc)
    coll = db.get_collection("c", codec_options=CodecOptions(document_class=SON))
    back = coll.find_one({"_id": "typed"})
    assert list(back.keys()) == list(doc.keys())
    for k in doc:
        assert back[k] == doc[k], k
        # With document_class=SON, nested documents decode as SON too.
        # Binary subtype 0 decodes as bytes in Python 3.
        expected = SON if isinstance(doc[k], dict) else bytes if isinstance(doc[k], Binary) and doc[k].subtype == 0 else type(doc[k])
        assert type(back[k]) is expected, k


def test_insert_many_ordered_duplicate(db):
    db.c.insert_one({"_id": 1})
    with pytest.raises(BulkWriteError) as e:
        db.c.insert_many([{"_id": 0}, {"_id": 1}, {"_id": 2}])
    d = e.value.details
    assert d["nInserted"] == 1
    assert [(w["index"], w["code"]) for w in d["writeErrors"]] == [(1, 11000)]
    w = d["writeErrors"][0]
    assert w["keyPattern"] == {"_id": 1}
    assert w["keyValue"] == {"_id": 1}
    assert w["errmsg"].startswith("E11000 duplicate key error collection: %s.c index: _id_ dup key: { _id: 1 }" % db.name)
    assert sorted(x["_id"] for x in db.c.find()) == [0, 1]


def test_insert_many_unordered_duplicates(db):
    db.c.insert_many([{"_id": 0}, {"_id": 1}])
    with pytest.raises(BulkWriteError) as e:
        db.c.insert_many([{"_id": 3}, {"_id": 1}, {"_id": 4}, {"_id": 0}], ordered=False)
    d = e.value.details
    assert d["nInserted"] == 2
    assert [(w["index"], w["code"]) for w in d["writeErrors"]] == [(1, 11000), (3, 11000)]
    assert sorted(x["_id"] for x in db.c.find()) == [0, 1, 3, 4]


def test_duplicate_key_error_on_unique_index(db):
    assert db.c.create_index("email", unique=True) == "email_1"
    db.c.insert_one({"email": "a@x"})
    with pytest.raises(DuplicateKeyError) as e:
        db.c.insert_one({"email": "a@x"})
    assert e.value.code == 11000
    assert e.value.details["keyPattern"] == {"email": 1}
    assert e.value.details["keyValue"] == {"email": "a@x"}
    assert 'index: email_1 dup key: { email: "a@x" }' in e.value.details["errmsg"]


@pytest.fixture
def seeded(db):
    db.c.insert_many([{"_id": i, "a": i % 3, "b": i, "sub": {"x": i}, "tags": ["t", "t%d" % (i % 2)]} for i in range(20)])
    return db.c


def ids(cursor):
    return [d["_id"] for d in cursor]


def test_find_filter_sort_skip_limit(seeded):
    got = list(seeded.find({"a": 1}).sort("b", DESCENDING).skip(1).limit(3))
    assert [d["b"] for d in got] == [16, 13, 10]
    assert ids(seeded.find({"b": {"$lt": 6}}).sort([("a", ASCENDING), ("b", DESCENDING)])) == [3, 0, 4, 1, 5, 2]
    assert ids(seeded.find({"$or": [{"b": 2}, {"b": 11}]}).sort("_id")) == [2, 11]
    assert ids(seeded.find({"tags": "t1", "b": {"$lt": 5}}).sort("_id")) == [1, 3]
    assert ids(seeded.find({"sub.x": {"$in": [4, 8, 99]}}).sort("_id")) == [4, 8]
    assert ids(seeded.find({"b": {"$regex": "^1"}})) == []  # numbers do not match regexes
    assert ids(seeded.find({"tags.1": {"$regex": re.compile("^T1$", re.I)}, "b": {"$lt": 4}}).sort("_id")) == [1, 3]
    assert ids(seeded.find({"$expr": {"$gt": ["$a", 1]}, "b": {"$lt": 6}}).sort("_id")) == [2, 5]


def test_find_projection(seeded):
    assert seeded.find_one({"_id": 5}, {"b": 1}) == {"_id": 5, "b": 5}
    assert seeded.find_one({"_id": 5}, {"b": 1, "_id": 0}) == {"b": 5}
    assert seeded.find_one({"_id": 5}, {"sub": 0, "tags": 0}) == {"_id": 5, "a": 2, "b": 5}
    assert seeded.find_one({"_id": 5}, {"sub.x": 1, "_id": 0}) == {"sub": {"x": 5}}
    assert seeded.find_one({"_id": 5}, {"tags": {"$slice": 1}, "_id": 0, "b": 1}) == {"b": 5, "tags": ["t"]}
    assert seeded.find_one({"_id": 5}, {"tags": {"$elemMatch": {"$eq": "t1"}}}) == {"_id": 5, "tags": ["t1"]}
    with pytest.raises(OperationFailure) as e:
        seeded.find_one({}, {"a": 1, "b": 0})
    assert e.value.code == 31254


def test_count_estimated_distinct(seeded, db):
    assert seeded.count_documents({}) == 20
    assert seeded.count_documents({"a": 0}) == 7
    assert seeded.count_documents({"a": 0}, skip=2, limit=3) == 3
    assert seeded.estimated_document_count() == 20
    assert sorted(seeded.distinct("a")) == [0, 1, 2]
    assert sorted(seeded.distinct("a", {"b": {"$gt": 17}})) == [0, 1]
    assert sorted(seeded.distinct("tags")) == ["t", "t0", "t1"]
    assert db.missing.count_documents({}) == 0
    assert db.missing.distinct("x") == []


def test_update_operators(db):
    db.c.insert_one({"_id": 1, "a": 1, "b": "x", "arr": [1, 2, 3], "n": {"m": 5}, "f": 2.5})
    r = db.c.update_one({"_id": 1}, {"$inc": {"a": 2}, "$set": {"n.m": 6}, "$unset": {"b": ""}, "$push": {"arr": 4}, "$mul": {"f": 2}})
    assert (r.matched_count, r.modified_count, r.upserted_id) == (1, 1, None)
    assert db.c.find_one() == {"_id": 1, "a": 3, "arr": [1, 2, 3, 4], "n": {"m": 6}, "f": 5.0}
    db.c.update_one({"_id": 1}, {"$addToSet": {"arr": {"$each": [4, 5]}}})
    db.c.update_one({"_id": 1}, {"$pull": {"arr": {"$gte": 4}}})
    db.c.update_one({"_id": 1}, {"$pop": {"arr": -1}})
    assert db.c.find_one()["arr"] == [2, 3]
    db.c.update_one({"_id": 1}, {"$rename": {"a": "alpha"}, "$max": {"f": 7}, "$min": {"n.m": 1}})
    d = db.c.find_one()
    assert "a" not in d and d["alpha"] == 3 and d["f"] == 7 and d["n"]["m"] == 1
    r = db.c.update_one({"_id": 1}, {"$set": {"alpha": 3}})
    assert (r.matched_count, r.modified_count) == (1, 0)
    db.c.update_one({"_id": 1}, {"$currentDate": {"at": True}})
    assert isinstance(db.c.find_one()["at"], datetime.datetime)
    db.c.insert_many([{"_id": i, "g": i % 2} for i in range(2, 6)])
    r = db.c.update_many({"g": 0}, {"$set": {"even": True}})
    assert (r.matched_count, r.modified_count) == (2, 2)


def test_update_errors(db):
    db.c.insert_one({"_id": 1, "s": "str"})
    with pytest.raises(WriteError) as e:
        db.c.update_one({"_id": 1}, {"$set": {"_id": 2}})
    assert e.value.code == 66
    with pytest.raises(WriteError) as e:
        db.c.update_one({"_id": 1}, {"$inc": {"s": 1}})
    assert e.value.code == 14
    with pytest.raises(WriteError) as e:
        db.c.update_one({"_id": 1}, {"$set": {"c": 1}, "$inc": {"c": 1}})
    assert e.value.code == 40
    with pytest.raises(WriteError) as e:
        db.c.replace_one({"_id": 1}, {"_id": 3})
    assert e.value.code == 66
    assert db.c.find_one() == {"_id": 1, "s": "str"}


def test_upserts(db):
    r = db.c.update_one({"k": "x"}, {"$set": {"v": 1}, "$setOnInsert": {"created": True}}, upsert=True)
    assert r.matched_count == 0 and isinstance(r.upserted_id, ObjectId)
    assert db.c.find_one({"_id": r.upserted_id}) == {"_id": r.upserted_id, "k": "x", "v": 1, "created": True}
    r = db.c.update_one({"k": "x"}, {"$set": {"v": 2}, "$setOnInsert": {"created": False}}, upsert=True)
    assert (r.matched_count, r.modified_count, r.upserted_id) == (1, 1, None)
    assert db.c.find_one({"k": "x"})["created"] is True
    r = db.c.update_one({"_id": 42}, {"$inc": {"n": 1}}, upsert=True)
    assert r.upserted_id == 42
    r = db.c.replace_one({"x": 9}, {"y": 1}, upsert=True)
    assert db.c.find_one({"_id": r.upserted_id}) == {"_id": r.upserted_id, "y": 1}


def test_array_filters_and_positional(db):
    db.c.insert_one({"_id": 1, "grades": [95, 102, 90, 150], "s": [{"n": "a", "v": 5}, {"n": "b", "v": 9}]})
    db.c.update_one({"_id": 1}, {"$set": {"grades.$[el]": 100}}, array_filters=[{"el": {"$gte": 100}}])
    assert db.c.find_one()["grades"] == [95, 100, 90, 100]
    db.c.update_one({"_id": 1}, {"$inc": {"s.$[x].v": 1}}, array_filters=[{"x.v": {"$gt": 6}}])
    assert db.c.find_one()["s"] == [{"n": "a", "v": 5}, {"n": "b", "v": 10}]
    db.c.update_one({"_id": 1}, {"$inc": {"grades.$[]": 1}})
    assert db.c.find_one()["grades"] == [96, 101, 91, 101]
    db.c.update_one({"_id": 1, "grades": 91}, {"$set": {"grades.$": 0}})
    assert db.c.find_one()["grades"] == [96, 101, 0, 101]


def test_pipeline_update(db):
    db.c.insert_one({"_id": 1, "a": 2, "b": 3})
    db.c.update_one({"_id": 1}, [{"$set": {"total": {"$add": ["$a", "$b"]}}}, {"$unset": "a"}])
    coll = db.get_collection("c", codec_options=CodecOptions(document_class=SON))
    assert list(coll.find_one().items()) == [("_id", 1), ("b", 3), ("total", 5)]


def test_replace_and_delete(db):
    db.c.insert_many([{"_id": i, "g": i % 2} for i in range(10)])
    r = db.c.replace_one({"_id": 1}, {"z": 1})
    assert (r.matched_count, r.modified_count) == (1, 1)
    assert db.c.find_one({"_id": 1}) == {"_id": 1, "z": 1}
    assert db.c.delete_one({"g": 0}).deleted_count == 1
    assert db.c.delete_many({"g": 0}).deleted_count == 4
    assert db.c.delete_many({"g": 0}).deleted_count == 0
    assert db.c.count_documents({}) == 5


def test_find_one_and_modify(db):
    db.c.insert_many([{"_id": i, "n": i} for i in (1, 2, 3)])
    assert db.c.find_one_and_update({"_id": 1}, {"$inc": {"n": 10}}) == {"_id": 1, "n": 1}
    assert db.c.find_one_and_update({"_id": 1}, {"$inc": {"n": 10}}, return_document=ReturnDocument.AFTER, projection={"_id": 0}) == {"n": 21}
    assert db.c.find_one_and_update({"_id": 9}, {"$set": {"n": 0}}) is None
    assert db.c.find_one_and_update({"_id": 7}, {"$set": {"x": 1}}, upsert=True, return_document=ReturnDocument.AFTER) == {"_id": 7, "x": 1}
    assert db.c.find_one_and_replace({"_id": 2}, {"z": 1}, return_document=ReturnDocument.AFTER) == {"_id": 2, "z": 1}
    assert db.c.find_one_and_delete({"n": {"$exists": True}}, sort=[("n", DESCENDING)]) == {"_id": 1, "n": 21}
    assert db.c.find_one({"_id": 1}) is None


def test_bulk_write_mixed(db):
    r = db.c.bulk_write(
        [
            InsertOne({"_id": 1, "v": 1}),
            InsertOne({"_id": 2, "v": 2}),
            UpdateOne({"_id": 1}, {"$inc": {"v": 1}}),
            UpdateMany({}, {"$set": {"m": True}}),
            ReplaceOne({"_id": 2}, {"v": 20}),
            UpdateOne({"_id": 3}, {"$set": {"v": 3}}, upsert=True),
            DeleteOne({"_id": 1}),
        ]
    )
    assert r.inserted_count == 2
    assert r.matched_count == 4
    assert r.modified_count == 4
    assert r.upserted_count == 1 and r.upserted_ids == {5: 3}
    assert r.deleted_count == 1
    assert list(db.c.find().sort("_id")) == [{"_id": 2, "v": 20}, {"_id": 3, "v": 3}]
