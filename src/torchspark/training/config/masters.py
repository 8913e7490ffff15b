"""Training masters: frozen, validated configurations that say *how* a fit trains, on Spark or on one machine.

``ParameterAveragingTrainingMaster`` is DL4J's synchronous parameter averaging; ``SharedTrainingMaster`` (in
`torchspark.training.config.shared_master`) is threshold-encoded gradient sharing. Both round-trip through JSON, and
both are plain training configuration: ``SparkNetwork`` and ``ParallelWrapper`` take the same objects
(``torchspark.spark`` re-exports them). The worker-mesh options are validated once, by
[`MeshConfig`][torchspark.MeshConfig] (``master.mesh``); the values the shared options take and the
checks that span several of them are in `torchspark.training.config.shared_options`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from torchspark._bounded import load_json
from torchspark._io import dump_mapping, load_mapping
from torchspark.errors import ConfigError
from torchspark.training.checkpoint.config import DEFAULT_KEEP, check_options
from torchspark.training.config.mesh import MESH_FIELDS, RENDEZVOUS_ROUTES, MeshConfig
from torchspark.training.config.shared_options import (
    APPROACHES,
    AVERAGING_ROUTES,
    DATAFRAME_ROUTES,
    REGROW,
    REPARTITION,
    SHUFFLE_SCOPES,
    STORAGE_LEVELS,
    STRATEGIES,
    check_connect_route_settings,
    check_drop_last,
    check_elastic,
    check_gpu_amount,
    check_shuffle_scope,
    check_stall_timeout,
)
from torchspark.validation import check_bool, check_choice, check_float, check_int

# the value sets (shared_options) and RENDEZVOUS_ROUTES (mesh) are re-exported: users and the CLI import them from here
__all__ = [
    "TrainingMaster",
    "ParameterAveragingTrainingMaster",
    "master_from_json",
    "register_master",
    "master_class",
    "master_kinds",
    "REPARTITION",
    "STRATEGIES",
    "APPROACHES",
    "SHUFFLE_SCOPES",
    "DATAFRAME_ROUTES",
    "AVERAGING_ROUTES",
    "RENDEZVOUS_ROUTES",
    "STORAGE_LEVELS",
    "REGROW",
]


@dataclass(frozen=True)
class TrainingMaster:
    """Options every training master shares: a frozen dataclass, checked when built, that round-trips through
    [`to_json`][torchspark.TrainingMaster.to_json] / [`master_from_json`][torchspark.master_from_json] and YAML.

    Each option, its default, when to change it and what it costs is documented once, in the guide
    docs/guides/masters.md (the option tables); failures, checkpoints and resuming in docs/guides/recovery.md,
    GPUs in docs/guides/gpus.md. The options, by group:

    * minibatches: ``batch_size_per_worker``, ``accumulate_steps``, ``drop_last``, ``worker_prefetch_num_batches``,
      ``pin_memory``, ``data_timeout_s``;
    * how Spark data reaches the workers: ``repartition``, ``repartition_strategy``, ``rdd_training_approach``,
      ``export_directory``, ``storage_level``, ``dataframe_route``;
    * the order of the minibatches: ``rng_seed``, ``shuffle_scope``;
    * workers and failures: ``num_workers``, ``gpus_per_worker``, ``max_failures``, ``min_workers``, ``regrow``,
      ``stall_timeout_s``;
    * checkpoints: ``checkpoint_directory``, ``checkpoint_every``, ``keep_checkpoints``;
    * the worker mesh: ``port``, ``port_range``, ``network_mask``, ``controller_address``, ``rendezvous_via``,
      ``rendezvous_timeout_s``, ``shared_memory_allreduce``, checked by [`MeshConfig`][torchspark.MeshConfig]
      ([`mesh`][torchspark.TrainingMaster.mesh] returns them as one object,
      [`with_mesh`][torchspark.TrainingMaster.with_mesh] sets them all from one);
    * the workers' process: ``flush_denormal``, ``collect_training_stats``.

    Raises:
        ConfigError: a value of the wrong type or out of range, or options that cannot run together (e.g.
            ``shuffle_scope="global"`` without ``rng_seed``, ``drop_last`` without the balanced split,
            ``min_workers`` above ``num_workers``, ``checkpoint_every`` without ``checkpoint_directory``,
            ``dataframe_route="barrier_arrow"`` with settings the Connect route does not take), naming the option,
            the value and the fix.
    """

    kind: ClassVar[str] = ""
    batch_size_per_worker: int = 16
    accumulate_steps: int = 1
    num_workers: int | None = None
    worker_prefetch_num_batches: int = 2
    pin_memory: bool | None = None
    repartition: str = "always"
    repartition_strategy: str = "balanced"
    rdd_training_approach: str = "export"
    dataframe_route: str = "rdd"
    export_directory: str | None = None
    storage_level: str = "MEMORY_ONLY"
    collect_training_stats: bool = False
    drop_last: bool = False
    rng_seed: int | None = None
    shuffle_scope: str = "worker"
    rendezvous_timeout_s: float = 300.0
    data_timeout_s: float = 600.0
    rendezvous_via: str = "driver"
    shared_memory_allreduce: bool = True
    flush_denormal: bool = True
    max_failures: int = 3
    min_workers: int | None = None
    regrow: str | None = None
    stall_timeout_s: float | None = 1800.0
    port: int = 0
    network_mask: str | None = None
    controller_address: str | None = None
    port_range: tuple[int, int] | None = None
    checkpoint_directory: str | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int = DEFAULT_KEEP
    gpus_per_worker: float | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_options(name, self.checkpoint_directory, self.checkpoint_every, self.keep_checkpoints)
        if isinstance(self.port_range, list):  # from JSON
            object.__setattr__(self, "port_range", tuple(self.port_range))
        check_int("batch_size_per_worker", self.batch_size_per_worker, 1, owner=name)
        check_int("accumulate_steps", self.accumulate_steps, 1, owner=name, meaning="(minibatches per optimizer step)")
        check_int("num_workers", self.num_workers, 1, allow_none=True, owner=name)
        check_int("worker_prefetch_num_batches", self.worker_prefetch_num_batches, 0, owner=name)
        check_bool("pin_memory", self.pin_memory, allow_none=True, owner=name, none_means="pin on CUDA workers")
        check_choice("repartition", self.repartition, REPARTITION, owner=name)
        check_choice("repartition_strategy", self.repartition_strategy, STRATEGIES, owner=name)
        check_choice("rdd_training_approach", self.rdd_training_approach, APPROACHES, owner=name)
        check_choice("storage_level", self.storage_level, STORAGE_LEVELS, owner=name)
        check_choice("dataframe_route", self.dataframe_route, DATAFRAME_ROUTES, owner=name)
        check_bool("drop_last", self.drop_last, owner=name)
        check_drop_last(name, self.drop_last, self.repartition_strategy, self.repartition)
        check_bool("flush_denormal", self.flush_denormal, owner=name)
        check_int("rng_seed", self.rng_seed, 0, allow_none=True, owner=name)
        check_choice("shuffle_scope", self.shuffle_scope, SHUFFLE_SCOPES, owner=name)
        check_shuffle_scope(name, self.shuffle_scope, self.rng_seed, self.repartition_strategy, self.repartition)
        check_int("max_failures", self.max_failures, 0, owner=name)
        check_elastic(name, self.min_workers, self.num_workers, self.regrow, self.checkpoint_directory)
        check_float("data_timeout_s", self.data_timeout_s, above=0, unit="seconds", owner=name)
        check_stall_timeout(name, self.stall_timeout_s)
        check_gpu_amount(name, self.gpus_per_worker)
        self._check_dataframe_route(name)
        try:
            self.mesh  # noqa: B018 - builds the MeshConfig: the one place the mesh options are checked
        except ConfigError as e:
            raise ConfigError(f"{name}: {e}") from None

    def _check_dataframe_route(self, name: str) -> None:
        """``dataframe_route="barrier_arrow"`` takes the Connect route's settings only (the field's docstring)."""
        if self.dataframe_route != "barrier_arrow":
            return
        settings = {
            "repartition": (self.repartition, "always"),
            "repartition_strategy": (self.repartition_strategy, "balanced"),
            "averaging_via": ("spark" if self.spark_rounds else "torch", "torch"),
            "gpus_per_worker": (self.gpus_per_worker, None),
            "workers_per_node": (self.workers_per_executor, None),
        }
        check_connect_route_settings(name, settings)

    @property
    def spark_rounds(self) -> bool:
        """Whether a Spark fit runs one Spark job per averaging round (``averaging_via="spark"``), not one stage."""
        return False

    @property
    def workers_per_executor(self) -> int | None:
        """``k`` when a Spark fit runs ``k`` workers on every executor (``workers_per_node``), else None."""
        return None

    @property
    def mesh(self) -> MeshConfig:
        """The worker-mesh options as one frozen, validated object (what the runners receive)."""
        return MeshConfig(**{f: getattr(self, f) for f in MESH_FIELDS})

    def with_mesh(self, mesh: MeshConfig) -> TrainingMaster:
        """A copy of this master with every worker-mesh option taken from ``mesh``."""
        if not isinstance(mesh, MeshConfig):
            raise ConfigError(f"mesh must be a MeshConfig, got {type(mesh).__name__}")
        return dataclasses.replace(self, **mesh.to_dict())

    # -- the worker side of the master
    def algorithm_settings(self) -> dict[str, Any]:
        """The settings the worker algorithm receives."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["type"] = self.kind
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainingMaster:
        master = master_from_json(text)
        if not isinstance(master, cls):
            raise ConfigError(f"the JSON describes a {type(master).__name__}, not a {cls.__name__}")
        return master

    def to_yaml(self) -> str:
        """[`to_json`][torchspark.TrainingMaster.to_json]'s mapping as YAML (needs the ``[yaml]`` extra); [`from_yaml`][torchspark.TrainingMaster.from_yaml] reads it back."""
        return dump_mapping(json.loads(self.to_json()), "yaml")

    @classmethod
    def from_yaml(cls, text: str) -> TrainingMaster:
        """Rebuild a master from [`to_yaml`][torchspark.TrainingMaster.to_yaml] output (read with PyYAML's safe loader); on
        ``TrainingMaster`` any master, on a subclass only that kind (else ConfigError)."""
        master = master_from_json(json.dumps(load_mapping(text, "yaml", "the training master YAML")))
        if not isinstance(master, cls):
            raise ConfigError(f"the YAML describes a {type(master).__name__}, not a {cls.__name__}")
        return master


@dataclass(frozen=True)
class ParameterAveragingTrainingMaster(TrainingMaster):
    """Synchronous parameter averaging (DL4J's ParameterAveragingTrainingMaster).

    Every worker takes ``averaging_frequency`` optimizer steps from the common parameters, then every worker's
    parameters (and, with ``save_updater``, its updater state) become the example-weighted mean. With
    ``averaging_via="torch"`` the fit runs in one Spark barrier stage and the workers all-reduce over
    ``torch.distributed``; with ``"spark"`` each round is one Spark job summed by ``treeAggregate`` (depth
    ``aggregation_depth``; `torchspark.spark.rounds`). Both give the same parameters for the same data, seed and
    settings, up to float rounding.

    Its own options (``averaging_frequency``, ``save_updater``, ``averaging_via``, ``aggregation_depth``) and the
    shared ones of [`TrainingMaster`][torchspark.TrainingMaster] are documented in docs/guides/masters.md.
    """

    kind: ClassVar[str] = "averaging"
    mode: ClassVar[str] = "averaging"
    averaging_frequency: int = 5
    save_updater: bool = True
    averaging_via: str = "torch"
    aggregation_depth: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        check_int("averaging_frequency", self.averaging_frequency, 1, owner=name)
        check_int("aggregation_depth", self.aggregation_depth, 1, owner=name)
        check_choice("averaging_via", self.averaging_via, AVERAGING_ROUTES, owner=name)
        check_bool("save_updater", self.save_updater, owner=name)

    @property
    def spark_rounds(self) -> bool:
        return self.averaging_via == "spark"

    def algorithm_settings(self) -> dict[str, Any]:
        return {"averaging_frequency": self.averaging_frequency, "save_updater": self.save_updater}


_MASTERS: dict[str, type[TrainingMaster]] = {ParameterAveragingTrainingMaster.kind: ParameterAveragingTrainingMaster}


def register_master(cls: type[TrainingMaster]) -> type[TrainingMaster]:
    """Add a master class to the JSON registry (used by ``SharedTrainingMaster``)."""
    _MASTERS[cls.kind] = cls
    return cls


def master_class(kind: Any) -> type[TrainingMaster]:
    """The master class of the algorithm named ``kind`` (``"averaging"``, ``"sharing"``): the one registry behind a
    config's ``type``, ``ParallelWrapper(training_mode=...)`` and the CLI's ``--training-mode``.

    Raises:
        ConfigError: an unknown name, listing the known ones.
    """
    cls = _MASTERS.get(kind) if isinstance(kind, str) else None  # a registry lookup: nothing is imported
    if cls is None:
        raise ConfigError(f"unknown training master type {kind!r}; known: {master_kinds()}")
    return cls


def master_kinds() -> list[str]:
    """The registered algorithm names (``["averaging", "sharing"]``)."""
    return sorted(_MASTERS)


def master_from_json(text: str) -> TrainingMaster:
    """Rebuild any training master from its ``to_json()`` output."""
    try:
        d = load_json(text, "the text", ConfigError)
    except ConfigError as e:
        raise ConfigError(f"training master JSON is invalid: {e}") from e.__cause__
    if not isinstance(d, dict):
        raise ConfigError(f"training master JSON must be an object with a 'type' field, got {type(d).__name__}")
    cls = master_class(d.pop("type", None))
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown} for {cls.__name__}")
    return cls(**d)
