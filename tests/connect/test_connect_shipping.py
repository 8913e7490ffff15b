"""The README's shipping recipe for Connect, run for real on the local Connect server: code the executors lack,
shipped per session with ``spark.addArtifacts``.

1. an environment archive (``archive=True``, unpacked on the executors into the session's working directory under
   the ``#name`` given) whose ``bin/python`` the session's Python workers then run
   (``spark.sql.execution.pyspark.python``): here a tiny stand-in of a packed venv, a ``bin/python`` that puts the
   archive's ``lib`` on the path and runs this interpreter;
2. pure-Python code as a zip (``pyfile=True``), which Spark puts on the workers' ``sys.path``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tarfile
import zipfile

PYTHON_CONF = "spark.sql.execution.pyspark.python"


def _run_probe(spark, module: str = "tsship_demo") -> dict:
    """What a Python worker of ``spark`` sees: its directory's entries, and whether it imports the shipped module
    (the function is nested, so cloudpickle ships it by value: the executors do not have this test file)."""

    def probe(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        info = {"cwd_entries": sorted(os.listdir("."))}
        try:
            info["answer"] = importlib.import_module(module).ANSWER
        except ImportError as e:
            info["answer"] = repr(e)
        yield pa.RecordBatch.from_pydict({"info": [json.dumps(info)]})

    row = spark.range(1, numPartitions=1).mapInArrow(probe, "info string").collect()[0]
    return json.loads(row["info"])


def _environment_archive(root, module: str) -> str:
    """A stand-in of ``pack_environment``'s archive: ``bin/python`` (runs this interpreter with the archive's
    ``lib`` first on the path) and ``lib/tsship_demo``."""
    (root / "lib" / "tsship_demo").mkdir(parents=True)
    (root / "lib" / "tsship_demo" / "__init__.py").write_text(module)
    (root / "bin").mkdir()
    python = root / "bin" / "python"
    python.write_text(
        '#!/bin/sh\nHERE="$(cd "$(dirname "$0")/.." && pwd)"\n'
        'export PYTHONPATH="$HERE/lib${PYTHONPATH:+:$PYTHONPATH}"\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    archive = root.parent / "ts-env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("bin", "lib"):
            tar.add(root / name, arcname=name)
    return str(archive)


def test_an_environment_archive_and_its_python_reach_the_workers(connect_spark, tmp_path) -> None:
    archive = _environment_archive(tmp_path / "env", "ANSWER = 42\n")
    connect_spark.addArtifacts(f"{archive}#environment", archive=True)
    before = _run_probe(connect_spark)
    assert "environment" in before["cwd_entries"]  # unpacked in the workers' working directory ...
    assert "No module named 'tsship_demo'" in before["answer"]  # ... but not on their path by itself
    connect_spark.conf.set(PYTHON_CONF, "environment/bin/python")
    try:
        assert _run_probe(connect_spark)["answer"] == 42  # the archive's interpreter runs the Python workers
    finally:
        connect_spark.conf.unset(PYTHON_CONF)
    assert "No module named" in _run_probe(connect_spark)["answer"]  # back on the server's interpreter


def test_pure_python_code_as_a_pyfile_zip_is_importable(connect_spark, tmp_path) -> None:
    deps = tmp_path / "deps.zip"
    with zipfile.ZipFile(deps, "w") as z:
        z.writestr("tsship_zipped/__init__.py", "ANSWER = 7\n")
    connect_spark.addArtifacts(str(deps), pyfile=True)
    assert _run_probe(connect_spark, "tsship_zipped")["answer"] == 7
