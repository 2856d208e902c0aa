"""A sharded cluster through pymongo: `shoal cluster up --shards 2` (config servers, two
one-member shard sets, a router), a collection hash-sharded through the router, and pymongo's
CRUD, bulk writes, cursors and errors against it."""

import subprocess
import tempfile
from pathlib import Path

import pymongo
import pytest
from conftest import free_port_block
from pymongo import DeleteOne, InsertOne, UpdateOne
from pymongo.errors import BulkWriteError, OperationFailure


@pytest.fixture(scope="module")
def cluster(shoal_bin):
    port = free_port_block(4)
    root = Path(tempfile.mkdtemp(prefix="shoal-pytest-sharded-"))
    up = subprocess.run([shoal_bin, "cluster", "up", "--shards", "2", "--port", str(port), "--dir", str(root)], capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr
    yield {"uri": up.stdout.strip(), "port": port}
    subprocess.run([shoal_bin, "cluster", "down", "--dir", str(root)], capture_output=True, timeout=60)


def on_each_shard(cluster, read):
    """`read(client)` on each shard's primary, connected directly: a list, shard by shard."""
    out = []
    for i in range(2):
        direct = pymongo.MongoClient(f"mongodb://127.0.0.1:{cluster['port'] + 2 + i}/?directConnection=true")
        try:
            out.append(read(direct))
        finally:
            direct.close()
    return out


def test_router_crud_bulk_and_cursors(cluster):
    c = pymongo.MongoClient(cluster["uri"])
    assert c.admin.command("hello")["msg"] == "isdbgrid"
    assert c.admin.command("shardCollection", "shop.orders", key={"customerId": "hashed"})["collectionsharded"] == "shop.orders"
    orders = c.shop.orders
    orders.insert_many([{"_id": i, "customerId": i % 50, "qty": i} for i in range(500)], ordered=False)

    # Each shard holds part of the collection.
    counts = on_each_shard(cluster, lambda d: d.shop.orders.count_documents({}))
    assert sum(counts) == 500 and min(counts) > 0, counts

    assert orders.count_documents({"customerId": 7}) == 10
    assert [d["_id"] for d in orders.find({"qty": {"$gte": 490}}).sort("qty", pymongo.DESCENDING)] == list(range(499, 489, -1))
    assert len(list(orders.find({}, batch_size=7))) == 500

    # A bulk write of mixed operations, ordered: results at the client's positions.
    r = orders.bulk_write([InsertOne({"_id": 1000, "customerId": 1}), UpdateOne({"customerId": 1, "_id": 1}, {"$set": {"seen": True}}), DeleteOne({"customerId": 2, "_id": 2})])
    assert (r.inserted_count, r.modified_count, r.deleted_count) == (1, 1, 1)
    with pytest.raises(BulkWriteError) as e:
        orders.insert_many([{"_id": 2000, "customerId": 3}, {"_id": 5, "customerId": 5}, {"_id": 2001, "customerId": 4}])
    errors = e.value.details["writeErrors"]
    assert [w["index"] for w in errors] == [1] and errors[0]["code"] == 11000
    # Ordered: the batch stopped at the duplicate.
    assert orders.count_documents({"_id": {"$in": [2000, 2001]}}) == 1

    # A single update that fixes neither the shard key nor the _id is refused as mongos does.
    with pytest.raises(OperationFailure) as e:
        orders.update_one({"qty": 3}, {"$set": {"x": 1}})
    assert e.value.code == 61
    c.close()


def test_router_administration_commands(cluster):
    c = pymongo.MongoClient(cluster["uri"])
    names = c.admin.command("listCommands")["commands"]
    for n in ["find", "getParameter", "currentOp", "killOp", "validate", "renameCollection", "flushRouterConfig", "getShardMap", "usersInfo"]:
        assert n in names, n
    assert names["addShard"]["adminOnly"] is True
    params = c.admin.command("getParameter", "*")
    assert "SCRAM-SHA-256" in params["authenticationMechanisms"]
    assert c.admin.command("getParameter", 1, logicalSessionTimeoutMinutes=1)["logicalSessionTimeoutMinutes"] == 30
    with pytest.raises(OperationFailure) as e:
        c.admin.command("getParameter", 1, noSuchParameter=1)
    assert e.value.code == 72
    opts = c.admin.command("getCmdLineOpts")
    assert opts["parsed"]["sharding"]["configDB"].startswith("cfg/") and opts["argv"][1] == "router"
    assert c.admin.command("hostInfo")["system"]["numCores"] >= 1
    assert c.admin.command("getLog", "*")["names"] == ["startupWarnings"]
    with pytest.raises(OperationFailure) as e:
        c.app.command("getParameter", "*")
    assert e.value.code == 13

    c.admin.command("shardCollection", "adm.s", key={"_id": "hashed"})
    c.adm.s.insert_many([{"_id": i} for i in range(100)])
    c.adm.u.insert_one({"_id": 1})
    v = c.adm.command("validate", "s")
    assert v["valid"] is True and len(v["raw"]) == 2
    # Each shard's running operations, named "<shard>:<opid>"; currentOp sees itself.
    ops = c.admin.command("currentOp")["inprog"]
    assert ops and all(o["shard"] in ("shard0", "shard1") and o["opid"].startswith(o["shard"] + ":") for o in ops)
    c.admin.command("killOp", op="shard0:999999999")
    with pytest.raises(OperationFailure):
        c.admin.command("killOp", op=5)

    c.admin.command("renameCollection", "adm.u", to="adm.u2")
    assert c.adm.u2.find_one() == {"_id": 1} and c.adm.u.find_one() is None
    with pytest.raises(OperationFailure) as e:
        c.admin.command("renameCollection", "adm.s", to="adm.s2")
    assert e.value.code == 20
    assert c.admin.command("flushRouterConfig")["flushed"] is True
    assert c.adm.s.count_documents({}) == 100
    shard_map = c.admin.command("getShardMap")["map"]
    assert set(shard_map) == {"shard0", "shard1", "config"} and shard_map["config"].startswith("cfg/")
    # An explain goes to the shards its filter targets.
    plan = c.adm.command("explain", {"find": "s", "filter": {"_id": 5}})
    assert plan["queryPlanner"]["winningPlan"]["stage"] == "SINGLE_SHARD"


def test_snapshot_reads_see_one_point_across_shards(cluster):
    """A snapshot session through the router: its first read, over both shards, reads at one
    point (the router's cluster time, at or after every write it acknowledged); later reads in
    the session read there too, whatever was written since, on every shard."""
    c = pymongo.MongoClient(cluster["uri"])
    c.admin.command("shardCollection", "snap.c", key={"_id": "hashed"})
    coll = c.snap.c
    for round in range(3):
        coll.delete_many({})
        coll.insert_many([{"_id": i, "x": i} for i in range(200)])
        with c.start_session(snapshot=True) as s:
            first = {d["_id"]: d["x"] for d in coll.find({}, session=s)}
            assert len(first) == 200 and sum(first.values()) == sum(range(200)), round
            coll.update_many({}, {"$inc": {"x": 1000}})
            coll.insert_one({"_id": 1000, "x": 7})
            assert {d["_id"]: d["x"] for d in coll.find({}, session=s)} == first
            assert sorted(coll.distinct("x", session=s)) == sorted(first.values())
            total = list(coll.aggregate([{"$group": {"_id": None, "s": {"$sum": "$x"}}}], session=s))
            assert total == [{"_id": None, "s": sum(range(200))}]
        assert coll.count_documents({}) == 201
    c.close()


def test_transactions_read_one_point_across_shards_and_write_on_both(cluster):
    """A transaction through the router reads on both shards at one point (readConcern
    snapshot: the router's cluster time when it began). One that writes on one shard commits
    there; one that writes on both commits by two-phase commit, all or nothing; an abort
    leaves nothing on either shard."""
    from pymongo.read_concern import ReadConcern

    c = pymongo.MongoClient(cluster["uri"])
    c.admin.command("shardCollection", "tx.acc", key={"_id": "hashed"})
    acc = c.tx.acc
    acc.insert_many([{"_id": i, "b": 100} for i in range(40)])
    on_shard = on_each_shard(cluster, lambda d: sorted(doc["_id"] for doc in d.tx.acc.find({}, {"_id": 1})))
    a, b = on_shard[0][0], on_shard[1][0]
    # A shard keeps the history of its documents while reads at a point use it: one such
    # read of both makes them keep it (else a point before a shard's newest write there
    # would be SnapshotTooOld, a transient error the client runs the transaction again on).
    assert len(list(acc.with_options(read_concern=ReadConcern("snapshot")).find({}))) == 40

    with c.start_session() as s:
        s.start_transaction(read_concern=ReadConcern("snapshot"))
        assert acc.find_one({"_id": a}, session=s)["b"] == 100
        # Written after the transaction's point, on the other shard, which the transaction
        # has not reached yet: it reads the value as of its point.
        acc.update_one({"_id": b}, {"$set": {"b": 555}})
        assert acc.find_one({"_id": b}, session=s)["b"] == 100
        acc.update_one({"_id": a}, {"$inc": {"b": -10}}, session=s)
        s.commit_transaction()
    assert acc.find_one({"_id": a})["b"] == 90 and acc.find_one({"_id": b})["b"] == 555

    # Both shards written: a two-phase commit.
    with c.start_session() as s:
        s.start_transaction()
        acc.update_one({"_id": a}, {"$inc": {"b": -1}}, session=s)
        acc.update_one({"_id": b}, {"$inc": {"b": 1}}, session=s)
        s.commit_transaction()
    assert acc.find_one({"_id": a})["b"] == 89 and acc.find_one({"_id": b})["b"] == 556
    # The coordinator's record is gone once every participant committed.
    assert c.config.transaction_coordinators.count_documents({}) == 0
    commits = c.admin.command("serverStatus")["transactions"]["commitTypes"]
    assert commits["twoPhaseCommit"]["successful"] >= 1 and commits["singleWriteShard"]["successful"] >= 1

    # Aborted after writing on both: nothing changes.
    with c.start_session() as s:
        s.start_transaction()
        acc.update_one({"_id": a}, {"$inc": {"b": -1}}, session=s)
        acc.update_one({"_id": b}, {"$inc": {"b": 1}}, session=s)
        s.abort_transaction()
    assert acc.find_one({"_id": a})["b"] == 89 and acc.find_one({"_id": b})["b"] == 556

    # A transfer between the shards with a helper, many times over, with snapshot readers
    # beside it: the total never moves.
    def transfer(s, x, y):
        acc.update_one({"_id": x}, {"$inc": {"b": -3}}, session=s)
        acc.update_one({"_id": y}, {"$inc": {"b": 3}}, session=s)

    total = sum(d["b"] for d in acc.find({}))
    pairs = [(on_shard[0][i % len(on_shard[0])], on_shard[1][i % len(on_shard[1])]) for i in range(20)]
    for i, (x, y) in enumerate(pairs):
        with c.start_session() as s:
            s.with_transaction(lambda s: transfer(s, x, y) if i % 2 else transfer(s, y, x))
        with c.start_session() as s:
            # One read of both shards, in batches: one point on each.
            s.start_transaction(read_concern=ReadConcern("snapshot"))
            assert sum(d["b"] for d in acc.find({}, session=s, batch_size=7)) == total
            s.commit_transaction()
    assert sum(d["b"] for d in acc.find({})) == total
    c.close()


def test_statements_of_a_transaction_may_span_shards(cluster):
    """In a transaction through the router, one statement may read or write on several
    shards: each shard it reaches joins the transaction (at its point), writes on several
    commit by two-phase commit, and the transaction sees its own writes on every shard."""
    from pymongo.errors import OperationFailure
    from pymongo.read_concern import ReadConcern

    c = pymongo.MongoClient(cluster["uri"])
    c.admin.command("shardCollection", "span.acc", key={"_id": "hashed"})
    acc = c.span.acc
    acc.insert_many([{"_id": i, "b": 10, "g": i % 3} for i in range(60)])

    assert all(n > 0 for n in on_each_shard(cluster, lambda d: d.span.acc.count_documents({})))

    # Writes on both shards in one statement each, read back in the transaction, then
    # aborted: nothing changed anywhere.
    with c.start_session() as s:
        s.start_transaction(read_concern=ReadConcern("snapshot"))
        assert acc.update_many({}, {"$inc": {"b": 1}}, session=s).modified_count == 60
        acc.insert_many([{"_id": 100 + i, "b": 0, "g": 9} for i in range(20)], session=s)
        assert acc.delete_many({"g": 0}, session=s).deleted_count == 20
        assert sum(d["b"] for d in acc.find({}, session=s, batch_size=5)) == 40 * 11
        assert acc.count_documents({}, session=s) == 60
        assert sorted(acc.distinct("g", session=s)) == [1, 2, 9]
        groups = {d["_id"]: d["n"] for d in acc.aggregate([{"$group": {"_id": "$g", "n": {"$sum": 1}}}], session=s)}
        assert groups == {1: 20, 2: 20, 9: 20}
        s.abort_transaction()
    assert acc.count_documents({}) == 60 and sum(d["b"] for d in acc.find({})) == 600

    # The same, committed: all of it, on both shards.
    with c.start_session() as s:
        with s.start_transaction():
            acc.update_many({}, {"$inc": {"b": 1}}, session=s)
            acc.insert_many([{"_id": 100 + i, "b": 0, "g": 9} for i in range(20)], session=s)
            acc.delete_many({"g": 0}, session=s)
    assert acc.count_documents({}) == 60 and sum(d["b"] for d in acc.find({})) == 40 * 11
    assert sum(on_each_shard(cluster, lambda d: d.span.acc.count_documents({}))) == 60
    commits = c.admin.command("serverStatus")["transactions"]["commitTypes"]
    assert commits["twoPhaseCommit"]["successful"] >= 1

    # What a transaction may not run is refused there, as mongod refuses it.
    with c.start_session() as s:
        s.start_transaction()
        acc.find_one({}, session=s)
        with pytest.raises(OperationFailure) as e:
            c.span.command("listCollections", session=s)
        assert e.value.code == 263 and "TransientTransactionError" not in (e.value.details.get("errorLabels") or [])
        s.abort_transaction()
    c.close()


def test_concurrent_transfers_across_shards_keep_the_total_at_every_point(cluster):
    """Transfers between accounts on different shards (two-phase commits) from several
    clients at once, with snapshot readers beside them: every reader's point sees every
    transfer whole or not at all, so the total is the same at every point."""
    import threading
    from pymongo.read_concern import ReadConcern

    c = pymongo.MongoClient(cluster["uri"])
    c.admin.command("shardCollection", "tx2.acc", key={"_id": "hashed"})
    acc = c.tx2.acc
    n = 16
    acc.insert_many([{"_id": i, "b": 1000} for i in range(n)])
    total = 1000 * n
    stop = threading.Event()
    errors, sums, done = [], [], []

    def transfers(seed):
        import random

        rnd = random.Random(seed)
        try:
            for _ in range(25):
                x, y = rnd.sample(range(n), 2)

                def move(s):
                    acc.update_one({"_id": x}, {"$inc": {"b": -7}}, session=s)
                    acc.update_one({"_id": y}, {"$inc": {"b": 7}}, session=s)

                with c.start_session() as s:
                    s.with_transaction(move)
                done.append(1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    def reader():
        try:
            while not stop.is_set():
                with c.start_session() as s:
                    # (A point before the shard kept history is SnapshotTooOld, a transient
                    # error: the helper retries.)
                    read = s.with_transaction(lambda s: sum(acc.find_one({"_id": k}, session=s)["b"] for k in range(n)), read_concern=ReadConcern("snapshot"))
                    sums.append(read)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    writers = [threading.Thread(target=transfers, args=(i,)) for i in range(4)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join(timeout=300)
    stop.set()
    for t in readers:
        t.join(timeout=120)
    assert errors == []
    assert len(done) == 100
    assert sums and all(x == total for x in sums), sorted(set(sums))
    assert sum(d["b"] for d in acc.find({})) == total
    assert c.config.transaction_coordinators.count_documents({}) == 0
    c.close()


def test_a_transaction_open_across_a_migration_of_what_it_wrote_is_aborted(cluster):
    """A transaction wrote a document whose chunk then moves to the other shard: its commit
    would write where the donor no longer owns the document, so the migration's critical
    section aborts it (NoSuchTransaction, a transient error); run again, it writes on the new
    owner. Nothing is lost either way."""
    c = pymongo.MongoClient(cluster["uri"])
    c.admin.command("shardCollection", "mig.c", key={"k": 1})
    coll = c.mig.c
    coll.insert_many([{"_id": i, "k": i, "v": 0} for i in range(10)])
    primary = c.config.databases.find_one({"_id": "mig"})["primary"]
    other = "shard1" if primary == "shard0" else "shard0"
    with c.start_session() as s:
        s.start_transaction()
        coll.update_one({"k": 5}, {"$set": {"v": 1}}, session=s)
        c.admin.command("moveChunk", "mig.c", find={"k": 5}, to=other)
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 251 and e.value.has_error_label("TransientTransactionError"), e.value.details
    assert coll.find_one({"k": 5})["v"] == 0
    with c.start_session() as s:
        s.with_transaction(lambda s: coll.update_one({"k": 5}, {"$set": {"v": 1}}, session=s))
    assert coll.find_one({"k": 5})["v"] == 1 and coll.count_documents({}) == 10
    c.close()


def test_a_transaction_open_across_a_move_primary_of_its_database_is_aborted(cluster):
    """A transaction wrote an unsharded collection, whose database then moves to the other
    shard (movePrimary): its commit would write the old copy, which the move drops, so the
    move's critical section aborts it (NoSuchTransaction, transient); run again, it writes
    on the new primary. Nothing is lost either way."""
    c = pymongo.MongoClient(cluster["uri"])
    coll = c.movedb.c
    coll.insert_many([{"_id": i, "v": 0} for i in range(10)])
    primary = c.config.databases.find_one({"_id": "movedb"})["primary"]
    other = "shard1" if primary == "shard0" else "shard0"
    with c.start_session() as s:
        s.start_transaction()
        coll.update_one({"_id": 5}, {"$set": {"v": 1}}, session=s)
        c.admin.command("movePrimary", "movedb", to=other)
        with pytest.raises(OperationFailure) as e:
            s.commit_transaction()
        assert e.value.code == 251 and e.value.has_error_label("TransientTransactionError"), e.value.details
    assert c.config.databases.find_one({"_id": "movedb"})["primary"] == other
    assert coll.find_one({"_id": 5})["v"] == 0
    with c.start_session() as s:
        s.with_transaction(lambda s: coll.update_one({"_id": 5}, {"$set": {"v": 1}}, session=s))
    assert coll.find_one({"_id": 5})["v"] == 1 and coll.count_documents({}) == 10
    c.close()

def test_cluster_time_is_gossiped_and_bounded(cluster):
    """The router's replies carry its cluster time and the operation's time, and every
    process takes the times it is told: a write on one shard after a client saw a time is
    stamped after it. A time more than a year ahead of a process's clock is refused
    (ClusterTimeFailsRateLimiter)."""
    import time

    from bson import Timestamp

    c = pymongo.MongoClient(cluster["uri"])
    seen = c.admin.command("ping")["$clusterTime"]["clusterTime"]
    ahead = Timestamp(seen.time + 30, 7)
    signature = {"hash": b"\0" * 20, "keyId": 0}
    direct = pymongo.MongoClient(f"mongodb://127.0.0.1:{cluster['port'] + 2}/?directConnection=true")
    # (A driver sends the newest time its session or client saw.)
    with direct.start_session() as s:
        s.advance_cluster_time({"clusterTime": ahead, "signature": signature})
        reply = direct.gossip.command("insert", "t", documents=[{"x": 1}], session=s)
    assert reply["operationTime"] > ahead

    # A causally consistent session through the router chains on its replies'
    # operationTime: a read on a shard that logged nothing since the session's last write
    # (on the other shard) reaches that time at once (its primary logs a no-op).
    c.admin.command("shardCollection", "gossip.h", key={"_id": "hashed"})
    c.gossip.h.insert_many([{"_id": i} for i in range(20)])
    owners = on_each_shard(cluster, lambda d: d.gossip.h.find_one({})["_id"])
    with c.start_session(causal_consistency=True) as s:
        for _ in range(3):
            c.gossip.h.update_one({"_id": owners[0]}, {"$inc": {"n": 1}}, session=s)
            written = s.operation_time
            assert written is not None
            assert c.gossip.h.find_one({"_id": owners[1]}, session=s, max_time_ms=5000)["_id"] == owners[1]
            assert s.operation_time >= written

    far = Timestamp(int(time.time()) + 2 * 365 * 24 * 3600, 1)
    for client in (c, direct):
        with client.start_session() as s:
            s.advance_cluster_time({"clusterTime": far, "signature": signature})
            with pytest.raises(OperationFailure) as e:
                client.admin.command("ping", session=s)
        assert e.value.code == 205 and e.value.details["codeName"] == "ClusterTimeFailsRateLimiter"
    direct.close()
    c.close()
