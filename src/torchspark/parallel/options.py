"""ParallelWrapper's master options: the master a ``training_mode`` builds from keyword options named exactly as the
master names them, and which master options work on one machine.

``ParallelWrapper(net, master=SharedTrainingMaster(...))`` takes the same master a ``SparkNetwork`` takes;
``ParallelWrapper(net, training_mode="sharing", overlap=False)`` builds it from the master's own option names, with
the master's own defaults and validation (`master_from_options`): there is no second list of options here.

Example::

    master = master_from_options("averaging", {"averaging_frequency": 3})
    master.batch_size_per_worker  # 32: DEFAULT_BATCH_SIZE, ParallelWrapper's one default of its own
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchspark.errors import ConfigError
from torchspark.training.config.masters import TrainingMaster, master_class, master_kinds

__all__ = ["DEFAULT_BATCH_SIZE", "SPARK_ONLY", "master_options", "master_from_options", "check_local_master"]

#: ParallelWrapper's default minibatch size per worker when its options build the master (``fit(batch_size=...)``
#: overrides it); the masters' own default (16, DL4J's) suits many workers on a cluster, 32 a few local processes
DEFAULT_BATCH_SIZE = 32

#: master options that only mean something on Spark: the workers here are local processes fed by this one
SPARK_ONLY = (
    "repartition",
    "repartition_strategy",
    "rdd_training_approach",
    "dataframe_route",
    "export_directory",
    "storage_level",
    "rendezvous_via",
    "port",
    "network_mask",
    "controller_address",
    "averaging_via",
    "aggregation_depth",
    "workers_per_node",
    "gpus_per_worker",
)


def master_options(cls: type[TrainingMaster]) -> list[str]:
    """The options of master class ``cls`` that ParallelWrapper takes as keywords: its fields but the Spark-only
    ones."""
    return sorted(f.name for f in dataclasses.fields(cls) if f.init and f.name not in SPARK_ONLY)


def master_from_options(training_mode: str, options: dict[str, Any]) -> TrainingMaster:
    """The master of ``training_mode`` (``"averaging"`` or ``"sharing"``) with ``options`` set; every other option
    keeps the master's default (``batch_size_per_worker``: `DEFAULT_BATCH_SIZE`).

    Raises:
        ConfigError: an unknown ``training_mode``; an option that is not the master's (the message lists its
            options, and says which mode an option of the other master belongs to); a Spark-only option; a bad
            value, as the master's own validation words it.
    """
    if training_mode not in master_kinds():
        raise ConfigError(f"training_mode must be one of {master_kinds()}, got {training_mode!r}")
    cls = master_class(training_mode)
    valid = master_options(cls)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(
            f"ParallelWrapper(training_mode={training_mode!r}) does not take {unknown}: "
            f"{_why(unknown, training_mode)}; the {cls.__name__} options are {valid}"
        )
    return cls(**{"batch_size_per_worker": DEFAULT_BATCH_SIZE, **options})


def _why(unknown: list[str], training_mode: str) -> str:
    spark = [k for k in unknown if k in SPARK_ONLY]
    if spark:
        return f"{spark} only mean something on Spark (workers here are local processes); train with SparkNetwork"
    for other in master_kinds():
        if other != training_mode and set(unknown) <= set(master_options(master_class(other))):
            return f"they are options of training_mode={other!r}"
    return "not an option of this training mode"


def check_local_master(master: Any, options: dict[str, Any]) -> TrainingMaster:
    """``master`` when ParallelWrapper can honour every option it sets.

    Raises:
        ConfigError: not a master; a keyword option given next to it (pass one or the other); or a Spark-only option
            (export, repartitioning, ``averaging_via="spark"``, addresses and ports) away from its default: workers
            here are local processes fed by this one, so it would be silently ignored.
    """
    if not isinstance(master, TrainingMaster):
        raise ConfigError(
            f"master must be a ParameterAveragingTrainingMaster or SharedTrainingMaster, got {type(master).__name__}"
        )
    if options:
        raise ConfigError(
            f"pass either master= or the options that build one, not both: {sorted(options)} were also "
            f"given; set them on the master instead"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(master) if f.default is not dataclasses.MISSING}
    spark_only = sorted(k for k in SPARK_ONLY if k in defaults and getattr(master, k) != defaults[k])
    if spark_only:
        values = ", ".join(f"{k}={getattr(master, k)!r}" for k in spark_only)
        raise ConfigError(
            f"ParallelWrapper runs every worker as a process on this machine, so {values} would be "
            f"ignored; leave them at their defaults (dataclasses.replace(master, ...)) or train with "
            "SparkNetwork"
        )
    return master
