"""The checks of ``benchmarks/gpu_check.py`` (see its docstring for what each one shows).

Every check is a function of a :class:`Context` returning rows (``row(...)``: check, device, status, result text,
figures); :data:`CHECKS` is the registry, in the order they run, with the names of the rows each one writes (so a
check that raises still leaves one ``error`` row per name). Statuses: ``pass``, ``fail``, ``error``, ``n/a`` (the API
this check needs is not in this build), ``skipped`` (time budget).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchspark import DataSet, Network, ParameterAveragingTrainingMaster, SharedTrainingMaster, models, optim
from torchspark.encoding import decode, from_bytes, threshold_encode, to_bytes

__all__ = ["Context", "Check", "CHECKS", "row", "exact_float32"]

#: parameters of a float32 fit on two devices (or compiled vs eager) agree within this (TF32 off: what differs is
#: the summation order inside the matrix products, ~1e-7 relative per step)
FIT_TOLERANCE = 1e-4
#: gradient accumulation vs one large batch (the issue's bound)
ACCUMULATION_TOLERANCE = 1e-5


@dataclasses.dataclass
class Context:
    """Where and how big: the device, ``--quick``, and the time budget."""

    device: str
    quick: bool
    budget_s: float
    start: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def pick(self, quick: Any, cpu: Any, gpu: Any) -> Any:
        """A size: ``quick`` with --quick, else ``gpu`` on CUDA and ``cpu`` without."""
        return quick if self.quick else gpu if self.cuda else cpu

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


@dataclasses.dataclass(frozen=True)
class Check:
    rows: tuple[str, ...]
    run: Callable[[Context], list[dict[str, Any]]]


def row(check: str, device: str, status: str, result: str, **figures: Any) -> dict[str, Any]:
    return {"check": check, "device": device, "status": status, "result": result, "figures": figures}


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """TF32 off for the matrix products and convolutions (its 10-bit mantissa would swamp the comparisons)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# ------------------------------------------------------------------ helpers
def _data(n: int, features: int, classes: int, seed: int = 0) -> DataSet:
    """A learnable classification problem: labels from a fixed random linear map of Gaussian features."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    return DataSet(x, (x @ w).argmax(dim=1))


def _net(device: str, features: int, hidden: int, classes: int, lr: float = 0.01, **options: Any) -> Network:
    """A deterministic MLP trained with plain SGD (no state, no randomness in the step). A small learning rate keeps
    the comparisons well conditioned: at 0.05 a 1e-7 relative nudge of the start could grow to 1e-5 after 128 steps
    (a ReLU flipping on one example), at 0.01 it stayed under 1e-7 (measured on this MLP and data)."""
    return Network(
        models.mlp(features, [hidden, hidden], classes), updater=optim.SGD(lr=lr), seed=0, device=device, **options
    )


def _accepts(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().cpu().double() - b.detach().cpu().double()).abs().max())


def _verdict(ok: bool) -> str:
    return "pass" if ok else "fail"


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit (so -0.0 != 0.0 and NaN payloads count)."""
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _time(ctx: Context, fn: Callable[[], object], setup: Callable[[], object], reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs, each after an untimed ``setup``; CUDA events on a GPU."""
    setup()
    fn()  # warm-up: kernels loaded, caches sized
    times = []
    for _ in range(reps):
        setup()
        ctx.sync()
        if ctx.cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------------ a. fit on the device vs on the CPU
def fit_device_vs_cpu(ctx: Context) -> list[dict[str, Any]]:
    n, hidden = ctx.pick(256, 1024, 4096), ctx.pick(32, 64, 256)
    data = _data(n, 32, 10)
    nets = {}
    for device in (ctx.device, "cpu"):
        nets[device] = _net(device, 32, hidden, 10).fit(data, epochs=2, batch_size=64)
    diff = _max_diff(nets[ctx.device].params(), nets["cpu"].params())
    moved = _max_diff(nets["cpu"].params(), _net("cpu", 32, hidden, 10).params())
    ok = diff <= FIT_TOLERANCE and moved > 0
    return [
        row(
            "fit_device_vs_cpu",
            ctx.device,
            _verdict(ok),
            f"max abs param diff {diff:.2e} (tolerance {FIT_TOLERANCE:g}) after {2 * n // 64} SGD steps"
            + ("" if ctx.cuda else "; cpu vs cpu: no CUDA"),
            max_abs_diff=diff,
            tolerance=FIT_TOLERANCE,
            steps=2 * n // 64,
            examples=n,
            hidden=hidden,
        )
    ]


# ------------------------------------------------------------------ b. the codec on the device, bit for bit the CPU's
CODEC_CASES = (("sparse ~0.1%", 3.29), ("sparse ~1%", 2.576), ("bitmap ~20%", 1.28))  # thresholds on N(0, 1) data


def _encode_both(ctx: Context, update: torch.Tensor, residual: torch.Tensor, threshold: float) -> dict[str, Any]:
    """One encode (with the update) and one flush (without) on the CPU and on the device; what differs."""
    force = not ctx.cuda  # without CUDA: the generic torch kernels (what CUDA runs) against the CPU's numpy path
    cpu_res, dev_res = residual.clone(), residual.to(ctx.device)
    out: dict[str, Any] = {}
    for step, upd in (("encode", update), ("flush", None)):
        m_cpu = threshold_encode(upd, cpu_res, threshold)
        m_dev = threshold_encode(None if upd is None else upd.to(ctx.device), dev_res, threshold, _force_torch=force)
        wire_cpu, wire_dev = to_bytes(m_cpu), to_bytes(m_dev)
        dec_cpu = decode(m_cpu, torch.zeros(len(update)))
        dec_dev = decode(m_dev, torch.zeros(len(update), device=ctx.device), _force_torch=force)
        dec_wire = decode(from_bytes(wire_cpu), torch.zeros(len(update), device=ctx.device), _force_torch=force)
        out[step] = {
            "format": m_cpu.format,
            "entries": m_cpu.num_entries,
            "bytes_equal": wire_cpu == wire_dev,
            "residual_equal": _bits_equal(cpu_res, dev_res),
            "decoded_equal": _bits_equal(dec_cpu, dec_dev),
            "decoded_from_cpu_bytes_equal": _bits_equal(dec_cpu, dec_wire),
        }
    return out


def codec_bit_equal(ctx: Context) -> list[dict[str, Any]]:
    n = ctx.pick(100_000, 1_000_000, 4_000_000)
    g = torch.Generator().manual_seed(1)
    cases = {}
    for name, threshold in CODEC_CASES:
        update, residual = torch.randn(n, generator=g), torch.randn(n, generator=g) * 0.3
        cases[name] = _encode_both(ctx, update, residual, threshold)
    equal = all(v for case in cases.values() for step in case.values() for k, v in step.items() if k.endswith("equal"))
    formats = ", ".join(f"{name}: {c['encode']['format']} {c['encode']['entries']}" for name, c in cases.items())
    what = "CUDA vs CPU" if ctx.cuda else "torch kernels vs numpy (no CUDA)"
    return [
        row(
            "codec_bit_equal",
            ctx.device,
            _verdict(equal),
            f"{what}, N={n:,}: bytes, residual, decoded {'bit-equal' if equal else 'DIFFER'} ({formats})",
            n=n,
            cases=cases,
        )
    ]


# ------------------------------------------------------------------ c. codec throughput vs the device's copy
def codec_throughput(ctx: Context) -> list[dict[str, Any]]:
    threads = torch.get_num_threads()
    if not ctx.cuda:  # one thread on a CPU, as bench_codec.py: the codec's CPU path is single-threaded numpy
        torch.set_num_threads(1)
    try:
        return _codec_throughput(ctx)
    finally:
        torch.set_num_threads(threads)


def _codec_throughput(ctx: Context) -> list[dict[str, Any]]:
    n = ctx.pick(1_000_000, 4_000_000, 20_000_000)
    reps = ctx.pick(3, 5, 20)
    g = torch.Generator().manual_seed(2)
    update = torch.randn(n, generator=g).to(ctx.device)
    residual, out, dst = torch.zeros_like(update), torch.zeros_like(update), torch.empty_like(update)
    gb = 4 * n / 1e9  # bytes of the float32 update
    copy_s = _time(ctx, lambda: dst.copy_(update), lambda: None, reps)
    rows = []
    for label, density, threshold in (("0.1pct", 1e-3, 3.2905), ("1pct", 1e-2, 2.5758)):  # two-sided N(0,1) tails
        enc_s = _time(ctx, lambda t=threshold: threshold_encode(update, residual, t), residual.zero_, reps)
        residual.zero_()
        message = threshold_encode(update, residual, threshold)
        dec_s = _time(ctx, lambda m=message: decode(m, out), out.zero_, reps)
        got = message.density
        figures = {
            "n": n,
            "reps": reps,
            "copy_gbps": gb / copy_s,
            "encode_gbps": gb / enc_s,
            "decode_gbps": gb / dec_s,
            "encode_vs_copy": copy_s / enc_s,
            "decode_vs_copy": copy_s / dec_s,
            "density": got,
            "format": message.format,
            "encode_ms": enc_s * 1e3,
            "decode_ms": dec_s * 1e3,
            "copy_ms": copy_s * 1e3,
        }
        ok = density / 2 <= got <= density * 2
        rows.append(
            row(
                f"codec_throughput_{label}",
                ctx.device,
                _verdict(ok),
                f"N={n / 1e6:g}M density {got:.2%}: encode {gb / enc_s:.1f} GB/s ({copy_s / enc_s:.3f}x copy), "
                f"decode {gb / dec_s:.1f} GB/s ({copy_s / dec_s:.3f}x copy); copy {gb / copy_s:.1f} GB/s",
                **figures,
            )
        )
    return rows


# ------------------------------------------------------------------ d. ParallelWrapper with workers on the GPU(s)
def _worker_devices(ctx: Context) -> list[str]:
    if not ctx.cuda:
        return ["cpu", "cpu"]
    gpus = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(gpus)] if gpus >= 2 else [ctx.device, ctx.device]


def _wrapper_fit(master: Any, devices: list[str], data: DataSet, hidden: int) -> tuple[Network, Any]:
    from torchspark.parallel import ParallelWrapper

    net = _net("cpu", 32, hidden, 4)
    wrapper = ParallelWrapper(net, master=master, devices=devices, progress=False)
    wrapper.fit(data, epochs=2)
    return net, wrapper


def parallel(ctx: Context) -> list[dict[str, Any]]:
    from torchspark.parallel.bootstrap import backend_for_devices

    devices = _worker_devices(ctx)
    backend = backend_for_devices(devices)
    n, hidden = ctx.pick(256, 512, 4096), ctx.pick(32, 32, 256)
    data = _data(n, 32, 4, seed=3)
    start = _net("cpu", 32, hidden, 4).params()
    rows = []
    masters = {
        "averaging": ParameterAveragingTrainingMaster(batch_size_per_worker=32, averaging_frequency=2),
        "sharing": SharedTrainingMaster(batch_size_per_worker=32),
    }
    for mode, master in masters.items():
        t0 = time.perf_counter()
        net, wrapper = _wrapper_fit(master, devices, data, hidden)
        seconds = time.perf_counter() - t0
        sums = {r.param_checksum for r in wrapper.last_results}
        moved = _max_diff(net.params(), start)
        figures: dict[str, Any] = {
            "devices": devices,
            "backend": backend,
            "replicas_identical": len(sums) == 1,
            "moved": moved,
            "score": float(wrapper.score),
            "fit_seconds": seconds,
        }
        ok = len(sums) == 1 and moved > 0 and torch.isfinite(net.params()).all().item()
        text = f"{len(devices)} workers on {','.join(devices)} over {backend}; replicas identical: {len(sums) == 1}"
        if mode == "averaging" and ctx.cuda:  # the same fit with CPU workers: equal within float tolerance
            reference, _ = _wrapper_fit(master, ["cpu", "cpu"], data, hidden)
            diff = _max_diff(net.params(), reference.params())
            figures.update(max_abs_diff_vs_cpu_workers=diff, tolerance=FIT_TOLERANCE)
            ok = ok and diff <= FIT_TOLERANCE
            text += f"; max abs diff vs CPU workers {diff:.2e}"
        rows.append(row(f"parallel_{mode}", ctx.device, _verdict(bool(ok)), text, **figures))
    return rows


# ------------------------------------------------------------------ e. precision, accumulation, compile
def _precision_row(ctx: Context, precision: str, data: DataSet, hidden: int, reference: Network) -> dict[str, Any]:
    name = f"precision_{precision}"
    if not _accepts(Network.__init__, "precision"):
        return row(name, ctx.device, "n/a", "not available in this build (Network has no precision=)")
    try:
        net = _net(ctx.device, 32, hidden, 10, precision=precision)
    except (TypeError, ValueError) as e:  # ConfigError is a ValueError: this precision on this device is refused
        return row(name, ctx.device, "n/a", f"refused here: {e}"[:300])
    net.fit(data, epochs=2, batch_size=64)
    loss, ref_loss = net.score(data), reference.score(data)
    diff = _max_diff(net.params(), reference.params())
    ok = bool(torch.isfinite(net.params()).all()) and abs(loss - ref_loss) <= 0.05 + 0.1 * ref_loss
    return row(
        name,
        ctx.device,
        _verdict(ok),
        f"loss {loss:.4f} vs fp32 {ref_loss:.4f}; max abs param diff vs fp32 {diff:.2e}",
        loss=loss,
        fp32_loss=ref_loss,
        max_abs_diff_vs_fp32=diff,
    )


def precision(ctx: Context) -> list[dict[str, Any]]:
    n, hidden = ctx.pick(256, 1024, 4096), ctx.pick(32, 64, 256)
    data = _data(n, 32, 10, seed=4)
    reference = _net(ctx.device, 32, hidden, 10).fit(data, epochs=2, batch_size=64)
    return [_precision_row(ctx, p, data, hidden, reference) for p in ("bf16", "fp16")]


def _accumulation_fit(ctx: Context, data: DataSet, hidden: int) -> dict[str, Any]:
    if not _accepts(Network.fit, "accumulate_steps"):
        return row("accumulation_fit", ctx.device, "n/a", "not available in this build (fit has no accumulate_steps=)")
    small = _net(ctx.device, 32, hidden, 10).fit(data, epochs=1, batch_size=16, accumulate_steps=4)
    large = _net(ctx.device, 32, hidden, 10).fit(data, epochs=1, batch_size=64)
    diff = _max_diff(small.params(), large.params())
    ok = diff <= ACCUMULATION_TOLERANCE and small.iteration == large.iteration
    return row(
        "accumulation_fit",
        ctx.device,
        _verdict(ok),
        f"4 x 16 accumulated vs one batch of 64: max abs diff {diff:.2e} "
        f"(tolerance {ACCUMULATION_TOLERANCE:g}); "
        f"{small.iteration} vs {large.iteration} steps",
        max_abs_diff=diff,
        tolerance=ACCUMULATION_TOLERANCE,
        steps=small.iteration,
    )


def _accumulation_masters(ctx: Context, data: DataSet, hidden: int) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(ParameterAveragingTrainingMaster)}
    if "accumulate_steps" not in fields:
        return row(
            "accumulation_masters",
            ctx.device,
            "n/a",
            "not available in this build (no accumulate_steps on the masters)",
        )
    from torchspark.parallel import ParallelWrapper

    local = _net(ctx.device, 32, hidden, 10).fit(data, epochs=1, batch_size=16, accumulate_steps=4)
    figures: dict[str, Any] = {}
    ok = True
    masters = (
        ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2, accumulate_steps=4),
        SharedTrainingMaster(batch_size_per_worker=16, accumulate_steps=4),
    )
    for master in masters:
        net = _net("cpu", 32, hidden, 10)
        ParallelWrapper(net, master=master, devices=[ctx.device], progress=False).fit(data, epochs=1)
        finite = bool(torch.isfinite(net.params()).all())
        figures[master.kind] = {"iterations": net.iteration, "finite": finite}
        ok = ok and finite and net.iteration == local.iteration
        if master.kind == "averaging":  # one worker: averaging is the identity, so this is Network.fit
            diff = _max_diff(net.params(), local.params())
            figures[master.kind]["max_abs_diff_vs_fit"] = diff
            ok = ok and diff <= FIT_TOLERANCE
    diff_text = f"{figures['averaging']['max_abs_diff_vs_fit']:.2e}"
    return row(
        "accumulation_masters",
        ctx.device,
        _verdict(ok),
        f"accumulate_steps=4, one worker: averaging vs Network.fit max abs diff {diff_text}; sharing ran "
        f"({figures['sharing']['iterations']} steps)",
        **figures,
    )


def accumulation(ctx: Context) -> list[dict[str, Any]]:
    n, hidden = ctx.pick(256, 1024, 4096), ctx.pick(32, 64, 256)
    data = _data(n, 32, 10, seed=5)
    return [_accumulation_fit(ctx, data, hidden), _accumulation_masters(ctx, data, hidden)]


def compile_check(ctx: Context) -> list[dict[str, Any]]:
    if not _accepts(Network.__init__, "compile"):
        return [row("compile", ctx.device, "n/a", "not available in this build (Network has no compile=)")]
    n, hidden = ctx.pick(256, 1024, 8192), ctx.pick(32, 64, 512)
    data = _data(n, 32, 10, seed=6)
    backend: bool | str = True if ctx.cuda else "aot_eager"  # aot_eager: no C++ compiler needed on a CPU
    seconds = {}
    nets = {}
    for label, option in (("eager", False), ("compiled", backend)):
        net = _net(ctx.device, 32, hidden, 10, compile=option)
        t0 = time.perf_counter()
        net.fit(data, epochs=1, batch_size=64)  # the compiled one compiles here
        ctx.sync()
        t1 = time.perf_counter()
        net.fit(data, epochs=1, batch_size=64)
        ctx.sync()
        seconds[label] = (t1 - t0, time.perf_counter() - t1)
        nets[label] = net
    net = nets["compiled"]
    diff = _max_diff(net.params(), nets["eager"].params())
    flat = net.params_view().untyped_storage().data_ptr()
    views = all(p.untyped_storage().data_ptr() == flat for p in net.module.parameters()) and torch.equal(
        net.params(), torch.cat([p.detach().reshape(-1) for p in net.module.parameters()])
    )
    speedup = seconds["eager"][1] / seconds["compiled"][1]
    return [
        row(
            "compile",
            ctx.device,
            _verdict(diff <= FIT_TOLERANCE and views),
            f"compile={backend!r}: max abs diff vs eager {diff:.2e}; flat views intact: {views}; second epoch "
            f"{speedup:.2f}x eager (first, with compilation: {seconds['compiled'][0]:.1f} s)",
            backend=backend,
            max_abs_diff=diff,
            tolerance=FIT_TOLERANCE,
            flat_views_intact=views,
            first_epoch_s={k: v[0] for k, v in seconds.items()},
            second_epoch_s={k: v[1] for k, v in seconds.items()},
            second_epoch_speedup=speedup,
        )
    ]


# ------------------------------------------------------------------ f. pinned memory in the worker's prefetcher
def _pinned_handouts(ctx: Context) -> int | None:
    if not ctx.cuda or not hasattr(torch.cuda, "host_memory_stats"):
        return None
    torch.cuda.init()  # host_memory_stats() is empty until torch.cuda is initialised (pinning alone does not)
    torch.empty(1).pin_memory()  # nor before the pinned allocator's first allocation
    stats = torch.cuda.host_memory_stats()
    for key in ("active_requests.allocated", "allocations.allocated", "allocated.allocated", "num_host_alloc"):
        if key in stats:
            return int(stats[key])
    return None


def pinned_memory(ctx: Context) -> list[dict[str, Any]]:
    from torchspark.nn import NetworkBlueprint
    from torchspark.training import ItemSource, WorkerTask
    from torchspark.training.comm import SoloCommunicator
    from torchspark.training.worker.loop import run_worker

    features, batch, batches = ctx.pick(256, 512, 4096), ctx.pick(64, 256, 1024), ctx.pick(8, 16, 96)
    epochs, reps = ctx.pick(1, 2, 3), ctx.pick(1, 2, 3)
    data = _data(batch * batches, features, 10, seed=7).split(batch)
    blueprint = NetworkBlueprint.of(_net("cpu", features, 256, 10)).to_bytes()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    handed: dict[str, int | None] = {}
    params: dict[str, torch.Tensor] = {}
    order = (("off", False), ("on", None))
    for rep in range(reps + 1):  # the first round warms up (CUDA context, cuBLAS handles, the host allocator)
        for label, option in order if rep % 2 else order[::-1]:
            task = WorkerTask(
                "averaging",
                {"averaging_frequency": 4, "save_updater": True},
                blueprint,
                epochs=epochs,
                prefetch=2,
                pin_memory=option,
            )
            before = _pinned_handouts(ctx)
            t0 = time.perf_counter()
            result = run_worker(task, ItemSource(data), SoloCommunicator(), device=ctx.device)
            ctx.sync()
            seconds = time.perf_counter() - t0
            after = _pinned_handouts(ctx)
            handed[label] = None if before is None or after is None else after - before
            params[label] = result.params
            if rep:
                rates[label].append(batch * batches * epochs / seconds)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    same = params["on"] is not None and params["off"] is not None and _bits_equal(params["on"], params["off"])
    # other host-to-device copies (the updater's scalars) take pinned buffers too: compare with the unpinned run
    extra = None if handed["on"] is None or handed["off"] is None else handed["on"] - handed["off"]
    ok = same and (extra is not None and extra >= batches * epochs if ctx.cuda else True)
    note = (
        f"{extra} more pinned buffers than without ({batches * epochs} minibatches)"
        if ctx.cuda
        else "CPU: nothing is pinned (pin_memory needs CUDA)"
    )
    return [
        row(
            "pinned_memory",
            ctx.device,
            _verdict(ok),
            f"worker fit {on:,.0f} samples/s pinned vs {off:,.0f} not ({on / off:.2f}x); {note}; same params: {same}",
            samples_per_s_pinned=on,
            samples_per_s_unpinned=off,
            ratio=on / off,
            pinned_handouts=handed,
            extra_pinned_handouts=extra,
            same_params=same,
            batch=batch,
            features=features,
            batches=batches,
            epochs=epochs,
            reps=reps,
            batch_mb=batch * features * 4 / 1e6,
        )
    ]


CHECKS: dict[str, Check] = {
    "fit_device_vs_cpu": Check(("fit_device_vs_cpu",), fit_device_vs_cpu),
    "codec_bit_equal": Check(("codec_bit_equal",), codec_bit_equal),
    "codec_throughput": Check(("codec_throughput_0.1pct", "codec_throughput_1pct"), codec_throughput),
    "parallel": Check(("parallel_averaging", "parallel_sharing"), parallel),
    "precision": Check(("precision_bf16", "precision_fp16"), precision),
    "accumulation": Check(("accumulation_fit", "accumulation_masters"), accumulation),
    "compile": Check(("compile",), compile_check),
    "pinned_memory": Check(("pinned_memory",), pinned_memory),
    "checkpoint_resume": Check(("checkpoint_resume",), lambda ctx: _resume_check(ctx)),
}


def _resume_check(ctx: Context) -> list[dict[str, Any]]:
    from _gpu_resume_check import checkpoint_resume

    return checkpoint_resume(ctx)
