"""benchmarks/bench_scaling.py on a 2-host namespace cluster: the worker path runs over real gloo between
namespaces, both topologies give the same summed update bit for bit (and the sum a single process computes from the
same messages), and the results JSON holds what the report and docs/scaling.md read. Plus its argument checks."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))

import _scaling_worker as W  # noqa: E402
import bench_scaling as B  # noqa: E402
from cluster_harness import unavailable_reason  # noqa: E402

PARAMS = 40_000
DENSITIES = (0.001, 0.1)  # a sparse and a bitmap message


def _reference_sum(world: int, density_index: int, density: float, seed: int) -> str:
    """The summed update of the ranks' messages, decoded in rank order in this process (no exchange)."""
    from torchspark.encoding import decode, from_bytes

    total = torch.zeros(PARAMS)
    for rank in range(world):
        payload, _ = W._message(PARAMS, density, 1000 * density_index + rank + seed)
        decode(from_bytes(payload[1:]), total)
    return hashlib.sha256(total.numpy().tobytes()).hexdigest()


@pytest.mark.multihost
def test_two_hosts_same_sum_both_topologies_and_the_json_fields(tmp_path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"multi-host namespace cluster unavailable: {reason}")
    out = tmp_path / "scaling.json"
    args = B.parse_args(
        [
            "--num-workers",
            "2",
            "--links",
            "100mbit",
            "--params",
            str(PARAMS),
            "--densities",
            ",".join(map(str, DENSITIES)),
            "--reps",
            "3",
            "--dense-reps",
            "2",
            "--warmup",
            "1",
            "--probe-reps",
            "2",
            "--seed",
            "5",
            "--burst-ms",
            "4",
            "--slow-start-after-idle",
            "0",
            "--timeout",
            "120",
            "--out",
            str(out),
        ]
    )
    returned = B.run(args)
    with open(out) as f:
        data = json.load(f)
    assert data == json.loads(json.dumps(returned))  # what run() returns is what it wrote
    assert data["conditions"]["params"] == PARAMS and data["conditions"]["bursts"] == {"100mbit": "50000b"}
    assert data["conditions"]["tcp_slow_start_after_idle"] == "0"  # set in every host namespace and read back
    assert data["conditions"]["load_at_start"] and data["conditions"]["load_at_end"] and data["machine"]["date"]
    (setting,) = data["settings"]
    assert setting["workers"] == 2 and setting["rate"] == "100mbit" and setting["link_bandwidth_Bps"] == 12.5e6
    assert setting["hop_latency_s"] > 0 and setting["probe"]["tiny_all_gather_s"] > 0
    # separate hosts: gloo over the bridge interface torchspark chose, no shared-memory shortcut
    assert setting["uses_shared_memory"] is False
    addresses = [e[0] for e in setting["endpoints"]]
    assert len(set(addresses)) == 2 and all(a.startswith("198.18.") for a in addresses)
    assert all(e[1] == "route_to_driver" for e in setting["endpoints"])
    assert all(e[2] == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1"} for e in setting["endpoints"])
    # the two topologies: one summed update, bit for bit, equal to the single-process sum of the same messages
    assert setting["same_sum_bit_for_bit"] is True
    for i, density in enumerate(DENSITIES):
        sums = setting["sum_sha256"][str(density)]
        assert sums["all_gather"] == sums["sharded"] == _reference_sum(2, i, density, seed=5)
    rows = {(r["op"], r["density_set"]): r for r in setting["rows"]}
    assert set(rows) == {("dense ring", None)} | {(t, d) for t in ("all_gather", "sharded") for d in DENSITIES}
    assert rows[("dense ring", None)]["calls"] == 2
    assert rows[("all_gather", 0.1)]["format"] == "bitmap" and rows[("sharded", 0.001)]["format"] == "sparse"
    for r in setting["rows"]:
        for key in ("wall_s", "thread_cpu_s", "process_cpu_s", "model_s", "model_cpu_s", "model_net_s", "ratio"):
            assert r[key] == r[key] and r[key] >= 0, (r["op"], key, r[key])  # present, not NaN
        if r["op"] != "dense ring":
            assert r["calls"] == 3 and len(r["wall_per_call_s"]) == 3
            assert abs(r["density"] - r["density_set"]) <= 0.1 * r["density_set"]
            assert r["ratio"] == pytest.approx(r["wall_s"] / r["model_s"])
    assert data["fits"]["dense_effective_bandwidth"][0]["rate"] == "100mbit"
    printed = B.table_rows(data["settings"])
    assert len(printed) == len(setting["rows"])


def test_link_rates_and_buckets() -> None:
    assert B.rate_bytes_per_s("100mbit") == 12.5e6 and B.rate_bytes_per_s("1gbit") == 125e6
    assert B.parse_links("1gbit:0.1ms,100mbit") == [("1gbit", "0.1ms"), ("100mbit", None)]
    assert B.burst_for("1gbit", 2.0) == "250000b" and B.burst_for("100mbit", 2.0) == "25000b"
    assert B.burst_for("10mbit", 2.0) == "16384b"  # never below 16 kB (several full-size frames)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-workers", "1,2"], "--num-workers needs counts >= 2"),
        (["--links", "fast"], "link rate must look like"),
        (["--densities", "0,0.01"], "--densities must lie in"),
        (["--reps", "0"], "must be >= 1"),
        (["--burst-ms", "0"], "--burst-ms must be > 0"),
        (["--params", "3"], "--params must be >= 16"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(argv: list[str], message: str, capsys) -> None:
    with pytest.raises((SystemExit, ValueError)) as info:
        B.parse_args(argv)
    text = str(info.value) + capsys.readouterr().err
    assert message in text


def test_without_namespaces_it_says_why_and_exits_0(monkeypatch, capsys, tmp_path) -> None:
    import cluster_harness

    monkeypatch.setattr(cluster_harness, "unavailable_reason", lambda: "building network namespaces needs root")
    assert B.main(["--num-workers", "2", "--out", str(tmp_path / "s.json")]) == 0
    assert "unavailable here: building network namespaces needs root" in capsys.readouterr().out
    assert not (tmp_path / "s.json").exists()
