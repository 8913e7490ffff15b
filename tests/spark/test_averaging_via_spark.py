"""``averaging_via="spark"``: one Spark job and ``treeAggregate`` per averaging round, on a real local[2] session.

The trusted reference is the default route (the same algorithm as all-reduces inside one barrier stage): the same
data, seed and settings must give the same parameters, updater state and counters. Every round is a Spark job, so
each fit here runs at most a dozen rounds.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch.testing import assert_close

from helpers import mlp_net
from torchspark import DataSet, Network, datasets, optim
from torchspark.errors import WorkerError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, master_from_json
from torchspark.spark.jobs import run_job
from torchspark.spark.rounds import RoundRecord, WorkerRound, merge_records


def _data(n: int, seed: int) -> DataSet:
    return datasets.synthetic_classification(n, 8, 3, seed=seed)


_net = partial(mlp_net, 8, 16, 3, updater=optim.Adam(lr=1e-2))


def _fit(
    spark, sc, parts: list[DataSet], via: str, net: Network | None = None, epochs: int = 2, **options
) -> tuple[Network, SparkNetwork]:
    """Fit on one input partition per worker (``repartition="never"``), so both routes see the same shards."""
    net = net if net is not None else _net()
    settings = {
        "batch_size_per_worker": 16,
        "averaging_frequency": 3,
        "num_workers": len(parts),
        "repartition": "never",
        "averaging_via": via,
        **options,
    }
    spark_net = SparkNetwork(spark, net, ParameterAveragingTrainingMaster(**settings), progress=False)
    spark_net.fit(sc.parallelize(parts, len(parts)), epochs=epochs)
    spark_net.delete_temp_files()
    return net, spark_net


def _assert_same_training(spark_route: tuple[Network, SparkNetwork], torch_route: tuple[Network, SparkNetwork]):
    (net, spark_net), (ref, ref_net) = spark_route, torch_route
    assert_close(net.params(), ref.params(), atol=1e-5, rtol=0)
    assert_close(net.updater_state(), ref.updater_state(), atol=1e-5, rtol=0)
    assert (net.iteration, net.epoch) == (ref.iteration, ref.epoch)
    assert spark_net.score == pytest.approx(ref_net.score, abs=1e-5)
    assert [(r.rank, r.examples, r.iterations) for r in spark_net.last_results] == [
        (r.rank, r.examples, r.iterations) for r in ref_net.last_results
    ]


# ------------------------------------------------------------------ equivalence with the all-reduce route
@pytest.mark.parametrize("approach", ["export", "direct"])
def test_adam_with_saved_updater_matches_the_torch_route(spark, sc, approach: str) -> None:
    # 96 and 88 examples: the second worker's last minibatch holds 8, so the averages must weight by examples
    # (Adam's step counters included); averaging_frequency=4 leaves a partial second round; 2 epochs = 4 rounds
    parts = [_data(96, 0), _data(88, 1)]
    spark_route = _fit(spark, sc, parts, "spark", averaging_frequency=4, rdd_training_approach=approach)
    torch_route = _fit(spark, sc, parts, "torch", averaging_frequency=4, rdd_training_approach=approach)
    _assert_same_training(spark_route, torch_route)
    net = spark_route[0]
    assert torch.count_nonzero(net.updater_state()) > 0  # the averaged Adam state was kept
    assert (net.iteration, net.epoch) == (12, 2)
    assert not torch.equal(net.params(), _net().params())


def test_skewed_partitions_match_the_torch_route_and_finish(spark, sc) -> None:
    # one worker holds 4x the data: it trains alone (the other joins with n=0) for the last rounds
    parts = [_data(160, 2), _data(40, 3)]
    spark_route = _fit(spark, sc, parts, "spark", epochs=1, batch_size_per_worker=10)
    torch_route = _fit(spark, sc, parts, "torch", epochs=1, batch_size_per_worker=10)
    _assert_same_training(spark_route, torch_route)
    net, spark_net = spark_route
    assert [(r.examples, r.iterations) for r in spark_net.last_results] == [(160, 16), (40, 4)]
    assert net.iteration == 16  # 6 rounds of up to 3 minibatches on the busiest worker


def test_accumulation_counts_rounds_in_optimizer_steps_on_both_routes(spark, sc) -> None:
    # 96 and 72 examples in minibatches of 8: 12 and 9 minibatches, k=2 -> 6 and 5 optimizer steps (the second
    # worker's last group is one minibatch); averaging_frequency=2 -> 3 rounds of 4 minibatches each
    parts = [_data(96, 6), _data(72, 7)]
    options = dict(epochs=1, batch_size_per_worker=8, averaging_frequency=2, accumulate_steps=2)
    spark_route = _fit(spark, sc, parts, "spark", **options)
    torch_route = _fit(spark, sc, parts, "torch", **options)
    _assert_same_training(spark_route, torch_route)
    net, spark_net = spark_route
    assert [(r.examples, r.iterations) for r in spark_net.last_results] == [(96, 6), (72, 5)]
    assert net.iteration == 6
    ignored = _fit(spark, sc, parts, "spark", **{**options, "accumulate_steps": 1})[0]
    assert ignored.iteration == 12 and not torch.allclose(ignored.params(), net.params(), atol=1e-4)


def test_save_updater_false_matches_the_torch_route(spark, sc) -> None:
    # a driver network with a non-zero updater state: both routes start the fit's first round from it, then reset
    start = _net()
    start.train_step(_data(16, 9), validate=True)
    assert torch.count_nonzero(start.updater_state()) > 0
    parts = [_data(64, 4), _data(64, 5)]
    spark_route = _fit(spark, sc, parts, "spark", net=start.copy(), averaging_frequency=2, save_updater=False)
    torch_route = _fit(spark, sc, parts, "torch", net=start.copy(), averaging_frequency=2, save_updater=False)
    _assert_same_training(spark_route, torch_route)
    assert torch.count_nonzero(spark_route[0].updater_state()) == 0


# ------------------------------------------------------------------ configuration
def test_master_json_round_trip() -> None:
    master = ParameterAveragingTrainingMaster(
        averaging_via="spark",
        aggregation_depth=3,
        averaging_frequency=7,
        save_updater=False,
        rdd_training_approach="direct",
    )
    text = master.to_json()
    assert '"averaging_via": "spark"' in text
    assert ParameterAveragingTrainingMaster.from_json(text) == master
    assert master_from_json(text) == master


# ------------------------------------------------------------------ failures
def test_worker_error_fails_the_fit_with_the_workers_message(spark, sc) -> None:
    # the second worker's fifth minibatch has labels out of range: rounds 1-2 complete, round 3 fails on a worker
    good = _data(64, 6)
    second = _data(96, 7)
    labels = second.labels.clone()
    labels[64:80] = 12
    poisoned = DataSet(second.features, labels)
    net = _net()
    with pytest.raises(WorkerError, match="label index 12 is out of range") as info:
        _fit(spark, sc, [good, poisoned], "spark", net=net, averaging_frequency=2, rdd_training_approach="direct")
    message = str(info.value)
    assert "round 3/3" in message and "Traceback" in message
    assert net.iteration == 4  # the driver's network holds the last completed round (2 rounds of 2 minibatches)
    assert not sc.statusTracker().getActiveJobsIds()
    assert sc.parallelize(range(4), 2).sum() == 6  # the session still works


def test_ctrl_c_cancels_the_round_job(spark, sc) -> None:
    from ctrl_c import assert_ctrl_c_cancels, never_ending_job

    job = never_ending_job(sc)  # stands in for a long round; the test cancels it long before
    assert_ctrl_c_cancels(sc, lambda: run_job(sc, "test: a round that only ends when cancelled", job), "round")


# ------------------------------------------------------------------ aggregation
def test_tree_aggregate_of_records_sums_every_partition(sc) -> None:
    def record(i: int) -> RoundRecord:  # local, so Spark pickles it by value (tests are not importable)
        return RoundRecord(
            weighted=torch.full((3,), float(i)),
            examples=i,
            score_sum=0.5 * i,
            workers={i: WorkerRound(examples=i, iterations=1)},
        )

    # 9 partitions with depth 3 sum through executor-side levels before the driver's final merge
    total = sc.parallelize(range(9), 9).map(record).treeAggregate(RoundRecord(), merge_records, merge_records, 3)
    assert_close(total.weighted, torch.full((3,), 36.0))
    assert (total.examples, total.score_sum, sorted(total.workers)) == (36, 18.0, list(range(9)))
    empty = sc.parallelize([RoundRecord(), record(2)], 2).treeAggregate(RoundRecord(), merge_records, merge_records, 2)
    assert_close(empty.weighted, torch.full((3,), 2.0))  # a worker without data (n=0) adds nothing


# ------------------------------------------------------------------ it trains, reports and times
def test_learns_reports_progress_per_round_and_times_the_driver_phases(spark, sc) -> None:
    data = _data(320, 8)
    net = _net()
    loss_before = net.score(data)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=5,
        num_workers=2,
        repartition="never",
        averaging_via="spark",
        collect_training_stats=True,
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    updates = []
    spark_net.add_progress_listener(updates.append)
    spark_net.fit(sc.parallelize([data.slice(0, 160), data.slice(160, 320)], 2), epochs=5)
    spark_net.delete_temp_files()

    assert net.score(data) < 0.5 * loss_before
    assert net.evaluate(data).accuracy() > 0.9
    assert (net.iteration, net.epoch) == (50, 5)  # 10 minibatches per worker and epoch
    assert 0 < spark_net.score < loss_before
    # one update per worker and round (2 rounds per epoch), counting examples within the epoch
    assert len(updates) == 2 * 2 * 5
    assert {u.rank for u in updates} == {0, 1}
    assert [u.examples for u in updates if u.rank == 0 and u.epoch == 4] == [80, 160]
    summary = spark_net.training_stats.summary()
    assert summary["examples"] == 5 * 320 and summary["epochs"] == 5 and summary["workers"] == 2
    assert summary["driver_counts"]["aggregation"] == 10 + 1  # every round's average, then the driver's merge
    assert summary["driver_counts"]["broadcast"] == 11  # the blueprint once, then the parameters every round
    assert summary["driver_counts"]["fit"] == 10  # the driver's span of each round's job
    assert summary["counts"]["fit"] == summary["minibatches"] == 2 * 50  # one per minibatch trained, not 60
    for phase in ("count", "broadcast", "fit", "aggregation"):
        assert summary["driver_seconds"].get(phase, 0) > 0, phase
    for phase in ("fit", "data_wait"):
        assert summary["seconds"].get(phase, 0) > 0, phase
    # reused Python workers keep the network built for this fit instead of rebuilding it every round
    assert 1 <= summary["counts"]["network_init"] <= 4
