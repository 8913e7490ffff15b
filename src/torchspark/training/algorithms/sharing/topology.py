"""Which exchange gradient sharing uses: the ``topology`` option, how ``"auto"`` resolves it, and the exchange it
names.

``"all_gather"``: every worker receives and decodes every worker's message
(`round_from_gathered` of an all-gather); ``"sharded"``:
reduce-scatter by parameter-index shards then all-gather of the summed shards
(`torchspark.training.algorithms.sharing.sharded`); ``"auto"``: sharded when the fit has more than
``shard_above_workers`` workers. The choice depends on the world size only, so every rank makes the same. When
each one pays: docs/scaling.md.

Example::

    topology = resolve_topology("auto", DEFAULT_SHARD_ABOVE_WORKERS, comm.world_size)
    transport, finish = exchange_phases(topology, net.num_params(), net.device)
    result = finish(transport(comm, payload))    # a Round
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchspark.encoding.compressor import Compressor
from torchspark.errors import ConfigError
from torchspark.training.algorithms.sharing.rounds import Round, codec_round, round_from_gathered
from torchspark.training.algorithms.sharing.sharded import sharded_exchange
from torchspark.training.comm import Communicator

__all__ = ["TOPOLOGIES", "DEFAULT_SHARD_ABOVE_WORKERS", "check_topology", "resolve_topology", "exchange_phases"]

#: ``topology`` values: ``"auto"`` (sharded above ``shard_above_workers`` workers), ``"all_gather"``, ``"sharded"``.
TOPOLOGIES: tuple[str, ...] = ("auto", "all_gather", "sharded")
#: default worker count above which ``topology="auto"`` shards: the cost model of docs/scaling.md (checked on the
#: namespace cluster at 2-8 hosts) puts the crossover far above it at the adaptive threshold's 0.1% aim and well
#: below it at its 1% upper band. 128 is a compromise between the two (docs/scaling.md, "Predictions", the
#: 128-worker row). Lower it when messages are large (see "When to use which" there)
DEFAULT_SHARD_ABOVE_WORKERS = 128


def check_topology(owner: str, topology: object, shard_above_workers: object) -> None:
    """Raise ConfigError naming the bad value and the choices (``owner`` prefixes the message)."""
    if not isinstance(topology, str) or topology not in TOPOLOGIES:
        raise ConfigError(
            f"{owner}: topology must be one of {list(TOPOLOGIES)}, got {topology!r}; 'auto' shards "
            "above shard_above_workers workers"
        )
    if isinstance(shard_above_workers, bool) or not isinstance(shard_above_workers, int) or shard_above_workers < 1:
        raise ConfigError(
            f"{owner}: shard_above_workers must be an integer >= 1, got {shard_above_workers!r} "
            f"(default {DEFAULT_SHARD_ABOVE_WORKERS})"
        )


def resolve_topology(topology: str, shard_above_workers: int, world_size: int, codec: object = None) -> str:
    """The topology a fit of ``world_size`` workers uses: ``"sharded"`` or ``"all_gather"`` (same on every rank);
    always ``"all_gather"`` for a ``codec`` other than threshold encoding (None)."""
    if codec is not None:
        return "all_gather"
    if topology == "auto":
        return "sharded" if world_size > shard_above_workers else "all_gather"
    return topology


def exchange_phases(
    topology: str, length: int, device: torch.device | str, codec: Compressor | None = None
) -> tuple[Callable[[Communicator, bytes], Any], Callable[[Any], Round]]:
    """The exchange of a resolved ``topology`` as ``(transport, finish)``: ``finish(transport(comm, payload))`` is
    the `Round` of every worker's ``payload``, the same on
    every rank and bit-identical for both topologies. With overlap the transport runs on the exchange thread and
    ``finish`` on the training thread: for all-gather the transport is the all-gather alone (the thread only waits
    on the wire, where it does not hold the GIL) and the parsing and summing run on the training thread between
    steps, instead of competing with it for the GIL (BENCHMARKS.md, "Small networks"). The sharded exchange
    interleaves its decoding with two collectives, so it runs whole on the thread. A ``codec`` other than threshold
    encoding (None) is exchanged by all-gather and summed by `codec_round`."""
    if codec is not None:
        return (lambda comm, payload: comm.all_gather_bytes(payload)), (
            lambda gathered: codec_round(gathered, length, device, codec)
        )
    if topology == "sharded":
        return (lambda comm, payload: sharded_exchange(comm, payload, length, device)), (lambda result: result)
    return (lambda comm, payload: comm.all_gather_bytes(payload)), (
        lambda gathered: round_from_gathered(gathered, length, device)
    )
