"""Details drivers and ODMs rely on: command-level let, find's min/max/returnKey/
showRecordId, $listLocalSessions, empty update operators, DBRef fields in filters, partial
indexes the planner picks, collations refused rather than ignored, malformed statements
failing the command, fsync, and the stable API's strict mode."""

import pymongo
import pytest
from bson import DBRef
from pymongo.errors import OperationFailure
from pymongo.server_api import ServerApi


def test_command_let_in_find_aggregate_update_delete_and_find_and_modify(db):
    db.c.insert_many([{"_id": i, "x": i * 10} for i in range(5)])
    expr = {"$expr": {"$eq": ["$x", "$$want"]}}
    assert [d["_id"] for d in db.c.find(expr, let={"want": 30})] == [3]
    got = list(db.c.aggregate([{"$match": expr}, {"$project": {"_id": 0, "w": "$$want", "t": "$$tag"}}], let={"want": 20, "tag": {"$concat": ["a", "b"]}}))
    assert got == [{"w": 20, "t": "ab"}]
    r = db.c.update_many({"$expr": {"$gte": ["$x", "$$lo"]}}, [{"$set": {"hi": "$$flag"}}], let={"lo": 30, "flag": True})
    assert r.modified_count == 2
    assert sorted(d["_id"] for d in db.c.find({"hi": True})) == [3, 4]
    assert db.c.delete_many({"$expr": {"$lt": ["$x", "$$lo"]}}, let={"lo": 20}).deleted_count == 2
    doc = db.c.find_one_and_update({"$expr": {"$eq": ["$_id", "$$id"]}}, {"$set": {"y": 1}}, let={"id": 2}, return_document=True)
    assert doc == {"_id": 2, "x": 20, "y": 1}
    # A variable the command does not define is refused; a string outside $expr is a value.
    with pytest.raises(OperationFailure):
        list(db.c.find({"$expr": {"$eq": ["$x", "$$nope"]}}))
    assert list(db.c.find({"x": "$$want"}, let={"want": 20})) == []
    with pytest.raises(OperationFailure):
        list(db.c.find({}, let={"NOW": 1}))


def test_find_min_max_return_key_and_show_record_id(db):
    db.c.insert_many([{"_id": i, "x": i % 3} for i in range(6)])
    db.c.create_index("x")
    within = list(db.c.find({}).hint([("_id", 1)]).min([("_id", 2)]).max([("_id", 5)]))
    assert [d["_id"] for d in within] == [2, 3, 4]
    with pytest.raises(OperationFailure) as e:
        db.command("find", "c", min={"_id": 2})  # min without a hint
    assert e.value.code == 51173
    keys = list(db.c.find({"x": 1}, {"_id": 0}, return_key=True).hint([("x", 1)]))
    assert keys == [{"x": 1}, {"x": 1}]
    with_ids = list(db.c.find({}, show_record_id=True).sort("_id", 1))
    assert all(isinstance(d["$recordId"], int) for d in with_ids) and len(with_ids) == 6


def test_find_limit_closes_the_cursor(db):
    db.c.insert_many([{"_id": i} for i in range(10)])
    reply = db.command("find", "c", limit=3)
    assert reply["cursor"]["id"] == 0 and len(reply["cursor"]["firstBatch"]) == 3


def test_list_local_sessions(client):
    with client.start_session() as s:
        client.admin.command("ping", session=s)
        sessions = list(client.admin.aggregate([{"$listLocalSessions": {}}]))
        assert any(x["_id"]["id"] == s.session_id["id"] for x in sessions)
        assert all("lastUse" in x for x in sessions)


def test_empty_update_operator_changes_nothing(db):
    db.c.insert_one({"_id": 1, "a": 1})
    assert db.c.update_one({"_id": 1}, {"$set": {}, "$inc": {"a": 1}}).modified_count == 1
    db.c.update_one({"_id": 1}, {"$set": {}})
    assert db.c.find_one() == {"_id": 1, "a": 2}


def test_dbref_fields_match_as_fields(db):
    db.c.insert_many([{"_id": 1, "r": DBRef("x", 5)}, {"_id": 2, "rs": [DBRef("x", 1), DBRef("x", 2)]}])
    assert db.c.find_one({"r": DBRef("x", 5)})["_id"] == 1
    assert db.c.find_one({"r.$id": 5})["_id"] == 1
    assert db.c.find_one({"rs": {"$elemMatch": {"$ref": "x", "$id": 2}}})["_id"] == 2


def test_partial_index_used_when_the_query_implies_its_filter(db):
    db.c.insert_many([{"_id": i, "status": "A" if i % 2 else "B", "qty": i} for i in range(50)])
    db.c.create_index("qty", name="qty_A", partialFilterExpression={"status": "A"})
    plan = db.c.find({"status": "A", "qty": {"$gt": 40}}).explain()["queryPlanner"]["winningPlan"]
    assert "qty_A" in str(plan)
    assert sorted(d["_id"] for d in db.c.find({"status": "A", "qty": {"$gt": 40}})) == [41, 43, 45, 47, 49]
    plan = db.c.find({"qty": {"$gt": 40}}).explain()["queryPlanner"]["winningPlan"]
    assert "qty_A" not in str(plan)  # would miss the B documents
    assert len(list(db.c.find({"qty": {"$gt": 40}}))) == 9


def test_collations_are_refused_not_ignored(db):
    db.c.insert_many([{"_id": 1, "s": "a"}, {"_id": 2, "s": "A"}])
    fr = {"locale": "fr", "strength": 1}
    for run in [
        lambda: db.c.delete_many({"s": "a"}, collation=fr),
        lambda: db.c.find_one_and_delete({"s": "a"}, collation=fr),
        lambda: list(db.c.aggregate([{"$match": {"s": "a"}}], collation=fr)),
        lambda: db.c.count_documents({"s": "a"}, collation=fr),
        lambda: db.c.distinct("s", collation=fr),
        lambda: db.c.create_index("s", collation=fr),
    ]:
        with pytest.raises(OperationFailure) as e:
            run()
        assert e.value.code == 115  # CommandNotSupported
    assert db.c.count_documents({}) == 2  # nothing was deleted
    db.c.create_index("s", collation={"locale": "simple"})


def test_capped_collection_stats(db):
    db.create_collection("cap", capped=True, size=4096, max=10)
    stats = db.command("collStats", "cap")
    assert stats["capped"] is True and stats["max"] == 10 and stats["maxSize"] == 4096
    db.c.insert_one({})
    assert db.command("collStats", "c")["capped"] is False


def test_malformed_statements_fail_the_command(db):
    with pytest.raises(OperationFailure) as e:
        db.command("update", "c", updates=[{"q": {}, "u": {"$set": {"a": 1}}}, {"q": 1, "u": {}}])
    assert e.value.code == 14  # TypeMismatch, and nothing ran
    assert db.c.count_documents({}) == 0
    with pytest.raises(OperationFailure):
        db.command("delete", "c", deletes=[{"q": {}, "limit": 2}])
    # A bad update operator is the statement's error.
    reply = db.command("update", "c", updates=[{"q": {}, "u": {"$foo": {"a": 1}}, "upsert": True}])
    assert reply["writeErrors"][0]["code"] == 9


def test_fsync(client):
    assert client.admin.command("fsync")["ok"] == 1
    with pytest.raises(OperationFailure):
        client.admin.command("fsync", lock=True)


def test_stable_api_strict(server):
    c = pymongo.MongoClient(server.uri, server_api=ServerApi("1", strict=True))
    try:
        assert c.py_api.c.find_one() is None
        with pytest.raises(OperationFailure) as e:
            c.py_api.c.distinct("x")
        assert e.value.details["codeName"] == "APIStrictError"
    finally:
        c.close()
    plain = pymongo.MongoClient(server.uri)
    try:
        with pytest.raises(OperationFailure) as e:
            plain.admin.command("ping", apiVersion="2")
        assert e.value.details["codeName"] == "APIVersionError"
    finally:
        plain.close()
