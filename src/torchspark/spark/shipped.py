"""How a network reaches the executors for evaluation and inference, on a classic or a Spark Connect session.

The network always travels as its blueprint: one safetensors blob whose metadata holds the JSON config
([`to_bytes`][torchspark.nn.NetworkBlueprint.to_bytes], no pickle of the weights). What carries the blob depends on the
session:

* classic: a broadcast (`ShippedNetwork`), one copy per executor, fetched on first use;
* Spark Connect (no ``broadcast``): `ConnectNetwork`, through the Connect route's shipping
  (`ship_bytes`, shared with training): inside the task's closure while
  the blob is small, else uploaded as session artifacts (``spark.addArtifacts(..., file=True)``, streamed in
  chunks, so no size cap) whose names the closure carries. Connect refuses any single message over
  ``spark.connect.grpc.maxInboundMessageSize`` (128 MiB by default), and the closure rides in the plan message,
  hence the split.

Each executor Python process builds one copy per key, leased from its `NetworkCache`
and reused by later tasks.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from torchspark.errors import ConfigError
from torchspark.nn import Network, NetworkBlueprint
from torchspark.nn.cache import NetworkCache
from torchspark.spark.broadcasts import destroy_broadcast
from torchspark.spark.connect.shipping import Shipment, ship_bytes
from torchspark.spark.session import spark_context
from torchspark.spark.session_kinds import is_connect_session

__all__ = ["DEFAULT_EVAL_WORKERS", "Shipped", "ShippedNetwork", "ConnectNetwork", "ship_network", "ship_to_session"]

log = logging.getLogger(__name__)

#: most copies of one network a Python process holds at once (only threads of one process share a cache)
DEFAULT_EVAL_WORKERS = 4

# one per Python process: on an executor this is the per-worker-process cache of shipped networks
_CACHE = NetworkCache()


class Shipped(Protocol):
    """A network on its way to the executors: ``with shipped.lease() as net`` on an executor, ``release()`` on
    the driver after the last job that uses it."""

    @property
    def key(self) -> str:  # read-only: the implementations are frozen dataclasses
        ...

    def lease(self, limit: int = DEFAULT_EVAL_WORKERS) -> AbstractContextManager[Network]: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class ShippedNetwork:
    """A network broadcast to the executors; pickles as its key plus the broadcast handle (not the weights)."""

    key: str
    broadcast: Any

    def lease(self, limit: int = DEFAULT_EVAL_WORKERS) -> Any:
        """Context manager yielding this process's copy of the network (see `NetworkCache`)."""
        return _CACHE.lease(self.key, limit, self._build)

    def _build(self) -> Network:
        log.debug("building network copy for broadcast %s", self.key)
        return NetworkBlueprint.from_bytes(self.broadcast.value).build()

    def release(self) -> None:
        """Drop the broadcast from the executors and the driver (call only after every job that uses it has run)."""
        destroy_broadcast(self.broadcast)


@dataclass(frozen=True)
class ConnectNetwork:
    """A network shipped to a Spark Connect session's executors (`ship_bytes`):
    its blueprint inside the closure, or in session artifacts the closure names; ``key`` is its content hash, so the
    same weights shipped again reuse the executors' copies."""

    key: str
    shipment: Shipment

    def lease(self, limit: int = DEFAULT_EVAL_WORKERS) -> Any:
        """Context manager yielding this process's copy of the network."""
        return _CACHE.lease(self.key, limit, self._build)

    def _build(self) -> Network:
        return NetworkBlueprint.from_bytes(self.shipment.read()).build()

    def release(self) -> None:
        """Nothing to drop: the blob rides in the closure, and a Connect session keeps its artifacts until it ends
        (Connect has no call to remove one)."""


def ship_network(sc: Any, network: Network) -> ShippedNetwork:
    """Broadcast ``network``'s blueprint (safetensors bytes) under a fresh key (classic sessions)."""
    _check_network(network)
    blob = NetworkBlueprint.of(network).to_bytes()
    return ShippedNetwork(key=uuid.uuid4().hex, broadcast=sc.broadcast(blob))


def ship_to_session(spark: Any, network: Network, inline_limit: int | None = None) -> Shipped:
    """Ship ``network`` the way ``spark`` (a session, a SparkContext or a DataFrame's session) allows: a broadcast
    on a classic session; on Spark Connect the closure up to ``inline_limit`` bytes, else session artifacts.

    Args:
        inline_limit: the largest blueprint (bytes) sent inside the closure under Connect; None: a quarter of the
            server's ``spark.connect.grpc.maxInboundMessageSize`` (`inline_limit`, 32 MiB by default), so the plan message stays under the cap. 0 always uploads
            artifacts. Ignored on classic sessions.
    Example: ``shipped = ship_to_session(df.sparkSession, net)``, then ``with shipped.lease() as copy:`` in the
        function a ``mapInArrow`` runs.
    """
    if inline_limit is not None and (
        isinstance(inline_limit, bool) or not isinstance(inline_limit, int) or inline_limit < 0
    ):
        raise ConfigError(f"inline_limit must be an integer >= 0 (bytes) or None, got {inline_limit!r}")
    if not is_connect_session(spark):
        return ship_network(spark_context(spark), network)
    _check_network(network)
    blob = NetworkBlueprint.of(network).to_bytes()
    shipment = ship_bytes(spark, blob, "network", inline_limit)
    if shipment.via_artifacts:
        log.info(
            "the network (%.1f MiB) is over the closure limit: shipped as session artifacts %s",
            len(blob) / 2**20,
            ", ".join(shipment.names),
        )
    return ConnectNetwork(shipment.sha256[:32], shipment)


def _check_network(network: Any) -> None:
    if not isinstance(network, Network):
        raise ConfigError(f"network must be a torchspark.Network, got {type(network).__name__}")
