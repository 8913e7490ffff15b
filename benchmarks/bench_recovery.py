"""Recovery from faults: how long a fit takes to notice a lost worker and train again, and how much work it loses.

Run: ``.venv/bin/python benchmarks/bench_recovery.py [--only pw-kill,pw-stop,spark-kill,spark-sharing-kill]``

Each scenario trains LeNet on digits with 2 workers for ``--epochs`` epochs, once undisturbed and once with a fault
injected from the outside into rank 1 when it reports from epoch ``--fault-epoch`` on (SIGKILL of the worker
process, or SIGSTOP). Measured from the fit's own records (``summary()["failures"]``) and the progress stream:

* detect: fault -> the driver raises the attempt's failure (peers' timeout, the watchdog, or Spark's report);
* back: fault -> the first progress report of the relaunched attempt (training again);
* lost: the failed attempt's training time (start -> failure), all of it trained again without a checkpoint;
* cost: fit time with the fault minus the undisturbed fit time.

Prints a Markdown table (paste it under "Recovery" in BENCHMARKS.md) and writes ``results/recovery.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchspark import Network, datasets, models, optim  # noqa: E402
from torchspark.training.config.masters import ParameterAveragingTrainingMaster  # noqa: E402
from torchspark.training.config.shared_master import SharedTrainingMaster  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "recovery.json")


class Injector:
    """A progress listener: signals rank 1's process once, when it reports from ``epoch`` on; logs every update."""

    def __init__(self, sig: int | None, epoch: int) -> None:
        self.sig, self.epoch = sig, epoch
        self.fired_at: float | None = None
        self.updates: list[tuple[float, int, int | None]] = []
        self._lock = threading.Lock()

    def __call__(self, update) -> None:
        now = time.time()
        with self._lock:
            self.updates.append((now, update.rank, update.pid))
            if self.sig is not None and self.fired_at is None and update.rank == 1 and update.epoch >= self.epoch:
                self.fired_at = now
                os.kill(update.pid, self.sig)


def _master(kind: str, timeout_s: float, checkpoints: str | None = None):
    common = dict(
        batch_size_per_worker=16,
        num_workers=2,
        rng_seed=0,
        collect_training_stats=True,
        rendezvous_timeout_s=timeout_s,
        checkpoint_directory=checkpoints,
    )
    if kind == "sharing":
        return SharedTrainingMaster(**common)
    return ParameterAveragingTrainingMaster(averaging_frequency=5, **common)


def _run(route: str, kind: str, sig: int | None, args, spark=None) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as checkpoints:
        return _run_in(route, kind, sig, args, spark, checkpoints if kind.endswith("+ckpt") else None)


def _run_in(route: str, kind: str, sig: int | None, args, spark, checkpoints: str | None) -> dict:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
    master = _master(kind.removesuffix("+ckpt"), args.timeout, checkpoints)
    injector = Injector(sig, args.fault_epoch)
    t0 = time.time()
    if route == "spark":
        from torchspark.spark import SparkNetwork

        trainer = SparkNetwork(spark, net, master, progress=False)
        trainer.add_progress_listener(injector)
        trainer.fit(spark.sparkContext.parallelize(train.split(64), 2), epochs=args.epochs)
        trainer.delete_temp_files()
        stats = trainer.training_stats
    else:
        from torchspark.parallel import ParallelWrapper

        trainer = ParallelWrapper(net, num_workers=2, master=master, progress=False)
        trainer.add_progress_listener(injector)
        trainer.fit(train, epochs=args.epochs, batch_size=16)
        stats = trainer.training_stats
    seconds = time.time() - t0
    summary = stats.summary()
    out = {"seconds": seconds, "accuracy": net.evaluate(test).accuracy(), "failures": summary["failures"]}
    if sig is not None and summary["failures"]:
        f = summary["failures"][0]
        fired = injector.fired_at or f["time"]
        back = next((t for t, _, _ in injector.updates if t > f["time"]), None)
        out.update(
            detect_s=f["time"] - fired,
            back_s=None if back is None else back - fired,
            lost_s=f["time"] - f["started"],
            reached=(f["reached_epoch"], f["reached_iteration"]),
            reason=f["reason"],
            exit_status=f["exit_status"],
            recovered_from=summary["recovered_from"],
        )
    return out


SCENARIOS = {
    "pw-kill": ("parallel", "averaging", signal.SIGKILL, "ParallelWrapper averaging: kill -9 a worker process"),
    "pw-kill-ckpt": (
        "parallel",
        "averaging+ckpt",
        signal.SIGKILL,
        "ParallelWrapper averaging, checkpoint once per epoch: kill -9 a worker process",
    ),
    "pw-stop": ("parallel", "averaging", signal.SIGSTOP, "ParallelWrapper averaging: SIGSTOP a worker process"),
    "spark-kill": ("spark", "averaging", signal.SIGKILL, "SparkNetwork averaging, local[2]: kill -9 a Python worker"),
    "spark-sharing-kill": (
        "spark",
        "sharing",
        signal.SIGKILL,
        "SparkNetwork sharing, local[2]: kill -9 a Python worker",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--fault-epoch", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0, help="rendezvous_timeout_s")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    spark = None
    if any(SCENARIOS[n][0] == "spark" for n in names):
        from torchspark.spark import local_session

        spark = local_session(cores=2, app_name="torchspark-bench-recovery")
    rows, raw = [], {}
    try:
        for name in names:
            route, kind, sig, label = SCENARIOS[name]
            base = _run(route, kind, None, args, spark)
            hit = _run(route, kind, sig, args, spark)
            raw[name] = {"undisturbed": base, "fault": hit}
            print(json.dumps({name: raw[name]}), flush=True)
            if "detect_s" not in hit:
                rows.append(f"| {label} | no failure recorded | | | | |")
                continue
            start = hit["recovered_from"]
            lost = (
                f"{hit['lost_s']:.1f} s (epochs 0-{hit['reached'][0]}, to step {hit['reached'][1]})"
                if start["checkpoint"] is None
                else f"epoch {hit['reached'][0]} to step {hit['reached'][1]} (restarted from the checkpoint after "
                f"epoch {start['epoch']})"
            )
            rows.append(
                f"| {label} | {hit['detect_s']:.1f} s | {hit['back_s']:.1f} s | {lost} | "
                f"{hit['seconds'] - base['seconds']:+.1f} s ({base['seconds']:.0f} s -> "
                f"{hit['seconds']:.0f} s) | {base['accuracy']:.3f} / {hit['accuracy']:.3f} |"
            )
    finally:
        if spark is not None:
            spark.stop()
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS + ".tmp", "w") as f:
        json.dump({"args": vars(args), "results": raw}, f, indent=2)
    os.replace(RESULTS + ".tmp", RESULTS)
    print("| fault | detect | training again | work lost | fit time cost | accuracy undisturbed / recovered |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
