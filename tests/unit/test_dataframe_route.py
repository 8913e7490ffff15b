"""``dataframe_route``: its values, and the combinations ``"barrier_arrow"`` (the Connect route's stage on a classic
session) refuses at construction, naming the value and the fix."""

from __future__ import annotations

import pytest

from torchspark.errors import ConfigError
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster
from torchspark.training.config.masters import master_from_json


@pytest.mark.parametrize("cls", [ParameterAveragingTrainingMaster, SharedTrainingMaster])
def test_default_is_rdd_and_the_route_round_trips_through_json(cls) -> None:
    assert cls().dataframe_route == "rdd"
    master = cls(num_workers=2, dataframe_route="barrier_arrow")
    assert master_from_json(master.to_json()).dataframe_route == "barrier_arrow"


def test_unknown_route_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"dataframe_route.*'rdd', 'barrier_arrow'.*'arrow'"):
        ParameterAveragingTrainingMaster(dataframe_route="arrow")


@pytest.mark.parametrize(
    "cls, option, value",
    [
        (ParameterAveragingTrainingMaster, "averaging_via", "spark"),
        (ParameterAveragingTrainingMaster, "repartition", "never"),
        (ParameterAveragingTrainingMaster, "repartition_strategy", "spark_default"),
        (SharedTrainingMaster, "workers_per_node", 2),
        (SharedTrainingMaster, "gpus_per_worker", 1),
    ],
)
def test_barrier_arrow_refuses_what_its_one_stage_cannot_run(cls, option, value) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"dataframe_route='barrier_arrow'.*{option}={value!r}.*"
        r"dataframe_route='rdd'",
    ):
        cls(dataframe_route="barrier_arrow", **{option: value})
    cls(dataframe_route="rdd", **{option: value})  # the RDD routes take it
