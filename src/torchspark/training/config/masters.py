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
    """Options every training master shares.

    Args:
        batch_size_per_worker: examples per minibatch on each worker (DL4J default 16). Larger batches mean fewer,
            cheaper synchronisations; scale the learning rate with it.
        accumulate_steps: minibatches per optimizer step on each worker (gradient accumulation, default 1): the
            gradients of ``k`` consecutive minibatches add up and the updater steps once, exactly as on one batch of
            ``k * batch_size_per_worker`` examples (the loss is their example-weighted mean), while only one
            minibatch's activations are in memory. Use it when the batch you want per worker does not fit on the
            device (large models on a GPU): e.g. ``batch_size_per_worker=16, accumulate_steps=8`` steps on 128
            examples. Every count is then in optimizer steps: ``averaging_frequency`` (an average every ``f * k``
            minibatches), a gradient-sharing round (one encoded update per step), ``checkpoint_every``, the
            iteration and progress counters. An epoch whose minibatch count is not a multiple of ``k`` ends with a
            shorter group. BatchNorm sees each minibatch's own statistics, not the group's.
        num_workers: training workers, one Spark task slot each (default: the session's default parallelism).
        worker_prefetch_num_batches: minibatches a background thread loads ahead on each worker (0 = off).
        pin_memory: copy each minibatch into pinned (page-locked) host memory on the loading thread, so that its
            copy to a CUDA worker's GPU is asynchronous and overlaps the previous step's compute (as
            ``DataLoader(pin_memory=True)``). None (default): on for workers on CUDA; True: the same (pinning needs
            CUDA, so CPU workers never pin); False: off, e.g. when pinned memory is scarce on the host (every queued
            minibatch holds page-locked RAM) or to compare. The GPU check (``benchmarks/gpu_check.py``) measures
            samples/s with and without.
        repartition: ``"always"`` (balance every fit), ``"never"`` (each worker trains its own partition, in
            order; needs as many partitions as workers) or ``"num_partitions_workers_differs"``.
        repartition_strategy: ``"balanced"`` (every worker trains ``floor(N/n)`` or ``ceil(N/n)`` of the ``N``
            examples, in minibatches of ``batch_size_per_worker`` except at most a short first and last one each;
            costs one extra pass that counts the examples of every partition, once per RDD with ``export``; see
            `torchspark.training.assignment`) or ``"spark_default"`` (every partition's own
            minibatches dealt round-robin over the workers in one shuffle, like Scala's ``rdd.repartition``: no
            counting pass; worker shares differ by up to one minibatch per input partition).
        rdd_training_approach: ``"export"`` (write the data once as batch files under ``export_directory`` and
            train from the paths; reused across fits of the same RDD; DL4J's recommendation) or ``"direct"``
            (train from the RDD, persisted at ``storage_level``).
        export_directory: where ``export`` writes (any fsspec URL). On a cluster it must be storage every executor
            can read: an ``hdfs://`` or ``s3://`` URL or a directory mounted on all hosts. Default (None): for
            local masters (``local``, ``local[N]``, ``local-cluster[...]``, one host) a private (0700, fresh
            ``mkdtemp`` name) ``torchspark-export-*`` directory under Spark's local directory
            (``spark.local.dir``, else the system temp directory), removed on ``SparkNetwork.close()``, garbage
            collection, interpreter exit, or by the next run when the driver was killed; any other
            master then fails before the first job with a ConfigError asking for an export_directory (or
            ``rdd_training_approach="direct"``), since executors would write to their own disks and workers on
            other hosts would get paths that do not exist there. ``SparkNetwork.delete_temp_files()`` (or
            ``close()``) removes the files; an explicit ``export_directory``'s exports stay until then (one a
            killed driver of this host left is removed by the next export to the same ``export_directory``).
        dataframe_route: how ``SparkNetwork.fit`` trains a DataFrame on a classic session. ``"rdd"`` (default):
            the rows become an RDD of minibatches and follow ``rdd_training_approach`` (the export is reused by
            later fits of the same DataFrame; ``direct`` keeps the minibatches persisted). ``"barrier_arrow"``: the
            Spark Connect route on a classic session: one barrier ``mapInArrow`` stage streams the rows straight
            into the workers every fit (no export files, nothing persisted; a survey, a tagging pass and a shuffle
            per fit), the same code path a Connect session always takes -- use it to check that a job behaves
            the same before moving it to Connect, or when no export directory is at hand. It takes the Connect
            route's settings: ``repartition="always"``, ``repartition_strategy="balanced"``, one barrier stage
            (``averaging_via="torch"``), ``num_workers`` (not ``workers_per_node``), no ``gpus_per_worker``.
            Measured in BENCHMARKS.md ("Spark Connect": one code path?), which says why ``"rdd"`` stays the
            default. RDD inputs always take the RDD routes; a Connect session always takes the Arrow route.
            Example: ``ParameterAveragingTrainingMaster(num_workers=2, dataframe_route="barrier_arrow")``.
        storage_level: persistence of the prepared RDD with ``direct``: a ``pyspark.StorageLevel`` name
            (`STORAGE_LEVELS`, e.g. ``"MEMORY_AND_DISK"`` when the data does not fit in executor memory).
        drop_last: train only full minibatches of ``batch_size_per_worker`` (as ``DataLoader(drop_last=True)``):
            the ``N % batch_size_per_worker`` remainder is not trained and workers get whole minibatches (their
            example counts then differ by up to one minibatch). Default False trains every example; either way the
            balanced split never leaves a worker an avoidable 1-example minibatch (BatchNorm cannot train on one).
            Needs ``repartition_strategy="balanced"`` and a repartition (not kept input partitions).
        collect_training_stats: record per-phase timings (see ``SparkNetwork.training_stats``).
        rng_seed: seeds the shuffle of minibatches (None: keep data order, no shuffle); the same seed and data give
            the same per-worker sequences on every run. ``"balanced"``: minibatches are shuffled across workers,
            identically with ``export``, ``direct`` and ``ParallelWrapper``. ``"spark_default"``: the round-robin
            deal starts at a seeded worker and each worker's minibatches are in a seeded random order.
            ``repartition="never"`` (or a kept partition): each worker's own minibatches in a seeded random order.
            Every epoch after the network's first gets a new order, a pure function of the seed and the network's
            epoch counter (`torchspark.training.assignment.epoch_seed`), as ``shuffle_scope`` says;
            ``averaging_via="spark"`` keeps one order per fit.
        shuffle_scope: what the per-epoch shuffle of ``rng_seed`` moves. ``"worker"`` (default): the seeded split
            of the minibatches over the workers is made once and kept for the whole run (every fit of the network);
            every epoch each worker trains its own minibatches in a new seeded order. No data moves between epochs,
            so shuffling costs nothing measurable (the direct route keeps its repartitioned data persisted, the
            export route reads the same files). ``"global"``: every epoch deals the minibatches to the workers anew
            (a new seeded plan across workers, as ``DistributedSampler.set_epoch`` does): the direct route then
            repartitions the whole data through Spark every epoch and the export/paths routes read other workers'
            files; on a fast network (BENCHMARKS.md "Shuffle between epochs": the MLP) that costs several times the
            training. Either way the minibatches themselves (which examples train together) are fixed by the
            balanced grid, and Spark routes and ``ParallelWrapper`` give identical sequences. ``"global"`` needs
            ``rng_seed`` and the balanced split (``repartition_strategy="balanced"``, ``repartition`` not
            ``"never"``). Example: ``SharedTrainingMaster(rng_seed=0, shuffle_scope="global")``.
        data_timeout_s: limit for waiting on one minibatch from storage.
        flush_denormal: flush denormal floats (below ~1.2e-38) to zero on the workers' CPU threads (default
            True). Adam's second moments and tiny gradients drift there after some epochs and x86 CPUs compute on
            them many times slower (BENCHMARKS.md, "Measurements behind design choices"). Values
            that small do not change training in practice; False keeps IEEE denormals (bit-for-bit comparisons
            with a process that does not flush). The task puts back the flush mode (and torch's thread count) it
            found when it ends, for the next task of a reused Python worker.
        max_failures: how many lost workers a fit survives (default 3; 0 = fail at the first). A worker, its
            process or its executor lost mid-fit (killed, out of memory, a node gone) or a peer that stops
            responding for ``rendezvous_timeout_s`` fails the running attempt; the driver then relaunches all
            workers (new processes / a new barrier stage) from the newest state it holds and the fit goes on.
            Errors in the user's code or data (``DataError``, a diverged loss, an exception in the model) are
            never retried. See `torchspark.training.driver.recovery`.
        min_workers: elastic recovery: the fewest workers a fit goes on with when a recovery attempt cannot get all
            ``num_workers`` back (an executor gone for good, a worker slot that keeps dying). None (default):
            ``num_workers``, every attempt runs all of them. Below it, the attempt continues from the newest
            checkpoint on fewer workers (the data re-dealt, gradient sharing's residuals summed into the remaining
            ranks) and it grows back when capacity returns (``regrow``); ``summary()["world_changes"]`` lists each
            change. Use it with a ``checkpoint_directory`` (else a smaller attempt restarts the fit) on clusters
            that lose nodes. Example: ``SharedTrainingMaster(num_workers=8, min_workers=4)``. See
            [`torchspark.training.driver.elastic`][torchspark.training.driver.elastic] and docs/guides/recovery.md.
        regrow: when a fit that shrank (``min_workers``) grows back to ``num_workers``: ``"epoch"`` at the first
            epoch boundary where the capacity is back (free task slots on Spark; the devices it was given on
            ``ParallelWrapper``), the workers ending their attempt there with a checkpoint, no failure needed;
            ``"attempt"`` only when the smaller world fails too; ``"never"``: the rest of the fit stays smaller.
            None (default): ``"epoch"`` with a ``checkpoint_directory`` (it needs one), else ``"attempt"``. Each
            epoch of a smaller world is then its own launch of the workers (a barrier stage: well under a second).
            Example: ``SharedTrainingMaster(num_workers=8, min_workers=4, regrow="attempt")``.
        stall_timeout_s: the progress watchdog (default 1800 s, torch.distributed's default collective timeout; None
            = off): an attempt in which no worker reports a new step for this long fails as a hang naming each rank's
            step, which the heartbeats and ``rendezvous_timeout_s`` cannot see when every worker hangs in the model's
            code at once; two such hangs at one step end the fit (not retried). Progress is reported every 10
            optimizer steps, and the first report of an attempt (rendezvous, first data, ``torch.compile``) may take
            twice as long. Raise it for very slow steps (huge minibatches or ``accumulate_steps``, a long compile);
            lower it (e.g. 120) to catch hangs of a fast model sooner. See [`torchspark.training.driver.stall`][torchspark.training.driver.stall].
        checkpoint_directory: where the fit writes checkpoints (any fsspec URL; on a cluster shared storage every
            executor can write and the driver can read, e.g. ``hdfs://...``/``s3://...``); None (default): no
            checkpoints. Each fit writes under ``<checkpoint_directory>/<run_id>/``; ``fit(..., run_id="r1")``
            continues run ``r1`` from its newest checkpoint (a new driver process too), with the same network,
            updater and data order (else ConfigError), skipping damaged checkpoints. One fit per run at a time (a
            ``run.lock``); on local storage checkpoints are private (0600/0700) and the driver and workers must run
            as one user; ``memory://`` only with workers in this process. See
            `torchspark.training.checkpoint` and `torchspark.training.driver.resume`.
        checkpoint_every: averaging rounds (parameter averaging) or exchange iterations, one per optimizer step
            (gradient sharing) between checkpoints; None (default): once per epoch. Work lost to a fault is at most one interval; each
            checkpoint writes every rank's state (parameters, updater state, residuals) once, so an interval of a
            few seconds of training or more keeps the overhead small.
        keep_checkpoints: the newest complete checkpoints kept per run (default 2; older ones are deleted).
        gpus_per_worker: GPUs each training task asks Spark for, only for the training stage (None, the default:
            the session's own ``spark.task.resource.gpu.amount``, if any). Use it when the session's defaults are
            CPU-only (so data preparation and evaluation tasks hold no GPU) but the executors have GPUs
            (``spark.executor.resource.gpu.amount`` and a discovery script): the training stage then runs under a
            stage-level task ``ResourceProfile`` asking ``gpus_per_worker`` GPUs (and ``spark.task.cpus`` cores)
            per task, and each worker trains on the GPU Spark assigned to its task. ``1`` is the usual value;
            a fraction (``<= 0.5``, e.g. ``0.5``: two workers per GPU) shares GPUs, which nccl cannot do, so the
            workers then talk over gloo; above 1 a whole number. Needs a cluster manager with stage-level
            scheduling (standalone ``spark://``, ``local-cluster``, YARN, Kubernetes; not ``local[N]``) and
            dynamic allocation off (as every barrier stage does). Example:
            ``SharedTrainingMaster(num_workers=8, gpus_per_worker=1)``. See docs/guides/gpus.md.
        port, port_range, network_mask, controller_address, rendezvous_via, rendezvous_timeout_s: with
            shared_memory_allreduce, the worker-mesh options (how workers find and talk to each other), validated and
            documented by
            [`MeshConfig`][torchspark.MeshConfig]; [`mesh`][torchspark.TrainingMaster.mesh] returns them as one frozen object and
            [`with_mesh`][torchspark.TrainingMaster.with_mesh] sets them all from one.
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

    Every worker takes ``averaging_frequency`` optimizer steps (minibatches; groups of ``accumulate_steps``
    minibatches with gradient accumulation) from the common parameters, then all workers replace
    their parameters (and updater state) by the example-weighted mean. Two routes give the same result (same data,
    seed and settings -> the same parameters, up to float rounding):

    * ``averaging_via="torch"`` (default): the whole fit runs inside one Spark barrier stage and the workers
      all-reduce over ``torch.distributed``. Fast (no per-round scheduling), but executors must reach each other
      on a TCP port (set ``TORCHSPARK_LOCAL_IP`` on executors with several network interfaces).
    * ``averaging_via="spark"``: DL4J's original route for clusters where executors cannot open ports to each
      other. Each round is one Spark job: the driver broadcasts the parameters, every worker fits its next
      ``averaging_frequency`` minibatches and returns ``params * n``, ``treeAggregate`` sums the results and the
      driver averages. Nothing but Spark traffic, and a failed task is simply retried by Spark; but every round
      pays a job (tens to hundreds of milliseconds of scheduling) and a broadcast of the parameters, so use a
      larger ``averaging_frequency`` (10-20) and ``rdd_training_approach="export"`` (with ``"direct"`` every round
      streams the worker's whole cached partition to Python). See `torchspark.spark.rounds`.

    Args:
        averaging_frequency: optimizer steps between averages (DL4J default 5; each step is ``accumulate_steps``
            minibatches). 1 = synchronous SGD with a bigger effective batch; 5-10 cuts communication; past ~20
            convergence suffers.
        save_updater: average and keep the updater state (momentum, Adam moments) across rounds. False resets
            it each round: half the traffic, but adaptive updaters restart every round.
        averaging_via: ``"torch"`` (all-reduce inside one barrier stage) or ``"spark"`` (one Spark job and
            ``treeAggregate`` per round; no worker-to-worker connections).
        aggregation_depth: ``treeAggregate`` depth for ``averaging_via="spark"`` (DL4J default 2). Each level
            sums partial results on executors before the driver receives them: 2 suits up to a few hundred
            workers; raise it to 3 when the driver's network or memory is the bottleneck with very many workers.
    See [`TrainingMaster`][torchspark.TrainingMaster] for the shared options.
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
