"""Recovery from a lost executor on local-cluster[3,1,1024] (separate executor JVMs): 2 workers train, the
executor JVM under rank 1 is killed (SIGKILL) or stopped (SIGSTOP) mid-fit; the driver relaunches the stage on
the executors left and the fit completes, without waiting for Spark's 120 s executor heartbeat timeout. Both
modes run in one child process, on one session, after one undisturbed reference fit."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.cluster  # and spark, as every test of this folder


@pytest.fixture(scope="module")
def recovery_cluster_runs(background_lane) -> dict:
    """Both fault modes (and the undisturbed reference fit) in one child process, ``scripts/recovery_cluster_fit.py``
    (one local-cluster session; the background lane of ``tests/background.py`` runs it). ``"leftovers"``: the
    :class:`Leftovers` snapshot taken just before the child started."""
    proc = background_lane.result("recovery-cluster")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {**json.loads(lines[-1]), "leftovers": proc.before}


def _run(runs: dict, mode: str) -> dict:
    """``mode``'s results with the shared ``undisturbed_accuracy`` and ``driver_pid``."""
    return {**runs[mode], "undisturbed_accuracy": runs["undisturbed_accuracy"], "driver_pid": runs["driver_pid"]}


def test_a_killed_executor_is_replaced_and_the_fit_completes(recovery_cluster_runs) -> None:
    result = _run(recovery_cluster_runs, "kill")
    assert "error" not in result, result.get("error")
    assert len(result["jvms"]) == 1 and result["jvms"][0] != result["driver_pid"]
    assert abs(result["accuracy"] - result["undisturbed_accuracy"]) <= 0.02, result
    [failure] = result["failures"]
    assert failure["rank"] == 1 and failure["attempt"] == 0, failure
    assert failure["executor"] is not None, failure  # Spark's executor id
    assert result["recovered_from"]["attempt"] == 1
    recovery_cluster_runs["leftovers"].assert_clean(gone=[*result["jvms"], *result["workers"]], pids=result["all_pids"])


def test_a_stopped_executor_is_noticed_within_the_rendezvous_timeout(recovery_cluster_runs) -> None:
    result = _run(recovery_cluster_runs, "stop")
    assert "error" not in result, result.get("error")
    assert abs(result["accuracy"] - result["undisturbed_accuracy"]) <= 0.02, result
    [failure] = result["failures"]
    assert failure["attempt"] == 0, failure
    # noticed by the peers' timeout or the driver's watchdog (20 s), not by Spark's 120 s heartbeat timeout
    assert failure["time"] - failure["started"] < 120, failure
    recovery_cluster_runs["leftovers"].assert_clean(gone=result["workers"], pids=result["all_pids"])
