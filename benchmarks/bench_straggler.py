"""Bounded staleness (``max_staleness=k``) with one slowed worker host: time and accuracy per epoch on a namespace
cluster.

Run (root, ``ip netns``, a cgroup ``cpu`` controller for the CPU slowdowns):
``.venv/bin/python benchmarks/bench_straggler.py [--slowdowns none,cpu,cpu-flap,link] [--ks sync,0,1,4] [--reps 2]
[--epochs 4] [--n-train 4096] [--target 0.8] [--append] [--no-write]`` (the defaults; about 22 minutes for 4
slowdowns x 2 repetitions on 2 cores; ``--append`` adds another invocation's slowdowns to the same results file).

A Spark standalone cluster of 2 namespace hosts x 1 core (``cluster_harness.NetnsCluster``), every host link shaped
like ``bench_cluster.py``'s ``1gbit`` link (tbf 1 Gbit/s, + netem 0.1 ms when the kernel has it). Host 2 is then
slowed in one of these ways (``slowdown.py``), one at a time:

- ``none``: not slowed (the reference);
- ``cpu``: a CPU quota of ``--cpu-quota`` (default 50%) of one CPU on every process of host 2 -- its Spark worker
  daemon is moved into a child cgroup before the driver starts, so the application's executor and its Python
  workers are born in it (the run records which of host 2's processes were inside: all of them, or it says so);
- ``cpu-flap``: the same cgroup, its quota switched between unlimited and ``--flap-cpu-quota`` (default 20%) at
  seeded random times (slow 0.2-0.6 s, then normal 0.6-2 s): an intermittent straggler;
- ``link``: host 2's traffic with host 1 (both directions; the gradient messages) through an htb class whose rate
  flaps between 1 Gbit/s and ``--link-slow-rate`` (default 5 Mbit/s) on the same schedule. No netem in some kernels,
  so this is a rate, not a delay with jitter; a 5 Mbit/s phase delays a ~20-30 kB message by ~40 ms plus what
  queues behind it. The driver's traffic (network broadcast, results) stays at 1 Gbit/s.

With 2 hosts every host-to-host packet crosses both host links, so the ``link`` slowdown delays both workers'
messages alike; the ``cpu`` slowdowns make one worker slower than the other.

For each slowdown and ``k`` in sync (``SharedTrainingMaster()``, no ``max_staleness``), 0, 1, 4 (and on request
``sync-no-overlap``: the synchronous loop with ``overlap=False``; every other setting the default;
``collect_training_stats=True``): a fresh network (bench_cluster's MLP 784-2048-1024-10, Adam 1e-3, 2 workers
x 32 examples per step, same seed, same generated MNIST-like batch files) trained ``--epochs`` epochs, ONE
``fit_paths(epochs=1)`` call per epoch, test accuracy on the driver after each. Per epoch: the fit's wall time (call
to return: Spark job, broadcast, rendezvous, training, the end-of-fit average) and its *training* time (first
to last worker event in ``training_stats``: the part ``k`` can change); per worker: seconds in ``exchange`` (waiting
for peers and applying their messages), ``fit`` (compute + encode), ``data_wait``; the fit's ``sharing.max_lag_steps``,
``sharing.replica_divergence`` and ``sharing.messages_sent/applied``. Time to target = the cumulated training (and
wall) time up to the first epoch at ``--target`` test accuracy. This per-epoch form was chosen over
bench_cluster's "curve, then one timed fit" because it costs half the time and every epoch gives a number; its
price is one end-of-fit average (and one Spark job's overhead) per epoch, the same for every ``k``.

One driver process per (slowdown, repetition) trains every ``k`` in turn (the ``k`` order rotates between
repetitions), with a hard timeout. Results: ``benchmarks/results/straggler.json`` (written after every run, temp +
rename) and a markdown table on stdout (medians over repetitions, min-max in brackets). The cgroup, the tc changes
and the cluster are always undone (``finally``, atexit, SIGTERM). Without root / ``ip netns`` / a cgroup cpu
controller it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import bench_cluster as B  # noqa: E402

SLOWDOWNS = ("none", "cpu", "cpu-flap", "link")
KS = ("sync", "0", "1", "4")
#: the synchronous loop: "sync" with overlap=True (the default, one step stale), "sync-no-overlap" without
SYNC_KS = ("sync", "sync-no-overlap")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "straggler.json")


# ---------------------------------------------------------------------------------------------------- driver side
def make_master(k: str) -> Any:
    from torchspark.spark import SharedTrainingMaster

    return SharedTrainingMaster(
        batch_size_per_worker=B.BATCH_PER_WORKER,
        num_workers=2,
        rng_seed=B.SEED,
        collect_training_stats=True,
        max_staleness=None if k in SYNC_KS else int(k),
        overlap=k != "sync-no-overlap",
    )


def per_worker(stats: Any) -> tuple[dict[str, dict[str, float]], float]:
    """Per worker: seconds per phase and steps; and the training span (first to last worker event), seconds."""
    import numpy as np

    ev = stats.events()
    out: dict[str, dict[str, float]] = {}
    lo, hi = np.inf, -np.inf
    for wi, name in enumerate(ev.worker_names):
        if name == "driver":
            continue
        mask = ev.worker == wi
        if not mask.any():
            continue
        lo, hi = min(lo, float(ev.start[mask].min())), max(hi, float((ev.start[mask] + ev.duration[mask]).max()))
        row: dict[str, float] = {}
        for pi, phase in enumerate(ev.phase_names):
            sel = mask & (ev.phase == pi)
            if sel.any():
                row[phase] = float(ev.duration[sel].sum())
                if phase == "fit":
                    row["steps"] = int(sel.sum())
        out[name] = row
    return out, (hi - lo) if hi > lo else float("nan")


def _netns_inode(pid: int | None) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except (OSError, TypeError):
        return None


def _cpu_cgroup(pid: int | None) -> str | None:
    """The cgroup (v1 ``cpu`` hierarchy, else v2) process ``pid`` is in."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f]
    except (OSError, TypeError):
        return None
    v1 = [path for _, controllers, path in lines if "cpu" in controllers.split(",")]
    return v1[0] if v1 else next((path for hier, _, path in lines if hier == "0"), None)


class RankHosts:
    """Progress listener: which worker (rank) ran in the slowed host's network namespace, and in which cgroup
    (from the reporting process's id; the namespaces share one pid space)."""

    def __init__(self, slowed_netns: str | None) -> None:
        self.slowed = os.stat(f"/run/netns/{slowed_netns}").st_ino if slowed_netns else None
        self.on_slowed: dict[int, bool] = {}
        self.cgroups: dict[int, str | None] = {}

    def __call__(self, update: Any) -> None:
        if self.slowed is not None and update.rank not in self.on_slowed:
            inode = _netns_inode(update.pid)
            if inode is not None:
                self.on_slowed[update.rank] = inode == self.slowed
                self.cgroups[update.rank] = _cpu_cgroup(update.pid)

    def slowed_worker(self) -> str | None:
        return next((f"worker-{r}" for r, slow in sorted(self.on_slowed.items()) if slow), None)


def train_one(spark: Any, k: str, data: dict[str, Any], args: argparse.Namespace, test: Any) -> dict[str, Any]:
    from torchspark.spark import SparkNetwork

    net = B.make_network()
    snet = SparkNetwork(spark, net, make_master(k), progress=False)
    hosts = RankHosts(args.slowed_netns)
    snet.add_progress_listener(hosts)
    out: dict[str, Any] = {"k": k, "epochs": []}
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        if not B._fit_or_stop(snet, data["train"], 1, out):
            break
        wall = time.perf_counter() - t0
        acc = float(net.evaluate(test).accuracy())
        workers, span = per_worker(snet.training_stats)
        cfg = {
            key.split(".", 1)[1]: net.extra_config[key]
            for key in (
                "sharing.max_lag_steps",
                "sharing.replica_divergence",
                "sharing.messages_sent",
                "sharing.messages_applied",
            )
            if key in net.extra_config
        }
        out["epochs"].append(
            {
                "epoch": epoch,
                "wall_s": wall,
                "train_s": span,
                "accuracy": acc,
                "workers": workers,
                "worker_on_host2": hosts.slowed_worker(),
                "cgroups": {f"worker-{r}": c for r, c in sorted(hosts.cgroups.items())},
                **cfg,
            }
        )
        hosts.on_slowed.clear()
        hosts.cgroups.clear()
        C.log(
            f"k={k}: epoch {epoch} wall {wall:.1f}s train {span:.1f}s acc {acc:.4f} "
            + " ".join(f"{w}: exch {r.get('exchange', 0):.1f}s fit {r.get('fit', 0):.1f}s" for w, r in workers.items())
            + (f" lag {cfg.get('max_lag_steps')}" if cfg else "")
        )
    return out


def driver_main(args: argparse.Namespace) -> None:
    import torch
    from pyspark.sql import SparkSession

    from torchspark.data import load_batch
    from torchspark.spark import SparkNetwork

    torch.set_num_threads(1)
    data = json.loads(open(args.data).read())
    builder = SparkSession.builder.appName("torchspark-bench-straggler")
    for key, value in json.loads(os.environ["TORCHSPARK_CLUSTER_CONF"]).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    test = load_batch(data["test"])
    results: list[dict[str, Any]] = []

    def save() -> None:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, args.out)

    watchdog = threading.Timer(driver_limit_s(args), B._cancel, args=(spark,))
    watchdog.daemon = True
    watchdog.start()
    try:
        # executors, Python workers and torch start on the first fit: pay that before the first timed k
        t0 = time.perf_counter()
        SparkNetwork(spark, B.make_network(), make_master("sync"), progress=False).fit_paths(data["train"][:8])
        C.log(f"warm-up fit: {time.perf_counter() - t0:.1f}s")
        for k in args.ks.split(","):
            if B._STOPPED.is_set():
                break
            results.append(train_one(spark, k, data, args, test))
            save()
    finally:
        watchdog.cancel()
        spark.stop()


def driver_limit_s(args: argparse.Namespace) -> float:
    return len(args.ks.split(",")) * args.epochs * args.epoch_limit_s


# ---------------------------------------------------------------------------------------------------- slowdowns
class Slowdown:
    """Applies one slowdown to host 2 around a driver run; ``record()`` says what was done and checked."""

    def __init__(self, kind: str, cluster: Any, args: argparse.Namespace, seed: int) -> None:
        self.kind, self.cluster, self.args, self.seed = kind, cluster, args, seed
        self.host = cluster.hosts[-1]
        self.quota: Any = None
        self.shaper: Any = None
        self.flapper: Any = None
        self.seen: dict[str, Any] = {"processes_in_cgroup": [], "processes_outside": []}
        self._watch_stop = threading.Event()
        self._watch: threading.Thread | None = None

    def start(self) -> None:
        from slowdown import CpuQuota, Flapper, PeerLinkShaper, pids_in_netns

        a = self.args
        if self.kind in ("cpu", "cpu-flap"):
            self.quota = CpuQuota(a.cpu_quota if self.kind == "cpu" else None).start()
            # the worker daemon (and anything else on host 2) now; the executor is born in it when the driver starts
            self.quota.add(pids_in_netns(self.host.netns))
            self._watch = threading.Thread(target=self._watch_members, daemon=True)
            self._watch.start()
        if self.kind == "cpu-flap":
            q = self.quota
            self.flapper = Flapper(
                lambda: q.set_fraction(a.flap_cpu_quota),
                lambda: q.set_fraction(None),
                a.flap_slow_s,
                a.flap_fast_s,
                seed=self.seed,
            ).start()
        if self.kind == "link":
            self.shaper = PeerLinkShaper(self.cluster, self.host, base_rate=a.rate, peer_rate=a.rate).start()
            s = self.shaper
            self.flapper = Flapper(
                lambda: s.set_rate(a.link_slow_rate),
                lambda: s.set_rate(a.rate),
                a.flap_slow_s,
                a.flap_fast_s,
                seed=self.seed,
            ).start()

    def _watch_members(self) -> None:
        from slowdown import membership

        while not self._watch_stop.wait(2.0):
            try:
                m = membership(self.quota, self.host.netns)
            except Exception:  # noqa: BLE001 - the namespace may be going away
                continue
            if len(m["in"]) + len(m["out"]) > len(self.seen["processes_in_cgroup"]) + len(
                self.seen["processes_outside"]
            ):
                self.seen = {"processes_in_cgroup": m["in"], "processes_outside": m["out"]}

    def stop(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"slowdown": self.kind, "host": self.host.address}
        if self.flapper is not None:
            self.flapper.stop()
            rec.update(
                slow_fraction=self.flapper.slow_fraction(),
                switches=len(self.flapper.timeline),
                flap_errors=self.flapper.errors[:5],
            )
        if self.quota is not None:
            self._watch_stop.set()
            if self._watch is not None:
                self._watch.join(10)
            rec.update(
                self.seen,
                throttled_s=self.quota.throttled_s(),
                cgroup=self.quota.path,
                cgroup_version=self.quota.version,
            )
            self.quota.stop()
            rec["cgroup_removed"] = not self.quota.exists
        if self.shaper is not None:
            self.shaper.stop()
            B.shape(self.cluster, self.args.rate, self.args.delay)  # back to the common shaping
        return rec


# ---------------------------------------------------------------------------------------------------- orchestration
def unavailable(slowdowns: list[str]) -> str | None:
    from cluster_harness import unavailable_reason
    from slowdown import cgroup_unavailable_reason

    reason = unavailable_reason()
    if reason is None and any(s.startswith("cpu") for s in slowdowns):
        reason = cgroup_unavailable_reason()
    return reason


def save_results(doc: dict[str, Any], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)


def run_one(
    cluster: Any, slowdown: str, rep: int, ks: list[str], data_file: str, args: argparse.Namespace, workdir: str
) -> dict[str, Any]:
    out = os.path.join(workdir, f"{slowdown}-{rep}.json")
    argv = [
        os.path.abspath(__file__),
        "--role",
        "driver",
        "--data",
        data_file,
        "--out",
        out,
        "--ks",
        ",".join(ks),
        "--epochs",
        str(args.epochs),
        "--epoch-limit-s",
        str(args.epoch_limit_s),
        "--slowed-netns",
        cluster.hosts[-1].netns,
    ]
    slow = Slowdown(slowdown, cluster, args, seed=rep)
    record: dict[str, Any] = {"slowdown": slowdown, "rep": rep, "k_order": ks}
    t0 = time.perf_counter()
    cpu = C.CpuMeter()
    try:
        slow.start()
        with cpu:  # this process tree holds the cluster and the driver: the rest is other work on the machine
            cluster.run_driver(argv, timeout_s=driver_limit_s(args) + args.startup_s)
    except Exception as e:  # noqa: BLE001 - record it and go on
        record["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        C.log(f"{slowdown} rep {rep} failed: {record['error']}")
        print(str(e)[-3000:], file=sys.stderr)
    finally:
        record["applied"] = slow.stop()
    record["driver_wall_s"] = time.perf_counter() - t0
    record["foreign_cpu_cores"] = getattr(cpu, "foreign", None)
    record["load_after"] = C.load_average()
    record["runs"] = json.load(open(out)) if os.path.exists(out) else []
    return record


#: settings that must match for two invocations' records to be summarised together
_SAME = ("ks", "epochs", "n_train", "target", "rate", "delay")


def appended_to(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``--append``: the records of the results file so far, then this run's (same settings required)."""
    if not os.path.exists(args.out):
        return doc
    with open(args.out) as f:
        prior = json.load(f)
    differ = [k for k in _SAME if prior.get("args", {}).get(k) != getattr(args, k)]
    if differ:
        raise SystemExit(f"--append: {args.out} was measured with other {differ}; use the same settings or a new --out")
    earlier = prior.get("invocations", []) or [
        {k: prior.get(k) for k in ("started", "load_start", "load_end", "elapsed_s", "source")}
        | {"slowdowns": prior["args"]["slowdowns"]}
    ]
    return {**doc, "records": prior["records"], "invocations": earlier, "started": prior.get("started")}


def orchestrate(args: argparse.Namespace) -> None:
    from cluster_harness import NetnsCluster

    slowdowns = [s.strip() for s in args.slowdowns.split(",") if s.strip()]
    ks = [k.strip() for k in args.ks.split(",") if k.strip()]
    reason = unavailable(slowdowns)
    if reason is not None:
        print(f"straggler benchmark skipped: {reason} (needs root, `ip netns` and a cgroup cpu controller)")
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    watch = C.SourceWatch()
    doc: dict[str, Any] = {
        "args": vars(args),
        "machine": C.machine_info(),
        "load_start": C.load_average(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "records": [],
    }
    if args.append:
        doc = appended_to(doc, args)
    t_all = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="torchspark-bench-straggler-")
    os.chmod(workdir, 0o755)
    try:
        C.log(f"writing {args.n_train} training examples as minibatch files under {workdir}")
        data = B.prepare_data(os.path.join(workdir, "data"), args.n_train)
        data_file = os.path.join(workdir, "data.json")
        with open(data_file, "w") as f:
            json.dump(data, f)
        doc["data"] = {"n_train": data["n_train"], "n_test": data["n_test"], "files": len(data["train"])}
        with NetnsCluster(workers=2, cores=1, memory="2g", executor_memory="1g") as cluster:
            doc["link"] = B.shape(cluster, args.rate, args.delay)
            C.log(f"links shaped: {doc['link']}")
            try:
                for rep in range(args.reps):
                    order = slowdowns if rep % 2 == 0 else slowdowns[::-1]
                    k_order = ks[rep % len(ks) :] + ks[: rep % len(ks)]
                    for slowdown in order:
                        last = max((r["driver_wall_s"] for r in doc["records"]), default=0.0)
                        if time.perf_counter() - t_all + last > args.max_minutes * 60:
                            C.log(f"skipping rep {rep} {slowdown}: it would end past --max-minutes {args.max_minutes}")
                            doc.setdefault("skipped", []).append({"rep": rep, "slowdown": slowdown})
                            continue
                        C.log(f"rep {rep}: slowdown {slowdown}, k order {k_order}")
                        doc["records"].append(run_one(cluster, slowdown, rep, k_order, data_file, args, workdir))
                        if not args.no_write:
                            save_results(doc, args.out)
            finally:
                cluster.unshape_links()
        doc["elapsed_s"] = time.perf_counter() - t_all
        doc["load_end"] = C.load_average()
        doc["source"] = watch.note()
        if "invocations" in doc:
            doc["invocations"].append(
                {
                    "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(time.time() - doc["elapsed_s"])),
                    "load_start": doc["load_start"],
                    "load_end": doc["load_end"],
                    "elapsed_s": doc["elapsed_s"],
                    "source": doc["source"],
                    "slowdowns": args.slowdowns,
                }
            )
        doc["summary"] = summarise(doc, args)
        if not args.no_write:
            save_results(doc, args.out)
        print(report(doc, args))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- report
def _time_to_target(epochs: list[dict[str, Any]], target: float, key: str) -> float | None:
    total = 0.0
    for e in epochs:
        total += e[key]
        if e["accuracy"] >= target:
            return total
    return None


def _in_cgroup(rec: dict[str, Any], eps: list[dict[str, Any]]) -> str | None:
    """In how many epochs the host-2 worker's own process was in the quota's cgroup (CPU slowdowns only)."""
    if not rec["slowdown"].startswith("cpu"):
        return None
    want = "/" + os.path.basename(rec.get("applied", {}).get("cgroup", "?"))
    inside = sum(1 for e in eps if e.get("cgroups", {}).get(e.get("worker_on_host2") or "", "") == want)
    return f"{inside}/{len(eps)} epochs"


def summarise(doc: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per (slowdown, k): per-repetition values and their medians."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in doc["records"]:
        for run in rec["runs"]:
            eps = run["epochs"]
            if not eps:
                continue
            slowed = eps[0].get("worker_on_host2") if rec["slowdown"].startswith("cpu") else None
            if slowed and any(e.get("worker_on_host2") != slowed for e in eps):
                slowed = None  # ranks moved between hosts from one epoch's fit to the next: per-epoch split needed
            row = rows.setdefault((rec["slowdown"], run["k"]), {"slowdown": rec["slowdown"], "k": run["k"], "reps": []})
            workers = sorted({w for e in eps for w in e["workers"]})
            exch = {w: sum(e["workers"].get(w, {}).get("exchange", 0.0) for e in eps) for w in workers}
            if rec["slowdown"].startswith("cpu") and slowed is None:  # per epoch: the host-2 worker vs the other
                exch = {
                    "host2": sum(e["workers"].get(e.get("worker_on_host2"), {}).get("exchange", 0.0) for e in eps),
                    "host1": sum(
                        v.get("exchange", 0.0)
                        for e in eps
                        for w, v in e["workers"].items()
                        if w != e.get("worker_on_host2")
                    ),
                }
                slowed = "host2"
            fit = {w: sum(e["workers"].get(w, {}).get("fit", 0.0) for e in eps) for w in workers}
            stale = run["k"] not in SYNC_KS
            row["reps"].append(
                {
                    "rep": rec["rep"],
                    "epochs": len(eps),
                    "host2_worker_in_cgroup": _in_cgroup(rec, eps),
                    "train_s_per_epoch": sum(e["train_s"] for e in eps) / len(eps),
                    "wall_s_per_epoch": sum(e["wall_s"] for e in eps) / len(eps),
                    "train_s_to_target": _time_to_target(eps, args.target, "train_s"),
                    "wall_s_to_target": _time_to_target(eps, args.target, "wall_s"),
                    "epochs_to_target": next((e["epoch"] for e in eps if e["accuracy"] >= args.target), None),
                    "accuracy": [e["accuracy"] for e in eps],
                    "exchange_s": exch,
                    "fit_s": fit,
                    "slowed_worker": slowed,
                    "max_lag_steps": max((e.get("max_lag_steps", 0) for e in eps), default=None) if stale else None,
                    "replica_divergence": max((e.get("replica_divergence", 0.0) for e in eps), default=None)
                    if stale
                    else None,
                    "messages_sent": sum(e.get("messages_sent", 0) for e in eps) if stale else None,
                    "messages_applied": sum(e.get("messages_applied", 0) for e in eps) if stale else None,
                }
            )
    out = []
    for (s, k), row in sorted(rows.items(), key=lambda kv: (SLOWDOWNS.index(kv[0][0]), _k_order(kv[0][1]))):
        reps = row["reps"]
        for key in ("train_s_per_epoch", "wall_s_per_epoch", "train_s_to_target", "wall_s_to_target"):
            vals = [r[key] for r in reps if r[key] is not None]
            row[key] = C.median(vals) if vals else None
            row[key + "_range"] = C.spread(vals) if vals else "n/a"
        row["reached"] = sum(r["train_s_to_target"] is not None for r in reps)
        row["host2_worker_in_cgroup"] = [r.get("host2_worker_in_cgroup") for r in reps]
        row["final_accuracy"] = C.median([r["accuracy"][-1] for r in reps])
        row["exchange_slowed_s"] = (
            C.median([r["exchange_s"].get(r["slowed_worker"], float("nan")) for r in reps if r["slowed_worker"]])
            if s.startswith("cpu")
            else None
        )
        row["exchange_other_s"] = (
            C.median([v for r in reps for w, v in r["exchange_s"].items() if w != r["slowed_worker"]])
            if s.startswith("cpu")
            else None
        )
        row["exchange_mean_s"] = C.median([sum(r["exchange_s"].values()) / max(1, len(r["exchange_s"])) for r in reps])
        if k not in SYNC_KS:
            row["max_lag_steps"] = max(r["max_lag_steps"] or 0 for r in reps)
            row["replica_divergence"] = max(r["replica_divergence"] or 0.0 for r in reps)
            row["messages"] = f"{reps[0]['messages_sent']}/{reps[0]['messages_applied']}"
        out.append(row)
    return out


def _k_order(k: str) -> tuple[int, int]:
    return (0, SYNC_KS.index(k)) if k in SYNC_KS else (1, int(k))


def report(doc: dict[str, Any], args: argparse.Namespace) -> str:
    def cell(row: dict[str, Any], key: str, digits: int = 1) -> str:
        v = row.get(key)
        return "-" if v is None or v != v else f"{v:.{digits}f} [{row.get(key + '_range', '')}]"

    headers = [
        "slowdown of host 2",
        "k",
        "train s/epoch",
        "wall s/epoch",
        f"train s to {args.target:.0%}",
        "reached",
        "test acc per epoch",
        "in exchange, s per worker over all epochs: host 2 / host 1 (mean)",
        "max lag",
        "replica div",
        "msgs sent/applied (rep 1)",
    ]
    rows = []
    for r in doc["summary"]:
        exch = (
            f"{C.fmt(r['exchange_slowed_s'])} / {C.fmt(r['exchange_other_s'])}"
            if r["exchange_slowed_s"] is not None
            else f"({C.fmt(r['exchange_mean_s'])})"
        )
        n_ep = min(len(x["accuracy"]) for x in r["reps"])
        curve = " ".join(f"{C.median([x['accuracy'][i] for x in r['reps']]):.2f}" for i in range(n_ep))
        rows.append(
            [
                r["slowdown"],
                r["k"],
                cell(r, "train_s_per_epoch"),
                cell(r, "wall_s_per_epoch"),
                cell(r, "train_s_to_target"),
                f"{r['reached']}/{len(r['reps'])}",
                curve,
                exch,
                r.get("max_lag_steps", "-"),
                f"{r['replica_divergence']:.1e}" if r["k"] not in SYNC_KS else "-",
                r.get("messages", "-"),
            ]
        )
    applied = {}
    for rec in doc["records"]:
        a = rec.get("applied", {})
        if rec["slowdown"] != "none":
            applied.setdefault(rec["slowdown"], []).append(
                {
                    "foreign_cpu_cores": round(rec.get("foreign_cpu_cores") or 0, 2),
                    "host2_worker_in_cgroup": [_in_cgroup(rec, run["epochs"]) for run in rec["runs"]],
                    **{
                        k: a.get(k)
                        for k in (
                            "processes_in_cgroup",
                            "processes_outside",
                            "throttled_s",
                            "cgroup_removed",
                            "slow_fraction",
                            "switches",
                        )
                        if k in a
                    },
                }
            )
    lines = [
        f"## Stragglers: bounded staleness on a 2-host namespace cluster ({doc.get('started')})\n",
        f"Link: {doc.get('link')}. {args.epochs} epochs of {doc['data']['n_train']} examples "
        f"(2 workers x {B.BATCH_PER_WORKER}), one fit per epoch; medians over {args.reps} repetitions "
        f"[min-max]. "
        + (
            "; ".join(
                f"Run of {i['slowdowns']} from {i['started']}: load average {i['load_start']} "
                f"-> {i['load_end']}, {i['elapsed_s'] / 60:.1f} min. {i['source']}"
                for i in doc["invocations"]
            )
            if doc.get("invocations")
            else f"Load average start {doc['load_start']}, end {doc.get('load_end')}. Run time "
            f"{doc.get('elapsed_s', 0) / 60:.1f} min. {doc.get('source', '')}"
        )
        + "\n",
        C.markdown_table(headers, rows),
        "\nSlowdowns as applied (per repetition): " + json.dumps(applied),
    ]
    errors = [f"- {r['slowdown']} rep {r['rep']}: {r['error']}" for r in doc["records"] if r.get("error")]
    errors += [f"- {s['slowdown']} rep {s['rep']}: not run (time limit)" for s in doc.get("skipped", [])]
    if errors:
        lines.append("\nErrors:\n" + "\n".join(errors))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slowdowns", default="none,cpu,cpu-flap,link", help=f"subset of {', '.join(SLOWDOWNS)}")
    p.add_argument(
        "--ks",
        default=",".join(KS),
        help="comma-separated: sync, sync-no-overlap (overlap=False) and/or max_staleness values",
    )
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--n-train", type=int, default=4096)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--rate", default="1gbit", help="every host link's rate")
    p.add_argument("--delay", default="0.1ms", help="every host link's netem delay (dropped without netem)")
    p.add_argument("--cpu-quota", type=float, default=0.5, help="cpu: host 2's share of one CPU")
    p.add_argument("--flap-cpu-quota", type=float, default=0.2, help="cpu-flap: host 2's share while slow")
    p.add_argument("--link-slow-rate", default="5mbit", help="link: host-to-host rate while slow")
    p.add_argument("--flap-slow-s", default="0.2,0.6", help="flapping: slow phase length range, s")
    p.add_argument("--flap-fast-s", default="0.6,2.0", help="flapping: normal phase length range, s")
    p.add_argument("--epoch-limit-s", type=float, default=90.0, help="hard limit per epoch (driver timeout)")
    p.add_argument("--startup-s", type=float, default=180.0, help="driver start-up allowance")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=25.0,
        help="start no driver that would (judging by the previous one) end after this many minutes",
    )
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results JSON")
    p.add_argument(
        "--append",
        action="store_true",
        help="add this run's records to the --out file's (same ks, epochs, n-train, target, link)",
    )
    p.add_argument("--role", default="orchestrator", choices=["orchestrator", "driver"], help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--slowed-netns", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [s for s in args.slowdowns.split(",") if s.strip() and s.strip() not in SLOWDOWNS]
    bad += [k for k in args.ks.split(",") if k.strip() and k.strip() not in SYNC_KS and not k.strip().isdigit()]
    if bad:
        p.error(
            f"unknown slowdowns/ks {bad}; slowdowns: {list(SLOWDOWNS)}, ks: 'sync', 'sync-no-overlap' or integers >= 0"
        )
    for name in ("flap_slow_s", "flap_fast_s"):
        lo, hi = (float(x) for x in getattr(args, name).split(","))
        setattr(args, name, (lo, hi))
    if not 0 < args.cpu_quota <= 1 or not 0 < args.flap_cpu_quota <= 1:
        p.error("--cpu-quota and --flap-cpu-quota are shares of one CPU in (0, 1]")
    if args.reps < 1 or args.epochs < 1:
        p.error("--reps and --epochs must be >= 1")
    return args


def main() -> None:
    B.run_role(parse_args(), driver_main, orchestrate)


if __name__ == "__main__":
    main()
