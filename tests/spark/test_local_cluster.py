"""Training on local-cluster[2,1,1024]: two executor processes, as on a real cluster. The fits run in one child
process shared with the other local-cluster checks (``local_cluster_runs`` in ``conftest.py``)."""

from __future__ import annotations

import pytest

from helpers import assert_replicas_identical

pytestmark = pytest.mark.cluster  # and spark, as every test of this folder


def test_averaging_on_local_cluster(local_cluster_runs) -> None:
    result = local_cluster_runs["averaging"]
    assert "error" not in result, result["error"]
    assert result["accuracy"] >= 0.95, result
    assert result["driver_pid"] not in result["executor_pids"]
    assert len(result["executor_pids"]) >= 2  # separate executor processes did the work
    assert result["distributed_accuracy"] == result["accuracy"]  # evaluation on the executors, merged exactly


def test_gradient_sharing_on_local_cluster(local_cluster_runs) -> None:
    result = local_cluster_runs["sharing"]
    assert "error" not in result, result["error"]
    assert result["accuracy"] >= 0.95, result
    assert len(result["executor_pids"]) >= 2 and result["driver_pid"] not in result["executor_pids"]
    extra = result["extra"]
    common = assert_replicas_identical(result, 2)
    assert common == result["checksum"]  # the driver's model is every rank's replica
    assert extra["sharing.world_size"] == 2
    assert 0 < extra["sharing.bytes_sent"] <= 0.05 * extra["sharing.dense_bytes"], extra
