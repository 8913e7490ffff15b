"""GPU scheduling decisions, without Spark: the backend the workers agree on, how the training stage asks Spark
for GPUs (``gpus_per_worker`` against the session's settings), the preflight's verdict on the executors' CUDA, and
the per-rank placement in the fit's summary. The same decisions on a real local-cluster with fake GPUs:
``tests/spark/test_gpu_scheduling.py``."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch.distributed as dist

from torchspark.errors import ConfigError
from torchspark.parallel.options import check_local_master
from torchspark.spark.gpus import GpuRequest, dry_run_requested, gpu_request
from torchspark.spark.preflight import ExecutorCuda, cuda_problems
from torchspark.stats import DRIVER_ID, StatsCollector
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, master_from_json
from torchspark.training.config.shared_master import SharedTrainingMaster
from torchspark.training.driver.stats import build_training_stats
from torchspark.training.task import WorkerResult
from torchspark.training.worker.devices import agree_backend, backend_for_devices, choose_backend


@pytest.mark.parametrize(
    ("devices", "gpus", "backend", "reason"),
    [
        (["cpu", "cpu"], None, "gloo", "every worker trains on the CPU"),
        (["cuda:0", "cuda:1"], None, "nccl", "a GPU of its own"),
        (["cuda:0", "cpu", "cuda:1"], None, "gloo", "worker(s) [1] train on the CPU"),  # a mix
        (["cuda:0", "cuda:0"], None, "gloo", "share a GPU"),  # one host, one GPU, two workers
        (["cuda:0", "cuda:0"], ["hostA/GPU-1", "hostB/GPU-2"], "nccl", "a GPU of its own"),  # same name, two hosts
        (["cuda:0", "cuda:1"], ["h/GPU-1", "h/GPU-1"], "gloo", "share a GPU (h/GPU-1)"),
    ],
)
def test_the_backend_is_nccl_only_when_every_worker_has_a_gpu_of_its_own(devices, gpus, backend, reason) -> None:
    choice = choose_backend(devices, gpus)
    assert choice.backend == backend and reason in choice.reason
    assert backend_for_devices(devices, gpus) == backend


@pytest.mark.parametrize(
    ("devices", "gpus", "backend"),
    [
        (["cpu", "cpu"], [None, None], "gloo"),
        (["cuda:0", "cuda:0"], ["hostA/GPU-1", "hostB/GPU-2"], "nccl"),
        (["cuda:0", "cpu"], ["hostA/GPU-1", None], "gloo"),
        (["cuda:0", "cuda:1"], ["hostA/GPU-1", "hostA/GPU-1"], "gloo"),
    ],
)
def test_workers_agree_on_the_backend_through_the_rendezvous_store(devices, gpus, backend) -> None:
    """Each rank knows only its own device; after ``agree_backend`` through a real TCPStore every rank holds the
    same decision, the one ``choose_backend`` makes over the whole list."""
    timeout = datetime.timedelta(seconds=30)
    server = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timeout, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, is_master=False, timeout=timeout)
    stores = [dist.PrefixStore("fit/", server), dist.PrefixStore("fit/", client)]
    chosen: dict[int, str] = {}

    def rank(r: int) -> None:
        chosen[r] = agree_backend(stores[r], r, 2, devices[r], gpus[r]).backend

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert chosen == {0: backend, 1: backend}


EXECUTOR_GPUS = {"spark.executor.resource.gpu.amount": "2"}


@pytest.mark.parametrize(
    ("conf", "master", "option", "expected"),
    [
        ({}, "local[2]", None, GpuRequest(0.0, False, "")),  # CPU-only session, no option: no GPUs
        (
            {"spark.task.resource.gpu.amount": "1", **EXECUTOR_GPUS},
            "spark://h:7077",
            None,
            GpuRequest(1.0, False, "spark.task.resource.gpu.amount=1"),
        ),  # the session's defaults give them
        (
            {"spark.task.resource.gpu.amount": "1", **EXECUTOR_GPUS},
            "spark://h:7077",
            1,
            GpuRequest(1.0, False, "spark.task.resource.gpu.amount=1"),
        ),  # the same amount: no profile needed
        (EXECUTOR_GPUS, "local-cluster[1,2,1024]", 1, GpuRequest(1.0, True, "gpus_per_worker=1")),
        (EXECUTOR_GPUS, "yarn", 0.5, GpuRequest(0.5, True, "gpus_per_worker=0.5")),
        (
            {"spark.task.resource.gpu.amount": "0.5", **EXECUTOR_GPUS},
            "k8s://h",
            2,
            GpuRequest(2.0, True, "gpus_per_worker=2"),
        ),
    ],
)
def test_the_training_stage_asks_gpus_from_the_option_or_the_session(conf, master, option, expected) -> None:
    assert gpu_request(conf, master, option) == expected


@pytest.mark.parametrize(
    ("conf", "master", "option", "message"),
    [
        (EXECUTOR_GPUS, "local[4]", 1, "needs stage-level scheduling, which Spark does not offer in local mode"),
        ({}, "spark://h:7077", 1, "the session's executors own none: set spark.executor.resource.gpu.amount"),
        (
            EXECUTOR_GPUS,
            "spark://h:7077",
            4,
            "gpus_per_worker=4 but every executor owns spark.executor.resource.gpu.amount=2",
        ),
        ({"spark.task.resource.gpu.amount": "one"}, "yarn", None, "is not a number"),
    ],
)
def test_a_gpu_request_that_cannot_work_is_refused(conf, master, option, message) -> None:
    with pytest.raises(ConfigError, match=message):
        gpu_request(conf, master, option)


def test_gpus_per_worker_is_validated_round_trips_and_is_refused_by_parallel_wrapper() -> None:
    master = SharedTrainingMaster(gpus_per_worker=1)
    assert master_from_json(master.to_json()) == master and master.gpus_per_worker == 1
    assert ParameterAveragingTrainingMaster(gpus_per_worker=0.25).gpus_per_worker == 0.25
    for bad, message in (
        (0, r"gpus_per_worker must be a finite number > 0 or None"),
        ("1", "gpus_per_worker must be"),
        (True, "gpus_per_worker must be"),
        (1.5, "at most 0.5 or a whole number .* got 1.5"),
    ):
        with pytest.raises(ConfigError, match=message):
            ParameterAveragingTrainingMaster(gpus_per_worker=bad)
    with pytest.raises(ConfigError, match=r"gpus_per_worker=1 would be ignored"):
        check_local_master(master, {})  # ParallelWrapper places its workers itself


def test_the_dry_run_is_asked_for_explicitly() -> None:
    assert dry_run_requested({"TORCHSPARK_GPU_DRY_RUN": "1"})
    assert not dry_run_requested({}) and not dry_run_requested({"TORCHSPARK_GPU_DRY_RUN": "0"})


def test_the_preflight_names_every_executor_whose_torch_cannot_use_the_gpus() -> None:
    fine = ExecutorCuda("2.5.0+cu124", True, "12.4")
    found = {
        "h1:/work/0": fine,
        "h2:/work/1": ExecutorCuda("2.5.0+cpu", False, None),
        "h3:/work/2": ExecutorCuda("2.5.0+cu121", True, "12.1"),
        "h4:/work/3": ExecutorCuda("2.5.0+cu124", False, "12.4"),
    }
    assert cuda_problems(found, "12.4") == [
        "executor h2:/work/1: torch 2.5.0+cpu has no CUDA (a CPU-only build)",
        "executor h3:/work/2: torch 2.5.0+cu121 is built for CUDA 12.1, the driver's for CUDA 12.4",
        "executor h4:/work/3: torch 2.5.0+cu124 has no CUDA (built for CUDA 12.4, but no GPU or driver is usable)",
    ]
    assert cuda_problems({"h3:/work/2": found["h3:/work/2"]}, None) == []  # a CPU driver expects no version
    assert cuda_problems({"h1:/work/0": fine}, "12.4") == []


def test_the_summary_records_each_ranks_gpus_device_and_executor() -> None:
    results = [
        WorkerResult(1, 8, 1, 0.5, device="cuda:0", gpu_addresses=("1",), executor="h:/work/0"),
        WorkerResult(0, 8, 1, 0.5, device="cuda:1", gpu_addresses=("0",), executor="h:/work/0"),
    ]
    summary = build_training_stats(StatsCollector(DRIVER_ID, enabled=True), results, 1).summary()
    assert summary["gpu_addresses"] == {"0": ["0"], "1": ["1"]}
    assert summary["devices"] == {"0": "cuda:1", "1": "cuda:0"}
    assert summary["executors"] == {"0": "h:/work/0", "1": "h:/work/0"}
    unreported = build_training_stats(StatsCollector(DRIVER_ID, enabled=True), [WorkerResult(0, 8, 1, 0.5)], 1)
    assert "gpu_addresses" not in unreported.summary() and "devices" not in unreported.summary()
