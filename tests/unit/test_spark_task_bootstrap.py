"""The one Spark task bootstrap (``torchspark.spark.task_bootstrap``), with stand-ins for TaskContext objects."""

from __future__ import annotations

from typing import Any

import pytest

from torchspark.errors import SetupError
from torchspark.spark.task_bootstrap import TaskSetup, set_up_task


class _Gpu:
    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)


class _Context:
    """A TaskContext-like object: resources() always, cpus() only when given."""

    def __init__(self, resources: dict[str, Any] | None = None, cpus: Any = None) -> None:
        self._resources = resources or {}
        if cpus is not None:
            self.cpus = lambda: cpus

    def resources(self) -> dict[str, Any]:
        return self._resources


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        (None, TaskSetup("cpu", 1)),  # outside a Spark task
        (_Context(), TaskSetup("cpu", 1)),  # a context without cpus()
        (_Context(cpus=4), TaskSetup("cpu", 4)),
        (_Context(cpus=0), TaskSetup("cpu", 1)),  # at least one core
        (_Context({"gpu": _Gpu()}, cpus=2), TaskSetup("cpu", 2)),  # a GPU resource without addresses
    ],
)
def test_device_and_cores_of_a_task(ctx: Any, expected: TaskSetup) -> None:
    assert set_up_task(ctx) == expected


def test_an_assigned_gpu_without_cuda_is_a_setup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SetupError, match="Spark assigned GPU '0' to this task but torch has no CUDA"):
        set_up_task(_Context({"gpu": _Gpu("0")}, cpus=1))


def test_a_task_reports_the_gpu_addresses_spark_assigned() -> None:
    import torch

    ctx = _Context({"gpu": _Gpu("1", "3")}, cpus=2)
    # the dry run (a testing aid) records the assignment and trains on the CPU, where torch has no CUDA
    assert set_up_task(ctx, gpu_dry_run=True) == TaskSetup("cpu", 2, ("1", "3"))
    if torch.cuda.is_available():
        assert set_up_task(ctx).gpu_addresses == ("1", "3")
    else:  # without the dry run the task refuses a GPU it cannot use, naming the address
        with pytest.raises(SetupError, match="Spark assigned GPU '1' to this task but torch has no CUDA"):
            set_up_task(ctx)
    assert set_up_task(_Context(cpus=2), gpu_dry_run=True) == TaskSetup("cpu", 2, ())  # no GPU: nothing to record
