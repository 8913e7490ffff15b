"""The package as a user gets it: the sdist and the wheel are built from the sources (``python -m build``, offline:
``--no-isolation`` with the setuptools pinned in constraints.txt), their metadata passes ``twine check --strict``
(the README renders on PyPI), the wheel carries ``py.typed``, and the wheel installed into a *fresh* virtual
environment trains: ``torchspark train --epochs 1`` runs from it, its Spark workers included.

The fresh environment gets the wheel with ``--no-deps`` and finds the dependencies (torch, pyspark, ...) in this
test run's environment through a ``.pth`` line: nothing is downloaded (torch stays the CPU wheel of constraints.txt)
and the test takes seconds plus one short training run. ``pip check`` there proves the wheel's requirements are met.
"""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import torchspark

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
#: what a build reads: the configuration, the long description, the license text, and the sources
BUILD_INPUTS = ("pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE")


def _run(args: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel, built from a copy of the sources (a build writes build/ and *.egg-info beside them)."""
    tree = tmp_path_factory.mktemp("tree")
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)], timeout=300)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def _wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode("utf-8"))


def test_metadata_passes_twine_check(dist) -> None:
    """``twine check --strict``: the metadata is valid and the README (the long description) renders."""
    done = _run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dist["wheel"]), str(dist["sdist"])], timeout=120
    )
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_wheel_carries_types_version_and_dependencies(dist) -> None:
    with zipfile.ZipFile(dist["wheel"]) as z:
        names = set(z.namelist())
    assert "torchspark/py.typed" in names  # PEP 561: users' type checkers read our hints
    assert "torchspark/cli.py" in names and "torchspark/spark/connect/runner.py" in names
    meta = _wheel_metadata(dist["wheel"])
    assert meta["Version"] == torchspark.__version__
    assert meta["Description-Content-Type"] == "text/markdown"
    core = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    # PyYAML is a core dependency: `--print-config` and `--config run.yaml` work on the base install
    assert any(r.lower().startswith("pyyaml") for r in core), core
    assert any(r.startswith("torch") for r in core), core
    # Spark is an extra (a Connect client needs no jars; the core trains on one machine without it)
    assert not any(r.startswith("pyspark") for r in core), core
    extras = {
        name: [r.split(";")[0].replace(" ", "") for r in meta.get_all("Requires-Dist") if f'extra == "{name}"' in r]
        for name in ("spark", "connect-client")
    }
    assert extras == {"spark": ["pyspark<5,>=4.0"], "connect-client": ["pyspark-client<5,>=4.0"]}, extras
    # the digits data ships in the wheel, so scikit-learn is not a core dependency (only the tests' parity checks use it)
    assert "torchspark/_data/digits.safetensors" in names
    assert not any(r.lower().startswith(("scikit-learn", "sklearn")) for r in core), core
    # the codec's one-pass kernel comes with the default install where numba has wheels, behind a marker
    numba = [r for r in core if r.startswith("numba")]
    assert len(numba) == 1 and "platform_machine" in numba[0] and "python_version" in numba[0], numba
    # the [connect] extra is pyspark's own (no hand copy of its client packages to drift)
    connect = [r for r in meta.get_all("Requires-Dist") if 'extra == "connect"' in r]
    assert [r.split(";")[0].replace(" ", "") for r in connect] == ["pyspark[connect]<5,>=4.0"], connect


def test_the_wheel_and_sdist_carry_the_apache_license(dist) -> None:
    """PEP 639: the SPDX expression in the metadata, the license text in the wheel's .dist-info and in the sdist."""
    meta = _wheel_metadata(dist["wheel"])
    assert meta["License-Expression"] == "Apache-2.0" and meta.get_all("License-File") == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    with zipfile.ZipFile(dist["wheel"]) as z:
        licenses = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert len(licenses) == 1 and z.read(licenses[0]).decode() == text
    with tarfile.open(dist["sdist"]) as t:
        member = next(m for m in t.getmembers() if m.name.split("/", 1)[-1] == "LICENSE")
        stream = t.extractfile(member)
        assert stream is not None and stream.read().decode() == text


def test_the_sdist_holds_the_sources_and_types(dist) -> None:
    with tarfile.open(dist["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "src/torchspark/py.typed", "src/torchspark/__init__.py"} <= names


@pytest.fixture(scope="module")
def fresh(dist, tmp_path_factory) -> Path:
    """A new virtual environment holding only the wheel; its dependencies come from this run's environment."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    python = venv / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60)
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    # a plain path line: this environment's packages become importable, its editable torchspark (a .pth hook) not
    (Path(site.stdout.strip()) / "torchspark_test_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            "-q",
            str(dist["wheel"]),
        ],
        timeout=300,
        # not our PYTHONPATH: with the sources' torchspark.egg-info on it (an earlier test may have set it for its
        # workers), pip takes the wheel as "already satisfied" and installs nothing
        env=_fresh_env(),
    )
    return venv


def _fresh_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH into our sources, and Spark's workers run the fresh
    environment's interpreter (the tests' conftest points PYSPARK_PYTHON at ours)."""
    drop = {"PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_the_installed_wheel_is_what_imports(fresh) -> None:
    python = fresh / "bin" / "python"
    where = _run([str(python), "-c", "import torchspark; print(torchspark.__file__)"], timeout=120, env=_fresh_env())
    assert Path(where.stdout.strip()).is_relative_to(fresh), where.stdout
    _run([str(python), "-m", "pip", "check"], timeout=120, env=_fresh_env())
    version = _run([str(fresh / "bin" / "torchspark"), "--version"], timeout=120, env=_fresh_env())
    assert version.stdout.startswith(f"torchspark {torchspark.__version__} (Python "), version.stdout


def test_print_config_round_trips_on_the_installed_wheel(fresh, tmp_path) -> None:
    """The issue's first stumble: ``--print-config`` (YAML) works on the base install, and reads back."""
    cli = str(fresh / "bin" / "torchspark")
    printed = _run([cli, "train", "--epochs", "3", "--print-config"], timeout=120, env=_fresh_env())
    (tmp_path / "run.yaml").write_text(printed.stdout)
    back = _run(
        [cli, "train", "--config", str(tmp_path / "run.yaml"), "--print-config", "json"], timeout=120, env=_fresh_env()
    )
    assert json.loads(back.stdout)["epochs"] == 3


@pytest.mark.timeout(900)  # one Spark session and one epoch on a loaded machine
def test_train_runs_from_the_installed_wheel(fresh, tmp_path) -> None:
    out = tmp_path / "out"
    # the mlp keeps this short; the command and its Spark route are the README's
    done = _run(
        [
            str(fresh / "bin" / "torchspark"),
            "train",
            "--epochs",
            "1",
            "--model",
            "mlp",
            "--no-progress",
            "--output",
            str(out),
        ],
        timeout=840,
        env=_fresh_env(),
        cwd=tmp_path,
    )
    assert "accuracy" in done.stdout, done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics, metrics
    assert (out / "model").is_dir() and (out / "stats.html").is_file()


#: what a Connect-only user has not: pyspark's jars and py4j (pyspark-client brings the ``pyspark`` module alone)
_CLASSIC_ONLY = ("pyspark", "py4j", "torchspark", "_torchspark", "__editable__")


@pytest.fixture(scope="module")
def connect_client(dist, tmp_path_factory) -> Path:
    """A fresh environment as ``pip install 'torchspark[connect-client]'`` makes it: the wheel, pyspark-client from the
    package index (``--no-deps``), and the other dependencies from this run's environment without pyspark and py4j
    (a directory of links on a ``.pth`` line). Skipped, saying so, when the index has no pyspark-client."""
    venv = tmp_path_factory.mktemp("client-venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60
        ).stdout.strip()
    )
    deps = tmp_path_factory.mktemp("client-deps")
    for ours in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(ours).iterdir():
            if not entry.name.startswith(_CLASSIC_ONLY) and not (deps / entry.name).exists():
                (deps / entry.name).symlink_to(entry)
    (site / "torchspark_test_deps.pth").write_text(f"{deps}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q"]
    client = subprocess.run(
        [*pip, "pyspark-client>=4.0,<5"], capture_output=True, text=True, timeout=600, env=_fresh_env()
    )
    if client.returncode != 0:
        pytest.skip(f"the package index has no pyspark-client for the Connect-only install: {client.stderr[-500:]}")
    _run([*pip, "--no-index", "--force-reinstall", str(dist["wheel"])], timeout=300, env=_fresh_env())
    return venv


@pytest.mark.timeout(1200)  # a Connect server's start and one epoch on a loaded machine
def test_a_connect_only_install_trains_through_a_connect_server(connect_client, tmp_path) -> None:
    """``torchspark[connect-client]``: no jars, no py4j, the wheel's requirements met (``pip check``), and ``train
    --remote`` trains through a Spark Connect server (started here with this run's full pyspark, as a cluster's
    server would be; its executors run this run's interpreter)."""
    from torchspark.spark.connect import start_connect_server

    python = str(connect_client / "bin" / "python")
    probe = "import importlib.util, os, pyspark; print(importlib.util.find_spec('py4j') is None, "
    probe += "os.path.isdir(os.path.join(os.path.dirname(pyspark.__file__), 'jars')), pyspark.__file__)"
    found = _run([python, "-c", probe], timeout=120, env=_fresh_env()).stdout.split()
    assert found[:2] == ["True", "False"] and Path(found[2]).is_relative_to(connect_client), found
    _run([python, "-m", "pip", "check"], timeout=120, env=_fresh_env())
    out = tmp_path / "out"
    with start_connect_server("local[2]") as server:
        done = _run(
            [str(connect_client / "bin" / "torchspark"), "train", "--remote", server.url, "--model", "mlp"]
            + ["--epochs", "1", "--no-progress", "--output", str(out)],
            timeout=1100,
            env=_fresh_env(),
            cwd=tmp_path,
        )
    assert "accuracy" in done.stdout, done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["spark_master"] == server.url and metrics["accuracy"] > 0.3, metrics
