"""The values the options every training master shares can take, and the checks that span several options.

[`TrainingMaster`][torchspark.TrainingMaster] validates its options once, at construction: one option
at a time through `torchspark.validation`, and the combinations through the functions here, whose messages name
the option, the values that clash and the fix. Example: ``check_drop_last("MyMaster", True, "spark_default",
"always")`` raises ConfigError.
"""

from __future__ import annotations

from typing import Any

from torchspark.errors import ConfigError
from torchspark.training.config.mesh import MAX_TIMEOUT_S
from torchspark.validation import check_choice, check_float, check_int

__all__ = [
    "REPARTITION",
    "STRATEGIES",
    "APPROACHES",
    "SHUFFLE_SCOPES",
    "DATAFRAME_ROUTES",
    "AVERAGING_ROUTES",
    "STORAGE_LEVELS",
    "REGROW",
    "check_drop_last",
    "check_elastic",
    "check_stall_timeout",
    "check_shuffle_scope",
    "check_gpu_amount",
]

REPARTITION = ("always", "never", "num_partitions_workers_differs")
STRATEGIES = ("balanced", "spark_default")
APPROACHES = ("export", "direct")
#: ``shuffle_scope``: "worker" reorders each worker's own minibatches every epoch (no data moves); "global" deals the
#: minibatches to the workers anew every epoch (data moves between workers every epoch)
SHUFFLE_SCOPES = ("worker", "global")
#: how a classic session trains a DataFrame: RDD routes (``rdd_training_approach``) or the Connect route's stage
DATAFRAME_ROUTES = ("rdd", "barrier_arrow")
AVERAGING_ROUTES = ("torch", "spark")
#: when a fit that shrank grows back (``regrow``; [`torchspark.training.driver.elastic`][torchspark.training.driver.elastic])
REGROW = ("epoch", "attempt", "never")
#: the names of ``pyspark.StorageLevel``'s levels, spelled out so masters validate without importing pyspark (a test
#: checks this equals pyspark's own set)
STORAGE_LEVELS = (
    "DISK_ONLY",
    "DISK_ONLY_2",
    "DISK_ONLY_3",
    "MEMORY_AND_DISK",
    "MEMORY_AND_DISK_2",
    "MEMORY_AND_DISK_DESER",
    "MEMORY_ONLY",
    "MEMORY_ONLY_2",
    "NONE",
    "OFF_HEAP",
)


def check_drop_last(owner: str, drop_last: bool, repartition_strategy: str, repartition: str) -> None:
    """``drop_last=True`` cuts whole minibatches from the balanced split, so it needs that split and a repartition.

    Raises:
        ConfigError: ``drop_last=True`` with ``repartition_strategy="spark_default"`` or ``repartition="never"``.
    """
    if drop_last and (repartition_strategy != "balanced" or repartition == "never"):
        raise ConfigError(
            f"{owner}: drop_last=True needs repartition_strategy='balanced' and a repartition, got "
            f"repartition_strategy={repartition_strategy!r}, repartition={repartition!r}; "
            "use the defaults or set drop_last=False"
        )


def check_elastic(
    owner: str, min_workers: int | None, num_workers: int | None, regrow: str | None, checkpoint_directory: str | None
) -> None:
    """``min_workers`` is in 1..``num_workers`` or None; ``regrow`` is one of `REGROW` or None, and ``"epoch"``
    grows back from a checkpoint, so it needs a directory.

    Raises:
        ConfigError: ``min_workers`` out of range, an unknown ``regrow``, or ``regrow="epoch"`` with
            ``checkpoint_directory=None``.
    """
    check_int(
        "min_workers",
        min_workers,
        1,
        num_workers,
        allow_none=True,
        owner=owner,
        none_means="num_workers: never fewer",
        fix="set min_workers <= num_workers, or None",
    )
    check_choice("regrow", regrow, (None, *REGROW), owner=owner)
    if regrow == "epoch" and checkpoint_directory is None:
        raise ConfigError(
            f"{owner}: regrow='epoch' grows a smaller world back from the checkpoint at an epoch boundary, but "
            "checkpoint_directory=None; set a checkpoint_directory, or regrow='attempt'"
        )


def check_stall_timeout(owner: str, stall_timeout_s: float | None) -> None:
    """``stall_timeout_s`` is a finite number of seconds above 0 and at most ``MAX_TIMEOUT_S``, or None (no watchdog).

    Raises:
        ConfigError: any other value, naming it and the range.
    """
    check_float(
        "stall_timeout_s",
        stall_timeout_s,
        above=0,
        maximum=MAX_TIMEOUT_S,
        finite=True,
        allow_none=True,
        unit="seconds",
        owner=owner,
        none_means="no progress watchdog",
    )


def check_shuffle_scope(
    owner: str, shuffle_scope: str, rng_seed: int | None, repartition_strategy: str, repartition: str
) -> None:
    """``shuffle_scope="global"`` deals the balanced split anew every epoch from ``rng_seed``, so it needs both.

    Raises:
        ConfigError: ``shuffle_scope="global"`` without ``rng_seed`` or without the balanced split.
    """
    if shuffle_scope == "global" and (rng_seed is None or repartition_strategy != "balanced" or repartition == "never"):
        raise ConfigError(
            f"{owner}: shuffle_scope='global' deals the minibatches anew every epoch with rng_seed "
            f"over the balanced split, got rng_seed={rng_seed!r}, repartition_strategy="
            f"{repartition_strategy!r}, repartition={repartition!r}; set rng_seed=<int> "
            "and keep the balanced split, or use shuffle_scope='worker'"
        )


def check_gpu_amount(owner: str, amount: Any) -> None:
    """``gpus_per_worker``: None, or a number > 0 that Spark accepts as a task's GPU amount (at most 0.5, or a
    whole number: Spark shares a GPU between ``1/amount`` tasks only for such fractions)."""
    check_float(
        "gpus_per_worker",
        amount,
        above=0,
        finite=True,
        allow_none=True,
        owner=owner,
        none_means="the session's spark.task.resource.gpu.amount",
    )
    if amount is not None and amount > 0.5 and float(amount) != int(amount):
        raise ConfigError(
            f"{owner}: gpus_per_worker must be at most 0.5 or a whole number (Spark's rule for a "
            f"task's GPU amount), got {amount!r}; use 1 for a GPU per worker or 0.5 to share one by two"
        )


def check_connect_route_settings(owner: str, settings: dict[str, tuple[Any, Any]]) -> None:
    """``dataframe_route="barrier_arrow"`` takes the Connect route's settings only: ``settings`` maps each option
    that route fixes to ``(the master's value, the one value the route takes)``.

    Raises:
        ConfigError: naming every option whose value differs, and the fix.
    """
    refused = [f"{k}={v!r}" for k, (v, fine) in settings.items() if v != fine]
    if refused:
        raise ConfigError(
            f"{owner}: dataframe_route='barrier_arrow' (the Spark Connect route's one barrier "
            f"stage, balanced split) cannot run with {', '.join(refused)}; use "
            "dataframe_route='rdd' (the default) for those, or the defaults "
            "repartition='always', repartition_strategy='balanced', averaging_via='torch', "
            "num_workers instead of workers_per_node, no gpus_per_worker"
        )
