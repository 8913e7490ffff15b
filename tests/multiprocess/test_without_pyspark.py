"""The core of torchspark works where pyspark is not installed (a GPU box, a laptop): a child Python whose
``sitecustomize`` makes every import of pyspark or py4j fail trains with both masters through ParallelWrapper (its
worker processes inherit the block), encodes and decodes with the codec, evaluates, and runs
``torchspark train --parallel``; nothing tries to import pyspark until a Spark route is asked for, which then fails
with a message naming ``pip install 'torchspark[spark]'`` (and the Connect client's extra)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

SITECUSTOMIZE = '''
import sys


class NoSpark:
    """Refuses pyspark and py4j (as if not installed) and records who asked."""

    tried = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyspark", "py4j"):
            self.tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by test_without_pyspark)", name=name)
        return None


sys.meta_path.insert(0, NoSpark())
'''


def test_the_core_trains_encodes_and_evaluates_without_pyspark(tmp_path: pathlib.Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    paths = [str(tmp_path), str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(
        [sys.executable, str(HERE / "_no_pyspark_child.py")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert lines["TRIED_BEFORE_SPARK_ROUTE"] == "[]", "something imported pyspark (or tried to) in the core"
    assert lines["LEAKED"] == "[]"
    assert (
        "pip install 'torchspark[spark]'" in lines["SPARK_ROUTE_ERROR"]
        and "torchspark[connect-client]" in lines["SPARK_ROUTE_ERROR"]
    )
    assert lines["SPARK_ROUTE_ERROR"].startswith("torchspark: error: torchspark.spark needs pyspark")
    assert lines["TRIED_ON_SPARK_ROUTE"].split(",")[0] == "pyspark"
