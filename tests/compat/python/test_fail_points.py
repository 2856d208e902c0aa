"""Fail points for tests (configureFailPoint, with enableTestCommands): failCommand's
errors, labels, write concern errors, dropped connections and blocks, counted as mongod
counts them."""

import time

import pymongo
import pytest
from conftest import ShoalServer
from pymongo.errors import AutoReconnect, NotPrimaryError, OperationFailure, WriteConcernError


@pytest.fixture(scope="module")
def test_server(shoal_bin):
    s = ShoalServer(shoal_bin, ["--setParameter", "enableTestCommands=1"]).start()
    yield s
    s.close()


def test_fail_points_need_enable_test_commands(client):
    with pytest.raises(OperationFailure) as e:
        client.admin.command("configureFailPoint", "failCommand", mode="alwaysOn", data={"failCommands": ["find"], "errorCode": 2})
    assert e.value.code == 59  # CommandNotFound
    assert client.admin.command("getParameter", "*")["enableTestCommands"] is False


def test_fail_command_error_times_and_count(test_server):
    c = pymongo.MongoClient(test_server.uri, retryReads=False)
    try:
        params = c.admin.command("getParameter", "*")
        assert params["enableTestCommands"] is True
        assert c.admin.command("getCmdLineOpts")["parsed"]["setParameter"] == {"enableTestCommands": "1"}
        first = c.admin.command("configureFailPoint", "failCommand", mode={"times": 2}, data={"failCommands": ["find"], "errorCode": 91})["count"]
        for _ in range(2):
            with pytest.raises(NotPrimaryError) as e:  # a shutdown error, as a driver classes 91
                c.fp.c.find_one()
            assert (e.value.details["code"], e.value.details["codeName"]) == (91, "ShutdownInProgress")
        assert c.fp.c.find_one() is None  # the third runs
        c.admin.command("waitForFailPoint", "failCommand", timesEntered=first + 2, maxTimeMS=1000)
        with pytest.raises(OperationFailure) as e:
            c.admin.command("waitForFailPoint", "failCommand", timesEntered=first + 3, maxTimeMS=100)
        assert e.value.code == 50  # MaxTimeMSExpired
        count = c.admin.command("configureFailPoint", "failCommand", mode="off")["count"]
        assert count == first + 2
    finally:
        c.close()


def test_fail_command_labels_and_write_concern_error(test_server):
    c = pymongo.MongoClient(test_server.uri, retryWrites=False)
    try:
        c.admin.command(
            "configureFailPoint", "failCommand", mode={"times": 1},
            data={"failCommands": ["insert"], "errorCode": 112, "errorLabels": ["TransientTransactionError"]},
        )
        with pytest.raises(OperationFailure) as e:
            c.fp.c.insert_one({"_id": 1})
        assert e.value.details["errorLabels"] == ["TransientTransactionError"]
        assert c.fp.c.count_documents({}) == 0  # failed before it ran
        c.admin.command(
            "configureFailPoint", "failCommand", mode={"times": 1},
            data={"failCommands": ["insert"], "writeConcernError": {"code": 100, "errmsg": "injected"}},
        )
        with pytest.raises(WriteConcernError) as e:
            c.fp.c.insert_one({"_id": 2})
        assert e.value.details["code"] == 100
        assert c.fp.c.count_documents({"_id": 2}) == 1  # it ran
    finally:
        c.drop_database("fp")
        c.close()


def test_fail_command_closes_blocks_and_spares_other_apps(test_server):
    c = pymongo.MongoClient(test_server.uri, appName="victim", retryReads=False)
    other = pymongo.MongoClient(test_server.uri, appName="bystander")
    try:
        c.admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data={"failCommands": ["aggregate"], "closeConnection": True, "appName": "victim"})
        assert other.fp.c.count_documents({}) == 0
        with pytest.raises(AutoReconnect):
            c.fp.c.count_documents({})
        c.admin.command(
            "configureFailPoint", "failCommand", mode={"times": 1},
            data={"failCommands": ["ping"], "blockConnection": True, "blockTimeMS": 300, "appName": "victim"},
        )
        started = time.monotonic()
        c.admin.command("ping")
        assert time.monotonic() - started >= 0.3
    finally:
        c.admin.command("configureFailPoint", "failCommand", mode="off")
        c.close()
        other.close()


def test_unknown_fail_point_and_bad_mode(test_server):
    c = pymongo.MongoClient(test_server.uri)
    try:
        with pytest.raises(OperationFailure, match="Cannot find failpoint"):
            c.admin.command("configureFailPoint", "noSuchPoint", mode="alwaysOn")
        with pytest.raises(OperationFailure):
            c.admin.command("configureFailPoint", "failCommand", mode={"times": -1}, data={"failCommands": ["find"]})
        with pytest.raises(OperationFailure):
            c.admin.command("configureFailPoint", "failCommand", mode="alwaysOn", data={"errorCode": 2})  # no failCommands
    finally:
        c.close()
