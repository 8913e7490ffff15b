"""Is Spark worth it for this model? Measure one worker, estimate the exchange on a cluster, advise.

* `measurement` -- [`measure`][torchspark.advise.measure]: ms per iteration, parameter / updater-state bytes and our encoded
  gradient-sharing message size, on this process;
* `cost_model` -- the cost model (ring all-reduce for averaging, all-gather of encoded messages for sharing)
  and [`advise`][torchspark.advise.advise], DL4J's guidance as a decision: which master, which averaging frequency, or "stay on one
  machine";
* `command` -- the ``torchspark advise`` command.
"""

from torchspark.advise.cost_model import (
    Advice,
    Estimate,
    Link,
    Verdict,
    Workload,
    advise,
    allgather_seconds,
    allreduce_seconds,
    estimate,
    parse_link,
)
from torchspark.advise.measurement import Measurement, measure

__all__ = [
    "measure",
    "Measurement",
    "advise",
    "estimate",
    "Advice",
    "Estimate",
    "Link",
    "Verdict",
    "Workload",
    "allreduce_seconds",
    "allgather_seconds",
    "parse_link",
]
