"""Runs tests/connect (the Spark Connect tier) in a child pytest process.

A Spark Connect client switches pyspark into its process-wide Connect mode (``SPARK_CONNECT_MODE_ENABLED``), after
which a classic ``SparkSession.builder`` in the same process builds Connect sessions too; the tier therefore gets
its own process, exactly as a Connect client application has. The child starts when the session starts and runs
beside the other tests (``"connect-tier"`` in tests/background.py, the ``connect_tier_run`` fixture); this test
fails when any test there fails, and shows the child's report.
"""

from __future__ import annotations

import pytest


@pytest.mark.timeout(3600)  # the whole Connect tier in a child pytest (its own limit is 3000 s)
def test_the_spark_connect_tier_passes(connect_tier_run):
    done = connect_tier_run
    report = (done.stdout + done.stderr)[-12000:]
    assert done.returncode == 0, f"tests/connect failed (exit {done.returncode}):\n{report}"
    assert " passed" in done.stdout, report
