"""Where one worker step goes: each per-step cost of torchspark's worker loops in microseconds, against a bare loop.

Run: ``.venv/bin/python benchmarks/profile_worker_step.py [--steps 512] [--rounds 5] [--threads 1] [--write]``
(about a minute). ``--write`` stores ``benchmarks/results/step_profile.json`` and prints the markdown tables that
BENCHMARKS.md's "Where the step goes" section shows.

The workload is the throughput benchmark's MLP (784-500-10, 398k parameters, Adam lr 1e-3, batch 32 per worker) on
``--threads`` torch threads (1: what each of two workers on two cores has). Everything runs in this process, on
one thread, with no Spark: the worker loop is the real one (``run_worker``) with an injected network factory and a
world of one (``SoloCommunicator``: the collectives are identities, so an averaging round costs its packing and
unpacking only, a sharing round its encode and decode of one message). Rows:

- ``bare``: the loop a careful user writes: ``torch.optim.Adam(fused=True)``, ``zero_grad(set_to_none=True)``,
  ``cross_entropy(module(x), y).backward()``, ``step()``, over the same minibatches;
- ``network``: ``Network.train_step`` over them (torchspark's step without any loop);
- ``averaging`` / ``sharing``: ``run_worker`` of each master on ready minibatches (Spark's direct route and every
  epoch after the first of ParallelWrapper, which decodes its serialized minibatches once and replays them), with
  the hooks off (the benchmarks' ``progress=False``), and again with training stats and progress on;
- ``... export route``: the minibatches as batch files read every epoch through the prefetch thread (Spark's
  default route); its CPU column includes the loader thread's.

Per step, three clocks: the training thread's CPU time (``time.thread_time_ns``: what the loop itself costs, fairly
stable under load), the whole process's CPU time (the loader thread included) and wall time. Rows are interleaved
round by round (``bare, network, averaging, ...`` in each round, order reversed every other round) and each figure
is the median over rounds, so machine load hits every row alike. The named costs of the step itself (forward,
loss, backward, updater, and what ``Network`` adds: label checks, loss reduction, the loss read back) come from a
step taken apart with a clock read between its parts. The loop rows split the rest by phase (``fit`` =
``train_group``, ``data_wait`` = the hand-off of the next minibatch, ``averaging``/``exchange`` = the round) with a
recorder that adds up thread CPU time per phase.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import _common as C  # noqa: E402

LR = 1e-3
SEED = 0
BATCH = 32


class ThreadTimeRecorder:
    """A ``PhaseRecorder`` that adds up the training thread's CPU nanoseconds per phase name (no event list)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def phase(self, name: str, **attrs: Any) -> Iterator[None]:
        t0 = time.thread_time_ns()
        try:
            yield None
        finally:
            self.ns[name] += time.thread_time_ns() - t0

    def record_score(self, iteration: int, score: float) -> None:
        return None

    def record_encoding(self, *args: Any) -> None:
        return None


def make_batches(model: str, steps: int) -> list[Any]:
    from torchspark import datasets
    from torchspark.data import DataSet

    n = BATCH * steps
    data = datasets.synthetic_images(n, 1, 28, 28, n_classes=10, seed=SEED)
    if model == "mlp":
        data = DataSet(data.features.reshape(n, 784).contiguous(), data.labels)
    return [DataSet(b.features.clone(), b.labels.clone()) for b in data.split(BATCH)]


def make_module(model: str) -> torch.nn.Module:
    from torchspark import models

    return models.mlp(784, 500, 10) if model == "mlp" else models.lenet(1, 10, 28, 28)


def make_network(model: str) -> Any:
    import torchspark as ts
    from torchspark import optim

    return ts.Network(make_module(model), loss="cross_entropy", updater=optim.Adam(lr=LR), seed=SEED)


def bare_optimizer(module: torch.nn.Module) -> tuple[torch.optim.Optimizer, str]:
    """Fused Adam where this torch runs it on CPU, else the foreach kernel."""
    try:
        opt = torch.optim.Adam(module.parameters(), lr=LR, fused=True)
        loss = module(torch.zeros(1, *_input_shape(module))).sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return torch.optim.Adam(module.parameters(), lr=LR, fused=True), "fused"
    except (RuntimeError, TypeError):
        return torch.optim.Adam(module.parameters(), lr=LR, foreach=True), "foreach"


def _input_shape(module: torch.nn.Module) -> tuple[int, ...]:
    first = next(m for m in module.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)))
    return (first.in_features,) if isinstance(first, torch.nn.Linear) else (1, 28, 28)


# ---------------------------------------------------------------------------------------------------- clocks
class Clocks:
    """Thread CPU, process CPU and wall nanoseconds of one timed call."""

    def __init__(self) -> None:
        self.t0 = (time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns())

    def stop(self) -> tuple[int, int, int]:
        t1 = (time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns())
        return t1[0] - self.t0[0], t1[1] - self.t0[1], t1[2] - self.t0[2]


# ---------------------------------------------------------------------------------------------------- the rows
class Row:
    """One way to train ``steps`` minibatches; ``run()`` returns its clocks and phase nanoseconds."""

    name = ""

    def __init__(self, model: str, batches: list[Any], paths: list[str]) -> None:
        self.model, self.batches, self.paths = model, batches, paths

    def run(self) -> tuple[tuple[int, int, int], dict[str, int]]:
        raise NotImplementedError


class Bare(Row):
    name = "bare"

    def __init__(self, model: str, batches: list[Any], paths: list[str]) -> None:
        super().__init__(model, batches, paths)
        torch.manual_seed(SEED)
        self.module = make_module(model)
        self.opt, self.kernel = bare_optimizer(self.module)
        self.name = f"bare loop, torch.optim.Adam({self.kernel}=True)"

    def run(self) -> tuple[tuple[int, int, int], dict[str, int]]:
        m, opt = self.module, self.opt
        m.train()
        clocks = Clocks()
        for b in self.batches:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(m(b.features), b.labels).backward()
            opt.step()
        return clocks.stop(), {}


class NetworkStep(Row):
    name = "Network.train_step (no loop)"

    def __init__(self, model: str, batches: list[Any], paths: list[str]) -> None:
        super().__init__(model, batches, paths)
        self.net = make_network(model)

    def run(self) -> tuple[tuple[int, int, int], dict[str, int]]:
        net = self.net
        clocks = Clocks()
        for b in self.batches:
            net.train_step(b)
        return clocks.stop(), {}


class WorkerLoop(Row):
    """``run_worker`` of one master over one epoch of the minibatches (a world of one)."""

    master = "averaging"
    route = "ready"
    hooks_on = False

    def __init__(self, model: str, batches: list[Any], paths: list[str]) -> None:
        super().__init__(model, batches, paths)
        from torchspark.training.driver.fit import build_task
        from torchspark.training.hooks import NullRecorder
        from torchspark.training.worker.loop import ItemSource

        self.net = make_network(model)
        self.task = build_task(self.net, self._master(), 1, False, NullRecorder())
        self.items = batches if self.route == "ready" else paths
        self.source_type = ItemSource
        route = "ready minibatches" if self.route == "ready" else "export route: batch files, prefetch thread"
        hooks = ", stats + progress on" if self.hooks_on else ""
        self.name = f"{self.master} worker loop ({route}{hooks})"

    def _master(self) -> Any:
        from torchspark.encoding import AdaptiveThreshold
        from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster

        common: dict[str, Any] = dict(batch_size_per_worker=BATCH, num_workers=1)
        if self.master == "sharing":
            return SharedTrainingMaster(threshold_algorithm=AdaptiveThreshold(initial=1e-2), **common)
        return ParameterAveragingTrainingMaster(averaging_frequency=5, **common)

    def _hooks(self) -> tuple[Any, ThreadTimeRecorder | None]:
        from torchspark.stats import StatsCollector
        from torchspark.training.hooks import WorkerHooks

        if self.hooks_on:  # what the worker has with collect_training_stats and the progress bar on
            return WorkerHooks(recorder=StatsCollector("worker-0"), progress=lambda update: None), None
        recorder = ThreadTimeRecorder()
        return WorkerHooks(recorder=recorder), recorder

    def run(self) -> tuple[tuple[int, int, int], dict[str, int]]:
        from torchspark.training.comm import SoloCommunicator
        from torchspark.training.worker.loop import run_worker

        hooks, recorder = self._hooks()
        source = self.source_type(list(self.items))
        clocks = Clocks()
        run_worker(self.task, source, SoloCommunicator(), hooks=hooks, network_factory=lambda task, device: self.net)
        return clocks.stop(), dict(recorder.ns) if recorder is not None else {}


def _loop(master: str, route: str, hooks_on: bool) -> type[WorkerLoop]:
    return type(f"{master}_{route}_{hooks_on}", (WorkerLoop,), {"master": master, "route": route, "hooks_on": hooks_on})


ROWS: list[type[Row]] = [
    Bare,
    NetworkStep,
    _loop("averaging", "ready", False),
    _loop("averaging", "ready", True),
    _loop("averaging", "export", False),
    _loop("sharing", "ready", False),
    _loop("sharing", "ready", True),
    _loop("sharing", "export", False),
]


# ---------------------------------------------------------------------------------------------------- a step apart
def step_parts(net: Any, batch: Any, into: dict[str, list[int]]) -> None:
    """``Network.train_step`` taken apart (the same calls, in order), thread CPU nanoseconds per part."""
    from torchspark.nn import forward as F

    clock = time.thread_time_ns
    clear = getattr(net._state, "clear_grads", None)  # noqa: SLF001 - the step's own call, where it has it
    zero_grad = clear if clear is not None else lambda: net.optimizer.zero_grad(set_to_none=True)
    marks = [clock()]
    zero_grad()
    net.module.train()
    marks.append(clock())
    feats, labels, fmask, lmasks = F.unpack(net, batch)
    marks.append(clock())
    outputs = F.forward(net, feats, fmask)
    marks.append(clock())
    F.check_labels(net, outputs, labels)
    marks.append(clock())
    summed = getattr(F, "_summed_losses", None)  # the unmasked path batch_loss takes, where it has it
    if summed is not None and lmasks is None:
        loss = summed(net, outputs, labels).sum() / max(outputs[0].shape[0], 1)
    else:
        per, weight = F.per_example_losses(net, outputs, labels, lmasks)
        loss = per.sum() / weight.sum().clamp(min=1.0)
    marks.append(clock())
    value = float(loss.detach())
    math.isfinite(value)
    marks.append(clock())
    net.amp.backward(loss)
    marks.append(clock())
    net.amp.unscale(net.optimizer)
    net._apply_lr_schedule()  # noqa: SLF001 - the profile repeats the step's own calls
    marks.append(clock())
    net.amp.step(net.optimizer)
    marks.append(clock())
    zero_grad()
    net.iteration += 1
    marks.append(clock())
    names = NETWORK_PARTS
    for name, t0, t1 in zip(names, marks, marks[1:]):
        into[name].append(t1 - t0)


NETWORK_PARTS = (
    "clear grads (zero_grad) + train mode",
    "unpack (features to the parameters' device and dtype)",
    "forward",
    "label checks (shape, class range read back)",
    "loss: per-example losses, (label-mask weights), mean",
    "loss read back (float) + finite check",
    "backward",
    "unscale, clip, l1, lr schedule",
    "optimizer step (fused Adam)",
    "clear grads after the step",
)
BARE_PARTS = ("zero_grad", "forward", "loss (cross_entropy)", "backward", "optimizer step")


def bare_parts(module: torch.nn.Module, opt: torch.optim.Optimizer, batch: Any, into: dict[str, list[int]]) -> None:
    clock = time.thread_time_ns
    marks = [clock()]
    opt.zero_grad(set_to_none=True)
    marks.append(clock())
    out = module(batch.features)
    marks.append(clock())
    loss = torch.nn.functional.cross_entropy(out, batch.labels)
    marks.append(clock())
    loss.backward()
    marks.append(clock())
    opt.step()
    marks.append(clock())
    for name, t0, t1 in zip(BARE_PARTS, marks, marks[1:]):
        into[name].append(t1 - t0)


# ---------------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=512, help="minibatches per row and round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (after one untimed warm-up round)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", choices=("mlp", "lenet"), default="mlp")
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/step_profile.json")
    parser.add_argument("--label", default="", help="a note stored with the results (e.g. 'before', 'after')")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)

    from torchspark.data import save_batches

    batches = make_batches(args.model, args.steps)
    with tempfile.TemporaryDirectory(prefix="torchspark-profile-") as tmp:
        paths = save_batches(batches, tmp)
        rows = [cls(args.model, batches, paths) for cls in ROWS]
        clocks: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        phases: dict[str, list[dict[str, int]]] = defaultdict(list)
        for r in range(args.rounds + 1):
            for row in rows if r % 2 else rows[::-1]:
                c, ph = row.run()
                if r:
                    clocks[row.name].append(c)
                    phases[row.name].append(ph)
            C.log(f"round {r}/{args.rounds} done")
        parts = profile_parts(args.model, batches)
    result = summarize(rows, clocks, phases, parts, args)
    print(result["markdown"])
    if args.write:
        C.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        out = C.RESULTS_DIR / "step_profile.json"
        out.write_text(json.dumps(result, indent=2, sort_keys=True))
        C.log(f"wrote {out}")


def profile_parts(model: str, batches: list[Any]) -> dict[str, dict[str, float]]:
    """Median thread-CPU microseconds of each named part of a bare step and of ``Network.train_step``."""
    net = make_network(model)
    torch.manual_seed(SEED)
    module = make_module(model)
    opt, _ = bare_optimizer(module)
    module.train()
    net_parts: dict[str, list[int]] = defaultdict(list)
    bare: dict[str, list[int]] = defaultdict(list)
    for i, b in enumerate(batches):
        if i % 2:
            step_parts(net, b, net_parts)
            bare_parts(module, opt, b, bare)
        else:
            bare_parts(module, opt, b, bare)
            step_parts(net, b, net_parts)
    return {
        "bare": {k: statistics.median(v) / 1e3 for k, v in bare.items()},
        "network": {k: statistics.median(v) / 1e3 for k, v in net_parts.items()},
    }


def summarize(
    rows: list[Row],
    clocks: dict[str, list[tuple[int, int, int]]],
    phases: dict[str, list[dict[str, int]]],
    parts: dict[str, dict[str, float]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    steps = args.steps
    per_step: dict[str, dict[str, float]] = {}
    for row in rows:
        thread, process, wall = (statistics.median(c[k] for c in clocks[row.name]) / steps / 1e3 for k in range(3))
        entry = {"thread_us": thread, "process_us": process, "wall_us": wall}
        for name in {k for ph in phases[row.name] for k in ph}:
            entry[f"phase:{name}"] = statistics.median(ph.get(name, 0) for ph in phases[row.name]) / steps / 1e3
        per_step[row.name] = entry
    bare = per_step[rows[0].name]["thread_us"]
    lines = [
        f"{args.model.upper()}, batch {BATCH}, {args.threads} thread(s), {steps} steps x {args.rounds} rounds; "
        f"load average {C.load_average()}{f'; {args.label}' if args.label else ''}\n",
        "| row | thread CPU µs/step | vs bare | process CPU µs/step | wall µs/step | phases (thread CPU µs/step) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        e = per_step[row.name]
        ph = ", ".join(f"{k[6:]} {v:.0f}" for k, v in sorted(e.items()) if k.startswith("phase:"))
        lines.append(
            f"| {row.name} | {e['thread_us']:.0f} | {e['thread_us'] / bare:.2f}x | {e['process_us']:.0f} | "
            f"{e['wall_us']:.0f} | {ph or '-'} |"
        )
    lines += ["", "| cost (one step taken apart) | µs/step | % of step |", "|---|---:|---:|"]
    for kind in ("bare", "network"):
        total = sum(parts[kind].values())
        for name, us in parts[kind].items():
            lines.append(f"| {kind}: {name} | {us:.1f} | {100 * us / total:.1f}% |")
        lines.append(f"| **{kind}: sum** | **{total:.1f}** | 100% |")
    loop_costs = loop_cost_table(rows, per_step)
    lines += ["", "| worker-loop cost beyond Network.train_step | µs/step | % of bare step |", "|---|---:|---:|"]
    for name, us in loop_costs.items():
        lines.append(f"| {name} | {us:.1f} | {100 * us / bare:.1f}% |")
    return {
        "args": vars(args),
        "machine": C.machine_info(),
        "load_average": C.load_average(),
        "per_step": per_step,
        "parts": parts,
        "loop_costs": loop_costs,
        "markdown": "\n".join(lines),
    }


def loop_cost_table(rows: list[Row], per_step: dict[str, dict[str, float]]) -> dict[str, float]:
    """The loops' costs beyond ``Network.train_step``, per step, from the phase split (thread CPU)."""
    network = per_step[rows[1].name]["thread_us"]
    out: dict[str, float] = {}
    for row in rows[2:]:
        e = per_step[row.name]
        if "phase:fit" not in e:
            continue
        out[f"{row.name}: fit phase - train_step"] = e["phase:fit"] - network
        for name in ("data_wait", "averaging", "exchange"):
            if f"phase:{name}" in e:
                out[f"{row.name}: {name}"] = e[f"phase:{name}"]
        phased = sum(v for k, v in e.items() if k.startswith("phase:"))
        out[f"{row.name}: outside phases (counters, hooks, setup)"] = e["thread_us"] - phased
    return out


if __name__ == "__main__":
    main()
