"""Run every benchmark and regenerate BENCHMARKS.md (machine info, date, versions, tables, targets).

Run: ``.venv/bin/python benchmarks/run_all.py [--quick] [--only throughput,sharing,codec]``

Each benchmark runs in its own Python process (its own Spark session and torch thread settings) and writes its own
section; a benchmark that crashes gets its error and output tail written into its section instead, and the others
still run. Hand-written notes in BENCHMARKS.md (between ``<!-- notes:start -->`` and ``<!-- notes:end -->``) are kept.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

#: section name -> (script, extra arguments)
SCRIPTS = {
    "throughput": ("bench_throughput.py", []),
    "throughput_channels_last": ("bench_throughput.py", ["--memory-format", "channels_last"]),
    "shuffle": ("bench_shuffle.py", []),
    "sharing": ("bench_sharing.py", []),
    "codec": ("bench_codec.py", []),
    # optional: runs only as root with `ip netns` (a namespace cluster); otherwise it writes a "skipped" section
    "cluster": ("bench_cluster.py", []),
    "checkpoint": ("bench_checkpoint.py", []),
    # not in the default run (C.LONG_SECTIONS): name them with --only
    "throughput_real_size": ("bench_throughput.py", ["--models", "vgg,transformer"]),
    "cluster_transformer": ("bench_cluster.py", ["--workload", "transformer", "--links", "1gbit"]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument(
        "--only",
        default=",".join(C.SECTIONS),
        help="comma-separated subset of "
        + ", ".join(C.SECTIONS + C.LONG_SECTIONS)
        + " (default: all but the last two)",
    )
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCRIPTS))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; known: {sorted(SCRIPTS)}")
    info = C.machine_info()
    if args.quick:
        info["mode"] = "--quick (smaller sizes, fewer repetitions: for development, not for conclusions)"
    C.reset_benchmarks_md(info, names)
    C.log(f"machine: {info}")
    t0 = time.perf_counter()
    durations: dict[str, float] = {}
    for name in names:
        script, extra = SCRIPTS[name]
        cmd = [sys.executable, os.path.join(C.BENCH_DIR, script), *extra] + (["--quick"] if args.quick else [])
        C.log(f"running {' '.join(cmd)}")
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=C.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            if "WARN" in line and ("Utils" in line or "NativeCodeLoader" in line):
                continue  # Spark's start-up chatter
            sys.stdout.write(line)
            sys.stdout.flush()
            tail = (tail + [line.rstrip()])[-25:]
        rc = proc.wait()
        durations[name] = time.perf_counter() - t
        if rc != 0:
            C.log(f"{name} failed with exit code {rc}")
            body = (
                f"## {name}\n\n**The benchmark failed** (exit code {rc}); last lines of its output:\n\n```\n"
                + "\n".join(tail)
                + "\n```\n"
            )
            C.write_section(name, body, {"error": f"exit code {rc}", "tail": tail, "targets": []})
    total = time.perf_counter() - t0
    summary = ", ".join(f"{n} {d / 60:.1f} min" for n, d in durations.items())
    C.log(f"all done in {total / 60:.1f} min ({summary})")
    text = C.BENCHMARKS_MD.read_text()
    marker = "## Targets\n"
    text = text.replace(marker, f"Total run time of `run_all.py`: {total / 60:.1f} min ({summary}).\n\n" + marker, 1)
    C.BENCHMARKS_MD.write_text(text)


if __name__ == "__main__":
    main()
