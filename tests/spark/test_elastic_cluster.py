"""Elastic recovery on local-cluster[2,1,1024]: the executor under rank 1 is killed for good mid-fit (the driver
kills it and lowers the executor target, so nothing replaces it); with ``min_workers=1`` the fit goes on with the
one executor left, from the checkpoint of epoch 1, and completes within 1 pp of the undisturbed fit's accuracy.
Runs in a child process (its own local-cluster session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # and spark, as every test of this folder

SCRIPT = Path(__file__).parent / "scripts" / "elastic_cluster_fit.py"


@pytest.fixture(scope="module")
def elastic_run(background_lane) -> dict:
    """The child's result (``scripts/elastic_cluster_fit.py``, run by the background lane of ``tests/background.py``),
    with ``"leftovers"``: the :class:`Leftovers` snapshot taken just before the child started."""
    proc = background_lane.result("elastic-cluster")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {**json.loads(lines[-1]), "leftovers": proc.before}


def test_an_executor_gone_for_good_shrinks_the_world_and_the_fit_completes(elastic_run) -> None:
    result = elastic_run
    assert "error" not in result, result.get("error")
    assert len(result["jvms"]) == 1 and result["executors_after"] == 1  # killed, and not replaced
    [failure] = result["failures"]
    assert failure["attempt"] == 0, failure
    [change] = result["world_changes"]
    assert (change["attempt"], change["old"], change["new"]) == (1, 2, 1), change
    assert change["epoch"] == 1 and "slot" in change["reason"], change  # from the checkpoint of epoch 1
    assert result["epoch"] == 3 and result["results"] == 1 and result["examples"] == 3 * 1437
    # at most 1 pp below the undisturbed fit (one worker takes twice the optimizer steps per epoch: it may be better)
    assert result["accuracy"] >= result["undisturbed_accuracy"] - 0.01, result
    result["leftovers"].assert_clean(gone=[*result["jvms"], *result["workers"]], pids=result["all_pids"])
