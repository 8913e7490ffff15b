"""Fixtures of the Spark tier that start sessions of their own (in child processes)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def local_cluster_runs(background_lane) -> dict:
    """Every local-cluster[2,1,1024] check of ``scripts/local_cluster_fit.py``, run once in one child process
    (one local-cluster session for all of them; the background lane of ``tests/background.py`` starts it when the
    session starts): check name -> its results (``{"error": traceback}`` if it raised)."""
    proc = background_lane.result("local-cluster")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1])
