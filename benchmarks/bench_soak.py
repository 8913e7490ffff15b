"""Soak: a long fit with a worker SIGKILLed every minute, both masters, against the same fit undisturbed.

Run (the 10-minute soak, about 45 minutes in all: per master one undisturbed fit and one disturbed fit of
``--duration-s`` each, plus a short calibration):

    .venv/bin/python benchmarks/bench_soak.py --duration-s 600 --kill-every-s 60

``--duration-s 120`` proves the script in about 10 minutes. Each master trains LeNet on digits with 2
``ParallelWrapper`` worker processes, ``checkpoint_directory`` in a fresh temporary directory (one checkpoint per
``--checkpoint-every`` steps), ``max_failures`` above the number of kills. The number of epochs is chosen so the
undisturbed fit lasts about ``--duration-s`` (calibrated first: a warm-up fit of 1 epoch, then the time between rank 0's first reports of epochs 0 and 2
of a 3-epoch fit). A killer thread SIGKILLs the newest
worker process of rank 0 and rank 1 in turn every ``--kill-every-s`` seconds. Measured:

* attempts: the disturbed fit's launches of the workers (kills + 1 when every kill was recovered);
* lost per kill: for each failure, the minibatches of rank 0 between the furthest point the failed attempt reported
  and the point the next attempt restarted from (``summary()["failures"]`` and the progress stream); target: at
  most one checkpoint interval;
* final accuracy on digits' test split, disturbed vs undisturbed (target: within 1 pp);
* driver memory: this process's RSS sampled every 10 s during the disturbed fit (target: flat: the last third's
  median within 10% of the first third's);
* leftovers after the run: worker processes still alive, ``/dev/shm`` and temp entries naming a worker pid, the
  checkpoint directory's size after the temporary directory was removed, sockets this process still listens on
  (target: none).

``--route spark`` runs the same soak through ``SparkNetwork`` on a ``local[2]`` session (one session for every fit;
the killer SIGKILLs the Spark Python worker that trains the rank) and also samples the driver JVM's RSS every 10 s,
then reads its heap after a full GC against the heap it committed, what the driver still holds for Spark
(broadcasts, persisted RDDs) and the JVM's RSS after ``--idle-s`` of quiet (``_soak_spark.py``). Issue 31's
"driver RSS grows 544->711 MB and JVM 338->498 MB over 7 recoveries" is this route:

    .venv/bin/python benchmarks/bench_soak.py --route spark --masters averaging --duration-s 180 --kill-every-s 30

Writes ``benchmarks/results/soak.json`` (``--route spark``: ``soak_spark.json``) and prints the Markdown table for
BENCHMARKS.md ("Faults").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from _soak_spark import SparkRoute  # noqa: E402
from torchspark import Network, datasets, models, optim  # noqa: E402
from torchspark.parallel import ParallelWrapper  # noqa: E402
from torchspark.training.config.masters import ParameterAveragingTrainingMaster  # noqa: E402
from torchspark.training.config.shared_master import SharedTrainingMaster  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "soak.json")
RESULTS_SPARK = os.path.join(os.path.dirname(RESULTS), "soak_spark.json")
BATCH = 16


class Soak:
    """The progress listener (every report, with the time) and the killer thread of one disturbed fit."""

    def __init__(self, kill_every_s: float, jvm_rss: Callable[[], float | None] | None = None) -> None:
        self.kill_every_s = kill_every_s
        self.jvm_rss = jvm_rss  # the Spark route: the driver JVM's RSS, sampled beside this process's
        self.jvm: list[tuple[float, float | None]] = []  # (time, MiB)
        self.updates: list[tuple[float, int, int, int, int]] = []  # (time, rank, pid, epoch, iteration)
        self.kills: list[tuple[float, int, int]] = []  # (time, rank, pid)
        self.rss: list[tuple[float, float]] = []  # (time, MiB)
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, update: Any) -> None:
        if update.pid is not None:
            with self._lock:
                self.updates.append((time.time(), update.rank, update.pid, update.epoch, update.iteration))

    def newest_pid(self, rank: int) -> int | None:
        with self._lock:
            killed = {pid for _, _, pid in self.kills}
            found = [u[2] for u in self.updates if u[1] == rank and u[2] not in killed]
        return found[-1] if found else None

    def run_killer(self) -> None:
        rank = 1
        while not self.stop.wait(self.kill_every_s):
            pid = self.newest_pid(rank)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.kills.append((time.time(), rank, pid))
                except ProcessLookupError:
                    pass
            rank = 1 - rank

    def run_sampler(self) -> None:
        while True:
            self.rss.append((time.time(), _rss_mib()))
            if self.jvm_rss is not None:
                self.jvm.append((time.time(), self.jvm_rss()))
            if self.stop.wait(10.0):
                return


class EpochClock:
    """A progress listener: when rank 0 first reported from each epoch (the steady epoch time, without the launch)."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}

    def __call__(self, update: Any) -> None:
        if update.rank == 0:
            self.first.setdefault(update.epoch, time.perf_counter())

    def per_epoch(self) -> float:
        return max(0.05, (self.first[2] - self.first[0]) / 2)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _master(kind: str, directory: str | None, every: int | None, max_failures: int, route: SparkRoute | None) -> Any:
    common: dict[str, Any] = dict(
        **(route.master_options(BATCH) if route is not None else {}),
        rng_seed=0,
        collect_training_stats=True,
        rendezvous_timeout_s=30,
        checkpoint_directory=directory,
        checkpoint_every=every if directory else None,
        max_failures=max_failures,
    )
    if kind == "averaging":
        return ParameterAveragingTrainingMaster(averaging_frequency=5, **common)
    return SharedTrainingMaster(**common)


def _fit(
    kind: str,
    epochs: int,
    directory: str | None,
    every: int | None,
    listener: Any = None,
    failures: int = 0,
    route: SparkRoute | None = None,
):
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
    master = _master(kind, directory, every, failures, route)
    if route is not None:
        start = time.perf_counter()
        spark_net = route.fit(net, master, epochs, listener)
        return net, spark_net, time.perf_counter() - start
    pw = ParallelWrapper(net, num_workers=2, master=master, progress=False)
    if listener is not None:
        pw.add_progress_listener(listener)
    start = time.perf_counter()
    pw.fit(datasets.digits("train"), epochs=epochs, batch_size=BATCH)
    return net, pw, time.perf_counter() - start


def _lost_per_kill(soak: Soak, failures: list[dict[str, Any]], steps_per_epoch: int) -> list[int]:
    """Rank 0's minibatches between the failed attempt's furthest report and the next attempt's first report."""
    lost = []
    for f in failures:
        if f.get("reached_epoch") is None:
            continue
        reached = f["reached_epoch"] * steps_per_epoch + f["reached_iteration"]
        after = [u for u in soak.updates if u[0] > f["time"] and u[1] == 0]
        if after:
            restart = after[0][3] * steps_per_epoch + after[0][4]
            lost.append(max(0, reached - restart))
    return lost


def _leftovers(pids: set[int], before: set[str], gone: set[int] | None = None) -> dict[str, Any]:
    """What the run left: processes of ``gone`` (default: every worker pid) alive, new files naming a worker pid,
    and this process's listening ports (Spark's idle Python workers are reused: only the killed ones must end)."""
    time.sleep(2.0)
    alive = [
        p
        for p in (pids if gone is None else gone)
        if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
    ]
    entries = set()
    for directory in ("/dev/shm", tempfile.gettempdir()):
        entries |= {os.path.join(directory, n) for n in os.listdir(directory)}
    new = sorted(e for e in entries - before if any(str(p) in os.path.basename(e) for p in pids))
    listening = _listening_ports()
    return {"processes": alive, "files": new, "listening_ports": listening}


def _listening_ports() -> list[int]:
    """TCP ports this process still listens on (its socket inodes matched against /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _flat(rss: list[tuple[float, float | None]]) -> tuple[float, float]:
    values = [v for _, v in rss if v is not None]
    third = max(1, len(values) // 3)
    return statistics.median(values[:third]), statistics.median(values[-third:])


def soak_one(kind: str, args: argparse.Namespace, route: SparkRoute | None = None) -> dict[str, Any]:
    test = datasets.digits("test")
    steps_per_epoch = -(-1437 // 2 // BATCH)
    _fit(kind, 1, None, None, route=route)  # warm-up: the fork server (Spark: the Python workers), imports
    clock = EpochClock()
    _, _, three = _fit(kind, 3, None, None, clock, route=route)
    per_epoch = clock.per_epoch()
    epochs = max(2, round((args.duration_s - (three - 3 * per_epoch)) / per_epoch))
    C.log(f"{kind}: one epoch {per_epoch:.2f} s (3 epochs {three:.1f} s) -> {epochs} epochs")
    ref, _, ref_s = _fit(kind, epochs, None, None, route=route)
    before = set()
    for directory in ("/dev/shm", tempfile.gettempdir()):
        before |= {os.path.join(directory, n) for n in os.listdir(directory)}
    ports_before = set(_listening_ports())
    held_before = route.held() if route is not None else {}
    soak = Soak(args.kill_every_s, route.jvm_rss if route is not None else None)
    threads = [threading.Thread(target=soak.run_killer, daemon=True), threading.Thread(target=soak.run_sampler)]
    with tempfile.TemporaryDirectory(prefix="soak-ck-") as ck:
        for t in threads:
            t.start()
        try:
            net, pw, took = _fit(
                kind,
                epochs,
                ck,
                args.checkpoint_every,
                soak,
                failures=10 + 2 * int(args.duration_s * 3 / args.kill_every_s),
                route=route,
            )
        finally:
            soak.stop.set()
            for t in threads:
                t.join(timeout=30)
    summary = pw.training_stats.summary()
    failures = summary["failures"]
    lost = _lost_per_kill(soak, failures, steps_per_epoch)
    interval = args.checkpoint_every or steps_per_epoch  # averaging counts rounds of 5 steps
    interval_steps = interval * (5 if kind == "averaging" and args.checkpoint_every else 1)
    first, last = _flat(soak.rss)
    jvm = route.after_run(held_before, args.idle_s) if route is not None else {}
    killed = {pid for _, _, pid in soak.kills} if route is not None else None
    left = _leftovers({u[2] for u in soak.updates}, before, killed)
    left["listening_ports"] = sorted(set(left["listening_ports"]) - ports_before)
    acc, ref_acc = net.evaluate(test).accuracy(), ref.evaluate(test).accuracy()
    return {
        "epochs": epochs,
        "undisturbed_s": ref_s,
        "disturbed_s": took,
        "kills": len(soak.kills),
        "attempts": len(failures) + 1,
        "lost_minibatches_per_kill": lost,
        "checkpoint_interval_minibatches": interval_steps,
        "lost_within_interval": all(x <= interval_steps for x in lost),
        "accuracy": acc,
        "accuracy_undisturbed": ref_acc,
        "accuracy_within_1pp": abs(acc - ref_acc) <= 0.01,
        "rss_mib": [round(v, 1) for _, v in soak.rss],
        "rss_first_third_mib": first,
        "rss_last_third_mib": last,
        "rss_flat": last <= first * 1.10,
        "leftovers": left,
        "clean": not any(left.values()) and not any(jvm.get("driver_held_after_fit", {}).values()),
        **_jvm_fields(soak, jvm),
    }


def _jvm_fields(soak: Soak, jvm: dict[str, Any]) -> dict[str, Any]:
    """The Spark route's JVM figures: its RSS samples, first and last third, and :meth:`SparkRoute.after_run`."""
    if not soak.jvm:
        return {}
    first, last = _flat(soak.jvm)
    return {
        "jvm_rss_mib": [None if v is None else round(v, 1) for _, v in soak.jvm],
        "jvm_rss_first_third_mib": first,
        "jvm_rss_last_third_mib": last,
        "jvm_rss_flat": last <= first * 1.10,
        **jvm,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0, help="length of each fit (default 600)")
    parser.add_argument("--kill-every-s", type=float, default=60.0, help="seconds between kills (default 60)")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="checkpoint interval (averaging rounds / sharing steps); default once per epoch",
    )
    parser.add_argument("--masters", default="averaging,sharing")
    parser.add_argument(
        "--route",
        choices=["parallel", "spark"],
        default="parallel",
        help="parallel: ParallelWrapper, 2 processes (default); spark: SparkNetwork on local[2], the JVM measured too",
    )
    parser.add_argument(
        "--idle-s",
        type=float,
        default=70.0,
        help="spark route: quiet seconds before the JVM's RSS is read again (Spark's idle pools end after 60 s)",
    )
    parser.add_argument("--out", default=None, help="default: results/soak.json (spark route: soak_spark.json)")
    args = parser.parse_args()
    args.out = args.out or (RESULTS_SPARK if args.route == "spark" else RESULTS)
    route = SparkRoute() if args.route == "spark" else None
    results: dict[str, Any] = {"machine": C.machine_info(), "args": vars(args), "masters": {}}
    try:
        for kind in args.masters.split(","):
            results["masters"][kind] = soak_one(kind, args, route)
            shown = {k: v for k, v in results["masters"][kind].items() if k not in ("rss_mib", "jvm_rss_mib")}
            C.log(f"{kind}: {json.dumps(shown)}")
    finally:
        if route is not None:
            route.stop()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    rows = [
        [
            kind,
            r["epochs"],
            f"{r['disturbed_s']:.0f} s ({r['disturbed_s'] / r['undisturbed_s']:.2f}x)",
            r["kills"],
            r["attempts"],
            f"{max(r['lost_minibatches_per_kill'], default=0)} / {r['checkpoint_interval_minibatches']}",
            f"{r['accuracy']:.3f} vs {r['accuracy_undisturbed']:.3f}",
            f"{r['rss_first_third_mib']:.0f} -> {r['rss_last_third_mib']:.0f} MiB",
            *_jvm_cells(r),
            "none" if r["clean"] else "SOME",
        ]
        for kind, r in results["masters"].items()
    ]
    C.print_table(
        "Faults: soak",
        [
            "master",
            "epochs",
            "fit (vs undisturbed)",
            "kills",
            "attempts",
            "max lost per kill / interval (minibatches)",
            "accuracy vs undisturbed",
            "driver RSS (first -> last third)",
            *(JVM_HEADERS if route is not None else []),
            "leftovers",
        ],
        rows,
    )


JVM_HEADERS = ["JVM RSS (first -> last third; after idle)", "JVM heap after GC / committed"]


def _jvm_cells(r: dict[str, Any]) -> list[str]:
    if "jvm_rss_first_third_mib" not in r:
        return []
    idle = r["jvm_rss_after_idle_mib"]
    return [
        f"{r['jvm_rss_first_third_mib']:.0f} -> {r['jvm_rss_last_third_mib']:.0f} MiB; "
        f"{'?' if idle is None else f'{idle:.0f}'} MiB",
        f"{r['jvm_heap_used_after_gc_mib']:.0f} / {r['jvm_heap_committed_mib']:.0f} MiB",
    ]


if __name__ == "__main__":
    main()
