"""The Spark driver JVM killed mid-fit: a TrainingError that says so, not py4j's raw ConnectionRefusedError.

A session of its own in a subprocess (killing the shared fixture's JVM would end every later test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark


@pytest.mark.timeout(300)
def test_a_killed_driver_jvm_is_named_with_its_signal() -> None:
    script = Path(__file__).with_name("_kill_jvm.py")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=280, check=False)
    [line] = [ln for ln in run.stdout.splitlines() if ln.startswith("ERROR ")] or [
        f"no ERROR line: {run.stderr[-3000:]}"
    ]
    assert line.startswith("ERROR TrainingError: "), line
    assert "the Spark driver JVM died (exit code 137 (signal SIGKILL))" in line, line
    assert "Start a new SparkSession" in line and "run_id" in line, line
