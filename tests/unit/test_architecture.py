"""The layout's rules, checked on the source: import-linter's contracts (pyproject.toml), no module over 600 lines
(split along seams, never to meet a number: a module of ~600 lines that holds one idea is fine), no private name imported across modules. A broken rule fails the build like any other test."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "torchspark"
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _lint_imports(config: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """import-linter in a child process (it builds its graph by importing the package: a child keeps this
    process's modules and logging untouched), reading the package from ``pythonpath``."""
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(config)!r}, no_cache=True))"
    )
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=config.parent
    )


def test_the_import_contracts_hold() -> None:
    done = _lint_imports(ROOT / "pyproject.toml", SRC.parent)
    assert done.returncode == 0, (
        f"import-linter contracts broken (run `lint-imports` in the repository root):\n{done.stdout}{done.stderr}"
    )


@pytest.mark.parametrize(
    "edit, contract",
    [
        (("training/hooks.py", "import torchspark.spark.network"), "The core never imports the adapters"),
        (("nn/network.py", "import torchspark.training.task"), "nn, encoding and evaluation never import training"),
        (("stats/events.py", "import pyspark"), "Only torchspark.spark imports pyspark"),
        (("training/comm/shm.py", "import torchspark.training.worker.loop"), "training: layers from the driver down"),
        (("training/task.py", "import torchspark.training.driver.fit"), "No import cycles"),
    ],
)
def test_an_import_against_the_layout_breaks_its_contract(tmp_path, edit, contract) -> None:
    """The checks themselves work: a copy of the package with one forbidden import is refused by that contract."""
    module, line = edit
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "torchspark", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "torchspark" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    done = _lint_imports(tmp_path / "pyproject.toml", copy)
    assert done.returncode != 0
    broken = [ln for ln in done.stdout.splitlines() if ln.rstrip().endswith("BROKEN")]
    assert len(broken) >= 1 and any(ln.startswith(contract) for ln in broken), done.stdout


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (limit {MAX_LINES}): split it at a seam"


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_no_private_name_is_imported_across_modules() -> None:
    """``from torchspark.x import _name`` reaches into another module's internals (a private *module*, such as
    ``torchspark._io``, is the library's own shared internals and may be imported)."""
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module or not node.module.startswith("torchspark"):
                continue
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and not _is_module(f"{node.module}.{name}"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {name}")
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)
