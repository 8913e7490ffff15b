"""The checks engineers expect, run as tests so ``.ci/run`` (the README's one pytest command) enforces them: ruff's
lint rules and its formatter over the code, and mypy over ``src/`` (all configured in ``pyproject.toml``). A failure
shows the tool's own output; the fix is usually the command in the message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the folders of Python code the lint and format rules cover
CODE = ["src", "tests", "benchmarks", "examples"]


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <tool> args`` in the repository root (the tools read their configuration from pyproject.toml)."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", *CODE, timeout=300)
    assert done.returncode == 0, (
        f"ruff check found problems (`ruff check --fix {' '.join(CODE)}` fixes most):\n{done.stdout}{done.stderr}"
    )


def test_the_code_is_formatted() -> None:
    done = _run("ruff", "format", "--check", "--no-cache", *CODE, timeout=300)
    assert done.returncode == 0, (
        f"files not in the formatter's style (run `ruff format {' '.join(CODE)}`):\n{done.stdout}{done.stderr}"
    )


def test_the_formatter_covers_every_module_of_src() -> None:
    """Every module of the library is in the formatter's style, excluded or not: named one by one on the command
    line, ruff ignores an ``exclude`` list (without ``--force-exclude``). A module the style would push past the
    450-line limit (tests/unit/test_architecture.py) is split at a seam, not left out."""
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.py") if "__pycache__" not in p.parts)
    done = _run("ruff", "format", "--check", "--no-cache", *modules, timeout=300)
    assert done.returncode == 0, f"modules not in the formatter's style (run `ruff format src`):\n{done.stdout}"


@pytest.mark.timeout(900)  # a cold mypy run over ~190 modules and torch's stubs takes minutes on a loaded machine
def test_mypy_is_clean_on_src(mypy_run) -> None:
    done = mypy_run  # `python -m mypy` in the repository root, run by the background lane (tests/background.py)
    assert done.returncode == 0, (
        f"mypy found type errors (run `mypy` in the repository root):\n{done.stdout}{done.stderr}"
    )
