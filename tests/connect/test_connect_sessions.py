"""Spark Connect sessions: telling them from classic ones, the messages that name them, the local server."""

from __future__ import annotations

import pytest

from torchspark import Network
from torchspark.errors import ConfigError, SetupError
from torchspark.models import mlp
from torchspark.spark import SparkNetwork
from torchspark.spark.connect import is_connect_session, session_kind, start_connect_server
from torchspark.spark.session import CONNECT_PACKAGES, check_connect_packages, spark_context


def test_a_connect_session_is_told_from_a_classic_one(connect_spark):
    from pyspark.sql.session import SparkSession as ClassicSession

    assert is_connect_session(connect_spark)
    assert "Spark Connect" in session_kind(connect_spark)
    classic = object.__new__(ClassicSession)  # the class alone: a classic JVM cannot start in a Connect process
    assert not is_connect_session(classic)
    assert session_kind(classic) == "a classic SparkSession"


def test_the_connect_server_runs_spark_jobs_on_this_interpreter(connect_spark):
    import sys

    def where(rows):
        import sys as worker_sys

        import pyarrow as pa

        for _ in rows:
            pass
        yield pa.RecordBatch.from_pydict({"python": [worker_sys.executable]})

    got = connect_spark.range(2).repartition(2).mapInArrow(where, "python string").collect()
    assert {r.python for r in got} == {sys.executable}


def test_asking_a_connect_session_for_a_spark_context_names_what_it_got(connect_spark):
    with pytest.raises(ConfigError, match="Spark Connect session .* has no SparkContext"):
        spark_context(connect_spark)


def test_a_non_session_is_named_in_the_error():
    with pytest.raises(ConfigError, match="expected a SparkSession or SparkContext, got int"):
        SparkNetwork(3, Network(mlp(4, 8, 2), seed=0))


def test_missing_connect_packages_are_named(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec

    def without_grpc(name, *args, **kwargs):
        return None if name == "grpc" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", without_grpc)
    with pytest.raises(SetupError, match=r"grpcio.*pip install 'torchspark\[connect\]'"):
        check_connect_packages()
    assert CONNECT_PACKAGES["grpc"] == "grpcio"


def test_a_server_that_cannot_start_fails_with_its_log(tmp_path):
    with pytest.raises(SetupError, match="Spark Connect server .* exited with code"):
        start_connect_server("no-such-master://x", log_path=str(tmp_path / "server.log"), timeout_s=120)
