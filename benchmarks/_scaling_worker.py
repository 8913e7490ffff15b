"""One rank of ``bench_scaling.py``: times the exchange of one gradient-sharing step over a real gloo group.

Run by the orchestrator inside a namespace host: ``ip netns exec <ns> python benchmarks/_scaling_worker.py CONFIG``
(``CONFIG``: a JSON file, see :func:`main`). Writes its measurements as JSON to ``config["out"]`` (temp, then
rename). Nothing here builds namespaces or shapes links.

Per call it records the wall time of the exchange and of applying its result to a float32 parameter vector (as
``Network.apply_update_at`` / ``apply_update`` do), and the CPU time of this (main) thread (``time.thread_time``:
framing, decode, sum, apply in Python/numpy/torch) and of the whole process (``time.process_time``: plus gloo's
threads, i.e. copies, the dense reduction and the kernel's TCP work charged to this process). Before every timed
call all ranks meet in a one-float all-reduce, so a call's time does not include waiting for a late peer.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

TOPOLOGIES = ("all_gather", "sharded")


def _message(params: int, density: float, seed: int) -> tuple[bytes, dict[str, Any]]:
    """A threshold-encoded message of ~``density * params`` entries from a Gaussian update (the flag byte first,
    as the training loop sends it). The threshold is the update's ``1 - density`` quantile of magnitudes."""
    from torchspark.encoding import threshold_encode, to_bytes

    gen = torch.Generator().manual_seed(seed)
    update = torch.randn(params, generator=gen)  # (L,) float32
    k = max(1, int(round(density * params)))
    threshold = float(torch.kthvalue(update.abs(), params - k + 1).values)
    message = threshold_encode(update, torch.zeros(params), threshold)
    body = to_bytes(message)
    return b"\x01" + body, {"format": message.format, "entries": int(message.num_entries), "bytes": len(body) + 1}


def _apply(flat: torch.Tensor, result: Any) -> None:
    """``params -= S_t`` exactly as ``Network.apply_update_at`` / ``apply_update`` do on the CPU."""
    if result.total is None:
        return
    if result.indices is not None:
        data, idx = flat.numpy(), result.indices.numpy()
        data[idx] = data[idx] - result.total.numpy()
    else:
        flat.sub_(result.total)


def _dense_total(result: Any, params: int) -> torch.Tensor:
    if result.indices is None:
        return result.total
    dense = torch.zeros(params, dtype=torch.float32)
    dense[result.indices] = result.total
    return dense


class _Timer:
    """Wall, main-thread CPU and process CPU of one call, after a one-float all-reduce that lines ranks up."""

    def __init__(self) -> None:
        self._flag = torch.zeros(1)

    def sync(self) -> None:
        dist.all_reduce(self._flag)

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, float, float, float]:
        self.sync()
        w, t, p = time.perf_counter(), time.thread_time(), time.process_time()
        out = fn()
        return out, time.perf_counter() - w, time.thread_time() - t, time.process_time() - p


def _probe(timer: _Timer, world: int, reps: int) -> dict[str, float]:
    """Median seconds of latency-bound collectives: a one-element all-gather (a ring of N-1 hops in gloo) and a
    one-float all-reduce."""
    one = torch.zeros(1, dtype=torch.int64)
    outs = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    gather = [timer(lambda: dist.all_gather(outs, one))[1] for _ in range(reps)]
    flag = torch.zeros(1)
    reduce = [timer(lambda: dist.all_reduce(flag))[1] for _ in range(reps)]
    return {"tiny_all_gather_s": float(np.median(gather)), "tiny_all_reduce_s": float(np.median(reduce))}


def _run(cfg: dict[str, Any]) -> dict[str, Any]:
    from torchspark.training.algorithms.sharing.rounds import round_from_gathered
    from torchspark.training.algorithms.sharing.sharded import sharded_exchange
    from torchspark.training.comm import TorchDistCommunicator
    from torchspark.training.rendezvous.netif import choose_endpoint, socket_interface

    rank, world, params = int(cfg["rank"]), int(cfg["world"]), int(cfg["params"])
    torch.set_num_threads(1)  # one core per host
    # how a torchspark worker picks its address and gloo's interface: the route to the store's (driver's) host
    endpoint = choose_endpoint(cfg["store_host"], cfg["own_address"])
    timeout = datetime.timedelta(seconds=float(cfg["timeout_s"]))
    with socket_interface(endpoint.interface) as ifnames:
        store = dist.TCPStore(cfg["store_host"], int(cfg["store_port"]), world, rank == 0, timeout=timeout)
        comm = TorchDistCommunicator(
            store,
            rank,
            world,
            "gloo",
            "cpu",
            float(cfg["timeout_s"]),
            shared_memory=True,
            host_address=endpoint.address,
        )
    report: dict[str, Any] = {
        "rank": rank,
        "address": endpoint.address,
        "endpoint_source": endpoint.source,
        "socket_ifname": ifnames,
        "uses_shared_memory": comm.uses_shared_memory,
        "cases": {},
        "dense": {},
    }
    try:
        timer = _Timer()
        report["probe"] = _probe(timer, world, int(cfg["probe_reps"]))
        flat = torch.zeros(params)  # the parameters S_t is applied to

        def all_gather(comm: Any, payload: bytes, length: int, device: str) -> Any:  # the training loop's exchange
            return round_from_gathered(comm.all_gather_bytes(payload), length, device)

        exchanges = {"all_gather": all_gather, "sharded": sharded_exchange}
        cases = {}
        for i, density in enumerate(cfg["densities"]):
            payload, info = _message(params, float(density), 1000 * i + rank + int(cfg["seed"]))
            cases[str(density)] = payload
            report["cases"][str(density)] = {
                "message": info,
                **{t: {"exchange_s": [], "apply_s": [], "thread_cpu_s": [], "process_cpu_s": []} for t in TOPOLOGIES},
            }
        # warm-up, and the bit-for-bit check of the two topologies' sums
        for name, payload in cases.items():
            sums = {}
            for _ in range(int(cfg["warmup"])):
                for topo in TOPOLOGIES:
                    result = exchanges[topo](comm, payload, params, "cpu")
                    sums[topo] = hashlib.sha256(_dense_total(result, params).numpy().tobytes()).hexdigest()
            report["cases"][name]["sum_sha256"] = sums
        dense = torch.zeros(params)
        if int(cfg["dense_reps"]) > 0:
            comm.all_reduce_sum(dense)  # warm-up
        report["dense"] = {"wall_s": [], "thread_cpu_s": [], "process_cpu_s": []}
        for rep in range(max(int(cfg["reps"]), int(cfg["dense_reps"]))):
            order = TOPOLOGIES if rep % 2 == 0 else TOPOLOGIES[::-1]  # alternate: neither always goes first
            if rep < int(cfg["dense_reps"]) and rep % 2 == 1:
                _time_dense(timer, comm, dense, report["dense"])
            for name, payload in cases.items() if rep < int(cfg["reps"]) else ():
                for topo in order:
                    row = report["cases"][name][topo]
                    result, wall, thread_cpu, process_cpu = timer(lambda: exchanges[topo](comm, payload, params, "cpu"))  # noqa: B023 - called at once
                    t0, c0 = time.perf_counter(), time.thread_time()
                    _apply(flat, result)
                    row["apply_s"].append(time.perf_counter() - t0)
                    row["exchange_s"].append(wall)
                    row["thread_cpu_s"].append(thread_cpu + time.thread_time() - c0)
                    row["process_cpu_s"].append(process_cpu + time.thread_time() - c0)
            if rep < int(cfg["dense_reps"]) and rep % 2 == 0:
                _time_dense(timer, comm, dense, report["dense"])
        timer.sync()
    finally:
        comm.close()
    return report


def _time_dense(timer: _Timer, comm: Any, dense: torch.Tensor, row: dict[str, list[float]]) -> None:
    _, wall, thread_cpu, process_cpu = timer(lambda: comm.all_reduce_sum(dense))
    row["wall_s"].append(wall)
    row["thread_cpu_s"].append(thread_cpu)
    row["process_cpu_s"].append(process_cpu)


def main() -> None:
    """``CONFIG`` keys: rank, world, params, densities, reps, dense_reps, warmup, probe_reps, seed, store_host,
    store_port, own_address, timeout_s, out, src (the repository's ``src`` directory, put first on ``sys.path``)."""
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    sys.path.insert(0, cfg["src"])
    report = _run(cfg)
    tmp = cfg["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, cfg["out"])


if __name__ == "__main__":
    main()
