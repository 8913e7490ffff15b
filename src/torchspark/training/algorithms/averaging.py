"""Synchronous parameter averaging (DL4J's ParameterAveragingTrainingMaster), as a worker loop.

Each round:
  1. every worker takes up to ``averaging_frequency`` optimizer steps on its own data, from the common parameters
     (one per minibatch, or per group of ``accumulate_steps`` minibatches: `torchspark.data.groups`);
  2. one all-reduce sums ``[params * n, updater_state * n, buffers * n, n, score * n, active]`` over workers,
     where ``n`` is the number of examples the worker fitted this round and ``buffers`` the module's
     floating-point buffers (BatchNorm running statistics);
  3. every worker sets ``params = sum(params * n) / sum(n)`` (likewise the buffers, and the updater state when
     ``save_updater``, else resets it): the example-weighted mean, so uneven rounds are weighted fairly.
Integer buffers (BatchNorm's ``num_batches_tracked``) are not averaged: they count a worker's own steps, so each
worker keeps its count and the driver takes worker 0's ([`WorkerResult`][torchspark.training.WorkerResult]).
``active`` is 1 while the worker has data left *after* this round: it reads one minibatch ahead, so the round that
fits its last minibatch already says so, and an epoch has exactly ``ceil(most minibatches / averaging_frequency)``
rounds (as DL4J), never a trailing empty one. A worker whose data ran out keeps joining rounds with ``n = 0``; the
loop ends, on every worker at once, after the first round whose all-reduced ``active`` count is zero. So unequal
partitions never hang and all workers agree on the rounds.
With ``hooks.report_score`` set, rank 0 reports the round's averaged score (``sum(score * n) / sum(n)`` of step 2,
where ``score`` is the worker's last minibatch loss of the round) after every round that fitted any example.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from torchspark.data import Trainable, as_group, group_examples
from torchspark.nn import Network
from torchspark.training.algorithms.base import EpochOutcome
from torchspark.training.comm import Communicator, StagedSum, staged_sum
from torchspark.training.hooks import ProgressUpdate, ScoreReport, WorkerHooks

__all__ = [
    "AveragingSettings",
    "AveragingAlgorithm",
    "averaging_epoch",
    "train_round",
    "RoundBuffer",
    "pack_weighted",
    "apply_weighted_mean",
]


@dataclass(frozen=True)
class AveragingSettings:
    """The knobs of the averaging loop (validated by the training master that builds them).

    Args:
        averaging_frequency: optimizer steps per worker between averaging rounds (minibatches, or groups of
            minibatches with gradient accumulation). Low values cost communication,
            values far above ~20 hurt convergence; 5 is DL4J's default.
        save_updater: average and keep the updater state (momentum, Adam moments) across rounds; False resets
            it every round (less traffic, worse for adaptive updaters).
    """

    averaging_frequency: int = 5
    save_updater: bool = True


def averaging_epoch(
    net: Network,
    batches: Iterable[Trainable],
    comm: Communicator,
    settings: AveragingSettings,
    hooks: WorkerHooks,
    epoch: int = 0,
    validate_first: bool = True,
) -> EpochOutcome:
    """Run one epoch of parameter averaging on this worker (see the module docstring for the steps)."""
    out = EpochOutcome()
    it = iter(batches)
    rec = hooks.recorder
    packer = RoundBuffer(net, settings.save_updater, comm)
    with rec.phase("data_wait"):
        upcoming = next(it, None)  # one minibatch ahead: "is this my last round?" is known from the data position
    while True:
        # 1. fit up to averaging_frequency minibatches
        upcoming, n_round, round_score = train_round(
            net, it, upcoming, settings.averaging_frequency, out, hooks, comm.rank, epoch, validate_first
        )
        # 2. one all-reduce of weighted params, updater state and bookkeeping
        with rec.phase("averaging"):
            w = float(n_round)
            score_w = round_score * w if n_round else 0.0
            packer.pack(w, score_w, 0.0 if upcoming is None else 1.0)
            total = packer.reduce()
            total_w, total_score, active = total[-3:].tolist()  # one read of the bookkeeping tail, not three
            # 3. example-weighted mean
            if total_w > 0:
                packer.unpack(total, total_w)
                out.rounds += 1
                if hooks.report_score is not None and comm.rank == 0:  # every rank has the same value
                    hooks.report_score(ScoreReport(epoch, out.rounds, int(total_w), total_score / total_w))
        if active == 0:
            if hooks.progress is not None and out.iterations % hooks.progress_every:  # the epoch's last count
                hooks.progress(ProgressUpdate(comm.rank, epoch, out.iterations, out.examples, out.last_score))
            return out
        if hooks.checkpoint is not None:  # a consistent cut: every worker holds the same averaged state
            hooks.checkpoint(out, {}, {})


def train_round(
    net: Network,
    batches: Iterator[Trainable],
    upcoming: Trainable | None,
    steps: int,
    out: EpochOutcome,
    hooks: WorkerHooks,
    rank: int = 0,
    epoch: int = 0,
    validate_first: bool = True,
) -> tuple[Trainable | None, int, float]:
    """Step 1 of a round: up to ``steps`` optimizer steps, one per minibatch group, from ``upcoming`` on (the group
    already read), reading one group ahead from ``batches``; adds to ``out`` (the first step of ``out`` validates
    its input when ``validate_first``). The one step loop of both averaging routes: the all-reduce route runs it
    every round of an epoch, the treeAggregate route (`torchspark.spark.rounds`) once per task.

    Returns:
        the next unread group (None: the data ran out), the round's examples and its last minibatch loss (NaN when
        it fitted none).
    """
    rec = hooks.recorder
    n_round = 0
    round_score = float("nan")
    for _ in range(steps):
        if upcoming is None:
            break
        batch = upcoming
        with rec.phase("data_wait"):
            upcoming = next(batches, None)
        examples = group_examples(batch)
        with rec.phase("fit", examples=examples):
            round_score = net.train_group(as_group(batch), validate=validate_first and out.iterations == 0)
        n_round += examples
        out.last_score = round_score
        out.score_sum += round_score * examples
        out.iterations += 1
        out.examples += examples
        rec.record_score(net.iteration, round_score)
        if hooks.progress is not None and out.iterations % hooks.progress_every == 0:
            hooks.progress(ProgressUpdate(rank, epoch, out.iterations, out.examples, round_score))
    return upcoming, n_round, round_score


#: the tensors after the parameters as flat contiguous float32 views (`RoundBuffer` keeps them between rounds)
Views = list[torch.Tensor] | None


def _live(net: Network, save_updater: bool) -> list[torch.Tensor]:
    """The tensors after the parameters in an averaging buffer, in order: updater state (when saved), buffers."""
    state = net.updater_state_tensors() if save_updater else []
    return [*state, *net.buffer_tensors()]


def pack_weighted(net: Network, w: float, save_updater: bool, out: Tensor | None = None, views: Views = None) -> Tensor:
    """Step 2's contribution of one worker: ``[params * w | updater_state * w | buffers * w]`` as float32.

    The one packing rule of both averaging routes: the all-reduce route writes it into its sum's input (``out``),
    the treeAggregate route (`torchspark.spark.rounds`) ships it in its round record.

    Args:
        net: the worker's network.
        w: its weight, the examples it fitted this round.
        save_updater: include the updater state.
        out: ``(P + S + B,)`` float32 to write into (None: a new tensor).
        views: the tensors after the parameters as `Views`; None: taken from the network.
    """
    n = net.num_params()
    buf = out
    if buf is None:
        size = n + (net.updater_state_size() if save_updater else 0) + net.buffer_size()
        buf = torch.empty(size, dtype=torch.float32, device=net.device)
    params = net.params_view()
    torch.mul(params if params.dtype == torch.float32 else params.to(torch.float32), w, out=buf[:n])
    offset = n
    for t in views if views is not None else _live(net, save_updater):
        k = t.numel()
        torch.mul(t if views is not None else t.detach().reshape(-1).to(torch.float32), w, out=buf[offset : offset + k])
        offset += k
    return buf


def apply_weighted_mean(net: Network, total: Tensor, total_w: float, save_updater: bool, views: Views = None) -> None:
    """Step 3: set the network's params (updater state, buffers) to ``total / total_w``, the example-weighted mean
    of every worker's `pack_weighted`; without ``save_updater`` the updater state is reset instead.

    The one averaging rule of both routes: every worker applies it after the all-reduce, the driver after
    ``treeAggregate``. ``total`` may be longer than the packed part (the all-reduce's bookkeeping tail).
    ``views`` as in `pack_weighted`.
    """
    n = net.num_params()
    with torch.no_grad():
        params = net.params_view()
        if params.dtype == torch.float32:
            torch.div(total[:n], total_w, out=params)
        else:
            params.copy_(total[:n] / total_w)
        offset = n
        for t in views if views is not None else _live(net, save_updater):
            k = t.numel()
            part = total[offset : offset + k].view_as(t)
            if t.dtype == torch.float32:
                torch.div(part, total_w, out=t)
            else:
                t.copy_((part / total_w).to(t.dtype))
            offset += k
        if not save_updater:
            net.reset_updater_state()


class RoundBuffer:
    """One all-reduce buffer per round: ``[params * w | updater_state * w | buffers * w | w, score * w, active]``.

    Packing writes straight from the network's live tensors into the sum's input and unpacking divides straight
    from the sum's result back into them. With a shared-memory communicator the input is this worker's slot of the
    shared segment and the result its result area (`staged_sum`), so a round
    touches the parameters' bytes only four times (pack, sum, unpack) instead of six: this matters when a round's
    compute is only a few milliseconds. With ``save_updater=False`` the updater state is not sent and is reset
    after every average. ``buffers`` are the floating-point module buffers (BatchNorm running statistics),
    averaged like the parameters.

    Args:
        net: the worker's network.
        save_updater: whether the updater state is part of the sum.
        comm: the communicator (its fastest `staged_sum`; building one is
            collective).
    """

    def __init__(self, net: Network, save_updater: bool, comm: Communicator) -> None:
        self.net = net
        self.save_updater = save_updater
        self.n_params = net.num_params()
        n_state = net.updater_state_size() if save_updater else 0
        n_buffers = net.buffer_size()
        numel = self.n_params + n_state + n_buffers + 3
        self._sum: StagedSum = staged_sum(comm, numel, net.device)
        self._live: list[torch.Tensor] = []
        self._flat: list[torch.Tensor] | None = None

    def _flat_views(self) -> list[torch.Tensor] | None:
        """The live tensors after the parameters (`_live`) as flat views, kept while the network keeps the
        same tensors (building them is a few dispatcher calls per tensor and round); None when one is not a
        contiguous float32 tensor (then the general `pack_weighted` / `apply_weighted_mean` run)."""
        live = _live(self.net, self.save_updater)
        if len(live) != len(self._live) or any(a is not b for a, b in zip(live, self._live)):
            self._live = live
            usable = all(t.dtype == torch.float32 and t.is_contiguous() for t in live)
            self._flat = [t.detach().view(-1) for t in live] if usable else None
        return self._flat

    def pack(self, w: float, score_w: float, active: float) -> torch.Tensor:
        """Write ``[params * w | ... | w, score_w, active]`` into the sum's input (`pack_weighted`); returns it."""
        buf = self._sum.buffer()
        pack_weighted(self.net, w, self.save_updater, out=buf[:-3], views=self._flat_views())
        buf[-3:] = torch.tensor([w, score_w, active], dtype=torch.float32)
        return buf

    def reduce(self) -> torch.Tensor:
        """Sum the packed buffers over workers (collective); the result is read-only and valid until the next
        collective."""
        return self._sum.reduce()

    def unpack(self, buf: torch.Tensor, total_w: float) -> None:
        """Set the network's params (updater state, buffers) to ``buf / total_w`` (`apply_weighted_mean`)."""
        apply_weighted_mean(self.net, buf, total_w, self.save_updater, views=self._flat_views())


@dataclass(frozen=True)
class AveragingAlgorithm:
    """Synchronous parameter averaging (`torchspark.training.algorithms.averaging`)."""

    settings: AveragingSettings

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> AveragingAlgorithm:
        names = AveragingSettings.__dataclass_fields__
        return cls(AveragingSettings(**{k: v for k, v in settings.items() if k in names}))

    def start(self, net: Network, comm: Communicator) -> None:
        return None

    def epoch(
        self,
        state: None,
        net: Network,
        batches: Iterable[Trainable],
        comm: Communicator,
        hooks: WorkerHooks,
        epoch: int,
    ) -> EpochOutcome:
        return averaging_epoch(net, batches, comm, self.settings, hooks, epoch, validate_first=(epoch == 0))

    def finish(self, state: None, net: Network, comm: Communicator) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {}, {}

    def rank_state(self, state: None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {}, {}  # everything lives in the network (parameters, updater state, buffers)

    def restore(self, state: None, net: Network, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self.settings)
