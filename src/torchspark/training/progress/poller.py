"""The driver's side of the directory channel (`files`): a thread that lists the
fit's progress directory every ``poll_s`` seconds, reads the chunks it has not read yet and feeds the same
listeners, bar, error log and liveness watchdog the TCP `ProgressServer`
feeds.

What it offers the driver is what the server offers (`errors`, `latest`, `liveness`,
`close`), so `FitContext` treats both channels alike. `errors`
reads the directory once more before it answers: a worker writes its traceback just before its task fails, and
the driver asks right after Spark reports the failure.

After a fit that succeeded `close` with ``remove=True`` deletes the directory; after a failure it stays, so
the workers' last messages and tracebacks can be read there (it is named in the log).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from torchspark._io import filesystem, make_dirs
from torchspark.errors import ConfigError, SetupError
from torchspark.training.progress.files import ProgressDirectory, chunk_name, parse_chunk_name
from torchspark.training.progress.inbox import MessageHandler, ProgressInbox
from torchspark.training.progress.listeners import ErrorListener, ProgressListener, ScoreListener
from torchspark.training.progress.liveness import Liveness
from torchspark.training.progress.wire import ChannelLimits, int_field

__all__ = ["DirectoryProgressReader"]

logger = logging.getLogger(__name__)


class DirectoryProgressReader(ProgressInbox):
    """Reads a fit's progress directory and dispatches what workers wrote, in each rank's write order.

    What it keeps and offers is the `ProgressInbox` the TCP server
    shares; the directory adds the ``closed`` message (a worker that ended), which a TCP connection tells by closing.

    Args:
        url: the directory (any fsspec URL the driver can list and read); created when missing.
        poll_s: seconds between two listings. 1 s keeps the bar live at one ``LIST`` request per second on an
            object store; raise it for very many workers or a costly store.
        flush_s: how often workers write (shipped to them in `target`).
        listeners, score_listeners, error_listeners: as for the
            `ProgressServer`.
        limits: bounds on the kept tracebacks (``max_error_chars``, ``max_error_bytes``, ``max_errors``).
        clock: the driver's monotonic clock, stamped on every rank's last message (injectable for tests).

    Example::

        reader = DirectoryProgressReader("s3://bucket/run/progress/ab12", listeners=[bar.update]).start()
        ship(reader.target)           # workers write there (DirectoryProgressWriter)
        ...
        reader.close(drain_s=10, remove=True)
    """

    def __init__(
        self,
        url: str,
        poll_s: float = 1.0,
        flush_s: float = 1.0,
        listeners: Iterable[ProgressListener] = (),
        score_listeners: Iterable[ScoreListener] = (),
        error_listeners: Iterable[ErrorListener] = (),
        limits: ChannelLimits = ChannelLimits(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not poll_s > 0 or not flush_s > 0:
            raise ConfigError(
                f"DirectoryProgressReader poll_s and flush_s must be > 0 seconds, got poll_s={poll_s!r}, "
                f"flush_s={flush_s!r}"
            )
        super().__init__(listeners, score_listeners, error_listeners, limits, Liveness(clock))
        self.target = ProgressDirectory(url, flush_s)
        self._fs, self._path = filesystem(url)
        self._poll_s = poll_s
        self._poll_lock = threading.Lock()  # one listing at a time (the thread, errors(), close())
        self._next: dict[int, int] = {}  # rank -> the next chunk seq to read
        self._handlers: dict[str, MessageHandler] = {"closed": self._on_closed}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> DirectoryProgressReader:
        """Create the directory and start polling; returns ``self``.

        Raises:
            SetupError: the directory cannot be created (the message names it and the fix).
        """
        if self._thread is not None or self._closed:
            raise SetupError("DirectoryProgressReader.start() called twice or after close(); create a new reader")
        make_dirs(self.target.url, SetupError, "progress directory (progress_directory=)")
        self._thread = threading.Thread(target=self._serve, name="torchspark-progress-poller", daemon=True)
        self._thread.start()
        return self

    # what the driver reads
    def errors(self) -> list[tuple[int, str]]:
        """``(rank, traceback)`` of every worker error read, after reading the directory once more."""
        self.poll()
        return super().errors()

    def poll(self) -> int:
        """Read every chunk not read yet, in each rank's order, and dispatch its messages; the chunks read.
        A listing that fails is logged and retried at the next poll."""
        with self._poll_lock:
            try:
                self._fs.invalidate_cache(self._path)  # object stores cache listings (s3fs): see new chunks
                names = self._fs.ls(self._path, detail=False)
            except FileNotFoundError:
                return 0
            except Exception as e:  # noqa: BLE001 - a flaky store: try again next time
                logger.warning("cannot list the progress directory %s: %s", self.target.url, e)
                return 0
            found: dict[int, set[int]] = {}
            for name in names:
                parsed = parse_chunk_name(str(name))
                if parsed is not None:
                    found.setdefault(parsed[0], set()).add(parsed[1])
            read = 0
            for rank, seqs in sorted(found.items()):
                while self._next.get(rank, 0) in seqs:  # a gap (a write not renamed yet) waits for the next poll
                    seq = self._next.get(rank, 0)
                    self._read_chunk(rank, seq)
                    self._next[rank] = seq + 1
                    read += 1
            return read

    def close(self, drain_s: float = 0.0, remove: bool = False) -> None:
        """Stop polling. Idempotent.

        Args:
            drain_s: > 0 reads the directory a last time first (the workers have ended: everything they wrote
                is there), so the bar and listeners see their last messages.
            remove: delete the directory (after a fit that succeeded); else it stays and is named in the log.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(drain_s, 10.0))
        if drain_s > 0:
            self.poll()
        if remove:
            try:
                self._fs.rm(self._path, recursive=True)
            except FileNotFoundError:
                pass
            except Exception as e:  # noqa: BLE001 - leftovers are harmless; say where they are
                logger.warning("could not remove the progress directory %s: %s", self.target.url, e)
        else:
            logger.info("the workers' progress files stay in %s", self.target.url)

    def __enter__(self) -> DirectoryProgressReader:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # internals
    def _serve(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - progress is best effort; never take the driver down
                logger.exception("progress poller: unexpected error; live progress is off")
                return

    def _read_chunk(self, rank: int, seq: int) -> None:
        path = self._path.rstrip("/") + "/" + chunk_name(rank, seq)
        try:
            with self._fs.open(path, "rb") as f:
                data: bytes = f.read()
        except Exception as e:  # noqa: BLE001 - a chunk that cannot be read is skipped, counted
            logger.warning("cannot read progress chunk %s: %s", path, e)
            self.count_malformed()
            return
        for line in data.split(b"\n"):
            if line.strip():
                self.receive(line, path, self._handlers)

    def _on_closed(self, msg: dict[str, Any]) -> None:
        self.liveness.ended(int_field(msg, "rank"))
