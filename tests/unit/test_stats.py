"""torchspark.stats: collector, clock alignment, merging, summary, JSON and the HTML report."""

from __future__ import annotations

import importlib
import json
import math
import time

import numpy as np
import pytest

from torchspark.errors import ConfigError, DataError, SerializationError
from torchspark.stats import (
    PAYLOAD_FORMAT,
    STANDARD_PHASES,
    ClockSample,
    Phase,
    StatsCollector,
    TrainingStats,
    best_clock_sample,
    clock_offset,
    clock_sample,
    to_driver_time,
)
from torchspark.stats.aggregate import downsample_series, log_histogram, stacked_fractions, timeline_occupancy
from torchspark.stats.html import render_html
from torchspark.stats.training_stats import DRIVER_ID
from torchspark.training.driver.stats import build_training_stats

# ---- collector --------------------------------------------------------------------------------------------------


def test_phase_context_records_positive_duration_and_attrs() -> None:
    c = StatsCollector("worker-0")
    before = time.time()
    with c.phase("fit", examples=32) as attrs:
        time.sleep(0.005)
        attrs["iteration"] = 7
    with c.phase(Phase.DATA_WAIT):
        pass
    after = time.time()
    p = c.drain()
    assert p["format"] == PAYLOAD_FORMAT and p["worker"] == "worker-0"
    ph = p["phases"]
    assert [ph["names"][k] for k in ph["code"]] == ["fit", "data_wait"]
    assert ph["duration"][0] >= 0.005 and ph["duration"][1] >= 0.0
    assert before - 0.01 <= ph["start"][0] <= after
    assert ph["attrs"]["examples"][0] == 32 and ph["attrs"]["iteration"][0] == 7
    assert math.isnan(ph["attrs"]["examples"][1])
    assert len(c) == 0 and len(c.drain()["phases"]["code"]) == 0  # drained


def test_clock_offset_is_subtracted_from_starts() -> None:
    a, b = StatsCollector("w", clock_offset=0.0), StatsCollector("w", clock_offset=100.0)
    with a.phase("fit"):
        pass
    with b.phase("fit"):
        pass
    b.record_phase("export", 1.0, start=5000.0)
    sa, sb = a.snapshot()["phases"]["start"], b.snapshot()["phases"]["start"]
    assert sa[0] - sb[0] == pytest.approx(100.0, abs=0.05)
    assert sb[1] == 4900.0
    assert b.now() == pytest.approx(time.time() - 100.0, abs=0.05)


def test_failed_phase_is_recorded_and_snapshot_keeps_records() -> None:
    c = StatsCollector("worker-1")
    with pytest.raises(RuntimeError):
        with c.phase("fit"):
            raise RuntimeError("boom")
    assert c.snapshot()["phases"]["attrs"]["failed"][0] == 1
    assert len(c) == 1


def test_disabled_collector_records_nothing() -> None:
    c = StatsCollector("worker-0", enabled=False)
    with c.phase("fit"):
        pass
    c.record_phase("fit", 1.0)
    c.record_score(1, 0.5)
    c.record_encoding(1, 10, 40, 0.1, 1e-3, "sparse")
    p = c.drain()
    assert len(p["phases"]["code"]) == len(p["scores"]["score"]) == len(p["encoding"]["step"]) == 0


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(DataError, match="worker_id"):
        StatsCollector("")
    c = StatsCollector("w")
    with pytest.raises(DataError, match="duration"):
        c.record_phase("fit", -1.0)
    c.record_phase("fit", 1.0, label="x")
    with pytest.raises(DataError, match="label"):
        c.drain()


# ---- clock --------------------------------------------------------------------------------------------------------


def test_clock_offset_formula() -> None:
    assert clock_offset(10.0, 115.0, 12.0) == 104.0
    s = clock_sample(10.0, 115.0, 12.0)
    assert s == ClockSample(offset=104.0, round_trip=2.0) and s.max_error == 1.0
    assert to_driver_time(115.0, s.offset) == 11.0
    with pytest.raises(DataError, match="before send"):
        clock_offset(12.0, 0.0, 10.0)
    with pytest.raises(DataError, match="no samples"):
        best_clock_sample([])


@pytest.mark.parametrize("true_offset", [-3600.0, -0.25, 0.0, 0.037, 42.5])
def test_skewed_clock_recovered_within_half_round_trip(true_offset: float) -> None:
    rng = np.random.default_rng(1)
    pings = []
    for _ in range(6):
        t0 = 1.7e9 + rng.uniform(0, 10)
        out_leg, back_leg = rng.uniform(1e-4, 0.05, 2)  # asymmetric legs
        tw = t0 + out_leg + true_offset  # worker reads its (skewed) clock on arrival
        pings.append((t0, tw, t0 + out_leg + back_leg))
    best = best_clock_sample(pings)
    assert best.round_trip == min(t1 - t0 for t0, _, t1 in pings)
    assert abs(best.offset - true_offset) <= best.max_error + 1e-6
    assert all(abs(clock_sample(*p).offset - true_offset) <= clock_sample(*p).max_error + 1e-6 for p in pings)


# ---- merge, summary, JSON -----------------------------------------------------------------------------------------


def _two_worker_stats() -> tuple[TrainingStats, dict]:
    recorded = {"examples": 0, "fit": 0.0, "data_wait": 0.0, "bytes": 0, "dense": 0}
    payloads = []
    for w in range(2):
        c = StatsCollector(f"worker-{w}")
        for it in range(5 + w):  # worker-1 does one more step
            c.record_phase("data_wait", 0.01 * (it + 1), start=1000.0 + it)
            c.record_phase("fit", 0.1 + 0.01 * w, start=1000.5 + it, examples=16, iteration=it)
            c.record_score(it, 1.0 / (it + 1))
            c.record_encoding(it, 100 + it, 4000, 0.025, 1e-3 / (it + 1), "sparse" if it else "bitmap")
            recorded["examples"] += 16
            recorded["fit"] += 0.1 + 0.01 * w
            recorded["data_wait"] += 0.01 * (it + 1)
            recorded["bytes"] += 100 + it
            recorded["dense"] += 4000
        c.record_phase("averaging", 0.5, start=1010.0)
        payloads.append(c.drain())
    d = StatsCollector("driver")
    d.record_phase("broadcast", 0.2, start=999.0)
    d.record_phase("my_custom_phase", 0.3, start=1011.0)
    stats = TrainingStats.from_payloads([d.drain(), *payloads])
    return stats, recorded


def test_summary_matches_what_was_recorded() -> None:
    stats, rec = _two_worker_stats()
    s = stats.summary()
    assert s["examples"] == rec["examples"] == 16 * 11
    assert s["iterations"] == 6 and s["minibatches"] == 11
    assert s["workers"] == 2 and s["worker_ids"] == ["driver", "worker-0", "worker-1"]
    assert s["seconds"]["fit"] == pytest.approx(rec["fit"])
    assert s["seconds"]["data_wait"] == pytest.approx(rec["data_wait"])
    assert s["seconds"]["averaging"] == pytest.approx(1.0) and s["counts"]["averaging"] == 2
    assert list(s["seconds"]) == ["data_wait", "fit", "averaging"]  # the workers' phases
    assert s["driver_seconds"] == pytest.approx({"broadcast": 0.2, "my_custom_phase": 0.3})
    assert s["driver_counts"] == {"broadcast": 1, "my_custom_phase": 1}
    assert s["wall_seconds"] == pytest.approx(1011.3 - 999.0)
    assert s["bytes_sent"] == rec["bytes"] and s["dense_bytes"] == rec["dense"]
    assert s["compression_ratio"] == pytest.approx(rec["dense"] / rec["bytes"])
    assert s["epochs"] is None
    stats.set_summary("epochs", 3)
    stats.set_summary("replicas_identical", True)
    stats.set_summary("examples", 1234)
    s2 = stats.summary()
    assert (s2["epochs"], s2["replicas_identical"], s2["examples"]) == (3, True, 1234)
    with pytest.raises(ConfigError, match="JSON"):
        stats.set_summary("bad", object())
    json.dumps(s2)  # JSON-ready


def test_driver_fit_span_is_not_a_minibatch() -> None:
    """The driver records one ``fit`` span per fit (or per averaging round): never counted as a minibatch."""
    stats, rec = _two_worker_stats()
    driver = StatsCollector("driver")
    for r in range(3):  # three rounds of 2 s each
        driver.record_phase("fit", 2.0, start=999.5 + r)
    stats.merge([driver.drain()])
    s = stats.summary()
    assert s["minibatches"] == s["counts"]["fit"] == 11  # 5 + 6 trained on the workers
    assert s["iterations"] == 6 and s["examples"] == rec["examples"]
    assert s["seconds"]["fit"] == pytest.approx(rec["fit"])  # no driver wall time in the per-minibatch total
    assert s["driver_counts"]["fit"] == 3 and s["driver_seconds"]["fit"] == pytest.approx(6.0)
    html = render_html(stats)
    assert "fit (driver) duration" in html and ">fit (driver)<" in html


def test_add_worker_payload_applies_offset_and_renames() -> None:
    c = StatsCollector("executor-7")
    c.record_phase("fit", 1.0, start=500.0)
    stats = TrainingStats()
    stats.add_worker_payload("worker-3", c.drain(), clock_offset=20.0)
    ev = stats.events().events()
    assert ev[0].worker == "worker-3" and ev[0].start == 480.0 and ev[0].duration == 1.0
    with pytest.raises(DataError, match="not a stats payload"):
        stats.add_worker_payload("w", {"format": "other"})


def test_merge_of_stats_objects_and_phase_code_remap() -> None:
    a, b = StatsCollector("worker-0"), StatsCollector("worker-1")
    a.record_phase("fit", 1.0, start=1.0)
    b.record_phase("exchange", 2.0, start=2.0)
    b.record_phase("fit", 3.0, start=3.0)
    left = TrainingStats.from_payloads([a.drain()])
    right = TrainingStats.from_payloads([b.drain()])
    merged = TrainingStats().merge([left, right])
    got = sorted((e.worker, e.phase, e.duration) for e in merged.events().events())
    assert got == [("worker-0", "fit", 1.0), ("worker-1", "exchange", 2.0), ("worker-1", "fit", 3.0)]


def test_json_round_trip_is_exact() -> None:
    stats, _ = _two_worker_stats()
    c = StatsCollector("worker-9")
    c.record_score(1, float("nan"))
    c.record_score(2, float("inf"))
    stats.merge([c.drain()])
    stats.set_summary("epochs", 2)
    text = stats.to_json()
    back = TrainingStats.from_json(text)
    assert back.to_json() == text
    assert back.summary() == stats.summary()
    key = lambda e: (e.worker, e.start, e.phase)  # noqa: E731
    assert sorted(back.events().events(), key=key) == sorted(stats.events().events(), key=key)
    sc = back.scores()
    assert math.isnan(sc.score[sc.worker == sc.worker_names.index("worker-9")][0])
    assert np.array_equal(np.sort(back.encoding().bytes_sent), np.sort(stats.encoding().bytes_sent))
    with pytest.raises(SerializationError):
        TrainingStats.from_json('{"format": "nope"}')
    with pytest.raises(SerializationError):
        TrainingStats.from_json("not json")


# ---- aggregation ----------------------------------------------------------------------------------------------------


def test_timeline_occupancy_splits_events_across_buckets() -> None:
    # worker 0: phase 0 from 0.5 to 2.5; worker 1: phase 1 from 3.0 to 4.0 (bucket width 1 s over [0, 4])
    occ = timeline_occupancy(
        np.array([0, 1]), np.array([0, 1]), np.array([100.5, 103.0]), np.array([2.0, 1.0]), 2, 2, 100.0, 104.0, 4
    )
    np.testing.assert_allclose(occ[0, 0], [0.5, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(occ[1, 1], [0.0, 0.0, 0.0, 1.0])
    assert occ[0, 1].sum() == 0 and occ[1, 0].sum() == 0
    cum = stacked_fractions(occ, 1.0)
    np.testing.assert_allclose(cum[0, -1], [0.5, 1.0, 0.5, 0.0])


def test_histogram_and_downsampling() -> None:
    d = np.random.default_rng(0).lognormal(-4, 1, 10_000)
    edges, counts = log_histogram(d, bins=20)
    assert counts.sum() == d.size and len(edges) == 21
    x, y = downsample_series(np.arange(10_000), np.ones(10_000), 2000)
    assert x.size == 2000 and np.all(y == 1.0) and np.all(np.diff(x) > 0)


# ---- HTML ---------------------------------------------------------------------------------------------------------


def test_html_names_every_worker_and_phase(tmp_path) -> None:
    stats, _ = _two_worker_stats()
    path = tmp_path / "report.html"
    stats.export_html(path)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and text.rstrip().endswith("</html>")
    for name in ["driver", "worker-0", "worker-1", "broadcast", "data_wait", "fit", "averaging", "my_custom_phase"]:
        assert f">{name}<" in text, name
    assert "Gradient encoding" in text and "Score vs iteration" in text
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    assert "<script" not in text
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temp file left behind


def test_html_of_empty_stats(tmp_path) -> None:
    TrainingStats().export_html(tmp_path / "empty.html")
    assert "No phase events" in (tmp_path / "empty.html").read_text()


def _synthetic_payloads(iters: int, workers: int) -> list[dict]:
    """fit + data_wait + averaging per iteration per worker, generated column-wise (3 * iters * workers events)."""
    rng = np.random.default_rng(0)
    codes = np.tile(np.array([0, 1, 2], dtype=np.int32), iters)
    payloads = []
    for w in range(workers):
        durs = np.stack(
            [rng.gamma(2.0, 0.002, iters), rng.gamma(5.0, 0.01, iters), rng.gamma(2.0, 0.001, iters)], 1
        ).ravel()
        starts = 1.7e9 + np.concatenate([[0.0], np.cumsum(durs)[:-1]])
        payloads.append(
            {
                "format": PAYLOAD_FORMAT,
                "worker": f"worker-{w}",
                "clock_offset": 0.0,
                "phases": {
                    "names": ["data_wait", "fit", "averaging"],
                    "code": codes,
                    "start": starts,
                    "duration": durs,
                    "attrs": {"examples": np.where(codes == 1, 32.0, np.nan)},
                },
                "scores": {
                    "iteration": np.arange(iters),
                    "score": np.exp(-np.arange(iters) / 3e3) + rng.normal(0, 0.05, iters),
                },
                "encoding": {
                    "step": np.arange(iters),
                    "bytes_sent": rng.integers(1000, 5000, iters),
                    "dense_bytes": np.full(iters, 400_000),
                    "sparsity": rng.uniform(1e-4, 1e-2, iters),
                    "threshold": np.geomspace(1e-3, 1e-4, iters),
                    "format": np.zeros(iters, np.int32),
                    "format_names": ["sparse"],
                },
            }
        )
    return payloads


def test_large_report_stays_under_5mb(tmp_path) -> None:
    payloads = _synthetic_payloads(10_000, 32)
    stats = TrainingStats.from_payloads(payloads)
    s = stats.summary()
    assert s["events"] == 960_000 and s["iterations"] == 10_000 and s["examples"] == 32 * 10_000 * 32
    assert s["seconds"]["fit"] == pytest.approx(sum(p["phases"]["duration"][1::3].sum() for p in payloads))
    path = tmp_path / "big.html"
    stats.export_html(path)
    size = path.stat().st_size
    assert 10_000 < size < 5 * 1024 * 1024
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text
    assert all(f">worker-{w}<" in text for w in range(32))
    assert all(f">{p}<" in text for p in ("data_wait", "fit", "averaging"))


def test_modules_import_alone_without_pyspark() -> None:
    for name in [
        "torchspark.stats",
        "torchspark.stats.events",
        "torchspark.stats.clock",
        "torchspark.stats.collector",
        "torchspark.stats.training_stats",
        "torchspark.stats.aggregate",
        "torchspark.stats.html",
    ]:
        module = importlib.import_module(name)
        assert hasattr(module, "__all__")
    assert set(STANDARD_PHASES) == {p.value for p in Phase} and len(STANDARD_PHASES) == 11
    # No module of the package imports pyspark (ParallelWrapper uses it without Spark).
    import ast
    import pathlib

    import torchspark.stats as pkg

    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] == "pyspark" for n in names), path


def test_summary_names_each_sharing_headline_once() -> None:
    extra = {
        "sharing.bytes_sent": 120,
        "sharing.dense_bytes": 4000,
        "sharing.threshold": 0.01,
        "sharing.start_threshold": 0.02,
        "sharing.world_size": 2,
    }
    summary = build_training_stats(StatsCollector(DRIVER_ID), [], 1, extra).summary()
    assert (summary["bytes_sent"], summary["dense_bytes"], summary["threshold"]) == (120, 4000, 0.01)
    assert summary["start_threshold"] == 0.02 and summary["sharing.world_size"] == 2  # not a headline: full name
    for short in ("bytes_sent", "dense_bytes", "threshold", "start_threshold"):
        assert f"sharing.{short}" not in summary, short
