"""Per-step microprofile of one gradient-sharing worker: where the milliseconds of a step go, 1 torch thread.

Run: ``.venv/bin/python benchmarks/profile_sharing_step.py [--steps 400] [--model mlp|lenet] [--clock wall|cpu]`` (about 20 s).
Prints a table only (nothing is written).

Two copies of the same network (MLP 784-500-10 or LeNet, Adam lr 1e-3, batch 32, the throughput benchmark's
``AdaptiveThreshold(initial=1e-2)``) train on the same minibatches, step by step interleaved, so machine load hits
both alike:

- ``reference``: the unfused steps (``Network.compute_update``, divergence check on two ``torch.norm``,
  ``encode_step(update)``, ``to_bytes``, the dense exchange (``rounds.parse_gathered`` + ``rounds.dense_sum``:
  ``from_bytes`` + decode of every message into a zeroed buffer), ``net.apply_update``);
- ``fused``: what the training loop runs (``fused.step_into_residual``: the updater's step lands in the residual
  directly (``fused.train_step_into``), the divergence norms from two dot products, ``encode_step(None)``,
  ``to_bytes``, ``rounds.round_from_gathered``: the sum kept at the sent indices only, ``net.apply_update_at``).

The exchange gathers ``--num-workers`` copies of this worker's own payload (what a peer's message costs to decode; no
transport). The direct step adds each update without the rounding of ``p - (p - u)``, so the two copies drift apart
(threshold encoding amplifies last-bit differences); the largest differences are printed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

import torch


class _EchoComm:
    """A communicator double whose all-gather returns ``workers`` copies of the caller's payload."""

    def __init__(self, workers: int) -> None:
        self.rank, self.world_size, self.workers = 0, workers, workers

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        return [payload] * self.workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--model", choices=("mlp", "lenet"), default="mlp")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: this thread's CPU time (time.thread_time), which a busy machine inflates far less "
        "than wall time (use it when other work runs)",
    )
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)

    import torchspark as ts
    from torchspark import datasets, models, optim
    from torchspark.data import DataSet
    from torchspark.encoding import AdaptiveThreshold, EncoderConfig, EncoderState, encode_step, to_bytes
    from torchspark.training.algorithms.sharing.fused import step_into_residual
    from torchspark.training.algorithms.sharing.loop import _apply
    from torchspark.training.algorithms.sharing.rounds import Round, dense_sum, parse_gathered, round_from_gathered
    from torchspark.training.algorithms.sharing.state import SharingState
    from torchspark.training.algorithms.sharing.step import report_divergence

    n = 32 * (args.steps + args.warmup)
    data = datasets.synthetic_images(n, 1, 28, 28, n_classes=10, seed=0)
    if args.model == "mlp":
        data = DataSet(data.features.reshape(n, 784).contiguous(), data.labels)
    batches = [DataSet(b.features.clone(), b.labels.clone()) for b in data.split(32)]
    config = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-2))
    comm = _EchoComm(args.num_workers)

    def build() -> tuple[ts.Network, SharingState]:
        module = models.mlp(784, 500, 10) if args.model == "mlp" else models.lenet(1, 10, 28, 28)
        net = ts.Network(module, loss="cross_entropy", updater=optim.Adam(lr=1e-3), seed=0)
        return net, SharingState(EncoderState.create(config, net.num_params()))

    times: dict[str, dict[str, list[float]]] = {"reference": defaultdict(list), "fused": defaultdict(list)}

    def reference(net: ts.Network, st: SharingState, batch: DataSet, keep: bool) -> None:
        marks = [("start", clock())]
        step = net.iteration
        update = net.compute_update(batch)
        marks.append(("compute_update (train_step + copies)", clock()))
        report_divergence(st, net, float(update.norm()), float(net.params_view().norm()), step, "fail")
        marks.append(("divergence norms", clock()))
        message, st.encoder = encode_step(update, st.encoder, step)
        marks.append(("encode_step", clock()))
        payload = b"\x01" + to_bytes(message)
        marks.append(("to_bytes", clock()))
        active, messages = parse_gathered(comm.all_gather_bytes(payload), net.num_params())
        result = Round(active, dense_sum(messages, net.num_params(), "cpu"))
        marks.append(("exchange: parse + decode", clock()))
        _apply(net, result)
        marks.append(("apply", clock()))
        _record(times["reference"], marks, keep)

    def fused(net: ts.Network, st: SharingState, batch: DataSet, keep: bool) -> None:
        marks = [("start", clock())]
        step = net.iteration
        norms = step_into_residual(st, net, batch, False)
        marks.append(("compute_update (train_step + copies)", clock()))
        report_divergence(st, net, *norms, step, "fail")
        marks.append(("divergence norms", clock()))
        message, st.encoder = encode_step(None, st.encoder, step)
        marks.append(("encode_step", clock()))
        payload = b"\x01" + to_bytes(message)
        marks.append(("to_bytes", clock()))
        result = round_from_gathered(comm.all_gather_bytes(payload), net.num_params(), "cpu")
        marks.append(("exchange: parse + decode", clock()))
        _apply(net, result)
        marks.append(("apply", clock()))
        _record(times["fused"], marks, keep)

    (ref_net, ref_state), (fused_net, fused_state) = build(), build()
    plain_net = build()[0]
    plain: list[float] = []
    for i, batch in enumerate(batches):
        keep = i >= args.warmup
        if i % 2:  # alternate the order, so neither path always runs on the other's cache
            fused(fused_net, fused_state, batch, keep)
            reference(ref_net, ref_state, batch, keep)
        else:
            reference(ref_net, ref_state, batch, keep)
            fused(fused_net, fused_state, batch, keep)
        t0 = clock()
        plain_net.train_step(batch)
        if keep:
            plain.append(clock() - t0)
    param_diff = float((ref_net.params() - fused_net.params()).abs().max())
    residual_diff = float((ref_state.encoder.residual - fused_state.encoder.residual).abs().max())

    print(
        f"{args.model}, {args.num_workers} messages per exchange, {args.steps} steps, 1 thread, {args.clock} clock; "
        f"load average {' / '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    print(f"{'component (median ms per step)':40s} {'reference':>10s} {'fused':>10s}")
    for name in times["reference"]:
        ref, fus = (statistics.median(times[k][name]) * 1e3 for k in ("reference", "fused"))
        print(f"{name:40s} {ref:10.3f} {fus:10.3f}")
    ref_total, fused_total = (statistics.median(map(sum, zip(*times[k].values()))) * 1e3 for k in times)
    print(f"{'total':40s} {ref_total:10.3f} {fused_total:10.3f}")
    print(f"{'plain train_step (no sharing)':40s} {statistics.median(plain) * 1e3:10.3f}")
    print(
        f"largest difference fused vs reference after {len(batches)} steps: parameters {param_diff:.3g}, "
        f"residuals {residual_diff:.3g} (the fused step adds the update into the residual directly, without the "
        "rounding of (p - (p - u)))"
    )


def _record(into: dict[str, list[float]], marks: list[tuple[str, float]], keep: bool) -> None:
    if keep:
        for (_, t0), (name, t1) in zip(marks, marks[1:]):
            into[name].append(t1 - t0)


if __name__ == "__main__":
    main()
