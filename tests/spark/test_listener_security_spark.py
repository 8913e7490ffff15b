"""Strangers on the machine cannot steer a local[2] fit through the listeners it opens, and a fit's task leaves no
environment variable behind on the reused Python workers. Real Spark, real sockets, a real stranger thread."""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from helpers import mlp_net, uniform_data
from torchspark import DataSet, Network
from torchspark.errors import WorkerError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork
from torchspark.training.progress import ProgressServer
from torchspark.training.rendezvous import auth

PLANTED = "RuntimeError: planted by a stranger"
FAKE_ERROR = (
    json.dumps({"kind": "error", "rank": 0, "traceback": f"Traceback (most recent call last):\n{PLANTED}"}).encode()
    + b"\n"
)
BOGUS_ADDRESS = "127.0.0.1:9"  # worker 1 would dial this if it followed the stranger


def _listening_ports_of_this_process() -> set[int]:
    """TCP ports this (driver) process listens on, from /proc: what a stranger on the machine can find too."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _wildcard_listeners(pids: set[int]) -> set[tuple[int, int]]:
    """``(pid, port)`` of every socket of ``pids`` listening on all interfaces (0.0.0.0 or ::)."""
    wildcard: dict[str, int] = {}
    for table, any_addr in (("/proc/net/tcp", "00000000"), ("/proc/net/tcp6", "0" * 32)):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                fields = row.split()
                addr, port = fields[1].rsplit(":", 1)
                if fields[3] == "0A" and addr == any_addr:
                    wildcard[fields[9]] = int(port, 16)
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in wildcard:
                found.add((pid, wildcard[link[8:-1]]))
    return found


class Stranger:
    """Watches for listeners the driver opens during a fit and attacks each at once: a ``TCPStore`` gets the
    rendezvous key the relay used to read set to a bogus address, again and again until the fit ends (attack a); anything else gets fake
    ``{"kind": "error"}`` lines (attack b)."""

    def __init__(self) -> None:
        self._baseline = _listening_ports_of_this_process()
        self._wildcard_before = _wildcard_listeners(_descendants(os.getpid()))
        #: sockets of this process or its descendants (JVM, Python workers) that began listening on every
        #: interface during the attack
        self.wildcard: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.attacked: dict[int, str] = {}
        self._threads: list[threading.Thread] = []
        self._watcher = threading.Thread(target=self._watch, name="stranger-watch", daemon=True)

    def __enter__(self) -> Stranger:
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._watcher.join(10)
        for t in self._threads:
            t.join(10)

    def kinds(self) -> set[str]:
        with self._lock:
            return set(self.attacked.values())

    def _watch(self) -> None:
        rounds = 0
        while not self._stop.wait(0.005):
            rounds += 1
            if rounds % 10 == 0:
                self.wildcard |= _wildcard_listeners(_descendants(os.getpid())) - self._wildcard_before
            for port in _listening_ports_of_this_process() - self._baseline:
                with self._lock:
                    if port in self.attacked:
                        continue
                    self.attacked[port] = "pending"
                t = threading.Thread(target=self._attack, args=(port,), name=f"stranger-{port}", daemon=True)
                self._threads.append(t)
                t.start()

    def _attack(self, port: int) -> None:
        """At once, on two threads: the fake error lines (attack b: a connection the moment the port listens, so a
        short fit cannot close it first), and a ``TCPStore`` client (attack a: only a real store answers it; the
        driver has none since the relay became torchspark's own authenticated store)."""
        is_store = threading.Event()

        def try_store() -> None:
            try:
                store = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=datetime.timedelta(seconds=2))
                store.set("torchspark/store", BOGUS_ADDRESS)
                store.num_keys()  # only a real store answers
                is_store.set()
                while not self._stop.wait(0.002):  # keep the key pointing at the bogus address all fit long
                    store.set("torchspark/store", BOGUS_ADDRESS)
            except Exception:  # noqa: BLE001 - not a store
                pass

        attempt = threading.Thread(target=try_store, name=f"stranger-store-{port}", daemon=True)
        attempt.start()
        kind = "progress"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(FAKE_ERROR * 5)
        except OSError:
            kind = "unreachable"
        attempt.join(30)
        with self._lock:
            self.attacked[port] = "store" if is_store.is_set() else kind


def _fit(spark: Any, sc: Any, shards: list[DataSet]) -> Network:
    net = mlp_net(64, 16, 10)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8,
        num_workers=2,
        averaging_frequency=2,
        rdd_training_approach="direct",
        repartition="never",
        rendezvous_timeout_s=60,
    )
    SparkNetwork(spark, net, master, progress=False).fit(sc.parallelize(shards, 2), epochs=2)
    return net


def test_a_strangers_relay_key_and_fake_errors_do_not_change_the_fit(spark, sc, caplog) -> None:
    """Attacks (a) and (b) during a successful fit: same parameters as the undisturbed fit, nothing logged."""
    caplog.set_level(logging.WARNING)
    shards = [uniform_data(32, seed=1), uniform_data(32, seed=2)]
    undisturbed = _fit(spark, sc, shards)
    with Stranger() as stranger:
        disturbed = _fit(spark, sc, shards)
    # the relay (our own authenticated store now, no TCPStore on the driver) and the progress server
    assert len(stranger.attacked) >= 2 and "progress" in stranger.kinds(), stranger.attacked
    torch.testing.assert_close(disturbed.params(), undisturbed.params(), rtol=0, atol=0)
    assert not stranger.wildcard, f"listening on every interface during the fit: {stranger.wildcard}"
    assert PLANTED not in caplog.text


def test_a_strangers_fake_error_is_not_the_root_cause_of_a_failed_fit(spark, sc, caplog, monkeypatch) -> None:
    """Attack (b) during a fit that really fails: the error names the worker's own failure, and the stranger's
    lines were never read (not logged, not kept). The stranger attacks each progress server as soon as it listens,
    before any worker can fail (so the test never depends on who is faster), twice: with no hello, and with a
    hello captured from another connection (a replay: the server's challenge differs per connection)."""
    caplog.set_level(logging.WARNING)
    attacked: list[int] = []
    real_start = ProgressServer.start

    def start_then_attack(server: ProgressServer) -> ProgressServer:
        real_start(server)
        captured = auth.hello(server.token, auth.new_nonce())  # valid for some other connection's challenge
        for first in (b"", captured):
            with socket.create_connection(server.bound_address, timeout=10) as sock:
                sock.sendall(first + FAKE_ERROR * 5)
        deadline = time.monotonic() + 30
        while server.rejected_count() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        attacked.append(server.rejected_count())
        return server

    monkeypatch.setattr(ProgressServer, "start", start_then_attack)
    x = torch.rand(32, 1, 8, 8)
    x[13] = float("nan")  # a later minibatch of worker 1: the driver's first-minibatch check passes
    poisoned = DataSet(x, torch.zeros(32, dtype=torch.long))
    with pytest.raises(WorkerError) as info:
        _fit(spark, sc, [uniform_data(32, seed=1), poisoned])
    assert attacked and all(n >= 2 for n in attacked), attacked  # both strangers were dropped before training
    assert "NaN at example" in str(info.value)
    assert PLANTED not in str(info.value) and PLANTED not in caplog.text
    assert sc.parallelize(range(4), 2).sum() == 6


def _worker_env(sc: Any, setting: str | None = None, unset: bool = False) -> dict[int, str | None]:
    """``{pid: GLOO_SOCKET_IFNAME}`` on both Python workers (a barrier stage runs both at once), after optionally
    setting (or unsetting) the variable there."""

    def probe(_: Any) -> Any:
        if unset:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        elif setting is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = setting
        yield os.getpid(), os.environ.get("GLOO_SOCKET_IFNAME")

    return dict(sc.parallelize(range(2), 2).barrier().mapPartitions(probe).collect())


@pytest.mark.parametrize("before", [None, ""], ids=["unset", "empty"])
def test_a_fit_leaves_no_environment_variable_on_reused_workers(spark, sc, before: str | None) -> None:
    """The fit's tasks set GLOO_SOCKET_IFNAME=lo (their peers talk over loopback); the Python workers they ran on
    are reused by the next job, which must see the variable as it was before the fit."""
    pre = _worker_env(sc, setting=before, unset=before is None)
    assert set(pre.values()) == {before}
    _fit(spark, sc, [uniform_data(32, seed=1), uniform_data(32, seed=2)])
    post = _worker_env(sc)
    assert set(post) & set(pre), "the Python workers were not reused; the check would prove nothing"
    assert post == {pid: before for pid in post}
    # a second fit on the same workers trains and cleans up too
    _fit(spark, sc, [uniform_data(32, seed=3), uniform_data(32, seed=4)])
    assert _worker_env(sc) == {pid: before for pid in _worker_env(sc)}
