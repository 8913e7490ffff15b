"""Which local address and interface a worker uses to talk to its peers, and which workers share a host.

A worker's hostname is a poor guide on real clusters: many hosts map it to loopback (Debian's ``127.0.1.1``
entry), and multi-homed hosts (YARN, EC2, Kubernetes nodes) have several interfaces of which only one reaches
the other executors. Gloo, left alone, advertises whatever the hostname resolves to, so peers dial
``127.0.1.1`` and the fit fails with ``Connection refused``. torchspark therefore picks one address per worker
(`choose_endpoint`), in this order:

1. ``TORCHSPARK_LOCAL_IP`` in the executor's environment (DL4J's ``DL4J_VOID_IP``);
2. the local address inside ``network_mask`` (the mesh option);
3. the address this host uses to reach the driver (a UDP ``connect`` to the driver's host, no packet sent):
   the interface that reaches the driver is the one that reaches the other executors on almost every cluster;
4. the executor address Spark reports for the task.

The same address is what worker 0's store listens on, and its interface is handed to gloo and NCCL
(``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``, `socket_interface`) unless the user set those.

Host identity (`host_identity`) for the shared-memory exchange comes from that address plus the network
namespace and boot id, not from a shared directory: containers and network namespaces on one machine often
share ``/dev/shm`` while being different hosts to the network.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct
import subprocess
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass

from torchspark.errors import SetupError

__all__ = [
    "LOCAL_ADDRESS_ENV",
    "SOCKET_IFNAME_ENVS",
    "Endpoint",
    "choose_endpoint",
    "interface_addresses",
    "interface_of",
    "route_address",
    "host_identity",
    "socket_interface",
]

log = logging.getLogger(__name__)

#: Overrides the address a worker advertises to its peers (DL4J's ``DL4J_VOID_IP``).
LOCAL_ADDRESS_ENV = "TORCHSPARK_LOCAL_IP"
#: The variables through which gloo and NCCL learn which interface to use.
SOCKET_IFNAME_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Endpoint:
    """Where one worker talks to its peers.

    Attributes:
        address: the IPv4 address it advertises (worker 0's store listens on it).
        interface: the local interface carrying ``address``; None when it is not a local address (e.g. a NAT
            address from ``TORCHSPARK_LOCAL_IP``), in which case gloo/NCCL keep their own choice.
        source: which rule chose it: ``"env"``, ``"network_mask"``, ``"route_to_driver"`` or ``"spark"``.
    """

    address: str
    interface: str | None
    source: str


def _ioctl_addresses() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
            except OSError:  # no IPv4 address on this interface
                continue
            found.setdefault(name, []).append(socket.inet_ntoa(raw[20:24]))
    return found


def _ip_command_addresses() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return found
    for line in out.splitlines():  # "2: eth1    inet 10.0.0.5/24 brd ... scope global eth1\ ..."
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            found.setdefault(fields[1].split("@")[0], []).append(fields[3].split("/")[0])
    return found


def interface_addresses() -> dict[str, list[str]]:
    """Every local interface's IPv4 addresses, in the kernel's interface order (Linux; ``{}`` elsewhere).

    The primary address of each interface comes from ``SIOCGIFADDR``; secondary ones from ``ip -o -4 addr`` when
    iproute2 is installed.
    """
    merged: dict[str, list[str]] = {}
    try:
        merged = _ioctl_addresses()
    except (OSError, AttributeError):  # not Linux
        pass
    for name, addrs in _ip_command_addresses().items():
        bucket = merged.setdefault(name, [])
        bucket.extend(a for a in addrs if a not in bucket)
    return merged


def interface_of(address: str, interfaces: Mapping[str, list[str]] | None = None) -> str | None:
    """The local interface that carries ``address``, or None when no local interface has it."""
    interfaces = interface_addresses() if interfaces is None else interfaces
    for name, addrs in interfaces.items():
        if address in addrs:
            return name
    return None


def route_address(target_host: str) -> str | None:
    """The local address the kernel would use to reach ``target_host`` (a UDP connect: no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target_host, 9))
            return str(s.getsockname()[0])
    except OSError as e:
        log.debug("no route to %s: %s", target_host, e)
        return None


def choose_endpoint(
    driver_host: str | None,
    spark_host: str,
    network_mask: str | None = None,
    env: Mapping[str, str] | None = None,
    interfaces: Mapping[str, list[str]] | None = None,
    route: Callable[[str], str | None] = route_address,
) -> Endpoint:
    """This worker's `Endpoint` by the rules in the module docstring.

    Args:
        driver_host: the host executors reach the driver with (``spark.driver.host``); None skips rule 3.
        spark_host: the executor address Spark reports for this task (rule 4).
        network_mask: the mesh option (a CIDR, validated by ``MeshConfig``).
        env, interfaces, route: injectable for tests (default: ``os.environ``, this host's interfaces, a UDP connect).
    Raises:
        SetupError: ``network_mask`` is set but no local address lies inside it.
    """
    env = os.environ if env is None else env
    interfaces = interface_addresses() if interfaces is None else interfaces
    forced = env.get(LOCAL_ADDRESS_ENV, "").strip()
    if forced:
        return Endpoint(forced, interface_of(forced, interfaces), "env")
    if network_mask:
        net = ipaddress.ip_network(network_mask, strict=False)
        for name, addrs in interfaces.items():
            for addr in addrs:
                if ipaddress.ip_address(addr) in net:
                    return Endpoint(addr, name, "network_mask")
        raise SetupError(
            f"no local interface address is inside network_mask={network_mask!r} on "
            f"{socket.gethostname()} (interfaces: {dict(interfaces)}); fix the mask or set {LOCAL_ADDRESS_ENV} "
            "on the executors"
        )
    if driver_host:
        local = route(driver_host)
        if local is not None:
            routed = interface_of(local, interfaces)
            if routed is not None:
                return Endpoint(local, routed, "route_to_driver")
    return Endpoint(spark_host, interface_of(spark_host, interfaces), "spark")


def _netns_id() -> str:
    try:
        return os.readlink("/proc/self/ns/net")  # "net:[4026531840]": differs between network namespaces
    except OSError:
        return ""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def host_identity(address: str | None) -> str:
    """Equal for two workers only when they are on one host: same advertised address (``None``: this process's
    hostname), same network namespace and same kernel boot. Namespaces and containers of one machine that share
    ``/dev/shm`` still differ here, because they differ in address and namespace."""
    return f"{address if address is not None else socket.gethostname()}|{_netns_id()}|{_boot_id()}"


@contextmanager
def socket_interface(interface: str | None, env: MutableMapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """Set ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` to ``interface`` while a process group is created.

    Variables the user set (e.g. ``spark.executorEnv.GLOO_SOCKET_IFNAME``) are kept. Yields what is in effect and
    restores the environment afterwards (Spark reuses Python workers across fits).
    """
    env = os.environ if env is None else env
    saved = {key: env.get(key) for key in SOCKET_IFNAME_ENVS}
    try:
        if interface:
            for key in SOCKET_IFNAME_ENVS:
                if not saved[key]:
                    env[key] = interface
        yield {key: env[key] for key in SOCKET_IFNAME_ENVS if env.get(key)}
    finally:
        for key, value in saved.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
