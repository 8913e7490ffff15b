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

Writes ``benchmarks/results/soak.json`` and prints the Markdown table for BENCHMARKS.md ("Faults").
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
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from torchspark import Network, datasets, models, optim  # noqa: E402
from torchspark.parallel import ParallelWrapper  # noqa: E402
from torchspark.training.config.masters import ParameterAveragingTrainingMaster  # noqa: E402
from torchspark.training.config.shared_master import SharedTrainingMaster  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "soak.json")
BATCH = 16


class Soak:
    """The progress listener (every report, with the time) and the killer thread of one disturbed fit."""

    def __init__(self, kill_every_s: float) -> None:
        self.kill_every_s = kill_every_s
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


def _master(kind: str, directory: str | None, every: int | None, max_failures: int) -> Any:
    common: dict[str, Any] = dict(
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


def _fit(kind: str, epochs: int, directory: str | None, every: int | None, listener: Any = None, failures: int = 0):
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
    pw = ParallelWrapper(net, num_workers=2, master=_master(kind, directory, every, failures), progress=False)
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


def _leftovers(pids: set[int], before: set[str]) -> dict[str, Any]:
    time.sleep(2.0)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
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


def _flat(rss: list[tuple[float, float]]) -> tuple[float, float]:
    values = [v for _, v in rss]
    third = max(1, len(values) // 3)
    return statistics.median(values[:third]), statistics.median(values[-third:])


def soak_one(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    test = datasets.digits("test")
    steps_per_epoch = -(-1437 // 2 // BATCH)
    _fit(kind, 1, None, None)  # warm-up: the fork server, imports
    clock = EpochClock()
    _, _, three = _fit(kind, 3, None, None, clock)
    per_epoch = clock.per_epoch()
    epochs = max(2, round((args.duration_s - (three - 3 * per_epoch)) / per_epoch))
    C.log(f"{kind}: one epoch {per_epoch:.2f} s (3 epochs {three:.1f} s) -> {epochs} epochs")
    ref, _, ref_s = _fit(kind, epochs, None, None)
    before = set()
    for directory in ("/dev/shm", tempfile.gettempdir()):
        before |= {os.path.join(directory, n) for n in os.listdir(directory)}
    ports_before = set(_listening_ports())
    soak = Soak(args.kill_every_s)
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
    left = _leftovers({u[2] for u in soak.updates}, before)
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
        "clean": not any(left.values()),
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
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": C.machine_info(), "args": vars(args), "masters": {}}
    for kind in args.masters.split(","):
        results["masters"][kind] = soak_one(kind, args)
        C.log(f"{kind}: {json.dumps({k: v for k, v in results['masters'][kind].items() if k != 'rss_mib'})}")
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
            "leftovers",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
