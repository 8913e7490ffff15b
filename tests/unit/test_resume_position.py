"""Resume positions that cannot lie (issue 44): a checkpoint cut inside an epoch records a fingerprint of the
minibatches trained before the cut, and a resume whose data gives the rank other minibatches there (another batch
size, data size or order) is refused naming what changed, or with ``restart_epoch=True`` trains that epoch again;
a checkpoint of another run copied into this run's directory is refused. In one process (workers as threads); the
worker-process and Spark routes are tests/multiprocess/test_parallel_resume.py and tests/spark/test_checkpoint_spark.py.
"""

from __future__ import annotations

import shutil
from functools import partial

import pytest

from helpers import onehot_rule_data
from interrupting import InterruptingMLP
from torchspark import Network, optim
from torchspark.errors import ConfigError, WorkerError
from torchspark.parallel import ParallelWrapper
from torchspark.training import InProcessRunner
from torchspark.training.checkpoint import RankProgress, RestoredRank, complete_checkpoints, plan_for, store
from torchspark.training.checkpoint.position import Position, PositionTap
from torchspark.training.worker.loop import load_item
from torchspark.training.worker.resuming import resume_epoch

_data = partial(onehot_rule_data, 192, seed=3)
REFUSED = r"resuming would skip examples never trained and train others twice.*restart_epoch=True"


def _net(after: int | None = None) -> Network:
    return Network(InterruptingMLP(12, 16, 3, after=after, same_process=True), updater=optim.Adam(lr=0.01), seed=0)


def _wrapper(net: Network, directory) -> ParallelWrapper:
    return ParallelWrapper(
        net,
        num_workers=2,
        averaging_frequency=3,
        progress=False,
        runner=InProcessRunner(timeout_s=60),
        checkpoint_directory=str(directory),
        checkpoint_every=1,
    )


def _interrupted(directory, run_id: str = "r1") -> str:
    """Run ``run_id`` stopped inside epoch 2 (each worker: 6 minibatches of 16 per epoch), cut after 3 of them."""
    with pytest.raises(WorkerError, match="worker stopped after 15 minibatches"):
        _wrapper(_net(after=15), directory).fit(_data(), epochs=3, batch_size=16, run_id=run_id)
    cut = complete_checkpoints(str(directory), run_id)[-1]
    assert (cut.manifest["fit_epoch"], store.read_rank_file(cut.path, 0)[1]["done"]) == (2, 3)
    return cut.path


# Each change keeps 6 minibatches per worker and epoch (the count the cut records), so only the fingerprint of the
# minibatches trained before the cut can tell: before it, these resumes were accepted and skipped or repeated examples.
CHANGES = [
    pytest.param(dict(data=_data().shuffle(7)), r"the data order or content changed", id="order"),
    pytest.param(
        dict(data=_data().slice(0, 190)), r"the batch size or the data size changed: .* 16 .* 17 now", id="size"
    ),
    pytest.param(
        dict(batch_size=18),
        r"the batch size or the data size changed: .* had 16 examples then and has 1[28] now",
        id="batch",
    ),
]


@pytest.mark.parametrize("change, match", CHANGES)
def test_a_mid_epoch_resume_whose_data_gives_other_minibatches_is_refused(tmp_path, change, match) -> None:
    path = _interrupted(tmp_path)
    assert store.read_rank_file(path, 0)[1]["position"]["minibatches"] == 3  # what the cut fingerprints
    fit = dict(data=_data(), batch_size=16) | change
    with pytest.raises(ConfigError, match=rf"rank-\d.safetensors.*cut after 3 minibatches of epoch 2.*{match}.*"):
        _wrapper(_net(), tmp_path).fit(fit["data"], epochs=3, batch_size=fit["batch_size"], run_id="r1")
    with pytest.raises(ConfigError, match=REFUSED):  # refused again: nothing was trained or written meanwhile
        _wrapper(_net(), tmp_path).fit(fit["data"], epochs=3, batch_size=fit["batch_size"], run_id="r1")


def test_the_same_data_resumes_and_restart_epoch_trains_a_changed_epoch_again_from_its_start(tmp_path) -> None:
    _interrupted(tmp_path)
    shutil.copytree(tmp_path / "r1", tmp_path / "copy")  # the same cut, for the second half
    # the same data: each worker trains the 3 minibatches left of epoch 2, not one more
    _wrapper(_net(after=3), tmp_path).fit(_data(), epochs=3, batch_size=16, run_id="r1")

    # another order with restart_epoch=True: epoch 2 is trained whole (6 minibatches; after=5 would stop it)
    shutil.rmtree(tmp_path / "r1")
    shutil.move(tmp_path / "copy", tmp_path / "r1")
    with pytest.raises(WorkerError, match="worker stopped after 5 minibatches"):
        _wrapper(_net(after=5), tmp_path).fit(
            _data().shuffle(7), epochs=3, batch_size=16, run_id="r1", restart_epoch=True
        )
    net = _net(after=6)
    _wrapper(net, tmp_path).fit(_data().shuffle(7), epochs=3, batch_size=16, run_id="r1", restart_epoch=True)
    assert (net.epoch, net.iteration) == (3, 12 + 3 + 6)  # 2 epochs, 3 minibatches before the cut, epoch 2 again


def test_restart_epoch_needs_a_bool_and_a_run_id(tmp_path) -> None:
    wrapper = _wrapper(_net(), tmp_path)
    with pytest.raises(ConfigError, match="restart_epoch=True applies to a resumed run, but no run_id was given"):
        wrapper.fit(_data(), batch_size=16, restart_epoch=True)
    with pytest.raises(ConfigError, match="restart_epoch must be True or False, got 'yes'"):
        plan_for(wrapper.master, "r1", 0, 0, "yes")


def test_a_checkpoint_of_another_run_copied_into_this_runs_directory_is_refused(tmp_path) -> None:
    path = _interrupted(tmp_path, "r1")
    shutil.copytree(path, tmp_path / "r2" / path.rsplit("/", 1)[-1])
    with pytest.raises(ConfigError, match=r"was written by run 'r1', not by run 'r2'.*run_id='r1'"):
        _wrapper(_net(), tmp_path).fit(_data(), epochs=3, batch_size=16, run_id="r2")


# ------------------------------------------------------------------ the worker's check, on a stream read once
def _restored(done: int, position: Position | None) -> RestoredRank:
    return RestoredRank(done, RankProgress(), position=position, where="rank-0")


def test_a_stream_is_checked_on_the_minibatches_it_skips_and_restarts_whole() -> None:
    batches = _data().split(16)
    tap = PositionTap()
    assert list(tap(iter(batches))) == batches
    saved = tap.at(4)
    assert (saved.minibatches, saved.examples, saved.first_batch) == (4, 64, 16)

    stream = iter(batches)  # the same data, read once: exactly the 4 skipped ones are taken
    rest, skipped, start = resume_epoch(_restored(4, saved), 0, stream, load_item, restart=False)
    assert (list(rest), skipped, start) == (batches[4:], 4, saved)

    swapped = [batches[1], batches[0], *batches[2:]]
    with pytest.raises(ConfigError, match="rank-0: the checkpoint was cut after 4 minibatches of epoch 0.*order"):
        resume_epoch(_restored(4, saved), 0, iter(swapped), load_item, restart=False)
    rest, skipped, start = resume_epoch(_restored(4, saved), 0, iter(swapped), load_item, restart=True)
    assert (list(rest), skipped, start) == (swapped, 0, None)  # the epoch again, the skipped ones included

    with pytest.raises(ConfigError, match="only 2 minibatches for this rank, fewer than the 4 trained"):
        resume_epoch(_restored(4, saved), 0, iter(batches[:2]), load_item, restart=False)
    # no fingerprint (an elastic re-sharding re-deals the data): the count alone, as before
    rest, skipped, _ = resume_epoch(_restored(4, None), 0, iter(swapped), load_item, restart=False)
    assert (list(rest), skipped) == (swapped[4:], 4)
