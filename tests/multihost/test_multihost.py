"""Both masters train on a real multi-host Spark cluster (network namespaces, hostnames that resolve to
loopback, a decoy interface listed first) -- parameter averaging with no network settings at all, gradient
sharing with ``network_mask`` -- and give the same parameters as on ``local[2]`` for the same seed and data.

One driver process (:mod:`_driver`) runs every scenario on the cluster; the tests below read what it wrote. The
``local[2]`` reference runs in the suite's own session. Tolerance: with two workers every sum is ``a + b`` (float
addition commutes, so gloo's ring and the shared-memory sum give the same bits), averaging divides by two exactly,
and each worker trains with one torch thread on both sides; the same floating-point operations run in the same
order, so the comparison uses 1e-6 only to allow for a different BLAS code path on another CPU.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _scenario import build, parse  # noqa: E402

from torchspark.spark import SparkNetwork  # noqa: E402

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_driver.py")
PORTS = (45000, 45040)


def _scenarios(cluster) -> list[str]:
    """Two fits keep the module fast: averaging with no network settings (plus a port range, which does not
    change the address choice), gradient sharing with ``network_mask`` set to the bridge network."""
    mask = cluster.bridge_ip.rsplit(".", 1)[0] + ".0/24"
    return [f"avg:averaging,port_range={PORTS[0]}-{PORTS[1]}", f"shr:sharing,network_mask={mask}"]


#: the module's fixture runs every scenario on the namespace cluster first (its own limit is 900 s)
pytestmark = pytest.mark.timeout(1800)

#: which rule each scenario's workers should have used
SOURCES = {"avg": "route_to_driver", "shr": "network_mask"}


@pytest.fixture(scope="module")
def cluster_runs(netns_cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("multihost")
    os.chmod(out, 0o755)
    netns_cluster.run_driver([DRIVER, str(out), *_scenarios(netns_cluster)], timeout_s=900)
    runs = {}
    for spec in _scenarios(netns_cluster):
        name = spec.split(":", 1)[0]
        with open(out / f"{name}.json") as f:
            runs[name] = {"spec": spec, "workers": json.load(f), "tensors": load_file(str(out / f"{name}.safetensors"))}
    return runs


def _on_local(spark, spec: str) -> dict[str, torch.Tensor]:
    _, kind, _ = parse(spec)
    net, master, data = build(kind, {})
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(spark.sparkContext.parallelize(data, 2), epochs=1)
    spark_net.delete_temp_files()
    assert all(r.network["shared_memory"] for r in spark_net.last_results)  # local[2]: one host, /dev/shm
    return {"params": net.params(), "updater": net.updater_state()}


@pytest.mark.parametrize("name", ["avg", "shr"])
def test_workers_advertise_the_bridge_interface_not_the_decoy(netns_cluster, cluster_runs, name) -> None:
    workers = cluster_runs[name]["workers"]
    by_address = {h.address: h for h in netns_cluster.hosts}
    assert sorted(w["network"]["address"] for w in workers) == sorted(by_address)  # one worker per host
    for w in workers:
        host = by_address[w["network"]["address"]]
        assert w["network"]["source"] == SOURCES[name]
        assert w["network"]["interface"] == w["network"]["socket_ifname"] == host.interface  # not the decoy eth0
        assert w["threads"] == 1  # spark.task.cpus
    assert {w["network"]["store"] for w in workers} == {
        f"{workers[0]['network']['address']}:" + workers[0]["network"]["store"].rsplit(":", 1)[1]
    }


@pytest.mark.parametrize("name", ["avg", "shr"])
def test_exchange_goes_over_gloo_between_namespaces_sharing_dev_shm(cluster_runs, name) -> None:
    assert [w["network"]["shared_memory"] for w in cluster_runs[name]["workers"]] == [False, False]


@pytest.mark.parametrize("name", ["avg", "shr"])
def test_cluster_gives_the_parameters_of_local_2(spark, cluster_runs, name) -> None:
    local = _on_local(spark, cluster_runs[name]["spec"])
    for key in ("params", "updater"):
        torch.testing.assert_close(cluster_runs[name]["tensors"][key], local[key], atol=1e-6, rtol=1e-6)


def test_worker_zeros_store_listens_inside_port_range(cluster_runs) -> None:
    port = int(cluster_runs["avg"]["workers"][0]["network"]["store"].rsplit(":", 1)[1])
    assert PORTS[0] <= port <= PORTS[1]
