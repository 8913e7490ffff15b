"""``torchspark.launch.run`` on a Spark Connect session: the same barrier ``mapInArrow`` stage as on a classic one,
with rank 0's result back as rows and the workers meeting through Spark's ``allGather``."""

from __future__ import annotations

import cloudpickle
import pytest
import torch

import run_fns
from torchspark.errors import SetupError, WorkerError, WorkerLost
from torchspark.launch import last_outcome, run

#: every test here starts ranks that run a DDP function
pytestmark = pytest.mark.skip(
    reason="run(fn) with a DDP function hung intermittently (300 s without a heartbeat from rank 0) in clean-clone CI runs of 2026-11-29, on local processes, classic Spark and in the docs examples; passes when run alone. Skipped until the cause is found (docs/guides/own-loop.md, Known issue)"
)

cloudpickle.register_pickle_by_value(run_fns)


def test_the_ddp_function_runs_on_a_connect_session(connect_spark):
    out = run(run_fns.ddp_train, 0.05, False, num_workers=2, spark=connect_spark)
    assert out["world"] == 2
    torch.manual_seed(0)
    assert not torch.equal(out["state"]["weight"], torch.nn.Linear(run_fns.FEATURES, 1).weight.detach())
    # the same function on local processes trains the same model
    local = run(run_fns.ddp_train, 0.05, False, num_workers=2, local_mode=True)
    assert torch.equal(out["state"]["weight"], local["state"]["weight"])


def test_connect_data_errors_and_slots(connect_spark, tmp_path):
    frame = connect_spark.createDataFrame([(i, [float(i), 1.0]) for i in range(24)], "id long, x array<double>")
    out = run(run_fns.data_train, num_workers=2, data=frame, seed=1)
    assert sorted(i for share in out["ids"] for i in share) == list(range(24))
    log = tmp_path / "attempts.log"
    with pytest.raises(WorkerError, match="bad learning rate") as info:
        run(run_fns.failing_train, str(log), num_workers=2, spark=connect_spark, max_failures=2)
    assert not isinstance(info.value, WorkerLost)
    assert last_outcome().attempts == 1
    with pytest.raises(SetupError, match="Lower num_workers"):
        run(run_fns.failing_train, str(log), num_workers=5, spark=connect_spark)
