"""Compression, sessions, GridFS, restarts."""

import hashlib

import gridfs
import pymongo
import pytest
from pymongo.errors import OperationFailure


@pytest.mark.parametrize("compressor", ["snappy", "zlib", "zstd"])
def test_compressors_round_trip(server, compressor):
    c = pymongo.MongoClient(server.uri, compressors=compressor)
    try:
        coll = c.py_compress[compressor]
        coll.drop()
        big = "abcdefghij" * 100_000
        coll.insert_one({"_id": "big", "p": big})
        coll.insert_many([{"_id": i, "v": f"s{i}"} for i in range(100)])
        assert coll.find_one({"_id": "big"})["p"] == big
        assert [d["v"] for d in coll.find({"_id": {"$type": "int"}}).sort("_id").batch_size(9)][42] == "s42"
    finally:
        c.drop_database("py_compress")
        c.close()


def test_sessions(client, db):
    with client.start_session() as s:
        assert "id" in s.session_id
        for i in range(20):
            db.c.insert_one({"_id": i}, session=s)
        assert db.c.count_documents({}, session=s) == 20
        assert [d["_id"] for d in db.c.find({}, session=s).sort("_id").batch_size(3)] == list(range(20))
        db.c.update_one({"_id": 0}, {"$set": {"s": True}}, session=s)
        assert db.c.find_one({"_id": 0}, session=s) == {"_id": 0, "s": True}


def test_transactions_unsupported_on_standalone(client, db):
    db.c.insert_one({"_id": 0})
    with client.start_session() as s:
        with pytest.raises(OperationFailure) as e:
            with s.start_transaction():
                db.c.insert_one({"_id": 1}, session=s)
        assert e.value.code == 20  # IllegalOperation: transaction numbers need a replica set
    assert db.c.count_documents({"_id": 1}) == 0


def test_change_streams_unsupported_on_standalone(db):
    db.c.insert_one({"x": 1})
    with pytest.raises(OperationFailure) as e:
        with db.c.watch():
            pass
    assert e.value.code == 40573


def test_gridfs_round_trip(db):
    fs = gridfs.GridFS(db)
    data = bytes(range(256)) * 4096  # 1 MiB, several chunks
    fid = fs.put(data, filename="blob.bin")
    out = fs.get(fid)
    assert out.filename == "blob.bin"
    assert out.length == len(data)
    assert hashlib.sha256(out.read()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert db.fs.chunks.count_documents({"files_id": fid}) == (len(data) + 255 * 1024 - 1) // (255 * 1024)
    fs.delete(fid)
    assert db.fs.files.count_documents({}) == 0


def test_data_survives_kill_9_with_journaled_writes(own_server):
    c = pymongo.MongoClient(own_server.uri, w=1, journal=True)
    coll = c.py_crash.c
    coll.create_index("k", unique=True)
    for i in range(200):
        coll.insert_one({"_id": i, "k": f"k{i}"})
    coll.update_many({"_id": {"$lt": 50}}, {"$set": {"u": True}})
    c.close()
    own_server.restart()
    c = pymongo.MongoClient(own_server.uri)
    coll = c.py_crash.c
    assert coll.count_documents({}) == 200
    assert coll.count_documents({"u": True}) == 50
    v = c.py_crash.validate_collection("c")
    assert v["valid"] is True and v["keysPerIndex"] == {"_id_": 200, "k_1": 200}
    c.close()
