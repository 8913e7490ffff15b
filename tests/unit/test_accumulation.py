"""Gradient accumulation (``accumulate_steps``): k micro-batches of B are one optimizer step on k*B examples, in
``Network.fit``, ``train_group``, the sharing fused step and every master's worker loop; every count (averaging
rounds, checkpoints, iterations) is in optimizer steps."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_replicas_identical, fit_in_process, onehot_rule_data
from interrupting import InterruptingMLP
from reference_loops import sharing_reference
from torchspark import DataSet, Network, models, optim
from torchspark.data import BatchGroup, as_group, group_batches, group_examples
from torchspark.encoding import AdaptiveThreshold, EncoderConfig
from torchspark.errors import ConfigError, WorkerError
from torchspark.parallel import ParallelWrapper
from torchspark.training import InProcessRunner, ParameterAveragingTrainingMaster, SharedTrainingMaster
from torchspark.training.algorithms.sharing.fused import train_step_into
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.checkpoint import complete_checkpoints, newest_checkpoint, store
from torchspark.training.comm import SoloCommunicator
from torchspark.training.driver.fit import build_task
from torchspark.training.hooks import NullRecorder, ScoreReport, WorkerHooks
from torchspark.training.worker.loop import ItemSource, run_worker

MASTERS = [ParameterAveragingTrainingMaster, SharedTrainingMaster]


def _data(n: int, seed: int = 0) -> DataSet:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return DataSet(x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long())


def _net(lr: float = 0.1) -> Network:
    return Network(models.mlp(10, 16, 3), updater=optim.SGD(lr=lr), seed=0)


def _cat(batches: list[DataSet]) -> DataSet:
    return DataSet(torch.cat([b.features for b in batches]), torch.cat([b.labels for b in batches]))


# ------------------------------------------------------------------ the grouping of a stream
def test_group_batches_cuts_k_at_a_time_with_a_shorter_last_group() -> None:
    batches = _data(50).split(8)  # 7 minibatches: 6 of 8, one of 2
    groups = list(group_batches(batches, 3))
    assert [len(g) for g in groups] == [3, 3, 1] and all(isinstance(g, BatchGroup) for g in groups)
    assert [g.examples for g in groups] == [24, 24, 2] == [group_examples(g) for g in groups]
    assert group_batches(batches, 1) is batches  # k = 1: the stream itself, no wrapping
    assert as_group(batches[0]) == (batches[0],) and group_examples(batches[0]) == 8
    assert as_group(groups[0]) is groups[0]


# ------------------------------------------------------------------ Network: equal to one large batch
def test_fit_with_accumulation_equals_fit_with_the_large_batch() -> None:
    """100 examples: 8 x 4 = 32 per step, the last step 4 examples, exactly as batch_size=32 cuts them."""
    data = _data(100)
    large, accumulated = _net(), _net()
    large.fit(data, epochs=2, batch_size=32)
    accumulated.fit(data, epochs=2, batch_size=8, accumulate_steps=4)
    torch.testing.assert_close(accumulated.params(), large.params(), rtol=0, atol=1e-5)
    assert accumulated.iteration == large.iteration == 2 * 4  # optimizer steps, not minibatches
    plain = _net().fit(data, epochs=2, batch_size=8)  # the option ignored: 13 steps per epoch, other weights
    assert plain.iteration == 26 and not torch.allclose(plain.params(), large.params(), atol=1e-3)


def test_train_group_is_one_step_returning_the_example_weighted_loss() -> None:
    parts = _data(20).split(8)  # 8, 8, 4 examples
    large, grouped = _net(), _net()
    expected_loss = large.score(_cat(parts))
    loss = large.train_step(_cat(parts))
    assert grouped.train_group(parts) == pytest.approx(loss, abs=1e-6) == pytest.approx(expected_loss, abs=1e-6)
    torch.testing.assert_close(grouped.params(), large.params(), rtol=0, atol=1e-6)
    assert grouped.iteration == 1 and grouped.last_score == pytest.approx(loss, abs=1e-6)


def test_compute_update_and_the_fused_step_take_groups() -> None:
    parts = _data(24).split(8)
    net = Network(models.mlp(10, 16, 3), updater=optim.Adam(lr=0.01), seed=0)
    reference = net.copy().compute_update(_cat(parts))
    torch.testing.assert_close(net.copy().compute_update(BatchGroup(parts)), reference, rtol=0, atol=1e-6)
    target = torch.zeros(net.num_params())
    before = net.params()
    train_step_into(net, target, BatchGroup(parts))
    torch.testing.assert_close(target, reference, rtol=0, atol=1e-6)
    assert torch.equal(net.params(), before) and net.iteration == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, None])
def test_fit_refuses_a_bad_accumulate_steps(bad) -> None:
    with pytest.raises(ConfigError, match=rf"accumulate_steps must be an integer >= 1.*got {bad!r}"):
        _net().fit(_data(8), accumulate_steps=bad)


# ------------------------------------------------------------------ the masters' option
@pytest.mark.parametrize("cls", MASTERS)
@pytest.mark.parametrize("bad", [0, -1, True, "2"])
def test_masters_refuse_a_bad_accumulate_steps(cls, bad) -> None:
    with pytest.raises(ConfigError, match=rf"{cls.__name__}: accumulate_steps must be an integer >= 1"):
        cls(accumulate_steps=bad)


@pytest.mark.parametrize("cls", MASTERS)
def test_accumulate_steps_round_trips_and_reaches_the_task(cls) -> None:
    master = cls(accumulate_steps=4)
    assert cls.from_json(master.to_json()).accumulate_steps == 4
    assert cls.from_yaml(master.to_yaml()).accumulate_steps == 4
    assert build_task(_net(), master, 1, False, NullRecorder()).accumulate_steps == 4
    assert cls().accumulate_steps == 1


def test_averaging_with_accumulation_equals_a_plain_large_batch_loop() -> None:
    """2 workers, averaging every step, SGD: each round is one step on the mean gradient of both workers' groups,
    which is one step on their 2 x 3 x 8 examples together (equal group sizes)."""
    shards = [_data(48, seed=1).split(8), _data(48, seed=2).split(8)]  # 6 minibatches each
    net = _net()
    master = ParameterAveragingTrainingMaster(
        num_workers=2, batch_size_per_worker=8, averaging_frequency=1, accumulate_steps=3
    )
    wrapper = ParallelWrapper(net, master=master, progress=False, runner=InProcessRunner(timeout_s=60))
    wrapper.fit([_cat(shards[0]), _cat(shards[1])], epochs=1)  # balanced split: worker w trains shards[w]

    reference = _net()
    for step in range(2):
        reference.train_step(_cat([*shards[0][3 * step : 3 * step + 3], *shards[1][3 * step : 3 * step + 3]]))
    torch.testing.assert_close(net.params(), reference.params(), rtol=0, atol=1e-5)
    assert net.iteration == 2


def test_the_in_process_runner_trains_groups_of_the_task() -> None:
    shards = [_data(32, seed=1).split(8), _data(32, seed=2).split(8)]
    net = _net()
    results = fit_in_process(
        net, "averaging", {"averaging_frequency": 1, "save_updater": True}, shards, accumulate_steps=2
    )
    reference = _net()
    for step in range(2):
        reference.train_step(_cat([*shards[0][2 * step : 2 * step + 2], *shards[1][2 * step : 2 * step + 2]]))
    torch.testing.assert_close(net.params(), reference.params(), rtol=0, atol=1e-5)
    assert [r.iterations for r in results] == [2, 2] and [r.examples for r in results] == [32, 32]


@pytest.mark.parametrize("k, rounds, steps", [(1, 4, 8), (2, 2, 4), (3, 2, 3)])
def test_averaging_frequency_counts_optimizer_steps(k, rounds, steps) -> None:
    """8 minibatches, averaging_frequency=2: a round every 2 optimizer steps, i.e. every 2k minibatches (k=3: 3
    steps, the last of 2 minibatches)."""
    net = _net()
    task = build_task(
        net, ParameterAveragingTrainingMaster(averaging_frequency=2, accumulate_steps=k), 1, False, NullRecorder()
    )
    reports: list[ScoreReport] = []
    result = run_worker(
        task, ItemSource(_data(64).split(8)), SoloCommunicator(), hooks=WorkerHooks(report_score=reports.append)
    )
    assert len(reports) == rounds and result.iterations == steps and result.examples == 64


@pytest.mark.parametrize("overlap", [True, False])
def test_sharing_with_accumulation_equals_the_reference_loop_over_groups(overlap: bool) -> None:
    """The worker groups its stream (7 minibatches, k=3: groups of 3, 3, 1) and the sharing loop encodes one update
    per group: bit-equal to the few-line reference loop handed those groups (compute_update and the fused step
    take groups)."""
    shards = [_data(56, seed=1).split(8), _data(56, seed=2).split(8)]
    encoder = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))
    net = Network(models.mlp(10, 16, 3), updater=optim.SGD(lr=0.1, momentum=0.9), seed=0)
    grouped = [list(group_batches(shard, 3)) for shard in shards]
    replicas, _ = sharing_reference(net, grouped, 2, overlap, encoder)
    results = fit_in_process(
        net, "sharing", SharingSettings(encoder, overlap=overlap).to_dict(), shards, epochs=2, accumulate_steps=3
    )
    torch.testing.assert_close(net.params(), replicas[0].params(), rtol=0, atol=0)
    assert [r.iterations for r in results] == [2 * 3, 2 * 3] and [r.examples for r in results] == [112, 112]
    assert_replicas_identical(results, 2, net=net)
    plain = Network(models.mlp(10, 16, 3), updater=optim.SGD(lr=0.1, momentum=0.9), seed=0)
    fit_in_process(plain, "sharing", SharingSettings(encoder, overlap=overlap).to_dict(), shards, epochs=2)
    assert not torch.equal(plain.params(), net.params())  # accumulate_steps ignored: 14 steps, other weights


def test_checkpoint_every_counts_optimizer_steps(tmp_path) -> None:
    """Averaging every step, a checkpoint every round: with 8 minibatches per worker and k=2 an epoch has 4 steps,
    so 4 checkpoints, the s-th after s optimizer steps and 2s minibatches (k ignored: 8 per epoch)."""
    master = ParameterAveragingTrainingMaster(
        num_workers=2,
        batch_size_per_worker=8,
        averaging_frequency=1,
        accumulate_steps=2,
        checkpoint_directory=str(tmp_path),
        checkpoint_every=1,
        keep_checkpoints=100,
    )
    net = _net()
    ParallelWrapper(net, master=master, progress=False, runner=InProcessRunner(timeout_s=60)).fit(
        _data(128), epochs=1, run_id="r"
    )
    found = complete_checkpoints(str(tmp_path), "r")
    assert [c.step for c in found] == [1, 2, 3, 4] and net.iteration == 4
    assert [c.manifest["iteration"] for c in found] == [1, 2, 3, 4]
    assert [store.read_rank_file(c.path, 1)[1]["done"] for c in found[:3]] == [2, 4, 6]  # minibatches, mid-epoch


def _interrupting(after: int | None = None) -> Network:
    return Network(InterruptingMLP(12, 16, 3, after=after, same_process=True), updater=optim.Adam(lr=0.01), seed=0)


@pytest.mark.parametrize(
    "mode, options",
    [("averaging", {"averaging_frequency": 1, "checkpoint_every": 1}), ("sharing", {"checkpoint_every": 2})],
)
def test_an_interrupted_fit_with_accumulation_resumes_at_its_minibatch(tmp_path, mode, options) -> None:
    """6 minibatches per worker and epoch, k=2: a cut inside an epoch records the minibatches done (steps x k), so
    the resumed fit trains exactly the ones left and ends where an uninterrupted fit ends."""
    data = onehot_rule_data(192, seed=3)

    def wrapper(net: Network, **extra) -> ParallelWrapper:
        return ParallelWrapper(
            net,
            num_workers=2,
            training_mode=mode,
            accumulate_steps=2,
            progress=False,
            runner=InProcessRunner(timeout_s=60),
            **{**options, **extra},
        )

    reference = _interrupting()
    plain = {k: v for k, v in options.items() if k != "checkpoint_every"}
    ParallelWrapper(
        reference,
        num_workers=2,
        training_mode=mode,
        accumulate_steps=2,
        progress=False,
        runner=InProcessRunner(timeout_s=60),
        **plain,
    ).fit(data, epochs=3, batch_size=16)
    with pytest.raises(WorkerError, match="worker stopped after 16 minibatches"):
        wrapper(_interrupting(after=16), checkpoint_directory=str(tmp_path)).fit(
            data, epochs=3, batch_size=16, run_id="r1"
        )
    cut = newest_checkpoint(str(tmp_path), "r1")
    done = store.read_rank_file(cut.path, 0)[1]["done"]
    assert cut.manifest["fit_epoch"] == 2 and done == 4  # a cut after the second group of epoch 2
    resumed = _interrupting(after=6 - done)
    wrapper(resumed, checkpoint_directory=str(tmp_path)).fit(data, epochs=3, batch_size=16, run_id="r1")
    torch.testing.assert_close(resumed.params(), reference.params(), rtol=0, atol=1e-6)
    assert resumed.iteration == reference.iteration == 3 * 3
