"""A Spark Connect server in its own process, for one machine, tests and benchmarks.

``SparkSession.builder.remote("local[2]")`` also starts a local Connect server, but inside this Python process's
JVM, which cannot coexist with a classic session (``SESSION_ALREADY_EXIST``). [`start_connect_server`][torchspark.spark.connect.start_connect_server] runs
``org.apache.spark.sql.connect.service.SparkConnectServer`` with ``spark-submit`` from the pyspark wheel instead
(the same class a cluster runs: ``sbin/start-connect-server.sh``), on loopback, with executors on this interpreter;
clients connect to [`ConnectServer.url`][torchspark.spark.connect.ConnectServer.url].
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from torchspark.errors import SetupError

__all__ = ["ConnectServer", "start_connect_server", "SERVER_CLASS"]

#: the Connect server's main class (in pyspark's jars/spark-connect_*.jar)
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class ConnectServer:
    """A running Connect server process; [`stop`][torchspark.spark.connect.ConnectServer.stop] (or ``with``) ends it.

    Attributes:
        url: what a client passes to ``SparkSession.builder.remote(...)``, e.g. ``"sc://127.0.0.1:41234"``.
        process: the ``spark-submit`` process (its own process group).
        log_path: where the server's stdout and stderr go.
    """

    url: str
    process: subprocess.Popen[bytes]
    log_path: str
    _sessions: list[Any] = field(default_factory=list)

    def session(self) -> Any:
        """A Connect client session of this server (needs ``pip install 'torchspark[connect]'``)."""
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(self.url).getOrCreate()
        self._sessions.append(spark)
        return spark

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log (for error messages)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """Close the client sessions made by [`session`][torchspark.spark.connect.ConnectServer.session], then end the server (SIGTERM, then SIGKILL)."""
        for spark in self._sessions:
            try:
                spark.stop()
            except Exception:  # a dead server: nothing to close
                pass
        self._sessions.clear()
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout_s)

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def server_command(master: str, host: str, port: int, conf: dict[str, Any]) -> list[str]:
    """The ``spark-submit`` command line of a Connect server (pyspark's own ``bin/spark-submit``)."""
    import pyspark

    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    cmd = [submit, "--class", SERVER_CLASS, "--master", master]
    settings = {
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.python.worker.reuse": "true",
        "spark.locality.wait": "0",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    if master.startswith("local"):
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
        # this machine's executors run this interpreter: fork Python workers from a daemon that imported torch
        # (as local_session does), so a fit's new workers do not pay ``import torch``
        settings["spark.python.daemon.module"] = "torchspark.spark._daemon"
    settings.update({k: str(v) for k, v in conf.items()})
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def start_connect_server(
    master: str = "local[2]",
    port: int | None = None,
    host: str = "127.0.0.1",
    conf: dict[str, Any] | None = None,
    timeout_s: float = 180.0,
    log_path: str | None = None,
) -> ConnectServer:
    """Start a Spark Connect server with ``master`` (``"local[2]"``, ``"local-cluster[2,1,1024]"``,
    ``"spark://host:7077"``) and wait until it accepts connections.

    Executors run this interpreter with this process's ``PYTHONPATH`` (so they import the same torchspark and torch,
    also from a source checkout). ``conf`` adds Spark settings (applied last).

    Example::

        with start_connect_server("local[2]") as server:
            spark = server.session()
            SparkNetwork(spark, net, master).fit(df)

    Raises:
        SetupError: Java or the server class is missing, or the server did not listen within ``timeout_s`` (the
            message carries the end of its log).
    """
    from torchspark.spark.session import check_java

    check_java()
    port = port or _free_port(host)
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    pythonpath = os.pathsep.join([pkg_root, *[p for p in paths if p != pkg_root]])
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=pythonpath)
    settings = {"spark.executorEnv.PYTHONPATH": pythonpath, **(conf or {})}
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="torchspark-connect-", suffix=".log")
        os.close(fd)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            server_command(master, host, port, settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = ConnectServer(f"sc://{host}:{port}", process, log_path)
    deadline = time.monotonic() + timeout_s
    while not _listening(host, port):
        if process.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited with code {process.returncode}"
                if process.poll() is not None
                else f"did not listen on {host}:{port} within {timeout_s:.0f} s"
            )
            server.stop()
            raise SetupError(
                f"the Spark Connect server ({master}) {why}; its log ({log_path}) ends with:\n"
                f"{server.log_tail()}\nCheck Java 17, free memory, and raise timeout_s on a slow "
                "machine"
            )
        time.sleep(0.5)
    return server
