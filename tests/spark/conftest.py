"""Fixtures of the Spark tier that start sessions of their own (in child processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LOCAL_CLUSTER_SCRIPT = Path(__file__).parent / "scripts" / "local_cluster_fit.py"


@pytest.fixture(scope="session")
def local_cluster_runs() -> dict:
    """Every local-cluster[2,1,1024] check of ``scripts/local_cluster_fit.py``, run once in one child process
    (one local-cluster session for all of them): check name -> its results (``{"error": traceback}`` if it
    raised)."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, str(LOCAL_CLUSTER_SCRIPT)], capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1])
