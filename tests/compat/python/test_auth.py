"""pymongo's SCRAM against a server started with --auth: the localhost exception, both
mechanisms, wrong passwords and missing privileges refused with MongoDB's codes."""

import subprocess

import pymongo
import pytest
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError

from conftest import REPO, ShoalServer


@pytest.fixture
def auth_server(shoal_bin):
    s = ShoalServer(shoal_bin, ["--auth"]).start()
    yield s
    s.close()


def connect(server, user=None, pwd=None, **kw):
    if user is None:
        return pymongo.MongoClient(server.uri, serverSelectionTimeoutMS=5000)
    return pymongo.MongoClient(server.uri, username=user, password=pwd, serverSelectionTimeoutMS=5000, **kw)


def test_pymongo_authenticates_and_roles_are_enforced(auth_server):
    anon = connect(auth_server)
    with pytest.raises(OperationFailure) as e:
        anon.app.c.find_one()
    assert e.value.code == 13
    anon.admin.command("createUser", "root", pwd="rootpw", roles=["root"])
    with pytest.raises(OperationFailure) as e:
        anon.admin.command("createUser", "other", pwd="x", roles=["root"])
    assert e.value.code == 13

    root = connect(auth_server, "root", "rootpw")
    root.app.c.insert_one({"_id": 1})
    root.app.command("createUser", "ann", pwd="annpw", roles=["readWrite"])
    root.app.command("createUser", "rita", pwd="ritapw", roles=[{"role": "read", "db": "app"}], mechanisms=["SCRAM-SHA-1"])

    for mechanism in ["DEFAULT", "SCRAM-SHA-256", "SCRAM-SHA-1"]:
        ann = connect(auth_server, "ann", "annpw", authSource="app", authMechanism=mechanism)
        ann.app.c.insert_one({"mechanism": mechanism})
        status = ann.app.command("connectionStatus")
        assert status["authInfo"]["authenticatedUsers"] == [{"user": "ann", "db": "app"}]
        ann.close()

    rita = connect(auth_server, "rita", "ritapw", authSource="app")
    assert rita.app.c.count_documents({}) == 4
    with pytest.raises(OperationFailure) as e:
        rita.app.c.insert_one({"_id": 2})
    assert e.value.code == 13
    assert "not authorized on app" in str(e.value)

    with pytest.raises(OperationFailure) as e:
        connect(auth_server, "ann", "wrong", authSource="app").app.command("ping")
    assert e.value.code == 18
    assert e.value.details["codeName"] == "AuthenticationFailed"

    users = root.app.command("usersInfo", 1)["users"]
    assert [u["user"] for u in users] == ["ann", "rita"]
    assert users[1]["mechanisms"] == ["SCRAM-SHA-1"]
    assert all("credentials" not in u for u in users)
    assert root.app.command("dropAllUsersFromDatabase")["n"] == 2


def test_pymongo_uses_scram_sha_256_over_tls_and_plaintext_is_refused(shoal_bin, tmp_path):
    subprocess.run(["bash", str(REPO / "tests" / "compat" / "make_test_certs.sh"), str(tmp_path)], check=True)
    ca, pem = str(tmp_path / "ca.pem"), str(tmp_path / "server.pem")
    s = ShoalServer(shoal_bin, ["--auth", "--tlsMode", "requireTLS", "--tlsCertificateKeyFile", pem]).start()
    try:
        anon = pymongo.MongoClient(s.uri, tls=True, tlsCAFile=ca, serverSelectionTimeoutMS=5000)
        anon.admin.command("createUser", "root", pwd="rootpw", roles=["root"])
        root = pymongo.MongoClient(s.uri, tls=True, tlsCAFile=ca, username="root", password="rootpw", authMechanism="SCRAM-SHA-256")
        root.app.c.insert_one({"_id": 1})
        assert root.app.c.find_one() == {"_id": 1}
        assert root.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == [{"user": "root", "db": "admin"}]
        with pytest.raises(ServerSelectionTimeoutError):
            pymongo.MongoClient(s.uri, username="root", password="rootpw", serverSelectionTimeoutMS=1000).admin.command("ping")
        with pytest.raises(OperationFailure) as e:
            pymongo.MongoClient(s.uri, tls=True, tlsCAFile=ca, username="root", password="nope").admin.command("ping")
        assert e.value.code == 18
    finally:
        s.close()


def test_pymongo_manages_user_defined_roles(auth_server):
    anon = connect(auth_server)
    anon.admin.command("createUser", "root", pwd="rootpw", roles=["root"])
    root = connect(auth_server, "root", "rootpw")
    root.app.c.insert_one({"_id": 1})
    root.app.command("createRole", "countC", privileges=[{"resource": {"db": "app", "collection": "c"}, "actions": ["find"]}], roles=[])
    with pytest.raises(OperationFailure) as e:
        root.app.command("createRole", "countC", privileges=[], roles=[])
    assert e.value.code == 51002
    root.app.command("createUser", "cara", pwd="carapw", roles=["countC"])
    cara = connect(auth_server, "cara", "carapw", authSource="app")
    assert cara.app.c.count_documents({}) == 1
    with pytest.raises(OperationFailure) as e:
        cara.app.c.insert_one({"_id": 2})
    assert e.value.code == 13
    info = root.app.command("rolesInfo", "countC", showPrivileges=True)["roles"][0]
    assert (info["role"], info["db"], info["isBuiltin"]) == ("countC", "app", False)
    assert info["privileges"] == [{"resource": {"db": "app", "collection": "c"}, "actions": ["find"]}]
    root.app.command("dropRole", "countC")
    with pytest.raises(OperationFailure) as e:
        cara.app.c.count_documents({})
    assert e.value.code == 13
    assert root.app.command("rolesInfo", 1)["roles"] == []
