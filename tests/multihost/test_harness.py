"""The namespace cluster is what it claims: separate hosts with their own addresses, a hostname that resolves to
loopback, a decoy interface listed first, workers registered from their own address, and a full teardown."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cluster_harness import NetnsCluster, unavailable_reason


def test_hosts_look_like_a_misconfigured_multi_homed_cluster(netns_cluster) -> None:
    state = netns_cluster.master_state()
    alive = sorted(w["host"] for w in state["workers"] if w["state"] == "ALIVE")
    assert alive == sorted(h.address for h in netns_cluster.hosts)
    for host in netns_cluster.hosts:
        resolved = netns_cluster.exec_in(host, "getent", "hosts", host.hostname).stdout.split()
        assert resolved[:1] == ["127.0.1.1"], resolved  # the trap: the hostname means loopback
        assert netns_cluster.exec_in(host, "hostname").stdout.strip() == host.hostname
        links = netns_cluster.exec_in(host, "ip", "-o", "-4", "addr", "show").stdout
        assert links.index(host.decoy_address) < links.index(host.address)  # the decoy comes first
    a, b = netns_cluster.hosts[:2]
    ui_port = next(w["webuiaddress"] for w in state["workers"] if w["host"] == b.address).rsplit(":", 1)[1]
    assert _connect(netns_cluster, a, b.address, ui_port) == "ok"  # b's worker UI, from a
    assert _connect(netns_cluster, a, b.decoy_address, ui_port) != "ok"  # the decoy leads nowhere


def _connect(cluster, host, address: str, port: str) -> str:
    code = (
        f"import socket\ntry:\n socket.create_connection(('{address}', {port}), timeout=2); print('ok')\n"
        "except OSError as e:\n print(e)"
    )
    return cluster.exec_in(host, sys.executable, "-c", code).stdout.strip()


def test_teardown_removes_every_object() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with pytest.raises(RuntimeError, match="boom"):
        with NetnsCluster(workers=2, with_spark=False) as cluster:
            names = [h.netns for h in cluster.hosts]
            assert set(names) <= set(
                subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            )
            raise RuntimeError("boom")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not set(names) & set(listed)
    assert cluster.bridge not in links and all(h.root_veth not in links for h in cluster.hosts)
    assert not any(os.path.exists(f"/etc/netns/{n}") for n in names)
