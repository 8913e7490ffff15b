"""Time to a target test accuracy on a shaped multi-host cluster: gradient sharing vs parameter averaging vs DDP.

Run (root, ``ip netns``): ``.venv/bin/python benchmarks/bench_cluster.py [--quick] [--links 100mbit,1gbit]
[--methods sharing,avg5,avg1,ddp] [--budget-s 240] [--target 0.9] [--workload mlp|transformer] [--no-write]``

A Spark standalone cluster of 2 namespace hosts x 1 core (``cluster_harness.NetnsCluster``), every host link shaped
with ``tc`` (netem delay, then tbf rate; both directions) to

- ``1gbit``: 1 Gbit/s + 0.1 ms delay,
- ``100mbit``: 100 Mbit/s + 0.5 ms delay.

The same network (MLP 784-2048-1024-10, 3.7 M parameters, Adam lr 1e-3), the same data and the same 2 workers x 32
examples per step for every method:

- ``sharing``: ``SharedTrainingMaster()`` with default settings (calibrated start threshold);
- ``avg5`` / ``avg1``: ``ParameterAveragingTrainingMaster(averaging_frequency=5 / 1)`` (default ``save_updater``);
- ``ddp``: ``pyspark.ml.torch.distributor.TorchDistributor(num_processes=2, local_mode=False)`` running
  ``DistributedDataParallel`` over gloo (``gradient_as_bucket_view=True``, fused ``torch.optim.Adam``), its best
  CPU settings; gloo needs ``GLOO_SOCKET_IFNAME`` there (the hosts' names resolve to loopback), passed with
  ``spark.executorEnv``. torchspark finds the interface itself.

``--workload transformer`` trains the zoo's ``text_transformer`` instead (6.2 M parameters, 5.1 M of them the
20,000 x 256 token embedding, whose gradient is mostly zero rows in a step: the sparse update threshold encoding
sends cheaply) on ``datasets.synthetic_keywords`` (64 tokens, 4 classes; the test set: 1,024 more examples of the
same task), and writes the section ``cluster_transformer``.

Data of the MLP (generated, no download): "MNIST-like" digits, scikit-learn's 8x8 digits upscaled to 20x20 and placed at a
random offset (+-3 px) in a 28x28 frame with pixel noise (8,192 training examples drawn from the 1,437 training
digits; the 360 test digits, same transform, are the test set). Written once as minibatch files of 32 on a
directory every host sees; every method reads the same files (torchspark: ``fit_paths``; DDP: rank r takes files
r, r+2, ...).

Time to target, per method and link:

- torchspark: first the accuracy curve (one ``fit_paths(paths, epochs=1)`` per epoch, test accuracy on the driver
  after each, until the target or the time budget), which gives the epochs E needed; then a fresh network trained
  with one ``fit_paths(paths, epochs=E)`` call, timed from the call to its return (one launch, like DDP) -- that
  is the time to target. Its accuracy is checked again (training is deterministic for a seed, so it matches).
- DDP: one ``TorchDistributor.run``; rank 0 evaluates after every epoch (the ranks wait, the clock is paused) and
  the time to target is launch (driver call to the training function's start) + setup (process group, DDP) +
  training time up to the first epoch at the target.

Bytes on the wire come from the kernel's veth counters (``/sys/class/net/<veth>/statistics``), sampled every 0.1 s
by the driver process: every packet is counted once, at its sender (bytes the hosts send into the bridge = rx on
the root-side veths, plus what the driver/master send = tx of the bridge). "Between workers" is the host-to-host
part (host-sent minus what the root namespace received). Spark's own traffic (task launch, network broadcast and
results) is included: it is part of what a fit costs.

Every method runs as its own driver process (its own SparkContext) with a hard timeout; the cluster is always torn
down (``with`` block, atexit, SIGTERM). Without root or ``ip netns`` the script writes a "skipped" section and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from _workloads import WORKLOADS, zoo_module  # noqa: E402

LR = 1e-3
BATCH_PER_WORKER = 32
HIDDEN = [2048, 1024]
SEED = 0
#: link name -> (tc rate, netem delay)
LINKS = {"1gbit": ("1gbit", "0.1ms"), "100mbit": ("100mbit", "0.5ms")}
LINK_BITS = {"1gbit": 1e9, "100mbit": 1e8}
METHODS = ("sharing", "avg5", "avg1", "ddp")
METHOD_TITLES = {
    "sharing": "gradient sharing (SharedTrainingMaster, defaults)",
    "avg5": "parameter averaging, averaging_frequency=5",
    "avg1": "parameter averaging, averaging_frequency=1",
    "ddp": "TorchDistributor + DDP (gloo, fused Adam)",
}
#: targets: DDP time to target / sharing time to target, per link
TARGET_SPEEDUP = {"100mbit": 3.0, "1gbit": 1.5}
#: --workload -> the zoo model every method trains (the MLP: the network this benchmark was written for)
WORKLOAD_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mlp": ("mlp", {"n_in": 784, "hidden": HIDDEN, "n_out": 10}),
    "transformer": (WORKLOADS["transformer"].model, WORKLOADS["transformer"].kwargs),
}
#: test examples of the transformer workload (the MLP's test set: the 360 test digits)
N_TEST_KEYWORDS = 1024


# ---------------------------------------------------------------------------------------------------- data
def mnist_like(split: str, n: int | None, seed: int) -> Any:
    """Digits upscaled to 20x20 at a random +-3 px offset in a 28x28 frame, plus noise; ``(n, 784)`` float32.

    ``n=None`` takes every digit of the split once (the test set); otherwise ``n`` digits drawn with replacement.
    """
    import torch
    import torch.nn.functional as F

    from torchspark import datasets
    from torchspark.data import DataSet

    base = datasets.digits(split)
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(len(base)) if n is None else torch.randint(0, len(base), (n,), generator=g)
    count = len(idx)
    small = F.interpolate(base.features[idx], size=(20, 20), mode="bilinear", align_corners=False)  # (n,1,20,20)
    frame = torch.zeros(count, 1, 28, 28)
    ox = torch.randint(1, 8, (count,), generator=g)
    oy = torch.randint(1, 8, (count,), generator=g)
    for i in range(count):
        frame[i, :, oy[i] : oy[i] + 20, ox[i] : ox[i] + 20] = small[i]
    frame = (frame + 0.1 * torch.randn(frame.shape, generator=g)).clamp_(0.0, 1.0)
    return DataSet(frame.reshape(count, 784).contiguous(), base.labels[idx].clone())


def prepare_data(directory: str, n_train: int, workload: str = "mlp") -> dict[str, Any]:
    """Write the training minibatch files and the test set; returns their paths."""
    from torchspark.data import save_batches

    if workload == "mlp":
        train, test = mnist_like("train", n_train, SEED), mnist_like("test", None, SEED + 1)
    else:
        train, test = WORKLOADS[workload].split(n_train, N_TEST_KEYWORDS, SEED)
    paths = save_batches(train.split(BATCH_PER_WORKER), os.path.join(directory, "train"))
    test_path = save_batches([test], os.path.join(directory, "test"), prefix="test")[0]
    for root, dirs, files in os.walk(directory):  # executors may run as another user
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return {"train": paths, "test": test_path, "n_train": n_train, "n_test": len(test)}


# ---------------------------------------------------------------------------------------------------- wire bytes
class LinkSampler:
    """Samples the veth/bridge byte counters every ``interval_s`` on a thread: ``[(time.time(), counters)]``."""

    def __init__(self, host_veths: list[str], bridge: str, interval_s: float = 0.1) -> None:
        self.host_veths, self.bridge, self.interval_s = host_veths, bridge, interval_s
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-sampler", daemon=True)

    @staticmethod
    def _read(dev: str, what: str) -> int:
        with open(f"/sys/class/net/{dev}/statistics/{what}_bytes") as f:
            return int(f.read())

    def read(self) -> dict[str, int]:
        """``hosts_sent``: bytes the hosts sent (rx of the root-side veths); ``root_sent`` / ``root_received``: the
        bridge's tx / rx (driver and master traffic)."""
        return {
            "hosts_sent": sum(self._read(v, "rx") for v in self.host_veths),
            "root_sent": self._read(self.bridge, "tx"),
            "root_received": self._read(self.bridge, "rx"),
        }

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.read()))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> LinkSampler:
        self.samples.append((time.time(), self.read()))
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        self.samples.append((time.time(), self.read()))

    def at(self, t: float) -> dict[str, int]:
        """The first sample taken at or after ``t`` (the last one if none)."""
        for ts, counters in self.samples:
            if ts >= t:
                return counters
        return self.samples[-1][1]

    def between(self, t0: float, t1: float) -> dict[str, int]:
        """Wire bytes from ``t0`` to ``t1``: ``wire`` (every packet once, at its sender) and ``between_workers``."""
        a, b = self.at(t0), self.at(t1)
        d = {k: b[k] - a[k] for k in a}
        return {"wire": d["hosts_sent"] + d["root_sent"], "between_workers": d["hosts_sent"] - d["root_received"]}


# ---------------------------------------------------------------------------------------------------- methods
def make_network(workload: str = "mlp") -> Any:
    import torchspark as ts
    from torchspark import optim

    module = zoo_module(*WORKLOAD_MODELS[workload])
    return ts.Network(module, loss="cross_entropy", updater=optim.Adam(lr=LR), seed=SEED)


def make_master(method: str) -> Any:
    from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster

    common = dict(batch_size_per_worker=BATCH_PER_WORKER, num_workers=2, rng_seed=SEED)
    if method == "sharing":
        return SharedTrainingMaster(**common)
    return ParameterAveragingTrainingMaster(averaging_frequency={"avg5": 5, "avg1": 1}[method], **common)


def run_torchspark(
    spark: Any, method: str, data: dict[str, Any], args: argparse.Namespace, sampler: LinkSampler, save: Any
) -> dict[str, Any]:
    from torchspark.data import load_batch
    from torchspark.spark import SparkNetwork

    test = load_batch(data["test"])
    out: dict[str, Any] = {"method": method, "curve": [], "reached": False}
    # 1. the accuracy curve, one fit per epoch, within the budget
    net = make_network(args.workload)
    snet = SparkNetwork(spark, net, make_master(method), progress=False)
    spent = 0.0
    for epoch in range(1, args.max_epochs + 1):
        t0 = time.time()
        if not _fit_or_stop(snet, data["train"], 1, out):
            break
        t1 = time.time()
        spent += t1 - t0
        acc = float(net.evaluate(test).accuracy())
        out["curve"].append({"epoch": epoch, "fit_s": t1 - t0, "accuracy": acc, **sampler.between(t0, t1)})
        C.log(f"{method}: epoch {epoch} fit {t1 - t0:.1f}s acc {acc:.4f}")
        save(out)
        if acc >= args.target:
            out["reached"], out["epochs_to_target"] = True, epoch
            break
        if spent >= args.budget_s:
            break
    out["final_accuracy"] = out["curve"][-1]["accuracy"] if out["curve"] else None
    if not out["reached"]:
        return out
    # 2. the time to target: a fresh network, one fit call of that many epochs
    net = make_network(args.workload)
    snet = SparkNetwork(spark, net, make_master(method), progress=False)
    t0 = time.time()
    if not _fit_or_stop(snet, data["train"], out["epochs_to_target"], out):
        return out
    t1 = time.time()
    acc = float(net.evaluate(test).accuracy())
    out.update(
        time_to_target_s=t1 - t0,
        target_run_accuracy=acc,
        **{f"{k}_to_target": v for k, v in sampler.between(t0, t1).items()},
    )
    if "sharing.bytes_sent" in net.extra_config:
        out["sharing_payload_bytes"] = int(net.extra_config["sharing.bytes_sent"])
        out["sharing_dense_bytes"] = int(net.extra_config["sharing.dense_bytes"])
        out["start_threshold"] = net.extra_config.get("sharing.start_threshold")
    C.log(f"{method}: {out['epochs_to_target']} epochs in one fit: {t1 - t0:.1f}s, acc {acc:.4f}")
    return out


def _fit_or_stop(snet: Any, paths: list[str], epochs: int, out: dict[str, Any]) -> bool:
    """``fit_paths``; False (and ``out["stopped"]`` set) when the hard limit cancelled it."""
    try:
        snet.fit_paths(paths, epochs=epochs)
        return True
    except Exception as e:  # noqa: BLE001 - a cancelled job surfaces as whatever the fit maps it to
        if not _STOPPED.is_set():
            raise
        out["stopped"] = f"hard time limit: a {epochs}-epoch fit was cancelled ({type(e).__name__})"
        return False


def _ddp_train(
    paths: list[str],
    test_path: str,
    target: float,
    budget_s: float,
    max_epochs: int,
    lr: float,
    seed: int,
    model: tuple[str, dict[str, Any]],
    flush: bool = True,
) -> dict[str, Any]:
    """The TorchDistributor training function (runs under torchrun on the hosts; pickled by value); ``model``: the
    zoo name and arguments of the network (:data:`WORKLOAD_MODELS`)."""
    import time as _time

    import torch as _torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from torchspark import models as _models
    from torchspark.data import load_batch

    start_wall = _time.time()
    t0 = _time.perf_counter()
    _torch.set_num_threads(1)
    _torch.set_flush_denormal(flush)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    _torch.manual_seed(seed)
    module = _models.ZOO[model[0]](**model[1])
    ddp = DistributedDataParallel(module, gradient_as_bucket_view=True)
    opt = _torch.optim.Adam(ddp.parameters(), lr=lr, fused=True)
    batches = [load_batch(p) for p in paths[rank::world]]
    test = load_batch(test_path) if rank == 0 else None
    dist.barrier()
    setup_s = _time.perf_counter() - t0
    train_s, epochs = 0.0, []
    for epoch in range(1, max_epochs + 1):
        module.train()
        te = _time.perf_counter()
        for b in batches:
            opt.zero_grad(set_to_none=True)
            _torch.nn.functional.cross_entropy(ddp(b.features), b.labels).backward()
            opt.step()
        dist.barrier()
        train_s += _time.perf_counter() - te
        end_wall = _time.time()
        acc = 0.0
        if test is not None:
            module.eval()
            with _torch.no_grad():
                acc = float((module(test.features).argmax(1) == test.labels).float().mean())
        stop = _torch.tensor([1 if (acc >= target or setup_s + train_s >= budget_s) else 0])
        dist.broadcast(stop, 0)
        epochs.append({"epoch": epoch, "train_s": train_s, "end_wall": end_wall, "accuracy": acc})
        if int(stop[0]):
            break
    dist.destroy_process_group()
    return {"rank": rank, "start_wall": start_wall, "setup_s": setup_s, "epochs": epochs}


def run_ddp(
    spark: Any, data: dict[str, Any], args: argparse.Namespace, sampler: LinkSampler, save: Any
) -> dict[str, Any]:
    import contextlib

    from pyspark.ml.torch.distributor import TorchDistributor

    distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    t_call = time.time()
    try:
        # TorchDistributor copies the ranks' output to stdout: keep it in a log next to the results
        with open(args.out + ".ranks.log", "w") as ranks_log, contextlib.redirect_stdout(ranks_log):
            res = distributor.run(
                _ddp_train,
                data["train"],
                data["test"],
                args.target,
                args.budget_s,
                args.max_epochs,
                LR,
                SEED,
                WORKLOAD_MODELS[args.workload],
            )
    except Exception as e:  # noqa: BLE001
        if not _STOPPED.is_set():
            raise
        return {
            "method": "ddp",
            "curve": [],
            "reached": False,
            "final_accuracy": None,
            "stopped": f"hard time limit: the DDP run was cancelled ({type(e).__name__})",
        }
    t_done = time.time()
    launch_s = res["start_wall"] - t_call
    out: dict[str, Any] = {
        "method": "ddp",
        "curve": [],
        "reached": False,
        "launch_s": launch_s,
        "setup_s": res["setup_s"],
        "run_wall_s": t_done - t_call,
    }
    prev_train, prev_end = 0.0, t_call
    for e in res["epochs"]:
        out["curve"].append(
            {
                "epoch": e["epoch"],
                "fit_s": e["train_s"] - prev_train,
                "accuracy": e["accuracy"],
                **sampler.between(prev_end, e["end_wall"]),
            }
        )
        prev_train, prev_end = e["train_s"], e["end_wall"]
        if e["accuracy"] >= args.target and not out["reached"]:
            out.update(
                reached=True,
                epochs_to_target=e["epoch"],
                target_run_accuracy=e["accuracy"],
                time_to_target_s=launch_s + res["setup_s"] + e["train_s"],
                **{f"{k}_to_target": v for k, v in sampler.between(t_call, e["end_wall"]).items()},
            )
    out["final_accuracy"] = res["epochs"][-1]["accuracy"] if res["epochs"] else float("nan")
    save(out)
    return out


def driver_main(args: argparse.Namespace) -> None:
    """One method on the cluster, as its own driver process (settings in ``TORCHSPARK_CLUSTER_CONF``)."""
    import torch
    from pyspark.sql import SparkSession

    torch.set_num_threads(1)
    data = json.loads(open(args.data).read())
    builder = SparkSession.builder.appName(f"torchspark-bench-cluster-{args.method}")
    for key, value in json.loads(os.environ["TORCHSPARK_CLUSTER_CONF"]).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()

    def save(result: dict[str, Any]) -> None:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.out)

    # the hard limit: cancel whatever Spark job runs (a fit, the DDP barrier stage) and keep the partial results
    watchdog = threading.Timer(hard_limit_s(args), _cancel, args=(spark,))
    watchdog.daemon = True
    watchdog.start()
    try:
        with LinkSampler(args.veths.split(","), args.bridge) as sampler:
            if args.method == "ddp":
                result = run_ddp(spark, data, args, sampler, save)
            else:
                result = run_torchspark(spark, args.method, data, args, sampler, save)
        save(result)
    finally:
        watchdog.cancel()
        spark.stop()


_STOPPED = threading.Event()


def _cancel(spark: Any) -> None:
    _STOPPED.set()
    C.log("hard time limit reached: cancelling the running Spark jobs")
    spark.sparkContext.cancelAllJobs()


def hard_limit_s(args: argparse.Namespace) -> float:
    """Per method: the accuracy curve stops starting epochs after ``budget_s``; the curve plus the timed one-call
    run may take up to twice that plus one slow epoch; past this limit the running job is cancelled."""
    return 2.5 * args.budget_s + 60.0


# ---------------------------------------------------------------------------------------------------- orchestration
def run_method(
    cluster: Any, method: str, link: str, data_file: str, args: argparse.Namespace, workdir: str
) -> dict[str, Any]:
    out = os.path.join(workdir, f"{link}-{method}.json")
    argv = [
        os.path.abspath(__file__),
        "--role",
        "driver",
        "--method",
        method,
        "--data",
        data_file,
        "--out",
        out,
        "--target",
        str(args.target),
        "--budget-s",
        str(args.budget_s),
        "--max-epochs",
        str(args.max_epochs),
        "--workload",
        args.workload,
        "--veths",
        ",".join(h.root_veth for h in cluster.hosts),
        "--bridge",
        cluster.bridge,
    ]
    extra = {}
    if method == "ddp":  # the namespace hostnames resolve to loopback: gloo must be told the interface
        extra["spark.executorEnv.GLOO_SOCKET_IFNAME"] = cluster.hosts[0].interface
    timeout = hard_limit_s(args) + args.startup_s
    t0 = time.perf_counter()
    error = None
    try:
        cluster.run_driver(argv, timeout_s=timeout, **extra)
    except Exception as e:  # noqa: BLE001 - record it and go on with the next method
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if "TimeoutExpired" in type(e).__name__:
            error = f"driver killed after {timeout:.0f} s (budget {args.budget_s:.0f} s)"
        C.log(f"{link} {method} failed: {error}")
        print(str(e)[-3000:], file=sys.stderr)
        for stream in (getattr(e, "stdout", None), getattr(e, "stderr", None)):  # a timeout's captured output
            if stream:
                text = stream.decode(errors="replace") if isinstance(stream, bytes) else stream
                print("\n".join(line for line in text.splitlines() if "WARN" not in line)[-4000:], file=sys.stderr)
    result: dict[str, Any] = {"method": method, "curve": [], "reached": False}
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
    result["link"] = link
    result["driver_wall_s"] = time.perf_counter() - t0
    if error:
        result["error"] = error
    return result


def orchestrate(args: argparse.Namespace) -> None:
    from cluster_harness import NetnsCluster, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        C.log(f"cluster benchmark skipped: {reason}")
        if not args.no_write:
            C.write_section(
                section_name(args),
                f"## Cluster: time to accuracy on shaped links\n\n_Skipped: {reason} (needs root and `ip netns`)._\n",
                {"skipped": reason, "targets": []},
            )
        return
    # SIGTERM (e.g. a timeout of the caller) must still tear the cluster down: turn it into SystemExit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    watch = C.SourceWatch()
    info = C.machine_info()
    links = [x.strip() for x in args.links.split(",") if x.strip()]
    methods = [x.strip() for x in args.methods.split(",") if x.strip()]
    results: dict[str, dict[str, dict[str, Any]]] = {link: {} for link in links}
    t_all = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="torchspark-bench-cluster-")
    os.chmod(workdir, 0o755)
    try:  # the generated data set is removed however the run ends
        C.log(f"writing {args.n_train} training examples as minibatch files under {workdir}")
        data = prepare_data(os.path.join(workdir, "data"), args.n_train, args.workload)
        data_file = os.path.join(workdir, "data.json")
        with open(data_file, "w") as f:
            json.dump(data, f)
        cluster_info: dict[str, Any] = {}
        link_settings: dict[str, str] = {}
        with NetnsCluster(workers=2, cores=1, memory="2g", executor_memory="1g") as cluster:
            cluster_info = {"master": cluster.master_url, "hosts": [h.address for h in cluster.hosts]}
            for link in links:
                rate, delay = LINKS[link]
                link_settings[link] = shape(cluster, rate, delay)
                C.log(f"links shaped: {link_settings[link]}")
                try:
                    for method in methods:
                        C.log(f"{link}: {method}")
                        results[link][method] = run_method(cluster, method, link, data_file, args, workdir)
                        summarise_one(results[link][method])
                finally:
                    cluster.unshape_links()
        elapsed = time.perf_counter() - t_all
        report(results, links, methods, data, args, info, cluster_info, link_settings, elapsed, watch.note())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def shape(cluster: Any, rate: str, delay: str) -> str:
    """Shape every host link to ``rate`` + ``delay``; rate only when the kernel has no netem. Returns what was set."""
    from cluster_harness import netem_available

    if netem_available():
        cluster.shape_links(rate, delay)
        return f"tbf {rate} + netem delay {delay} (each direction of every host link)"
    cluster.shape_links(rate, None)
    return (
        f"tbf {rate} (each direction of every host link); the {delay} delay is NOT applied: this kernel has no "
        "netem qdisc (sch_netem)"
    )


def summarise_one(r: dict[str, Any]) -> None:
    if r.get("reached"):
        C.log(
            f"  {r['link']} {r['method']}: target in {r['epochs_to_target']} epochs, "
            f"{r['time_to_target_s']:.1f} s, {r.get('wire_to_target', 0) / 1e6:.1f} MB on the wire"
        )
    else:
        C.log(
            f"  {r['link']} {r['method']}: target not reached (final accuracy {C.fmt(r.get('final_accuracy'), 4)}) "
            f"{r.get('error', r.get('stopped', ''))}"
        )


# ---------------------------------------------------------------------------------------------------- report
def _fit_line(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float] | None:
    """``T = c + w / bandwidth`` through two (bandwidth, time) points: (c seconds, w bits)."""
    (bw1, t1), (bw2, t2) = a, b
    if bw1 == bw2:
        return None
    w = (t1 - t2) / (1 / bw1 - 1 / bw2)
    return t1 - w / bw1, w


def crossover(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Where DDP would catch up with sharing, from ``T = c + w / bandwidth`` fitted to the two links."""
    pts: dict[str, list[tuple[float, float]]] = {}
    for link, by_method in results.items():
        for m in ("sharing", "ddp"):
            r = by_method.get(m, {})
            if r.get("reached") and link in LINK_BITS:
                pts.setdefault(m, []).append((LINK_BITS[link], r["time_to_target_s"]))
    if len(pts.get("sharing", [])) < 2 or len(pts.get("ddp", [])) < 2:
        return "Crossover: not estimated (needs sharing and DDP to reach the target on both links)."
    fs, fd = _fit_line(*pts["sharing"][:2]), _fit_line(*pts["ddp"][:2])
    if fs is None or fd is None:
        return "Crossover: not estimated."
    (cs, ws), (cd, wd) = fs, fd
    text = (
        f"Crossover, from `T = c + w / bandwidth` fitted to the two links: sharing c = {cs:.1f} s, "
        f"w = {max(ws, 0) / 1e9:.2f} Gbit; DDP c = {cd:.1f} s, w = {max(wd, 0) / 1e9:.2f} Gbit. "
    )
    if cs >= cd and wd > ws:
        bw = (wd - ws) / (cs - cd) if cs > cd else math.inf
        text += (
            f"DDP's time to target equals sharing's at about **{bw / 1e9:.1f} Gbit/s** (per host link, this "
            "machine's compute); below that gradient sharing reaches the accuracy sooner."
        )
    elif cs < cd and ws <= wd:
        text += "Sharing is ahead at every bandwidth on this model (even its bandwidth-free part is smaller)."
    else:
        text += "The fitted lines do not cross at a positive bandwidth in the way the model expects; see the table."
    return text


def report(
    results: dict[str, dict[str, dict[str, Any]]],
    links: list[str],
    methods: list[str],
    data: dict[str, Any],
    args: argparse.Namespace,
    info: dict[str, str],
    cluster_info: dict[str, Any],
    link_settings: dict[str, str],
    elapsed: float,
    source_note: str,
) -> None:
    headers = [
        "link",
        "method",
        "reached",
        "epochs",
        "time to target s",
        "x faster than DDP",
        "wire MB to target",
        "between workers MB",
        "s per epoch (curve)",
        "accuracy at the end",
    ]
    rows, targets, verdicts = [], [], []
    for link in links:
        ddp = results[link].get("ddp", {})
        for m in methods:
            r = results[link].get(m, {})
            reached = r.get("reached", False)
            tt = r.get("time_to_target_s") if reached else None
            speed = (ddp["time_to_target_s"] / tt) if (tt and ddp.get("reached")) else None
            curve = r.get("curve", [])
            per_epoch = sum(c["fit_s"] for c in curve) / len(curve) if curve else None
            status = (
                "yes"
                if reached
                else ("error" if r.get("error") else ("no (time limit)" if r.get("stopped") else "no (budget)"))
            )
            rows.append(
                [
                    LINKS[link][0] + " + " + LINKS[link][1],
                    METHOD_TITLES.get(m, m),
                    status,
                    r.get("epochs_to_target", len(curve)),
                    tt,
                    "-" if m == "ddp" else (f"{speed:.2f}x" if speed else "-"),
                    r["wire_to_target"] / 1e6 if reached else None,
                    r["between_workers_to_target"] / 1e6 if reached else None,
                    per_epoch,
                    r.get("target_run_accuracy", r.get("final_accuracy")),
                ]
            )
        share = results[link].get("sharing", {})
        goal = TARGET_SPEEDUP.get(link)
        if goal is not None and "sharing" in methods and "ddp" in methods:
            if share.get("reached") and ddp.get("reached"):
                speed = ddp["time_to_target_s"] / share["time_to_target_s"]
                met: bool | None = speed >= goal
                measured = f"{speed:.2f}x ({share['time_to_target_s']:.0f} s vs {ddp['time_to_target_s']:.0f} s)"
            elif share.get("reached"):
                met, measured = (
                    True,
                    (
                        f"DDP did not reach {args.target:.0%} within its budget; sharing in "
                        f"{share['time_to_target_s']:.0f} s"
                    ),
                )
            else:
                met, measured = (
                    False if not share.get("error") else None,
                    (f"sharing did not reach the target ({share.get('error', 'budget')})"),
                )
            targets.append(
                {
                    "target": f"{link}: gradient sharing reaches {args.target:.0%} test accuracy >= "
                    f"{goal:g}x sooner than TorchDistributor+DDP",
                    "measured": measured,
                    "met": met,
                }
            )
            verdicts.append(
                f"- {LINKS[link][0]} + {LINKS[link][1]}: {measured} -> target >= {goal:g}x "
                f"{'met' if met else ('not measured' if met is None else 'missed')}"
            )
    C.print_table(f"time to {args.target:.0%} test accuracy on a shaped 2-host cluster", headers, rows)
    cross = crossover(results)
    print(cross)
    machine = ", ".join(
        f"{k}: {v}"
        for k, v in info.items()
        if k in ("cpu", "cores (os.cpu_count)", "memory", "torch", "pyspark", "torchspark commit")
    )
    errors = [f"- {link} / {m}: {r['error']}" for link in links for m, r in results[link].items() if r.get("error")]
    md = [
        "## Cluster: time to accuracy on shaped links"
        + ("" if args.workload == "mlp" else f" ({args.workload})")
        + "\n",
        C.stamp() + f" Run time {elapsed / 60:.1f} min{' (--quick)' if args.quick else ''}. {source_note}\n",
        f"Machine: {machine}.\n",
        "`benchmarks/bench_cluster.py`: a Spark standalone cluster of 2 hosts x 1 core built from network "
        f"namespaces on this machine (master and driver on the bridge, {', '.join(cluster_info.get('hosts', []))}; "
        "`benchmarks/cluster_harness.py`), every host link shaped with `tc` in both directions (tbf, burst 256 kB, "
        "then netem delay when the kernel has it). Links as shaped in this run: "
        + "; ".join(f"`{k}`: {link_settings.get(k, 'not run')}" for k in links)
        + ".\n",
        workload_text(args.workload, data),
        f"Adam lr {LR:g}, 2 workers x {BATCH_PER_WORKER} examples per step; target **{args.target:.0%}** test "
        f"accuracy; time budget {args.budget_s:.0f} s per method (accuracy curve), at most {args.max_epochs} "
        "epochs.\n",
        "Time to target: torchspark methods are trained once per epoch to find the epochs E needed (test accuracy "
        "on the driver after each), then a fresh network is trained with ONE `fit_paths(paths, epochs=E)` call, "
        "timed from call to return (Spark job, network broadcast, rendezvous and the returned parameters "
        "included). DDP: one `TorchDistributor(num_processes=2, local_mode=False).run`, rank 0 evaluates after "
        "each epoch with the clock paused; time = launch (driver call to the training function) + setup (process "
        "group, DDP) + training up to the first epoch at the target. Wire bytes: the kernel's veth counters, "
        'every packet counted once at its sender (hosts and driver/master), sampled every 0.1 s; "between '
        'workers" is host-to-host traffic only.\n',
        C.markdown_table(headers, rows) + "\n",
        cross + "\n",
    ]
    if verdicts:
        md.append("Targets:\n\n" + "\n".join(verdicts) + "\n")
    if errors:
        md.append("Errors:\n\n" + "\n".join(errors) + "\n")
    C.log(f"cluster benchmark done in {elapsed / 60:.1f} min")
    if not args.no_write:
        C.write_section(
            section_name(args),
            "\n".join(md),
            {
                "results": results,
                "targets": targets,
                "args": vars(args),
                "links": link_settings,
                "machine": info,
                "elapsed_s": elapsed,
                "crossover": cross,
            },
        )


def section_name(args: argparse.Namespace) -> str:
    """The MLP writes ``cluster``, another workload ``cluster_<workload>``."""
    return "cluster" if args.workload == "mlp" else f"cluster_{args.workload}"


def workload_text(workload: str, data: dict[str, Any]) -> str:
    """The report's sentence on the network and the data."""
    if workload == "mlp":
        return (
            f"Network: MLP 784-{'-'.join(map(str, HIDDEN))}-10 (3.7 M parameters, 14.9 MB float32). Data: "
            f"{data['n_train']:,} MNIST-like training images (scikit-learn digits upscaled to 20x20 at a random "
            "offset in 28x28, plus noise; generated, no download), test set the "
            f"{data['n_test']} test digits transformed the same way. "
        )
    return (
        f"Network: {WORKLOADS[workload].title}; 24.8 MB float32, 20.5 MB of it the token embedding, of which a "
        "minibatch of 32 x 64 tokens touches at most 2,048 rows of 20,000. Data: "
        f"{data['n_train']:,} training sequences of `datasets.synthetic_keywords` (class = which class's keywords "
        f"a sequence contains), test set {data['n_test']:,} more sequences of the same task. "
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one link (100mbit), fewer examples, short budget")
    parser.add_argument("--links", default=None, help=f"comma-separated subset of {', '.join(LINKS)}")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {', '.join(METHODS)}")
    parser.add_argument("--target", type=float, default=None, help="test accuracy to reach (default 0.9)")
    parser.add_argument("--budget-s", type=float, default=None, help="time budget per method and phase (s)")
    parser.add_argument("--max-epochs", type=int, default=None)
    parser.add_argument("--n-train", type=int, default=None, help="training examples (default 8192)")
    parser.add_argument("--startup-s", type=float, default=300.0, help="driver start-up allowance on top of budgets")
    parser.add_argument(
        "--workload",
        default="mlp",
        choices=list(WORKLOAD_MODELS),
        help="the network and data: mlp (MNIST-like digits) or transformer (keyword sequences)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    # internal: one method as a driver process on the cluster
    parser.add_argument("--role", default="orchestrator", choices=["orchestrator", "driver"], help=argparse.SUPPRESS)
    for name in ("--method", "--data", "--out", "--veths", "--bridge"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.links = args.links or ("100mbit" if args.quick else "1gbit,100mbit")
    args.target = args.target if args.target is not None else (0.7 if args.quick else 0.9)
    args.budget_s = args.budget_s if args.budget_s is not None else (120.0 if args.quick else 300.0)
    args.max_epochs = args.max_epochs if args.max_epochs is not None else (3 if args.quick else 12)
    args.n_train = args.n_train if args.n_train is not None else (4096 if args.quick else 8192)
    unknown = [x for x in args.links.split(",") if x.strip() and x.strip() not in LINKS] + [
        x for x in args.methods.split(",") if x.strip() and x.strip() not in METHODS
    ]
    if unknown:
        parser.error(f"unknown links/methods {unknown}; links: {list(LINKS)}, methods: {list(METHODS)}")
    return args


def run_role(args: argparse.Namespace, driver: Any, orchestrator: Any) -> None:
    """``--role driver``: one method in this process (its own SparkContext), exit 1 on an error after printing it
    (the orchestrator reads the partial JSON and this output); otherwise orchestrate the whole run."""
    if args.role == "driver":
        try:
            driver(args)
        except Exception:  # noqa: BLE001 - the orchestrator reads the partial JSON and this output
            traceback.print_exc()
            sys.exit(1)
        return
    orchestrator(args)


def main() -> None:
    run_role(parse_args(), driver_main, orchestrate)


if __name__ == "__main__":
    main()
