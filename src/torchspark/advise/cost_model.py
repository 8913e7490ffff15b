"""Is Spark worth it? A cost model of one iteration on ``N`` workers, and DL4J's guidance as a decision.

DL4J's rule of thumb (its guide "When to use Spark"): at >= 100 ms per iteration distributed training scales
well; at ~10 ms expect sub-linear scaling; at ~1 ms or less a cluster may be no faster than one machine; and for
gradient sharing, at <= 150 ms per iteration "Spark may not be worth it". What decides is the ratio of exchange time
to compute time, which this module estimates from measured numbers (`torchspark.advise.measurement`):

  1. **compute**: ``t`` = seconds per iteration of one worker at its minibatch size (measured);
  2. **dense exchange** (parameter averaging, every ``f`` minibatches): a ring all-reduce of the parameters (and,
     with ``save_updater``, the updater state): each worker sends and receives ``2 (N-1)/N * bytes`` and waits
     ``2 (N-1)`` link latencies; per iteration that is divided by ``f``;
  3. **shared exchange** (threshold-encoded gradient sharing, every minibatch): every worker receives the other
     ``N-1`` workers' encoded messages (measured size) plus ``N-1`` latencies, and pays the encode time (measured);
  4. **speedup** over one machine training the same examples: ``N * t / (t + exchange per iteration)``, assuming
     no overlap of exchange and compute (conservative: sharing's ``overlap=True`` can hide up to ``t`` of it).
Step 5, [`advise`][torchspark.advise.advise], turns the estimates into a [`Advice`][torchspark.advise.Advice]: which master, which averaging frequency, or
"stay on one machine".
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from torchspark.errors import ConfigError

__all__ = [
    "Link",
    "Workload",
    "Estimate",
    "Verdict",
    "Advice",
    "allreduce_seconds",
    "allgather_seconds",
    "estimate",
    "advise",
    "parse_link",
    "AVERAGING_FREQUENCIES",
    "MIN_SPEEDUP",
    "TARGET_EFFICIENCY",
]

#: averaging frequencies considered: DL4J calls 5-10 "a safe default", 1 "inefficient", ~200 divergent; past ~20
#: convergence suffers
AVERAGING_FREQUENCIES = (5, 10, 20)
#: below this estimated speedup, Spark's fixed costs (job launch, data export, rendezvous) and its operational
#: cost are not worth it: stay on one machine (ParallelWrapper uses its cores)
MIN_SPEEDUP = 1.25
#: the smallest averaging frequency whose efficiency (speedup / N) reaches this is recommended
TARGET_EFFICIENCY = 0.8

_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def parse_link(text: str) -> float:
    """``"100mbit"``, ``"1gbit"``, ``"10Gbit/s"``, ``"2.5gbps"`` or plain bits/s -> bits per second."""
    t = text.strip().lower().replace("/s", "").replace("bps", "bit").replace(" ", "")
    for unit in sorted(_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            number, scale = t[: -len(unit)], _UNITS[unit]
            break
    else:
        number, scale = t, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise ConfigError(f"link speed {text!r} is not a speed such as 100mbit, 1gbit or 10gbit") from None
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(f"link speed must be > 0, got {text!r}")
    return value


@dataclass(frozen=True)
class Link:
    """The network between workers.

    Args:
        bits_per_second: each worker's link speed (1 Gbit/s is DL4J's "absolute minimum", 10 Gbit/s better).
        latency_s: one message's latency (~0.1 ms on a LAN, 0.5-1 ms across a cloud zone).
    """

    bits_per_second: float
    latency_s: float = 1e-4

    def __post_init__(self) -> None:
        if not self.bits_per_second > 0:
            raise ConfigError(f"Link.bits_per_second must be > 0, got {self.bits_per_second!r}")
        if not self.latency_s >= 0:
            raise ConfigError(f"Link.latency_s must be >= 0 seconds, got {self.latency_s!r}")

    @property
    def bytes_per_second(self) -> float:
        return self.bits_per_second / 8


@dataclass(frozen=True)
class Workload:
    """What one worker measured (see [`torchspark.advise.measurement.measure`][torchspark.advise.measure]).

    Args:
        seconds_per_iteration: forward, backward and updater step of one minibatch.
        param_bytes: float32 parameters (4 bytes each).
        updater_state_bytes: the updater's state (Adam: 2x the parameters), averaged with ``save_updater``.
        shared_bytes_per_step: mean encoded gradient-sharing message, flag byte included.
        encode_seconds: threshold encoding (and decoding) per step.
    """

    seconds_per_iteration: float
    param_bytes: int
    updater_state_bytes: int = 0
    shared_bytes_per_step: float = 0.0
    encode_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.seconds_per_iteration > 0:
            raise ConfigError(f"seconds_per_iteration must be > 0, got {self.seconds_per_iteration!r}")
        if self.param_bytes < 1:
            raise ConfigError(f"param_bytes must be >= 1, got {self.param_bytes!r}")


def allreduce_seconds(nbytes: float, num_workers: int, link: Link) -> float:
    """Step 2: a ring all-reduce of ``nbytes`` over ``num_workers``: ``2 (N-1)/N`` of the data each way, ``2 (N-1)``
    latencies. 0 for one worker."""
    if num_workers <= 1:
        return 0.0
    return 2 * (num_workers - 1) / num_workers * nbytes / link.bytes_per_second + 2 * (num_workers - 1) * link.latency_s


def allgather_seconds(message_bytes: float, num_workers: int, link: Link) -> float:
    """Step 3: every worker receives the other ``N-1`` messages of ``message_bytes``."""
    if num_workers <= 1:
        return 0.0
    return (num_workers - 1) * message_bytes / link.bytes_per_second + (num_workers - 1) * link.latency_s


@dataclass(frozen=True)
class Estimate:
    """One way of training: exchange seconds per iteration and the speedup over one machine."""

    name: str
    exchange_seconds_per_iteration: float
    speedup: float
    averaging_frequency: int | None = None


def _speedup(workload: Workload, num_workers: int, exchange: float) -> float:
    """Step 4."""
    t = workload.seconds_per_iteration
    return num_workers * t / (t + exchange)


def estimate(workload: Workload, num_workers: int, link: Link, save_updater: bool = True) -> list[Estimate]:
    """Steps 2-4 for gradient sharing, dense synchronous SGD (an all-reduce every step, as DDP does) and parameter
    averaging at each of `AVERAGING_FREQUENCIES`."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    shared = allgather_seconds(workload.shared_bytes_per_step, num_workers, link) + workload.encode_seconds
    dense = allreduce_seconds(workload.param_bytes, num_workers, link)
    out = [
        Estimate("shared", shared, _speedup(workload, num_workers, shared)),
        Estimate("dense_every_step", dense, _speedup(workload, num_workers, dense)),
    ]
    averaged = workload.param_bytes + (workload.updater_state_bytes if save_updater else 0)
    for f in AVERAGING_FREQUENCIES:
        per_iteration = allreduce_seconds(averaged, num_workers, link) / f
        out.append(Estimate("averaging", per_iteration, _speedup(workload, num_workers, per_iteration), f))
    return out


class Verdict(enum.Enum):
    STAY_ON_ONE_MACHINE = "stay on one machine"
    GRADIENT_SHARING = "SharedTrainingMaster (gradient sharing)"
    PARAMETER_AVERAGING = "ParameterAveragingTrainingMaster (parameter averaging)"


@dataclass(frozen=True)
class Advice:
    """Step 5's decision and the numbers behind it."""

    verdict: Verdict
    num_workers: int
    #: the recommended averaging frequency (parameter averaging), else None
    averaging_frequency: int | None
    shared: Estimate
    averaging: Estimate
    dense: Estimate
    #: what DL4J's guidance ("When to use Spark") expects for the measured iteration time
    dl4j_guidance: str
    reasons: list[str] = field(default_factory=list)


def _dl4j_guidance(ms: float) -> str:
    if ms >= 150:
        return ">= 150 ms per iteration: distributed training, gradient sharing too, scales well"
    if ms >= 100:
        return (
            "100-150 ms per iteration: parameter averaging scales well; for gradient "
            'sharing, "<= 150 ms: Spark may not be worth it"'
        )
    if ms >= 10:
        return "10-100 ms per iteration: expect sub-linear scaling"
    if ms > 1:
        return "1-10 ms per iteration: expect poor scaling; the exchange must be small"
    return "<= 1 ms per iteration: a cluster may be no faster than one machine"


def _averaging_choice(averaging: list[Estimate], num_workers: int) -> Estimate:
    """The smallest frequency reaching `TARGET_EFFICIENCY`, else the one with the best speedup."""
    for e in averaging:
        if e.speedup / num_workers >= TARGET_EFFICIENCY:
            return e
    return max(averaging, key=lambda e: e.speedup)


def advise(workload: Workload, num_workers: int, link: Link, save_updater: bool = True) -> Advice:
    """Step 5: "stay on one machine" when neither sharing nor averaging reaches `MIN_SPEEDUP`; else gradient
    sharing (DL4J's default: every worker applies every worker's update every step, where averaging lets
    replicas drift for ``f`` steps, which the speedup does not count) when it reaches `TARGET_EFFICIENCY` or
    is estimated at least as fast as averaging; else averaging at the smallest frequency reaching
    `TARGET_EFFICIENCY` (the fastest one when none does)."""
    estimates = estimate(workload, num_workers, link, save_updater)
    shared = next(e for e in estimates if e.name == "shared")
    dense = next(e for e in estimates if e.name == "dense_every_step")
    averaging = _averaging_choice([e for e in estimates if e.name == "averaging"], num_workers)
    ms = workload.seconds_per_iteration * 1e3
    reasons = [
        f"one iteration takes {ms:.3g} ms; exchange per iteration: sharing "
        f"{shared.exchange_seconds_per_iteration * 1e3:.3g} ms, averaging every "
        f"{averaging.averaging_frequency} {averaging.exchange_seconds_per_iteration * 1e3:.3g} ms, dense "
        f"every step {dense.exchange_seconds_per_iteration * 1e3:.3g} ms"
    ]
    best = max(shared.speedup, averaging.speedup)
    if num_workers < 2 or best < MIN_SPEEDUP:
        verdict, frequency = Verdict.STAY_ON_ONE_MACHINE, None
        reasons.append(
            f"the best estimated speedup on {num_workers} worker(s) is {best:.2f}x (< {MIN_SPEEDUP}x): the "
            "exchange eats the gain; use ParallelWrapper for the cores of one machine"
        )
    elif shared.speedup / num_workers >= TARGET_EFFICIENCY or shared.speedup >= averaging.speedup:
        verdict, frequency = Verdict.GRADIENT_SHARING, None
        reasons.append(
            f"gradient sharing is estimated at {shared.speedup:.2f}x on {num_workers} workers (averaging "
            f"every {averaging.averaging_frequency}: {averaging.speedup:.2f}x) and updates every worker "
            "every step"
        )
    else:
        verdict, frequency = Verdict.PARAMETER_AVERAGING, averaging.averaging_frequency
        reasons.append(
            f"parameter averaging every {frequency} minibatches is estimated at {averaging.speedup:.2f}x "
            f"on {num_workers} workers, ahead of gradient sharing ({shared.speedup:.2f}x, whose encoding "
            f"and messages cost {shared.exchange_seconds_per_iteration * 1e3:.3g} ms per iteration)"
        )
    return Advice(verdict, num_workers, frequency, shared, averaging, dense, _dl4j_guidance(ms), reasons)
