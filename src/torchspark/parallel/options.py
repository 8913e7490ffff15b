"""ParallelWrapper's keyword options as a training master, and which master options work on one machine.

``ParallelWrapper(net, master=SharedTrainingMaster(...))`` takes the same master a ``SparkNetwork`` takes; its
older keyword options (``training_mode``, ``averaging_frequency``, ``threshold_algorithm`` ...) are a convenience
that builds that master (:func:`master_from_options`), so every value is checked by the master, in one place.
"""

from __future__ import annotations

from typing import Any

from torchspark.encoding import AdaptiveThreshold, ResidualClipping
from torchspark.errors import ConfigError
from torchspark.training.algorithms.sharing.topology import DEFAULT_SHARD_ABOVE_WORKERS
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, TrainingMaster
from torchspark.training.config.shared_master import SharedTrainingMaster

__all__ = ["TRAINING_MODES", "OPTION_DEFAULTS", "master_from_options", "check_local_master"]

#: ParallelWrapper's training modes (DL4J's names) and the worker algorithm each runs.
TRAINING_MODES = {"averaging": "averaging", "shared_gradients": "sharing"}

#: the keyword options that build the master, with their defaults (a non-default one next to ``master=`` is a
#: conflict)
OPTION_DEFAULTS: dict[str, Any] = {
    "training_mode": "averaging", "averaging_frequency": 5, "average_updaters": True, "prefetch_buffer": 2,
    "threshold_algorithm": AdaptiveThreshold(), "residual_post_processor": ResidualClipping(),
    "shake_frequency": 0, "overlap": True, "collect_training_stats": False, "rng_seed": None,
    "rendezvous_timeout_s": 300.0, "data_timeout_s": 600.0, "flush_denormal": True, "drop_last": False,
    "on_divergence": "fail", "max_staleness": None, "topology": "auto",
    "shard_above_workers": DEFAULT_SHARD_ABOVE_WORKERS,
    "checkpoint_directory": None, "checkpoint_every": None, "keep_checkpoints": 2, "max_failures": 3,
}

#: ParallelWrapper's default minibatch size (``fit(batch_size=...)``), the master's ``batch_size_per_worker``
DEFAULT_BATCH_SIZE = 32

#: ParallelWrapper option -> the master option it sets, where the names differ
_RENAMED = {"average_updaters": "save_updater", "prefetch_buffer": "worker_prefetch_num_batches"}

#: master options that only mean something on Spark, with the value ParallelWrapper works like
_SPARK_ONLY: dict[str, Any] = {
    "repartition": "always", "repartition_strategy": "balanced", "rdd_training_approach": "export",
    "export_directory": None, "storage_level": "MEMORY_ONLY", "rendezvous_via": "driver", "port": 0,
    "network_mask": None, "controller_address": None, "averaging_via": "torch", "aggregation_depth": 2,
    "workers_per_node": -1,
}


def master_from_options(options: dict[str, Any]) -> TrainingMaster:
    """The master ParallelWrapper's keyword ``options`` describe (missing ones take :data:`OPTION_DEFAULTS`).

    Both algorithms' options are checked whatever the mode (the unused ones are ignored, as before the master
    existed), by the masters' own validation.

    Raises:
        ConfigError: an unknown ``training_mode`` or a bad value, named as the master names it.
    """
    o = {**OPTION_DEFAULTS, **options}
    mode = o["training_mode"]
    if not isinstance(mode, str) or mode not in TRAINING_MODES:
        raise ConfigError(f"training_mode must be one of {list(TRAINING_MODES)}, got {mode!r}")
    common = {"batch_size_per_worker": DEFAULT_BATCH_SIZE, "worker_prefetch_num_batches": o["prefetch_buffer"],
              "collect_training_stats": o["collect_training_stats"], "rng_seed": o["rng_seed"],
              "rendezvous_timeout_s": o["rendezvous_timeout_s"], "data_timeout_s": o["data_timeout_s"],
              "flush_denormal": o["flush_denormal"], "checkpoint_directory": o["checkpoint_directory"],
              "checkpoint_every": o["checkpoint_every"], "keep_checkpoints": o["keep_checkpoints"],
              "max_failures": o["max_failures"], "drop_last": o["drop_last"]}
    try:
        averaging = ParameterAveragingTrainingMaster(averaging_frequency=o["averaging_frequency"],
                                                     save_updater=o["average_updaters"], **common)
        sharing = SharedTrainingMaster(threshold_algorithm=o["threshold_algorithm"],
                                       residual_post_processor=o["residual_post_processor"],
                                       shake_frequency=o["shake_frequency"], overlap=o["overlap"],
                                       on_divergence=o["on_divergence"], max_staleness=o["max_staleness"],
                                       topology=o["topology"], shard_above_workers=o["shard_above_workers"],
                                       **common)
    except ConfigError as e:
        renamed = [f"{ours} is the master's {theirs}" for ours, theirs in _RENAMED.items() if theirs in str(e)]
        if not renamed:
            raise
        raise ConfigError(f"{e} ({'; '.join(renamed)})") from None
    return averaging if TRAINING_MODES[mode] == "averaging" else sharing


def check_local_master(master: Any, options: dict[str, Any]) -> TrainingMaster:
    """``master`` when ParallelWrapper can honour every option it sets.

    Raises:
        ConfigError: not a master; a keyword option set next to it (pass one or the other); or a Spark-only option
            (export, repartitioning, ``averaging_via="spark"``, addresses and ports) away from its default: workers
            here are local processes fed by this one, so it would be silently ignored.
    """
    if not isinstance(master, TrainingMaster):
        raise ConfigError(f"master must be a ParameterAveragingTrainingMaster or SharedTrainingMaster, got "
                          f"{type(master).__name__}")
    conflicts = sorted(k for k, v in options.items() if v != OPTION_DEFAULTS[k])
    if conflicts:
        raise ConfigError(f"pass either master= or the options that build one, not both: {conflicts} were also "
                          f"given; set them on the master instead")
    spark_only = sorted(k for k, v in _SPARK_ONLY.items() if hasattr(master, k) and getattr(master, k) != v)
    if spark_only:
        values = ", ".join(f"{k}={getattr(master, k)!r}" for k in spark_only)
        raise ConfigError(f"ParallelWrapper runs every worker as a process on this machine, so {values} would be "
                          f"ignored; leave them at their defaults (dataclasses.replace(master, ...)) or train with "
                          "SparkNetwork")
    return master
