"""Runs tests/connect (the Spark Connect tier) in a child pytest process.

A Spark Connect client switches pyspark into its process-wide Connect mode (``SPARK_CONNECT_MODE_ENABLED``), after
which a classic ``SparkSession.builder`` in the same process builds Connect sessions too; the tier therefore gets
its own process, exactly as a Connect client application has. This test fails when any test there fails, and
shows the child's report.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: the variable that lets tests/conftest.py collect tests/connect (``CONNECT_TIER_ENV`` there; tests/spark has a
#: conftest.py of its own, so that module cannot be imported by name here)
CONNECT_TIER_ENV = "TORCHSPARK_CONNECT_TESTS"

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(3600)  # the whole Connect tier in a child pytest (its own limit is 3000 s)
def test_the_spark_connect_tier_passes():
    env = dict(os.environ, **{CONNECT_TIER_ENV: "1"})
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    env.pop("SPARK_REMOTE", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rfEs",
            "-n",
            "0",
            os.path.join(TESTS, "connect"),
        ],
        cwd=os.path.dirname(TESTS),
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    report = (done.stdout + done.stderr)[-12000:]
    assert done.returncode == 0, f"tests/connect failed (exit {done.returncode}):\n{report}"
    assert " passed" in done.stdout, report
