"""Shipping the Python environment to executors: a venv packed with venv-pack, sent with ``spark.archives``,
and a fit on local-cluster whose executors run only that archive's interpreter.

Building the archive costs ~1.2 GB of hard links plus a ~1 GB uncompressed archive (torch is most of it), so it
is built once per test session; the fit unpacks it once per executor."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchspark.shipping import TORCH_BUILD_ONLY, build_environment, pack_environment

SCRIPT = Path(__file__).parent / "scripts" / "shipped_env_fit.py"

# A module only the archive carries (the driver gets its own copy from a side directory): executors that
# unpickle the network need it, so training can only work on the shipped interpreter.
MODEL_SOURCE = """
import torch

TOKEN = {token!r}


class ShippedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                        torch.nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, 1, 8, 8) -> (N, 10) logits
        return self.body(x)


def build() -> ShippedNet:
    torch.manual_seed(0)
    return ShippedNet()
"""


@pytest.fixture(scope="session")
def shipped_archive(tmp_path_factory):
    pytest.importorskip("venv_pack", reason="packing needs venv-pack: pip install -e '.[test]'")
    root = tmp_path_factory.mktemp("shipped")
    token = secrets.token_hex(8)
    source = MODEL_SOURCE.format(token=token)
    t0 = time.monotonic()
    env = build_environment(root / "env")
    (env.site_packages / "shipped_model.py").write_text(source)
    t1 = time.monotonic()
    # level 0 (stored, not compressed): gzip level 1 was most of the fixture's CPU, and an archive on loopback gains
    # nothing from compression (the levels themselves: tests/unit/test_shipping_pack.py)
    archive = pack_environment(env.prefix, root / "environment.tar.gz", compress_level=0, exclude=TORCH_BUILD_ONLY)
    t2 = time.monotonic()
    side = root / "driver_side"
    side.mkdir()
    (side / "shipped_model.py").write_text(source)
    print(
        f"\nshipped env: {env.size_bytes / 2**20:.0f} MiB in {len(env.distributions)} distributions, built in "
        f"{t1 - t0:.1f} s; archive {archive.stat().st_size / 2**20:.0f} MiB packed in {t2 - t1:.1f} s"
    )
    return {"archive": archive, "side": side, "token": token, "env": env}


@pytest.mark.timeout(1800)  # the first test here builds and packs the environment (~400 MB, minutes)
def test_built_environment_holds_the_closure_without_pyspark(shipped_archive) -> None:
    env = shipped_archive["env"]
    assert {"torch", "torchspark", "numpy", "pyarrow", "safetensors", "cloudpickle"} <= set(env.distributions)
    assert "pyspark" not in env.distributions and "pytest" not in env.distributions  # excluded / extra only
    # the editable torchspark became a regular copy: no path file pointing back at the source tree
    assert (env.site_packages / "torchspark" / "__init__.py").is_file()
    assert not list(env.site_packages.glob("__editable__*"))
    code = "import sys, torchspark; print(sys.prefix, torchspark.__file__)"
    out = subprocess.run(
        [str(env.prefix / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    prefix, module = out.stdout.split()
    assert Path(module).is_relative_to(env.prefix) and Path(prefix) == env.prefix


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.shipping
@pytest.mark.timeout(1800)  # a local-cluster fit from the packed interpreter (its own limit is 900 s)
def test_fit_on_local_cluster_with_only_the_shipped_interpreter(shipped_archive) -> None:
    drop = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}  # nothing may point executors at this venv
    cmd = [sys.executable, str(SCRIPT), str(shipped_archive["archive"]), str(shipped_archive["side"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(lines[-1])

    assert result["accuracy"] >= 0.85, result["accuracy"]  # it trained (4 epochs of an MLP on digits)
    workers = result["workers"]
    assert len({w["pid"] for w in workers}) >= 2 and result["driver"]["pid"] not in {w["pid"] for w in workers}
    source_tree = Path(__file__).resolve().parents[2]
    for w in workers:
        unpacked = (Path(w["cwd"]) / "environment").resolve()
        # the interpreter is ./environment/bin/python of the executor's own unpacked copy ...
        assert Path(w["executable"]).parent.resolve() == unpacked / "bin", w["executable"]
        assert Path(w["prefix"]).resolve() == unpacked, w
        # ... and every package comes from that copy, none from this test's venv or source tree
        for name, path in w["modules"].items():
            assert Path(path).is_relative_to(unpacked), (name, path)
        # sys.path: the executor's working directory (holding the unpacked copy), the base interpreter's
        # standard library, and the zips/jars of Spark's own install (Spark provides pyspark to every worker)
        for entry in w["path"]:
            resolved = (Path(w["cwd"]) / entry).resolve()  # relative entries (".") are the worker's cwd
            spark_home = Path(w["spark_home"]).resolve()
            from_spark = resolved.suffix in (".zip", ".jar") and resolved.is_relative_to(spark_home)
            assert (
                resolved.is_relative_to(Path(w["cwd"]).resolve())
                or from_spark
                or resolved.is_relative_to(Path(w["base_prefix"]).resolve())
            ), entry
            assert not resolved.is_relative_to(source_tree / "src"), entry
        site = [p for p in w["path"] if p.endswith("site-packages")]
        assert site and all(Path(p).resolve().is_relative_to(unpacked) for p in site), site
        assert "pyspark.zip" in w["pyspark"]  # Spark's own pyspark, none in the archive
        assert w["torch_include"] is False  # pack_environment's exclude reached the archive
        assert w["token"] == shipped_archive["token"]  # a module only the archive carries imports there
    assert len({(Path(w["cwd"]) / "environment").resolve() for w in workers}) >= 2  # unpacked per executor
