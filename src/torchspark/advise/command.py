"""``torchspark advise``: measure a model on this machine, estimate the exchange on a cluster, print the advice."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from torchspark.advise.cost_model import Advice, Link, Verdict, advise, estimate, parse_link
from torchspark.advise.measurement import Measurement, measure
from torchspark.errors import ConfigError

__all__ = ["add_parser", "cmd_advise", "report", "to_json"]


def add_parser(
    sub: Any,
    fmt: type[argparse.HelpFormatter],
    positive_int: Callable[[str], int],
    positive_float: Callable[[str], float],
    shape: Callable[[str], tuple[int, ...]],
) -> None:
    """Add the ``advise`` subcommand (the CLI's own argument converters are passed in)."""
    p = sub.add_parser(
        "advise",
        help="is Spark worth it for this model? measure, estimate, advise",
        formatter_class=fmt,
        allow_abbrev=False,
        description="Measure ms per iteration and parameter bytes of a model at a batch size on this machine (one "
        "worker), estimate the exchange cost for WORKERS workers on LINK links, dense and shared, and "
        "print which training master and averaging frequency to use, or to stay on one machine.",
    )
    p.add_argument("--model", default="lenet", choices=["lenet", "mlp"], help="zoo model to measure")
    p.add_argument("--model-path", default=None, help="measure a saved network (Network.save) instead of --model")
    p.add_argument(
        "--input-shape", type=shape, default=(1, 28, 28), help="shape of one example, e.g. 1,28,28 (MNIST) or 784"
    )
    p.add_argument("--classes", type=positive_int, default=10, help="zoo models: output classes")
    p.add_argument("--batch-size", type=positive_int, default=32, help="minibatch size per worker")
    p.add_argument("--num-workers", type=positive_int, default=4, help="workers on the cluster")
    p.add_argument("--link", default="1gbit", help="each worker's link speed: 100mbit, 1gbit, 10gbit, ...")
    p.add_argument("--latency-ms", type=float, default=0.1, help="one message's latency on that link")
    p.add_argument("--iterations", type=positive_int, default=20, help="timed iterations (median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    p.add_argument(
        "--threads", type=positive_int, default=None, help="torch threads, as one worker would have (default: torch's)"
    )
    p.add_argument(
        "--sparsity",
        type=positive_float,
        default=1e-3,
        help="gradient sharing: fraction of the entries per message in steady state (the default "
        "AdaptiveThreshold keeps it in [1e-4, 1e-2])",
    )
    p.add_argument(
        "--no-save-updater",
        action="store_true",
        help="averaging without the updater state (half the traffic with Adam)",
    )
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")


def _network(args: argparse.Namespace) -> Any:
    from torchspark import Network, models, optim

    if args.model_path:
        return Network.load(args.model_path)
    if args.model == "lenet":
        if len(args.input_shape) != 3:
            raise ConfigError(f"--input-shape {args.input_shape} for lenet must be channels,height,width (1,28,28)")
        c, h, w = args.input_shape
        module = models.lenet(c, args.classes, h, w)
    else:
        n_in = 1
        for d in args.input_shape:
            n_in *= d
        module = models.mlp(n_in, 128, args.classes)
    return Network(module, updater=optim.Adam(lr=1e-3), seed=0)  # Adam: the updater state averaging carries


def _batch(net: Any, args: argparse.Namespace) -> Any:
    """Random features of ``--input-shape`` and labels the network's loss takes."""
    import torch

    from torchspark import DataSet

    gen = torch.Generator().manual_seed(0)
    features = torch.rand((args.batch_size, *args.input_shape), generator=gen)
    if args.model == "mlp" and not args.model_path:
        features = features.flatten(1)
    try:
        outputs = net.output(features[:2])
    except Exception as e:  # a shape mismatch from the user's module: say which option to fix
        raise ConfigError(
            f"the network does not take inputs of shape {tuple(features.shape[1:])}: {e}; set "
            "--input-shape to the shape of one example"
        ) from e
    loss = net.losses[0]
    if loss.classification:
        labels = torch.randint(0, outputs.shape[1], (args.batch_size,), generator=gen)
    else:
        labels = torch.rand((args.batch_size, *outputs.shape[1:]), generator=gen)
    return DataSet(features, labels)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _master_line(advice: Advice, batch_size: int) -> str:
    if advice.verdict is Verdict.GRADIENT_SHARING:
        return f"SharedTrainingMaster(batch_size_per_worker={batch_size}, num_workers={advice.num_workers})"
    if advice.verdict is Verdict.PARAMETER_AVERAGING:
        return (
            f"ParameterAveragingTrainingMaster(batch_size_per_worker={batch_size}, "
            f"num_workers={advice.num_workers}, averaging_frequency={advice.averaging_frequency})"
        )
    return "ParallelWrapper(network, num_workers=<cores or GPUs of this machine>) -- or plain Network.fit"


def report(m: Measurement, advice: Advice, link: Link, name: str, save_updater: bool) -> str:
    """The text ``torchspark advise`` prints."""
    workload = m.workload()
    lines = [
        f"torchspark advise: {name}, batch {m.batch_size} per worker, {advice.num_workers} workers on "
        f"{link.bits_per_second / 1e9:g} Gbit/s links (latency {link.latency_s * 1e3:g} ms)",
        f"measured on one worker ({m.threads} threads, median of {m.iterations}): {m.ms_per_iteration:.3g} ms per "
        f"iteration; {m.num_params:,} parameters = {_size(m.param_bytes)} (updater state "
        f"{_size(m.updater_state_bytes)}); gradient-sharing message {_size(m.shared_bytes_per_step)} per step at "
        f"sparsity {m.sparsity:g} "
        f"({m.param_bytes / m.shared_bytes_per_step:,.0f}x smaller than dense), encode+decode {m.encode_ms:.3g} ms",
        f"estimated per iteration on {advice.num_workers} workers (no overlap of exchange and compute):",
    ]
    for e in estimate(workload, advice.num_workers, link, save_updater):
        label = {"shared": "gradient sharing", "dense_every_step": "dense all-reduce every step (DDP-like)"}.get(
            e.name, f"parameter averaging, every {e.averaging_frequency}"
        )
        lines.append(
            f"  {label:<40} exchange {e.exchange_seconds_per_iteration * 1e3:9.3g} ms   speedup {e.speedup:5.2f}x"
        )
    lines += [
        f"DL4J's guidance: {advice.dl4j_guidance}",
        f"advice: {advice.verdict.value}",
        f"  {_master_line(advice, m.batch_size)}",
    ]
    lines += [f"  because {r}" for r in advice.reasons]
    return "\n".join(lines)


def to_json(m: Measurement, advice: Advice, link: Link, save_updater: bool) -> dict[str, Any]:
    return {
        "measurement": dataclasses.asdict(m),
        "link": {"bits_per_second": link.bits_per_second, "latency_s": link.latency_s},
        "num_workers": advice.num_workers,
        "save_updater": save_updater,
        "estimates": [dataclasses.asdict(e) for e in estimate(m.workload(), advice.num_workers, link, save_updater)],
        "advice": {
            "verdict": advice.verdict.name,
            "text": advice.verdict.value,
            "averaging_frequency": advice.averaging_frequency,
            "dl4j_guidance": advice.dl4j_guidance,
            "reasons": advice.reasons,
        },
    }


def cmd_advise(args: argparse.Namespace) -> int:
    import torch

    if args.latency_ms < 0:
        raise ConfigError(f"--latency-ms must be >= 0, got {args.latency_ms}")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {args.warmup}")
    link = Link(parse_link(args.link), args.latency_ms / 1e3)
    previous = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        net = _network(args)
        m = measure(net, _batch(net, args), iterations=args.iterations, warmup=args.warmup, sparsity=args.sparsity)
    finally:
        torch.set_num_threads(previous)
    save_updater = not args.no_save_updater
    advice = advise(m.workload(), args.num_workers, link, save_updater)
    name = args.model_path or args.model
    if args.json:
        print(json.dumps(to_json(m, advice, link, save_updater), indent=2))
    else:
        print(report(m, advice, link, name, save_updater))
    return 0
