"""The rank side of ``torchspark.launch.run`` without processes: the result channel, checkpoints through the
store (integrity-checked, no pickle), the calls outside a run, the torchrun environment, data shares."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
import torch

from torchspark.errors import ConfigError, SerializationError, SetupError
from torchspark.ranks import RankSpec, get_checkpoint, get_context, report, run_rank
from torchspark.ranks.body import load_result, result_parts, ship_function
from torchspark.ranks.checkpoints import check_checkpoint, load_newest, save_checkpoint
from torchspark.ranks.shares import spool
from torchspark.training.checkpoint import CheckpointDamaged


def test_a_result_travels_in_parts_and_is_read_back_from_them():
    value = {"w": torch.arange(10_000, dtype=torch.float32), "name": "x" * 3000}
    parts = list(result_parts(value, part_bytes=1000))
    assert len(parts) > 30 and all(len(p) <= 1000 for p in parts)
    consumed = []

    def stream():
        for p in parts:
            consumed.append(len(p))
            yield p

    back = load_result(stream())
    assert torch.equal(back["w"], value["w"]) and back["name"] == value["name"]
    assert sum(consumed) == sum(len(p) for p in parts)


def test_an_unpicklable_function_is_refused_on_the_driver():
    gen = (i for i in range(3))
    with pytest.raises(SerializationError, match="cannot ship"):
        ship_function(lambda: next(gen), (), {})
    with pytest.raises(SerializationError, match="a function"):
        ship_function(3, (), {})  # type: ignore[arg-type]


def test_what_a_checkpoint_may_be(tmp_path):
    assert check_checkpoint({"w": torch.zeros(2)}) == "state_dict"
    assert check_checkpoint(str(tmp_path)) == "directory"
    for bad, words in [
        ([1, 2], "got a list"),
        ({"w": 1.0}, "entry 'w' is a float"),
        (str(tmp_path / "nope"), "not an existing directory"),
    ]:
        with pytest.raises(ConfigError, match=words):
            check_checkpoint(bad)


def test_state_dict_checkpoints_round_trip_and_a_damaged_one_is_refused(tmp_path):
    base = str(tmp_path)
    save_checkpoint(base, "r", 0, {"w": torch.ones(3)}, {"loss": 1.0}, 1)
    save_checkpoint(base, "r", 1, {"w": torch.full((3,), 2.0)}, {"loss": 0.5, "epoch": 1}, 2)
    state, record = load_newest(base, "r")
    assert torch.equal(state["w"], torch.full((3,), 2.0)) and record["metrics"] == {"loss": 0.5, "epoch": 1.0}
    files = sorted(os.listdir(os.path.join(base, "r", "step-0000000001")))
    assert files == ["manifest.json", "rank-0.safetensors"]  # no pickle anywhere
    rank_file = os.path.join(base, "r", "step-0000000001", "rank-0.safetensors")
    with open(rank_file, "r+b") as f:  # flip one byte of the tensor data
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(CheckpointDamaged, match="checksum"):
        load_newest(base, "r")


def test_outside_run_the_calls_name_the_fix():
    for call in (lambda: report({"loss": 1.0}), get_checkpoint, get_context):
        with pytest.raises(SetupError, match="outside torchspark.launch.run"):
            call()


def test_run_rank_sets_the_torchrun_environment_and_restores_it(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    spec = RankSpec(rank=1, world_size=2, master_addr="10.0.0.1", master_port=29500, local_rank=1, local_world_size=2,
                    run_id="r", checkpoint_dir=str(tmp_path))  # fmt: skip

    def fn(x):
        ctx = get_context()
        report({"loss": 0.25, "epoch": 1})
        report({"loss": 0.5}, checkpoint={"w": torch.zeros(1)})  # rank 1: checked, not stored
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        return x, env, ctx.rank, ctx.reports, get_checkpoint()

    x, env, rank, reports, checkpoint = run_rank(spec, fn, (7,), {})
    assert x == 7 and rank == 1 and reports == 2 and checkpoint is None
    assert env == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert "RANK" not in os.environ
    with pytest.raises(SetupError):
        get_context()  # the run's context ended with it
    with pytest.raises(ConfigError, match="neither|state dict of tensors"):
        run_rank(spec, lambda: report({}, checkpoint=object()), (), {})


def test_a_share_is_reshuffled_per_seed_and_covers_every_row(tmp_path):
    table = pa.table({"id": list(range(10)), "x": [[float(i), 0.0] for i in range(10)]})
    share = spool(table.to_batches(max_chunksize=3), str(tmp_path / "s.arrow"))
    assert share.rows == 10
    one = [i for b in share.batches(1, 4) for i in b["id"].tolist()]
    two = [i for b in share.batches(2, 4) for i in b["id"].tolist()]
    assert sorted(one) == sorted(two) == list(range(10)) and one != two
    assert one == [i for b in share.batches(1, 4) for i in b["id"].tolist()]  # the same seed, the same order
    first = next(share.batches(0, 4, shuffle=False))
    assert first["x"].shape == (4, 2) and first["id"].tolist() == [0, 1, 2, 3]
