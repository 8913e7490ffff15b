"""Aligning worker clocks to the driver's without NTP: the pure math of a ping.

The driver sends a ping at ``t0`` (its clock), the worker answers with its own clock reading ``tw``, and the driver
receives the answer at ``t1``. If the two legs of the round trip take equally long, the worker read its clock at
driver time ``(t0 + t1) / 2``, so::

    offset = tw - (t0 + t1) / 2        # worker clock minus driver clock
    driver_time = worker_time - offset

The error is at most half the round trip ``(t1 - t0) / 2`` (when one leg took all of it), so with several pings the
one with the smallest round trip gives the tightest bound ([`best_clock_sample`][torchspark.stats.best_clock_sample]). The transport (Spark barrier
messages, a socket) is wired elsewhere; this module only does the arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torchspark.errors import DataError

__all__ = ["ClockSample", "clock_offset", "clock_sample", "best_clock_sample", "to_driver_time"]


@dataclass(frozen=True)
class ClockSample:
    """One ping's estimate.

    Attributes:
        offset: worker clock minus driver clock, seconds.
        round_trip: ``t1 - t0``, seconds; ``round_trip / 2`` bounds the error of ``offset``.
    """

    offset: float
    round_trip: float

    @property
    def max_error(self) -> float:
        """Worst-case error of [`offset`][torchspark.stats.ClockSample.offset] (half the round trip)."""
        return self.round_trip / 2.0


def clock_offset(t0: float, tw: float, t1: float) -> float:
    """Worker-minus-driver clock offset from one ping: ``tw - (t0 + t1) / 2``.

    Args:
        t0: driver clock when the ping was sent.
        tw: worker clock when it answered.
        t1: driver clock when the answer arrived; must be ``>= t0``.

    Returns:
        Seconds to subtract from worker times to get driver times.

    Raises:
        DataError: ``t1 < t0`` (the driver's timestamps are swapped or its clock jumped back).
    """
    return clock_sample(t0, tw, t1).offset


def clock_sample(t0: float, tw: float, t1: float) -> ClockSample:
    """Offset and round trip of one ping (see [`clock_offset`][torchspark.stats.clock_offset] for the arguments)."""
    if not t1 >= t0:
        raise DataError(
            f"clock ping receive time t1={t1!r} is before send time t0={t0!r}; pass the driver's send "
            "time first and its receive time last, both from the same clock (time.time())"
        )
    return ClockSample(offset=tw - (t0 + t1) / 2.0, round_trip=t1 - t0)


def best_clock_sample(samples: Iterable[ClockSample | tuple[float, float, float]]) -> ClockSample:
    """The sample with the smallest round trip (the tightest error bound).

    Args:
        samples: [`ClockSample`][torchspark.stats.ClockSample] objects or raw ``(t0, tw, t1)`` pings. Three to five pings are usually enough;
            the first ping is often slow (connection setup), which is why taking the minimum beats averaging.

    Returns:
        The best [`ClockSample`][torchspark.stats.ClockSample].

    Raises:
        DataError: no samples, or a raw ping with ``t1 < t0``.
    """
    parsed = [s if isinstance(s, ClockSample) else clock_sample(*s) for s in samples]
    if not parsed:
        raise DataError("best_clock_sample got no samples; measure at least one ping (t0, tw, t1)")
    return min(parsed, key=lambda s: s.round_trip)


def to_driver_time(worker_time: float, offset: float) -> float:
    """Convert a worker clock reading to the driver's clock: ``worker_time - offset``."""
    return worker_time - offset
