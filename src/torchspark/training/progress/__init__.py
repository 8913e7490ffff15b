"""The live channel from training workers to the driver: progress, worker tracebacks, scores and clock offsets.

Spark hides what executors do until a stage ends; this package lets workers stream to the driver while they train.

* `wire` -- the format: a fixed-size hello proving the fit's token, then one JSON message per line.
* `server` -- `ProgressServer`, on the driver: one selector thread, bound to the address workers use,
  drops connections without the token before reading anything else, bounds connections and kept error text.
* `client` -- `ProgressClient`, in each worker: a ``WorkerHooks.progress`` callable that never blocks
  training; clock probes align the worker's stats to the driver's clock (`torchspark.stats.clock`).
* `inbox` -- `ProgressInbox`, what the driver does with each message whichever channel brought it
  (latest updates, kept tracebacks, liveness, listeners): the server and the directory reader both extend it.
* `bar` -- `ProgressBar`, the driver's ``tqdm`` display fed by a server listener.
* `files` and `poller` -- the same messages through a directory (any fsspec URL) for a driver the
  executors cannot connect to (a remote Spark Connect client): workers write chunk files
  (`DirectoryProgressWriter`), the driver polls them (`DirectoryProgressReader`).

Progress is best-effort by design: a worker never blocks on the driver and never fails because the driver
is unreachable. Score reports are never dropped to make room (a few per epoch); a driver that wants all of them
closes the server with ``drain_s`` after the workers exited. Typical wiring (the runners do this)::

    bar = ProgressBar(total_examples=n_examples * epochs)
    with ProgressServer(host=driver_address, listeners=[bar.update]) as server:   # driver
        endpoint = server.endpoint                  # host, port and the fit's token: shipped inside every task
        ...
    # in each worker task:
    with ProgressClient.to(endpoint, rank) as client:
        offset = client.measure_clock_offset()      # driver_time - worker_time, for the timeline
        with client.reporting_errors():
            run_worker(..., hooks=WorkerHooks(progress=client))
"""

from torchspark.training.progress.bar import ProgressBar
from torchspark.training.progress.client import ProgressClient, ProgressEndpoint, estimate_clock_offset
from torchspark.training.progress.files import DirectoryProgressWriter, ProgressDirectory
from torchspark.training.progress.listeners import ErrorListener, ProgressListener, ScoreListener
from torchspark.training.progress.poller import DirectoryProgressReader
from torchspark.training.progress.server import ProgressServer
from torchspark.training.progress.wire import ChannelLimits

__all__ = [
    "ProgressServer",
    "ProgressClient",
    "ProgressBar",
    "ProgressEndpoint",
    "ChannelLimits",
    "estimate_clock_offset",
    "ProgressListener",
    "ErrorListener",
    "ScoreListener",
    "ProgressDirectory",
    "DirectoryProgressWriter",
    "DirectoryProgressReader",
]
