"""The training runs the multi-host tests compare: the same network, data, seed and master settings on the
namespace cluster (``_driver.py``) and on ``local[2]`` (the suite's session)."""

from __future__ import annotations

from typing import Any

from torchspark import Network, datasets, models, optim
from torchspark.encoding import AdaptiveThreshold
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster

BATCH = 8
SEED = 7


def parse(spec: str) -> tuple[str, str, dict[str, str]]:
    """``"name:kind,key=value,..."`` -> (name, kind, options)."""
    name, rest = spec.split(":", 1)
    kind, *pairs = rest.split(",")
    return name, kind, dict(p.split("=", 1) for p in pairs)


def build(kind: str, options: dict[str, str], export_directory: str | None = None) -> tuple[Network, Any, list]:
    """(network, master, minibatches) for ``kind`` in ``averaging`` / ``sharing``."""
    net = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1, momentum=0.9), seed=0)
    data = datasets.synthetic_classification(96, 12, 3, seed=1).split(BATCH)
    mesh: dict[str, Any] = {"rendezvous_timeout_s": 120}
    if "network_mask" in options:
        mesh["network_mask"] = options["network_mask"]
    if "port_range" in options:
        lo, hi = options["port_range"].split("-")
        mesh["port_range"] = (int(lo), int(hi))
    if export_directory is not None:
        mesh["export_directory"] = export_directory
    if kind == "averaging":
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=BATCH, averaging_frequency=3, num_workers=2, rng_seed=SEED, **mesh
        )
    elif kind == "sharing":
        master = SharedTrainingMaster(
            batch_size_per_worker=BATCH,
            num_workers=2,
            rng_seed=SEED,
            threshold_algorithm=AdaptiveThreshold(initial=1e-3),
            **mesh,
        )
    else:
        raise ValueError(f"unknown scenario kind {kind!r}")
    return net, master, data
