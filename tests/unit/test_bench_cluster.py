"""The pure parts of benchmarks/bench_cluster.py: data, wire-byte accounting, the crossover estimate, arguments."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

import bench_cluster as B  # noqa: E402


def test_mnist_like_is_deterministic_784_features_in_unit_range() -> None:
    a, b = B.mnist_like("train", 64, seed=3), B.mnist_like("train", 64, seed=3)
    assert a.features.shape == (64, 784) and a.features.dtype == torch.float32
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    assert float(a.features.min()) >= 0.0 and float(a.features.max()) <= 1.0
    assert not torch.equal(a.features, B.mnist_like("train", 64, seed=4).features)
    test = B.mnist_like("test", None, seed=1)
    assert len(test) == 360 and sorted(set(test.labels.tolist())) == list(range(10))


def _sampler(samples: list[tuple[float, dict[str, int]]]) -> B.LinkSampler:
    sampler = B.LinkSampler(["h1", "h2"], "br")
    sampler.samples = samples
    return sampler


def test_wire_bytes_count_every_packet_once_at_its_sender() -> None:
    zero = {"hosts_sent": 0, "root_sent": 0, "root_received": 0}
    sampler = _sampler(
        [
            (0.0, zero),
            (1.0, {"hosts_sent": 100, "root_sent": 30, "root_received": 20}),
            (2.0, {"hosts_sent": 500, "root_sent": 40, "root_received": 60}),
        ]
    )
    # hosts sent 100 (20 of them to the driver), the driver/master sent 30
    assert sampler.between(0.0, 1.0) == {"wire": 130, "between_workers": 80}
    assert sampler.between(0.5, 2.0) == {"wire": 410, "between_workers": 360}  # from the first sample at >= 0.5
    assert sampler.between(0.0, 99.0) == {"wire": 540, "between_workers": 440}  # past the end: the last sample


@pytest.mark.parametrize(
    "sharing,ddp,expect",
    [
        # T = c + w/bw: sharing (c=50 s, w=1 Gbit), DDP (c=20 s, w=100 Gbit) cross at (100-1)/(50-20) = 3.3 Gbit/s
        (((1e9, 51.0), (1e8, 60.0)), ((1e9, 120.0), (1e8, 1020.0)), "3.3 Gbit/s"),
        (((1e9, 10.0), (1e8, 11.0)), ((1e9, 120.0), (1e8, 1020.0)), "ahead at every bandwidth"),
    ],
)
def test_crossover_from_two_links(sharing, ddp, expect: str) -> None:
    results = {"1gbit": {}, "100mbit": {}}
    for method, points in (("sharing", sharing), ("ddp", ddp)):
        for link, (_, t) in zip(("1gbit", "100mbit"), points):
            results[link][method] = {"reached": True, "time_to_target_s": t}
    assert expect in B.crossover(results)


def test_crossover_needs_both_methods_on_both_links() -> None:
    assert "not estimated" in B.crossover({"1gbit": {"sharing": {"reached": True, "time_to_target_s": 5.0}}})


def test_arguments_quick_defaults_and_unknown_names() -> None:
    args = B.parse_args(["--quick"])
    assert args.links == "100mbit" and args.budget_s == 120.0 and args.target == 0.7
    full = B.parse_args([])
    assert full.links == "1gbit,100mbit" and full.methods == "sharing,avg5,avg1,ddp" and full.target == 0.9
    assert B.hard_limit_s(full) > 2 * full.budget_s
    with pytest.raises(SystemExit):
        B.parse_args(["--methods", "sharing,horovod"])
