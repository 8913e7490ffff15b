"""The documentation site builds strictly and covers the public API and the command line.

``mkdocs build --strict`` (mkdocs.yml at the repository root) fails on a broken link or anchor, a page missing from
the nav, a reference to an object that does not exist, or a docstring warning; this test runs it once into a temp
dir and fails with its output. Then it checks the built site: every public name of every public module (its
``__all__``) and every public method and attribute of its classes, inherited ones included, has an anchor in the
API reference; no Sphinx role (``:class:`x```, shown raw by Markdown) is left in src/; the command-line reference
lists every command and option of ``torchspark``, and no page fetches anything from the network when viewed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import sphinx_roles
from torchspark.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
#: the build's limit: ~10 s of CPU, but minutes of wall time on a machine shared with other jobs
BUILD_TIMEOUT_S = 600
#: every module with a page in the API reference (docs/reference/*.md), with the page
REFERENCE = {
    "torchspark": "torchspark",
    "torchspark.data": "data",
    "torchspark.nn": "nn",
    "torchspark.optim": "optim",
    "torchspark.schedules": "schedules",
    "torchspark.models": "models",
    "torchspark.datasets": "datasets",
    "torchspark.errors": "errors",
    "torchspark.training": "training",
    "torchspark.spark": "spark",
    "torchspark.spark.ml": "spark-ml",
    "torchspark.spark.earlystopping": "spark-earlystopping",
    "torchspark.spark.connect": "spark-connect",
    "torchspark.parallel": "parallel",
    "torchspark.parallel.earlystopping": "parallel-earlystopping",
    "torchspark.earlystopping": "earlystopping",
    "torchspark.encoding": "encoding",
    "torchspark.ddp": "ddp",
    "torchspark.evaluation": "evaluation",
    "torchspark.listeners": "listeners",
    "torchspark.stats": "stats",
    "torchspark.advise": "advise",
    "torchspark.config_files": "config-files",
    "torchspark.shipping": "shipping",
    "torchspark.launch": "launch",
}
#: public modules rendered as a section of another module's page: the optional extras' listeners (not imported by
#: ``torchspark.listeners``, so that MLflow and TensorBoard stay optional)
SECTIONS = {
    "torchspark.ranks": "launch",
    "torchspark.listeners.mlflow_listener": "listeners",
    "torchspark.listeners.tensorboard_listener": "listeners",
    "torchspark.training.driver.elastic": "training",
    "torchspark.training.driver.stall": "training",
}
PUBLIC_MODULES = {**REFERENCE, **SECTIONS}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mkdocs build --strict took over {BUILD_TIMEOUT_S} s:\n{e.stderr}")
    if done.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed (exit {done.returncode}); fix the docs:\n{done.stderr}{done.stdout}")
    return out


def _inventory_uris(site: Path) -> dict[str, str]:
    """Object name -> its page and anchor (``reference/nn/#torchspark.nn.Network``) in the site's inventory."""
    header_lines = 4
    data = (site / "objects.inv").read_bytes().split(b"\n", header_lines)[header_lines]
    uris = {}
    for line in zlib.decompress(data).decode().splitlines():
        name, _domain, _priority, uri = line.split(" ", 4)[:4]
        uris[name] = uri[:-1] + name if uri.endswith("$") else uri  # "$" abbreviates the name
    return uris


def _public_names(module: str) -> list[str]:
    """The documented surface of a public module: each name of its ``__all__`` (not ``__version__``-like dunders,
    plain values mkdocstrings does not render), and for each class its public methods, properties and attributes,
    inherited ones included, that torchspark defines (not those of ``object``, ``Exception``, pyspark...)."""
    mod = importlib.import_module(module)
    names = []
    for name in mod.__all__:
        if name.startswith("__"):
            continue
        names.append(f"{module}.{name}")
        obj = getattr(mod, name)
        if not inspect.isclass(obj):
            continue
        for attr in sorted(dir(obj)):
            owner = next((k for k in obj.__mro__ if attr in vars(k)), None)
            if attr.startswith("_") or owner is None or not owner.__module__.startswith("torchspark"):
                continue
            names.append(f"{module}.{name}.{attr}")
    return names


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "guides" / "gradient-sharing" / "index.html").is_file()


def test_every_reference_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.stem for p in (ROOT / "docs" / "reference").glob("*.md")}
    assert pages == set(REFERENCE.values()) | {"cli"}
    for page in pages:
        assert f"reference/{page}.md" in nav
        if page != "cli":
            assert (
                f"::: {next(m for m, p in REFERENCE.items() if p == page)}"
                in (ROOT / "docs" / "reference" / f"{page}.md").read_text()
            )


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_every_public_name_has_an_anchor_in_the_reference(site: Path, module: str) -> None:
    """Each name of the module's ``__all__`` and each public member of its classes (``SparkNetwork.evaluate``,
    inherited from a mixin; ``DataSet.split``; ``ROC.auc``) is in the inventory, and its anchor is on its page."""
    uris = _inventory_uris(site)
    names = _public_names(module)
    missing = [name for name in names if name not in uris]
    assert not missing, f"{module}: public names the API reference does not render: {missing}"
    pages: dict[str, str] = {}
    for name in names:
        page, _, anchor = uris[name].partition("#")
        if page not in pages:
            pages[page] = (site / page / "index.html").read_text(encoding="utf-8")
        assert f'id="{anchor}"' in pages[page], f"{name}: no anchor {anchor!r} on {page}"


def test_the_walk_sees_inherited_members() -> None:
    """The walk above covers what the issue found missing: members a class inherits from a torchspark base."""
    names = set(_public_names("torchspark.spark")) | set(_public_names("torchspark.data"))
    names |= set(_public_names("torchspark.evaluation"))
    assert {"torchspark.spark.SparkNetwork.evaluate", "torchspark.spark.SparkNetwork.predict"} <= names
    assert {"torchspark.data.DataSet.split", "torchspark.evaluation.ROC.auc"} <= names
    assert "torchspark.spark.remote_session" in names


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_no_public_name_is_also_a_submodule(module: str) -> None:
    """``torchspark.spark.export_batches`` was both a function and a module: the reference rendered the module (the
    function's entry was missing) and ``import torchspark.spark.export_batches`` gave a module, not the function."""
    mod = importlib.import_module(module)
    if not hasattr(mod, "__path__"):
        return
    clashes = [
        name
        for name in mod.__all__
        if importlib.util.find_spec(f"{module}.{name}") is not None and not inspect.ismodule(getattr(mod, name))
    ]
    assert not clashes, f"{module}: names that are also submodules (rename the submodule): {clashes}"


def test_no_sphinx_role_is_left_in_src() -> None:
    """The reference renders docstrings as Markdown, where ``:class:`~torchspark.nn.Network``` shows raw; write
    ``[`Network`][torchspark.nn.Network]`` (a checked link) or run tests/sphinx_roles.py, which converts them."""
    left = sphinx_roles.remaining()
    assert not left, "Sphinx roles in src/ (run `.venv/bin/python tests/sphinx_roles.py`):\n" + "\n".join(left)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for the subcommands
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_cli_reference_lists_every_command_and_option(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", page)
    parser = build_parser()
    commands = _commands(parser)
    assert {"train", "evaluate", "predict", "advise"} <= set(commands)
    for name, sub in {"": parser, **commands}.items():
        assert f"usage: torchspark {name}".rstrip() in text, name
        for action in sub._actions:
            for option in action.option_strings:
                assert option in text, f"torchspark {name}: {option} missing from the CLI reference"


def test_pages_fetch_nothing_from_the_network(site: Path) -> None:
    remote = re.compile(r"""<(?:link|script|img)\b[^>]*\b(?:href|src)=["']?(?:https?:)?//""", re.I)
    offenders = [str(p.relative_to(site)) for p in site.rglob("*.html") if remote.search(p.read_text())]
    assert not offenders, f"pages loading remote fonts, scripts or styles: {offenders}"
    css = "".join(p.read_text() for p in site.rglob("*.css"))
    assert "fonts.googleapis.com" not in css and "fonts.gstatic.com" not in css
