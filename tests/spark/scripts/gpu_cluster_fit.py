"""Run by ``tests/spark/test_gpu_scheduling.py`` in its own process: Spark GPU scheduling on a machine without
CUDA, the way Spark's own tests do it. One local-cluster[1,2,1024] session whose worker and executor own two fake
GPUs (a discovery script printing ``{"name": "gpu", "addresses": ["0", "1"]}``); the session's defaults ask no GPU
per task, so only a stage-level profile (the master's ``gpus_per_worker``) gives the training tasks GPUs.

The fits run with the testing aid ``TORCHSPARK_GPU_DRY_RUN=1`` (tasks record the GPU Spark assigned and train on
the CPU, as torch here has no CUDA) except ``preflight``, which checks the executors' missing CUDA is reported
before any training stage.

Usage: ``gpu_cluster_fit.py [CHECK ...]`` with CHECK in :data:`CHECKS` (default: all). Prints one JSON line:
check name -> its results, or ``{"error": traceback}`` if that check raised (the others still run)."""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import traceback

from torchspark import Network, datasets, models, optim
from torchspark.errors import ConfigError, SetupError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session
from torchspark.training.worker.env import GPU_DRY_RUN

DISCOVERY = '#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n'


def _session(directory: str):
    script = os.path.join(directory, "gpus.sh")
    with open(script, "w") as f:
        f.write(DISCOVERY)
    os.chmod(script, stat.S_IRWXU)
    return local_session(
        master="local-cluster[1,2,1024]",
        app_name="torchspark-gpu-tests",
        conf={
            "spark.worker.resource.gpu.amount": 2,
            "spark.worker.resource.gpu.discoveryScript": script,
            "spark.executor.resource.gpu.amount": 2,
            "spark.executor.resource.gpu.discoveryScript": script,
        },
    )


def _stages(sc) -> list[dict]:
    """Every stage the session ran: its job's description, resource profile id and task count."""
    store, tracker, out, job = sc._jsc.sc().statusStore(), sc.statusTracker(), [], 0
    while (info := tracker.getJobInfo(job)) is not None:
        for stage_id in info.stageIds:
            data = store.lastStageAttempt(stage_id)
            description = data.description()
            out.append(
                {
                    "job": job,
                    "description": None if description.isEmpty() else description.get(),
                    "profile": data.resourceProfileId(),
                    "tasks": data.numTasks(),
                }
            )
        job += 1
    return out


def _task_gpus(_) -> list:
    from pyspark import TaskContext

    return [list(TaskContext.get().resources().get("gpu").addresses) if "gpu" in TaskContext.get().resources() else []]


def _fit(spark, master, dry_run: bool = True) -> dict:
    sc = spark.sparkContext
    data = datasets.synthetic_classification(64, 6, 3, seed=0)
    net = Network(models.mlp(6, 8, 3), updater=optim.SGD(lr=0.1), seed=0)
    os.environ[GPU_DRY_RUN] = "1" if dry_run else "0"
    jobs_before = len(_stages(sc))
    try:
        with SparkNetwork(spark, net, master, progress=False) as spark_net:
            spark_net.fit(sc.parallelize(data.split(8), 2))
            summary = spark_net.training_stats.summary()
            backends = sorted({(r.network or {}).get("backend") for r in spark_net.last_results} - {None})
    finally:
        os.environ.pop(GPU_DRY_RUN, None)
    etl = sc.parallelize(range(2), 2).mapPartitions(_task_gpus).collect()  # a stage without the profile
    return {
        "devices": summary.get("devices"),
        "gpu_addresses": summary.get("gpu_addresses"),
        "executors": summary.get("executors"),
        "backends": backends,
        "etl_gpus": etl,
        "stages": _stages(sc)[jobs_before:],
    }


def barrier(spark) -> dict:
    return _fit(
        spark,
        ParameterAveragingTrainingMaster(
            batch_size_per_worker=8, num_workers=2, gpus_per_worker=1, collect_training_stats=True
        ),
    )


def barrier_without_gpus(spark) -> dict:
    """The same fit without ``gpus_per_worker``: the session's defaults give the tasks no GPU."""
    return _fit(
        spark, ParameterAveragingTrainingMaster(batch_size_per_worker=8, num_workers=2, collect_training_stats=True)
    )


def rounds(spark) -> dict:
    return _fit(
        spark,
        ParameterAveragingTrainingMaster(
            batch_size_per_worker=8,
            num_workers=2,
            gpus_per_worker=1,
            averaging_via="spark",
            collect_training_stats=True,
        ),
    )


def preflight(spark) -> dict:
    """Without the dry run: torch on the executor has no CUDA, so the fit must fail before its training stage."""
    before = len(_stages(spark.sparkContext))
    try:
        _fit(
            spark,
            ParameterAveragingTrainingMaster(batch_size_per_worker=8, num_workers=2, gpus_per_worker=1),
            dry_run=False,
        )
        return {"error": "no SetupError"}
    except SetupError as e:
        return {"message": str(e), "stages": _stages(spark.sparkContext)[before:]}


def too_many(spark) -> dict:
    try:
        _fit(spark, ParameterAveragingTrainingMaster(num_workers=2, gpus_per_worker=4))
        return {"error": "no ConfigError"}
    except ConfigError as e:
        return {"message": str(e)}


def _ranks_gpus() -> list:
    """Inside ``run(fn)``: every rank's GPU addresses (as Spark assigned them to its task), device and backend."""
    import torch.distributed as dist
    from pyspark import TaskContext

    from torchspark.launch import get_context

    dist.init_process_group("gloo")
    resources = TaskContext.get().resources()
    ctx = get_context()
    mine = {
        "gpus": list(resources["gpu"].addresses) if "gpu" in resources else [],
        "device": ctx.device,
        "backend": ctx.backend,
        "local_rank": os.environ["LOCAL_RANK"],
    }
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    dist.destroy_process_group()
    return every


def run_fn(spark) -> dict:
    """``torchspark.launch.run(fn, use_gpu=True)``: the session gives tasks no GPU, so a stage-level profile does."""
    from torchspark.launch import run

    sc = spark.sparkContext
    before = len(_stages(sc))
    os.environ[GPU_DRY_RUN] = "1"
    try:
        ranks = run(_ranks_gpus, num_workers=2, use_gpu=True, spark=spark)
    finally:
        os.environ.pop(GPU_DRY_RUN, None)
    return {"ranks": ranks, "stages": _stages(sc)[before:]}


#: in this order (the first fit's preflight waits for the executor to register)
CHECKS = {
    "barrier": barrier,
    "barrier_without_gpus": barrier_without_gpus,
    "rounds": rounds,
    "preflight": preflight,
    "too_many": too_many,
    "run_fn": run_fn,
}

if __name__ == "__main__":
    wanted = sys.argv[1:] or list(CHECKS)
    scripts = tempfile.TemporaryDirectory(prefix="torchspark-fake-gpus-")
    session = _session(scripts.name)
    results = {}
    try:
        for name in wanted:
            try:
                results[name] = CHECKS[name](session)
            except Exception:  # noqa: BLE001 - reported to the test, which shows it
                results[name] = {"error": traceback.format_exc()}
    finally:
        session.stop()
        scripts.cleanup()
    print(json.dumps(results))
