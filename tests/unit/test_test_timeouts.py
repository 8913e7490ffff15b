"""The suite's per-test timeout (pytest-timeout, ``[tool.pytest.ini_options]`` in pyproject.toml): a hanging test
fails with its name, and the run goes on to the next test (the signal method; the thread method would end it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HANGING = """
import threading

def test_hangs_forever():
    threading.Event().wait()  # no timeout: only pytest-timeout ends it

def test_runs_after_the_hang():
    assert True
"""


def test_a_hanging_test_fails_by_name_and_the_run_goes_on(tmp_path) -> None:
    (tmp_path / "test_hanging.py").write_text(HANGING)
    # the repository's configuration, with only the limit shortened for this check
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=3",
            "-q",
            str(tmp_path / "test_hanging.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "FAILED" in out and "test_hangs_forever" in out and "Timeout (>3.0s)" in out, out
    assert "1 failed, 1 passed" in out, out
