"""Gradient sharing vs dense synchronous parameter averaging: bytes exchanged and test accuracy at equal epochs.

Run: ``.venv/bin/python benchmarks/bench_sharing.py [--quick] [--epochs 15] [--seeds 0,1,2]``

LeNet (8x8 'same'-padded variant) on scikit-learn's digits (1,437 train / 360 test examples), Adam lr 1e-3,
2 workers on ``local[2]``, 16 examples per worker per step, the same number of epochs for every configuration, the
same network seeds and the same minibatch shuffle (``rng_seed``). Configurations:

- dense: ``ParameterAveragingTrainingMaster`` with ``averaging_frequency`` 5 (DL4J's and torchspark's default) and
  1 (average after every step, i.e. synchronous SGD with averaged Adam state), ``save_updater=True``;
- sharing: ``SharedTrainingMaster`` with its default threshold policy (``AdaptiveThreshold()``, start calibrated
  from the first updates), DL4J's fixed 1e-4 start, a hand-tuned 1e-2 start and two other policies.

Bytes are payload bytes handed to the collective by each worker, summed over workers and the whole fit:

- sharing: ``network.extra_config["sharing.bytes_sent"]`` (1 flag byte + encoded message per step, including the
  1-byte messages of inactive rounds); its ``"sharing.dense_bytes"`` is ``4 x num_params`` per encoded step, i.e.
  what sending each step's update densely as float32 would have cost;
- dense averaging: ``4 x (num_params + updater_state_size + 3) x averaging rounds x workers`` -- one all-reduce
  of ``[params, updater state, 3 bookkeeping floats]`` per round; rounds x workers is counted from the
  ``averaging`` phase events of ``training_stats``.
Gloo's wire traffic differs from payload for both (ring all-reduce moves ~2(n-1)/n of the buffer per worker,
all-gather pads messages to the longest one and delivers each to every peer); payload is the like-for-like count.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import _common as C  # noqa: E402

LR = 1e-3
BATCH_PER_WORKER = 16
TARGET_RATIO = 300.0
TARGET_PP = 0.5


DEFAULT_NAME = "AdaptiveThreshold() [default: calibrated start, band 1e-4..1e-2]"


#: short names for ``--configs``: the two dense baselines and the sharing settings, in table order
CONFIG_KEYS = ("f5", "f1", "default", "dl4j", "tuned", "target", "fixed")


def sharing_configs(keys: list[str]) -> list[tuple[str, Any]]:
    from torchspark.encoding import AdaptiveThreshold, FixedThreshold, TargetSparsityThreshold

    configs = {
        "default": (DEFAULT_NAME, AdaptiveThreshold()),
        "dl4j": ("AdaptiveThreshold(initial=1e-4) [DL4J's fixed start]", AdaptiveThreshold(initial=1e-4)),
        "tuned": ("AdaptiveThreshold(initial=1e-2) [hand-tuned start]", AdaptiveThreshold(initial=1e-2)),
        "target": ("TargetSparsityThreshold(target=1e-3) [calibrated start]", TargetSparsityThreshold()),
        "fixed": ("FixedThreshold(1e-3)", FixedThreshold(1e-3)),
    }
    return [configs[k] for k in keys if k in configs]


def make_network(seed: int) -> Any:
    import torchspark as ts
    from torchspark import models, optim

    return ts.Network(models.lenet(1, 10, 8, 8), loss="cross_entropy", updater=optim.Adam(lr=LR), seed=seed)


def run_one(spark: Any, rdd: Any, test: Any, master: Any, seed: int, epochs: int) -> dict[str, Any]:
    from torchspark.spark import SparkNetwork

    snet = SparkNetwork(spark, make_network(seed), master, progress=False)
    try:
        t0 = time.perf_counter()
        net = snet.fit(rdd, epochs=epochs)
        wall = time.perf_counter() - t0
        acc = float(net.evaluate(test).accuracy())
        stats = snet.training_stats
        summary = stats.summary() if stats is not None else {}
        out: dict[str, Any] = {
            "accuracy": acc,
            "fit_s": wall,
            "num_params": net.num_params(),
            "updater_state_size": net.updater_state_size(),
            "phase_seconds": summary.get("seconds", {}),
            "phase_counts": summary.get("counts", {}),
        }
        if "sharing.bytes_sent" in net.extra_config:
            out["bytes"] = int(net.extra_config["sharing.bytes_sent"])
            out["dense_step_bytes"] = int(net.extra_config["sharing.dense_bytes"])
            out["threshold_end"] = float(net.extra_config.get("sharing.threshold", float("nan")))
            out["threshold_start"] = float(net.extra_config.get("sharing.start_threshold", float("nan")))
            out["mean_density"] = summary.get("mean_sparsity")
            out["steps_encoded"] = int(stats.encoding().bytes_sent.shape[0]) if stats is not None else None
        else:
            rounds_x_workers = int(summary.get("counts", {}).get("averaging", 0))
            floats = net.num_params() + (net.updater_state_size() if master.save_updater else 0) + 3
            out["rounds_x_workers"] = rounds_x_workers
            out["bytes"] = 4 * floats * rounds_x_workers
        return out
    finally:
        snet.delete_temp_files()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seeds", default=None, help="network seeds, comma-separated")
    parser.add_argument(
        "--configs",
        default=None,
        help=f"comma-separated subset of {', '.join(CONFIG_KEYS)} "
        "(default: all; --quick: f5,f1,default,dl4j); f5 is the baseline and always runs",
    )
    args = parser.parse_args()
    keys = (args.configs or ("f5,f1,default,dl4j" if args.quick else ",".join(CONFIG_KEYS))).split(",")
    unknown = sorted(set(keys) - set(CONFIG_KEYS))
    if unknown:
        parser.error(f"unknown configs {unknown}; known: {', '.join(CONFIG_KEYS)}")
    epochs = args.epochs or (4 if args.quick else 15)
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]

    from torchspark import datasets
    from torchspark.data import DataSet
    from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, local_session

    torch.set_num_threads(2)
    train, test = datasets.digits("train"), datasets.digits("test")
    C.log("starting local[2] Spark session")
    spark = local_session(cores=2, app_name="torchspark-bench-sharing")
    # contiguous copies: a split() view would pickle the whole training set into every element
    chunks = [DataSet(p.features.clone(), p.labels.clone()) for p in train.split(64)]
    rdd = spark.sparkContext.parallelize(chunks, 2)
    common = dict(batch_size_per_worker=BATCH_PER_WORKER, num_workers=2, rng_seed=0, collect_training_stats=True)
    configs: list[tuple[str, str, Any]] = [
        (
            "dense",
            "ParameterAveraging, averaging_frequency=5",
            ParameterAveragingTrainingMaster(averaging_frequency=5, **common),
        ),
    ]
    if "f1" in keys:
        configs.append(
            (
                "dense",
                "ParameterAveraging, averaging_frequency=1",
                ParameterAveragingTrainingMaster(averaging_frequency=1, **common),
            )
        )
    configs += [
        ("sharing", name, SharedTrainingMaster(threshold_algorithm=policy, **common))
        for name, policy in sharing_configs(keys)
    ]
    # single-process reference (same epochs, global batch 32)
    results: dict[str, list[dict[str, Any]]] = {name: [] for _, name, _ in configs}
    results.setdefault("ParameterAveraging, averaging_frequency=1", [])
    results["single process Network.fit (reference)"] = []
    watch = C.SourceWatch()
    t_all = time.perf_counter()
    try:
        for seed in seeds:
            net = make_network(seed)
            t0 = time.perf_counter()
            net.fit(train, epochs=epochs, batch_size=2 * BATCH_PER_WORKER)
            results["single process Network.fit (reference)"].append(
                {"accuracy": float(net.evaluate(test).accuracy()), "fit_s": time.perf_counter() - t0}
            )
            for kind, name, master in configs:
                try:
                    r = run_one(spark, rdd, test, master, seed, epochs)
                except Exception as e:  # noqa: BLE001 - record and continue
                    traceback.print_exc()
                    r = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
                r["kind"] = kind
                results[name].append(r)
                C.log(
                    f"seed {seed} {name}: acc={r.get('accuracy', float('nan')):.4f} "
                    f"bytes={r.get('bytes', 0):,} fit={r.get('fit_s', float('nan')):.1f}s"
                )
    finally:
        spark.stop()
    report(results, configs, seeds, epochs, time.perf_counter() - t_all, args.quick, watch.note())


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def report(
    results: dict[str, list[dict[str, Any]]],
    configs: list[tuple[str, str, Any]],
    seeds: list[int],
    epochs: int,
    elapsed: float,
    quick: bool,
    source_note: str,
) -> None:
    def ok(name: str) -> list[dict[str, Any]]:
        return [r for r in results[name] if "error" not in r]

    base_name = "ParameterAveraging, averaging_frequency=5"
    sync_name = "ParameterAveraging, averaging_frequency=1"
    base = ok(base_name)
    base_bytes = _mean([r["bytes"] for r in base])
    base_acc = _mean([r["accuracy"] for r in base])
    sync_bytes = _mean([r["bytes"] for r in ok(sync_name)])
    headers = [
        "configuration",
        "test accuracy % (mean)",
        "per seed",
        "acc. diff vs dense f=5 (pp)",
        "bytes exchanged (all workers)",
        "x fewer than dense f=5",
        "x fewer than dense f=1",
        "x fewer than dense per-step updates",
        "threshold start -> end (mean)",
        "fit s (mean)",
    ]
    rows = []
    json_rows = []
    verdicts = []
    for name in ["single process Network.fit (reference)"] + [n for _, n, _ in configs]:
        rs = ok(name)
        errors = [r["error"] for r in results[name] if "error" in r]
        if not rs:
            rows.append([name, "error", errors[0] if errors else "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        acc = _mean([r["accuracy"] for r in rs])
        per_seed = " / ".join(f"{100 * r['accuracy']:.1f}" for r in rs)
        diff_pp = 100 * (acc - base_acc)
        b = _mean([r["bytes"] for r in rs]) if "bytes" in rs[0] else float("nan")
        ratio_f5 = base_bytes / b if b == b and b else float("nan")
        ratio_f1 = sync_bytes / b if b == b and b else float("nan")
        ratio_dense_steps = (_mean([r["dense_step_bytes"] for r in rs]) / b) if "dense_step_bytes" in rs[0] else None
        rows.append(
            [
                name,
                100 * acc,
                per_seed,
                "-" if name == base_name else f"{diff_pp:+.2f}",
                f"{b:,.0f}" if b == b else "-",
                "-" if name == base_name or b != b else f"{ratio_f5:,.0f}x",
                "-" if name == sync_name else (f"{ratio_f1:,.0f}x" if ratio_f1 == ratio_f1 else "-"),
                f"{ratio_dense_steps:,.0f}x" if ratio_dense_steps else "-",
                (
                    f"{_mean([r['threshold_start'] for r in rs]):.3g} -> {_mean([r['threshold_end'] for r in rs]):.3g}"
                    if "threshold_start" in rs[0]
                    else "-"
                ),
                _mean([r["fit_s"] for r in rs]),
            ]
        )
        json_rows.append(
            {
                "name": name,
                "accuracy": acc,
                "diff_pp_vs_dense_f5": diff_pp,
                "bytes": b,
                "ratio_vs_dense_f5": ratio_f5,
                "ratio_vs_dense_f1": ratio_f1,
                "ratio_vs_dense_steps": ratio_dense_steps,
                "runs": results[name],
            }
        )
        if any(k == "sharing" and n == name for k, n, _ in configs):
            verdicts.append((name, ratio_f5, diff_pp, ratio_f5 >= TARGET_RATIO and -diff_pp <= TARGET_PP))
        if errors:
            rows[-1][0] += f" ({len(errors)} run(s) failed: {errors[0]})"
    C.print_table(
        f"gradient sharing vs dense averaging, LeNet on digits, {epochs} epochs, seeds {seeds}", headers, rows
    )
    default = next((v for v in verdicts if v[0] == DEFAULT_NAME), None)
    if default is not None:
        measured = "; ".join(f"{n.split(' [')[0]}: {r:,.0f}x, {d:+.2f} pp" for n, r, d, _ in verdicts)
        targets = [
            {
                "target": f"default SharedTrainingMaster settings: >= {TARGET_RATIO:.0f}x fewer bytes than dense "
                f"averaging (f=5) at <= {TARGET_PP} pp accuracy loss (LeNet, digits, 2 workers)",
                "measured": measured,
                "met": bool(default[3]),
            }
        ]
    else:
        targets = [
            {"target": "gradient sharing bytes/accuracy", "measured": "the default-settings run failed", "met": None}
        ]
    p = ok(base_name)[0] if base else {}
    n_params, s_size = p.get("num_params", 0), p.get("updater_state_size", 0)
    md = [
        "## Gradient sharing vs dense averaging\n",
        C.stamp() + f" Run time {elapsed / 60:.1f} min{' (--quick)' if quick else ''}. {source_note}\n",
        f"`benchmarks/bench_sharing.py`: LeNet (8x8 inputs, {n_params:,} parameters; Adam state {s_size:,} floats) "
        f"on scikit-learn digits (1,437 train / 360 test), Adam lr {LR:g}, 2 workers on `local[2]`, "
        f"{BATCH_PER_WORKER} examples per worker per step, {epochs} epochs for every configuration, network seeds "
        f"{', '.join(map(str, seeds))} (accuracy is the mean over seeds; one test example is 0.28 pp, so single "
        "runs differ by about +-1 pp). Same minibatch shuffle (`rng_seed=0`) everywhere.\n",
        "Bytes = payload each worker hands to the collective, summed over workers and the fit. Sharing: "
        '`extra_config["sharing.bytes_sent"]` (flag byte + threshold-encoded message per step). Dense averaging: '
        "`4 x (num_params + updater_state_size + 3) x rounds x workers` (one all-reduce of params, Adam state and "
        "3 bookkeeping floats per round; rounds x workers counted from the `averaging` events in `training_stats`). "
        '"Dense per-step updates" is sharing\'s own `sharing.dense_bytes`: `4 x num_params` per encoded step '
        "(sending every step's update densely). The headline ratio is against averaging_frequency=5, the cheapest "
        "dense configuration (the most conservative ratio).\n",
        C.markdown_table(headers, rows) + "\n",
    ]
    if verdicts:
        lines = [
            f"- {n}: **{r:,.0f}x** fewer bytes, **{d:+.2f} pp** accuracy -> {'meets' if m else 'misses'} the target"
            for n, r, d, m in verdicts
        ]
        md.append(
            f"Target: the default settings reach >= {TARGET_RATIO:.0f}x fewer bytes at <= {TARGET_PP} pp "
            "accuracy loss.\n\n" + "\n".join(lines) + "\n"
        )
        verdict = (
            "not measured (the default-settings run failed)"
            if default is None
            else ("met by the default settings" if default[3] else "not met by the default settings")
        )
        md.append(
            f"**Verdict: {verdict}.** The default start is calibrated from the workers' first updates (no "
            "tuning); DL4J's 1e-4 start spends its first ~130 steps sending dense bitmaps. The threshold "
            "settings were chosen before the run; with 3 seeds and 360 test examples an accuracy difference "
            "under ~0.5-1 pp is within noise.\n"
        )
    C.write_section(
        "sharing",
        "\n".join(md),
        {"epochs": epochs, "seeds": seeds, "rows": json_rows, "targets": targets, "elapsed_s": elapsed},
    )


if __name__ == "__main__":
    main()
