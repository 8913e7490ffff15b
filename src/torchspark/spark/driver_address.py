"""Which address the driver's listeners (progress server, rendezvous relay) bind to and advertise to workers."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

__all__ = ["LOOPBACK", "driver_listen_address", "listen_address_for"]

LOOPBACK = "127.0.0.1"


def listen_address_for(master: str, get: Callable[[str], str | None]) -> tuple[str, str]:
    """``(bind_address, advertise_host)`` for a session whose master URL is ``master`` and conf reader ``get``.

    * ``local``, ``local[N]``, ``local-cluster[...]``: every worker runs on this machine: loopback for both.
    * a cluster: advertise ``spark.driver.host`` (what executors already use to reach the driver) and bind
      ``spark.driver.bindAddress`` when set (a driver behind NAT or in a container), else the address
      ``spark.driver.host`` resolves to. Never every interface.
    """
    if master.startswith("local"):
        return LOOPBACK, LOOPBACK
    advertise = get("spark.driver.host") or socket.gethostname()
    bind = get("spark.driver.bindAddress") or advertise
    try:
        bind = str(socket.getaddrinfo(bind, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except OSError:
        pass  # the bind fails later with a message naming the address
    return str(bind), advertise


def driver_listen_address(sc: Any) -> tuple[str, str]:
    """`listen_address_for` of a live SparkContext."""
    conf = sc.getConf()
    return listen_address_for(sc.master, lambda key: conf.get(key, None))
