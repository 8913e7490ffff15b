"""The namespace cluster through a Spark Connect server started on it, with the client outside the worker hosts.

The server (``SparkConnectServer`` with ``--master spark://198.18.X.1:...``, :meth:`NetnsCluster.start_connect_server`)
is the cluster's driver in the root namespace; the client (:mod:`_connect_client`) runs in a namespace of its own
that reaches the server's port and nothing else, and that no worker host can route to
(:class:`cluster_connect.ClientNamespace`). Both masters train with ``SparkNetwork(...).fit(DataFrame)`` through
``sc://198.18.X.1:<port>`` and evaluate on the result. Checks: the parameters equal ``ParallelWrapper``'s for the same
seed and data (to 1e-6; tests/spark/test_parallel_equivalence.py shows that is the classic route's result), the
workers ran on the worker hosts, and the cluster's evaluation equals the client's local one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from cluster_connect import ClientNamespace
from cluster_harness import NetnsCluster, unavailable_reason

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _connect_client as client_script  # noqa: E402

from torchspark.parallel import ParallelWrapper  # noqa: E402

MODES = ("averaging", "sharing")


@pytest.fixture(scope="module")
def connect_runs(netns_cluster, tmp_path_factory):
    """Run both fits from the client namespace once; (what it wrote per mode, the client namespace's facts)."""
    out = tmp_path_factory.mktemp("connect-cluster")
    os.chmod(out, 0o777)
    server = netns_cluster.start_connect_server()
    try:
        with ClientNamespace(netns_cluster) as client:
            port = int(server.url.rsplit(":", 1)[1])
            master_port = int(netns_cluster.master_url.rsplit(":", 1)[1])
            facts = {
                "url": server.url,
                "reaches_server": client.reaches(netns_cluster.bridge_ip, port),
                "reaches_worker": client.reaches(netns_cluster.hosts[0].address, master_port),
                "worker_reaches_client": _worker_connects(netns_cluster, client.address),
            }
            client.run_python([client_script.__file__, str(out), server.url, *MODES], timeout_s=900)
    finally:
        server.stop()
    runs = {}
    for mode in MODES:
        with open(out / f"{mode}.json") as f:
            runs[mode] = {"report": json.load(f), "tensors": load_file(str(out / f"{mode}.safetensors"))}
    return runs, facts


def _worker_connects(cluster, address: str) -> str:
    """What a TCP connection from the first worker host to ``address`` gives (a closed port answers
    "refused" when it is reachable at all; an unreachable address fails otherwise)."""
    probe = (
        "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], 9), timeout=2).close(); print('ok')\n"
        "except OSError as e: print(type(e).__name__, e)"
    )
    return cluster.exec_in(cluster.hosts[0], sys.executable, "-c", probe, address).stdout.strip()


def test_client_reaches_only_the_connect_server(connect_runs) -> None:
    _, facts = connect_runs
    assert facts["url"].startswith("sc://198.18.")
    assert facts["reaches_server"]
    assert not facts["reaches_worker"]
    # not "ConnectionRefusedError": the worker cannot even reach the client's address
    assert "Refused" not in facts["worker_reaches_client"] and facts["worker_reaches_client"] != "ok"


@pytest.mark.parametrize("mode", MODES)
def test_workers_ran_on_the_worker_hosts(netns_cluster, connect_runs, mode) -> None:
    report = connect_runs[0][mode]["report"]
    hostnames = sorted(h.hostname for h in netns_cluster.hosts)
    assert sorted(w["address"] for w in report["workers"]) == sorted(h.address for h in netns_cluster.hosts)
    assert sorted(w["executor"].split(":", 1)[0] for w in report["workers"]) == hostnames  # one worker per host
    assert sorted(e.split(":", 1)[0] for e in report["summary_executors"].values()) == hostnames
    half = len(client_script.data()) * client_script.EPOCHS // 2
    assert [w["examples"] for w in report["workers"]] == [half, half]
    assert report["progress_channel"] is False  # a remote server: the route falls back to no progress channel


@pytest.mark.parametrize("mode", MODES)
def test_parameters_equal_parallel_wrappers(connect_runs, mode) -> None:
    tensors = connect_runs[0][mode]["tensors"]
    rng_seed, own = client_script.settings(mode)
    local = client_script.network()
    wrapper = ParallelWrapper(
        local, num_workers=2, training_mode=mode, rng_seed=rng_seed, threads_per_worker=1, progress=False, **own
    )
    wrapper.fit(client_script.data(), epochs=client_script.EPOCHS, batch_size=client_script.BATCH)
    torch.testing.assert_close(tensors["params"], local.params(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(tensors["updater"], local.updater_state(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_evaluation_on_the_cluster_equals_local(connect_runs, mode) -> None:
    report = connect_runs[0][mode]["report"]
    assert report["cluster_confusion"] == report["local_confusion"]
    assert report["cluster_accuracy"] == report["local_accuracy"] > 0.5


def test_cluster_teardown_removes_a_client_namespace_left_open() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"multi-host namespace cluster unavailable: {reason}")
    with NetnsCluster(workers=1, with_spark=False) as cluster:
        client = ClientNamespace(cluster).start()  # never stopped: the cluster's teardown must take it
        name = client.netns
        assert name in _listed()
    assert name not in _listed()
    assert name not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    client.stop()  # idempotent after the teardown


def _listed() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
