"""torch ``TCPStore`` listeners made safe to open: bound to one address, unguessable keys, signed values.

torch's ``TCPStore`` accepts anyone who can reach its port and has no authentication, so a rendezvous through it is
only as safe as its keys and values:

1. `listening_store` binds the store's port to the address its clients use (torch's own server listens on
   every interface whatever host it is given; a socket bound here and handed over as ``master_listen_fd`` with
   the non-libuv server is the one way torch 2.x keeps it to one address);
2. `private_store` puts every key (torch.distributed's own included) under a prefix derived from the fit's
   token, so nobody can write a key before its owner without the token;
3. `publish` / `fetch` sign and check a value with the token, so a value a stranger wrote is detected
   ([`SetupError`][torchspark.cli.SetupError]), never followed.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
from typing import Any

from torchspark.errors import SetupError
from torchspark.training.rendezvous import auth

__all__ = ["listening_store", "private_store", "publish", "fetch"]

log = logging.getLogger(__name__)


def _bound_socket(host: str, port: int) -> socket.socket | None:
    """A listening socket on ``host:port``, or None when ``host`` is not an address of this machine."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    family, _, _, _, addr = infos[0]
    if family == socket.AF_INET and ipaddress.ip_address(addr[0]).is_unspecified:
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(512)
    except OSError as e:
        sock.close()
        if port and e.errno == 98:  # EADDRINUSE on a fixed port: the caller's choice, say so
            raise SetupError(f"port {port} on {host} is in use; pick another port or 0 for a free one") from e
        return None
    return sock


def listening_store(host: str, port: int, world_size: int | None, timeout_s: float) -> Any:
    """A master ``TCPStore`` listening on ``host`` only (``port`` 0 = a free port).

    Falls back to torch's all-interface listener, with a warning, when ``host`` is not an address of this machine
    (a ``controller_address`` behind NAT, say): the keys and values stay protected by the token either way.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    sock = _bound_socket(host, port)
    if sock is None:
        log.warning(
            "cannot listen on %s:%s only; the rendezvous store listens on every interface (its keys and "
            "values are still protected by the fit's token)",
            host,
            port,
        )
        return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
    bound_port = int(sock.getsockname()[1])
    fd = sock.detach()  # the store owns the descriptor now and closes it with itself
    # use_libuv=False: torch 2.13's libuv server hangs on a handed-over socket (measured); the classic one works
    return dist.TCPStore(
        host,
        bound_port,
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=fd,
        use_libuv=False,
    )


def private_store(store: Any, token: bytes) -> Any:
    """``store`` seen through a key prefix only holders of ``token`` can name (pass this to torch.distributed)."""
    import torch.distributed as dist

    return dist.PrefixStore(auth.derive_key(token, "store") + "/", store)


def publish(store: Any, token: bytes, purpose: str, value: str) -> None:
    """Set the key of ``purpose`` to ``value``, signed with ``token``."""
    store.set(auth.derive_key(token, purpose), auth.sign(token, purpose, value))


def fetch(store: Any, token: bytes, purpose: str) -> str:
    """Wait for the key of ``purpose`` (the store's timeout bounds it) and return its value once its signature checks.

    Raises:
        SetupError: the value is not signed with ``token``: another process wrote to this store.
    """
    raw = store.get(auth.derive_key(token, purpose)).decode("utf-8", "replace")
    value = auth.verify(token, purpose, raw)
    if value is None:
        raise SetupError(
            f"the rendezvous value for {purpose!r} is not signed with this fit's token: another process "
            "wrote to the rendezvous store. Make the rendezvous port reachable only from the cluster"
        )
    return value
