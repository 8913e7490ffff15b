"""The suite's JVM options: C1 only, and one class-data archive (AppCDS) that every Spark driver JVM maps.

CPU is what bounds the suite on a 2-core machine, and starting a JVM is where much of it goes: a local session
started, used once and stopped costs about 27 CPU-s (the JVM, its JIT threads and the Python worker included).

* ``-XX:TieredStopAtLevel=1`` (C1 only): the suite's JVMs live seconds to minutes, where C2's compiler threads cost
  more than their faster code saves: 27.2 -> 18.3 CPU-s for that session; tests/spark/test_averaging_spark.py on the
  shared session, 117 -> 99 CPU-s (cgroup CPU accounting, JVMs and Python workers included).
* A dynamic class-data archive of the classes a Spark driver loads (``-XX:SharedArchiveFile``): the JVM maps them
  instead of loading and verifying ~10k classes from the jars: 18.3 -> 13.5 CPU-s more. :func:`ensure_archive`
  writes it once per machine and Spark install (a session started and stopped with ``-XX:ArchiveClassesAtExit``,
  about 20 s), before the first test that starts a JVM; a JVM whose class path differs (executors) or that finds no
  archive yet runs without it, silently (``-Xlog:cds=off``).

``tests/conftest.py`` puts these in ``SPARK_SUBMIT_OPTS`` (every driver started through spark-submit: the shared
session, scripts, the CLI, the Connect servers; child processes inherit it), in ``spark.executor.defaultJavaOptions``
(C1 only) and in ``SPARK_DAEMON_JAVA_OPTS`` (the namespace cluster's standalone daemons). Production sessions are
untouched: only the tests set them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["C1_ONLY", "archive_path", "driver_options", "ensure_archive"]

C1_ONLY = "-XX:TieredStopAtLevel=1"
#: a missing or mismatched archive is not worth a line on a JVM's stdout (where some scripts print their JSON)
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"

_DUMP = """
from torchspark.spark import local_session
s = local_session(cores=2, app_name="torchspark-test-archive")
sc = s.sparkContext
assert sc.parallelize(range(8), 2).map(lambda x: x * 2).sum() == 56
assert sc.parallelize(range(4), 2).barrier().mapPartitions(lambda it: [sum(it)]).collect() == [1, 5]
df = s.createDataFrame([(i, float(i)) for i in range(10)], ["id", "x"])
assert df.groupBy().sum("x").collect()[0][0] == 45.0
s.stop()
"""


def archive_path() -> Path:
    """Where this Spark install's archive lives: the temp directory, keyed by the java binary and the jars."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    stamp = f"{jars.resolve()}|{jars.stat().st_mtime_ns if jars.is_dir() else 0}|{java}"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"torchspark-test-jvm-{key}.jsa"


def driver_options() -> str:
    """``SPARK_SUBMIT_OPTS`` for the suite's drivers: C1 only, the archive, and C1 only for their executors."""
    return f"{C1_ONLY} -XX:SharedArchiveFile={archive_path()} {QUIET_CDS} -Dspark.executor.defaultJavaOptions={C1_ONLY}"


def ensure_archive(timeout_s: float = 300.0) -> str:
    """Write the archive unless it exists; returns what happened (never raises: without it JVMs just start slower).

    The dump runs in a child process with its own temp directory (its JVM's too), so no test sees its files; the
    archive is written under a temporary name and renamed, so no JVM maps half an archive.
    """
    target = archive_path()
    if target.is_file():
        return f"reused {target}"
    with tempfile.TemporaryDirectory(prefix="torchspark-test-archive-") as scratch:
        partial = Path(scratch) / "archive.jsa"
        env = {
            **os.environ,
            "TMPDIR": scratch,
            "SPARK_SUBMIT_OPTS": f"{C1_ONLY} -XX:ArchiveClassesAtExit={partial} {QUIET_CDS} -Djava.io.tmpdir={scratch}",
        }
        try:
            done = subprocess.run(
                [sys.executable, "-c", _DUMP], env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"no archive ({type(e).__name__}: {e})"
        if done.returncode != 0 or not partial.is_file():
            return f"no archive (exit {done.returncode}): {done.stderr[-500:]}"
        os.replace(partial, target)  # atomic: the scratch directory is under gettempdir() too
    return f"wrote {target}"
