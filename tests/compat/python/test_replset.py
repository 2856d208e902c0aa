"""Replica sets through pymongo: a one-member set (initiate, discovery by replicaSet=, the oplog,
retryable writes, the errors of a member that is not primary) and a three-member set failing over."""

import time

import pymongo
import pytest
from bson import Timestamp
from pymongo.errors import NotPrimaryError, OperationFailure


def test_uninitiated_member_refuses_writes(replset_server):
    c = pymongo.MongoClient(replset_server.uri, directConnection=True)
    hello = c.admin.command("hello")
    assert hello["isWritablePrimary"] is False and hello["isreplicaset"] is True
    with pytest.raises(NotPrimaryError) as e:
        c.app.c.insert_one({"_id": 1})
    assert e.value.details["code"] == 10107 and e.value.details["codeName"] == "NotWritablePrimary"
    with pytest.raises(OperationFailure) as e:
        c.admin.command("replSetGetStatus")
    assert e.value.code == 94 and e.value.details["codeName"] == "NotYetInitialized"
    c.close()


def test_initiate_and_use_the_set(replset_server):
    port = replset_server.port
    direct = pymongo.MongoClient(replset_server.uri, directConnection=True)
    # rs.initiate() with no config: this member, as it listens.
    direct.admin.command("replSetInitiate", {})
    with pytest.raises(OperationFailure) as e:
        direct.admin.command("replSetInitiate", {})
    assert e.value.code == 23

    rs = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?replicaSet=rs0", serverSelectionTimeoutMS=10_000)
    rs.app.c.insert_many([{"_id": i, "v": i} for i in range(10)])
    rs.app.c.update_many({"v": {"$gte": 5}}, {"$set": {"big": True}})
    rs.app.c.delete_one({"_id": 0})
    assert rs.primary == ("127.0.0.1", port)
    assert rs.app.c.count_documents({}) == 9

    ops = [(e["op"], e["ns"]) for e in direct.local["oplog.rs"].find({"ns": {"$regex": "^app\\."}})]
    assert ops == [("c", "app.$cmd")] + [("i", "app.c")] * 10 + [("u", "app.c")] * 5 + [("d", "app.c")]
    status = direct.admin.command("replSetGetStatus")
    assert status["set"] == "rs0" and status["myState"] == 1
    assert status["members"][0]["stateStr"] == "PRIMARY"
    config = direct.admin.command("replSetGetConfig")["config"]
    assert config["members"][0]["host"] == f"127.0.0.1:{port}"
    rs.close()
    direct.close()


def test_three_members_fail_over_with_retryable_writes(three_members):
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in three_members)
    rs = pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet=rs0", serverSelectionTimeoutMS=30_000)
    coll = rs.app.get_collection("c")
    coll.insert_many([{"_id": i} for i in range(100)])
    first = rs.primary
    # w:"majority" (the default) returned: a majority has them.
    assert coll.count_documents({}) == 100
    by_port = {s.port: s for s in three_members}
    by_port[first[1]].kill9()
    # The driver finds the new primary and its retryable writes go through.
    for i in range(100, 120):
        coll.insert_one({"_id": i})
    assert rs.primary is not None and rs.primary != first
    assert coll.count_documents({}) == 120
    status = rs.admin.command("replSetGetStatus")
    states = sorted(m["stateStr"] for m in status["members"])
    assert states == ["(not reachable/healthy)", "PRIMARY", "SECONDARY"]
    # A secondary serves reads to a client that allows them.
    secondary = rs.app.get_collection("c", read_preference=pymongo.ReadPreference.SECONDARY)
    deadline = time.time() + 10
    while secondary.count_documents({}) != 120:
        assert time.time() < deadline
        time.sleep(0.05)
    rs.close()


def test_with_transaction_commits_retries_conflicts_and_aborts(three_members):
    """pymongo's with_transaction: transfers between accounts from two threads that conflict on
    the same documents; with_transaction runs a transaction again after a TransientTransactionError,
    so every transfer lands once and the total is kept. A callback that raises leaves nothing."""
    import threading

    hosts = ",".join(f"127.0.0.1:{s.port}" for s in three_members)
    rs = pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet=rs0", serverSelectionTimeoutMS=30_000)
    accounts = rs.bank.accounts
    accounts.insert_many([{"_id": i, "balance": 1000} for i in range(4)])
    rs.bank.create_collection("transfers")
    errors = []

    def transfers(seed):
        try:
            for n in range(25):
                src, dst = (seed + n) % 4, (seed + n + 1) % 4

                def move(session, src=src, dst=dst, n=n):
                    accounts.update_one({"_id": src}, {"$inc": {"balance": -10}}, session=session)
                    accounts.update_one({"_id": dst}, {"$inc": {"balance": 10}}, session=session)
                    rs.bank.transfers.insert_one({"_id": f"{seed}-{n}"}, session=session)

                with rs.start_session() as s:
                    s.with_transaction(move)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=transfers, args=(seed,)) for seed in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert rs.bank.transfers.count_documents({}) == 50
    assert sum(d["balance"] for d in accounts.find()) == 4000

    def fails(session):
        accounts.update_one({"_id": 0}, {"$set": {"balance": -1}}, session=session)
        raise ValueError("the callback fails")

    before = accounts.find_one({"_id": 0})["balance"]
    with rs.start_session() as s, pytest.raises(ValueError):
        s.with_transaction(fails)
    assert accounts.find_one({"_id": 0})["balance"] == before

    # Inside a transaction, a command mongod refuses there is refused with its code.
    with rs.start_session() as s:
        s.start_transaction()
        with pytest.raises(OperationFailure) as e:
            rs.bank.command("count", "accounts", session=s)
        assert e.value.code == 263 and e.value.details["codeName"] == "OperationNotSupportedInTransaction"
        s.abort_transaction()
    rs.close()


def test_snapshot_reads_at_a_cluster_time(three_members):
    """readConcern "snapshot" outside a transaction: the reply names the point it read at
    (atClusterTime), a later read at that point sees the data as it was, a point before the
    history is SnapshotTooOld, and a write with readConcern snapshot is refused."""
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in three_members)
    rs = pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet=rs0", serverSelectionTimeoutMS=30_000)
    db = rs.snapreads
    db.c.insert_many([{"_id": i, "v": 0} for i in range(10)])
    first = db.command("find", "c", readConcern={"level": "snapshot"})
    at = first["cursor"]["atClusterTime"]
    assert len(first["cursor"]["firstBatch"]) == 10
    db.c.update_many({}, {"$set": {"v": 1}})
    db.c.delete_one({"_id": 0})
    again = db.command("find", "c", readConcern={"level": "snapshot", "atClusterTime": at})
    assert [d["v"] for d in again["cursor"]["firstBatch"]] == [0] * 10
    assert again["cursor"]["atClusterTime"] == at
    agg = db.command("aggregate", "c", pipeline=[{"$group": {"_id": "$v", "n": {"$sum": 1}}}], cursor={}, readConcern={"level": "snapshot", "atClusterTime": at})
    assert agg["cursor"]["firstBatch"] == [{"_id": 0, "n": 10}]
    distinct = db.command("distinct", "c", key="v", readConcern={"level": "snapshot", "atClusterTime": at})
    assert distinct["values"] == [0] and distinct["atClusterTime"] == at
    # Today's data, read at the newest point.
    now = db.command("find", "c", readConcern={"level": "snapshot"})
    assert sorted(d["v"] for d in now["cursor"]["firstBatch"]) == [1] * 9
    # A point before this member kept history.
    with pytest.raises(OperationFailure) as e:
        db.command("find", "c", readConcern={"level": "snapshot", "atClusterTime": Timestamp(1, 1)})
    assert e.value.code == 239 and e.value.details["codeName"] == "SnapshotTooOld"
    with pytest.raises(OperationFailure) as e:
        db.command("insert", "c", documents=[{"_id": 99}], readConcern={"level": "snapshot"})
    assert e.value.code == 72
    assert db.c.find_one({"_id": 99}) is None
    rs.close()


def test_a_secondary_reads_after_a_cluster_time_the_set_has_not_logged(three_members):
    """A causal read on a secondary after a cluster time beyond every entry of the set (one
    another shard or router gossiped) asks the primary for a no-op past it
    (appendOplogNote with maxClusterTime), so it answers instead of waiting for the set's
    next write. appendOplogNote itself logs its data as a no-op, on the primary only."""
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in three_members)
    rs = pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet=rs0", serverSelectionTimeoutMS=30_000)
    rs.reach.c.with_options(write_concern=pymongo.WriteConcern(w=3)).insert_one({"_id": 1})
    primary = pymongo.MongoClient(f"mongodb://{rs.primary[0]}:{rs.primary[1]}/?directConnection=true")
    oplog = primary.local["oplog.rs"]

    def newest():
        return oplog.find_one({}, sort=[("$natural", -1)])

    primary.admin.command("appendOplogNote", data={"note": 1})
    assert newest()["op"] == "n" and newest()["o"] == {"note": 1}
    before = newest()["ts"]
    primary.admin.command("appendOplogNote", data={"late": 1}, maxClusterTime=Timestamp(before.time - 1, 1))
    assert newest()["ts"] == before
    far = Timestamp(int(time.time()) + 2 * 365 * 24 * 3600, 1)
    for bad, code in (({}, 4), ({"data": 1}, 14), ({"data": {}, "maxClusterTime": 5}, 14), ({"data": {}, "maxClusterTime": far}, 205)):
        with pytest.raises(OperationFailure) as e:
            primary.admin.command("appendOplogNote", **bad)
        assert e.value.code == code

    secondary_host = sorted(rs.secondaries)[0]
    secondary = pymongo.MongoClient(f"mongodb://{secondary_host[0]}:{secondary_host[1]}/?directConnection=true")
    with pytest.raises(NotPrimaryError) as e:
        secondary.admin.command("appendOplogNote", data={"x": 1})
    assert e.value.details["code"] == 10107
    ahead = Timestamp(before.time + 20, 1)
    with secondary.start_session(causal_consistency=True) as s:
        s.advance_cluster_time({"clusterTime": ahead, "signature": {"hash": b"\0" * 20, "keyId": 0}})
        s.advance_operation_time(ahead)
        started = time.monotonic()
        assert secondary.reach.c.find_one({"_id": 1}, session=s, max_time_ms=20_000) == {"_id": 1}
        assert time.monotonic() - started < 10
    note = oplog.find_one({"o": {"noop write for afterClusterTime read concern": 1}})
    assert note is not None and note["op"] == "n" and note["ts"] > ahead
    for c in (rs, primary, secondary):
        c.close()


def test_a_prepared_transaction_survives_a_failover_and_commits_on_the_new_primary(three_members):
    """A participant's side of a two-phase commit: prepareTransaction logs the transaction
    (w:"majority") and holds its documents; the primary is killed; the new primary has the
    transaction prepared, still holding its documents, and commits it at the coordinator's
    commitTimestamp; a member restarted afterwards has the commit."""
    from bson.int64 import Int64

    hosts = ",".join(f"127.0.0.1:{s.port}" for s in three_members)
    rs = pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet=rs0", serverSelectionTimeoutMS=30_000)
    rs.pt.c.insert_many([{"_id": 1, "v": 0}, {"_id": 2, "v": 0}])
    # An explicit session: pymongo puts its lsid on each command.
    session = rs.start_session(causal_consistency=False)
    lsid = session.session_id

    def txn(name, value=1, **fields):
        cmd = {name: value, "txnNumber": Int64(1), "autocommit": False}
        cmd.update(fields)
        return cmd

    # Raw commands with the session's fields, as a router sends them (pymongo's session
    # object knows no prepare).
    rs.pt.command(session=session, command=txn("update", "c", updates=[{"q": {"_id": 1}, "u": {"$set": {"v": 1}}}], startTransaction=True))
    prepared = rs.admin.command(session=session, command=txn("prepareTransaction", writeConcern={"w": "majority"}))["prepareTimestamp"]
    assert isinstance(prepared, Timestamp)
    # A second prepare answers the same timestamp; a statement after it is refused.
    assert rs.admin.command(session=session, command=txn("prepareTransaction"))["prepareTimestamp"] == prepared
    with pytest.raises(OperationFailure) as e:
        rs.pt.command(session=session, command=txn("find", "c"))
    assert e.value.code == 267 and e.value.details["codeName"] == "PreparedTransactionInProgress"
    def record_state():
        return [r.get("state") for r in rs.config.transactions.find() if r["_id"]["id"] == lsid["id"]]

    assert record_state() == ["prepared"], list(rs.config.transactions.find())

    first = rs.primary
    by_port = {s.port: s for s in three_members}
    by_port[first[1]].kill9()
    deadline = time.time() + 30
    while True:
        try:
            rs.admin.command("ping")
            if rs.primary is not None and rs.primary != first:
                break
        except pymongo.errors.PyMongoError:
            pass
        assert time.time() < deadline
        time.sleep(0.1)
    # The new primary holds the prepared transaction's document against other writers
    # (which wait for the decision) and has not applied it.
    assert rs.pt.c.find_one({"_id": 1})["v"] == 0
    blocked = rs.pt.command({"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"v": 5}}}], "maxTimeMS": 300})
    assert blocked.get("nModified") == 0 and blocked["writeErrors"][0]["code"] == 50, blocked
    rs.pt.c.update_one({"_id": 2}, {"$set": {"v": 2}})
    # A commit without the timestamp is refused; with it, the transaction commits.
    with pytest.raises(OperationFailure) as e:
        rs.admin.command(session=session, command=txn("commitTransaction"))
    assert e.value.code == 72
    rs.admin.command(session=session, command=txn("commitTransaction", commitTimestamp=prepared, writeConcern={"w": "majority"}))
    assert rs.pt.c.find_one({"_id": 1})["v"] == 1
    assert record_state() == ["committed"]
    # A retried commit succeeds again.
    rs.admin.command(session=session, command=txn("commitTransaction", commitTimestamp=prepared))
    rs.pt.c.update_one({"_id": 1}, {"$set": {"v": 7}})

    # The killed member comes back, finds the transaction prepared from its record, and
    # applies the commit from the new primary.
    by_port[first[1]].start(port=first[1])
    back = pymongo.MongoClient(f"mongodb://127.0.0.1:{first[1]}/?directConnection=true", readPreference="secondaryPreferred")
    deadline = time.time() + 30
    while back.pt.c.find_one({"_id": 1}, {"v": 1}) != {"_id": 1, "v": 7}:
        assert time.time() < deadline
        time.sleep(0.1)
    back.close()
    session.end_session()
    rs.close()


def test_updates_are_logged_as_mongod_logs_them_and_replicate(three_members):
    """An update by operators or pipeline is logged as its `$v: 2` diff, a replacement as the
    whole document; every member ends with the primary's documents."""
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in three_members)
    rs = pymongo.MongoClient(f"mongodb://{hosts}/?replicaSet=rs0", serverSelectionTimeoutMS=30_000)
    coll = rs.app.get_collection("logged")
    coll.create_index("k")
    coll.insert_one({"_id": 1, "a": 1, "k": 1, "sub": {"x": 1, "y": "long enough to diff"}, "array": ["foo", {"a": "bar"}, 1, 2, 3]})
    changes = [
        ({"$set": {"a": 2}, "$unset": {"k": ""}}, {"u": {"a": 2}, "d": {"k": False}}),
        ({"$set": {"sub.x": 2, "new": True}}, {"i": {"new": True}, "ssub": {"u": {"x": 2}}}),
        ({"$push": {"array": 4}}, {"sarray": {"a": True, "u5": 4}}),
        ([{"$set": {"array": ["foo", {"a": "bar"}]}}], {"sarray": {"a": True, "l": 2}}),
    ]
    for update, _ in changes:
        coll.update_one({"_id": 1}, update)
    # An update that changes nothing logs nothing.
    coll.update_one({"_id": 1}, {"$set": {"a": 2}})
    coll.replace_one({"_id": 1}, {"a": 3, "k": 3})
    # findAndModify returning the new document, as a retryable write.
    after = coll.find_one_and_update({"_id": 1}, {"$inc": {"a": 1}}, return_document=pymongo.ReturnDocument.AFTER)
    assert after == {"_id": 1, "a": 4, "k": 3}
    oplog = rs.local.get_collection("oplog.rs")
    updates = list(oplog.find({"ns": "app.logged", "op": "u"}).sort("ts", 1))
    assert [u["o2"] for u in updates] == [{"_id": 1}] * 6
    logged = [u["o"] for u in updates]
    assert logged[:4] == [{"$v": 2, "diff": diff} for _, diff in changes]
    assert logged[4] == {"_id": 1, "a": 3, "k": 3}
    assert logged[5] == {"$v": 2, "diff": {"u": {"a": 4}}}
    for s in three_members:
        member = pymongo.MongoClient(s.uri, directConnection=True, readPreference="secondaryPreferred")
        deadline = time.time() + 10
        while member.app.logged.find_one({"_id": 1}) != after:
            assert time.time() < deadline, member.app.logged.find_one({"_id": 1})
            time.sleep(0.05)
        assert member.app.logged.find_one({"k": 3}, hint="k_1") == after
        assert member.app.command("validate", "logged")["valid"]
        member.close()
    rs.close()
