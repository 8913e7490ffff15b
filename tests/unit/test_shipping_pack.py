"""torchspark.shipping on a small distribution (tqdm): the closure, exclusions and the pack options, each checked
in the archive itself. The full torch environment on a cluster is tests/spark/test_shipping.py."""

from __future__ import annotations

import importlib.util
import subprocess
import tarfile
from pathlib import Path

import pytest

from torchspark.errors import ConfigError
from torchspark.shipping import archive_conf, build_environment, pack_environment

pytest.importorskip("venv_pack", reason="packing needs venv-pack: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def small_env(tmp_path_factory):
    return build_environment(tmp_path_factory.mktemp("small") / "env", roots=("tqdm",))


def _members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_build_copies_the_roots_and_runs_on_its_own(small_env) -> None:
    # tqdm's only requirement is conditional (colorama on Windows): taken only when installed, as it is beside the
    # docs packages of the [test] extra (mkdocs-material requires colorama everywhere)
    expected = ("colorama", "tqdm") if importlib.util.find_spec("colorama") else ("tqdm",)
    assert small_env.distributions == expected
    assert (small_env.site_packages / "tqdm" / "__init__.py").is_file()
    assert list(small_env.site_packages.glob("tqdm/__pycache__/*.pyc"))  # compiled modules travel too
    out = subprocess.run(
        [str(small_env.prefix / "bin" / "python"), "-c", "import sys, tqdm; print(tqdm.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(small_env.prefix)


def test_build_exclude_leaves_distributions_out(tmp_path) -> None:
    env = build_environment(tmp_path / "env", roots=("tqdm",), exclude=("tqdm",))
    assert env.distributions == () and not (env.site_packages / "tqdm").exists()


def test_build_names_a_missing_requirement(tmp_path) -> None:
    with pytest.raises(Exception, match="'no-such-dist-xyz' is needed .* not installed"):
        build_environment(tmp_path / "env", roots=("no-such-dist-xyz",))


def test_pack_writes_a_venv_archive_honouring_its_options(small_env, tmp_path) -> None:
    plain = pack_environment(small_env.prefix, tmp_path / "plain.tar.gz", compress_level=0)
    members = _members(plain)
    assert "pyvenv.cfg" in members and "bin/python" in members
    assert any(n.startswith("lib/python") and n.endswith("tqdm/__init__.py") for n in members)
    assert plain.stat().st_mode & 0o044  # readable by others: meant to be uploaded
    # compress_level reaches gzip
    tight = pack_environment(small_env.prefix, tmp_path / "tight.tar.gz", compress_level=9)
    assert tight.stat().st_size < 0.7 * plain.stat().st_size
    # exclude patterns reach venv-pack
    slim = pack_environment(small_env.prefix, tmp_path / "slim.tar.gz", exclude=["lib/python*/site-packages/tqdm/*"])
    assert not any("tqdm/__init__.py" in n for n in _members(slim))
    # python_prefix re-points the interpreter link at the nodes' own Python
    moved = pack_environment(small_env.prefix, tmp_path / "moved.tar.gz", python_prefix="/opt/python")
    links = {m.linkname for m in _members(moved).values() if m.issym()}
    assert any(t.startswith("/opt/python/bin/python") for t in links), links


def test_pack_refuses_bad_arguments(tmp_path) -> None:
    with pytest.raises(ConfigError, match="output must end with"):
        pack_environment(tmp_path, tmp_path / "env.7z")
    with pytest.raises(ConfigError, match="compress_level must be an integer in 0..9, got 11"):
        pack_environment(tmp_path, tmp_path / "env.tar.gz", compress_level=11)
    with pytest.raises(ConfigError, match="already exists"):
        build_environment(tmp_path)


def test_archive_conf_follows_the_guide() -> None:
    assert archive_conf("hdfs:///envs/ts.tar.gz") == {
        "spark.archives": "hdfs:///envs/ts.tar.gz#environment",
        "spark.pyspark.python": "./environment/bin/python",
    }
    assert archive_conf("env.zip", alias="py")["spark.pyspark.python"] == "./py/bin/python"
    with pytest.raises(ConfigError, match="archive must end with"):
        archive_conf("env.rar")
    with pytest.raises(ConfigError, match="alias must be a plain directory name"):
        archive_conf("env.tar.gz", alias="../x")
