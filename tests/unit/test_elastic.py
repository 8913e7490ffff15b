"""Elastic recovery (the masters' ``min_workers``): the world-size policy, the re-sharding of a checkpoint, and whole
fits through a runner double whose attempts lose a worker (threads of this process: no processes, no Spark)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import mlp_net, onehot_rule_data
from torchspark import optim
from torchspark.encoding.codec import threshold_encode
from torchspark.errors import ConfigError, WorkerLost
from torchspark.nn import NetworkBlueprint
from torchspark.parallel import ParallelWrapper
from torchspark.training.algorithms.sharing.rounds import pack
from torchspark.training.checkpoint import store
from torchspark.training.checkpoint.config import CheckpointPlan
from torchspark.training.config.masters import ParameterAveragingTrainingMaster
from torchspark.training.config.shared_master import SharedTrainingMaster
from torchspark.training.driver.adapter import elastic_plan
from torchspark.training.driver.elastic import grow_at_boundary, next_world, repeated_rank, reshard_checkpoint
from torchspark.training.driver.resume import find_resume_point
from torchspark.training.driver.runner import InProcessRunner
from torchspark.training.task import WorkerTask

EPOCHS = 3


@pytest.mark.parametrize(
    ("current", "capacity", "repeated", "expected"),
    [
        (4, None, None, 4),  # nothing known: retry at the same size (a fit without min_workers)
        (4, 3, None, 3),  # an executor gone: go on with the slots left
        (4, 1, None, 4),  # fewer slots than min_workers=2: retry at this size (fails as it would today)
        (4, None, 1, 3),  # rank 1 lost twice in a row at 4: one fewer
        (2, None, 1, 2),  # already at min_workers=2: no further
        (3, None, None, 4),  # after a shrink, the next attempt grows back
        (2, 3, None, 3),  # ... as far as the slots allow
        (4, 4, 0, 3),  # enough slots but a slot that keeps dying
    ],
)
def test_next_world(current, capacity, repeated, expected) -> None:
    new, reason = next_world(current, 4, 2, capacity, repeated)
    assert new == expected
    assert (reason == "") == (new == current)


def test_regrow_never_keeps_a_smaller_world() -> None:
    assert next_world(3, 4, 2, None, None, regrow=False) == (3, "")
    assert next_world(3, 4, 2, 4, None, regrow=False) == (3, "")
    assert next_world(4, 4, 2, 3, None, regrow=False)[0] == 3  # shrinking still happens


@pytest.mark.parametrize(
    ("current", "capacity", "expected"),
    [
        (1, None, 4),  # the runner cannot tell (ParallelWrapper): every worker it was given
        (1, 4, 4),  # the slots are back
        (1, 2, 2),  # some of them: as many as there are
        (2, 2, 2),  # none came back: the next epoch at this size
        (2, 1, 2),  # fewer than now: never shrinks at a boundary (a failure does that)
    ],
)
def test_grow_at_boundary(current, capacity, expected) -> None:
    new, reason = grow_at_boundary(current, 4, capacity)
    assert new == expected
    assert reason == ("capacity returned" if new > current else "")


@pytest.mark.parametrize(
    ("regrow", "directory", "expected"),
    [(None, "d", "epoch"), (None, None, "attempt"), ("attempt", "d", "attempt"), ("never", None, "never")],
)
def test_regrow_is_resolved_and_validated(regrow, directory, expected) -> None:
    master = SharedTrainingMaster(min_workers=1, regrow=regrow, checkpoint_directory=directory)
    plan = elastic_plan("fit", master, 2, lambda n: n)
    assert plan is not None and plan.regrow == expected
    assert SharedTrainingMaster.from_json(master.to_json()).regrow == regrow
    with pytest.raises(ConfigError, match=r"regrow must be one of \[None, 'epoch', 'attempt', 'never'\].*'sometimes'"):
        SharedTrainingMaster(regrow="sometimes")
    with pytest.raises(ConfigError, match="regrow='epoch' .*checkpoint_directory=None; set a checkpoint_directory"):
        ParameterAveragingTrainingMaster(min_workers=1, regrow="epoch")


def test_repeated_rank_needs_the_same_rank_twice_at_the_same_size() -> None:
    assert repeated_rank([(1, 2)], 2) is None
    assert repeated_rank([(1, 2), (1, 2)], 2) == 1
    assert repeated_rank([(0, 2), (1, 2)], 2) is None
    assert repeated_rank([(1, 3), (1, 2)], 2) is None
    assert repeated_rank([(None, 2), (None, 2)], 2) is None


def test_min_workers_is_checked_against_num_workers() -> None:
    with pytest.raises(ConfigError, match=r"min_workers must be an integer in \[1, 2\].*got 3"):
        SharedTrainingMaster(num_workers=2, min_workers=3)
    with pytest.raises(ConfigError, match="min_workers must be an integer >= 1.*got 0"):
        ParameterAveragingTrainingMaster(min_workers=0)
    net = mlp_net(12, 8, 3, updater=optim.SGD(lr=0.1))
    pw = ParallelWrapper(
        net, num_workers=2, training_mode="averaging", min_workers=1, progress=False, runner=InProcessRunner(30)
    )
    with pytest.raises(ConfigError, match="min_workers=1 .*cannot"):  # a one-shot stream cannot be re-dealt
        pw.fit(iter(onehot_rule_data(64).split(16)), epochs=1, batch_size=16)
    wide = ParallelWrapper(
        net,
        num_workers=2,
        master=ParameterAveragingTrainingMaster(min_workers=3),
        progress=False,
        runner=InProcessRunner(30),
    )
    with pytest.raises(ConfigError, match=r"min_workers must be an integer in \[1, 2\].*this fit has 2 workers"):
        wide.fit(onehot_rule_data(64), epochs=1, batch_size=16)


class LosingRunner:
    """An :class:`InProcessRunner` whose attempts in ``lose`` end with rank 1 lost (``WorkerLost``), after training
    the given number of epochs (so a checkpoint exists); ``slots``: what it reports as capacity, one per failure."""

    def __init__(self, lose: dict[int, int], slots: list[int] | None = None) -> None:
        self.inner = InProcessRunner(60.0)
        self.lose = lose
        self.slots = iter(slots or [])
        self.worlds: list[int] = []

    def capacity(self) -> int | None:
        return next(self.slots, None)

    def run(self, task, data, context):
        self.worlds.append(data.workers)
        trained = self.lose.get(context.attempt)
        if trained is None:
            return self.inner.run(task, data, context)
        if trained:
            self.inner.run(dataclasses.replace(task, epochs=trained), data, context)
        raise WorkerLost("injected: worker 1's slot is gone", rank=1, exit_status="signal SIGKILL", reason="injected")


def _master(name: str, tmp_path, **options):
    common = dict(rng_seed=0, collect_training_stats=True, checkpoint_directory=str(tmp_path), **options)
    if name == "averaging":
        return ParameterAveragingTrainingMaster(averaging_frequency=2, **common)
    return SharedTrainingMaster(**common)


def _fit(name: str, tmp_path, runner, **options):
    net = mlp_net(12, 16, 3, updater=optim.Adam(lr=1e-2))
    pw = ParallelWrapper(net, num_workers=2, master=_master(name, tmp_path, **options), progress=False, runner=runner)
    pw.fit(onehot_rule_data(192), epochs=EPOCHS, batch_size=16)
    return net, pw


@pytest.mark.parametrize("name", ["averaging", "sharing"])
def test_a_slot_that_keeps_dying_shrinks_the_world_instead_of_failing_the_fit(name, tmp_path) -> None:
    with pytest.raises(WorkerLost, match="more than max_failures=2"):  # without min_workers: the fit fails
        _fit(name, tmp_path / "rigid", LosingRunner({0: 1, 1: 0, 2: 0}), max_failures=2)
    # the slot dies in attempts 0 and 1 (shrink), and again in attempt 3, which grew back at the epoch boundary
    runner = LosingRunner({0: 1, 1: 0, 3: 0})
    net, pw = _fit(name, tmp_path / "elastic", runner, max_failures=2, min_workers=1)
    assert runner.worlds == [2, 2, 1, 2, 1]  # the growth that did not hold is tried once, and not counted
    summary = pw.training_stats.summary()
    changes = [(c["attempt"], c["epoch"], c["old"], c["new"], c["reason"]) for c in summary["world_changes"]]
    assert changes == [
        (2, 1, 2, 1, "worker 1 was lost in two attempts in a row"),
        (3, 2, 1, 2, "capacity returned"),
        (4, 2, 2, 1, "capacity did not hold: worker 1 lost after growing back"),
    ]
    assert len(summary["failures"]) == 3 and len(pw.last_results) == 1
    assert net.epoch == EPOCHS and summary["examples"] == EPOCHS * 192
    undisturbed, _ = _fit(name, tmp_path / "undisturbed", InProcessRunner(60.0))
    data = onehot_rule_data(192)
    accuracy, reference = net.evaluate(data).accuracy(), undisturbed.evaluate(data).accuracy()
    assert accuracy >= reference - 0.05, (accuracy, reference)  # 192 examples: one example is 0.5 pp


def test_averaging_on_fewer_workers_continues_as_a_one_worker_fit_from_the_checkpoint(tmp_path) -> None:
    """The elastic fit equals its reference: 1 epoch on 2 workers, then the rest on 1 worker from that state."""
    net, _ = _fit("averaging", tmp_path / "a", LosingRunner({0: 1, 1: 0}), min_workers=1, regrow="attempt")
    ref = mlp_net(12, 16, 3, updater=optim.Adam(lr=1e-2))
    master = _master("averaging", tmp_path / "b")
    ParallelWrapper(ref, num_workers=2, master=master, progress=False, runner=InProcessRunner(60)).fit(
        onehot_rule_data(192), epochs=1, batch_size=16
    )
    ParallelWrapper(ref, num_workers=1, master=master, progress=False, runner=InProcessRunner(60)).fit(
        onehot_rule_data(192), epochs=EPOCHS - 1, batch_size=16
    )
    torch.testing.assert_close(net.params(), ref.params())


def test_capacity_shrinks_at_once_and_a_later_attempt_grows_back(tmp_path) -> None:
    runner = LosingRunner({0: 1, 1: 0}, slots=[1, 2])  # after attempt 0: one slot left; after attempt 1: both back
    net, pw = _fit("sharing", tmp_path, runner, min_workers=1)
    assert runner.worlds == [2, 1, 2]
    changes = [(c["old"], c["new"], c["reason"]) for c in pw.training_stats.summary()["world_changes"]]
    assert changes == [(2, 1, "only 1 worker slot(s) left after the failure"), (1, 2, "capacity returned")]
    assert net.epoch == EPOCHS and pw.training_stats.summary()["examples"] == EPOCHS * 192


def test_averaging_grown_back_at_an_epoch_boundary_continues_as_the_fits_of_each_size(tmp_path) -> None:
    """Epoch 0 on 2 workers, epoch 1 on 1 (a slot lost twice), epoch 2 on 2 again (grown at the boundary, no
    failure): the same as three fits of those sizes in a row. (Gradient sharing is not compared: a fit's end
    averages the updater states, a re-sharded checkpoint keeps each rank's own; its residuals are checked in
    test_resharding_keeps_every_update_owed_and_deals_the_position.)"""
    net, pw = _fit("averaging", tmp_path / "a", LosingRunner({0: 1, 1: 0}), min_workers=1)
    assert [(c["old"], c["new"]) for c in pw.training_stats.summary()["world_changes"]] == [(2, 1), (1, 2)]
    ref = mlp_net(12, 16, 3, updater=optim.Adam(lr=1e-2))
    master = _master("averaging", tmp_path / "b")
    for workers in (2, 1, 2):
        ParallelWrapper(ref, num_workers=workers, master=master, progress=False, runner=InProcessRunner(60)).fit(
            onehot_rule_data(192), epochs=1, batch_size=16
        )
    torch.testing.assert_close(net.params(), ref.params())


def test_sharing_grown_back_at_an_epoch_boundary_continues_as_a_fit_on_more_workers(tmp_path) -> None:
    """A slot missing from the start (no checkpoint yet), back at the first boundary: epoch 0 on 1 worker, then 2
    workers; the same as a 1-worker fit followed by a 2-worker fit (the lone worker's residual goes to rank 0, the
    returning rank owes nothing and starts from rank 0's updater state, as a new fit deals them)."""
    net, pw = _fit("sharing", tmp_path / "a", LosingRunner({0: 0}, slots=[1, 2]), min_workers=1)
    assert [(c["old"], c["new"]) for c in pw.training_stats.summary()["world_changes"]] == [(2, 1), (1, 2)]
    ref = mlp_net(12, 16, 3, updater=optim.Adam(lr=1e-2))
    master = _master("sharing", tmp_path / "b")
    for workers, epochs in ((1, 1), (2, EPOCHS - 1)):
        ParallelWrapper(ref, num_workers=workers, master=master, progress=False, runner=InProcessRunner(60)).fit(
            onehot_rule_data(192), epochs=epochs, batch_size=16
        )
    torch.testing.assert_close(net.params(), ref.params())


def test_capacity_back_at_an_epoch_boundary_grows_the_world_without_a_failure(tmp_path) -> None:
    # one failure; the slots: 1 after it, 2 at the boundary of epoch 2
    runner = LosingRunner({0: 1}, slots=[1, 2])
    net, pw = _fit("sharing", tmp_path / "epoch", runner, min_workers=1)
    assert runner.worlds == [2, 1, 2]
    summary = pw.training_stats.summary()
    changes = [(c["attempt"], c["epoch"], c["old"], c["new"], c["reason"]) for c in summary["world_changes"]]
    assert changes == [(1, 1, 2, 1, "only 1 worker slot(s) left after the failure"), (2, 2, 1, 2, "capacity returned")]
    assert len(summary["failures"]) == 1 and len(pw.last_results) == 2
    assert net.epoch == EPOCHS and summary["examples"] == EPOCHS * 192
    assert summary["recovered_from"]["epoch"] == 2
    # the same fit without growing at epoch boundaries ends on the one worker it shrank to
    for regrow in ("attempt", "never"):
        runner = LosingRunner({0: 1}, slots=[1, 2])
        _, pw = _fit("sharing", tmp_path / regrow, runner, min_workers=1, regrow=regrow)
        assert runner.worlds == [2, 1] and len(pw.last_results) == 1


def test_regrow_never_stays_smaller_after_another_failure(tmp_path) -> None:
    runner = LosingRunner({0: 1, 1: 0}, slots=[1, 2])
    _, pw = _fit("sharing", tmp_path, runner, min_workers=1, regrow="never")
    assert runner.worlds == [2, 1, 1]  # "attempt" grows here (test_capacity_shrinks_at_once_...)
    assert [(c["old"], c["new"]) for c in pw.training_stats.summary()["world_changes"]] == [(2, 1)]


def _mid_epoch_checkpoint(tmp_path):
    """A 2-worker gradient-sharing fit with overlap, checkpointed every 3 steps; the newest mid-epoch checkpoint."""
    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.5))
    master = SharedTrainingMaster(
        rng_seed=0, checkpoint_directory=str(tmp_path), checkpoint_every=3, keep_checkpoints=20
    )
    ParallelWrapper(net, num_workers=2, master=master, progress=False, runner=InProcessRunner(60)).fit(
        onehot_rule_data(192), epochs=1, batch_size=16, run_id="r"
    )
    for step, path in reversed(store.step_directories(str(tmp_path), "r")):
        _, meta = store.read_rank_file(path, 0)
        if meta["done"]:
            return step, path
    raise AssertionError("no mid-epoch checkpoint")


def test_resharding_keeps_every_update_owed_and_deals_the_position(tmp_path) -> None:
    step, path = _mid_epoch_checkpoint(tmp_path)
    old = [store.read_rank_file(path, r) for r in range(2)]
    owed = old[0][0]["algo.residual"].double() + old[1][0]["algo.residual"].double()
    # rank 1 had encoded a message at the cut and not sent it yet (overlap=True): it is owed too
    tensors1, meta1 = old[1]
    residual = tensors1["algo.residual"].clone()
    message = threshold_encode(None, residual, float(residual.abs().median()))
    assert message.format != "empty"
    tensors1 = {
        **tensors1,
        "algo.residual": residual,
        "algo.pending": torch.frombuffer(bytearray(pack(message)), dtype=torch.uint8),
    }
    store.write_rank_file(path, 1, tensors1, meta1)

    point = dataclasses.replace(find_resume_point_of(tmp_path), step=step, path=path)
    new_step = reshard_checkpoint(point, 1)
    new_path = store.step_directory(str(tmp_path), "r", new_step)
    new = store.load_checkpoint(new_step, new_path)
    assert new is not None and new.manifest["world_size"] == 1
    assert new.manifest["resharded_from"] == {"step": step, "world_size": 2}
    tensors, meta = store.read_rank_file(new_path, 0)
    assert "algo.pending" not in tensors
    torch.testing.assert_close(tensors["algo.residual"].double(), owed, rtol=0, atol=1e-6)
    assert meta["done"] == sum(m["done"] for _, m in old) and meta["epoch_length"] is None
    assert meta["examples"] == sum(m["examples"] for _, m in old)
    torch.testing.assert_close(tensors["params"], old[0][0]["params"])
    thresholds = [t["algo.threshold_state"][0].item() for t, _ in old]
    assert tensors["algo.threshold_state"][0].item() == pytest.approx(sum(thresholds) / 2)

    # growing back: rank 0 keeps the merged residual, the returning rank owes nothing (no update lost or doubled)
    grown = reshard_checkpoint(dataclasses.replace(point, step=new_step, path=new_path, world_size=1), 2)
    grown_path = store.step_directory(str(tmp_path), "r", grown)
    (t0, m0), (t1, m1) = (store.read_rank_file(grown_path, r) for r in range(2))
    torch.testing.assert_close(t0["algo.residual"].double(), owed, rtol=0, atol=1e-6)
    assert not t1["algo.residual"].any() and "params" not in t1
    torch.testing.assert_close(t1["updater_state"], t0["updater_state"])
    assert m0["done"] + m1["done"] == meta["done"] and m0["examples"] + m1["examples"] == meta["examples"]


def find_resume_point_of(tmp_path):
    """The run's newest checkpoint as a ResumePoint (through the driver's own resume)."""
    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.5))
    master = SharedTrainingMaster(
        rng_seed=0, checkpoint_directory=str(tmp_path), checkpoint_every=3, keep_checkpoints=20
    )
    plan = CheckpointPlan(str(tmp_path), "r", 3, 20, master_json=master.to_json())
    task = WorkerTask(
        master.mode,
        master.algorithm_settings(),
        NetworkBlueprint.of(net).to_bytes(),
        epochs=1,
        checkpoint=plan,
        shuffle_seed=0,
    )
    point = find_resume_point(task)
    assert point is not None
    return point
