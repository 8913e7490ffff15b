"""A client namespace for the namespace cluster's Spark Connect server, which the workers cannot reach.

The Connect server (:meth:`NetnsCluster.start_connect_server`: ``SparkConnectServer`` through pyspark's
``bin/spark-submit``) is the cluster's driver: it runs in the root namespace next to the master, binds its gRPC
port and its driver to the bridge address, and its executors run on the namespace hosts. The client runs in a
namespace of its own, ``ts<X>c``, joined to the root namespace by one veth on 198.19.X.248/30 (not the bridge)::

    namespace tsXc: eth0 198.19.X.250/30 ─── root: tsXc 198.19.X.249/30    route: 198.18.X.1/32 only

so the client reaches the root namespace's address on the bridge (the Connect port) and nothing behind it, and no
worker host can reach the client, whatever the root namespace's IP forwarding: their only route to 198.19.X.0/24
is the decoy link, which leads nowhere. A fit works only if nothing on the executors connects back to the client.

Usage (see ``tests/multihost/test_connect_cluster.py``)::

    with NetnsCluster(workers=2) as cluster:
        with cluster.start_connect_server() as server, ClientNamespace(cluster) as client:
            client.run_python(["script.py", server.url])   # SparkSession.builder.remote(server.url) inside
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster_harness import HarnessError, NetnsCluster, client_netns_name

__all__ = ["ClientNamespace"]


@dataclass
class ClientNamespace:
    """A network namespace for a Connect client that reaches the root namespace only (the module docstring).

    Attributes:
        netns: its name, ``ts<X>c``.
        address: the client's address, which no worker host can route to.
        gateway: the root namespace's end of the link.
    """

    cluster: NetnsCluster
    netns: str = field(default="", init=False)
    address: str = field(default="", init=False)
    gateway: str = field(default="", init=False)

    def __enter__(self) -> ClientNamespace:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> ClientNamespace:
        """Create the namespace and its link to the root namespace."""
        x = self.cluster.instance
        if x is None:
            raise HarnessError("start the cluster before its client namespace")
        self.netns = client_netns_name(x)
        self.gateway, self.address = f"198.19.{x}.249", f"198.19.{x}.250"
        try:
            _ip("netns", "add", self.netns)
            _ip("link", "add", self.netns, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
            _ip("addr", "add", f"{self.gateway}/30", "dev", self.netns)
            _ip("link", "set", self.netns, "up")
            _ip("-n", self.netns, "link", "set", "lo", "up")
            _ip("-n", self.netns, "addr", "add", f"{self.address}/30", "dev", "eth0")
            _ip("-n", self.netns, "link", "set", "eth0", "up")
            # the bridge subnet (the Connect server's address) through the root namespace, nothing else
            _ip("-n", self.netns, "route", "add", f"{self.cluster.bridge_ip}/32", "via", self.gateway)
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Remove the namespace (killing what runs in it) and its link (idempotent)."""
        if not self.netns:
            return
        for pid in _ip("netns", "pids", self.netns, check=False).stdout.split():
            subprocess.run(["kill", "-9", pid], check=False, capture_output=True)
        _ip("netns", "del", self.netns, check=False)
        _ip("link", "del", self.netns, check=False)
        self.netns = ""
        try:
            atexit.unregister(self.stop)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    def run_python(
        self, argv: Sequence[str], timeout_s: float = 600.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python argv...`` (this interpreter) inside the client namespace.

        Raises:
            HarnessError: a non-zero exit, with the output's end and the cluster's logs.
        """
        run_env = dict(os.environ, **(env or {}))
        for leak in ("TORCHSPARK_CLUSTER_CONF", "SPARK_LOCAL_IP", "TORCHSPARK_LOCAL_IP"):
            run_env.pop(leak, None)
        proc = subprocess.run(
            ["ip", "netns", "exec", self.netns, sys.executable, *argv],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            server_log = os.path.join(self.cluster.workdir, "connect-server.log")
            tail = ""
            if os.path.exists(server_log):
                with open(server_log, errors="replace") as f:
                    tail = "".join(f.readlines()[-40:])
            raise HarnessError(
                f"client {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                f"{proc.stderr[-6000:]}\n--- connect server log\n{tail}\n--- cluster logs\n"
                f"{self.cluster.log_tail()}"
            )
        return proc

    def reaches(self, address: str, port: int, timeout_s: float = 2.0) -> bool:
        """Whether a TCP connection from this namespace to ``address:port`` succeeds."""
        probe = (
            "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), "
            f"timeout={timeout_s}).close(); print('ok')\nexcept OSError as e: print(e)"
        )
        out = subprocess.run(
            ["ip", "netns", "exec", self.netns, sys.executable, "-c", probe, address, str(port)],
            capture_output=True,
            text=True,
            timeout=timeout_s + 30,
        )
        return out.stdout.strip() == "ok"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise HarnessError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc
