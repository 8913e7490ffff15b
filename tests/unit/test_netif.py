"""Which address and interface a worker uses: env, then network_mask, then the route to the driver, then Spark's
address; gloo/NCCL get the chosen interface; host identity comes from the address and the network namespace."""

from __future__ import annotations

import os
import socket

import pytest

from torchspark.errors import SetupError
from torchspark.spark.barrier import _store_address
from torchspark.training.comm.shm import host_id
from torchspark.training.config.mesh import MeshConfig
from torchspark.training.rendezvous.netif import (
    choose_endpoint,
    host_identity,
    interface_addresses,
    interface_of,
    route_address,
    socket_interface,
)

# a multi-homed host whose hostname resolves to loopback: a decoy first, the cluster network second
HOST = {"lo": ["127.0.0.1"], "eth0": ["198.19.1.11"], "eth1": ["198.18.1.11", "198.18.2.11"]}


def _route_via(address: str | None):
    return lambda target: address


def test_route_to_the_driver_picks_the_interface_that_reaches_it() -> None:
    got = choose_endpoint("198.18.1.1", "127.0.1.1", env={}, interfaces=HOST, route=_route_via("198.18.1.11"))
    assert (got.address, got.interface, got.source) == ("198.18.1.11", "eth1", "route_to_driver")


def test_spark_address_when_the_driver_is_unreachable_or_unknown() -> None:
    got = choose_endpoint("10.9.9.9", "198.19.1.11", env={}, interfaces=HOST, route=_route_via(None))
    assert (got.address, got.interface, got.source) == ("198.19.1.11", "eth0", "spark")
    got = choose_endpoint(None, "10.0.0.7", env={}, interfaces=HOST, route=_route_via("198.18.1.11"))
    assert (got.address, got.interface, got.source) == ("10.0.0.7", None, "spark")


def test_network_mask_wins_over_the_route_and_covers_secondary_addresses() -> None:
    got = choose_endpoint("198.18.1.1", "x", "198.18.2.0/24", env={}, interfaces=HOST, route=_route_via("198.18.1.11"))
    assert (got.address, got.interface, got.source) == ("198.18.2.11", "eth1", "network_mask")
    got = choose_endpoint("198.18.1.1", "x", "198.19.0.0/16", env={}, interfaces=HOST, route=_route_via("198.18.1.11"))
    assert (got.address, got.interface) == ("198.19.1.11", "eth0")
    with pytest.raises(SetupError, match=r"network_mask='10.0.0.0/8'.*TORCHSPARK_LOCAL_IP"):
        choose_endpoint("198.18.1.1", "x", "10.0.0.0/8", env={}, interfaces=HOST, route=_route_via("198.18.1.11"))


def test_env_override_wins_over_everything() -> None:
    env = {"TORCHSPARK_LOCAL_IP": "198.18.2.11"}
    got = choose_endpoint("198.18.1.1", "x", "198.19.0.0/16", env=env, interfaces=HOST, route=_route_via("198.18.1.11"))
    assert (got.address, got.interface, got.source) == ("198.18.2.11", "eth1", "env")
    nat = choose_endpoint("198.18.1.1", "x", env={"TORCHSPARK_LOCAL_IP": "203.0.113.5"}, interfaces=HOST)
    assert (nat.address, nat.interface) == ("203.0.113.5", None)  # not local: gloo keeps its own choice


def test_controller_address_is_what_worker_zeros_store_advertises() -> None:
    routed = choose_endpoint("198.18.1.1", "x", env={}, interfaces=HOST, route=_route_via("198.18.1.11"))
    mesh = MeshConfig(controller_address="203.0.113.9")
    assert _store_address(routed, mesh) == "203.0.113.9"
    assert _store_address(routed, MeshConfig()) == "198.18.1.11"
    forced = choose_endpoint("198.18.1.1", "x", env={"TORCHSPARK_LOCAL_IP": "198.18.2.11"}, interfaces=HOST)
    assert _store_address(forced, mesh) == "198.18.2.11"  # the executor's own override wins


def test_this_machine_interfaces_and_route() -> None:
    found = interface_addresses()
    assert "127.0.0.1" in found.get("lo", [])
    assert interface_of("127.0.0.1") == "lo" and interface_of("203.0.113.77") is None
    assert route_address("127.0.0.1") == "127.0.0.1"


def test_socket_interface_sets_gloo_and_nccl_then_restores() -> None:
    env: dict[str, str] = {"NCCL_SOCKET_IFNAME": "ib0"}  # the user's own choice is kept
    with socket_interface("eth1", env) as in_effect:
        assert in_effect == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "ib0"}
        assert env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert env == {"NCCL_SOCKET_IFNAME": "ib0"}
    with socket_interface(None, env) as in_effect:
        assert "GLOO_SOCKET_IFNAME" not in env and in_effect == {"NCCL_SOCKET_IFNAME": "ib0"}


def test_host_identity_separates_addresses_and_network_namespaces() -> None:
    assert host_identity("198.18.1.11") == host_identity("198.18.1.11") == host_id("198.18.1.11")
    assert host_identity("198.18.1.11") != host_identity("198.18.1.12")  # two namespaces share /dev/shm
    assert host_identity(None).startswith(socket.gethostname() + "|")
    assert os.readlink("/proc/self/ns/net") in host_identity("127.0.0.1")
