"""Checkpoints and resume by run id, in one process (workers as threads): the options, the storage layout, and a fit
interrupted mid-epoch then resumed with the same run id ending where an uninterrupted fit ends."""

from __future__ import annotations

import json
import os
from functools import partial

import pytest
import torch

from helpers import averaging_only, onehot_rule_data
from interrupting import InterruptingMLP
from torchspark import Network, optim
from torchspark.encoding import FixedThreshold
from torchspark.errors import ConfigError, WorkerError
from torchspark.parallel import ParallelWrapper
from torchspark.training import InProcessRunner, ParameterAveragingTrainingMaster, SharedTrainingMaster
from torchspark.training.checkpoint import complete_checkpoints, newest_checkpoint, store
from torchspark.training.driver.fit import build_task
from torchspark.training.driver.resume import resume_task
from torchspark.training.hooks import NullRecorder

MASTERS = [ParameterAveragingTrainingMaster, SharedTrainingMaster]


_data = partial(onehot_rule_data, 192, seed=3)


def _net(after: int | None = None) -> Network:
    return Network(InterruptingMLP(12, 16, 3, after=after, same_process=True), updater=optim.Adam(lr=0.01), seed=0)


def _wrapper(net: Network, mode: str, **options) -> ParallelWrapper:
    return ParallelWrapper(
        net,
        num_workers=2,
        training_mode=mode,
        **averaging_only(mode, 3),
        progress=False,
        runner=InProcessRunner(timeout_s=60),
        **options,
    )


MODES = [("averaging", {}), ("sharing", {"overlap": True}), ("sharing", {"overlap": False})]


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("cls", MASTERS)
@pytest.mark.parametrize(
    "bad, match",
    [
        ({"checkpoint_directory": ""}, "checkpoint_directory must be a directory path or fsspec URL"),
        ({"checkpoint_directory": 3}, "checkpoint_directory must be"),
        ({"checkpoint_directory": "/tmp/x", "checkpoint_every": 0}, "checkpoint_every must be an integer >= 1"),
        ({"checkpoint_directory": "/tmp/x", "checkpoint_every": True}, "checkpoint_every must be an integer >= 1"),
        ({"checkpoint_directory": "/tmp/x", "keep_checkpoints": 0}, "keep_checkpoints must be an integer >= 1"),
        ({"checkpoint_every": 5}, "checkpoint_every=5 needs a checkpoint_directory"),
    ],
)
def test_checkpoint_options_are_checked_at_construction(cls, bad, match) -> None:
    with pytest.raises(ConfigError, match=f"{cls.__name__}: {match}"):
        cls(**bad)


def test_checkpoint_options_round_trip_and_reach_parallel_wrapper(tmp_path) -> None:
    master = SharedTrainingMaster(checkpoint_directory=str(tmp_path), checkpoint_every=7, keep_checkpoints=3)
    assert SharedTrainingMaster.from_json(master.to_json()) == master
    wrapper = _wrapper(_net(), "averaging", checkpoint_directory=str(tmp_path), checkpoint_every=4, keep_checkpoints=1)
    assert (wrapper.master.checkpoint_directory, wrapper.master.checkpoint_every, wrapper.master.keep_checkpoints) == (
        str(tmp_path),
        4,
        1,
    )
    with pytest.raises(ConfigError, match=r"keep_checkpoints must be an integer >= 1 .*got -1"):
        _wrapper(_net(), "averaging", checkpoint_directory=str(tmp_path), keep_checkpoints=-1)


def test_averaging_via_spark_accepts_checkpoints(tmp_path) -> None:
    master = ParameterAveragingTrainingMaster(averaging_via="spark", checkpoint_directory=str(tmp_path))
    assert master.checkpoint_directory == str(tmp_path)  # the driver checkpoints the rounds (spark.rounds_state)


def test_run_id_needs_a_checkpoint_directory_and_a_plain_name(tmp_path) -> None:
    with pytest.raises(ConfigError, match="run_id='r1'.*no checkpoint_directory"):
        _wrapper(_net(), "averaging").fit(_data(), epochs=1, run_id="r1")
    with pytest.raises(ConfigError, match="run_id must be 1-128 letters"):
        _wrapper(_net(), "averaging", checkpoint_directory=str(tmp_path)).fit(_data(), run_id="../up")


# ------------------------------------------------------------------ what a fit writes
@pytest.mark.parametrize("mode, extra", MODES[:2])
def test_a_fit_checkpoints_every_epoch_by_default_and_keeps_the_newest(tmp_path, mode, extra) -> None:
    _wrapper(_net(), mode, checkpoint_directory=str(tmp_path), keep_checkpoints=2, **extra).fit(
        _data(), epochs=3, batch_size=16, run_id="r1"
    )
    found = complete_checkpoints(str(tmp_path), "r1")
    assert [c.manifest["fit_epoch"] for c in found] == [2, 3]  # one per epoch, the newest 2 kept
    assert sorted(os.listdir(tmp_path / "r1")) == [os.path.basename(c.path) for c in found]  # nothing else left
    names = sorted(os.listdir(found[-1].path))
    assert names == ["manifest.json", "rank-0.safetensors", "rank-1.safetensors"]
    manifest = json.loads((tmp_path / "r1" / os.path.basename(found[-1].path) / "manifest.json").read_text())
    assert manifest["run_id"] == "r1" and manifest["world_size"] == 2 and manifest["mode"] in ("averaging", "sharing")
    assert manifest["master"]["checkpoint_directory"] == str(tmp_path) and "config" not in manifest["network"]


def test_checkpoint_every_and_keep_checkpoints_change_what_is_written(tmp_path) -> None:
    # 192 examples / 2 workers / 16 = 6 minibatches per worker, averaging_frequency=3: 2 rounds per epoch
    _wrapper(_net(), "averaging", checkpoint_directory=str(tmp_path), checkpoint_every=3, keep_checkpoints=4).fit(
        _data(), epochs=3, batch_size=16, run_id="r1"
    )
    steps = [c.step for c in complete_checkpoints(str(tmp_path), "r1")]
    assert steps == [3, 6]  # every 3 rounds (the end of the fit is round 6 too)
    _wrapper(_net(), "averaging", checkpoint_directory=str(tmp_path), checkpoint_every=1, keep_checkpoints=4).fit(
        _data(), epochs=3, batch_size=16, run_id="r2"
    )
    assert [c.step for c in complete_checkpoints(str(tmp_path), "r2")] == [3, 4, 5, 6]


def test_the_final_prune_waits_for_a_slow_ranks_last_file(tmp_path, monkeypatch) -> None:
    """Rank 1 writes its file of the last checkpoint late: rank 0 must not prune before it is there (averaging's
    end of fit has no collective of its own), or keep_checkpoints + 1 complete checkpoints are left."""
    import time

    real = store.write_rank_file

    def slow_last(path, rank, tensors, meta):
        if rank == 1 and meta["step"] == 6:
            time.sleep(0.5)  # the race, made certain: rank 0 has long written its file and the manifest
        return real(path, rank, tensors, meta)

    monkeypatch.setattr(store, "write_rank_file", slow_last)
    _wrapper(_net(), "averaging", checkpoint_directory=str(tmp_path), checkpoint_every=1, keep_checkpoints=2).fit(
        _data(), epochs=3, batch_size=16, run_id="slow"
    )
    assert [c.step for c in complete_checkpoints(str(tmp_path), "slow")] == [5, 6]


def test_readers_ignore_incomplete_checkpoints_and_pruning_keeps_complete_ones(tmp_path) -> None:
    root = str(tmp_path)

    def record(step: int, rank: int) -> dict:
        return {
            "rank": rank,
            "step": step,
            "fit_epoch": 0,
            "done": 0,
            "iteration": 0,
            "epoch": 0,
            "examples": 0,
            "iterations": 0,
        }

    def manifest(step: int) -> dict:
        return {
            "world_size": 2,
            "step": step,
            "fit_epoch": 0,
            "iteration": 0,
            "epoch": 0,
            "mode": "averaging",
            "settings": {},
        }

    for step in (1, 2, 3):
        path = store.step_directory(root, "r", step)
        store.write_rank_file(path, 0, {"x": torch.zeros(2)}, record(step, 0))
        if step != 2:
            store.write_rank_file(path, 1, {"x": torch.zeros(2)}, record(step, 1))
        if step != 3:
            store.write_manifest(path, manifest(step))
    # step 2 misses rank 1's file, step 3 its manifest: neither counts
    assert [c.step for c in complete_checkpoints(root, "r")] == [1]
    assert newest_checkpoint(root, "r").step == 1
    assert store.prune(root, "r", keep=1) == []  # the only complete one stays, and the newer incomplete ones too
    store.write_manifest(store.step_directory(root, "r", 3), manifest(3))
    deleted = store.prune(root, "r", keep=1)
    assert [os.path.basename(p) for p in deleted] == ["step-0000000001", "step-0000000002"]
    assert newest_checkpoint(root, "r").step == 3
    assert newest_checkpoint(root, "none") is None


def test_resume_task_without_a_checkpoint_returns_the_task_unchanged(tmp_path) -> None:
    master = ParameterAveragingTrainingMaster(checkpoint_directory=str(tmp_path))
    task = build_task(_net(), master, 2, False, NullRecorder(), run_id="fresh")
    again, point = resume_task(task)
    assert point is None and again == task
    plain = build_task(_net(), ParameterAveragingTrainingMaster(), 2, False, NullRecorder())
    assert resume_task(plain) == (plain, None) and plain.checkpoint is None


# ------------------------------------------------------------------ resume equivalence
@pytest.mark.parametrize("mode, extra", MODES)
def test_an_interrupted_fit_resumed_by_run_id_ends_where_an_uninterrupted_one_does(tmp_path, mode, extra) -> None:
    data, epochs = _data(), 3
    reference = _net()
    _wrapper(reference, mode, **extra).fit(data, epochs=epochs, batch_size=16)

    every = 1 if mode == "averaging" else 2  # averaging rounds / sharing exchanges
    options = dict(checkpoint_directory=str(tmp_path), checkpoint_every=every, **extra)
    # each worker has 6 minibatches per epoch: it stops at its 17th, the 5th of epoch 2 (0-based)
    with pytest.raises(WorkerError, match="worker stopped after 16 minibatches"):
        _wrapper(_net(after=16), mode, **options).fit(data, epochs=epochs, batch_size=16, run_id="r1")
    cut = newest_checkpoint(str(tmp_path), "r1")
    done = [store.read_rank_file(cut.path, rank)[1]["done"] for rank in (0, 1)]
    assert cut.manifest["fit_epoch"] == 2 and 0 < done[0] == done[1] < 6  # a cut inside epoch 2
    left = 6 - done[0]

    # a fresh network (as a new driver process builds it) whose workers stop after the minibatches the interrupted
    # fit had left: the resumed fit must train exactly those, not one more
    resumed = _net(after=left)
    wrapper = _wrapper(resumed, mode, **options)
    wrapper.fit(data, epochs=epochs, batch_size=16, run_id="r1")
    if mode == "averaging":
        torch.testing.assert_close(resumed.params(), reference.params(), rtol=0, atol=1e-6)
    else:
        assert torch.equal(resumed.params(), reference.params())
    torch.testing.assert_close(resumed.updater_state(), reference.updater_state(), rtol=0, atol=1e-6)
    assert (resumed.iteration, resumed.epoch) == (reference.iteration, reference.epoch) == (resumed.iteration, 3)
    # each worker trained only what was left: 18 minibatches of the fit minus the ones before the cut
    assert sum(r.iterations for r in wrapper.last_results) == 2 * 18


def test_a_finished_run_resumes_as_finished_and_more_epochs_continue_it(tmp_path) -> None:
    data = _data()
    reference = _net()
    _wrapper(reference, "sharing").fit(data, epochs=3, batch_size=16)
    options = dict(checkpoint_directory=str(tmp_path))
    first = _net()
    _wrapper(first, "sharing", **options).fit(data, epochs=2, batch_size=16, run_id="r1")
    again = _net()
    _wrapper(again, "sharing", **options).fit(data, epochs=2, batch_size=16, run_id="r1")
    assert torch.equal(again.params(), first.params()) and again.epoch == 2  # nothing trained twice
    longer = _net()
    _wrapper(longer, "sharing", **options).fit(data, epochs=3, batch_size=16, run_id="r1")
    assert torch.equal(longer.params(), reference.params())  # as one 3-epoch fit
    with pytest.raises(ConfigError, match="already trained 3 epochs.*asks for epochs=1"):
        _wrapper(_net(), "sharing", **options).fit(data, epochs=1, batch_size=16, run_id="r1")


def test_a_checkpoint_of_another_algorithm_or_world_size_is_refused(tmp_path) -> None:
    options = dict(checkpoint_directory=str(tmp_path))
    _wrapper(_net(), "averaging", **options).fit(_data(), epochs=1, batch_size=16, run_id="r1")
    with pytest.raises(ConfigError, match="trained with 'averaging', this fit uses 'sharing'"):
        _wrapper(_net(), "sharing", **options).fit(_data(), epochs=2, batch_size=16, run_id="r1")
    three = ParallelWrapper(
        _net(), num_workers=3, averaging_frequency=3, progress=False, runner=InProcessRunner(timeout_s=60), **options
    )
    with pytest.raises(ConfigError, match="written by 2 workers but this fit has 3"):
        three.fit(_data(), epochs=2, batch_size=16, run_id="r1")


def test_bounded_staleness_checkpoints_each_epoch_and_resumes_within_the_replicas_spread(tmp_path) -> None:
    """max_staleness checkpoints at epoch ends (no message in flight there). Its replicas differ during a fit by the
    order messages arrived in (floating-point rounding), and rank 0's parameters are saved, so "resume equals
    uninterrupted" holds within that spread: the resumed fit trains exactly the epoch that was left and ends within
    a few threshold steps per parameter of the uninterrupted fit."""
    # a small fixed threshold: every step sends (and every replica applies) many entries
    data, epochs = _data(), 2
    stale = {"max_staleness": 1, "threshold_algorithm": FixedThreshold(1e-3)}
    with pytest.raises(ConfigError, match="max_staleness=1 checkpoints at epoch ends only.*checkpoint_every=2"):
        _wrapper(_net(), "sharing", checkpoint_directory=str(tmp_path), checkpoint_every=2, **stale)
    reference = _net()
    _wrapper(reference, "sharing", **stale).fit(data, epochs=epochs, batch_size=16)
    options = dict(checkpoint_directory=str(tmp_path), **stale)
    with pytest.raises(WorkerError, match="worker stopped after 10 minibatches"):  # inside epoch 1
        _wrapper(_net(after=10), "sharing", **options).fit(data, epochs=epochs, batch_size=16, run_id="r1")
    cut = newest_checkpoint(str(tmp_path), "r1")
    assert cut.manifest["fit_epoch"] == 1
    assert [store.read_rank_file(cut.path, rank)[1]["done"] for rank in (0, 1)] == [0, 0]  # at the epoch's end
    resumed = _net(after=6)  # its workers stop after one more epoch: the resumed fit must train exactly that one
    wrapper = _wrapper(resumed, "sharing", **options)
    wrapper.fit(data, epochs=epochs, batch_size=16, run_id="r1")
    assert (resumed.iteration, resumed.epoch) == (reference.iteration, reference.epoch) == (resumed.iteration, 2)
    assert sum(r.iterations for r in wrapper.last_results) == 2 * 12  # the fit's total, restored + trained
    # two uninterrupted bounded-staleness fits differ the same way: arrival order changes the rounding, and a
    # rounding difference can flip one threshold step (t = 1e-3) of an entry; measured 1-3 t here, bound 20 t
    assert (resumed.params() - reference.params()).abs().max().item() <= 20 * 1e-3
