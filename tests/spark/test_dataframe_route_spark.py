"""``dataframe_route="barrier_arrow"`` on a classic session: a DataFrame takes the Spark Connect route's one barrier
``mapInArrow`` stage (no export files), with the same parameters as the RDD route for the same seed and data; RDD
inputs keep the RDD routes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import mlp_net
from torchspark.data import DataSet
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

MASTERS = {"averaging": ParameterAveragingTrainingMaster, "sharing": SharedTrainingMaster}


@pytest.fixture(scope="module")
def frame(spark):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(150, 6))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    return (
        spark.createDataFrame([(r.tolist(), int(v)) for r, v in zip(x, y)], "features array<double>, label long")
        .repartition(3)
        .cache()
    )


def _fit(spark, data, kind: str, route: str, export_dir) -> tuple[torch.Tensor, list[str]]:
    """The trained parameters, and the files under ``export_dir`` after the fit (``close()`` removes them)."""
    net = mlp_net(6, 8, 2)
    master = MASTERS[kind](
        batch_size_per_worker=8, num_workers=2, rng_seed=5, dataframe_route=route, export_directory=str(export_dir)
    )
    with SparkNetwork(spark, net, master, progress=False) as snet:
        snet.fit(data, epochs=2)
        files = [str(p) for p in export_dir.rglob("*") if p.is_file()] if export_dir.exists() else []
    return net.params().clone(), files


@pytest.mark.parametrize("kind", sorted(MASTERS))
def test_barrier_arrow_streams_the_frame_and_trains_what_the_rdd_route_trains(spark, frame, tmp_path, kind) -> None:
    rdd_params, rdd_files = _fit(spark, frame, kind, "rdd", tmp_path / "rdd")
    arrow_params, arrow_files = _fit(spark, frame, kind, "barrier_arrow", tmp_path / "arrow")
    assert rdd_files, "the RDD route exports the DataFrame as batch files"
    assert not arrow_files, "barrier_arrow streams the rows: no export files"
    torch.testing.assert_close(arrow_params, rdd_params, rtol=0, atol=1e-6)


def test_an_rdd_input_keeps_the_rdd_route_under_barrier_arrow(spark, sc, tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    sets = [DataSet(torch.randn(16, 6, generator=g), torch.randint(0, 2, (16,), generator=g)) for _ in range(4)]
    _, files = _fit(spark, sc.parallelize(sets, 2), "averaging", "barrier_arrow", tmp_path / "rdd_input")
    assert files, "an RDD[DataSet] trains through the export as before"
