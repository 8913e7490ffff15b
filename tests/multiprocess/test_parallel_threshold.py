"""The calibrated start threshold on a real gradient-sharing fit (ParallelWrapper, 2 worker processes over gloo),
against DL4J's fixed 1e-4 start, which stays one option away."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from helpers import assert_replicas_identical, lenet_net
from torchspark import Network, datasets, optim
from torchspark.encoding import AdaptiveThreshold
from torchspark.parallel import ParallelWrapper

DECAY = 0.5 ** (1 / 20)
EPOCHS = 2


def _fit(threshold_algorithm: Any) -> tuple[Network, Any]:
    net = lenet_net(updater=optim.Adam(lr=1e-3))
    kwargs = {} if threshold_algorithm is None else {"threshold_algorithm": threshold_algorithm}
    wrapper = ParallelWrapper(
        net, num_workers=2, training_mode="sharing", rng_seed=0, progress=False, collect_training_stats=True, **kwargs
    )
    wrapper.fit(datasets.digits("train"), epochs=EPOCHS, batch_size=16)
    return net, wrapper.training_stats


@pytest.fixture(scope="module")
def fits() -> dict[str, tuple[Network, Any]]:
    return {"default": _fit(None), "dl4j": _fit(AdaptiveThreshold(initial=1e-4))}


def _thresholds(stats: Any, worker: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``worker``'s (threshold, sparsity) per encoded step, in step order."""
    enc = stats.encoding()
    rows = enc.worker == enc.worker_names.index(f"worker-{worker}")
    order = np.argsort(enc.step[rows], kind="stable")
    return enc.threshold[rows][order], enc.sparsity[rows][order]


def _compression(net: Network) -> float:
    return net.extra_config["sharing.dense_bytes"] / net.extra_config["sharing.bytes_sent"]


def test_the_default_start_compresses_far_more_than_dl4j_start(fits: dict[str, tuple[Network, Any]]) -> None:
    default, dl4j = fits["default"][0], fits["dl4j"][0]
    # DL4J's 1e-4 is ~10x below Adam's 1e-3 steps: most of a 2-epoch fit goes out as dense bitmaps (~16x)
    assert _compression(default) > 10 * _compression(dl4j), (_compression(default), _compression(dl4j))
    assert _compression(default) > 100
    assert default.extra_config["sharing.start_threshold"] > 1e-3  # calibrated above Adam's step size
    assert dl4j.extra_config["sharing.start_threshold"] == 1e-4
    test = datasets.digits("test")
    assert default.evaluate(test).accuracy() >= 0.6  # it learns (chance: 0.1; ~98% after 15 epochs, see BENCHMARKS.md)


@pytest.mark.parametrize("name", ["default", "dl4j"])
def test_replicas_stay_bit_identical(fits: dict[str, tuple[Network, Any]], name: str) -> None:
    net, stats = fits[name]
    assert_replicas_identical(stats, 2, net=net)  # every rank measured the checksum of the driver's model
    digest = hashlib.sha256(net.params().numpy().tobytes())
    digest.update(net.buffers().numpy().tobytes())
    assert net.extra_config["sharing.replica_sha256"] == digest.hexdigest()


@pytest.mark.parametrize("worker", [0, 1])
def test_dl4j_start_follows_dl4j_threshold_sequence(fits: dict[str, tuple[Network, Any]], worker: int) -> None:
    """With ``initial=1e-4`` the thresholds are exactly DL4J's AdaptiveThresholdAlgorithm sequence for the
    measured sparsities: start 1e-4, x decay below the [1e-4, 1e-2] band, / decay above it."""
    thresholds, sparsities = _thresholds(fits["dl4j"][1], worker)
    assert len(thresholds) >= EPOCHS * 44  # ~718 examples per worker and epoch, in minibatches of <= 16
    expected, t = [], 1e-4
    for s in sparsities:
        expected.append(t)
        t = t * DECAY if s < 1e-4 else (t / DECAY if s > 1e-2 else t)
    np.testing.assert_array_equal(thresholds, np.asarray(expected, dtype=np.float32).astype(np.float64))
    assert thresholds[-1] > 10 * thresholds[0]  # the sequence really moved (dense warm-up)


@pytest.mark.parametrize("worker", [0, 1])
def test_default_start_is_one_agreed_calibrated_value(fits: dict[str, tuple[Network, Any]], worker: int) -> None:
    net, stats = fits["default"]
    thresholds, _ = _thresholds(stats, worker)
    assert thresholds[0] == np.float32(net.extra_config["sharing.start_threshold"])  # both workers: the same
