"""The exchange cost model (``scaling_model.py``) against exchange steps timed on the namespace cluster.

Run (root and ``ip netns`` needed; otherwise it says why and exits 0)::

    flock <lock file> .venv/bin/python benchmarks/bench_scaling.py [--num-workers 2,4,8] \\
        [--links 1gbit:0.1ms,100mbit:0.5ms] [--params 3.7e6] [--densities 0.001,0.01,0.1] [--reps 30]

It builds one :class:`~cluster_harness.NetnsCluster` (``with_spark=False``) of ``max(workers)`` namespace hosts,
and for every link setting (tc tbf at the rate on both directions of every host link, plus netem at the delay when
the kernel has it) and every N starts one worker process per host (``ip netns exec <ns> python
_scaling_worker.py``): rank 0's TCPStore on host 1's bridge address, gloo on the interface torchspark picks (the
route to that address: ``eth1``). Every worker builds its own threshold-encoded message per density (Gaussian
update, the threshold at its ``1 - density`` quantile; 10% gives a bitmap message) and times, alternating the
order, the plain all-gather exchange (``rounds.round_from_gathered`` of an all-gather) and the sharded one
(``sharded_exchange``), each with the apply of its sum, plus a dense gloo all-reduce of the L float32 parameters
(the dense-ring baseline).

Per (link, N, density, topology) it reports the median over calls of the slowest rank's wall time, the median
main-thread and process CPU time, the model's prediction for the same N, L, density and link (bandwidth = the tbf
rate; per-hop latency = the measured one-element gloo all-gather time / (N-1), which includes the netem delay when
one is applied) and measured / model. Results: ``benchmarks/results/scaling.json``; BENCHMARKS.md is not touched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C  # noqa: E402
from scaling_model import Link, Rates, all_gather_s, dense_ring_s, sharded_s  # noqa: E402

WORKER = os.path.join(HERE, "_scaling_worker.py")
SRC = os.path.join(os.path.dirname(HERE), "src")
RESULTS = os.path.join(HERE, "results", "scaling.json")
TOPOLOGIES = ("all_gather", "sharded")
_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}


class BenchError(RuntimeError):
    """A worker failed or timed out (the message carries the tails of the workers' logs)."""


def rate_bytes_per_s(rate: str) -> float:
    """tc's ``"100mbit"`` / ``"1gbit"`` as bytes per second."""
    for unit, scale in _UNITS.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * scale / 8
    raise ValueError(f"link rate must look like '100mbit' or '1gbit', got {rate!r}")


def burst_for(rate: str, burst_ms: float) -> str:
    """tbf's bucket for ``rate``: ``burst_ms`` of line time, at least 16 kB (tc's ``b`` unit: bytes)."""
    return f"{max(16384, int(rate_bytes_per_s(rate) * burst_ms / 1e3))}b"


def parse_links(text: str) -> list[tuple[str, str | None]]:
    """``"1gbit:0.1ms,100mbit:0.5ms"`` -> ``[("1gbit", "0.1ms"), ("100mbit", "0.5ms")]`` (``:delay`` optional)."""
    links = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        rate, _, delay = item.partition(":")
        rate_bytes_per_s(rate)  # validates
        links.append((rate, delay or None))
    if not links:
        raise ValueError(f"--links needs at least one 'rate[:delay]', got {text!r}")
    return links


def run_setting(
    cluster: Any, world: int, cfg: dict[str, Any], workdir: str, port: int, timeout_s: float
) -> list[dict[str, Any]]:
    """One worker process per host (ranks 0..world-1 on hosts 1..world); their reports by rank. Kills them all
    and raises :class:`BenchError` with their log tails when one fails or the whole takes over ``timeout_s``."""
    procs, logs = [], []
    try:
        for rank in range(world):
            host = cluster.hosts[rank]
            out = os.path.join(workdir, f"w{world}-{port}-{rank}.json")
            conf = dict(
                cfg,
                rank=rank,
                world=world,
                store_host=cluster.hosts[0].address,
                store_port=port,
                own_address=host.address,
                out=out,
                src=SRC,
            )
            path = os.path.join(workdir, f"w{world}-{port}-{rank}.cfg.json")
            with open(path, "w") as f:
                json.dump(conf, f)
            log_path = os.path.join(workdir, f"w{world}-{port}-{rank}.log")
            logs.append(log_path)
            env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "TORCHSPARK_LOCAL_IP")}
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            with open(log_path, "wb") as log:
                procs.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", host.netns, sys.executable, WORKER, path],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                raise BenchError(
                    f"worker {failed[0]} of {world} exited with {procs[failed[0]].returncode}:\n" + _tails(logs)
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{world} workers did not finish within {timeout_s:.0f} s (raise --timeout):\n" + _tails(logs)
                )
            time.sleep(0.2)
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise BenchError(
                f"worker {failed[0]} of {world} exited with {procs[failed[0]].returncode}:\n" + _tails(logs)
            )
        reports = []
        for rank in range(world):
            with open(os.path.join(workdir, f"w{world}-{port}-{rank}.json")) as f:
                reports.append(json.load(f))
        return reports
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                p.wait(timeout=10)


def _tails(logs: list[str], lines: int = 12) -> str:
    parts = []
    for path in logs:
        try:
            with open(path, errors="replace") as f:
                parts.append(f"--- {os.path.basename(path)}\n" + "".join(f.readlines()[-lines:]))
        except OSError:
            pass
    return "\n".join(parts)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def summarise(reports: list[dict[str, Any]], params: int, rate: str, delay_applied: str | None) -> dict[str, Any]:
    """Measured medians next to the model for one (link, N): rows for dense and every (density, topology)."""
    world = len(reports)
    tiny = _median([r["probe"]["tiny_all_gather_s"] for r in reports])
    link = Link(rate_bytes_per_s(rate), tiny / max(world - 1, 1))
    cpu_only = Link(math.inf, 0.0)
    rows = []
    dense = [r["dense"] for r in reports]
    if dense[0]["wall_s"]:
        walls = [max(d["wall_s"][i] for d in dense) for i in range(len(dense[0]["wall_s"]))]
        rows.append(
            _row(
                "dense ring",
                None,
                None,
                walls,
                dense,
                dense_ring_s(world, params, link),
                dense_ring_s(world, params, cpu_only),
                "wall_s",
            )
        )
    for name in reports[0]["cases"]:
        entries = statistics.mean(r["cases"][name]["message"]["entries"] for r in reports)
        density = entries / params
        fmt = reports[0]["cases"][name]["message"]["format"]
        for topo in TOPOLOGIES:
            per_rank = [r["cases"][name][topo] for r in reports]
            calls = len(per_rank[0]["exchange_s"])
            walls = [max(p["exchange_s"][i] + p["apply_s"][i] for p in per_rank) for i in range(calls)]
            fn = all_gather_s if topo == "all_gather" else sharded_s
            rows.append(
                _row(
                    topo,
                    float(name),
                    fmt,
                    walls,
                    per_rank,
                    fn(world, params, density, link),
                    fn(world, params, density, cpu_only),
                    "exchange_s",
                    message_bytes=statistics.mean(r["cases"][name]["message"]["bytes"] for r in reports),
                    density=density,
                )
            )
    same = all(
        len({r["cases"][n]["sum_sha256"][t] for r in reports for t in TOPOLOGIES}) == 1 for n in reports[0]["cases"]
    )
    return {
        "workers": world,
        "rate": rate,
        "delay": delay_applied,
        "link_bandwidth_Bps": link.bandwidth,
        "hop_latency_s": link.latency,
        "probe": {k: _median([r["probe"][k] for r in reports]) for k in reports[0]["probe"]},
        "uses_shared_memory": any(r["uses_shared_memory"] for r in reports),
        "endpoints": [(r["address"], r["endpoint_source"], r["socket_ifname"]) for r in reports],
        "same_sum_bit_for_bit": same,
        "sum_sha256": {n: reports[0]["cases"][n]["sum_sha256"] for n in reports[0]["cases"]},
        "rows": rows,
    }


def _row(
    op: str,
    density_set: float | None,
    fmt: str | None,
    walls: list[float],
    per_rank: list[dict[str, Any]],
    model_s: float,
    model_cpu_s: float,
    wall_key: str,
    **extra: Any,
) -> dict[str, Any]:
    thread = [v for p in per_rank for v in p["thread_cpu_s"]]
    process = [v for p in per_rank for v in p["process_cpu_s"]]
    wall = _median(walls)
    return {
        "op": op,
        "density_set": density_set,
        "format": fmt,
        "calls": len(walls),
        "wall_s": wall,
        "wall_p10_s": _quantile(walls, 0.1),
        "wall_p90_s": _quantile(walls, 0.9),
        "wall_per_call_s": walls,
        "thread_cpu_s": _median(thread),
        "process_cpu_s": _median(process),
        "rank_median_wall_s": _median([v for p in per_rank for v in p[wall_key]]),
        "model_s": model_s,
        "model_cpu_s": model_cpu_s,
        "model_net_s": model_s - model_cpu_s,
        "ratio": wall / model_s if model_s > 0 else float("nan"),
        **extra,
    }


def remodel(data: dict[str, Any]) -> dict[str, Any]:
    """Recompute the model columns of stored results with the current ``scaling_model`` (after changing it)."""
    params = data["conditions"]["params"]
    for s in data["settings"]:
        link, cpu_only, n = Link(s["link_bandwidth_Bps"], s["hop_latency_s"]), Link(math.inf, 0.0), s["workers"]
        for r in s["rows"]:
            if r["op"] == "dense ring":
                model, cpu = dense_ring_s(n, params, link), dense_ring_s(n, params, cpu_only)
            else:
                fn = all_gather_s if r["op"] == "all_gather" else sharded_s
                model, cpu = fn(n, params, r["density"], link), fn(n, params, r["density"], cpu_only)
            r.update(model_s=model, model_cpu_s=cpu, model_net_s=model - cpu, ratio=r["wall_s"] / model)
    data["fits"] = fits(data["settings"], params)
    data["conditions"]["rates"] = Rates().__dict__
    return data


def _quantile(values: list[float], q: float) -> float:
    vals = sorted(values)
    return vals[min(len(vals) - 1, int(q * len(vals)))] if vals else float("nan")


def table_rows(settings: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for s in settings:
        for r in s["rows"]:
            what = r["op"] if r["density_set"] is None else f"{r['op']} {100 * r['density_set']:g}% {r['format']}"
            out.append(
                [
                    s["rate"],
                    s["workers"],
                    what,
                    f"{1e3 * r['wall_s']:.2f}",
                    f"{1e3 * r['model_s']:.2f}",
                    f"{r['ratio']:.2f}",
                    f"{1e3 * r['thread_cpu_s']:.2f}",
                    f"{1e3 * r['process_cpu_s']:.2f}",
                    f"{1e3 * r['model_cpu_s']:.2f}",
                    f"{1e3 * r['model_net_s']:.2f}",
                ]
            )
    return out


HEADERS = [
    "link",
    "N",
    "exchange",
    "measured ms",
    "model ms",
    "meas/model",
    "thread CPU ms",
    "process CPU ms",
    "model CPU ms",
    "model wire ms",
]


def fits(settings: list[dict[str, Any]], params: int) -> dict[str, Any]:
    """Constants the measurements imply: the dense all-reduce's effective bandwidth per link (``2 (N-1)/N 4L``
    bytes over its wall time less the latencies), and a least-squares ``thread CPU = a N + b (decoded entries)``
    over the all-gather rows (the model: a = per_message = 100 us, b = decode_entry + apply_entry = 22 ns)."""
    import numpy as np

    out: dict[str, Any] = {"dense_effective_bandwidth": [], "all_gather_cpu": None}
    xs, ys = [], []
    for s in settings:
        n = s["workers"]
        for r in s["rows"]:
            if r["op"] == "dense ring":
                wire = r["wall_s"] - 2 * (n - 1) * s["hop_latency_s"]
                eff = 2 * (n - 1) / n * 4 * params / wire if wire > 0 else float("nan")
                out["dense_effective_bandwidth"].append(
                    {"rate": s["rate"], "workers": n, "bytes_per_s": eff, "of_nominal": eff / s["link_bandwidth_Bps"]}
                )
            elif r["op"] == "all_gather" and r["format"] == "sparse":
                xs.append([n, n * r["density"] * params])
                ys.append(r["thread_cpu_s"])
    if len(xs) >= 2:
        (a, b), *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
        out["all_gather_cpu"] = {"per_message_s": float(a), "per_entry_s": float(b), "points": len(xs)}
    return out


def _save(data: dict[str, Any], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-workers", default="2,4,8", help="worker counts, comma-separated (each >= 2)")
    p.add_argument(
        "--links",
        default="1gbit:0.1ms,100mbit:0.5ms",
        help="rate[:delay] per link setting; the delay needs netem (dropped with a note when absent)",
    )
    p.add_argument(
        "--burst-ms",
        type=float,
        default=2.0,
        help="tc tbf bucket as milliseconds of line time (at least 16 kB): a message smaller than the "
        "bucket leaves at full speed after an idle moment, so keep it small",
    )
    p.add_argument(
        "--slow-start-after-idle",
        choices=("kernel", "0", "1"),
        default="kernel",
        help="net.ipv4.tcp_slow_start_after_idle in every host namespace (kernel: leave its default); "
        "1 makes TCP restart slow start on a connection idle for longer than its RTO",
    )
    p.add_argument("--params", type=float, default=3.7e6, help="network size L (float32 parameters)")
    p.add_argument("--densities", default="0.001,0.01,0.1", help="message densities; >= 0.0625 gives bitmaps")
    p.add_argument("--reps", type=int, default=30, help="timed calls per (density, topology)")
    p.add_argument("--dense-reps", type=int, default=8, help="timed dense all-reduces per setting (0: none)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--probe-reps", type=int, default=30, help="one-element collectives timed for the latency")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per (link, N) before everything is killed")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--report", metavar="JSON", help="measure nothing: print (and re-model, in place) stored results")
    args = p.parse_args(argv)
    args.num_workers = [int(w) for w in args.num_workers.split(",") if w.strip()]
    if not args.num_workers or min(args.num_workers) < 2:
        p.error(f"--num-workers needs counts >= 2, got {args.num_workers}")
    args.links = parse_links(args.links)
    args.densities = [float(d) for d in args.densities.split(",") if d.strip()]
    if not args.densities or not all(0 < d <= 1 for d in args.densities):
        p.error(f"--densities must lie in (0, 1], got {args.densities}")
    if args.burst_ms <= 0:
        p.error(f"--burst-ms must be > 0, got {args.burst_ms}")
    if args.reps < 1 or args.dense_reps < 0 or args.warmup < 1 or args.probe_reps < 1:
        p.error("--reps, --warmup and --probe-reps must be >= 1, --dense-reps >= 0")
    if args.params < 16:
        p.error(f"--params must be >= 16, got {args.params}")
    args.params = int(args.params)
    return args


def _slow_start(cluster: Any, value: str) -> str:
    """Set (unless ``"kernel"``) and read back ``tcp_slow_start_after_idle`` in every host namespace."""
    key = "net.ipv4.tcp_slow_start_after_idle"
    seen = set()
    for host in cluster.hosts:
        if value != "kernel":
            done = cluster.exec_in(host, "sysctl", "-w", f"{key}={value}")
            if done.returncode != 0:
                raise BenchError(f"cannot set {key}={value} in {host.netns}: {done.stderr.strip()}")
        seen.add(cluster.exec_in(host, "sysctl", "-n", key).stdout.strip())
    return ",".join(sorted(seen))


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """The whole measurement; None (after saying why) when namespaces cannot be built here."""
    from cluster_harness import NetnsCluster, netem_available, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"bench_scaling: skipped, the namespace cluster is unavailable here: {reason}")
        return None
    cfg = {
        "params": args.params,
        "densities": args.densities,
        "reps": args.reps,
        "dense_reps": args.dense_reps,
        "warmup": args.warmup,
        "probe_reps": args.probe_reps,
        "seed": args.seed,
        "timeout_s": max(60.0, args.timeout / 2),
    }
    has_netem = netem_available()
    data: dict[str, Any] = {
        "machine": C.machine_info(),
        "conditions": {
            "workers": args.num_workers,
            "links": args.links,
            "burst_ms": args.burst_ms,
            "bursts": {rate: burst_for(rate, args.burst_ms) for rate, _ in args.links},
            "tcp_slow_start_after_idle": args.slow_start_after_idle,
            "netem": has_netem,
            "params": args.params,
            "densities": args.densities,
            "reps": args.reps,
            "dense_reps": args.dense_reps,
            "warmup": args.warmup,
            "load_at_start": C.load_average(),
            "rates": Rates().__dict__,
        },
        "settings": [],
    }
    t0 = time.perf_counter()
    port = 29400 + os.getpid() % 500
    with (
        tempfile.TemporaryDirectory(prefix="bench-scaling-") as workdir,
        NetnsCluster(workers=max(args.num_workers), with_spark=False) as cluster,
    ):
        data["conditions"]["tcp_slow_start_after_idle"] = _slow_start(cluster, args.slow_start_after_idle)
        for rate, delay in args.links:
            applied = delay if (delay and has_netem) else None
            cluster.shape_links(rate, applied, burst=burst_for(rate, args.burst_ms))
            for world in args.num_workers:
                port += 1
                C.log(f"{rate} (delay {applied or 'none'}), {world} workers ...")
                reports = run_setting(cluster, world, cfg, workdir, port, args.timeout)
                setting = summarise(reports, args.params, rate, applied)
                setting["delay_requested"] = delay
                data["settings"].append(setting)
                _save(data, args.out)
            cluster.unshape_links()
    data["fits"] = fits(data["settings"], args.params)
    data["conditions"]["load_at_end"] = C.load_average()
    data["conditions"]["elapsed_s"] = time.perf_counter() - t0
    _save(data, args.out)
    return data


def report(data: dict[str, Any]) -> None:
    cond = data["conditions"]
    C.print_table(
        f"exchange step, L = {cond['params']:,}, medians of {cond['reps']} calls (dense: "
        f"{cond['dense_reps']}); measured = slowest rank per call",
        HEADERS,
        table_rows(data["settings"]),
    )
    for s in data["settings"]:
        print(
            f"{s['rate']} N={s['workers']}: hop latency {1e6 * s['hop_latency_s']:.0f} us (one-element all-gather "
            f"{1e6 * s['probe']['tiny_all_gather_s']:.0f} us), shared memory used: {s['uses_shared_memory']}, "
            f"sums identical bit for bit: {s['same_sum_bit_for_bit']}"
        )
    print("fits:", json.dumps(data["fits"], indent=1))
    print(f"netem: {cond['netem']}; load {cond['load_at_start']} -> {cond['load_at_end']}; {cond['elapsed_s']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        with open(args.report) as f:
            data = remodel(json.load(f))
        _save(data, args.report)
        report(data)
        return 0
    data = run(args)
    if data is not None:
        report(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
