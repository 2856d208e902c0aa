"""Change streams through pymongo's watch(): events in mongod's shape on a collection, a
database and the deployment; resuming; invalidation; pre- and post-images; events split into
fragments; the errors of what a stream refuses; and a stream that follows the set through its
primary's kill -9 and counts every event."""

import threading
import time

import pymongo
import pytest
from bson import Timestamp
from pymongo.errors import OperationFailure


@pytest.fixture
def one_member_set(replset_server):
    setup = pymongo.MongoClient(replset_server.uri, directConnection=True)
    setup.admin.command("replSetInitiate", {})
    deadline = time.time() + 20
    while not setup.admin.command("hello").get("isWritablePrimary"):
        assert time.time() < deadline
        time.sleep(0.05)
    setup.close()
    # A client that first meets the member as a primary (sessions, transactions).
    c = pymongo.MongoClient(replset_server.uri, directConnection=True)
    yield c
    c.close()


def strip(event):
    return {k: v for k, v in event.items() if k not in ("_id", "clusterTime", "wallTime")}


def test_a_collection_stream_reports_each_change_and_resumes_after_any_event(one_member_set):
    c = one_member_set
    coll = c.app.watched
    coll.insert_one({"_id": 0})
    with coll.watch() as stream:
        coll.insert_one({"_id": 1, "a": 1, "k": 1, "array": ["foo", {"a": "bar"}, 1, 2]})
        coll.update_one({"_id": 1}, {"$set": {"a": 2}, "$unset": {"k": ""}})
        coll.update_one({"_id": 1}, [{"$set": {"array": ["foo", {"a": "bar"}]}}])
        coll.replace_one({"_id": 1}, {"b": 1})
        coll.delete_one({"_id": 1})
        c.app.other.insert_one({"_id": "not this collection"})
        events = [stream.next() for _ in range(5)]
    ns = {"db": "app", "coll": "watched"}
    key = {"_id": 1}
    assert [strip(e) for e in events] == [
        {"operationType": "insert", "fullDocument": {"_id": 1, "a": 1, "k": 1, "array": ["foo", {"a": "bar"}, 1, 2]}, "ns": ns, "documentKey": key},
        {"operationType": "update", "ns": ns, "documentKey": key, "updateDescription": {"updatedFields": {"a": 2}, "removedFields": ["k"], "truncatedArrays": []}},
        {"operationType": "update", "ns": ns, "documentKey": key, "updateDescription": {"updatedFields": {}, "removedFields": [], "truncatedArrays": [{"field": "array", "newSize": 2}]}},
        {"operationType": "replace", "fullDocument": {"_id": 1, "b": 1}, "ns": ns, "documentKey": key},
        {"operationType": "delete", "ns": ns, "documentKey": key},
    ]
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens) and len(set(tokens)) == 5
    assert all(isinstance(e["clusterTime"], Timestamp) for e in events)
    # Resumed after any event, a stream goes on with the next one.
    for i, e in enumerate(events):
        with coll.watch(resume_after=e["_id"]) as resumed:
            rest = [resumed.next()["operationType"] for _ in range(len(events) - i - 1)]
            assert rest == [x["operationType"] for x in events[i + 1 :]]
            assert resumed.try_next() is None
    # From an operation time on, the events at and after it.
    with coll.watch(start_at_operation_time=events[3]["clusterTime"]) as replayed:
        assert [replayed.next()["operationType"] for _ in range(2)] == ["replace", "delete"]
    # updateLookup: an update's event carries the document as it is now.
    coll.insert_one({"_id": 2, "n": 0})
    with coll.watch(full_document="updateLookup") as stream:
        coll.update_one({"_id": 2}, {"$inc": {"n": 1}})
        assert stream.next()["fullDocument"] == {"_id": 2, "n": 1}


def test_a_waiting_stream_wakes_for_a_change_on_a_one_member_set(one_member_set):
    # A set of one commits an entry once durable: a getMore waiting for events must learn
    # of that, not sleep out its await time.
    coll = one_member_set.app.woken
    with coll.watch(max_await_time_ms=20_000) as stream:
        timer = threading.Timer(0.5, lambda: coll.insert_one({"_id": "late"}))
        timer.start()
        started = time.time()
        event = stream.next()
        timer.join()
    assert event["documentKey"] == {"_id": "late"}
    assert time.time() - started < 10, "the stream slept out its await time"


def test_the_resume_token_moves_on_with_batches_that_hold_no_event(one_member_set):
    c = one_member_set
    with c.app.quiet.watch(max_await_time_ms=50) as stream:
        assert stream.try_next() is None
        before = stream.resume_token
        c.app.noisy.insert_many([{"n": i} for i in range(3)])
        deadline = time.time() + 10
        while stream.resume_token == before:
            assert time.time() < deadline
            assert stream.try_next() is None
        # Resuming from the moved token returns what follows, and nothing before.
        c.app.quiet.insert_one({"_id": "after"})
        with c.app.quiet.watch(resume_after=stream.resume_token) as resumed:
            assert resumed.next()["documentKey"] == {"_id": "after"}


def test_database_and_deployment_streams_see_transactions_whole(one_member_set):
    c = one_member_set
    c.app.a.insert_one({"_id": 0})
    c.app.b.insert_one({"_id": 0})
    c.elsewhere.c.insert_one({"_id": 0})
    with c.app.watch() as db_stream, c.watch() as all_stream:
        with c.start_session() as s:
            with s.start_transaction():
                c.app.a.insert_one({"_id": 1}, session=s)
                c.app.b.update_one({"_id": 0}, {"$set": {"x": 1}}, session=s)
                c.elsewhere.c.delete_one({"_id": 0}, session=s)
        in_db = [db_stream.next() for _ in range(2)]
        everywhere = [all_stream.next() for _ in range(3)]
    assert [(e["operationType"], e["ns"]["coll"]) for e in in_db] == [("insert", "a"), ("update", "b")]
    assert [(e["operationType"], e["ns"]["db"]) for e in everywhere] == [("insert", "app"), ("update", "app"), ("delete", "elsewhere")]
    # One transaction: one clusterTime, its session and number on each event.
    assert len({e["clusterTime"] for e in everywhere}) == 1
    assert all(e["lsid"] == everywhere[0]["lsid"] and e["txnNumber"] == everywhere[0]["txnNumber"] for e in everywhere)


def test_a_drop_invalidates_a_collection_stream_and_start_after_goes_past_it(one_member_set):
    c = one_member_set
    coll = c.app.dropped
    coll.insert_one({"_id": 1})
    with coll.watch() as stream:
        coll.drop()
        drop, invalidate = stream.next(), stream.next()
        assert (drop["operationType"], drop["ns"]) == ("drop", {"db": "app", "coll": "dropped"})
        assert invalidate["operationType"] == "invalidate"
        assert not stream.alive
    with pytest.raises(OperationFailure) as e:
        coll.watch(resume_after=invalidate["_id"])
    assert e.value.code == 260
    coll.insert_one({"_id": "again"})
    with coll.watch(start_after=invalidate["_id"]) as after:
        assert after.next()["documentKey"] == {"_id": "again"}
    # The cursor outlives the drop it reports (no resume needed), and ends with the invalidate.
    coll.insert_one({"_id": 2})
    opened = c.app.command("aggregate", "dropped", pipeline=[{"$changeStream": {}}], cursor={})
    assert opened["cursor"]["firstBatch"] == [] and "postBatchResumeToken" in opened["cursor"]
    coll.drop()
    more = c.app.command("getMore", opened["cursor"]["id"], collection="dropped")
    assert [e["operationType"] for e in more["cursor"]["nextBatch"]] == ["drop", "invalidate"]
    assert more["cursor"]["id"] == 0
    assert more["cursor"]["postBatchResumeToken"] == more["cursor"]["nextBatch"][-1]["_id"]
    with c.app.watch() as db_stream:
        c.app.renamed_from.insert_one({"_id": 1})
        c.admin.command("renameCollection", "app.renamed_from", to="app.renamed_to")
        insert, rename = db_stream.next(), db_stream.next()
        assert insert["operationType"] == "insert"
        assert (rename["operationType"], rename["ns"]["coll"], rename["to"]) == ("rename", "renamed_from", {"db": "app", "coll": "renamed_to"})


def test_pre_and_post_images_of_updates_replaces_and_deletes(one_member_set):
    c = one_member_set
    db = c.app
    db.drop_collection("imaged")
    coll = db.create_collection("imaged", changeStreamPreAndPostImages={"enabled": True})
    info = db.command("listCollections", filter={"name": "imaged"})["cursor"]["firstBatch"][0]
    assert info["options"]["changeStreamPreAndPostImages"] == {"enabled": True}
    coll.insert_one({"_id": 1, "a": 1, "sub": {"x": 1}})
    with coll.watch(full_document="required", full_document_before_change="required") as stream:
        coll.update_one({"_id": 1}, {"$set": {"sub.y": 2}, "$inc": {"a": 1}})
        coll.replace_one({"_id": 1}, {"b": 1})
        with c.start_session() as s, s.start_transaction():
            coll.update_one({"_id": 1}, {"$set": {"c": 3}}, session=s)
            coll.insert_one({"_id": 2}, session=s)
        # findAndModify's own retry image and the pre-image go to the oplog side by side.
        assert coll.find_one_and_update({"_id": 2}, {"$set": {"d": 4}}, return_document=pymongo.ReturnDocument.AFTER) == {"_id": 2, "d": 4}
        coll.delete_one({"_id": 1})
        events = [stream.next() for _ in range(6)]
    seen = [(e["operationType"], e.get("fullDocumentBeforeChange"), e.get("fullDocument")) for e in events]
    assert seen == [
        ("update", {"_id": 1, "a": 1, "sub": {"x": 1}}, {"_id": 1, "a": 2, "sub": {"x": 1, "y": 2}}),
        ("replace", {"_id": 1, "a": 2, "sub": {"x": 1, "y": 2}}, {"_id": 1, "b": 1}),
        ("update", {"_id": 1, "b": 1}, {"_id": 1, "b": 1, "c": 3}),
        ("insert", None, {"_id": 2}),
        ("update", {"_id": 2}, {"_id": 2, "d": 4}),
        ("delete", {"_id": 1, "b": 1, "c": 3}, None),
    ]
    assert "lsid" in events[2] and "lsid" in events[3]
    # Switched off, later changes have no images: null when available only, an error when
    # required.
    db.command("collMod", "imaged", changeStreamPreAndPostImages={"enabled": False})
    assert "changeStreamPreAndPostImages" not in db.command("listCollections", filter={"name": "imaged"})["cursor"]["firstBatch"][0]["options"]
    start = c.admin.command("hello")["operationTime"]
    coll.update_one({"_id": 2}, {"$set": {"d": 5}})
    with coll.watch(start_at_operation_time=start, full_document="whenAvailable", full_document_before_change="whenAvailable") as stream:
        e = stream.next()
        assert (e["operationType"], e["fullDocument"], e["fullDocumentBeforeChange"]) == ("update", None, None)
    with pytest.raises(OperationFailure) as err:
        with coll.watch(start_at_operation_time=start, full_document_before_change="required") as stream:
            stream.next()
    assert err.value.code == 47
    with pytest.raises(OperationFailure) as err:
        db.command("collMod", "imaged", changeStreamPreAndPostImages={"enabled": 1})
    assert err.value.code == 14
    with pytest.raises(OperationFailure) as err:
        db.command("collMod", "missing", changeStreamPreAndPostImages={"enabled": True})
    assert err.value.code == 26


def test_a_large_event_comes_in_fragments_and_resumes_from_any(one_member_set):
    c = one_member_set
    db = c.app
    db.drop_collection("large")
    coll = db.create_collection("large", changeStreamPreAndPostImages={"enabled": True})
    coll.insert_one({"_id": 0})
    start = c.admin.command("hello")["operationTime"]
    coll.insert_one({"_id": 1, "v": "a" * (9 << 20)})
    coll.update_one({"_id": 1}, {"$set": {"v": "b" * (9 << 20)}})
    coll.insert_one({"_id": 2})
    # Whole, the update's event (both versions) is larger than a document may be.
    with pytest.raises(OperationFailure) as err:
        with coll.watch(start_at_operation_time=start, full_document_before_change="required") as stream:
            stream.next()
    assert err.value.code == 10334
    split = [{"$changeStreamSplitLargeEvent": {}}]
    with coll.watch(split, start_at_operation_time=start, full_document_before_change="required") as stream:
        # From the insert of _id 0, which is at the start.
        events = [stream.next() for _ in range(5)][2:]
    assert [e.get("splitEvent") for e in events] == [{"fragment": 1, "of": 2}, {"fragment": 2, "of": 2}, None]
    assert events[0]["operationType"] == "update" and events[1]["fullDocumentBeforeChange"]["v"] == "a" * (9 << 20)
    assert events[2]["documentKey"] == {"_id": 2}
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens)
    for i, e in enumerate(events[:2]):
        with coll.watch(split, resume_after=e["_id"], full_document_before_change="required") as resumed:
            assert [r.get("splitEvent") for r in (resumed.next() for _ in range(2 - i))] == [{"fragment": 2, "of": 2}, None][i:]


def test_pre_images_reach_every_member(three_members):
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in three_members)
    rs = pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet=rs0&w=3", serverSelectionTimeoutMS=30_000)
    rs.app.create_collection("everywhere", changeStreamPreAndPostImages={"enabled": True})
    coll = rs.app.everywhere
    start = rs.admin.command("hello")["operationTime"]
    coll.insert_one({"_id": 1, "n": 0})
    coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
    coll.delete_one({"_id": 1})
    for s in three_members:
        member = pymongo.MongoClient(s.uri, directConnection=True, readPreference="secondaryPreferred")
        with member.app.everywhere.watch(start_at_operation_time=start, full_document="required", full_document_before_change="required") as stream:
            events = [stream.next() for _ in range(3)]
        assert [(e.get("fullDocumentBeforeChange"), e.get("fullDocument")) for e in events] == [
            (None, {"_id": 1, "n": 0}),
            ({"_id": 1, "n": 0}, {"_id": 1, "n": 1}),
            ({"_id": 1, "n": 1}, None),
        ], s.port
        member.close()
    rs.close()


def test_expanded_update_events_disambiguate_paths(one_member_set):
    coll = one_member_set.app.paths
    coll.insert_one({"_id": 1, "a": {"1": 1}, "b": [{"1": 1}], "c": [0]})
    with coll.watch(show_expanded_events=True) as expanded, coll.watch() as plain:
        coll.update_one({"_id": 1}, {"$set": {"a.1": 2, "b.0.1": 2, "c.0": 1}})
        e = expanded.next()["updateDescription"]
        assert e["disambiguatedPaths"] == {"a.1": ["a", "1"], "b.0.1": ["b", 0, "1"]}
        assert e["updatedFields"] == {"a.1": 2, "b.0.1": 2, "c.0": 1}
        assert "disambiguatedPaths" not in plain.next()["updateDescription"]


def test_what_a_stream_refuses(one_member_set, server):
    c = one_member_set
    coll = c.app.refused

    def code(**kw):
        with pytest.raises(OperationFailure) as e:
            coll.watch(**kw).try_next()
        return e.value.code

    assert code(pipeline=[{"$group": {"_id": 1}}]) == 20
    assert code(full_document="sometimes") == 2
    assert code(pipeline=[{"$changeStreamSplitLargeEvent": {}}, {"$match": {}}]) == 20
    assert code(resume_after={"_data": "zz"}) == 260
    # A resume point older than the oplog's first entry.
    assert code(resume_after={"_data": "0000000000000001" + "00000000" + "00" + "00000000"}) == 286
    with pytest.raises(OperationFailure) as e:
        coll.with_options(read_concern=pymongo.read_concern.ReadConcern("local")).watch()
    assert e.value.code == 72
    with pytest.raises(OperationFailure) as e:
        c.admin.watch()
    assert e.value.code == 73
    # Projecting the resume token out ends the stream.
    with coll.watch([{"$project": {"_id": 0}}]) as stream:
        coll.insert_one({"x": 1})
        with pytest.raises(OperationFailure) as e:
            stream.next()
        assert e.value.code == 280 and e.value.has_error_label("NonResumableChangeStreamError")
    # A standalone has no oplog.
    with pytest.raises(OperationFailure) as e:
        pymongo.MongoClient(server.uri).app.c.watch()
    assert e.value.code == 40573


def test_a_stream_through_a_primary_kill_delivers_each_change_once(three_members):
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in three_members)
    rs = pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet=rs0", serverSelectionTimeoutMS=30_000)
    coll = rs.app.get_collection("followed")
    coll.insert_one({"_id": -1})
    acknowledged = []

    def write():
        for i in range(200):
            coll.insert_one({"_id": i})
            acknowledged.append(i)
            if i == 80:
                by_port = {s.port: s for s in three_members}
                by_port[rs.primary[1]].kill9()

    with coll.watch(max_await_time_ms=100) as stream:
        writer = threading.Thread(target=write)
        writer.start()
        seen = []
        deadline = time.time() + 120
        while len(seen) < 200:
            assert time.time() < deadline, f"{len(seen)} events"
            e = stream.try_next()
            if e is not None:
                seen.append(e["documentKey"]["_id"])
        writer.join()
        # Nothing more: each insert came once, in order.
        time.sleep(0.5)
        assert stream.try_next() is None
    assert acknowledged == list(range(200))
    assert seen == list(range(200))
    rs.close()
