"""A sharded cluster with access control through pymongo: `shoal cluster up --shards 2 --auth`
(a keyFile every member and router authenticates to each other with), users kept on the
config servers, logins through the router, and a second router that knows the same users.
Also the same cluster over TLS."""

import json
import subprocess
import tempfile
import time
from pathlib import Path

import pymongo
import pytest
from conftest import REPO, free_port_block
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError


def up(shoal_bin, root: Path, *extra) -> tuple:
    port = free_port_block(4)
    r = subprocess.run([shoal_bin, "cluster", "up", "--shards", "2", "--auth", "--port", str(port), "--dir", str(root), *extra], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return port, r.stdout.strip()


def down(shoal_bin, root: Path):
    subprocess.run([shoal_bin, "cluster", "down", "--dir", str(root)], capture_output=True, timeout=60)


def wait_listening(port: int, proc: subprocess.Popen):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the second router exited"
        try:
            pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=200).admin.command("ping")
            return
        except ServerSelectionTimeoutError:
            time.sleep(0.05)
    raise RuntimeError("the second router did not start")


def test_router_authenticates_authorizes_and_shares_users_with_the_next_router(shoal_bin):
    root = Path(tempfile.mkdtemp(prefix="shoal-pytest-sharded-auth-"))
    port, uri = up(shoal_bin, root)
    second = None
    try:
        anon = pymongo.MongoClient(uri)
        with pytest.raises(OperationFailure) as e:
            anon.app.c.insert_one({"_id": 1})
        assert e.value.code == 13
        # The localhost exception: the first user, created through the router, on the
        # config servers.
        anon.admin.command("createUser", "root", pwd="rootpw", roles=["root"])
        with pytest.raises(OperationFailure) as e:
            anon.admin.command("createUser", "other", pwd="x", roles=["root"])
        assert e.value.code == 13

        root_client = pymongo.MongoClient(uri, username="root", password="rootpw", authMechanism="SCRAM-SHA-256")
        root_client.admin.command("enableSharding", "app")
        root_client.admin.command("shardCollection", "app.c", key={"_id": "hashed"})
        root_client.app.c.insert_many([{"_id": i} for i in range(200)])
        assert root_client.app.c.count_documents({}) == 200
        assert root_client.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == [{"user": "root", "db": "admin"}]

        # The shards hold the data and are closed to clients without credentials too.
        direct = pymongo.MongoClient(f"mongodb://127.0.0.1:{port + 2}/?directConnection=true")
        with pytest.raises(OperationFailure) as e:
            direct.app.c.count_documents({})
        assert e.value.code == 13

        with pytest.raises(OperationFailure) as e:
            pymongo.MongoClient(uri, username="root", password="wrong").app.c.find_one()
        assert e.value.code == 18

        root_client.app.command("createUser", "reader", pwd="readerpw", roles=["read"])
        reader = pymongo.MongoClient(uri, username="reader", password="readerpw", authSource="app", authMechanism="SCRAM-SHA-256")
        assert reader.app.c.count_documents({"_id": {"$lt": 10}}) == 10
        with pytest.raises(OperationFailure) as e:
            reader.app.c.insert_one({"_id": 1000})
        assert e.value.code == 13
        with pytest.raises(OperationFailure) as e:
            reader.app.c.insert_many([{"_id": 1000 + i} for i in range(5)])
        assert e.value.code == 13
        assert root_client.app.c.count_documents({"_id": {"$gte": 1000}}) == 0
        with pytest.raises(OperationFailure) as e:
            reader.admin.command("addShard", "x/127.0.0.1:1")
        assert e.value.code == 13

        # A second router on the same config servers, with the same keyFile and an audit
        # log: the users created through the first log in here.
        port2 = free_port_block(1)
        log = open(root / "router2.log", "wb")
        audit = root / "router2-audit.json"
        second = subprocess.Popen(
            [shoal_bin, "router", "--configdb", f"cfg/127.0.0.1:{port + 1}", "--port", str(port2), "--keyFile", str(root / "keyfile"),
             "--auditDestination", "file", "--auditPath", str(audit), "--setParameter", "auditAuthorizationSuccess=true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        wait_listening(port2, second)
        reader2 = pymongo.MongoClient(f"mongodb://127.0.0.1:{port2}/", username="reader", password="readerpw", authSource="app")
        assert reader2.app.c.count_documents({}) == 200
        with pytest.raises(OperationFailure) as e:
            reader2.app.c.delete_many({})
        assert e.value.code == 13
        # A role granted through the second router takes effect there at once.
        root2 = pymongo.MongoClient(f"mongodb://127.0.0.1:{port2}/", username="root", password="rootpw")
        root2.app.command("grantRolesToUser", "reader", roles=["readWrite"])
        reader2.app.c.insert_one({"_id": 5000})
        assert root_client.app.c.count_documents({"_id": 5000}) == 1

        # The second router's audit records: logins, the refused delete, a CRUD command that
        # passed, and the role grant.
        second.terminate()
        second.wait(timeout=30)
        second = None
        records = [json.loads(line) for line in audit.read_text().splitlines()]
        kinds = [(r["atype"], r["result"]) for r in records]
        assert kinds[0] == ("startup", 0) and kinds[-1] == ("shutdown", 0)
        logins = [r for r in records if r["atype"] == "authenticate"]
        assert {(r["param"]["user"], r["result"]) for r in logins} == {("reader", 0), ("root", 0)}
        refused = [r for r in records if r["atype"] == "authCheck" and r["result"] == 13]
        assert refused and refused[0]["param"]["command"] == "delete" and refused[0]["users"] == [{"user": "reader", "db": "app"}]
        assert any(r["atype"] == "authCheck" and r["result"] == 0 and r["param"]["command"] == "insert" for r in records)
        grants = [r for r in records if r["atype"] == "grantRolesToUser"]
        assert grants and grants[0]["param"]["user"] == "reader" and grants[0]["users"] == [{"user": "root", "db": "admin"}]
    finally:
        if second is not None:
            second.kill()
            second.wait()
        down(shoal_bin, root)


def test_router_over_tls_with_scram_sha_256(shoal_bin, tmp_path):
    subprocess.run(["bash", str(REPO / "tests" / "compat" / "make_test_certs.sh"), str(tmp_path)], check=True)
    ca, server_pem, client_pem = str(tmp_path / "ca.pem"), str(tmp_path / "server.pem"), str(tmp_path / "client.pem")
    root = tmp_path / "cluster"
    port, uri = up(shoal_bin, root, "--tlsMode", "requireTLS", "--tlsCertificateKeyFile", server_pem, "--tlsCAFile", ca)
    try:
        tls = {"tls": True, "tlsCAFile": ca, "tlsCertificateKeyFile": client_pem}
        anon = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=5000, **tls)
        anon.admin.command("createUser", "root", pwd="rootpw", roles=["root"])
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", username="root", password="rootpw", authMechanism="SCRAM-SHA-256", **tls)
        c.admin.command("shardCollection", "app.t", key={"k": "hashed"})
        c.app.t.insert_many([{"k": i} for i in range(50)])
        assert c.app.t.count_documents({}) == 50
        with pytest.raises(ServerSelectionTimeoutError):
            pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", username="root", password="rootpw", serverSelectionTimeoutMS=1000).admin.command("ping")
        with pytest.raises(OperationFailure) as e:
            pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", username="root", password="nope", **tls).admin.command("ping")
        assert e.value.code == 18

        # An X.509 user, created through the router on $external: the client certificate's
        # subject logs in, and reads but cannot write.
        c["$external"].command("createUser", "CN=ann,OU=clients,O=shoal", roles=[{"role": "read", "db": "app"}])
        ann = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", authMechanism="MONGODB-X509", **tls)
        assert ann.app.t.count_documents({}) == 50
        with pytest.raises(OperationFailure) as e:
            ann.app.t.insert_one({"k": -1})
        assert e.value.code == 13
        assert ann.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == [{"user": "CN=ann,OU=clients,O=shoal", "db": "$external"}]
    finally:
        down(shoal_bin, root)
