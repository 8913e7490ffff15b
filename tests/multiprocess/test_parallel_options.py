"""ParallelWrapper's options do what they say, with 2 worker processes: live score reports, save_updater and
worker_prefetch_num_batches."""

from __future__ import annotations

import logging
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from _gated import GatedLinear

from helpers import mlp_net
from reference_loops import averaging_reference
from torchspark import Network, datasets, optim
from torchspark.parallel import LocalProcessRunner, ParallelWrapper
from torchspark.training.assignment import split_examples
from torchspark.training.hooks import ScoreReport

BATCH = 8
WORKERS = 2


_mlp = partial(mlp_net, 12, 16, 3, updater=optim.SGD(lr=0.1))


def _reports(caplog: pytest.LogCaptureFixture) -> list[ScoreReport]:
    return [
        r.score_report for r in caplog.records if r.name == "torchspark.parallel.wrapper" and hasattr(r, "score_report")
    ]


def _worker_scores(wrapper: ParallelWrapper) -> list[np.ndarray]:
    """Each worker's per-minibatch losses in training order, from the training stats (recorded independently)."""
    table = wrapper.training_stats.scores()
    out = []
    for rank in range(WORKERS):
        mine = table.worker == table.worker_names.index(f"worker-{rank}")
        out.append(table.score[mine][np.argsort(table.iteration[mine], kind="stable")])
    return out


# ------------------------------------------------------------------ report_score_after_averaging
def test_the_averaged_score_is_logged_after_every_averaging_round(caplog) -> None:
    caplog.set_level(logging.INFO, logger="torchspark.parallel.wrapper")
    data = datasets.synthetic_classification(60, 12, 3, seed=4)
    sizes = [[len(b) for b in share] for share in split_examples([data], BATCH, WORKERS, None)]
    assert sizes == [[8, 8, 8, 6], [2, 8, 8, 8, 4]]  # 30 examples each: rounds of 2 weigh 16:10, 14:16, 0:4
    wrapper = ParallelWrapper(
        _mlp(),
        num_workers=WORKERS,
        averaging_frequency=2,
        report_score_after_averaging=True,
        collect_training_stats=True,
        progress=False,
    )
    wrapper.fit(data, epochs=2, batch_size=BATCH)

    reports = _reports(caplog)
    assert [(r.epoch, r.round) for r in reports] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert [r.examples for r in reports] == [26, 30, 4, 26, 30, 4]
    assert all(math.isfinite(r.score) for r in reports)
    # each round: sum over workers of (its last loss in the round * its examples in the round) / all examples
    losses = _worker_scores(wrapper)
    expected = []
    for epoch in range(2):
        for first in (0, 2, 4):
            total = weight = 0.0
            for w in range(WORKERS):
                mine = sizes[w][first : first + 2]
                if mine:  # a worker whose data ran out joins the round with weight 0
                    last = losses[w][epoch * len(sizes[w]) + first + len(mine) - 1]
                    total += float(last) * sum(mine)
                    weight += sum(mine)
            expected.append(total / weight)
    assert [r.score for r in reports] == pytest.approx(expected, rel=1e-5)  # the all-reduce sums in float32


def test_sharing_log_each_epochs_mean_score_and_nothing_unless_asked(caplog) -> None:
    caplog.set_level(logging.INFO, logger="torchspark.parallel.wrapper")
    data = datasets.synthetic_classification(60, 12, 3, seed=4)
    sizes = [[len(b) for b in share] for share in split_examples([data], BATCH, WORKERS, None)]
    wrapper = ParallelWrapper(
        _mlp(),
        num_workers=WORKERS,
        training_mode="sharing",
        report_score_after_averaging=True,
        collect_training_stats=True,
        progress=False,
    )
    wrapper.fit(data, epochs=3, batch_size=BATCH)

    reports = _reports(caplog)
    assert [(r.epoch, r.round, r.examples) for r in reports] == [(e, None, 60) for e in range(3)]
    losses = _worker_scores(wrapper)
    for epoch, report in enumerate(reports):
        total = sum(
            float(losses[w][epoch * len(sizes[w]) + i]) * n for w in range(WORKERS) for i, n in enumerate(sizes[w])
        )
        assert math.isfinite(report.score) and report.score == pytest.approx(total / 60, rel=1e-9)

    caplog.clear()
    ParallelWrapper(_mlp(), num_workers=WORKERS, training_mode="sharing", progress=False).fit(
        data, epochs=1, batch_size=BATCH
    )
    ParallelWrapper(_mlp(), num_workers=WORKERS, averaging_frequency=2, progress=False).fit(data, batch_size=BATCH)
    assert _reports(caplog) == []


# ------------------------------------------------------------------ save_updater
def test_save_updater_false_resets_adam_every_round_as_the_reference_does() -> None:
    data = datasets.synthetic_classification(100, 12, 3, seed=1)  # 50 examples per worker
    shards = split_examples([data], BATCH, WORKERS, None)
    params = {}
    for average in (True, False):
        net = _mlp(updater=optim.Adam(lr=1e-2))
        reference = averaging_reference(net, shards, epochs=2, frequency=3, save_updater=average)
        wrapper = ParallelWrapper(
            net, num_workers=WORKERS, averaging_frequency=3, save_updater=average, threads_per_worker=1, progress=False
        )
        wrapper.fit(data, epochs=2, batch_size=BATCH)
        torch.testing.assert_close(net.params(), reference.params(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(net.updater_state(), reference.updater_state(), atol=1e-6, rtol=1e-5)
        params[average] = net.params()
    assert not net.updater_state().any()  # False: the moments were reset after the last round too
    # restarting Adam's moments (and its bias correction) every round is a different trajectory, not a rounding
    assert (params[True] - params[False]).abs().max() > 1e-2


# ------------------------------------------------------------------ worker_prefetch_num_batches
@pytest.mark.parametrize("prefetch", [1, 4])
def test_worker_prefetch_num_batches_bounds_how_far_a_one_shot_iterable_is_read_ahead(
    tmp_path: Path, prefetch: int
) -> None:
    """Workers wait in their first forward until a gate opens; the parent's feeder keeps reading the iterable and
    dealing minibatches round-robin. The first time it finds a worker's queue full, the test notes how many
    minibatches the iterable has given and opens the gate. Each worker holds one minibatch and its queue
    ``prefetch``, so that count is between ``prefetch * 2 + 1`` and ``(prefetch + 2) * 2`` (disjoint ranges for
    1 and 4: the option must reach the queues). Without a bound the iterable runs away and opens the gate itself."""
    gate = tmp_path / "gate"
    drawn: list[int] = []
    at_first_full: list[int] = []
    runaway = (prefetch + 2) * WORKERS + 4

    class Watched(LocalProcessRunner):
        def _put(self, q, item, stop) -> bool:  # the feeder's put into a worker's queue
            if not gate.exists() and q.full():
                at_first_full.append(len(drawn))
                gate.touch()
            return super()._put(q, item, stop)

    def one_shot():
        for i, batch in enumerate(datasets.synthetic_classification(40 * BATCH, 12, 3, seed=2).split(BATCH)):
            drawn.append(i)
            if len(drawn) > runaway and not gate.exists():
                gate.touch()  # read far past any bound while the workers hold still: fail, do not hang
            yield batch

    net = Network(GatedLinear(12, 3, str(gate)), updater=optim.SGD(lr=0.1), seed=0)
    wrapper = ParallelWrapper(
        net,
        num_workers=WORKERS,
        worker_prefetch_num_batches=prefetch,
        progress=False,
        runner=Watched(["cpu"] * WORKERS),
    )  # the queue bound comes from the wrapper's option
    wrapper.fit(one_shot(), batch_size=BATCH)

    assert at_first_full, f"no worker queue was ever full; the iterable was read {len(drawn)} minibatches ahead"
    # the upper end allows one more: multiprocessing's Queue.full() reads its semaphore, which a worker's get()
    # releases only after the item has left the pipe, so one item can be in flight when the feeder sees "full"
    # (13 for prefetch 4 in 2 of 3 full runs on a loaded machine). The ranges stay disjoint: [3, 7] and [9, 13].
    assert prefetch * WORKERS + 1 <= at_first_full[0] <= (prefetch + 2) * WORKERS + 1
    assert len(drawn) == 40 and sum(r.examples for r in wrapper.last_results) == 40 * BATCH


def test_options_set_after_construction_take_effect_or_are_refused() -> None:
    """``pw.collect_training_stats = True`` after construction (DL4J's setter style) rebuilds the master: the next
    fit records stats (None before); a bad value raises ConfigError and changes nothing; with a master of one's own
    the wrapper refuses instead of silently ignoring the option."""
    from torchspark.errors import ConfigError
    from torchspark.training import ParameterAveragingTrainingMaster

    data = datasets.synthetic_classification(64, 12, 3, seed=0)
    wrapper = ParallelWrapper(_mlp(), num_workers=WORKERS, progress=False, threads_per_worker=1)
    wrapper.fit(data, epochs=1, batch_size=BATCH)
    assert wrapper.training_stats is None
    wrapper.collect_training_stats = True
    assert wrapper.master.collect_training_stats
    wrapper.fit(data, epochs=1, batch_size=BATCH)
    assert wrapper.training_stats is not None and wrapper.training_stats.summary()["examples"] == 64
    with pytest.raises(ConfigError, match="averaging_frequency"):
        wrapper.averaging_frequency = 0
    assert wrapper.averaging_frequency == 5 and wrapper.master.averaging_frequency == 5
    own = ParallelWrapper(
        _mlp(), num_workers=WORKERS, progress=False, master=ParameterAveragingTrainingMaster(num_workers=WORKERS)
    )
    with pytest.raises(ConfigError, match="master of your own"):
        own.collect_training_stats = True
    own.progress = True  # not a master option: set as before
