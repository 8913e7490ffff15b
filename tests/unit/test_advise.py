"""`torchspark advise`: the cost model, DL4J's guidance as a decision, the measurement and the command."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

from helpers import mlp_net, uniform_data
from torchspark import Network, models, optim
from torchspark.advise import (
    Link,
    Verdict,
    Workload,
    advise,
    allgather_seconds,
    allreduce_seconds,
    estimate,
    measure,
    parse_link,
)
from torchspark.advise.cost_model import AVERAGING_FREQUENCIES, TARGET_EFFICIENCY
from torchspark.cli import main
from torchspark.errors import ConfigError

GBIT = Link(1e9, 1e-4)


def test_exchange_formulas() -> None:
    # ring all-reduce: 2 (N-1)/N of the bytes each way at 125 MB/s, 2 (N-1) latencies
    assert allreduce_seconds(1e6, 4, GBIT) == pytest.approx(1.5 * 1e6 / 125e6 + 6e-4)
    # all-gather: the other N-1 messages, N-1 latencies
    assert allgather_seconds(1000, 4, GBIT) == pytest.approx(3 * 1000 / 125e6 + 3e-4)
    assert allreduce_seconds(1e6, 1, GBIT) == allgather_seconds(1e6, 1, GBIT) == 0.0


def test_estimates_follow_the_model() -> None:
    w = Workload(
        0.02, param_bytes=400_000, updater_state_bytes=800_000, shared_bytes_per_step=500, encode_seconds=0.001
    )
    by_name = {(e.name, e.averaging_frequency): e for e in estimate(w, 4, GBIT)}
    shared = by_name[("shared", None)]
    assert shared.exchange_seconds_per_iteration == pytest.approx(allgather_seconds(500, 4, GBIT) + 0.001)
    assert shared.speedup == pytest.approx(4 * 0.02 / (0.02 + shared.exchange_seconds_per_iteration))
    for f in AVERAGING_FREQUENCIES:
        assert by_name[("averaging", f)].exchange_seconds_per_iteration == pytest.approx(
            allreduce_seconds(1_200_000, 4, GBIT) / f
        )
    # save_updater=False: only the parameters are averaged
    no_updater = {(e.name, e.averaging_frequency): e for e in estimate(w, 4, GBIT, save_updater=False)}
    assert no_updater[("averaging", 5)].exchange_seconds_per_iteration == pytest.approx(
        allreduce_seconds(400_000, 4, GBIT) / 5
    )
    assert by_name[("dense_every_step", None)].exchange_seconds_per_iteration == pytest.approx(
        allreduce_seconds(400_000, 4, GBIT)
    )


@pytest.mark.parametrize(
    "workload, num_workers, link, verdict, frequency",
    [
        # 200 ms per iteration, small messages, fast links: DL4J's default, gradient sharing
        (Workload(0.2, 1_000_000, 2_000_000, 2_000, 0.001), 8, Link(1e10), Verdict.GRADIENT_SHARING, None),
        # 0.5 ms per iteration, 40 MB of parameters on 100 Mbit/s: nothing pays
        (Workload(0.0005, 40_000_000, 80_000_000, 40_000, 0.02), 4, Link(1e8), Verdict.STAY_ON_ONE_MACHINE, None),
        # one worker: nothing to distribute
        (Workload(0.5, 1000), 1, GBIT, Verdict.STAY_ON_ONE_MACHINE, None),
        # slow encoding relative to a cheap averaging: averaging at DL4J's default frequency
        (Workload(0.05, 400_000, 800_000, 450, 0.06), 4, GBIT, Verdict.PARAMETER_AVERAGING, 5),
        # f=5 misses the 80% efficiency, f=10 reaches it
        (Workload(0.01, 540_000, 1_080_000, 2_000, 0.02), 4, GBIT, Verdict.PARAMETER_AVERAGING, 10),
    ],
)
def test_advice_decisions(workload, num_workers, link, verdict, frequency) -> None:
    advice = advise(workload, num_workers, link)
    assert advice.verdict is verdict
    assert advice.averaging_frequency == frequency
    if frequency is not None:
        estimates = {e.averaging_frequency: e for e in estimate(workload, num_workers, link) if e.name == "averaging"}
        assert estimates[frequency].speedup / num_workers >= TARGET_EFFICIENCY
        smaller = [f for f in AVERAGING_FREQUENCIES if f < frequency]
        assert all(estimates[f].speedup / num_workers < TARGET_EFFICIENCY for f in smaller)
    assert advice.reasons and advice.dl4j_guidance


@pytest.mark.parametrize(
    "ms, band", [(200, ">= 150 ms"), (120, "100-150 ms"), (20, "10-100 ms"), (5, "1-10 ms"), (0.5, "<= 1 ms")]
)
def test_dl4j_guidance_for_the_measured_iteration_time(ms, band) -> None:
    assert advise(Workload(ms / 1e3, 1000), 2, GBIT).dl4j_guidance.startswith(band)


@pytest.mark.parametrize(
    "text, bits",
    [("100mbit", 1e8), ("1gbit", 1e9), ("10Gbit/s", 1e10), ("2.5gbps", 2.5e9), ("1e9", 1e9), ("512kbit", 512e3)],
)
def test_parse_link(text, bits) -> None:
    assert parse_link(text) == pytest.approx(bits)


@pytest.mark.parametrize("text", ["fast", "0gbit", "-1mbit", "gbit"])
def test_parse_link_refuses_nonsense(text) -> None:
    with pytest.raises(ConfigError, match="link speed"):
        parse_link(text)


_net = partial(mlp_net, 16, 32, 3, updater=optim.Adam(lr=1e-3))
_batch = partial(uniform_data, 8, seed=0, shape=(16,), classes=3)


def test_measure_counts_bytes_and_leaves_the_network_alone() -> None:
    net = _net()
    before = net.params().clone()
    m = measure(net, _batch(), iterations=3, warmup=1)
    assert torch.equal(net.params(), before) and net.iteration == 0
    n = net.num_params()
    assert (m.num_params, m.param_bytes, m.updater_state_bytes) == (n, 4 * n, 4 * net.updater_state_size())
    assert m.updater_state_bytes >= 8 * n  # Adam: two moments per parameter (and its step counters)
    assert (m.iterations, m.batch_size) == (3, 8)
    assert m.ms_per_iteration > 0 and m.encode_ms > 0
    assert 1 < m.shared_bytes_per_step < m.param_bytes / 20
    denser = measure(net, _batch(), iterations=3, warmup=0, sparsity=0.2)
    assert denser.shared_bytes_per_step > 3 * m.shared_bytes_per_step  # the sparsity option is used (bitmap cap)
    for kwargs in ({"iterations": 0}, {"warmup": -1}, {"sparsity": 0}, {"sparsity": 2}):
        with pytest.raises(ConfigError, match=next(iter(kwargs))):
            measure(net, _batch(), **kwargs)


def _advise_json(argv: list[str], capsys) -> dict:
    assert main(["advise", "--iterations", "2", "--warmup", "0", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_command_prints_the_models_numbers(capsys) -> None:
    out = _advise_json(
        [
            "--model",
            "mlp",
            "--input-shape",
            "16",
            "--classes",
            "3",
            "--batch-size",
            "8",
            "--num-workers",
            "3",
            "--link",
            "100mbit",
            "--latency-ms",
            "0.5",
            "--threads",
            "1",
            "--iterations",
            "3",
            "--warmup",
            "1",
        ],
        capsys,
    )
    m = out["measurement"]
    assert (m["threads"], m["iterations"], m["warmup"]) == (1, 3, 1)
    assert m["batch_size"] == 8 and m["num_params"] == Network(models.mlp(16, 128, 3)).num_params()  # the CLI's mlp
    assert out["num_workers"] == 3 and out["link"] == {"bits_per_second": 1e8, "latency_s": 0.0005}
    workload = Workload(
        m["ms_per_iteration"] / 1e3,
        m["param_bytes"],
        m["updater_state_bytes"],
        m["shared_bytes_per_step"],
        m["encode_ms"] / 1e3,
    )
    expected = advise(workload, 3, Link(1e8, 5e-4))
    assert out["advice"]["verdict"] == expected.verdict.name
    assert out["advice"]["averaging_frequency"] == expected.averaging_frequency
    averaging5 = next(e for e in out["estimates"] if e["averaging_frequency"] == 5)
    assert averaging5["exchange_seconds_per_iteration"] == pytest.approx(
        allreduce_seconds(m["param_bytes"] + m["updater_state_bytes"], 3, Link(1e8, 5e-4)) / 5
    )
    no_updater = _advise_json(["--model", "mlp", "--input-shape", "16", "--classes", "3", "--no-save-updater"], capsys)
    averaging5 = next(e for e in no_updater["estimates"] if e["averaging_frequency"] == 5)
    assert averaging5["exchange_seconds_per_iteration"] == pytest.approx(
        allreduce_seconds(no_updater["measurement"]["param_bytes"], 4, GBIT) / 5
    )


def test_the_command_text_and_a_saved_model(tmp_path, capsys) -> None:
    path = str(tmp_path / "net")
    _net().save(path)
    assert (
        main(
            [
                "advise",
                "--model-path",
                path,
                "--input-shape",
                "16",
                "--iterations",
                "2",
                "--warmup",
                "0",
                "--num-workers",
                "2",
                "--sparsity",
                "0.01",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert f"{_net().num_params():,} parameters" in text and "ms per iteration" in text
    assert "at sparsity 0.01" in text and "2 workers" in text
    assert "advice: " in text and "DL4J's guidance: " in text and "seeds" not in text
    assert main(["advise", "--model-path", path, "--input-shape", "1,28,28", "--iterations", "1"]) == 2
    assert "--input-shape" in capsys.readouterr().err
    assert main(["advise", "--link", "fast"]) == 2
    assert "link speed 'fast'" in capsys.readouterr().err
