"""The Spark Connect tier: one Connect server process for the whole run and a client session of it.

This folder runs in its own pytest process (see ``CONNECT_TIER_ENV`` in tests/conftest.py): a Connect client sets
pyspark's process-wide Connect mode, which a classic session in the same process would then trip over.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def connect_server():
    """A Spark Connect server (``local[2]``) in its own process, started with ``spark-submit`` as a cluster would."""
    from torchspark.spark.connect import start_connect_server

    server = start_connect_server("local[2]", conf={"spark.barrier.sync.timeout": "120"})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def connect_spark(connect_server):
    """A Spark Connect client session of :func:`connect_server` (``pyspark.sql.connect.session.SparkSession``)."""
    return connect_server.session()
