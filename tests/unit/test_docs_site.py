"""The documentation site builds strictly and covers the public API and the command line.

``mkdocs build --strict`` (mkdocs.yml at the repository root) fails on a broken link or anchor, a page missing from
the nav, a reference to an object that does not exist, or a docstring warning; this test runs it once into a temp
dir and fails with its output. Then it checks the built site: every public class of every package on the API
reference has an entry, the command-line reference lists every command and option of ``torchspark``, and no
page fetches anything from the network when viewed (fonts, scripts, styles).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

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
    "torchspark.evaluation": "evaluation",
    "torchspark.listeners": "listeners",
    "torchspark.stats": "stats",
    "torchspark.advise": "advise",
    "torchspark.config_files": "config-files",
    "torchspark.shipping": "shipping",
}


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


def _inventory(site: Path) -> set[str]:
    """The object names of the site's Sphinx inventory (objects.inv, written by mkdocstrings)."""
    header_lines = 4
    data = (site / "objects.inv").read_bytes().split(b"\n", header_lines)[header_lines]
    return {line.split(" ", 1)[0] for line in zlib.decompress(data).decode().splitlines()}


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


@pytest.mark.parametrize("module", sorted(REFERENCE))
def test_every_public_class_has_a_reference_entry(site: Path, module: str) -> None:
    inventory = _inventory(site)
    mod = importlib.import_module(module)
    classes = [name for name in mod.__all__ if inspect.isclass(getattr(mod, name))]
    missing = [name for name in classes if f"{module}.{name}" not in inventory]
    assert not missing, f"{module}: public classes without an API reference entry: {missing}"


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
