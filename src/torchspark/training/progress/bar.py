"""The driver's ``tqdm`` display of a fit, fed by a progress-server listener.

Where it draws (`choose_display`): in a notebook kernel (Jupyter, JupyterLab, VS Code, Colab, Databricks) a
``tqdm.notebook`` widget when ipywidgets is installed, else text bars in the cell's output; on a terminal a text
bar; anywhere else (logs, CI, ``nohup``, a Spark driver's stdout) nothing, unless asked for with ``enabled=True``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from torchspark.errors import ConfigError
from torchspark.training.hooks import ProgressUpdate
from torchspark.training.progress.listeners import ExampleTally

__all__ = ["ProgressBar", "choose_display", "in_notebook"]


def in_notebook() -> bool:
    """True inside an IPython kernel that renders cell output: Jupyter, JupyterLab, VS Code, Colab and Databricks
    notebooks. False in a script, a terminal IPython, or a process where IPython was never imported."""
    ipython = sys.modules.get("IPython")  # a notebook kernel has imported it; never import it here
    get = getattr(ipython, "get_ipython", None)
    if not callable(get):
        return False
    try:
        shell = get()
    except Exception:
        return False
    if shell is None:
        return False
    if "IPKernelApp" in (getattr(shell, "config", None) or {}):
        return True
    return "DATABRICKS_RUNTIME_VERSION" in os.environ or type(shell).__name__ in ("ZMQInteractiveShell", "Shell")


def choose_display(enabled: bool | None, file: TextIO | None, notebook: bool, widgets: bool) -> tuple[str, bool]:
    """Where a bar draws: ``("widget" | "text", enabled)``.

    ``enabled`` False: nothing. A notebook (``notebook``) with no explicit ``file``: a widget when ipywidgets is
    installed (``widgets``), else text in the cell's output. Otherwise a text bar on ``file`` (default stderr),
    with ``enabled=None`` meaning only when that file is a terminal (so logs and CI stay quiet).
    """
    if enabled is False:
        return "text", False
    if notebook and file is None:
        return ("widget" if widgets else "text"), True
    if enabled is None:
        isatty = getattr(sys.stderr if file is None else file, "isatty", None)
        enabled = bool(isatty()) if callable(isatty) else False
    return "text", enabled


class ProgressBar:
    """A ``tqdm`` bar of examples trained, with examples/s and the mean of the workers' latest scores.

    Feed it from a server: ``ProgressServer(listeners=[bar.update])``. Thread-safe.

    Args:
        total_examples: examples expected over the whole fit (all epochs, all workers); None = no total.
        desc: label; the latest epoch number is appended.
        enabled: True/False force the display on/off; None = on in a notebook or when ``file`` is a terminal
            (`choose_display`). A disabled bar renders nothing but still counts (`examples`,
            `score`).
        file: where to draw; default ``sys.stderr`` (or the notebook widget). An explicit file always gets text.
        mininterval: minimum seconds between redraws; raise it if the bar floods a slow terminal.
        detect_notebook: tells whether this process is a notebook kernel (default `in_notebook`).
    """

    def __init__(
        self,
        total_examples: int | None = None,
        desc: str = "epoch",
        enabled: bool | None = None,
        file: TextIO | None = None,
        mininterval: float = 0.5,
        detect_notebook: Callable[[], bool] = in_notebook,
    ) -> None:
        if total_examples is not None and total_examples < 0:
            raise ConfigError(f"ProgressBar total_examples must be >= 0 or None, got {total_examples}")
        out = sys.stderr if file is None else file
        widgets = importlib.util.find_spec("ipywidgets") is not None
        #: "widget" (``tqdm.notebook``) or "text" (``tqdm`` on ``file``)
        self.kind, enabled = choose_display(enabled, file, detect_notebook(), widgets)
        self.enabled = enabled
        self._desc = desc
        self._lock = threading.Lock()
        self._tally = ExampleTally()
        self._scores: dict[int, float] = {}
        self._epoch = -1
        self._closed = False
        options: dict[str, Any] = dict(
            total=total_examples, desc=desc, unit="ex", unit_scale=True, disable=not enabled, mininterval=mininterval
        )
        if self.kind == "widget":
            from tqdm.notebook import tqdm as notebook_tqdm  # imported lazily: only the driver draws

            self._bar = notebook_tqdm(**options)
        else:
            from tqdm import tqdm

            self._bar = tqdm(file=out, dynamic_ncols=True, **options)

    @property
    def examples(self) -> int:
        """Examples counted so far."""
        with self._lock:
            return self._tally.total

    @property
    def score(self) -> float:
        """Mean over workers of each worker's latest finite score (NaN before any)."""
        with self._lock:
            return self._mean_score()

    def _mean_score(self) -> float:
        finite = [s for s in self._scores.values() if math.isfinite(s)]
        return sum(finite) / len(finite) if finite else float("nan")

    def update(self, update: ProgressUpdate) -> None:
        """Count one worker update and redraw (rate-limited by ``mininterval``)."""
        with self._lock:
            if self._closed:
                return
            added = self._tally.add(update)
            self._scores[update.rank] = update.score
            if update.epoch > self._epoch:
                self._epoch = update.epoch
                self._bar.set_description_str(f"{self._desc} {update.epoch}", refresh=False)
            score = self._mean_score()
            if math.isfinite(score):
                self._bar.set_postfix_str(f"score={score:.4g}", refresh=False)
            self._bar.update(added)

    __call__ = update

    def close(self) -> None:
        """Draw the final state and release the terminal line. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
