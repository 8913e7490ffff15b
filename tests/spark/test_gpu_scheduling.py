"""Spark GPU scheduling on local-cluster[1,2,1024] with two fake GPUs (a discovery script, as Spark's own tests do
it): which GPU address each rank was given (the fit's summary records it), the stage-level profile on the training
stage only, and the preflight's error when torch on the executors has no CUDA. All fits run once, in one child
process on one session (``scripts/gpu_cluster_fit.py``); the decisions themselves are unit-tested in
``tests/unit/test_gpu_plan.py``."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.cluster  # and spark, as every test of this folder

FIT = "torchspark fit: "  # the training stage's job description (the barrier route)
ROUND = "torchspark averaging: "  # each round's (averaging_via="spark")


@pytest.fixture(scope="module")
def gpu_runs(background_lane) -> dict:
    """``scripts/gpu_cluster_fit.py``'s results (the background lane of ``tests/background.py`` runs it)."""
    proc = background_lane.result("gpu-scheduling")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1])


def _run(runs: dict, name: str) -> dict:
    result = runs[name]
    assert "error" not in result, result["error"]
    return result


def _training_stages(result: dict, prefix: str) -> list[dict]:
    return [s for s in result["stages"] if (s["description"] or "").startswith(prefix)]


def test_each_rank_trains_on_the_gpu_spark_assigned_to_its_task(gpu_runs) -> None:
    result = _run(gpu_runs, "barrier")
    addresses = result["gpu_addresses"]
    assert sorted(addresses) == ["0", "1"] and all(len(a) == 1 for a in addresses.values()), addresses
    assert {addresses["0"][0], addresses["1"][0]} == {"0", "1"}  # two tasks never hold the same GPU
    assert len(set(result["executors"].values())) == 1  # ... of the one executor that owns both
    # the dry run (torch here has no CUDA) trains on the CPU, so the workers agreed on gloo
    assert result["devices"] == {"0": "cpu", "1": "cpu"} and result["backends"] == ["gloo"]


def test_without_gpus_per_worker_the_cpu_only_defaults_give_no_gpu(gpu_runs) -> None:
    result = _run(gpu_runs, "barrier_without_gpus")
    assert result["gpu_addresses"] == {"0": [], "1": []}
    [stage] = _training_stages(result, FIT)
    assert stage["profile"] == 0


def test_only_the_training_stage_runs_under_the_gpu_profile(gpu_runs) -> None:
    result = _run(gpu_runs, "barrier")
    [stage] = _training_stages(result, FIT)
    assert stage["profile"] != 0 and stage["tasks"] == 2, result["stages"]
    others = [s for s in result["stages"] if s is not stage]
    assert others and all(s["profile"] == 0 for s in others), others  # counting, export, probes: no GPUs
    assert result["etl_gpus"] == [[], []]  # a later ETL stage's tasks hold no GPU


def test_every_averaging_round_asks_a_gpu_per_task(gpu_runs) -> None:
    result = _run(gpu_runs, "rounds")
    rounds = _training_stages(result, ROUND)
    assert rounds and all(s["profile"] != 0 for s in rounds), result["stages"]
    assert all(s["profile"] == 0 for s in result["stages"] if s not in rounds)
    # each round is a new task: a rank got one of the GPUs (not necessarily the other rank's other one)
    assert sorted(result["gpu_addresses"]) == ["0", "1"]
    assert all(len(a) == 1 and a[0] in ("0", "1") for a in result["gpu_addresses"].values())


def test_executors_without_cuda_fail_the_fit_before_its_training_stage(gpu_runs) -> None:
    result = _run(gpu_runs, "preflight")
    message = result["message"]
    assert message.startswith(
        "gpus_per_worker=1 gives every training task a GPU, but torch on the executors cannot use it"
    ), message
    assert "executor " in message and "/work/app-" in message  # the executor: host and its working directory
    assert "has no CUDA (a CPU-only build)" in message and "Install a CUDA build of torch" in message
    # only the probes ran: no data export, no training stage
    assert result["stages"] and all(s["description"] is None for s in result["stages"]), result["stages"]


def test_more_gpus_per_worker_than_an_executor_owns_is_refused(gpu_runs) -> None:
    message = _run(gpu_runs, "too_many")["message"]
    assert "gpus_per_worker=4 but every executor owns spark.executor.resource.gpu.amount=2" in message


def test_run_fn_gives_each_rank_the_gpu_spark_assigned_to_its_task(gpu_runs) -> None:
    result = _run(gpu_runs, "run_fn")
    gpus = [rank["gpus"] for rank in result["ranks"]]
    assert all(len(g) == 1 for g in gpus) and sorted(g[0] for g in gpus) == ["0", "1"], gpus  # one GPU each
    # the dry run trains on the CPU (torch here has no CUDA): the context says gloo
    assert {(r["device"], r["backend"], r["local_rank"]) for r in result["ranks"]} == {("cpu", "gloo", "0")}
    stages = [s for s in result["stages"] if s["description"] == "torchspark run"]
    assert stages and all(s["profile"] != 0 and s["tasks"] == 2 for s in stages)  # under the stage-level profile
