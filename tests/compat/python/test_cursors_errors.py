"""Cursors across getMore, and MongoDB error codes as pymongo surfaces them."""

import time

import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import CursorNotFound, ExecutionTimeout, OperationFailure


def test_cursor_batches_and_getmore(db):
    db.c.insert_many([{"_id": i, "v": "x" * 10} for i in range(1000)])
    assert [d["_id"] for d in db.c.find().sort("_id").batch_size(7)] == list(range(1000))
    assert [d["_id"] for d in db.c.find().sort("_id", -1).batch_size(7).limit(10)] == list(range(999, 989, -1))
    reply = db.command("find", "c", sort={"_id": 1})
    assert len(reply["cursor"]["firstBatch"]) == 101
    cid = reply["cursor"]["id"]
    assert cid != 0
    more = db.command("getMore", cid, collection="c")
    assert len(more["cursor"]["nextBatch"]) == 899
    assert more["cursor"]["id"] == 0
    # Closing a cursor early kills it server-side.
    cur = db.c.find().batch_size(2)
    next(cur)
    cid = cur.cursor_id
    cur.close()
    with pytest.raises(OperationFailure) as e:
        db.command("getMore", cid, collection="c")
    assert e.value.code == 43


def test_error_codes(db):
    db.c.insert_one({"a": 1})
    with pytest.raises(OperationFailure) as e:
        db.command("foo")
    assert e.value.code == 59 and e.value.details["codeName"] == "CommandNotFound"
    assert e.value.details["errmsg"] == "no such command: 'foo'"
    with pytest.raises(OperationFailure) as e:
        list(db.c.find({"a": {"$foo": 1}}))
    assert e.value.code == 2 and e.value.details["codeName"] == "BadValue"
    with pytest.raises(OperationFailure) as e:
        # Cursor ids are int64 on the wire (an int32 id is a TypeMismatch in MongoDB).
        db.command("getMore", Int64(12345), collection="c")
    assert e.value.code == 43 and e.value.details["codeName"] == "CursorNotFound"
    with pytest.raises(OperationFailure) as e:
        db.client.admin.command("renameCollection", f"{db.name}.missing", to=f"{db.name}.x")
    assert e.value.code == 26 and e.value.details["codeName"] == "NamespaceNotFound"
    db.create_collection("exists")
    # The raw command: pymongo's create_collection checks listCollections itself first.
    with pytest.raises(OperationFailure) as e:
        db.command("create", "exists")
    assert e.value.code == 48
    with pytest.raises(OperationFailure) as e:
        db.c.drop_index("nope_1")
    assert e.value.code == 27
    with pytest.raises(OperationFailure) as e:
        db.command("listIndexes", "missing")
    assert e.value.code == 26


def test_max_time_ms_expired(server, db):
    db.c.insert_many([{"_id": i} for i in range(200)])
    pipeline = [{"$project": {"r": {"$range": [0, 5000]}}}, {"$unwind": "$r"}, {"$group": {"_id": None, "n": {"$sum": 1}}}]
    # The socket timeout only bounds a server that ignores maxTimeMS; it is not the assertion.
    bounded = pymongo.MongoClient(server.uri, socketTimeoutMS=60_000)
    try:
        with pytest.raises(ExecutionTimeout) as e:
            list(bounded[db.name].c.aggregate(pipeline, maxTimeMS=1))
        assert e.value.code == 50
    finally:
        bounded.close()
    assert db.c.count_documents({}) == 200
