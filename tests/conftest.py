"""Shared fixtures: one real local Spark session for the whole run (a session takes seconds to start)."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    from torchspark.spark import local_session

    session = local_session(cores=2, app_name="torchspark-tests", rendezvous_timeout_s=120)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    return spark.sparkContext
