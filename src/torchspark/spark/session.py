"""Starting a local Spark session with the settings torchspark needs, and checking for Java first."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from torchspark.errors import ConfigError, SetupError

__all__ = [
    "local_session",
    "remote_session",
    "session_scope",
    "check_java",
    "spark_context",
    "check_connect_packages",
    "CONNECT_PACKAGES",
]

JAVA_HINT = (
    "Spark needs Java 17 or newer. Install it (Debian/Ubuntu: `apt-get install -y openjdk-17-jre-headless`; "
    "macOS: `brew install openjdk@17`) or set JAVA_HOME to an installed JDK, then run again."
)


def check_java() -> str:
    """The ``java -version`` banner; raises [`SetupError`][torchspark.cli.SetupError] with install instructions when Java is missing."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        where = f"JAVA_HOME={java_home!r} has no bin/java" if java_home else "no `java` on PATH"
        raise SetupError(f"Java was not found ({where}). {JAVA_HINT}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"`{java} -version` failed: {e}. {JAVA_HINT}") from e
    banner = (out.stderr or out.stdout).strip().splitlines()
    return banner[0] if banner else java


def local_session(
    cores: int | None = None,
    app_name: str = "torchspark",
    master: str | None = None,
    conf: dict[str, Any] | None = None,
    rendezvous_timeout_s: float = 300.0,
    quiet: bool = False,
    connect: bool = False,
) -> Any:
    """A SparkSession on this machine with sane defaults for training.

    Args:
        cores: task slots for ``local[N]`` (default: all cores). Ignored when ``master`` is given.
        app_name: the Spark application name.
        master: any Spark master URL instead of ``local[cores]``, e.g. ``"local-cluster[2,1,1024]"`` (separate
            executor processes), ``"spark://host:7077"``, ``"yarn"``, ``"k8s://..."``.
        conf: extra Spark settings, applied last. A large network needs ``{"spark.driver.memory": "4g"}``: in local
            mode the driver's JVM (Spark's default heap: 1g) runs the executors too and carries rank 0's parameters
            and updater state back (162 MB for 13.5 M parameters with Adam).
        rendezvous_timeout_s: becomes ``spark.barrier.sync.timeout`` so a barrier task waiting for a peer fails
            instead of hanging.
        quiet: start without the JVM's start-up chatter (the incubator-module notice, loopback hostname,
            native-hadoop and log4j-profile warnings): the driver JVM's own stderr goes to ``os.devnull`` and
            Spark logs only errors. Spark's errors still reach Python as exceptions; leave it False (the default,
            or ``torchspark ... --verbose``) to see everything the JVM prints.
        connect: a Spark Connect session instead of a classic one: ``SparkSession.builder.remote("local[N]")``
            starts a Connect server inside this process (needs ``pip install 'torchspark[connect]'``); the same
            settings apply. A process holds one kind: a classic session and a local Connect one cannot coexist
            (use [`torchspark.spark.connect.start_connect_server`][torchspark.spark.connect.start_connect_server] for a server in its own process).
    Settings applied: executors use this interpreter (``PYSPARK_PYTHON=sys.executable``), Python worker reuse on,
    Python workers forked from a daemon that has imported torch already (``torchspark.spark._daemon``),
    ``spark.locality.wait=0`` (DL4J's guidance: do not wait for data-local slots), Arrow for pandas conversions,
    Spark's console progress bar off (torchspark draws its own).
    """
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ConfigError(f"cores must be an integer >= 1, got {cores!r}")
    check_java()
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # executors must import the same torchspark as the driver, also from a source checkout
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([pkg_root, *paths])
    url = master or f"local[{cores or os.cpu_count() or 1}]"
    if connect:
        check_connect_packages()
    builder = (
        (SparkSession.builder.remote(url) if connect else SparkSession.builder.master(url))
        .appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", "torchspark.spark._daemon")
        .config("spark.locality.wait", "0")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.barrier.sync.timeout", str(int(rendezvous_timeout_s)))
    )
    if url.startswith("local"):  # one machine: stay on loopback; a cluster must reach the driver's real address
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    with _jvm_stderr_silenced(quiet):
        session = builder.getOrCreate()
    if not connect:
        session.sparkContext.setLogLevel("ERROR")
    return session


def remote_session(url: str) -> Any:
    """A Spark Connect client session of the server at ``url`` (``sc://host:port``, the server's
    ``spark.connect.grpc.binding.port``, 15002 by default). Needs only the client packages
    (``pip install 'torchspark[connect]'``), no Java; the cluster behind the server runs the jobs.

    Example: ``spark = remote_session("sc://spark-head:15002")``, then ``SparkNetwork(spark, net, master).fit(df)``.

    Raises:
        ConfigError: ``url`` is not an ``sc://`` URL. SetupError: the client packages are missing.
    """
    if not isinstance(url, str) or not url.startswith("sc://"):
        raise ConfigError(f"a Spark Connect URL looks like sc://host:15002, got {url!r}")
    check_connect_packages()
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).getOrCreate()


#: the client packages Spark Connect needs beside pyspark (the ``[connect]`` extra)
CONNECT_PACKAGES = {
    "grpc": "grpcio",
    "grpc_status": "grpcio-status",
    "google.rpc": "googleapis-common-protos",
    "zstandard": "zstandard",
    "pyarrow": "pyarrow",
    "pandas": "pandas",
}


def check_connect_packages() -> None:
    """Raise ``SetupError`` naming the missing packages when Spark Connect's client packages are not installed."""
    import importlib.util

    missing = []
    for module, package in CONNECT_PACKAGES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(package)
    if missing:
        raise SetupError(
            f"Spark Connect needs {', '.join(missing)}, which is not installed here: pip install 'torchspark[connect]'"
        )


@contextlib.contextmanager
def _jvm_stderr_silenced(quiet: bool) -> Iterator[None]:
    """While the block runs, file descriptor 2 points at ``os.devnull``, so a JVM launched in it inherits a silent
    stderr for good; this process gets its own stderr back afterwards. Does nothing unless ``quiet``."""
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def session_scope(
    cores: int | None = None, master: str | None = None, app_name: str = "torchspark", quiet: bool = False
) -> Iterator[Any]:
    """A session for the duration of a block: the active one when there is one (left running), else a new
    [`local_session`][torchspark.spark.local_session] (stopped at the end; ``quiet``: see there)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = local_session(cores=cores, master=master, app_name=app_name, quiet=quiet)
    try:
        yield spark
    finally:
        spark.stop()


def spark_context(spark: Any) -> Any:
    """The SparkContext of a SparkSession or SparkContext."""
    from torchspark.spark.session_kinds import require_classic, session_kind

    require_classic(
        spark, "this call", "pass a DataFrame to the methods that take one (see the guide docs/guides/connect.md)"
    )
    sc = getattr(spark, "sparkContext", spark)
    if not hasattr(sc, "parallelize"):
        raise ConfigError(f"expected a SparkSession or SparkContext, got {session_kind(spark)}")
    return sc
