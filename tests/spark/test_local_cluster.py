"""Training on local-cluster[2,1,1024]: two executor processes, as on a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

SCRIPT = Path(__file__).parent / "scripts" / "local_cluster_fit.py"


def _run(mode: str) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(SCRIPT), mode], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1])


def test_averaging_on_local_cluster() -> None:
    result = _run("averaging")
    assert result["accuracy"] >= 0.95, result
    assert result["driver_pid"] not in result["executor_pids"]
    assert len(result["executor_pids"]) >= 2  # separate executor processes did the work
    assert result["distributed_accuracy"] == result["accuracy"]  # evaluation on the executors, merged exactly


def test_gradient_sharing_on_local_cluster() -> None:
    result = _run("sharing")
    assert result["accuracy"] >= 0.95, result
    assert len(result["executor_pids"]) >= 2 and result["driver_pid"] not in result["executor_pids"]
    extra = result["extra"]
    assert extra["sharing.replicas_identical"] is True
    assert extra["sharing.world_size"] == 2
    assert 0 < extra["sharing.bytes_sent"] <= 0.05 * extra["sharing.dense_bytes"], extra
