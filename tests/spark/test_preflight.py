"""Preflight refuses sessions a barrier stage cannot use, before launching anything, with a message that says
what to change. Each check needs its own SparkSession; they run one after the other in one child process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "preflight_checks.py"


def _python_without_torch() -> str | None:
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if not candidate or os.path.realpath(candidate) == os.path.realpath(sys.executable):
            continue
        probe = subprocess.run([candidate, "-c", "import sys; import torch"], capture_output=True, timeout=60)
        version = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
        if probe.returncode != 0 and version == str(sys.version_info[:2]):
            return candidate
    return None


@pytest.fixture(scope="module")
def checks() -> dict[str, str]:
    """Every check in one child process (each on a session of its own): check name -> the SetupError message.
    ``executor_without_torch`` only where an interpreter without torch exists."""
    other = _python_without_torch()
    args = ["--python", other, "dynamic_allocation", "executor_without_torch"] if other else ["dynamic_allocation"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYSPARK_PYTHON=sys.executable),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"python": other, **json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])}


def test_dynamic_allocation_fails_fast(checks) -> None:
    message = checks["dynamic_allocation"]
    assert message.startswith("spark.dynamicAllocation.enabled=true, but barrier stages need a fixed set"), checks
    assert "spark.dynamicAllocation.enabled=false" in message, checks  # says what to change


def test_executors_without_torch_fail_fast(checks) -> None:
    other = checks["python"]
    if other is None:
        pytest.skip("no interpreter of this Python version without torch on this machine")
    assert "cannot import torch" in checks["executor_without_torch"], checks
    assert "No module named" in checks["executor_without_torch"], checks
    assert other in checks["executor_without_torch"], checks  # names the interpreter to fix
