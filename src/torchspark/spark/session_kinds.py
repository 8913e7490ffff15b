"""Which kind of Spark session a user handed us: classic (with a ``SparkContext``) or Spark Connect.

PySpark 4 has two ``SparkSession`` classes of the same name: ``pyspark.sql.session.SparkSession`` (classic, a JVM in
this process) and ``pyspark.sql.connect.session.SparkSession`` (a gRPC client of a Spark Connect server). Error
messages must say which one they got: both print as ``SparkSession``.
"""

from __future__ import annotations

from typing import Any

from torchspark.errors import ConfigError

__all__ = ["is_connect_session", "session_kind", "require_classic"]


def is_connect_session(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (or a Connect DataFrame's session).

    Example: ``is_connect_session(SparkSession.builder.remote("sc://localhost:15002").getOrCreate())`` -> True.
    """
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_kind(spark: Any) -> str:
    """A short description of what ``spark`` is, for messages: ``"a Spark Connect session"``, ``"a classic
    SparkSession"``, ``"a SparkContext"`` or the type's name."""
    if is_connect_session(spark):
        return "a Spark Connect session (pyspark.sql.connect.session.SparkSession)"
    module = type(spark).__module__
    name = type(spark).__name__
    if module.startswith("pyspark") and name == "SparkSession":
        return "a classic SparkSession"
    if module.startswith("pyspark") and name == "SparkContext":
        return "a SparkContext"
    return f"{name} (from {module})"


def require_classic(spark: Any, what: str, instead: str) -> None:
    """Raise ``ConfigError`` when ``spark`` is a Connect session: ``what`` needs a SparkContext (RDDs, broadcast);
    ``instead`` names what works under Connect.

    Example: ``require_classic(spark, "an RDD[DataSet] input", "pass a DataFrame")``.
    """
    if is_connect_session(spark):
        raise ConfigError(
            f"{what} needs a classic Spark session with a SparkContext, but this is "
            f"{session_kind(spark)}, which has no SparkContext or RDDs; {instead}"
        )
