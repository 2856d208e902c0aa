"""Catalog, indexes and diagnostics commands through pymongo."""

import pytest
from bson import Binary
from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.errors import OperationFailure


def test_handshake_shape(client):
    hello = client.admin.command("hello")
    assert hello["isWritablePrimary"] is True
    assert hello["maxWireVersion"] == 21
    assert hello["minWireVersion"] == 0
    assert hello["maxBsonObjectSize"] == 16 * 1024 * 1024
    assert hello["maxMessageSizeBytes"] == 48000000
    assert hello["maxWriteBatchSize"] == 100000
    assert hello["logicalSessionTimeoutMinutes"] == 30
    assert hello["ok"] == 1.0 and isinstance(hello["ok"], float)
    assert client.admin.command("isMaster")["ismaster"] is True
    assert client.admin.command("ping") == {"ok": 1.0}
    info = client.server_info()
    assert info["version"].startswith("7.0")
    assert info["versionArray"][:2] == [7, 0]


def test_list_and_drop_databases(client):
    client.py_alpha.c.insert_one({"x": 1})
    client.py_beta.c.insert_one({"x": 1})
    try:
        names = client.list_database_names()
        assert "py_alpha" in names and "py_beta" in names
        spec = next(d for d in client.list_databases() if d["name"] == "py_alpha")
        assert spec["empty"] is False and "sizeOnDisk" in spec
        reply = client.admin.command("listDatabases", nameOnly=True, filter={"name": "py_alpha"})
        assert reply["databases"] == [{"name": "py_alpha"}]
        client.drop_database("py_beta")
        assert "py_beta" not in client.list_database_names()
        assert client.py_beta.list_collection_names() == []
    finally:
        client.drop_database("py_alpha")
        client.drop_database("py_beta")


def test_collections_create_list_rename_drop(db):
    db.create_collection("c1")
    db.c2.insert_one({"x": 1})
    assert sorted(db.list_collection_names()) == ["c1", "c2"]
    spec = next(db.list_collections(filter={"name": "c1"}))
    assert spec["type"] == "collection"
    assert spec["options"] == {}
    assert spec["info"]["readOnly"] is False
    assert isinstance(spec["info"]["uuid"], Binary) or hasattr(spec["info"]["uuid"], "hex")
    assert spec["idIndex"] == {"v": 2, "key": {"_id": 1}, "name": "_id_"}
    db.c2.create_index("x")
    db.c2.rename("c3")
    assert sorted(db.list_collection_names()) == ["c1", "c3"]
    assert db.c3.count_documents({}) == 1
    assert sorted(db.c3.index_information()) == ["_id_", "x_1"]
    with pytest.raises(OperationFailure) as e:
        db.c3.rename("c1")
    assert e.value.code == 48
    db.c3.rename("c1", dropTarget=True)
    assert db.list_collection_names() == ["c1"]
    assert db.c1.count_documents({}) == 1
    db.c1.drop()
    assert db.list_collection_names() == []
    db.never.drop()  # dropping a missing collection is not an error


def test_indexes(db):
    assert db.c.create_index([("a", ASCENDING)]) == "a_1"
    assert db.c.create_indexes([IndexModel([("a", ASCENDING), ("b", DESCENDING)]), IndexModel("email", unique=True, name="em")]) == ["a_1_b_-1", "em"]
    info = db.c.index_information()
    assert info["_id_"]["key"] == [("_id", 1)]
    assert info["a_1_b_-1"]["key"] == [("a", 1), ("b", -1)]
    assert info["em"]["unique"] is True
    listed = list(db.c.list_indexes())
    assert [i["name"] for i in listed] == ["_id_", "a_1", "a_1_b_-1", "em"]
    assert all(i["v"] == 2 for i in listed)
    db.c.drop_index("a_1")
    with pytest.raises(OperationFailure) as e:
        db.c.drop_index("_id_")
    assert e.value.code == 72
    db.c.drop_indexes()
    assert list(db.c.index_information()) == ["_id_"]


def test_server_status_opcounters(client, db):
    db.c.insert_one({"warm": True})
    before = client.admin.command("serverStatus")["opcounters"]
    db.c.insert_many([{"i": i} for i in range(5)])
    list(db.c.find())
    db.c.update_one({}, {"$set": {"u": 1}})
    db.c.delete_one({})
    after = client.admin.command("serverStatus")
    oc = after["opcounters"]
    assert oc["insert"] - before["insert"] == 5
    assert oc["query"] - before["query"] >= 1
    assert oc["update"] - before["update"] >= 1
    assert oc["delete"] - before["delete"] >= 1
    assert after["process"] == "mongod"
    assert after["connections"]["current"] >= 1


def test_db_stats_coll_stats_validate(db):
    db.c.insert_many([{"_id": i, "a": i, "pad": "x" * 100} for i in range(10)])
    db.c.create_index("a")
    s = db.command("dbStats")
    assert s["db"] == db.name and s["collections"] == 1 and s["objects"] == 10 and s["indexes"] == 2
    for k in ("dataSize", "storageSize", "indexSize", "totalSize", "avgObjSize"):
        assert s[k] > 0, k
    cs = db.command("collStats", "c")
    assert cs["ns"] == f"{db.name}.c" and cs["count"] == 10 and cs["nindexes"] == 2
    assert cs["size"] >= 1000 and cs["storageSize"] > 0 and cs["totalIndexSize"] > 0
    assert set(cs["indexSizes"]) == {"_id_", "a_1"}
    v = db.validate_collection("c")
    assert v["valid"] is True
    assert v["nrecords"] == 10
    assert v["keysPerIndex"] == {"_id_": 10, "a_1": 10}
    assert v["errors"] == []
