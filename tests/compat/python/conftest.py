"""Fixtures: one shoal server per pytest session (fresh dbpath), one database per test."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pymongo
import pytest

READY_TIMEOUT_S = 20
REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(n: int) -> int:
    """The first of `n` consecutive free loopback ports (a cluster's: router, config servers,
    shards), below the kernel's ephemeral range (32768 and up), where a client connection's
    own end may otherwise take one of them between this check and the cluster's start."""
    import random

    for _ in range(200):
        first = random.randrange(22000, 32700 - n)
        socks = []
        try:
            for p in range(first, first + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports below 32700")


class ShoalServer:
    """The real binary on a free loopback port with its own temp dbpath."""

    def __init__(self, binary: str, extra_args=()):
        self.binary = binary
        self.extra_args = list(extra_args)
        self.root = Path(tempfile.mkdtemp(prefix="shoal-pytest-"))
        self.dbpath = self.root / "db"
        self.dbpath.mkdir()
        self.proc = None
        self.port = None
        self.starts = 0

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/"

    def stderr_tail(self) -> str:
        path = self.root / f"stderr-{self.starts - 1}.log"
        try:
            return path.read_text(errors="replace")[-8000:]
        except OSError:
            return "<no stderr>"

    def start(self, port=None):
        for _attempt in range(3):
            self.port = port or free_port()
            port = None
            log = open(self.root / f"stderr-{self.starts}.log", "wb")
            self.starts += 1
            self.proc = subprocess.Popen(
                [self.binary, "serve", "--port", str(self.port), "--bind_ip", "127.0.0.1", "--dbpath", str(self.dbpath), *self.extra_args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                    return self
                except OSError:
                    time.sleep(0.025)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"shoal not ready in {READY_TIMEOUT_S}s:\n{self.stderr_tail()}")
        raise RuntimeError(f"shoal exited at start:\n{self.stderr_tail()}")

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def restart(self):
        self.kill9()
        self.start(self.port)

    def close(self, keep=False):
        self.kill9()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def shoal_bin() -> str:
    path = os.environ.get("SHOAL_BIN") or str(REPO / "target" / "debug" / "shoal")
    if not os.access(path, os.X_OK):
        pytest.fail(f"shoal binary not found at {path}: build it or set SHOAL_BIN")
    return path


@pytest.fixture(scope="session")
def server(shoal_bin):
    s = ShoalServer(shoal_bin).start()
    yield s
    s.close()


@pytest.fixture
def own_server(shoal_bin):
    """A private server for tests that restart or kill it."""
    s = ShoalServer(shoal_bin).start()
    yield s
    s.close()


@pytest.fixture
def replset_server(shoal_bin):
    """A private server started with --replSet rs0, not yet initiated."""
    s = ShoalServer(shoal_bin, ["--replSet", "rs0"]).start()
    yield s
    s.close()


@pytest.fixture
def three_members(shoal_bin):
    """A three-member set with short election timeouts; yields the servers."""
    servers = [ShoalServer(shoal_bin, extra_args=("--replSet", "rs0")) for _ in range(3)]
    for s in servers:
        s.start()
    direct = pymongo.MongoClient(servers[0].uri, directConnection=True)
    direct.admin.command(
        "replSetInitiate",
        {
            "_id": "rs0",
            "version": 1,
            "settings": {"electionTimeoutMillis": 1000, "heartbeatIntervalMillis": 200},
            "members": [{"_id": i, "host": f"127.0.0.1:{s.port}"} for i, s in enumerate(servers)],
        },
    )
    direct.close()
    yield servers
    for s in servers:
        s.close()


@pytest.fixture(scope="session")
def client(server):
    c = pymongo.MongoClient(server.uri)
    yield c
    c.close()


@pytest.fixture
def db(client, request):
    name = "py_" + re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:50]
    client.drop_database(name)
    yield client[name]
    client.drop_database(name)
