"""Shared helpers of the benchmark scripts: machine info, timing statistics, tables, and BENCHMARKS.md sections.

Every benchmark script writes its own section of ``BENCHMARKS.md`` (between ``<!-- section:NAME -->`` markers,
replacing the previous run's) and its raw numbers to ``benchmarks/results/NAME.json``; the "Targets" table at the
top of ``BENCHMARKS.md`` is rebuilt from those JSON files every time a section is written. ``run_all.py`` rewrites
the whole file (header, machine info) and then runs every script. Text between ``<!-- notes:start -->`` and
``<!-- notes:end -->`` is hand-written and kept across regenerations.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
RESULTS_DIR = BENCH_DIR / "results"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"

#: Order of the sections in BENCHMARKS.md.
SECTIONS = ("throughput", "throughput_channels_last", "shuffle", "sharing", "codec", "cluster", "checkpoint")
#: generated sections that run_all runs only when named (``--only``): the real-size runs take 40 and 20 minutes
LONG_SECTIONS = ("throughput_real_size", "cluster_transformer")
#: results files that hold targets of a hand-written part of BENCHMARKS.md (no generated section)
TARGET_RESULTS = ("small_networks",)

NOTES_START = "<!-- notes:start -->"
NOTES_END = "<!-- notes:end -->"
TARGETS_START = "<!-- targets:start -->"
TARGETS_END = "<!-- targets:end -->"


# ---------------------------------------------------------------------------------------------------- environment
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gb() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1e6:.1f} GB"
    except OSError:
        pass
    return "unknown"


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return str(getattr(mod, "__version__", "?"))
    except Exception:  # noqa: BLE001 - informational only
        return "not installed"


def _java() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        return (out.stderr or out.stdout).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "not found"


def _git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True, cwd=ROOT, timeout=10
        ).stdout.strip()
        return f"{rev}{' + uncommitted changes in src/' if dirty else ''}" if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_average() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def machine_info() -> dict[str, str]:
    """What the numbers were measured on."""
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "cpu": _cpu_model(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "memory": _mem_gb(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": _version("torch"),
        "pyspark": _version("pyspark"),
        "numpy": _version("numpy"),
        "java": _java(),
        "torchspark commit": _git_rev(),
        "load average at start (1/5/15 min)": load_average(),
    }


def stamp() -> str:
    """One line saying when and under which load a section was measured."""
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return f"Measured {now}; load average (1/5/15 min) at the end: {load_average()}."


# ---------------------------------------------------------------------------------------------------- statistics
def median(values: Iterable[float]) -> float:
    vals = [v for v in values if v == v]  # drop NaN
    return statistics.median(vals) if vals else float("nan")


def spread(values: Sequence[float]) -> str:
    """``min-max`` of the finite values, for the tables."""
    vals = [v for v in values if v == v]
    if not vals:
        return "n/a"
    return f"{min(vals):.2f}-{max(vals):.2f}"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ---------------------------------------------------------------------------------------------------- tables
def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value != value:
            return "n/a"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print(f"\n== {title}", flush=True)
    print(text_table(headers, rows), flush=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- BENCHMARKS.md
def _marker(name: str) -> tuple[str, str]:
    return f"<!-- section:{name} -->", f"<!-- /section:{name} -->"


def _placeholder(name: str) -> str:
    start, end = _marker(name)
    return f"{start}\n_Not measured yet: run `.venv/bin/python benchmarks/bench_{name}.py`._\n{end}"


HEADER_INTRO = """\
# torchspark benchmarks

Generated by `benchmarks/run_all.py` (each `benchmarks/bench_*.py` rewrites its own section when run alone).
Every number in a ratio is measured in the same run as its baseline, interleaved with it where that is cheap; the
machine is small (2 cores) and shared, so read ratios, not absolute samples/s, and expect about +-10% noise.

## How to reproduce

```bash
.venv/bin/python benchmarks/run_all.py            # everything, about 15 minutes on 2 cores; rewrites this file
.venv/bin/python benchmarks/run_all.py --quick    # smaller sizes and fewer repetitions (about 4 minutes)
.venv/bin/python benchmarks/bench_throughput.py [--quick] [--models mlp,lenet] [--methods ...] [--memory-format channels_last] [--no-write]
.venv/bin/python benchmarks/bench_throughput.py --models vgg,transformer   # the real-size rows (~40 minutes)
sudo .venv/bin/python benchmarks/bench_cluster.py --workload transformer --links 1gbit   # time to accuracy (~20 minutes)
.venv/bin/python benchmarks/run_all.py --only throughput_real_size,cluster_transformer   # both, in one run
.venv/bin/python benchmarks/bench_sharing.py [--quick]
.venv/bin/python benchmarks/bench_codec.py [--quick] [--n 10000000] [--reps 15]
.venv/bin/python benchmarks/bench_cluster.py [--quick] [--links 1gbit,100mbit] [--methods sharing,avg5,avg1,ddp] [--budget-s 300]
.venv/bin/python benchmarks/bench_checkpoint.py [--quick] [--methods spark_avg,spark_shared,pw_avg] [--reps 5]
```

The "cluster" section needs root and `ip netns` (it builds a 2-host Spark standalone cluster from network
namespaces); elsewhere it is skipped with the reason.

Raw numbers of the last run: `benchmarks/results/*.json`.
"""

CAVEATS = """\
## Caveats

- **2 shared cores.** All distributed runs put 2 workers on a 2-core VM, with 1 torch thread each, against a plain
  loop with 2 torch threads. Driver-side threads (Spark's JVM, progress server, ParallelWrapper's feeder,
  TorchDistributor's log pump) compete with the workers for the same 2 cores; on a real cluster they would not.
- **Noise.** Other processes ran on the machine at the same time (see the load averages). Ratios are medians over
  interleaved repetitions, each against the baseline measured in the same repetition; min-max ranges are given.
  Differences below ~10% are not significant.
- **Steady state by differencing.** Distributed throughputs are `k x N / (T(k+1 epochs) - T(1 epoch))`: the
  fixed per-call cost (Spark stage launch, process spawn, rendezvous, first-epoch warm-up) cancels out. That cost is
  reported separately ("per-call overhead") because for short fits it dominates.
- **Small models.** MLP 784-500-10 (0.40 M parameters) and LeNet (0.43 M) are communication-light but also
  compute-light: per-step latency of gloo collectives on loopback matters more than bandwidth.
"""


def _skeleton(info: dict[str, str] | None = None) -> str:
    parts = [HEADER_INTRO]
    if info:
        parts.append("## Machine\n\n" + markdown_table(["", ""], list(info.items())) + "\n")
    parts.append("## Targets\n\n" + TARGETS_START + "\n" + TARGETS_END + "\n")
    parts += [_placeholder(name) + "\n" for name in SECTIONS]
    parts.append(CAVEATS)
    parts.append("## Notes\n\n" + NOTES_START + "\n" + NOTES_END + "\n")
    return "\n".join(parts)


def _notes(text: str) -> str | None:
    m = re.search(re.escape(NOTES_START) + r"\n?(.*?)" + re.escape(NOTES_END), text, re.S)
    return m.group(1) if m else None


def reset_benchmarks_md(info: dict[str, str], names: Sequence[str] = SECTIONS) -> None:
    """Prepare BENCHMARKS.md for a run of the generated sections ``names`` (run_all).

    The machine block is replaced by ``info``; each section in ``names`` becomes a placeholder and its results JSON
    is removed (a crash leaves no stale figures). Everything else is kept as it is: the generated sections not run
    this time, and the hand-written sections (Scaling, Faults, Spark Connect, GPU, notes...), which an earlier
    version rebuilt from a skeleton and so lost.
    """
    old = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else ""
    machine = re.compile(r"## Machine\n.*?(?=## Targets\n)", re.S)
    if not machine.search(old):  # no file yet, or one this code did not write: start from the skeleton
        text = _skeleton(info)
        notes = _notes(old)
        if notes:
            text = text.replace(NOTES_START + "\n" + NOTES_END, NOTES_START + "\n" + notes + NOTES_END)
    else:
        block = "## Machine\n\n" + markdown_table(["", ""], list(info.items())) + "\n\n"
        text = machine.sub(lambda _: block, old, count=1)
        for name in names:
            start, end = _marker(name)
            pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
            text = pattern.sub(lambda _, n=name: _placeholder(n), text)
    BENCHMARKS_MD.write_text(text)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for name in names:
        stale = RESULTS_DIR / f"{name}.json"
        if stale.exists():
            stale.unlink()


def write_section(name: str, body: str, results: dict[str, Any]) -> None:
    """Replace section ``name`` of BENCHMARKS.md with ``body``, save ``results`` as JSON, refresh the targets."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else _skeleton()
    start, end = _marker(name)
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    elif "\n## Caveats" in text:  # a section new to this file goes after the others, before the caveats
        text = text.replace("\n## Caveats", "\n" + block + "\n\n## Caveats", 1)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS_MD.write_text(_with_targets(text))
    log(f"wrote section '{name}' of {BENCHMARKS_MD} and {RESULTS_DIR / (name + '.json')}")


def _with_targets(text: str) -> str:
    rows: list[list[Any]] = []
    for name in SECTIONS + LONG_SECTIONS + TARGET_RESULTS:
        path = RESULTS_DIR / f"{name}.json"
        if not path.exists():
            continue
        try:
            targets = json.loads(path.read_text()).get("targets", [])
        except json.JSONDecodeError:
            continue
        for t in targets:
            met = t.get("met")
            # a target may word its own verdict (e.g. "not shown to exceed" where the noise is wider than the target)
            verdict = t.get("verdict") or (
                "n/a (not measured)" if met is None else ("**met**" if met else "**not met**")
            )
            rows.append([name, t["target"], t.get("measured", ""), verdict])
    table = markdown_table(["benchmark", "target", "measured", "verdict"], rows) if rows else "_No results yet._"
    block = TARGETS_START + "\n" + table + "\n" + TARGETS_END
    pattern = re.compile(re.escape(TARGETS_START) + r".*?" + re.escape(TARGETS_END), re.S)
    return pattern.sub(lambda _: block, text) if pattern.search(text) else text


# ---------------------------------------------------------------------------------------------------- CPU accounting
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _system_busy_jiffies() -> int | None:
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is inside user)


def _tree_jiffies(root: int) -> int | None:
    """utime+stime+cutime+cstime of ``root`` and all its live descendants (reaped children count via cutime)."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2 :].split()  # fields after "(comm)": state ppid ...
        try:
            pid = int(entry)
            parents[pid] = int(rest[1])
            times[pid] = sum(int(v) for v in rest[11:15])  # utime stime cutime cstime
        except (ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


class CpuMeter:
    """CPU used during a measurement, in cores: all of it (/proc/stat) and this process tree's share; the rest
    ("foreign") is other work on the machine that competed with the benchmark."""

    def __enter__(self) -> CpuMeter:
        self._t0 = time.perf_counter()
        self._sys0 = _system_busy_jiffies()
        self._ours0 = _tree_jiffies(os.getpid())
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = max(time.perf_counter() - self._t0, 1e-9)
        sys1, ours1 = _system_busy_jiffies(), _tree_jiffies(os.getpid())
        if None in (self._sys0, self._ours0, sys1, ours1):
            self.total = self.ours = self.foreign = float("nan")
            return
        self.total = (sys1 - self._sys0) / _HZ / wall  # type: ignore[operator]
        self.ours = (ours1 - self._ours0) / _HZ / wall  # type: ignore[operator]
        self.foreign = max(0.0, self.total - self.ours)


def wait_for_quiet(max_foreign: float, max_wait_s: float, window_s: float = 0.3) -> float:
    """Sample the CPU other processes use, in windows of ``window_s``, until it is at most ``max_foreign`` cores
    or ``max_wait_s`` has passed; returns the last sample."""
    deadline = time.perf_counter() + max_wait_s
    while True:
        with CpuMeter() as cpu:
            time.sleep(window_s)
        if not cpu.foreign > max_foreign or time.perf_counter() >= deadline:
            return cpu.foreign


def src_fingerprint() -> str:
    """A short hash of every file under src/ (other people edit it while benchmarks run: detect that)."""
    import hashlib

    h = hashlib.sha1()
    for path in sorted((ROOT / "src").rglob("*.py")):
        try:
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
        except OSError:
            continue
    return h.hexdigest()[:12]


class SourceWatch:
    """Remembers the src/ fingerprint at the start; ``note()`` says whether src/ changed during the run."""

    def __init__(self) -> None:
        self.start = src_fingerprint()

    def note(self) -> str:
        end = src_fingerprint()
        if end == self.start:
            return f"Source tree (src/, fingerprint {end}) unchanged during the run."
        return (
            f"**Warning: src/ changed during this run** (fingerprint {self.start} -> {end}; other people were "
            "editing it), so some measurements may mix two versions of torchspark."
        )
