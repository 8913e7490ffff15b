"""The per-fit secret shared by the driver and its workers, and what it proves.

Every listener a fit opens (the driver's progress server, the driver's rendezvous relay, worker 0's store) is
reachable by any process that can reach its address. The driver draws a fresh random token per fit and ships it
to the workers inside the task; with it:

1. a progress connection is challenged: the server sends a fresh random nonce (`NONCE_BYTES`), the client
   answers with `hello` (an HMAC of the token and that nonce, never the token itself), and the connection is
   dropped unless `check_hello` accepts it. A hello is good for its own connection only: one captured on
   the wire does not replay on another;
2. keys in torch's ``TCPStore`` (which has no authentication) are named by `derive_key`, so nobody can
   write a key before its owner does without the token;
3. values there carry an HMAC tag (`sign` / `verify`), so a value a stranger wrote is detected, never
   followed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import selectors
from collections.abc import Callable, Collection
from typing import Protocol, TypeVar

from torchspark.errors import ConfigError

__all__ = [
    "eviction_victim",
    "TOKEN_BYTES",
    "HELLO_BYTES",
    "NONCE_BYTES",
    "new_nonce",
    "new_token",
    "hello",
    "check_hello",
    "derive_key",
    "sign",
    "verify",
]

#: token length: 256 random bits, as for an HMAC-SHA256 key
TOKEN_BYTES = 32
_MAGIC = b"TSPROG1:"
#: the fixed size of a progress hello: a magic string then a SHA-256 tag
HELLO_BYTES = len(_MAGIC) + hashlib.sha256().digest_size
_TAG_HEX = 2 * hashlib.sha256().digest_size
#: the size of the server's challenge on a progress connection
NONCE_BYTES = 16


def new_token() -> bytes:
    """A fresh random per-fit token (``secrets.token_bytes``)."""
    return secrets.token_bytes(TOKEN_BYTES)


def _check(token: bytes) -> bytes:
    if not isinstance(token, bytes) or len(token) < 16:
        raise ConfigError(f"a fit token must be at least 16 random bytes (use new_token()), got {token!r:.40}")
    return token


def _tag(token: bytes, purpose: bytes, data: bytes = b"") -> bytes:
    return hmac.new(_check(token), purpose + b"\x00" + data, hashlib.sha256).digest()


def new_nonce() -> bytes:
    """A fresh random challenge for one progress connection (`NONCE_BYTES` bytes)."""
    return secrets.token_bytes(NONCE_BYTES)


def hello(token: bytes, nonce: bytes = b"") -> bytes:
    """The `HELLO_BYTES` a progress client answers the server's ``nonce`` with (proves it holds ``token``
    without revealing it, for this connection only)."""
    return _MAGIC + _tag(token, b"progress-hello", nonce)


def check_hello(token: bytes, data: bytes, nonce: bytes = b"") -> bool:
    """True when ``data`` is exactly the hello of ``token`` for ``nonce`` (constant-time comparison)."""
    return len(data) == HELLO_BYTES and hmac.compare_digest(data, hello(token, nonce))


def derive_key(token: bytes, purpose: str) -> str:
    """An unguessable store key (or key prefix) for ``purpose``: without the token nobody can name it."""
    return "torchspark/" + _tag(token, b"key", purpose.encode()).hex()[:32]


def sign(token: bytes, purpose: str, value: str) -> str:
    """``value`` with an HMAC tag bound to ``purpose`` (a value signed for one key cannot be replayed at another)."""
    return _tag(token, purpose.encode(), value.encode()).hex() + value


def verify(token: bytes, purpose: str, signed: str) -> str | None:
    """The value inside ``signed`` if its tag is right, else None (a stranger wrote it)."""
    tag, value = signed[:_TAG_HEX], signed[_TAG_HEX:]
    if len(tag) != _TAG_HEX or not hmac.compare_digest(tag, _tag(token, purpose.encode(), value.encode()).hex()):
        return None
    return value


class PendingConnection(Protocol):
    """What `eviction_victim` reads of a server's connection."""

    authed: bool  # its hello was checked
    hello: bytearray  # what it has sent of its hello so far
    deadline: float  # when its hello is due (time.monotonic())


C = TypeVar("C", bound=PendingConnection)


def eviction_victim(
    conns: Collection[C], selector: selectors.BaseSelector, max_pending: int, read: Callable[[C], None]
) -> C | None:
    """The connection to close so that at most ``max_pending`` owe their hello (None: there is room), for the
    driver's servers that authenticate with `hello` (the rendezvous relay and the progress server).

    1. Under ``max_pending`` pending connections: nothing to do.
    2. Read what the pending connections already sent (``read``): a worker whose whole hello arrived is
       authenticated by it and no longer pending, so a flood of strangers cannot push it out.
    3. Still at the limit: the victim is one that sent part of a hello (only a stranger does) before one that sent
       nothing yet (perhaps a worker within its round trip), the oldest first.

    ``conns`` is a live view (``dict.values()``): a connection that ``read`` closes leaves it.
    """
    if sum(not c.authed for c in conns) < max_pending:  # 1.
        return None
    for key, _ in selector.select(timeout=0):  # 2.
        conn = key.data
        if conn is not None and not conn.authed and conn in conns:
            read(conn)
    pending = [c for c in conns if not c.authed]
    if len(pending) < max_pending:
        return None
    return min(pending, key=lambda c: (not c.hello, c.deadline))  # 3.
