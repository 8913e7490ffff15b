"""Which exchange gradient sharing uses: the ``topology`` option and how ``"auto"`` resolves it.

``"all_gather"``: every worker receives and decodes every worker's message (:func:`torchspark.training.algorithms.sharing.loop.
_exchange`); ``"sharded"``: reduce-scatter by parameter-index shards then all-gather of the summed shards
(:mod:`torchspark.training.algorithms.sharing.sharded`, which explains when it pays); ``"auto"``: sharded when the fit has
more than ``shard_above_workers`` workers. The choice depends on the world size only, so every rank makes the same.
"""

from __future__ import annotations

from torchspark.errors import ConfigError

__all__ = ["TOPOLOGIES", "DEFAULT_SHARD_ABOVE_WORKERS", "check_topology", "resolve_topology"]

#: ``topology`` values: ``"auto"`` (sharded above ``shard_above_workers`` workers), ``"all_gather"``, ``"sharded"``.
TOPOLOGIES: tuple[str, ...] = ("auto", "all_gather", "sharded")
#: default worker count above which ``topology="auto"`` shards: the cost model of docs/scaling.md (checked on the
#: namespace cluster at 2-8 hosts) puts the crossover near 1,500 workers at the adaptive threshold's 0.1% aim and
#: near 50 at its 1% upper band (within 17% of all-gather from 8 to 50). 128 is a compromise between the two: at 128
#: workers all-gather is still faster at 0.1% (63 vs 91 ms per step at 3.7 M parameters, 1 Gbit/s) while sharded is
#: 2.2x faster at 1%. Lower it when messages are large (see "When to use which" there)
DEFAULT_SHARD_ABOVE_WORKERS = 128


def check_topology(owner: str, topology: object, shard_above_workers: object) -> None:
    """Raise ConfigError naming the bad value and the choices (``owner`` prefixes the message)."""
    if not isinstance(topology, str) or topology not in TOPOLOGIES:
        raise ConfigError(f"{owner}: topology must be one of {list(TOPOLOGIES)}, got {topology!r}; 'auto' shards "
                          "above shard_above_workers workers")
    if isinstance(shard_above_workers, bool) or not isinstance(shard_above_workers, int) or shard_above_workers < 1:
        raise ConfigError(f"{owner}: shard_above_workers must be an integer >= 1, got {shard_above_workers!r} "
                          f"(default {DEFAULT_SHARD_ABOVE_WORKERS})")


def resolve_topology(topology: str, shard_above_workers: int, world_size: int) -> str:
    """The topology a fit of ``world_size`` workers uses: ``"sharded"`` or ``"all_gather"`` (same on every rank)."""
    if topology == "auto":
        return "sharded" if world_size > shard_above_workers else "all_gather"
    return topology
